/* Attention over the paged KV cache: the dispatch (em_cuda_attention_with) and the general
 * decode-style kernel. Prefill segments go to the tensor-core kernel (attention_prefill.cu), the
 * other tokens to the grouped decode kernel (attention_decode.cu) when the layer fits it (f16
 * cache, head sizes), and to this file's kernel otherwise (the f32 cache, other head sizes).
 *
 * One block per (query head, token, split): the visible positions of a token are cut into
 * n_split ranges, one per block, so that a decode step at batch 1 (one token, a few dozen heads)
 * still spreads over the whole GPU (flash-decoding). Inside a block, the warps take chunks of 32
 * positions (warp w takes chunks w, w + warps, ...): each lane scores one position (its key row is
 * one contiguous run of head_dim values, read 16 bytes at a time), the warp updates a running
 * maximum and sum (online softmax), and the lanes, each owning head_dim_v / 32 output dimensions,
 * accumulate the chunk's values. The warps' results are merged through shared memory. With one
 * split the block writes the output; with several, each block writes its (max, sum, weighted
 * values) to scratch and the last block of the (head, token) to finish (an atomic count, reset by
 * that block for the next launch) merges them.
 * When the prefill kernel takes the batch's segments, the grid's rows are the other tokens, from a
 * token list (cuda_batch.other_tokens); otherwise row y is token y.
 * GQA: query head h reads KV head h / (n_head / n_head_kv). Sliding windows and the score
 * soft-cap are applied as in the CPU reference. */
#include <math.h>

#include "internal.cuh"

#define ATT_WARPS 4
#define ATT_MAX_DIM 256

typedef struct att_args {
    const float *q;
    float *out;
    const void *keys, *values;
    uint32_t n_head, n_head_kv, head_dim, head_dim_v;
    float scale, softcap;
    uint32_t window; /* 0 = full */
    const uint32_t *pos, *seq, *table_start, *blocks;
    uint32_t block_tokens;
    uint32_t n_split;
    const uint32_t *tokens; /* blockIdx.y's token; NULL: token blockIdx.y */
    float *part;       /* [grid row][head][split][head_dim_v + 2]: weighted values, max, sum */
    uint32_t *counter; /* [grid row][head], zero between launches */
} att_args;

