/*
 * quant — the block formats in which GGUF stores tensors.
 *
 * This module owns the table of tensor types (GGML type ids as GGUF stores them: name, elements
 * per block, bytes per block), scalar reference dequantization for every type it knows, reference
 * quantizers, and row dot products of each weight type with the activation format chosen for it.
 * Reference code here is scalar and readable; faster SIMD variants live beside it (x86/, arm/)
 * and are checked against it. It owns no memory beyond what callers pass in, and depends only on
 * base. Its one piece of static state is a write-once cache of the CPU's SIMD features (x86/,
 * arm/).
 *
 * Files: types.c (the table), fp.c (f16/bf16), dequant.c (every decoder), quantize.c (the simple
 * formats, bit-exact with the GGUF tooling's reference), kquants.c (the searching quantizers:
 * K-formats, IQ4_NL, IQ4_XS, IQ3_XXS), weighted.c (llama.cpp's importance-weighted quantizers,
 * em_quantize_rows), iq_grids.c (i-quant lattice tables; iq3xxs_grid.h lists IQ3_XXS's points for
 * it and for the CUDA backend's device copy), dot.c (dispatch,
 * reference and common scalar dots, em_dot_rows), dot_scalar.c (other scalar dots), x86/ (AVX2
 * kernels: dot_avx2.c one row, dot_rows_avx2.c several activation rows, avx2.h their helpers;
 * dot_rows_vnni.c: AVX-512 VNNI multi-row kernels for Q4_K and Q8_0; dot_weights_vnni.c: several
 * weight rows against a decode step's activation rows, AVX-512 for Q4_K (one to four tokens), Q6_K,
 * Q8_0 and BF16 (one); bf16_tiles.c: BF16 weights against many bf16 tokens with AVX512_BF16;
 * dot_group_vnni.c: packed token groups and their AVX-512 VNNI kernels for Q4_K, Q8_0, Q6_K and
 * IQ3_XXS; dot_mxfp4_avx512.c: MXFP4's one-row, several-activation-row and several-weight-row
 * kernels with AVX-512 VNNI, bitwise the scalar path; amx.c: Q4_K and Q8_0 weights against many
 * tokens with AMX-INT8 tiles; rows_f32.c:
 * weighted sums of f32 rows, attention's sum of values), arm/ (AArch64 NEON kernels, one to four activation rows a call:
 * kernels.h compiled plain in dot_neon.c, which also picks the family at run time, and with the
 * dot-product instructions in dot_dotprod.c).
 * internal.h is shared by these files only.
 *
 * Coverage: em_dequantize and em_dot handle F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1
 * (dequantize only), Q2_K..Q6_K, Q8_K (dequantize only), IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 and MXFP4. em_quantize handles F32, F16, BF16,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, TQ1_0, TQ2_0 (bit-exact with the reference tooling), and
 * Q2_K..Q6_K, Q8_K, IQ4_NL, IQ4_XS, IQ3_XXS (error-bounded searches, not bit-exact).
 */
#ifndef EMBER_QUANT_H
#define EMBER_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"

/* GGML type ids, exactly as they appear in GGUF tensor infos. Gaps are ids that GGML retired. */
typedef enum em_type {
    EM_TYPE_F32 = 0,
    EM_TYPE_F16 = 1,
    EM_TYPE_Q4_0 = 2,
    EM_TYPE_Q4_1 = 3,
    EM_TYPE_Q5_0 = 6,
    EM_TYPE_Q5_1 = 7,
    EM_TYPE_Q8_0 = 8,
    EM_TYPE_Q8_1 = 9,
    EM_TYPE_Q2_K = 10,
    EM_TYPE_Q3_K = 11,
    EM_TYPE_Q4_K = 12,
    EM_TYPE_Q5_K = 13,
    EM_TYPE_Q6_K = 14,
    EM_TYPE_Q8_K = 15,
    EM_TYPE_IQ2_XXS = 16,
    EM_TYPE_IQ2_XS = 17,
    EM_TYPE_IQ3_XXS = 18,
    EM_TYPE_IQ1_S = 19,
    EM_TYPE_IQ4_NL = 20,
    EM_TYPE_IQ3_S = 21,
    EM_TYPE_IQ2_S = 22,
    EM_TYPE_IQ4_XS = 23,
    EM_TYPE_I8 = 24,
    EM_TYPE_I16 = 25,
    EM_TYPE_I32 = 26,
    EM_TYPE_I64 = 27,
    EM_TYPE_F64 = 28,
    EM_TYPE_IQ1_M = 29,
    EM_TYPE_BF16 = 30,
    EM_TYPE_TQ1_0 = 34,
    EM_TYPE_TQ2_0 = 35,
    EM_TYPE_MXFP4 = 39,
    EM_TYPE_COUNT = 40 /* one past the largest id; not a type */
} em_type;

