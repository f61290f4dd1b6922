"""Output people read, at 80 columns (a pipe, a CI log): one unit style, no Python spellings, paths never cut.

The main commands run in a subprocess with COLUMNS=80 from a directory whose path is longer than a line; the
renderers of long-running commands (demo, bench, verify, launch's start-up table) render their data at width 80.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from hybridctl.bench.render import render_bench
from hybridctl.bench.results import BenchResult
from hybridctl.demo.flow import DemoReport, DemoStep
from hybridctl.demo.render import render_demo
from hybridctl.launch.render import render_startup
from hybridctl.logs.startup import KVPoolLine, MambaPoolLine, StartupInfo
from hybridctl.verify.render import render_report
from hybridctl.verify.report import CheckResult, VerifyReport
from hybridshared.units import (
    GIB,
    format_gib,
    format_limit,
    format_ms,
    format_number,
    format_percent,
    format_value,
    with_article,
)

REPO = Path(__file__).resolve().parents[2]
QWEN3_NEXT = REPO / "templates" / "models" / "qwen3-next-80b-a3b.json"

# How Python, not a person, writes a value: None, True/False, a float's ".0" (8.0), a 4-decimal ratio (0.7778).
PYTHON_SPELLINGS = re.compile(r"\bNone\b|\bTrue\b|\bFalse\b|(?<![\d.])\d+\.0(?![\d.%])|(?<![\d.])0\.\d{4,}\b")


def _python_spellings(text: str) -> list[str]:
    # Version numbers ("torch 2.13.0", "SGLang 0.5.23") are not values.
    text = re.sub(r"\d+\.\d+\.\d+\S*", "<version>", text)
    return PYTHON_SPELLINGS.findall(text)


def _lines_holding(text: str, path: str) -> list[str]:
    return [line for line in text.splitlines() if path in line]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project in a directory whose path is longer than an 80-column line, its model beside it."""
    base = tmp_path_factory.mktemp("out")
    deep = base / "a-rather-long-directory-name-for-the-team" / "serving-configs-for-the-hybrid-models" / "prod"
    (deep / "model").mkdir(parents=True)
    shutil.copy(QWEN3_NEXT, deep / "model" / "config.json")
    return deep


def _hybridctl(project: Path, *args: str) -> str:
    env = {**os.environ, "COLUMNS": "80"}
    env.pop("HYBRIDCTL_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "hybridctl", *args], cwd=project, capture_output=True, text=True, timeout=120, env=env
    )
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "failed unexpectedly" not in out, out
    assert proc.returncode in (0, 1), out
    return out


@pytest.fixture(scope="module")
def outputs(project: Path) -> dict[str, str]:
    init = _hybridctl(project, "init", "--model", "model", "--gpu-mem-gib", "80", "--engine", "sglang",
                      "--concurrency", "32", "--tp", "4", "--force")  # fmt: skip
    return {
        "init": init,
        "validate": _hybridctl(project, "validate"),
        "plan": _hybridctl(project, "plan", "--gpu-mem-gib", "80"),
        "doctor": _hybridctl(project, "doctor", "--gpu-mem-gib", "80", "-v"),
        "launch --dry-run": _hybridctl(project, "launch", "--dry-run"),
    }


@pytest.mark.parametrize("command", ["init", "validate", "plan", "doctor", "launch --dry-run"])
def test_commands_print_no_python_spellings(outputs: dict[str, str], command: str) -> None:
    text = outputs[command]
    assert _python_spellings(text) == [], text
    assert not re.search(r"\d GB\b", text), text  # memory is GiB everywhere
    assert not re.search(r"\ba [8]\d* GiB", text), text  # "an 80 GiB GPU"
    assert not re.search(r"\b(error|warning|info)\b[^\n]*: \1 [A-Z_]{4,}", text), text  # a severity said twice


@pytest.mark.parametrize("command", ["plan", "launch --dry-run"])
def test_paths_print_whole_at_80_columns(project: Path, outputs: dict[str, str], command: str) -> None:
    model = str(project / "model")
    assert len(model) > 80
    assert _lines_holding(outputs[command], model), outputs[command]


