/* Matrix times a few vectors, weights in their block format (internal.cuh: cuda_matvec).
 *
 * One warp computes one output row for up to NT items at once: the lanes walk the row's 8-element
 * groups (consecutive lanes take consecutive groups, so a warp's loads are contiguous), decode
 * each group into registers and multiply it with the NT activation rows. Each weight row is read
 * once per NT items, which is what makes decode memory-bound rather than launch-bound; larger
 * batches loop over chunks of NT items (the weight row then comes from L2 for the later chunks).
 * The per-item sums do not depend on NT or on the other items, so a batched token gets exactly
 * the logits it gets alone.
 *
 * MoE uses the same kernel with one grid row (blockIdx.y) per expert: each expert's matrices are
 * read once for all the tokens routed to it.
 *
 * Decode is bound by latency more than by bytes at batch 1 (each launch costs a few microseconds
 * whatever its size), so matrices that read the same input go in one launch: Q, K and V as three
 * parts of one grid, and the gate and up matrices of a gated unit row by row in the same warp,
 * which then writes act(gate) * up directly (no separate GLU pass). */
#include "internal.cuh"
#include "dequant.cuh"

extern "C" {
extern const uint32_t em_iq3xxs_grid[256]; /* src/quant/iq_grids.c: the IQ3_XXS lattice */
}

#define MV_WARPS 4
#define MV_PARTS 3

/* One of up to three matrices that share the input rows and run in one launch (Q, K and V):
 * global row r belongs to the first part whose `end` exceeds r. */
typedef struct mv_part {
    const uint8_t *w, *w2; /* w2: the up matrix of a fused gated unit (NULL otherwise) */
    uint64_t row_bytes;
    uint32_t begin, end;   /* global rows [begin, end) */
    float *y;
    uint64_t y_stride;
} mv_part;

typedef struct mv_args {
    mv_part part[MV_PARTS];
    uint32_t n_parts;
    uint64_t mat_bytes;    /* MoE: bytes of one expert's matrix */
    uint32_t rows, groups; /* rows: of all parts together; groups: cols / 8 */
    const float *x;
    uint64_t x_stride;
    const uint32_t *x_index;
    uint32_t n_items;
    const uint32_t *counts, *starts;
    int act;               /* with w2: EM_ACT_SWIGLU or EM_ACT_GEGLU */
} mv_args;

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

