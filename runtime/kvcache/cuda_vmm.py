"""Whether CUDA virtual memory management (cuMemCreate / cuMemMap) is usable here, asked of libcuda by ctypes.

The elastic pool names the answer in its start-up line and in a reallocation-timeout cause. It does not map
or unmap memory itself yet: on CUDA it re-partitions one preallocated buffer, as on the CPU.
"""

from __future__ import annotations

import ctypes

MIN_DRIVER_CUDA_VERSION = 12020  # CUDA 12.2, shipped with driver 535: SGLang's floor for its VMM pool
_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102


def vmm_status(device: int = 0) -> str:
    """'available' or why not (no driver, driver < 535, no VMM on the device), never raising."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "unavailable (no libcuda.so.1: no NVIDIA driver)"
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return "unavailable (cuDriverGetVersion failed)"
    if version.value < MIN_DRIVER_CUDA_VERSION:
        return f"unavailable (driver CUDA version {version.value} < {MIN_DRIVER_CUDA_VERSION}: driver < 535)"
    if cuda.cuInit(0) != 0:
        return "unavailable (cuInit failed)"
    dev = ctypes.c_int(0)
    if cuda.cuDeviceGet(ctypes.byref(dev), device) != 0:
        return f"unavailable (no CUDA device {device})"
    supported = ctypes.c_int(0)
    attr = _CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    if cuda.cuDeviceGetAttribute(ctypes.byref(supported), attr, dev) != 0 or not supported.value:
        return "unavailable (the device does not support virtual memory management)"
    return "available"
