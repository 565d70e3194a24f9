/* Matrix times 2-16 vectors on tensor cores: the products of batched decode steps (matvec.cu's
 * f32 kernel reads each weight once per 8 items, but feeds every weight to each item from L1, which
 * made a step of 8 tokens cost several times a step of one).
 *
 * One mma.sync m16n8k16 multiplies 16 items (A: the activations in f16) by 16 columns of 8 weight
 * rows (B: decoded in registers straight from global memory, rounded to f16), adding into f32.
 * A block of 8 warps owns 64 rows and one slice of K (blockIdx.y; ks slices); it first converts
 * its items' activations over that slice to f16 in shared memory (times the fused norm's RMS
 * factor, so the values are normalized and far inside f16's range), then each warp walks its 8
 * rows (F16/BF16 output heads: each block takes several such row groups with one staging). Lane
 * (g = lane / 4, t = lane % 4) takes groups 4j + t of each step of row g (32 groups, 16 for a
 * gated unit's two rows): the 4 lanes of a row read contiguous runs (IQ3_XXS: each lane a run of
 * its own, mt_iq3_runs). A sum over k does not care which element sits at which k of the mma, only
 * that A and B agree: the group's elements 0-3 go to the k slots the lane owns in one mma (2t,
 * 2t + 1, 2t + 8, 2t + 9) and elements 4-7 to those of a second, for B (row g) and A (items g and
 * g + 8) alike.
 *
 * With ks > 1 each block writes its partial sums; the last block of a row group to finish (a
 * counter per group) adds the ks partials in slice order, so the result does not depend on timing,
 * and applies the epilogue: the gated unit's activation, the residual add, and for a fused norm's
 * producer (next_ss) x * next norm weights and one partial sum of squares per row group. Each
 * item's result depends on its own activations only: a token gets the same bits in any batch this
 * kernel runs. */
#include "matvec.cuh"

#define MT_ROWS 8                    /* weight rows per warp: the mma's n */
#define MT_GROUP_ROWS (MT_ROWS * MV_WARPS) /* rows per block */
#define MT_STEP 32                   /* K slices are multiples of this many groups (a step of 8 per lane) */
#define MT_KS_MAX 8
#define MT_PAD 32                    /* f16 pad per staged row: rows 64 bytes apart in the banks */
#define MT_SMEM_MAX (200u << 10)

struct mt_args : mv_args {
    uint32_t kslice;     /* groups per K slice (a multiple of MT_STEP) */
    uint32_t row_groups; /* groups of 64 rows */
    float *partial;      /* ks > 1: [slice][row group][2][16 items][64 rows] */
    uint32_t *counter;   /* ks > 1: per row group */
    bool runs;           /* IQ3_XXS: each lane takes a run of consecutive groups (mt_iq3_runs) */
};

/* The raw IQ3_XXS fields of groups first .. first + J - 1 of a row (first a multiple of 4). */
template <int J>
__device__ __forceinline__ void mt_fetch_iq3_run(const uint8_t *row, uint32_t first, h8_raw<EM_TYPE_IQ3_XXS> r[J]) {
    const uint8_t *b = row + 98 * (uint64_t)(first >> 5);
    const uint32_t j0 = first & 31, d = ld_u16(b);
    uint32_t aux[(J + 3) / 4];
#pragma unroll
    for (int q = 0; q < (J + 3) / 4; q++) {
        const uint32_t ib = (j0 >> 2) + q;
        aux[q] = ld_u16(b + 66 + 4 * ib) | (ld_u16(b + 68 + 4 * ib) << 16);
    }
#pragma unroll
    for (int j = 0; j < J; j++) r[j] = {d, aux[j >> 2], ld_u16(b + 2 + 2 * (j0 + j))};
}

/* One step of a lane: groups s + 4j + t (j < J) of its row, those before `end` (TAIL; the others
 * count as zeros), against items g and g + 8 (the latter only when NT is 16) staged in `xs`. All
 * weight loads are issued before the first conversion: J groups of one row (or of two, a gated
 * unit's) in flight per lane. */
