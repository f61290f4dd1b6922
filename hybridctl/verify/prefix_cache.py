"""`verify prefix-cache`: does a shared document really make the next request's first token come sooner?

Protocol, per trial (after `warmup` unmeasured requests on another document): flush the cache; a cold request
(document + question 0); `questions` requests with other questions on the same document (the realistic case: one
document, many questions); `repeats` requests with the identical prompt (the upper bound). TTFT is the first
streamed token. The measurement (this module) and the judgement (`judge.py`) are separate so the judgement can
be unit-tested on recorded numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridctl.config.schema import HybridConfig
from hybridctl.verify.client import ServerError, SGLangClient, StreamResult
from hybridctl.verify.document import load_prompt_builder
from hybridctl.verify.prefix_judge import PrefixCacheOptions, Request, Trial, judge_prefix_cache
from hybridctl.verify.prometheus import MetricsSnapshot, counter_delta
from hybridctl.verify.report import CheckResult

# Server args that explain prefix-cache behaviour; reported with the result.
SERVER_KEYS = (
    "disable_radix_cache",
    "mamba_radix_cache_strategy",
    "mamba_track_interval",
    "page_size",
    "chunked_prefill_size",
)


@dataclass
class _Flushes:
    refused: list[str] = field(default_factory=list)


def _request(result: StreamResult) -> Request:
    if result.ttft_s is None:
        raise ServerError("a streamed /generate ended without reporting a first token (completion_tokens 0)")
    return Request(
        ttft_s=result.ttft_s, cached_tokens=result.cached_tokens, prompt_tokens=result.prompt_tokens
    )


def _flush(client: SGLangClient, flushes: _Flushes) -> None:
    ok, message = client.flush_cache()
    if not ok:
        flushes.refused.append(message or "no message")


def metrics_summary(before: MetricsSnapshot | None, after: MetricsSnapshot | None) -> dict[str, Any] | None:
    """Cache-hit-rate change from `/metrics`: SGLang's gauge before/after, and this check's token hit rate."""
    if before is None or after is None:
        return None
    cached = counter_delta(before, after, "sglang:cached_tokens_total")
    prompt = counter_delta(before, after, "sglang:prompt_tokens_total")
    if cached is None and prompt is not None:
        cached = 0.0  # a labelled counter appears only once incremented: absent means no cached tokens yet
    return {
        "cache_hit_rate_before": before.total("sglang:cache_hit_rate"),
        "cache_hit_rate_after": after.total("sglang:cache_hit_rate"),
        "cached_tokens_delta": cached,
        "prompt_tokens_delta": prompt,
        # SGLang adds each finished request's full prompt length to prompt_tokens_total, cached part included.
        "hit_rate_during_check": None if cached is None or not prompt else cached / prompt,
    }


def tokenizer_candidates(config: HybridConfig | None, model_info: dict[str, Any]) -> list[str | None]:
    candidates: list[str | None] = []
    if config is not None:
        candidates += [config.config.server.tokenizer_path, config.config.server.model_path]
    candidates += [model_info.get("tokenizer_path"), model_info.get("model_path")]
    return candidates


def run_prefix_cache(
    client: SGLangClient, config: HybridConfig | None, options: PrefixCacheOptions | None = None
) -> CheckResult:
    opts = options or PrefixCacheOptions()
    opts.validate()
    model_info = client.model_info()
    builder, tokenizer_note = load_prompt_builder(tokenizer_candidates(config, model_info))
    server_info = client.server_info()
    server_args = {k: server_info.get(k) for k in SERVER_KEYS if k in server_info}
    metrics_before = client.metrics()
    flushes = _Flushes()

    def stream(prompt: str | list[int]) -> StreamResult:
        return client.generate_stream(prompt, max_new_tokens=opts.max_new_tokens)

    for w in range(opts.warmup):
        _flush(client, flushes)
        doc = builder.document(opts.doc_tokens, seed=opts.seed * 1_000_003 + 900_000 + w)
        stream(builder.join(doc, builder.question(opts.question_tokens, seed=900_000 + w)))

    trials: list[Trial] = []
    doc_tokens_seen: list[int] = []
    for t in range(opts.trials):
        _flush(client, flushes)
        doc = builder.document(opts.doc_tokens, seed=opts.seed * 1_000_003 + t)
        questions = [
            builder.question(opts.question_tokens, seed=(opts.seed * 1_000_003 + t) * 64 + j)
            for j in range(opts.questions + 1)
        ]
        cold = stream(builder.join(doc, questions[0]))
        realistic = [stream(builder.join(doc, q)) for q in questions[1:]]
        identical = [stream(builder.join(doc, questions[0])) for _ in range(opts.repeats)]
        trials.append(
            Trial(
                cold=_request(cold),
                realistic=[_request(r) for r in realistic],
                identical=[_request(r) for r in identical],
            )
        )
        if builder.exact:
            doc_tokens_seen.append(len(doc))
        else:
            # Scale the server's exact prompt length by the document's share of the (estimated) prompt.
            share = builder.count(doc) / max(1, builder.count(builder.join(doc, questions[0])))
            doc_tokens_seen.append(max(1, round(cold.prompt_tokens * share)))

    metrics_after = client.metrics()
    return judge_prefix_cache(
        trials,
        document_tokens=round(sum(doc_tokens_seen) / len(doc_tokens_seen)),
        document_tokens_exact=builder.exact,
        options=opts,
        server_args=server_args,
        metrics=metrics_summary(metrics_before, metrics_after),
        flush_refusals=flushes.refused,
        tokenizer_note=tokenizer_note,
    )
