/* The element-wise and per-row kernels of the CUDA forward: RMSNorm, the residual add with the
 * optional post-norm, the Q/K/V finish (bias, QK-norm, RoPE, KV-cache write), the gated linear
 * unit, soft-capping, and the MoE router, grouping and combine. Each computes what the CPU
 * reference (src/backend/cpu/cpu.c, ops.c) computes, in f32 (RoPE angles in double, like there). */
#include <math.h>

#include "internal.cuh"

#define NORM_THREADS 1024


/* Sum over the block (blockDim.x a multiple of 32, at most 1024). */
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    v = em_warp_sum(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
        s = em_warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

/* ---- RMSNorm ---- */

__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, uint32_t n, float eps, bool plus_one,
                               const uint32_t *row_index) {
    em_pdl_wait();
    const uint32_t r = blockIdx.x;
    const float *xr = x + (uint64_t)(row_index ? row_index[r] : r) * n;
    float *o = out + (uint64_t)r * n;
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    const float scale = rsqrtf(block_sum(ss) / n + eps);
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        float weight = w ? (plus_one ? 1.0f + w[i] : w[i]) : 1.0f;
        o[i] = xr[i] * scale * weight;
    }
}

em_err em_cuda_rmsnorm(cuda_backend *b, float *out, const float *x, const float *w, uint32_t n_rows, uint32_t n,
                       const uint32_t *row_index) {
    if (n_rows == 0) return NULL;
    em_cuda_launch(b, rmsnorm_kernel, n_rows, NORM_THREADS, 0, out, x, w, n, b->d->norm_eps,
                   b->d->norm == EM_NORM_RMS_PLUS_ONE, row_index);
    CU_LAUNCHED();
    return NULL;
}

/* x += [norm](out), the residual add after attention and after the feed-forward; then, when xn is
 * given, xn = norm(x) * w_next, the RMSNorm that starts the next sub-block (one kernel for both). */
__global__ void add_norm_kernel(float *x, const float *out, const float *w, uint32_t n, float eps, bool plus_one,
                                float *xn, const float *w_next) {
    em_pdl_wait();
    const uint64_t base = (uint64_t)blockIdx.x * n;
    float scale = 1.0f;
    if (w) {
        float ss = 0.0f;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) ss += out[base + i] * out[base + i];
        scale = rsqrtf(block_sum(ss) / n + eps);
    }
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        float o = out[base + i];
        if (w) o = o * scale * (plus_one ? 1.0f + w[i] : w[i]);
        const float v = x[base + i] + o;
        x[base + i] = v;
        ss += v * v;
    }
    if (!xn) return;
    const float s2 = rsqrtf(block_sum(ss) / n + eps);
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float weight = w_next ? (plus_one ? 1.0f + w_next[i] : w_next[i]) : 1.0f;
        xn[base + i] = x[base + i] * s2 * weight;
    }
}

em_err em_cuda_add_norm(cuda_backend *b, float *x, float *out, const float *w, uint32_t n_rows, uint32_t n, float *xn,
                        const float *w_next) {
    em_cuda_launch(b, add_norm_kernel, n_rows, NORM_THREADS, 0, x, (const float *)out, w, n, b->d->norm_eps,
                   b->d->norm == EM_NORM_RMS_PLUS_ONE, xn, w_next);
    CU_LAUNCHED();
    return NULL;
}

/* ---- Q, K, V: bias, QK-norm, RoPE, KV-cache write ---- */

typedef struct rope_args {
    int neox;
    double theta, freq_scale, low, high, mscale, ext;
    uint32_t n_rot;
    const double *inv_freq; /* base^(-2i/n_rot) / freq_factors[i] (cuda_layer.inv_freq) */
} rope_args;

typedef struct qkv_args {
    float *q;
    const float *k, *v;
    const float *bq, *bk, *bv, *q_norm, *k_norm;
    void *keys, *values;
    uint32_t n_head, n_head_kv, head_dim, head_dim_v;
    float eps;
    bool plus_one;
    rope_args rope;
    const uint32_t *pos, *seq, *table_start, *blocks;
    uint32_t block_tokens;
} qkv_args;

