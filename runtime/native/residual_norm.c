/* A decoder layer's residual add and the RMSNorm after it, fp32, in one pass over the rows: sum = x + y (torch's
 * add, the same bits) and out = sum * rsqrt(mean(sum^2) + eps) * w (rmsnorm_rows' formula). torch's composite
 * F.rms_norm plus the add were ~6 passes over [2048, 256] per norm, each a dispatched op (peer model: ~7 ms of
 * norms a 2048-token prefill); here one, split over the pool by rows. */
#include <math.h>
#include <stdint.h>

#include "parallel.h"

typedef struct {
    int64_t dim;
    const float *x, *y, *w;
    float eps;
    float *sum, *out;
} residual_norm_job;

static void residual_norm_part(void *ctx, int64_t begin, int64_t end) {
    const residual_norm_job *j = ctx;
    const int64_t dim = j->dim;
    for (int64_t r = begin; r < end; r++) {
        const float *xr = j->x + r * dim;
        float *s = j->y ? j->sum + r * dim : (float *)xr, *o = j->out + r * dim;
        float acc = 0.0f;
        if (j->y) {
            const float *yr = j->y + r * dim;
#pragma omp simd reduction(+ : acc)
            for (int64_t i = 0; i < dim; i++) {
                s[i] = xr[i] + yr[i];
                acc += s[i] * s[i];
            }
        } else {
#pragma omp simd reduction(+ : acc)
            for (int64_t i = 0; i < dim; i++) acc += s[i] * s[i];
        }
        const float inv = 1.0f / sqrtf(acc / (float)dim + j->eps);
#pragma omp simd
        for (int64_t i = 0; i < dim; i++) o[i] = s[i] * inv * j->w[i];
    }
}

/* rows x dim, all contiguous. y NULL: out = norm(x) only (sum untouched). sum may be x (an in-place add). */
int residual_rmsnorm(int64_t rows, int64_t dim, const float *x, const float *y, const float *w, float eps, float *sum,
                     float *out) {
    residual_norm_job job = {dim, x, y, w, eps, sum, out};
    hp_parallel_for(rows, 64, residual_norm_part, &job);
    return 0;
}
