/* The short-extend library: the gated-DeltaNet and norm kernels (extend_kernels.c; long extends chunked,
 * gdn_chunked.c; bf16 RMSNorm rows, bf16_rows.c; residual add + norm, residual_norm.c), the MoE kernels
 * (moe_kernels.c; an fp32 prefill's, moe_rows.c) and long extends' causal attention (flash_attention.c) built as one
 * shared object, because parallel.h keeps one worker pool per library: with two, one library's workers would still
 * be spinning on the second core when the other's region wants it.
 *
 * The pool's thread count is set once at load (runtime/native/extend_kernels.py: --num-threads, at most the usable
 * cores; RUNTIME_SHORT_EXTEND_THREADS pins another). */
#include "extend_kernels.c"
#include "gdn_chunked.c"
#include "bf16_rows.c"
#include "residual_norm.c"
#include "moe_kernels.c"
#include "flash_attention.c"
#include "moe_rows.c"

/* Threads for the next calls (1: everything inline, no worker ever started); returns the count now set. */
int short_extend_set_threads(int n) {
    hp_set_threads(n);
    return hp_threads();
}
