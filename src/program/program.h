/*
 * program — a forward step as data: the ordered operations that turn a batch's tokens into logits,
 * over named activation buffers, weights and KV caches. A model is compiled into its program once,
 * at load (src/model/builder.c); every backend executes that program, so what a layer is lives in
 * one place, and a trait of a family is an operation with its parameters, not a flag that each
 * backend reads on its own.
 *
 * The shape of a program, for a llama-like block (em_program_describe prints any program this way):
 *
 *   embed          x = token_embd[token] · scale
 *   norm           xn = RMSNorm(x) · w
 *   matmul ×3      q, k, v = W_q xn (+ b_q), W_k xn, W_v xn
 *   head_norm      each head of q (and k) normalized        (QK-norm families)
 *   rope           each head of q and k rotated at the token's position
 *   kv_write       k, v into the layer's cache
 *   attention      attn = softmax(q·K) V over the cache (with a sink logit per head, a window)
 *   matmul         out = W_o attn
 *   add            x += out
 *   norm, matmul ×2, glu, matmul, add     x += down(act(gate xn) · up xn)
 *   or route + experts (+ a shared expert, which matmul + sigmoid_gate scale by σ(w_sᵀ xn) where the
 *   model gates it) for a mixture-of-experts layer
 *
 * A hybrid model's linear-attention layers (Qwen3.5's Gated DeltaNet) mix tokens through a state
 * that each sequence carries (em_program_state) instead of a KV cache:
 *
 *   matmul ×4      qkv, z, beta, alpha = W xn
 *   delta_net      o = the gated delta rule over conv(qkv), updating the sequence's state
 *   gated_norm     o = RMSNorm(o) · w ⊙ SiLU(z), head by head
 *   matmul         out = W_out o
 *
 * and its gated full-attention layers split [q | gate] per head (split_gate) and multiply the
 * attention by σ(gate) (sigmoid_gate) before W_o.
 *
 * Gemma 4's forms are data flow over the same operations: V normalized without a weight (head_norm),
 * K = V (v from the key projection), layers that share KV (attention over an earlier layer's
 * cache, with no kv_write of their own), and per-layer inputs: a second embed, sliced per layer,
 * gating a projection added to the residual stream, which each layer then scales.
 *   output         logits = W_out RMSNorm(x) of the rows that want logits, soft-capped
 *
 * Buffers hold one row per token of the batch, in f32; each is declared once with the widest row any
 * operation gives it (layers may differ), and every operation says the width it reads and writes, so
 * em_program_check can prove before the first step that each operation reads what an earlier one
 * wrote, at the width it expects, from weights of the right shape. A backend may fuse a sequence of
 * operations into one kernel (a rewrite); the program stays the definition of what the step computes.
 *
 * Ownership: a program owns its arrays of operations, buffers, caches and states; the weights, vectors and
 * RoPE parameters an operation points to belong to the model it was built from, which must outlive it.
 * Depends on base only.
 */
#ifndef EMBER_PROGRAM_H
#define EMBER_PROGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

/* ---- The operands ---- */

/* A matrix (or a stack of matrices) in its stored block format. GGUF's layout: ne[0] = cols = input
 * features, ne[1] = rows = output features (one output feature is one contiguous row). */
typedef struct em_weight {
    const void *data;     /* NULL when absent */
    uint32_t type;
    uint64_t cols;        /* ne[0]: input features */
    uint64_t rows;        /* ne[1]: output features */
    uint64_t n_mat;       /* ne[2]: experts, 1 otherwise */
    uint64_t row_bytes;
    /* bytes from one matrix of a stack to the next; 0: rows × row_bytes (the matrices end to end).
     * A view of half of each matrix of a fused stack (gate and up of the experts in one tensor)
     * steps over the other half. */
    uint64_t mat_bytes;
} em_weight;

/* The first byte of matrix `mat` of a stack. */
static inline const uint8_t *em_weight_matrix(const em_weight *w, uint64_t mat) {
    return (const uint8_t *)w->data + mat * (w->mat_bytes ? w->mat_bytes : w->rows * w->row_bytes);
}

