/*
 * AVX2 multi-row dot products: one weight row against up to four activation rows, for the formats
 * that the forward pass reads (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K,
 * Q5_K, Q6_K, IQ4_XS, IQ3_XXS). The single-row kernels in dot_avx2.c spend
 * most of their time unpacking the weight block (nibbles, high bits, scales, mins); here each
 * block is unpacked once and applied to every activation row, so a batch of tokens pays for the
 * unpacking once.
 *
 * Each row's arithmetic is the single-row kernel's, step for step: the same integer sums (integer
 * addition is exact, so their order is free), the same f32 scale products, and the same f32
 * accumulator updated block by block in the same order. The results are therefore bitwise equal
 * to em_dot's, which tests/test_quant.c asserts.
 */
#include "dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

#include <string.h>

#include "avx2.h"

/* The most activation rows one kernel call takes: 4 accumulators plus 4 integer sums plus the
 * unpacked block fit the 16 YMM registers. */
#define ROWS_MAX 4

/* The per-row loops must unroll fully (the row count is a constant in every inlined copy) so the
 * accumulator arrays live in registers rather than on the stack. */
#define UNROLL_ROWS EM_UNROLL(4)

/* The lane sums of four int32 vectors, as the four lanes of one (integer, so exact in any order). */
EM_AVX2 static EM_INLINE __m128i hsum4_i32(const __m256i v[ROWS_MAX]) {
    __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* The formats whose 32-element blocks are one scale (first: f16, or MXFP4's E8M0 byte) and 32
 * signed levels, against Q8_0 activations: the levels and the scale of a block, decoded as the
 * single-row kernels decode them. */
enum { SIGNED_Q8_0, SIGNED_Q4_0, SIGNED_Q5_0, SIGNED_IQ4_NL, SIGNED_MXFP4 };

EM_AVX2 static EM_INLINE __m256i signed_levels(const uint8_t *w, const int kind, __m256i table) {
    switch (kind) {
    case SIGNED_Q4_0: return _mm256_sub_epi8(unpack_nibbles(w + 2), _mm256_set1_epi8(8));
    case SIGNED_Q5_0:
        return _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles(w + 6), fifth_bits(w + 2)), _mm256_set1_epi8(16));
    case SIGNED_IQ4_NL: return _mm256_shuffle_epi8(table, unpack_nibbles(w + 2));
    case SIGNED_MXFP4: return _mm256_shuffle_epi8(table, unpack_nibbles(w + 1));
    default: return load32(w + 2);
    }
}

EM_AVX2 static EM_INLINE float signed_scale(const uint8_t *w, const int kind) {
    return kind == SIGNED_MXFP4 ? em_e8m0_half(w[0]) : fp16(w);
}

/* |w| is the unsigned operand for every row; each row takes w's signs onto its bytes (the
 * single-row kernels' dot_i8_i8, with the weight half done once). */
EM_AVX2 static EM_INLINE void signed_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                          float *out, const int kind) {
    const uint64_t block_bytes = kind == SIGNED_Q8_0 ? 34 : kind == SIGNED_Q5_0 ? 22 : kind == SIGNED_MXFP4 ? 17 : 18;
    const __m256i table = kind == SIGNED_IQ4_NL  ? level_table(em_iq4nl_values)
                          : kind == SIGNED_MXFP4 ? level_table(em_mxfp4_values)
                                                 : _mm256_setzero_si256();
    __m256 acc[ROWS_MAX];
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += block_bytes, a += 34) {
        __m256i q = signed_levels(w, kind, table), mag = _mm256_sign_epi8(q, q);
        float dw = signed_scale(w, kind);
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const uint8_t *ar = a + r * stride;
            __m256i isum = dot_u8_i8(mag, _mm256_sign_epi8(load32(ar + 2), q));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * fp16(ar)), _mm256_cvtepi32_ps(isum), acc[r]);
        }
    }
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]);
}

