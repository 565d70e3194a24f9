/*
 * Row dot products: a weight row in its stored format with an activation row.
 *
 * Activation formats (em_dot_activation_type): float weights (F32, F16, BF16) take f32
 * activations; the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) take Q8_0; the
 * 256-element formats (K-, IQ-, TQ-quants) take Q8_K. Quantizing activations to 8 bits costs
 * about 0.4% relative error per element and lets fast paths multiply integers.
 *
 * The reference (em_dot_reference) decodes both rows block by block to f32 and sums in
 * double: slow, exact up to f32 rounding of each product, and the definition that the integer
 * scalar paths below and the SIMD paths in x86/ and arm/ are tested against. em_dot picks the
 * fastest path available for the type on this CPU.
 */
#include <math.h>

#include "arm/dot_arm.h"
#include "internal.h"
#include "x86/dot_x86.h"

em_type em_dot_activation_type(uint32_t weight_type) {
    switch (weight_type) {
    case EM_TYPE_Q4_0:
    case EM_TYPE_Q4_1:
    case EM_TYPE_Q5_0:
    case EM_TYPE_Q5_1:
    case EM_TYPE_Q8_0:
    case EM_TYPE_IQ4_NL:
    case EM_TYPE_MXFP4: return EM_TYPE_Q8_0;
    case EM_TYPE_Q2_K:
    case EM_TYPE_Q3_K:
    case EM_TYPE_Q4_K:
    case EM_TYPE_Q5_K:
    case EM_TYPE_Q6_K:
    case EM_TYPE_IQ2_XXS:
    case EM_TYPE_IQ2_XS:
    case EM_TYPE_IQ2_S:
    case EM_TYPE_IQ3_XXS:
    case EM_TYPE_IQ3_S:
    case EM_TYPE_IQ1_S:
    case EM_TYPE_IQ1_M:
    case EM_TYPE_IQ4_XS:
    case EM_TYPE_TQ1_0:
    case EM_TYPE_TQ2_0: return EM_TYPE_Q8_K;
    default: return EM_TYPE_F32;
    }
}

em_err em_quantize_activation(uint32_t weight_type, const float *x, void *out, uint64_t n) {
    em_type act = em_dot_activation_type(weight_type);
    em_err err = em_quantize(act, x, out, n);
    return em_err_prefix(err, "activations for %s weights", em_type_name(weight_type));
}

/* Reference: decode 256-element chunks (a whole number of blocks of every format) and sum. */
float em_dot_reference(uint32_t weight_type, const void *weight_row, const void *activation_row, uint64_t n) {
    em_type act = em_dot_activation_type(weight_type);
    const em_type_info *wi = em_type_info_of(weight_type), *ai = em_type_info_of(act);
    em_dequant_fn wf = em_quant_dequantizer(weight_type), af = em_quant_dequantizer(act);
    if (!wi || !wf) return 0;
    const uint8_t *w = weight_row, *a = activation_row;
    float wbuf[256], abuf[256];
    double sum = 0;
    for (uint64_t done = 0; done < n;) {
        uint64_t chunk = n - done < 256 ? n - done : 256;
        wf(w, wbuf, chunk / wi->block_elems);
        af(a, abuf, chunk / ai->block_elems);
        for (uint64_t j = 0; j < chunk; j++) sum += (double)wbuf[j] * (double)abuf[j];
        w += chunk / wi->block_elems * wi->block_bytes;
        a += chunk / ai->block_elems * ai->block_bytes;
        done += chunk;
    }
    return (float)sum;
}

/* ---- integer scalar paths for the common formats (portable; also the fallback off x86) ---- */

static float dot_f32(const void *wv, const void *av, uint64_t n) {
    const float *w = wv, *a = av;
    float acc[8] = {0};
    uint64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) acc[k] += w[j + k] * a[j + k];
    float sum = 0;
    for (int k = 0; k < 8; k++) sum += acc[k];
    for (; j < n; j++) sum += w[j] * a[j];
    return sum;
}

/* Eight partial sums so the adds do not wait on each other (and compilers can vectorize). */
static float dot_f16(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv;
    const float *a = av;
    float acc[8] = {0};
    uint64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) acc[k] += em_load_fp16(w + 2 * (j + k)) * a[j + k];
    float sum = 0;
    for (int k = 0; k < 8; k++) sum += acc[k];
    for (; j < n; j++) sum += em_load_fp16(w + 2 * j) * a[j];
    return sum;
}

