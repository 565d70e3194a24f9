/*
 * model — what a transformer is, as data: the description of every layer (em_model_desc), the
 * weights that go with it (em_model_weights), the family loaders that fill both from a GGUF file,
 * and synthetic models at real shapes. Sampling belongs to the engine (src/engine).
 *
 * A family (llama, mistral, mixtral, qwen2, qwen3, qwen3moe, gemma2, gemma3, gemma4, gpt-oss, qwen35,
 * qwen35moe, flint) is a row of the family registry (em_family, family.c): what its checkpoints and GGUF files
 * look like, as separate traits (gated unit, post-norms, embedding scale, QK-norm, sliding-window
 * layout, experts, GGUF keys, ...). One loader reads every family's GGUF metadata keys and tensor names (those
 * llama.cpp's converter writes, and `flint.*` keys in the same style) onto em_model_desc, asking
 * the row where families differ; the converter, the synthetic models and `ember info` read the same
 * rows. Backends implement one forward pass for any description; no backend knows family names.
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
 * Depends on base, gguf, quant and program.
 */
#ifndef EMBER_MODEL_H
#define EMBER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "../gguf/gguf.h"
#include "../program/program.h"

#define EM_MODEL_ARCH_MAX 32

typedef enum em_attn_kind { EM_ATTN_FULL, EM_ATTN_SLIDING } em_attn_kind;
/* What mixes a layer's tokens: attention over the KV cache, or Gated DeltaNet's recurrence
 * (program.h's delta_net) over a state each sequence carries. */
typedef enum em_layer_mixer { EM_MIXER_ATTENTION, EM_MIXER_DELTA_NET } em_layer_mixer;
typedef enum em_norm_kind { EM_NORM_RMS, EM_NORM_RMS_PLUS_ONE } em_norm_kind;
/* em_weight, em_rope, em_activation and em_gating are the program's operands (program.h). */

/* A Gated DeltaNet layer's shape (GGUF ssm.* keys). */
typedef struct em_delta_net_desc {
    uint32_t conv_kernel;           /* ssm.conv_kernel */
    uint32_t n_head_k, head_dim_k;  /* ssm.group_count, ssm.state_size */
    uint32_t n_head_v, head_dim_v;  /* ssm.time_step_rank, ssm.inner_size / time_step_rank */
    bool v_tiled;                   /* value head j reads key head j mod n_head_k (else j / (n_head_v / n_head_k)) */
} em_delta_net_desc;

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
    bool attn_output_gate; /* attn_q gives [query | gate] per head; the attention is multiplied by σ(gate) */
    bool value_norm;      /* each head of V RMS-normalized, without a weight */
    bool values_from_keys; /* no V projection: V is the key projection's output before its norm and RoPE */
    uint32_t kv_layer;    /* the layer whose KV cache it attends over: itself, or an earlier layer of
                           * its kind whose cache it shares (writing none of its own) */
    em_layer_mixer mixer; /* the attention fields above describe EM_MIXER_ATTENTION layers only */
    em_delta_net_desc delta_net;

    bool moe;
    uint32_t n_ff;        /* dense FF width, or the FF width of one expert */
    uint32_t n_expert, n_expert_used;
    em_gating gating;
    bool renormalize;     /* the top-k weights are rescaled to sum to 1 */
    float expert_weights_scale; /* multiplies the routing weights (1 = none) */
    uint32_t n_ff_shared; /* FF width of the shared expert, 0 = none */
    /* FF width of a dense gated unit beside the experts, each on its own norms (Gemma 4), 0 = none:
     * x += post(post_1(unit(norm(x))) + post_2(experts(norm_2(x)))), routed on another norm of x */
    uint32_t n_ff_dense;
} em_layer_desc;

typedef struct em_model_desc {
    char arch[EM_MODEL_ARCH_MAX];
    uint32_t n_layer, n_embd, n_vocab, n_ctx_train;
    em_norm_kind norm;
    float norm_eps;
    em_activation act;
    float act_limit, act_alpha; /* EM_ACT_SWIGLU_CLAMPED: its clip and the sigmoid's slope */
    float embd_scale;     /* token embeddings are multiplied by this (Gemma: sqrt(n_embd)) */
    float final_softcap;  /* logits become c·tanh(l/c); 0 = none */
    bool tied_output;     /* the output matrix is token_embd */
    uint32_t n_embd_per_layer; /* per-layer inputs: floats each layer gets per token, 0 = none */
    em_layer_desc *layers;
} em_model_desc;

