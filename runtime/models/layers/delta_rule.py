"""The gated delta rule: chunked form for prefill, one recurrent step for decode.

State S per head is [k_dim, v_dim]; per token: S = exp(g) S; S += k ⊗ beta (v - Sᵀk); out = Sᵀq.
The chunked form follows transformers' `torch_chunk_gated_delta_rule` (UT transform per chunk, one sequential
step per chunk), so a long prompt costs L / chunk_size Python iterations, not L.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.core.threads import intra_op_threads
from runtime.models.layers.state_checkpoints import StateCheckpoints, chunk_positions

# Exponents go through exp clamped to ±80: outside about ±87.3 the result is denormal, 0 or inf and torch's
# vectorized exp takes a slow path, 4-35x the time per element (1M elements, one thread: 0.9 ms vs 3.8-31 ms).
# A fast-forgetting head's cumulative gate reaches -1000 within a chunk, and the pairwise differences are
# positive (masked out afterwards) above the diagonal. exp(-80) = 1.8e-35 then stands in for anything
# smaller: a term that small vanishes next to any other (fp32 keeps ~7 digits).
_EXP_LIMIT = 80.0
# Tokens per chunk. The intra-chunk work grows with the chunk (L x C), the sequential loop with L / C; with the
# inverse in matmuls, 32 is the faster side for head dims 32-64 (6 captured demo-model GDN layers, 2048 tokens,
# one thread: 91 ms at 32 vs 109 ms at 64; the peer model's 64-dim heads: 82 vs 101 ms). A divisor of the
# scheduler's default checkpoint interval (64), so those checkpoints stay on the chunk grid.
DEFAULT_CHUNK = 32
# The chunk loop runs on one thread when a chunk's two matmuls are at most this many multiply-adds.
_SERIAL_LOOP_MAX_MACS = 1 << 23


def _decay(log_decay: torch.Tensor) -> torch.Tensor:
    """exp of a cumulative log-decay, its argument clamped to ±_EXP_LIMIT."""
    return log_decay.clamp(-_EXP_LIMIT, _EXP_LIMIT).exp_()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK,
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
    # A short extend (a speculative verify, a draft's catch-up) padded to a full chunk costs ~15x its
    # own size (demo model, 4 tokens: 3.8 ms vs 0.26 ms per layer); any chunk size gives the same result.
    chunk_size = min(chunk_size, 1 << (length - 1).bit_length())
    pad = (chunk_size - length % chunk_size) % chunk_size
    n_chunks = (length + pad) // chunk_size
    rows = batch * heads  # (sequence, head) pairs: the batch axis of every matmul below

    def chunked(x: torch.Tensor) -> torch.Tensor:
        """[B, L, H, ...] → [n_chunks, B*H, chunk, ...] fp32: chunk-major, so each chunk's slice that the loop
        reads and writes is contiguous (a strided slice makes an in-place baddbmm fall back to one addmm per
        matrix)."""
        per_token = x.dim() == 3  # g and beta: one value per (token, head)
        x = x.float()[..., None] if per_token else x.float()
        if pad:
            x = F.pad(x, (0, 0, 0, 0, 0, pad))
        x = (
            x.view(batch, n_chunks, chunk_size, heads, -1)
            .permute(1, 0, 3, 2, 4)
            .reshape(n_chunks, rows, chunk_size, -1)
        )
        x = x.contiguous()  # reshape alone returns a strided view when B == 1
        return x[..., 0] if per_token else x

    q, k, v, beta, g = (chunked(x) for x in (q, k, v, beta, g))
    q = q * dk**-0.5
    cum = g.cumsum(dim=-1)  # [N, R, C]
    cum_exp = _decay(cum)[..., None]
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    pair_decay = _decay(cum[..., :, None] - cum[..., None, :]).masked_fill_(upper, 0.0)
    k_beta = k * beta[..., None]
    ut_system = (k_beta @ k.transpose(-1, -2)).mul_(pair_decay)
    intra = (q @ k.transpose(-1, -2)).mul_(pair_decay)
    ut_inverse = unit_lower_inverse(ut_system.view(-1, chunk_size, chunk_size)).view_as(ut_system)
    new_values = ut_inverse @ (v * beta[..., None])
    k_cumdecay = ut_inverse @ (k_beta * cum_exp)
    raw_k = k  # a checkpoint inside a chunk decays the keys to its own position, not the chunk's end
    k_to_end = (k * _decay(cum[..., -1:] - cum)[..., None]).transpose(-1, -2)  # [N, R, Dk, C]
    chunk_decay = _decay(cum[..., -1])[..., None, None]  # [N, R, 1, 1]
    # by_value[i]: the state entering chunk i, stored [Dv, Dk] as the pool holds it (by_value[n_chunks]: the
    # final state), so states go into pool slots as plain copies, not transposing ones; `states` is the same
    # memory seen [Dk, Dv], as the equations use it. The loop carries only the state; each chunk's output is one
    # batched matmul pair after it.
    by_value = torch.empty(n_chunks + 1, rows, dv, dk, dtype=torch.float32, device=q.device)
    states = by_value.transpose(-1, -2)
    states[0] = initial_state.float().reshape(rows, dk, dv)
    # Each chunk is two small batched matmuls; below ~8M multiply-adds a chunk (the demo model: 1M) waking a
    # sleeping OpenMP worker for each costs more than the second thread saves.
    serial = 2 * rows * chunk_size * dk * dv <= _SERIAL_LOOP_MAX_MACS
    with intra_op_threads(1 if serial else torch.get_num_threads()):
        for i in range(n_chunks):
            v_new = new_values[i]
            v_new.baddbmm_(k_cumdecay[i], states[i], alpha=-1)  # in place: new_values becomes the corrected values
            # Transposed, so the product lands in by_value's own layout: S' = decay S + k_endᵀ v_new.
            torch.mul(by_value[i], chunk_decay[i], out=by_value[i + 1])
            by_value[i + 1].baddbmm_(v_new.transpose(-1, -2), k_to_end[i].transpose(-1, -2))
    out = torch.baddbmm(
        (intra @ new_values).view(-1, chunk_size, dv),
        (q * cum_exp).view(-1, chunk_size, dk),
        by_value[:n_chunks].view(-1, dv, dk).transpose(-1, -2),
    )
    out = out.view(n_chunks, batch, heads, chunk_size, dv).permute(1, 0, 3, 2, 4).reshape(batch, -1, heads, dv)
    out = out[:, :length]
    if checkpoints is not None and captured is not None:
        captured.extend(_checkpoint_states(states, cum, raw_k, new_values, checkpoints, batch, heads))
    return out, by_value[n_chunks].view(batch, heads, dv, dk).transpose(-1, -2)


def unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """[N, C, C] → the inverse of I + (a's strictly lower triangle), C a power of two; what the UT transform
    needs, in batched matmuls only. torch's batched triangular solve is one LAPACK call per matrix, each its
    own OpenMP region: with 2 threads and sleeping workers that is 512 thread wake-ups and ~37 ms for the
    demo model's 256 matrices of 64x64, vs ~2 ms for this.

    Diagonal blocks of up to 16 are inverted as a product of Neumann factors, (I + A)⁻¹ = (I - A)(I + A²)(I + A⁴)
    (I + A⁸) (A is nilpotent), then merged pairwise up to C: [[L11, 0], [L21, L22]]⁻¹ has T22 = L22⁻¹,
    T11 = L11⁻¹ and T21 = -T22 L21 T11."""
    n, size, _ = a.shape
    if size & (size - 1):
        raise ValueError(f"unit_lower_inverse: matrix size {size} is not a power of two")
    out = a.tril(-1)
    base = min(16, size)
    blocks = _diagonal_blocks(out, base)
    nilpotent = blocks.reshape(-1, base, base)
    inverse = torch.eye(base, dtype=a.dtype, device=a.device) - nilpotent
    power, span = nilpotent, 2
    while span < base:
        power = power @ power
        inverse = torch.baddbmm(inverse, inverse, power)
        span *= 2
    blocks.copy_(inverse.view(blocks.shape))
    half = base
    while half < size:
        merged = _diagonal_blocks(out, 2 * half)
        merged[..., half:, :half] = -(
            merged[..., half:, half:] @ (merged[..., half:, :half] @ merged[..., :half, :half])
        )
        half *= 2
    return out


def _diagonal_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """[N, C, C] → a [N, C / block, block, block] view of its diagonal blocks."""
    n, size, _ = x.shape
    return x.as_strided((n, size // block, block, block), (size * size, block * size + block, size, 1))


def _checkpoint_states(
    states: torch.Tensor,
    cum: torch.Tensor,
    raw_k: torch.Tensor,
    v_new: torch.Tensor,
    checkpoints: StateCheckpoints,
    batch: int,
    heads: int,
) -> list[torch.Tensor]:
    """[H, Dk, Dv] per checkpoint, in checkpoint order. On the chunk grid a checkpoint is one of the chunk loop's
    states; inside a chunk it is that chunk's start state advanced by the chunk's first r tokens."""
    n_chunks, chunk_size = cum.shape[0], cum.shape[2]
    per_seq = states.transpose(-1, -2).reshape(n_chunks + 1, batch, heads, *states.shape[-1:-3:-1]).transpose(-1, -2)
    split = (n_chunks, batch, heads, chunk_size)
    if checkpoints.traced_tokens is not None:  # one sequence, counts as a tensor: every one by the formula
        n = checkpoints.traced_tokens
        chunks, last = chunk_positions(n, chunk_size)
        at = _states_at(
            per_seq, cum.view(split), raw_k.view(*split, -1), v_new.view(*split, -1), torch.zeros_like(n), chunks, last
        )
        return list(at.unbind(0))
    found: list[torch.Tensor | None] = [None] * len(checkpoints.seq)
    inside: list[tuple[int, int, int, int]] = []
    for m, (b, tokens) in enumerate(zip(checkpoints.seq, checkpoints.tokens, strict=True)):
        chunk, r = divmod(tokens, chunk_size)
        if r == 0:
            found[m] = per_seq[chunk, b]
        else:
            inside.append((m, b, chunk, r))
    if inside:
        computed = _states_inside_chunks(
            per_seq, cum.view(split), raw_k.view(*split, -1), v_new.view(*split, -1), inside
        )
        for j, (m, _, _, _) in enumerate(inside):
            found[m] = computed[j]
    return [s for s in found if s is not None]


def _states_inside_chunks(
    starts: torch.Tensor,
    cum: torch.Tensor,
    raw_k: torch.Tensor,
    v_new: torch.Tensor,
    inside: list[tuple[int, int, int, int]],
) -> torch.Tensor:
    """[M, H, Dk, Dv]: for each (m, b, chunk, r) of `inside`, sequence b's state after the first r tokens of
    that chunk, i.e. the chunk's end-state formula cut at r (v_new of a token depends only on earlier tokens:
    the UT system is lower triangular). One batched matmul for all of them: a verify forward wants the state
    after every token, and one small op chain per checkpoint cost more than the chunk itself.
    starts: [N+1, B, H, Dk, Dv]; cum: [N, B, H, C]; raw_k, v_new: [N, B, H, C, D]."""
    device = starts.device
    seqs = torch.tensor([b for _, b, _, _ in inside], device=device)
    chunks = torch.tensor([c for _, _, c, _ in inside], device=device)
    last = torch.tensor([r - 1 for _, _, _, r in inside], device=device)
    return _states_at(starts, cum, raw_k, v_new, seqs, chunks, last)


def _states_at(
    starts: torch.Tensor,
    cum: torch.Tensor,
    raw_k: torch.Tensor,
    v_new: torch.Tensor,
    seqs: torch.Tensor,
    chunks: torch.Tensor,
    last: torch.Tensor,
) -> torch.Tensor:
    """[M, H, Dk, Dv]: sequence seqs[m]'s state after token last[m] (0-based) of chunk chunks[m]."""
    device = starts.device
    window = cum[chunks, seqs]  # [M, H, C]
    at_r = window.gather(-1, last[:, None, None].expand(-1, window.shape[1], 1))  # [M, H, 1]
    after_r = torch.arange(window.shape[-1], device=device)[None, :] > last[:, None]  # [M, C]
    decay_to_r = _decay(at_r - window).masked_fill_(after_r[:, None, :], 0.0)[..., None]  # [M, H, C, 1]
    keys = raw_k[chunks, seqs] * decay_to_r
    return starts[chunks, seqs] * _decay(at_r)[..., None] + keys.transpose(-1, -2) @ v_new[chunks, seqs]


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
    k_row = k[..., None, :]  # [B, H, 1, Dk], used twice
    state = state_vk * g.float().exp()[..., None, None]
    kv_mem = (state * k_row).sum(-1)  # [B, H, Dv]
    delta = (v.float() - kv_mem) * beta.float()[..., None]
    state.addcmul_(delta[..., :, None], k_row)
    out = (state * q[..., None, :]).sum(-1)
    return out, state
