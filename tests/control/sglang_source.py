"""SGLang 0.5.23's source, read as text: where it is, and lifting pure functions out of it with `ast`.

SGLang's modules import torch and CUDA-only helpers, so the control-plane tests cannot import them; they lift
the pure parts (imports dropped) and execute them against stand-ins. Imported by the test modules that
compare hybridctl's arithmetic with SGLang's own.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates" / "models"


def sglang_srt() -> Path:
    """SGLang 0.5.23's `srt` source: $HYBRIDCTL_SGLANG_SRT, else the venv .ci/run builds ($HYBRIDCTL_SGLANG_VENV,
    default .venv-sglang in the repository). Never a path of one machine: where neither exists, the path returned
    does not exist and the tests that need SGLang's source skip, saying which variable to set."""
    if "HYBRIDCTL_SGLANG_SRT" in os.environ:
        return Path(os.environ["HYBRIDCTL_SGLANG_SRT"])
    venv = Path(os.environ.get("HYBRIDCTL_SGLANG_VENV", REPO / ".venv-sglang"))
    found = sorted(venv.glob("lib/python3*/site-packages/sglang/srt"))
    return found[0] if found else venv / "lib" / "python3" / "site-packages" / "sglang" / "srt"


SKIP_REASON = (
    "SGLang 0.5.23's source not found: run .ci/run (it installs .venv-sglang) or set HYBRIDCTL_SGLANG_VENV "
    "(a venv with sglang 0.5.23) or HYBRIDCTL_SGLANG_SRT (its sglang/srt directory)"
)


SRT = sglang_srt()


def lift(path: Path, names: set[str] | None = None, class_name: str | None = None) -> list[ast.stmt]:
    """Top-level statements of `path` without its imports: all, or only the defs/assignments in `names`;
    with `class_name`, that class's members instead (as plain functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes: list[ast.stmt] = tree.body
    if class_name is not None:
        nodes = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name).body
    out = []
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if names is not None:
            defined = {getattr(node, "name", None)} | {
                t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)
            }
            if not defined & names:
                continue
        out.append(node)
    return out


def exec_lifted(body: list[ast.stmt], path: Path, namespace: dict[str, Any]) -> dict[str, Any]:
    """Run lifted statements in `namespace` (tracebacks point at SGLang's file); returns the namespace."""
    module = ast.Module(body=body, type_ignores=[])
    ast.fix_missing_locations(module)
    exec(compile(module, str(path), "exec"), namespace)  # noqa: S102  (SGLang's own source, read from disk)
    return namespace
