"""A bf16 prefill's routed experts on AMX tiles (`moe_prefill.c`): one call per MoE layer instead of a sort, a
gather, two oneDNN matmuls per expert (each repacking the expert's weights), SwiGLU, a scale and a scatter-add.

Only for bf16 activations and weights on a CPU with AMX-BF16 whose kernel grants the tile state; anything else is
refused (`moe_prefill_ready()` False or NativeRefused) and the caller runs its torch path. Tensors are validated
here before any call: a wrong pointer in C takes the server down.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from runtime.native.build import NativeLibrary, load_once
from runtime.native.extend_kernels import FLAGS, NativeRefused

SOURCE = Path(__file__).parent / "moe_prefill.c"
CHUNK = 512  # MP_CHUNK in moe_prefill.c: the scratch holds this many routed rows
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


def _setup(lib: NativeLibrary) -> str | None:
    lib.lib.moe_prefill_bf16.restype = ctypes.c_int
    lib.lib.moe_prefill_bf16.argtypes = [*[_I64] * 3, _PTR, _I64, *[_PTR] * 8, _I64, _I64]
    lib.lib.moe_prefill_set_threads.restype = ctypes.c_int
    lib.lib.moe_prefill_set_threads.argtypes = [ctypes.c_int]
    return None if lib.lib.moe_prefill_ready() else "no AMX-BF16 (or the kernel refused the tile state)"


def library() -> NativeLibrary | None:
    """The kernel when it can run here (built, AMX granted); None otherwise, the reason logged once."""
    return load_once("moe_prefill", SOURCE, FLAGS, _setup, "MoE prefill kernel", "bf16 prefills take the torch path")


def takes(x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor, *, gated: bool = True) -> bool:
    """Whether `routed_experts` can run these tensors (cheap checks; the library is built on first ask)."""
    bf16 = torch.bfloat16
    if x.device.type != "cpu" or x.dtype != bf16 or w_in.dtype != bf16 or w_out.dtype != bf16:
        return False
    if x.dim() != 2 or w_in.dim() != 3 or w_out.dim() != 3:
        return False
    experts, in_rows, hidden = w_in.shape
    inter = in_rows // 2 if gated else in_rows
    shapes_fit = tuple(w_out.shape) == (experts, hidden, inter) and x.shape[1] == hidden and in_rows % 2 == 0
    aligned = hidden % 32 == 0 and inter % 32 == 0
    dense = w_in.is_contiguous() and w_out.is_contiguous() and x.stride(1) == 1
    return shapes_fit and aligned and dense and library() is not None


def routed_experts(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    *,
    gated: bool = True,
    fp32_sum: bool = False,
) -> torch.Tensor:
    """x [T, H] bf16, ids / weights [T, k], w_in [E, 2I, H] (gate rows, then up rows; `gated` False: [E, I, H],
    relu(up)^2 instead of SwiGLU), w_out [E, H, I], all bf16. Returns [T, H] fp32: each token's routed terms,
    summed in ascending expert order, rounded as torch's dispatch rounds: each weighted term and running sum in
    bf16 (Experts.forward_sparse), or with `fp32_sum` in fp32 (Relu2Experts with fp32 routing weights). Raises
    NativeRefused before any work when the tensors do not fit (see `takes`)."""
    if not takes(x, w_in, w_out, gated=gated) or weights.dtype not in (torch.bfloat16, torch.float32):
        raise NativeRefused("moe prefill: bf16 CPU tensors with H, I multiples of 32 and AMX expected")
    lib = library()
    assert lib is not None
    experts, in_rows, hidden = w_in.shape
    inter = in_rows // 2 if gated else in_rows
    top_k = ids.shape[1]
    flat = ids.reshape(-1)
    if flat.numel() and not (0 <= int(flat.min()) and int(flat.max()) < experts):
        raise NativeRefused(f"moe prefill: expert ids outside 0..{experts - 1}")
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    tok = (order // top_k).contiguous()
    rw = weights.reshape(-1).index_select(0, order).float().contiguous()
    xv = torch.empty(CHUNK * hidden, dtype=torch.bfloat16)
    hv = torch.empty(CHUNK * inter, dtype=torch.bfloat16)
    out = torch.zeros(x.shape[0], hidden, dtype=torch.float32)
    lib.lib.moe_prefill_set_threads(torch.get_num_threads())
    failed = lib.lib.moe_prefill_bf16(
        hidden, inter, experts, x.data_ptr(), x.stride(0), tok.data_ptr(), rw.data_ptr(),
        counts.data_ptr(), w_in.data_ptr(), w_out.data_ptr(), xv.data_ptr(), hv.data_ptr(), out.data_ptr(),
        int(gated), int(fp32_sum),
    )  # fmt: skip
    if failed:
        raise NativeRefused("moe prefill: the kernel cannot run here")
    return out
