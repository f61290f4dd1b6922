"""benchmarks/gpu_check.py --device cpu: the GPU check's rehearsal on the CPU passes every check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from benchmarks.gpu_check import main  # noqa: E402 - needs transformers (the families' reference models)


def test_gpu_check_rehearsal_passes_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    assert main(["--device", "cpu", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    checks = report["checks"]
    assert set(checks) == {
        "greedy_fp32",
        "seeded_sampling",
        "bf16_error",
        "readbacks",
        "decode_graph",
        "decode_throughput",
        "prefix_cache",
        "doctor_vmm",
    }
    failed = {name: c for name, c in checks.items() if not c["pass"]}
    assert report["pass"] and not failed, failed
    assert len(checks["greedy_fp32"]["families"]) == 6
    assert checks["readbacks"]["max_per_step"] == 1 and len(checks["readbacks"]["per_step"]) == 12
    assert set(checks["decode_graph"]["per_step"].values()) == {"ok"} and len(checks["decode_graph"]["per_step"]) == 12
    assert checks["prefix_cache"]["cached_tokens"] > 0 and checks["prefix_cache"]["tokens_identical"]
