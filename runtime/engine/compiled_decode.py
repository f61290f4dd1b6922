"""`--enable-torch-compile`: decode batches of up to `--torch-compile-max-bs` sequences run a torch.compile'd
forward (SGLang's flags and meaning; SGLang captures CUDA graphs over the same batch sizes).

An eager decode step of the demo model is ~3200 aten ops, each a few microseconds of dispatch; the compiled
graph fuses the elementwise work into a few dozen C++ kernels around the matmuls. The compiled function takes
tensors only (token ids, positions, KV slots, state slots, the gather index of every sequence's KV, the pool
buffers) and calls the model's `forward_tokens`, so it is generic over the model classes. Extends (prefill,
speculative verify) and bigger decode batches stay eager.

Two graphs are compiled at engine start, before the first request: batch 1 (torch specializes size 1) and one
for every batch size 2..max_bs, dynamic in the batch size and in the KV length. Warm-up writes through real
pool slots, so those slots' contents are saved first and put back afterwards.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import torch

from runtime.core.batch import ForwardBatch, PoolBuffers
from runtime.core.threads import intra_op_threads
from runtime.engine.compile_support import (
    CompileReport,
    as_traced,
    copy_function,
    failure_reason,
    graphs_compiled,
    pools_traceable,
    restored,
    run_compiled,
    stays_eager,
)
from runtime.engine.decode_threads import DecodeThreadChooser
from runtime.models.base import HybridModel, StepContext
from runtime.models.layers.attention import AttentionMetadata

logger = logging.getLogger("runtime.engine")

# Warm-up shapes: the batch size and the KV length are distinct from each other and from the model's small
# static dims, so no two dynamic dims are traced as one symbol (duck shaping) and later split by a recompile.
_WARMUP_KV_LEN = (37, 53)


# Intra-op threads of the compiled graphs: inductor bakes the count into each graph's C++ kernels at compile
# time (no parallel region at all for 1; for N, which loops split and N per-thread reduction buffers), so every
# thread count the decode may run with gets its own graphs, compiled at warm-up. Which one runs is chosen per
# step from measured wall time (runtime/engine/decode_threads.py: two threads pay on a quiet host at batch >= 4,
# and cost up to 10x on a busy one). This variable pins a count instead ("1", "2", ...).
THREADS_ENV = "RUNTIME_COMPILED_DECODE_THREADS"


# cpp_wrapper: the graph's wrapper (the code between kernels: input size/stride asserts, buffer allocation, the
# extern matmul calls) in C++ instead of generated Python. The Python wrapper ran ~180 size/stride asserts and
# ~170 tensor reinterpretations per call, ~0.45 ms of a 1.4 ms batch-1 step of the peer model; with it, single
# stream in-process 645 -> 716 tok/s (benchmarks/compiled_decode_step.py, docs/performance.md). The cost: a
# cold-cache compile takes ~50 s instead of ~6 s (once per machine: inductor caches the built code).
_INDUCTOR_OPTIONS: dict[str, str | int | bool | Callable[..., object]] = {"cpp_wrapper": True}


class DecodeInputs(NamedTuple):
    """The tensors of one compiled decode step, in the compiled function's argument order (the pool buffers last)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    out_locs: torch.Tensor
    state_slots: torch.Tensor
    kv_index: torch.Tensor
    kv_mask: torch.Tensor


# Every CompiledDecode of this process (while two live, the guards of every compiled call are evaluated).
_INSTANCES: weakref.WeakSet[CompiledDecode] = weakref.WeakSet()


