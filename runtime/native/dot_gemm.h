/* The decode GEMV/GEMM of row_gemm.h in its dot form (header-only): Y[b, n] = W[n, :] . X[b, :] (+ bias[n]) for
 * b < B, n < N, each weight row streamed once for all B rows. W is fp32 or bf16 (HDMat); X, Y and every sum are fp32.
 * A bf16 weight is widened in a register (its 16 bits shifted into the high half of an fp32: exact), so a bf16 model
 * streams half the bytes and computes exactly what the fp32 kernel computes on the same weights rounded to bf16.
 *
 * One arithmetic for every path, dtype and split: 16 lanes, lane j the chain acc_j = fma(W[n, k], X[b, k], acc_j)
 * over k = j, j + 16, j + 32, ... from 0; then s_i = acc_i + acc_{i+8} (i < 8), the row's sum
 * ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)), then + bias[n]. The AVX-512 path holds the 16 lanes in one
 * register, the AVX2 + FMA path in two, the plain-C path in an array (fmaf): all three give the same bits
 * (tests/runtime/test_native_gemm.py builds each), and a row's result never depends on the rows around it or the
 * thread that computes it. Which path a library takes is fixed when build.py compiles it for the host it runs on
 * (-march=native; the cache key carries the CPU's flags), so a CPU without AVX-512 builds the AVX2 path.
 *
 * Not AVX-512 BF16's vdpbf16ps: it rounds X to bf16 too, and on the development host it ran no faster than this
 * kernel from L2 (106 GFLOP/s each at batch 8). On a host with AMX, bf16 weights take amx_gemm.h instead (X
 * rounded to bf16; its header states what that changes): there a batch of 8 rows costs what one row costs.
 */
#ifndef HYBRIDCTL_DOT_GEMM_H
#define HYBRIDCTL_DOT_GEMM_H

#include "amx_gemm.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DG_AVX2 1
#endif
#if defined(DG_AVX2) && defined(__AVX512F__)
#define DG_AVX512 1
#endif

enum { HD_F32 = 0, HD_BF16 = 1 };

/* A weight matrix as the model stores it: row-major, fp32 or bf16 (the raw 16-bit patterns). */
typedef struct {
    const void *data;
    int64_t dtype; /* HD_F32 or HD_BF16 */
} HDMat;

static inline int64_t hd_elem_size(HDMat m) { return m.dtype == HD_BF16 ? 2 : 4; }

/* The matrix from element `at` on (a row, an expert's slice). */
static inline HDMat hd_mat_at(HDMat m, int64_t at) {
    return (HDMat){(const char *)m.data + at * hd_elem_size(m), m.dtype};
}

