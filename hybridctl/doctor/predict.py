"""Predict the five failure modes from the config (plus the planner, the host's sglang and a PD peer config).

Config-only rules come from hybridctl/rules/cross_file.py (shared with `validate`); this module adds what needs
the planner (MAMBA_POOL_ALLOC), the installed engine (PREFIX_CACHE_MISS by version) and a second config
(PD_STATE_MISMATCH between prefill and decode). Host-level ELASTIC_TIMEOUT causes live in judge.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybridctl.config.schema import HybridConfig
from hybridctl.doctor.findings import DoctorFinding
from hybridctl.doctor.planning import PlanContext
from hybridctl.doctor.remedies import (
    RemedyInput,
    changes_from_rule,
    elastic_off,
    grow_state_pool,
    pd_match_peer,
    spec_topk_one,
)
from hybridctl.host.facts import SglangFacts
from hybridctl.launch.translate import engine_findings
from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridctl.planner.plan import Plan
from hybridctl.rules.cross_file import check_rules
from hybridshared.model.errors import ModelShapeError
from hybridshared.sizing.pool_sizing import PoolSizingError

if TYPE_CHECKING:
    from hybridshared.model.shape import ModelShape


@dataclass
class Prediction:
    findings: list[DoctorFinding]
    plan: Plan | None  # the pools the engine would build (None: could not plan)
    plan_error: str | None = None


def rule_findings(cfg: HybridConfig, engine_version: str | None, engine: str | None = None) -> list[DoctorFinding]:
    """`validate`'s rules, checked against `engine` (the one a launch would use here)."""

    out = []
    found = check_rules(cfg, engine_version, include_secrets=False, engine=engine)
    found += [f for f in engine_findings(cfg, engine, engine_version) if f.code == "IGNORED_BY_ENGINE"]
    for f in found:
        changes = changes_from_rule(f)
        if f.key == "speculative.speculative_topk" and f.code in ("SPEC_ROLLBACK", "BUILTIN_UNSUPPORTED"):
            changes = spec_topk_one(RemedyInput(cfg))[1]  # topk 1 and the chain's draft-token count together
        out.append(DoctorFinding.from_config_finding(f, changes))
    return out


def predict_state_pool(cfg: HybridConfig, ctx: PlanContext) -> Prediction:
    """MAMBA_POOL_ALLOC: the pool the engine would build cannot hold the requests it should serve."""
    remedy_in = RemedyInput(cfg, ctx)
    try:
        plan = ctx.plan(cfg)
    except PoolSizingError as exc:
        fix, changes = grow_state_pool(remedy_in)
        finding = DoctorFinding(
            "MAMBA_POOL_ALLOC", "error", f"The {ctx.engine} engine will refuse to start: {exc}", fix, changes,
            evidence=f"planner ({ctx.spec.family}, tp {ctx.spec.tp}, {ctx.engine})",
        )  # fmt: skip
        return Prediction([finding], None, str(exc))
    p = plan.pools
    per_req, slots = p.slots_per_request, p.max_mamba_cache_size
    evidence = f"{slots} state slots, {per_req} per request, max_running_requests {p.max_running_requests}"
    wanted = cfg.settings.runtime.max_running_requests
    findings = []
    if slots < 2 * per_req:
        fix, changes = grow_state_pool(remedy_in)
        cause = (
            f"The state pool holds {slots} slots and every running request takes {per_req}: fewer than two "
            "requests' worth, so requests run one at a time and a second one that needs a slot fails "
            '("Not enough space for mamba cache" / "Mamba state pool allocation failed").'
        )
        findings.append(DoctorFinding("MAMBA_POOL_ALLOC", "error", cause, fix, changes, evidence=evidence))
    elif wanted is not None and slots < wanted * per_req:
        fix, changes = grow_state_pool(remedy_in)
        cause = (
            f"runtime.max_running_requests = {wanted} needs {wanted * per_req} state slots ({per_req} each) "
            f"but "
            f"the pool holds {slots}: only {p.max_running_requests} requests run at once."
        )
        findings.append(DoctorFinding("MAMBA_POOL_ALLOC", "warning", cause, fix, changes, evidence=evidence))
    return Prediction(findings, plan)


def predict_elastic_builtin(cfg: HybridConfig, plan: Plan | None, engine: str) -> list[DoctorFinding]:
    """ELASTIC_TIMEOUT on the bundled runtime: its elastic pool must grow a small state side at run time.

    The runtime grows the state pool only from KV chunks with no page in use, so while a running request holds
    pages the move waits, and past elastic_realloc_timeout_s it is abandoned (runtime/kvcache/elastic_pool.py).
    A start split with fewer than two requests' worth of slots makes every second request need such a move.
    """
    mem = cfg.config.memory
    if engine != "builtin" or not mem.enable_elastic_memory_pool or plan is None:
        return []
    p = plan.pools
    if p.max_mamba_cache_size >= 2 * p.slots_per_request:
        return []

    fix, changes = elastic_off(RemedyInput(cfg))
    cause = (
        f"The elastic pool starts with {p.max_mamba_cache_size} state slots at {p.slots_per_request} per "
        "request: a second request makes it turn KV chunks into state slots, which it cannot do while a "
        "running request holds pages in them, so the move is abandoned after elastic_realloc_timeout_s = "
        f'{mem.elastic_realloc_timeout_s} s ("Elastic memory pool reallocation timeout") and the request '
        "waits for the first to finish."
    )
    fix += " Or give the state pool room for two requests from the start (memory.max_mamba_cache_size)."
    evidence = (
        f"config.toml: memory.enable_elastic_memory_pool = true, {p.max_mamba_cache_size} state slots "
        f"({p.slots_per_request} per request)"
    )
    return [DoctorFinding("ELASTIC_TIMEOUT", "warning", cause, fix, changes, evidence=evidence)]


