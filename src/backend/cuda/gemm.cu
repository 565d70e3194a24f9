/* Matrix products on the tensor cores, for prefill chunks and large batches (internal.cuh:
 * cuda_matvec; em_cuda_matvec hands a descriptor here when em_cuda_kernel_for picks GEMM or WGMMA).
 *
 * It computes what matvec.cu computes, Y[item][row] = W row · X[xrow(item)], with the same
 * fusions (Q/K/V parts, the gated unit, MoE groups, the residual add), but as a tiled product:
 * a block of 256 threads owns a tile of 128 weight rows by ITEMS items (32, 64 or 128) and walks
 * K in steps of 32. The 8 warps (2 along rows by 4 along items, 64 rows by ITEMS/4 items each)
 * read f16 operands from shared memory (weights with ldmatrix) and multiply with mma.sync
 * m16n8k16 into f32 accumulators. Two kernels feed shared memory:
 *  - gemm_kernel (STAGED): each step's weights are decoded to f16 and its activations rounded to
 *    f16 in registers, one step ahead, into a double buffer;
 *  - gemm_pipelined_kernel (PIPELINED): activations (f32) and BF16 weights (as stored) arrive by
 *    cp.async GM_STAGES - 1 steps ahead; each thread turns the weights it copied into f16 in
 *    shared memory, activations are rounded when the operands are built; other weight types
 *    still go through registers one step ahead.
 * Both round identically, so they give the same bits. A third, gemm_wgmma_kernel (WGMMA, below),
 * multiplies with Hopper's warpgroup MMA on tiles of 256 rows by 128 items and is the choice for
 * grids of enough tiles (several times faster than the others there); its sums inside an MMA run
 * in the hardware's own order, so its bits differ from the other two (checked against the same
 * reference).
 *
 * Why f16 and not the f32 of matvec.cu: the tensor cores take 16-bit operands. f16 rather than
 * bf16 (dequant.cuh: pack_f16x2): BF16 weights convert exactly and activations lose 2^-12
 * relative instead of 2^-9, a few 1e-4 on a dot product rather than a few 1e-3 (bf16 operands
 * flipped near-tied expert choices of the random test models), for f16's range, which is
 * clamped and which the activations entering products stay far inside. The checks
 * (tests/cuda/check_gemm.cu) bound the error. The sums are accumulated in f32 in a fixed order over
 * K (K steps in order, each mma's internal order fixed), and an output depends only on its own
 * weight row and activation row: a token gets the same result whatever else is in the batch and
 * whichever item tile the launch picked.
 *
 * The gated unit: in each 16-row slice of the tile, rows 0-7 are gate rows r..r+7 and rows 8-15
 * are the up rows r..r+7, so the mma's accumulator fragment holds gate and up of the same output
 * in one thread (c0/c2, c1/c3), which then writes act(gate) * up directly: a tile covers 64
 * output rows.
 *
 * MoE: grid.z is the expert; the number of items of an expert is known on the device only, so
 * each block loops over the item tiles blockIdx.y, blockIdx.y + gridDim.y, ... of its expert.
 *
 * EMBER_CUDA_GEMM=0 switches this path off (every product stays on matvec.cu's kernels).
 *
 * Nothing here allocates or reads device data on the host, so launches are capture-safe: the
 * kernels' shared memory limits are raised, and the loaded code asked whether it has wgmma, once
 * when the backend is made (em_cuda_gemm_setup). */
#include <stdlib.h>
#include <string.h>

#include "internal.cuh"
#include "dequant.cuh"

#define GM_THREADS 256
#define GM_ROWS 128 /* weight rows of a tile (output rows, or 64 gate + 64 up rows) */
#define GM_K 32     /* K per step */
#define GM_LD 40    /* 16-bit values per shared row: 32 + 8 of padding, so ldmatrix's 8 rows hit distinct banks */
#define GM_PARTS EM_CUDA_PARTS

/* As matvec.cu's mv_part: global rows [begin, end) belong to this part. */
typedef cuda_product_args gm_args;

#define GM_PART(pi, f) ((pi) == 0 ? a.part[0].f : (pi) == 1 ? a.part[1].f : a.part[2].f)

__device__ __forceinline__ void gm_ldmatrix_x4(uint32_t r[4], const uint16_t *p) {
    const uint32_t at = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at)
                 : "memory");
}

__device__ __forceinline__ void gm_ldmatrix_x2(uint32_t r[2], const uint16_t *p) {
    const uint32_t at = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(at) : "memory");
}

/* c += a (16x16, rows = weight rows) * b (16x8, columns = items), f16 in, f32 accumulate. */
__device__ __forceinline__ void gm_mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ float gm_glu(float g, float u, int act) {
    float v;
    if (act == EM_ACT_GEGLU) {
        const float k = 0.7978845608028654f; /* sqrt(2/pi): GELU, tanh approximation (as matvec.cu) */
        v = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
    } else {
        v = g / (1.0f + expf(-g));
    }
    return v * u;
}

/* Writes a warp's accumulators, M16 slices of 16 tile rows by N8 groups of 8 items: c0,c1 hold
 * tile row lane/4, items 2(lane%4) and +1; c2,c3 tile row lane/4 + 8 (with GLU: the up rows of the
 * same outputs). The layout of mma.sync's fragments and of wgmma's accumulators alike. */
template <int M16, int N8, bool GLU>
__device__ __forceinline__ void gm_store(const gm_args &a, const float (&acc)[M16][N8][4], uint32_t row0,
                                         uint32_t t0, uint32_t count, uint32_t start, uint32_t warp_row,
                                         uint32_t warp_item, uint32_t lane) {
#pragma unroll
    for (int m = 0; m < M16; m++) {
#pragma unroll
        for (int n = 0; n < N8; n++) {
            const uint32_t item = t0 + warp_item + 8 * n + 2 * (lane & 3);
#pragma unroll
            for (int h = 0; h < (GLU ? 1 : 2); h++) {
                const uint32_t r = GLU ? row0 + (warp_row + 16 * m) / 2 + (lane >> 2)
                                       : row0 + warp_row + 16 * m + 8 * h + (lane >> 2);
                if (r >= a.rows) continue;
                const int pi = em_cuda_part_of(a, r);
                float *y = GM_PART(pi, y) + (r - GM_PART(pi, begin));
                const uint64_t y_stride = GM_PART(pi, y_stride);
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    if (item + c >= count) continue;
                    const float v = GLU ? gm_glu(acc[m][n][c], acc[m][n][2 + c], a.act) : acc[m][n][2 * h + c];
                    float *out = y + (uint64_t)(start + item + c) * y_stride;
                    *out = a.accumulate ? *out + v : v;
                }
            }
        }
    }
}

/* Row s of the weight tile at row0 (NULL past the end: zeros). With GLU, rows 0-7 of each 16-row
 * slice are gate rows and rows 8-15 the up rows of the same outputs. */
