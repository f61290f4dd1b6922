/* Causal fp32 attention for long extends (runtime/native/flash_attention.py): a prefill's rows, or an extend's rows
 * after a cached prefix, over all their keys in one call, with the output gate (Qwen3-Next) applied on the way out.
 *
 * torch's flash kernel (SDPA) ran the peer model's two attention layers of a 2048-token prefill in ~24 ms on 2 cores,
 * and around it the q transposes, GQA's expanded K/V and the gate's sigmoid and product cost a few ms more.
 *
 * A unit is one KV head g and a block of query rows of its group: FA_LANES lanes, lane r = query head
 * g * group + r / bq, token tok0 + r % bq (bq = FA_LANES / group), so every K and V row a unit reads serves all the
 * group's heads. Rows are the vector lanes throughout: queries kept transposed (QT [hd][lanes], scaled), scores
 * key-major (ST [key][lanes]), outputs transposed (OT [dv][lanes]); the scores are broadcast-key FMAs, the online
 * softmax's max and sum run down the keys (no horizontal reductions), P V is broadcast-value FMAs. Keys come in
 * blocks of FA_KEYS: only the blocks that cross a lane's causal limit are masked, none past the unit's last row is
 * read. Each output is one fixed sequence of operations whatever thread runs its unit: any thread count gives the
 * same bits.
 *
 * Layouts (fp32, checked by the wrapper): q [T, hq, hd] (token rows q_rs apart, heads q_hs apart); k [N, hkv, hd],
 * v [N, hkv, dv] (token rows k_rs / v_rs apart, heads contiguous); gate NULL or [T, hq, dv] like q; out [T, hq, dv]
 * contiguous. The T queries are the last T of the N keys' positions: query i sees keys 0 .. N - T + i. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "vexp.h"

#define FA_LANES 32
#define FA_KEYS 64

typedef struct {
    int64_t T, N, hq, hkv, hd, dv, group, bq, qblocks;
    const float *q, *k, *v, *gate;
    int64_t q_rs, q_hs, k_rs, v_rs, g_rs, g_hs;
    float *out;
    float scale;
} FACtx;

#if defined(__AVX512F__)
#include <immintrin.h>
#define FA_AVX512 1
/* vexp512, 0 below -87.3 (a masked score is -inf: its weight must be exactly 0). */
static inline __m512 fa_exp(__m512 x) {
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
    return _mm512_maskz_mov_ps(live, vexp512(x));
}

/* ST[t][lanes] = sum over d of K_t[d] * QT[d][lanes] for t < nk; key t's row at k + t * k_rs. */
static void fa_scores(const float *QT, int64_t hd, const float *k, int64_t k_rs, int64_t nk, float *ST) {
    int64_t t = 0;
    for (; t + 8 <= nk; t += 8) {
        const float *kt = k + t * k_rs;
        __m512 a0[8], a1[8];
        for (int j = 0; j < 8; j++) a0[j] = a1[j] = _mm512_setzero_ps();
        for (int64_t d = 0; d < hd; d++) {
            const __m512 q0 = _mm512_loadu_ps(QT + d * FA_LANES), q1 = _mm512_loadu_ps(QT + d * FA_LANES + 16);
            for (int j = 0; j < 8; j++) {
                const __m512 kb = _mm512_set1_ps(kt[j * k_rs + d]);
                a0[j] = _mm512_fmadd_ps(kb, q0, a0[j]);
                a1[j] = _mm512_fmadd_ps(kb, q1, a1[j]);
            }
        }
        for (int j = 0; j < 8; j++) {
            _mm512_storeu_ps(ST + (t + j) * FA_LANES, a0[j]);
            _mm512_storeu_ps(ST + (t + j) * FA_LANES + 16, a1[j]);
        }
    }
    for (; t < nk; t++) {
        const float *kt = k + t * k_rs;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0;
        for (int64_t d = 0; d < hd; d++) {
            const __m512 kb = _mm512_set1_ps(kt[d]);
            a0 = _mm512_fmadd_ps(kb, _mm512_loadu_ps(QT + d * FA_LANES), a0);
            a1 = _mm512_fmadd_ps(kb, _mm512_loadu_ps(QT + d * FA_LANES + 16), a1);
        }
        _mm512_storeu_ps(ST + t * FA_LANES, a0);
        _mm512_storeu_ps(ST + t * FA_LANES + 16, a1);
    }
}

/* The block's online-softmax step: scores of keys kb0 + t at or past a lane's limit masked (when `masked`), the
 * running max m and sum l updated, ST turned into the weights exp(s - m) and alpha (the old sums' factor) returned. */
