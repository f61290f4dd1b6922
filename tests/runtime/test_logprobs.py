"""Log probabilities through the real server, checked against transformers' forward of the same weights: native
`return_logprob` / `top_logprobs_num` / `logprob_start_len` / `return_text_in_logprobs` in SGLang's meta_info
shapes (prompt logprobs on a prefix-cache hit included), and the OpenAI shapes through the official client."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.runtime.conftest import RunningServer

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

PROMPT = "The river runs past the old mill"


@pytest.fixture(scope="module")
def reference(demo_model_dir: Path) -> Any:
    """transformers' Qwen3-Next on the demo weights: logits for any token list."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()

    def logits(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0].float()

    return logits


def _generate(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _prompt_ids(url: str) -> list[int]:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": 0}
    return [t for _, t, _ in _generate(url, body)["meta_info"]["input_token_logprobs"]]


def test_prompt_and_output_logprobs_match_the_model(runtime_server: RunningServer, reference: Any) -> None:
    url = runtime_server.url
    body = {
        "text": PROMPT,
        "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 3,
        "return_text_in_logprobs": True,
    }
    meta = _generate(url, body)["meta_info"]
    prompt = [t for _, t, _ in meta["input_token_logprobs"]]
    output = [t for _, t, _ in meta["output_token_logprobs"]]
    assert len(prompt) == meta["prompt_tokens"] and len(output) == 4
    want = torch.log_softmax(reference(prompt + output), dim=-1)
    # Entry 0 has no logprob (SGLang's None); entry k is token k given the tokens before it.
    assert meta["input_token_logprobs"][0][0] is None and meta["input_top_logprobs"][0] is None
    for k in range(1, len(prompt)):
        value, token, text = meta["input_token_logprobs"][k]
        assert value == pytest.approx(want[k - 1, token].item(), abs=2e-3)
        assert text is not None
        top = meta["input_top_logprobs"][k]
        assert [t for _, t, _ in top] == torch.topk(want[k - 1], 3).indices.tolist()
    for k, (value, token, _) in enumerate(meta["output_token_logprobs"]):
        row = want[len(prompt) - 1 + k]
        assert value == pytest.approx(row[token].item(), abs=2e-3)
        # Greedy: the chosen token is the most likely one, so its logprob is the top entry's.
        top = meta["output_top_logprobs"][k]
        assert top[0][1] == token and top[0][0] == pytest.approx(value)
        assert value == pytest.approx(row.max().item(), abs=2e-3)
        assert all(top[i][0] >= top[i + 1][0] for i in range(2))
    assert meta["output_token_logprobs_length"] == 4


def test_sampled_logprobs_are_of_the_temperature_scaled_distribution(
    runtime_server: RunningServer, reference: Any
) -> None:
    """SGLang returns log_softmax(logits / temperature) for a sampled token (before top-k/top-p truncation)."""
    prompt = _prompt_ids(runtime_server.url)
    body = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0.5, "top_k": 20, "max_new_tokens": 1, "sampling_seed": 7},
        "return_logprob": True,
    }
    value, token, text = _generate(runtime_server.url, body)["meta_info"]["output_token_logprobs"][0]
    assert text is None  # without return_text_in_logprobs
    want = torch.log_softmax(reference(prompt)[-1] / 0.5, dim=-1)[token].item()
    assert value == pytest.approx(want, abs=2e-3)


