/* Shared by the runtime's C kernels: a branch-free exp (so loops around it vectorize) and silu on top of it.
 * Included as "vexp.h"; runtime/native/build.py hashes included headers into the library's cache key. */
#ifndef HYBRIDCTL_VEXP_H
#define HYBRIDCTL_VEXP_H

#include <stdint.h>

/* exp in plain arithmetic (Cephes' expf: range reduction by ln 2, a degree-6 polynomial, the exponent set
 * through the bits): libm's expf is a call the compiler cannot vectorize without -ffast-math, and it was most of
 * this kernel's time (a silu per conv channel per token). Relative error ~1e-7; its input is clamped to
 * [-87.3, 88.37] (exp(-87.3) ~ 1e-38: what a decay that small does to a state is nothing). Branch-free, so with
 * -fno-trapping-math (extend_kernels.py) the loops around it vectorize. */
static inline float vexpf(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.37f ? 88.37f : x);
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest, no call */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    const float r2 = r * r;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r2 + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    return y * scale.f;
}

static inline float silu(float x) { return x / (1.0f + vexpf(-x)); }

#endif