template <int TYPE, int NT, bool GLU, int J, bool TAIL>
__device__ __forceinline__ void mt_step(const uint8_t *w, const uint8_t *w2, const uint4 *xa, const uint4 *xb,
                                        uint32_t s, uint32_t t, uint32_t s0, uint32_t end, float acc[4],
                                        float acc2[4]) {
    uint4 wv[J], wv2[J];
#pragma unroll
    for (int j = 0; j < J; j++) {
        const uint32_t grp = s + 4 * j + t;
        const bool in = !TAIL || grp < end;
        wv[j] = in ? deq_h8<TYPE>(w, grp) : make_uint4(0, 0, 0, 0);
        if (GLU) wv2[j] = in ? deq_h8<TYPE>(w2, grp) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < J; j++) {
        const uint32_t at = s - s0 + 4 * j + t; /* the group's place in the staged slice */
        const bool in = !TAIL || s + 4 * j + t < end; /* past the end: zeros (the pad is not) */
        const uint4 av = in ? xa[at] : make_uint4(0, 0, 0, 0), bv = NT > 8 && in ? xb[at] : make_uint4(0, 0, 0, 0);
        mv_mma_f16(acc, av.x, bv.x, av.y, bv.y, wv[j].x, wv[j].y);
        mv_mma_f16(acc, av.z, bv.z, av.w, bv.w, wv[j].z, wv[j].w);
        if (GLU) {
            mv_mma_f16(acc2, av.x, bv.x, av.y, bv.y, wv2[j].x, wv2[j].y);
            mv_mma_f16(acc2, av.z, bv.z, av.w, bv.w, wv2[j].z, wv2[j].w);
        }
    }
}

/* IQ3_XXS in runs over the slice [s0, s1) (a multiple of 4J groups: rows of 256-element blocks,
 * slices of 32 groups). Each step, lane t takes the J consecutive groups s + Jt .. s + Jt + J - 1
 * (not mt_step's interleaved 4j + t), which share the block's scale and one or two sub-blocks'
 * signs: mt_fetch_iq3_run loads those once a run instead of once a group, and a run never crosses
 * a 32-group block. The next step's raw fields are loaded before this step's are decoded and
 * multiplied, so each warp keeps a step's loads in flight behind its arithmetic; the lattice comes
 * from shared memory, where a warp's scattered lookups cost fewer wavefronts than through the
 * read-only cache. The staged activations are read at the same places as the weights. */
template <int NT, bool GLU, int J>
__device__ __forceinline__ void mt_iq3_runs(const uint8_t *w, const uint8_t *w2, const uint4 *xa, const uint4 *xb,
                                            uint32_t t, uint32_t s0, uint32_t s1, const uint32_t *grid, float acc[4],
                                            float acc2[4]) {
    h8_raw<EM_TYPE_IQ3_XXS> cur[J], cur2[J];
    mt_fetch_iq3_run<J>(w, s0 + J * t, cur);
    if (GLU) mt_fetch_iq3_run<J>(w2, s0 + J * t, cur2);
    for (uint32_t s = s0; s < s1; s += 4 * J) {
        const uint32_t first = s + J * t;
        h8_raw<EM_TYPE_IQ3_XXS> next[J], next2[J];
        if (s + 4 * J < s1) {
            mt_fetch_iq3_run<J>(w, first + 4 * J, next);
            if (GLU) mt_fetch_iq3_run<J>(w2, first + 4 * J, next2);
        }
#pragma unroll
        for (int j = 0; j < J; j++) {
            const uint4 wv = h8_decode_iq3_xxs<false>(cur[j], first + j, grid);
            const uint4 av = xa[first + j - s0], bv = NT > 8 ? xb[first + j - s0] : make_uint4(0, 0, 0, 0);
            mv_mma_f16(acc, av.x, bv.x, av.y, bv.y, wv.x, wv.y);
            mv_mma_f16(acc, av.z, bv.z, av.w, bv.w, wv.z, wv.w);
            if (GLU) {
                const uint4 wv2 = h8_decode_iq3_xxs<false>(cur2[j], first + j, grid);
                mv_mma_f16(acc2, av.x, bv.x, av.y, bv.y, wv2.x, wv2.y);
                mv_mma_f16(acc2, av.z, bv.z, av.w, bv.w, wv2.z, wv2.w);
            }
        }
#pragma unroll
        for (int j = 0; j < J; j++) {
            cur[j] = next[j];
            if (GLU) cur2[j] = next2[j];
        }
    }
}