static void fa_softmax(float *ST, int64_t nk, int64_t kb0, int masked, const int32_t *limit, float *m, float *l,
                       float *alpha) {
    for (int h = 0; h < FA_LANES; h += 16) {
        const __m512i lim = _mm512_loadu_si512(limit + h);
        __m512 bm = _mm512_set1_ps(-INFINITY);
        for (int64_t t = 0; t < nk; t++) {
            __m512 s = _mm512_loadu_ps(ST + t * FA_LANES + h);
            if (masked) {
                const __mmask16 out = _mm512_cmp_epi32_mask(_mm512_set1_epi32((int32_t)(kb0 + t)), lim, _MM_CMPINT_NLT);
                s = _mm512_mask_blend_ps(out, s, _mm512_set1_ps(-INFINITY));
                _mm512_storeu_ps(ST + t * FA_LANES + h, s);
            }
            bm = _mm512_max_ps(bm, s);
        }
        const __m512 mo = _mm512_loadu_ps(m + h), mn = _mm512_max_ps(mo, bm);
        const __m512 a = fa_exp(_mm512_sub_ps(mo, mn)); /* 0 at the first block (m = -inf) */
        __m512 sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < nk; t++) {
            const __m512 p = fa_exp(_mm512_sub_ps(_mm512_loadu_ps(ST + t * FA_LANES + h), mn));
            _mm512_storeu_ps(ST + t * FA_LANES + h, p);
            sum = _mm512_add_ps(sum, p);
        }
        _mm512_storeu_ps(m + h, mn);
        _mm512_storeu_ps(l + h, _mm512_fmadd_ps(_mm512_loadu_ps(l + h), a, sum));
        _mm512_storeu_ps(alpha + h, a);
    }
}

/* OT[d][lanes] = alpha * OT[d][lanes] + sum over t < nk of P[t][lanes] * V_t[d]; value t's row at v + t * v_rs. */
static void fa_pv(const float *P, const float *alpha, const float *v, int64_t v_rs, int64_t nk, int64_t dv, float *OT) {
    const __m512 al0 = _mm512_loadu_ps(alpha), al1 = _mm512_loadu_ps(alpha + 16);
    for (int64_t d0 = 0; d0 < dv; d0 += 8) {
        __m512 a0[8], a1[8];
        for (int j = 0; j < 8; j++) {
            a0[j] = _mm512_mul_ps(_mm512_loadu_ps(OT + (d0 + j) * FA_LANES), al0);
            a1[j] = _mm512_mul_ps(_mm512_loadu_ps(OT + (d0 + j) * FA_LANES + 16), al1);
        }
        for (int64_t t = 0; t < nk; t++) {
            const __m512 p0 = _mm512_loadu_ps(P + t * FA_LANES), p1 = _mm512_loadu_ps(P + t * FA_LANES + 16);
            const float *vt = v + t * v_rs + d0;
            for (int j = 0; j < 8; j++) {
                const __m512 vb = _mm512_set1_ps(vt[j]);
                a0[j] = _mm512_fmadd_ps(vb, p0, a0[j]);
                a1[j] = _mm512_fmadd_ps(vb, p1, a1[j]);
            }
        }
        for (int j = 0; j < 8; j++) {
            _mm512_storeu_ps(OT + (d0 + j) * FA_LANES, a0[j]);
            _mm512_storeu_ps(OT + (d0 + j) * FA_LANES + 16, a1[j]);
        }
    }
}
#else
/* Plain C: the same steps lane by lane (the compiler vectorizes the lane loops). */
static void fa_scores(const float *QT, int64_t hd, const float *k, int64_t k_rs, int64_t nk, float *ST) {
    for (int64_t t = 0; t < nk; t++) {
        float acc[FA_LANES] = {0};
        for (int64_t d = 0; d < hd; d++) {
            const float kd = k[t * k_rs + d];
#pragma omp simd
            for (int i = 0; i < FA_LANES; i++) acc[i] = fmaf(kd, QT[d * FA_LANES + i], acc[i]);
        }
        memcpy(ST + t * FA_LANES, acc, sizeof acc);
    }
}

