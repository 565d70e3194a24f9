/* Matrix times a few vectors, weights in their block format (internal.cuh: cuda_matvec): the
 * products of decode steps and small batches (gemm.cu takes larger ones).
 *
 * A warp computes RW rows (1, or 2 from 4 items up) for up to NT items at once: the lanes walk
 * the rows' 8-element groups (consecutive lanes take consecutive groups, so a warp's loads are
 * contiguous), each lane issuing the loads of 4-8 groups before the first multiply so that a
 * warp keeps a batch of loads in flight. Long rows are split over ks = 2, 4 or 8 warps of a block,
 * their sums added in a fixed order. Blocks of 8 warps walk the rows grid-stride. Each weight row
 * is read once per NT items; larger batches loop over chunks of NT items (a dense product with
 * few blocks for its rows spreads the chunks over grid layers, blockIdx.z). The per-item sums do
 * not depend on NT or on the other items, so a batched token gets exactly the logits it gets
 * alone (below MV_MANY_ITEMS items, from which dense products take a warp per row). Before
 * waiting for the previous kernel, each warp asks L2 for its first rows' weights.
 *
 * MoE uses the same kernel with grid rows (blockIdx.y) for the experts that have tokens: each
 * expert's matrices are read once for all the tokens routed to it.
 *
 * Fusions, since decode is bound by per-launch latency more than by bytes: Q, K and V as three
 * parts of one grid; the gate and up matrices of a gated unit row by row in the same warp, which
 * writes act(gate) * up directly; the residual add (accumulate); and the RMSNorm that starts a
 * sub-block, folded into the products (FOLD: the consumer reads x * norm weights written by its
 * producer and scales each result by the RMS factor from the producer's partial sums of squares). */
#include "matvec.cuh"

/* From this many items, a dense product takes a warp per row (em_cuda_matvec_with). */
#define MV_MANY_ITEMS 32u

__device__ __forceinline__ float dot8(const float v[8], float4 x0, float4 x1) {
    return v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x + v[5] * x1.y + v[6] * x1.z +
           v[7] * x1.w;
}

/* U consecutive strides of one lane (groups g, g + 32, ...) of RW rows: every weight load is
 * issued before the first multiply, so a warp keeps U * RW (twice that with GLU) 16-byte-ish
 * loads in flight. The caller makes sure all U groups exist: no branch separates the loads. */
template <int TYPE, int NT, int RW, bool GLU, int U>
__device__ __forceinline__ void mv_step(const uint8_t *const w[RW], const uint8_t *const w2[RW],
                                        const float *const x[NT], uint32_t g, float acc[RW][NT],
                                        float acc2[RW][NT]) {
    float v[U][RW][8], v2[U][RW][8];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int j = 0; j < RW; j++) {
            deq<TYPE>::get(w[j], g + 32 * u, v[u][j]);
            if (GLU) deq<TYPE>::get(w2[j], g + 32 * u, v2[u][j]);
        }
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *xp = (const float4 *)(x[t] + 8 * (g + 32 * u));
            const float4 x0 = xp[0], x1 = xp[1];
#pragma unroll
            for (int j = 0; j < RW; j++) {
                acc[j][t] += dot8(v[u][j], x0, x1);
                if (GLU) acc2[j][t] += dot8(v2[u][j], x0, x1);
            }
        }
}

/* Asks L2 for the weights of this warp's first rows before waiting for the previous kernel: the
 * weights do not depend on it, so their first fetch overlaps its tail (one request per 128-byte
 * line, up to 16 KB a row). MoE rows depend on the routing, which the previous kernels write. */
template <int RW, bool GLU> __device__ __forceinline__ void mv_prefetch(const mv_args &a) {
    if (a.counts) return;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t r0 = (blockIdx.x * (MV_WARPS / a.ks) + warp / a.ks) * RW;
    const uint64_t row_bytes = a.part[0].row_bytes, part_bytes = row_bytes / a.ks;
    const uint64_t first = (warp % a.ks) * part_bytes, span = part_bytes < (16u << 10) ? part_bytes : (16u << 10);
#pragma unroll
    for (int j = 0; j < RW; j++) {
        if (r0 + j >= a.rows) break;
        const uint8_t *w, *w2;
        float *y;
        uint64_t ys;
        mv_row(a, r0 + j, 0, &w, &w2, &y, &ys);
        for (uint64_t off = first + 128 * lane; off < first + span; off += 32 * 128) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(w + off));
            if (GLU) asm volatile("prefetch.global.L2 [%0];" ::"l"(w2 + off));
        }
    }
}

