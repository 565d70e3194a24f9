/* Attention for decode tokens over the paged f16 KV cache, one block per (KV head, token, split).
 *
 * The block serves every query head of its KV head (GQA), so each key and value row is read once
 * for the whole group. It walks its positions in tiles: all threads copy the tile's key and value
 * rows into shared memory at once (cp.async, 16 bytes each, every copy in flight together), then
 * warp w scores the tile for query heads w and w + 4 (each lane a position: one row of keys, read
 * 16 bytes at a time from rows padded against bank conflicts), updates its running maximum and sum
 * (online softmax) and accumulates the weighted values (each lane a few consecutive dimensions).
 * Fewer dependent memory round trips per block than attention.cu's general kernel, which is what a
 * decode step at small batch waits on. Splits over positions (flash-decoding) keep the GPU busy at
 * batch 1. Up to 4 tokens a (token, KV head)'s splits are one cluster of blocks (at most 8): each
 * leaves its partial result in its shared memory, and after a cluster barrier every block merges
 * its share of the outputs from the others' shared memory (dec_merge). That saves the round trips
 * through global memory of the other way, used for larger batches and as attention.cu does: the
 * partials written out, a fence, a counter, and the last block to finish reading them back.
 *
 * A group of twice as many query heads as the block has warps (8 per KV head, as in moe-30b-a3b)
 * is split over two blocks of DEC_WARPS heads each, which read the same keys and values: one head
 * per warp, and twice the blocks to spread over the GPU at batch 1, where one block serving all
 * the group's heads leaves most multiprocessors idle.
 *
 * In a decode step (each token alone in its sequence) the kernel also does em_cuda_qkv_finish's
 * work, saving that launch: every block finishes (bias, QK-norm, RoPE; qkv.cuh) the query heads it
 * serves from the products' raw output while its first tile of keys and values is in flight, and
 * the blocks whose span holds the token's own position finish its key and value, put them in their
 * tile and write them into the cache.
 *
 * Handles f16 caches, head_dim == head_dim_v in {32, 64, 128, 256} and up to 8 query heads per KV
 * head; em_cuda_attention_decode_fits says so, and attention.cu's kernel takes everything else. */
#include <cooperative_groups.h>
#include <math.h>

#include "qkv.cuh"

namespace cg = cooperative_groups;

#define DEC_WARPS 4
#define DEC_HEADS_PER_WARP 2 /* query heads per KV head: at most DEC_WARPS * this */
#define DEC_MAX_SPLIT 16
#define DEC_CLUSTER_MAX 8 /* splits of a clustered launch: the portable cluster size */
#define DEC_SPAN 1024 /* directly launched batches: at most this many positions per block */

typedef struct dec_args {
    const float *q;
    float *out;
    const __half *keys, *values;
    uint32_t n_head, n_head_kv;
    float scale, softcap;
    uint32_t window; /* 0 = full */
    const uint32_t *pos, *seq, *table_start, *blocks;
    uint32_t block_tokens;
    const uint32_t *tokens; /* grid row -> token of the batch (NULL: the same) */
    uint32_t n_split;
    float *part;       /* [grid row][query head][split][HD + 2]: weighted values, max, sum */
    uint32_t *counter; /* [grid row][n_head] (this kernel uses the first n_head_kv * parts), zero between launches */
    uint32_t parts_log2; /* 2^parts_log2 blocks per KV head, each serving its share of the query heads */
    bool clustered;      /* the splits are one cluster's blocks and merge in shared memory (part, counter unused) */
    /* The fused finish (em_cuda_attention_finishes): q, k_new and v_new are the products' raw
     * outputs; every block finishes its own query heads (qkv.cuh), and the blocks whose span holds
     * the token's position finish its key and value, use them for that position and (the first
     * block of the KV head) write them into the cache, all as em_cuda_qkv_finish would. */
    bool finish;
    const float *k_new, *v_new, *bq, *bk, *bv, *q_norm, *k_norm;
    float eps;
    bool plus_one;
    rope_args rope;
} dec_args;


