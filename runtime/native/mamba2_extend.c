/* Mamba2 extend kernels around the torch scan (runtime/models/layers/mamba2_extend.py). The depthwise causal conv +
 * silu over one sequence's new inputs in one pass: the torch form (conv.py) makes ~7 passes a block over an fp32
 * copy of the window; here each input row is read once (bf16 or fp32, strided: a column range of in_proj's output),
 * the K taps accumulate in fp32 registers and the silu'd row is written once in the input's dtype. The gated
 * RMSNorm likewise in one pass over y and the gate.
 *
 * Plain C: with -O3 -march=native the channel loop vectorizes to the CPU's widest vectors (AVX-512, AVX2, or
 * scalar code elsewhere); vexpf is branch-free for that reason. bf16 is converted through its bits (the upper half
 * of an fp32), rounded to nearest even on the way out, as torch's .to(bfloat16) does. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Each call here is followed by milliseconds of torch work on torch's own threads: a worker of this pool spinning
 * through parallel.h's default 300 us would take a core from them; it sleeps almost at once instead. */
#define HP_SPIN_US 20
#include "parallel.h"
#include "vexp.h"

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u & 0x7FFFFFFFu) > 0x7F800000u; /* integer compare: the loop stays vectorizable */
    return (uint16_t)(nan ? (u >> 16) | 0x40u : rounded); /* a nan stays a (quiet) nan */
}

/* Input row t (t < 0: row width + t of `old`, the inputs before the first new one) into `dst` as fp32. */
static void load_row(float *restrict dst, int64_t t, int64_t channels, const void *x, int64_t x_stride, int bf16,
                     const float *old, int64_t width, int64_t old_stride) {
    if (t < 0) {
        memcpy(dst, old + (width + t) * old_stride, (size_t)channels * sizeof(float));
    } else if (bf16) {
        const uint16_t *src = (const uint16_t *)x + t * x_stride;
        for (int64_t c = 0; c < channels; c++) dst[c] = bf16_to_f32(src[c]);
    } else {
        memcpy(dst, (const float *)x + t * x_stride, (size_t)channels * sizeof(float));
    }
}

/* acc[c] = sum over taps of r[k][c] * taps[k][c], then + bias[c], then silu: conv.py's order of operations, so the
 * conv's fp32 sums are its bits (the library is built without FMA contraction); each loop a vectorizable one. */
static void conv_row(float *restrict acc, const float *const *r, const float *restrict taps, int64_t taps_stride,
                     const float *bias, int64_t kernel, int64_t channels) {
    const float *restrict in0 = r[0];
    for (int64_t c = 0; c < channels; c++) acc[c] = in0[c] * taps[c];
    for (int64_t k = 1; k < kernel; k++) {
        const float *restrict in = r[k];
        const float *restrict w = taps + k * taps_stride;
        for (int64_t c = 0; c < channels; c++) acc[c] += in[c] * w[c];
    }
    if (bias)
        for (int64_t c = 0; c < channels; c++) acc[c] += bias[c];
    for (int64_t c = 0; c < channels; c++) acc[c] = acc[c] / (1.0f + vexpf(-acc[c]));
}

static void store_bf16(uint16_t *restrict dst, const float *restrict src, int64_t n) {
    for (int64_t c = 0; c < n; c++) dst[c] = f32_to_bf16(src[c]);
}

typedef struct {
    int64_t length, channels, kernel, x_stride;
    int bf16;
    const void *x;
    const float *old, *taps, *bias;
    float *rows;
    void *out;
} conv_job;

#define CONV_SLICE 64 /* channels per unit of work: a part's rows stay in its core's L1/L2 */

