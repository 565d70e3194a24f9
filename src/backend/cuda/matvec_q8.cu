/* Decode products of Q8_0 weights on 8-bit activations, with integer dot products.
 *
 * The f32 kernel (matvec.cu) decodes every weight to f32 and multiplies it with an f32 activation:
 * per 8 weights, five small loads, eight conversions and eight multiply-adds per item, and 32 bytes
 * of activations per item. Here the activations are rounded once per product to signed bytes with
 * one f32 scale per 32 values (Q8_0's own block size), and each lane takes whole 34-byte weight
 * blocks: nine aligned 4-byte loads (a block starts 2 bytes off a 4-byte boundary every other
 * time; funnel shifts line its bytes up), then per item two 16-byte loads of activation bytes and
 * eight __dp4a, four products each. The result is d_w * d_x * (integer sum) per block.
 *
 * An experiment, not used by the engine: only tests/cuda/check_gemm calls it. It changes the
 * arithmetic (activations rounded to 8 bits, as llama.cpp's CUDA kernels do), and
 * tests/cuda/check_cuda.c compares the GPU against a CPU reference with f32 activations on
 * purpose (its header says why), so the engine's use of it needs that policy settled first.
 * Plain dense products only (one or more parts, the residual add); no MoE, gated unit or folded
 * norm yet. */
#include "matvec.cuh"

#define Q8_BLOCK 32
#define Q8_BLOCK_BYTES 34

/* x[item][cols] (rows x_stride apart) -> xq[item][cols] bytes and xd[item][cols / 32] scales, one
 * warp per 32 values: scale = max |x| / 127, byte = round(x / scale). */
__global__ void q8_quantize_kernel(const float *x, uint64_t x_stride, uint32_t cols, uint32_t n_items, int8_t *xq,
                                   float *xd) {
    em_pdl_wait();
    const uint32_t lane = threadIdx.x & 31, per_item = cols / Q8_BLOCK;
    const uint64_t w = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= (uint64_t)n_items * per_item) return;
    const uint64_t item = w / per_item, blk = w % per_item;
    const float v = x[item * x_stride + blk * Q8_BLOCK + lane];
    const float d = em_warp_max(fabsf(v)) / 127.0f;
    xq[item * cols + blk * Q8_BLOCK + lane] = (int8_t)(d > 0.0f ? __float2int_rn(v / d) : 0);
    if (lane == 0) xd[item * per_item + blk] = d;
}

/* The 34-byte Q8_0 block at p (2-byte aligned): its scale and its 32 bytes as 8 words. Reads only
 * the block's bytes and, when p is 2 bytes off a 4-byte boundary, the 2 bytes before it (the
 * previous block's; a row's first block is 4-byte aligned when rows have an even block count). */
__device__ __forceinline__ float q8_block(const uint8_t *p, uint32_t qs[8]) {
    const bool off = (uintptr_t)p & 2;
    const uint32_t *base = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    uint32_t wd[9];
#pragma unroll
    for (int k = 0; k < 8; k++) wd[k] = base[k];
    wd[8] = off ? base[8] : *(const uint16_t *)(p + 32);
    const uint32_t shift = off ? 32 : 16;
#pragma unroll
    for (int j = 0; j < 8; j++) qs[j] = __funnelshift_rc(wd[j], wd[j + 1], shift);
    return __half2float(__ushort_as_half((unsigned short)(off ? wd[0] >> 16 : wd[0] & 0xffff)));
}

/* Each warp a row at a time (grid-stride), lanes over the row's blocks; NT items per pass. */
template <int NT> __global__ void __launch_bounds__(MV_THREADS) q8_matvec_kernel(mv_args a, const int8_t *xq, const float *xd) {
    em_pdl_wait();
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, blocks = a.cols / Q8_BLOCK;
    for (uint32_t r = blockIdx.x * MV_WARPS + warp; r < a.rows; r += gridDim.x * MV_WARPS) {
        const uint8_t *w, *w2;
        float *y;
        uint64_t ys;
        mv_row(a, r, 0, &w, &w2, &y, &ys);
        for (uint32_t c = 0; c < a.n_items; c += NT) {
            float acc[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) acc[t] = 0.0f;
#pragma unroll 2 /* two blocks' loads in flight per lane (2048 columns: each lane's whole share) */
            for (uint32_t blk = lane; blk < blocks; blk += 32) {
                uint32_t qs[8];
                const float dw = q8_block(w + (uint64_t)Q8_BLOCK_BYTES * blk, qs);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const uint32_t item = min(c + t, a.n_items - 1);
                    const uint4 *xp = (const uint4 *)(xq + (uint64_t)item * a.cols + Q8_BLOCK * blk);
                    const uint4 x0 = xp[0], x1 = xp[1];
                    int s = __dp4a((int)qs[0], (int)x0.x, 0);
                    s = __dp4a((int)qs[1], (int)x0.y, s);
                    s = __dp4a((int)qs[2], (int)x0.z, s);
                    s = __dp4a((int)qs[3], (int)x0.w, s);
                    s = __dp4a((int)qs[4], (int)x1.x, s);
                    s = __dp4a((int)qs[5], (int)x1.y, s);
                    s = __dp4a((int)qs[6], (int)x1.z, s);
                    s = __dp4a((int)qs[7], (int)x1.w, s);
                    acc[t] += dw * xd[(uint64_t)item * blocks + blk] * (float)s;
                }
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float sum = em_warp_sum(acc[t]);
                if (lane == 0 && c + t < a.n_items) {
                    float *dst = y + (uint64_t)(c + t) * ys;
                    *dst = a.accumulate ? *dst + sum : sum;
                }
            }
        }
    }
}

em_err em_cuda_matvec_q8(cuda_backend *b, const cuda_matvec *mv, int8_t *xq, float *xd) {
    const cuda_weight *w = mv->w;
    if (mv->n_items == 0) return NULL;
    if (w->type != EM_TYPE_Q8_0 || w->cols % (2 * Q8_BLOCK) || mv->x_stride % 4 || mv->up || mv->counts ||
        mv->x_index || mv->norm_ss || mv->next_norm_w)
        return em_errorf(EM_ERR_UNSUPPORTED,
                         "cuda q8 matvec: plain dense Q8_0 products with an even number of blocks per row only");
    mv_args a = {};
    em_err err = em_cuda_product_args(b, mv, &a);
    if (err) return err;
    a.groups = w->cols / 8;
    const uint64_t warps = (uint64_t)mv->n_items * (w->cols / Q8_BLOCK);
    em_cuda_launch(b, q8_quantize_kernel, (uint32_t)((warps + 7) / 8), 256, 0, mv->x, mv->x_stride, w->cols,
                   mv->n_items, xq, xd);
    CU_LAUNCHED();
    const uint32_t grid = (a.rows + MV_WARPS - 1) / MV_WARPS;
    const int8_t *cxq = xq;
    const float *cxd = xd;
    if (mv->n_items >= 8)
        em_cuda_launch(b, q8_matvec_kernel<8>, grid, MV_THREADS, 0, a, cxq, cxd);
    else if (mv->n_items >= 4)
        em_cuda_launch(b, q8_matvec_kernel<4>, grid, MV_THREADS, 0, a, cxq, cxd);
    else if (mv->n_items >= 2)
        em_cuda_launch(b, q8_matvec_kernel<2>, grid, MV_THREADS, 0, a, cxq, cxd);
    else
        em_cuda_launch(b, q8_matvec_kernel<1>, grid, MV_THREADS, 0, a, cxq, cxd);
    CU_LAUNCHED();
    return NULL;
}
