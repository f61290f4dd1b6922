/* A tiny persistent worker pool for the runtime's C kernels (header-only, C11 + pthreads, no OpenMP runtime).
 *
 *     typedef void (*hp_task)(void *ctx, int64_t begin, int64_t end);
 *     void hp_parallel_for(int64_t n, int64_t grain, hp_task fn, void *ctx);
 *     void hp_set_threads(int n);   1 = run inline (no worker is ever started); workers start lazily
 *     int hp_threads(void);
 *
 * hp_parallel_for splits [0, n) into P = min(hp_threads(), n / grain) contiguous parts, part p = [n*p/P, n*(p+1)/P),
 * and returns when all are done. The caller and the workers claim parts one at a time (the caller first), so a
 * worker that is descheduled or slow to wake costs nothing: the caller runs the parts it has not claimed. Which
 * thread runs a part never changes what it computes (see MXCSR below), so results do not depend on the timing.
 *
 * Why not OpenMP: torch links its own OpenMP runtime; a second one in the same process fights it for the cores.
 * Why spin, then block: a decode step opens ~40 regions a few microseconds apart, and a sleeping worker takes tens
 * of microseconds (on a busy host, milliseconds) to wake, so a worker spins (HP_SPIN_US, default 300 us: longer than
 * the engine's gap between steps) before it sleeps on a condition variable; an idle server burns no CPU after that.
 *
 * One region at a time per library: a second thread calling in while a region runs (two engine threads in one
 * process), or a task calling hp_parallel_for itself, runs its loop inline on its own thread: correct, serial.
 * Workers copy the caller's MXCSR (flush-to-zero / denormals-are-zero) per region, so a part computes exactly as it
 * would on the caller: the split never changes a result.
 *
 * Each .so that includes this header has its own pool (static state); its workers sleep while another runs.
 */
#ifndef HYBRIDCTL_PARALLEL_H
#define HYBRIDCTL_PARALLEL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HP_PAUSE() _mm_pause()
#define HP_HAS_MXCSR 1
#elif defined(__aarch64__)
#define HP_PAUSE() __asm__ __volatile__("yield")
#define HP_HAS_MXCSR 0
#else
#define HP_PAUSE() ((void)0)
#define HP_HAS_MXCSR 0
#endif

#define HP_MAX_THREADS 64
#ifndef HP_SPIN_US
#define HP_SPIN_US 300
#endif

typedef void (*hp_task)(void *ctx, int64_t begin, int64_t end);

typedef struct {
    pthread_mutex_t region; /* held by the thread running a region */
    pthread_mutex_t sleep_mu;
    pthread_cond_t sleep_cv;
    int threads; /* the configured count (>= 1) */
    int started; /* workers started: 1 .. started-1 */
    uint32_t generation; /* the current region's number (written under `region`) */
    /* The region's claim word: generation << 32 | parts << 16 | next part. A thread claims a part with one CAS that
     * also proves the region is still the one it woke for, so a worker that wakes late never touches a later
     * region's parts, and a caller whose worker is descheduled simply runs the parts itself. */
    _Atomic uint64_t work;
    atomic_int done; /* parts finished in the current region */
    atomic_int sleepers;
    atomic_llong spin_ns; /* how long an idle worker spins before it sleeps */
    uint32_t born; /* the generation when the latest workers were created (no region of theirs yet) */
    /* the current region, written before `work` is published */
    hp_task fn;
    void *ctx;
    int64_t n;
    unsigned mxcsr;
    pthread_t tids[HP_MAX_THREADS];
} hp_pool_t;

static hp_pool_t hp_pool_ = {
    .region = PTHREAD_MUTEX_INITIALIZER,
    .sleep_mu = PTHREAD_MUTEX_INITIALIZER,
    .sleep_cv = PTHREAD_COND_INITIALIZER,
    .threads = 1,
    .started = 1,
    .spin_ns = (long long)HP_SPIN_US * 1000,
};

/* C11's clock (clock_gettime needs _POSIX_C_SOURCE, which an including file compiled with -std=c11 lacks); a spin
 * ends when the clock passes its deadline or steps back. */
