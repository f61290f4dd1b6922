"""The three packages depend one way (docs/architecture.md, "Layers"): `runtime` and `hybridctl` each import only
themselves and `hybridshared`, and `hybridshared` imports neither. Read from the source with `ast`, lazy and
`TYPE_CHECKING` imports included; then checked live: importing every `hybridshared` module loads no torch and
nothing of the other two packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.import_graph import REPO, edges, find_cycle, graph, imports_of, module_paths

# What each package may import of ours, besides itself.
ALLOWED: dict[str, set[str]] = {
    "hybridshared": set(),
    "hybridctl": {"hybridshared"},
    "runtime": {"hybridshared"},
}


def test_packages_import_one_way() -> None:
    wrong = [
        f"{e.source}:{e.line} imports {e.target}"
        for e in edges()
        if e.target.split(".")[0] != e.source.split(".")[0]
        and e.target.split(".")[0] not in ALLOWED[e.source.split(".")[0]]
    ]
    assert not wrong, "imports across packages against the layering:\n" + "\n".join(wrong)


def test_shared_layer_has_no_module_cycle() -> None:
    cycle = find_cycle(graph(("hybridshared",)))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_shared_layer_loads_no_torch_and_neither_package() -> None:
    modules = sorted(m for m in module_paths(("hybridshared",)))
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'hybridctl', 'runtime'))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip() == "[]", f"importing hybridshared loaded: {out.strip()}"


def test_the_reader_sees_a_lazy_cross_package_import(tmp_path: Path) -> None:
    """The edge reader itself: an import inside a function is an edge, marked lazy."""
    path = tmp_path / "a.py"
    path.write_text("def f():\n    from runtime.engine.api import start_engine\n")
    found = imports_of(path, {"runtime.engine.api"})
    assert [(e.target, e.in_function) for e in found] == [("runtime.engine.api", True)]