def test_doctor_names_the_gpu_as_spoken(outputs: dict[str, str]) -> None:
    assert "an 80 GiB GPU" in outputs["doctor"], outputs["doctor"]


def _render(fn: object, *args: object) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=80, color_system=None, highlight=False)
    fn(*args, console)  # type: ignore[operator]
    return buf.getvalue()


LONG_DIR = "/srv/hybridctl/a-rather-long-directory-name-for-the-team/serving-configs/hybridctl-demo"


def test_demo_report_reads_as_text() -> None:
    report = DemoReport(
        out_dir=LONG_DIR,
        steps=[
            DemoStep("init", "ok", 0.41, f"wrote 4 files and the demo model {LONG_DIR}/demo-model; port 30001"),
            DemoStep(
                "launch",
                "ok",
                12.0,
                f"bundled runtime pid 4242 at http://127.0.0.1:30001; log {LONG_DIR}/hybridctl-server.log",
            ),  # fmt: skip
        ],
        verify={"passed": True, "checks": [{"name": "basic", "status": "passed", "summary": "server answers"}]},
        bench={
            "completed": 16,
            "failed": 0,
            "latency_ms": {"ttft": {"median": 137.925}, "tpot": {"median": 21.04}},
            "throughput": {"output_tok_per_s": 123.456},
            "cache": {"hit_rate": 0.7778},
            "concurrency": {"requested": None, "server_max_running": 8.0},
        },
    )
    text = _render(render_demo, report)
    assert _python_spellings(text) == [], text
    assert "median TTFT 138 ms" in text and "cache hit rate 77.8%" in text, text
    assert "concurrency no limit" in text and "server max running 8)" in text, text
    assert _lines_holding(text, f"{LONG_DIR}/demo-model") and _lines_holding(text, f"{LONG_DIR}/hybridctl-server.log")


def _bench(**overrides: object) -> BenchResult:
    fields: dict[str, object] = {
        "config": {
            "dataset": "shared-prefix",
            "url": "http://127.0.0.1:30000",
            "max_concurrency": None,
            "request_rate": "inf",
        },  # fmt: skip
        "completed": 9,
        "failed": 0,
        "errors": [],
        "duration_s": 1.4,
        "latency_ms": {
            "ttft": {"mean": 140.0, "median": 137.925, "p90": 150.0, "p99": 160.0, "count": 9},
            "tpot": None,
        },  # fmt: skip
        "throughput": {"request_per_s": 6.0, "output_tok_per_s": 96.0, "input_tok_per_s": 1200.0},
        "cache": {"hit_rate": 2 / 3},
        "accept_length": None,
        "concurrency": {"requested": None, "client_max_in_flight": 9, "server_max_running": None},
        "server": {
            "ttft_mean_ms": 131.3333,
            "ttft_relative_diff": 0.05,
            "ttft_diff_ms": 8.6667,
            "output_throughput_tok_s": 95.0,
            "throughput_relative_diff": None,
            "cache_hit_rate": 0.6667,
        },  # fmt: skip
    }
    fields.update(overrides)
    return BenchResult(**fields)  # type: ignore[arg-type]


def test_bench_report_reads_as_text() -> None:
    text = _render(render_bench, _bench())
    assert _python_spellings(text) == [], text
    assert "max concurrency no limit" in text and "request rate no limit" in text, text
    assert "cache hit rate (client, cached/prompt tokens): 66.7%" in text, text
    assert "server max running not measured" in text and "TTFT mean 131 ms" in text, text
    assert "(client differs by 5.0%, +8.7 ms)" in text, text
    assert "in 1.4 s" in text, text
    measured = _render(render_bench, _bench(concurrency={"requested": 8, "client_max_in_flight": 8,
                                                         "server_max_running": 8.0}))  # fmt: skip
    assert "server max running 8\n" in measured or "server max running 8 " in measured, measured


