/*
 * Quantizers of the formats that search for their scales: Q2_K..Q6_K, Q8_K, IQ4_NL, IQ4_XS, IQ3_XXS.
 *
 * Two levels, as the formats have: each sub-block (16 or 32 elements) first gets its own float
 * scale (and min for the affine formats) by a small search that minimizes the squared error
 * (fit_symmetric, fit_affine, fit_nonlinear); then the sub-block scales are themselves quantized
 * against one f16 super-block scale, and every element is re-rounded against the scale it will
 * actually be decoded with. The objective is plain (unweighted) squared error: without an
 * importance matrix every weight counts the same (with one, weighted.c runs llama.cpp's weighted
 * algorithms instead; only IQ3_XXS takes weights here, in its own search). These quantizers need
 * not match another implementation bit for bit (no test or file depends on that); the tests bound
 * their error.
 */
#include <float.h>
#include <stdlib.h>

#include "internal.h"
#include "x86/dot_x86.h"

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static float fp16_round(float f) { return em_fp16_to_f32(em_f32_to_fp16(f)); }

/* Symmetric fit x ~ scale * L, L in [-nmax, nmax - 1] (two's-complement style ranges: the extra
 * negative level is only reachable when the sign of the scale puts the largest element there).
 * Tries scales around the one mapping the largest-magnitude element to either end, solving the
 * least-squares scale for each rounding. Returns the scale; L gets the levels. */
static float fit_symmetric(const float *x, int n, int nmax, int *L) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    if (amax < 1e-30f) {
        for (int j = 0; j < n; j++) L[j] = 0;
        return 0;
    }
    float best_score = -1, best_scale = 0;
    int trial[32];
    for (int side = 0; side < 2; side++) {
        for (int step = -9; step <= 9; step++) {
            float top = side == 0 ? -(float)nmax : (float)(nmax - 1);
            float iscale = (top + 0.1f * (float)step * (side == 0 ? -1.0f : 1.0f)) / max;
            float sum_xl = 0, sum_ll = 0;
            for (int j = 0; j < n; j++) {
                trial[j] = clampi(em_round_int(iscale * x[j]), -nmax, nmax - 1);
                sum_xl += x[j] * (float)trial[j];
                sum_ll += (float)(trial[j] * trial[j]);
            }
            /* The error at the least-squares scale is sum(x^2) - sum_xl^2 / sum_ll: maximize the
             * subtracted term. */
            if (sum_ll > 0 && sum_xl * sum_xl / sum_ll > best_score) {
                best_score = sum_xl * sum_xl / sum_ll;
                best_scale = sum_xl / sum_ll;
                memcpy(L, trial, sizeof(int) * (size_t)n);
            }
        }
    }
    return best_scale;
}

/* Least-squares (scale, offset) for x ~ scale * L + offset with offset <= 0 (the formats store a
 * non-negative min that is subtracted), from the sums of L, L^2, x, x^2, x*L over n elements.
 * Returns the squared error, in closed form (double, to keep the cancellation harmless). */
static double solve_affine(int n, double sl, double sll, double sx, double sxx, double sxl, float *scale, float *offset) {
    double det = n * sll - sl * sl, s = 0, o = 0;
    if (det > 0) {
        s = (n * sxl - sl * sx) / det;
        o = (sll * sx - sl * sxl) / det;
    }
    if (det <= 0 || o > 0) {
        o = 0;
        s = sll > 0 ? sxl / sll : 0;
    }
    *scale = (float)s;
    *offset = (float)o;
    return sxx - 2 * s * sxl - 2 * o * sx + s * s * sll + 2 * s * o * sl + n * o * o;
}

/* Levels for x at (scale, offset) or (iscale, base) and the least-squares refit; one pass. */
static double affine_trial(const float *x, int n, int nmax, float iscale, float base, double sx, double sxx, int *L,
                           float *scale, float *offset) {
    int sl = 0, sll = 0;
    double sxl = 0;
    for (int j = 0; j < n; j++) {
        int l = clampi(em_round_int(iscale * (x[j] - base)), 0, nmax);
        L[j] = l;
        sl += l;
        sll += l * l;
        sxl += (double)x[j] * l;
    }
    return solve_affine(n, sl, sll, sx, sxx, sxl, scale, offset);
}

