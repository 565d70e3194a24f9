/*
 * AVX-512 VNNI multi-row dot products for Q4_K, Q8_0 and IQ3_XXS: one weight row against up to eight
 * activation rows, for CPUs with BMI2, AVX512F, AVX512BW, AVX512VL and AVX512_VNNI (chosen at run time;
 * EMBER_CPU_ISA=avx2 keeps the AVX2 kernels). Compiled with function-level target attributes, so
 * the build needs no global -mavx512 flag.
 *
 * vpdpbusd sums four u8 x s8 products into an int32 lane in one instruction, where AVX2 needs
 * vpmaddubsw, vpmaddwd and an add; and a 512-bit register holds two 32-byte runs at once. Each
 * kernel builds, lane for lane, the same eight int32 sums per block as the AVX2 kernel in
 * dot_rows_avx2.c (integer sums are exact, so how they are grouped changes nothing) and then does
 * that kernel's f32 steps on them, in its order. Results are therefore bitwise equal to em_dot's,
 * which tests/test_quant.c asserts on both paths.
 */
#include "dot_x86.h"

#if defined(__x86_64__) || defined(__i386__)

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "vnni.h"

/* The most activation rows one kernel call takes (eight 8-lane f32 accumulators and eight 16-lane
 * integer sums fit the 32 ZMM registers beside the unpacked block). */
#define VNNI_ROWS_MAX 8

/* The fewest rows a call hands the VNNI kernels (see VNNI_ENTRY). */
#define Q4_K_FEWEST 1
#define Q8_0_FEWEST 4
#define IQ3_XXS_FEWEST 1

#define UNROLL_ROWS EM_UNROLL(8)

/* The lane sums of four int32 vectors, as the four lanes of one (exact in any order). */
EM_VNNI static EM_INLINE __m128i hsum4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* Q4_K: per 64-element chunk c, one register holds the 32 low nibbles (sub-block 2c) in its lower
 * half and the 32 high nibbles (sub-block 2c + 1) in its upper half, matching the 64 contiguous
 * Q8_K activations of those sub-blocks. vpdpbusd gives per lane the sum of four products (at most
 * 4 * 15 * 127 in size, so it fits the low 16 bits of its lane), and vpdpwssd multiplies that by
 * the sub-block's scale (as the int16 pair (scale, 0)) into the running sum. Folding the halves
 * gives the AVX2 kernel's isum: there, lane i is scale(2c) * (lane i of the low products) +
 * scale(2c + 1) * (lane i of the high ones), summed over c. */
EM_VNNI static EM_INLINE void q4_k_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                        float *out) {
    __m256 acc[VNNI_ROWS_MAX];
    __m128 mins_total[2] = {_mm_setzero_ps(), _mm_setzero_ps()}; /* rows 0..3, 4..7: row r in lane r % 4 */
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(15);
    for (uint64_t b = 0; b < n / 256; b++, w += 144, a += 292) {
        const __m128i sm = k_scales_mins(w + 4);
        const __m256i mins_pairs = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
        /* scale s as the int32 lane s, the int16 pair (s, 0): low half for sub-block 2c, high 2c+1 */
        const __m512i scales32 = _mm512_cvtepu8_epi32(sm);
        __m512i isum[VNNI_ROWS_MAX];
        __m256i mins[VNNI_ROWS_MAX];
        float d8[VNNI_ROWS_MAX] = {0, 0, 0, 0, 0, 0, 0, 0};
        UNROLL_ROWS for (int r = 0; r < VNNI_ROWS_MAX; r++) {
            mins[r] = _mm256_setzero_si256();
            if (r >= nr) continue;
            d8[r] = em_load_f32(a + r * stride);
            mins[r] = _mm256_madd_epi16(load32(a + r * stride + 260), mins_pairs);
            isum[r] = _mm512_setzero_si512();
        }
        const float dmin = fp16(w + 2);
        __m128 scale = _mm_mul_ps(_mm_set1_ps(dmin), _mm_setr_ps(d8[0], d8[1], d8[2], d8[3]));
        mins_total[0] = _mm_add_ps(mins_total[0], _mm_mul_ps(scale, _mm_cvtepi32_ps(hsum4(mins[0], mins[1], mins[2],
                                                                                          mins[3]))));
        if (nr > 4) {
            scale = _mm_mul_ps(_mm_set1_ps(dmin), _mm_setr_ps(d8[4], d8[5], d8[6], d8[7]));
            mins_total[1] = _mm_add_ps(mins_total[1], _mm_mul_ps(scale, _mm_cvtepi32_ps(hsum4(mins[4], mins[5],
                                                                                              mins[6], mins[7]))));
        }
        for (int c = 0; c < 4; c++) {
            const __m512i q = _mm512_broadcast_i64x4(load32(w + 16 + 32 * c));
            /* lower half: low nibbles; upper half: high nibbles */
            const __m512i nib = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xffff0000u, q, 4), low4);
            const __m512i pick = pair_index(2 * c);
            const __m512i sc = _mm512_permutexvar_epi32(pick, scales32);
            UNROLL_ROWS for (int r = 0; r < nr; r++) {
                const __m512i act = _mm512_loadu_si512((const void *)(a + r * stride + 4 + 64 * c));
                isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_dpbusd_epi32(_mm512_setzero_si512(), nib, act), sc);
            }
        }
        const float dw = fp16(w);
        UNROLL_ROWS for (int r = 0; r < nr; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * d8[r]), _mm256_cvtepi32_ps(fold_halves(isum[r])), acc[r]);
    }
    float mins_out[VNNI_ROWS_MAX];
    _mm_storeu_ps(mins_out, mins_total[0]);
    _mm_storeu_ps(mins_out + 4, mins_total[1]);
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]) - mins_out[r];
}

