/* The feed-forward of the native step (hybrid_decode.c): a sparse MoE with an optional gated shared expert, or a
 * dense MLP (SwiGLU, or squared ReLU), for B rows. Each expert's tokens are gathered and its weights stream once
 * for all of them; the input side (gate, up, activation) and the output side (down, weighted sum into the rows)
 * are one region each of parallel.h's pool, split in 4-row blocks computed by the same code whichever thread runs them. */
#ifndef HYBRIDCTL_HD_FFN_H
#define HYBRIDCTL_HD_FFN_H

#include "hd_model.h"
#include "parallel.h"
#include "row_gemm.h"
#include "vexp.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* A SwiGLU's input side for `cnt` rows: h = silu(gate x) * up x, [cnt, inter]; with no gate (its data NULL), a
 * squared ReLU's: h = relu(up x)^2. */
typedef struct {
    HDMat gate, up; /* [inter, H] each; gate.data NULL: squared ReLU */
    int64_t inter, cnt;
    const float *x; /* [cnt, H] */
    float *g, *u, *h; /* [cnt, inter] each */
} UpJob;

/* Its output side: rows [r0, r1) of down [H, inter] applied to h; an expert's rows are added into the tokens it
 * serves, times their routing weights. */
typedef struct {
    HDMat down;
    const int64_t *tok; /* [cnt] the batch row of each of h's rows (NULL: row r is batch row r) */
    const float *tokw; /* [cnt] routing weights (NULL: the shared expert / dense MLP) */
} DownJob;

typedef struct {
    int n;
    int64_t H, B;
    UpJob up[HD_MAX_JOBS];
    DownJob down[HD_MAX_JOBS];
    int64_t first[HD_MAX_JOBS + 1]; /* units of the input side: each job's 4-row blocks, ffn_block_units each */
    int64_t bytes_up, bytes_down;
    float *out; /* [B, H] */
    float *eo; /* [rows of all jobs, H]: each job's down projection before it is added */
    int64_t eo_off[HD_MAX_JOBS];
    const float *shared_gate; /* [B] the shared expert's gate logits, or NULL */
    int mode; /* FFN_CLEAR: out = the jobs' sum; FFN_ADD: out += it (a later round); FFN_DENSE: out = down(h) */
} FfnCtx;

enum { FFN_CLEAR = 0, FFN_ADD = 1, FFN_DENSE = 2 };

/* The input side's units per 4-row block of a job: its rows (the FMAs) plus what streaming the block's weights
 * costs, in rows. The threads' parts split these units evenly, so a busy expert (or the shared one, every row)
 * weighs what it costs: split by blocks, an extend's second part took the shared expert and ran ~2x the first. */
#define FFN_WEIGHT_ROWS 4
/* On the AMX tiles (bf16 weights) a block's rows cost next to nothing: one tile pass serves 16 of them, so a block
 * weighs its weights' read (FFN_TILE_WEIGHT) plus one unit per 16 rows, and the parts split the bytes evenly.
 * Weighed by rows there, real Qwen3-Next's warm extend (48 rows on the shared expert, ~6 on each routed one) gave
 * one part 1.47x the other's gate/up rows (summed over the 16 layers, on a loaded host: 78 vs 51 ms; by bytes,
 * 73 vs 71). */
#define FFN_TILE_WEIGHT 8
static inline int64_t ffn_block_units(const UpJob *q, int64_t K) {
#ifdef AG_AMX
    if (ag_takes(q->up.data, q->up.dtype == HD_BF16, K, q->cnt)) return FFN_TILE_WEIGHT + (q->cnt + 15) / 16;
#else
    (void)K;
#endif
    return q->cnt + FFN_WEIGHT_ROWS;
}

