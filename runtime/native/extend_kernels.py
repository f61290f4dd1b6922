"""Short extends in C (`extend_kernels.c`): a gated-DeltaNet layer's conv, gates, delta rule and gated norm over a
few new tokens in one call, token by token, instead of the chunked torch form's ~100 dispatched ops a layer; a
sparse MoE block with its router (`moe_kernels.c`); the RMSNorms. One library (`short_extend.c`), its work split over
one worker pool (`parallel.h`) of `threads()` threads, any count giving the same bits.

Tensors in, tensors out; this module validates every tensor (dtype, device, layout, shape, slot ranges) before a
call, because a wrong pointer in C is a segfault that takes the server down. Anything it cannot take (not fp32,
not CPU, odd strides) is refused with `NativeRefused` and the caller runs its torch path.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.native.build import DEFAULT_FLAGS, NativeLibrary, load_once, load_state
from runtime.native.threads import pinned_from_env, usable_threads

logger = logging.getLogger("runtime.native")
HERE = Path(__file__).parent
# -fno-trapping-math: lets the branch-free clamps of the C exp vectorize (no FP exception is ever observed here).
# -ffp-contract=fast: a*b+c as one FMA (the matmuls' and the delta rule's inner steps); one rounding instead of two.
FLAGS = (*DEFAULT_FLAGS, "-fno-trapping-math", "-ffp-contract=fast")
_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
# One library (short_extend.c includes extend_kernels.c and moe_kernels.c): one worker pool for all of them.
SOURCE = HERE / "short_extend.c"
FUNCTIONS: dict[str, list[type]] = {
    "gdn_short_extend": [
        _I64,
        *[_PTR] * 4,
        _I64,
        _PTR,
        _I64,
        _PTR,
        _PTR,
        _I64,
        *[_PTR] * 7,
        _F32,
        *[_I64] * 6,
        *[_PTR] * 4,
        _I64,
    ],
    "gdn_chunked_extend": [],  # gdn_short_extend's arguments (set below)
    "rmsnorm_rows": [_I64, _I64, _PTR, _I64, _PTR, _F32, _PTR],
    "rmsnorm_rows_bf16": [_I64, _I64, _PTR, _I64, _PTR, _F32, _PTR],
    "residual_rmsnorm": [_I64, _I64, _PTR, _PTR, _PTR, _F32, _PTR, _PTR],
    "moe_short_extend": [*[_I64] * 5, _PTR, _I64, _PTR, _I64, *[_PTR] * 4, _I64, *[_PTR] * 5],
    "flash_attention_fp32": [*[_I64] * 6, _PTR, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _I64, _I64, _F32, _PTR],
    "norm_rope_rows": [*[_I64] * 3, _PTR, _I64, _I64, _PTR, _F32, _PTR, _PTR, _I64, _PTR],
    "moe_prefill_f32": [*[_I64] * 5, _PTR, _I64, _PTR, _I64, *[_PTR] * 4, _I64, *[_PTR] * 4],
    "moe_rows_vectorized": [],
    "short_extend_set_threads": [ctypes.c_int],
}  # fmt: skip
FUNCTIONS["gdn_chunked_extend"] = FUNCTIONS["gdn_short_extend"]

_pool_threads = [1]  # the kernels' worker pool's thread count, as last set
THREADS_ENV = "RUNTIME_SHORT_EXTEND_THREADS"  # pins the pool's thread count ("1", "2", ...)


class NativeRefused(ValueError):
    """A call's tensors do not fit the kernel (the caller takes its torch path)."""


def _setup(lib: NativeLibrary) -> str | None:
    for fn_name, argtypes in FUNCTIONS.items():
        fn = getattr(lib.lib, fn_name)
        fn.restype, fn.argtypes = ctypes.c_int, argtypes
    # At model load: torch's count is the process's --num-threads then. Before the library is kept, so a bad
    # THREADS_ENV is refused at every call (start-up names it), never half-applied.
    count = default_threads()
    how = f"compiled in {lib.compile_seconds:.1f} s" if lib.compiled else "from the cache"
    logger.info("short-extend C kernels loaded: %s (%s)", lib.path.name, how)
    _pool_threads[0] = lib.lib.short_extend_set_threads(count)
    return None


