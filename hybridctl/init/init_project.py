"""`hybridctl init` as a library call: choose values (planner when a model is given), render, check, write.

`apply_recommendation` sets the planner's Recommendation on a HybridConfig and says why each value was chosen.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from pydantic import ValidationError

from hybridctl.config.atomic_write import WouldOverwriteError, write_files
from hybridctl.config.findings import Finding
from hybridctl.config.loader import ConfigError, load_hybrid_config, parse_config_text, parse_settings_text
from hybridctl.config.render import render_config_toml, render_settings_json
from hybridctl.config.schema import SCHEMA_FILE_NAMES, ConfigToml, EngineName, HybridConfig, SettingsJson, json_schema
from hybridctl.doctor.planning import PlanContext
from hybridctl.doctor.predict import predict_state_pool
from hybridctl.host.nvml import gpu_free_bytes, gpu_memory_bytes  # None without a GPU, a driver or NVML
from hybridctl.host.ports import preferred_or_free_port
from hybridctl.init.init_checks import (
    EngineDecision,
    InitError,
    choose_model,
    decide_engine_for_init,
    refuse_remote_model_on_builtin,
    validate_as_written,
)
from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridctl.planner.builtin_sizing import builtin_device_bytes, builtin_model_shape, plan_builtin
from hybridctl.planner.plan import make_plan
from hybridctl.planner.recommend import recommend
from hybridshared import paths
from hybridshared.units import GIB

if TYPE_CHECKING:  # the planner imports config/ at load time; init imports the planner only when it runs
    from hybridctl.planner.recommend import Recommendation
    from hybridshared.model.shape import ModelShape

CONFIG_FILE = "config.toml"
SETTINGS_FILE = "settings.json"
DEMO_MODEL_DIR = "demo-model"


@dataclass
class InitOptions:
    out_dir: Path = Path(".")
    model: str | None = None  # config.json file, model directory, or a bundled checkpoint's hub id / server path
    gpu_mem_gib: float | None = None  # None: detect with NVML
    tp: int = 1
    context_len: int | None = None
    concurrency: int | None = None
    engine: str = "auto"
    force: bool = False
    demo: bool = False


@dataclass
class InitResult:
    out_dir: str
    files: list[str]
    config: HybridConfig
    notes: dict[str, str] = field(default_factory=dict)  # dotted key -> why init chose its value
    plan: dict[str, Any] | None = None
    plan_skipped: str | None = None  # why there is no plan
    demo_model: str | None = None
    findings: list[Finding] = field(default_factory=list)  # rule warnings about the chosen values
    reused: bool = False  # --demo without --force found its own earlier demo there and kept it

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": self.out_dir,
            "files": self.files,
            "config": self.config.config.model_dump(mode="json"),
            "settings": self.config.settings.model_dump(mode="json"),
            "notes": self.notes,
            "plan": self.plan,
            "plan_skipped": self.plan_skipped,
            "demo_model": self.demo_model,
            "findings": [f.to_dict() for f in self.findings],
            "reused": self.reused,
        }


def target_files(out_dir: Path) -> list[Path]:
    return [
        out_dir / CONFIG_FILE,
        out_dir / SETTINGS_FILE,
        *(out_dir / n for n in SCHEMA_FILE_NAMES.values()),
    ]


def build_demo_model(out_dir: Path, *, force: bool = False) -> Path:
    """Run `python -m runtime.demo_model --out DIR` in a subprocess: the control plane never imports torch."""
    runtime_spec = importlib.util.find_spec("runtime")
    has_module = runtime_spec is not None and any(
        (Path(loc) / "demo_model.py").is_file() or (Path(loc) / "demo_model").is_dir()
        for loc in (runtime_spec.submodule_search_locations or [])
    )
    if importlib.util.find_spec("torch") is None or not has_module:
        raise InitError(
            "--demo builds a small model with the bundled runtime, which needs torch and the runtime extra: "
            'pip install torch==2.13.0 && pip install -e ".[runtime]" (or pip install "hybridctl[runtime]").'
        )
    target = out_dir / DEMO_MODEL_DIR
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.demo_model", "--out", str(target), *(["--force"] if force else [])],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not (target / "config.json").is_file():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise InitError(f"building the demo model in {target} failed (exit {proc.returncode}):\n{tail}")
    return target


def _detect_gpu_mem_bytes(builtin: bool) -> int | None:
    """GPU 0's memory as the engine sizes from it: the bundled runtime its free memory, SGLang plans by its total
    (hybridctl/host/nvml.py). None without a GPU, a driver or NVML."""
    return gpu_free_bytes() if builtin else gpu_memory_bytes()


CONTEXT_LENGTH_FLAG = "context-length"  # SGLang's --context-length; the bundled runtime takes it too


def _save_workload(cfg: HybridConfig, opts: InitOptions, result: InitResult) -> None:
    """What init was told about the workload goes into the files whether or not a GPU can be planned for:
    --concurrency as runtime.max_running_requests (the planner may lower it), --context-len as the engine's
    --context-length."""
    if opts.context_len is not None:
        cfg.config.extra_engine_args[CONTEXT_LENGTH_FLAG] = opts.context_len
        result.notes["extra_engine_args.context-length"] = f"--context-len {opts.context_len}: the longest request"
    if opts.concurrency is not None:
        cfg.settings.runtime.max_running_requests = opts.concurrency
        result.notes["runtime.max_running_requests"] = f"--concurrency {opts.concurrency}"


def _choose_values(cfg: HybridConfig, opts: InitOptions, result: InitResult, model_dir: Path, engine: str) -> None:
    """Apply the planner's recommendation to `cfg` and record the plan, or say why there is none."""

    builtin = engine == "builtin"  # what serves it: auto resolved as validate and launch resolve it here
    gpu_mem: int | None = int(opts.gpu_mem_gib * GIB) if opts.gpu_mem_gib is not None else None
    if gpu_mem is None:
        gpu_mem = _detect_gpu_mem_bytes(builtin)  # the bundled runtime, too, runs on the GPU when there is one
    try:
        _save_workload(cfg, opts, result)
        if builtin:
            # The bundled runtime's own sizing: on the GPU when there is one, else in its CPU memory budget.
            spec = builtin_model_shape(cfg, model_dir, tp=opts.tp, on_gpu=gpu_mem is not None)
            budget: int | None = builtin_device_bytes(cfg, gpu_mem)
        else:
            spec = load_model_shape_or_bundled(model_dir, tp=opts.tp)
            budget = gpu_mem
        if budget is None:
            result.plan_skipped = (
                "no GPU detected and no --gpu-mem-gib given: pools not sized (pass --gpu-mem-gib, one GPU's "
                "memory, to size them for the GPU server)"
            )
            return
        concurrency = opts.concurrency
        while True:  # at most twice: the second round has a concurrency, so it ends or raises
            rec = recommend(
                spec,
                gpu_mem_bytes=budget,
                tp=opts.tp,
                context_len=opts.context_len,
                concurrency=concurrency,
                engine=engine,  # builtin: no GPU reserve or overlap schedule (planner)
            )
            result.notes.update(apply_recommendation(cfg, rec))
            if builtin:
                # What is printed is what is written and what the runtime will size at start-up: one function.
                _, plan = plan_builtin(cfg, str(model_dir), gpu_mem_bytes=gpu_mem, tp=opts.tp)
            else:
                plan = make_plan(cfg, spec, gpu_mem_bytes=gpu_mem)
            refusal = _doctor_state_pool_error(cfg, spec, engine, gpu_mem)
            if refusal is None:
                break
            if concurrency is not None:
                raise InitError(
                    f"`hybridctl doctor` would report MAMBA_POOL_ALLOC: {refusal} Give each GPU more memory "
                    "(a larger --tp, or a GPU with more --gpu-mem-gib) or a shorter --context-len."
                )
            # SGLang's default split holds one request at a time here, which doctor calls a failure: size for two.
            concurrency = 2
        if concurrency != opts.concurrency:
            result.notes["runtime.max_running_requests"] = (
                "the default split holds one request at a time (doctor: MAMBA_POOL_ALLOC): sized for 2"
            )
        result.plan = plan.to_dict()
    except ValueError as exc:  # ModelShapeError, PoolSizingError: their messages name the file/key and the fix
        raise InitError(str(exc)) from None


