/*
 * Several weight rows against one activation row, with AVX-512: the products of a decode step,
 * where one token's activations meet every row of a matrix. The multi-row kernels of
 * dot_rows_vnni.c take one weight row and several activation rows; these take up to four weight
 * rows and load each activation block once for all of them, and the rows' integer sums run as
 * independent chains (one row's vpdpbusd / vpdpwssd chain alone keeps the core waiting on their
 * latency).
 *
 * Q4_K, Q6_K and Q8_0 need AVX512_VNNI, BF16 only AVX512F; all are handed out where the VNNI kernels
 * are (em_quant_x86_has_vnni, so EMBER_CPU_ISA=avx2 turns them off too). Each kernel builds, lane
 * for lane, the integer sums or f32 accumulators of the AVX2 one-row kernel in dot_avx2.c and
 * then does that kernel's f32 steps in its order, so results equal em_dot's bitwise
 * (tests/test_quant.c asserts it).
 */
#include "dot_x86.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)

#include "vnni.h"

/* Weight rows one kernel call takes at most: four rows' integer sums and accumulators beside the
 * unpacked blocks fit the 32 ZMM registers. */
#define WEIGHT_ROWS_MAX 4

#define UNROLL_WEIGHT_ROWS EM_UNROLL(4)
#define UNROLL_TOKENS EM_UNROLL(4)

/* The weight rows of a call are read as nr interleaved streams, which the hardware prefetchers
 * follow poorly from memory; so each call asks for rows of a later call (the tile `tiles_ahead`
 * tiles after its own, as many bytes), a few cache lines per step of its loop, in address order:
 * one steady stream. The distance is the kernel's: the faster a kernel eats its tile, the further
 * ahead it must ask (decode with two builds alternated, bench/cpu_ab.sh). */
typedef struct ahead {
    const uint8_t *next; /* the first byte of the tile asked for */
    uint64_t lines;      /* cache lines asked for per step */
} ahead;

static EM_INLINE ahead ahead_of(const uint8_t *w, uint64_t tile_bytes, uint64_t steps, uint64_t tiles_ahead) {
    return (ahead){w + tiles_ahead * tile_bytes, steps ? (tile_bytes + 64 * steps - 1) / (64 * steps) : 0};
}

EM_VNNI static EM_INLINE void ahead_step(ahead h, uint64_t step) {
    for (uint64_t k = 0; k < h.lines; k++)
        _mm_prefetch((const char *)(h.next + 64 * (step * h.lines + k)), _MM_HINT_T0);
}

/* The lane sums of four int32 vectors, as the four lanes of one (exact in any order). */
EM_VNNI static EM_INLINE __m128i hsum4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* Lane j holds first + j / 4: a permutation index that spreads four consecutive lanes (group
 * scales) over four lanes each. */
EM_VNNI static EM_INLINE __m512i group_index(int first) {
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_add_epi32(_mm512_set1_epi32(first), quarter);
}

/* Q4_K's scales and mins (k_scales_mins in avx2.h) of four weight rows at once, row r's sixteen bytes
 * in 128-bit lane r: those steps never cross a lane. */
EM_VNNI static EM_INLINE __m512i k_scales_mins_x4(const uint8_t *const row[WEIGHT_ROWS_MAX]) {
    __m512i u = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(row[0] + 4)));
    u = _mm512_inserti32x4(u, _mm_loadu_si128((const __m128i *)(const void *)(row[1] + 4)), 1);
    u = _mm512_inserti32x4(u, _mm_loadu_si128((const __m128i *)(const void *)(row[2] + 4)), 2);
    u = _mm512_inserti32x4(u, _mm_loadu_si128((const __m128i *)(const void *)(row[3] + 4)), 3);
    const __m512i low_of = _mm512_shuffle_epi32(u, 0x98), high_of = _mm512_shuffle_epi32(u, 0x50);
    const __m512i low = _mm512_and_si512(_mm512_srlv_epi32(low_of, _mm512_set4_epi32(4, 0, 0, 0)),
                                         _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
    const __m512i high = _mm512_and_si512(_mm512_srli_epi32(high_of, 2),
                                          _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0));
    return _mm512_or_si512(low, high);
}

