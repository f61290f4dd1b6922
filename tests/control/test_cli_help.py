"""`--help` of every command stays fast: it loads the CLI modules only."""

from __future__ import annotations

import subprocess
import sys

HELP_COMMANDS = [
    *("", "init", "validate", "plan", "schema", "launch", "status", "stop", "bench", "doctor", "demo"),
    *("verify all", "verify basic", "verify prefix-cache", "verify spec", "verify structured"),
]


def test_every_help_imports_only_the_cli_modules() -> None:
    # `--help` must stay fast: the command modules import their libraries inside the command functions.
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from hybridctl.cli import app\n"
        f"for args in {HELP_COMMANDS!r}:\n"
        "    result = CliRunner().invoke(app, [*args.split(), '--help'])\n"
        "    assert result.exit_code == 0, (args, result.output)\n"
        "heavy = ('torch', 'httpx', 'tomlkit', 'transformers', 'safetensors', 'numpy')\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in heavy\n"
        "          or (m.startswith('hybridctl.') and not m.startswith('hybridctl.cli'))]\n"
        "print(sorted(loaded))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
