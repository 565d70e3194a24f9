/* Internals of the CUDA backend shared by its .cu files: the backend struct, the error check, the
 * device weight descriptions and the kernel launchers. Nothing outside src/backend/cuda includes
 * this; the module's interface is cuda.h.
 *
 * Layout on the device:
 *  - matrices keep their GGUF block format, one cudaMalloc per tensor (cuda_weight);
 *  - activations are f32, one row of n_embd (or the layer's width) per token;
 *  - the KV cache is f16: for each layer, n_blocks * block_tokens rows of n_head_kv * head_dim
 *    keys and as many rows of values, addressed through the batch's block tables like the CPU
 *    backend's f32 cache. f16 halves the memory of the CPU layout (kv_bytes_per_token).
 *    EMBER_CUDA_KV=f32 keeps it in f32 instead (for comparisons that must exclude f16 rounding).
 *  - weights are decoded in registers. Decode products of quantized weights (Q8_0, Q4_K, Q6_K,
 *    IQ3_XXS, MXFP4) round the activations to 8 bits as the CPU's integer dot products do and multiply
 *    with __dp4a (matvec_dp4a.cu), dense Q8_0 ones of 2-16 tokens on the integer tensor cores
 *    (matvec_imma.cu); other decode products multiply with the f32 activations (matvec.cu) or,
 *    at 2-16 tokens, round both operands to f16 for the tensor cores (dense BF16 / F16 ones in
 *    matvec_imma.cu, the rest and the output heads in matvec_tc.cu); prefill and larger batches
 *    (gemm.cu) do the same on larger tiles; all accumulate in f32. Which kernel takes a product
 *    is decided in one place, tuning.cu (em_cuda_kernel_for), from the thresholds and switches in
 *    the backend's em_cuda_tuning (read from the environment once, when the backend is made;
 *    docs/cuda.md lists the switches). */
#ifndef EMBER_BACKEND_CUDA_INTERNAL_CUH
#define EMBER_BACKEND_CUDA_INTERNAL_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../../program/program.h"
#include "../../quant/quant.h"
#include "cuda.h"
}

/* Every CUDA call goes through this: a failure becomes an em_err naming the call. */
#define CU_TRY(call)                                                                                   \
    do {                                                                                               \
        cudaError_t cu_status_ = (call);                                                               \
        if (cu_status_ != cudaSuccess)                                                                 \
            return em_errorf(EM_ERR_INTERNAL, "%s: %s (%s:%d)", #call, cudaGetErrorString(cu_status_), \
                             __FILE__, __LINE__);                                                      \
    } while (0)

/* Checks the last kernel launch. */
#define CU_LAUNCHED() CU_TRY(cudaGetLastError())

/* Programmatic dependent launch (Hopper): every kernel of the forward is launched with the
 * attribute that lets it start while the kernel before it is finishing, and every kernel begins
 * with em_pdl_wait(), which blocks until the previous kernel has completed and its writes are
 * visible, then lets the next kernel start launching. So kernels still run strictly one after the
 * other, but the launch latency between them overlaps the previous kernel's tail. The wait must
 * come before a kernel's first access to memory another kernel writes (each kernel here does it
 * first thing). Off with EMBER_CUDA_PDL=0 (em_cuda_tuning.pdl). */
__device__ __forceinline__ void em_pdl_wait(void) {
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
}

/* Sum and maximum over the 32 lanes of a warp (every lane gets the result, in the same order). */
__device__ __forceinline__ float em_warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ float em_warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* A fused norm's RMS factor for one item, from its producer's n partial sums of squares at `part`,
 * summed by the calling warp in a fixed order (every lane gets it): the consumers of a fused norm
 * that fold it into their activations (matvec_dp4a.cu, matvec_imma.cu, the MoE routing in ops.cu). */
__device__ __forceinline__ float em_warp_rms_factor(const float *part, uint32_t n, uint32_t cols, float eps) {
    float sq = 0.0f;
    for (uint32_t k = threadIdx.x & 31; k < n; k += 32) sq += part[k];
    return rsqrtf(em_warp_sum(sq) / cols + eps);
}

/* A matrix (or stack of expert matrices) on the device, in its stored block format. */
typedef struct cuda_weight {
    const uint8_t *data; /* NULL when absent */
    uint32_t type;
    uint32_t cols, rows, n_mat;
    uint64_t row_bytes;
} cuda_weight;

/* A layer on the device: what it computes, read from its blocks of the layer program
 * (em_program_blocks: an attention block, then a gated unit or experts), and its weights. */
typedef struct cuda_layer {
    em_program_attention att;
    em_rope rope;           /* of q and k; n_rot 0: none */
    bool moe;               /* experts (route, gate_exps...), else a gated unit (ffn_gate...) */
    em_program_route route;
    const float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffn_norm;
    const float *bq, *bk, *bv;
    const double *inv_freq; /* RoPE: base^(-2i/n_rot), divided by the frequency factors (n_rot/2) */
    cuda_weight wq, wk, wv, wo, ffn_gate, ffn_up, ffn_down, gate_inp, gate_exps, up_exps, down_exps, gate_shexp,
        up_shexp, down_shexp;
    uint8_t *keys, *values; /* this layer's part of the cache (f16, or f32 with EMBER_CUDA_KV=f32) */
} cuda_layer;