typedef struct em_type_info {
    const char *name;     /* as GGML prints it: "Q4_K", "BF16", ... */
    uint32_t block_elems; /* elements per block (1 for plain scalars) */
    uint32_t block_bytes; /* bytes per block */
} em_type_info;

/* The table entry for a GGML type id, or NULL when the id is unknown or retired. */
const em_type_info *em_type_info_of(uint32_t type);

/* The type's name, or "unknown" when the id is unknown. */
const char *em_type_name(uint32_t type);

/* Looks a type up by name, case-insensitively ("q4_k", "Q4_K"). */
em_err em_type_from_name(const char *name, em_type *out);

/* Bytes of one row of `elems` elements; an error when `elems` is not a multiple of the block or
 * the size overflows. */
em_err em_type_row_bytes(uint32_t type, uint64_t elems, uint64_t *out);

/* ---- Scalar conversions ----
 * IEEE half (binary16) and bfloat16 bit patterns to and from f32. Rounding is to nearest, ties to
 * even; f16 overflow gives infinity, values below the f16 range give (signed) subnormals or zero;
 * NaN stays NaN (quiet). */
float em_fp16_to_f32(uint16_t h);
uint16_t em_f32_to_fp16(float f);
float em_bf16_to_f32(uint16_t h);
uint16_t em_f32_to_bf16(float f);

/* ---- Reference conversions (scalar; the definition every faster path is checked against) ---- */

/* Dequantizes `n` elements (a multiple of the type's block) from `blocks` into `out`.
 * EM_ERR_UNSUPPORTED for a type without a dequantizer. */
em_err em_dequantize(uint32_t type, const void *blocks, float *out, uint64_t n);

/* True when em_quantize supports the type. */
bool em_type_can_quantize(uint32_t type);

/* Quantizes `n` floats (a multiple of the block) into blocks of `type`. Unweighted (no importance
 * matrix). EM_ERR_UNSUPPORTED for a type without a quantizer, EM_ERR_INVALID for a bad `n`. */
em_err em_quantize(uint32_t type, const float *in, void *blocks, uint64_t n);

/* Quantizes `n_rows` rows of `row_elems` floats (a multiple of the block) into consecutive rows of
 * `type`, every row weighted by the same `importance` (row_elems values >= 0, one per column: an
 * importance matrix's entry for this weight matrix). NULL importance is em_quantize, byte for byte.
 * With importance, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL and IQ4_XS run llama.cpp's weighted
 * algorithms (weighted.c; the bytes llama.cpp writes for the same input), IQ3_XXS weights Ember's
 * own search, and the other types ignore the weights as llama.cpp does (Q8_0, F16, BF16, F32,
 * MXFP4, TQ1_0, TQ2_0). Unit importance is not the unweighted path: llama.cpp's weighted
 * algorithms differ from its unweighted ones too, and Ember matches llama.cpp. */
em_err em_quantize_rows(uint32_t type, const float *in, void *blocks, uint64_t n_rows, uint64_t row_elems,
                        const float *importance);

/* True when em_quantize_rows' output for `type` depends on the importance values. */
bool em_type_uses_importance(uint32_t type);

/* ---- Dot products: a weight row (stored format) with an activation row ---- */

/* The format activations take for dot products with weights of `weight_type`:
 *   EM_TYPE_F32  for F32, F16, BF16 weights (and any type em_dot does not know);
 *   EM_TYPE_Q8_0 for the 32-element formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4;
 *   EM_TYPE_Q8_K for the 256-element formats Q2_K..Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
 *                IQ3_XXS, IQ3_S, IQ4_XS, TQ1_0, TQ2_0.
 * Q8 activations add at most half a step (max|x| / 254 of the block's largest value) of error per
 * element. */
em_type em_dot_activation_type(uint32_t weight_type);

/* Converts an f32 activation row of `n` elements into em_dot_activation_type(weight_type); `out`
 * holds em_type_row_bytes(that type, n) bytes. */
em_err em_quantize_activation(uint32_t weight_type, const float *x, void *out, uint64_t n);

