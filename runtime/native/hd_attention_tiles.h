/* An extend's attention on AMX tiles for a model whose weights are bf16 (hd_attention.h includes this after its
 * AttnCtx; attend() takes it where attention_tiles says so). Header-only, like the step's other pieces. */
#ifndef HYBRIDCTL_HD_ATTENTION_TILES_H
#define HYBRIDCTL_HD_ATTENTION_TILES_H

/* hd_attention.h's 8-float tiles (attention_chain) are FMA-bound: real Qwen3-Next's warm extend (48 rows x 8 heads
 * over 2000 cached keys, hd 128) spent ~20 ms of CPU in its 4 attention layers on them (16-float registers ran no
 * faster on the development host). For a model whose weights are bf16 (every projection already rounds its input to
 * bf16 on the tiles, amx_gemm.h) the scores and P V run on the tiles: per KV head, S = Q K^T with q and K rounded to bf16, the causal
 * softmax in fp32, then O = P V with P and V rounded to bf16, fp32 sums (transformers' bf16 reference holds q, k, v
 * and P in bf16 too). One layer at that shape, one thread: 3.6 vs 7.2 ms (tests/runtime/native_attention_probe.c);
 * in the forward ~14.5 vs ~20 ms of CPU for the 4 layers. Each element is computed from its own rows whichever unit
 * or thread runs it, so results stay bit-identical under any thread count; fp32 models keep the FMA tiles and
 * their bits. */
#ifdef AG_AMX
/* x[0..32) rounded to bf16 (nearest even) at dst. */
static inline void bf16_32(const float *x, void *dst) {
    _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x)));
}

/* C[0..16) x [0..16*nc) = sum over k of A's 16x32 bf16 tile k times B's tile k of each of nc (1-4) column blocks:
 * A's tile k starts 64 bytes after tile k-1, B's 16 rows (of b_stride bytes) later, a column block 64 bytes after
 * the last; the scores (Q K^T) and P V share it. Tile numbers must be constants, hence the unrolled blocks. */
static inline void tiles_row_of_4(const char *A, int64_t a_stride, const char *B, int64_t b_stride, int64_t ksteps,
                                  int64_t nc, float *C, int64_t c_stride) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < ksteps; k++) {
        _tile_loadd(4, A + k * 64, a_stride);
        const char *b = B + k * 16 * b_stride;
        _tile_loadd(5, b, b_stride);
        _tile_dpbf16ps(0, 4, 5);
        if (nc > 1) {
            _tile_loadd(5, b + 64, b_stride);
            _tile_dpbf16ps(1, 4, 5);
        }
        if (nc > 2) {
            _tile_loadd(5, b + 128, b_stride);
            _tile_dpbf16ps(2, 4, 5);
        }
        if (nc > 3) {
            _tile_loadd(5, b + 192, b_stride);
            _tile_dpbf16ps(3, 4, 5);
        }
    }
    _tile_stored(0, C, c_stride);
    if (nc > 1) _tile_stored(1, C + 16, c_stride);
    if (nc > 2) _tile_stored(2, C + 32, c_stride);
    if (nc > 3) _tile_stored(3, C + 48, c_stride);
}

static inline int attention_tiles(const HDLayer *L, const HDStep *s) {
    return s->chain && L->wq.dtype == HD_BF16 && L->hd % 32 == 0 && ag_ready();
}

/* Units (KV head g, 32 span positions): keys to kt [hd/2][sp] of bf16 pairs (row p: dims 2p, 2p+1 of every key;
 * the scores' B tiles) and values to vv [sp/2][hd] of bf16 pairs (row p: keys 2p, 2p+1 of every dim; P V's B
 * tiles), rounded to nearest even; the padding past the span zeroed. Both layouts are interleaves done in
 * registers: written 2 bytes (values) or 4 bytes (keys) at a time they were ~60 % of this pass's CPU. */
