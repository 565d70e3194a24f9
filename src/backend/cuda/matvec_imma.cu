/* Decode products on the tensor cores with the weights fed to the mma as they are stored. Q8_0
 * on the integer tensor cores: 2-16 items on activations rounded to 8 bits, one mma.sync m16n8k32
 * (16 items x 32 values x 8 weight rows, bytes in, exact int32 sums out) per Q8_0 block of 8 rows.
 * BF16 and F16: one mma.sync m16n8k16 in f16 per 16 values of 8 rows, the activations read as f32
 * and rounded to f16 in the lane that multiplies them (BF16 weights rounded to f16 on the way in,
 * as matvec_tc.cu does): no staging, no separate rounding launch.
 *
 * Why: matvec_dp4a.cu's kernel reads each weight once for all items, but spends one __dp4a per
 * four weights per item, so a product of 8 items costs several times one of a single item. Here
 * one instruction multiplies a block of 8 rows
 * with up to 16 items, and Q8_0's bytes go into the mma as they are. For BF16 / F16 the gain is
 * the plain layout: matvec_tc.cu stages each block's activations in shared memory and adds K
 * slices through global memory, which made its products slower at 2-8 items.
 *
 * Layout: a block of MV_WARPS warps owns IM_ROWS = 8 rows (the mma's n); warp w sums every
 * MV_WARPS-th group of the rows (Q8_0: four blocks, 128 values in 136 bytes; BF16 / F16: 64
 * values), then the block adds the warps' sums in warp order. Lane (g = lane / 4, t = lane % 4)
 * holds weight row g (B) and items g and g + 8 (A). An mma sums over its k slots whatever sits in
 * them, as long as A and B agree: so the four lanes of a row read its group as 8-byte words (word
 * m by lane m % 4) and hand the mma what they hold. Q8_0: each lane then holds 8 bytes of every
 * block, and the activations are rounded into the order the weights arrive in (dq_imma_byte,
 * matvec.cuh); the int32 sum of a block times the weight block's scale and the activation chunk's
 * scale adds into f32. BF16 / F16: lane t holds values 4t .. 4t + 3 of each 16, which go to the
 * k slots 2t, 2t + 1, 2t + 8, 2t + 9 for weights and activations alike.
 *
 * Each item's result depends on its own activations only, in a fixed order (an mma's integer sums
 * are exact; the scaling and the warps' sums go in a fixed order): a token gets the same bits in
 * any batch this kernel runs. Fusions as in matvec_dp4a.cu: parts (Q, K, V), a gated unit's two
 * matrices, the residual add, a fused norm's producer (next_ss: one partial sum per block) and
 * consumer (Q8_0: folded into the activations' scales by the rounding; BF16 / F16: the activations
 * times the item's RMS factor before they are rounded to f16). */
#include "matvec.cuh"

#define IM_ROWS 8   /* weight rows per block: the mma's n */
#define IM_ITEMS 16 /* items per launch at most: the mma's m */
#define IM_UNROLL 2 /* groups a warp loads before it multiplies (Q8_0: four blocks; BF16 / F16: 64 values) */
/* At least two blocks per multiprocessor: a block's warps take one or two rounds of loads each (the
 * rows are 2048-8192 values), so a second block's loads must overlap the first's sums and writes;
 * only the gated 9-16 item variant needs the bound (156 registers by ptxas's own choice, 128 with
 * it and 8 bytes of spill). */
#define IM_BLOCKS_PER_SM 2

