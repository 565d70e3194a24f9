/*
 * Reference quantizers of the simple formats (one scale per block, no search): F16, BF16, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, TQ1_0, TQ2_0. They reproduce the reference quantizer of the
 * GGUF tooling bit for bit, so files Ember writes equal files the usual tools write. The rounding
 * rules that matter for that are noted where they occur. The K- and IQ4 formats (which search for
 * scales) are in kquants.c; em_quantize dispatches to both.
 */
#include "internal.h"

/* Index and value of the element of largest magnitude (the first one on ties). */
static float signed_absmax(const float *x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static float absmax(const float *x, int n) {
    float amax = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
    return amax;
}

static void minmax(const float *x, int n, float *min, float *max) {
    *min = x[0];
    *max = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The symmetric 4- and 5-bit formats put the largest-magnitude element at level 0 (d = max / -8 or
 * -16) and round q = x / d + offset by truncating x * (1/d) + offset + 0.5. The reference evaluates
 * x * (1/d) + offset + 0.5 in double precision, then rounds that to f32 before truncating; both
 * steps decide the result near level boundaries, so they are reproduced exactly. */
static int symmetric_level(float x, float id, double offset_plus_half, int max_level) {
    float t = (float)((double)x * (double)id + offset_plus_half);
    return clampi(em_float_to_int(truncf(t)), 0, max_level);
}

static void quantize_q4_0(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 32, out += 18) {
        float d = signed_absmax(x, 32) / -8;
        float id = d != 0 ? 1.0f / d : 0.0f;
        em_store_u16(out, em_f32_to_fp16(d));
        for (int j = 0; j < 16; j++) {
            int lo = symmetric_level(x[j], id, 8.5, 15), hi = symmetric_level(x[j + 16], id, 8.5, 15);
            out[2 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void quantize_q5_0(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 32, out += 22) {
        float d = signed_absmax(x, 32) / -16;
        float id = d != 0 ? 1.0f / d : 0.0f;
        em_store_u16(out, em_f32_to_fp16(d));
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int lo = symmetric_level(x[j], id, 16.5, 31), hi = symmetric_level(x[j + 16], id, 16.5, 31);
            out[6 + j] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + 16);
        }
        for (int k = 0; k < 4; k++) out[2 + k] = (uint8_t)(qh >> (8 * k));
    }
}

/* The affine formats round (x - min) * (1/d) + 0.5 in f32 and truncate. */
static int affine_level(float x, float min, float id, int max_level) {
    return clampi(em_float_to_int(truncf((x - min) * id + 0.5f)), 0, max_level);
}

static void quantize_q4_1(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 32, out += 20) {
        float min, max;
        minmax(x, 32, &min, &max);
        float d = (max - min) / 15;
        float id = d != 0 ? 1.0f / d : 0.0f;
        em_store_u16(out, em_f32_to_fp16(d));
        em_store_u16(out + 2, em_f32_to_fp16(min));
        for (int j = 0; j < 16; j++) {
            int lo = affine_level(x[j], min, id, 15), hi = affine_level(x[j + 16], min, id, 15);
            out[4 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void quantize_q5_1(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 32, out += 24) {
        float min, max;
        minmax(x, 32, &min, &max);
        float d = (max - min) / 31;
        float id = d != 0 ? 1.0f / d : 0.0f;
        em_store_u16(out, em_f32_to_fp16(d));
        em_store_u16(out + 2, em_f32_to_fp16(min));
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int lo = affine_level(x[j], min, id, 31), hi = affine_level(x[j + 16], min, id, 31);
            out[8 + j] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + 16);
        }
        for (int k = 0; k < 4; k++) out[4 + k] = (uint8_t)(qh >> (8 * k));
    }
}

/* Q8_0: d = max|x| / 127, q = round-half-away(x * (1/d)). The activations of every batched product
 * with Q8_0 weights pass through here, so a block of finite numbers with a finite 1/d skips the libm
 * call per element and is written so compilers vectorize it, as em_quantize_q8_k does: truncation,
 * then one step outward when the exact remainder reaches a half, which is roundf's result for any
 * value below 2^23 in magnitude (here at most 127 and a little). Other blocks take roundf. */
static void quantize_q8_0(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 32, out += 34) {
        /* The magnitudes' bit patterns order as the magnitudes do, with infinity and then NaN
         * above every finite number: an integer maximum vectorizes where a float one may not. */
        uint32_t bits[32], amax_bits = 0;
        memcpy(bits, x, sizeof bits);
        for (int j = 0; j < 32; j++) {
            const uint32_t magnitude = bits[j] & 0x7fffffffu;
            amax_bits = magnitude > amax_bits ? magnitude : amax_bits;
        }
        if (amax_bits >= 0x7f800000u) { /* an infinity or a NaN: the definition */
            float d = absmax(x, 32) / 127;
            float id = d != 0 ? 1.0f / d : 0.0f;
            em_store_u16(out, em_f32_to_fp16(d));
            for (int j = 0; j < 32; j++) out[2 + j] = (uint8_t)(int8_t)em_round_int(x[j] * id);
            continue;
        }
        float amax;
        memcpy(&amax, &amax_bits, sizeof amax);
        float d = amax / 127;
        float id = d != 0 ? 1.0f / d : 0.0f;
        em_store_u16(out, em_f32_to_fp16(d));
        if (!isfinite(id)) { /* d below the smallest normal number */
            for (int j = 0; j < 32; j++) out[2 + j] = (uint8_t)(int8_t)em_round_int(x[j] * id);
            continue;
        }
        int8_t levels[32];
        for (int j = 0; j < 32; j++) {
            const float v = x[j] * id;
            int level = (int)v;
            const float rest = v - (float)level;
            level += (rest >= 0.5f) - (rest <= -0.5f);
            levels[j] = (int8_t)level;
        }
        memcpy(out + 2, levels, 32);
    }
}

/* MXFP4: the shared exponent is floor(log2(max|x|)) - 2 (so the largest element lands near the top
 * E2M1 value 6), then each element takes the nearest code point (the lowest index on ties). */
static void quantize_mxfp4(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 32, out += 17) {
        float amax = absmax(x, 32);
        /* Like the reference, an exponent below the E8M0 range wraps modulo 256. */
        uint8_t e = amax > 0 ? (uint8_t)em_float_to_int(floorf(log2f(amax)) - 2 + 127) : 0;
        float d = em_e8m0_half(e);
        out[0] = e;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) {
            int best = 0;
            float best_err = fabsf(d * (float)em_mxfp4_values[0] - x[j]);
            for (int k = 1; k < 16; k++) {
                float err = fabsf(d * (float)em_mxfp4_values[k] - x[j]);
                if (err < best_err) {
                    best_err = err;
                    best = k;
                }
            }
            q[j] = (uint8_t)best;
        }
        for (int j = 0; j < 16; j++) out[1 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

/* Ternary levels 0, 1, 2 (for -1, 0, +1) of a 256-element block with d = max|x|. */
static float ternary_levels(const float *x, uint8_t q[256]) {
    float d = absmax(x, 256);
    float id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < 256; j++) q[j] = (uint8_t)(em_round_int(x[j] * id) + 1);
    return d;
}

/* TQ1_0 packs base-3 digits big-end first (the digit of the earliest element is the most
 * significant), then stores each byte as ceil(value * 256 / 243) so that multiplying by 3^k and
 * keeping the top bits extracts digit k (see dequant.c). */
static uint8_t tq1_pack(const uint8_t *q, int count, int stride) {
    int value = 0;
    for (int k = 0; k < count; k++) value = value * 3 + q[k * stride];
    for (int k = count; k < 5; k++) value *= 3;
    return (uint8_t)((value * 256 + 242) / 243);
}

static void quantize_tq1_0(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 54) {
        uint8_t q[256];
        float d = ternary_levels(x, q);
        for (int j = 0; j < 32; j++) out[j] = tq1_pack(q + j, 5, 32);
        for (int j = 0; j < 16; j++) out[32 + j] = tq1_pack(q + 160 + j, 5, 16);
        for (int j = 0; j < 4; j++) out[48 + j] = tq1_pack(q + 240 + j, 4, 4);
        em_store_u16(out + 52, em_f32_to_fp16(d));
    }
}