typedef enum em_rope_style { EM_ROPE_NORMAL, EM_ROPE_NEOX } em_rope_style;
typedef enum em_rope_scaling {
    EM_ROPE_SCALING_NONE,
    EM_ROPE_SCALING_LINEAR, /* positions divided by factor */
    EM_ROPE_SCALING_LLAMA3, /* per-frequency factors (GGUF stores them as rope_freqs.weight) */
    EM_ROPE_SCALING_YARN,   /* interpolation ramp between extrapolated and interpolated angles */
} em_rope_scaling;

/* Rotary position embedding. */
typedef struct em_rope {
    em_rope_style style;
    float theta;        /* frequency base */
    uint32_t n_rot;     /* rotated dimensions per head (< head_dim: partial rotary) */
    em_rope_scaling scaling;
    float factor;       /* linear / yarn: context extension factor (1 = none) */
    uint32_t orig_ctx;  /* yarn: training context before extension */
    float yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    const float *freq_factors; /* n_rot/2 divisors of the frequencies, or NULL (owned by the model) */
} em_rope;

/* The activation of a gated unit: act(gate) · up. The clamped SwiGLU (gpt-oss) clips both inputs
 * first and shifts up by one: g = min(g, limit), u = clamp(u, -limit, limit), (u + 1) · g · σ(alpha g). */
typedef enum em_activation { EM_ACT_SWIGLU, EM_ACT_GEGLU, EM_ACT_SWIGLU_CLAMPED } em_activation;
/* How a router turns its logits into probabilities: a softmax over all experts or a sigmoid of each
 * (then the top k), or the top k logits first and a softmax over those k alone (gpt-oss). */
typedef enum em_gating { EM_GATING_SOFTMAX, EM_GATING_SIGMOID, EM_GATING_SOFTMAX_CHOSEN } em_gating;

/* ---- Operations ---- */

typedef enum em_program_op_kind {
    EM_PROGRAM_EMBED,     /* dst = rows of `table` at the batch's tokens, times `scale` (the first
                           * operation; a later one reads a second table: per-layer inputs) */
    EM_PROGRAM_NORM,      /* dst = RMSNorm(src) · weight (weight NULL: none); dst may be src */
    EM_PROGRAM_MATMUL,    /* dst = W[mat] · src (+ bias) */
    EM_PROGRAM_HEAD_NORM, /* every head of dst: RMSNorm over its head_dim values · weight, in place */
    EM_PROGRAM_ROPE,      /* every head of dst rotated at its token's position, in place */
    EM_PROGRAM_KV_WRITE,  /* src (keys) and src2 (values) into `cache` at each token's position */
    EM_PROGRAM_ATTENTION, /* dst = attention of the queries in src over `cache`, written by this layer's
                           * kv_write or, for a layer that shares KV, by an earlier layer's */
    EM_PROGRAM_GLU,       /* dst = act(dst) · src: dst holds the gate, src the up projection */
    EM_PROGRAM_ADD,       /* dst += src */
    EM_PROGRAM_ROUTE,     /* dst (choices) = the top experts of gating(src), src being router logits */
    EM_PROGRAM_EXPERTS,   /* dst = Σ over the choices in src2 of weight · down(act(gate src) · up src),
                           * each product with its expert's bias where the experts have them */
    EM_PROGRAM_OUTPUT,    /* logits = W · RMSNorm(src) · norm for the rows that want them, soft-capped */
    /* Gated attention (Qwen3.5's full layers): the query projection gives [query | gate] per head. */
    EM_PROGRAM_SPLIT_GATE,   /* dst = the query half of each head of src, u.split_gate.gate = the gate half */
    EM_PROGRAM_SIGMOID_GATE, /* dst ⊙= σ(src): element by element, or one gate per token (per_token) */
    /* Gated DeltaNet (linear attention with a recurrent state per sequence; delta_net.c on the CPU). */
    EM_PROGRAM_DELTA_NET,    /* dst = the gated delta rule over src's mixed q, k, v, with `state` */
    EM_PROGRAM_GATED_NORM,   /* every head of dst: RMSNorm over head_dim · weight ⊙ SiLU(src) */
    /* Per-layer inputs (Gemma 4's small models): a second embedding table whose rows hold a slice
     * for every layer, and scalars on the residual stream. */
    EM_PROGRAM_SCALE,        /* dst *= factor */
    EM_PROGRAM_SLICE,        /* dst = columns [offset, offset + width) of each row of src */
    EM_PROGRAM_OP_KINDS
} em_program_op_kind;

