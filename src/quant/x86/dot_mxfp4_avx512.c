/*
 * MXFP4 dot products with AVX-512 VNNI, bitwise equal to the scalar path (dot_scalar.c's dot_mxfp4,
 * llama.cpp's reference order): em_dot's kernel for MXFP4, em_dot_rows' (one weight row against up
 * to four activation rows at a time) and em_dot_weights' (up to four weight rows against one
 * token), where the VNNI kernels run (em_quant_x86_has_vnni; EMBER_CPU_ISA=avx2 keeps dot_avx2.c's
 * MXFP4 kernels, which sum in another order).
 *
 * The scalar path sums, block after block, sum += (2^(e - 128) * d_a) * isum, isum the block's exact
 * integer sum of levels times activation bytes. The integer sums may be found in any order; the
 * f32 steps may not. So the kernels work on tiles of 16 blocks: each step of four blocks puts one
 * block in each 128-bit lane (its 16 low-nibble levels against the block's first 16 activations,
 * its 16 high-nibble levels against the last 16), vpdpbusd leaves four partial sums per lane, and
 * after four steps a transpose-and-add folds the four registers into one whose 16 lanes are the
 * tile's block sums. The f32 products (scale times scale, then times the sum) run sixteen blocks
 * a vector, each lane the scalar path's two roundings; only the additions into the running sum
 * follow one another, in block order, as the scalar path's do.
 *
 * vpdpbusd multiplies unsigned bytes by signed ones: the levels (-12..12) are taken as level + 12
 * (0..24), and 12 times the sum of each block's activations, found with the same instruction
 * against the bytes 12, starts the sum instead of 0.
 */
#include "dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

#include "vnni.h"

/* Blocks of a tile: sixteen, one a lane of the f32 steps. */
#define TILE 16
/* Most rows on either side of one kernel call: four (weight rows x activation rows), each with
 * four step registers, sixteen registers of sums beside the loaded blocks. */
#define PAIRS_MAX 4

/* The lane of a tile's block j after the transpose-and-add (and back: the map is its own
 * inverse): step m = j / 4 held block j in 128-bit lane k = j % 4, and lane 4k + m of the result
 * is that lane's sum. */
static inline int lane_of_block(int j) { return 4 * (j % 4) + j / 4; }

/* The four step registers' lane sums (v[m]'s 128-bit lane k: block 4m + k), block 4m + k's sum in
 * int32 lane 4k + m. */
EM_VNNI static EM_INLINE __m512i fold_steps(const __m512i v[4]) {
    const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
    const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

/* Four 16-byte runs, at p + stride * k for k = 0..3 (block k's), as the four 128-bit lanes. */
EM_VNNI static EM_INLINE __m512i load_lanes(const uint8_t *p, uint64_t stride) {
    const __m512i lo = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
    const __m512i two = _mm512_inserti32x4(lo, _mm_loadu_si128((const __m128i *)(p + stride)), 1);
    const __m512i three = _mm512_inserti32x4(two, _mm_loadu_si128((const __m128i *)(p + 2 * stride)), 2);
    return _mm512_inserti32x4(three, _mm_loadu_si128((const __m128i *)(p + 3 * stride)), 3);
}

/* The weight scales 2^(e - 128) of a tile's blocks (e: the first byte of each 17-byte block, read
 * as a dword, whose other bytes are the block's own), lane L for block lane_of_block(L), quant's
 * em_e8m0_half: below e = 2 the subnormal 2^21 << e bits. `offsets`: 17 times each lane's block. */
EM_VNNI static EM_INLINE __m512 weight_scales(const uint8_t *w, __m512i offsets) {
    const __m512i e = _mm512_and_si512(_mm512_i32gather_epi32(offsets, (const void *)w, 1), _mm512_set1_epi32(0xff));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, tiny));
}

/* The activation scales (f16, the first two bytes of each 34-byte Q8_0 block) of a tile's blocks,
 * lane L for block lane_of_block(L). `offsets`: 34 times each lane's block. */
