"""The messages that reveal the five failure modes, as SGLang 0.5.x and the bundled runtime print them.

Each pattern quotes the source that emits it. Patterns match the message after the log prefix
("[2026-01-02 10:00:00 TP0] ") and ANSI colours are stripped, so one pattern covers every rank and
every place the text appears (the log call itself, `AssertionError: ...` / `RuntimeError: ...` at the end of a
traceback). `remedy` names the computation in remedies.py that turns the finding into config edits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hybridctl.config.findings import Severity


@dataclass(frozen=True)
class LogPattern:
    id: str
    code: str
    severity: Severity
    regex: re.Pattern[str]
    cause: str
    remedy: str
    source: str  # where the message comes from (file of the emitter), for docs/failure-modes.md


def _p(id: str, code: str, severity: Severity, regex: str, cause: str, remedy: str, src: str) -> LogPattern:
    return LogPattern(id, code, severity, re.compile(regex), cause, remedy, src)


PATTERNS: tuple[LogPattern, ...] = (
    # --- MAMBA_POOL_ALLOC -------------------------------------------------------------------------
    _p("sglang_mamba_alloc", "MAMBA_POOL_ALLOC", "error",
       r"Not enough space for mamba cache",
       "The recurrent-state pool had no free slot for a request being scheduled: it holds fewer slots than "
       "the running requests need (one each, plus tracking slots with extra_buffer).",
       "grow_state_pool", "sglang/srt/mem_cache/memory_pool.py (HybridReqToTokenPool.alloc)"),
    _p("sglang_ping_pong", "MAMBA_POOL_ALLOC", "error",
       r"Not enough space for mamba ping pong idx",
       "extra_buffer needs extra state slots per request to checkpoint states for the prefix cache, and the "
       "pool ran out of them; the scheduler dies instead of queueing the request.",
       "grow_state_pool", "sglang/srt/mem_cache/memory_pool.py (_alloc_ping_pong_buffer)"),
    _p("sglang_no_state_memory", "MAMBA_POOL_ALLOC", "error",
       r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache",
       "After weights and the reserve, the memory left for the state pool does not hold a single slot "
       "(max_mamba_cache_size came out <= 0).",
       "grow_state_pool", "sglang/srt/mem_cache/kv_cache_configurator.py"),
    _p("sglang_state_too_small", "MAMBA_POOL_ALLOC", "error",
       r"state cache is too small to serve\s+any requests?\b",
       "The state pool holds fewer slots than one request needs (slots per request = the radix-cache ratio), "
       "so the request cap came out 0.",
       "grow_state_pool", "sglang/srt/mem_cache/kv_cache_configurator.py"),
    _p("planner_no_state_memory", "MAMBA_POOL_ALLOC", "error",
       r"Not enough memory for the hybrid state cache",
       "The bundled runtime (hybridctl's planner) found no room for a single state slot in the pool budget.",
       "grow_state_pool", "hybridctl/planner/pool_sizing.py (bundled runtime start-up)"),
    _p("sglang_requests_capped", "MAMBA_POOL_ALLOC", "warning",
       r"max_running_requests is capped to \d+ by the mamba state\s*cache",
       "The state pool, not the KV pool, limits concurrency: fewer requests run at once than configured.",
       "grow_state_pool", "sglang/srt/mem_cache/kv_cache_configurator.py"),
    _p("runtime_state_alloc", "MAMBA_POOL_ALLOC", "error",
       r"Mamba state pool allocation failed",
       "The bundled runtime's state pool had no free slot for the request (it holds fewer slots than one "
       "request needs, or all are taken by running requests).",
       "grow_state_pool", "runtime/ (bundled runtime)"),
    # --- PREFIX_CACHE_MISS ------------------------------------------------------------------------
    _p("sglang_no_buffer_page", "PREFIX_CACHE_MISS", "error",
       r"no_buffer only supports page_size=1",
       "mamba_radix_cache_strategy no_buffer cannot checkpoint states inside a page larger than one token.",
       "prefix_page_size", "sglang/srt/arg_groups/mamba_hook.py (validate_mamba_no_buffer)"),
    _p("sglang_extra_buffer_unsupported", "PREFIX_CACHE_MISS", "error",
       r"extra_buffer is not supported for \S+; use no_buffer",
       "This architecture cannot take extra_buffer checkpoints; only no_buffer (page size 1) caches its "
       "states.",
       "prefix_page_size", "sglang/srt/arg_groups/mamba_hook.py (validate_mamba_extra_buffer)"),
    _p("runtime_snapshot_off", "PREFIX_CACHE_MISS", "warning",
       r"state[_ ]snapshot[_ ]on[_ ]match[=: ]+(False|false|off|disabled)",
       "Prefix matches do not restore the cached recurrent state, so a hybrid model must recompute the whole "
       "prompt: cached_tokens stays 0.",
       "enable_prefix_cache", "runtime/ (bundled runtime start-up)"),
    # --- SPEC_ROLLBACK ----------------------------------------------------------------------------
    _p("sglang_track_interval_assert", "SPEC_ROLLBACK", "error",
       r"assert view\.mamba_track_interval >= view\.speculative_num_draft_tokens",
       "extra_buffer checkpoints the state every mamba_track_interval tokens; a verify round of more draft "
       "tokens than that cannot be rolled back to a checkpoint.",
       "spec_track_interval", "sglang/srt/arg_groups/mamba_hook.py (validate_mamba_extra_buffer)"),
    _p("sglang_verify_topk", "SPEC_ROLLBACK", "error",
       r"(GDN|KDA) verify kernel only supports topk=1",
       "The linear-attention verify kernel keeps one state per draft position: a draft tree (topk > 1) "
       "cannot be rolled back.",
       "spec_topk_one", "sglang/srt/layers/attention/linear/kernels/*_flashinfer.py"),
    _p("sglang_mtp_topk", "SPEC_ROLLBACK", "error",
       r"MTP requires --speculative-eagle-topk 1",
       "Multi-token prediction drafts a chain; a tree of drafts cannot be rolled back on recurrent state.",
       "spec_topk_one", "sglang/srt/arg_groups/speculative_hook.py"),
    _p("sglang_packed_draft_state", "SPEC_ROLLBACK", "error",
       r"Packed (draft state requires target Mamba slot indices|MTP requires separate state for every draft)",
       "The draft model's recurrent state is not tied to the target's slots, so rejected drafts cannot be "
       "undone.",
       "spec_sandbox", "sglang/srt/speculative/base_spec_worker.py"),
    _p("runtime_spec_rollback", "SPEC_ROLLBACK", "error",
       r"Speculative decoding state rollback error",
       "The bundled runtime could not restore the recurrent state at the last accepted draft token.",
       "spec_sandbox", "runtime/ (bundled runtime)"),
    # --- ELASTIC_TIMEOUT --------------------------------------------------------------------------
    _p("sglang_vmm_handle", "ELASTIC_TIMEOUT", "error",
       r"no supported CUDA VMM allocation handle type",
       "No CUDA VMM allocation handle type works on this device/driver, so the unified (elastic) pool "
       "cannot be backed.",
       "elastic_off", "sglang/srt/utils/cuda_vmm_utils.py"),
    _p("sglang_vmm_backing", "ELASTIC_TIMEOUT", "warning",
       r"CUDA VMM \S+ backing unavailable on device \d+",
       "A CUDA VMM handle type failed its probe allocation on this device (driver too old or restricted).",
       "elastic_off", "sglang/srt/utils/cuda_vmm_utils.py"),
    _p("sglang_vmm_drv", "ELASTIC_TIMEOUT", "error",
       r"cuMem(Create|Map|SetAccess|AddressReserve)\([^)]*\): CUresult\.\w+",
       "A CUDA VMM driver call failed while backing or resizing the unified pool.",
       "elastic_off", "sglang/srt/utils/cuda_vmm_utils.py (check_drv)"),
    _p("sglang_unified_too_small", "ELASTIC_TIMEOUT", "error",
       r"UnifiedKVPool: sub-pool \S+ fits only \d+ slots|unified pool size \d+ leaves no allocatable page",
       "The unified (elastic) pool's buffer is too small to hold a page of one of its sub-pools.",
       "elastic_off", "sglang/srt/mem_cache/unified_memory_pool.py"),
    _p("sglang_unified_constraint", "ELASTIC_TIMEOUT", "error",
       r"--enable-unified-memory (\+ \S+ requires|with PD disaggregation (requires|supports|does not))",
       "--enable-unified-memory is refused in combination with another option (see the message).",
       "elastic_off", "sglang/srt/arg_groups/kv_cache_hook.py"),
    _p("runtime_elastic_timeout", "ELASTIC_TIMEOUT", "error",
       r"Elastic memory pool reallocation timeout",
       "Moving pages between the KV and state pools did not finish before elastic_realloc_timeout_s.",
       "elastic_off", "runtime/ (bundled runtime)"),
    # --- PD_STATE_MISMATCH ------------------------------------------------------------------------
    _p("sglang_pd_slot_size", "PD_STATE_MISMATCH", "error",
       r"Prefill/Decode Mamba slot size mismatch",
       "Prefill and decode servers lay out one state slot with different sizes (state dtype, TP size or "
       "model differ), so a transferred state would be garbage.",
       "pd_match_peer", "sglang/srt/disaggregation/mooncake/conn.py"),
    _p("sglang_pd_layouts", "PD_STATE_MISMATCH", "error",
       r"Mamba state layouts differ between prefill and decode",
       "Prefill and decode servers hold Mamba state in different layouts (unified memory on one side only, "
       "or different attention TP sizes).",
       "pd_match_peer", "sglang/srt/disaggregation/mooncake/conn.py"),
    _p("sglang_pd_lazy", "PD_STATE_MISMATCH", "error",
       r"extra_buffer_lazy unsupported under PD disaggregation",
       "The decode pool under PD cannot allocate lazy tracking slots.",
       "pd_strategy", "sglang/srt/arg_groups/mamba_hook.py"),
    _p("runtime_pd_size", "PD_STATE_MISMATCH", "error",
       r"PD transfer mamba state size mismatch",
       "The bundled runtime's decode side received a state whose size differs from its own slots.",
       "pd_match_peer", "runtime/ (bundled runtime)"),
)
