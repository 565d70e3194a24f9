/*
 * Q4_K and Q8_0 weights against many tokens with AMX-INT8 (em_amx_product): the batched products
 * of such models (prefill) on CPUs with Intel's tile matrix unit, where one tdpbusd multiplies a 16 x 64
 * tile of unsigned bytes by a 64 x 16 tile of signed bytes into 16 x 16 int32 sums: 16,384
 * products per instruction, where a 512-bit VNNI instruction does 64.
 *
 * Each result is em_dot_scalar's, bitwise: per weight block, the exact integer sums of that
 * definition (the levels times the sub-block scales; the sub-block mins times the activation sums),
 * then its f32 steps in its order, one lane per token. The tile unit only forms the first integer
 * sum. A sub-block scale (6 bits) times a level (4 bits) does not fit a byte, so each weight row is
 * laid out twice per block, its levels times the scale's top 3 bits (hi) and times its low 3 bits
 * (lo), both below 128: the block's sum is 8 * (hi sum) + (lo sum), exact. The min term, eight
 * products per block, is left to AVX-512 (vpdpwssd against the activations' sub-block sums).
 *
 * Activations: Q8_K rows packed once per product in tiles of EM_AMX_TILE_TOKENS tokens (em_amx_pack):
 * per weight block, the 16 tokens' f32 scales, their sub-block sums as int16 pairs, and the levels
 * as four 64 x 16 tiles in the unit's layout (row k / 4 holds four consecutive levels of each token).
 * Weights: 16 rows at a time are laid out as hi / lo tiles for the whole row length (the chunk's
 * work buffer, in L2) and then swept over every token tile, two token tiles per pass so that each weight
 * tile loaded serves both.
 *
 * Q8_0 is simpler: its signed levels go to tdpbssd as they are, one 32-column block per instruction
 * (each block has its own scales), and each block's sums take em_dot_scalar's f32 steps.
 *
 * Without AMX (or with EMBER_CPU_ISA=avx2), a plain loop computes the same numbers from the packed
 * tiles, so the packing is tested on every CPU.
 */
#include "dot_x86.h"

#include <stdlib.h>
#include <string.h>

enum {
    TILE_TOKENS = EM_AMX_TILE_TOKENS,
    TILE_ROWS = 16, /* weight rows per chunk: the rows of a tdpbusd's result tile */
    /* One weight block (256 columns) of a token tile: scales, sub-block sums, four level tiles. */
    PACK_SCALES = 0,
    PACK_SUMS = PACK_SCALES + 4 * TILE_TOKENS,       /* 4 x 16 int32: sub-blocks 2p, 2p + 1 of token t */
    PACK_LEVELS = PACK_SUMS + 4 * 4 * TILE_TOKENS,   /* 4 tiles of 16 rows x 64 bytes */
    PACK_BLOCK = PACK_LEVELS + 4 * 16 * 64,
    /* One weight block of a chunk of 16 rows: for each 64 columns k, the hi tile then the lo tile
     * (16 rows x 64 bytes each, contiguous), the rows' d and dmin, and their mins as int16 pairs
     * (pair p of row r at word 16 p + r). */
    PREP_TILE = TILE_ROWS * 64,
    PREP_D = 8 * PREP_TILE,
    PREP_DMIN = PREP_D + 4 * TILE_ROWS,
    PREP_MINS = PREP_DMIN + 4 * TILE_ROWS,
    PREP_BLOCK = PREP_MINS + 4 * 4 * TILE_ROWS,
};

/* Q8_0 (Q8_0 activations): per 32-column block of a token tile, the 16 tokens' f16 scales, then the
 * levels as one 32 x 16 tile (8 rows of 64 bytes); per block of a weight chunk, the rows' f32
 * scales, then their levels as a 16 x 32 tile. */
