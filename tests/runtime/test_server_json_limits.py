"""The request body's nesting limit (runtime/server/limits.py): refused exactly when deeper than MAX_JSON_DEPTH,
whether or not the bracket-count shortcut applies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.server.limits import MAX_JSON_DEPTH, BadJson, parse_json


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _nest(depth: int, leaf: Any, as_dict: bool) -> Any:
    for _ in range(depth):
        leaf = {"k": leaf} if as_dict else [leaf]
    return leaf


json_leaves = st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}ab"\\', max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(1, MAX_JSON_DEPTH + 3),
    padding=st.integers(0, 2 * MAX_JSON_DEPTH),
    as_dict=st.booleans(),
    leaf=json_leaves,
    bracket_strings=st.booleans(),
)
def test_refused_exactly_past_the_depth(
    depth: int, padding: int, as_dict: bool, leaf: Any, bracket_strings: bool
) -> None:
    # Siblings add brackets without depth (flat lists) or strings full of brackets: the count grows past the
    # limit while the depth stays, so both the shortcut and the walk are exercised.
    sibling: Any = "[{" * padding if bracket_strings else [[] for _ in range(padding)]
    doc = {"deep": _nest(depth, leaf, as_dict), "wide": sibling}
    raw = json.dumps(doc).encode()
    if _depth(doc) > MAX_JSON_DEPTH:
        with pytest.raises(BadJson, match="nested deeper"):
            parse_json(raw)
    else:
        assert parse_json(raw) == doc


@pytest.mark.parametrize("as_dict", [False, True])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, MAX_JSON_DEPTH + 2])
def test_the_boundary_without_padding(depth: int, as_dict: bool) -> None:
    # Exactly one opening bracket a level: the count equals the depth, the shortcut's own boundary.
    doc = _nest(depth, 1, as_dict)
    raw = json.dumps(doc).encode()
    if depth > MAX_JSON_DEPTH:
        with pytest.raises(BadJson, match="nested deeper"):
            parse_json(raw)
    else:
        assert parse_json(raw) == doc


def test_prompt_of_ids_parses() -> None:
    body = {"input_ids": list(range(4096)), "sampling_params": {"max_new_tokens": 4}}
    assert parse_json(json.dumps(body).encode()) == body
