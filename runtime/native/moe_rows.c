/* A sparse MoE block of an fp32 prefill (hundreds to thousands of tokens) in one call: router, routed experts,
 * shared expert, each token's sum.
 *
 * Why: torch runs it as ~40 dispatched ops a layer (router matmul, softmax, top-k, sort, gather, a matmul pair per
 * expert, SwiGLU, the weights, index_add, the shared expert's 6 ops) each making its own pass over [T*k, ...]
 * tensors: at the demo model's size (H 256, I 128) they cost about what the FLOPs do (2048 tokens, one thread:
 * 16.0 ms CPU a layer in torch, 10.1 here; benchmarks/moe_rows_cost.py). Here the work goes by token range: a
 * thread routes its tokens, then per expert (ascending) takes that expert's rows among them in chunks of MF_CHUNK,
 * runs gate/up and SwiGLU into a small L1/L2 scratch, then down, and adds each row's weighted output straight into
 * its token's output row; the shared expert last, scaled by its sigmoid gate. The gathered rows are never copied:
 * the broadcast operand is read from x's rows in place.
 *
 * GEMM form: the weights are packed once per model (runtime/native/moe_rows.py) into panels of 32 output
 * features, [K][32], so one k step is two vector loads and MF_MR broadcasts of the rows' element k: a 12 x 32
 * register tile (24 accumulators, 2 loads + 12 broadcasts per 24 FMAs). Gate/up panels hold 16 gate and 16 up
 * features (SwiGLU then runs on the tile); down panels 32 output features. Every output is the chain
 * acc = fma(w[k], x[k], acc) over k = 0 .. K-1 from 0, whichever tile row, chunk or thread it falls in, so any
 * thread count and any split of the tokens give the same bits; the plain-C form (no AVX-512) computes the same
 * chains (fmaf, vectorized over the features by the compiler).
 *
 * Layouts (fp32; checked by moe_rows.py): x [T, H] rows x_stride apart; router_w [E, H] or NULL (then ids [T, K]
 * and weights [T, K] are given); w_in [E][Ip/16][H][32], w_out [E][Hp/32][I][32] (Ip, Hp: I and H rounded up
 * to 16 and 32, the padding zero); the shared expert's likewise as one expert of S features (s_in NULL: none),
 * shared_gate [H]; out [T, H] contiguous.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "vexp.h"
/* route(): moe_kernels.c, included before this file by short_extend.c. */

#if defined(__AVX512F__)
#include <immintrin.h>
#define MF_AVX512 1
#endif

enum { MF_MR = 12, MF_CHUNK = 96 };

typedef struct {
    int64_t hidden, inter, experts, top_k, shared_inter;
    const float *x;
    int64_t x_stride;
    const float *router_w;
    int norm;
    int64_t *ids;
    float *weights;
    const float *w_in, *w_out, *s_in, *s_out, *shared_gate;
    float *out;
    _Atomic int failed;
} mf_ctx;

static inline int64_t mf_round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* Gate/up panel P ([K][32]: 16 gate, 16 up features) against rows xr: h[r][0..16) = silu(gate) * up for r < mr. */
static void mf_gate_up_tile(const float *const xr[MF_MR], int64_t mr, int64_t K, const float *restrict P, float *h,
                            int64_t ldh) {
    float g[MF_MR][16], u[MF_MR][16];
#ifdef MF_AVX512
    __m512 ag[MF_MR], au[MF_MR];
    for (int r = 0; r < MF_MR; r++) ag[r] = au[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m512 wg = _mm512_loadu_ps(P + 32 * k), wu = _mm512_loadu_ps(P + 32 * k + 16);
        for (int r = 0; r < MF_MR; r++) {
            const __m512 b = _mm512_set1_ps(xr[r][k]);
            ag[r] = _mm512_fmadd_ps(wg, b, ag[r]);
            au[r] = _mm512_fmadd_ps(wu, b, au[r]);
        }
    }
    for (int r = 0; r < MF_MR; r++) {
        _mm512_storeu_ps(g[r], ag[r]);
        _mm512_storeu_ps(u[r], au[r]);
    }
#else
    /* k outside, the 16 features inside: the compiler vectorizes them (AVX2 where there is AVX2), each the chain */
    memset(g, 0, sizeof g), memset(u, 0, sizeof u);
    for (int64_t k = 0; k < K; k++)
        for (int64_t r = 0; r < mr; r++) {
            const float b = xr[r][k];
            for (int j = 0; j < 16; j++) {
                g[r][j] = fmaf(P[32 * k + j], b, g[r][j]);
                u[r][j] = fmaf(P[32 * k + 16 + j], b, u[r][j]);
            }
        }
#endif
    for (int64_t r = 0; r < mr; r++) silu_mul(h + r * ldh, g[r], u[r], 16);
}

