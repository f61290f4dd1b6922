"""The native step's weight table for Falcon-H1 (runtime/models/falcon_h1.py, `falcon_h1`): every layer one
HD_PARALLEL layer of the C step (runtime/native/hd_parallel.h): attention (RoPE, keys times key_multiplier) and a
Mamba2 mixer side by side on the same normed input, each with its muP input and output multipliers, then the
SwiGLU MLP with its gate and down multipliers. The Mamba2 mixer's in_proj sections are scaled by
`ssm_multipliers` (a per-row fp32 vector, applied to the projection's output as torch does: folding it into the
weight would round otherwise), and its output is gated alone (`mamba_rms_norm` false) or through Falcon's grouped
gated RMSNorm, gate before or after the norm (`mamba_norm_before_gate`). The embedding multiplier is the C model's
embed_scale, lm_head_multiplier its logits_mul."""

from __future__ import annotations

import torch
from torch import nn

from runtime.engine.native_weights import Unsupported, attention_weights, model_weights, rms_norm_weight
from runtime.models.falcon_h1 import FalconH1DecoderLayer, FalconH1ForCausalLM, FalconH1MLP
from runtime.models.layers.mamba2 import Mamba2Mixer
from runtime.models.layers.norm import FalconGatedRMSNorm
from runtime.native.decode_weights import PARALLEL_KIND, DecodeWeights, FeedForwardWeights, LayerWeights
from runtime.native.mamba2_weights import Mamba2Weights
from runtime.native.parallel_weights import GATE_GROUP_NORM, GATE_ONLY, NORM_THEN_GATE, ParallelWeights


def _in_proj_multipliers(mixer: Mamba2Mixer) -> torch.Tensor | None:
    """Each in_proj row's multiplier, fp32 (the gate, x, B, C and dt sections' `ssm_multipliers`), as torch's
    `_mup_vector` builds it for fp32 activations."""
    if mixer.proj_multipliers is None:
        return None
    gs = mixer.n_groups * mixer.state_size
    sizes = (mixer.intermediate, mixer.intermediate, gs, gs, mixer.num_heads)
    if len(mixer.proj_multipliers) != len(sizes):
        raise Unsupported("the Mamba2 mixer's projection multipliers are not one per in_proj section")
    return torch.cat([torch.full((n,), m) for n, m in zip(sizes, mixer.proj_multipliers, strict=True)]).float()


def _mamba(mixer: nn.Module, eps: float, name: str) -> tuple[Mamba2Weights, int]:
    if type(mixer) is not Mamba2Mixer:
        raise Unsupported(f"{name}'s Mamba2 mixer is {type(mixer).__name__}")
    norm = mixer.norm
    if mixer.gated_norm == "gate_only" and norm is None:
        mode, weight = GATE_ONLY, None
    elif mixer.gated_norm in ("gate_then_norm", "norm_then_gate") and type(norm) is FalconGatedRMSNorm:
        if norm.n_groups != mixer.n_groups or norm.eps != eps:
            raise Unsupported(f"{name}'s gated norm groups are not the B/C groups, or its eps is not the model's")
        if norm.norm_before_gate != (mixer.gated_norm == "norm_then_gate"):
            raise Unsupported(f"{name}'s gated norm gates on the other side of its norm than its mixer says")
        mode, weight = (NORM_THEN_GATE if norm.norm_before_gate else GATE_GROUP_NORM), norm.weight
    else:
        raise Unsupported(f"{name}'s Mamba2 output gating {mixer.gated_norm!r} is not Falcon-H1's")
    weights = Mamba2Weights(
        heads=mixer.num_heads,
        head_dim=mixer.head_dim,
        state_size=mixer.state_size,
        groups=mixer.n_groups,
        kernel=mixer.conv1d.kernel_size[0],
        in_proj=mixer.in_proj.weight,
        conv=mixer.conv_taps(),
        neg_a=mixer.decay_rate(),
        dt_bias=mixer.dt_bias,
        d_skip=mixer.D,
        dt_limit=(mixer.dt_min, mixer.dt_max),
        norm=weight,
        out=mixer.out_proj.weight,
        in_bias=mixer.in_proj.bias,
        conv_bias=mixer.conv1d.bias,
        out_bias=mixer.out_proj.bias,
    )
    return weights, mode


def _mlp(mlp: nn.Module, name: str) -> FeedForwardWeights:
    if type(mlp) is not FalconH1MLP:
        raise Unsupported(f"{name}'s MLP is {type(mlp).__name__}")
    if any(p.bias is not None for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)):
        raise Unsupported(f"{name}'s MLP has biases (mlp_bias): not in the C step")
    return FeedForwardWeights(mlp_gate=mlp.gate_proj.weight, mlp_up=mlp.up_proj.weight, mlp_down=mlp.down_proj.weight)


def falcon_h1_weights(model: FalconH1ForCausalLM) -> DecodeWeights:
    """The kernel's view of a Falcon-H1 model's tensors (the caller has checked device, dtype and hooks)."""
    config = model.config
    eps = float(config.rms_norm_eps)
    body = model.body
    layers: list[LayerWeights] = []
    for i, layer in enumerate(body.layers):
        name = f"layer {i}"
        if type(layer) is not FalconH1DecoderLayer:
            raise Unsupported(f"{name} is {type(layer).__name__}")
        c = layer.c
        mamba, mode = _mamba(layer.mamba, eps, name)
        attention = attention_weights(layer.self_attn, model, eps, name, scaled_keys=True)
        if attention.rotary_dim == 0:
            raise Unsupported(f"{name}: Falcon-H1's attention without RoPE")
        mlp = layer.feed_forward
        parallel = ParallelWeights(
            attention=attention,
            mamba=mamba,
            gate_mode=mode,
            attn_in=float(c.attention_in_multiplier),
            attn_out=float(c.attention_out_multiplier),
            ssm_in=float(layer.mamba.in_multiplier),
            ssm_out=float(c.ssm_out_multiplier),
            key_mul=float(layer.self_attn.key_multiplier),
            mlp_gate=float(mlp.gate_multiplier),
            mlp_down=float(mlp.down_multiplier),
            in_proj_mul=_in_proj_multipliers(layer.mamba),
        )
        layers.append(
            LayerWeights(
                kind=PARALLEL_KIND,
                ordinal=layer.ordinal,
                in_norm=rms_norm_weight(layer.input_layernorm, f"{name} input norm", eps),
                post_norm=rms_norm_weight(layer.pre_ff_layernorm, f"{name} pre-feed-forward norm", eps),
                mixer=parallel,
                ffn=_mlp(mlp, name),
            )
        )
    return model_weights(
        model,
        layers,
        eps,
        rms_norm_weight,
        (PARALLEL_KIND,),
        (PARALLEL_KIND,),
        logits_mul=float(config.lm_head_multiplier),
    )