/* Each warp computes RW rows for NT items at a time (grid-stride over rows), lanes walking the
 * rows' 8-element groups. GLU: each row of w is paired with the same row of w2 and the warp
 * writes act(w row · x) * (w2 row · x). FOLD: X is x * norm weights and each item's result is
 * scaled by its RMS factor, from the partial sums of squares its producer left (cuda_matvec).
 * A producer (a.next_ss) also writes Y * next norm weights and its blocks' partial sums of Y^2. */
template <int TYPE, int NT, int RW, bool GLU, bool FOLD>
__global__ void __launch_bounds__(MV_THREADS) matvec_kernel(mv_args a) {
    mv_prefetch<RW, GLU>(a);
    em_pdl_wait();
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    mv_group grp;
    if (!mv_group_of(a, blockIdx.y, &grp)) return;
    const uint32_t count = grp.count, start = grp.start;
    const uint64_t mat_offset = grp.mat_offset;
    constexpr int U = RW * (GLU ? 2 : 1) >= 2 ? 4 : 8;
    const uint32_t c_begin = a.item_chunk ? blockIdx.z * a.item_chunk : 0;
    const uint32_t c_end = a.item_chunk ? min(count, c_begin + a.item_chunk) : count;
    for (uint32_t c = c_begin; c < c_end; c += NT) {
        const float *x[NT];
        float scale[NT], ssum[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint32_t i = start + min(c + t, count - 1); /* past the end: re-read the last item */
            const uint64_t xrow = a.x_index ? a.x_index[i] : i;
            x[t] = a.x + xrow * a.x_stride;
            scale[t] = 1.0f, ssum[t] = 0.0f;
        }
        if (FOLD) {
            /* the chunk's RMS factors, once per block (not once per warp: the partials would be
             * read eight times over): the threads sum the producer's partials in a fixed order,
             * the same in every block, so every block gets the same factors */
            __shared__ float fold_part[MV_WARPS][8], fold_scale[8];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const uint32_t i = start + min(c + t, count - 1);
                const float *part = a.norm_ss + (uint64_t)(a.x_index ? a.x_index[i] : i) * a.ss_stride;
                float sq = 0.0f;
                for (uint32_t k = threadIdx.x; k < a.norm_n; k += MV_THREADS) sq += part[k];
                sq = em_warp_sum(sq);
                if (lane == 0) fold_part[warp][t] = sq;
            }
            __syncthreads();
            if (threadIdx.x < NT) {
                float total = 0.0f;
                for (int w = 0; w < MV_WARPS; w++) total += fold_part[w][threadIdx.x];
                fold_scale[threadIdx.x] = rsqrtf(total / (8 * a.groups) + a.eps);
            }
            __syncthreads();
#pragma unroll
            for (int t = 0; t < NT; t++) scale[t] = fold_scale[t];
        }
        /* the block's warps form MV_WARPS / ks row sets of ks warps, each warp of a set taking a
         * slice of the row (whole multiples of 32 groups); all warps loop the same number of times */
        const uint32_t sets = MV_WARPS / a.ks, set = warp / a.ks, kq = warp % a.ks;
        const uint32_t slice = ((a.groups + a.ks - 1) / a.ks + 31) & ~31u;
        const uint32_t g_begin = kq * slice, g_end = min(a.groups, g_begin + slice);
        for (uint32_t base = blockIdx.x * sets * RW; base < a.rows; base += gridDim.x * sets * RW) {
            const uint32_t r0 = base + set * RW;
            const uint8_t *w[RW], *w2[RW];
            float *y[RW];
            uint64_t ys[RW];
#pragma unroll
            for (int j = 0; j < RW; j++) {
                /* past the end: recompute the last row, never write */
                mv_row(a, min(r0 + j, a.rows - 1), mat_offset, &w[j], &w2[j], &y[j], &ys[j]);
                if (r0 + j < a.rows)
                    y[j] += (uint64_t)start * ys[j];
                else
                    y[j] = NULL;
            }
            float acc[RW][NT], acc2[RW][NT];
#pragma unroll
            for (int j = 0; j < RW; j++)
#pragma unroll
                for (int t = 0; t < NT; t++) acc[j][t] = acc2[j][t] = 0.0f;
            uint32_t g = g_begin + lane;
            for (; g + 32 * (U - 1) < g_end; g += 32 * U) mv_step<TYPE, NT, RW, GLU, U>(w, w2, x, g, acc, acc2);
            for (; g < g_end; g += 32) mv_step<TYPE, NT, RW, GLU, 1>(w, w2, x, g, acc, acc2);
#pragma unroll
            for (int j = 0; j < RW; j++)
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) {
                        acc[j][t] += __shfl_xor_sync(0xffffffffu, acc[j][t], off);
                        if (GLU) acc2[j][t] += __shfl_xor_sync(0xffffffffu, acc2[j][t], off);
                    }
            if (a.ks > 1) {
                /* the set's slices meet in shared memory and are summed in slice order */
                __shared__ float red[2][MV_WARPS][2][8];
                if (lane == 0)
#pragma unroll
                    for (int j = 0; j < RW; j++)
#pragma unroll
                        for (int t = 0; t < NT; t++) red[0][warp][j][t] = acc[j][t], red[1][warp][j][t] = acc2[j][t];
                __syncthreads();
                if (kq == 0 && lane == 0)
#pragma unroll
                    for (int j = 0; j < RW; j++)
#pragma unroll
                        for (int t = 0; t < NT; t++) {
                            float s1 = 0.0f, s2 = 0.0f;
                            for (uint32_t q = 0; q < a.ks; q++) s1 += red[0][warp + q][j][t], s2 += red[1][warp + q][j][t];
                            acc[j][t] = s1, acc2[j][t] = s2;
                        }
                __syncthreads();
            }
            if (lane == 0 && kq == 0) {
#pragma unroll
                for (int j = 0; j < RW; j++) {
                    if (!y[j]) continue;
#pragma unroll
                    for (int t = 0; t < NT; t++)
                        if (c + t < count) {
                            float *dst = y[j] + (uint64_t)(c + t) * ys[j];
                            const float r = GLU ? mv_glu(scale[t] * acc[j][t], scale[t] * acc2[j][t], a.act)
                                                : scale[t] * acc[j][t];
                            const float v = a.accumulate ? *dst + r : r;
                            *dst = v;
                            if (a.next_ss) { /* a producer: one part, so the row is r0 + j */
                                const float w = a.next_norm_w[r0 + j];
                                a.next_xw[dst - a.part[0].y] = v * (a.plus_one ? 1.0f + w : w);
                                ssum[t] += v * v;
                            }
                        }
                }
            }
        }
        if (a.next_ss) {
            /* the block's partial sum of squares per item, over its warps in order */
            __shared__ float block_ss[MV_WARPS][8];
            if (lane == 0)
#pragma unroll
                for (int t = 0; t < NT; t++) block_ss[warp][t] = ssum[t];
            __syncthreads();
            if (threadIdx.x < NT && c + threadIdx.x < count) {
                float total = 0.0f;
                for (int w = 0; w < MV_WARPS; w++) total += block_ss[w][threadIdx.x];
                a.next_ss[(uint64_t)(start + c + threadIdx.x) * a.ss_stride + blockIdx.x] = total;
            }
            __syncthreads();
        }
    }
}

