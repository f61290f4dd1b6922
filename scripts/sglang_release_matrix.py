#!/usr/bin/env python3
"""The full release matrix: every SGLang release 0.5.6 - 0.5.23 against what hybridctl writes for it.

For each release and each configuration below: `validate`'s release findings, then the command
`hybridctl launch --dry-run --sglang-version X` prints, parsed by X's own argument parser (lifted from its wheel,
or imported in the sglang venv with --sglang-python). Writes docs/sglang-releases.md (or prints with --stdout).

    python scripts/sglang_release_matrix.py --sglang-python .venv-sglang/bin/python
Wheels are fetched once into .cache/sglang-wheels ($HYBRIDCTL_SGLANG_WHEELS).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_release_source import (  # noqa: E402
    LIFTED_SOURCES,
    WheelUnavailable,
    fetch_wheel,
    lifted_parser,
    read_source,
    unpack,
    wheel_cache,
)

from hybridctl.config.schema import HybridConfig  # noqa: E402
from hybridctl.launch.sglang import sglang_command  # noqa: E402
from hybridctl.launch.translate import LaunchError  # noqa: E402
from hybridctl.rules.cross_file import check_rules  # noqa: E402
from hybridshared.flags.engine_flags import available_versions, release_facts, sglang_flags  # noqa: E402
from hybridshared.sizing.release_sizing import release_sizing  # noqa: E402

RELEASES = (
    "0.5.6", "0.5.6.post1", "0.5.6.post2", "0.5.7", "0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1",
    "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16",
    "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)  # fmt: skip
MODEL = {"server": {"model_path": "/models/qwen3-next"}}
# The configurations: defaults, the articles' settings (fp16 state, MTP drafts, the elastic pool) one at a time,
# each strategy, and the prefix cache off.
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "article fp16 state": {"settings": {"mamba": {"state_dtype": "float16"}}},
    "bf16 state": {"settings": {"mamba": {"state_dtype": "bfloat16"}}},
    "extra_buffer": {"config": {"cache": {"mamba_radix_cache_strategy": "extra_buffer"}}},
    "no_buffer": {"config": {"cache": {"mamba_radix_cache_strategy": "no_buffer"}}},
    "extra_buffer_lazy": {"config": {"cache": {"mamba_radix_cache_strategy": "extra_buffer_lazy"}}},
    "prefix cache off": {"config": {"cache": {"enable_prefix_caching": False}}},
    "MTP drafts": {
        "config": {
            "speculative": {
                "speculative_algorithm": "NEXTN",
                "speculative_num_steps": 3,
                "speculative_num_draft_tokens": 4,
            }
        }
    },  # fmt: skip
    "elastic pool": {"config": {"memory": {"enable_elastic_memory_pool": True}}},
    "tp 4, page 64": {"config": {"server": {"tp_size": 4}, "cache": {"radix_cache_page_size": 64}}},
}

REAL_PARSE_PROBE = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
out = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
        out.append(None)
    except SystemExit:
        out.append(err.getvalue().strip().splitlines()[-1])
print(json.dumps(out))
"""


def config(variant: dict[str, Any]) -> HybridConfig:
    data: dict[str, Any] = {"config": json.loads(json.dumps(MODEL)), "settings": {}}
    for file, sections in variant.items():
        for section, values in sections.items():
            data[file].setdefault(section, {}).update(values)
    return HybridConfig.model_validate(data)


def parse_all(version: str, argvs: list[list[str]], sglang_python: str | None) -> tuple[list[str | None], str]:
    """Each argv's parser error (None: accepted), and which parser judged: imported | lifted | none."""
    wheel = fetch_wheel(version)
    if sglang_python:
        target = unpack(wheel, wheel_cache() / version / "unpacked")
        proc = subprocess.run(
            [sglang_python, "-c", REAL_PARSE_PROBE], input=json.dumps(argvs), capture_output=True, text=True,
            timeout=600, check=False, env={**os.environ, "PYTHONPATH": str(target)}, start_new_session=True,
        )  # fmt: skip
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1]), "imported"
    parser = lifted_parser({path: read_source(wheel, path) for path in LIFTED_SOURCES})
    if len(parser._actions) < 100:
        return [None] * len(argvs), "none"
    out: list[str | None] = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parser.parse_args(argv)
            out.append(None)
        except SystemExit:
            out.append(err.getvalue().strip().splitlines()[-1])
    return out, "lifted"