/* 8 cached values from a 16-byte (f16) or 32-byte (f32) aligned address. */
__device__ __forceinline__ void load8(const __half *p, float out[8]) {
    uint4 u = *(const uint4 *)p;
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        float2 f = __half22float2(h[c]);
        out[2 * c] = f.x, out[2 * c + 1] = f.y;
    }
}
__device__ __forceinline__ void load8(const float *p, float out[8]) {
    float4 a = ((const float4 *)p)[0], c = ((const float4 *)p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = c.x, out[5] = c.y, out[6] = c.z, out[7] = c.w;
}

template <typename KV> __global__ void __launch_bounds__(ATT_WARPS * 32) attention_kernel(att_args a) {
    __shared__ __align__(16) float qs[ATT_MAX_DIM];
    __shared__ float part_acc[ATT_WARPS][ATT_MAX_DIM];
    __shared__ float part_m[ATT_WARPS], part_l[ATT_WARPS];
    __shared__ bool last_block;
    em_pdl_wait();
    const uint32_t h = blockIdx.x, t = a.tokens ? a.tokens[blockIdx.y] : blockIdx.y, split = blockIdx.z;
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t kvh = h / (a.n_head / a.n_head_kv);
    const uint32_t pos = a.pos[t];
    const uint32_t first = a.window && pos + 1 > a.window ? pos + 1 - a.window : 0;
    /* this block's positions: [lo, hi) */
    const uint32_t per = (pos + 1 - first + a.n_split - 1) / a.n_split;
    const uint32_t lo = first + split * per, hi = min(lo + per, pos + 1);
    const uint32_t *table = a.blocks + a.table_start[a.seq[t]];
    const float *q = a.q + ((uint64_t)t * a.n_head + h) * a.head_dim;
    for (uint32_t i = threadIdx.x; i < a.head_dim; i += blockDim.x) qs[i] = q[i];
    __syncthreads();

    const uint32_t per_lane = a.head_dim_v / 32;
    float acc[ATT_MAX_DIM / 32];
#pragma unroll
    for (int i = 0; i < ATT_MAX_DIM / 32; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (uint32_t p0 = lo + 32 * warp; p0 < hi; p0 += 32 * ATT_WARPS) {
        const uint32_t p = p0 + lane;
        const bool valid = p < hi;
        uint64_t row = 0;
        float s = -INFINITY;
        if (valid) {
            row = (uint64_t)table[p / a.block_tokens] * a.block_tokens + p % a.block_tokens;
            const KV *k = (const KV *)a.keys + (row * a.n_head_kv + kvh) * a.head_dim;
            float dot = 0.0f;
#pragma unroll 8
            for (uint32_t j = 0; j < a.head_dim / 8; j++) {
                float kf[8];
                load8(k + 8 * j, kf);
#pragma unroll
                for (int c = 0; c < 8; c++) dot += qs[8 * j + c] * kf[c];
            }
            s = dot * a.scale;
            if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
        }
        const float m_new = fmaxf(m, em_warp_max(s));
        const float corr = expf(m - m_new);
        const float w = valid ? expf(s - m_new) : 0.0f;
        l = l * corr + em_warp_sum(w);
        m = m_new;
#pragma unroll
        for (uint32_t i = 0; i < ATT_MAX_DIM / 32; i++) acc[i] *= corr;
        const uint32_t n_valid = hi - p0 < 32 ? hi - p0 : 32;
        /* Values in groups of 8 positions, all loads of a group issued before the sums use them. */
        for (uint32_t j0 = 0; j0 < n_valid; j0 += 8) {
            float vv[8][ATT_MAX_DIM / 32], wj[8];
#pragma unroll
            for (uint32_t u = 0; u < 8; u++) {
                const uint32_t j = j0 + u < n_valid ? j0 + u : j0;
                wj[u] = j0 + u < n_valid ? __shfl_sync(0xffffffffu, w, j) : 0.0f;
                const uint64_t rj = __shfl_sync(0xffffffffu, row, j);
                const KV *v = (const KV *)a.values + (rj * a.n_head_kv + kvh) * a.head_dim_v;
#pragma unroll
                for (uint32_t i = 0; i < ATT_MAX_DIM / 32; i++) vv[u][i] = i < per_lane ? (float)v[32 * i + lane] : 0.0f;
            }
#pragma unroll
            for (uint32_t u = 0; u < 8; u++)
#pragma unroll
                for (uint32_t i = 0; i < ATT_MAX_DIM / 32; i++) acc[i] += wj[u] * vv[u][i];
        }
    }
#pragma unroll
    for (uint32_t i = 0; i < ATT_MAX_DIM / 32; i++)
        if (i < per_lane) part_acc[warp][32 * i + lane] = acc[i];
    if (lane == 0) part_m[warp] = m, part_l[warp] = l;
    __syncthreads();
    /* merge the warps: this block's max, sum and weighted values (a warp that saw no position has
     * max -inf and takes no part) */
    float mm = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) mm = fmaxf(mm, part_m[w]);
    float total = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) total += part_m[w] == -INFINITY ? 0.0f : part_l[w] * expf(part_m[w] - mm);
    float *o = a.out + ((uint64_t)t * a.n_head + h) * a.head_dim_v;
    /* partials and counters by grid row, not token: the scratch holds the grid's pairs */
    const uint64_t pair = (uint64_t)blockIdx.y * a.n_head + h;
    float *mine = a.part + (pair * a.n_split + split) * (a.head_dim_v + 2);
    for (uint32_t d = threadIdx.x; d < a.head_dim_v; d += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (part_m[w] != -INFINITY) sum += part_acc[w][d] * expf(part_m[w] - mm);
        if (a.n_split == 1)
            o[d] = sum / total;
        else
            mine[d] = sum;
    }
    if (a.n_split == 1) return;
    if (threadIdx.x == 0) mine[a.head_dim_v] = mm, mine[a.head_dim_v + 1] = total;
    /* make this block's partial visible before counting it; the last block to count merges */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last_block = atomicAdd(&a.counter[pair], 1u) == a.n_split - 1;
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    const float *parts = a.part + pair * a.n_split * (a.head_dim_v + 2);
    const uint32_t stride = a.head_dim_v + 2;
    float gm = -INFINITY;
    for (uint32_t sp = 0; sp < a.n_split; sp++) gm = fmaxf(gm, __ldcg(parts + sp * stride + a.head_dim_v));
    float gl = 0.0f;
    for (uint32_t sp = 0; sp < a.n_split; sp++) {
        const float ms = __ldcg(parts + sp * stride + a.head_dim_v);
        if (ms != -INFINITY) gl += __ldcg(parts + sp * stride + a.head_dim_v + 1) * expf(ms - gm);
    }
    for (uint32_t d = threadIdx.x; d < a.head_dim_v; d += blockDim.x) {
        float sum = 0.0f;
        for (uint32_t sp = 0; sp < a.n_split; sp++) {
            const float ms = __ldcg(parts + sp * stride + a.head_dim_v);
            if (ms != -INFINITY) sum += __ldcg(parts + sp * stride + d) * expf(ms - gm);
        }
        o[d] = sum / gl;
    }
    if (threadIdx.x == 0) a.counter[pair] = 0;
}

