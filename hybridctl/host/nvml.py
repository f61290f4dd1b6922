"""Per-GPU memory via NVML (nvidia-ml-py); None where there is no GPU, no driver or no NVML."""

from __future__ import annotations


def gpu_memory_bytes(index: int = 0) -> int | None:
    """Total memory of GPU `index` in bytes, or None when NVML cannot tell (no GPU, no driver, no library).
    SGLang picks its defaults by it (hybridctl/planner/memory.py `gpu_tier`)."""
    info = _memory_info(index)
    return None if info is None else info[0]


def gpu_free_bytes(index: int = 0) -> int | None:
    """Memory free on GPU `index` now, in bytes; None as `gpu_memory_bytes`. What the bundled runtime sizes its
    pools from (runtime/engine/pool_setup.py `device_memory_bytes`: the memory free before its weights load, as
    SGLang's `pre_model_load_memory`), so what `plan` and `init` size it from on this host: not the total, part of
    which other processes and the driver already hold."""
    info = _memory_info(index)
    return None if info is None else info[1]


def _memory_info(index: int) -> tuple[int, int] | None:
    """(total, free) bytes of GPU `index`."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        if index >= pynvml.nvmlDeviceGetCount():
            return None
        mem = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
        return int(mem.total), int(mem.free)
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # shutdown failing after a successful init changes nothing we report