/* Per-forward description of the batch on the device (one upload). */
typedef struct cuda_batch {
    const int32_t *tokens;
    const uint32_t *seq, *pos;
    const uint32_t *table_start; /* [n_seqs] index into blocks of each sequence's table */
    const uint32_t *blocks;
    const uint32_t *logit_rows;  /* [rows] token index of each logits row */
    uint32_t n_tokens, n_rows, max_pos; /* max_pos: the largest position in the batch */
    /* Prefill segments (attention_prefill.cu): runs of at least EM_ATT_SEGMENT_MIN consecutive
     * tokens of one sequence at consecutive positions, as (first token, tokens) pairs, on the device
     * and (for sizing grids) on the host; and the other tokens, which the decode-style kernel
     * takes, with their largest position. Never any segment in a captured batch (they are shorter
     * than a segment can be). */
    const uint32_t *segments, *segments_host;
    uint32_t n_segments;
    const uint32_t *other_tokens;
    uint32_t n_other, other_max_pos;
    /* Every token is the only one of its sequence in the batch (a decode step): then no token
     * attends to a key or value another token of the batch writes, and the decode attention
     * kernel may write the batch's own keys and values itself (em_cuda_attention_decode). */
    bool one_per_seq;
} cuda_batch;

#define EM_ATT_SEGMENT_MIN 32

/* A captured forward pass for one batch shape (forward.cu). */
typedef struct cuda_graph {
    cudaGraphExec_t exec;
    uint32_t n_tokens, n_rows;
    bool one_per_seq; /* cuda_batch.one_per_seq: whether the capture finished Q, K, V in attention */
} cuda_graph;
/* A step shape run once without a graph (forward.cu: run_graph captures a shape when it comes again). */
typedef struct cuda_shape {
    uint32_t n_tokens, n_rows;
    bool one_per_seq;
} cuda_shape;

#define EM_CUDA_MAX_GRAPHS 32
#define EM_CUDA_GRAPH_TOKENS 16 /* batches up to this many tokens replay graphs */

struct cuda_mega; /* the persistent decode kernel's state (mega.cu) */

/* A threshold that is never reached: the kernel it guards is never chosen. */
#define EM_CUDA_NEVER UINT32_MAX

/* The backend's tuning: every switch the environment sets (docs/cuda.md has the table), read once
 * when the backend is made (tuning.cu: em_cuda_tuning_read), and the thresholds from which
 * em_cuda_kernel_for picks each product's kernel. Thresholds count a product's items: the batch's
 * tokens for dense products; for MoE products the batch's tokens or the mean items per expert, as
 * each says. The defaults were measured on an H200; bench/RESULTS.md, "CUDA kernel choice", has
 * the figures. */
