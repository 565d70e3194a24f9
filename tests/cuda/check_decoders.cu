/* The CUDA backend's block decoders (backend/cuda/dequant.cuh, deq<TYPE>::get, compiled for the
 * host as well) against the CPU reference decoder (quant's em_dequantize) on rows quantized by
 * quant's reference quantizers: every group of every block, every element. Needs no GPU: it runs
 * wherever nvcc builds the CUDA backend (tests/cuda/run.sh runs it first).
 * Usage: check_decoders; prints one line per type and exits 1 on any difference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/internal.cuh"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/dq_unit.cuh"
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

/* MXFP4 on blocks no quantizer would write: rows of random bytes (every level, every exponent from
 * 0 to 255, the subnormal scales of e = 0 and 1 included) must decode as quant's decoder does, bit
 * for bit; that decoder equals llama.cpp's on its reference blocks (tests/test_quant.c's golden
 * test), so the device's does too. */
static int check_mxfp4_blocks(void) {
    enum { BLOCKS = 4096 };
    static uint8_t row[BLOCKS * 17];
    static float want[BLOCKS * 32];
    uint64_t state = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < sizeof row; i++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        row[i] = (uint8_t)(state >> 24);
    }
    for (uint32_t b = 0; b < 256; b++) row[17 * b] = (uint8_t)b; /* every exponent */
    if (em_dequantize(EM_TYPE_MXFP4, row, want, BLOCKS * 32)) return fprintf(stderr, "mxfp4: reference decoder failed\n"), 1;
    uint32_t bad = 0;
    for (uint32_t g = 0; g < BLOCKS * 4; g++) {
        float v[8];
        deq<EM_TYPE_MXFP4>::get(row, g, v);
        for (int i = 0; i < 8; i++)
            if (memcmp(&v[i], &want[8 * g + i], sizeof(float)) && bad++ < 5)
                fprintf(stderr, "mxfp4 random blocks: element %u: device decoder %.9g, reference %.9g\n", 8 * g + i,
                        v[i], want[8 * g + i]);
    }
    printf("mxfp4   %u random blocks, every exponent: %s\n", (unsigned)BLOCKS, bad ? "FAIL" : "PASS");
    return bad != 0;
}

/* The DP4A kernel's MXFP4 unit (dq_unit.cuh: 64 values as 16 words of signed bytes and two block
 * scales, loaded from a 2-byte aligned address as whole words) against quant's decoder: each level
 * times its block's scale must be the reference value bit for bit, for rows of an odd number of
 * units (every second row then starts 2 bytes into a word, so both of the loader's alignments are
 * taken) of random bytes. The buffer is 4-byte aligned, as a device allocation is. */
static int check_mxfp4_unit(void) {
    enum { UNITS = 63, ROWS = 16, ROW_BYTES = 34 * UNITS };
    static uint32_t words[(ROWS * ROW_BYTES + 3) / 4];
    static float want[ROWS * UNITS * 64];
    uint8_t *rows = (uint8_t *)words;
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < (size_t)ROWS * ROW_BYTES; i++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        rows[i] = (uint8_t)(state >> 24);
    }
    if (em_dequantize(EM_TYPE_MXFP4, rows, want, (uint64_t)ROWS * UNITS * 64))
        return fprintf(stderr, "mxfp4: reference decoder failed\n"), 1;
    uint32_t bad = 0;
    for (uint32_t r = 0; r < ROWS; r++)
        for (uint32_t u = 0; u < UNITS; u++) {
            dq_unit<EM_TYPE_MXFP4> unit;
            unit.load(rows + (uint64_t)r * ROW_BYTES, u, NULL);
            for (int i = 0; i < 64; i++) {
                const float got = unit.d[i / 32] * (float)(int8_t)(unit.q[i / 4] >> (8 * (i % 4)));
                const float ref = want[((uint64_t)r * UNITS + u) * 64 + i];
                if (memcmp(&got, &ref, sizeof got) && bad++ < 5)
                    fprintf(stderr, "mxfp4 dp4a unit: row %u unit %u value %d: %.9g, reference %.9g\n", r, u, i, got,
                            ref);
            }
        }
    printf("mxfp4   dp4a units, %u rows of %u (both alignments): %s\n", (unsigned)ROWS, (unsigned)UNITS,
           bad ? "FAIL" : "PASS");
    return bad != 0;
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
    failed += check_type<EM_TYPE_MXFP4>("mxfp4", 1024, 16);
    failed += check_mxfp4_blocks();
    failed += check_mxfp4_unit();
    return failed ? 1 : 0;
}
