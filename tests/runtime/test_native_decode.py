"""The native decode step (runtime/native/hybrid_decode.c through runtime/engine/native_decode.py) against the
torch decode of the same model: logits, and every K/V row and state the step writes into the pools. Tiny random
Qwen3-Next / Qwen3.5 checkpoints (transformers' classes, weights perturbed so every norm and bias matters), loaded
through the runtime's own loader: MoE with a shared expert and dense-MLP layers, GQA ratios 2 and 4, value-head
ratios 2 and 3, fused and split projections, attention with and without biases."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.batch import PoolBuffers
from runtime.engine.native_decode import NativeDecode, Unsupported, decode_weights, native_decode_for
from runtime.models import load_model
from runtime.models.base import HybridModel
from runtime.native.build import find_compiler
from tests.runtime.native_step_checks import VOCAB
from tests.runtime.native_step_checks import assert_same_step as _assert_same_step
from tests.runtime.native_step_checks import clone as _clone
from tests.runtime.native_step_checks import decode_batch as _decode_batch
from tests.runtime.native_step_checks import prompt as _prompt
from tests.runtime.simple_runner import SimpleRunner
from tests.runtime.test_engine_support import one_torch_thread, perturb_weights

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(find_compiler() is None, reason="needs a C compiler (CI installs gcc)")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _qwen3_next_moe() -> torch.nn.Module:
    # MoE layers with a shared expert, one dense-MLP layer (mlp_only_layers), GQA 2, value heads 2 per key head.
    cfg = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_key_head_dim=16, linear_value_head_dim=24,
        linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_experts=6, num_experts_per_tok=2, mlp_only_layers=[2],
        max_position_embeddings=4096, eos_token_id=None,
    )  # fmt: skip
    return transformers.Qwen3NextForCausalLM(cfg)


def _qwen3_next_biased() -> torch.nn.Module:
    # Attention biases, top-3 routing without renormalization, a full-attention layer every 2.
    cfg = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=4, num_attention_heads=6,
        num_key_value_heads=3, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=3, linear_num_value_heads=3, moe_intermediate_size=24,
        shared_expert_intermediate_size=40, num_experts=5, num_experts_per_tok=3, norm_topk_prob=False,
        full_attention_interval=2, attention_bias=True, max_position_embeddings=4096, eos_token_id=None,
    )  # fmt: skip
    return transformers.Qwen3NextForCausalLM(cfg)


def _qwen3_5_moe() -> torch.nn.Module:
    # Split projections, GQA 4, value heads 3 per key head.
    cfg = transformers.Qwen3_5MoeTextConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
        head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=6, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
        num_experts_per_tok=2, max_position_embeddings=4096, eos_token_id=None,
    )  # fmt: skip
    return transformers.Qwen3_5MoeForCausalLM(cfg)


def _qwen3_5_dense() -> torch.nn.Module:
    # Every layer a dense SwiGLU MLP.
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=4096, eos_token_id=None,
    )  # fmt: skip
    return transformers.Qwen3_5ForCausalLM(cfg)


ARCHS: dict[str, Callable[[], torch.nn.Module]] = {
    "qwen3_next_moe": _qwen3_next_moe,
    "qwen3_next_biased": _qwen3_next_biased,
    "qwen3_5_moe": _qwen3_5_moe,
    "qwen3_5_dense": _qwen3_5_dense,
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    hf = ARCHS[request.param]().eval()
    perturb_weights(hf, 1)
    path: Path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return path, hf


@pytest.fixture(scope="module")
def model(checkpoint: tuple[Path, torch.nn.Module]) -> HybridModel:
    return load_model(checkpoint[0])


def _prefilled(model: HybridModel, lengths: list[int]) -> tuple[SimpleRunner, list[int]]:
    """A runner holding one prefilled sequence per length; returns it and each sequence's next token."""
    runner = SimpleRunner(model, num_state_slots=len(lengths) + 1)
    nxt = []
    for sid, n in enumerate(lengths):
        runner.add(sid)
        nxt.append(int(runner.extend({sid: _prompt(n, 100 + sid)})[-1].argmax()))
    return runner, nxt


@pytest.mark.parametrize("lengths", [[1], [7], [40], [5, 33, 17], [9, 9, 64, 2]])
def test_decode_step_matches_torch(model: HybridModel, lengths: list[int]) -> None:
    runner, nxt = _prefilled(model, lengths)
    _assert_same_step(model, runner, _decode_batch(runner, dict(enumerate(nxt))))


def test_one_token_continuation_is_handled_like_a_decode(model: HybridModel) -> None:
    runner, nxt = _prefilled(model, [6, 12])
    batch = _decode_batch(runner, dict(enumerate(nxt)))
    native = NativeDecode(model)
    assert native.handles(batch)
    extend = copy.copy(batch)
    extend.mode = "extend"
    assert native.handles(extend)
    extend.all_logits = True
    assert not native.handles(extend)
    fresh = copy.copy(batch)
    fresh.mode, fresh.prefix_lens = "extend", [0, 12]
    assert not native.handles(fresh)  # a fresh sequence's first token is a prefill


