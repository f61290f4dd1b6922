"""A published SGLang release's source, read from its wheel: fetching (cached), and its own argument parser.

Used by scripts/regen_sglang_flags.py (the per-release flag data) and the release tests. A wheel is a zip, so
reading `sglang/srt/server_args.py` needs no install. Building the parser:
- `real_parser_probe`: the release's own module, imported from the unpacked wheel by an interpreter that has
  sglang's pure-Python dependencies (the test venv); releases from 0.5.22 import there.
- `lifted_parser`: for releases whose `ServerArgs.add_cli_args` is one function of `parser.add_argument` calls
  (0.5.6 - 0.5.13), that function is lifted out of the source with `ast` and run against real argparse; names it
  reads from modules it cannot import (attention backend lists built at import time, `get_device()`) resolve to
  inert stand-ins, so only flags built from such names can differ from the release's (none that hybridctl emits).
"""

from __future__ import annotations
import __future__

import argparse
import ast
import builtins
import importlib
import os
import subprocess
import sys
import types
import typing
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SERVER_ARGS = "sglang/srt/server_args.py"
ARG_UTILS = "sglang/srt/arg_groups/arg_utils.py"
ARGPARSE_ACTIONS = "sglang/srt/arg_groups/argparse_actions.py"  # 0.5.14 on: deprecated aliases' actions
# What `lifted_parser` reads, in order (a release lacks the later two before 0.5.14).
LIFTED_SOURCES = (ARGPARSE_ACTIONS, ARG_UTILS, SERVER_ARGS)


class WheelUnavailable(RuntimeError):
    """The release's wheel is neither cached nor downloadable (offline)."""


def wheel_cache() -> Path:
    return Path(os.environ.get("HYBRIDCTL_SGLANG_WHEELS", REPO / ".cache" / "sglang-wheels"))


def fetch_wheel(version: str, cache: Path | None = None) -> Path:
    """`pip download --no-deps sglang==version` into the cache (once); the wheel's path."""
    folder = (cache or wheel_cache()) / version
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"sglang=={version}", "-d", str(folder)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        raise WheelUnavailable(f"cannot download sglang=={version}: {proc.stderr.strip()[-300:]}")
    return found[0]


def read_source(wheel: Path, path: str) -> str | None:
    """One file of the wheel as text (None when the release has no such file)."""
    with zipfile.ZipFile(wheel) as zf:
        try:
            return zf.read(path).decode("utf-8")
        except KeyError:
            return None


def unpack(wheel: Path, dest: Path) -> Path:
    """The wheel unpacked once (what `pip install --no-deps --target` would lay out); returns the folder."""
    marker = dest / ".unpacked"
    if not marker.exists():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(dest)
        marker.write_text(wheel.name)
    return dest


