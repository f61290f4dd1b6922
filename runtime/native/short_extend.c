/* The short-extend library: the gated-DeltaNet and norm kernels (extend_kernels.c) and the MoE kernel
 * (moe_kernels.c) built as one shared object, because parallel.h keeps one worker pool per library: with two, one
 * library's workers would still be spinning on the second core when the other's region wants it.
 *
 * The pool's thread count follows the forward's (runtime/native/extend_kernels.py sets it from torch's intra-op
 * thread count before a call), so the engine's per-step choice of 1 or 2 threads covers these kernels too. */
#include "extend_kernels.c"
#include "moe_kernels.c"

/* Threads for the next calls (1: everything inline, no worker ever started); returns the count now set. */
int short_extend_set_threads(int n) {
    hp_set_threads(n);
    return hp_threads();
}
