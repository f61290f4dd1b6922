/* The native step's shared pieces (runtime/native/hybrid_decode.c and its headers): the
 * structs ctypes fills (runtime/native/hybrid_decode.py declares the same layouts), the error codes, and the
 * elementwise helpers every phase uses. */
#ifndef HYBRIDCTL_HD_MODEL_H
#define HYBRIDCTL_HD_MODEL_H

#include "row_gemm.h"

#include <math.h>
#include <stdint.h>

typedef struct {
    int64_t kind; /* HD_DELTANET, HD_ATTENTION, HD_MAMBA2, or HD_NO_MIXER (a feed-forward-only layer) */
    int64_t ordinal; /* index into the pool lists of its kind */
    const float *in_norm; /* [H] the mixer's input norm scale (Qwen3-Next: 1 + w) */
    const float *post_norm; /* [H] the feed-forward's input norm scale */
    /* gated DeltaNet */
    int64_t nk, nv, dk, dv, kernel;
    HDMat w_qkv; /* [2*nk*dk + nv*dv, H] rows q | k | v */
    HDMat w_z; /* [nv*dv, H] */
    HDMat w_b; /* [nv, H] */
    HDMat w_a; /* [nv, H] */
    const float *conv_w; /* [conv_dim, kernel] */
    const float *conv_b; /* [conv_dim] or NULL */
    const float *neg_a; /* [nv] -exp(A_log) */
    const float *dt_bias; /* [nv] */
    const float *gnorm_w; /* [dv] */
    HDMat w_out; /* [H, nv*dv] */
    /* gated attention */
    int64_t nh, nkv, hd, rot_dim, out_gate;
    HDMat wq, wk, wv, wo; /* [nh*hd*(1+out_gate), H], [nkv*hd, H] x2, [H, nh*hd] */
    const float *bq, *bk, *bv, *bo; /* biases or NULL */
    const float *q_norm, *k_norm; /* [hd] 1 + w, or NULL */
    const float *inv_freq; /* [rot_dim / 2] */
    double attn_scale;
    /* feed-forward: a sparse MoE (n_exp > 0) with an optional shared expert, a dense MLP (mlp_inter > 0: SwiGLU, or
     * squared ReLU where mlp_gate has no data), or none (n_exp == mlp_inter == 0: a mixer-only layer) */
    int64_t n_exp, top_k, exp_inter, norm_topk;
    HDMat router; /* [E, H] */
    HDMat exp_gate_up; /* [E, 2*I, H] */
    HDMat exp_down; /* [E, H, I] */
    int64_t mlp_inter; /* the dense MLP's or the shared expert's intermediate size; 0: none */
    HDMat mlp_gate, mlp_up, mlp_down; /* [I, H], [I, H], [H, I] */
    HDMat shared_gate; /* [1, H]; data NULL: none */
    /* Mamba2 (hd_mamba2.h; kernel, conv_w, conv_b, neg_a = -exp(A_log), dt_bias, gnorm_w [I] and w_out [H, I] as
     * above): mh heads of mp channels, mg groups of B and C of mn state entries each; I = mh * mp */
    int64_t mh, mp, mn, mg;
    HDMat w_in; /* [I + (I + 2 * mg * mn) + mh, H] rows z | xBC | dt */
    const float *b_in, *b_out; /* in_proj / out_proj biases or NULL */
    const float *d_skip; /* [mh] */
    double dt_min, dt_max;
    /* the MoE's routing (hd_ffn.h, route): HD_ROUTE_SOFTMAX (softmax over all experts, top-k, renormalized when
     * norm_topk: Qwen3-Next), HD_ROUTE_TOPK_SOFTMAX (top-k of the logits, softmax over those k: Granite),
     * HD_ROUTE_SIGMOID_GROUPS (sigmoid scores; the choice adds score_bias and keeps the topk_group of n_group
     * groups with the largest top-2 sums; weights renormalized when norm_topk, times routed_scale: Nemotron-H) */
    int64_t route, n_group, topk_group;
    const float *score_bias; /* [E] or NULL */
    double routed_scale;
    int64_t exp_relu2; /* 1: the experts are squared-ReLU MLPs, exp_gate_up [E, I, H] their up rows only */
    /* Kimi Delta Attention (hd_kda.h): nk heads of dk (== dv) channels, kernel, conv_w [3*nk*dk, kernel], neg_a [nk],
     * dt_bias [nk*dk], gnorm_w [dk] (o_norm) and w_out [H, nk*dk] as above */
    HDMat kda_q, kda_k, kda_v; /* [nk*dk, H] each */
    HDMat kda_fa, kda_fb, kda_ga, kda_gb; /* [dk, H], [nk*dk, dk], [dk, H], [nk*dk, dk] */
    HDMat kda_b; /* [nk, H] */
    /* Kimi's MLA (hd_mla.h): nh heads (above; wq [nh*(nope+rope), H] when mla_q_lora is 0, wo, bo and attn_scale
     * too), the kv_lora_rank latent and the rope-dim key part cached per token */
    int64_t mla_nope, mla_rope, mla_v, mla_lora, mla_q_lora;
    HDMat mla_qa, mla_qb; /* [q_lora, H], [nh*(nope+rope), q_lora] */
    HDMat mla_kva; /* [lora + rope, H] kv_a_proj_with_mqa */
    HDMat mla_kvb; /* [nh*(nope+v), lora] kv_b_proj */
    HDMat mla_kT; /* [nh, lora, nope] kv_b_proj's key rows, transposed per head */
    const float *mla_qa_b, *mla_kva_b; /* biases or NULL */
    const float *mla_qa_norm, *mla_kv_norm; /* [q_lora], [lora] */
    double mla_eps;
    /* Falcon-H1's muP multipliers (hd_parallel.h; 0 where unset: none). key_mul also applies in an attention layer:
     * the keys times it after their norm, before RoPE. */
    double attn_in_mul, attn_out_mul, ssm_in_mul, ssm_out_mul, key_mul, mlp_gate_mul, mlp_down_mul;
    const float *in_proj_mul; /* [I + conv_dim + mh]: Mamba2's in_proj rows times these (ssm_multipliers), or NULL */
    int64_t gate_mode; /* Mamba2's output gating: HD_GATE_GROUP_NORM, HD_GATE_ONLY or HD_NORM_THEN_GATE */
} HDLayer;

