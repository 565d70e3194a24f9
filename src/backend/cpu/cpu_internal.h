/* Internals of the CPU backend shared by its files: the thread pool and the numeric kernels.
 * Nothing outside src/backend/cpu includes this. */
#ifndef EMBER_BACKEND_CPU_INTERNAL_H
#define EMBER_BACKEND_CPU_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../../program/program.h"
#include "../../quant/quant.h"
#include "../backend.h"

/* ---- thread pool (pool.c) ---- */

/* The most threads a backend takes. */
#define EM_CPU_MAX_THREADS 1024

/* A job runs on every thread at once; `ith` of `nth` picks its share. */
typedef void (*em_cpu_job)(void *ctx, uint32_t ith, uint32_t nth);

/* Workers and the caller may wait for each other by spinning for a short while (a decode step hands
 * out hundreds of short jobs, and a sleeping thread takes a while to wake), then sleep on the
 * condition variables (between steps, or when the machine is busy); see DEFAULT_SPIN_US in pool.c.
 * Unless EMBER_CPU_SPIN_US fixes the spin, the caller looks every SPIN_CHECK_MS whether other
 * processes want the cores (em_cpu_spin_allowed) and turns the spin off while they do.
 * A new job is published by bumping `generation`; `pending` counts the workers still running it. */
typedef struct em_cpu_pool {
    pthread_t *threads;
    uint32_t n_threads; /* including the caller, which runs share 0 */
    uint32_t n_started;
    pthread_mutex_t mutex;
    pthread_cond_t wake, done;
    _Atomic uint64_t generation;
    _Atomic uint32_t pending;
    em_cpu_job job;
    void *ctx;
    atomic_bool quit;
    _Atomic uint64_t spin_ns; /* how long a waiting thread spins now before it sleeps */
    uint64_t spin_max_ns;     /* the spin while the machine has room (EMBER_CPU_SPIN_US fixes it) */
    bool spin_adapts;         /* false where EMBER_CPU_SPIN_US was given */
    uint32_t n_cpus;          /* CPUs this process may run on */
    uint64_t spin_checked_ns; /* when the caller last looked at the machine's load */
} em_cpu_pool;

/* Whether a pool of `n_threads` may spin on a machine of `n_cpus`, given the text of /proc/loadavg
 * (its fourth field: runnable tasks, this one included / all tasks) and whether the pool's workers
 * are spinning now (then they are among the runnable ones): yes when the pool's threads and every
 * other runnable task fit the CPUs. False for text it cannot read. */
bool em_cpu_spin_allowed(const char *loadavg, uint32_t n_cpus, uint32_t n_threads, bool workers_spinning);

em_err em_cpu_pool_init(em_cpu_pool *pool, uint32_t n_threads);
void em_cpu_pool_destroy(em_cpu_pool *pool);
/* Runs `job` on all threads and returns when every share is done. */
void em_cpu_pool_run(em_cpu_pool *pool, em_cpu_job job, void *ctx);

/* Jobs smaller than this (bytes of weights read, or their equivalent) run on the calling thread
 * alone: waking the pool's sleeping threads and waiting for them costs more than such a job takes
 * (a small model's decode step is made of them). */
#define EM_CPU_INLINE_BYTES ((uint64_t)1 << 20)

/* em_cpu_pool_run for a job of about `bytes` of work: on the calling thread alone below
 * EM_CPU_INLINE_BYTES. Shares split rows or elements, so the result is the same either way. */
static inline void em_cpu_pool_run_sized(em_cpu_pool *pool, em_cpu_job job, void *ctx, uint64_t bytes) {
    if (bytes < EM_CPU_INLINE_BYTES) job(ctx, 0, 1);
    else em_cpu_pool_run(pool, job, ctx);
}

/* Work handed out in pieces while a job runs, for jobs whose shares would otherwise be fixed in
 * advance: each thread takes the next piece when it is done with its last, and the pieces shrink as
 * the work runs out (a 2 * nth-th of what is left, never less than `least`), so threads that run at
 * different speeds (a core shared with another process, a worker woken after the caller started)
 * still finish together. Pieces are [begin, end) of [0, total), taken in order; their ends fall on
 * multiples of `align` (and on total). Set up with em_cpu_pieces_init before the job runs. */
typedef struct em_cpu_pieces {
    _Atomic uint64_t next;
    uint64_t total, least, align;
} em_cpu_pieces;