/* RoPE of one head held in shared memory `h`, by one warp (em_cpu_rope). */
__device__ void rope_head(float *h, uint32_t pos, const rope_args &r) {
    const uint32_t half = r.n_rot / 2;
    for (uint32_t i = threadIdx.x & 31; i < half; i += 32) {
        const double theta = pos * r.inv_freq[i];
        double angle = theta * r.freq_scale;
        if (r.ext != 0.0) {
            double y = (i - r.low) / fmax(0.001, r.high - r.low);
            double ramp = (1.0 - fmin(1.0, fmax(0.0, y))) * r.ext;
            angle = angle * (1.0 - ramp) + theta * ramp;
        }
        const float c = (float)(cos(angle) * r.mscale), s = (float)(sin(angle) * r.mscale);
        const uint32_t a = r.neox ? i : 2 * i, bb = r.neox ? i + half : 2 * i + 1;
        const float x0 = h[a], x1 = h[bb];
        h[a] = x0 * c - x1 * s;
        h[bb] = x0 * s + x1 * c;
    }
    __syncwarp();
}

/* Grid: (tokens, head groups). Warp w of group g takes head g * warps + w of the list
 * [Q heads | K heads | V heads]. */
template <typename KV> __global__ void qkv_kernel(qkv_args a) {
    em_pdl_wait();
    extern __shared__ float heads[];
    const uint32_t t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const uint32_t j = blockIdx.y * warps + warp;
    if (j >= a.n_head + 2 * a.n_head_kv) return;
    const uint32_t hd = a.head_dim > a.head_dim_v ? a.head_dim : a.head_dim_v;
    float *h = heads + warp * hd;
    const uint32_t pos = a.pos[t];
    const uint32_t cache_row =
        a.blocks[a.table_start[a.seq[t]] + pos / a.block_tokens] * a.block_tokens + pos % a.block_tokens;
    {
        const bool is_q = j < a.n_head, is_k = !is_q && j < a.n_head + a.n_head_kv, is_v = !is_q && !is_k;
        const uint32_t head = is_q ? j : is_k ? j - a.n_head : j - a.n_head - a.n_head_kv;
        const uint32_t dim = is_v ? a.head_dim_v : a.head_dim;
        const float *src = is_q ? a.q + ((uint64_t)t * a.n_head + head) * dim
                         : is_k ? a.k + ((uint64_t)t * a.n_head_kv + head) * dim
                                : a.v + ((uint64_t)t * a.n_head_kv + head) * dim;
        const float *bias = is_q ? a.bq : is_k ? a.bk : a.bv;
        const float *norm = is_q ? a.q_norm : is_k ? a.k_norm : NULL;
        float ss = 0.0f;
        for (uint32_t i = lane; i < dim; i += 32) {
            float x = src[i] + (bias ? bias[head * dim + i] : 0.0f);
            h[i] = x;
            ss += x * x;
        }
        __syncwarp();
        if (norm) {
            const float scale = rsqrtf(em_warp_sum(ss) / dim + a.eps);
            for (uint32_t i = lane; i < dim; i += 32) h[i] = h[i] * scale * (a.plus_one ? 1.0f + norm[i] : norm[i]);
            __syncwarp();
        }
        if (!is_v) rope_head(h, pos, a.rope);
        if (is_q) {
            float *dst = a.q + ((uint64_t)t * a.n_head + head) * dim;
            for (uint32_t i = lane; i < dim; i += 32) dst[i] = h[i];
        } else {
            KV *dst = (KV *)(is_k ? a.keys : a.values) + ((uint64_t)cache_row * a.n_head_kv + head) * dim;
            for (uint32_t i = lane; i < dim; i += 32) dst[i] = (KV)h[i];
        }
        __syncwarp();
    }
}

static double yarn_corr_dim(uint32_t n_dims, uint32_t orig_ctx, double beta, double base) {
    return n_dims * log(orig_ctx / (beta * 2.0 * M_PI)) / (2.0 * log(base));
}

