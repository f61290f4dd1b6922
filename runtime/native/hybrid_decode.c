/* One decode step of a hybrid LM in plain C: embedding, every layer (a mixer: gated DeltaNet, Mamba2 or full
 * attention, then a feed-forward: a sparse MoE with shared expert or a dense SwiGLU / squared-ReLU MLP; either may
 * be absent), final norm and lm_head, for B sequences of one new token each, or for one sequence's B new tokens (a
 * short extend: HDStep.chain, every layer kind but KDA and MLA; the DeltaNet and Mamba2 rows then run in token
 * order, hd_deltanet.h and hd_mamba2.h, and row b attends to the cached tokens and the new ones up to itself). The Qwen3-Next family
 * (qwen3_next, qwen3_5, qwen3_5_moe), Nemotron-H (Mamba2, attention without RoPE, squared-ReLU MLP layers,
 * hd_mamba2.h), Granite-4.0-H (muP multipliers: HDModel's residual_scale and logits_div), Kimi-Linear (KDA,
 * hd_kda.h, and MLA, hd_mla.h) and Falcon-H1 (HD_PARALLEL layers, hd_parallel.h) are what
 * runtime/engine/native_decode.py builds for it. Called once per step through ctypes
 * (runtime/native/hybrid_decode.py), so a step is one call instead of ~800 dispatched torch ops (an extend's ~1000).
 *
 * Semantics follow the torch modules (runtime/models/layers/): every weight matrix (projections, experts, router,
 * embedding, lm_head) is read in place from the model's own parameters (row-major [out, in]), fp32 or bf16 (HDMat:
 * a bf16 weight is widened to fp32 in a register, dot_gemm.h); norms, biases and the other small vectors are fp32;
 * activations, sums and the recurrent state are fp32. The pools are the engine's fp32 buffers, written in place at
 * the step's slots. Every pointer, dtype, shape and contiguity is validated by the Python side before the call; this
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

#include "hd_attention.h"
#include "hd_deltanet.h"
#include "hd_ffn.h"
#include "hd_kda.h"
#include "hd_mamba2.h"
#include "hd_mla.h"
#include "hd_model.h"
#include "hd_parallel.h"
#include "parallel.h"
#include "row_gemm.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the step ---- */

