"""Reading the six hybrid families' HF `config.json` into one geometry.

Each reader mirrors the SGLang 0.5.23 config class that serves the family (sglang/srt/configs/*.py): which layers are
full attention, which carry recurrent state, and the numbers that shape that state. Both the published checkpoint
spellings (e.g. Nemotron-H `hybrid_override_pattern`, Kimi `linear_attn_config`) and transformers 5 spellings
(`layers_block_type` / `layer_types` with `linear_attention` / `full_attention`) are accepted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hybridshared.model.errors import ModelShapeError
from hybridshared.model.geometry import ConfigReader, Geometry, common_attention, layer_ids, layer_kind
from hybridshared.model.state_shapes import StateShape, kda_state_shape, mamba2_state_shape

SUPPORTED_FAMILIES: tuple[str, ...] = (
    "qwen3_next",
    "qwen3_5",
    "kimi_linear",
    "nemotron_h",
    "falcon_h1",
    "granitemoehybrid",
)

_MODEL_TYPE_FAMILY: dict[str, str] = {
    "qwen3_next": "qwen3_next",
    "qwen3_5": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5",
    "kimi_linear": "kimi_linear",
    "nemotron_h": "nemotron_h",
    "falcon_h1": "falcon_h1",
    "granitemoehybrid": "granitemoehybrid",
}

_ARCH_FAMILY: dict[str, str] = {
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5",
    "KimiLinearForCausalLM": "kimi_linear",
    "NemotronHForCausalLM": "nemotron_h",
    "FalconH1ForCausalLM": "falcon_h1",
    "GraniteMoeHybridForCausalLM": "granitemoehybrid",
}

_DEFAULT_ARCH: dict[str, str] = {
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5": "Qwen3_5MoeForConditionalGeneration",
    "kimi_linear": "KimiLinearForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
}


def detect_family(cfg: dict[str, Any], source: str) -> tuple[str, str, str]:
    """(family, model_type, architecture) or a ModelShapeError naming the file and the model_type."""
    model_type = str(cfg.get("model_type") or "")
    archs = cfg.get("architectures") or []
    arch = str(archs[0]) if isinstance(archs, list) and archs else ""
    family = _MODEL_TYPE_FAMILY.get(model_type) or _ARCH_FAMILY.get(arch)
    if family is None:
        shown = model_type or "(none)"
        raise ModelShapeError(
            f"{source}: model_type {shown!r} (architecture {arch or '(none)'!r}) is not a supported hybrid "
            f"model. hybridctl plans hybrid attention + linear-attention/Mamba models: model_type one of "
            f"{', '.join(sorted(_MODEL_TYPE_FAMILY))}. Point the model path "
            "(server.model_path in config.toml; --model of plan and init) at such a model."
        )
    return family, model_type, arch or _DEFAULT_ARCH[family]


def read_geometry(cfg: dict[str, Any], source: str) -> Geometry:
    family, model_type, arch = detect_family(cfg, source)
    reader = {
        "qwen3_next": _read_gdn,
        "qwen3_5": _read_gdn,
        "kimi_linear": _read_kimi,
        "nemotron_h": _read_nemotron_h,
        "falcon_h1": _read_falcon_h1,
        "granitemoehybrid": _read_granite,
    }[family]
    geom = reader(cfg, source, family, model_type, arch)
    if not geom.linear_layer_ids:
        raise ModelShapeError(
            f"{source}: model_type {model_type!r} declares no linear-attention/Mamba layers, so it is not a "
            f"hybrid model; serve it as a plain transformer (hybridctl's planner has nothing to size)."
        )
    return geom


def _read_gdn(cfg: dict[str, Any], source: str, family: str, model_type: str, arch: str) -> Geometry:
    nested = cfg.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else cfg
    r = ConfigReader(text, source, family, "text_config." if text is not cfg else "")
    n = r.int("num_hidden_layers")
    # qwen3_next.py:260-269: SGLang derives the layout from full_attention_interval (layer_types is ignored).
    if r.has("full_attention_interval"):
        interval = r.int("full_attention_interval")
        if interval == 0:
            raise r.fail("full_attention_interval", "must be positive (4 on published checkpoints).")
        kinds = ["attention" if (i + 1) % interval == 0 else "linear" for i in range(n)]
    elif r.has("layer_types"):
        kinds = [layer_kind(t, r, "layer_types") for t in r.get("layer_types")]
    else:
        kinds = ["attention" if (i + 1) % 4 == 0 else "linear" for i in range(n)]
    if len(kinds) != n:
        raise r.fail("layer_types", f"has {len(kinds)} entries but num_hidden_layers is {n}.")
    key_heads = r.int("linear_num_key_heads")
    value_heads = r.int("linear_num_value_heads")
    key_dim = r.int("linear_key_head_dim")
    value_dim = r.int("linear_value_head_dim")
    # qwen3_next.py:288-313: the Gated DeltaNet state is a Mamba-2 state with keys as groups and state size.
    dims = _Mamba2Dims(
        intermediate_size=value_dim * value_heads,
        n_groups=key_heads,
        num_heads=value_heads,
        head_dim=value_dim,
        state_size=key_dim,
        conv_kernel=r.int("linear_conv_kernel_dim", 4),
    )
    return Geometry(
        family=family,
        model_type=model_type,
        architecture=arch,
        text=text,
        layer_kinds=tuple(kinds),
        attn_layer_ids=layer_ids(kinds, "attention"),
        linear_layer_ids=layer_ids(kinds, "linear"),
        linear_kind="gated_deltanet",
        attention_kind="mha",
        config_ssm_dtype=r.get("mamba_ssm_dtype"),
        state_shape=dims.state_shape,
        vision_config=cfg["vision_config"] if isinstance(cfg.get("vision_config"), dict) else None,
        **common_attention(r),
    )


def _read_kimi(cfg: dict[str, Any], source: str, family: str, model_type: str, arch: str) -> Geometry:
    r = ConfigReader(cfg, source, family)
    n = r.int("num_hidden_layers")
    lac = cfg.get("linear_attn_config")
    if isinstance(lac, dict):
        # kimi_linear.py:137-160: kda_layers are 1-indexed; every other layer is full (MLA) attention.
        kda = {int(x) - 1 for x in (lac.get("kda_layers") or [])}
        kinds = ["linear" if i in kda else "attention" for i in range(n)]
        la = ConfigReader(lac, source, family, "linear_attn_config.")
        num_heads, head_dim = la.int("num_heads"), la.int("head_dim")
        kernel = la.int("short_conv_kernel_size", 4)
    elif r.has("layer_types"):
        kinds = ["linear" if layer_kind(t, r, "layer_types") == "linear" else "attention" for t in r.get("layer_types")]
        num_heads, head_dim = r.int("linear_num_heads"), r.int("linear_head_dim")
        kernel = r.int("linear_conv_kernel_dim", 4)
    else:
        raise r.fail("linear_attn_config", "is missing; Kimi-Linear configs list their KDA layers there.")
    if len(kinds) != n:
        raise r.fail("layer_types", f"has {len(kinds)} entries but num_hidden_layers is {n}.")
    common = common_attention(r)
    # model_config.py:1463-1475: Kimi-Linear's full attention is MLA; the KV cell is the compressed latent.
    common.update(
        kv_lora_rank=r.int("kv_lora_rank"),
        qk_rope_head_dim=r.int("qk_rope_head_dim"),
        head_dim=r.int("qk_nope_head_dim") + r.int("qk_rope_head_dim"),
        v_head_dim=r.int("v_head_dim"),
        context_len=r.int("model_max_length", r.int("max_position_embeddings", 4096)),
    )

    def shape(tp: int) -> StateShape:
        return kda_state_shape(tp=tp, num_heads=num_heads, head_dim=head_dim, conv_kernel=kernel)

    return Geometry(
        family=family,
        model_type=model_type,
        architecture=arch,
        text=cfg,
        layer_kinds=tuple(kinds),
        attn_layer_ids=layer_ids(kinds, "attention"),
        linear_layer_ids=layer_ids(kinds, "linear"),
        linear_kind="kda",
        attention_kind="mla",
        config_ssm_dtype=None,  # kimi_linear.py:182 builds KimiLinearCacheParams without the config dtype
        state_shape=shape,
        **common,
    )


_NEMOTRON_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _read_nemotron_h(cfg: dict[str, Any], source: str, family: str, model_type: str, arch: str) -> Geometry:
    r = ConfigReader(cfg, source, family)
    if r.has("layers_block_type"):
        kinds = _mamba_layer_kinds(r, "layers_block_type")
    elif r.has("hybrid_override_pattern"):
        pattern = str(r.get("hybrid_override_pattern"))
        bad = sorted(set(pattern) - set(_NEMOTRON_PATTERN))
        if bad:
            raise r.fail("hybrid_override_pattern", f"contains {bad}; only M, *, - and E are layer codes.")
        kinds = [_NEMOTRON_PATTERN[c] for c in pattern]
    else:
        # nemotron_h.py:39: SGLang's last-resort default; a real checkpoint always states its pattern.
        raise r.fail("hybrid_override_pattern", "is missing (nor is layers_block_type given).")
    heads = r.int("mamba_num_heads")
    head_dim = r.int("mamba_head_dim")
    dims = _Mamba2Dims(
        intermediate_size=heads * head_dim,
        # nemotron_h.py:425-439 reads n_groups / conv_kernel as the checkpoint stores them (mamba_* are aliases).
        n_groups=r.int("n_groups", r.int("mamba_n_groups", 8)),
        num_heads=heads,
        head_dim=head_dim,
        state_size=r.int("ssm_state_size"),
        conv_kernel=r.int("conv_kernel", r.int("mamba_d_conv", 4)),
    )
    return _mamba2_geometry(
        r,
        (family, model_type, arch),
        kinds,
        attn_layer_ids=layer_ids(kinds, "attention"),
        linear_layer_ids=layer_ids(kinds, "mamba"),
        dims=dims,
        config_ssm_dtype=r.get("mamba_ssm_dtype"),
    )


def _read_falcon_h1(cfg: dict[str, Any], source: str, family: str, model_type: str, arch: str) -> Geometry:
    r = ConfigReader(cfg, source, family)
    n = r.int("num_hidden_layers")
    hidden = r.int("hidden_size")
    # falcon_h1.py:211-225: mamba_d_ssm overrides expand * hidden; "auto" head dim divides it by the heads.
    intermediate = r.int("mamba_d_ssm", r.int("mamba_expand", 2) * hidden)
    heads = r.int("mamba_n_heads")
    if heads == 0 or intermediate % heads != 0:
        raise r.fail("mamba_n_heads", f"({heads}) must divide the Mamba width ({intermediate}).")
    raw_head = cfg.get("mamba_d_head", "auto")
    head_dim = intermediate // heads if raw_head in (None, "auto") else r.int("mamba_d_head")
    dims = _mamba_prefixed_dims(r, intermediate, heads, head_dim)
    # falcon_h1.py:288-299: attention and Mamba run in parallel in every layer.
    return _mamba2_geometry(
        r,
        (family, model_type, arch),
        ["attention+mamba"] * n,
        attn_layer_ids=tuple(range(n)),
        linear_layer_ids=tuple(range(n)),
        dims=dims,
        config_ssm_dtype=r.get("mamba_ssm_dtype"),
    )


def _read_granite(cfg: dict[str, Any], source: str, family: str, model_type: str, arch: str) -> Geometry:
    r = ConfigReader(cfg, source, family)
    n = r.int("num_hidden_layers")
    if not r.has("layer_types"):
        raise r.fail("layer_types", "is missing; Granite-4.0-H configs list 'mamba' / 'attention' per layer.")
    kinds = _mamba_layer_kinds(r, "layer_types")
    if len(kinds) != n:
        raise r.fail("layer_types", f"has {len(kinds)} entries but num_hidden_layers is {n}.")
    hidden = r.int("hidden_size")
    intermediate = r.int("mamba_expand", 2) * hidden  # granitemoehybrid.py:239
    heads = r.int("mamba_n_heads")
    head_dim = r.int("mamba_d_head")
    if head_dim * heads != intermediate:
        raise r.fail("mamba_d_head", f"({head_dim}) * mamba_n_heads ({heads}) must equal {intermediate}.")
    dims = _mamba_prefixed_dims(r, intermediate, heads, head_dim)
    return _mamba2_geometry(
        r,
        (family, model_type, arch),
        kinds,
        attn_layer_ids=layer_ids(kinds, "attention"),
        linear_layer_ids=layer_ids(kinds, "mamba"),
        dims=dims,
        config_ssm_dtype=None,  # granitemoehybrid.py:310 builds Mamba2CacheParams without the config dtype
    )


@dataclass(frozen=True)
class _Mamba2Dims:
    """The numbers `mamba2_state_shape` needs besides the TP size (Gated DeltaNet reuses the Mamba-2 shape)."""

    intermediate_size: int
    n_groups: int
    num_heads: int
    head_dim: int
    state_size: int
    conv_kernel: int

    def state_shape(self, tp: int) -> StateShape:
        return mamba2_state_shape(tp=tp, **asdict(self))


def _mamba_prefixed_dims(r: ConfigReader, intermediate: int, heads: int, head_dim: int) -> _Mamba2Dims:
    # Falcon-H1 and Granite-4.0-H name the rest of the Mamba-2 numbers alike (mamba_n_groups, mamba_d_state, ...).
    return _Mamba2Dims(
        intermediate_size=intermediate,
        n_groups=r.int("mamba_n_groups", 1),
        num_heads=heads,
        head_dim=head_dim,
        state_size=r.int("mamba_d_state"),
        conv_kernel=r.int("mamba_d_conv", 4),
    )


def _mamba_layer_kinds(r: ConfigReader, key: str) -> list[str]:
    # transformers 5 spells a Mamba layer either "mamba" or "linear_attention"; both are Mamba-2 here.
    return ["mamba" if k == "linear" else k for k in (layer_kind(t, r, key) for t in r.get(key))]


def _mamba2_geometry(
    r: ConfigReader,
    ids: tuple[str, str, str],
    kinds: list[str],
    *,
    attn_layer_ids: tuple[int, ...],
    linear_layer_ids: tuple[int, ...],
    dims: _Mamba2Dims,
    config_ssm_dtype: str | None,
) -> Geometry:
    family, model_type, arch = ids
    return Geometry(
        family=family,
        model_type=model_type,
        architecture=arch,
        text=r.cfg,
        layer_kinds=tuple(kinds),
        attn_layer_ids=attn_layer_ids,
        linear_layer_ids=linear_layer_ids,
        linear_kind="mamba2",
        attention_kind="mha",
        config_ssm_dtype=config_ssm_dtype,
        state_shape=dims.state_shape,
        **common_attention(r),
    )