enum {
    Q8_PACK_SCALES = 0,
    Q8_PACK_LEVELS = 2 * TILE_TOKENS,
    Q8_PACK_BLOCK = Q8_PACK_LEVELS + 8 * 64, /* 16 tokens' 34-byte blocks: the scratch holds it */
    Q8_PREP_D = 0,
    Q8_PREP_LEVELS = 4 * TILE_ROWS,
    Q8_PREP_BLOCK = Q8_PREP_LEVELS + TILE_ROWS * 32,
};

uint64_t em_amx_tile_bytes(uint32_t weight_type, uint64_t n) {
    if (weight_type == EM_TYPE_Q4_K) return n % 256 == 0 ? n / 256 * PACK_BLOCK : 0;
    if (weight_type == EM_TYPE_Q8_0) return n % 32 == 0 ? n / 32 * Q8_PACK_BLOCK : 0;
    return 0;
}

static void pack_q8_0(const uint8_t *rows, uint64_t stride, uint32_t n_rows, uint64_t n, uint8_t *out) {
    memset(out, 0, n / 32 * Q8_PACK_BLOCK);
    for (uint32_t t = 0; t < n_rows && t < TILE_TOKENS; t++)
        for (uint64_t b = 0; b < n / 32; b++) {
            const uint8_t *a = rows + t * stride + b * 34;
            uint8_t *p = out + b * Q8_PACK_BLOCK;
            memcpy(p + Q8_PACK_SCALES + 2 * t, a, 2);
            for (int k = 0; k < 32; k += 4) memcpy(p + Q8_PACK_LEVELS + 64 * (k / 4) + 4 * t, a + 2 + k, 4);
        }
}

void em_amx_pack(uint32_t weight_type, const void *activation_rows, uint64_t stride, uint32_t n_rows, uint64_t n,
                 void *tile) {
    if (weight_type == EM_TYPE_Q8_0) {
        pack_q8_0(activation_rows, stride, n_rows, n, tile);
        return;
    }
    /* Q4_K's activations, Q8_K: f32 scale, 256 levels, 16 int16 sums of 16 */
    uint8_t *out = tile;
    memset(out, 0, n / 256 * PACK_BLOCK);
    for (uint32_t t = 0; t < n_rows && t < TILE_TOKENS; t++) {
        const uint8_t *row = (const uint8_t *)activation_rows + t * stride;
        for (uint64_t b = 0; b < n / 256; b++) {
            const uint8_t *a = row + b * 292;
            uint8_t *p = out + b * PACK_BLOCK;
            memcpy(p + PACK_SCALES + 4 * t, a, 4);
            for (int s = 0; s < 8; s++) {
                const int16_t sum = (int16_t)((int16_t)em_load_u16(a + 260 + 4 * s) + (int16_t)em_load_u16(a + 262 + 4 * s));
                em_store_u16(p + PACK_SUMS + 4 * (TILE_TOKENS * (s / 2) + t) + 2 * (s % 2), (uint16_t)sum);
            }
            for (int k = 0; k < 256; k += 4) /* levels k..k+3: tile k / 64, row k % 64 / 4, token t */
                memcpy(p + PACK_LEVELS + 1024 * (k / 64) + 64 * (k % 64 / 4) + 4 * t, a + 4 + k, 4);
        }
    }
}

/* Token t's em_dot_scalar result for one weight row from a packed tile, for CPUs without AMX. */
static float plain_result(const uint8_t *w, const uint8_t *tile, uint32_t t, uint64_t n) {
    float sum = 0;
    for (uint64_t b = 0; b < n / 256; b++, w += 144, tile += PACK_BLOCK) {
        const float d8 = em_load_f32(tile + PACK_SCALES + 4 * t);
        const float d = em_load_fp16(w) * d8, dmin = em_load_fp16(w + 2) * d8;
        int scaled = 0, mins = 0;
        for (int s = 0; s < 8; s++) {
            int sc, mn;
            em_quant_k_scale_min(w + 4, s, &sc, &mn);
            const uint8_t *q = w + 16 + 32 * (s / 2);
            int isum = 0;
            for (int j = 0; j < 32; j++) {
                const int k = 32 * s + j;
                const int8_t level = (int8_t)tile[PACK_LEVELS + 1024 * (k / 64) + 64 * (k % 64 / 4) + 4 * t + k % 4];
                isum += ((q[j] >> (4 * (s % 2))) & 15) * level;
            }
            scaled += sc * isum;
            mins += mn * (int16_t)em_load_u16(tile + PACK_SUMS + 4 * (TILE_TOKENS * (s / 2) + t) + 2 * (s % 2));
        }
        sum += d * (float)scaled - dmin * (float)mins;
    }
    return sum;
}