/* Q8_0: rows in pairs, one register per pair (row 2p's 32 activations in the lower half, row
 * 2p + 1's in the upper), the weight magnitudes in both halves and the weight signs moved onto the
 * activations (the AVX2 kernel's sign trick; activations never hold -128). Each pair's f32
 * accumulator holds the two rows' eight lanes side by side, updated block by block with the AVX2
 * kernel's per-lane multiply-add. An odd last row is paired with itself and its copy dropped. */
EM_VNNI static EM_INLINE void q8_0_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                        float *out) {
    enum { PAIRS = VNNI_ROWS_MAX / 2 };
    const int np = (nr + 1) / 2;
    const uint8_t *row[VNNI_ROWS_MAX];
    UNROLL_ROWS for (int r = 0; r < VNNI_ROWS_MAX; r++) row[r] = a + (r < nr ? r : nr - 1) * stride;
    __m512 acc[PAIRS];
    UNROLL_ROWS for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, w += 34) {
        const __m256i q = load32(w + 2);
        const __m512i mag = _mm512_broadcast_i64x4(_mm256_abs_epi8(q));
        const __mmask64 neg = _mm512_movepi8_mask(_mm512_broadcast_i64x4(q));
        const uint64_t at = 34 * b;
        /* the eight rows' scale products dw * d8, lane r for row r, as the AVX2 kernel's f32 products */
        __m128i d8 = _mm_cvtsi32_si128(em_load_u16(row[0] + at));
        d8 = _mm_insert_epi16(d8, em_load_u16(row[1] + at), 1);
        d8 = _mm_insert_epi16(d8, em_load_u16(row[2] + at), 2);
        d8 = _mm_insert_epi16(d8, em_load_u16(row[3] + at), 3);
        d8 = _mm_insert_epi16(d8, em_load_u16(row[4] + at), 4);
        d8 = _mm_insert_epi16(d8, em_load_u16(row[5] + at), 5);
        d8 = _mm_insert_epi16(d8, em_load_u16(row[6] + at), 6);
        d8 = _mm_insert_epi16(d8, em_load_u16(row[7] + at), 7);
        const __m512 scales = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(fp16(w)), _mm256_cvtph_ps(d8)));
        UNROLL_ROWS for (int p = 0; p < np; p++) {
            const uint8_t *r0 = row[2 * p] + at, *r1 = row[2 * p + 1] + at;
            __m512i act = _mm512_inserti64x4(_mm512_castsi256_si512(load32(r0 + 2)), load32(r1 + 2), 1);
            act = _mm512_mask_sub_epi8(act, neg, _mm512_setzero_si512(), act);
            const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), mag, act);
            const __m512i pick = pair_index(2 * p);
            const __m512 scale = _mm512_permutexvar_ps(pick, scales);
            acc[p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[p]);
        }
    }
    for (int p = 0; p < np; p++) {
        out[2 * p] = hsum(_mm512_castps512_ps256(acc[p]));
        if (2 * p + 1 < nr) out[2 * p + 1] = hsum(upper_ps(acc[p]));
    }
}

/* IQ3_XXS, the products of a run pair (runs ib and ib + 1: their magnitudes, sign mask and scales
 * as the int16 pairs of each half) with each activation row, into the rows' integer sums. */
