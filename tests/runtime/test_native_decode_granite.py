"""The native decode step on Granite-4.0-H (runtime/engine/native_granite.py; the muP multipliers as the C model's
embed_scale, residual_scale and logits_div; Granite's top-k-then-softmax router, hd_ffn.h) against the torch
decode of the same model: logits and every pool row the step writes, greedy tokens over many steps of a batch in
random state slots, transformers' generate, bf16 weights bit for bit against fp32 ones rounded to bf16, 1 and 2
threads, and the engine end to end. Tiny random checkpoints (transformers' classes, weights perturbed): a MoE model
with RoPE, attention biases and multipliers far from 1, and a dense (shared-MLP-only, Micro-style) one without RoPE
and with one Mamba2 group."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from runtime.core.requests import GenerateRequest
from runtime.engine.native_decode import Unsupported, decode_weights, native_decode_for
from runtime.models import load_model
from runtime.models.base import HybridModel
from runtime.native.build import find_compiler
from runtime.native.decode_weights import ROUTE_TOPK_SOFTMAX
from tests.runtime.native_step_checks import (
    EXTEND_CASES,
    VOCAB,
    assert_bf16_bits,
    assert_extend_matches_torch,
    assert_extend_thread_bits,
    assert_generate_parity,
    assert_greedy_steps,
    assert_thread_bits,
)
from tests.runtime.native_step_checks import assert_same_step as _assert_same_step
from tests.runtime.native_step_checks import decode_batch as _decode_batch
from tests.runtime.native_step_checks import prefilled as _prefilled
from tests.runtime.test_engine_support import (
    _byte_level_tokenizer,
    greedy,
    make_core,
    one_torch_thread,
    perturb_weights,
    run_to_completion,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(find_compiler() is None, reason="needs a C compiler (CI installs gcc)")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _config(**kw: object) -> object:
    base: dict[str, object] = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "mamba"], num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16,
        mamba_chunk_size=16, embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.1,
        logits_scaling=2.0, position_embedding_type="rope", tie_word_embeddings=True, max_position_embeddings=4096,
        eos_token_id=None, bos_token_id=None,
    )  # fmt: skip
    base.update(kw)
    return transformers.GraniteMoeHybridConfig(**base)


ARCHS: dict[str, Callable[[], object]] = {
    "moe_rope": lambda: _config(attention_bias=True, mamba_proj_bias=True),
    "dense_nope": lambda: _config(
        num_local_experts=0,
        position_embedding_type="nope",
        mamba_n_groups=1,
        mamba_conv_bias=False,
        layer_types=["mamba", "mamba", "attention", "mamba", "attention"],
        num_hidden_layers=5,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.0078125,
        logits_scaling=8.0,
        tie_word_embeddings=False,
    ),  # fmt: skip
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    torch.manual_seed(0)
    hf = transformers.GraniteMoeHybridForCausalLM(ARCHS[request.param]()).eval()
    perturb_weights(hf, 1)
    path: Path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return path, hf


@pytest.fixture(scope="module")
def model(checkpoint: tuple[Path, object]) -> HybridModel:
    return load_model(checkpoint[0])


def test_the_model_runs_natively_with_its_multipliers(model: HybridModel) -> None:
    native, status = native_decode_for(model, "auto", "cpu")
    assert native is not None and status.state == "on", status.detail
    assert status.detail.endswith("; short extends")
    weights = decode_weights(model)
    config = model.config  # type: ignore[attr-defined]
    assert (weights.embed_scale, weights.residual_scale, weights.logits_div) == (
        config.embedding_multiplier,
        config.residual_multiplier,
        config.logits_scaling,
    )
    attention = [lw.mixer for lw in weights.layers if lw.kind == 1]
    assert all(m.scale == config.attention_multiplier for m in attention)  # type: ignore[union-attr]
    assert all((m.rotary_dim > 0) == config.use_rope for m in attention)  # type: ignore[union-attr]
    routes = {lw.ffn.route for lw in weights.layers if lw.ffn is not None and lw.ffn.experts}
    assert routes == ({ROUTE_TOPK_SOFTMAX} if config.num_local_experts else set())


@pytest.mark.parametrize("lengths", [[1], [7], [40], [5, 33, 17], [9, 9, 64, 2, 30, 11, 4, 20]])
def test_decode_step_matches_torch(model: HybridModel, lengths: list[int]) -> None:
    runner, nxt = _prefilled(model, lengths, seed=len(lengths))
    _assert_same_step(model, runner, _decode_batch(runner, dict(enumerate(nxt))))


def test_greedy_decode_matches_torch_over_many_steps(model: HybridModel) -> None:
    """Twenty steps of four sequences in state slots of random order: the same tokens, and equal pools."""
    assert_greedy_steps(model, [3, 21, 50, 8], seed=7, steps=20, pools=("conv", "ssm", "k", "v"))


def test_greedy_native_decode_matches_transformers_generate(
    checkpoint: tuple[Path, object], model: HybridModel
) -> None:
    """Prefill through torch, then 40 native decode steps: the tokens transformers' fp32 generate picks."""
    assert_generate_parity(checkpoint[1], model, 40)