/* Before waiting for the previous kernel: asks L2 for this warp's 8 rows of row group rg (its
 * first) over the block's slice (up to 8 KB a row), which do not depend on that kernel. */
template <bool GLU> __device__ __forceinline__ void mt_prefetch(const mt_args &a, uint32_t rg) {
    if (a.counts || rg >= a.row_groups) return;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t row = rg * MT_GROUP_ROWS + warp * MT_ROWS + (lane & 7);
    if (row >= a.rows) return;
    const uint8_t *w, *w2;
    float *y;
    uint64_t ys;
    mv_row(a, row, 0, &w, &w2, &y, &ys);
    const uint64_t row_bytes = a.part[0].row_bytes, slice_bytes = row_bytes * a.kslice / a.groups;
    const uint64_t first = blockIdx.y * slice_bytes;
    const uint64_t end = first + (slice_bytes < (8u << 10) ? slice_bytes : (8u << 10));
    for (uint64_t off = first + 128 * (lane >> 3); off < end && off < row_bytes; off += 4 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w + off));
        if (GLU) asm volatile("prefetch.global.L2 [%0];" ::"l"(w2 + off));
    }
}

/* Row group rg (64 rows) of one K slice against the staged items c.. of the chunk: the products,
 * the split-K fix-up (the block that completes the group sums all slices in order), the epilogue
 * (gated unit, residual add, a fused norm's producer outputs). Called by every thread of the
 * block. */
template <int TYPE, int NT, bool GLU>
__device__ __forceinline__ void mt_row_group(const mt_args &a, uint32_t rg, uint32_t c, uint32_t count, uint32_t start,
                                             uint64_t mat_offset, const uint4 *xa, const uint4 *xb, uint32_t s0,
                                             uint32_t s1, const uint32_t *lattice, float (*block_ss)[16], bool *last) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t ks = gridDim.y;
    const uint32_t r0 = rg * MT_GROUP_ROWS + warp * MT_ROWS;
    const uint8_t *w, *w2;
    {
        float *y_unused;
        uint64_t ys_unused;
        mv_row(a, min(r0 + g, a.rows - 1), mat_offset, &w, &w2, &y_unused, &ys_unused);
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (r0 < a.rows) {
        constexpr int J = GLU ? 4 : 8; /* groups per lane per step */
        uint32_t s = s0;
        if (TYPE == EM_TYPE_IQ3_XXS && a.runs && (s1 - s0) % (4 * J) == 0) {
            mt_iq3_runs<NT, GLU, J>(w, w2, xa, xb, t, s0, s1, lattice, acc, acc2);
            s = s1;
        }
        for (; s + 4 * J <= s1; s += 4 * J) mt_step<TYPE, NT, GLU, J, false>(w, w2, xa, xb, s, t, s0, s1, acc, acc2);
        if (s < s1) mt_step<TYPE, NT, GLU, J, true>(w, w2, xa, xb, s, t, s0, s1, acc, acc2);
    }
    if (ks > 1) {
        /* leave the partials; the last block of the row group sums all slices in order */
        const uint64_t group = (uint64_t)blockIdx.z * a.row_groups + rg;
        float *mine = a.partial + ((uint64_t)blockIdx.y * gridDim.z * a.row_groups + group) * (2 * 16 * MT_GROUP_ROWS);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t item = g + (i >> 1) * 8, row = warp * MT_ROWS + 2 * t + (i & 1);
            mine[item * MT_GROUP_ROWS + row] = acc[i];
            if (GLU) mine[(16 + item) * MT_GROUP_ROWS + row] = acc2[i];
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            const uint32_t done = atomicAdd(&a.counter[group], 1u);
            *last = done == ks - 1;
            if (*last) a.counter[group] = 0; /* ready for the next launch */
        }
        __syncthreads();
        if (!*last) return;
        __threadfence();
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t item = g + (i >> 1) * 8, row = warp * MT_ROWS + 2 * t + (i & 1);
            float s1v = 0.0f, s2v = 0.0f;
            for (uint32_t q = 0; q < ks; q++) {
                const volatile float *p =
                    a.partial + ((uint64_t)q * gridDim.z * a.row_groups + group) * (2 * 16 * MT_GROUP_ROWS);
                s1v += p[item * MT_GROUP_ROWS + row];
                if (GLU) s2v += p[(16 + item) * MT_GROUP_ROWS + row];
            }
            acc[i] = s1v, acc2[i] = s2v;
        }
    }
    /* acc[0], acc[1]: item g, rows r0 + 2t, + 1; acc[2], acc[3]: item g + 8, the same rows */
    float ssum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t item = c + g + (i >> 1) * 8, row = r0 + 2 * t + (i & 1);
        if (item >= count || item >= c + NT || row >= a.rows) continue;
        const uint8_t *wr, *wr2;
        float *y;
        uint64_t ys;
        mv_row(a, row, 0, &wr, &wr2, &y, &ys);
        float *dst = y + (uint64_t)(start + item) * ys;
        const float r = GLU ? mv_glu(acc[i], acc2[i], a.act) : acc[i];
        const float v = a.accumulate ? *dst + r : r;
        *dst = v;
        if (a.next_ss) { /* a producer: one part, so `row` is the row of x */
            const float nw = a.next_norm_w[row];
            a.next_xw[dst - a.part[0].y] = v * (a.plus_one ? 1.0f + nw : nw);
            ssum[i >> 1] += v * v;
        }
    }
    if (a.next_ss) {
        /* the row group's partial sum of squares per item: over the lanes of an item, then over
         * the warps, in a fixed order */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float v = ssum[h];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (t == 0) block_ss[warp][g + 8 * h] = v;
        }
        __syncthreads();
        if (threadIdx.x < NT && c + threadIdx.x < count) {
            float total = 0.0f;
            for (int wi = 0; wi < MV_WARPS; wi++) total += block_ss[wi][threadIdx.x];
            a.next_ss[(uint64_t)(start + c + threadIdx.x) * a.ss_stride + rg] = total;
        }
        __syncthreads(); /* block_ss is read before the next row group writes it */
    }
}

