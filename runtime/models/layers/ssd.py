"""Mamba2's selective state space scan (SSD): chunked form for prefill, one recurrent step for decode.

Per head, with state h [head_dim, state_size]: h = exp(dt A) h + dt x Bᵀ; y = h C + D x. The chunked form
follows transformers' `mamba2_chunk_scan`: inside a chunk the scan is a masked matmul, across chunks
a recurrence over chunk-end states, so a long prompt costs a few batched einsums, not one step per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.models.layers.state_checkpoints import StateCheckpoints, chunk_positions


def _segment_sum(x: torch.Tensor) -> torch.Tensor:
    """[..., T] → [..., T, T] with out[..., i, j] = sum(x[..., j+1 : i+1]) for j <= i, else -inf."""
    size = x.size(-1)
    x = x[..., None].expand(*x.size(), size)
    strict_lower = torch.tril(torch.ones(size, size, device=x.device, dtype=torch.bool), diagonal=-1)
    x = x.masked_fill(~strict_lower, 0)
    out = torch.cumsum(x, dim=-2)
    lower = torch.tril(torch.ones(size, size, device=x.device, dtype=torch.bool), diagonal=0)
    return out.masked_fill(~lower, -torch.inf)


def chunk_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    initial_state: torch.Tensor,
    chunk_size: int,
    checkpoints: StateCheckpoints | None = None,
    captured: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [B, L, H, P]; dt: [B, L, H] (already softplus'd and clamped; 0 on padded steps); a: [H] (negative);
    b, c: [B, L, G, N]; d: [H]; initial_state: [B, H, P, N] fp32.
    Returns (y [B, L, H, P] fp32, final state [B, H, P, N] fp32). With `checkpoints`, `captured` receives the
    state [H, P, N] after each checkpoint's token count, in checkpoint order."""
    batch, length, heads, _ = x.shape
    groups = b.shape[2]
    x = x.float()
    dt = dt.float()
    b = b.float().repeat_interleave(heads // groups, dim=2)
    c = c.float().repeat_interleave(heads // groups, dim=2)
    # A short extend (a speculative verify, a draft's catch-up) need not pay for a whole 128/256-token chunk:
    # its [chunk x chunk] decay matrices; any chunk size gives the same result.
    chunk_size = min(chunk_size, 1 << (length - 1).bit_length())
    pad = (chunk_size - length % chunk_size) % chunk_size
    d_residual = d.float()[:, None] * x
    x = x * dt[..., None]
    a_dt = a.float() * dt  # [B, L, H]

    def chunks(t: torch.Tensor) -> torch.Tensor:
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
        return t.reshape(batch, -1, chunk_size, *t.shape[2:])

    x, a_dt, b, c = chunks(x), chunks(a_dt), chunks(b), chunks(c)
    a_dt = a_dt.permute(0, 3, 1, 2)  # [B, H, C, l]
    a_cum = torch.cumsum(a_dt, dim=-1)
    # Within each chunk: attention-like masked products.
    decay = torch.exp(_segment_sum(a_dt))  # [B, H, C, l, s]
    scores = torch.einsum("bclhn,bcshn->bclsh", c, b)
    y_diag = torch.einsum("bclsh,bcshp->bclhp", scores * decay.permute(0, 2, 3, 4, 1), x)
    # State contributed by each chunk, then the recurrence across chunk boundaries.
    decay_states = torch.exp(a_cum[:, :, :, -1:] - a_cum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", b, decay_states, x)
    states = torch.cat([initial_state.float()[:, None], states], dim=1)
    decay_chunk = torch.exp(_segment_sum(F.pad(a_cum[:, :, :, -1], (1, 0)))).transpose(1, 3)
    new_states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    if checkpoints is not None and captured is not None and checkpoints.traced_tokens is not None:
        captured.extend(_traced_checkpoints(new_states, a_cum, b, x, checkpoints.traced_tokens).unbind(0))
    elif checkpoints is not None and captured is not None:
        for seq, n in zip(checkpoints.seq, checkpoints.tokens, strict=True):
            i, r = (n - 1) // chunk_size, (n - 1) % chunk_size + 1
            if r == chunk_size:  # the recurrence already holds it: the start state of chunk i + 1
                captured.append(new_states[seq, i + 1])
                continue
            # Inside chunk i: its start state decayed to token r, plus the first r tokens' writes.
            cum = a_cum[seq, :, i]  # [H, l]
            weights = torch.exp(cum[:, r - 1 : r] - cum[:, :r])  # [H, r]
            writes = torch.einsum("lhn,hl,lhp->hpn", b[seq, i, :r], weights, x[seq, i, :r])
            captured.append(new_states[seq, i] * torch.exp(cum[:, r - 1])[:, None, None] + writes)
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", c, states, torch.exp(a_cum))
    y = (y_diag + y_off).reshape(batch, -1, heads, x.shape[-1])[:, :length]
    return y + d_residual, final_state


def _traced_checkpoints(
    new_states: torch.Tensor, a_cum: torch.Tensor, b: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """[M, H, P, N]: one sequence's state after tokens[m] new tokens, the counts a tensor (a compiled graph):
    every one by the inside-a-chunk formula, chunk ends included. new_states: [1, C+1, H, P, N]; a_cum:
    [1, H, C, l]; b: [1, C, l, H, N]; x (dt-scaled): [1, C, l, H, P]."""
    chunk_size = a_cum.shape[-1]
    chunk, last = chunk_positions(tokens, chunk_size)  # [M] each
    cum = a_cum[0].index_select(1, chunk).transpose(0, 1)  # [M, H, l]
    at_last = cum.gather(-1, last[:, None, None].expand(-1, cum.shape[1], 1))  # [M, H, 1]
    upto = torch.arange(chunk_size, device=tokens.device)[None, :] <= last[:, None]  # [M, l]
    # Masked before exp: past the last token the exponent is positive and could overflow to inf (inf * 0 = nan).
    weights = torch.exp(torch.where(upto[:, None, :], at_last - cum, float("-inf")))  # [M, H, l]
    writes = torch.einsum("mlhn,mhl,mlhp->mhpn", b[0, chunk], weights, x[0, chunk])
    return new_states[0, chunk] * torch.exp(at_last)[..., None] + writes


def recurrent_step(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence. x: [B, H, P]; dt: [B, H]; b, c: [B, G, N]; state: [B, H, P, N] fp32.
    Returns (y [B, H, P] fp32, new state)."""
    heads = x.shape[1]
    groups = b.shape[1]
    dt = dt.float()
    b = b.float().repeat_interleave(heads // groups, dim=1)  # [B, H, N]
    c = c.float().repeat_interleave(heads // groups, dim=1)
    decay = torch.exp(dt * a.float())[..., None, None]
    state = state * decay + (dt[..., None] * x.float())[..., None] * b[:, :, None, :]
    y = (state @ c[..., None]).squeeze(-1) + d.float()[:, None] * x.float()
    return y, state