static float dot_bf16(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv;
    const float *a = av;
    float acc[8] = {0};
    uint64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) acc[k] += em_load_bf16(w + 2 * (j + k)) * a[j + k];
    float sum = 0;
    for (int k = 0; k < 8; k++) sum += acc[k];
    for (; j < n; j++) sum += em_load_bf16(w + 2 * j) * a[j];
    return sum;
}

static float dot_q8_0(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 32; b++, w += 34, a += 34) {
        int isum = 0;
        for (int j = 0; j < 32; j++) isum += (int8_t)w[2 + j] * (int8_t)a[2 + j];
        sum += em_load_fp16(w) * em_load_fp16(a) * (float)isum;
    }
    return sum;
}

static float dot_q4_0(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 32; b++, w += 18, a += 34) {
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += ((w[2 + j] & 15) - 8) * (int8_t)a[2 + j];
            isum += ((w[2 + j] >> 4) - 8) * (int8_t)a[18 + j];
        }
        sum += em_load_fp16(w) * em_load_fp16(a) * (float)isum;
    }
    return sum;
}

/* Q4_K with Q8_K: per sub-block, d * scale * sum(q * a) - dmin * min * sum(a), where sum(a) comes
 * from the Q8_K group sums. */
static float dot_q4_k(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 144, a += 292) {
        float d = em_load_fp16(w) * em_load_f32(a), dmin = em_load_fp16(w + 2) * em_load_f32(a);
        const int8_t *q8 = (const int8_t *)(a + 4);
        int scaled = 0, mins = 0;
        for (int sub = 0; sub < 8; sub++) {
            int sc, mn;
            em_quant_k_scale_min(w + 4, sub, &sc, &mn);
            const uint8_t *q = w + 16 + 32 * (sub / 2);
            int shift = 4 * (sub % 2), isum = 0;
            for (int j = 0; j < 32; j++) isum += ((q[j] >> shift) & 15) * q8[32 * sub + j];
            scaled += sc * isum;
            mins += mn * ((int16_t)em_load_u16(a + 260 + 4 * sub) + (int16_t)em_load_u16(a + 262 + 4 * sub));
        }
        sum += d * (float)scaled - dmin * (float)mins;
    }
    return sum;
}

/* Q6_K with Q8_K: per 32 elements of a half, low nibbles from one of two 32-byte runs and high bit
 * pairs from the same 32 bytes of qh; each 16-element group scaled by its signed scale. */
static float dot_q6_k(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 210, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        const int8_t *sc = (const int8_t *)(w + 192);
        int total = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            for (int k = 0; k < 4; k++) {
                const uint8_t *low = ql + 32 * (k % 2);
                int shift = 4 * (k / 2);
                const int8_t *act = q8 + 128 * h + 32 * k;
                int s0 = 0, s1 = 0;
                for (int j = 0; j < 16; j++) {
                    s0 += ((((low[j] >> shift) & 15) | (((qh[j] >> (2 * k)) & 3) << 4)) - 32) * act[j];
                    s1 += ((((low[j + 16] >> shift) & 15) | (((qh[j + 16] >> (2 * k)) & 3) << 4)) - 32) * act[j + 16];
                }
                total += sc[8 * h + 2 * k] * s0 + sc[8 * h + 2 * k + 1] * s1;
            }
        }
        sum += em_load_fp16(w + 208) * em_load_f32(a) * (float)total;
    }
    return sum;
}

static em_dot_fn scalar_path(uint32_t weight_type) {
    switch (weight_type) {
    case EM_TYPE_F32: return dot_f32;
    case EM_TYPE_F16: return dot_f16;
    case EM_TYPE_BF16: return dot_bf16;
    case EM_TYPE_Q8_0: return dot_q8_0;
    case EM_TYPE_Q4_0: return dot_q4_0;
    case EM_TYPE_Q4_K: return dot_q4_k;
    case EM_TYPE_Q6_K: return dot_q6_k;
    default: return em_quant_dot_scalar_extra(weight_type);
    }
}

float em_dot_scalar(uint32_t weight_type, const void *weight_row, const void *activation_row, uint64_t n) {
    em_dot_fn fn = scalar_path(weight_type);
    if (fn) return fn(weight_row, activation_row, n);
    return em_dot_reference(weight_type, weight_row, activation_row, n);
}

em_dot_fn em_dot_kernel(uint32_t weight_type) {
    em_dot_fn fn = em_quant_dot_x86(weight_type);
    if (!fn) fn = em_quant_dot_arm(weight_type);
    return fn ? fn : scalar_path(weight_type);
}