/* c = a (16 items x 32 values) * b (32 values x 8 rows), bytes, summed exactly in int32. */
__device__ __forceinline__ void im_mma(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

/* Lane t's share of four Q8_0 blocks of a row (a group: 128 values, 136 bytes at 136 v, an 8-byte
 * boundary): 8-byte words t, t + 4, t + 8, t + 12 and, lane 0, 16. Block b's bytes go to the mma as
 * b[2b], b[2b + 1] (dq_imma_byte's order); lanes 1-3 hold each block's 8 as one word, lane 0 holds
 * bytes split around the blocks' scales and joins them. d[0], d[1]: the four blocks' scales as two
 * half2 (lane 0's only). */
struct im_group {
    uint32_t b[8];
    uint32_t d[2];
    __device__ __forceinline__ void load(const uint8_t *row, uint32_t v, uint32_t t) {
        const uint2 *p = (const uint2 *)(row + 136 * (uint64_t)v);
        const uint2 w0 = p[t], w1 = p[t + 4], w2 = p[t + 8], w3 = p[t + 12];
        const uint2 w4 = t == 0 ? p[16] : make_uint2(0u, 0u);
        const bool first = t == 0;
        /* lane 0: block 0 = bytes 2-7, 32-33; 1 = 36-39, 64-67; 2 = 70-71, 96-101; 3 = 128-135 */
        b[0] = first ? __byte_perm(w0.x, w0.y, 0x5432) : w0.x;
        b[1] = first ? __byte_perm(w0.y, w1.x, 0x5432) : w0.y;
        b[2] = first ? w1.y : w1.x;
        b[3] = first ? w2.x : w1.y;
        b[4] = first ? __byte_perm(w2.y, w3.x, 0x5432) : w2.x;
        b[5] = first ? __byte_perm(w3.x, w3.y, 0x5432) : w2.y;
        b[6] = first ? w4.x : w3.x;
        b[7] = first ? w4.y : w3.y;
        d[0] = __byte_perm(w0.x, w1.x, 0x7610); /* bytes 0-1, 34-35 */
        d[1] = __byte_perm(w2.y, w3.y, 0x7610); /* bytes 68-69, 102-103 */
    }
};

/* A half of a half2 word as a float. */
__device__ __forceinline__ float im_half(uint32_t w, int h) {
    return __half2float(__ushort_as_half((unsigned short)(w >> (16 * h))));
}

struct im_args : mv_args {
    const int8_t *xq; /* the items' rounded rows (dq_imma_byte's order) and their chunk scales */
    const float *xd;
};

/* acc[0..3] += the group's four blocks of this lane's mma tile: items g, g + 8 (xa: per block
 * the A words; xs: their four chunk scales) times weight rows 2t, 2t + 1 (B words, and the scales
 * that lane 0 of each row's four holds). */
__device__ __forceinline__ void im_group_dot(float acc[4], const uint32_t xa[4][4], const float4 xs[2],
                                             const im_group &wg, uint32_t t) {
    uint32_t s0[2], s1[2]; /* the scales of rows 2t (lane 8t) and 2t + 1 (lane 8t + 4) */
#pragma unroll
    for (int k = 0; k < 2; k++) {
        s0[k] = __shfl_sync(0xffffffffu, wg.d[k], 8 * t);
        s1[k] = __shfl_sync(0xffffffffu, wg.d[k], 8 * t + 4);
    }
#pragma unroll
    for (int blk = 0; blk < 4; blk++) {
        int c[4];
        im_mma(c, xa[blk], wg.b[2 * blk], wg.b[2 * blk + 1]);
        const float dw0 = im_half(s0[blk >> 1], blk & 1), dw1 = im_half(s1[blk >> 1], blk & 1);
        const float dx_lo = blk == 0 ? xs[0].x : blk == 1 ? xs[0].y : blk == 2 ? xs[0].z : xs[0].w;
        const float dx_hi = blk == 0 ? xs[1].x : blk == 1 ? xs[1].y : blk == 2 ? xs[1].z : xs[1].w;
        acc[0] += (float)c[0] * (dx_lo * dw0);
        acc[1] += (float)c[1] * (dx_lo * dw1);
        acc[2] += (float)c[2] * (dx_hi * dw0);
        acc[3] += (float)c[3] * (dx_hi * dw1);
    }
}

/* The Q8_0 products of this lane's tile over the warp's groups: acc (and acc2, the up matrix's)
 * for items g, g + 8 and rows 2t, 2t + 1. */
template <bool BOTH, bool GLU>
__device__ __forceinline__ void im_sums_q8(const im_args &a, const uint8_t *w, const uint8_t *w2, float acc[4],
                                           float acc2[4]) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t groups = a.cols / (2 * DQ_UNIT), chunks = a.cols / DQ_CHUNK;
    /* items g and g + 8 (BOTH: more than 8 items); a missing item multiplies zeros */
    const bool has_lo = g < a.n_items, has_hi = BOTH && g + 8 < a.n_items;
    const int8_t *x_lo = a.xq + (uint64_t)g * a.cols + 32 * t, *x_hi = a.xq + (uint64_t)(g + 8) * a.cols + 32 * t;
    const float *d_lo = a.xd + (uint64_t)g * chunks, *d_hi = a.xd + (uint64_t)(g + 8) * chunks;
    for (uint32_t v0 = warp; v0 < groups; v0 += MV_WARPS * IM_UNROLL) {
        im_group wg[IM_UNROLL], wg2[IM_UNROLL];
        uint32_t xa[IM_UNROLL][4][4]; /* per group and block: the A words (items g, g + 8) */
        float4 xs[IM_UNROLL][2];      /* per group: items g, g + 8's four chunk scales */
#pragma unroll
        for (int k = 0; k < IM_UNROLL; k++) { /* every load of the step first */
            const uint32_t v = v0 + k * MV_WARPS;
            if (v >= groups) break;
            wg[k].load(w, v, t);
            if (GLU) wg2[k].load(w2, v, t);
            const uint4 z = make_uint4(0u, 0u, 0u, 0u);
            const uint4 l0 = has_lo ? ((const uint4 *)(x_lo + 128 * (uint64_t)v))[0] : z;
            const uint4 l1 = has_lo ? ((const uint4 *)(x_lo + 128 * (uint64_t)v))[1] : z;
            const uint4 h0 = has_hi ? ((const uint4 *)(x_hi + 128 * (uint64_t)v))[0] : z;
            const uint4 h1 = has_hi ? ((const uint4 *)(x_hi + 128 * (uint64_t)v))[1] : z;
            /* mma A: {item g word 1 of 2, item g + 8's, item g word 2, item g + 8's} per block */
            const uint32_t lo[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
            const uint32_t hi[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
            for (int blk = 0; blk < 4; blk++) {
                xa[k][blk][0] = lo[2 * blk], xa[k][blk][1] = hi[2 * blk];
                xa[k][blk][2] = lo[2 * blk + 1], xa[k][blk][3] = hi[2 * blk + 1];
            }
            const float4 zf = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            xs[k][0] = has_lo ? *(const float4 *)(d_lo + 4 * v) : zf;
            xs[k][1] = has_hi ? *(const float4 *)(d_hi + 4 * v) : zf;
        }
#pragma unroll
        for (int k = 0; k < IM_UNROLL; k++) {
            if (v0 + k * MV_WARPS >= groups) break;
            im_group_dot(acc, xa[k], xs[k], wg[k], t);
            if (GLU) im_group_dot(acc2, xa[k], xs[k], wg2[k], t);
        }
    }
}

/* Two values as an f16 pair (the low half first). */
__device__ __forceinline__ uint32_t hm_pair(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}

/* Lane t's share of a group of 64 BF16 or F16 weights of a row (128 bytes at 128 v): of each
 * 16-value chunk j the 8-byte word 4j + t, values 4t .. 4t + 3, as two f16 pairs b[2j], b[2j + 1]
 * (the mma's k slots 2t, 2t + 1 and 2t + 8, 2t + 9; the activations go to the same slots). */
template <int TYPE> struct hm_group {
    uint32_t b[8];
    __device__ __forceinline__ void load(const uint8_t *row, uint32_t v, uint32_t t) {
        const uint2 *p = (const uint2 *)(row + 128 * (uint64_t)v);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint2 u = p[4 * j + t];
            if constexpr (TYPE == EM_TYPE_BF16) {
                b[2 * j] = hm_pair(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u));
                b[2 * j + 1] = hm_pair(__uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
            } else {
                b[2 * j] = u.x, b[2 * j + 1] = u.y;
            }
        }
    }
};

/* The BF16 / F16 products of this lane's tile over the warp's groups, as im_sums_q8's: the
 * activations read as f32 straight from X (no rounding launch), times the item's fused-norm factor
 * (fold), rounded to f16 in the lane. */
template <int TYPE, bool BOTH, bool GLU>
__device__ __forceinline__ void im_sums_half(const im_args &a, const uint8_t *w, const uint8_t *w2, const float *fold,
                                             float acc[4], float acc2[4]) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t groups = a.cols / DQ_UNIT;
    const bool has_lo = g < a.n_items, has_hi = BOTH && g + 8 < a.n_items;
    const uint32_t i_lo = has_lo ? g : 0, i_hi = has_hi ? g + 8 : 0;
    const float *x_lo = a.x + (uint64_t)(a.x_index ? a.x_index[i_lo] : i_lo) * a.x_stride + 4 * t;
    const float *x_hi = a.x + (uint64_t)(a.x_index ? a.x_index[i_hi] : i_hi) * a.x_stride + 4 * t;
    const float f_lo = fold[i_lo], f_hi = fold[i_hi];
    for (uint32_t v0 = warp; v0 < groups; v0 += MV_WARPS * IM_UNROLL) {
        hm_group<TYPE> wg[IM_UNROLL], wg2[IM_UNROLL];
        float4 xl[IM_UNROLL][4], xh[IM_UNROLL][4];
#pragma unroll
        for (int k = 0; k < IM_UNROLL; k++) { /* every load of the step first */
            const uint32_t v = v0 + k * MV_WARPS;
            if (v >= groups) break;
            wg[k].load(w, v, t);
            if (GLU) wg2[k].load(w2, v, t);
            const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                xl[k][j] = has_lo ? *(const float4 *)(x_lo + DQ_UNIT * (uint64_t)v + 16 * j) : z;
                xh[k][j] = has_hi ? *(const float4 *)(x_hi + DQ_UNIT * (uint64_t)v + 16 * j) : z;
            }
        }
#pragma unroll
        for (int k = 0; k < IM_UNROLL; k++) {
            if (v0 + k * MV_WARPS >= groups) break;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float4 l = xl[k][j], h = xh[k][j];
                const uint32_t a0 = hm_pair(l.x * f_lo, l.y * f_lo), a2 = hm_pair(l.z * f_lo, l.w * f_lo);
                const uint32_t a1 = hm_pair(h.x * f_hi, h.y * f_hi), a3 = hm_pair(h.z * f_hi, h.w * f_hi);
                mv_mma_f16(acc, a0, a1, a2, a3, wg[k].b[2 * j], wg[k].b[2 * j + 1]);
                if (GLU) mv_mma_f16(acc2, a0, a1, a2, a3, wg2[k].b[2 * j], wg2[k].b[2 * j + 1]);
            }
        }
    }
}

