/* Decode products of quantized weights (Q8_0, Q4_K, Q6_K, IQ3_XXS, MXFP4) on activations rounded to 8
 * bits, with integer dot products (__dp4a: four byte products and their sum in one instruction).
 *
 * Why: the f32 kernel (matvec.cu) decodes every weight to f32 and multiplies it with an f32
 * activation, so every type runs at about the same weights per second and the low-bit types, with
 * fewer bytes per weight, read memory at a fraction of the bandwidth. Here each weight stays a
 * small integer: a lane assembles 64 of them as 16 words of signed bytes with shifts and masks,
 * and each word meets four activation bytes in one __dp4a. Per 32 values the weight block's scales
 * and the activation chunk's scale multiply the integer sums once.
 *
 * The activations: dq_quantize_kernel rounds each product's input once, per chunk of 32 values, to
 * bytes q = round(x / d) with d = max|x| / 127 (Q8_0's rounding), and keeps d and d * sum(q) (Q4_K's
 * offsets multiply the chunk's sum). The output heads' blocks, which loop over many row blocks,
 * round their items' rows themselves into shared memory instead (dq_stage, the same bits): their
 * warps then read the activations from shared memory, not from L1 for every row, while for the
 * other products a separate rounding kernel measured faster than every block repeating it. A
 * fused norm's consumer (norm_ss) gets its RMS factor folded into d, so the product itself has no
 * norm code. Items read their rows of X through x_index when given (the output head's gathered
 * rows, MoE pairs).
 *
 * The products: a lane takes 64-value units of a row (a Q8_0 or MXFP4 pair of blocks, a quarter of
 * a K-quant or IQ3_XXS super-block); `lanes` lanes (a power of two, 4-32, the fewest that cover a row's
 * units) share a row, so a warp takes 32 / lanes rows. It reads each unit once for up to NT = 8
 * items. Fusions as in matvec.cu: Q, K and V as parts of one grid, a gated unit's two matrices in
 * one pass, the residual add, a fused norm's producer (next_ss), MoE groups. Each item's result
 * depends on its own activations only, in a fixed order: a token gets the same bits alone as in
 * any batch.
 *
 * The rounding of activations to 8 bits is what llama.cpp's CUDA kernels and this engine's CPU
 * backend do for quantized weights (tests/cuda/check_cuda.c compares the device with an f32
 * reference and reports the error). em_cuda_kernel_for (tuning.cu) says when a product takes this
 * kernel; EMBER_CUDA_DP4A=0 switches it off, as does EMBER_CUDA_GEMM=0 (the f32 kernels only). */
#include "dq_unit.cuh"

/* ---- the product kernel ---- */

/* The rounding for products whose blocks take one row block each (all but the output heads): rows
 * of X (item i: row x_index[i] when given, else i) -> xq[i] in dq_stage's layout (units of 64
 * values DQ_XUNIT bytes apart) and xd[i][cols / 32], as dq_stage rounds them, once for all
 * blocks. One warp per chunk. imma: rows in matvec_imma.cu's order instead (dq_imma_byte, rows of
 * cols bytes), and of the scales only d f, a float per chunk (Q8_0 has no offsets to multiply). */
__global__ void dq_quantize_kernel(const float *x, uint64_t x_stride, const uint32_t *x_index, uint32_t cols,
                                   uint32_t n_rows, const float *norm_ss, uint32_t norm_n, uint32_t ss_stride,
                                   float eps, bool imma, int8_t *xq, float2 *xd) {
    em_pdl_wait();
    const uint32_t lane = threadIdx.x & 31, chunks = cols / DQ_CHUNK;
    const uint64_t w = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= (uint64_t)n_rows * chunks) return;
    const uint64_t row = w / chunks, c = w % chunks;
    const uint64_t src = x_index ? x_index[row] : row;
    const float v = x[src * x_stride + c * DQ_CHUNK + lane];
    float f = 1.0f;
    if (norm_ss) f = em_warp_rms_factor(norm_ss + src * ss_stride, norm_n, cols, eps);
    const float d = em_warp_max(fabsf(v)) / 127.0f;
    const int q = dq_round(v, d);
    if (imma) xq[row * cols + dq_imma_byte((uint32_t)c, lane)] = (int8_t)q;
    else dq_xchunk(xq + row * (chunks / 2 * DQ_XUNIT), (uint32_t)c)[lane] = (int8_t)q;
    const int sum = __reduce_add_sync(0xffffffffu, q);
    if (lane == 0 && imma) ((float *)xd)[row * chunks + c] = dq_chunk_scales(d, f, sum).x; /* no sums needed */
    else if (lane == 0) xd[row * chunks + c] = dq_chunk_scales(d, f, sum);
}

