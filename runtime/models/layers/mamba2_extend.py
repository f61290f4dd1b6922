"""Mamba2's extend in C (runtime/native/mamba2_extend.c), around the torch scan: the depthwise causal conv and its
silu in one pass over one sequence's inputs, read in place from in_proj's output (bf16 or fp32) and written once in
that dtype; and the gated RMSNorm (norm.GroupedGatedRMSNorm) in one pass over y and the gate.

At Nemotron-H's width (6144 channels, 2048 tokens, bf16) the torch form (conv.py: an fp32 copy of each block's
window, a multiply-add pass per tap, silu, a copy out) was ~7 passes over the data. Anything the kernel does not
take (a batch of sequences, another device or dtype, the library unavailable, a compiled graph) goes to
conv.causal_conv1d_extend, which the state writes here follow exactly (conv.window_rows). The gated norm was 6
passes (a strided fp32 copy of the gate, silu, multiply, rms_norm, rounding, weight); it takes any token count."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from runtime.models.layers.conv import causal_conv1d_extend, window_rows
from runtime.models.layers.norm import GroupedGatedRMSNorm
from runtime.models.layers.packing import SequencePacking
from runtime.native.build import DEFAULT_FLAGS, NativeLibrary, load_once
from runtime.native.threads import usable_threads

SOURCE = Path(__file__).parents[2] / "native" / "mamba2_extend.c"
# -fno-trapping-math: vexpf's branch-free clamps vectorize; -ffp-contract=off: a multiply and an add per tap, as
# the torch conv rounds them (its fp32 sums bit for bit; only the silu's exp differs in the last bits).
FLAGS = (*DEFAULT_FLAGS, "-fno-trapping-math", "-ffp-contract=off")
_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_ARGS: list[type] = [_I64, _I64, _I64, _PTR, _I64, ctypes.c_int, _PTR, _PTR, _PTR, _PTR, _PTR]


def _setup(lib: NativeLibrary) -> str | None:
    fn = lib.lib.mamba2_conv_extend
    fn.restype, fn.argtypes = ctypes.c_int, _ARGS
    norm = lib.lib.mamba2_gated_norm
    norm.restype, norm.argtypes = (
        ctypes.c_int,
        [_I64, _I64, _I64, _PTR, _I64, _PTR, _I64, ctypes.c_int, _PTR, _F32, _PTR],
    )
    mix = lib.lib.mamba2_mixing
    mix.restype, mix.argtypes = ctypes.c_int, [_I64, _I64, _I64, _I64, *[_PTR] * 5]
    relu2 = lib.lib.nemotron_relu2_bf16
    relu2.restype, relu2.argtypes = ctypes.c_int, [_I64, _PTR]
    threads = lib.lib.mamba2_extend_set_threads
    threads.restype, threads.argtypes = ctypes.c_int, [ctypes.c_int]
    # Set once, at first use (model load: torch's count is --num-threads then); its own pool (parallel.h), whose
    # workers spin only ~20 us after a call (HP_SPIN_US in the C file): torch's threads want the cores next.
    threads(usable_threads())
    return None


def _library() -> NativeLibrary | None:
    return load_once("mamba2_extend", SOURCE, FLAGS, _setup, "Mamba2 extend C kernels", "the torch forms run instead")


def _fits(x: torch.Tensor, weight: torch.Tensor, packing: SequencePacking) -> bool:
    return (
        packing.lens.numel() == 1
        and x.device.type == "cpu"
        and x.dtype in (torch.bfloat16, torch.float32)
        and x.dim() == 2
        and x.stride(1) == 1
        and 1 <= weight.shape[-1] <= 8
        and weight.shape[0] == x.shape[1]
        and not torch.compiler.is_compiling()
    )


def mamba2_conv_extend(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_pool: torch.Tensor,
    packing: SequencePacking,
) -> torch.Tensor:
    """As conv.causal_conv1d_extend: x [T, C] new inputs (a strided view is read in place); weight [C, K].
    Returns silu(conv(x)) [T, C] in x's dtype and writes the sequence's new conv state and checkpoint windows."""
    lib = _library() if _fits(x, weight, packing) else None
    if lib is None:
        return causal_conv1d_extend(x, weight, bias, conv_pool, packing)
    length, channels = x.shape
    kernel = weight.shape[-1]
    old = packing.initial_state(conv_pool).transpose(1, 2).contiguous()  # [1, K-1, C] fp32
    taps = weight.float().t().contiguous()  # [K, C]: tap k's weights contiguous over the channels
    bias32 = bias.float().contiguous() if bias is not None else None
    rows = torch.empty(kernel + 1, channels)
    out = torch.empty(length, channels, dtype=x.dtype)
    status = lib.lib.mamba2_conv_extend(
        length,
        channels,
        kernel,
        x.data_ptr(),
        x.stride(0),
        int(x.dtype == torch.bfloat16),
        old.data_ptr(),
        taps.data_ptr(),
        bias32.data_ptr() if bias32 is not None else None,
        rows.data_ptr(),
        out.data_ptr(),
    )
    if status != 0:
        return causal_conv1d_extend(x, weight, bias, conv_pool, packing)
    inputs = x[None]  # [1, T, C]: one sequence, no padding
    seq = torch.zeros(1, dtype=torch.int64)
    conv_pool[packing.state_slots] = window_rows(old, inputs, seq, packing.lens).transpose(1, 2).to(conv_pool.dtype)
    cps = packing.checkpoints
    if cps is not None:
        tokens = cps.traced_tokens if cps.traced_tokens is not None else torch.tensor(cps.tokens)
        seqs = torch.zeros_like(tokens)
        conv_pool[cps.slots] = window_rows(old, inputs, seqs, tokens).transpose(1, 2).to(conv_pool.dtype)
    return out


def gated_norm(norm: GroupedGatedRMSNorm, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """norm(y, gate) for y, gate [T, D] of one dtype (bf16 or fp32; the gate may be a column range of a wider
    tensor); the module itself for anything else."""
    fits = (
        y.device.type == "cpu"
        and y.dtype in (torch.bfloat16, torch.float32)
        and gate.dtype == y.dtype
        and y.dim() == 2
        and gate.shape == y.shape
        and y.stride(1) == 1
        and gate.stride(1) == 1
        and norm.weight.shape == (y.shape[1],)
        and not torch.compiler.is_compiling()
    )
    lib = _library() if fits else None
    if lib is None:
        return norm(y, gate)
    weight = norm.weight.detach().float().contiguous()
    out = torch.empty(y.shape, dtype=y.dtype)
    status = lib.lib.mamba2_gated_norm(
        y.shape[0],
        y.shape[1],
        norm.group_size,
        y.data_ptr(),
        y.stride(0),
        gate.data_ptr(),
        gate.stride(0),
        int(y.dtype == torch.bfloat16),
        weight.data_ptr(),
        norm.eps,
        out.data_ptr(),
    )
    return out if status == 0 else norm(y, gate)


def intra_chunk_weights(
    a_cum: torch.Tensor, shifted: torch.Tensor, scores: torch.Tensor, d: torch.Tensor
) -> torch.Tensor | None:
    """The SSD scan's within-chunk weights (ssd.py): exp(a_cum[l] - shifted[s]) * scores[l, s] for s <= l, 0 above
    the diagonal, d on it; a_cum, shifted [C, B, H, l], scores [C, B, G, l, l], d [H], all fp32. One pass and half
    the exps of the torch form's 5 passes over [C, B, H, l, l]; None where the kernel is not had (torch form then)."""
    if a_cum.device.type != "cpu" or torch.compiler.is_compiling() or scores.dtype != torch.float32:
        return None
    lib = _library()
    if lib is None:
        return None
    chunks, batch, heads, length = a_cum.shape
    groups = scores.shape[2]
    a_cum, shifted, scores, d = (t.float().contiguous() for t in (a_cum, shifted, scores, d))
    out = torch.empty(chunks, batch, groups, heads // groups, length, length)
    status = lib.lib.mamba2_mixing(
        chunks * batch, groups, heads // groups, length, *(t.data_ptr() for t in (a_cum, shifted, scores, d, out))
    )
    return out if status == 0 else None


def relu_squared_(x: torch.Tensor) -> torch.Tensor:
    """x.relu_().square_() (Relu2MLP), bit for bit; bf16 CPU tensors of whole 4096-element slices in one C pass."""
    fits = (
        x.device.type == "cpu"
        and x.dtype == torch.bfloat16
        and x.is_contiguous()
        and x.numel() % 4096 == 0
        and not torch.compiler.is_compiling()
    )
    lib = _library() if fits else None
    if lib is None or lib.lib.nemotron_relu2_bf16(x.numel(), x.data_ptr()) != 0:
        return x.relu_().square_()
    return x
