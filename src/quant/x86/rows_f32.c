/*
 * Weighted sums of f32 rows (em_f32_add_weighted_rows) with AVX-512F or AVX2: attention's sum of
 * value rows, weighted by the softmax, for the query heads of a KV head at once. Each output lane
 * takes the plain loop's steps in its order: one fused multiply-add per row (fmaf).
 *
 * And f32 dot products of many rows with one vector (em_f32_dot_rows): attention's scores of a query
 * against a run of cached keys, each bitwise dot_avx2.c's dot_f32 (em_dot's F32 kernel on these
 * CPUs), sixteen rows at a time with AVX-512F.
 */
#include "dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>

#define EM_AVX512F __attribute__((target("avx2,fma,avx512f")))
#define EM_AVX2_FMA __attribute__((target("avx2,fma")))

/* Up to four heads at a time, 64 columns at a time: 16 accumulators stay in registers over all
 * rows, each value row loaded once for the heads. */
EM_AVX512F static EM_INLINE void heads_avx512(const int heads, float *out, uint64_t out_stride, const float *weights,
                                              uint64_t weights_stride, const float *rows, uint64_t row_stride,
                                              uint32_t n_rows, uint64_t n) {
    uint64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 acc[4][4];
        EM_UNROLL(4) for (int h = 0; h < heads; h++)
            EM_UNROLL(4) for (int k = 0; k < 4; k++) acc[h][k] = _mm512_loadu_ps(out + h * out_stride + j + 16 * k);
        for (uint32_t p = 0; p < n_rows; p++) {
            const float *row = rows + p * row_stride + j;
            __m512 values[4];
            EM_UNROLL(4) for (int k = 0; k < 4; k++) values[k] = _mm512_loadu_ps(row + 16 * k);
            EM_UNROLL(4) for (int h = 0; h < heads; h++) {
                const __m512 w = _mm512_set1_ps(weights[h * weights_stride + p]);
                EM_UNROLL(4) for (int k = 0; k < 4; k++) acc[h][k] = _mm512_fmadd_ps(w, values[k], acc[h][k]);
            }
        }
        EM_UNROLL(4) for (int h = 0; h < heads; h++)
            EM_UNROLL(4) for (int k = 0; k < 4; k++) _mm512_storeu_ps(out + h * out_stride + j + 16 * k, acc[h][k]);
    }
    for (int h = 0; h < heads; h++) {
        float *o = out + h * out_stride;
        const float *wh = weights + h * weights_stride;
        uint64_t i = j;
        for (; i + 16 <= n; i += 16) {
            __m512 acc = _mm512_loadu_ps(o + i);
            for (uint32_t p = 0; p < n_rows; p++)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(wh[p]), _mm512_loadu_ps(rows + p * row_stride + i), acc);
            _mm512_storeu_ps(o + i, acc);
        }
        for (; i < n; i++)
            for (uint32_t p = 0; p < n_rows; p++) o[i] = fmaf(wh[p], rows[p * row_stride + i], o[i]);
    }
}

EM_AVX512F static void weighted_rows_avx512(float *out, uint64_t out_stride, const float *weights,
                                            uint64_t weights_stride, uint32_t n_heads, const float *rows,
                                            uint64_t row_stride, uint32_t n_rows, uint64_t n) {
    uint32_t h = 0;
    for (; h + 4 <= n_heads; h += 4)
        heads_avx512(4, out + h * out_stride, out_stride, weights + h * weights_stride, weights_stride, rows,
                     row_stride, n_rows, n);
    for (; h < n_heads; h++)
        heads_avx512(1, out + h * out_stride, out_stride, weights + h * weights_stride, weights_stride, rows,
                     row_stride, n_rows, n);
}

/* One head at a time, four 8-lane accumulators (32 columns) in registers over all rows. */
EM_AVX2_FMA static void weighted_rows_avx2(float *out, uint64_t out_stride, const float *weights,
                                           uint64_t weights_stride, uint32_t n_heads, const float *rows,
                                           uint64_t row_stride, uint32_t n_rows, uint64_t n) {
    for (uint32_t h = 0; h < n_heads; h++) {
        float *o = out + h * out_stride;
        const float *wh = weights + h * weights_stride;
        uint64_t j = 0;
        for (; j + 32 <= n; j += 32) {
            __m256 acc[4];
            EM_UNROLL(4) for (int k = 0; k < 4; k++) acc[k] = _mm256_loadu_ps(o + j + 8 * k);
            for (uint32_t p = 0; p < n_rows; p++) {
                const __m256 w = _mm256_set1_ps(wh[p]);
                const float *row = rows + p * row_stride + j;
                EM_UNROLL(4) for (int k = 0; k < 4; k++)
                    acc[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * k), acc[k]);
            }
            EM_UNROLL(4) for (int k = 0; k < 4; k++) _mm256_storeu_ps(o + j + 8 * k, acc[k]);
        }
        for (; j < n; j++)
            for (uint32_t p = 0; p < n_rows; p++) o[j] = fmaf(wh[p], rows[p * row_stride + j], o[j]);
    }
}