def test_bf16_weights_give_the_bits_of_fp32_weights_rounded_to_bf16(model: HybridModel) -> None:
    assert_bf16_bits(model, [4, 19, 44], seed=3, steps=8)


def test_two_threads_give_the_bits_of_one(model: HybridModel) -> None:
    assert_thread_bits(model, [5, 33, 17, 9], seed=11, steps=4)


def test_a_hooked_granite_model_keeps_the_torch_decode(model: HybridModel) -> None:
    handle = model.body.layers[0].register_forward_hook(lambda *_: None)  # type: ignore[union-attr]
    try:
        with pytest.raises(Unsupported, match=r"a forward hook on \w+\.layers\.0 "):
            decode_weights(model)
    finally:
        handle.remove()


def build_tiny_granite(out: Path, seed: int = 0, **kw: object) -> Path:
    cfg = _config(vocab_size=256, eos_token_id=255, initializer_range=0.2, **kw)
    torch.manual_seed(seed)
    transformers.GraniteMoeHybridForCausalLM(cfg).save_pretrained(out)
    _byte_level_tokenizer(out)
    return out


@pytest.mark.parametrize("experts", [4, 0])
def test_engine_greedy_tokens_identical_to_the_torch_decode(tmp_path: Path, experts: int) -> None:
    """The engine (chunked prefill, the prefix cache's state checkpoints, batched and alone) with the native decode
    on and off: the same greedy tokens, and the decode steps ran in C."""
    model_dir = build_tiny_granite(tmp_path / "granite", num_local_experts=experts)
    native = make_core(model_dir, chunked_prefill_size=7, mamba_track_interval=8)
    torch_core = make_core(model_dir, chunked_prefill_size=7, mamba_track_interval=8, native_decode="off")
    assert native.runner.native_decode is not None and native.stats().native_decode.startswith("on")
    prompts = [[5, 6, 7, 8, 9], list(range(20, 47)), [3], list(range(100, 112)) * 2]
    for together in (True, False):

        def reqs() -> list[GenerateRequest]:
            return [GenerateRequest(f"r{i}", p, greedy(8)) for i, p in enumerate(prompts)]  # noqa: B023

        before = native.runner.native_decode.steps
        want = run_to_completion(torch_core, reqs(), together=together)
        got = run_to_completion(native, reqs(), together=together)
        for i in range(len(prompts)):
            assert got.tokens(f"r{i}") == want.tokens(f"r{i}"), f"prompt {i} diverged"
        assert native.runner.native_decode.steps - before >= 7


@pytest.mark.parametrize(("prefix", "new", "after", "all_logits"), EXTEND_CASES)
def test_extend_chain_matches_the_torch_extend(
    model: HybridModel, prefix: int, new: int, after: tuple[int, ...], all_logits: bool
) -> None:
    """One sequence's new tokens as one native chain (the Mamba2 conv and state advanced token by token): the
    torch extend's logits, K/V, states and state checkpoints."""
    assert_extend_matches_torch(model, prefix, new, after, all_logits=all_logits)


def test_extend_chain_on_two_threads_gives_the_bits_of_one(model: HybridModel) -> None:
    assert_extend_thread_bits(model, 30, 31)
