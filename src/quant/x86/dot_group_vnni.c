/*
 * Token groups for AVX-512 VNNI (Q4_K, Q8_0, Q6_K, IQ3_XXS): the activations of up to eight tokens
 * interleaved block by block, once per matrix product, so that each weight row is decoded once per
 * group and the per-token work that does not depend on the weights is done once for all its rows.
 *
 * dot_rows_vnni.c takes the activation rows as they are and, for every weight row, gathers the
 * eight tokens' block scales and Q8_K group sums lane by lane and reduces each token's min terms
 * horizontally: work repeated for every weight row of the matrix. A group does that once. Its
 * layout per block (tokens past n_rows are zeros):
 *   Q4_K (2208 bytes): the 8 tokens' f32 scales d8; then for each pair of sub-blocks i (0..3) and
 *     token t, the two sub-blocks' activation sums (each the sum of its two Q8_K group sums) as
 *     int16, so one vpdpwssd against the pair's two mins gives 8 tokens' min terms at once; then
 *     for each 32-element sub-block s and token t, that token's 32 levels (tokens 2p and 2p + 1
 *     side by side in one 64-byte vector).
 *   Q8_0 (272 bytes): the 8 tokens' f16 scales, then each token's 32 levels plus 128, as unsigned
 *     bytes.
 *   Q6_K (2336 bytes): the 8 tokens' f32 scales d8; then the Q8_K sums of the 16-element groups as
 *     int16 pairs (groups 2i and 2i + 1), pair i of token t in 32-bit word 16 (i / 2) + 8 (i % 2) + t,
 *     so one vpdpwssd per two pairs against the weights' group scales gives eight tokens' offsets;
 *     then each 32-element run's levels as Q4_K's (tokens 2p and 2p + 1 in one 64-byte vector).
 *   IQ3_XXS (2080 bytes): the 8 tokens' f32 scales, then each run's levels plus 128 (unsigned), laid
 *     out as Q4_K's.
 * The kernels then take the same integer sums and the same f32 steps, in the same order, as
 * dot_rows_vnni.c's (and so as em_dot's): results are bitwise equal, which tests/test_quant.c
 * asserts. They run TILE_ROWS weight rows at a time against a group, so each activation vector
 * loaded serves them all and a group is read once per tile of rows; a call takes every group of a
 * product against a tile of rows, a chunk of blocks at a time that keeps the group's part in L1
 * (IQ3_XXS decodes each weight block once for several groups).
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
    Q6_K_GROUP_SUMS = GROUP_TOKENS * 4,                        /* offset of the group sums */
    Q6_K_GROUP_LEVELS = Q6_K_GROUP_SUMS + 8 * GROUP_TOKENS * 4, /* offset of the levels */
    Q6_K_GROUP_BLOCK = Q6_K_GROUP_LEVELS + GROUP_TOKENS * 256,
    IQ3_XXS_GROUP_LEVELS = GROUP_TOKENS * 4,
    IQ3_XXS_GROUP_BLOCK = IQ3_XXS_GROUP_LEVELS + GROUP_TOKENS * 256,
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
            /* sub-block s of token t: the (t / 2)-th 64 bytes of sub-block s's levels, first or second half */
            for (int sub = 0; sub < 8; sub++)
                memcpy(g + Q4_K_GROUP_LEVELS + 32 * (GROUP_TOKENS * sub + t), row + 4 + 32 * sub, 32);
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

static void pack_q6_k(const uint8_t *a, uint64_t stride, uint32_t n_rows, uint64_t n, uint8_t *g) {
    memset(g, 0, n / 256 * Q6_K_GROUP_BLOCK);
    for (uint64_t b = 0; b < n / 256; b++, g += Q6_K_GROUP_BLOCK)
        for (uint32_t t = 0; t < n_rows; t++) {
            const uint8_t *row = a + t * stride + b * 292;
            memcpy(g + 4 * t, row, 4);
            for (int i = 0; i < 8; i++) /* the sums of groups 2i and 2i + 1 */
                memcpy(g + Q6_K_GROUP_SUMS + 4 * (2 * GROUP_TOKENS * (i / 2) + GROUP_TOKENS * (i % 2) + t),
                       row + 260 + 4 * i, 4);
            for (int run = 0; run < 8; run++)
                memcpy(g + Q6_K_GROUP_LEVELS + 32 * (GROUP_TOKENS * run + t), row + 4 + 32 * run, 32);
        }
}

static void pack_iq3_xxs(const uint8_t *a, uint64_t stride, uint32_t n_rows, uint64_t n, uint8_t *g) {
    memset(g, 0, n / 256 * IQ3_XXS_GROUP_BLOCK);
    for (uint64_t b = 0; b < n / 256; b++, g += IQ3_XXS_GROUP_BLOCK)
        for (uint32_t t = 0; t < n_rows; t++) {
            const uint8_t *row = a + t * stride + b * 292;
            memcpy(g + 4 * t, row, 4);
            uint8_t *levels = g + IQ3_XXS_GROUP_LEVELS;
            for (int run = 0; run < 8; run++)
                for (int j = 0; j < 32; j++) /* a + 128 */
                    levels[32 * (GROUP_TOKENS * run + t) + j] = (uint8_t)(row[4 + 32 * run + j] ^ 0x80);
        }
}