EM_VNNI static EM_INLINE void iq3_xxs_pair(__m512i *isum, const uint8_t *a, uint64_t stride, int nr, int ib,
                                           __m512i mag, __mmask64 neg, __m512i scale) {
    UNROLL_ROWS for (int r = 0; r < nr; r++) {
        __m512i act = _mm512_loadu_si512((const void *)(a + r * stride + 4 + 32 * ib));
        act = _mm512_mask_sub_epi8(act, neg, _mm512_setzero_si512(), act);
        isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(mag, act), scale);
    }
}

/* IQ3_XXS, a block's f32 step per activation row: the AVX2 kernel's d * d8 / 4 times its folded sums. */
EM_VNNI static EM_INLINE void iq3_xxs_block_done(__m256 *acc, const __m512i *isum, const uint8_t *w, const uint8_t *a,
                                                 uint64_t stride, int nr) {
    UNROLL_ROWS for (int r = 0; r < nr; r++) {
        float d = fp16(w) * em_load_f32(a + r * stride) * 0.25f;
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold_halves(isum[r])), acc[r]);
    }
}

/* IQ3_XXS: two 32-element runs per register. The sixteen grid points of the two runs are loaded
 * from the table (iq3xxs_grid_points: a gather, or a lookup in registers, is slower), the signs
 * become a 64-bit mask (AVX-512BW) that negates the activations' bytes, and vpdpwssd multiplies
 * the vpmaddubsw pairs by each run's integer scale (2s + 1; the lower half's in the lower sixteen
 * int16 lanes) into the running sum. Folding the halves gives the AVX2 kernel's isum: there, lane
 * i sums the same four products of every run, times the run's scale. */
EM_VNNI static EM_INLINE void iq3_xxs_rows(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr, uint64_t n,
                                           float *out) {
    __m256 acc[VNNI_ROWS_MAX];
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 256; b++, w += 98, a += 292) {
        __m512i isum[VNNI_ROWS_MAX];
        UNROLL_ROWS for (int r = 0; r < nr; r++) isum[r] = _mm512_setzero_si512();
        for (int ib = 0; ib < 8; ib += 2) {
            const uint32_t aux0 = em_load_u32(w + 66 + 4 * ib), aux1 = em_load_u32(w + 70 + 4 * ib);
            const __m512i mag = iq3xxs_grid_points(w + 2 + 8 * ib);
            const __mmask64 neg = iq3xxs_sign_mask(aux0, aux1);
            const __m512i scale = _mm512_mask_set1_epi16(_mm512_set1_epi16((int16_t)(2 * (aux0 >> 28) + 1)),
                                                         0xffff0000u, (int16_t)(2 * (aux1 >> 28) + 1));
            iq3_xxs_pair(isum, a, stride, nr, ib, mag, neg, scale);
        }
        iq3_xxs_block_done(acc, isum, w, a, stride, nr);
    }
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]);
}

/* Words 0..15 hold `first`, words 16..31 `first + 1`: a vpermw index that spreads word `first` of a
 * vector over the lower half and word `first + 1` over the upper. */
EM_VNNI static EM_INLINE __m512i pair_index16(int first) {
    return _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16((int16_t)first),
                                   _mm512_set1_epi16((int16_t)(first + 1)));
}

/* The VNNI set plus AVX-512 VBMI (byte permutes, vpmultishiftqb) and BITALG (vpshufbitqmb). */
#define EM_VBMI                                                                                            \
    __attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg")))

/* IQ3_XXS with every step of a block's decoding in vector registers. The kernel above moves each
 * run's signs and scale from general registers to vector and mask registers, and builds its grid
 * points with inserts; those transfers, not the products, set its speed. Here, per block of eight
 * runs: vpmultishiftqb cuts the 32 seven-bit sign groups out of the runs' aux words and vpermi2b
 * looks each up in a 128-entry table that adds its parity bit (so qword p holds the signs of runs
 * 2p and 2p + 1, iq3xxs_sign_mask's 64 bits), and vpshufbitqmb turns a qword into the negation mask;
 * the scales 2s + 1 become eight int16 words, spread to a run pair's halves by vpermw. Per half block
 * the 32 grid indices look up their points' twelve-bit level codes (em_iq3xxs_codes, four tables of
 * 64 words: vpermi2w, then two blends by index bits 6 and 7), vpmultishiftqb spreads each code's
 * four three-bit fields to bytes and vpermb maps them to magnitudes. The products, integer sums and
 * f32 steps are the kernel above's, so the results are too (bitwise em_dot's). */
