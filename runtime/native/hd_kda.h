/* The Kimi Delta Attention mixer of the native step (hybrid_decode.c; runtime/models/kimi_linear.py's
 * KimiDeltaAttention in decode): q, k, v projections, their depthwise causal conv (the pool in SGLang's
 * [slot, kernel - 1, channels] layout) and silu, l2-normalized q (times dk^-0.5) and k, the gated delta rule with a
 * per-channel decay g = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias) and beta = sigmoid(b(x)) on the state
 * [slot, heads, dk, dv], then RMSNorm(o) * w * sigmoid(g_b(g_a(x))) and the output projection. Decode rows only
 * (B sequences of one token), parallel over (sequence, head): the heads' channels and states never overlap. */
#ifndef HYBRIDCTL_HD_KDA_H
#define HYBRIDCTL_HD_KDA_H

#include "hd_model.h"
#include "parallel.h"
#include "vexp.h"

#include <string.h>

typedef struct {
    const HDModel *m;
    const HDLayer *L;
    const HDStep *s;
    float *mixed, *fa, *ga, *bb, *ff, *gg, *o, *kvm;
} KdaCtx;

/* The conv of channels [c0, c1) of one sequence; the window cs is [kernel - 1, C] (C channels a row). */
static void kda_conv(const HDLayer *L, float *mx, float *cs, int64_t C, int64_t c0, int64_t c1) {
    const int64_t width = L->kernel - 1;
    for (int64_t c = c0; c < c1; c++) {
        const float *w = L->conv_w + c * L->kernel;
        const float xv = mx[c];
        float acc = 0.0f;
        for (int64_t t = 0; t < width; t++) acc += cs[t * C + c] * w[t];
        acc += xv * w[width];
        for (int64_t t = 0; t + 1 < width; t++) cs[t * C + c] = cs[(t + 1) * C + c];
        if (width > 0) cs[(width - 1) * C + c] = xv;
        mx[c] = acc;
    }
    silu_inplace(mx + c0, c1 - c0);
}

static void kda_row(const KdaCtx *d, int64_t b, int64_t h, int64_t slot) {
    const HDLayer *L = d->L;
    const HDStep *s = d->s;
    const int64_t dk = L->dk, dim = L->nk * dk, C = 3 * dim, width = L->kernel - 1;
    float *mx = d->mixed + b * C;
    float *cs = s->conv_pool[L->ordinal] + slot * width * C;
    for (int r = 0; r < 3; r++) kda_conv(L, mx, cs, C, r * dim + h * dk, r * dim + (h + 1) * dk);
    float *q = mx + h * dk, *k = mx + dim + h * dk;
    const float *v = mx + 2 * dim + h * dk;
    const float rq = 1.0f / sqrtf(dot(q, q, dk) + 1e-6f), rk = 1.0f / sqrtf(dot(k, k, dk) + 1e-6f);
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int64_t i = 0; i < dk; i++) q[i] = q[i] * rq * qscale, k[i] = k[i] * rk;
    const float beta = sigmoidf_(d->bb[b * L->nk + h]);
    const float *f = d->ff + b * dim + h * dk;
    float *kvm = d->kvm + b * dim + h * dk, *oh = d->o + b * dim + h * dk;
    float *S = s->ssm_pool[L->ordinal] + (slot * L->nk + h) * dk * dk; /* [dk, dv], dv == dk */
    for (int64_t j = 0; j < dk; j++) kvm[j] = 0.0f, oh[j] = 0.0f;
    /* state *= exp(g) per key channel (row); kv_mem = k.state */
    for (int64_t i = 0; i < dk; i++) {
        const float decay = expf(L->neg_a[h] * softplusf_(f[i] + L->dt_bias[h * dk + i]));
        float *row = S + i * dk;
        for (int64_t j = 0; j < dk; j++) row[j] *= decay;
        for (int64_t j = 0; j < dk; j++) kvm[j] += k[i] * row[j];
    }
    for (int64_t j = 0; j < dk; j++) kvm[j] = (v[j] - kvm[j]) * beta; /* delta */
    for (int64_t i = 0; i < dk; i++) {
        float *row = S + i * dk;
        for (int64_t j = 0; j < dk; j++) row[j] = row[j] + k[i] * kvm[j];
        for (int64_t j = 0; j < dk; j++) oh[j] += q[i] * row[j];
    }
    rms_norm(oh, L->gnorm_w, dk, d->m->eps, oh);
    const float *gate = d->gg + b * dim + h * dk;
    for (int64_t j = 0; j < dk; j++) oh[j] *= sigmoidf_(gate[j]);
}

static void kda_heads(void *ctx, int64_t begin, int64_t end) {
    const KdaCtx *d = ctx;
    const int64_t nk = d->L->nk;
    for (int64_t u = begin; u < end; u++) kda_row(d, u / nk, u % nk, d->s->state_slots[u / nk]);
}

static int64_t kda_scratch(const HDLayer *L, int64_t B) {
    const int64_t dim = L->nk * L->dk;
    return B * (3 * dim + 2 * L->dk + L->nk + 4 * dim);
}

static int kda(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work,
               GemmSet *g) {
    const int64_t B = s->batch, H = m->hidden, dk = L->dk, dim = L->nk * dk, C = 3 * dim;
    KdaCtx d = {m, L, s, work, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    d.fa = d.mixed + B * C;
    d.ga = d.fa + B * dk;
    d.bb = d.ga + B * dk;
    d.ff = d.bb + B * L->nk;
    d.gg = d.ff + B * dim;
    d.o = d.gg + B * dim;
    d.kvm = d.o + B * dim;
    gemm_add(g, L->kda_q, NULL, dim, H, xn, H, B, d.mixed, C);
    gemm_add(g, L->kda_k, NULL, dim, H, xn, H, B, d.mixed + dim, C);
    gemm_add(g, L->kda_v, NULL, dim, H, xn, H, B, d.mixed + 2 * dim, C);
    gemm_add(g, L->kda_fa, NULL, dk, H, xn, H, B, d.fa, dk);
    gemm_add(g, L->kda_ga, NULL, dk, H, xn, H, B, d.ga, dk);
    gemm_add(g, L->kda_b, NULL, L->nk, H, xn, H, B, d.bb, L->nk);
    gemm_run(g);
    gemm_add(g, L->kda_fb, NULL, dim, dk, d.fa, dk, B, d.ff, dim);
    gemm_add(g, L->kda_gb, NULL, dim, dk, d.ga, dk, B, d.gg, dim);
    gemm_run(g);
    hp_parallel_for(B * L->nk, 1, kda_heads, &d);
    gemm_add(g, L->w_out, NULL, H, dim, d.o, dim, B, out, H);
    gemm_run(g);
    return HD_OK;
}

#endif
