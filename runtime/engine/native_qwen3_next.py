"""The native step's weight table for the Qwen3-Next family (runtime/models/qwen3_next.py: qwen3_next, qwen3_5,
qwen3_5_moe): Gated DeltaNet and gated attention layers, each with a dense SwiGLU or a sparse MoE with an optional
sigmoid-gated shared expert, zero-centred RMSNorms throughout."""

from __future__ import annotations

from torch import nn

from runtime.engine.native_weights import Unsupported, attention_weights, model_weights, zero_centred
from runtime.models.decoder import FULL, LINEAR
from runtime.models.layers.gated_deltanet import GatedDeltaNet
from runtime.models.layers.mlp import GatedMLP
from runtime.models.layers.moe import SparseMoE
from runtime.models.layers.norm import GatedRMSNorm
from runtime.models.qwen3_next import Qwen3NextDecoderLayer, Qwen3NextForCausalLM
from runtime.native.decode_weights import (
    ATTENTION_KIND,
    LINEAR_KIND,
    AttentionWeights,
    DecodeWeights,
    DeltaNetWeights,
    FeedForwardWeights,
    LayerWeights,
)


def _deltanet(mixer: nn.Module, eps: float, name: str) -> DeltaNetWeights:
    if type(mixer) is not GatedDeltaNet:
        raise Unsupported(f"{name} is {type(mixer).__name__}")
    rows = mixer.decode_rows()
    if rows is None:
        raise Unsupported(f"{name}'s fused projections are not de-interleaved (weights not loaded)")
    if type(mixer.norm) is not GatedRMSNorm or mixer.norm.eps != eps:
        raise Unsupported(f"{name}'s output norm is not a GatedRMSNorm with the model's eps")
    qkv, z, b, a = rows
    return DeltaNetWeights(
        num_k_heads=mixer.num_k_heads,
        num_v_heads=mixer.num_v_heads,
        k_head_dim=mixer.k_head_dim,
        v_head_dim=mixer.v_head_dim,
        kernel=mixer.conv1d.kernel_size[0],
        qkv=qkv,
        z=z,
        b=b,
        a=a,
        conv=mixer.conv_taps(),
        conv_bias=mixer.conv1d.bias,
        neg_a=mixer.decay_rate(),
        dt_bias=mixer.dt_bias,
        norm=mixer.norm.weight,
        out=mixer.out_proj.weight,
    )


def _feed_forward(mlp: nn.Module, name: str) -> FeedForwardWeights:
    if type(mlp) is GatedMLP:
        return FeedForwardWeights(
            mlp_gate=mlp.gate_proj.weight, mlp_up=mlp.up_proj.weight, mlp_down=mlp.down_proj.weight
        )
    if type(mlp) is not SparseMoE:
        raise Unsupported(f"{name} is {type(mlp).__name__}")
    shared = mlp.shared_expert
    if shared is not None and type(shared) is not GatedMLP:
        raise Unsupported(f"{name}'s shared expert is {type(shared).__name__}")
    return FeedForwardWeights(
        experts=mlp.experts.num_experts,
        top_k=mlp.gate.top_k,
        norm_topk_prob=mlp.gate.norm_topk_prob,
        router=mlp.gate.weight,
        gate_up=mlp.experts.gate_up_proj,
        down=mlp.experts.down_proj,
        mlp_gate=shared.gate_proj.weight if shared is not None else None,
        mlp_up=shared.up_proj.weight if shared is not None else None,
        mlp_down=shared.down_proj.weight if shared is not None else None,
        shared_gate=mlp.shared_expert_gate.weight if mlp.shared_expert_gate is not None else None,
    )


def qwen3_next_weights(model: Qwen3NextForCausalLM, layer_class: type[Qwen3NextDecoderLayer]) -> DecodeWeights:
    """The Qwen3-Next family's table: Gated DeltaNet and gated attention layers, each with a (sparse) MoE."""
    config = model.config
    eps = float(config.rms_norm_eps)
    body = model.body
    layers: list[LayerWeights] = []
    for i, layer in enumerate(body.layers):
        name = f"layer {i}"
        if not isinstance(layer, layer_class):
            raise Unsupported(f"{name} is {type(layer).__name__}")
        kind = getattr(layer, "kind", None)
        if kind == LINEAR:
            mixer: DeltaNetWeights | AttentionWeights = _deltanet(layer.linear_attn, eps, name)
            code = LINEAR_KIND
        elif kind == FULL:
            mixer = attention_weights(layer.self_attn, model, eps, name)
            code = ATTENTION_KIND
        else:
            raise Unsupported(f"{name} is of kind {kind!r}")
        layers.append(
            LayerWeights(
                kind=code,
                ordinal=layer.ordinal,
                in_norm=zero_centred(layer.input_layernorm, f"{name} input norm", eps),
                post_norm=zero_centred(layer.post_attention_layernorm, f"{name} post norm", eps),
                mixer=mixer,
                ffn=_feed_forward(layer.mlp, f"{name} mlp"),
            )
        )
    return model_weights(model, layers, eps, zero_centred, (ATTENTION_KIND,), (LINEAR_KIND,))
