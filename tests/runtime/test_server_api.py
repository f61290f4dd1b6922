"""Live tests of the runtime's SGLang 0.5.23 HTTP API: a real `python -m runtime` over loopback."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.runtime.conftest import RunningServer

GREEDY = {"temperature": 0, "max_new_tokens": 8}


def sse_events(response: httpx.Response) -> list[Any]:
    """The `data:` payloads of an SSE stream; the literal [DONE] marker is kept as a string."""
    events: list[Any] = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.fixture(scope="module")
def client(runtime_server: RunningServer) -> httpx.Client:
    with httpx.Client(base_url=runtime_server.url, timeout=120.0) as c:
        yield c


def test_generate_text(client: httpx.Client) -> None:
    r = client.post("/generate", json={"text": "Once upon a time", "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    body = r.json()
    meta = body["meta_info"]
    assert len(body["output_ids"]) == 8 == meta["completion_tokens"]
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["prompt_tokens"] > 0
    assert meta["e2e_latency"] > 0
    assert isinstance(body["text"], str) and body["text"]
    assert {"id", "cached_tokens"} <= set(meta)


def test_text_and_input_ids_give_the_same_greedy_answer(client: httpx.Client) -> None:
    by_text = client.post("/generate", json={"text": "The river runs", "sampling_params": GREEDY}).json()
    from runtime.server.tokenizer import ServerTokenizer

    tok = ServerTokenizer.load(client.get("/model_info").json()["tokenizer_path"])
    ids = tok.encode("The river runs")
    assert len(ids) == by_text["meta_info"]["prompt_tokens"]
    by_ids = client.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY}).json()
    assert by_ids["output_ids"] == by_text["output_ids"]
    assert by_ids["text"] == by_text["text"]


def test_generate_batch(client: httpx.Client) -> None:
    prompts = ["A cat sat", "Numbers: one two", "A cat sat"]
    r = client.post("/generate", json={"text": prompts, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and len(out) == 3
    assert out[0]["output_ids"] == out[2]["output_ids"]  # greedy: same prompt, same answer, batched or not
    alone = client.post("/generate", json={"text": "Numbers: one two", "sampling_params": GREEDY}).json()
    assert out[1]["output_ids"] == alone["output_ids"]


def test_generate_stream_is_cumulative_and_ends_with_done(client: httpx.Client) -> None:
    whole = client.post("/generate", json={"text": "In the morning", "sampling_params": GREEDY}).json()
    with client.stream(
        "POST", "/generate", json={"text": "In the morning", "sampling_params": GREEDY, "stream": True}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2
    for prev, cur in zip(chunks, chunks[1:], strict=False):
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
        assert cur["text"].startswith(prev["text"])
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert last["output_ids"] == whole["output_ids"]
    assert last["text"] == whole["text"]


def test_batch_stream_chunks_carry_index(client: httpx.Client) -> None:
    body = {
        "text": ["one", "two"],
        "sampling_params": {"temperature": 0, "max_new_tokens": 3},
        "stream": True,
    }
    with client.stream("POST", "/generate", json=body) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    finished = {e["index"] for e in events[:-1] if e["meta_info"]["finish_reason"] is not None}
    assert finished == {0, 1}


def test_unknown_sampling_param_is_a_400_naming_it(client: httpx.Client) -> None:
    r = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_token": 4}})
    assert r.status_code == 400
    assert r.json()["error"].startswith("unknown field `max_new_token`, expected one of `max_new_tokens`")


def test_bad_requests_are_400_and_the_server_stays_up(client: httpx.Client) -> None:
    bad_json = client.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400
    assert "JSON decode error" in bad_json.json()["message"]
    empty = client.post("/generate", json={"text": ""})
    assert empty.status_code == 400
    assert "empty" in empty.json()["error"]["message"]
    assert client.post("/generate", json={"input_ids": []}).status_code == 400
    assert client.post("/generate", json={"sampling_params": {}}).status_code == 400
    wrong_type = client.post("/generate", json={"text": "hi", "sampling_params": {"temperature": "hot"}})
    assert wrong_type.status_code == 400 and "invalid type" in wrong_type.json()["error"]
    out_of_range = client.post("/generate", json={"text": "hi", "sampling_params": {"top_p": 0}})
    assert out_of_range.status_code == 400 and "top_p" in out_of_range.json()["error"]["message"]
    unsupported = client.post("/generate", json={"text": "hi", "sampling_params": {"structural_tag": "{}"}})
    assert unsupported.status_code == 400 and "structural_tag" in unsupported.json()["error"]["message"]
    bad_grammar = client.post("/generate", json={"text": "hi", "sampling_params": {"regex": "(a"}})
    assert bad_grammar.status_code == 400
    assert "Failed to compile regex grammar" in bad_grammar.json()["error"]["message"]
    assert client.post("/generate", json={"text": "still up", "sampling_params": GREEDY}).status_code == 200


def test_stop_string_is_trimmed(client: httpx.Client) -> None:
    free = client.post("/generate", json={"text": "Once upon a time", "sampling_params": GREEDY}).json()
    text = free["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip("greedy continuation has no usable stop string")
    params = {**GREEDY, "stop": [stop]}
    out = client.post("/generate", json={"text": "Once upon a time", "sampling_params": params}).json()
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[: text.find(stop)]


def test_health_ready_and_model_info(client: httpx.Client, runtime_server: RunningServer) -> None:
    assert client.get("/health").status_code == 200
    assert client.get("/health_generate").status_code == 200
    assert client.get("/ready").status_code == 200
    info = client.get("/model_info").json()
    assert info["is_generation"] is True
    assert info["model_type"] == "qwen3_next"
    assert info["model_path"] == info["tokenizer_path"]
    assert client.get("/get_model_info").json() == info  # deprecated alias, still answered
    assert "The server is fired up and ready to roll!" in runtime_server.log_text()


def test_server_info_reports_resolved_args_and_pools(client: httpx.Client) -> None:
    info = client.get("/server_info").json()
    assert info["max_total_num_tokens"] > 0
    assert info["version"] == "0.5.23"
    assert info["api_key"] is None
    state = info["internal_states"][0]
    for pool in ("kv_pages", "state_slots"):
        parts = state[f"{pool}_free"] + state[f"{pool}_cached"] + state[f"{pool}_in_use"]
        assert parts == state[f"{pool}_total"] > 0
    assert state["max_total_num_tokens"] == info["max_total_num_tokens"]
    legacy = client.get("/get_server_info").json()
    assert legacy["max_total_num_tokens"] == info["max_total_num_tokens"]


def test_prefix_cache_hit_then_flush_cache(client: httpx.Client) -> None:
    ids = list(range(10, 210))  # 200 tokens: past several state checkpoints
    params = {"temperature": 0, "max_new_tokens": 2}
    assert client.post("/flush_cache").status_code == 200
    first = client.post("/generate", json={"input_ids": ids, "sampling_params": params}).json()
    second = client.post("/generate", json={"input_ids": ids, "sampling_params": params}).json()
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] > 0
    assert second["output_ids"] == first["output_ids"]
    r = client.post("/flush_cache")
    assert r.status_code == 200 and r.text.startswith("Cache flushed.")
    third = client.post("/generate", json={"input_ids": ids, "sampling_params": params}).json()
    assert third["meta_info"]["cached_tokens"] == 0
    assert third["output_ids"] == first["output_ids"]


def test_metrics_have_sglang_names(client: httpx.Client) -> None:
    client.post("/generate", json={"text": "metrics please", "sampling_params": GREEDY})
    text = client.get("/metrics").text
    for name in (
        "sglang:cache_hit_rate",
        "sglang:token_usage",
        "sglang:mamba_usage",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:gen_throughput",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:e2e_request_latency_seconds_count",
    ):
        assert f"\n{name}{{" in text, name
    counts = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sglang:e2e_request_latency_seconds_count")
    ]
    assert sum(counts) >= 1


def test_return_logprob_gives_greedy_token_logprobs(client: httpx.Client) -> None:
    body = {"text": "The sea", "sampling_params": GREEDY, "return_logprob": True}
    meta = client.post("/generate", json=body).json()["meta_info"]
    triples = meta["output_token_logprobs"]
    assert len(triples) == GREEDY["max_new_tokens"]
    assert all(lp <= 0.0 and text is None for lp, _, text in triples)
    assert meta["input_token_logprobs"] == []  # SGLang: no prompt logprobs unless logprob_start_len >= 0
    unsupported = client.post("/generate", json={**body, "token_ids_logprob": [3]})
    assert unsupported.status_code == 400
    assert "token_ids_logprob" in unsupported.json()["error"]["message"]


def test_flush_cache_refused_while_a_request_runs(client: httpx.Client) -> None:
    body = {
        "input_ids": [7, 8, 9],
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
        "stream": True,
    }
    busy: httpx.Response | None = None
    with client.stream("POST", "/generate", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                # Still reading the stream (leaving the loop would close the connection and abort it).
                busy = client.post("/flush_cache")
                break
    assert busy is not None and busy.status_code == 400
    assert busy.text.startswith("Cache not flushed because there are pending requests.")
    assert "#running-req: 1" in busy.text
    # Leaving the stream aborted the request; once the engine has let it go, flushing works.
    deadline = time.monotonic() + 60  # the abort goes through the event loop and the engine's next step
    while time.monotonic() < deadline:
        if client.get("/server_info").json()["internal_states"][0]["num_running_reqs"] == 0:
            break
        time.sleep(0.1)
    assert client.post("/flush_cache").status_code == 200
