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

#endif