typedef struct em_cuda_tuning {
    /* switches */
    bool kv_f32;           /* EMBER_CUDA_KV=f32: the KV cache in f32 instead of f16 */
    bool graphs;           /* EMBER_CUDA_GRAPHS: small batches replay captured graphs */
    bool pdl;              /* EMBER_CUDA_PDL: programmatic dependent launch (em_pdl_wait) */
    bool overlap;          /* EMBER_CUDA_OVERLAP: the next step is enqueued before this one's tokens are read */
    bool late_masks;       /* EMBER_CUDA_LATE_MASKS: constrained steps overlap too, their masks given late */
    bool fuse_finish;      /* EMBER_CUDA_FUSE_FINISH: decode attention finishes Q, K, V itself */
    bool prefill_split;    /* EMBER_CUDA_PF_SPLIT: a prefill attention of few tiles splits the context */
    bool tensor_cores;     /* EMBER_CUDA_GEMM: 0 keeps every product on matvec.cu's f32 kernel */
    bool int8_activations; /* EMBER_CUDA_DP4A not 0: activations may be rounded to 8 bits */
    bool wgmma, wgmma_split, wgmma_bf16; /* EMBER_CUDA_WGMMA, EMBER_CUDA_WG_SPLIT, EMBER_CUDA_WG_BF16 */
    bool gemm_split;                     /* EMBER_CUDA_GM_SPLIT: splits of K for the mma.sync GEMMs */
    bool tc_iq3_runs;                    /* EMBER_CUDA_TC_RUNS: TC's IQ3_XXS lanes read runs (matvec_tc.cu) */
    bool trace;            /* EMBER_CUDA_TRACE: each distinct product's kernel on stderr */
    uint32_t moe_norm_max; /* EMBER_CUDA_MOE_NORM: up to this many tokens a MoE layer's norm is folded */
    uint32_t dec_cluster_max; /* EMBER_CUDA_DEC_CLUSTER: up to this many tokens decode attention's
                               * splits merge in a cluster */
    uint32_t mega_tokens;  /* EMBER_CUDA_MEGA: decode steps of up to this many sequences on mega.cu */
    bool mega_profile;     /* EMBER_CUDA_MEGA_PROFILE */
    uint32_t mega_stage_kb; /* EMBER_CUDA_MEGA_STAGE_KB */
    long profile_from, profile_to; /* EMBER_CUDA_PROFILE=FROM:TO (forwards counted from 0); -1: none */

    /* The kernel choice (tuning.cu has the order in which they are asked). */
    /* gemm.cu's tiles from this many items: MoE products by their mean; dense ones by
     * [the product's output rows, gated units counted twice: up to EM_CUDA_NARROW_ROWS, between,
     * from EM_CUDA_WIDE_ROWS][the weights: BF16, F16, quantized] */
    uint32_t gemm_from_moe, gemm_from[3][3];
    /* and among them wgmma from this many items (dense, or from twice as many tiles as
     * multiprocessors; MoE: the mean), with tiles (times K splits) for wgmma_sm_32ths / 32 of the
     * multiprocessors */
    uint32_t wgmma_from_dense, wgmma_from_moe, wgmma_sm_32ths;
    /* matvec_imma.cu from this many items (dense Q8_0, BF16 / F16; _head: the products whose dp4a
     * blocks would loop over row blocks, the output heads) */
    uint32_t imma_from, imma_from_head, hmma_from, hmma_from_head;
    /* matvec_dp4a.cu up to this many items (MoE: tokens): dense Q8_0 and Q4_K, other types, Q6_K
     * with rows at least twice as long as they are many, MoE */
    uint32_t dp4a_upto_q8_0_q4_k, dp4a_upto_other, dp4a_upto_q6_k_wide, dp4a_upto_moe;
    /* and the 64-value units a lane takes of a dense row, of an expert's row */
    uint32_t dp4a_units, dp4a_moe_units;
    /* matvec_tc.cu from this many items, up to EM_CUDA_TC_ITEMS (MoE: tokens, while the mean stays
     * under gemm_from_moe): dense products, output heads (EM_CUDA_HEAD_ROWS rows or more) of Q6_K
     * or IQ3_XXS, of BF16 or F16, MoE products, MoE IQ3_XXS products that are not gated units */
    uint32_t tc_from, tc_from_head_q6_k_iq3, tc_from_head_half, tc_from_moe, tc_from_moe_iq3_down;
} em_cuda_tuning;

#define EM_CUDA_NARROW_ROWS 1024u
#define EM_CUDA_WIDE_ROWS 8192u
#define EM_CUDA_HEAD_ROWS 32000u /* vocabularies, not FFNs */
#define EM_CUDA_TC_ITEMS 16u     /* the most items matvec_tc.cu's dense products take */

/* Reads the environment's switches into *t over the defaults; an error names the variable and what
 * it takes. */
em_err em_cuda_tuning_read(em_cuda_tuning *t);

/* EMBER_CUDA_TRACE: the products already logged (tuning.cu). */
typedef struct cuda_trace {
    uint64_t *seen; /* a key per distinct (shape, kernel) */
    uint32_t n_seen, cap_seen;
} cuda_trace;

/* What the whole step computes besides its layers, from the program's embed and output, and what
 * every layer shares: the kernels take one norm epsilon and one activation (setup refuses a
 * program whose operations differ in them). */
typedef struct cuda_step {
    uint32_t n_embd, n_vocab, n_layer;
    float eps;
    bool plus_one;          /* norms multiply by 1 + w */
    em_activation act;      /* of every gated unit and expert */
    float embd_scale, final_softcap;
} cuda_step;

