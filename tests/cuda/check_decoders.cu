/* The CUDA backend's block decoders (backend/cuda/dequant.cuh, deq<TYPE>::get, compiled for the
 * host as well) against the CPU reference decoder (quant's em_dequantize) on rows quantized by
 * quant's reference quantizers: every group of every block, every element. Needs no GPU: it runs
 * wherever nvcc builds the CUDA backend (tests/cuda/run.sh runs it first).
 * Usage: check_decoders; prints one line per type and exits 1 on any difference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/internal.cuh"
#include "backend/cuda/dequant.cuh"
#include "quant/quant.h"

/* The decoders' result for group g against the reference's 8 elements there. The float decoders
 * do the reference's arithmetic in the same order, so any difference is a layout error. */
template <int TYPE> static int check_type(const char *name, uint32_t cols, uint32_t rows) {
    uint64_t row_bytes;
    if (em_type_row_bytes(TYPE, cols, &row_bytes)) return fprintf(stderr, "%s: row bytes\n", name), 1;
    float *in = (float *)malloc(sizeof(float) * cols * rows), *want = (float *)malloc(sizeof(float) * cols * rows);
    uint8_t *blocks = (uint8_t *)malloc(row_bytes * rows);
    if (!in || !want || !blocks) return fprintf(stderr, "out of memory\n"), 1;
    uint64_t state = 0x9E3779B97F4A7C15ull ^ (uint64_t)TYPE;
    for (uint64_t i = 0; i < (uint64_t)cols * rows; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        /* rows of different scales, with outliers, so every scale and level is exercised */
        const float u = (float)((state >> 40) & 0xffffff) / 16777216.0f - 0.5f;
        in[i] = u * (1.0f + (float)(i / cols)) * ((state >> 20) % 97 == 0 ? 8.0f : 1.0f);
    }
    int bad = 0;
    double worst = 0;
    for (uint32_t r = 0; r < rows && !bad; r++) {
        uint8_t *row = blocks + r * row_bytes;
        if (em_quantize(TYPE, in + (uint64_t)r * cols, row, cols) || em_dequantize(TYPE, row, want + (uint64_t)r * cols, cols))
            return fprintf(stderr, "%s: reference quantizer or decoder failed\n", name), 1;
        for (uint32_t g = 0; g < cols / 8; g++) {
            float v[8];
            deq<TYPE>::get(row, g, v);
            for (int i = 0; i < 8; i++) {
                const float w = want[(uint64_t)r * cols + 8 * g + i];
                const double diff = fabs((double)v[i] - w);
                if (diff > worst) worst = diff;
                if (diff > 1e-6 * (1.0 + fabs(w))) {
                    fprintf(stderr, "%s: row %u element %u: device decoder %.9g, reference %.9g\n", name, r, 8 * g + i,
                            v[i], w);
                    bad = 1;
                    break;
                }
            }
            if (bad) break;
        }
    }
    printf("%-7s %u rows of %u: largest difference %.3g  %s\n", name, rows, cols, worst, bad ? "FAIL" : "PASS");
    free(in), free(want), free(blocks);
    return bad;
}

int main(void) {
    int failed = 0;
    failed += check_type<EM_TYPE_Q8_0>("q8_0", 1024, 16);
    failed += check_type<EM_TYPE_Q4_K>("q4_k", 1024, 16);
    failed += check_type<EM_TYPE_Q5_K>("q5_k", 1024, 16);
    failed += check_type<EM_TYPE_Q3_K>("q3_k", 1024, 16);
    failed += check_type<EM_TYPE_Q2_K>("q2_k", 1024, 16);
    failed += check_type<EM_TYPE_IQ4_XS>("iq4_xs", 1024, 16);
    failed += check_type<EM_TYPE_Q6_K>("q6_k", 1024, 16);
    return failed ? 1 : 0;
}
