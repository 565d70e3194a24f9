/* The persistent decode kernel's shared definitions: its limits, the descriptions of the model
 * and of a launch that mega.cu and mega_attention.cuh read (mega.cu says how the kernel works). */
#pragma once

#include "dq_unit.cuh" /* matvec.cuh: internal.cuh, dequant.cuh, mv_glu */
#include "qkv.cuh"

extern "C" {
#include "../schedule.h"
}

/* A block: the consumer warps, then the loader. 12 warps leave a thread 168 registers (16 leave 128,
 * too few for the inlined products, which then spill to local memory; bench/RESULTS.md, "The
 * persistent decode kernel"). A build may set it, to measure that trade again. */
#ifndef MEGA_WARPS
#define MEGA_WARPS 12
#endif
#define MEGA_THREADS (MEGA_WARPS * 32)
#define MEGA_CONSUMERS (MEGA_WARPS - 1)  /* warps that compute; the last warp streams weights */
#define MEGA_CONSUMER_THREADS (MEGA_CONSUMERS * 32)
#define MEGA_MAX_STAGES 32
#define MEGA_ATTENTION_WARPS 4           /* consumers that take attention items (their shared memory) */
#define MEGA_MAX_TOKENS 4
#define MEGA_MAX_SPANS 64           /* attention partials per (token, query head) */
#define MEGA_MIN_SPAN 32            /* positions per attention item, at least */
#define MEGA_WATCHDOG (1ll << 33)   /* cycles a barrier may wait (seconds) before the kernel traps */

typedef struct mega_matrix {
    const uint8_t *data;
    uint64_t row_bytes;
    uint32_t rows, cols, type;
} mega_matrix;

typedef struct mega_layer {
    mega_matrix wq, wk, wv, wo, gate, up, down; /* in an expert layer: gate, up, down of expert 0 */
    mega_matrix router;                         /* expert layers only */
    uint64_t expert_bytes, down_expert_bytes;   /* from one expert's gate (up) or down matrix to the next */
    uint32_t n_expert, n_used;                  /* 0 experts: a dense layer */
    bool sigmoid, renormalize;                  /* the routing (route.cuh) */
    float expert_scale;
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm;
    __half *keys, *values;
    rope_args rope;
    uint32_t n_head, n_head_kv, head_dim, window;
    float scale, softcap;
} mega_layer;

typedef struct mega_args {
    const em_op *ops;
    const uint8_t *op_int8;          /* per instruction: its products take 8-bit activations (dq_unit.cuh) */
    uint32_t n_ops;
    const mega_layer *layers;
    mega_matrix output;
    const float *output_norm;
    float *x, *q, *k, *v, *attn, *h, *logits, *parts;
    float *router, *moe_h;           /* the router's logits [token][expert]; the experts' gated units [token][choice][ff] */
    uint32_t *att_done;              /* per (token, query head): spans finished (attention_item) */
    uint32_t attention_warps;        /* warps of a block that take attention items (shared memory) */
    const uint32_t *pos, *seq, *table_start, *blocks;
    uint32_t block_tokens, n_embd, n_vocab;
    float eps, final_softcap;
    bool plus_one;
    int act;
    unsigned long long *barrier;
    unsigned long long barrier_base; /* the counter's value when this launch started */
    unsigned long long *op_ns;       /* EMBER_CUDA_MEGA_PROFILE: per instruction, 3 sums of the nanoseconds
                                      * block 0 took: its input, its rows (or attention), the barrier
                                      * after (NULL: off) */
    uint32_t ring_offset, n_stages, stage_bytes; /* the weight ring in the dynamic shared memory */
    uint32_t results_offset;         /* bytes into it: the expert down products' per-expert rows (EXPERT_DOWN) */
} mega_args;

/* A step's routing in an expert layer, as a block holds it in shared memory: each token's choices
 * and weights, the distinct experts chosen by the step's tokens in ascending order (the parts of the
 * expert instructions), and for each of those the choice index of each token (MEGA_NO_CHOICE: the
 * token did not choose it). The loader warp and the consumers each work out their own copy. */
#define MEGA_NO_CHOICE 0xff
typedef struct mega_route {
    int32_t chosen[EM_SCHEDULE_MAX_USED]; /* [token * k + choice], a step's tokens * k <= 32 */
    float weight[EM_SCHEDULE_MAX_USED];
    uint32_t experts[EM_SCHEDULE_MAX_USED];
    uint8_t choice[EM_SCHEDULE_MAX_USED][MEGA_MAX_TOKENS];
    uint32_t n;
} mega_route;

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ uint32_t first_position(uint32_t pos, uint32_t window) {
    return window && pos + 1 > window ? pos + 1 - window : 0;
}

/* Positions per attention item for a token at pos: a function of the token alone (not of the
 * batch), so a sequence's sums are the same alone and batched. */
__device__ __forceinline__ uint32_t span_of(uint32_t pos, uint32_t window) {
    const uint32_t context = pos + 1 - first_position(pos, window);
    const uint32_t span = (context + MEGA_MAX_SPANS - 1) / MEGA_MAX_SPANS;
    return max((uint32_t)MEGA_MIN_SPAN, (span + 31) / 32 * 32);
}

__device__ __forceinline__ uint32_t spans_of(uint32_t pos, uint32_t window) {
    const uint32_t span = span_of(pos, window);
    return (pos + 1 - first_position(pos, window) + span - 1) / span;
}

/* A barrier of the block's consumer warps (the loader warp never waits on them). */
__device__ __forceinline__ void consumer_sync(void) {
    asm volatile("bar.sync 1, %0;" ::"n"(MEGA_CONSUMER_THREADS) : "memory");
}