/* GLU: each warp also reads row r of w2 and writes act(w row · x) * (w2 row · x). */
template <int TYPE, int NT, bool GLU> __global__ void __launch_bounds__(MV_WARPS * 32) matvec_kernel(mv_args a) {
    em_pdl_wait();
    const uint32_t lane = threadIdx.x & 31;
    const uint32_t grow = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (grow >= a.rows) return;
    /* the part of this row, picked by comparisons (a run-time index into the parameters would
     * copy them to local memory) */
    const int pi = a.n_parts > 1 && grow >= a.part[0].end ? (a.n_parts > 2 && grow >= a.part[1].end ? 2 : 1) : 0;
#define MV_PART(f) (pi == 0 ? a.part[0].f : pi == 1 ? a.part[1].f : a.part[2].f)
    const uint32_t row = grow - MV_PART(begin);
    const uint64_t row_bytes = MV_PART(row_bytes), y_stride = MV_PART(y_stride);
    const uint8_t *w_base = MV_PART(w), *w2_base = MV_PART(w2);
    float *y = MV_PART(y);
#undef MV_PART
    const uint32_t e = blockIdx.y;
    const uint32_t count = a.counts ? a.counts[e] : a.n_items;
    const uint32_t start = a.starts ? a.starts[e] : 0;
    const uint64_t offset = (a.counts ? e : 0) * a.mat_bytes + row * row_bytes;
    const uint8_t *w = w_base + offset;
    const uint8_t *w2 = GLU ? w2_base + offset : NULL;
    for (uint32_t c = 0; c < count; c += NT) {
        const float *x[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            uint32_t i = start + min(c + t, count - 1); /* past the end: re-read the last item, never written */
            x[t] = a.x + (uint64_t)(a.x_index ? a.x_index[i] : i) * a.x_stride;
        }
        float acc[NT], acc2[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = acc2[t] = 0.0f;
#pragma unroll 8
        for (uint32_t g = lane; g < a.groups; g += 32) {
            float v[8], v2[8];
            deq<TYPE>::get(w, g, v);
            if (GLU) deq<TYPE>::get(w2, g, v2);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float4 *xp = (const float4 *)(x[t] + 8 * g);
                float4 x0 = xp[0], x1 = xp[1];
                acc[t] += v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x + v[5] * x1.y +
                          v[6] * x1.z + v[7] * x1.w;
                if (GLU)
                    acc2[t] += v2[0] * x0.x + v2[1] * x0.y + v2[2] * x0.z + v2[3] * x0.w + v2[4] * x1.x +
                               v2[5] * x1.y + v2[6] * x1.z + v2[7] * x1.w;
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
                if (GLU) acc2[t] += __shfl_xor_sync(0xffffffffu, acc2[t], off);
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (c + t < count)
                    y[(uint64_t)(start + c + t) * y_stride + row] = GLU ? mv_glu(acc[t], acc2[t], a.act) : acc[t];
        }
    }
}

template <int TYPE, bool GLU>
static void launch_nt(const cuda_backend *b, const mv_args &a, uint32_t n_groups, int nt) {
    dim3 grid((a.rows + MV_WARPS - 1) / MV_WARPS, n_groups);
    switch (nt) {
    case 1: em_cuda_launch(b, matvec_kernel<TYPE, 1, GLU>, grid, MV_WARPS * 32, 0, a); break;
    case 2: em_cuda_launch(b, matvec_kernel<TYPE, 2, GLU>, grid, MV_WARPS * 32, 0, a); break;
    case 4: em_cuda_launch(b, matvec_kernel<TYPE, 4, GLU>, grid, MV_WARPS * 32, 0, a); break;
    default: em_cuda_launch(b, matvec_kernel<TYPE, 8, GLU>, grid, MV_WARPS * 32, 0, a); break;
    }
}

template <int TYPE>
static void launch_type(const cuda_backend *b, const mv_args &a, uint32_t n_groups, int nt, bool glu) {
    if (glu)
        launch_nt<TYPE, true>(b, a, n_groups, nt);
    else
        launch_nt<TYPE, false>(b, a, n_groups, nt);
}

bool em_cuda_type_supported(uint32_t type) {
    switch (type) {
    case EM_TYPE_F32: case EM_TYPE_F16: case EM_TYPE_BF16: case EM_TYPE_Q8_0: case EM_TYPE_Q4_K: case EM_TYPE_Q6_K:
    case EM_TYPE_IQ3_XXS: return true;
    default: return false;
    }
}

bool em_cuda_matvec_can_fuse(const cuda_weight *a, const cuda_weight *b) {
    return a->data && b->data && a->type == b->type && a->cols == b->cols;
}

em_err em_cuda_matvec(cuda_backend *b, const cuda_matvec *mv) {
    if (em_cuda_gemm_wanted(b, mv)) return em_cuda_gemm(b, mv);
    const cuda_weight *w = mv->w;
    const uint32_t n_parts = mv->n_parts ? mv->n_parts : 1;
    if (mv->n_items == 0) return NULL;
    if (w->cols % 8 || mv->x_stride % 4)
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda matvec: %u columns, activation stride %llu", w->cols,
                         (unsigned long long)mv->x_stride);
    if (n_parts > MV_PARTS || (n_parts > 1 && (mv->counts || mv->up)))
        return em_errorf(EM_ERR_INTERNAL, "cuda matvec: %u parts", n_parts);
    if (mv->up && (mv->up->type != w->type || mv->up->cols != w->cols || mv->up->rows != w->rows))
        return em_errorf(EM_ERR_INTERNAL, "cuda matvec: gate and up matrices differ in type or shape");
    mv_args a = {};
    uint32_t rows = 0;
    for (uint32_t i = 0; i < n_parts; i++) {
        const cuda_weight *wi = i == 0 ? w : mv->more[i - 1].w;
        if (wi->type != w->type || wi->cols != w->cols)
            return em_errorf(EM_ERR_INTERNAL, "cuda matvec: fused matrices differ in type or width");
        a.part[i] = mv_part{wi->data, mv->up ? mv->up->data : NULL, wi->row_bytes, rows, rows + wi->rows,
                            i == 0 ? mv->y : mv->more[i - 1].y, i == 0 ? mv->y_stride : mv->more[i - 1].y_stride};
        rows += wi->rows;
    }
    a.n_parts = n_parts;
    a.mat_bytes = (uint64_t)w->rows * w->row_bytes;
    a.rows = rows;
    a.groups = w->cols / 8;
    a.x = mv->x;
    a.x_stride = mv->x_stride;
    a.x_index = mv->x_index;
    a.n_items = mv->n_items;
    a.counts = mv->counts;
    a.starts = mv->starts;
    a.act = b->d->act;
    const int nt = mv->n_items >= 8 ? 8 : mv->n_items >= 4 ? 4 : mv->n_items >= 2 ? 2 : 1;
    const uint32_t groups = mv->counts ? mv->n_groups : 1;
    const bool glu = mv->up != NULL;
    switch (w->type) {
    case EM_TYPE_F32: launch_type<EM_TYPE_F32>(b, a, groups, nt, glu); break;
    case EM_TYPE_F16: launch_type<EM_TYPE_F16>(b, a, groups, nt, glu); break;
    case EM_TYPE_BF16: launch_type<EM_TYPE_BF16>(b, a, groups, nt, glu); break;
    case EM_TYPE_Q8_0: launch_type<EM_TYPE_Q8_0>(b, a, groups, nt, glu); break;
    case EM_TYPE_Q4_K: launch_type<EM_TYPE_Q4_K>(b, a, groups, nt, glu); break;
    case EM_TYPE_Q6_K: launch_type<EM_TYPE_Q6_K>(b, a, groups, nt, glu); break;
    case EM_TYPE_IQ3_XXS: launch_type<EM_TYPE_IQ3_XXS>(b, a, groups, nt, glu); break;
    default: return em_errorf(EM_ERR_UNSUPPORTED, "cuda matvec: weight type %s", em_type_name(w->type));
    }
    CU_LAUNCHED();
    return NULL;
}

