/* The dot form of dot_gemm.h on AMX tiles for bf16 weights (header-only): Y[b, n] = W[n, :] . X[b, :] (+ bias[n]).
 *
 * Why: a decode batch of 8 rows runs the FMA dot form at its compute bound, ~2.8x a batch-1 step's time per matrix
 * (one zmm FMA per cycle on the development host); one tdpbf16ps does 16 weight rows x 16 batch rows x 32 of K, so
 * a batch of 8 costs what a batch of 1 costs, the weights' read (benchmarks/amx_gemm_bench.c: 8192 x 2048 bf16,
 * batch 8, one thread: 2.3-2.9 ms against 8.8-12.8 ms; batch 1 by the FMA form: 2.0-2.3 ms).
 *
 * The changed contract (bf16 weights on an AMX host only; fp32 weights never take this path): X is rounded to
 * bf16 (nearest even) and the tile unit sums pairs of products in its own order, so a bf16 matrix's rows no longer
 * carry the bits of the fp32 kernel on the same weights rounded to bf16, nor the bits of the AVX-512 / AVX2 /
 * plain-C builds. What still holds: every output element is computed from its own weight row and its own batch
 * row only (the tile unit keeps the elements of C apart), through the same chunks of 32 of K in the same order,
 * whichever thread, split of the rows, or batch size, so a row's result is bit-identical at batch 1 and batch 8
 * and under any thread count. Activations were bf16 in the reference (transformers' bf16 forward) anyway.
 *
 * AMX needs the kernel's permission (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, once per process); where that
 * fails (an older kernel, a VM that hides the state) `ag_ready` says no and dot_gemm.h runs its FMA form. The tile
 * configuration is per thread and torch's oneDNN loads its own, so every call loads ours and releases it.
 * -DHD_NO_AMX builds without this path (the tests build the FMA path on the same host that way).
 */
#ifndef HYBRIDCTL_AMX_GEMM_H
#define HYBRIDCTL_AMX_GEMM_H

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__x86_64__) && \
    defined(__linux__) && !defined(HD_NO_AMX)
#define AG_AMX 1
#include <immintrin.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern long syscall(long number, ...); /* unistd.h declares it only with _DEFAULT_SOURCE; the builds use -std=c11 */

#define AG_SYS_ARCH_PRCTL 158
#define AG_ARCH_REQ_XCOMP_PERM 0x1023
#define AG_XFEATURE_XTILEDATA 18
#define AG_MAX_B 16 /* batch rows one B tile holds: a batch up to this runs ag_gemm's narrow form */
#define AG_WIDE_TILES 3 /* B tiles (16 batch rows each) one A tile meets per pass in the wide form: 48 rows */
#ifndef AG_AHEAD_LINES
#define AG_AHEAD_LINES 12 /* cache lines of the next row group a narrow-form step prefetches (ag_gemm) */
#endif

/* Whether this library may use the tiles: 0 unknown, 1 granted, -1 refused or switched off (hd_set_bf16_tiles). */
static _Atomic int ag_state_ = 0;

/* Asked once; a refusal is remembered. */
static inline int ag_ready(void) {
    int s = atomic_load_explicit(&ag_state_, memory_order_relaxed);
    if (s == 0) {
        s = syscall(AG_SYS_ARCH_PRCTL, AG_ARCH_REQ_XCOMP_PERM, AG_XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        atomic_store_explicit(&ag_state_, s, memory_order_relaxed);
    }
    return s > 0;
}

typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) ag_config;

/* Tiles 0, 1: C (16 weight rows x B fp32); 2, 3: A (16 weight rows x 32 bf16 of K); 4: B (16 pairs of K x B). */
static inline void ag_configure(int64_t B) {
    ag_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 5; t++) c.rows[t] = 16;
    c.colsb[0] = c.colsb[1] = c.colsb[4] = (uint16_t)(4 * B);
    c.colsb[2] = c.colsb[3] = 64;
    _tile_loadconfig(&c);
}

/* X rounded to bf16 in the tiles' pair layout: for each chunk of 32 of K, 16 rows (a pair of K each) of `lb` pairs,
 * the batch rows 0 .. B-1 and zeros up to lb (lb >= B: the wide form pads the batch to whole tiles). */
