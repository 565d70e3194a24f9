/* The decode dot-product kernels alone: one thread, one activation row, a matrix of ROWS x 2048
 * random weights in each type the CPU decode benchmarks use, best of 200 passes over the matrix:
 * row by row through em_dot_rows_kernel ("rows"), and all rows in one em_dot_weights call
 * ("weights", what the backend calls for one token). Prints ns per weight row and the GB/s of
 * weights that is, so a kernel can be held against the machine's read bandwidth
 * (bench/read_bandwidth.c).
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Isrc bench/dot_rows.c BUILD/libember_core.a -lm -lpthread -o dot_rows
 *   ./dot_rows [ROWS]        (default 768: one expert matrix of moe-30b-a3b, about 0.6-3 MB)
 *
 * EMBER_CPU_ISA=avx2 in the environment measures the AVX2 kernels where AVX-512 VNNI ones exist. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "quant/quant.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const uint32_t types[] = {EM_TYPE_Q4_K, EM_TYPE_Q8_0, EM_TYPE_Q6_K, EM_TYPE_IQ3_XXS, EM_TYPE_BF16, EM_TYPE_MXFP4};
    const char *names[] = {"q4_k", "q8_0", "q6_k", "iq3_xxs", "bf16", "mxfp4"};
    const uint64_t cols = 2048, rows = argc > 1 ? strtoull(argv[1], NULL, 10) : 768;
    if (rows < 1 || rows > 1000000) {
        fprintf(stderr, "usage: dot_rows [ROWS (1-1000000)]\n");
        return 1;
    }
    float *w = malloc(rows * cols * sizeof *w), *x = malloc(cols * sizeof *x);
    if (!w || !x) return 1;
    srand(1);
    for (uint64_t i = 0; i < rows * cols; i++) w[i] = rand() / (float)RAND_MAX - 0.5f;
    for (uint64_t i = 0; i < cols; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
    printf("isa %s, %llu rows x %llu columns, 1 thread, 1 activation row\n", em_dot_isa(),
           (unsigned long long)rows, (unsigned long long)cols);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t type = types[ti];
        uint64_t row_bytes = 0, act_bytes = 0;
        em_err err = em_type_row_bytes(type, cols, &row_bytes);
        if (!err) err = em_type_row_bytes(em_dot_activation_type(type), cols, &act_bytes);
        uint8_t *q = malloc(row_bytes * rows), *a = malloc(act_bytes);
        if (!err && (!q || !a)) err = em_errorf(EM_ERR_NOMEM, "out of memory");
        if (!err) err = em_quantize_rows(type, w, q, rows, cols, NULL);
        if (!err) err = em_quantize_activation(type, x, a, cols);
        if (err) {
            fprintf(stderr, "dot_rows: %s: %s\n", names[ti], em_err_message(err));
            return 1;
        }
        const em_dot_rows_fn kernel = em_dot_rows_kernel(type);
        float *out = malloc(rows * sizeof *out);
        if (!out) return 1;
        double best[2] = {1e30, 1e30}; /* row by row, all rows in one call */
        volatile float sink = 0; /* the results are used, so no pass can be optimized away */
        for (int pass = 0; pass < 400; pass++) {
            const int way = pass % 2;
            const double t0 = now();
            if (way == 0)
                for (uint64_t r = 0; r < rows; r++) {
                    if (kernel)
                        kernel(q + r * row_bytes, a, act_bytes, 1, cols, &out[r]);
                    else
                        em_dot_rows(type, q + r * row_bytes, a, act_bytes, 1, cols, &out[r]);
                }
            else
                em_dot_weights(type, q, row_bytes, (uint32_t)rows, a, 0, 1, cols, out, 0);
            const double seconds = now() - t0;
            sink += out[rows - 1];
            if (seconds < best[way]) best[way] = seconds;
        }
        printf("%-8s rows %7.1f ns/row %6.1f GB/s   weights %7.1f ns/row %6.1f GB/s\n", names[ti],
               best[0] / rows * 1e9, row_bytes * rows / best[0] / 1e9, best[1] / rows * 1e9,
               row_bytes * rows / best[1] / 1e9);
        free(out);
        free(q);
        free(a);
    }
    free(w);
    free(x);
    return 0;
}