/* A kernel of one format out of a kernel shared by several (its last argument a constant). */
#define ROWS_VARIANT(name, shared, which)                                                                        \
    EM_AVX2 static EM_INLINE void name(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,  \
                                       float *out) {                                                              \
        shared(w, a, stride, nr, n, out, which);                                                                  \
    }
ROWS_VARIANT(q8_0_rows, signed_rows, SIGNED_Q8_0)
ROWS_VARIANT(q4_0_rows, signed_rows, SIGNED_Q4_0)
ROWS_VARIANT(q5_0_rows, signed_rows, SIGNED_Q5_0)
ROWS_VARIANT(iq4_nl_rows, signed_rows, SIGNED_IQ4_NL)
ROWS_VARIANT(mxfp4_rows, signed_rows, SIGNED_MXFP4)

/* Q4_1 (bits 4) and Q5_1 (bits 5): d * d8 * sum(q * a) + m * d8 * sum(a), q unsigned, decoded once
 * per block; each row's two updates in the single-row kernels' order. */
EM_AVX2 static EM_INLINE void affine_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                          float *out, const int bits) {
    __m256 acc[ROWS_MAX];
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += bits == 5 ? 24 : 20, a += 34) {
        const __m256i q = bits == 5 ? _mm256_or_si256(unpack_nibbles(w + 8), fifth_bits(w + 4)) : unpack_nibbles(w + 4);
        const float dw = fp16(w), mw = fp16(w + 2);
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const uint8_t *ar = a + r * stride;
            __m256i q8 = load32(ar + 2);
            __m256 qa = _mm256_cvtepi32_ps(dot_u8_i8(q, q8));
            __m256 sa = _mm256_cvtepi32_ps(sum_i8(q8));
            float d8 = fp16(ar);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * d8), qa, acc[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(mw * d8), sa, acc[r]);
        }
    }
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]);
}
ROWS_VARIANT(q4_1_rows, affine_rows, 4)
ROWS_VARIANT(q5_1_rows, affine_rows, 5)

/* Q4_K (bits 4) and Q5_K (bits 5: the same block with 32 bytes of fifth bits before the nibbles,
 * bit s of byte j for sub-block s): scales, mins and both halves decoded once per block. */
EM_AVX2 static EM_INLINE void q45_k_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                         float *out, const int bits) {
    const uint64_t block_bytes = bits == 5 ? 176 : 144, nibbles = bits == 5 ? 48 : 16;
    __m256 acc[ROWS_MAX];
    /* row r's f32 sum of min terms in lane r: the four rows' updates in one multiply-add chain,
     * each lane the single-row kernel's scalar steps (IEEE operations round the same per lane) */
    __m128 mins_total = _mm_setzero_ps();
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (uint64_t b = 0; b < n / 256; b++, w += block_bytes, a += 292) {
        /* the 8 scales as int16 in both lanes (broadcast per sub-block by a byte shuffle) and
         * each min beside itself, against the two 16-element group sums of its sub-block: one
         * madd per row gives the single-row kernel's integer sum(min * (sum a)) exactly */
        const __m128i sm = k_scales_mins(w + 4);
        const __m256i scales16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        const __m256i mins_pairs = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
        __m256i isum[ROWS_MAX], mins[ROWS_MAX] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                                                  _mm256_setzero_si256(), _mm256_setzero_si256()};
        float d8[ROWS_MAX] = {0, 0, 0, 0};
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            d8[r] = em_load_f32(a + r * stride);
            mins[r] = _mm256_madd_epi16(load32(a + r * stride + 260), mins_pairs);
            isum[r] = _mm256_setzero_si256();
        }
        __m128 scale = _mm_mul_ps(_mm_set1_ps(fp16(w + 2)), _mm_setr_ps(d8[0], d8[1], d8[2], d8[3]));
        mins_total = _mm_add_ps(mins_total, _mm_mul_ps(scale, _mm_cvtepi32_ps(hsum4_i32(mins))));
        const __m256i qh = bits == 5 ? load32(w + 16) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = load32(w + nibbles + 32 * c);
            __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            if (bits == 5) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
            }
            __m256i slo = _mm256_shuffle_epi8(scales16, _mm256_set1_epi16((int16_t)(((4 * c + 1) << 8) | 4 * c)));
            __m256i shi = _mm256_shuffle_epi8(scales16, _mm256_set1_epi16((int16_t)(((4 * c + 3) << 8) | (4 * c + 2))));
            UNROLL_ROWS for (int r = 0; r < nr; r++) {
                const uint8_t *ar = a + r * stride;
                __m256i plo = _mm256_maddubs_epi16(lo, load32(ar + 4 + 64 * c));
                __m256i phi = _mm256_maddubs_epi16(hi, load32(ar + 36 + 64 * c));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(plo, slo));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(phi, shi));
            }
        }
        UNROLL_ROWS for (int r = 0; r < nr; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w) * d8[r]), _mm256_cvtepi32_ps(isum[r]), acc[r]);
    }
    float mins_out[ROWS_MAX];
    _mm_storeu_ps(mins_out, mins_total);
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]) - mins_out[r];
}
ROWS_VARIANT(q4_k_rows, q45_k_rows, 4)
ROWS_VARIANT(q5_k_rows, q45_k_rows, 5)