def library() -> NativeLibrary | None:
    """The short-extend kernels, built at first use; None (the reason logged once) when they cannot be had."""
    return load_once(
        "short_extend", SOURCE, FLAGS, _setup, "short-extend C kernels", "short extends take the torch path"
    )


def required_library() -> NativeLibrary:
    """`library()` for a kernel call: raises NativeRefused (the caller takes its torch path) when it is missing."""
    lib = library()
    if lib is None:
        raise NativeRefused(f"no library: {unavailable_reason()}")
    return lib


def built() -> bool | None:
    """Whether `library()` has the kernels: None while no one has asked for them (a model on an accelerator never
    does), else True or False."""
    state = load_state("short_extend")
    return None if state is None else state is True


def unavailable_reason() -> str | None:
    """Why `library()` returned None, once it has been asked."""
    state = load_state("short_extend")
    return state if isinstance(state, str) else None


def threads() -> int:
    """The kernels' worker-pool thread count."""
    return _pool_threads[0]


def set_threads(n: int) -> None:
    """Split the kernels' work over n threads (1: inline on the caller, no worker). Any count gives the same bits."""
    lib = library()
    if lib is None or n < 1:
        return
    _pool_threads[0] = lib.lib.short_extend_set_threads(n)  # what the pool took (it caps the count)


def default_threads() -> int:
    """THREADS_ENV when set, else the process's torch thread count (--num-threads) at most the cores it may run on.
    Fixed, not the engine's per-step choice for torch's ops: the pool claims parts with a CAS (parallel.h), so a
    worker that is late or descheduled costs nothing but its part, which the caller then runs itself; in-process,
    48 new tokens after 2000 (peer model, load ~2): torch on 1 thread with the kernels on 2, 26.8-27.9 ms a forward,
    on 1, 28.4-31.4."""
    pinned = pinned_from_env(THREADS_ENV)
    return pinned if pinned is not None else usable_threads()


@dataclass(frozen=True)
class ShortExtendPlan:
    """One extend batch's per-sequence facts and state checkpoints, validated once and shared by every layer of
    the forward. `meta` packs [lens | has_prefix | state_slots | ck_seq | ck_tokens | ck_slots] as int64."""

    batch: int
    checkpoints: int
    tokens: int
    max_slot: int
    meta: torch.Tensor

    @classmethod
    def build(
        cls,
        lens: list[int],
        has_prefix: list[bool],
        state_slots: list[int],
        ck_seq: list[int],
        ck_tokens: list[int],
        ck_slots: list[int],
    ) -> ShortExtendPlan:
        """Raises NativeRefused where the in-place kernel would not do what the torch path does: shared or
        negative slots, a checkpoint slot that is also a sequence's state slot, a checkpoint outside its
        sequence's new tokens."""
        batch = len(lens)
        if not (len(has_prefix) == len(state_slots) == batch) or not (len(ck_seq) == len(ck_tokens) == len(ck_slots)):
            raise NativeRefused("plan: per-sequence or per-checkpoint lists differ in length")
        slots = set(state_slots)
        if len(slots) != batch or (ck_slots and (len(set(ck_slots)) != len(ck_slots) or slots & set(ck_slots))):
            raise NativeRefused("plan: state slots shared between sequences or checkpoints")
        if min(state_slots + ck_slots, default=0) < 0 or min(lens, default=0) < 0:
            raise NativeRefused("plan: negative slot or length")
        for s, n in zip(ck_seq, ck_tokens, strict=True):
            if not (0 <= s < batch and 0 < n <= lens[s]):
                raise NativeRefused(f"plan: checkpoint after {n} tokens of sequence {s}")
        flags = [int(p) for p in has_prefix]
        meta = torch.tensor(lens + flags + state_slots + ck_seq + ck_tokens + ck_slots, dtype=torch.int64)
        return cls(batch, len(ck_seq), sum(lens), max(state_slots + ck_slots, default=-1), meta)

    def pointers(self) -> list[int]:
        base, b, m = self.meta.data_ptr(), self.batch, self.checkpoints
        return [base + 8 * offset for offset in (0, b, 2 * b, 3 * b, 3 * b + m, 3 * b + 2 * m)]


