/*
 * NEON dot products, written once and compiled twice: dot_neon.c includes this file with
 * EM_NEON_DOTPROD 0 (plain NEON: widening multiplies and pairwise adds, any ARMv8-A CPU) and
 * dot_dotprod.c with EM_NEON_DOTPROD 1 under the dot-product target (SDOT: four products summed per
 * lane in one instruction, ARMv8.2-A and later where the CPU reports it). KERNEL(name) gives each
 * copy its own names.
 *
 * Types: F32, F16, BF16 (f32 activations); Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (Q8_0
 * activations); Q2_K..Q6_K, IQ4_XS, IQ3_XXS (Q8_K activations): those the x86 kernels cover. Every
 * kernel takes one weight row against one to four activation rows: a weight block is unpacked
 * once (levels, scales, signs) and applied to each row. The single-row kernel is the same code
 * with one row. The 8-bit matrix multiply (i8mm's SMMLA) is not used: it multiplies two rows of
 * each operand, and these kernels have one weight row.
 *
 * Each row's arithmetic is the scalar path's (dot.c, dot_scalar.c) step for step: the same integer
 * sum per block or sub-block (integer addition is exact, so SDOT's and the pairwise adds' order of
 * summing is free), then the same f32 expressions in the same order, block by block, into one f32
 * sum. The float formats keep the scalar path's eight partial sums as the eight lanes of two
 * vectors, each product rounded before it is added (the project builds as ISO C, where GCC fuses
 * no multiply-add, in either path). The results are bitwise equal to em_dot_scalar's, which
 * tests/test_quant.c asserts on ARM (and so would catch a compiler that fused).
 */
#ifndef KERNEL
#error "kernels.h is included by dot_neon.c and dot_dotprod.c only"
#endif

#include <arm_neon.h>

/* The per-row loops must unroll fully (the row count is a constant in every inlined copy) so the
 * per-row sums live in registers. */
#define UNROLL_ROWS EM_UNROLL(4)

/* The most activation rows one kernel call takes. */
#define ROWS_MAX 4

/* acc plus the products of 16 signed bytes w and a, summed four to a lane. */
static EM_INLINE int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t a) {
#if EM_NEON_DOTPROD
    return vdotq_s32(acc, w, a);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w), vget_low_s8(a)));
    return vpadalq_s16(acc, vmull_high_s8(w, a));
#endif
}

/* Sum of 32 products: w[0..1] (32 levels) with the 32 activations at a. */
static EM_INLINE int32x4_t dot32(const int8x16_t *w, const uint8_t *a) {
    int32x4_t s = dot16(vdupq_n_s32(0), w[0], vld1q_s8((const int8_t *)a));
    return dot16(s, w[1], vld1q_s8((const int8_t *)a + 16));
}

/* Low and high nibbles of 16 bytes as levels 0..15. */
static EM_INLINE int8x16_t low_nibbles(uint8x16_t q) { return vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))); }
static EM_INLINE int8x16_t high_nibbles(uint8x16_t q) { return vreinterpretq_s8_u8(vshrq_n_u8(q, 4)); }

/* Q8_K stores the sum of each 16 activations as an int16 at offset 260 of its block. */
static EM_INLINE int q8_k_group_sum(const uint8_t *a, int g) { return (int16_t)em_load_u16(a + 260 + 2 * g); }

/* ---- float weights with f32 activations ---- */

enum { FLOAT_F32, FLOAT_F16, FLOAT_BF16 };

/* Four weights from element offset j as f32 (every conversion here is exact). */
static EM_INLINE float32x4_t float_weights4(const uint8_t *w, uint64_t j, const int kind) {
    switch (kind) {
    case FLOAT_F16: return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(w + 2 * j)));
    case FLOAT_BF16: return vreinterpretq_f32_u32(vshll_n_u16(vreinterpret_u16_u8(vld1_u8(w + 2 * j)), 16));
    default: return vreinterpretq_f32_u8(vld1q_u8(w + 4 * j));
    }
}

static EM_INLINE float float_weight(const uint8_t *w, uint64_t j, const int kind) {
    switch (kind) {
    case FLOAT_F16: return em_load_fp16(w + 2 * j);
    case FLOAT_BF16: return em_load_bf16(w + 2 * j);
    default: return em_load_f32(w + 4 * j);
    }
}