class CompiledDecode:
    def __init__(self, model: HybridModel, max_bs: int, threads: int | None = None) -> None:
        """`threads`: pin the compiled decode to that many intra-op threads; default: the THREADS_ENV
        variable, else adaptive between 1 and the process's torch thread count now."""
        self.model = model
        self.max_bs = max_bs
        self.device = next(model.parameters()).device
        self.report = CompileReport(enabled=False, reason="not warmed up")
        self.steps_by_batch_size: Counter[int] = Counter()  # compiled decode steps served, after warm-up
        # After warm-up, check only the guards that tell the compiled graphs apart (batch 1 or not), not the
        # ~hundreds on every parameter and pool tensor: 0.4-1.2 ms a step on the demo model. Safe because every
        # input is normalized (int64, contiguous, inference tensors, KV length >= 2), the pools and weights
        # never change shape, and nothing else in the process shares the compiled code object: with a second
        # CompiledDecode alive (two engines in one process) every guard runs again.
        self.skip_guards = False
        _INSTANCES.add(self)

        decode = decode_step(model)
        self._eager = decode
        self.threads = DecodeThreadChooser.up_to(torch.get_num_threads(), THREADS_ENV, pinned=threads)
        # One compiled function per thread count, each over its own copy of the code object: dynamo keeps its
        # graphs on the code object and does not guard on the thread count, so one code object would serve the
        # graphs compiled for one count to the other. fullgraph: a decode path that graph-breaks would run as
        # many small graphs plus eager glue; such a model is reported and kept eager instead.
        self._compiled: dict[int, Callable[..., torch.Tensor]] = {
            n: torch.compile(copy_function(decode, f"decode_{n}_threads"), fullgraph=True, options=_INDUCTOR_OPTIONS)
            for n in self.threads.options
        }

    def handles(self, batch: ForwardBatch) -> bool:
        return (
            self.report.enabled
            and batch.mode == "decode"
            and batch.batch_size <= self.max_bs
            and not batch.all_logits
            and batch.state_checkpoints is None
            # A KV length of 1 (never in decode: the prompt is cached) would be a size torch specializes.
            and min(loc.numel() for loc in batch.kv_locs) >= 2
        )

    def __call__(self, batch: ForwardBatch, buffers: PoolBuffers) -> torch.Tensor:
        meta = AttentionMetadata.build(batch, self.device)
        kv_index = meta.kv_index
        assert kv_index is not None
        # Always a mask (all True when every sequence has the same length): one graph for both cases.
        kv_mask = meta.kv_mask
        if kv_mask is None:
            kv_mask = torch.ones(kv_index.shape[0], 1, 1, kv_index.shape[1], dtype=torch.bool, device=self.device)

        def traced(t: torch.Tensor) -> torch.Tensor:
            return as_traced(t.to(self.device, torch.int64))

        inputs = DecodeInputs(
            traced(batch.input_ids),
            traced(batch.positions),
            traced(batch.out_locs),
            traced(batch.state_slots),
            traced(kv_index),
            as_traced(kv_mask),
        )
        self.steps_by_batch_size[batch.batch_size] += 1
        return self.threads.timed(batch.batch_size, lambda n: self._run(*inputs, buffers, threads=n))

    def _run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        out_locs: torch.Tensor,
        state_slots: torch.Tensor,
        kv_index: torch.Tensor,
        kv_mask: torch.Tensor,
        buffers: PoolBuffers,
        *,
        threads: int | None = None,
    ) -> torch.Tensor:
        """One compiled decode step on `threads` intra-op threads (default: the fewest compiled for)."""
        skip_guards = self.skip_guards and len(_INSTANCES) == 1
        step = DecodeInputs(input_ids, positions, out_locs, state_slots, kv_index, kv_mask)
        if not skip_guards:
            # Marks matter only to a compile, and with the guards skipped no call compiles (torch raises
            # instead): after warm-up they are not set, they cost ~20-50 us each (8 a step at batch > 1).
            mark_dynamic_dims(step)
        threads = self.threads.options[0] if threads is None else threads
        compiled = self._compiled[threads]
        with intra_op_threads(threads):
            return run_compiled(compiled, *step, buffers, skip_guards=skip_guards)

    @torch.inference_mode()
    def warm_up(self, buffers: PoolBuffers) -> CompileReport:
        """Compile for batch 1 and for batch > 1 now, so no request pays it. On any failure the engine keeps
        the eager decode and the report (and the log) says why."""
        name = type(self.model).__name__
        sizes = [1] + ([min(self.max_bs, 3)] if self.max_bs > 1 else [])
        need_tokens = max(sizes) * (max(_WARMUP_KV_LEN) + 1)
        token_slots = min((t.shape[0] for t in (*buffers.k, *buffers.v)), default=need_tokens)
        state_slots = min((t.shape[0] for t in (*buffers.conv, *buffers.ssm)), default=max(sizes))
        if token_slots < need_tokens or state_slots < max(sizes):
            return self._off(name, "the pools are too small for the warm-up batches", 0.0)
        if reason := pools_traceable(buffers):
            return self._off(name, reason, 0.0)
        vocab = self.model.layout().vocab_size
        t0 = time.perf_counter()
        before = graphs_compiled()
        try:
            with restored(buffers, need_tokens, max(sizes)):
                # One eager step first: modules that fill a lazy cache on first use (e.g. GatedDeltaNet's
                # de-interleave orders) would otherwise be traced empty, and guarded on being empty.
                self._eager(*_warmup_inputs(1, _WARMUP_KV_LEN[0], vocab, self.device), buffers)
                for threads in self.threads.options:
                    for batch in sizes:
                        for kv_len in _WARMUP_KV_LEN:
                            inputs = _warmup_inputs(batch, kv_len, vocab, self.device)
                            self._run(*inputs, buffers, threads=threads)
        except Exception as exc:  # noqa: BLE001 - any tracing/compile failure means: stay eager, say why
            return self._off(name, failure_reason(exc), time.perf_counter() - t0)
        self.report = CompileReport(
            enabled=True, reason="", graphs=graphs_compiled() - before, elapsed_s=time.perf_counter() - t0
        )
        self.skip_guards = True
        logger.info(
            "Torch compile: %s decode compiled for batch sizes 1..%d (%d graphs, threads %s), elapsed=%.1f s",
            name,
            self.max_bs,
            self.report.graphs,
            self.threads.describe(),
            self.report.elapsed_s,
        )
        return self.report

    def _off(self, name: str, reason: str, elapsed_s: float) -> CompileReport:
        self.report = stays_eager(name, "decode", reason, elapsed_s)
        return self.report


