/* The gated full-attention mixer of the native step (hybrid_decode.c): q/k/v projections, per-head q/k norms,
 * RoPE, the new rows' K/V written at their pool slots, attention over the paged KV pool, the output gate and the
 * output projection. A decode step's units are (sequence, query head), one score row each (attention_heads); an
 * extend's (HDStep.chain) are (KV head, block of query rows), tiled GEMM-style (attention_chain below).
 */
#ifndef HYBRIDCTL_HD_ATTENTION_H
#define HYBRIDCTL_HD_ATTENTION_H

#include "hd_model.h"
#include "parallel.h"
#include "row_gemm.h"
#include "vexp.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

static void rope(float *x, const float *cs, const float *sn, int64_t rd) {
    const int64_t half = rd / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
    }
}

typedef struct {
    const HDLayer *L;
    const HDStep *s;
    const float *q;
    float *o;
    float *scores; /* [slots, part]: each part's own scratch (attention_part) */
    int64_t part;
    atomic_int next_slot;
    /* An extend's K and V rows in span order, as runs: run r is span positions [run_at[r], run_at[r + 1]), rows
     * run_k[r] + i * kvw (and run_v[r] likewise): the pool's own rows when the span is a few contiguous runs of
     * slots, else one run over the copy gather_kv made. */
    int64_t runs;
    const int64_t *run_at;
    const float *const *run_k, *const *run_v;
    int64_t ffn_hidden; /* > 0: an extend's units prefetch the layer's feed-forward weights (hd_prefetch_ffn) */
    /* The tile path (attention_tiles): each KV head's keys and values in bf16 in the B tiles' pair layouts (see
     * attention_tiles_convert), over sp = the span rounded up to 32. */
    uint16_t *kt, *vv;
    int64_t sp;
} AttnCtx;

/* Units (sequence b, query head h): softmax(q . K) V over the sequence's KV slots, gated. */
static void attention_heads(void *ctx, int64_t begin, int64_t end) {
    AttnCtx *a = ctx;
    const HDLayer *L = a->L;
    const HDStep *s = a->s;
    const int64_t hd = L->hd, nh = L->nh, kvw = L->nkv * hd, group = nh / L->nkv;
    const int64_t qw = nh * hd * (L->out_gate ? 2 : 1), qstride = L->out_gate ? 2 * hd : hd;
    const float *kp = s->k_pool[L->ordinal], *vp = s->v_pool[L->ordinal];
    const float scale = (float)L->attn_scale;
    /* Parts <= slots (the caller's grain), so each part has a row of its own. */
    float *scores = a->scores + atomic_fetch_add(&a->next_slot, 1) * a->part;
    for (int64_t u = begin; u < end; u++) {
        const int64_t b = u / nh, h = u % nh;
        int64_t n;
        const int64_t *locs = hd_kv_span(s, b, &n);
        const float *qh = a->q + b * qw + h * qstride;
        const int64_t g = h / group;
        float mx = -INFINITY;
        for (int64_t t = 0; t < n; t++) {
            scores[t] = dot(qh, kp + locs[t] * kvw + g * hd, hd) * scale;
            if (scores[t] > mx) mx = scores[t];
        }
        float sum = 0.0f;
        for (int64_t t = 0; t < n; t++) {
            scores[t] = expf(scores[t] - mx);
            sum += scores[t];
        }
        const float inv = 1.0f / sum;
        float *oh = a->o + b * nh * hd + h * hd;
        memset(oh, 0, (size_t)hd * sizeof(float));
        for (int64_t t = 0; t < n; t++) {
            const float p = scores[t] * inv;
            const float *vr = vp + locs[t] * kvw + g * hd;
#pragma omp simd
            for (int64_t i = 0; i < hd; i++) oh[i] += p * vr[i];
        }
        if (L->out_gate) {
            const float *gate = qh + hd;
            for (int64_t i = 0; i < hd; i++) oh[i] *= sigmoidf_(gate[i]);
        }
    }
}