__device__ __forceinline__ void dec_copy16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

/* Tile of T positions; rows padded by 8 halves (16 bytes) so lanes reading different rows at the
 * same column hit different banks. */
template <int HD> struct dec_shape {
    static constexpr int T = HD <= 128 ? 64 : 32;
    static constexpr int ROW = HD + 8;
    static constexpr int PER_LANE_POS = T / 32; /* positions each lane scores */
    static constexpr int DL = HD / 32;          /* output dimensions each lane owns */
};

/* The merge of a KV head's splits into the outputs of its `group` query heads (out: the first's),
 * in three parallel passes (a loop over splits per output value would wait on one load after
 * another): the splits' maxima and sums, then each split's weight per head, then the weighted
 * partial values, every split's load of a value issued together. part(g, sp, k) is value k of
 * split sp's partial for head g (k = HD: its maximum, HD + 1: its sum). Every thread of the block
 * calls it; this thread writes outputs first, first + step, ... of the group's group * HD. */
template <int HD, typename Part>
__device__ __forceinline__ void dec_merge(uint32_t n_split, uint32_t group, float *out, uint32_t first, uint32_t step,
                                          Part part) {
    __shared__ float split_m[DEC_WARPS * DEC_HEADS_PER_WARP][DEC_MAX_SPLIT];
    __shared__ float split_l[DEC_WARPS * DEC_HEADS_PER_WARP][DEC_MAX_SPLIT];
    for (uint32_t i = threadIdx.x; i < group * n_split; i += blockDim.x) { /* head i / n_split, split i % n_split */
        split_m[i / n_split][i % n_split] = part(i / n_split, i % n_split, HD);
        split_l[i / n_split][i % n_split] = part(i / n_split, i % n_split, HD + 1);
    }
    __syncthreads();
    if (threadIdx.x < group) {
        const uint32_t g = threadIdx.x;
        float gm = -INFINITY, gl = 0.0f;
        for (uint32_t sp = 0; sp < n_split; sp++) gm = fmaxf(gm, split_m[g][sp]);
        for (uint32_t sp = 0; sp < n_split; sp++)
            if (split_m[g][sp] != -INFINITY) gl += split_l[g][sp] * expf(split_m[g][sp] - gm);
        for (uint32_t sp = 0; sp < n_split; sp++)
            split_m[g][sp] = split_m[g][sp] == -INFINITY ? 0.0f : expf(split_m[g][sp] - gm) / gl;
    }
    __syncthreads();
    for (uint32_t i = first; i < group * HD; i += step) {
        const uint32_t g = i / HD, d = i % HD;
        float v[DEC_MAX_SPLIT];
#pragma unroll
        for (int sp = 0; sp < DEC_MAX_SPLIT; sp++) v[sp] = sp < (int)n_split ? part(g, sp, d) : 0.0f;
        float sum = 0.0f;
#pragma unroll
        for (int sp = 0; sp < DEC_MAX_SPLIT; sp++)
            if (sp < (int)n_split) sum += v[sp] * split_m[g][sp];
        out[(uint64_t)g * HD + d] = sum;
    }
}