static inline void em_cpu_pieces_init(em_cpu_pieces *p, uint64_t total, uint64_t least, uint64_t align) {
    atomic_init(&p->next, 0);
    p->total = total;
    p->align = align ? align : 1;
    p->least = least > p->align ? least : p->align;
}

/* The next piece for a thread of a job run by nth threads; false when none is left. One thread takes
 * everything left at once. */
static inline bool em_cpu_piece(em_cpu_pieces *p, uint32_t nth, uint64_t *begin, uint64_t *end) {
    uint64_t at = atomic_load_explicit(&p->next, memory_order_relaxed);
    for (;;) {
        if (at >= p->total) return false;
        const uint64_t left = p->total - at;
        uint64_t size = nth > 1 ? left / (2 * (uint64_t)nth) : left;
        if (size < p->least) size = p->least;
        size = (at + size + p->align - 1) / p->align * p->align - at;
        const uint64_t stop = size < left ? at + size : p->total;
        /* relaxed: the job's data came with the pool's generation, and the results go back with its join */
        if (atomic_compare_exchange_weak_explicit(&p->next, &at, stop, memory_order_relaxed, memory_order_relaxed)) {
            *begin = at;
            *end = stop;
            return true;
        }
    }
}

/* Splits [0, n) into nth nearly equal parts; share ith is [*begin, *end). */
static inline void em_cpu_share(uint64_t n, uint32_t ith, uint32_t nth, uint64_t *begin, uint64_t *end) {
    uint64_t per = n / nth, extra = n % nth;
    *begin = ith * per + (ith < extra ? ith : extra);
    *end = *begin + per + (ith < extra ? 1 : 0);
}

/* ---- kernels (ops.c) ---- */

/* Tokens per group of a batched matrix product (quant.h's EM_DOT_GROUP_TOKENS). */
#define EM_CPU_GROUP 8

/* out = x / rms(x) * w (w may be NULL: no weight); out may alias x. */
void em_cpu_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps, bool plus_one);

/* The rotation of position `pos`: cos and sin of each of the n_rot/2 angles, interleaved. */
void em_cpu_rope_angles(float *cos_sin, uint32_t pos, const em_rope *rope);
/* Rotates the first n_rot dimensions of one head in place. */
void em_cpu_rope(float *head, const float *cos_sin, const em_rope *rope);

/* GELU (tanh approximation); softmax and SiLU are quant's em_f32_softmax and em_f32_silu_mul. */
float em_cpu_gelu(float x);

/* gate[i] = act(gate[i]) · up[i] for i < n: SwiGLU, GeGLU, or the clamped SwiGLU with its clip
 * `limit` and slope `alpha` (program.h). */
void em_cpu_glu(em_activation act, float limit, float alpha, float *gate, const float *up, uint64_t n);

/* rows[r][i] += bias[i] for r < n_rows, i < width (rows `width` floats apart); bias NULL: nothing. */
void em_cpu_add_bias(float *rows, const float *bias, uint64_t n_rows, uint64_t width);

/* Y[t][r] = W[mat] row r · X[t], for t < n_tokens and all rows of one matrix of the stack: em_dot's
 * numbers bitwise, except BF16 weights against EM_CPU_BF16_TILES_FROM or more tokens where the CPU has
 * AVX512_BF16 (activations rounded to bf16, em_bf16_tiles), and Q4_K and Q8_0 weights against
 * EM_CPU_AMX_FROM or more tokens where it has AMX-INT8 (em_amx_product: em_dot_scalar's numbers).
 * X rows are `x_stride` floats apart, Y rows `y_stride`. `scratch` holds the activations in the
 * dot-product format: n_tokens * em_cpu_act_bytes(w) bytes; `groups` the same activations packed
 * in token groups where the weight type has group kernels (see quant.h): room for
 * em_cpu_group_scratch_tokens(n_tokens) * em_cpu_act_bytes(w) bytes. */
typedef struct em_cpu_matmul {
    const em_weight *w;
    uint64_t mat;
    const float *x;
    uint64_t x_stride;
    float *y;
    uint64_t y_stride;
    uint32_t n_tokens;
    uint8_t *scratch;
    uint8_t *groups;
    /* scratch (and groups) already hold x as the previous em_cpu_matmul_run left them, for a weight
     * of the same type and columns: the activations are not quantized (or packed) again */
    bool quantized;
} em_cpu_matmul;

