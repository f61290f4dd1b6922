"""The family-independent part of reading a config.json: the Geometry it yields and checked key access."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridshared.model.errors import ModelShapeError
from hybridshared.model.state_shapes import StateShape


@dataclass(frozen=True)
class Geometry:
    """What a family reader extracts; `state_shape(tp)` gives the per-rank recurrent state."""

    family: str
    model_type: str
    architecture: str
    text: dict[str, Any] = field(repr=False)  # the language-model part of config.json
    layer_kinds: tuple[str, ...]
    attn_layer_ids: tuple[int, ...]
    linear_layer_ids: tuple[int, ...]
    linear_kind: str  # gated_deltanet | kda | mamba2
    attention_kind: str  # mha | mla
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    hidden_size: int
    vocab_size: int
    context_len: int
    # SGLang reads `mamba_ssm_dtype` from the config only for some families (mamba2_state_dtype(self) vs
    # mamba2_state_dtype(None)); None means the config does not influence the SSM dtype.
    config_ssm_dtype: str | None
    state_shape: Callable[[int], StateShape] = field(repr=False, compare=False)
    vision_config: dict[str, Any] | None = field(default=None, repr=False)  # multimodal checkpoints only


class ConfigReader:
    """Key access that turns a missing or mistyped key into a ModelShapeError naming file and key."""

    def __init__(self, cfg: dict[str, Any], source: str, family: str, prefix: str = "") -> None:
        self.cfg = cfg
        self.source = source
        self.family = family
        self.prefix = prefix

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None) -> int:
        value = self.cfg.get(key)
        if value is None:
            value = default
        if value is None:
            raise ModelShapeError(
                f"{self.source}: key '{self.prefix}{key}' is missing; a {self.family} config "
                f"needs it to size the caches. Add it from the model's published config.json."
            )
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelShapeError(
                f"{self.source}: key '{self.prefix}{key}' must be a non-negative integer, got {value!r}. "
                f"Fix the value in config.json."
            )
        return value

    def fail(self, key: str, problem: str) -> ModelShapeError:
        return ModelShapeError(f"{self.source}: key '{self.prefix}{key}' {problem}")


def common_attention(r: ConfigReader) -> dict[str, Any]:
    heads = r.int("num_attention_heads")
    hidden = r.int("hidden_size")
    if heads == 0:
        raise r.fail("num_attention_heads", "must be positive.")
    # model_config.py:1341-1354: head_dim falls back to hidden_size // heads, v_head_dim to head_dim.
    head_dim = r.int("head_dim", hidden // heads)
    kv_heads = r.int("num_key_value_heads", heads)
    return {
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "v_head_dim": r.int("v_head_dim", head_dim) or head_dim,
        "kv_lora_rank": None,
        "qk_rope_head_dim": None,
        "hidden_size": hidden,
        "vocab_size": r.int("vocab_size"),
        "context_len": r.int("max_position_embeddings", 4096),
    }


def layer_ids(kinds: list[str], *wanted: str) -> tuple[int, ...]:
    return tuple(i for i, k in enumerate(kinds) if k in wanted)


def layer_kind(raw: Any, r: ConfigReader, key: str) -> str:
    names = {
        "full_attention": "attention",
        "attention": "attention",
        "linear_attention": "linear",
        "mamba": "mamba",
        "mlp": "mlp",
        "moe": "moe",
    }
    if raw not in names:
        raise r.fail(key, f"contains {raw!r}; expected one of {', '.join(sorted(names))}.")
    return names[raw]
