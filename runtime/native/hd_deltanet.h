/* The gated DeltaNet mixer of the native step (hybrid_decode.c): projections, causal conv, delta-rule recurrence,
 * gated norm and output projection, for B rows: B sequences of one token each (a decode step, parallel over
 * (sequence, key head)), or one sequence's B consecutive tokens (an extend, HDStep.chain: the rows share one conv
 * window and one state, so they run in token order inside a key head's unit, parallel over key heads only). */
#ifndef HYBRIDCTL_HD_DELTANET_H
#define HYBRIDCTL_HD_DELTANET_H

#include "hd_conv.h"
#include "hd_model.h"
#include "parallel.h"
#include "vexp.h"

#include <string.h>


typedef struct {
    const HDModel *m;
    const HDLayer *L;
    const HDStep *s;
    float *mixed, *z, *bb, *aa, *o, *qn;
} DeltaCtx;

/* Key head kh's conv channels: its q, k and v channels start at c0[0..2], cn[0..2] of each (those of two key heads
 * never overlap). */
static inline void head_channels(const HDLayer *L, int64_t kh, int64_t c0[3], int64_t cn[3]) {
    const int64_t key_dim = L->nk * L->dk, ratio = L->nv / L->nk;
    c0[0] = kh * L->dk, cn[0] = L->dk;
    c0[1] = key_dim + kh * L->dk, cn[1] = L->dk;
    c0[2] = 2 * key_dim + kh * ratio * L->dv, cn[2] = ratio * L->dv;
}

/* Row b's key head kh: the conv of kh's q, k and v channels (the window of `slot` rolls by one), then the
 * recurrence of kh's value heads on `slot`'s state. The channels and states of two key heads never overlap. */