/* Q2_K: each 32-element run's 2-bit levels and its pair of group scales decoded once; the min
 * terms per row as scalars, in the single-row kernel's order. */
EM_AVX2 static EM_INLINE void q2_k_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                        float *out) {
    __m256 acc[ROWS_MAX];
    float mins_total[ROWS_MAX] = {0, 0, 0, 0};
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const __m256i low2 = _mm256_set1_epi8(3);
    for (uint64_t b = 0; b < n / 256; b++, w += 84, a += 292) {
        __m256i isum[ROWS_MAX];
        float d8[ROWS_MAX] = {0, 0, 0, 0};
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const uint8_t *ar = a + r * stride;
            d8[r] = em_load_f32(ar);
            int mins = 0;
            for (int g = 0; g < 16; g++) mins += (w[g] >> 4) * (int16_t)em_load_u16(ar + 260 + 2 * g);
            mins_total[r] += fp16(w + 82) * d8[r] * (float)mins;
            isum[r] = _mm256_setzero_si256();
        }
        for (int h = 0; h < 2; h++) {
            const __m256i qs = load32(w + 16 + 32 * h);
            for (int k = 0; k < 4; k++) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), low2);
                const int g = 8 * h + 2 * k;
                const __m256i scales = pair_scales(w[g] & 15, w[g + 1] & 15);
                UNROLL_ROWS for (int r = 0; r < nr; r++) {
                    __m256i p = _mm256_maddubs_epi16(q, load32(a + r * stride + 4 + 128 * h + 32 * k));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, scales));
                }
            }
        }
        const float dw = fp16(w + 80);
        UNROLL_ROWS for (int r = 0; r < nr; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * d8[r]), _mm256_cvtepi32_ps(isum[r]), acc[r]);
    }
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]) - mins_total[r];
}

/* Q3_K: the 16 group scales once per block, each 32-element run's 3-bit levels once; each row's
 * offset (the -4 of every level, through its group sums) as the single-row kernel forms it. */
EM_AVX2 static EM_INLINE void q3_k_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                        float *out) {
    __m256 acc[ROWS_MAX];
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const __m256i low2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    for (uint64_t b = 0; b < n / 256; b++, w += 110, a += 292) {
        int scales[16];
        q3_k_scales(w, scales);
        __m256i isum[ROWS_MAX];
        int offset[ROWS_MAX] = {0, 0, 0, 0};
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            for (int g = 0; g < 16; g++) offset[r] += scales[g] * (int16_t)em_load_u16(a + r * stride + 260 + 2 * g);
            isum[r] = _mm256_setzero_si256();
        }
        const __m256i hmask = load32(w);
        for (int h = 0; h < 2; h++) {
            const __m256i qs = load32(w + 32 + 32 * h);
            for (int k = 0; k < 4; k++) {
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hmask, 4 * h + k), one);
                const __m256i q =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), low2), _mm256_slli_epi16(high, 2));
                const int g = 8 * h + 2 * k;
                const __m256i pair = pair_scales(scales[g], scales[g + 1]);
                UNROLL_ROWS for (int r = 0; r < nr; r++) {
                    __m256i p = _mm256_maddubs_epi16(q, load32(a + r * stride + 4 + 128 * h + 32 * k));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, pair));
                }
            }
        }
        const float dw = fp16(w + 108);
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            isum[r] = _mm256_sub_epi32(isum[r], _mm256_setr_epi32(4 * offset[r], 0, 0, 0, 0, 0, 0, 0));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * em_load_f32(a + r * stride)), _mm256_cvtepi32_ps(isum[r]),
                                     acc[r]);
        }
    }
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]);
}

