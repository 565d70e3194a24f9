/* What the decode-sized product kernels share: matvec.cu's f32 kernel (matrix times a few vectors
 * on the CUDA cores), matvec_tc.cu's tensor-core kernel for 2-16 items, matvec_dp4a.cu's integer
 * kernel on 8-bit activations and matvec_imma.cu's, with the weights fed to mma.sync as stored
 * (Q8_0 on the integer tensor cores, BF16 / F16 in f16). All take the same arguments, built by
 * em_cuda_matvec from a cuda_matvec (internal.cuh). */
#ifndef EMBER_BACKEND_CUDA_MATVEC_CUH
#define EMBER_BACKEND_CUDA_MATVEC_CUH

#include "internal.cuh"
#include "dequant.cuh"

#define MV_WARPS 8
#define MV_THREADS (MV_WARPS * 32)
#define MV_PARTS EM_CUDA_PARTS

struct mv_args : cuda_product_args {
    uint32_t groups;       /* cols / 8 */
    const uint32_t *active, *n_active; /* MoE: grid row -> expert, and how many grid rows have one */
    uint32_t ks;           /* warps that share a row, each summing a slice of it (1, 2, 4 or 8) */
    uint32_t item_chunk;   /* dense products of many items: items per grid layer (blockIdx.z), a
                            * multiple of the items per pass; 0: all of them in every block */
    /* fused norms (internal.cuh: cuda_matvec) */
    const float *norm_ss;  /* FOLD: the producer's partial sums of squares */
    uint32_t norm_n, ss_stride;
    const float *next_norm_w;
    float *next_xw, *next_ss;
    float eps;
    bool plus_one;
};

/* Activations rounded to 8 bits (matvec_dp4a.cu rounds them, its kernel and matvec_imma.cu's read
 * them): per chunk of DQ_CHUNK values, bytes q = round(x / d) with d = max|x| / 127 and the
 * chunk's scales {d, d * sum of q}. */
#define DQ_CHUNK 32 /* activation values per scale */
#define DQ_UNIT 64  /* weight values per lane step */
#define DQ_XUNIT 80 /* bytes a unit's 64 rounded activations take (16 of padding, see dq_xchunk) */

/* Activation chunk c (32 bytes) of an item's rounded row: the units of 64 values sit DQ_XUNIT bytes
 * apart, so that the eight lanes of a quarter warp, each reading its own unit, hit distinct shared
 * memory banks (64 bytes apart, every second lane would hit the same four); rows rounded into
 * global memory take the same layout, which measured faster there too. */
template <typename T> __device__ __forceinline__ T *dq_xchunk(T *x, uint32_t c) {
    return x + DQ_XUNIT * (c >> 1) + DQ_CHUNK * (c & 1);
}

/* Where matvec_imma.cu wants value i of activation chunk c (its byte in a row of cols bytes).
 * That kernel reads a row's Q8_0 blocks four at a time (136 bytes from an 8-byte boundary) as 8-byte
 * words, word m by lane t = m % 4 of the row's four; block b's 32 values sit at bytes 34b + 2..,
 * and each lane holds 8 of them, which it hands the mma as two words in the order of their bytes.
 * Each activation goes where the weight it meets goes: 128 values a group, lane t's 32 bytes at
 * 32t, block b's 8 at 8b, in the order of the weight bytes. dq_imma_held(x, t): how many of a
 * group's bytes 0 .. x - 1 lane t holds. */
__device__ __forceinline__ uint32_t dq_imma_held(uint32_t x, uint32_t t) {
    const int in_run = (int)(x & 31) - 8 * (int)t;
    return 8 * (x >> 5) + (uint32_t)(in_run < 0 ? 0 : in_run > 8 ? 8 : in_run);
}
__device__ __forceinline__ uint32_t dq_imma_byte(uint32_t c, uint32_t i) {
    const uint32_t b = c & 3, first = 34 * b + 2, p = first + i, t = (p >> 3) & 3;
    return 128 * (c >> 2) + 32 * t + 8 * b + dq_imma_held(p, t) - dq_imma_held(first, t);
}

/* c += a (16 items x 16 values) * b (16 values x 8 weight rows), f16 operands, f32 sums: mma.sync
 * m16n8k16 (matvec_tc.cu, matvec_imma.cu). */