typedef struct cuda_backend {
    em_backend base;
    cuda_step step;
    cudaStream_t stream;
    int device;
    cuda_weight token_embd, output;
    const float *output_norm;
    cuda_layer *layers;
    void **allocs; /* every weight allocation, freed at the end */
    uint32_t n_allocs, cap_allocs;
    uint8_t *kv; /* one allocation for the whole cache */
    uint32_t kv_elem; /* bytes per cached value: 2 (f16) or 4 (f32) */

    /* Scratch on the device, for cap_tokens tokens. */
    uint32_t cap_tokens;
    float *x, *xn, *q, *k, *v, *attn, *out, *tmp, *gate, *up, *router, *logits;
    float *moe_h, *moe_h2, *moe_y; /* [token * k][ff] and [token * k][embd] */
    int32_t *chosen;
    float *chosen_weight;
    uint32_t *pair_token, *pair_slot, *expert_count, *expert_start;
    uint32_t *expert_active; /* experts with pairs this step, then their number at [max_expert] */
    uint8_t *batch_dev;     /* the uploaded batch arrays (forward.cu: upload_batch) */
    uint32_t cap_n, cap_s, cap_tw;
    uint8_t *batch_host[2]; /* pinned staging for the upload, one per step that may be in flight */
    size_t cap_batch;
    uint32_t batch_slot;    /* the staging buffer the next upload uses */
    float *logits_host;     /* pinned */
    size_t cap_logits;
    cuda_graph graphs[EM_CUDA_MAX_GRAPHS];
    uint32_t n_graphs;
    cuda_shape seen_once[EM_CUDA_MAX_GRAPHS]; /* the latest shapes run once without a graph */
    uint32_t n_seen_once, next_seen_once;
    em_cuda_tuning tuning;  /* the switches and the kernel choice's thresholds */
    cuda_trace trace;       /* EMBER_CUDA_TRACE */
    long forwards;          /* forwards enqueued so far (EMBER_CUDA_PROFILE counts them) */
    /* What the product kernels learn once, when the backend is made (em_cuda_products_setup): */
    bool wgmma_loaded;      /* the loaded device code has wgmma (the sm_90a build; gemm.cu) */
    uint32_t dp4a_smem_max; /* dynamic shared memory a staged dp4a block may take (matvec_dp4a.cu) */
    uint32_t max_q, max_k, max_v, max_attn, max_ff, max_expert, max_used, max_head, max_dim_v;
    int n_sm;               /* multiprocessors, for sizing grids */
    bool capturing;         /* a graph is being captured, or a step runs as its replay would: no launch may depend on the batch's contents */
    float *ss;              /* fused norms: partial sums of squares, [token][ss_stride] (cuda_matvec) */
    uint32_t ss_stride, ss_n; /* ss_n: partials the last producer wrote per token */
    float *att_part;        /* attention's per-split partial results (attention.cu) */
    float *pf_part;         /* the prefill attention's per-split partial results (attention_prefill.cu) */
    uint64_t pf_part_floats;
    uint32_t *att_counter;  /* per (token, head), zero between launches */
    float *mvt_part;        /* the decode tensor-core products' split-K partial sums (matvec_tc.cu) */
    float *wg_part;         /* the wgmma products' split-K partial sums (gemm.cu: em_cuda_gemm_split_floats) */
    uint32_t *mvt_counter;  /* per row group, zero between launches */
    uint64_t mvt_part_floats;
    uint32_t mvt_groups;    /* counters mvt_counter holds */
    uint64_t att_slots;     /* (token, head, split) partials att_part holds */
    __half *x16;            /* the wgmma GEMM's activations rounded to f16, contiguous rows (gemm.cu) */
    uint64_t x16_halves;    /* halves x16 holds */
    int8_t *xq;             /* the dp4a products' activations rounded to bytes (matvec_dp4a.cu's layout) */
    float2 *xd;             /* and their scales per 32 (matvec_dp4a.cu) */
    uint64_t xq_bytes;      /* bytes xq holds (xd: one per 32) */
    /* Sampling on the device (sample.cu), for cap_pick_rows rows: */
    em_pick_params *pick_params; /* the rows' parameters, uploaded each step */
    int32_t *picked;             /* the picked tokens */
    uint64_t *pick_mass;         /* top_p's masses, n_vocab per row */
    uint64_t *pick_partial;      /* greedy rows: each split's best key (argmax_kernel) */
    uint32_t *pick_counter;      /* greedy rows: splits done, zero between launches */
    uint8_t *pick_host;          /* pinned, two slots: parameters, then the picked tokens */
    uint32_t cap_pick_rows;
    uint32_t *mask_host;         /* pinned, two slots: grammar masks of a step's rows (sample.cu) */
    uint32_t *mask_dev;          /* their device copy */
    uint32_t cap_mask_rows;
    /* Step overlap (forward.cu: pick_begin / pick_end): the begun steps not yet ended, oldest
     * first, each with its pick slot, rows and the event after its tokens' copy. */
    cudaEvent_t pick_done[2];
    uint32_t flight_slot[2], flight_rows[2], flight_count;
    uint32_t last_begun_rows; /* rows of the last begun step: what EM_TOKEN_PICKED may name */
    /* A step begun with pick_masks_later (forward.cu: em_cuda_pick_masks enqueues its pick): its
     * pick parameters, rows and slot. */
    em_pick_params *late_pick;
    uint32_t late_rows, late_slot, cap_late_rows;
    bool late_pending;
    struct cuda_mega *mega;   /* NULL: decode steps run the per-operation kernels */
} cuda_backend;

/* The (token, head, split) partials att_part holds for n tokens (em_cuda_reserve): 4 splits a
 * (token, head), and what two waves of blocks take at any group of query heads per KV head. The
 * attention kernels bound a batch's splits by this for the batch's own tokens, never by the
 * capacity the scratch has now: that capacity comes from the largest batch the backend has seen,
 * and a bound that follows it gave the same batch other splits, so other bits, on another backend
 * (one KV head: the split count that fills the GPU is large). */
static inline uint64_t em_cuda_att_slots(const cuda_backend *b, uint64_t n) {
    return (4 * n + 2 * (uint64_t)b->n_sm) * b->max_head;
}