static inline const uint32_t *ag_pack(const float *X, int64_t ldx, int64_t B, int64_t lb, int64_t K) {
    static _Thread_local uint32_t *buf;
    static _Thread_local int64_t cap;
    const int64_t need = K / 2 * lb;
    if (need > cap) {
        free(buf);
        buf = aligned_alloc(64, (size_t)((need * 4 + 63) & ~(int64_t)63));
        cap = buf ? need : 0;
        if (!buf) return NULL;
    }
    /* Whole blocks of 16 batch rows: their pairs of a chunk converted into the rows of `pairs`, then its columns
     * gathered into the pair rows (K 1024, 48 rows: 10.7 -> 5.6 us; written pair by pair with a stride of lb, the
     * stores were most of the time); the rows past them (a decode batch) keep that, cheaper there than a gather. */
    const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    int64_t b0 = 0;
    for (; b0 + 16 <= B; b0 += 16)
        for (int64_t k = 0; k < K; k += 32) {
            uint32_t pairs[16 * 16] __attribute__((aligned(64)));
            for (int64_t i = 0; i < 16; i++) {
                const float *x = X + (b0 + i) * ldx + k;
                _mm512_store_si512(pairs + i * 16,
                                   (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x)));
            }
            uint32_t *dst = buf + k / 2 * lb + b0;
            for (int p = 0; p < 16; p++)
                _mm512_storeu_si512(dst + p * lb, _mm512_i32gather_epi32(column, (const int *)(pairs + p), 4));
        }
    for (int64_t b = b0; b < B; b++)
        for (int64_t k = 0; k < K; k += 32) {
            uint32_t pairs[16];
            const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(X + b * ldx + k + 16), _mm512_loadu_ps(X + b * ldx + k));
            _mm512_storeu_si512(pairs, (__m512i)h);
            uint32_t *dst = buf + k / 2 * lb + b;
            for (int p = 0; p < 16; p++) dst[p * lb] = pairs[p];
        }
    if (lb > B)
        for (int64_t r = 0; r < K / 2; r++) memset(buf + r * lb + B, 0, (size_t)(lb - B) * 4);
    return buf;
}

/* The A tile of rows n .. n+m-1 (m <= 16; short groups zero-padded through `pad`), columns k .. k+31. */
static inline void ag_load_a(int t, const uint16_t *W, int64_t K, int64_t n, int64_t m, int64_t k, uint16_t *pad) {
    if (m == 16) {
        if (t == 2)
            _tile_loadd(2, W + n * K + k, K * 2);
        else
            _tile_loadd(3, W + n * K + k, K * 2);
        return;
    }
    for (int64_t i = 0; i < m; i++) memcpy(pad + i * 32, W + (n + i) * K + k, 64);
    if (t == 2)
        _tile_loadd(2, pad, 64);
    else
        _tile_loadd(3, pad, 64);
}

/* Rows n .. n+m-1 (m <= 16) of C tile t to Y (+ bias). */
static inline void ag_store(int t, const float *bias, int64_t n, int64_t m, int64_t B, float *Y, int64_t ldy) {
    float c[16][AG_MAX_B];
    if (t == 0)
        _tile_stored(0, c, AG_MAX_B * 4);
    else
        _tile_stored(1, c, AG_MAX_B * 4);
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < B; b++) Y[b * ldy + n + i] = c[i][b] + (bias ? bias[n + i] : 0.0f);
}

/* Whether ag_gemm takes this call: bf16 weights, K in whole chunks of 32, any batch, permission. */
static inline int ag_takes(const void *W, int bf16, int64_t K, int64_t B) {
    (void)W;
    return bf16 && K % 32 == 0 && K > 0 && B >= 1 && ag_ready();
}

/* Rows 0 .. N-1 in groups of 32 (two C tiles; the last 1..31 rows as one or two zero-padded groups), the next
 * group's rows prefetched while this one computes. Returns 0 (nothing done) when X could not be packed. */
static inline int ag_gemm_wide(const uint16_t *W, const float *bias, int64_t N, int64_t K, const float *X,
                               int64_t ldx, int64_t B, float *Y, int64_t ldy);

static inline int ag_gemm(const uint16_t *W, const float *bias, int64_t N, int64_t K, const float *X, int64_t ldx,
                          int64_t B, float *Y, int64_t ldy) {
    if (B > AG_MAX_B) return ag_gemm_wide(W, bias, N, K, X, ldx, B, Y, ldy);
    const uint32_t *xp = ag_pack(X, ldx, B, B, K);
    if (!xp) return 0;
    uint16_t pad[2][16 * 32] __attribute__((aligned(64)));
    memset(pad, 0, sizeof pad);
    ag_configure(B);
    for (int64_t n = 0; n < N; n += 32) {
        const int64_t m0 = N - n < 16 ? N - n : 16, m1 = N - n - 16 < 16 ? N - n - 16 : 16;
        /* The next group's 32 rows are one contiguous block: its first AG_AHEAD_LINES x K / 32 lines fetched into
         * L2 in address order, AG_AHEAD_LINES a step, while this group computes; the hardware streamer takes the
         * rest. A line of each of the 32 rows a step into L1 (the strided form) held a batch-1 GEMV from DRAM at
         * 76-90% of the read bandwidth, this at 97-100% (real Nemotron-H's shapes, 2 threads). */
        const char *ahead = n + 64 <= N ? (const char *)(W + (n + 32) * K) : NULL;
        _tile_zero(0);
        _tile_zero(1);
        for (int64_t k = 0; k < K; k += 32) {
            if (ahead)
                for (int64_t i = 0; i < AG_AHEAD_LINES; i++)
                    _mm_prefetch(ahead + (k / 32 * AG_AHEAD_LINES + i) * 64, _MM_HINT_T1);
            _tile_loadd(4, xp + k / 2 * B, 4 * B);
            ag_load_a(2, W, K, n, m0, k, pad[0]);
            _tile_dpbf16ps(0, 2, 4);
            if (m1 > 0) {
                ag_load_a(3, W, K, n + 16, m1, k, pad[1]);
                _tile_dpbf16ps(1, 3, 4);
            }
        }
        ag_store(0, bias, n, m0, B, Y, ldy);
        if (m1 > 0) ag_store(1, bias, n + 16, m1, B, Y, ldy);
    }
    _tile_release();
    return 1;
}

