/*
 * Importance-weighted quantizers: the row quantizers llama.cpp runs when an importance matrix gives
 * every column of a weight matrix a weight (its mean squared activation over calibration text).
 *
 * These follow llama.cpp's algorithms step for step (ggml-quants.c: make_qx_quants, make_qkx3_quants,
 * make_qp_quants and the quantize_row_*_impl functions), including the order of float operations
 * and the round-half-to-even of its nearest_int, so that a file Ember quantizes with an importance
 * matrix holds the bytes llama-quantize writes for it (tests/cli/imatrix_peer.sh checks that
 * against llama.cpp's own library). The element weight is importance[col] * sqrt(sigma2 + x^2),
 * sigma2 a multiple of the block's (or row's) mean square, except Q6_K, which takes the importance
 * as it is. Like llama.cpp, every row shares the one importance vector of its matrix.
 *
 * Without importance values Ember keeps its own searches (kquants.c, quantize.c); llama.cpp's
 * unweighted paths are different algorithms again, so unit importance does not give the
 * unweighted bytes in either program. Q8_0, F16, BF16, F32, MXFP4, TQ1_0 and TQ2_0 ignore the
 * weights (llama.cpp does too); IQ3_XXS weights Ember's own lattice search (kquants.c).
 */
#include "internal.h"

#define GROUP_EPS 1e-15f /* a group whose largest magnitude is below this is all zeros */

/* Round to nearest, ties to even, as llama.cpp's nearest_int: adding 1.5 * 2^23 leaves the
 * rounded integer in the low mantissa bits. Exact for |v| < 2^22; larger or non-finite inputs give
 * some integer (callers clamp), never undefined behaviour. */
static int round_even(float v) {
    float shifted = v + 12582912.f;
    int32_t bits;
    memcpy(&bits, &shifted, 4);
    return (bits & 0x007fffff) - 0x00400000;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
static int mini(int a, int b) { return a < b ? a : b; }

/* Symmetric levels x ~ scale * (L - nmax), L in [0, 2 nmax - 1], maximizing the weighted
 * sum_xl^2 / sum_ll over 19 scales around the one putting the largest magnitude at -nmax
 * (llama.cpp's make_qx_quants, rmse_type 1). Returns the least-squares scale. */
static float fit_symmetric_weighted(int n, int nmax, const float *x, const float *w, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0;
    }
    float iscale = (float)-nmax / max, sum_lx = 0, sum_l2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        sum_lx += w[i] * x[i] * (float)l;
        sum_l2 += w[i] * (float)l * (float)l;
    }
    float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.0f, best = scale * sum_lx;
    for (int step = -9; step <= 9; step++) {
        if (step == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)step) / max;
        sum_lx = sum_l2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
            sum_lx += w[i] * x[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
        }
        if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + clampi(round_even(iscale * x[i]), -nmax, nmax - 1));
            scale = sum_lx / sum_l2;
            best = scale * sum_lx;
        }
    }
    return scale;
}

/* Affine levels x ~ scale * L - min, L in [0, nmax], min >= 0: 37 level spacings, each refit by
 * weighted least squares for (scale, min), the smallest weighted squared error kept (llama.cpp's
 * make_qkx3_quants with rmin -0.9, rdelta 0.05, 36 steps). Returns the scale; *min_out the min. */
