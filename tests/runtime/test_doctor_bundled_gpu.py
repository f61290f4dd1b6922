"""doctor's torch line says what the bundled runtime does on a GPU host: with a CUDA torch it runs on the GPU (and
how), with a CPU torch on the CPU."""

from __future__ import annotations

from hybridctl.doctor.judge import BUNDLED_ON_GPU, judge_host
from hybridctl.host.facts import GpuFacts, HostFacts, TorchBuild

GPU = GpuFacts(
    index=0,
    name="NVIDIA H100",
    compute_capability=(9, 0),
    total_bytes=80 << 30,
    free_bytes=79 << 30,
    vmm_supported=True,
)


def _torch_line(facts: HostFacts) -> tuple[str, str, tuple[str, ...]]:
    checks, _ = judge_host(facts)
    line = next(c for c in checks if c.name == "torch")
    return line.status, line.summary, tuple(line.details)


def test_cuda_torch_on_a_gpu_host_states_the_bundled_gpu_path() -> None:
    facts = HostFacts(
        driver_version="550.54.15", cuda_driver_version=(12, 4), gpus=(GPU,), torch=TorchBuild("2.8.0", "12.4")
    )
    status, _, details = _torch_line(facts)
    assert status == "ok" and details == (BUNDLED_ON_GPU,)
    assert "runs on one GPU" in BUNDLED_ON_GPU and "gpu_check.py" in BUNDLED_ON_GPU


def test_cpu_torch_on_a_gpu_host_says_the_runtime_runs_on_the_cpu() -> None:
    status, summary, details = _torch_line(HostFacts(gpus=(GPU,), torch=TorchBuild("2.8.0+cpu", None)))
    assert status == "warning" and "CPU build on a GPU host" in summary
    assert "runs on the CPU" in details[0] and "CUDA build" in details[0]


def test_cuda_torch_without_gpus_says_nothing_about_a_gpu_path() -> None:
    status, _, details = _torch_line(HostFacts(torch=TorchBuild("2.8.0", "12.4")))
    assert details == ()