/* Dot product of one weight row and one activation row (already in the activation format), `n`
 * elements. The caller has validated the type and `n` (a multiple of the block). Uses AVX2 kernels
 * when the CPU has AVX2+FMA+F16C, NEON kernels on AArch64 (with SDOT where the CPU reports it;
 * EMBER_CPU_ISA=neon keeps plain NEON), for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
 * MXFP4, Q2_K..Q6_K, IQ4_XS and IQ3_XXS (MXFP4 with AVX-512 VNNI where the CPU has it, bitwise the
 * scalar path), and integer scalar code otherwise. Activation rows must come from
 * em_quantize_activation (its 8-bit levels never take -128, which the SIMD sign tricks rely on).
 * Returns 0 for a type it does not know. Thread-safe; reads only its arguments. */
float em_dot(uint32_t weight_type, const void *weight_row, const void *activation_row, uint64_t n);

/* The kernel em_dot runs for `weight_type` on this CPU, for callers that take many rows of one
 * matrix (the dispatch then happens once, not per row); NULL when the type has no dedicated
 * kernel (em_dot then uses em_dot_reference). Same contract as em_dot. */
typedef float (*em_dot_fn)(const void *weight_row, const void *activation_row, uint64_t n);
em_dot_fn em_dot_kernel(uint32_t weight_type);

/* One weight row against `n_rows` activation rows (each in the activation format, `n` elements,
 * row t at activation_rows + t * activation_stride bytes): out[t] = em_dot(weight_type, weight_row,
 * row t, n), bitwise equal. Batched work (several tokens per matrix product) calls this so the
 * weight block is unpacked once for up to four activation rows: AVX2 kernels for F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and IQ3_XXS,
 * and for Q4_K, Q8_0, IQ3_XXS and MXFP4 AVX-512 VNNI kernels taking up to eight rows (MXFP4: four)
 * where the CPU has them (the environment variable EMBER_CPU_ISA=avx2 keeps AVX2); NEON kernels for the same types as the
 * AVX2 ones on AArch64; TQ1_0, TQ2_0 and other CPUs loop over em_dot. Same contract as em_dot otherwise. */
void em_dot_rows(uint32_t weight_type, const void *weight_row, const void *activation_rows,
                 uint64_t activation_stride, uint32_t n_rows, uint64_t n, float *out);

/* The kernel em_dot_rows runs for `weight_type` on this CPU (any n_rows), or NULL when the type
 * has none (em_dot_rows then loops over em_dot). Same contract as em_dot_rows. */
typedef void (*em_dot_rows_fn)(const void *weight_row, const void *activation_rows, uint64_t activation_stride,
                               uint32_t n_rows, uint64_t n, float *out);
em_dot_rows_fn em_dot_rows_kernel(uint32_t weight_type);

/* Tokens em_dot_weights takes in one call at most (a decode step of a few sequences). */
#define EM_DOT_WEIGHTS_TOKENS 4

/* Several weight rows against the activation rows of one to EM_DOT_WEIGHTS_TOKENS tokens (a decode
 * step's products): out[t * out_stride + i] = em_dot(weight_type, weight_rows + i * row_stride,
 * activation_rows + t * activation_stride, n), bitwise equal, for i < n_weight_rows and t <
 * n_tokens. The kernels load each activation block once for up to four weight rows and keep the
 * rows' sums in independent chains, and unpack each weight block once for all the tokens: AVX-512
 * kernels for Q4_K (one to four tokens), Q8_0, Q6_K, MXFP4 (VNNI) and BF16 (one token) where the
 * AVX-512 VNNI kernels run; other types, token counts and CPUs loop over em_dot_rows' kernel or em_dot. */
void em_dot_weights(uint32_t weight_type, const void *weight_rows, uint64_t row_stride, uint32_t n_weight_rows,
                    const void *activation_rows, uint64_t activation_stride, uint32_t n_tokens, uint64_t n,
                    float *out, uint64_t out_stride);

/* The kernel em_dot_weights runs for `weight_type` and `n_tokens` tokens on this CPU, or NULL when
 * there is none here (em_dot_weights then takes the rows one by one). Same contract as
 * em_dot_weights. */
typedef void (*em_dot_weights_fn)(const void *weight_rows, uint64_t row_stride, uint32_t n_weight_rows,
                                  const void *activation_rows, uint64_t activation_stride, uint32_t n_tokens,
                                  uint64_t n, float *out, uint64_t out_stride);
em_dot_weights_fn em_dot_weights_kernel(uint32_t weight_type, uint32_t n_tokens);

/* The SIMD family em_dot and em_dot_rows use on this CPU: "avx512-vnni" (AVX2 kernels, and AVX-512
 * VNNI multi-row kernels for Q4_K and Q8_0), "avx2", "neon-dotprod" (AArch64 with the dot-product
 * instructions), "neon" (AArch64 without them, or EMBER_CPU_ISA=neon), or "scalar". The NEON
 * kernels are bitwise equal to em_dot_scalar, and so are the AVX-512 ones for MXFP4; the other x86
 * ones equal it up to f32 summation order. */