em_err em_cuda_qkv_finish(cuda_backend *b, const cuda_batch *batch, uint32_t il) {
    const em_layer_desc *ld = &b->d->layers[il];
    const cuda_layer *lw = &b->layers[il];
    const em_rope *rope = &ld->rope;
    rope_args r = {rope->style == EM_ROPE_NEOX, rope->theta, 1.0, 0.0, 0.0, 1.0, 0.0, rope->n_rot, lw->inv_freq};
    if (rope->scaling == EM_ROPE_SCALING_LINEAR || rope->scaling == EM_ROPE_SCALING_YARN) r.freq_scale = 1.0 / rope->factor;
    if (rope->scaling == EM_ROPE_SCALING_YARN) {
        r.low = floor(yarn_corr_dim(rope->n_rot, rope->orig_ctx, rope->yarn_beta_fast, rope->theta));
        r.high = ceil(yarn_corr_dim(rope->n_rot, rope->orig_ctx, rope->yarn_beta_slow, rope->theta));
        if (r.low < 0) r.low = 0;
        if (r.high > rope->n_rot - 1) r.high = rope->n_rot - 1;
        r.ext = rope->yarn_ext_factor;
        r.mscale = rope->yarn_attn_factor;
        if (r.ext != 0.0) r.mscale *= 1.0 + 0.1 * log(1.0 / r.freq_scale);
    }
    qkv_args a = {b->q, b->k, b->v, lw->bq, lw->bk, lw->bv, lw->q_norm, lw->k_norm, lw->keys, lw->values,
                  ld->n_head, ld->n_head_kv, ld->head_dim, ld->head_dim_v, b->d->norm_eps,
                  b->d->norm == EM_NORM_RMS_PLUS_ONE, r, batch->pos, batch->seq, batch->table_start, batch->blocks,
                  b->base.block_tokens};
    const uint32_t warps = 4, hd = ld->head_dim > ld->head_dim_v ? ld->head_dim : ld->head_dim_v;
    const dim3 grid(batch->n_tokens, (ld->n_head + 2 * ld->n_head_kv + warps - 1) / warps);
    if (b->kv_elem == 4)
        em_cuda_launch(b, qkv_kernel<float>, grid, warps * 32, warps * hd * sizeof(float), a);
    else
        em_cuda_launch(b, qkv_kernel<__half>, grid, warps * 32, warps * hd * sizeof(float), a);
    CU_LAUNCHED();
    return NULL;
}

/* ---- gated linear unit, soft-cap ---- */

__global__ void glu_kernel(float *gate, const float *up, uint64_t n, bool gelu) {
    em_pdl_wait();
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        const float x = gate[i];
        float a;
        if (gelu) {
            const float k = 0.7978845608028654f; /* sqrt(2/pi): GELU, tanh approximation */
            a = 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
        } else {
            a = x / (1.0f + expf(-x));
        }
        gate[i] = a * up[i];
    }
}

static unsigned elementwise_blocks(uint64_t n) {
    uint64_t blocks = (n + 255) / 256;
    return (unsigned)(blocks > 4096 ? 4096 : blocks ? blocks : 1);
}

em_err em_cuda_glu(cuda_backend *b, float *gate, const float *up, uint64_t n) {
    em_cuda_launch(b, glu_kernel, elementwise_blocks(n), 256, 0, gate, up, n, b->d->act == EM_ACT_GEGLU);
    CU_LAUNCHED();
    return NULL;
}

