/* Helpers shared by the AVX2 kernels (dot_avx2.c, dot_rows_avx2.c): one definition each, so the
 * single-row and multi-row kernels round identically. x86 only; included after immintrin.h. */
#ifndef EMBER_QUANT_X86_AVX2_H
#define EMBER_QUANT_X86_AVX2_H

#include <immintrin.h>

#include "../internal.h"

#define EM_AVX2 __attribute__((target("avx2,fma,f16c")))

/* One f16 scale through the F16C unit. */
EM_AVX2 static inline float fp16(const uint8_t *p) { return _cvtsh_ss(em_load_u16(p)); }

EM_AVX2 static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Sum of products of 32 unsigned bytes u (each < 128 where it matters) and 32 signed bytes s, as 8
 * int32 lanes. */
EM_AVX2 static inline __m256i dot_u8_i8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

EM_AVX2 static inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Signed x signed: move the sign of w onto a (activations never hold -128). */
EM_AVX2 static inline __m256i dot_i8_i8(__m256i w, __m256i a) {
    return dot_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

/* Scales of two adjacent 16-element groups as the multiplier of one maddubs result. */
EM_AVX2 static inline __m256i pair_scales(int first, int second) {
    return _mm256_set_m128i(_mm_set1_epi16((int16_t)second), _mm_set1_epi16((int16_t)first));
}

/* Q3_K's 16 group scales (six bits, less 32) from the block's scale bytes at w + 96. */
static inline void q3_k_scales(const uint8_t *w, int scales[16]) {
    for (int g = 0; g < 16; g++) {
        int lo = (w[96 + g % 8] >> (4 * (g / 8))) & 15, hi = (w[104 + g % 4] >> (2 * (g / 4))) & 3;
        scales[g] = (lo | (hi << 4)) - 32;
    }
}

/* Sum of 32 signed bytes, as 8 int32 lanes (for the min terms of the affine formats). */
EM_AVX2 static inline __m256i sum_i8(__m256i a) { return dot_u8_i8(_mm256_set1_epi8(1), a); }

/* 16 bytes of nibbles to 32 bytes: low nibbles first (elements 0..15), then high (16..31). */
EM_AVX2 static inline __m256i unpack_nibbles(const uint8_t *p) {
    __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
    return _mm256_and_si256(both, _mm256_set1_epi8(15));
}

/* Byte j of the result is 0xff when bit j of `bits` is set (32 bits to 32 byte masks). */
EM_AVX2 static inline __m256i bits_to_bytes(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                            3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* The fifth bits of Q5_0 / Q5_1 (bit j of a u32 for element j) as 0x10 per byte. */
EM_AVX2 static inline __m256i fifth_bits(const uint8_t *qh) {
    return _mm256_and_si256(bits_to_bytes(em_load_u32(qh)), _mm256_set1_epi8(0x10));
}

/* IQ3_XXS, one 32-element run: the magnitudes of its eight grid points (q: their 8 indices) and
 * its signs as -1 or +1 per byte (aux: four 7-bit sign groups, each byte's eighth sign the parity
 * of its seven). */
EM_AVX2 static inline __m256i iq3xxs_magnitudes(const uint8_t *q) {
    return _mm256_setr_epi32((int)em_iq3xxs_grid[q[0]], (int)em_iq3xxs_grid[q[1]], (int)em_iq3xxs_grid[q[2]],
                             (int)em_iq3xxs_grid[q[3]], (int)em_iq3xxs_grid[q[4]], (int)em_iq3xxs_grid[q[5]],
                             (int)em_iq3xxs_grid[q[6]], (int)em_iq3xxs_grid[q[7]]);
}

/* Bit j set when element j of the run is negative. */
static inline uint32_t iq3xxs_sign_bits(uint32_t aux) {
    uint32_t signs = (aux & 0x7f) | ((aux << 1) & 0x7f00) | ((aux << 2) & 0x7f0000) | ((aux << 3) & 0x7f000000);
    uint32_t parity = signs ^ (signs >> 4);
    parity ^= parity >> 2;
    parity ^= parity >> 1;
    return signs | (parity & 0x01010101u) << 7;
}

EM_AVX2 static inline __m256i iq3xxs_signs(uint32_t aux) {
    return _mm256_or_si256(bits_to_bytes(iq3xxs_sign_bits(aux)), _mm256_set1_epi8(1));
}

/* The 16 signed levels of a non-linear 4-bit format, in both 128-bit lanes, for byte shuffles. */
EM_AVX2 static inline __m256i level_table(const int8_t *levels) {
    __m128i t = _mm_loadu_si128((const __m128i *)levels);
    return _mm256_set_m128i(t, t);
}

/* The 8 six-bit scales (bytes 0..7) and 8 mins (bytes 8..15) of a K-block's 12 scale bytes, the
 * values em_quant_k_scale_min gives, four at a time: scales and mins 0..3 are the low six bits of
 * bytes 0..3 and 4..7; those of 4..7 take their low four bits from bytes 8..11 (scales: low
 * nibbles, mins: high nibbles) and their top two from the spare top bits of bytes 0..3 / 4..7. */
EM_AVX2 static EM_INLINE __m128i k_scales_mins(const uint8_t *s) {
    /* In vector registers, not general ones: a kernel that moves four words into a vector per block
     * waits on those transfers (bench/dot_rows.c times it). The load takes 16 bytes; the block goes
     * on past them. */
    const __m128i u = _mm_loadu_si128((const __m128i *)(const void *)s); /* u0, u1, u2 and 4 bytes more */
    const __m128i low_of = _mm_shuffle_epi32(u, 0x98);                   /* u0, u2, u1, u2 */
    const __m128i high_of = _mm_shuffle_epi32(u, 0x50);                  /* u0, u0, u1, u1 */
    const __m128i low = _mm_and_si128(_mm_srlv_epi32(low_of, _mm_setr_epi32(0, 0, 0, 4)),
                                      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i high = _mm_and_si128(_mm_srli_epi32(high_of, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(low, high);
}

#endif