const char *em_dot_isa(void);

/* ---- Token groups: one weight row against several tokens whose activations were packed once ----
 * A batched matrix product packs each group of up to EM_DOT_GROUP_TOKENS activation rows into one
 * buffer (the tokens interleaved block by block, with the per-token sums the kernels need worked
 * out once) and then runs every weight row against the groups: the weight block is decoded once
 * per group (or, for IQ3_XXS, once for several) and the per-token work is not repeated per weight
 * row. AVX-512 VNNI kernels for Q4_K, Q8_0, Q6_K and IQ3_XXS; elsewhere em_dot_group_kernel is NULL
 * and callers use em_dot_rows. */
#define EM_DOT_GROUP_TOKENS 8

/* out[t * out_stride + r] = em_dot(weight_type, weight row r, activation row t, n), bitwise, for
 * weight rows r < n_weight_rows (row r at weight_rows + r * row_bytes) and tokens t < n_tokens,
 * where `group` holds those n_tokens activation rows as em_dot_group_pack packed them (the same n):
 * tokens 8k..8k+7 in the group at group + k * em_dot_group_bytes(weight_type, n), all but the last
 * group full. The kernels take a few weight rows at a time, so each activation load serves them all;
 * IQ3_XXS decodes a weight block once for several groups. */
typedef void (*em_dot_group_fn)(const void *weight_rows, uint64_t row_bytes, uint32_t n_weight_rows, const void *group,
                                uint32_t n_tokens, uint64_t n, float *out, uint64_t out_stride);

/* The group kernel for `weight_type` on this CPU, or NULL (no kernel: do not pack). */
em_dot_group_fn em_dot_group_kernel(uint32_t weight_type);

/* Bytes of one packed group of rows of `n` elements (a multiple of the activation block): never
 * more than EM_DOT_GROUP_TOKENS activation rows take. 0 when the type has no group kernel here. */
uint64_t em_dot_group_bytes(uint32_t weight_type, uint64_t n);

/* Packs n_rows (1..EM_DOT_GROUP_TOKENS) activation rows, row t at activation_rows + t * stride, of
 * `n` elements in em_dot_activation_type(weight_type), into `group` (em_dot_group_bytes bytes).
 * Only for a type whose em_dot_group_kernel is not NULL. */
void em_dot_group_pack(uint32_t weight_type, const void *activation_rows, uint64_t stride, uint32_t n_rows,
                       uint64_t n, void *group);

/* ---- BF16 weights against many tokens in bf16 (batched products of BF16 models) ----
 * Where the CPU has AVX512_BF16 (and the AVX-512 VNNI kernels run: EMBER_CPU_ISA=avx2 turns this
 * off), a batch's f32 activations are rounded to bf16 once and multiplied with vdpbf16ps in
 * register tiles of weight rows x tokens. Not em_dot's numbers: each activation moves by at most
 * 2^-9 of its size and the f32 sums run in another order, so |y - exact| stays within about
 * 2^-8 * sum |w * x| (test_quant checks this against the f32 definition). */
bool em_bf16_tiles_available(void);

/* Rows of `n` f32 values (row t at x + t * x_stride) rounded to nearest-even bf16, row t to out +
 * t * out_stride (strides in elements). */
void em_bf16_round_rows(const float *x, uint64_t x_stride, uint32_t n_rows, uint64_t n, uint16_t *out,
                        uint64_t out_stride);

/* y[t * y_stride + r] = sum over j < n of weight row r [j] * acts[t * act_stride + j], in f32, for r <
 * n_rows and t < n_tokens: BF16 weight rows `row_stride` bytes apart, bf16 activations from
 * em_bf16_round_rows. Without AVX512_BF16 a plain loop computes the same definition. */
void em_bf16_tiles(const void *weights, uint64_t row_stride, uint32_t n_rows, const uint16_t *acts,
                   uint64_t act_stride, uint32_t n_tokens, uint64_t n, float *y, uint64_t y_stride);

/* ---- Q4_K and Q8_0 weights against many tokens on AMX-INT8 (batched products) ----
 * Where the CPU has AMX-INT8 and the OS grants its tiles (and the AVX-512 VNNI kernels run:
 * EMBER_CPU_ISA=avx2 turns this off), a batch's activations (Q8_K, Q8_0) are packed in tiles of
 * EM_AMX_TILE_TOKENS tokens and the weights multiplied with tdpbusd / tdpbssd. The results are
 * em_dot_scalar's bitwise (per block the same integer sums and f32 steps; the AVX2 em_dot sums its
 * lanes in another order). Elsewhere a plain loop computes the same numbers from the packed tiles. */
