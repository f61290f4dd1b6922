"""init -> validate -> plan -> doctor -> launch --dry-run agree on every config init can write.

Over engines (auto, sglang, builtin) x GPU (none here; a GPU server's size given with --gpu-mem-gib, optionally with
--tp 4) x models (every bundled family as a local model directory and as a hub id this host does not hold, a server
path, and the demo model). This machine has no GPU that NVML sees (the test skips where it has one): "GPU present"
is the GPU server init and plan are told about, which is how a config for a GPU server is written from a laptop.
What `auto` resolves to on a host with a GPU and sglang is decide_engine's rule, tested over HostFacts in
tests/control/test_launch_engine_select.py.

Agreement means: init either writes files or refuses cleanly (exit 2, nothing written, the flag to change named);
on what it wrote, validate has no errors and exactly init's warnings, plan prints init's numbers (or, where init
could not size the pools, asks for the same missing GPU size), doctor finds no error and sizes the same pools, and
launch --dry-run builds the command of the engine validate judged for, with no key it would ignore.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hybridctl.cli import app
from hybridctl.config.loader import load_hybrid_config
from hybridctl.host.nvml import gpu_memory_bytes
from hybridctl.launch.plan import auto_engine_here
from hybridctl.model.bundled import bundled_configs

pytestmark = pytest.mark.skipif(gpu_memory_bytes() is not None, reason="NVML sees a GPU here; this is about GPU-less")

runner = CliRunner()
# A hub id users type for each bundled checkpoint (a new templates/models/*.json needs one: test below).
HUB_IDS = {
    "falcon-h1-7b": "tiiuae/Falcon-H1-7B-Instruct",
    "granite-4.0-h-small": "ibm-granite/granite-4.0-h-small",
    "kimi-linear-48b-a3b": "moonshotai/Kimi-Linear-48B-A3B-Instruct",
    "nemotron-h-8b": "nvidia/Nemotron-H-8B-Base-8K",
    "qwen3-next-80b-a3b": "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "qwen3.5-35b-a3b": "Qwen/Qwen3.5-35B-A3B",
}
MODELS = [
    *(f"local:{name}" for name in sorted(HUB_IDS)),
    *(f"hub:{name}" for name in sorted(HUB_IDS)),
    "server-path:/models/Qwen3-Next-80B-A3B-Thinking-FP8",
    "demo",
]
GPU_FLAGS = {"none": [], "gpu80": ["--gpu-mem-gib", "80"], "gpu80-tp4": ["--gpu-mem-gib", "80", "--tp", "4"]}


def invoke(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.output)
    assert "Traceback" not in result.output, (args, result.output)
    return result


def as_json(result: Any) -> dict[str, Any]:
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the demo model is built with torch")
    out = tmp_path_factory.mktemp("demo") / "demo-model"
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.demo_model", "--out", str(out)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return out


def model_arg(model: str, tmp_path: Path, demo: Path | None) -> str:
    kind, _, name = model.partition(":")
    if kind == "local":  # the model directory on this host (its config.json; no weights: they are estimated)
        target = tmp_path / "models" / name
        target.mkdir(parents=True)
        shutil.copy(bundled_configs()[name], target / "config.json")
        return str(target)
    if kind == "hub":
        return HUB_IDS[name]
    if kind == "server-path":
        return name
    assert demo is not None
    return str(demo)


def test_every_bundled_model_has_a_hub_id() -> None:
    assert sorted(bundled_configs()) == sorted(HUB_IDS)


@pytest.mark.parametrize("gpu", sorted(GPU_FLAGS))
@pytest.mark.parametrize("engine", ["auto", "sglang", "builtin"])
@pytest.mark.parametrize("model", MODELS)
def test_init_and_the_commands_after_it_agree(
    model: str, engine: str, gpu: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    demo = request.getfixturevalue("demo_model") if model == "demo" else None
    arg = model_arg(model, tmp_path, demo)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # as the README runs them: the files in the current directory
    init = invoke("init", "--model", arg, "--engine", engine, *GPU_FLAGS[gpu], "--json")
    # Outcomes that do not depend on the model's size: what a GPU server is written with, what cannot serve it.
    if gpu == "gpu80-tp4" and engine != "builtin" or engine == "sglang" and gpu == "none":
        assert init.exit_code == 0, init.output
    if engine == "builtin" and gpu == "gpu80-tp4" and model.startswith(("local", "demo")):
        assert init.exit_code == 2 and "BUILTIN_UNSUPPORTED" in init.output, init.output  # one device
    if engine == "builtin" and model.startswith(("hub", "server-path")):
        assert init.exit_code == 2 and "not on this host" in init.output, init.output  # it loads from here
    if init.exit_code != 0:
        assert init.exit_code == 2, init.output
        assert "Nothing was written" in init.output and list(work.iterdir()) == []
        if engine == "auto" and auto_engine_here() == "builtin" and gpu == "none":
            assert "--engine sglang" in init.output  # the flag that writes a config for an SGLang server
        return
    written = as_json(init)
    cfg = load_hybrid_config(work / "config.toml", work / "settings.json")
    assert cfg.config.server.model_path == (arg if model.startswith(("hub", "server-path")) else str(Path(arg)))
    serving = cfg.config.server.engine if cfg.config.server.engine != "auto" else auto_engine_here()
    if engine == "auto" and gpu != "none" and auto_engine_here() == "builtin":
        assert cfg.config.server.engine == "sglang"  # a GPU server's size: the engine auto picks there
    if gpu != "none":
        assert cfg.config.memory.gpu_mem_gib == 80

    validate = invoke("validate", "--json")
    assert validate.exit_code == 0, validate.output
    report = as_json(validate)
    found = {(f["severity"], f["code"], f["key"]) for f in report["findings"] if f["severity"] != "info"}
    assert found == {(f["severity"], f["code"], f["key"]) for f in written["findings"]}
    assert not any(code == "IGNORED_BY_ENGINE" for _, code, _ in found)  # launch would refuse such a key

    plan = invoke("plan", "--json")
    if written["plan"] is not None:
        assert plan.exit_code == 0, plan.output
        planned = as_json(plan)
        for key in ("max_running_requests", "max_mamba_cache_size", "max_total_num_tokens"):
            assert planned[key] == written["plan"][key], key
    else:  # init could not size SGLang's pools: no GPU here and none given; plan asks for the same thing
        assert serving == "sglang" and gpu == "none"
        assert plan.exit_code == 2 and "--gpu-mem-gib" in plan.output, plan.output

    doctor = invoke("doctor", "--json")
    assert doctor.exit_code in (0, 1), doctor.output
    diagnosis = as_json(doctor)
    assert [f for f in diagnosis["findings"] if f["severity"] == "error"] == []
    checks = {c["name"]: c for c in diagnosis["checks"]}
    if written["plan"] is not None:
        assert checks["Pools"]["status"] == "ok", checks["Pools"]
        assert f"{written['plan']['max_total_num_tokens']} KV tokens" in checks["Pools"]["summary"]

    dry_run = invoke("launch", "--dry-run", "--json")
    assert dry_run.exit_code == 0, dry_run.output
    launch = as_json(dry_run)
    assert launch["engine"] == serving
    assert launch["ignored"] == []
    module = "sglang.launch_server" if serving == "sglang" else "runtime"
    assert launch["commands"][-1]["argv"][1:3] == ["-m", module]