em_err mv_producer_blocks(cuda_backend *b, const mv_args &a, uint32_t blocks, const char *kernel) {
    if (!a.next_ss) return NULL;
    if (blocks > b->ss_stride)
        return em_errorf(EM_ERR_INTERNAL, "%s: %u blocks of partial sums, room for %u", kernel, blocks, b->ss_stride);
    b->ss_n = blocks;
    return NULL;
}

template <int TYPE, int NT, bool GLU, bool FOLD>
static em_err launch_kernel(cuda_backend *b, const mv_args &args, uint32_t grid_y) {
    /* two rows per warp once several items share them: each X value loaded then feeds two rows */
    constexpr int RW = NT >= 4 && !GLU ? 2 : 1;
    const uint32_t per_block = MV_WARPS / args.ks * RW;
    const uint32_t blocks = (args.rows + per_block - 1) / per_block;
    em_err err = mv_producer_blocks(b, args, blocks, "cuda matvec");
    if (err) return err;
    /* A dense product of few rows and many items (a MoE router in a prefill) would leave most
     * multiprocessors idle while its few blocks walk the items pass after pass: the items are
     * spread over grid layers instead, for about a full set of resident blocks (8 per
     * multiprocessor). Each item is still computed by the same rows' blocks in the same order. */
    mv_args a = args;
    uint32_t layers = 1;
    const uint32_t passes = (a.n_items + NT - 1) / NT;
    if (!a.counts && passes > 1) {
        const uint64_t target = 8ull * b->n_sm;
        const uint32_t per_layer = (uint32_t)(((uint64_t)passes * blocks + target - 1) / target);
        if (per_layer < passes) {
            a.item_chunk = per_layer * NT;
            layers = (passes + per_layer - 1) / per_layer;
        }
    }
    em_cuda_launch(b, matvec_kernel<TYPE, NT, RW, GLU, FOLD>, dim3(blocks, grid_y, layers), MV_THREADS, 0, a);
    return NULL;
}

