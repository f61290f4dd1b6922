"""The ctypes calls into libcuda.so.1, exercised against a stand-in driver library compiled for the test.

No GPU here: a small C library with the CUDA driver API's signatures (two devices, the second without VMM
support) checks that argument passing, version decoding and attribute queries are right. On a GPU host the
real probe runs in test_doctor_host.py::test_real_probe_never_raises.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hybridctl.host.cuda_driver import CudaDriverUnavailable, query_cuda_driver

STAND_IN = r"""
#include <string.h>
static int initialised = 0;
int cuInit(unsigned int flags) { if (flags != 0) return 1; initialised = 1; return 0; }
int cuDriverGetVersion(int *v) { *v = 12020; return 0; }  /* CUDA 12.2, as a 535 driver reports */
int cuDeviceGetCount(int *n) { if (!initialised) return 3; *n = 2; return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = 100 + ordinal; return 0; }
int cuDeviceGetAttribute(int *value, int attr, int dev) {
    if (dev != 100 && dev != 101) return 101;  /* CUDA_ERROR_INVALID_DEVICE */
    if (attr == 75) { *value = 9; return 0; }
    if (attr == 76) { *value = 0; return 0; }
    if (attr == 102) { *value = dev == 100; return 0; }
    return 1;
}
int cuDeviceGetPCIBusId(char *bus, int len, int dev) {
    strncpy(bus, dev == 100 ? "0000:3b:00.0" : "0000:5e:00.0", len);
    return 0;
}
int cuGetErrorName(int err, const char **name) {
    *name = err == 3 ? "CUDA_ERROR_NOT_INITIALIZED" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
"""
BROKEN = STAND_IN.replace("if (flags != 0) return 1; initialised = 1; return 0;", "return 100;")


def build(tmp_path: Path, source: str, name: str) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in driver library")
    src, lib = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
    src.write_text(source, encoding="utf-8")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    return lib


def test_version_devices_and_vmm(tmp_path: Path) -> None:
    info = query_cuda_driver(str(build(tmp_path, STAND_IN, "libcuda_standin")))
    assert info.cuda_version == (12, 2)
    assert [(d.ordinal, d.pci_bus_id, d.compute_capability, d.vmm_supported) for d in info.devices] == [
        (0, "0000:3B:00.0", (9, 0), True),
        (1, "0000:5E:00.0", (9, 0), False),
    ]


def test_failing_cuinit_names_the_error(tmp_path: Path) -> None:
    with pytest.raises(CudaDriverUnavailable, match=r"cuInit failed: CUDA_ERROR_UNKNOWN"):
        query_cuda_driver(str(build(tmp_path, BROKEN, "libcuda_broken")))


def test_nvml_and_cuda_bus_ids_are_matched_across_domain_widths() -> None:
    from hybridctl.host.probe import _match_bus

    cuda = {"0000:3B:00.0": True, "0000:5E:00.0": False}
    assert _match_bus("00000000:5E:00.0", cuda) is False
    assert _match_bus("00000000:3B:00.0", cuda) is True
    assert _match_bus("00000000:AF:00.0", cuda) is None  # hidden by CUDA_VISIBLE_DEVICES
