/* A sparse MoE block of a short extend in one call: the router (when given), the tokens grouped by expert, each
 * expert's two matmuls over its few rows, the routing weights, the shared expert, and the sum back per token.
 *
 * At a few dozen tokens torch runs each expert as two small matmuls (M ~ 12 rows) at about half the speed of
 * one large one, plus a sort, a gather, a host sync and a scatter-add; that was the largest piece of the peer
 * model's 48-token warm extend. Here a 3 x 4 register-blocked kernel computes each block of dot products along
 * the weights' contiguous input axis (the checkpoint layout, no transposed copy): 12 vector accumulators, the
 * 3 token rows and one weight vector fill AVX2's 16 registers (4 x 4 spilled), and the 12 sums are reduced
 * with horizontal adds 4 at a time.
 *
 * The work is cut into units of (expert, 4 output rows, 3 token rows), each computed the same way wherever it
 * runs, and split over threads (parallel.h): 1 and N threads give the same bits. Two passes, each one parallel
 * region: gate and up rows with SwiGLU into `act`; then the down rows into `y`; then each token's terms summed.
 *
 * Layouts (fp32, checked by the Python wrapper): x [T, H] rows x_stride apart; ids [T, K] int64, each < E;
 * weights [T, K]; w_in [E, 2I, H] (gate rows, then up rows); w_out [E, H, I]; out [T, H] contiguous.
 * Each token's terms are added in ascending expert order starting from zero, as the torch paths add them.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "vexp.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

typedef float v8f __attribute__((vector_size(32)));

enum { MR = 3, NR = 4 };

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 4 sums of 4 accumulators, each reduced as ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7)). */
static inline void hsum4x8(const v8f v0, const v8f v1, const v8f v2, const v8f v3, float out[4]) {
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 t0 = _mm256_hadd_ps((__m256)v0, (__m256)v1), t1 = _mm256_hadd_ps((__m256)v2, (__m256)v3);
    const __m256 t = _mm256_hadd_ps(t0, t1); /* lane l < 4: the low half's sum of v_l; l >= 4: the high half's */
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
#else
    const v8f v[4] = {v0, v1, v2, v3};
    for (int j = 0; j < 4; j++)
        out[j] = ((v[j][0] + v[j][1]) + (v[j][2] + v[j][3])) + ((v[j][4] + v[j][5]) + (v[j][6] + v[j][7]));
#endif
}

/* c[i][j] = dot(a[i], b[j]) over k, for a block of MR x NR (rows repeated where the block is partial). */
#if defined(__AVX2__) && defined(__FMA__)
/* Named accumulators, and the token rows pinned in registers once per step (the empty asm): otherwise GCC folds
 * their loads into every FMA (16-24 loads per 12 FMAs instead of 7, and the loads set the pace). */