EM_VNNI static EM_INLINE __m512 activation_scales(const uint8_t *a, __m512i offsets) {
    const __m512i d = _mm512_i32gather_epi32(offsets, (const void *)a, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
}

/* Step m's four blocks of a tile, the 16 bytes `skip` bytes into each (blocks `block_bytes` apart
 * from `tile_start`): block 4m + k in 128-bit lane k, the tile's last block in the lanes past it. */
EM_VNNI static EM_INLINE __m512i step_lanes(const uint8_t *tile_start, uint64_t block_bytes, uint64_t skip, int m,
                                            int nb) {
    if (4 * m + 3 < nb) return load_lanes(tile_start + block_bytes * 4 * (uint64_t)m + skip, block_bytes);
    __m512i v = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) {
        const int j = 4 * m + k < nb ? 4 * m + k : nb - 1;
        const __m128i run = _mm_loadu_si128((const __m128i *)(tile_start + block_bytes * (uint64_t)j + skip));
        v = _mm512_mask_broadcast_i32x4(v, (__mmask16)(0xfu << (4 * k)), run);
    }
    return v;
}

/* nw weight rows against na activation rows (nw * na <= PAIRS_MAX), one tile of nb blocks (1 to 16)
 * from block `first`: sums[r * na + t] += each block's product, in block order. Lanes past nb hold
 * the tile's last block again (or nothing, for a step wholly past it) and are never added. */
EM_VNNI static EM_INLINE void tile(const uint8_t *const *w, int nw, const uint8_t *const *a, int na, uint64_t first,
                                   int nb, float *sums) {
    const __m512i levels = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6,
                                                                4, 0)); /* em_mxfp4_values + 12 */
    const __m512i low4 = _mm512_set1_epi8(15), twelve = _mm512_set1_epi8(12);
    __m512i acc[PAIRS_MAX][4];
    EM_UNROLL(4) for (int m = 0; m < 4; m++) {
        if (4 * m >= nb) {
            EM_UNROLL(4) for (int i = 0; i < nw * na; i++) acc[i][m] = _mm512_setzero_si512();
            continue;
        }
        __m512i act_lo[PAIRS_MAX], act_hi[PAIRS_MAX], start[PAIRS_MAX];
        EM_UNROLL(4) for (int t = 0; t < na; t++) {
            act_lo[t] = step_lanes(a[t] + 34 * first, 34, 2, m, nb);
            act_hi[t] = step_lanes(a[t] + 34 * first, 34, 18, m, nb);
            const __m512i twelve_sum =
                _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), twelve, act_lo[t]), twelve, act_hi[t]);
            start[t] = _mm512_sub_epi32(_mm512_setzero_si512(), twelve_sum);
        }
        EM_UNROLL(4) for (int r = 0; r < nw; r++) {
            const __m512i q = step_lanes(w[r] + 17 * first, 17, 1, m, nb);
            const __m512i lo = _mm512_shuffle_epi8(levels, _mm512_and_si512(q, low4));
            const __m512i hi = _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi16(q, 4), low4));
            EM_UNROLL(4) for (int t = 0; t < na; t++)
                acc[r * na + t][m] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start[t], lo, act_lo[t]), hi, act_hi[t]);
        }
    }
    /* lane L holds block lane_of_block(L); past the tile, its last block */
    const __m512i lane_blocks = _mm512_min_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
                                                 _mm512_set1_epi32(nb - 1));
    const __m512i w_offsets = _mm512_mullo_epi32(lane_blocks, _mm512_set1_epi32(17));
    const __m512i a_offsets = _mm512_mullo_epi32(lane_blocks, _mm512_set1_epi32(34));
    __m512 da[PAIRS_MAX];
    EM_UNROLL(4) for (int t = 0; t < na; t++) da[t] = activation_scales(a[t] + 34 * first, a_offsets);
    _Alignas(64) float products[PAIRS_MAX][TILE];
    EM_UNROLL(4) for (int r = 0; r < nw; r++) {
        const __m512 dw = weight_scales(w[r] + 17 * first, w_offsets);
        EM_UNROLL(4) for (int t = 0; t < na; t++) {
            const __m512 isum = _mm512_cvtepi32_ps(fold_steps(acc[r * na + t]));
            _mm512_store_ps(products[r * na + t], _mm512_mul_ps(_mm512_mul_ps(dw, da[t]), isum));
        }
    }
    /* the pairs' additions side by side: each a chain in block order, the chains independent */
    float sum[PAIRS_MAX];
    EM_UNROLL(4) for (int i = 0; i < nw * na; i++) sum[i] = sums[i];
    for (int j = 0; j < nb; j++) {
        const int lane = lane_of_block(j);
        EM_UNROLL(4) for (int i = 0; i < nw * na; i++) sum[i] += products[i][lane];
    }
    EM_UNROLL(4) for (int i = 0; i < nw * na; i++) sums[i] = sum[i];
}