struct dq_args : mv_args {
    const int8_t *xq;    /* unstaged launches: the rounded rows (dq_quantize_kernel) */
    const float2 *xd;
    bool x_by_index;     /* unstaged MoE launches: item i reads rounded row x_index[i] */
    uint32_t lanes_log2; /* lanes per row: 1 << lanes_log2 */
    uint32_t row_blocks; /* blocks of MV_WARPS * (32 >> lanes_log2) rows; a block loops over them */
};

/* Items c .. c + n - 1 of the group (n <= 8): their rows of X (row x_index[i] when given, else i)
 * rounded to bytes into sx (n rows of cols / 64 units, DQ_XUNIT bytes apart), q = round(x / d) per
 * chunk of 32 with d = max|x| / 127 (Q8_0's rounding), and sxd[t][chunk] = {d f, d f * sum of the
 * chunk's bytes}, f the item's RMS factor with a fused norm (norm_ss; else 1). Eight lanes a chunk,
 * four values a lane, four chunks a warp, four rounds of loads in flight. Called by every thread of
 * the block; the caller synchronizes before sx is read. */
__device__ void dq_stage(const dq_args &a, const mv_group &grp, uint32_t c, uint32_t n, int8_t *sx, float2 *sxd) {
    __shared__ float fold[MV_WARPS];
    __shared__ uint32_t src[8];
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, chunks = a.cols / DQ_CHUNK;
    if (threadIdx.x < n) {
        const uint32_t i = grp.start + c + threadIdx.x;
        src[threadIdx.x] = a.x_index ? a.x_index[i] : i;
    }
    if (a.norm_ss && warp < n) { /* warp t: item t's factor, its partials summed in a fixed order */
        const uint32_t i = grp.start + c + warp;
        const float *part = a.norm_ss + (uint64_t)(a.x_index ? a.x_index[i] : i) * a.ss_stride;
        const float f = em_warp_rms_factor(part, a.norm_n, a.cols, a.eps);
        if (lane == 0) fold[warp] = f;
    }
    __syncthreads();
    const uint32_t tasks = n * chunks, sub = lane & 7, row_bytes = chunks / 2 * DQ_XUNIT;
    enum { ROUNDS = 4 };
    for (uint32_t k0 = 4 * warp; k0 < tasks; k0 += 4 * MV_WARPS * ROUNDS) {
        float4 v[ROUNDS];
#pragma unroll
        for (int r = 0; r < ROUNDS; r++) { /* the loads first, all rounds in flight */
            const uint32_t k = k0 + 4 * MV_WARPS * r + (lane >> 3), t = k / chunks, ch = k % chunks;
            v[r] = k < tasks ? *(const float4 *)(a.x + (uint64_t)src[t] * a.x_stride + ch * DQ_CHUNK + 4 * sub)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int r = 0; r < ROUNDS; r++) {
            const uint32_t k = k0 + 4 * MV_WARPS * r + (lane >> 3), t = k / chunks, ch = k % chunks;
            float m = fmaxf(fmaxf(fabsf(v[r].x), fabsf(v[r].y)), fmaxf(fabsf(v[r].z), fabsf(v[r].w)));
            for (int off = 4; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
            const float d = m / 127.0f;
            const int4 q = dq_round4(v[r], d);
            const int q0 = q.x, q1 = q.y, q2 = q.z, q3 = q.w;
            int sum = q0 + q1 + q2 + q3;
            for (int off = 4; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (k < tasks) {
                *(uint32_t *)(sx + t * row_bytes + DQ_XUNIT * (ch >> 1) + DQ_CHUNK * (ch & 1) + 4 * sub) =
                    (uint32_t)(q0 & 0xff) | (uint32_t)(q1 & 0xff) << 8 | (uint32_t)(q2 & 0xff) << 16 | (uint32_t)q3 << 24;
                if (sub == 0) sxd[t * chunks + ch] = dq_chunk_scales(d, a.norm_ss ? fold[t] : 1.0f, sum);
            }
        }
    }
}

/* Items c .. c + NT - 1 of the warp's row (all of them exist; their rounded rows at sx / sxd in
 * shared memory when STAGED, else at a.xq / a.xd from dq_quantize_kernel): each unit of the row is read once for all NT, then the row's results (and a
 * producer's outputs, its partial sums at index rb) are written. Called by every thread of the
 * block (a producer's partial sums meet in shared memory). */
template <int TYPE, int NT, bool GLU, bool STAGED>
__device__ __forceinline__ void dq_items(const dq_args &a, const mv_group &grp, uint32_t c, const uint8_t *w,
                                         const uint8_t *w2, float *y, uint64_t ys, uint32_t row, bool live,
                                         const uint32_t *lut, const int8_t *sx, const float2 *sxd, uint32_t rb) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t lanes = 1u << a.lanes_log2, sub = lane & (lanes - 1);
    const uint32_t units = a.cols / DQ_UNIT, chunks = a.cols / DQ_CHUNK;
    const int8_t *xr[NT];
    const float2 *xdr[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if constexpr (STAGED) {
            xr[t] = sx + t * units * DQ_XUNIT, xdr[t] = sxd + t * chunks;
        } else {
            const uint32_t i = grp.start + c + t;
            const uint64_t xrow = a.x_by_index ? a.x_index[i] : i;
            xr[t] = a.xq + xrow * units * DQ_XUNIT, xdr[t] = a.xd + xrow * chunks;
        }
    }
    float acc[NT], acc2[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = acc2[t] = 0.0f;
    /* two units in flight per loop for the plain 1-2 item passes; the gated and wider ones keep
     * one, which holds their registers low enough for the blocks to stay resident */
    constexpr int UNROLL = GLU || NT >= 4 ? 1 : 2;
#pragma unroll UNROLL
    for (uint32_t u = sub; u < units; u += lanes) {
        dq_unit<TYPE> wu, wu2;
        wu.load(w, u, lut);
        if (GLU) wu2.load(w2, u, lut);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            acc[t] += wu.dot(xr[t], xdr[t], u);
            if (GLU) acc2[t] += wu2.dot(xr[t], xdr[t], u);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
        for (uint32_t off = lanes >> 1; off > 0; off >>= 1) {
            acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
            if (GLU) acc2[t] += __shfl_xor_sync(0xffffffffu, acc2[t], off);
        }
    float ssum[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        ssum[t] = 0.0f;
        if (sub == 0 && live) {
            float *dst = y + (uint64_t)(c + t) * ys;
            const float r = GLU ? mv_glu(acc[t], acc2[t], a.act) : acc[t];
            const float v = a.accumulate ? *dst + r : r;
            *dst = v;
            if (a.next_ss) { /* a producer: one part, so the row is `row` */
                const float nw = a.next_norm_w[row];
                a.next_xw[dst - a.part[0].y] = v * (a.plus_one ? 1.0f + nw : nw);
                ssum[t] = v * v;
            }
        }
    }
    if (a.next_ss) {
        /* the row block's partial sum of squares per item: lanes, then warps in order */
        __shared__ float block_ss[MV_WARPS][8];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float s = em_warp_sum(ssum[t]);
            if (lane == 0) block_ss[warp][t] = s;
        }
        __syncthreads();
        if (threadIdx.x < NT) {
            float total = 0.0f;
            for (int k = 0; k < MV_WARPS; k++) total += block_ss[k][threadIdx.x];
            a.next_ss[(uint64_t)(grp.start + c + threadIdx.x) * a.ss_stride + rb] = total;
        }
        __syncthreads();
    }
}

/* One pass of NT items over the block's row blocks: blockIdx.x, and when staged + gridDim.x, ...
 * (unstaged launches have a block per row block: no loop, no registers for one). */
template <int TYPE, int NT, bool GLU, bool STAGED>
__device__ __forceinline__ void dq_pass(const dq_args &a, const mv_group &grp, uint32_t c, const uint32_t *lut,
                                        const int8_t *sx, const float2 *sxd) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (uint32_t rb = blockIdx.x; rb < a.row_blocks; rb += gridDim.x) {
        const uint32_t row = (rb * MV_WARPS + warp) * (32u >> a.lanes_log2) + (lane >> a.lanes_log2);
        const bool live = row < a.rows;
        const uint8_t *w, *w2;
        float *y;
        uint64_t ys;
        mv_row(a, live ? row : a.rows - 1, grp.mat_offset, &w, &w2, &y, &ys); /* past the end: last row, no write */
        dq_items<TYPE, NT, GLU, STAGED>(a, grp, c, w, w2, y + (uint64_t)grp.start * ys, ys, row, live, lut, sx, sxd, rb);
        if (!STAGED) break;
    }
}

/* Shared memory a launch of passes of up to `items` items takes: their bytes and chunk scales. */
static inline uint32_t dq_smem_bytes(uint32_t items, uint32_t cols) {
    return items * (cols / DQ_UNIT) * DQ_XUNIT + items * (cols / DQ_CHUNK) * (uint32_t)sizeof(float2);
}

/* A block's group (dense: all items; MoE: its expert's), in passes of up to NT items: the largest
 * of 8, 4, 2, 1 (not above NT) that the items left fill. STAGED: each pass first rounds its items'
 * rows of X to bytes in shared memory (dq_stage), for blocks that loop over many row blocks (the
 * output heads: the rounding is then repeated once per block, not per row); otherwise the rows
 * were rounded once by dq_quantize_kernel. Then the pass runs the block's row blocks. */
template <int TYPE, int NT, bool GLU, bool STAGED> __device__ __forceinline__ void dq_block(const dq_args &a) {
    /* IQ3_XXS: the lattice in shared memory, where 32 lanes' lookups take ~3 bank wavefronts
     * instead of the ~8 cache lines of the global copy */
    __shared__ uint32_t lut[TYPE == EM_TYPE_IQ3_XXS ? 256 : 1];
    if constexpr (TYPE == EM_TYPE_IQ3_XXS) {
        static_assert(MV_THREADS == 256, "one lattice word per thread");
        lut[threadIdx.x] = em_cuda_iq3xxs_grid[threadIdx.x];
        __syncthreads();
    }
    extern __shared__ __align__(16) uint8_t dq_smem[];
    int8_t *sx = (int8_t *)dq_smem;
    float2 *sxd = (float2 *)(dq_smem + NT * (a.cols / DQ_UNIT) * DQ_XUNIT);
    em_pdl_wait();
    mv_group grp;
    if (!mv_group_of(a, blockIdx.y, &grp)) return; /* MoE only: the whole block returns */
    for (uint32_t c = 0; c < grp.count;) {
        const uint32_t left = grp.count - c;
        const uint32_t n = NT >= 8 && left >= 8 ? 8 : NT >= 4 && left >= 4 ? 4 : NT >= 2 && left >= 2 ? 2 : 1;
        if (STAGED) {
            if (c) __syncthreads(); /* the last pass is done with sx */
            dq_stage(a, grp, c, n, sx, sxd);
            __syncthreads();
        }
        if (n == 8) dq_pass<TYPE, NT >= 8 ? 8 : 1, GLU, STAGED>(a, grp, c, lut, sx, sxd);
        else if (n == 4) dq_pass<TYPE, NT >= 4 ? 4 : 1, GLU, STAGED>(a, grp, c, lut, sx, sxd);
        else if (n == 2) dq_pass<TYPE, NT >= 2 ? 2 : 1, GLU, STAGED>(a, grp, c, lut, sx, sxd);
        else dq_pass<TYPE, 1, GLU, STAGED>(a, grp, c, lut, sx, sxd);
        c += n;
    }
}

template <int TYPE, int NT, bool GLU, bool STAGED> __global__ void __launch_bounds__(MV_THREADS) dq_kernel(dq_args a) {
    dq_block<TYPE, NT, GLU, STAGED>(a);
}

/* The 1-item IQ3_XXS products (the MoE experts at every batch) built for four blocks per
 * multiprocessor, at 64 registers (ptxas alone takes 74-80: three). Asking the same of the other
 * variants makes them spill or, asking for fewer blocks, take more registers than ptxas's own
 * choice. */
template <bool GLU> __global__ void __launch_bounds__(MV_THREADS, 4) dq_kernel_iq3_one(dq_args a) {
    dq_block<EM_TYPE_IQ3_XXS, 1, GLU, false>(a);
}

template <int TYPE, bool GLU, bool STAGED>
static void dq_launch_nt(cuda_backend *b, const dq_args &a, dim3 grid, uint32_t nt) {
    const size_t smem = STAGED ? dq_smem_bytes(nt, a.cols) : 0;
    switch (nt) {
    case 8: em_cuda_launch(b, dq_kernel<TYPE, 8, GLU, STAGED>, grid, MV_THREADS, smem, a); break;
    case 4: em_cuda_launch(b, dq_kernel<TYPE, 4, GLU, STAGED>, grid, MV_THREADS, smem, a); break;
    case 2: em_cuda_launch(b, dq_kernel<TYPE, 2, GLU, STAGED>, grid, MV_THREADS, smem, a); break;
    default:
        if constexpr (TYPE == EM_TYPE_IQ3_XXS && !STAGED) em_cuda_launch(b, dq_kernel_iq3_one<GLU>, grid, MV_THREADS, smem, a);
        else em_cuda_launch(b, dq_kernel<TYPE, 1, GLU, STAGED>, grid, MV_THREADS, smem, a);
    }
}

/* The weight types this kernel reads (those with a dq_unit), of em_cuda_each_type's. */
template <int TYPE> constexpr bool dq_reads =
    TYPE == EM_TYPE_Q8_0 || TYPE == EM_TYPE_Q4_K || TYPE == EM_TYPE_Q6_K || TYPE == EM_TYPE_IQ3_XXS ||
    TYPE == EM_TYPE_MXFP4;

/* Calls f(em_type_tag<T>()) for T == type when this kernel reads T; false otherwise. */
template <typename F> static bool dq_with_type(uint32_t type, F &&f) {
    bool found = false;
    em_cuda_with_type<false>(type, [&](auto t) {
        if constexpr (dq_reads<decltype(t)::value>) f(t), found = true;
    });
    return found;
}

/* Items per pass of mv's launch: dense, its items; MoE, the mean items per expert (mv->n_items;
 * most experts get one or two of a step's tokens), not the batch's tokens: the variants for more
 * items hold more registers (an 8-item one up to 128 per thread), and an expert with more items
 * repeats its rows, which the repeat reads from L1. */
static uint32_t dq_pass_items(const cuda_matvec *mv) {
    const uint32_t n = mv->counts && mv->max_items < mv->n_items ? mv->max_items : mv->n_items;
    return (uint32_t)mv_items_per_pass(n);
}

/* Rows per block and row blocks of mv's launch, and the blocks it launches along x: one per row
 * block, except for the products with more row blocks than eight per multiprocessor (the output
 * heads, 16,000 of them), whose blocks loop over row blocks and round their activations themselves
 * (staged).
 *
 * Lanes per row: the fewest (a power of two, 4-32) that leave each lane at most 2 units of a dense
 * row, 3 of a MoE expert's. A lane's fixed work per row (its activation pointers and scales, the
 * sums across lanes, the write, and for a gated unit the activation) is then shared by 2-3 units
 * instead of one: the IQ3_XXS expert products are bound by instructions, not bytes (they took
 * the same time with their weights streamed through shared memory); 4 a lane measured slower for
 * the gated experts. EMBER_CUDA_DQ_UNITS=N and EMBER_CUDA_DQ_MOE_UNITS=N set them (1: the fewest
 * lanes that cover a row's units). */
struct dq_shape {
    uint32_t lanes_log2, row_blocks, grid_x;
    bool staged;
};
static dq_shape dq_shape_of(const cuda_backend *b, const cuda_matvec *mv) {
    dq_shape sh = {};
    const uint32_t per_lane = mv->counts ? b->tuning.dp4a_moe_units : b->tuning.dp4a_units;
    const uint32_t lanes_wanted = (mv->w->cols / DQ_UNIT + per_lane - 1) / per_lane;
    sh.lanes_log2 = 2;
    while (sh.lanes_log2 < 5 && (1u << sh.lanes_log2) < lanes_wanted) sh.lanes_log2++;
    const uint32_t rows_per_block = MV_WARPS * (32u >> sh.lanes_log2);
    sh.row_blocks = (em_cuda_matvec_rows(mv) + rows_per_block - 1) / rows_per_block;
    const uint32_t most = 8u * (uint32_t)b->n_sm;
    sh.staged = !mv->counts && !mv->up && sh.row_blocks > most;
    sh.grid_x = sh.staged ? most : sh.row_blocks;
    return sh;
}

bool em_cuda_dq_staged(const cuda_backend *b, const cuda_matvec *mv) { return dq_shape_of(b, mv).staged; }

/* The rows dq_quantize_kernel rounds: a dense product's items (gathered through x_index), a MoE
 * product's rows of X (x_rows; without it, rows indexed per pair are the batch's tokens); 0 when
 * unknown (pairs read rows in order and x_rows is not given). */
static uint32_t dq_rows(const cuda_matvec *mv) {
    if (!mv->counts) return mv->n_items;
    return mv->x_rows ? mv->x_rows : mv->x_index ? mv->max_items : 0;
}

em_err em_cuda_dq_round_rows(cuda_backend *b, const cuda_matvec *mv, bool imma) {
    const uint32_t q_rows = dq_rows(mv), cols = mv->w->cols;
    if (cols % (imma ? 2 * DQ_UNIT : DQ_UNIT) || q_rows == 0 || (uint64_t)q_rows * (cols / DQ_UNIT) * DQ_XUNIT > b->xq_bytes)
        return em_errorf(EM_ERR_INTERNAL, "cuda rounding to bytes: %u rows of %u values, room for %llu bytes", q_rows,
                         cols, (unsigned long long)b->xq_bytes);
    /* dense rows are the items (gathered through x_index); MoE rows are X's rows */
    const uint64_t warps = (uint64_t)q_rows * (cols / DQ_CHUNK);
    em_cuda_launch(b, dq_quantize_kernel, (uint32_t)((warps + 7) / 8), 256, 0, mv->x, mv->x_stride,
                   mv->counts ? (const uint32_t *)NULL : mv->x_index, cols, q_rows, mv->norm_ss, mv->norm_n,
                   b->ss_stride, b->step.eps, imma, b->xq, b->xd);
    CU_LAUNCHED();
    return NULL;
}

bool em_cuda_dq_takes(const cuda_backend *b, const cuda_matvec *mv) {
    const uint32_t n_parts = mv->n_parts ? mv->n_parts : 1;
    if (!dq_with_type(mv->w->type, [](auto) {}) || mv->w->cols % DQ_UNIT || mv->x_stride % 4) return false;
    if (dq_shape_of(b, mv).staged) {
        if ((uintptr_t)mv->x % 16 || dq_smem_bytes(dq_pass_items(mv), mv->w->cols) > b->dp4a_smem_max) return false;
    } else if (dq_rows(mv) == 0 || (uint64_t)dq_rows(mv) * (mv->w->cols / DQ_UNIT) * DQ_XUNIT > b->xq_bytes) {
        return false;
    }
    /* the fusions em_cuda_matvec allows: parts of dense plain products, norms on dense ones */
    if (n_parts > MV_PARTS || (n_parts > 1 && (mv->counts || mv->up))) return false;
    return !((mv->norm_ss || mv->next_norm_w) && mv->counts);
}

em_err em_cuda_dq(cuda_backend *b, const cuda_matvec *mv, const mv_args &base) {
    const cuda_weight *w = mv->w;
    if (!em_cuda_dq_takes(b, mv))
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda dp4a matvec: %s, %u columns, %u items (room for %llu bytes)",
                         em_type_name(w->type), w->cols, mv->n_items, (unsigned long long)b->xq_bytes);
    dq_args a = {};
    static_cast<mv_args &>(a) = base;
    const bool moe = mv->counts != NULL;
    const dq_shape sh = dq_shape_of(b, mv);
    if (!sh.staged) {
        em_err err = em_cuda_dq_round_rows(b, mv, false);
        if (err) return err;
        a.xq = b->xq, a.xd = b->xd;
        a.x_by_index = moe && mv->x_index;
    }
    a.lanes_log2 = sh.lanes_log2;
    a.row_blocks = sh.row_blocks;
    em_err err = mv_producer_blocks(b, a, a.row_blocks, "cuda dp4a matvec");
    if (err) return err;
    const dim3 grid(sh.grid_x, !moe ? 1 : mv->active ? mv->n_active_max : mv->n_groups);
    const uint32_t nt = dq_pass_items(mv);
    dq_with_type(w->type, [&](auto t) {
        constexpr int T = decltype(t)::value;
        if (mv->up) dq_launch_nt<T, true, false>(b, a, grid, nt);
        else if (sh.staged) dq_launch_nt<T, false, true>(b, a, grid, nt);
        else dq_launch_nt<T, false, false>(b, a, grid, nt);
    });
    CU_LAUNCHED();
    return NULL;
}

