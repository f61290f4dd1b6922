"""From a failure to the exact edit: each remedy returns the fix in words and as `Change`s.

The state-pool remedy searches candidate values through the planner (PlanContext.plan) and proposes the first
one that makes the pool hold the requests wanted, so a suggested value is never a guess. Without a config or a
model the remedies still say what to change, with no machine edit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridctl.config.findings import Finding
from hybridctl.config.schema import HybridConfig
from hybridctl.doctor.findings import Change
from hybridctl.doctor.planning import PlanContext
from hybridshared.sizing.pool_sizing import PoolSizingError

Remedy = tuple[str, tuple[Change, ...]]

_RATIO_STEPS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)  # schema: 0 < ratio <= 10
_FRACTION_STEPS = (0.88, 0.9, 0.92, 0.94)


@dataclass(frozen=True)
class RemedyInput:
    cfg: HybridConfig | None
    plan: PlanContext | None = None
    peer: HybridConfig | None = None


def _key_value(cfg: HybridConfig, file: str, key: str) -> Any:
    node: Any = cfg.config if file == "config.toml" else cfg.settings
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _with(cfg: HybridConfig, file: str, key: str, value: Any) -> HybridConfig:
    data = cfg.model_dump()
    node = data["config" if file == "config.toml" else "settings"]
    *path, name = key.split(".")
    for part in path:
        node = node[part]
    node[name] = value
    return HybridConfig.model_validate(data)


def grow_state_pool(inp: RemedyInput) -> Remedy:
    generic = (
        "Give the recurrent-state pool more slots: raise memory.mamba_full_memory_ratio or "
        "memory.max_mamba_cache_size in config.toml, lower runtime.max_running_requests in settings.json, "
        'use mamba.state_dtype = "bfloat16", or more GPUs (server.tp_size).'
    )
    cfg, ctx = inp.cfg, inp.plan
    if cfg is None or ctx is None:
        return generic + " (doctor computes exact values when given the config and a readable model.)", ()
    wanted = cfg.settings.runtime.max_running_requests
    target = max(2, wanted or 0)
    candidates: list[tuple[str, str, list[Any]]] = []
    slots = cfg.config.memory.max_mamba_cache_size
    if slots is not None:
        candidates.append(("config.toml", "memory.max_mamba_cache_size", [target * r for r in range(1, 7)]))
    ratio = cfg.config.memory.mamba_full_memory_ratio
    candidates.append(("config.toml", "memory.mamba_full_memory_ratio", [r for r in _RATIO_STEPS if r > ratio]))
    fraction = cfg.config.memory.mem_fraction_static
    candidates.append(("config.toml", "memory.mem_fraction_static", [f for f in _FRACTION_STEPS if f > fraction]))
    if cfg.settings.mamba.state_dtype == "float32":
        # SGLang's own advice when the state pool caps requests; it halves the state at some precision.
        candidates.append(("settings.json", "mamba.state_dtype", ["bfloat16"]))
    for file, key, values in candidates:
        for value in values:
            trial = _with(cfg, file, key, value)
            if (plan := _plan_or_none(ctx, trial)) and plan.pools.max_running_requests >= target:
                p = plan.pools
                text = (
                    f"Set {key} = {json.dumps(value)} in {file}: the planner then gives "
                    f"{p.max_mamba_cache_size} state slots, {p.max_running_requests} concurrent requests at "
                    f"{p.slots_per_request} slots each."
                )
                return text, (Change(file, key, value),)  # type: ignore[arg-type]
    if wanted and (plan := _plan_or_none(ctx, _with(cfg, "settings.json", "runtime.max_running_requests", 1))):
        fits = plan.pools.max_mamba_cache_size // plan.pools.slots_per_request
        if fits >= 1:
            text = (
                f"No memory setting gives {wanted} requests their state slots; set "
                f"runtime.max_running_requests = {fits} in settings.json (what "
                f"{plan.pools.max_mamba_cache_size} "
                "slots hold), or add GPUs."
            )
            return text, (Change("settings.json", "runtime.max_running_requests", fits),)
    try:
        ctx.plan(cfg)
        why = ""
    except PoolSizingError as exc:
        why = f" The planner says: {exc}"
    return f"No single config value makes the pools fit on this memory.{why}", ()


def _plan_or_none(ctx: PlanContext, cfg: HybridConfig) -> Any:
    try:
        return ctx.plan(cfg)
    except PoolSizingError:
        return None


def enable_prefix_cache(inp: RemedyInput) -> Remedy:
    wanted: list[tuple[str, str, Any]] = [
        ("settings.json", "mamba.state_snapshot_on_match", True),
        ("settings.json", "runtime.disable_radix_cache", False),
        ("config.toml", "cache.enable_prefix_caching", True),
    ]
    if inp.cfg is None:
        return "Set mamba.state_snapshot_on_match = true and runtime.disable_radix_cache = false.", ()
    changes = tuple(Change(f, k, v) for f, k, v in wanted if _key_value(inp.cfg, f, k) != v)  # type: ignore
    words = ", ".join(f"{c.key} = {json.dumps(c.value)} in {c.file}" for c in changes)
    return (f"Set {words}." if changes else "Prefix caching is already on in the config."), changes


def _simple(file: str, key: str, value: Any, why: str) -> Callable[[RemedyInput], Remedy]:
    def remedy(inp: RemedyInput) -> Remedy:
        text = f"Set {key} = {json.dumps(value)} in {file}{why}."
        if inp.cfg is not None and _key_value(inp.cfg, file, key) == value:
            return text, ()
        return text, (Change(file, key, value),)  # type: ignore[arg-type]

    return remedy


elastic_off = _simple("config.toml", "memory.enable_elastic_memory_pool", False, " (a fixed split)")


def spec_track_interval(inp: RemedyInput) -> Remedy:
    if inp.cfg is None:
        return (
            "Set cache.mamba_track_interval >= speculative_num_draft_tokens (a multiple of the page size).",
            (),
        )
    cache, spec = inp.cfg.config.cache, inp.cfg.config.speculative
    need = max(spec.speculative_num_draft_tokens, cache.mamba_track_interval)
    page = cache.radix_cache_page_size
    value = -(-need // page) * page
    text = f"Set cache.mamba_track_interval = {value} in config.toml (>= the draft tokens, a page multiple)."
    return text, (Change("config.toml", "cache.mamba_track_interval", value),)


def spec_topk_one(inp: RemedyInput) -> Remedy:
    if inp.cfg is None:
        return "Set speculative.speculative_topk = 1 and speculative_num_draft_tokens = steps + 1.", ()
    steps = inp.cfg.config.speculative.speculative_num_steps
    text = f"Set speculative.speculative_topk = 1 and speculative_num_draft_tokens = {steps + 1} in config.toml."
    return text, (
        Change("config.toml", "speculative.speculative_topk", 1),
        Change("config.toml", "speculative.speculative_num_draft_tokens", steps + 1),
    )


def pd_match_peer(inp: RemedyInput) -> Remedy:
    generic = "Use the same model, mamba.state_dtype and server.tp_size on the prefill and decode servers."
    if inp.cfg is None or inp.peer is None:
        return generic, ()
    changes = []
    for file, key in (("settings.json", "mamba.state_dtype"), ("config.toml", "server.tp_size")):
        theirs = _key_value(inp.peer, file, key)
        if _key_value(inp.cfg, file, key) != theirs:
            changes.append(Change(file, key, theirs))  # type: ignore[arg-type]
    if not changes:
        return generic, ()
    words = ", ".join(f"{c.key} = {json.dumps(c.value)} in {c.file}" for c in changes)
    return f"Match the peer: set {words}.", tuple(changes)


REMEDIES: dict[str, Callable[[RemedyInput], Remedy]] = {
    "grow_state_pool": grow_state_pool,
    "enable_prefix_cache": enable_prefix_cache,
    "prefix_page_size": _simple("config.toml", "cache.radix_cache_page_size", 1, " (no_buffer pages one token)"),
    "spec_track_interval": spec_track_interval,
    "spec_topk_one": spec_topk_one,
    "spec_sandbox": _simple("config.toml", "speculative.enable_mamba_state_sandbox", True, ""),
    "elastic_off": elastic_off,
    "pd_match_peer": pd_match_peer,
    "pd_strategy": _simple("config.toml", "cache.mamba_radix_cache_strategy", "extra_buffer", ""),
    "spec_extra_buffer": _simple(
        "config.toml", "cache.mamba_radix_cache_strategy", "extra_buffer", " (state checkpoints to roll drafts back to)"
    ),
}


# The rules' fix text is generated by rules.toml_set / rules.json_set; its first suggestion is the edit.
_TOML_SET = re.compile(r"set (?P<name>\w+) = (?P<value>.+?) in \[(?P<section>[\w.]+)\] of config\.toml")
_REMOVE_EXTRA = re.compile(r"remove `(?P<name>[^`]+)` from \[extra_engine_args\]")
_JSON_SET = re.compile(r'set "(?P<name>\w+)": (?P<value>.+?) in the "(?P<section>\w+)" object of settings\.json')


def changes_from_rule(f: Finding) -> tuple[Change, ...]:
    """The machine edit behind a config rule's first suggestion (none for placeholders or prose)."""
    if m := _REMOVE_EXTRA.search(f.fix):
        return (Change("config.toml", f"extra_engine_args.{m.group('name')}", None),)
    matches = [(m.start(), "config.toml", m) for m in [_TOML_SET.search(f.fix)] if m]
    matches += [(m.start(), "settings.json", m) for m in [_JSON_SET.search(f.fix)] if m]
    if not matches:
        return ()
    _, file, m = min(matches, key=lambda t: t[0])
    try:
        value = json.loads(m.group("value"))
    except json.JSONDecodeError:
        return ()
    if isinstance(value, str) and value.startswith("/path/to"):
        return ()
    return (Change(file, f"{m.group('section')}.{m.group('name')}", value),)  # type: ignore[arg-type]
