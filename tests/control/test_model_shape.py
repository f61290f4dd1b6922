"""load_model_shape on the example configs, TP sharding rules, spellings, weights and every error path."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy
import pytest
from safetensors.numpy import save_file

from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridshared.model.errors import ModelShapeError
from hybridshared.model.families import SUPPORTED_FAMILIES

TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "models"

# Template -> (family, layers, full-attention layers, linear layers, published parameter count in billions).
EXPECTED = {
    "qwen3-next-80b-a3b.json": ("qwen3_next", 48, 12, 36, 80),
    "qwen3.5-35b-a3b.json": ("qwen3_5", 40, 10, 30, 35),
    "kimi-linear-48b-a3b.json": ("kimi_linear", 27, 7, 20, 48),
    "nemotron-h-8b.json": ("nemotron_h", 52, 4, 24, 8),
    "falcon-h1-7b.json": ("falcon_h1", 44, 44, 44, 7.6),
    "granite-4.0-h-small.json": ("granitemoehybrid", 40, 4, 36, 32),
}


def test_one_template_per_family() -> None:
    families = {load_model_shape_or_bundled(p).family for p in TEMPLATES.glob("*.json")}
    assert families == set(SUPPORTED_FAMILIES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_template_parses_with_sane_numbers(name: str) -> None:
    family, layers, attn, linear, billions = EXPECTED[name]
    spec = load_model_shape_or_bundled(TEMPLATES / name)
    assert (spec.family, spec.num_layers, spec.num_attn_layers, spec.num_linear_layers) == (
        family,
        layers,
        attn,
        linear,
    )
    assert len(spec.layer_kinds) == spec.num_layers
    # Per-request state of a real hybrid: tens to a few hundred MiB at fp32, bf16 conv window.
    assert 10 * 2**20 < spec.mamba_state_bytes_per_request < 300 * 2**20
    assert 1_000 < spec.kv_bytes_per_token < 100_000
    assert spec.weights_source == "estimate"
    # The config-only estimate lands within 15% of the published size (bf16 = 2 bytes per parameter).
    assert spec.weights_bytes == pytest.approx(billions * 2e9, rel=0.15)
    d = spec.to_dict()
    json.dumps(d)
    assert d["mamba_state_bytes_per_request"] == spec.mamba_state_bytes_per_request
    assert d["layer_kinds"] == list(spec.layer_kinds)


def test_qwen3_next_geometry() -> None:
    spec = load_model_shape_or_bundled(TEMPLATES / "qwen3-next-80b-a3b.json")
    assert spec.attn_layer_ids == tuple(range(3, 48, 4))
    assert spec.conv_state_shape == (8192, 3)  # (2*16*128 + 32*128, kernel - 1)
    assert spec.ssm_state_shape == (32, 128, 128)
    # (8192*3*2 + 32*128*128*4) * 36 layers
    assert spec.mamba_state_bytes_per_request == (8192 * 3 * 2 + 32 * 128 * 128 * 4) * 36 == 77_266_944
    # pool_configurator.py `_compute_cell_size`: kv heads * (head_dim + v_head_dim) * layers * 2 bytes
    assert spec.kv_bytes_per_token == 2 * (256 + 256) * 12 * 2


def test_kv_heads_replicate_when_tp_exceeds_them() -> None:
    """model_config.py:1700-1711: max(1, kv_heads // tp) — Qwen3-Next has 2 KV heads."""
    path = TEMPLATES / "qwen3-next-80b-a3b.json"
    by_tp = {tp: load_model_shape_or_bundled(path, tp=tp) for tp in (1, 2, 4, 8)}
    assert [by_tp[tp].num_kv_heads_per_rank for tp in (1, 2, 4, 8)] == [2, 1, 1, 1]
    assert by_tp[2].kv_bytes_per_token == by_tp[4].kv_bytes_per_token == by_tp[8].kv_bytes_per_token
    assert by_tp[1].kv_bytes_per_token == 2 * by_tp[2].kv_bytes_per_token
    # The recurrent state keeps shrinking with tp: heads and conv channels are sharded.
    assert by_tp[8].mamba_state_bytes_per_request * 8 == by_tp[1].mamba_state_bytes_per_request


def test_mla_kv_is_not_sharded() -> None:
    """Kimi-Linear attends with MLA: latent (512) + rope key (64) per token and layer, on every rank."""
    path = TEMPLATES / "kimi-linear-48b-a3b.json"
    for tp in (1, 4):
        spec = load_model_shape_or_bundled(path, tp=tp)
        assert spec.attention_kind == "mla"
        assert spec.kv_bytes_per_token == (512 + 64) * 7 * 2
    assert load_model_shape_or_bundled(path, tp=1).attn_layer_ids == (3, 7, 11, 15, 19, 23, 26)  # 1-indexed in the file


def test_falcon_groups_are_replicated_for_head_shards() -> None:
    """mamba_utils.py:29-38: 1 group at tp 4 becomes 4, so conv_dim = 3072 + 2*4*256 before the split."""
    spec = load_model_shape_or_bundled(TEMPLATES / "falcon-h1-7b.json", tp=4)
    assert spec.conv_state_shape == ((3072 + 2 * 4 * 256) // 4, 3)
    assert spec.ssm_state_shape == (6, 128, 256)
    assert spec.layer_kinds == ("attention+mamba",) * 44


def test_tp_that_does_not_divide_the_heads_is_refused() -> None:
    with pytest.raises(ModelShapeError, match=r"falcon-h1-7b.json: cannot shard this model 16 ways"):
        load_model_shape_or_bundled(TEMPLATES / "falcon-h1-7b.json", tp=16)


def test_ssm_dtype_flag_config_and_default(tmp_path: Path) -> None:
    qwen35 = TEMPLATES / "qwen3.5-35b-a3b.json"
    fp32 = load_model_shape_or_bundled(qwen35)
    assert (fp32.ssm_dtype, fp32.ssm_dtype_source) == ("float32", "config")
    bf16 = load_model_shape_or_bundled(qwen35, ssm_dtype="bfloat16")
    assert bf16.ssm_state_bytes * 2 == fp32.ssm_state_bytes
    assert bf16.conv_state_bytes == fp32.conv_state_bytes  # the conv window stays bfloat16
    # The config's mamba_ssm_dtype counts where SGLang passes the config (Qwen3.5) ...
    cfg = json.loads(qwen35.read_text())
    cfg["text_config"]["mamba_ssm_dtype"] = "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_model_shape_or_bundled(tmp_path).ssm_dtype == "bfloat16"
    # ... and is ignored where SGLang builds the state params without it (Granite, Kimi).
    granite = json.loads((TEMPLATES / "granite-4.0-h-small.json").read_text())
    granite["mamba_ssm_dtype"] = "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps(granite))
    assert load_model_shape_or_bundled(tmp_path).ssm_dtype == "float32"
    with pytest.raises(ModelShapeError, match="--mamba-ssm-dtype 'int8'"):
        load_model_shape_or_bundled(qwen35, ssm_dtype="int8")


def test_transformers5_spellings_match_published_ones(tmp_path: Path) -> None:
    nemo = json.loads((TEMPLATES / "nemotron-h-8b.json").read_text())
    names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    t5 = dict(nemo, layers_block_type=[names[c] for c in nemo.pop("hybrid_override_pattern")])
    (tmp_path / "config.json").write_text(json.dumps(t5))
    a, b = load_model_shape_or_bundled(TEMPLATES / "nemotron-h-8b.json"), load_model_shape_or_bundled(tmp_path)
    assert (a.layer_kinds, a.mamba_state_bytes_per_request) == (
        b.layer_kinds,
        b.mamba_state_bytes_per_request,
    )

    kimi = json.loads((TEMPLATES / "kimi-linear-48b-a3b.json").read_text())
    lac = kimi.pop("linear_attn_config")
    kda = set(lac["kda_layers"])
    kimi.update(
        layer_types=["linear_attention" if i + 1 in kda else "full_attention" for i in range(27)],
        linear_num_heads=lac["num_heads"],
        linear_head_dim=lac["head_dim"],
        linear_conv_kernel_dim=lac["short_conv_kernel_size"],
    )
    (tmp_path / "config.json").write_text(json.dumps(kimi))
    a, b = load_model_shape_or_bundled(TEMPLATES / "kimi-linear-48b-a3b.json"), load_model_shape_or_bundled(tmp_path)
    assert (a.attn_layer_ids, a.mamba_state_bytes_per_request) == (
        b.attn_layer_ids,
        b.mamba_state_bytes_per_request,
    )


def test_weights_from_safetensors_headers(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((TEMPLATES / "nemotron-h-8b.json").read_text())
    save_file({"a": numpy.zeros((4, 8), dtype=numpy.float32)}, str(tmp_path / "model-00001.safetensors"))
    save_file({"b": numpy.zeros((3,), dtype=numpy.float16)}, str(tmp_path / "model-00002.safetensors"))
    spec = load_model_shape_or_bundled(tmp_path, tp=2)
    assert (spec.weights_bytes, spec.weights_source) == (4 * 8 * 4 + 3 * 2, "safetensors")
    assert spec.weights_bytes_per_rank == 67


def test_weights_from_index_total_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((TEMPLATES / "nemotron-h-8b.json").read_text())
    index = {"metadata": {"total_size": 16_000_000_000}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    spec = load_model_shape_or_bundled(tmp_path)
    assert (spec.weights_bytes, spec.weights_source) == (16_000_000_000, "safetensors-index")


def test_corrupt_safetensors_header_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((TEMPLATES / "nemotron-h-8b.json").read_text())
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(struct.pack("<Q", 10) + b"not json!!")
    with pytest.raises(ModelShapeError, match=r"model.safetensors: header is not valid JSON"):
        load_model_shape_or_bundled(tmp_path)
    bad.write_bytes(struct.pack("<Q", 1 << 40))
    with pytest.raises(ModelShapeError, match="implausible"):
        load_model_shape_or_bundled(tmp_path)


def test_non_hybrid_model_names_file_and_model_type(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelShapeError) as err:
        load_model_shape_or_bundled(path)
    assert str(path) in str(err.value) and "'llama'" in str(err.value)


def test_hybrid_type_without_linear_layers_is_not_hybrid(tmp_path: Path) -> None:
    granite = json.loads((TEMPLATES / "granite-4.0-h-small.json").read_text())
    granite["layer_types"] = ["attention"] * 40
    (tmp_path / "config.json").write_text(json.dumps(granite))
    with pytest.raises(ModelShapeError, match="not a hybrid model"):
        load_model_shape_or_bundled(tmp_path)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.pop("linear_num_value_heads"), "key 'linear_num_value_heads' is missing"),
        (
            lambda c: c.update(num_hidden_layers="48"),
            "key 'num_hidden_layers' must be a non-negative integer",
        ),
        (lambda c: c.update(full_attention_interval=0), "key 'full_attention_interval' must be positive"),
        (lambda c: c.update(mamba_ssm_dtype="fp8"), "key 'mamba_ssm_dtype' is 'fp8'"),
    ],
)
def test_bad_keys_name_the_key(tmp_path: Path, mutate: Callable[[dict], object], message: str) -> None:
    cfg = json.loads((TEMPLATES / "qwen3-next-80b-a3b.json").read_text())
    mutate(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelShapeError, match=message) as err:
        load_model_shape_or_bundled(tmp_path)
    assert str(tmp_path / "config.json") in str(err.value)


def test_missing_paths_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(ModelShapeError, match="no such file or directory"):
        load_model_shape_or_bundled(tmp_path / "nope")
    with pytest.raises(ModelShapeError, match="no config.json in this directory"):
        load_model_shape_or_bundled(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelShapeError, match="not valid JSON"):
        load_model_shape_or_bundled(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelShapeError, match="JSON object"):
        load_model_shape_or_bundled(tmp_path)
