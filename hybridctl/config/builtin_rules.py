"""BUILTIN_UNSUPPORTED: what the bundled runtime (engine = "builtin") refuses or does not implement."""

from __future__ import annotations

from hybridctl.config.findings import Finding
from hybridctl.config.rule_findings import CONFIG, SETTINGS, json_set, toml_set
from hybridctl.config.rule_findings import rule_finding as _f
from hybridctl.config.schema import HybridConfig

BUILTIN_SCHEDULE_POLICIES = ("fcfs", "lpm")


def rule_builtin(cfg: HybridConfig, engine: str | None = None) -> list[Finding]:
    """BUILTIN_UNSUPPORTED: what the bundled runtime does not implement (`engine`: the resolved engine)."""
    if engine != "builtin":
        return []
    out = []
    policy = cfg.settings.runtime.schedule_policy
    if policy not in BUILTIN_SCHEDULE_POLICIES:
        out.append(
            _f(
                "error",
                "BUILTIN_UNSUPPORTED",
                SETTINGS,
                "runtime.schedule_policy",
                f'schedule_policy "{policy}" is not implemented by the bundled runtime (engine = "builtin"), '
                f"which schedules {' or '.join(BUILTIN_SCHEDULE_POLICIES)}.",
                json_set("runtime.schedule_policy", '"lpm"')
                + ' (or set engine = "sglang" in [server] of config.toml)',
            )
        )
    # runtime/args.py and runtime/engine/pool_setup.py refuse these at start-up.
    refused = [
        (
            "server.tp_size",
            cfg.config.server.tp_size != 1,
            "1",
            "it runs on one device, so tp_size must be 1",
        ),
        (
            "cache.mamba_radix_cache_strategy",
            cfg.config.cache.mamba_radix_cache_strategy == "extra_buffer_lazy",
            '"extra_buffer"',
            "extra_buffer_lazy needs the overlap schedule, which it does not have",
        ),
        (
            "speculative.speculative_algorithm",
            cfg.config.speculative.speculative_algorithm == "EAGLE3",
            '"NEXTN"',
            "it drafts with NGRAM, STANDALONE or the checkpoint's MTP layer (NEXTN/EAGLE), not EAGLE3 heads",
        ),
        (
            "speculative.speculative_topk",
            cfg.speculative_enabled and cfg.config.speculative.speculative_topk != 1,
            "1",
            "it verifies chain drafts only (topk 1), not draft trees",
        ),
        (
            "memory.enable_elastic_memory_pool",
            cfg.config.memory.enable_elastic_memory_pool and cfg.speculative_enabled,
            "false",
            "its speculative decoding keeps the draft state sandbox outside the elastic buffer, so the elastic "
            "pool and speculative decoding cannot run together (runtime/engine/engine_core.py)",
        ),
        (
            "cache.mamba_track_interval",
            cfg.config.cache.mamba_track_interval % cfg.config.cache.radix_cache_page_size != 0,
            str(max(1, cfg.config.cache.mamba_track_interval // cfg.config.cache.radix_cache_page_size)
                * cfg.config.cache.radix_cache_page_size),
            "mamba_track_interval must be a multiple of radix_cache_page_size, prefix cache on or off",
        ),
    ]
    if cfg.settings.runtime.chunked_prefill_size == 0:
        out.append(
            _f(
                "error",
                "BUILTIN_UNSUPPORTED",
                SETTINGS,
                "runtime.chunked_prefill_size",
                'chunked_prefill_size = 0: the bundled runtime (engine = "builtin") refuses it; use a '
                "positive chunk, or -1 to disable chunking.",
                json_set("runtime.chunked_prefill_size", "8192") + " (or -1)",
            )
        )
    for key, bad, good, why in refused:
        if bad:
            out.append(
                _f(
                    "error",
                    "BUILTIN_UNSUPPORTED",
                    CONFIG,
                    key,
                    f'the bundled runtime (engine = "builtin") would refuse to start: {why}.',
                    f'{toml_set(key, good)}, or set engine = "sglang" in [server] of {CONFIG}',
                )
            )
    return out
