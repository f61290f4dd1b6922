"""Kimi Delta Attention: the gated delta rule with a per-channel (not per-head) decay, chunked for prefill and
one recurrent step for decode. Follows transformers' `chunk_kimi_delta_attention` torch path; the per-chunk
triangular system is solved with `solve_triangular` instead of row-by-row substitution."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.models.layers.state_checkpoints import StateCheckpoints, chunk_positions


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    chunk_size: int = 64,
    checkpoints: StateCheckpoints | None = None,
    captured: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k: [B, L, H, K] (l2-normalized); v: [B, L, H, V]; g: [B, L, H, K] log-decay; beta: [B, L, H];
    initial_state: [B, H, K, V]. Padded steps must carry g = 0 and beta = 0.
    Returns (out [B, L, H, V] fp32, final state [B, H, K, V] fp32). With `checkpoints`, `captured` receives the
    state [H, K, V] after each checkpoint's token count, in checkpoint order (state_checkpoints.py)."""
    batch, length, heads, dk = k.shape
    dv = v.shape[-1]
    q, k, v, g, beta = (x.transpose(1, 2).float().contiguous() for x in (q, k, v, g, beta))
    pad = (chunk_size - length % chunk_size) % chunk_size
    q = F.pad(q, (0, 0, 0, pad)) * dk**-0.5
    k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (k, v, g))
    beta = F.pad(beta, (0, pad))
    n = (length + pad) // chunk_size
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    q, k, g, k_beta, v_beta = (x.view(batch, heads, n, chunk_size, x.shape[-1]) for x in (q, k, g, k_beta, v_beta))
    g = g.cumsum(dim=-2)
    upper = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device), diagonal=1)
    state = initial_state.float()
    out = torch.empty(batch, heads, n, chunk_size, dv, dtype=torch.float32, device=q.device)
    found: dict[int, torch.Tensor] = {}
    traced = checkpoints is not None and checkpoints.traced_tokens is not None
    starts: list[torch.Tensor] = []  # traced checkpoints: each chunk's start state and corrected values
    corrected: list[torch.Tensor] = []
    # One chunk at a time: the per-channel pairwise decay is [C, C, K] per head, too big to hold for a whole prompt.
    for i in range(n):
        q_i, k_i, g_i, kb_i = q[:, :, i], k[:, :, i], g[:, :, i], k_beta[:, :, i]
        # decay[..., l, s, d] = exp(g_l - g_s) per channel, for s <= l.
        decay = (g_i[..., :, None, :] - g_i[..., None, :, :]).masked_fill(upper[..., None], float("-inf")).exp()
        system = (kb_i[..., :, None, :] * k_i[..., None, :, :] * decay).sum(-1).tril(-1)
        values = torch.linalg.solve_triangular(system, v_beta[:, :, i], upper=False, unitriangular=True)
        k_cumdecay = torch.linalg.solve_triangular(system, kb_i * g_i.exp(), upper=False, unitriangular=True)
        intra = (q_i[..., :, None, :] * k_i[..., None, :, :] * decay).sum(-1).masked_fill(upper, 0)
        v_new = values - k_cumdecay @ state
        out[:, :, i] = (q_i * g_i.exp()) @ state + intra @ v_new
        last = g_i[:, :, -1:]
        new_state = state * last.exp().transpose(-1, -2) + (k_i * (last - g_i).exp()).transpose(-1, -2) @ v_new
        if traced:
            starts.append(state)
            corrected.append(v_new)
        elif checkpoints is not None:
            for m, b, r in checkpoints.in_chunk(i, chunk_size):
                if r == chunk_size:
                    found[m] = new_state[b]
                    continue
                # The end-state formula cut at token r (v_new of a token depends only on earlier tokens).
                at_r = g_i[b, :, r - 1 : r]  # [H, 1, K]
                keys = k_i[b, :, :r] * (at_r - g_i[b, :, :r]).exp()
                found[m] = state[b] * at_r.exp().transpose(-1, -2) + keys.transpose(-1, -2) @ v_new[b, :, :r]
        state = new_state
    out = out.view(batch, heads, -1, dv)[:, :, :length].transpose(1, 2)
    if traced and captured is not None:
        assert checkpoints is not None and checkpoints.traced_tokens is not None
        per_chunk = torch.stack(starts, 1)[0], torch.stack(corrected, 2)[0]
        at = _traced_states(*per_chunk, g[0], k[0], checkpoints.traced_tokens)
        captured.extend(at.unbind(0))
    elif checkpoints is not None and captured is not None:
        captured.extend(found[m] for m in range(len(checkpoints.seq)))
    return out, state


def _traced_states(
    starts: torch.Tensor, v_new: torch.Tensor, g: torch.Tensor, k: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """[M, H, K, V]: one sequence's state after tokens[m] new tokens, the counts a tensor (a compiled graph): the
    end-state formula of the token's chunk cut at it. starts: [N, H, K, V] each chunk's start state; v_new: [H, N,
    C, V]; g (cumulative within each chunk), k: [H, N, C, K]."""
    chunk_size = g.shape[2]
    chunk, last = chunk_positions(tokens, chunk_size)  # [M] each
    g_m = g.index_select(1, chunk).transpose(0, 1)  # [M, H, C, K]
    at_r = g_m.gather(2, last[:, None, None, None].expand(-1, g_m.shape[1], 1, g_m.shape[3]))  # [M, H, 1, K]
    upto = torch.arange(chunk_size, device=tokens.device)[None, :] <= last[:, None]  # [M, C]
    # Masked before exp: past the token the exponent is positive and could overflow to inf (inf * 0 = nan).
    decay = torch.exp(torch.where(upto[:, None, :, None], at_r - g_m, float("-inf")))
    keys = k.index_select(1, chunk).transpose(0, 1) * decay  # [M, H, C, K]
    values = v_new.index_select(1, chunk).transpose(0, 1)  # [M, H, C, V]
    return starts.index_select(0, chunk) * at_r.exp().transpose(-1, -2) + keys.transpose(-1, -2) @ values


def recurrent_kda_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence. q, k, g: [B, H, K]; v: [B, H, V]; beta: [B, H]; state: [B, H, K, V] fp32."""
    q = q.float() * q.shape[-1] ** -0.5
    k = k.float()
    state = state * g.float().exp()[..., None]
    kv_mem = (k[..., None, :] @ state).squeeze(-2)
    delta = (v.float() - kv_mem) * beta.float()[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return (q[..., None, :] @ state).squeeze(-2), state
