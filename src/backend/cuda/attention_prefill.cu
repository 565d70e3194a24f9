/* Attention of prefill segments on tensor cores (flash attention), over the paged f16 KV cache.
 *
 * A prefill segment (cuda_batch: a run of tokens of one sequence at consecutive positions) is cut
 * into tiles of T tokens; one block takes one tile and one KV head, with every query head of that
 * KV head (GQA), so each key and value tile is read from the cache once for all of them. The
 * block's 16 * warps rows are (token, head) pairs, token-major: row r is token r / group, query
 * head kvh * group + r % group, and T = rows / group. Each warp owns 16 rows.
 *
 * The block walks the visible positions, from the first one the window lets its first token see
 * to its last token's position, in tiles of keys_per_tile(head_dim) positions: the tile's keys
 * and values go to shared memory through the sequence's block table (cp.async, double-buffered:
 * the next tile loads while this one is computed; positions past the end are zero-filled). Per
 * tile:
 *  - S = Q K^T with mma.sync m16n8k16 (f16 in, f32 accumulate); Q is the f32 q buffer scaled by
 *    the layer's scale times log2(e) and rounded to f16 once, kept in registers as A fragments
 *    or, where registers are short (q_in_shared), in shared memory, read with ldmatrix;
 *  - the soft-cap, then the causal and window masks by each row's own position (only on tiles
 *    that cross the diagonal or the window's edge);
 *  - the online softmax in f32, in base 2 (the scores carry log2(e) from Q), its row maxima and
 *    sums as trees; the outputs are rescaled only in tiles where a row's maximum grew;
 *  - O += P V, P split into two f16 parts (hi + lo, see below) straight from the S
 *    accumulators (their layout is the A fragment's), V fragments from ldmatrix.trans.
 * Shared rows are padded by 8 halves, so the 8 row addresses of an ldmatrix fall in distinct
 * banks. The output rows are written in the decode-style kernel's layout.
 *
 * A few tiles over a long context (a follow-up turn: tens of new tokens after thousands cached)
 * would leave most multiprocessors idle, each block walking the whole context alone. Such launches
 * split the visible positions over gridDim.z blocks (as decode attention splits its context): each
 * block walks its share of the key tiles and leaves its unnormalized outputs with their row maxima
 * and sums (pf_part); merge_kernel then weighs the splits' results by 2^(max - overall max), sums
 * them in split order, and writes the normalized rows, so a result does not depend on timing. */
#include <math.h>

#include "internal.cuh"

/* Key positions per tile: 64, or 32 for head_dim 256 (registers and shared memory). */
__host__ __device__ constexpr int keys_per_tile(int head_dim) { return head_dim > 128 ? 32 : 64; }
#define PF_PAD 8 /* halves of padding after each shared row */
/* Q in shared memory instead of registers: head_dim 256, whose outputs leave no room for it, and
 * head_dim 64 at 4 warps, which then fits 4 blocks a multiprocessor (128 registers) instead of 3. */
__host__ __device__ constexpr bool q_in_shared(int head_dim, int warps) {
    return head_dim > 128 || (head_dim == 64 && warps == 4);
}
/* Blocks a multiprocessor the registers must allow (0: as ptxas likes). */
__host__ __device__ constexpr int min_blocks(int head_dim, int warps) {
    return head_dim == 64 && warps == 4 ? 4 : 0;
}
/* Warps per block (16 rows each): 4 for head_dim 64, where more blocks per multiprocessor hide
 * the loads, 8 for head_dim 128 and 256, whose larger tiles want more warps to share them; as
 * measured on an H200 with tests/cuda/check_attention.cu (bench/RESULTS.md, "CUDA kernel
 * choice"). */
static uint32_t default_warps(uint32_t head_dim) { return head_dim >= 128 ? 8 : 4; }
#define PF_MAX_GROUP 64 /* query heads per KV head: a tile holds at least one token */

typedef struct prefill_args {
    const float *q;
    float *out;
    const __half *keys, *values;
    uint32_t n_head, n_head_kv, group, tile_tokens;
    float scale, softcap; /* the layer's, times log2(e): scores come out in base-2 units */
    uint32_t window; /* 0 = full */
    const uint32_t *pos, *seq, *table_start, *blocks;
    uint32_t block_tokens;
    const uint32_t *segments; /* (first token, tokens) pairs */
    uint32_t n_segments, n_tiles, n_splits;
    float *part; /* gridDim.z > 1: per block, its rows' unnormalized outputs, then (max, sum) pairs */
} prefill_args;

