/* Kimi-Linear's multi-head latent attention (MLA, no positional encoding) in the native step (hybrid_decode.c;
 * runtime/models/kimi_linear.py's KimiMLA in decode). The pools hold what the torch layer caches: k_pool[ordinal]
 * the normed kv_lora_rank latent of each token ([token_slots, 1, lora]), v_pool[ordinal] its shared rope-dim key
 * part ([token_slots, 1, rope]). The torch layer expands every cached latent through kv_b_proj into per-head keys
 * and values; here kv_b_proj is absorbed instead (the same values in exact arithmetic, other rounding): head h's
 * score against token t is (Wk_h^T q_nope_h) . latent_t + q_rope_h . k_rot_t, its output Wv_h (sum_t p_t latent_t),
 * Wk_h / Wv_h head h's key / value rows of kv_b_proj (mla_kT: the key rows transposed, [nh, lora, nope]). Decode
 * rows only, parallel over (sequence, head); the softmax is the online one (a running max), so no score buffer. */
#ifndef HYBRIDCTL_HD_MLA_H
#define HYBRIDCTL_HD_MLA_H

#include "hd_model.h"
#include "parallel.h"
#include "row_gemm.h"

#include <math.h>

typedef struct {
    const HDLayer *L;
    const HDStep *s;
    const float *q; /* [B, nh, nope + rope] */
    float *absorbed, *ctx; /* [B, nh, lora] each */
    float *o; /* [B, nh, v] */
} MlaCtx;

static void mla_head(const MlaCtx *d, int64_t b, int64_t h) {
    const HDLayer *L = d->L;
    const HDStep *s = d->s;
    const int64_t nope = L->mla_nope, rope = L->mla_rope, lora = L->mla_lora, vd = L->mla_v;
    const float *q = d->q + (b * L->nh + h) * (nope + rope);
    float *qa = d->absorbed + (b * L->nh + h) * lora, *ctx = d->ctx + (b * L->nh + h) * lora;
    gemm_rows(hd_mat_at(L->mla_kT, h * lora * nope), NULL, lora, nope, q, nope, 1, qa, lora);
    const float *latents = s->k_pool[L->ordinal], *rots = s->v_pool[L->ordinal];
    const float scale = (float)L->attn_scale;
    int64_t n;
    const int64_t *slots = hd_kv_span(s, b, &n);
    float run_max = -INFINITY, total = 0.0f;
    for (int64_t j = 0; j < lora; j++) ctx[j] = 0.0f;
    for (int64_t t = 0; t < n; t++) {
        const float *lat = latents + slots[t] * lora;
        const float score = (dot(qa, lat, lora) + dot(q + nope, rots + slots[t] * rope, rope)) * scale;
        if (score > run_max) {
            const float shrink = expf(run_max - score); /* 0 for the first token */
            total *= shrink;
            for (int64_t j = 0; j < lora; j++) ctx[j] *= shrink;
            run_max = score;
        }
        const float p = expf(score - run_max);
        total += p;
        for (int64_t j = 0; j < lora; j++) ctx[j] += p * lat[j];
    }
    for (int64_t j = 0; j < lora; j++) ctx[j] /= total;
    const HDMat wv = hd_mat_at(L->mla_kvb, (h * (nope + vd) + nope) * lora); /* head h's value rows */
    gemm_rows(wv, NULL, vd, lora, ctx, lora, 1, d->o + (b * L->nh + h) * vd, vd);
}

static void mla_heads(void *ctx, int64_t begin, int64_t end) {
    const MlaCtx *d = ctx;
    const int64_t nh = d->L->nh;
    for (int64_t u = begin; u < end; u++) mla_head(d, u / nh, u % nh);
}

static int64_t mla_scratch(const HDLayer *L, int64_t B) {
    return B * (L->nh * (L->mla_nope + L->mla_rope) + L->mla_q_lora + L->mla_lora + L->mla_rope +
                2 * L->nh * L->mla_lora + L->nh * L->mla_v);
}

static int mla(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work,
               GemmSet *g) {
    const int64_t B = s->batch, H = m->hidden, nh = L->nh, lora = L->mla_lora, rope = L->mla_rope;
    const int64_t qw = nh * (L->mla_nope + rope), ql = L->mla_q_lora, kvw = lora + rope;
    float *q = work, *qa = q + B * qw, *kva = qa + B * ql;
    MlaCtx d = {L, s, q, kva + B * kvw, NULL, NULL};
    d.ctx = d.absorbed + B * nh * lora;
    d.o = d.ctx + B * nh * lora;
    gemm_add(g, L->mla_kva, L->mla_kva_b, kvw, H, xn, H, B, kva, kvw);
    if (ql > 0)
        gemm_add(g, L->mla_qa, L->mla_qa_b, ql, H, xn, H, B, qa, ql);
    else
        gemm_add(g, L->wq, NULL, qw, H, xn, H, B, q, qw);
    gemm_run(g);
    if (ql > 0) {
        for (int64_t b = 0; b < B; b++) rms_norm(qa + b * ql, L->mla_qa_norm, ql, L->mla_eps, qa + b * ql);
        gemm_add(g, L->mla_qb, NULL, qw, ql, qa, ql, B, q, qw);
        gemm_run(g);
    }
    /* The new tokens' latent (normed) and rope key into the pools, before any head reads its sequence's span. */
    for (int64_t b = 0; b < B; b++) {
        const float *row = kva + b * kvw;
        float *lat = s->k_pool[L->ordinal] + s->out_locs[b] * lora, *rot = s->v_pool[L->ordinal] + s->out_locs[b] * rope;
        rms_norm(row, L->mla_kv_norm, lora, L->mla_eps, lat);
        for (int64_t j = 0; j < rope; j++) rot[j] = row[lora + j];
    }
    hp_parallel_for(B * nh, 1, mla_heads, &d);
    gemm_add(g, L->wo, L->bo, H, nh * L->mla_v, d.o, nh * L->mla_v, B, out, H);
    gemm_run(g);
    return HD_OK;
}

#endif