static void deltanet_row(const DeltaCtx *d, int64_t b, int64_t kh, int64_t slot) {
    const HDModel *m = d->m;
    const HDLayer *L = d->L;
    const HDStep *s = d->s;
    const int64_t key_dim = L->nk * L->dk, value_dim = L->nv * L->dv, conv_dim = 2 * key_dim + value_dim;
    const int64_t width = L->kernel - 1, ratio = L->nv / L->nk;
    const float qscale = 1.0f / sqrtf((float)L->dk);
    float *mx = d->mixed + b * conv_dim;
    float *cs = s->conv_pool[L->ordinal] + slot * conv_dim * width;
    float *qn = d->qn + b * 2 * key_dim;
    int64_t c0[3], cn[3];
    head_channels(L, kh, c0, cn);
    for (int r = 0; r < 3; r++) conv_channels(L, mx, cs, c0[r], c0[r] + cn[r]);
    /* l2-normalized q and k of this key head (q also scaled by dk^-0.5, as the recurrent step does). */
    for (int64_t h = kh; h < 2 * L->nk; h += L->nk) {
        const float *src = mx + h * L->dk;
        float *dst = qn + h * L->dk;
        const float r = 1.0f / sqrtf(dot(src, src, L->dk) + 1e-6f);
        for (int64_t i = 0; i < L->dk; i++) dst[i] = src[i] * r;
        if (h < L->nk)
            for (int64_t i = 0; i < L->dk; i++) dst[i] *= qscale;
    }
    const float *v = mx + 2 * key_dim;
    const float *q = qn + kh * L->dk, *k = qn + key_dim + kh * L->dk;
    for (int64_t h = kh * ratio; h < (kh + 1) * ratio; h++) {
        const float beta = sigmoidf_(d->bb[b * L->nv + h]);
        const float decay = expf(L->neg_a[h] * softplusf_(d->aa[b * L->nv + h] + L->dt_bias[h]));
        float *S = s->ssm_pool[L->ordinal] + ((slot * L->nv + h) * L->dv) * L->dk; /* [dv, dk] */
        float *oh = d->o + b * value_dim + h * L->dv;
        /* The delta rule S' = decay S + k (x) delta, delta = beta (v - decay S.k), out = S'.q, as
         * out = decay S.q + delta (k.q): each state row is read once for both of its dot products, then written
         * once (before: decayed and stored, re-read for the update, re-read for the output; ~13 % of an extend's
         * CPU). Decode and extend rows both come here, so they agree bit for bit. */
        const int64_t dk = L->dk, dv = L->dv; /* locals: the state's stores could alias *L */
        const float kq = dot(k, q, dk);
        int64_t i = 0;
#ifdef __AVX2__
        if (dk % 8 == 0)
            for (const __m256 dc = _mm256_set1_ps(decay); i + 2 <= dv; i += 2) {
                float *r0 = S + i * dk, *r1 = r0 + dk;
                __m256 k0 = _mm256_setzero_ps(), q0 = k0, k1 = k0, q1 = k0;
                for (int64_t j = 0; j < dk; j += 8) {
                    const __m256 kv = _mm256_loadu_ps(k + j), qv = _mm256_loadu_ps(q + j);
                    const __m256 a = _mm256_loadu_ps(r0 + j), b = _mm256_loadu_ps(r1 + j);
                    k0 = HD_FMA(a, kv, k0), q0 = HD_FMA(a, qv, q0);
                    k1 = HD_FMA(b, kv, k1), q1 = HD_FMA(b, qv, q1);
                }
                float sums[4]; /* S_i.k, S_i.q, S_i+1.k, S_i+1.q */
                _mm_storeu_ps(sums, hsum4(k0, q0, k1, q1));
                const float d0 = (v[h * dv + i] - decay * sums[0]) * beta;
                const float d1 = (v[h * dv + i + 1] - decay * sums[2]) * beta;
                oh[i] = decay * sums[1] + d0 * kq;
                oh[i + 1] = decay * sums[3] + d1 * kq;
                const __m256 e0 = _mm256_set1_ps(d0), e1 = _mm256_set1_ps(d1);
                for (int64_t j = 0; j < dk; j += 8) {
                    const __m256 kv = _mm256_loadu_ps(k + j);
                    _mm256_storeu_ps(r0 + j, HD_FMA(e0, kv, _mm256_mul_ps(dc, _mm256_loadu_ps(r0 + j))));
                    _mm256_storeu_ps(r1 + j, HD_FMA(e1, kv, _mm256_mul_ps(dc, _mm256_loadu_ps(r1 + j))));
                }
            }
#endif
        for (; i < dv; i++) {
            float *row = S + i * dk;
            const float sk = dot(row, k, dk), sq = dot(row, q, dk);
            const float delta = (v[h * dv + i] - decay * sk) * beta;
            oh[i] = decay * sq + delta * kq;
            for (int64_t j = 0; j < dk; j++) row[j] = fmaf(delta, k[j], decay * row[j]);
        }
        /* Gated RMSNorm: norm(o) * w * silu(z). */
        const float *zh = d->z + b * value_dim + h * L->dv;
        rms_norm(oh, L->gnorm_w, L->dv, m->eps, oh);
        silu_mul(oh, zh, oh, L->dv);
    }
}

/* Decode units (sequence b, key head kh): each its own slot. */
static void deltanet_heads(void *ctx, int64_t begin, int64_t end) {
    const DeltaCtx *d = ctx;
    const int64_t nk = d->L->nk;
    for (int64_t u = begin; u < end; u++) deltanet_row(d, u / nk, u % nk, d->s->state_slots[u / nk]);
}

/* Key head kh's part of `slot`'s conv window (its q, k and v channels) and recurrent state (its value heads),
 * copied to slot `dst`: the key heads' parts never overlap, so each extend unit copies its own. */
