"""Ask libcuda.so.1 (ctypes; no compiler, no torch) which devices support CUDA virtual memory management.

The elastic pool maps physical pages into a reserved virtual range (cuMemCreate/cuMemMap); a device without
VMM support cannot grow or shrink a pool. Only entry points present since CUDA 10.2 (440 drivers) are used, so
this works on 535-era drivers.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102


class CudaDriverUnavailable(Exception):
    """libcuda.so.1 is missing or refused to initialise; the message says which."""


@dataclass(frozen=True)
class CudaDevice:
    ordinal: int
    pci_bus_id: str  # "0000:3B:00.0", upper case like NVML's, used to match NVML devices
    compute_capability: tuple[int, int]
    vmm_supported: bool


@dataclass(frozen=True)
class CudaDriverInfo:
    cuda_version: tuple[int, int]  # from cuDriverGetVersion: the highest CUDA the driver supports
    devices: tuple[CudaDevice, ...]


def _check(lib: ctypes.CDLL, rc: int, call: str) -> None:
    if rc == 0:
        return
    name = ctypes.c_char_p()
    lib.cuGetErrorName(rc, ctypes.byref(name))
    label = name.value.decode() if name.value else f"error {rc}"
    raise CudaDriverUnavailable(f"{call} failed: {label}")


def query_cuda_driver(library: str = "libcuda.so.1") -> CudaDriverInfo:
    """Load the driver library and read version, compute capability and VMM support of each device."""
    try:
        lib = ctypes.CDLL(library)
    except OSError as exc:
        raise CudaDriverUnavailable(f"{library} not loadable ({exc})") from None
    _check(lib, lib.cuInit(0), "cuInit")
    version = ctypes.c_int()
    _check(lib, lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    count = ctypes.c_int()
    _check(lib, lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    devices = []
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        _check(lib, lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        devices.append(_describe(lib, ordinal, dev))
    return CudaDriverInfo(
        cuda_version=(version.value // 1000, version.value % 1000 // 10), devices=tuple(devices)
    )


def _describe(lib: ctypes.CDLL, ordinal: int, dev: ctypes.c_int) -> CudaDevice:
    def attribute(attr: int) -> int:
        value = ctypes.c_int()
        _check(lib, lib.cuDeviceGetAttribute(ctypes.byref(value), attr, dev), f"cuDeviceGetAttribute({attr})")
        return value.value

    bus = ctypes.create_string_buffer(32)
    _check(lib, lib.cuDeviceGetPCIBusId(bus, len(bus), dev), "cuDeviceGetPCIBusId")
    return CudaDevice(
        ordinal=ordinal,
        pci_bus_id=bus.value.decode().upper(),
        compute_capability=(
            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        ),
        vmm_supported=bool(attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)),
    )