def _doctor_state_pool_error(cfg: HybridConfig, spec: ModelShape, engine: str, gpu_mem: int | None) -> str | None:
    """Doctor's MAMBA_POOL_ALLOC judgment of the pools just planned (its one rule, not a copy), as an error's cause."""

    prediction = predict_state_pool(cfg, PlanContext(spec, engine, gpu_mem or 0))
    return next((f.cause for f in prediction.findings if f.severity == "error"), None)


def _earlier_demo(out_dir: Path) -> InitResult | None:
    """The demo an earlier `init --demo` wrote into `out_dir` (its config serves out_dir/demo-model), or None."""

    model = (out_dir / DEMO_MODEL_DIR).resolve()
    try:
        cfg = load_hybrid_config(out_dir / CONFIG_FILE, out_dir / SETTINGS_FILE)
    except ConfigError:
        return None
    if Path(cfg.config.server.model_path).resolve() != model or not (model / "config.json").is_file():
        return None
    note = "kept: an earlier init --demo wrote these files and the model (--force rebuilds them)"
    return InitResult(str(out_dir), [], cfg, notes={"files": note}, demo_model=str(model), reused=True)


def _check_round_trip(cfg: HybridConfig, config_data: object, settings_data: object) -> None:
    """What init writes must load back to exactly what it chose; anything else is a bug in the renderer."""

    try:
        loaded = HybridConfig(
            config=ConfigToml.model_validate(config_data, strict=True),
            settings=SettingsJson.model_validate(settings_data, strict=True),
        )
    except ValidationError as exc:
        raise InitError(f"internal error: init rendered files that do not validate: {exc}") from None
    if loaded != cfg:
        raise InitError("internal error: the rendered files do not load back to the chosen values.")