/* Launches `kernel` on the backend's stream, as a programmatic dependent launch unless that is
 * off, its blocks in clusters of cluster_z consecutive blocks along z when cluster_z > 1 (which
 * must divide grid.z); a failure shows in cudaGetLastError (CU_LAUNCHED). */
template <typename... P, typename... A>
static inline void em_cuda_launch_clusters(const cuda_backend *b, void (*kernel)(P...), dim3 grid, dim3 block,
                                           size_t smem, uint32_t cluster_z, A... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = b->stream;
    cudaLaunchAttribute attrs[2] = {};
    unsigned n = 0;
    if (b->tuning.pdl) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_z > 1) {
        attrs[n].id = cudaLaunchAttributeClusterDimension;
        attrs[n].val.clusterDim.x = 1, attrs[n].val.clusterDim.y = 1, attrs[n++].val.clusterDim.z = cluster_z;
    }
    config.attrs = attrs;
    config.numAttrs = n;
    (void)cudaLaunchKernelEx(&config, kernel, args...);
}

template <typename... P, typename... A>
static inline void em_cuda_launch(const cuda_backend *b, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                  A... args) {
    em_cuda_launch_clusters(b, kernel, grid, block, smem, 1, args...);
}

/* ---- weights.cu ---- */
/* b->step and b->layers from the model's program, every weight uploaded; an error names the layer and
 * the operation the kernels cannot run. */
em_err em_cuda_upload_weights(cuda_backend *b, const em_program *program);
bool em_cuda_type_supported(uint32_t type);

/* ---- matvec.cu ---- */

/* Y[i][r] = W[mat(i)] row r · X[xrow(i)] for the items i of each group; see matvec.cu. Dense: one
 * group of n items with identity maps (x_index NULL, counts NULL). MoE: group e is expert e, its
 * items are [starts[e], starts[e] + counts[e]) and x_index maps an item to its row of X. */
typedef struct cuda_matvec {
    const cuda_weight *w;
    const float *x;
    uint64_t x_stride;
    const uint32_t *x_index; /* NULL: item i reads X row i */
    float *y;
    uint64_t y_stride;
    uint32_t n_items;        /* dense: items; MoE: the mean items per expert, rounded up (for sizing) */
    uint32_t max_items;      /* MoE: the most items one expert can have (the batch's tokens) */
    uint32_t x_rows;         /* MoE: rows of X its items read (0: unknown; the wgmma GEMM needs it) */
    const uint32_t *counts, *starts; /* MoE: per-expert item ranges (NULL for dense) */
    uint32_t n_groups;       /* experts (1 for dense) */
    /* Fusions (matvec.cu): with `up`, Y = act(W X) * (up X), the gated unit, in one pass; with
     * n_parts 2 or 3 (dense only), more[i].w times the same X into more[i].y as well, in the same
     * launch. Fused matrices must have W's type and width (em_cuda_matvec_can_fuse). */
    const cuda_weight *up;
    uint32_t n_parts;        /* 0 or 1: W alone */
    struct { const cuda_weight *w; float *y; uint64_t y_stride; } more[2];
    /* Y += result instead of Y = result (the residual add of the output and down projections). */
    bool accumulate;
    /* MoE, optional: grid row j runs expert active[j] while j < *n_active (device values written
     * by the grouping kernel), so a step launches n_active_max grid rows, not one per expert. */
    const uint32_t *active, *n_active;
    uint32_t n_active_max;
    /* The RMSNorm that starts a sub-block, fused (decode batches; forward.cu's layer_io). A
     * consumer (norm_ss set) reads X = x * norm weights, written by its producer, and scales each
     * item's result by rsqrt(sum of norm_ss[x row][0..norm_n) / cols + eps): the sum of squares of
     * x, left by the producer as norm_n partial sums. A producer (next_norm_w set, dense, with
     * accumulate) writes, besides Y += result, next_xw = Y * next_norm_w and one partial sum of
     * Y^2 per block into next_ss[item][block] (em_cuda_matvec sets b->ss_n to their number). Rows
     * of norm_ss / next_ss are b->ss_stride apart. */
    const float *norm_ss;
    uint32_t norm_n;
    const float *next_norm_w;
    float *next_xw, *next_ss;
} cuda_matvec;

/* The product on the kernel em_cuda_kernel_for picks (and, with EMBER_CUDA_TRACE, its line). */
em_err em_cuda_matvec(cuda_backend *b, const cuda_matvec *mv);
/* The rows of all of mv's parts together. */
uint32_t em_cuda_matvec_rows(const cuda_matvec *mv);
/* The kernel families of a product: F32 the CUDA-core kernel (matvec.cu), TC the tensor-core
 * kernel for decode batches (matvec_tc.cu; not for F32 weights), DP4A the kernel on 8-bit
 * activations (matvec_dp4a.cu; quantized weights it takes only), IMMA the one that feeds the
 * weights to mma.sync as stored (matvec_imma.cu; Q8_0, BF16, F16), GEMM mma.sync tiles for large
 * batches and WGMMA Hopper's warpgroup MMA on larger tiles (both gemm.cu). AUTO: em_cuda_kernel_for
 * picks. */