static float plain_result_q8_0(const uint8_t *w, const uint8_t *tile, uint32_t t, uint64_t n) {
    float sum = 0;
    for (uint64_t b = 0; b < n / 32; b++, w += 34, tile += Q8_PACK_BLOCK) {
        int isum = 0;
        for (int k = 0; k < 32; k++)
            isum += (int8_t)w[2 + k] * (int8_t)tile[Q8_PACK_LEVELS + 64 * (k / 4) + 4 * t + k % 4];
        sum += em_load_fp16(w) * em_load_fp16(tile + Q8_PACK_SCALES + 2 * t) * (float)isum;
    }
    return sum;
}

static void product_plain(uint32_t weight_type, const void *weight_rows, uint64_t row_stride, uint32_t n_rows,
                          const void *tiles, uint32_t n_tokens, uint64_t n, float *y, uint64_t y_stride) {
    const uint64_t tile_bytes = em_amx_tile_bytes(weight_type, n);
    for (uint32_t t = 0; t < n_tokens; t++)
        for (uint32_t r = 0; r < n_rows; r++) {
            const uint8_t *w = (const uint8_t *)weight_rows + r * row_stride;
            const uint8_t *tile = (const uint8_t *)tiles + t / TILE_TOKENS * tile_bytes;
            y[t * y_stride + r] = weight_type == EM_TYPE_Q8_0 ? plain_result_q8_0(w, tile, t % TILE_TOKENS, n)
                                                              : plain_result(w, tile, t % TILE_TOKENS, n);
        }
}

#if defined(__x86_64__) || defined(__i386__)

#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "avx2.h"
#include "vnni.h"

#define EM_AMX __attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))

/* Linux grants a process the tile registers' state only on request (arch_prctl). */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

bool em_amx_available(void) {
    static _Atomic int known; /* 0: not probed yet, 1: absent or declined, 2: present */
    int state = atomic_load_explicit(&known, memory_order_relaxed);
    if (state == 0) {
        unsigned eax, ebx, ecx, edx;
        const bool cpu = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 24 & 1) && (edx >> 25 & 1);
        state = cpu && em_quant_x86_has_vnni() && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
                    ? 2
                    : 1;
        atomic_store_explicit(&known, state, memory_order_relaxed);
    }
    return state == 2;
}

/* Q4_K: every tile 16 rows of 64 bytes, 0..3 results (hi and lo of two token tiles), 4..5 weights
 * (hi, lo), 6..7 activations (two token tiles). Q8_0: 0..1 results (two token tiles), 4 weights (16
 * rows of 32 bytes), 6..7 activations (8 rows of 64 bytes). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} tile_config;

EM_AMX static void configure_tiles(uint32_t weight_type) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.bytes_per_row[i] = 64;
        c.rows[i] = 16;
    }
    if (weight_type == EM_TYPE_Q8_0) /* a 32-column block: weights 16 x 32, activations 8 x 64 */
        for (int i = 4; i < 8; i++) {
            c.bytes_per_row[i] = i < 6 ? 32 : 64;
            c.rows[i] = i < 6 ? 16 : 8;
        }
    _tile_loadconfig(&c);
}

/* Lays out `rows` (at most 16; the rest zero) weight rows' blocks as the chunk's work buffer. A
 * 64-column tile row holds sub-blocks 2k and 2k + 1: the low nibbles of the block's 32-byte run k
 * and its high nibbles. Levels are multiplied as 16-bit words of two bytes each: a byte times a
 * part of a scale (at most 15 * 7) never carries into its neighbour, and both bytes of a word belong
 * to the same sub-block. */
