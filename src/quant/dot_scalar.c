/*
 * Integer scalar dot products of the less common weight formats with their 8-bit activations
 * (dot.c has the common ones and the dispatch). Each sums integer products per sub-block and
 * applies the float scales once per sub-block, the way the formats factor:
 *   affine formats   sum((d*q + m) * d8*a) = d*d8 * sum(q*a) + m*d8 * sum(a)
 *   symmetric ones   sum(d*s*q * d8*a)     = d*d8 * s * sum(q*a)
 * where sum(a) over 16 elements of a Q8_K block is stored in the block (its group sums).
 * Portable C: the path ARM and pre-AVX2 x86 take until they get SIMD kernels.
 */
#include "internal.h"

static int q8_k_group_sum(const uint8_t *a, int g) { return (int16_t)em_load_u16(a + 260 + 2 * g); }

/* ---- with Q8_0 activations ---- */

static float dot_q4_1(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 32; b++, w += 20, a += 34) {
        const int8_t *q8 = (const int8_t *)(a + 2);
        int qa = 0, sa = 0;
        for (int j = 0; j < 16; j++) {
            qa += (w[4 + j] & 15) * q8[j] + (w[4 + j] >> 4) * q8[j + 16];
            sa += q8[j] + q8[j + 16];
        }
        float d8 = em_load_fp16(a);
        sum += em_load_fp16(w) * d8 * (float)qa + em_load_fp16(w + 2) * d8 * (float)sa;
    }
    return sum;
}

static float dot_q5_0(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 32; b++, w += 22, a += 34) {
        const int8_t *q8 = (const int8_t *)(a + 2);
        uint32_t qh = em_load_u32(w + 2);
        int qa = 0;
        for (int j = 0; j < 16; j++) {
            int lo = ((w[6 + j] & 15) | (int)(((qh >> j) & 1) << 4)) - 16;
            int hi = ((w[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16;
            qa += lo * q8[j] + hi * q8[j + 16];
        }
        sum += em_load_fp16(w) * em_load_fp16(a) * (float)qa;
    }
    return sum;
}

static float dot_q5_1(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 32; b++, w += 24, a += 34) {
        const int8_t *q8 = (const int8_t *)(a + 2);
        uint32_t qh = em_load_u32(w + 4);
        int qa = 0, sa = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (w[8 + j] & 15) | (int)(((qh >> j) & 1) << 4);
            int hi = (w[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            qa += lo * q8[j] + hi * q8[j + 16];
            sa += q8[j] + q8[j + 16];
        }
        float d8 = em_load_fp16(a);
        sum += em_load_fp16(w) * d8 * (float)qa + em_load_fp16(w + 2) * d8 * (float)sa;
    }
    return sum;
}

/* IQ4_NL and MXFP4: a 16-entry level table indexed by nibbles, one scale per block. */
static int dot_nibble_table(const uint8_t *q, const int8_t *table, const int8_t *q8) {
    int qa = 0;
    for (int j = 0; j < 16; j++) qa += table[q[j] & 15] * q8[j] + table[q[j] >> 4] * q8[j + 16];
    return qa;
}

static float dot_iq4_nl(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 32; b++, w += 18, a += 34) {
        int qa = dot_nibble_table(w + 2, em_iq4nl_values, (const int8_t *)(a + 2));
        sum += em_load_fp16(w) * em_load_fp16(a) * (float)qa;
    }
    return sum;
}

static float dot_mxfp4(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 32; b++, w += 17, a += 34) {
        int qa = dot_nibble_table(w + 1, em_mxfp4_values, (const int8_t *)(a + 2));
        sum += em_e8m0_half(w[0]) * em_load_fp16(a) * (float)qa;
    }
    return sum;
}

/* ---- with Q8_K activations ---- */