static void ffn_up_blocks(void *ctx, int64_t begin, int64_t end) {
    const FfnCtx *f = ctx;
    for (int j = 0; j < f->n; j++) {
        const int64_t lo = max64(begin, f->first[j]), hi = min64(end, f->first[j + 1]);
        if (lo >= hi) continue;
        const UpJob *q = &f->up[j];
        /* The blocks whose first unit lies in [lo, hi): each block in exactly one part, computed whole. */
        const int64_t w = ffn_block_units(q, f->H);
        const int64_t i0 = (lo - f->first[j] + w - 1) / w, i1 = (hi - f->first[j] + w - 1) / w;
        if (i0 >= i1) continue;
        const int64_t r0 = i0 * 4, r1 = min64(i1 * 4, q->inter), I = q->inter;
        gemm_rows(hd_mat_at(q->up, r0 * f->H), NULL, r1 - r0, f->H, q->x, f->H, q->cnt, q->u + r0, I);
        if (!q->gate.data) { /* squared ReLU (Nemotron-H's MLP): relu(up x)^2 */
            for (int64_t r = 0; r < q->cnt; r++)
                for (int64_t i = r0; i < r1; i++) {
                    const float v = q->u[r * I + i] > 0.0f ? q->u[r * I + i] : 0.0f;
                    q->h[r * I + i] = v * v;
                }
            continue;
        }
        gemm_rows(hd_mat_at(q->gate, r0 * f->H), NULL, r1 - r0, f->H, q->x, f->H, q->cnt, q->g + r0, I);
        /* silu_mul: vexp.h's 8-lane exp (libm's expf, a call per value, was ~1.6 % of a warm extend's CPU) */
        for (int64_t r = 0; r < q->cnt; r++) silu_mul(q->h + r * I + r0, q->g + r * I + r0, q->u + r * I + r0, r1 - r0);
    }
}

/* Output rows [4*begin, 4*end) of H: every job's down rows for them, added in job order (experts ascending, then
 * the shared expert), as the one-thread loop adds them. */
static void ffn_down_blocks(void *ctx, int64_t begin, int64_t end) {
    const FfnCtx *f = ctx;
    const int64_t H = f->H, r0 = begin * 4, r1 = min64(end * 4, H);
    if (f->mode == FFN_DENSE) {
        const UpJob *q = &f->up[0];
        gemm_rows(hd_mat_at(f->down[0].down, r0 * q->inter), NULL, r1 - r0, q->inter, q->h, q->inter, q->cnt, f->out + r0, H);
        return;
    }
    if (f->mode == FFN_CLEAR)
        for (int64_t b = 0; b < f->B; b++) memset(f->out + b * H + r0, 0, (size_t)(r1 - r0) * sizeof(float));
    for (int j = 0; j < f->n; j++) {
        const UpJob *q = &f->up[j];
        const DownJob *d = &f->down[j];
        float *eo = f->eo + f->eo_off[j] * H;
        gemm_rows(hd_mat_at(d->down, r0 * q->inter), NULL, r1 - r0, q->inter, q->h, q->inter, q->cnt, eo + r0, H);
        for (int64_t r = 0; r < q->cnt; r++) {
            const int64_t b = d->tok ? d->tok[r] : r;
            float *dst = f->out + b * H;
            const float *src = eo + r * H;
            if (d->tokw) {
                const float w = d->tokw[r];
                for (int64_t i = r0; i < r1; i++) dst[i] += src[i] * w;
            } else if (f->shared_gate) {
                const float gate = sigmoidf_(f->shared_gate[b]);
                for (int64_t i = r0; i < r1; i++) dst[i] += gate * src[i];
            } else {
                for (int64_t i = r0; i < r1; i++) dst[i] += src[i];
            }
        }
    }
}

static void ffn_add(FfnCtx *f, const HDMat gate, const HDMat up, const HDMat down, int64_t inter, int64_t cnt,
                    const float *x, float *buf, const int64_t *tok, const float *tokw) {
    const int j = f->n++;
    f->up[j] = (UpJob){gate, up, inter, cnt, x, buf, buf + cnt * inter, buf + 2 * cnt * inter};
    f->down[j] = (DownJob){down, tok, tokw};
    f->first[j + 1] = f->first[j] + (inter + 3) / 4 * ffn_block_units(&f->up[j], f->H);
    f->bytes_up += inter * f->H * ((gate.data ? hd_elem_size(gate) : 0) + hd_elem_size(up));
    f->bytes_down += inter * f->H * hd_elem_size(down);
}