/* ---- an extend's attention: one sequence's B new rows over its cached and new KV slots ----
 *
 * A unit is one KV head g and a block of HD_ATT_ROWS query rows of its group (row r: query head g * group + r / B,
 * token r % B), so the group's query heads share every K and V row they read. The block's rows are the lanes of
 * two 8-float vectors: its queries are kept transposed (QT [hd][16], scaled), its scores key-major (ST [t][16]),
 * so the scores (keys read in place from the pool through kv_flat, 6 keys a register tile), the softmax over each
 * row's causal span (row of token b: the first kv_offsets[b + 1] slots) and P V (6 output columns a tile, over
 * tiles of HD_ATT_KEYS keys) are all broadcast-and-FMA with no horizontal sums: hd is 64 for small models, where
 * a dot product's reduction would cost as much as its FMAs. Each element is one fixed sequence of FMAs whatever
 * tile, path or thread computes it, so results are bit-identical under any thread count. (Before: one unit per
 * query head, K and V gathered and transposed per head, dot products, scalar expf: ~14 ms of CPU for the peer
 * model's two layers at 48 rows over 2000 cached tokens.) */

#define HD_ATT_ROWS 16
#define HD_ATT_KEYS 32

static inline int64_t chain_blocks(const HDLayer *L, int64_t B) {
    return (L->nh / L->nkv * B + HD_ATT_ROWS - 1) / HD_ATT_ROWS;
}

/* ST[t][i] = sum over d of K_t[d] * QT[d][i] (d ascending, one FMA each), for t < nt; key t's row is at
 * kp + flat[t] * kvw (its head's offset included). */
static void chain_scores(const float *QT, int64_t hd, const float *kp, int64_t kvw, int64_t nt, float *ST) {
    int64_t t = 0;
#ifdef __AVX2__
    for (; t + 6 <= nt; t += 6) {
        const float *k0 = kp + t * kvw, *k1 = k0 + kvw, *k2 = k1 + kvw, *k3 = k2 + kvw, *k4 = k3 + kvw, *k5 = k4 + kvw;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
        __m256 a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
        for (int64_t d = 0; d < hd; d++) {
            const __m256 q0 = _mm256_loadu_ps(QT + d * 16), q1 = _mm256_loadu_ps(QT + d * 16 + 8);
            __m256 k = _mm256_broadcast_ss(k0 + d);
            a00 = HD_FMA(k, q0, a00), a01 = HD_FMA(k, q1, a01);
            k = _mm256_broadcast_ss(k1 + d);
            a10 = HD_FMA(k, q0, a10), a11 = HD_FMA(k, q1, a11);
            k = _mm256_broadcast_ss(k2 + d);
            a20 = HD_FMA(k, q0, a20), a21 = HD_FMA(k, q1, a21);
            k = _mm256_broadcast_ss(k3 + d);
            a30 = HD_FMA(k, q0, a30), a31 = HD_FMA(k, q1, a31);
            k = _mm256_broadcast_ss(k4 + d);
            a40 = HD_FMA(k, q0, a40), a41 = HD_FMA(k, q1, a41);
            k = _mm256_broadcast_ss(k5 + d);
            a50 = HD_FMA(k, q0, a50), a51 = HD_FMA(k, q1, a51);
        }
        float *o = ST + t * 16;
        _mm256_storeu_ps(o, a00), _mm256_storeu_ps(o + 8, a01), _mm256_storeu_ps(o + 16, a10);
        _mm256_storeu_ps(o + 24, a11), _mm256_storeu_ps(o + 32, a20), _mm256_storeu_ps(o + 40, a21);
        _mm256_storeu_ps(o + 48, a30), _mm256_storeu_ps(o + 56, a31), _mm256_storeu_ps(o + 64, a40);
        _mm256_storeu_ps(o + 72, a41), _mm256_storeu_ps(o + 80, a50), _mm256_storeu_ps(o + 88, a51);
    }
#endif
    for (; t < nt; t++) {
        const float *k = kp + t * kvw;
        float acc[16] = {0};
        for (int64_t d = 0; d < hd; d++)
            for (int i = 0; i < 16; i++) acc[i] = fmaf(k[d], QT[d * 16 + i], acc[i]);
        memcpy(ST + t * 16, acc, sizeof acc);
    }
}

