/* The persistent decode kernel: a whole decode step of 1-4 sequences in one launch.
 *
 * A decode step reads every weight once; run as a kernel per operation (forward.cu), each kernel's
 * ramp and tail leave the memory idle, and at one sequence that idle time is most of the step. Here
 * one block per multiprocessor stays resident for the whole step and works through the step's
 * schedule (src/backend/schedule.h), built from the model description when the backend is made:
 *
 *   for each layer:  x += O · attention(QKV · norm(x));  x += down · act(gate · norm(x)) * (up · norm(x))
 *   logits = output · norm(x)
 *
 * Every instruction is spread over all blocks (each block a contiguous slice of the rows, its warps
 * a row each in turn), and ends at a grid barrier: a counter in global memory that every block
 * bumps and then waits on. So that the memory does not idle at the barriers, each block asks L2 for
 * the first bytes of its slice of the next instruction's weights (bulk prefetch, which needs no
 * registers or shared memory) before it waits: weights never depend on the activations.
 *
 * Norms are recomputed by every block from x (it reads x into shared memory as the products'
 * input anyway), so no instruction waits for a norm. Attention is split over spans of positions,
 * a warp per (token, query head, span); the span holding the token's own position finishes its
 * key and value (bias, QK-norm, RoPE; qkv.cuh) and the first query head of each group writes them
 * into the cache. The partial results are merged by every block as it loads the output
 * projection's input, which saves a barrier.
 *
 * Everything a block reads that other blocks wrote in this launch (x, q, k, v, the partials, the
 * gated unit's output) is read past L1 (ld.global.cg): L1 is not coherent between multiprocessors.
 * The sums of each token are computed in the same order whatever the number of tokens in the step,
 * so a sequence gets the same bits alone and batched. The watchdog in the barrier turns a wait of
 * seconds (a bug) into a kernel error instead of a hung GPU.
 *
 * Weight types: F32, F16, BF16, Q8_0, Q4_K, Q6_K (deq<> of dequant.cuh, f32 activations). Models
 * and steps it does not take run the kernels of forward.cu (em_cuda_mega_takes). */
#include "matvec.cuh" /* internal.cuh, dequant.cuh, mv_glu */
#include "qkv.cuh"

extern "C" {
#include "../schedule.h"
}

#define MEGA_WARPS 16
#define MEGA_THREADS (MEGA_WARPS * 32)
#define MEGA_MAX_TOKENS 4
#define MEGA_MAX_SPANS 64           /* attention partials per (token, query head) */
#define MEGA_MIN_SPAN 32            /* positions per attention item, at least */
#define MEGA_WATCHDOG (1ll << 33)   /* cycles a barrier may wait (seconds) before the kernel traps */

typedef struct mega_matrix {
    const uint8_t *data;
    uint64_t row_bytes;
    uint32_t rows, cols, type;
} mega_matrix;

typedef struct mega_layer {
    mega_matrix wq, wk, wv, wo, gate, up, down;
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm;
    __half *keys, *values;
    rope_args rope;
    uint32_t n_head, n_head_kv, head_dim, window;
    float scale, softcap;
} mega_layer;

typedef struct mega_args {
    const em_op *ops;
    uint32_t n_ops;
    const mega_layer *layers;
    mega_matrix output;
    const float *output_norm;
    float *x, *q, *k, *v, *attn, *h, *logits, *parts;
    uint32_t *att_done;              /* per (token, query head): spans finished (attention_item) */
    uint32_t attention_warps;        /* warps of a block that take attention items (shared memory) */
    const uint32_t *pos, *seq, *table_start, *blocks;
    uint32_t block_tokens, n_embd, n_vocab;
    float eps, final_softcap;
    bool plus_one;
    int act;
    unsigned long long *barrier;
    unsigned long long barrier_base; /* the counter's value when this launch started */
    uint32_t *failed_barrier;        /* the watchdog's report: which barrier timed out */
    unsigned long long *op_ns;       /* EMBER_CUDA_MEGA_PROFILE: per instruction, 3 sums of the nanoseconds
                                      * block 0 took: its input, its rows (or attention), the barrier
                                      * after (NULL: off) */
    bool row_prefetch;               /* EMBER_CUDA_MEGA_ROW_PREFETCH=0: no prefetch_first_row */
    uint32_t poll_ns;                /* EMBER_CUDA_MEGA_POLL_NS: a barrier's waiting thread sleeps this long between polls */
} mega_args;

/* The backend's persistent-kernel state (cuda_backend.mega). */
struct cuda_mega {
    em_schedule schedule;
    em_op *ops;                /* the schedule on the device */
    mega_layer *layers;        /* on the device */
    float *parts;
    uint32_t *att_done;
    uint32_t attention_warps;
    unsigned long long *barrier;
    uint32_t *failed_barrier;
    unsigned long long barriers_passed; /* the counter's value after the last launch */
    unsigned long long *op_ns;  /* EMBER_CUDA_MEGA_PROFILE: [instruction][3], summed over the steps (device) */
    uint32_t poll_ns;
    bool row_prefetch;
    uint32_t max_tokens;       /* the largest step whose shared memory fits */
    size_t smem[MEGA_MAX_TOKENS + 1];
    uint32_t max_head_dim, max_head;
    uint64_t steps;            /* steps run, for tests and the log */
};

/* ---- device side ---- */

__device__ __forceinline__ unsigned long long global_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* Every block waits until all blocks have arrived at barrier k of this launch. */
__device__ __noinline__ void grid_barrier(const mega_args &a, uint32_t k) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned long long target = a.barrier_base + (unsigned long long)k * gridDim.x;
        __threadfence();
        atomicAdd(a.barrier, 1ull);
        const long long start = clock64();
        while (load_acquire(a.barrier) < target) {
            if (a.poll_ns) __nanosleep(a.poll_ns);
            if (clock64() - start > MEGA_WATCHDOG) {
                atomicExch(a.failed_barrier, k);
                __threadfence();
                __trap();
            }
        }
    }
    __syncthreads();
}