#if defined(__x86_64__) || defined(__i386__)

#include "vnni.h"

/* Weight rows per step of the kernels: each loaded activation vector meets this many rows. Their
 * sums and f32 accumulators (eight per row) must stay in the 32 vector registers. */
#define TILE_ROWS 2

/* Bytes of a group that stay in the L1 data cache beside the rows' weights (it holds 32 KB or more
 * on CPUs with AVX-512). */
#define GROUP_IN_L1 (24 << 10)

/* A tile's f32 sums, kept between the chunks of blocks the kernels take in turn: acc[r][p] holds row
 * r's sums of tokens 2p (lanes 0..7) and 2p + 1 (lanes 8..15); Q4_K's min terms of row 0's eight
 * tokens sit in lanes 0..7 of `mins`, row 1's in lanes 8..15. */
typedef struct tile_sums {
    __m512 acc[TILE_ROWS][GROUP_TOKENS / 2];
    __m512 mins;
} tile_sums;

/* Q4_K, `rows` (1..TILE_ROWS) weight rows against a group. Lane j of a token's integer sum for a
 * block is dot_rows_vnni.c's folded lane j: the sum over the eight sub-blocks s of scale_s times
 * the four products at positions 4j..4j+3 of sub-block s. Here one vpmaddubsw multiplies a
 * sub-block's 32 nibbles (in both halves of the register) by two tokens' levels of that sub-block,
 * adding neighbouring products to int16 (at most 2 * 15 * 128, never saturating), and one vpdpwssd
 * adds each 32-bit lane's two int16 sums times scale_s: lanes 0..7 for token 2p, 8..15 for 2p + 1,
 * so no lanes need folding and the two tokens' sums sit side by side as the f32 steps take them.
 * Integer sums are exact in any order: the results are the single-row kernel's bitwise. The min
 * terms of all eight tokens in one vector per row (lane t: token t), the f32 steps of the
 * single-row kernel per lane. Takes n_blocks blocks, its sums from `state` unless `fresh`. */