/* HD_GATE_GROUP_NORM: y * silu(z), then RMS-normalised per group (Mamba2's; Falcon-H1's gate-then-norm);
 * HD_GATE_ONLY: y * silu(z) (Falcon-H1 without mamba_rms_norm); HD_NORM_THEN_GATE: normalised, then gated. */
enum { HD_GATE_GROUP_NORM = 0, HD_GATE_ONLY = 1, HD_NORM_THEN_GATE = 2 };

enum { HD_ROUTE_SOFTMAX = 0, HD_ROUTE_TOPK_SOFTMAX = 1, HD_ROUTE_SIGMOID_GROUPS = 2 };

/* HD_PARALLEL: attention and Mamba2 side by side on one normed input, then a SwiGLU MLP (Falcon-H1, hd_parallel.h) */
enum { HD_DELTANET = 0, HD_ATTENTION = 1, HD_MAMBA2 = 2, HD_NO_MIXER = 3, HD_KDA = 4, HD_MLA = 5, HD_PARALLEL = 6 };

typedef struct {
    int64_t hidden, vocab, n_layers;
    double eps;
    double embed_scale;
    HDMat embed; /* [V, H] */
    const float *final_norm; /* [H] 1 + w */
    HDMat lm_head; /* [V, H] */
    const HDLayer *layers;
    double residual_scale; /* every mixer's and feed-forward's output times this before it is added (Granite) */
    double logits_div; /* the logits divided by this (Granite's logits_scaling) */
    double logits_mul; /* the logits times this (Falcon-H1's lm_head_multiplier); 0: none */
} HDModel;

