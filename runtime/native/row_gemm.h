/* Row-major GEMV/GEMM for the decode kernels (header-only; hybrid_decode.c), fp32 or bf16 weights (HDMat) on fp32
 * activations: `gemm` (dot_gemm.h) streams each weight row once for all B rows of a batch, `gemm_rows` takes
 * wide_gemm.h's broadcast form instead from HD_WIDE_ROWS rows on, and a GemmSet runs several projections of one
 * phase as ONE region of parallel.h's pool, split in 4-row blocks so every row is computed by the same code in the
 * same order whichever thread runs it (bit-identical to one thread). `dot` is the step's fp32 vector dot product
 * (norms, attention scores, the recurrence).
 */
#ifndef HYBRIDCTL_ROW_GEMM_H
#define HYBRIDCTL_ROW_GEMM_H

#include "dot_gemm.h"
#include "parallel.h"
#include "wide_gemm.h"

#include <stdint.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

/* ---- fp32 dot products ---- */

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

/* The batch size from which gemm_rows takes gemm_wide: a decode batch (B <= 8) keeps the dot form (the weights
 * stream from DRAM there and the two forms ran alike at 8..12 rows; docs/performance.md, "Runtime hot path");
 * an extend's projections (its new tokens) and its busy experts take the register tile. Which form a call takes
 * depends only on B, never on the thread or the split, so every row is computed the same way under any threads.
 * bf16 weights on an AMX host take amx_gemm.h's tiles (through gemm) at every B instead: 16 weight rows against up
 * to 48 batch rows per tile pass (real Nemotron-H, a 48-token chain after 300 cached: 1270 -> 258 ms). */
#ifndef HD_WIDE_ROWS
#define HD_WIDE_ROWS 12
#endif

static inline void gemm_rows(const HDMat W, const float *restrict bias, int64_t N, int64_t K, const float *X,
                             int64_t ldx, int64_t B, float *Y, int64_t ldy) {
    int tiles = 0; /* bf16 weights on an AMX host take the tiles (dot_gemm.h's gemm) at every B */
#ifdef AG_AMX
    tiles = ag_takes(W.data, W.dtype == HD_BF16, K, B);
#endif
    if (B >= HD_WIDE_ROWS && !tiles)
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
    HDMat W;
    const float *bias;
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

static inline void gemm_add(GemmSet *g, const HDMat W, const float *bias, int64_t N, int64_t K, const float *X,
                            int64_t ldx, int64_t B, float *Y, int64_t ldy) {
    if (N <= 0 || B <= 0) return;
    if (g->n == 0) g->first[0] = 0, g->bytes = 0;
    g->job[g->n] = (GemmJob){W, bias, N, K, X, ldx, B, Y, ldy};
    g->first[g->n + 1] = g->first[g->n] + (N + 3) / 4;
    g->bytes += N * K * hd_elem_size(W);
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
        gemm_rows(hd_mat_at(q->W, r0 * q->K), q->bias ? q->bias + r0 : NULL, r1 - r0, q->K, q->X, q->ldx, q->B, q->Y + r0,
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