EM_VNNI static EM_INLINE void q4_k_tile(const uint8_t *w, uint64_t row_bytes, const int rows, const uint8_t *g,
                                        uint64_t n_blocks, tile_sums *state, bool fresh) {
    enum { PAIRS = GROUP_TOKENS / 2 };
    __m512 acc[TILE_ROWS][PAIRS]; /* tokens 2p and 2p + 1 side by side: lanes 0..7 and 8..15 */
    __m256 mins_total[TILE_ROWS];
    __m512 mins_both = fresh ? _mm512_setzero_ps() : state->mins; /* with two rows: their mins_total side by side */
    EM_UNROLL(2) for (int r = 0; r < rows; r++) {
        mins_total[r] = r == 0 ? _mm512_castps512_ps256(mins_both) : upper_ps(mins_both);
        EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) acc[r][p] = fresh ? _mm512_setzero_ps() : state->acc[r][p];
    }
    const __m512i low4 = _mm512_set1_epi8(15), zero = _mm512_setzero_si512();
    for (uint64_t b = 0; b < n_blocks; b++, w += 144, g += Q4_K_GROUP_BLOCK) {
        const __m256 d8 = _mm256_loadu_ps((const float *)(const void *)g);
        const uint8_t *sums = g + Q4_K_GROUP_MINS, *levels = g + Q4_K_GROUP_LEVELS;
        __m512i isum[TILE_ROWS][PAIRS];
        int32_t scales16[TILE_ROWS][16]; /* each sub-block's scale in both int16 halves, broadcast from memory */
        __m512 scale[TILE_ROWS];
        __m128i sm[TILE_ROWS]; /* the 8 scales, then the 8 mins */
        EM_UNROLL(2) for (int r = 0; r < rows; r++) sm[r] = k_scales_mins(w + r * row_bytes + 4);
        if (rows == 2) { /* both rows' min terms in one register: row 0 in lanes 0..7, row 1 in 8..15 */
            const __m512i mins16 = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(sm[0], 8)))),
                _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(sm[1], 8))), 1);
            /* two chains of two, not one of four: the sums are exact in any order */
            __m512i mins = _mm512_setzero_si512(), mins_high = _mm512_setzero_si512();
            mins = _mm512_dpwssd_epi32(mins, _mm512_shuffle_epi32(mins16, 0x00), _mm512_broadcast_i64x4(load32(sums)));
            mins_high = _mm512_dpwssd_epi32(mins_high, _mm512_shuffle_epi32(mins16, 0xaa),
                                            _mm512_broadcast_i64x4(load32(sums + 64)));
            mins = _mm512_dpwssd_epi32(mins, _mm512_shuffle_epi32(mins16, 0x55),
                                       _mm512_broadcast_i64x4(load32(sums + 32)));
            mins_high = _mm512_dpwssd_epi32(mins_high, _mm512_shuffle_epi32(mins16, 0xff),
                                            _mm512_broadcast_i64x4(load32(sums + 96)));
            mins = _mm512_add_epi32(mins, mins_high);
            const __m512 dmin =
                _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(fp16(w + 2)), _mm512_set1_ps(fp16(w + row_bytes + 2)));
            const __m512 d8_both = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(d8)));
            const __m512 min_scale = _mm512_mul_ps(dmin, d8_both);
            mins_both = _mm512_add_ps(mins_both, _mm512_mul_ps(min_scale, _mm512_cvtepi32_ps(mins)));
        }
        EM_UNROLL(2) for (int r = 0; r < rows; r++) {
            const uint8_t *wr = w + r * row_bytes;
            if (rows == 1) {
                /* the mins as int16 pairs (2i, 2i + 1), pair i broadcast against sub-block pair i's sums */
                const __m256i mins16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(sm[r], 8)));
                __m256i mins = _mm256_setzero_si256();
                mins = _mm256_dpwssd_epi32(mins, _mm256_shuffle_epi32(mins16, 0x00), load32(sums));
                mins = _mm256_dpwssd_epi32(mins, _mm256_shuffle_epi32(mins16, 0x55), load32(sums + 32));
                mins = _mm256_dpwssd_epi32(mins, _mm256_shuffle_epi32(mins16, 0xaa), load32(sums + 64));
                mins = _mm256_dpwssd_epi32(mins, _mm256_shuffle_epi32(mins16, 0xff), load32(sums + 96));
                const __m256 min_scale = _mm256_mul_ps(_mm256_set1_ps(fp16(wr + 2)), d8);
                mins_total[r] = _mm256_add_ps(mins_total[r], _mm256_mul_ps(min_scale, _mm256_cvtepi32_ps(mins)));
            }
            const __m512i scales32 = _mm512_cvtepu8_epi32(sm[r]);
            _mm512_storeu_si512((void *)scales16[r], _mm512_or_si512(scales32, _mm512_slli_epi32(scales32, 16)));
            scale[r] = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(fp16(wr)), d8));
            EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) isum[r][p] = zero;
        }
        EM_UNROLL(4) for (int c = 0; c < 4; c++) {
            __m512i nib[TILE_ROWS][2]; /* sub-block 2c (low nibbles) and 2c + 1 (high), in both halves */
            EM_UNROLL(2) for (int r = 0; r < rows; r++) {
                const __m512i q = _mm512_broadcast_i64x4(load32(w + r * row_bytes + 16 + 32 * c));
                nib[r][0] = _mm512_and_si512(q, low4);
                nib[r][1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
            }
            EM_UNROLL(2) for (int h = 0; h < 2; h++) {
                const int s = 2 * c + h;
                __m512i sc[TILE_ROWS];
                EM_UNROLL(2) for (int r = 0; r < rows; r++) sc[r] = _mm512_set1_epi32(scales16[r][s]);
                EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) {
                    const __m512i act = _mm512_loadu_si512((const void *)(levels + 64 * (PAIRS * s + p)));
                    EM_UNROLL(2) for (int r = 0; r < rows; r++)
                        isum[r][p] = _mm512_dpwssd_epi32(isum[r][p], _mm512_maddubs_epi16(nib[r][h], act), sc[r]);
                }
            }
        }
        EM_UNROLL(2) for (int r = 0; r < rows; r++)
            EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) {
                const __m512 s = _mm512_permutexvar_ps(pair_index(2 * p), scale[r]);
                acc[r][p] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(isum[r][p]), acc[r][p]);
            }
    }
    if (rows == 1) mins_both = _mm512_castps256_ps512(mins_total[0]);
    state->mins = mins_both;
    EM_UNROLL(2) for (int r = 0; r < rows; r++)
        EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) state->acc[r][p] = acc[r][p];
}

/* Q8_0, `rows` (1..TILE_ROWS) weight rows against a group: dot_rows_vnni.c's q8_0_rows with the
 * eight scales and each pair of tokens' levels in one load each. The group holds the levels plus
 * 128 (unsigned), so vpdpbusd takes them against the signed weights as they are: its sum, started
 * from -128 times the weights' own lane sums (worked out once per weight block for all tokens), is
 * lane for lane the signed sum the other kernels build, exactly, with no sign moved onto the
 * activations per token. */
