/* The persistent decode kernel's products (mega.cu): an instruction's input rows brought into
 * shared memory (f32, or rounded to 8 bits per chunk of 32 as the per-operation kernels round them),
 * and a warp's rows of a weight stage times those rows: decoded to f32 per 8 values (dequant.cuh's
 * deq<>) or, for the types dq_unit.cuh decodes, as bytes meeting the 8-bit activations in __dp4a. */
#pragma once

#include "mega.cuh"

/* Each lane's partial sums of the rows (and their up rows) -> the warp's sums, in every lane. */
template <int NT, int RW, bool GLU>
__device__ __forceinline__ void warp_sums(float acc[RW][NT], float acc2[RW][NT]) {
#pragma unroll
    for (int j = 0; j < RW; j++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            acc[j][t] = em_warp_sum(acc[j][t]);
            if (GLU) acc2[j][t] = em_warp_sum(acc2[j][t]);
        }
}

/* RW consecutive rows of a stage (with GLU their up rows, up_offset bytes further) times the NT
 * activation rows in shared memory, by one warp: the lanes walk the rows' 8-value groups, and
 * each activation value read serves all RW rows (shared memory, not the weights, bounds this
 * loop: every weight byte is written there by the copy and read once, every activation byte read
 * once per RW rows). Rows past n_rows are computed on row 0 and dropped. */
template <int TYPE, int NT, int RW, bool GLU>
__device__ __forceinline__ void dot_rows(const uint8_t *w, uint64_t row_bytes, uint64_t up_offset, uint32_t n_rows,
                                         const float *xs, const uint32_t (&x_off)[NT], uint32_t cols,
                                         float acc[RW][NT], float acc2[RW][NT]) {
    const uint32_t groups = cols / 8, lane = threadIdx.x & 31;
    const uint8_t *rows[RW];
#pragma unroll
    for (int j = 0; j < RW; j++) rows[j] = w + (j < (int)n_rows ? j : 0) * row_bytes;
    const float *xt[NT]; /* each token's row, worked out once: not re-read from the caller's array per group */
#pragma unroll
    for (int t = 0; t < NT; t++) xt[t] = xs + x_off[t];
    for (uint32_t g = lane; g < groups; g += 32) {
        float v[RW][8], v2[GLU ? RW : 1][8];
#pragma unroll
        for (int j = 0; j < RW; j++) {
            deq<TYPE>::get(rows[j], g, v[j]);
            if (GLU) deq<TYPE>::get(rows[j] + up_offset, g, v2[GLU ? j : 0]);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float *xp = xt[t] + 8 * g;
            const float4 x0 = *(const float4 *)xp, x1 = *(const float4 *)(xp + 4);
            const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
            for (int j = 0; j < RW; j++)
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    acc[j][t] += v[j][e] * x[e];
                    if (GLU) acc2[j][t] += v2[GLU ? j : 0][e] * x[e];
                }
        }
    }
    warp_sums<NT, RW, GLU>(acc, acc2);
}

template <int NT, int RW, bool GLU>
__device__ __forceinline__ void dot_rows_typed(uint32_t type, const uint8_t *w, uint64_t row_bytes, uint64_t up_offset,
                                               uint32_t n_rows, const float *xs, const uint32_t (&x_off)[NT],
                                               uint32_t cols, float acc[RW][NT], float acc2[RW][NT]) {
#define EM_DOT_ROWS(T) dot_rows<T, NT, RW, GLU>(w, row_bytes, up_offset, n_rows, xs, x_off, cols, acc, acc2)
    switch (type) {
    case EM_TYPE_F32: EM_DOT_ROWS(EM_TYPE_F32); break;
    case EM_TYPE_F16: EM_DOT_ROWS(EM_TYPE_F16); break;
    case EM_TYPE_BF16: EM_DOT_ROWS(EM_TYPE_BF16); break;
    case EM_TYPE_Q8_0: EM_DOT_ROWS(EM_TYPE_Q8_0); break;
    case EM_TYPE_Q4_K: EM_DOT_ROWS(EM_TYPE_Q4_K); break;
    case EM_TYPE_Q6_K: EM_DOT_ROWS(EM_TYPE_Q6_K); break;
    case EM_TYPE_IQ3_XXS: EM_DOT_ROWS(EM_TYPE_IQ3_XXS); break;
    }
#undef EM_DOT_ROWS
}

