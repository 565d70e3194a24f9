/* x86 SIMD dot products (AVX2 + FMA + F16C), chosen at run time; see dot_avx2.c and
 * dot_rows_avx2.c. */
#ifndef EMBER_QUANT_DOT_X86_H
#define EMBER_QUANT_DOT_X86_H

#include "../internal.h"

/* The fastest x86 kernel for the weight type on this CPU, or NULL (other CPU, other type). */
em_dot_fn em_quant_dot_x86(uint32_t weight_type);

/* True when the CPU has AVX2, FMA and F16C (probed once). */
bool em_quant_x86_has_avx2(void);

/* The multi-row kernel em_dot_rows runs for the weight type on this CPU, or NULL (other CPU, or a
 * type without one: em_dot_rows then loops over em_dot). See dot_rows_avx2.c. */
em_dot_rows_fn em_quant_dot_rows_x86(uint32_t weight_type);

/* True when the CPU has AVX512F, AVX512BW, AVX512VL and AVX512_VNNI and the environment does not
 * set EMBER_CPU_ISA=avx2 (probed once). */
bool em_quant_x86_has_vnni(void);

/* The AVX-512 VNNI multi-row kernel for the weight type (Q4_K, Q8_0) when the CPU has one, or NULL
 * (em_quant_dot_rows_x86's kernels then serve). See dot_rows_vnni.c. */
em_dot_rows_fn em_quant_dot_rows_vnni(uint32_t weight_type);

/* Several weight rows against a few tokens' activation rows (dot_weights_vnni.c): the AVX-512 kernel
 * for the weight type and token count (Q4_K: 1 to 4 tokens; Q8_0, Q6_K, BF16: 1) when the CPU has the
 * VNNI kernels, or NULL. */
em_dot_weights_fn em_quant_dot_weights_vnni(uint32_t weight_type, uint32_t n_tokens);

/* Token groups (dot_group_vnni.c): the AVX-512 VNNI kernel for the weight type (Q4_K, Q8_0, Q6_K, IQ3_XXS) when
 * the CPU has one, or NULL; a group's size in bytes for n elements (0 for other types); and the
 * packing of up to EM_DOT_GROUP_TOKENS activation rows into one. */
em_dot_group_fn em_quant_dot_group_vnni(uint32_t weight_type);
uint64_t em_quant_group_bytes(uint32_t weight_type, uint64_t n);
void em_quant_group_pack(uint32_t weight_type, const void *activation_rows, uint64_t stride, uint32_t n_rows,
                         uint64_t n, void *group);

/* MXFP4 with AVX-512 VNNI, bitwise equal to the scalar path (dot_mxfp4_avx512.c): em_dot's, em_dot_rows'
 * and (one token) em_dot_weights' kernels where the VNNI kernels run, or NULL. */
em_dot_fn em_quant_dot_mxfp4_avx512(void);
em_dot_rows_fn em_quant_dot_rows_mxfp4_avx512(void);
em_dot_weights_fn em_quant_dot_weights_mxfp4_avx512(uint32_t n_tokens);

/* The SIMD em_f32_add_weighted_rows for this CPU (AVX-512F where the VNNI kernels run, else AVX2),
 * or NULL. See rows_f32.c. */
em_weighted_rows_fn em_quant_weighted_rows_x86(void);

/* The AVX-512F em_f32_dot_rows for n a multiple of 32 where the VNNI kernels run (rows_f32.c), or
 * NULL. */
em_f32_dot_rows_fn em_quant_f32_dot_rows_x86(void);

/* The AVX-512 Q8_K quantizer where the VNNI kernels run (quantize_avx512.c), or NULL. */
em_block_quantize_fn em_quant_q8_k_x86(void);

/* em_f32_softmax and em_f32_silu_mul on AVX-512F (where the VNNI kernels run) or AVX2 + FMA, each
 * lane taking em_expf's steps; NULL on other CPUs. See activation_x86.c. */
em_softmax_fn em_quant_softmax_x86(void);
em_silu_mul_fn em_quant_silu_mul_x86(void);

#endif