/* Sixteen rows (`count` of them real: the others repeat the last real row and are not stored)
 * against x, n a multiple of 32. dot_f32 keeps four 8-lane sums acc0..acc3 over the elements j + 0..7,
 * j + 8..15, j + 16..23 and j + 24..31 of each 32, started from zero by a fused multiply-add, and
 * returns hsum((acc0 + acc1) + (acc2 + acc3)), where hsum adds lanes l and l + 4, then lanes 0 and 2
 * and lanes 1 and 3, then those two. Here one 16-lane register holds acc0 and acc1 of a row (the same
 * lanes, the same fused steps) and another acc2 and acc3; permutes line up the lanes each addition
 * takes, for several rows at once, and every addition is one dot_f32 makes, in its order. */
EM_AVX512F static EM_INLINE void f32_dot_sixteen(const float *rows, uint64_t row_stride, uint32_t count, const float *x,
                                                 uint64_t n, float *out) {
    /* from two registers a and b (indices 16..31 pick b): the lanes given, as a permutex2var index */
    const __m512i low_halves = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i high_halves = _mm512_add_epi32(low_halves, _mm512_set1_epi32(8));
    const __m512i low_quads = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i high_quads = _mm512_add_epi32(low_quads, _mm512_set1_epi32(4));
    const __m512i low_pairs = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
    const __m512i high_pairs = _mm512_add_epi32(low_pairs, _mm512_set1_epi32(2));
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
    /* sums[i]: rows 2i and 2i + 1, each (acc0 + acc1) + (acc2 + acc3), 8 lanes */
    __m512 sums[8];
    EM_UNROLL(8) for (int i = 0; i < 8; i++) {
        __m512 a[2], b[2]; /* a: acc0 | acc1, b: acc2 | acc3 */
        EM_UNROLL(2) for (int k = 0; k < 2; k++) {
            const uint32_t row = (uint32_t)(2 * i + k) < count ? (uint32_t)(2 * i + k) : count - 1;
            const float *w = rows + row * row_stride;
            a[k] = b[k] = _mm512_setzero_ps();
            for (uint64_t j = 0; j < n; j += 32) {
                a[k] = _mm512_fmadd_ps(_mm512_loadu_ps(w + j), _mm512_loadu_ps(x + j), a[k]);
                b[k] = _mm512_fmadd_ps(_mm512_loadu_ps(w + j + 16), _mm512_loadu_ps(x + j + 16), b[k]);
            }
        }
        const __m512 ab = _mm512_add_ps(_mm512_permutex2var_ps(a[0], low_halves, a[1]),
                                        _mm512_permutex2var_ps(a[0], high_halves, a[1])); /* acc0 + acc1 */
        const __m512 cd = _mm512_add_ps(_mm512_permutex2var_ps(b[0], low_halves, b[1]),
                                        _mm512_permutex2var_ps(b[0], high_halves, b[1])); /* acc2 + acc3 */
        sums[i] = _mm512_add_ps(ab, cd);
    }
    /* lanes l + (l + 4): four rows to a register, four lanes each */
    __m512 quads[4];
    EM_UNROLL(4) for (int i = 0; i < 4; i++)
        quads[i] = _mm512_add_ps(_mm512_permutex2var_ps(sums[2 * i], low_quads, sums[2 * i + 1]),
                                 _mm512_permutex2var_ps(sums[2 * i], high_quads, sums[2 * i + 1]));
    /* lanes 0 + 2 and 1 + 3: eight rows to a register, two lanes each */
    __m512 pairs[2];
    EM_UNROLL(2) for (int i = 0; i < 2; i++)
        pairs[i] = _mm512_add_ps(_mm512_permutex2var_ps(quads[2 * i], low_pairs, quads[2 * i + 1]),
                                 _mm512_permutex2var_ps(quads[2 * i], high_pairs, quads[2 * i + 1]));
    /* the two lanes: sixteen rows, in order */
    const __m512 dots = _mm512_add_ps(_mm512_permutex2var_ps(pairs[0], evens, pairs[1]),
                                      _mm512_permutex2var_ps(pairs[0], odds, pairs[1]));
    _mm512_mask_storeu_ps(out, (__mmask16)((1u << count) - 1), dots);
}

EM_AVX512F static void f32_dot_rows_avx512(const float *rows, uint64_t row_stride, uint32_t n_rows, const float *x,
                                           uint64_t n, float *out) {
    for (uint32_t r = 0; r < n_rows; r += 16) {
        const uint32_t count = n_rows - r < 16 ? n_rows - r : 16;
        /* a common head size as a constant: x then stays in registers over the sixteen rows */
        if (n == 64) f32_dot_sixteen(rows + r * row_stride, row_stride, count, x, 64, out + r);
        else f32_dot_sixteen(rows + r * row_stride, row_stride, count, x, n, out + r);
    }
}

em_f32_dot_rows_fn em_quant_f32_dot_rows_x86(void) {
    /* bitwise dot_f32 only where em_dot's F32 kernel is dot_f32 (the AVX2 kernels run) */
    return em_quant_x86_has_vnni() && em_quant_x86_has_avx2() ? f32_dot_rows_avx512 : NULL;
}

em_weighted_rows_fn em_quant_weighted_rows_x86(void) {
    if (em_quant_x86_has_vnni()) return weighted_rows_avx512;
    if (em_quant_x86_has_avx2()) return weighted_rows_avx2;
    return NULL;
}

#else

em_weighted_rows_fn em_quant_weighted_rows_x86(void) { return NULL; }

em_f32_dot_rows_fn em_quant_f32_dot_rows_x86(void) { return NULL; }

#endif
