/*
 * Ember's importance-weighted quantizers (em_quantize_rows) against llama.cpp's own: loads
 * llama.cpp's libggml-base (the path given) and compares the bytes ggml_quantize_chunk writes with
 * an importance vector to Ember's, for every type whose weighted algorithm Ember follows, on rows
 * of several shapes (gaussian, heavy-tailed with outliers, an all-zero block) with skewed and with
 * unit importance. Q8_0 is in the list because llama.cpp ignores the weights there: Ember must
 * write its unweighted bytes. Prints one line per type; exit status 1 on any difference.
 * usage: imatrix_peer LIBGGML_BASE_SO
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/quant/quant.h"

/* ggml_quantize_chunk(type, src, dst, start, nrows, n_per_row, imatrix) from ggml.h; GGML type
 * ids are the GGUF ones (em_type). */
typedef size_t (*ggml_quantize_chunk_fn)(int type, const float *src, void *dst, int64_t start, int64_t nrows,
                                         int64_t n_per_row, const float *imatrix);

#define ROWS 6
#define COLS 1024

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}
static float gaussian(void) { return (float)(sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform())); }

static void fill_rows(float *x) {
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) {
            float v = gaussian() * 0.02f;
            if (r % 3 == 1) v = (float)(pow(uniform(), 3.0) * (uniform() < 0.5 ? -0.3 : 0.3)); /* skewed magnitudes */
            if (r % 3 == 2 && uniform() < 0.01) v *= 40;                                      /* outliers */
            if (r == 3 && c < 256) v = 0;                                                        /* an all-zero block */
            if (r == 4 && c >= 256 && c < 512) v = fabsf(v) + 0.01f;                              /* all positive */
            x[r * COLS + c] = v;
        }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: imatrix_peer LIBGGML_BASE_SO\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "imatrix_peer: %s\n", dlerror());
        return 1;
    }
    ggml_quantize_chunk_fn chunk = (ggml_quantize_chunk_fn)(uintptr_t)dlsym(lib, "ggml_quantize_chunk");
    if (!chunk) {
        fprintf(stderr, "imatrix_peer: no ggml_quantize_chunk in %s\n", argv[1]);
        return 1;
    }
    static const em_type types[] = {EM_TYPE_Q4_0, EM_TYPE_Q4_1, EM_TYPE_Q5_0, EM_TYPE_Q5_1, EM_TYPE_Q2_K,
                                    EM_TYPE_Q3_K, EM_TYPE_Q4_K, EM_TYPE_Q5_K, EM_TYPE_Q6_K, EM_TYPE_IQ4_NL,
                                    EM_TYPE_IQ4_XS, EM_TYPE_Q8_0};
    float *x = malloc(sizeof(float) * ROWS * COLS), skewed[COLS], unit[COLS];
    uint8_t *ours = malloc(ROWS * COLS * 2), *theirs = malloc(ROWS * COLS * 2);
    if (!x || !ours || !theirs) return 1;
    fill_rows(x);
    for (int c = 0; c < COLS; c++) {
        skewed[c] = expf(3 * gaussian()); /* importance spans orders of magnitude, as real ones do */
        unit[c] = 1;
    }
    int status = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        uint64_t row_bytes;
        if (em_type_row_bytes(types[t], COLS, &row_bytes)) return 1;
        const float *importances[2] = {skewed, unit};
        uint64_t differ[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            memset(ours, 0xAA, ROWS * row_bytes);
            memset(theirs, 0x55, ROWS * row_bytes);
            em_err err = em_quantize_rows(types[t], x, ours, ROWS, COLS, importances[k]);
            if (err) {
                fprintf(stderr, "%s: %s\n", em_type_name(types[t]), em_err_message(err));
                return 1;
            }
            size_t written = chunk((int)types[t], x, theirs, 0, ROWS, COLS, importances[k]);
            if (written != ROWS * row_bytes) {
                fprintf(stderr, "%s: llama.cpp wrote %zu bytes, expected %llu\n", em_type_name(types[t]), written,
                        (unsigned long long)(ROWS * row_bytes));
                return 1;
            }
            for (uint64_t i = 0; i < ROWS * row_bytes; i++) differ[k] += ours[i] != theirs[i];
        }
        printf("%-7s skewed importance: %llu of %llu bytes differ; unit importance: %llu differ\n",
               em_type_name(types[t]), (unsigned long long)differ[0], (unsigned long long)(ROWS * row_bytes),
               (unsigned long long)differ[1]);
        if (differ[0] || differ[1]) status = 1;
    }
    free(x);
    free(ours);
    free(theirs);
    dlclose(lib);
    return status;
}
