"""Test helper: config text that names a model directory that exists (validate refuses a missing model_path)."""

from __future__ import annotations

from pathlib import Path


def with_model(tmp_path: Path, config: str) -> str:
    """`config` with [server] model_path = "model" (a directory beside it holding a config.json) unless set."""
    if "model_path" in config:
        return config
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}", encoding="utf-8")
    line = 'model_path = "model"\n'
    if "[server]\n" in config:
        return config.replace("[server]\n", "[server]\n" + line, 1)
    return "[server]\n" + line + config
