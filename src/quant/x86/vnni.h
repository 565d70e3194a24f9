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

#endif