template <int HD> __global__ void __launch_bounds__(DEC_WARPS * 32, 1) decode_attention_kernel(dec_args a) {
    typedef dec_shape<HD> S;
    __shared__ __align__(16) __half ks[S::T * S::ROW], vs[S::T * S::ROW];
    __shared__ __align__(16) float qs[DEC_WARPS * DEC_HEADS_PER_WARP][HD];
    __shared__ float ps[DEC_WARPS][S::T];
    __shared__ uint32_t rows[S::T];
    __shared__ __align__(16) float k_own[HD], v_own[HD]; /* the fused finish's key and value at pos */
    __shared__ bool last_block;
    em_pdl_wait();
    const uint32_t kvh = blockIdx.x >> a.parts_log2, grid_row = blockIdx.y, split = blockIdx.z;
    const uint32_t t = a.tokens ? a.tokens[grid_row] : grid_row;
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* this block's query heads: head0 .. head0 + group - 1 (its share of the KV head's) */
    const uint32_t group = (a.n_head / a.n_head_kv) >> a.parts_log2, head0 = blockIdx.x * group;
    const uint32_t pos = a.pos[t];
    const uint32_t first = a.window && pos + 1 > a.window ? pos + 1 - a.window : 0;
    const uint32_t per = (pos + 1 - first + a.n_split - 1) / a.n_split;
    const uint32_t lo = first + split * per, hi = min(lo + per, pos + 1);
    const uint32_t *table = a.blocks + a.table_start[a.seq[t]];
    const bool own = a.finish && lo <= pos && pos < hi; /* this block's span holds the token's position */
    constexpr int CHUNKS = HD / 8; /* 16-byte pieces of a row */
    auto cache_row = [&](uint32_t p) { return table[p / a.block_tokens] * a.block_tokens + p % a.block_tokens; };
    /* A tile's cache rows, then its keys and values copied into shared memory, all in flight
     * together (the finished key and value of the token's own position come from k_own, v_own). */
    auto load_tile = [&](uint32_t t0, uint32_t n) {
        for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) rows[j] = cache_row(t0 + j);
        __syncthreads();
        for (uint32_t i = threadIdx.x; i < n * CHUNKS; i += blockDim.x) {
            const uint32_t j = i / CHUNKS, c = i % CHUNKS;
            if (own && t0 + j == pos) continue;
            const uint64_t off = ((uint64_t)rows[j] * a.n_head_kv + kvh) * HD + 8 * c;
            dec_copy16(ks + j * S::ROW + 8 * c, a.keys + off);
            dec_copy16(vs + j * S::ROW + 8 * c, a.values + off);
        }
    };
    /* the first tile's copies go out first: they are in flight while the queries are read (or
     * finished: bias, norm, rotation) */
    if (lo < hi) load_tile(lo, min((uint32_t)S::T, hi - lo));
    if (!a.finish) {
        for (uint32_t i = threadIdx.x; i < group * HD; i += blockDim.x)
            qs[i / HD][i % HD] = a.q[((uint64_t)t * a.n_head + head0 + i / HD) * HD + i % HD];
    } else {
        for (uint32_t g = warp; g < group; g += DEC_WARPS) {
            const uint32_t head = head0 + g;
            qkv_head(qs[g], a.q + ((uint64_t)t * a.n_head + head) * HD, a.bq ? a.bq + head * HD : NULL, a.q_norm, HD,
                     a.eps, a.plus_one, true, pos, a.rope);
        }
        if (own && warp >= DEC_WARPS - 2) { /* the last two warps: the key, the value */
            const bool is_k = warp == DEC_WARPS - 2;
            const float *src = (is_k ? a.k_new : a.v_new) + ((uint64_t)t * a.n_head_kv + kvh) * HD;
            const float *bias = is_k ? a.bk : a.bv;
            qkv_head(is_k ? k_own : v_own, src, bias ? bias + kvh * HD : NULL, is_k ? a.k_norm : NULL, HD, a.eps,
                     a.plus_one, is_k, pos, a.rope);
            if ((blockIdx.x & ((1u << a.parts_log2) - 1)) == 0) {
                __half *dst = (__half *)(is_k ? a.keys : a.values) +
                              ((uint64_t)cache_row(pos) * a.n_head_kv + kvh) * HD;
                for (uint32_t i = lane; i < HD; i += 32) dst[i] = __float2half(is_k ? k_own[i] : v_own[i]);
            }
        }
    }

    float acc[DEC_HEADS_PER_WARP][S::DL], m[DEC_HEADS_PER_WARP], l[DEC_HEADS_PER_WARP];