/* Affine fit x ~ scale * L - min, L in [0, nmax], scale >= 0, min >= 0. Searches the level spacing
 * around (max - min) / nmax, then polishes with a few rounds of re-rounding and re-solving. */
static float fit_affine(const float *x, int n, int nmax, int *L, float *min_out) {
    float lo = x[0], hi = x[0];
    double sx = 0, sxx = 0;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
        sx += x[j];
        sxx += (double)x[j] * x[j];
    }
    if (lo > 0) lo = 0;
    if (hi <= lo) {
        for (int j = 0; j < n; j++) L[j] = 0;
        *min_out = -lo;
        return 0;
    }
    int trial[32];
    double best_err = DBL_MAX;
    float best_scale = 0, best_offset = lo;
    for (int step = -10; step <= 10; step++) {
        float s, o, iscale = ((float)nmax + 0.1f * (float)step) / (hi - lo);
        double err = affine_trial(x, n, nmax, iscale, lo, sx, sxx, trial, &s, &o);
        if (err < best_err && s > 0) {
            best_err = err;
            best_scale = s;
            best_offset = o;
            memcpy(L, trial, sizeof(int) * (size_t)n);
        }
    }
    for (int round = 0; round < 3 && best_scale > 0; round++) {
        float s, o;
        double err = affine_trial(x, n, nmax, 1.0f / best_scale, best_offset, sx, sxx, trial, &s, &o);
        if (!(err < best_err) || s <= 0) break;
        best_err = err;
        best_scale = s;
        best_offset = o;
        memcpy(L, trial, sizeof(int) * (size_t)n);
    }
    *min_out = -best_offset;
    return best_scale;
}

/* Quantizes non-negative sub-block values v[k] to `levels` steps of a super scale (stored as f16);
 * returns the super scale as decoded, q gets the steps. */
static float quantize_unsigned_scales(const float *v, int count, int levels, int *q) {
    float max = 0;
    for (int k = 0; k < count; k++)
        if (v[k] > max) max = v[k];
    float d = fp16_round(max / (float)levels);
    for (int k = 0; k < count; k++) q[k] = d > 0 ? clampi(em_round_int(v[k] / d), 0, levels) : 0;
    return d;
}

/* Signed counterpart: steps in [-half, half - 1], the largest magnitude mapped to -half. */
static float quantize_signed_scales(const float *v, int count, int half, int *q) {
    float amax = 0, max = 0;
    for (int k = 0; k < count; k++)
        if (fabsf(v[k]) > amax) {
            amax = fabsf(v[k]);
            max = v[k];
        }
    float d = fp16_round(max / -(float)half);
    for (int k = 0; k < count; k++) q[k] = d != 0 ? clampi(em_round_int(v[k] / d), -half, half - 1) : 0;
    return d;
}

/* ---- affine K-formats ---- */

/* Per 256-element block: sub-block levels L (0..nmax) for sub-blocks of `sub` elements, with
 * quantized scales/mins (steps qs/qm of the super scales d/dmin, `levels` steps). */
static void quantize_affine_block(const float *x, int sub, int nmax, int levels, int *L, int *qs, int *qm, float *d,
                                  float *dmin) {
    int n_sub = 256 / sub;
    float scales[16] = {0}, mins[16] = {0}; /* initialized: gcc -O1 cannot see n_sub <= 16 */
    for (int k = 0; k < n_sub; k++) scales[k] = fit_affine(x + sub * k, sub, nmax, L + sub * k, &mins[k]);
    *d = quantize_unsigned_scales(scales, n_sub, levels, qs);
    *dmin = quantize_unsigned_scales(mins, n_sub, levels, qm);
    for (int k = 0; k < n_sub; k++) {
        float dl = *d * (float)qs[k], ml = *dmin * (float)qm[k];
        for (int j = 0; j < sub; j++)
            L[sub * k + j] = dl > 0 ? clampi(em_round_int((x[sub * k + j] + ml) / dl), 0, nmax) : 0;
    }
}

