"""`load_model_shape`: a HF config.json (file or model dir) -> ModelShape, the numbers every planner needs.

Per-rank numbers follow SGLang 0.5.23: recurrent state per request from configs/mamba_utils.py, KV bytes
per token from model_executor/pool_configurator.py (`DefaultPoolConfigurator._compute_cell_size`), KV heads
per rank from configs/model_config.py:1700-1711 (`get_num_kv_heads`: replicated when tp exceeds the KV heads).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from hybridshared import paths
from hybridshared.model.dtypes import SSM_DTYPES, canonical_dtype, dtype_bytes
from hybridshared.model.errors import ModelShapeError
from hybridshared.model.families import read_geometry
from hybridshared.model.state_shapes import state_bytes_per_request
from hybridshared.model.weights import weight_bytes


class StandIns(Protocol):
    """Config.json files that stand in for a model this host does not hold (hybridctl bundles some; the runtime
    reads local models only, so it passes none)."""

    def config_for(self, requested: str) -> Path | None: ...

    def hint(self) -> str: ...


# configs/mamba_utils.py:68: the conv window dtype is bfloat16 unless SGLANG_MAMBA_CONV_DTYPE says otherwise.
CONV_DTYPE = "bfloat16"


@dataclass(frozen=True)
class ModelShape:
    """One hybrid model at one tensor-parallel degree. All *_per_rank / bytes numbers are per GPU."""

    source: str  # the config.json read
    family: str  # qwen3_next | qwen3_5 | kimi_linear | nemotron_h | falcon_h1 | granitemoehybrid
    model_type: str
    architecture: str
    tp: int
    num_layers: int
    layer_kinds: tuple[str, ...]  # attention | linear | mamba | mlp | moe | attention+mamba, per layer
    attn_layer_ids: tuple[int, ...]  # layers with full attention (they hold KV)
    linear_layer_ids: tuple[int, ...]  # layers with recurrent state (linear attention or Mamba)
    num_attn_layers: int
    num_linear_layers: int
    linear_kind: str  # gated_deltanet | kda | mamba2
    attention_kind: str  # mha | mla
    num_attention_heads: int
    num_kv_heads: int  # whole model
    num_kv_heads_per_rank: int
    head_dim: int
    v_head_dim: int
    kv_lora_rank: int | None  # MLA only
    qk_rope_head_dim: int | None  # MLA only
    hidden_size: int
    vocab_size: int
    context_len: int
    conv_state_shape: tuple[int, ...]  # per request, per linear layer, per rank
    ssm_state_shape: tuple[int, ...]  # per request, per linear layer, per rank
    conv_dtype: str
    ssm_dtype: str
    ssm_dtype_source: str  # flag | config | default
    conv_state_bytes: int  # per request, per linear layer, per rank
    ssm_state_bytes: int  # per request, per linear layer, per rank
    mamba_state_bytes_per_request: int  # all linear layers, per rank (SGLang's mamba_cache_per_req)
    kv_dtype: str
    kv_bytes_per_token: int  # full-attention layers only, per rank (SGLang's cell_size)
    weights_bytes: int  # whole model
    weights_bytes_per_rank: int
    weights_source: str  # safetensors | safetensors-index | estimate
    # The vision tower as SGLang's memory heuristic reads it (memory_hook.py:432-442: num_hidden_layers,
    # else 24; hidden_size, else 1024); None for text-only checkpoints.
    vit_num_layers: int | None = None
    vit_hidden_size: int | None = None
    # The model path / hub id asked for when this host does not hold it and `source` is hybridctl's bundled
    # config.json for that checkpoint (hybridctl/model/bundled.py); None when `source` is the model's own.
    stand_in_for: str | None = None

    def stand_in_note(self) -> str | None:
        if self.stand_in_for is None:
            return None
        return f"{self.stand_in_for} is not on this host: read hybridctl's bundled config.json ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key, value in d.items():
            if isinstance(value, tuple):
                d[key] = list(value)
        return d


def _config_path(path: str | Path, stand_ins: StandIns | None) -> tuple[Path, Path | None, str | None]:
    """config.json, the model directory (for the weights), and the path asked for when a bundled copy stands in."""
    p = Path(path).expanduser()
    # paths.is_dir / is_file: a name too long for the OS (or with a NUL byte) is "not found", not a crash.
    if paths.is_dir(p):
        cfg = p / "config.json"
        if not paths.is_file(cfg):
            raise ModelShapeError(
                f"{p}: no config.json in this directory. Point the model path (server.model_path in "
                f"config.toml; --model of plan and init) at a HF model directory or its config.json."
            )
        return cfg, p, None
    if paths.is_file(p):
        return p, p.parent, None
    stand_in = stand_ins.config_for(str(path)) if stand_ins is not None else None
    if stand_in is not None:  # a config for a server that holds the model: its geometry from the bundled copy
        return stand_in, None, str(path)
    known = f"; {stand_ins.hint()}" if stand_ins is not None else ""
    raise ModelShapeError(
        f"{p}: no such file or directory, and not a checkpoint hybridctl bundles a config.json for. Point the "
        f"model path (server.model_path in config.toml; --model of plan and init) at a HF model directory or its "
        f"config.json{known}."
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelShapeError(f"{path}: cannot read ({exc.strerror}).") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelShapeError(f"{path}: not valid JSON ({exc}). Fix or re-download config.json.") from None
    if not isinstance(data, dict):
        raise ModelShapeError(f"{path}: the top level must be a JSON object, as in every HF config.json.")
    return data


def _resolve_ssm_dtype(flag: str | None, from_config: str | None, source: Path) -> tuple[str, str]:
    # configs/mamba_utils.py:47-107: flag (SGLANG_MAMBA_SSM_DTYPE) > config mamba_ssm_dtype > float32.
    if flag is not None:
        name = canonical_dtype(flag) if flag.lower() in {"fp32", "bf16", "fp16", *SSM_DTYPES} else flag
        if name not in SSM_DTYPES:
            raise ModelShapeError(f"--mamba-ssm-dtype {flag!r} is not supported; use one of {', '.join(SSM_DTYPES)}.")
        return name, "flag"
    if from_config is not None:
        if from_config not in SSM_DTYPES:
            raise ModelShapeError(
                f"{source}: key 'mamba_ssm_dtype' is {from_config!r}; SGLang accepts {', '.join(SSM_DTYPES)} "
                f"(and would silently fall back to float32). Fix the value or drop the key."
            )
        return from_config, "config"
    return "float32", "default"


def load_model_shape(
    path: str | Path,
    *,
    tp: int = 1,
    ssm_dtype: str | None = None,
    kv_dtype: str = "bfloat16",
    stand_ins: StandIns | None = None,
) -> ModelShape:
    """Read config.json (a file, or a model dir holding one) of a supported hybrid model; `stand_ins` answer for
    a path this host does not hold."""
    if tp < 1:
        raise ModelShapeError(f"tensor-parallel size must be >= 1, got {tp}.")
    cfg_path, model_dir, stand_in_for = _config_path(path, stand_ins)
    geom = read_geometry(_read_json(cfg_path), str(cfg_path))
    try:
        shape = geom.state_shape(tp)
    except ValueError as exc:
        raise ModelShapeError(
            f"{cfg_path}: cannot shard this model {tp} ways: {exc}. Pick a tensor-parallel size that divides "
            "it (server.tp_size; --tp of plan and init)."
        ) from None
    ssm_name, ssm_source = _resolve_ssm_dtype(ssm_dtype, geom.config_ssm_dtype, cfg_path)
    conv_b, ssm_b = dtype_bytes(CONV_DTYPE), dtype_bytes(ssm_name)
    try:
        kv_b = dtype_bytes(kv_dtype)
    except ValueError as exc:
        raise ModelShapeError(f"KV cache dtype: {exc}.") from None
    kv_heads_rank = max(1, geom.num_kv_heads // tp)
    n_attn = len(geom.attn_layer_ids)
    if geom.attention_kind == "mla":
        # pool_configurator.py (MLA branch of _compute_cell_size): latent + rope key, shared by all heads,
        # not split across ranks.
        assert geom.kv_lora_rank is not None and geom.qk_rope_head_dim is not None
        kv_per_token = (geom.kv_lora_rank + geom.qk_rope_head_dim) * n_attn * kv_b
    else:
        kv_per_token = kv_heads_rank * (geom.head_dim + geom.v_head_dim) * n_attn * kv_b
    weights = weight_bytes(model_dir, geom)
    return ModelShape(
        source=str(cfg_path),
        family=geom.family,
        model_type=geom.model_type,
        architecture=geom.architecture,
        tp=tp,
        num_layers=len(geom.layer_kinds),
        layer_kinds=geom.layer_kinds,
        attn_layer_ids=geom.attn_layer_ids,
        linear_layer_ids=geom.linear_layer_ids,
        num_attn_layers=n_attn,
        num_linear_layers=len(geom.linear_layer_ids),
        linear_kind=geom.linear_kind,
        attention_kind=geom.attention_kind,
        num_attention_heads=geom.num_attention_heads,
        num_kv_heads=geom.num_kv_heads,
        num_kv_heads_per_rank=kv_heads_rank,
        head_dim=geom.head_dim,
        v_head_dim=geom.v_head_dim,
        kv_lora_rank=geom.kv_lora_rank,
        qk_rope_head_dim=geom.qk_rope_head_dim,
        hidden_size=geom.hidden_size,
        vocab_size=geom.vocab_size,
        context_len=geom.context_len,
        conv_state_shape=shape.conv,
        ssm_state_shape=shape.temporal,
        conv_dtype=CONV_DTYPE,
        ssm_dtype=ssm_name,
        ssm_dtype_source=ssm_source,
        conv_state_bytes=shape.conv_numel * conv_b,
        ssm_state_bytes=shape.temporal_numel * ssm_b,
        mamba_state_bytes_per_request=state_bytes_per_request(
            shape, conv_bytes=conv_b, ssm_bytes=ssm_b, num_linear_layers=len(geom.linear_layer_ids)
        ),
        kv_dtype=canonical_dtype(kv_dtype),
        kv_bytes_per_token=kv_per_token,
        weights_bytes=weights.total,
        weights_bytes_per_rank=-(-weights.total // tp),
        weights_source=weights.source,
        vit_num_layers=_vit_value(geom.vision_config, "num_hidden_layers", 24),
        vit_hidden_size=_vit_value(geom.vision_config, "hidden_size", 1024),
        stand_in_for=stand_in_for,
    )


def _vit_value(vision: dict[str, Any] | None, key: str, default: int) -> int | None:
    if vision is None:
        return None
    value = vision.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default