__global__ void softcap_kernel(float *x, uint64_t n, float cap) {
    em_pdl_wait();
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

em_err em_cuda_softcap(cuda_backend *b, float *x, uint64_t n, float cap) {
    em_cuda_launch(b, softcap_kernel, elementwise_blocks(n), 256, 0, x, n, cap);
    CU_LAUNCHED();
    return NULL;
}

/* ---- MoE: routing, grouping by expert, combining ---- */

/* One thread per token: probabilities, the top k (first index wins ties, like the CPU), weights. */
__global__ void route_kernel(float *router, int32_t *chosen, float *weight, uint32_t n_tokens, uint32_t n_expert,
                             uint32_t k, bool sigmoid, bool renormalize, float scale) {
    em_pdl_wait();
    const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tokens) return;
    float *p = router + (uint64_t)t * n_expert;
    if (sigmoid) {
        for (uint32_t e = 0; e < n_expert; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
    } else {
        float max = -INFINITY;
        for (uint32_t e = 0; e < n_expert; e++) max = fmaxf(max, p[e]);
        double sum = 0.0;
        for (uint32_t e = 0; e < n_expert; e++) {
            p[e] = expf(p[e] - max);
            sum += p[e];
        }
        const float inv = (float)(1.0 / sum);
        for (uint32_t e = 0; e < n_expert; e++) p[e] *= inv;
    }
    int32_t *c = chosen + (uint64_t)t * k;
    float *w = weight + (uint64_t)t * k;
    float sum = 0.0f;
    for (uint32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (uint32_t e = 0; e < n_expert; e++) {
            bool taken = false;
            for (uint32_t i = 0; i < j; i++) taken |= c[i] == (int32_t)e;
            if (!taken && (best < 0 || p[e] > p[best])) best = (int32_t)e;
        }
        c[j] = best;
        w[j] = p[best];
        sum += p[best];
    }
    for (uint32_t j = 0; j < k; j++) {
        if (renormalize) w[j] /= sum;
        w[j] *= scale;
    }
}

/* One warp per token, for up to 32 * PER_LANE experts: the same probabilities, choices (first
 * index wins ties) and weights as route_kernel, with the experts spread over the lanes instead of
 * one thread looping over all of them (a decode step has one token: the loop was its latency). */
template <int PER_LANE>
__global__ void route_warp_kernel(const float *router, int32_t *chosen, float *weight, uint32_t n_tokens,
                                  uint32_t n_expert, uint32_t k, bool sigmoid, bool renormalize, float scale) {
    em_pdl_wait();
    const uint32_t lane = threadIdx.x & 31, t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= n_tokens) return;
    const float *logits = router + (uint64_t)t * n_expert;
    float p[PER_LANE];
    float max = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        const uint32_t e = lane + 32 * i;
        p[i] = e < n_expert ? logits[e] : -INFINITY;
        max = fmaxf(max, p[i]);
    }
    if (sigmoid) {
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) p[i] = lane + 32 * i < n_expert ? 1.0f / (1.0f + expf(-p[i])) : -INFINITY;
    } else {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, off));
        double sum = 0.0;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (lane + 32 * i < n_expert) {
                p[i] = expf(p[i] - max);
                sum += p[i];
            }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        const float inv = (float)(1.0 / sum);
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (lane + 32 * i < n_expert) p[i] *= inv;
    }
    float total = 0.0f;
    for (uint32_t j = 0; j < k; j++) {
        float best = -INFINITY;
        uint32_t best_e = UINT32_MAX;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (p[i] > best) best = p[i], best_e = lane + 32 * i;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, best, off);
            const uint32_t other_e = __shfl_xor_sync(0xffffffffu, best_e, off);
            if (other > best || (other == best && other_e < best_e)) best = other, best_e = other_e;
        }
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (lane + 32 * i == best_e) p[i] = -INFINITY; /* taken */
        if (lane == 0) {
            chosen[(uint64_t)t * k + j] = (int32_t)best_e;
            weight[(uint64_t)t * k + j] = best;
        }
        total += best;
    }
    if (lane == 0)
        for (uint32_t j = 0; j < k; j++) {
            float w = weight[(uint64_t)t * k + j];
            if (renormalize) w /= total;
            weight[(uint64_t)t * k + j] = w * scale;
        }
}

/* One block: counts per expert, their prefix sums, a slot for every (token, choice) pair so that
 * each expert's pairs are contiguous, and the list of experts with at least one pair (`active`,
 * its length at *n_active) so that expert products launch grid rows for those only. Pair order
 * inside an expert does not matter: every pair's result is computed on its own. */
__global__ void group_kernel(const int32_t *chosen, uint32_t n_pairs, uint32_t k, uint32_t n_expert, uint32_t *counts,
                             uint32_t *starts, uint32_t *pair_token, uint32_t *pair_slot, uint32_t *active,
                             uint32_t *n_active) {
    em_pdl_wait();
    extern __shared__ uint32_t fill[];
    for (uint32_t e = threadIdx.x; e < n_expert; e += blockDim.x) fill[e] = 0;
    __syncthreads();
    for (uint32_t p = threadIdx.x; p < n_pairs; p += blockDim.x) atomicAdd(&fill[chosen[p]], 1u);
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t s = 0, n = 0;
        for (uint32_t e = 0; e < n_expert; e++) {
            starts[e] = s;
            counts[e] = fill[e];
            if (fill[e]) active[n++] = e;
            s += fill[e];
            fill[e] = 0;
        }
        *n_active = n;
    }
    __syncthreads();
    for (uint32_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        const uint32_t e = (uint32_t)chosen[p];
        const uint32_t slot = starts[e] + atomicAdd(&fill[e], 1u);
        pair_token[slot] = p / k;
        pair_slot[p] = slot;
    }
}

