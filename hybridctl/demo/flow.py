"""`hybridctl demo`: the README's first command, end to end and offline.

init --demo (a tiny Qwen3-Next built locally) -> launch the bundled runtime -> verify all -> a short bench ->
report.json beside the config -> stop the server. Each step is timed and recorded, so a failure says which step and why;
the server is stopped whatever happens after it started.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from hybridctl.bench.datasets import SharedPrefixShape
from hybridctl.bench.loadgen import LoadShape
from hybridctl.bench.runner import BenchOptions, run_bench
from hybridctl.config.atomic_write import write_text_atomic
from hybridctl.config.loader import load_hybrid_config, settings_path_for
from hybridctl.host.ports import preferred_or_free_port
from hybridctl.init.init_project import DEMO_MODEL_DIR, InitOptions, init_project
from hybridctl.launch import start_server
from hybridctl.verify.client import ServerUnreachable, Target
from hybridctl.verify.prefix_judge import PrefixCacheOptions
from hybridctl.verify.runner import VerifyOptions, run_checks
from hybridshared import paths

REPORT_NAME = "report.json"
Progress = Callable[[str], None]


class DemoError(Exception):
    """A step failed in a way that stops the demo; the message names the step and the fix."""

    report: DemoReport | None = None  # the steps run so far, attached where the failure is caught


@dataclass
class DemoOptions:
    out_dir: Path = Path("hybridctl-demo")
    force: bool = False
    port: int | None = None  # None: 30000 when free, else a free port
    doc_tokens: int = 1024
    trials: int = 3
    bench: SharedPrefixShape = field(
        default_factory=lambda: SharedPrefixShape(
            num_groups=2, prompts_per_group=8, system_prompt_len=256, question_len=32, output_len=16
        )
    )
    concurrency: int = 8


@dataclass
class DemoStep:
    name: str
    status: str  # "ok" | "failed"
    seconds: float
    detail: str


@dataclass
class DemoReport:
    out_dir: str
    url: str | None = None
    steps: list[DemoStep] = field(default_factory=list)
    verify: dict[str, Any] | None = None
    bench: dict[str, Any] | None = None
    report_path: str | None = None

    @property
    def passed(self) -> bool:
        return (
            all(s.status == "ok" for s in self.steps)
            and self.verify is not None
            and bool(self.verify.get("passed"))
            and self.bench is not None
            and self.bench.get("failed") == 0
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "out_dir": self.out_dir,
            "url": self.url,
            "steps": [s.__dict__ for s in self.steps],
            "verify": self.verify,
            "bench": self.bench,
        }


def _tune_config(config_path: Path, port: int) -> None:
    """Point the demo config at a free port and turn on /metrics (bench compares itself with the server)."""

    doc = tomlkit.parse(config_path.read_text())
    doc["server"]["port"] = port
    extra = doc.setdefault("extra_engine_args", tomlkit.table())
    extra["enable_metrics"] = True
    write_text_atomic(config_path, tomlkit.dumps(doc))


class _Steps:
    def __init__(self, report: DemoReport, progress: Progress) -> None:
        self.report, self.progress = report, progress

    def run(self, name: str, label: str, fn: Callable[[], str]) -> None:
        self.progress(label)
        start = time.monotonic()
        try:
            detail = fn()
        except Exception as exc:
            self.report.steps.append(DemoStep(name, "failed", time.monotonic() - start, str(exc)))
            raise DemoError(f"demo step `{name}` failed: {exc}") from exc
        self.report.steps.append(DemoStep(name, "ok", time.monotonic() - start, detail))


def run_demo(opts: DemoOptions, progress: Progress = lambda _msg: None) -> DemoReport:
    """Run every step; raises DemoError (with the report so far in `.report`) when a step cannot go on."""

    out_dir = paths.resolve(opts.out_dir)  # never raises: a symlink loop stays as written, and fails to write
    report = DemoReport(out_dir=str(out_dir))
    steps = _Steps(report, progress)
    config_path = out_dir / "config.toml"

    def init() -> str:
        if opts.force:
            _remove_old_demo_model(out_dir)
        result = init_project(InitOptions(out_dir=out_dir, demo=True, engine="builtin", force=opts.force))
        port = opts.port or preferred_or_free_port(30000)
        _tune_config(config_path, port)
        if result.reused:
            return f"kept the demo already in {out_dir} (--force rebuilds it); port {port}"
        return f"wrote {len(result.files)} files and the demo model {result.demo_model}; port {port}"

    handle = None
    try:
        steps.run("init", f"init --demo into {out_dir} (builds a tiny Qwen3-Next)", init)
        cfg = load_hybrid_config(config_path, settings_path_for(config_path))

        def launch() -> str:
            nonlocal handle
            handle = start_server(config_path, cfg=cfg, on_progress=lambda role, waited, line: progress(
                f"launch: waiting for the bundled runtime ({waited:.0f} s) {line[-60:]}"))  # fmt: skip
            report.url = handle.url
            return f"bundled runtime pid {handle.pid} at {handle.url}; log {handle.log_path}"

        steps.run("launch", "launch the bundled runtime", launch)
        assert handle is not None
        target = Target(url=handle.url, timeout_s=600.0)

        def verify() -> str:
            options = VerifyOptions(prefix_cache=PrefixCacheOptions(doc_tokens=opts.doc_tokens, trials=opts.trials))
            result = run_checks(target, cfg, options=options, on_check=lambda n: progress(f"verify {n}"))
            report.verify = result.to_dict()
            return ", ".join(f"{c.name} {c.status}" for c in result.checks)

        steps.run("verify", "verify all", verify)

        def bench() -> str:
            options = BenchOptions(shared_prefix=opts.bench, load=LoadShape(max_concurrency=opts.concurrency))
            done = [0]

            def tick(_record: object) -> None:
                done[0] += 1
                progress(f"bench: {done[0]} requests done")

            result = run_bench(target, options, cfg, on_done=tick)
            report.bench = result.to_dict()
            return f"{result.completed} completed, {result.failed} failed in {result.duration_s:.1f} s"

        steps.run("bench", "bench (generated shared prefix, 8 concurrent streams)", bench)
    except ServerUnreachable as exc:
        raise _with_report(DemoError(f"the server stopped answering: {exc}"), report) from None
    except DemoError as exc:
        raise _with_report(exc, report) from None
    finally:
        if handle is not None:
            progress("stop the server")
            start = time.monotonic()
            try:
                stopped = handle.stop()
                detail = f"stopped pid(s) {stopped.stopped or stopped.already_gone}"
                if stopped.killed:
                    detail += f", killed {stopped.killed} after the grace period"
                report.steps.append(DemoStep("stop", "ok", time.monotonic() - start, detail))
            except Exception as exc:  # noqa: BLE001  (recorded in the report; the demo has already ended)
                report.steps.append(DemoStep("stop", "failed", time.monotonic() - start, str(exc)))
        # Only a run that wrote its own config may write report.json: never overwrite another run's files.
        if report.steps and report.steps[0].name == "init" and report.steps[0].status == "ok":
            _write_report(report, out_dir)
    return report


def _remove_old_demo_model(out_dir: Path) -> None:
    """--force replaces an earlier demo's model too (init's builder refuses a non-empty directory)."""

    old = out_dir / DEMO_MODEL_DIR
    # Only a directory that looks like a built demo model; anything else is left for the builder to refuse.
    if (old / "config.json").is_file() and (old / "model.safetensors").is_file():
        shutil.rmtree(old)


def _with_report(exc: DemoError, report: DemoReport) -> DemoError:
    exc.report = report
    return exc


def _write_report(report: DemoReport, out_dir: Path) -> None:

    path = out_dir / REPORT_NAME
    report.report_path = str(path)
    write_text_atomic(path, json.dumps(report.to_dict(), indent=2) + "\n")
