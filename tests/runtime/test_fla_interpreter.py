"""The field's Gated DeltaNet kernels (fla's chunked prefill with `cu_seqlens` and its fused recurrent decode, on the
pool's state layout) compute what the runtime's delta rule computes, and the runtime's decode through fla's kernel
(runtime/models/layers/fla_kernels.py) what its torch decode computes: run on the CPU under Triton's interpreter in
`.venv-fla` (.ci/run makes it; tests/runtime/fla_interpreter_check.py says what runs and how)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("HYBRIDCTL_FLA_VENV", REPO / ".venv-fla"))

pytestmark = pytest.mark.slow  # fla's import and the interpreted kernels: ~20 s on a busy 2-core host


def test_fla_kernels_equal_the_runtime_delta_rule_under_the_interpreter() -> None:
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {VENV} (triton and flash-linear-attention; .ci/run makes it)")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [str(python), str(REPO / "tests/runtime/fla_interpreter_check.py")],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for kernel in ("chunk", "fused_recurrent"):
        assert result[kernel]["max_out_diff"] < 1e-5 and result[kernel]["max_state_diff"] < 1e-5, result
    model = result["decode_model"]  # the runtime's Gated DeltaNet decode through fla's kernel
    assert model["max_logits_diff"] < 1e-4 and model["max_state_diff"] < 1e-5, result