/* Rows m (<= 16) of C tile t, batch columns b0 .. b0+w-1 (w <= 16), to Y (+ bias). */
static inline void ag_store_wide(int t, const float *bias, int64_t n, int64_t m, int64_t b0, int64_t w, float *Y,
                                 int64_t ldy) {
    float c[16][16];
    if (t == 0)
        _tile_stored(0, c, 64);
    else if (t == 1)
        _tile_stored(1, c, 64);
    else
        _tile_stored(2, c, 64);
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < w; b++) Y[(b0 + b) * ldy + n + i] = c[i][b] + (bias ? bias[n + i] : 0.0f);
}

/* The wide form (B > AG_MAX_B: an extend's new tokens, a verify): the batch padded with zero rows to whole B tiles
 * of 16, each group of 16 weight rows in A tile 3 once per chunk of K against up to AG_WIDE_TILES B tiles (4, 5,
 * 6) into C tiles 0, 1, 2; a batch past 48 rows loops over further groups of 48 while the weight rows are still
 * in L1/L2. Every output element is still its own weight row against its own batch row through the chunks of 32
 * in order, one tdpbf16ps each: the narrow form's bits, whatever B, thread or split. */
static inline int ag_gemm_wide(const uint16_t *W, const float *bias, int64_t N, int64_t K, const float *X,
                               int64_t ldx, int64_t B, float *Y, int64_t ldy) {
    const int64_t lb = (B + 15) / 16 * 16;
    const uint32_t *xp = ag_pack(X, ldx, B, lb, K);
    if (!xp) return 0;
    uint16_t pad[16 * 32] __attribute__((aligned(64)));
    memset(pad, 0, sizeof pad);
    ag_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 7; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
    for (int64_t n = 0; n < N; n += 16) {
        const int64_t m = N - n < 16 ? N - n : 16;
        const uint16_t *ahead = n + 32 <= N ? W + (n + 16) * K : NULL;
        for (int64_t b0 = 0; b0 < B; b0 += 16 * AG_WIDE_TILES) {
            const int64_t nt = (lb - b0) / 16 < AG_WIDE_TILES ? (lb - b0) / 16 : AG_WIDE_TILES;
            _tile_zero(0);
            if (nt > 1) _tile_zero(1);
            if (nt > 2) _tile_zero(2);
            for (int64_t k = 0; k < K; k += 32) {
                if (ahead && b0 == 0)
                    for (int64_t i = 0; i < 16; i++) _mm_prefetch((const char *)(ahead + i * K + k), _MM_HINT_T0);
                const uint32_t *xk = xp + k / 2 * lb + b0;
                if (m == 16) {
                    _tile_loadd(3, W + n * K + k, K * 2);
                } else {
                    for (int64_t i = 0; i < m; i++) memcpy(pad + i * 32, W + (n + i) * K + k, 64);
                    _tile_loadd(3, pad, 64);
                }
                _tile_loadd(4, xk, 4 * lb);
                _tile_dpbf16ps(0, 3, 4);
                if (nt > 1) {
                    _tile_loadd(5, xk + 16, 4 * lb);
                    _tile_dpbf16ps(1, 3, 5);
                }
                if (nt > 2) {
                    _tile_loadd(6, xk + 32, 4 * lb);
                    _tile_dpbf16ps(2, 3, 6);
                }
            }
            for (int64_t t = 0; t < nt; t++) {
                const int64_t bt = b0 + 16 * t, w = B - bt < 16 ? B - bt : 16;
                ag_store_wide((int)t, bias, n, m, bt, w, Y, ldy);
            }
        }
    }
    _tile_release();
    return 1;
}
#endif

/* Off: this library's bf16 GEMMs keep the FMA form (the fp32 kernel's bits on the rounded weights: the tests that
 * assert them, a debugging A/B); on: the tiles again where the host grants them. Exported by every library that
 * includes this header (runtime/native/amx.py). */
__attribute__((visibility("default"))) void hd_set_bf16_tiles(int on);
__attribute__((visibility("default"))) void hd_set_bf16_tiles(int on) {
#ifdef AG_AMX
    atomic_store_explicit(&ag_state_, on ? 0 : -1, memory_order_relaxed);
#else
    (void)on;
#endif
}

#endif