EM_VNNI static EM_INLINE void q8_0_tile(const uint8_t *w, uint64_t row_bytes, const int rows, const uint8_t *g,
                                        uint64_t n_blocks, tile_sums *state, bool fresh) {
    enum { PAIRS = GROUP_TOKENS / 2 };
    __m512 acc[TILE_ROWS][PAIRS];
    EM_UNROLL(2) for (int r = 0; r < rows; r++)
        EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) acc[r][p] = fresh ? _mm512_setzero_ps() : state->acc[r][p];
    for (uint64_t b = 0; b < n_blocks; b++, w += 34, g += Q8_0_GROUP_BLOCK) {
        __m512i q[TILE_ROWS], offset[TILE_ROWS];
        __m512 weight_scale[TILE_ROWS];
        EM_UNROLL(2) for (int r = 0; r < rows; r++) {
            const uint8_t *wr = w + r * row_bytes;
            q[r] = _mm512_broadcast_i64x4(load32(wr + 2));
            const __m512i weight_sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), q[r]);
            offset[r] = _mm512_sub_epi32(_mm512_setzero_si512(), weight_sums); /* -128 * sum(w) */
            weight_scale[r] = _mm512_set1_ps(fp16(wr));
        }
        /* the eight tokens' scales; the scale of a token and row is the weight's times the token's, as
         * in the single-row kernel (a product of the same two f32 values, whichever lane it sits in) */
        const __m512 d8 = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)g)));
        EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) {
            const __m512i act = _mm512_loadu_si512((const void *)(g + Q8_0_GROUP_LEVELS + 64 * p));
            const __m512 d8_pair = _mm512_permutexvar_ps(pair_index(2 * p), d8);
            EM_UNROLL(2) for (int r = 0; r < rows; r++) {
                const __m512i isum = _mm512_dpbusd_epi32(offset[r], act, q[r]);
                const __m512 scale = _mm512_mul_ps(weight_scale[r], d8_pair);
                acc[r][p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[r][p]);
            }
        }
    }
    if (fresh) state->mins = _mm512_setzero_ps();
    EM_UNROLL(2) for (int r = 0; r < rows; r++)
        EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) state->acc[r][p] = acc[r][p];
}

/* Q6_K, `rows` (1..TILE_ROWS) weight rows against a group. Lane j of a token's integer sum for a
 * block is dot_avx2.c's lane j: over the eight 32-element runs, the run's first or second group
 * scale (lanes 0..3, 4..7) times the four products at positions 4j..4j+3 of the unsigned 6-bit
 * levels and the activations; lane 0 less 32 times the sum of the group scales times the
 * activations' group sums. Here one vpmaddubsw multiplies a run's levels (in both halves) by two
 * tokens' activations and one vpdpwssd adds each lane's two int16 sums times its group scale (the
 * int16 pair (scale, scale)): lanes 0..7 for token 2p, 8..15 for 2p + 1. The offsets of all eight
 * tokens come from four vpdpwssd against the packed group sums, once per block and row. Integer
 * sums are exact in any order, and the f32 steps are the single-row kernel's: bitwise em_dot. */