template <bool GLU>
__device__ __forceinline__ const uint8_t *gm_weight_row(const gm_args &a, uint32_t row0, uint64_t mat_offset, uint32_t s) {
    const uint32_t r = GLU ? row0 + (s >> 4) * 8 + (s & 7) : row0 + s;
    if (r >= a.rows) return NULL;
    const int pi = em_cuda_part_of(a, r);
    const uint8_t *base = GLU && (s >> 3) & 1 ? GM_PART(pi, w2) : GM_PART(pi, w);
    return base + mat_offset + (uint64_t)(r - GM_PART(pi, begin)) * GM_PART(pi, row_bytes);
}

/* This thread's two weight rows of the tile at row0. */
template <bool GLU>
__device__ __forceinline__ void gm_weight_rows(const gm_args &a, uint32_t row0, uint64_t mat_offset,
                                               const uint8_t *wrow[2]) {
#pragma unroll
    for (int j = 0; j < 2; j++) wrow[j] = gm_weight_row<GLU>(a, row0, mat_offset, (threadIdx.x + GM_THREADS * j) >> 2);
}

/* What a block of either kernel works on: its expert's items [start, start + count), its output
 * rows from row0, and this thread's two weight rows. Waits for the previous kernel first, and
 * copies the IQ3_XXS lattice into `grid` (shared memory) for that type. */
typedef struct gm_block {
    uint32_t count, start, row0;
    const uint8_t *wrow[2];
} gm_block;

template <int TYPE, bool GLU> __device__ __forceinline__ gm_block gm_block_begin(const gm_args &a, uint32_t *grid) {
    em_pdl_wait();
    if (TYPE == EM_TYPE_IQ3_XXS) grid[threadIdx.x] = em_cuda_iq3xxs_grid[threadIdx.x];
    const uint32_t e = blockIdx.z;
    gm_block k;
    k.count = a.counts ? a.counts[e] : a.n_items;
    k.start = a.starts ? a.starts[e] : 0;
    k.row0 = blockIdx.x * (GLU ? 64 : GM_ROWS);
    gm_weight_rows<GLU>(a, k.row0, a.counts ? e * a.mat_bytes : 0, k.wrow);
    if (TYPE == EM_TYPE_IQ3_XXS) __syncthreads();
    return k;
}

/* This thread's XL activation rows of the item tile at t0 (NULL past the block's items). */
template <int XL>
__device__ __forceinline__ void gm_item_rows(const gm_args &a, const gm_block &k, uint32_t t0, const float *xrow[XL]) {
#pragma unroll
    for (int j = 0; j < XL; j++) {
        const uint32_t i = t0 + ((threadIdx.x + GM_THREADS * j) >> 3);
        xrow[j] = NULL;
        if (i < k.count) xrow[j] = a.x + (uint64_t)(a.x_index ? a.x_index[k.start + i] : k.start + i) * a.x_stride;
    }
}

/* This block's K steps, [first, first + count): all of them, or with a split of K (dense products
 * only; blockIdx.z is the split, every split at least one step: gm_splits) its share. */
__device__ __forceinline__ uint32_t gm_first_step(const gm_args &a, uint32_t n_split, uint32_t *count) {
    const uint32_t all = a.cols / GM_K;
    if (n_split == 1) return *count = all, 0u;
    const uint32_t per = (all + n_split - 1) / n_split, first = blockIdx.z * per;
    *count = min(per, all - first);
    return first;
}

/* The accumulators of a tile: to Y (gm_store), or with a split of K plain to this split's place in
 * split_part, [split][item][row] (every part's rows in one array), which gm_sum_splits_kernel adds
 * in split order and stores as gm_store would. */
template <int M16, int N8, bool GLU>
__device__ __forceinline__ void gm_store_split(const gm_args &a, const float (&acc)[M16][N8][4], uint32_t row0,
                                               uint32_t t0, uint32_t count, uint32_t start, uint32_t warp_row,
                                               uint32_t warp_item, uint32_t lane, float *split_part, uint32_t n_split) {
    if (n_split == 1) return gm_store<M16, N8, GLU>(a, acc, row0, t0, count, start, warp_row, warp_item, lane);
    gm_args pa = a;
    pa.accumulate = false;
    float *mine = split_part + (uint64_t)blockIdx.z * count * a.rows;
#pragma unroll
    for (int i = 0; i < GM_PARTS; i++) pa.part[i].y = mine + pa.part[i].begin, pa.part[i].y_stride = a.rows;
    gm_store<M16, N8, GLU>(pa, acc, row0, t0, count, start, warp_row, warp_item, lane);
}

/* Each thread loads 2 groups of 8 weights and ITEMS/32 groups of 4 activations per step. */
template <int TYPE, int ITEMS, bool GLU>
__global__ void __launch_bounds__(GM_THREADS, ITEMS == 128 ? 1 : 2)
    gemm_kernel(gm_args a, float *split_part, uint32_t n_split) {
    constexpr int XL = ITEMS / 32;    /* activation loads per thread per step */
    constexpr int NT = ITEMS / 32;    /* 8-item mma columns per warp */
    __shared__ __align__(16) uint16_t sw[2][GM_ROWS * GM_LD];
    __shared__ __align__(16) uint16_t sx[2][ITEMS * GM_LD];
    __shared__ uint32_t grid[TYPE == EM_TYPE_IQ3_XXS ? 256 : 1];
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t warp_row = (warp >> 2) * 64, warp_item = (warp & 3) * (ITEMS / 4);
    const gm_block k = gm_block_begin<TYPE, GLU>(a, grid);
    const uint8_t *const *wrow = k.wrow;
    const uint32_t count = k.count, start = k.start, row0 = k.row0;
    const uint32_t wgroup = tid & 3; /* this thread's column group in a step */
    uint32_t n_steps;
    const uint32_t first = gm_first_step(a, n_split, &n_steps);

    for (uint32_t t0 = blockIdx.y * ITEMS; t0 < count; t0 += gridDim.y * ITEMS) {
        const float *xrow[XL];
        gm_item_rows<XL>(a, k, t0, xrow);
        const uint32_t xquad = tid & 7;

        uint4 wreg[2];
        uint2 xreg[XL];
        /* global -> registers (decoded, rounded), then registers -> shared buffer `buf` */
        auto load = [&](uint32_t step) {
            const uint32_t k = first + step;
#pragma unroll
            for (int j = 0; j < 2; j++)
                wreg[j] = wrow[j] ? deq_f16x8<TYPE>(wrow[j], k * (GM_K / 8) + wgroup, grid) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < XL; j++) {
                float4 v = xrow[j] ? *(const float4 *)(xrow[j] + k * GM_K + 4 * xquad) : make_float4(0, 0, 0, 0);
                xreg[j] = make_uint2(pack_f16x2(v.x, v.y), pack_f16x2(v.z, v.w));
            }
        };
        auto store = [&](int buf) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint32_t s = (tid + GM_THREADS * j) >> 2;
                *(uint4 *)&sw[buf][s * GM_LD + 8 * wgroup] = wreg[j];
            }