#pragma unroll
    for (int hh = 0; hh < DEC_HEADS_PER_WARP; hh++) {
        m[hh] = -INFINITY, l[hh] = 0.0f;
#pragma unroll
        for (int i = 0; i < S::DL; i++) acc[hh][i] = 0.0f;
    }
    for (uint32_t t0 = lo; t0 < hi; t0 += S::T) {
        const uint32_t n = min((uint32_t)S::T, hi - t0);
        if (t0 != lo) {
            __syncthreads(); /* the previous tile is consumed */
            load_tile(t0, n);
        }
        if (own && t0 <= pos && pos < t0 + n && warp >= DEC_WARPS - 2) {
            /* the warp that finished the key (value) puts it in its row, rounded as the cache holds it */
            __half *dst = (warp == DEC_WARPS - 2 ? ks : vs) + (pos - t0) * S::ROW;
            const float *src = warp == DEC_WARPS - 2 ? k_own : v_own;
            for (uint32_t i = lane; i < HD; i += 32) dst[i] = __float2half(src[i]);
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();
#pragma unroll
        for (int hh = 0; hh < DEC_HEADS_PER_WARP; hh++) {
            const uint32_t g = warp + DEC_WARPS * hh;
            if (g >= group) break;
            float s[S::PER_LANE_POS];
            float tile_max = -INFINITY;
#pragma unroll
            for (int k = 0; k < S::PER_LANE_POS; k++) {
                const uint32_t j = lane + 32 * k;
                float dot = 0.0f;
                if (j < n) {
                    const __half *kr = ks + j * S::ROW;
#pragma unroll
                    for (int c = 0; c < CHUNKS; c++) {
                        const uint4 u = *(const uint4 *)(kr + 8 * c);
                        const __half2 *h2 = (const __half2 *)&u;
                        const float4 q0 = *(const float4 *)&qs[g][8 * c], q1 = *(const float4 *)&qs[g][8 * c + 4];
                        const float2 f0 = __half22float2(h2[0]), f1 = __half22float2(h2[1]),
                                     f2 = __half22float2(h2[2]), f3 = __half22float2(h2[3]);
                        dot += q0.x * f0.x + q0.y * f0.y + q0.z * f1.x + q0.w * f1.y + q1.x * f2.x + q1.y * f2.y +
                               q1.z * f3.x + q1.w * f3.y;
                    }
                    float sc = dot * a.scale;
                    if (a.softcap > 0.0f) sc = a.softcap * tanhf(sc / a.softcap);
                    s[k] = sc;
                } else {
                    s[k] = -INFINITY;
                }
                tile_max = fmaxf(tile_max, s[k]);
            }
            const float m_new = fmaxf(m[hh], em_warp_max(tile_max));
            const float corr = expf(m[hh] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < S::PER_LANE_POS; k++) {
                const float w = lane + 32 * k < n ? expf(s[k] - m_new) : 0.0f;
                ps[warp][lane + 32 * k] = w;
                sum += w;
            }
            l[hh] = l[hh] * corr + em_warp_sum(sum);
            m[hh] = m_new;
            __syncwarp();
#pragma unroll
            for (int i = 0; i < S::DL; i++) acc[hh][i] *= corr;
            for (uint32_t j = 0; j < n; j++) {
                const float w = ps[warp][j];
                const __half *vr = vs + j * S::ROW + S::DL * lane;
                if (S::DL == 1) {
                    acc[hh][0] += w * __half2float(vr[0]);
                } else {
#pragma unroll
                    for (int i = 0; i + 1 < S::DL; i += 2) {
                        const float2 f = __half22float2(*(const __half2 *)(vr + i));
                        acc[hh][i] += w * f.x;
                        acc[hh][i + 1] += w * f.y;
                    }
                }
            }
            __syncwarp();
        }
    }
    /* results: the output itself with one split, else this split's partial and the merge */
    const uint32_t stride = HD + 2;
    float *cluster_part = (float *)ks; /* clustered: this split's partials, [query head][HD + 2] */
    if (a.clustered) __syncthreads();  /* every warp is done with the keys */
#pragma unroll
    for (int hh = 0; hh < DEC_HEADS_PER_WARP; hh++) {
        const uint32_t g = warp + DEC_WARPS * hh;
        if (g >= group) break;
        const uint64_t head = head0 + g;
        if (a.n_split == 1) {
            float *o = a.out + ((uint64_t)t * a.n_head + head) * HD + S::DL * lane;
#pragma unroll
            for (int i = 0; i < S::DL; i++) o[i] = acc[hh][i] / l[hh];
        } else {
            float *mine = a.clustered ? cluster_part + g * stride
                                      : a.part + (((uint64_t)grid_row * a.n_head + head) * a.n_split + split) * stride;
#pragma unroll
            for (int i = 0; i < S::DL; i++) mine[S::DL * lane + i] = acc[hh][i];
            if (lane == 0) mine[HD] = m[hh], mine[HD + 1] = l[hh];
        }
    }
    if (a.n_split == 1) return;
    float *out = a.out + ((uint64_t)t * a.n_head + head0) * HD;
    if (a.clustered) {
        /* the splits are the cluster's blocks (rank = split): each reads the others' partials from
         * their shared memory and writes its share of the outputs; none leaves before all have read */
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();
        auto peer_part = [&](uint32_t g, uint32_t sp, uint32_t k) {
            return cluster.map_shared_rank(cluster_part, sp)[g * stride + k];
        };
        dec_merge<HD>(a.n_split, group, out, split * blockDim.x + threadIdx.x, a.n_split * blockDim.x, peer_part);
        cluster.sync();
        return;
    }
    /* make this block's partials visible before counting it; the last block to count merges */
    __threadfence();
    __syncthreads();
    const uint64_t group_pair = (uint64_t)grid_row * a.n_head + blockIdx.x;
    if (threadIdx.x == 0) last_block = atomicAdd(&a.counter[group_pair], 1u) == a.n_split - 1;
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    const float *group_parts = a.part + ((uint64_t)grid_row * a.n_head + head0) * a.n_split * stride;
    dec_merge<HD>(a.n_split, group, out, threadIdx.x, blockDim.x, [&](uint32_t g, uint32_t sp, uint32_t k) {
        return __ldcg(group_parts + ((uint64_t)g * a.n_split + sp) * stride + k);
    });
    if (threadIdx.x == 0) a.counter[group_pair] = 0;
}

