"""The packaged SGLang flag table: parsed from the real argparse dump, looked up the way users write flags."""

from __future__ import annotations

import pytest

from hybridshared.flags.engine_flags import (
    available_versions,
    find_flag,
    nearest_version,
    parse_flag_table,
    sglang_flags,
)


def test_table_has_every_option() -> None:
    flags = sglang_flags("0.5.23")
    assert len(flags) == 531
    info = flags["--mamba-radix-cache-strategy"]
    assert info.dest == "mamba_radix_cache_strategy"
    assert info.choices == ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
    assert info.default == "'auto'" and info.takes_value


def test_aliases_and_switches() -> None:
    flags = sglang_flags()
    assert flags["--model-path"].aliases == ("--model",)
    assert not flags["--enable-unified-memory"].takes_value
    assert "--mamba-scheduler-strategy" not in flags  # renamed before 0.5.23


@pytest.mark.parametrize("spelling", ["--page-size", "page-size", "page_size"])
def test_find_flag_spellings(spelling: str) -> None:
    found = find_flag(spelling)
    assert found is not None and found.name == "--page-size"


def test_find_flag_alias_and_unknown() -> None:
    found = find_flag("model")
    assert found is not None and found.name == "--model-path"
    assert find_flag("no-such-flag") is None


def test_versions() -> None:
    assert "0.5.23" in available_versions()
    assert nearest_version("0.5.30") == "0.5.23"
    assert nearest_version("0.1.0") == available_versions()[0]
    with pytest.raises(KeyError, match="0.5.23"):
        sglang_flags("9.9.9")


def test_parse_boolean_optional_row() -> None:
    header = "options\tdest\ttype\tdefault\tchoices\taction\n"
    text = header + "--x --no-x\tx\tNone\tNone\t\tBooleanOptionalAction\n"
    [info] = parse_flag_table(text).values()
    assert info.aliases == ("--no-x",) and info.type is None and not info.takes_value
