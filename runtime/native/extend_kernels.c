/* Short extends of a gated-DeltaNet layer (Qwen3-Next / Qwen3.5), token by token, in one call per layer.
 *
 * Everything between the input projections and the output projection: the depthwise causal conv over the new
 * tokens with its rolling window, silu, the per-head l2 norm of q and k, the gates (beta = sigmoid(b),
 * g = -exp(A_log) * softplus(a + dt_bias)), the gated delta rule state update, and the gated RMSNorm of the
 * output. At a few tokens the chunked torch form is ~100 dispatched ops a layer for ~20 MFLOP of work; here it
 * is one pass over the data with the state in L1.
 *
 * Layouts (all fp32, row-major, checked by the Python wrapper before the call):
 *   mixed   [T, conv_dim] rows `mixed_stride` floats apart: [q (nk*dk) | k (nk*dk) | v (nv*dv)]
 *   z       [T, nv*dv]   rows `z_stride` apart;  b, a [T, nv] rows `ba_stride` apart
 *   conv_w  [conv_dim, width+1]; conv_bias [conv_dim] or NULL
 *   conv_pool [slots, conv_dim, width]; ssm_pool [slots, nv, dv, dk] (SGLang's layout)
 *   out     [T, nv*dv] contiguous
 * Sequences are packed in batch order: sequence i owns tokens [start_i, start_i + lens[i]).
 * Checkpoint m: after ck_tokens[m] new tokens of sequence ck_seq[m], its conv window and state go to slot
 * ck_slots[m]. The caller guarantees distinct state slots and checkpoint slots disjoint from them, so the pool
 * is updated in place.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "vexp.h"

static inline float softplus(float x) {
    /* torch's F.softplus (beta 1, threshold 20) */
    return x > 20.0f ? x : log1pf(expf(x));
}

static void l2norm_heads(float *x, int64_t heads, int64_t dim) {
    for (int64_t h = 0; h < heads; h++) {
        float *row = x + h * dim;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < dim; j++) acc += row[j] * row[j];
        const float inv = 1.0f / sqrtf(acc + 1e-6f);
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) row[j] *= inv;
    }
}

/* One token of the delta rule for one head, on the state transposed to [dk, dv] (rows by key channel), so every
 * loop runs along dv without a horizontal sum: S' = exp(g) S + k ⊗ beta (v - exp(g) Sᵀk); o = S'ᵀq. The decay
 * is applied to Sᵀk and inside the update, so the state is read twice and written once per token. */
static void delta_step(float *restrict state, const float *restrict q, const float *restrict k,
                       const float *restrict v, float decay, float beta, float scale, float *restrict o,
                       float *restrict kv, int64_t dv, int64_t dk) {
#pragma omp simd
    for (int64_t i = 0; i < dv; i++) kv[i] = 0.0f;
    for (int64_t j = 0; j < dk; j++) {
        const float *restrict row = state + j * dv;
        const float kj = k[j];
#pragma omp simd
        for (int64_t i = 0; i < dv; i++) kv[i] += row[i] * kj;
    }
#pragma omp simd
    for (int64_t i = 0; i < dv; i++) {
        kv[i] = (v[i] - kv[i] * decay) * beta; /* now the delta */
        o[i] = 0.0f;
    }
    for (int64_t j = 0; j < dk; j++) {
        float *restrict row = state + j * dv;
        const float kj = k[j], qj = q[j] * scale;
#pragma omp simd
        for (int64_t i = 0; i < dv; i++) {
            row[i] = row[i] * decay + kv[i] * kj;
            o[i] += row[i] * qj;
        }
    }
}

/* [heads, rows, cols] -> [heads, cols, rows] */
static void transpose_heads(float *restrict dst, const float *restrict src, int64_t heads, int64_t rows,
                            int64_t cols) {
    for (int64_t h = 0; h < heads; h++) {
        const float *s = src + h * rows * cols;
        float *d = dst + h * rows * cols;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) d[c * rows + r] = s[r * cols + c];
    }
}

/* Gated RMSNorm of each dv-row: x * rsqrt(mean(x^2) + eps) * w * silu(z). */
static void gated_rmsnorm(float *restrict x, const float *restrict z, const float *restrict w, int64_t heads,
                          int64_t dim, float eps) {
    for (int64_t h = 0; h < heads; h++) {
        float *row = x + h * dim;
        const float *zr = z + h * dim;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < dim; j++) acc += row[j] * row[j];
        const float inv = 1.0f / sqrtf(acc / (float)dim + eps);
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) row[j] = row[j] * inv * w[j] * silu(zr[j]);
    }
}

