"""What the hybrid families share: where each layer's cache lives (derived from the config's layer types, here
only), how a layer calls its token mixer, and the decoder body (embed → layers → norm → logits)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from runtime.core.batch import ModelLayout
from runtime.models.base import HybridModel, StepContext
from runtime.models.errors import ModelLoadError
from runtime.models.hf_config import HFConfig
from runtime.models.layers.rotary import RotaryEmbedding

FULL = "full_attention"  # a KV-cache layer
LINEAR = "linear_attention"  # a recurrent layer (conv + SSM state)
PARALLEL = "parallel"  # both mixers side by side in one layer (Falcon-H1): a KV and a state entry
# Older names some configs use.
LAYER_ALIASES = {"mamba": LINEAR, "attention": FULL}

CosSin = tuple[torch.Tensor, torch.Tensor] | None


def checked_layer_types(
    cfg: HFConfig,
    key: str,
    raw: Sequence[Any],
    allowed: Collection[str],
    *,
    count: int | None = None,
    aliases: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """The config's per-layer kinds (`raw`, read from `key`), older names mapped through `aliases`; an error naming
    the file and key when an entry is not in `allowed` or, with `count`, when there are not `count` of them."""
    names = aliases or {}
    types = tuple(names.get(t, t) if isinstance(t, str) else t for t in raw)
    unknown = sorted({repr(t) for t in types if t not in allowed})
    if unknown or (count is not None and len(types) != count):
        need = f"{count} entries" if count is not None else "entries"
        known = " / ".join([*allowed, *names])
        raise ModelLoadError(
            f"{cfg.path}: '{cfg.prefix}{key}' must list {need} of {known} (got {len(types)}, unknown "
            f"{', '.join(unknown) or 'none'}); fix the file."
        )
    return types


def cache_layer_ids(layer_types: Sequence[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ids of the layers with a KV cache, ids of the layers with recurrent state)."""
    attn = tuple(i for i, t in enumerate(layer_types) if t in (FULL, PARALLEL))
    linear = tuple(i for i, t in enumerate(layer_types) if t in (LINEAR, PARALLEL))
    return attn, linear


def pool_ordinals(layer_types: Sequence[str]) -> list[int]:
    """Each layer's index into its kind's pool buffers (`buffers.k/v` for attention, `buffers.conv/ssm` for
    recurrent layers): its rank among the layers of that kind; -1 for a layer that caches nothing (MLP, MoE)."""
    seen = {FULL: 0, LINEAR: 0}
    ordinals = []
    for kind in layer_types:
        if kind == PARALLEL:
            if seen[FULL] != seen[LINEAR]:
                raise ValueError(f"layer types {list(layer_types)}: a parallel layer needs one ordinal for both pools")
            ordinals.append(seen[FULL])
            seen[FULL] += 1
            seen[LINEAR] += 1
        elif kind in seen:
            ordinals.append(seen[kind])
            seen[kind] += 1
        else:
            ordinals.append(-1)
    return ordinals