def predict_prefix_engine(cfg: HybridConfig, sglang: SglangFacts | None, engine: str) -> list[DoctorFinding]:
    """PREFIX_CACHE_MISS that depends on the engine build rather than on the config alone."""
    out = []
    if engine == "sglang" and sglang is not None and not sglang.has_hybrid_prefix_cache and cfg.prefix_cache_enabled:
        out.append(DoctorFinding(
            "PREFIX_CACHE_MISS", "warning",
            f"sglang {sglang.version} has no radix cache for Mamba state: hybrid models get no prefix hits "
            "whatever the config says.",
            "Upgrade sglang (0.5.23 caches hybrid prefixes), or run the bundled runtime (server.engine = "
            '"builtin").',
            evidence=f"sglang {sglang.version}",
        ))  # fmt: skip
    if not cfg.config.cache.enable_prefix_caching:
        out.append(DoctorFinding(
            "PREFIX_CACHE_MISS", "info",
            "cache.enable_prefix_caching = false: no request reuses another's prefix (chosen in the config).",
            "Set cache.enable_prefix_caching = true in config.toml if requests share prefixes.",
            evidence="config.toml: cache.enable_prefix_caching = false",
        ))  # fmt: skip
    return out


def predict_pd_peer(cfg: HybridConfig, peer: HybridConfig, peer_name: str) -> list[DoctorFinding]:
    """PD_STATE_MISMATCH: prefill and decode must hold the same per-slot state (shape and dtype)."""

    fix, changes = pd_match_peer(RemedyInput(cfg, peer=peer))
    out = []
    if cfg.config.pd.mamba_state_transfer_mode != peer.config.pd.mamba_state_transfer_mode:
        cause = (
            f"This server transfers state {cfg.config.pd.mamba_state_transfer_mode}, {peer_name} "
            f"{peer.config.pd.mamba_state_transfer_mode}: the two sides disagree on when a state is complete."
        )
        mode_fix = 'Set pd.mamba_state_transfer_mode = "atomic" on both.'
        evidence = "pd.mamba_state_transfer_mode"
        out.append(DoctorFinding("PD_STATE_MISMATCH", "error", cause, mode_fix, (), "peer", None, evidence))
    sides: list[ModelShape | None] = []
    for c in (cfg, peer):
        try:
            sides.append(load_model_shape_or_bundled(
                c.config.server.model_path, tp=c.config.server.tp_size, ssm_dtype=c.settings.mamba.state_dtype
            ))  # fmt: skip
        except ModelShapeError:
            sides.append(None)
    mine, theirs = sides
    if mine is not None and theirs is not None:
        a = (mine.conv_state_shape, mine.ssm_state_shape, mine.ssm_dtype, mine.num_linear_layers)
        b = (theirs.conv_state_shape, theirs.ssm_state_shape, theirs.ssm_dtype, theirs.num_linear_layers)
        if a != b:
            evidence = (
                f"this: conv {a[0]} ssm {a[1]} {a[2]} x{a[3]} layers; {peer_name}: conv {b[0]} ssm {b[1]} "
                f"{b[2]} "
                f"x{b[3]} layers"
            )
            cause = (
                f"One state slot is {mine.mamba_state_bytes_per_request} bytes here and "
                f"{theirs.mamba_state_bytes_per_request} on {peer_name}: the decode server would read a "
                f"state "
                'laid out for another shape or dtype (SGLang: "Prefill/Decode Mamba slot size mismatch").'
            )
            out.append(DoctorFinding("PD_STATE_MISMATCH", "error", cause, fix, changes, "peer", evidence=evidence))
        return out
    # No readable model on one side: compare what the configs say.
    keys: list[tuple[str, object, object]] = [
        ("server.model_path", c.config.server.model_path, p.config.server.model_path) for c, p in [(cfg, peer)]
    ]
    keys += [
        ("mamba.state_dtype", cfg.settings.mamba.state_dtype, peer.settings.mamba.state_dtype),
        ("server.tp_size", cfg.config.server.tp_size, peer.config.server.tp_size),
    ]
    for key, here, there in keys:
        if here != there:
            cause = f"{key} is {here!r} here, {there!r} on {peer_name}: state slots differ in shape or dtype."
            out.append(DoctorFinding("PD_STATE_MISMATCH", "error", cause, fix, changes, "peer", evidence=key))
    return out
