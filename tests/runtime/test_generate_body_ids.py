"""/generate's token-id prompts (runtime/server/generate_request.py): exactly lists of JSON integers inside the
vocabulary are served; anything else is the request's own 400 with the reason."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.server.generate_request import (
    INLINE_CHECK_IDS,
    ContractError,
    RequestValueError,
    checked_inline,
    is_token_ids,
    parse_generate_body,
)

VOCAB = 1000


def _parse(ids: Any) -> list[int]:
    prepared, _, _ = parse_generate_body({"input_ids": ids}, encode=None, vocab_size=VOCAB, context_len=1 << 20)
    return prepared[0].request.input_ids


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=300))
def test_ids_in_the_vocabulary_are_served_as_sent(ids: list[int]) -> None:
    assert _parse(ids) == ids


@pytest.mark.parametrize("odd", [True, False, 1.0, "1", None, [1]])
@pytest.mark.parametrize("where", [0, -1])
def test_a_non_integer_anywhere_is_refused(odd: Any, where: int) -> None:
    ids = [5] * 50
    ids[where] = odd
    assert not is_token_ids(ids)
    with pytest.raises((ContractError, RequestValueError)):
        _parse(ids)


@pytest.mark.parametrize("bad", [-1, VOCAB, VOCAB + 7, -(2**70)])
def test_ids_outside_the_vocabulary_are_named(bad: int) -> None:
    with pytest.raises(RequestValueError, match=rf"outside the vocabulary \[0, {VOCAB}\): \[{bad}\]"):
        _parse([1, 2, bad, 3])


@pytest.mark.parametrize(
    ("prompt", "inline"),
    [
        ([5] * 2048, True),
        ([5] * (INLINE_CHECK_IDS + 1), False),
        ([[5] * 100, [6] * 100], True),
        ([[5] * INLINE_CHECK_IDS, [6]], False),
        ("a text", False),
        (["a", "b"], False),
        ([[1, 2], "a text"], False),
        ([1, "a"], True),  # refused at once, nothing to tokenize
        (None, True),
        (7, True),
        ([], True),
    ],
)
def test_only_small_token_id_prompts_are_checked_on_the_event_loop(prompt: Any, inline: bool) -> None:
    """Texts are tokenized on a worker thread, and so are id prompts too big to check in ~1 ms: the event loop
    keeps answering other requests meanwhile."""
    assert checked_inline(prompt) is inline
