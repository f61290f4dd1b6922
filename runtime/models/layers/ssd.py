"""Mamba2's selective state space scan (SSD): chunked form for prefill, one recurrent step for decode.

Per head, with state h [head_dim, state_size]: h = exp(dt A) h + dt x Bᵀ; y = h C + D x. The chunked form
follows transformers' `mamba2_chunk_scan`: inside a chunk the scan is a masked matmul, across chunks
a recurrence over chunk-end states, so a long prompt costs a few batched matmuls per block of chunks, not one step
per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.models.layers.mamba2_extend import intra_chunk_weights
from runtime.models.layers.state_checkpoints import StateCheckpoints, chunk_positions

# Chunk and block sizes, measured at Nemotron-H's shapes (64 heads of 64, 8 groups, state 128; 2048 tokens, one
# layer): the intra-chunk work grows with the chunk, the chunk-state traffic (a [H, P, N] state per chunk) with
# their number; chunk 64 in blocks of 128 tokens took 129 ms on one thread (178 on two) against 1076 for the
# whole-prompt, per-head form this replaced. Chunk 64 divides the default checkpoint interval.
MAX_CHUNK = 64
BLOCK_TOKENS = 128


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
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [B, L, H, P]; dt: [B, L, H] (already softplus'd and clamped; 0 on padded steps); a: [H] (negative);
    b, c: [B, L, G, N]; d: [H]; initial_state: [B, H, P, N] fp32.
    Returns (y [B, L, H, P], computed in fp32 and rounded once to `out_dtype`; final state [B, H, P, N] fp32).
    With `checkpoints`, `captured` receives the state [H, P, N] after each checkpoint's token count, in order."""
    batch, length, heads, dim = x.shape
    # Any chunk size gives the same result; a short extend (a speculative verify, a draft's catch-up) need not pay
    # for a whole chunk's [chunk x chunk] decay matrices.
    chunk_size = min(chunk_size, MAX_CHUNK, 1 << (length - 1).bit_length())
    # Blocks of whole chunks, the state carried between them: each block's intermediates stay small enough for
    # the heap (glibc maps 32 MiB and more afresh, and every page then faults in) and mostly in cache.
    # A compiled extend's traced checkpoints can fall in any chunk: one block.
    traced = checkpoints is not None and checkpoints.traced_tokens is not None
    block = length if traced else max(chunk_size, BLOCK_TOKENS // chunk_size * chunk_size)
    y = torch.empty(batch, length, heads, dim, dtype=out_dtype, device=x.device)
    state = initial_state.float()
    found: dict[int, torch.Tensor] = {}
    scan = _Scan(a.float(), d.float(), chunk_size, checkpoints if captured is not None else None, found)
    for start in range(0, length, block):
        part = slice(start, min(start + block, length))
        state = scan.block(x[:, part], dt[:, part], b[:, part], c[:, part], state, y[:, part], start)
    if captured is not None and checkpoints is not None:
        captured.extend(found[m] for m in range(len(found)))
    return y, state


class _Scan:
    """The chunked scan of one sequence batch, a block of whole chunks at a time. Layouts are chunk-major
    ([C, B, ...]) so one chunk's state is a contiguous [B, H, P, N]."""

    def __init__(
        self,
        a: torch.Tensor,
        d: torch.Tensor,
        chunk_size: int,
        checkpoints: StateCheckpoints | None,
        found: dict[int, torch.Tensor],
    ) -> None:
        self.a, self.d, self.chunk_size, self.checkpoints, self.found = a, d, chunk_size, checkpoints, found
        size = chunk_size
        self.upper = torch.ones(size, size, dtype=torch.bool, device=a.device).triu(1)

    def block(
        self,
        x: torch.Tensor,
        dt: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        initial_state: torch.Tensor,
        y: torch.Tensor,
        offset: int,
    ) -> torch.Tensor:
        """Tokens offset.. of the sequences: y (D residual included) into `y`, checkpoints inside the block into
        `found`; returns the state after the block."""
        batch, length, heads, dim = x.shape
        groups, size, chunk = b.shape[2], b.shape[3], self.chunk_size
        per_group = heads // groups
        pad = (chunk - length % chunk) % chunk
        n_chunks = (length + pad) // chunk
        if pad:
            x, dt, b, c = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, b, c))
        lead = (n_chunks, batch)
        tokens = x.view(batch, n_chunks, chunk, groups, per_group, dim).transpose(0, 1)  # [C, B, l, G, h, P]
        dt = dt.float().view(batch, n_chunks, chunk, heads).permute(1, 0, 3, 2)  # [C, B, H, l]
        a_cum = (dt * self.a[:, None]).cumsum(-1)

        def by_group(t: torch.Tensor) -> torch.Tensor:  # [B, L, G, N] → [C, B, G, l, N]
            return t.float().view(batch, n_chunks, chunk, groups, size).permute(1, 0, 3, 2, 4).contiguous()

        b, c = by_group(b), by_group(c)
        # Within a chunk: y[l] = sum over s <= l of (C_l . B_s) exp(cum_l - cum_s) dt_s x_s, + D x_l. C . B is
        # shared by a group's heads: one [l, N] x [N, l] product per group, not per head. dt_s goes into the
        # exponent (log 0 = -inf: a padded step weighs 0) and D onto the diagonal, so x is read as it is.
        scores = c @ b.transpose(-1, -2)  # [C, B, G, l, s]
        shifted = a_cum - dt.log()
        mixing = intra_chunk_weights(a_cum, shifted, scores, self.d)  # the same in one C pass, where it is had
        if mixing is None:
            # Masked before exp: above the diagonal the exponent is positive and could overflow (inf * 0 = nan).
            mixing = torch.sub(a_cum[..., :, None], shifted[..., None, :])
            mixing = mixing.masked_fill_(self.upper, -torch.inf).exp_().view(*lead, groups, per_group, chunk, chunk)
            mixing.mul_(scores[:, :, :, None]).diagonal(0, -2, -1).add_(self.d.view(groups, per_group, 1))
        by_head = torch.empty(*lead, groups, per_group, chunk, dim, device=x.device)
        by_head.copy_(tokens.permute(0, 1, 3, 4, 2, 5))
        y_diag = mixing @ by_head  # [C, B, G, h, l, P]
        # Each chunk's write to the state (its tokens decayed to the chunk's end), then the recurrence.
        to_end = torch.exp(a_cum[..., -1:] - a_cum).mul_(dt).view(*lead, groups, per_group, chunk)
        weighted = torch.empty(*lead, groups, chunk, per_group, dim, device=x.device)
        torch.mul(tokens.transpose(2, 3), to_end.transpose(-1, -2)[..., None], out=weighted)
        chunk_decay = torch.exp(a_cum[..., -1])[..., None, None]  # [C, B, H, 1, 1]
        states = torch.empty(n_chunks + 1, batch, heads, dim, size, device=x.device)
        states[0] = initial_state
        rows = batch * groups
        for i in range(n_chunks):
            torch.mul(states[i], chunk_decay[i], out=states[i + 1])
            writes = weighted[i].view(rows, chunk, -1).transpose(1, 2)
            states[i + 1].view(rows, -1, size).baddbmm_(writes, b[i].view(rows, chunk, size))
        # Each chunk's start state read out at every position, decayed to it.
        y_off = c @ states[:-1].view(*lead, groups, -1, size).transpose(-1, -2)  # [C, B, G, l, h*P]
        decay_in = torch.exp(a_cum).view(*lead, groups, per_group, chunk).permute(0, 1, 4, 2, 3)[..., None]
        # Straight into y where it is a whole number of chunks. Not in a compiled graph: there, out= into this
        # transposed view of y made a later view of y fail to trace ("Cannot view a tensor ..."); copy instead.
        into_y = not pad and not torch.compiler.is_compiling()
        out = y.view(batch, n_chunks, chunk, groups, per_group, dim).transpose(0, 1) if into_y else None
        full = torch.addcmul(
            y_diag.permute(0, 1, 4, 2, 3, 5),
            y_off.view(*lead, groups, chunk, per_group, dim).transpose(2, 3),
            decay_in,
            out=out,
        )
        if not into_y:
            y.copy_(full.transpose(0, 1).reshape(batch, -1, heads, dim)[:, :length])
        if self.checkpoints is not None:
            self.found.update(_checkpoints(states, a_cum, b, tokens, dt, self.checkpoints, offset, length))
        return states[-1]


