/* A probe of runtime/native/row_gemm.h and wide_gemm.h for tests/runtime/test_native_gemm.py: each GEMM form by
 * itself, and a GemmSet through the pool exactly as the native step runs its projections. */
#include "../../runtime/native/row_gemm.h"

#include <stdint.h>

int probe_wide_rows(void) { return HD_WIDE_ROWS; }
void probe_set_threads(int n) { hp_set_threads(n); }
void probe_set_min_part_bytes(int64_t bytes) { hd_part_bytes = bytes < 1 ? 1 : bytes; }

/* form 0: the dot form (gemm), 1: the broadcast form (gemm_wide), 2: gemm_rows (the dispatch on B). */
void probe_gemm(int form, const float *W, const float *bias, int64_t N, int64_t K, const float *X, int64_t ldx,
                int64_t B, float *Y, int64_t ldy) {
    if (form == 0)
        gemm(W, bias, N, K, X, ldx, B, Y, ldy);
    else if (form == 1)
        gemm_wide(W, bias, N, K, X, ldx, B, Y, ldy);
    else
        gemm_rows(W, bias, N, K, X, ldx, B, Y, ldy);
}

/* Two projections of one X as one region of the pool (the step's GemmSet), split as the threads and the minimum
 * part size say. */
void probe_gemm_set(const float *W0, int64_t N0, const float *W1, const float *bias1, int64_t N1, int64_t K,
                    const float *X, int64_t B, float *Y0, float *Y1) {
    GemmSet g = {0};
    gemm_add(&g, W0, NULL, N0, K, X, K, B, Y0, N0);
    gemm_add(&g, W1, bias1, N1, K, X, K, B, Y1, N1);
    gemm_run(&g);
}
