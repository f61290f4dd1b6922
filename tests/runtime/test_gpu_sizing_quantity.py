"""On a GPU host, `plan`, `init`, `doctor` and the bundled runtime size the pools from one quantity, as SGLang
does: the memory free on the device before the weights load (SGLang's `pre_model_load_memory`), not its total.

The GPU is stood in for where the software meets it: NVML (nvidia-ml-py) for plan, a probed host for doctor, and
`torch.cuda.mem_get_info` for the engine, all describing one device of 80 GiB of which 61 GiB are free before the
weights load (other processes hold the rest)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from hybridctl.doctor.run import DoctorOptions, run_doctor
from hybridctl.host.facts import GpuFacts, HostFacts
from hybridctl.init.init_project import InitOptions, init_project
from hybridctl.planner.builtin_sizing import builtin_device_bytes
from hybridctl.planner.plan_request import PlanRequest, load_config, run_plan
from hybridshared.units import GIB
from runtime.core.config import EngineArgs
from runtime.engine.pool_setup import device_memory_bytes

TOTAL, FREE = 80 * GIB, 61 * GIB


class _NVMLError(Exception):
    pass


def _nvml() -> types.ModuleType:
    """nvidia-ml-py as hybridctl/host/nvml.py and probe.py call it, for one H100 of TOTAL bytes with FREE free."""
    nvml = types.ModuleType("pynvml")
    calls: dict[str, object] = {
        "NVMLError": _NVMLError,
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda index: ("gpu", index),
        "nvmlDeviceGetMemoryInfo": lambda handle: types.SimpleNamespace(total=TOTAL, free=FREE, used=TOTAL - FREE),
        # what the host probe (init's engine choice) asks besides
        "nvmlSystemGetDriverVersion": lambda: "550.54.15",
        "nvmlSystemGetCudaDriverVersion": lambda: 12040,
        "nvmlDeviceGetName": lambda handle: "NVIDIA H100",
        "nvmlDeviceGetCudaComputeCapability": lambda handle: (9, 0),
        "nvmlDeviceGetPciInfo": lambda handle: types.SimpleNamespace(busId="00000000:3B:00.0"),
    }
    for name, value in calls.items():
        setattr(nvml, name, value)

    def unsupported(name: str) -> object:  # any other call (the host probe's driver version, ...) fails as NVML's
        def call(*_args: object) -> object:
            raise _NVMLError(f"{name}: not simulated")

        return call

    nvml.__getattr__ = unsupported  # type: ignore[method-assign]  # PEP 562: looked up in the module's dict
    return nvml


@pytest.fixture()
def config(demo_model_dir: Path, tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'[server]\nengine = "builtin"\nmodel_path = "{demo_model_dir}"\n')
    return path


def test_plan_doctor_and_engine_size_from_the_memory_free_before_the_weights_load(
    config: Path, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _nvml())
    spec, plan = run_plan(PlanRequest(config_path=config))
    assert plan.engine == "builtin" and plan.gpu_mem_bytes == FREE
    weights = spec.weights_bytes_per_rank
    assert plan.pool_bytes == int(FREE * plan.mem_fraction_static) - weights

    # The engine, its weights loaded: free is what was free before less the weights; it adds them back.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (FREE - weights, TOTAL))
    engine = device_memory_bytes(EngineArgs(model_path=str(demo_model_dir), device="cuda"), weights)
    cfg, _ = load_config(PlanRequest(config_path=config))
    assert engine == builtin_device_bytes(cfg, plan.gpu_mem_bytes) == FREE

    gpu = GpuFacts(
        index=0, name="NVIDIA H100", compute_capability=(9, 0), total_bytes=TOTAL, free_bytes=FREE, vmm_supported=True
    )
    report = run_doctor(
        DoctorOptions(config_path=config, settings_path=config.with_name("settings.json")), HostFacts(gpus=(gpu,))
    )
    pools = next(c for c in report.checks if c.name == "Pools")
    assert pools.status == "ok", pools.summary
    p = plan.pools
    assert f"{p.max_total_num_tokens} KV tokens, {p.max_running_requests} requests" in pools.summary
    assert f"{p.max_mamba_cache_size} state slots" in pools.summary


def test_a_budget_caps_the_free_memory_on_both_sides(
    config: Path, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memory.memory_budget_gib (--memory-budget-gib of the runtime) caps the same quantity on both sides."""
    config.write_text(config.read_text() + "[memory]\nmemory_budget_gib = 2.0\n")
    monkeypatch.setitem(sys.modules, "pynvml", _nvml())
    spec, plan = run_plan(PlanRequest(config_path=config))
    weights = spec.weights_bytes_per_rank
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (FREE - weights, TOTAL))
    engine = device_memory_bytes(
        EngineArgs(model_path=str(demo_model_dir), device="cuda", memory_budget_gib=2.0), weights
    )
    assert plan.pool_bytes == int(engine * plan.mem_fraction_static) - weights
    assert engine == 2 * GIB


def test_init_plans_the_runtime_from_the_free_memory(
    demo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _nvml())
    result = init_project(InitOptions(out_dir=tmp_path / "project", model=str(demo_model_dir), engine="builtin"))
    assert result.plan is not None, result.plan_skipped
    assert result.plan["engine"] == "builtin" and result.plan["gpu_mem_bytes"] == FREE