EM_VBMI static EM_INLINE void iq3_xxs_rows_vbmi(const uint8_t *w, const uint8_t *a, uint64_t stride, int nr,
                                                uint64_t n, float *out) {
    __m512i codes_lo[4], codes_hi[4];
    for (int j = 0; j < 4; j++) {
        codes_lo[j] = _mm512_loadu_si512((const void *)(em_iq3xxs_codes + 64 * j));
        codes_hi[j] = _mm512_loadu_si512((const void *)(em_iq3xxs_codes + 64 * j + 32));
    }
    const __m512i levels = _mm512_set1_epi64(0x3e342c241c140c04ll); /* byte i: level i % 8 */
    /* the byte offsets of points 0 and 1 of a qword's four codes (even qwords), 2 and 3 (odd ones) */
    const __m512i fields = _mm512_set_epi64(0x3936333029262320ll, 0x1916131009060300ll, 0x3936333029262320ll,
                                            0x1916131009060300ll, 0x3936333029262320ll, 0x1916131009060300ll,
                                            0x3936333029262320ll, 0x1916131009060300ll);
    const __m512i points_low = _mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3);
    const __m512i points_high = _mm512_setr_epi64(4, 4, 5, 5, 6, 6, 7, 7);
    const __m256i sign_fields = _mm256_set1_epi64x(0x352e2720150e0700ll); /* 7-bit groups at 0, 7, .. of each aux */
    const __m512i iota = _mm512_set_epi8(63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45,
                                         44, 43, 42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26,
                                         25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                         5, 4, 3, 2, 1, 0);
    const __m512i iota_high = _mm512_add_epi8(iota, _mm512_set1_epi8(64));
    const __m512i one = _mm512_set1_epi8(1);
    /* entry i of the sign table: i with its parity as bit 7 */
    const __m512i parity_low =
        _mm512_or_si512(iota, _mm512_slli_epi16(_mm512_and_si512(_mm512_popcnt_epi8(iota), one), 7));
    const __m512i parity_high =
        _mm512_or_si512(iota_high, _mm512_slli_epi16(_mm512_and_si512(_mm512_popcnt_epi8(iota_high), one), 7));
    const __m512i bit6 = _mm512_set1_epi16(64), bit7 = _mm512_set1_epi16(128);
    __m256 acc[VNNI_ROWS_MAX];
    UNROLL_ROWS for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 256; b++, w += 98, a += 292) {
        const __m256i aux = _mm256_loadu_si256((const __m256i *)(const void *)(w + 66));
        const __m512i signs = _mm512_permutex2var_epi8(
            parity_low, _mm512_castsi256_si512(_mm256_multishift_epi64_epi8(sign_fields, aux)), parity_high);
        const __m256i scales32 =
            _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(aux, 28), 1), _mm256_set1_epi32(1));
        const __m512i scales16 = _mm512_castsi128_si512(_mm256_cvtepi32_epi16(scales32));
        __m512i isum[VNNI_ROWS_MAX];
        UNROLL_ROWS for (int r = 0; r < nr; r++) isum[r] = _mm512_setzero_si512();
        for (int half = 0; half < 2; half++) {
            const __m512i index =
                _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(w + 2 + 32 * half)));
            __m512i code[4];
            for (int j = 0; j < 4; j++) code[j] = _mm512_permutex2var_epi16(codes_lo[j], index, codes_hi[j]);
            const __mmask32 b6 = _mm512_test_epi16_mask(index, bit6), b7 = _mm512_test_epi16_mask(index, bit7);
            const __m512i codes = _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, code[0], code[1]),
                                                          _mm512_mask_blend_epi16(b6, code[2], code[3]));
            for (int p = 0; p < 2; p++) {
                const int pair = 2 * half + p, ib = 2 * pair;
                const __m512i spread = _mm512_permutexvar_epi64(p ? points_high : points_low, codes);
                const __m512i mag = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(fields, spread), levels);
                const __mmask64 neg =
                    _mm512_bitshuffle_epi64_mask(_mm512_permutexvar_epi64(_mm512_set1_epi64(pair), signs), iota);
                const __m512i scale = _mm512_permutexvar_epi16(pair_index16(2 * pair), scales16);
                iq3_xxs_pair(isum, a, stride, nr, ib, mag, neg, scale);
            }
        }
        iq3_xxs_block_done(acc, isum, w, a, stride, nr);
    }
    UNROLL_ROWS for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]);
}