EM_AMX static void prepare_chunk(const uint8_t *w, uint64_t row_stride, uint32_t rows, uint64_t n, uint8_t *prep) {
    if (rows < TILE_ROWS) memset(prep, 0, n / 256 * PREP_BLOCK); /* the missing rows multiply as zeros */
    const __m512i low4 = _mm512_set1_epi8(15);
    /* word i of tile row k takes scale 2k (words 0..15) or 2k + 1 (16..31) */
    __m512i spread[4];
    for (int k = 0; k < 4; k++)
        spread[k] = _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16((short)(2 * k)), _mm512_set1_epi16((short)(2 * k + 1)));
    for (uint32_t r = 0; r < rows; r++)
        for (uint64_t b = 0; b < n / 256; b++) {
            const uint8_t *block = w + r * row_stride + b * 144;
            uint8_t *p = prep + b * PREP_BLOCK;
            const float d = em_load_fp16(block), dmin = em_load_fp16(block + 2);
            memcpy(p + PREP_D + 4 * r, &d, 4);
            memcpy(p + PREP_DMIN + 4 * r, &dmin, 4);
            const __m128i sm = k_scales_mins(block + 4); /* 8 scales, then 8 mins */
            const __m128i mins16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
            for (int i = 0; i < 4; i++) /* pair i of mins: word 16 i + r */
                memcpy(p + PREP_MINS + 4 * (TILE_ROWS * i + r), (const uint8_t *)&mins16 + 4 * i, 4);
            const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
            const __m512i top = _mm512_srli_epi16(scales, 3), bottom = _mm512_and_si512(scales, _mm512_set1_epi16(7));
            const __m512i q0 = _mm512_loadu_si512((const void *)(block + 16)), q1 = _mm512_loadu_si512((const void *)(block + 80));
            const __m512i l0 = _mm512_and_si512(q0, low4), h0 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), low4);
            const __m512i l1 = _mm512_and_si512(q1, low4), h1 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), low4);
            const __m512i levels[4] = {
                _mm512_shuffle_i64x2(l0, h0, 0x44), /* runs 0 low, 0 high: sub-blocks 0, 1 */
                _mm512_shuffle_i64x2(l0, h0, 0xee), /* sub-blocks 2, 3 */
                _mm512_shuffle_i64x2(l1, h1, 0x44),
                _mm512_shuffle_i64x2(l1, h1, 0xee),
            };
            EM_UNROLL(4) for (int k = 0; k < 4; k++) {
                uint8_t *hi = p + 2 * PREP_TILE * k + 64 * r;
                _mm512_storeu_si512((void *)hi, _mm512_mullo_epi16(levels[k], _mm512_permutexvar_epi16(spread[k], top)));
                _mm512_storeu_si512((void *)(hi + PREP_TILE),
                                    _mm512_mullo_epi16(levels[k], _mm512_permutexvar_epi16(spread[k], bottom)));
            }
        }
}

/* A product rounded to f32 on its own: kept from being fused with the add or subtract after it,
 * as em_dot_scalar's steps are separate roundings. */
#define SEPARATE(v) __asm__("" : "+v"(v))

/* One token tile's f32 steps for one weight block: acc[r] (16 tokens) += d_r d8 * (8 hi + lo) -
 * dmin_r d8 * mins, each step rounded as em_dot_scalar's. */