/* Splits per (head, token): enough blocks to cover the GPU twice at small batches; for batches
 * launched directly (not replayed from a graph, so the longest context is known) also enough that
 * no block walks more than ATT_SPAN positions; never more than the scratch holds. */
#define ATT_SPAN 1024
#define ATT_MAX_SPLIT 16

static uint32_t n_splits(const cuda_backend *b, uint32_t n_tokens, uint32_t max_pos, uint32_t n_head) {
    const uint64_t pairs = (uint64_t)n_tokens * n_head;
    uint64_t s = (2 * (uint64_t)b->n_sm + pairs - 1) / pairs;
    if (!b->capturing) {
        const uint64_t by_len = ((uint64_t)max_pos + ATT_SPAN) / ATT_SPAN;
        if (by_len > s) s = by_len;
    }
    if (s > ATT_MAX_SPLIT) s = ATT_MAX_SPLIT;
    const uint64_t slots = min(b->att_slots, em_cuda_att_slots(b, n_tokens)); /* the batch's own, not the capacity */
    while (s > 1 && pairs * s > slots) s--;
    return s ? (uint32_t)s : 1;
}

/* A captured batch has at most EM_CUDA_GRAPH_TOKENS tokens, so no segment: the decode-style
 * kernel's grid then covers every token, whatever the batch holds at replay. */
static_assert(EM_ATT_SEGMENT_MIN > EM_CUDA_GRAPH_TOKENS, "captured batches must have no prefill segments");

em_err em_cuda_attention_with(cuda_backend *b, const cuda_batch *batch, uint32_t il, bool use_segments) {
    const cuda_layer *lw = &b->layers[il];
    const em_program_attention *at = &lw->att;
    const bool prefill = use_segments && batch->n_segments > 0 && !b->capturing && em_cuda_prefill_supported(b, lw);
    if (prefill) {
        em_err err = em_cuda_prefill_attention(b, batch, il);
        if (err) return err;
        if (batch->n_other == 0) return NULL;
    }
    const uint32_t n_tokens = prefill ? batch->n_other : batch->n_tokens;
    const uint32_t max_pos = prefill ? batch->other_max_pos : batch->max_pos;
    if (em_cuda_attention_decode_fits(b, il))
        return em_cuda_attention_decode(b, batch, il, prefill ? batch->other_tokens : NULL, n_tokens, max_pos);
    att_args a = {b->q, b->attn, lw->keys, lw->values, at->n_head, at->n_head_kv, at->head_dim, at->head_dim_v,
                  at->scale, at->softcap, at->window, batch->pos,
                  batch->seq, batch->table_start, batch->blocks, b->base.block_tokens,
                  n_splits(b, n_tokens, max_pos, at->n_head), prefill ? batch->other_tokens : NULL, b->att_part,
                  b->att_counter};
    dim3 grid(at->n_head, n_tokens, a.n_split);
    if (b->kv_elem == 4)
        em_cuda_launch(b, attention_kernel<float>, grid, ATT_WARPS * 32, 0, a);
    else
        em_cuda_launch(b, attention_kernel<__half>, grid, ATT_WARPS * 32, 0, a);
    CU_LAUNCHED();
    return NULL;
}

em_err em_cuda_attention(cuda_backend *b, const cuda_batch *batch, uint32_t il) {
    return em_cuda_attention_with(b, batch, il, true);
}