def init_project(opts: InitOptions) -> InitResult:
    """Write config.toml, settings.json and their JSON Schemas into `opts.out_dir`; returns what it wrote."""

    out_dir = opts.out_dir
    if paths.exists(out_dir) and not paths.is_dir(out_dir):  # checked before the slow demo build, like the files below
        raise InitError(f"{out_dir} is a file, not a directory; pass a directory (new or existing) as --out.")
    targets = target_files(out_dir)
    existing = [p for p in targets if paths.exists(p)]
    if existing and not opts.force:
        if opts.demo and (earlier := _earlier_demo(out_dir)) is not None:
            return earlier  # the README's first command, run twice: keep what the first run built
        raise WouldOverwriteError(existing)  # before the slow demo build, not after it
    if opts.engine not in get_args(EngineName):
        raise InitError(f"--engine {opts.engine}: expected {', '.join(get_args(EngineName))}.")
    cfg = HybridConfig()
    cfg.config.server.tp_size = opts.tp
    result = InitResult(out_dir=str(out_dir), files=[], config=cfg)
    decision = (
        EngineDecision("builtin", "builtin", "builtin", "--demo")
        if opts.demo
        else decide_engine_for_init(opts.engine, tp=opts.tp, gpu_mem_gib=opts.gpu_mem_gib)
    )
    cfg.config.server.engine = decision.written  # type: ignore[assignment]
    if decision.note:
        result.notes["server.engine"] = decision.note
    if opts.gpu_mem_gib is not None:  # plan and doctor read it back on a host without that GPU
        cfg.config.memory.gpu_mem_gib = opts.gpu_mem_gib
        result.notes["memory.gpu_mem_gib"] = f"--gpu-mem-gib {opts.gpu_mem_gib:g}: one GPU of the server"
    model = opts.model
    if opts.demo:
        result.demo_model = str(build_demo_model(out_dir, force=opts.force).resolve())
        model = result.demo_model
        result.notes["server.engine"] = "--demo serves the demo model with the bundled runtime"

        cfg.config.server.port = preferred_or_free_port(cfg.config.server.port)
        if cfg.config.server.port != 30000:
            result.notes["server.port"] = "30000 is in use here; a free port instead"
    if model:
        chosen = choose_model(model)
        refuse_remote_model_on_builtin(chosen, decision)
        cfg.config.server.model_path = chosen.model_path
        if chosen.note:
            result.notes["server.model_path"] = chosen.note
        try:
            _choose_values(cfg, opts, result, chosen.source, decision.resolved)
        except InitError as exc:
            raise InitError(f"{exc}{decision.hint()}") from None
    else:
        result.plan_skipped = "no --model given: values are schema defaults"

    config_text = render_config_toml(cfg.config, notes=result.notes)
    settings_text = render_settings_json(cfg.settings)
    _check_round_trip(cfg, parse_config_text(config_text).data, parse_settings_text(settings_text).data)
    # One truth with `hybridctl validate`: its own check of these very files; an error there writes nothing.
    findings = validate_as_written(config_text, settings_text, out_dir, auto_engine=decision.here, template=not model)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise InitError(
            "`hybridctl validate` would reject these choices:\n" + "\n".join(f"  {f}" for f in errors) + decision.hint()
        )
    result.findings = [f for f in findings if f.severity == "warning"]

    files = {
        out_dir / CONFIG_FILE: config_text,
        out_dir / SETTINGS_FILE: settings_text,
        **{
            out_dir / name: json.dumps(json_schema(which), indent=2) + "\n" for which, name in SCHEMA_FILE_NAMES.items()
        },
    }
    result.files = [str(p) for p in write_files(files, force=opts.force)]
    return result


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


def apply_recommendation(cfg: HybridConfig, rec: Recommendation) -> dict[str, str]:
    """Set every recommended value on `cfg` (validated by the schema); returns dotted key -> reason."""
    values, reasons = rec.values, rec.reasons
    notes: dict[str, str] = {}
    for name, value in values.items():
        target = RECOMMENDATION_KEYS.get(name)
        if target is None or value is None:
            continue
        part, section, key = target.split(".")
        setattr(getattr(getattr(cfg, part), section), key, value)  # validate_assignment checks the range
        notes[f"{section}.{key}"] = str(reasons.get(name, f"planner recommendation: {value}"))
    return notes
