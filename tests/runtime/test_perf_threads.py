"""Thread handling of the hot path: decode-sized forwards on a chosen (or pinned) count, then the configured count
back; the same tokens whichever way a step is threaded; `python -m runtime` sleeps its OpenMP workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams
from runtime.engine import model_runner
from runtime.engine.decode_threads import DecodeThreadChooser
from runtime.engine.engine_core import EngineCore
from runtime.engine.native_decode import EXTEND_ENV


def _generate(core: EngineCore, prompts: list[list[int]], max_new: int) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}

    def on_output(o: RequestOutput) -> None:
        out.setdefault(o.rid, []).extend(o.new_token_ids)

    params = SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)
    for i, p in enumerate(prompts):
        core.scheduler.add_request(GenerateRequest(f"r{i}", p, params), on_output)
    while core.scheduler.has_work:
        core.step()
    return out


def test_serial_decode_restores_threads_and_keeps_tokens(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen: list[int] = []
    try:
        # The torch decode (the native decode is one C call on one thread, outside these choosers).
        core = EngineCore(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.25, native_decode="off"))
        forward = core.model.forward

        def spy(batch: object, buffers: object) -> torch.Tensor:
            seen.append(torch.get_num_threads())
            return forward(batch, buffers)  # type: ignore[arg-type]

        monkeypatch.setattr(core.model, "forward", spy)
        prompts = [[(7 * i + j) % 3000 + 5 for j in range(80 + 10 * i)] for i in range(3)]
        serial = _generate(core, prompts, 6)
        assert torch.get_num_threads() == 2  # restored after every step
        assert 2 in seen and 1 in seen  # each chooser tries both counts
        assert core.scheduler.flush_cache()
        monkeypatch.setattr(model_runner, "SERIAL_FORWARD_MAX_TOKENS", 0)
        core.runner.prefill_threads = DecodeThreadChooser.up_to(2, model_runner.PREFILL_THREADS_ENV, pinned=2)
        seen.clear()
        threaded = _generate(core, prompts, 6)
        assert set(seen) == {2}
        assert threaded == serial
    finally:
        torch.set_num_threads(before)


def test_small_forward_threads_pinned_by_env(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setenv(model_runner.SMALL_FORWARD_THREADS_ENV, "1")
        monkeypatch.setenv(model_runner.PREFILL_THREADS_ENV, "2")
        core = EngineCore(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.25, native_decode="off"))
        seen: list[tuple[int, int]] = []
        forward = core.model.forward

        def spy(batch: object, buffers: object) -> torch.Tensor:
            seen.append((batch.input_ids.numel(), torch.get_num_threads()))  # type: ignore[attr-defined]
            return forward(batch, buffers)  # type: ignore[arg-type]

        monkeypatch.setattr(core.model, "forward", spy)
        _generate(core, [[(5 * j) % 3000 + 5 for j in range(n)] for n in (20, 90)], 12)
        assert {t for n, t in seen if n <= model_runner.SERIAL_FORWARD_MAX_TOKENS} == {1}
        assert {t for n, t in seen if n > model_runner.SERIAL_FORWARD_MAX_TOKENS} == {2}
        monkeypatch.setenv(model_runner.SMALL_FORWARD_THREADS_ENV, "one")
        with pytest.raises(ValueError, match=model_runner.SMALL_FORWARD_THREADS_ENV):
            EngineCore(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.25))
    finally:
        torch.set_num_threads(before)


def test_prefill_threads_chosen_per_step_or_pinned(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefills (> SERIAL_FORWARD_MAX_TOKENS tokens) are no longer always on every thread: their own chooser tries
    one thread and all of them per token bucket (two threads lose 3-4x on a shared host), `RUNTIME_PREFILL_THREADS`
    pins the count, and the tokens are the same either way. The torch prefill's chooser: the native step's
    single-sequence extends (which would take these prompts) are off."""
    monkeypatch.setenv(EXTEND_ENV, "0")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs: dict[str, tuple[list[int], dict[str, list[int]]]] = {}
        for pin in ("", "1", "2"):
            monkeypatch.setenv(model_runner.PREFILL_THREADS_ENV, pin)
            core = EngineCore(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.25))
            seen: list[int] = []
            forward = core.model.forward

            def spy(batch: object, buffers: object, forward=forward, seen=seen) -> torch.Tensor:  # noqa: ANN001
                if batch.input_ids.numel() > model_runner.SERIAL_FORWARD_MAX_TOKENS:  # type: ignore[attr-defined]
                    seen.append(torch.get_num_threads())
                return forward(batch, buffers)  # type: ignore[arg-type]

            monkeypatch.setattr(core.model, "forward", spy)
            tokens: dict[str, list[int]] = {}
            for k in range(4):  # four prefills of one bucket (100-120 tokens), one after another
                prompt = [(11 * j + 3 * k) % 3000 + 5 for j in range(100 + 5 * k)]
                tokens.update({f"{k}-{rid}": t for rid, t in _generate(core, [prompt], 4).items()})
            assert torch.get_num_threads() == 2  # restored after every prefill
            runs[pin] = (seen, tokens)
        # adaptive: the bucket's first prefill on every thread; one thread only where the host hints at a busy core
        assert runs[""][0][0] == 2
        assert set(runs["1"][0]) == {1} and set(runs["2"][0]) == {2}
        assert runs[""][1] == runs["1"][1] == runs["2"][1]
        monkeypatch.setenv(model_runner.PREFILL_THREADS_ENV, "two")
        with pytest.raises(ValueError, match=model_runner.PREFILL_THREADS_ENV):
            EngineCore(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.25))
    finally:
        torch.set_num_threads(before)


def test_runtime_import_sets_a_short_spin_unless_set() -> None:
    code = "import runtime, os; print(os.environ['OMP_WAIT_POLICY'], os.environ.get('GOMP_SPINCOUNT'))"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}

    def seen(**extra: str) -> str:
        run = subprocess.run(
            [sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True, check=True
        )
        return run.stdout.strip()

    assert seen() == "PASSIVE 10000"  # sleep after a short spin
    assert seen(OMP_WAIT_POLICY="ACTIVE") == "ACTIVE None"  # the user's policy, libgomp's own spin count
    assert seen(OMP_WAIT_POLICY="PASSIVE") == "PASSIVE None"  # no spin at all
    assert seen(GOMP_SPINCOUNT="500") == "PASSIVE 500"
