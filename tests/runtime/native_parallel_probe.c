/* A probe of runtime/native/parallel.h for tests/runtime/test_native_parallel.py (and
 * benchmarks/native_pool_wake.py): every call goes through the pool exactly as a kernel's would. */
#include "../../runtime/native/parallel.h"

#include <stdint.h>
#include <string.h>

static _Thread_local char thread_tag;

void probe_set_threads(int n) { hp_set_threads(n); }
int probe_threads(void) { return hp_threads(); }
int probe_started(void) { return hp_started_threads(); }
int probe_sleeping(void) { return hp_sleeping_workers(); }
void probe_set_spin_us(int64_t us) { hp_set_spin_us(us); }

typedef struct {
    int64_t *hits; /* [n]: how many parts covered item i */
    int64_t *part_begin; /* [n]: the begin of the part that covered item i */
    int64_t *thread; /* [n]: the address of the covering thread's thread-local tag */
} Fill;

static void fill_task(void *ctx, int64_t begin, int64_t end) {
    Fill *f = ctx;
    for (int64_t i = begin; i < end; i++) {
        f->hits[i] += 1;
        f->part_begin[i] = begin;
        f->thread[i] = (int64_t)(intptr_t)&thread_tag;
    }
}

void probe_fill(int64_t n, int64_t grain, int64_t *hits, int64_t *part_begin, int64_t *thread) {
    Fill f = {hits, part_begin, thread};
    hp_parallel_for(n, grain, fill_task, &f);
}

/* A task that itself calls hp_parallel_for: the inner loop runs inline on the part's thread. */
static void nested_task(void *ctx, int64_t begin, int64_t end) {
    Fill *f = ctx;
    Fill inner = {f->hits + begin, f->part_begin + begin, f->thread + begin};
    hp_parallel_for(end - begin, 1, fill_task, &inner);
}

void probe_nested(int64_t n, int64_t *hits, int64_t *part_begin, int64_t *thread) {
    Fill f = {hits, part_begin, thread};
    hp_parallel_for(n, 1, nested_task, &f);
}

static void empty_task(void *ctx, int64_t begin, int64_t end) {
    (void)ctx, (void)begin, (void)end;
}

/* `rounds` regions of two parts that do nothing: what a region costs (its wake-up and barrier). */
void probe_empty_regions(int64_t rounds) {
    for (int64_t r = 0; r < rounds; r++) hp_parallel_for(2, 1, empty_task, NULL);
}

#if HP_HAS_MXCSR
static void tiny_task(void *ctx, int64_t begin, int64_t end) {
    float *out = ctx;
    volatile float a = 1e-20f, b = 1e-20f; /* a*b = 1e-40: a denormal, 0 under flush-to-zero */
    for (int64_t i = begin; i < end; i++) out[i] = a * b;
}

/* Items computed under the caller's MXCSR with flush-to-zero and denormals-are-zero set for this call. */
void probe_flush_to_zero(int64_t n, float *out) {
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | 0x8040);
    hp_parallel_for(n, 1, tiny_task, out);
    _mm_setcsr(saved);
}
#endif

typedef struct {
    int64_t iters;
    int64_t *thread; /* [n] */
    double *sink; /* [n] */
} Busy;

static void busy_task(void *ctx, int64_t begin, int64_t end) {
    Busy *b = ctx;
    for (int64_t i = begin; i < end; i++) {
        double x = (double)i;
        for (int64_t k = 0; k < b->iters; k++) x = x * 0.999999 + 1e-9; /* a dependent chain: fixed time an item */
        b->sink[i] = x;
        b->thread[i] = (int64_t)(intptr_t)&thread_tag;
    }
}

/* n items of `iters` dependent multiply-adds each, one region; `thread[i]` says who ran item i. */
void probe_busy(int64_t n, int64_t iters, int64_t *thread, double *sink) {
    Busy b = {iters, thread, sink};
    hp_parallel_for(n, 1, busy_task, &b);
}