typedef enum em_cuda_matvec_kernel {
    EM_CUDA_MATVEC_AUTO,
    EM_CUDA_MATVEC_F32,
    EM_CUDA_MATVEC_TC,
    EM_CUDA_MATVEC_DP4A,
    EM_CUDA_MATVEC_IMMA,
    EM_CUDA_MATVEC_GEMM,
    EM_CUDA_MATVEC_WGMMA,
} em_cuda_matvec_kernel;
/* em_cuda_matvec with the kernel forced, for tests and measurements. */
em_err em_cuda_matvec_with(cuda_backend *b, const cuda_matvec *mv, em_cuda_matvec_kernel kernel);
/* The one choice of a product's kernel (tuning.cu): the first family, in the order GEMM (WGMMA or
 * mma.sync tiles), IMMA, DP4A, TC, F32, that can take `mv` and whose thresholds in b->tuning its
 * weight type, shape and items meet. Never AUTO. */
em_cuda_matvec_kernel em_cuda_kernel_for(const cuda_backend *b, const cuda_matvec *mv);
/* Of a product the GEMM takes: whether its thresholds pick WGMMA over mma.sync tiles. */
bool em_cuda_wgmma_wanted(const cuda_backend *b, const cuda_matvec *mv);
/* A kernel family's name, for messages. */
const char *em_cuda_kernel_name(em_cuda_matvec_kernel kernel);
/* EMBER_CUDA_TRACE: logs mv's kernel on stderr, once per distinct shape and kernel (tuning.cu). */
void em_cuda_trace_product(cuda_backend *b, const cuda_matvec *mv, em_cuda_matvec_kernel kernel);
/* and once per number of tokens, how steps that run no separate products run (`how`: a string
 * literal, which is also the key) */
void em_cuda_trace_step(cuda_backend *b, uint32_t n_tokens, const char *how);
void em_cuda_trace_free(cuda_backend *b);

/* What each family can take, whatever the thresholds say: */
/* DP4A: Q8_0, Q4_K, Q6_K, IQ3_XXS or MXFP4 weights, rows of whole 64-value units, rounded
 * activations that fit b->xq (the output heads: a block's shared memory). */
bool em_cuda_dq_takes(const cuda_backend *b, const cuda_matvec *mv);
/* Whether DP4A's launch for `mv` is staged: blocks that loop over row blocks and round their
 * items' activations themselves (more row blocks than 8 per multiprocessor: the output heads). */
bool em_cuda_dq_staged(const cuda_backend *b, const cuda_matvec *mv);
/* IMMA: dense Q8_0, BF16 or F16 products of up to 16 items, rows of whole 128-value groups. */
bool em_cuda_imma_takes(const cuda_backend *b, const cuda_matvec *mv);
/* TC: the types it decodes (not F32), aligned rows, dense products of up to EM_CUDA_TC_ITEMS items,
 * a split of K its scratch holds. */
bool em_cuda_mvt_takes(const cuda_backend *b, const cuda_matvec *mv);
/* GEMM: the types of dequant.cuh's em_cuda_each_type but F32, with a multiple of 32 columns,
 * aligned activations, no fused norm. */
bool em_cuda_gemm_takes(const cuda_backend *b, const cuda_matvec *mv);
/* WGMMA, besides: the sm_90a code loaded, K a multiple of its step, room in b->x16. */
bool em_cuda_wgmma_takes(const cuda_backend *b, const cuda_matvec *mv);
/* The tiles of 256 rows by 128 items the wgmma kernel gives `mv` (MoE: for the mean per expert). */
uint64_t em_cuda_wgmma_tiles(const cuda_matvec *mv);

/* One of up to three matrices that share the input rows and run in one launch (Q, K and V): of
 * the launch's rows, [begin, end) are this part's. w2: the up matrix of a gated unit. */
typedef struct cuda_part {
    const uint8_t *w, *w2;
    uint64_t row_bytes;
    uint32_t begin, end;
    float *y;
    uint64_t y_stride;
} cuda_part;
#define EM_CUDA_PARTS 3

/* What every product kernel takes from a cuda_matvec; matvec.cu and gemm.cu pass it, extended
 * with their own fields, as their kernels' argument. */
struct cuda_product_args {
    cuda_part part[EM_CUDA_PARTS];
    uint32_t n_parts;
    uint64_t mat_bytes;  /* MoE: bytes of one expert's matrix */
    uint32_t rows, cols; /* rows: of all parts together */
    const float *x;
    uint64_t x_stride;
    const uint32_t *x_index;
    uint32_t n_items;
    const uint32_t *counts, *starts;
    int act;             /* with a gated unit: EM_ACT_SWIGLU or EM_ACT_GEGLU */
    bool accumulate;
};

