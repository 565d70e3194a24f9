/* The batched (prefill) product kernels alone, one thread, in GMAC/s (weight x activation products
 * per second): the packed token-group kernels of Q4_K and Q8_0 (one group of 8 tokens against 16
 * weight rows, held in L1, best of many passes; then dense-1b matrices against 512 tokens, swept as
 * the backend sweeps them), their activation quantization, the group kernels of Q6_K and IQ3_XXS on
 * moe-30b-a3b's shapes (attention against 512 tokens, one expert against the 32 tokens a 512-token
 * prompt routes to it on average) beside em_dot_rows swept the same way (what those types ran
 * before they had group kernels), and the BF16 tiles (em_bf16_tiles, several shapes from in-L1 to a
 * dense-1b matrix against 512 tokens). Random weights and activations.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Isrc bench/prefill_kernels.c BUILD/libember_core.a -lm -lpthread -o prefill_kernels
 *   ./prefill_kernels
 *
 * On a CPU without the kernels (or EMBER_CPU_ISA=avx2) the group lines say so and the BF16 lines
 * time the plain loop. */
#include <stdbool.h>
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

/* `tokens` (a multiple of 8) packed in groups of 8, against `rows` weight rows of `n` columns, swept as
 * the CPU backend's batched products sweep them: tiles of `tile` rows, every group against a whole
 * tile in one kernel call; `with_rows`: also em_dot_rows, eight tokens a call, over the same tiles. */
static int time_group(uint32_t type, const char *name, uint64_t n, uint64_t rows, uint32_t tokens, uint64_t tile,
                      int passes, bool with_rows) {
    const em_dot_group_fn kernel = em_dot_group_kernel(type);
    if (!kernel) {
        printf("%-5s group: no kernel on this CPU\n", name);
        return 0;
    }
    uint64_t row_bytes = 0, act_bytes = 0;
    em_err err = em_type_row_bytes(type, n, &row_bytes);
    if (!err) err = em_type_row_bytes(em_dot_activation_type(type), n, &act_bytes);
    const uint32_t groups = tokens / EM_DOT_GROUP_TOKENS;
    const uint64_t group_bytes = em_dot_group_bytes(type, n);
    float *w = malloc(rows * n * sizeof *w), *x = malloc(n * sizeof *x), *y = malloc(rows * tokens * sizeof *y);
    uint8_t *q = malloc(rows * row_bytes), *a = malloc(tokens * act_bytes), *packed = malloc(groups * group_bytes);
    if (!err && (!w || !x || !y || !q || !a || !packed)) err = em_errorf(EM_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; !err && i < rows * n; i++) w[i] = uniform();
    if (!err) err = em_quantize_rows(type, w, q, rows, n, NULL);
    for (uint32_t t = 0; !err && t < tokens; t++) {
        for (uint64_t i = 0; i < n; i++) x[i] = uniform();
        err = em_quantize_activation(type, x, a + t * act_bytes, n);
    }
    if (err) {
        fprintf(stderr, "prefill_kernels: %s: %s\n", name, em_err_message(err));
        return 1;
    }
    for (uint32_t g = 0; g < groups; g++)
        em_dot_group_pack(type, a + g * EM_DOT_GROUP_TOKENS * act_bytes, act_bytes, EM_DOT_GROUP_TOKENS, n,
                          packed + g * group_bytes);
    volatile float sink = 0; /* the results are used, so no pass can be optimized away */
    double best = 1e30, best_rows = 1e30;
    float out[EM_DOT_GROUP_TOKENS];
    for (int pass = 0; pass < passes; pass++) {
        double t0 = now();
        for (uint64_t r = 0; r < rows; r += tile)
            kernel(q + r * row_bytes, row_bytes, (uint32_t)(rows - r < tile ? rows - r : tile), packed, tokens, n,
                   y + r, rows);
        sink += y[0];
        double seconds = now() - t0;
        if (seconds < best) best = seconds;
        if (!with_rows) continue;
        t0 = now();
        for (uint64_t r0 = 0; r0 < rows; r0 += tile)
            for (uint32_t t = 0; t < tokens; t += EM_DOT_GROUP_TOKENS)
                for (uint64_t r = r0; r < rows && r < r0 + tile; r++) {
                    em_dot_rows(type, q + r * row_bytes, a + t * act_bytes, act_bytes, EM_DOT_GROUP_TOKENS, n, out);
                    for (uint32_t g = 0; g < EM_DOT_GROUP_TOKENS; g++) y[(t + g) * rows + r] = out[g];
                }
        sink += y[0];
        seconds = now() - t0;
        if (seconds < best_rows) best_rows = seconds;
    }
    printf("%-7s group: %u tokens x %llu rows x %llu columns, tiles of %llu rows: %6.1f GMAC/s", name, tokens,
           (unsigned long long)rows, (unsigned long long)n, (unsigned long long)tile,
           rows * (double)tokens * n / best / 1e9);
    if (with_rows) printf(" (em_dot_rows: %.1f)", rows * (double)tokens * n / best_rows / 1e9);
    printf("\n");
    free(w);
    free(x);
    free(y);
    free(q);
    free(a);
    free(packed);
    return 0;
}