template <int TYPE, int NT, bool GLU, bool FOLD>
__global__ void __launch_bounds__(MV_THREADS) mvt_kernel(mt_args a) {
    extern __shared__ uint4 xs[]; /* NT staged items, each kslice groups + the pad */
    mt_prefetch<GLU>(a, blockIdx.x);
    em_pdl_wait();
    const uint32_t g = (threadIdx.x & 31) >> 2;
    mv_group grp;
    if (!mv_group_of(a, blockIdx.z, &grp)) return;
    const uint32_t count = grp.count, start = grp.start;
    const uint64_t mat_offset = grp.mat_offset;
    const uint32_t s0 = blockIdx.y * a.kslice, s1 = min(a.groups, s0 + a.kslice);
    const uint32_t stride = a.kslice + MT_PAD / 8; /* uint4 per staged item */
    __shared__ float fold_scale[16];
    __shared__ float block_ss[MV_WARPS][16];
    __shared__ bool last;
    __shared__ uint32_t lattice[TYPE == EM_TYPE_IQ3_XXS ? 256 : 1]; /* with runs: IQ3_XXS's, copied once */
    if (TYPE == EM_TYPE_IQ3_XXS && a.runs)
        for (uint32_t i = threadIdx.x; i < 256; i += MV_THREADS) lattice[i] = em_cuda_iq3xxs_grid[i];
    for (uint32_t c = 0; c < count; c += NT) {
        if (FOLD) {
            /* the items' RMS factors, each summed in a fixed order by one warp */
            for (uint32_t t = threadIdx.x >> 5; t < NT; t += MV_WARPS) {
                const uint32_t i = start + min(c + t, count - 1);
                const float *part = a.norm_ss + (uint64_t)(a.x_index ? a.x_index[i] : i) * a.ss_stride;
                const float f = em_warp_rms_factor(part, a.norm_n, 8 * a.groups, a.eps);
                if ((threadIdx.x & 31) == 0) fold_scale[t] = f;
            }
            __syncthreads();
        }
        /* stage items c .. c + NT - 1 over the slice (items past the end as zeros) */
        const uint32_t width = s1 - s0;
        for (uint32_t idx = threadIdx.x; idx < NT * width; idx += MV_THREADS) {
            const uint32_t it = idx / width, grp = idx - it * width;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (c + it < count) {
                const uint32_t i = start + c + it;
                const float *x = a.x + (a.x_index ? a.x_index[i] : i) * a.x_stride + 8 * (uint64_t)(s0 + grp);
                const float sc = FOLD ? fold_scale[it] : 1.0f;
                const float4 p = *(const float4 *)x, q = *(const float4 *)(x + 4);
                v = make_uint4(pack_f16x2(p.x * sc, p.y * sc), pack_f16x2(p.z * sc, p.w * sc),
                               pack_f16x2(q.x * sc, q.y * sc), pack_f16x2(q.z * sc, q.w * sc));
            }
            xs[it * stride + grp] = v;
        }
        __syncthreads();
        const uint4 *xa = xs + g * stride, *xb = xs + (NT > 8 ? g + 8 : g) * stride;
        /* the row groups of this block, the staged items used for each */
        for (uint32_t rg = blockIdx.x; rg < a.row_groups; rg += gridDim.x)
            mt_row_group<TYPE, NT, GLU>(a, rg, c, count, start, mat_offset, xa, xb, s0, s1, lattice, block_ss, &last);
        if (c + NT < count) __syncthreads(); /* the staged items are read before the next chunk's */
    }
}

