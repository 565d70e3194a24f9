/* Helpers of the AVX-512 VNNI kernels (dot_rows_vnni.c: several activation rows a weight row;
 * dot_group_vnni.c: packed token groups), compiled for that target by EM_VNNI. x86 only. */
#ifndef EMBER_QUANT_X86_VNNI_H
#define EMBER_QUANT_X86_VNNI_H

#include "avx2.h"

#define EM_VNNI __attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni")))

/* The lower and upper 256-bit halves of 16 int32 lanes added: lane i of the result is lane i plus
 * lane i + 8. */
EM_VNNI static EM_INLINE __m256i fold_halves(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* Lanes 0..7 hold `first`, lanes 8..15 `first + 1`: a permutation index that spreads lane `first` of
 * a vector over the lower half and lane `first + 1` over the upper. */
EM_VNNI static EM_INLINE __m512i pair_index(int first) {
    return _mm512_mask_blend_epi32(0xff00, _mm512_set1_epi32(first), _mm512_set1_epi32(first + 1));
}

/* The upper eight f32 lanes (AVX512F alone has no 32x8 extract; the 64x4 one moves the same bits). */
EM_VNNI static EM_INLINE __m256 upper_ps(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* The sixteen grid points of two IQ3_XXS runs (their indices: 16 bytes at q), loaded one by one
 * from the table, four to a 128-bit lane. A lookup in the table held in 16 registers (vpermt2d
 * within pairs of registers, then three blends by index bits 5..7) measured slower at every row
 * count up to eight, and in the group kernel: its 19 shuffles and blends per 64 weights all wait on
 * the shuffle ports, where these 16 loads and 12 inserts spread over the load ports too
 * (bench/dot_rows.c, bench/prefill_kernels.c). */
EM_VNNI static EM_INLINE __m512i iq3xxs_grid_points(const uint8_t *q) {
    const uint32_t *g = em_iq3xxs_grid;
    __m128i lane[4];
    for (int k = 0; k < 4; k++) {
        const uint8_t *p = q + 4 * k;
        lane[k] = _mm_insert_epi32(
            _mm_insert_epi32(_mm_insert_epi32(_mm_cvtsi32_si128((int)g[p[0]]), (int)g[p[1]], 1), (int)g[p[2]], 2),
            (int)g[p[3]], 3);
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(lane[1], lane[0])),
                              _mm256_set_m128i(lane[3], lane[2]), 1);
}

/* The signs of two IQ3_XXS runs as a mask, bit j for element j (iq3xxs_sign_bits of each run): pdep
 * spreads the eight 7-bit groups over the low bits of eight bytes, and each byte's top bit is the
 * parity of its seven. */
EM_VNNI static EM_INLINE uint64_t iq3xxs_sign_mask(uint32_t aux0, uint32_t aux1) {
    const uint64_t groups = (aux0 & 0x0fffffffu) | (uint64_t)(aux1 & 0x0fffffffu) << 28;
    uint64_t signs = _pdep_u64(groups, 0x7f7f7f7f7f7f7f7full);
    uint64_t parity = signs ^ (signs >> 4);
    parity ^= parity >> 2;
    parity ^= parity >> 1;
    return signs | (parity & 0x0101010101010101ull) << 7;
}

#endif
