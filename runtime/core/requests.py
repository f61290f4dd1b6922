"""Requests, sampling parameters, outputs and stats: the values the engine, the scheduler, spec, PD and the HTTP
server pass between them. No torch here: the server's request parsing imports this module."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field, replace
from typing import Any

SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what a 64-bit generator seed can hold (torch takes both signs)


def short_repr(v: Any, limit: int = 80) -> str:
    """A value's repr for an error message, cut: a client's megabyte of JSON never comes back in the error."""
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SamplingError(ValueError):
    """A sampling parameter the engine cannot sample with; the message names the field as the client sent it."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    try:
        return _is_number(value) and math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


@dataclass
class SamplingParams:
    """The sampling parameters of one request, checked when built: the only range checks of these fields.

    Every way in builds one (the HTTP parsers, fan-out, in-process callers), so the scheduler and the
    sampler take the values as given."""

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
    # Field -> the name the client sent it as (/generate's `sampling_seed`, OpenAI's `max_tokens`), so an
    # error names what was sent. Not stored.
    spelled: InitVar[Mapping[str, str] | None] = None

    def __post_init__(self, spelled: Mapping[str, str] | None) -> None:
        problem = self._problem(spelled or {})
        if problem is not None:
            raise SamplingError(problem)

    def _problem(self, spelled: Mapping[str, str]) -> str | None:
        """A one-line reason when the values cannot be sampled with (SGLang 0.5.23's ranges), else None."""

        def name(key: str) -> str:
            return spelled.get(key, key)

        for key in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            value = getattr(self, key)
            if not _is_finite(value):
                return f"{name(key)} must be a finite number, got {short_repr(value)}"
        for key in ("top_k", "max_new_tokens", "min_new_tokens"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool):
                return f"{name(key)} must be an integer, got {short_repr(value)}"
        if self.temperature < 0:
            return f"{name('temperature')} must be >= 0, got {self.temperature}"
        if not 0 < self.top_p <= 1:
            return f"{name('top_p')} must be in (0, 1], got {self.top_p}"
        if self.top_k == 0 or self.top_k < -1:
            return f"{name('top_k')} must be -1 (disabled) or >= 1, got {short_repr(self.top_k)}"
        if not 0 <= self.min_p <= 1:
            return f"{name('min_p')} must be in [0, 1], got {self.min_p}"
        if self.max_new_tokens < 0:
            return f"{name('max_new_tokens')} must be >= 0, got {short_repr(self.max_new_tokens)}"
        if self.seed is not None and (
            not isinstance(self.seed, int) or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]
        ):
            return (
                f"{name('seed')} must fit in 64 bits ({SEED_RANGE[0]} to {SEED_RANGE[1]}), got {short_repr(self.seed)}"
            )
        return self._penalty_problem(name)

    def _penalty_problem(self, name: Callable[[str], str]) -> str | None:
        if not -2 <= self.frequency_penalty <= 2:
            return f"{name('frequency_penalty')} must be in [-2, 2], got {self.frequency_penalty:g}"
        if not -2 <= self.presence_penalty <= 2:
            return f"{name('presence_penalty')} must be in [-2, 2], got {self.presence_penalty:g}"
        if not 0 < self.repetition_penalty <= 2:
            return f"{name('repetition_penalty')} must be in (0, 2], got {self.repetition_penalty:g}"
        if self.min_new_tokens < 0:
            return f"{name('min_new_tokens')} must be >= 0, got {short_repr(self.min_new_tokens)}"
        if self.min_new_tokens > self.max_new_tokens:
            return (
                f"{name('min_new_tokens')} must be in [0, {name('max_new_tokens')}({self.max_new_tokens})], "
                f"got {short_repr(self.min_new_tokens)}"
            )
        for value in self.logit_bias.values():
            if not _is_finite(value):
                return f"{name('logit_bias')} values must be finite numbers, got {short_repr(value)}"
        return None

    def vocab_problem(self, vocab_size: int) -> str | None:
        """The check that needs the model's vocabulary (the server's, when it prepares the request)."""
        outside = [t for t in self.logit_bias if not 0 <= t < vocab_size]
        if outside:
            return f"logit_bias must have keys in [0, {vocab_size - 1}], got {outside[0]}"
        return None

    def stop_ids(self, eos_ids: Sequence[int]) -> list[int]:
        """The tokens that finish the request (unless ignore_eos) and that min_new_tokens holds back: EOS and
        the request's stop_token_ids."""
        return [*eos_ids, *self.stop_token_ids]

    def held_stop_prefix(self, text: str) -> int:
        """Length of the longest end of `text` that is the start of (or is) a stop string; 0 when none: what
        a stream holds back until the next token shows whether the request stops there."""
        held = 0
        for stop in self.stop:
            for k in range(min(len(stop), len(text)), held, -1):
                if text.endswith(stop[:k]):
                    held = k
                    break
        return held

    def for_continuation(self, j: int) -> SamplingParams:
        """Continuation j's parameters when a prompt is sampled n times: a seeded request gives each its own
        seed derived from the client's, so the n samples differ and the same request reproduces them."""
        if self.seed is None:
            return replace(self)
        return replace(self, seed=continuation_seed(self.seed, j))

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


def prompt_problem(ids: Sequence[int], context_len: int) -> str | None:
    """Why a prompt cannot be served by an engine of `context_len` tokens, else None: the server refuses it with
    this before it queues, the scheduler for a request that came in-process."""
    if not ids:
        return "The prompt is empty: it tokenizes to 0 tokens; send at least one token."
    if len(ids) >= context_len:
        return f"The input ({len(ids)} tokens) is longer than the model's context length ({context_len} tokens)."
    return None


_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: continuation seeds far apart from the client's


def continuation_seed(seed: int, j: int) -> int:
    """Continuation j's seed: the client's own for j == 0 (n == 1 samples as before), a mixed one after."""
    if j == 0:
        return seed
    z = (seed + j * _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) >> 1  # 63 bits: a valid torch seed of either sign convention


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
    # False: the finished sequence is not put in the prefix cache (the health probe: a cached state would hold a
    # state slot, tens of MB for a real-size model, for a prompt no client sends).
    cache_result: bool = True

    @property
    def disaggregated(self) -> bool:
        """Served by PD (prefill on one server, decode on another): it names a transfer room and wants
        tokens; a warm-up or health probe (no tokens) with a room is served whole where it lands."""
        return self.bootstrap_room is not None and self.sampling.max_new_tokens > 0


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