static uint32_t mt_smem(uint32_t nt, uint32_t kslice) { return nt * (kslice * 16 + MT_PAD * 2); }

/* How a product runs: items per chunk (8 or 16), K slices and their width in groups. */
typedef struct mt_plan {
    uint32_t nt, ks, kslice, row_groups;
    bool ok; /* false: the staged items would not fit in shared memory */
} mt_plan;

/* 16 items per chunk for more than 8 items (dense; MoE chunks of 8); K split into slices (dense
 * only: MoE grids have a row of blocks per expert) until the grid has about two blocks per
 * multiprocessor, within the split-K scratch, and further while 16 staged items would take more
 * than half the shared memory: the same slices for any number of items, so that a token's sums are
 * added in the same order in any batch. If the items still do not fit, chunks of 8. */
static mt_plan mt_plan_for(const cuda_backend *b, uint32_t rows, uint32_t groups, uint32_t n_items, bool moe) {
    mt_plan p;
    p.row_groups = (rows + MT_GROUP_ROWS - 1) / MT_GROUP_ROWS;
    const auto slice_of = [&](uint32_t k) { return ((groups + k - 1) / k + MT_STEP - 1) / MT_STEP * MT_STEP; };
    const auto can_split = [&](uint32_t k) {
        return !moe && b->mvt_part && p.row_groups <= b->mvt_groups &&
               (uint64_t)k * p.row_groups * 2 * 16 * MT_GROUP_ROWS <= b->mvt_part_floats && groups / k >= MT_STEP;
    };
    for (p.nt = n_items > 8 && !moe ? 16 : 8;; p.nt = 8) {
        p.ks = 1;
        while (p.ks < MT_KS_MAX && can_split(2 * p.ks) &&
               (p.row_groups * p.ks < 2u * (uint32_t)b->n_sm || mt_smem(16, slice_of(p.ks)) > MT_SMEM_MAX / 2))
            p.ks *= 2;
        p.kslice = slice_of(p.ks);
        p.ks = (groups + p.kslice - 1) / p.kslice;
        p.ok = mt_smem(p.nt, p.kslice) <= MT_SMEM_MAX;
        if (p.ok || p.nt == 8) return p;
    }
}

template <int TYPE, int NT, bool GLU, bool FOLD>
static em_err mvt_launch_nt(cuda_backend *b, const mt_args &a, dim3 grid, uint32_t smem) {
    em_cuda_launch(b, mvt_kernel<TYPE, NT, GLU, FOLD>, grid, MV_THREADS, smem, a);
    return NULL;
}

