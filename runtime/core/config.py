"""The engine's launch options (`EngineArgs`, SGLang's flag names with underscores) and the model directory's
config.json as the launch reads it. No torch: preflight and the server import this module."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hybridshared.flags.fields import engine_values
from hybridshared.flags.runtime_args import (
    DEFAULT_DECODE_PAUSE_TARGET_MS,
    DEFAULT_TORCH_COMPILE_MAX_BS,
    DEFAULT_TORCH_COMPILE_MAX_EXTEND_TOKENS,
    RuntimeArgs,
)
from hybridshared.sizing.runtime_pools import DEFAULT_MAMBA_TRACK_INTERVAL


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
    memory_budget_gib: float | None = None  # CPU: the device's memory (None: runtime_pools.DEFAULT_MEMORY_BUDGET_GIB)
    mamba_full_memory_ratio: float = 0.9
    max_mamba_cache_size: int | None = None
    mamba_ssm_dtype: Literal["float32", "bfloat16", "float16"] | None = None  # None: model config or fp32
    mamba_radix_cache_strategy: Literal["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"] = "auto"
    mamba_track_interval: int = DEFAULT_MAMBA_TRACK_INTERVAL
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int = 8192  # -1 or 0: no chunking
    # Decode rows ride in prefill steps, one forward for both (SGLang's --enable-mixed-chunk); False: the two kinds
    # of step alternate.
    enable_mixed_chunk: bool = True
    # While requests decode, the most tokens a step computes (decode rows included); "auto": the tokens that keep a
    # step within decode_pause_target_ms, from measured step times (runtime/scheduler/step_budget.py); None: the
    # device's default ("auto" on CPU, no cap elsewhere); <= 0: no cap but chunked_prefill_size.
    decoding_step_tokens: int | str | None = None
    decode_pause_target_ms: float = DEFAULT_DECODE_PAUSE_TARGET_MS
    # A prefill step takes further prompts only while it holds at most this many prompt tokens (SGLang's
    # --max-prefill-tokens); None: the device's default (DEFAULT_CPU_MAX_PREFILL_TOKENS on CPU).
    max_prefill_tokens: int | None = None
    schedule_policy: Literal["fcfs", "lpm"] = "fcfs"
    state_snapshot_on_match: bool = True
    state_copy_on_write: bool = True
    dual_lru_eviction: bool = True
    random_seed: int = 0
    log_mamba_state_stats: bool = False
    context_length: int | None = None  # None: the model's max_position_embeddings
    # Speculative decoding (runtime/speculative): None algorithm turns it off.
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
    # runtime/engine/background_compile.py: with enable_torch_compile, serve eager at once and install the compiled
    # forwards when a background thread has built them.
    torch_compile_in_background: bool = False
    # runtime/engine/native_decode.py: decode steps as one C call where the model is supported ("auto"), required
    # ("on": refuse to start otherwise), or never ("off").
    native_decode: str = "auto"


def read_hf_config(model_path: str) -> dict[str, Any]:
    """The model directory's config.json as a dict; {} when it is missing or not a JSON object (the loader then
    names the problem)."""
    path = Path(model_path) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def engine_args(options: RuntimeArgs, device: str) -> EngineArgs:
    """The engine's options, derived field by field from each `RuntimeArgs` field's `engine` metadata, on the
    resolved `device`. Options left None are left to the engine's defaults, as SGLang leaves them to its
    resolution."""
    return EngineArgs(**engine_values(options), device=device)