/* Rows a block of WARPS warps computes, and the floats a block's partial results take. */
__host__ __device__ constexpr uint32_t block_rows(uint32_t warps) { return 16 * warps; }
__host__ __device__ constexpr uint64_t part_floats(uint32_t head_dim, uint32_t warps) {
    return (uint64_t)block_rows(warps) * (head_dim + 2);
}

/* The tile a block with x index `bx` takes: its first token t0 and n_tok tokens (the longest tiles,
 * last in their segment, first, for a shorter tail). */
__device__ __forceinline__ void tile_of(const prefill_args &a, uint32_t bx, uint32_t *t0, uint32_t *n_tok) {
    uint32_t tile = a.n_tiles - 1 - bx, s = 0;
    for (; s < a.n_segments; s++) {
        const uint32_t n = (a.segments[2 * s + 1] + a.tile_tokens - 1) / a.tile_tokens;
        if (tile < n) break;
        tile -= n;
    }
    const uint32_t seg_first = a.segments[2 * s], seg_len = a.segments[2 * s + 1];
    *t0 = seg_first + tile * a.tile_tokens;
    *n_tok = min(a.tile_tokens, seg_len - tile * a.tile_tokens);
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const __half *p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const __half *p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* c += a b for one 16x8 tile: a 16x16 (row), b 16x8 (col), f16 in, f32 accumulate. */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

/* 2^x; results below 2^-126 flush to zero (they weigh nothing beside the row's largest, 1). */
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* The largest (MAX) or the sum of v[0..N), N a power of two, as a tree: log2 N dependent steps
 * instead of N - 1. */
template <int N, bool MAX> __device__ __forceinline__ float tree_reduce(float v[N]) {
#pragma unroll
    for (int w = N / 2; w >= 1; w /= 2)
#pragma unroll
        for (int i = 0; i < w; i++) v[i] = MAX ? fmaxf(v[i], v[i + w]) : v[i] + v[i + w];
    return v[0];
}

/* (x, y) as f16 pairs hi and lo with hi + lo = (x, y) to about 22 bits. */
__device__ __forceinline__ void split_half2(float x, float y, uint32_t &hi, uint32_t &lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 r = __half22float2(h);
    hi = *(const uint32_t *)&h;
    lo = pack_half2(x - r.x, y - r.y);
}

/* Keys and values of positions [first, first + KEYS) into shared rows; positions from `end` on
 * are zeros (so masked scores meet zero values, never stale ones). */
template <int D, int WARPS, int KEYS>
__device__ __forceinline__ void load_tile(const prefill_args &a, const uint32_t *table, uint32_t kvh, uint32_t first,
                                          uint32_t end, __half *ks, __half *vs) {
    constexpr int CHUNKS = D / 8; /* 16-byte pieces per row */
    for (int i = threadIdx.x; i < KEYS * CHUNKS; i += WARPS * 32) {
        const uint32_t key = i / CHUNKS, c = i % CHUNKS, p = first + key;
        const bool valid = p < end;
        uint64_t off = 0;
        if (valid) {
            const uint64_t row = (uint64_t)table[p / a.block_tokens] * a.block_tokens + p % a.block_tokens;
            off = (row * a.n_head_kv + kvh) * D + 8 * c;
        }
        cp_async16(ks + key * (D + PF_PAD) + 8 * c, a.keys + off, valid);
        cp_async16(vs + key * (D + PF_PAD) + 8 * c, a.values + off, valid);
    }
}

template <int D, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, min_blocks(D, WARPS)) prefill_kernel(prefill_args a) {
    extern __shared__ __align__(16) __half smem[];
    constexpr int KEYS = keys_per_tile(D), ROW = D + PF_PAD, TILE = KEYS * ROW;
    constexpr bool Q_SHARED = q_in_shared(D, WARPS);
    /* [queries: 16 * WARPS rows, with Q_SHARED] then buffer i: keys at kv + 2 i TILE, values after */
    __half *const qs = smem, *const kv = smem + (Q_SHARED ? 16 * WARPS * ROW : 0);
    em_pdl_wait();
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const uint32_t kvh = blockIdx.y;
    uint32_t t0, n_tok;
    tile_of(a, blockIdx.x, &t0, &n_tok);
    const uint32_t pos0 = a.pos[t0], pos_last = pos0 + n_tok - 1;
    const uint32_t *table = a.blocks + a.table_start[a.seq[t0]];
    const uint32_t lo_all = a.window && pos0 + 1 > a.window ? pos0 + 1 - a.window : 0, hi = pos_last + 1;
    /* this block's share of the key tiles (all of them without a split) */
    const uint32_t all_tiles = (hi - lo_all + KEYS - 1) / KEYS;
    const uint32_t kt_first = all_tiles * blockIdx.z / gridDim.z, kt_end = all_tiles * (blockIdx.z + 1) / gridDim.z;
    const uint32_t lo = lo_all + kt_first * KEYS, n_key_tiles = kt_end - kt_first;

    /* Row r of the tile is (token, query head) row q_row(r) of the q and output buffers; rows
     * past the tile's tokens repeat its last token (computed, not written). This thread's rows
     * are g and g + 8 of its warp. */
    const auto q_row = [&](uint32_t r) -> uint64_t {
        return (uint64_t)(t0 + min(r / a.group, n_tok - 1)) * a.n_head + kvh * a.group + r % a.group;
    };
    uint32_t row_pos[2];
    for (int i = 0; i < 2; i++) row_pos[i] = pos0 + min((16 * warp + g + 8 * i) / a.group, n_tok - 1);
    uint32_t qf[Q_SHARED ? 1 : D / 16][4];
    if constexpr (Q_SHARED) {
        /* each warp its own 16 rows; read back by the same warp after the loop's first barrier */
        for (uint32_t i = lane; i < 16 * D / 2; i += 32) {
            const uint32_t r = 16 * warp + i / (D / 2), c = i % (D / 2);
            const float2 x = *(const float2 *)(a.q + q_row(r) * D + 2 * c);
            *(uint32_t *)(qs + r * ROW + 2 * c) = pack_half2(x.x * a.scale, x.y * a.scale);
        }
    } else {
        const float *q0 = a.q + q_row(16 * warp + g) * D, *q1 = a.q + q_row(16 * warp + g + 8) * D;
#pragma unroll
        for (int k = 0; k < D / 16; k++) {
            const float2 x0 = *(const float2 *)(q0 + 16 * k + 2 * tq), x1 = *(const float2 *)(q1 + 16 * k + 2 * tq);
            const float2 y0 = *(const float2 *)(q0 + 16 * k + 8 + 2 * tq),
                         y1 = *(const float2 *)(q1 + 16 * k + 8 + 2 * tq);
            qf[k][0] = pack_half2(x0.x * a.scale, x0.y * a.scale);
            qf[k][1] = pack_half2(x1.x * a.scale, x1.y * a.scale);
            qf[k][2] = pack_half2(y0.x * a.scale, y0.y * a.scale);
            qf[k][3] = pack_half2(y1.x * a.scale, y1.y * a.scale);
        }
    }
    float o[D / 8][4];
#pragma unroll
    for (int d = 0; d < D / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    if (n_key_tiles) load_tile<D, WARPS, KEYS>(a, table, kvh, lo, hi, kv, kv + TILE);
    cp_async_commit();
    for (uint32_t kt = 0; kt < n_key_tiles; kt++) {
        const uint32_t first = lo + kt * KEYS;
        if (kt + 1 < n_key_tiles) {
            __half *next = kv + 2 * TILE * ((kt + 1) & 1);
            load_tile<D, WARPS, KEYS>(a, table, kvh, first + KEYS, hi, next, next + TILE);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __half *ks = kv + 2 * TILE * (kt & 1), *vs = ks + TILE;

        float sc[KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < KEYS / 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int k = 0; k < D / 32; k++) { /* two steps of 16 dimensions */
            uint32_t qa[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if constexpr (Q_SHARED)
                    ldmatrix_x4(qa[j], qs + (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * ROW + 32 * k + 16 * j +
                                           8 * (lane >> 4));
                else
                    qa[j][0] = qf[2 * k + j][0], qa[j][1] = qf[2 * k + j][1], qa[j][2] = qf[2 * k + j][2],
                    qa[j][3] = qf[2 * k + j][3];
            }
#pragma unroll
            for (int n = 0; n < KEYS / 8; n++) {
                uint32_t b[4];
                ldmatrix_x4(b, ks + (8 * n + (lane & 7)) * ROW + 32 * k + 8 * (lane >> 3));
                mma16816(sc[n], qa[0], b[0], b[1]);
                mma16816(sc[n], qa[1], b[2], b[3]);
            }
        }
        /* Scores are in base-2 units already (Q carries log2(e)). Masks are needed where the
         * tile reaches past the first row's position or, with a window, starts at or before the
         * last row's window edge. */
        const bool masked = first + KEYS - 1 > pos0 || (a.window && first + a.window <= pos_last);
        if (a.softcap > 0.0f || masked) {
#pragma unroll
            for (int n = 0; n < KEYS / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = sc[n][e];
                    if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
                    if (masked) {
                        const uint32_t p = first + 8 * n + 2 * tq + (e & 1), rp = row_pos[e >> 1];
                        if (p > rp || (a.window && p + a.window <= rp)) x = -INFINITY;
                    }
                    sc[n][e] = x;
                }
        }
        float base[2], corr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float t[KEYS / 8];
#pragma unroll
            for (int n = 0; n < KEYS / 8; n++) t[n] = fmaxf(sc[n][2 * i], sc[n][2 * i + 1]);
            float mx = tree_reduce<KEYS / 8, true>(t);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[i], mx);
            base[i] = m_new == -INFINITY ? 0.0f : m_new; /* a row that has seen nothing yet */
            corr[i] = m_new == m[i] ? 1.0f : exp2_ftz(m[i] - base[i]);
            m[i] = m_new;
        }
        /* the outputs are rescaled only when a row's largest score grew (rarely, past the
         * first tiles) */
        if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
            for (int d = 0; d < D / 8; d++) {
                o[d][0] *= corr[0], o[d][1] *= corr[0];
                o[d][2] *= corr[1], o[d][3] *= corr[1];
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float t[KEYS / 8];
#pragma unroll
            for (int n = 0; n < KEYS / 8; n++) {
                sc[n][2 * i] = exp2_ftz(sc[n][2 * i] - base[i]);
                sc[n][2 * i + 1] = exp2_ftz(sc[n][2 * i + 1] - base[i]);
                t[n] = sc[n][2 * i] + sc[n][2 * i + 1];
            }
            l[i] = l[i] * corr[i] + tree_reduce<KEYS / 8, false>(t);
        }
        /* P goes to the tensor cores as two f16 parts, hi + lo (about 22 bits together): P
         * rounded once to f16 moved outputs enough to flip a near-tied expert choice further on
         * (tiny-qwen3moe bf16 in tests/cuda/run.sh, reproduced by rounding P on the CPU). The
         * S accumulators' layout is the A fragment's: keys 16k.. are S tiles 2k and 2k + 1. */
#pragma unroll
        for (int k = 0; k < KEYS / 16; k++) {
            uint32_t p_hi[4], p_lo[4];
            split_half2(sc[2 * k][0], sc[2 * k][1], p_hi[0], p_lo[0]);
            split_half2(sc[2 * k][2], sc[2 * k][3], p_hi[1], p_lo[1]);
            split_half2(sc[2 * k + 1][0], sc[2 * k + 1][1], p_hi[2], p_lo[2]);
            split_half2(sc[2 * k + 1][2], sc[2 * k + 1][3], p_hi[3], p_lo[3]);
#pragma unroll
            for (int d = 0; d < D / 16; d++) {
                uint32_t b[4];
                const uint32_t key = 16 * k + (lane & 7) + 8 * ((lane >> 3) & 1);
                ldmatrix_x4_trans(b, vs + key * ROW + 16 * d + 8 * (lane >> 4));
                mma16816(o[2 * d], p_hi, b[0], b[1]);
                mma16816(o[2 * d], p_lo, b[0], b[1]);
                mma16816(o[2 * d + 1], p_hi, b[2], b[3]);
                mma16816(o[2 * d + 1], p_lo, b[2], b[3]);
            }
        }
        __syncthreads(); /* the next iteration loads into the buffer just read */
    }
    /* each lane summed its own columns: the row's sum is over the 4 lanes of the row */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    if (gridDim.z > 1) {
        /* a split: the rows unnormalized, with their maxima and sums (a share of positions none of
         * a row sees leaves max -inf, sum 0 and zeros) */
        const uint64_t block = ((uint64_t)blockIdx.z * gridDim.y + kvh) * gridDim.x + blockIdx.x;
        float *const part = a.part + block * part_floats(D, WARPS), *const ml = part + block_rows(WARPS) * D;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t r = 16 * warp + g + 8 * i;
            if (r >= n_tok * a.group) continue;
#pragma unroll
            for (int d = 0; d < D / 8; d++)
                *(float2 *)(part + (uint64_t)r * D + 8 * d + 2 * tq) = make_float2(o[d][2 * i], o[d][2 * i + 1]);
            if (tq == 0) ml[2 * r] = m[i], ml[2 * r + 1] = l[i];
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t r = 16 * warp + g + 8 * i;
        if (r >= n_tok * a.group) continue;
        const float inv = 1.0f / l[i];
        float *out = a.out + q_row(r) * D;
#pragma unroll
        for (int d = 0; d < D / 8; d++)
            *(float2 *)(out + 8 * d + 2 * tq) = make_float2(o[d][2 * i] * inv, o[d][2 * i + 1] * inv);
    }
}

/* The splits' results of one tile and KV head (grid x, y: as the prefill kernel's), merge_rows(D)
 * rows of it a block (grid z), a float4 of a row a thread: each split weighed by 2^(its max - the
 * overall max), in split order. */
#define MERGE_THREADS 128
__host__ __device__ constexpr uint32_t merge_rows(uint32_t head_dim) { return MERGE_THREADS / (head_dim / 4); }
template <int D, int WARPS> __global__ void __launch_bounds__(MERGE_THREADS) merge_kernel(prefill_args a) {
    em_pdl_wait();
    uint32_t t0, n_tok;
    tile_of(a, blockIdx.x, &t0, &n_tok);
    const uint32_t kvh = blockIdx.y, splits = a.n_splits, rows = n_tok * a.group;
    const uint64_t stride = (uint64_t)gridDim.y * gridDim.x * part_floats(D, WARPS); /* from split to split */
    const float *const part = a.part + ((uint64_t)kvh * gridDim.x + blockIdx.x) * part_floats(D, WARPS);
    const float *const ml = part + block_rows(WARPS) * D;
    const uint32_t r = blockIdx.z * merge_rows(D) + threadIdx.x / (D / 4), c = threadIdx.x % (D / 4);
    if (r >= rows) return;
    float mx = -INFINITY;
    for (uint32_t z = 0; z < splits; z++) mx = fmaxf(mx, ml[z * stride + 2 * r]);
    float sum = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (uint32_t z = 0; z < splits; z++) {
        const float w = exp2_ftz(ml[z * stride + 2 * r] - mx);
        const float4 v = *(const float4 *)(part + z * stride + (uint64_t)r * D + 4 * c);
        sum += w * ml[z * stride + 2 * r + 1];
        acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
    }
    const float inv = 1.0f / sum;
    const uint64_t row = (uint64_t)(t0 + r / a.group) * a.n_head + kvh * a.group + r % a.group;
    *(float4 *)(a.out + row * D + 4 * c) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

bool em_cuda_prefill_supported(const cuda_backend *b, const cuda_layer *layer) {
    const em_program_attention *at = &layer->att;
    const uint32_t dim = at->head_dim;
    return b->kv_elem == 2 && at->head_dim_v == dim && (dim == 32 || dim == 64 || dim == 128 || dim == 256) &&
           at->n_head_kv && at->n_head % at->n_head_kv == 0 && at->n_head / at->n_head_kv <= PF_MAX_GROUP;
}

/* Splits of the context for a launch of `blocks` blocks whose longest tile sees up to `positions`
 * positions: enough for about two blocks a multiprocessor, each split at least PF_SPLIT_MIN_TILES
 * key tiles, within the partials' scratch (em_cuda_prefill_part_floats); 1 when the launch fills
 * the GPU already. */
#define PF_SPLIT_MIN_TILES 4
#define PF_SPLIT_MAX 64
static uint32_t splits_for(const cuda_backend *b, uint32_t blocks, uint32_t positions, uint32_t head_dim,
                           uint32_t warps) {
    const uint32_t sms = (uint32_t)b->n_sm, keys = keys_per_tile((int)head_dim);
    if (!b->tuning.prefill_split || !b->pf_part || blocks >= sms) return 1;
    uint32_t n = (2 * sms + blocks - 1) / blocks;
    const uint32_t by_keys = (positions + keys - 1) / keys / PF_SPLIT_MIN_TILES;
    if (n > by_keys) n = by_keys;
    if (n > PF_SPLIT_MAX) n = PF_SPLIT_MAX;
    while (n > 1 && (uint64_t)n * blocks * part_floats(head_dim, warps) > b->pf_part_floats) n--;
    return n > 1 ? n : 1;
}

/* Scratch for the splits' partials: the most blocks splits_for makes (fewer than three a
 * multiprocessor) with the largest rows of the model's head size. */
uint64_t em_cuda_prefill_part_floats(const cuda_backend *b) {
    return 3ull * (uint64_t)b->n_sm * part_floats(b->max_dim_v, 8);
}

template <int D, int WARPS> static em_err launch(cuda_backend *b, prefill_args a, uint32_t positions) {
    static_assert(MERGE_THREADS % (D / 4) == 0, "a merge block takes whole rows");
    const size_t rows = (q_in_shared(D, WARPS) ? 16 * WARPS : 0) + 4 * keys_per_tile(D);
    const size_t smem = rows * (D + PF_PAD) * sizeof(__half);
    CU_TRY(cudaFuncSetAttribute(prefill_kernel<D, WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    a.n_splits = splits_for(b, a.n_tiles * a.n_head_kv, positions, D, WARPS);
    a.part = b->pf_part;
    em_cuda_launch(b, prefill_kernel<D, WARPS>, dim3(a.n_tiles, a.n_head_kv, a.n_splits), WARPS * 32, smem, a);
    CU_LAUNCHED();
    if (a.n_splits > 1) {
        const uint32_t row_blocks = (block_rows(WARPS) + merge_rows(D) - 1) / merge_rows(D);
        em_cuda_launch(b, merge_kernel<D, WARPS>, dim3(a.n_tiles, a.n_head_kv, row_blocks), MERGE_THREADS, 0, a);
        CU_LAUNCHED();
    }
    return NULL;
}

/* `warps`: 4 or 8 per block (0: the default), for measurements. */
em_err em_cuda_prefill_attention_warps(cuda_backend *b, const cuda_batch *batch, uint32_t il, uint32_t warps) {
    const cuda_layer *lw = &b->layers[il];
    const em_program_attention *at = &lw->att;
    if (!em_cuda_prefill_supported(b, lw) || batch->n_segments == 0)
        return em_errorf(EM_ERR_INTERNAL, "prefill attention: unsupported layer or no segment");
    if (warps != 4 && warps != 8) warps = default_warps(at->head_dim);
    prefill_args a = {};
    a.q = b->q, a.out = b->attn, a.keys = (const __half *)lw->keys, a.values = (const __half *)lw->values;
    a.n_head = at->n_head, a.n_head_kv = at->n_head_kv, a.group = at->n_head / at->n_head_kv;
    a.tile_tokens = 16 * warps / a.group;
    const float log2e = 1.4426950408889634f;
    a.scale = at->scale * log2e, a.softcap = at->softcap * log2e;
    a.window = at->window;
    a.pos = batch->pos, a.seq = batch->seq, a.table_start = batch->table_start, a.blocks = batch->blocks;
    a.block_tokens = b->base.block_tokens;
    a.segments = batch->segments, a.n_segments = batch->n_segments;
    for (uint32_t s = 0; s < batch->n_segments; s++)
        a.n_tiles += (batch->segments_host[2 * s + 1] + a.tile_tokens - 1) / a.tile_tokens;
    /* the most positions a tile sees: up to the batch's last, or a window and a tile */
    uint32_t positions = batch->max_pos + 1;
    if (a.window && a.window + a.tile_tokens < positions) positions = a.window + a.tile_tokens;
    switch (at->head_dim * 16 + warps) {
    case 32 * 16 + 4: return launch<32, 4>(b, a, positions);
    case 64 * 16 + 4: return launch<64, 4>(b, a, positions);
    case 128 * 16 + 4: return launch<128, 4>(b, a, positions);
    case 256 * 16 + 4: return launch<256, 4>(b, a, positions);
    case 256 * 16 + 8: return launch<256, 8>(b, a, positions);
    case 32 * 16 + 8: return launch<32, 8>(b, a, positions);
    case 64 * 16 + 8: return launch<64, 8>(b, a, positions);
    default: return launch<128, 8>(b, a, positions);
    }
}

em_err em_cuda_prefill_attention(cuda_backend *b, const cuda_batch *batch, uint32_t il) {
    return em_cuda_prefill_attention_warps(b, batch, il, 0);
}