float em_dot(uint32_t weight_type, const void *weight_row, const void *activation_row, uint64_t n) {
    em_dot_fn fn = em_dot_kernel(weight_type);
    if (fn) return fn(weight_row, activation_row, n);
    return em_dot_reference(weight_type, weight_row, activation_row, n);
}

em_dot_rows_fn em_dot_rows_kernel(uint32_t weight_type) {
    em_dot_rows_fn fn = em_quant_dot_rows_vnni(weight_type);
    if (!fn) fn = em_quant_dot_rows_x86(weight_type);
    return fn ? fn : em_quant_dot_rows_arm(weight_type);
}

const char *em_dot_isa(void) {
    if (em_quant_dot_rows_vnni(EM_TYPE_Q8_0)) return "avx512-vnni";
    if (em_quant_dot_x86(EM_TYPE_Q8_0)) return "avx2";
    const char *arm = em_quant_arm_isa();
    return arm ? arm : "scalar";
}

void em_dot_rows(uint32_t weight_type, const void *weight_row, const void *activation_rows,
                 uint64_t activation_stride, uint32_t n_rows, uint64_t n, float *out) {
    em_dot_rows_fn rows = em_dot_rows_kernel(weight_type);
    if (rows) {
        rows(weight_row, activation_rows, activation_stride, n_rows, n, out);
        return;
    }
    const uint8_t *a = activation_rows;
    for (uint32_t t = 0; t < n_rows; t++) out[t] = em_dot(weight_type, weight_row, a + t * activation_stride, n);
}

em_dot_weights_fn em_dot_weights_kernel(uint32_t weight_type, uint32_t n_tokens) {
    return em_quant_dot_weights_vnni(weight_type, n_tokens);
}

void em_dot_weights(uint32_t weight_type, const void *weight_rows, uint64_t row_stride, uint32_t n_weight_rows,
                    const void *activation_rows, uint64_t activation_stride, uint32_t n_tokens, uint64_t n,
                    float *out, uint64_t out_stride) {
    em_dot_weights_fn weights = em_dot_weights_kernel(weight_type, n_tokens);
    if (weights) {
        weights(weight_rows, row_stride, n_weight_rows, activation_rows, activation_stride, n_tokens, n, out,
                out_stride);
        return;
    }
    const uint8_t *w = weight_rows, *a = activation_rows;
    for (uint32_t t = 0; t < n_tokens; t++)
        for (uint32_t r = 0; r < n_weight_rows; r++)
            em_dot_rows(weight_type, w + r * row_stride, a + t * activation_stride, 0, 1, n, out + t * out_stride + r);
}

em_dot_group_fn em_dot_group_kernel(uint32_t weight_type) { return em_quant_dot_group_vnni(weight_type); }

uint64_t em_dot_group_bytes(uint32_t weight_type, uint64_t n) {
    return em_dot_group_kernel(weight_type) ? em_quant_group_bytes(weight_type, n) : 0;
}

void em_dot_group_pack(uint32_t weight_type, const void *activation_rows, uint64_t stride, uint32_t n_rows,
                       uint64_t n, void *group) {
    em_quant_group_pack(weight_type, activation_rows, stride, n_rows, n, group);
}

void em_f32_add_weighted_rows(float *out, uint64_t out_stride, const float *weights, uint64_t weights_stride,
                              uint32_t n_heads, const float *rows, uint64_t row_stride, uint32_t n_rows, uint64_t n) {
    em_weighted_rows_fn simd = em_quant_weighted_rows_x86();
    if (simd) {
        simd(out, out_stride, weights, weights_stride, n_heads, rows, row_stride, n_rows, n);
        return;
    }
    for (uint32_t h = 0; h < n_heads; h++)
        for (uint32_t p = 0; p < n_rows; p++)
            for (uint64_t j = 0; j < n; j++)
                out[h * out_stride + j] = fmaf(weights[h * weights_stride + p], rows[p * row_stride + j], out[h * out_stride + j]);
}

void em_f32_dot_rows(const float *rows, uint64_t row_stride, uint32_t n_rows, const float *x, uint64_t n, float *out) {
    em_f32_dot_rows_fn simd = n % 32 == 0 ? em_quant_f32_dot_rows_x86() : NULL;
    if (simd) {
        simd(rows, row_stride, n_rows, x, n, out);
        return;
    }
    const em_dot_fn dot = em_dot_kernel(EM_TYPE_F32);
    for (uint32_t r = 0; r < n_rows; r++)
        out[r] = dot ? dot(rows + r * row_stride, x, n) : em_dot_reference(EM_TYPE_F32, rows + r * row_stride, x, n);
}
