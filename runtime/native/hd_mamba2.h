/* The Mamba2 mixer of the native step (hybrid_decode.c), as runtime/models/layers/mamba2.py computes a decode
 * token: in_proj → [z | xBC | dt]; the causal conv of xBC over the slot's conv window, then silu; the selective
 * state update of every head on the slot's fp32 state [heads, head_dim, state_size]
 *     dt = clamp(softplus(dt + dt_bias), dt_min, dt_max), state = state * exp(dt * A) + (dt * x) B, y = state C + D x
 * (B and C shared by the heads of a group); the grouped gated RMSNorm (y * silu(z), normalised per group of
 * heads); out_proj. The B rows are B sequences of one token each (a decode step) or one sequence's B consecutive
 * tokens (an extend, HDStep.chain: the rows share one conv window and one state, so each unit runs them in token
 * order, as deltanet_chain does).
 *
 * Threads: the conv splits by (sequence, group) (a group's B and C channels belong to one unit, so no window
 * rolls twice), the state update by (sequence, head): each unit reads and writes one head's state, head_dim x
 * state_size floats, once. A chain's units are the groups, then the heads, each over every row in order; the conv
 * of every row runs before any state update (the update reads the conv's output only). */
#ifndef HYBRIDCTL_HD_MAMBA2_H
#define HYBRIDCTL_HD_MAMBA2_H

#include "hd_conv.h"
#include "hd_model.h"
#include "parallel.h"
#include "row_gemm.h"
#include "vexp.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const HDModel *m;
    const HDLayer *L;
    const HDStep *s;
    float *proj; /* [B, width]: z [I] | xBC [conv_dim] | dt [heads] */
    float *y; /* [B, I] */
} MambaCtx;

static inline int64_t mamba_inner(const HDLayer *L) { return L->mh * L->mp; }
static inline int64_t mamba_conv_dim(const HDLayer *L) { return mamba_inner(L) + 2 * L->mg * L->mn; }
static inline int64_t mamba_width(const HDLayer *L) { return mamba_inner(L) + mamba_conv_dim(L) + L->mh; }

/* Row b's conv of group g's channels (its heads' x, its B, its C) on `slot`'s window, which rolls by one. */
static void mamba_conv_row(const MambaCtx *c, int64_t b, int64_t g, int64_t slot) {
    const HDLayer *L = c->L;
    const int64_t G = L->mg, N = L->mn, I = mamba_inner(L), span = L->mh / G * L->mp;
    const int64_t win = mamba_conv_dim(L) * (L->kernel - 1);
    float *xbc = c->proj + b * mamba_width(L) + I;
    float *cs = c->s->conv_pool[L->ordinal] + slot * win;
    conv_channels(L, xbc, cs, g * span, (g + 1) * span);
    conv_channels(L, xbc, cs, I + g * N, I + (g + 1) * N);
    conv_channels(L, xbc, cs, I + (G + g) * N, I + (G + g + 1) * N);
}

/* Decode units (sequence b, group g): each its own slot. */
static void mamba_conv_groups(void *ctx, int64_t begin, int64_t end) {
    const MambaCtx *c = ctx;
    const int64_t G = c->L->mg;
    for (int64_t u = begin; u < end; u++) mamba_conv_row(c, u / G, u % G, c->s->state_slots[u / G]);
}

/* Group g's channels of `slot`'s conv window copied to slot `dst` (the three channel runs of mamba_conv_row). */
static void mamba_copy_conv(const HDLayer *L, const HDStep *s, int64_t g, int64_t slot, int64_t dst) {
    const int64_t G = L->mg, N = L->mn, I = mamba_inner(L), span = L->mh / G * L->mp, w = L->kernel - 1;
    const int64_t win = mamba_conv_dim(L) * w;
    const float *src = s->conv_pool[L->ordinal] + slot * win;
    float *out = s->conv_pool[L->ordinal] + dst * win;
    const int64_t c0[3] = {g * span, I + g * N, I + (G + g) * N}, cn[3] = {span, N, N};
    for (int r = 0; r < 3; r++) memcpy(out + c0[r] * w, src + c0[r] * w, (size_t)(cn[r] * w) * sizeof(float));
}

/* Extend units (group g): every row of the one sequence in token order on state_slots[0]; after row b, g's part
 * of the checkpoints taken after b + 1 tokens. */
static void mamba_conv_chain(void *ctx, int64_t begin, int64_t end) {
    const MambaCtx *c = ctx;
    const HDStep *s = c->s;
    const int64_t slot = s->state_slots[0];
    for (int64_t g = begin; g < end; g++)
        for (int64_t b = 0; b < s->batch; b++) {
            mamba_conv_row(c, b, g, slot);
            for (int64_t k = 0; k < s->n_checkpoints; k++)
                if (s->checkpoint_tokens[k] == b + 1) mamba_copy_conv(c->L, s, g, slot, s->checkpoint_slots[k]);
        }
}