/* Lets every staged variant of type T take as much dynamic shared memory as the device allows next to
 * its static arrays (the IQ3_XXS lattice, partial sums), and lowers *most to what all of them got:
 * the opt-in limit, or without it the 48 KiB every kernel has. */
template <int T> static void dq_allow_smem(int optin, uint32_t *most) {
    void (*kernels[])(dq_args) = {dq_kernel<T, 1, false, true>, dq_kernel<T, 2, false, true>,
                                  dq_kernel<T, 4, false, true>, dq_kernel<T, 8, false, true>};
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
        cudaFuncAttributes fa;
        if (cudaFuncGetAttributes(&fa, kernels[i]) != cudaSuccess) fa.sharedSizeBytes = 4096;
        int bytes = optin - (int)fa.sharedSizeBytes - 1024;
        if (bytes <= 48 * 1024 ||
            cudaFuncSetAttribute(kernels[i], cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
            bytes = 48 * 1024 - (int)fa.sharedSizeBytes;
        (void)cudaGetLastError(); /* a refused opt-in is not an error: the default limit holds */
        if ((uint32_t)bytes < *most) *most = (uint32_t)bytes;
    }
}

em_err em_cuda_dq_setup(cuda_backend *b) {
    int device = 0, optin = 0;
    CU_TRY(cudaGetDevice(&device));
    CU_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    uint32_t most = UINT32_MAX;
    dq_allow_smem<EM_TYPE_Q8_0>(optin, &most);
    dq_allow_smem<EM_TYPE_Q4_K>(optin, &most);
    dq_allow_smem<EM_TYPE_Q6_K>(optin, &most);
    dq_allow_smem<EM_TYPE_IQ3_XXS>(optin, &most);
    dq_allow_smem<EM_TYPE_MXFP4>(optin, &most);
    b->dp4a_smem_max = most;
    return NULL;
}
