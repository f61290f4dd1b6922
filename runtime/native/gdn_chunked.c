/* Long extends of a gated-DeltaNet layer (a cold prefill, a long prompt after a cached prefix): the chunked delta
 * rule in C, one value head's state and one chunk's tensors in cache throughout.
 *
 * The torch chunked form (runtime/models/layers/delta_rule.py) computes every chunk's intermediates for the whole
 * prompt at once: ~20 full-size fp32 tensors a layer (8 MB each at 2048 tokens x 8 heads x 128), each a fresh
 * allocation written and read back through memory; that traffic, not its 1.1 GMAC of matmuls, was its time. Here
 * each (value head, chunk) does the same algebra on [C, 128] tiles:
 *
 *   cum_i = g_1 + .. + g_i (within the chunk), Γ_ij = exp(cum_i - cum_j) for j <= i
 *   A = strictly-lower(β_i k_i.k_j Γ_ij), v_new = (I + A)⁻¹ (β v - β e^cum k S)   (forward substitution)
 *   out_i = e^cum_i q_i S + Σ_{j<=i} Γ_ij (q_i.k_j) v_new_j
 *   S' = e^cum_C S + Σ_j e^(cum_C - cum_j) k_j ⊗ v_new_j
 *
 * (transformers' torch_chunk_gated_delta_rule; the UT inverse applied by substitution rather than formed). The
 * state S is [dk, dv] (rows by key channel) inside, the pool's [dv, dk] outside. Chunks sit on a fixed grid from the
 * extend's first token; a checkpoint inside one is its start state advanced by the formula above cut at the
 * checkpoint. Conv, gates and the gated norm are the short-extend kernel's (extend_kernels.c), shared through
 * gdn_extend_run.
 *
 * The matmuls go through one register-blocked kernel written over a vector type: AVX-512 (16 lanes), AVX2 (8) or
 * plain C (1), whichever the compiler targets (-march=native). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vexp.h"

#define GDN_CHUNK 64

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 gvec;
#define GV_LANES 16
#define GV_LOAD(p) _mm512_loadu_ps(p)
#define GV_STORE(p, v) _mm512_storeu_ps(p, v)
#define GV_SET1(x) _mm512_set1_ps(x)
#define GV_ZERO() _mm512_setzero_ps()
#define GV_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define GV_MUL(a, b) _mm512_mul_ps(a, b)
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 gvec;
#define GV_LANES 8
#define GV_LOAD(p) _mm256_loadu_ps(p)
#define GV_STORE(p, v) _mm256_storeu_ps(p, v)
#define GV_SET1(x) _mm256_set1_ps(x)
#define GV_ZERO() _mm256_setzero_ps()
#define GV_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define GV_MUL(a, b) _mm256_mul_ps(a, b)
#else
typedef float gvec;
#define GV_LANES 1
#define GV_LOAD(p) (*(p))
#define GV_STORE(p, v) (*(p) = (v))
#define GV_SET1(x) (x)
#define GV_ZERO() 0.0f
#define GV_FMA(a, b, c) ((a) * (b) + (c))
#define GV_MUL(a, b) ((a) * (b))
#endif

/* Rows [i, i + 4) by columns [j, j + 4 * GV_LANES) of C = (acc ? C : 0) + alpha A B: 16 accumulators, each A
 * value broadcast once per k for 4 vectors. */
static inline void gmm_tile4x4(int64_t kk, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                               int64_t ldc, float alpha, int acc) {
    gvec s[4][4];
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) s[r][q] = GV_ZERO();
    for (int64_t p = 0; p < kk; p++) {
        const float *bp = b + p * ldb;
        const gvec b0 = GV_LOAD(bp), b1 = GV_LOAD(bp + GV_LANES), b2 = GV_LOAD(bp + 2 * GV_LANES),
                   b3 = GV_LOAD(bp + 3 * GV_LANES);
        for (int r = 0; r < 4; r++) {
            const gvec av = GV_SET1(a[r * lda + p]);
            s[r][0] = GV_FMA(av, b0, s[r][0]);
            s[r][1] = GV_FMA(av, b1, s[r][1]);
            s[r][2] = GV_FMA(av, b2, s[r][2]);
            s[r][3] = GV_FMA(av, b3, s[r][3]);
        }
    }
    const gvec al = GV_SET1(alpha);
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) {
            float *cp = c + r * ldc + q * GV_LANES;
            GV_STORE(cp, acc ? GV_FMA(al, s[r][q], GV_LOAD(cp)) : GV_MUL(al, s[r][q]));
        }
}