em_err em_cuda_route(cuda_backend *b, uint32_t il, uint32_t n_tokens) {
    const em_layer_desc *ld = &b->d->layers[il];
    const bool sigmoid = ld->gating == EM_GATING_SIGMOID;
    if (ld->n_expert <= 256) {
        const uint32_t warps = 4, blocks = (n_tokens + warps - 1) / warps;
        if (ld->n_expert <= 128)
            em_cuda_launch(b, route_warp_kernel<4>, blocks, warps * 32, 0, (const float *)b->router, b->chosen,
                           b->chosen_weight, n_tokens, ld->n_expert, ld->n_expert_used, sigmoid, ld->renormalize,
                           ld->expert_weights_scale);
        else
            em_cuda_launch(b, route_warp_kernel<8>, blocks, warps * 32, 0, (const float *)b->router, b->chosen,
                           b->chosen_weight, n_tokens, ld->n_expert, ld->n_expert_used, sigmoid, ld->renormalize,
                           ld->expert_weights_scale);
    } else {
        em_cuda_launch(b, route_kernel, (n_tokens + 127) / 128, 128, 0, b->router, b->chosen, b->chosen_weight,
                       n_tokens, ld->n_expert, ld->n_expert_used, sigmoid, ld->renormalize, ld->expert_weights_scale);
    }
    CU_LAUNCHED();
    em_cuda_launch(b, group_kernel, 1, 1024, ld->n_expert * sizeof(uint32_t), (const int32_t *)b->chosen,
                   n_tokens * ld->n_expert_used, ld->n_expert_used, ld->n_expert, b->expert_count, b->expert_start,
                   b->pair_token, b->pair_slot, b->expert_active, b->expert_active + b->max_expert);
    CU_LAUNCHED();
    return NULL;
}

/* out[t] = sum over t's experts, in expert order like the CPU, of weight * expert output
 * [+ shared expert output]. The order is worked out once per token, in shared memory. */
__global__ void combine_kernel(float *out, const float *y, const float *shared, const int32_t *chosen,
                               const float *weight, const uint32_t *pair_slot, uint32_t k, uint32_t n,
                               bool accumulate, const float *next_norm_w, bool plus_one, float *xw, float *ss,
                               uint32_t ss_stride) {
    em_pdl_wait();
    extern __shared__ uint32_t order[]; /* [k] pair slots in expert order, then [k] their weights */
    float *order_weight = (float *)(order + k);
    const uint32_t t = blockIdx.y;
    const int32_t *c = chosen + (uint64_t)t * k;
    if (threadIdx.x == 0) {
        int32_t last = -1;
        for (uint32_t m = 0; m < k; m++) {
            int32_t next = -1;
            uint32_t jn = 0;
            for (uint32_t j = 0; j < k; j++)
                if (c[j] > last && (next < 0 || c[j] < next)) next = c[j], jn = j;
            last = next;
            order[m] = pair_slot[(uint64_t)t * k + jn];
            order_weight[m] = weight[(uint64_t)t * k + jn];
        }
    }
    __syncthreads();
    float sq = 0.0f;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (uint32_t m = 0; m < k; m++) acc += order_weight[m] * y[(uint64_t)order[m] * n + i];
        if (shared) acc += shared[(uint64_t)t * n + i];
        float *o = out + (uint64_t)t * n + i;
        const float v = accumulate ? *o + acc : acc;
        *o = v;
        if (next_norm_w) { /* a fused norm's producer (cuda_matvec) */
            xw[(uint64_t)t * n + i] = v * (plus_one ? 1.0f + next_norm_w[i] : next_norm_w[i]);
            sq += v * v;
        }
    }
    if (next_norm_w) {
        const float total = block_sum(sq);
        if (threadIdx.x == 0) ss[(uint64_t)t * ss_stride + blockIdx.x] = total;
    }
}

em_err em_cuda_moe_combine(cuda_backend *b, uint32_t il, uint32_t n_tokens, bool add_shared, bool into_x,
                           const float *next_norm_w, float *xw) {
    const em_layer_desc *ld = &b->d->layers[il];
    const dim3 grid((b->d->n_embd + 255) / 256, n_tokens);
    if (next_norm_w && (!into_x || grid.x > b->ss_stride))
        return em_errorf(EM_ERR_INTERNAL, "cuda moe combine: a norm producer must add into x");
    if (next_norm_w) b->ss_n = grid.x;
    em_cuda_launch(b, combine_kernel, grid, 256, 2 * ld->n_expert_used * sizeof(uint32_t), into_x ? b->x : b->out,
                   (const float *)b->moe_y,
                   (const float *)(add_shared ? b->tmp : NULL), (const int32_t *)b->chosen,
                   (const float *)b->chosen_weight, (const uint32_t *)b->pair_slot, ld->n_expert_used, b->d->n_embd, into_x, next_norm_w,
                   b->d->norm == EM_NORM_RMS_PLUS_ONE, xw, b->ss, b->ss_stride);
    CU_LAUNCHED();
    return NULL;
}