/* One sequence's work, shared by the parallel parts below. */
typedef struct {
    int64_t len, row0, conv_dim, key_dim, nk, nv, dk, dv, taps, ratio, head_size, ba_stride, z_stride, n_ck, seq;
    int64_t mixed_stride; /* mixed32's rows apart */
    int64_t act_t0; /* the token in act's first row: 0, or the chunked kernel's current chunk (gdn_chunked.c) */
    float scale, norm_eps;
    const float *mixed32; /* fp32 conv inputs read in place (NULL: every row widened into full) */
    const float *full, *w_t, *conv_bias, *a, *b, *neg_exp_a, *dt_bias, *z, *norm_w;
    const uint16_t *z16; /* z as bf16 bits instead (then z is NULL): the chunked kernel's 16-bit inputs */
    const int64_t *ck_seq, *ck_tokens, *ck_slots;
    int has_prefix;
    float *act, *gates, *state, *ssm_pool, *work, *out;
    int64_t state_size, work_stride; /* work: work_stride floats per value head */
} gdn_seq;

/* Row j of the sequence's conv input (its `taps - 1` old inputs, then the new tokens): fp32 inputs are read where
 * the projection wrote them, not through a copy of the whole prompt's (4 MB a layer at 2048 tokens of the peer
 * model, written and read back through memory). */
static inline const float *conv_row(const gdn_seq *c, int64_t j) {
    const int64_t width = c->taps - 1;
    if (j < width || !c->mixed32) return c->full + j * c->conv_dim;
    return c->mixed32 + (c->row0 + j - width) * c->mixed_stride;
}

/* Tokens [begin, end): conv taps in torch's order (x0*w0, then + x_tap*w_tap, then + bias), silu (8 lanes at a
 * time), the l2 norm of the q and k heads, and the gates. Tokens are independent here. */
static void gdn_prologue(void *ctx, int64_t begin, int64_t end) {
    const gdn_seq *c = ctx;
    const int64_t conv_dim = c->conv_dim, nv = c->nv, taps = c->taps;
    for (int64_t t = begin; t < end; t++) {
        const int64_t row = c->row0 + t;
        float *tok = c->act + (t - c->act_t0) * conv_dim;
        if (taps == 4) { /* every model here: the taps unrolled, so the loop vectorizes over channels */
            const float *x0 = conv_row(c, t), *x1 = conv_row(c, t + 1), *x2 = conv_row(c, t + 2);
            const float *x3 = conv_row(c, t + 3), *w = c->w_t;
#pragma omp simd
            for (int64_t ch = 0; ch < conv_dim; ch++) {
                float acc = x0[ch] * w[ch];
                acc += x1[ch] * w[conv_dim + ch];
                acc += x2[ch] * w[2 * conv_dim + ch];
                tok[ch] = acc + x3[ch] * w[3 * conv_dim + ch];
            }
        } else {
            const float *x0 = conv_row(c, t);
#pragma omp simd
            for (int64_t ch = 0; ch < conv_dim; ch++) tok[ch] = x0[ch] * c->w_t[ch];
            for (int64_t j = 1; j < taps; j++) {
                const float *xj = conv_row(c, t + j), *wj = c->w_t + j * conv_dim;
#pragma omp simd
                for (int64_t ch = 0; ch < conv_dim; ch++) tok[ch] += xj[ch] * wj[ch];
            }
        }
        if (c->conv_bias) {
#pragma omp simd
            for (int64_t ch = 0; ch < conv_dim; ch++) tok[ch] += c->conv_bias[ch];
        }
        silu_inplace(tok, conv_dim);
        l2norm_heads(tok, 2 * c->nk, c->dk); /* q heads, then k heads */
        for (int64_t h = 0; h < nv; h++) {
            const float g = c->neg_exp_a[h] * softplus(c->a[row * c->ba_stride + h] + c->dt_bias[h]);
            c->gates[(2 * t) * nv + h] = vexpf(g);
            c->gates[(2 * t + 1) * nv + h] = 1.0f / (1.0f + vexpf(-c->b[row * c->ba_stride + h]));
        }
    }
}

/* Value heads [begin, end): the recurrence token by token, one head's state ([dk, dv], 16 KB at 64 x 64) in L1
 * across the tokens, each output row gated-normed as it is made, and the head's share of every checkpoint.
 * Heads are independent: each writes its own output columns and state slices. */