/* C[m, n] = (acc ? C : 0) + alpha A[m, k] B[k, n], all row-major with leading dimensions lda, ldb, ldc. Full 4 x
 * 4-vector tiles through gmm_tile4x4; the edges (a chunk cut short by a checkpoint, odd head sizes) row by row. */
static void gmm(int64_t m, int64_t n, int64_t kk, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                int64_t ldc, float alpha, int acc) {
    const int64_t tile_n = 4 * GV_LANES, full_m = m - m % 4, full_n = n - n % tile_n;
    for (int64_t i = 0; i < full_m; i += 4)
        for (int64_t j = 0; j < full_n; j += tile_n)
            gmm_tile4x4(kk, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, alpha, acc);
    for (int64_t i = 0; i < m; i++) {
        const int64_t j0 = i < full_m ? full_n : 0; /* the columns no tile covered */
        if (j0 >= n) continue;
        float *ci = c + i * ldc;
        float row[GDN_CHUNK * 4];
        float *tmp = n - j0 <= GDN_CHUNK * 4 ? row : NULL;
        if (!tmp) { /* wider than any tile here: straight into C */
            for (int64_t j = j0; j < n; j++) {
                float sum = 0.0f;
                for (int64_t p = 0; p < kk; p++) sum += a[i * lda + p] * b[p * ldb + j];
                ci[j] = acc ? ci[j] + alpha * sum : alpha * sum;
            }
            continue;
        }
        for (int64_t j = j0; j < n; j++) tmp[j - j0] = 0.0f;
        for (int64_t p = 0; p < kk; p++) {
            const float ap = a[i * lda + p];
            const float *bp = b + p * ldb;
#pragma omp simd
            for (int64_t j = j0; j < n; j++) tmp[j - j0] += ap * bp[j];
        }
        for (int64_t j = j0; j < n; j++) ci[j] = acc ? ci[j] + alpha * tmp[j - j0] : alpha * tmp[j - j0];
    }
}

/* One value head's per-chunk tiles, carved from its work_stride floats of scratch. */
typedef struct {
    float *state, *k, *kt, *q, *r, *kk, *qk, *cum, *beta, *snap, *kd; /* snap, kd: a checkpoint inside a chunk */
    float *raw; /* k.kT then q.kT before decays: the same for every value head of one key head */
} chunk_tiles;

static int64_t chunk_work_floats(int64_t dk, int64_t dv) {
    const int64_t c = GDN_CHUNK;
    return 2 * dk * dv + 4 * c * dk + c * dv + 4 * c * c + 2 * c;
}

static chunk_tiles carve_tiles(float *w, int64_t dk, int64_t dv) {
    const int64_t c = GDN_CHUNK;
    chunk_tiles t;
    t.state = w, w += dk * dv;
    t.k = w, w += c * dk;
    t.kt = w, w += c * dk;
    t.q = w, w += c * dk;
    t.r = w, w += c * dv;
    t.kk = w, w += c * c;
    t.qk = w, w += c * c;
    t.cum = w, w += c;
    t.beta = w, w += c;
    t.snap = w, w += dk * dv;
    t.raw = w, w += 2 * c * c;
    t.kd = w;
    return t;
}

/* Tokens [t0, t0 + n) of value head h: loads the chunk (k, its transpose, q scaled, β, cumulative gates), forms
 * k.kᵀ and q.kᵀ (or takes them from `shared`: the previous value head's of the same key head, this chunk), then
 * turns them and the tiles into the decayed forms the update uses. */