/* ---- token embeddings: rows of token_embd, decoded and scaled ---- */

template <int TYPE>
__global__ void embed_kernel(const uint8_t *table, uint64_t row_bytes, uint32_t groups, const int32_t *tokens,
                             float scale, float *x, uint32_t n_embd) {
    em_pdl_wait();
    const uint32_t t = blockIdx.x;
    const uint8_t *row = table + (uint64_t)tokens[t] * row_bytes;
    for (uint32_t g = threadIdx.x; g < groups; g += blockDim.x) {
        float v[8];
        deq<TYPE>::get(row, g, v);
#pragma unroll
        for (int i = 0; i < 8; i++) x[(uint64_t)t * n_embd + 8 * g + i] = v[i] * scale;
    }
}

em_err em_cuda_embed(cuda_backend *b, const cuda_batch *batch, float *x) {
    const cuda_weight *w = &b->token_embd;
    const uint32_t n = batch->n_tokens, groups = w->cols / 8;
    const float scale = b->d->embd_scale;
#define EMBED(T) em_cuda_launch(b, embed_kernel<T>, n, 128, 0, w->data, w->row_bytes, groups, batch->tokens, scale, x, w->cols)
    switch (w->type) {
    case EM_TYPE_F32: EMBED(EM_TYPE_F32); break;
    case EM_TYPE_F16: EMBED(EM_TYPE_F16); break;
    case EM_TYPE_BF16: EMBED(EM_TYPE_BF16); break;
    case EM_TYPE_Q8_0: EMBED(EM_TYPE_Q8_0); break;
    case EM_TYPE_Q4_K: EMBED(EM_TYPE_Q4_K); break;
    case EM_TYPE_Q6_K: EMBED(EM_TYPE_Q6_K); break;
    case EM_TYPE_IQ3_XXS: EMBED(EM_TYPE_IQ3_XXS); break;
    default: return em_errorf(EM_ERR_UNSUPPORTED, "cuda embedding: type %s", em_type_name(w->type));
    }
#undef EMBED
    CU_LAUNCHED();
    return NULL;
}

em_err em_cuda_upload_grids(void) {
    CU_TRY(cudaMemcpyToSymbol(em_cuda_iq3xxs_grid, em_iq3xxs_grid, sizeof em_cuda_iq3xxs_grid));
    return NULL;
}