def test_greedy_decode_matches_torch_over_many_steps(model: HybridModel) -> None:
    """Twenty decode steps of three sequences: the native and the torch runner pick the same tokens, and their
    pools stay equal (each step's state feeds the next)."""
    lengths = [3, 21, 50]
    torch_runner, nxt = _prefilled(model, lengths)
    native_runner, _ = _prefilled(model, lengths)
    native = NativeDecode(model)
    want, got = dict(enumerate(nxt)), dict(enumerate(nxt))
    for _ in range(20):
        tb, nb = _decode_batch(torch_runner, want), _decode_batch(native_runner, got)
        with torch.inference_mode():
            want = dict(enumerate(model(tb, torch_runner.buffers).argmax(-1).tolist()))
            got = dict(enumerate(native(nb, native_runner.buffers).argmax(-1).tolist()))
        assert got == want
    for a, b in zip(torch_runner.buffers.ssm, native_runner.buffers.ssm, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(1, 48), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_any_batch_of_context_lengths_matches_torch(model: HybridModel, lengths: list[int], seed: int) -> None:
    runner = SimpleRunner(model, num_state_slots=len(lengths) + 1)
    tokens = {}
    for sid, n in enumerate(lengths):
        runner.add(sid)
        prompt = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed + sid)).tolist()
        tokens[sid] = int(runner.extend({sid: prompt})[-1].argmax())
    _assert_same_step(model, runner, _decode_batch(runner, tokens))


def test_refreshes_after_a_parameter_changes(model: HybridModel) -> None:
    """The kernel reads derived tensors (1 + w, -exp(A_log)); an in-place write to their parameter remakes them."""
    runner, nxt = _prefilled(model, [8])
    native = NativeDecode(model)
    norm = model.body.layers[0].input_layernorm
    saved = norm.weight.detach().clone()
    try:
        with torch.no_grad():
            norm.weight.add_(0.5)
        _assert_same_step(model, runner, _decode_batch(runner, {0: nxt[0]}))
        batch = _decode_batch(runner, {0: nxt[0]})
        with torch.inference_mode():
            expected = model(batch, _clone(runner.buffers))
            got = native(batch, _clone(runner.buffers))
        assert float((got - expected).abs().max()) < 1e-4 * max(1.0, float(expected.abs().max()))
    finally:
        with torch.no_grad():
            norm.weight.copy_(saved)


def test_unsupported_models_and_options_say_why(model: HybridModel) -> None:
    assert native_decode_for(model, "off", "cpu")[1].line() == "Native decode: off (--native-decode off)"
    assert "device cuda" in native_decode_for(model, "auto", "cuda")[1].detail
    fp16 = copy.deepcopy(model).to(torch.float16)  # bf16 is read in place (test_native_decode_bf16.py); fp16 not
    with pytest.raises(Unsupported, match="float16: the native step reads fp32 or bf16"):
        decode_weights(fp16)
    path, status = native_decode_for(fp16, "auto", "cpu")
    assert path is None and status.state == "off" and "fp32 or bf16" in status.detail
    on, status = native_decode_for(model, "auto", "cpu")
    assert on is not None and status.state == "on"


def test_bad_pools_are_refused_before_the_call(model: HybridModel) -> None:
    runner, nxt = _prefilled(model, [4])
    batch = _decode_batch(runner, {0: nxt[0]})
    native = NativeDecode(model)
    half = PoolBuffers(
        [t.to(torch.bfloat16) for t in runner.buffers.k], runner.buffers.v, runner.buffers.conv, runner.buffers.ssm
    )
    with pytest.raises(ValueError, match="fp32"):
        native(batch, half)
    batch.out_locs = torch.tensor([10**9])
    with pytest.raises(ValueError, match="KV token slot"):
        native(batch, runner.buffers)


def test_a_state_slot_or_kv_slot_shared_by_two_sequences_is_refused(model: HybridModel) -> None:
    """The threads advance each sequence's state in parallel: two rows on one slot would race in C."""
    runner, nxt = _prefilled(model, [4, 5])
    native = NativeDecode(model)
    batch = _decode_batch(runner, {0: nxt[0], 1: nxt[1]})
    batch.state_slots = batch.state_slots[[0, 0]].contiguous()
    with pytest.raises(ValueError, match="share a state slot"):
        native(batch, runner.buffers)
    batch = _decode_batch(runner, {0: nxt[0], 1: nxt[1]})
    batch.out_locs = batch.out_locs[[1, 1]].contiguous()
    with pytest.raises(ValueError, match="share a state slot or a KV slot"):
        native(batch, runner.buffers)


def test_a_forward_hook_keeps_the_torch_forward(model: HybridModel) -> None:
    """A hook on a layer (speculative decoding's MTP capture) only runs in the torch forward."""
    handle = model.body.layers[-1].register_forward_hook(lambda module, args, output: None)
    try:
        with pytest.raises(Unsupported, match="forward hook on model.layers.3"):
            decode_weights(model)
    finally:
        handle.remove()


def test_greedy_native_decode_matches_transformers_generate(
    checkpoint: tuple[Path, torch.nn.Module], model: HybridModel
) -> None:
    """Prefill through torch, then 48 native decode steps: the tokens transformers' fp32 generate picks."""
    prompt = _prompt(30, 3)
    with torch.no_grad():
        ref = checkpoint[1].generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False)
    expected = ref[0, len(prompt) :].tolist()
    runner = SimpleRunner(model, num_state_slots=2)
    runner.add(0)
    native = NativeDecode(model)
    got = [int(runner.extend({0: prompt})[-1].argmax())]
    while len(got) < len(expected):
        with torch.inference_mode():
            got.append(int(native(_decode_batch(runner, {0: got[-1]}), runner.buffers)[0].argmax()))
    assert got == expected
