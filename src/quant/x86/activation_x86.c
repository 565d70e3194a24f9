/*
 * em_f32_softmax and em_f32_silu_mul with AVX-512F or AVX2 + FMA: attention's softmax over a row
 * of scores, and SwiGLU's gated unit. Each lane takes em_expf's steps (activation.c) in its order,
 * with the same fused multiply-adds and roundings, and the softmax keeps its sixteen partial sums in
 * one register (AVX-512) or two (AVX2): the results are the scalar code's bitwise, which
 * tests/test_quant.c asserts on both paths.
 */
#include "dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define EM_AVX512F __attribute__((target("avx2,fma,avx512f")))
#define EM_AVX2_FMA __attribute__((target("avx2,fma")))

EM_AVX512F static EM_INLINE __m512 exp16(__m512 x) {
    const __m512 max = _mm512_set1_ps(EM_EXPF_MAX), min = _mm512_set1_ps(EM_EXPF_MIN);
    /* out-of-range lanes are computed on a clamped value and replaced at the end */
    const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, min), max);
    const __m512 n =
        _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(EM_EXPF_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EM_EXPF_LN2_HI), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EM_EXPF_LN2_LO), r);
    __m512 p = _mm512_set1_ps(EM_EXPF_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EM_EXPF_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EM_EXPF_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EM_EXPF_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EM_EXPF_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EM_EXPF_P5));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    const __m512i k = _mm512_cvtps_epi32(n), half = _mm512_srai_epi32(k, 1), bias = _mm512_set1_epi32(127);
    const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, bias), 23));
    const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(k, half), bias), 23));
    __m512 e = _mm512_mul_ps(_mm512_mul_ps(y, s1), s2);
    e = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, max, _CMP_GT_OQ), e, _mm512_set1_ps(INFINITY));
    e = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, min, _CMP_LT_OQ), e, _mm512_setzero_ps());
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), e, x);
}

EM_AVX2_FMA static EM_INLINE __m256 exp8(__m256 x) {
    const __m256 max = _mm256_set1_ps(EM_EXPF_MAX), min = _mm256_set1_ps(EM_EXPF_MIN);
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, min), max);
    const __m256 n =
        _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(EM_EXPF_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EM_EXPF_LN2_HI), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EM_EXPF_LN2_LO), r);
    __m256 p = _mm256_set1_ps(EM_EXPF_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EM_EXPF_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EM_EXPF_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EM_EXPF_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EM_EXPF_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EM_EXPF_P5));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i k = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(k, 1), bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(k, half), bias), 23));
    __m256 e = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
    e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, max, _CMP_GT_OQ));
    e = _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(x, min, _CMP_LT_OQ));
    return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* The sixteen partial sums folded in halves, as the scalar code folds them: lanes j and j + 8,
 * then j and j + 4, j and j + 2, 0 and 1. */
EM_AVX2_FMA static EM_INLINE float fold16(__m256 low, __m256 high) {
    const __m256 s8 = _mm256_add_ps(low, high);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

EM_AVX512F static void softmax_avx512(float *x, uint64_t n) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (uint64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + i));
    }
    const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 sums = _mm512_setzero_ps();
    for (uint64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), max));
        _mm512_mask_storeu_ps(x + i, m, e);
        sums = _mm512_mask_add_ps(sums, m, sums, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / fold16(_mm512_castps512_ps256(sums),
                                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sums), 1))));
    for (uint64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

EM_AVX512F static void silu_mul_avx512(float *gate, const float *up, uint64_t n) {
    for (uint64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        const __m512 e = exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN))));
        const __m512 h = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(gate + i, m, _mm512_mul_ps(h, _mm512_maskz_loadu_ps(m, up + i)));
    }
}

/* Lanes 0 .. count-1 of eight (count < 8), for maskload / maskstore. */
EM_AVX2_FMA static EM_INLINE __m256i first_lanes(uint64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

EM_AVX2_FMA static void softmax_avx2(float *x, uint64_t n) {
    const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
    __m256 vmax = minus_inf;
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
    if (i < n) {
        const __m256i m = first_lanes(n - i);
        vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(minus_inf, _mm256_maskload_ps(x + i, m), _mm256_castsi256_ps(m)));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const __m256 max = _mm256_set1_ps(_mm_cvtss_f32(m4));
    /* partial sums 0..7 and 8..15: element i goes to half (i / 8) % 2; the absent lanes of the
     * last step add +0, which leaves a sum of exponentials as it is */
    __m256 sums[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (i = 0; i < n; i += 8) {
        const uint64_t count = n - i < 8 ? n - i : 8;
        const __m256i m = count == 8 ? _mm256_set1_epi32(-1) : first_lanes(count);
        __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), max));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(x + i, m, e);
        sums[(i / 8) % 2] = _mm256_add_ps(sums[(i / 8) % 2], e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / fold16(sums[0], sums[1]));
    for (i = 0; i < n; i += 8) {
        const uint64_t count = n - i < 8 ? n - i : 8;
        const __m256i m = count == 8 ? _mm256_set1_epi32(-1) : first_lanes(count);
        _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv));
    }
}

EM_AVX2_FMA static void silu_mul_avx2(float *gate, const float *up, uint64_t n) {
    for (uint64_t i = 0; i < n; i += 8) {
        const uint64_t count = n - i < 8 ? n - i : 8;
        const __m256i m = count == 8 ? _mm256_set1_epi32(-1) : first_lanes(count);
        const __m256 g = _mm256_maskload_ps(gate + i, m);
        const __m256 e = exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
        const __m256 h = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_maskstore_ps(gate + i, m, _mm256_mul_ps(h, _mm256_maskload_ps(up + i, m)));
    }
}

em_softmax_fn em_quant_softmax_x86(void) {
    if (em_quant_x86_has_vnni()) return softmax_avx512;
    if (em_quant_x86_has_avx2()) return softmax_avx2;
    return NULL;
}

em_silu_mul_fn em_quant_silu_mul_x86(void) {
    if (em_quant_x86_has_vnni()) return silu_mul_avx512;
    if (em_quant_x86_has_avx2()) return silu_mul_avx2;
    return NULL;
}

#else

em_softmax_fn em_quant_softmax_x86(void) { return NULL; }

em_silu_mul_fn em_quant_silu_mul_x86(void) { return NULL; }

#endif
