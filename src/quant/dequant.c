/*
 * Scalar reference dequantization of every block format Ember reads.
 *
 * Each function reads the block's bytes at fixed offsets (blocks are packed with no padding, and
 * GGUF does not promise alignment beyond 32 bytes for a tensor's start, so no struct overlays).
 * The arithmetic follows the format definitions in the order they are written (for example
 * Q4_K: (d * scale) * q - (dmin * min)), in f32, so results match other reference decoders to the
 * last bit or within an ulp.
 */
#include "internal.h"

/* IQ4_NL / IQ4_XS: the 16 non-uniform levels of the 4-bit non-linear formats. */
const int8_t em_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* MXFP4: the E2M1 code points, doubled to be integers (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives). */
const int8_t em_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ---- plain and 32-element formats ---- */

static void dequant_f16(const uint8_t *b, float *out, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) out[i] = em_load_fp16(b + 2 * i);
}

static void dequant_bf16(const uint8_t *b, float *out, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) out[i] = em_load_bf16(b + 2 * i);
}

static void dequant_f32(const uint8_t *b, float *out, uint64_t n) { memcpy(out, b, n * 4); }

/* Q4_0: d, then 16 bytes; low nibbles are elements 0..15, high nibbles 16..31; value d * (q - 8). */
static void dequant_q4_0(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 18, out += 32) {
        float d = em_load_fp16(b);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)((b[2 + j] & 15) - 8);
            out[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

/* Q4_1: d, m, 16 bytes of nibbles; value d * q + m. */
static void dequant_q4_1(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 20, out += 32) {
        float d = em_load_fp16(b), m = em_load_fp16(b + 2);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)(b[4 + j] & 15) + m;
            out[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
    }
}

/* Q5_0: d, 32 high bits (bit j belongs to element j), 16 bytes of low nibbles; d * (q - 16). */
static void dequant_q5_0(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 22, out += 32) {
        float d = em_load_fp16(b);
        uint32_t qh = em_load_u32(b + 2);
        for (int j = 0; j < 16; j++) {
            int lo = (b[6 + j] & 15) | (int)(((qh >> j) & 1) << 4);
            int hi = (b[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            out[j] = d * (float)(lo - 16);
            out[j + 16] = d * (float)(hi - 16);
        }
    }
}

/* Q5_1: d, m, 32 high bits, 16 bytes of low nibbles; d * q + m. */
static void dequant_q5_1(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 24, out += 32) {
        float d = em_load_fp16(b), m = em_load_fp16(b + 2);
        uint32_t qh = em_load_u32(b + 4);
        for (int j = 0; j < 16; j++) {
            int lo = (b[8 + j] & 15) | (int)(((qh >> j) & 1) << 4);
            int hi = (b[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            out[j] = d * (float)lo + m;
            out[j + 16] = d * (float)hi + m;
        }
    }
}

/* Q8_0: d, 32 signed bytes; d * q. */
static void dequant_q8_0(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 34, out += 32) {
        float d = em_load_fp16(b);
        for (int j = 0; j < 32; j++) out[j] = (float)(int8_t)b[2 + j] * d;
    }
}

/* Q8_1: d, s (= d * sum q, unused here), 32 signed bytes. */
static void dequant_q8_1(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 36, out += 32) {
        float d = em_load_fp16(b);
        for (int j = 0; j < 32; j++) out[j] = (float)(int8_t)b[4 + j] * d;
    }
}

/* IQ4_NL: d, 16 bytes of nibbles indexing the non-linear levels; d * level. */
static void dequant_iq4_nl(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 18, out += 32) {
        float d = em_load_fp16(b);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)em_iq4nl_values[b[2 + j] & 15];
            out[j + 16] = d * (float)em_iq4nl_values[b[2 + j] >> 4];
        }
    }
}

/* MXFP4: one E8M0 exponent byte, 16 bytes of E2M1 nibbles. */
static void dequant_mxfp4(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 17, out += 32) {
        float d = em_e8m0_half(b[0]);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)em_mxfp4_values[b[1 + j] & 15];
            out[j + 16] = d * (float)em_mxfp4_values[b[1 + j] >> 4];
        }
    }
}