void em_quantize_q2_k(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 84) {
        int L[256], qs[16], qm[16];
        float d, dmin;
        quantize_affine_block(x, 16, 3, 15, L, qs, qm, &d, &dmin);
        for (int k = 0; k < 16; k++) out[k] = (uint8_t)(qs[k] | (qm[k] << 4));
        memset(out + 16, 0, 64);
        for (int e = 0; e < 256; e++) out[16 + 32 * (e / 128) + e % 32] |= (uint8_t)(L[e] << (2 * ((e % 128) / 32)));
        em_store_u16(out + 80, em_f32_to_fp16(d));
        em_store_u16(out + 82, em_f32_to_fp16(dmin));
    }
}

/* The 12-byte packing of eight 6-bit scale/min pairs (the inverse of em_quant_k_scale_min). */
static void pack_k_scales(const int *qs, const int *qm, uint8_t *s) {
    for (int k = 0; k < 4; k++) {
        s[k] = (uint8_t)((qs[k] & 63) | ((qs[k + 4] >> 4) << 6));
        s[k + 4] = (uint8_t)((qm[k] & 63) | ((qm[k + 4] >> 4) << 6));
        s[k + 8] = (uint8_t)((qs[k + 4] & 15) | ((qm[k + 4] & 15) << 4));
    }
}

void em_quantize_q4_k(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 144) {
        int L[256], qs[8], qm[8];
        float d, dmin;
        quantize_affine_block(x, 32, 15, 63, L, qs, qm, &d, &dmin);
        em_store_u16(out, em_f32_to_fp16(d));
        em_store_u16(out + 2, em_f32_to_fp16(dmin));
        pack_k_scales(qs, qm, out + 4);
        for (int c = 0; c < 4; c++)
            for (int j = 0; j < 32; j++) out[16 + 32 * c + j] = (uint8_t)(L[64 * c + j] | (L[64 * c + 32 + j] << 4));
    }
}

void em_quantize_q5_k(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 176) {
        int L[256], qs[8], qm[8];
        float d, dmin;
        quantize_affine_block(x, 32, 31, 63, L, qs, qm, &d, &dmin);
        em_store_u16(out, em_f32_to_fp16(d));
        em_store_u16(out + 2, em_f32_to_fp16(dmin));
        pack_k_scales(qs, qm, out + 4);
        memset(out + 16, 0, 32);
        for (int e = 0; e < 256; e++) out[16 + e % 32] |= (uint8_t)((L[e] >> 4) << (e / 32));
        for (int c = 0; c < 4; c++)
            for (int j = 0; j < 32; j++)
                out[48 + 32 * c + j] = (uint8_t)((L[64 * c + j] & 15) | ((L[64 * c + 32 + j] & 15) << 4));
    }
}

/* ---- symmetric K-formats ---- */

/* Per block: levels L in [-nmax, nmax - 1] for 16 sub-blocks of 16, with signed scale steps q in
 * [-half, half - 1] of the super scale d. */
static float quantize_symmetric_block(const float *x, int nmax, int half, int *L, int *q) {
    float scales[16];
    for (int k = 0; k < 16; k++) scales[k] = fit_symmetric(x + 16 * k, 16, nmax, L + 16 * k);
    float d = quantize_signed_scales(scales, 16, half, q);
    for (int k = 0; k < 16; k++) {
        float dl = d * (float)q[k];
        for (int j = 0; j < 16; j++)
            L[16 * k + j] = dl != 0 ? clampi(em_round_int(x[16 * k + j] / dl), -nmax, nmax - 1) : 0;
    }
    return d;
}

void em_quantize_q3_k(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 110) {
        int L[256], q[16];
        float d = quantize_symmetric_block(x, 4, 32, L, q);
        memset(out, 0, 108);
        for (int e = 0; e < 256; e++) {
            int u = L[e] + 4; /* 0..7: bit 2 is the stored high bit (set = no offset) */
            out[e % 32] |= (uint8_t)(((u >> 2) & 1) << (e / 32));
            out[32 + 32 * (e / 128) + e % 32] |= (uint8_t)((u & 3) << (2 * ((e % 128) / 32)));
        }
        for (int k = 0; k < 16; k++) {
            int u = q[k] + 32;
            out[96 + k % 8] |= (uint8_t)((u & 15) << (4 * (k / 8)));
            out[104 + k % 4] |= (uint8_t)((u >> 4) << (2 * (k / 4)));
        }
        em_store_u16(out + 108, em_f32_to_fp16(d));
    }
}