EM_AMX static EM_INLINE void block_steps(const int32_t *hi, const int32_t *lo, const uint8_t *pack, const uint8_t *prep,
                                         float *acc) {
    const __m512 d8 = _mm512_loadu_ps((const float *)(const void *)(pack + PACK_SCALES));
    __m512i sums[4];
    EM_UNROLL(4) for (int p = 0; p < 4; p++) sums[p] = _mm512_loadu_si512((const void *)(pack + PACK_SUMS + 64 * p));
    const float *d = (const float *)(const void *)(prep + PREP_D), *dmin = (const float *)(const void *)(prep + PREP_DMIN);
    const int32_t *mins16 = (const int32_t *)(const void *)(prep + PREP_MINS);
    EM_UNROLL(4) for (int r = 0; r < TILE_ROWS; r++) {
        const __m512i scaled = _mm512_add_epi32(_mm512_slli_epi32(_mm512_loadu_si512((const void *)(hi + 16 * r)), 3),
                                                _mm512_loadu_si512((const void *)(lo + 16 * r)));
        __m512i mins = _mm512_setzero_si512();
        EM_UNROLL(4) for (int p = 0; p < 4; p++)
            mins = _mm512_dpwssd_epi32(mins, _mm512_set1_epi32(mins16[TILE_ROWS * p + r]), sums[p]);
        __m512 first = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d[r]), d8), _mm512_cvtepi32_ps(scaled));
        __m512 second = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(dmin[r]), d8), _mm512_cvtepi32_ps(mins));
        SEPARATE(first);
        SEPARATE(second);
        __m512 step = _mm512_sub_ps(first, second);
        SEPARATE(step);
        _mm512_storeu_ps(acc + 16 * r, _mm512_add_ps(_mm512_loadu_ps(acc + 16 * r), step));
    }
}

/* Zeroes the result tiles and multiplies one weight block of the chunk (hi and lo) by one block of
 * a token tile (and of the next tile, when `two`): tiles 0, 1 (and 2, 3). */
EM_AMX static EM_INLINE void multiply_block(const uint8_t *p, const uint8_t *t0, const uint8_t *t1, bool two) {
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int k = 0; k < 4; k++) {
        _tile_loadd(4, p + 2 * PREP_TILE * k, 64);
        _tile_loadd(5, p + 2 * PREP_TILE * k + PREP_TILE, 64);
        _tile_loadd(6, t0 + PACK_LEVELS + 1024 * k, 64);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 5, 6);
        if (two) {
            _tile_loadd(7, t1 + PACK_LEVELS + 1024 * k, 64);
            _tile_dpbusd(2, 4, 7);
            _tile_dpbusd(3, 5, 7);
        }
    }
}

/* The chunk's 16 rows against a token tile (and the next one when `two`), every block, into acc
 * (and acc + TILE_ROWS * TILE_TOKENS). The tile unit works on block b + 1 while the f32 steps of
 * block b run: its instructions are issued before them. */
EM_AMX static EM_INLINE void sweep(const uint8_t *prep, const uint8_t *tiles, uint64_t tile_bytes, bool two,
                                   uint64_t n_blocks, float *acc) {
    int32_t results[4][TILE_ROWS * TILE_TOKENS];
    multiply_block(prep, tiles, tiles + tile_bytes, two);
    for (uint64_t b = 0; b < n_blocks; b++) {
        const uint8_t *t0 = tiles + b * PACK_BLOCK;
        _tile_stored(0, results[0], 64);
        _tile_stored(1, results[1], 64);
        if (two) {
            _tile_stored(2, results[2], 64);
            _tile_stored(3, results[3], 64);
        }
        if (b + 1 < n_blocks)
            multiply_block(prep + (b + 1) * PREP_BLOCK, t0 + PACK_BLOCK, t0 + PACK_BLOCK + tile_bytes, two);
        block_steps(results[0], results[1], t0, prep + b * PREP_BLOCK, acc);
        if (two) block_steps(results[2], results[3], t0 + tile_bytes, prep + b * PREP_BLOCK, acc + TILE_ROWS * TILE_TOKENS);
    }
}

/* A product's work buffers: a chunk's weights laid out (prep_bytes) and the sums of every token
 * tile for the chunk's 16 rows. */