/* The block's slice [begin, end) of `rows` rows. */
__device__ __forceinline__ void block_slice(uint32_t rows, uint32_t *begin, uint32_t *end) {
    *begin = (uint32_t)((uint64_t)rows * blockIdx.x / gridDim.x);
    *end = (uint32_t)((uint64_t)rows * (blockIdx.x + 1) / gridDim.x);
}

/* The matrices an instruction multiplies, as consecutive row ranges of one launch-wide row space
 * (Q, K, V: three parts), and the up matrix paired with the first (the gated unit). */
struct op_parts {
    const mega_matrix *m[3];
    const mega_matrix *up;
    uint32_t n, rows;
};

__device__ __forceinline__ op_parts parts_of(const mega_args &a, const em_op &op) {
    const mega_layer &L = a.layers[op.layer];
    op_parts p = {};
    switch (op.kind) {
    case EM_OP_QKV: p.m[0] = &L.wq, p.m[1] = &L.wk, p.m[2] = &L.wv, p.n = 3; break;
    case EM_OP_OUT_PROJ: p.m[0] = &L.wo, p.n = 1; break;
    case EM_OP_FFN_UP: p.m[0] = &L.gate, p.up = &L.up, p.n = 1; break;
    case EM_OP_FFN_DOWN: p.m[0] = &L.down, p.n = 1; break;
    case EM_OP_HEAD: p.m[0] = &a.output, p.n = 1; break;
    default: p.n = 0;
    }
    for (uint32_t i = 0; i < p.n; i++) p.rows += p.m[i]->rows;
    return p;
}

/* Asks L2 for this warp's first row (and up row) of instruction op, before the barrier that ends
 * the one before: the weights do not depend on it, so the first row's fetch overlaps the wait. */
__device__ void prefetch_first_row(const mega_args &a, const em_op &op) {
    const op_parts p = parts_of(a, op);
    if (!p.n) return;
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint32_t begin, end;
    block_slice(p.rows, &begin, &end);
    if (begin + warp >= end) return;
    uint32_t part = 0, row = begin + warp;
    while (part + 1 < p.n && row >= p.m[part]->rows) row -= p.m[part++]->rows;
    const mega_matrix &m = *p.m[part];
    const uint64_t bytes = min(m.row_bytes, (uint64_t)16384);
    for (uint64_t off = 128 * lane; off < bytes; off += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(m.data + row * m.row_bytes + off));
        if (p.up) asm volatile("prefetch.global.L2 [%0];" ::"l"(p.up->data + row * p.up->row_bytes + off));
    }
}

__device__ __forceinline__ float dot8(const float v[8], const float *x) {
    const float4 x0 = *(const float4 *)x, x1 = *(const float4 *)(x + 4);
    return v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x + v[5] * x1.y + v[6] * x1.z +
           v[7] * x1.w;
}

/* One row (and with GLU its up row) times the NT activation rows in shared memory, by one warp:
 * the lanes walk the row's 8-value groups, issuing U groups' loads before the first multiply. */
template <int TYPE, int NT, bool GLU>
__device__ __forceinline__ void dot_row(const uint8_t *w, const uint8_t *w2, const float *xs, uint32_t cols,
                                        float acc[NT], float acc2[NT]) {
    constexpr int U = GLU ? 4 : 8;
    const uint32_t groups = cols / 8, lane = threadIdx.x & 31;
    uint32_t g = lane;
    for (; g + 32 * (U - 1) < groups; g += 32 * U) {
        float v[U][8], v2[GLU ? U : 1][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            deq<TYPE>::get(w, g + 32 * u, v[u]);
            if (GLU) deq<TYPE>::get(w2, g + 32 * u, v2[GLU ? u : 0]);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float *x = xs + (uint64_t)t * cols + 8 * (g + 32 * u);
                acc[t] += dot8(v[u], x);
                if (GLU) acc2[t] += dot8(v2[GLU ? u : 0], x);
            }
    }
    for (; g < groups; g += 32) {
        float v[8], v2[8];
        deq<TYPE>::get(w, g, v);
        if (GLU) deq<TYPE>::get(w2, g, v2);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float *x = xs + (uint64_t)t * cols + 8 * g;
            acc[t] += dot8(v, x);
            if (GLU) acc2[t] += dot8(v2, x);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        acc[t] = em_warp_sum(acc[t]);
        if (GLU) acc2[t] = em_warp_sum(acc2[t]);
    }
}

template <int NT, bool GLU>
__device__ __forceinline__ void dot_row_typed(uint32_t type, const uint8_t *w, const uint8_t *w2, const float *xs,
                                              uint32_t cols, float acc[NT], float acc2[NT]) {
    switch (type) {
    case EM_TYPE_F32: dot_row<EM_TYPE_F32, NT, GLU>(w, w2, xs, cols, acc, acc2); break;
    case EM_TYPE_F16: dot_row<EM_TYPE_F16, NT, GLU>(w, w2, xs, cols, acc, acc2); break;
    case EM_TYPE_BF16: dot_row<EM_TYPE_BF16, NT, GLU>(w, w2, xs, cols, acc, acc2); break;
    case EM_TYPE_Q8_0: dot_row<EM_TYPE_Q8_0, NT, GLU>(w, w2, xs, cols, acc, acc2); break;
    case EM_TYPE_Q4_K: dot_row<EM_TYPE_Q4_K, NT, GLU>(w, w2, xs, cols, acc, acc2); break;
    case EM_TYPE_Q6_K: dot_row<EM_TYPE_Q6_K, NT, GLU>(w, w2, xs, cols, acc, acc2); break;
    }
}

/* The instruction's rows, the block's slice, a warp per row: y = scale[t] * (W · xs[t]), then per
 * kind QKV's outputs, x += y, the gated unit, or the logits. */