static inline float hd_bf16_to_f32(uint16_t v) {
    const uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* W's element i widened to fp32. */
static inline float hd_mat_get(HDMat m, int64_t i) {
    return m.dtype == HD_BF16 ? hd_bf16_to_f32(((const uint16_t *)m.data)[i]) : ((const float *)m.data)[i];
}

/* The row sum of the 16 lanes, in the order above. */
static inline float dg_lanes_sum(const float a[16]) {
    float s[8];
    for (int i = 0; i < 8; i++) s[i] = a[i] + a[i + 8];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* A row's 16 chains continued over k0 .. K-1 (k0 a multiple of 16): element k goes to lane k mod 16. */
static inline void dg_tail(const HDMat w, int64_t row, int64_t k0, int64_t K, const float *x, float a[16]) {
    for (int64_t k = k0; k < K; k++) a[k & 15] = fmaf(hd_mat_get(w, row * K + k), x[k], a[k & 15]);
}

#ifndef HD_AHEAD
#define HD_AHEAD 1
#endif
#ifndef HD_HINT
#define HD_HINT _MM_HINT_T0
#endif

#ifdef DG_AVX2
/* 16 lanes: one zmm with AVX-512, two ymm (lanes 0..7, 8..15) with AVX2. */
#ifdef DG_AVX512
typedef __m512 dg_v16;
static inline dg_v16 dg_zero(void) { return _mm512_setzero_ps(); }
static inline dg_v16 dg_fma(dg_v16 a, dg_v16 b, dg_v16 c) { return _mm512_fmadd_ps(a, b, c); }
static inline dg_v16 dg_load_x(const float *x) { return _mm512_loadu_ps(x); }
static inline dg_v16 dg_load_w(const void *w, int64_t i, const int bf16) {
    if (bf16) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float *)w + i);
}
/* s_i = acc_i + acc_{i+8}: the 8 half sums. */
static inline __m256 dg_fold(dg_v16 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
static inline void dg_store(float *p, dg_v16 a) { _mm512_storeu_ps(p, a); }
#else
typedef struct {
    __m256 lo, hi;
} dg_v16;
static inline dg_v16 dg_zero(void) { return (dg_v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline dg_v16 dg_fma(dg_v16 a, dg_v16 b, dg_v16 c) {
    return (dg_v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline dg_v16 dg_load_x(const float *x) { return (dg_v16){_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)}; }
static inline __m256 dg_widen8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline dg_v16 dg_load_w(const void *w, int64_t i, const int bf16) {
    if (bf16) {
        const uint16_t *p = (const uint16_t *)w + i;
        return (dg_v16){dg_widen8(p), dg_widen8(p + 8)};
    }
    const float *p = (const float *)w + i;
    return (dg_v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}
static inline __m256 dg_fold(dg_v16 a) { return _mm256_add_ps(a.lo, a.hi); }
static inline void dg_store(float *p, dg_v16 a) { _mm256_storeu_ps(p, a.lo), _mm256_storeu_ps(p + 8, a.hi); }
#endif

/* [sum of row 0, .., sum of row 3] from the 8 half sums of 4 rows: ((s0+s1)+(s2+s3)) + ((s4+s5)+(s6+s7)) each. */
static inline __m128 dg_sum4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Rows n .. n+RW-1 (row stride K; RW 1, 2 or 4) times batch rows b .. b+RB-1: Y[b + r, n + i]. RW and RB are
 * constants at every call (the loops unroll into RW x RB accumulators). */
static inline __attribute__((always_inline)) void dg_block(const HDMat W, const float *bias, int64_t n, int64_t K,
                                                           const float *X, int64_t ldx, int64_t b, float *Y,
                                                           int64_t ldy, const int RW, const int RB, const int bf16) {
    const int64_t K16 = K & ~(int64_t)15;
    const void *w = W.data;
    dg_v16 a[4][4];
    for (int i = 0; i < RW; i++)
        for (int r = 0; r < RB; r++) a[i][r] = dg_zero();
    for (int64_t k = 0; k < K16; k += 16) {
        dg_v16 wv[4];
        for (int i = 0; i < RW; i++) wv[i] = dg_load_w(w, (n + i) * K + k, bf16);
        for (int r = 0; r < RB; r++) {
            const dg_v16 xv = dg_load_x(X + (b + r) * ldx + k);
            for (int i = 0; i < RW; i++) a[i][r] = dg_fma(wv[i], xv, a[i][r]);
        }
    }
    for (int r = 0; r < RB; r++) {
        float *y = Y + (b + r) * ldy + n;
        if (K16 == K) {
            const __m256 s0 = dg_fold(a[0][r]), s1 = RW > 1 ? dg_fold(a[1][r]) : s0;
            const __m128 v = RW == 4 ? dg_sum4(s0, s1, dg_fold(a[2][r]), dg_fold(a[3][r])) : dg_sum4(s0, s1, s0, s1);
            float sums[4];
            _mm_storeu_ps(sums, v);
            for (int i = 0; i < RW; i++) y[i] = sums[i] + (bias ? bias[n + i] : 0.0f);
            continue;
        }
        const float *x = X + (b + r) * ldx;
        for (int i = 0; i < RW; i++) {
            float lanes[16];
            dg_store(lanes, a[i][r]);
            dg_tail(W, n + i, K16, K, x, lanes);
            y[i] = dg_lanes_sum(lanes) + (bias ? bias[n + i] : 0.0f);
        }
    }
}

/* Rows n .. N-1 in blocks of 4 (the last 1..3 rows by the plain form), every batch row. How a block is tiled never
 * changes a row's chains, only how many batch rows share each weight load and widening: 4 x 4 with AVX-512's 32
 * registers; with AVX2's 16, 1 row x 4 batch rows (8 accumulators) where 4 remain, else 4 rows x 1. */
static inline __attribute__((always_inline)) int64_t dg_rows(const HDMat W, const float *bias, int64_t N, int64_t K,
                                                             const float *X, int64_t ldx, int64_t B, float *Y,
                                                             int64_t ldy, const int bf16) {
    const int64_t esize = bf16 ? 2 : 4;
    int64_t n = 0;
    for (; n + 4 <= N; n += 4) {
        /* The rows of a block HD_AHEAD blocks on, fetched while this one computes: with B > 1 the hardware
         * prefetcher alone falls behind and the stream stalls (B=8 ran 2.6x slower than B=1 from DRAM). */
        if (n + 4 * (HD_AHEAD + 1) <= N) {
            const char *ahead = (const char *)W.data + (n + 4 * HD_AHEAD) * K * esize;
            for (int64_t at = 0; at < 4 * K * esize; at += 64) _mm_prefetch(ahead + at, HD_HINT);
        }
        int64_t b = 0;
#ifdef DG_AVX512
        for (; b + 4 <= B; b += 4) dg_block(W, bias, n, K, X, ldx, b, Y, ldy, 4, 4, bf16);
#else
        for (; b + 4 <= B; b += 4)
            for (int64_t i = 0; i < 4; i++) dg_block(W, bias, n + i, K, X, ldx, b, Y, ldy, 1, 4, bf16);
#endif
        for (; b < B; b++) dg_block(W, bias, n, K, X, ldx, b, Y, ldy, 4, 1, bf16);
    }
    return n;
}
#endif

/* The plain form of rows n0 .. N-1: the same 16 chains, one float each. */
static inline void dg_plain(const HDMat W, const float *bias, int64_t n0, int64_t N, int64_t K, const float *X,
                            int64_t ldx, int64_t B, float *Y, int64_t ldy) {
    for (int64_t n = n0; n < N; n++)
        for (int64_t b = 0; b < B; b++) {
            float lanes[16] = {0};
            dg_tail(W, n, 0, K, X + b * ldx, lanes);
            Y[b * ldy + n] = dg_lanes_sum(lanes) + (bias ? bias[n] : 0.0f);
        }
}

static inline void gemm(const HDMat W, const float *restrict bias, int64_t N, int64_t K, const float *X, int64_t ldx,
                        int64_t B, float *Y, int64_t ldy) {
    int64_t n = 0;
#ifdef AG_AMX
    if (ag_takes(W.data, W.dtype == HD_BF16, K, B) && ag_gemm((const uint16_t *)W.data, bias, N, K, X, ldx, B, Y, ldy))
        return;
#endif
#ifdef DG_AVX2
    n = W.dtype == HD_BF16 ? dg_rows(W, bias, N, K, X, ldx, B, Y, ldy, 1) : dg_rows(W, bias, N, K, X, ldx, B, Y, ldy, 0);
#endif
    dg_plain(W, bias, n, N, K, X, ldx, B, Y, ldy);
}

#endif