static em_err work_buffers(uint64_t prep_bytes, uint32_t n_tiles, uint64_t n, uint8_t **prep, float **acc) {
    *prep = malloc(prep_bytes);
    *acc = malloc((uint64_t)n_tiles * TILE_ROWS * TILE_TOKENS * sizeof **acc);
    if (*prep && *acc) return NULL;
    free(*prep);
    free(*acc);
    return em_errorf(EM_ERR_NOMEM, "amx product: no memory for %llu columns of 16 weight rows and %u token tiles",
                     (unsigned long long)n, n_tiles);
}

/* A chunk's results: token t's for the chunk's rows lie 16 floats apart in its tile's sums. */
EM_AMX static void write_results(const float *acc, uint32_t n_tokens, uint32_t rows, float *y, uint64_t y_stride) {
    const __m512i down = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(TILE_TOKENS));
    const __mmask16 keep = (__mmask16)((1u << rows) - 1);
    for (uint32_t t = 0; t < n_tokens; t++) {
        const float *tile_acc = acc + (uint64_t)(t / TILE_TOKENS) * TILE_ROWS * TILE_TOKENS + t % TILE_TOKENS;
        _mm512_mask_storeu_ps(y + t * y_stride, keep, _mm512_i32gather_ps(down, tile_acc, 4));
    }
}


/* Q8_0: the chunk's rows as 16 x 32 tiles per block (zeros past `rows`) and their f32 scales. */
EM_AMX static void prepare_chunk_q8_0(const uint8_t *w, uint64_t row_stride, uint32_t rows, uint64_t n, uint8_t *prep) {
    if (rows < TILE_ROWS) memset(prep, 0, n / 32 * Q8_PREP_BLOCK);
    for (uint32_t r = 0; r < rows; r++)
        for (uint64_t b = 0; b < n / 32; b++) {
            const uint8_t *block = w + r * row_stride + b * 34;
            uint8_t *p = prep + b * Q8_PREP_BLOCK;
            const float d = em_load_fp16(block);
            memcpy(p + Q8_PREP_D + 4 * r, &d, 4);
            memcpy(p + Q8_PREP_LEVELS + 32 * r, block + 2, 32);
        }
}

/* em_dot_scalar's Q8_0 steps for one block of a token tile: acc[r] += (d_r * d_t) * isum. */
EM_AMX static EM_INLINE void block_steps_q8_0(const int32_t *isums, const uint8_t *pack, const uint8_t *prep,
                                              float *acc) {
    const __m512 da = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(pack + Q8_PACK_SCALES)));
    const float *dw = (const float *)(const void *)(prep + Q8_PREP_D);
    EM_UNROLL(4) for (int r = 0; r < TILE_ROWS; r++) {
        __m512 step = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(dw[r]), da),
                                    _mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(isums + 16 * r))));
        SEPARATE(step);
        _mm512_storeu_ps(acc + 16 * r, _mm512_add_ps(_mm512_loadu_ps(acc + 16 * r), step));
    }
}

EM_AMX static EM_INLINE void multiply_block_q8_0(const uint8_t *p, const uint8_t *t0, const uint8_t *t1, bool two) {
    _tile_zero(0);
    _tile_loadd(4, p + Q8_PREP_LEVELS, 32);
    _tile_loadd(6, t0 + Q8_PACK_LEVELS, 64);
    _tile_dpbssd(0, 4, 6);
    if (two) {
        _tile_zero(1);
        _tile_loadd(7, t1 + Q8_PACK_LEVELS, 64);
        _tile_dpbssd(1, 4, 7);
    }
}

/* Q8_0's sweep: the chunk's 16 rows against a token tile (and the next one when `two`), every
 * block, into acc (and acc + TILE_ROWS * TILE_TOKENS), the next block multiplied before the f32
 * steps of the current one, as in sweep. */