static void gdn_heads(void *ctx, int64_t begin, int64_t end) {
    const gdn_seq *c = ctx;
    const int64_t dk = c->dk, dv = c->dv, nv = c->nv, head_size = c->head_size;
    for (int64_t h = begin; h < end; h++) {
        float *work = c->work + h * c->work_stride, *kv = work + head_size;
        const int64_t kh = h / c->ratio;
        if (c->has_prefix)
            transpose_heads(work, c->state + h * head_size, 1, dv, dk);
        else
            memset(work, 0, sizeof(float) * (size_t)head_size);
        for (int64_t t = 0; t < c->len; t++) {
            const int64_t row = c->row0 + t;
            const float *tok = c->act + t * c->conv_dim;
            float *o = c->out + row * nv * dv + h * dv;
            delta_step(work, tok + kh * dk, tok + c->key_dim + kh * dk, tok + 2 * c->key_dim + h * dv,
                       c->gates[(2 * t) * nv + h], c->gates[(2 * t + 1) * nv + h], c->scale, o, kv, dv, dk);
            gated_rmsnorm(o, c->z + row * c->z_stride + h * dv, c->norm_w, 1, dv, c->norm_eps);
            for (int64_t m = 0; m < c->n_ck; m++)
                if (c->ck_seq[m] == c->seq && c->ck_tokens[m] == t + 1)
                    transpose_heads(c->ssm_pool + c->ck_slots[m] * c->state_size + h * head_size, work, 1, dk, dv);
        }
        transpose_heads(c->state + h * head_size, work, 1, dk, dv);
    }
}

/* The arguments of gdn_short_extend and gdn_chunked_extend (gdn_chunked.c), which share the driver below. */
#define GDN_EXTEND_PARAMS                                                                                              \
    int64_t n_seqs, const int64_t *lens, const int64_t *has_prefix, const int64_t *state_slots, const void *mixed,   \
        int64_t mixed_stride, const void *z, int64_t z_stride, const float *b, const float *a, int64_t ba_stride,     \
        const float *conv_w, const float *conv_bias, float *conv_pool, float *ssm_pool, const float *neg_exp_a,       \
        const float *dt_bias, const float *norm_w, float norm_eps, int64_t nk, int64_t nv, int64_t dk, int64_t dv,   \
        int64_t width, int64_t n_ck, const int64_t *ck_seq, const int64_t *ck_tokens, const int64_t *ck_slots,       \
        float *out, int64_t bf16
#define GDN_EXTEND_ARGS                                                                                                \
    n_seqs, lens, has_prefix, state_slots, mixed, mixed_stride, z, z_stride, b, a, ba_stride, conv_w, conv_bias,     \
        conv_pool, ssm_pool, neg_exp_a, dt_bias, norm_w, norm_eps, nk, nv, dk, dv, width, n_ck, ck_seq, ck_tokens,   \
        ck_slots, out, bf16

/* dst[0, n) = src's n values from element `at`: fp32, or with `bf16` bf16 bit patterns (widened exactly). */
static void widen_row(float *restrict dst, const void *src, int64_t at, int64_t n, int64_t bf16) {
    if (!bf16) {
        memcpy(dst, (const float *)src + at, sizeof(float) * (size_t)n);
        return;
    }
    const uint16_t *s = (const uint16_t *)src + at;
    uint32_t *d = (uint32_t *)dst;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) d[i] = (uint32_t)s[i] << 16;
}

/* One sequence's conv, gates, recurrence and norm, its conv input in place or in c->full (conv_row). */
typedef void (*gdn_seq_fn)(gdn_seq *c);

/* Every new token's conv, silu, l2 norm and gates first (split over threads by token), then the recurrence (split
 * by value head). */
static void gdn_token_by_token(gdn_seq *c) {
    hp_parallel_for(c->len, 8, gdn_prologue, c);
    hp_parallel_for(c->nv, 1, gdn_heads, c);
}

/* Returns 0, or 1 when scratch memory could not be had (nothing written then). Per sequence: `run`, with
 * `work_stride` scratch floats per value head. Which thread computes a token or a head does not change how: any
 * thread count gives the same bits. */
