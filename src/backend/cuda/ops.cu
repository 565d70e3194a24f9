/* The element-wise and per-row kernels of the CUDA forward: RMSNorm, the residual add with the
 * optional post-norm, the Q/K/V finish (bias, QK-norm, RoPE, KV-cache write), the gated linear
 * unit, soft-capping, and the MoE router, grouping and combine. Each computes what the CPU
 * reference (src/backend/cpu/cpu.c, ops.c) computes, in f32 (RoPE angles in double, like there). */
#include <math.h>

#include "qkv.cuh"
#include "route.cuh"

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
    em_cuda_launch(b, rmsnorm_kernel, n_rows, NORM_THREADS, 0, out, x, w, n, b->step.eps,
                   b->step.plus_one, row_index);
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
    em_cuda_launch(b, add_norm_kernel, n_rows, NORM_THREADS, 0, x, (const float *)out, w, n, b->step.eps,
                   b->step.plus_one, xn, w_next);
    CU_LAUNCHED();
    return NULL;
}

/* ---- Q, K, V: bias, QK-norm, RoPE, KV-cache write ---- */

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
    const bool is_q = j < a.n_head, is_k = !is_q && j < a.n_head + a.n_head_kv, is_v = !is_q && !is_k;
    const uint32_t head = is_q ? j : is_k ? j - a.n_head : j - a.n_head - a.n_head_kv;
    const uint32_t dim = is_v ? a.head_dim_v : a.head_dim;
    const float *src = is_q ? a.q + ((uint64_t)t * a.n_head + head) * dim
                     : is_k ? a.k + ((uint64_t)t * a.n_head_kv + head) * dim
                            : a.v + ((uint64_t)t * a.n_head_kv + head) * dim;
    const float *bias = is_q ? a.bq : is_k ? a.bk : a.bv;
    const float *norm = is_q ? a.q_norm : is_k ? a.k_norm : NULL;
    qkv_head(h, src, bias ? bias + head * dim : NULL, norm, dim, a.eps, a.plus_one, !is_v, pos, a.rope);
    if (is_q) {
        float *dst = a.q + ((uint64_t)t * a.n_head + head) * dim;
        for (uint32_t i = lane; i < dim; i += 32) dst[i] = h[i];
    } else {
        KV *dst = (KV *)(is_k ? a.keys : a.values) + ((uint64_t)cache_row * a.n_head_kv + head) * dim;
        for (uint32_t i = lane; i < dim; i += 32) dst[i] = (KV)h[i];
    }
    __syncwarp();
}

static double yarn_corr_dim(uint32_t n_dims, uint32_t orig_ctx, double beta, double base) {
    return n_dims * log(orig_ctx / (beta * 2.0 * M_PI)) / (2.0 * log(base));
}

rope_args em_cuda_rope_args(const cuda_backend *b, uint32_t il) {
    const em_rope *rope = &b->layers[il].rope;
    rope_args r = {rope->style == EM_ROPE_NEOX, rope->theta, 1.0, 0.0, 0.0, 1.0, 0.0, rope->n_rot,
                   b->layers[il].inv_freq};
    if (rope->scaling == EM_ROPE_SCALING_LINEAR || rope->scaling == EM_ROPE_SCALING_YARN)
        r.freq_scale = 1.0 / rope->factor;
    if (rope->scaling == EM_ROPE_SCALING_YARN) {
        r.low = floor(yarn_corr_dim(rope->n_rot, rope->orig_ctx, rope->yarn_beta_fast, rope->theta));
        r.high = ceil(yarn_corr_dim(rope->n_rot, rope->orig_ctx, rope->yarn_beta_slow, rope->theta));
        if (r.low < 0) r.low = 0;
        if (r.high > rope->n_rot - 1) r.high = rope->n_rot - 1;
        r.ext = rope->yarn_ext_factor;
        r.mscale = rope->yarn_attn_factor;
        if (r.ext != 0.0) r.mscale *= 1.0 + 0.1 * log(1.0 / r.freq_scale);
    }
    return r;
}

em_err em_cuda_qkv_finish(cuda_backend *b, const cuda_batch *batch, uint32_t il) {
    const cuda_layer *lw = &b->layers[il];
    const em_program_attention *at = &lw->att;
    const rope_args r = em_cuda_rope_args(b, il);
    qkv_args a = {b->q, b->k, b->v, lw->bq, lw->bk, lw->bv, lw->q_norm, lw->k_norm, lw->keys, lw->values,
                  at->n_head, at->n_head_kv, at->head_dim, at->head_dim_v, b->step.eps,
                  b->step.plus_one, r, batch->pos, batch->seq, batch->table_start, batch->blocks,
                  b->base.block_tokens};
    const uint32_t warps = 4, hd = at->head_dim > at->head_dim_v ? at->head_dim : at->head_dim_v;
    const dim3 grid(batch->n_tokens, (at->n_head + 2 * at->n_head_kv + warps - 1) / warps);
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
    em_cuda_launch(b, glu_kernel, elementwise_blocks(n), 256, 0, gate, up, n, b->step.act == EM_ACT_GEGLU);
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

/* A fused norm before the experts (em_cuda_route with norm_ss): xn holds x * norm weights and ss the
 * producer's partial sums of squares; the routing scales each token's row by its RMS factor, so
 * that the experts read the normalized input (the router product folds the factor itself). */
typedef struct route_norm {
    float *xn;        /* NULL: no fused norm */
    const float *ss;
    uint32_t ss_n, ss_stride, cols;
    float eps;
} route_norm;

template <int PER_LANE>
__global__ void route_warp_kernel(const float *router, int32_t *chosen, float *weight, uint32_t n_tokens,
                                  uint32_t n_expert, uint32_t k, bool sigmoid, bool renormalize, float scale) {
    em_pdl_wait();
    const uint32_t t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= n_tokens) return;
    route_token<PER_LANE>(router, chosen, weight, t, n_expert, k, sigmoid, renormalize, scale);
}

