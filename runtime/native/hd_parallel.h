/* Falcon-H1's layer in the native step (hybrid_decode.c, HD_PARALLEL), as runtime/models/falcon_h1.py computes a
 * decode token:
 *     h = norm(x, in_norm)
 *     x = x + mamba2(h * ssm_in_mul) * ssm_out_mul + attention(h * attn_in_mul) * attn_out_mul
 *     x = x + down(up(h2) * silu(gate(h2) * mlp_gate_mul)) * mlp_down_mul,  h2 = norm(x, post_norm)
 * The Mamba2 mixer (hd_mamba2.h) scales its in_proj rows by their section's multiplier (in_proj_mul) and gates
 * its output as gate_mode says; the attention (hd_attention.h) scales its keys by key_mul before RoPE. Every
 * multiplier is applied where torch applies it, as an fp32 product (never folded into a weight: other bits), and
 * each sum in torch's order. An extend chain (HDStep.chain) runs through both mixers' chains: the Mamba2 state and
 * the attention's causal rows advance token by token as in a Qwen3-Next extend. */
#ifndef HYBRIDCTL_HD_PARALLEL_H
#define HYBRIDCTL_HD_PARALLEL_H

#include "hd_attention.h"
#include "hd_mamba2.h"
#include "hd_model.h"
#include "row_gemm.h"
#include "vexp.h"

#include <stdint.h>

/* Floats of the mixers' and the MLP's own scratch, before the layer's four [B, H] buffers. */
static int64_t parallel_inner(const HDLayer *L, int64_t B) {
    return max64(max64(mamba2_scratch(L, B), attention_scratch(L, B)), 2 * B * L->mlp_inter);
}

static int64_t parallel_scratch(const HDLayer *L, int64_t B, int64_t H) { return parallel_inner(L, B) + 4 * B * H; }

/* out = x * mul over n values (torch's `x * multiplier`). */
static void scaled_copy(const float *x, double mul, int64_t n, float *out) {
    const float f = (float)mul;
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * f;
}

static void parallel_layer(const HDModel *m, const HDLayer *L, const HDStep *s, float *x, float *xn, float *work,
                           float *scores, int64_t part, int64_t slots, GemmSet *g) {
    const int64_t B = s->batch, H = m->hidden, n = B * H, I = L->mlp_inter;
    float *xs = work + parallel_inner(L, B), *xa = xs + n, *ds = xa + n, *da = ds + n;
    for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, L->in_norm, H, m->eps, xn + b * H);
    scaled_copy(xn, L->ssm_in_mul, n, xs);
    scaled_copy(xn, L->attn_in_mul, n, xa);
    mamba2(m, L, s, xs, ds, work, g);
    attention(m, L, s, xa, da, work, scores, part, slots, g);
    const float so = (float)L->ssm_out_mul, ao = (float)L->attn_out_mul;
    for (int64_t i = 0; i < n; i++) { /* (x + ssm * so) + attn * ao, each product rounded */
        const float t = x[i] + ds[i] * so;
        x[i] = t + da[i] * ao;
    }
    for (int64_t b = 0; b < B; b++) rms_norm(x + b * H, L->post_norm, H, m->eps, xn + b * H);
    float *gt = work, *up = work + B * I;
    gemm_add(g, L->mlp_gate, NULL, I, H, xn, H, B, gt, I);
    gemm_add(g, L->mlp_up, NULL, I, H, xn, H, B, up, I);
    gemm_run(g);
    const float gm = (float)L->mlp_gate_mul, dm = (float)L->mlp_down_mul;
    for (int64_t i = 0; i < B * I; i++) gt[i] *= gm;
    silu_mul(gt, gt, up, B * I); /* silu(gate * gm) * up */
    gemm_add(g, L->mlp_down, NULL, H, I, gt, I, B, ds, H);
    gemm_run(g);
    for (int64_t i = 0; i < n; i++) x[i] += ds[i] * dm;
}

#endif
