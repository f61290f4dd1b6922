"""Traceback signatures: a failure recognised from its exception type and the frames it passed through.

A message pattern (log_patterns.py) needs the right words; many real failures say only "torch.OutOfMemoryError:
CUDA out of memory" or "TypeError: 'NoneType' object cannot be interpreted as an integer". What makes them one
of the five is WHERE they were raised: an OOM whose innermost pool frame is the mamba/hybrid state pool's
constructor is MAMBA_POOL_ALLOC; the same OOM in the KV pool's constructor is not. Each signature below names
the exception types, the frames (module or function names, or the source line printed under a frame) and,
where needed, the message; all given parts must match.

A fatal traceback no signature or message pattern explains becomes UNKNOWN_FAILURE, which names the exception,
the innermost SGLang frame and the nearest code by the words its frames and message use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hybridctl.doctor.log_traceback import Frame, Traceback

_STATE_FRAME = re.compile(
    r"mamba|\bssm|conv_state|HybridReqToTokenPool|state_pool|StatePool|linear_state|recurrent|_init_state",
    re.IGNORECASE,
)
_KV_FRAME = re.compile(r"TokenToKVPool|kv_buffer|k_buffer|v_buffer|_create_buffers|KVCache\b|kv_cache_pool", re.I)
_POOL_FRAME = re.compile(r"pool|cache|alloc|buffer", re.IGNORECASE)


@dataclass(frozen=True)
class Signature:
    id: str
    code: str
    exc: re.Pattern[str] | None  # the exception type (short or dotted)
    frames: re.Pattern[str] | None  # searched in every frame's module, function and source line
    message: re.Pattern[str] | None
    cause: str
    remedy: str


def _s(
    id: str, code: str, exc: str | None, frames: str | None, message: str | None, cause: str, remedy: str
) -> Signature:
    def c(p: str | None) -> re.Pattern[str] | None:
        return re.compile(p, re.IGNORECASE) if p else None

    return Signature(id, code, c(exc), c(frames), c(message), cause, remedy)


_OOM_TYPES = r"OutOfMemory|MemoryError|RuntimeError|CudaError|AcceleratorError|AssertionError|ValueError"
# "Not enough host memory available" is HiCache's host pool (pool_host/mamba.py for the state's host copy).
_OOM_WORDS = r"out of memory|\bOOM\b|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|not enough (?:\w+ )?memory"

SIGNATURES: tuple[Signature, ...] = (
    _s(
        "tb_spec_track_index",
        "SPEC_ROLLBACK",
        r"TypeError|AttributeError|AssertionError|IndexError",
        r"set_mamba_track_indices|mamba_track|update_mamba_state_after_(?:mtp_)?verify|prepare_for_v2_verify",
        None,
        "The speculative verify step could not find the recurrent state to roll back to (a request without its "
        "mamba track slot on the spec-v2 / extra_buffer path).",
        "spec_extra_buffer",
    ),
    _s(
        "tb_pd_state",
        "PD_STATE_MISMATCH",
        None,
        r"disaggregation\.|_send_mamba_state|send_state|maybe_send_extra|KVArgsRegisterInfo",
        r"mamba|state|TP size|tp_size|slice|dst_state",
        "The PD transfer of a request's recurrent state failed between prefill and decode (different TP sizes "
        "or state layouts on the two sides).",
        "pd_match_peer",
    ),
    _s(
        "tb_elastic_plugin",
        "ELASTIC_TIMEOUT",
        None,
        r"kvcached|torch_memory_saver|cuda_vmm|unified_memory_pool|elastic|memory_saver|vmm",
        None,
        "An elastic / virtual-memory pool (kvcached, torch_memory_saver, unified memory) failed to map, resize "
        "or resume its pages.",
        "elastic_off",
    ),
    _s(
        "tb_prefix_radix",
        "PREFIX_CACHE_MISS",
        r"AssertionError|ValueError|RuntimeError|KeyError|IndexError",
        r"mamba_radix_cache|MambaRadixCache|match_prefix.*mamba|mamba.*match_prefix|hybrid_cache_controller",
        None,
        "The mamba radix (prefix) cache failed while matching, inserting or evicting a cached state.",
        "enable_prefix_cache",
    ),
    _s(
        "tb_state_alloc",
        "MAMBA_POOL_ALLOC",
        r"AssertionError|TypeError|RuntimeError",
        r"_alloc_ping_pong|mamba_pool\.alloc|alloc_mamba|HybridReqToTokenPool",
        r"alloc|space|None|slot",
        "A request found no free recurrent-state slot while being scheduled.",
        "grow_state_pool",
    ),
)


def state_pool_oom(tb: Traceback) -> bool:
    """An out-of-memory whose innermost pool frame belongs to the state pool (not the KV pool)."""
    if not (re.search(_OOM_TYPES, tb.exc_type) and re.search(_OOM_WORDS, tb.message, re.IGNORECASE)):
        return False
    for frame in reversed(tb.frames):
        text = frame.text()
        if _KV_FRAME.search(text):
            return False
        if _STATE_FRAME.search(text) and _POOL_FRAME.search(text):
            return True  # a pool/cache frame of the state (not a mamba layer's forward, whose OOM is activations)
    return False


def _frames_match(pattern: re.Pattern[str], frames: list[Frame]) -> bool:
    """Where the exception passed: module and function. The source line under a frame is code that merely
    names things (`assert not metadata.has_mamba_track_mask`), so it counts only with the message."""
    return any(pattern.search(f"{f.module} {f.func}") for f in frames)


def match_traceback(tb: Traceback) -> Signature | None:
    if state_pool_oom(tb):
        return STATE_POOL_OOM
    for sig in SIGNATURES:
        if sig.exc and not sig.exc.search(tb.exc_type):
            continue
        if sig.frames and not _frames_match(sig.frames, tb.frames):
            continue
        if sig.message and not sig.message.search(f"{tb.message} {' '.join(f.source for f in tb.frames)}"):
            continue
        if not tb.exc_type:
            continue
        return sig
    return None


STATE_POOL_OOM = Signature(
    "tb_state_pool_oom", "MAMBA_POOL_ALLOC", None, None, None,
    "The GPU ran out of memory while the recurrent-state pool was being allocated (the traceback passes "
    "through the mamba/hybrid state pool's constructor): the pool asked for more than the memory left after "
    "weights and the KV pool (WSL2 and HiCache host pools leave less than the GPU's total suggests).",
    "grow_state_pool",
)  # fmt: skip

_NEAREST: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (code, re.compile(words, re.IGNORECASE))
    for code, words in (
        ("PD_STATE_MISMATCH", r"disaggregation|bootstrap|transfer|nixl|mooncake|kv_?sender|kv_?receiver"),
        ("SPEC_ROLLBACK", r"speculative|eagle|draft|verify|\bmtp\b|nextn|spec_"),
        ("ELASTIC_TIMEOUT", r"unified_memory|\bvmm\b|cuda_vmm|elastic|kvcached|memory_saver|cuMem"),
        ("PREFIX_CACHE_MISS", r"radix|prefix|tree_cache|match_prefix|hicache|cache_finished_req"),
        ("MAMBA_POOL_ALLOC", r"mamba_pool|MambaPool|HybridReqToTokenPool|mamba_cache|state_pool|ssm_state"),
    )
)


def nearest_code(tb: Traceback) -> str | None:
    """The failure mode whose vocabulary the traceback uses most (None when it uses none)."""
    text = " ".join([tb.message, *(f.text() for f in tb.frames)])
    scores = [(len(p.findall(text)), code) for code, p in _NEAREST]
    best = max(scores)
    return best[1] if best[0] > 0 else None