template <int TYPE, bool GLU, bool NORM>
static em_err launch_nt(cuda_backend *b, const mv_args &a, uint32_t grid_y, int nt) {
    switch (nt) {
    case 1: return launch_kernel<TYPE, 1, GLU, NORM>(b, a, grid_y);
    case 2: return launch_kernel<TYPE, 2, GLU, NORM>(b, a, grid_y);
    case 4: return launch_kernel<TYPE, 4, GLU, NORM>(b, a, grid_y);
    default: return launch_kernel<TYPE, 8, GLU, NORM>(b, a, grid_y);
    }
}

template <int TYPE>
static em_err launch_type(cuda_backend *b, const mv_args &a, uint32_t grid_y, int nt, bool glu, bool norm) {
    if (glu) return norm ? launch_nt<TYPE, true, true>(b, a, grid_y, nt) : launch_nt<TYPE, true, false>(b, a, grid_y, nt);
    return norm ? launch_nt<TYPE, false, true>(b, a, grid_y, nt) : launch_nt<TYPE, false, false>(b, a, grid_y, nt);
}

bool em_cuda_type_supported(uint32_t type) {
    return em_cuda_with_type<true>(type, [](auto) {});
}

em_err em_cuda_product_args(const cuda_backend *b, const cuda_matvec *mv, cuda_product_args *a) {
    const cuda_weight *w = mv->w;
    const uint32_t n_parts = mv->n_parts ? mv->n_parts : 1;
    if (mv->up && (mv->up->type != w->type || mv->up->cols != w->cols || mv->up->rows != w->rows))
        return em_errorf(EM_ERR_INTERNAL, "cuda product: gate and up matrices differ in type or shape");
    if (n_parts > EM_CUDA_PARTS) return em_errorf(EM_ERR_INTERNAL, "cuda product: %u parts", n_parts);
    a->rows = 0;
    for (uint32_t i = 0; i < n_parts; i++) {
        const cuda_weight *wi = i == 0 ? w : mv->more[i - 1].w;
        if (wi->type != w->type || wi->cols != w->cols)
            return em_errorf(EM_ERR_INTERNAL, "cuda product: fused matrices differ in type or width");
        a->part[i] = cuda_part{wi->data, mv->up ? mv->up->data : NULL, wi->row_bytes, a->rows, a->rows + wi->rows,
                               i == 0 ? mv->y : mv->more[i - 1].y, i == 0 ? mv->y_stride : mv->more[i - 1].y_stride};
        a->rows += wi->rows;
    }
    a->n_parts = n_parts;
    a->mat_bytes = (uint64_t)w->rows * w->row_bytes;
    a->cols = w->cols;
    a->x = mv->x;
    a->x_stride = mv->x_stride;
    a->x_index = mv->x_index;
    a->n_items = mv->n_items;
    a->counts = mv->counts;
    a->starts = mv->starts;
    a->act = b->step.act;
    a->accumulate = mv->accumulate;
    return NULL;
}

