"""The native step's weight table for Kimi-Linear (runtime/models/kimi_linear.py): KDA layers (hd_kda.h: the gated
delta rule with a per-channel decay), MLA layers (hd_mla.h: multi-head latent attention without positional
encoding over the pools' cached latents, kv_b_proj absorbed), SwiGLU dense MLPs, and the DeepSeek-style MoE
(sigmoid routing with the correction bias over expert groups, renormalized and scaled weights, SwiGLU experts plus
the shared experts as one SwiGLU MLP: hd_ffn.h's ROUTE_SIGMOID_GROUPS). Decode rows only: its extends stay
torch's."""

from __future__ import annotations

from torch import nn

from runtime.engine.native_weights import Unsupported, model_weights, rms_norm_weight
from runtime.models.decoder import FULL, LINEAR
from runtime.models.kimi_linear import (
    KimiDecoderLayer,
    KimiDeltaAttention,
    KimiLinearForCausalLM,
    KimiMLA,
    KimiSparseMoE,
)
from runtime.models.layers.derived import depthwise_taps, neg_exp
from runtime.models.layers.mlp import GatedMLP
from runtime.models.layers.moe import Experts
from runtime.models.layers.norm import RMSNorm
from runtime.models.layers.sigmoid_moe import GroupTopKRouter
from runtime.native.decode_weights import (
    KDA_KIND,
    MLA_KIND,
    ROUTE_SIGMOID_GROUPS,
    DecodeWeights,
    FeedForwardWeights,
    LayerWeights,
)
from runtime.native.ffn_weights import MAX_GROUPS
from runtime.native.kda_weights import KDAWeights
from runtime.native.mla_weights import MLAWeights


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


def _mla(mixer: nn.Module, name: str) -> MLAWeights:
    if type(mixer) is not KimiMLA:
        raise Unsupported(f"{name} is {type(mixer).__name__}")
    kv_norm, eps = mixer.kv_a_layernorm, mixer.kv_a_layernorm.eps
    q_norm = getattr(mixer, "q_a_layernorm", None)
    if type(kv_norm) is not RMSNorm or (q_norm is not None and (type(q_norm) is not RMSNorm or q_norm.eps != eps)):
        raise Unsupported(f"{name}'s latent norms are not RMSNorms of one eps")
    heads, nope, v_dim, lora = mixer.heads, mixer.nope, mixer.v_dim, mixer.lora
    kv_b = mixer.kv_b_proj.weight
    k_t = kv_b.detach().view(heads, nope + v_dim, lora)[:, :nope].transpose(1, 2).contiguous()
    q_a = getattr(mixer, "q_a_proj", None)
    return MLAWeights(
        heads=heads,
        nope=nope,
        rope=mixer.rope,
        v_dim=v_dim,
        lora=lora,
        scale=float(mixer.scale),
        kv_a=mixer.kv_a_proj_with_mqa.weight,
        kv_norm=kv_norm.weight,
        kv_b=kv_b,
        k_t=k_t,
        o=mixer.o_proj.weight,
        norm_eps=float(eps),
        q=mixer.q_proj.weight if q_a is None else None,
        q_a=q_a.weight if q_a is not None else None,
        q_norm=q_norm.weight if q_norm is not None else None,
        q_b=mixer.q_b_proj.weight if q_a is not None else None,
        q_a_bias=q_a.bias if q_a is not None else None,
        kv_a_bias=mixer.kv_a_proj_with_mqa.bias,
        o_bias=mixer.o_proj.bias,
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
        mixer: KDAWeights | MLAWeights
        if layer.kind == LINEAR:
            mixer, code = _kda(layer.self_attn, eps, name), KDA_KIND
        elif layer.kind == FULL:
            mixer, code = _mla(layer.self_attn, name), MLA_KIND
        else:
            raise Unsupported(f"{name} is of kind {layer.kind!r}")
        layers.append(
            LayerWeights(
                kind=code,
                ordinal=layer.ordinal,
                in_norm=rms_norm_weight(layer.input_layernorm, f"{name} input norm", eps),
                post_norm=rms_norm_weight(layer.post_attention_layernorm, f"{name} post norm", eps),
                mixer=mixer,
                ffn=_moe(layer.block_sparse_moe, f"{name} feed-forward"),
            )
        )
    return model_weights(model, layers, eps, rms_norm_weight, (MLA_KIND,), (KDA_KIND,))
