"""The tensors of a hybrid LM's decode step as the C step reads them (hybrid_decode.c): the model's own parameter
storage, plus a few parameter-only derived tensors, grouped per layer. runtime/native/hybrid_decode.py checks each
one and lays it out in the C structs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.native.kda_weights import KDAWeights
from runtime.native.mamba2_weights import Mamba2Weights
from runtime.native.mla_weights import MLAWeights

# A layer's mixer (HDLayer.kind): LINEAR_KIND is the gated DeltaNet; NO_MIXER_KIND a feed-forward-only layer.
LINEAR_KIND, ATTENTION_KIND, MAMBA2_KIND, NO_MIXER_KIND = 0, 1, 2, 3
KDA_KIND = 4  # Kimi Delta Attention (hd_kda.h), on the linear layers' pools
MLA_KIND = 5  # Kimi-Linear's multi-head latent attention (hd_mla.h), on the attention layers' pools
PARALLEL_KIND = 6  # Falcon-H1: attention and Mamba2 side by side (ParallelWeights), then a SwiGLU MLP


@dataclass
class DeltaNetWeights:
    """A gated DeltaNet layer: projections with rows already in [q | k | v], [z], [b], [a] order."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    kernel: int
    qkv: torch.Tensor  # [2*nk*dk + nv*dv, H]
    z: torch.Tensor  # [nv*dv, H]
    b: torch.Tensor  # [nv, H]
    a: torch.Tensor  # [nv, H]
    conv: torch.Tensor  # [conv_dim, kernel]
    conv_bias: torch.Tensor | None
    neg_a: torch.Tensor  # [nv] -exp(A_log)
    dt_bias: torch.Tensor  # [nv]
    norm: torch.Tensor  # [dv] GatedRMSNorm weight
    out: torch.Tensor  # [H, nv*dv]


@dataclass
class AttentionWeights:
    """Gated full attention: q_proj emits [query | gate] per head when `output_gate`."""

    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    output_gate: bool
    scale: float
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    inv_freq: torch.Tensor | None  # [rotary_dim // 2]; None: no RoPE (rotary_dim 0)
    q_norm: torch.Tensor | None = None  # [head_dim], 1 + w
    k_norm: torch.Tensor | None = None
    biases: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # q, k, v, o


# HDLayer.gate_mode (hd_model.h): gate then RMS-normalise per group (Mamba2's), gate only, normalise then gate.
GATE_GROUP_NORM, GATE_ONLY, NORM_THEN_GATE = 0, 1, 2


@dataclass
class ParallelWeights:
    """x += mamba(h * ssm_in) * ssm_out + attention(h * attn_in) * attn_out (h the normed x), then the SwiGLU
    MLP with its gate output times mlp_gate and its output times mlp_down. `in_proj_mul`: fp32 [in_proj rows], each
    row's section multiplier (None: none); `key_mul`: the keys' multiplier before RoPE."""

    attention: AttentionWeights
    mamba: Mamba2Weights
    gate_mode: int
    attn_in: float = 1.0
    attn_out: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    key_mul: float = 1.0
    mlp_gate: float = 1.0
    mlp_down: float = 1.0
    in_proj_mul: torch.Tensor | None = None


# A MoE's routing (HDLayer.route in hd_model.h): softmax over all experts then top-k (Qwen3-Next), softmax over
# the top-k logits (Granite), sigmoid scores with a correction bias and group-limited top-k (Nemotron-H).
ROUTE_SOFTMAX, ROUTE_TOPK_SOFTMAX, ROUTE_SIGMOID_GROUPS = 0, 1, 2


@dataclass
class FeedForwardWeights:
    """A sparse MoE (`experts` > 0: router, stacked expert weights, an optional shared MLP and its gate) or
    a dense MLP (`experts` == 0: the mlp_* tensors; SwiGLU, or squared ReLU when `mlp_gate` is None)."""

    experts: int = 0
    top_k: int = 0
    norm_topk_prob: bool = True
    router: torch.Tensor | None = None  # [E, H]
    gate_up: torch.Tensor | None = None  # [E, 2I, H] (gate rows, then up rows); relu2_experts: [E, I, H] up rows
    down: torch.Tensor | None = None  # [E, H, I]
    mlp_gate: torch.Tensor | None = None  # [I, H]
    mlp_up: torch.Tensor | None = None  # [I, H]
    mlp_down: torch.Tensor | None = None  # [H, I]
    shared_gate: torch.Tensor | None = None  # [1, H]
    route: int = ROUTE_SOFTMAX
    relu2_experts: bool = False  # squared-ReLU experts (and shared expert) without gate rows
    groups: int = 1  # ROUTE_SIGMOID_GROUPS: n_group, topk_group, the score bias [E] and routed_scaling_factor
    top_groups: int = 1
    score_bias: torch.Tensor | None = None
    routed_scale: float = 1.0


@dataclass
class LayerWeights:
    """x += mixer(norm(x, in_norm)), then x += ffn(norm(x, post_norm)); a layer without a mixer (NO_MIXER_KIND,
    mixer and in_norm None) or without a feed-forward (ffn and post_norm None) skips that half."""

    kind: int  # LINEAR_KIND, ATTENTION_KIND, MAMBA2_KIND or NO_MIXER_KIND
    ordinal: int  # index into the pool lists of its kind
    in_norm: torch.Tensor | None  # [H] the norm's scale (Qwen3-Next: 1 + w)
    post_norm: torch.Tensor | None  # [H]
    mixer: DeltaNetWeights | AttentionWeights | Mamba2Weights | KDAWeights | MLAWeights | ParallelWeights | None
    ffn: FeedForwardWeights | None


@dataclass
class DecodeWeights:
    hidden: int
    vocab: int
    eps: float
    embed: torch.Tensor  # [V, H]
    final_norm: torch.Tensor  # [H], 1 + w
    lm_head: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    embed_scale: float = 1.0
    residual_scale: float = 1.0  # Granite's residual_multiplier
    logits_div: float = 1.0  # Granite's logits_scaling
    logits_mul: float = 1.0  # Falcon-H1's lm_head_multiplier
    attention_layers: int = 0
    linear_layers: int = 0
    kept: list[torch.Tensor] = field(default_factory=list)  # every tensor the structs point into

    @property
    def extends(self) -> bool:
        """Whether the C step runs an extend chain of this model (not over a KDA or MLA layer: decode rows only)."""
        return all(lw.kind not in (KDA_KIND, MLA_KIND) for lw in self.layers)
