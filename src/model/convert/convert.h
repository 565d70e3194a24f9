/*
 * convert — Hugging Face checkpoints (config.json, *.safetensors, tokenizer.json,
 * tokenizer_config.json) into GGUF files that the family loaders of model.h read.
 *
 * Three layers, each usable alone:
 *  - safetensors: maps one .safetensors file and validates all of it before use (header length,
 *    JSON, every tensor's dtype, shape, and data offsets inside the file, sizes equal to
 *    shape x dtype, no two tensors overlapping). Data is read straight from the mapping, element
 *    ranges converted to f32, so a checkpoint is never held in memory as a whole.
 *  - config: config.json as transformers 4.x writes it (rope_theta, rope_scaling, num_experts,
 *    sliding_window_pattern, rope_local_base_freq) or as 5.x writes it (rope_parameters, per layer
 *    type rope, layer_types, num_local_experts), normalised into em_hf_config.
 *  - conversion: maps each supported architecture onto the metadata keys and tensor names that
 *    llama.cpp's converter writes (LlamaForCausalLM, MistralForCausalLM and MixtralForCausalLM as
 *    `llama`, with Q and K rows permuted for the interleaved-pair RoPE of GGUF llama;
 *    Qwen2/Qwen3/Qwen3Moe; Gemma2/Gemma3 text, with 1 added to every RMSNorm weight because GGUF
 *    Gemma stores (1 + w); Qwen3.5's text model, whose Gated DeltaNet layers hybrid.c maps, value
 *    heads reordered as GGUF qwen35 keeps them), stacks experts into ffn_*_exps, writes
 *    rope_freqs.weight for llama3 rope scaling, and streams tensors one at a time through
 *    em_gguf_writer_write_streaming (stream.c).
 *    A Gemma 3 layer pattern other than five sliding layers then one global is written as
 *    {arch}.attention.sliding_window_pattern (llama.cpp's key: a period, or a bool per layer).
 *    Tokenizer metadata comes from the tokenizer module's tokenizer.json converter (BPE models:
 *    byte-level, or with byte fallback), its token list padded to the embedding's rows with unused
 *    [PADi] tokens; the chat template from tokenizer_config.json (or chat_template.jinja).
 *
 * What it does not own: the meaning of the GGUF keys (model.h's loaders), tokenization itself
 * (tokenizer), block formats (quant).
 *
 * Ownership: an em_safetensors owns its mapping and index; tensor data pointers point into the
 * mapping. An em_hf_config owns its layer_types array (em_hf_config_free). Errors name the file and
 * the field or tensor.
 *
 * Tensor types come from the recipes of model/quantize (the same names and rules as `ember quantize`).
 *
 * Which classes convert, and to what, is the family registry's (model.h): each class's row gives
 * its GGUF architecture, traits and transformers' defaults for omitted fields.
 *
 * Depends on base, gguf, quant, model (the family registry), model/quantize (recipes), tokenizer
 * (em_tokenizer_hf_to_gguf) and jansson. It writes files the loader (model.h) reads; it does not
 * call it.
 */
#ifndef EMBER_CONVERT_H
#define EMBER_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../base/base.h"

/* ---- safetensors ---- */

#define EM_ST_MAX_DIMS 8
#define EM_ST_MAX_HEADER (100u << 20) /* the format's own limit on the JSON header */

typedef enum em_st_dtype {
    EM_ST_BOOL, EM_ST_U8, EM_ST_I8, EM_ST_I16, EM_ST_U16, EM_ST_F16, EM_ST_BF16, EM_ST_I32, EM_ST_U32,
    EM_ST_F32, EM_ST_F64, EM_ST_I64, EM_ST_U64, EM_ST_F8_E4M3, EM_ST_F8_E5M2,
} em_st_dtype;

typedef struct em_st_tensor {
    const char *name;     /* NUL-terminated, owned by the em_safetensors */
    em_st_dtype dtype;
    uint32_t n_dims;
    uint64_t shape[EM_ST_MAX_DIMS]; /* outermost first, as PyTorch writes it */
    uint64_t n_elems;
    uint64_t size;        /* bytes */
    uint64_t offset;      /* from the start of the file */
    const uint8_t *data;  /* into the mapping or the caller's buffer */
    bool mapped;          /* data is in a file mapping (em_safetensors_open) */
} em_st_tensor;

typedef struct em_safetensors em_safetensors;

/* Maps and validates a file. On error *out is NULL. */
em_err em_safetensors_open(const char *path, em_safetensors **out);

/* Validates a caller's buffer (not copied; it must outlive the result). `name` is used in messages. */
em_err em_safetensors_parse(const void *data, size_t size, const char *name, em_safetensors **out);

void em_safetensors_close(em_safetensors *st);

const char *em_safetensors_name(const em_safetensors *st);
size_t em_safetensors_count(const em_safetensors *st);
const em_st_tensor *em_safetensors_at(const em_safetensors *st, size_t index); /* sorted by offset */
const em_st_tensor *em_safetensors_find(const em_safetensors *st, const char *name); /* NULL if absent */

const char *em_st_dtype_name(em_st_dtype dtype); /* "F32", "BF16", ... */
size_t em_st_dtype_size(em_st_dtype dtype);

