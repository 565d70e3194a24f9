/* Helpers of the AVX-512 VNNI kernels (dot_rows_vnni.c: several activation rows a weight row;
 * dot_group_vnni.c: packed token groups), compiled for that target by EM_VNNI. x86 only. */
#ifndef EMBER_QUANT_X86_VNNI_H
#define EMBER_QUANT_X86_VNNI_H

#include "avx2.h"

#define EM_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* Q4_K's 8 scales (bytes 0..7) and 8 mins (bytes 8..15) from a block's 12 scale bytes, as in
 * dot_rows_avx2.c's k_scales_mins. */
EM_VNNI static EM_INLINE __m128i k_scales_mins(const uint8_t *s) {
    uint32_t u0 = em_load_u32(s), u1 = em_load_u32(s + 4), u2 = em_load_u32(s + 8);
    uint32_t sc_lo = u0 & 0x3f3f3f3fu, mn_lo = u1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
    uint32_t mn_hi = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
    return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi);
}

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

#endif
