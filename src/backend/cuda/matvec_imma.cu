/* Decode products of Q8_0 weights on the integer tensor cores: 2-16 items on activations rounded
 * to 8 bits, one mma.sync m16n8k32 (16 items x 32 values x 8 weight rows, bytes in, exact int32
 * sums out) per Q8_0 block of 8 rows.
 *
 * Why: matvec_dp4a.cu's kernel reads each weight once for all items, but spends one __dp4a per
 * four weights per item, so a product of 8 items costs 2.5 times one of a single item (the Q8_0
 * output head: 77 us at 1, 195 at 8; run 53). Here one instruction multiplies a block of 8 rows
 * with up to 16 items, and Q8_0's bytes go into the mma as they are.
 *
 * Layout: a block of MV_WARPS warps owns IM_ROWS = 8 rows (the mma's n); warp w sums every
 * MV_WARPS-th unit of 64 values (a pair of Q8_0 blocks) of the rows, then the block adds the
 * warps' sums in warp order. Lane (g = lane / 4, t = lane % 4) holds weight row g (B) and items g
 * and g + 8 (A). An mma sums over its 32 k slots whatever sits in them, as long as A and B agree:
 * lane t's two slots take aligned words of the block's bytes rather than bytes 4t.. and 16 + 4t..
 * A unit is 68 bytes from a 4-byte boundary; its second block's bytes are words 9-16 (slots: words
 * 9 + t and 13 + t), its first block's bytes start two bytes into word 0, so words 1-7 hold its
 * bytes 2-29 (slots: words 1 + t and 5 + t) and bytes 30, 31, 0, 1 make the last word, assembled
 * from words 8 and 0. The activations are rounded in the matching order (em_cuda_dq_round_rows
 * with rotate2: a unit's first chunk two bytes down), so every lane reads aligned words on both
 * sides. The int32 sum of a block times the weight block's scale and the activation chunk's scale
 * adds into f32.
 *
 * Each item's result depends on its own activations only, in a fixed order (an mma's integer sums
 * are exact; the scaling and the warps' sums go in a fixed order): a token gets the same bits in
 * any batch this kernel runs. Fusions as in matvec_dp4a.cu: parts (Q, K, V), a gated unit's two
 * matrices, the residual add, a fused norm's producer (next_ss: one partial sum per block) and
 * consumer (folded into the activations' scales by the rounding). */
#include "matvec.cuh"

#define IM_ROWS 8   /* weight rows per block: the mma's n */
#define IM_ITEMS 16 /* items per launch at most: the mma's m */
#define IM_UNROLL 4 /* units a warp loads before it multiplies */