EM_VNNI static EM_INLINE void q6_k_tile(const uint8_t *w, uint64_t row_bytes, const int rows, const uint8_t *g,
                                        uint64_t n_blocks, tile_sums *state, bool fresh) {
    enum { PAIRS = GROUP_TOKENS / 2 };
    __m512 acc[TILE_ROWS][PAIRS];
    EM_UNROLL(2) for (int r = 0; r < rows; r++)
        EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) acc[r][p] = fresh ? _mm512_setzero_ps() : state->acc[r][p];
    const __m512i low4 = _mm512_set1_epi8(15), low2 = _mm512_set1_epi8(3);
    for (uint64_t b = 0; b < n_blocks; b++, w += 210, g += Q6_K_GROUP_BLOCK) {
        const __m256 d8 = _mm256_loadu_ps((const float *)(const void *)g);
        const uint8_t *sums = g + Q6_K_GROUP_SUMS, *levels = g + Q6_K_GROUP_LEVELS;
        __m512i isum[TILE_ROWS][PAIRS];
        int32_t both[TILE_ROWS][16]; /* group g's scale in both int16 halves of word g */
        __m512 scale[TILE_ROWS];
        EM_UNROLL(2) for (int r = 0; r < rows; r++) {
            const uint8_t *wr = w + r * row_bytes;
            const __m128i sc = _mm_loadu_si128((const __m128i *)(const void *)(wr + 192));
            const __m512i scales32 = _mm512_cvtepi8_epi32(sc);
            _mm512_storeu_si512((void *)both[r], _mm512_or_si512(_mm512_and_si512(scales32, _mm512_set1_epi32(0xffff)),
                                                                 _mm512_slli_epi32(scales32, 16)));
            int32_t pairs[8]; /* word i: the int16 pair (scale 2i, scale 2i + 1) */
            _mm256_storeu_si256((__m256i *)(void *)pairs, _mm256_cvtepi8_epi16(sc));
            __m512i offsets = _mm512_setzero_si512(); /* lanes 0..7: pairs 4j, 4j + 1; 8..15: 4j + 2, 4j + 3 */
            EM_UNROLL(4) for (int j = 0; j < 4; j++) {
                const __m512i weights =
                    _mm512_mask_set1_epi32(_mm512_set1_epi32(pairs[2 * j]), 0xff00, pairs[2 * j + 1]);
                offsets = _mm512_dpwssd_epi32(offsets, weights, _mm512_loadu_si512((const void *)(sums + 64 * j)));
            }
            /* -32 * offset of token t in lane t, moved to lane 0 (token 2p) and lane 8 (2p + 1) of pair p */
            const __m512i minus32 = _mm512_castsi256_si512(
                _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(fold_halves(offsets), 5)));
            EM_UNROLL(4) for (int p = 0; p < PAIRS; p++)
                isum[r][p] = _mm512_maskz_permutexvar_epi32(0x0101, pair_index(2 * p), minus32);
            scale[r] = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(fp16(wr + 208)), d8));
        }
        EM_UNROLL(2) for (int h = 0; h < 2; h++) {
            __m512i ql0[TILE_ROWS], ql1[TILE_ROWS], qh[TILE_ROWS];
            EM_UNROLL(2) for (int r = 0; r < rows; r++) {
                const uint8_t *wr = w + r * row_bytes;
                ql0[r] = _mm512_broadcast_i64x4(load32(wr + 64 * h));
                ql1[r] = _mm512_broadcast_i64x4(load32(wr + 64 * h + 32));
                qh[r] = _mm512_broadcast_i64x4(load32(wr + 128 + 32 * h));
            }
            EM_UNROLL(4) for (int k = 0; k < 4; k++) {
                const int run = 4 * h + k; /* elements 32 run .. 32 run + 31: groups 2 run and 2 run + 1 */
                __m512i q[TILE_ROWS], sc[TILE_ROWS];
                EM_UNROLL(2) for (int r = 0; r < rows; r++) {
                    const __m512i bits = k % 2 ? ql1[r] : ql0[r];
                    const __m512i low = _mm512_and_si512(k < 2 ? bits : _mm512_srli_epi16(bits, 4), low4);
                    const __m512i high = _mm512_and_si512(_mm512_srli_epi16(qh[r], 2 * k), low2);
                    q[r] = _mm512_or_si512(low, _mm512_slli_epi16(high, 4));
                    sc[r] = _mm512_mask_set1_epi32(_mm512_set1_epi32(both[r][2 * run]), 0xf0f0, both[r][2 * run + 1]);
                }
                EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) {
                    const __m512i act = _mm512_loadu_si512((const void *)(levels + 64 * (PAIRS * run + p)));
                    EM_UNROLL(2) for (int r = 0; r < rows; r++)
                        isum[r][p] = _mm512_dpwssd_epi32(isum[r][p], _mm512_maddubs_epi16(q[r], act), sc[r]);
                }
            }
        }
        EM_UNROLL(2) for (int r = 0; r < rows; r++)
            EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) {
                const __m512 s = _mm512_permutexvar_ps(pair_index(2 * p), scale[r]);
                acc[r][p] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(isum[r][p]), acc[r][p]);
            }
    }
    if (fresh) state->mins = _mm512_setzero_ps();
    EM_UNROLL(2) for (int r = 0; r < rows; r++)
        EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) state->acc[r][p] = acc[r][p];
}

/* A weight block of IQ3_XXS decoded for the group kernel: each run's 32 signed levels (grid point
 * times sign), each run's integer scale 2s + 1 as the int16 pair (scale, scale), the correction
 * that turns the sums over the group's levels plus 128 into the signed sums (lane j: -128 times the
 * sum over the runs of scale times the run's levels at positions 4j..4j+3), and the block's scale. */
typedef struct iq3_xxs_decoded {
    int8_t levels[256];
    int32_t scale[8];
    int32_t correction[8];
    float d;
} iq3_xxs_decoded;

EM_VNNI static EM_INLINE void iq3_xxs_decode(const uint8_t *w, iq3_xxs_decoded *out) {
    __m512i correction = _mm512_setzero_si512(); /* lanes 0..7 from the even runs, 8..15 the odd ones */
    for (int run = 0; run < 8; run += 2) {
        const uint32_t aux0 = em_load_u32(w + 66 + 4 * run), aux1 = em_load_u32(w + 70 + 4 * run);
        const __m512i mag = iq3xxs_grid_points(w + 2 + 8 * run);
        const __m512i levels = _mm512_mask_sub_epi8(mag, iq3xxs_sign_mask(aux0, aux1), _mm512_setzero_si512(), mag);
        _mm512_storeu_si512((void *)(out->levels + 32 * run), levels);
        const int16_t scale0 = (int16_t)(2 * (aux0 >> 28) + 1), scale1 = (int16_t)(2 * (aux1 >> 28) + 1);
        out->scale[run] = (int32_t)((uint32_t)(uint16_t)scale0 * 0x10001u);
        out->scale[run + 1] = (int32_t)((uint32_t)(uint16_t)scale1 * 0x10001u);
        /* 128 times each lane's four levels (at most 128 * 4 * 62: an int16), times the run's scale */
        const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), levels);
        const __m512i scales = _mm512_mask_set1_epi32(_mm512_set1_epi32(scale0), 0xff00, scale1); /* (scale, 0) */
        correction = _mm512_dpwssd_epi32(correction, sums, scales);
    }
    const __m256i negated = _mm256_sub_epi32(_mm256_setzero_si256(), fold_halves(correction));
    _mm256_storeu_si256((__m256i *)(void *)out->correction, negated);
    out->d = fp16(w);
}

