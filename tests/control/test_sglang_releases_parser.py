"""Every SGLang command hybridctl writes for an older release parses with that release's own parser.

For 0.5.6 and 0.5.10 (0.5.23: test_sglang_parser.py, through the real module in the sglang venv) the release's
`ServerArgs.add_cli_args` is lifted from its wheel (scripts/sglang_release_source.py) and the command of every
matrix case of test_sglang_parser.py goes through real argparse `parse_args`, landing on the fields the config
means; or `validate` refuses the config first, naming the release (and then the release's parser would indeed have
refused the command).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys

import pytest
from sglang_releases import REPO, release_wheel
from test_sglang_parser import CASES, _cfg

from hybridctl.launch.sglang import sglang_command
from hybridctl.launch.translate import LaunchError, translate
from hybridctl.rules.cross_file import check_rules
from hybridshared.flags.engine_flags import sglang_flags

sys.path.insert(0, str(REPO / "scripts"))
from sglang_release_source import LIFTED_SOURCES, lifted_parser, parser_rows, read_source  # noqa: E402

RELEASES = ("0.5.6", "0.5.10")
# What a field is called in the older releases (the strategy flag's rename in 0.5.14).
OLD_FIELD = {"mamba_radix_cache_strategy": "mamba_scheduler_strategy"}


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> tuple[str, argparse.ArgumentParser]:
    wheel = release_wheel(request.param)
    sources = {path: read_source(wheel, path) for path in LIFTED_SOURCES}
    return request.param, lifted_parser(sources)  # type: ignore[arg-type]


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | str:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(argv)
    except SystemExit:
        return err.getvalue().strip()


def test_the_shipped_table_is_that_releases_parser(release: tuple[str, argparse.ArgumentParser]) -> None:
    """hybridshared/data's table for the release (a diff chain from 0.5.23's) equals what its parser holds."""
    version, parser = release
    table = sglang_flags(version)
    rows = {row[0].split()[0]: row for row in parser_rows(parser)}
    assert set(rows) == set(table)
    for name, (options, dest, _type, default, choices, action) in rows.items():
        info = table[name]
        assert (" ".join((info.name, *info.aliases)), info.dest, info.action) == (options, dest, action), name
        assert (info.default or "", list(info.choices)) == (default, choices), name


@pytest.mark.parametrize(("name", "cfg", "expected"), CASES, ids=[c[0] for c in CASES])
def test_every_command_parses_with_the_releases_parser_or_validate_refuses(
    release: tuple[str, argparse.ArgumentParser], name: str, cfg: object, expected: dict[str, object]
) -> None:
    version, parser = release
    errors = [f for f in check_rules(cfg, version) if f.severity == "error"]  # type: ignore[arg-type]
    refusals = [f for f in errors if f.code.startswith("SGLANG_RELEASE")]
    try:
        argv = sglang_command(cfg, version).argv[3:]  # type: ignore[arg-type]
    except LaunchError as exc:  # launch refuses a key the release would ignore, naming the release
        assert f"SGLang {version}" in str(exc)
        return
    parsed = _parse(parser, argv)
    if refusals:
        assert all(f"SGLang {version}" in f.message for f in refusals)
        assert isinstance(parsed, str), f"validate refused {name} but {version}'s parser accepts {argv}"
        return
    assert not isinstance(parsed, str), f"{name}: SGLang {version} refuses {argv}: {parsed}"
    fields = vars(parsed)
    flags = translate(cfg, "sglang", version).flags  # type: ignore[arg-type]
    for field, value in expected.items():
        field = OLD_FIELD.get(field, field) if field not in fields else field
        if field not in fields:
            continue  # the release has no such setting; the mapping passes no flag for it (checked below)
        if value is None or not any(info.dest == field for info in sglang_flags(version).values()
                                    if info.name in flags or set(info.aliases) & set(flags)):  # fmt: skip
            continue  # hybridctl relies on the release's default there
        assert fields[field] == value, f"{name}: {field} = {fields[field]!r}, expected {value!r}"


def test_the_articles_float16_state_is_refused_for_0_5_6_naming_the_release_and_the_fix() -> None:
    cfg = _cfg(settings={"mamba": {"state_dtype": "float16"}})
    found = [f for f in check_rules(cfg, "0.5.6") if f.code == "SGLANG_RELEASE_VALUE"]
    assert len(found) == 1 and found[0].key == "mamba.state_dtype"
    assert "SGLang 0.5.6" in found[0].message and '"state_dtype": "bfloat16"' in found[0].fix
    assert not [f for f in check_rules(cfg, "0.5.10") if f.code == "SGLANG_RELEASE_VALUE"]


def test_a_key_only_newer_releases_have_names_the_first_release_with_it() -> None:
    cfg = _cfg({"cache": {"mamba_radix_cache_strategy": "extra_buffer"}})
    found = [f for f in check_rules(cfg, "0.5.6") if f.code == "SGLANG_RELEASE_KEY"]
    assert [f.key for f in found] == ["cache.mamba_radix_cache_strategy"]
    assert "SGLang 0.5.6" in found[0].message and "needs SGLang >= 0.5.7" in found[0].message
    assert not [f for f in check_rules(cfg, "0.5.10") if f.code == "SGLANG_RELEASE_KEY"]
    lazy = _cfg({"cache": {"mamba_radix_cache_strategy": "extra_buffer_lazy"}})
    found = [f for f in check_rules(lazy, "0.5.10") if f.code == "SGLANG_RELEASE_KEY"]
    assert found and "needs SGLang >= 0.5.13" in found[0].message


def test_the_mappings_version_gates_agree_with_every_held_releases_flags() -> None:
    """A gated flag exists in exactly the held releases its gate names, and a value it accepts is in the
    release's choices (the gates were bisected by hand; the data was read off each release's parser)."""
    from hybridctl.launch.mapping import ROWS
    from hybridshared.flags.engine_flags import available_versions
    from hybridshared.flags.sglang_version import version_key

    for row in ROWS:
        for target in row.sglang:
            if target.status != "flag" or not target.flag or not (target.since or target.until):
                continue
            for version in available_versions():
                options = {o: i for i in sglang_flags(version).values() for o in (i.name, *i.aliases)}
                if not target.applies_to(version):
                    # before `since` the flag is absent (after `until` a newer name took over), unless the same
                    # flag has another gate for that release (different accepted values)
                    same = any(t.flag == target.flag and t.applies_to(version) for t in row.sglang)
                    if not same and target.since and version_key(version) < version_key(target.since):
                        assert target.flag not in options, (row.key, target.flag, version)
                    continue
                assert target.flag in options, (row.key, target.flag, version)
                info = options[target.flag]
                if info.choices:
                    accepted = [c for c in info.choices if target.accepts(c, None)]
                    refused = [c for c in info.choices if not target.accepts(c, None)]
                    assert accepted and not refused, (row.key, version, refused)