/* The part of launch row r, by comparisons (a run-time index into the kernel parameters would copy
 * them to local memory). */
__device__ __forceinline__ int em_cuda_part_of(const cuda_product_args &a, uint32_t r) {
    return a.n_parts > 1 && r >= a.part[0].end ? (a.n_parts > 2 && r >= a.part[1].end ? 2 : 1) : 0;
}

/* Fills *a from the descriptor, checked: every part of W's type and width, the up matrix shaped
 * like the gate. */
em_err em_cuda_product_args(const cuda_backend *b, const cuda_matvec *mv, cuda_product_args *a);
bool em_cuda_matvec_can_fuse(const cuda_weight *a, const cuda_weight *b);
/* x = the batch's token embeddings; with norm_w also xw = x * norm_w and b->ss (one partial per
 * token, b->ss_n = 1): the producer of the first layer's fused norm. */
em_err em_cuda_embed(cuda_backend *b, const cuda_batch *batch, float *x, const float *norm_w, float *xw);
/* (A token EM_TOKEN_PICKED(r) of the batch is embedded as b->picked[r], the previous step's pick.) */

/* What the product kernels learn once, when the backend is made: the dynamic shared memory their
 * kernels may take, and whether the loaded device code has wgmma (a small probe launch). */
em_err em_cuda_products_setup(cuda_backend *b);

/* ---- ops.cu ---- */
em_err em_cuda_rmsnorm(cuda_backend *b, float *out, const float *x, const float *w, uint32_t n_rows, uint32_t n,
                       const uint32_t *row_index);
/* x += [norm](out); then xn = norm(x) * w_next when xn is not NULL. */
em_err em_cuda_add_norm(cuda_backend *b, float *x, float *out, const float *w, uint32_t n_rows, uint32_t n, float *xn,
                        const float *w_next);
/* Q, K, V of every token finished (bias, QK-norm, RoPE; qkv.cuh) and K, V written into the cache.
 * Decode steps skip it: their attention kernel does the same (em_cuda_attention_finishes). */
em_err em_cuda_qkv_finish(cuda_backend *b, const cuda_batch *batch, uint32_t il);
em_err em_cuda_glu(cuda_backend *b, float *gate, const float *up, uint64_t n);
em_err em_cuda_softcap(cuda_backend *b, float *x, uint64_t n, float cap);
/* The top-k experts of each token (b->router holds the router's logits) and the grouping of the
 * pairs by expert. With norm_ss (where em_cuda_route_can_fold), also the end of a fused norm: b->xn
 * holds x * norm weights, norm_ss its producer's partial sums (b->ss_n of them), and each row is
 * scaled by its RMS factor. */
em_err em_cuda_route(cuda_backend *b, uint32_t il, uint32_t n_tokens, const float *norm_ss);
/* Whether em_cuda_route can end layer il's fused norm for n_tokens: up to 32 tokens (a warp
 * each, one block), 256 experts, rows of whole float4s. */
bool em_cuda_route_can_fold(const cuda_backend *b, uint32_t il, uint32_t n_tokens);
/* out = (or, into_x: x +=) the weighted expert outputs [+ the shared expert's, in tmp]. With
 * next_norm_w (into_x only), also a fused norm's producer (cuda_matvec): xw = x * next_norm_w and
 * the partial sums of squares in b->ss. */
em_err em_cuda_moe_combine(cuda_backend *b, uint32_t il, uint32_t n_tokens, bool add_shared, bool into_x,
                           const float *next_norm_w, float *xw);

/* ---- attention.cu ---- */
/* Attention of every token of the batch: the prefill segments on tensor cores where the layer's
 * shape allows (em_cuda_prefill_attention), the rest (or everything) with the decode-style kernel.
 * `use_segments` false sends every token to the decode-style kernel (for comparisons). */
em_err em_cuda_attention(cuda_backend *b, const cuda_batch *batch, uint32_t il);
em_err em_cuda_attention_with(cuda_backend *b, const cuda_batch *batch, uint32_t il, bool use_segments);

/* ---- attention_prefill.cu ---- */
bool em_cuda_prefill_supported(const cuda_backend *b, const cuda_layer *layer);
em_err em_cuda_prefill_attention(cuda_backend *b, const cuda_batch *batch, uint32_t il);
/* Floats of scratch (cuda_backend.pf_part) its splits of the context need. */
uint64_t em_cuda_prefill_part_floats(const cuda_backend *b);
/* The same with 4 or 8 warps per block (0: the default), for measurements. */
em_err em_cuda_prefill_attention_warps(cuda_backend *b, const cuda_batch *batch, uint32_t il, uint32_t warps);

/* ---- attention_decode.cu ---- */
/* Whether layer il's attention fits the grouped decode kernel (f16 cache, head sizes). */
bool em_cuda_attention_decode_fits(const cuda_backend *b, uint32_t il);
/* The tokens `tokens[0..n_tokens)` of the batch (NULL: all of them), the largest position among
 * them max_pos. */