template <int TYPE, bool GLU, bool FOLD>
static em_err mvt_launch(cuda_backend *b, const mv_args &base, uint32_t grid_z, uint32_t n_items) {
    mt_args a;
    static_cast<mv_args &>(a) = base;
    const mt_plan p = mt_plan_for(b, a.rows, a.groups, n_items, a.counts != NULL);
    if (!p.ok) return em_errorf(EM_ERR_INTERNAL, "cuda matvec (tensor cores): %u columns do not fit", a.cols);
    a.kslice = p.kslice;
    a.row_groups = p.row_groups;
    a.partial = b->mvt_part;
    a.counter = b->mvt_counter;
    a.runs = b->tuning.tc_iq3_runs;
    if (a.next_ss) {
        if (a.row_groups > b->ss_stride)
            return em_errorf(EM_ERR_INTERNAL, "cuda matvec (tensor cores): %u row groups of partial sums, room for %u",
                             a.row_groups, b->ss_stride);
        b->ss_n = a.row_groups;
    }
    /* F16 and BF16 past about four blocks per multiprocessor (the output head): each block takes
     * several row groups, staging the items once for all of them; the quantized heads measured
     * slower that way, their blocks' first loads and L2 prefetches no longer overlapping other
     * blocks' work, so they keep one group */
    uint32_t grid_x = a.row_groups;
    const bool plain = a.part[0].row_bytes == 2ull * a.cols; /* F16, BF16 */
    if (plain && (uint64_t)a.row_groups * p.ks > 4u * (uint32_t)b->n_sm) {
        const uint32_t rounds = (a.row_groups * p.ks + 2 * b->n_sm - 1) / (2 * b->n_sm);
        grid_x = (a.row_groups + rounds - 1) / rounds;
    }
    const dim3 grid(grid_x, p.ks, grid_z);
    const uint32_t smem = mt_smem(p.nt, p.kslice);
    return p.nt == 16 ? mvt_launch_nt<TYPE, 16, GLU, FOLD>(b, a, grid, smem)
                      : mvt_launch_nt<TYPE, 8, GLU, FOLD>(b, a, grid, smem);
}

template <int TYPE>
static em_err mvt_type(cuda_backend *b, const mv_args &a, uint32_t grid_y, uint32_t n_items, bool glu, bool fold) {
    if (glu) return fold ? mvt_launch<TYPE, true, true>(b, a, grid_y, n_items) : mvt_launch<TYPE, true, false>(b, a, grid_y, n_items);
    return fold ? mvt_launch<TYPE, false, true>(b, a, grid_y, n_items) : mvt_launch<TYPE, false, false>(b, a, grid_y, n_items);
}

bool em_cuda_mvt_takes(const cuda_backend *b, const cuda_matvec *mv) {
    if (!em_cuda_with_type<false>(mv->w->type, [](auto) {})) return false; /* F32 weights keep the f32 kernel */
    if ((uintptr_t)mv->x % 16 || mv->x_stride % 4 || mv->w->cols % 8) return false;
    /* dense: up to 16 items; MoE: any number of an expert's items, in chunks of 8 */
    if (!mv->counts && mv->n_items > EM_CUDA_TC_ITEMS) return false;
    return mt_plan_for(b, em_cuda_matvec_rows(mv), mv->w->cols / 8, mv->n_items, mv->counts != NULL).ok;
}

em_err em_cuda_mvt(cuda_backend *b, const cuda_matvec *mv, mv_args a) {
    const uint32_t grid_y = !mv->counts ? 1 : mv->active ? mv->n_active_max : mv->n_groups;
    const bool glu = mv->up != NULL, fold = mv->norm_ss != NULL;
    const uint32_t n = mv->n_items;
    em_err err = NULL;
    if (!em_cuda_with_type<false>(mv->w->type, [&](auto t) { err = mvt_type<decltype(t)::value>(b, a, grid_y, n, glu, fold); }))
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda matvec (tensor cores): weight type %s", em_type_name(mv->w->type));
    if (err) return err;
    CU_LAUNCHED();
    return NULL;
}

/* Every variant's dynamic shared memory limit, raised once. */
template <int TYPE> static em_err mvt_allow_smem(void) {
    void (*kernels[])(mt_args) = {mvt_kernel<TYPE, 8, false, false>,  mvt_kernel<TYPE, 8, false, true>,
                                  mvt_kernel<TYPE, 8, true, false>,   mvt_kernel<TYPE, 8, true, true>,
                                  mvt_kernel<TYPE, 16, false, false>, mvt_kernel<TYPE, 16, false, true>,
                                  mvt_kernel<TYPE, 16, true, false>,  mvt_kernel<TYPE, 16, true, true>};
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        CU_TRY(cudaFuncSetAttribute(kernels[i], cudaFuncAttributeMaxDynamicSharedMemorySize, MT_SMEM_MAX));
    return NULL;
}

em_err em_cuda_mvt_setup(void) {
    em_err err = NULL;
    em_cuda_each_type<false>([&](auto t) {
        if (!err) err = mvt_allow_smem<decltype(t)::value>();
    });
    return err;
}