/* A vpshufb pattern that makes int16 words of two scale bytes of a 128-bit lane: words 0..15 (the
 * lower half) take byte `first`, words 16..31 byte `second`. */
EM_VNNI static EM_INLINE __m512i scale_words(int first, int second) {
    return _mm512_mask_blend_epi32(0xff00, _mm512_set1_epi32((int)(0x80008000u | (unsigned)first << 16 | first)),
                                   _mm512_set1_epi32((int)(0x80008000u | (unsigned)second << 16 | second)));
}

/* The tokens' Q8_K activations prepared once per call for the Q4_K kernel, block by block: a head
 * of the tokens' d8 (64 bytes), then per token its 256 levels arranged as the kernel's levels come
 * (sub-blocks (0, 2), (1, 3), (4, 6), (5, 7) in the halves of four vectors) and its eight sub-block
 * sums (each the sum of two Q8_K group sums) as int16 in every 128-bit lane: the kernel then takes
 * them straight from memory for every four rows instead of arranging them again in registers. */
enum { Q4_K_PREPARED_HEAD = 64, Q4_K_PREPARED_TOKEN = 320 };
#define Q4_K_PREPARED_BLOCK(nt) (Q4_K_PREPARED_HEAD + (uint64_t)(nt) * Q4_K_PREPARED_TOKEN)

EM_VNNI static void q4_k_prepare(const uint8_t *a, uint64_t as, int nt, uint64_t n, uint8_t *prep) {
    for (uint64_t b = 0; b < n / 256; b++) {
        uint8_t *block = prep + b * Q4_K_PREPARED_BLOCK(nt);
        memset(block, 0, 16); /* the d8 of absent tokens: zeros, in lanes whose results go unused */
        for (int t = 0; t < nt; t++) {
            const uint8_t *at = a + t * as + 292 * b;
            uint8_t *pt = block + Q4_K_PREPARED_HEAD + t * Q4_K_PREPARED_TOKEN;
            memcpy(block + 4 * t, at, 4);
            const __m512i a01 = _mm512_loadu_si512((const void *)(at + 4));
            const __m512i a23 = _mm512_loadu_si512((const void *)(at + 68));
            const __m512i a45 = _mm512_loadu_si512((const void *)(at + 132));
            const __m512i a67 = _mm512_loadu_si512((const void *)(at + 196));
            _mm512_store_si512((void *)pt, _mm512_shuffle_i64x2(a01, a23, 0x44));
            _mm512_store_si512((void *)(pt + 64), _mm512_shuffle_i64x2(a01, a23, 0xee));
            _mm512_store_si512((void *)(pt + 128), _mm512_shuffle_i64x2(a45, a67, 0x44));
            _mm512_store_si512((void *)(pt + 192), _mm512_shuffle_i64x2(a45, a67, 0xee));
            const __m256i pair_sums = _mm256_madd_epi16(load32(at + 260), _mm256_set1_epi16(1));
            _mm512_store_si512((void *)(pt + 256), _mm512_broadcast_i32x4(_mm256_cvtepi32_epi16(pair_sums)));
        }
    }
}

/* Q4_K, `nr` weight rows `stride` bytes apart against `nt` tokens' activations (prepared). A
 * 64-byte load of a row holds two 32-element chunks: its low nibbles are sub-blocks 2c and 2c + 2
 * (lower and upper half), its high nibbles 2c + 1 and 2c + 3, so each load gives two registers of
 * levels, unpacked once for all the tokens. The activations come arranged to match (q4_k_prepare,
 * once per call for all rows). vpmaddubsw gives dot_avx2.c's pair sums, vpmaddwd / vpdpwssd
 * multiply them by the int16 sub-block scale (vpshufb spreads the row's scale bytes), so int32 lane
 * j of a half holds the AVX2 kernel's lane j of that sub-block, and folding the halves gives its
 * isum. Two rows' sums fold into one register, lower and upper eight lanes, and take the AVX2
 * kernel's f32 multiply-add there. The scales and mins of four rows unpack in one register; each
 * token's min terms of all rows come out of it together; all tokens' are kept in one register (row
 * r and token t in lane 4r + t), scaled by that row's dmin times the token's d8 as the AVX2 kernel
 * does, and d times d8 is taken where a pair's sums need it, not kept per token (registers: four
 * tokens' sums and accumulators fill the 32). Each token takes the same steps as alone. */
