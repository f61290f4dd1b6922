"""The import graph of our packages, read from the source with `ast` for the layering tests: every import counts,
the lazy ones inside functions and the `TYPE_CHECKING` ones included, so no edge can hide behind a deferred import."""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("hybridshared", "hybridctl", "runtime")


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, e.g. "hybridctl.config.loader"
    target: str  # imported module of ours
    line: int
    in_function: bool  # inside a function body (a lazy import)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def module_paths(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {module_name(p): p for package in packages for p in sorted((REPO / package).rglob("*.py"))}


def _function_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    lines.add(inner.lineno)
    return lines


def imports_of(path: Path, modules: set[str], roots: tuple[str, ...] = PACKAGES) -> list[Edge]:
    """The imports of `path` that name one of our modules (`from a.b import c` is `a.b.c` when that is a module,
    else `a.b`); an import of a package of ours that names no module we know still counts, as its package."""
    tree = ast.parse(path.read_text(), str(path))
    lazy = _function_lines(tree)
    source = module_name(path) if path.is_relative_to(REPO) else path.stem
    edges: list[Edge] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import; the layering checks read absolute imports only"
            names = [
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                for alias in node.names
            ]
        for name in names:
            if name.split(".")[0] not in roots:
                continue
            target = name
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != source:
                edges.append(Edge(source, target, node.lineno, node.lineno in lazy))
    return edges


def edges(packages: tuple[str, ...] = PACKAGES) -> list[Edge]:
    paths = module_paths(packages)
    modules = set(module_paths())
    return [edge for path in paths.values() for edge in imports_of(path, modules)]


def graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports."""
    out: dict[str, set[str]] = {name: set() for name in module_paths(packages)}
    for edge in edges(packages):
        if edge.target in out:
            out[edge.source].add(edge.target)
    return out


def find_cycle(nodes: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph `nodes` (its path, first node repeated at the end), or None."""
    state: dict[str, int] = defaultdict(int)  # 0 unvisited, 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(nodes.get(node, ())):
            if state[nxt] == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if state[nxt] == 0 and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(nodes):
        if state[start] == 0 and (found := visit(start)):
            return found
    return None
