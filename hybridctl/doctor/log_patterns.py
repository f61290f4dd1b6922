"""The messages that reveal the five failure modes, as SGLang 0.5.x and the bundled runtime print them.

Each pattern quotes the source that emits it. Patterns match the message after the log prefix
("[2026-01-02 10:00:00 TP0] ") and ANSI colours are stripped, so one pattern covers every rank and
every place the text appears (the log call itself, `AssertionError: ...` / `RuntimeError: ...` at the end of a
traceback). `remedy` names the computation in remedies.py that turns the finding into config edits.

The regexes are written for the family of wordings (SGLang 0.4.x-0.5.x rewordings, forks, plugins, the article's
own messages), case-insensitively. A line is claimed by the FIRST pattern that matches it, so the tuple runs from
the most specific families (PD, speculative) to the broadest (state pool): "extra_buffer_lazy unsupported under
PD disaggregation" is PD_STATE_MISMATCH, not PREFIX_CACHE_MISS.
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
    return LogPattern(id, code, severity, re.compile(regex, re.IGNORECASE), cause, remedy, src)


PATTERNS: tuple[LogPattern, ...] = (
    # First: "Spec decoding ... incompatible with no_buffer on ROCm; disabling radix cache." is SGLang resolving
    # the conflict by dropping the prefix cache, a warning about the cache, not a speculative-decoding crash.
    _p("sglang_radix_auto_off", "PREFIX_CACHE_MISS", "warning",
       r"\bdisabl(?:e|ing) (?:the )?radix cache\b",
       "SGLang turned the radix cache off by itself for this combination of options: no request reuses a "
       "cached prefix.",
       "enable_prefix_cache", "sglang/srt/server_args.py (_handle_mamba_radix_cache)"),
    # --- PD_STATE_MISMATCH ------------------------------------------------------------------------
    _p("sglang_pd_slot_size", "PD_STATE_MISMATCH", "error",
       r"(?:Prefill/Decode|prefill and decode) (?:Mamba|state) slot sizes? (?:mismatch|differ)",
       "Prefill and decode servers lay out one state slot with different sizes (state dtype, TP size or "
       "model differ), so a transferred state would be garbage.",
       "pd_match_peer", "sglang/srt/disaggregation/mooncake/conn.py"),
    _p("sglang_pd_layouts", "PD_STATE_MISMATCH", "error",
       r"Mamba state layouts differ between prefill and decode",
       "Prefill and decode servers hold Mamba state in different layouts (unified memory on one side only, "
       "or different attention TP sizes).",
       "pd_match_peer", "sglang/srt/disaggregation/mooncake/conn.py"),
    _p("sglang_pd_lazy", "PD_STATE_MISMATCH", "error",
       r"extra_buffer_lazy (?:is )?(?:unsupported|not supported) (?:under|with|for) PD",
       "The decode pool under PD cannot allocate lazy tracking slots.",
       "pd_strategy", "sglang/srt/arg_groups/mamba_hook.py"),
    _p("sglang_pd_tp_hybrid", "PD_STATE_MISMATCH", "error",
       r"PD Disaggregation does NOT support (?:PD )?different (?:attention )?TP sizes? for [\w -]*"
       r"(?:mamba|hybrid|linear|SWA|NSA)",
       "Prefill and decode run different TP sizes and this release cannot slice a recurrent state across them: "
       "each decode rank would receive another rank's shard of the state.",
       "pd_match_peer", "sglang/srt/disaggregation/{common,mooncake,nixl}/conn.py (0.5.6-0.5.9x)"),
    _p("sglang_pd_state_transfer", "PD_STATE_MISMATCH", "error",
       r"Failed to (?:create|post|send|transfer|register) (?:the )?(?:Mamba|recurrent|SSM|linear) state"
       r"|Mamba should have (?:a )?single state index"
       r"|(?:mamba|recurrent|ssm) state (?:slice )?transfer (?:failed|error|timed out)",
       "The transfer backend (NIXL, Mooncake) could not move a request's recurrent state from prefill to "
       "decode: the two sides registered different state buffers.",
       "pd_match_peer", "sglang/srt/disaggregation/nixl/conn.py (_send_mamba_state*)"),
    _p("runtime_pd_size", "PD_STATE_MISMATCH", "error",
       r"PD transfer (?:of )?(?:the )?(?:mamba|recurrent|ssm) state size mismatch"
       r"|(?:mamba|recurrent|ssm) state size mismatch\b.{0,60}\b(?:prefill|decode|PD|transfer)"
       r"|(?:conv_state|ssm_state|temporal_state|mamba state|recurrent state)\b.{0,30}\b(?:shape|size|dim|dtype|"
       r"layout)s? (?:mismatch|differ)\w*\b.{0,80}\b(?:prefill|decode)",
       "The decode side received a state whose size differs from its own slots (the article's error 5).",
       "pd_match_peer", "runtime/ (bundled runtime); the article's message"),
    # Before the speculative patterns: "--enable-unified-memory + EAGLE3 requires ..." is about the unified pool.
    _p("sglang_unified_constraint", "ELASTIC_TIMEOUT", "error",
       r"--enable-unified-memory\b.{0,80}\b(?:requires?|needs|not supported|unsupported|incompatible|"
       r"does not support|is not (?:yet )?compatible|supports only|only supports|must)",
       "--enable-unified-memory is refused in combination with another option (see the message).",
       "elastic_off", "sglang/srt/arg_groups/kv_cache_hook.py"),
    # --- SPEC_ROLLBACK ----------------------------------------------------------------------------
    _p("sglang_track_interval_assert", "SPEC_ROLLBACK", "error",
       r"mamba_track_interval\s*>=\s*[\w.]*speculative_num_draft_tokens"
       r"|mamba_track_interval \S+ must be (?:greater than or equal to|>=|at least) speculative_num_draft_tokens",
       "extra_buffer checkpoints the state every mamba_track_interval tokens; a verify round of more draft "
       "tokens than that cannot be rolled back to a checkpoint.",
       "spec_track_interval", "sglang/srt/arg_groups/mamba_hook.py (validate_mamba_extra_buffer)"),
    _p("sglang_verify_topk", "SPEC_ROLLBACK", "error",
       r"(?:GDN|KDA|mamba|linear[- ]attention|hybrid)\b[\w ]{0,40}\bonly supports? "
       r"(?:spec(?:ulative)? )?(?:eagle[- ])?top-?k ?(?:=|==)? ?1",
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
    _p("sglang_spec_no_buffer", "SPEC_ROLLBACK", "error",
       r"Spec(?:ulative)? decoding\b.{0,80}\b(?:not compatible|incompatible)\b.{0,60}"
       r"\b(?:radix cache|no_buffer)"
       r"|(?:spec(?:ulative)?(?: decoding)?|eagle\d?|mtp|nextn|draft model)\b.{0,60}\b(?:is not supported|"
       r"not supported|unsupported|incompatible)\b.{0,40}\b(?:mamba|hybrid|linear[- ]attention|ssm)"
       # the strategy named first or second, in any release's wording ("extra_buffer_lazy unsupported with DFLASH",
       # "speculative decoding requires ... extra_buffer")
       r"|\b(?:no_buffer|extra_buffer_lazy)\b.{0,40}\b(?:unsupported|not supported|incompatible|not compatible)\b"
       r".{0,20}\b(?:with|for|under)\b.{0,20}\b(?:spec\w*|eagle\d?|mtp|nextn|dflash|dspark|standalone|ngram)\b"
       r"|(?:spec(?:ulative)?(?: decoding)?|eagle\d?|mtp|nextn)\b.{0,80}\b(?:requires?|needs|must use|only supports?)"
       r"\b.{0,60}\bextra_buffer\b",
       "no_buffer keeps no state checkpoints to roll a rejected draft back to, so SGLang refuses speculative "
       "decoding with the radix cache on (0.5.x spells the flag --mamba-scheduler-strategy).",
       "spec_extra_buffer", "sglang/srt/server_args.py (_handle_mamba_radix_cache, 0.5.5-0.5.1x)"),
    _p("sglang_spec_track_index", "SPEC_ROLLBACK", "error",
       r"mamba_(?:next_)?track_(?:idx|indices?|index)\b.{0,40}\bNone"
       r"|has no attribute '(?:update_mamba_state_after_mtp_verify|mamba_track\w*)'",
       "The speculative verify step found a request without its mamba tracking slot (spec v2 with "
       "extra_buffer): the state to roll back to was never recorded.",
       "spec_extra_buffer", "sglang/srt/managers/schedule_batch.py (set_mamba_track_indices_from_reqs)"),
    _p("runtime_spec_rollback", "SPEC_ROLLBACK", "error",
       r"(?:speculative|spec|draft|verify)[\w ]{0,30}\b(?:state )?roll ?back (?:error|failed|failure)",
       "The recurrent state could not be restored at the last accepted draft token (the article's error 3).",
       "spec_sandbox", "runtime/ (bundled runtime); the article's message"),
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
       r"cuMem(?:Create|Map|SetAccess|AddressReserve|Import\w*|Export\w*|Release|Unmap)\b.{0,60}"
       r"(?:CUresult|CUDA_ERROR|failed|error)|cu_mem_create\b",
       "A CUDA VMM driver call failed while backing, resizing or resuming an elastic pool (the driver is "
       "out of physical memory for the pages, or VMM is restricted here).",
       "elastic_off", "sglang/srt/utils/cuda_vmm_utils.py (check_drv); torch_memory_saver; kvcached"),
    _p("plugin_memory_saver", "ELASTIC_TIMEOUT", "error",
       r"\[torch_memory_saver(?:\.cpp)?\][^\n]{0,40}(?:error|CUDA_ERROR)"
       r"|(?:resume|release)_memory_occupation\b.{0,60}\b(?:timed out|timeout|failed)",
       "torch_memory_saver could not re-map the paused pools' physical pages on resume: the memory it gave "
       "back was taken meanwhile.",
       "elastic_off", "torch_memory_saver csrc (cu_mem_create / resume); sglang resume_memory_occupation"),
    _p("plugin_kvcached", "ELASTIC_TIMEOUT", "error",
       r"kvcached\b.{0,120}\b(?:error|failed|not supported|unsupported|timed? ?out|cannot|exception)"
       r"|(?:error|failed|exception)\b.{0,60}\bkvcached\b",
       "The kvcached elastic KV allocator failed to map or share its pages for this model's pools.",
       "elastic_off", "kvcached (ovg-project) integration"),
    _p("sglang_vmm_timeout", "ELASTIC_TIMEOUT", "error",
       r"\b(?:VMM|IPC handle|file descriptors?|shareable handles?|fd exchange)\b.{0,80}\b(?:timed out|timeout)"
       r"|\b(?:timed out|timeout)\b.{0,80}\b(?:VMM|IPC handles?|file descriptors?|shareable handles?)\b",
       "The TP ranks did not finish exchanging the elastic pool's VMM handles (file descriptors) in time.",
       "elastic_off", "sglang/srt/utils/cuda_vmm_utils.py (handle exchange under TP)"),
    _p("sglang_unified_too_small", "ELASTIC_TIMEOUT", "error",
       r"UnifiedKVPool: sub-pool \S+ fits only \d+ slots|unified pool size \d+ leaves no allocatable page"
       r"|unified (?:memory|kv)? ?pool\b.{0,60}\b(?:too small|below (?:the )?(?:floor|minimum))",
       "The unified (elastic) pool's buffer is too small to hold a page of one of its sub-pools.",
       "elastic_off", "sglang/srt/mem_cache/unified_memory_pool.py"),
    _p("runtime_elastic_timeout", "ELASTIC_TIMEOUT", "error",
       r"elastic (?:memory )?pool\b.{0,40}\b(?:realloc\w*|resiz\w*|mov\w*|grow\w*|shrink\w*)?\s*"
       r"(?:timeout|timed out|failed)|(?:timeout|timed out)\b.{0,60}\belastic (?:memory )?(?:pool|realloc)",
       "Moving pages between the KV and state pools did not finish in time (the article's error 4).",
       "elastic_off", "runtime/ (bundled runtime); the article's message"),
    # --- PREFIX_CACHE_MISS ------------------------------------------------------------------------
    _p("sglang_no_buffer_page", "PREFIX_CACHE_MISS", "error",
       r"no_buffer only supports page_size ?= ?1"
       r"|page[_ ]size must be 1 for (?:the )?mamba ?radix ?cache|only support page_size ?= ?1 in mamba radix",
       "The mamba radix cache without checkpoint buffers (no_buffer, v1) cannot checkpoint states inside a "
       "page larger than one token (NPU backends default to 128).",
       "prefix_page_size", "sglang/srt/arg_groups/mamba_hook.py; mem_cache/mamba_radix_cache.py (0.5.4-)"),
    _p("sglang_mamba_page_assert", "PREFIX_CACHE_MISS", "error",
       r"(?:mamba|ssm|recurrent)[\w ]{0,30}\bpages?[_ ]?(?:size)?\b.{0,60}\b(?:must|only supports?|"
       r"not supported|requires?|expected|mismatch|are single slots)"
       r"|mamba_track_interval \S+ must be divisible by page_size|FLA_CHUNK_SIZE or page_size must be divisible"
       r"|(?:mamba|ssm|recurrent)\w*\b.{0,40}\b(?:requires?|must|only supports?|expects?)\b.{0,12}\bpage[_ ]size"
       r" ?(?:=|==|of)? ?1\b",
       "A mamba cache component refuses this page size (decode context parallelism or a backend's default "
       "page): its states cannot be cached at page granularity.",
       "prefix_page_size", "sglang/srt/mem_cache/unified_memory_pool.py; mem_cache/unified_cache/"),
    _p("sglang_extra_buffer_unsupported", "PREFIX_CACHE_MISS", "error",
       r"extra_buffer(?!_lazy) (?:is (?:not|only) supported|unsupported|requires platform support)"
       r"|extra_buffer(?!_lazy)\b.{0,20}\b(?:needs|requires)\b.{0,40}\b(?:CUDA|MUSA|NPU|FLA|platform)\b"
       r"|(?:cannot|can't|does not|doesn't|unable to)\b.{0,80}\b(?:states?|checkpoints?|snapshots?)\b.{0,40}"
       r"\brequired by\b.{0,40}\bextra_buffer",
       "This architecture or platform cannot take extra_buffer checkpoints (KDA before 0.5.2x); only "
       "no_buffer (page size 1) caches its states.",
       "prefix_page_size", "sglang/srt/arg_groups/mamba_hook.py (validate_mamba_extra_buffer)"),
    _p("sglang_radix_sanity", "PREFIX_CACHE_MISS", "error",
       r"Mamba Radix (?:tree|cache) sanity check failed",
       "The mamba radix tree's bookkeeping broke (cached states and LRU lists disagree).",
       "enable_prefix_cache", "sglang/srt/mem_cache/mamba_radix_cache.py"),
    _p("sglang_external_cache_hybrid", "PREFIX_CACHE_MISS", "error",
       r"(?:hicache|hierarchical[- _]cache|host[- ]pool|lmcache|mooncake[- ]store|storage backend|"
       r"external (?:kv|cache)|radix[- _]cache)"
       r"\b.{0,80}\b(?:does not support|doesn't support|(?:is )?not (?:yet )?supported (?:for|with)|"
       r"unverified (?:for|with)|not verified (?:for|with))\b.{0,40}\b(?:mamba|hybrid|linear|ssm)"
       r"|(?:mamba|hybrid|linear[- ]attention|ssm)\b.{0,60}\b(?:does not support|doesn't support|"
       r"(?:is )?not (?:yet )?supported (?:with|by))\b.{0,30}\b(?:hicache|hierarchical[- _]cache|lmcache|"
       r"storage|host[- ]pool|radix[- _]cache|prefix cach)"
       r"|(?:mamba|ssm|recurrent|linear[- ]attention) state\b.{0,40}\bnot (?:yet )?verified with \w*(?:Radix|Cache)",
       "The external / hierarchical KV store does not save recurrent state, so its hits cannot be used by a "
       "hybrid model (the radix cache is unverified with it).",
       "enable_prefix_cache", "sglang/srt/mem_cache/registry.py; storage connectors"),
    # A warning whose effect shows later: extra_buffer checkpoints are skipped, so later prefixes miss. Kept as a
    # finding only when the prefills after it cache nothing (log_evidence.confirm_precursors).
    _p("sglang_checkpoint_skip", "PREFIX_CACHE_MISS", "warning",
       r"skip\w* (?:the )?(?:mamba |recurrent |ssm )?state (?:checkpoints?|snapshots?)"
       r"|chunked_prefill_size=\d+ smaller than mamba_cache_chunk_size",
       "extra_buffer is on but chunked prefill hands off chunks shorter than the mamba checkpoint chunk, so "
       "the state at those points is never checkpointed: prefixes ending there cannot be reused.",
       "enable_prefix_cache", "sglang/srt/arg_groups/mamba_hook.py (validate_mamba_extra_buffer, 0.5.17+)"),
    _p("runtime_prefix_miss", "PREFIX_CACHE_MISS", "warning",
       r"prefix cache miss\b.{0,40}\b(?:mamba|ssm|recurrent|state)",
       "The KV prefix matched but the recurrent state at that point was not cached, so the whole prompt is "
       "recomputed (the article's error 2).",
       "enable_prefix_cache", "runtime/ (bundled runtime); the article's message"),
    _p("runtime_snapshot_off", "PREFIX_CACHE_MISS", "warning",
       r"state[_ ]snapshot[_ ]on[_ ]match[=: ]+(False|off|disabled)",
       "Prefix matches do not restore the cached recurrent state, so a hybrid model must recompute the whole "
       "prompt: cached_tokens stays 0.",
       "enable_prefix_cache", "runtime/ (bundled runtime start-up)"),
    # --- MAMBA_POOL_ALLOC -------------------------------------------------------------------------
    _p("sglang_ping_pong", "MAMBA_POOL_ALLOC", "error",
       r"Not enough space for mamba ping ?pong",
       "extra_buffer needs extra state slots per request to checkpoint states for the prefix cache, and the "
       "pool ran out of them; the scheduler dies instead of queueing the request.",
       "grow_state_pool", "sglang/srt/mem_cache/memory_pool.py (_alloc_ping_pong_buffer)"),
    _p("sglang_mamba_alloc", "MAMBA_POOL_ALLOC", "error",
       r"Not enough (?:space|slots?|room) (?:for|in) (?:the )?(?:mamba|ssm|recurrent|state)"
       r"|can ?not alloc(?:ate)? (?:a )?mamba|exceeds (?:the )?available mamba cache"
       r"|(?:mamba|ssm|recurrent|state) (?:state )?(?:pool|cache) (?:is )?(?:full|exhausted|out of (?:slots|space))"
       r"|failed to alloc\w* (?:a |the )?(?:mamba|ssm|recurrent|linear[- ]attention) (?:state|cache|slot)"
       r"|no free (?:mamba|ssm|recurrent|state) (?:state )?(?:slots?|cache)",
       "The recurrent-state pool had no free slot for a request being scheduled: it holds fewer slots than "
       "the running requests need (one each, plus tracking slots with extra_buffer).",
       "grow_state_pool", "sglang/srt/mem_cache/memory_pool.py (HybridReqToTokenPool.alloc; 0.5.2+)"),
    _p("sglang_no_state_memory", "MAMBA_POOL_ALLOC", "error",
       r"Not enough (?:\w+ )?memory (?:for|to allocate) (?:the )?(?:hybrid\b.{0,40}state cache|mamba|ssm|"
       r"recurrent|linear[- ]attention)",
       "After weights and the reserve, the memory left for the state pool does not hold a single slot "
       "(max_mamba_cache_size came out <= 0).",
       "grow_state_pool", "sglang/srt/mem_cache/kv_cache_configurator.py; hybridctl planner"),
    _p("sglang_state_too_small", "MAMBA_POOL_ALLOC", "error",
       r"state cache is too small to serve\s+any requests?\b",
       "The state pool holds fewer slots than one request needs (slots per request = the radix-cache ratio), "
       "so the request cap came out 0.",
       "grow_state_pool", "sglang/srt/mem_cache/kv_cache_configurator.py"),
    _p("sglang_requests_capped", "MAMBA_POOL_ALLOC", "warning",
       r"max_running_requests (?:is|was|has been) (?:capped|clamped|limited|reduced) to \d+ by the mamba",
       "The state pool, not the KV pool, limits concurrency: fewer requests run at once than configured.",
       "grow_state_pool", "sglang/srt/mem_cache/kv_cache_configurator.py"),
    _p("runtime_state_alloc", "MAMBA_POOL_ALLOC", "error",
       r"(?:mamba|ssm|recurrent|linear[- ]attention)[\w ]{0,12} state pool (?:allocation|alloc) failed"
       r"|(?:mamba|recurrent) state pool allocation failed",
       "The state pool had no free slot for the request: it holds fewer slots than one request needs, or "
       "all are taken by running requests (the article's error 1).",
       "grow_state_pool", "runtime/ (bundled runtime); the article's message"),
)
