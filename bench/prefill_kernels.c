/* The batched (prefill) product kernels alone, one thread, in GMAC/s (weight x activation products
 * per second): the packed token-group kernels of Q4_K and Q8_0 (one group of 8 tokens against 16
 * weight rows, held in L1, best of many passes) and the BF16 tiles (em_bf16_tiles, several shapes
 * from in-L1 to a dense-1b matrix against 512 tokens). Random weights and activations.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Isrc bench/prefill_kernels.c BUILD/libember_core.a -lm -lpthread -o prefill_kernels
 *   ./prefill_kernels
 *
 * On a CPU without the kernels (or EMBER_CPU_ISA=avx2) the group lines say so and the BF16 lines
 * time the plain loop. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "quant/quant.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float uniform(void) { return rand() / (float)RAND_MAX - 0.5f; }

/* One packed group of 8 tokens against `rows` weight rows of `n` columns. */
static int time_group(uint32_t type, const char *name, uint64_t n, uint64_t rows, int passes) {
    const em_dot_group_fn kernel = em_dot_group_kernel(type);
    if (!kernel) {
        printf("%-5s group: no kernel on this CPU\n", name);
        return 0;
    }
    uint64_t row_bytes = 0, act_bytes = 0;
    em_err err = em_type_row_bytes(type, n, &row_bytes);
    if (!err) err = em_type_row_bytes(em_dot_activation_type(type), n, &act_bytes);
    float *w = malloc(rows * n * sizeof *w), *x = malloc(n * sizeof *x);
    uint8_t *q = malloc(rows * row_bytes), *a = malloc(EM_DOT_GROUP_TOKENS * act_bytes);
    uint8_t *group = malloc(em_dot_group_bytes(type, n));
    if (!err && (!w || !x || !q || !a || !group)) err = em_errorf(EM_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; !err && i < rows * n; i++) w[i] = uniform();
    if (!err) err = em_quantize_rows(type, w, q, rows, n, NULL);
    for (int t = 0; !err && t < EM_DOT_GROUP_TOKENS; t++) {
        for (uint64_t i = 0; i < n; i++) x[i] = uniform();
        err = em_quantize_activation(type, x, a + t * act_bytes, n);
    }
    if (err) {
        fprintf(stderr, "prefill_kernels: %s: %s\n", name, em_err_message(err));
        return 1;
    }
    em_dot_group_pack(type, a, act_bytes, EM_DOT_GROUP_TOKENS, n, group);
    float out[EM_DOT_GROUP_TOKENS * 16]; /* rows <= 16 */
    volatile float sink = 0; /* the results are used, so no pass can be optimized away */
    double best = 1e30;
    for (int pass = 0; pass < passes; pass++) {
        const double t0 = now();
        kernel(q, row_bytes, (uint32_t)rows, group, EM_DOT_GROUP_TOKENS, n, out, rows);
        sink += out[0];
        const double seconds = now() - t0;
        if (seconds < best) best = seconds;
    }
    printf("%-5s group: 8 tokens x %llu rows x %llu columns: %6.1f GMAC/s\n", name, (unsigned long long)rows,
           (unsigned long long)n, rows * (double)EM_DOT_GROUP_TOKENS * n / best / 1e9);
    free(w);
    free(x);
    free(q);
    free(a);
    free(group);
    return 0;
}

static int time_bf16_tiles(uint32_t rows, uint32_t tokens, uint64_t n, int passes) {
    float *w = malloc(rows * n * sizeof *w), *x = malloc(tokens * n * sizeof *x);
    float *y = malloc(rows * tokens * sizeof *y);
    uint8_t *q = malloc(rows * n * 2);
    uint16_t *a = malloc(tokens * n * 2);
    if (!w || !x || !y || !q || !a) return 1;
    for (uint64_t i = 0; i < rows * n; i++) w[i] = uniform();
    for (uint64_t i = 0; i < tokens * n; i++) x[i] = uniform();
    em_err err = em_quantize(EM_TYPE_BF16, w, q, rows * n);
    if (err) {
        fprintf(stderr, "prefill_kernels: bf16: %s\n", em_err_message(err));
        return 1;
    }
    em_bf16_round_rows(x, n, tokens, n, a, n);
    double best = 1e30;
    for (int pass = 0; pass < passes; pass++) {
        const double t0 = now();
        em_bf16_tiles(q, n * 2, rows, a, n, tokens, n, y, rows);
        const double seconds = now() - t0;
        if (seconds < best) best = seconds;
    }
    printf("bf16  tiles: %u tokens x %u rows x %llu columns: %6.1f GMAC/s\n", tokens, rows, (unsigned long long)n,
           rows * (double)tokens * n / best / 1e9);
    free(w);
    free(x);
    free(y);
    free(q);
    free(a);
    return 0;
}

int main(void) {
    srand(1);
    printf("isa %s, bf16 tiles %s, 1 thread\n", em_dot_isa(), em_bf16_tiles_available() ? "avx512-bf16" : "plain");
    int failed = 0;
    failed |= time_group(EM_TYPE_Q4_K, "q4_k", 2048, 16, 5000);
    failed |= time_group(EM_TYPE_Q4_K, "q4_k", 8192, 16, 2000);
    failed |= time_group(EM_TYPE_Q8_0, "q8_0", 2048, 16, 5000);
    failed |= time_group(EM_TYPE_Q8_0, "q8_0", 8192, 16, 2000);
    failed |= time_bf16_tiles(16, 6, 512, 20000);
    failed |= time_bf16_tiles(16, 48, 2048, 500);
    failed |= time_bf16_tiles(1024, 512, 2048, 3);
    failed |= time_bf16_tiles(1024, 512, 8192, 2);
    return failed;
}