def _checkpoints(
    states: torch.Tensor,
    a_cum: torch.Tensor,
    b: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    checkpoints: StateCheckpoints,
    offset: int,
    length: int,
) -> dict[int, torch.Tensor]:
    """{checkpoint index: [H, P, N]} for the checkpoints after offset + 1 .. offset + length tokens: on the chunk
    grid the state the recurrence already holds, inside a chunk that chunk's start state advanced by its first r
    tokens (all of those in one batched product). A traced checkpoint list (one sequence, one block) goes through
    the inside-a-chunk formula whole, chunk ends included."""
    chunk_size = a_cum.shape[-1]
    if checkpoints.traced_tokens is not None:
        chunk, last = chunk_positions(checkpoints.traced_tokens, chunk_size)
        return dict(enumerate(_states_at(states, a_cum, b, x, dt, torch.zeros_like(chunk), chunk, last).unbind(0)))
    found: dict[int, torch.Tensor] = {}
    inside: list[tuple[int, int, int, int]] = []
    for m, (seq, n) in enumerate(zip(checkpoints.seq, checkpoints.tokens, strict=True)):
        if not offset < n <= offset + length:
            continue
        at_chunk, r = divmod(n - offset, chunk_size)
        if r == 0:
            found[m] = states[at_chunk, seq]
        else:
            inside.append((m, seq, at_chunk, r - 1))
    if inside:
        seqs, chunks, last = (torch.tensor([t[j] for t in inside], device=x.device) for j in (1, 2, 3))
        at = _states_at(states, a_cum, b, x, dt, seqs, chunks, last)
        found.update(zip((t[0] for t in inside), at.unbind(0), strict=True))
    return found


