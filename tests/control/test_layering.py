"""The control plane's packages import one way (docs/architecture.md, "Control-plane layers"), read from the source
with `ast` (tests/import_graph.py): every import counts, lazy and `TYPE_CHECKING` ones included."""

from __future__ import annotations

from tests.import_graph import edges, find_cycle, graph

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
