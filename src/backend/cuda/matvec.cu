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
 * read once for all the tokens routed to it. */
#include "internal.cuh"
#include "dequant.cuh"

extern "C" {
extern const uint32_t em_iq3xxs_grid[256]; /* src/quant/iq_grids.c: the IQ3_XXS lattice */
}

#define MV_WARPS 4

typedef struct mv_args {
    const uint8_t *w;
    uint64_t row_bytes, mat_bytes;
    uint32_t rows, groups; /* groups: cols / 8 */
    const float *x;
    uint64_t x_stride;
    const uint32_t *x_index;
    float *y;
    uint64_t y_stride;
    uint32_t n_items;
    const uint32_t *counts, *starts;
} mv_args;

template <int TYPE, int NT> __global__ void __launch_bounds__(MV_WARPS * 32) matvec_kernel(mv_args a) {
    const uint32_t lane = threadIdx.x & 31;
    const uint32_t row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (row >= a.rows) return;
    const uint32_t e = blockIdx.y;
    const uint32_t count = a.counts ? a.counts[e] : a.n_items;
    const uint32_t start = a.starts ? a.starts[e] : 0;
    const uint8_t *w = a.w + (a.counts ? e : 0) * a.mat_bytes + row * a.row_bytes;
    for (uint32_t c = 0; c < count; c += NT) {
        const float *x[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            uint32_t i = start + min(c + t, count - 1); /* past the end: re-read the last item, never written */
            x[t] = a.x + (uint64_t)(a.x_index ? a.x_index[i] : i) * a.x_stride;
        }
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = 0.0f;
#pragma unroll 8
        for (uint32_t g = lane; g < a.groups; g += 32) {
            float v[8];
            deq<TYPE>::get(w, g, v);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float4 *xp = (const float4 *)(x[t] + 8 * g);
                float4 x0 = xp[0], x1 = xp[1];
                acc[t] += v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x + v[5] * x1.y +
                          v[6] * x1.z + v[7] * x1.w;
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
        }
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (c + t < count) a.y[(uint64_t)(start + c + t) * a.y_stride + row] = acc[t];
        }
    }
}

template <int TYPE> static void launch_type(const mv_args &a, uint32_t n_groups, int nt, cudaStream_t s) {
    dim3 grid((a.rows + MV_WARPS - 1) / MV_WARPS, n_groups);
    switch (nt) {
    case 1: matvec_kernel<TYPE, 1><<<grid, MV_WARPS * 32, 0, s>>>(a); break;
    case 2: matvec_kernel<TYPE, 2><<<grid, MV_WARPS * 32, 0, s>>>(a); break;
    case 4: matvec_kernel<TYPE, 4><<<grid, MV_WARPS * 32, 0, s>>>(a); break;
    default: matvec_kernel<TYPE, 8><<<grid, MV_WARPS * 32, 0, s>>>(a); break;
    }
}

bool em_cuda_type_supported(uint32_t type) {
    switch (type) {
    case EM_TYPE_F32: case EM_TYPE_F16: case EM_TYPE_BF16: case EM_TYPE_Q8_0: case EM_TYPE_Q4_K: case EM_TYPE_Q6_K:
    case EM_TYPE_IQ3_XXS: return true;
    default: return false;
    }
}

em_err em_cuda_matvec(cuda_backend *b, const cuda_matvec *mv) {
    const cuda_weight *w = mv->w;
    if (mv->n_items == 0) return NULL;
    if (w->cols % 8 || mv->x_stride % 4)
        return em_errorf(EM_ERR_UNSUPPORTED, "cuda matvec: %u columns, activation stride %llu", w->cols,
                         (unsigned long long)mv->x_stride);
    mv_args a = {w->data, w->row_bytes, (uint64_t)w->rows * w->row_bytes, w->rows, w->cols / 8, mv->x, mv->x_stride,
                 mv->x_index, mv->y, mv->y_stride, mv->n_items, mv->counts, mv->starts};
    const int nt = mv->n_items >= 8 ? 8 : mv->n_items >= 4 ? 4 : mv->n_items >= 2 ? 2 : 1;
    const uint32_t groups = mv->counts ? mv->n_groups : 1;
    switch (w->type) {
    case EM_TYPE_F32: launch_type<EM_TYPE_F32>(a, groups, nt, b->stream); break;
    case EM_TYPE_F16: launch_type<EM_TYPE_F16>(a, groups, nt, b->stream); break;
    case EM_TYPE_BF16: launch_type<EM_TYPE_BF16>(a, groups, nt, b->stream); break;
    case EM_TYPE_Q8_0: launch_type<EM_TYPE_Q8_0>(a, groups, nt, b->stream); break;
    case EM_TYPE_Q4_K: launch_type<EM_TYPE_Q4_K>(a, groups, nt, b->stream); break;
    case EM_TYPE_Q6_K: launch_type<EM_TYPE_Q6_K>(a, groups, nt, b->stream); break;
    case EM_TYPE_IQ3_XXS: launch_type<EM_TYPE_IQ3_XXS>(a, groups, nt, b->stream); break;
    default: return em_errorf(EM_ERR_UNSUPPORTED, "cuda matvec: weight type %s", em_type_name(w->type));
    }
    CU_LAUNCHED();
    return NULL;
}

/* ---- token embeddings: rows of token_embd, decoded and scaled ---- */

template <int TYPE>
__global__ void embed_kernel(const uint8_t *table, uint64_t row_bytes, uint32_t groups, const int32_t *tokens,
                             float scale, float *x, uint32_t n_embd) {
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
#define EMBED(T) embed_kernel<T><<<n, 128, 0, b->stream>>>(w->data, w->row_bytes, groups, batch->tokens, scale, x, w->cols)
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
