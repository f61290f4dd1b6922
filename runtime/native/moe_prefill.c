/* A sparse MoE block's routed experts for a bf16 prefill, on AMX tiles.
 *
 * Why: torch runs each expert as two oneDNN matmuls on the checkpoint's [N, K] weights; oneDNN's AMX kernel wants
 * its B operand in the VNNI layout (pairs of K interleaved), so every call repacks the expert's whole weight (3 MB
 * for Qwen3-Next-shaped gate/up), and the gather, SwiGLU, routing weights and scatter-add are four more passes over
 * [T*k, I] / [T*k, H] bf16 tensors: 43 ms of one core per layer at 2048 tokens (real-size Qwen3-Next), ~2x the
 * matmuls' FLOPs at AMX speed. Here the roles are swapped: C^T = W . X^T, so the weight is the A operand, read
 * straight from the checkpoint layout (16 rows of 32 K each, rows H apart), and the few token rows are what gets
 * packed (into VNNI pairs, once per expert chunk). SwiGLU runs on the gate/up tiles before they leave the core and
 * writes the down matmul's packed operand directly; the down tiles are transposed in registers, scaled by the
 * routing weight and added into the fp32 output row of their token.
 *
 * Work: experts in ascending order (so each token's terms are added in ascending expert order, as the torch path
 * adds them), each in chunks of up to MP_CHUNK rows; per chunk three parallel regions (parallel.h): pack the rows,
 * gate/up by blocks of 16 intermediate features, down by blocks of 32 output features. The weights are read once
 * per chunk, each block by one thread; any thread count gives the same bits.
 *
 * Portability: built only where the compiler targets AMX-BF16 (-march=native on such a CPU); elsewhere, or when
 * the kernel refuses the AMX state (arch_prctl(ARCH_REQ_XCOMP_PERM) fails), moe_prefill_ready() is 0 and the
 * caller keeps its torch path (oneDNN: AVX-512 or AVX2 as the CPU has).
 *
 * Layouts (bf16 as uint16, checked by runtime/native/moe_prefill.py): x [T, H] rows x_stride apart; tok [R] the
 * token of each routed row, rows sorted by expert; rw [R] fp32 routing weights; counts [E]; w_in [E, 2I, H] (gate
 * rows, then up rows); w_out [E, H, I]; xv [MP_CHUNK * H], hv [MP_CHUNK * I] scratch; out [T, H] fp32, zeroed.
 * H and I multiples of 32.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "vexp.h"

enum { MP_CHUNK = 512, MP_KB = 8 };

#if defined(__x86_64__) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && \
    defined(__AVX512BF16__)
#define MP_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef struct {
    int64_t hidden, inter, rows; /* rows: this chunk's routed rows */
    const uint16_t *x;
    int64_t x_stride;
    const int64_t *tok;
    const float *rw;
    const uint16_t *w_gate, *w_up, *w_down; /* this expert's */
    uint16_t *xv, *hv;
    float *out;
    int gated;    /* 1: SwiGLU over gate and up rows; 0: relu(up)^2 (Nemotron-H) */
    int fp32_sum; /* 1: fp32 weighted terms and sum (fp32 routing weights); 0: rounded to bf16 as they are added */
} mp_ctx;

#ifdef MP_AMX
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} mp_tilecfg;

/* Every tile 16 rows of 64 bytes: 0-3 accumulators, 4-5 the weight (A) operands, 6-7 the rows' (B) operands. */
static void mp_tiles_on(void) {
    mp_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
}

/* The index vectors of mp_transpose16's rounds (block sizes 8, 4, 2, 1): lo picks row i's new elements, hi row
 * i + b's, from the pair (row i, row i + b) as _mm512_permutex2var_ps numbers them (16.. = the second operand). */
static int32_t mp_tr_idx_[4][2][16];

static void mp_tr_init_(void) {
    for (int level = 0, b = 8; b >= 1; level++, b /= 2)
        for (int c = 0; c < 16; c++) {
            mp_tr_idx_[level][0][c] = (c & b) ? 16 + c - b : c;
            mp_tr_idx_[level][1][c] = (c & b) ? 16 + c : c + b;
        }
}

/* A 16 x 16 block of 32-bit elements transposed in registers: four rounds that swap the off-diagonal sub-blocks
 * of size 8, 4, 2, 1 (the recursive block transpose, one level a round). */