/* Each lane's softmax over its keys, unnormalised: ST[t][i] = exp(ST[t][i] - max_i) for t < nb[i], 0 past it
 * (nb[i] >= lo for every lane); inv[i] = 1 / the lane's sum. */
static void chain_softmax(float *ST, int64_t nt, const int64_t *nb, int64_t lo, float *inv) {
    for (int64_t t = lo; t < nt; t++)
        for (int i = 0; i < 16; i++)
            if (t >= nb[i]) ST[t * 16 + i] = -INFINITY;
    float sum[16] = {0};
    int64_t t = 0;
#ifdef HYBRIDCTL_VEXP256
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    for (; t < nt; t++) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(ST + t * 16));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(ST + t * 16 + 8));
    }
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    for (t = 0; t < nt; t++) {
        const __m256 e0 = vexp256(_mm256_sub_ps(_mm256_loadu_ps(ST + t * 16), m0));
        const __m256 e1 = vexp256(_mm256_sub_ps(_mm256_loadu_ps(ST + t * 16 + 8), m1));
        _mm256_storeu_ps(ST + t * 16, e0), _mm256_storeu_ps(ST + t * 16 + 8, e1);
    }
    for (t = lo; t < nt; t++) /* exp of -inf clamps to ~1e-38, not 0 */
        for (int i = 0; i < 16; i++)
            if (t >= nb[i]) ST[t * 16 + i] = 0.0f;
    for (t = 0; t < nt; t++) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(ST + t * 16));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(ST + t * 16 + 8));
    }
    _mm256_storeu_ps(sum, s0), _mm256_storeu_ps(sum + 8, s1);
#else
    float mx[16];
    for (int i = 0; i < 16; i++) mx[i] = -INFINITY;
    for (; t < nt; t++)
        for (int i = 0; i < 16; i++) mx[i] = ST[t * 16 + i] > mx[i] ? ST[t * 16 + i] : mx[i];
    for (t = 0; t < nt; t++)
        for (int i = 0; i < 16; i++) {
            float *e = ST + t * 16 + i;
            *e = t < nb[i] ? vexpf(*e - mx[i]) : 0.0f;
            sum[i] += *e;
        }
#endif
    for (int i = 0; i < 16; i++) inv[i] = 1.0f / sum[i];
}