/* Block b: rows 8b .. 8b + 7 (of all parts) for every item. */
template <int TYPE, bool BOTH, bool GLU>
__global__ void __launch_bounds__(MV_THREADS, IM_BLOCKS_PER_SM) im_kernel(im_args a) {
    __shared__ float sums[GLU ? 2 : 1][MV_WARPS][IM_ITEMS][IM_ROWS];
    __shared__ float fold[IM_ITEMS]; /* BF16 / F16: each item's fused-norm factor (else 1) */
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t row0 = blockIdx.x * IM_ROWS;
    const uint8_t *w, *w2;
    {
        float *y;
        uint64_t ys;
        const uint32_t row = row0 + g < a.rows ? row0 + g : a.rows - 1; /* past the end: the last row, unused */
        mv_row(a, row, 0, &w, &w2, &y, &ys);
    }
    em_pdl_wait();
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (TYPE == EM_TYPE_Q8_0) {
        im_sums_q8<BOTH, GLU>(a, w, w2, acc, acc2);
    } else {
        for (uint32_t i = warp; i < IM_ITEMS; i += MV_WARPS) { /* warp w: items w, w + 8, partials in order */
            float f = 1.0f;
            if (a.norm_ss && i < a.n_items) {
                const float *part = a.norm_ss + (uint64_t)(a.x_index ? a.x_index[i] : i) * a.ss_stride;
                f = em_warp_rms_factor(part, a.norm_n, a.cols, a.eps);
            }
            if (lane == 0) fold[i] = f;
        }
        __syncthreads();
        im_sums_half<TYPE, BOTH, GLU>(a, w, w2, fold, acc, acc2);
    }
    /* C: this lane's items g (acc[0], acc[1]) and g + 8 (acc[2], acc[3]), rows 2t and 2t + 1 */
#pragma unroll
    for (int m = 0; m < (GLU ? 2 : 1); m++) {
        const float *v = m ? acc2 : acc;
        sums[m][warp][g][2 * t] = v[0], sums[m][warp][g][2 * t + 1] = v[1];
        if (BOTH) sums[m][warp][g + 8][2 * t] = v[2], sums[m][warp][g + 8][2 * t + 1] = v[3];
    }
    __syncthreads();
    /* thread k < items * 8: item k / 8, row k % 8 (eight lanes an item) */
    const uint32_t item = threadIdx.x / IM_ROWS, r = threadIdx.x % IM_ROWS, row = row0 + r;
    const bool live = item < a.n_items && row < a.rows;
    float ss = 0.0f;
    if (live) {
        float s = 0.0f, s2 = 0.0f;
        for (int k = 0; k < MV_WARPS; k++) { /* the warps' slices in order */
            s += sums[0][k][item][r];
            if (GLU) s2 += sums[GLU ? 1 : 0][k][item][r];
        }
        const uint8_t *wr, *wr2;
        float *y;
        uint64_t ys;
        mv_row(a, row, 0, &wr, &wr2, &y, &ys);
        float *dst = y + (uint64_t)item * ys;
        const float res = GLU ? mv_glu(s, s2, a.act) : s;
        const float v = a.accumulate ? *dst + res : res;
        *dst = v;
        if (a.next_ss) { /* a producer: one part, so `row` indexes the norm's weights */
            const float nw = a.next_norm_w[row];
            a.next_xw[dst - a.part[0].y] = v * (a.plus_one ? 1.0f + nw : nw);
            ss = v * v;
        }
    }
    if (a.next_ss && threadIdx.x < IM_ITEMS * IM_ROWS) { /* the block's partial sum per item, rows in a fixed order */
        for (int off = IM_ROWS / 2; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (r == 0 && item < a.n_items) a.next_ss[(uint64_t)item * a.ss_stride + blockIdx.x] = ss;
    }
}

bool em_cuda_imma_takes(const cuda_backend *b, const cuda_matvec *mv) {
    const uint32_t n_parts = mv->n_parts ? mv->n_parts : 1, type = mv->w->type;
    const bool q8 = type == EM_TYPE_Q8_0, half = type == EM_TYPE_BF16 || type == EM_TYPE_F16;
    if (!(q8 || half) || mv->counts || mv->n_items == 0 || mv->n_items > IM_ITEMS) return false;
    if (mv->w->cols % (2 * DQ_UNIT) || mv->x_stride % 4 || n_parts > MV_PARTS || (n_parts > 1 && mv->up)) return false;
    if (q8 && (uint64_t)mv->n_items * (mv->w->cols / DQ_UNIT) * DQ_XUNIT > b->xq_bytes) return false;
    if (half && (uintptr_t)mv->x % 16) return false; /* X read as float4 */
    /* weights are read as 8-byte words: every matrix 8-byte aligned */
    if ((uintptr_t)mv->w->data % 8 || (mv->up && (uintptr_t)mv->up->data % 8)) return false;
    for (uint32_t i = 1; i < n_parts; i++)
        if ((uintptr_t)mv->more[i - 1].w->data % 8) return false;
    return true;
}

template <int TYPE> static void im_launch(cuda_backend *b, const im_args &a, uint32_t blocks, bool both, bool glu) {
    if (glu) em_cuda_launch(b, both ? im_kernel<TYPE, true, true> : im_kernel<TYPE, false, true>, blocks, MV_THREADS, 0, a);
    else em_cuda_launch(b, both ? im_kernel<TYPE, true, false> : im_kernel<TYPE, false, false>, blocks, MV_THREADS, 0, a);
}

em_err em_cuda_imma(cuda_backend *b, const cuda_matvec *mv, const mv_args &base) {
    if (!em_cuda_imma_takes(b, mv))
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda tensor-core matvec (mma on the weights as stored): %s, %u columns, %u items",
                         em_type_name(mv->w->type), mv->w->cols, mv->n_items);
    im_args a = {};
    static_cast<mv_args &>(a) = base;
    const uint32_t type = mv->w->type;
    if (type == EM_TYPE_Q8_0) {
        em_err err = em_cuda_dq_round_rows(b, mv, true);
        if (err) return err;
        a.xq = b->xq, a.xd = (const float *)b->xd;
    }
    const uint32_t blocks = (a.rows + IM_ROWS - 1) / IM_ROWS;
    em_err err = mv_producer_blocks(b, a, blocks, "cuda tensor-core matvec (weights as stored)");
    if (err) return err;
    const bool both = mv->n_items > 8, glu = mv->up != NULL;
    if (type == EM_TYPE_Q8_0) im_launch<EM_TYPE_Q8_0>(b, a, blocks, both, glu);
    else if (type == EM_TYPE_BF16) im_launch<EM_TYPE_BF16>(b, a, blocks, both, glu);
    else im_launch<EM_TYPE_F16>(b, a, blocks, both, glu);
    CU_LAUNCHED();
    return NULL;
}
