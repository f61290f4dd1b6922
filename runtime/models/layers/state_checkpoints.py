"""In-forward state checkpoints: the recurrent state after the first n new tokens of a sequence, written into a
spare state slot during the one extend forward that computes those tokens.

The prefix cache wants the state at several positions of a long prompt. Prefilling the prompt in pieces that
end at those positions costs a forward per piece; instead the chunked kernels hand out the state at any position
they pass: at a chunk boundary it is the state the chunk recurrence already holds, inside a chunk it is that
chunk's start state advanced by the chunk's first r tokens (the same terms the chunk's end state sums, cut at r).
The conv window after n tokens is n rows into the old window followed by the new inputs (conv.window_rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateCheckpoints:
    """Flattened (sequence, tokens consumed, destination slot) triples of one extend batch, in batch order."""

    seq: list[int]  # sequence index in the batch
    tokens: list[int]  # new tokens of that sequence already consumed when the state is taken, 1..extend_len
    slots: torch.Tensor  # [M] int64 destination state slots
    # Inside a compiled graph (runtime/engine/compiled_extend.py) the token counts are a tensor [M] of one
    # sequence's checkpoints and `seq` / `tokens` are empty: Python ints there would be baked into the graph.
    traced_tokens: torch.Tensor | None = None

    @classmethod
    def traced(cls, tokens: torch.Tensor, slots: torch.Tensor) -> StateCheckpoints:
        return cls([], [], slots, traced_tokens=tokens)

    @classmethod
    def build(
        cls, per_seq: list[list[tuple[int, int]]], extend_lens: list[int], device: torch.device
    ) -> StateCheckpoints | None:
        if len(per_seq) != len(extend_lens):
            raise ValueError(f"state_checkpoints has {len(per_seq)} entries for {len(extend_lens)} sequences")
        seq: list[int] = []
        tokens: list[int] = []
        slots: list[int] = []
        for i, entries in enumerate(per_seq):
            for n, slot in entries:
                if not 0 < n <= extend_lens[i]:
                    raise ValueError(
                        f"state checkpoint after {n} new tokens of sequence {i}, which extends {extend_lens[i]}"
                    )
                seq.append(i)
                tokens.append(n)
                slots.append(slot)
        if not seq:
            return None
        return cls(seq, tokens, torch.tensor(slots, dtype=torch.int64, device=device))

    def in_chunk(self, chunk: int, chunk_size: int) -> list[tuple[int, int, int]]:
        """(checkpoint index, sequence, tokens r into the chunk: 1..chunk_size) for checkpoints inside `chunk`."""
        out = []
        for m, (b, n) in enumerate(zip(self.seq, self.tokens, strict=True)):
            if (n - 1) // chunk_size == chunk:
                out.append((m, b, n - chunk * chunk_size))
        return out


def write_states(
    pool: torch.Tensor, slots: torch.Tensor, states: list[torch.Tensor], *, transpose: bool = False
) -> None:
    """pool[slots[m]] = states[m] (transposed in its last two dims with `transpose`). On the CPU one copy each: a
    stack of them first is one more copy of every checkpoint (36 of 2 MiB per Mamba2 layer of a 2048-token
    prompt). Elsewhere one indexed write, so the slots are not read back to the host."""
    if pool.device.type != "cpu" or torch.compiler.is_compiling():
        stacked = torch.stack(states)
        pool[slots] = (stacked.transpose(-1, -2) if transpose else stacked).to(pool.dtype)
        return
    for slot, state in zip(slots.tolist(), states, strict=True):
        pool[slot].copy_(state.transpose(-1, -2) if transpose else state)


def chunk_positions(tokens: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For traced token counts [M]: the chunk holding each one's last token, and that token's index in it
    (what the chunked kernels cut their end-state formula at)."""
    chunk = torch.div(tokens - 1, chunk_size, rounding_mode="floor")
    return chunk, tokens - 1 - chunk * chunk_size


def supports_traced_state_checkpoints(model: torch.nn.Module) -> bool:
    """True when every recurrent layer also takes StateCheckpoints.traced (token counts as a tensor)."""
    mixers = [m for m in model.modules() if hasattr(m, "conv_state_shape")]
    return bool(mixers) and all(getattr(m, "writes_traced_state_checkpoints", False) for m in mixers)


def supports_state_checkpoints(model: torch.nn.Module) -> bool:
    """True when every recurrent layer of the model (a module with a conv state) writes in-forward checkpoints;
    the scheduler otherwise ends a prefill forward at each checkpoint and copies the slot after it."""
    mixers = [m for m in model.modules() if hasattr(m, "conv_state_shape")]
    return bool(mixers) and all(getattr(m, "writes_state_checkpoints", False) for m in mixers)
