"""The engine's public API: what the HTTP server (and tests) use to drive the engine.

The engine loop runs in its own thread. `EngineClient` methods are thread-safe; `on_output` callbacks are
called FROM THE ENGINE THREAD (an asyncio server hops back with `loop.call_soon_threadsafe`, once per step:
see `EngineClient.add_step_listener`). Every request
gets exactly one `RequestOutput` with `finished=True`, whatever happens to it (stop, length, abort, allocation
failure).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

# Runtime default: a state checkpoint every 64 prompt tokens lets a request that shares a 2000-token document
# with an earlier one resume from token 1984 (warm TTFT ~0.07 of a cold 2048-token prompt; 128: ~0.13). The
# model writes checkpoints during the prefill forward, so a cold prompt pays only their slots, not time
# (docs/runtime-design.md). The price is state memory: one slot per 64 prompt tokens, evicted LRU.
# Both defaults live beside the runtime's sizing function, which the planner also calls.
from hybridctl.planner.builtin_sizing import DEFAULT_MAMBA_TRACK_INTERVAL  # noqa: E402

DEFAULT_TORCH_COMPILE_MAX_BS = 32  # SGLang's --torch-compile-max-bs default
DEFAULT_TORCH_COMPILE_MAX_EXTEND_TOKENS = 128  # the runtime's own (compiled_extend.py)


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
        return None


@dataclass
class GenerateRequest:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False
    return_logprob: bool = False
    # PD disaggregation (runtime/pd): the prefill server's bootstrap address and the transfer's room id.
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None


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
    new_token_logprobs: list[float] | None = None  # only with GenerateRequest.return_logprob
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
    elastic_mode: str = ""  # the elastic pool's mode ("" when the split is fixed)
    elastic_moves_total: int = 0  # chunks moved between the KV and state pools
    elastic_realloc_timeouts_total: int = 0


@dataclass
class EngineArgs:
    """Launch options of the engine (names follow SGLang's flags, with underscores)."""

    model_path: str
    tokenizer_path: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "cpu"
    page_size: int = 1
    disable_radix_cache: bool = False
    mem_fraction_static: float = 0.85
    memory_budget_gib: float | None = None  # CPU: the device's memory (None: builtin_sizing.DEFAULT_MEMORY_BUDGET_GIB)
    mamba_full_memory_ratio: float = 0.9
    max_mamba_cache_size: int | None = None
    mamba_ssm_dtype: Literal["float32", "bfloat16", "float16"] | None = None  # None: model config or fp32
    mamba_radix_cache_strategy: Literal["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"] = "auto"
    mamba_track_interval: int = DEFAULT_MAMBA_TRACK_INTERVAL
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int = 8192  # -1 or 0: no chunking
    schedule_policy: Literal["fcfs", "lpm"] = "fcfs"
    state_snapshot_on_match: bool = True
    state_copy_on_write: bool = True
    dual_lru_eviction: bool = True
    random_seed: int = 0
    log_mamba_state_stats: bool = False
    context_length: int | None = None  # None: the model's max_position_embeddings
    # Speculative decoding (runtime/spec): None algorithm turns it off.
    speculative_algorithm: str | None = None  # NGRAM | STANDALONE | NEXTN | EAGLE
    speculative_num_steps: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_draft_model_path: str | None = None
    enable_mamba_state_sandbox: bool = True
    # Elastic pool (runtime/kvcache/elastic_pool.py): pages move between the KV and state pools at run time.
    enable_elastic_memory_pool: bool = False
    elastic_realloc_timeout_s: float = 5.0
    # runtime/engine/compiled_decode.py: decode batches of up to torch_compile_max_bs run a compiled forward.
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = DEFAULT_TORCH_COMPILE_MAX_BS
    # runtime/engine/compiled_extend.py: with enable_torch_compile, one-sequence extends of up to this many new
    # tokens run a compiled forward (0: extends stay eager).
    torch_compile_max_extend_tokens: int = DEFAULT_TORCH_COMPILE_MAX_EXTEND_TOKENS


class EngineClient:
    """Handle on a running engine. All methods are thread-safe."""

    def add_request(self, req: GenerateRequest, on_output: Callable[[RequestOutput], None]) -> None:
        raise NotImplementedError

    def add_step_listener(self, listener: Callable[[], None]) -> bool:
        """Have `listener` called on the engine thread after every engine step (and the commands before it), once
        that step's outputs were all passed to their `on_output`; a consumer may then buffer outputs and act once
        per step. True when every `on_output` call comes from that thread and is followed by such a call; False
        (this default) when the client makes no such promise: act on each output as it comes."""
        return False

    def abort(self, rid: str) -> None:
        """Free everything the request holds; it finishes with type "abort". Unknown rid: no-op."""
        raise NotImplementedError

    def flush_cache(self) -> bool:
        """Empty the prefix cache. False (nothing flushed) while requests run or wait, as SGLang."""
        raise NotImplementedError

    def stats(self) -> EngineStats:
        raise NotImplementedError

    def resolved_args(self) -> dict[str, Any]:
        """The launch options after defaults were resolved (for /server_info)."""
        raise NotImplementedError

    def failure(self) -> str | None:
        """None while the engine loop runs; else why it died (the server then fails /health and exits)."""
        return None

    def shutdown(self) -> None:
        raise NotImplementedError


def start_engine(args: EngineArgs) -> EngineClient:
    """Load the model and tokenizer, size and allocate both pools (logging them), start the engine thread."""
    from runtime.engine.engine_thread import ThreadedEngineClient

    return ThreadedEngineClient.start(args)