/* One entry point per type; each switch case inlines the kernel with a constant row count. Groups
 * of fewer than `fewest` rows (a decode step's single token) go to the AVX2 kernel of the type
 * instead: bitwise the same results, and cheaper there, where the fixed cost of a block (Q8_0's
 * eight-row scale vector, paired registers with one row unused) has few rows to spread over. */
#define TARGET_ENTRY(target, name, kernel, type, fewest)                                                          \
    target static void name(const void *wv, const void *av, uint64_t stride, uint32_t n_rows, uint64_t n,       \
                             float *out) {                                                                        \
        const uint8_t *w = wv, *a = av;                                                                           \
        for (uint32_t done = 0; done < n_rows; done += VNNI_ROWS_MAX) {                                          \
            const uint8_t *at = a + done * stride;                                                                \
            if (n_rows - done < (fewest)) {                                                                       \
                em_quant_dot_rows_x86(type)(w, at, stride, n_rows - done, n, out + done);                         \
                return;                                                                                           \
            }                                                                                                     \
            switch (n_rows - done) {                                                                              \
            case 1: kernel(w, at, stride, 1, n, out + done); break;                                              \
            case 2: kernel(w, at, stride, 2, n, out + done); break;                                              \
            case 3: kernel(w, at, stride, 3, n, out + done); break;                                              \
            case 4: kernel(w, at, stride, 4, n, out + done); break;                                              \
            case 5: kernel(w, at, stride, 5, n, out + done); break;                                              \
            case 6: kernel(w, at, stride, 6, n, out + done); break;                                              \
            case 7: kernel(w, at, stride, 7, n, out + done); break;                                              \
            default: kernel(w, at, stride, 8, n, out + done); break;                                             \
            }                                                                                                     \
        }                                                                                                         \
    }

#define VNNI_ENTRY(name, kernel, type, fewest) TARGET_ENTRY(EM_VNNI, name, kernel, type, fewest)

VNNI_ENTRY(dot_rows_q4_k_vnni, q4_k_rows, EM_TYPE_Q4_K, Q4_K_FEWEST)
VNNI_ENTRY(dot_rows_q8_0_vnni, q8_0_rows, EM_TYPE_Q8_0, Q8_0_FEWEST)
VNNI_ENTRY(dot_rows_iq3_xxs_vnni, iq3_xxs_rows, EM_TYPE_IQ3_XXS, IQ3_XXS_FEWEST)
TARGET_ENTRY(EM_VBMI, dot_rows_iq3_xxs_vbmi, iq3_xxs_rows_vbmi, EM_TYPE_IQ3_XXS, IQ3_XXS_FEWEST)

/* Whether the CPU has AVX-512 VBMI and BITALG beside the VNNI set (iq3_xxs_rows_vbmi). */
static bool has_vbmi(void) {
    static _Atomic int known; /* 0: not probed yet, 1: absent, 2: present */
    int state = atomic_load_explicit(&known, memory_order_relaxed);
    if (state == 0) {
        __builtin_cpu_init();
        state = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bitalg") ? 2 : 1;
        atomic_store_explicit(&known, state, memory_order_relaxed);
    }
    return state == 2;
}

bool em_quant_x86_has_vnni(void) {
    static _Atomic int known; /* 0: not probed yet, 1: absent or declined, 2: present */
    int state = atomic_load_explicit(&known, memory_order_relaxed);
    if (state == 0) {
        __builtin_cpu_init();
        const char *isa = getenv("EMBER_CPU_ISA");
        bool declined = isa && strcmp(isa, "avx2") == 0;
        bool present = em_quant_x86_has_avx2() && __builtin_cpu_supports("bmi2") &&
                       __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
        state = present && !declined ? 2 : 1;
        atomic_store_explicit(&known, state, memory_order_relaxed);
    }
    return state == 2;
}

em_dot_rows_fn em_quant_dot_rows_vnni(uint32_t weight_type) {
    if (!em_quant_x86_has_vnni()) return NULL;
    switch (weight_type) {
    case EM_TYPE_Q4_K: return dot_rows_q4_k_vnni;
    case EM_TYPE_Q8_0: return dot_rows_q8_0_vnni;
    case EM_TYPE_IQ3_XXS: return has_vbmi() ? dot_rows_iq3_xxs_vbmi : dot_rows_iq3_xxs_vnni;
    case EM_TYPE_MXFP4: return em_quant_dot_rows_mxfp4_avx512();
    default: return NULL;
    }
}

#else

bool em_quant_x86_has_vnni(void) { return false; }

em_dot_rows_fn em_quant_dot_rows_vnni(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

#endif