static float fit_affine_weighted(int n, int nmax, const float *x, const float *w, uint8_t *L, float *min_out) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max <= min) {
        memset(L, 0, (size_t)n);
        *min_out = -min;
        return 0;
    }
    float iscale = (float)nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(round_even(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        best_error += w[i] * (diff * diff);
    }
    uint8_t trial[32];
    for (int step = 0; step <= 36; step++) {
        iscale = (-0.9f + 0.05f * (float)step + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            float v = iscale * (x[i] - min);
            int l = v > 0 ? round_even(v < (float)nmax ? v : (float)nmax) : 0;
            trial[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        float det = sum_w * sum_l2 - sum_l * sum_l;
        if (det <= 0) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float error = 0;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * (float)trial[i] + this_min - x[i];
            error += w[i] * (diff * diff);
        }
        if (error < best_error) {
            memcpy(L, trial, (size_t)n);
            best_error = error;
            scale = this_scale;
            min = this_min;
        }
    }
    *min_out = -min;
    return scale;
}

/* Non-negative steps L in [0, nmax] of one super scale for the sub-block scales (or mins) x,
 * weighted by the sub-blocks' total weights: a search of 9 scales by weighted squared error, then
 * up to 5 rounds moving single steps while that raises sum_lx^2 / sum_l2 (llama.cpp's
 * make_qp_quants). L is uint8_t like llama.cpp's, so out-of-range roundings wrap the same way. */
static float fit_scales_weighted(int n, int nmax, const float *x, const float *w, uint8_t *L) {
    float max = 0;
    for (int i = 0; i < n; i++) max = max > x[i] ? max : x[i];
    if (max < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0;
    }
    float iscale = (float)nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)round_even(iscale * x[i]);
    float scale = 1 / iscale, best_mse = 0;
    for (int i = 0; i < n; i++) {
        float diff = x[i] - scale * (float)L[i];
        best_mse += w[i] * diff * diff;
    }
    for (int step = -4; step <= 4; step++) {
        if (step == 0) continue;
        float iscale_step = (0.1f * (float)step + (float)nmax) / max, scale_step = 1 / iscale_step, mse = 0;
        for (int i = 0; i < n; i++) {
            int l = mini(nmax, round_even(iscale_step * x[i]));
            float diff = x[i] - scale_step * (float)l;
            mse += w[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_step;
        }
    }
    float sum_lx = 0, sum_l2 = 0;
    for (int i = 0; i < n; i++) {
        int l = mini(nmax, round_even(iscale * x[i]));
        L[i] = (uint8_t)l;
        sum_lx += w[i] * x[i] * (float)l;
        sum_l2 += w[i] * (float)l * (float)l;
    }
    for (int round = 0; round < 5; round++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float slx = sum_lx - w[i] * x[i] * (float)L[i], sl2 = sum_l2 - w[i] * (float)L[i] * (float)L[i];
            if (!(slx > 0 && sl2 > 0)) continue;
            int l = mini(nmax, round_even(x[i] * sl2 / slx));
            if (l == L[i]) continue;
            slx += w[i] * x[i] * (float)l;
            sl2 += w[i] * (float)l * (float)l;
            if (slx * slx * sum_l2 > sum_lx * sum_lx * sl2) {
                L[i] = (uint8_t)l;
                sum_lx = slx;
                sum_l2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    return sum_l2 > 0 ? sum_lx / sum_l2 : 0.0f;
}

/* Element weights importance * sqrt(sigma2 + x^2) for `n` elements. */
static void element_weights(const float *x, const float *importance, float sigma2, int n, float *w) {
    for (int i = 0; i < n; i++) w[i] = importance[i] * sqrtf(sigma2 + x[i] * x[i]);
}

static float sum_squares(const float *x, uint64_t n) {
    float s = 0;
    for (uint64_t i = 0; i < n; i++) s += x[i] * x[i];
    return s;
}

/* ---- 32-element formats (sigma2 is the mean square of the whole row) ---- */

static void q4_0_row(const float *x, const float *imp, uint8_t *out, uint64_t n) {
    const float sigma2 = sum_squares(x, n) / (float)n;
    for (uint64_t b = 0; b < n / 32; b++, x += 32, imp += 32, out += 18) {
        float w[32];
        int8_t L[32];
        element_weights(x, imp, sigma2, 32, w);
        em_store_u16(out, em_f32_to_fp16(fit_symmetric_weighted(32, 8, x, w, L)));
        for (int j = 0; j < 16; j++) out[2 + j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}

static void q5_0_row(const float *x, const float *imp, uint8_t *out, uint64_t n) {
    const float sigma2 = sum_squares(x, n) / (float)n;
    for (uint64_t b = 0; b < n / 32; b++, x += 32, imp += 32, out += 22) {
        float w[32];
        int8_t L[32];
        element_weights(x, imp, sigma2, 32, w);
        em_store_u16(out, em_f32_to_fp16(fit_symmetric_weighted(32, 16, x, w, L)));
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            out[6 + j] = (uint8_t)((L[j] & 15) | ((L[j + 16] & 15) << 4));
            qh |= (uint32_t)((L[j] >> 4) & 1) << j;
            qh |= (uint32_t)((L[j + 16] >> 4) & 1) << (j + 16);
        }
        for (int k = 0; k < 4; k++) out[2 + k] = (uint8_t)(qh >> (8 * k));
    }
}

/* Q4_1 (nmax 15, 20-byte blocks) and Q5_1 (nmax 31, 24-byte blocks with the fifth bits). */
static void q4_1_q5_1_row(const float *x, const float *imp, uint8_t *out, uint64_t n, int nmax) {
    const float sigma2 = sum_squares(x, n) / (float)n;
    const int bytes = nmax == 15 ? 20 : 24, qs = nmax == 15 ? 4 : 8;
    for (uint64_t b = 0; b < n / 32; b++, x += 32, imp += 32, out += bytes) {
        float w[32], min;
        uint8_t L[32];
        element_weights(x, imp, sigma2, 32, w);
        float d = fit_affine_weighted(32, nmax, x, w, L, &min);
        em_store_u16(out, em_f32_to_fp16(d));
        em_store_u16(out + 2, em_f32_to_fp16(-min));
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            out[qs + j] = (uint8_t)((L[j] & 15) | ((L[j + 16] & 15) << 4));
            qh |= (uint32_t)(L[j] >> 4) << j;
            qh |= (uint32_t)(L[j + 16] >> 4) << (j + 16);
        }
        if (nmax == 31)
            for (int k = 0; k < 4; k++) out[4 + k] = (uint8_t)(qh >> (8 * k));
    }
}

/* ---- K-formats (256-element blocks) ---- */

static void q2_k_row(const float *x, const float *imp, uint8_t *out, uint64_t n) {
    for (uint64_t b = 0; b < n / 256; b++, x += 256, imp += 256, out += 84) {
        const float sigma2 = sum_squares(x, 256) / 256;
        uint8_t L[256], Ls[16], Lm[16];
        float scales[16], mins[16], sw[16], w[16];
        for (int j = 0; j < 16; j++) {
            element_weights(x + 16 * j, imp + 16 * j, sigma2, 16, w);
            sw[j] = 0;
            for (int l = 0; l < 16; l++) sw[j] += w[l];
            scales[j] = fit_affine_weighted(16, 3, x + 16 * j, w, L + 16 * j, &mins[j]);
        }
        uint16_t d16 = em_f32_to_fp16(fit_scales_weighted(16, 15, scales, sw, Ls));
        uint16_t m16 = em_f32_to_fp16(fit_scales_weighted(16, 15, mins, sw, Lm));
        const float dm = em_fp16_to_f32(d16), mm = em_fp16_to_f32(m16);
        for (int j = 0; j < 16; j++) {
            out[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
            const float d = dm * (float)(out[j] & 15);
            if (d == 0) continue;
            const float m = mm * (float)(out[j] >> 4);
            for (int i = 0; i < 16; i++) L[16 * j + i] = (uint8_t)clampi(round_even((x[16 * j + i] + m) / d), 0, 3);
        }
        memset(out + 16, 0, 64);
        for (int e = 0; e < 256; e++) out[16 + 32 * (e / 128) + e % 32] |= (uint8_t)(L[e] << (2 * ((e % 128) / 32)));
        em_store_u16(out + 80, d16);
        em_store_u16(out + 82, m16);
    }
}

static void q3_k_row(const float *x, const float *imp, uint8_t *out, uint64_t n) {
    for (uint64_t b = 0; b < n / 256; b++, x += 256, imp += 256, out += 110) {
        const float sigma2 = 2 * sum_squares(x, 256) / 256;
        int8_t L[256], Ls[16];
        float scales[16], sw[16], w[16];
        for (int j = 0; j < 16; j++) {
            element_weights(x + 16 * j, imp + 16 * j, sigma2, 16, w);
            sw[j] = 0;
            for (int l = 0; l < 16; l++) sw[j] += w[l];
            scales[j] = fit_symmetric_weighted(16, 4, x + 16 * j, w, L + 16 * j);
        }
        uint16_t d16 = em_f32_to_fp16(fit_symmetric_weighted(16, 32, scales, sw, Ls));
        memset(out, 0, 108);
        for (int k = 0; k < 16; k++) { /* Ls is already offset by 32 */
            out[96 + k % 8] |= (uint8_t)((Ls[k] & 15) << (4 * (k / 8)));
            out[104 + k % 4] |= (uint8_t)((Ls[k] >> 4) << (2 * (k / 4)));
        }
        const float d_all = em_fp16_to_f32(d16);
        for (int k = 0; k < 16; k++) {
            const float d = d_all * (float)(Ls[k] - 32);
            if (d == 0) continue;
            for (int i = 0; i < 16; i++) L[16 * k + i] = (int8_t)(clampi(round_even(x[16 * k + i] / d), -4, 3) + 4);
        }
        for (int e = 0; e < 256; e++) { /* levels 0..7: bit 2 is the stored high bit */
            out[e % 32] |= (uint8_t)(((L[e] >> 2) & 1) << (e / 32));
            out[32 + 32 * (e / 128) + e % 32] |= (uint8_t)((L[e] & 3) << (2 * ((e % 128) / 32)));
        }
        em_store_u16(out + 108, d16);
    }
}

/* Q4_K (nmax 15) and Q5_K (nmax 31): eight 32-element sub-blocks with 6-bit scales and mins. */
static void q4_k_q5_k_row(const float *x, const float *imp, uint8_t *out, uint64_t n, int nmax) {
    const int bytes = nmax == 15 ? 144 : 176;
    for (uint64_t b = 0; b < n / 256; b++, x += 256, imp += 256, out += bytes) {
        const float sigma2 = 2 * sum_squares(x, 256) / 256;
        uint8_t L[256], Ls[8], Lm[8];
        float scales[8], mins[8], sw[8], w[32];
        for (int j = 0; j < 8; j++) {
            element_weights(x + 32 * j, imp + 32 * j, sigma2, 32, w);
            sw[j] = 0;
            for (int l = 0; l < 32; l++) sw[j] += w[l];
            scales[j] = fit_affine_weighted(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j]);
        }
        uint16_t d16 = em_f32_to_fp16(fit_scales_weighted(8, 63, scales, sw, Ls));
        uint16_t m16 = em_f32_to_fp16(fit_scales_weighted(8, 63, mins, sw, Lm));
        uint8_t *s = out + 4;
        for (int j = 0; j < 8; j++) {
            /* llama.cpp caps the steps at 63 for Q5_K only; in range they are the same */
            uint8_t ls = nmax == 31 && Ls[j] > 63 ? 63 : Ls[j], lm = nmax == 31 && Lm[j] > 63 ? 63 : Lm[j];
            if (j < 4) {
                s[j] = ls;
                s[j + 4] = lm;
            } else {
                s[j + 4] = (uint8_t)((ls & 15) | ((lm & 15) << 4));
                s[j - 4] |= (uint8_t)((ls >> 4) << 6);
                s[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        const float dm = em_fp16_to_f32(d16), mm = em_fp16_to_f32(m16);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            em_quant_k_scale_min(s, j, &sc, &m);
            const float d = dm * (float)sc;
            if (d == 0) continue;
            const float dmin = mm * (float)m;
            for (int i = 0; i < 32; i++)
                L[32 * j + i] = (uint8_t)clampi(round_even((x[32 * j + i] + dmin) / d), 0, nmax);
        }
        em_store_u16(out, d16);
        em_store_u16(out + 2, m16);
        if (nmax == 15) {
            for (int c = 0; c < 4; c++)
                for (int j = 0; j < 32; j++)
                    out[16 + 32 * c + j] = (uint8_t)(L[64 * c + j] | (L[64 * c + 32 + j] << 4));
        } else {
            memset(out + 16, 0, 32);
            for (int e = 0; e < 256; e++) out[16 + e % 32] |= (uint8_t)((L[e] >> 4) << (e / 32));
            for (int c = 0; c < 4; c++)
                for (int j = 0; j < 32; j++)
                    out[48 + 32 * c + j] = (uint8_t)((L[64 * c + j] & 15) | ((L[64 * c + 32 + j] & 15) << 4));
        }
    }
}

/* Q6_K: the sub-block fits take the importance itself as the weight (llama.cpp's choice for this
 * format); the super scale and re-rounding are those of the unweighted reference. */
static void q6_k_row(const float *x, const float *imp, uint8_t *out, uint64_t n) {
    for (uint64_t b = 0; b < n / 256; b++, x += 256, imp += 256, out += 210) {
        int8_t L[256], q[16];
        float scales[16], max_scale = 0, max_abs_scale = 0;
        for (int k = 0; k < 16; k++) {
            scales[k] = fit_symmetric_weighted(16, 32, x + 16 * k, imp + 16 * k, L + 16 * k);
            if (fabsf(scales[k]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[k]);
                max_scale = scales[k];
            }
        }
        memset(out, 0, 210);
        if (max_abs_scale < GROUP_EPS) continue;
        const float iscale = -128.f / max_scale;
        const uint16_t d16 = em_f32_to_fp16(1 / iscale);
        const float d_all = em_fp16_to_f32(d16);
        for (int k = 0; k < 16; k++) q[k] = (int8_t)mini(127, round_even(iscale * scales[k]));
        for (int k = 0; k < 16; k++) {
            const float d = d_all * (float)q[k];
            if (d == 0) continue;
            for (int i = 0; i < 16; i++) L[16 * k + i] = (int8_t)(clampi(round_even(x[16 * k + i] / d), -32, 31) + 32);
        }
        for (int e = 0; e < 256; e++) {
            int u = L[e], h = e / 128, r = e % 128;
            out[64 * h + r % 64] |= (uint8_t)((u & 15) << (4 * (r / 64)));
            out[128 + 32 * h + r % 32] |= (uint8_t)((u >> 4) << (2 * (r / 32)));
        }
        for (int k = 0; k < 16; k++) out[192 + k] = (uint8_t)q[k];
        em_store_u16(out + 208, d16);
    }
}

/* ---- non-linear 4-bit formats ---- */

/* Index of the IQ4_NL level nearest to v (ties go to the larger level, as in llama.cpp). */
static int nearest_nl_level(float v) {
    const int8_t *values = em_iq4nl_values;
    if (v <= (float)values[0]) return 0;
    if (v >= (float)values[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < (float)values[mid]) hi = mid;
        else lo = mid;
    }
    return v - (float)values[hi - 1] < (float)values[hi] - v ? hi - 1 : hi;
}

/* Scale of one 32-element sub-block on the IQ4_NL levels: the least-squares scale at the scale
 * mapping the largest magnitude to the extreme level, then 15 trial scales (llama.cpp's
 * quantize_row_iq4_nl_impl with ntry 7). */
static float fit_nl_weighted(const float *x, const float *w) {
    const int8_t *values = em_iq4nl_values;
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    if (amax < GROUP_EPS) return 0;
    float d = -max / (float)values[0], id = 1 / d, sum_qx = 0, sum_q2 = 0;
    for (int j = 0; j < 32; j++) {
        float q = (float)values[nearest_nl_level(id * x[j])];
        sum_qx += w[j] * q * x[j];
        sum_q2 += w[j] * q * q;
    }
    d = sum_qx / sum_q2;
    float best = d * sum_qx;
    for (int step = -7; step <= 7; step++) {
        id = (float)(step + values[0]) / max;
        sum_qx = sum_q2 = 0;
        for (int j = 0; j < 32; j++) {
            float q = (float)values[nearest_nl_level(id * x[j])];
            sum_qx += w[j] * q * x[j];
            sum_q2 += w[j] * q * q;
        }
        if (sum_q2 > 0 && sum_qx * sum_qx > best * sum_q2) {
            d = sum_qx / sum_q2;
            best = d * sum_qx;
        }
    }
    return d;
}

static void put_nl_levels(const float *x, float id, uint8_t *q) {
    for (int j = 0; j < 16; j++)
        q[j] = (uint8_t)(nearest_nl_level(id * x[j]) | (nearest_nl_level(id * x[j + 16]) << 4));
}

static void iq4_nl_row(const float *x, const float *imp, uint8_t *out, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++, x += 32, imp += 32, out += 18) {
        float w[32];
        element_weights(x, imp, 2 * sum_squares(x, 32) / 32, 32, w);
        const float d = fit_nl_weighted(x, w);
        em_store_u16(out, em_f32_to_fp16(d));
        put_nl_levels(x, d != 0 ? 1 / d : 0, out + 2);
    }
}

static void iq4_xs_row(const float *x, const float *imp, uint8_t *out, uint64_t n) {
    for (uint64_t b = 0; b < n / 256; b++, x += 256, imp += 256, out += 136) {
        const float sigma2 = 2 * sum_squares(x, 256) / 256;
        float scales[8], w[32], max_scale = 0, amax_scale = 0;
        for (int s = 0; s < 8; s++) {
            element_weights(x + 32 * s, imp + 32 * s, sigma2, 32, w);
            scales[s] = fit_nl_weighted(x + 32 * s, w);
            if (fabsf(scales[s]) > amax_scale) {
                amax_scale = fabsf(scales[s]);
                max_scale = scales[s];
            }
        }
        const float d = -max_scale / 32, id = d != 0 ? 1 / d : 0.0f;
        em_store_u16(out, em_f32_to_fp16(d));
        uint16_t scales_h = 0;
        memset(out + 4, 0, 4);
        for (int s = 0; s < 8; s++) {
            const int l = clampi(round_even(id * scales[s]), -32, 31);
            const float dl = d * (float)l;
            put_nl_levels(x + 32 * s, dl != 0 ? 1 / dl : 0.0f, out + 8 + 16 * s);
            out[4 + s / 2] |= (uint8_t)(((l + 32) & 15) << (4 * (s % 2)));
            scales_h |= (uint16_t)(((l + 32) >> 4) << (2 * s));
        }
        em_store_u16(out + 2, scales_h);
    }
}

bool em_quant_weighted_row(uint32_t type, const float *x, const float *importance, uint8_t *out, uint64_t n) {
    switch (type) {
    case EM_TYPE_Q4_0: q4_0_row(x, importance, out, n); return true;
    case EM_TYPE_Q4_1: q4_1_q5_1_row(x, importance, out, n, 15); return true;
    case EM_TYPE_Q5_0: q5_0_row(x, importance, out, n); return true;
    case EM_TYPE_Q5_1: q4_1_q5_1_row(x, importance, out, n, 31); return true;
    case EM_TYPE_Q2_K: q2_k_row(x, importance, out, n); return true;
    case EM_TYPE_Q3_K: q3_k_row(x, importance, out, n); return true;
    case EM_TYPE_Q4_K: q4_k_q5_k_row(x, importance, out, n, 15); return true;
    case EM_TYPE_Q5_K: q4_k_q5_k_row(x, importance, out, n, 31); return true;
    case EM_TYPE_Q6_K: q6_k_row(x, importance, out, n); return true;
    case EM_TYPE_IQ4_NL: iq4_nl_row(x, importance, out, n); return true;
    case EM_TYPE_IQ4_XS: iq4_xs_row(x, importance, out, n); return true;
    default: return false;
    }
}
