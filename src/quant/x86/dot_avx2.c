/*
 * AVX2 dot products for the formats the forward pass reads most: F32, F16, BF16 (f32
 * activations); Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (Q8_0 activations); Q2_K..Q6_K,
 * IQ4_XS, IQ3_XXS (Q8_K activations).
 *
 * Each kernel carries a target attribute instead of the file being built with -mavx2, so the
 * library still runs on any x86-64 and builds unchanged elsewhere; em_quant_dot_x86 hands a kernel
 * out only when the CPU reports AVX2, FMA and F16C. The integer kernels follow the scalar paths in
 * dot.c step for step: unsigned weight levels times signed activations with maddubs (sums of two
 * products fit int16 for every format here), widened to int32 per sub-block, scaled, and converted
 * to f32 once per block. Results equal the scalar paths up to f32 summation order.
 */
#include "dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

#include <cpuid.h>
#include <stdatomic.h>

#include "avx2.h"

EM_AVX2 static float dot_f32(const void *wv, const void *av, uint64_t n) {
    const float *w = wv, *a = av;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps();
    uint64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(a + j), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 8), _mm256_loadu_ps(a + j + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 16), _mm256_loadu_ps(a + j + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 24), _mm256_loadu_ps(a + j + 24), acc3);
    }
    for (; j + 8 <= n; j += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(a + j), acc0);
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; j < n; j++) sum += w[j] * a[j];
    return sum;
}

EM_AVX2 static __m256 load_f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* bf16 is the top half of an f32: widen to 32 bits and shift into place. */
EM_AVX2 static __m256 load_bf16x8(const uint8_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

/* F16 and BF16 rows differ only in how 8 weights widen to f32: one loop, four accumulators, the
 * scalar tail; inlined into each caller so `bf16` is a constant there. */
EM_AVX2 static inline __attribute__((always_inline)) float dot_half(const uint8_t *w, const float *a, uint64_t n,
                                                                     bool bf16) {
#define LOAD8(p) (bf16 ? load_bf16x8(p) : load_f16x8(p))
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps();
    uint64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        acc0 = _mm256_fmadd_ps(LOAD8(w + 2 * j), _mm256_loadu_ps(a + j), acc0);
        acc1 = _mm256_fmadd_ps(LOAD8(w + 2 * j + 16), _mm256_loadu_ps(a + j + 8), acc1);
        acc2 = _mm256_fmadd_ps(LOAD8(w + 2 * j + 32), _mm256_loadu_ps(a + j + 16), acc2);
        acc3 = _mm256_fmadd_ps(LOAD8(w + 2 * j + 48), _mm256_loadu_ps(a + j + 24), acc3);
    }
    for (; j + 8 <= n; j += 8) acc0 = _mm256_fmadd_ps(LOAD8(w + 2 * j), _mm256_loadu_ps(a + j), acc0);
#undef LOAD8
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; j < n; j++) sum += (bf16 ? em_bf16_to_f32(em_load_u16(w + 2 * j)) : em_fp16_to_f32(em_load_u16(w + 2 * j))) * a[j];
    return sum;
}

EM_AVX2 static float dot_f16(const void *wv, const void *av, uint64_t n) { return dot_half(wv, av, n, false); }

EM_AVX2 static float dot_bf16(const void *wv, const void *av, uint64_t n) { return dot_half(wv, av, n, true); }

EM_AVX2 static float dot_q8_0(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += 34, a += 34) {
        __m256i isum = dot_i8_i8(load32(w + 2), load32(a + 2));
        __m256 d = _mm256_set1_ps(fp16(w) * fp16(a));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

EM_AVX2 static float dot_q4_0(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += 18, a += 34) {
        __m256i q = _mm256_sub_epi8(unpack_nibbles(w + 2), _mm256_set1_epi8(8));
        __m256i isum = dot_i8_i8(q, load32(a + 2));
        __m256 d = _mm256_set1_ps(fp16(w) * fp16(a));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

/* Q4_1: d * d8 * sum(q * a) + m * d8 * sum(a), q unsigned. */
EM_AVX2 static float dot_q4_1(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += 20, a += 34) {
        __m256i q8 = load32(a + 2);
        __m256 qa = _mm256_cvtepi32_ps(dot_u8_i8(unpack_nibbles(w + 4), q8));
        __m256 sa = _mm256_cvtepi32_ps(sum_i8(q8));
        float d8 = fp16(a);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w) * d8), qa, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w + 2) * d8), sa, acc);
    }
    return hsum(acc);
}

