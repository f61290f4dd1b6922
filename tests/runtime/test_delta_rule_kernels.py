"""The prefill delta rule's building blocks against plain references: the matmul-only triangular inverse against
LAPACK's solve, and the chunked form against the one-token recurrence it must equal (including gates strong
enough to push the decays' exponents far outside exp's fast range)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.models.layers.delta_rule import (
    chunk_gated_delta_rule,
    l2norm,
    recurrent_gated_delta_step,
    unit_lower_inverse,
)


@settings(max_examples=20, deadline=None)
@given(
    log_size=st.integers(0, 7),
    batch=st.integers(1, 5),
    scale=st.sampled_from([0.05, 0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_unit_lower_inverse_matches_triangular_solve(log_size: int, batch: int, scale: float, seed: int) -> None:
    size = 1 << log_size
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, size, size, generator=gen, dtype=torch.float64) * scale / size**0.5
    want = torch.linalg.solve_triangular(
        a.tril(-1) + torch.eye(size, dtype=a.dtype), torch.eye(size, dtype=a.dtype).expand(batch, -1, -1), upper=False
    )
    got = unit_lower_inverse(a)  # diagonal and upper triangle of `a` are ignored
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_unit_lower_inverse_refuses_other_sizes() -> None:
    with pytest.raises(ValueError, match="not a power of two"):
        unit_lower_inverse(torch.zeros(1, 12, 12))


def _recurrent(q, k, v, g, beta, state):  # type: ignore[no-untyped-def]
    """Token by token through the decode step (state in the pool's [H, Dv, Dk] layout)."""
    state = state.transpose(-1, -2).contiguous()
    outs = []
    for t in range(q.shape[1]):
        out, state = recurrent_gated_delta_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
        outs.append(out)
    return torch.stack(outs, dim=1), state.transpose(-1, -2)


@settings(max_examples=12, deadline=None)
@given(
    length=st.integers(1, 150),
    heads=st.integers(1, 3),
    gate_scale=st.sampled_from([0.05, 1.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_chunked_equals_recurrent(length: int, heads: int, gate_scale: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    dim = 8

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    q, k = l2norm(rnd(2, length, heads, dim)), l2norm(rnd(2, length, heads, dim))
    v = rnd(2, length, heads, dim)
    # gate_scale 30: per-token log-decays of ~-25, so a chunk's cumulative gate reaches the thousands.
    g = -rnd(2, length, heads).abs() * gate_scale
    beta = rnd(2, length, heads).sigmoid()
    init = rnd(2, heads, dim, dim)
    out, state = chunk_gated_delta_rule(q, k, v, g, beta, init)
    want_out, want_state = _recurrent(q, k, v, g, beta, init)
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, want_state, rtol=1e-4, atol=1e-4)
