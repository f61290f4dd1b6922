"""The native step's weight table for Nemotron-H (runtime/models/nemotron_h.py): single-mixer blocks, each
`x + mixer(norm(x))`, laid out as the C step's layers (hybrid_decode.c): a Mamba2 block is a Mamba2 mixer with no
feed-forward, an attention block (no RoPE) an attention mixer with none, an MLP block a squared-ReLU feed-forward
with no mixer (its norm is the feed-forward's), and so is a MoE block (Nemotron 3: sigmoid routing over expert
groups, squared-ReLU experts and shared expert); one with latent expert projections keeps the torch decode.

Granite-4.0-H reuses the Mamba2 mixer's table (runtime/engine/native_granite.py); Falcon-H1's mixer scales its
projection sections and gates its norm otherwise: runtime/engine/native_falcon.py builds its own."""

from __future__ import annotations

import torch
from torch import nn

from runtime.engine.native_weights import Unsupported, attention_weights, model_weights, rms_norm_weight
from runtime.models.decoder import FULL, LINEAR
from runtime.models.layers.mamba2 import Mamba2Mixer
from runtime.models.layers.mlp import Relu2MLP
from runtime.models.layers.norm import GroupedGatedRMSNorm
from runtime.models.layers.sigmoid_moe import GroupTopKRouter, Relu2Experts, SigmoidMoE
from runtime.models.nemotron_h import NemotronHBlock, NemotronHForCausalLM
from runtime.native.decode_weights import (
    ATTENTION_KIND,
    MAMBA2_KIND,
    NO_MIXER_KIND,
    ROUTE_SIGMOID_GROUPS,
    DecodeWeights,
    FeedForwardWeights,
    LayerWeights,
)
from runtime.native.ffn_weights import MAX_GROUPS
from runtime.native.mamba2_weights import Mamba2Weights


def _norm(norm: nn.Module, name: str, eps: float) -> torch.Tensor:
    """Nemotron-H's norms multiply by their weight in fp32, as the C norm does."""
    return rms_norm_weight(norm, name, eps, fp32_product=True)


def mamba2_mixer(mixer: nn.Module, eps: float, name: str) -> Mamba2Weights:
    if type(mixer) is not Mamba2Mixer:
        raise Unsupported(f"{name} is {type(mixer).__name__}")
    if mixer.in_multiplier != 1.0 or mixer.proj_multipliers is not None:
        raise Unsupported(f"{name} scales its input or projection (muP multipliers)")
    norm = mixer.norm
    if mixer.gated_norm != "mamba2" or type(norm) is not GroupedGatedRMSNorm:
        raise Unsupported(f"{name}'s output norm is not Mamba2's grouped gated RMSNorm")
    if norm.group_size * mixer.n_groups != mixer.intermediate or norm.eps != eps:
        raise Unsupported(f"{name}'s gated norm groups are not the B/C groups, or its eps is not the model's")
    return Mamba2Weights(
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
        norm=norm.weight,
        out=mixer.out_proj.weight,
        in_bias=mixer.in_proj.bias,
        conv_bias=mixer.conv1d.bias,
        out_bias=mixer.out_proj.bias,
    )


def _moe(moe: SigmoidMoE, name: str) -> FeedForwardWeights:
    """Nemotron 3's MoE block: sigmoid scores, the choice shifted by e_score_correction_bias and limited to the
    best expert groups, weights renormalized (norm_topk_prob) and scaled (routed_scaling_factor); squared-ReLU
    experts and shared expert."""
    if moe.fc1_latent_proj is not None or moe.fc2_latent_proj is not None:
        raise Unsupported(f"{name}'s experts run in a latent space (moe_latent_size): not in the C step")
    gate, experts, shared = moe.gate, moe.experts, moe.shared_experts
    if type(gate) is not GroupTopKRouter or type(experts) is not Relu2Experts or type(shared) is not Relu2MLP:
        raise Unsupported(f"{name}'s router, experts or shared expert is of another kind")
    if shared.up_proj.bias is not None or shared.down_proj.bias is not None:
        raise Unsupported(f"{name}'s shared expert has biases")
    if gate.num_experts % gate.n_group or gate.n_group > MAX_GROUPS:
        raise Unsupported(f"{name}: {gate.num_experts} experts in {gate.n_group} groups")
    return FeedForwardWeights(
        experts=gate.num_experts,
        top_k=gate.top_k,
        norm_topk_prob=gate.norm_topk_prob,
        router=gate.weight,
        gate_up=experts.up_proj,
        down=experts.down_proj,
        mlp_up=shared.up_proj.weight,
        mlp_down=shared.down_proj.weight,
        route=ROUTE_SIGMOID_GROUPS,
        relu2_experts=True,
        groups=gate.n_group,
        top_groups=gate.topk_group,
        score_bias=gate.e_score_correction_bias,
        routed_scale=float(gate.scaling),
    )


def _block(block: nn.Module, model: NemotronHForCausalLM, eps: float, name: str) -> LayerWeights:
    if not isinstance(block, NemotronHBlock):
        raise Unsupported(f"{name} is {type(block).__name__}")
    norm = _norm(block.norm, f"{name} norm", eps)
    if block.kind == LINEAR:
        mixer = mamba2_mixer(block.mixer, eps, name)
        return LayerWeights(MAMBA2_KIND, block.ordinal, norm, None, mixer, None)
    if block.kind == FULL:
        attention = attention_weights(block.mixer, model, eps, name)
        return LayerWeights(ATTENTION_KIND, block.ordinal, norm, None, attention, None)
    mlp = block.mixer
    if type(mlp) is SigmoidMoE:
        return LayerWeights(NO_MIXER_KIND, block.ordinal, None, norm, None, _moe(mlp, name))
    if type(mlp) is not Relu2MLP:
        raise Unsupported(f"{name} is a {block.kind} block ({type(mlp).__name__}): the C step runs dense MLPs only")
    if mlp.up_proj.bias is not None or mlp.down_proj.bias is not None:
        raise Unsupported(f"{name}'s MLP has biases")
    ffn = FeedForwardWeights(mlp_up=mlp.up_proj.weight, mlp_down=mlp.down_proj.weight)
    return LayerWeights(NO_MIXER_KIND, block.ordinal, None, norm, None, ffn)


def nemotron_h_weights(model: NemotronHForCausalLM) -> DecodeWeights:
    """The kernel's view of a Nemotron-H model's tensors (the caller has checked device, dtype and hooks)."""
    eps = float(model.config.layer_norm_epsilon)
    body = model.body
    layers = [_block(block, model, eps, f"layer {i}") for i, block in enumerate(body.layers)]
    return model_weights(model, layers, eps, _norm, (ATTENTION_KIND,), (MAMBA2_KIND,))
