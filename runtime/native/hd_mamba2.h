/* The Mamba2 mixer of the native step (hybrid_decode.c), as runtime/models/layers/mamba2.py computes a decode
 * token: in_proj → [z | xBC | dt]; the causal conv of xBC over the slot's conv window, then silu; the selective
 * state update of every head on the slot's fp32 state [heads, head_dim, state_size]
 *     dt = clamp(softplus(dt + dt_bias), dt_min, dt_max), state = state * exp(dt * A) + (dt * x) B, y = state C + D x
 * (B and C shared by the heads of a group); the grouped gated RMSNorm (y * silu(z), normalised per group of
 * heads); out_proj. Decode rows only (B sequences of one token): hd_decode refuses an extend chain over a Mamba2
 * layer, and the Python side never sends one.
 *
 * Threads: the conv splits by (sequence, group) (a group's B and C channels belong to one unit, so no window
 * rolls twice), the state update by (sequence, head): each unit reads and writes one head's state, head_dim x
 * state_size floats, once. */
#ifndef HYBRIDCTL_HD_MAMBA2_H
#define HYBRIDCTL_HD_MAMBA2_H

#include "hd_conv.h"
#include "hd_model.h"
#include "parallel.h"
#include "row_gemm.h"
#include "vexp.h"

#include <math.h>
#include <stdint.h>

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

/* Units (sequence b, group g): the conv of g's channels (its heads' x, its B, its C) on b's window. */
static void mamba_conv_groups(void *ctx, int64_t begin, int64_t end) {
    const MambaCtx *c = ctx;
    const HDLayer *L = c->L;
    const int64_t G = L->mg, N = L->mn, I = mamba_inner(L), span = L->mh / G * L->mp;
    const int64_t conv_dim = mamba_conv_dim(L), win = conv_dim * (L->kernel - 1);
    for (int64_t u = begin; u < end; u++) {
        const int64_t b = u / G, g = u % G;
        float *xbc = c->proj + b * mamba_width(L) + I;
        float *cs = c->s->conv_pool[L->ordinal] + c->s->state_slots[b] * win;
        conv_channels(L, xbc, cs, g * span, (g + 1) * span);
        conv_channels(L, xbc, cs, I + g * N, I + (g + 1) * N);
        conv_channels(L, xbc, cs, I + (G + g) * N, I + (G + g + 1) * N);
    }
}

/* Units (sequence b, head h): h's state update and output y = state C + D x. */
static void mamba_heads(void *ctx, int64_t begin, int64_t end) {
    const MambaCtx *c = ctx;
    const HDLayer *L = c->L;
    const int64_t nh = L->mh, P = L->mp, N = L->mn, G = L->mg, I = mamba_inner(L), W = mamba_width(L);
    for (int64_t u = begin; u < end; u++) {
        const int64_t b = u / nh, h = u % nh, g = h / (nh / G);
        const float *xbc = c->proj + b * W + I;
        const float *x = xbc + h * P, *Bg = xbc + I + g * N, *Cg = xbc + I + (G + g) * N;
        /* clamp as torch's clamp(min, max) does: the lower bound first */
        float dt = softplusf_(xbc[mamba_conv_dim(L) + h] + L->dt_bias[h]);
        dt = fminf(fmaxf(dt, (float)L->dt_min), (float)L->dt_max);
        const float decay = expf(dt * L->neg_a[h]), skip = L->d_skip[h];
        float *S = c->s->ssm_pool[L->ordinal] + (c->s->state_slots[b] * nh + h) * P * N; /* [P, N] */
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
    hp_parallel_for(B * G, 1, mamba_conv_groups, &c);
    hp_parallel_for(B * L->mh, 1, mamba_heads, &c);
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
