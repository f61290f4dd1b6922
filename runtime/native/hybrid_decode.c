/* One decode step of the Qwen3-Next family (qwen3_next, qwen3_5, qwen3_5_moe) in plain C: embedding, every
 * layer (gated DeltaNet or gated full attention, then a sparse MoE with shared expert or a dense SwiGLU MLP),
 * final norm and lm_head, for B sequences of one new token each. Called once per step through ctypes
 * (runtime/native/hybrid_decode.py), so a step is one call instead of ~800 dispatched torch ops.
 *
 * Semantics follow the torch modules (runtime/models/layers/): every weight is fp32, read in place from the
 * model's own parameters (row-major [out, in]); the pools are the engine's fp32 buffers, written in place at the
 * step's slots. Every pointer, dtype, shape and contiguity is validated by the Python side before the call; this
 * file checks only that the indices it is given lie inside the pools (returning an error code, never writing
 * out of bounds).
 *
 * Weight streaming: every projection is one pass over its rows for all B rows of the batch (gemm below), so a
 * batch of 8 reads each weight once; a MoE expert's weights stream once for all the tokens routed to it.
 *
 * Threads (hd_set_threads; parallel.h's pool): the rows of every projection, the lm_head and the experts split
 * across the threads in blocks of 4 rows (each thread streams its share of the weights), and the DeltaNet
 * recurrence splits by (sequence, key head). Each row is computed by the same code in the same order whichever
 * thread runs it, so logits and pool rows are bit-identical under any thread count. The phases that must see every
 * row of the one before (a norm over the hidden vector, the routing) are the only barriers: per layer two regions
 * for the mixer's projections and recurrence, one for its output projection, two for the feed-forward.
 */

#include "parallel.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

typedef struct {
    int64_t kind; /* 0: gated DeltaNet, 1: gated full attention */
    int64_t ordinal; /* index into the pool lists of its kind */
    const float *in_norm; /* [H] 1 + w */
    const float *post_norm; /* [H] 1 + w */
    /* gated DeltaNet */
    int64_t nk, nv, dk, dv, kernel;
    const float *w_qkv; /* [2*nk*dk + nv*dv, H] rows q | k | v */
    const float *w_z; /* [nv*dv, H] */
    const float *w_b; /* [nv, H] */
    const float *w_a; /* [nv, H] */
    const float *conv_w; /* [conv_dim, kernel] */
    const float *conv_b; /* [conv_dim] or NULL */
    const float *neg_a; /* [nv] -exp(A_log) */
    const float *dt_bias; /* [nv] */
    const float *gnorm_w; /* [dv] */
    const float *w_out; /* [H, nv*dv] */
    /* gated attention */
    int64_t nh, nkv, hd, rot_dim, out_gate;
    const float *wq, *wk, *wv, *wo; /* [nh*hd*(1+out_gate), H], [nkv*hd, H] x2, [H, nh*hd] */
    const float *bq, *bk, *bv, *bo; /* biases or NULL */
    const float *q_norm, *k_norm; /* [hd] 1 + w, or NULL */
    const float *inv_freq; /* [rot_dim / 2] */
    double attn_scale;
    /* feed-forward: a sparse MoE (n_exp > 0) with an optional shared expert, or a dense SwiGLU MLP */
    int64_t n_exp, top_k, exp_inter, norm_topk;
    const float *router; /* [E, H] */
    const float *exp_gate_up; /* [E, 2*I, H] */
    const float *exp_down; /* [E, H, I] */
    int64_t mlp_inter; /* the dense MLP's or the shared expert's intermediate size; 0: none */
    const float *mlp_gate, *mlp_up, *mlp_down; /* [I, H], [I, H], [H, I] */
    const float *shared_gate; /* [1, H] or NULL */
} HDLayer;

typedef struct {
    int64_t hidden, vocab, n_layers;
    double eps;
    double embed_scale;
    const float *embed; /* [V, H] */
    const float *final_norm; /* [H] 1 + w */
    const float *lm_head; /* [V, H] */
    const HDLayer *layers;
} HDModel;

