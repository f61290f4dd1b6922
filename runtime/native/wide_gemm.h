/* The GEMM of many batch rows (an extend's tokens, a busy expert's tokens) for row_gemm.h: broadcast form over a
 * panel of X transposed on the fly, Xt[k][16] (16 batch rows, in L1), times 6 weight rows broadcast one element at
 * a time: a 6x16 register tile (12 accumulators, 8 loads per 12 FMAs; no horizontal sums). The dot form of
 * dot_gemm.h loads every X vector once per weight row and ends each row in horizontal sums: fine for a decode's
 * 1..8 rows, where the weights stream from DRAM, but its loads bound it once the rows are many.
 *
 * Every output is the chain acc = fma(W[n, k], X[b, k], acc) over k = 0, 1, ..., K-1 from 0 (then + bias[n]),
 * whatever the tile it falls in, the rows before it or the part of N a thread was given: results are bit-identical
 * under any thread count and any split of the rows. The plain-C form computes the same chain with fmaf.
 */
#ifndef HYBRIDCTL_WIDE_GEMM_H
#define HYBRIDCTL_WIDE_GEMM_H

#include "dot_gemm.h"

#include <math.h>
#include <stdint.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define WG_AVX 1
#endif

/* The panel: up to WG_BC batch rows x WG_KC of K (64 KB on the stack, in L2; a 16-row slice of it in L1), packed once
 * per call and used by every weight row, so the weights stream once (an extend's experts read them from DRAM). More
 * rows, or a longer K, take several panels; a chunk of K after the first continues each chain from the partial sums
 * it stored in Y. */
#define WG_KC 256
#ifndef WG_BC
#define WG_BC 64
#endif
#define WG_NR 16

