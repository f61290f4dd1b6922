"""Quantized checkpoints: FP8 block-quantized weights (DeepSeek-V3 / Qwen3-Next-80B-A3B-Instruct-FP8 layout) are
dequantized per block to the compute dtype at load; any other `quantization_config` is refused with the server that
serves it named.

The FP8 layout: config.json's `quantization_config` = {"quant_method": "fp8", "weight_block_size": [bn, bk], ...};
each quantized linear weight `<m>.weight` [N, K] is float8_e4m3fn and comes with `<m>.weight_scale_inv`
[ceil(N / bn), ceil(K / bk)] (fp32), the factor that maps a block's fp8 values back: w = fp8 * scale_inv. Modules
the exporter left unquantized (`modules_to_not_convert`: norms, router gates, embeddings, lm_head) are stored in
their own dtype without a scale and load as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.models.errors import ModelLoadError
from runtime.models.hf_config import HFConfig

SCALE_SUFFIX = "_scale_inv"  # `<m>.weight` + this: the weight's block scales
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class Fp8Blocks:
    """A block-quantized FP8 checkpoint's block shape (rows, columns of each scaled block)."""

    block_rows: int
    block_cols: int

    def dequantize(self, weight: torch.Tensor, scale_inv: torch.Tensor, name: str) -> torch.Tensor:
        """`weight` [N, K] fp8 with `scale_inv` [ceil(N/bn), ceil(K/bk)] as fp32 [N, K] (fp32 first: the product
        rounds once, into the compute dtype, when the caller casts)."""
        if weight.dim() != 2 or scale_inv.dim() != 2:
            raise ModelLoadError(
                f"tensor '{name}': an FP8 weight and its scales must be 2-D, got {tuple(weight.shape)} and "
                f"{tuple(scale_inv.shape)}; re-download the checkpoint."
            )
        n, k = weight.shape
        expect = (-(-n // self.block_rows), -(-k // self.block_cols))
        if tuple(scale_inv.shape) != expect:
            raise ModelLoadError(
                f"tensor '{name}{SCALE_SUFFIX}': shape {tuple(scale_inv.shape)}, but a [{n}, {k}] weight in "
                f"[{self.block_rows}, {self.block_cols}] blocks needs {expect}; config.json's weight_block_size "
                "does not match the checkpoint."
            )
        scales = scale_inv.float().repeat_interleave(self.block_rows, 0)[:n].repeat_interleave(self.block_cols, 1)
        return weight.float() * scales[:, :k]


def checkpoint_quantization(cfg: HFConfig) -> Fp8Blocks | None:
    """The checkpoint's FP8 block layout; None for an unquantized checkpoint; ModelLoadError for a quantization
    the runtime does not load (it names SGLang, which serves those)."""
    q = cfg.data.get("quantization_config")
    if q is None:
        return None
    method = str(q.get("quant_method", "")).lower() if isinstance(q, dict) else ""
    block = q.get("weight_block_size") if isinstance(q, dict) else None
    if (
        method == "fp8"
        and isinstance(block, list)
        and len(block) == 2
        and all(isinstance(b, int) and b > 0 for b in block)
    ):
        return Fp8Blocks(block[0], block[1])
    what = f"quant_method {method!r}" if method else "a quantization_config"
    detail = " without a 2-entry weight_block_size (per-tensor FP8)" if method == "fp8" else ""
    raise ModelLoadError(
        f"{cfg.path}: {what}{detail}; the bundled runtime loads unquantized and block-quantized FP8 "
        "(weight_block_size [n, k]) checkpoints only. Serve this model with SGLang (hybridctl init --engine sglang), "
        "or use its unquantized (bf16) release."
    )


def is_fp8(t: torch.Tensor) -> bool:
    return t.dtype in _FP8_DTYPES
