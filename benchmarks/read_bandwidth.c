/* The host's read bandwidth for benchmarks/native_decode_bf16.py: the threads of parallel.h's pool (the pool the
 * native step splits its weight rows over) each sum a contiguous part of a buffer with vector loads and adds, nothing
 * else, so the time is the memory's: the bytes per second a decode step's weight stream could read at best. */
#include "../runtime/native/parallel.h"

#include <stdint.h>

typedef float rb_v8 __attribute__((vector_size(32)));

typedef struct {
    const float *data;
    float *sink; /* [blocks]: each part's sum, so the loads are not dead code */
} RbCtx;

#define RB_BLOCK 4096 /* floats a unit */

static void rb_part(void *ctx, int64_t begin, int64_t end) {
    const RbCtx *c = ctx;
    rb_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    const rb_v8 *p = (const rb_v8 *)(c->data + begin * RB_BLOCK), *stop = (const rb_v8 *)(c->data + end * RB_BLOCK);
    for (; p < stop; p += 4) a0 += p[0], a1 += p[1], a2 += p[2], a3 += p[3];
    const rb_v8 s = (a0 + a1) + (a2 + a3);
    float t = 0.0f;
    for (int i = 0; i < 8; i++) t += s[i];
    c->sink[begin] = t;
}

void rb_set_threads(int n) { hp_set_threads(n); }

/* Sums `blocks` blocks of RB_BLOCK floats at `data` (32-byte aligned), one part per thread. */
void rb_read(const float *data, int64_t blocks, float *sink) {
    RbCtx c = {data, sink};
    const int64_t parts = hp_threads();
    hp_parallel_for(blocks, (blocks + parts - 1) / parts, rb_part, &c);
}
