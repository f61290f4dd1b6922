/* One decode step of the Qwen3-Next family (qwen3_next, qwen3_5, qwen3_5_moe) in plain C: embedding, every
 * layer (gated DeltaNet or gated full attention, then a sparse MoE with shared expert or a dense SwiGLU MLP),
 * final norm and lm_head, for B sequences of one new token each, or for one sequence's B new tokens (a short
 * extend: HDStep.chain; the DeltaNet rows then run in token order, hd_deltanet.h, and row b attends to the cached
 * tokens and the new ones up to itself). Called once per step through ctypes (runtime/native/hybrid_decode.py),
 * so a step is one call instead of ~800 dispatched torch ops (an extend's ~1000).
 *
 * Semantics follow the torch modules (runtime/models/layers/): every weight is fp32, read in place from the
 * model's own parameters (row-major [out, in]); the pools are the engine's fp32 buffers, written in place at the
 * step's slots. Every pointer, dtype, shape and contiguity is validated by the Python side before the call; this
 * file checks only that the indices it is given lie inside the pools (returning an error code, never writing
 * out of bounds).
 *
 * Weight streaming: every projection is one pass over its rows for all B rows of the batch (gemm below), so a
 * batch of 8 reads each weight once; a MoE expert's weights stream once for all the tokens routed to it.
 *
 * Threads (hd_set_threads; parallel.h's pool): the rows of every projection, the lm_head and the experts split
 * across the threads in blocks of 4 rows (each thread streams its share of the weights), and the DeltaNet
 * recurrence splits by (sequence, key head). Each row is computed by the same code in the same order whichever
 * thread runs it, so logits and pool rows are bit-identical under any thread count. The phases that must see every
 * row of the one before (a norm over the hidden vector, the routing) are the only barriers: per layer two regions
 * for the mixer's projections and recurrence, one for its output projection, two for the feed-forward.
 */

#include "hd_deltanet.h"
#include "hd_ffn.h"
#include "hd_model.h"
#include "parallel.h"
#include "row_gemm.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- gated full attention over the paged KV pool ---- */

static void rope(float *x, const float *cs, const float *sn, int64_t rd) {
    const int64_t half = rd / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
    }
}

typedef struct {
    const HDLayer *L;
    const HDStep *s;
    const float *q;
    float *o;
    float *scores; /* [slots, part]: each part's own scratch (attention_part) */
    int64_t part;
    atomic_int next_slot;
} AttnCtx;

/* Units (sequence b, query head h): softmax(q . K) V over the sequence's KV slots, gated. */
static void attention_heads(void *ctx, int64_t begin, int64_t end) {
    AttnCtx *a = ctx;
    const HDLayer *L = a->L;
    const HDStep *s = a->s;
    const int64_t hd = L->hd, nh = L->nh, kvw = L->nkv * hd, group = nh / L->nkv;
    const int64_t qw = nh * hd * (L->out_gate ? 2 : 1), qstride = L->out_gate ? 2 * hd : hd;
    const float *kp = s->k_pool[L->ordinal], *vp = s->v_pool[L->ordinal];
    const float scale = (float)L->attn_scale;
    /* Parts <= slots (the caller's grain), so each part has a row of its own. */
    float *scores = a->scores + atomic_fetch_add(&a->next_slot, 1) * a->part;
    for (int64_t u = begin; u < end; u++) {
        const int64_t b = u / nh, h = u % nh;
        int64_t n;
        const int64_t *locs = hd_kv_span(s, b, &n);
        const float *qh = a->q + b * qw + h * qstride;
        const int64_t g = h / group;
        float mx = -INFINITY;
        for (int64_t t = 0; t < n; t++) {
            scores[t] = dot(qh, kp + locs[t] * kvw + g * hd, hd) * scale;
            if (scores[t] > mx) mx = scores[t];
        }
        float sum = 0.0f;
        for (int64_t t = 0; t < n; t++) {
            scores[t] = expf(scores[t] - mx);
            sum += scores[t];
        }
        const float inv = 1.0f / sum;
        float *oh = a->o + b * nh * hd + h * hd;
        memset(oh, 0, (size_t)hd * sizeof(float));
        for (int64_t t = 0; t < n; t++) {
            const float p = scores[t] * inv;
            const float *vr = vp + locs[t] * kvw + g * hd;
#pragma omp simd
            for (int64_t i = 0; i < hd; i++) oh[i] += p * vr[i];
        }
        if (L->out_gate) {
            const float *gate = qh + hd;
            for (int64_t i = 0; i < hd; i++) oh[i] *= sigmoidf_(gate[i]);
        }
    }
}