uint32_t em_cuda_matvec_rows(const cuda_matvec *mv) {
    uint32_t rows = mv->w->rows;
    for (uint32_t i = 1; i < mv->n_parts && i < EM_CUDA_PARTS; i++) rows += mv->more[i - 1].w->rows;
    return rows;
}

bool em_cuda_matvec_can_fuse(const cuda_weight *a, const cuda_weight *b) {
    return a->data && b->data && a->type == b->type && a->cols == b->cols;
}

em_err em_cuda_matvec(cuda_backend *b, const cuda_matvec *mv) { return em_cuda_matvec_with(b, mv, EM_CUDA_MATVEC_AUTO); }

em_err em_cuda_matvec_with(cuda_backend *b, const cuda_matvec *mv, em_cuda_matvec_kernel kernel) {
    if (kernel == EM_CUDA_MATVEC_AUTO) {
        kernel = em_cuda_kernel_for(b, mv);
        if (b->tuning.trace && mv->n_items) em_cuda_trace_product(b, mv, kernel);
    }
    if (kernel == EM_CUDA_MATVEC_GEMM || kernel == EM_CUDA_MATVEC_WGMMA)
        return em_cuda_gemm_with(b, mv, 0, kernel == EM_CUDA_MATVEC_WGMMA ? EM_CUDA_GEMM_WGMMA : EM_CUDA_GEMM_MMA);
    const cuda_weight *w = mv->w;
    const uint32_t n_parts = mv->n_parts ? mv->n_parts : 1;
    if (mv->n_items == 0) return NULL;
    if (w->cols % 8 || mv->x_stride % 4)
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda matvec: %u columns, activation stride %llu", w->cols,
                         (unsigned long long)mv->x_stride);
    if (n_parts > MV_PARTS || (n_parts > 1 && (mv->counts || mv->up)))
        return em_errorf(EM_ERR_INTERNAL, "cuda matvec: %u parts", n_parts);
    if ((mv->norm_ss || mv->next_norm_w) && mv->counts)
        return em_errorf(EM_ERR_INTERNAL, "cuda matvec: a fused norm on expert products");
    if (mv->next_norm_w && (n_parts > 1 || !mv->accumulate || w->rows != b->step.n_embd))
        return em_errorf(EM_ERR_INTERNAL, "cuda matvec: a norm producer must add into x");
    mv_args a = {};
    em_err err = em_cuda_product_args(b, mv, &a);
    if (err) return err;
    const uint32_t rows = a.rows;
    a.groups = w->cols / 8;
    a.active = mv->active;
    a.n_active = mv->n_active;
    a.norm_ss = mv->norm_ss;
    a.norm_n = mv->norm_n;
    a.ss_stride = b->ss_stride;
    a.next_norm_w = mv->next_norm_w;
    a.next_xw = mv->next_xw;
    a.next_ss = mv->next_norm_w ? b->ss : NULL;
    /* Long rows of matrices with few rows: several warps per row, so that each warp's share is a
     * single batch of loads in flight rather than several batches one after the other. */
    a.ks = rows >= 16384 ? 1 : a.groups >= 512 ? 4 : a.groups >= 256 ? 2 : 1;
    /* and matrices of very few rows (a MoE router), up to all 8 warps on a row, for a grid of at
     * least one block per multiprocessor (counted with one row per warp, so the split does not
     * depend on the batch) */
    while (!mv->counts && a.ks < MV_WARPS && rows * a.ks < MV_WARPS * (uint32_t)b->n_sm && a.groups / (2 * a.ks) >= 32)
        a.ks *= 2;
    a.eps = b->step.eps;
    a.plus_one = b->step.plus_one;
    if (kernel == EM_CUDA_MATVEC_IMMA) return em_cuda_imma(b, mv, a);
    if (kernel == EM_CUDA_MATVEC_DP4A) return em_cuda_dq(b, mv, a);
    if (kernel == EM_CUDA_MATVEC_TC) return em_cuda_mvt(b, mv, a);
    /* A dense product of many items (a MoE router in a prefill) spreads its items over grid layers
     * instead (launch_kernel), and a warp to a row lets each block read the items' activations
     * once for eight times as many rows; a batch that large takes gemm.cu's kernels for its other
     * products anyway, so its sums already differ from a decode step's. */
    if (!mv->counts && mv->n_items >= MV_MANY_ITEMS) a.ks = 1;
    const int nt = mv_items_per_pass(mv->n_items);
    const uint32_t grid_y = !mv->counts ? 1 : mv->active ? mv->n_active_max : mv->n_groups;
    const bool glu = mv->up != NULL, norm = mv->norm_ss != NULL;
    if (!em_cuda_with_type<true>(w->type, [&](auto t) { err = launch_type<decltype(t)::value>(b, a, grid_y, nt, glu, norm); }))
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda matvec: weight type %s", em_type_name(w->type));
    if (err) return err;
    CU_LAUNCHED();
    return NULL;
}

