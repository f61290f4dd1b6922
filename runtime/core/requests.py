"""Requests, sampling parameters, outputs and stats: the values the engine, the scheduler, spec, PD and the HTTP
server pass between them. No torch here: the server's request parsing imports this module."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: whole vocabulary
    min_p: float = 0.0
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    # SGLang's penalties (penaltylib/): over the output tokens so far; 0 / 0 / 1 / 0 are off.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0  # EOS and stop token ids are masked until this many tokens are out
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit

    def validate(self) -> str | None:
        """A one-line reason when the values cannot be sampled with, else None."""
        for name in ("temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value):
                return f"{name} must be a finite number, got {value!r}"
        if self.seed is not None and not -(1 << 63) <= self.seed < 1 << 64:
            return f"seed must fit in 64 bits, got {self.seed}"
        if self.temperature < 0:
            return f"temperature must be >= 0, got {self.temperature}"
        if not 0 < self.top_p <= 1:
            return f"top_p must be in (0, 1], got {self.top_p}"
        if self.top_k == 0 or self.top_k < -1:
            return f"top_k must be -1 (disabled) or >= 1, got {self.top_k}"
        if not 0 <= self.min_p <= 1:
            return f"min_p must be in [0, 1], got {self.min_p}"
        if self.max_new_tokens < 0:
            return f"max_new_tokens must be >= 0, got {self.max_new_tokens}"
        return self._validate_penalties()

    def _validate_penalties(self) -> str | None:
        """SGLang 0.5.23's ranges (SamplingParams.verify)."""
        for name in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value):
                return f"{name} must be a finite number, got {value!r}"
        if not -2.0 <= self.frequency_penalty <= 2.0:
            return f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"
        if not -2.0 <= self.presence_penalty <= 2.0:
            return f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"
        if not 0.0 < self.repetition_penalty <= 2.0:
            return f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {self.repetition_penalty}"
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            return f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], got {self.min_new_tokens}"
        for value in self.logit_bias.values():
            if not isinstance(value, int | float) or not math.isfinite(value):
                return f"logit_bias values must be finite numbers, got {value!r}"
        return None

    @property
    def has_penalties(self) -> bool:
        """Anything that changes the logits before sampling (runtime/scheduler/penalties.py)."""
        return bool(
            self.frequency_penalty
            or self.presence_penalty
            or self.repetition_penalty != 1.0
            or self.min_new_tokens
            or self.logit_bias
        )


@dataclass
class GenerateRequest:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0  # with return_logprob: the N most likely tokens at each position
    logprob_start_len: int = -1  # with return_logprob: first prompt position with a logprob (-1: none)
    # Structured output: the request's grammar state (runtime/scheduler/grammar.py RequestGrammar), compiled by
    # the server; the scheduler masks each sampled token with it. None: unconstrained.
    grammar: Any = None
    # PD disaggregation (runtime/pd): the prefill server's bootstrap address and the transfer's room id.
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    # n > 1: the rid of the first continuation of the same prompt. The scheduler forks this request off it
    # after its prefill (shared KV, a copy of the recurrent state) instead of prefilling the prompt again.
    fork_of: str | None = None


@dataclass
class RequestOutput:
    """One per engine step per request while it produces tokens; the last one has finished=True."""

    rid: str
    new_token_ids: list[int]
    finished: bool
    # SGLang's shapes: {"type": "stop", "matched": int | str}, {"type": "length", "length": n},
    # {"type": "abort", "message": str, "status_code": int, "err_type": str}
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    new_token_logprobs: list[float | None] | None = None  # only with GenerateRequest.return_logprob
    new_top_logprobs: list[list[tuple[float | None, int]]] | None = None  # with top_logprobs_num > 0
    # Prompt logprobs (logprob_start_len >= 0), once, in the first output: entry 0 is None, as SGLang's.
    input_token_logprobs: list[float | None] | None = None
    input_top_logprobs: list[list[tuple[float | None, int]] | None] | None = None
    # Speculative decoding (0 while off): verify rounds so far; accept length = completion_tokens / this.
    spec_verify_ct: int = 0
    spec_num_correct_drafts: int = 0  # drafts accepted so far (SGLang's spec_accept_rate numerator)
    spec_num_proposed_drafts: int = 0  # drafts verified so far (its denominator)


@dataclass
class EngineStats:
    """A snapshot of the engine: everything /metrics and /server_info report."""

    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    token_usage: float = 0.0  # in-use KV pages / total (cached pages are reclaimable: counted free)
    mamba_usage: float = 0.0  # in-use state slots / total
    cache_hit_rate: float = 0.0  # cached prompt tokens / prompt tokens, over the server's life
    max_total_num_tokens: int = 0
    max_mamba_cache_size: int = 0
    max_running_requests: int = 0
    context_len: int = 0
    page_size: int = 1
    chunked_prefill_size: int = 0
    max_prefill_tokens: int = 0
    radix_cache_enabled: bool = True
    mamba_radix_cache_strategy: str = ""
    mamba_track_interval: int = 0
    kv_pages_total: int = 0
    kv_pages_free: int = 0
    kv_pages_cached: int = 0
    kv_pages_in_use: int = 0
    state_slots_total: int = 0
    state_slots_free: int = 0
    state_slots_cached: int = 0
    state_slots_in_use: int = 0
    kv_evictions: int = 0  # KV pages evicted from the prefix cache
    state_evictions: int = 0  # cached states evicted
    state_checkpoints: int = 0  # states copied into the prefix cache
    state_forks: int = 0  # n > 1 continuations forked off a prefill (a state-slot copy each, KV shared)
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    cached_tokens_total: int = 0
    num_requests_total: int = 0
    num_requests_finished: int = 0
    num_requests_aborted: int = 0
    num_allocation_failures: int = 0
    gen_throughput: float = 0.0  # tokens/s over the last decode steps
    avg_spec_accept_length: float = 0.0  # emitted tokens / verify rounds, over the server's life
    spec_accept_length: float = 0.0  # the same over the last rounds (SGLang's per-interval gauge)
    spec_accept_rate: float = 0.0  # accepted drafts / proposed drafts
    spec_verify_calls_total: int = 0  # request-rounds verified
    kv_cache_bytes: int = 0
    conv_state_bytes: int = 0
    ssm_state_bytes: int = 0
    weight_bytes: int = 0
    # The compiled forwards running now (ModelRunner.compiled_paths): "decode+extend", "decode", "compiling",
    # "none"; "off" without --enable-torch-compile.
    torch_compile: str = "off"
    # The decode path (runtime/engine/native_decode.py): "on" (one C call a step) or "off: <reason>".
    native_decode: str = "off"
    # Its thread count: "2", "1 (RUNTIME_NATIVE_DECODE_THREADS)"; "" while native decode is off.
    native_decode_threads: str = ""
    elastic_mode: str = ""  # the elastic pool's mode ("" when the split is fixed)
    elastic_moves_total: int = 0  # chunks moved between the KV and state pools
    elastic_realloc_timeouts_total: int = 0