static void chunk_load(const gdn_seq *c, const chunk_tiles *t, int64_t h, int64_t t0, int64_t n, const float *shared) {
    const int64_t dk = c->dk, nv = c->nv, kh = h / c->ratio;
    float run = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = c->row0 + t0 + i;
        const float *tok = c->act + (t0 - c->act_t0 + i) * c->conv_dim;
        memcpy(t->k + i * dk, tok + c->key_dim + kh * dk, sizeof(float) * (size_t)dk);
        const float *q = tok + kh * dk;
#pragma omp simd
        for (int64_t j = 0; j < dk; j++) t->q[i * dk + j] = q[j] * c->scale;
        for (int64_t j = 0; j < dk; j++) t->kt[j * n + i] = t->k[i * dk + j];
        run += c->neg_exp_a[h] * softplus(c->a[row * c->ba_stride + h] + c->dt_bias[h]);
        t->cum[i] = run;
        t->beta[i] = c->gates[(2 * (t0 + i) + 1) * nv + h];
    }
    const float *raw_kk = shared ? shared : t->raw, *raw_qk = raw_kk + n * n;
    if (!shared) {
        gmm(n, n, dk, t->k, dk, t->kt, n, t->raw, n, 1.0f, 0);
        gmm(n, n, dk, t->q, dk, t->kt, n, t->raw + n * n, n, 1.0f, 0);
    }
    const float last = t->cum[n - 1];
    for (int64_t i = 0; i < n; i++) {
        const float ci = t->cum[i], ei = vexpf(ci), bi = t->beta[i] * ei, beta = t->beta[i];
        float *kki = t->kk + i * n, *qki = t->qk + i * n;
        /* the pairs j < i only (a branch-free loop, so it vectorizes); on the diagonal the decay is exp(0) = 1 */
        const float *rk = raw_kk + i * n, *rq = raw_qk + i * n;
#pragma omp simd
        for (int64_t j = 0; j < i; j++) {
            const float decay = vexpf(ci - t->cum[j]);
            kki[j] = beta * rk[j] * decay;
            qki[j] = rq[j] * decay;
        }
        qki[i] = rq[i];
        for (int64_t j = i; j < n; j++) kki[j] = 0.0f;
        for (int64_t j = i + 1; j < n; j++) qki[j] = 0.0f;
#pragma omp simd
        for (int64_t j = 0; j < dk; j++) {
            t->k[i * dk + j] *= bi; /* β e^cum k */
            t->q[i * dk + j] *= ei; /* e^cum q */
        }
    }
    float to_end[GDN_CHUNK];
    for (int64_t j = 0; j < n; j++) to_end[j] = vexpf(last - t->cum[j]);
    for (int64_t p = 0; p < dk; p++) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) t->kt[p * n + j] *= to_end[j]; /* kᵀ decayed to the chunk's end */
    }
}

/* Solves (I + A) X = R in place for X, A [n, n] strictly lower (row stride n), R [n, dv]. Rows in blocks of 4:
 * the earlier rows' terms as one matmul tile (registers, not an axpy per pair through memory), then the block's
 * own 6 pairs. */
static void forward_substitute(const float *a, float *r, int64_t n, int64_t dv) {
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const int64_t rows = n - i0 < 4 ? n - i0 : 4;
        if (i0) gmm(rows, dv, i0, a + i0 * n, n, r, dv, r + i0 * dv, dv, -1.0f, 1);
        for (int64_t i = i0 + 1; i < i0 + rows; i++) {
            float *ri = r + i * dv;
            for (int64_t j = i0; j < i; j++) {
                const float aij = a[i * n + j];
                const float *rj = r + j * dv;
#pragma omp simd
                for (int64_t p = 0; p < dv; p++) ri[p] -= aij * rj[p];
            }
        }
    }
}

/* norm(x) * w * silu(z) over one row of dim, the silu through silu_mul's vector exp. */
static void gated_norm_row(float *restrict x, const float *restrict z, const float *restrict w, int64_t dim,
                           float eps) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < dim; j++) acc += x[j] * x[j];
    const float inv = 1.0f / sqrtf(acc / (float)dim + eps);
#pragma omp simd
    for (int64_t j = 0; j < dim; j++) x[j] = x[j] * inv * w[j];
    silu_mul(x, z, x, dim);
}