EM_VNNI static EM_INLINE void q4_k_weights(const uint8_t *w, uint64_t stride, int nr, const uint8_t *prep, uint64_t as,
                                           int nt, uint64_t n, float *out, uint64_t os) {
    (void)as;
    __m512 acc[EM_DOT_WEIGHTS_TOKENS][WEIGHT_ROWS_MAX / 2]; /* rows 2p and 2p + 1: lower and upper lanes */
    UNROLL_TOKENS for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    __m512 mins_total = _mm512_setzero_ps(); /* row r and token t in lane 4r + t */
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m512i pattern0 = scale_words(0, 2), pattern1 = scale_words(1, 3), pattern2 = scale_words(4, 6);
    const __m512i pattern3 = scale_words(5, 7);
    const __m512i lane_words = _mm512_set4_epi32(3, 2, 1, 0); /* a 128-bit lane's four int32, for broadcasts */
    const ahead h = ahead_of(w, nr * stride, n / 256, 2);
    const uint8_t *row[WEIGHT_ROWS_MAX]; /* rows past nr read row 0's blocks, and their lanes go unused */
    UNROLL_WEIGHT_ROWS for (int r = 0; r < WEIGHT_ROWS_MAX; r++) row[r] = w + (r < nr ? r : 0) * stride;
    for (uint64_t b = 0; b < n / 256; b++) {
        ahead_step(h, b);
        /* each row's d and dmin, row r in lanes 2r and 2r + 1, converted together: one register, no
         * value through a general register */
        __m128i d_dmin = _mm_cvtsi32_si128((int)em_load_u32(row[0]));
        d_dmin = _mm_insert_epi32(d_dmin, (int)em_load_u32(row[1]), 1);
        d_dmin = _mm_insert_epi32(d_dmin, (int)em_load_u32(row[2]), 2);
        d_dmin = _mm_insert_epi32(d_dmin, (int)em_load_u32(row[3]), 3);
        const __m512 d_dmin_f32 = _mm512_castps256_ps512(_mm256_cvtph_ps(d_dmin));
        const __m512i scales_mins = k_scales_mins_x4(row);
        const __m512i mins16 = _mm512_unpackhi_epi8(scales_mins, _mm512_setzero_si512()); /* row r's in lane r */
        const uint8_t *block = prep + b * Q4_K_PREPARED_BLOCK(nt);
        /* each token's min terms of all rows, row r in the four int32 of 128-bit lane r, kept in lane
         * 4r + t; their scale dmin times d8 (the AVX2 kernel's product) in the same lane */
        __m512i mins_all = _mm512_setzero_si512();
        UNROLL_TOKENS for (int t = 0; t < nt; t++) {
            const uint8_t *at = block + Q4_K_PREPARED_HEAD + t * Q4_K_PREPARED_TOKEN;
            __m512i mins = _mm512_madd_epi16(mins16, _mm512_load_si512((const void *)(at + 256)));
            mins = _mm512_add_epi32(mins, _mm512_shuffle_epi32(mins, 0x4e));
            mins = _mm512_add_epi32(mins, _mm512_shuffle_epi32(mins, 0xb1));
            mins_all = _mm512_mask_blend_epi32((__mmask16)(0x1111 << t), mins_all, mins);
        }
        const __m512 dmin_rows = /* row r's dmin (lane 2r + 1) in lanes 4r..4r + 3 */
            _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7), d_dmin_f32);
        const __m512 d8s = _mm512_broadcast_f32x4(_mm_loadu_ps((const float *)(const void *)block));
        const __m512 dmin_d8 = _mm512_mul_ps(dmin_rows, d8s);
        mins_total = _mm512_add_ps(mins_total, _mm512_mul_ps(dmin_d8, _mm512_cvtepi32_ps(mins_all)));
        /* rows in pairs, so that only one pair's sums for every token are live at a time */
        UNROLL_WEIGHT_ROWS for (int p = 0; p < (nr + 1) / 2; p++) {
            __m512i isum[2][EM_DOT_WEIGHTS_TOKENS];
            EM_UNROLL(2) for (int k = 0; k < 2; k++) {
                const int r = 2 * p + k;
                UNROLL_TOKENS for (int t = 0; t < nt; t++) isum[k][t] = _mm512_setzero_si512();
                if (r >= nr) continue;
                const __m512i sm =
                    _mm512_permutexvar_epi32(_mm512_add_epi32(_mm512_set1_epi32(4 * r), lane_words), scales_mins);
                const __m512i q01 = _mm512_loadu_si512((const void *)(row[r] + 16));
                const __m512i q45 = _mm512_loadu_si512((const void *)(row[r] + 80));
                const __m512i l0 = _mm512_and_si512(q01, low4), l1 = _mm512_and_si512(_mm512_srli_epi16(q01, 4), low4);
                const __m512i l2 = _mm512_and_si512(q45, low4), l3 = _mm512_and_si512(_mm512_srli_epi16(q45, 4), low4);
                const __m512i s0 = _mm512_shuffle_epi8(sm, pattern0), s1 = _mm512_shuffle_epi8(sm, pattern1);
                const __m512i s2 = _mm512_shuffle_epi8(sm, pattern2), s3 = _mm512_shuffle_epi8(sm, pattern3);
                UNROLL_TOKENS for (int t = 0; t < nt; t++) {
                    /* the token's activations as the levels come: sub-blocks (0, 2), (1, 3), (4, 6), (5, 7) */
                    const __m512i *act = (const __m512i *)(const void *)(block + Q4_K_PREPARED_HEAD +
                                                                       t * Q4_K_PREPARED_TOKEN);
                    /* two chains (low and high nibbles): integer sums, so the split changes nothing */
                    const __m512i low =
                        _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(l0, _mm512_load_si512(act)), s0),
                                            _mm512_maddubs_epi16(l2, _mm512_load_si512(act + 2)), s2);
                    const __m512i high =
                        _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(l1, _mm512_load_si512(act + 1)), s1),
                                            _mm512_maddubs_epi16(l3, _mm512_load_si512(act + 3)), s3);
                    isum[k][t] = _mm512_add_epi32(low, high);
                }
            }
            const __m512i d_index = /* row 2p's d (lane 4p) in the lower half, row 2p + 1's (4p + 2) in the upper */
                _mm512_mask_blend_epi32(0xff00, _mm512_set1_epi32(4 * p), _mm512_set1_epi32(4 * p + 2));
            const __m512 d_pair = _mm512_permutexvar_ps(d_index, d_dmin_f32);
            UNROLL_TOKENS for (int t = 0; t < nt; t++) {
                const __m512i halves = _mm512_add_epi32(_mm512_shuffle_i64x2(isum[0][t], isum[1][t], 0x44),
                                                        _mm512_shuffle_i64x2(isum[0][t], isum[1][t], 0xee));
                /* d times the token's d8: the AVX2 kernel's product */
                const __m512 d = _mm512_mul_ps(d_pair, _mm512_set1_ps(em_load_f32(block + 4 * t)));
                acc[t][p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(halves), acc[t][p]);
            }
        }
        UNROLL_WEIGHT_ROWS for (int r = 0; r < WEIGHT_ROWS_MAX; r++) row[r] += 144;
    }
    float mins_out[WEIGHT_ROWS_MAX * 4];
    _mm512_storeu_ps(mins_out, mins_total);
    UNROLL_TOKENS for (int t = 0; t < nt; t++) {
        UNROLL_WEIGHT_ROWS for (int r = 0; r < nr; r++) {
            const __m256 sums = r % 2 ? upper_ps(acc[t][r / 2]) : _mm512_castps512_ps256(acc[t][r / 2]);
            out[t * os + r] = hsum(sums) - mins_out[4 * r + t];
        }
    }
}

