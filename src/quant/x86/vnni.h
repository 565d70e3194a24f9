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

/* The sixteen grid points of two IQ3_XXS runs (their indices: 16 bytes at q), looked up in the
 * 256-entry grid held in 16 registers: vpermt2d picks within each 32-entry pair of registers (index
 * bits 0..4), and bits 5, 6 and 7 choose among the eight pairs' picks. No gather, no scalar loads. */
EM_VNNI static EM_INLINE __m512i iq3xxs_grid_points(const __m512i grid[16], const uint8_t *q) {
    const __m512i index = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    __m512i pick[8];
    for (int k = 0; k < 8; k++) pick[k] = _mm512_permutex2var_epi32(grid[2 * k], index, grid[2 * k + 1]);
    const __mmask16 bit5 = _mm512_test_epi32_mask(index, _mm512_set1_epi32(32));
    const __mmask16 bit6 = _mm512_test_epi32_mask(index, _mm512_set1_epi32(64));
    const __mmask16 bit7 = _mm512_test_epi32_mask(index, _mm512_set1_epi32(128));
    for (int k = 0; k < 4; k++) pick[k] = _mm512_mask_blend_epi32(bit5, pick[2 * k], pick[2 * k + 1]);
    for (int k = 0; k < 2; k++) pick[k] = _mm512_mask_blend_epi32(bit6, pick[2 * k], pick[2 * k + 1]);
    return _mm512_mask_blend_epi32(bit7, pick[0], pick[1]);
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