/* An extend's units (query head h), every row at once: the head's K and V over the sequence's slots gathered
 * into [n8, hd] and [hd, n8] (n8: the slot count rounded up to 8, zero-padded), the scores of all B rows as one
 * GEMM against the gathered keys (each key block read once for every row), a softmax over each row's causal span
 * (row b: the first kv_offsets[b + 1] slots; the rest weighted 0), and the outputs as a second GEMM. */
static void attention_chain(void *ctx, int64_t begin, int64_t end) {
    AttnCtx *a = ctx;
    const HDLayer *L = a->L;
    const HDStep *s = a->s;
    const int64_t hd = L->hd, nh = L->nh, kvw = L->nkv * hd, group = nh / L->nkv, B = s->batch;
    const int64_t qw = nh * hd * (L->out_gate ? 2 : 1), qstride = L->out_gate ? 2 * hd : hd;
    const int64_t n = s->kv_offsets[B], n8 = (n + 7) & ~(int64_t)7;
    const float *kp = s->k_pool[L->ordinal], *vp = s->v_pool[L->ordinal];
    const float scale = (float)L->attn_scale;
    float *kg = a->scores + atomic_fetch_add(&a->next_slot, 1) * a->part; /* [n8, hd] */
    float *vt = kg + n8 * hd; /* [hd, n8] */
    float *sc = vt + hd * n8; /* [B, n8] */
    int64_t gathered = -1;
    for (int64_t h = begin; h < end; h++) {
        const int64_t g = h / group;
        if (g != gathered) {
            memset(kg + n * hd, 0, (size_t)((n8 - n) * hd) * sizeof(float));
            for (int64_t t = 0; t < n; t++) {
                const float *kr = kp + s->kv_flat[t] * kvw + g * hd, *vr = vp + s->kv_flat[t] * kvw + g * hd;
                memcpy(kg + t * hd, kr, (size_t)hd * sizeof(float));
                for (int64_t i = 0; i < hd; i++) vt[i * n8 + t] = vr[i];
            }
            for (int64_t i = 0; i < hd; i++)
                for (int64_t t = n; t < n8; t++) vt[i * n8 + t] = 0.0f;
            gathered = g;
        }
        gemm(kg, NULL, n8, hd, a->q + h * qstride, qw, B, sc, n8);
        for (int64_t b = 0; b < B; b++) {
            float *row = sc + b * n8;
            const int64_t nb = s->kv_offsets[b + 1];
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t t = 0; t < nb; t++) {
                row[t] *= scale;
                mx = row[t] > mx ? row[t] : mx;
            }
            for (int64_t t = 0; t < nb; t++) {
                row[t] = expf(row[t] - mx);
                sum += row[t];
            }
            const float inv = 1.0f / sum;
            for (int64_t t = 0; t < nb; t++) row[t] *= inv;
            for (int64_t t = nb; t < n8; t++) row[t] = 0.0f;
        }
        gemm(vt, NULL, hd, n8, sc, n8, B, a->o + h * hd, nh * hd);
        if (L->out_gate)
            for (int64_t b = 0; b < B; b++) {
                const float *gate = a->q + b * qw + h * qstride + hd;
                float *oh = a->o + b * nh * hd + h * hd;
                for (int64_t i = 0; i < hd; i++) oh[i] *= sigmoidf_(gate[i]);
            }
    }
}

/* Floats of one part's attention scratch (hd_decode gives every part its own): a score row of the longest span
 * in a decode step; an extend's gathered K and V and its rows' scores (attention_chain). */
