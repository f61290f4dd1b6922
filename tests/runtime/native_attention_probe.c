/* A probe of runtime/native/hd_attention.h for tests/runtime/test_native_attention.py: the step's attention
 * (`attend`) by itself, over pools and queries the test makes, with the scratch sized as hd_decode sizes it. */
#include "../../runtime/native/hd_attention.h"

#include <stdint.h>
#include <stdlib.h>

void probe_set_threads(int n) { hp_set_threads(n); }

int probe_attend_as(int64_t nh, int64_t nkv, int64_t hd, int64_t out_gate, double scale, int64_t chain, int64_t B,
                    const int64_t *kv_offsets, const int64_t *kv_flat, float *k_pool, float *v_pool, const float *q,
                    float *o, int64_t dtype);

/* chain 1: the B rows are one sequence's new tokens (row b attends to kv_flat[0 .. kv_offsets[b + 1])); chain 0:
 * B sequences of one token each (row b: kv_flat[kv_offsets[b] .. kv_offsets[b + 1])). Pools [slots, nkv, hd]; q
 * [B, nh * hd * (1 + out_gate)] (each head's query, then its gate); o [B, nh * hd]. Returns 0, or 4 without
 * memory. */
int probe_attend(int64_t nh, int64_t nkv, int64_t hd, int64_t out_gate, double scale, int64_t chain, int64_t B,
                 const int64_t *kv_offsets, const int64_t *kv_flat, float *k_pool, float *v_pool, const float *q,
                 float *o) {
    return probe_attend_as(nh, nkv, hd, out_gate, scale, chain, B, kv_offsets, kv_flat, k_pool, v_pool, q, o, HD_F32);
}

/* As probe_attend, for a layer whose weights are in `dtype` (HD_BF16: an extend takes the AMX tiles where the host
 * has them, attention_tiles). */
int probe_attend_as(int64_t nh, int64_t nkv, int64_t hd, int64_t out_gate, double scale, int64_t chain, int64_t B,
                    const int64_t *kv_offsets, const int64_t *kv_flat, float *k_pool, float *v_pool, const float *q,
                    float *o, int64_t dtype) {
    HDLayer L = {0};
    L.wq.dtype = dtype;
    L.kind = 1, L.nh = nh, L.nkv = nkv, L.hd = hd, L.out_gate = out_gate, L.attn_scale = scale;
    float *kpa[1] = {k_pool}, *vpa[1] = {v_pool};
    HDStep s = {0};
    s.batch = B, s.kv_offsets = kv_offsets, s.kv_flat = kv_flat, s.k_pool = kpa, s.v_pool = vpa, s.chain = chain;
    HDModel m = {0};
    m.n_layers = 1, m.layers = &L;
    int64_t max_kv = 1;
    for (int64_t b = 0; b < B; b++) {
        int64_t n;
        hd_kv_span(&s, b, &n);
        max_kv = max64(max_kv, n);
    }
    const int64_t slots = hp_threads(), part = attention_part(&m, &s, max_kv), shared = attention_shared(&m, &s);
    float *scores = malloc((size_t)(shared + slots * part) * sizeof(float));
    if (!scores) return HD_NO_MEMORY;
    attend(&L, &s, q, o, scores, shared, part, slots, 0);
    free(scores);
    return HD_OK;
}
