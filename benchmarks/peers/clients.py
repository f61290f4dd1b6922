"""One streaming greedy request against each engine's own HTTP API, timed the same way for all.

Every engine gets token ids (no tokenizer in the measured path), greedy decoding and ignore-EOS, and is read
as a stream so the time to the first token is when the first chunk carrying a token arrives:

- runtime (SGLang 0.5.23 API): `POST /generate` with `input_ids`; chunks carry cumulative `output_ids`;
  `meta_info.cached_tokens` says how much of the prompt the prefix cache served.
- llama.cpp: `POST /completion` with `prompt` as ids, `cache_prompt`, `return_tokens`; the last chunk's
  `timings.cache_n` is its prefix-cache hit.
- vLLM: `POST /v1/completions` with `prompt` as ids, `return_token_ids`; usage's
  `prompt_tokens_details.cached_tokens` (with `--enable-prompt-tokens-details`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from http_stream import Connections, HttpError


@dataclass
class RequestResult:
    ttft_s: float
    e2e_s: float
    output_ids: list[int]
    cached_tokens: int | None = None  # None: the engine does not say
    chunk_times: list[float] = field(default_factory=list)

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first, per second after the first (the decode rate a single user sees)."""
        n = len(self.output_ids)
        return (n - 1) / (self.e2e_s - self.ttft_s) if n > 1 and self.e2e_s > self.ttft_s else 0.0


class EngineClient(Protocol):
    name: str

    async def generate(self, http: Connections, ids: list[int], max_new: int) -> RequestResult: ...


class EngineRequestError(HttpError):
    pass


@dataclass
class _Timer:
    start: float = field(default_factory=time.perf_counter)
    first: float | None = None
    chunks: list[float] = field(default_factory=list)

    def on_the_wire(self) -> None:
        """Start the clock at the request's first network action (http_stream.py: the client's own work before
        it is not the server's time)."""
        self.start = time.perf_counter()

    def tokens_arrived(self) -> None:
        now = time.perf_counter() - self.start
        self.chunks.append(now)
        if self.first is None:
            self.first = now

    def result(self, ids: list[int], cached: int | None) -> RequestResult:
        e2e = time.perf_counter() - self.start
        if self.first is None:
            raise EngineRequestError("the stream ended without a single token")
        return RequestResult(self.first, e2e, ids, cached, self.chunks)


@dataclass
class RuntimeClient:
    url: str
    name: str = "runtime"
    extra_sampling: dict[str, Any] = field(default_factory=dict)  # e.g. stream_interval (server_overhead.py)

    async def generate(self, http: Connections, ids: list[int], max_new: int) -> RequestResult:
        body = {
            "input_ids": ids,
            "stream": True,
            "sampling_params": {
                "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True, **self.extra_sampling
            },
        }  # fmt: skip
        timer, out, cached = _Timer(), [], None
        async for chunk in http.sse(self.url + "/generate", body, timer.on_the_wire):
            new = chunk.get("output_ids") or []
            if len(new) > len(out):
                timer.tokens_arrived()
                out = list(new)
            meta = chunk.get("meta_info") or {}
            if meta.get("finish_reason"):
                cached = meta.get("cached_tokens")
        return timer.result(out, cached)


@dataclass
class LlamaCppClient:
    url: str
    name: str = "llama.cpp"

    async def generate(self, http: Connections, ids: list[int], max_new: int) -> RequestResult:
        # temperature 0 is llama.cpp's greedy path; the sampler chain is pinned to top_k=1 so no sampler
        # can reorder candidates.
        body = {
            "prompt": ids,
            "n_predict": max_new,
            "temperature": 0.0,
            "top_k": 1,
            "samplers": ["top_k"],
            "ignore_eos": True,
            "cache_prompt": True,
            "stream": True,
            "return_tokens": True,
        }
        timer, out, cached = _Timer(), [], None
        # llama-server's HTTP layer drops a kept-alive connection after a streamed answer, so each request gets
        # its own connection (its connect is inside the timed span: the request's first network action).
        async for chunk in http.sse(self.url + "/completion", body, timer.on_the_wire, close=True):
            tokens = chunk.get("tokens") or []
            if tokens:
                timer.tokens_arrived()
                out.extend(tokens)
            if chunk.get("stop"):
                cached = (chunk.get("timings") or {}).get("cache_n")
        return timer.result(out, cached)


@dataclass
class VllmClient:
    url: str
    model: str
    name: str = "vllm"

    async def generate(self, http: Connections, ids: list[int], max_new: int) -> RequestResult:
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": max_new,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        }
        timer, out, cached = _Timer(), [], None
        async for chunk in http.sse(self.url + "/v1/completions", body, timer.on_the_wire):
            for choice in chunk.get("choices") or []:
                tokens = choice.get("token_ids") or []
                if tokens:
                    timer.tokens_arrived()
                    out.extend(tokens)
            usage = chunk.get("usage")
            if usage:
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        return timer.result(out, cached)