/* OT[d][i] = sum over t < nt of P[t][i] * V_t[d] (t ascending, one FMA each); OT [hd][16] starts zeroed. */
static void chain_pv(const float *P, int64_t hd, const float *vp, int64_t kvw, int64_t nt, float *OT) {
    for (int64_t t0 = 0; t0 < nt; t0 += HD_ATT_KEYS) {
        const int64_t t1 = min64(nt, t0 + HD_ATT_KEYS);
        int64_t d = 0;
#ifdef __AVX2__
        /* 6 output columns x 16 lanes: 12 accumulators, enough to cover the FMA latency (8 left it latency-bound) */
        for (; d + 6 <= hd; d += 6) {
            float *o = OT + d * 16;
            __m256 a00 = _mm256_loadu_ps(o), a01 = _mm256_loadu_ps(o + 8), a10 = _mm256_loadu_ps(o + 16);
            __m256 a11 = _mm256_loadu_ps(o + 24), a20 = _mm256_loadu_ps(o + 32), a21 = _mm256_loadu_ps(o + 40);
            __m256 a30 = _mm256_loadu_ps(o + 48), a31 = _mm256_loadu_ps(o + 56), a40 = _mm256_loadu_ps(o + 64);
            __m256 a41 = _mm256_loadu_ps(o + 72), a50 = _mm256_loadu_ps(o + 80), a51 = _mm256_loadu_ps(o + 88);
            for (int64_t t = t0; t < t1; t++) {
                const float *v = vp + t * kvw + d;
                const __m256 p0 = _mm256_loadu_ps(P + t * 16), p1 = _mm256_loadu_ps(P + t * 16 + 8);
                __m256 x = _mm256_broadcast_ss(v);
                a00 = HD_FMA(x, p0, a00), a01 = HD_FMA(x, p1, a01);
                x = _mm256_broadcast_ss(v + 1);
                a10 = HD_FMA(x, p0, a10), a11 = HD_FMA(x, p1, a11);
                x = _mm256_broadcast_ss(v + 2);
                a20 = HD_FMA(x, p0, a20), a21 = HD_FMA(x, p1, a21);
                x = _mm256_broadcast_ss(v + 3);
                a30 = HD_FMA(x, p0, a30), a31 = HD_FMA(x, p1, a31);
                x = _mm256_broadcast_ss(v + 4);
                a40 = HD_FMA(x, p0, a40), a41 = HD_FMA(x, p1, a41);
                x = _mm256_broadcast_ss(v + 5);
                a50 = HD_FMA(x, p0, a50), a51 = HD_FMA(x, p1, a51);
            }
            _mm256_storeu_ps(o, a00), _mm256_storeu_ps(o + 8, a01), _mm256_storeu_ps(o + 16, a10);
            _mm256_storeu_ps(o + 24, a11), _mm256_storeu_ps(o + 32, a20), _mm256_storeu_ps(o + 40, a21);
            _mm256_storeu_ps(o + 48, a30), _mm256_storeu_ps(o + 56, a31), _mm256_storeu_ps(o + 64, a40);
            _mm256_storeu_ps(o + 72, a41), _mm256_storeu_ps(o + 80, a50), _mm256_storeu_ps(o + 88, a51);
        }
        for (; d < hd; d++) {
            __m256 a0 = _mm256_loadu_ps(OT + d * 16), a1 = _mm256_loadu_ps(OT + d * 16 + 8);
            for (int64_t t = t0; t < t1; t++) {
                const __m256 x = _mm256_broadcast_ss(vp + t * kvw + d);
                a0 = HD_FMA(x, _mm256_loadu_ps(P + t * 16), a0);
                a1 = HD_FMA(x, _mm256_loadu_ps(P + t * 16 + 8), a1);
            }
            _mm256_storeu_ps(OT + d * 16, a0), _mm256_storeu_ps(OT + d * 16 + 8, a1);
        }
#endif
        for (; d < hd; d++)
            for (int64_t t = t0; t < t1; t++) {
                const float x = vp[t * kvw + d];
                for (int i = 0; i < 16; i++) OT[d * 16 + i] = fmaf(x, P[t * 16 + i], OT[d * 16 + i]);
            }
    }
}

/* A scattered span's K and V rows copied out of the pool into span order: every block then reads them
 * sequentially (read in place through kv_flat, pages scattered over a large pool cost the tiles ~50 % more). */
typedef struct {
    const float *kp, *vp;
    const int64_t *flat;
    int64_t kvw;
    float *kc, *vc;
} GatherCtx;

/* The span's runs of consecutive slots, when there are at most HD_ATT_RUNS and none shorter than HD_ATT_RUN_MIN
 * (but the last): their count, run r being span positions [at[r], at[r + 1]); else 0 (gather instead). A prefix
 * cache hit's span is typically two runs: the cached prompt's pages, then the new tokens'. Reading the pool in
 * place saves copying every row of the span (2 MB a layer for the peer model's 2048-token warm extend). */
#define HD_ATT_RUNS 16
#define HD_ATT_RUN_MIN 32
static int64_t kv_runs(const int64_t *flat, int64_t span, int64_t *at) {
    int64_t runs = 0;
    at[0] = 0;
    for (int64_t t = 1; t <= span; t++)
        if (t == span || flat[t] != flat[t - 1] + 1) {
            if (runs == HD_ATT_RUNS || (t < span && t - at[runs] < HD_ATT_RUN_MIN)) return 0;
            at[++runs] = t;
        }
    return runs;
}

