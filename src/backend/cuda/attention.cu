/* Attention over the paged f16 KV cache, for decode tokens and prefill chunks alike.
 *
 * One block per (query head, token). Its warps split the visible positions into chunks of 32
 * (warp w takes chunks w, w + warps, ...), so even a single decode token spreads a long context
 * over the block. Inside a chunk each lane scores one position (its key row is one contiguous
 * run of head_dim halves, read 16 bytes at a time), the warp updates a running maximum and sum
 * (online softmax), and the lanes, each owning head_dim_v / 32 output dimensions, accumulate the
 * chunk's values. The warps' partial results are merged at the end through shared memory.
 * GQA: query head h reads KV head h / (n_head / n_head_kv). Sliding windows and the score
 * soft-cap are applied as in the CPU reference. */
#include <math.h>

#include "internal.cuh"

#define ATT_WARPS 16
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
} att_args;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
__device__ __forceinline__ float warp_add(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

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
    const uint32_t h = blockIdx.x, t = blockIdx.y;
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t kvh = h / (a.n_head / a.n_head_kv);
    const uint32_t pos = a.pos[t];
    const uint32_t first = a.window && pos + 1 > a.window ? pos + 1 - a.window : 0;
    const uint32_t *table = a.blocks + a.table_start[a.seq[t]];
    const float *q = a.q + ((uint64_t)t * a.n_head + h) * a.head_dim;
    for (uint32_t i = threadIdx.x; i < a.head_dim; i += blockDim.x) qs[i] = q[i];
    __syncthreads();

    const uint32_t per_lane = a.head_dim_v / 32;
    float acc[ATT_MAX_DIM / 32];
#pragma unroll
    for (int i = 0; i < ATT_MAX_DIM / 32; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (uint32_t p0 = first + 32 * warp; p0 <= pos; p0 += 32 * ATT_WARPS) {
        const uint32_t p = p0 + lane;
        const bool valid = p <= pos;
        uint64_t row = 0;
        float s = -INFINITY;
        if (valid) {
            row = (uint64_t)table[p / a.block_tokens] * a.block_tokens + p % a.block_tokens;
            const KV *k = (const KV *)a.keys + (row * a.n_head_kv + kvh) * a.head_dim;
            float dot = 0.0f;
            for (uint32_t j = 0; j < a.head_dim / 8; j++) {
                float kf[8];
                load8(k + 8 * j, kf);
#pragma unroll
                for (int c = 0; c < 8; c++) dot += qs[8 * j + c] * kf[c];
            }
            s = dot * a.scale;
            if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
        }
        const float m_new = fmaxf(m, warp_max(s));
        const float corr = expf(m - m_new);
        const float w = valid ? expf(s - m_new) : 0.0f;
        l = l * corr + warp_add(w);
        m = m_new;
#pragma unroll
        for (uint32_t i = 0; i < ATT_MAX_DIM / 32; i++) acc[i] *= corr;
        const uint32_t n_valid = pos - p0 + 1 < 32 ? pos - p0 + 1 : 32;
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
    float mm = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) mm = fmaxf(mm, part_m[w]);
    float total = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) total += part_m[w] == -INFINITY ? 0.0f : part_l[w] * expf(part_m[w] - mm);
    float *o = a.out + ((uint64_t)t * a.n_head + h) * a.head_dim_v;
    for (uint32_t d = threadIdx.x; d < a.head_dim_v; d += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (part_m[w] != -INFINITY) sum += part_acc[w][d] * expf(part_m[w] - mm);
        o[d] = sum / total;
    }
}

em_err em_cuda_attention(cuda_backend *b, const cuda_batch *batch, uint32_t il) {
    const em_layer_desc *ld = &b->d->layers[il];
    const cuda_layer *lw = &b->layers[il];
    att_args a = {b->q, b->attn, lw->keys, lw->values, ld->n_head, ld->n_head_kv, ld->head_dim, ld->head_dim_v,
                  ld->attn_scale, ld->attn_softcap, ld->attn == EM_ATTN_SLIDING ? ld->window : 0, batch->pos,
                  batch->seq, batch->table_start, batch->blocks, b->base.block_tokens};
    dim3 grid(ld->n_head, batch->n_tokens);
    if (b->kv_elem == 4)
        attention_kernel<float><<<grid, ATT_WARPS * 32, 0, b->stream>>>(a);
    else
        attention_kernel<__half><<<grid, ATT_WARPS * 32, 0, b->stream>>>(a);
    CU_LAUNCHED();
    return NULL;
}