/* IQ3_XXS: the blocks decoded at once, and the token groups one call takes (their f32 sums wait in
 * memory between chunks of blocks). */
#define IQ3_XXS_CHUNK_BLOCKS 8
#define IQ3_XXS_CALL_GROUPS 8

/* IQ3_XXS, `rows` (1..TILE_ROWS) weight rows against up to IQ3_XXS_CALL_GROUPS groups (`groups`,
 * one after another, group_bytes apart). Lane j of a token's integer sum for a block is
 * dot_avx2.c's lane j: over the eight runs, the run's scale 2s + 1 times the four signed products at
 * positions 4j..4j+3. The grid lookup and the signs (iq3_xxs_decode) cost more than the products of
 * eight tokens, so a chunk of each row's blocks is decoded once for all the groups: the tokens an
 * expert was chosen for are several groups. Then per run and pair of tokens one vpmaddubsw of the
 * two tokens' levels plus 128 against the signed levels (a pair of products at most 2 * 255 * 62:
 * no saturation) and one vpdpwssd by the pair (scale, scale); the block's correction, added first,
 * takes the 128s out again. The f32 steps are the single-row kernel's, block by block in order, so
 * the results are em_dot's bitwise. */
EM_VNNI static EM_INLINE void iq3_xxs_tile(const uint8_t *w, uint64_t row_bytes, const int rows,
                                           const uint8_t *groups, uint64_t group_bytes,
                                           uint32_t n_tokens, uint64_t n, float *out, uint64_t out_stride) {
    enum { PAIRS = GROUP_TOKENS / 2 };
    const uint32_t n_groups = (n_tokens + GROUP_TOKENS - 1) / GROUP_TOKENS;
    __m512 sums[IQ3_XXS_CALL_GROUPS][TILE_ROWS][PAIRS]; /* lanes 0..7: token 2p, 8..15: token 2p + 1 */
    for (uint32_t gi = 0; gi < n_groups; gi++)
        EM_UNROLL(2) for (int r = 0; r < rows; r++)
            EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) sums[gi][r][p] = _mm512_setzero_ps();
    iq3_xxs_decoded decoded[IQ3_XXS_CHUNK_BLOCKS][TILE_ROWS];
    /* groups larger than L1 together come from L2 block by block: fetched two blocks ahead */
    const bool prefetch = n_groups * group_bytes > GROUP_IN_L1;
    for (uint64_t first = 0; first < n / 256; first += IQ3_XXS_CHUNK_BLOCKS) {
        const uint64_t blocks = n / 256 - first < IQ3_XXS_CHUNK_BLOCKS ? n / 256 - first : IQ3_XXS_CHUNK_BLOCKS;
        for (uint64_t b = 0; b < blocks; b++)
            EM_UNROLL(2) for (int r = 0; r < rows; r++)
                iq3_xxs_decode(w + r * row_bytes + (first + b) * 98, &decoded[b][r]);
        for (uint32_t gi = 0; gi < n_groups; gi++) {
            const uint8_t *g = groups + gi * group_bytes + first * IQ3_XXS_GROUP_BLOCK;
            __m512 acc[TILE_ROWS][PAIRS];
            EM_UNROLL(2) for (int r = 0; r < rows; r++)
                EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) acc[r][p] = sums[gi][r][p];
            for (uint64_t b = 0; b < blocks; b++, g += IQ3_XXS_GROUP_BLOCK) {
                const __m256 d8 = _mm256_loadu_ps((const float *)(const void *)g);
                const uint8_t *levels = g + IQ3_XXS_GROUP_LEVELS;
                if (prefetch)
                    for (int line = 0; line < IQ3_XXS_GROUP_BLOCK; line += 64)
                        _mm_prefetch((const char *)g + 2 * IQ3_XXS_GROUP_BLOCK + line, _MM_HINT_T0);
                __m512i isum[TILE_ROWS][PAIRS];
                EM_UNROLL(2) for (int r = 0; r < rows; r++) {
                    const __m512i correction = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(const void *)decoded[b][r].correction));
                    EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) isum[r][p] = correction;
                }
                for (int run = 0; run < 8; run++) {
                    __m512i q[TILE_ROWS], sc[TILE_ROWS];
                    EM_UNROLL(2) for (int r = 0; r < rows; r++) {
                        const iq3_xxs_decoded *dr = &decoded[b][r];
                        q[r] = _mm512_broadcast_i64x4(
                            _mm256_loadu_si256((const __m256i *)(const void *)(dr->levels + 32 * run)));
                        sc[r] = _mm512_set1_epi32(dr->scale[run]);
                    }
                    EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) {
                        const __m512i act = _mm512_loadu_si512((const void *)(levels + 64 * (PAIRS * run + p)));
                        EM_UNROLL(2) for (int r = 0; r < rows; r++)
                            isum[r][p] = _mm512_dpwssd_epi32(isum[r][p], _mm512_maddubs_epi16(act, q[r]), sc[r]);
                    }
                }
                EM_UNROLL(2) for (int r = 0; r < rows; r++) {
                    /* (d * d8) * 0.25, as the single-row kernel rounds it */
                    const __m256 d = _mm256_mul_ps(_mm256_set1_ps(decoded[b][r].d), d8);
                    const __m512 scale = _mm512_castps256_ps512(_mm256_mul_ps(d, _mm256_set1_ps(0.25f)));
                    EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) {
                        const __m512 s = _mm512_permutexvar_ps(pair_index(2 * p), scale);
                        acc[r][p] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(isum[r][p]), acc[r][p]);
                    }
                }
            }
            EM_UNROLL(2) for (int r = 0; r < rows; r++)
                EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) sums[gi][r][p] = acc[r][p];
        }
    }
    for (uint32_t gi = 0; gi < n_groups; gi++)
        EM_UNROLL(2) for (int r = 0; r < rows; r++)
            EM_UNROLL(4) for (int p = 0; p < PAIRS; p++) {
                const uint32_t t = GROUP_TOKENS * gi + 2 * p;
                if (t < n_tokens) out[t * out_stride + r] = hsum(_mm512_castps512_ps256(sums[gi][r][p]));
                if (t + 1 < n_tokens) out[(t + 1) * out_stride + r] = hsum(upper_ps(sums[gi][r][p]));
            }
}

