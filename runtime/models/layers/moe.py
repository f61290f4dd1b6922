"""Sparse mixture of experts with top-k softmax routing and a sigmoid-gated shared expert (Qwen3-Next)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from runtime.core.device_path import accelerator_path, on_accelerator_path
from runtime.models.layers.derived import Derived, per_expert
from runtime.models.layers.grouped_moe import grouped_experts
from runtime.models.layers.mlp import GatedMLP
from runtime.native import extend_kernels, moe_prefill, moe_rows

# A short extend's experts run in C up to this many tokens (runtime/native/moe_kernels.c): per block, one thread,
# hot caches, 1.5x torch's sorted dispatch at 32 tokens, even at 64-96, 0.9x at 128 (benchmarks/
# short_extend_cost.py); in a forward, where the weights come from DRAM, 0.61 vs 0.97 ms at 48 tokens.
SHORT_EXTEND_MAX_TOKENS = 64
# From this many tokens an fp32 block (not a short extend's) runs in one C call (runtime/native/moe_rows.c). Its
# rows' bits do not depend on the token count, so a prefix cache checkpoint at n tokens equals an n-token prefill
# (tests/runtime/test_checkpoint_states.py): a threshold past 2 would put a 64-token and a 150-token prefill on
# two paths. 2048 tokens, one thread: 0.63x torch's CPU time; 4-64 tokens, hot caches: 0.36-0.47x.
ROWS_MIN_TOKENS = 2
# ... for experts of at most this many fp32 bytes a layer: the kernel reads a packed copy of the weights, kept
# beside them (the demo model's 3 MiB a layer; real Qwen3-Next-sized experts in fp32, 144 MiB, keep torch's path).
ROWS_MAX_PACKED_BYTES = 32 << 20
# Dense expert dispatch (see Experts.dense_is_cheaper) for at most this many token x expert rows.
_DENSE_MAX_ROWS = 128
# Traced (torch.compile) batches of several tokens run every expert while there are at most this many; past
# it, running all experts costs more than gathering the chosen experts' weights.
_TRACED_DENSE_MAX_EXPERTS = 64


class TopKRouter(nn.Module):
    def __init__(self, hidden: int, num_experts: int, top_k: int, norm_topk_prob: bool) -> None:
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (weights [T, k] in x's dtype, expert ids [T, k])."""
        logits = F.linear(x, self.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(logits.dtype), ids


class Experts(nn.Module):
    """All experts' SwiGLU weights as stacked tensors: gate_up_proj [E, 2I, H], down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self._per_expert_in, self._per_expert_out = Derived(per_expert), Derived(per_expert)
        self._packed = Derived(moe_rows.pack_experts)

    def packed(self) -> moe_rows.PackedExperts:
        """The weights in moe_rows.c's panels, packed once (again only when a parameter changes). Raises
        NativeRefused past ROWS_MAX_PACKED_BYTES."""
        if (self.gate_up_proj.numel() + self.down_proj.numel()) * 4 > ROWS_MAX_PACKED_BYTES:
            raise extend_kernels.NativeRefused("moe rows: experts too large for a packed copy")
        return self._packed(self.gate_up_proj, self.down_proj)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return self.forward_traced(x, ids, weights)
        if on_accelerator_path(x):  # no host read of the routing (runtime/models/layers/grouped_moe.py)
            return grouped_experts(x, ids, weights, self.gate_up_proj, self.down_proj, swiglu)
        if x.shape[0] == 1:
            return self.forward_one_token(x, ids, weights)
        if moe_prefill.takes(x, self.gate_up_proj, self.down_proj):
            # bf16 on AMX, rounding where this dispatch rounds: 0.72x its CPU time at 2048 tokens, 0.57-0.65x at
            # 16-512 (real-size Qwen3-Next experts, one thread), 0.3x for the tiny model's (benchmarks/
            # moe_prefill_cost.py).
            return moe_prefill.routed_experts(x, ids, weights, self.gate_up_proj, self.down_proj).to(x.dtype)
        fp32 = x.dtype == weights.dtype == self.gate_up_proj.dtype == torch.float32
        if x.shape[0] >= ROWS_MIN_TOKENS and fp32 and moe_rows.vectorized():
            try:  # any router's routing (Kimi-Linear's), the experts in one C call (runtime/native/moe_rows.c)
                return moe_rows.moe_rows(x, self.packed(), ids=ids.contiguous(), weights=weights.contiguous())
            except extend_kernels.NativeRefused:
                pass
        if self.dense_is_cheaper(x.shape[0], ids.shape[1]):
            return self.forward_dense(x, ids, weights)
        return self.forward_sparse(x, ids, weights)

    def forward_one_token(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        w_in, w_out = self._per_expert_in(self.gate_up_proj), self._per_expert_out(self.down_proj)
        return one_token_experts(x, ids, weights, w_in, w_out, swiglu)

    def forward_traced(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return traced_experts(x, ids, weights, self.gate_up_proj, self.down_proj, swiglu)

    def dense_is_cheaper(self, tokens: int, top_k: int) -> bool:
        """At a few tokens the sorted dispatch is ~8 tiny ops per hit expert plus a host sync; running every
        expert on every token is 2 batched matmuls. Worth it when most experts are hit anyway (their weights
        are read either way) and the extra FLOPs stay small in absolute terms. Demo-model experts
        (8 x 256 x 128, top-2), one thread, CPU time per call: 8 tokens dense 306 us vs sparse 470 us;
        64 tokens 1328 vs 828; 1 token: dense loses inside the model (every expert's weights leave the cache)."""
        return tokens * self.num_experts <= _DENSE_MAX_ROWS and 2 * tokens * top_k >= self.num_experts

    def forward_dense(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Every expert on every token, combined with routing weights that are 0 for unchosen experts."""
        tokens = x.expand(self.num_experts, *x.shape)  # a view: bmm reads the transposed weights in place
        gate, up = torch.bmm(tokens, self.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)  # [E, T, I] each
        h = torch.bmm(F.silu(gate) * up, self.down_proj.transpose(1, 2))  # [E, T, H]
        dense_w = torch.zeros(x.shape[0], self.num_experts, dtype=weights.dtype, device=x.device)
        dense_w.scatter_(1, ids, weights)
        return (h * dense_w.t()[:, :, None]).sum(0).to(x.dtype)

    def forward_sparse(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Sorted dispatch: the (token, slot) assignments sorted by expert, so each hit expert's rows are one
        contiguous slice. The gather, the activation, the routing weights and the scatter-add back then run
        once for all experts and only the two matmuls run per expert (an op per expert each was ~18 thread
        wake-ups per expert with sleeping OpenMP workers). Each token's terms are added in ascending expert
        order, as forward_one_token adds them (index_add_ accumulates in index order)."""
        top_k = ids.shape[1]
        flat_ids = ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        token_of = order // top_k
        rows = x.index_select(0, token_of)  # [T*k, H], expert-major
        gate_up = x.new_empty(rows.shape[0], self.gate_up_proj.shape[1])
        starts = [0, *itertools.accumulate(counts)]
        spans = [(e, starts[e], c) for e, c in enumerate(counts) if c]
        for expert, start, count in spans:
            torch.mm(rows[start : start + count], self.gate_up_proj[expert].t(), out=gate_up[start : start + count])
        gate, up = gate_up.chunk(2, dim=-1)
        # In place, the same ops on the same values: no fresh [T*k, ...] buffers for the activation, the expert
        # outputs (the gathered rows are dead once the first matmuls ran) and the weighted rows; a 2048-token fp32
        # prefill of the demo model's experts, one thread, 9.0 -> 7.6 ms CPU a layer.
        h = F.silu(gate, inplace=True).mul_(up)
        expert_out = rows
        for expert, start, count in spans:
            torch.mm(h[start : start + count], self.down_proj[expert].t(), out=expert_out[start : start + count])
        row_weights = weights.reshape(-1)[order, None]
        if row_weights.dtype == x.dtype:
            weighted = expert_out.mul_(row_weights)
        else:
            weighted = (expert_out * row_weights).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, token_of, weighted)


class SparseMoE(nn.Module):
    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        intermediate: int,
        shared_intermediate: int,
        norm_topk_prob: bool,
    ) -> None:
        super().__init__()
        self.gate = TopKRouter(hidden, num_experts, top_k, norm_topk_prob)
        self.experts = Experts(num_experts, hidden, intermediate)
        self.shared_expert = GatedMLP(hidden, shared_intermediate) if shared_intermediate > 0 else None
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False) if shared_intermediate > 0 else None
        self._packed_shared = Derived(moe_rows.pack_shared)

    def after_weights_loaded(self) -> None:
        if accelerator_path(self.gate.weight.device):
            return  # the C kernels read host memory: not built for a model on an accelerator
        extend_kernels.library()  # built (or its absence logged) at load, not in the first request
        if self.experts.gate_up_proj.dtype == torch.bfloat16:
            moe_prefill.library()

    def forward(self, x: torch.Tensor, short_extend: bool = False) -> torch.Tensor:
        """`short_extend`: the rows are a short extend's tokens (runtime/models/layers/packing.py): the router,
        the experts and the shared expert then run in one C call when the kernel can take the tensors (decode
        stays in torch)."""
        if short_extend and 1 < x.shape[0] <= SHORT_EXTEND_MAX_TOKENS and not torch.compiler.is_compiling():
            out = self._short_extend(x)
            if out is not None:
                return out
        if x.shape[0] >= ROWS_MIN_TOKENS and x.dtype == torch.float32 and not torch.compiler.is_compiling():
            out = self._rows(x)
            if out is not None:
                return out
        weights, ids = self.gate(x)
        out = self.experts(x, ids, weights)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            # In place on the fresh shared-expert and routed outputs: the same products and sum, no [T, H] temporaries.
            out = out.add_(self.shared_expert(x).mul_(torch.sigmoid(self.shared_expert_gate(x))))
        return out

    def _short_extend(self, x: torch.Tensor) -> torch.Tensor | None:
        shared = None
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            mlp = self.shared_expert
            shared = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, self.shared_expert_gate.weight[0])
        router = extend_kernels.Router(self.gate.weight, self.gate.top_k, self.gate.norm_topk_prob)
        try:
            return extend_kernels.moe_short_extend(
                x, None, None, self.experts.gate_up_proj, self.experts.down_proj, shared, router=router
            ).to(x.dtype)
        except extend_kernels.NativeRefused:
            return None

    def _rows(self, x: torch.Tensor) -> torch.Tensor | None:
        """The whole block in one C call (an fp32 prefill's rows), or None where the kernel refuses the tensors."""
        if x.device.type != "cpu" or self.gate.weight.dtype != torch.float32 or not moe_rows.vectorized():
            return None
        try:
            shared = shared_gate = None
            if self.shared_expert is not None and self.shared_expert_gate is not None:
                mlp = self.shared_expert
                shared = self._packed_shared(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
                shared_gate = self.shared_expert_gate.weight[0]
            experts = self.experts.packed()
            router = extend_kernels.Router(self.gate.weight, self.gate.top_k, self.gate.norm_topk_prob)
            return moe_rows.moe_rows(x, experts, router=router, shared=shared, shared_gate=shared_gate)
        except extend_kernels.NativeRefused:
            return None

    @staticmethod
    def checkpoint_sources(prefix: str, num_experts: int) -> dict[str, list[str]]:
        """HF checkpoints store one tensor per expert; these name the tensors stacked into each fused
        parameter."""
        return {
            f"{prefix}.experts.gate_up_proj": [
                f"{prefix}.experts.{e}.{part}.weight" for e in range(num_experts) for part in ("gate_proj", "up_proj")
            ],
            f"{prefix}.experts.down_proj": [f"{prefix}.experts.{e}.down_proj.weight" for e in range(num_experts)],
        }


def swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def one_token_experts(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w_in: Sequence[torch.Tensor],
    w_out: Sequence[torch.Tensor],
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Single-stream decode (x [1, H], weights in x's dtype; w_in / w_out: per-expert views, see `per_expert`):
    the chosen experts straight from the routing, no sort, scatter or index_add. Summed in ascending expert
    order, as the sorted dispatch adds them, so both give the same bits. The routing weights come over as Python
    floats in the one host sync that reads the ids: a float scales h in h's dtype exactly as the weight tensor's
    element did (the same value, the same opmath), without a select and a `to` per expert (5 instead of 12
    dispatched ops per expert for SwiGLU)."""
    out: torch.Tensor | None = None
    for expert, weight in sorted(zip(ids.tolist()[0], weights.tolist()[0], strict=True)):
        term = F.linear(act(F.linear(x, w_in[expert])), w_out[expert]) * weight
        out = term if out is None else out + term
    assert out is not None
    return out


def traced_experts(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Experts for the compiled decode path (runtime/engine/compiled_decode.py): no host sync (`.tolist()`
    ends a graph) and no Python branch on a traced size (a guard, hence a recompile). w_in [E, N, H],
    w_out [E, H, I], `act` maps N to I features. One token: only the chosen experts' weights, gathered.
    Several: every expert on every token with routing weights 0 for the unchosen, unless there are many
    experts. Returns x's dtype, accumulated in the promoted dtype of the outputs and `weights`."""
    tokens, top_k = ids.shape
    num_experts = w_in.shape[0]
    if tokens > 1 and num_experts <= _TRACED_DENSE_MAX_EXPERTS:
        h = torch.bmm(act(torch.bmm(x.expand(num_experts, *x.shape), w_in.transpose(1, 2))), w_out.transpose(1, 2))
        dense_w = torch.zeros(tokens, num_experts, dtype=weights.dtype, device=x.device).scatter_(1, ids, weights)
        return (h * dense_w.t()[:, :, None]).sum(0).to(x.dtype)  # h: [E, T, H]
    flat = ids.reshape(-1)
    rows = x.repeat_interleave(top_k, dim=0)[:, None, :]  # [T*k, 1, H]
    w_in, w_out = w_in.index_select(0, flat), w_out.index_select(0, flat)  # the chosen experts only
    h = torch.bmm(act(torch.bmm(rows, w_in.transpose(1, 2))), w_out.transpose(1, 2))
    return (h[:, 0].view(tokens, top_k, -1) * weights[..., None]).sum(1).to(x.dtype)
