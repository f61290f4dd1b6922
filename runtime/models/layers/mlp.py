"""Dense feed-forward blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.layers.mamba2_extend import relu_squared_


class GatedMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In place: a long prefill's [T, intermediate] activations are not allocated (and page-faulted) twice more.
        return self.down_proj(F.silu(self.gate_proj(x), inplace=True).mul_(self.up_proj(x)))


class Relu2MLP(nn.Module):
    """Non-gated MLP with squared ReLU (Nemotron-H): down(relu(up(x))²)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In place, as GatedMLP; in C for bf16, where torch's relu_ is a slow scalar loop (mamba2_extend.py).
        return self.down_proj(relu_squared_(self.up_proj(x)))