/* Channels [begin * CONV_SLICE, end * CONV_SLICE) for every step: a part owns those columns of the scratch rows. */
static void conv_part(void *ctx, int64_t begin, int64_t end) {
    const conv_job *j = (const conv_job *)ctx;
    const int64_t c0 = begin * CONV_SLICE, n = (end * CONV_SLICE < j->channels ? end * CONV_SLICE : j->channels) - c0;
    const int64_t kernel = j->kernel, width = kernel - 1, stride = j->channels;
    const int64_t xs = j->bf16 ? 2 : 4; /* bytes per input element */
    const void *x = (const char *)j->x + c0 * xs;
    float *rows = j->rows + c0, *acc = j->rows + kernel * stride + c0;
    /* A ring of the last `kernel` input rows as fp32: row t lives at rows[(t mod kernel) * stride]. */
    for (int64_t t = -width; t < 0; t++)
        load_row(rows + ((t + kernel) % kernel) * stride, t, n, x, j->x_stride, j->bf16, j->old + c0, width, stride);
    for (int64_t t = 0; t < j->length; t++) {
        load_row(rows + (t % kernel) * stride, t, n, x, j->x_stride, j->bf16, j->old + c0, width, stride);
        const float *r[8];
        for (int64_t k = 0; k < kernel; k++) r[k] = rows + ((t - width + k + kernel) % kernel) * stride;
        /* fp32 output: accumulated in place in the output row. */
        float *dst = j->bf16 ? acc : (float *)j->out + t * stride + c0;
        conv_row(dst, r, j->taps + c0, stride, j->bias ? j->bias + c0 : NULL, kernel, n);
        if (j->bf16) store_bf16((uint16_t *)j->out + t * stride + c0, acc, n);
    }
}

/* length new inputs x [length, channels] (row stride x_stride elements; bf16 when `bf16`, else fp32); old: the
 * width = kernel - 1 earlier inputs [width, channels] fp32; taps: [kernel, channels] fp32 (tap k multiplies input
 * t - width + k); bias [channels] or NULL; rows: scratch of (kernel + 1) * channels floats; out [length, channels],
 * contiguous, x's dtype. Channel slices go to the worker pool (any split gives the same bits). Returns 0, or -1
 * for a kernel it does not take. */
int mamba2_conv_extend(int64_t length, int64_t channels, int64_t kernel, const void *x, int64_t x_stride, int bf16,
                       const float *old, const float *taps, const float *bias, float *rows, void *out) {
    if (kernel < 1 || kernel > 8 || channels < 1 || length < 0) return -1;
    conv_job job = {length, channels, kernel, x_stride, bf16, x, old, taps, bias, rows, out};
    hp_parallel_for((channels + CONV_SLICE - 1) / CONV_SLICE, 4, conv_part, &job);
    return 0;
}

typedef struct {
    int64_t dim, group, y_stride, z_stride;
    int bf16;
    const void *y, *z;
    const float *weight;
    float eps;
    void *out;
} norm_job;

/* Rows [begin, end): h = y * silu(z), each group of `group` channels scaled by rsqrt(mean(h^2) + eps), times the
 * weight. In bf16 the normalized h is rounded before the weight multiplies it and again after, as norm.py's
 * `weight * h.to(bf16)` rounds. */
static void norm_rows(void *ctx, int64_t begin, int64_t end) {
    const norm_job *j = (const norm_job *)ctx;
    float h[j->group];
    for (int64_t t = begin; t < end; t++) {
        for (int64_t g0 = 0; g0 < j->dim; g0 += j->group) {
            const int64_t n = j->group;
            float ss = 0.0f;
            if (j->bf16) {
                const uint16_t *restrict y = (const uint16_t *)j->y + t * j->y_stride + g0;
                const uint16_t *restrict z = (const uint16_t *)j->z + t * j->z_stride + g0;
                for (int64_t c = 0; c < n; c++) {
                    const float zc = bf16_to_f32(z[c]);
                    h[c] = zc / (1.0f + vexpf(-zc)) * bf16_to_f32(y[c]);
                }
            } else {
                const float *restrict y = (const float *)j->y + t * j->y_stride + g0;
                const float *restrict z = (const float *)j->z + t * j->z_stride + g0;
                for (int64_t c = 0; c < n; c++) h[c] = z[c] / (1.0f + vexpf(-z[c])) * y[c];
            }
#pragma omp simd reduction(+ : ss)
            for (int64_t c = 0; c < n; c++) ss += h[c] * h[c];
            const float scale = 1.0f / sqrtf(ss / (float)n + j->eps);
            const float *restrict w = j->weight + g0;
            if (j->bf16) {
                uint16_t *restrict o = (uint16_t *)j->out + t * j->dim + g0;
                for (int64_t c = 0; c < n; c++) o[c] = f32_to_bf16(w[c] * bf16_to_f32(f32_to_bf16(h[c] * scale)));
            } else {
                float *restrict o = (float *)j->out + t * j->dim + g0;
                for (int64_t c = 0; c < n; c++) o[c] = w[c] * (h[c] * scale);
            }
        }
    }
}