static inline void mp_transpose16(__m512 r[16]) {
    for (int level = 0, b = 8; b >= 1; level++, b /= 2) {
        const __m512i lo = _mm512_loadu_si512(mp_tr_idx_[level][0]), hi = _mm512_loadu_si512(mp_tr_idx_[level][1]);
        for (int i = 0; i < 16; i++) {
            if (i & b) continue;
            const __m512 a = r[i], d = r[i + b];
            r[i] = _mm512_permutex2var_ps(a, lo, d);
            r[i + b] = _mm512_permutex2var_ps(a, hi, d);
        }
    }
}

/* Row blocks [b0, b1) of 16 rows into VNNI pairs: xv[(mb * H/2 + kp) * 16 + mi] (as 32-bit words) holds row
 * 16 mb + mi's elements 2 kp and 2 kp + 1, so a block's 16 consecutive kp are one B tile (rows 64 bytes apart):
 * a 16 x 16 word transpose per 32 columns. Rows past the chunk's end are zero (the kernels run blocks in pairs). */
static void mp_pack(void *arg, int64_t b0, int64_t b1) {
    const mp_ctx *c = arg;
    const int64_t half = c->hidden / 2;
    for (int64_t mb = b0; mb < b1; mb++) {
        const float *src[16];
        for (int i = 0; i < 16; i++) {
            const int64_t m = mb * 16 + i;
            src[i] = m < c->rows ? (const float *)(c->x + c->tok[m] * c->x_stride) : NULL;
        }
        float *dst = (float *)c->xv + mb * half * 16;
        for (int64_t kp = 0; kp < half; kp += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = src[i] ? _mm512_loadu_ps(src[i] + kp) : _mm512_setzero_ps();
            mp_transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_ps(dst + (kp + j) * 16, r[j]);
        }
    }
}

/* x rounded to the nearest bf16 (ties to even), kept in fp32: each point where torch's bf16 dispatch (and
 * transformers') rounds a tensor to bf16 rounds here too, so greedy picks follow theirs (accumulating in fp32
 * throughout moved 7 of 128 of Kimi-Linear's bf16 picks, tests/runtime/test_bf16_weights.py). */
static inline float mp_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline __m512 mp_bf16x16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
}

/* The activation of 16 features x 16 rows (tile layout [feature][row]) into hv's packed pairs: feature pair
 * (2p, 2p+1) of row mi lands at word (ip * 16 + mi) of the row block, ip = the pair's index in I. With `u`,
 * silu(g) * u; without, relu(g)^2; rounded to bf16 where torch rounds. */
static void mp_act_store(const float *g, const float *u, uint16_t *hv_block, int64_t ip0) {
    float h[256];
    if (u) {
        for (int i = 0; i < 256; i++) h[i] = mp_bf16(mp_bf16(silu(mp_bf16(g[i]))) * mp_bf16(u[i]));
    } else {
        for (int i = 0; i < 256; i++) {
            const float r = mp_bf16(g[i]) > 0.0f ? mp_bf16(g[i]) : 0.0f;
            h[i] = mp_bf16(r * r);
        }
    }
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int p = 0; p < 8; p++) {
        const __m512 even = _mm512_loadu_ps(h + 32 * p), odd = _mm512_loadu_ps(h + 32 * p + 16);
        const __m512 a = _mm512_permutex2var_ps(even, lo, odd), b = _mm512_permutex2var_ps(even, hi, odd);
        _mm512_storeu_si512(hv_block + (ip0 + p) * 32, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
}

/* One 32 x 32 output block's products over k-chunks [kc0, kc1): tiles 0-3 = (a0, b0), (a0, b1), (a1, b0),
 * (a1, b1), started from zero (first) or from `part`, stored to `part` (4 x 256 fp32, tile after tile). A rows lda
 * bytes apart; B tiles 1 KB apart (packed). */
static inline void mp_step(const uint16_t *a0, const uint16_t *a1, int64_t lda, const uint16_t *b0, const uint16_t *b1,
                           int64_t kc0, int64_t kc1, int first, float *part) {
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, part, 64);
        _tile_loadd(1, part + 256, 64);
        _tile_loadd(2, part + 512, 64);
        _tile_loadd(3, part + 768, 64);
    }
    for (int64_t kc = kc0; kc < kc1; kc++) {
        _tile_loadd(4, a0 + kc * 32, lda);
        _tile_loadd(5, a1 + kc * 32, lda);
        _tile_loadd(6, b0 + kc * 512, 64);
        _tile_loadd(7, b1 + kc * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, part, 64);
    _tile_stored(1, part + 256, 64);
    _tile_stored(2, part + 512, 64);
    _tile_stored(3, part + 768, 64);
}

