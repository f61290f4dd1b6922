"""The model runner: a scheduled batch in, logits out (nano-vllm's ModelRunner).

It owns everything between the scheduler's decision and the model: the batch's tensors (`prepare`), and which
forward runs them (`forward`): the native decode (one C call, runtime/engine/native_decode.py), the compiled decode
or short extend when one handles the batch, else the eager model, on one thread or all of them for a few-token
forward. The scheduler never sees a tensor it did not get from the cache manager, and the runner never decides what
runs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import torch

from runtime.core.batch import ForwardBatch, ScheduledBatch
from runtime.core.device_path import accelerator_path
from runtime.core.threads import intra_op_threads
from runtime.engine.decode_threads import DecodeThreadChooser

if TYPE_CHECKING:
    from runtime.engine.compiled_decode import CompiledDecode
    from runtime.engine.compiled_extend import CompiledExtend
    from runtime.engine.native_decode import NativeDecode
    from runtime.engine.pool_setup import Pools
    from runtime.models.base import HybridModel

# Eager forwards of at most this many tokens (decode batches, short extends) and longer ones (prefills) each choose
# one thread or all of them per step from measured time, in their own choosers (see ModelRunner.forward).
SERIAL_FORWARD_MAX_TOKENS = 64
# Pins the thread count of those small forwards ("1", "2", ...) instead of choosing it per step.
SMALL_FORWARD_THREADS_ENV = "RUNTIME_SMALL_FORWARD_THREADS"
# Pins the thread count of the longer eager forwards (prefills). On a quiet 2-core host two threads win from 128
# tokens on (benchmarks/serial_threshold.py: 512 tokens 108 vs 65 ms, 2048: 452 vs 267; one thread vs two); on a
# shared one whose other processes hold the cores, every OpenMP region waits on a descheduled worker and two
# threads lose 3-4x (peer model, load ~2: 8 prompts of 128 tokens ~1000 ms wall on two threads vs
# ~300 on one, which halved 8 concurrent x 128 tok/s: docs/performance.md). So they are chosen per step too.
PREFILL_THREADS_ENV = "RUNTIME_PREFILL_THREADS"


class ModelRunner:
    def __init__(self, model: HybridModel, pools: Pools) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.pools = pools  # read at every forward: the elastic pool replaces the buffers at start-up
        self.small_forward_threads = {
            mode: DecodeThreadChooser.up_to(torch.get_num_threads(), SMALL_FORWARD_THREADS_ENV, label=f"Eager {mode}")
            for mode in ("extend", "decode")
        }
        # Time per token, in buckets 4x wide (64-255, 256-1023, 1024-4095, ...): 8 prompts of 128 tokens arriving
        # a few at a time make prefills of 128 to 1024 tokens, and in power-of-two buckets each of the four paid
        # its own first two-thread probe (0.7-1 s each on a busy host); 8x wide ones put a 576-token prefill
        # beside a 2048-token one, which costs 13% more per token on one thread (attention; peer model), more
        # than the switching margin. Prefills are rare: a choice learnt on a busy moment would stand for many of
        # them, so each step also reads what the rest of the host ran (host_hints: decode_threads.py).
        self.prefill_threads = DecodeThreadChooser.up_to(
            torch.get_num_threads(),
            PREFILL_THREADS_ENV,
            label="Prefill",
            bucket_bits=2,
            host_hints=True,
            most_first=True,
        )
        # runtime/engine/native_decode.py: a decode step as one C call; first choice for the batches it handles.
        self.native_decode: NativeDecode | None = None
        self.native_status = "off"  # what /server_info reports: "on", or "off: <reason>"
        self.compiled_decode: CompiledDecode | None = None
        self.compiled_extend: CompiledExtend | None = None
        # A background compile is building them (runtime/engine/background_compile.py): eager until it installs them.
        self.compiling = False

    def compiled_paths(self) -> str:
        """Which compiled forwards run now: "decode+extend", "decode", "extend", else "compiling" while a
        background compile builds them, else "none" (read from the installed forwards, never from a plan)."""
        installed = (("decode", self.compiled_decode), ("extend", self.compiled_extend))
        paths = [name for name, compiled in installed if compiled is not None and compiled.report.enabled]
        if paths:
            return "+".join(paths)
        return "compiling" if self.compiling else "none"

    def run(self, batch: ScheduledBatch) -> torch.Tensor:
        """The batch's logits: [B, vocab], or [T, vocab] with `all_logits`. Keeps the forward on the batch."""
        fb = self.prepare(batch)
        batch.forward = fb
        return self.forward(fb)

    @staticmethod
    def prepare(batch: ScheduledBatch) -> ForwardBatch:
        """The batch's tensors (CPU int64; the model moves them to its device)."""
        ids = [t for tokens in batch.tokens for t in tokens]
        if batch.mode == "decode":
            positions = batch.starts
        else:
            spans = zip(batch.starts, batch.tokens, strict=True)
            positions = [p for start, tokens in spans for p in range(start, start + len(tokens))]
        return ForwardBatch(
            mode=batch.mode,
            input_ids=_int64(ids),
            positions=_int64(positions),
            extend_lens=[len(tokens) for tokens in batch.tokens],
            prefix_lens=list(batch.starts),
            kv_locs=batch.kv_locs,
            out_locs=_int64(batch.out_locs),
            state_slots=_int64(batch.state_slots),
            all_logits=batch.all_logits,
            state_checkpoints=batch.checkpoints if any(batch.checkpoints) else None,
            decode_rows=batch.decode_rows,
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        buffers = self.pools.buffers
        native = self.native_decode
        if native is not None and batch.decode_rows:
            # A mixed step whose prompt chunks (each a sequence of up to EXTEND_MAX_TOKENS) and decode rows the C
            # step each takes: a C call per chunk, then one for the rows; each state still advances once. One
            # torch forward of both kinds of row cost 2.6-3.1x as much (peer model, 4 decoding requests:
            # benchmarks/mixed_step_cost.py's 256-token steps 705-748 vs 273-282 ms at load ~10; one step of fresh
            # 128- and 124-token chunks beside the rows, timed 7 times, 166 vs 53 ms at load 1.4).
            n = batch.batch_size - batch.decode_rows
            parts = [*batch.sequences()[:n], batch.decode_part()]
            if all(native.handles(part) for part in parts):
                return torch.cat([native(part, buffers) for part in parts])
        if native is not None and native.handles(batch):
            return native(batch, buffers)
        if self.compiled_decode is not None and self.compiled_decode.handles(batch):
            return self.compiled_decode(batch, buffers)
        if self.compiled_extend is not None and self.compiled_extend.handles(batch):
            return self.compiled_extend(batch, buffers)
        if one_token_continuations(batch):
            # The same step as a decode: ~800 dispatched ops instead of the extend path's ~1500 (packing, a
            # one-token chunked delta rule, a causal mask): an exact repeat's prompt resumes one token before its
            # end (runtime/scheduler/checkpoints.py). `batch` itself stays an extend for whoever reads it after.
            batch = dataclasses.replace(batch, mode="decode")
        if accelerator_path(self.device):
            # The GPU runs the ops: host threads change nothing, and a step's wall time (kernels queued, not run)
            # would only mislead the choosers below.
            return self.model.forward(batch, buffers)
        tokens = batch.input_ids.numel()
        if tokens > SERIAL_FORWARD_MAX_TOKENS:
            return self.prefill_threads.timed(tokens, lambda n: self._forward_on(n, batch))
        # A few-token forward is thousands of microsecond-sized ops. On a quiet host two threads still win (peer
        # model, Xeon: a 64-token extend over 2048 cached tokens 27 vs 22 ms, an 8-token prefill 12.1 vs 9.9 ms);
        # on a busy one a descheduled worker stalls every op. So the count is chosen per step, per mode and
        # token-count bucket, from measured time, as the compiled decode's is.
        return self.small_forward_threads[batch.mode].timed(tokens, lambda n: self._forward_on(n, batch))

    def _forward_on(self, threads: int, batch: ForwardBatch) -> torch.Tensor:
        with intra_op_threads(threads):
            return self.model.forward(batch, self.pools.buffers)


def _int64(values: list[int]) -> torch.Tensor:
    """A CPU int64 tensor of `values`, through NumPy: 5 us for a decode step's 8 ids instead of torch.tensor's
    10 (four per step)."""
    return torch.from_numpy(np.array(values, dtype=np.int64))


def one_token_continuations(batch: ForwardBatch) -> bool:
    """An extend that a decode step computes alike: one new token per sequence, each after cached tokens (a
    decode reads the state from the slot; a fresh sequence's extend ignores it), no per-token logits and no
    mid-forward checkpoints."""
    return (
        batch.mode == "extend"
        and not batch.all_logits
        and not batch.state_checkpoints
        and all(n == 1 for n in batch.extend_lens)
        and all(p > 0 for p in batch.prefix_lens)
    )
