"""A one-token continuation scheduled as an extend (an exact repeat resuming one token before its prompt's end)
runs as a decode step (ModelRunner.forward): the same logits and the same state and KV afterwards as the extend
path, for every recurrent family; extends that a decode cannot stand in for keep the extend path."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from runtime.core.batch import ForwardBatch
from runtime.core.buffers import allocate_pool_buffers
from runtime.engine.model_runner import one_token_continuations
from runtime.models.base import HybridModel
from tests.runtime.test_checkpoint_states import TOL, _extend, _max_diff, _tokens, family, model  # noqa: F401
from tests.runtime.test_engine_support import one_torch_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _continuation(tokens: list[int], slot: int, base: int, mode: str) -> ForwardBatch:
    n = len(tokens)
    return ForwardBatch(
        mode=mode,  # type: ignore[arg-type]
        input_ids=torch.tensor(tokens[-1:]),
        positions=torch.tensor([n - 1]),
        extend_lens=[1],
        prefix_lens=[n - 1],
        kv_locs=[torch.arange(base, base + n)],
        out_locs=torch.tensor([base + n - 1]),
        state_slots=torch.tensor([slot]),
    )


def test_decode_computes_a_one_token_extend(model: HybridModel) -> None:  # noqa: F811
    buffers = allocate_pool_buffers(model.layout(), num_token_slots=4096, num_state_slots=8)
    tokens = _tokens(70, 3)
    _extend(model, buffers, [(tokens[:-1], 0, 1, 0)])  # the prompt but its last token, into slot 1 / KV 0..68
    for t in (*buffers.conv, *buffers.ssm):
        t[2].copy_(t[1])
    buffers_k = [k.clone() for k in buffers.k]  # the second run writes the same KV slot again
    with torch.inference_mode():
        ext = model.forward(_continuation(tokens, 1, 0, "extend"), buffers)
        dec = model.forward(_continuation(tokens, 2, 0, "decode"), buffers)
    assert ext.shape == dec.shape == (1, model.layout().vocab_size)
    assert (ext - dec).abs().max().item() <= TOL * max(1.0, ext.abs().max().item())
    assert ext.argmax().item() == dec.argmax().item()
    assert _max_diff(buffers, 1, 2) <= TOL
    assert all(torch.equal(a[:69], b[:69]) for a, b in zip(buffers.k, buffers_k, strict=True))


def test_which_extends_a_decode_stands_in_for() -> None:
    one = _continuation(list(range(10)), 1, 0, "extend")
    assert one_token_continuations(one)
    assert not one_token_continuations(dataclasses.replace(one, mode="decode"))
    assert not one_token_continuations(dataclasses.replace(one, all_logits=True))
    assert not one_token_continuations(dataclasses.replace(one, state_checkpoints=[[(1, 3)]]))
    assert not one_token_continuations(dataclasses.replace(one, prefix_lens=[0], kv_locs=[torch.arange(1)]))
    two = dataclasses.replace(one, input_ids=torch.tensor([1, 2]), extend_lens=[2], positions=torch.tensor([8, 9]))
    assert not one_token_continuations(two)
