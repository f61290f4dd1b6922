"""What the native step's weight tables share across families (runtime/engine/native_decode.py for Qwen3-Next,
native_nemotron.py for Nemotron-H): the refusal a model outside the C step raises, and the attention block's
tensors."""

from __future__ import annotations

import torch
from torch import nn

from runtime.models.decoder import DecoderLM
from runtime.models.layers.norm import ZeroCenteredRMSNorm
from runtime.models.layers.rotary_attention import RotaryAttention
from runtime.native.decode_weights import AttentionWeights


class Unsupported(Exception):
    """The model (or an option) is outside what the native kernel computes; the message says what."""


def zero_centred(norm: nn.Module, name: str, eps: float) -> torch.Tensor:
    if type(norm) is not ZeroCenteredRMSNorm:
        raise Unsupported(f"{name} is {type(norm).__name__}, not a zero-centred RMSNorm")
    if norm.eps != eps:
        raise Unsupported(f"{name} has eps {norm.eps}, the model {eps}")
    return norm.scale(norm.weight)


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
