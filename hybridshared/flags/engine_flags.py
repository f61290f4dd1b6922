"""SGLang's launch_server flags as package data, dumped from its real argparse parser.

The table lives in `hybridshared/data/sglang-<version>-flags.tsv` (columns: options, dest, type, default,
choices, action); `scripts/regen_sglang_flags.py` rewrites it from an installed sglang.
Reading it needs no sglang.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TypedDict

from hybridshared.flags.sglang_version import VersionError, version_key

DEFAULT_SGLANG_VERSION = "0.5.23"


@dataclass(frozen=True)
class FlagInfo:
    name: str  # the primary option string, e.g. "--model-path"
    dest: str  # the ServerArgs field, e.g. "model_path"
    type: str | None  # "int", "float", "str", ... as argparse reports it; None for flags without a value
    default: str | None  # Python repr of the default as argparse holds it ("None", "'auto'", "256", ...)
    choices: tuple[str, ...]
    action: str  # argparse action class: StoreAction, StoreTrueAction, BooleanOptionalAction, ...
    aliases: tuple[str, ...] = ()  # the other option strings ("--model" for "--model-path", "--no-x" for "--x")

    @property
    def takes_value(self) -> bool:
        return self.action not in {"StoreTrueAction", "StoreFalseAction", "BooleanOptionalAction"} and not (
            self.action.endswith("StoreTrueAction") or self.action.endswith("StoreConstAction")
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dest": self.dest,
            "type": self.type,
            "default": self.default,
            "choices": list(self.choices),
            "action": self.action,
            "aliases": list(self.aliases),
        }


RELEASES_FILE = "sglang-releases.json"


def _full_tables() -> list[str]:
    names = [p.name for p in resources.files("hybridshared.data").iterdir()]
    found = [
        n[len("sglang-") : -len("-flags.tsv")] for n in names if n.startswith("sglang-") and n.endswith("-flags.tsv")
    ]
    return sorted(found, key=version_key)


class ReleaseFacts(TypedDict, total=False):
    """Server-args behaviour a release changes without an error (scripts/regen_sglang_flags.py records it)."""

    radix_cache_disables_overlap_for: list[str]  # architectures
    radix_cache_disabled_for: list[str]
    pool_sizing_code: str  # "model_runner" or "kv_cache_mixin": sizing/release_sizing.py


class ReleaseDiff(TypedDict, total=False):
    """One older release in sglang-releases.json: flags it lacks and rows that differ from the next newer table."""

    removed: list[str]
    changed: dict[str, list[str]]
    facts: ReleaseFacts


@lru_cache(maxsize=1)
def _release_diffs() -> dict[str, ReleaseDiff]:
    """sglang-releases.json's releases (older ones, each a diff against the next newer; see the regen script)."""
    path = resources.files("hybridshared.data") / RELEASES_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))["releases"]


def available_versions() -> list[str]:
    """Versions that have a flag table in the package (full tables and the releases' diffs)."""
    held = [v for v, diff in _release_diffs().items() if "changed" in diff]
    return sorted({*_full_tables(), *held}, key=version_key)


def nearest_version(version: str) -> str:
    """The newest table not newer than `version` (else the oldest): flags rarely vanish in patch releases."""
    versions = available_versions()
    try:
        key = version_key(version)
    except VersionError:  # unreadable: the oldest table, the same as a version older than all of them
        return versions[0]
    older = [v for v in versions if version_key(v) <= key]
    return older[-1] if older else versions[0]


@lru_cache(maxsize=8)
def sglang_flags(version: str = DEFAULT_SGLANG_VERSION) -> dict[str, FlagInfo]:
    """Flags of `python -m sglang.launch_server` for `version`, keyed by primary option ("--page-size").

    Raises KeyError naming the available versions when there is no table for `version`; use `nearest_version`.
    """
    path = resources.files("hybridshared.data") / f"sglang-{version}-flags.tsv"
    if not path.is_file() and version in available_versions():
        return _from_diffs(version)
    if not path.is_file():
        raise KeyError(f"no SGLang flag table for version {version!r}; available: {', '.join(available_versions())}")
    return parse_flag_table(path.read_text(encoding="utf-8"))


def _from_diffs(version: str) -> dict[str, FlagInfo]:
    """An older release's table: the newest full table, then each release's diff downwards to `version`."""
    diffs = _release_diffs()
    newest = _full_tables()[-1]
    rows = {info.name: info for info in sglang_flags(newest).values()}
    for release in sorted(diffs, key=version_key, reverse=True):
        if version_key(release) < version_key(version):
            break
        diff = diffs[release]
        if "changed" not in diff:
            continue  # no table for that release: the next older one diffs against the last held one
        for name in diff.get("removed", []):
            rows.pop(name, None)
        for name, row in diff["changed"].items():
            rows[name] = _info(row)
    return rows


def _info(row: list[str]) -> FlagInfo:
    options = row[0].split()
    return FlagInfo(
        name=options[0], dest=row[1], type=None if row[2] in ("", "None") else row[2], default=row[3] or None,
        choices=tuple(c for c in row[4].split(",") if c), action=row[5], aliases=tuple(options[1:]),
    )  # fmt: skip


def parse_flag_table(text: str) -> dict[str, FlagInfo]:
    flags: dict[str, FlagInfo] = {}
    reader = csv.DictReader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
    for row in reader:
        options = row["options"].split()
        if not options:
            continue
        info = FlagInfo(
            name=options[0],
            dest=row["dest"],
            type=None if row["type"] in ("", "None") else row["type"],
            default=row["default"] or None,
            choices=tuple(c for c in (row["choices"] or "").split(",") if c),
            action=row["action"],
            aliases=tuple(options[1:]),
        )
        flags[info.name] = info
    return flags


def find_flag(name: str, version: str = DEFAULT_SGLANG_VERSION) -> FlagInfo | None:
    """Resolve what users write in `extra_engine_args`: "--page-size", "page-size", "page_size", alias."""
    flags = sglang_flags(version)
    bare = name.strip().lstrip("-")
    candidates = {f"--{bare}", f"--{bare.replace('_', '-')}"}
    for info in flags.values():
        if info.name in candidates or candidates.intersection(info.aliases) or info.dest == bare:
            return info
    return None


def release_facts(version: str) -> ReleaseFacts:
    """What sglang-releases.json records of `version`'s server-args behaviour ({} for the newest full tables)."""
    diff = _release_diffs().get(nearest_version(version))
    return ReleaseFacts(**diff.get("facts", {})) if diff else ReleaseFacts()


def first_release_with(flag: str) -> str | None:
    """The oldest held release whose launch_server has `flag` (None: none of them)."""
    for version in available_versions():
        if flag in sglang_flags(version):
            return version
    return None