def decode_step(model: HybridModel) -> Callable[..., torch.Tensor]:
    """The decode step this module compiles, as a function of tensors only (the `DecodeInputs` fields, then the
    pool buffers), so that a graph of it can be replayed over the same input tensors refilled in place:
    tests/runtime/test_decode_graph.py traces it whole for every family."""

    def decode(
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        out_locs: torch.Tensor,
        state_slots: torch.Tensor,
        kv_index: torch.Tensor,
        kv_mask: torch.Tensor,
        buffers: PoolBuffers,
    ) -> torch.Tensor:
        ctx = StepContext(
            batch=None,
            buffers=buffers,
            attn=AttentionMetadata(decode=True, kv_index=kv_index, kv_mask=kv_mask),
            packing=None,
            state_slots=state_slots,
            out_locs=out_locs,
            positions=positions,
        )
        return model.forward_tokens(input_ids, ctx)

    return decode


def mark_dynamic_dims(step: DecodeInputs) -> None:
    """Size 1 is specialized by torch (its own graph); from 2 up the batch dim is one symbol. The KV length is
    always a symbol. Marking them before a compile avoids the compile-static-then-recompile-dynamic dance."""
    if step.input_ids.shape[0] > 1:
        for t in step:
            torch._dynamo.mark_dynamic(t, 0)  # noqa: SLF001 - torch has no public mark_dynamic
    torch._dynamo.mark_dynamic(step.kv_index, 1)  # noqa: SLF001 - torch has no public mark_dynamic
    torch._dynamo.mark_dynamic(step.kv_mask, 3)  # noqa: SLF001 - torch has no public mark_dynamic


def _warmup_inputs(batch: int, kv_len: int, vocab: int, device: torch.device) -> DecodeInputs:
    """A decode step of `batch` sequences of `kv_len` tokens, sequence i on token slots i*(kv_len+1)...; the
    last sequence one token shorter so the mask is exercised."""
    lens = [kv_len] * batch
    if batch > 1:
        lens[-1] = kv_len - 1
    stride = max(_WARMUP_KV_LEN) + 1
    kv_index = torch.stack([_row(i * stride, n, kv_len) for i, n in enumerate(lens)])
    kv_mask = (torch.arange(kv_len)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]
    out_locs = torch.tensor([i * stride + n - 1 for i, n in enumerate(lens)])
    positions = torch.tensor([n - 1 for n in lens])
    input_ids = torch.arange(batch) % vocab
    state_slots = torch.arange(batch)
    return DecodeInputs._make(t.to(device) for t in (input_ids, positions, out_locs, state_slots, kv_index, kv_mask))


def _row(start: int, length: int, width: int) -> torch.Tensor:
    row = torch.full((width,), start)
    row[:length] = torch.arange(start, start + length)
    return row
