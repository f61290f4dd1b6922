/* Row-major fp32 GEMV/GEMM for the decode kernels (header-only; hybrid_decode.c): `gemm` streams each weight row once
 * for all B rows of a batch (AVX2 + FMA blocks of 4 weight rows x 2 batch rows, software prefetch of the next block),
 * `gemm_rows` takes wide_gemm.h's broadcast form instead from HD_WIDE_ROWS rows on, and a GemmSet runs several
 * projections of one phase as ONE region of parallel.h's pool, split in 4-row blocks so
 * every row is computed by the same code in the same order whichever thread runs it (bit-identical to one thread).
 */
#ifndef HYBRIDCTL_ROW_GEMM_H
#define HYBRIDCTL_ROW_GEMM_H

#include "parallel.h"
#include "wide_gemm.h"

#include <stdint.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

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
static inline void gemm(const float *restrict W, const float *restrict bias, int64_t N, int64_t K, const float *X,
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

/* The batch size from which gemm_rows takes gemm_wide: a decode batch (B <= 8) keeps the dot form (the weights
 * stream from DRAM there and the two forms ran alike at 8..12 rows; docs/performance.md, "Native extend GEMMs");
 * an extend's projections (its new tokens) and its busy experts take the register tile. Which form a call takes
 * depends only on B, never on the thread or the split, so every row is computed the same way under any threads. */
#ifndef HD_WIDE_ROWS
#define HD_WIDE_ROWS 12
#endif

static inline void gemm_rows(const float *restrict W, const float *restrict bias, int64_t N, int64_t K, const float *X,
                             int64_t ldx, int64_t B, float *Y, int64_t ldy) {
    if (B >= HD_WIDE_ROWS)
        gemm_wide(W, bias, N, K, X, ldx, B, Y, ldy);
    else
        gemm(W, bias, N, K, X, ldx, B, Y, ldy);
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

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static inline void gemm_add(GemmSet *g, const float *W, const float *bias, int64_t N, int64_t K, const float *X,
                            int64_t ldx, int64_t B, float *Y, int64_t ldy) {
    if (N <= 0 || B <= 0) return;
    if (g->n == 0) g->first[0] = 0, g->bytes = 0;
    g->job[g->n] = (GemmJob){W, bias, N, K, X, ldx, B, Y, ldy};
    g->first[g->n + 1] = g->first[g->n] + (N + 3) / 4;
    g->bytes += N * K * (int64_t)sizeof(float);
    g->n++;
}

/* Rows [4*lo, 4*hi) of the jobs, clipped to each job's N: a block starts on a multiple of 4 of its job, so gemm
 * blocks it exactly as one call over all N rows would (the same arithmetic per row). */
static inline void gemm_blocks(void *ctx, int64_t begin, int64_t end) {
    const GemmSet *g = ctx;
    for (int j = 0; j < g->n; j++) {
        const int64_t lo = max64(begin, g->first[j]), hi = min64(end, g->first[j + 1]);
        if (lo >= hi) continue;
        const GemmJob *q = &g->job[j];
        const int64_t r0 = (lo - g->first[j]) * 4, r1 = min64((hi - g->first[j]) * 4, q->N);
        gemm_rows(q->W + r0 * q->K, q->bias ? q->bias + r0 : NULL, r1 - r0, q->K, q->X, q->ldx, q->B, q->Y + r0,
                  q->ldy);
    }
}

/* The grain of a region over `units` units that stream `bytes` of weights in all. */
static inline int64_t grain_for(int64_t units, int64_t bytes) {
    const int64_t per_unit = units > 0 ? bytes / units : 0;
    return per_unit > 0 ? max64(1, (hd_part_bytes + per_unit - 1) / per_unit) : units;
}

static inline void gemm_run(GemmSet *g) {
    if (g->n == 0) return;
    const int64_t units = g->first[g->n];
    hp_parallel_for(units, grain_for(units, g->bytes), gemm_blocks, g);
    g->n = 0;
}

#endif
