"""A grammar that fails mid-generation fails its own request alone, in-process on the demo model: the batch's
other requests (constrained or not) finish with exactly the tokens they get alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.scheduler.grammar import GrammarBackend
from tests.runtime.test_engine_support import greedy, make_core, one_torch_thread, run_to_completion

pytest.importorskip("llguidance")


def test_a_broken_grammar_fails_alone(demo_model_dir: Path) -> None:
    with one_torch_thread():
        core = make_core(demo_model_dir, memory_budget_gib=0.5, max_mamba_cache_size=16)
        backend = GrammarBackend.load(demo_model_dir, 4096, [2])
        broken = backend.compile("regex", "x+")
        assert not broken.matcher.consume_token(2)  # EOS before any "x": the matcher enters its error state
        prompt = [40, 41, 42, 43]
        alone = run_to_completion(core, [GenerateRequest("free", prompt, greedy(6))], together=True).tokens("free")
        digits = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
        batch = [
            GenerateRequest("free", prompt, greedy(6)),
            GenerateRequest("broken", prompt, greedy(6), grammar=broken),
            GenerateRequest("digits", prompt, digits, grammar=backend.compile("regex", "[0-9]{3}")),
        ]
        got = run_to_completion(core, batch, together=True)
    failed = got.final("broken").finish_reason or {}
    assert failed["type"] == "abort" and failed["status_code"] == 500
    assert "grammar" in failed["message"]
    assert got.tokens("free") == alone
    text = core.tokenizer.decode(got.tokens("digits")[:-1]) if core.tokenizer else ""
    assert len(text) == 3 and text.isdigit(), text
    assert got.final("digits").finish_reason == {"type": "stop", "matched": got.tokens("digits")[-1]}


def test_an_unreadable_tokenizer_fails_the_constrained_request_alone(tmp_path: Path) -> None:
    """The vocabulary is read by the first grammar compiled, not at start-up: a tokenizer.json llguidance cannot
    parse fails that request with a message naming the file, and the backend stays usable for the next one."""
    from runtime.scheduler.grammar import GrammarError

    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    backend = GrammarBackend.load(tmp_path, 4096, [2])
    for _ in range(2):
        with pytest.raises(GrammarError, match="tokenizer.json"):
            backend.compile("regex", "[0-9]+")


def test_a_missing_tokenizer_fails_at_load(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        GrammarBackend.load(tmp_path, 4096, [2])
