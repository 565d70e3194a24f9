/*
 * Declarations shared by the files of the quant module only (not part of its interface; other
 * modules include quant.h). Byte layouts of the blocks are written as offsets in the functions
 * that read them, because GGUF data need not be aligned for C structs; the little-endian loads
 * below read multi-byte fields from any address.
 */
#ifndef EMBER_QUANT_INTERNAL_H
#define EMBER_QUANT_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

/* Lattice tables (iq_grids.c) and small value tables (dequant.c); see there for the formats. */
extern const uint64_t em_iq2xxs_grid[256];
extern const uint64_t em_iq2xs_grid[512];
extern const uint64_t em_iq2s_grid[1024];
extern const uint32_t em_iq3xxs_grid[256];
extern const uint16_t em_iq3xxs_codes[256];
extern const uint32_t em_iq3s_grid[512];
extern const uint64_t em_iq1s_grid[2048];
extern const int8_t em_iq4nl_values[16];
extern const int8_t em_mxfp4_values[16];

static inline uint16_t em_load_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t em_load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline float em_load_f32(const uint8_t *p) {
    uint32_t bits = em_load_u32(p);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline void em_store_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
/* em_fp16_to_f32, inline for inner loops. Branch-light: a normal half becomes an f32 by shifting
 * its exponent and mantissa into place and scaling by 2^-112 (rebiasing 15 -> 127; inf and NaN
 * stay inf and NaN). A subnormal half m * 2^-24 comes out exactly as (0.5 + m * 2^-24) - 0.5, the
 * mantissa placed under an exponent of 2^-1. */
static inline float em_fp16_decode(uint16_t h) {
    uint32_t w = (uint32_t)h << 16;
    uint32_t sign = w & 0x80000000u;
    uint32_t two_w = w + w; /* exponent and mantissa at the top, sign dropped */
    uint32_t normal_bits = (two_w >> 4) + (0xe0u << 23), subnormal_bits = (two_w >> 17) | (126u << 23);
    float normal, subnormal;
    memcpy(&normal, &normal_bits, 4);
    memcpy(&subnormal, &subnormal_bits, 4);
    normal *= 0x1p-112f;
    subnormal -= 0.5f;
    uint32_t magnitude;
    if (two_w < (1u << 27))
        memcpy(&magnitude, &subnormal, 4);
    else
        memcpy(&magnitude, &normal, 4);
    magnitude |= sign;
    float out;
    memcpy(&out, &magnitude, 4);
    return out;
}
static inline float em_load_fp16(const uint8_t *p) { return em_fp16_decode(em_load_u16(p)); }
static inline float em_load_bf16(const uint8_t *p) {
    uint32_t bits = (uint32_t)em_load_u16(p) << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Sign of element j of an 8-element group whose 7 stored sign bits are `bits7`: the eighth sign
 * is implied by even parity (an even number of negative elements), which is what the ksigns table
 * of the IQ2/IQ3 formats encodes. Returns the 8 sign bits, bit j set = negative. */
static inline uint8_t em_iq_signs8(uint32_t bits7) {
    uint32_t s = bits7 & 127;
    uint32_t folded = (s ^ (s >> 4)) & 15;   /* same parity, 4 bits */
    uint32_t parity = (0x6996u >> folded) & 1; /* bit i of 0x6996 = parity of i */
    return (uint8_t)(s | (parity << 7));
}

/* Value of an E8M0 exponent byte as MXFP4 uses it: 2^(e - 128), i.e. half of 2^(e - 127), so that
 * the doubled E2M1 values of em_mxfp4_values come out right. */
static inline float em_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? (uint32_t)0x00200000 << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Float to int without undefined behaviour on garbage input: NaN gives 0, values beyond +-2^30
 * saturate (every caller clamps to a small range afterwards). */
static inline int em_float_to_int(float r) {
    if (!(r == r)) return 0;
    if (r > 0x1p30f) return 1 << 30;
    if (r < -0x1p30f) return -(1 << 30);
    return (int)r;
}

/* Round half away from zero, like C's roundf, returned as int. */
static inline int em_round_int(float x) { return em_float_to_int(roundf(x)); }

/* Per-type block dequantizer: `n_blocks` blocks into n_blocks * block_elems floats. */
typedef void (*em_dequant_fn)(const uint8_t *blocks, float *out, uint64_t n_blocks);
em_dequant_fn em_quant_dequantizer(uint32_t type);

/* Q4_K / Q5_K scales and mins: 8 six-bit pairs in 12 bytes. Entries 0..3 sit in the low 6 bits of
 * bytes 0..3 (scales) and 4..7 (mins); entries 4..7 take their low nibbles from bytes 8..11 (scale
 * low nibble, min high nibble) and their top 2 bits from the top bits of bytes 0..3 / 4..7. */
static inline void em_quant_k_scale_min(const uint8_t *s, int k, int *scale, int *min) {
    if (k < 4) {
        *scale = s[k] & 63;
        *min = s[k + 4] & 63;
    } else {
        *scale = (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4);
        *min = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
    }
}

/* Integer scalar kernels of the less common formats (dot_scalar.c), or NULL. */
em_dot_fn em_quant_dot_scalar_extra(uint32_t weight_type);

/* Quantizers of the K- and IQ4 formats (kquants.c); same contract as em_quantize's per-type work. */
void em_quantize_q2_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_q3_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_q4_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_q5_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_q6_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_q8_k(const float *x, uint8_t *out, uint64_t n_blocks);
/* em_quantize_q8_k without SIMD (kquants.c): what it runs where x86/quantize_avx512.c does not, and
 * what that code hands its non-finite blocks to. */
void em_quantize_q8_k_portable(const float *x, uint8_t *out, uint64_t n_blocks);
/* A block quantizer: n_blocks blocks of x into out. */
typedef void (*em_block_quantize_fn)(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_iq4_nl(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_iq4_xs(const float *x, uint8_t *out, uint64_t n_blocks);
/* IQ3_XXS needs search tables on the heap, so it can fail (EM_ERR_NOMEM). `importance` (n_blocks * 256
 * values, one per element of the row) or NULL weights its search. */
em_err em_quantize_iq3_xxs(const float *x, uint8_t *out, uint64_t n_blocks, const float *importance);

/* llama.cpp's importance-weighted quantizer of one row of `n` elements (weighted.c) for Q4_0, Q4_1,
 * Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL and IQ4_XS; false (nothing written) for other types. */
bool em_quant_weighted_row(uint32_t type, const float *x, const float *importance, uint8_t *out, uint64_t n);

/* em_expf's steps (activation.c), shared with its SIMD kernels (x86/activation_x86.c): the input
 * range (above EM_EXPF_MAX: infinity; below EM_EXPF_MIN, where the result would be below FLT_MIN:
 * zero), log2(e), ln 2 split in a part exact in few bits and the rest (Cephes' expf), and the
 * polynomial p with exp(r) ~ 1 + r + r^2 p(r) on [-ln2/2, ln2/2], highest power first. */
#define EM_EXPF_MAX 88.3762626647949f
#define EM_EXPF_MIN (-87.3365478515625f)
#define EM_EXPF_LOG2E 1.44269504088896341f
#define EM_EXPF_LN2_HI 0.693359375f
#define EM_EXPF_LN2_LO (-2.12194440e-4f)
#define EM_EXPF_P0 1.9875691500e-4f
#define EM_EXPF_P1 1.3981999507e-3f
#define EM_EXPF_P2 8.3334519073e-3f
#define EM_EXPF_P3 4.1665795894e-2f
#define EM_EXPF_P4 1.6666665459e-1f
#define EM_EXPF_P5 5.0000001201e-1f
/* 2^k for -126 <= k <= 127, exactly. */
static inline float em_expf_pow2(int32_t k) {
    const uint32_t bits = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
/* Softmax sums its exponentials in this many partial sums (activation.c). */
#define EM_SOFTMAX_LANES 16
typedef void (*em_softmax_fn)(float *x, uint64_t n);
typedef void (*em_silu_mul_fn)(float *gate, const float *up, uint64_t n);

/* For the SIMD kernels (x86/, arm/): helpers that must inline, and loops over a compile-time
 * number of rows or tokens that must unroll fully, so that per-row sums stay in registers rather
 * than on the stack. */
#define EM_INLINE inline __attribute__((always_inline))
#define EM_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define EM_UNROLL(n) _Pragma("unroll")
#elif defined(__GNUC__)
#define EM_UNROLL(n) EM_PRAGMA(GCC unroll n)
#else
#define EM_UNROLL(n)
#endif

#endif