typedef struct {
    int64_t batch;
    const int64_t *ids, *positions, *out_locs, *state_slots; /* [B] each */
    const int64_t *kv_offsets; /* [B + 1]: sequence b's KV slots are kv_flat[kv_offsets[b] .. kv_offsets[b+1]) */
    const int64_t *kv_flat;
    float *const *k_pool; /* per attention ordinal: [token_slots, nkv, hd] */
    float *const *v_pool;
    float *const *conv_pool; /* per linear ordinal: [state_slots, conv_dim, kernel - 1] */
    float *const *ssm_pool; /* per linear ordinal: [state_slots, nv, dv, dk] */
    int64_t token_slots, state_slots_count;
    float *logits; /* [B, V] */
} HDStep;

enum { HD_OK = 0, HD_BAD_TOKEN = 1, HD_BAD_TOKEN_SLOT = 2, HD_BAD_STATE_SLOT = 3, HD_NO_MEMORY = 4, HD_EMPTY_KV = 5 };

/* ---- dot products and the batched GEMV ---- */

#ifdef __AVX2__
static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
/* The four sums of a0..a3, as [sum a0, sum a1, sum a2, sum a3]. */
static inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

static inline void store4(float *y, __m128 v, const float *bias) {
    if (bias) v = _mm_add_ps(v, _mm_loadu_ps(bias));
    _mm_storeu_ps(y, v);
}
#ifdef __FMA__
#define HD_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#else
#define HD_FMA(a, b, c) _mm256_add_ps(_mm256_mul_ps(a, b), c)
#endif
#endif

static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    int64_t i = 0;
    float acc = 0.0f;