/* An instruction's input rows in shared memory: f32 values (xs, `cols` each), or rounded to 8 bits
 * (xq in dq_xchunk's layout, xq_stride bytes a row, and xd: a chunk's scales, cols / 32 a row). */
struct mega_input {
    const float *xs;
    const int8_t *xq;
    const float2 *xd;
    uint32_t cols, xq_stride;
    bool int8;
};

__device__ __forceinline__ mega_input input_at(float *smem, uint32_t rows, uint32_t cols, bool int8) {
    mega_input in = {smem, (const int8_t *)smem, NULL, cols, cols / DQ_UNIT * DQ_XUNIT, int8};
    in.xd = (const float2 *)((const uint8_t *)smem + ((uint64_t)rows * in.xq_stride + 15) / 16 * 16);
    return in;
}

/* The same product as dot_rows on 8-bit activations: the (row, unit of 64 values) pairs of the RW
 * rows spread over the lanes, each unit decoded to bytes once (dq_unit) for the NT tokens. */
template <int TYPE, int NT, int RW, bool GLU>
__device__ __forceinline__ void dot_rows_q(const uint8_t *w, uint64_t row_bytes, uint64_t up_offset, uint32_t n_rows,
                                           const mega_input &in, const uint32_t (&x_row)[NT], const uint32_t *lut,
                                           float acc[RW][NT], float acc2[RW][NT]) {
    const uint32_t units = in.cols / DQ_UNIT, chunks = in.cols / DQ_CHUNK, lane = threadIdx.x & 31;
    const int8_t *xq[NT]; /* each token's bytes and chunk scales, worked out once */
    const float2 *xd[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        xq[t] = in.xq + (uint64_t)x_row[t] * in.xq_stride, xd[t] = in.xd + (uint64_t)x_row[t] * chunks;
    for (uint32_t i = lane; i < n_rows * units; i += 32) {
        const uint32_t j = i / units, u = i - j * units;
        const uint8_t *row = w + (uint64_t)j * row_bytes;
        dq_unit<TYPE> g, h;
        g.load(row, u, lut);
        if (GLU) h.load(row + up_offset, u, lut);
        float s[NT], s2[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            s[t] = g.dot(xq[t], xd[t], u);
            s2[t] = GLU ? h.dot(xq[t], xd[t], u) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < RW; r++)
            if ((uint32_t)r == j)
#pragma unroll
                for (int t = 0; t < NT; t++) acc[r][t] += s[t], acc2[r][t] += s2[t];
    }
    warp_sums<NT, RW, GLU>(acc, acc2);
}

template <int NT, int RW, bool GLU>
__device__ __forceinline__ void dot_rows_q_typed(uint32_t type, const uint8_t *w, uint64_t row_bytes,
                                                 uint64_t up_offset, uint32_t n_rows, const mega_input &in,
                                                 const uint32_t (&x_row)[NT], const uint32_t *lut, float acc[RW][NT],
                                                 float acc2[RW][NT]) {
#define EM_DOT_ROWS_Q(T) dot_rows_q<T, NT, RW, GLU>(w, row_bytes, up_offset, n_rows, in, x_row, lut, acc, acc2)
    switch (type) {
    case EM_TYPE_Q8_0: EM_DOT_ROWS_Q(EM_TYPE_Q8_0); break;
    case EM_TYPE_Q4_K: EM_DOT_ROWS_Q(EM_TYPE_Q4_K); break;
    case EM_TYPE_Q6_K: EM_DOT_ROWS_Q(EM_TYPE_Q6_K); break;
    case EM_TYPE_IQ3_XXS: EM_DOT_ROWS_Q(EM_TYPE_IQ3_XXS); break;
    }
#undef EM_DOT_ROWS_Q
}

/* The end of an input's loading: scale[t] = the RMS factor of token t's n values from the
 * consumers' sums of squares ss[t] (summed over the warps in a fixed order, so every block gets
 * the same bits), or 1 without a norm; then the block's input is complete. */
template <int NT>
__device__ __forceinline__ void rms_scales(const mega_args &a, const float (&ss)[NT], bool norm, uint32_t n,
                                           float *scale) {
    __shared__ float part[MEGA_CONSUMERS][MEGA_MAX_TOKENS];
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (norm) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float s = em_warp_sum(ss[t]);
            if (lane == 0) part[warp][t] = s;
        }
    }
    consumer_sync();
    if (threadIdx.x < NT) {
        float total = 0.0f;
        for (int w = 0; w < MEGA_CONSUMERS; w++) total += norm ? part[w][threadIdx.x] : 0.0f;
        scale[threadIdx.x] = norm ? rsqrtf(total / n + a.eps) : 1.0f;
    }
    consumer_sync();
}

