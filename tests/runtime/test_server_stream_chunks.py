"""Streamed /generate chunks: built from pre-encoded ids (RequestState.sse_chunk), they must stay byte-identical
to encoding the whole chunk dict with json.dumps, whatever the tokens, text, finish reason and options; and they
come at SGLang's cadence for `stream_interval` (first token at once, then every `stream_interval` tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.core.requests import GenerateRequest, RequestOutput
from runtime.server.generate_request import PreparedRequest
from runtime.server.request_state import RequestState
from runtime.server.sse import sse_event
from runtime.server.tokenizer import ServerTokenizer


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> ServerTokenizer:
    return ServerTokenizer.load(demo_model_dir)


finish_reasons = st.one_of(
    st.builds(lambda t: {"type": "stop", "matched": t}, st.integers(0, 4095)),
    st.builds(lambda s: {"type": "stop", "matched": s}, st.text(max_size=4)),
    st.builds(lambda n: {"type": "length", "length": n}, st.integers(0, 999)),
    st.builds(
        lambda m: {"type": "abort", "message": m, "status_code": 499, "err_type": "ClientDisconnect"},
        st.text(max_size=20),
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.lists(st.integers(0, 4095), max_size=4), min_size=1, max_size=12),
    finish=st.one_of(st.none(), finish_reasons),
    index=st.integers(0, 7),
    with_index=st.booleans(),
    logprob=st.booleans(),
    no_stop_trim=st.booleans(),
    spec=st.booleans(),
)
def test_chunk_equals_json_dumps_of_the_dict(
    tokenizer: ServerTokenizer,
    steps: list[list[int]],
    finish: dict | None,
    index: int,
    with_index: bool,
    logprob: bool,
    no_stop_trim: bool,
    spec: bool,
) -> None:
    request = GenerateRequest(rid=f"r{index}", input_ids=[1, 2, 3], return_logprob=logprob)
    state = RequestState(PreparedRequest(index, request, True, no_stop_trim), tokenizer)
    produced = 0
    for i, ids in enumerate(steps):
        produced += len(ids)
        last = i == len(steps) - 1
        state.update(
            RequestOutput(
                rid=request.rid,
                new_token_ids=list(ids),
                finished=last and finish is not None,
                finish_reason=finish if last else None,
                prompt_tokens=3,
                completion_tokens=produced,
                cached_tokens=1,
                new_token_logprobs=[-0.5 * t for t in ids] if logprob else None,
                spec_verify_ct=i + 1 if spec else 0,
                spec_num_correct_drafts=i if spec else 0,
                spec_num_proposed_drafts=2 * (i + 1) if spec else 0,
            )
        )
        # The chunk renders the detokenizer's state, so both encodings read one text() each, in turn.
        fast = state.sse_chunk(with_index)
        assert fast == sse_event(state.to_dict(with_index)), (fast, state.to_dict(with_index))


def _stream_token_counts(url: str, sampling: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    body = {"input_ids": [11, 12, 13, 14], "stream": True, "sampling_params": sampling}
    counts, last = [], {}
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as http:
        with http.stream("POST", "/generate", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    last = json.loads(line[6:])
                    counts.append(len(last["output_ids"]))
    return counts, last


@pytest.mark.parametrize("interval", [1, 4])
def test_stream_interval_sets_the_chunk_cadence(runtime_server: Any, interval: int) -> None:
    greedy = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    _, whole = _stream_token_counts(runtime_server.url, greedy)
    counts, last = _stream_token_counts(runtime_server.url, {**greedy, "stream_interval": interval})
    assert last["output_ids"] == whole["output_ids"] and last["text"] == whole["text"]
    assert counts[-1] == 10 and counts[0] >= 1
    # Each chunk carries at least `interval` new tokens (a reader that fell behind may merge more), except the
    # first and the final one; with interval 4: [1, 5, 9, 10] when the reader keeps up.
    gaps = [b - a for a, b in zip(counts, counts[1:-1], strict=False)]
    assert all(g >= interval for g in gaps), counts
    assert len(counts) <= (2 + (10 - 1) // interval if interval > 1 else 10), counts
