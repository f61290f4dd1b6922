"""Apply the planner's Recommendation to a HybridConfig; returns why each value was chosen."""

from __future__ import annotations

from typing import Any

from hybridctl.config.schema import HybridConfig

# Recommendation field -> the config key it sets (one place knows both names).
RECOMMENDATION_KEYS: dict[str, str] = {
    "mem_fraction_static": "config.memory.mem_fraction_static",
    "mamba_full_memory_ratio": "config.memory.mamba_full_memory_ratio",
    "max_running_requests": "settings.runtime.max_running_requests",
    "chunked_prefill_size": "settings.runtime.chunked_prefill_size",
    "strategy": "config.cache.mamba_radix_cache_strategy",
    "mamba_radix_cache_strategy": "config.cache.mamba_radix_cache_strategy",
    "page_size": "config.cache.radix_cache_page_size",
    "radix_cache_page_size": "config.cache.radix_cache_page_size",
}


def _values_and_reasons(rec: Any) -> tuple[dict[str, Any], dict[str, str]]:
    values = getattr(rec, "values", None)
    reasons = getattr(rec, "reasons", None) or {}
    if not isinstance(values, dict):
        values = {name: getattr(rec, name) for name in RECOMMENDATION_KEYS if hasattr(rec, name)}
    return values, dict(reasons)


def apply_recommendation(cfg: HybridConfig, rec: Any) -> dict[str, str]:
    """Set every recommended value on `cfg` (validated by the schema); returns dotted key -> reason."""
    values, reasons = _values_and_reasons(rec)
    notes: dict[str, str] = {}
    for name, value in values.items():
        target = RECOMMENDATION_KEYS.get(name)
        if target is None or value is None:
            continue
        part, section, key = target.split(".")
        setattr(getattr(getattr(cfg, part), section), key, value)  # validate_assignment checks the range
        notes[f"{section}.{key}"] = str(reasons.get(name, f"planner recommendation: {value}"))
    return notes
