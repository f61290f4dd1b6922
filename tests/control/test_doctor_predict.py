"""Predictions from bad configs, one or more per failure code; every machine fix is re-checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridctl.config.schema import HybridConfig
from hybridctl.doctor.planning import PlanContext, load_plan_context
from hybridctl.doctor.predict import (
    predict_pd_peer,
    predict_prefix_engine,
    predict_state_pool,
    rule_findings,
)
from hybridctl.doctor.run import DoctorOptions, run_doctor
from hybridctl.host.facts import GpuFacts, HostFacts, SglangFacts, TorchBuild

REPO = Path(__file__).resolve().parents[2]
QWEN3_NEXT = REPO / "templates" / "models" / "qwen3-next-80b-a3b.json"
GIB = 1 << 30


def h100_host(n: int = 4, driver: str = "550.54.15") -> HostFacts:
    gpus = tuple(GpuFacts(i, "NVIDIA H100 80GB HBM3", (9, 0), 80 * GIB, 79 * GIB, True) for i in range(n))
    sglang = SglangFacts("0.5.23", True, False, True, True)
    return HostFacts(driver, (12, 4), gpus, TorchBuild("2.13.0+cu124", "12.4"), sglang)


def cfg_for(model: Path = QWEN3_NEXT, engine: str = "sglang", tp: int = 4, **memory: object) -> HybridConfig:
    cfg = HybridConfig()
    cfg.config.server.model_path = str(model)
    cfg.config.server.engine = engine  # type: ignore[assignment]
    cfg.config.server.tp_size = tp
    for key, value in memory.items():
        setattr(cfg.config.memory, key, value)
    return cfg


def ctx_for(cfg: HybridConfig, gpu: int = 80 * GIB) -> PlanContext:
    ctx, why = load_plan_context(cfg, cfg.config.server.engine, gpu)
    assert ctx is not None, why
    return ctx


def apply(cfg: HybridConfig, changes) -> HybridConfig:
    data = cfg.model_dump()
    for c in changes:
        node = data["config" if c.file == "config.toml" else "settings"]
        *path, name = c.key.split(".")
        for part in path:
            node = node[part]
        node[name] = c.value
    return HybridConfig.model_validate(data)


def codes(findings) -> list[tuple[str, str]]:
    return sorted((f.code, f.severity) for f in findings)


@pytest.fixture()
def tiny_model(tmp_path: Path) -> Path:
    """A small Qwen3-Next config.json (weights estimated from it): what the bundled runtime plans on CPU."""
    cfg = json.loads(QWEN3_NEXT.read_text())
    cfg.update(hidden_size=128, num_hidden_layers=8, num_experts=8, num_experts_per_tok=2, vocab_size=4096,
               intermediate_size=256, moe_intermediate_size=64, shared_expert_intermediate_size=64,
               max_position_embeddings=4096)  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


# --- MAMBA_POOL_ALLOC --------------------------------------------------------------------------------------


def test_pool_that_cannot_hold_one_request_is_an_error_with_a_planner_fix() -> None:
    cfg = cfg_for(max_mamba_cache_size=4)
    cfg.settings.runtime.max_running_requests = 8
    ctx = ctx_for(cfg)
    prediction = predict_state_pool(cfg, ctx)
    (f,) = prediction.findings
    assert (f.code, f.severity) == ("MAMBA_POOL_ALLOC", "error") and prediction.plan is None
    assert f.changes and f.changes[0].key == "memory.max_mamba_cache_size"
    fixed = apply(cfg, f.changes)
    plan = ctx.plan(fixed)
    assert plan.pools.max_running_requests >= 8
    assert predict_state_pool(fixed, ctx).findings == []


def test_one_request_worth_of_slots_is_an_error() -> None:
    cfg = cfg_for(max_mamba_cache_size=6)  # 5 slots per request with extra_buffer + overlap: one request
    (f,) = predict_state_pool(cfg, ctx_for(cfg)).findings
    assert (f.code, f.severity) == ("MAMBA_POOL_ALLOC", "error") and "fewer than two" in f.cause
    assert predict_state_pool(apply(cfg, f.changes), ctx_for(cfg)).findings == []


def test_fewer_slots_than_max_running_requests_is_a_warning_and_ratio_is_raised() -> None:
    cfg = cfg_for(mamba_full_memory_ratio=0.05)
    cfg.settings.runtime.max_running_requests = 64
    ctx = ctx_for(cfg)
    (f,) = predict_state_pool(cfg, ctx).findings
    assert (f.code, f.severity) == ("MAMBA_POOL_ALLOC", "warning")
    (change,) = f.changes
    assert change.key == "memory.mamba_full_memory_ratio" and change.value > 0.05
    assert ctx.plan(apply(cfg, f.changes)).pools.max_running_requests >= 64


def test_default_config_on_enough_gpus_predicts_nothing() -> None:
    cfg = cfg_for()
    prediction = predict_state_pool(cfg, ctx_for(cfg))
    assert prediction.findings == [] and prediction.plan is not None


def test_bundled_runtime_is_planned_in_its_memory_budget(tiny_model: Path) -> None:
    cfg = cfg_for(tiny_model, engine="builtin", tp=1, max_mamba_cache_size=1, memory_budget_gib=1.0)
    ctx = ctx_for(cfg, gpu=0)
    prediction = predict_state_pool(cfg, ctx)
    (f,) = prediction.findings
    assert f.severity == "error" and "too small to serve any request" in f.cause
    assert ctx.plan(apply(cfg, f.changes)).pools.max_running_requests >= 2
    assert ctx.plan(cfg_for(tiny_model, engine="builtin", tp=1)).strategy == "extra_buffer"


def test_planning_is_skipped_with_a_reason() -> None:
    assert load_plan_context(HybridConfig(), "sglang", 80 * GIB) == (
        None, "server.model_path is empty in config.toml: no model to plan for",
    )  # fmt: skip
    ctx, why = load_plan_context(cfg_for(), "sglang", None)
    assert ctx is None and "--gpu-mem-gib" in why
    ctx, why = load_plan_context(cfg_for(Path("/nonexistent/model")), "sglang", 80 * GIB)
    assert ctx is None and "/nonexistent/model" in why


# --- PREFIX_CACHE_MISS --------------------------------------------------------------------------------------


def test_snapshot_off_and_radix_disabled_reuse_the_config_rules() -> None:
    cfg = cfg_for()
    cfg.settings.mamba.state_snapshot_on_match = False
    cfg.settings.runtime.disable_radix_cache = True
    found = rule_findings(cfg, None)
    assert ("PREFIX_CACHE_MISS", "warning") in codes(found)
    keys = {c.key for f in found for c in f.changes}
    assert "runtime.disable_radix_cache" in keys


def test_page_size_with_no_buffer_is_an_error_with_a_machine_fix() -> None:
    cfg = cfg_for()
    cfg.config.cache.radix_cache_page_size = 16
    cfg.config.cache.mamba_radix_cache_strategy = "no_buffer"
    (f,) = [f for f in rule_findings(cfg, None) if f.code == "PREFIX_CACHE_MISS"]
    assert f.severity == "error" and f.changes[0].file == "config.toml"
    assert f.changes[0].key == "cache.mamba_radix_cache_strategy" and f.changes[0].value == "extra_buffer"


def test_sglang_without_hybrid_prefix_cache_and_caching_off() -> None:
    old = SglangFacts("0.4.10", False, False, False, False)
    assert codes(predict_prefix_engine(cfg_for(), old, "sglang")) == [("PREFIX_CACHE_MISS", "warning")]
    assert predict_prefix_engine(cfg_for(), old, "builtin") == []
    off = cfg_for()
    off.config.cache.enable_prefix_caching = False
    assert codes(predict_prefix_engine(off, None, "builtin")) == [("PREFIX_CACHE_MISS", "info")]


# --- SPEC_ROLLBACK ----------------------------------------------------------------------------------------


def test_spec_with_sandbox_off_and_short_track_interval() -> None:
    cfg = cfg_for()
    spec = cfg.config.speculative
    spec.speculative_algorithm = "EAGLE"
    spec.enable_mamba_state_sandbox = False
    cfg.config.cache.mamba_radix_cache_strategy = "extra_buffer"
    cfg.config.cache.mamba_track_interval = 2
    found = [f for f in rule_findings(cfg, None) if f.code == "SPEC_ROLLBACK"]
    assert {f.severity for f in found} == {"error"} and len(found) == 2
    fixed = apply(cfg, [c for f in found for c in f.changes])
    assert fixed.config.speculative.enable_mamba_state_sandbox
    assert fixed.config.cache.mamba_track_interval >= spec.speculative_num_draft_tokens
    assert [f for f in rule_findings(fixed, None) if f.code == "SPEC_ROLLBACK"] == []


def test_draft_tree_cannot_be_rolled_back() -> None:
    cfg = cfg_for()
    cfg.config.speculative.speculative_algorithm = "EAGLE"
    cfg.config.speculative.speculative_topk = 4
    cfg.config.speculative.speculative_num_draft_tokens = 8
    (f,) = [f for f in rule_findings(cfg, None, "sglang") if f.changes and f.changes[0].key.endswith("topk")]
    assert (f.code, f.severity) == ("SPEC_ROLLBACK", "error")
    fixed = apply(cfg, f.changes)
    topk = [f for f in rule_findings(fixed, None, "sglang") if "speculative_topk" in f.cause]
    assert fixed.config.speculative.speculative_topk == 1 and topk == []
    assert (
        fixed.config.speculative.speculative_num_draft_tokens
        == fixed.config.speculative.speculative_num_steps + 1
    )


# --- ELASTIC_TIMEOUT (config + host, end to end through run_doctor) ------------------------------


def write_config(directory: Path, toml: str, settings: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.toml").write_text(toml, encoding="utf-8")
    if settings is not None:
        (directory / "settings.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    return directory / "config.toml"


def test_elastic_pool_on_an_old_driver(tmp_path: Path) -> None:
    toml = f'[server]\nmodel_path = "{QWEN3_NEXT}"\nengine = "sglang"\ntp_size = 4\n'
    toml += "[memory]\nenable_elastic_memory_pool = true\n"
    path = write_config(tmp_path, toml)
    report = run_doctor(DoctorOptions(path, tmp_path / "settings.json", True), h100_host(driver="525.147.05"))
    elastic = [f for f in report.findings if f.code == "ELASTIC_TIMEOUT"]
    assert [(f.severity, f.source) for f in elastic] == [("error", "host")]
    assert report.exit_code() == 2
    healthy = run_doctor(DoctorOptions(path, tmp_path / "settings.json", True), h100_host())
    assert [f for f in healthy.findings if f.code == "ELASTIC_TIMEOUT"] == []


# --- PD_STATE_MISMATCH ------------------------------------------------------------------------------------


def test_layerwise_transfer_is_predicted() -> None:
    cfg = cfg_for()
    cfg.config.pd.enable_pd_disaggregation = True
    cfg.config.pd.mamba_state_transfer_mode = "layerwise"
    (f,) = [f for f in rule_findings(cfg, None) if f.code == "PD_STATE_MISMATCH"]
    assert f.severity == "error" and f.changes[0].value == "atomic"


def test_peer_with_another_state_dtype_or_tp() -> None:
    prefill, decode = cfg_for(), cfg_for()
    decode.settings.mamba.state_dtype = "bfloat16"
    (f,) = predict_pd_peer(prefill, decode, "decode/config.toml")
    assert (f.code, f.severity, f.source) == ("PD_STATE_MISMATCH", "error", "peer")
    assert "float32" in f.evidence and "bfloat16" in f.evidence
    assert [(c.key, c.value) for c in f.changes] == [("mamba.state_dtype", "bfloat16")]
    assert predict_pd_peer(apply(prefill, f.changes), decode, "decode/config.toml") == []
    other_tp = cfg_for(tp=2)
    (g,) = predict_pd_peer(prefill, other_tp, "decode/config.toml")
    assert ("server.tp_size", 2) in [(c.key, c.value) for c in g.changes]
    assert predict_pd_peer(prefill, cfg_for(), "decode/config.toml") == []


def test_peer_given_on_the_command_line(tmp_path: Path) -> None:
    base = f'[server]\nmodel_path = "{QWEN3_NEXT}"\nengine = "sglang"\ntp_size = 4\n'
    base += "[pd]\nenable_pd_disaggregation = true\n"
    mine = write_config(tmp_path / "prefill", base)
    peer = write_config(tmp_path / "decode", base, {"mamba": {"state_dtype": "float16"}})
    opts = DoctorOptions(mine, mine.parent / "settings.json", True, peer_config=peer)
    report = run_doctor(opts, h100_host())
    assert [f.code for f in report.findings if f.source == "peer"] == ["PD_STATE_MISMATCH"]
    out = report.to_dict()
    assert set(out) >= {"checks", "findings", "startup"}
    assert set(out["findings"][0]) >= {"code", "severity", "line", "evidence", "cause", "fix"}


def test_renamed_engine_flag_in_extra_args_gets_a_removal() -> None:
    cfg = cfg_for()
    cfg.config.extra_engine_args["mamba-scheduler-strategy"] = "extra_buffer"
    (f,) = [f for f in rule_findings(cfg, "0.5.23") if f.code == "UNKNOWN_ENGINE_FLAG"]
    assert [(c.key, c.value) for c in f.changes] == [("extra_engine_args.mamba-scheduler-strategy", None)]


def test_bfloat16_state_is_proposed_when_only_halving_the_state_fits(tiny_model: Path) -> None:
    # A fixed ratio budget that holds 2 requests' slots only at half the state size.
    cfg = cfg_for(tiny_model, engine="builtin", tp=1, memory_budget_gib=0.25, mamba_full_memory_ratio=10.0,
                  mem_fraction_static=0.95)  # fmt: skip
    ctx = ctx_for(cfg, gpu=0)
    cfg.settings.runtime.max_running_requests = ctx.plan(cfg).pools.max_running_requests + 1
    (f,) = predict_state_pool(cfg, ctx).findings
    assert [(c.key, c.value) for c in f.changes] == [("mamba.state_dtype", "bfloat16")]
    fixed = apply(cfg, f.changes)
    assert ctx.plan(fixed).pools.max_running_requests >= cfg.settings.runtime.max_running_requests
