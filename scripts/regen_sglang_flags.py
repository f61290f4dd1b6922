#!/usr/bin/env python3
"""Dump `python -m sglang.launch_server`'s flags from a real sglang install into hybridctl's flag table.

Run it with the interpreter that has sglang (e.g. the test venv):
    .venv-sglang/bin/python scripts/regen_sglang_flags.py           # -> hybridctl/data/sglang-<ver>-flags.tsv
    .venv-sglang/bin/python scripts/regen_sglang_flags.py --stdout   # prints it instead
Columns: options (space-separated, primary first), dest, type, default (repr), choices (comma-separated),
argparse action class. It only builds sglang's argument parser; it needs no GPU and starts no server.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import tempfile
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "hybridctl" / "data"
COLUMNS = ("options", "dest", "type", "default", "choices", "action")


def _clean(text: str) -> str:
    # The table is tab-separated, one flag a line; no value may carry either.
    return text.replace("\t", " ").replace("\n", " ")


def flag_rows() -> list[tuple[str, ...]]:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    rows = []
    for action in parser._actions:
        if not action.option_strings or "--help" in action.option_strings:
            continue
        type_name = getattr(action.type, "__name__", None) if action.type is not None else None
        choices = ",".join(str(c) for c in action.choices) if action.choices else ""
        rows.append(tuple(_clean(v) for v in (
            " ".join(action.option_strings), action.dest, str(type_name), repr(action.default), choices,
            type(action).__name__.lstrip("_"),
        )))  # fmt: skip
    return rows


def render(rows: list[tuple[str, ...]]) -> str:
    return "\n".join("\t".join(row) for row in [COLUMNS, *rows]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stdout", action="store_true", help="Print the table instead of writing it.")
    parser.add_argument(
        "--out", type=Path, help="Output file (default: hybridctl/data/sglang-<version>-flags.tsv)."
    )
    args = parser.parse_args()
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        print(
            f"sglang is not installed in {sys.executable}; run this with the sglang venv's python.",
            file=sys.stderr,
        )
        return 2
    text = render(flag_rows())
    if args.stdout:
        sys.stdout.write(text)
        return 0
    out = args.out or DATA_DIR / f"sglang-{version}-flags.tsv"
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)
    os.replace(tmp, out)  # atomic: readers see the old table or the new one
    print(f"wrote {out} ({text.count(chr(10)) - 1} flags of sglang {version})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
