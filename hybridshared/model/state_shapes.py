"""Per-rank recurrent-state shapes, transcribed from SGLang 0.5.23 `srt/configs/mamba_utils.py`.

Kept line-for-line close to SGLang so the bytes we plan with are the bytes SGLang allocates:
`Mamba2StateShape.create` (mamba_utils.py:194-243) serves Gated DeltaNet (Qwen3-Next, Qwen3.5) and Mamba-2
(Nemotron-H, Falcon-H1, Granite-4.0-H); `KimiLinearStateShape.create` (mamba_utils.py:323-367) serves KDA.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StateShape:
    """One linear layer's state for one request on one rank."""

    conv: tuple[int, ...]  # conv window (SGLang's `shape.conv[0]`)
    temporal: tuple[int, int, int]  # SSM / delta-rule state (SGLang's `shape.temporal`)

    @property
    def conv_numel(self) -> int:
        n = 1
        for d in self.conv:
            n *= d
        return n

    @property
    def temporal_numel(self) -> int:
        a, b, c = self.temporal
        return a * b * c


def _divide(numerator: int, denominator: int, what: str) -> int:
    # SGLang's distributed.utils.divide asserts divisibility; we say which dimension and why.
    if numerator % denominator != 0:
        raise ValueError(f"{what} ({numerator}) is not divisible by the tensor-parallel size ({denominator})")
    return numerator // denominator


def _extra_groups_for_head_shards(ngroups: int, tp_size: int) -> int:
    # mamba_utils.py:29-38: groups are replicated so every head shard carries the groups it needs.
    if ngroups % tp_size == 0:
        return 0
    return tp_size - ngroups


def mamba2_state_shape(
    *,
    tp: int,
    intermediate_size: int,
    n_groups: int,
    num_heads: int,
    head_dim: int,
    state_size: int,
    conv_kernel: int,
) -> StateShape:
    """mamba_utils.py:194-243 (`Mamba2StateShape.create`)."""
    if n_groups % tp != 0:
        n_groups += _extra_groups_for_head_shards(n_groups, tp)
    conv_dim = intermediate_size + 2 * n_groups * state_size
    conv = (_divide(conv_dim, tp, "conv_dim"), conv_kernel - 1)
    temporal = (_divide(num_heads, tp, "number of linear/Mamba heads"), head_dim, state_size)
    return StateShape(conv=conv, temporal=temporal)


def kda_state_shape(
    *,
    tp: int,
    num_heads: int,
    head_dim: int,
    conv_kernel: int,
    num_k_heads: int | None = None,
    head_k_dim: int | None = None,
) -> StateShape:
    """mamba_utils.py:323-367 (`KimiLinearStateShape.create`): conv is (kernel - 1, q + k + v channels)."""
    num_k_heads = num_heads if num_k_heads is None else num_k_heads
    head_k_dim = head_dim if head_k_dim is None else head_k_dim
    proj_size = num_heads * head_dim
    proj_k_size = num_k_heads * head_k_dim
    conv_v = _divide(proj_size, tp, "KDA projection size")
    conv_k = _divide(proj_k_size, tp, "KDA key projection size")
    temporal = (_divide(num_heads, tp, "number of KDA heads"), head_dim, head_dim)
    return StateShape(conv=(conv_kernel - 1, conv_v + conv_k * 2), temporal=temporal)


def state_bytes_per_request(shape: StateShape, *, conv_bytes: int, ssm_bytes: int, num_linear_layers: int) -> int:
    """mamba_utils.py:115-125 (`mamba_cache_per_req`): every linear layer's conv + temporal state."""
    return (shape.conv_numel * conv_bytes + shape.temporal_numel * ssm_bytes) * num_linear_layers