EM_AVX2 static float dot_q5_0(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += 22, a += 34) {
        __m256i q = _mm256_or_si256(unpack_nibbles(w + 6), fifth_bits(w + 2));
        __m256i isum = dot_i8_i8(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), load32(a + 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w) * fp16(a)), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

EM_AVX2 static float dot_q5_1(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += 24, a += 34) {
        __m256i q8 = load32(a + 2);
        __m256i q = _mm256_or_si256(unpack_nibbles(w + 8), fifth_bits(w + 4));
        __m256 qa = _mm256_cvtepi32_ps(dot_u8_i8(q, q8));
        __m256 sa = _mm256_cvtepi32_ps(sum_i8(q8));
        float d8 = fp16(a);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w) * d8), qa, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w + 2) * d8), sa, acc);
    }
    return hsum(acc);
}

/* Q4_K: the same decomposition as the scalar path: d * sum(scale * q.a) - dmin * sum(min * sum a). */
EM_AVX2 static float dot_q4_k(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    float mins_total = 0;
    const __m256i low4 = _mm256_set1_epi8(15);
    for (uint64_t b = 0; b < n / 256; b++, w += 144, a += 292) {
        float d8 = em_load_f32(a);
        int sc[8], mn[8], mins = 0;
        for (int sub = 0; sub < 8; sub++) {
            em_quant_k_scale_min(w + 4, sub, &sc[sub], &mn[sub]);
            mins += mn[sub] * ((int16_t)em_load_u16(a + 260 + 4 * sub) + (int16_t)em_load_u16(a + 262 + 4 * sub));
        }
        mins_total += fp16(w + 2) * d8 * (float)mins;
        __m256i isum = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = load32(w + 16 + 32 * c);
            __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            __m256i plo = _mm256_maddubs_epi16(lo, load32(a + 4 + 64 * c));
            __m256i phi = _mm256_maddubs_epi16(hi, load32(a + 36 + 64 * c));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(plo, _mm256_set1_epi16((int16_t)sc[2 * c])));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(phi, _mm256_set1_epi16((int16_t)sc[2 * c + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w) * d8), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc) - mins_total;
}

/* Q6_K: unsigned levels 0..63 times activations, per 16-element group scaled by its signed scale;
 * the -32 offset comes back through the Q8_K group sums: sum(scale_g * 32 * sum_g a). */
EM_AVX2 static float dot_q6_k(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(15), low2 = _mm256_set1_epi8(3);
    for (uint64_t b = 0; b < n / 256; b++, w += 210, a += 292) {
        const int8_t *sc = (const int8_t *)(w + 192);
        int offset = 0;
        for (int g = 0; g < 16; g++) offset += sc[g] * (int16_t)em_load_u16(a + 260 + 2 * g);
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = load32(w + 64 * h), ql1 = load32(w + 64 * h + 32), qh = load32(w + 128 + 32 * h);
            __m256i lows[4] = {_mm256_and_si256(ql0, low4), _mm256_and_si256(ql1, low4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4)};
            for (int k = 0; k < 4; k++) {
                __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), low2);
                __m256i q = _mm256_or_si256(lows[k], _mm256_slli_epi16(high, 4));
                __m256i p = _mm256_maddubs_epi16(q, load32(a + 4 + 128 * h + 32 * k));
                int g = 8 * h + 2 * k; /* the two 16-element groups of these 32 elements */
                __m256i scales = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scales));
            }
        }
        isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(32 * offset, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w + 208) * em_load_f32(a)), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

