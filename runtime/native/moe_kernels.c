/* Routed experts (SwiGLU) of a short extend in one call: the tokens grouped by expert, each expert's two matmuls
 * over its few rows, the routing weights, and the sum back per token.
 *
 * At a few dozen tokens torch runs each expert as two small matmuls (M ~ 12 rows) at about half the speed of
 * one large one, plus a sort, a gather, a host sync and a scatter-add; that was the largest piece of the peer
 * model's 48-token warm extend. Here a 4 x 4 register-blocked kernel computes each block of dot products along
 * the weights' contiguous input axis (the checkpoint layout, no transposed copy), 16 vector accumulators summed
 * once per block.
 *
 * Layouts (fp32, checked by the Python wrapper): x [T, H] rows x_stride apart; ids [T, K] int64, each < E;
 * weights [T, K]; w_in [E, 2I, H] (gate rows, then up rows); w_out [E, H, I]; out [T, H] contiguous.
 * Each token's terms are added in ascending expert order starting from zero, as the torch paths add them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vexp.h"

typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum8(v8f v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* c[i][j] = dot(a_i, b_j) over k for i < m, j < n: a_i = a + rows[i] * lda, b_j = b + j * ldb, c row stride ldc.
 * Weight blocks outside, rows inside: each block of 4 weight rows is read from memory once and stays in L1
 * while every token row (a few KB in all) passes it. */
static void dots(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const int64_t *rows, const float *b,
                 int64_t ldb, float *c, int64_t ldc) {
    const int64_t k8 = k - k % 8;
    for (int64_t j0 = 0; j0 < n; j0 += 4) {
        const int64_t nr = n - j0 < 4 ? n - j0 : 4;
        const float *bp[4];
        for (int64_t j = 0; j < 4; j++) bp[j] = b + (j0 + (j < nr ? j : nr - 1)) * ldb;
        for (int64_t i0 = 0; i0 < m; i0 += 4) {
            const int64_t mr = m - i0 < 4 ? m - i0 : 4;
            const float *ap[4];
            for (int64_t i = 0; i < 4; i++) ap[i] = a + rows[i0 + (i < mr ? i : mr - 1)] * lda;
            v8f acc[4][4] = {{{0}}};
            /* the next block of weight rows, fetched while this one is used: the weights come from DRAM (every
             * forward streams the whole model), and the first row block sets the pace */
            const float *next = j0 + 4 < n ? b + (j0 + 4) * ldb : NULL;
            if (i0 == 0 && next)
                for (int64_t kk = 0; kk < 4 * ldb && kk < (n - j0 - 4) * ldb; kk += 16) __builtin_prefetch(next + kk);
            for (int64_t kk = 0; kk < k8; kk += 8) {
                const v8f a0 = load8(ap[0] + kk), a1 = load8(ap[1] + kk), a2 = load8(ap[2] + kk),
                          a3 = load8(ap[3] + kk);
                for (int64_t j = 0; j < 4; j++) {
                    const v8f bj = load8(bp[j] + kk);
                    acc[0][j] += a0 * bj;
                    acc[1][j] += a1 * bj;
                    acc[2][j] += a2 * bj;
                    acc[3][j] += a3 * bj;
                }
            }
            for (int64_t i = 0; i < mr; i++)
                for (int64_t j = 0; j < nr; j++) {
                    float s = hsum8(acc[i][j]);
                    for (int64_t kk = k8; kk < k; kk++) s += ap[i][kk] * bp[j][kk];
                    c[(i0 + i) * ldc + j0 + j] = s;
                }
        }
    }
}


/* One SwiGLU expert over n rows: out[rows[r]] += row_w[r] * down(silu(gate(x_r)) * up(x_r)). h, act, y: scratch
 * of n * 2 * inter, n * inter and n * hidden floats; seq: 0, 1, 2, ... (the scratch rows in order). */