static void gather_kv(void *ctx, int64_t begin, int64_t end) {
    const GatherCtx *c = ctx;
    const size_t row = (size_t)c->kvw * sizeof(float);
    for (int64_t t = begin; t < end; t++) {
        memcpy(c->kc + t * c->kvw, c->kp + c->flat[t] * c->kvw, row);
        memcpy(c->vc + t * c->kvw, c->vp + c->flat[t] * c->kvw, row);
    }
}

static void attention_chain(void *ctx, int64_t begin, int64_t end) {
    AttnCtx *a = ctx;
    const HDLayer *L = a->L;
    const HDStep *s = a->s;
    const int64_t hd = L->hd, nh = L->nh, kvw = L->nkv * hd, group = nh / L->nkv, B = s->batch;
    const int64_t qw = nh * hd * (L->out_gate ? 2 : 1), qstride = L->out_gate ? 2 * hd : hd;
    const int64_t R = group * B, nblk = chain_blocks(L, B);
    const float scale = (float)L->attn_scale;
    float *ST = a->scores + atomic_fetch_add(&a->next_slot, 1) * a->part; /* [span, 16] */
    float *QT = ST + s->kv_offsets[B] * 16, *OT = QT + hd * 16; /* [hd, 16] each */
    int64_t nb[16];
    float inv[16];
    for (int64_t u = begin; u < end; u++) {
        if (a->ffn_hidden > 0) hd_prefetch_ffn(L, a->ffn_hidden, u, L->nkv * nblk); /* compute-bound: DRAM idle */
        const int64_t g = u / nblk, r0 = (u % nblk) * HD_ATT_ROWS, rows = min64(HD_ATT_ROWS, R - r0);
        int64_t nt = 0, lo = INT64_MAX;
        for (int64_t i = 0; i < rows; i++) {
            const int64_t r = r0 + i, b = r % B, h = g * group + r / B;
            const float *src = a->q + b * qw + h * qstride;
            for (int64_t d = 0; d < hd; d++) QT[d * 16 + i] = src[d] * scale;
            nb[i] = s->kv_offsets[b + 1];
            nt = max64(nt, nb[i]), lo = min64(lo, nb[i]);
        }
        for (int64_t i = rows; i < 16; i++) { /* padding lanes: zero queries, computed and dropped */
            for (int64_t d = 0; d < hd; d++) QT[d * 16 + i] = 0.0f;
            nb[i] = nt;
        }
        /* Run by run, in span order: each score and each output's chain of FMAs is the one a single run over
         * the whole span would compute. */
        for (int64_t r = 0; r < a->runs && a->run_at[r] < nt; r++) {
            const int64_t t0 = a->run_at[r], n = min64(a->run_at[r + 1], nt) - t0;
            chain_scores(QT, hd, a->run_k[r] + g * hd, kvw, n, ST + t0 * 16);
        }
        chain_softmax(ST, nt, nb, lo, inv);
        memset(OT, 0, (size_t)(hd * 16) * sizeof(float));
        for (int64_t r = 0; r < a->runs && a->run_at[r] < nt; r++) {
            const int64_t t0 = a->run_at[r], n = min64(a->run_at[r + 1], nt) - t0;
            chain_pv(ST + t0 * 16, hd, a->run_v[r] + g * hd, kvw, n, OT);
        }
        for (int64_t i = 0; i < rows; i++) {
            const int64_t r = r0 + i, b = r % B, h = g * group + r / B;
            float *oh = a->o + b * nh * hd + h * hd;
            const float *gate = a->q + b * qw + h * qstride + hd;
            for (int64_t d = 0; d < hd; d++) {
                const float x = OT[d * 16 + i] * inv[i];
                oh[d] = L->out_gate ? x * sigmoidf_(gate[d]) : x;
            }
        }
    }
}

#include "hd_attention_tiles.h" /* a bf16 model's extend on AMX tiles: it uses AttnCtx above */