#pragma unroll
            for (int j = 0; j < XL; j++) {
                const uint32_t i = (tid + GM_THREADS * j) >> 3;
                *(uint2 *)&sx[buf][i * GM_LD + 4 * xquad] = xreg[j];
            }
        };

        float acc[4][NT][4];
#pragma unroll
        for (int m = 0; m < 4; m++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[m][n][c] = 0.0f;

        load(0);
        store(0);
        __syncthreads();
        for (uint32_t step = 0; step < n_steps; step++) {
            const int buf = step & 1;
            if (step + 1 < n_steps) load(step + 1);
#pragma unroll
            for (int kk = 0; kk < GM_K; kk += 16) {
                uint32_t af[4][4], bfr[NT][2];
#pragma unroll
                for (int m = 0; m < 4; m++)
                    gm_ldmatrix_x4(af[m], &sw[buf][(warp_row + 16 * m + (lane & 15)) * GM_LD + kk + 8 * (lane >> 4)]);
                if (NT == 1) {
                    gm_ldmatrix_x2(bfr[0], &sx[buf][(warp_item + (lane & 7)) * GM_LD + kk + 8 * ((lane >> 3) & 1)]);
                } else {
#pragma unroll
                    for (int n = 0; n < NT; n += 2) {
                        uint32_t r[4];
                        gm_ldmatrix_x4(r, &sx[buf][(warp_item + 8 * n + (lane & 7) + 8 * (lane >> 4)) * GM_LD + kk +
                                                   8 * ((lane >> 3) & 1)]);
                        bfr[n][0] = r[0], bfr[n][1] = r[1];
                        bfr[n + 1 < NT ? n + 1 : n][0] = r[2], bfr[n + 1 < NT ? n + 1 : n][1] = r[3];
                    }
                }
#pragma unroll
                for (int m = 0; m < 4; m++)
#pragma unroll
                    for (int n = 0; n < NT; n++) gm_mma(acc[m][n], af[m], bfr[n]);
            }
            if (step + 1 < n_steps) store(buf ^ 1);
            __syncthreads();
        }

        gm_store_split<4, NT, GLU>(a, acc, row0, t0, count, start, warp_row, warp_item, lane, split_part, n_split);
    }
}


/* ---- the pipelined kernel: cp.async, GM_STAGES steps in flight ----
 * The same tiles, warps and epilogue as gemm_kernel, but the activations (f32) and BF16 weights
 * are copied global -> shared by cp.async, GM_STAGES - 1 steps ahead of the products, so global
 * latency hides behind several steps of math instead of one. Activations stay f32 in shared
 * memory and are rounded to f16 when a warp builds its mma operands (a thread's two pairs of a
 * column; the same rounding as gemm_kernel, so both kernels give bit-identical results). Weights
 * of the other types are decoded through registers one step ahead, as in gemm_kernel. */
#define GM_STAGES 4
#define GM_XLD 40 /* floats per shared activation row: 32 + 8, so a warp's operand reads take 2 wavefronts */

static constexpr size_t gm_pipelined_smem(int items) {
    return GM_STAGES * ((size_t)GM_ROWS * GM_LD * 2 + (size_t)items * GM_XLD * 4) + 256 * 4;
}

/* 16 bytes global -> shared, asynchronously; src_bytes 0 writes zeros (rows past the end). */
__device__ __forceinline__ void gm_cp_async16(void *dst, const void *src, uint32_t src_bytes) {
    const uint32_t at = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(at), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void gm_cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING> __device__ __forceinline__ void gm_cp_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}

template <int TYPE, int ITEMS, bool GLU>
__global__ void __launch_bounds__(GM_THREADS, ITEMS == 128 ? 1 : 2)
    gemm_pipelined_kernel(gm_args a, float *split_part, uint32_t n_split) {
    constexpr int XL = ITEMS / 32, NT = ITEMS / 32;
    constexpr bool ASYNC_W = TYPE == EM_TYPE_BF16;
    extern __shared__ __align__(16) uint8_t gm_smem[];
    uint16_t *sw = (uint16_t *)gm_smem;                                     /* [stage][row][GM_LD] */
    float *sx = (float *)(gm_smem + GM_STAGES * GM_ROWS * GM_LD * 2);       /* [stage][item][GM_XLD] */
    uint32_t *grid = (uint32_t *)(gm_smem + GM_STAGES * (GM_ROWS * GM_LD * 2 + ITEMS * GM_XLD * 4));
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t warp_row = (warp >> 2) * 64, warp_item = (warp & 3) * (ITEMS / 4);
    const gm_block k = gm_block_begin<TYPE, GLU>(a, grid);
    const uint8_t *const *wrow = k.wrow;
    const uint32_t count = k.count, start = k.start, row0 = k.row0;
    const uint32_t wgroup = tid & 3, xquad = tid & 7;
    uint32_t n_steps;
    const uint32_t first = gm_first_step(a, n_split, &n_steps);

    for (uint32_t t0 = blockIdx.y * ITEMS; t0 < count; t0 += gridDim.y * ITEMS) {
        const float *xrow[XL];
        gm_item_rows<XL>(a, k, t0, xrow);
        /* one commit group per step (empty past the end, so the group count stays uniform) */
        auto issue = [&](uint32_t step) {
            if (step < n_steps) {
                const uint32_t st = step % GM_STAGES, k = first + step;
                if (ASYNC_W) {
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const uint32_t s = (tid + GM_THREADS * j) >> 2;
                        const uint8_t *src = wrow[j] ? wrow[j] + (uint64_t)k * (GM_K * 2) + 16 * wgroup : (const uint8_t *)a.x;
                        gm_cp_async16(sw + (st * GM_ROWS + s) * GM_LD + 8 * wgroup, src, wrow[j] ? 16 : 0);
                    }
                }
#pragma unroll
                for (int j = 0; j < XL; j++) {
                    const uint32_t i = (tid + GM_THREADS * j) >> 3;
                    const float *src = xrow[j] ? xrow[j] + k * GM_K + 4 * xquad : a.x;
                    gm_cp_async16(sx + (st * ITEMS + i) * GM_XLD + 4 * xquad, src, xrow[j] ? 16 : 0);
                }
            }
            gm_cp_commit();
        };
        uint4 wreg[2];
        auto load_w = [&](uint32_t step) {
#pragma unroll
            for (int j = 0; j < 2; j++)
                wreg[j] = wrow[j] ? deq_f16x8<TYPE>(wrow[j], (first + step) * (GM_K / 8) + wgroup, grid)
                                  : make_uint4(0, 0, 0, 0);
        };
        auto store_w = [&](uint32_t st) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint32_t s = (tid + GM_THREADS * j) >> 2;
                *(uint4 *)(sw + (st * GM_ROWS + s) * GM_LD + 8 * wgroup) = wreg[j];
            }
        };

        float acc[4][NT][4];
