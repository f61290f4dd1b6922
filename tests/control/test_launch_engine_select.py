"""Engine choice: explicit engines are taken as asked; auto needs a GPU (NVML) and an installed sglang."""

from __future__ import annotations

import sys

from hybridctl.host.probe import probe_host
from hybridctl.launch.plan import choose_engine


def test_explicit_engines_are_taken_as_asked() -> None:
    assert choose_engine("builtin").engine == "builtin"
    assert (
        choose_engine("sglang", "config.toml [server] engine =").reason
        == "config.toml [server] engine = sglang"
    )


def test_auto_follows_the_host() -> None:
    facts = probe_host()
    choice = choose_engine("auto")
    if facts.gpus and facts.sglang:
        assert choice.engine == "sglang" and facts.sglang.version in choice.reason
    else:
        assert choice.engine == "builtin"
        assert ("no NVIDIA GPU" in choice.reason) == (not facts.gpus)
        assert ("sglang not installed" in choice.reason) == (facts.sglang is None)


def test_choosing_never_imports_sglang() -> None:
    choose_engine("auto")
    assert "sglang" not in sys.modules
