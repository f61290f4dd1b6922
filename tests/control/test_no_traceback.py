"""Wrong input of every family to every command: an `error:` line (or a finding) that names the file or key, the
documented exit code, and never a Python traceback.

Each case runs `python -m hybridctl` in a subprocess, as a user would: the CLI entry's own handling is part of
what is checked. The families: bytes a text file should not hold (not UTF-8, NUL, a BOM, binary garbage,
nothing at all), paths the OS refuses (longer than a file name may be, under a file, a symlink loop, a directory
where a file belongs), values out of range (pids beyond pid_t, negative, JSON nested past the stack) and servers
that are not there. Exit codes are the documented ones: validate/plan/launch/doctor 2 for unusable input
(docs/configuration.md, planner.md, launch.md, doctor.md), status 2 for a corrupt state file and stop 2
(launch.md), verify/bench 2 for an unreachable server (verify.md, bench.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

LONG = "a" * 300  # one path component longer than any file system's NAME_MAX (255)
GOOD_CONFIG = '[server]\nmodel_path = "/models/m"\n'

# What a text file can hold that it should not.
ODD_BYTES: dict[str, bytes] = {
    "not-utf8": b'[server]\nmodel_path = "/models/\xff\xfe"\n',
    "nul-bytes": b'[server]\x00\nmodel_path = "/models/m\x00"\n',
    "bom-then-garbage": b"\xef\xbb\xbf\x00\x01\x02[[[",
    "binary": bytes(range(256)) * 8,
    "empty": b"",
}


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    code: int  # the documented exit code
    names: str  # what the message must name (a file, a key, an address)
    setup: Callable[[Path], None] = lambda d: None
    env: tuple[tuple[str, str], ...] = ()


def _write(name: str, data: bytes | str, with_config: bool = True) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        if with_config and name != "config.toml" and not (d / "config.toml").exists():
            (d / "config.toml").write_text(GOOD_CONFIG)

    return setup


def _state(entry: dict[str, object] | None = None, raw: bytes | None = None) -> Callable[[Path], None]:
    process = {"role": "server", "pid": 4242, "start_ticks": 1, "url": "http://127.0.0.1:30000",
               "log_path": "/tmp/x.log", "argv": ["python"]}  # fmt: skip
    process.update(entry or {})
    state = {"engine": "builtin", "url": "http://127.0.0.1:30000", "config_path": "c", "settings_path": "s",
             "started_at": 1.0, "processes": [process]}  # fmt: skip
    return _write(".hybridctl/server.json", raw if raw is not None else json.dumps(state).encode())


def _symlink_loop(name: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(Path(name).name, d / name)
        if not (d / "config.toml").exists():
            (d / "config.toml").write_text(GOOD_CONFIG)

    return setup


def _directory(name: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).mkdir(parents=True)
        if name != "config.toml":
            (d / "config.toml").write_text(GOOD_CONFIG)

    return setup


def _cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    config_commands = {
        "validate": ("validate", "config.toml"),
        "plan": ("plan", "config.toml", "--gpu-mem-gib", "80"),
        "launch": ("launch", "config.toml", "--dry-run"),
        "doctor": ("doctor", "config.toml", "--gpu-mem-gib", "80"),
    }
    # config.toml and settings.json holding bytes that are not a config.
    for family, data in ODD_BYTES.items():
        for cmd, args in config_commands.items():
            cases[f"{cmd}-config-{family}"] = Case(args, 2, "config.toml", _write("config.toml", data))
        cases[f"validate-settings-{family}"] = Case(
            ("validate", "config.toml"), 2, "settings.json", _write("settings.json", data)
        )
        cases[f"plan-settings-{family}"] = Case(
            ("plan", "config.toml", "--gpu-mem-gib", "80"), 2, "settings.json", _write("settings.json", data)
        )
    # JSON and TOML Python reads differently from the spec: nesting past the stack, numbers past its digit limit.
    odd_documents = {
        "settings-nested-too-deep": ("settings.json", "[" * 200_000),
        "settings-object-nested-too-deep": ("settings.json", '{"a":' * 200_000),
        "settings-5000-digit-number": ("settings.json", '{"a": ' + "9" * 5000 + "}"),
        "config-nested-too-deep": ("config.toml", "a = " + "[" * 200_000 + "]" * 200_000 + "\n"),
        "config-5000-digit-number": ("config.toml", '[server]\nmodel_path = "/m"\nport = ' + "9" * 5000 + "\n"),
    }
    for family, (name, text) in odd_documents.items():
        for cmd, args in config_commands.items():
            cases[f"{cmd}-{family}"] = Case(args, 2, name, _write(name, text))
    # Config values naming paths the OS cannot look up.
    values = {
        "model-relative-too-long": f'[server]\nmodel_path = "{LONG}"\n',
        "model-absolute-too-long": f'[server]\nmodel_path = "/{LONG}/m"\n',
        "model-nested-too-long": f'[server]\nmodel_path = "models/{LONG}/{LONG}"\n',
        "model-nul": '[server]\nmodel_path = "a\\u0000b"\n',
        "tokenizer-too-long": f'[server]\nmodel_path = "/models/m"\ntokenizer_path = "{LONG}"\n',
        "draft-too-long": (
            f'[server]\nmodel_path = "/models/m"\n[speculative]\nspeculative_draft_model_path = "{LONG}"\n'
        ),
    }
    keys = {"tokenizer-too-long": "tokenizer_path", "draft-too-long": "speculative_draft_model_path"}
    for family, text in values.items():
        key = keys.get(family, "model_path")
        for cmd, args in config_commands.items():
            if cmd == "plan" and family in keys:
                continue  # plan sizes from the model alone; /models/m is missing before these are read
            cases[f"{cmd}-{family}"] = Case(args, 2, key, _write("config.toml", text))
    # The config path itself: too long, under a file, a loop, a directory.
    paths = {
        "arg-too-long": (LONG + ".toml", lambda d: None),
        "arg-dir-too-long": (f"{LONG}/config.toml", lambda d: None),
        "arg-under-a-file": ("f/config.toml", _write("f", "x")),
        "arg-symlink-loop": ("loop.toml", _symlink_loop("loop.toml")),
        "arg-directory": ("dir.toml", _directory("dir.toml")),
    }
    for family, (arg, setup) in paths.items():
        shown = arg.split("/")[0][:40]
        cases[f"validate-{family}"] = Case(("validate", arg), 2, shown, setup)
        cases[f"plan-{family}"] = Case(("plan", arg, "--gpu-mem-gib", "80"), 2, shown, setup)
        cases[f"launch-{family}"] = Case(("launch", arg, "--dry-run"), 2, shown, setup)
        cases[f"validate-settings-{family}"] = Case(("validate", "config.toml", arg), 2, shown, setup)
        cases[f"doctor-log-{family}"] = Case(("doctor", "--log", arg), 2, "--log", setup)
    for family, arg in (("too-long", LONG), ("under-a-file", "f/out")):
        setup = _write("f", "x")
        cases[f"init-out-{family}"] = Case(("init", "--out", arg), 2, arg.split("/")[0][:40], setup)
        cases[f"schema-out-{family}"] = Case(("schema", "--out", arg), 2, arg.split("/")[0][:40], setup)
    cases["init-out-symlink-loop"] = Case(("init", "--out", "loop"), 2, "loop", _symlink_loop("loop"))
    cases["demo-out-symlink-loop"] = Case(("demo", "--out", "loop"), 2, "loop", _symlink_loop("loop"))
    cases["demo-out-too-long"] = Case(("demo", "--out", LONG), 2, LONG[:40])
    # The launch state file behind status and stop.
    states = {
        "pid-2^31": _state({"pid": 2**31}),
        "pid-2^63": _state({"pid": 2**63}),
        "pid-2^200": _state({"pid": 2**200}),
        "pid-negative": _state({"pid": -7}),
        "pid-negative-huge": _state({"pid": -(2**40)}),
        "pid-float": _state({"pid": 1e30}),
        "pid-string": _state({"pid": "12"}),
        "nested-too-deep": _state(raw=b"[" * 200_000),
        "not-utf8": _state(raw=b'{"engine": "\xff"}'),
        "nul-bytes": _state(raw=b'{"engine": "a\x00"}'),
        "bom": _state(raw=b"\xef\xbb\xbf{}"),
        "binary": _state(raw=bytes(range(256))),
        "empty": _state(raw=b""),
        "directory": _directory(".hybridctl/server.json"),
        "symlink-loop": _symlink_loop(".hybridctl/server.json"),
    }
    for family, setup in states.items():
        cases[f"status-state-{family}"] = Case(("status", "config.toml"), 2, "server.json", setup)
        cases[f"status-json-state-{family}"] = Case(("status", "config.toml", "--json"), 2, "server.json", setup)
        cases[f"stop-state-{family}"] = Case(("stop", "config.toml"), 2, "server.json", setup)
    cases["status-config-symlink-loop"] = Case(("status", "loop.toml"), 2, "loop.toml", _symlink_loop("loop.toml"))
    # Numbers past what they can mean: memory sizes (inf, 1e300) on the flags and in the config.
    for flag, value in (("--gpu-mem-gib", "inf"), ("--gpu-mem-gib", "1e300"), ("--pool-gib", "inf"),
                        ("--memory-budget-gib", "inf"), ("--mamba-full-memory-ratio", "inf"),
                        ("--pool-bytes", str(2**90))):  # fmt: skip
        cases[f"plan{flag}-{value[:6]}"] = Case(("plan", flag, value), 2, flag)
    for cmd in ("stop", "launch"):  # a timeout of inf is a deadline that never comes
        cases[f"{cmd}-timeout-inf"] = Case(
            (cmd, "config.toml", "--timeout", "inf"), 2, "--timeout", _write("config.toml", GOOD_CONFIG)
        )
    for flag in ("--context-len", "--concurrency"):  # a token count past int32 is no workload
        cases[f"init{flag}-2^80"] = Case(("init", "--out", "o", flag, str(2**80)), 2, flag)
    for cmd in (("init", "--out", "o"), ("doctor",)):
        cases[f"{cmd[0]}-gpu-mem-gib-inf"] = Case((*cmd, "--gpu-mem-gib", "inf"), 2, "--gpu-mem-gib")
    for key, value in (("gpu_mem_gib", "inf"), ("gpu_mem_gib", "1e300"), ("memory_budget_gib", "inf")):
        text = f'[server]\nmodel_path = "/models/m"\n[memory]\n{key} = {value}\n'
        for cmd, args in config_commands.items():
            named = "config.toml" if cmd == "doctor" else key  # doctor's summary names the file; -v the key
            cases[f"{cmd}-config-{key}-{value}"] = Case(args, 2, named, _write("config.toml", text))
    # Other files the commands read: a JSON schema for verify structured, the peer config of doctor.
    schemas = {"binary": bytes(range(256)), "nested-too-deep": b"[" * 200_000, "bom": b"\xef\xbb\xbf{}",
               "nul-bytes": b'{"type": "object\x00"}', "not-a-schema": b'{"type": 12}'}  # fmt: skip
    for family, data in schemas.items():
        args = ("verify", "structured", "--url", "http://127.0.0.1:9", "--schema", "schema.json")
        cases[f"verify-schema-{family}"] = Case(args, 2, "schema.json", _write("schema.json", data, with_config=False))
    for family, (arg, setup) in paths.items():
        cases[f"doctor-peer-{family}"] = Case(("doctor", "--peer", arg), 2, arg.split("/")[0][:40], setup)
    # A terminal whose encoding lacks what is printed (a path with non-ASCII, doctor's marks): "?" in its place.
    for encoding in ("ascii", "latin-1"):
        text = '[server]\nmodel_path = "/models/ü—✓/模型"\n'
        env = (("PYTHONIOENCODING", encoding),)
        for cmd, args in config_commands.items():
            named = "config.toml" if cmd == "doctor" else "model_path"
            cases[f"{cmd}-{encoding}-terminal"] = Case(args, 2, named, _write("config.toml", text), env=env)
    # doctor --log with bytes no log should hold: read, judged, never a crash (0: nothing found in them).
    for family, data in ODD_BYTES.items():
        setup = _write("server.log", data, with_config=False)
        cases[f"doctor-log-{family}"] = Case(("doctor", "--log", "server.log"), 0, "server.log", setup)
    # Servers that are not there.
    for family, url, names in (
        ("refused", "http://127.0.0.1:9", "cannot reach"),
        ("ipv6-refused", "http://[::1]:9", "cannot reach"),
        ("host-too-long", f"http://{LONG}.invalid:30000", "--url"),
        ("label-too-long", f"http://{'b' * 64}.example:30000", "--url"),
    ):
        cases[f"verify-{family}"] = Case(("verify", "basic", "--url", url), 2, names)
        cases[f"bench-{family}"] = Case(("bench", "--url", url, "--num-prompts", "2"), 2, names)
    # An API key an HTTP header cannot carry: named before any request is sent.
    for family, key in (("non-ascii", "clé-ü"), ("control-char", "a\x01b"), ("newline", "a\nInjected: 1")):
        env = (("HYBRIDCTL_TEST_KEY", key),)
        for cmd in (("verify", "basic"), ("bench",)):
            args = (*cmd, "--url", "http://127.0.0.1:9", "--api-key-env", "HYBRIDCTL_TEST_KEY")
            cases[f"{cmd[0]}-api-key-{family}"] = Case(args, 2, "HYBRIDCTL_TEST_KEY", env=env)
    return cases


CASES = _cases()


def _run(
    args: tuple[str, ...], cwd: Path, extra: tuple[tuple[str, str], ...] = ()
) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "COLUMNS": "80", **dict(extra)}
    env.pop("HYBRIDCTL_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "hybridctl", *args], cwd=cwd, capture_output=True, timeout=120, env=env
    )


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[bytes]]:
    """Every case's run, two subprocesses at a time (each is mostly one core's interpreter start-up): the module
    takes half the wall time, and each case is still its own test below."""
    dirs = {name: tmp_path_factory.mktemp(name[:60]) for name in CASES}
    for name, case in CASES.items():
        case.setup(dirs[name])
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(_run, case.args, dirs[name], case.env) for name, case in CASES.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_wrong_input_gets_a_named_error_and_the_documented_code(
    outcomes: dict[str, subprocess.CompletedProcess[bytes]], name: str
) -> None:
    case, proc = CASES[name], outcomes[name]
    out = (proc.stdout + proc.stderr).decode("utf-8", errors="replace")
    assert "Traceback" not in out, out
    assert "failed unexpectedly" not in out, out  # the CLI's safety net: a cause nobody handled
    assert proc.returncode == case.code, out
    assert case.names in out, out


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
@pytest.mark.parametrize(
    ("args", "target", "names"),
    [
        (("validate", "config.toml"), "config.toml", "config.toml"),
        (("validate", "config.toml"), "settings.json", "settings.json"),
        (("plan", "config.toml", "--gpu-mem-gib", "80"), "config.toml", "config.toml"),
        (("status", "config.toml"), ".hybridctl/server.json", "server.json"),
        (("doctor", "--log", "server.log"), "server.log", "server.log"),
    ],
)
def test_unreadable_files_are_named(tmp_path: Path, args: tuple[str, ...], target: str, names: str) -> None:
    _write(target, GOOD_CONFIG if target == "config.toml" else "{}")(tmp_path)
    (tmp_path / target).chmod(0)
    proc = _run(args, tmp_path)
    out = (proc.stdout + proc.stderr).decode("utf-8", errors="replace")
    assert "Traceback" not in out and "failed unexpectedly" not in out, out
    assert proc.returncode == 2 and names in out, out


def test_an_unexpected_failure_is_one_line_and_its_traceback_is_one_variable_away(tmp_path: Path) -> None:
    """An exception no command handles (a command added here that raises one, since every real cause the tests
    above know is handled) ends in one `error:` line naming the command, exit 2; HYBRIDCTL_DEBUG=1 shows the
    traceback."""
    code = (
        "import sys\n"
        "from hybridctl.cli import app, main\n"
        "@app.command('explode')\n"
        "def explode() -> None:\n"
        "    raise RuntimeError('disk on fire')\n"
        "sys.argv = ['hybridctl', 'explode']\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDCTL_DEBUG"}
    plain = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr, plain.stderr
    assert plain.stderr.startswith("error: hybridctl explode failed unexpectedly: RuntimeError: disk on fire")
    assert "HYBRIDCTL_DEBUG=1" in plain.stderr
    debug = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                           env={**env, "HYBRIDCTL_DEBUG": "1"})  # fmt: skip
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "disk on fire" in debug.stderr


def test_memory_flags_share_the_config_keys_bound() -> None:
    """The flags' bound is spelled in cli/config_args (no library import at `--help`); it is the schema's."""
    from hybridctl.cli import config_args
    from hybridshared import units

    assert config_args.MAX_MEMORY_GIB == units.MAX_MEMORY_GIB
    assert config_args.MAX_MEMORY_BYTES == units.MAX_MEMORY_BYTES


@pytest.mark.parametrize("model_path", [LONG, f"/{LONG}/model", "models/a\x00b"])
def test_the_runtime_names_a_model_path_the_os_cannot_look_up(model_path: str) -> None:
    """`python -m runtime` runs this check first (torch-free): a refusal naming the flag, exit 2, no OSError."""
    from runtime.preflight import PreflightError, check_model_dir

    with pytest.raises(PreflightError, match="--model-path .*(cannot be looked up|no such directory)"):
        check_model_dir(model_path)