/* The grouping of the (token, choice) pairs by expert, by one block: counts per expert, their
 * prefix sums, a slot for every pair so that each expert's pairs are contiguous, and the list of
 * experts with at least one pair (`active`, its length at *n_active) so that expert products
 * launch grid rows for those only. Pair order inside an expert does not matter: every pair's
 * result is computed on its own. `fill`: n_expert words of shared memory. */
typedef struct group_args {
    const int32_t *chosen;
    uint32_t n_pairs, k, n_expert;
    uint32_t *counts, *starts, *pair_token, *pair_slot, *active, *n_active;
} group_args;

__device__ void group_pairs(const group_args &a, uint32_t *fill) {
    for (uint32_t e = threadIdx.x; e < a.n_expert; e += blockDim.x) fill[e] = 0;
    __syncthreads();
    for (uint32_t p = threadIdx.x; p < a.n_pairs; p += blockDim.x) atomicAdd(&fill[a.chosen[p]], 1u);
    __syncthreads();
    if (threadIdx.x < 32) { /* warp 0: prefix sums of the counts and of the active experts */
        const uint32_t lane = threadIdx.x, per = (a.n_expert + 31) / 32, e0 = lane * per;
        const uint32_t e1 = e0 + per < a.n_expert ? e0 + per : a.n_expert;
        uint32_t pairs = 0, used = 0;
        for (uint32_t e = e0; e < e1; e++) pairs += fill[e], used += fill[e] != 0;
        uint32_t s = pairs, n = used; /* inclusive scans over the lanes, then exclusive */
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const uint32_t ps = __shfl_up_sync(0xffffffffu, s, off), pn = __shfl_up_sync(0xffffffffu, n, off);
            if (lane >= (uint32_t)off) s += ps, n += pn;
        }
        if (lane == 31) *a.n_active = n;
        s -= pairs, n -= used;
        for (uint32_t e = e0; e < e1; e++) {
            const uint32_t c = fill[e];
            a.starts[e] = s;
            a.counts[e] = c;
            if (c) a.active[n++] = e;
            s += c;
            fill[e] = 0;
        }
    }
    __syncthreads();
    for (uint32_t p = threadIdx.x; p < a.n_pairs; p += blockDim.x) {
        const uint32_t e = (uint32_t)a.chosen[p];
        const uint32_t slot = a.starts[e] + atomicAdd(&fill[e], 1u);
        a.pair_token[slot] = p / a.k;
        a.pair_slot[p] = slot;
    }
}

__global__ void group_kernel(group_args a) {
    em_pdl_wait();
    extern __shared__ uint32_t fill[];
    group_pairs(a, fill);
}

/* Routing and grouping in one block, warp t routing token t (batches of up to 32 tokens: a decode
 * step waits on two launches less), then the fused norm's scaling by all threads (1024 with a
 * norm: 16 rows of 2048 are one round of 8 loads per thread). The choices a warp writes are
 * visible to the whole block after the barrier that group_pairs starts with. */
template <int PER_LANE>
__global__ void route_group_kernel(const float *router, int32_t *chosen, float *weight, uint32_t n_tokens,
                                   uint32_t n_expert, bool sigmoid, bool renormalize, float scale, route_norm norm,
                                   group_args g) {
    em_pdl_wait();
    extern __shared__ uint32_t fill[];
    __shared__ float factor[32];
    const uint32_t warp = threadIdx.x >> 5;
    if (warp < n_tokens) {
        route_token<PER_LANE>(router, chosen, weight, warp, n_expert, g.k, sigmoid, renormalize, scale);
        if (norm.xn) {
            const float *part = norm.ss + (uint64_t)warp * norm.ss_stride;
            const float f = em_warp_rms_factor(part, norm.ss_n, norm.cols, norm.eps);
            if ((threadIdx.x & 31) == 0) factor[warp] = f;
        }
    }
    group_pairs(g, fill); /* its barriers also publish factor[] */
    if (norm.xn) { /* UNROLL loads in flight per thread: a loop of one would wait on each */
        enum { UNROLL = 8 };
        const uint32_t quads = norm.cols / 4, total = n_tokens * quads;
        float4 *xn = (float4 *)norm.xn;
        for (uint32_t i0 = threadIdx.x; i0 < total; i0 += UNROLL * blockDim.x) {
            float4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (i0 + u * blockDim.x < total) v[u] = xn[i0 + u * blockDim.x];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const uint32_t i = i0 + u * blockDim.x;
                if (i >= total) break;
                const float f = factor[i / quads];
                v[u].x *= f, v[u].y *= f, v[u].z *= f, v[u].w *= f;
                xn[i] = v[u];
            }
        }
    }
}

