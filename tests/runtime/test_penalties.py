"""SGLang 0.5.23's logit penalties (penaltylib/) and their request parsing, checked against its formulas.

frequency: logit -= f * count; presence: logit -= p if present; repetition (after the additive ones): a present
token's logit is multiplied by r when negative, divided by r when positive; min_new_tokens: EOS and stop ids
are -inf until that many tokens are out; logit_bias is added last. Only OUTPUT tokens count.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from runtime.core.requests import SamplingParams, continuation_seed
from runtime.scheduler.penalties import apply_penalties, penalize_row
from runtime.server.generate_request import RequestValueError, parse_sampling_params, prepare_request

LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.0])


def test_frequency_and_presence_follow_sglang_formulas() -> None:
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    out = penalize_row(LOGITS, p, [0, 0, 1, 3, 0], stop_ids=[])
    counts = [3, 1, 0, 1, 0, 0]
    want = [LOGITS[i].item() - 0.5 * c - (0.25 if c else 0.0) for i, c in enumerate(counts)]
    assert out.tolist() == pytest.approx(want)


def test_repetition_scales_by_sign_after_additive_penalties() -> None:
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0)
    out = penalize_row(LOGITS, p, [0, 4, 5], stop_ids=[])
    # token 0: 2 - 1 = 1 -> 1 / 2; token 4: -2 - 1 = -3 -> -3 * 2; token 5: 1 - 1 = 0 -> 0 / 2 (not negative)
    want = [0.5, -1.0, 0.5, 3.0, -6.0, 0.0]
    assert out.tolist() == pytest.approx(want)


def test_min_new_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    p = SamplingParams(min_new_tokens=2, stop_token_ids=[2])
    early = penalize_row(LOGITS, p, [1], stop_ids=[3, 2])
    assert math.isinf(early[3]) and early[3] < 0 and math.isinf(early[2]) and early[2] < 0
    assert early[0] == LOGITS[0] and early[5] == LOGITS[5]
    reached = penalize_row(LOGITS, p, [1, 1], stop_ids=[3, 2])
    assert torch.equal(reached, LOGITS)


def test_logit_bias_is_added_and_prompt_tokens_do_not_count() -> None:
    p = SamplingParams(logit_bias={4: 10.0, 1: -0.5})
    out = penalize_row(LOGITS, p, [], stop_ids=[])
    assert out[4] == pytest.approx(8.0) and out[1] == pytest.approx(-1.5) and out[0] == LOGITS[0]
    # No output yet: frequency/presence/repetition leave the row alone whatever the prompt was.
    assert torch.equal(penalize_row(LOGITS, SamplingParams(frequency_penalty=2.0), [], stop_ids=[]), LOGITS)


def test_apply_penalties_touches_only_rows_that_ask() -> None:
    logits = torch.stack([LOGITS, LOGITS])
    same = apply_penalties(logits, [SamplingParams(), SamplingParams()], [[0], [0]], eos_ids=[3])
    assert same is logits  # nothing to do: no copy, greedy unchanged
    out = apply_penalties(logits, [SamplingParams(), SamplingParams(presence_penalty=1.0)], [[0], [0]], eos_ids=[3])
    assert torch.equal(out[0], LOGITS) and out[1][0] == pytest.approx(1.0)
    # min_new_tokens holds EOS back even with ignore_eos, as SGLang's penalizer does
    held = apply_penalties(logits[:1], [SamplingParams(min_new_tokens=1, ignore_eos=True)], [[]], eos_ids=[3])
    assert math.isinf(held[0][3])


@pytest.mark.parametrize(
    ("raw", "names", "fragment"),
    [
        ({"frequency_penalty": 2.5}, None, "frequency_penalty must be in [-2, 2]"),
        ({"presence_penalty": -2.01}, None, "presence_penalty must be in [-2, 2]"),
        ({"repetition_penalty": 0}, None, "repetition_penalty must be in (0, 2]"),
        ({"repetition_penalty": 2.5}, None, "repetition_penalty must be in (0, 2]"),
        ({"min_new_tokens": -1}, None, "min_new_tokens must be >= 0"),
        ({"min_new_tokens": 20, "max_new_tokens": 10}, {"min_new_tokens": "min_tokens", "max_new_tokens": "max_tokens"},
         "min_tokens must be in [0, max_tokens(10)]"),
        ({"logit_bias": {"abc": 1}}, None, "logit_bias keys must be token ids"),
        ({"n": 0}, None, "n must be in [1, 128]"),
    ],
)  # fmt: skip
def test_out_of_range_values_are_refused_by_the_clients_name(raw: dict, names: dict | None, fragment: str) -> None:
    with pytest.raises(RequestValueError, match="^" + re.escape(fragment)):
        parse_sampling_params(raw, names)


def test_logit_bias_keys_outside_the_vocabulary_are_refused_at_prepare() -> None:
    parsed = parse_sampling_params({"logit_bias": {"5": 1.0, "0005": 2.0}})
    assert parsed.sampling.logit_bias == {5: 2.0}  # one token, the last value wins (SGLang dedups on int(key))
    prepare_request(0, [1, 2], parsed, "r", False, vocab_size=10, context_len=100)
    bad = parse_sampling_params({"logit_bias": {"10": 1.0}})
    with pytest.raises(RequestValueError, match=r"logit_bias must have keys in \[0, 9\], got 10"):
        prepare_request(0, [1, 2], bad, "r", False, vocab_size=10, context_len=100)


def test_min_new_tokens_is_clipped_with_max_new_tokens_by_the_context() -> None:
    parsed = parse_sampling_params({"min_new_tokens": 50})
    req = prepare_request(0, [1] * 90, parsed, "r", False, vocab_size=10, context_len=100).request
    assert req.sampling.max_new_tokens == 10 and req.sampling.min_new_tokens == 10


def held_stop_prefix(text: str, stops: list[str]) -> int:
    return SamplingParams(stop=stops).held_stop_prefix(text)


def test_held_stop_prefix() -> None:
    assert held_stop_prefix("hello wor", ["world"]) == 3
    assert held_stop_prefix("hello", ["xyz"]) == 0
    assert held_stop_prefix("abab", ["abc", "b"]) == 2  # the longest that may still grow into a stop
    assert held_stop_prefix("", ["a"]) == 0


def test_continuation_seeds_keep_the_first_and_differ_after() -> None:
    seeds = [continuation_seed(7, j) for j in range(8)]
    assert seeds[0] == 7 and len(set(seeds)) == 8
    assert all(0 <= s < 1 << 63 for s in seeds) and seeds == [continuation_seed(7, j) for j in range(8)]
