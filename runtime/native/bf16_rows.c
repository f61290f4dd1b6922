/* RMSNorm of bf16 rows to bf16 rows (the 16-bit models' per-layer norms over a long extend): each row widened,
 * normed in fp32 with an fp32 weight, rounded back to nearest-even, in one pass and split over the worker pool by
 * rows. torch's bf16 path is three passes over the rows (widen, rms_norm, narrow), each a full-size temporary: ~2 ns
 * an element on the 2-core host, 136 ms of a real-size Qwen3-Next 2048-token prefill. */
#include <math.h>
#include <stdint.h>

#include "parallel.h"

static inline float bf16_widen(uint16_t v) {
    union {
        uint32_t u;
        float f;
    } b = {.u = (uint32_t)v << 16};
    return b.f;
}

/* fp32 -> bf16, round to nearest even (torch's rounding); a NaN stays a (quiet) NaN. */
static inline uint16_t bf16_round(float f) {
    union {
        float f;
        uint32_t u;
    } b = {.f = f};
    if ((b.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b.u >> 16) | 0x40u);
    return (uint16_t)((b.u + 0x7fffu + ((b.u >> 16) & 1u)) >> 16);
}

typedef struct {
    int64_t dim, x_stride;
    const uint16_t *x;
    const float *w;
    float eps;
    uint16_t *out;
} bf16_norm_job;

static void bf16_norm_rows(void *ctx, int64_t begin, int64_t end) {
    const bf16_norm_job *j = ctx;
    const int64_t dim = j->dim;
    for (int64_t r = begin; r < end; r++) {
        const uint16_t *xr = j->x + r * j->x_stride;
        uint16_t *o = j->out + r * dim;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < dim; i++) acc += bf16_widen(xr[i]) * bf16_widen(xr[i]);
        const float inv = 1.0f / sqrtf(acc / (float)dim + j->eps);
#pragma omp simd
        for (int64_t i = 0; i < dim; i++) o[i] = bf16_round(bf16_widen(xr[i]) * inv * j->w[i]);
    }
}

/* out[r] = bf16(x[r] * rsqrt(mean(x[r]^2) + eps) * w) for `rows` rows of `dim`; x rows x_stride apart, out
 * contiguous. Any thread count gives the same bits (a row is one thread's). */
int rmsnorm_rows_bf16(int64_t rows, int64_t dim, const uint16_t *x, int64_t x_stride, const float *w, float eps,
                      uint16_t *out) {
    bf16_norm_job job = {dim, x_stride, x, w, eps, out};
    hp_parallel_for(rows, 16, bf16_norm_rows, &job);
    return 0;
}