/* Down panel P ([K][32]) against the activation rows h: each row r < mr's 32 outputs (the first `cols` kept)
 * times rw[r], added into its token's output row o[r]. */
static void mf_down_tile(const float *h, int64_t ldh, int64_t mr, int64_t K, const float *restrict P,
                         float *const o[MF_MR], const float *rw, int64_t cols) {
    const float *hr[MF_MR];
    for (int r = 0; r < MF_MR; r++) hr[r] = h + (r < mr ? r : 0) * ldh;
#ifdef MF_AVX512
    __m512 a0[MF_MR], a1[MF_MR];
    for (int r = 0; r < MF_MR; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m512 w0 = _mm512_loadu_ps(P + 32 * k), w1 = _mm512_loadu_ps(P + 32 * k + 16);
        for (int r = 0; r < MF_MR; r++) {
            const __m512 b = _mm512_set1_ps(hr[r][k]);
            a0[r] = _mm512_fmadd_ps(w0, b, a0[r]);
            a1[r] = _mm512_fmadd_ps(w1, b, a1[r]);
        }
    }
    const __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
    const __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    for (int r = 0; r < MF_MR; r++) {
        if (r >= mr) break;
        /* one FMA: torch rounds the weighted term before its index_add_, one rounding more (fp32 noise) */
        const __m512 w = _mm512_set1_ps(rw[r]);
        _mm512_mask_storeu_ps(o[r], m0, _mm512_fmadd_ps(a0[r], w, _mm512_maskz_loadu_ps(m0, o[r])));
        _mm512_mask_storeu_ps(o[r] + 16, m1, _mm512_fmadd_ps(a1[r], w, _mm512_maskz_loadu_ps(m1, o[r] + 16)));
    }
#else
    float a[MF_MR][32];
    memset(a, 0, sizeof a);
    for (int64_t k = 0; k < K; k++)
        for (int64_t r = 0; r < mr; r++) {
            const float b = hr[r][k];
            for (int j = 0; j < 32; j++) a[r][j] = fmaf(P[32 * k + j], b, a[r][j]);
        }
    for (int64_t r = 0; r < mr; r++)
        for (int64_t j = 0; j < cols; j++) o[r][j] = fmaf(a[r][j], rw[r], o[r][j]);
#endif
}

/* One expert over n rows (tok: each row's token, rw: its weight): w_in / w_out its packed panels, `inter` its
 * features; h: scratch of MF_CHUNK x Ip floats. */
static void mf_expert(const mf_ctx *c, const int64_t *tok, const float *rw, int64_t n, const float *w_in,
                      const float *w_out, int64_t inter, float *h) {
    const int64_t H = c->hidden, Ip = mf_round_up(inter, 16), Hp = mf_round_up(H, 32);
    for (int64_t m0 = 0; m0 < n; m0 += MF_CHUNK) {
        const int64_t rows = n - m0 < MF_CHUNK ? n - m0 : MF_CHUNK;
        /* panels outside, row tiles inside: a panel (32 features x K) stays in L1 while the rows stream */
        for (int64_t jb = 0; jb < Ip / 16; jb++)
            for (int64_t r0 = 0; r0 < rows; r0 += MF_MR) {
                const int64_t mr = rows - r0 < MF_MR ? rows - r0 : MF_MR;
                const float *xr[MF_MR];
                for (int r = 0; r < MF_MR; r++) xr[r] = c->x + tok[m0 + r0 + (r < mr ? r : 0)] * c->x_stride;
                mf_gate_up_tile(xr, mr, H, w_in + jb * H * 32, h + r0 * Ip + jb * 16, Ip);
            }
        for (int64_t nb = 0; nb < Hp / 32; nb++)
            for (int64_t r0 = 0; r0 < rows; r0 += MF_MR) {
                const int64_t mr = rows - r0 < MF_MR ? rows - r0 : MF_MR;
                float *o[MF_MR];
                for (int r = 0; r < MF_MR; r++) o[r] = c->out + tok[m0 + r0 + (r < mr ? r : 0)] * H + nb * 32;
                mf_down_tile(h + r0 * Ip, Ip, mr, inter, w_out + nb * inter * 32, o, rw + m0 + r0,
                             H - nb * 32 < 32 ? H - nb * 32 : 32);
            }
    }
}

