"""Probe the host: NVML (driver, GPUs, processes), libcuda (VMM support), torch and sglang builds.

Every step that cannot run (no NVML library, no GPU, no libcuda.so.1, package missing) is recorded in
`HostFacts.skipped` with the reason; the probe never raises for a missing piece of the system.
"""

from __future__ import annotations

import os
from types import ModuleType

from hybridctl.host.cuda_driver import CudaDriverInfo, CudaDriverUnavailable, query_cuda_driver
from hybridctl.host.facts import GpuFacts, GpuProcess, HostFacts
from hybridctl.host.packages import PackageMissing, sglang_facts, torch_build
from hybridshared.compiler import CANDIDATES, COMPILER_ENV, find_c_compiler


def probe_host() -> HostFacts:
    skipped: dict[str, str] = {}
    cuda: CudaDriverInfo | None = None
    try:
        cuda = query_cuda_driver()
    except CudaDriverUnavailable as exc:
        skipped["cuda_driver"] = str(exc)
    gpus: tuple[GpuFacts, ...] = ()
    driver_version, nvml_cuda = None, None
    try:
        driver_version, nvml_cuda, gpus = _probe_nvml(cuda)
    except _NvmlUnavailable as exc:
        skipped["nvml"] = str(exc)
    torch = sglang = None
    try:
        torch = torch_build()
    except PackageMissing as exc:
        skipped["torch"] = str(exc)
    try:
        sglang = sglang_facts()
    except PackageMissing as exc:
        skipped["sglang"] = str(exc)
    c_compiler = find_c_compiler()
    if c_compiler is None:
        skipped["c_compiler"] = f"no C compiler (${COMPILER_ENV}, or {', '.join(CANDIDATES)} on PATH)"
    return HostFacts(
        driver_version=driver_version,
        cuda_driver_version=cuda.cuda_version if cuda else nvml_cuda,
        gpus=gpus,
        torch=torch,
        sglang=sglang,
        c_compiler=c_compiler,
        skipped=skipped,
    )


class _NvmlUnavailable(Exception):
    pass


def _probe_nvml(cuda: CudaDriverInfo | None) -> tuple[str, tuple[int, int] | None, tuple[GpuFacts, ...]]:
    try:
        import pynvml
    except ImportError:
        raise _NvmlUnavailable("nvidia-ml-py is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise _NvmlUnavailable(f"NVML did not initialise ({exc}): no NVIDIA driver on this host") from None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            raw = pynvml.nvmlSystemGetCudaDriverVersion()
            nvml_cuda: tuple[int, int] | None = (raw // 1000, raw % 1000 // 10)
        except pynvml.NVMLError:
            nvml_cuda = None
        vmm_by_bus = {d.pci_bus_id: d.vmm_supported for d in cuda.devices} if cuda else {}
        gpus = tuple(_probe_gpu(pynvml, i, vmm_by_bus, cuda is not None) for i in range(pynvml.nvmlDeviceGetCount()))
        return driver, nvml_cuda, gpus
    finally:
        pynvml.nvmlShutdown()


def _probe_gpu(pynvml: ModuleType, index: int, vmm_by_bus: dict[str, bool], have_cuda: bool) -> GpuFacts:
    nv = pynvml
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    mem = nv.nvmlDeviceGetMemoryInfo(handle)
    try:
        cc: tuple[int, int] | None = tuple(nv.nvmlDeviceGetCudaComputeCapability(handle))
    except nv.NVMLError:
        cc = None
    # CUDA ordinals and NVML indices differ under CUDA_VISIBLE_DEVICES; the PCI bus id is what they share.
    bus = _text(nv.nvmlDeviceGetPciInfo(handle).busId).upper()
    vmm = _match_bus(bus, vmm_by_bus) if have_cuda else None
    return GpuFacts(
        index=index,
        name=_text(nv.nvmlDeviceGetName(handle)),
        compute_capability=cc,
        total_bytes=int(mem.total),
        free_bytes=int(mem.free),
        vmm_supported=vmm,
        processes=_probe_processes(nv, handle),
    )


def _match_bus(nvml_bus: str, vmm_by_bus: dict[str, bool]) -> bool | None:
    # NVML pads the PCI domain to 8 hex digits ("00000000:3B:00.0"), CUDA to 4 ("0000:3B:00.0").
    tail = nvml_bus.split(":", 1)[-1]
    for cuda_bus, vmm in vmm_by_bus.items():
        if cuda_bus.split(":", 1)[-1] == tail:
            return vmm
    return None  # not visible to CUDA in this process (CUDA_VISIBLE_DEVICES)


def _probe_processes(nv: ModuleType, handle: object) -> tuple[GpuProcess, ...]:
    procs: dict[int, GpuProcess] = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            running = getattr(nv, getter)(handle)
        except nv.NVMLError:
            continue
        for p in running:
            if p.pid == os.getpid():
                continue
            used = p.usedGpuMemory
            # NVML reports "not available" as None or as a huge sentinel inside containers.
            mib = int(used) // (1 << 20) if isinstance(used, int) and used < (1 << 60) else None
            procs[p.pid] = GpuProcess(pid=p.pid, name=_process_name(nv, p.pid), used_mib=mib)
    return tuple(procs.values())


def _process_name(nv: ModuleType, pid: int) -> str:
    try:
        return _text(nv.nvmlSystemGetProcessName(pid))
    except Exception:  # noqa: BLE001  (another PID namespace: NVML cannot name it, /proc may)
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError:
            return "?"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