bool em_cuda_attention_decode_fits(const cuda_backend *b, uint32_t il) {
    const em_program_attention *at = &b->layers[il].att;
    const uint32_t hd = at->head_dim;
    return b->kv_elem == 2 && hd == at->head_dim_v && (hd == 32 || hd == 64 || hd == 128 || hd == 256) &&
           at->n_head % at->n_head_kv == 0 && at->n_head / at->n_head_kv <= DEC_WARPS * DEC_HEADS_PER_WARP;
}

bool em_cuda_attention_finishes(const cuda_backend *b, const cuda_batch *batch, uint32_t il) {
    return b->tuning.fuse_finish && batch->one_per_seq && batch->n_segments == 0 &&
           em_cuda_attention_decode_fits(b, il);
}

/* Splits per (token, KV head): enough blocks to cover the GPU twice; for batches launched directly
 * (not replayed from a graph, so the longest context is known) also enough that no block walks
 * more than DEC_SPAN positions; never more than `most` (DEC_MAX_SPLIT, or a cluster's
 * DEC_CLUSTER_MAX) nor than the scratch holds (partials are per query head). */
static uint32_t dec_splits(const cuda_backend *b, uint32_t n_tokens, uint32_t max_pos, const em_program_attention *at,
                           uint32_t parts, uint32_t most) {
    const uint64_t blocks = (uint64_t)n_tokens * at->n_head_kv * parts, heads = (uint64_t)n_tokens * at->n_head;
    uint64_t s = (2 * (uint64_t)b->n_sm + blocks - 1) / blocks;
    if (!b->capturing) {
        const uint64_t by_len = ((uint64_t)max_pos + DEC_SPAN) / DEC_SPAN;
        if (by_len > s) s = by_len;
    }
    if (s > most) s = most;
    const uint64_t slots = min(b->att_slots, em_cuda_att_slots(b, n_tokens)); /* the batch's own, not the capacity */
    while (s > 1 && heads * s > slots) s--;
    return s ? (uint32_t)s : 1;
}