void em_quantize_q6_k(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 210) {
        int L[256], q[16];
        float d = quantize_symmetric_block(x, 32, 128, L, q);
        memset(out, 0, 192);
        for (int e = 0; e < 256; e++) {
            int u = L[e] + 32, h = e / 128, r = e % 128;
            out[64 * h + r % 64] |= (uint8_t)((u & 15) << (4 * (r / 64)));
            out[128 + 32 * h + r % 32] |= (uint8_t)((u >> 4) << (2 * (r / 32)));
        }
        for (int k = 0; k < 16; k++) out[192 + k] = (uint8_t)(int8_t)q[k];
        em_store_u16(out + 208, em_f32_to_fp16(d));
    }
}

/* Q8_K (activations): the largest magnitude maps to -127 (so 127 is reachable by the other sign
 * after clamping), d stored as f32, plus sums of each 16 quants for the min terms of dot products. */
/* One Q8_K block by the definition: levels round(iscale * x) half away from zero (roundf), the
 * element of largest magnitude mapped to -127. Handles every input (NaN levels become 0, an
 * infinite or overflowing scale saturates); the fast loop below defers to it for such blocks. */
static void q8_k_block_exact(const float *x, uint8_t *out, float iscale) {
    for (int g = 0; g < 16; g++) {
        int sum = 0;
        for (int j = 0; j < 16; j++) {
            int v = em_round_int(iscale * x[16 * g + j]);
            v = v > 127 ? 127 : v;
            out[4 + 16 * g + j] = (uint8_t)(int8_t)v;
            sum += v;
        }
        em_store_u16(out + 260 + 2 * g, (uint16_t)(int16_t)sum);
    }
}

/* Activations of every batched matrix product pass through here, so the common case (finite
 * inputs, a finite scale: every |iscale * x| <= 127 rounded) avoids the libm call per element and
 * is written so compilers vectorize it. It rounds half away from zero by hand: truncation, then one
 * step outward when the exact remainder reaches a half, which is roundf's result for any value
 * below 2^23 in magnitude. */
void em_quantize_q8_k(const float *x, uint8_t *out, uint64_t n_blocks) {
    const em_block_quantize_fn simd = em_quant_q8_k_x86();
    if (simd) simd(x, out, n_blocks);
    else em_quantize_q8_k_portable(x, out, n_blocks);
}

void em_quantize_q8_k_portable(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 292) {
        /* amax: the largest magnitude; max: the first element that has it */
        float amax = 0;
        int not_number = 0;
        for (int j = 0; j < 256; j++) {
            const float a = fabsf(x[j]);
            amax = a > amax ? a : amax;
            not_number |= x[j] != x[j];
        }
        memset(out, 0, 292);
        if (amax == 0) continue;
        float max = 0;
        for (int j = 0; j < 256; j++)
            if (fabsf(x[j]) == amax) {
                max = x[j];
                break;
            }
        float iscale = -127.0f / max;
        float d = 1.0f / iscale;
        memcpy(out, &d, 4); /* little-endian hosts only, like the rest of Ember's file handling */
        if (not_number || !isfinite(amax) || !isfinite(iscale)) {
            q8_k_block_exact(x, out, iscale);
            continue;
        }
        int8_t levels[256];
        for (int j = 0; j < 256; j++) {
            const float v = iscale * x[j];
            int level = (int)v;
            const float rest = v - (float)level;
            level += (rest >= 0.5f) - (rest <= -0.5f);
            levels[j] = (int8_t)(level > 127 ? 127 : level);
        }
        memcpy(out + 4, levels, 256);
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += levels[16 * g + j];
            em_store_u16(out + 260 + 2 * g, (uint16_t)(int16_t)sum);
        }
    }
}