def judge(version: str, sglang_python: str | None) -> tuple[dict[str, str], str, bool]:
    """Per configuration: what validate / launch / the release's parser say; the parser used; all consistent."""
    cells: dict[str, str] = {}
    argvs: dict[str, list[str]] = {}
    refused: dict[str, str] = {}
    for name, variant in CONFIGS.items():
        cfg = config(variant)
        codes = sorted({f.code for f in check_rules(cfg, version) if f.severity == "error"})
        try:
            argvs[name] = sglang_command(cfg, version).argv[3:]
        except LaunchError:
            argvs[name] = []
        if codes:
            refused[name] = "validate refuses: " + ", ".join(codes)
        elif not argvs[name]:
            refused[name] = "launch refuses (key ignored)"
    names = [n for n in CONFIGS if argvs[n]]
    errors, how = parse_all(version, [argvs[n] for n in names], sglang_python)
    by_name = dict(zip(names, errors, strict=True))
    consistent = True
    for name in CONFIGS:
        error = by_name.get(name)
        if name in refused:
            cells[name] = refused[name] + (" (parser: rejects)" if error else "")
        elif how == "none":
            cells[name] = "not parsed (no parser)"
        elif error:
            cells[name] = f"**PARSER REJECTS**: {error}"
            consistent = False
        else:
            cells[name] = "parses"
    return cells, how, consistent


def _archs(archs: object) -> str:
    return ", ".join(str(a).removesuffix("ForCausalLM") for a in archs) if isinstance(archs, list) and archs else "—"


def render(rows: list[tuple[str, dict[str, str], str, bool]]) -> str:
    lines = [
        "# SGLang releases: what hybridctl writes for each, checked by the release's own parser",
        "",
        "<!-- Generated by `python scripts/sglang_release_matrix.py --sglang-python .venv-sglang/bin/python`; "
        "do not edit by hand. -->",
        "",
        "Commands target one release: `--sglang-version`, else the installed sglang, else `server.sglang_version`",
        "in config.toml, else the newest release hybridctl holds. `validate`, `plan` and `launch` say which.",
        "The flag data (hybridshared/data/sglang-releases.json) is each release's own `ServerArgs.add_cli_args`,",
        "lifted from its wheel with `ast`, or imported where the release's module imports without a GPU stack.",
        "",
        "## Per-release facts",
        "",
        "| release | flags | strategy flag | `--mamba-ssm-dtype` | elastic pool flag"
        " | radix cache turns overlap off for | radix cache off for | pool sizing (plan) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    held = available_versions()
    for version, _, how, _ in rows:
        if version not in held:
            lines.append(f"| {version} | no data ({how}) | | | | | | {release_sizing(version).code} |")
            continue
        table = sglang_flags(version)
        strategy = next((f for f in ("--mamba-radix-cache-strategy", "--mamba-scheduler-strategy") if f in table),
                        None)  # fmt: skip
        choices = ", ".join(table[strategy].choices) if strategy else ""
        dtype = ", ".join(table["--mamba-ssm-dtype"].choices)
        facts = release_facts(version)
        sizing = release_sizing(version)
        lines.append(
            f"| {version} | {len(table)} ({how}) | {f'`{strategy}` ({choices})' if strategy else 'none'} | {dtype} | "
            f"{'`--enable-unified-memory`' if '--enable-unified-memory' in table else 'none'} | "
            f"{_archs(facts.get('radix_cache_disables_overlap_for'))} | "
            f"{_archs(facts.get('radix_cache_disabled_for'))} | "
            f"{sizing.code} (verified on {sizing.verified_on}) |"
        )
    lines += ["", "## Dry-run commands through each release's parser", ""]
    names = list(CONFIGS)
    lines.append("| release | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for version, cells, _, _ in rows:
        lines.append(f"| {version} | " + " | ".join(cells[n].replace("|", "\\|") for n in names) + " |")
    lines += [
        "",
        "`validate refuses`: SGLANG_RELEASE_VALUE (a value outside the release's choices), SGLANG_RELEASE_KEY (a",
        "key only newer releases have a flag for), SGLANG_RELEASE_FLAG (a flag the release lacks); `(parser:",
        "rejects)` confirms the release's own parser would have refused the command. **PARSER REJECTS** would be",
        "a command hybridctl writes that the release refuses with no finding first: the matrix has none.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sglang-python", help="Interpreter with sglang's pure-Python deps (imported parsers).")
    parser.add_argument("--stdout", action="store_true")
    parser.add_argument("--releases", nargs="+", default=list(RELEASES))
    args = parser.parse_args()
    rows = []
    for version in args.releases:
        try:
            cells, how, consistent = judge(version, args.sglang_python)
        except WheelUnavailable as exc:
            print(f"{version}: {exc}", file=sys.stderr)
            continue
        print(f"{version}: {how}, {'ok' if consistent else 'PARSER REJECTS a command'}", file=sys.stderr)
        rows.append((version, cells, how, consistent))
    text = render(rows)
    if args.stdout:
        sys.stdout.write(text)
    else:
        from hybridctl.config.atomic_write import write_text_atomic

        write_text_atomic(REPO / "docs" / "sglang-releases.md", text)
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