__device__ __forceinline__ void mv_mma_f16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                           uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The activation of the gated unit, exactly as ops.cu's glu_kernel computes it. */
__device__ __forceinline__ float mv_glu(float g, float u, int act) {
    float a;
    if (act == EM_ACT_GEGLU) {
        const float k = 0.7978845608028654f; /* sqrt(2/pi): GELU, tanh approximation */
        a = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
    } else {
        a = g / (1.0f + expf(-g));
    }
    return a * u;
}

/* Where global row `grow` lives: its weights (and up-matrix weights), its output column and the
 * output's item stride. */
__device__ __forceinline__ void mv_row(const mv_args &a, uint32_t grow, uint64_t mat_offset, const uint8_t **w,
                                       const uint8_t **w2, float **y, uint64_t *ys) {
    const int pi = em_cuda_part_of(a, grow);
#define MV_PART(f) (pi == 0 ? a.part[0].f : pi == 1 ? a.part[1].f : a.part[2].f)
    const uint32_t row = grow - MV_PART(begin);
    const uint64_t offset = mat_offset + row * MV_PART(row_bytes);
    *w = MV_PART(w) + offset;
    *w2 = MV_PART(w2) ? MV_PART(w2) + offset : NULL;
    *ys = MV_PART(y_stride);
    *y = MV_PART(y) + row;
#undef MV_PART
}

/* The items and matrix of grid row `grid_row` (dense: the one group; MoE: the expert it runs,
 * false when the row has none this step). */
struct mv_group {
    uint32_t count, start; /* items [start, start + count) */
    uint64_t mat_offset;   /* bytes from the first expert's matrix */
};
__device__ __forceinline__ bool mv_group_of(const mv_args &a, uint32_t grid_row, mv_group *g) {
    uint32_t e = grid_row;
    if (a.active) {
        if (grid_row >= *a.n_active) return false;
        e = a.active[grid_row];
    }
    g->count = a.counts ? a.counts[e] : a.n_items;
    g->start = a.starts ? a.starts[e] : 0;
    g->mat_offset = (a.counts ? e : 0) * a.mat_bytes;
    return true;
}

/* Items per pass of a decode kernel: the largest of 8, 4, 2, 1 not above the batch. */
static inline int mv_items_per_pass(uint32_t n_items) { return n_items >= 8 ? 8 : n_items >= 4 ? 4 : n_items >= 2 ? 2 : 1; }

/* A fused norm's producer (a.next_ss) launched as `blocks` blocks leaves one partial sum per block:
 * records their number in b->ss_n, or says that the scratch has no room for them (matvec.cu). */
em_err mv_producer_blocks(cuda_backend *b, const mv_args &a, uint32_t blocks, const char *kernel);

/* The tensor-core kernel (matvec_tc.cu): its launch with the arguments em_cuda_matvec built, and
 * the setup of its kernels' shared memory (em_cuda_products_setup). */
em_err em_cuda_mvt(cuda_backend *b, const cuda_matvec *mv, mv_args a);
em_err em_cuda_mvt_setup(void);

/* The kernel on 8-bit activations (matvec_dp4a.cu): its launch (the rounding of the activations to
 * bytes, then the product) with the arguments em_cuda_matvec built, and the setup of its staged
 * kernels' shared memory (b->dp4a_smem_max). */
em_err em_cuda_dq(cuda_backend *b, const cuda_matvec *mv, const mv_args &a);
em_err em_cuda_dq_setup(cuda_backend *b);
/* The rounding of mv's items' rows of X (dense: its items, through x_index when given; MoE: X's
 * rows) to bytes at b->xq and their chunk scales at b->xd, one launch: in dq_xchunk's layout, or
 * with imma in dq_imma_byte's (rows of cols bytes) with one float per chunk (d, no sum) at b->xd. */
em_err em_cuda_dq_round_rows(cuda_backend *b, const cuda_matvec *mv, bool imma);

/* The kernel with the weights fed to mma.sync as stored (matvec_imma.cu): dense Q8_0 products of up
 * to 16 items on 8-bit activations, BF16 / F16 ones on f16; its launch. */
em_err em_cuda_imma(cuda_backend *b, const cuda_matvec *mv, const mv_args &a);

#endif