/* Q6_K, `nr` weight rows `stride` bytes apart. Per half h of a block (128 elements) one register
 * holds two 32-element runs: the low nibbles of the 64 ql bytes are runs 0 and 1 (lower and upper
 * half), their high nibbles runs 2 and 3, and the two high bits of each element come from the 32
 * qh bytes broadcast to both halves, each half shifted by its own count so that its run's bits
 * land on bits 4..5 of the byte. vpdpbusd gives per lane four products of the unsigned 6-bit levels
 * and the activations (at most 4 * 63 * 127: an int16), vpdpwssd multiplies them by their
 * 16-element group's signed scale, the int16 pair (scale, 0): lanes 0..3 of a run are its first
 * group, 4..7 its second, as in dot_avx2.c's kernel, so folding the halves gives its isum. The -32
 * offset of every level comes off lane 0 as there, 32 times the sum of scale times group sum. */
EM_VNNI static EM_INLINE void q6_k_weights(const uint8_t *w, uint64_t stride, int nr, const uint8_t *a, uint64_t n,
                                           float *out) {
    __m256 acc[WEIGHT_ROWS_MAX];
    UNROLL_WEIGHT_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(15), bits45 = _mm512_set1_epi8(0x30), low16 = _mm512_set1_epi32(0xffff);
    /* runs 0 and 1 take qh's bits 0..1 and 2..3 to bits 4..5; runs 2 and 3 take bits 4..5 and 6..7 */
    const __m512i up01 = _mm512_mask_set1_epi16(_mm512_set1_epi16(4), 0xffff0000u, 2);
    const __m512i down23 = _mm512_mask_set1_epi16(_mm512_setzero_si512(), 0xffff0000u, 2);
    const ahead h = ahead_of(w, nr * stride, n / 256, 1);
    for (uint64_t b = 0; b < n / 256; b++, w += 210, a += 292) {
        ahead_step(h, b);
        const float d8 = em_load_f32(a);
        const __m256i group_sums = load32(a + 260);
        __m512i act[4]; /* runs 0, 1 of half 0; runs 2, 3; then half 1's */
        for (int c = 0; c < 4; c++) act[c] = _mm512_loadu_si512((const void *)(a + 4 + 64 * c));
        __m256i offset[WEIGHT_ROWS_MAX];
        __m512i isum[WEIGHT_ROWS_MAX], isum_odd[WEIGHT_ROWS_MAX];
        UNROLL_WEIGHT_ROWS for (int r = 0; r < WEIGHT_ROWS_MAX; r++) {
            offset[r] = _mm256_setzero_si256();
            if (r >= nr) continue;
            const uint8_t *wr = w + r * stride;
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)(wr + 192));
            offset[r] = _mm256_madd_epi16(group_sums, _mm256_cvtepi8_epi16(sc8));
            const __m512i scales32 = _mm512_and_si512(_mm512_cvtepi8_epi32(sc8), low16); /* (scale, 0) */
            /* two chains per row (the block's halves): integer sums, so the split changes nothing */
            isum[r] = _mm512_setzero_si512();
            isum_odd[r] = _mm512_setzero_si512();
            for (int half = 0; half < 2; half++) {
                const __m512i ql = _mm512_loadu_si512((const void *)(wr + 64 * half));
                const __m512i qh = _mm512_broadcast_i64x4(load32(wr + 128 + 32 * half));
                const __m512i q01 = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, low4), _mm512_sllv_epi16(qh, up01),
                                                              bits45, 0xf8); /* a | (b & c) */
                const __m512i q23 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                                              _mm512_srlv_epi16(qh, down23), bits45, 0xf8);
                /* lane j of runs 2k, 2k + 1 takes group 8 half + 4k + j / 4 */
                const __m512i sc01 = _mm512_permutexvar_epi32(group_index(8 * half), scales32);
                const __m512i sc23 = _mm512_permutexvar_epi32(group_index(8 * half + 4), scales32);
                __m512i *sum = half ? &isum_odd[r] : &isum[r];
                *sum = _mm512_dpwssd_epi32(*sum, _mm512_dpbusd_epi32(_mm512_setzero_si512(), q01, act[2 * half]), sc01);
                *sum = _mm512_dpwssd_epi32(*sum, _mm512_dpbusd_epi32(_mm512_setzero_si512(), q23, act[2 * half + 1]),
                                           sc23);
            }
        }
        int32_t offsets[WEIGHT_ROWS_MAX];
        _mm_storeu_si128((__m128i *)(void *)offsets, hsum4(offset[0], offset[1], offset[2], offset[3]));
        UNROLL_WEIGHT_ROWS for (int r = 0; r < nr; r++) {
            __m256i folded = fold_halves(_mm512_add_epi32(isum[r], isum_odd[r]));
            folded = _mm256_sub_epi32(folded, _mm256_setr_epi32(32 * offsets[r], 0, 0, 0, 0, 0, 0, 0));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w + r * stride + 208) * d8), _mm256_cvtepi32_ps(folded),
                                     acc[r]);
        }
    }
    UNROLL_WEIGHT_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]);
}

