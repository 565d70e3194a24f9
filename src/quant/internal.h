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

#define EM_QK_K 256 /* elements per super-block of the K-, IQ- and TQ-formats */

/* Lattice tables (iq_grids.c) and small value tables (dequant.c); see there for the formats. */
extern const uint64_t em_iq2xxs_grid[256];
extern const uint64_t em_iq2xs_grid[512];
extern const uint64_t em_iq2s_grid[1024];
extern const uint32_t em_iq3xxs_grid[256];
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
static inline float em_load_fp16(const uint8_t *p) { return em_fp16_to_f32(em_load_u16(p)); }

/* Sign of element j of an 8-element group whose 7 stored sign bits are `bits7`: the eighth sign
 * is implied by even parity (an even number of negative elements), which is what the ksigns table
 * of the IQ2/IQ3 formats encodes. Returns the 8 sign bits, bit j set = negative. */
static inline uint8_t em_iq_signs8(uint32_t bits7) {
    uint32_t s = bits7 & 127;
    uint32_t parity = (uint32_t)__builtin_popcount(s) & 1;
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

/* Round half away from zero, like C's roundf, returned as int (|x| stays far below INT_MAX). */
static inline int em_round_int(float x) { return (int)roundf(x); }

/* Per-type block dequantizer: `n_blocks` blocks into n_blocks * block_elems floats. */
typedef void (*em_dequant_fn)(const uint8_t *blocks, float *out, uint64_t n_blocks);
em_dequant_fn em_quant_dequantizer(uint32_t type);

/* Scale and min (6-bit each) of sub-block k (0..7) from the 12 packed bytes of Q4_K / Q5_K. */
void em_quant_k_scale_min(const uint8_t *scales, int k, int *scale, int *min);

/* A dot product kernel for one weight type: weight row, activation row, n elements. */
typedef float (*em_quant_dot_fn)(const void *weight_row, const void *activation_row, uint64_t n);

/* Quantizers of the K- and IQ4 formats (kquants.c); same contract as em_quantize's per-type work. */
void em_quantize_q2_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_q3_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_q4_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_q5_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_q6_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_q8_k(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_iq4_nl(const float *x, uint8_t *out, uint64_t n_blocks);
void em_quantize_iq4_xs(const float *x, uint8_t *out, uint64_t n_blocks);

#endif
