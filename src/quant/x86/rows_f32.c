/*
 * Weighted sums of f32 rows (em_f32_add_weighted_rows) with AVX-512F or AVX2: attention's sum of
 * value rows, weighted by the softmax, for every (token, head) pair of a batch. Each output lane
 * takes the plain loop's steps in its order: the product rounded to f32, then added. Compilers
 * may fuse the multiply and the add into one rounding where FMA is enabled (GNU modes contract), which
 * changes the last bit; the empty asm statement between them keeps the product a value of its own.
 */
#include "dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define EM_AVX512F __attribute__((target("avx2,fma,avx512f")))
#define EM_AVX2_ONLY __attribute__((target("avx2")))

/* Four 16-lane accumulators (64 floats, a common head size) stay in registers over all rows. */
EM_AVX512F static void weighted_rows_avx512(float *out, const float *rows, uint64_t row_stride, const float *weights,
                                            uint32_t n_rows, uint64_t n) {
    uint64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 acc[4];
        for (int k = 0; k < 4; k++) acc[k] = _mm512_loadu_ps(out + j + 16 * k);
        for (uint32_t p = 0; p < n_rows; p++) {
            const __m512 w = _mm512_set1_ps(weights[p]);
            const float *row = rows + p * row_stride + j;
            for (int k = 0; k < 4; k++) {
                __m512 product = _mm512_mul_ps(w, _mm512_loadu_ps(row + 16 * k));
                __asm__("" : "+v"(product));
                acc[k] = _mm512_add_ps(acc[k], product);
            }
        }
        for (int k = 0; k < 4; k++) _mm512_storeu_ps(out + j + 16 * k, acc[k]);
    }
    for (; j + 16 <= n; j += 16) {
        __m512 acc = _mm512_loadu_ps(out + j);
        for (uint32_t p = 0; p < n_rows; p++) {
            __m512 product = _mm512_mul_ps(_mm512_set1_ps(weights[p]), _mm512_loadu_ps(rows + p * row_stride + j));
            __asm__("" : "+v"(product));
            acc = _mm512_add_ps(acc, product);
        }
        _mm512_storeu_ps(out + j, acc);
    }
    for (; j < n; j++)
        for (uint32_t p = 0; p < n_rows; p++) {
            float product = weights[p] * rows[p * row_stride + j];
            __asm__("" : "+v"(product));
            out[j] += product;
        }
}

EM_AVX2_ONLY static void weighted_rows_avx2(float *out, const float *rows, uint64_t row_stride, const float *weights,
                                            uint32_t n_rows, uint64_t n) {
    uint64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 acc[4];
        for (int k = 0; k < 4; k++) acc[k] = _mm256_loadu_ps(out + j + 8 * k);
        for (uint32_t p = 0; p < n_rows; p++) {
            const __m256 w = _mm256_set1_ps(weights[p]);
            const float *row = rows + p * row_stride + j;
            for (int k = 0; k < 4; k++) {
                __m256 product = _mm256_mul_ps(w, _mm256_loadu_ps(row + 8 * k));
                __asm__("" : "+x"(product));
                acc[k] = _mm256_add_ps(acc[k], product);
            }
        }
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(out + j + 8 * k, acc[k]);
    }
    for (; j < n; j++)
        for (uint32_t p = 0; p < n_rows; p++) {
            float product = weights[p] * rows[p * row_stride + j];
            __asm__("" : "+x"(product));
            out[j] += product;
        }
}

em_weighted_rows_fn em_quant_weighted_rows_x86(void) {
    if (em_quant_x86_has_vnni()) return weighted_rows_avx512;
    if (em_quant_x86_has_avx2()) return weighted_rows_avx2;
    return NULL;
}

#else

em_weighted_rows_fn em_quant_weighted_rows_x86(void) { return NULL; }

#endif
