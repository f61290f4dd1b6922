"""Every printed command is one shell line that parses back to the exact argv: paste it and the same thing runs.

The library fuzz builds plans for both engines (one server and PD) from configs whose strings carry spaces, quotes,
`$`, `;`, backslashes, non-ASCII and empty values; the CLI cases check the last line of `launch --dry-run` against
the argv of `launch --dry-run --json`, and that the shell really runs it as that argv.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hybridctl.cli import app
from hybridctl.config.schema import HybridConfig
from hybridctl.launch.command import EngineCommand, flags_to_argv
from hybridctl.launch.plan import make_launch_plan

# Printable text TOML and argv can both hold (no NUL, no control characters), the shell's special ones included.
_TEXT = st.text(
    st.one_of(st.sampled_from(" \"'$`;|&<>()*?!#~\\{}[]=,%\t"), st.characters(min_codepoint=0x21, max_codepoint=0x2FF)),
    max_size=24,
)
_PATH = _TEXT.filter(lambda s: bool(s.strip()))


def _cfg(server: dict[str, object], extra: dict[str, object], pd: bool, spec_draft: str | None) -> HybridConfig:
    config: dict[str, object] = {"server": server, "extra_engine_args": extra}
    if pd:
        config["pd"] = {"enable_pd_disaggregation": True}
    if spec_draft is not None:
        config["speculative"] = {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": spec_draft}
    return HybridConfig.model_validate({"config": config, "settings": {}})


def _assert_round_trip(command: EngineCommand) -> None:
    line = command.shell()
    assert shlex.split(line) == command.argv, line


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model_path=_PATH,
    tokenizer_path=st.one_of(st.none(), _PATH),
    host=st.sampled_from(["127.0.0.1", "0.0.0.0", "::1", "localhost", "my host"]),
    served=_TEXT,
    engine=st.sampled_from(["sglang", "builtin"]),
    pd=st.booleans(),
    spec_draft=st.one_of(st.none(), _PATH),
)
def test_every_planned_command_parses_back_to_its_argv(
    model_path: str,
    tokenizer_path: str | None,
    host: str,
    served: str,
    engine: str,
    pd: bool,
    spec_draft: str | None,
) -> None:
    server: dict[str, object] = {"model_path": model_path, "host": host}
    if tokenizer_path is not None:
        server["tokenizer_path"] = tokenizer_path
    extra = {"served_model_name": served} if engine == "sglang" else {"served-model-name": served}
    cfg = _cfg(server, extra, pd, spec_draft)
    plan = make_launch_plan(cfg, engine, sglang_version="0.5.23", allow_ignored=True, python="python3")  # type: ignore[arg-type]
    for command in plan.commands:
        _assert_round_trip(command)
        if command.role != "router":
            assert command.argv[command.argv.index("--model-path") + 1] == model_path
            assert command.argv[command.argv.index("--served-model-name") + 1] == served


def test_an_empty_value_stays_an_argument_and_a_switch_stays_alone() -> None:
    # The family of `--host --port 30000`: a flag whose value is "" must not swallow the next flag.
    argv = flags_to_argv({"--host": "", "--port": "30000", "--trust-remote-code": None, "--served-model-name": ""})
    assert argv == ["--host", "", "--port", "30000", "--trust-remote-code", "--served-model-name", ""]
    cfg = _cfg({"model_path": "/m"}, {"served_model_name": ""}, False, None)
    command = make_launch_plan(cfg, "sglang", sglang_version="0.5.23", python="python3").commands[0]
    assert "--served-model-name ''" in command.shell()
    _assert_round_trip(command)


CLI_CASES = {
    "spaces and quotes": {"model_path": '/models/it\'s my "model" $HOME;x'},
    "wildcards and backslash": {"model_path": "/m/*?[a]\\b", "tokenizer_path": "/t/ {x} ~"},
    "non-ASCII": {"model_path": "/modèles/qwen 3 – next"},
    "hub id, all interfaces": {"model_path": "Qwen/Qwen3-Next-80B-A3B-Instruct", "host": "0.0.0.0"},
    "an empty value": {"model_path": "/m", "extra_engine_args.served-model-name": ""},
}


def _toml(keys: dict[str, str], engine: str) -> str:
    server = [f"{k} = {json.dumps(v)}" for k, v in keys.items() if "." not in k]
    extra = [f"{json.dumps(k.split('.')[1])} = {json.dumps(v)}" for k, v in keys.items() if "." in k]
    lines = ["[server]", f'engine = "{engine}"', *server, "[extra_engine_args]", *extra]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("engine", ["sglang", "builtin"])
@pytest.mark.parametrize("case", list(CLI_CASES))
def test_the_dry_run_line_is_the_command(tmp_path: Path, case: str, engine: str) -> None:
    keys = dict(CLI_CASES[case])
    if engine == "builtin" and "/" in keys["model_path"] and not keys["model_path"].startswith("/"):
        pytest.skip("the bundled runtime loads local directories only; validate refuses a hub id first")
    for key in ("model_path", "tokenizer_path"):  # launch refuses paths that do not exist: make them, odd names kept
        if keys.get(key, "").startswith("/"):
            where = tmp_path / keys[key].lstrip("/")
            where.mkdir(parents=True, exist_ok=True)
            (where / "config.json").write_text("{}")
            keys[key] = str(where)
    config = tmp_path / "config.toml"
    config.write_text(_toml(keys, engine))
    runner = CliRunner()
    text = runner.invoke(app, ["launch", str(config), "--dry-run"])
    as_json = runner.invoke(app, ["launch", str(config), "--dry-run", "--json"])
    assert text.exit_code == 0 and as_json.exit_code == 0, text.output + as_json.output
    argv = json.loads(as_json.stdout)["commands"][-1]["argv"]
    line = text.stdout.rstrip("\n").splitlines()[-1]
    assert shlex.split(line) == argv
    # And a real shell agrees: printf prints each argument it receives on its own line.
    shown = subprocess.run(["sh", "-c", "printf '%s\\n' " + line], capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    assert shown.splitlines() == argv