/* Q8_0, weight rows in pairs: one register per pair holds row 2p's 32 weights' magnitudes in its
 * lower half and row 2p + 1's in its upper, against the block's 32 activations (loaded once,
 * broadcast to both halves) carrying each row's weight signs (the AVX2 kernel's sign trick;
 * activations never hold -128). vpdpbusd gives lane for lane dot_i8_i8's sums, and each pair's f32
 * accumulator takes the AVX2 kernel's per-lane multiply-add by fp16(w) * fp16(a). An odd last row
 * is paired with itself and its copy dropped. */
EM_VNNI static EM_INLINE void q8_0_weights(const uint8_t *w, uint64_t stride, int nr, const uint8_t *a, uint64_t n,
                                           float *out) {
    enum { PAIRS = WEIGHT_ROWS_MAX / 2 };
    const int np = (nr + 1) / 2;
    const uint8_t *row[WEIGHT_ROWS_MAX];
    UNROLL_WEIGHT_ROWS for (int r = 0; r < WEIGHT_ROWS_MAX; r++) row[r] = w + (r < nr ? r : nr - 1) * stride;
    __m512 acc[PAIRS];
    UNROLL_WEIGHT_ROWS for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_ps();
    const ahead h = ahead_of(w, nr * stride, n / 32, 1);
    for (uint64_t b = 0; b < n / 32; b++, a += 34) {
        ahead_step(h, b);
        const uint64_t at = 34 * b;
        const __m512i act = _mm512_broadcast_i64x4(load32(a + 2));
        /* the rows' scale products fp16(w) * fp16(a), lane r for row r, as the AVX2 kernel's f32 products */
        __m128i dw = _mm_cvtsi32_si128(em_load_u16(row[0] + at));
        dw = _mm_insert_epi16(dw, em_load_u16(row[1] + at), 1);
        dw = _mm_insert_epi16(dw, em_load_u16(row[2] + at), 2);
        dw = _mm_insert_epi16(dw, em_load_u16(row[3] + at), 3);
        const __m512 scales = _mm512_castps128_ps512(_mm_mul_ps(_mm_cvtph_ps(dw), _mm_set1_ps(fp16(a))));
        UNROLL_WEIGHT_ROWS for (int p = 0; p < np; p++) {
            const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(load32(row[2 * p] + at + 2)),
                                                 load32(row[2 * p + 1] + at + 2), 1);
            const __mmask64 neg = _mm512_movepi8_mask(q);
            const __m512i signed_act = _mm512_mask_sub_epi8(act, neg, _mm512_setzero_si512(), act);
            const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(q), signed_act);
            const __m512 scale = _mm512_permutexvar_ps(pair_index(2 * p), scales);
            acc[p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[p]);
        }
    }
    for (int p = 0; p < np; p++) {
        out[2 * p] = hsum(_mm512_castps512_ps256(acc[p]));
        if (2 * p + 1 < nr) out[2 * p + 1] = hsum(upper_ps(acc[p]));
    }
}