static void attention_tiles_convert(void *ctx, int64_t begin, int64_t end) {
    AttnCtx *a = ctx;
    const HDLayer *L = a->L;
    const HDStep *s = a->s;
    const int64_t hd = L->hd, kvw = L->nkv * hd, span = s->kv_offsets[s->batch], sp = a->sp, blocks = sp / 32;
    const float *kp = s->k_pool[L->ordinal], *vp = s->v_pool[L->ordinal];
    /* Pair j of 32 from two 32-value rows x and y: x[j / 2] at even j, y[j / 2] at odd (16-bit lanes). */
    const __m512i lo_pairs = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                              38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_pairs = _mm512_add_epi16(lo_pairs, _mm512_set1_epi16(16));
    /* A 16 x 16 transpose of 32-bit lanes: gather key i's pair p from rows of 64 pairs. */
    const __m512i key_rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                _mm512_set1_epi32(64));
    uint32_t kloc[32 * 64] __attribute__((aligned(64))); /* 32 keys' bf16 pairs, key-major, 128 dims at a time */
    for (int64_t u = begin; u < end; u++) {
        const int64_t g = u / blocks, t0 = (u % blocks) * 32;
        uint32_t *kt = (uint32_t *)a->kt + g * hd / 2 * sp;
        uint16_t *vv = a->vv + g * sp * hd;
        for (int64_t t = t0; t < t0 + 32; t += 2) { /* keys t, t + 1: one pair row of vv */
            const float *v0 = t < span ? vp + s->kv_flat[t] * kvw + g * hd : NULL;
            const float *v1 = t + 1 < span ? vp + s->kv_flat[t + 1] * kvw + g * hd : NULL;
            uint16_t *row = vv + (t / 2) * 2 * hd;
            for (int64_t d = 0; d < hd; d += 32) {
                const __m512i x = v0 ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(v0 + d + 16), _mm512_loadu_ps(v0 + d))
                                     : _mm512_setzero_si512();
                const __m512i y = v1 ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(v1 + d + 16), _mm512_loadu_ps(v1 + d))
                                     : _mm512_setzero_si512();
                _mm512_storeu_si512(row + 2 * d, _mm512_permutex2var_epi16(x, lo_pairs, y));
                _mm512_storeu_si512(row + 2 * d + 32, _mm512_permutex2var_epi16(x, hi_pairs, y));
            }
        }
        /* Keys: converted into kloc, then written pair row by pair row (kt's rows are sp apart: written key by
         * key, every store would land on a line of its own) */
        for (int64_t d0 = 0; d0 < hd; d0 += 128) {
            const int64_t w = min64(128, hd - d0);
            for (int64_t i = 0; i < 32; i++) {
                const int64_t t = t0 + i;
                if (t >= span) {
                    memset(kloc + i * 64, 0, 256);
                    continue;
                }
                const float *kr = kp + s->kv_flat[t] * kvw + g * hd + d0;
                for (int64_t d = 0; d < w; d += 32)
                    bf16_32(kr + d, kloc + i * 64 + d / 2);
            }
            for (int64_t p = 0; p < w / 2; p++) {
                uint32_t *dst = kt + (d0 / 2 + p) * sp + t0;
                _mm512_storeu_si512(dst, _mm512_i32gather_epi32(key_rows, (const int *)(kloc + p), 4));
                _mm512_storeu_si512(dst + 16, _mm512_i32gather_epi32(key_rows, (const int *)(kloc + 16 * 64 + p), 4));
            }
        }
    }
}

/* Units (KV head g, block of 16 rows of its group; row r: query head g * group + r / B, token r % B): S = Q K^T
 * (C tiles of 16 rows x 16 keys), the causal softmax in fp32 with P rounded to bf16, O = P V (C tiles of 16 rows x
 * 16 dims), the gate. Tiles 0-3: C; 4: A; 5: B; all 16 rows of 64 bytes. */