#define EM_AMX_TILE_TOKENS 16
bool em_amx_available(void);

/* Bytes of one packed tile of EM_AMX_TILE_TOKENS activation rows of `n` elements, for weights of
 * `weight_type`; 0 where em_amx_product does not take the type and length (it takes Q4_K and Q8_0). */
uint64_t em_amx_tile_bytes(uint32_t weight_type, uint64_t n);

/* Packs `n_rows` (at most EM_AMX_TILE_TOKENS; the rest are zeros) activation rows of `n` elements,
 * in em_dot_activation_type(weight_type) and `stride` bytes apart, into one tile of
 * em_amx_tile_bytes bytes. */
void em_amx_pack(uint32_t weight_type, const void *activation_rows, uint64_t stride, uint32_t n_rows, uint64_t n,
                 void *tile);

/* y[t * y_stride + r] = em_dot_scalar(weight_type, weight row r, activation row t, n), bitwise, for r
 * < n_rows and t < n_tokens: weight rows `row_stride` bytes apart, the activations packed by
 * em_amx_pack, tile i (tokens 16 i..16 i + 15) at tiles + i * em_amx_tile_bytes. Fails only when out
 * of memory (a work buffer of about 8.5 KB per 256 columns). */
em_err em_amx_product(uint32_t weight_type, const void *weight_rows, uint64_t row_stride, uint32_t n_rows,
                      const void *tiles, uint32_t n_tokens, uint64_t n, float *y, uint64_t y_stride);

/* For each head h < n_heads: out_h[j] = fmaf(weights_h[p], row p [j], out_h[j]) for p = 0..n_rows-1
 * in that order, j < n (out_h at out + h * out_stride, weights_h at weights + h * weights_stride,
 * row p at rows + p * row_stride floats): each product fused with its add, as in the plain loop,
 * so that every SIMD path (AVX-512F, AVX2) equals it bitwise, and each head's numbers are those of
 * the head alone. Attention's weighted sum of values, the query heads that share a KV head together:
 * each value row is loaded once for all of them. */
void em_f32_add_weighted_rows(float *out, uint64_t out_stride, const float *weights, uint64_t weights_stride,
                              uint32_t n_heads, const float *rows, uint64_t row_stride, uint32_t n_rows, uint64_t n);
typedef void (*em_weighted_rows_fn)(float *out, uint64_t out_stride, const float *weights, uint64_t weights_stride,
                                    uint32_t n_heads, const float *rows, uint64_t row_stride, uint32_t n_rows,
                                    uint64_t n);

/* out[r] = em_dot(EM_TYPE_F32, row r, x, n), bitwise, for r < n_rows (row r at rows + r * row_stride
 * floats): attention's scores of one query against a run of cached keys. On x86 with AVX-512F (where
 * the VNNI kernels run) and n a multiple of 32, sixteen rows at a time: each row's sums formed as em_dot's
 * kernel forms them, its final additions done for all sixteen at once. */
void em_f32_dot_rows(const float *rows, uint64_t row_stride, uint32_t n_rows, const float *x, uint64_t n, float *out);
typedef void (*em_f32_dot_rows_fn)(const float *rows, uint64_t row_stride, uint32_t n_rows, const float *x, uint64_t n,
                                   float *out);

/* exp(x), Ember's own (activation.c): the same bits on every CPU and in every SIMD path, within 2
 * ulp of the true value; +inf above 88.376, 0 where the result would be below FLT_MIN, NaN for NaN. */
float em_expf(float x);
/* x[0..n) = softmax(x): em_expf(x[i] - max) each, their sum taken in sixteen partial sums (element
 * i into sum i mod 16) folded in halves, then each times 1 / sum. */
void em_f32_softmax(float *x, uint64_t n);
/* gate[i] = gate[i] / (1 + em_expf(-gate[i])) * up[i] (SiLU times the up projection, SwiGLU). */
void em_f32_silu_mul(float *gate, const float *up, uint64_t n);

/* The definition em_dot is checked against: decodes both rows to f32 and sums the products in
 * double. Slow; for tests and debugging. */
float em_dot_reference(uint32_t weight_type, const void *weight_row, const void *activation_row, uint64_t n);

/* em_dot without SIMD: the portable scalar path (integer arithmetic per sub-block), what ARM and
 * older x86 run and what SIMD paths are tested against (the NEON kernels bitwise). */
float em_dot_scalar(uint32_t weight_type, const void *weight_row, const void *activation_row, uint64_t n);

#endif