/* Per-layer weights. Vectors are f32, owned by the model; NULL when the layer has none. */
typedef struct em_layer_weights {
    const float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffn_norm;
    const float *bq, *bk, *bv, *bo;
    const float *attn_sinks;                         /* n_head logits, or NULL */
    em_weight wq, wk, wv, wo;
    em_weight ffn_gate, ffn_up, ffn_down;            /* dense */
    em_weight gate_inp;                              /* router: rows = n_expert */
    em_weight gate_exps, up_exps, down_exps;         /* n_mat = n_expert */
    const float *gate_inp_bias;                      /* n_expert floats, or NULL */
    const float *gate_exps_bias, *up_exps_bias, *down_exps_bias; /* n_expert rows, or NULL */
    em_weight gate_shexp, up_shexp, down_shexp;      /* shared expert */
    em_weight gate_inp_shexp;                        /* its gate: σ(w_sᵀx) scales it (1 row), or absent */
    /* Gated DeltaNet: the mixed q|k|v, z, beta and alpha projections, the output projection; the
     * conv weights (conv_dim rows of conv_kernel), dt_bias and a = −exp(A_log) per value head, and the
     * output norm over head_dim_v */
    em_weight ssm_qkv, ssm_gate, ssm_beta, ssm_alpha, ssm_out;
    const float *ssm_conv, *ssm_dt_bias, *ssm_a, *ssm_norm;
    /* Experts beside a dense unit: the router's input norm (its scale, divided by sqrt(n_embd) at
     * load), each expert's factor, the experts' input norm and the two outputs' norms */
    const float *router_norm, *expert_scale, *pre_ffn_norm_2, *post_ffn_norm_1, *post_ffn_norm_2;
    /* Per-layer inputs: gate (n_embd -> n_embd_per_layer), projection back, its norm */
    em_weight per_layer_gate, per_layer_proj;
    const float *per_layer_post_norm;
    const float *output_scale;                       /* one factor on the layer's output, or NULL */
} em_layer_weights;

typedef struct em_model_weights {
    em_weight token_embd; /* rows = n_vocab */
    /* per-layer inputs: a second table (n_layer · n_embd_per_layer a token), the projection of the
     * embeddings to the same width and its norm over each layer's slice */
    em_weight per_layer_embd, per_layer_proj;
    const float *per_layer_proj_norm;
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
    em_program program;   /* the forward step every backend runs (builder.c), checked at load */
} em_model;

/* ---- The family registry (family.c) ---- */

/* Where a family's sliding-window layers are. */
typedef enum em_family_window {
    EM_WINDOW_NONE,        /* every layer sees the whole context */
    EM_WINDOW_EVERY_LAYER, /* every layer slides when the file names a window (Mistral) */
    EM_WINDOW_PATTERN,     /* layers il with il % period < period - 1 slide, the others are global (Gemma) */
} em_family_window;

/* Where a family's experts are, and how a Hugging Face checkpoint names them. */
typedef enum em_family_moe {
    EM_MOE_NONE,          /* dense (a GGUF file with expert_count still loads as MoE) */
    EM_MOE_MIXTRAL,       /* every layer; block_sparse_moe.experts.E.w1/w3/w2 and block_sparse_moe.gate */
    EM_MOE_QWEN,          /* every layer; mlp.experts.E.{gate,up,down}_proj and mlp.gate */
    EM_MOE_LEADING_DENSE, /* after leading_dense_block_count dense layers (flint; no checkpoint class) */
    EM_MOE_GPT_OSS,       /* every layer; mlp.router and mlp.experts.{gate_up,down}_proj with biases, gate
                           * and up interleaved in one matrix, in bf16 or MXFP4 (_blocks, _scales) */
    EM_MOE_BESIDE_DENSE,  /* every layer, beside a dense gated unit (em_layer_desc.n_ff_dense); the GGUF
                           * may hold gate and up in one stack (ffn_gate_up_exps) */
} em_family_moe;

/* Hybrid families: which layers are Gated DeltaNet, and the order of their value heads in GGUF files. */
typedef enum em_family_hybrid {
    EM_HYBRID_NONE,
    /* layer i is DeltaNet unless (i + 1) % full_attention_interval == 0; the value heads are tiled
     * (llama.cpp's converter reorders qwen35 / qwen35moe files so) or grouped by key head (qwen3next) */
    EM_HYBRID_DELTA_NET_TILED,
    EM_HYBRID_DELTA_NET_GROUPED,
} em_family_hybrid;

