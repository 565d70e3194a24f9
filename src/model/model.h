/*
 * model — what a transformer is, as data: the description of every layer (em_model_desc), the
 * weights that go with it (em_model_weights), the family loaders that fill both from a GGUF file,
 * and synthetic models at real shapes. Sampling belongs to the engine (src/engine).
 *
 * A family (llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, flint) is nothing but a loader: it maps
 * the GGUF metadata keys and tensor names that llama.cpp's converter writes (and `flint.*` keys in
 * the same style) onto em_model_desc. Backends implement one forward pass for any description;
 * no backend knows family names.
 *
 * Conventions of GGUF that the description keeps:
 *  - matrices are stored row-major with ne[0] = input features, ne[1] = output features, so one
 *    output feature is one contiguous row (a dot product with the activation);
 *  - expert tensors stack n_expert such matrices along ne[2];
 *  - llama.cpp's converter permutes Q and K rows for the `llama` architecture, so GGUF llama uses
 *    the "normal" RoPE that rotates adjacent pairs (x[2i], x[2i+1]); the other families rotate
 *    (x[i], x[i + n_rot/2]) ("NeoX" style);
 *  - Gemma's RMSNorm multiplies by (1 + w); the converter already adds the 1 into the stored
 *    weight, so GGUF Gemma norms are plain RMSNorm. EM_NORM_RMS_PLUS_ONE exists for weights that
 *    were not shifted (Hugging Face tensors).
 *
 * Ownership: an em_model owns its description, the small f32 vectors it converts at load time
 * (norm weights, biases, RoPE frequency factors) and, when opened by path, the em_gguf. Matrix
 * weights are pointers into the GGUF mapping, in their stored format; they live as long as the
 * em_model. em_model_from_gguf borrows the em_gguf, which must outlive the model. A model opened by
 * path may span the parts of a split set (gguf.h): its weights then point into several mappings.
 *
 * Depends on base, gguf and quant.
 */
#ifndef EMBER_MODEL_H
#define EMBER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "../gguf/gguf.h"

#define EM_MODEL_ARCH_MAX 32

typedef enum em_attn_kind { EM_ATTN_FULL, EM_ATTN_SLIDING } em_attn_kind;
typedef enum em_rope_style { EM_ROPE_NORMAL, EM_ROPE_NEOX } em_rope_style;
typedef enum em_rope_scaling {
    EM_ROPE_SCALING_NONE,
    EM_ROPE_SCALING_LINEAR, /* positions divided by factor */
    EM_ROPE_SCALING_LLAMA3, /* per-frequency factors (GGUF stores them as rope_freqs.weight) */
    EM_ROPE_SCALING_YARN,   /* interpolation ramp between extrapolated and interpolated angles */
} em_rope_scaling;
typedef enum em_norm_kind { EM_NORM_RMS, EM_NORM_RMS_PLUS_ONE } em_norm_kind;
typedef enum em_activation { EM_ACT_SWIGLU, EM_ACT_GEGLU } em_activation;
typedef enum em_gating { EM_GATING_SOFTMAX, EM_GATING_SIGMOID } em_gating;

/* Rotary position embedding of one layer. */
typedef struct em_rope {
    em_rope_style style;
    float theta;        /* frequency base */
    uint32_t n_rot;     /* rotated dimensions per head (< head_dim: partial rotary) */
    em_rope_scaling scaling;
    float factor;       /* linear / yarn: context extension factor (1 = none) */
    uint32_t orig_ctx;  /* yarn: training context before extension */
    float yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    const float *freq_factors; /* n_rot/2 divisors of the frequencies, or NULL (owned by em_model) */
} em_rope;

/* One transformer block. */
typedef struct em_layer_desc {
    em_attn_kind attn;
    uint32_t window;      /* sliding: a query at p sees keys at p' with p - p' < window */
    uint32_t n_head, n_head_kv;
    uint32_t head_dim;    /* of queries and keys */
    uint32_t head_dim_v;  /* of values */
    bool qk_norm;         /* RMSNorm over each head of Q and K before RoPE */
    bool qkv_bias;
    bool post_attn_norm;  /* norm of the attention output before the residual add (Gemma 2/3) */
    bool post_ffn_norm;
    em_rope rope;
    float attn_scale;     /* multiplies Q·K (usually 1/sqrt(head_dim)) */
    float attn_softcap;   /* scores become c·tanh(s/c); 0 = none */

    bool moe;
    uint32_t n_ff;        /* dense FF width, or the FF width of one expert */
    uint32_t n_expert, n_expert_used;
    em_gating gating;
    bool renormalize;     /* the top-k weights are rescaled to sum to 1 */
    float expert_weights_scale; /* multiplies the routing weights (1 = none) */
    uint32_t n_ff_shared; /* FF width of the shared expert, 0 = none */
} em_layer_desc;

