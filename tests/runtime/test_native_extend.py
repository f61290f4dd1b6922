"""The native step's short single-sequence extend (HDStep.chain in runtime/native/hybrid_decode.c: one sequence's
2..EXTEND_MAX_TOKENS new tokens as rows of one call, the DeltaNet state advanced token by token, row t attending to
the cached tokens and the new ones up to t) against the torch extend of the same model: the last row's logits and
every pool row the extend writes (K/V at the new slots, conv windows, recurrent states, the prefix cache's state
checkpoints), after a cached prefix and fresh (a fresh sequence's slot holding garbage it must ignore),
bit-identical on 1 and 2 threads, and greedy generation through the engine's runner equal to transformers'
generate. The four model shapes of test_native_decode.py."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest
import torch

from runtime.core.batch import ForwardBatch, PoolBuffers
from runtime.engine.model_runner import ModelRunner
from runtime.engine.native_decode import EXTEND_ENV, EXTEND_MAX_TOKENS, NativeDecode, native_decode_for
from runtime.models.base import HybridModel
from runtime.native.build import find_compiler
from runtime.native.hybrid_decode import set_min_part_bytes, set_threads
from tests.runtime.native_step_checks import assert_extend_matches_torch, extend_batch
from tests.runtime.simple_runner import SimpleRunner
from tests.runtime.test_native_decode import (
    VOCAB,
    _clone,
    _prompt,
    checkpoint,  # noqa: F401 - the parametrized module fixture
    model,  # noqa: F401
)

if TYPE_CHECKING:
    from runtime.engine.pool_setup import Pools

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(find_compiler() is None, reason="needs a C compiler (CI installs gcc)")


def _runner(model: HybridModel, prefix: int, slots: int = 3) -> SimpleRunner:  # noqa: F811
    """A runner holding sequence 0 after a torch prefill of `prefix` tokens (none: a fresh slot, filled with
    garbage that a fresh extend must not read), with `slots` state slots in all."""
    runner = SimpleRunner(model, num_state_slots=slots)
    runner.add(7)  # another sequence's slot first, so sequence 0's slot is not slot 0
    runner.add(0)
    if prefix:
        runner.extend({0: _prompt(prefix, 11)})
    else:
        slot = runner.seqs[0].slot
        for buf in (*runner.buffers.conv, *runner.buffers.ssm):
            buf[slot].normal_(generator=torch.Generator().manual_seed(5))
    return runner


def _both_ways(model: HybridModel, runner: SimpleRunner, batch: ForwardBatch) -> tuple[PoolBuffers, PoolBuffers]:  # noqa: F811
    """The batch through the torch extend (the runner's pools) and the native one (a copy): both pools, after the
    last row's logits were checked to agree."""
    native = NativeDecode(model, extends=True)
    assert native.handles(batch)
    torch_buffers, native_buffers = runner.buffers, _clone(runner.buffers)
    with torch.inference_mode():
        expected = model(batch, torch_buffers)
        got = native(batch, native_buffers)
    assert got.shape == expected.shape == (1, VOCAB)
    _assert_close("logits", got, expected, 1e-4)
    return torch_buffers, native_buffers


def _assert_close(name: str, got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    err = float((got - want).abs().max())
    assert err < rel * max(1.0, float(want.abs().max())), f"{name} differs by {err}"


@pytest.mark.parametrize(("prefix", "new"), [(0, 2), (0, 17), (1, 2), (9, 5), (40, 48), (70, EXTEND_MAX_TOKENS)])
def test_extend_matches_the_torch_extend(model: HybridModel, prefix: int, new: int) -> None:  # noqa: F811
    runner = _runner(model, prefix)
    batch = extend_batch(runner, 0, _prompt(new, 23))
    torch_buffers, native_buffers = _both_ways(model, runner, batch)
    slot = int(batch.state_slots[0])
    for i, (a, b) in enumerate(zip(torch_buffers.k, native_buffers.k, strict=True)):
        _assert_close(f"k[{i}] at the new slots", b[batch.out_locs], a[batch.out_locs], 1e-5)
    for i, (a, b) in enumerate(zip(torch_buffers.v, native_buffers.v, strict=True)):
        _assert_close(f"v[{i}] at the new slots", b[batch.out_locs], a[batch.out_locs], 1e-5)
    for name in ("conv", "ssm"):
        for i, (a, b) in enumerate(zip(getattr(torch_buffers, name), getattr(native_buffers, name), strict=True)):
            _assert_close(f"{name}[{i}] at the sequence's slot", b[slot], a[slot], 1e-4)
    # Nothing else written: every other row of every pool is as it was.
    for name in ("k", "v", "conv", "ssm"):
        for i, (a, b) in enumerate(zip(getattr(torch_buffers, name), getattr(native_buffers, name), strict=True)):
            keep = torch.ones(a.shape[0], dtype=torch.bool)
            keep[batch.out_locs if name in ("k", "v") else slot] = False
            assert torch.equal(a[keep], b[keep]), f"{name}[{i}]: a row outside the extend's slots changed"


@pytest.mark.parametrize(
    ("prefix", "new", "after"), [(0, 17, (1, 17)), (9, 48, (5, 30)), (70, EXTEND_MAX_TOKENS, (EXTEND_MAX_TOKENS,))]
)
def test_extend_with_state_checkpoints_matches_the_torch_extend(
    model: HybridModel,  # noqa: F811
    prefix: int,
    new: int,
    after: tuple[int, ...],
) -> None:
    """A chunk of a prompt that crosses the prefix cache's checkpoint positions: the state after each checkpoint's
    tokens lands in its slot, as the torch extend writes it, and nothing else changes."""
    runner = _runner(model, prefix, slots=5)
    batch = extend_batch(runner, 0, _prompt(new, 29))
    used = {runner.seqs[7].slot, runner.seqs[0].slot}
    spare = [s for s in range(5) if s not in used][: len(after)]
    batch.state_checkpoints = [list(zip(after, spare, strict=True))]
    torch_buffers, native_buffers = _both_ways(model, runner, batch)
    written = [int(batch.state_slots[0]), *spare]
    for name in ("conv", "ssm"):
        for i, (a, b) in enumerate(zip(getattr(torch_buffers, name), getattr(native_buffers, name), strict=True)):
            for slot in written:
                _assert_close(f"{name}[{i}] at slot {slot}", b[slot], a[slot], 1e-4)
            keep = torch.ones(a.shape[0], dtype=torch.bool)
            keep[written] = False
            assert torch.equal(a[keep], b[keep]), f"{name}[{i}]: a slot outside the extend's changed"


def test_a_verify_extend_gives_every_rows_logits(model: HybridModel) -> None:  # noqa: F811
    """A speculative verify (every row's logits, the state after each position but the last checkpointed): the
    torch extend's rows and states."""
    assert_extend_matches_torch(model, 9, 5, (1, 2, 3, 4), all_logits=True)


def test_extend_refuses_checkpoints_it_cannot_take(model: HybridModel) -> None:  # noqa: F811
    runner = SimpleRunner(model, num_state_slots=4)
    runner.add(0)
    runner.extend({0: _prompt(6, 3)})
    batch = extend_batch(runner, 0, _prompt(8, 2))
    own = int(batch.state_slots[0])
    spare = next(s for s in range(4) if s != own)
    native = NativeDecode(model, extends=True)
    for marks, message in (
        ([(9, spare)], "must take 1..8 tokens"),
        ([(0, spare)], "must take 1..8 tokens"),
        ([(3, own)], "other than the sequence's own"),
        ([(3, spare), (5, spare)], "distinct slots"),
        ([(3, 10**6)], "state checkpoint outside"),
    ):
        bad = copy.copy(batch)
        bad.state_checkpoints = [marks]
        with pytest.raises(ValueError, match=message):
            native(bad, runner.buffers)


def test_which_extends_go_native(model: HybridModel) -> None:  # noqa: F811
    runner = _runner(model, 6)
    native = NativeDecode(model, extends=True)
    batch = extend_batch(runner, 0, _prompt(EXTEND_MAX_TOKENS, 1))
    assert native.handles(batch)
    longer = copy.copy(batch)
    longer.extend_lens = [EXTEND_MAX_TOKENS + 1]
    assert not native.handles(longer)  # a prefill: torch's GEMMs and SDPA
    per_token = copy.copy(batch)
    per_token.all_logits = True
    assert not native.handles(per_token)  # no checkpoints: a sandboxed verify, whose mixers step in torch
    per_token.state_checkpoints = [[(1, 1)]]
    assert native.handles(per_token)  # an in-forward verify: every row's logits, the states checkpointed
    marked = copy.copy(batch)
    marked.state_checkpoints = [[(2, 1)]]
    assert native.handles(marked)  # the chain copies the state after the checkpoint's tokens
    marked.extend_lens = [EXTEND_MAX_TOKENS + 1]
    assert not native.handles(marked)
    two = copy.copy(batch)
    two.extend_lens, two.prefix_lens = [3, 61], [6, 0]
    assert not native.handles(two)  # several sequences: the torch (or compiled) extend
    two.all_logits = True
    assert not native.handles(two)


def test_extends_are_on_by_default_and_env_turns_them_off(model: HybridModel, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    batch = extend_batch(_runner(model, 6), 0, _prompt(8, 1))
    monkeypatch.delenv(EXTEND_ENV, raising=False)
    assert NativeDecode(model).handles(batch)
    assert native_decode_for(model, "auto", "cpu")[1].line().endswith("; short extends)")
    monkeypatch.setenv(EXTEND_ENV, "0")
    assert not NativeDecode(model).handles(batch)
    assert native_decode_for(model, "auto", "cpu")[1].line().endswith(f"; short extends off ({EXTEND_ENV}=0))")
    monkeypatch.setenv(EXTEND_ENV, "1")
    assert NativeDecode(model).handles(batch)
    monkeypatch.setenv(EXTEND_ENV, "yes")
    with pytest.raises(ValueError, match=f"{EXTEND_ENV}='yes'"):
        NativeDecode(model)


def test_extend_refuses_new_slots_that_are_not_the_end_of_its_kv_list(model: HybridModel) -> None:  # noqa: F811
    runner = _runner(model, 6)
    batch = extend_batch(runner, 0, _prompt(4, 2))
    native = NativeDecode(model, extends=True)
    bad = copy.copy(batch)
    bad.out_locs = batch.out_locs.flip(0).contiguous()
    with pytest.raises(ValueError, match="distinct and end kv_flat"):
        native(bad, runner.buffers)
    bad.out_locs = batch.out_locs[[0, 0, 1, 2]].contiguous()
    with pytest.raises(ValueError, match="distinct and end kv_flat"):
        native(bad, runner.buffers)
    bad = copy.copy(batch)
    bad.kv_locs = [torch.cat([torch.tensor([10**9]), batch.kv_locs[0]])]
    with pytest.raises(ValueError, match="KV token slot"):
        native(bad, runner.buffers)


@pytest.fixture
def split_finely(model: HybridModel) -> Iterator[NativeDecode]:  # noqa: F811
    native = NativeDecode(model, extends=True)
    native.threads = None  # the test sets the count
    set_min_part_bytes(native.library, 1)
    yield native
    set_min_part_bytes(native.library, 32768)
    set_threads(native.library, 1)


@pytest.mark.parametrize("prefix", [0, 30])
def test_extend_on_two_threads_is_bit_identical(
    model: HybridModel,  # noqa: F811
    split_finely: NativeDecode,
    prefix: int,
) -> None:
    results: list[list[torch.Tensor]] = []
    for count in (1, 2):
        set_threads(split_finely.library, count)
        runner = _runner(model, prefix)
        batch = extend_batch(runner, 0, _prompt(33, 4))
        with torch.inference_mode():
            logits = split_finely(batch, runner.buffers)
        b: PoolBuffers = runner.buffers
        results.append([logits.clone()] + [t.clone() for group in (b.k, b.v, b.conv, b.ssm) for t in group])
    for i, (one, two) in enumerate(zip(*results, strict=True)):
        assert torch.equal(one, two), f"tensor {i} differs between 1 and 2 threads"


def test_greedy_through_the_runner_matches_transformers_generate(
    checkpoint: tuple[Path, torch.nn.Module],  # noqa: F811
    model: HybridModel,  # noqa: F811
) -> None:
    """The engine's runner (native first): a 12-token prompt (a fresh native extend), 20 greedy tokens, then a
    follow-up turn (the last sampled token and 9 new ones: a native extend after the cached conversation), 20
    more: the tokens transformers' fp32 generate picks for the same texts."""
    prompt, follow = _prompt(12, 8), _prompt(9, 9)
    runner = SimpleRunner(model, num_state_slots=2)
    model_runner = ModelRunner(model, cast("Pools", SimpleNamespace(buffers=runner.buffers)))
    model_runner.native_decode = NativeDecode(model, extends=True)
    runner.add(0)
    got: list[int] = []
    for turn in range(2):
        batch = extend_batch(runner, 0, [got[-1], *follow] if turn else prompt)
        assert model_runner.native_decode.handles(batch)
        with torch.inference_mode():
            got.append(int(model_runner.forward(batch)[-1].argmax()))
            for _ in range(19):
                got.append(int(model_runner.forward(extend_batch(runner, 0, [got[-1]]))[-1].argmax()))
    history = [*prompt, *got[:20], *follow]
    with torch.no_grad():
        first = checkpoint[1].generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)
        second = checkpoint[1].generate(torch.tensor([history]), max_new_tokens=20, do_sample=False)
    assert got[:20] == first[0, len(prompt) :].tolist()
    assert got[20:] == second[0, len(history) :].tolist()