template <int NT>
__device__ void run_rows(const mega_args &a, const em_op &op, const float *xs, uint32_t cols, const float *scale) {
    const op_parts p = parts_of(a, op);
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint32_t begin, end;
    block_slice(p.rows, &begin, &end);
    for (uint32_t r = begin + warp; r < end; r += MEGA_WARPS) {
        uint32_t part = 0, row = r;
        while (part + 1 < p.n && row >= p.m[part]->rows) row -= p.m[part++]->rows;
        const mega_matrix &m = *p.m[part];
        float acc[NT], acc2[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = acc2[t] = 0.0f;
        const uint8_t *w = m.data + (uint64_t)row * m.row_bytes;
        if (p.up) {
            dot_row_typed<NT, true>(m.type, w, p.up->data + (uint64_t)row * p.up->row_bytes, xs, cols, acc, acc2);
        } else {
            dot_row_typed<NT, false>(m.type, w, NULL, xs, cols, acc, acc2);
        }
        if (lane >= NT) continue;
        /* lane t writes token t's result (a run-time index into acc would go to local memory) */
        float y = acc[0], y2 = acc2[0];
#pragma unroll
        for (int t = 1; t < NT; t++)
            if (lane == t) y = acc[t], y2 = acc2[t];
        const uint32_t t = lane;
        y *= scale[t], y2 *= scale[t];
        switch (op.kind) {
        case EM_OP_QKV: {
            float *out = part == 0 ? a.q : part == 1 ? a.k : a.v;
            out[(uint64_t)t * m.rows + row] = y;
            break;
        }
        case EM_OP_OUT_PROJ:
        case EM_OP_FFN_DOWN: {
            float *x = a.x + (uint64_t)t * a.n_embd + row;
            *x = __ldcg(x) + y;
            break;
        }
        case EM_OP_FFN_UP: a.h[(uint64_t)t * m.rows + row] = mv_glu(y, y2, a.act); break;
        case EM_OP_HEAD:
            if (a.final_softcap > 0.0f) y = a.final_softcap * tanhf(y / a.final_softcap);
            a.logits[(uint64_t)t * a.n_vocab + row] = y;
            break;
        }
    }
}

/* xs[t] = x[t] (n values each, read past L1), times the norm weights when norm_w is given; then
 * scale[t] is the RMS factor of x[t] (1 without a norm), which run_rows applies to the sums. The
 * sums of squares are added in a fixed order, so every block gets the same bits. */
template <int NT>
__device__ void load_input(const mega_args &a, const float *x, uint32_t n, const float *norm_w, float *xs,
                           float *scale) {
    __shared__ float part[MEGA_WARPS][MEGA_MAX_TOKENS];
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float ss[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        ss[t] = 0.0f;
        for (uint32_t i = 4 * threadIdx.x; i < n; i += 4 * MEGA_THREADS) {
            float4 v = __ldcg((const float4 *)(x + (uint64_t)t * n + i));
            ss[t] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            if (norm_w) {
                const float4 w = *(const float4 *)(norm_w + i);
                const float o = a.plus_one ? 1.0f : 0.0f;
                v.x *= w.x + o, v.y *= w.y + o, v.z *= w.z + o, v.w *= w.w + o;
            }
            *(float4 *)(xs + (uint64_t)t * n + i) = v;
        }
    }
    if (norm_w) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float s = em_warp_sum(ss[t]);
            if (lane == 0) part[warp][t] = s;
        }
    }
    __syncthreads();
    if (threadIdx.x < NT) {
        float total = 0.0f;
        for (int w = 0; w < MEGA_WARPS; w++) total += norm_w ? part[w][threadIdx.x] : 0.0f;
        scale[threadIdx.x] = norm_w ? rsqrtf(total / n + a.eps) : 1.0f;
    }
    __syncthreads();
}

__device__ __forceinline__ uint32_t first_position(uint32_t pos, uint32_t window) {
    return window && pos + 1 > window ? pos + 1 - window : 0;
}

/* Positions per attention item for a token at pos: a function of the token alone (not of the
 * batch), so a sequence's sums are the same alone and batched. */
__device__ __forceinline__ uint32_t span_of(uint32_t pos, uint32_t window) {
    const uint32_t context = pos + 1 - first_position(pos, window);
    const uint32_t span = (context + MEGA_MAX_SPANS - 1) / MEGA_MAX_SPANS;
    return max((uint32_t)MEGA_MIN_SPAN, (span + 31) / 32 * 32);
}

__device__ __forceinline__ uint32_t spans_of(uint32_t pos, uint32_t window) {
    const uint32_t span = span_of(pos, window);
    return (pos + 1 - first_position(pos, window) + span - 1) / span;
}

/* 16 bytes from global to shared memory without the registers (and past L1). */
__device__ __forceinline__ void copy16_async(void *dst, const void *src) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

/* A warp's shared memory for attention items of head size hd (bytes): the tile's keys (rows padded
 * by 16 bytes against bank conflicts) and values, then the query and the own key and value. */
__host__ __device__ constexpr uint32_t attention_warp_bytes(uint32_t hd) { return 32 * (hd * 2 + 16) + 32 * hd * 2 + 12 * hd; }