static void ffn_run(FfnCtx *f) {
    const int64_t units = f->first[f->n], down_units = (f->H + 3) / 4;
    hp_parallel_for(units, grain_for(units, f->bytes_up), ffn_up_blocks, f);
    hp_parallel_for(down_units, grain_for(down_units, f->bytes_down), ffn_down_blocks, f);
}

/* Floats of scratch the feed-forward needs for B sequences (moe / swiglu below lay it out in this order). */
static int64_t ffn_scratch(const HDLayer *L, int64_t B, int64_t H) {
    if (L->n_exp <= 0) return 3 * B * L->mlp_inter;
    const int64_t rows = B * L->top_k;
    return 2 * B * L->n_exp + 2 * B * L->top_k + 2 * rows + 2 /* probs, topw, topi */ + rows * H /* gathered */ +
           3 * rows * L->exp_inter + (rows + B) * H /* eo */ + 3 * rows + 2 /* tok, tokw */ + B /* shared gate */ +
           3 * B * L->mlp_inter + 16;
}

/* The dense MLP: SwiGLU, or squared ReLU where the layer has no gate weights. */
static void dense_mlp(const HDLayer *L, int64_t H, const float *x, int64_t B, float *out, float *work) {
    FfnCtx f = {.n = 0, .H = H, .B = B, .out = out, .mode = FFN_DENSE};
    ffn_add(&f, L->mlp_gate, L->mlp_up, L->mlp_down, L->mlp_inter, B, x, work, NULL, NULL);
    ffn_run(&f);
}

/* The K largest of v[0..n) into idx, largest first; ties to the lower index. */
static void top_k_of(const float *v, int64_t n, int64_t K, int64_t *idx) {
    for (int64_t j = 0; j < K; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < n; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j; i++) taken |= idx[i] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = e;
        }
        idx[j] = best;
    }
}

/* One row's routing (HDLayer.route): p [2E] holds the router's logits in its first half (the second is scratch);
 * topi [K] gets the chosen experts, topw [K] their weights. The float operations are the torch routers' own
 * (runtime/models/layers/moe.py, granite_hybrid.py's GraniteMoE, sigmoid_moe.py's GroupTopKRouter). */
