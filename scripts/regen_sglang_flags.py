#!/usr/bin/env python3
"""Dump `python -m sglang.launch_server`'s flags from a real sglang install into hybridctl's flag table.

Run it with the interpreter that has sglang (e.g. the test venv):
    .venv-sglang/bin/python scripts/regen_sglang_flags.py           # -> hybridshared/data/sglang-<ver>-flags.tsv
    .venv-sglang/bin/python scripts/regen_sglang_flags.py --stdout   # prints it instead
Columns: options (space-separated, primary first), dest, type, default (repr), choices (comma-separated),
argparse action class. It only builds sglang's argument parser; it needs no GPU and starts no server.

Older releases (hybridshared/data/sglang-releases.json: each release's flags as a diff against the next newer one,
down from the newest full table):
    python scripts/regen_sglang_flags.py --releases 0.5.6 0.5.7 ... [--sglang-python .venv-sglang/bin/python]
Each wheel is fetched once into .cache/sglang-wheels; its `ServerArgs.add_cli_args` is lifted from the source with
`ast` (0.5.6 - 0.5.13) or, where the release's module imports in the sglang venv (0.5.22 on), run there.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
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


def _row_key(row: list[object]) -> str:
    return str(row[0]).split()[0]


def _as_tsv_row(row: list[object]) -> list[str]:
    options, dest, type_name, default, choices, action = row
    return [_clean(str(v)) for v in (options, dest, str(type_name), default, ",".join(choices), action)]  # type: ignore[arg-type]


def release_rows(version: str, sglang_python: str | None) -> tuple[list[list[str]], str]:
    """(rows, how) of one release's parser: lifted from the source, else run in the sglang venv."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import subprocess

    from sglang_release_source import (
        LIFTED_SOURCES,
        REAL_PARSER_PROBE,
        fetch_wheel,
        lifted_parser,
        parser_rows,
        read_source,
        unpack,
        wheel_cache,
    )

    wheel = fetch_wheel(version)
    if sglang_python:  # the release's own module, where its imports resolve in that interpreter
        target = unpack(wheel, wheel_cache() / version / "unpacked")
        proc = subprocess.run(
            [sglang_python, "-c", REAL_PARSER_PROBE], capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "PYTHONPATH": str(target)}, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        if proc.returncode == 0:
            return [_as_tsv_row(r) for r in json.loads(proc.stdout.strip().splitlines()[-1])], "imported"
    sources = {path: read_source(wheel, path) for path in LIFTED_SOURCES}
    rows = parser_rows(lifted_parser(sources))  # type: ignore[arg-type]
    if len(rows) > 100:
        return [_as_tsv_row(r) for r in rows], "lifted"
    return [], "unavailable"


def release_facts(version: str) -> dict[str, object]:
    """Hybrid-model behaviour of the release's server-args post-processing, read off its source text."""
    from sglang_release_source import SERVER_ARGS, fetch_wheel, read_source

    wheel = fetch_wheel(version)
    text = read_source(wheel, SERVER_ARGS) or ""
    sizing = next(
        (name for name, path in (("kv_cache_configurator", "sglang/srt/mem_cache/kv_cache_configurator.py"),
                                 ("kv_cache_mixin", "sglang/srt/model_executor/model_runner_kv_cache_mixin.py"))
         if "_max_mamba_cache" in (read_source(wheel, path) or "")),
        "model_runner",
    )  # fmt: skip
    return {
        # "Disabling overlap schedule since MambaRadixCache is not compatible with overlap schedule"
        "radix_cache_disables_overlap_for": _archs_before(text, "MambaRadixCache is not compatible"),
        # "Disabling Radix Cache for {model_arch} as it is not yet supported."
        "radix_cache_disabled_for": [a for a in _archs_before(text, "Disabling Radix Cache for") if _hybrid(a)],
        "pool_sizing_code": sizing,
    }


def _hybrid(arch: str) -> bool:
    """One of the hybrid architectures hybridctl plans (the facts are about those)."""
    from hybridshared.model.errors import ModelShapeError
    from hybridshared.model.families import detect_family

    try:
        detect_family({"architectures": [arch]}, "")
    except ModelShapeError:
        return False
    return True


def _archs_before(text: str, marker: str) -> list[str]:
    """The architectures of the `model_arch in [...]` / `model_arch == "..."` branch each `marker` sits in."""
    found: list[str] = []
    for hit in re.finditer(re.escape(marker), text):
        head = text[: hit.start()]
        start = max(head.rfind("model_arch in ["), head.rfind("model_arch =="))
        if start < 0:
            continue
        end = head.find("]", start) + 1 if head.startswith("model_arch in [", start) else head.find("\n", start)
        found += [a for a in re.findall(r'"(\w+)"', head[start:end]) if a not in found and _hybrid(a)]
    return found


def write_releases(versions: list[str], sglang_python: str | None) -> Path:
    """hybridshared/data/sglang-releases.json: per release, the rows that differ from the next newer release."""
    from hybridshared.flags.engine_flags import parse_flag_table
    from hybridshared.flags.sglang_version import version_key

    base_version = max((p.name[len("sglang-") : -len("-flags.tsv")] for p in DATA_DIR.glob("sglang-*-flags.tsv")),
                       key=version_key)  # fmt: skip
    newer = {
        info.name: [" ".join((info.name, *info.aliases)), info.dest, str(info.type), info.default or "",
                    ",".join(info.choices), info.action]
        for info in parse_flag_table((DATA_DIR / f"sglang-{base_version}-flags.tsv").read_text()).values()
    }  # fmt: skip
    releases: dict[str, object] = {}
    for version in sorted(versions, key=version_key, reverse=True):
        if version_key(version) >= version_key(base_version):
            continue
        rows, how = release_rows(version, sglang_python)
        print(f"sglang {version}: {len(rows)} flags ({how})", file=sys.stderr)
        if not rows:
            releases[version] = {"source": how}
            continue
        mine = {_row_key(r): r for r in rows}
        releases[version] = {
            "source": how,
            "facts": release_facts(version),
            "removed": sorted(set(newer) - set(mine)),
            "changed": {k: r for k, r in sorted(mine.items()) if newer.get(k) != r},
        }
        newer = mine
    data = {
        "about": "SGLang launch_server flags per release, each a diff against the next newer one down from "
        f"sglang-{base_version}-flags.tsv; written by scripts/regen_sglang_flags.py --releases",
        "base": base_version,
        "releases": dict(sorted(releases.items(), key=lambda kv: version_key(kv[0]))),
    }
    out = DATA_DIR / "sglang-releases.json"
    text = json.dumps(data, indent=None, separators=(",", ":"), sort_keys=False)
    text = text.replace(',"0.', ',\n"0.')  # one release a line: reviewable diffs
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text + "\n")
    os.chmod(tmp, 0o644)  # mkstemp makes it private; it is package data
    os.replace(tmp, out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stdout", action="store_true", help="Print the table instead of writing it.")
    parser.add_argument("--out", type=Path, help="Output file (default: hybridshared/data/sglang-<version>-flags.tsv).")
    parser.add_argument("--releases", nargs="+", metavar="X", help="Write sglang-releases.json for these.")
    parser.add_argument("--sglang-python", help="Interpreter with sglang's pure-Python deps (imported parsers).")
    args = parser.parse_args()
    if args.releases:
        print(f"wrote {write_releases(args.releases, args.sglang_python)}")
        return 0
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