/* GGUF keys ({arch}.*) that some families' files carry and others do not. */
typedef struct em_family_keys {
    bool vocab_and_rope_dims;   /* vocab_size and rope.dimension_count (llama.cpp writes them for llama) */
    bool expert_width;          /* expert_feed_forward_length; without it the expert width is
                                 * feed_forward_length (Mixtral) */
    bool expert_weights_norm;   /* whether the top-k routing weights are renormalized */
    bool dense_lead_and_gating; /* leading_dense_block_count and expert_gating_func */
} em_family_keys;

/* What transformers' configuration class assumes for config.json fields a checkpoint leaves out
 * (4.x saves nested configs as differences from them; hand-written configs omit more). Only fields
 * whose default changes the model; 0 = none. */
typedef struct em_family_hf_defaults {
    double rope_theta, attn_softcap, final_softcap, query_pre_attn_scalar;
    uint32_t sliding_window, n_head, n_head_kv, head_dim, sliding_window_pattern;
    uint32_t n_expert, n_expert_used, n_ff_expert, n_vocab;
    double partial_rotary_factor; /* the share of each head RoPE rotates */
} em_family_hf_defaults;

#define EM_FAMILY_HF_CLASSES 3

/* One family: a row of the registry. A new family is a new row (plus a synthetic preset). */
typedef struct em_family {
    const char *name;          /* "llama", "mistral", "mixtral", "qwen2", ... */
    const char *gguf_arch;     /* general.architecture of its GGUF files */
    const char *hf_classes[EM_FAMILY_HF_CLASSES]; /* config.json architectures[0] names; NULL-ended */

    em_activation act;         /* gated unit: SwiGLU (silu) or GeGLU (tanh GELU) */
    bool post_norms;           /* a norm on the attention and FF outputs before each residual add */
    bool embd_scale_sqrt;      /* token embeddings are multiplied by sqrt(n_embd) */
    bool tied_output;          /* the output matrix is always token_embd (checkpoints keep no lm_head) */
    bool norm_plus_one;        /* checkpoints store RMSNorm weights w of (1 + w); GGUF stores 1 + w */
    bool softcaps;             /* attention and final logits are soft-capped (c·tanh(x/c)) */
    bool qk_norm;              /* RMSNorm over each head of Q and K */
    bool qkv_bias;             /* Q, K and V always have biases (other families: when the file has them) */
    em_rope_style rope;        /* how GGUF Q and K rotate */
    bool permute_qk;           /* the converter permutes Q/K rows: checkpoints rotate halves, GGUF pairs */
    float local_rope_theta;    /* sliding layers' own RoPE base, unscaled (Gemma 3); 0 = the global one */
    em_family_window window;
    uint32_t window_period;    /* EM_WINDOW_PATTERN: the period when the file does not say */
    bool window_pattern_key;   /* attention.sliding_window_pattern may give another layout (Gemma 3):
                                * the converter writes it; without it, other layouts are refused */
    uint32_t attn_scale_embd_layers; /* models of this many layers scale attention by
                                      * 1/sqrt(n_embd / n_head), not 1/sqrt(head_dim) (27B Gemmas) */
    em_family_moe moe;
    em_gating gating;          /* the router's, where the file has no expert_gating_func */
    float act_limit, act_alpha; /* EM_ACT_SWIGLU_CLAMPED: its clip and slope (not in GGUF files) */
    bool attn_out_bias;        /* the attention's output projection has a bias (attn_output.bias) */
    bool attn_sinks;           /* one learned logit per query head in every softmax (attn_sinks.weight) */
    bool expert_biases;        /* the router and every expert's gate, up and down have biases */
    const char *ffn_norm_tensor; /* the pre-FFN norm's GGUF name ("post_attention_norm"); NULL: ffn_norm */
    em_family_keys keys;
    em_family_hf_defaults hf;
    em_family_hybrid hybrid;
    bool attn_output_gate;     /* attn_q gives [query | gate] per head (Qwen3.5's gated attention) */
    /* Layers of two kinds with their own shapes (Gemma 4): sliding layers read key_length_swa,
     * value_length_swa, rope.dimension_count_swa and rope.freq_base_swa, full layers the plain keys
     * and the rope_freqs tensor (proportional RoPE); head_count_kv and feed_forward_length per layer */
    bool swa_keys;
    bool value_norm;           /* V RMS-normalized per head without a weight */
    bool unit_attn_scale;      /* attention scores are q·k unscaled (QK-norm sets their size) */
    bool values_from_keys;     /* a layer without attn_v takes V from the key projection (K = V) */
    bool shared_kv;            /* attention.shared_kv_layers: the last layers attend over the cache of
                                * the last earlier layer of their kind */
    bool per_layer_inputs;     /* embedding_length_per_layer_input and the per_layer_* tensors */
    bool layer_output_scale;   /* blk.N.layer_output_scale: one factor on each layer's output */
    /* the final soft-cap of a file without final_logit_softcapping (Gemma 4: 30, which llama.cpp and
     * transformers both assume); 0 = none */
    float default_final_softcap;
    bool shared_expert_gate;   /* the shared expert is scaled by σ(w_sᵀx) (ffn_gate_inp_shexp) */
} em_family;

