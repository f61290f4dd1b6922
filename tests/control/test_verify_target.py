"""Where verify and bench send requests (--url, else config.toml [server]); API keys only from the env."""

from __future__ import annotations

import pytest

from hybridctl.config.schema import HybridConfig
from hybridctl.verify.runner import TargetError, resolve_target, url_from_config


def test_url_from_config_reaches_wildcard_binds_on_loopback() -> None:
    cfg = HybridConfig()
    cfg.config.server.host, cfg.config.server.port = "0.0.0.0", 31000
    assert url_from_config(cfg) == "http://127.0.0.1:31000"
    cfg.config.server.host = "::1"
    assert url_from_config(cfg) == "http://[::1]:31000"
    cfg.config.server.host = "10.0.0.5"
    assert resolve_target(None, cfg, None).url == "http://10.0.0.5:31000"


def test_explicit_url_wins_and_bad_urls_are_refused() -> None:
    cfg = HybridConfig()
    assert resolve_target("http://h:1/", cfg, None).url == "http://h:1"
    with pytest.raises(TargetError, match="not an http"):
        resolve_target("h:1", None, None)
    with pytest.raises(TargetError, match="no server address"):
        resolve_target(None, None, None)


def test_api_key_comes_from_the_named_variable_and_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDCTL_KEY_FOR_TEST", "abc-secret")
    target = resolve_target("http://h:1", None, "HYBRIDCTL_KEY_FOR_TEST")
    assert target.headers() == {"Authorization": "Bearer abc-secret"}
    assert "abc-secret" not in repr(target)
    monkeypatch.delenv("HYBRIDCTL_KEY_FOR_TEST")
    with pytest.raises(TargetError, match="HYBRIDCTL_KEY_FOR_TEST.*unset"):
        resolve_target("http://h:1", None, "HYBRIDCTL_KEY_FOR_TEST")


def test_api_key_defaults_to_the_variable_the_config_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """`hybridctl launch` starts the server with config.toml's server.api_key_env; verify/bench with the same
    config send that key without repeating --api-key-env (not the upstream gateway's api.api_key_env)."""
    monkeypatch.setenv("HYBRIDCTL_CFG_KEY", "cfg-secret")
    cfg = HybridConfig()
    cfg.config.server.api_key_env = "HYBRIDCTL_CFG_KEY"
    gateway_only = HybridConfig()
    gateway_only.settings.api.api_key_env = "HYBRIDCTL_CFG_KEY"
    assert resolve_target("http://h:1", gateway_only, None).headers() == {}
    assert resolve_target("http://h:1", cfg, None).headers() == {"Authorization": "Bearer cfg-secret"}
    assert resolve_target("http://h:1", HybridConfig(), None).headers() == {}
    monkeypatch.delenv("HYBRIDCTL_CFG_KEY")
    assert resolve_target("http://h:1", cfg, None).headers() == {}  # unset: no key, not an error
