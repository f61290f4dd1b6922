"""Per-GPU memory via NVML (nvidia-ml-py); None where there is no GPU, no driver or no NVML."""

from __future__ import annotations


def gpu_memory_bytes(index: int = 0) -> int | None:
    """Total memory of GPU `index` in bytes, or None when NVML cannot tell (no GPU, no driver, no library)."""
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
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # shutdown failing after a successful init changes nothing we report