#pragma unroll
        for (int m = 0; m < 4; m++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[m][n][c] = 0.0f;

#pragma unroll
        for (int st = 0; st < GM_STAGES - 1; st++) issue(st);
        if (!ASYNC_W) {
            load_w(0);
            store_w(0);
            if (n_steps > 1) load_w(1);
        }
        for (uint32_t step = 0; step < n_steps; step++) {
            gm_cp_wait<GM_STAGES - 2>(); /* this thread's copies of `step` have landed */
            if (ASYNC_W) {
                /* BF16 rows arrive as stored: each thread turns the pieces it copied into f16, once
                 * per block (in the operands, every warp would convert them again) */
                const uint32_t st = step % GM_STAGES;
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    uint4 *p = (uint4 *)(sw + (st * GM_ROWS + ((tid + GM_THREADS * j) >> 2)) * GM_LD + 8 * wgroup);
                    uint4 v = *p;
                    v.x = bf16x2_to_f16x2(v.x), v.y = bf16x2_to_f16x2(v.y);
                    v.z = bf16x2_to_f16x2(v.z), v.w = bf16x2_to_f16x2(v.w);
                    *p = v;
                }
            }
            __syncthreads();             /* everyone's have, and everyone is done with step - 1 */
            issue(step + GM_STAGES - 1); /* into the stage of step - 1 */
            if (!ASYNC_W) {
                if (step + 1 < n_steps) store_w((step + 1) % GM_STAGES);
                if (step + 2 < n_steps) load_w(step + 2);
            }
            const uint16_t *wt = sw + (step % GM_STAGES) * GM_ROWS * GM_LD;
            const float *xt = sx + (step % GM_STAGES) * ITEMS * GM_XLD;
#pragma unroll
            for (int kk = 0; kk < GM_K; kk += 16) {
                uint32_t af[4][4], bfr[NT][2];
#pragma unroll
                for (int m = 0; m < 4; m++)
                    gm_ldmatrix_x4(af[m], wt + (warp_row + 16 * m + (lane & 15)) * GM_LD + kk + 8 * (lane >> 4));
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    /* column lane/4 of the 8 items, k = 2(lane%4) + {0, 1} and + 8 */
                    const float *xp = xt + (warp_item + 8 * n + (lane >> 2)) * GM_XLD + kk + 2 * (lane & 3);
                    const float2 lo = *(const float2 *)xp, hi = *(const float2 *)(xp + 8);
                    bfr[n][0] = pack_f16x2(lo.x, lo.y);
                    bfr[n][1] = pack_f16x2(hi.x, hi.y);
                }
#pragma unroll
                for (int m = 0; m < 4; m++)
#pragma unroll
                    for (int n = 0; n < NT; n++) gm_mma(acc[m][n], af[m], bfr[n]);
            }
        }
        gm_cp_wait<0>();
        __syncthreads(); /* the stages are free for the next item tile */
        gm_store_split<4, NT, GLU>(a, acc, row0, t0, count, start, warp_row, warp_item, lane, split_part, n_split);
    }
}

#undef GM_PART


/* ---- the wgmma kernel: Hopper's warpgroup MMA, for dense products ----
 * 512 threads = four warpgroups, a tile of 256 weight rows (64 per warpgroup; with GLU 128
 * outputs, as above) by 128 items, K in stages of 64 copied by cp.async WG_STAGES - 1 steps
 * ahead. Blocks run the item tiles of a row tile one after the other (blockIdx.x is the item
 * tile), so the blocks in flight share their weights in L2 and the weights come from memory about
 * once; the activations of a prefill chunk stay in L2 throughout. Both operands come from shared
 * memory through matrix descriptors, as f16: the activations were rounded once into b->x16
 * (wg_round_kernel: the same pack_f16x2 as the other kernels), F16 weights are copied as stored,
 * and quantized weights are loaded as stored (h8_fetch) a step ahead, before the barrier, then
 * decoded (h8_decode, packed halves) into their stage while the step's MMAs run, so that the
 * loads' latency passes during the wait at the barrier. BF16 weights are copied as stored and
 * meet activations rounded to bf16 (BF16_OPS), as the model was trained and as other engines run
 * it: 2^-9 of precision on the activations instead of 2^-12, but no conversion on the way, which
 * made the products markedly faster (bench/RESULTS.md, "CUDA kernel choice");
 * EMBER_CUDA_WG_BF16=0 converts them to f16 instead (h8_decode_bf16, clamped to f16's range).
 *
 * Shared layout: wgmma's K-major form with the 128-byte swizzle: a row's 64 values (128 bytes) at
 * byte 128 * row, its 16-byte chunk k stored at chunk position k ^ (row % 8), so the tensor cores
 * read 8 rows' chunks of one K slice from 8 different bank groups. Stage bases are 1024-byte
 * aligned (the pattern repeats every 8 rows); the descriptor's stride offset is 1024 bytes (8
 * rows), and the K slices of a stage start 32 bytes apart. A warp copies 4 whole rows per
 * instruction: 128 contiguous bytes of a row from global memory, 512 bytes to shared memory.
 *
 * The accumulators of warp w of warpgroup g hold tile rows 64g + 16w .. + 15 in mma.sync's
 * fragment layout, so gm_store writes them. Every item's sums run over K in the same order
 * whatever the tile holds, so a token gets the same bits in any batch. Only the sm_90a build has
 * the instructions: em_cuda_gemm_setup asks wg_probe_kernel once whether the loaded code is that one. */
#define WG_THREADS 512
#define WG_ROWS 256
#define WG_ITEMS 128
#define WG_K 64
#define WG_STAGES 4
#define WG_WTILE (WG_ROWS * WG_K * 2)  /* bytes of a stage's weights */
#define WG_XTILE (WG_ITEMS * WG_K * 2) /* and of its activations */
#define WG_STAGE (WG_WTILE + WG_XTILE)
static constexpr size_t wg_smem = (size_t)WG_STAGES * WG_STAGE;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_HAVE 1
#else
#define WG_HAVE 0
#endif

/* 1 when the code the device runs has wgmma (the sm_90a build), 2 otherwise. */
__global__ void wg_probe_kernel(uint32_t *out) { *out = WG_HAVE ? 1 : 2; }

/* x16 row r = X row r rounded to f16 (bf16: to bf16), for the first `rows` rows (the kernel gathers
 * with x_index). */
__global__ void __launch_bounds__(256) wg_round_kernel(gm_args a, uint32_t rows, __half *x16, bool bf16) {
    em_pdl_wait();
    const uint32_t groups = a.cols / 8;
    const uint64_t total = (uint64_t)rows * groups;
    for (uint64_t i = blockIdx.x * 256ull + threadIdx.x; i < total; i += (uint64_t)gridDim.x * 256) {
        const uint32_t r = (uint32_t)(i / groups), g = (uint32_t)(i % groups);
        const float *src = a.x + (uint64_t)r * a.x_stride + 8 * g;
        const float4 lo = *(const float4 *)src, hi = *(const float4 *)(src + 4);
        uint4 *dst = (uint4 *)(x16 + (uint64_t)r * a.cols + 8 * g);
        if (bf16)
            *dst = make_uint4(pack_bf16x2(lo.x, lo.y), pack_bf16x2(lo.z, lo.w), pack_bf16x2(hi.x, hi.y),
                              pack_bf16x2(hi.z, hi.w));
        else
            *dst = make_uint4(pack_f16x2(lo.x, lo.y), pack_f16x2(lo.z, lo.w), pack_f16x2(hi.x, hi.y),
                              pack_f16x2(hi.z, hi.w));
    }
}

