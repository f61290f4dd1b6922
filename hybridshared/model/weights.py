"""Weight bytes of a model: exact from safetensors headers when the files are there, else estimated.

The header is parsed by hand (8-byte little-endian length, then JSON) so the control plane never needs torch
or the safetensors package.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridshared.model.dtypes import dtype_bytes
from hybridshared.model.errors import ModelShapeError
from hybridshared.model.geometry import Geometry

# A header larger than this is not a real safetensors header (real ones are a few MB at most).
_MAX_HEADER_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class WeightBytes:
    total: int
    source: str  # "safetensors" (headers read), "safetensors-index" (index total_size), "estimate" (config)
    files: int = 0


def safetensors_payload_bytes(path: Path) -> int:
    """Bytes of tensor data declared in one .safetensors file's header."""
    try:
        with path.open("rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) != 8:
                raise ModelShapeError(f"{path}: too short to be a safetensors file (no 8-byte header length).")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > _MAX_HEADER_BYTES:
                raise ModelShapeError(
                    f"{path}: header length {header_len} is implausible; the file is not safetensors or is "
                    f"corrupt. Re-download it."
                )
            header_raw = fh.read(header_len)
    except OSError as exc:
        raise ModelShapeError(f"{path}: cannot read ({exc.strerror}).") from None
    if len(header_raw) != header_len:
        raise ModelShapeError(f"{path}: header is truncated; the file is incomplete. Re-download it.")
    try:
        header = json.loads(header_raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelShapeError(f"{path}: header is not valid JSON; the file is corrupt. Re-download it.") from None
    if not isinstance(header, dict):
        raise ModelShapeError(f"{path}: header is not a JSON object; the file is corrupt. Re-download it.")
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            total += int(end) - int(begin)
        except (KeyError, TypeError, ValueError):
            raise ModelShapeError(
                f"{path}: tensor {name!r} has no valid data_offsets; the file is corrupt. Re-download it."
            ) from None
    return total


def weight_bytes(model_dir: Path | None, geom: Geometry) -> WeightBytes:
    """Headers of every *.safetensors in the dir; else the index's total_size; else an estimate."""
    if model_dir is not None:
        files = sorted(model_dir.glob("*.safetensors"))
        if files:
            return WeightBytes(sum(safetensors_payload_bytes(f) for f in files), "safetensors", len(files))
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                total = json.loads(index.read_text())["metadata"]["total_size"]
                return WeightBytes(int(total), "safetensors-index")
            except (OSError, ValueError, KeyError, TypeError):
                pass  # an unreadable index is not fatal: the config estimate below still applies
    return WeightBytes(int(estimate_parameters(geom) * _bytes_per_param(geom)), "estimate")


def _bytes_per_param(geom: Geometry) -> float:
    cfg = geom.text
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        if q.get("bits") == 4 or str(q.get("quant_method", "")).lower() in {"mxfp4", "nvfp4", "awq"}:
            return 0.5
        if "fp8" in str(q.get("quant_method", "")).lower():
            return 1
    name = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    try:
        return dtype_bytes(str(name))
    except ValueError:
        return 2


def _i(cfg: dict[str, Any], key: str, default: int = 0) -> int:
    value = cfg.get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


def _attention_params(geom: Geometry) -> int:
    h = geom.hidden_size
    if geom.attention_kind == "mla":
        cfg = geom.text
        nope, rope = _i(cfg, "qk_nope_head_dim"), _i(cfg, "qk_rope_head_dim")
        lora, v = _i(cfg, "kv_lora_rank"), _i(cfg, "v_head_dim")
        heads = geom.num_attention_heads
        return h * heads * (nope + rope) + h * (lora + rope) + lora * heads * (nope + v) + heads * v * h
    q = h * geom.num_attention_heads * geom.head_dim
    if geom.family in ("qwen3_next", "qwen3_5"):
        q *= 2  # gated attention: q_proj also produces the output gate
    kv = h * geom.num_kv_heads * (geom.head_dim + geom.v_head_dim)
    return q + kv + geom.num_attention_heads * geom.v_head_dim * h


def _linear_params(geom: Geometry) -> int:
    cfg, h = geom.text, geom.hidden_size
    shape = geom.state_shape(1)
    if geom.linear_kind == "gated_deltanet":
        kd = _i(cfg, "linear_num_key_heads") * _i(cfg, "linear_key_head_dim")
        vd = _i(cfg, "linear_num_value_heads") * _i(cfg, "linear_value_head_dim")
        conv = shape.conv[0] * (shape.conv[1] + 1)
        return h * (2 * kd + 2 * vd) + h * 2 * _i(cfg, "linear_num_value_heads") + conv + vd * h
    if geom.linear_kind == "kda":
        heads, hd, _ = shape.temporal
        proj = heads * hd
        conv = shape.conv[1] * (shape.conv[0] + 1)
        return 4 * h * proj + 2 * h * hd + conv + proj * h
    heads, head_dim, state = shape.temporal
    inner = heads * head_dim
    conv_dim = shape.conv[0]
    groups_state = (conv_dim - inner) // 2
    return h * (2 * inner + 2 * groups_state + heads) + conv_dim * (shape.conv[1] + 1) + inner * h


def _ffn_params(geom: Geometry, layer: int, kind: str) -> int:
    cfg, h = geom.text, geom.hidden_size
    gated = 2 if geom.family == "nemotron_h" else 3  # Nemotron-H's relu2 MLPs have no gate projection
    experts = _i(cfg, "num_experts") or _i(cfg, "n_routed_experts") or _i(cfg, "num_local_experts")
    moe_inter = _i(cfg, "moe_intermediate_size") or _i(cfg, "intermediate_size")
    shared = (
        _i(cfg, "shared_expert_intermediate_size")
        or _i(cfg, "moe_shared_expert_intermediate_size")
        or _i(cfg, "shared_intermediate_size")
        or (_i(cfg, "num_shared_experts") * moe_inter)
    )
    dense = gated * h * _i(cfg, "intermediate_size")
    moe = experts * gated * h * moe_inter + gated * h * shared + h * experts
    if geom.family == "nemotron_h":
        return {"mlp": dense, "moe": moe}.get(kind, 0)
    if geom.family == "kimi_linear" and layer < _i(cfg, "first_k_dense_replace"):
        return dense
    if geom.family == "granitemoehybrid":
        return experts * gated * h * _i(cfg, "intermediate_size") + gated * h * shared + h * experts
    return moe if experts else dense


def estimate_parameters(geom: Geometry) -> int:
    """Parameter count from the config: embeddings, attention, linear/Mamba mixers and MLP/MoE blocks."""
    h, v = geom.hidden_size, geom.vocab_size
    total = v * h * (1 if geom.text.get("tie_word_embeddings") else 2)
    attn = _attention_params(geom)
    linear = _linear_params(geom)
    attn_ids, linear_ids = set(geom.attn_layer_ids), set(geom.linear_layer_ids)
    for i, kind in enumerate(geom.layer_kinds):
        total += 2 * h  # the layer's norms
        total += attn if i in attn_ids else 0
        total += linear if i in linear_ids else 0
        if geom.family != "nemotron_h" or kind in ("mlp", "moe"):
            total += _ffn_params(geom, i, kind)
    return total