static float dot_q2_k(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 84, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        int scaled = 0, mins = 0;
        for (int g = 0; g < 16; g++) {
            /* group g: half g / 8, bit pair (g % 8) / 2, bytes 16 * (g % 2) .. + 15 of the half */
            const uint8_t *q = w + 16 + 32 * (g / 8) + 16 * (g % 2);
            int shift = 2 * ((g % 8) / 2), qa = 0;
            for (int j = 0; j < 16; j++) qa += ((q[j] >> shift) & 3) * q8[16 * g + j];
            scaled += (w[g] & 15) * qa;
            mins += (w[g] >> 4) * q8_k_group_sum(a, g);
        }
        float d8 = em_load_f32(a);
        sum += em_load_fp16(w + 80) * d8 * (float)scaled - em_load_fp16(w + 82) * d8 * (float)mins;
    }
    return sum;
}

static float dot_q3_k(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 110, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        int total = 0;
        for (int g = 0; g < 16; g++) {
            int lo = (w[96 + g % 8] >> (4 * (g / 8))) & 15, hi = (w[104 + g % 4] >> (2 * (g / 4))) & 3;
            int scale = (lo | (hi << 4)) - 32;
            const uint8_t *q = w + 32 + 32 * (g / 8) + 16 * (g % 2);
            const uint8_t *hmask = w + 16 * (g % 2);
            int shift = 2 * ((g % 8) / 2), bit = g / 2, qa = 0;
            for (int j = 0; j < 16; j++) {
                int v = ((q[j] >> shift) & 3) - (((hmask[j] >> bit) & 1) ? 0 : 4);
                qa += v * q8[16 * g + j];
            }
            total += scale * qa;
        }
        sum += em_load_fp16(w + 108) * em_load_f32(a) * (float)total;
    }
    return sum;
}

static float dot_q5_k(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 176, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        const uint8_t *qh = w + 16;
        int scaled = 0, mins = 0;
        for (int sub = 0; sub < 8; sub++) {
            int sc, mn;
            em_quant_k_scale_min(w + 4, sub, &sc, &mn);
            const uint8_t *q = w + 48 + 32 * (sub / 2);
            int shift = 4 * (sub % 2), qa = 0;
            for (int j = 0; j < 32; j++) qa += (((q[j] >> shift) & 15) | (((qh[j] >> sub) & 1) << 4)) * q8[32 * sub + j];
            scaled += sc * qa;
            mins += mn * (q8_k_group_sum(a, 2 * sub) + q8_k_group_sum(a, 2 * sub + 1));
        }
        float d8 = em_load_f32(a);
        sum += em_load_fp16(w) * d8 * (float)scaled - em_load_fp16(w + 2) * d8 * (float)mins;
    }
    return sum;
}

static float dot_iq4_xs(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 136, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        uint16_t scales_h = em_load_u16(w + 2);
        int total = 0;
        for (int s = 0; s < 8; s++) {
            int scale = (((w[4 + s / 2] >> (4 * (s % 2))) & 15) | (((scales_h >> (2 * s)) & 3) << 4)) - 32;
            total += scale * dot_nibble_table(w + 8 + 16 * s, em_iq4nl_values, q8 + 32 * s);
        }
        sum += em_load_fp16(w) * em_load_f32(a) * (float)total;
    }
    return sum;
}

/* TQ2_0: q - 1 in -1..1; the -1 comes back through the group sums. */
static float dot_tq2_0(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 66, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        int qa = 0, sa = 0;
        for (int e = 0; e < 256; e++) qa += ((w[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3) * q8[e];
        for (int g = 0; g < 16; g++) sa += q8_k_group_sum(a, g);
        sum += em_load_fp16(w + 64) * em_load_f32(a) * (float)(qa - sa);
    }
    return sum;
}

/* TQ1_0: base-3 digits, see dequant.c for the layout. */
static int tq1_digit(uint8_t byte, int k) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    return (((uint8_t)(byte * pow3[k])) * 3) >> 8;
}

static float dot_tq1_0(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 54, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        int qa = 0, sa = 0;
        for (int k = 0; k < 5; k++)
            for (int j = 0; j < 32; j++) qa += tq1_digit(w[j], k) * q8[32 * k + j];
        for (int k = 0; k < 5; k++)
            for (int j = 0; j < 16; j++) qa += tq1_digit(w[32 + j], k) * q8[160 + 16 * k + j];
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 4; j++) qa += tq1_digit(w[48 + j], k) * q8[240 + 4 * k + j];
        for (int g = 0; g < 16; g++) sa += q8_k_group_sum(a, g);
        sum += em_load_fp16(w + 52) * em_load_f32(a) * (float)(qa - sa);
    }
    return sum;
}

