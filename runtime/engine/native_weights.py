"""What the native step's weight tables share across families (runtime/engine/native_decode.py for Qwen3-Next,
native_nemotron.py, native_granite.py, native_falcon.py, native_kimi.py): the refusal a model outside the C step
raises, the norms, the attention block's tensors and the model-wide table around the layers."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from runtime.models.decoder import DecoderLM
from runtime.models.layers.norm import RMSNorm, ZeroCenteredRMSNorm
from runtime.models.layers.rotary_attention import RotaryAttention
from runtime.native.decode_weights import AttentionWeights, DecodeWeights, LayerWeights


class Unsupported(Exception):
    """The model (or an option) is outside what the native kernel computes; the message says what."""


def zero_centred(norm: nn.Module, name: str, eps: float) -> torch.Tensor:
    if type(norm) is not ZeroCenteredRMSNorm:
        raise Unsupported(f"{name} is {type(norm).__name__}, not a zero-centred RMSNorm")
    if norm.eps != eps:
        raise Unsupported(f"{name} has eps {norm.eps}, the model {eps}")
    return norm.scale(norm.weight)


def rms_norm_weight(norm: nn.Module, name: str, eps: float, *, fp32_product: bool = False) -> torch.Tensor:
    """A plain RMSNorm's weight: the C norm multiplies by it in fp32. `fp32_product`: the family's torch norm does so
    too (`weight_in_fp32`); a family that multiplies after the downcast (Granite, Falcon-H1, Kimi-Linear) computes
    the same product in fp32, as the C step's activations are fp32 whatever the weights' dtype."""
    if type(norm) is not RMSNorm:
        raise Unsupported(f"{name} is {type(norm).__name__}, not an RMSNorm")
    if fp32_product and not norm.weight_in_fp32:
        raise Unsupported(f"{name} applies its weight after the downcast, not in fp32")
    if norm.eps != eps:
        raise Unsupported(f"{name} has eps {norm.eps}, the model {eps}")
    return norm.weight


def model_weights(
    model: DecoderLM,
    layers: list[LayerWeights],
    eps: float,
    norm_weight: Callable[[nn.Module, str, float], torch.Tensor],
    kv_kinds: tuple[int, ...],
    state_kinds: tuple[int, ...],
    *,
    residual_scale: float = 1.0,
    logits_div: float = 1.0,
    logits_mul: float = 1.0,
) -> DecodeWeights:
    """The table around `layers`: embedding, final norm (read by `norm_weight`), lm_head; `kv_kinds` / `state_kinds`
    the layer kinds that hold KV-pool / state-pool layers (a Falcon-H1 layer both); the rest the model-wide muP
    factors."""
    body = model.body
    embed = getattr(body, body.embed_name)
    if type(embed) is not nn.Embedding:
        raise Unsupported(f"the embedding is {type(embed).__name__}")
    return DecodeWeights(
        hidden=embed.embedding_dim,
        vocab=model.vocab_size,
        eps=eps,
        embed=embed.weight,
        final_norm=norm_weight(getattr(body, body.norm_name), "final norm", eps),
        lm_head=model.lm_head.weight,
        layers=layers,
        embed_scale=float(model.embedding_multiplier),
        attention_layers=sum(1 for lw in layers if lw.kind in kv_kinds),
        linear_layers=sum(1 for lw in layers if lw.kind in state_kinds),
        residual_scale=residual_scale,
        logits_div=logits_div,
        logits_mul=logits_mul,
    )


def attention_weights(
    mixer: nn.Module, model: DecoderLM, eps: float, name: str, *, scaled_keys: bool = False
) -> AttentionWeights:
    """A RotaryAttention block's tensors; a model without RoPE (Nemotron-H) gets rotary dim 0. `scaled_keys`: the
    caller passes the key multiplier on (Falcon-H1's HDLayer.key_mul), else a block that scales its keys declines."""
    if type(mixer) is not RotaryAttention:
        raise Unsupported(f"{name} is {type(mixer).__name__}")
    if mixer.key_multiplier != 1.0 and not scaled_keys:
        raise Unsupported(f"{name} scales its keys")
    rotary = model.rotary
    if rotary is not None and rotary.head_dim != mixer.head_dim:
        raise Unsupported(f"{name}: RoPE head dim {rotary.head_dim} != attention head dim {mixer.head_dim}")
    norms = (mixer.q_norm, mixer.k_norm)
    if (norms[0] is None) != (norms[1] is None):
        raise Unsupported(f"{name} normalizes only one of q and k")
    q_norm = zero_centred(norms[0], f"{name} q_norm", eps) if norms[0] is not None else None
    k_norm = zero_centred(norms[1], f"{name} k_norm", eps) if norms[1] is not None else None
    projections = (mixer.q_proj, mixer.k_proj, mixer.v_proj, mixer.o_proj)
    biases = [p.bias for p in projections]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        raise Unsupported(f"{name} has biases on only some projections")
    return AttentionWeights(
        heads=mixer.num_heads,
        kv_heads=mixer.num_kv_heads,
        head_dim=mixer.head_dim,
        rotary_dim=rotary.rotary_dim if rotary is not None else 0,
        output_gate=mixer.output_gate,
        scale=float(mixer.scale),
        q=mixer.q_proj.weight,
        k=mixer.k_proj.weight,
        v=mixer.v_proj.weight,
        o=mixer.o_proj.weight,
        inv_freq=rotary.inv_freq(torch.device("cpu")) if rotary is not None else None,
        q_norm=q_norm,
        k_norm=k_norm,
        biases=None if biases[0] is None else (biases[0], biases[1], biases[2], biases[3]),
    )