/* The last of a head's spans to finish merges the partials: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M). */
template <int HD>
__device__ void merge_head(const float *part, uint32_t n, float *out) {
    const uint32_t lane = threadIdx.x & 31;
    float m = -INFINITY;
    for (uint32_t s = lane; s < n; s += 32) m = fmaxf(m, __ldcg(part + s * (HD + 2) + HD));
    m = em_warp_max(m);
    float l = 0.0f;
    for (uint32_t s = lane; s < n; s += 32) {
        const float *ps = part + s * (HD + 2);
        l += __ldcg(ps + HD + 1) * expf(__ldcg(ps + HD) - m);
    }
    const float inv = 1.0f / em_warp_sum(l);
    float o[HD / 32];
#pragma unroll
    for (int i = 0; i < HD / 32; i++) o[i] = 0.0f;
    for (uint32_t s0 = 0; s0 < n; s0 += 32) {
        const float f = s0 + lane < n ? expf(__ldcg(part + (s0 + lane) * (HD + 2) + HD) - m) : 0.0f;
        const uint32_t k = min(32u, n - s0);
#pragma unroll 4
        for (uint32_t j = 0; j < k; j++) {
            const float fj = __shfl_sync(0xffffffffu, f, j);
            const float *ps = part + (s0 + j) * (HD + 2);
#pragma unroll
            for (int i = 0; i < HD / 32; i++) o[i] += __ldcg(ps + lane + 32 * i) * fj;
        }
    }
#pragma unroll
    for (int i = 0; i < HD / 32; i++) out[lane + 32 * i] = o[i] * inv;
}

/* A head's raw values (src + bias), lane l holding elements l, l + 32, ... (src read past L1). */
template <int HD> __device__ __forceinline__ void load_head(float r[HD / 32], const float *src, const float *bias) {
    const uint32_t lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < HD / 32; i++) r[i] = __ldcg(src + lane + 32 * i) + (bias ? bias[lane + 32 * i] : 0.0f);
}

/* qkv_head's work on a head already loaded by load_head (the same arithmetic in the same order, so
 * the same bits): into shared memory h, RMSNorm with `norm` when given, RoPE at pos when `rotate`. */
template <int HD>
__device__ __forceinline__ void finish_head(float *h, float r[HD / 32], const float *norm, float eps, bool plus_one,
                                            bool rotate, uint32_t pos, const rope_args &rope) {
    const uint32_t lane = threadIdx.x & 31;
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < HD / 32; i++) ss += r[i] * r[i];
    if (norm) {
        const float scale = rsqrtf(em_warp_sum(ss) / HD + eps);
#pragma unroll
        for (int i = 0; i < HD / 32; i++) {
            const float w = norm[lane + 32 * i];
            r[i] = r[i] * scale * (plus_one ? 1.0f + w : w);
        }
    }
#pragma unroll
    for (int i = 0; i < HD / 32; i++) h[lane + 32 * i] = r[i];
    __syncwarp();
    if (rotate) rope_head(h, pos, rope);
}

/* One warp's attention item: token t, query head hq, span s of positions, 32 positions a tile:
 * each lane copies its position's key and value row to shared memory (all in flight while the
 * query is finished), scores its key, then the warp adds the weighted values. The partial result
 * (unnormalized values, maximum, sum) goes to a.parts; the head's last span to finish merges them
 * into a.attn. The span holding the token's own position finishes its key and value (qkv.cuh),
 * puts them in its tile as the cache holds them (f16), and the group's first query head writes them
 * into the cache. */