/* IQ3_XXS: each 32-element run's grid magnitudes, signs and scale decoded once; the signs go onto
 * each row's activations as in the single-row kernel. */
EM_AVX2 static EM_INLINE void iq3_xxs_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                           float *out) {
    __m256 acc[ROWS_MAX];
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 256; b++, w += 98, a += 292) {
        __m256i isum[ROWS_MAX];
        UNROLL_ROWS for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t aux = em_load_u32(w + 66 + 4 * ib);
            const __m256i mag = iq3xxs_magnitudes(w + 2 + 8 * ib), sign = iq3xxs_signs(aux);
            const __m256i scale = _mm256_set1_epi16((int16_t)(2 * (aux >> 28) + 1));
            UNROLL_ROWS for (int r = 0; r < nr; r++) {
                __m256i q8 = _mm256_sign_epi8(load32(a + r * stride + 4 + 32 * ib), sign);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, q8), scale));
            }
        }
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            float d = fp16(w) * em_load_f32(a + r * stride) * 0.25f;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]);
}

/* IQ4_XS: each 32-element run's levels (IQ4_NL's table) and its 6-bit scale decoded once. */
EM_AVX2 static EM_INLINE void iq4_xs_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                          float *out) {
    const __m256i table = level_table(em_iq4nl_values);
    __m256 acc[ROWS_MAX];
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 256; b++, w += 136, a += 292) {
        const uint16_t scales_h = em_load_u16(w + 2);
        __m256i isum[ROWS_MAX];
        UNROLL_ROWS for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            const int scale = (((w[4 + s / 2] >> (4 * (s % 2))) & 15) | (((scales_h >> (2 * s)) & 3) << 4)) - 32;
            const __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles(w + 8 + 16 * s));
            const __m256i mag = _mm256_sign_epi8(q, q), scale32 = _mm256_set1_epi32(scale);
            UNROLL_ROWS for (int r = 0; r < nr; r++) {
                __m256i p = dot_u8_i8(mag, _mm256_sign_epi8(load32(a + r * stride + 4 + 32 * s), q));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(p, scale32));
            }
        }
        const float dw = fp16(w);
        UNROLL_ROWS for (int r = 0; r < nr; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * em_load_f32(a + r * stride)), _mm256_cvtepi32_ps(isum[r]),
                                     acc[r]);
    }
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]);
}

