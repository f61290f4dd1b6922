"""A minimal single-process driver for a HybridModel over real pools, without scheduler or prefix cache.

It hands out KV token slots and state slots linearly and builds ForwardBatches the way the engine does.
Tests use it to check the model against reference implementations; benchmarks/gpu_check.py uses it to run the
model alone (run from the repository root).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.core.batch import ForwardBatch
from runtime.core.buffers import allocate_pool_buffers
from runtime.models.base import HybridModel


@dataclass
class _Sequence:
    slot: int
    tokens: list[int] = field(default_factory=list)
    kv_locs: list[int] = field(default_factory=list)


class SimpleRunner:
    def __init__(
        self,
        model: HybridModel,
        *,
        num_token_slots: int = 4096,
        num_state_slots: int = 8,
        kv_dtype: torch.dtype = torch.float32,
        ssm_dtype: torch.dtype = torch.float32,
        conv_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        device = next(model.parameters()).device
        self.device = device
        self.buffers = allocate_pool_buffers(
            model.layout(),
            num_token_slots,
            num_state_slots,
            kv_dtype=kv_dtype,
            conv_dtype=conv_dtype or next(model.parameters()).dtype,
            ssm_dtype=ssm_dtype,
            device=device,
            zeroed=True,  # tests read slots back to check what a forward wrote, and where
        )
        self.num_token_slots = num_token_slots
        self.next_token_slot = 0
        self.free_state_slots = list(range(num_state_slots))
        self.seqs: dict[int, _Sequence] = {}

    def add(self, seq_id: int) -> None:
        slot = self.free_state_slots.pop(0)
        for buf in (*self.buffers.conv, *self.buffers.ssm):
            buf[slot].zero_()
        self.seqs[seq_id] = _Sequence(slot=slot)

    def _alloc(self, n: int) -> list[int]:
        if self.next_token_slot + n > self.num_token_slots:
            raise RuntimeError(f"SimpleRunner: out of KV token slots ({self.num_token_slots}); make it bigger.")
        locs = list(range(self.next_token_slot, self.next_token_slot + n))
        self.next_token_slot += n
        return locs

    @torch.inference_mode()
    def extend(self, chunks: dict[int, list[int]], *, all_logits: bool = False) -> torch.Tensor:
        """Append `chunks[seq_id]` to each sequence in one packed forward; returns the model's logits."""
        ids, positions, out_locs, kv_locs, ext, pre, slots = [], [], [], [], [], [], []
        for seq_id, new in chunks.items():
            seq = self.seqs[seq_id]
            locs = self._alloc(len(new))
            pre.append(len(seq.tokens))
            ext.append(len(new))
            ids += new
            positions += list(range(len(seq.tokens), len(seq.tokens) + len(new)))
            out_locs += locs
            seq.tokens += new
            seq.kv_locs += locs
            kv_locs.append(torch.tensor(seq.kv_locs, dtype=torch.int64))
            slots.append(seq.slot)
        mode = "decode" if all(n == 1 for n in ext) and all(p > 0 for p in pre) and not all_logits else "extend"
        batch = ForwardBatch(
            mode=mode,
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            extend_lens=ext,
            prefix_lens=pre,
            kv_locs=kv_locs,
            out_locs=torch.tensor(out_locs, dtype=torch.int64),
            state_slots=torch.tensor(slots, dtype=torch.int64),
            all_logits=all_logits,
        )
        return self.model(batch, self.buffers)

    def generate_greedy(self, seq_id: int, prompt: list[int], max_new_tokens: int, chunk: int = 0) -> list[int]:
        """Prefill `prompt` (in chunks of `chunk` tokens when > 0), then decode greedily; returns the new
        tokens."""
        self.add(seq_id)
        step = chunk or len(prompt)
        logits = None
        for start in range(0, len(prompt), step):
            logits = self.extend({seq_id: prompt[start : start + step]})
        assert logits is not None
        out = [int(logits[-1].argmax())]
        while len(out) < max_new_tokens:
            logits = self.extend({seq_id: [out[-1]]})
            out.append(int(logits[-1].argmax()))
        return out
