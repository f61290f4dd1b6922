"""config.toml that tomlkit rejects, through `check_files` and `hybridctl validate`: a repeated key or table is a
DUPLICATE_KEY at its second definition (tomlkit reports it as a ParseError in new releases and as a bare
KeyAlreadyPresent in old ones), a legal repeat ([[array]] elements) is no finding, and every position counts
columns from 1. CI runs this file under the newest tomlkit and under the oldest pyproject.toml allows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridctl.rules.check import check_files

REPO = Path(__file__).resolve().parents[2]

DUPLICATES = [
    # (config.toml, the repeated key's dotted path, line, column of its second definition)
    ('[server]\nport = 1\nhost = "127.0.0.1"\nport = 2\n', "server.port", 4, 1),
    ("[server]\nport = 1\n  port = 2\n", "server.port", 3, 3),
    ('[server]\nport = 1\n[memory]\nmax_running_requests = 4\n[server]\nhost = "a"\n', "server", 5, 1),
    ("server.port = 1\nserver.port = 2\n", "server.port", 2, 1),
    ("[server]\nport = 1\n[memory]\n[server.port]\n", "server.port", 4, 1),
    ("[extra_engine_args]\na.b = 1\na.b = 2\n", "extra_engine_args.a.b", 3, 1),
    ("[a.b]\nx = 1\n[a.b]\ny = 2\n", "a.b", 3, 1),
    ("[[arr]]\nx = 1\nx = 2\n", "arr.x", 3, 1),
    ("[[arr]]\nx = 1\n[arr]\ny = 2\n", "arr", 3, 1),
    ("a = {x = 1, x = 2}\n", "a.x", 1, 13),
    ('"port" = 1\nport = 2\n', "port", 2, 1),
    ("a = 1\n[a.b]\nx = 1\n", "a", 2, 1),
    ("a.b = 1\n[a]\nc = 2\n", "a", 2, 1),  # tomlkit: "Redefinition of an existing table", no key named
    ('[fruit]\napple.color = "red"\n[fruit.apple]\nsmooth = true\n', "fruit.apple", 3, 1),
    ("[server]\r\nport = 1\r\nport = 2\r\n", "server.port", 3, 1),
]

LEGAL_REPEATS = [
    "[[arr]]\nx = 1\n[[arr]]\nx = 2\n",
    "[[arr]]\nx = 1\n[arr.sub]\ny = 1\n[[arr]]\nx = 2\n[arr.sub]\ny = 2\n",
    "[[a]]\n[[a.b]]\nx = 1\n[[a.b]]\nx = 2\n[[a]]\n[[a.b]]\nx = 3\n",
    "[a.b]\nx = 1\n[a]\ny = 2\n",  # a super-table defined after its sub-table, once
    '[fruit]\napple.color = "red"\n[fruit.apple.texture]\nsmooth = true\n',
    "a = {x = 1, y = 2}\nb = {x = 1}\n",
    'a = """\nb = 1\nb = 2\n"""\nb = 3\n',
    "a = [\n  [1, 2],\n  [3]\n]\nb = 1\n",
]

SYNTAX_ERRORS = [
    # (config.toml, line, 1-based column of the character tomlkit stopped at, part of the message)
    ('[server]\nport = 8080\nhost = "x\n', 3, 10, "missing closing quote"),
    ("[server\nport = 1\n", 1, 8, "Unexpected character"),
    ("a = foo\n", 1, 6, "Unexpected character: 'o'"),
    ("abc = 1 2\n", 1, 9, "Unexpected character: '2'"),
    ('[server]\nmodel_path = "/m"\n[extra_engine_args]\nfoo = [1,\n', 4, 1, "ends inside a value"),
]


def _check(tmp_path: Path, text: str):
    config = tmp_path / "config.toml"
    config.write_bytes(text.encode())
    return check_files(config, tmp_path / "settings.json")


@pytest.mark.parametrize(("text", "key", "line", "column"), DUPLICATES)
def test_a_repeated_key_or_table_is_located_at_its_second_definition(
    tmp_path: Path, text: str, key: str, line: int, column: int
) -> None:
    [error] = _check(tmp_path, text).errors
    assert (error.code, error.key, error.line, error.column) == ("DUPLICATE_KEY", key, line, column)
    assert f"`{key}` is defined more than once" in error.message
    assert f"at line {line} of" in error.fix


@pytest.mark.parametrize("text", LEGAL_REPEATS)
def test_legal_repeats_are_no_finding(tmp_path: Path, text: str) -> None:
    report = _check(tmp_path, text)
    assert not [f for f in report.findings if f.code in ("DUPLICATE_KEY", "TOML_SYNTAX")], report.findings


@pytest.mark.parametrize(("text", "line", "column", "says"), SYNTAX_ERRORS)
def test_syntax_errors_count_columns_from_one_and_end_in_one_full_stop(
    tmp_path: Path, text: str, line: int, column: int, says: str
) -> None:
    [error] = _check(tmp_path, text).errors
    assert (error.code, error.line, error.column) == ("TOML_SYNTAX", line, column)
    assert says in error.message and error.message.endswith(".") and ".." not in error.message
    assert " at line " not in error.message and "x00" not in error.message  # tomlkit's own suffix and marker
    assert f"line {line}, column {column}" in error.fix


def test_validate_prints_the_duplicate_where_an_editor_finds_it(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[server]\nport = 1\nhost = "127.0.0.1"\nport = 2\n')
    proc = subprocess.run(
        [sys.executable, "-m", "hybridctl", "validate", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{config}:4:1: error DUPLICATE_KEY server.port: `server.port` is defined more than once" in proc.stdout
    assert ".." not in proc.stdout and "TOML_SYNTAX" not in proc.stdout and "Traceback" not in proc.stderr