template <int HD>
__device__ void attention_item(const mega_args &a, const mega_layer &L, uint32_t t, uint32_t hq, uint32_t s,
                               uint8_t *scratch) {
    constexpr int DL = HD / 32, KROW = HD + 8; /* halves a key row takes in shared memory */
    const uint32_t lane = threadIdx.x & 31, group = L.n_head / L.n_head_kv, g = hq / group;
    const uint32_t pos = a.pos[t], first = first_position(pos, L.window);
    const uint32_t span = span_of(pos, L.window), lo = first + s * span, hi = min(lo + span, pos + 1);
    const uint32_t *table = a.blocks + a.table_start[a.seq[t]];
    __half *ks = (__half *)scratch, *vs = ks + 32 * KROW;
    float *qh = (float *)(vs + 32 * HD), *kh = qh + HD, *vh = kh + HD;
    const bool own = lo <= pos && pos < hi;
    float m = -INFINITY, l = 0.0f, acc[DL];
#pragma unroll
    for (int i = 0; i < DL; i++) acc[i] = 0.0f;
    for (uint32_t p0 = lo; p0 < hi; p0 += 32) {
        const uint32_t p = p0 + lane;
        if (p < hi) {
            const uint32_t row = table[p / a.block_tokens] * a.block_tokens + p % a.block_tokens;
            const uint64_t off = ((uint64_t)row * L.n_head_kv + g) * HD;
#pragma unroll
            for (int c = 0; c < HD / 8; c++) {
                copy16_async(ks + lane * KROW + 8 * c, L.keys + off + 8 * c);
                copy16_async(vs + lane * HD + 8 * c, L.values + off + 8 * c);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        if (p0 == lo) {
            /* the raw query (and key, value) first, all loads in flight together, then each finished */
            float qr[DL], kr[DL], vr[DL];
            load_head<HD>(qr, a.q + ((uint64_t)t * L.n_head + hq) * HD, L.bq ? L.bq + hq * HD : NULL);
            if (own) {
                load_head<HD>(kr, a.k + ((uint64_t)t * L.n_head_kv + g) * HD, L.bk ? L.bk + g * HD : NULL);
                load_head<HD>(vr, a.v + ((uint64_t)t * L.n_head_kv + g) * HD, L.bv ? L.bv + g * HD : NULL);
            }
            finish_head<HD>(qh, qr, L.q_norm, a.eps, a.plus_one, true, pos, L.rope);
            if (own) {
                finish_head<HD>(kh, kr, L.k_norm, a.eps, a.plus_one, true, pos, L.rope);
                finish_head<HD>(vh, vr, NULL, a.eps, a.plus_one, false, pos, L.rope);
                if (hq % group == 0) {
                    const uint32_t row = table[pos / a.block_tokens] * a.block_tokens + pos % a.block_tokens;
                    const uint64_t off = ((uint64_t)row * L.n_head_kv + g) * HD;
                    for (uint32_t i = lane; i < HD; i += 32)
                        L.keys[off + i] = __float2half(kh[i]), L.values[off + i] = __float2half(vh[i]);
                }
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncwarp();
        if (own && p0 <= pos && pos < p0 + 32) { /* the own position, finished here, as the cache holds it */
            for (uint32_t i = lane; i < HD; i += 32)
                ks[(pos - p0) * KROW + i] = __float2half(kh[i]), vs[(pos - p0) * HD + i] = __float2half(vh[i]);
            __syncwarp();
        }
        float score = -INFINITY;
        if (p < hi) {
            float d = 0.0f;
#pragma unroll
            for (int c = 0; c < HD / 8; c++) {
                const uint4 u = *(const uint4 *)(ks + lane * KROW + 8 * c);
                const __half2 *h2 = (const __half2 *)&u;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float2 f = __half22float2(h2[j]);
                    d += qh[8 * c + 2 * j] * f.x + qh[8 * c + 2 * j + 1] * f.y;
                }
            }
            score = d * L.scale;
            if (L.softcap > 0.0f) score = L.softcap * tanhf(score / L.softcap);
        }
        const float m_new = fmaxf(m, em_warp_max(score));
        const float corr = expf(m - m_new), w = p < hi ? expf(score - m_new) : 0.0f;
        l = l * corr + em_warp_sum(w);
        m = m_new;
#pragma unroll
        for (int i = 0; i < DL; i++) acc[i] *= corr;
        const uint32_t n = min(32u, hi - p0);
#pragma unroll 8
        for (uint32_t j = 0; j < n; j++) {
            const float wj = __shfl_sync(0xffffffffu, w, j);
#pragma unroll
            for (int i = 0; i < DL; i++) acc[i] += wj * __half2float(vs[j * HD + lane + 32 * i]);
        }
        __syncwarp(); /* the tile is consumed before the next one's copies land */
    }
    const uint32_t head = t * L.n_head + hq, n_spans = spans_of(pos, L.window);
    float *part = a.parts + (uint64_t)head * MEGA_MAX_SPANS * (HD + 2);
    float *out = part + s * (HD + 2);
#pragma unroll
    for (int i = 0; i < DL; i++) out[lane + 32 * i] = acc[i];
    if (lane == 0) out[HD] = m, out[HD + 1] = l;
    if (n_spans == 1) {
        __syncwarp();
        merge_head<HD>(part, 1, a.attn + (uint64_t)head * HD);
        return;
    }
    /* the last span to finish merges (its partial and the others' are visible after the fences) */
    __threadfence();
    uint32_t done = 0;
    if (lane == 0) done = atomicAdd(a.att_done + head, 1u);
    done = __shfl_sync(0xffffffffu, done, 0);
    if (done + 1 == n_spans) {
        __threadfence();
        merge_head<HD>(part, n_spans, a.attn + (uint64_t)head * HD);
        if (lane == 0) a.att_done[head] = 0; /* for the next layer, after its barriers */
    }
}

template <int NT>
__device__ void run_attention(const mega_args &a, const em_op &op, uint8_t *smem) {
    const mega_layer &L = a.layers[op.layer];
    const uint32_t warp = threadIdx.x >> 5;
    if (warp >= a.attention_warps) return;
    uint8_t *scratch = smem + warp * attention_warp_bytes(L.head_dim);
    const uint32_t items = NT * L.n_head * MEGA_MAX_SPANS;
    for (uint32_t i = blockIdx.x * a.attention_warps + warp; i < items; i += gridDim.x * a.attention_warps) {
        /* spans innermost: the spans of a head on neighbouring warps */
        const uint32_t s = i % MEGA_MAX_SPANS, hq = (i / MEGA_MAX_SPANS) % L.n_head, t = i / MEGA_MAX_SPANS / L.n_head;
        if (s >= spans_of(a.pos[t], L.window)) continue;
        switch (L.head_dim) {
        case 32: attention_item<32>(a, L, t, hq, s, scratch); break;
        case 64: attention_item<64>(a, L, t, hq, s, scratch); break;
        case 128: attention_item<128>(a, L, t, hq, s, scratch); break;
        case 256: attention_item<256>(a, L, t, hq, s, scratch); break;
        }
    }
}

/* EMBER_CUDA_MEGA_PROFILE: block 0 adds the time since the last stamp to part `what` of
 * instruction i's sums. */
__device__ __forceinline__ void profile_stamp(const mega_args &a, unsigned long long *stamp, uint32_t i, int what) {
    if (!*stamp) return;
    const unsigned long long now = global_ns();
    a.op_ns[3 * i + what] += now - *stamp;
    *stamp = now;
}

template <int NT>
__global__ void __launch_bounds__(MEGA_THREADS, 1) mega_kernel(const __grid_constant__ mega_args a) {
    extern __shared__ __align__(16) float smem[];
    __shared__ float scale[MEGA_MAX_TOKENS];
    uint32_t barriers = 0;
    unsigned long long stamp = a.op_ns && blockIdx.x == 0 && threadIdx.x == 0 ? global_ns() : 0;
    for (uint32_t i = 0; i < a.n_ops; i++) {
        const em_op op = a.ops[i];
        const mega_layer &L = a.layers[op.layer];
        /* the instruction's input in shared memory (all but attention) */
        uint32_t cols = 0;
        switch (op.kind) {
        case EM_OP_QKV: load_input<NT>(a, a.x, cols = a.n_embd, L.attn_norm, smem, scale); break;
        case EM_OP_ATTENTION: break;
        case EM_OP_OUT_PROJ: load_input<NT>(a, a.attn, cols = L.n_head * L.head_dim, NULL, smem, scale); break;
        case EM_OP_FFN_UP: load_input<NT>(a, a.x, cols = a.n_embd, L.ffn_norm, smem, scale); break;
        case EM_OP_FFN_DOWN: load_input<NT>(a, a.h, cols = L.down.cols, NULL, smem, scale); break;
        case EM_OP_HEAD: load_input<NT>(a, a.x, cols = a.n_embd, a.output_norm, smem, scale); break;
        }
        profile_stamp(a, &stamp, i, 0);
        if (op.kind == EM_OP_ATTENTION) run_attention<NT>(a, op, (uint8_t *)smem);
        else run_rows<NT>(a, op, smem, cols, scale);
        if (a.op_ns) __syncthreads(); /* the profile's stamp after the whole block's rows */
        profile_stamp(a, &stamp, i, 1);
        if (a.row_prefetch)
            for (uint32_t j = i + 1; j < a.n_ops; j++)
                if (a.ops[j].kind != EM_OP_ATTENTION) {
                    prefetch_first_row(a, a.ops[j]);
                    break;
                }
        if (op.barrier_after) grid_barrier(a, ++barriers);
        else __syncthreads(); /* the block's shared memory is the next instruction's */
        profile_stamp(a, &stamp, i, 2);
    }
}

/* ---- host side ---- */

static bool type_taken(uint32_t type) {
    return type == EM_TYPE_F32 || type == EM_TYPE_F16 || type == EM_TYPE_BF16 || type == EM_TYPE_Q8_0 ||
           type == EM_TYPE_Q4_K || type == EM_TYPE_Q6_K;
}

/* Why w cannot be a matrix of the kernel, or NULL. */
static em_err matrix_of(const cuda_weight *w, const char *what, uint32_t il, mega_matrix *m) {
    if (!w->data) return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: no %s matrix", il, what);
    if (!type_taken(w->type) || w->n_mat != 1)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: %s matrix of type %s", il, what, em_type_name(w->type));
    const uint32_t unit = w->type == EM_TYPE_Q4_K || w->type == EM_TYPE_Q6_K ? 256 : w->type == EM_TYPE_Q8_0 ? 32 : 8;
    if (w->cols % unit || w->cols % 4)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: %s matrix of %u columns", il, what, w->cols);
    *m = mega_matrix{w->data, w->row_bytes, w->rows, w->cols, w->type};
    return NULL;
}

static em_err build_layers(const cuda_backend *b, mega_layer *out) {
    const em_model_desc *d = b->d;
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *ld = &d->layers[il];
        const cuda_layer *lw = &b->layers[il];
        mega_layer L = {};
        em_err err;
        if ((err = matrix_of(&lw->wq, "q", il, &L.wq)) || (err = matrix_of(&lw->wk, "k", il, &L.wk)) ||
            (err = matrix_of(&lw->wv, "v", il, &L.wv)) || (err = matrix_of(&lw->wo, "output", il, &L.wo)) ||
            (err = matrix_of(&lw->ffn_gate, "gate", il, &L.gate)) || (err = matrix_of(&lw->ffn_up, "up", il, &L.up)) ||
            (err = matrix_of(&lw->ffn_down, "down", il, &L.down)))
            return err;
        if (L.gate.type != L.up.type || L.gate.rows != L.up.rows)
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: gate and up matrices differ in type or shape", il);
        if (L.wq.cols != d->n_embd || L.wk.cols != d->n_embd || L.wv.cols != d->n_embd || L.gate.cols != d->n_embd ||
            L.wo.rows != d->n_embd || L.down.rows != d->n_embd || L.down.cols != L.gate.rows ||
            L.wq.rows != ld->n_head * ld->head_dim || L.wk.rows != ld->n_head_kv * ld->head_dim ||
            L.wv.rows != ld->n_head_kv * ld->head_dim || L.wo.cols != ld->n_head * ld->head_dim)
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: matrix shapes the schedule does not expect", il);
        if (!lw->attn_norm || !lw->ffn_norm) return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: no norm weights", il);
        L.attn_norm = lw->attn_norm, L.ffn_norm = lw->ffn_norm;
        L.bq = lw->bq, L.bk = lw->bk, L.bv = lw->bv, L.q_norm = lw->q_norm, L.k_norm = lw->k_norm;
        L.keys = (__half *)lw->keys, L.values = (__half *)lw->values;
        L.rope = em_cuda_rope_args(b, il);
        L.n_head = ld->n_head, L.n_head_kv = ld->n_head_kv, L.head_dim = ld->head_dim;
        L.window = ld->attn == EM_ATTN_SLIDING ? ld->window : 0;
        L.scale = ld->attn_scale, L.softcap = ld->attn_softcap;
        out[il] = L;
    }
    return NULL;
}

template <int NT> static em_err allow_smem(size_t bytes) {
    CU_TRY(cudaFuncSetAttribute(mega_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return NULL;
}

/* EMBER_CUDA_MEGA_PROFILE: the time of each instruction kind per step and the bytes of weights it
 * read per second, logged when the backend goes. The stamps are block 0's (each instruction's
 * time includes its barrier, so block 0 sees the slowest block). */
static void log_profile(const cuda_backend *b, const cuda_mega *m) {
    const uint32_t n = m->schedule.n_ops;
    unsigned long long *ns = (unsigned long long *)calloc(3 * n, sizeof *ns);
    if (!ns || !m->steps || cudaMemcpy(ns, m->op_ns, 3 * n * sizeof *ns, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(ns);
        return;
    }
    double kind_ns[EM_OP_KINDS] = {0}, kind_part[EM_OP_KINDS][3] = {}, kind_bytes[EM_OP_KINDS] = {0}, total = 0;
    for (uint32_t i = 0; i < n; i++) {
        const em_op *op = &m->schedule.ops[i];
        const cuda_layer *lw = &b->layers[op->layer];
        double bytes = 0;
        switch (op->kind) {
        case EM_OP_QKV:
            bytes = (double)lw->wq.rows * lw->wq.row_bytes + (double)lw->wk.rows * lw->wk.row_bytes +
                    (double)lw->wv.rows * lw->wv.row_bytes;
            break;
        case EM_OP_OUT_PROJ: bytes = (double)lw->wo.rows * lw->wo.row_bytes; break;
        case EM_OP_FFN_UP:
            bytes = (double)lw->ffn_gate.rows * lw->ffn_gate.row_bytes + (double)lw->ffn_up.rows * lw->ffn_up.row_bytes;
            break;
        case EM_OP_FFN_DOWN: bytes = (double)lw->ffn_down.rows * lw->ffn_down.row_bytes; break;
        case EM_OP_HEAD: bytes = (double)b->output.rows * b->output.row_bytes; break;
        }
        for (int k = 0; k < 3; k++) {
            const double t = (double)ns[3 * i + k] / m->steps;
            kind_part[op->kind][k] += t, kind_ns[op->kind] += t, total += t;
        }
        kind_bytes[op->kind] += bytes;
    }
    em_log(EM_LOG_INFO, "cuda mega profile over %llu steps: %.1f us a step", (unsigned long long)m->steps, total / 1e3);
    for (int k = 0; k < EM_OP_KINDS; k++)
        em_log(EM_LOG_INFO,
               "cuda mega profile: %-9s %7.1f us a step (%4.1f%%; input %.1f, work %.1f, barrier %.1f), weights "
               "%7.2f MB -> %6.0f GB/s",
               em_op_name((em_op_kind)k), kind_ns[k] / 1e3, 100.0 * kind_ns[k] / (total > 0 ? total : 1),
               kind_part[k][0] / 1e3, kind_part[k][1] / 1e3, kind_part[k][2] / 1e3, kind_bytes[k] / 1e6,
               kind_ns[k] > 0 ? kind_bytes[k] / kind_ns[k] : 0.0);
    free(ns);
}

void em_cuda_mega_free(cuda_backend *b) {
    cuda_mega *m = b->mega;
    if (!m) return;
    if (m->op_ns) log_profile(b, m);
    cudaFree(m->op_ns);
    cudaFree(m->ops);
    cudaFree(m->layers);
    cudaFree(m->parts);
    cudaFree(m->att_done);
    cudaFree(m->barrier);
    cudaFree(m->failed_barrier);
    em_schedule_free(&m->schedule);
    free(m);
    b->mega = NULL;
}

static em_err setup(cuda_backend *b, cuda_mega *m) {
    const em_model_desc *d = b->d;
    em_err err = em_schedule_build(d, &m->schedule);
    if (err) return err;
    if ((err = em_schedule_check(&m->schedule))) return err;
    if (b->kv_elem != 2) return em_errorf(EM_ERR_UNSUPPORTED, "the kernel reads an f16 KV cache");
    if (!b->output.data || !b->output_norm) return em_errorf(EM_ERR_UNSUPPORTED, "no output matrix or norm");
    mega_matrix output;
    if ((err = matrix_of(&b->output, "output head", d->n_layer, &output))) return err;
    if (output.cols != d->n_embd || output.rows != d->n_vocab || d->n_embd % 4)
        return em_errorf(EM_ERR_UNSUPPORTED, "output head of %u x %u", output.rows, output.cols);
    mega_layer *layers = (mega_layer *)calloc(d->n_layer, sizeof *layers);
    if (!layers) return em_errorf(EM_ERR_NOMEM, "out of memory for %u layers", d->n_layer);
    if ((err = build_layers(b, layers))) {
        free(layers);
        return err;
    }
    uint32_t widest = d->n_embd;
    for (uint32_t il = 0; il < d->n_layer; il++) {
        widest = max(widest, max(layers[il].down.cols, layers[il].wo.cols));
        m->max_head_dim = max(m->max_head_dim, layers[il].head_dim);
        m->max_head = max(m->max_head, layers[il].n_head);
        const uint32_t hd = layers[il].head_dim;
        if (hd != 32 && hd != 64 && hd != 128 && hd != 256) {
            free(layers);
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: head size %u (32, 64, 128, 256)", il, hd);
        }
    }
    cudaError_t status = cudaMalloc((void **)&m->layers, d->n_layer * sizeof *layers);
    if (status == cudaSuccess)
        status = cudaMemcpy(m->layers, layers, d->n_layer * sizeof *layers, cudaMemcpyHostToDevice);
    free(layers);
    if (status != cudaSuccess) return em_errorf(EM_ERR_INTERNAL, "uploading the layers: %s", cudaGetErrorString(status));
    CU_TRY(cudaMalloc((void **)&m->ops, m->schedule.n_ops * sizeof(em_op)));
    CU_TRY(cudaMemcpy(m->ops, m->schedule.ops, m->schedule.n_ops * sizeof(em_op), cudaMemcpyHostToDevice));
    CU_TRY(cudaMalloc((void **)&m->parts, (uint64_t)MEGA_MAX_TOKENS * m->max_head * MEGA_MAX_SPANS *
                                              (m->max_head_dim + 2) * sizeof(float)));
    m->poll_ns = em_cuda_env_count("EMBER_CUDA_MEGA_POLL_NS", 0);
    m->row_prefetch = !em_cuda_env_off("EMBER_CUDA_MEGA_ROW_PREFETCH");
    CU_TRY(cudaMalloc((void **)&m->att_done, (uint64_t)MEGA_MAX_TOKENS * m->max_head * sizeof(uint32_t)));
    CU_TRY(cudaMemset(m->att_done, 0, (uint64_t)MEGA_MAX_TOKENS * m->max_head * sizeof(uint32_t)));
    CU_TRY(cudaMalloc((void **)&m->barrier, sizeof *m->barrier));
    CU_TRY(cudaMemset(m->barrier, 0, sizeof *m->barrier));
    if (getenv("EMBER_CUDA_MEGA_PROFILE")) {
        CU_TRY(cudaMalloc((void **)&m->op_ns, 3 * m->schedule.n_ops * sizeof *m->op_ns));
        CU_TRY(cudaMemset(m->op_ns, 0, 3 * m->schedule.n_ops * sizeof *m->op_ns));
    }
    CU_TRY(cudaMalloc((void **)&m->failed_barrier, sizeof *m->failed_barrier));
    CU_TRY(cudaMemset(m->failed_barrier, 0, sizeof *m->failed_barrier));
    int smem_max = 0;
    CU_TRY(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, b->device));
    const size_t static_smem = 1024; /* load_input's reduction, the RMS factors */
    const size_t per_warp = attention_warp_bytes(m->max_head_dim);
    m->attention_warps = (uint32_t)min((size_t)MEGA_WARPS, ((size_t)smem_max - static_smem) / per_warp);
    for (uint32_t nt = 1; nt <= MEGA_MAX_TOKENS; nt++) {
        const size_t bytes = max((size_t)nt * widest * sizeof(float), m->attention_warps * per_warp);
        if (bytes + static_smem > (size_t)smem_max) break;
        m->smem[nt] = bytes;
        m->max_tokens = nt;
    }
    if (!m->max_tokens) return em_errorf(EM_ERR_UNSUPPORTED, "rows of %u values do not fit shared memory", widest);
    if ((err = allow_smem<1>(m->smem[1]))) return err;
    if (m->max_tokens >= 2 && (err = allow_smem<2>(m->smem[2]))) return err;
    if (m->max_tokens >= 3 && (err = allow_smem<3>(m->smem[3]))) return err;
    if (m->max_tokens >= 4 && (err = allow_smem<4>(m->smem[4]))) return err;
    return NULL;
}

/* Steps of up to this many sequences take the kernel unless EMBER_CUDA_MEGA says otherwise (0: none;
 * N: up to N, at most MEGA_MAX_TOKENS and what shared memory fits): where it measured faster than
 * the per-operation kernels (bench/RESULTS.md). */
#define MEGA_DEFAULT_TOKENS 0

em_err em_cuda_mega_setup(cuda_backend *b) {
    b->mega = NULL;
    const uint32_t wanted = em_cuda_env_count("EMBER_CUDA_MEGA", MEGA_DEFAULT_TOKENS);
    if (wanted == 0) return NULL;
    cuda_mega *m = (cuda_mega *)calloc(1, sizeof *m);
    if (!m) return em_errorf(EM_ERR_NOMEM, "out of memory for the persistent decode kernel");
    b->mega = m;
    em_err err = setup(b, m);
    if (!err) {
        m->max_tokens = min(m->max_tokens, wanted);
        em_log(EM_LOG_INFO, "cuda: decode steps of up to %u sequences run the persistent kernel (%u instructions)",
               m->max_tokens, m->schedule.n_ops);
        return NULL;
    }
    em_cuda_mega_free(b);
    /* a model the kernel does not take runs the per-operation kernels; a failing CUDA call is an error */
    if (em_err_code_of(err) == EM_ERR_UNSUPPORTED) {
        em_log(EM_LOG_INFO, "cuda: decode steps run per-operation kernels (persistent kernel: %s)", em_err_message(err));
        em_err_free(err);
        return NULL;
    }
    return em_err_prefix(err, "persistent decode kernel");
}

bool em_cuda_mega_takes(const cuda_backend *b, const cuda_batch *cb) {
    return b->mega && cb->one_per_seq && cb->n_segments == 0 && cb->n_tokens >= 1 &&
           cb->n_tokens <= b->mega->max_tokens && cb->n_rows == cb->n_tokens && !b->capturing;
}

uint64_t em_cuda_mega_steps(const em_backend *base) {
    const cuda_backend *b = (const cuda_backend *)base;
    return b->mega ? b->mega->steps : 0;
}

em_err em_cuda_mega_run(cuda_backend *b, const cuda_batch *cb) {
    cuda_mega *m = b->mega;
    const em_model_desc *d = b->d;
    em_err err = em_cuda_embed(b, cb, b->x, NULL, NULL);
    if (err) return err;
    mega_args a = {};
    a.ops = m->ops, a.n_ops = m->schedule.n_ops, a.layers = m->layers;
    a.output = mega_matrix{b->output.data, b->output.row_bytes, b->output.rows, b->output.cols, b->output.type};
    a.output_norm = b->output_norm;
    a.x = b->x, a.q = b->q, a.k = b->k, a.v = b->v, a.attn = b->attn, a.h = b->gate, a.logits = b->logits;
    a.parts = m->parts, a.att_done = m->att_done, a.attention_warps = m->attention_warps;
    a.pos = cb->pos, a.seq = cb->seq, a.table_start = cb->table_start, a.blocks = cb->blocks;
    a.block_tokens = b->base.block_tokens, a.n_embd = d->n_embd, a.n_vocab = d->n_vocab;
    a.eps = d->norm_eps, a.final_softcap = d->final_softcap, a.plus_one = d->norm == EM_NORM_RMS_PLUS_ONE;
    a.act = d->act;
    a.barrier = m->barrier, a.barrier_base = m->barriers_passed, a.failed_barrier = m->failed_barrier;
    a.op_ns = m->op_ns, a.poll_ns = m->poll_ns, a.row_prefetch = m->row_prefetch;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(b->n_sm);
    config.blockDim = dim3(MEGA_THREADS);
    config.dynamicSmemBytes = m->smem[cb->n_tokens];
    config.stream = b->stream;
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeCooperative; /* every block resident at once, or the launch fails */
    attr.val.cooperative = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    switch (cb->n_tokens) {
    case 1: CU_TRY(cudaLaunchKernelEx(&config, mega_kernel<1>, a)); break;
    case 2: CU_TRY(cudaLaunchKernelEx(&config, mega_kernel<2>, a)); break;
    case 3: CU_TRY(cudaLaunchKernelEx(&config, mega_kernel<3>, a)); break;
    case 4: CU_TRY(cudaLaunchKernelEx(&config, mega_kernel<4>, a)); break;
    default: return em_errorf(EM_ERR_INTERNAL, "persistent kernel: a step of %u tokens", cb->n_tokens);
    }
    m->barriers_passed += (unsigned long long)m->schedule.n_barriers * b->n_sm;
    m->steps++;
    return NULL;
}