def test_verify_report_prints_its_url_whole_and_rates_as_percentages() -> None:
    url = "http://inference-gateway.a-rather-long-internal-domain-name.example.com:30000"
    check = CheckResult("prefix-cache", "passed", "warm/cold 0.12")
    report = VerifyReport(url=url, checks=[check])
    text = _render(render_report, report)
    assert _lines_holding(text, url), text
    assert _python_spellings(text) == [], text


def test_launch_start_up_table_in_gib() -> None:
    info = StartupInfo(
        mamba=MambaPoolLine(max_mamba_cache_size=412, conv_state_gb=0.19, ssm_state_gb=1.4),
        kv=[KVPoolLine(dtype="torch.bfloat16", tokens=926649, size_gb=1.77)],
        max_running_requests=48,
        context_len=4096,
    )
    info.tree_cache_impl, info.hybrid_ssm = "MambaRadixCache", True
    buf = io.StringIO()
    render_startup(Console(file=buf, width=80, color_system=None, highlight=False), "server", info)
    text = buf.getvalue()
    assert "1.59 GiB" in text and "1.77 GiB" in text and " GB" not in text, text
    assert _python_spellings(text) == [], text


def test_formatting_rules() -> None:
    assert format_gib(80 * GIB, trim=True) == "80 GiB" and format_gib(1.59 * GIB, 2) == "1.59 GiB"
    assert with_article("80 GiB GPU") == "an 80 GiB GPU" and with_article("24 GiB GPU") == "a 24 GiB GPU"
    assert with_article("11 GiB GPU") == "an 11 GiB GPU" and with_article("141 GiB GPU") == "a 141 GiB GPU"
    assert format_number(8.0) == "8" and format_number(None) == "not set" and format_number(137.925) == "137.93"
    assert format_number(True) == "true" and format_number(float("inf")) == "no limit"
    assert format_limit(None) == format_limit(0) == "no limit" and format_limit(8.0) == "8"
    assert format_percent(0.7778) == "77.8%" and format_percent(2 / 3) == "66.7%" and format_percent(None) == "n/a"
    assert [format_ms(v) for v in (0.42, 4.23, 137.925, 1400.0, 125_000.0, None)] == [
        "0.42 ms", "4.2 ms", "138 ms", "1.4 s", "125 s", "n/a",
    ]  # fmt: skip
    assert format_value(True) == "true" and format_value("fcfs") == '"fcfs"' and format_value(None) == "null"


def test_wrong_values_are_quoted_as_the_files_spell_them(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[server]\nmodel_path = "/models/m"\nport = true\n[memory]\nmem_fraction_static = "0.5"\n'
    )
    (tmp_path / "settings.json").write_text('{"logging": {"log_requests": "yes", "level": null}}')
    text = subprocess.run(
        [sys.executable, "-m", "hybridctl", "validate"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    ).stdout
    for shown in ("`port` = true", '`mem_fraction_static` = "0.5"', '`log_requests` = "yes"', "`level` = null"):
        assert shown in text, text
    bounds = re.sub(r"[\d.]+ [<≤] value( [<≤] [\d.]+)?", "<range>", text)  # a float key's range, as TOML spells it
    assert _python_spellings(bounds) == [] and "'0.5'" not in text, text


@pytest.mark.parametrize("command", ["plan", "bench", "launch --dry-run"])
def test_a_config_error_reads_the_same_from_every_command(tmp_path: Path, command: str) -> None:
    (tmp_path / "config.toml").write_text('[server]\nport = "abc"\n')
    config = str(tmp_path / "config.toml")

    def finding_line(*argv: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "hybridctl", *argv], capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        return next(line.strip() for line in (proc.stdout + proc.stderr).splitlines() if "WRONG_TYPE" in line)

    flag = ["--config", config] if command == "bench" else [config]
    assert finding_line(*command.split(), *flag) == finding_line("validate", config)
    assert (
        "error(s)"
        not in subprocess.run(
            [sys.executable, "-m", "hybridctl", "validate", config], capture_output=True, text=True, cwd=tmp_path
        ).stdout
    )