/* Row b's head h: the state update on `slot`'s state and the output y = state C + D x. */
static void mamba_head_row(const MambaCtx *c, int64_t b, int64_t h, int64_t slot) {
    const HDLayer *L = c->L;
    const int64_t nh = L->mh, P = L->mp, N = L->mn, G = L->mg, I = mamba_inner(L), W = mamba_width(L);
    const int64_t g = h / (nh / G);
    const float *xbc = c->proj + b * W + I;
    const float *x = xbc + h * P, *Bg = xbc + I + g * N, *Cg = xbc + I + (G + g) * N;
    /* clamp as torch's clamp(min, max) does: the lower bound first */
    float dt = softplusf_(xbc[mamba_conv_dim(L) + h] + L->dt_bias[h]);
    dt = fminf(fmaxf(dt, (float)L->dt_min), (float)L->dt_max);
    const float decay = expf(dt * L->neg_a[h]), skip = L->d_skip[h];
    float *S = c->s->ssm_pool[L->ordinal] + (slot * nh + h) * P * N; /* [P, N] */
    float *yh = c->y + b * I + h * P;
    for (int64_t p = 0; p < P; p++) {
        const float dx = dt * x[p];
        float *row = S + p * N;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t n = 0; n < N; n++) {
            const float v = row[n] * decay + dx * Bg[n];
            row[n] = v;
            acc += v * Cg[n];
        }
        yh[p] = acc + skip * x[p];
    }
}

/* Decode units (sequence b, head h): each its own slot. */
static void mamba_heads(void *ctx, int64_t begin, int64_t end) {
    const MambaCtx *c = ctx;
    const int64_t nh = c->L->mh;
    for (int64_t u = begin; u < end; u++) mamba_head_row(c, u / nh, u % nh, c->s->state_slots[u / nh]);
}

/* Extend units (head h): every row in token order on state_slots[0]; after row b, h's state copied to the
 * checkpoints taken after b + 1 tokens. */
static void mamba_heads_chain(void *ctx, int64_t begin, int64_t end) {
    const MambaCtx *c = ctx;
    const HDStep *s = c->s;
    const HDLayer *L = c->L;
    const int64_t slot = s->state_slots[0], head = L->mp * L->mn;
    float *pool = s->ssm_pool[L->ordinal];
    for (int64_t h = begin; h < end; h++)
        for (int64_t b = 0; b < s->batch; b++) {
            mamba_head_row(c, b, h, slot);
            for (int64_t k = 0; k < s->n_checkpoints; k++)
                if (s->checkpoint_tokens[k] == b + 1)
                    memcpy(pool + (s->checkpoint_slots[k] * L->mh + h) * head, pool + (slot * L->mh + h) * head,
                           (size_t)head * sizeof(float));
        }
}

/* An extend with no cached prefix starts from a zero conv window and state, whatever the slot holds. */
static void mamba_fresh(const HDLayer *L, const HDStep *s) {
    const int64_t slot = s->state_slots[0], win = mamba_conv_dim(L) * (L->kernel - 1), state = L->mh * L->mp * L->mn;
    memset(s->conv_pool[L->ordinal] + slot * win, 0, (size_t)win * sizeof(float));
    memset(s->ssm_pool[L->ordinal] + slot * state, 0, (size_t)state * sizeof(float));
}

static int64_t mamba2_scratch(const HDLayer *L, int64_t B) { return B * (mamba_width(L) + mamba_inner(L)); }

static int mamba2(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work,
                  GemmSet *g) {
    const int64_t B = s->batch, H = m->hidden, I = mamba_inner(L), W = mamba_width(L), G = L->mg;
    MambaCtx c = {m, L, s, work, work + B * W};
    gemm_add(g, L->w_in, L->b_in, W, H, xn, H, B, c.proj, W);
    gemm_run(g);
    if (L->in_proj_mul) /* Falcon-H1's ssm_multipliers: each in_proj row's output times its section's */
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < W; j++) c.proj[b * W + j] *= L->in_proj_mul[j];
    if (s->chain) {
        if (s->fresh) mamba_fresh(L, s);
        hp_parallel_for(G, 1, mamba_conv_chain, &c);
        hp_parallel_for(L->mh, 1, mamba_heads_chain, &c);
    } else {
        hp_parallel_for(B * G, 1, mamba_conv_groups, &c);
        hp_parallel_for(B * L->mh, 1, mamba_heads, &c);
    }
    /* The gated norm per group of I / G channels: its heads' y times silu(z), RMS-normalised, times the weight. */
    const int64_t span = I / G;
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < G; k++) {
            float *yk = c.y + b * I + k * span;
            const float *zk = c.proj + b * W + k * span;
            if (L->gate_mode == HD_NORM_THEN_GATE) rms_norm(yk, L->gnorm_w + k * span, span, m->eps, yk);
            silu_mul(yk, zk, yk, span);
            if (L->gate_mode == HD_GATE_GROUP_NORM) rms_norm(yk, L->gnorm_w + k * span, span, m->eps, yk);
        }
    gemm_add(g, L->w_out, L->b_out, H, I, c.y, I, B, out, H);
    gemm_run(g);
    return HD_OK;
}

#endif