class HybridLayer(nn.Module):
    """A decoder layer of one `kind`; `ordinal` indexes its kind's pool buffers (see `pool_ordinals`)."""

    def __init__(self, kind: str, ordinal: int) -> None:
        super().__init__()
        self.kind = kind
        self.ordinal = ordinal

    def recur(self, mixer: nn.Module, h: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """A recurrent mixer over this layer's conv and SSM state. A mixed step's decode rows (the last rows of
        `h`) take the mixer's decode step, the prompt chunks its extend: each state advances once."""
        conv, ssm = ctx.buffers.conv[self.ordinal], ctx.buffers.ssm[self.ordinal]
        tail = ctx.decode_tail
        if tail is None:
            return mixer(h, conv, ssm, ctx.packing, ctx.state_slots)
        chunks = mixer(h[: tail.first_token], conv, ssm, ctx.packing, ctx.state_slots)
        return torch.cat([chunks, mixer(h[tail.first_token :], conv, ssm, None, tail.state_slots)])

    def attend(self, mixer: nn.Module, h: torch.Tensor, cos_sin: CosSin, ctx: StepContext) -> torch.Tensor:
        """An attention mixer over this layer's KV pool."""
        return mixer(h, cos_sin, ctx, self.ordinal)

    def mix(self, mixer: nn.Module, h: torch.Tensor, cos_sin: CosSin, ctx: StepContext) -> torch.Tensor:
        """The mixer this layer's kind calls for: recurrent, attention, or a feed-forward block (no cache)."""
        if self.kind == LINEAR:
            return self.recur(mixer, h, ctx)
        if self.kind == FULL:
            return self.attend(mixer, h, cos_sin, ctx)
        return mixer(h)


class DecoderBody(nn.Module):
    """Embedding, layers and final norm under the checkpoint's own names (`embed_tokens`/`norm` by default)."""

    def __init__(
        self,
        embed: nn.Module,
        layers: Sequence[nn.Module],
        norm: nn.Module,
        *,
        embed_name: str = "embed_tokens",
        norm_name: str = "norm",
    ) -> None:
        super().__init__()
        self.embed_name, self.norm_name = embed_name, norm_name
        self.add_module(embed_name, embed)
        self.layers = nn.ModuleList(layers)
        self.add_module(norm_name, norm)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.embed_name)(input_ids)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.norm_name)(x)


class DecoderLM(HybridModel):
    """embed (× `embedding_multiplier`) → every layer(x, cos_sin, ctx) → final norm of the logit rows → lm_head
    → `scale_logits` → fp32. The body sits under `body_name` (`model`, or Nemotron-H's `backbone`)."""

    body_name = "model"

    def __init__(
        self,
        config: object,
        body: DecoderBody,
        *,
        layer_types: Sequence[str],
        kv_shape: tuple[int, int, int],
        hidden_size: int,
        vocab_size: int,
        rotary: RotaryEmbedding | None = None,
        embedding_multiplier: float = 1.0,
    ) -> None:
        super().__init__()
        self.config = config
        self.add_module(self.body_name, body)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)
        self.rotary = rotary
        self.layer_types = tuple(layer_types)
        self.kv_shape = kv_shape  # (KV heads, K head dim, V head dim) per token of an attention layer
        self.vocab_size = vocab_size
        self.embedding_multiplier = embedding_multiplier

    @property
    def body(self) -> DecoderBody:
        body = self._modules[self.body_name]
        assert isinstance(body, DecoderBody)
        return body

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Hook for muP logit scaling (Falcon-H1, Granite)."""
        return logits

    def layout(self) -> ModelLayout:
        attn, linear = cache_layer_ids(self.layer_types)
        # State shapes come from the mixer itself: one definition for allocation and for use.
        mixer: Any = next((m for m in self.modules() if hasattr(m, "conv_state_shape")), None)
        if mixer is None:
            raise ValueError(f"{type(self).__name__}: no recurrent layer; the bundled runtime serves hybrid models")
        return ModelLayout(
            num_layers=len(self.layer_types),
            attn_layer_ids=attn,
            linear_layer_ids=linear,
            num_kv_heads=self.kv_shape[0],
            head_dim=self.kv_shape[1],
            v_head_dim=self.kv_shape[2],
            conv_state_shape=mixer.conv_state_shape,
            ssm_state_shape=mixer.ssm_state_shape,
            vocab_size=self.vocab_size,
        )

    def forward_tokens(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        body = self.body
        x = body.embed(input_ids)
        if self.embedding_multiplier != 1.0:
            x = x * self.embedding_multiplier
        cos_sin = self.rotary.cos_sin(ctx.positions, x.dtype) if self.rotary is not None else None
        for layer in body.layers:
            x = layer(x, cos_sin, ctx)
        x = ctx.logit_rows(x)
        return self.scale_logits(self.lm_head(body.final_norm(x))).float()