static inline int64_t hp_now_ns_(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline uint32_t hp_gen_(uint64_t w) { return (uint32_t)(w >> 32); }

/* Claim and run parts of region `gen` until none is left (or the region is another one). */
static inline void hp_drain_(hp_pool_t *p, uint32_t gen, int worker) {
    uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
    for (;;) {
        const int64_t parts = (int64_t)((w >> 16) & 0xffff), part = (int64_t)(w & 0xffff);
        if (hp_gen_(w) != gen || part >= parts) return;
        if (!atomic_compare_exchange_weak_explicit(&p->work, &w, w + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
#if HP_HAS_MXCSR
        if (worker && _mm_getcsr() != p->mxcsr) _mm_setcsr(p->mxcsr);
#else
        (void)worker;
#endif
        const int64_t begin = p->n * part / parts, end = p->n * (part + 1) / parts;
        if (begin < end) p->fn(p->ctx, begin, end);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        w = atomic_load_explicit(&p->work, memory_order_acquire);
    }
}

static void *hp_worker_(void *arg) {
    hp_pool_t *p = &hp_pool_;
    (void)arg;
    uint32_t seen = p->born; /* not the live generation: the first region may be published before we run */
    for (;;) {
        uint32_t g = hp_gen_(atomic_load_explicit(&p->work, memory_order_acquire));
        if (g == seen) {
            /* Spin, then sleep until the next region. Every 256 polls the spin yields the core (a no-op when
             * nothing else waits for it: the HTTP loop or another process runs instead of our spin) and checks
             * the clock. Measured served (benchmarks/serving_ab.py, load 1.5): 1.09x single stream, 1.11x 8 x 128
             * over the spin without the yield. */
            const int64_t start = hp_now_ns_(), spin = atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
            for (unsigned i = 1; g == seen; i++) {
                HP_PAUSE();
                g = hp_gen_(atomic_load_explicit(&p->work, memory_order_acquire));
                if (g == seen && (i & 255) == 0) {
                    sched_yield();
                    const int64_t now = hp_now_ns_();
                    if (now - start >= spin || now < start) break;
                }
            }
            if (g == seen) {
                pthread_mutex_lock(&p->sleep_mu);
                atomic_fetch_add(&p->sleepers, 1); /* seq_cst: pairs with the caller's publish-then-check */
                while ((g = hp_gen_(atomic_load(&p->work))) == seen) pthread_cond_wait(&p->sleep_cv, &p->sleep_mu);
                atomic_fetch_sub(&p->sleepers, 1);
                pthread_mutex_unlock(&p->sleep_mu);
            }
        }
        seen = g;
        hp_drain_(p, g, 1);
    }
    return NULL;
}

/* A forked child has none of the parent's workers: it starts its own. */
static void hp_after_fork_child_(void) {
    hp_pool_t *p = &hp_pool_;
    pthread_mutex_init(&p->region, NULL);
    pthread_mutex_init(&p->sleep_mu, NULL);
    pthread_cond_init(&p->sleep_cv, NULL);
    p->started = 1;
    atomic_store(&p->sleepers, 0);
}

/* Start workers 1 .. want-1 (caller holds `region`); returns how many threads there are. */
static int hp_start_workers_(hp_pool_t *p, int want) {
    static int fork_handler;
    if (!fork_handler && want > 1) fork_handler = pthread_atfork(NULL, NULL, hp_after_fork_child_) == 0;
    p->born = p->generation;
    while (p->started < want) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        const int rc = pthread_create(&p->tids[p->started], &attr, hp_worker_, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0) break; /* no more threads: run with what there is */
        pthread_detach(p->tids[p->started]);
        p->started++;
    }
    return p->started < want ? p->started : want;
}

static inline void hp_parallel_for(int64_t n, int64_t grain, hp_task fn, void *ctx) {
    hp_pool_t *p = &hp_pool_;
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t parts = n / grain;
    if (parts > p->threads) parts = p->threads;
    if (parts <= 1 || pthread_mutex_trylock(&p->region) != 0) {
        fn(ctx, 0, n); /* one part, a nested call, or another thread's region running: inline */
        return;
    }
    parts = hp_start_workers_(p, (int)parts);
    if (parts <= 1) {
        pthread_mutex_unlock(&p->region);
        fn(ctx, 0, n);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
#if HP_HAS_MXCSR
    p->mxcsr = _mm_getcsr();
#endif
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint32_t gen = ++p->generation;
    atomic_store(&p->work, (uint64_t)gen << 32 | (uint64_t)parts << 16); /* seq_cst: publishes the fields */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->sleep_mu);
        pthread_cond_broadcast(&p->sleep_cv);
        pthread_mutex_unlock(&p->sleep_mu);
    }
    hp_drain_(p, gen, 0);
    /* Every part is claimed; wait for the ones a worker is still running. */
    for (unsigned i = 1; atomic_load_explicit(&p->done, memory_order_acquire) < parts; i++) {
        HP_PAUSE();
        if ((i & 4095) == 0) sched_yield(); /* a descheduled worker: let it run */
    }
    pthread_mutex_unlock(&p->region);
}

static inline void hp_set_threads(int n) {
    hp_pool_t *p = &hp_pool_;
    if (n < 1) n = 1;
    if (n > HP_MAX_THREADS) n = HP_MAX_THREADS;
    pthread_mutex_lock(&p->region);
    p->threads = n;
    pthread_mutex_unlock(&p->region);
}

static inline int hp_threads(void) { return hp_pool_.threads; }

/* Introspection and tuning beyond the three calls above (tests, benchmarks). */
static inline int hp_started_threads(void) { return hp_pool_.started; }
static inline void hp_set_spin_us(int64_t us) { atomic_store(&hp_pool_.spin_ns, (long long)(us < 0 ? 0 : us) * 1000); }
static inline int hp_sleeping_workers(void) { return atomic_load(&hp_pool_.sleepers); }

#endif