em_err em_cuda_attention_decode(cuda_backend *b, const cuda_batch *batch, uint32_t il, const uint32_t *tokens,
                                uint32_t n_tokens, uint32_t max_pos) {
    if (n_tokens == 0) return NULL;
    const em_program_attention *at = &b->layers[il].att;
    const cuda_layer *lw = &b->layers[il];
    /* one query head per warp where the group allows (fits: at most DEC_WARPS * DEC_HEADS_PER_WARP) */
    const uint32_t group = at->n_head / at->n_head_kv;
    const uint32_t parts_log2 = group == 2 * DEC_WARPS ? 1 : 0, parts = 1u << parts_log2;
    /* each token's splits as one cluster up to dec_cluster_max tokens (EMBER_CUDA_DEC_CLUSTER): the
     * merge in the cluster's shared memory saves a pass through global memory, which pays while
     * the splits of few tokens are what fills the device, and costs more than it saves once many
     * tokens' blocks compete for the multiprocessors (bench/RESULTS.md, "CUDA kernel choice") */
    const bool clusters = n_tokens <= b->tuning.dec_cluster_max;
    dec_args a = {b->q, b->attn, (const __half *)lw->keys, (const __half *)lw->values, at->n_head, at->n_head_kv,
                  at->scale, at->softcap, at->window, batch->pos,
                  batch->seq, batch->table_start, batch->blocks, b->base.block_tokens, tokens,
                  dec_splits(b, n_tokens, max_pos, at, parts, clusters ? DEC_CLUSTER_MAX : DEC_MAX_SPLIT), b->att_part,
                  b->att_counter, parts_log2};
    a.clustered = clusters && a.n_split > 1;
    if (!tokens && em_cuda_attention_finishes(b, batch, il)) {
        a.finish = true;
        a.k_new = b->k, a.v_new = b->v, a.bq = lw->bq, a.bk = lw->bk, a.bv = lw->bv;
        a.q_norm = lw->q_norm, a.k_norm = lw->k_norm, a.eps = b->step.eps;
        a.plus_one = b->step.plus_one, a.rope = em_cuda_rope_args(b, il);
    }
    const dim3 grid(at->n_head_kv * parts, n_tokens, a.n_split);
    const uint32_t cluster_z = a.clustered ? a.n_split : 1;
    switch (at->head_dim) {
    case 32: em_cuda_launch_clusters(b, decode_attention_kernel<32>, grid, DEC_WARPS * 32, 0, cluster_z, a); break;
    case 64: em_cuda_launch_clusters(b, decode_attention_kernel<64>, grid, DEC_WARPS * 32, 0, cluster_z, a); break;
    case 128: em_cuda_launch_clusters(b, decode_attention_kernel<128>, grid, DEC_WARPS * 32, 0, cluster_z, a); break;
    case 256: em_cuda_launch_clusters(b, decode_attention_kernel<256>, grid, DEC_WARPS * 32, 0, cluster_z, a); break;
    default: return em_errorf(EM_ERR_INTERNAL, "cuda decode attention: head_dim %u", at->head_dim);
    }
    CU_LAUNCHED();
    return NULL;
}
