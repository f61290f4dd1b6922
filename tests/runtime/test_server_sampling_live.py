"""What real clients send, over loopback to a real runtime server, through the official `openai` client (sync and
async, stream and not) and raw /generate: n > 1 on one prefill (greedy identity, seeded reproducibility, SGLang's
prompt-major order and stream indexes, forks on /metrics), penalties / min_tokens / logit_bias / stop_token_ids,
streamed stop strings held back, and SGLang's cached-token details (meta_info and sglext)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from tests.runtime.conftest import RunningServer

LONG_IDS = list(range(10, 210))  # 200 tokens: past several state checkpoints, so a repeat hits the cache


@pytest.fixture(scope="module")
def client(runtime_server: RunningServer) -> httpx.Client:
    with httpx.Client(base_url=runtime_server.url, timeout=180.0) as c:
        yield c


@pytest.fixture(scope="module")
def oai(runtime_server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=runtime_server.url + "/v1", api_key="unused", max_retries=0, timeout=180)


def _oai_async(server: RunningServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=180)


def _generate(client: httpx.Client, body: dict[str, Any]) -> Any:
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _sse(client: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def _forks(client: httpx.Client) -> float:
    m = re.search(r"^runtime:state_forks_total\{[^}]*\} (\S+)$", client.get("/metrics").text, re.M)
    assert m, "runtime:state_forks_total missing from /metrics"
    return float(m.group(1))


GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


# -- n > 1 ---------------------------------------------------------------------------------------------------------


def test_native_n_greedy_identity_one_prefill_and_forks_on_metrics(client: httpx.Client) -> None:
    alone = _generate(client, {"text": "The hybrid model", "sampling_params": GREEDY})
    forks = _forks(client)
    many = _generate(client, {"text": "The hybrid model", "sampling_params": {**GREEDY, "n": 3}})
    assert isinstance(many, list) and len(many) == 3  # SGLang answers a single prompt with n > 1 as a batch
    assert [m["output_ids"] for m in many] == [alone["output_ids"]] * 3
    assert [m["text"] for m in many] == [alone["text"]] * 3
    assert len({m["meta_info"]["id"] for m in many}) == 3
    assert _forks(client) == forks + 2  # continuations 1 and 2 forked off continuation 0's prefill


def test_native_batch_fan_out_is_prompt_major_and_streams_carry_indexes(client: httpx.Client) -> None:
    prompts = ["Once upon a time", "In a galaxy far"]
    singles = [_generate(client, {"text": p, "sampling_params": GREEDY})["text"] for p in prompts]
    body = {"text": prompts, "sampling_params": {**GREEDY, "n": 2}}
    whole = _generate(client, body)
    assert [w["text"] for w in whole] == [singles[0], singles[0], singles[1], singles[1]]
    last: dict[int, str] = {}
    for chunk in _sse(client, "/generate", {**body, "stream": True}):
        last[chunk["index"]] = chunk["text"]
    assert last == {0: singles[0], 1: singles[0], 2: singles[1], 3: singles[1]}


def test_openai_n_greedy_identity_sync_and_seeded_samples_reproduce(oai: openai.OpenAI) -> None:
    one = oai.completions.create(model="m", prompt="Once upon a time", max_tokens=10, temperature=0)
    three = oai.completions.create(model="m", prompt="Once upon a time", max_tokens=10, temperature=0, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert [c.text for c in three.choices] == [one.choices[0].text] * 3
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # a prompt counts once, as in SGLang
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens

    def seeded() -> list[str]:
        r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Tell me a story"}],
                                        max_tokens=12, temperature=1.0, seed=1234, n=3)  # fmt: skip
        assert [c.index for c in r.choices] == [0, 1, 2]
        return [c.message.content or "" for c in r.choices]

    first = seeded()
    assert len(set(first)) > 1  # each continuation samples on its own
    assert seeded() == first  # and the same seed gives the same n samples


def test_openai_n_streams_async_equal_non_stream(runtime_server: RunningServer) -> None:
    async def run() -> None:
        client = _oai_async(runtime_server)
        messages = [{"role": "user", "content": "Name three colours"}]
        whole = await client.chat.completions.create(model="m", messages=messages, max_tokens=10, temperature=0, n=2)
        parts: dict[int, str] = {}
        finished: dict[int, str | None] = {}
        stream = await client.chat.completions.create(
            model="m", messages=messages, max_tokens=10, temperature=0, n=2, stream=True
        )
        async for chunk in stream:
            for c in chunk.choices:
                parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
                if c.finish_reason is not None:
                    finished[c.index] = c.finish_reason
        assert parts == {c.index: c.message.content for c in whole.choices}
        assert set(finished) == {0, 1}
        texts: dict[int, str] = {}
        cstream = await client.completions.create(
            model="m", prompt=["abc", "xyz"], max_tokens=6, temperature=0, n=2, stream=True
        )
        async for chunk in cstream:
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
        cwhole = await client.completions.create(model="m", prompt=["abc", "xyz"], max_tokens=6, temperature=0, n=2)
        assert texts == {c.index: c.text for c in cwhole.choices} and set(texts) == {0, 1, 2, 3}
        assert texts[0] == texts[1] and texts[2] == texts[3]
        await client.close()

    asyncio.run(run())


# -- sampling controls ---------------------------------------------------------------------------------------------


def test_logit_bias_min_tokens_and_stop_token_ids(client: httpx.Client, oai: openai.OpenAI) -> None:
    free = _generate(client, {"text": "Stop here", "sampling_params": GREEDY})["output_ids"]
    target = free[5]
    forced = {"temperature": 0, "max_new_tokens": 12, "logit_bias": {str(target): 100.0}}
    # Forced by the bias, the stop token comes first ...
    early = _generate(client, {"text": "Stop here", "sampling_params": {**forced, "stop_token_ids": [target]}})
    assert early["output_ids"] == [target] and early["meta_info"]["finish_reason"]["matched"] == target
    # ... unless min_new_tokens holds it (and EOS) back for 4 tokens.
    held = _generate(client, {"text": "Stop here", "sampling_params": {**forced, "stop_token_ids": [target],
                                                                         "min_new_tokens": 4}})  # fmt: skip
    assert len(held["output_ids"]) == 5 and target not in held["output_ids"][:4]
    assert held["output_ids"][4] == target and held["meta_info"]["finish_reason"] == {"type": "stop",
                                                                                        "matched": target}  # fmt: skip
    # The OpenAI spelling (min_tokens, logit_bias, stop_token_ids), sync client, same tokens and trimmed text.
    r = oai.completions.create(model="m", prompt="Stop here", max_tokens=12, temperature=0,
                               logit_bias={str(target): 100},
                               extra_body={"min_tokens": 4, "stop_token_ids": [target]})  # fmt: skip
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 5
    assert r.choices[0].text == held["text"]
    # no_stop_trim keeps the stop token's text; ignore_eos turns stop_token_ids off too (as SGLang).
    keep = {**forced, "stop_token_ids": [target], "min_new_tokens": 4, "no_stop_trim": True}
    kept = _generate(client, {"text": "Stop here", "sampling_params": keep})
    assert kept["text"].startswith(held["text"]) and len(kept["text"]) > len(held["text"])
    ignored = _generate(client, {"text": "Stop here", "sampling_params": {**forced, "stop_token_ids": [target],
                                                                            "ignore_eos": True}})  # fmt: skip
    assert ignored["output_ids"] == [target] * 12


def test_penalties_change_greedy_output_and_neutral_values_do_not(client: httpx.Client, oai: openai.OpenAI) -> None:
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    free = _generate(client, {"text": "the the the", "sampling_params": params})["output_ids"]
    neutral = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}
    assert _generate(client, {"text": "the the the", "sampling_params": {**params, **neutral}})["output_ids"] == free
    target = free[0]
    forced = {**params, "logit_bias": {str(target): 6.0}}
    biased = _generate(client, {"text": "the the the", "sampling_params": forced})["output_ids"]
    assert biased.count(target) > free.count(target)
    penalized = _generate(client, {"text": "the the the", "sampling_params": {**forced, "frequency_penalty": 2.0}})
    repeat = _generate(client, {"text": "the the the", "sampling_params": {**forced, "repetition_penalty": 2.0,
                                                                              "presence_penalty": 2.0}})  # fmt: skip
    # Each occurrence costs the forced token 2 (frequency), so it cannot keep winning.
    assert penalized["output_ids"].count(target) < biased.count(target)
    assert repeat["output_ids"].count(target) < biased.count(target)
    r = oai.completions.create(model="m", prompt="the the the", max_tokens=40, temperature=0, frequency_penalty=2.0,
                               logit_bias={str(target): 6.0}, extra_body={"ignore_eos": True})  # fmt: skip
    assert r.choices[0].text == penalized["text"]
    bad = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                    "presence_penalty": 2.5})  # fmt: skip
    assert bad.status_code == 400 and "presence_penalty must be in [-2, 2]" in bad.json()["message"]


# -- streamed stop strings -----------------------------------------------------------------------------------------


def _multi_token_stop(client: httpx.Client, model_dir: Path, prompt: str) -> tuple[str, str]:
    """(stop string spanning 3 output tokens, the text before its first occurrence) from a greedy answer."""
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    free = _generate(client, {"text": prompt, "sampling_params": {**GREEDY, "max_new_tokens": 24}})
    ids = free["output_ids"]
    for k in range(4, 18):
        head = tok.decode(ids[:k], skip_special_tokens=True)
        upto = tok.decode(ids[: k + 3], skip_special_tokens=True)
        stop = upto[len(head) :]
        if upto.startswith(head) and len(stop.strip()) >= 3 and free["text"].find(stop) == len(head):
            return stop, head
    pytest.skip("no multi-token stop string in this greedy answer")


def test_streamed_stop_strings_are_held_back(client: httpx.Client, oai: openai.OpenAI, demo_model_dir: Path) -> None:
    prompt = "Once upon a time"
    stop, head = _multi_token_stop(client, demo_model_dir, prompt)
    params = {**GREEDY, "max_new_tokens": 24, "stop": [stop]}
    whole = _generate(client, {"text": prompt, "sampling_params": params})
    assert whole["text"] == head and whole["meta_info"]["finish_reason"]["matched"] == stop
    for chunk in _sse(client, "/generate", {"text": prompt, "sampling_params": params, "stream": True}):
        assert head.startswith(chunk["text"]), f"chunk {chunk['text']!r} leaks part of {stop!r}"
    deltas = oai.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0, stop=[stop], stream=True,
                                    extra_body={"ignore_eos": True})  # fmt: skip
    assert "".join(c.choices[0].text for c in deltas if c.choices) == head
    chat_whole = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}],
                                             max_tokens=24, temperature=0)  # fmt: skip
    text = chat_whole.choices[0].message.content or ""
    if len(text) > 8:
        cstop = text[4:8]
        want = text[: text.find(cstop)]
        chunks = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}],
                                             max_tokens=24, temperature=0, stop=[cstop], stream=True)  # fmt: skip
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want


# -- cached-token details ------------------------------------------------------------------------------------------


def test_cached_tokens_details_native_and_openai(client: httpx.Client, oai: openai.OpenAI) -> None:
    params = {"temperature": 0, "max_new_tokens": 2}
    assert client.post("/flush_cache").status_code == 200
    first = _generate(client, {"input_ids": LONG_IDS, "sampling_params": params})["meta_info"]
    second = _generate(client, {"input_ids": LONG_IDS, "sampling_params": params})["meta_info"]
    assert first["cached_tokens"] == 0 and first["cached_tokens_details"] is None
    assert second["cached_tokens"] > 0
    assert second["cached_tokens_details"] == {"device": second["cached_tokens"], "host": 0}
    streamed = _sse(client, "/generate", {"input_ids": LONG_IDS, "sampling_params": params, "stream": True})
    assert streamed[-1]["meta_info"]["cached_tokens_details"] == {"device": streamed[-1]["meta_info"]["cached_tokens"],
                                                                  "host": 0}  # fmt: skip
    # OpenAI: only with return_cached_tokens_details, at response level (sglext), as SGLang.
    plain = oai.completions.create(model="m", prompt=LONG_IDS, max_tokens=2, temperature=0)
    assert "sglext" not in (plain.model_extra or {})
    asked = oai.completions.create(model="m", prompt=LONG_IDS, max_tokens=2, temperature=0,
                                   extra_body={"return_cached_tokens_details": True})  # fmt: skip
    cached = asked.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and asked.model_extra["sglext"] == {"cached_tokens_details": {"device": cached, "host": 0}}
    found = [c.model_extra.get("sglext") for c in oai.completions.create(
        model="m", prompt=LONG_IDS, max_tokens=2, temperature=0, stream=True,
        extra_body={"return_cached_tokens_details": True}) if (c.model_extra or {}).get("sglext")]  # fmt: skip
    assert found == [{"cached_tokens_details": {"device": cached, "host": 0}}]
    messages = [{"role": "user", "content": " ".join(f"word{i}" for i in range(120))}]
    oai.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0)
    chat = oai.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0,
                                       extra_body={"return_cached_tokens_details": True})  # fmt: skip
    ccached = chat.usage.prompt_tokens_details.cached_tokens
    assert ccached > 0 and chat.model_extra["sglext"] == {"cached_tokens_details": {"device": ccached, "host": 0}}
    chunks = _sse(client, "/v1/chat/completions", {"messages": messages, "max_tokens": 2, "temperature": 0,
                                                   "stream": True, "return_cached_tokens_details": True})  # fmt: skip
    ext = [c for c in chunks if "sglext" in c]
    assert len(ext) == 1 and ext[0]["choices"] == [] and ext[0]["sglext"]["cached_tokens_details"]["device"] > 0