/* xs[t] = x[t] (n values each, read past L1), times the norm weights when norm_w is given; then
 * scale[t] is the RMS factor of x[t] (1 without a norm), which run_rows applies to the sums. The
 * sums of squares are added in a fixed order, so every block gets the same bits. */
template <int NT>
__device__ void load_input(const mega_args &a, const float *x, uint32_t n, const float *norm_w, float *xs,
                           float *scale) {
    float ss[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        ss[t] = 0.0f;
        for (uint32_t i = 4 * threadIdx.x; i < n; i += 4 * MEGA_CONSUMER_THREADS) {
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
    rms_scales<NT>(a, ss, norm_w != NULL, n, scale);
}

/* The input rows rounded to 8 bits into `in` (dq_round's rule per chunk of 32, as the per-operation
 * kernels round them) after the norm weights, and scale[t] as load_input sets it. Eight lanes a
 * chunk, four values a lane; a chunk's place among the warps depends on its column alone and the
 * rows of a chunk are walked in order, so a token's sums of squares come out the same whatever the
 * step's other tokens. Four rounds of loads in flight. */
template <int NT>
__device__ void load_input_q(const mega_args &a, const float *x, uint32_t rows, uint32_t cols, const float *norm_w,
                             const mega_input &in, float *scale) {
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane & 7;
    const uint32_t chunks = cols / DQ_CHUNK, slot = 4 * warp + (lane >> 3), slots = 4 * MEGA_CONSUMERS;
    const uint32_t per_slot = (chunks + slots - 1) / slots, tasks = per_slot * rows; /* (chunk, row) pairs */
    const float o = a.plus_one ? 1.0f : 0.0f;
    float ss[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) ss[t] = 0.0f;
    enum { ROUNDS = 4 };
    for (uint32_t k0 = 0; k0 < tasks; k0 += ROUNDS) {
        float4 v[ROUNDS], g[ROUNDS];
#pragma unroll
        for (int r = 0; r < ROUNDS; r++) { /* the loads first (norm weights too), all rounds in flight */
            const uint32_t k = k0 + r, c = slot + slots * (k / rows), row = k % rows;
            const bool live = k < tasks && c < chunks;
            const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            v[r] = live ? __ldcg((const float4 *)(x + (uint64_t)row * cols + c * DQ_CHUNK + 4 * sub)) : zero;
            g[r] = live && norm_w ? *(const float4 *)(norm_w + c * DQ_CHUNK + 4 * sub) : zero;
        }
#pragma unroll
        for (int r = 0; r < ROUNDS; r++) {
            const uint32_t k = k0 + r, c = slot + slots * (k / rows), row = k % rows;
            float4 w = v[r];
            if (norm_w && c < chunks) {
                const float sq = w.x * w.x + w.y * w.y + w.z * w.z + w.w * w.w;
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if ((uint32_t)t == row && k < tasks) ss[t] += sq;
                w.x *= g[r].x + o, w.y *= g[r].y + o, w.z *= g[r].z + o, w.w *= g[r].w + o;
            }
            float m = fmaxf(fmaxf(fabsf(w.x), fabsf(w.y)), fmaxf(fabsf(w.z), fabsf(w.w)));
            for (int off = 4; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
            const float d = m / 127.0f;
            const int4 q = dq_round4(w, d);
            int sum = q.x + q.y + q.z + q.w;
            for (int off = 4; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (k < tasks && c < chunks) {
                int8_t *xq = (int8_t *)in.xq + (uint64_t)row * in.xq_stride;
                *(uint32_t *)(dq_xchunk(xq, c) + 4 * sub) = (uint32_t)(q.x & 0xff) | (uint32_t)(q.y & 0xff) << 8 |
                                                           (uint32_t)(q.z & 0xff) << 16 | (uint32_t)q.w << 24;
                if (sub == 0) ((float2 *)in.xd)[(uint64_t)row * chunks + c] = dq_chunk_scales(d, 1.0f, sum);
            }
        }
    }
    rms_scales<NT>(a, ss, norm_w != NULL, cols, scale);
}
