/* Shared by the runtime's C kernels: a branch-free exp (so loops around it vectorize) and silu on top of it.
 * Included as "vexp.h"; runtime/native/build.py hashes included headers into the library's cache key. */
#ifndef HYBRIDCTL_VEXP_H
#define HYBRIDCTL_VEXP_H

#include <stdint.h>
#include <string.h>

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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HYBRIDCTL_VEXP256 1
/* vexpf on 8 lanes (the same reduction and polynomial; FMA contraction may round a lane differently from the
 * scalar form, so a kernel uses one or the other for a given value, never both). */
static inline __m256 vexp256(__m256 x) {
    /* A NaN stays NaN, as in vexpf (the clamp alone would turn it into exp(-87.3)). */
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    x = _mm256_blendv_ps(_mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.37f)), x, nan);
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic), magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    const __m256 r2 = _mm256_mul_ps(r, r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, r2, r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#if defined(__AVX512F__)
/* vexp256 on 16 lanes: the same steps, so a value gets the same bits from either width. */
static inline __m512 vexp512(__m512 x) {
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    x = _mm512_mask_mov_ps(_mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.37f)), nan, x);
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic), magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    const __m512 r2 = _mm512_mul_ps(r, r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_add_ps(_mm512_fmadd_ps(y, r2, r), _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
#endif
/* silu on 8 lanes: v / (1 + vexp256(-v)). */
static inline __m256 silu256(__m256 v) {
    return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), vexp256(_mm256_sub_ps(_mm256_setzero_ps(), v))));
}
#endif

/* h[i] = silu(g[i]) * u[i] for i < n (h may be g or u). Every value goes through the same 8-lane code, a tail
 * through a padded vector, so its rounding never depends on where a row or a thread's part of it ends. */
static inline void silu_mul(float *h, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
#ifdef HYBRIDCTL_VEXP256
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(h + i, _mm256_mul_ps(silu256(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    if (i < n) {
        float gt[8] = {0}, ut[8] = {0}, ht[8];
        memcpy(gt, g + i, (size_t)(n - i) * sizeof(float));
        memcpy(ut, u + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(ht, _mm256_mul_ps(silu256(_mm256_loadu_ps(gt)), _mm256_loadu_ps(ut)));
        memcpy(h + i, ht, (size_t)(n - i) * sizeof(float));
    }
#else
    for (; i < n; i++) h[i] = silu(g[i]) * u[i];
#endif
}

/* x[i] = silu(x[i]) for i < n: 8 lanes at a time where vexp256 exists, silu() for the rest. */
static inline void silu_inplace(float *x, int64_t n) {
    int64_t i = 0;
#ifdef HYBRIDCTL_VEXP256
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, silu256(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = silu(x[i]);
}

#endif
