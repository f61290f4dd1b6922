"""The native decode step on Falcon-H1 (runtime/engine/native_falcon.py; HD_PARALLEL layers, hd_parallel.h: attention
and Mamba2 side by side, each muP multiplier applied where torch applies it) against the torch decode of the same
model: logits and every pool row the step writes, greedy tokens over many steps of a batch in random state slots,
transformers' generate (where its decode agrees with its forward), bf16 weights bit for bit against fp32 ones
rounded to bf16, 1 and 2 threads, and the engine end to end. Tiny random checkpoints (transformers' classes, weights
perturbed) with multipliers far from 1, in the three output gatings of the Mamba2 mixer; Falcon-H1-7B's RoPE theta
(1e11), and a head dim other than hidden / heads."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from runtime.core.requests import GenerateRequest
from runtime.engine.native_decode import Unsupported, decode_weights, native_decode_for
from runtime.models import load_model
from runtime.models.base import HybridModel
from runtime.native.build import find_compiler
from runtime.native.decode_weights import PARALLEL_KIND
from runtime.native.parallel_weights import GATE_GROUP_NORM, GATE_ONLY, NORM_THEN_GATE, ParallelWeights
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
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, mamba_d_ssm=64, mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16,
        mamba_chunk_size=16, mamba_rms_norm=True, mamba_norm_before_gate=False, embedding_multiplier=3.0,
        lm_head_multiplier=0.3, key_multiplier=0.4, attention_in_multiplier=2.5, attention_out_multiplier=0.6,
        ssm_in_multiplier=1.7, ssm_out_multiplier=0.45, ssm_multipliers=[1.9, 0.35, 2.2, 0.6, 1.4],
        mlp_multipliers=[2.5, 0.4], tie_word_embeddings=True, max_position_embeddings=4096, eos_token_id=None,
        bos_token_id=None, rope_theta=1e11,
    )  # fmt: skip
    base.update(kw)
    return transformers.FalconH1Config(**base)


# name: (config, the Mamba2 gating the table must carry, whether transformers' generate is a reference: its decode
# disagrees with its own forward without mamba_rms_norm, tests/runtime/test_model_reference.py)
ARCHS: dict[str, tuple[Callable[[], object], int, bool]] = {
    "gate_then_norm": (lambda: _config(), GATE_GROUP_NORM, True),
    "gate_only": (
        lambda: _config(
            mamba_rms_norm=False,
            mamba_n_groups=1,
            attention_bias=True,
            mamba_proj_bias=True,
            head_dim=32,
            tie_word_embeddings=False,
            num_hidden_layers=4,
        ),
        GATE_ONLY,
        False,
    ),  # fmt: skip
    "norm_then_gate": (lambda: _config(mamba_norm_before_gate=True, mamba_conv_bias=False), NORM_THEN_GATE, False),
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, str]:
    torch.manual_seed(0)
    hf = transformers.FalconH1ForCausalLM(ARCHS[request.param][0]()).eval()
    perturb_weights(hf, 1)
    path: Path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return path, hf, request.param


@pytest.fixture(scope="module")
def model(checkpoint: tuple[Path, object, str]) -> HybridModel:
    return load_model(checkpoint[0])


def test_the_model_runs_natively_with_its_multipliers(model: HybridModel, checkpoint: tuple[Path, object, str]) -> None:
    native, status = native_decode_for(model, "auto", "cpu")
    assert native is not None and status.state == "on", status.detail
    assert status.detail.endswith("; short extends")
    weights = decode_weights(model)
    c = model.config  # type: ignore[attr-defined]
    assert (weights.embed_scale, weights.logits_mul) == (c.embedding_multiplier, c.lm_head_multiplier)
    assert {lw.kind for lw in weights.layers} == {PARALLEL_KIND} and weights.extends and native.extends
    for lw in weights.layers:
        p = lw.mixer
        assert isinstance(p, ParallelWeights) and p.gate_mode == ARCHS[checkpoint[2]][1]
        got = (p.attn_in, p.attn_out, p.ssm_in, p.ssm_out, p.key_mul, p.mlp_gate, p.mlp_down)
        assert got == (
            c.attention_in_multiplier,
            c.attention_out_multiplier,
            c.ssm_in_multiplier,
            c.ssm_out_multiplier,
            c.key_multiplier,
            *c.mlp_multipliers,
        )
        assert p.in_proj_mul is not None and sorted(set(p.in_proj_mul.tolist())) == sorted(
            torch.tensor(c.ssm_multipliers).tolist()
        )


@pytest.mark.parametrize("lengths", [[1], [7], [40], [5, 33, 17], [9, 9, 64, 2, 30, 11, 4, 20]])
def test_decode_step_matches_torch(model: HybridModel, lengths: list[int]) -> None:
    runner, nxt = _prefilled(model, lengths, seed=len(lengths))
    _assert_same_step(model, runner, _decode_batch(runner, dict(enumerate(nxt))))


def test_greedy_decode_matches_torch_over_many_steps(model: HybridModel) -> None:
    """Twenty steps of four sequences in state slots of random order: the same tokens, and equal pools."""
    assert_greedy_steps(model, [3, 21, 50, 8], seed=7, steps=20, pools=("conv", "ssm", "k", "v"))


def test_greedy_native_decode_matches_transformers_generate(
    checkpoint: tuple[Path, object, str], model: HybridModel
) -> None:
    """Prefill through torch, then 40 native decode steps: the tokens transformers' fp32 generate picks."""
    if not ARCHS[checkpoint[2]][2]:
        pytest.skip("transformers' Falcon-H1 decode disagrees with its forward in this gating")
    assert_generate_parity(checkpoint[1], model, 40)