/* ---- K-formats (256-element super-blocks) ---- */

/* Q2_K: 16 scale bytes (low nibble scale, high nibble min, one per 16 elements), 64 bytes of 2-bit
 * quants, d, dmin. Byte j of each 32-byte half holds elements j, j+32, j+64, j+96 of that half in
 * bit pairs 0-1, 2-3, 4-5, 6-7. Value (d * scale) * q - (dmin * min). */
static void dequant_q2_k(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 84, out += 256) {
        float d = em_load_fp16(b + 80), dmin = em_load_fp16(b + 82);
        for (int e = 0; e < 256; e++) {
            int half = e / 128, shift = 2 * ((e % 128) / 32), j = e % 32;
            int q = (b[16 + half * 32 + j] >> shift) & 3;
            uint8_t sc = b[e / 16];
            out[e] = (d * (float)(sc & 15)) * (float)q - dmin * (float)(sc >> 4);
        }
    }
}

/* Q3_K scales: 16 six-bit values, low 4 bits in bytes 0..7 (nibbles, scales 0..7 low, 8..15 high),
 * high 2 bits in bytes 8..11 (scale s uses byte 8 + s % 4, bit pair s / 4); stored with offset 32. */
static void q3_k_scales(const uint8_t *s, int out[16]) {
    for (int k = 0; k < 16; k++) {
        int lo = (s[k % 8] >> (4 * (k / 8))) & 15;
        int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        out[k] = (lo | (hi << 4)) - 32;
    }
}

/* Q3_K: 32 bytes of high bits (bit b of byte j: element 32 * b + j), 64 bytes of low 2-bit pairs
 * (as in Q2_K), 12 scale bytes, d. A clear high bit subtracts 4: q in -4..3. */
static void dequant_q3_k(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 110, out += 256) {
        float d = em_load_fp16(b + 108);
        int scales[16];
        q3_k_scales(b + 96, scales);
        for (int e = 0; e < 256; e++) {
            int half = e / 128, shift = 2 * ((e % 128) / 32), j = e % 32;
            int low = (b[32 + half * 32 + j] >> shift) & 3;
            int high = (b[j] >> (e / 32)) & 1;
            int q = low - (high ? 0 : 4);
            out[e] = (d * (float)scales[e / 16]) * (float)q;
        }
    }
}

/* Q4_K: d, dmin, 12 scale bytes, 128 bytes: byte j of chunk c (32 bytes) holds element 64c + j in
 * its low nibble and 64c + 32 + j in its high nibble. Eight sub-blocks of 32. */
static void dequant_q4_k(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 144, out += 256) {
        float d = em_load_fp16(b), dmin = em_load_fp16(b + 2);
        for (int sub = 0; sub < 8; sub++) {
            int sc, mn;
            em_quant_k_scale_min(b + 4, sub, &sc, &mn);
            float dl = d * (float)sc, ml = dmin * (float)mn;
            const uint8_t *q = b + 16 + 32 * (sub / 2);
            int shift = 4 * (sub % 2);
            for (int j = 0; j < 32; j++) out[32 * sub + j] = dl * (float)((q[j] >> shift) & 15) - ml;
        }
    }
}

/* Q5_K: as Q4_K plus 32 bytes of fifth bits after the scales (bit s of byte j: element 32s + j). */
static void dequant_q5_k(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 176, out += 256) {
        float d = em_load_fp16(b), dmin = em_load_fp16(b + 2);
        const uint8_t *qh = b + 16;
        for (int sub = 0; sub < 8; sub++) {
            int sc, mn;
            em_quant_k_scale_min(b + 4, sub, &sc, &mn);
            float dl = d * (float)sc, ml = dmin * (float)mn;
            const uint8_t *q = b + 48 + 32 * (sub / 2);
            int shift = 4 * (sub % 2);
            for (int j = 0; j < 32; j++) {
                int v = ((q[j] >> shift) & 15) | (((qh[j] >> sub) & 1) << 4);
                out[32 * sub + j] = dl * (float)v - ml;
            }
        }
    }
}

/* Q6_K: 128 bytes of low nibbles (byte j of 64-byte half h: element 128h + j low, 128h + 64 + j
 * high), 64 bytes of high bit pairs (byte j of 32-byte half h: elements 128h + 32k + j, pair k),
 * 16 signed scales, d. q = (low | high << 4) - 32. */