/* Sixteen bf16 weights as f32 (bf16 is the top half of an f32). */
EM_VNNI static EM_INLINE __m512 load_bf16x16(const uint8_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load32(p)), 16));
}

/* BF16 with f32 activations. dot_avx2.c's kernel keeps four 8-lane accumulators, element j of
 * each 32 going to accumulator (j / 8) % 4; here one 16-lane register holds its accumulators 0 and
 * 1 side by side and another 2 and 3, each lane taking the same fused multiply-adds in the same
 * order. The sums then fold as there, (acc0 + acc1) + (acc2 + acc3), before the scalar tail. */
EM_VNNI static EM_INLINE void bf16_weights(const uint8_t *w, uint64_t stride, int nr, const float *a, uint64_t n,
                                           float *out) {
    __m512 lo[WEIGHT_ROWS_MAX], hi[WEIGHT_ROWS_MAX];
    UNROLL_WEIGHT_ROWS for (int r = 0; r < nr; r++) lo[r] = hi[r] = _mm512_setzero_ps();
    const ahead h = ahead_of(w, nr * stride, n / 32, 1);
    uint64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        ahead_step(h, j / 32);
        const __m512 a_lo = _mm512_loadu_ps(a + j), a_hi = _mm512_loadu_ps(a + j + 16);
        UNROLL_WEIGHT_ROWS for (int r = 0; r < nr; r++) {
            lo[r] = _mm512_fmadd_ps(load_bf16x16(w + r * stride + 2 * j), a_lo, lo[r]);
            hi[r] = _mm512_fmadd_ps(load_bf16x16(w + r * stride + 2 * j + 32), a_hi, hi[r]);
        }
    }
    /* the AVX2 kernel's 8-element steps all go to its first accumulator: the lower half of lo */
    for (; j + 8 <= n; j += 8) {
        const __m512 a8 = _mm512_castps256_ps512(_mm256_loadu_ps(a + j));
        UNROLL_WEIGHT_ROWS for (int r = 0; r < nr; r++) {
            const __m128i w8 = _mm_loadu_si128((const __m128i *)(w + r * stride + 2 * j));
            const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(w8), 16);
            const __m512 wf = _mm512_castsi512_ps(_mm512_castsi256_si512(bits));
            lo[r] = _mm512_mask3_fmadd_ps(wf, a8, lo[r], 0x00ff);
        }
    }
    UNROLL_WEIGHT_ROWS for (int r = 0; r < nr; r++) {
        const __m256 first = _mm256_add_ps(_mm512_castps512_ps256(lo[r]), upper_ps(lo[r]));
        const __m256 second = _mm256_add_ps(_mm512_castps512_ps256(hi[r]), upper_ps(hi[r]));
        float sum = hsum(_mm256_add_ps(first, second));
        for (uint64_t k = j; k < n; k++) sum += em_load_bf16(w + r * stride + 2 * k) * a[k];
        out[r] = sum;
    }
}