/* ---- non-linear 4-bit formats ---- */

/* Index of the IQ4_NL level nearest to v (levels ascending). */
static int nearest_nl(float v) {
    if (v <= em_iq4nl_values[0]) return 0;
    if (v >= em_iq4nl_values[15]) return 15;
    int k = 0;
    while (k < 15 && (float)em_iq4nl_values[k + 1] < v) k++;
    /* now level[k] < v <= level[k + 1] */
    return v - (float)em_iq4nl_values[k] <= (float)em_iq4nl_values[k + 1] - v ? k : k + 1;
}

/* Scale for x ~ scale * level[idx] over one 32-element sub-block, by searching the scale that maps
 * the largest-magnitude element to (or near) the extreme level and refitting by least squares. */
static float fit_nonlinear(const float *x, int n, int *idx) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    if (amax < 1e-30f) {
        for (int j = 0; j < n; j++) idx[j] = nearest_nl(0);
        return 0;
    }
    float best_score = -1, best_scale = 0;
    int trial[32];
    for (int step = -10; step <= 10; step++) {
        float iscale = ((float)em_iq4nl_values[0] + (float)step) / max;
        float sum_xl = 0, sum_ll = 0;
        for (int j = 0; j < n; j++) {
            trial[j] = nearest_nl(iscale * x[j]);
            float l = (float)em_iq4nl_values[trial[j]];
            sum_xl += x[j] * l;
            sum_ll += l * l;
        }
        if (sum_ll > 0 && sum_xl * sum_xl / sum_ll > best_score) {
            best_score = sum_xl * sum_xl / sum_ll;
            best_scale = sum_xl / sum_ll;
            memcpy(idx, trial, sizeof(int) * (size_t)n);
        }
    }
    return best_scale;
}

static void put_nl_nibbles(const float *x, float dl, uint8_t *q) {
    int idx[32];
    for (int j = 0; j < 32; j++) idx[j] = dl != 0 ? nearest_nl(x[j] / dl) : nearest_nl(0);
    for (int j = 0; j < 16; j++) q[j] = (uint8_t)(idx[j] | (idx[j + 16] << 4));
}

void em_quantize_iq4_nl(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 32, out += 18) {
        int idx[32];
        float d = fp16_round(fit_nonlinear(x, 32, idx));
        em_store_u16(out, em_f32_to_fp16(d));
        put_nl_nibbles(x, d, out + 2);
    }
}

void em_quantize_iq4_xs(const float *x, uint8_t *out, uint64_t n_blocks) {
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 136) {
        int idx[32], q[8];
        float scales[8];
        for (int s = 0; s < 8; s++) scales[s] = fit_nonlinear(x + 32 * s, 32, idx);
        float d = quantize_signed_scales(scales, 8, 32, q);
        em_store_u16(out, em_f32_to_fp16(d));
        uint16_t scales_h = 0;
        memset(out + 4, 0, 4);
        for (int s = 0; s < 8; s++) {
            int u = q[s] + 32;
            out[4 + s / 2] |= (uint8_t)((u & 15) << (4 * (s % 2)));
            scales_h |= (uint16_t)((u >> 4) << (2 * s));
            put_nl_nibbles(x + 32 * s, d * (float)q[s], out + 8 + 16 * s);
        }
        em_store_u16(out + 2, scales_h);
    }
}

/* ---- IQ3_XXS: 3-bit lattice points with sign groups ---- */

/* The eight magnitudes a coordinate of an IQ3_XXS grid point takes (bytes of em_iq3xxs_grid). */
static const int iq3_levels[8] = {4, 12, 20, 28, 36, 44, 52, 62};

static int nearest_iq3_level(float v) {
    int best = 0;
    for (int k = 1; k < 8; k++)
        if (fabsf(v - (float)iq3_levels[k]) < fabsf(v - (float)iq3_levels[best])) best = k;
    return best;
}

/* Search aids, one per call. For each lattice key i = l0 + 8 l1 + 64 l2 + 512 l3 (level indices of
 * the four coordinates): the grid index when the grid has that point; otherwise (most keys: the
 * grid holds 256 of the 4096) the IQ3_CANDIDATES grid points nearest to that lattice point,
 * found once first needed, among which the exact error then picks. */
