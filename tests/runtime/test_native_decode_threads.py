"""The native decode step split across threads (runtime/native/hybrid_decode.c on parallel.h's pool) computes
exactly what it computes on one: logits and every pool row bit-identical under 1, 2 and 3 threads, over several
greedy steps, with the projections split down to 4-row blocks (`set_min_part_bytes(1)`), for the four model
shapes of test_native_decode.py and a MoE with more active experts than one region takes (the rounds path)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime.core.batch import PoolBuffers
from runtime.engine.native_decode import THREADS_ENV, NativeDecode
from runtime.models import load_model
from runtime.models.base import HybridModel
from runtime.native.build import find_compiler
from runtime.native.hybrid_decode import set_min_part_bytes, set_threads, threads
from tests.runtime.test_engine_support import perturb_weights
from tests.runtime.test_native_decode import (
    VOCAB,
    _assert_same_step,
    _clone,
    _decode_batch,
    _prefilled,
    checkpoint,  # noqa: F401 - the parametrized module fixture
    model,  # noqa: F401
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(find_compiler() is None, reason="needs a C compiler (CI installs gcc)")


@pytest.fixture
def split_finely(model: HybridModel) -> Iterator[NativeDecode]:  # noqa: F811
    native = NativeDecode(model)
    native.threads = None  # the tests set the count; the engine would set its own at every step
    set_min_part_bytes(native.library, 1)
    yield native
    set_min_part_bytes(native.library, 32768)
    set_threads(native.library, 1)


def _steps(native: NativeDecode, model: HybridModel, thread_count: int, steps: int) -> list[torch.Tensor]:  # noqa: F811
    """Logits of `steps` greedy decode steps of four sequences, then every pool buffer, on `thread_count` threads."""
    set_threads(native.library, thread_count)
    assert threads(native.library) == thread_count
    runner, nxt = _prefilled(model, [5, 33, 17, 9])
    tokens = dict(enumerate(nxt))
    out = []
    for _ in range(steps):
        with torch.inference_mode():
            logits = native(_decode_batch(runner, tokens), runner.buffers)
        out.append(logits.clone())
        tokens = dict(enumerate(logits.argmax(-1).tolist()))
    b = runner.buffers
    return out + [t.clone() for group in (b.k, b.v, b.conv, b.ssm) for t in group]


def test_threads_give_bit_identical_logits_and_pools(model: HybridModel, split_finely: NativeDecode) -> None:  # noqa: F811
    one = _steps(split_finely, model, 1, 6)
    for count in (2, 3):
        many = _steps(split_finely, model, count, 6)
        assert len(many) == len(one)
        for i, (a, b) in enumerate(zip(one, many, strict=True)):
            assert torch.equal(a, b), f"{count} threads: tensor {i} differs by {float((a - b).abs().max())}"


def test_two_pinned_threads_still_match_torch(
    model: HybridModel,  # noqa: F811
    split_finely: NativeDecode,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(THREADS_ENV, "2")
    native = NativeDecode(model)
    assert native.describe_threads() == f"2 ({THREADS_ENV})"
    runner, nxt = _prefilled(model, [3, 40])
    _assert_same_step(model, runner, _decode_batch(runner, dict(enumerate(nxt))), native)
    assert threads(native.library) == 2


@pytest.fixture(scope="module")
def many_experts(tmp_path_factory: pytest.TempPathFactory) -> HybridModel:
    # 40 experts, top 6: a batch of 8 routes to ~29 distinct experts on average, more than one feed-forward region
    # holds (23), so the step runs its experts in two rounds.
    cfg = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=12,
        shared_expert_intermediate_size=20, num_experts=40, num_experts_per_tok=6, full_attention_interval=2,
        max_position_embeddings=4096, eos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(1)
    hf = transformers.Qwen3NextForCausalLM(cfg).eval()
    perturb_weights(hf, 2)
    path: Path = tmp_path_factory.mktemp("many_experts")
    hf.save_pretrained(path)
    return load_model(path)


def test_more_active_experts_than_a_region_holds(many_experts: HybridModel) -> None:
    native = NativeDecode(many_experts)
    native.threads = None
    set_min_part_bytes(native.library, 1)
    try:
        lengths = [4, 7, 11, 2, 9, 13, 5, 8]
        runner, nxt = _prefilled(many_experts, lengths)
        batch = _decode_batch(runner, dict(enumerate(nxt)))
        before = _clone(runner.buffers)  # _assert_same_step advances the runner's own pools through torch
        expected = _assert_same_step(many_experts, runner, batch)
        results = []
        for count in (1, 2):
            set_threads(native.library, count)
            buffers: PoolBuffers = _clone(before)
            with torch.inference_mode():
                results.append((native(batch, buffers), buffers))
        assert torch.equal(results[0][0], results[1][0])
        assert float((results[0][0] - expected).abs().max()) < 1e-4 * max(1.0, float(expected.abs().max()))
        for name in ("k", "v", "conv", "ssm"):
            for a, b in zip(getattr(results[0][1], name), getattr(results[1][1], name), strict=True):
                assert torch.equal(a, b)
    finally:
        set_min_part_bytes(native.library, 32768)
        set_threads(native.library, 1)