static void quantize_tq2_0(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 66) {
        uint8_t q[256];
        float d = ternary_levels(x, q);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 32; j++) {
                const uint8_t *p = q + 128 * h + j;
                out[32 * h + j] = (uint8_t)(p[0] | (p[32] << 2) | (p[64] << 4) | (p[96] << 6));
            }
        em_store_u16(out + 64, em_f32_to_fp16(d));
    }
}

static void quantize_f16(const float *x, uint8_t *out, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) em_store_u16(out + 2 * i, em_f32_to_fp16(x[i]));
}

static void quantize_bf16(const float *x, uint8_t *out, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) em_store_u16(out + 2 * i, em_f32_to_bf16(x[i]));
}

static void quantize_f32(const float *x, uint8_t *out, uint64_t n) { memcpy(out, x, n * 4); }

typedef void (*quantize_fn)(const float *x, uint8_t *out, uint64_t n_blocks);

static quantize_fn quantizer(uint32_t type) {
    switch (type) {
    case EM_TYPE_F32: return quantize_f32;
    case EM_TYPE_F16: return quantize_f16;
    case EM_TYPE_BF16: return quantize_bf16;
    case EM_TYPE_Q4_0: return quantize_q4_0;
    case EM_TYPE_Q4_1: return quantize_q4_1;
    case EM_TYPE_Q5_0: return quantize_q5_0;
    case EM_TYPE_Q5_1: return quantize_q5_1;
    case EM_TYPE_Q8_0: return quantize_q8_0;
    case EM_TYPE_MXFP4: return quantize_mxfp4;
    case EM_TYPE_TQ1_0: return quantize_tq1_0;
    case EM_TYPE_TQ2_0: return quantize_tq2_0;
    case EM_TYPE_Q2_K: return em_quantize_q2_k;
    case EM_TYPE_Q3_K: return em_quantize_q3_k;
    case EM_TYPE_Q4_K: return em_quantize_q4_k;
    case EM_TYPE_Q5_K: return em_quantize_q5_k;
    case EM_TYPE_Q6_K: return em_quantize_q6_k;
    case EM_TYPE_Q8_K: return em_quantize_q8_k;
    case EM_TYPE_IQ4_NL: return em_quantize_iq4_nl;
    case EM_TYPE_IQ4_XS: return em_quantize_iq4_xs;
    default: return NULL;
    }
}