/* Lanes 0..3 of lo and hi are the scalar path's partial sums acc[0..3] and acc[4..7]. */
static EM_INLINE void float_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, const int nr, uint64_t n,
                                 float *out, const int kind) {
    float32x4_t lo[ROWS_MAX], hi[ROWS_MAX];
    UNROLL_ROWS for (int r = 0; r < nr; r++) lo[r] = hi[r] = vdupq_n_f32(0);
    uint64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        float32x4_t w0 = float_weights4(w, j, kind), w1 = float_weights4(w, j + 4, kind);
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const float *ar = (const float *)(a + r * stride) + j;
            lo[r] = vaddq_f32(lo[r], vmulq_f32(w0, vld1q_f32(ar)));
            hi[r] = vaddq_f32(hi[r], vmulq_f32(w1, vld1q_f32(ar + 4)));
        }
    }
    for (int r = 0; r < nr; r++) {
        const float *ar = (const float *)(a + r * stride);
        float acc[8], sum = 0;
        vst1q_f32(acc, lo[r]);
        vst1q_f32(acc + 4, hi[r]);
        for (int k = 0; k < 8; k++) sum += acc[k];
        for (uint64_t t = j; t < n; t++) sum += float_weight(w, t, kind) * ar[t];
        out[r] = sum;
    }
}

/* ---- the 32-element formats with Q8_0 activations: one scale and 32 levels a block ---- */

/* 0xff in byte j where bit j of the 16 bits first | second << 8 is set. */
static EM_INLINE uint8x16_t bit_masks16(uint8_t first, uint8_t second) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    return vtstq_u8(vcombine_u8(vdup_n_u8(first), vdup_n_u8(second)), vld1q_u8(bit));
}

/* Q5_0 / Q5_1 levels: 16 nibbles, plus 16 where bit j of the 16 bits at qh is set. */
static EM_INLINE int8x16_t with_fifth_bits(int8x16_t nibbles, const uint8_t *qh) {
    uint8x16_t fifth = vandq_u8(bit_masks16(qh[0], qh[1]), vdupq_n_u8(16));
    return vorrq_s8(nibbles, vreinterpretq_s8_u8(fifth));
}

enum { B32_Q8_0, B32_Q4_0, B32_Q4_1, B32_Q5_0, B32_Q5_1, B32_IQ4_NL, B32_MXFP4 };

/* Symmetric formats: sum += scale * d8 * sum(q * a); affine ones (Q4_1, Q5_1, levels unsigned):
 * sum += d * d8 * sum(q * a) + m * d8 * sum(a), as dot.c and dot_scalar.c write them. */
