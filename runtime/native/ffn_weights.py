"""A layer's feed-forward as the native step reads it (hd_ffn.h): its checked place in the C layer struct
(runtime/native/hybrid_decode.py fills the rest of it). A sparse MoE (SwiGLU or squared-ReLU experts, one of three
routings, an optional shared MLP with an optional sigmoid gate) or a dense MLP (SwiGLU or squared ReLU)."""

from __future__ import annotations

import ctypes

from runtime.native.decode_weights import ROUTE_SIGMOID_GROUPS, ROUTE_SOFTMAX, ROUTE_TOPK_SOFTMAX, FeedForwardWeights
from runtime.native.mamba2_weights import Mat, Ptr

MAX_GROUPS = 64  # hd_ffn.h's route keeps the group scores on the stack


def fill_ffn(c: ctypes.Structure, f: FeedForwardWeights, h: int, name: str, mat: Mat, ptr: Ptr) -> None:
    """Set layer struct `c`'s feed-forward fields from `f` through the kernel's checked converters (`mat`: a weight
    matrix read in place; `ptr`: a small fp32 vector); ValueError for a combination the C step does not run."""
    if f.experts > 0:
        if f.router is None or f.gate_up is None or f.down is None or not 0 < f.top_k <= f.experts:
            raise ValueError(f"{name}: a MoE block without router or expert weights, or top_k out of range")
        if f.route not in (ROUTE_SOFTMAX, ROUTE_TOPK_SOFTMAX, ROUTE_SIGMOID_GROUPS):
            raise ValueError(f"{name}: routing {f.route} is not one the kernel computes")
        if f.route == ROUTE_SIGMOID_GROUPS:
            g, tg = f.groups, f.top_groups
            if not (0 < g <= MAX_GROUPS and f.experts % g == 0 and 0 < tg <= g and tg * (f.experts // g) >= f.top_k):
                raise ValueError(f"{name}: {f.experts} experts in {g} groups, top {tg} groups, top {f.top_k}")
            c.n_group, c.topk_group, c.routed_scale = g, tg, float(f.routed_scale)
            c.score_bias = ptr(f.score_bias, (f.experts,), f"{name} score correction bias")
        inter = f.down.shape[-1]
        c.n_exp, c.top_k, c.exp_inter, c.norm_topk = f.experts, f.top_k, inter, f.norm_topk_prob
        c.route, c.exp_relu2 = f.route, int(f.relu2_experts)
        c.router = mat(f.router, (f.experts, h), f"{name} router")
        rows = inter if f.relu2_experts else 2 * inter
        c.exp_gate_up = mat(f.gate_up, (f.experts, rows, h), f"{name} experts gate_up")
        c.exp_down = mat(f.down, (f.experts, h, inter), f"{name} experts down")
        c.shared_gate = mat(f.shared_gate, (1, h), f"{name} shared expert gate")
    if f.mlp_down is not None:
        inter = f.mlp_down.shape[-1]
        c.mlp_inter = inter
        c.mlp_gate = mat(f.mlp_gate, (inter, h), f"{name} mlp gate")
        c.mlp_up = mat(f.mlp_up, (inter, h), f"{name} mlp up")
        c.mlp_down = mat(f.mlp_down, (h, inter), f"{name} mlp down")
        # No gate: a squared-ReLU MLP (Nemotron-H's, dense or a relu² MoE's shared expert); a SwiGLU MoE's shared
        # expert always has one.
        if not c.mlp_up.data or (not c.mlp_gate.data and f.experts > 0 and not f.relu2_experts):
            raise ValueError(f"{name}: an MLP without up weights, or a SwiGLU MoE's shared expert without a gate")
    elif f.experts == 0:
        raise ValueError(f"{name}: neither a MoE block nor an MLP")