/* n_tokens rounded up to whole token groups and AMX tiles (a tile of 16 packed tokens takes fewer
 * bytes than 16 activation rows): the group scratch is sized in activation rows. */
static inline uint64_t em_cpu_group_scratch_tokens(uint64_t n_tokens) {
    return (n_tokens + EM_AMX_TILE_TOKENS - 1) / EM_AMX_TILE_TOKENS * EM_AMX_TILE_TOKENS;
}

uint64_t em_cpu_act_bytes(const em_weight *w);
/* With pool NULL, on the calling thread alone (a share of a pool job running a product of its own). */
em_err em_cpu_matmul_run(em_cpu_pool *pool, const em_cpu_matmul *mm);

/* Batches of fewer tokens than this (a decode step) skip the token-group packing and go through
 * em_dot_weights where it has a kernel for the type and token count, em_dot_rows elsewhere; the
 * backend also runs their products that share an input as one job. Four tokens
 * ran faster that way than through a group kernel's lanes for eight (bench/cpu_ab.sh). BF16
 * weights take their tiles from EM_CPU_BF16_TILES_FROM tokens, where the tiles win. */
#define EM_CPU_FEW_TOKENS 5
#define EM_CPU_BF16_TILES_FROM 4

/* Whether n tokens against BF16 weights take the AVX512_BF16 tiles. */
static inline bool em_cpu_bf16_tiles(uint32_t type, uint32_t n) {
    return type == EM_TYPE_BF16 && n >= EM_CPU_BF16_TILES_FROM && em_bf16_tiles_available();
}

/* Batches of this many tokens or more against Q4_K or Q8_0 weights take the AMX tiles where the CPU has
 * them (em_amx_product: em_dot_scalar's numbers, not the AVX2 em_dot's). */
#define EM_CPU_AMX_FROM 16

static inline bool em_cpu_amx(uint32_t type, uint64_t cols, uint32_t n) {
    return n >= EM_CPU_AMX_FROM && em_amx_tile_bytes(type, cols) && em_amx_available();
}

/* Whether n tokens against weights of `type` take the batch path (em_cpu_matmul_run with groups or
 * tiles) rather than the few-token one. */
static inline bool em_cpu_batched(uint32_t type, uint32_t n) {
    return n >= EM_CPU_FEW_TOKENS || em_cpu_bf16_tiles(type, n);
}

/* One product of em_cpu_products_run: Y[t][r] = W[mat] row r · activation row t, for t < n_tokens,
 * the activation rows already in the dot-product format (em_cpu_quantize), act_stride bytes apart. */
typedef struct em_cpu_product {
    const em_weight *w;
    uint64_t mat;
    const uint8_t *act;
    uint64_t act_stride;
    uint32_t n_tokens;
    float *y;
    uint64_t y_stride;
} em_cpu_product;

/* n_tokens rows of x (x_stride floats apart) into w's activation format at `out`, em_cpu_act_bytes(w)
 * bytes apart, on the calling thread. */
em_err em_cpu_quantize(const em_weight *w, const float *x, uint64_t x_stride, uint32_t n_tokens, uint8_t *out);

/* All the products in one job of the pool: the weight rows of every product, end to end, are split
 * into one run of nearly equal bytes per thread, so each thread reads its share of the weights once
 * and no thread waits for another between products. Results equal em_cpu_matmul_run's bitwise. */
void em_cpu_products_run(em_cpu_pool *pool, const em_cpu_product *products, uint32_t n);

/* ---- a batch's experts (experts.c) ---- */

/* The scratch of em_cpu_experts_run for batches of up to cap_tokens tokens, owned by the backend:
 * every (token, chosen expert) pair is a slot, in (expert, token) order; each thread has room for
 * the rows of one expert (at most one per token). */
typedef struct em_cpu_expert_scratch {
    uint32_t cap_tokens;
    uint32_t *slot_token, *slot_of; /* a slot's token; the slot of each token's k-th choice */
    float *slot_weight;
    float *slot_out;                /* each slot's expert output, n_embd floats */
    uint32_t *expert_first, *expert_count, *expert_thread; /* per expert: its slots, its thread */
    uint32_t n_threads;
    float **x, **gate, **up;        /* per thread: an expert's input, gate and up rows */
    uint8_t **act, **groups;        /* per thread: em_cpu_matmul's scratch and groups (or NULL) */
} em_cpu_expert_scratch;