static EM_INLINE void block32_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, const int nr, uint64_t n,
                                   float *out, const int kind) {
    static const uint64_t block_bytes[] = {34, 18, 20, 22, 24, 18, 17};
    const bool affine = kind == B32_Q4_1 || kind == B32_Q5_1;
    const int8x16_t table = vld1q_s8(kind == B32_MXFP4 ? em_mxfp4_values : em_iq4nl_values);
    float sum[ROWS_MAX] = {0};
    for (uint64_t b = 0; b < n / 32; b++, w += block_bytes[kind], a += 34) {
        int8x16_t q[2];
        if (kind == B32_Q8_0) {
            q[0] = vld1q_s8((const int8_t *)w + 2);
            q[1] = vld1q_s8((const int8_t *)w + 18);
        } else {
            /* where the nibbles start: after the scale(s) and the fifth bits */
            static const int nibbles_at[] = {0, 2, 4, 6, 8, 2, 1};
            uint8x16_t bytes = vld1q_u8(w + nibbles_at[kind]);
            q[0] = low_nibbles(bytes);
            q[1] = high_nibbles(bytes);
            switch (kind) {
            case B32_Q4_0:
                q[0] = vsubq_s8(q[0], vdupq_n_s8(8));
                q[1] = vsubq_s8(q[1], vdupq_n_s8(8));
                break;
            case B32_Q5_0:
                q[0] = vsubq_s8(with_fifth_bits(q[0], w + 2), vdupq_n_s8(16));
                q[1] = vsubq_s8(with_fifth_bits(q[1], w + 4), vdupq_n_s8(16));
                break;
            case B32_Q5_1:
                q[0] = with_fifth_bits(q[0], w + 4);
                q[1] = with_fifth_bits(q[1], w + 6);
                break;
            case B32_IQ4_NL:
            case B32_MXFP4:
                q[0] = vqtbl1q_s8(table, vreinterpretq_u8_s8(q[0]));
                q[1] = vqtbl1q_s8(table, vreinterpretq_u8_s8(q[1]));
                break;
            default: break;
            }
        }
        float dw = kind == B32_MXFP4 ? em_e8m0_half(w[0]) : em_load_fp16(w);
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const uint8_t *ar = a + r * stride;
            int qa = vaddvq_s32(dot32(q, ar + 2));
            if (affine) {
                int8x16_t a0 = vld1q_s8((const int8_t *)ar + 2), a1 = vld1q_s8((const int8_t *)ar + 18);
                int sa = vaddlvq_s8(a0) + vaddlvq_s8(a1);
                float d8 = em_load_fp16(ar);
                sum[r] += dw * d8 * (float)qa + em_load_fp16(w + 2) * d8 * (float)sa;
            } else {
                sum[r] += dw * em_load_fp16(ar) * (float)qa;
            }
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

/* ---- Q4_K and Q5_K: eight 32-element sub-blocks, six-bit scales and mins ---- */

/* Per block: d * sum(scale * q.a) - dmin * sum(min * sum a), as the scalar paths write it. */
static EM_INLINE void q45_k_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, const int nr, uint64_t n,
                                 float *out, const bool q5) {
    const uint64_t block_bytes = q5 ? 176 : 144;
    float sum[ROWS_MAX] = {0};
    for (uint64_t b = 0; b < n / 256; b++, w += block_bytes, a += 292) {
        int sc[8], mn[8];
        for (int sub = 0; sub < 8; sub++) em_quant_k_scale_min(w + 4, sub, &sc[sub], &mn[sub]);
        /* levels of sub-block s in q[2s], q[2s + 1]: sub-block 2c the low nibbles of the 32 bytes
         * at c, 2c + 1 their high nibbles; Q5_K adds bit s of qh[j] as 16 */
        int8x16_t q[16];
        const uint8_t *qs = w + (q5 ? 48 : 16);
        uint8x16_t qh[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
        if (q5) qh[0] = vld1q_u8(w + 16), qh[1] = vld1q_u8(w + 32);
        for (int c = 0; c < 4; c++) {
            for (int half = 0; half < 2; half++) {
                uint8x16_t bytes = vld1q_u8(qs + 32 * c + 16 * half);
                int8x16_t lo = low_nibbles(bytes), hi = high_nibbles(bytes);
                if (q5) {
                    uint8x16_t bits = qh[half], sixteen = vdupq_n_u8(16);
                    /* bit s moved to bit 4: shift left by 4 - s or right by s - 4 */
                    uint8x16_t hlo = vandq_u8(vshlq_u8(bits, vdupq_n_s8((int8_t)(4 - 2 * c))), sixteen);
                    uint8x16_t hhi = vandq_u8(vshlq_u8(bits, vdupq_n_s8((int8_t)(3 - 2 * c))), sixteen);
                    lo = vorrq_s8(lo, vreinterpretq_s8_u8(hlo));
                    hi = vorrq_s8(hi, vreinterpretq_s8_u8(hhi));
                }
                q[4 * c + half] = lo;
                q[4 * c + 2 + half] = hi;
            }
        }
        float dw = em_load_fp16(w), dmw = em_load_fp16(w + 2);
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const uint8_t *ar = a + r * stride;
            int32x4_t scaled = vdupq_n_s32(0);
            int mins = 0;
            for (int sub = 0; sub < 8; sub++) {
                scaled = vmlaq_n_s32(scaled, dot32(q + 2 * sub, ar + 4 + 32 * sub), sc[sub]);
                mins += mn[sub] * (q8_k_group_sum(ar, 2 * sub) + q8_k_group_sum(ar, 2 * sub + 1));
            }
            float d8 = em_load_f32(ar);
            if (q5) {
                sum[r] += dw * d8 * (float)vaddvq_s32(scaled) - dmw * d8 * (float)mins;
            } else {
                float d = dw * d8, dmin = dmw * d8;
                sum[r] += d * (float)vaddvq_s32(scaled) - dmin * (float)mins;
            }
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

/* ---- Q6_K: sixteen 16-element groups, signed eight-bit scales, levels 0..63 less 32 ---- */

static EM_INLINE void q6_k_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, const int nr, uint64_t n,
                                float *out) {
    float sum[ROWS_MAX] = {0};
    for (uint64_t b = 0; b < n / 256; b++, w += 210, a += 292) {
        const int8_t *sc = (const int8_t *)(w + 192);
        /* group g = 8h + 2k + (j >= 16) of half h: low nibbles (k < 2) or high nibbles (k >= 2) of
         * the 32 bytes at ql + 32 * (k % 2), and bit pair k of the 32 bytes of qh */
        int8x16_t q[16];
        for (int h = 0; h < 2; h++) {
            for (int half = 0; half < 2; half++) {
                uint8x16_t qh = vld1q_u8(w + 128 + 32 * h + 16 * half);
                for (int k = 0; k < 4; k++) {
                    uint8x16_t ql = vld1q_u8(w + 64 * h + 32 * (k % 2) + 16 * half);
                    uint8x16_t low = k < 2 ? vandq_u8(ql, vdupq_n_u8(15)) : vshrq_n_u8(ql, 4);
                    uint8x16_t high = vandq_u8(vshlq_u8(qh, vdupq_n_s8((int8_t)(4 - 2 * k))), vdupq_n_u8(48));
                    q[8 * h + 2 * k + half] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, high)), vdupq_n_s8(32));
                }
            }
        }
        float dw = em_load_fp16(w + 208);
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const uint8_t *ar = a + r * stride;
            int32x4_t total = vdupq_n_s32(0);
            for (int g = 0; g < 16; g++) {
                int32x4_t s = dot16(vdupq_n_s32(0), q[g], vld1q_s8((const int8_t *)ar + 4 + 16 * g));
                total = vmlaq_n_s32(total, s, sc[g]);
            }
            sum[r] += dw * em_load_f32(ar) * (float)vaddvq_s32(total);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

/* ---- Q2_K, Q3_K: sixteen 16-element groups of 2-bit levels (Q3_K: a third bit, stored apart) ---- */

/* Q2_K: per block d * sum(scale_g * q.a) - dmin * sum(min_g * sum_g a), levels 0..3. Q3_K: levels
 * (low | high << 2) - 4, six-bit scales less 32, one d. As dot_scalar.c writes them. */
static EM_INLINE void q23_k_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, const int nr, uint64_t n,
                                 float *out, const bool q3) {
    const uint64_t block_bytes = q3 ? 110 : 84;
    float sum[ROWS_MAX] = {0};
    for (uint64_t b = 0; b < n / 256; b++, w += block_bytes, a += 292) {
        /* group g: half g / 8, bit pair (g % 8) / 2 of the 16 bytes at 16 * (g % 2) of the half;
         * Q3_K's third bit: bit g / 2 of the 16 bytes of hmask at 16 * (g % 2) */
        int8x16_t q[16];
        int scale[16], min[16];
        const uint8_t *qs = w + (q3 ? 32 : 16);
        for (int g = 0; g < 16; g++) {
            uint8x16_t bytes = vld1q_u8(qs + 32 * (g / 8) + 16 * (g % 2));
            uint8x16_t low = vandq_u8(vshlq_u8(bytes, vdupq_n_s8((int8_t)-(2 * ((g % 8) / 2)))), vdupq_n_u8(3));
            if (q3) {
                uint8x16_t high = vtstq_u8(vld1q_u8(w + 16 * (g % 2)), vdupq_n_u8((uint8_t)(1u << (g / 2))));
                q[g] = vsubq_s8(vreinterpretq_s8_u8(low), vreinterpretq_s8_u8(vbicq_u8(vdupq_n_u8(4), high)));
                int lo = (w[96 + g % 8] >> (4 * (g / 8))) & 15, hi = (w[104 + g % 4] >> (2 * (g / 4))) & 3;
                scale[g] = (lo | (hi << 4)) - 32;
            } else {
                q[g] = vreinterpretq_s8_u8(low);
                scale[g] = w[g] & 15;
                min[g] = w[g] >> 4;
            }
        }
        float dw = em_load_fp16(w + (q3 ? 108 : 80));
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const uint8_t *ar = a + r * stride;
            int32x4_t scaled = vdupq_n_s32(0);
            for (int g = 0; g < 16; g++) {
                int32x4_t s = dot16(vdupq_n_s32(0), q[g], vld1q_s8((const int8_t *)ar + 4 + 16 * g));
                scaled = vmlaq_n_s32(scaled, s, scale[g]);
            }
            float d8 = em_load_f32(ar);
            if (q3) {
                sum[r] += dw * d8 * (float)vaddvq_s32(scaled);
            } else {
                int mins = 0;
                for (int g = 0; g < 16; g++) mins += min[g] * q8_k_group_sum(ar, g);
                sum[r] += dw * d8 * (float)vaddvq_s32(scaled) - em_load_fp16(w + 82) * d8 * (float)mins;
            }
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

/* ---- IQ4_XS: eight 32-element sub-blocks of IQ4_NL levels, six-bit scales less 32 ---- */

static EM_INLINE void iq4_xs_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, const int nr, uint64_t n,
                                  float *out) {
    const int8x16_t table = vld1q_s8(em_iq4nl_values);
    float sum[ROWS_MAX] = {0};
    for (uint64_t b = 0; b < n / 256; b++, w += 136, a += 292) {
        int8x16_t q[16];
        int scale[8];
        uint16_t scales_h = em_load_u16(w + 2);
        for (int s = 0; s < 8; s++) {
            uint8x16_t bytes = vld1q_u8(w + 8 + 16 * s);
            q[2 * s] = vqtbl1q_s8(table, vandq_u8(bytes, vdupq_n_u8(15)));
            q[2 * s + 1] = vqtbl1q_s8(table, vshrq_n_u8(bytes, 4));
            scale[s] = (((w[4 + s / 2] >> (4 * (s % 2))) & 15) | (((scales_h >> (2 * s)) & 3) << 4)) - 32;
        }
        float dw = em_load_fp16(w);
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const uint8_t *ar = a + r * stride;
            int32x4_t total = vdupq_n_s32(0);
            for (int s = 0; s < 8; s++) total = vmlaq_n_s32(total, dot32(q + 2 * s, ar + 4 + 32 * s), scale[s]);
            sum[r] += dw * em_load_f32(ar) * (float)vaddvq_s32(total);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

/* ---- IQ3_XXS: per 32 elements eight grid points of four magnitudes, 4 x 7 sign bits, a scale ---- */

static EM_INLINE void iq3_xxs_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, const int nr, uint64_t n,
                                   float *out) {
    float sum[ROWS_MAX] = {0};
    for (uint64_t b = 0; b < n / 256; b++, w += 98, a += 292) {
        /* signed levels (magnitudes at most 62, so they fit a byte) and the integer (2s + 1) of the
         * scale d * (0.5 + s) / 2, whose d / 4 is applied once per block */
        int8x16_t q[16];
        int scale[8];
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux = em_load_u32(w + 66 + 4 * ib), points[8];
            for (int p = 0; p < 8; p++) points[p] = em_iq3xxs_grid[w[2 + 8 * ib + p]];
            for (int half = 0; half < 2; half++) {
                uint8x16_t mag = vreinterpretq_u8_u32(vld1q_u32(points + 4 * half));
                uint8x16_t neg = bit_masks16(em_iq_signs8(aux >> (14 * half)), em_iq_signs8(aux >> (14 * half + 7)));
                /* (m ^ mask) - mask negates where the mask is all ones */
                q[2 * ib + half] = vreinterpretq_s8_u8(vsubq_u8(veorq_u8(mag, neg), neg));
            }
            scale[ib] = (int)(2 * (aux >> 28) + 1);
        }
        float dw = em_load_fp16(w);
        UNROLL_ROWS for (int r = 0; r < nr; r++) {
            const uint8_t *ar = a + r * stride;
            int32x4_t total = vdupq_n_s32(0);
            for (int ib = 0; ib < 8; ib++) total = vmlaq_n_s32(total, dot32(q + 2 * ib, ar + 4 + 32 * ib), scale[ib]);
            sum[r] += dw * em_load_f32(ar) * 0.25f * (float)vaddvq_s32(total);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

/* ---- entry points: one row (em_dot_fn) and any number of rows in groups of four ---- */

#define NEON_ENTRY(name, call)                                                                                     \
    static float KERNEL(dot_##name)(const void *wv, const void *av, uint64_t n) {                                  \
        const uint8_t *w = wv, *a = av;                                                                            \
        const uint64_t stride = 0;                                                                                 \
        float result;                                                                                              \
        float *out = &result;                                                                                      \
        const int nr = 1;                                                                                          \
        call;                                                                                                      \
        return result;                                                                                             \
    }                                                                                                              \
    static void KERNEL(rows_##name)(const void *wv, const void *av, uint64_t stride, uint32_t n_rows, uint64_t n,  \
                                    float *out_rows) {                                                             \
        const uint8_t *w = wv;                                                                                     \
        for (uint32_t t = 0; t < n_rows;) {                                                                        \
            const uint8_t *a = (const uint8_t *)av + t * stride;                                                   \
            float *out = out_rows + t;                                                                             \
            uint32_t left = n_rows - t;                                                                            \
            if (left >= 4) {                                                                                       \
                const int nr = 4;                                                                                  \
                call;                                                                                              \
            } else if (left == 3) {                                                                                \
                const int nr = 3;                                                                                  \
                call;                                                                                              \
            } else if (left == 2) {                                                                                \
                const int nr = 2;                                                                                  \
                call;                                                                                              \
            } else {                                                                                               \
                const int nr = 1;                                                                                  \
                call;                                                                                              \
            }                                                                                                      \
            t += left >= 4 ? 4 : left;                                                                             \
        }                                                                                                          \
    }

NEON_ENTRY(f32, float_rows(w, a, stride, nr, n, out, FLOAT_F32))
NEON_ENTRY(f16, float_rows(w, a, stride, nr, n, out, FLOAT_F16))
NEON_ENTRY(bf16, float_rows(w, a, stride, nr, n, out, FLOAT_BF16))
NEON_ENTRY(q8_0, block32_rows(w, a, stride, nr, n, out, B32_Q8_0))
NEON_ENTRY(q4_0, block32_rows(w, a, stride, nr, n, out, B32_Q4_0))
NEON_ENTRY(q4_1, block32_rows(w, a, stride, nr, n, out, B32_Q4_1))
NEON_ENTRY(q5_0, block32_rows(w, a, stride, nr, n, out, B32_Q5_0))
NEON_ENTRY(q5_1, block32_rows(w, a, stride, nr, n, out, B32_Q5_1))
NEON_ENTRY(iq4_nl, block32_rows(w, a, stride, nr, n, out, B32_IQ4_NL))
NEON_ENTRY(mxfp4, block32_rows(w, a, stride, nr, n, out, B32_MXFP4))
NEON_ENTRY(q4_k, q45_k_rows(w, a, stride, nr, n, out, false))
NEON_ENTRY(q5_k, q45_k_rows(w, a, stride, nr, n, out, true))
NEON_ENTRY(q2_k, q23_k_rows(w, a, stride, nr, n, out, false))
NEON_ENTRY(q3_k, q23_k_rows(w, a, stride, nr, n, out, true))
NEON_ENTRY(iq4_xs, iq4_xs_rows(w, a, stride, nr, n, out))
NEON_ENTRY(q6_k, q6_k_rows(w, a, stride, nr, n, out))
NEON_ENTRY(iq3_xxs, iq3_xxs_rows(w, a, stride, nr, n, out))

#define NEON_TYPES(X)                                                                                              \
    X(EM_TYPE_F32, f32)                                                                                            \
    X(EM_TYPE_F16, f16)                                                                                            \
    X(EM_TYPE_BF16, bf16)                                                                                          \
    X(EM_TYPE_Q8_0, q8_0)                                                                                          \
    X(EM_TYPE_Q4_0, q4_0)                                                                                          \
    X(EM_TYPE_Q4_1, q4_1)                                                                                          \
    X(EM_TYPE_Q5_0, q5_0)                                                                                          \
    X(EM_TYPE_Q5_1, q5_1)                                                                                          \
    X(EM_TYPE_IQ4_NL, iq4_nl)                                                                                      \
    X(EM_TYPE_MXFP4, mxfp4)                                                                                        \
    X(EM_TYPE_Q2_K, q2_k)                                                                                          \
    X(EM_TYPE_Q3_K, q3_k)                                                                                          \
    X(EM_TYPE_Q4_K, q4_k)                                                                                          \
    X(EM_TYPE_Q5_K, q5_k)                                                                                          \
    X(EM_TYPE_Q6_K, q6_k)                                                                                          \
    X(EM_TYPE_IQ4_XS, iq4_xs)                                                                                      \
    X(EM_TYPE_IQ3_XXS, iq3_xxs)

em_dot_fn KERNEL(em_quant_dot)(uint32_t weight_type) {
    switch (weight_type) {
#define SINGLE_CASE(type, name)                                                                                    \
    case type: return KERNEL(dot_##name);
        NEON_TYPES(SINGLE_CASE)
#undef SINGLE_CASE
    default: return NULL;
    }
}

em_dot_rows_fn KERNEL(em_quant_dot_rows)(uint32_t weight_type) {
    switch (weight_type) {
#define ROWS_CASE(type, name)                                                                                      \
    case type: return KERNEL(rows_##name);
        NEON_TYPES(ROWS_CASE)
#undef ROWS_CASE
    default: return NULL;
    }
}
