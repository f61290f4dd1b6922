"""The native decode step on Kimi-Linear (runtime/engine/native_kimi.py; KDA layers in hd_kda.h, the DeepSeek-style
MoE on hd_ffn.h's sigmoid group routing) against the torch decode of the same model: logits and every pool row the
step writes, greedy tokens over many steps of a batch in random state slots, transformers' generate, bf16 weights
bit for bit against fp32 ones rounded to bf16, 1 and 2 threads, and the engine end to end. Tiny random checkpoints
(transformers' classes, weights perturbed): KDA and MLA layers (MLA with and without a q LoRA), and KDA alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime.core.requests import GenerateRequest
from runtime.engine.native_decode import decode_weights, native_decode_for
from runtime.models import load_model
from runtime.models.base import HybridModel
from runtime.native.build import find_compiler
from runtime.native.decode_weights import KDA_KIND, MLA_KIND, ROUTE_SIGMOID_GROUPS
from tests.runtime.native_step_checks import (
    VOCAB,
    assert_bf16_bits,
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
        num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, linear_num_heads=4, linear_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention", "linear_attention"], num_local_experts=8,
        num_experts_per_tok=3, moe_intermediate_size=32,
        n_shared_experts=2, n_group=4, topk_group=2, routed_scaling_factor=2.5, pad_token_id=None,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    base.update(kw)
    return transformers.KimiLinearConfig(**base)


ARCHS: dict[str, dict[str, object]] = {
    "kda_mla": {},
    "mla_q_lora": dict(
        q_lora_rank=24,
        num_hidden_layers=4,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
    ),  # fmt: skip
    "kda_only": dict(layer_types=["linear_attention"] * 3),
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    torch.manual_seed(0)
    hf = transformers.KimiLinearForCausalLM(_config(**ARCHS[request.param])).eval()
    perturb_weights(hf, 1)
    path: Path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return path, hf


@pytest.fixture(scope="module")
def model(checkpoint: tuple[Path, object]) -> HybridModel:
    return load_model(checkpoint[0], dtype=torch.float32)


def test_the_model_runs_natively_without_extends(model: HybridModel) -> None:
    native, status = native_decode_for(model, "auto", "cpu")
    assert native is not None and status.state == "on", status.detail
    assert "short extends off (KDA and MLA layers: decode rows only)" in status.detail
    weights = decode_weights(model)
    kinds = {"linear_attention": KDA_KIND, "full_attention": MLA_KIND}
    assert [lw.kind for lw in weights.layers] == [kinds[t] for t in model.config.layer_types]  # type: ignore[attr-defined]
    ffns = [lw.ffn for lw in weights.layers]
    assert ffns[0] is not None and ffns[0].experts == 0  # the dense first layer
    assert all(f is not None and f.route == ROUTE_SIGMOID_GROUPS and f.experts == 8 for f in ffns[1:])


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
    """Prefill through torch, then 30 native decode steps: the tokens transformers' fp32 generate picks (without
    its cache: transformers' cache needs an attention layer to size the mask, and the KDA-only model has none)."""
    assert_generate_parity(checkpoint[1], model, 30, use_cache=False)


def test_bf16_weights_give_the_bits_of_fp32_weights_rounded_to_bf16(model: HybridModel) -> None:
    assert_bf16_bits(model, [4, 19, 44], seed=3, steps=8)


def test_two_threads_give_the_bits_of_one(model: HybridModel) -> None:
    assert_thread_bits(model, [5, 33, 17, 9], seed=11, steps=4)


@pytest.mark.parametrize("arch", ["kda_mla", "mla_q_lora"])
def test_engine_greedy_tokens_identical_to_the_torch_decode(tmp_path: Path, arch: str) -> None:
    """The engine (chunked prefill, the prefix cache's state checkpoints, batched and alone) with the native decode
    on and off: the same greedy tokens, and the decode steps ran in C."""
    cfg = _config(**{**ARCHS[arch], "vocab_size": 256, "eos_token_id": 255})
    torch.manual_seed(0)
    hf = transformers.KimiLinearForCausalLM(cfg)
    perturb_weights(hf, 2)
    model_dir = tmp_path / "kimi"
    hf.save_pretrained(model_dir)
    _byte_level_tokenizer(model_dir)
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