/* Gate/up for the thread's feature blocks [n0, n1), every row block of the chunk. K in slices of MP_KB chunks: a
 * slice of the two weight tiles' rows (16 KB) stays in L1 across the row blocks, which then stream from L2 alone
 * (unsliced, both operands came from L2 at 4 KB a step: L2's bandwidth, not the tiles, set the pace); the 4 tiles'
 * partial sums wait in `parts` between slices. */
static void mp_gate_up(void *arg, int64_t n0, int64_t n1) {
    const mp_ctx *c = arg;
    const int64_t H = c->hidden, I = c->inter, blocks = (c->rows + 31) / 32 * 2, kcs = H / 32;
    float *parts = aligned_alloc(64, (size_t)(blocks / 2) * 1024 * sizeof(float));
    if (!parts) return;
    mp_tiles_on();
    for (int64_t nb = n0; nb < n1; nb++) {
        const int64_t rows0 = c->gated ? nb * 16 : nb * 32; /* gate/up: 16 of each; up alone: 32 */
        const uint16_t *wg = c->w_gate + rows0 * H, *wu = c->gated ? c->w_up + rows0 * H : wg + 16 * H;
        for (int64_t k0 = 0; k0 < kcs; k0 += MP_KB) {
            const int64_t k1 = k0 + MP_KB < kcs ? k0 + MP_KB : kcs;
            for (int64_t mb = 0; mb < blocks; mb += 2) {
                const uint16_t *x0 = c->xv + mb * (H / 2) * 32, *x1 = x0 + (H / 2) * 32;
                float *part = parts + (mb / 2) * 1024;
                mp_step(wg, wu, H * 2, x0, x1, k0, k1, k0 == 0, part);
                if (k1 < kcs) continue;
                uint16_t *hv0 = c->hv + mb * (I / 2) * 32, *hv1 = hv0 + (I / 2) * 32;
                if (c->gated) {
                    mp_act_store(part, part + 512, hv0, nb * 8);
                    mp_act_store(part + 256, part + 768, hv1, nb * 8);
                } else { /* a0, a1: features 32 nb.. and 32 nb + 16.. of the one up matrix */
                    mp_act_store(part, NULL, hv0, nb * 16);
                    mp_act_store(part + 256, NULL, hv1, nb * 16);
                    mp_act_store(part + 512, NULL, hv0, nb * 16 + 8);
                    mp_act_store(part + 768, NULL, hv1, nb * 16 + 8);
                }
            }
        }
    }
    _tile_release();
    free(parts);
}

/* A down tile ([feature][row], 16 x 16) scaled by each row's routing weight into its token's output row, rounded
 * to bf16 where torch's dispatch rounds: the expert's output, the weighted term, the running sum. */
static void mp_scatter(const mp_ctx *c, const float *tile, int64_t m0, int64_t n0) {
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(tile + 16 * i);
    mp_transpose16(r);
    for (int64_t i = 0; i < 16 && m0 + i < c->rows; i++) {
        float *dst = c->out + c->tok[m0 + i] * c->hidden + n0;
        const __m512 term = _mm512_mul_ps(mp_bf16x16(r[i]), _mm512_set1_ps(c->rw[m0 + i]));
        if (c->fp32_sum)
            _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_loadu_ps(dst), term));
        else
            _mm512_storeu_ps(dst, mp_bf16x16(_mm512_add_ps(_mm512_loadu_ps(dst), mp_bf16x16(term))));
    }
}

/* Down for the thread's output blocks [n0, n1): row blocks outside (the 32 rows' output lines stay in cache across
 * the thread's features), K sliced as in mp_gate_up so the rows' slice stays in L1 while the weights stream. */