/* A layer whose mixer runs attend(): an attention layer, or Falcon-H1's parallel one (hd_parallel.h); the extend
 * scratch below is sized over both, or a parallel chain would write past it. */
static inline int has_attention(const HDLayer *L) { return L->kind == HD_ATTENTION || L->kind == HD_PARALLEL; }

/* Floats of one part's attention scratch (hd_decode gives every part its own): a score row of the longest span
 * in a decode step; an extend's block of scores (its span x 16 lanes), queries and outputs (attention_chain). */
static int64_t attention_part(const HDModel *m, const HDStep *s, int64_t max_kv) {
    if (!s->chain) return max_kv;
    int64_t hd = 0;
    for (int64_t l = 0; l < m->n_layers; l++)
        if (has_attention(&m->layers[l])) hd = max64(hd, m->layers[l].hd);
    const int64_t span = s->kv_offsets[s->batch];
    /* the FMA tiles' block, or the tile path's (attention_tiles_rows: S and P over the padded span, O and Q) */
    return max64(16 * (span + 2 * hd), 24 * (span + 32) + 24 * hd);
}

/* Floats an extend's attention shares between its parts, ahead of them: the gathered K and V (gather_kv). */
static int64_t attention_shared(const HDModel *m, const HDStep *s) {
    if (!s->chain) return 0;
    int64_t kvw = 0;
    for (int64_t l = 0; l < m->n_layers; l++)
        if (has_attention(&m->layers[l])) kvw = max64(kvw, m->layers[l].nkv * m->layers[l].hd);
    /* the gathered K and V, or the tile path's bf16 K and V pairs (hd_attention_tiles.h: half the floats, over the
     * span padded to 32) */
    return max64(2 * s->kv_offsets[s->batch] * kvw, (s->kv_offsets[s->batch] + 32) * kvw);
}

static int64_t attention_scratch(const HDLayer *L, int64_t B) {
    const int64_t qw = L->nh * L->hd * (L->out_gate ? 2 : 1);
    return B * (qw + 2 * L->nkv * L->hd + L->nh * L->hd) + L->rot_dim + 2;
}

/* Attention of the step's rows (q [B, qw] after RoPE, their K/V already in the pools) into o [B, nh * hd]: the
 * decode's per-(sequence, head) units, or an extend's gather then (KV head, row block) units. `scores`: `shared`
 * floats for the gathered K/V, then `slots` parts of `part` floats (attention_shared, attention_part);
 * `ffn_hidden` > 0: an extend also prefetches the layer's feed-forward weights (H = ffn_hidden) meanwhile. */
static void attend(const HDLayer *L, const HDStep *s, const float *q, float *o, float *scores, int64_t shared,
                   int64_t part, int64_t slots, int64_t ffn_hidden) {
    const int64_t B = s->batch, kvw = L->nkv * L->hd;
    AttnCtx a = {.L = L, .s = s, .q = q, .o = o, .scores = scores + shared, .part = part, .ffn_hidden = ffn_hidden};
#ifdef AG_AMX
    if (attention_tiles(L, s)) {
        const int64_t span = s->kv_offsets[B], R = L->nh / L->nkv * B;
        a.sp = (span + 31) / 32 * 32;
        a.kt = (uint16_t *)scores, a.vv = a.kt + L->nkv * a.sp * L->hd;
        const int64_t cunits = L->nkv * (a.sp / 32), units = L->nkv * ((R + 15) / 16);
        hp_parallel_for(cunits, max64(1, (cunits + slots - 1) / slots), attention_tiles_convert, &a);
        hp_parallel_for(units, max64(1, (units + slots - 1) / slots), attention_tiles_rows, &a);
        return;
    }
#endif
    int64_t run_at[HD_ATT_RUNS + 1];
    const float *run_k[HD_ATT_RUNS], *run_v[HD_ATT_RUNS];
    if (s->chain) {
        const float *kp = s->k_pool[L->ordinal], *vp = s->v_pool[L->ordinal];
        const int64_t span = s->kv_offsets[B];
        a.runs = kv_runs(s->kv_flat, span, run_at);
        if (a.runs > 0) { /* read in place */
            for (int64_t r = 0; r < a.runs; r++) {
                run_k[r] = kp + s->kv_flat[run_at[r]] * kvw;
                run_v[r] = vp + s->kv_flat[run_at[r]] * kvw;
            }
        } else { /* scattered: copied into span order first */
            float *vc = scores + span * kvw;
            GatherCtx gc = {kp, vp, s->kv_flat, kvw, scores, vc};
            hp_parallel_for(span, 256, gather_kv, &gc);
            a.runs = 1, run_at[0] = 0, run_at[1] = span, run_k[0] = scores, run_v[0] = vc;
        }
        a.run_at = run_at, a.run_k = run_k, a.run_v = run_v;
    }
    const int64_t units = s->chain ? L->nkv * chain_blocks(L, B) : B * L->nh;
    hp_parallel_for(units, max64(1, (units + slots - 1) / slots), s->chain ? attention_chain : attention_heads, &a);
}