/* Q6_K: the 6-bit levels of each 32-element run and their pair of scales decoded once. */
EM_AVX2 static EM_INLINE void q6_k_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                        float *out) {
    __m256 acc[ROWS_MAX];
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(15), low2 = _mm256_set1_epi8(3);
    for (uint64_t b = 0; b < n / 256; b++, w += 210, a += 292) {
        const int8_t *sc = (const int8_t *)(w + 192);
        /* the 16 group scales against the 16 group sums: sum(scale_g * sum_g a), exactly */
        const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        __m256i isum[ROWS_MAX];
        UNROLL_ROWS for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = load32(w + 64 * h), ql1 = load32(w + 64 * h + 32), qh = load32(w + 128 + 32 * h);
            __m256i lows[4] = {_mm256_and_si256(ql0, low4), _mm256_and_si256(ql1, low4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4)};
            for (int k = 0; k < 4; k++) {
                __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), low2);
                __m256i q = _mm256_or_si256(lows[k], _mm256_slli_epi16(high, 4));
                int g = 8 * h + 2 * k; /* the two 16-element groups of these 32 elements */
                __m256i scales = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
                UNROLL_ROWS for (int r = 0; r < nr; r++) {
                    __m256i p = _mm256_maddubs_epi16(q, load32(a + r * stride + 4 + 128 * h + 32 * k));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, scales));
                }
            }
        }
        __m256i groups[ROWS_MAX] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                                    _mm256_setzero_si256()};
        UNROLL_ROWS for (int r = 0; r < nr; r++) groups[r] = _mm256_madd_epi16(load32(a + r * stride + 260), scales16);
        int offset[ROWS_MAX];
        _mm_storeu_si128((__m128i *)offset, hsum4_i32(groups));
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const uint8_t *ar = a + r * stride;
            isum[r] = _mm256_sub_epi32(isum[r], _mm256_setr_epi32(32 * offset[r], 0, 0, 0, 0, 0, 0, 0));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w + 208) * em_load_f32(ar)), _mm256_cvtepi32_ps(isum[r]),
                                     acc[r]);
        }
    }
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]);
}

/* F32, F16, BF16 weights: each run of eight weights converted to f32 once for both rows. Each row
 * keeps the single-row kernel's four accumulators, its 8-wide tail and its scalar tail, so its
 * sum rounds the same way; two rows at most (eight accumulators stay in registers). */
enum float_kind { KIND_F32, KIND_F16, KIND_BF16 };

EM_AVX2 static EM_INLINE __m256 float_load8(const uint8_t *w, uint64_t j, enum float_kind kind) {
    switch (kind) {
    case KIND_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * j)));
    case KIND_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + 2 * j))), 16));
    default: return _mm256_loadu_ps((const float *)(w + 4 * j));
    }
}

EM_AVX2 static EM_INLINE float float_load1(const uint8_t *w, uint64_t j, enum float_kind kind) {
    switch (kind) {
    case KIND_F16: return em_fp16_to_f32(em_load_u16(w + 2 * j));
    case KIND_BF16: return em_bf16_to_f32(em_load_u16(w + 2 * j));
    default: {
        float f;
        memcpy(&f, w + 4 * j, sizeof f);
        return f;
    }
    }
}

EM_AVX2 static EM_INLINE void float_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                         float *out, enum float_kind kind) {
    __m256 acc[2][4];
    const float *x[2];
    UNROLL_ROWS for (int r = 0; r < nr; r++) {
        x[r] = (const float *)(a + r * stride);
        for (int k = 0; k < 4; k++) acc[r][k] = _mm256_setzero_ps();
    }
    uint64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 w0 = float_load8(w, j, kind), w1 = float_load8(w, j + 8, kind), w2 = float_load8(w, j + 16, kind),
               w3 = float_load8(w, j + 24, kind);
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r] + j), acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[r] + j + 8), acc[r][1]);
            acc[r][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x[r] + j + 16), acc[r][2]);
            acc[r][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x[r] + j + 24), acc[r][3]);
        }
    }
    for (; j + 8 <= n; j += 8) {
        __m256 w0 = float_load8(w, j, kind);
        UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r] + j), acc[r][0]);
    }
    UNROLL_ROWS for (int r = 0; r < nr; r++) {
        float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3])));
        for (uint64_t i = j; i < n; i++) sum += float_load1(w, i, kind) * x[r][i];
        out[r] = sum;
    }
}

#define FLOAT_ENTRY(name, kind)                                                                                  \
    EM_AVX2 static void name(const void *wv, const void *av, uint64_t stride, uint32_t n_rows, uint64_t n,       \
                             float *out) {                                                                        \
        const uint8_t *w = wv, *a = av;                                                                           \
        uint32_t done = 0;                                                                                        \
        for (; done + 2 <= n_rows; done += 2) float_rows(w, a + done * stride, stride, 2, n, out + done, kind);  \
        if (done < n_rows) float_rows(w, a + done * stride, stride, 1, n, out + done, kind);                    \
    }