/* Mamba2's gated RMSNorm over `rows` tokens: y [rows, dim] (row stride y_stride), gate z [rows, dim] (row stride
 * z_stride), both bf16 when `bf16`, else fp32; weight [dim] fp32 (bf16-exact in bf16 mode); out [rows, dim]
 * contiguous in the inputs' dtype. Rows go to the worker pool. Returns 0, or -1 for a shape it does not take. */
int mamba2_gated_norm(int64_t rows, int64_t dim, int64_t group, const void *y, int64_t y_stride, const void *z,
                      int64_t z_stride, int bf16, const float *weight, float eps, void *out) {
    if (group < 1 || group > 4096 || dim % group != 0 || rows < 0) return -1;
    norm_job job = {dim, group, y_stride, z_stride, bf16, y, z, weight, eps, out};
    hp_parallel_for(rows, 16, norm_rows, &job);
    return 0;
}

typedef struct {
    int64_t groups, per_group, len;
    const float *a_cum, *shifted, *scores, *d;
    float *out;
} mixing_job;

/* (chunk, head) pairs [begin, end): out[l][s] = exp(a_cum[l] - shifted[s]) * scores[l][s] for s <= l, 0 above the
 * diagonal, + d[head] on it; ssd.py's masked-exp form, in its order of operations, one pass, the exps of the lower
 * triangle only. */
static void mixing_part(void *ctx, int64_t begin, int64_t end) {
    const mixing_job *j = (const mixing_job *)ctx;
    const int64_t heads = j->groups * j->per_group, len = j->len;
    for (int64_t p = begin; p < end; p++) {
        const int64_t chunk = p / heads, head = p % heads, group = head / j->per_group;
        const float *restrict a = j->a_cum + p * len;
        const float *restrict sh = j->shifted + p * len;
        const float *restrict sc = j->scores + (chunk * j->groups + group) * len * len;
        float *restrict o = j->out + p * len * len;
        for (int64_t l = 0; l < len; l++) {
            const float al = a[l];
            for (int64_t s = 0; s <= l; s++) o[l * len + s] = vexpf(al - sh[s]) * sc[l * len + s];
            for (int64_t s = l + 1; s < len; s++) o[l * len + s] = 0.0f;
            o[l * len + l] += j->d[head];
        }
    }
}

/* chunks x (groups * per_group) heads of len x len intra-chunk weights: a_cum, shifted [chunks, heads, len];
 * scores [chunks, groups, len, len] (C . B); d [heads]; out [chunks, heads, len, len]; all fp32, contiguous. */
int mamba2_mixing(int64_t chunks, int64_t groups, int64_t per_group, int64_t len, const float *a_cum,
                  const float *shifted, const float *scores, const float *d, float *out) {
    if (chunks < 0 || groups < 1 || per_group < 1 || len < 1) return -1;
    mixing_job job = {groups, per_group, len, a_cum, shifted, scores, d, out};
    hp_parallel_for(chunks * groups * per_group, 4, mixing_part, &job);
    return 0;
}

typedef struct {
    uint16_t *x;
} relu2_job;

#define RELU2_SLICE 4096 /* elements per unit of work */

/* relu(x)^2 in place: the square in fp32 rounded once, as torch's relu_().square_() on bf16 (bit for bit; a nan
 * stays a nan, -0 squares to +0). */
static void relu2_part(void *ctx, int64_t begin, int64_t end) {
    uint16_t *restrict x = ((const relu2_job *)ctx)->x;
    for (int64_t i = begin * RELU2_SLICE; i < end * RELU2_SLICE; i++) {
        const float v = bf16_to_f32(x[i]);
        const float r = v < 0.0f ? 0.0f : v;
        x[i] = f32_to_bf16(r * r);
    }
}

/* Nemotron-H's squared-ReLU MLP activation on its up projection's bf16 output [n], in place: torch's bf16 relu_
 * (clamp_min_) took ~17 ms of a 2048-token prefill's [2048, 8192] per MLP layer, the square ~4. n a multiple of
 * RELU2_SLICE (the caller does any tail); returns 0, or -1 otherwise. */
int nemotron_relu2_bf16(int64_t n, uint16_t *x) {
    if (n < 0 || n % RELU2_SLICE != 0) return -1;
    relu2_job job = {x};
    hp_parallel_for(n / RELU2_SLICE, 16, relu2_part, &job);
    return 0;
}

/* Threads for the next calls (1: inline, no worker started); returns the count now set. */
int mamba2_extend_set_threads(int n) {
    hp_set_threads(n);
    return hp_threads();
}