#ifdef __AVX2__
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        s0 = HD_FMA(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = HD_FMA(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = HD_FMA(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    acc = hsum256(_mm256_add_ps(s0, s1));
#else
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < n; j++) acc += a[j] * b[j];
    i = n;
#endif
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

#ifndef HD_AHEAD
#define HD_AHEAD 1
#endif
#ifndef HD_HINT
#define HD_HINT _MM_HINT_T0
#endif

/* Y[b, n] = W[n, :] . X[b, :] (+ bias[n]) for b < B, n < N: each weight row is read once for all B rows. */
static void gemm(const float *restrict W, const float *restrict bias, int64_t N, int64_t K, const float *X,
                 int64_t ldx, int64_t B, float *Y, int64_t ldy) {
    int64_t n = 0;
#ifdef __AVX2__
    if (K % 8 == 0) {
        for (; n + 4 <= N; n += 4) {
            const float *w0 = W + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
            /* The rows of a block HD_AHEAD blocks on, fetched while this one computes: with B > 1 the hardware
             * prefetcher alone falls behind and the stream stalls (B=8 ran 2.6x slower than B=1 from DRAM). */
            const float *ahead = n + 4 * (HD_AHEAD + 1) <= N ? W + (n + 4 * HD_AHEAD) * K : NULL;
            if (ahead)
                for (int64_t k = 0; k < 4 * K; k += 16) _mm_prefetch((const char *)(ahead + k), HD_HINT);
            int64_t b = 0;
            /* Two batch rows at a time: 8 accumulators, 6 loads per 8 FMAs. */
            for (; b + 2 <= B; b += 2) {
                const float *x = X + b * ldx, *x1 = x + ldx;
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
                __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
                __m256 c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
                for (int64_t k = 0; k < K; k += 8) {
                    const __m256 xv = _mm256_loadu_ps(x + k), xw = _mm256_loadu_ps(x1 + k);
                    const __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
                    const __m256 v2 = _mm256_loadu_ps(w2 + k), v3 = _mm256_loadu_ps(w3 + k);
                    a0 = HD_FMA(v0, xv, a0);
                    a1 = HD_FMA(v1, xv, a1);
                    a2 = HD_FMA(v2, xv, a2);
                    a3 = HD_FMA(v3, xv, a3);
                    c0 = HD_FMA(v0, xw, c0);
                    c1 = HD_FMA(v1, xw, c1);
                    c2 = HD_FMA(v2, xw, c2);
                    c3 = HD_FMA(v3, xw, c3);
                }
                store4(Y + b * ldy + n, hsum4(a0, a1, a2, a3), bias ? bias + n : NULL);
                store4(Y + (b + 1) * ldy + n, hsum4(c0, c1, c2, c3), bias ? bias + n : NULL);
            }
            for (; b < B; b++) {
                const float *x = X + b * ldx;
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
                for (int64_t k = 0; k < K; k += 8) {
                    const __m256 xv = _mm256_loadu_ps(x + k);
                    a0 = HD_FMA(_mm256_loadu_ps(w0 + k), xv, a0);
                    a1 = HD_FMA(_mm256_loadu_ps(w1 + k), xv, a1);
                    a2 = HD_FMA(_mm256_loadu_ps(w2 + k), xv, a2);
                    a3 = HD_FMA(_mm256_loadu_ps(w3 + k), xv, a3);
                }
                store4(Y + b * ldy + n, hsum4(a0, a1, a2, a3), bias ? bias + n : NULL);
            }
        }
    }
#endif
    for (; n < N; n++) {
        const float *w = W + n * K;
        for (int64_t b = 0; b < B; b++) Y[b * ldy + n] = dot(w, X + b * ldx, K) + (bias ? bias[n] : 0.0f);
    }
}


/* ---- projections split by rows across the pool's threads ---- */

#define HD_MAX_JOBS 24
/* Weights a part streams at least: below that a region costs more than it saves (hd_set_min_part_bytes: tests
 * split tiny models to the row block). */
static int64_t hd_part_bytes = 32768;

typedef struct {
    const float *W, *bias;
    int64_t N, K;
    const float *X;
    int64_t ldx, B;
    float *Y;
    int64_t ldy;
} GemmJob;

/* Several independent projections of one phase as one region: their 4-row blocks numbered one after another. */
typedef struct {
    int n;
    int64_t bytes;
    GemmJob job[HD_MAX_JOBS];
    int64_t first[HD_MAX_JOBS + 1]; /* block offsets */
} GemmSet;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static void gemm_add(GemmSet *g, const float *W, const float *bias, int64_t N, int64_t K, const float *X, int64_t ldx,
                     int64_t B, float *Y, int64_t ldy) {
    if (N <= 0 || B <= 0) return;
    if (g->n == 0) g->first[0] = 0, g->bytes = 0;
    g->job[g->n] = (GemmJob){W, bias, N, K, X, ldx, B, Y, ldy};
    g->first[g->n + 1] = g->first[g->n] + (N + 3) / 4;
    g->bytes += N * K * (int64_t)sizeof(float);
    g->n++;
}

/* Rows [4*lo, 4*hi) of the jobs, clipped to each job's N: a block starts on a multiple of 4 of its job, so gemm
 * blocks it exactly as one call over all N rows would (the same arithmetic per row). */
static void gemm_blocks(void *ctx, int64_t begin, int64_t end) {
    const GemmSet *g = ctx;
    for (int j = 0; j < g->n; j++) {
        const int64_t lo = max64(begin, g->first[j]), hi = min64(end, g->first[j + 1]);
        if (lo >= hi) continue;
        const GemmJob *q = &g->job[j];
        const int64_t r0 = (lo - g->first[j]) * 4, r1 = min64((hi - g->first[j]) * 4, q->N);
        gemm(q->W + r0 * q->K, q->bias ? q->bias + r0 : NULL, r1 - r0, q->K, q->X, q->ldx, q->B, q->Y + r0, q->ldy);
    }
}

/* The grain of a region over `units` units that stream `bytes` of weights in all. */
static int64_t grain_for(int64_t units, int64_t bytes) {
    const int64_t per_unit = units > 0 ? bytes / units : 0;
    return per_unit > 0 ? max64(1, (hd_part_bytes + per_unit - 1) / per_unit) : units;
}

static void gemm_run(GemmSet *g) {
    if (g->n == 0) return;
    const int64_t units = g->first[g->n];
    hp_parallel_for(units, grain_for(units, g->bytes), gemm_blocks, g);
    g->n = 0;
}

/* ---- elementwise pieces ---- */

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float siluf_(float x) { return x / (1.0f + expf(-x)); }
static inline float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch's threshold 20 */

/* out = x * rsqrt(mean(x^2) + eps) * scale (scale NULL: none), over n values. */
static void rms_norm(const float *x, const float *scale, int64_t n, double eps, float *out) {
    float ss = dot(x, x, n);
    float r = 1.0f / sqrtf(ss / (float)n + (float)eps);
    for (int64_t i = 0; i < n; i++) out[i] = scale ? x[i] * r * scale[i] : x[i] * r;
}

/* ---- gated DeltaNet, one token per sequence ---- */

typedef struct {
    const HDModel *m;
    const HDLayer *L;
    const HDStep *s;
    float *mixed, *z, *bb, *aa, *o, *qn;
} DeltaCtx;

/* Depthwise causal conv over [state, x] for channels [c0, c1) of one sequence, then silu; the state rolls by one. */
static void conv_channels(const HDLayer *L, float *mx, float *cs, int64_t c0, int64_t c1) {
    const int64_t width = L->kernel - 1;
    for (int64_t c = c0; c < c1; c++) {
        float *st = cs + c * width;
        const float *w = L->conv_w + c * L->kernel;
        const float xv = mx[c];
        float acc = 0.0f;
        for (int64_t t = 0; t < width; t++) acc += st[t] * w[t];
        acc += xv * w[width];
        if (L->conv_b) acc += L->conv_b[c];
        for (int64_t t = 0; t + 1 < width; t++) st[t] = st[t + 1];
        if (width > 0) st[width - 1] = xv;
        mx[c] = siluf_(acc);
    }
}

/* Units (sequence b, key head kh): the conv of kh's q, k and v channels, then the recurrence of kh's value heads. The
 * channels and states of two units never overlap. */
static void deltanet_heads(void *ctx, int64_t begin, int64_t end) {
    const DeltaCtx *d = ctx;
    const HDModel *m = d->m;
    const HDLayer *L = d->L;
    const HDStep *s = d->s;
    const int64_t key_dim = L->nk * L->dk, value_dim = L->nv * L->dv, conv_dim = 2 * key_dim + value_dim;
    const int64_t width = L->kernel - 1, ratio = L->nv / L->nk;
    const float qscale = 1.0f / sqrtf((float)L->dk);
    for (int64_t u = begin; u < end; u++) {
        const int64_t b = u / L->nk, kh = u % L->nk;
        const int64_t slot = s->state_slots[b];
        float *mx = d->mixed + b * conv_dim;
        float *cs = s->conv_pool[L->ordinal] + slot * conv_dim * width;
        float *qn = d->qn + b * 2 * key_dim;
        conv_channels(L, mx, cs, kh * L->dk, (kh + 1) * L->dk);
        conv_channels(L, mx, cs, key_dim + kh * L->dk, key_dim + (kh + 1) * L->dk);
        conv_channels(L, mx, cs, 2 * key_dim + kh * ratio * L->dv, 2 * key_dim + (kh + 1) * ratio * L->dv);
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
            for (int64_t i = 0; i < L->dv; i++) {
                float *row = S + i * L->dk;
                for (int64_t j = 0; j < L->dk; j++) row[j] *= decay;
                const float delta = (v[h * L->dv + i] - dot(row, k, L->dk)) * beta;
                for (int64_t j = 0; j < L->dk; j++) row[j] += delta * k[j];
                oh[i] = dot(row, q, L->dk);
            }
            /* Gated RMSNorm: norm(o) * w * silu(z). */
            const float *zh = d->z + b * value_dim + h * L->dv;
            rms_norm(oh, L->gnorm_w, L->dv, m->eps, oh);
            for (int64_t i = 0; i < L->dv; i++) oh[i] *= siluf_(zh[i]);
        }
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
    hp_parallel_for(B * L->nk, 1, deltanet_heads, &d);
    gemm_add(g, L->w_out, NULL, H, value_dim, d.o, value_dim, B, out, H);
    gemm_run(g);
    return HD_OK;
}

/* ---- gated full attention over the paged KV pool ---- */

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
    float *scores; /* [slots, max_kv]: one row per part */
    int64_t max_kv;
    atomic_int next_slot;
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
    float *scores = a->scores + atomic_fetch_add(&a->next_slot, 1) * a->max_kv;
    for (int64_t u = begin; u < end; u++) {
        const int64_t b = u / nh, h = u % nh;
        const int64_t *locs = s->kv_flat + s->kv_offsets[b];
        const int64_t n = s->kv_offsets[b + 1] - s->kv_offsets[b];
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

static int64_t attention_scratch(const HDLayer *L, int64_t B) {
    const int64_t qw = L->nh * L->hd * (L->out_gate ? 2 : 1);
    return B * (qw + 2 * L->nkv * L->hd + L->nh * L->hd) + L->rot_dim + 2;
}

static int attention(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work,
                     float *scores, int64_t max_kv, int64_t slots, GemmSet *gs) {
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
            rope(kh, cs, sn, L->rot_dim);
        }
        const int64_t loc = s->out_locs[b];
        memcpy(kp + loc * kvw, kb, (size_t)kvw * sizeof(float));
        memcpy(vp + loc * kvw, vb, (size_t)kvw * sizeof(float));
    }
    /* After every new token's K/V is written (a sequence may read another's slot only through its own kv_locs). */
    AttnCtx a = {L, s, q, o, scores, max_kv, 0};
    const int64_t units = B * nh;
    hp_parallel_for(units, max64(1, (units + slots - 1) / slots), attention_heads, &a);
    gemm_add(gs, L->wo, L->bo, H, nh * hd, o, nh * hd, B, out, H);
    gemm_run(gs);
    return HD_OK;
}

/* ---- feed-forward: a sparse MoE with an optional gated shared expert, or a dense SwiGLU MLP ---- */

/* A SwiGLU's input side for `cnt` rows: h = silu(gate x) * up x, [cnt, inter]. */
typedef struct {
    const float *gate, *up; /* [inter, H] each */
    int64_t inter, cnt;
    const float *x; /* [cnt, H] */
    float *g, *u, *h; /* [cnt, inter] each */
} UpJob;

/* Its output side: rows [r0, r1) of down [H, inter] applied to h; an expert's rows are added into the tokens it
 * serves, times their routing weights. */
typedef struct {
    const float *down;
    const int64_t *tok; /* [cnt] the batch row of each of h's rows (NULL: row r is batch row r) */
    const float *tokw; /* [cnt] routing weights (NULL: the shared expert / dense MLP) */
} DownJob;

typedef struct {
    int n;
    int64_t H, B;
    UpJob up[HD_MAX_JOBS];
    DownJob down[HD_MAX_JOBS];
    int64_t first[HD_MAX_JOBS + 1]; /* 4-row blocks of each job's intermediate rows */
    int64_t bytes_up, bytes_down;
    float *out; /* [B, H] */
    float *eo; /* [rows of all jobs, H]: each job's down projection before it is added */
    int64_t eo_off[HD_MAX_JOBS];
    const float *shared_gate; /* [B] the shared expert's gate logits, or NULL */
    int mode; /* FFN_CLEAR: out = the jobs' sum; FFN_ADD: out += it (a later round); FFN_DENSE: out = down(h) */
} FfnCtx;

enum { FFN_CLEAR = 0, FFN_ADD = 1, FFN_DENSE = 2 };

static void ffn_up_blocks(void *ctx, int64_t begin, int64_t end) {
    const FfnCtx *f = ctx;
    for (int j = 0; j < f->n; j++) {
        const int64_t lo = max64(begin, f->first[j]), hi = min64(end, f->first[j + 1]);
        if (lo >= hi) continue;
        const UpJob *q = &f->up[j];
        const int64_t r0 = (lo - f->first[j]) * 4, r1 = min64((hi - f->first[j]) * 4, q->inter), I = q->inter;
        gemm(q->gate + r0 * f->H, NULL, r1 - r0, f->H, q->x, f->H, q->cnt, q->g + r0, I);
        gemm(q->up + r0 * f->H, NULL, r1 - r0, f->H, q->x, f->H, q->cnt, q->u + r0, I);
        for (int64_t r = 0; r < q->cnt; r++)
            for (int64_t i = r0; i < r1; i++) q->h[r * I + i] = siluf_(q->g[r * I + i]) * q->u[r * I + i];
    }
}

/* Output rows [4*begin, 4*end) of H: every job's down rows for them, added in job order (experts ascending, then
 * the shared expert), as the one-thread loop adds them. */
static void ffn_down_blocks(void *ctx, int64_t begin, int64_t end) {
    const FfnCtx *f = ctx;
    const int64_t H = f->H, r0 = begin * 4, r1 = min64(end * 4, H);
    if (f->mode == FFN_DENSE) {
        const UpJob *q = &f->up[0];
        gemm(f->down[0].down + r0 * q->inter, NULL, r1 - r0, q->inter, q->h, q->inter, q->cnt, f->out + r0, H);
        return;
    }
    if (f->mode == FFN_CLEAR)
        for (int64_t b = 0; b < f->B; b++) memset(f->out + b * H + r0, 0, (size_t)(r1 - r0) * sizeof(float));
    for (int j = 0; j < f->n; j++) {
        const UpJob *q = &f->up[j];
        const DownJob *d = &f->down[j];
        float *eo = f->eo + f->eo_off[j] * H;
        gemm(d->down + r0 * q->inter, NULL, r1 - r0, q->inter, q->h, q->inter, q->cnt, eo + r0, H);
        for (int64_t r = 0; r < q->cnt; r++) {
            const int64_t b = d->tok ? d->tok[r] : r;
            float *dst = f->out + b * H;
            const float *src = eo + r * H;
            if (d->tokw) {
                const float w = d->tokw[r];
                for (int64_t i = r0; i < r1; i++) dst[i] += src[i] * w;
            } else if (f->shared_gate) {
                const float gate = sigmoidf_(f->shared_gate[b]);
                for (int64_t i = r0; i < r1; i++) dst[i] += gate * src[i];
            } else {
                for (int64_t i = r0; i < r1; i++) dst[i] += src[i];
            }
        }
    }
}

static void ffn_add(FfnCtx *f, const float *gate, const float *up, const float *down, int64_t inter, int64_t cnt,
                    const float *x, float *buf, const int64_t *tok, const float *tokw) {
    const int j = f->n++;
    f->up[j] = (UpJob){gate, up, inter, cnt, x, buf, buf + cnt * inter, buf + 2 * cnt * inter};
    f->down[j] = (DownJob){down, tok, tokw};
    f->first[j + 1] = f->first[j] + (inter + 3) / 4;
    f->bytes_up += 2 * inter * f->H * (int64_t)sizeof(float);
    f->bytes_down += inter * f->H * (int64_t)sizeof(float);
}

static void ffn_run(FfnCtx *f) {
    const int64_t units = f->first[f->n], down_units = (f->H + 3) / 4;
    hp_parallel_for(units, grain_for(units, f->bytes_up), ffn_up_blocks, f);
    hp_parallel_for(down_units, grain_for(down_units, f->bytes_down), ffn_down_blocks, f);
}

/* Floats of scratch the feed-forward needs for B sequences (moe / swiglu below lay it out in this order). */
static int64_t ffn_scratch(const HDLayer *L, int64_t B, int64_t H) {
    if (L->n_exp <= 0) return 3 * B * L->mlp_inter;
    const int64_t rows = B * L->top_k;
    return B * L->n_exp + 2 * B * L->top_k + 2 * rows + 2 /* probs, topw, topi */ + rows * H /* gathered */ +
           3 * rows * L->exp_inter + (rows + B) * H /* eo */ + 3 * rows + 2 /* tok, tokw */ + B /* shared gate */ +
           3 * B * L->mlp_inter + 16;
}

static void swiglu_mlp(const HDLayer *L, int64_t H, const float *x, int64_t B, float *out, float *work) {
    FfnCtx f = {.n = 0, .H = H, .B = B, .out = out, .mode = FFN_DENSE};
    ffn_add(&f, L->mlp_gate, L->mlp_up, L->mlp_down, L->mlp_inter, B, x, work, NULL, NULL);
    ffn_run(&f);
}

static void moe(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work) {
    const int64_t B = s->batch, H = m->hidden, E = L->n_exp, K = L->top_k, I = L->exp_inter;
    /* Offsets rounded to even floats so the int64 arrays stay 8-byte aligned. */
#define HD_NEXT(p, n) ((p) + (((n) + 1) & ~(int64_t)1))
    const int64_t rows = B * K;
    float *probs = work; /* [B, E] */
    float *topw = HD_NEXT(probs, B * E); /* [B, K] */
    int64_t *topi = (int64_t *)HD_NEXT(topw, B * K); /* [B, K] */
    float *gathered = (float *)(topi + B * K); /* [rows, H] each expert's tokens, experts ascending */
    float *bufs = gathered + rows * H; /* [rows, 3I] each expert's g | u | h */
    float *eo = bufs + 3 * rows * I; /* [rows + B, H] */
    int64_t *tok = (int64_t *)HD_NEXT(eo, (rows + B) * H); /* [rows] */
    float *tokw = (float *)(tok + rows); /* [rows] */
    float *sg = tokw + rows; /* [B] */
    float *shared_buf = sg + B; /* [B, 3 * mlp_inter] */
#undef HD_NEXT
    gemm(L->router, NULL, E, H, xn, H, B, probs, E);
    for (int64_t b = 0; b < B; b++) {
        float *p = probs + b * E;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t e = 0; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int64_t e = 0; e < E; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        for (int64_t e = 0; e < E; e++) p[e] /= sum;
        /* top-k, largest first; ties to the lower expert id */
        float tsum = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t i = 0; i < j; i++) taken |= topi[b * K + i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            topi[b * K + j] = best;
            topw[b * K + j] = p[best];
            tsum += p[best];
        }
        if (L->norm_topk)
            for (int64_t j = 0; j < K; j++) topw[b * K + j] /= tsum;
    }
    FfnCtx f = {.n = 0, .H = H, .B = B, .out = out, .eo = eo, .mode = FFN_CLEAR};
    /* Experts in ascending id order: each token's terms are summed in that order, as the torch paths sum them. At
     * most HD_MAX_JOBS - 1 active experts a region; more (a large batch of a many-expert model) run in rounds. */
    int64_t at = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t cnt = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < K; j++)
                if (topi[b * K + j] == e) {
                    tok[at + cnt] = b;
                    tokw[at + cnt] = topw[b * K + j];
                    memcpy(gathered + (at + cnt) * H, xn + b * H, (size_t)H * sizeof(float));
                    cnt++;
                }
        if (!cnt) continue;
        if (f.n == HD_MAX_JOBS - 1) {
            ffn_run(&f); /* the rounds after the first add into out, in the same expert order */
            f.n = 0;
            f.bytes_up = f.bytes_down = 0;
            f.mode = FFN_ADD;
        }
        f.eo_off[f.n] = at;
        ffn_add(&f, L->exp_gate_up + e * 2 * I * H, L->exp_gate_up + e * 2 * I * H + I * H, L->exp_down + e * H * I, I,
                cnt, gathered + at * H, bufs + 3 * at * I, tok + at, tokw + at);
        at += cnt;
    }
    if (L->mlp_inter > 0) {
        if (L->shared_gate) {
            gemm(L->shared_gate, NULL, 1, H, xn, H, B, sg, 1);
            f.shared_gate = sg;
        }
        f.eo_off[f.n] = rows;
        ffn_add(&f, L->mlp_gate, L->mlp_up, L->mlp_down, L->mlp_inter, B, xn, shared_buf, NULL, NULL);
    }
    ffn_run(&f);
}