static int64_t attention_part(const HDModel *m, const HDStep *s, int64_t max_kv) {
    if (!s->chain) return max_kv;
    int64_t hd = 0;
    for (int64_t l = 0; l < m->n_layers; l++)
        if (m->layers[l].kind == 1) hd = max64(hd, m->layers[l].hd);
    const int64_t n8 = (max_kv + 7) & ~(int64_t)7;
    return 2 * hd * n8 + s->batch * n8;
}

static int64_t attention_scratch(const HDLayer *L, int64_t B) {
    const int64_t qw = L->nh * L->hd * (L->out_gate ? 2 : 1);
    return B * (qw + 2 * L->nkv * L->hd + L->nh * L->hd) + L->rot_dim + 2;
}

static int attention(const HDModel *m, const HDLayer *L, const HDStep *s, const float *xn, float *out, float *work,
                     float *scores, int64_t part, int64_t slots, GemmSet *gs) {
    const int64_t B = s->batch, H = m->hidden, hd = L->hd, nh = L->nh, nkv = L->nkv;
    const int64_t qw = nh * hd * (L->out_gate ? 2 : 1), kvw = nkv * hd;
    float *q = work; /* [B, qw] */
    float *k = q + B * qw; /* [B, kvw] */
    float *v = k + B * kvw; /* [B, kvw] */
    float *o = v + B * kvw; /* [B, nh * hd] */
    float *cs = o + B * nh * hd; /* [rot_dim / 2] */
    float *sn = cs + L->rot_dim / 2 + 1;
    gemm_add(gs, L->wq, L->bq, qw, H, xn, H, B, q, qw);
    gemm_add(gs, L->wk, L->bk, kvw, H, xn, H, B, k, kvw);
    gemm_add(gs, L->wv, L->bv, kvw, H, xn, H, B, v, kvw);
    gemm_run(gs);
    float *kp = s->k_pool[L->ordinal], *vp = s->v_pool[L->ordinal];
    const int64_t qstride = L->out_gate ? 2 * hd : hd; /* q_proj emits [query | gate] per head */
    for (int64_t b = 0; b < B; b++) {
        const float pos = (float)s->positions[b];
        for (int64_t i = 0; i < L->rot_dim / 2; i++) {
            const float f = pos * L->inv_freq[i];
            cs[i] = cosf(f);
            sn[i] = sinf(f);
        }
        float *qb = q + b * qw, *kb = k + b * kvw, *vb = v + b * kvw;
        for (int64_t h = 0; h < nh; h++) {
            float *qh = qb + h * qstride;
            if (L->q_norm) rms_norm(qh, L->q_norm, hd, m->eps, qh);
            rope(qh, cs, sn, L->rot_dim);
        }
        for (int64_t h = 0; h < nkv; h++) {
            float *kh = kb + h * hd;
            if (L->k_norm) rms_norm(kh, L->k_norm, hd, m->eps, kh);
            rope(kh, cs, sn, L->rot_dim);
        }
        const int64_t loc = s->out_locs[b];
        memcpy(kp + loc * kvw, kb, (size_t)kvw * sizeof(float));
        memcpy(vp + loc * kvw, vb, (size_t)kvw * sizeof(float));
    }
    /* After every row's K/V is written: an extend's row reads the K/V of the rows before it. */
    AttnCtx a = {L, s, q, o, scores, part, 0};
    const int64_t units = s->chain ? nh : B * nh;
    hp_parallel_for(units, max64(1, (units + slots - 1) / slots), s->chain ? attention_chain : attention_heads, &a);
    gemm_add(gs, L->wo, L->bo, H, nh * hd, o, nh * hd, B, out, H);
    gemm_run(gs);
    return HD_OK;
}

/* ---- the step ---- */

/* Floats of scratch one layer needs for B sequences. */
static int64_t layer_scratch(const HDLayer *L, int64_t B, int64_t H) {
    const int64_t mixer = L->kind == 0 ? deltanet_scratch(L, B) : attention_scratch(L, B);
    return max64(mixer, ffn_scratch(L, B, H)) + 16;
}

/* The step's scratch. Up to HD_KEPT_SCRATCH floats it is kept per calling thread and reused: a fresh malloc of
 * an extend's few MB is an mmap whose pages the kernel faults in and zeroes on every call. A larger one (a long
 * context's extend) is allocated per call, so an idle server keeps no more than that. */