static void attention_tiles_rows(void *ctx, int64_t begin, int64_t end) {
    AttnCtx *a = ctx;
    const HDLayer *L = a->L;
    const HDStep *s = a->s;
    const int64_t hd = L->hd, nh = L->nh, group = nh / L->nkv, B = s->batch, R = group * B, sp = a->sp;
    const int64_t qw = nh * hd * (L->out_gate ? 2 : 1), qstride = L->out_gate ? 2 * hd : hd;
    const int64_t blocks = (R + 15) / 16;
    const float scale = (float)L->attn_scale;
    float *S = a->scores + atomic_fetch_add(&a->next_slot, 1) * a->part; /* [16, sp] */
    float *O = S + 16 * sp; /* [16, hd] */
    uint16_t *Qb = (uint16_t *)(O + 16 * hd), *Pb = Qb + 16 * hd; /* [16, hd], [16, sp] */
    float inv[16];
    ag_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
    for (int64_t u = begin; u < end; u++) {
        if (a->ffn_hidden > 0) hd_prefetch_ffn(L, a->ffn_hidden, u, L->nkv * blocks);
        const int64_t g = u / blocks, r0 = (u % blocks) * 16, rows = min64(16, R - r0);
        const uint32_t *kt = (const uint32_t *)a->kt + g * hd / 2 * sp;
        const uint16_t *vv = a->vv + g * sp * hd;
        int64_t nt = 0;
        for (int64_t i = 0; i < 16; i++) {
            if (i >= rows) {
                memset(Qb + i * hd, 0, (size_t)hd * 2);
                continue;
            }
            const int64_t r = r0 + i, b = r % B, h = g * group + r / B;
            const float *src = a->q + b * qw + h * qstride;
            for (int64_t d = 0; d < hd; d += 32) {
                const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(src + d), _mm512_set1_ps(scale));
                const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(src + d + 16), _mm512_set1_ps(scale));
                _mm512_storeu_si512(Qb + i * hd + d, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            }
            nt = max64(nt, s->kv_offsets[b + 1]);
        }
        const int64_t nt16 = (nt + 15) / 16 * 16, nt32 = (nt + 31) / 32 * 32;
        for (int64_t t0 = 0; t0 < nt16; t0 += 64) {
            tiles_row_of_4((const char *)Qb, hd * 2, (const char *)(kt + t0), sp * 4, hd / 32,
                           min64(4, (nt16 - t0) / 16), S + t0, sp * 4);
        }
        for (int64_t i = 0; i < 16; i++) {
            float *row = S + i * sp;
            uint16_t *prow = Pb + i * sp;
            const int64_t n = i < rows ? s->kv_offsets[(r0 + i) % B + 1] : 0;
            __m512 m16 = _mm512_set1_ps(-INFINITY); /* a max: the same whatever the order */
            int64_t t = 0;
            for (; t + 16 <= n; t += 16) m16 = _mm512_max_ps(m16, _mm512_loadu_ps(row + t));
            float mx = _mm512_reduce_max_ps(m16), sum = 0.0f;
            for (; t < n; t++) mx = row[t] > mx ? row[t] : mx;
            t = 0;
#ifdef HYBRIDCTL_VEXP256
            __m256 acc = _mm256_setzero_ps();
            for (const __m256 m8 = _mm256_set1_ps(mx); t + 8 <= n; t += 8) {
                const __m256 e = vexp256(_mm256_sub_ps(_mm256_loadu_ps(row + t), m8));
                _mm256_storeu_ps(row + t, e);
                acc = _mm256_add_ps(acc, e);
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, acc);
            for (int k = 0; k < 8; k++) sum += lanes[k];
#endif
            for (; t < n; t++) sum += row[t] = vexpf(row[t] - mx);
            for (t = n; t < nt32; t++) row[t] = 0.0f; /* past the row's causal span, and the padding */
            inv[i] = n > 0 ? 1.0f / sum : 0.0f;
            for (t = 0; t < nt32; t += 32)
                bf16_32(row + t, prow + t);
        }
        for (int64_t d0 = 0; d0 < hd; d0 += 64) {
            tiles_row_of_4((const char *)Pb, sp * 2, (const char *)(vv + 2 * d0), hd * 4, nt32 / 32,
                           min64(4, (hd - d0) / 16), O + d0, hd * 4);
        }
        for (int64_t i = 0; i < rows; i++) {
            const int64_t r = r0 + i, b = r % B, h = g * group + r / B;
            float *oh = a->o + b * nh * hd + h * hd;
            const float *gate = a->q + b * qw + h * qstride + hd;
            for (int64_t d = 0; d < hd; d++) {
                const float x = O[i * hd + d] * inv[i];
                oh[d] = L->out_gate ? x * sigmoidf_(gate[d]) : x;
            }
        }
    }
    _tile_release();
}
#endif

#endif
