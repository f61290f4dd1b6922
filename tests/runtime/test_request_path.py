"""One path per request: each sampling parameter is range-checked in exactly one place (SamplingParams in
runtime/core/requests.py, which every way in builds) and a change to one touches at most 5 files: the HTTP
mapping, the parser, the type with its check, the code that uses it, and its row in the docs' tables.

Read from the source (ast), so a second check or another module reading a parameter fails here by name."""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.core.requests import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
# The packages a request crosses; model code has its own `top_k` (experts per token), not this one.
REQUEST_PATH = ("core", "server", "scheduler", "engine", "pd", "spec")
CHECK_HOME = "runtime/core/requests.py"
FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))
# The names a field travels under besides its own: SGLang's /generate spelling.
ALIASES = {"seed": ("sampling_seed",)}
MAX_FILES = 5


def _spellings(field: str) -> tuple[str, ...]:
    return (field, *ALIASES.get(field, ()))


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for package in REQUEST_PATH:
        for path in sorted((ROOT / "runtime" / package).glob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def _is_literal_number(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp):
        return _is_literal_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_literal_number(node.left) and _is_literal_number(node.right)
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool)


def _named_field(node: ast.expr) -> str | None:
    """The sampling field an operand names: `temperature`, `x.temperature`, `values["temperature"]`."""
    name = None
    if isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Attribute):
        name = node.attr
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        name = node.slice.value
    return next((f for f in FIELDS if name in _spellings(f)), None)


def _refuses(body: list[ast.stmt]) -> bool:
    """A branch that refuses: it raises, or returns a message."""
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Raise):
                return True
            if isinstance(node, ast.Return) and isinstance(node.value, ast.JoinedStr | ast.Constant):
                return node.value is not None and not (
                    isinstance(node.value, ast.Constant) and not isinstance(node.value.value, str)
                )
    return False


def range_checks(tree: ast.AST) -> set[str]:
    """Fields compared with a literal number in an `if` that refuses, and fields named in a "<field> must"
    message."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _refuses(node.body):
            for compare in ast.walk(node.test):
                if isinstance(compare, ast.Compare):
                    operands = [compare.left, *compare.comparators]
                    if any(_is_literal_number(o) for o in operands):
                        found |= {f for o in operands if (f := _named_field(o)) is not None}
        text = ast.unparse(node) if isinstance(node, ast.JoinedStr) else None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        if text is not None:
            for field in FIELDS:
                if any(re.search(rf"(?<![\w.]){s}\b\W{{0,4}}\s*must\b", text) for s in _spellings(field)):
                    found.add(field)
    return found


def _sampling_names(tree: ast.AST) -> set[str]:
    """Local names that hold a SamplingParams: annotated as one (or a sequence of them), taken from a
    request's `.sampling`, or looped over such a sequence."""
    names = {"sampling"}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.arg)
            and node.annotation is not None
            and "SamplingParams" in ast.unparse(node.annotation)
        ):
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if "SamplingParams" in ast.unparse(node.annotation):
                names.add(node.target.id)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr == "sampling":
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.For | ast.comprehension):
            if {n.id for n in ast.walk(node.iter) if isinstance(n, ast.Name)} & names:
                names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return names


def _mapped_keys(tree: ast.Module) -> Iterator[str]:
    """Field names as data: a module-level table's keys and values, a subscript, a `.get()`."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and isinstance(stmt.value, ast.Dict):
            for item in [*stmt.value.keys, *stmt.value.values]:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    yield item.value
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if isinstance(node.slice.value, str):
                yield node.slice.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                yield node.args[0].value


def code_path(tree: ast.Module) -> set[str]:
    """The sampling fields a module reads off a SamplingParams or maps by name."""
    names = _sampling_names(tree)
    found = {f for k in _mapped_keys(tree) for f in FIELDS if k in _spellings(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "SamplingParams":  # the type declares them all
            found |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
        if isinstance(node, ast.Attribute) and node.attr in FIELDS:
            base = node.value
            if (isinstance(base, ast.Attribute) and base.attr == "sampling") or (
                isinstance(base, ast.Name) and base.id in names | {"self"}
            ):
                found.add(node.attr)
    return found


def docs_rows(field: str) -> set[str]:
    """Docs with a table row for the field."""
    out = set()
    for path in sorted((ROOT / "docs").glob("*.md")):
        rows = [line for line in path.read_text().splitlines() if line.startswith("| `")]
        if any(re.match(rf"\| `{s}`[ /|]", row) for row in rows for s in _spellings(field)):
            out.add(path.relative_to(ROOT).as_posix())
    return out


MODULES = dict(_modules())


def test_the_detectors_see_a_second_check_and_a_new_reader() -> None:
    """The scans below can fail: a check or a reader written the usual ways is seen."""
    assert range_checks(ast.parse("if temperature < 0:\n    raise ValueError('no')")) == {"temperature"}
    assert range_checks(ast.parse("def f(p):\n    if not 0 < p.top_p <= 1:\n        return 'bad'")) == {"top_p"}
    assert range_checks(ast.parse("def f(v):\n    raise E(f'{name(\"min_p\")} must be in [0, 1]')")) == {"min_p"}
    assert range_checks(ast.parse("if values['top_k'] >= 1 << 30:\n    values['top_k'] = -1")) == set()
    reader = "def f(req):\n    p = req.sampling\n    return p.min_p + req.sampling.top_p"
    assert code_path(ast.parse(reader)) == {"min_p", "top_p"}
    looped = "def f(params: list[SamplingParams]):\n    return [p.seed for p in params]"
    assert code_path(ast.parse(looped)) == {"seed"}


def test_each_sampling_parameter_is_range_checked_only_in_sampling_params() -> None:
    checked = {path: range_checks(tree) for path, tree in MODULES.items()}
    elsewhere = {path: sorted(fields) for path, fields in checked.items() if fields and path != CHECK_HOME}
    assert not elsewhere, f"sampling parameters checked outside {CHECK_HOME}: {elsewhere}"
    expected = {"temperature", "top_p", "top_k", "min_p", "max_new_tokens", "seed", "frequency_penalty",
                "presence_penalty", "repetition_penalty", "min_new_tokens", "logit_bias"}  # fmt: skip
    assert expected <= checked[CHECK_HOME], sorted(expected - checked[CHECK_HOME])


@pytest.mark.parametrize("field", FIELDS)
def test_a_sampling_parameter_crosses_at_most_five_files(field: str) -> None:
    files = {path for path, tree in MODULES.items() if field in code_path(tree)} | docs_rows(field)
    assert CHECK_HOME in files and any(f.startswith("docs/") for f in files), sorted(files)
    assert len(files) <= MAX_FILES, f"{field} crosses {len(files)} files: {sorted(files)}"


def test_pd_reaches_the_engine_through_its_public_operations() -> None:
    """PD (runtime/pd) stages and injects through EngineCore.before_release / admit_transferred, never
    through the scheduler inside it."""
    reach_ins = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "runtime" / "pd").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("scheduler", "on_release")
    ]
    assert not reach_ins, reach_ins


def test_the_prompt_is_checked_by_one_function() -> None:
    """The server (before it queues) and the scheduler (for an in-process request) refuse a prompt through
    core.requests.prompt_problem: its messages are written nowhere else."""
    phrases = ("prompt is empty", "is longer than the model's context length")
    written = {
        path
        for path, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and any(p in node.value for p in phrases)
        and "bytes of text" not in node.value  # limits.py's guard on the raw text, before tokenizing
    }
    assert written == {CHECK_HOME}, sorted(written)