def test_bf16_weights_give_the_bits_of_fp32_weights_rounded_to_bf16(model: HybridModel) -> None:
    assert_bf16_bits(model, [4, 19, 44], seed=3, steps=8)


def test_two_threads_give_the_bits_of_one(model: HybridModel) -> None:
    assert_thread_bits(model, [5, 33, 17, 9], seed=11, steps=4)


def test_variants_the_kernel_does_not_compute_decline_with_a_reason(model: HybridModel) -> None:
    """An MLP with biases, a gated norm that disagrees with its mixer, a hook: each keeps the torch decode."""
    layer = model.body.layers[0]  # type: ignore[union-attr]
    mlp = copy.deepcopy(layer.feed_forward)
    layer.feed_forward.gate_proj.bias = torch.nn.Parameter(torch.zeros(mlp.gate_proj.out_features))
    try:
        with pytest.raises(Unsupported, match=r"layer 0's MLP has biases"):
            decode_weights(model)
    finally:
        layer.feed_forward = mlp
    gating = layer.mamba.gated_norm
    layer.mamba.gated_norm = "mamba2"
    try:
        with pytest.raises(Unsupported, match=r"layer 0's Mamba2 output gating 'mamba2' is not Falcon-H1's"):
            decode_weights(model)
    finally:
        layer.mamba.gated_norm = gating
    handle = layer.register_forward_hook(lambda *_: None)
    try:
        with pytest.raises(Unsupported, match=r"a forward hook on \w+\.layers\.0 "):
            decode_weights(model)
    finally:
        handle.remove()
    decode_weights(model)  # and the model itself still goes native


def build_tiny_falcon(out: Path, seed: int = 0, **kw: object) -> Path:
    cfg = _config(vocab_size=256, eos_token_id=255, initializer_range=0.2, **kw)
    torch.manual_seed(seed)
    transformers.FalconH1ForCausalLM(cfg).save_pretrained(out)
    _byte_level_tokenizer(out)
    return out


@pytest.mark.parametrize("rms_norm", [True, False])
def test_engine_greedy_tokens_identical_to_the_torch_decode(tmp_path: Path, rms_norm: bool) -> None:
    """The engine (chunked prefill, the prefix cache's state checkpoints, batched and alone) with the native decode
    on and off: the same greedy tokens, and the decode steps ran in C."""
    model_dir = build_tiny_falcon(tmp_path / "falcon", mamba_rms_norm=rms_norm)
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
