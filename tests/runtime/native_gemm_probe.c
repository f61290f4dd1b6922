/* A probe of runtime/native/row_gemm.h, dot_gemm.h and wide_gemm.h for tests/runtime/test_native_gemm.py: each GEMM
 * form by itself on fp32 or bf16 weights, and a GemmSet through the pool exactly as the native step runs its
 * projections. */
#include "../../runtime/native/row_gemm.h"

#include <stdint.h>

int probe_wide_rows(void) { return HD_WIDE_ROWS; }
void probe_set_threads(int n) { hp_set_threads(n); }
void probe_set_min_part_bytes(int64_t bytes) { hd_part_bytes = bytes < 1 ? 1 : bytes; }

/* Which paths this build compiled: 2 AVX-512, 1 AVX2 + FMA, 0 plain C. */
int probe_isa(void) {
#if defined(DG_AVX512)
    return 2;
#elif defined(DG_AVX2)
    return 1;
#else
    return 0;
#endif
}

/* 1 when bf16 weights of the dot form take AMX tiles in this build (amx_gemm.h), else 0. */
int probe_amx(void) {
#ifdef AG_AMX
    return ag_ready();
#else
    return 0;
#endif
}

/* form 0: the dot form (gemm), 1: the broadcast form (gemm_wide), 2: gemm_rows (the dispatch on B). W: fp32 or
 * bf16 (dtype: HD_F32 / HD_BF16). */
void probe_gemm(int form, int64_t dtype, const void *W, const float *bias, int64_t N, int64_t K, const float *X,
                int64_t ldx, int64_t B, float *Y, int64_t ldy) {
    const HDMat w = {W, dtype};
    if (form == 0)
        gemm(w, bias, N, K, X, ldx, B, Y, ldy);
    else if (form == 1)
        gemm_wide(w, bias, N, K, X, ldx, B, Y, ldy);
    else
        gemm_rows(w, bias, N, K, X, ldx, B, Y, ldy);
}

/* Two projections of one X as one region of the pool (the step's GemmSet), split as the threads and the minimum
 * part size say. */
void probe_gemm_set(int64_t dtype, const void *W0, int64_t N0, const void *W1, const float *bias1, int64_t N1,
                    int64_t K, const float *X, int64_t B, float *Y0, float *Y1) {
    GemmSet g = {0};
    gemm_add(&g, (HDMat){W0, dtype}, NULL, N0, K, X, K, B, Y0, N0);
    gemm_add(&g, (HDMat){W1, dtype}, bias1, N1, K, X, K, B, Y1, N1);
    gemm_run(&g);
}