static void dequant_q6_k(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 210, out += 256) {
        float d = em_load_fp16(b + 208);
        for (int e = 0; e < 256; e++) {
            int half = e / 128, r = e % 128;
            int low = (b[64 * half + r % 64] >> (4 * (r / 64))) & 15;
            int high = (b[128 + 32 * half + r % 32] >> (2 * (r / 32))) & 3;
            float dl = d * (float)(int8_t)b[192 + e / 16];
            out[e] = dl * (float)((low | (high << 4)) - 32);
        }
    }
}

/* Q8_K: f32 d, 256 signed bytes, 16 int16 group sums (not needed to dequantize). */
static void dequant_q8_k(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 292, out += 256) {
        float d = em_load_f32(b);
        for (int j = 0; j < 256; j++) out[j] = d * (float)(int8_t)b[4 + j];
    }
}

/* ---- i-quants: lattice points with separately stored signs ---- */

/* Writes 8 elements: db * magnitude * sign, magnitudes from the packed bytes of `point`. */
static void put8(float *out, float db, uint64_t point, uint8_t signs) {
    for (int j = 0; j < 8; j++) {
        float v = db * (float)((point >> (8 * j)) & 0xff);
        out[j] = (signs >> j) & 1 ? -v : v;
    }
}

/* IQ2_XXS: d, then per 32 elements two u32: four 8-bit grid indices; four 7-bit sign groups and
 * a 4-bit scale (top bits). db = d * (0.5 + scale) / 4. */
static void dequant_iq2_xxs(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 66) {
        float d = em_load_fp16(b);
        for (int ib = 0; ib < 8; ib++, out += 32) {
            uint32_t idx = em_load_u32(b + 2 + 8 * ib), aux = em_load_u32(b + 6 + 8 * ib);
            float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++)
                put8(out + 8 * l, db, em_iq2xxs_grid[(idx >> (8 * l)) & 255], em_iq_signs8(aux >> (7 * l)));
        }
    }
}

/* IQ2_XS: d, 32 u16 (9-bit grid index, 7 sign bits), 8 scale bytes (a nibble per 16 elements). */
static void dequant_iq2_xs(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 74) {
        float d = em_load_fp16(b);
        for (int g = 0; g < 32; g++, out += 8) {
            uint16_t v = em_load_u16(b + 2 + 2 * g);
            int scale = (b[66 + g / 4] >> (4 * ((g / 2) % 2))) & 15;
            float db = d * (0.5f + (float)scale) * 0.25f;
            put8(out, db, em_iq2xs_grid[v & 511], em_iq_signs8(v >> 9));
        }
    }
}

/* IQ2_S: d, 32 low index bytes, 32 sign bytes, 8 bytes of index high bit pairs, 8 scale bytes. */
static void dequant_iq2_s(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 82) {
        float d = em_load_fp16(b);
        for (int g = 0; g < 32; g++, out += 8) {
            int index = b[2 + g] | (((b[66 + g / 4] >> (2 * (g % 4))) & 3) << 8);
            int scale = (b[74 + g / 4] >> (4 * ((g / 2) % 2))) & 15;
            float db = d * (0.5f + (float)scale) * 0.25f;
            put8(out, db, em_iq2s_grid[index], b[34 + g]);
        }
    }
}

/* IQ3_XXS: d, 64 grid index bytes (4 elements each), then per 32 elements a u32 of four 7-bit sign
 * groups and a 4-bit scale. db = d * (0.5 + scale) / 2. */
static void dequant_iq3_xxs(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 98) {
        float d = em_load_fp16(b);
        for (int ib = 0; ib < 8; ib++, out += 32) {
            uint32_t aux = em_load_u32(b + 66 + 4 * ib);
            float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++) {
                const uint8_t *q = b + 2 + 8 * ib + 2 * l;
                uint64_t point = em_iq3xxs_grid[q[0]] | ((uint64_t)em_iq3xxs_grid[q[1]] << 32);
                put8(out + 8 * l, db, point, em_iq_signs8(aux >> (7 * l)));
            }
        }
    }
}

