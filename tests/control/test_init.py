"""`hybridctl init`: commented, valid files that load back; no overwrite without --force; --demo, --model."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import tomlkit
from typer.testing import CliRunner

from hybridctl.cli import app
from hybridctl.config.field_docs import iter_field_docs
from hybridctl.config.loader import load_hybrid_config
from hybridctl.config.schema import ConfigToml, HybridConfig
from hybridctl.host.nvml import gpu_memory_bytes
from hybridctl.rules.check import check_files

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
WRITTEN = ["config.toml", "settings.json", "config.schema.json", "settings.schema.json"]


def run(*args: str):
    return runner.invoke(app, list(args))


def test_init_round_trip(tmp_path: Path) -> None:
    result = run("init", "--out", str(tmp_path), "--engine", "sglang", "--tp", "2")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(WRITTEN)  # no temp files left behind
    report = check_files(tmp_path / "config.toml", tmp_path / "settings.json")
    assert [f.code for f in report.findings] == ["MODEL_PATH_MISSING"]  # no --model: the one key left to fill
    cfg = load_hybrid_config(tmp_path / "config.toml", tmp_path / "settings.json")
    expected = HybridConfig()
    expected.config.server.engine = "sglang"
    expected.config.server.tp_size = 2
    assert cfg == expected


def test_every_toml_key_has_a_comment(tmp_path: Path) -> None:
    assert run("init", "--out", str(tmp_path)).exit_code == 0
    lines = (tmp_path / "config.toml").read_text().splitlines()
    assert lines[0] == "#:schema ./config.schema.json"
    key_re = re.compile(r"^(#\s*)?([a-z_]+) = ")
    seen = set()
    section = ""
    for i, line in enumerate(lines):
        if line.startswith("["):
            section = line.strip("[]")
            continue
        match = key_re.match(line)
        if match and section != "extra_engine_args":
            seen.add(f"{section}.{match.group(2)}")
            assert lines[i - 1].startswith("# "), f"no comment above {line!r}"
    leaves = {d.dotted for d in iter_field_docs(ConfigToml) if not d.is_section and d.dotted != "extra_engine_args"}
    assert leaves <= seen, leaves - seen
    doc = tomlkit.parse((tmp_path / "config.toml").read_text())
    assert "extra_engine_args" in doc


def test_settings_json_names_its_schema(tmp_path: Path) -> None:
    assert run("init", "--out", str(tmp_path)).exit_code == 0
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["$schema"] == "./settings.schema.json"
    schema = json.loads((tmp_path / "settings.schema.json").read_text())
    assert schema["properties"]["runtime"]["description"]
    assert json.loads((tmp_path / "config.schema.json").read_text())["title"] == "hybridctl config.toml"


def test_no_overwrite_without_force(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("# mine\n")
    result = run("init", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "config.toml" in result.output and "--force" in result.output
    assert (tmp_path / "config.toml").read_text() == "# mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]  # nothing else written either
    forced = run("init", "--out", str(tmp_path), "--force")
    assert forced.exit_code == 0, forced.output
    assert (tmp_path / "config.toml").read_text().startswith("#:schema")


def test_json_output(tmp_path: Path) -> None:
    result = run("init", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert sorted(Path(f).name for f in data["files"]) == sorted(WRITTEN)
    assert data["plan"] is None and "--model" in data["plan_skipped"]
    assert data["config"]["server"]["port"] == 30000


def test_model_sizes_pools_with_the_planner(tmp_path: Path) -> None:
    model_dir = tmp_path / "qwen3-next"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((REPO / "templates/models/qwen3-next-80b-a3b.json").read_text())
    out = tmp_path / "out"
    result = run(
        "init",
        "--out",
        str(out),
        "--model",
        str(model_dir),
        "--gpu-mem-gib",
        "80",
        "--tp",
        "4",
        "--concurrency",
        "32",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    cfg = load_hybrid_config(out / "config.toml", out / "settings.json")
    assert cfg.config.server.model_path == str(model_dir.resolve())
    assert data["plan"]["max_running_requests"] == cfg.settings.runtime.max_running_requests == 32
    assert data["plan"]["max_total_num_tokens"] > 0
    # the planner's reason is written above the key it chose
    text = (out / "config.toml").read_text()
    assert "# init chose this value:" in text
    assert check_files(out / "config.toml", out / "settings.json").errors == []


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    result = run("init", "--out", str(tmp_path), "--model", str(tmp_path / "nope"))
    assert result.exit_code == 2
    assert "no such file or directory" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="--demo needs torch")
def test_demo_builds_model_and_points_config_at_it(tmp_path: Path) -> None:
    result = run("init", "--out", str(tmp_path), "--demo", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    cfg = load_hybrid_config(tmp_path / "config.toml", tmp_path / "settings.json")
    assert cfg.config.server.engine == "builtin"
    assert Path(cfg.config.server.model_path) == tmp_path.resolve() / "demo-model"
    assert (Path(cfg.config.server.model_path) / "config.json").is_file()
    assert data["demo_model"] == cfg.config.server.model_path
    assert check_files(tmp_path / "config.toml", tmp_path / "settings.json").errors == []
    again = run("init", "--out", str(tmp_path), "--demo", "--force")
    assert again.exit_code == 0, again.output  # --force also replaces the demo model


def test_model_that_does_not_fit_writes_nothing(tmp_path: Path) -> None:
    model = "Qwen/Qwen3-Next-80B-A3B-Instruct"  # hybridctl's bundled config.json: an 80B model
    result = run("init", "--out", str(tmp_path / "out"), "--model", model, "--gpu-mem-gib", "8", "--engine", "sglang")
    assert result.exit_code == 2
    assert "--tp" in result.output and "Nothing was written" in result.output
    assert not (tmp_path / "out").exists()


def test_choices_the_engine_refuses_write_nothing(tmp_path: Path) -> None:
    result = run("init", "--out", str(tmp_path), "--engine", "builtin", "--tp", "2")
    assert result.exit_code == 2
    assert "BUILTIN_UNSUPPORTED" in result.output and "tp_size" in result.output
    assert list(tmp_path.iterdir()) == []


def test_templates_dir_holds_the_base_templates() -> None:
    from hybridctl.templates import templates_dir

    base = templates_dir()
    assert (base / "config.toml").read_text().startswith("#:schema ./config.schema.json")
    assert json.loads((base / "settings.json").read_text()) == {"$schema": "./settings.schema.json"}


def test_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    from hybridctl.config.atomic_write import write_files

    (tmp_path / "config.toml").mkdir()
    (tmp_path / "config.toml" / "keep").write_text("x")
    with pytest.raises(OSError):
        write_files({tmp_path / "config.toml": "new"}, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]
    assert (tmp_path / "config.toml" / "keep").read_text() == "x"


# --- a model this host does not hold; the engine init records -------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "bundled"),
    [
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b"),
        ("/models/Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b"),
        ("/models/qwen3-next-80b-a3b-thinking-fp8/", "qwen3-next-80b-a3b"),
        ("/srv/Qwen3-Next-80B-A3B-Instruct/config.json", "qwen3-next-80b-a3b"),
        ("~/.cache/huggingface/hub/models--Qwen--Qwen3-Next-80B-A3B-Instruct/snapshots/0123abcd", "qwen3-next-80b-a3b"),
        ("Qwen/Qwen3.5-35B-A3B", "qwen3.5-35b-a3b"),
        ("qwen3_5-35b-a3b-fp8", "qwen3.5-35b-a3b"),
        ("moonshotai/Kimi-Linear-48B-A3B-Instruct", "kimi-linear-48b-a3b"),
        ("nvidia/Nemotron-H-8B-Base-8K", "nemotron-h-8b"),
        ("NVIDIA-Nemotron-H-8B-Reasoning-128K", "nemotron-h-8b"),
        ("tiiuae/Falcon-H1-7B-Instruct", "falcon-h1-7b"),
        ("ibm-granite/granite-4.0-h-small", "granite-4.0-h-small"),
        ("granite-4.0-H-Small-FP8", "granite-4.0-h-small"),
        # another size of a family is another geometry; other models are not guessed at
        ("tiiuae/Falcon-H1-34B-Instruct", None),
        ("nvidia/Nemotron-H-47B-Base-8K", None),
        ("Qwen/Qwen3-8B", None),
        ("instruct", None),
        ("", None),
    ],
)
def test_bundled_checkpoints_are_matched_as_users_type_them(typed: str, bundled: str | None) -> None:
    from hybridctl.model.bundled import match_bundled

    found = match_bundled(typed)
    assert (found.name if found else None) == bundled


@pytest.mark.parametrize("model", ["Qwen/Qwen3-Next-80B-A3B-Instruct", "/models/Qwen3-Next-80B-A3B-Instruct"])
def test_a_model_not_on_this_host_is_written_as_given(tmp_path: Path, model: str) -> None:
    result = run("init", "--out", str(tmp_path), "--model", model, "--tp", "4", "--gpu-mem-gib", "80", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "bundled config.json for qwen3-next-80b-a3b" in data["notes"]["server.model_path"]
    assert data["plan"]["max_total_num_tokens"] > 0  # sized from the bundled config
    cfg = load_hybrid_config(tmp_path / "config.toml", tmp_path / "settings.json")
    assert cfg.config.server.model_path == model
    warnings = [(f["code"], f["severity"]) for f in data["findings"]]
    # a path this host does not have is validate's warning (the server must hold it); a hub id SGLang downloads
    assert warnings == ([] if model.startswith("Qwen/") else [("MODEL_PATH_NOT_FOUND", "warning")])
    assert check_files(tmp_path / "config.toml", tmp_path / "settings.json").errors == []


def test_an_unknown_model_not_on_this_host_is_a_clear_error(tmp_path: Path) -> None:
    result = run("init", "--out", str(tmp_path), "--model", "meta-llama/Llama-3.1-8B-Instruct", "--engine", "sglang")
    assert result.exit_code == 2
    assert "pass a model directory or its config.json" in result.output.lower()
    assert "qwen3-next-80b-a3b" in result.output  # the names hybridctl knows without the files
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(gpu_memory_bytes() is not None, reason="NVML sees a GPU here; auto is decided by it")
def test_gpu_server_flags_record_sglang_where_auto_is_the_runtime(tmp_path: Path) -> None:
    """`--tp 4 --gpu-mem-gib 80` (no --engine) on a GPU-less host: what validate, plan and launch accept."""
    from hybridctl.launch.plan import auto_engine_here

    if auto_engine_here() != "builtin":
        pytest.skip("auto is SGLang here")
    model = "Qwen/Qwen3-Next-80B-A3B-Instruct"
    flags = ("--model", model, "--tp", "4", "--gpu-mem-gib", "80")
    result = run("init", "--out", str(tmp_path), *flags)
    assert result.exit_code == 0, result.output
    assert "server.engine: --tp 4 --gpu-mem-gib 80 describe a GPU server" in result.output
    cfg = load_hybrid_config(tmp_path / "config.toml", tmp_path / "settings.json")
    assert (cfg.config.server.engine, cfg.config.memory.gpu_mem_gib) == ("sglang", 80)
    report = check_files(tmp_path / "config.toml", tmp_path / "settings.json", auto_engine=auto_engine_here())
    assert [f for f in report.findings if f.severity != "info"] == []
    # plan reads the recorded GPU size: no flag to pass again
    plan = run("plan", str(tmp_path / "config.toml"), "--json")
    assert plan.exit_code == 0, plan.output
    again = run("init", "--out", str(tmp_path / "again"), *flags, "--json")
    assert json.loads(plan.stdout)["max_total_num_tokens"] == json.loads(again.stdout)["plan"]["max_total_num_tokens"]


@pytest.mark.skipif(gpu_memory_bytes() is not None, reason="NVML sees a GPU here; auto is decided by it")
def test_auto_that_cannot_serve_the_model_here_names_the_engine_flag(tmp_path: Path) -> None:
    from hybridctl.launch.plan import auto_engine_here

    if auto_engine_here() != "builtin":
        pytest.skip("auto is SGLang here")
    result = run("init", "--out", str(tmp_path), "--model", "Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert result.exit_code == 2
    assert "--engine sglang" in result.output and "Nothing was written" in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_config_file_is_not_a_model_path(tmp_path: Path) -> None:
    model = str(REPO / "templates/models/qwen3-next-80b-a3b.json")  # a file, not named config.json
    result = run("init", "--out", str(tmp_path), "--model", model, "--engine", "sglang")
    assert result.exit_code == 2
    assert "model directory" in result.output and "Nothing was written" in result.output
    assert list(tmp_path.iterdir()) == []


def test_next_step_without_a_model_is_the_one_launch_needs_first(tmp_path: Path) -> None:
    # launch refuses a config whose model_path is empty, so init does not send the user straight there
    result = run("init", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "set model_path in [server] of config.toml" in result.output
    launch = runner.invoke(app, ["launch", "--dry-run", str(tmp_path / "config.toml")])
    assert launch.exit_code == 2 and "MODEL_PATH_MISSING" in launch.output
