"""Nemotron-H's mixture of experts: sigmoid scores with a correction bias, group-limited top-k routing,
non-gated squared-ReLU experts, an optional latent projection, and a shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.core.device_path import on_accelerator_path
from runtime.models.layers.derived import Derived, per_expert
from runtime.models.layers.grouped_moe import grouped_experts
from runtime.models.layers.mlp import Relu2MLP
from runtime.models.layers.moe import one_token_experts, traced_experts
from runtime.native import moe_prefill


class GroupTopKRouter(nn.Module):
    # Scores and the correction bias are compared across experts in fp32; transformers keeps both fp32
    # (`_keep_in_fp32_modules_strict`) and so do we under 16-bit weights (HybridModel.cast).
    fp32_parameters = ("weight", "e_score_correction_bias")

    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        n_group: int,
        topk_group: int,
        norm_topk_prob: bool,
        scaling: float,
    ) -> None:
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.n_group, self.topk_group = n_group, topk_group
        self.norm_topk_prob, self.scaling = norm_topk_prob, scaling
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))
        # Stored in the checkpoint; only shifts which experts are chosen, not their weights.
        self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (weights [T, k] fp32, expert ids [T, k])."""
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        per_group = self.num_experts // self.n_group
        group_scores = choice.view(-1, self.n_group, per_group).topk(min(2, per_group), dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        expert_mask = group_mask[:, :, None].expand(-1, -1, per_group).reshape(-1, self.num_experts).bool()
        choice = choice.masked_fill(~expert_mask, float("-inf"))
        ids = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids


def relu2(h: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(h))


class Relu2Experts(nn.Module):
    """Stacked expert weights: up_proj [E, I, D], down_proj [E, D, I] (D = hidden or latent size)."""

    def __init__(self, num_experts: int, dim: int, intermediate: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate, dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, dim, intermediate))
        self._per_expert_in, self._per_expert_out = Derived(per_expert), Derived(per_expert)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # the compiled decode path: no host sync
            return traced_experts(x, ids, weights, self.up_proj, self.down_proj, relu2)
        if on_accelerator_path(x):  # no host read of the routing (runtime/models/layers/grouped_moe.py)
            return grouped_experts(x, ids, weights, self.up_proj, self.down_proj, relu2)
        if x.shape[0] == 1 and x.dtype == weights.dtype:  # fp32: the fp32 accumulation below, term by term
            w_in, w_out = self._per_expert_in(self.up_proj), self._per_expert_out(self.down_proj)
            return one_token_experts(x, ids, weights, w_in, w_out, relu2)
        if moe_prefill.takes(x, self.up_proj, self.down_proj, gated=False):
            # bf16 on AMX, rounding as forward_sorted does (runtime/native/moe_prefill.c)
            fp32_sum = weights.dtype == torch.float32  # forward_sorted sums in the routing weights' dtype
            out = moe_prefill.routed_experts(
                x, ids, weights, self.up_proj, self.down_proj, gated=False, fp32_sum=fp32_sum
            )
            return out.to(x.dtype)
        return self.forward_sorted(x, ids, weights)

    def forward_sorted(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Each hit expert on its rows, the terms added per token in ascending expert order in `weights`' dtype."""
        out = torch.zeros(x.shape, dtype=weights.dtype, device=x.device)
        order = torch.argsort(ids.reshape(-1), stable=True)
        counts = torch.bincount(ids.reshape(-1), minlength=self.num_experts).tolist()
        token_of = order // ids.shape[1]
        w_sorted = weights.reshape(-1)[order]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            tokens = token_of[start : start + count]
            h = torch.square(F.relu(F.linear(x[tokens], self.up_proj[expert])))
            h = F.linear(h, self.down_proj[expert])
            out.index_add_(0, tokens, (h * w_sorted[start : start + count, None]).to(out.dtype))
            start += count
        return out.to(x.dtype)


class SigmoidMoE(nn.Module):
    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        intermediate: int,
        shared_intermediate: int,
        n_group: int,
        topk_group: int,
        norm_topk_prob: bool,
        scaling: float,
        latent: int | None,
        bias: bool,
    ) -> None:
        super().__init__()
        self.gate = GroupTopKRouter(hidden, num_experts, top_k, n_group, topk_group, norm_topk_prob, scaling)
        self.experts = Relu2Experts(num_experts, latent or hidden, intermediate)
        self.shared_experts = Relu2MLP(hidden, shared_intermediate, bias=bias)
        self.fc1_latent_proj = nn.Linear(hidden, latent, bias=bias) if latent else None
        self.fc2_latent_proj = nn.Linear(latent, hidden, bias=bias) if latent else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        h = self.fc1_latent_proj(x) if self.fc1_latent_proj is not None else x
        h = self.experts(h, ids, weights)
        if self.fc2_latent_proj is not None:
            h = self.fc2_latent_proj(h)
        return h + self.shared_experts(x)

    @staticmethod
    def checkpoint_sources(prefix: str, num_experts: int) -> dict[str, list[str]]:
        """Per-expert checkpoint tensors stacked into each fused parameter."""
        return {
            f"{prefix}.experts.{part}": [f"{prefix}.experts.{e}.{part}.weight" for e in range(num_experts)]
            for part in ("up_proj", "down_proj")
        }