/* No layer: the step's first and last operations. */
#define EM_PROGRAM_NO_LAYER UINT32_MAX

typedef struct em_program_norm {
    const float *weight;  /* NULL: normalization alone */
    uint32_t width;       /* floats per row (per head for head_norm) */
    float eps;
    bool plus_one;        /* multiply by (1 + w): weights stored without the shift */
} em_program_norm;

typedef struct em_program_matmul {
    const em_weight *weight;
    uint64_t mat;         /* which matrix of a stack */
    const float *bias;    /* weight->rows floats, or NULL */
} em_program_matmul;

/* The heads of a buffer: head_norm and rope. */
typedef struct em_program_heads {
    uint32_t n_head, head_dim;
    em_program_norm norm;     /* head_norm: per head, width = head_dim */
    const em_rope *rope;      /* rope */
} em_program_heads;

typedef struct em_program_attention {
    uint32_t n_head, n_head_kv, head_dim, head_dim_v;
    uint32_t window;      /* a query at p sees keys at p' with p - p' < window; 0 = all before it */
    float scale;          /* multiplies q·k */
    float softcap;        /* scores become c·tanh(s/c); 0 = none */
    /* n_head logits, one per query head, each one more term of its softmax's denominator (a key
     * whose value is zero): p_j = e^{s_j} / (Σ_i e^{s_i} + e^{sink}); NULL = none */
    const float *sinks;
} em_program_attention;

typedef struct em_program_glu {
    em_activation act;
    uint32_t width;
    float limit, alpha;   /* EM_ACT_SWIGLU_CLAMPED: the clip and the sigmoid's slope */
} em_program_glu;

typedef struct em_program_route {
    uint32_t n_expert, n_used;
    em_gating gating;
    bool renormalize;     /* the chosen weights are rescaled to sum to 1 */
    float scale;          /* then multiplied by this */
    const float *expert_scale; /* then each by its expert's factor (n_expert floats), or NULL */
} em_program_route;

typedef struct em_program_experts {
    const em_weight *gate, *up, *down; /* stacks of n_expert matrices */
    /* each expert's biases, added to its products: n_expert rows of gate->rows (down: down->rows)
     * floats, expert by expert; NULL = none */
    const float *gate_bias, *up_bias, *down_bias;
    em_activation act;
    float limit, alpha;   /* EM_ACT_SWIGLU_CLAMPED: the clip and the sigmoid's slope */
} em_program_experts;

typedef struct em_program_embed {
    const em_weight *table; /* rows = the vocabulary */
    float scale;
} em_program_embed;

typedef struct em_program_output {
    em_program_norm norm;
    const em_weight *weight;
    float softcap;        /* logits become c·tanh(l/c); 0 = none */
} em_program_output;

/* The query projection of gated attention holds, per head, head_dim queries then head_dim gates. */
typedef struct em_program_split_gate {
    uint32_t n_head, head_dim;
    uint8_t gate;         /* the buffer the gates go to (n_head * head_dim per token) */
} em_program_split_gate;

/* dst ⊙= σ(src), `width` values per token of dst: src holds as many (gated attention's gates), or
 * one per token that scales the whole row (a shared expert's gate, σ(w_sᵀx)). */
typedef struct em_program_sigmoid_gate {
    uint32_t width;
    bool per_token;
} em_program_sigmoid_gate;