/* IQ3_S: d, 64 low index bytes, 8 bytes of index ninth bits, 32 sign bytes, 4 scale bytes (a
 * nibble per 32 elements); db = d * (1 + 2 * scale). */
static void dequant_iq3_s(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 110) {
        float d = em_load_fp16(b);
        for (int g = 0; g < 32; g++, out += 8) {
            int ib = g / 4;
            float db = d * (float)(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 15));
            int q0 = 2 * g, q1 = 2 * g + 1;
            int i0 = b[2 + q0] | (((b[66 + q0 / 8] >> (q0 % 8)) & 1) << 8);
            int i1 = b[2 + q1] | (((b[66 + q1 / 8] >> (q1 % 8)) & 1) << 8);
            uint64_t point = em_iq3s_grid[i0] | ((uint64_t)em_iq3s_grid[i1] << 32);
            put8(out, db, point, b[74 + g]);
        }
    }
}

/* IQ1_S: d, 32 low index bytes, 8 u16 (three index high bits per group, 3-bit scale, delta sign).
 * Value dl * (grid + delta) with grid in {-1, 0, 1}, dl = d * (2 * scale + 1), delta = +-1/8. */
static void dequant_iq1_s(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 50) {
        float d = em_load_fp16(b);
        for (int ib = 0; ib < 8; ib++) {
            uint16_t qh = em_load_u16(b + 34 + 2 * ib);
            float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            float delta = qh & 0x8000 ? -0.125f : 0.125f;
            for (int k = 0; k < 4; k++, out += 8) {
                uint64_t point = em_iq1s_grid[b[2 + 4 * ib + k] | (((qh >> (3 * k)) & 7) << 8)];
                for (int j = 0; j < 8; j++) out[j] = dl * ((float)(int8_t)(point >> (8 * j)) + delta);
            }
        }
    }
}

/* IQ1_M: 32 low index bytes, 16 bytes (per 8 elements a nibble: 3 index high bits, delta sign),
 * 4 u16 whose top nibbles form the f16 d and whose low 12 bits are four 3-bit scales each (one
 * per 16 elements). */
static void dequant_iq1_m(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 56) {
        uint16_t sc[4];
        for (int k = 0; k < 4; k++) sc[k] = em_load_u16(b + 48 + 2 * k);
        uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0xf0) | ((sc[2] >> 4) & 0xf00) | (sc[3] & 0xf000));
        float d = em_fp16_to_f32(dbits);
        for (int g = 0; g < 32; g++, out += 8) {
            int s = g / 2; /* scale index: one per 16 elements */
            float dl = d * (float)(2 * ((sc[s / 4] >> (3 * (s % 4))) & 7) + 1);
            int nib = (b[32 + g / 2] >> (4 * (g % 2))) & 15;
            float delta = nib & 8 ? -0.125f : 0.125f;
            uint64_t point = em_iq1s_grid[b[g] | ((nib & 7) << 8)];
            for (int j = 0; j < 8; j++) out[j] = dl * ((float)(int8_t)(point >> (8 * j)) + delta);
        }
    }
}

/* IQ4_XS: d, u16 of scale high bit pairs, 4 bytes of scale low nibbles, 128 bytes: sub-block s
 * (32 elements) uses bytes 16s..16s+15, low nibbles first. Scales are 6-bit with offset 32. */
static void dequant_iq4_xs(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 136) {
        float d = em_load_fp16(b);
        uint16_t scales_h = em_load_u16(b + 2);
        for (int s = 0; s < 8; s++, out += 32) {
            int scale = (((b[4 + s / 2] >> (4 * (s % 2))) & 15) | (((scales_h >> (2 * s)) & 3) << 4)) - 32;
            float dl = d * (float)scale;
            const uint8_t *q = b + 8 + 16 * s;
            for (int j = 0; j < 16; j++) {
                out[j] = dl * (float)em_iq4nl_values[q[j] & 15];
                out[j + 16] = dl * (float)em_iq4nl_values[q[j] >> 4];
            }
        }
    }
}

/* ---- ternary formats ---- */