/* Tells the kernel that a mapped tensor's pages are no longer needed, so converting a checkpoint
 * keeps about one tensor resident rather than every page read so far. The data stays readable
 * (pages are read again from the file if touched). No-op for caller buffers. */
void em_st_release(const em_st_tensor *t);

/* Converts elements [first, first + count) of a float tensor (F32, F16, BF16, F64) to f32. */
em_err em_st_read_f32(const em_st_tensor *t, uint64_t first, uint64_t count, float *out);

/* ---- config.json ---- */

#define EM_HF_ARCH_MAX 64

typedef enum em_hf_rope_type {
    EM_HF_ROPE_DEFAULT, EM_HF_ROPE_LINEAR, EM_HF_ROPE_LLAMA3, EM_HF_ROPE_YARN,
} em_hf_rope_type;

typedef struct em_hf_rope {
    double theta;
    em_hf_rope_type type;
    double factor;                 /* linear, llama3, yarn */
    double low_freq_factor, high_freq_factor; /* llama3 */
    uint32_t original_ctx;         /* llama3, yarn: original_max_position_embeddings (0 = absent) */
    double beta_fast, beta_slow;   /* yarn (0 = absent) */
    double attention_factor;       /* yarn (0 = absent) */
    bool untruncated;              /* yarn: truncate = false (gpt-oss): the correction range is not rounded */
} em_hf_rope;

typedef struct em_hf_config {
    char arch[EM_HF_ARCH_MAX];     /* architectures[0], e.g. "LlamaForCausalLM" */
    char model_type[EM_HF_ARCH_MAX];
    uint32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx;
    bool head_dim_given;           /* config.json names head_dim (it may differ from n_embd / n_head) */
    double norm_eps;
    char act[32];                  /* hidden_act / hidden_activation */
    bool tie_embeddings, tie_given;
    bool attention_bias, mlp_bias;

    em_hf_rope rope;               /* global / full-attention layers */
    em_hf_rope rope_local;         /* sliding layers, when the family has its own (Gemma 3) */
    bool rope_local_given;

    uint32_t sliding_window;       /* 0 = none */
    bool use_sliding_window_given, use_sliding_window; /* Qwen's switch */
    uint32_t sliding_window_pattern; /* 4.x Gemma 3 (0 = absent) */
    bool *layer_sliding;           /* [n_layer] from layer_types, or NULL when absent (owned) */

    uint32_t n_expert, n_expert_used, n_ff_expert; /* gpt-oss: n_ff_expert from intermediate_size */
    uint32_t n_ff_shared;          /* shared_expert_intermediate_size (Qwen3.5 MoE, Qwen3-Next); 0 = none */
    bool norm_topk_prob, norm_topk_given;
    uint32_t decoder_sparse_step;  /* Qwen3-MoE (1 = every layer) */
    bool has_mlp_only_layers;      /* Qwen3-MoE: a non-empty mlp_only_layers */

    double attn_softcap, final_softcap; /* 0 = none */
    double query_pre_attn_scalar;  /* 0 = absent */

    int64_t bos_id, eos_id, pad_id; /* -1 = absent */

    /* Hybrid models (Qwen3.5, Qwen3-Next): the Gated DeltaNet layers' shape (linear_conv_kernel_dim,
     * linear_{key,value}_head_dim, linear_num_{key,value}_heads; 0 = absent), which layers they are
     * (layer_types' "linear_attention", else all but every full_attention_interval-th), the rotated
     * share of a head (partial_rotary_factor, in rope_parameters or beside it) and the sections of
     * the multimodal RoPE (mrope_section), and the multi-token-prediction layers (mtp_num_hidden_layers) */
    uint32_t linear_conv_kernel, linear_key_head_dim, linear_value_head_dim, linear_key_heads, linear_value_heads;
    uint32_t full_attention_interval;
    bool *layer_linear;            /* [n_layer] from layer_types, or NULL when absent (owned) */
    double partial_rotary_factor;  /* 0 = absent */
    uint32_t mrope_section[3];
    bool mrope_given;
    uint32_t mtp_layers;
} em_hf_config;

/* Parses config.json text. `name` is used in messages. */
em_err em_hf_config_parse(const char *text, size_t len, const char *name, em_hf_config *out);
em_err em_hf_config_load(const char *path, em_hf_config *out);
void em_hf_config_free(em_hf_config *config);

/* ---- conversion ---- */

typedef struct em_convert_options {
    const char *type;       /* a recipe of `ember quantize` (model/quantize: "F16", "Q8_0", "Q4_K_M", ...); NULL = F16 */
    const char *name;       /* general.name; NULL = the directory's last component */
    bool no_tokenizer;      /* write no tokenizer.* metadata (checkpoints without tokenizer.json) */
} em_convert_options;

typedef struct em_convert_stats {
    char arch[32];          /* GGUF general.architecture */
    uint64_t n_tensors;
    uint64_t n_bytes;       /* of tensor data written */
} em_convert_stats;

/* Converts the checkpoint in `dir` into a GGUF file at `out_path`. `stats` may be NULL. */
em_err em_convert_hf(const char *dir, const char *out_path, const em_convert_options *options,
                     em_convert_stats *stats);

#endif