/* IQ3_XXS: magnitudes from the grid, signs from the parity-completed groups, scale (2s + 1) / 4. */
static float dot_iq3_xxs(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 98, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        int total = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux = em_load_u32(w + 66 + 4 * ib);
            int qa = 0;
            for (int l = 0; l < 4; l++) {
                uint8_t signs = em_iq_signs8(aux >> (7 * l));
                const uint8_t *q = w + 2 + 8 * ib + 2 * l;
                uint64_t point = em_iq3xxs_grid[q[0]] | ((uint64_t)em_iq3xxs_grid[q[1]] << 32);
                for (int j = 0; j < 8; j++) {
                    int v = (int)((point >> (8 * j)) & 255) * q8[32 * ib + 8 * l + j];
                    qa += (signs >> j) & 1 ? -v : v;
                }
            }
            total += (int)(2 * (aux >> 28) + 1) * qa;
        }
        sum += em_load_fp16(w) * em_load_f32(a) * 0.25f * (float)total;
    }
    return sum;
}

/* Sum over 8 elements of magnitude(point, j) * sign(j) * q8[j]. */
static int dot_point8(uint64_t point, uint8_t signs, const int8_t *q8) {
    int qa = 0;
    for (int j = 0; j < 8; j++) {
        int v = (int)((point >> (8 * j)) & 255) * q8[j];
        qa += (signs >> j) & 1 ? -v : v;
    }
    return qa;
}

/* IQ2 formats: db = d * (0.5 + s) / 4 is applied as the integer (2s + 1) and a final d / 8. */
static float dot_iq2_xxs(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 66, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        int total = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t idx = em_load_u32(w + 2 + 8 * ib), aux = em_load_u32(w + 6 + 8 * ib);
            int qa = 0;
            for (int l = 0; l < 4; l++)
                qa += dot_point8(em_iq2xxs_grid[(idx >> (8 * l)) & 255], em_iq_signs8(aux >> (7 * l)),
                                 q8 + 32 * ib + 8 * l);
            total += (int)(2 * (aux >> 28) + 1) * qa;
        }
        sum += em_load_fp16(w) * em_load_f32(a) * 0.125f * (float)total;
    }
    return sum;
}

static float dot_iq2_xs(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 74, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        int total = 0;
        for (int g = 0; g < 32; g++) {
            uint16_t v = em_load_u16(w + 2 + 2 * g);
            int scale = (w[66 + g / 4] >> (4 * ((g / 2) % 2))) & 15;
            total += (2 * scale + 1) * dot_point8(em_iq2xs_grid[v & 511], em_iq_signs8(v >> 9), q8 + 8 * g);
        }
        sum += em_load_fp16(w) * em_load_f32(a) * 0.125f * (float)total;
    }
    return sum;
}

static float dot_iq2_s(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 82, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        int total = 0;
        for (int g = 0; g < 32; g++) {
            int index = w[2 + g] | (((w[66 + g / 4] >> (2 * (g % 4))) & 3) << 8);
            int scale = (w[74 + g / 4] >> (4 * ((g / 2) % 2))) & 15;
            total += (2 * scale + 1) * dot_point8(em_iq2s_grid[index], w[34 + g], q8 + 8 * g);
        }
        sum += em_load_fp16(w) * em_load_f32(a) * 0.125f * (float)total;
    }
    return sum;
}

static float dot_iq3_s(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 110, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        int total = 0;
        for (int g = 0; g < 32; g++) {
            int ib = g / 4, q0 = 2 * g, q1 = 2 * g + 1;
            int scale = 1 + 2 * ((w[106 + ib / 2] >> (4 * (ib % 2))) & 15);
            int i0 = w[2 + q0] | (((w[66 + q0 / 8] >> (q0 % 8)) & 1) << 8);
            int i1 = w[2 + q1] | (((w[66 + q1 / 8] >> (q1 % 8)) & 1) << 8);
            uint64_t point = em_iq3s_grid[i0] | ((uint64_t)em_iq3s_grid[i1] << 32);
            total += scale * dot_point8(point, w[74 + g], q8 + 8 * g);
        }
        sum += em_load_fp16(w) * em_load_f32(a) * (float)total;
    }
    return sum;
}

