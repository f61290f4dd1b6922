"""Loading config.toml + settings.json: syntax, schema and file errors come back located, with a fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_files import with_model

from hybridctl.config.loader import ConfigError, load_hybrid_config
from hybridctl.config.schema import HybridConfig
from hybridctl.rules.check import check_files


def write(tmp_path: Path, config: str | bytes | None, settings: str | bytes | None) -> tuple[Path, Path]:
    cpath, spath = tmp_path / "config.toml", tmp_path / "settings.json"
    for path, content in ((cpath, config), (spath, settings)):
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content, encoding="utf-8")
    return cpath, spath


def only_error(tmp_path: Path, config: str | bytes | None, settings: str | bytes | None = None):
    cpath, spath = write(tmp_path, config, settings)
    with pytest.raises(ConfigError) as info:
        load_hybrid_config(cpath, spath)
    errors = info.value.findings
    assert len(errors) == 1, errors
    return errors[0]


def test_valid_files_load(tmp_path: Path) -> None:
    cpath, spath = write(
        tmp_path,
        '[server]\nport = 8080\nmodel_path = "/models/qwen3-next"\n[memory]\nmem_fraction_static = 0.8\n',
        '{"$schema": "./settings.schema.json", "runtime": {"schedule_policy": "lpm"}}',
    )
    cfg = load_hybrid_config(cpath, spath)
    assert isinstance(cfg, HybridConfig)
    assert cfg.config.server.port == 8080
    assert cfg.config.memory.mem_fraction_static == 0.8
    assert cfg.settings.runtime.schedule_policy == "lpm"


def test_missing_settings_means_defaults(tmp_path: Path) -> None:
    cpath, spath = write(tmp_path, with_model(tmp_path, "[server]\nport = 8080\n"), None)
    assert load_hybrid_config(cpath, spath).settings == HybridConfig().settings
    report = check_files(cpath, spath)
    assert report.ok and [f.code for f in report.findings] == ["SETTINGS_DEFAULTS"]


def test_missing_config_names_path_and_init(tmp_path: Path) -> None:
    err = only_error(tmp_path, None, "{}")
    assert err.code == "FILE_NOT_FOUND"
    assert str(tmp_path / "config.toml") in err.message
    assert "hybridctl init" in err.fix


def test_toml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    err = only_error(tmp_path, '[server]\nport = 8080\nhost = "x\n')
    assert err.code == "TOML_SYNTAX"
    assert err.line == 3 and err.column is not None
    assert "line 3" in err.fix


def test_json_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    err = only_error(tmp_path, "", '{\n  "runtime": {\n    "schedule_policy": "lpm",\n  }\n}')
    assert err.code == "JSON_SYNTAX"
    assert (err.line, err.column) == (4, 3)
    assert err.file.endswith("settings.json")


def test_unknown_key_did_you_mean_with_line(tmp_path: Path) -> None:
    err = only_error(tmp_path, '[server]\nhost = "0.0.0.0"\nprot = 8080\n')
    assert err.code == "UNKNOWN_KEY"
    assert err.key == "server.prot"
    assert (err.line, err.column) == (3, 1)
    assert "rename `prot` to `port`" in err.fix


def test_unknown_key_in_wrong_section_suggests_section(tmp_path: Path) -> None:
    err = only_error(tmp_path, "[memory]\nmamba_track_interval = 128\n")
    assert err.key == "memory.mamba_track_interval"
    assert "move `mamba_track_interval` from [memory] of" in err.fix and err.fix.endswith("to [cache].")


def test_key_of_the_other_file_says_where_it_belongs(tmp_path: Path) -> None:
    err = only_error(tmp_path, "[cache]\ndisable_radix_cache = true\n")
    assert "settings.json" in err.fix and '"runtime"' in err.fix


def test_json_unknown_key_located(tmp_path: Path) -> None:
    err = only_error(tmp_path, "", '{\n  "runtime": {\n    "schedule_polcy": "lpm"\n  }\n}')
    assert (err.code, err.key, err.line, err.column) == ("UNKNOWN_KEY", "runtime.schedule_polcy", 3, 5)
    assert "`schedule_policy`" in err.fix


def test_out_of_range_quotes_allowed_range(tmp_path: Path) -> None:
    err = only_error(tmp_path, "[server]\nport = 70000\n")
    assert err.code == "OUT_OF_RANGE"
    assert "1 ≤ value ≤ 65535" in err.message and "1 ≤ value ≤ 65535" in err.fix
    assert err.line == 2


def test_wrong_type_is_strict(tmp_path: Path) -> None:
    err = only_error(tmp_path, '[server]\nport = "8080"\n')
    assert err.code == "WRONG_TYPE" and "integer" in err.message


def test_invalid_choice_lists_choices(tmp_path: Path) -> None:
    err = only_error(tmp_path, '[server]\nengine = "vllm"\n')
    assert err.code == "INVALID_CHOICE"
    assert "auto, sglang, builtin" in err.message


def test_section_that_is_not_a_table(tmp_path: Path) -> None:
    err = only_error(tmp_path, "memory = 3\n")
    assert err.code == "WRONG_TYPE" and err.key == "memory"


def test_settings_top_level_not_an_object(tmp_path: Path) -> None:
    err = only_error(tmp_path, "", "[1, 2]")
    assert err.code == "WRONG_TYPE" and err.file.endswith("settings.json")


def test_settings_null_is_an_error(tmp_path: Path) -> None:
    err = only_error(tmp_path, "", "null")
    assert err.code == "WRONG_TYPE" and err.file.endswith("settings.json") and err.line == 1


def test_not_utf8(tmp_path: Path) -> None:
    err = only_error(tmp_path, b'[server]\nhost = "\xff"\n')
    assert err.code == "FILE_ENCODING" and err.line == 2


def test_all_errors_of_both_files_reported_together(tmp_path: Path) -> None:
    cpath, spath = write(tmp_path, "[server]\nport = 0\nprot = 1\n", '{"mamba": {"state_dtype": "int8"}}')
    with pytest.raises(ConfigError) as info:
        load_hybrid_config(cpath, spath)
    codes = sorted(f.code for f in info.value.findings)
    assert codes == ["INVALID_CHOICE", "OUT_OF_RANGE", "UNKNOWN_KEY"]
    text = str(info.value)
    assert "3 errors" in text and "config.toml:2:1" in text


def test_duplicate_json_key_warns(tmp_path: Path) -> None:
    cpath, spath = write(tmp_path, "", '{"runtime": {}, "runtime": {"schedule_policy": "lpm"}}')
    report = check_files(cpath, spath)
    assert [f.code for f in report.warnings] == ["DUPLICATE_KEY"]


def test_directory_instead_of_file(tmp_path: Path) -> None:
    (tmp_path / "config.toml").mkdir()
    report = check_files(tmp_path / "config.toml", tmp_path / "settings.json")
    assert [f.code for f in report.errors] == ["FILE_UNREADABLE"]