def routing_inputs(
    tokens: int,
    hidden: int,
    experts: int,
    router: Router | None,
    ids: torch.Tensor | None,
    weights: torch.Tensor | None,
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(top_k, ids, weights) for a MoE kernel: with a router, empty [T, K] buffers the kernel routes into; without,
    the caller's ids and weights, checked. Raises NativeRefused naming what does not fit."""
    if router is not None:
        if ids is not None or weights is not None:
            raise NativeRefused("moe: a router or ids and weights, not both")
        top_k = router.top_k
        if not 0 < top_k <= experts:
            raise NativeRefused(f"moe: top-k {top_k} of {experts} experts")
        _check(router.weight, "router", (experts, hidden))
        return top_k, torch.empty(tokens, top_k, dtype=torch.int64), torch.empty(tokens, top_k, dtype=torch.float32)
    if ids is None or weights is None or ids.dim() != 2:
        raise NativeRefused("moe: ids [T, K] and weights [T, K] expected")
    top_k = ids.shape[1]
    _check(ids, "ids", (tokens, top_k), dtype=torch.int64)
    _check(weights, "weights", (tokens, top_k))
    if tokens and not (0 <= int(ids.min()) and int(ids.max()) < experts):
        raise NativeRefused(f"moe: expert ids outside 0..{experts - 1}")
    return top_k, ids, weights


def _check(
    t: torch.Tensor, name: str, shape: tuple[int, ...], *, rows_apart: bool = False, dtype: torch.dtype = torch.float32
) -> None:
    """`dtype` (fp32 unless told) on the CPU with `shape`; contiguous, or with `rows_apart` a 2-D view whose rows are
    contiguous."""
    if t.dtype != dtype or t.device.type != "cpu":
        raise NativeRefused(f"{name}: {t.dtype} on {t.device}, the kernel takes {dtype} on the CPU")
    if tuple(t.shape) != shape:
        raise NativeRefused(f"{name}: shape {tuple(t.shape)}, expected {shape}")
    if rows_apart:
        if t.dim() != 2 or t.stride(1) != 1 or (t.shape[0] > 1 and t.stride(0) < t.shape[1]):
            raise NativeRefused(f"{name}: strides {t.stride()}, rows must be contiguous")
    elif not t.is_contiguous():
        raise NativeRefused(f"{name}: not contiguous")


def gdn_short_extend(
    plan: ShortExtendPlan,
    mixed: torch.Tensor,
    z: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    conv_pool: torch.Tensor,
    ssm_pool: torch.Tensor,
    neg_exp_a: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    heads: tuple[int, int, int, int],
    *,
    chunked: bool = False,
) -> torch.Tensor:
    """A gated-DeltaNet layer's work between its projections for the packed tokens of `plan`: returns the gated-
    normed output [T, nv * dv] and updates conv_pool / ssm_pool (state slots and checkpoint slots) in place.
    `chunked`: the delta rule by chunks (gdn_chunked.c, for long extends) rather than token by token; it also takes
    mixed and z as bf16 (both), widened as it reads them, rather than through fp32 copies of the whole prompt's.
    heads = (nk, nv, dk, dv). mixed [T, 2 nk dk + nv dv], z [T, nv dv], b and a [T, nv] may be column slices of
    wider projections (rows contiguous). Raises NativeRefused before touching anything when a tensor does not fit."""
    lib = required_library()
    nk, nv, dk, dv = heads
    if nk <= 0 or nv % nk or min(dk, dv) <= 0:
        raise NativeRefused(f"heads {heads}: value heads must be a multiple of key heads")
    tokens, conv_dim = plan.tokens, 2 * nk * dk + nv * dv
    taps = conv_weight.shape[-1]
    width = taps - 1
    bf16 = chunked and mixed.dtype == z.dtype == torch.bfloat16 and dv <= 512  # gdn_chunked.c's z row buffer
    wide = torch.bfloat16 if bf16 else torch.float32
    _check(mixed, "mixed", (tokens, conv_dim), rows_apart=True, dtype=wide)
    _check(z, "z", (tokens, nv * dv), rows_apart=True, dtype=wide)
    _check(b, "b", (tokens, nv), rows_apart=True)
    _check(a, "a", (tokens, nv), rows_apart=True)
    if tokens > 1 and a.stride(0) != b.stride(0):
        raise NativeRefused("a and b rows are not the same distance apart")
    _check(conv_weight, "conv_weight", (conv_dim, taps))
    if conv_bias is not None:
        _check(conv_bias, "conv_bias", (conv_dim,))
    if conv_pool.dim() != 3 or ssm_pool.dim() != 4:
        raise NativeRefused(f"pools of {conv_pool.dim()} and {ssm_pool.dim()} dimensions, expected 3 and 4")
    _check(conv_pool, "conv_pool", (len(conv_pool), conv_dim, width))
    _check(ssm_pool, "ssm_pool", (len(ssm_pool), nv, dv, dk))
    slots = min(len(conv_pool), len(ssm_pool))
    if plan.max_slot >= slots:
        raise NativeRefused(f"slot {plan.max_slot} outside pools of {slots} slots")
    for t, name in ((neg_exp_a, "neg_exp_a"), (dt_bias, "dt_bias")):
        _check(t, name, (nv,))
    _check(norm_weight, "norm_weight", (dv,))
    out = torch.empty(tokens, nv * dv, dtype=torch.float32)
    lens, flags, state_slots, ck_seq, ck_tokens, ck_slots = plan.pointers()
    row = mixed.stride(0) if tokens else conv_dim
    kernel = lib.lib.gdn_chunked_extend if chunked else lib.lib.gdn_short_extend
    failed = kernel(
        plan.batch, lens, flags, state_slots,
        mixed.data_ptr(), row, z.data_ptr(), z.stride(0) if tokens else nv * dv,
        b.data_ptr(), a.data_ptr(), b.stride(0) if tokens else nv,
        conv_weight.data_ptr(), None if conv_bias is None else conv_bias.data_ptr(),
        conv_pool.data_ptr(), ssm_pool.data_ptr(), neg_exp_a.data_ptr(), dt_bias.data_ptr(),
        norm_weight.data_ptr(), norm_eps, nk, nv, dk, dv, width,
        plan.checkpoints, ck_seq, ck_tokens, ck_slots, out.data_ptr(), int(bf16),
    )  # fmt: skip
    if failed:
        raise MemoryError("gdn extend kernel: no scratch memory")
    return out


@dataclass(frozen=True)
class Router:
    """A top-k softmax router for moe_short_extend to run in C: weight [E, H] fp32, `top_k` experts a token, their
    probabilities renormalized to sum to 1 when `normalize` (TopKRouter's norm_topk_prob)."""

    weight: torch.Tensor
    top_k: int
    normalize: bool


def moe_short_extend(
    x: torch.Tensor,
    ids: torch.Tensor | None,
    weights: torch.Tensor | None,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    *,
    router: Router | None = None,
) -> torch.Tensor:
    """A sparse MoE block's experts for a few tokens: x [T, H] (rows contiguous), ids [T, K] int64, weights
    [T, K] fp32, w_in [E, 2I, H] (gate rows then up rows), w_out [E, H, I]; `shared`: a shared expert's (gate
    [S, H], up [S, H], down [H, S], gate vector [H]), added scaled by sigmoid(x . gate vector). Returns [T, H],
    each token's routed terms summed in ascending expert order, then the shared term. With `router` (ids and
    weights None) the kernel routes the tokens itself. Raises NativeRefused before any work when a tensor does
    not fit."""
    lib = required_library()
    if w_in.dim() != 3 or w_out.dim() != 3 or x.dim() != 2:
        raise NativeRefused("moe: x 2-D and expert weights 3-D expected")
    experts, two_inter, hidden = w_in.shape
    tokens = x.shape[0]
    _check(x, "x", (tokens, hidden), rows_apart=True)
    _check(w_in, "w_in", (experts, two_inter, hidden))
    _check(w_out, "w_out", (experts, hidden, two_inter // 2))
    if two_inter % 2:
        raise NativeRefused("moe: w_in's rows must be gate rows then up rows")
    top_k, ids, weights = routing_inputs(tokens, hidden, experts, router, ids, weights)
    if top_k > 64:
        raise NativeRefused(f"moe: top-k {top_k}, the kernel sums at most 64 experts a token")
    shared_inter = 0
    shared_ptrs: list[int | None] = [None] * 4
    if shared is not None:
        gate_w, up_w, down_w, gate_vec = shared
        shared_inter = gate_w.shape[0] if gate_w.dim() == 2 else -1
        _check(gate_w, "shared gate", (shared_inter, hidden))
        _check(up_w, "shared up", (shared_inter, hidden))
        _check(down_w, "shared down", (hidden, shared_inter))
        _check(gate_vec, "shared gate vector", (hidden,))
        shared_ptrs = [t.data_ptr() for t in shared]
    out = torch.empty(tokens, hidden, dtype=torch.float32)
    failed = lib.lib.moe_short_extend(
        tokens, hidden, two_inter // 2, experts, top_k, x.data_ptr(), x.stride(0) if tokens else hidden,
        None if router is None else router.weight.data_ptr(), int(router is not None and router.normalize),
        ids.data_ptr(), weights.data_ptr(), w_in.data_ptr(), w_out.data_ptr(), shared_inter, *shared_ptrs,
        out.data_ptr(),
    )  # fmt: skip
    if failed:
        raise MemoryError("moe_short_extend: no scratch memory")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """F.rms_norm(x, (dim,), weight, eps) for a short extend's rows: x [T, dim] fp32 (rows contiguous), weight
    [dim] fp32. x bf16: F.rms_norm(x.float(), ...).bfloat16() for any number of rows (one pass, split over the pool).
    Raises NativeRefused when a tensor does not fit."""
    lib = required_library()
    if x.dim() != 2 or weight.dim() != 1:
        raise NativeRefused("rms_norm: x [T, dim] and weight [dim] expected")
    rows, dim = x.shape
    _check(x, "x", (rows, dim), rows_apart=True, dtype=torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32)
    _check(weight, "weight", (dim,))
    out = torch.empty(rows, dim, dtype=x.dtype)
    kernel = lib.lib.rmsnorm_rows_bf16 if x.dtype == torch.bfloat16 else lib.lib.rmsnorm_rows
    kernel(rows, dim, x.data_ptr(), x.stride(0) if rows else dim, weight.data_ptr(), eps, out.data_ptr())
    return out


def residual_rms_norm(
    x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, F.rms_norm(s, (dim,), weight, eps)) with s = x + y (x itself when y is None), fp32 [T, dim] contiguous,
    in one pass split over the pool; the norm's sum in another order than torch's (rounding-level differences).
    Raises NativeRefused when a tensor does not fit."""
    lib = required_library()
    if x.dim() != 2 or weight.dim() != 1:
        raise NativeRefused("residual_rms_norm: x [T, dim] and weight [dim] expected")
    rows, dim = x.shape
    _check(x, "x", (rows, dim))
    if y is not None:
        _check(y, "y", (rows, dim))
    _check(weight, "weight", (dim,))
    total = x if y is None else torch.empty_like(x)
    out = torch.empty_like(x)
    lib.lib.residual_rmsnorm(
        rows, dim, x.data_ptr(), None if y is None else y.data_ptr(), weight.data_ptr(), eps, total.data_ptr(),
        out.data_ptr(),
    )  # fmt: skip
    return total, out