static void mp_down(void *arg, int64_t n0, int64_t n1) {
    const mp_ctx *c = arg;
    const int64_t H = c->hidden, I = c->inter, blocks = (c->rows + 31) / 32 * 2, kcs = I / 32;
    float *parts = aligned_alloc(64, (size_t)(n1 - n0) * 1024 * sizeof(float));
    if (!parts) return;
    mp_tiles_on();
    for (int64_t mb = 0; mb < blocks; mb += 2) {
        const uint16_t *h0 = c->hv + mb * (I / 2) * 32, *h1 = h0 + (I / 2) * 32;
        for (int64_t k0 = 0; k0 < kcs; k0 += MP_KB) {
            const int64_t k1 = k0 + MP_KB < kcs ? k0 + MP_KB : kcs;
            for (int64_t nb = n0; nb < n1; nb++) {
                const uint16_t *w0 = c->w_down + nb * 32 * I;
                float *part = parts + (nb - n0) * 1024;
                mp_step(w0, w0 + 16 * I, I * 2, h0, h1, k0, k1, k0 == 0, part);
                if (k1 < kcs) continue;
                mp_scatter(c, part, mb * 16, nb * 32);
                mp_scatter(c, part + 256, mb * 16 + 16, nb * 32);
                mp_scatter(c, part + 512, mb * 16, nb * 32 + 16);
                mp_scatter(c, part + 768, mb * 16 + 16, nb * 32 + 16);
            }
        }
    }
    _tile_release();
    free(parts);
}

static int mp_permission_(void) {
    /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: Linux hands a process the AMX tile state only on request. */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#endif

/* 1 when moe_prefill_bf16 can run here (AMX built in and the tile state granted), else 0. */
int moe_prefill_ready(void) {
#ifdef MP_AMX
    static int granted = -1;
    if (granted < 0) {
        mp_tr_init_();
        granted = mp_permission_();
    }
    return granted;
#else
    return 0;
#endif
}

int moe_prefill_set_threads(int n) {
    /* The regions of one call follow each other within microseconds; after the call torch's own threads run
     * the next ops, so a worker spinning parallel.h's default 300 us there only takes a core from them. */
    hp_set_spin_us(50);
    hp_set_threads(n);
    return hp_threads();
}

/* Returns 0, or -1 when the kernel cannot run here (nothing written). `gated`, `fp32_sum`: see mp_ctx; w_in is
 * [E, 2I, H] when gated, else [E, I, H]. */
int moe_prefill_bf16(int64_t hidden, int64_t inter, int64_t experts, const uint16_t *x, int64_t x_stride,
                     const int64_t *tok, const float *rw, const int64_t *counts, const uint16_t *w_in,
                     const uint16_t *w_out, uint16_t *xv, uint16_t *hv, float *out, int64_t gated, int64_t fp32_sum) {
#ifdef MP_AMX
    if (!moe_prefill_ready() || hidden % 32 || inter % 32) return -1;
    const int64_t in_rows = gated ? 2 * inter : inter;
    int64_t start = 0;
    for (int64_t e = 0; e < experts; e++) {
        const uint16_t *w_gate = w_in + e * in_rows * hidden;
        /* Equal chunks: 270 rows as 135 + 135, not 256 + 14 (a chunk streams the expert's weights whatever its size). */
        const int64_t chunks = (counts[e] + MP_CHUNK - 1) / MP_CHUNK, per = chunks ? (counts[e] + chunks - 1) / chunks : 0;
        for (int64_t done = 0; done < counts[e]; done += per) {
            const int64_t rows = counts[e] - done < per ? counts[e] - done : per;
            mp_ctx c = {hidden, inter, rows, x, x_stride, tok + start + done, rw + start + done, w_gate,
                        w_gate + inter * hidden, w_out + e * hidden * inter, xv, hv, out, gated != 0, fp32_sum != 0};
            hp_parallel_for((rows + 31) / 32 * 2, 4, mp_pack, &c);
            hp_parallel_for(gated ? inter / 16 : inter / 32, 1, mp_gate_up, &c);
            hp_parallel_for(hidden / 32, 1, mp_down, &c);
        }
        start += counts[e];
    }
    return 0;
#else
    (void)hidden, (void)inter, (void)experts, (void)x, (void)x_stride, (void)tok, (void)rw, (void)counts;
    (void)w_in, (void)w_out, (void)xv, (void)hv, (void)out, (void)gated, (void)fp32_sum;
    return -1;
#endif
}