/* A shared-memory matrix descriptor: start address, 128-byte swizzle, 1024 bytes between groups of
 * 8 rows (the leading offset is unused by this layout: 16). */
__device__ __forceinline__ uint64_t wg_desc(const void *smem) {
    const uint32_t at = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((at & 0x3ffff) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* Byte of chunk (row, k) in a swizzled tile. */
__device__ __forceinline__ uint32_t wg_chunk_at(uint32_t row, uint32_t k) { return row * 128 + ((k ^ (row & 7)) << 4); }

/* Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs. */
__device__ __forceinline__ void wg_fence_operands(float (&d)[16][4]) {
    asm volatile("" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])::"memory");
    asm volatile("" : "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])::"memory");
    asm volatile("" : "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3])::"memory");
    asm volatile("" : "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])::"memory");
    asm volatile("" : "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3])::"memory");
    asm volatile("" : "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3])::"memory");
    asm volatile("" : "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3])::"memory");
    asm volatile("" : "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])::"memory");
    asm volatile("" : "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3])::"memory");
    asm volatile("" : "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3])::"memory");
    asm volatile("" : "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3])::"memory");
    asm volatile("" : "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3])::"memory");
    asm volatile("" : "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3])::"memory");
    asm volatile("" : "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3])::"memory");
    asm volatile("" : "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3])::"memory");
    asm volatile("" : "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])::"memory");
}

/* d (64 rows x 128 items per warpgroup) += A (64 x 16, descriptor) * B (16 x 128, descriptor), both
 * f16 or (BF16) both bf16. */
#define WG_MMA_ASM(T)                                                                                          \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                            \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
#define WG_MMA_D "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
template <bool BF16> __device__ __forceinline__ void wg_mma(float (&d)[16][4], uint64_t a, uint64_t b) {
#if WG_HAVE
    if constexpr (BF16)
        asm volatile(WG_MMA_ASM("bf16") : WG_MMA_D : "l"(a), "l"(b), "r"(1));
    else
        asm volatile(WG_MMA_ASM("f16") : WG_MMA_D : "l"(a), "l"(b), "r"(1));
#endif
}

__device__ __forceinline__ void wg_fence(void) {
#if WG_HAVE
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit(void) {
#if WG_HAVE
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_wait_all(void) {
#if WG_HAVE
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#endif
}
/* Ordinary shared-memory writes (cp.async, the BF16 conversion) made visible to the MMAs. */
__device__ __forceinline__ void wg_fence_proxy(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* BF16_OPS (BF16 weights only): both operands bf16, the weights copied as stored and the
 * activations rounded to bf16; otherwise both f16. */
template <int TYPE, bool GLU, bool BF16_OPS>
__global__ void __launch_bounds__(WG_THREADS, 1)
    gemm_wgmma_kernel(gm_args a, const __half *x16, float *split_part, uint32_t n_split) {
    static_assert(!BF16_OPS || TYPE == EM_TYPE_BF16, "bf16 operands are for BF16 weights");
    extern __shared__ __align__(1024) uint8_t wg_buf[];
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    em_pdl_wait();
    /* MoE: blockIdx.z is the expert, its items [start, start + count) known on the device only;
     * dense: blockIdx.z is the split of K (em_cuda_gemm_wg_splits), its partial sums to split_part */
    const uint32_t e = blockIdx.z;
    const uint32_t count = a.counts ? a.counts[e] : a.n_items, start = a.starts ? a.starts[e] : 0;
    const uint32_t row0 = blockIdx.y * (GLU ? WG_ROWS / 2 : WG_ROWS);
    /* this thread's chunks: tile rows (items) tid / 8 + 64j, K chunk tid % 8 */
    const uint32_t kc = tid & 7, first = tid >> 3;
    const uint8_t *wrow[4];
#pragma unroll
    for (int j = 0; j < 4; j++) wrow[j] = gm_weight_row<GLU>(a, row0, a.counts ? e * a.mat_bytes : 0, first + 64 * j);
    const uint32_t all_steps = a.cols / WG_K, per_split = (all_steps + n_split - 1) / n_split;
    const uint32_t k_first = a.counts ? 0 : blockIdx.z * per_split; /* this block's K steps: k_first + 0 .. */
    const uint32_t n_steps = k_first < all_steps ? min(per_split, all_steps - k_first) : 0;
    constexpr bool ASYNC_W = TYPE == EM_TYPE_F16 || BF16_OPS; /* copied as stored */
    for (uint32_t t0 = blockIdx.x * WG_ITEMS; t0 < count; t0 += gridDim.x * WG_ITEMS) {
        const __half *xrow[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint32_t i = t0 + first + 64 * j;
            xrow[j] = i < count ? x16 + (uint64_t)(a.x_index ? a.x_index[start + i] : start + i) * a.cols : NULL;
        }
        auto issue = [&](uint32_t step) {
            if (step < n_steps) {
                uint8_t *wt = wg_buf + (step % WG_STAGES) * WG_STAGE, *xt = wt + WG_WTILE;
                if (ASYNC_W) {
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const uint8_t *src =
                            wrow[j] ? wrow[j] + ((uint64_t)(k_first + step) * WG_K + 8 * kc) * 2 : (const uint8_t *)x16;
                        gm_cp_async16(wt + wg_chunk_at(first + 64 * j, kc), src, wrow[j] ? 16 : 0);
                    }
                }
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const __half *src = xrow[j] ? xrow[j] + (uint64_t)(k_first + step) * WG_K + 8 * kc : x16;
                    gm_cp_async16(xt + wg_chunk_at(first + 64 * j, kc), src, xrow[j] ? 16 : 0);
                }
            }
            gm_cp_commit();
        };
        /* BF16 and quantized types: a step's weight bytes, loaded as stored (fetch_w) while the
         * thread waits at the step before's barrier, then decoded into their stage (store_w) */
        h8_raw<TYPE> wraw[4] = {};
        auto fetch_w = [&](uint32_t step) {
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (wrow[j]) wraw[j] = h8_fetch<TYPE>(wrow[j], (k_first + step) * (WG_K / 8) + kc);
        };
        auto store_w = [&](uint32_t step) {
            uint8_t *wt = wg_buf + (step % WG_STAGES) * WG_STAGE;
#pragma unroll
            for (int j = 0; j < 4; j++)
                *(uint4 *)(wt + wg_chunk_at(first + 64 * j, kc)) =
                    wrow[j] ? h8_decode<TYPE>(wraw[j], (k_first + step) * (WG_K / 8) + kc) : make_uint4(0, 0, 0, 0);
        };
        float acc[1][16][4];
#pragma unroll
        for (int n = 0; n < 16; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[0][n][c] = 0.0f;
        wg_fence_operands(acc[0]);
#pragma unroll
        for (int st = 0; st < WG_STAGES - 1; st++) issue(st);
        if (!ASYNC_W) {
            fetch_w(0);
            store_w(0);
        }
        for (uint32_t step = 0; step < n_steps; step++) {
            uint8_t *wt = wg_buf + (step % WG_STAGES) * WG_STAGE;
            if (!ASYNC_W && step + 1 < n_steps) fetch_w(step + 1);
            gm_cp_wait<WG_STAGES - 2>(); /* this thread's copies of `step` have landed */
            wg_fence_proxy();
            wg_wait_all();   /* the MMAs of step - 1 have read their stage */
            __syncthreads(); /* and everyone's copies of `step` are in place */
            issue(step + WG_STAGES - 1); /* into the stage of step - 1 */
            wg_fence();
            const uint8_t *wa = wt + (warp >> 2) * (WG_WTILE / 4);
#pragma unroll
            for (int kk = 0; kk < WG_K / 16; kk++)
                wg_mma<BF16_OPS>(acc[0], wg_desc(wa + 32 * kk), wg_desc(wt + WG_WTILE + 32 * kk));
            wg_commit();
            /* while the MMAs run: the next step's weights into their stage (last read by the MMAs
             * of step + 1 - WG_STAGES, done before the barrier above) */
            if (!ASYNC_W && step + 1 < n_steps) store_w(step + 1);
        }
        wg_wait_all();
        wg_fence_operands(acc[0]);
        gm_cp_wait<0>();
        __syncthreads(); /* every warpgroup's MMAs are done with the stages (the next item tile) */
        const uint32_t warp_row = (warp >> 2) * 64 + (warp & 3) * 16;
        gm_store_split<1, 16, GLU>(a, acc, row0, t0, count, start, warp_row, 0, lane, split_part, n_split);
    }
}

/* The split-K products' results (dense, not gated): Y[item][row] = the n_split partial sums in
 * split order, added into Y with the residual add, written where gm_store writes. */
__global__ void __launch_bounds__(256) gm_sum_splits_kernel(gm_args a, const float *split_part, uint32_t n_split) {
    em_pdl_wait();
    const uint64_t total = (uint64_t)a.n_items * a.rows;
    for (uint64_t i = blockIdx.x * 256ull + threadIdx.x; i < total; i += (uint64_t)gridDim.x * 256) {
        const uint32_t item = (uint32_t)(i / a.rows), r = (uint32_t)(i % a.rows);
        float sum = 0.0f;
        for (uint32_t k = 0; k < n_split; k++) sum += split_part[k * total + i];
        const int pi = em_cuda_part_of(a, r);
        const cuda_part &p = pi == 0 ? a.part[0] : pi == 1 ? a.part[1] : a.part[2];
        float *out = p.y + (r - p.begin) + (uint64_t)item * p.y_stride;
        *out = a.accumulate ? *out + sum : sum;
    }
}

template <int TYPE, int ITEMS>
static void gm_launch_glu(const cuda_backend *b, const gm_args &a, dim3 grid, bool glu, bool pipelined, uint32_t n_split) {
    float *part = b->wg_part;
    if (pipelined) {
        const size_t smem = gm_pipelined_smem(ITEMS);
        if (glu)
            em_cuda_launch(b, gemm_pipelined_kernel<TYPE, ITEMS, true>, grid, GM_THREADS, smem, a, part, n_split);
        else
            em_cuda_launch(b, gemm_pipelined_kernel<TYPE, ITEMS, false>, grid, GM_THREADS, smem, a, part, n_split);
    } else if (glu) {
        em_cuda_launch(b, gemm_kernel<TYPE, ITEMS, true>, grid, GM_THREADS, 0, a, part, n_split);
    } else {
        em_cuda_launch(b, gemm_kernel<TYPE, ITEMS, false>, grid, GM_THREADS, 0, a, part, n_split);
    }
}

template <int TYPE>
static void gm_launch_type(const cuda_backend *b, const gm_args &a, dim3 grid, int items, bool glu, bool pipelined,
                           uint32_t n_split) {
    switch (items) {
    case 32: gm_launch_glu<TYPE, 32>(b, a, grid, glu, pipelined, n_split); break;
    case 64: gm_launch_glu<TYPE, 64>(b, a, grid, glu, pipelined, n_split); break;
    default: gm_launch_glu<TYPE, 128>(b, a, grid, glu, pipelined, n_split); break;
    }
}

/* The splits' sums into Y, over at most 8 blocks a multiprocessor. */
static void gm_sum_splits(const cuda_backend *b, const gm_args &a, uint32_t n_split) {
    const uint64_t blocks = ((uint64_t)a.n_items * a.rows + 255) / 256, most = 8ull * b->n_sm;
    em_cuda_launch(b, gm_sum_splits_kernel, dim3((uint32_t)(blocks < most ? blocks : most)), 256, 0, a,
                   (const float *)b->wg_part, n_split);
}

/* The pipelined kernels use more than the default 48 KiB of shared memory: allowed once. */
template <int TYPE, int ITEMS> static cudaError_t gm_allow_smem_items(void) {
    cudaError_t status = cudaFuncSetAttribute(gemm_pipelined_kernel<TYPE, ITEMS, false>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gm_pipelined_smem(ITEMS));
    if (status == cudaSuccess)
        status = cudaFuncSetAttribute(gemm_pipelined_kernel<TYPE, ITEMS, true>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gm_pipelined_smem(ITEMS));
    return status;
}

template <int TYPE> static cudaError_t gm_allow_smem_type(void) {
    cudaError_t status = gm_allow_smem_items<TYPE, 32>();
    if (status == cudaSuccess) status = gm_allow_smem_items<TYPE, 64>();
    if (status == cudaSuccess) status = gm_allow_smem_items<TYPE, 128>();
    return status;
}

/* ... and the wgmma kernels more still (wg_smem). */
template <int TYPE, bool BF16_OPS> static cudaError_t wg_allow_smem_ops(void) {
    cudaError_t status = cudaFuncSetAttribute(gemm_wgmma_kernel<TYPE, false, BF16_OPS>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wg_smem);
    if (status == cudaSuccess)
        status = cudaFuncSetAttribute(gemm_wgmma_kernel<TYPE, true, BF16_OPS>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wg_smem);
    return status;
}
template <int TYPE> static cudaError_t wg_allow_smem_type(void) {
    cudaError_t status = wg_allow_smem_ops<TYPE, false>();
    if constexpr (TYPE == EM_TYPE_BF16)
        if (status == cudaSuccess) status = wg_allow_smem_ops<TYPE, true>();
    return status;
}

static cudaError_t gm_allow_smem(void) {
    cudaError_t status = cudaSuccess;
    em_cuda_each_type<false>([&](auto t) {
        if (status == cudaSuccess) status = gm_allow_smem_type<decltype(t)::value>();
        if (status == cudaSuccess) status = wg_allow_smem_type<decltype(t)::value>();
    });
    return status;
}

static bool gm_type_supported(uint32_t type) { return em_cuda_with_type<false>(type, [](auto) {}); }

/* The choices below come from measurements on an H200 (tests/cuda/check_gemm.cu, dense-1b and
 * moe-30b shapes, M = 8..8192); the numbers are in the commit that set them.
 *
 * Items per tile: a 32-item tile runs at about half the rate of the larger ones once the grid
 * fills the device, but with fewer items than blocks to spread, more blocks beat bigger tiles
 * (each block is bound by the latency of its K steps). So: the largest tile that still gives
 * three quarters of the multiprocessors a block, 128 only from 128 items (and not for the BF16
 * gated unit nor F16, where 64 measured faster), MoE experts 64 from 16 items on average. */
static uint32_t gm_pick_items(const cuda_backend *b, const cuda_matvec *mv, uint32_t rows) {
    const uint32_t type = mv->w->type, n = mv->n_items;
    if (mv->counts) return n >= 16 ? 64 : 32;
    if (n <= 32) return 32;
    if (n <= 64 && b->tuning.gemm_split && !mv->up) return 64; /* one item tile; gm_splits spreads K instead */
    const uint64_t row_tiles = (rows + (mv->up ? 64 : GM_ROWS) - 1) / (mv->up ? 64 : GM_ROWS);
    const uint64_t enough = 3 * (uint64_t)b->n_sm / 4;
    const bool allow_128 = n >= 128 && type != EM_TYPE_F16 && !(type == EM_TYPE_BF16 && mv->up);
    if (allow_128 && row_tiles * ((n + 127) / 128) >= enough) return 128;
    if (row_tiles * ((n + 63) / 64) >= enough) return 64;
    return 32;
}

/* The kernel: the pipelined one, except for F16 (its weights go through registers in both, and
 * the staged kernel measured a few percent faster) and for the register-decoded types with
 * 128-item tiles (staged faster there: the 1-block-per-SM pipelined kernel decodes with
 * fewer warps to hide the loads behind). */
static bool gm_pick_pipelined(uint32_t type, uint32_t items) {
    if (type == EM_TYPE_BF16) return true;
    if (type == EM_TYPE_F16) return false;
    return items != 128;
}

/* Splits of K for the mma.sync kernels: a dense product (not gated) whose tiles give fewer blocks
 * than three quarters of the multiprocessors multiplies each tile's K range in up to GM_SPLIT_MAX
 * parts of at least GM_SPLIT_STEPS steps, within two blocks a multiprocessor (the kernels'
 * occupancy) and the partial sums' scratch; gm_sum_splits_kernel adds the parts in order. The
 * splits follow from the tiles gm_pick_items would choose, so that a forced tile size (check_gemm)
 * gives the same bits. Why: a
 * short chunk's products (a follow-up turn of a few dozen tokens) had a block per row tile, each
 * walking the whole of K. EMBER_CUDA_GM_SPLIT=0: never. */
#define GM_SPLIT_MAX 8
#define GM_SPLIT_STEPS 8
static uint32_t gm_splits(const cuda_backend *b, const cuda_matvec *mv, uint32_t rows) {
    if (!b->tuning.gemm_split || mv->counts || mv->up) return 1;
    const uint32_t items = gm_pick_items(b, mv, rows); /* not the tile run: every tile adds in the same order */
    const uint64_t tiles = (uint64_t)(rows + GM_ROWS - 1) / GM_ROWS * ((mv->n_items + items - 1) / items);
    const uint32_t steps = mv->w->cols / GM_K;
    if (4 * tiles >= 3ull * b->n_sm) return 1;
    uint32_t s = 1;
    while (s < GM_SPLIT_MAX && tiles * (s + 1) <= 2ull * b->n_sm && steps / (s + 1) >= GM_SPLIT_STEPS &&
           (uint64_t)(s + 1) * mv->n_items * rows <= em_cuda_gemm_split_floats(b))
        s++;
    const uint32_t per = (steps + s - 1) / s; /* no split without steps */
    return (steps + per - 1) / per;
}

/* Splits of K for the wgmma kernel: a dense product (not gated) with too few tiles to fill the
 * device multiplies each tile's K range in up to WG_SPLIT_MAX parts, on as many blocks, then
 * gm_sum_splits_kernel adds them. Each part keeps at least WG_SPLIT_STEPS K steps, and the tiles
 * times the parts stay within one block per multiprocessor (the kernel's occupancy). Why: the
 * narrow products of a short prefill (a small model's O and down projections) have too few tiles
 * for the device, and on the smaller mma.sync tiles they took most of the prefill.
 * EMBER_CUDA_WG_SPLIT=0: never. */
#define WG_SPLIT_MAX 4
#define WG_SPLIT_STEPS 16
uint64_t em_cuda_wgmma_tiles(const cuda_matvec *mv) {
    const uint32_t out = mv->up ? WG_ROWS / 2 : WG_ROWS;
    return (uint32_t)((uint64_t)((em_cuda_matvec_rows(mv) + out - 1) / out) *
                      ((mv->n_items + WG_ITEMS - 1) / WG_ITEMS) * (mv->counts ? mv->n_groups : 1));
}

uint32_t em_cuda_gemm_wg_splits(const cuda_backend *b, const cuda_matvec *mv) {
    if (!b->tuning.wgmma_split || mv->counts || mv->up) return 1;
    const uint64_t tiles = em_cuda_wgmma_tiles(mv), steps = mv->w->cols / WG_K;
    uint32_t s = 1;
    while (s < WG_SPLIT_MAX && tiles * (s + 1) <= (uint64_t)b->n_sm && steps / (s + 1) >= WG_SPLIT_STEPS &&
           tiles * (s + 1) * WG_ROWS * WG_ITEMS <= em_cuda_gemm_split_floats(b))
        s++;
    return s;
}

uint64_t em_cuda_gemm_split_floats(const cuda_backend *b) { return (uint64_t)b->n_sm * WG_ROWS * WG_ITEMS; }

static uint32_t wg_x_rows(const cuda_matvec *mv) { return mv->counts ? mv->x_rows : mv->n_items; }

bool em_cuda_wgmma_takes(const cuda_backend *b, const cuda_matvec *mv) {
    return gm_type_supported(mv->w->type) && (mv->counts ? mv->x_rows > 0 : !mv->x_index) && mv->w->cols % WG_K == 0 &&
           b->x16 && (uint64_t)wg_x_rows(mv) * mv->w->cols <= b->x16_halves && b->wgmma_loaded;
}

template <int TYPE, bool BF16_OPS>
static void wg_launch_ops(const cuda_backend *b, const gm_args &a, dim3 grid, bool glu, uint32_t n_split) {
    if (glu)
        em_cuda_launch(b, gemm_wgmma_kernel<TYPE, true, BF16_OPS>, grid, WG_THREADS, wg_smem, a, (const __half *)b->x16,
                       b->wg_part, n_split);
    else
        em_cuda_launch(b, gemm_wgmma_kernel<TYPE, false, BF16_OPS>, grid, WG_THREADS, wg_smem, a, (const __half *)b->x16,
                       b->wg_part, n_split);
}
template <int TYPE>
static void wg_launch_type(const cuda_backend *b, const gm_args &a, dim3 grid, bool glu, uint32_t n_split,
                           bool bf16_ops) {
    if constexpr (TYPE == EM_TYPE_BF16)
        if (bf16_ops) return wg_launch_ops<TYPE, true>(b, a, grid, glu, n_split);
    wg_launch_ops<TYPE, false>(b, a, grid, glu, n_split);
}

static em_err wg_launch(cuda_backend *b, const cuda_matvec *mv, const gm_args &a, uint32_t n_split) {
    const uint32_t x_rows = wg_x_rows(mv);
    const uint64_t total = (uint64_t)x_rows * (a.cols / 8);
    const uint64_t round_blocks = (total + 255) / 256, most = 8ull * b->n_sm;
    /* BF16 weights meet activations in bf16, as stored, unless EMBER_CUDA_WG_BF16=0 (then both
     * f16, the weights converted on the way) */
    const bool bf16_ops = mv->w->type == EM_TYPE_BF16 && b->tuning.wgmma_bf16;
    em_cuda_launch(b, wg_round_kernel, dim3((uint32_t)(round_blocks < most ? round_blocks : most)), 256, 0, a, x_rows,
                   b->x16, bf16_ops);
    const bool glu = mv->up != NULL;
    const uint32_t out = glu ? WG_ROWS / 2 : WG_ROWS, row_tiles = (a.rows + out - 1) / out;
    if (row_tiles > 65535) return em_errorf(EM_ERR_UNSUPPORTED, "cuda gemm: %u rows for the wgmma kernel", a.rows);
    /* MoE: item tiles for twice the mean per expert; a block loops over any more */
    const uint32_t item_tiles = (uint32_t)(((uint64_t)mv->n_items * (mv->counts ? 2 : 1) + WG_ITEMS - 1) / WG_ITEMS);
    const dim3 grid(item_tiles ? item_tiles : 1, row_tiles, mv->counts ? mv->n_groups : n_split);
    em_cuda_with_type<false>(mv->w->type, [&](auto t) {
        wg_launch_type<decltype(t)::value>(b, a, grid, glu, n_split, bf16_ops);
    });
    if (n_split > 1) gm_sum_splits(b, a, n_split);
    CU_LAUNCHED();
    return NULL;
}

bool em_cuda_gemm_takes(const cuda_backend *b, const cuda_matvec *mv) {
    (void)b;
    return gm_type_supported(mv->w->type) && mv->w->cols % GM_K == 0 && mv->x_stride % 4 == 0 &&
           (uintptr_t)mv->x % 16 == 0 && !mv->norm_ss && !mv->next_norm_w;
}

em_err em_cuda_gemm_setup(cuda_backend *b) {
    CU_TRY(gm_allow_smem());
    uint32_t *probe = NULL, have = 0;
    CU_TRY(cudaMalloc((void **)&probe, sizeof *probe));
    wg_probe_kernel<<<1, 1, 0, b->stream>>>(probe);
    cudaError_t status = cudaGetLastError();
    if (status == cudaSuccess) status = cudaMemcpyAsync(&have, probe, sizeof have, cudaMemcpyDeviceToHost, b->stream);
    if (status == cudaSuccess) status = cudaStreamSynchronize(b->stream);
    cudaFree(probe);
    if (status != cudaSuccess)
        return em_errorf(EM_ERR_INTERNAL, "cuda gemm: probing for wgmma: %s", cudaGetErrorString(status));
    b->wgmma_loaded = have == 1;
    return NULL;
}

em_err em_cuda_gemm_with(cuda_backend *b, const cuda_matvec *mv, uint32_t items, em_cuda_gemm_kernel kernel) {
    const cuda_weight *w = mv->w;
    const uint32_t n_parts = mv->n_parts ? mv->n_parts : 1;
    if (mv->n_items == 0) return NULL;
    if (mv->norm_ss || mv->next_norm_w)
        return em_errorf(EM_ERR_INTERNAL, "cuda gemm: a fused norm is for small batches only");
    if (!gm_type_supported(w->type)) return em_errorf(EM_ERR_UNSUPPORTED, "cuda gemm: weight type %s", em_type_name(w->type));
    if (w->cols % GM_K || mv->x_stride % 4 || (uintptr_t)mv->x % 16)
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda gemm: %u columns, activation stride %llu", w->cols,
                         (unsigned long long)mv->x_stride);
    if (n_parts > GM_PARTS || (n_parts > 1 && (mv->counts || mv->up)))
        return em_errorf(EM_ERR_INTERNAL, "cuda gemm: %u parts", n_parts);
    if (kernel == EM_CUDA_GEMM_WGMMA && items) { /* the K splits, forced */
        if (items > WG_SPLIT_MAX || (items > 1 && (mv->counts || mv->up)) ||
            em_cuda_wgmma_tiles(mv) * items * WG_ROWS * WG_ITEMS > em_cuda_gemm_split_floats(b))
            return em_errorf(EM_ERR_INTERNAL, "cuda gemm: %u splits of K for the wgmma kernel", items);
    } else if (items != 0 && items != 32 && items != 64 && items != 128) {
        return em_errorf(EM_ERR_INTERNAL, "cuda gemm: %u items per tile", items);
    }
    gm_args a = {};
    em_err err = em_cuda_product_args(b, mv, &a);
    if (err) return err;
    if (kernel == EM_CUDA_GEMM_WGMMA || (kernel == EM_CUDA_GEMM_AUTO && !items && em_cuda_wgmma_wanted(b, mv))) {
        if (!em_cuda_wgmma_takes(b, mv))
            return em_errorf(EM_ERR_UNSUPPORTED, "cuda gemm: the wgmma kernel does not take %s %u x %u, %u items",
                             em_type_name(w->type), a.rows, w->cols, mv->n_items);
        return wg_launch(b, mv, a, kernel == EM_CUDA_GEMM_WGMMA && items ? items : em_cuda_gemm_wg_splits(b, mv));
    }
    const uint32_t rows = a.rows;
    if (!items) items = gm_pick_items(b, mv, rows);
    const uint32_t out = mv->up ? 64 : GM_ROWS;
    const uint32_t item_tiles = (mv->n_items + items - 1) / items;
    const uint32_t n_split = gm_splits(b, mv, rows);
    const dim3 grid((rows + out - 1) / out, item_tiles < 65535 ? item_tiles : 65535, mv->counts ? mv->n_groups : n_split);
    const bool glu = mv->up != NULL;
    const bool pipelined = kernel == EM_CUDA_GEMM_AUTO || kernel == EM_CUDA_GEMM_MMA ? gm_pick_pipelined(w->type, items)
                                                                                     : kernel == EM_CUDA_GEMM_PIPELINED;
    em_cuda_with_type<false>(w->type, [&](auto t) {
        gm_launch_type<decltype(t)::value>(b, a, grid, items, glu, pipelined, n_split);
    });
    if (n_split > 1) gm_sum_splits(b, a, n_split);
    CU_LAUNCHED();
    return NULL;
}