static inline void dot_block(const float *const a[MR], const float *const b[NR], int64_t k, float c[MR][NR]) {
    const int64_t k8 = k - k % 8;
    const float *a0p = a[0], *a1p = a[1], *a2p = a[2], *b0p = b[0], *b1p = b[1], *b2p = b[2], *b3p = b[3];
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00,
           c20 = c00, c21 = c00, c22 = c00, c23 = c00;
    for (int64_t kk = 0; kk < k8; kk += 8) {
        __m256 a0 = _mm256_loadu_ps(a0p + kk), a1 = _mm256_loadu_ps(a1p + kk), a2 = _mm256_loadu_ps(a2p + kk);
        __asm__("" : "+x"(a0), "+x"(a1), "+x"(a2)); /* in registers from here: not reloaded per use */
        __m256 bj = _mm256_loadu_ps(b0p + kk);
        __asm__("" : "+x"(bj));
        c00 = _mm256_fmadd_ps(a0, bj, c00), c10 = _mm256_fmadd_ps(a1, bj, c10), c20 = _mm256_fmadd_ps(a2, bj, c20);
        bj = _mm256_loadu_ps(b1p + kk);
        __asm__("" : "+x"(bj));
        c01 = _mm256_fmadd_ps(a0, bj, c01), c11 = _mm256_fmadd_ps(a1, bj, c11), c21 = _mm256_fmadd_ps(a2, bj, c21);
        bj = _mm256_loadu_ps(b2p + kk);
        __asm__("" : "+x"(bj));
        c02 = _mm256_fmadd_ps(a0, bj, c02), c12 = _mm256_fmadd_ps(a1, bj, c12), c22 = _mm256_fmadd_ps(a2, bj, c22);
        bj = _mm256_loadu_ps(b3p + kk);
        __asm__("" : "+x"(bj));
        c03 = _mm256_fmadd_ps(a0, bj, c03), c13 = _mm256_fmadd_ps(a1, bj, c13), c23 = _mm256_fmadd_ps(a2, bj, c23);
    }
    hsum4x8((v8f)c00, (v8f)c01, (v8f)c02, (v8f)c03, c[0]);
    hsum4x8((v8f)c10, (v8f)c11, (v8f)c12, (v8f)c13, c[1]);
    hsum4x8((v8f)c20, (v8f)c21, (v8f)c22, (v8f)c23, c[2]);
    if (k8 < k)
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++)
                for (int64_t kk = k8; kk < k; kk++) c[i][j] += a[i][kk] * b[j][kk];
}
#else
static inline void dot_block(const float *const a[MR], const float *const b[NR], int64_t k, float c[MR][NR]) {
    const int64_t k8 = k - k % 8;
    v8f acc[MR][NR] = {{{0}}};
    for (int64_t kk = 0; kk < k8; kk += 8) {
        const v8f a0 = load8(a[0] + kk), a1 = load8(a[1] + kk), a2 = load8(a[2] + kk);
        for (int j = 0; j < NR; j++) {
            const v8f bj = load8(b[j] + kk);
            acc[0][j] += a0 * bj;
            acc[1][j] += a1 * bj;
            acc[2][j] += a2 * bj;
        }
    }
    for (int i = 0; i < MR; i++) {
        hsum4x8(acc[i][0], acc[i][1], acc[i][2], acc[i][3], c[i]);
        for (int j = 0; j < NR; j++)
            for (int64_t kk = k8; kk < k; kk++) c[i][j] += a[i][kk] * b[j][kk];
    }
}
#endif

/* One expert's share of the call: n scratch rows from `first`, whose inputs are x rows rows[first + r]. */
typedef struct {
    const float *gate, *up, *down; /* [I, H], [I, H], [H, I] */
    int64_t inter, n, first;
    int64_t units_in, units_out; /* the first unit of each pass that is this expert's */
} expert_part;

typedef struct {
    int64_t hidden, widest, n_parts;
    const float *x;
    int64_t x_stride;
    const int64_t *rows;
    const expert_part *parts;
    float *act; /* [rows, widest] */
    float *y;   /* [rows, hidden] */
} moe_ctx;

static inline int64_t blocks_of(int64_t n, int64_t size) { return (n + size - 1) / size; }

/* The expert whose units of a pass begin at or before `unit`, searched from `p` on (units ascend with the
 * expert, and a task walks its units in order). */
static const expert_part *part_of(const moe_ctx *c, const expert_part *p, int64_t unit, int in_pass) {
    const expert_part *last = c->parts + c->n_parts - 1;
    while (p < last && (in_pass ? p[1].units_in : p[1].units_out) <= unit) p++;
    return p;
}

/* Pass 1, units (expert, 4 intermediate columns, 3 rows) in that order: gate and up dot products, SwiGLU. */
static void pass_in(void *ctx, int64_t begin, int64_t end) {
    const moe_ctx *c = ctx;
    const expert_part *p = c->parts;
    for (int64_t u = begin; u < end; u++) {
        p = part_of(c, p, u, 1);
        const int64_t tiles = blocks_of(p->n, MR), local = u - p->units_in;
        const int64_t j0 = local / tiles * NR, i0 = local % tiles * MR;
        const int64_t nr = p->inter - j0 < NR ? p->inter - j0 : NR, mr = p->n - i0 < MR ? p->n - i0 : MR;
        const float *a[MR], *g[NR], *up[NR];
        for (int i = 0; i < MR; i++) a[i] = c->x + c->rows[p->first + i0 + (i < mr ? i : mr - 1)] * c->x_stride;
        for (int j = 0; j < NR; j++) {
            const int64_t row = j0 + (j < nr ? j : nr - 1);
            g[j] = p->gate + row * c->hidden;
            up[j] = p->up + row * c->hidden;
        }
        if (i0 == 0 && j0 + NR < p->inter) /* the next weight rows, fetched while this block computes */
            for (int64_t kk = 0; kk < NR * c->hidden && kk < (p->inter - j0 - NR) * c->hidden; kk += 16) {
                __builtin_prefetch(g[0] + NR * c->hidden + kk);
                __builtin_prefetch(up[0] + NR * c->hidden + kk);
            }
        float cg[MR][NR], cu[MR][NR], h[MR * NR];
        dot_block(a, g, c->hidden, cg);
        dot_block(a, up, c->hidden, cu);
        const float *gf = &cg[0][0], *uf = &cu[0][0];
#pragma omp simd
        for (int m = 0; m < MR * NR; m++) h[m] = silu(gf[m]) * uf[m];
        for (int64_t i = 0; i < mr; i++) {
            float *ar = c->act + (p->first + i0 + i) * c->widest + j0;
            for (int64_t j = 0; j < nr; j++) ar[j] = h[i * NR + j];
        }
    }
}