EM_AMX static EM_INLINE void sweep_q8_0(const uint8_t *prep, const uint8_t *tiles, uint64_t tile_bytes, bool two,
                                        uint64_t n_blocks, float *acc) {
    int32_t results[2][TILE_ROWS * TILE_TOKENS];
    multiply_block_q8_0(prep, tiles, tiles + tile_bytes, two);
    for (uint64_t b = 0; b < n_blocks; b++) {
        const uint8_t *p = prep + b * Q8_PREP_BLOCK, *t = tiles + b * Q8_PACK_BLOCK;
        _tile_stored(0, results[0], 64);
        if (two) _tile_stored(1, results[1], 64);
        if (b + 1 < n_blocks) multiply_block_q8_0(p + Q8_PREP_BLOCK, t + Q8_PACK_BLOCK, t + Q8_PACK_BLOCK + tile_bytes, two);
        block_steps_q8_0(results[0], t, p, acc);
        if (two) block_steps_q8_0(results[1], t + tile_bytes, p, acc + TILE_ROWS * TILE_TOKENS);
    }
}

/* Every chunk of 16 weight rows laid out once and swept over the token tiles two at a time. */
EM_AMX static em_err product_amx(uint32_t weight_type, const void *weight_rows, uint64_t row_stride, uint32_t n_rows,
                                 const void *tiles, uint32_t n_tokens, uint64_t n, float *y, uint64_t y_stride) {
    const bool q8_0 = weight_type == EM_TYPE_Q8_0;
    const uint64_t n_blocks = q8_0 ? n / 32 : n / 256, tile_bytes = em_amx_tile_bytes(weight_type, n);
    const uint32_t n_tiles = (n_tokens + TILE_TOKENS - 1) / TILE_TOKENS;
    uint8_t *prep;
    float *acc;
    em_err err = work_buffers(n_blocks * (q8_0 ? Q8_PREP_BLOCK : PREP_BLOCK), n_tiles, n, &prep, &acc);
    if (err) return err;
    configure_tiles(weight_type);
    for (uint32_t first = 0; first < n_rows; first += TILE_ROWS) {
        const uint32_t rows = n_rows - first < TILE_ROWS ? n_rows - first : TILE_ROWS;
        const uint8_t *w = (const uint8_t *)weight_rows + first * row_stride;
        if (q8_0) prepare_chunk_q8_0(w, row_stride, rows, n, prep);
        else prepare_chunk(w, row_stride, rows, n, prep);
        memset(acc, 0, (uint64_t)n_tiles * TILE_ROWS * TILE_TOKENS * sizeof *acc);
        for (uint32_t tile = 0; tile < n_tiles; tile += 2) {
            const uint8_t *t = (const uint8_t *)tiles + tile * tile_bytes;
            float *tile_acc = acc + (uint64_t)tile * TILE_ROWS * TILE_TOKENS;
            if (q8_0) sweep_q8_0(prep, t, tile_bytes, tile + 1 < n_tiles, n_blocks, tile_acc);
            else sweep(prep, t, tile_bytes, tile + 1 < n_tiles, n_blocks, tile_acc);
        }
        write_results(acc, n_tokens, rows, y + first, y_stride);
    }
    _tile_release();
    free(prep);
    free(acc);
    return NULL;
}

em_err em_amx_product(uint32_t weight_type, const void *weight_rows, uint64_t row_stride, uint32_t n_rows,
                      const void *tiles, uint32_t n_tokens, uint64_t n, float *y, uint64_t y_stride) {
    if (em_amx_available())
        return product_amx(weight_type, weight_rows, row_stride, n_rows, tiles, n_tokens, n, y, y_stride);
    product_plain(weight_type, weight_rows, row_stride, n_rows, tiles, n_tokens, n, y, y_stride);
    return NULL;
}

#else

bool em_amx_available(void) { return false; }

em_err em_amx_product(uint32_t weight_type, const void *weight_rows, uint64_t row_stride, uint32_t n_rows,
                      const void *tiles, uint32_t n_tokens, uint64_t n, float *y, uint64_t y_stride) {
    product_plain(weight_type, weight_rows, row_stride, n_rows, tiles, n_tokens, n, y, y_stride);
    return NULL;
}

#endif