/* TQ1_0: 48 bytes of five base-3 digits each, 4 bytes of four digits, d. A byte stores its digits
 * as a fixed-point fraction of 3^5 (byte = ceil(value * 256 / 243)); digit k is recovered by
 * multiplying by 3^k modulo 256 and taking the top of (byte * 3). Elements: bytes 0..31 give
 * elements 32k + j, bytes 32..47 give 160 + 16k + j, bytes 48..51 give 240 + 4k + j. */
static int tq1_digit(uint8_t byte, int k) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    uint8_t shifted = (uint8_t)(byte * pow3[k]);
    return ((shifted * 3) >> 8) - 1;
}

static void dequant_tq1_0(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 54, out += 256) {
        float d = em_load_fp16(b + 52);
        for (int k = 0; k < 5; k++)
            for (int j = 0; j < 32; j++) out[32 * k + j] = d * (float)tq1_digit(b[j], k);
        for (int k = 0; k < 5; k++)
            for (int j = 0; j < 16; j++) out[160 + 16 * k + j] = d * (float)tq1_digit(b[32 + j], k);
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 4; j++) out[240 + 4 * k + j] = d * (float)tq1_digit(b[48 + j], k);
    }
}

/* TQ2_0: 64 bytes of 2-bit values (byte j of 32-byte half h: elements 128h + 32k + j), d; q - 1. */
static void dequant_tq2_0(const uint8_t *b, float *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, b += 66, out += 256) {
        float d = em_load_fp16(b + 64);
        for (int e = 0; e < 256; e++) {
            int q = (b[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
            out[e] = d * (float)(q - 1);
        }
    }
}

em_dequant_fn em_quant_dequantizer(uint32_t type) {
    switch (type) {
    case EM_TYPE_F32: return dequant_f32;
    case EM_TYPE_F16: return dequant_f16;
    case EM_TYPE_BF16: return dequant_bf16;
    case EM_TYPE_Q4_0: return dequant_q4_0;
    case EM_TYPE_Q4_1: return dequant_q4_1;
    case EM_TYPE_Q5_0: return dequant_q5_0;
    case EM_TYPE_Q5_1: return dequant_q5_1;
    case EM_TYPE_Q8_0: return dequant_q8_0;
    case EM_TYPE_Q8_1: return dequant_q8_1;
    case EM_TYPE_Q2_K: return dequant_q2_k;
    case EM_TYPE_Q3_K: return dequant_q3_k;
    case EM_TYPE_Q4_K: return dequant_q4_k;
    case EM_TYPE_Q5_K: return dequant_q5_k;
    case EM_TYPE_Q6_K: return dequant_q6_k;
    case EM_TYPE_Q8_K: return dequant_q8_k;
    case EM_TYPE_IQ2_XXS: return dequant_iq2_xxs;
    case EM_TYPE_IQ2_XS: return dequant_iq2_xs;
    case EM_TYPE_IQ2_S: return dequant_iq2_s;
    case EM_TYPE_IQ3_XXS: return dequant_iq3_xxs;
    case EM_TYPE_IQ3_S: return dequant_iq3_s;
    case EM_TYPE_IQ1_S: return dequant_iq1_s;
    case EM_TYPE_IQ1_M: return dequant_iq1_m;
    case EM_TYPE_IQ4_NL: return dequant_iq4_nl;
    case EM_TYPE_IQ4_XS: return dequant_iq4_xs;
    case EM_TYPE_TQ1_0: return dequant_tq1_0;
    case EM_TYPE_TQ2_0: return dequant_tq2_0;
    case EM_TYPE_MXFP4: return dequant_mxfp4;
    default: return NULL;
    }
}

em_err em_dequantize(uint32_t type, const void *blocks, float *out, uint64_t n) {
    const em_type_info *info = em_type_info_of(type);
    em_dequant_fn fn = em_quant_dequantizer(type);
    if (!info || !fn) return em_errorf(EM_ERR_UNSUPPORTED, "no dequantizer for tensor type %s", em_type_name(type));
    if (n % info->block_elems != 0)
        return em_errorf(EM_ERR_INVALID, "dequantize %s: %llu elements is not a multiple of the block (%u)", info->name,
                         (unsigned long long)n, info->block_elems);
    fn(blocks, out, n / info->block_elems);
    return NULL;
}
