/*
 * Token groups for AVX-512 VNNI (Q4_K, Q8_0): the activations of up to eight tokens interleaved
 * block by block, once per matrix product, so that each weight row is decoded once per group and
 * the per-token work that does not depend on the weights is done once for all its rows.
 *
 * dot_rows_vnni.c takes the activation rows as they are and, for every weight row, gathers the
 * eight tokens' block scales and Q8_K group sums lane by lane and reduces each token's min terms
 * horizontally: work repeated for every weight row of the matrix. A group does that once. Its
 * layout per block (tokens past n_rows are zeros):
 *   Q4_K (2208 bytes): the 8 tokens' f32 scales d8; then for each pair of sub-blocks i (0..3) and
 *     token t, the two sub-blocks' activation sums (each the sum of its two Q8_K group sums) as
 *     int16, so one vpdpwssd against the pair's two mins gives 8 tokens' min terms at once; then
 *     for each 64-element chunk c and token t, that token's 64 levels.
 *   Q8_0 (272 bytes): the 8 tokens' f16 scales, then each token's 32 levels plus 128, as unsigned
 *     bytes.
 * The kernels then take the same integer sums and the same f32 steps, in the same order, as
 * dot_rows_vnni.c's (and so as em_dot's): results are bitwise equal, which tests/test_quant.c
 * asserts.
 */
#include "dot_x86.h"

#include <string.h>

#define GROUP_TOKENS 8

enum {
    Q4_K_GROUP_MINS = GROUP_TOKENS * 4,                         /* offset of the sub-block sums */
    Q4_K_GROUP_LEVELS = Q4_K_GROUP_MINS + 4 * GROUP_TOKENS * 4, /* offset of the levels */
    Q4_K_GROUP_BLOCK = Q4_K_GROUP_LEVELS + GROUP_TOKENS * 256,
    Q8_0_GROUP_LEVELS = GROUP_TOKENS * 2,
    Q8_0_GROUP_BLOCK = Q8_0_GROUP_LEVELS + GROUP_TOKENS * 32,
};

/* Packing is plain C: it runs once per group and matrix product, not once per weight row. */
static void pack_q4_k(const uint8_t *a, uint64_t stride, uint32_t n_rows, uint64_t n, uint8_t *g) {
    memset(g, 0, n / 256 * Q4_K_GROUP_BLOCK);
    for (uint64_t b = 0; b < n / 256; b++, g += Q4_K_GROUP_BLOCK)
        for (uint32_t t = 0; t < n_rows; t++) {
            const uint8_t *row = a + t * stride + b * 292;
            memcpy(g + 4 * t, row, 4);
            for (int sub = 0; sub < 8; sub++) {
                int16_t s = (int16_t)((int16_t)em_load_u16(row + 260 + 4 * sub) +
                                      (int16_t)em_load_u16(row + 262 + 4 * sub));
                em_store_u16(g + Q4_K_GROUP_MINS + 4 * (GROUP_TOKENS * (sub / 2) + t) + 2 * (sub % 2), (uint16_t)s);
            }
            for (int c = 0; c < 4; c++)
                memcpy(g + Q4_K_GROUP_LEVELS + 64 * (GROUP_TOKENS * c + t), row + 4 + 64 * c, 64);
        }
}

static void pack_q8_0(const uint8_t *a, uint64_t stride, uint32_t n_rows, uint64_t n, uint8_t *g) {
    memset(g, 0, n / 32 * Q8_0_GROUP_BLOCK);
    for (uint64_t b = 0; b < n / 32; b++, g += Q8_0_GROUP_BLOCK)
        for (uint32_t t = 0; t < n_rows; t++) {
            const uint8_t *row = a + t * stride + b * 34;
            memcpy(g + 2 * t, row, 2);
            for (int j = 0; j < 32; j++) g[Q8_0_GROUP_LEVELS + 32 * t + j] = (uint8_t)(row[2 + j] ^ 0x80); /* a + 128 */
        }
}

#if defined(__x86_64__) || defined(__i386__)