em_err em_cuda_attention_decode(cuda_backend *b, const cuda_batch *batch, uint32_t il, const uint32_t *tokens,
                                uint32_t n_tokens, uint32_t max_pos);
/* Whether layer il's decode attention of this batch finishes Q, K and V itself, in place of
 * em_cuda_qkv_finish: a decode step (one token per sequence, no prefill segments) on the grouped
 * kernel, unless switched off. */
bool em_cuda_attention_finishes(const cuda_backend *b, const cuda_batch *batch, uint32_t il);

/* ---- sample.cu ---- */
/* Picks one token per logits row (b->logits, rows of n_vocab) by the rule of pick.h, a row with a
 * grammar mask (masks NULL, or masks[row] NULL: none) among the tokens its mask allows; copies back
 * only the tokens. */
em_err em_cuda_pick(cuda_backend *b, const em_pick_params *params, const uint32_t *const *masks, uint32_t rows,
                    int32_t *picked);
/* The same without waiting: enqueues the pick of `rows` rows into pick slot `slot` (its pinned
 * parameters, masks and tokens) and records pick_done[event] after the tokens' copy to the host. */
em_err em_cuda_pick_enqueue(cuda_backend *b, const em_pick_params *params, const uint32_t *const *masks, uint32_t rows,
                            uint32_t slot, uint32_t event);
/* The tokens an enqueued pick of slot `slot` left in pinned memory. */
const int32_t *em_cuda_picked_host(const cuda_backend *b, uint32_t slot);
void em_cuda_free_pick(cuda_backend *b);

/* ---- forward.cu ---- */
em_err em_cuda_forward(em_backend *base, const em_batch *batch, float *logits);
em_err em_cuda_forward_pick(em_backend *base, const em_batch *batch, const em_pick_params *pick, int32_t *picked);
em_err em_cuda_pick_begin(em_backend *base, const em_batch *batch, const em_pick_params *pick);
em_err em_cuda_pick_end(em_backend *base, int32_t *picked);
em_err em_cuda_pick_masks(em_backend *base, const uint32_t *const *masks);
em_err em_cuda_reserve(cuda_backend *b, uint32_t n_tokens);
void em_cuda_free_scratch(cuda_backend *b);
void em_cuda_drop_graphs(cuda_backend *b);

/* ---- mega.cu ---- */
/* The persistent decode kernel for the model, when the kernel takes it and EMBER_CUDA_MEGA is not
 * 0 (b->mega stays NULL otherwise, which is not an error). After the weights and the KV cache. */
em_err em_cuda_mega_setup(cuda_backend *b);
void em_cuda_mega_free(cuda_backend *b);
/* Whether the batch is a step the kernel runs: 1 to its maximum of tokens, one per sequence, a
 * logits row each. */
bool em_cuda_mega_takes(const cuda_backend *b, const cuda_batch *cb);
/* Enqueues the step (the embedding, then the one launch); the logits rows are then in b->logits. */
em_err em_cuda_mega_run(cuda_backend *b, const cuda_batch *cb);

/* ---- gemm.cu ---- */

/* The tensor-core path of em_cuda_matvec for large batches: the same descriptor, the same result
 * up to f16 rounding of the operands (gemm.cu), for the products em_cuda_gemm_takes. Forced, for
 * tests and measurements, with the items per tile (32, 64 or 128; 0 picks) and the kernel: STAGED
 * decodes weights and rounds activations through registers one K step ahead; PIPELINED copies
 * activations (and BF16 weights) with cp.async several steps ahead; MMA one of those two as the
 * type and the tile suit; WGMMA rounds the activations to f16 once (b->x16) and multiplies with
 * Hopper's warpgroup MMA (for it, `items` is the number of K splits, 0 picks:
 * em_cuda_gemm_wg_splits); AUTO WGMMA where em_cuda_kernel_for would pick it, else MMA. */
typedef enum em_cuda_gemm_kernel {
    EM_CUDA_GEMM_AUTO,
    EM_CUDA_GEMM_STAGED,
    EM_CUDA_GEMM_PIPELINED,
    EM_CUDA_GEMM_WGMMA, /* wgmma on 256 x 128 tiles (items: K splits) */
    EM_CUDA_GEMM_MMA,
} em_cuda_gemm_kernel;
em_err em_cuda_gemm_with(cuda_backend *b, const cuda_matvec *mv, uint32_t items, em_cuda_gemm_kernel kernel);
/* The kernels' shared-memory limits, and whether the loaded code has wgmma (b->wgmma_loaded). */
em_err em_cuda_gemm_setup(cuda_backend *b);
/* Floats of b->wg_part: what the wgmma kernel's split-K partials of any product can take. */
uint64_t em_cuda_gemm_split_floats(const cuda_backend *b);
/* The K splits the wgmma kernel gives `mv` (1: none); an item alone gets the bits it gets in a
 * batch of the same splits. */
uint32_t em_cuda_gemm_wg_splits(const cuda_backend *b, const cuda_matvec *mv);

#endif
