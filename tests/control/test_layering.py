"""The control plane's packages import one way (docs/architecture.md, "Control-plane layers"), read from the source
with `ast` (tests/import_graph.py): every import counts, lazy and `TYPE_CHECKING` ones included."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.import_graph import edges, find_cycle, graph, module_paths

# A package may import its own modules and those of packages with a LOWER rank, never an equal or higher one.
# Bottom: shared types and schema (config: schema, findings, loading; templates; host probing; log parsing),
# then the model names hybridctl bundles, then planner, launch and verify's checks, then the rule sets validate,
# doctor and launch share (rules), then what composes them (bench, doctor, init; demo runs init), then the commands.
RANKS: dict[str, int] = {
    "__init__": 0,
    "templates": 0,
    "host": 0,
    "logs": 0,
    "config": 1,
    "model": 1,
    "planner": 2,
    "launch": 2,
    "verify": 2,
    "rules": 3,
    "bench": 3,
    "doctor": 4,
    "init": 5,
    "demo": 6,
    "cli": 7,
    "__main__": 8,
}


# Imports inside functions, and why. The command modules (hybridctl/cli) import their libraries in the command
# bodies so that `hybridctl --help` loads the CLI modules only (tests/control/test_cli_help.py). Elsewhere a module
# imports at its top, so its dependencies read from there, except these third-party modules, loaded where used:
LAZY_THIRD_PARTY: dict[str, str] = {
    "matplotlib": "optional: bench plots only",
    "pynvml": "the NVIDIA driver's library, loaded only to probe a GPU",
    "starlette": "the [runtime] extra: the PD router only",
    "uvicorn": "the [runtime] extra: the PD router only",
    "tokenizers": "the [runtime] extra: token counts of verify's documents only",
}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_control_plane_package_has_a_rank() -> None:
    unranked = sorted({_package(m) for m in graph(("hybridctl",))} - set(RANKS))
    assert not unranked, f"hybridctl packages without a layer in RANKS: {unranked}"


def test_packages_import_only_lower_layers() -> None:
    wrong = []
    for edge in edges(("hybridctl",)):
        here, there = _package(edge.source), _package(edge.target)
        if edge.target.startswith("hybridctl") and there != here and RANKS[there] >= RANKS[here]:
            ranks = f"{here} {RANKS[here]}, {there} {RANKS[there]}"
            wrong.append(f"{edge.source}:{edge.line} -> {edge.target}  ({ranks})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_module_import_cycle() -> None:
    cycle = find_cycle(graph(("hybridctl",)))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _lazy_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import inside a function of `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import):
                    found += [(inner.lineno, alias.name) for alias in inner.names]
                elif isinstance(inner, ast.ImportFrom) and inner.module:
                    found.append((inner.lineno, inner.module))
    return sorted(set(found))


def test_function_level_imports_have_a_reason() -> None:
    wrong = [
        f"{module}:{line} imports {target} inside a function"
        for module, path in module_paths(("hybridctl", "hybridshared")).items()
        if not module.startswith("hybridctl.cli")
        for line, target in _lazy_imports(path)
        if target.split(".")[0] not in LAZY_THIRD_PARTY
    ]
    assert not wrong, "import at the module's top (or give the reason in LAZY_THIRD_PARTY):\n" + "\n".join(wrong)


def test_the_lazy_import_reader_sees_a_nested_import(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import os\n\n\ndef f():\n    if os:\n        from hybridctl.launch import plan\n")
    assert _lazy_imports(tmp_path / "m.py") == [(6, "hybridctl.launch")]