#include "vnni.h"

#define UNROLL_TOKENS EM_UNROLL(8)

/* Q4_K against a group: per token, the sub-block products as dot_rows_vnni.c's q4_k_rows builds
 * them; the min terms of all eight tokens in one vector (lane t: token t), the f32 steps of the
 * single-row kernel per lane (dmin * d8, times the integer, added to the running sum), two tokens'
 * eight lanes to a register. */
EM_VNNI static void group_q4_k(const void *wv, const void *gv, uint32_t n_rows, uint64_t n, float *out) {
    enum { PAIRS = GROUP_TOKENS / 2 };
    const uint8_t *w = wv, *g = gv;
    __m512 acc[PAIRS]; /* tokens 2p and 2p + 1 side by side: lanes 0..7 and 8..15 */
    __m256 mins_total = _mm256_setzero_ps();
    UNROLL_TOKENS for (int p = 0; p < PAIRS; p++) acc[p] = _mm512_setzero_ps();
    /* lanes 0..7 of token 2p's sum then of 2p + 1's, and lanes 8..15 the same way: added, the two
     * tokens' folded sums (fold_halves) side by side */
    const __m512i low_halves = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i high_halves = _mm512_add_epi32(low_halves, _mm512_set1_epi32(8));
    const __m512i low4 = _mm512_set1_epi8(15);
    for (uint64_t b = 0; b < n / 256; b++, w += 144, g += Q4_K_GROUP_BLOCK) {
        const __m128i sm = k_scales_mins(w + 4);
        const __m256 d8 = _mm256_loadu_ps((const float *)(const void *)g);
        /* the mins as int16 pairs (2i, 2i + 1), pair i broadcast against sub-block pair i's sums */
        const __m256i mins16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)));
        const uint8_t *sums = g + Q4_K_GROUP_MINS;
        __m256i mins = _mm256_dpwssd_epi32(_mm256_setzero_si256(), _mm256_shuffle_epi32(mins16, 0x00), load32(sums));
        mins = _mm256_dpwssd_epi32(mins, _mm256_shuffle_epi32(mins16, 0x55), load32(sums + 32));
        mins = _mm256_dpwssd_epi32(mins, _mm256_shuffle_epi32(mins16, 0xaa), load32(sums + 64));
        mins = _mm256_dpwssd_epi32(mins, _mm256_shuffle_epi32(mins16, 0xff), load32(sums + 96));
        const __m256 min_scale = _mm256_mul_ps(_mm256_set1_ps(fp16(w + 2)), d8);
        mins_total = _mm256_add_ps(mins_total, _mm256_mul_ps(min_scale, _mm256_cvtepi32_ps(mins)));

        const __m512i scales32 = _mm512_cvtepu8_epi32(sm);
        __m512i isum[GROUP_TOKENS];
        UNROLL_TOKENS for (int t = 0; t < GROUP_TOKENS; t++) isum[t] = _mm512_setzero_si512();
        const uint8_t *levels = g + Q4_K_GROUP_LEVELS;
        for (int c = 0; c < 4; c++) {
            const __m512i q = _mm512_broadcast_i64x4(load32(w + 16 + 32 * c));
            const __m512i nib = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xffff0000u, q, 4), low4);
            const __m512i sc = _mm512_permutexvar_epi32(pair_index(2 * c), scales32);
            UNROLL_TOKENS for (int t = 0; t < GROUP_TOKENS; t++) {
                const __m512i act = _mm512_loadu_si512((const void *)(levels + 64 * (GROUP_TOKENS * c + t)));
                isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_dpbusd_epi32(_mm512_setzero_si512(), nib, act), sc);
            }
        }
        const __m512 scale = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(fp16(w)), d8));
        UNROLL_TOKENS for (int p = 0; p < PAIRS; p++) {
            const __m512i low = _mm512_permutex2var_epi32(isum[2 * p], low_halves, isum[2 * p + 1]);
            const __m512i high = _mm512_permutex2var_epi32(isum[2 * p], high_halves, isum[2 * p + 1]);
            const __m512i folded = _mm512_add_epi32(low, high);
            const __m512 s = _mm512_permutexvar_ps(pair_index(2 * p), scale);
            acc[p] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(folded), acc[p]);
        }
    }
    float mins_out[GROUP_TOKENS];
    _mm256_storeu_ps(mins_out, mins_total);
    UNROLL_TOKENS for (int p = 0; p < PAIRS; p++) {
        if ((uint32_t)(2 * p) < n_rows) out[2 * p] = hsum(_mm512_castps512_ps256(acc[p])) - mins_out[2 * p];
        if ((uint32_t)(2 * p + 1) < n_rows) out[2 * p + 1] = hsum(upper_ps(acc[p])) - mins_out[2 * p + 1];
    }
}

