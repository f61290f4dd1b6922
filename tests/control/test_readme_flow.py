"""The README's "Typical use" block runs as written on a GPU-less machine (this one has none), with the model path
pointed at a local copy of the same model's config.json; the live last line (launch --detach, verify) is left out."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_MODEL = "/models/Qwen3-Next-80B-A3B-Instruct"


def typical_use_commands() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    block = text.split("## Typical use", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.strip().splitlines():
        line = line.split("#", 1)[0].strip()
        for part in line.split("&&"):
            argv = shlex.split(part)
            if argv:
                commands.append(argv)
    return commands


def test_readme_typical_use_runs_on_a_gpu_less_host(tmp_path: Path) -> None:
    from hybridctl.host.nvml import gpu_memory_bytes

    if gpu_memory_bytes() is not None:
        pytest.skip("this host has a GPU; the test is about GPU-less hosts")
    model = tmp_path / "Qwen3-Next-80B-A3B-Instruct"
    model.mkdir()
    (model / "config.json").write_text((REPO / "templates" / "models" / "qwen3-next-80b-a3b.json").read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    commands = typical_use_commands()
    assert [c[:2] for c in commands][-2:] == [["hybridctl", "launch"], ["hybridctl", "verify"]]
    outputs = {}
    for argv in commands[:-2]:  # the live launch and verify need the GPU server
        argv = [str(model) if a == README_MODEL else a for a in argv]
        proc = subprocess.run(
            [sys.executable, "-m", "hybridctl", *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        outputs[argv[1]] = proc.stdout
    settings = (tmp_path / "settings.json").read_text()
    assert '"max_running_requests": 64' in settings  # --concurrency saved
    assert "context-length" in (tmp_path / "config.toml").read_text()  # --context-len saved
    assert "sglang.launch_server" in outputs["launch"].strip().splitlines()[-1]
    assert "--context-length 32768" in outputs["launch"]