/* Weight rows whose results the entry points collect before writing them out. A token's results
 * for a pair of rows are two floats, and rows of the output are often a multiple of 4 KB apart (a
 * projection to 2048 or 4096 values): written in place, every token's pair would fall in the same
 * set of the L1 cache and miss there. Collected for up to OUT_ROWS rows, each token's results are
 * written as one run of whole cache lines. */
#define OUT_ROWS 64

/* Copies `tokens` rows of `rows` results from `local` (OUT_ROWS apart) to out (out_stride apart). */
EM_VNNI static EM_INLINE void write_results(const float *local, uint32_t tokens, uint32_t rows, float *out,
                                            uint64_t out_stride) {
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t r = 0; r < rows; r += 16) {
            const __mmask16 keep = rows - r >= 16 ? 0xffff : (__mmask16)((1u << (rows - r)) - 1);
            const __m512 results = _mm512_maskz_loadu_ps(keep, local + t * OUT_ROWS + r);
            _mm512_mask_storeu_ps(out + t * out_stride + r, keep, results);
        }
}

/* A tile's results: the token pairs' lanes summed, less the min terms (zero but for Q4_K). */
EM_VNNI static EM_INLINE void tile_results(const tile_sums *sums, int rows, uint32_t n_tokens, float *out,
                                           uint64_t out_stride) {
    float mins[2 * GROUP_TOKENS];
    _mm512_storeu_ps(mins, sums->mins);
    for (int r = 0; r < rows; r++)
        for (uint32_t p = 0; 2 * p < n_tokens; p++) {
            const float *row_mins = mins + GROUP_TOKENS * r;
            out[2 * p * out_stride + r] = hsum(_mm512_castps512_ps256(sums->acc[r][p])) - row_mins[2 * p];
            if (2 * p + 1 < n_tokens)
                out[(2 * p + 1) * out_stride + r] = hsum(upper_ps(sums->acc[r][p])) - row_mins[2 * p + 1];
        }
}

/* The entry points of Q4_K, Q8_0 and Q6_K: token groups one after another (em_dot_group_fn), each
 * against OUT_ROWS weight rows at a time, TILE_ROWS rows per kernel call. A product's blocks are
 * taken in chunks whose part of the group stays in L1 while every tile of the OUT_ROWS rows sweeps
 * it (a down projection's whole group does not fit there); each tile's f32 sums wait in a tile_sums
 * between chunks, so the steps and their order are those of one sweep. */