static void deltanet_copy_head(const HDLayer *L, const HDStep *s, int64_t kh, int64_t slot, int64_t dst) {
    const int64_t key_dim = L->nk * L->dk, conv_dim = 2 * key_dim + L->nv * L->dv;
    const int64_t width = L->kernel - 1, ratio = L->nv / L->nk;
    const float *cs = s->conv_pool[L->ordinal] + slot * conv_dim * width;
    float *cd = s->conv_pool[L->ordinal] + dst * conv_dim * width;
    int64_t c0[3], cn[3];
    head_channels(L, kh, c0, cn);
    for (int r = 0; r < 3; r++)
        memcpy(cd + c0[r] * width, cs + c0[r] * width, (size_t)(cn[r] * width) * sizeof(float));
    const int64_t head = L->dv * L->dk, first = kh * ratio;
    const float *S = s->ssm_pool[L->ordinal] + (slot * L->nv + first) * head;
    memcpy(s->ssm_pool[L->ordinal] + (dst * L->nv + first) * head, S, (size_t)(ratio * head) * sizeof(float));
}

/* Extend units (key head kh): every row of the one sequence in token order, on state_slots[0]; after row b, the
 * checkpoints taken after b + 1 tokens. */
static void deltanet_chain(void *ctx, int64_t begin, int64_t end) {
    const DeltaCtx *d = ctx;
    const HDStep *s = d->s;
    const int64_t B = s->batch, nk = d->L->nk, slot = s->state_slots[0];
    for (int64_t kh = begin; kh < end; kh++)
        for (int64_t b = 0; b < B; b++) {
            hd_prefetch_ffn(d->L, d->m->hidden, b * nk + kh, B * nk); /* the MoE after this mixer: see hd_model.h */
            deltanet_row(d, b, kh, slot);
            for (int64_t c = 0; c < s->n_checkpoints; c++)
                if (s->checkpoint_tokens[c] == b + 1) deltanet_copy_head(d->L, s, kh, slot, s->checkpoint_slots[c]);
        }
}

static int64_t deltanet_scratch(const HDLayer *L, int64_t B) {
    const int64_t vd = L->nv * L->dv, conv = 2 * L->nk * L->dk + vd;
    return B * (conv + 2 * vd + 2 * L->nv + 2 * L->nk * L->dk);
}

static int deltanet(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work,
                    GemmSet *g) {
    const int64_t B = s->batch, H = m->hidden;
    const int64_t key_dim = L->nk * L->dk, value_dim = L->nv * L->dv, conv_dim = 2 * key_dim + value_dim;
    DeltaCtx d = {m, L, s, work, NULL, NULL, NULL, NULL, NULL};
    d.z = d.mixed + B * conv_dim; /* [B, value_dim] */
    d.bb = d.z + B * value_dim; /* [B, nv] */
    d.aa = d.bb + B * L->nv; /* [B, nv] */
    d.o = d.aa + B * L->nv; /* [B, value_dim] */
    d.qn = d.o + B * value_dim; /* [B, 2 * nk * dk] */
    gemm_add(g, L->w_qkv, NULL, conv_dim, H, xn, H, B, d.mixed, conv_dim);
    gemm_add(g, L->w_z, NULL, value_dim, H, xn, H, B, d.z, value_dim);
    gemm_add(g, L->w_b, NULL, L->nv, H, xn, H, B, d.bb, L->nv);
    gemm_add(g, L->w_a, NULL, L->nv, H, xn, H, B, d.aa, L->nv);
    gemm_run(g);
    if (s->chain) {
        if (s->fresh) {
            const int64_t slot = s->state_slots[0], width = L->kernel - 1, state = L->nv * L->dv * L->dk;
            memset(s->conv_pool[L->ordinal] + slot * conv_dim * width, 0, (size_t)(conv_dim * width) * sizeof(float));
            memset(s->ssm_pool[L->ordinal] + slot * state, 0, (size_t)state * sizeof(float));
        }
        hp_parallel_for(L->nk, 1, deltanet_chain, &d);
    } else {
        hp_parallel_for(B * L->nk, 1, deltanet_heads, &d);
    }
    gemm_add(g, L->w_out, NULL, H, value_dim, d.o, value_dim, B, out, H);
    gemm_run(g);
    return HD_OK;
}

#endif
