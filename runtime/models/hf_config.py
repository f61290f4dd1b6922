"""Typed access to an HF config.json, with errors that name the file and key."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

from runtime.models.errors import ModelLoadError

_MISSING = object()


class HFConfig:
    def __init__(self, data: dict[str, Any], path: Path, prefix: str = "") -> None:
        self.data = data
        self.path = path
        self.prefix = prefix  # e.g. "text_config." for a multimodal checkpoint's language model

    def text_config(self) -> HFConfig:
        """The language model's config: `text_config` of a multimodal checkpoint, else this config itself."""
        sub = self.data.get("text_config")
        if not isinstance(sub, dict):
            return self
        merged = dict(sub)
        # Some exporters keep these only at the top level.
        for key in ("tie_word_embeddings", "eos_token_id"):
            if key not in merged and key in self.data:
                merged[key] = self.data[key]
        return HFConfig(merged, self.path, prefix="text_config.")

    def get(self, key: str, default: Any = _MISSING) -> Any:
        value = self.data.get(key, default)
        if value is _MISSING or (value is None and default is _MISSING):
            raise ModelLoadError(
                f"{self.path}: key '{self.prefix}{key}' is missing; this model type needs it. Re-export the "
                f"checkpoint with its original config.json, or add '{key}' to the file."
            )
        return value

    def int(self, key: str, default: Any = _MISSING) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelLoadError(
                f"{self.path}: key '{self.prefix}{key}' must be an integer, got {value!r}; fix the file."
            )
        return value

    def float(self, key: str, default: Any = _MISSING) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelLoadError(
                f"{self.path}: key '{self.prefix}{key}' must be a number, got {value!r}; fix the file."
            )
        return float(value)

    def float_pair(
        self, key: str, default: tuple[builtins.float, builtins.float]
    ) -> tuple[builtins.float, builtins.float]:
        """A [lo, hi] pair like `time_step_limit` (transformers writes inf as {"__float__": "Infinity"})."""
        value = self.data.get(key) or default
        try:
            lo, hi = (float(_json_number(v)) for v in value)
        except (TypeError, ValueError):
            raise ModelLoadError(
                f"{self.path}: key '{self.prefix}{key}' must be a pair of numbers, got {value!r}; fix the file."
            ) from None
        return lo, hi

    def rope(
        self, default_theta: builtins.float = 10000.0, default_partial: builtins.float = 1.0
    ) -> tuple[builtins.float, builtins.float]:
        """(rope_theta, partial_rotary_factor) from either the transformers-5 `rope_parameters` dict or
        the older top-level keys. Only unscaled ("default") RoPE is implemented; others are refused."""
        params: dict[str, Any] = self.data.get("rope_parameters") or {}
        scaling = self.data.get("rope_scaling") or {}
        kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
        if kind != "default":
            raise ModelLoadError(
                f"{self.path}: rope type '{kind}' (rope_parameters/rope_scaling) is not supported by the "
                "bundled runtime; only default RoPE is. Serve this model with SGLang, or remove the scaling."
            )
        theta = params.get("rope_theta", self.data.get("rope_theta", default_theta))
        partial = params.get("partial_rotary_factor", self.data.get("partial_rotary_factor", default_partial))
        return float(theta), float(partial)

    def eos_token_ids(self) -> tuple[builtins.int, ...]:
        eos = self.data.get("eos_token_id")
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _json_number(value: Any) -> Any:
    """transformers writes inf/nan as {"__float__": "Infinity"}; anything else is the value itself."""
    return value.get("__float__") if isinstance(value, dict) else value