static int attention(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work,
                     float *scores, int64_t part, int64_t slots, GemmSet *gs) {
    const int64_t B = s->batch, H = m->hidden, hd = L->hd, nh = L->nh, nkv = L->nkv;
    const int64_t qw = nh * hd * (L->out_gate ? 2 : 1), kvw = nkv * hd;
    float *q = work; /* [B, qw] */
    float *k = q + B * qw; /* [B, kvw] */
    float *v = k + B * kvw; /* [B, kvw] */
    float *o = v + B * kvw; /* [B, nh * hd] */
    float *cs = o + B * nh * hd; /* [rot_dim / 2] */
    float *sn = cs + L->rot_dim / 2 + 1;
    gemm_add(gs, L->wq, L->bq, qw, H, xn, H, B, q, qw);
    gemm_add(gs, L->wk, L->bk, kvw, H, xn, H, B, k, kvw);
    gemm_add(gs, L->wv, L->bv, kvw, H, xn, H, B, v, kvw);
    gemm_run(gs);
    float *kp = s->k_pool[L->ordinal], *vp = s->v_pool[L->ordinal];
    const int64_t qstride = L->out_gate ? 2 * hd : hd; /* q_proj emits [query | gate] per head */
    for (int64_t b = 0; b < B; b++) {
        const float pos = (float)s->positions[b];
        for (int64_t i = 0; i < L->rot_dim / 2; i++) {
            const float f = pos * L->inv_freq[i];
            cs[i] = cosf(f);
            sn[i] = sinf(f);
        }
        float *qb = q + b * qw, *kb = k + b * kvw, *vb = v + b * kvw;
        for (int64_t h = 0; h < nh; h++) {
            float *qh = qb + h * qstride;
            if (L->q_norm) rms_norm(qh, L->q_norm, hd, m->eps, qh);
            rope(qh, cs, sn, L->rot_dim);
        }
        for (int64_t h = 0; h < nkv; h++) {
            float *kh = kb + h * hd;
            if (L->k_norm) rms_norm(kh, L->k_norm, hd, m->eps, kh);
            if (L->key_mul != 0.0) /* Falcon-H1's key_multiplier, before RoPE */
                for (int64_t i = 0; i < hd; i++) kh[i] *= (float)L->key_mul;
            rope(kh, cs, sn, L->rot_dim);
        }
        const int64_t loc = s->out_locs[b];
        memcpy(kp + loc * kvw, kb, (size_t)kvw * sizeof(float));
        memcpy(vp + loc * kvw, vb, (size_t)kvw * sizeof(float));
    }
    /* After every row's K/V is written: an extend's row reads the K/V of the rows before it. */
    attend(L, s, q, o, scores, attention_shared(m, s), part, slots, m->hidden);
    gemm_add(gs, L->wo, L->bo, H, nh * hd, o, nh * hd, B, out, H);
    gemm_run(gs);
    return HD_OK;
}

#endif