/* One entry point per type and token: four rows at a time, then the remainder with a constant row
 * count (the types other than Q4_K take one token; em_quant_dot_weights_vnni hands them out so). */
#define WEIGHTS_ROWS(kernel, w, stride, n_rows, a, as, nt, n, out, os)                                         \
    do {                                                                                                       \
        uint32_t done = 0;                                                                                     \
        for (; done + WEIGHT_ROWS_MAX <= n_rows; done += WEIGHT_ROWS_MAX)                                      \
            kernel(w + done * stride, stride, WEIGHT_ROWS_MAX, a, as, nt, n, out + done, os);                  \
        switch (n_rows - done) {                                                                               \
        case 1: kernel(w + done * stride, stride, 1, a, as, nt, n, out + done, os); break;                     \
        case 2: kernel(w + done * stride, stride, 2, a, as, nt, n, out + done, os); break;                     \
        case 3: kernel(w + done * stride, stride, 3, a, as, nt, n, out + done, os); break;                     \
        default: break;                                                                                        \
        }                                                                                                      \
    } while (0)

/* The one-token kernels, their calls as the Q4_K kernel's */
#define ONE_TOKEN(kernel) kernel##_one
#define ONE_TOKEN_KERNEL(kernel, act_type)                                                                    \
    EM_VNNI static EM_INLINE void kernel##_one(const uint8_t *w, uint64_t stride, int nr, const act_type *a,    \
                                               uint64_t as, int nt, uint64_t n, float *out, uint64_t os) {     \
        (void)as, (void)nt, (void)os;                                                                          \
        kernel(w, stride, nr, a, n, out);                                                                      \
    }

ONE_TOKEN_KERNEL(q8_0_weights, uint8_t)
ONE_TOKEN_KERNEL(q6_k_weights, uint8_t)

#define ONE_TOKEN_ENTRY(name, kernel, act_type)                                                               \
    EM_VNNI static void name(const void *wv, uint64_t stride, uint32_t n_rows, const void *av, uint64_t as,    \
                             uint32_t n_tokens, uint64_t n, float *out, uint64_t os) {                         \
        (void)n_tokens;                                                                                        \
        const uint8_t *w = wv;                                                                                 \
        WEIGHTS_ROWS(ONE_TOKEN(kernel), w, stride, n_rows, (const act_type *)av, as, 1, n, out, os);           \
    }