/* Whether route_group_kernel takes the step: a warp per token in one block, 8 experts a lane. */
static bool route_in_one_block(const em_program_route *route, uint32_t n_tokens) {
    return n_tokens <= 32 && route->n_expert <= 256;
}

bool em_cuda_route_can_fold(const cuda_backend *b, uint32_t il, uint32_t n_tokens) {
    return route_in_one_block(&b->layers[il].route, n_tokens) && b->step.n_embd % 4 == 0;
}

em_err em_cuda_route(cuda_backend *b, uint32_t il, uint32_t n_tokens, const float *norm_ss) {
    const em_program_route *route = &b->layers[il].route;
    const bool sigmoid = route->gating == EM_GATING_SIGMOID, few = route->n_expert <= 128;
    const uint32_t k = route->n_used;
    const group_args g = {b->chosen, n_tokens * k, k, route->n_expert, b->expert_count, b->expert_start,
                          b->pair_token, b->pair_slot, b->expert_active, b->expert_active + b->max_expert};
    const size_t fill_bytes = route->n_expert * sizeof(uint32_t);
    if (norm_ss && !em_cuda_route_can_fold(b, il, n_tokens))
        return em_errorf(EM_ERR_INTERNAL, "cuda route: a fused norm for %u tokens of %u experts", n_tokens,
                         route->n_expert);
    if (route_in_one_block(route, n_tokens)) {
        const route_norm norm = {norm_ss ? b->xn : NULL, norm_ss, b->ss_n, b->ss_stride, b->step.n_embd, b->step.eps};
        em_cuda_launch(b, few ? route_group_kernel<4> : route_group_kernel<8>, 1, norm_ss ? 1024 : 32 * n_tokens,
                       fill_bytes, (const float *)b->router, b->chosen, b->chosen_weight, n_tokens, route->n_expert,
                       sigmoid, route->renormalize, route->scale, norm, g);
        CU_LAUNCHED();
        return NULL;
    }
    if (route->n_expert <= 256) {
        const uint32_t warps = 4, blocks = (n_tokens + warps - 1) / warps;
        em_cuda_launch(b, few ? route_warp_kernel<4> : route_warp_kernel<8>, blocks, warps * 32, 0,
                       (const float *)b->router, b->chosen, b->chosen_weight, n_tokens, route->n_expert, k, sigmoid,
                       route->renormalize, route->scale);
    } else {
        em_cuda_launch(b, route_kernel, (n_tokens + 127) / 128, 128, 0, b->router, b->chosen, b->chosen_weight,
                       n_tokens, route->n_expert, k, sigmoid, route->renormalize, route->scale);
    }
    CU_LAUNCHED();
    em_cuda_launch(b, group_kernel, 1, 1024, fill_bytes, g);
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
    /* [k] pair slots in expert order, [k] their weights, [k] the token's experts */
    extern __shared__ uint32_t order[];
    float *order_weight = (float *)(order + k);
    int32_t *experts = (int32_t *)(order + 2 * k);
    const uint32_t t = blockIdx.y, j = threadIdx.x;
    if (j < k) experts[j] = chosen[(uint64_t)t * k + j];
    __syncthreads();
    if (j < k) { /* choice j's place in expert order (the experts are distinct; ties would go by choice) */
        uint32_t rank = 0;
        for (uint32_t i = 0; i < k; i++) rank += experts[i] < experts[j] || (experts[i] == experts[j] && i < j);
        order[rank] = pair_slot[(uint64_t)t * k + j];
        order_weight[rank] = weight[(uint64_t)t * k + j];
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
    const uint32_t n_used = b->layers[il].route.n_used;
    const dim3 grid((b->step.n_embd + 255) / 256, n_tokens);
    if (next_norm_w && (!into_x || grid.x > b->ss_stride))
        return em_errorf(EM_ERR_INTERNAL, "cuda moe combine: a norm producer must add into x");
    if (n_used > 256) /* a thread of the block per choice */
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda moe combine: %u experts per token", n_used);
    if (next_norm_w) b->ss_n = grid.x;
    em_cuda_launch(b, combine_kernel, grid, 256, 3 * n_used * sizeof(uint32_t), into_x ? b->x : b->out,
                   (const float *)b->moe_y,
                   (const float *)(add_shared ? b->tmp : NULL), (const int32_t *)b->chosen,
                   (const float *)b->chosen_weight, (const uint32_t *)b->pair_slot, n_used, b->step.n_embd, into_x, next_norm_w,
                   b->step.plus_one, xw, b->ss, b->ss_stride);
    CU_LAUNCHED();
    return NULL;
}