#ifdef WG_AVX
/* The 8 x 8 block at x (row stride ldx) transposed into xt (row stride ld). */
static inline void wg_transpose8(const float *x, int64_t ldx, float *xt, int64_t ld) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(x + i * ldx);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(xt + i * ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(xt + (i + 4) * ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}
#endif

/* Xt[k][j] = X[b0 + j, k0 + k] for j < bc, 0 for bc <= j < ld (a copy: the values are the same either way). */
static inline void wg_pack(const float *X, int64_t ldx, int64_t b0, int64_t bc, int64_t k0, int64_t kc, float *Xt,
                           int64_t ld) {
    int64_t j0 = 0;
#ifdef WG_AVX
    for (; j0 + 8 <= bc; j0 += 8) {
        int64_t k = 0;
        for (; k + 8 <= kc; k += 8) wg_transpose8(X + (b0 + j0) * ldx + k0 + k, ldx, Xt + k * ld + j0, ld);
        for (; k < kc; k++)
            for (int64_t j = j0; j < j0 + 8; j++) Xt[k * ld + j] = X[(b0 + j) * ldx + k0 + k];
    }
#endif
    for (int64_t j = j0; j < ld; j++) {
        const float *x = j < bc ? X + (b0 + j) * ldx + k0 : NULL;
        for (int64_t k = 0; k < kc; k++) Xt[k * ld + j] = x ? x[k] : 0.0f;
    }
}

/* Rows n0 .. n0+mr-1 (mr <= MR) times panel columns j < bw over the chunk k0 .. k0+kc: Y[b0 + j, n0 + i]. A tile is
 * MR weight rows x 8*NV columns: 6 x 16 (12 accumulators, 8 loads per 12 FMAs) while 9..16 batch rows remain, 12 x 8
 * (12 accumulators, 13 loads) for the last 1..8. Xt: the panel's columns b0.. (leading dimension ld). MR and NV
 * are constants at every call (the loops unroll). */
static inline __attribute__((always_inline)) void wg_tile(const float *restrict W, int64_t K, int64_t n0, int64_t mr,
                                                          const float *restrict Xt, int64_t ld, int64_t k0, int64_t kc,
                                                          int first, const float *restrict ahead, float *Y,
                                                          int64_t ldy, int64_t b0, int64_t bw, const int MR,
                                                          const int NV) {
    float t[12 * WG_NR];
    if (!first)
        for (int64_t i = 0; i < mr; i++)
            for (int64_t j = 0; j < bw; j++) t[i * WG_NR + j] = Y[(b0 + j) * ldy + n0 + i];
    /* Rows past mr repeat row n0 (valid memory); their sums are dropped. */
    const float *w[12];
    for (int i = 0; i < MR; i++) w[i] = W + (n0 + (i < mr ? i : 0)) * K + k0;
#ifdef WG_AVX
    __m256 a[12][2];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < NV; v++) a[i][v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(t + i * WG_NR + 8 * v);
    for (int64_t k = 0; k < kc; k++) {
        /* The next tile's weight rows, a line of each every 16 k: spread over the tile, not a burst that fills the
         * miss buffers (an extend's experts stream their weights from DRAM). */
        if (ahead && (k & 15) == 0)
            for (int i = 0; i < MR; i++) _mm_prefetch((const char *)(ahead + i * K + k), _MM_HINT_T0);
        __m256 x[2];
        for (int v = 0; v < NV; v++) x[v] = _mm256_loadu_ps(Xt + k * ld + 8 * v);
        for (int i = 0; i < MR; i++) {
            const __m256 wv = _mm256_broadcast_ss(w[i] + k);
            for (int v = 0; v < NV; v++) a[i][v] = _mm256_fmadd_ps(wv, x[v], a[i][v]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(t + i * WG_NR + 8 * v, a[i][v]);
#else
    (void)ahead;
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < bw; j++) {
            float acc = first ? 0.0f : t[i * WG_NR + j];
            for (int64_t k = 0; k < kc; k++) acc = fmaf(w[i][k], Xt[k * ld + j], acc);
            t[i * WG_NR + j] = acc;
        }
#endif
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < bw; j++) Y[(b0 + j) * ldy + n0 + i] = t[i * WG_NR + j];
}

/* A bf16 matrix's rows n0 .. n0+m-1, columns k0 .. k0+kc-1, widened into wb [m][kc] (exact), the next block's rows
 * (`ahead`, or NULL) prefetched meanwhile: the tiles then run the fp32 chains on them, the same bits as on fp32
 * weights rounded to bf16. */
static inline void wg_widen(const uint16_t *W, int64_t K, int64_t n0, int64_t m, int64_t k0, int64_t kc,
                            const uint16_t *ahead, float *wb) {
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *src = W + (n0 + i) * K + k0;
#ifdef WG_AVX
        if (ahead)
            for (int64_t k = 0; k < kc; k += 32) _mm_prefetch((const char *)(ahead + i * K + k), _MM_HINT_T0);
#else
        (void)ahead;
#endif
        for (int64_t k = 0; k < kc; k++) wb[i * kc + k] = hd_bf16_to_f32(src[k]);
    }
}

/* Y[b, n] = W[n, :] . X[b, :] (+ bias[n]) for b < B, n < N, as the chains above: tiles of 12 weight rows, each
 * across the panel's batch rows (two 6 x 16 tiles per 16 rows, one 12 x 8 for a last 1..8), the first of them
 * prefetching the next 12 rows. A bf16 W's 12 rows of a chunk are widened first (wg_widen). */
static __attribute__((noinline)) void gemm_wide(const HDMat W, const float *restrict bias, int64_t N, int64_t K,
                                                const float *X, int64_t ldx, int64_t B, float *Y, int64_t ldy) {
    float Xt[WG_KC * WG_BC];
    float wb[12 * WG_KC];
    const int bf16 = W.dtype == HD_BF16;
    for (int64_t b0 = 0; b0 < B; b0 += WG_BC) {
        const int64_t bc = B - b0 < WG_BC ? B - b0 : WG_BC, ld = (bc + 7) & ~(int64_t)7;
        for (int64_t k0 = 0; k0 < K; k0 += WG_KC) {
            const int64_t kc = K - k0 < WG_KC ? K - k0 : WG_KC;
            wg_pack(X, ldx, b0, bc, k0, kc, Xt, ld);
            for (int64_t n0 = 0; n0 < N; n0 += 12) {
                const int64_t m = N - n0 < 12 ? N - n0 : 12, m0 = m < 6 ? m : 6, m1 = m - 6;
                /* The tiles' view: rows of Wt (stride Kt) from row nt, columns from kt, outputs from Yt. */
                const float *Wt = (const float *)W.data, *ahead = NULL;
                int64_t Kt = K, nt = n0, kt = k0;
                float *Yt = Y;
                if (bf16) {
                    const uint16_t *w16 = (const uint16_t *)W.data;
                    wg_widen(w16, K, n0, m, k0, kc, n0 + 24 <= N ? w16 + (n0 + 12) * K + k0 : NULL, wb);
                    Wt = wb, Kt = kc, nt = 0, kt = 0, Yt = Y + n0;
                } else if (n0 + 24 <= N) {
                    ahead = Wt + (n0 + 12) * K + k0;
                }
                for (int64_t j = 0; j < bc; j += WG_NR) {
                    const int64_t bw = bc - j < WG_NR ? bc - j : WG_NR;
                    const float *a0 = j == 0 ? ahead : NULL, *a1 = j == 0 && ahead ? ahead + 6 * K : NULL;
                    if (bw > 8) {
                        wg_tile(Wt, Kt, nt, m0, Xt + j, ld, kt, kc, k0 == 0, a0, Yt, ldy, b0 + j, bw, 6, 2);
                        if (m1 > 0)
                            wg_tile(Wt, Kt, nt + 6, m1, Xt + j, ld, kt, kc, k0 == 0, a1, Yt, ldy, b0 + j, bw, 6, 2);
                    } else {
                        wg_tile(Wt, Kt, nt, m, Xt + j, ld, kt, kc, k0 == 0, a0, Yt, ldy, b0 + j, bw, 12, 1);
                    }
                }
            }
        }
    }
    if (bias)
        for (int64_t b = 0; b < B; b++)
            for (int64_t n = 0; n < N; n++) Y[b * ldy + n] += bias[n];
}

#endif
