/*
 * Q8_K quantization of activations with AVX-512 (where the VNNI kernels run): every batched product
 * with K-format weights quantizes its activations through here. The same levels, scale and group
 * sums as kquants.c's em_quantize_q8_k_portable, bitwise: the largest magnitude (a maximum, exact in
 * any order), its first element, iscale = -127 / that element, and each level iscale * x rounded
 * half away from zero by hand (truncation, then one step outward when the exact remainder reaches a
 * half) and capped at 127. A block holding NaN or an infinity, or whose iscale is not finite, goes
 * to the portable code whole.
 */
#include "dot_x86.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define EM_AVX512BW __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl")))

EM_AVX512BW static void quantize_q8_k_avx512(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 292) {
        __m512 amax = _mm512_setzero_ps();
        __mmask16 not_number = 0;
        for (int j = 0; j < 256; j += 16) {
            const __m512 v = _mm512_loadu_ps(x + j);
            amax = _mm512_max_ps(_mm512_abs_ps(v), amax);
            not_number |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        }
        const float largest = _mm512_reduce_max_ps(amax);
        if (not_number || !isfinite(largest)) {
            em_quantize_q8_k_portable(x, out, 1);
            continue;
        }
        if (largest == 0) {
            memset(out, 0, 292);
            continue;
        }
        float max = 0; /* the first element of that magnitude */
        const __m512 target = _mm512_set1_ps(largest);
        for (int j = 0; j < 256; j += 16) {
            const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)), target, _CMP_EQ_OQ);
            if (hit) {
                max = x[j + __builtin_ctz(hit)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        if (!isfinite(iscale)) {
            em_quantize_q8_k_portable(x, out, 1);
            continue;
        }
        const float d = 1.0f / iscale;
        memcpy(out, &d, 4);
        const __m512 scale = _mm512_set1_ps(iscale), half = _mm512_set1_ps(0.5f), minus_half = _mm512_set1_ps(-0.5f);
        const __m512i one = _mm512_set1_epi32(1), top = _mm512_set1_epi32(127);
        for (int g = 0; g < 16; g++) {
            const __m512 v = _mm512_mul_ps(scale, _mm512_loadu_ps(x + 16 * g));
            __m512i level = _mm512_cvttps_epi32(v);
            const __m512 rest = _mm512_sub_ps(v, _mm512_cvtepi32_ps(level));
            level = _mm512_mask_add_epi32(level, _mm512_cmp_ps_mask(rest, half, _CMP_GE_OQ), level, one);
            level = _mm512_mask_sub_epi32(level, _mm512_cmp_ps_mask(rest, minus_half, _CMP_LE_OQ), level, one);
            level = _mm512_min_epi32(level, top);
            _mm_storeu_si128((__m128i *)(void *)(out + 4 + 16 * g), _mm512_cvtepi32_epi8(level));
            const int sum = _mm512_reduce_add_epi32(level);
            em_store_u16(out + 260 + 2 * g, (uint16_t)(int16_t)sum);
        }
    }
}

em_block_quantize_fn em_quant_q8_k_x86(void) { return em_quant_x86_has_vnni() ? quantize_q8_k_avx512 : NULL; }

#else

em_block_quantize_fn em_quant_q8_k_x86(void) { return NULL; }

#endif