/* The checkpoints strictly inside the chunk [t0, t0 + n), v_new in t->r and the chunk's start state in t->state:
 * the state after r tokens is e^cum_r S + Σ_{j<r} e^(cum_r - cum_j) k_j ⊗ v_new_j (v_new_j depends only on earlier
 * tokens), written to the checkpoint's slot. The chunks stay on their grid, so a checkpoint on it is bit for bit
 * the state a prefill of that many tokens ends with (tests/runtime/test_checkpoint_states.py). */
static void inner_checkpoints(const gdn_seq *c, const chunk_tiles *t, int64_t h, int64_t t0, int64_t n) {
    const int64_t dk = c->dk, dv = c->dv, kh = h / c->ratio;
    for (int64_t m = 0; m < c->n_ck; m++) {
        const int64_t r = c->ck_tokens[m] - t0;
        if (c->ck_seq[m] != c->seq || r <= 0 || r >= n) continue;
        const float at = t->cum[r - 1], scale = vexpf(at);
        for (int64_t j = 0; j < r; j++) {
            const float *k = c->act + (t0 - c->act_t0 + j) * c->conv_dim + c->key_dim + kh * dk;
            const float decay = vexpf(at - t->cum[j]);
            for (int64_t p = 0; p < dk; p++) t->kd[p * r + j] = k[p] * decay;
        }
#pragma omp simd
        for (int64_t p = 0; p < dk * dv; p++) t->snap[p] = t->state[p] * scale;
        gmm(dk, dv, r, t->kd, r, t->r, dv, t->snap, dv, 1.0f, 1);
        transpose_heads(c->ssm_pool + c->ck_slots[m] * c->state_size + h * c->head_size, t->snap, 1, dk, dv);
    }
}

/* Tokens [t0, t0 + n) of value head h, its state in t->state: the outputs (gated-normed) and the state after. */
static void chunk_step(const gdn_seq *c, const chunk_tiles *t, int64_t h, int64_t t0, int64_t n, const float *shared) {
    const int64_t dk = c->dk, dv = c->dv, nv = c->nv, ldo = nv * dv;
    /* The gate rows the norm reads last come straight from the projection's output in memory: fetched now, behind
     * the chunk's matmuls, instead of a cache miss per row at the end (the norm's largest cost in a profile). */
    const size_t z_bytes = (c->z ? sizeof(float) : sizeof(uint16_t)) * (size_t)dv;
    for (int64_t i = 0; i < n; i++) {
        const int64_t at = (c->row0 + t0 + i) * c->z_stride + h * dv;
        const char *zr = c->z ? (const char *)(c->z + at) : (const char *)(c->z16 + at);
        for (size_t off = 0; off < z_bytes; off += 64) __builtin_prefetch(zr + off);
    }
    chunk_load(c, t, h, t0, n, shared);
    for (int64_t i = 0; i < n; i++) {
        const float *v = c->act + (t0 - c->act_t0 + i) * c->conv_dim + 2 * c->key_dim + h * dv;
        const float bi = t->beta[i];
#pragma omp simd
        for (int64_t j = 0; j < dv; j++) t->r[i * dv + j] = bi * v[j];
    }
    gmm(n, dv, dk, t->k, dk, t->state, dv, t->r, dv, -1.0f, 1); /* β v - β e^cum k S */
    forward_substitute(t->kk, t->r, n, dv); /* (I + A) v_new = that */
    inner_checkpoints(c, t, h, t0, n);
    float *o = c->out + (c->row0 + t0) * ldo + h * dv;
    gmm(n, dv, dk, t->q, dk, t->state, dv, o, ldo, 1.0f, 0);
    /* qk is lower triangular: rows [i0, i0 + 4) need v_new's first i0 + 4 rows only (half the product) */
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const int64_t rows = n - i0 < 4 ? n - i0 : 4;
        gmm(rows, dv, i0 + rows, t->qk + i0 * n, n, t->r, dv, o + i0 * ldo, ldo, 1.0f, 1);
    }
    const float end = vexpf(t->cum[n - 1]);
    for (int64_t p = 0; p < dk * dv; p++) t->state[p] *= end;
    gmm(dk, dv, n, t->kt, n, t->r, dv, t->state, dv, 1.0f, 1);
    float zrow[512];
    for (int64_t i = 0; i < n; i++) {
        const int64_t at = (c->row0 + t0 + i) * c->z_stride + h * dv;
        const float *z = c->z ? c->z + at : zrow;
        if (!c->z) widen_row(zrow, c->z16, at, dv, 1);
        gated_norm_row(o + i * ldo, z, c->norm_w, dv, c->norm_eps);
    }
}