static void fa_softmax(float *ST, int64_t nk, int64_t kb0, int masked, const int32_t *limit, float *m, float *l,
                       float *alpha) {
    for (int i = 0; i < FA_LANES; i++) {
        float bm = -INFINITY;
        for (int64_t t = 0; t < nk; t++) {
            float *s = ST + t * FA_LANES + i;
            if (masked && kb0 + t >= limit[i]) *s = -INFINITY;
            bm = *s > bm ? *s : bm;
        }
        const float mn = m[i] > bm ? m[i] : bm;
        const float a = m[i] == -INFINITY ? 0.0f : vexpf(m[i] - mn);
        float sum = 0.0f;
        for (int64_t t = 0; t < nk; t++) {
            float *s = ST + t * FA_LANES + i;
            *s = *s == -INFINITY ? 0.0f : vexpf(*s - mn);
            sum += *s;
        }
        m[i] = mn;
        l[i] = l[i] * a + sum;
        alpha[i] = a;
    }
}

static void fa_pv(const float *P, const float *alpha, const float *v, int64_t v_rs, int64_t nk, int64_t dv, float *OT) {
    for (int64_t d = 0; d < dv; d++) {
        float acc[FA_LANES];
        for (int i = 0; i < FA_LANES; i++) acc[i] = OT[d * FA_LANES + i] * alpha[i];
        for (int64_t t = 0; t < nk; t++) {
            const float vd = v[t * v_rs + d];
#pragma omp simd
            for (int i = 0; i < FA_LANES; i++) acc[i] = fmaf(vd, P[t * FA_LANES + i], acc[i]);
        }
        memcpy(OT + d * FA_LANES, acc, sizeof acc);
    }
}
#endif

/* o[d] *= sigmoid(gate[d]), 16 lanes at a time where AVX-512 is (libm's scalar expf per element cost about as
 * much as torch's sigmoid and product together). */
static void fa_gate(float *o, const float *gate, int64_t dv) {
    int64_t d = 0;
#ifdef FA_AVX512
    for (; d + 16 <= dv; d += 16) {
        const __m512 e = fa_exp(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(gate + d)));
        const __m512 s = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), s));
    }
#endif
    for (; d < dv; d++) o[d] *= 1.0f / (1.0f + expf(-gate[d]));
}

/* Units u: KV head u % hkv, query block zigzag(u / hkv) (0, last, 1, last - 1, ...), so the pool's contiguous
 * halves of the units get equal causal work. */