typedef struct {
    int64_t batch;
    const int64_t *ids, *positions, *out_locs, *state_slots; /* [B] each */
    const int64_t *kv_offsets; /* [B + 1]: sequence b's KV slots are kv_flat[kv_offsets[b] .. kv_offsets[b+1]) */
    const int64_t *kv_flat;
    float *const *k_pool; /* per attention ordinal: [token_slots, nkv, hd] */
    float *const *v_pool;
    float *const *conv_pool; /* per linear ordinal: [state_slots, conv_dim, kernel - 1] */
    float *const *ssm_pool; /* per linear ordinal: [state_slots, nv, dv, dk] (Mamba2: [state_slots, mh, mp, mn]) */
    int64_t token_slots, state_slots_count;
    float *logits; /* [B, V], or [1, V] with last_logits */
    /* An extend of ONE sequence (chain = 1): the B rows are its consecutive new tokens. They share state_slots[0]
     * (conv window and recurrent state, advanced token by token in order), and row b attends to the causal prefix
     * kv_flat[0 .. kv_offsets[b + 1]) (the cached tokens, then the new ones up to itself). fresh: no cached
     * prefix, the state starts from zero whatever the slot holds. */
    int64_t chain, fresh;
    int64_t last_logits; /* 1: the last row's logits only */
    /* An extend's state checkpoints (chain only): after checkpoint_tokens[m] of its new tokens (1..B), the conv
     * window and recurrent state of every linear layer are also copied to state slot checkpoint_slots[m] (the
     * prefix cache's states inside a prompt; runtime/models/layers/state_checkpoints.py). */
    int64_t n_checkpoints;
    const int64_t *checkpoint_tokens, *checkpoint_slots; /* [n_checkpoints] each */
} HDStep;

/* Row b's KV slots and their count (see HDStep). */
static inline const int64_t *hd_kv_span(const HDStep *s, int64_t b, int64_t *n) {
    const int64_t begin = s->chain ? 0 : s->kv_offsets[b];
    *n = s->kv_offsets[b + 1] - begin;
    return s->kv_flat + begin;
}

enum {
    HD_OK = 0,
    HD_BAD_TOKEN = 1,
    HD_BAD_TOKEN_SLOT = 2,
    HD_BAD_STATE_SLOT = 3,
    HD_NO_MEMORY = 4,
    HD_EMPTY_KV = 5,
    HD_BAD_CHECKPOINT = 6,
    HD_NO_CHAIN = 7
};

/* ---- elementwise pieces ---- */

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float siluf_(float x) { return x / (1.0f + expf(-x)); }
static inline float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch's threshold 20 */

/* Prefetch slice i of n of layer L's feed-forward weights (experts' gate|up, experts' down, then the shared or
 * dense MLP's gate, up, down), one cache line at a time. An extend's mixer phases (the DeltaNet recurrence) are
 * compute-bound and leave DRAM idle, while the feed-forward after them streams its weights (~3 MB a layer for the
 * peer model, more than L2): fetched meanwhile, they wait in L2/L3 (Zen's L3 takes what L2 evicts). */
static inline void hd_prefetch_ffn(const HDLayer *L, int64_t H, int64_t i, int64_t n) {
#if defined(__x86_64__) || defined(__i386__)
    const int64_t E = L->n_exp, I = L->exp_inter, M = L->mlp_inter;
    const HDMat mat[5] = {L->exp_gate_up, L->exp_down, L->mlp_gate, L->mlp_up, L->mlp_down};
    const int64_t elems[5] = {E > 0 ? E * (L->exp_relu2 ? 1 : 2) * I * H : 0, E > 0 ? E * H * I : 0, M * H, M * H, H * M};
    int64_t len[5], total = 0; /* bytes */
    for (int r = 0; r < 5; r++) total += len[r] = mat[r].data ? elems[r] * hd_elem_size(mat[r]) : 0;
    const int64_t lo = total * i / n, hi = total * (i + 1) / n;
    int64_t at = 0;
    for (int r = 0; r < 5; r++) {
        if (len[r] == 0) continue;
        const int64_t a = lo > at ? lo - at : 0, b = hi < at + len[r] ? hi - at : len[r];
        for (int64_t f = a; f < b; f += 64) _mm_prefetch((const char *)mat[r].data + f, _MM_HINT_T1);
        at += len[r];
    }
#else
    (void)L, (void)H, (void)i, (void)n;
#endif
}

/* out = x * rsqrt(mean(x^2) + eps) * scale (scale NULL: none), over n values. */
static void rms_norm(const float *x, const float *scale, int64_t n, double eps, float *out) {
    float ss = dot(x, x, n);
    float r = 1.0f / sqrtf(ss / (float)n + (float)eps);
    for (int64_t i = 0; i < n; i++) out[i] = scale ? x[i] * r * scale[i] : x[i] * r;
}

#endif