/* Activation quantization for the weight type (Q8_K for Q4_K, Q8_0 for Q8_0): 512 rows of 8192
 * Gaussian-like values, ns per element. */
static int time_quantize(uint32_t type, const char *name) {
    enum { N = 512 * 8192 };
    float *x = malloc(N * sizeof *x);
    uint8_t *out = malloc(N * 2);
    if (!x || !out) return 1;
    for (uint64_t i = 0; i < N; i++) x[i] = uniform() + uniform() + uniform();
    double best = 1e30;
    for (int pass = 0; pass < 10; pass++) {
        const double t0 = now();
        em_err err = em_quantize_activation(type, x, out, N);
        const double seconds = now() - t0;
        if (err) {
            fprintf(stderr, "prefill_kernels: %s: %s\n", name, em_err_message(err));
            return 1;
        }
        if (seconds < best) best = seconds;
    }
    printf("%-5s activations quantized: %.3f ns per element\n", name, best / N * 1e9);
    free(x);
    free(out);
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
    for (int t = 0; t < 2; t++) {
        const uint32_t type = t ? EM_TYPE_Q8_0 : EM_TYPE_Q4_K;
        const char *name = t ? "q8_0" : "q4_k";
        failed |= time_group(type, name, 2048, 16, 8, 16, 5000, false); /* in L1 */
        failed |= time_group(type, name, 8192, 16, 8, 16, 2000, false);
        failed |= time_group(type, name, 2048, 8192, 512, 64, 5, false); /* dense-1b's gate (or up) and 512 tokens */
        failed |= time_group(type, name, 8192, 2048, 512, 64, 5, false); /* its down projection */
        failed |= time_quantize(type, name);
    }
    /* moe-30b-a3b: attention's Q and output (Q6_K), an expert's gate (or up) and down (IQ3_XXS) */
    failed |= time_group(EM_TYPE_Q6_K, "q6_k", 2048, 16, 8, 16, 5000, true);
    failed |= time_group(EM_TYPE_Q6_K, "q6_k", 2048, 4096, 512, 64, 5, true);
    failed |= time_group(EM_TYPE_Q6_K, "q6_k", 4096, 2048, 512, 64, 5, true);
    failed |= time_group(EM_TYPE_IQ3_XXS, "iq3_xxs", 2048, 16, 8, 16, 5000, true);
    failed |= time_group(EM_TYPE_IQ3_XXS, "iq3_xxs", 2048, 768, 32, 64, 200, true);
    failed |= time_group(EM_TYPE_IQ3_XXS, "iq3_xxs", 768, 2048, 32, 64, 200, true);
    failed |= time_bf16_tiles(16, 6, 512, 20000);
    failed |= time_bf16_tiles(16, 48, 2048, 500);
    failed |= time_bf16_tiles(1024, 512, 2048, 3);
    failed |= time_bf16_tiles(1024, 512, 8192, 2);
    return failed;
}