/* Q5_K: Q4_K plus a fifth bit per element (bit s of byte j of qh for sub-block s). */
EM_AVX2 static float dot_q5_k(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    float mins_total = 0;
    const __m256i low4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (uint64_t b = 0; b < n / 256; b++, w += 176, a += 292) {
        float d8 = em_load_f32(a);
        int sc[8], mn[8], mins = 0;
        for (int sub = 0; sub < 8; sub++) {
            em_quant_k_scale_min(w + 4, sub, &sc[sub], &mn[sub]);
            mins += mn[sub] * ((int16_t)em_load_u16(a + 260 + 4 * sub) + (int16_t)em_load_u16(a + 262 + 4 * sub));
        }
        mins_total += fp16(w + 2) * d8 * (float)mins;
        __m256i qh = load32(w + 16), isum = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = load32(w + 48 + 32 * c);
            __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4);
            __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q, low4), hlo);
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4), hhi);
            __m256i plo = _mm256_maddubs_epi16(lo, load32(a + 4 + 64 * c));
            __m256i phi = _mm256_maddubs_epi16(hi, load32(a + 36 + 64 * c));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(plo, _mm256_set1_epi16((int16_t)sc[2 * c])));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(phi, _mm256_set1_epi16((int16_t)sc[2 * c + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w) * d8), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc) - mins_total;
}

/* Q2_K: unsigned 2-bit levels; per 16 elements d * scale * sum(q * a) - dmin * min * sum(a). */
EM_AVX2 static float dot_q2_k(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    float mins_total = 0;
    const __m256i low2 = _mm256_set1_epi8(3);
    for (uint64_t b = 0; b < n / 256; b++, w += 84, a += 292) {
        float d8 = em_load_f32(a);
        int mins = 0;
        for (int g = 0; g < 16; g++) mins += (w[g] >> 4) * (int16_t)em_load_u16(a + 260 + 2 * g);
        mins_total += fp16(w + 82) * d8 * (float)mins;
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i qs = load32(w + 16 + 32 * h);
            for (int k = 0; k < 4; k++) {
                __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), low2);
                __m256i p = _mm256_maddubs_epi16(q, load32(a + 4 + 128 * h + 32 * k));
                int g = 8 * h + 2 * k;
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, pair_scales(w[g] & 15, w[g + 1] & 15)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w + 80) * d8), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc) - mins_total;
}

/* Q3_K: level u = low | high << 2 in 0..7 stands for u - 4; the -4 comes back through the group
 * sums of the activations. */
EM_AVX2 static float dot_q3_k(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    const __m256i low2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    for (uint64_t b = 0; b < n / 256; b++, w += 110, a += 292) {
        int scales[16], offset = 0;
        q3_k_scales(w, scales);
        for (int g = 0; g < 16; g++) offset += scales[g] * (int16_t)em_load_u16(a + 260 + 2 * g);
        __m256i hmask = load32(w), isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i qs = load32(w + 32 + 32 * h);
            for (int k = 0; k < 4; k++) {
                __m256i high = _mm256_and_si256(_mm256_srli_epi16(hmask, 4 * h + k), one);
                __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), low2), _mm256_slli_epi16(high, 2));
                __m256i p = _mm256_maddubs_epi16(q, load32(a + 4 + 128 * h + 32 * k));
                int g = 8 * h + 2 * k;
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, pair_scales(scales[g], scales[g + 1])));
            }
        }
        isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(4 * offset, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w + 108) * em_load_f32(a)), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

EM_AVX2 static float dot_iq4_nl(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    const __m256i table = level_table(em_iq4nl_values);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += 18, a += 34) {
        __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles(w + 2));
        __m256i isum = dot_i8_i8(q, load32(a + 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w) * fp16(a)), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