/* Q8_0 against a group: dot_rows_vnni.c's q8_0_rows with the eight scales and each pair of tokens'
 * levels in one load each. The group holds the levels plus 128 (unsigned), so vpdpbusd takes them
 * against the signed weights as they are: its sum, started from -128 times the weights' own lane
 * sums (worked out once per weight block for all tokens), is lane for lane the signed sum the other
 * kernels build, exactly, with no sign moved onto the activations per token. */
EM_VNNI static void group_q8_0(const void *wv, const void *gv, uint32_t n_rows, uint64_t n, float *out) {
    enum { PAIRS = GROUP_TOKENS / 2 };
    const uint8_t *w = wv, *g = gv;
    __m512 acc[PAIRS];
    UNROLL_TOKENS for (int p = 0; p < PAIRS; p++) acc[p] = _mm512_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += 34, g += Q8_0_GROUP_BLOCK) {
        const __m512i q = _mm512_broadcast_i64x4(load32(w + 2));
        const __m512i weight_sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), q);
        const __m512i offset = _mm512_sub_epi32(_mm512_setzero_si512(), weight_sums); /* -128 * sum(w) */
        const __m128i d8 = _mm_loadu_si128((const __m128i *)(const void *)g);
        const __m512 scales = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(fp16(w)), _mm256_cvtph_ps(d8)));
        UNROLL_TOKENS for (int p = 0; p < PAIRS; p++) {
            const __m512i act = _mm512_loadu_si512((const void *)(g + Q8_0_GROUP_LEVELS + 64 * p));
            const __m512i isum = _mm512_dpbusd_epi32(offset, act, q);
            const __m512 scale = _mm512_permutexvar_ps(pair_index(2 * p), scales);
            acc[p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[p]);
        }
    }
    for (int p = 0; p < PAIRS; p++) {
        if ((uint32_t)(2 * p) < n_rows) out[2 * p] = hsum(_mm512_castps512_ps256(acc[p]));
        if ((uint32_t)(2 * p + 1) < n_rows) out[2 * p + 1] = hsum(upper_ps(acc[p]));
    }
}

em_dot_group_fn em_quant_dot_group_vnni(uint32_t weight_type) {
    if (!em_quant_x86_has_vnni()) return NULL;
    switch (weight_type) {
    case EM_TYPE_Q4_K: return group_q4_k;
    case EM_TYPE_Q8_0: return group_q8_0;
    default: return NULL;
    }
}

#else

em_dot_group_fn em_quant_dot_group_vnni(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

#endif

uint64_t em_quant_group_bytes(uint32_t weight_type, uint64_t n) {
    switch (weight_type) {
    case EM_TYPE_Q4_K: return n / 256 * Q4_K_GROUP_BLOCK;
    case EM_TYPE_Q8_0: return n / 32 * Q8_0_GROUP_BLOCK;
    default: return 0;
    }
}

void em_quant_group_pack(uint32_t weight_type, const void *activation_rows, uint64_t stride, uint32_t n_rows,
                         uint64_t n, void *group) {
    if (weight_type == EM_TYPE_Q4_K) pack_q4_k(activation_rows, stride, n_rows, n, group);
    if (weight_type == EM_TYPE_Q8_0) pack_q8_0(activation_rows, stride, n_rows, n, group);
}
