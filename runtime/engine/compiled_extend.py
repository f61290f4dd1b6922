"""`--enable-torch-compile` with `--torch-compile-max-extend-tokens N` (default 128): an extend of one sequence
of at most N new tokens runs a torch.compile'd forward (the runtime's counterpart of SGLang's prefill CUDA
graphs for short prefills; longer extends and batches of several sequences stay eager).

Why: a short extend is as many aten ops as a long one (the demo model: ~2000), so an eager 8-token prefill
costs ~10 ms of dispatch and a 64-token extend after a prefix-cache hit ~20 ms; compiled, the elementwise work
is fused into a few C++ kernels around the matmuls (benchmarks/compiled_extend_step.py, docs/performance.md).

Shapes are static per bucket: the new tokens are padded up to the next power of two from 8 (8, 16, 32, 64, ...),
so there is one graph per bucket, dynamic only in the cached-prefix length. A padded step is inert:
- recurrent layers see it as padding (SequencePacking.padded_tail: g, beta and dt zeroed, so it neither
  decays nor writes the state; the conv state is taken at the real length);
- its K/V write repeats the last real token's row at that token's slot (AttentionMetadata.write_rows), so no
  slot gets a padded value, and every key at or past the padding is masked;
- its query row copies the last real token's position and mask, so nothing it computes is non-finite; its
  logits are never taken.
The delta rule pads a chunk to a power of two anyway, so a padded bucket runs the same chunk grid as eager.

A state checkpoint inside the extend (the prefix cache's branch point): when every recurrent layer takes
checkpoint token counts as a tensor (StateCheckpoints.traced: the delta rule, KDA and the SSD scan do), the graph
always writes one checkpoint, into the pool's padding slot when none is wanted, so there is still one graph per
bucket. A model with a layer that does not splits the extend in two compiled forwards with a state copy between
them (the state after the first part is exactly the one wanted). More than one checkpoint, and speculative
decoding's verify forwards (every token's logits), run eager.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import Counter
from collections.abc import Callable

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
from runtime.models.base import HybridModel, StepContext
from runtime.models.layers.attention import AttentionMetadata
from runtime.models.layers.packing import SequencePacking
from runtime.models.layers.state_checkpoints import StateCheckpoints, supports_traced_state_checkpoints

logger = logging.getLogger("runtime.engine")

SMALLEST_BUCKET = 8
# Warm-up prefix lengths: distinct from each other and from every bucket size, so the prefix dim is traced
# as its own symbol (see compiled_decode._WARMUP_KV_LEN).
_WARMUP_PREFIX = (37, 53)

# Every CompiledExtend of this process (guards are skipped only while one lives, as for CompiledDecode).
_INSTANCES: weakref.WeakSet[CompiledExtend] = weakref.WeakSet()

StateCopy = Callable[[int, int], None]  # (source slot, destination slot): every linear layer's conv + SSM state


def extend_buckets(max_tokens: int) -> tuple[int, ...]:
    """Padded lengths compiled for extends of up to `max_tokens` new tokens: 8, 16, ... up to the first power
    of two >= max_tokens."""
    buckets = [SMALLEST_BUCKET]
    while buckets[-1] < max_tokens:
        buckets.append(2 * buckets[-1])
    return tuple(buckets)


class CompiledExtend:
    def __init__(self, model: HybridModel, max_tokens: int, copy_state: StateCopy, padding_slot: int) -> None:
        """`copy_state(src, dst)` copies a state slot (StateSlotPool.copy): a checkpoint between two parts.
        `padding_slot`: a state slot no request uses (the pool's K + 1st), where an unwanted checkpoint goes."""
        self.model = model
        self.traced_checkpoints = supports_traced_state_checkpoints(model)
        self.padding_slot = padding_slot
        self.max_tokens = max_tokens
        self.buckets = extend_buckets(max_tokens)
        self.copy_state = copy_state
        self.device = next(model.parameters()).device
        # Inductor builds the thread count into a graph's kernels: the graphs run on the count they were
        # compiled for, the process's at construction.
        self.threads = torch.get_num_threads()
        self.report = CompileReport(enabled=False, reason="not warmed up")
        self.forwards_by_bucket: Counter[int] = Counter()  # compiled forwards run, after warm-up
        self.skip_guards = False
        _INSTANCES.add(self)
        traced_checkpoints = self.traced_checkpoints  # what the graphs are built with, whatever changes later

        def extend(
            input_ids: torch.Tensor,  # [Tb] new tokens, padded
            positions: torch.Tensor,  # [Tb]
            out_locs: torch.Tensor,  # [Tb] KV slot of each new token (padding: the last real token's)
            write_rows: torch.Tensor,  # [Tb] row of the new K/V each out_loc gets (padding: the last real row)
            state_slot: torch.Tensor,  # [1]
            has_prefix: torch.Tensor,  # [1] bool
            lens: torch.Tensor,  # [1] real new tokens
            valid: torch.Tensor,  # [1, Tb] bool
            kv_index: torch.Tensor,  # [prefix + Tb] KV slots of every token (padding: the last real token's)
            mask: torch.Tensor,  # [Tb, prefix + Tb] bool
            checkpoint_tokens: torch.Tensor,  # [1] new tokens before the checkpoint (traced checkpoints only)
            checkpoint_slot: torch.Tensor,  # [1] its destination slot
            buffers: PoolBuffers,
        ) -> torch.Tensor:
            bucket = input_ids.shape[0]
            packing = SequencePacking(
                lens=lens,
                max_len=bucket,
                gather_index=write_rows[None],
                valid=valid,
                has_prefix=has_prefix,
                state_slots=state_slot,
                last_index=lens - 1,
                uniform=True,
                padded_tail=True,
                checkpoints=StateCheckpoints.traced(checkpoint_tokens, checkpoint_slot) if traced_checkpoints else None,
            )
            attn = AttentionMetadata(
                decode=False, seq_kv=[kv_index], q_spans=[(0, bucket)], seq_masks=[mask], write_rows=write_rows
            )
            ctx = StepContext(
                batch=None,
                buffers=buffers,
                attn=attn,
                packing=packing,
                state_slots=state_slot,
                out_locs=out_locs,
                positions=positions,
            )
            return model.forward_tokens(input_ids, ctx)

        self._eager = extend
        # One code object per bucket (compiled_decode.py says why): each then holds exactly one graph.
        self._compiled = {
            b: torch.compile(copy_function(extend, f"extend_{b}_tokens"), fullgraph=True) for b in self.buckets
        }

    def bucket_for(self, tokens: int) -> int:
        return next(b for b in self.buckets if b >= tokens)

    def handles(self, batch: ForwardBatch) -> bool:
        checkpoints = batch.state_checkpoints
        return (
            self.report.enabled
            and batch.mode == "extend"
            and batch.batch_size == 1
            and batch.extend_lens[0] <= self.max_tokens
            and not batch.all_logits
            and (checkpoints is None or len(checkpoints[0]) <= 1)
        )

    def __call__(self, batch: ForwardBatch, buffers: PoolBuffers) -> torch.Tensor:
        """Logits [1, vocab] of the sequence's last new token."""
        tokens, prefix = batch.extend_lens[0], batch.prefix_lens[0]
        slot = int(batch.state_slots[0])
        kv_locs = batch.kv_locs[0]
        wanted = batch.state_checkpoints[0][0] if batch.state_checkpoints and batch.state_checkpoints[0] else None
        if self.traced_checkpoints:
            checkpoint = wanted if wanted is not None else (tokens, self.padding_slot)
            return self._run_part(batch, kv_locs, prefix, 0, tokens, slot, checkpoint, buffers)
        split = wanted
        parts = [(0, tokens)] if split is None or split[0] == tokens else [(0, split[0]), (split[0], tokens)]
        logits = torch.empty(0)
        for start, end in parts:
            logits = self._run_part(batch, kv_locs, prefix, start, end, slot, (1, self.padding_slot), buffers)
            if split is not None and end == split[0]:
                self.copy_state(slot, split[1])  # the state after the checkpoint's token count
        return logits

    def _run_part(
        self,
        batch: ForwardBatch,
        kv_locs: torch.Tensor,
        prefix: int,
        start: int,
        end: int,
        slot: int,
        checkpoint: tuple[int, int],
        buffers: PoolBuffers,
    ) -> torch.Tensor:
        """New tokens [start, end) of the batch's one sequence, after prefix + start cached tokens; with traced
        checkpoints, the state after checkpoint[0] of them goes to slot checkpoint[1]."""
        real, cached = end - start, prefix + start
        bucket = self.bucket_for(real)
        rows = torch.arange(bucket).clamp_(max=real - 1)  # padding repeats the last real token
        new = rows + start
        kv_index = kv_locs[: cached + real].index_select(0, torch.arange(cached + bucket).clamp_(max=cached + real - 1))
        mask = torch.arange(cached + bucket)[None, :] <= (rows + cached)[:, None]
        # The prefix length is the one dynamic size: the KV index [prefix + Tb] and the mask [Tb, prefix + Tb].
        kv_index, mask = as_traced(kv_index.to(self.device)), as_traced(mask.to(self.device))
        torch._dynamo.mark_dynamic(kv_index, 0)  # noqa: SLF001 - torch has no public mark_dynamic
        torch._dynamo.mark_dynamic(mask, 1)  # noqa: SLF001 - torch has no public mark_dynamic
        inputs = [
            as_traced(t.to(self.device))
            for t in (
                batch.input_ids.index_select(0, new),
                batch.positions.index_select(0, new),
                batch.out_locs.index_select(0, new),
                rows,
                torch.tensor([slot]),
                torch.tensor([cached > 0]),
                torch.tensor([real]),
                (torch.arange(bucket) < real)[None],
                kv_index,
                mask,
                torch.tensor([checkpoint[0]]),
                torch.tensor([checkpoint[1]]),
            )
        ]
        self.forwards_by_bucket[bucket] += 1
        with intra_op_threads(self.threads):
            skip_guards = self.skip_guards and len(_INSTANCES) == 1
            return run_compiled(self._compiled[bucket], *inputs, buffers, skip_guards=skip_guards)

    @torch.inference_mode()
    def warm_up(self, buffers: PoolBuffers) -> CompileReport:
        """Compile every bucket now, so no request pays it; on any failure extends stay eager and the log
        says why. Warm-up writes through state slot 0 and the first token slots, which are put back after."""
        name = type(self.model).__name__
        need_tokens = max(_WARMUP_PREFIX) + max(self.buckets)
        token_slots = min((t.shape[0] for t in (*buffers.k, *buffers.v)), default=need_tokens)
        state_slots = min((t.shape[0] for t in (*buffers.conv, *buffers.ssm)), default=self.padding_slot + 1)
        if token_slots < need_tokens or state_slots <= self.padding_slot:
            return self._off(name, "the pools are too small for the warm-up extends", 0.0)
        if reason := pools_traceable(buffers):
            return self._off(name, reason, 0.0)
        vocab = self.model.layout().vocab_size
        t0 = time.perf_counter()
        before = graphs_compiled()
        try:
            with restored(buffers, need_tokens, 1):
                for i, bucket in enumerate(self.buckets):
                    for prefix in _WARMUP_PREFIX:
                        # With and without a checkpoint: a split one alone might not reach this bucket.
                        checkpoint = prefix == _WARMUP_PREFIX[1]
                        batch = _warmup_batch(bucket - 1, prefix, vocab, self.padding_slot if checkpoint else None)
                        if i == 0 and prefix == _WARMUP_PREFIX[0]:
                            # One eager forward first: modules that fill a lazy cache on first use would
                            # otherwise be traced empty, and guarded on being empty.
                            self._eager_part(batch, buffers)
                        self(batch, buffers)
        except Exception as exc:  # noqa: BLE001 - any tracing/compile failure means: stay eager, say why
            return self._off(name, failure_reason(exc), time.perf_counter() - t0)
        self.forwards_by_bucket.clear()
        self.report = CompileReport(
            enabled=True, reason="", graphs=graphs_compiled() - before, elapsed_s=time.perf_counter() - t0
        )
        self.skip_guards = True
        logger.info(
            "Torch compile: %s extends of up to %d new tokens compiled (buckets %s, %d graphs), elapsed=%.1f s",
            name,
            self.max_tokens,
            ", ".join(map(str, self.buckets)),
            self.report.graphs,
            self.report.elapsed_s,
        )
        return self.report

    def _eager_part(self, batch: ForwardBatch, buffers: PoolBuffers) -> None:
        compiled, self._compiled = self._compiled, {b: self._eager for b in self.buckets}
        try:
            self(batch, buffers)
        finally:
            self._compiled = compiled

    def _off(self, name: str, reason: str, elapsed_s: float) -> CompileReport:
        self.report = stays_eager(name, "extends", reason, elapsed_s)
        return self.report


def _warmup_batch(tokens: int, prefix: int, vocab: int, checkpoint_slot: int | None = None) -> ForwardBatch:
    """One sequence on token slots 0.. and state slot 0: `tokens` new tokens after `prefix` cached ones; with
    `checkpoint_slot`, a state checkpoint after the first half goes there."""
    total = prefix + tokens
    return ForwardBatch(
        mode="extend",
        input_ids=torch.arange(tokens) % vocab,
        positions=torch.arange(prefix, total),
        extend_lens=[tokens],
        prefix_lens=[prefix],
        kv_locs=[torch.arange(total)],
        out_locs=torch.arange(prefix, total),
        state_slots=torch.tensor([0]),
        state_checkpoints=None if checkpoint_slot is None else [[(max(1, tokens // 2), checkpoint_slot)]],
    )