#define IQ3_CANDIDATES 8

typedef struct iq3_search {
    int16_t grid_index[4096]; /* -1: not a grid point */
    bool known[4096];         /* candidates[key] filled */
    uint8_t candidates[4096][IQ3_CANDIDATES];
} iq3_search;

static void iq3_search_init(iq3_search *search) {
    for (int i = 0; i < 4096; i++) {
        search->grid_index[i] = -1;
        search->known[i] = false;
    }
    for (int g = 0; g < 256; g++) {
        uint32_t point = em_iq3xxs_grid[g];
        int key = 0;
        for (int k = 0; k < 4; k++) key += nearest_iq3_level((float)((point >> (8 * k)) & 255)) << (3 * k);
        search->grid_index[key] = (int16_t)g;
    }
}

/* The grid points nearest to the lattice point `key` (squared distance of magnitudes), nearest
 * first. */
static void iq3_find_candidates(int key, uint8_t *out) {
    int dist[IQ3_CANDIDATES], count = 0;
    for (int g = 0; g < 256; g++) {
        uint32_t point = em_iq3xxs_grid[g];
        int err = 0;
        for (int k = 0; k < 4; k++) {
            int diff = (int)((point >> (8 * k)) & 255) - iq3_levels[(key >> (3 * k)) & 7];
            err += diff * diff;
        }
        if (count == IQ3_CANDIDATES && err >= dist[count - 1]) continue;
        int pos = count < IQ3_CANDIDATES ? count++ : count - 1;
        while (pos > 0 && dist[pos - 1] > err) {
            dist[pos] = dist[pos - 1];
            out[pos] = out[pos - 1];
            pos--;
        }
        dist[pos] = err;
        out[pos] = (uint8_t)g;
    }
}

/* Squared error of scale * point against t, each coordinate weighted by w[k] (NULL: 1). */
static float iq3_point_error(int g, const float *t, const float *w, float scale) {
    uint32_t point = em_iq3xxs_grid[g];
    float err = 0;
    for (int k = 0; k < 4; k++) {
        float diff = scale * (float)((point >> (8 * k)) & 255) - t[k];
        err += (w ? w[k] : 1.0f) * diff * diff;
    }
    return err;
}

/* Grid point for scale * point ~ t (4 targets, weights w or NULL): the per-coordinate nearest
 * levels, which is the optimum whatever the weights when the grid has that point, else the best of
 * the candidates of those levels. */
static int nearest_iq3_point(const float *t, const float *w, float scale, iq3_search *search) {
    int key = 0;
    for (int k = 0; k < 4; k++) key += nearest_iq3_level(t[k] / scale) << (3 * k);
    if (search->grid_index[key] >= 0) return search->grid_index[key];
    if (!search->known[key]) {
        iq3_find_candidates(key, search->candidates[key]);
        search->known[key] = true;
    }
    const uint8_t *c = search->candidates[key];
    int best = c[0];
    float best_err = iq3_point_error(best, t, w, scale);
    for (int i = 1; i < IQ3_CANDIDATES; i++) {
        float err = iq3_point_error(c[i], t, w, scale);
        if (err < best_err) {
            best_err = err;
            best = c[i];
        }
    }
    return best;
}

/* Points for 32 targets (weights w or NULL) at a scale; returns the weighted squared error at the
 * least-squares rescaling, and that scale. */
static float iq3_fit(const float *t, const float *w, float scale, iq3_search *search, uint8_t *points, float *refit) {
    float sum_tg = 0, sum_gg = 0, sum_tt = 0;
    for (int q = 0; q < 8; q++) {
        points[q] = (uint8_t)nearest_iq3_point(t + 4 * q, w ? w + 4 * q : NULL, scale, search);
        uint32_t point = em_iq3xxs_grid[points[q]];
        for (int k = 0; k < 4; k++) {
            float g = (float)((point >> (8 * k)) & 255), wk = w ? w[4 * q + k] : 1.0f;
            sum_tg += wk * t[4 * q + k] * g;
            sum_gg += wk * g * g;
            sum_tt += wk * t[4 * q + k] * t[4 * q + k];
        }
    }
    *refit = sum_tg / sum_gg;
    return sum_tt - sum_tg * sum_tg / sum_gg;
}