typedef struct em_model_desc {
    char arch[EM_MODEL_ARCH_MAX];
    uint32_t n_layer, n_embd, n_vocab, n_ctx_train;
    em_norm_kind norm;
    float norm_eps;
    em_activation act;
    float embd_scale;     /* token embeddings are multiplied by this (Gemma: sqrt(n_embd)) */
    float final_softcap;  /* logits become c·tanh(l/c); 0 = none */
    bool tied_output;     /* the output matrix is token_embd */
    em_layer_desc *layers;
} em_model_desc;

/* A matrix (or a stack of matrices) in its stored format, pointing into the GGUF mapping. */
typedef struct em_weight {
    const void *data;     /* NULL when absent */
    uint32_t type;
    uint64_t cols;        /* ne[0]: input features */
    uint64_t rows;        /* ne[1]: output features */
    uint64_t n_mat;       /* ne[2]: experts, 1 otherwise */
    uint64_t row_bytes;
} em_weight;

/* Per-layer weights. Vectors are f32, owned by the model; NULL when the layer has none. */
typedef struct em_layer_weights {
    const float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffn_norm;
    const float *bq, *bk, *bv;
    em_weight wq, wk, wv, wo;
    em_weight ffn_gate, ffn_up, ffn_down;            /* dense */
    em_weight gate_inp;                              /* router: rows = n_expert */
    em_weight gate_exps, up_exps, down_exps;         /* n_mat = n_expert */
    em_weight gate_shexp, up_shexp, down_shexp;      /* shared expert */
} em_layer_weights;

typedef struct em_model_weights {
    em_weight token_embd; /* rows = n_vocab */
    const float *output_norm;
    em_weight output;     /* == token_embd when tied */
    em_layer_weights *layers;
} em_model_weights;

typedef struct em_model {
    em_model_desc desc;
    em_model_weights w;
    em_gguf *gguf;        /* the file with the metadata (a split set's first part) */
    em_gguf **parts;      /* every file the weights point into, gguf first; owned when opened by path */
    uint32_t n_parts;     /* 0 when the caller owns the file (em_model_from_gguf) */
    float **owned;        /* f32 vectors converted at load */
    size_t n_owned, cap_owned;
} em_model;

/* Opens a GGUF file and loads the model it holds; the first part of a split set
 * (NAME-00001-of-0000N.gguf) opens the whole set, which loads as one model. */
em_err em_model_load(const char *path, em_model **out);

/* The dimension whose inverse square root scales attention scores: head_dim, except for the 27B
 * Gemma 2 and Gemma 3 models, which scale by 1/sqrt(n_embd / n_head) (their config's
 * query_pre_attn_scalar). GGUF files carry no key for it; like llama.cpp, the loader recognizes
 * those models by their layer count (46 for gemma2, 62 for gemma3). */
uint32_t em_model_attn_scale_dim(const char *arch, uint32_t n_layer, uint32_t n_embd, uint32_t n_head,
                                 uint32_t head_dim);

/* Loads from an open file that the caller keeps open until em_model_free. */
em_err em_model_from_gguf(em_gguf *gguf, em_model **out);

void em_model_free(em_model *model);

/* True when `arch` (general.architecture) has a loader. */
bool em_model_arch_supported(const char *arch);

/* Describes a layer in one line ("full attn 4/2 heads x 32, neox rope 1e+06, moe 8/2 x 64"). */
void em_model_describe_layer(const em_model_desc *desc, uint32_t layer, char *buf, size_t size);

/* ---- Synthetic models (synth.c) ---- */

typedef struct em_synth_options {
    const char *preset;   /* see em_synth_preset_names */
    const char *type;     /* f32, f16, bf16, q8_0, q4_k, mix */
    uint32_t layers;      /* 0 = the preset's */
    uint32_t experts;     /* 0 = the preset's */
    uint64_t seed;
    const char *vocab_path; /* GGUF whose tokenizer.* metadata is copied (llama-spm vocabulary) */
    /* NULL = the preset's; "none", "linear:F", "yarn:F:ORIG_CTX" or "llama3:F:ORIG_CTX" (written as
     * llama.cpp's converter does: rope.scaling.* keys, or a rope_freqs.weight tensor for llama3) */
    const char *rope_scaling;
} em_synth_options;

/* NULL-terminated list of preset names. */
const char *const *em_synth_preset_names(void);

/* Writes a GGUF file with deterministic random weights. */
em_err em_synth_write(const em_synth_options *options, const char *out_path);

#endif
