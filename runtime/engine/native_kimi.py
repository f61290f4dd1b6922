"""The native step's weight table for Kimi-Linear (runtime/models/kimi_linear.py): KDA layers (hd_kda.h: the gated
delta rule with a per-channel decay, decode rows only; its extends stay torch's), SwiGLU dense MLPs, and the
DeepSeek-style MoE (sigmoid routing with the correction bias over expert groups, renormalized and scaled weights,
SwiGLU experts plus the shared experts as one SwiGLU MLP: hd_ffn.h's ROUTE_SIGMOID_GROUPS). The MLA layers
(multi-head latent attention over the cached latent) are not in the C step: a model with any keeps the torch
decode, with that reason."""

from __future__ import annotations

from torch import nn

from runtime.engine.native_granite import _norm
from runtime.engine.native_weights import Unsupported
from runtime.models.decoder import LINEAR
from runtime.models.kimi_linear import KimiDecoderLayer, KimiDeltaAttention, KimiLinearForCausalLM, KimiSparseMoE
from runtime.models.layers.derived import depthwise_taps, neg_exp
from runtime.models.layers.mlp import GatedMLP
from runtime.models.layers.moe import Experts
from runtime.models.layers.norm import RMSNorm
from runtime.models.layers.sigmoid_moe import GroupTopKRouter
from runtime.native.decode_weights import (
    KDA_KIND,
    ROUTE_SIGMOID_GROUPS,
    DecodeWeights,
    FeedForwardWeights,
    LayerWeights,
)
from runtime.native.ffn_weights import MAX_GROUPS
from runtime.native.kda_weights import KDAWeights


def _kda(mixer: nn.Module, eps: float, name: str) -> KDAWeights:
    if type(mixer) is not KimiDeltaAttention:
        raise Unsupported(f"{name} is {type(mixer).__name__}")
    norm = mixer.o_norm
    if type(norm) is not RMSNorm or norm.eps != eps:
        raise Unsupported(f"{name}'s o_norm is not an RMSNorm with the model's eps")
    if mixer.conv1d.bias is not None:
        raise Unsupported(f"{name}'s short convolutions have biases")
    heads, dk = mixer.heads, mixer.head_dim
    return KDAWeights(
        heads=heads,
        head_dim=dk,
        kernel=mixer.conv1d.kernel_size[0],
        q=mixer.q_proj.weight,
        k=mixer.k_proj.weight,
        v=mixer.v_proj.weight,
        conv=depthwise_taps(mixer.conv1d.weight),
        f_a=mixer.f_a_proj.weight,
        f_b=mixer.f_b_proj.weight,
        g_a=mixer.g_a_proj.weight,
        g_b=mixer.g_b_proj.weight,
        b=mixer.b_proj.weight,
        neg_a=neg_exp(mixer.A_log).reshape(heads).contiguous(),
        dt_bias=mixer.dt_bias,
        norm=norm.weight,
        out=mixer.o_proj.weight,
    )


def _mlp(mlp: nn.Module, name: str) -> FeedForwardWeights:
    if type(mlp) is not GatedMLP or any(p.bias is not None for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)):
        raise Unsupported(f"{name} is not a bias-free SwiGLU MLP")
    return FeedForwardWeights(mlp_gate=mlp.gate_proj.weight, mlp_up=mlp.up_proj.weight, mlp_down=mlp.down_proj.weight)


def _moe(moe: nn.Module, name: str) -> FeedForwardWeights:
    if type(moe) is not KimiSparseMoE:
        return _mlp(moe, name)
    gate, experts = moe.gate, moe.experts
    if type(gate) is not GroupTopKRouter or type(experts) is not Experts:
        raise Unsupported(f"{name}'s router or experts are of another kind")
    if gate.num_experts % gate.n_group or gate.n_group > MAX_GROUPS:
        raise Unsupported(f"{name}: {gate.num_experts} experts in {gate.n_group} groups")
    f = _mlp(moe.shared_experts, f"{name} shared experts")
    f.experts, f.top_k, f.norm_topk_prob, f.router = gate.num_experts, gate.top_k, gate.norm_topk_prob, gate.weight
    f.gate_up, f.down, f.route = experts.gate_up_proj, experts.down_proj, ROUTE_SIGMOID_GROUPS
    f.groups, f.top_groups = gate.n_group, gate.topk_group
    f.score_bias, f.routed_scale = gate.e_score_correction_bias, float(gate.scaling)
    return f


def kimi_linear_weights(model: KimiLinearForCausalLM) -> DecodeWeights:
    """The kernel's view of a Kimi-Linear model's tensors (the caller has checked device, dtype and hooks)."""
    eps = float(model.config.rms_norm_eps)
    body = model.body
    layers: list[LayerWeights] = []
    for i, layer in enumerate(body.layers):
        name = f"layer {i}"
        if type(layer) is not KimiDecoderLayer:
            raise Unsupported(f"{name} is {type(layer).__name__}")
        if layer.kind != LINEAR:
            raise Unsupported(f"{name} is multi-head latent attention (MLA): not in the C step")
        layers.append(
            LayerWeights(
                kind=KDA_KIND,
                ordinal=layer.ordinal,
                in_norm=_norm(layer.input_layernorm, f"{name} input norm", eps),
                post_norm=_norm(layer.post_attention_layernorm, f"{name} post norm", eps),
                mixer=_kda(layer.self_attn, eps, name),
                ffn=_moe(layer.block_sparse_moe, f"{name} feed-forward"),
            )
        )
    embed = getattr(body, body.embed_name)
    if type(embed) is not nn.Embedding:
        raise Unsupported(f"the embedding is {type(embed).__name__}")
    return DecodeWeights(
        hidden=embed.embedding_dim,
        vocab=model.vocab_size,
        eps=eps,
        embed=embed.weight,
        final_norm=_norm(getattr(body, body.norm_name), "final norm", eps),
        lm_head=model.lm_head.weight,
        layers=layers,
        embed_scale=float(model.embedding_multiplier),
        linear_layers=len(layers),
    )
