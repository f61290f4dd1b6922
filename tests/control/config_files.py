"""Test helper: config text that names a model directory that exists (validate refuses a missing model_path)."""

from __future__ import annotations

from pathlib import Path


def with_model(tmp_path: Path, config: str) -> str:
    """`config` with [server] model_path = "model" (a directory beside it holding a config.json) unless set;
    added after the keys already there, so their line numbers do not move."""
    if "model_path" in config:
        return config
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}", encoding="utf-8")
    line = 'model_path = "model"\n'
    start = config.find("[server]\n")
    if start < 0:
        return config + ("" if config.endswith("\n") or not config else "\n") + "[server]\n" + line
    end = config.find("\n[", start)  # after the [server] table's own keys, so their lines stay put
    end = len(config) if end < 0 else end + 1
    body = config[:end] if config[:end].endswith("\n") else config[:end] + "\n"
    return body + line + config[end:]