#define HD_KEPT_SCRATCH ((size_t)2 << 20)
static _Thread_local float *kept_scratch;
static _Thread_local size_t kept_floats;

static float *scratch_for(size_t floats) {
    if (floats > HD_KEPT_SCRATCH) return malloc(floats * sizeof(float));
    if (floats > kept_floats) {
        free(kept_scratch);
        kept_scratch = malloc(floats * sizeof(float));
        kept_floats = kept_scratch ? floats : 0;
    }
    return kept_scratch;
}

static void scratch_done(float *x) {
    if (x != kept_scratch) free(x);
}

void hd_set_threads(int n) { hp_set_threads(n); }
void hd_set_min_part_bytes(int64_t bytes) { hd_part_bytes = bytes < 1 ? 1 : bytes; }
int hd_threads(void) { return hp_threads(); }

int hd_decode(const HDModel *m, const HDStep *s) {
    const int64_t B = s->batch, H = m->hidden;
    int64_t max_kv = 1;
    for (int64_t b = 0; b < B; b++) {
        if (s->ids[b] < 0 || s->ids[b] >= m->vocab) return HD_BAD_TOKEN;
        if (s->state_slots[b] < 0 || s->state_slots[b] >= s->state_slots_count) return HD_BAD_STATE_SLOT;
        if (s->out_locs[b] < 0 || s->out_locs[b] >= s->token_slots) return HD_BAD_TOKEN_SLOT;
        int64_t n;
        hd_kv_span(s, b, &n);
        if (n < 1) return HD_EMPTY_KV;
        max_kv = max64(max_kv, n);
    }
    /* Every row's span lies in kv_flat[0 .. kv_offsets[B]) (the caller checked that the offsets rise from 0). */
    for (int64_t t = 0; t < s->kv_offsets[B]; t++)
        if (s->kv_flat[t] < 0 || s->kv_flat[t] >= s->token_slots) return HD_BAD_TOKEN_SLOT;
    int64_t scratch = 0;
    for (int64_t l = 0; l < m->n_layers; l++) scratch = max64(scratch, layer_scratch(&m->layers[l], B, H));
    const int64_t slots = hp_threads(), part = attention_part(m, s, max_kv); /* attention scratch per part */
    float *x = scratch_for((size_t)(3 * B * H + scratch + slots * part));
    if (!x) return HD_NO_MEMORY;
    float *xn = x + B * H, *delta = xn + B * H, *work = delta + B * H, *scores = work + scratch;
    GemmSet g = {0};
    for (int64_t b = 0; b < B; b++) {
        const float *row = m->embed + s->ids[b] * H;
        for (int64_t i = 0; i < H; i++) x[b * H + i] = m->embed_scale != 1.0 ? row[i] * (float)m->embed_scale : row[i];
    }
    for (int64_t l = 0; l < m->n_layers; l++) {
        const HDLayer *L = &m->layers[l];
        for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, L->in_norm, H, m->eps, xn + b * H);
        if (L->kind == 0)
            deltanet(m, L, s, xn, delta, work, &g);
        else
            attention(m, L, s, xn, delta, work, scores, part, slots, &g);
        for (int64_t i = 0; i < B * H; i++) x[i] += delta[i];
        for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, L->post_norm, H, m->eps, xn + b * H);
        if (L->n_exp > 0)
            moe(m, L, s, xn, delta, work);
        else
            swiglu_mlp(L, H, xn, B, delta, work);
        for (int64_t i = 0; i < B * H; i++) x[i] += delta[i];
    }
    /* An extend needs only its last token's logits: the lm_head is the largest projection. */
    const int64_t first = s->last_logits ? B - 1 : 0;
    for (int64_t b = first; b < B; b++) rms_norm(x + b * H, m->final_norm, H, m->eps, xn + b * H);
    gemm_add(&g, m->lm_head, NULL, m->vocab, H, xn + first * H, H, B - first, s->logits, m->vocab);
    gemm_run(&g);
    scratch_done(x);
    return HD_OK;
}
