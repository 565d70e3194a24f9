/*
 * BF16 weights against many tokens with AVX512_BF16: the batched products of BF16 models
 * (prefill). The activations are rounded to bf16 once per batch (em_bf16_round_rows), and
 * vdpbf16ps multiplies 32 bf16 pairs and adds them into 16 f32 sums per instruction, where the f32
 * path (em_dot_rows) widens every weight and needs one fused multiply-add per 8 or 16 products.
 *
 * The micro-kernel holds a tile of TILE_ROWS weight rows x TILE_TOKENS tokens in 24 registers of
 * partial sums, loading each 32-element step of the rows and the tokens once for the whole tile.
 * em_bf16_tiles sweeps a band of BAND_ROWS weight rows (kept in L2) over all the tokens, a tile's
 * worth of tokens (in L1) at a time, so each weight row comes from memory once per call and each
 * token's activations once per band.
 *
 * Not em_dot: rounding an activation to bf16 changes it by at most 2^-9 of its size, and
 * vdpbf16ps sums in another order (and flushes denormals); tests/test_quant.c holds the results to
 * the f32 definition within that bound.
 */
#include "dot_x86.h"

/* The definition the kernel computes, for CPUs without it: products of the bf16 values summed in f32. */
static void bf16_tiles_plain(const void *weights, uint64_t row_stride, uint32_t n_rows, const uint16_t *acts,
                             uint64_t act_stride, uint32_t n_tokens, uint64_t n, float *y, uint64_t y_stride) {
    for (uint32_t t = 0; t < n_tokens; t++)
        for (uint32_t r = 0; r < n_rows; r++) {
            const uint8_t *w = (const uint8_t *)weights + r * row_stride;
            float sum = 0;
            for (uint64_t j = 0; j < n; j++) sum += em_load_bf16(w + 2 * j) * em_bf16_to_f32(acts[t * act_stride + j]);
            y[t * y_stride + r] = sum;
        }
}

#if defined(__x86_64__) || defined(__i386__)

#include <stdatomic.h>

#include "vnni.h"

#define EM_BF16 __attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16")))

/* Weight rows and tokens of one micro-kernel call: 4 x 6 sums, 4 weight registers and a token's
 * register fit the 32 ZMM registers. */
#define TILE_ROWS 4
#define TILE_TOKENS 6
/* Weight rows swept over all tokens before the next band (32 rows of 2048 bf16: 128 KB, in L2). */
#define BAND_ROWS 32

bool em_bf16_tiles_available(void) {
    static _Atomic int known; /* 0: not probed yet, 1: absent or declined, 2: present */
    int state = atomic_load_explicit(&known, memory_order_relaxed);
    if (state == 0) {
        __builtin_cpu_init();
        state = em_quant_x86_has_vnni() && __builtin_cpu_supports("avx512bf16") ? 2 : 1;
        atomic_store_explicit(&known, state, memory_order_relaxed);
    }
    return state == 2;
}

/* Round to nearest even, as em_f32_to_bf16 (vcvtneps2bf16 quiets NaNs the same way). */
EM_BF16 static void round_rows(const float *x, uint64_t x_stride, uint32_t n_rows, uint64_t n, uint16_t *out,
                               uint64_t out_stride) {
    for (uint32_t t = 0; t < n_rows; t++) {
        const float *row = x + t * x_stride;
        uint16_t *dst = out + t * out_stride;
        uint64_t j = 0;
        for (; j + 16 <= n; j += 16) {
            const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(row + j));
            _mm256_storeu_si256((__m256i *)(dst + j), (__m256i)v);
        }
        for (; j < n; j++) dst[j] = em_f32_to_bf16(row[j]);
    }
}

void em_bf16_round_rows(const float *x, uint64_t x_stride, uint32_t n_rows, uint64_t n, uint16_t *out,
                        uint64_t out_stride) {
    if (em_bf16_tiles_available()) {
        round_rows(x, x_stride, n_rows, n, out, out_stride);
        return;
    }
    for (uint32_t t = 0; t < n_rows; t++)
        for (uint64_t j = 0; j < n; j++) out[t * out_stride + j] = em_f32_to_bf16(x[t * x_stride + j]);
}

/* The four rows' sums of one token: each row's 16 lanes folded to 8, then pairwise adds across
 * the four rows, so lane r of the result is row r's sum. */