FLOAT_ENTRY(dot_rows_f32, KIND_F32)
FLOAT_ENTRY(dot_rows_f16, KIND_F16)
FLOAT_ENTRY(dot_rows_bf16, KIND_BF16)

/* One entry point per type; each switch case inlines the kernel with a constant row count, so
 * the per-row loops unroll and the accumulators stay in registers. */
#define ROWS_ENTRY(name, kernel)                                                                                 \
    EM_AVX2 static void name(const void *wv, const void *av, uint64_t stride, uint32_t n_rows, uint64_t n,       \
                             float *out) {                                                                        \
        const uint8_t *w = wv, *a = av;                                                                           \
        for (uint32_t done = 0; done < n_rows; done += ROWS_MAX) {                                               \
            switch (n_rows - done) {                                                                              \
            case 1: kernel(w, a + done * stride, stride, 1, n, out + done); break;                               \
            case 2: kernel(w, a + done * stride, stride, 2, n, out + done); break;                               \
            case 3: kernel(w, a + done * stride, stride, 3, n, out + done); break;                               \
            default: kernel(w, a + done * stride, stride, 4, n, out + done); break;                              \
            }                                                                                                     \
        }                                                                                                         \
    }

ROWS_ENTRY(dot_rows_q8_0, q8_0_rows)
ROWS_ENTRY(dot_rows_q4_0, q4_0_rows)
ROWS_ENTRY(dot_rows_q5_0, q5_0_rows)
ROWS_ENTRY(dot_rows_iq4_nl, iq4_nl_rows)
ROWS_ENTRY(dot_rows_mxfp4, mxfp4_rows)
ROWS_ENTRY(dot_rows_q4_1, q4_1_rows)
ROWS_ENTRY(dot_rows_q5_1, q5_1_rows)
ROWS_ENTRY(dot_rows_q4_k, q4_k_rows)
ROWS_ENTRY(dot_rows_q5_k, q5_k_rows)
ROWS_ENTRY(dot_rows_q6_k, q6_k_rows)
ROWS_ENTRY(dot_rows_iq4_xs, iq4_xs_rows)
ROWS_ENTRY(dot_rows_q2_k, q2_k_rows)
ROWS_ENTRY(dot_rows_q3_k, q3_k_rows)
ROWS_ENTRY(dot_rows_iq3_xxs, iq3_xxs_rows)

em_dot_rows_fn em_quant_dot_rows_x86(uint32_t weight_type) {
    if (!em_quant_x86_has_avx2()) return NULL;
    switch (weight_type) {
    case EM_TYPE_F32: return dot_rows_f32;
    case EM_TYPE_F16: return dot_rows_f16;
    case EM_TYPE_BF16: return dot_rows_bf16;
    case EM_TYPE_Q8_0: return dot_rows_q8_0;
    case EM_TYPE_Q4_0: return dot_rows_q4_0;
    case EM_TYPE_Q5_0: return dot_rows_q5_0;
    case EM_TYPE_IQ4_NL: return dot_rows_iq4_nl;
    case EM_TYPE_MXFP4: return dot_rows_mxfp4;
    case EM_TYPE_Q4_1: return dot_rows_q4_1;
    case EM_TYPE_Q5_1: return dot_rows_q5_1;
    case EM_TYPE_Q4_K: return dot_rows_q4_k;
    case EM_TYPE_Q5_K: return dot_rows_q5_k;
    case EM_TYPE_Q6_K: return dot_rows_q6_k;
    case EM_TYPE_IQ4_XS: return dot_rows_iq4_xs;
    case EM_TYPE_Q2_K: return dot_rows_q2_k;
    case EM_TYPE_Q3_K: return dot_rows_q3_k;
    case EM_TYPE_IQ3_XXS: return dot_rows_iq3_xxs;
    default: return NULL;
    }
}

#else

em_dot_rows_fn em_quant_dot_rows_x86(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

#endif