static void swiglu_rows(int64_t n, const int64_t *rows, const float *row_w, const float *x, int64_t x_stride,
                        const float *gate_w, const float *up_w, const float *down_w, int64_t hidden, int64_t inter,
                        float *h, float *act, float *y, const int64_t *seq, float *out) {
    dots(n, inter, hidden, x, x_stride, rows, gate_w, hidden, h, 2 * inter);
    dots(n, inter, hidden, x, x_stride, rows, up_w, hidden, h + inter, 2 * inter);
    for (int64_t r = 0; r < n; r++) {
        const float *gate = h + r * 2 * inter, *up = gate + inter;
        float *ar = act + r * inter;
#pragma omp simd
        for (int64_t i = 0; i < inter; i++) ar[i] = silu(gate[i]) * up[i];
    }
    dots(n, hidden, inter, act, inter, seq, down_w, inter, y, hidden);
    for (int64_t r = 0; r < n; r++) {
        float *o = out + rows[r] * hidden;
        const float *yr = y + r * hidden, w = row_w[r];
#pragma omp simd
        for (int64_t j = 0; j < hidden; j++) o[j] += yr[j] * w;
    }
}

/* Routed experts, then (shared_inter > 0) the shared expert scaled by sigmoid(x . shared_gate) per token, added
 * last, as SparseMoE adds it. Returns 0, or 1 when scratch memory could not be had (nothing written then). */
int moe_short_extend(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t top_k, const float *x,
                     int64_t x_stride, const int64_t *ids, const float *weights, const float *w_in,
                     const float *w_out, int64_t shared_inter, const float *shared_gate_w, const float *shared_up_w,
                     const float *shared_down_w, const float *shared_gate, float *out) {
    const int64_t pairs = tokens * top_k, most = pairs > tokens ? pairs : tokens;
    const int64_t widest = inter > shared_inter ? inter : shared_inter;
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)(most + 1));
    int64_t *seq = malloc(sizeof(int64_t) * (size_t)(most + 1));
    float *row_w = malloc(sizeof(float) * (size_t)(most + 1));
    float *h = malloc(sizeof(float) * (size_t)(most * 2 * widest + 1));
    float *act = malloc(sizeof(float) * (size_t)(most * widest + 1));
    float *y = malloc(sizeof(float) * (size_t)(most * hidden + 1));
    if (!rows || !seq || !row_w || !h || !act || !y) {
        free(rows), free(seq), free(row_w), free(h), free(act), free(y);
        return 1;
    }
    for (int64_t r = 0; r < most; r++) seq[r] = r;
    memset(out, 0, sizeof(float) * (size_t)(tokens * hidden));
    for (int64_t e = 0; e < experts; e++) {
        int64_t n = 0;
        for (int64_t p = 0; p < pairs; p++)
            if (ids[p] == e) {
                rows[n] = p / top_k;
                row_w[n] = weights[p];
                n++;
            }
        if (n) {
            const float *gate_w = w_in + e * 2 * inter * hidden;
            swiglu_rows(n, rows, row_w, x, x_stride, gate_w, gate_w + inter * hidden, w_out + e * hidden * inter,
                        hidden, inter, h, act, y, seq, out);
        }
    }
    if (shared_inter > 0) {
        for (int64_t t = 0; t < tokens; t++) {
            const float *xt = x + t * x_stride;
            float g = 0.0f;
#pragma omp simd reduction(+ : g)
            for (int64_t j = 0; j < hidden; j++) g += xt[j] * shared_gate[j];
            rows[t] = t;
            row_w[t] = 1.0f / (1.0f + vexpf(-g));
        }
        swiglu_rows(tokens, rows, row_w, x, x_stride, shared_gate_w, shared_up_w, shared_down_w, hidden,
                    shared_inter, h, act, y, seq, out);
    }
    free(rows), free(seq), free(row_w), free(h), free(act), free(y);
    return 0;
}
