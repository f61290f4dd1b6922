"""Relative model paths in config.toml are anchored at the config's directory, not the caller's cwd."""

from __future__ import annotations

import os
from pathlib import Path

from hybridctl.config.loader import load_hybrid_config


def _write(tmp: Path, model_path: str) -> Path:
    cfg = tmp / "deploy" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(f'[server]\nmodel_path = "{model_path}"\n')
    return cfg


def test_relative_model_dir_beside_config_resolves_from_any_cwd(tmp_path: Path, monkeypatch) -> None:
    cfg_path = _write(tmp_path, "models/tiny")
    (cfg_path.parent / "models" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # not the config's directory
    cfg = load_hybrid_config(cfg_path, cfg_path.parent / "settings.json")
    assert cfg.config.server.model_path == str(cfg_path.parent.resolve() / "models" / "tiny")
    assert os.path.isdir(cfg.config.server.model_path)


def test_hub_id_and_absolute_paths_are_left_alone(tmp_path: Path) -> None:
    cfg = load_hybrid_config(_write(tmp_path, "Qwen/Qwen3-Next-80B-A3B-Instruct"), tmp_path / "none.json")
    assert cfg.config.server.model_path == "Qwen/Qwen3-Next-80B-A3B-Instruct"
    cfg = load_hybrid_config(_write(tmp_path, "/abs/model"), tmp_path / "none.json")
    assert cfg.config.server.model_path == "/abs/model"