/* c = a (16 items x 32 values) * b (32 values x 8 rows), bytes, summed exactly in int32. */
__device__ __forceinline__ void im_mma(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

/* Lane t's B words of unit u of a Q8_0 row (slots as the header says: b[0], b[1] of the unit's
 * first block, b[2], b[3] of its second), and the two blocks' scales as a half2. */
struct im_unit {
    uint32_t b[4];
    uint32_t d;
    __device__ __forceinline__ void load(const uint8_t *row, uint32_t u, uint32_t t) {
        const uint32_t *p = (const uint32_t *)(row + 68 * (uint64_t)u);
        const uint32_t w0 = p[0], w8 = p[8], mid = p[5 + t];
        b[0] = p[1 + t];
        b[1] = t < 3 ? mid : __byte_perm(w8, w0, 0x7610); /* bytes 30, 31 (word 8), 0, 1 (word 0) */
        b[2] = p[9 + t];
        b[3] = p[13 + t];
        d = __byte_perm(w0, w8, 0x7610); /* the first block's scale (word 0, low half), the second's */
    }
};

struct im_args : mv_args {
    const int8_t *xq; /* the items' rounded rows (rotate2 order) and their chunk scales */
    const float2 *xd;
};

/* Block b: rows 8b .. 8b + 7 (of all parts) for every item. */
template <bool BOTH, bool GLU> __global__ void __launch_bounds__(MV_THREADS) im_kernel(im_args a) {
    __shared__ float sums[GLU ? 2 : 1][MV_WARPS][IM_ITEMS][IM_ROWS];
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t units = a.cols / DQ_UNIT, chunks = a.cols / DQ_CHUNK, x_bytes = units * DQ_XUNIT;
    const uint32_t row0 = blockIdx.x * IM_ROWS;
    const uint8_t *w, *w2;
    {
        float *y;
        uint64_t ys;
        const uint32_t row = row0 + g < a.rows ? row0 + g : a.rows - 1; /* past the end: the last row, unused */
        mv_row(a, row, 0, &w, &w2, &y, &ys);
    }
    em_pdl_wait();
    /* items g and g + 8 (BOTH: more than 8 items); a missing item multiplies zeros */
    const bool has_lo = g < a.n_items, has_hi = BOTH && g + 8 < a.n_items;
    const int8_t *x_lo = a.xq + (uint64_t)g * x_bytes, *x_hi = a.xq + (uint64_t)(g + 8) * x_bytes;
    const float2 *d_lo = a.xd + (uint64_t)g * chunks, *d_hi = a.xd + (uint64_t)(g + 8) * chunks;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint32_t u0 = warp; u0 < units; u0 += MV_WARPS * IM_UNROLL) {
        im_unit wu[IM_UNROLL], wu2[IM_UNROLL];
        uint32_t xa[IM_UNROLL][2][4]; /* per unit and chunk: the A words (items g, g + 8) */
        float4 xs[IM_UNROLL][2];      /* per unit: items g, g + 8's chunk scales (.x, .z) */
#pragma unroll
        for (int k = 0; k < IM_UNROLL; k++) { /* every load of the step first */
            const uint32_t u = u0 + k * MV_WARPS;
            if (u >= units) break;
            wu[k].load(w, u, t);
            if (GLU) wu2[k].load(w2, u, t);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t *lo = (const uint32_t *)dq_xchunk(x_lo, 2 * u + h);
                const uint32_t *hi = (const uint32_t *)dq_xchunk(x_hi, 2 * u + h);
                xa[k][h][0] = has_lo ? lo[t] : 0u;
                xa[k][h][1] = has_hi ? hi[t] : 0u;
                xa[k][h][2] = has_lo ? lo[4 + t] : 0u;
                xa[k][h][3] = has_hi ? hi[4 + t] : 0u;
            }
            xs[k][0] = has_lo ? *(const float4 *)(d_lo + 2 * u) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            xs[k][1] = has_hi ? *(const float4 *)(d_hi + 2 * u) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < IM_UNROLL; k++) {
            if (u0 + k * MV_WARPS >= units) break;
            /* the weight scales of this lane's output rows 2t, 2t + 1 (lanes 8t.., 8t + 4..) */
            const uint32_t r0 = __shfl_sync(0xffffffffu, wu[k].d, 8 * t), r1 = __shfl_sync(0xffffffffu, wu[k].d, 8 * t + 4);
            uint32_t q0 = 0, q1 = 0;
            if (GLU) q0 = __shfl_sync(0xffffffffu, wu2[k].d, 8 * t), q1 = __shfl_sync(0xffffffffu, wu2[k].d, 8 * t + 4);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float dx_lo = h ? xs[k][0].z : xs[k][0].x, dx_hi = h ? xs[k][1].z : xs[k][1].x;
                int c[4];
                im_mma(c, xa[k][h], wu[k].b[2 * h], wu[k].b[2 * h + 1]);
                const float dw0 = __half2float(__ushort_as_half((unsigned short)(r0 >> (16 * h))));
                const float dw1 = __half2float(__ushort_as_half((unsigned short)(r1 >> (16 * h))));
                acc[0] += (float)c[0] * (dx_lo * dw0);
                acc[1] += (float)c[1] * (dx_lo * dw1);
                acc[2] += (float)c[2] * (dx_hi * dw0);
                acc[3] += (float)c[3] * (dx_hi * dw1);
                if (GLU) {
                    im_mma(c, xa[k][h], wu2[k].b[2 * h], wu2[k].b[2 * h + 1]);
                    const float uw0 = __half2float(__ushort_as_half((unsigned short)(q0 >> (16 * h))));
                    const float uw1 = __half2float(__ushort_as_half((unsigned short)(q1 >> (16 * h))));
                    acc2[0] += (float)c[0] * (dx_lo * uw0);
                    acc2[1] += (float)c[1] * (dx_lo * uw1);
                    acc2[2] += (float)c[2] * (dx_hi * uw0);
                    acc2[3] += (float)c[3] * (dx_hi * uw1);
                }
            }
        }
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
    const uint32_t n_parts = mv->n_parts ? mv->n_parts : 1;
    if (mv->w->type != EM_TYPE_Q8_0 || mv->counts || mv->n_items == 0 || mv->n_items > IM_ITEMS) return false;
    if (mv->w->cols % DQ_UNIT || mv->x_stride % 4 || n_parts > MV_PARTS || (n_parts > 1 && mv->up)) return false;
    if ((uint64_t)mv->n_items * (mv->w->cols / DQ_UNIT) * DQ_XUNIT > b->xq_bytes) return false;
    /* units are read as words: every matrix 4-byte aligned */
    if ((uintptr_t)mv->w->data % 4 || (mv->up && (uintptr_t)mv->up->data % 4)) return false;
    for (uint32_t i = 1; i < n_parts; i++)
        if ((uintptr_t)mv->more[i - 1].w->data % 4) return false;
    return true;
}

/* The items from which this kernel takes Q8_0 products (EMBER_CUDA_IMMA=N: from N items, 0:
 * never). */
static uint32_t im_min_items(void) {
    const char *v = getenv("EMBER_CUDA_IMMA");
    if (v && *v) return atoi(v) > 0 ? (uint32_t)atoi(v) : UINT32_MAX;
    return UINT32_MAX; /* off until measured */
}

bool em_cuda_imma_wanted(const cuda_backend *b, const cuda_matvec *mv) {
    return !em_cuda_tensor_cores_off() && mv->n_items >= im_min_items() && em_cuda_imma_takes(b, mv);
}

em_err em_cuda_imma(cuda_backend *b, const cuda_matvec *mv, const mv_args &base) {
    if (!em_cuda_imma_takes(b, mv))
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda integer mma matvec: %s, %u columns, %u items",
                         em_type_name(mv->w->type), mv->w->cols, mv->n_items);
    im_args a = {};
    static_cast<mv_args &>(a) = base;
    em_err err = em_cuda_dq_round_rows(b, mv, true);
    if (err) return err;
    a.xq = b->xq, a.xd = b->xd;
    const uint32_t blocks = (a.rows + IM_ROWS - 1) / IM_ROWS;
    err = mv_producer_blocks(b, a, blocks, "cuda integer mma matvec");
    if (err) return err;
    const bool both = mv->n_items > 8;
    if (mv->up) em_cuda_launch(b, both ? im_kernel<true, true> : im_kernel<false, true>, blocks, MV_THREADS, 0, a);
    else em_cuda_launch(b, both ? im_kernel<true, false> : im_kernel<false, false>, blocks, MV_THREADS, 0, a);
    CU_LAUNCHED();
    return NULL;
}