static void fa_units(void *ctx, int64_t begin, int64_t end) {
    const FACtx *c = ctx;
    const int64_t hd = c->hd, dv = c->dv, P = c->N - c->T;
    float *QT = aligned_alloc(64, (size_t)((hd + dv + FA_KEYS) * FA_LANES) * sizeof(float));
    if (QT == NULL) abort(); /* a few KB: nothing sensible to fall back to inside a worker */
    float *OT = QT + hd * FA_LANES, *ST = OT + dv * FA_LANES;
    float m[FA_LANES], l[FA_LANES], alpha[FA_LANES];
    int32_t limit[FA_LANES];
    for (int64_t u = begin; u < end; u++) {
        const int64_t g = u % c->hkv, j = u / c->hkv;
        const int64_t qb = (j % 2 == 0) ? j / 2 : c->qblocks - 1 - j / 2;
        const int64_t tok0 = qb * c->bq, tok_end = tok0 + c->bq < c->T ? tok0 + c->bq : c->T;
        const int64_t kend = P + tok_end, kfull = P + tok0 + 1; /* all lanes need keys < kfull */
        for (int r = 0; r < FA_LANES; r++) {
            const int64_t h = g * c->group + r / c->bq, i = tok0 + r % c->bq;
            const int live = r < c->group * c->bq && i < c->T;
            /* a dead lane (past the group's rows or the last token) scores 0 against every key: finite, unused */
            limit[r] = (int32_t)(live ? P + i + 1 : kend);
            if (live) {
                const float *qr = c->q + i * c->q_rs + h * c->q_hs;
                for (int64_t d = 0; d < hd; d++) QT[d * FA_LANES + r] = qr[d] * c->scale;
            } else {
                for (int64_t d = 0; d < hd; d++) QT[d * FA_LANES + r] = 0.0f;
            }
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        memset(OT, 0, (size_t)(dv * FA_LANES) * sizeof(float));
        for (int64_t kb0 = 0; kb0 < kend; kb0 += FA_KEYS) {
            const int64_t nk = kend - kb0 < FA_KEYS ? kend - kb0 : FA_KEYS;
            fa_scores(QT, hd, c->k + kb0 * c->k_rs + g * hd, c->k_rs, nk, ST);
            fa_softmax(ST, nk, kb0, kb0 + nk > kfull, limit, m, l, alpha);
            fa_pv(ST, alpha, c->v + kb0 * c->v_rs + g * dv, c->v_rs, nk, dv, OT);
        }
        for (int r = 0; r < c->group * c->bq; r++) {
            const int64_t h = g * c->group + r / c->bq, i = tok0 + r % c->bq;
            if (i >= c->T) continue;
            float *o = c->out + (i * c->hq + h) * dv;
            const float inv = 1.0f / l[r];
            for (int64_t d = 0; d < dv; d++) o[d] = OT[d * FA_LANES + r] * inv;
            if (c->gate) fa_gate(o, c->gate + i * c->g_rs + h * c->g_hs, dv);
        }
    }
    free(QT);
}

/* Returns 0, or -1 when the shapes are outside what the units take (the wrapper checks them first). */
int flash_attention_fp32(int64_t T, int64_t N, int64_t hq, int64_t hkv, int64_t hd, int64_t dv, const float *q,
                         int64_t q_rs, int64_t q_hs, const float *k, int64_t k_rs, const float *v, int64_t v_rs,
                         const float *gate, int64_t g_rs, int64_t g_hs, float scale, float *out) {
    if (T < 1 || N < T || hkv < 1 || hq % hkv != 0 || hq / hkv > FA_LANES || hd % 8 != 0 || dv % 8 != 0 ||
        N > INT32_MAX)
        return -1;
    FACtx c = {.T = T, .N = N, .hq = hq, .hkv = hkv, .hd = hd, .dv = dv, .group = hq / hkv, .q = q, .k = k,
               .v = v, .gate = gate, .q_rs = q_rs, .q_hs = q_hs, .k_rs = k_rs, .v_rs = v_rs, .g_rs = g_rs,
               .g_hs = g_hs, .out = out, .scale = scale};
    c.bq = FA_LANES / c.group;
    c.qblocks = (T + c.bq - 1) / c.bq;
    hp_parallel_for(hkv * c.qblocks, 1, fa_units, &c);
    return 0;
}

/* ---- the queries' and keys' prologue: per-head RMSNorm, then RoPE on the first rd channels ----
 * torch ran it as ~13 dispatched passes over q and k (the norm's pow, mean, add, rsqrt and two products; the partial
 * RoPE's slices, roll, products, sum and cat): ~6 ms of CPU a layer for the peer model's 2048-token prefill. */
typedef struct {
    int64_t heads, dim, rd, x_rs, x_hs;
    const float *x, *w, *cs, *sn;
    float eps;
    float *out;
} NRCtx;

static void nr_rows(void *ctx, int64_t begin, int64_t end) {
    const NRCtx *c = ctx;
    const int64_t dim = c->dim, half = c->rd / 2;
    for (int64_t t = begin; t < end; t++)
        for (int64_t h = 0; h < c->heads; h++) {
            const float *xr = c->x + t * c->x_rs + h * c->x_hs;
            float *o = c->out + (t * c->heads + h) * dim;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t j = 0; j < dim; j++) acc += xr[j] * xr[j];
            const float inv = 1.0f / sqrtf(acc / (float)dim + c->eps);
#pragma omp simd
            for (int64_t j = 0; j < dim; j++) o[j] = xr[j] * inv * c->w[j];
            if (half == 0) continue;
            /* rotary.py's tables: cos, and sin with its first half negated (so both halves are a sum) */
            const float *cs = c->cs + t * c->rd, *sn = c->sn + t * c->rd;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float a = o[i], b = o[i + half];
                o[i] = a * cs[i] + b * sn[i];
                o[i + half] = b * cs[i + half] + a * sn[i + half];
            }
        }
}

/* out [T, heads, dim] (contiguous) = RoPE(RMSNorm(x) * w) of x [T, heads, dim] (token rows x_rs apart, heads x_hs
 * apart); cs, sn [T, rd] (rd even, <= dim; 0: no RoPE, cs and sn unused). */
int norm_rope_rows(int64_t T, int64_t heads, int64_t dim, const float *x, int64_t x_rs, int64_t x_hs, const float *w,
                   float eps, const float *cs, const float *sn, int64_t rd, float *out) {
    if (rd < 0 || rd % 2 != 0 || rd > dim) return -1;
    NRCtx c = {.heads = heads, .dim = dim, .rd = rd, .x_rs = x_rs, .x_hs = x_hs, .x = x, .w = w, .cs = cs, .sn = sn,
               .eps = eps, .out = out};
    hp_parallel_for(T, 64, nr_rows, &c);
    return 0;
}