/* One step of Gated DeltaNet for each token, in batch order. src holds per token the conv_dim =
 * 2·n_head_k·head_dim_k + n_head_v·head_dim_v mixed channels [q | k | v] before the convolution;
 * the buffers `beta` and `alpha` hold n_head_v values per token. Per token and channel:
 *   x = SiLU(Σ_j conv[c][j] · input[t − (K−1) + j])        causal depthwise conv over the last K inputs
 * then q, k = L2-normalized heads (q also times 1/√head_dim_k), β = σ(beta), g = a · softplus(alpha + dt_bias),
 * and per value head h (reading key head h mod n_head_k when v_tiled, h / (n_head_v / n_head_k) otherwise),
 * with its state S (head_dim_k x head_dim_v):
 *   S ← e^g S;  u = Sᵀk;  S ← S + k (β (v − u))ᵀ;  dst_h = Sᵀq.
 * A sequence's state is its last K − 1 inputs and every head's S (em_program_state); a token at
 * position 0 starts from zeros, any other continues the state its sequence left. */
typedef struct em_program_delta_net {
    uint32_t n_head_k, n_head_v, head_dim_k, head_dim_v;
    uint32_t conv_kernel;     /* K */
    bool v_tiled;
    const float *conv;        /* conv_dim rows of K weights; the last weights the current input */
    const float *dt_bias, *a; /* n_head_v each; a = −exp(A_log) */
    float eps;                /* of the L2 norms: x / √(Σx² + eps) */
    uint8_t beta, alpha;      /* buffers */
    uint32_t state;           /* the program's recurrent state it reads and updates */
} em_program_delta_net;

/* dst *= factor, over `width` floats a row. */
typedef struct em_program_scale {
    uint32_t width;
    float factor;
} em_program_scale;

/* Columns [offset, offset + width) of each row of src (src_width floats a row). */
typedef struct em_program_slice {
    uint32_t offset, width, src_width;
} em_program_slice;

typedef struct em_program_op {
    em_program_op_kind kind;
    uint32_t layer;       /* the layer it belongs to (messages, per-layer backends), or EM_PROGRAM_NO_LAYER */
    uint8_t dst, src, src2; /* buffer indices; unused ones are 0 */
    uint32_t cache;       /* kv_write, attention */
    union {
        em_program_norm norm;
        em_program_matmul matmul;
        em_program_heads heads;
        em_program_attention attention;
        em_program_glu glu;
        em_program_route route;
        em_program_experts experts;
        em_program_embed embed;
        em_program_output output;
        uint32_t add_width;
        em_program_split_gate split_gate;
        em_program_sigmoid_gate sigmoid_gate;
        em_program_delta_net delta_net;
        em_program_scale scale;
        em_program_slice slice;
    } u;
} em_program_op;

/* ---- Buffers and caches ---- */

typedef enum em_program_buffer_kind {
    EM_PROGRAM_ROWS,      /* width f32 values per token */
    EM_PROGRAM_CHOICES,   /* width (expert, weight) pairs per token: a router's choices */
} em_program_buffer_kind;

#define EM_PROGRAM_MAX_BUFFERS 32
#define EM_PROGRAM_NAME_MAX 16

typedef struct em_program_buffer {
    char name[EM_PROGRAM_NAME_MAX];
    em_program_buffer_kind kind;
    uint32_t width;       /* the widest row any operation writes */
} em_program_buffer;

/* A KV cache: key_width and value_width floats per position (all heads of one layer). */
typedef struct em_program_cache {
    uint32_t key_width, value_width;
    uint32_t layer;       /* the layer that writes it */
} em_program_cache;

/* A recurrent state: what one sequence carries from token to token through a delta_net operation,
 * conv_floats then recurrent_floats f32 values. Backends keep one per sequence slot (backend.h). */
typedef struct em_program_state {
    uint32_t layer;
    uint32_t conv_floats;      /* (K − 1) inputs of conv_dim channels */
    uint32_t recurrent_floats; /* n_head_v · head_dim_k · head_dim_v */
} em_program_state;