static void route(const HDLayer *L, float *p, float *topw, int64_t *topi) {
    const int64_t E = L->n_exp, K = L->top_k;
    float sum = 0.0f;
    if (L->route == HD_ROUTE_TOPK_SOFTMAX) { /* softmax over the k largest logits */
        top_k_of(p, E, K, topi);
        const float mx = p[topi[0]];
        for (int64_t j = 0; j < K; j++) sum += topw[j] = expf(p[topi[j]] - mx);
        for (int64_t j = 0; j < K; j++) topw[j] /= sum;
        return;
    }
    if (L->route == HD_ROUTE_SIGMOID_GROUPS) {
        float *choice = p + E, gs[64]; /* n_group <= 64 (checked by the Python side) */
        const int64_t G = L->n_group, per = E / G;
        for (int64_t e = 0; e < E; e++) {
            p[e] = sigmoidf_(p[e]);
            choice[e] = p[e] + (L->score_bias ? L->score_bias[e] : 0.0f);
        }
        for (int64_t g = 0; g < G; g++) { /* a group's score: the sum of its top two choices (its one if alone) */
            int64_t two[2];
            top_k_of(choice + g * per, per, per < 2 ? per : 2, two);
            gs[g] = per < 2 ? choice[g * per + two[0]] : choice[g * per + two[0]] + choice[g * per + two[1]];
        }
        int64_t keep[64];
        top_k_of(gs, G, L->topk_group, keep);
        for (int64_t g = 0; g < G; g++) {
            int kept = 0;
            for (int64_t i = 0; i < L->topk_group; i++) kept |= keep[i] == g;
            if (!kept)
                for (int64_t e = g * per; e < (g + 1) * per; e++) choice[e] = -INFINITY;
        }
        top_k_of(choice, E, K, topi);
        for (int64_t j = 0; j < K; j++) sum += topw[j] = p[topi[j]];
        for (int64_t j = 0; j < K; j++) {
            if (L->norm_topk) topw[j] /= sum + 1e-20f;
            topw[j] *= (float)L->routed_scale;
        }
        return;
    }
    float mx = -INFINITY; /* HD_ROUTE_SOFTMAX: softmax over every expert, then the k largest */
    for (int64_t e = 0; e < E; e++) mx = p[e] > mx ? p[e] : mx;
    for (int64_t e = 0; e < E; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    for (int64_t e = 0; e < E; e++) p[e] /= sum;
    top_k_of(p, E, K, topi);
    float tsum = 0.0f;
    for (int64_t j = 0; j < K; j++) tsum += topw[j] = p[topi[j]];
    if (L->norm_topk)
        for (int64_t j = 0; j < K; j++) topw[j] /= tsum;
}

static void moe(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work) {
    const int64_t B = s->batch, H = m->hidden, E = L->n_exp, K = L->top_k, I = L->exp_inter;
    /* Offsets rounded to even floats so the int64 arrays stay 8-byte aligned. */
#define HD_NEXT(p, n) ((p) + (((n) + 1) & ~(int64_t)1))
    const int64_t rows = B * K;
    float *probs = work; /* [B, 2E]: the router's logits (then scores), each row's second half its choice */
    float *topw = HD_NEXT(probs, 2 * B * E); /* [B, K] */
    int64_t *topi = (int64_t *)HD_NEXT(topw, B * K); /* [B, K] */
    float *gathered = (float *)(topi + B * K); /* [rows, H] each expert's tokens, experts ascending */
    float *bufs = gathered + rows * H; /* [rows, 3I] each expert's g | u | h */
    float *eo = bufs + 3 * rows * I; /* [rows + B, H] */
    int64_t *tok = (int64_t *)HD_NEXT(eo, (rows + B) * H); /* [rows] */
    float *tokw = (float *)(tok + rows); /* [rows] */
    float *sg = tokw + rows; /* [B] */
    float *shared_buf = sg + B; /* [B, 3 * mlp_inter] */
#undef HD_NEXT
    gemm_rows(L->router, NULL, E, H, xn, H, B, probs, 2 * E);
    for (int64_t b = 0; b < B; b++) route(L, probs + 2 * b * E, topw + b * K, topi + b * K);
    FfnCtx f = {.n = 0, .H = H, .B = B, .out = out, .eo = eo, .mode = FFN_CLEAR};
    /* Experts in ascending id order: each token's terms are summed in that order, as the torch paths sum them. At
     * most HD_MAX_JOBS - 1 active experts a region; more (a large batch of a many-expert model) run in rounds. */
    int64_t at = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t cnt = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < K; j++)
                if (topi[b * K + j] == e) {
                    tok[at + cnt] = b;
                    tokw[at + cnt] = topw[b * K + j];
                    memcpy(gathered + (at + cnt) * H, xn + b * H, (size_t)H * sizeof(float));
                    cnt++;
                }
        if (!cnt) continue;
        if (f.n == HD_MAX_JOBS - 1) {
            ffn_run(&f); /* the rounds after the first add into out, in the same expert order */
            f.n = 0;
            f.bytes_up = f.bytes_down = 0;
            f.mode = FFN_ADD;
        }
        f.eo_off[f.n] = at;
        /* SwiGLU experts: gate rows then up rows; squared-ReLU ones (Nemotron-H): up rows only, no gate */
        const HDMat gate = L->exp_relu2 ? (HDMat){0} : hd_mat_at(L->exp_gate_up, e * 2 * I * H);
        const HDMat up = hd_mat_at(L->exp_gate_up, L->exp_relu2 ? e * I * H : e * 2 * I * H + I * H);
        ffn_add(&f, gate, up, hd_mat_at(L->exp_down, e * H * I), I, cnt, gathered + at * H, bufs + 3 * at * I,
                tok + at, tokw + at);
        at += cnt;
    }
    if (L->mlp_inter > 0) {
        if (L->shared_gate.data) {
            gemm_rows(L->shared_gate, NULL, 1, H, xn, H, B, sg, 1);
            f.shared_gate = sg;
        }
        f.eo_off[f.n] = rows;
        ffn_add(&f, L->mlp_gate, L->mlp_up, L->mlp_down, L->mlp_inter, B, xn, shared_buf, NULL, NULL);
    }
    ffn_run(&f);
}

#endif
