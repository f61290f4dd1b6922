"""The runtime's packages import one way (docs/architecture.md, "Runtime layers"), read from the source with `ast`:
every import counts, the lazy ones inside functions and the `TYPE_CHECKING` ones included, so a cycle cannot
hide behind a deferred import."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"

# A package may import its own modules and those of packages with a LOWER rank, never an equal or higher one.
# core: shared types (no layer above leaks down); native: the C kernels' build and loading (nothing of ours);
# kvcache / models: memory and model code, each on core (and native) only;
# scheduler: batching and the prefix cache's use; speculative: speculative decoding, composed by the engine;
# engine: the engine loop and its thread; pd / server: what drives an engine. preflight: the torch-free option checks.
RANKS: dict[str, int] = {
    "core": 0,
    "native": 0,
    "kvcache": 1,
    "models": 1,
    "preflight": 2,
    "scheduler": 2,
    "speculative": 3,
    "engine": 4,
    "pd": 5,
    "server": 6,
    "demo_model": 6,
    "__main__": 7,
    "__init__": 7,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(RUNTIME.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The runtime modules `path` imports anywhere in its body (`from runtime.x import y` counts `runtime.x.y`
    when that is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import; the layering check reads absolute imports only"
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found.update(name for name in names if name in modules)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in RUNTIME.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) - {name} for name, path in paths.items()}


def test_every_runtime_package_has_a_rank() -> None:
    unranked = sorted({_package(m) for m in _graph()} - set(RANKS))
    assert not unranked, f"runtime packages without a layer in RANKS: {unranked}"


def test_packages_import_only_lower_layers() -> None:
    wrong: list[str] = []
    for module, targets in _graph().items():
        here = _package(module)
        for target in sorted(targets):
            there = _package(target)
            if there != here and RANKS[there] >= RANKS[here]:
                wrong.append(f"{module} -> {target}  ({here} rank {RANKS[here]}, {there} rank {RANKS[there]})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_models_and_kvcache_import_only_core() -> None:
    for module, targets in _graph().items():
        if _package(module) in ("models", "kvcache"):
            # native: the C kernels (rank 0, imports nothing of ours), which model layers call
            outside = {t for t in targets if _package(t) not in ("core", "native", _package(module))}
            assert not outside, f"{module} imports {sorted(outside)}; models/ and kvcache/ may import only core, native"


def test_no_module_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = defaultdict(int)  # 0 unvisited, 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state[nxt] == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if state[nxt] == 0:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if state[module] == 0:
            visit(module)


def _long_functions(limit: int) -> list[str]:
    found = []
    for path in sorted(RUNTIME.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = node.body[0]
                # The docstring is documentation, not body.
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and len(node.body) > 1:
                    first = node.body[1]
                lines = (node.end_lineno or node.lineno) - first.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(RUNTIME.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_the_check_sees_a_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """The graph reader itself: a lazy import inside a function is an edge."""
    (tmp_path / "a.py").write_text("def f():\n    from runtime.engine.api import start_engine\n")
    assert _imports(tmp_path / "a.py", {"runtime.engine.api"}) == {"runtime.engine.api"}


def test_no_runtime_function_over_80_lines() -> None:
    over = _long_functions(80)
    assert not over, "functions over 80 lines (split them):\n" + "\n".join(over)