/* ---- the step ---- */

/* Floats of scratch one layer needs for B sequences. */
static int64_t layer_scratch(const HDLayer *L, int64_t B, int64_t H) {
    const int64_t mixer = L->kind == 0 ? deltanet_scratch(L, B) : attention_scratch(L, B);
    return max64(mixer, ffn_scratch(L, B, H)) + 16;
}

void hd_set_threads(int n) { hp_set_threads(n); }
void hd_set_min_part_bytes(int64_t bytes) { hd_part_bytes = bytes < 1 ? 1 : bytes; }
int hd_threads(void) { return hp_threads(); }

int hd_decode(const HDModel *m, const HDStep *s) {
    const int64_t B = s->batch, H = m->hidden;
    int64_t max_kv = 1;
    for (int64_t b = 0; b < B; b++) {
        if (s->ids[b] < 0 || s->ids[b] >= m->vocab) return HD_BAD_TOKEN;
        if (s->state_slots[b] < 0 || s->state_slots[b] >= s->state_slots_count) return HD_BAD_STATE_SLOT;
        if (s->out_locs[b] < 0 || s->out_locs[b] >= s->token_slots) return HD_BAD_TOKEN_SLOT;
        const int64_t n = s->kv_offsets[b + 1] - s->kv_offsets[b];
        if (n < 1) return HD_EMPTY_KV;
        max_kv = max64(max_kv, n);
        for (int64_t t = s->kv_offsets[b]; t < s->kv_offsets[b + 1]; t++)
            if (s->kv_flat[t] < 0 || s->kv_flat[t] >= s->token_slots) return HD_BAD_TOKEN_SLOT;
    }
    int64_t scratch = 0;
    for (int64_t l = 0; l < m->n_layers; l++) scratch = max64(scratch, layer_scratch(&m->layers[l], B, H));
    const int64_t slots = hp_threads(); /* one attention score row per part */
    float *x = malloc(sizeof(float) * (size_t)(3 * B * H + scratch + slots * max_kv));
    if (!x) return HD_NO_MEMORY;
    float *xn = x + B * H, *delta = xn + B * H, *work = delta + B * H, *scores = work + scratch;
    GemmSet g = {0};
    for (int64_t b = 0; b < B; b++) {
        const float *row = m->embed + s->ids[b] * H;
        for (int64_t i = 0; i < H; i++) x[b * H + i] = m->embed_scale != 1.0 ? row[i] * (float)m->embed_scale : row[i];
    }
    for (int64_t l = 0; l < m->n_layers; l++) {
        const HDLayer *L = &m->layers[l];
        for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, L->in_norm, H, m->eps, xn + b * H);
        if (L->kind == 0)
            deltanet(m, L, s, xn, delta, work, &g);
        else
            attention(m, L, s, xn, delta, work, scores, max_kv, slots, &g);
        for (int64_t i = 0; i < B * H; i++) x[i] += delta[i];
        for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, L->post_norm, H, m->eps, xn + b * H);
        if (L->n_exp > 0)
            moe(m, L, s, xn, delta, work);
        else
            swiglu_mlp(L, H, xn, B, delta, work);
        for (int64_t i = 0; i < B * H; i++) x[i] += delta[i];
    }
    for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, m->final_norm, H, m->eps, xn + b * H);
    gemm_add(&g, m->lm_head, NULL, m->vocab, H, xn, H, B, s->logits, m->vocab);
    gemm_run(&g);
    free(x);
    return HD_OK;
}
