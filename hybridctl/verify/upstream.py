"""`verify upstream`: the same prompts to the local server and to settings.json's `api` gateway, side by side.

Both are spoken to as OpenAI-compatible chat endpoints (`POST {base}/chat/completions`), greedy (temperature 0),
so two servers with the same weights should give the same tokens. Per prompt: whether each answered, its
latency, its completion tokens, and how far the two answers agree. The check fails when either side leaves a
prompt unanswered, and, with `same_weights`, when the greedy answers differ. The gateway's key comes only from
the environment variable settings.json names; it is sent as a header and never printed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from hybridctl.verify.client import ServerUnreachable, Target, unreachable_message
from hybridctl.verify.report import CheckResult

PROMPTS = (
    "The three primary colors are",
    "Write one sentence about the ocean.",
    "List the first five prime numbers.",
    "What is the capital of France?",
    "Explain recursion in one sentence.",
    "Name a mammal that can fly.",
    "Translate 'good morning' into French.",
    "What does CPU stand for?",
)


@dataclass
class UpstreamOptions:
    prompts: int = 4
    max_tokens: int = 16
    same_weights: bool = False  # both serve the same weights: greedy answers must be identical
    local_model: str | None = None  # default: the first model each side lists at /v1/models
    upstream_model: str | None = None

    def validate(self) -> None:
        if not 1 <= self.prompts <= len(PROMPTS):
            raise ValueError(f"--prompts must be 1..{len(PROMPTS)}, got {self.prompts}")
        if self.max_tokens < 1:
            raise ValueError(f"--max-tokens must be >= 1, got {self.max_tokens}")


@dataclass
class Answer:
    ok: bool
    latency_ms: float
    text: str = ""
    completion_tokens: int | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"answered": self.ok, "latency_ms": round(self.latency_ms, 1), "completion_tokens":
                self.completion_tokens, "text": self.text, "error": self.error}  # fmt: skip


@dataclass
class OpenAIEndpoint:
    """An OpenAI-compatible base URL (ending in /v1 or the gateway's own prefix) and its key."""

    name: str
    target: Target
    _http: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._http = httpx.Client(base_url=self.target.url, headers=self.target.headers(),
                                  timeout=httpx.Timeout(self.target.timeout_s, connect=10.0))  # fmt: skip

    def close(self) -> None:
        self._http.close()

    def first_model(self) -> str:
        try:
            resp = self._http.get("/models")
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ServerUnreachable(f"{self.name}: {unreachable_message(self.target.url, exc)}") from exc
        except httpx.HTTPError as exc:
            raise ServerUnreachable(f"{self.name}: GET {self.target.url}/models failed: {exc}") from exc
        if resp.status_code in (401, 403):
            raise ServerUnreachable(f"{self.name}: GET /models: HTTP {resp.status_code}, the key was refused")
        try:
            return str(resp.json()["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise ServerUnreachable(
                f"{self.name}: GET {self.target.url}/models did not list a model (HTTP {resp.status_code}); "
                "pass the model name explicitly"
            ) from None

    def chat(self, model: str, prompt: str, max_tokens: int) -> Answer:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                "max_tokens": max_tokens, "stream": False}  # fmt: skip
        start = time.perf_counter()
        try:
            resp = self._http.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            return Answer(False, (time.perf_counter() - start) * 1e3, error=f"{type(exc).__name__}: {exc}")
        latency = (time.perf_counter() - start) * 1e3
        if resp.status_code != 200:
            return Answer(False, latency, error=f"HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            out = resp.json()
            text = out["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            return Answer(False, latency, error=f"not a chat completion: {resp.text[:200]!r}")
        usage = out.get("usage") or {}
        return Answer(True, latency, text, usage.get("completion_tokens"))


def agreeing_prefix(a: str, b: str) -> float:
    """The share of the longer answer's words that both answers start with (1.0: identical)."""
    wa, wb = a.split(), b.split()
    if not wa and not wb:
        return 1.0
    same = 0
    for x, y in zip(wa, wb, strict=False):
        if x != y:
            break
        same += 1
    return same / max(len(wa), len(wb))


def run_upstream(local: Target, gateway: Target, options: UpstreamOptions) -> CheckResult:
    """Raises ServerUnreachable when either side does not answer at all (no comparison is possible)."""
    ends = OpenAIEndpoint("local server", local), OpenAIEndpoint("upstream gateway", gateway)
    try:
        local_model = options.local_model or ends[0].first_model()
        upstream_model = options.upstream_model or ends[1].first_model()
        rows = []
        for prompt in PROMPTS[: options.prompts]:
            here = ends[0].chat(local_model, prompt, options.max_tokens)
            there = ends[1].chat(upstream_model, prompt, options.max_tokens)
            both = here.ok and there.ok
            agree = round(agreeing_prefix(here.text, there.text), 3) if both else None
            rows.append({"prompt": prompt, "local": here.to_dict(), "upstream": there.to_dict(),
                         "identical": both and here.text == there.text, "agreeing_prefix": agree})  # fmt: skip
    finally:
        for end in ends:
            end.close()
    return _judge(rows, local_model, upstream_model, gateway.url, options)


def _judge(
    rows: list[dict[str, Any]], local_model: str, upstream_model: str, url: str, options: UpstreamOptions
) -> CheckResult:
    reasons = []
    for side in ("local", "upstream"):
        missed = [r for r in rows if not r[side]["answered"]]
        if missed:
            reasons.append(f"the {side} side left {len(missed)} of {len(rows)} prompts unanswered "
                           f"(first: {missed[0][side]['error']})")  # fmt: skip
    identical = sum(1 for r in rows if r["identical"])
    if options.same_weights and not reasons and identical < len(rows):
        reasons.append(
            f"greedy answers differ on {len(rows) - identical} of {len(rows)} prompts although both serve the "
            "same weights (--same-weights): compare the model, dtype and chat template"
        )
    agree = [r["agreeing_prefix"] for r in rows if r["agreeing_prefix"] is not None]

    def median(side: str) -> float | None:
        values = sorted(r[side]["latency_ms"] for r in rows if r[side]["answered"])
        return values[len(values) // 2] if values else None

    measurements = {
        "upstream_url": url,
        "local_model": local_model,
        "upstream_model": upstream_model,
        "prompts": rows,
        "identical_answers": identical,
        "mean_agreeing_prefix": round(sum(agree) / len(agree), 3) if agree else None,
        "median_latency_ms": {"local": median("local"), "upstream": median("upstream")},
    }
    summary = (
        f"{len(rows)} prompts; identical greedy answers {identical}/{len(rows)}; median latency local "
        f"{_ms(median('local'))} vs upstream {_ms(median('upstream'))}"
    )
    notes = [] if options.same_weights else [
        "answers are compared but not required to match (pass --same-weights when both serve the same weights)"
    ]  # fmt: skip
    return CheckResult("upstream", "failed" if reasons else "passed", summary, reasons, notes, measurements)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"
