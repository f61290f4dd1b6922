"""Native decode on a ~0.8B Qwen3-Next-shaped model: fp32 weights vs bf16 weights read in place, against the floor.

Builds (once, into --dir) a bf16 checkpoint with random weights: 16 layers (3 Gated DeltaNet : 1 gated attention),
hidden 1024, 16 experts top-2 + a shared expert, vocabulary 32000 (~0.77B parameters, ~0.21B active per token).
Loads it twice: fp32 (the bf16 values widened, what `--dtype float32` serves) and bf16 (read in place by the C
kernels, runtime/native/dot_gemm.h). Times the native step (runtime/engine/native_decode.py: one C call per step)
at batch 1 and 8 with `--kv-len` cached tokens per sequence, the two dtypes interleaved block by block in ONE
process (a shared host drifts: trust the ratios), and reports tok/s per dtype.

The floor: the bytes a batch-1 step must read (every matrix outside the experts, top-k experts per MoE layer, the
lm_head, one embedding row) over the host's read bandwidth, measured by benchmarks/read_bandwidth.c (vector loads
and adds over a 1 GiB buffer, the same thread count), sampled before every block. Each tok/s is also given as a
fraction of its dtype's batch-1 floor, twice: block medians against the median bandwidth, and the best single step
against the best bandwidth sample (on a shared host the least disturbed of each; the two agree on a quiet one).

    python benchmarks/native_decode_bf16.py [--dir DIR] [--threads 2] [--blocks 7] [--steps 20] [--kv-len 100]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from runtime.core.batch import ForwardBatch, PoolBuffers
from runtime.core.buffers import allocate_pool_buffers
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.native_decode import NativeDecode, decode_weights
from runtime.models.base import HybridModel
from runtime.models.loader import load_model
from runtime.native.build import load
from runtime.native.hybrid_decode import set_threads

BATCHES = (1, 8)
CONFIG: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 768,
    "shared_expert_intermediate_size": 768,
    "max_position_embeddings": 4096,
}


def build_checkpoint(out: Path) -> Path:
    """The bf16 checkpoint in `out` (written once; the seed fixes the weights)."""
    if (out / "config.json").is_file():
        return out
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen3NextConfig(**CONFIG, eos_token_id=None)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            hf = transformers.Qwen3NextForCausalLM(cfg)
        hf = hf.to_empty(device="cpu")
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(1, 16).log())
            elif name.endswith(("dt_bias", "linear_attn.norm.weight")):
                p.fill_(1.0)  # the gated norm's weight is a plain scale, not an offset from 1
            else:
                p.normal_(0.0, 0.02)
    hf.save_pretrained(out)
    return out


def step_bytes(model: HybridModel) -> int:
    """The weight bytes a batch-1 step reads: every matrix but the experts and the embedding, top-k experts per
    MoE layer, one embedding row."""
    w = decode_weights(model)
    total = w.lm_head.nbytes + w.embed[0].nbytes
    for lw in w.layers:
        m, f = lw.mixer, lw.ffn
        for name in ("qkv", "z", "b", "a", "out", "q", "k", "v", "o"):
            t = getattr(m, name, None)
            total += t.nbytes if t is not None else 0
        for t in (f.router, f.mlp_gate, f.mlp_up, f.mlp_down, f.shared_gate):
            total += t.nbytes if t is not None else 0
        if f.experts and f.gate_up is not None and f.down is not None:
            total += f.top_k * (f.gate_up[0].nbytes + f.down[0].nbytes)
    return total


class ReadBandwidth:
    """The host's read bandwidth: benchmarks/read_bandwidth.c (built like the runtime's kernels) sums a 1 GiB
    buffer on `threads` threads of a pool like the native step's, sampled between the timed blocks (best of 3 per
    sample) so that it sees the same load as the steps it is compared with."""

    def __init__(self, threads: int) -> None:
        self.lib = load("read_bandwidth", Path(__file__).with_name("read_bandwidth.c")).lib
        self.lib.rb_set_threads.argtypes = [ctypes.c_int]
        self.lib.rb_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        self.lib.rb_set_threads(threads)
        self.buf = torch.ones(1 << 28)  # torch's allocations are 64-byte aligned
        self.blocks = self.buf.numel() // 4096
        self.sink = torch.zeros(self.blocks)
        self.samples: list[float] = []

    def _read(self) -> None:
        self.lib.rb_read(self.buf.data_ptr(), self.blocks, self.sink.data_ptr())

    def sample(self) -> None:
        self._read()
        self.samples.append(self.buf.nbytes / min(_timed(self._read) for _ in range(3)))

    def median(self) -> float:
        return statistics.median(self.samples)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def decode_batch(batch: int, kv_len: int, vocab: int) -> ForwardBatch:
    """B sequences of `kv_len` tokens on disjoint KV slots, state slot i each, random next tokens."""
    stride = kv_len + 1
    kv_locs = [torch.arange(i * stride, i * stride + kv_len) for i in range(batch)]
    return ForwardBatch(
        mode="decode",
        input_ids=torch.randint(0, vocab, (batch,), generator=torch.Generator().manual_seed(batch)),
        positions=torch.full((batch,), kv_len - 1),
        extend_lens=[1] * batch,
        prefix_lens=[kv_len - 1] * batch,
        kv_locs=kv_locs,
        out_locs=torch.tensor([int(loc[-1]) for loc in kv_locs]),
        state_slots=torch.arange(batch),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, help="checkpoint directory (built there on first use; default: a temp dir)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--kv-len", type=int, default=100)
    a = ap.parse_args()
    flush_denormals_on_this_thread()  # as the engine thread does
    print(f"load average {os.getloadavg()}; torch {torch.__version__}; threads {a.threads}")
    bandwidth = ReadBandwidth(a.threads)
    path = build_checkpoint(a.dir or Path(tempfile.mkdtemp()) / "qwen3-next-0.8b")
    models = {"fp32": load_model(path, dtype=torch.float32), "bf16": load_model(path, dtype=torch.bfloat16)}
    params = sum(p.numel() for p in models["bf16"].parameters())
    print(f"model: {params / 1e9:.2f}B parameters")
    nbytes = {name: step_bytes(model) for name, model in models.items()}
    for name, n in nbytes.items():
        print(f"{name}: a batch-1 step reads {n / 1e9:.3f} GB of weights")
    layout = models["fp32"].layout()
    buffers: PoolBuffers = allocate_pool_buffers(
        layout,
        max(BATCHES) * (a.kv_len + 1),
        max(BATCHES),
        kv_dtype=torch.float32,
        conv_dtype=torch.float32,
        ssm_dtype=torch.float32,
        device=torch.device("cpu"),
        zeroed=True,
    )
    paths = {}
    for name, model in models.items():
        native = NativeDecode(model)
        native.threads = None  # the count is set here, per call
        paths[name] = native
    vocab = layout.vocab_size
    for batch in BATCHES:
        fb = decode_batch(batch, a.kv_len, vocab)
        ms: dict[str, list[float]] = {name: [] for name in paths}
        best: dict[str, float] = dict.fromkeys(paths, float("inf"))
        with torch.inference_mode():
            for native in paths.values():
                set_threads(native.library, a.threads)
                native(fb, buffers)  # settle
            for _ in range(a.blocks):
                bandwidth.sample()
                for name, native in paths.items():
                    set_threads(native.library, a.threads)
                    t0 = time.perf_counter()
                    for _ in range(a.steps):
                        t1 = time.perf_counter()
                        native(fb, buffers)
                        best[name] = min(best[name], (time.perf_counter() - t1) * 1e3)
                    ms[name].append((time.perf_counter() - t0) / a.steps * 1e3)
        # Medians (what a steady host gives), and the best step against the best bandwidth sample (on a shared
        # host, the least disturbed of each: the two agree when the host is quiet).
        for label, bw, step_ms in (
            ("median", bandwidth.median(), {n: statistics.median(v) for n, v in ms.items()}),
            ("best", max(bandwidth.samples), best),
        ):
            parts = [f"read bandwidth {bw / 1e9:.1f} GB/s"]
            for name, step in step_ms.items():
                tok_s, floor = batch * 1e3 / step, bw / nbytes[name]
                parts.append(
                    f"{name} {step:.2f} ms/step {tok_s:.1f} tok/s ({tok_s / floor:.0%} of b1 floor {floor:.1f})"
                )
            ratio = step_ms["fp32"] / step_ms["bf16"]
            print(f"batch {batch}, {label}: " + " | ".join(parts) + f" | bf16/fp32 speed {ratio:.2f}x")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