typedef struct em_program {
    em_program_op *ops;
    uint32_t n_ops, cap_ops;
    em_program_buffer buffers[EM_PROGRAM_MAX_BUFFERS];
    uint32_t n_buffers;
    em_program_cache *caches;
    uint32_t n_caches, cap_caches;
    em_program_state *states;
    uint32_t n_states, cap_states;
    uint32_t n_vocab;     /* the logits' width */
    uint32_t n_layer;
} em_program;

/* ---- Building ---- */

/* Declares a buffer (or widens one declared before under the same name); its index in *index. */
em_err em_program_buffer_declare(em_program *p, const char *name, em_program_buffer_kind kind, uint32_t width,
                                 uint8_t *index);
/* Declares a KV cache written by `layer`; its index in *index. */
em_err em_program_cache_declare(em_program *p, uint32_t layer, uint32_t key_width, uint32_t value_width,
                                uint32_t *index);
/* Declares a recurrent state written by `layer`; its index in *index. */
em_err em_program_state_declare(em_program *p, uint32_t layer, uint32_t conv_floats, uint32_t recurrent_floats,
                                uint32_t *index);
/* Appends an operation (copied). */
em_err em_program_append(em_program *p, const em_program_op *op);

/* NULL when every operation reads what an earlier one wrote, at the width it expects, from weights
 * of the right shape, the program begins with embed and ends with output; else an error naming the
 * first operation that breaks a rule, and the rule. */
em_err em_program_check(const em_program *p);

void em_program_free(em_program *p);

/* ---- Reading ---- */

const char *em_program_op_name(em_program_op_kind kind);
/* One line for operation i ("layer 3 matmul q = W[4096x4096 q4_k] xn"). */
void em_program_describe_op(const em_program *p, uint32_t i, char *buf, size_t size);
/* The widest attention group (query heads per key head) and the most experts any route chooses. */
uint32_t em_program_widest_group(const em_program *p);
/* KV floats per position over all caches. */
uint64_t em_program_kv_floats(const em_program *p);
/* Recurrent-state floats one sequence carries over all states (0: the step keeps nothing but KV),
 * and where state i starts among them. */
uint64_t em_program_state_floats(const em_program *p);
uint64_t em_program_state_offset(const em_program *p, uint32_t state);

/* ---- Blocks: the runs of operations a backend rewrites into fused kernels ---- */

typedef enum em_block_kind {
    EM_BLOCK_ATTENTION,  /* x += [post_norm](W_o attention(rope(head_norm(W_q, W_k, W_v norm(x))))) */
    EM_BLOCK_GATED_UNIT, /* x += [post_norm](down(act(gate norm(x)) · up norm(x))) */
    EM_BLOCK_EXPERTS,    /* x += [post_norm](the chosen experts of norm(x) [+ a shared gated unit]); a shared
                          * unit scaled by its own sigmoid gate is no block (the GPU kernels lack it) */
} em_block_kind;

/* One block: pointers to the parameters of the operations it covers (inside the program). */
typedef struct em_block {
    em_block_kind kind;
    uint32_t layer, first_op, n_ops;
    const em_program_norm *norm;       /* the input norm: xn = norm(x) */
    const em_program_norm *post_norm;  /* of the result before the residual add, or NULL */
    /* attention */
    const em_program_matmul *q, *k, *v, *o;
    const em_program_norm *q_norm, *k_norm; /* per head, or NULL */
    const em_rope *rope;               /* of q and k alike, or NULL */
    const em_program_attention *attention;
    uint32_t cache;
    /* the gated unit, or the experts block's shared one (gate NULL: none) */
    const em_program_matmul *gate, *up, *down;
    em_activation act;                 /* of the gated unit and the experts */
    /* experts */
    const em_program_matmul *router;
    const em_program_route *route;
    const em_program_experts *experts;
} em_block;

/* The program as blocks: every layer an attention block, then a gated-unit or experts block, with
 * the data flow between their operations checked (each reads what the one before it wrote). NULL,
 * with *blocks (the caller frees it) and their number; or an error naming the layer and the first
 * operation no block takes. A backend that runs blocks refuses a program this refuses. */
em_err em_program_blocks(const em_program *p, em_block **blocks, uint32_t *n_blocks);

#endif