EM_BF16 static EM_INLINE __m128 row_sums4(__m512 r0, __m512 r1, __m512 r2, __m512 r3) {
    const __m256 f0 = _mm256_add_ps(_mm512_castps512_ps256(r0), upper_ps(r0));
    const __m256 f1 = _mm256_add_ps(_mm512_castps512_ps256(r1), upper_ps(r1));
    const __m256 f2 = _mm256_add_ps(_mm512_castps512_ps256(r2), upper_ps(r2));
    const __m256 f3 = _mm256_add_ps(_mm512_castps512_ps256(r3), upper_ps(r3));
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(f0, f1), _mm256_hadd_ps(f2, f3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* One 32-element step of the tile: the rows' and tokens' bf16 pairs (a partial last step loads
 * through mask m; zeros add nothing). */
#define TILE_STEP(m)                                                                                              \
    do {                                                                                                          \
        __m512bh wv[TILE_ROWS];                                                                                   \
        EM_UNROLL(4) for (int r = 0; r < TILE_ROWS; r++) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(m, w[r] + j); \
        EM_UNROLL(6) for (int t = 0; t < TILE_TOKENS; t++) {                                                      \
            const __m512bh av = (__m512bh)_mm512_maskz_loadu_epi16(m, a[t] + j);                                  \
            EM_UNROLL(4) for (int r = 0; r < TILE_ROWS; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], av);  \
        }                                                                                                         \
    } while (0)

/* y[t][r] for the tile's rows (w[r], `nr` of them) and tokens (a[t], `nt`): the missing rows and
 * tokens of a ragged tile repeat the last one and their sums are dropped. */
EM_BF16 static void tile(const uint16_t *const w[TILE_ROWS], const uint16_t *const a[TILE_TOKENS], uint32_t nr,
                         uint32_t nt, uint64_t n, float *y, uint64_t y_stride) {
    __m512 acc[TILE_ROWS][TILE_TOKENS];
    EM_UNROLL(4) for (int r = 0; r < TILE_ROWS; r++) EM_UNROLL(6) for (int t = 0; t < TILE_TOKENS; t++)
        acc[r][t] = _mm512_setzero_ps();
    uint64_t j = 0;
    for (; j + 32 <= n; j += 32) TILE_STEP(0xffffffffu);
    if (j < n) TILE_STEP((1u << (n - j)) - 1);
    /* constant indices only (the loop unrolled in full), so the sums never leave the registers */
    EM_UNROLL(6) for (int t = 0; t < TILE_TOKENS; t++) {
        if ((uint32_t)t >= nt) break;
        const __m128 sums = row_sums4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
        if (nr == TILE_ROWS) {
            _mm_storeu_ps(y + t * y_stride, sums);
        } else {
            float part[TILE_ROWS];
            _mm_storeu_ps(part, sums);
            for (uint32_t r = 0; r < nr; r++) y[t * y_stride + r] = part[r];
        }
    }
}

EM_BF16 static void tiles(const uint8_t *weights, uint64_t row_stride, uint32_t n_rows, const uint16_t *acts,
                          uint64_t act_stride, uint32_t n_tokens, uint64_t n, float *y, uint64_t y_stride) {
    for (uint32_t band = 0; band < n_rows; band += BAND_ROWS) {
        const uint32_t band_end = n_rows - band < BAND_ROWS ? n_rows : band + BAND_ROWS;
        for (uint32_t t0 = 0; t0 < n_tokens; t0 += TILE_TOKENS) {
            const uint32_t nt = n_tokens - t0 < TILE_TOKENS ? n_tokens - t0 : TILE_TOKENS;
            const uint16_t *a[TILE_TOKENS];
            for (uint32_t t = 0; t < TILE_TOKENS; t++) a[t] = acts + (t0 + (t < nt ? t : nt - 1)) * act_stride;
            for (uint32_t r0 = band; r0 < band_end; r0 += TILE_ROWS) {
                const uint32_t nr = band_end - r0 < TILE_ROWS ? band_end - r0 : TILE_ROWS;
                const uint16_t *w[TILE_ROWS];
                for (uint32_t r = 0; r < TILE_ROWS; r++)
                    w[r] = (const uint16_t *)(weights + (r0 + (r < nr ? r : nr - 1)) * row_stride);
                tile(w, a, nr, nt, n, y + t0 * y_stride + r0, y_stride);
            }
        }
    }
}

void em_bf16_tiles(const void *weights, uint64_t row_stride, uint32_t n_rows, const uint16_t *acts,
                   uint64_t act_stride, uint32_t n_tokens, uint64_t n, float *y, uint64_t y_stride) {
    if (!em_bf16_tiles_available())
        bf16_tiles_plain(weights, row_stride, n_rows, acts, act_stride, n_tokens, n, y, y_stride);
    else if (n_rows && n_tokens)
        tiles(weights, row_stride, n_rows, acts, act_stride, n_tokens, n, y, y_stride);
}

#else

bool em_bf16_tiles_available(void) { return false; }

void em_bf16_round_rows(const float *x, uint64_t x_stride, uint32_t n_rows, uint64_t n, uint16_t *out,
                        uint64_t out_stride) {
    for (uint32_t t = 0; t < n_rows; t++)
        for (uint64_t j = 0; j < n; j++) out[t * out_stride + j] = em_f32_to_bf16(x[t * x_stride + j]);
}

void em_bf16_tiles(const void *weights, uint64_t row_stride, uint32_t n_rows, const uint16_t *acts,
                   uint64_t act_stride, uint32_t n_tokens, uint64_t n, float *y, uint64_t y_stride) {
    bf16_tiles_plain(weights, row_stride, n_rows, acts, act_stride, n_tokens, n, y, y_stride);
}

#endif