/* Where the chunk starting at token t0 ends: GDN_CHUNK tokens on, or the sequence's end. */
static int64_t chunk_end(const gdn_seq *c, int64_t t0) { return t0 + GDN_CHUNK < c->len ? t0 + GDN_CHUNK : c->len; }

/* A chunk's tokens [t0, t1) of one sequence, for the per-chunk parallel regions. */
typedef struct {
    const gdn_seq *c;
    int64_t t0, t1;
} chunk_span;

/* Value heads [begin, end) over one chunk, each head's state in its own scratch from the first chunk to the last
 * (read from the pool before the first, written back after the last); the checkpoints at chunk ends. Heads are
 * independent: each writes its own output columns and state slices. */
static void gdn_chunk_heads(void *ctx, int64_t begin, int64_t end) {
    const chunk_span *span = ctx;
    const gdn_seq *c = span->c;
    const int64_t dk = c->dk, dv = c->dv, head_size = c->head_size, t0 = span->t0, t1 = span->t1;
    for (int64_t h = begin; h < end; h++) {
        const chunk_tiles t = carve_tiles(c->work + h * c->work_stride, dk, dv);
        if (t0 == 0 && c->has_prefix)
            transpose_heads(t.state, c->state + h * head_size, 1, dv, dk);
        else if (t0 == 0)
            memset(t.state, 0, sizeof(float) * (size_t)head_size);
        /* the first head of this part that reads the same key head made k.kᵀ and q.kᵀ: they serve this one (the
         * same products whichever head makes them, so the split over threads never changes a bit) */
        const int64_t first = (h / c->ratio) * c->ratio > begin ? (h / c->ratio) * c->ratio : begin;
        chunk_step(c, &t, h, t0, t1 - t0, first < h ? carve_tiles(c->work + first * c->work_stride, dk, dv).raw : NULL);
        for (int64_t m = 0; m < c->n_ck; m++)
            if (c->ck_seq[m] == c->seq && c->ck_tokens[m] == t1)
                transpose_heads(c->ssm_pool + c->ck_slots[m] * c->state_size + h * head_size, t.state, 1, dk, dv);
        if (t1 == c->len) transpose_heads(c->state + h * head_size, t.state, 1, dk, dv);
    }
}

/* The chunk's tokens [t0 + begin, t0 + end) through the short-extend kernel's prologue. */
static void chunk_prologue(void *ctx, int64_t begin, int64_t end) {
    const chunk_span *span = ctx;
    gdn_prologue((void *)span->c, span->t0 + begin, span->t0 + end);
}

/* Chunk by chunk: the chunk's conv, gates and norms of q and k (split by token), then its delta rule for every
 * value head (split by head). A chunk's activations are used while still in cache, not after the whole prompt's
 * (25 MB at 2048 tokens of the real model) went through memory. */
static void gdn_chunked(gdn_seq *c) {
    for (int64_t t0 = 0; t0 < c->len;) {
        c->act_t0 = t0; /* act holds one chunk's rows, reused: they stay in cache, not a fresh 4 MB a layer */
        chunk_span span = {c, t0, chunk_end(c, t0)};
        hp_parallel_for(span.t1 - t0, 8, chunk_prologue, &span);
        hp_parallel_for(c->nv, 1, gdn_chunk_heads, &span);
        t0 = span.t1;
    }
}

/* gdn_short_extend's contract (extend_kernels.c) for any number of new tokens, the recurrence chunked. */
int gdn_chunked_extend(GDN_EXTEND_PARAMS) {
    return gdn_extend_run(GDN_EXTEND_ARGS, gdn_chunked, chunk_work_floats(dk, dv));
}
