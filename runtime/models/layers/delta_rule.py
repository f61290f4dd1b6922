"""The gated delta rule: chunked form for prefill, one recurrent step for decode.

State S per head is [k_dim, v_dim]; per token: S = exp(g) S; S += k ⊗ beta (v - Sᵀk); out = Sᵀq.
The chunked form follows transformers' `torch_chunk_gated_delta_rule` (UT transform per chunk, one sequential
step per chunk), so a long prompt costs L / chunk_size Python iterations, not L.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.models.layers.state_checkpoints import StateCheckpoints


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta_rule(
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
    """q, k: [B, L, H, Dk] (already l2-normalized, heads expanded to H); v: [B, L, H, Dv]; g, beta: [B, L, H];
    initial_state: [B, H, Dk, Dv].

    Padded steps must carry g = 0 and beta = 0: they then neither decay nor write the state.
    Returns (out [B, L, H, Dv] fp32, final state [B, H, Dk, Dv] fp32). With `checkpoints`, `captured` receives
    the state [H, Dk, Dv] after each checkpoint's token count, in checkpoint order.
    """
    batch, length, heads, dk = k.shape
    dv = v.shape[-1]
    q, k, v, beta, g = (x.transpose(1, 2).float().contiguous() for x in (q, k, v, beta, g))
    q = q * dk**-0.5
    # A short extend (a speculative verify, a draft's catch-up) padded to a 64-token chunk costs ~15x its
    # own size (demo model, 4 tokens: 3.8 ms vs 0.26 ms per layer); any chunk size gives the same result.
    chunk_size = min(chunk_size, 1 << (length - 1).bit_length())
    pad = (chunk_size - length % chunk_size) % chunk_size
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    n_chunks = (length + pad) // chunk_size
    v_beta = v * beta[..., None]
    k_beta = k * beta[..., None]
    q, k, k_beta, v_beta = (x.view(batch, heads, n_chunks, chunk_size, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.view(batch, heads, n_chunks, chunk_size)
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    cum = g.cumsum(dim=-1)
    pair_decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    ut_system = (k_beta @ k.transpose(-1, -2)) * pair_decay
    intra = (q @ k.transpose(-1, -2)) * pair_decay
    cum_exp = cum.exp()[..., None]
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, k_beta * cum_exp, upper=False, unitriangular=True)
    q = q * cum_exp
    raw_k = k  # a checkpoint inside a chunk decays the keys to its own position, not the chunk's end
    k = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]
    state = initial_state.float()
    # The loop carries only the state; each chunk's output needs its start state and corrected values, so it
    # is one batched matmul pair after the loop instead of two small matmuls per chunk.
    starts = torch.empty(batch, heads, n_chunks, dk, dv, dtype=torch.float32, device=q.device)
    found: dict[int, torch.Tensor] = {}
    for i in range(n_chunks):
        starts[:, :, i] = state
        v_new = new_values[:, :, i]
        v_new -= k_cumdecay[:, :, i] @ state  # in place: new_values becomes the corrected values
        new_state = state * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
        if checkpoints is not None:
            inside = []
            for m, b, r in checkpoints.in_chunk(i, chunk_size):
                if r == chunk_size:
                    found[m] = new_state[b]
                else:
                    inside.append((m, b, r))
            if inside:
                states = _states_inside_chunk(state, cum, raw_k, v_new, inside, i)
                found.update((m, states[j]) for j, (m, _, _) in enumerate(inside))
        state = new_state
    out = q @ starts + intra @ new_values
    out = out.view(batch, heads, -1, dv)[:, :, :length].transpose(1, 2)
    if checkpoints is not None and captured is not None:
        captured.extend(found[m] for m in range(len(checkpoints.seq)))
    return out, state


def _states_inside_chunk(
    start: torch.Tensor,
    cum: torch.Tensor,
    raw_k: torch.Tensor,
    v_new: torch.Tensor,
    inside: list[tuple[int, int, int]],
    i: int,
) -> torch.Tensor:
    """[M, H, Dk, Dv]: for each (m, b, r) of `inside`, sequence b's state after the first r tokens of chunk i,
    i.e. the chunk's end-state formula cut at r (v_new of a token depends only on earlier tokens: the UT system
    is lower triangular). One batched matmul for all of them: a verify forward wants the state after every
    token, and one small op chain per checkpoint cost more than the chunk itself."""
    seqs = torch.tensor([b for _, b, _ in inside], device=start.device)
    last = torch.tensor([r - 1 for _, _, r in inside], device=start.device)
    chunk = cum[seqs, :, i]  # [M, H, C]
    at_r = chunk.gather(-1, last[:, None, None].expand(-1, chunk.shape[1], 1))  # [M, H, 1]
    after_r = torch.arange(chunk.shape[-1], device=start.device)[None, :] > last[:, None]  # [M, C]
    decay_to_r = (at_r - chunk).masked_fill(after_r[:, None, :], float("-inf")).exp()[..., None]  # [M, H, C, 1]
    keys = raw_k[seqs, :, i] * decay_to_r
    return start[seqs] * at_r.exp()[..., None] + keys.transpose(-1, -2) @ v_new[seqs]


def recurrent_gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_vk: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence. q, k: [B, H, Dk] (l2-normalized); v: [B, H, Dv]; g, beta: [B, H];
    state_vk: [B, H, Dv, Dk] fp32 — the pool's (SGLang's) layout, the transpose of the chunked form's.
    Returns (out [B, H, Dv] fp32, new state [B, H, Dv, Dk])."""
    q = q.float() * q.shape[-1] ** -0.5
    k = k.float()
    # Broadcast multiply + sum instead of batched mat-vecs: B*H tiny matmuls cost ~3x more CPU at decode sizes.
    state = state_vk * g.float().exp()[..., None, None]
    kv_mem = (state * k[..., None, :]).sum(-1)  # [B, H, Dv]
    delta = (v.float() - kv_mem) * beta.float()[..., None]
    state.addcmul_(delta[..., :, None], k[..., None, :])
    out = (state * q[..., None, :]).sum(-1)
    return out, state