def _states_at(
    states: torch.Tensor,
    a_cum: torch.Tensor,
    b: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    seqs: torch.Tensor,
    chunks: torch.Tensor,
    last: torch.Tensor,
) -> torch.Tensor:
    """[M, H, P, N]: sequence seqs[m]'s state after token last[m] (0-based) of chunk chunks[m].
    states: [C+1, B, H, P, N]; a_cum, dt: [C, B, H, l]; b: [C, B, G, l, N]; x: [C, B, l, G, h, P]."""
    chunk_size = a_cum.shape[-1]
    cum = a_cum[chunks, seqs]  # [M, H, l]
    at_last = cum.gather(-1, last[:, None, None].expand(-1, cum.shape[1], 1))  # [M, H, 1]
    upto = torch.arange(chunk_size, device=x.device)[None, :] <= last[:, None]  # [M, l]
    # Masked before exp: past the last token the exponent is positive and could overflow to inf (inf * 0 = nan).
    weights = torch.exp(torch.where(upto[:, None, :], at_last - cum, float("-inf"))) * dt[chunks, seqs]
    picked = x[chunks, seqs].float()  # [M, l, G, h, P]
    weighted = picked * weights.transpose(1, 2).reshape(*picked.shape[:-1], 1)
    writes = weighted.flatten(3).permute(0, 2, 3, 1) @ b[chunks, seqs]  # [M, G, h*P, N]
    return states[chunks, seqs] * torch.exp(at_last)[..., None] + writes.view(-1, *states.shape[2:])


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
