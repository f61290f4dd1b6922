"""The batch-1 decode floor: the host's read bandwidth over the bytes of weights one token reads.

A decode step at batch 1 multiplies one row by every weight it uses, so it cannot run faster than reading
those weights once: floor tok/s = bandwidth / active weight bytes. Active bytes come from the checkpoint's
safetensors header in the checkpoint's own dtype: every tensor, except that a MoE layer's routed experts count
top-k / num_experts of their bytes and the input embedding counts one row (lm_head is read whole; a tied
embedding is read whole as lm_head). Bandwidth is a timed sum over a buffer much larger than the last-level cache,
on `threads` torch threads (what a decode step has), best of several passes.

    python benchmarks/peers/floor.py --model DIR [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import struct
import time
from pathlib import Path
from typing import Any

DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "BF16": 2,
    "F16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "I32": 4,
    "I64": 8,
}
# Routed experts, one tensor per expert or stacked (granite's input_linear / output_linear); shared experts are
# named "shared_*" and are read whole.
EXPERT_MARKERS = (".experts.", "block_sparse_moe.input_linear", "block_sparse_moe.output_linear")
EMBEDDING_MARKERS = ("embed_tokens", "embeddings")


def _header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header


def _moe_fraction(config: dict[str, Any]) -> float:
    experts = config.get("num_experts") or config.get("n_routed_experts") or config.get("num_local_experts")
    top_k = config.get("num_experts_per_tok") or config.get("moe_topk") or config.get("top_k")
    return float(top_k) / float(experts) if experts and top_k else 1.0


def active_weight_bytes(model_dir: Path) -> dict[str, float]:
    """Bytes one decode token reads: {"total", "active", "experts", "embedding"} (the checkpoint's dtype)."""
    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config", config)
    fraction = _moe_fraction(config)
    tied = bool(config.get("tie_word_embeddings"))
    total = active = experts = embedding = 0.0
    for file in sorted(model_dir.glob("*.safetensors")):
        for name, info in _header(file).items():
            n = DTYPE_BYTES.get(info["dtype"], 4)
            for d in info["shape"]:
                n *= d
            total += n
            if any(m in name for m in EXPERT_MARKERS) and "shared" not in name:
                experts += n
                active += n * fraction
            elif any(m in name for m in EMBEDDING_MARKERS) and not tied:
                embedding += n
                active += n / max(info["shape"][0], 1)  # one row
            else:
                active += n
    return {"total": total, "active": active, "experts": experts, "embedding": embedding}


def read_bandwidth_gbs(threads: int, mib: int = 1024, passes: int = 7) -> float:
    """GB/s of a sum over `mib` MiB of fp32 on `threads` torch threads, best of `passes` (warm pages)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buf = torch.ones(mib * 1024 * 1024 // 4, dtype=torch.float32)
        buf.sum()  # fault the pages in
        best = float("inf")
        for _ in range(passes):
            t0 = time.perf_counter()
            buf.sum()
            best = min(best, time.perf_counter() - t0)
        return buf.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(previous)


def decode_floor(model_dir: Path, threads: int) -> dict[str, float]:
    weights = active_weight_bytes(model_dir)
    bandwidth = read_bandwidth_gbs(threads)
    return {
        "bandwidth_gbs": bandwidth,
        "active_weight_gb": weights["active"] / 1e9,
        "total_weight_gb": weights["total"] / 1e9,
        "floor_tok_s": bandwidth * 1e9 / weights["active"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    floor = decode_floor(args.model, args.threads)
    print(
        f"read bandwidth {floor['bandwidth_gbs']:.1f} GB/s ({args.threads} threads); active weights "
        f"{floor['active_weight_gb']:.3f} GB of {floor['total_weight_gb']:.3f} GB; "
        f"batch-1 decode floor {floor['floor_tok_s']:.1f} tok/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
