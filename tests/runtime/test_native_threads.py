"""The runtime's thread-count limits (runtime/native/threads.py): a pinned count from the environment, and the
cores a process may use, a cgroup CPU quota included."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from runtime.native.threads import cgroup_cpu_limit, pinned_from_env, usable_threads


@pytest.mark.parametrize(
    ("v2", "v1", "want"),
    [
        ("max 100000\n", None, None),
        ("150000 100000\n", None, 2),
        ("100000 100000\n", None, 1),
        ("20000 100000\n", None, 1),
        (None, ("-1", "100000"), None),
        (None, ("250000", "100000"), 3),
        (None, None, None),
        ("garbage\n", ("50000", "100000"), 1),
    ],
)
def test_cgroup_quota(tmp_path: Path, v2: str | None, v1: tuple[str, str] | None, want: int | None) -> None:
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2)
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(v1[0] + "\n")
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(v1[1] + "\n")
    assert cgroup_cpu_limit(tmp_path) == want


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5", " "])
def test_a_bad_pinned_count_names_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("RUNTIME_SOME_THREADS", raw)
    if raw.strip():
        with pytest.raises(ValueError, match="RUNTIME_SOME_THREADS"):
            pinned_from_env("RUNTIME_SOME_THREADS")
    else:
        assert pinned_from_env("RUNTIME_SOME_THREADS") is None


def test_usable_threads_is_within_the_process_limits() -> None:
    n = usable_threads()
    assert 1 <= n <= torch.get_num_threads()
    assert n <= len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit()
    assert limit is None or n <= limit