static int gdn_extend_run(GDN_EXTEND_PARAMS, gdn_seq_fn run, int64_t work_stride) {
    const int64_t key_dim = nk * dk, conv_dim = 2 * key_dim + nv * dv, taps = width + 1;
    const int64_t ratio = nv / nk, head_size = dv * dk, state_size = nv * head_size;
    int64_t max_len = 0;
    for (int64_t s = 0; s < n_seqs; s++) max_len = lens[s] > max_len ? lens[s] : max_len;
    /* full: time-major conv input of one sequence (its old window, then with bf16 inputs the new tokens widened); act: the conv outputs,
     * q and k normalized; gates: decay then beta per (token, head); w_t: the taps tap-major; work: per value head,
     * its state as [dk, dv], then kv [dv] */
    float *full = malloc(sizeof(float) * (size_t)((width + (bf16 ? max_len : 0)) * conv_dim + 1));
    float *act = malloc(sizeof(float) * (size_t)(max_len * conv_dim + 1));
    float *gates = malloc(sizeof(float) * (size_t)(2 * max_len * nv + 1));
    float *w_t = malloc(sizeof(float) * (size_t)(taps * conv_dim));
    float *work = malloc(sizeof(float) * (size_t)(nv * work_stride));
    if (!full || !act || !gates || !w_t || !work) {
        free(full);
        free(act);
        free(gates);
        free(w_t);
        free(work);
        return 1;
    }
    for (int64_t ch = 0; ch < conv_dim; ch++)
        for (int64_t j = 0; j < taps; j++) w_t[j * conv_dim + ch] = conv_w[ch * taps + j];
    int64_t start = 0;
    for (int64_t s = 0; s < n_seqs; s++) {
        const int64_t len = lens[s];
        float *cstate = conv_pool + state_slots[s] * conv_dim * width;
        if (has_prefix[s]) {
            for (int64_t j = 0; j < width; j++)
                for (int64_t ch = 0; ch < conv_dim; ch++) full[j * conv_dim + ch] = cstate[ch * width + j];
        } else {
            memset(full, 0, sizeof(float) * (size_t)(width * conv_dim));
        }
        for (int64_t t = 0; bf16 && t < len; t++)
            widen_row(full + (width + t) * conv_dim, mixed, (start + t) * mixed_stride, conv_dim, bf16);
        gdn_seq c = {
            .len = len, .row0 = start, .conv_dim = conv_dim, .key_dim = key_dim, .nk = nk, .nv = nv, .dk = dk,
            .dv = dv, .taps = taps, .ratio = ratio, .head_size = head_size, .ba_stride = ba_stride,
            .z_stride = z_stride, .n_ck = n_ck, .seq = s, .scale = 1.0f / sqrtf((float)dk), .norm_eps = norm_eps,
            .mixed32 = bf16 ? NULL : mixed, .mixed_stride = mixed_stride, .full = full, .w_t = w_t, .conv_bias = conv_bias, .a = a, .b = b, .neg_exp_a = neg_exp_a,
            .dt_bias = dt_bias, .z = bf16 ? NULL : z, .z16 = bf16 ? z : NULL, .norm_w = norm_w, .ck_seq = ck_seq, .ck_tokens = ck_tokens,
            .ck_slots = ck_slots, .has_prefix = (int)has_prefix[s], .act = act, .gates = gates,
            .state = ssm_pool + state_slots[s] * state_size, .ssm_pool = ssm_pool, .work = work, .out = out,
            .state_size = state_size, .work_stride = work_stride,
        };
        run(&c);
        /* conv windows: the `width` inputs ending at each checkpoint's token, and at the last new token */
        for (int64_t m = 0; m < n_ck; m++) {
            if (ck_seq[m] != s) continue;
            float *cw = conv_pool + ck_slots[m] * conv_dim * width;
            for (int64_t ch = 0; ch < conv_dim; ch++)
                for (int64_t j = 0; j < width; j++) cw[ch * width + j] = conv_row(&c, ck_tokens[m] + j)[ch];
        }
        for (int64_t ch = 0; ch < conv_dim; ch++)
            for (int64_t j = 0; j < width; j++) cstate[ch * width + j] = conv_row(&c, len + j)[ch];
        start += len;
    }
    free(full);
    free(act);
    free(gates);
    free(w_t);
    free(work);
    return 0;
}

/* A few new tokens, token by token. */
int gdn_short_extend(GDN_EXTEND_PARAMS) { return gdn_extend_run(GDN_EXTEND_ARGS, gdn_token_by_token, dv * dk + dv); }

/* RMSNorm of `rows` rows of `dim`: out = x * rsqrt(mean(x^2) + eps) * w (F.rms_norm's formula, its sum in another
 * order). x rows x_stride apart, out contiguous. At a short extend's few rows F.rms_norm is a composite of ~6
 * dispatched ops (~80 us for 48 x 256 here); this is a few microseconds. */
int rmsnorm_rows(int64_t rows, int64_t dim, const float *x, int64_t x_stride, const float *w, float eps,
                 float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *o = out + r * dim;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < dim; j++) acc += xr[j] * xr[j];
        const float inv = 1.0f / sqrtf(acc / (float)dim + eps);
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) o[j] = xr[j] * inv * w[j];
    }
    return 0;
}