def test_prompt_logprobs_after_a_prefix_cache_hit(runtime_server: RunningServer) -> None:
    """The cached part of a prompt has no logits: a request asking for prompt logprobs reuses the cache only up
    to its logprob_start_len, so the values are the same as on a cold cache."""
    url = runtime_server.url
    ids = _prompt_ids(url) + list(range(200, 240))
    greedy = {"temperature": 0, "max_new_tokens": 2}
    _generate(url, {"input_ids": ids, "sampling_params": greedy})  # warms the cache with the whole prompt
    warm = _generate(url, {"input_ids": ids, "sampling_params": greedy})
    assert warm["meta_info"]["cached_tokens"] > 0
    full = _generate(url, {"input_ids": ids, "sampling_params": greedy, "return_logprob": True, "logprob_start_len": 0})
    assert full["meta_info"]["cached_tokens"] == 0
    start = 30
    tail = _generate(
        url, {"input_ids": ids, "sampling_params": greedy, "return_logprob": True, "logprob_start_len": start}
    )
    assert tail["meta_info"]["cached_tokens"] <= start
    got = tail["meta_info"]["input_token_logprobs"]
    want = full["meta_info"]["input_token_logprobs"][start:]
    assert [t for _, t, _ in got] == ids[start:]
    assert got[0][0] is None
    for (a, _, _), (b, _, _) in zip(got[1:], want[1:], strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    assert tail["output_ids"] == full["output_ids"] == warm["output_ids"]
    too_far = httpx.post(
        f"{url}/generate",
        json={"input_ids": ids, "return_logprob": True, "logprob_start_len": len(ids) + 1},
        timeout=60,
    )
    assert too_far.status_code == 400 and "logprob_start_len" in too_far.json()["error"]["message"]


def test_streamed_generate_carries_cumulative_logprobs(runtime_server: RunningServer) -> None:
    body = {
        "text": PROMPT,
        "sampling_params": {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "stream": True,
    }
    import json

    last: dict[str, Any] = {}
    with httpx.stream("POST", f"{runtime_server.url}/generate", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[6:])
                meta = last["meta_info"]
                assert len(meta["output_token_logprobs"]) == len(last["output_ids"])
                assert len(meta["output_top_logprobs"]) == len(last["output_ids"])
    whole = _generate(runtime_server.url, {**body, "stream": False})
    assert last["meta_info"]["output_token_logprobs"] == whole["meta_info"]["output_token_logprobs"]


def test_openai_chat_logprobs_sync_async_and_stream(runtime_server: RunningServer) -> None:
    base = f"{runtime_server.url}/v1"
    messages = [{"role": "user", "content": "Hello there"}]
    kwargs: dict[str, Any] = {"model": "m", "messages": messages, "max_tokens": 5, "temperature": 0}
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300)
    r = client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 3
        assert item.top_logprobs[0].token == item.token and item.top_logprobs[0].logprob == pytest.approx(item.logprob)
        assert item.bytes == list(item.token.encode("utf-8"))
    stream = client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=3, stream=True)
    streamed = [i for c in stream if c.choices and c.choices[0].logprobs for i in c.choices[0].logprobs.content]
    assert [(i.token, round(i.logprob, 4)) for i in streamed] == [
        (i.token, round(i.logprob, 4)) for i in content[: len(streamed)]
    ]
    assert len(streamed) >= len(content) - 1  # a final EOS token has no text delta to ride on
    plain = client.chat.completions.create(**kwargs)
    assert plain.choices[0].logprobs is None

    async def run_async() -> Any:
        async with openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300) as aclient:
            return await aclient.chat.completions.create(**kwargs, logprobs=True)

    ar = asyncio.run(run_async())
    assert [i.logprob for i in ar.choices[0].logprobs.content] == pytest.approx([i.logprob for i in content])


def test_openai_completions_logprobs_and_echo(runtime_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=f"{runtime_server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(row) <= 2 for row in lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    echo = client.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2, echo=True)
    elp = echo.choices[0].logprobs
    prompt_len = echo.usage.prompt_tokens
    assert echo.choices[0].text == PROMPT + r.choices[0].text
    assert len(elp.tokens) == prompt_len + 4
    assert elp.token_logprobs[0] is None and elp.top_logprobs[0] is None
    assert all(isinstance(v, float) and v <= 0 for v in elp.token_logprobs[1:])
    assert elp.token_logprobs[prompt_len:] == pytest.approx(lp.token_logprobs)
    assert not any(math.isnan(v) for v in elp.token_logprobs[1:])
