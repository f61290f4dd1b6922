"""Speculative decoding through the real HTTP server: SGLang's meta_info / server_info / metrics fields, the
same greedy text as a server without it, and the start-up refusal when the state sandbox is off."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.runtime.conftest import REPO_ROOT, RunningServer, start_runtime_server

PROMPT = "The cache holds the state. The cache holds the state. The cache holds"


@pytest.fixture(scope="module")
def ngram_server(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    flags = ("--enable-metrics", "--memory-budget-gib", "1", "--speculative-algorithm", "NGRAM",
             "--speculative-num-steps", "3")  # fmt: skip
    with start_runtime_server(demo_model_dir, *flags, log_dir=tmp_path_factory.mktemp("spec-logs")) as server:
        yield server


def _generate(url: str, text: str, n: int = 24) -> dict:
    return _generate_body(url, {"text": text}, n)


def _generate_body(url: str, prompt: dict, n: int = 24) -> dict:
    body = prompt | {"sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}}
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("every_token", [False, True], ids=["text", "every-token"])
def test_meta_info_server_info_and_metrics_report_acceptance(
    ngram_server: RunningServer, demo_model_dir: Path, every_token: bool
) -> None:
    # Every token id of the vocabulary once: whatever the model emits occurred earlier, so every NGRAM round has
    # drafts to verify. The text prompt's output may never repeat it, and then its rounds are plain decode steps.
    vocab = json.loads((demo_model_dir / "config.json").read_text())["vocab_size"]
    prompt = {"input_ids": list(range(vocab))} if every_token else {"text": PROMPT}
    out = _generate_body(ngram_server.url, prompt)
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 24
    verify = meta["spec_verify_ct"]
    assert 1 <= verify <= 23
    assert meta["spec_accept_length"] == pytest.approx(24 / verify)
    proposed = meta["spec_num_proposed_drafts"]
    assert proposed % 3 == 0 and proposed <= 3 * verify
    if every_token:
        assert proposed == 3 * verify, "every round had a match, so every round verified 3 drafts"
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / proposed if proposed else 0)
    # Plain decoding would need 23 forwards after the first token; every accepted draft saves one.
    assert verify == 23 - meta["spec_num_correct_drafts"]

    info = httpx.get(f"{ngram_server.url}/server_info", timeout=30).json()
    assert info["speculative_algorithm"] == "NGRAM"
    assert info["speculative_num_steps"] == 3 and info["speculative_num_draft_tokens"] == 4
    state = info["internal_states"][0]
    assert state["spec_verify_calls_total"] >= verify
    assert state["avg_spec_accept_length"] >= 1.0

    text = httpx.get(f"{ngram_server.url}/metrics", timeout=30).text
    for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:spec_verify_calls_total"):
        assert re.search(rf"^{name}\{{.*\}} [0-9.e+-]+$", text, re.M), name
    calls = re.search(r"^sglang:spec_verify_calls_total\{.*\} ([0-9.e+]+)$", text, re.M)
    assert calls is not None and float(calls.group(1)) == state["spec_verify_calls_total"]


def test_same_greedy_text_as_a_server_without_spec(ngram_server: RunningServer, runtime_server: RunningServer) -> None:
    for prompt in (PROMPT, "Count from one to thirty in words: one, two, three,"):
        spec = _generate(ngram_server.url, prompt, 32)
        plain = _generate(runtime_server.url, prompt, 32)
        assert spec["output_ids"] == plain["output_ids"]
        assert "spec_verify_ct" not in plain["meta_info"]


def test_spec_without_the_state_sandbox_refuses_to_start(demo_model_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "--model-path", str(demo_model_dir), "--speculative-algorithm",
         "NGRAM", "--disable-mamba-state-sandbox", "--port", "1"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "Speculative decoding state rollback error" in proc.stderr
    assert "[speculative] enable_mamba_state_sandbox = true" in proc.stderr
