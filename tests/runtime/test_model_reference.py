"""Our model code vs transformers 5's reference implementations (Qwen3-Next, Qwen3.5-MoE, Nemotron-H,
Granite-4.0-H, Falcon-H1, Kimi-Linear), and vs itself under chunked prefill, packed extend and batched decode."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.batch import ModelLayout
from runtime.models import load_model
from runtime.models.base import HybridModel
from tests.runtime.simple_runner import SimpleRunner
from tests.runtime.test_engine_support import perturb_weights


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    # These models are tiny: one intra-op thread is fastest, and it keeps a shared 2-core CI box responsive.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


transformers = pytest.importorskip("transformers")

VOCAB = 160


def _qwen3_next() -> torch.nn.Module:
    cfg = transformers.Qwen3NextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_key_head_dim=16,
        linear_value_head_dim=24,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_experts=6,
        num_experts_per_tok=2,
        mlp_only_layers=[2],
        max_position_embeddings=4096,
        eos_token_id=None,
    )
    return transformers.Qwen3NextForCausalLM(cfg)


def _qwen3_5_moe() -> torch.nn.Module:
    cfg = transformers.Qwen3_5MoeTextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=6,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=4096,
        eos_token_id=None,
    )
    return transformers.Qwen3_5MoeForCausalLM(cfg)


def _nemotron_h() -> torch.nn.Module:
    cfg = transformers.NemotronHConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        layers_block_type=[
            "linear_attention",
            "moe",
            "full_attention",
            "mlp",
            "linear_attention",
            "full_attention",
        ],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        ssm_state_size=16,
        mamba_num_heads=8,
        mamba_head_dim=8,
        n_groups=2,
        chunk_size=16,  # small, so short prompts still cross scan-chunk boundaries
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48,
        n_group=2,
        topk_group=1,
        max_position_embeddings=4096,
        eos_token_id=None,
        bos_token_id=None,
    )
    return transformers.NemotronHForCausalLM(cfg)


def _granite_hybrid() -> torch.nn.Module:
    cfg = transformers.GraniteMoeHybridConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=32,
        shared_intermediate_size=48,
        num_hidden_layers=4,
        layer_types=["mamba", "mamba", "attention", "mamba"],
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        mamba_n_heads=8,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_chunk_size=16,
        embedding_multiplier=3.0,
        residual_multiplier=0.5,
        attention_multiplier=0.1,
        logits_scaling=2.0,
        position_embedding_type="rope",
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        eos_token_id=None,
        bos_token_id=None,
    )
    return transformers.GraniteMoeHybridForCausalLM(cfg)


def _falcon_h1(mamba_rms_norm: bool = True) -> torch.nn.Module:
    # Gate-then-norm (mamba_norm_before_gate=False) is where transformers and SGLang agree.
    cfg = transformers.FalconH1Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_ssm=64,
        mamba_n_heads=8,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_chunk_size=16,
        mamba_rms_norm=mamba_rms_norm,
        mamba_norm_before_gate=False,
        embedding_multiplier=2.0,
        lm_head_multiplier=0.5,
        key_multiplier=0.7,
        attention_in_multiplier=1.3,
        attention_out_multiplier=0.8,
        ssm_in_multiplier=1.2,
        ssm_out_multiplier=0.9,
        ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05],
        mlp_multipliers=[1.5, 0.6],
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        eos_token_id=None,
        bos_token_id=None,
    )
    return transformers.FalconH1ForCausalLM(cfg)


def _kimi_linear(**overrides: object) -> torch.nn.Module:
    cfg = transformers.KimiLinearConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        linear_num_heads=4,
        linear_head_dim=16,
        linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        num_local_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return transformers.KimiLinearForCausalLM(cfg)


ARCHS: dict[str, tuple[Callable[[], torch.nn.Module], ModelLayout]] = {
    "qwen3_next": (
        _qwen3_next,
        ModelLayout(
            num_layers=4,
            attn_layer_ids=(3,),
            linear_layer_ids=(0, 1, 2),
            num_kv_heads=2,
            head_dim=32,
            v_head_dim=32,
            conv_state_shape=(2 * 2 * 16 + 4 * 24, 3),
            ssm_state_shape=(4, 24, 16),
            vocab_size=VOCAB,
        ),
    ),
    "qwen3_5_moe": (
        _qwen3_5_moe,
        ModelLayout(
            num_layers=4,
            attn_layer_ids=(3,),
            linear_layer_ids=(0, 1, 2),
            num_kv_heads=1,
            head_dim=32,
            v_head_dim=32,
            conv_state_shape=(2 * 2 * 16 + 6 * 16, 3),
            ssm_state_shape=(6, 16, 16),
            vocab_size=VOCAB,
        ),
    ),
    "granitemoehybrid": (
        _granite_hybrid,
        ModelLayout(
            num_layers=4,
            attn_layer_ids=(2,),
            linear_layer_ids=(0, 1, 3),
            num_kv_heads=2,
            head_dim=16,
            v_head_dim=16,
            conv_state_shape=(128 + 2 * 2 * 16, 3),
            ssm_state_shape=(8, 16, 16),
            vocab_size=VOCAB,
        ),
    ),
    "falcon_h1": (
        _falcon_h1,
        ModelLayout(
            num_layers=3,
            attn_layer_ids=(0, 1, 2),
            linear_layer_ids=(0, 1, 2),
            num_kv_heads=2,
            head_dim=16,
            v_head_dim=16,
            conv_state_shape=(64 + 2 * 2 * 16, 3),
            ssm_state_shape=(8, 8, 16),
            vocab_size=VOCAB,
        ),
    ),
    "kimi_linear": (
        _kimi_linear,
        ModelLayout(
            num_layers=4,
            attn_layer_ids=(3,),
            linear_layer_ids=(0, 1, 2),
            num_kv_heads=1,  # MLA: the latent (32) and the shared rope key (8)
            head_dim=32,
            v_head_dim=8,
            conv_state_shape=(3, 3 * 64),  # SGLang's (kernel-1, channels) layout for Kimi-Linear
            ssm_state_shape=(4, 16, 16),
            vocab_size=VOCAB,
        ),
    ),
    "nemotron_h": (
        _nemotron_h,
        ModelLayout(
            num_layers=6,
            attn_layer_ids=(2, 5),
            linear_layer_ids=(0, 4),
            num_kv_heads=2,
            head_dim=16,
            v_head_dim=16,
            conv_state_shape=(8 * 8 + 2 * 2 * 16, 3),
            ssm_state_shape=(8, 8, 16),
            vocab_size=VOCAB,
        ),
    ),
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, torch.nn.Module]:
    torch.manual_seed(0)
    hf = ARCHS[request.param][0]().eval()
    perturb_weights(hf, 1)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return request.param, path, hf


@pytest.fixture(scope="module")
def model(checkpoint: tuple[str, Path, torch.nn.Module]) -> HybridModel:
    return load_model(checkpoint[1])


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_layout_matches_config(checkpoint: tuple[str, Path, torch.nn.Module], model: HybridModel) -> None:
    assert model.layout() == ARCHS[checkpoint[0]][1]


def test_layout_agrees_with_the_control_plane_spec(
    checkpoint: tuple[str, Path, torch.nn.Module], model: HybridModel
) -> None:
    # The engine refuses to start when these disagree: pools are sized by the spec, allocated by the layout.
    from hybridshared.model.shape import load_model_shape

    spec = load_model_shape(checkpoint[1])
    layout = model.layout()
    assert (layout.attn_layer_ids, layout.linear_layer_ids) == (spec.attn_layer_ids, spec.linear_layer_ids)
    assert tuple(layout.conv_state_shape) == tuple(spec.conv_state_shape)
    assert tuple(layout.ssm_state_shape) == tuple(spec.ssm_state_shape)
    # KV bytes per token (spec at its default bf16): per-head K/V, or MLA's latent + shared rope key.
    kv_elements = len(layout.attn_layer_ids) * layout.num_kv_heads * (layout.head_dim + layout.v_head_dim)
    assert spec.kv_bytes_per_token == kv_elements * 2


def test_prefill_logits_match_transformers(checkpoint: tuple[str, Path, torch.nn.Module], model: HybridModel) -> None:
    # 150 tokens: more than two delta-rule chunks of 64, with a ragged last chunk.
    prompt = _prompt(150, 0)
    with torch.no_grad():
        ref = checkpoint[2](torch.tensor([prompt])).logits[0]
    runner = SimpleRunner(model)
    runner.add(0)
    ours = runner.extend({0: prompt}, all_logits=True)
    assert ours.shape == (150, VOCAB) and ours.dtype == torch.float32
    assert (ours - ref).abs().max().item() <= 1e-4
    # Default: only the last token's logits.
    runner.add(1)
    last = runner.extend({1: prompt})
    assert last.shape == (1, VOCAB)
    assert torch.allclose(last[0], ours[-1], atol=1e-5)


@pytest.mark.slow
def test_greedy_decode_matches_transformers_generate(
    checkpoint: tuple[str, Path, torch.nn.Module], model: HybridModel
) -> None:
    prompt = _prompt(40, 1)
    with torch.no_grad():
        # The test configs have no EOS token, so generation runs the full 64 steps unconstrained.
        ref = checkpoint[2].generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)
    assert ref.shape[1] == len(prompt) + 64
    expected = ref[0, len(prompt) :].tolist()
    assert SimpleRunner(model).generate_greedy(0, prompt, 64) == expected


def test_chunked_prefill_equals_one_prefill(model: HybridModel) -> None:
    prompt = _prompt(170, 2)
    whole = SimpleRunner(model)
    whole.add(0)
    ref = whole.extend({0: prompt}, all_logits=True)
    chunked = SimpleRunner(model)
    chunked.add(0)
    parts = [chunked.extend({0: prompt[a:b]}, all_logits=True) for a, b in ((0, 37), (37, 101), (101, 102), (102, 170))]
    assert (torch.cat(parts) - ref).abs().max().item() <= 1e-4
    assert SimpleRunner(model).generate_greedy(0, prompt, 12, chunk=50) == SimpleRunner(model).generate_greedy(
        0, prompt, 12
    )


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(min_value=1, max_value=89), min_size=1, max_size=4, unique=True))
def test_any_chunking_gives_the_same_last_logits(model: HybridModel, cuts: list[int]) -> None:
    prompt = _prompt(90, 3)
    whole = SimpleRunner(model)
    whole.add(0)
    ref = whole.extend({0: prompt})
    runner = SimpleRunner(model)
    runner.add(0)
    bounds = [0, *sorted(cuts), 90]
    for a, b in zip(bounds, bounds[1:], strict=False):
        out = runner.extend({0: prompt[a:b]})
    assert (out - ref).abs().max().item() <= 1e-4


def test_packed_extend_equals_each_alone(model: HybridModel) -> None:
    # Sequences 0 and 2 continue a cached 20-token prefix; 1 is fresh. All three go in one packed call.
    prefix = {0: _prompt(20, 4), 2: _prompt(20, 5)}
    chunks = {0: _prompt(50, 6), 1: _prompt(5, 7), 2: _prompt(109, 8)}
    alone = []
    for sid, chunk in chunks.items():
        r = SimpleRunner(model)
        r.add(sid)
        if sid in prefix:
            r.extend({sid: prefix[sid]})
        alone.append(r.extend({sid: chunk}, all_logits=True))
    packed = SimpleRunner(model)
    for sid in chunks:
        packed.add(sid)
        if sid in prefix:
            packed.extend({sid: prefix[sid]})
    out = packed.extend(chunks, all_logits=True)
    ref = torch.cat(alone)
    assert out.shape == ref.shape == (164, VOCAB)
    assert (out - ref).abs().max().item() <= 1e-4
    # Without all_logits: one row per sequence, its last token.
    last = SimpleRunner(model)
    for sid in chunks:
        last.add(sid)
    rows = last.extend(chunks)
    assert rows.shape == (3, VOCAB)
    assert (rows[1] - alone[1][-1]).abs().max().item() <= 1e-4


def test_equal_length_packed_extend_equals_each_alone(model: HybridModel) -> None:
    # Equal lengths take the no-padding path of the recurrent layers.
    a, b = _prompt(37, 11), _prompt(37, 12)
    packed = SimpleRunner(model)
    packed.add(0)
    packed.add(1)
    packed.extend({0: a[:5], 1: b[:5]})
    out = packed.extend({0: a[5:], 1: b[5:]}, all_logits=True)
    alone = []
    for p in (a, b):
        r = SimpleRunner(model)
        r.add(0)
        r.extend({0: p[:5]})
        alone.append(r.extend({0: p[5:]}, all_logits=True))
    assert (out - torch.cat(alone)).abs().max().item() <= 1e-4


def test_batched_decode_equals_each_alone(model: HybridModel) -> None:
    prompts = {0: _prompt(9, 7), 1: _prompt(66, 8), 2: _prompt(30, 9)}
    expected = {sid: SimpleRunner(model).generate_greedy(sid, p, 12) for sid, p in prompts.items()}
    runner = SimpleRunner(model)
    tokens: dict[int, list[int]] = {}
    for sid, p in prompts.items():
        runner.add(sid)
        tokens[sid] = [int(runner.extend({sid: p})[-1].argmax())]
    for _ in range(11):
        logits = runner.extend({sid: [t[-1]] for sid, t in tokens.items()})
        assert logits.shape == (3, VOCAB)
        for row, sid in enumerate(tokens):
            tokens[sid].append(int(logits[row].argmax()))
    assert tokens == expected


def test_low_precision_pools_stay_close(model: HybridModel) -> None:
    prompt = _prompt(60, 10)
    ref = SimpleRunner(model).generate_greedy(0, prompt, 8)
    runner = SimpleRunner(model, kv_dtype=torch.bfloat16, conv_dtype=torch.bfloat16)
    got = runner.generate_greedy(0, prompt, 8)
    assert got[:2] == ref[:2]


def test_falcon_h1_without_mamba_norm(tmp_path: Path) -> None:
    """mamba_rms_norm=False gates the scan output with silu(gate) only (as SGLang does). Prefill matches
    transformers; its own generate disagrees with its forward, so decode is checked by teacher forcing."""
    torch.manual_seed(0)
    hf = _falcon_h1(mamba_rms_norm=False).eval()
    perturb_weights(hf, 1)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path)
    prompt = _prompt(40, 13)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    runner = SimpleRunner(model)
    runner.add(0)
    assert (runner.extend({0: prompt}, all_logits=True) - ref).abs().max().item() <= 1e-4
    generated = SimpleRunner(model).generate_greedy(0, prompt, 24)
    teacher = SimpleRunner(model)
    teacher.add(0)
    forced = teacher.extend({0: prompt + generated[:-1]}, all_logits=True)[len(prompt) - 1 :]
    assert forced.argmax(-1).tolist() == generated


def test_kimi_linear_with_low_rank_queries_and_biases(tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf = _kimi_linear(q_lora_rank=24, attention_bias=True).eval()
    perturb_weights(hf, 2)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path)
    prompt = _prompt(80, 14)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    runner = SimpleRunner(model)
    runner.add(0)
    assert (runner.extend({0: prompt}, all_logits=True) - ref).abs().max().item() <= 1e-4


_FP32_LEAVES = ("A_log", "dt_bias", "D", "e_score_correction_bias")
# The 16-bit checks run where the runtime serves 16-bit weights: on the GPU when there is one.
_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_bf16_weights_keep_the_recurrent_parameters_fp32(
    checkpoint: tuple[str, Path, torch.nn.Module], model: HybridModel
) -> None:
    """A_log / dt_bias / D and the router's correction bias stay fp32 (with the checkpoint's exact values) under
    bf16 weights, as transformers and SGLang keep them; every projection is bf16."""
    bf16 = load_model(checkpoint[1], dtype=torch.bfloat16, device=_DEVICE)
    fp32 = dict(model.named_parameters())
    kept = 0
    for name, param in bf16.named_parameters():
        if name.rsplit(".", 1)[-1] in _FP32_LEAVES:
            assert param.dtype == torch.float32, name
            assert torch.equal(param.cpu(), fp32[name]), name
            kept += 1
        elif name.endswith("proj.weight") or "embed" in name:
            assert param.dtype == torch.bfloat16, name
    assert kept >= 2  # every family has recurrent layers


def test_bf16_prefill_is_as_close_to_fp32_as_the_reference_bf16(
    checkpoint: tuple[str, Path, torch.nn.Module],
) -> None:
    """Our bf16 path (16-bit weights and KV, fp32 recurrent parameters, conv and state) strays from the fp32
    logits no more than transformers' own bf16 path does."""
    prompt = _prompt(150, 0)
    with torch.no_grad():
        ref = checkpoint[2](torch.tensor([prompt])).logits[0]
        hf_bf16 = transformers.AutoModelForCausalLM.from_pretrained(checkpoint[1], dtype=torch.bfloat16)
        ref_bf16 = hf_bf16.to(_DEVICE).eval()(torch.tensor([prompt], device=_DEVICE)).logits[0].float().cpu()
    runner = SimpleRunner(load_model(checkpoint[1], dtype=torch.bfloat16, device=_DEVICE), kv_dtype=torch.bfloat16)
    runner.add(0)
    ours = runner.extend({0: prompt}, all_logits=True).cpu()
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    ours_err, ref_err = (ours - ref).abs(), (ref_bf16 - ref).abs()
    assert ours_err.mean().item() <= 1.2 * ref_err.mean().item()
    assert ours_err.max().item() <= 1.5 * ref_err.max().item()


_LAYER_TYPE_KEYS = {"nemotron_h": "layers_block_type", "falcon_h1": None}


def test_unknown_or_miscounted_layer_types_name_the_file_and_key(
    checkpoint: tuple[str, Path, torch.nn.Module], tmp_path: Path
) -> None:
    import json

    from runtime.models.errors import ModelLoadError

    arch, path = checkpoint[0], checkpoint[1]
    key = _LAYER_TYPE_KEYS.get(arch, "layer_types")
    if key is None:
        pytest.skip(f"{arch}: every layer is the same (no layer types)")
    config = json.loads((path / "config.json").read_text())
    for bad in ([*config[key][:-1], "convolution"], config[key][:-1]):
        if bad == config[key][:-1] and arch == "nemotron_h":
            continue  # Nemotron-H's layer count is the list's length
        (tmp_path / "config.json").write_text(json.dumps({**config, key: bad}))
        with pytest.raises(ModelLoadError, match=re.escape(f"{tmp_path / 'config.json'}: '{key}'")):
            load_model(tmp_path)
