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
 */

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

static int deltanet(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work) {
    const int64_t B = s->batch, H = m->hidden;
    const int64_t key_dim = L->nk * L->dk, value_dim = L->nv * L->dv, conv_dim = 2 * key_dim + value_dim;
    const int64_t width = L->kernel - 1, ratio = L->nv / L->nk;
    float *mixed = work; /* [B, conv_dim] */
    float *z = mixed + B * conv_dim; /* [B, value_dim] */
    float *bb = z + B * value_dim; /* [B, nv] */
    float *aa = bb + B * L->nv; /* [B, nv] */
    float *o = aa + B * L->nv; /* [B, value_dim] */
    float *qn = o + B * value_dim; /* [2 * nk * dk] */
    gemm(L->w_qkv, NULL, conv_dim, H, xn, H, B, mixed, conv_dim);
    gemm(L->w_z, NULL, value_dim, H, xn, H, B, z, value_dim);
    gemm(L->w_b, NULL, L->nv, H, xn, H, B, bb, L->nv);
    gemm(L->w_a, NULL, L->nv, H, xn, H, B, aa, L->nv);
    float *conv = s->conv_pool[L->ordinal];
    float *ssm = s->ssm_pool[L->ordinal];
    const float qscale = 1.0f / sqrtf((float)L->dk);
    for (int64_t b = 0; b < B; b++) {
        const int64_t slot = s->state_slots[b];
        float *mx = mixed + b * conv_dim;
        float *cs = conv + slot * conv_dim * width;
        /* Depthwise causal conv over [state, x], then silu; the state rolls by one. */
        for (int64_t c = 0; c < conv_dim; c++) {
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
        /* l2-normalized q and k per key head (q also scaled by dk^-0.5, as the recurrent step does). */
        for (int64_t h = 0; h < 2 * L->nk; h++) {
            const float *src = mx + h * L->dk;
            float *dst = qn + h * L->dk;
            const float r = 1.0f / sqrtf(dot(src, src, L->dk) + 1e-6f);
            for (int64_t i = 0; i < L->dk; i++) dst[i] = src[i] * r;
            if (h < L->nk)
                for (int64_t i = 0; i < L->dk; i++) dst[i] *= qscale;
        }
        const float *v = mx + 2 * key_dim;
        for (int64_t h = 0; h < L->nv; h++) {
            const float *q = qn + (h / ratio) * L->dk;
            const float *k = qn + key_dim + (h / ratio) * L->dk;
            const float beta = sigmoidf_(bb[b * L->nv + h]);
            const float decay = expf(L->neg_a[h] * softplusf_(aa[b * L->nv + h] + L->dt_bias[h]));
            float *S = ssm + ((slot * L->nv + h) * L->dv) * L->dk; /* [dv, dk] */
            float *oh = o + b * value_dim + h * L->dv;
            for (int64_t i = 0; i < L->dv; i++) {
                float *row = S + i * L->dk;
                for (int64_t j = 0; j < L->dk; j++) row[j] *= decay;
                const float delta = (v[h * L->dv + i] - dot(row, k, L->dk)) * beta;
                for (int64_t j = 0; j < L->dk; j++) row[j] += delta * k[j];
                oh[i] = dot(row, q, L->dk);
            }
            /* Gated RMSNorm: norm(o) * w * silu(z). */
            const float *zh = z + b * value_dim + h * L->dv;
            rms_norm(oh, L->gnorm_w, L->dv, m->eps, oh);
            for (int64_t i = 0; i < L->dv; i++) oh[i] *= siluf_(zh[i]);
        }
    }
    gemm(L->w_out, NULL, H, value_dim, o, value_dim, B, out, H);
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

static int attention(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work,
                     float *scores) {
    const int64_t B = s->batch, H = m->hidden, hd = L->hd, nh = L->nh, nkv = L->nkv;
    const int64_t qw = nh * hd * (L->out_gate ? 2 : 1), kvw = nkv * hd, group = nh / nkv;
    float *q = work; /* [B, qw] */
    float *k = q + B * qw; /* [B, kvw] */
    float *v = k + B * kvw; /* [B, kvw] */
    float *o = v + B * kvw; /* [B, nh * hd] */
    float *cs = o + B * nh * hd; /* [rot_dim / 2] */
    float *sn = cs + L->rot_dim / 2 + 1;
    gemm(L->wq, L->bq, qw, H, xn, H, B, q, qw);
    gemm(L->wk, L->bk, kvw, H, xn, H, B, k, kvw);
    gemm(L->wv, L->bv, kvw, H, xn, H, B, v, kvw);
    float *kp = s->k_pool[L->ordinal], *vp = s->v_pool[L->ordinal];
    const int64_t qstride = L->out_gate ? 2 * hd : hd; /* q_proj emits [query | gate] per head */
    const float scale = (float)L->attn_scale;
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
    for (int64_t b = 0; b < B; b++) {
        const int64_t *locs = s->kv_flat + s->kv_offsets[b];
        const int64_t n = s->kv_offsets[b + 1] - s->kv_offsets[b];
        for (int64_t h = 0; h < nh; h++) {
            const float *qh = q + b * qw + h * qstride;
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
            float *oh = o + b * nh * hd + h * hd;
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
    gemm(L->wo, L->bo, H, nh * hd, o, nh * hd, B, out, H);
    return HD_OK;
}

/* ---- feed-forward ---- */

/* out[B, H] = down(silu(gate x) * up x) */
static void swiglu_mlp(const float *wg, const float *wu, const float *wd, int64_t inter, int64_t H, const float *x,
                       int64_t B, float *out, float *work) {
    float *g = work, *u = work + B * inter;
    gemm(wg, NULL, inter, H, x, H, B, g, inter);
    gemm(wu, NULL, inter, H, x, H, B, u, inter);
    for (int64_t i = 0; i < B * inter; i++) g[i] = siluf_(g[i]) * u[i];
    gemm(wd, NULL, H, inter, g, inter, B, out, H);
}

static void moe(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work) {
    const int64_t B = s->batch, H = m->hidden, E = L->n_exp, K = L->top_k, I = L->exp_inter;
    /* Offsets rounded to even floats so the int64 arrays stay 8-byte aligned. */
#define HD_NEXT(p, n) ((p) + (((n) + 1) & ~(int64_t)1))
    float *probs = work; /* [B, E] */
    float *topw = HD_NEXT(probs, B * E); /* [B, K] */
    int64_t *topi = (int64_t *)HD_NEXT(topw, B * K); /* [B, K] */
    float *rows = (float *)(topi + B * K); /* [B, H] gathered tokens of one expert */
    float *gu = rows + B * H; /* [B, 2I] */
    float *hbuf = gu + B * 2 * I; /* [B, I] */
    float *eo = hbuf + B * I; /* [B, H] */
    int64_t *tok = (int64_t *)HD_NEXT(eo, B * H); /* [B] */
    float *tokw = (float *)(tok + B); /* [B] */
    float *rest = tokw + B;
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
    memset(out, 0, (size_t)(B * H) * sizeof(float));
    /* Experts in ascending id order: each token's terms are summed in that order, as the torch paths sum them. */
    for (int64_t e = 0; e < E; e++) {
        int64_t cnt = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < K; j++)
                if (topi[b * K + j] == e) {
                    tok[cnt] = b;
                    tokw[cnt] = topw[b * K + j];
                    memcpy(rows + cnt * H, xn + b * H, (size_t)H * sizeof(float));
                    cnt++;
                }
        if (!cnt) continue;
        const float *w_in = L->exp_gate_up + e * 2 * I * H, *w_out = L->exp_down + e * H * I;
        gemm(w_in, NULL, 2 * I, H, rows, H, cnt, gu, 2 * I);
        for (int64_t r = 0; r < cnt; r++)
            for (int64_t i = 0; i < I; i++) hbuf[r * I + i] = siluf_(gu[r * 2 * I + i]) * gu[r * 2 * I + I + i];
        gemm(w_out, NULL, H, I, hbuf, I, cnt, eo, H);
        for (int64_t r = 0; r < cnt; r++) {
            float *dst = out + tok[r] * H;
            for (int64_t i = 0; i < H; i++) dst[i] += eo[r * H + i] * tokw[r];
        }
    }
    if (L->mlp_inter > 0) {
        float *sh = rest; /* [B, H] */
        float *sg = sh + B * H; /* [B] */
        swiglu_mlp(L->mlp_gate, L->mlp_up, L->mlp_down, L->mlp_inter, H, xn, B, sh, sg + B);
        if (L->shared_gate) {
            gemm(L->shared_gate, NULL, 1, H, xn, H, B, sg, 1);
            for (int64_t b = 0; b < B; b++) {
                const float gate = sigmoidf_(sg[b]);
                for (int64_t i = 0; i < H; i++) out[b * H + i] += gate * sh[b * H + i];
            }
        } else {
            for (int64_t i = 0; i < B * H; i++) out[i] += sh[i];
        }
    }
}

/* ---- the step ---- */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Floats of scratch one layer needs for B sequences. */
static int64_t layer_scratch(const HDLayer *L, int64_t B, int64_t H) {
    int64_t need = 0;
    if (L->kind == 0) {
        const int64_t vd = L->nv * L->dv, conv = 2 * L->nk * L->dk + vd;
        need = B * (conv + 2 * vd + 2 * L->nv) + 2 * L->nk * L->dk;
    } else {
        const int64_t qw = L->nh * L->hd * (L->out_gate ? 2 : 1);
        need = B * (qw + 2 * L->nkv * L->hd + L->nh * L->hd) + L->rot_dim + 2;
    }
    int64_t ff = 0;
    if (L->n_exp > 0) {
        ff = B * (L->n_exp + 4 * L->top_k + 3 * H + 3 * L->exp_inter + 2 * L->mlp_inter + 8) + 16;
    } else {
        ff = 2 * B * L->mlp_inter;
    }
    return max64(need, ff) + 16;
}

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
    float *x = malloc(sizeof(float) * (size_t)(3 * B * H + scratch + max_kv));
    if (!x) return HD_NO_MEMORY;
    float *xn = x + B * H, *delta = xn + B * H, *work = delta + B * H, *scores = work + scratch;
    for (int64_t b = 0; b < B; b++) {
        const float *row = m->embed + s->ids[b] * H;
        for (int64_t i = 0; i < H; i++) x[b * H + i] = m->embed_scale != 1.0 ? row[i] * (float)m->embed_scale : row[i];
    }
    for (int64_t l = 0; l < m->n_layers; l++) {
        const HDLayer *L = &m->layers[l];
        for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, L->in_norm, H, m->eps, xn + b * H);
        if (L->kind == 0)
            deltanet(m, L, s, xn, delta, work);
        else
            attention(m, L, s, xn, delta, work, scores);
        for (int64_t i = 0; i < B * H; i++) x[i] += delta[i];
        for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, L->post_norm, H, m->eps, xn + b * H);
        if (L->n_exp > 0)
            moe(m, L, s, xn, delta, work);
        else
            swiglu_mlp(L->mlp_gate, L->mlp_up, L->mlp_down, L->mlp_inter, H, xn, B, delta, work);
        for (int64_t i = 0; i < B * H; i++) x[i] += delta[i];
    }
    for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, m->final_norm, H, m->eps, xn + b * H);
    gemm(m->lm_head, NULL, m->vocab, H, xn, H, B, s->logits, m->vocab);
    free(x);
    return HD_OK;
}
