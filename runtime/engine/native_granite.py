"""The native step's weight table for Granite-4.0-H (runtime/models/granite_hybrid.py, `granitemoehybrid`): each
layer a Mamba2 or attention mixer (RoPE or none, `position_embedding_type`; the score scale is Granite's
attention_multiplier) and a feed-forward, the shared SwiGLU MLP alone (`num_local_experts` 0, the Micro
variant) or a top-k MoE of SwiGLU experts plus that MLP. The muP multipliers map onto the C model: the embedding's
onto embed_scale, residual_multiplier onto residual_scale (each mixer and feed-forward output times it before it
is added), logits_scaling onto logits_div. The router is Granite's own: the k largest logits, then a softmax over
those k (not a softmax over all experts renormalized: the same weights in exact arithmetic, other bits)."""

from __future__ import annotations

from runtime.engine.native_nemotron import mamba2_mixer
from runtime.engine.native_weights import Unsupported, attention_weights, model_weights, rms_norm_weight
from runtime.models.decoder import FULL, LINEAR
from runtime.models.granite_hybrid import GraniteDecoderLayer, GraniteHybridForCausalLM, GraniteMoE, SharedMLP
from runtime.native.decode_weights import (
    ATTENTION_KIND,
    MAMBA2_KIND,
    ROUTE_TOPK_SOFTMAX,
    AttentionWeights,
    DecodeWeights,
    FeedForwardWeights,
    LayerWeights,
)
from runtime.native.mamba2_weights import Mamba2Weights


def _feed_forward(layer: GraniteDecoderLayer, name: str) -> FeedForwardWeights:
    shared = layer.shared_mlp
    if type(shared) is not SharedMLP or shared.input_linear.bias is not None or shared.output_linear.bias is not None:
        raise Unsupported(f"{name}'s shared MLP is not a bias-free SwiGLU")
    inter = shared.output_linear.weight.shape[1]
    fused = shared.input_linear.weight  # [2I, H]: gate rows, then up rows (`chunk(2)`); row slices stay contiguous
    dense = FeedForwardWeights(mlp_gate=fused[:inter], mlp_up=fused[inter:], mlp_down=shared.output_linear.weight)
    moe = layer.block_sparse_moe
    if moe is None:
        return dense
    if type(moe) is not GraniteMoE:
        raise Unsupported(f"{name}'s MoE is {type(moe).__name__}")
    dense.experts, dense.top_k, dense.route = moe.num_experts, moe.top_k, ROUTE_TOPK_SOFTMAX
    dense.router = moe.router.layer.weight
    dense.gate_up, dense.down = moe.input_linear.weight, moe.output_linear.weight
    return dense


def granite_hybrid_weights(model: GraniteHybridForCausalLM) -> DecodeWeights:
    """The kernel's view of a Granite-4.0-H model's tensors (the caller has checked device, dtype and hooks)."""
    config = model.config
    eps = float(config.rms_norm_eps)
    body = model.body
    layers: list[LayerWeights] = []
    for i, layer in enumerate(body.layers):
        name = f"layer {i}"
        if type(layer) is not GraniteDecoderLayer:
            raise Unsupported(f"{name} is {type(layer).__name__}")
        if layer.residual_multiplier != config.residual_multiplier:
            raise Unsupported(f"{name}'s residual multiplier is not the model's")
        mixer: Mamba2Weights | AttentionWeights
        if layer.kind == LINEAR:
            mixer, code = mamba2_mixer(layer.mamba, eps, name), MAMBA2_KIND
        elif layer.kind == FULL:
            mixer, code = attention_weights(layer.self_attn, model, eps, name), ATTENTION_KIND
        else:
            raise Unsupported(f"{name} is of kind {layer.kind!r}")
        layers.append(
            LayerWeights(
                kind=code,
                ordinal=layer.ordinal,
                in_norm=rms_norm_weight(layer.input_layernorm, f"{name} input norm", eps),
                post_norm=rms_norm_weight(layer.post_attention_layernorm, f"{name} post norm", eps),
                mixer=mixer,
                ffn=_feed_forward(layer, name),
            )
        )
    return model_weights(
        model,
        layers,
        eps,
        rms_norm_weight,
        (ATTENTION_KIND,),
        (MAMBA2_KIND,),
        residual_scale=float(config.residual_multiplier),
        logits_div=float(config.logits_scaling),
    )