/* Pass 2, units (expert, 4 hidden columns, 3 rows): the down projection of the activations. */
static void pass_out(void *ctx, int64_t begin, int64_t end) {
    const moe_ctx *c = ctx;
    const expert_part *p = c->parts;
    for (int64_t u = begin; u < end; u++) {
        p = part_of(c, p, u, 0);
        const int64_t tiles = blocks_of(p->n, MR), local = u - p->units_out;
        const int64_t j0 = local / tiles * NR, i0 = local % tiles * MR;
        const int64_t nr = c->hidden - j0 < NR ? c->hidden - j0 : NR, mr = p->n - i0 < MR ? p->n - i0 : MR;
        const float *a[MR], *b[NR];
        for (int i = 0; i < MR; i++) a[i] = c->act + (p->first + i0 + (i < mr ? i : mr - 1)) * c->widest;
        for (int j = 0; j < NR; j++) b[j] = p->down + (j0 + (j < nr ? j : nr - 1)) * p->inter;
        if (i0 == 0 && j0 + NR < c->hidden)
            for (int64_t kk = 0; kk < NR * p->inter && kk < (c->hidden - j0 - NR) * p->inter; kk += 16)
                __builtin_prefetch(b[0] + NR * p->inter + kk);
        float cy[MR][NR];
        dot_block(a, b, p->inter, cy);
        for (int64_t i = 0; i < mr; i++) {
            float *yr = c->y + (p->first + i0 + i) * c->hidden + j0;
            for (int64_t j = 0; j < nr; j++) yr[j] = cy[i][j];
        }
    }
}

/* The router (router_w non-NULL): per token, logits = router_w . x, softmax in fp32, the top_k experts by
 * probability (the lower id first among equal ones), their probabilities renormalized to sum to 1 when
 * norm_topk (summed in the order chosen, largest first, as TopKRouter sums torch.topk's sorted values). Writes
 * ids and weights [T, K]; probs: scratch of E floats. At a few dozen tokens this is 10 torch ops a layer for ~0.1
 * MFLOP. */
static void route(int64_t tokens, int64_t hidden, int64_t experts, int64_t top_k, const float *x, int64_t x_stride,
                  const float *router_w, int norm, int64_t *ids, float *weights, float *probs) {
    for (int64_t t = 0; t < tokens; t++) {
        const float *xt = x + t * x_stride;
        float top = -INFINITY, sum = 0.0f;
        for (int64_t e = 0; e < experts; e++) {
            const float *we = router_w + e * hidden;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t j = 0; j < hidden; j++) acc += xt[j] * we[j];
            probs[e] = acc;
            top = acc > top ? acc : top;
        }
        for (int64_t e = 0; e < experts; e++) {
            probs[e] = expf(probs[e] - top);
            sum += probs[e];
        }
        for (int64_t e = 0; e < experts; e++) probs[e] /= sum;
        float chosen = 0.0f;
        int64_t *row_ids = ids + t * top_k;
        for (int64_t k = 0; k < top_k; k++) {
            /* The first expert not yet taken always qualifies, so a NaN (a NaN hidden state makes every
             * probability NaN, and NaN compares false) still yields k distinct ids in [0, experts): NaN weights
             * then, as in torch, never an id the grouping below would index out of bounds with. */
            int64_t best = -1;
            for (int64_t e = 0; e < experts; e++) {
                int taken = 0;
                for (int64_t i = 0; i < k; i++) taken |= row_ids[i] == e;
                if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
            }
            row_ids[k] = best;
            weights[t * top_k + k] = probs[best];
            chosen += probs[best];
        }
        if (norm)
            for (int64_t k = 0; k < top_k; k++) weights[t * top_k + k] /= chosen;
    }
}

