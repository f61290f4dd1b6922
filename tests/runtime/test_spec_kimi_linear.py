"""Speculative decoding on Kimi-Linear (KDA recurrent layers + MLA): greedy output equals plain decoding.

The verify forward's per-position states come from the model's in-forward checkpoints, so every recurrent
layer that writes them is rolled back exactly, KDA included. (The earlier sandbox wrapped only Gated DeltaNet
and Mamba2 mixers: on Kimi-Linear a round committed states KDA never wrote, and outputs diverged after the
first round — each of these prompts differed from plain decoding within its first 9 tokens.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.core.requests import GenerateRequest
from tests.runtime.test_checkpoint_states import build_tiny_kimi_linear
from tests.runtime.test_engine_support import greedy, make_core, one_torch_thread, run_to_completion

PROMPTS = [[5, 9, 11, 3, 7, 2, 8], [1, 2, 3, 4, 5, 6, 1, 2, 3], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_kimi_linear(Path(tmp_path_factory.mktemp("kimi")) / "model")


def _tokens(model: Path, **overrides: object) -> tuple[list[list[int]], int]:
    core = make_core(model, **overrides)
    reqs = [GenerateRequest(f"r{i}", list(p), greedy(12)) for i, p in enumerate(PROMPTS)]
    got = run_to_completion(core, reqs, together=True)
    rounds = sum(got.final(f"r{i}").spec_verify_ct for i in range(len(PROMPTS)))
    return [got.tokens(f"r{i}") for i in range(len(PROMPTS))], rounds


@pytest.mark.parametrize("algorithm", ["NGRAM", "STANDALONE"])
def test_kimi_linear_spec_output_equals_plain_decoding(kimi_dir: Path, algorithm: str) -> None:
    reference, _ = _tokens(kimi_dir, disable_radix_cache=True, chunked_prefill_size=-1)
    spec: dict[str, object] = {"speculative_algorithm": algorithm, "speculative_num_steps": 3}
    if algorithm == "STANDALONE":
        spec["speculative_draft_model_path"] = str(kimi_dir)
    tokens, rounds = _tokens(kimi_dir, **spec)
    assert rounds > 0, "no verify round ran: the test would not exercise the rollback"
    assert tokens == reference