ONE_TOKEN_ENTRY(dot_weights_q8_0, q8_0_weights, uint8_t)
ONE_TOKEN_ENTRY(dot_weights_q6_k, q6_k_weights, uint8_t)

/* Bytes of prepared activations an entry keeps on its stack; wider rows take them from the heap. */
#define Q4_K_PREPARED_STACK (64u << 10)

/* Q4_K, one entry per token count: each a kernel with the count constant */
#define Q4_K_ENTRY(name, tokens)                                                                              \
    EM_VNNI static void name(const void *wv, uint64_t stride, uint32_t n_rows, const void *av, uint64_t as,    \
                             uint32_t n_tokens, uint64_t n, float *out, uint64_t os) {                         \
        (void)n_tokens;                                                                                        \
        const uint8_t *w = wv;                                                                                 \
        _Alignas(64) uint8_t stack[Q4_K_PREPARED_STACK];                                                       \
        const uint64_t bytes = n / 256 * Q4_K_PREPARED_BLOCK(tokens);                                         \
        uint8_t *prep = bytes <= sizeof stack ? stack : aligned_alloc(64, (bytes + 63) / 64 * 64);            \
        if (!prep) { /* no memory: the rows one by one, as without this kernel */                              \
            for (uint32_t t = 0; t < tokens; t++)                                                              \
                for (uint32_t r = 0; r < n_rows; r++)                                                          \
                    out[t * os + r] = em_dot(EM_TYPE_Q4_K, w + r * stride, (const uint8_t *)av + t * as, n);   \
            return;                                                                                            \
        }                                                                                                      \
        q4_k_prepare((const uint8_t *)av, as, tokens, n, prep);                                                \
        WEIGHTS_ROWS(q4_k_weights, w, stride, n_rows, prep, 0, tokens, n, out, os);                            \
        if (prep != stack) free(prep);                                                                         \
    }

Q4_K_ENTRY(dot_weights_q4_k_1, 1)
Q4_K_ENTRY(dot_weights_q4_k_2, 2)
Q4_K_ENTRY(dot_weights_q4_k_3, 3)
Q4_K_ENTRY(dot_weights_q4_k_4, 4)

/* BF16, one row a call: four rows a call read four streams 4 KB apart (a 2048-wide row), and one
 * token's BF16 products wait on memory, not on arithmetic; row by row they read one steady stream,
 * which measured faster in decode (bench/cpu_ab.sh). The quantized types keep four rows: their
 * kernels have more arithmetic per byte, which four rows' independent chains and shared activation
 * loads cut (and their prefetch keeps one steady stream ahead of the rows). */
EM_VNNI static void dot_weights_bf16(const void *wv, uint64_t stride, uint32_t n_rows, const void *av, uint64_t as,
                                     uint32_t n_tokens, uint64_t n, float *out, uint64_t os) {
    (void)as, (void)n_tokens, (void)os;
    for (uint32_t r = 0; r < n_rows; r++) bf16_weights((const uint8_t *)wv + r * stride, stride, 1, av, n, out + r);
}

em_dot_weights_fn em_quant_dot_weights_vnni(uint32_t weight_type, uint32_t n_tokens) {
    if (!em_quant_x86_has_vnni() || n_tokens < 1 || n_tokens > EM_DOT_WEIGHTS_TOKENS) return NULL;
    if (weight_type == EM_TYPE_Q4_K) {
        static const em_dot_weights_fn q4_k[EM_DOT_WEIGHTS_TOKENS] = {dot_weights_q4_k_1, dot_weights_q4_k_2,
                                                                      dot_weights_q4_k_3, dot_weights_q4_k_4};
        return q4_k[n_tokens - 1];
    }
    if (n_tokens > 1) return NULL;
    switch (weight_type) {
    case EM_TYPE_MXFP4: return em_quant_dot_weights_mxfp4_avx512(n_tokens);
    case EM_TYPE_Q8_0: return dot_weights_q8_0;
    case EM_TYPE_Q6_K: return dot_weights_q6_k;
    case EM_TYPE_BF16: return dot_weights_bf16;
    default: return NULL;
    }
}

#else

em_dot_weights_fn em_quant_dot_weights_vnni(uint32_t weight_type, uint32_t n_tokens) {
    (void)weight_type, (void)n_tokens;
    return NULL;
}

#endif