/* Room for n_tokens in `s` (kept when it has enough): n_used choices per token of n_expert experts,
 * inputs of n_embd, gated units of up to max_ff, act_per_token bytes of activations (and as much
 * again for token groups where `groups` is set). */
em_err em_cpu_expert_scratch_reserve(em_cpu_expert_scratch *s, uint32_t n_threads, uint32_t n_tokens,
                                     uint32_t n_used, uint32_t n_expert, uint32_t n_embd, uint32_t max_ff,
                                     uint64_t act_per_token, bool groups);
void em_cpu_expert_scratch_free(em_cpu_expert_scratch *s);

/* A batch's mixture-of-experts feed-forward once the router has chosen: out[t] = the sum over
 * token t's chosen experts, in ascending expert order, of weight * down(act(gate x_t) * up x_t). */
typedef struct em_cpu_experts {
    const em_weight *gate, *up, *down; /* the layer's stacks of expert matrices */
    const float *gate_bias, *up_bias, *down_bias; /* per expert, or NULL (em_program_experts) */
    em_activation act;
    float limit, alpha;                /* the clamped SwiGLU's */
    const float *x;                    /* n_tokens rows of n_embd */
    uint32_t n_tokens, n_embd, n_expert, n_used;
    const int32_t *chosen;             /* [token][n_used]: expert ids, distinct for each token */
    const float *chosen_weight;        /* [token][n_used] */
    float *out;                        /* n_tokens rows of n_embd */
} em_cpu_experts;

/* Every expert runs whole on one thread (its products and gated unit one after another, on that
 * thread's scratch), the experts with the most tokens first, each to the thread with the fewest
 * tokens so far; then the sums, split by tokens. Two jobs of the pool per layer, where a product
 * split over the threads takes two or three per product of every expert. Every number is what
 * em_cpu_matmul_run and the per-expert loop give, bitwise. */
em_err em_cpu_experts_run(em_cpu_pool *pool, const em_cpu_experts *job, em_cpu_expert_scratch *s);

/* ---- attention (attention.c) ---- */

/* Consecutive tokens of a batch whose attention one unit of work computes together. */
#define EM_CPU_ATTN_TILE 8

/* The queries of a batch against one paged KV cache (program.h's attention operation). */
typedef struct em_cpu_attention {
    const em_program_attention *op;
    const em_batch *batch;
    const float *q;               /* [token][n_head * head_dim] */
    float *out;                   /* [token][n_head * head_dim_v] */
    const float *keys, *values;   /* the cache's rows: n_head_kv * head_dim (head_dim_v) floats each */
    uint32_t block_tokens;        /* positions per block of the batch's block tables */
    /* per thread, scores_per_thread floats: cap_positions per query head of a KV head's group per
     * token of a tile */
    float *scores;
    uint64_t scores_per_thread;
    uint32_t cap_positions;
} em_cpu_attention;

void em_cpu_attention_run(em_cpu_pool *pool, const em_cpu_attention *job);

/* ---- Gated DeltaNet (delta_net.c) ---- */

/* One delta_net operation over a batch. A token's state is in the slot its sequence names
 * (em_batch_seq.state): slot s's floats start at s * slot_floats in `states`, this operation's at
 * `offset` among them (em_program_state_offset). */
typedef struct em_cpu_delta_net {
    const em_program_delta_net *op;
    const em_batch *batch;
    const float *mixed;          /* [token][conv_dim]: q, k, v channels before the convolution */
    const float *beta, *alpha;   /* [token][n_head_v] */
    float *out;                  /* [token][n_head_v * head_dim_v] */
    float *states;
    uint64_t slot_floats, offset;
    float *conv_out;             /* scratch: [token][conv_dim] */
    float *gates;                /* scratch: [token][n_head_v] pairs (g, β) */
    float *scratch;              /* head_dim_v floats per thread of the pool */
} em_cpu_delta_net;

void em_cpu_delta_net_run(em_cpu_pool *pool, const em_cpu_delta_net *job);

/* Every head of each of n_tokens rows: RMSNorm(head) · weight ⊙ SiLU(gate), in place. */
void em_cpu_gated_norm(const em_program_heads *heads, float *rows, const float *gate, uint32_t n_tokens);

#endif
