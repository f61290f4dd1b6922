"""lm-evaluation-harness scores the local multiple-choice task (benchmarks/lm_eval_task/) with `local-completions`
against the runtime and with `hf` on the same weights: the same choice for every question.

Slow: installs lm-eval 0.4.13 into .cache/lm-eval-venv on first use (PyPI), then runs both harness passes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.runtime.conftest import start_runtime_server

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lm_eval_choices.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lm_eval_choices", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_lm_eval_picks_the_same_choices_on_the_runtime_and_on_transformers(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    script = _script()
    python = script.ensure_lm_eval()
    with start_runtime_server(demo_model_dir, "--dtype", "float32", "--served-model-name", "lm-eval-target") as server:
        refused = script.prompt_logprobs_supported(server.url)
        if refused is not None:  # completions echo + logprobs refused by the server
            pytest.skip(f"the runtime does not serve completions echo + logprobs yet: {refused}")
        report = script.evaluate(demo_model_dir, server.url, python, tmp_path)
    assert report["n"] == 12
    assert report["same_choices"] == report["n"], report["items"]
    assert report["max_abs_loglik_diff"] < 1e-2, report  # fp32 on both sides: the scores themselves agree
