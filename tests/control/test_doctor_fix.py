"""`doctor --fix`: edits keep TOML comments and JSON layout, are validated first and written atomically."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hybridctl.doctor.findings import Change, DoctorFinding
from hybridctl.doctor.fix import FixError, collect_changes, plan_edits, write_edits

CONFIG = """\
# Serving config for the hybrid model.
[server]
model_path = "/models/qwen3-next"  # local copy
engine = "sglang"

# The two pools.
[memory]
max_mamba_cache_size = 4 # far too few
mem_fraction_static = 0.85

[extra_engine_args]
mamba-scheduler-strategy = "extra_buffer"  # old flag name
"""


def finding(*changes: Change, severity: str = "error") -> DoctorFinding:
    return DoctorFinding("MAMBA_POOL_ALLOC", severity, "cause", "fix", tuple(changes))  # type: ignore[arg-type]


def test_toml_edit_keeps_comments_and_layout(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG, encoding="utf-8")
    changes = [
        Change("config.toml", "memory.max_mamba_cache_size", 40),
        Change("config.toml", "cache.mamba_track_interval", 512),
        Change("config.toml", "extra_engine_args.mamba-scheduler-strategy", None),
    ]
    (edit,) = plan_edits(changes, config, tmp_path / "settings.json")
    write_edits([edit])
    text = config.read_text(encoding="utf-8")
    assert (
        "# Serving config for the hybrid model." in text
        and "# local copy" in text
        and "# The two pools." in text
    )
    assert "max_mamba_cache_size = 40 # far too few" in text
    assert "mamba-scheduler-strategy" not in text
    assert "[cache]\nmamba_track_interval = 512" in text
    assert text.splitlines()[:4] == CONFIG.splitlines()[:4]
    assert edit.diff().count("\n-") == 2  # the changed value and the removed flag


@pytest.mark.parametrize("indent", ["    ", "\t", "  "])
def test_json_edit_keeps_indentation_and_order(tmp_path: Path, indent: str) -> None:
    settings = tmp_path / "settings.json"
    original = {
        "runtime": {"max_running_requests": 8, "schedule_policy": "lpm"},
        "mamba": {"state_dtype": "float32"},
    }
    settings.write_text(json.dumps(original, indent=indent) + "\n", encoding="utf-8")
    changes = [Change("settings.json", "mamba.state_snapshot_on_match", True)]
    (edit,) = plan_edits(changes, tmp_path / "config.toml", settings)
    write_edits([edit])
    text = settings.read_text(encoding="utf-8")
    assert text == json.dumps(
        {**original, "mamba": {"state_dtype": "float32", "state_snapshot_on_match": True}}, indent=indent
    ) + "\n"  # fmt: skip


def test_missing_settings_json_is_created(tmp_path: Path) -> None:
    settings = tmp_path / "settings.json"
    (edit,) = plan_edits(
        [Change("settings.json", "runtime.max_running_requests", 2)], tmp_path / "c.toml", settings
    )
    assert edit.before == ""
    write_edits([edit])
    assert json.loads(settings.read_text()) == {"runtime": {"max_running_requests": 2}}


def test_an_edit_that_would_not_validate_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG, encoding="utf-8")
    with pytest.raises(FixError, match="memory.mem_fraction_static"):
        plan_edits([Change("config.toml", "memory.mem_fraction_static", 1.5)], config, tmp_path / "s.json")
    assert config.read_text(encoding="utf-8") == CONFIG


def test_unchanged_file_gives_no_edit(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG, encoding="utf-8")
    assert (
        plan_edits([Change("config.toml", "memory.mem_fraction_static", 0.85)], config, tmp_path / "s") == []
    )


def test_write_is_atomic_and_keeps_the_mode(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG, encoding="utf-8")
    os.chmod(config, 0o600)
    (edit,) = plan_edits(
        [Change("config.toml", "memory.max_mamba_cache_size", 8)], config, tmp_path / "s.json"
    )
    write_edits([edit])
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]  # no temp file left behind


def test_most_severe_finding_wins_a_key() -> None:
    warn = finding(Change("config.toml", "memory.max_mamba_cache_size", 10), severity="warning")
    err = finding(Change("config.toml", "memory.max_mamba_cache_size", 40))
    (change,) = collect_changes([err, warn])
    assert change.value == 40
