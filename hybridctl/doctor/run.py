"""`run_doctor`: probe (or take) the host, load the config, predict, read the log; one DoctorReport.

The CLI only parses arguments, calls this and renders; tests call it with synthetic HostFacts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from hybridctl.config.loader import ConfigError, load_hybrid_config, settings_path_for
from hybridctl.config.locate import KeyLocator
from hybridctl.config.schema import HybridConfig
from hybridctl.doctor.findings import CODES, Check, CheckStatus, DoctorFinding
from hybridctl.doctor.judge import judge_host, resolve_engine
from hybridctl.doctor.live import LiveError, live_findings, read_live
from hybridctl.doctor.log_findings import log_findings
from hybridctl.doctor.log_scan import scan_log, startup_summary
from hybridctl.doctor.planning import PlanContext, load_plan_context
from hybridctl.doctor.predict import (
    predict_elastic_builtin,
    predict_pd_peer,
    predict_prefix_engine,
    predict_state_pool,
    rule_findings,
)
from hybridctl.doctor.remedies import RemedyInput
from hybridctl.doctor.report import DoctorReport, IgnoredOption, failure_mode_checks
from hybridctl.host.facts import HostFacts
from hybridctl.host.probe import probe_host
from hybridctl.planner.plan_request import engine_for_planning
from hybridshared import paths
from hybridshared.units import format_gib, format_mib, with_article


@dataclass
class DoctorOptions:
    config_path: Path = Path("config.toml")
    settings_path: Path = Path("settings.json")
    config_given: bool = False  # named on the command line: a missing file is an error, not a skip
    log_lines: Iterable[str] | None = None
    log_name: str = "log"
    peer_config: Path | None = None
    gpu_mem_bytes: int | None = None  # overrides the probed GPU's memory for planning
    url: str | None = None  # a running server to judge live (doctor --url)
    api_key_env: str | None = None  # the environment variable holding that server's API key


def _load_config(config: Path, settings: Path, what: str) -> tuple[HybridConfig | None, Check]:

    try:
        cfg = load_hybrid_config(config, settings)
    except ConfigError as exc:
        n = len(exc.findings)
        details = tuple(str(f) for f in exc.findings)
        # The files that hold the errors (settings.json's own, or both), not always config.toml.
        where = " + ".join(dict.fromkeys(f.file for f in exc.findings)) or str(config)
        return None, Check(what, "error", f"{where}: {n} error{'s' if n != 1 else ''}; run hybridctl validate", details)
    return cfg, Check(what, "ok", f"{config} + {settings}")


def key_lines(config: Path, settings: Path) -> Callable[[str, str], int | None]:
    """(logical file, dotted key) -> the key's line in the real file (or its nearest table), or None."""

    locators = {}
    files = (("config.toml", config, KeyLocator.for_toml), ("settings.json", settings, KeyLocator.for_json))
    for name, path, build in files:
        try:
            locators[name] = build(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue

    def line(file: str, key: str) -> int | None:
        pos = locators[file].find(key.split(".")) if file in locators and key else None
        return pos[0] if pos else None

    return line


def _place_config_findings(findings: list[DoctorFinding], line: Callable[[str, str], int | None]) -> None:
    """Config findings point at the line of the key they change (what an editor jumps to)."""
    for i, f in enumerate(findings):
        if f.source == "config" and f.line is None and f.changes:
            findings[i] = replace(f, line=line(f.changes[0].file, f.changes[0].key))


def unprobed_host() -> HostFacts:
    """Host facts for --no-host: every probe reported as skipped (diagnosing a log copied from elsewhere)."""
    return HostFacts(skipped={step: "not probed (--no-host)" for step in ("nvml", "torch", "sglang", "c_compiler")})


def run_doctor(opts: DoctorOptions, host: HostFacts | None = None) -> DoctorReport:
    if host is None:
        host = probe_host()
    report = DoctorReport()
    cfg: HybridConfig | None = None
    if opts.config_given or opts.config_path.exists():
        cfg, check = _load_config(opts.config_path, opts.settings_path, "Config")
        report.checks.append(check)
        no_config = f"{opts.config_path} did not load (see Config)"
    else:
        no_config = f"no config.toml found at {paths.resolve(opts.config_path)}"
        report.checks.append(Check("Config", "skipped", f"skipped: {no_config}; pass --config to predict from one"))
    host_checks, host_findings = judge_host(host, cfg)
    report.checks[0:0] = host_checks
    report.findings += host_findings
    ctx: PlanContext | None = None
    peer: HybridConfig | None = None
    # What could judge each failure mode, and why the config could not where it could not.
    judged_by: dict[str, list[str]] = {code: [] for code in CODES}
    config_gap: dict[str, str] = dict.fromkeys(CODES, "no config (see Config)") if cfg is None else {}
    if cfg is not None:
        ctx, peer, pools_gap = _predict(cfg, host, opts, report)
        _config_check_reflects_its_rules(report)
        _place_config_findings(report.findings, key_lines(opts.config_path, opts.settings_path))
        for code in CODES:
            if code == "MAMBA_POOL_ALLOC" and pools_gap is not None:
                config_gap[code] = "the pools were not sized (see Model)"
            else:
                judged_by[code].append("the config")
    _report_unused_options(opts, cfg, ctx, no_config, report)
    if opts.log_lines is not None:
        _read_log(opts, cfg, ctx, report, peer)
        for code in CODES:
            judged_by[code].append("the log")
    if opts.url is not None and _read_live(opts.url, report, opts.api_key_env):
        for code in CODES:
            judged_by[code].append("the server")
    for sources in judged_by.values():
        if "the config" in sources and (host.gpus or host.sglang is not None):
            sources.append("the host")  # its GPUs and sglang feed the config's predictions
    not_judged = {
        code: (f"not from the config: {gap}" if judged_by[code] else f"{gap}; no log or server was read either")
        for code, gap in config_gap.items()
    }
    report.checks += failure_mode_checks(report.findings, judged_by, not_judged)
    return report


def _config_check_reflects_its_rules(report: DoctorReport) -> None:
    """The files loaded, but validate's rules found errors or warnings in them (an empty model_path, ...): the
    Config line says so instead of a ✓ above the findings that contradict it."""
    rules = [f for f in report.findings if f.source == "config" and f.code not in CODES]
    worst: CheckStatus | None = next((s for s in ("error", "warning") if any(f.severity == s for f in rules)), None)
    if worst is None:
        return
    for i, check in enumerate(report.checks):
        if check.name == "Config" and check.status == "ok":
            codes = ", ".join(dict.fromkeys(f.code for f in rules if f.severity in ("error", "warning")))
            report.checks[i] = replace(check, status=worst, summary=f"{check.summary}: {codes} (see below)")


def _report_unused_options(
    opts: DoctorOptions, cfg: HybridConfig | None, ctx: PlanContext | None, no_config: str, report: DoctorReport
) -> None:
    """Options that need a config (or a sized model) this run does not have: said, not silently dropped."""
    if opts.gpu_mem_bytes is not None and ctx is None:
        why = no_config if cfg is None else "the pools were not sized (see Model)"
        report.ignored.append(IgnoredOption("--gpu-mem-gib", f"{why}; it sizes a config's pools"))
    if opts.api_key_env is not None and opts.url is None:
        report.ignored.append(IgnoredOption("--api-key-env", "no --url: it is the key of the server --url reads"))
    if opts.peer_config is not None and cfg is None:
        report.ignored.append(IgnoredOption("--peer", f"{no_config}; the peer's config is compared with this server's"))


def _predict(
    cfg: HybridConfig, host: HostFacts, opts: DoctorOptions, report: DoctorReport
) -> tuple[PlanContext | None, HybridConfig | None, str | None]:
    """The config's findings; returns the planning context, the PD peer's config (for the log's fixes) and why
    the pools could not be sized (None: they were, or the planner's refusal is a finding)."""

    # As plan: auto with --gpu-mem-gib on a GPU-less host means "the SGLang server I am planning".
    gpu_given = opts.gpu_mem_bytes is not None and not host.gpus
    engine = engine_for_planning(cfg.config.server.engine, resolve_engine(host, cfg), gpu_given)
    version = host.sglang.version if engine == "sglang" and host.sglang else None
    report.findings += rule_findings(cfg, version, engine)
    # The bundled runtime sizes from the memory free before its weights load (hybridctl/host/nvml.py gpu_free_bytes).
    detected = (host.gpus[0].free_bytes if engine == "builtin" else host.gpus[0].total_bytes) if host.gpus else None
    gpu = opts.gpu_mem_bytes or detected
    ctx, why = load_plan_context(cfg, engine, gpu)
    if ctx is None:
        report.checks.append(Check("Model", "skipped", f"skipped: {why}"))
    else:
        s = ctx.spec
        report.checks.append(Check(
            "Model", "ok",
            f"{s.family} ({s.architecture}), TP {s.tp}: {format_mib(s.mamba_state_bytes_per_request)} "
            f"of state per request and {s.kv_bytes_per_token} B of KV per token, per GPU"
            + (f" ({s.kv_bytes_per_token * s.tp} B in total)" if s.tp > 1 else "")
            + f" ({engine}: {s.kv_dtype} KV)"
            + ("; from hybridctl's bundled config.json, the model is not on this host" if s.stand_in_for else ""),
            (f"{s.num_attn_layers} full-attention + {s.num_linear_layers} {s.linear_kind} layers",
             f"SSM state {s.ssm_dtype} {s.ssm_state_shape}, conv {s.conv_state_shape}",
             *filter(None, [s.stand_in_note()])),
        ))  # fmt: skip
        prediction = predict_state_pool(cfg, ctx)
        report.findings += prediction.findings
        report.findings += predict_elastic_builtin(cfg, prediction.plan, engine)
        if prediction.plan is not None:
            p = prediction.plan.pools
            if ctx.gpu_mem_bytes:
                memory = with_article(f"{format_gib(ctx.gpu_mem_bytes, trim=True)} GPU")
            else:
                memory = "the bundled runtime on CPU (memory.memory_budget_gib, default 4 GiB)"
            report.checks.append(Check(
                "Pools", "ok",
                f"{engine}: {p.max_mamba_cache_size} state slots ({p.slots_per_request} per request), "
                f"{p.max_total_num_tokens} KV tokens, {p.max_running_requests} requests at once",
                (f"planned for {memory}, strategy {prediction.plan.strategy}", prediction.plan.verdict),
            ))  # fmt: skip
        else:
            report.checks.append(Check("Pools", "error", f"{engine}: {prediction.plan_error}"))
    report.findings += predict_prefix_engine(cfg, host.sglang, engine)
    peer = None
    if opts.peer_config is not None:
        peer, check = _load_config(opts.peer_config, settings_path_for(opts.peer_config), "PD peer")
        report.checks.append(check)
        if peer is not None:
            report.findings += predict_pd_peer(cfg, peer, str(opts.peer_config))
    return ctx, peer, why if ctx is None else None


def _read_log(
    opts: DoctorOptions,
    cfg: HybridConfig | None,
    ctx: PlanContext | None,
    report: DoctorReport,
    peer: HybridConfig | None = None,
) -> None:

    assert opts.log_lines is not None
    scan = scan_log(opts.log_lines)
    found: list[DoctorFinding] = log_findings(scan, RemedyInput(cfg, ctx, peer))
    report.findings += found
    report.startup = startup_summary(scan.startup)
    st = report.startup
    numbers = ", ".join(f"{k} {v}" for k, v in st.items() if v is not None) or "no start-up pool lines"
    worst: CheckStatus = "error" if any(f.severity == "error" for f in found) else (
        "warning" if any(f.severity == "warning" for f in found) else "ok"
    )  # fmt: skip
    details = tuple(dict.fromkeys(scan.startup.pool_lines))  # every rank logs the same pools
    n = len(found)
    summary = f"{opts.log_name}: {scan.lines} lines, {n} finding{'s' if n != 1 else ''}; {numbers}"
    report.checks.append(Check("Log", worst, summary, details))


def _read_live(url: str, report: DoctorReport, api_key_env: str | None) -> bool:
    """The server's findings and check line; False when it could not be read."""

    try:
        snap = read_live(url, api_key_env=api_key_env)
    except LiveError as exc:
        report.checks.append(Check("Server", "error", f"{url}: {exc}"))
        return False
    found = live_findings(snap)
    report.findings += found
    metrics = "with /metrics" if snap.metrics is not None else "no /metrics (SGLang: --enable-metrics)"
    probe = f"probe cached_tokens {snap.probe_cached}" if snap.probe_cached else (snap.probe_error or "no probe")
    n = len(found)
    summary = f"{snap.url}: {n} finding{'s' if n != 1 else ''}; {metrics}; {probe}"
    # "ok": the server was read; what it showed is counted once, through the findings.
    report.checks.append(Check("Server", "ok", summary))
    return True