/* ---- token embeddings: rows of token_embd, decoded and scaled ----
 * With norm_w, also the first layer's fused norm producer (cuda_matvec): xw = x * norm_w and the
 * row's sum of squares as its single partial sum. */

#define EMBED_THREADS 128

template <int TYPE>
__global__ void __launch_bounds__(EMBED_THREADS)
    embed_kernel(const uint8_t *table, uint64_t row_bytes, uint32_t groups, const int32_t *tokens,
                 const int32_t *picked, float scale, float *x, uint32_t n_embd, const float *norm_w, bool plus_one,
                 float *xw, float *ss, uint32_t ss_stride) {
    em_pdl_wait();
    __shared__ float warp_ss[EMBED_THREADS / 32];
    const uint32_t t = blockIdx.x;
    const int32_t token = tokens[t] >= 0 ? tokens[t] : picked[-1 - tokens[t]]; /* EM_TOKEN_PICKED */
    const uint8_t *row = table + (uint64_t)token * row_bytes;
    float sq = 0.0f;
    for (uint32_t g = threadIdx.x; g < groups; g += blockDim.x) {
        float v[8];
        deq<TYPE>::get(row, g, v);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint64_t k = 8 * (uint64_t)g + i;
            const float e = v[i] * scale;
            x[(uint64_t)t * n_embd + k] = e;
            if (norm_w) {
                xw[(uint64_t)t * n_embd + k] = e * (plus_one ? 1.0f + norm_w[k] : norm_w[k]);
                sq += e * e;
            }
        }
    }
    if (!norm_w) return;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
    if ((threadIdx.x & 31) == 0) warp_ss[threadIdx.x >> 5] = sq;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < EMBED_THREADS / 32; w++) total += warp_ss[w];
        ss[(uint64_t)t * ss_stride] = total;
    }
}

em_err em_cuda_embed(cuda_backend *b, const cuda_batch *batch, float *x, const float *norm_w, float *xw) {
    const cuda_weight *w = &b->token_embd;
    const uint32_t n = batch->n_tokens, groups = w->cols / 8;
    const float scale = b->step.embd_scale;
    const bool plus_one = b->step.plus_one;
    if (norm_w) b->ss_n = 1;
#define EMBED(T)                                                                                                     \
    em_cuda_launch(b, embed_kernel<T>, n, EMBED_THREADS, 0, w->data, w->row_bytes, groups, batch->tokens,        \
                   (const int32_t *)b->picked, scale, x,                                                            \
                   w->cols, norm_w, plus_one, xw, b->ss, b->ss_stride)
    if (!em_cuda_with_type<true>(w->type, [&](auto t) { EMBED(decltype(t)::value); }))
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda embedding: type %s", em_type_name(w->type));
#undef EMBED
    CU_LAUNCHED();
    return NULL;
}

em_err em_cuda_products_setup(cuda_backend *b) {
    em_err err = em_cuda_mvt_setup();
    if (!err) err = em_cuda_dq_setup(b);
    return err ? err : em_cuda_gemm_setup(b);
}