bool em_type_can_quantize(uint32_t type) { return type == EM_TYPE_IQ3_XXS || quantizer(type) != NULL; }

em_err em_quantize(uint32_t type, const float *in, void *blocks, uint64_t n) {
    const em_type_info *info = em_type_info_of(type);
    quantize_fn fn = quantizer(type);
    if (!info || !em_type_can_quantize(type))
        return em_errorf(EM_ERR_UNSUPPORTED, "no quantizer for tensor type %s", em_type_name(type));
    if (n % info->block_elems != 0)
        return em_errorf(EM_ERR_INVALID, "quantize %s: %llu elements is not a multiple of the block (%u)", info->name,
                         (unsigned long long)n, info->block_elems);
    if (type == EM_TYPE_IQ3_XXS) return em_quantize_iq3_xxs(in, blocks, n / info->block_elems, NULL);
    fn(in, blocks, n / info->block_elems);
    return NULL;
}

bool em_type_uses_importance(uint32_t type) {
    switch (type) {
    case EM_TYPE_Q4_0: case EM_TYPE_Q4_1: case EM_TYPE_Q5_0: case EM_TYPE_Q5_1: case EM_TYPE_Q2_K:
    case EM_TYPE_Q3_K: case EM_TYPE_Q4_K: case EM_TYPE_Q5_K: case EM_TYPE_Q6_K: case EM_TYPE_IQ4_NL:
    case EM_TYPE_IQ4_XS: case EM_TYPE_IQ3_XXS: return true;
    default: return false;
    }
}

em_err em_quantize_rows(uint32_t type, const float *in, void *blocks, uint64_t n_rows, uint64_t row_elems,
                        const float *importance) {
    uint64_t row_bytes;
    em_err err = em_type_row_bytes(type, row_elems, &row_bytes);
    if (err) return err;
    if (!em_type_can_quantize(type))
        return em_errorf(EM_ERR_UNSUPPORTED, "no quantizer for tensor type %s", em_type_name(type));
    if (n_rows && row_elems > UINT64_MAX / n_rows)
        return em_errorf(EM_ERR_INVALID, "quantize %s: %llu rows of %llu elements overflow", em_type_name(type),
                         (unsigned long long)n_rows, (unsigned long long)row_elems);
    if (!importance) return em_quantize(type, in, blocks, n_rows * row_elems);
    uint8_t *out = blocks;
    for (uint64_t r = 0; r < n_rows; r++, in += row_elems, out += row_bytes) {
        if (type == EM_TYPE_IQ3_XXS) err = em_quantize_iq3_xxs(in, out, row_elems / 256, importance);
        else if (!em_quant_weighted_row(type, in, importance, out, row_elems))
            err = em_quantize(type, in, out, row_elems); /* a format that takes no weights */
        if (err) return err;
    }
    return NULL;
}
