/* The family registry (model.h): one row per model family, read by the loader, the converter, the
 * synthetic models and `ember info`. A row says what the family's checkpoints and GGUF files look
 * like; the code that reads them asks the row, never the family's name.
 *
 * Rows that share a GGUF architecture (llama, mistral and mixtral are all GGUF `llama`) differ only
 * in what a Hugging Face checkpoint looks like; the loader reads the first of them, so they agree
 * on everything a GGUF file can show (tests/test_model.c checks it). */
#include <stdio.h>
#include <string.h>

#include "model.h"

/* What every row written as GGUF `llama` shares: a GGUF file cannot tell them apart. */
#define GGUF_LLAMA                                                                                          \
    .gguf_arch = "llama", .act = EM_ACT_SWIGLU, .rope = EM_ROPE_NORMAL, .permute_qk = true,                 \
    .window = EM_WINDOW_EVERY_LAYER, .keys = {.vocab_and_rope_dims = true}

static const em_family families[] = {
    {
        .name = "llama",
        .hf_classes = {"LlamaForCausalLM"},
        GGUF_LLAMA,
        .hf = {.rope_theta = 1e4},
    },
    {
        .name = "mistral",
        .hf_classes = {"MistralForCausalLM"},
        GGUF_LLAMA,
        .hf = {.rope_theta = 1e4, .sliding_window = 4096},
    },
    {
        .name = "mixtral",
        .hf_classes = {"MixtralForCausalLM"},
        GGUF_LLAMA,
        .moe = EM_MOE_MIXTRAL,
        .hf = {.rope_theta = 1e6, .n_expert = 8, .n_expert_used = 2},
    },
    {
        .name = "qwen2",
        .gguf_arch = "qwen2",
        .hf_classes = {"Qwen2ForCausalLM"},
        .act = EM_ACT_SWIGLU,
        .qkv_bias = true,
        .rope = EM_ROPE_NEOX,
        .hf = {.rope_theta = 1e4},
    },
    {
        .name = "qwen3",
        .gguf_arch = "qwen3",
        .hf_classes = {"Qwen3ForCausalLM"},
        .act = EM_ACT_SWIGLU,
        .qk_norm = true,
        .rope = EM_ROPE_NEOX,
        .hf = {.rope_theta = 1e4},
    },
    {
        .name = "qwen3moe",
        .gguf_arch = "qwen3moe",
        .hf_classes = {"Qwen3MoeForCausalLM"},
        .act = EM_ACT_SWIGLU,
        .qk_norm = true,
        .rope = EM_ROPE_NEOX,
        .moe = EM_MOE_QWEN,
        .keys = {.expert_width = true, .expert_weights_norm = true},
        .hf = {.rope_theta = 1e4, .n_expert = 128, .n_expert_used = 8, .n_ff_expert = 768},
    },
    {
        .name = "gemma2",
        .gguf_arch = "gemma2",
        .hf_classes = {"Gemma2ForCausalLM"},
        .act = EM_ACT_GEGLU,
        .post_norms = true,
        .embd_scale_sqrt = true,
        .tied_output = true,
        .norm_plus_one = true,
        .softcaps = true,
        .rope = EM_ROPE_NEOX,
        .window = EM_WINDOW_PATTERN,
        .window_period = 2,
        .attn_scale_embd_layers = 46,
        .hf = {.rope_theta = 1e4, .attn_softcap = 50, .final_softcap = 30, .query_pre_attn_scalar = 256,
               .sliding_window = 4096, .n_head = 8, .n_head_kv = 4, .head_dim = 256, .n_vocab = 256000},
    },
    {
        .name = "gemma3",
        .gguf_arch = "gemma3",
        /* Gemma3ForConditionalGeneration: the text half of the multimodal Gemma 3 (4B and up); the
         * vision tower is left out */
        .hf_classes = {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"},
        .act = EM_ACT_GEGLU,
        .post_norms = true,
        .embd_scale_sqrt = true,
        .tied_output = true,
        .norm_plus_one = true,
        .qk_norm = true,
        .rope = EM_ROPE_NEOX,
        .local_rope_theta = 10000.0f,
        .window = EM_WINDOW_PATTERN,
        .window_period = 6,
        .window_pattern_key = true,
        .attn_scale_embd_layers = 62,
        .hf = {.rope_theta = 1e6, .query_pre_attn_scalar = 256, .sliding_window = 4096, .n_head = 8,
               .n_head_kv = 4, .head_dim = 256, .sliding_window_pattern = 6, .n_vocab = 262208},
    },
    {
        /* Gemma 4 (the multimodal class's text part): plain norms, attention of scale 1 over QK-norm
         * and a normalized V, sliding and full layers of their own shapes (the full ones with
         * proportional RoPE and, in the MoE model, K = V), the last layers sharing KV, per-layer
         * inputs in the small models, experts beside a dense unit in the MoE one */
        .name = "gemma4",
        .gguf_arch = "gemma4",
        .hf_classes = {"Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"},
        .act = EM_ACT_GEGLU,
        .post_norms = true,
        .embd_scale_sqrt = true,
        .qk_norm = true,
        .rope = EM_ROPE_NEOX,
        .window = EM_WINDOW_PATTERN,
        .window_period = 6,
        .window_pattern_key = true,
        .moe = EM_MOE_BESIDE_DENSE,
        .keys = {.expert_width = true},
        .swa_keys = true,
        .value_norm = true,
        .unit_attn_scale = true,
        .values_from_keys = true,
        .shared_kv = true,
        .per_layer_inputs = true,
        .layer_output_scale = true,
        .default_final_softcap = 30.0f,
        .hf = {.rope_theta = 1e6, .final_softcap = 30, .sliding_window = 512, .head_dim = 256, .sliding_window_pattern = 6,
               .n_vocab = 262144},
    },
    {
        /* llama.cpp names the pre-FFN norm post_attention_norm, after the checkpoint's
         * post_attention_layernorm; the router takes the top k logits, then a softmax over them */
        .name = "gpt-oss",
        .gguf_arch = "gpt-oss",
        .hf_classes = {"GptOssForCausalLM"},
        .act = EM_ACT_SWIGLU_CLAMPED,
        .act_limit = 7.0f,
        .act_alpha = 1.702f,
        .qkv_bias = true,
        .attn_out_bias = true,
        .attn_sinks = true,
        .rope = EM_ROPE_NEOX,
        .window = EM_WINDOW_PATTERN,
        .window_period = 2,
        .moe = EM_MOE_GPT_OSS,
        .gating = EM_GATING_SOFTMAX_CHOSEN,
        .expert_biases = true,
        .ffn_norm_tensor = "post_attention_norm",
        .keys = {.expert_width = true},
        .hf = {.rope_theta = 150000, .sliding_window = 128, .n_head = 64, .n_head_kv = 8, .head_dim = 64,
               .n_expert = 128, .n_expert_used = 4, .n_vocab = 201088},
    },
    {
        /* Qwen3.5 / Qwen3.6 dense: three Gated DeltaNet layers to one gated attention layer (the
         * multimodal class's text part; its vision tower is left out) */
        .name = "qwen35",
        .gguf_arch = "qwen35",
        .hf_classes = {"Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"},
        .act = EM_ACT_SWIGLU,
        .norm_plus_one = true,
        .qk_norm = true,
        .rope = EM_ROPE_NEOX,
        .hybrid = EM_HYBRID_DELTA_NET_TILED,
        .attn_output_gate = true,
        .ffn_norm_tensor = "post_attention_norm",
        .hf = {.rope_theta = 1e7, .partial_rotary_factor = 0.25},
    },
    {
        /* Qwen3.5 / Qwen3.6 MoE (Qwen3.6-35B-A3B): qwen35's layers with routed experts (softmax, top k
         * renormalized) and a shared expert scaled by its own sigmoid gate */
        .name = "qwen35moe",
        .gguf_arch = "qwen35moe", /* GGUF only for now: `ember convert` does not yet write its shared expert */
        .act = EM_ACT_SWIGLU,
        .norm_plus_one = true,
        .qk_norm = true,
        .rope = EM_ROPE_NEOX,
        .hybrid = EM_HYBRID_DELTA_NET_TILED,
        .attn_output_gate = true,
        .moe = EM_MOE_QWEN,
        .shared_expert_gate = true,
        .ffn_norm_tensor = "post_attention_norm",
        .keys = {.expert_width = true},
        .hf = {.rope_theta = 1e7, .partial_rotary_factor = 0.25},
    },
    {
        /* Ember's own MoE family, GGUF only: its keys follow deepseek2's style */
        .name = "flint",
        .gguf_arch = "flint",
        .act = EM_ACT_SWIGLU,
        .qk_norm = true,
        .rope = EM_ROPE_NEOX,
        .moe = EM_MOE_LEADING_DENSE,
        .keys = {.expert_width = true, .expert_weights_norm = true, .dense_lead_and_gating = true},
    },
};

enum { N_FAMILIES = sizeof families / sizeof families[0] };

const em_family *em_family_at(size_t index) { return index < N_FAMILIES ? &families[index] : NULL; }

const em_family *em_family_by_name(const char *name) {
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (!strcmp(families[i].name, name)) return &families[i];
    return NULL;
}

const em_family *em_family_by_gguf_arch(const char *arch) {
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (!strcmp(families[i].gguf_arch, arch)) return &families[i];
    return NULL;
}

const em_family *em_family_by_hf_class(const char *hf_class) {
    for (size_t i = 0; i < N_FAMILIES; i++)
        for (size_t k = 0; k < EM_FAMILY_HF_CLASSES && families[i].hf_classes[k]; k++)
            if (!strcmp(families[i].hf_classes[k], hf_class)) return &families[i];
    return NULL;
}

bool em_model_arch_supported(const char *arch) { return em_family_by_gguf_arch(arch) != NULL; }

/* Appends ", text" (or "text" first) when it fits. */
static void append(char *buf, size_t size, const char *text) {
    size_t used = strlen(buf);
    if (used < size) snprintf(buf + used, size - used, "%s%s", used ? ", " : "", text);
}

void em_family_list_gguf_archs(char *buf, size_t size) {
    if (size) buf[0] = 0;
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (em_family_by_gguf_arch(families[i].gguf_arch) == &families[i]) append(buf, size, families[i].gguf_arch);
}

void em_family_list_hf_classes(char *buf, size_t size) {
    if (size) buf[0] = 0;
    for (size_t i = 0; i < N_FAMILIES; i++)
        for (size_t k = 0; k < EM_FAMILY_HF_CLASSES && families[i].hf_classes[k]; k++)
            append(buf, size, families[i].hf_classes[k]);
}

const char *em_family_hf_activation(const em_family *f) {
    return f->act == EM_ACT_GEGLU ? "gelu_pytorch_tanh" : "silu";
}

uint32_t em_model_attn_scale_dim(const char *arch, uint32_t n_layer, uint32_t n_embd, uint32_t n_head,
                                 uint32_t head_dim) {
    const em_family *f = em_family_by_gguf_arch(arch);
    const bool by_width = f && f->attn_scale_embd_layers && f->attn_scale_embd_layers == n_layer;
    return by_width && n_head ? n_embd / n_head : head_dim;
}

size_t em_family_own_keys(const em_family *f, const char **keys, size_t max) {
    const char *all[32];
    size_t n = 0;
    if (f->keys.vocab_and_rope_dims) {
        all[n++] = "vocab_size";
        all[n++] = "rope.dimension_count";
    }
    if (f->keys.expert_width) all[n++] = "expert_feed_forward_length";
    if (f->keys.expert_weights_norm) all[n++] = "expert_weights_norm";
    if (f->keys.dense_lead_and_gating) {
        all[n++] = "leading_dense_block_count";
        all[n++] = "expert_gating_func";
    }
    if (f->softcaps) {
        all[n++] = "attn_logit_softcapping";
        all[n++] = "final_logit_softcapping";
    }
    if (f->window != EM_WINDOW_NONE) all[n++] = "attention.sliding_window";
    if (f->window_pattern_key) all[n++] = "attention.sliding_window_pattern";
    if (f->swa_keys) {
        static const char *const swa[] = {"attention.key_length_swa", "attention.value_length_swa",
                                          "rope.dimension_count_swa", "rope.freq_base_swa"};
        for (size_t i = 0; i < sizeof swa / sizeof swa[0]; i++) all[n++] = swa[i];
    }
    if (f->shared_kv) all[n++] = "attention.shared_kv_layers";
    if (f->per_layer_inputs) all[n++] = "embedding_length_per_layer_input";
    if (f->hybrid != EM_HYBRID_NONE) {
        static const char *const ssm[] = {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank",
                                          "ssm.inner_size", "full_attention_interval", "nextn_predict_layers"};
        if (f->shared_expert_gate) all[n++] = "expert_shared_feed_forward_length";
        for (size_t i = 0; i < sizeof ssm / sizeof ssm[0]; i++) all[n++] = ssm[i];
    }
    for (size_t i = 0; i < n && i < max; i++) keys[i] = all[i];
    return n < max ? n : max;
}

void em_family_describe(const em_family *f, char *buf, size_t size) {
    if (size) buf[0] = 0;
    append(buf, size, f->act == EM_ACT_GEGLU ? "GeGLU" : f->act == EM_ACT_SWIGLU_CLAMPED ? "clamped SwiGLU" : "SwiGLU");
    append(buf, size, f->rope == EM_ROPE_NEOX ? "neox rope" : "normal rope");
    if (f->qk_norm) append(buf, size, "QK-norm");
    if (f->qkv_bias) append(buf, size, f->attn_out_bias ? "QKVO biases" : "QKV biases");
    if (f->attn_sinks) append(buf, size, "attention sinks");
    if (f->post_norms) append(buf, size, "post-norms");
    if (f->embd_scale_sqrt) append(buf, size, "embeddings x sqrt(d)");
    if (f->tied_output) append(buf, size, "tied output");
    if (f->norm_plus_one) append(buf, size, "norms stored as 1 + w");
    if (f->softcaps) append(buf, size, "logit soft-caps");
    char text[64];
    if (f->window == EM_WINDOW_EVERY_LAYER) append(buf, size, "sliding window on every layer when set");
    if (f->window == EM_WINDOW_PATTERN) {
        snprintf(text, sizeof text, "sliding window, every %u%s layer global", f->window_period,
                 f->window_period == 2 ? "nd" : "th");
        append(buf, size, text);
    }
    if (f->local_rope_theta > 0) {
        snprintf(text, sizeof text, "local layers rope %g", f->local_rope_theta);
        append(buf, size, text);
    }
    if (f->hybrid != EM_HYBRID_NONE)
        append(buf, size, f->hybrid == EM_HYBRID_DELTA_NET_TILED ? "Gated DeltaNet layers (tiled value heads)"
                                                                 : "Gated DeltaNet layers (grouped value heads)");
    if (f->attn_output_gate) append(buf, size, "gated attention");
    if (f->swa_keys) append(buf, size, "sliding and full layers of their own shapes");
    if (f->value_norm) append(buf, size, "V normalized");
    if (f->unit_attn_scale) append(buf, size, "attention scale 1");
    if (f->values_from_keys) append(buf, size, "K = V where a layer has no V projection");
    if (f->shared_kv) append(buf, size, "last layers share KV");
    if (f->per_layer_inputs) append(buf, size, "per-layer inputs");
    if (f->moe == EM_MOE_BESIDE_DENSE) append(buf, size, "experts beside a dense unit");
    if (f->moe == EM_MOE_LEADING_DENSE) append(buf, size, "experts after leading dense layers");
    else if (f->moe != EM_MOE_NONE && f->moe != EM_MOE_BESIDE_DENSE) append(buf, size, "experts in every layer");
    if (f->expert_biases) append(buf, size, "biased router and experts");
    if (f->shared_expert_gate) append(buf, size, "gated shared expert");
    if (f->gating == EM_GATING_SOFTMAX_CHOSEN) append(buf, size, "softmax over the chosen experts");
}