class _InertMeta(type):
    """Stands for anything the lifted code reads from a module it cannot import (a type, so typing accepts it)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"{cls.__name__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _inert(f"{cls.__name__}()")

    def __getitem__(cls, key: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__

    def __bool__(cls) -> bool:
        return False  # an optional Arg(...) setting read off a stand-in counts as unset

    def __add__(cls, other: Any) -> Any:
        return other  # `BACKENDS_BUILT_AT_IMPORT + ["extra"]` keeps the literal part

    __radd__ = __add__


def _inert(name: str) -> Any:
    return _InertMeta(name, (), {})


class _Namespace(dict):
    def __missing__(self, key: str) -> Any:
        if hasattr(builtins, key):
            return getattr(builtins, key)
        return _inert(key)


def lifted_parser(sources: dict[str, str]) -> argparse.ArgumentParser:
    """The release's own `ServerArgs.add_cli_args(parser)`, run from its source text (see the module doc).

    `sources`: wheel path -> text of each of LIFTED_SOURCES the release has (None where it lacks one):
    server_args.py, and from 0.5.14 arg_groups/arg_utils.py (dataclass-driven flags) and argparse_actions.py.
    """
    name = "_sglang_release_server_args"
    # dataclasses looks the defining module up in sys.modules (for string annotations); a stand-in suffices.
    sys.modules.setdefault(name, types.ModuleType(name))
    ns = _Namespace(__builtins__=builtins, __name__=name)
    ns["get_type_hints"] = lambda cls, include_extras=False, **_kw: typing.get_type_hints(
        cls, globalns=ns, localns=ns, include_extras=include_extras
    )
    for path in LIFTED_SOURCES:
        if sources.get(path) is None:
            continue
        tree = ast.parse(sources[path], filename=path)
        for node in tree.body:
            _run(node, path, ns)
        if path == ARG_UTILS:  # server_args imports these names; its own lifted helpers come from here
            ns["get_type_hints"] = lambda cls, include_extras=False, **_kw: typing.get_type_hints(
                cls, globalns=ns, localns=ns, include_extras=include_extras
            )
    parser = _TolerantParser(prog="sglang serve")
    ns["ServerArgs"].add_cli_args(parser)
    return parser


class _TolerantParser(argparse.ArgumentParser):
    """Skips (and lists in `skipped`) a flag whose definition argparse refuses because of a stand-in value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skipped: list[str] = []

    def add_argument(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().add_argument(*args, **kwargs)
        except (ValueError, TypeError):
            if not any(isinstance(v, _InertMeta) for v in kwargs.values()):
                raise
            self.skipped.append(str(args[0]) if args else "?")
            return None


def _run(node: ast.stmt, filename: str, ns: dict[str, Any]) -> None:
    if isinstance(node, ast.Import | ast.ImportFrom):
        _import(node, ns)
        return
    module = ast.Module(body=[node], type_ignores=[])
    ast.fix_missing_locations(module)
    flags = __future__.annotations.compiler_flag
    try:
        exec(compile(module, filename, "exec", flags=flags, dont_inherit=True), ns)  # noqa: S102  (the release's source)
    except Exception:  # noqa: BLE001  a statement needing an unimportable module: its names stay inert
        pass


def _import(node: ast.Import | ast.ImportFrom, ns: dict[str, Any]) -> None:
    """Standard-library imports run for real; sglang's and third-party names stay inert (or lifted)."""
    if isinstance(node, ast.ImportFrom):
        root = (node.module or "").split(".")[0]
        if node.level or root not in sys.stdlib_module_names:
            return
        module = importlib.import_module(node.module or "")
        for alias in node.names:
            if alias.name != "*" and hasattr(module, alias.name):
                ns.setdefault(alias.asname or alias.name, getattr(module, alias.name))
        return
    for alias in node.names:
        if alias.name.split(".")[0] in sys.stdlib_module_names:
            top = importlib.import_module(alias.name)
            ns[alias.asname or alias.name.split(".")[0]] = (
                top if alias.asname else importlib.import_module(alias.name.split(".")[0])
            )


# Runs in an interpreter with sglang's pure-Python dependencies, PYTHONPATH = the unpacked wheel: dumps the
# parser's actions as JSON rows (the columns of hybridshared/data/sglang-<version>-flags.tsv).
REAL_PARSER_PROBE = r"""
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
rows = []
for a in parser._actions:
    if not a.option_strings or "--help" in a.option_strings:
        continue
    rows.append([" ".join(a.option_strings), a.dest, getattr(a.type, "__name__", None) if a.type else None,
                 repr(a.default), ([str(c) for c in a.choices] if not isinstance(a.choices, (set, frozenset))
                                   else sorted(str(c) for c in a.choices)) if a.choices else [],
                 type(a).__name__.lstrip("_")])
print(json.dumps(rows))
"""


def _choices(choices: Any) -> list[str]:
    """A set's order changes from run to run (string hashing): sorted; a list keeps the release's order."""
    if not choices:
        return []
    out = [str(c) for c in choices]
    return sorted(out) if isinstance(choices, set | frozenset) else out


def parser_rows(parser: argparse.ArgumentParser) -> list[list[Any]]:
    rows = []
    for a in parser._actions:
        if not a.option_strings or "--help" in a.option_strings:
            continue
        type_name = getattr(a.type, "__name__", None) if a.type is not None else None
        rows.append([
            " ".join(a.option_strings), a.dest, type_name, repr(a.default),
            _choices(a.choices), type(a).__name__.lstrip("_"),
        ])  # fmt: skip
    return rows
