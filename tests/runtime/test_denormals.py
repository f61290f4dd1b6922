"""FTZ/DAZ on the engine thread and the OpenMP workers it starts; the caller's threads keep IEEE denormals."""

from __future__ import annotations

import threading

import pytest
import torch

from runtime.engine.denormals import ENV, flush_denormals_on_this_thread

TINY = 1e-39  # a denormal float32


def _zero_fraction() -> float:
    """Multiply a denormal tensor by one on two intra-op threads: large enough that both threads take a part."""
    with torch.inference_mode():
        x = torch.full((1 << 21,), TINY)
        return float(((x * 1.0) == 0).float().mean())


def _on_new_thread(fn):
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(fn()))
    t.start()
    t.join()
    return result[0]


def test_flush_holds_on_the_thread_and_its_workers_only() -> None:
    def engine_thread() -> tuple[bool, float]:
        on = flush_denormals_on_this_thread()
        torch.set_num_threads(2)
        return on, _zero_fraction()

    on, flushed = _on_new_thread(engine_thread)
    if not on:
        pytest.skip("this CPU cannot flush denormals")
    assert flushed == 1.0  # every element, the workers' share included
    assert _on_new_thread(_zero_fraction) == 0.0  # a thread that did not ask keeps denormals
    assert _zero_fraction() == 0.0  # and so does the caller


def test_environment_keeps_denormals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "0")

    def engine_thread() -> tuple[bool, float]:
        return flush_denormals_on_this_thread(), _zero_fraction()

    assert _on_new_thread(engine_thread) == (False, 0.0)