#define GROUP_ENTRY(name, tile, block_elements, weight_block_bytes, group_block_bytes)                           \
    EM_VNNI static void name(const void *weight_rows, uint64_t row_bytes, uint32_t n_weight_rows, const void *group, \
                             uint32_t n_tokens, uint64_t n, float *out, uint64_t out_stride) {                    \
        enum { TILES = (OUT_ROWS + TILE_ROWS - 1) / TILE_ROWS, CHUNK = GROUP_IN_L1 / (group_block_bytes) };     \
        float local[GROUP_TOKENS * OUT_ROWS];                                                                     \
        tile_sums sums[TILES];                                                                                    \
        const uint64_t n_blocks = n / (block_elements);                                                         \
        for (uint32_t first = 0; first < n_weight_rows; first += OUT_ROWS) {                                     \
            const uint8_t *w = (const uint8_t *)weight_rows + first * row_bytes;                                 \
            const uint32_t rows = n_weight_rows - first < OUT_ROWS ? n_weight_rows - first : OUT_ROWS;           \
            for (uint32_t t = 0; t < n_tokens; t += GROUP_TOKENS) {                                              \
                const uint8_t *g = (const uint8_t *)group + t / GROUP_TOKENS * n_blocks * (group_block_bytes);   \
                const uint32_t tokens = n_tokens - t < GROUP_TOKENS ? n_tokens - t : GROUP_TOKENS;               \
                for (uint64_t b = 0; b < n_blocks; b += CHUNK) {                                                 \
                    const uint64_t blocks = n_blocks - b < CHUNK ? n_blocks - b : CHUNK;                         \
                    const uint8_t *wb = w + b * (weight_block_bytes), *gb = g + b * (group_block_bytes);         \
                    uint32_t r = 0;                                                                              \
                    for (; r + TILE_ROWS <= rows; r += TILE_ROWS)                                                \
                        tile(wb + r * row_bytes, row_bytes, TILE_ROWS, gb, blocks, &sums[r / TILE_ROWS], b == 0); \
                    for (; r < rows; r++)                                                                        \
                        tile(wb + r * row_bytes, row_bytes, 1, gb, blocks, &sums[r / TILE_ROWS], b == 0);        \
                }                                                                                                \
                for (uint32_t r = 0; r < rows; r += TILE_ROWS)                                                   \
                    tile_results(&sums[r / TILE_ROWS], rows - r < TILE_ROWS ? (int)(rows - r) : TILE_ROWS, tokens, \
                                 local + r, OUT_ROWS);                                                           \
                write_results(local, tokens, rows, out + t * out_stride + first, out_stride);                    \
            }                                                                                                    \
        }                                                                                                        \
    }

GROUP_ENTRY(group_q4_k, q4_k_tile, 256, 144, Q4_K_GROUP_BLOCK)
GROUP_ENTRY(group_q8_0, q8_0_tile, 32, 34, Q8_0_GROUP_BLOCK)
GROUP_ENTRY(group_q6_k, q6_k_tile, 256, 210, Q6_K_GROUP_BLOCK)

/* IQ3_XXS takes up to IQ3_XXS_CALL_GROUPS groups per pass over the rows (iq3_xxs_tile). */
EM_VNNI static void group_iq3_xxs(const void *weight_rows, uint64_t row_bytes, uint32_t n_weight_rows,
                                  const void *group, uint32_t n_tokens, uint64_t n, float *out, uint64_t out_stride) {
    enum { CALL_TOKENS = IQ3_XXS_CALL_GROUPS * GROUP_TOKENS };
    const uint64_t group_bytes = n / 256 * IQ3_XXS_GROUP_BLOCK;
    float local[CALL_TOKENS * OUT_ROWS];
    for (uint32_t first = 0; first < n_weight_rows; first += OUT_ROWS) {
        const uint8_t *w = (const uint8_t *)weight_rows + first * row_bytes;
        const uint32_t rows = n_weight_rows - first < OUT_ROWS ? n_weight_rows - first : OUT_ROWS;
        for (uint32_t t = 0; t < n_tokens; t += CALL_TOKENS) {
            const uint8_t *g = (const uint8_t *)group + t / GROUP_TOKENS * group_bytes;
            const uint32_t tokens = n_tokens - t < CALL_TOKENS ? n_tokens - t : CALL_TOKENS;
            uint32_t r = 0;
            for (; r + TILE_ROWS <= rows; r += TILE_ROWS)
                iq3_xxs_tile(w + r * row_bytes, row_bytes, TILE_ROWS, g, group_bytes, tokens, n, local + r,
                             OUT_ROWS);
            for (; r < rows; r++)
                iq3_xxs_tile(w + r * row_bytes, row_bytes, 1, g, group_bytes, tokens, n, local + r, OUT_ROWS);
            write_results(local, tokens, rows, out + t * out_stride + first, out_stride);
        }
    }
}

em_dot_group_fn em_quant_dot_group_vnni(uint32_t weight_type) {
    if (!em_quant_x86_has_vnni()) return NULL;
    switch (weight_type) {
    case EM_TYPE_Q4_K: return group_q4_k;
    case EM_TYPE_Q8_0: return group_q8_0;
    case EM_TYPE_Q6_K: return group_q6_k;
    case EM_TYPE_IQ3_XXS: return group_iq3_xxs;
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
    case EM_TYPE_Q6_K: return n / 256 * Q6_K_GROUP_BLOCK;
    case EM_TYPE_IQ3_XXS: return n / 256 * IQ3_XXS_GROUP_BLOCK;
    default: return 0;
    }
}

void em_quant_group_pack(uint32_t weight_type, const void *activation_rows, uint64_t stride, uint32_t n_rows,
                         uint64_t n, void *group) {
    if (weight_type == EM_TYPE_Q4_K) pack_q4_k(activation_rows, stride, n_rows, n, group);
    if (weight_type == EM_TYPE_Q8_0) pack_q8_0(activation_rows, stride, n_rows, n, group);
    if (weight_type == EM_TYPE_Q6_K) pack_q6_k(activation_rows, stride, n_rows, n, group);
    if (weight_type == EM_TYPE_IQ3_XXS) pack_iq3_xxs(activation_rows, stride, n_rows, n, group);
}
