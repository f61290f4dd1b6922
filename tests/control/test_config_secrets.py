"""LITERAL_SECRET: literal credentials anywhere in either file are errors, and are never echoed back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridctl.config.secret_scan import classify_secret
from hybridctl.rules.check import check_files

SECRETS = [
    ("api_key", "sk-proj-4f9Kx2LmQ8vN1pR7tY3wZ6aB"),
    ("header", "Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig"),
    ("note", "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"),
    ("hub", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"),
    ("aws", "AKIAIOSFODNN7EXAMPLE"),
    ("base_url", "https://alice:pa55word@gateway.example.com/v1"),
    ("token", "plain-but-named-token"),
    ("misc", "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0LmNbVcXz"),
]
NOT_SECRETS = [
    ("model_path", "Qwen/Qwen3-Next-80B-A3B-Instruct"),
    ("model_path", "/models/nemotron-h-8b-base-8k/snapshots/0123456789abcdef0123456789abcdef01234567"),
    ("revision", "0123456789abcdef0123456789abcdef01234567"),
    ("api_key_env", "OPENAI_API_KEY"),
    ("base_url", "https://gateway.example.com/v1"),
    ("host", "127.0.0.1"),
    ("speculative_algorithm", "EAGLE3"),
    ("tokenizer_path", "deepseek-ai/DeepSeek-V3-0324-tokenizer-files-mirror"),
]


@pytest.mark.parametrize(("key", "value"), SECRETS)
def test_secret_detected(key: str, value: str) -> None:
    assert classify_secret(key, value)


@pytest.mark.parametrize(("key", "value"), NOT_SECRETS)
def test_ordinary_values_pass(key: str, value: str) -> None:
    assert classify_secret(key, value) is None


def test_secret_in_unknown_key_is_reported_and_never_printed(tmp_path: Path) -> None:
    secret = SECRETS[0][1]
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "settings.json").write_text(json.dumps({"api": {"api_key": secret}}, indent=2))
    report = check_files(tmp_path / "config.toml", tmp_path / "settings.json")
    codes = {f.code for f in report.errors}
    assert codes == {"UNKNOWN_KEY", "LITERAL_SECRET"}
    hit = next(f for f in report.errors if f.code == "LITERAL_SECRET")
    assert (hit.key, hit.line) == ("api.api_key", 3)
    assert "api_key_env" in hit.fix
    assert secret not in json.dumps(report.to_dict())


def test_secret_in_api_key_env_is_not_echoed(tmp_path: Path) -> None:
    secret = SECRETS[0][1]
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "settings.json").write_text(json.dumps({"api": {"api_key_env": secret}}))
    report = check_files(tmp_path / "config.toml", tmp_path / "settings.json")
    assert {f.code for f in report.errors} == {"INVALID_VALUE", "LITERAL_SECRET"}
    assert secret not in json.dumps(report.to_dict())