EM_AVX2 static float dot_mxfp4(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    const __m256i table = level_table(em_mxfp4_values);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += 17, a += 34) {
        __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles(w + 1));
        __m256i isum = dot_i8_i8(q, load32(a + 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(em_e8m0_half(w[0]) * fp16(a)), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

EM_AVX2 static float dot_iq4_xs(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    const __m256i table = level_table(em_iq4nl_values);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 256; b++, w += 136, a += 292) {
        uint16_t scales_h = em_load_u16(w + 2);
        __m256i isum = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            int scale = (((w[4 + s / 2] >> (4 * (s % 2))) & 15) | (((scales_h >> (2 * s)) & 3) << 4)) - 32;
            __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles(w + 8 + 16 * s));
            __m256i p = dot_i8_i8(q, load32(a + 4 + 32 * s));
            isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(p, _mm256_set1_epi32(scale)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w) * em_load_f32(a)), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

/* IQ3_XXS: per 32 elements, eight grid points (4 magnitudes each) and four 8-sign groups; the
 * signs go onto the activations, the magnitudes (at most 62) are the unsigned operand. The scale
 * d * (0.5 + s) / 2 is applied as the integer (2s + 1) and a final d / 4. */
EM_AVX2 static float dot_iq3_xxs(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 256; b++, w += 98, a += 292) {
        __m256i isum = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux = em_load_u32(w + 66 + 4 * ib);
            __m256i mag = iq3xxs_magnitudes(w + 2 + 8 * ib), sign = iq3xxs_signs(aux);
            __m256i q8 = _mm256_sign_epi8(load32(a + 4 + 32 * ib), sign);
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(mag, q8), _mm256_set1_epi16((int16_t)(2 * (aux >> 28) + 1)));
            isum = _mm256_add_epi32(isum, p);
        }
        float d = fp16(w) * em_load_f32(a) * 0.25f;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

/* AVX2 and FMA through the compiler's CPU model (which also checks that the OS saves the YMM
 * registers); F16C straight from CPUID leaf 1, since not every compiler's builtin knows its name.
 * CPUID is slow (a virtual machine traps it), so the answer is probed once and kept: the module's
 * only static state, write-once and the same for every thread (a race only repeats the probe). */
bool em_quant_x86_has_avx2(void) {
    static _Atomic int known; /* 0: not probed yet, 1: absent, 2: present */
    int state = atomic_load_explicit(&known, memory_order_relaxed);
    if (state == 0) {
        unsigned eax, ebx, ecx, edx;
        __builtin_cpu_init();
        bool present = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                       __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
        state = present ? 2 : 1;
        atomic_store_explicit(&known, state, memory_order_relaxed);
    }
    return state == 2;
}

em_dot_fn em_quant_dot_x86(uint32_t weight_type) {
    if (!em_quant_x86_has_avx2()) return NULL;
    switch (weight_type) {
    case EM_TYPE_F32: return dot_f32;
    case EM_TYPE_F16: return dot_f16;
    case EM_TYPE_BF16: return dot_bf16;
    case EM_TYPE_Q8_0: return dot_q8_0;
    case EM_TYPE_Q4_0: return dot_q4_0;
    case EM_TYPE_Q4_K: return dot_q4_k;
    case EM_TYPE_Q6_K: return dot_q6_k;
    case EM_TYPE_IQ3_XXS: return dot_iq3_xxs;
    case EM_TYPE_Q5_K: return dot_q5_k;
    case EM_TYPE_Q3_K: return dot_q3_k;
    case EM_TYPE_Q2_K: return dot_q2_k;
    case EM_TYPE_IQ4_NL: return dot_iq4_nl;
    case EM_TYPE_IQ4_XS: return dot_iq4_xs;
    case EM_TYPE_MXFP4: { /* AVX-512 where the VNNI kernels run: the scalar path's bits */
        const em_dot_fn avx512 = em_quant_dot_mxfp4_avx512();
        return avx512 ? avx512 : dot_mxfp4;
    }
    case EM_TYPE_Q4_1: return dot_q4_1;
    case EM_TYPE_Q5_0: return dot_q5_0;
    case EM_TYPE_Q5_1: return dot_q5_1;
    default: return NULL;
    }
}

#else

em_dot_fn em_quant_dot_x86(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

#endif
