"""The streamed /generate chunk is built from pre-encoded ids (RequestState.sse_chunk); it must stay byte-identical
to encoding the whole chunk dict with json.dumps, whatever the tokens, text, finish reason and options."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.engine.api import GenerateRequest, RequestOutput
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
