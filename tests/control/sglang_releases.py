"""Older SGLang releases' source for the tests: the wheel fetched once into the cache (.cache/sglang-wheels, or
$HYBRIDCTL_SGLANG_WHEELS), unpacked, read as text. Offline and uncached: the test skips, saying so.

CI fetches at most the three releases below (each test module asks only for these).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from sglang_release_source import WheelUnavailable, fetch_wheel, unpack, wheel_cache  # noqa: E402

# 0.5.6 (the articles' release), 0.5.10 (--mamba-scheduler-strategy, before the rename to
# --mamba-radix-cache-strategy in 0.5.14) and the newest.
HELD_IN_CI = ("0.5.6", "0.5.10", "0.5.23")


def release_srt(version: str) -> Path:
    """`sglang/srt` of the unpacked wheel of `version`; skips the test when it cannot be fetched."""
    try:
        wheel = fetch_wheel(version)
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang {version}'s wheel is not cached in {wheel_cache()} and cannot be fetched: {exc}")
    return unpack(wheel, wheel_cache() / version / "unpacked") / "sglang" / "srt"


def release_wheel(version: str) -> Path:
    try:
        return fetch_wheel(version)
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang {version}'s wheel is not cached in {wheel_cache()} and cannot be fetched: {exc}")