/* All of a row's blocks, a tile at a time. */
EM_VNNI static EM_INLINE void rows(const uint8_t *const *w, int nw, const uint8_t *const *a, int na, uint64_t n,
                                   float *sums) {
    for (int i = 0; i < nw * na; i++) sums[i] = 0.0f;
    const uint64_t blocks = n / 32;
    for (uint64_t first = 0; first < blocks; first += TILE) {
        const int nb = blocks - first < TILE ? (int)(blocks - first) : TILE;
        tile(w, nw, a, na, first, nb, sums);
    }
}

EM_VNNI static float dot_mxfp4(const void *wv, const void *av, uint64_t n) {
    const uint8_t *w = wv, *a = av;
    float sum;
    rows(&w, 1, &a, 1, n, &sum);
    return sum;
}

/* One weight row against n_rows activation rows, four at a time (then the rest with a constant
 * count, so each call's loops unroll). */
#define ROWS_CALL(count)                                                                                        \
    do {                                                                                                      \
        const uint8_t *act[PAIRS_MAX];                                                                        \
        for (int t = 0; t < (count); t++) act[t] = a + (done + (uint64_t)t) * stride;                        \
        rows(&w, 1, act, (count), n, out + done);                                                             \
    } while (0)

EM_VNNI static void dot_rows_mxfp4(const void *wv, const void *av, uint64_t stride, uint32_t n_rows, uint64_t n,
                                   float *out) {
    const uint8_t *w = wv, *a = av;
    uint32_t done = 0;
    for (; done + PAIRS_MAX <= n_rows; done += PAIRS_MAX) ROWS_CALL(PAIRS_MAX);
    switch (n_rows - done) {
    case 1: ROWS_CALL(1); break;
    case 2: ROWS_CALL(2); break;
    case 3: ROWS_CALL(3); break;
    default: break;
    }
}

/* Several weight rows against one token's activations, four rows at a time. */
#define WEIGHTS_CALL(count)                                                                                     \
    do {                                                                                                      \
        const uint8_t *wr[PAIRS_MAX];                                                                         \
        for (int r = 0; r < (count); r++) wr[r] = w + (done + (uint64_t)r) * row_stride;                     \
        rows(wr, (count), &a, 1, n, out + done);                                                              \
    } while (0)

EM_VNNI static void dot_weights_mxfp4(const void *wv, uint64_t row_stride, uint32_t n_rows, const void *av,
                                      uint64_t activation_stride, uint32_t n_tokens, uint64_t n, float *out,
                                      uint64_t out_stride) {
    (void)activation_stride, (void)n_tokens, (void)out_stride; /* one token */
    const uint8_t *w = wv, *a = av;
    uint32_t done = 0;
    for (; done + PAIRS_MAX <= n_rows; done += PAIRS_MAX) WEIGHTS_CALL(PAIRS_MAX);
    switch (n_rows - done) {
    case 1: WEIGHTS_CALL(1); break;
    case 2: WEIGHTS_CALL(2); break;
    case 3: WEIGHTS_CALL(3); break;
    default: break;
    }
}

em_dot_fn em_quant_dot_mxfp4_avx512(void) { return em_quant_x86_has_vnni() ? dot_mxfp4 : NULL; }
em_dot_rows_fn em_quant_dot_rows_mxfp4_avx512(void) { return em_quant_x86_has_vnni() ? dot_rows_mxfp4 : NULL; }
em_dot_weights_fn em_quant_dot_weights_mxfp4_avx512(uint32_t n_tokens) {
    return em_quant_x86_has_vnni() && n_tokens == 1 ? dot_weights_mxfp4 : NULL;
}

#else

em_dot_fn em_quant_dot_mxfp4_avx512(void) { return NULL; }
em_dot_rows_fn em_quant_dot_rows_mxfp4_avx512(void) { return NULL; }
em_dot_weights_fn em_quant_dot_weights_mxfp4_avx512(uint32_t n_tokens) {
    (void)n_tokens;
    return NULL;
}

#endif
