/* The depthwise causal conv of the native step's recurrent mixers (hd_deltanet.h, hd_mamba2.h): one new input per
 * channel against the conv window kept in the conv pool ([slot, channels, kernel - 1], the torch path's layout,
 * runtime/models/layers/conv.py), then silu. */
#ifndef HYBRIDCTL_HD_CONV_H
#define HYBRIDCTL_HD_CONV_H

#include "hd_model.h"
#include "vexp.h"

#include <stdint.h>

/* Depthwise causal conv over [state, x] for channels [c0, c1) of one sequence (the taps in window order, then the
 * bias), then silu (vectorised after the channel loop: libm's expf per channel was a third of this function); the
 * state rolls by one. */
static void conv_channels(const HDLayer *L, float *mx, float *cs, int64_t c0, int64_t c1) {
    const int64_t width = L->kernel - 1;
    if (width == 3) {
        /* The models' kernel 4, the same sums in the same order, as one loop the compiler vectorises (the
         * general loop below ran scalar: ~5 % of an extend's CPU). */
        const float *w = L->conv_w, *bias = L->conv_b;
#pragma omp simd
        for (int64_t c = c0; c < c1; c++) {
            float *st = cs + c * 3;
            const float xv = mx[c], s0 = st[0], s1 = st[1], s2 = st[2];
            float acc = 0.0f;
            acc += s0 * w[c * 4];
            acc += s1 * w[c * 4 + 1];
            acc += s2 * w[c * 4 + 2];
            acc += xv * w[c * 4 + 3];
            if (bias) acc += bias[c];
            st[0] = s1, st[1] = s2, st[2] = xv;
            mx[c] = acc;
        }
        silu_inplace(mx + c0, c1 - c0);
        return;
    }
    for (int64_t c = c0; c < c1; c++) {
        float *st = cs + c * width;
        const float *w = L->conv_w + c * L->kernel;
        const float xv = mx[c];
        float acc = 0.0f;
        for (int64_t t = 0; t < width; t++) acc += st[t] * w[t];
        acc += xv * w[width];
        if (L->conv_b) acc += L->conv_b[c];
        for (int64_t t = 0; t + 1 < width; t++) st[t] = st[t + 1];
        if (width > 0) st[width - 1] = xv;
        mx[c] = acc;
    }
    silu_inplace(mx + c0, c1 - c0);
}

#endif
