"""README.md's command blocks run as written on a GPU-less machine, with the exit codes the README states.

Every ```bash block is one of three kinds, and each kind has its test: "Typical use" (here: each line run verbatim
with bash in an empty working directory, its exit code checked against the README's table), the set-up block
(tests/control/test_readme_setup.py: verbatim in a fresh virtual environment, marked slow), and the test command
(here: it is the command `.ci/run` ends with; pytest cannot run itself).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def bash_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)]


def typical_use_section() -> str:
    return README.split("## Typical use", 1)[1].split("\n## ", 1)[0]


def typical_use_lines() -> list[str]:
    return bash_blocks(typical_use_section())[0].splitlines()


def stated_exit_codes() -> dict[int, int]:
    """line number -> exit code, from the table under the Typical use block (| line | prints | exit |)."""
    rows = re.findall(r"^\| (\d+) \| .* \| (\d+) \|$", typical_use_section(), flags=re.MULTILINE)
    return {int(line): int(code) for line, code in rows}


def is_setup(block: str) -> bool:
    return block.endswith("hybridctl demo")


def is_test_command(block: str) -> bool:
    return "pytest" in block


def test_every_block_is_one_a_test_runs() -> None:
    blocks = bash_blocks(README)
    typical = bash_blocks(typical_use_section())
    assert len(typical) == 1
    unknown = [b for b in blocks if not (is_setup(b) or is_test_command(b) or b == typical[0])]
    assert unknown == [], "a README command block no test runs; add it to a test"
    assert sum(map(is_setup, blocks)) == 1 and sum(map(is_test_command, blocks)) == 1


def test_every_typical_use_line_states_its_exit_code() -> None:
    assert sorted(stated_exit_codes()) == list(range(1, len(typical_use_lines()) + 1))


def test_the_test_command_is_what_ci_runs() -> None:
    """`.ci/run` installs what the block installs, then ends with the block's last command."""
    (block,) = [b for b in bash_blocks(README) if is_test_command(b)]
    *installs, test_command = [part.strip() for part in block.split("&&")]
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in script.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert commands[-1] == test_command, (
        "the README's test command must be the last command of .ci/run (run other CI jobs before it), or the README "
        "must say what CI runs instead"
    )
    for install in installs:  # `pip install X` in the README is `python3 -m pip install --quiet X` in CI
        wanted = shlex.split(install)[2:]
        assert any(shlex.split(c)[-len(wanted):] == wanted and "pip install" in c for c in commands), install


def _hybridctl_on_path(bin_dir: Path) -> str:
    """A PATH whose `hybridctl` is this interpreter's (the console script next to it, else `python -m hybridctl`)."""
    script = Path(sys.executable).parent / "hybridctl"
    if script.is_file():
        return f"{script.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    bin_dir.mkdir()
    shim = bin_dir / "hybridctl"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m hybridctl "$@"\n')
    shim.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def _sglang_installed() -> bool:
    try:
        importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_typical_use_runs_as_written_on_a_gpu_less_host(tmp_path: Path) -> None:
    from hybridctl.host.nvml import gpu_memory_bytes

    if gpu_memory_bytes() is not None or _sglang_installed():
        pytest.skip("the README states what happens on a GPU-less machine without sglang")
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PATH": _hybridctl_on_path(tmp_path / "bin"),
        "PYTHONPATH": str(REPO),  # this checkout's hybridctl, whatever is installed
        "COLUMNS": "200",
    }
    codes = stated_exit_codes()
    out: dict[int, str] = {}
    for number, line in enumerate(typical_use_lines(), start=1):
        proc = subprocess.run(
            ["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        out[number] = proc.stdout + proc.stderr
        assert proc.returncode == codes[number], (line, out[number])
        assert "Traceback" not in out[number], (line, out[number])

    # 1: init says where the engine and the model's geometry came from, and writes what it was told
    assert "server.engine" in out[1] and "bundled config.json" in out[1]
    config = (work / "config.toml").read_text()
    assert 'engine = "sglang"' in config and 'model_path = "Qwen/Qwen3-Next-80B-A3B-Instruct"' in config
    assert "gpu_mem_gib = 80" in config and "context-length = 32768" in config
    assert '"max_running_requests": 64' in (work / "settings.json").read_text()
    # 2: valid, then the plan for the recorded GPU (no flag needed), with the 64 requests asked for
    assert "valid" in out[2] and "max running requests" in out[2] and "│ 64" in out[2]
    # 3: doctor sized the same pools
    assert "64 requests at once" in out[3]
    # 4: the SGLang command line for the model as given
    assert "sglang.launch_server --model-path Qwen/Qwen3-Next-80B-A3B-Instruct" in out[4]
    assert "--tp-size 4" in out[4] and "--context-length 32768" in out[4]
    # 5: a clear message and nothing started; verify did not run
    assert "error: sglang is not installed" in out[5]
    assert "verify" not in out[5].split("error:", 1)[0]