/* The rows in order, NULL past the end. */
const em_family *em_family_at(size_t index);
/* Lookups; NULL when no row matches. By GGUF architecture: the first row of it (the one the loader
 * reads; rows sharing an architecture agree on everything a GGUF file shows). */
const em_family *em_family_by_name(const char *name);
const em_family *em_family_by_gguf_arch(const char *arch);
const em_family *em_family_by_hf_class(const char *hf_class);

/* True when `arch` (general.architecture) has a row. */
bool em_model_arch_supported(const char *arch);

/* The supported GGUF architectures ("llama, qwen2, ...") or Hugging Face classes, for messages. */
void em_family_list_gguf_archs(char *buf, size_t size);
void em_family_list_hf_classes(char *buf, size_t size);

/* config.json's hidden_act for the family's gated unit ("silu", "gelu_pytorch_tanh"). */
const char *em_family_hf_activation(const em_family *family);

/* The family's own GGUF key suffixes (those of em_family_keys, soft-caps, sliding windows): up to
 * `max` into `keys`; returns how many. */
size_t em_family_own_keys(const em_family *family, const char **keys, size_t max);

/* The family's traits in one line ("GeGLU, neox rope, post-norms, ..."). */
void em_family_describe(const em_family *family, char *buf, size_t size);

/* The dimension whose inverse square root scales attention scores: head_dim, except for the 27B
 * Gemma 2 and Gemma 3 models, which scale by 1/sqrt(n_embd / n_head) (their config's
 * query_pre_attn_scalar). GGUF files carry no key for it; like llama.cpp, the loader recognizes
 * those models by their layer count (the row's attn_scale_embd_layers: 46 for gemma2, 62 for gemma3). */
uint32_t em_model_attn_scale_dim(const char *arch, uint32_t n_layer, uint32_t n_embd, uint32_t n_head,
                                 uint32_t head_dim);

/* Opens a GGUF file and loads the model it holds; the first part of a split set
 * (NAME-00001-of-0000N.gguf) opens the whole set, which loads as one model. */
em_err em_model_load(const char *path, em_model **out);

/* The same, the files' bytes where `memory` says (mapped, or read into private memory). */
em_err em_model_load_as(const char *path, em_gguf_memory memory, em_model **out);

/* Loads from an open file that the caller keeps open until em_model_free. */
em_err em_model_from_gguf(em_gguf *gguf, em_model **out);

void em_model_free(em_model *model);

/* The forward step of a loaded model as a layer program (builder.c), checked; em_model_load builds it
 * into model->program. The program points into the model's weights and description. */
em_err em_model_build_program(const em_model *model, em_program *out);

/* Describes a layer in one line ("full attn 4/2 heads x 32, neox rope 1e+06, moe 8/2 x 64"). */
void em_model_describe_layer(const em_model_desc *desc, uint32_t layer, char *buf, size_t size);

/* ---- Synthetic models (synth.c) ---- */

typedef struct em_synth_options {
    const char *preset;   /* see em_synth_preset_name */
    const char *type;     /* f32, f16, bf16, q8_0, q4_k, mix, mxfp4 (q8_0 with MXFP4 experts) */
    uint32_t layers;      /* 0 = the preset's */
    uint32_t experts;     /* 0 = the preset's */
    uint64_t seed;
    const char *vocab_path; /* GGUF whose tokenizer.* metadata is copied (llama-spm vocabulary) */
    /* NULL = the preset's; "none", "linear:F", "yarn:F:ORIG_CTX" or "llama3:F:ORIG_CTX" (written as
     * llama.cpp's converter does: rope.scaling.* keys, or a rope_freqs.weight tensor for llama3) */
    const char *rope_scaling;
    /* <arch>.pooling_type to write (GGUF's numbering: 1 mean, 2 cls, 3 last; embedding models);
     * 0 = none */
    uint32_t pooling;
} em_synth_options;

/* The presets' names in order, NULL past the end. */
const char *em_synth_preset_name(size_t index);

/* Writes a GGUF file with deterministic random weights. */
em_err em_synth_write(const em_synth_options *options, const char *out_path);

#endif