/* Floats of scratch one layer needs for B sequences. */
static int64_t layer_scratch(const HDLayer *L, int64_t B, int64_t H) {
    const int64_t mixer = L->kind == HD_DELTANET  ? deltanet_scratch(L, B)
                          : L->kind == HD_MAMBA2   ? mamba2_scratch(L, B)
                          : L->kind == HD_ATTENTION ? attention_scratch(L, B)
                          : L->kind == HD_KDA       ? kda_scratch(L, B)
                          : L->kind == HD_MLA       ? mla_scratch(L, B)
                          : L->kind == HD_PARALLEL  ? parallel_scratch(L, B, H)
                                                    : 0;
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

/* x += delta (times Granite's residual_multiplier when it is not 1: the product rounded, then the sum, as torch's
 * `x + out * m`; c11 keeps the compiler from fusing them). */
static void add_residual(float *x, const float *delta, int64_t n, float rs) {
    if (rs == 1.0f)
        for (int64_t i = 0; i < n; i++) x[i] += delta[i];
    else
        for (int64_t i = 0; i < n; i++) x[i] += delta[i] * rs;
}

void hd_set_threads(int n) { hp_set_threads(n); }
void hd_set_min_part_bytes(int64_t bytes) { hd_part_bytes = bytes < 1 ? 1 : bytes; }
int hd_threads(void) { return hp_threads(); }

int hd_decode(const HDModel *m, const HDStep *s) {
    const int64_t B = s->batch, H = m->hidden;
    if (s->chain)
        for (int64_t l = 0; l < m->n_layers; l++)
            if (m->layers[l].kind == HD_KDA || m->layers[l].kind == HD_MLA) return HD_NO_CHAIN;
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
    for (int64_t c = 0; c < s->n_checkpoints; c++) {
        const int64_t n = s->checkpoint_tokens[c], dst = s->checkpoint_slots[c];
        if (!s->chain || n < 1 || n > B || dst < 0 || dst >= s->state_slots_count || dst == s->state_slots[0])
            return HD_BAD_CHECKPOINT;
    }
    /* Every row's span lies in kv_flat[0 .. kv_offsets[B]) (the caller checked that the offsets rise from 0). */
    for (int64_t t = 0; t < s->kv_offsets[B]; t++)
        if (s->kv_flat[t] < 0 || s->kv_flat[t] >= s->token_slots) return HD_BAD_TOKEN_SLOT;
    int64_t scratch = 0;
    for (int64_t l = 0; l < m->n_layers; l++) scratch = max64(scratch, layer_scratch(&m->layers[l], B, H));
    const int64_t slots = hp_threads(), part = attention_part(m, s, max_kv); /* attention scratch per part */
    float *x = scratch_for((size_t)(3 * B * H + scratch + attention_shared(m, s) + slots * part));
    if (!x) return HD_NO_MEMORY;
    float *xn = x + B * H, *delta = xn + B * H, *work = delta + B * H, *scores = work + scratch;
    GemmSet g = {0};
    const float rs = (float)m->residual_scale;
    for (int64_t b = 0; b < B; b++) {
        const int64_t row = s->ids[b] * H;
        for (int64_t i = 0; i < H; i++) {
            const float e = hd_mat_get(m->embed, row + i);
            x[b * H + i] = m->embed_scale != 1.0 ? e * (float)m->embed_scale : e;
        }
    }
    for (int64_t l = 0; l < m->n_layers; l++) {
        const HDLayer *L = &m->layers[l];
        if (L->kind == HD_PARALLEL) { /* Falcon-H1 */
            parallel_layer(m, L, s, x, xn, work, scores, part, slots, &g);
            continue;
        }
        if (L->kind != HD_NO_MIXER) {
            for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, L->in_norm, H, m->eps, xn + b * H);
            if (L->kind == HD_DELTANET)
                deltanet(m, L, s, xn, delta, work, &g);
            else if (L->kind == HD_MAMBA2)
                mamba2(m, L, s, xn, delta, work, &g);
            else if (L->kind == HD_KDA)
                kda(m, L, s, xn, delta, work, &g);
            else if (L->kind == HD_MLA)
                mla(m, L, s, xn, delta, work, &g);
            else
                attention(m, L, s, xn, delta, work, scores, part, slots, &g);
            add_residual(x, delta, B * H, rs);
        }
        if (L->n_exp == 0 && L->mlp_inter == 0) continue; /* a mixer-only layer */
        for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, L->post_norm, H, m->eps, xn + b * H);
        if (L->n_exp > 0)
            moe(m, L, s, xn, delta, work);
        else
            dense_mlp(L, H, xn, B, delta, work);
        add_residual(x, delta, B * H, rs);
    }
    /* An extend needs only its last token's logits: the lm_head is the largest projection. */
    const int64_t first = s->last_logits ? B - 1 : 0;
    for (int64_t b = first; b < B; b++) rms_norm(x + b * H, m->final_norm, H, m->eps, xn + b * H);
    gemm_add(&g, m->lm_head, NULL, m->vocab, H, xn + first * H, H, B - first, s->logits, m->vocab);
    gemm_run(&g);
    if (m->logits_div != 1.0) { /* Granite's logits_scaling: a division, as torch's */
        const float div = (float)m->logits_div;
        for (int64_t i = 0; i < (B - first) * m->vocab; i++) s->logits[i] /= div;
    }
    if (m->logits_mul != 0.0) { /* Falcon-H1's lm_head_multiplier: a product, as torch's */
        const float mul = (float)m->logits_mul;
        for (int64_t i = 0; i < (B - first) * m->vocab; i++) s->logits[i] *= mul;
    }
    scratch_done(x);
    return HD_OK;
}