/* IQ1 formats: dl * (g + delta) with delta = +-1/8 is summed as (2s + 1) * (8 * sum(g q) +- sum(q))
 * and scaled by d / 8 at the end. */
static int dot_iq1_point8(uint64_t point, const int8_t *q8, int *sum_q) {
    int qa = 0, sq = 0;
    for (int j = 0; j < 8; j++) {
        qa += (int8_t)(point >> (8 * j)) * q8[j];
        sq += q8[j];
    }
    *sum_q = sq;
    return qa;
}

static float dot_iq1_s(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 50, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        int total = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint16_t qh = em_load_u16(w + 34 + 2 * ib);
            int qa = 0, sq = 0;
            for (int k = 0; k < 4; k++) {
                int s;
                qa += dot_iq1_point8(em_iq1s_grid[w[2 + 4 * ib + k] | (((qh >> (3 * k)) & 7) << 8)],
                                     q8 + 32 * ib + 8 * k, &s);
                sq += s;
            }
            total += (2 * ((qh >> 12) & 7) + 1) * (8 * qa + (qh & 0x8000 ? -sq : sq));
        }
        sum += em_load_fp16(w) * em_load_f32(a) * 0.125f * (float)total;
    }
    return sum;
}

static float dot_iq1_m(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 56, a += 292) {
        const int8_t *q8 = (const int8_t *)(a + 4);
        uint16_t sc[4];
        for (int k = 0; k < 4; k++) sc[k] = em_load_u16(w + 48 + 2 * k);
        uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0xf0) | ((sc[2] >> 4) & 0xf00) | (sc[3] & 0xf000));
        int total = 0;
        for (int g = 0; g < 32; g++) {
            int s16 = g / 2, nib = (w[32 + g / 2] >> (4 * (g % 2))) & 15, sq;
            int qa = dot_iq1_point8(em_iq1s_grid[w[g] | ((nib & 7) << 8)], q8 + 8 * g, &sq);
            total += (2 * ((sc[s16 / 4] >> (3 * (s16 % 4))) & 7) + 1) * (8 * qa + (nib & 8 ? -sq : sq));
        }
        sum += em_fp16_decode(dbits) * em_load_f32(a) * 0.125f * (float)total;
    }
    return sum;
}

em_dot_fn em_quant_dot_scalar_extra(uint32_t weight_type) {
    switch (weight_type) {
    case EM_TYPE_Q4_1: return dot_q4_1;
    case EM_TYPE_Q5_0: return dot_q5_0;
    case EM_TYPE_Q5_1: return dot_q5_1;
    case EM_TYPE_IQ4_NL: return dot_iq4_nl;
    case EM_TYPE_MXFP4: return dot_mxfp4;
    case EM_TYPE_Q2_K: return dot_q2_k;
    case EM_TYPE_Q3_K: return dot_q3_k;
    case EM_TYPE_Q5_K: return dot_q5_k;
    case EM_TYPE_IQ4_XS: return dot_iq4_xs;
    case EM_TYPE_TQ1_0: return dot_tq1_0;
    case EM_TYPE_TQ2_0: return dot_tq2_0;
    case EM_TYPE_IQ3_XXS: return dot_iq3_xxs;
    case EM_TYPE_IQ2_XXS: return dot_iq2_xxs;
    case EM_TYPE_IQ2_XS: return dot_iq2_xs;
    case EM_TYPE_IQ2_S: return dot_iq2_s;
    case EM_TYPE_IQ3_S: return dot_iq3_s;
    case EM_TYPE_IQ1_S: return dot_iq1_s;
    case EM_TYPE_IQ1_M: return dot_iq1_m;
    default: return NULL;
    }
}