/* Tokens [t0, t1): routed (when the router is given), zeroed, their experts' terms added in ascending expert
 * order, then the shared expert's. */
static void mf_tokens(void *arg, int64_t t0, int64_t t1) {
    mf_ctx *c = arg;
    const int64_t n = t1 - t0, K = c->top_k, H = c->hidden;
    const int64_t widest = c->inter > c->shared_inter ? c->inter : c->shared_inter;
    int64_t *tok = malloc(sizeof(int64_t) * (size_t)(n * K + n + 1));
    float *rw = malloc(sizeof(float) * (size_t)(n * K + n + 1));
    float *h = malloc(sizeof(float) * (size_t)(MF_CHUNK * mf_round_up(widest, 16) + c->experts + 1));
    if (!tok || !rw || !h) {
        free(tok), free(rw), free(h);
        atomic_store(&c->failed, 1); /* any thread's failure fails the call */
        return;
    }
    const float *x = c->x + t0 * c->x_stride;
    if (c->router_w)
        route(n, H, c->experts, K, x, c->x_stride, c->router_w, c->norm, c->ids + t0 * K, c->weights + t0 * K, h);
    memset(c->out + t0 * H, 0, sizeof(float) * (size_t)(n * H));
    const int64_t *ids = c->ids + t0 * K;
    const float *weights = c->weights + t0 * K;
    const int64_t in_size = 2 * mf_round_up(c->inter, 16) * H, out_size = mf_round_up(H, 32) * c->inter;
    for (int64_t e = 0; e < c->experts; e++) {
        int64_t rows = 0;
        for (int64_t p = 0; p < n * K; p++)
            if (ids[p] == e) tok[rows] = t0 + p / K, rw[rows++] = weights[p];
        if (rows) mf_expert(c, tok, rw, rows, c->w_in + e * in_size, c->w_out + e * out_size, c->inter, h);
    }
    if (c->s_in) {
        for (int64_t t = 0; t < n; t++) {
            const float *xt = x + t * c->x_stride;
            float g = 0.0f;
#pragma omp simd reduction(+ : g)
            for (int64_t j = 0; j < H; j++) g += xt[j] * c->shared_gate[j];
            tok[t] = t0 + t, rw[t] = 1.0f / (1.0f + vexpf(-g));
        }
        mf_expert(c, tok, rw, n, c->s_in, c->s_out, c->shared_inter, h);
    }
    free(tok), free(rw), free(h);
}

/* 1 when built with the AVX-512 tiles. Without them (the plain-C tiles, vectorized by the compiler) the block
 * is slower than torch's ops, whose GEMMs have AVX2 kernels: an AVX2 build at 2048 tokens, one thread, 32.4 vs
 * 16.6 ms CPU a layer. The layers then keep torch's path. */
int moe_rows_vectorized(void) {
#ifdef MF_AVX512
    return 1;
#else
    return 0;
#endif
}

/* Returns 0, or 1 when scratch memory could not be had (out undefined then). ids / weights: written when
 * router_w is given, else read. s_in NULL: no shared expert. */
int moe_prefill_f32(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t top_k, const float *x,
                    int64_t x_stride, const float *router_w, int64_t norm_topk, int64_t *ids, float *weights,
                    const float *w_in, const float *w_out, int64_t shared_inter, const float *s_in,
                    const float *s_out, const float *shared_gate, float *out) {
    mf_ctx c = {hidden, inter, experts, top_k, s_in ? shared_inter : 0, x, x_stride, router_w, (int)norm_topk, ids,
                weights, w_in, w_out, s_in, s_out, shared_gate, out, 0};
    /* one contiguous token range a thread: each streams every expert's weights once (from L2/L3) */
    const int threads = hp_threads();
    hp_parallel_for(tokens, tokens / threads > 16 ? tokens / threads : 16, mf_tokens, &c);
    return atomic_load(&c.failed);
}
