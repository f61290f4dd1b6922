"""Live tests of the OpenAI-compatible routes of the runtime (as SGLang 0.5.23 serves them)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.runtime.conftest import RunningServer


def sse_payloads(response: httpx.Response) -> list[Any]:
    out: list[Any] = []
    for line in response.iter_lines():
        if line:
            assert line.startswith("data: "), line
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture(scope="module")
def client(runtime_server: RunningServer) -> httpx.Client:
    with httpx.Client(base_url=runtime_server.url, timeout=120.0) as c:
        yield c


def test_models(client: httpx.Client) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    card = body["data"][0]
    assert card["object"] == "model"
    assert card["id"] == client.get("/model_info").json()["served_model_name"]
    one = client.get("/v1/models/" + card["id"])
    assert one.status_code == 200 and one.json()["id"] == card["id"]
    missing = client.get("/v1/models/no-such-model")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_completions_match_generate(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": "m", "prompt": "Once upon a time", "max_tokens": 6,
                                             "temperature": 0})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + 6
    assert "cached_tokens" in usage["prompt_tokens_details"]
    native = client.post(
        "/generate",
        json={"text": "Once upon a time", "sampling_params": {"temperature": 0, "max_new_tokens": 6}},
    ).json()
    assert choice["text"] == native["text"]


def test_completions_stream(client: httpx.Client) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    whole = client.post("/v1/completions", json={**body, "stream": False}).json()
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        events = sse_payloads(r)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 6
    chunks = events[:-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_completions_and_stream(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    req = {"model": "m", "messages": messages, "max_tokens": 6, "temperature": 0}
    r = client.post("/v1/chat/completions", json=req)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 6
    with client.stream("POST", "/v1/chat/completions", json={**req, "stream": True}) as s:
        events = sse_payloads(s)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert streamed == message["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_uses_the_tokenizer_chat_template(client: httpx.Client) -> None:
    from runtime.server.tokenizer import ServerTokenizer

    messages = [{"role": "user", "content": "Hello there"}]
    tok = ServerTokenizer.load(client.get("/model_info").json()["tokenizer_path"])
    prompt_ids = tok.encode(tok.apply_chat_template(messages))
    body = client.post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0}
    ).json()
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    native = client.post(
        "/generate",
        json={"input_ids": prompt_ids, "sampling_params": {"temperature": 0, "max_new_tokens": 4}},
    ).json()
    assert body["choices"][0]["message"]["content"] == native["text"]


def test_openai_errors_are_400(client: httpx.Client) -> None:
    no_messages = client.post("/v1/chat/completions", json={"model": "m"})
    assert no_messages.status_code == 400
    assert no_messages.json()["object"] == "error"
    bad_json = client.post("/v1/completions", content=b"[", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400
    best_of = client.post("/v1/completions", json={"prompt": "x", "best_of": 3})
    assert best_of.status_code == 400 and "best_of" in best_of.json()["message"]
    assert client.get("/v1/models").status_code == 200


def test_completions_batch_of_prompts(client: httpx.Client) -> None:
    prompts = ["Once upon a time", "The river runs"]
    req = {"prompt": prompts, "max_tokens": 4, "temperature": 0}
    body = client.post("/v1/completions", json=req).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for choice, prompt in zip(body["choices"], prompts, strict=True):
        alone = client.post("/v1/completions", json={**req, "prompt": prompt}).json()
        assert choice["text"] == alone["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] == 8
    with client.stream("POST", "/v1/completions", json={**req, "stream": True}) as r:
        events = sse_payloads(r)
    assert events[-1] == "[DONE]"
    for i, choice in enumerate(body["choices"]):
        parts = [e["choices"][0]["text"] for e in events[:-1] if e["choices"][0]["index"] == i]
        assert "".join(parts) == choice["text"]
