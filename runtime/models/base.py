"""What every model class offers the engine and the loader."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runtime.core.batch import ForwardBatch, ModelLayout, PoolBuffers
from runtime.core.device_path import upload
from runtime.models.layers.attention import AttentionMetadata
from runtime.models.layers.packing import SequencePacking
from runtime.models.weight_arena import WeightArena


@dataclass(frozen=True)
class DecodeTail:
    """A mixed step's decode rows (ForwardBatch.decode_rows): the forward's tokens from `first_token` on, one per
    decoding sequence. Recurrent layers run them through their decode step (`HybridLayer.recur`): padded into
    the prompt chunks' [B, Lmax] layout, each would cost a whole chunk's scan."""

    first_token: int
    state_slots: torch.Tensor  # [decode_rows]
    logit_index: torch.Tensor  # every sequence's last new token: the chunks' last tokens, then each decode row


@dataclass
class StepContext:
    """Per-forward metadata, built once and shared by every layer."""

    batch: ForwardBatch | None  # None in the compiled paths (runtime/engine/compiled_decode.py, compiled_extend.py)
    buffers: PoolBuffers
    attn: AttentionMetadata
    packing: SequencePacking | None  # None in decode mode; a mixed step's: its prompt chunks only
    state_slots: torch.Tensor
    out_locs: torch.Tensor
    positions: torch.Tensor
    decode_tail: DecodeTail | None = None  # a mixed step's decode rows

    @classmethod
    def build(cls, batch: ForwardBatch, buffers: PoolBuffers, device: torch.device) -> StepContext:
        decode = batch.mode == "decode"
        tail = None if decode or not batch.decode_rows else _decode_tail(batch, device)
        chunks = batch if tail is None else batch.prompt_chunks()
        return cls(
            batch=batch,
            buffers=buffers,
            attn=AttentionMetadata.build(batch, device),
            packing=None if decode else SequencePacking.build(chunks, device),
            state_slots=upload(batch.state_slots, device),
            out_locs=upload(batch.out_locs, device),
            positions=upload(batch.positions, device),
            decode_tail=tail,
        )

    def logit_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        """The rows of `hidden` [T, H] whose logits are returned: each sequence's last new token in extend
        mode (compiled extends included: they have no batch), every token in decode mode or when the batch asks
        for all logits."""
        if self.packing is None or (self.batch is not None and self.batch.all_logits):
            return hidden
        if self.decode_tail is not None:
            return hidden[self.decode_tail.logit_index]
        return hidden[self.packing.last_index]


def _decode_tail(batch: ForwardBatch, device: torch.device) -> DecodeTail:
    n = batch.batch_size - batch.decode_rows
    if any(length != 1 for length in batch.extend_lens[n:]):
        raise ValueError(f"ForwardBatch: decode rows of {batch.extend_lens[n:]} tokens; a decode row is one token")
    first = sum(batch.extend_lens[:n])
    last = torch.tensor(batch.extend_lens[:n], dtype=torch.int64).cumsum(0) - 1
    index = torch.cat([last, torch.arange(first, first + batch.decode_rows)])
    return DecodeTail(first, upload(batch.state_slots[n:], device), upload(index, device))


class HybridModel(nn.Module):
    """A causal LM whose layers read and write the engine's pools.

    Subclasses set `config` (a plain dataclass of the fields they use), build modules named exactly like
    the HF checkpoint's tensors, and implement `layout` and `forward_tokens` (`DecoderLM` in models/decoder.py
    does both for the bundled families).
    """

    config: object
    eos_token_ids: tuple[int, ...] = ()
    # The block the loader put the host parameters in (runtime/models/weight_arena.py); None when each is its own.
    weight_arena: WeightArena | None = None

    def __init__(self) -> None:
        super().__init__()
        # Tensors the checkpoint carries that this model does not run (e.g. Qwen3-Next's `mtp.*` draft
        # layers), kept for speculative decoding.
        self.extra_weights: dict[str, torch.Tensor] = {}

    def layout(self) -> ModelLayout:
        raise NotImplementedError

    def cast(self, dtype: torch.dtype) -> HybridModel:
        """`self.to(dtype)`, except the parameters each module lists in `fp32_parameters` (the recurrent layers'
        A_log / dt_bias / D, a router's correction bias): those stay fp32 under 16-bit weights, as transformers
        (`_keep_in_fp32_modules`) and SGLang keep them. Tiny tensors that feed exp/softplus or pick experts:
        rounded to bf16 they shift every decay and routing decision."""
        self.to(dtype)
        for module in self.modules():
            for name in getattr(module, "fp32_parameters", ()):
                param = getattr(module, name)
                param.data = param.data.float()
        return self

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the weights are held in: that of most of the parameters' elements (`cast` keeps a few small
        ones fp32). What a kernel outside torch checks before it reads them (runtime/engine/native_decode.py)."""
        counts: dict[torch.dtype, int] = {}
        for param in self.parameters():
            counts[param.dtype] = counts.get(param.dtype, 0) + param.numel()
        return max(counts, key=lambda dtype: counts[dtype])

    def checkpoint_sources(self) -> dict[str, list[str]]:
        """Parameters assembled from several checkpoint tensors: param name → tensor names, concatenated
        on dim 0 in that order and reshaped to the parameter's shape. Other parameters use their own name."""
        return {}

    def checkpoint_aliases(self) -> dict[str, str]:
        """Parameters that may fall back to another tensor when absent (tied embeddings)."""
        tied = getattr(getattr(self, "config", None), "tie_word_embeddings", False)
        return {"lm_head.weight": "model.embed_tokens.weight"} if tied else {}

    def extra_weight_prefixes(self) -> tuple[str, ...]:
        return ()

    def checkpoint_prefix_renames(self) -> dict[str, str]:
        """Checkpoint name prefixes to rewrite before matching (e.g. a multimodal wrapper's nesting)."""
        return {}

    def ignored_weight_prefixes(self) -> tuple[str, ...]:
        """Checkpoint tensors this model deliberately does not load (e.g. a vision tower)."""
        return ()

    def forward(self, batch: ForwardBatch, buffers: PoolBuffers) -> torch.Tensor:
        device = next(self.parameters()).device
        ctx = StepContext.build(batch, buffers, device)
        return self.forward_tokens(upload(batch.input_ids, device), ctx)

    def forward_tokens(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:  # pragma: no cover
        """Tensors only, from embedding to logits: what the compiled decode path traces."""
        raise NotImplementedError