/* Routed experts, then (shared_inter > 0) the shared expert scaled by sigmoid(x . shared_gate) per token, added
 * last, as SparseMoE adds it. Returns 0, or 1 when scratch memory could not be had (nothing written then). */
int moe_short_extend(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t top_k, const float *x,
                     int64_t x_stride, const float *router_w, int64_t norm_topk, int64_t *ids, float *weights,
                     const float *w_in, const float *w_out, int64_t shared_inter, const float *shared_gate_w,
                     const float *shared_up_w, const float *shared_down_w, const float *shared_gate, float *out) {
    if (router_w) {
        float *probs = malloc(sizeof(float) * (size_t)(experts + 1));
        if (!probs) return 1;
        route(tokens, hidden, experts, top_k, x, x_stride, router_w, (int)norm_topk, ids, weights, probs);
        free(probs);
    }
    const int64_t pairs = tokens * top_k, total = pairs + (shared_inter > 0 ? tokens : 0);
    const int64_t widest = inter > shared_inter ? inter : shared_inter;
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)(total + 1));
    int64_t *row_of_pair = malloc(sizeof(int64_t) * (size_t)(pairs + 1));
    float *act = malloc(sizeof(float) * (size_t)(total * widest + 1));
    float *y = malloc(sizeof(float) * (size_t)(total * hidden + 1));
    expert_part *parts = malloc(sizeof(expert_part) * (size_t)(experts + 1));
    if (!rows || !row_of_pair || !act || !y || !parts) {
        free(rows), free(row_of_pair), free(act), free(y), free(parts);
        return 1;
    }
    /* scratch rows grouped by expert (ascending), then the shared expert's, one per token */
    int64_t n_parts = 0, used = 0, units_in = 0, units_out = 0;
    for (int64_t e = 0; e <= experts; e++) {
        const int shared = e == experts;
        if (shared && shared_inter <= 0) break;
        const int64_t first = used;
        if (shared) {
            for (int64_t t = 0; t < tokens; t++) rows[used++] = t;
        } else {
            for (int64_t p = 0; p < pairs; p++)
                if (ids[p] == e) {
                    row_of_pair[p] = used;
                    rows[used++] = p / top_k;
                }
        }
        if (used == first) continue;
        expert_part *part = parts + n_parts++;
        const float *gate = shared ? shared_gate_w : w_in + e * 2 * inter * hidden;
        *part = (expert_part){
            .gate = gate,
            .up = shared ? shared_up_w : gate + inter * hidden,
            .down = shared ? shared_down_w : w_out + e * hidden * inter,
            .inter = shared ? shared_inter : inter,
            .n = used - first,
            .first = first,
            .units_in = units_in,
            .units_out = units_out,
        };
        units_in += blocks_of(part->inter, NR) * blocks_of(part->n, MR);
        units_out += blocks_of(hidden, NR) * blocks_of(part->n, MR);
    }
    moe_ctx ctx = {hidden, widest, n_parts, x, x_stride, rows, parts, act, y};
    hp_parallel_for(units_in, 16, pass_in, &ctx);
    hp_parallel_for(units_out, 16, pass_out, &ctx);
    /* each token: zero, + its experts' terms in ascending expert order, + the shared term */
    for (int64_t t = 0; t < tokens; t++) {
        float *o = out + t * hidden;
        memset(o, 0, sizeof(float) * (size_t)hidden);
        int64_t order[64], n = 0;
        for (int64_t k = 0; k < top_k; k++) {
            int64_t at = n++;
            for (; at > 0 && ids[t * top_k + order[at - 1]] > ids[t * top_k + k]; at--) order[at] = order[at - 1];
            order[at] = k;
        }
        for (int64_t m = 0; m < n; m++) {
            const int64_t p = t * top_k + order[m];
            const float *yr = y + row_of_pair[p] * hidden, w = weights[p];
#pragma omp simd
            for (int64_t j = 0; j < hidden; j++) o[j] += yr[j] * w;
        }
        if (shared_inter > 0) {
            const float *xt = x + t * x_stride;
            float g = 0.0f;
#pragma omp simd reduction(+ : g)
            for (int64_t j = 0; j < hidden; j++) g += xt[j] * shared_gate[j];
            const float *yr = y + (pairs + t) * hidden, w = 1.0f / (1.0f + vexpf(-g));
#pragma omp simd
            for (int64_t j = 0; j < hidden; j++) o[j] += yr[j] * w;
        }
    }
    free(rows), free(row_of_pair), free(act), free(y), free(parts);
    return 0;
}