/* A simple quantizer (a scale search per 32 elements with exact nearest grid points), good enough
 * for synthetic weights and tests; it does not try to match any other tool's output. Signs: each
 * group of 8 stores 7 signs and has even parity, so when an odd number of elements is negative the
 * smallest one is given the wrong sign and its target magnitude becomes -|x| (the fit then pushes
 * it toward the smallest level). */
em_err em_quantize_iq3_xxs(const float *x, uint8_t *out, uint64_t n_blocks, const float *importance) {
    iq3_search *search = malloc(sizeof *search); /* 44 KB: too much for small thread stacks */
    if (!search) return em_errorf(EM_ERR_NOMEM, "quantize IQ3_XXS: no memory for the %zu-byte search tables", sizeof *search);
    iq3_search_init(search);
    for (uint64_t i = 0; i < n_blocks; i++, x += 256, out += 98) {
        float targets[256], scales[8], weights[256], *w = NULL;
        if (importance) { /* llama.cpp's element weights: importance * sqrt(sigma2 + x^2) */
            float sum_x2 = 0;
            for (int j = 0; j < 256; j++) sum_x2 += x[j] * x[j];
            for (int j = 0; j < 256; j++) weights[j] = importance[256 * i + j] * sqrtf(2 * sum_x2 / 256 + x[j] * x[j]);
            w = weights;
        }
        uint32_t sign_bits[8] = {0};
        for (int ib = 0; ib < 8; ib++) {
            for (int l = 0; l < 4; l++) {
                const float *xs = x + 32 * ib + 8 * l;
                float *t = targets + 32 * ib + 8 * l;
                int negatives = 0, smallest = 0;
                uint32_t bits = 0;
                for (int j = 0; j < 8; j++) {
                    t[j] = fabsf(xs[j]);
                    if (xs[j] < 0) {
                        negatives++;
                        bits |= 1u << j;
                    }
                    if (t[j] < t[smallest]) smallest = j;
                }
                if (negatives % 2) {
                    bits ^= 1u << smallest;
                    t[smallest] = -t[smallest];
                }
                sign_bits[ib] |= (bits & 127) << (7 * l);
            }
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, targets[32 * ib + j]);
            scales[ib] = 0;
            if (amax <= 0) continue;
            float best_err = FLT_MAX;
            uint8_t points[8];
            for (int m = 62; m >= 22; m -= 4) {
                float refit, err = iq3_fit(targets + 32 * ib, w ? w + 32 * ib : NULL, amax / (float)m, search, points,
                                           &refit);
                if (err < best_err && refit > 0) {
                    best_err = err;
                    scales[ib] = refit;
                }
            }
        }
        /* Scale steps: db = d * (2s + 1) / 4, s in 0..15. */
        float max_scale = 0;
        for (int ib = 0; ib < 8; ib++) max_scale = fmaxf(max_scale, scales[ib]);
        float d = fp16_round(max_scale * 4.0f / 31.0f);
        memset(out, 0, 98);
        em_store_u16(out, em_f32_to_fp16(d));
        if (d == 0) continue;
        for (int ib = 0; ib < 8; ib++) {
            int s = clampi(em_round_int((4.0f * scales[ib] / d - 1.0f) / 2.0f), 0, 15);
            float db = d * (0.5f + (float)s) * 0.5f;
            for (int q = 0; q < 8; q++)
                out[2 + 8 * ib + q] =
                    (uint8_t)nearest_iq3_point(targets + 32 * ib + 4 * q, w ? w + 32 * ib + 4 * q : NULL, db, search);
            uint32_t aux = sign_bits[ib] | ((uint32_t)s << 28);
            for (int k = 0; k < 4; k++) out[66 + 4 * ib + k] = (uint8_t)(aux >> (8 * k));
        }
    }
    free(search);
    return NULL;
}
