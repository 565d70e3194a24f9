/* config.json → em_hf_config. Transformers 4.x and 5.x name the same things differently; this file
 * is the one place that knows both spellings:
 *   4.x: rope_theta + rope_scaling {type|rope_type, factor, ...}, rope_local_base_freq (Gemma 3),
 *        sliding_window_pattern, num_experts (Qwen3-MoE);
 *   5.x: rope_parameters {rope_type, rope_theta, factor, ...}, or one such object per layer type
 *        {"full_attention": {...}, "sliding_attention": {...}}, layer_types, num_local_experts. */
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model.h"
#include "convert.h"

typedef struct reader {
    const char *file;
    json_t *root;
} reader;

static bool is_null_or_absent(const json_t *v) { return !v || json_is_null(v); }

/* Numbers: integers or reals; absent or null leaves *out alone. */
static em_err get_num(const reader *r, const json_t *obj, const char *key, const char *where, double *out) {
    json_t *v = json_object_get(obj, key);
    if (is_null_or_absent(v)) return NULL;
    if (!json_is_number(v))
        return em_errorf(EM_ERR_FORMAT, "%s: field '%s%s' is not a number", r->file, where, key);
    *out = json_number_value(v);
    return NULL;
}

static em_err get_u32(const reader *r, const json_t *obj, const char *key, bool required, uint32_t *out) {
    json_t *v = json_object_get(obj, key);
    if (is_null_or_absent(v)) {
        if (required) return em_errorf(EM_ERR_NOT_FOUND, "%s: field '%s' is missing", r->file, key);
        return NULL;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
        return em_errorf(EM_ERR_FORMAT, "%s: field '%s' is not an integer in [0, 2^32)", r->file, key);
    *out = (uint32_t)json_integer_value(v);
    return NULL;
}

static em_err get_bool(const reader *r, const json_t *obj, const char *key, bool *out, bool *given) {
    json_t *v = json_object_get(obj, key);
    if (is_null_or_absent(v)) return NULL;
    if (!json_is_boolean(v)) return em_errorf(EM_ERR_FORMAT, "%s: field '%s' is not true or false", r->file, key);
    *out = json_is_true(v);
    if (given) *given = true;
    return NULL;
}

static em_err get_str(const reader *r, const json_t *obj, const char *key, char *out, size_t size) {
    json_t *v = json_object_get(obj, key);
    if (is_null_or_absent(v)) return NULL;
    if (!json_is_string(v)) return em_errorf(EM_ERR_FORMAT, "%s: field '%s' is not a string", r->file, key);
    snprintf(out, size, "%s", json_string_value(v));
    return NULL;
}

/* A field where null means "none" (sliding windows, softcaps) and absence means the class default:
 * absent leaves *out alone, null makes it 0. */
static em_err get_nullable(const reader *r, const json_t *obj, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) return NULL;
    if (json_is_null(v)) {
        *out = 0;
        return NULL;
    }
    return get_num(r, obj, key, "", out);
}

/* Values transformers' configuration classes give fields that a config.json leaves out: the
 * family registry's hf defaults (model.h). An unknown class gets Llama's. */
static void apply_class_defaults(em_hf_config *cfg) {
    cfg->rope.theta = 1e4;
    snprintf(cfg->act, sizeof cfg->act, "silu");
    const em_family *f = em_family_by_hf_class(cfg->arch);
    if (!f) return;
    const em_family_hf_defaults *d = &f->hf;
    cfg->rope.theta = d->rope_theta;
    if (f->local_rope_theta > 0) { /* the class's rope_local_base_freq */
        cfg->rope_local = (em_hf_rope){.theta = f->local_rope_theta, .type = EM_HF_ROPE_DEFAULT, .factor = 1.0};
        cfg->rope_local_given = true;
    }
    cfg->attn_softcap = d->attn_softcap;
    cfg->final_softcap = d->final_softcap;
    cfg->query_pre_attn_scalar = d->query_pre_attn_scalar;
    cfg->sliding_window = d->sliding_window;
    cfg->n_head = d->n_head;
    cfg->n_head_kv = d->n_head_kv;
    cfg->head_dim = d->head_dim;
    cfg->sliding_window_pattern = d->sliding_window_pattern;
    cfg->n_expert = d->n_expert;
    cfg->n_expert_used = d->n_expert_used;
    cfg->n_ff_expert = d->n_ff_expert;
    cfg->n_vocab = d->n_vocab;
    cfg->partial_rotary_factor = d->partial_rotary_factor;
    snprintf(cfg->act, sizeof cfg->act, "%s", em_family_hf_activation(f));
}

/* Token ids may be an integer or a list of them (several EOS ids): the first one counts. */
static em_err get_token_id(const reader *r, const json_t *obj, const char *key, int64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (json_is_array(v)) v = json_array_get(v, 0);
    if (is_null_or_absent(v)) return NULL;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return em_errorf(EM_ERR_FORMAT, "%s: field '%s' is not a token id", r->file, key);
    *out = json_integer_value(v);
    return NULL;
}

/* One rope description: {rope_type|type, rope_theta, factor, low_freq_factor, ...}. `where` names
 * the object in messages ("rope_parameters.full_attention."). */
static em_err parse_rope(const reader *r, const json_t *o, const char *where, em_hf_rope *rope) {
    em_err err;
    if (!json_is_object(o)) return em_errorf(EM_ERR_FORMAT, "%s: field '%s' is not an object", r->file, where);
    if ((err = get_num(r, o, "rope_theta", where, &rope->theta))) return err;
    json_t *t = json_object_get(o, "rope_type");
    if (is_null_or_absent(t)) t = json_object_get(o, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "default";
    if (!is_null_or_absent(t) && !json_is_string(t))
        return em_errorf(EM_ERR_FORMAT, "%s: field '%srope_type' is not a string", r->file, where);
    if (!strcmp(type, "default")) rope->type = EM_HF_ROPE_DEFAULT;
    else if (!strcmp(type, "linear")) rope->type = EM_HF_ROPE_LINEAR;
    else if (!strcmp(type, "llama3")) rope->type = EM_HF_ROPE_LLAMA3;
    else if (!strcmp(type, "yarn")) rope->type = EM_HF_ROPE_YARN;
    else
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: field '%srope_type' = '%s' is not supported (default, linear, llama3, yarn)",
                         r->file, where, type);
    rope->factor = 1.0;
    if ((err = get_num(r, o, "factor", where, &rope->factor))) return err;
    rope->low_freq_factor = 1.0;
    rope->high_freq_factor = 4.0;
    if ((err = get_num(r, o, "low_freq_factor", where, &rope->low_freq_factor))) return err;
    if ((err = get_num(r, o, "high_freq_factor", where, &rope->high_freq_factor))) return err;
    double orig = 0;
    if ((err = get_num(r, o, "original_max_position_embeddings", where, &orig))) return err;
    if (orig < 0 || orig > UINT32_MAX)
        return em_errorf(EM_ERR_RANGE, "%s: field '%soriginal_max_position_embeddings' is out of range", r->file, where);
    rope->original_ctx = (uint32_t)orig;
    if ((err = get_num(r, o, "beta_fast", where, &rope->beta_fast))) return err;
    if ((err = get_num(r, o, "beta_slow", where, &rope->beta_slow))) return err;
    if ((err = get_num(r, o, "attention_factor", where, &rope->attention_factor))) return err;
    rope->untruncated = json_is_false(json_object_get(o, "truncate"));
    if (rope->factor <= 0 || rope->theta <= 0)
        return em_errorf(EM_ERR_RANGE, "%s: field '%s' has a non-positive factor or rope_theta", r->file, where);
    if (rope->type == EM_HF_ROPE_LLAMA3 && (rope->original_ctx == 0 || rope->high_freq_factor <= rope->low_freq_factor))
        return em_errorf(EM_ERR_FORMAT, "%s: field '%s' (llama3) needs original_max_position_embeddings and "
                         "high_freq_factor > low_freq_factor", r->file, where);
    return NULL;
}

static em_err parse_ropes(const reader *r, const json_t *c, em_hf_config *cfg) {
    em_err err;
    cfg->rope.factor = 1.0; /* rope.theta holds the class default */
    json_t *params = json_object_get(c, "rope_parameters");
    if (!is_null_or_absent(params)) { /* 5.x */
        if (!json_is_object(params))
            return em_errorf(EM_ERR_FORMAT, "%s: field 'rope_parameters' is not an object", r->file);
        json_t *full = json_object_get(params, "full_attention"), *sliding = json_object_get(params, "sliding_attention");
        if (!full && !sliding) return parse_rope(r, params, "rope_parameters.", &cfg->rope);
        if (full && (err = parse_rope(r, full, "rope_parameters.full_attention.", &cfg->rope))) return err;
        if (sliding) {
            if (!cfg->rope_local_given) cfg->rope_local = cfg->rope;
            cfg->rope_local.type = EM_HF_ROPE_DEFAULT;
            cfg->rope_local.factor = 1.0;
            if ((err = parse_rope(r, sliding, "rope_parameters.sliding_attention.", &cfg->rope_local))) return err;
            cfg->rope_local_given = true;
            if (!full) cfg->rope = cfg->rope_local;
        }
        return NULL;
    }
    /* 4.x */
    if ((err = get_num(r, c, "rope_theta", "", &cfg->rope.theta))) return err;
    json_t *scaling = json_object_get(c, "rope_scaling");
    if (!is_null_or_absent(scaling)) {
        double theta = cfg->rope.theta;
        if ((err = parse_rope(r, scaling, "rope_scaling.", &cfg->rope))) return err;
        cfg->rope.theta = theta; /* rope_scaling never carries the base */
    }
    json_t *local = json_object_get(c, "rope_local_base_freq");
    if (!is_null_or_absent(local)) {
        cfg->rope_local = (em_hf_rope){.theta = 10000.0, .type = EM_HF_ROPE_DEFAULT, .factor = 1.0};
        if ((err = get_num(r, c, "rope_local_base_freq", "", &cfg->rope_local.theta))) return err;
        cfg->rope_local_given = true;
    }
    if (cfg->rope.theta <= 0) return em_errorf(EM_ERR_RANGE, "%s: field 'rope_theta' is not positive", r->file);
    return NULL;
}

static em_err parse_layer_types(const reader *r, const json_t *c, em_hf_config *cfg) {
    json_t *types = json_object_get(c, "layer_types");
    if (is_null_or_absent(types)) return NULL;
    if (!json_is_array(types) || json_array_size(types) != cfg->n_layer)
        return em_errorf(EM_ERR_FORMAT, "%s: field 'layer_types' is not an array of %u entries", r->file, cfg->n_layer);
    cfg->layer_sliding = calloc(cfg->n_layer ? cfg->n_layer : 1, sizeof *cfg->layer_sliding);
    cfg->layer_linear = calloc(cfg->n_layer ? cfg->n_layer : 1, sizeof *cfg->layer_linear);
    if (!cfg->layer_sliding || !cfg->layer_linear) return em_errorf(EM_ERR_NOMEM, "%s: out of memory", r->file);
    bool linear = false;
    for (uint32_t i = 0; i < cfg->n_layer; i++) {
        const char *t = json_string_value(json_array_get(types, i));
        if (t && !strcmp(t, "sliding_attention")) cfg->layer_sliding[i] = true;
        else if (t && !strcmp(t, "linear_attention")) cfg->layer_linear[i] = linear = true;
        else if (!t || strcmp(t, "full_attention"))
            return em_errorf(EM_ERR_UNSUPPORTED,
                             "%s: field 'layer_types[%u]' = '%s' (full_attention, sliding_attention or linear_attention)",
                             r->file, i, t ? t : "(not a string)");
    }
    if (!linear) {
        free(cfg->layer_linear);
        cfg->layer_linear = NULL;
    }
    return NULL;
}

static em_err parse_moe(const reader *r, const json_t *c, em_hf_config *cfg) {
    em_err err;
    if ((err = get_u32(r, c, "num_experts", false, &cfg->n_expert))) return err;       /* 4.x Qwen3-MoE */
    if ((err = get_u32(r, c, "num_local_experts", false, &cfg->n_expert))) return err; /* Mixtral, 5.x */
    if ((err = get_u32(r, c, "experts_per_token", false, &cfg->n_expert_used))) return err; /* gpt-oss's own */
    if ((err = get_u32(r, c, "num_experts_per_tok", false, &cfg->n_expert_used))) return err;
    if ((err = get_u32(r, c, "moe_intermediate_size", false, &cfg->n_ff_expert))) return err;
    if ((err = get_bool(r, c, "norm_topk_prob", &cfg->norm_topk_prob, &cfg->norm_topk_given))) return err;
    cfg->decoder_sparse_step = 1;
    if ((err = get_u32(r, c, "decoder_sparse_step", false, &cfg->decoder_sparse_step))) return err;
    json_t *mlp_only = json_object_get(c, "mlp_only_layers");
    cfg->has_mlp_only_layers = json_is_array(mlp_only) && json_array_size(mlp_only) > 0;
    if (cfg->n_expert && (cfg->n_expert_used == 0 || cfg->n_expert_used > cfg->n_expert))
        return em_errorf(EM_ERR_FORMAT, "%s: field 'num_experts_per_tok' = %u does not fit %u experts", r->file,
                         cfg->n_expert_used, cfg->n_expert);
    return NULL;
}

/* mrope_section: three counts of rotated pairs (temporal, height, width), in the rope object. */
static em_err parse_mrope(const reader *r, const json_t *rope, const char *where, em_hf_config *cfg) {
    json_t *v = json_object_get(rope, "mrope_section");
    if (is_null_or_absent(v)) return NULL;
    if (!json_is_array(v) || json_array_size(v) != 3)
        return em_errorf(EM_ERR_FORMAT, "%s: field '%smrope_section' is not an array of 3 integers", r->file, where);
    for (size_t i = 0; i < 3; i++) {
        json_t *n = json_array_get(v, i);
        if (!json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) > 65536)
            return em_errorf(EM_ERR_FORMAT, "%s: field '%smrope_section[%zu]' is not a count of pairs", r->file, where, i);
        cfg->mrope_section[i] = (uint32_t)json_integer_value(n);
    }
    cfg->mrope_given = true;
    return NULL;
}

/* The Gated DeltaNet fields of a hybrid model, where config.json has them, and its RoPE's share and
 * sections (5.x keeps them in rope_parameters, 4.x beside rope_theta or in rope_scaling). */
static em_err parse_linear_attention(const reader *r, const json_t *c, em_hf_config *cfg) {
    static const struct {
        const char *key;
        size_t offset;
    } fields[] = {
        {"linear_conv_kernel_dim", offsetof(em_hf_config, linear_conv_kernel)},
        {"linear_key_head_dim", offsetof(em_hf_config, linear_key_head_dim)},
        {"linear_value_head_dim", offsetof(em_hf_config, linear_value_head_dim)},
        {"linear_num_key_heads", offsetof(em_hf_config, linear_key_heads)},
        {"linear_num_value_heads", offsetof(em_hf_config, linear_value_heads)},
        {"full_attention_interval", offsetof(em_hf_config, full_attention_interval)},
        {"shared_expert_intermediate_size", offsetof(em_hf_config, n_ff_shared)},
        {"mtp_num_hidden_layers", offsetof(em_hf_config, mtp_layers)},
    };
    em_err err;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if ((err = get_u32(r, c, fields[i].key, false, (uint32_t *)((char *)cfg + fields[i].offset)))) return err;
    if ((err = get_num(r, c, "partial_rotary_factor", "", &cfg->partial_rotary_factor))) return err;
    const char *where[] = {"rope_parameters", "rope_scaling"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *rope = json_object_get(c, where[i]);
        if (!json_is_object(rope)) continue;
        char prefix[32];
        snprintf(prefix, sizeof prefix, "%s.", where[i]);
        if ((err = get_num(r, rope, "partial_rotary_factor", prefix, &cfg->partial_rotary_factor))) return err;
        if ((err = parse_mrope(r, rope, prefix, cfg))) return err;
    }
    if (cfg->partial_rotary_factor < 0 || cfg->partial_rotary_factor > 1)
        return em_errorf(EM_ERR_RANGE, "%s: field 'partial_rotary_factor' = %g is not in [0, 1]", r->file,
                         cfg->partial_rotary_factor);
    return NULL;
}

static em_err parse_all(const reader *r, em_hf_config *cfg) {
    const json_t *c = r->root;
    em_err err;
    if (!json_is_object(c)) return em_errorf(EM_ERR_FORMAT, "%s: not a JSON object", r->file);
    json_t *archs = json_object_get(c, "architectures");
    if (!json_is_array(archs) || !json_is_string(json_array_get(archs, 0)))
        return em_errorf(EM_ERR_NOT_FOUND, "%s: field 'architectures' is missing or not a list of names", r->file);
    snprintf(cfg->arch, sizeof cfg->arch, "%s", json_string_value(json_array_get(archs, 0)));
    if ((err = get_str(r, c, "model_type", cfg->model_type, sizeof cfg->model_type))) return err;
    /* A multimodal model keeps its language model's fields in text_config. */
    const json_t *top = c, *text = json_object_get(c, "text_config");
    if (json_is_object(text) && !json_object_get(c, "num_hidden_layers")) c = text;
    if ((err = get_u32(r, c, "num_hidden_layers", true, &cfg->n_layer))) return err;
    if ((err = get_u32(r, c, "hidden_size", true, &cfg->n_embd))) return err;
    if ((err = get_u32(r, c, "intermediate_size", false, &cfg->n_ff))) return err;
    apply_class_defaults(cfg);
    const bool heads_default = cfg->n_head > 0;
    if ((err = get_u32(r, c, "num_attention_heads", !heads_default, &cfg->n_head))) return err;
    if (!heads_default || json_is_null(json_object_get(c, "num_key_value_heads"))) cfg->n_head_kv = cfg->n_head;
    if ((err = get_u32(r, c, "num_key_value_heads", false, &cfg->n_head_kv))) return err;
    if ((err = get_u32(r, c, "vocab_size", cfg->n_vocab == 0, &cfg->n_vocab))) return err;
    cfg->n_ctx = 4096;
    if ((err = get_u32(r, c, "max_position_embeddings", false, &cfg->n_ctx))) return err;
    if (cfg->n_layer == 0 || cfg->n_embd == 0 || cfg->n_head == 0 || cfg->n_head_kv == 0 || cfg->n_vocab == 0 ||
        cfg->n_head % cfg->n_head_kv)
        return em_errorf(EM_ERR_FORMAT, "%s: %u layers, width %u, %u heads / %u KV heads, vocabulary %u is not a model",
                         r->file, cfg->n_layer, cfg->n_embd, cfg->n_head, cfg->n_head_kv, cfg->n_vocab);
    uint32_t hd = cfg->head_dim; /* the class default, if any */
    cfg->head_dim = cfg->n_embd / cfg->n_head;
    if ((err = get_u32(r, c, "head_dim", false, &hd))) return err;
    if (json_is_null(json_object_get(c, "head_dim"))) hd = 0;
    if (hd) {
        cfg->head_dim = hd;
        cfg->head_dim_given = true;
    }
    cfg->norm_eps = 1e-6;
    if ((err = get_num(r, c, "rms_norm_eps", "", &cfg->norm_eps))) return err;
    if ((err = get_str(r, c, "hidden_act", cfg->act, sizeof cfg->act))) return err;
    if ((err = get_str(r, c, "hidden_activation", cfg->act, sizeof cfg->act))) return err;
    if ((err = get_bool(r, c, "tie_word_embeddings", &cfg->tie_embeddings, &cfg->tie_given))) return err;
    if ((err = get_bool(r, c, "attention_bias", &cfg->attention_bias, NULL))) return err;
    if ((err = get_bool(r, c, "mlp_bias", &cfg->mlp_bias, NULL))) return err;
    if ((err = parse_ropes(r, c, cfg))) return err;
    double window = cfg->sliding_window;
    if ((err = get_nullable(r, c, "sliding_window", &window))) return err;
    if (window < 0 || window > UINT32_MAX || window != (uint32_t)window)
        return em_errorf(EM_ERR_FORMAT, "%s: field 'sliding_window' is not an integer in [0, 2^32)", r->file);
    cfg->sliding_window = (uint32_t)window;
    if ((err = get_bool(r, c, "use_sliding_window", &cfg->use_sliding_window, &cfg->use_sliding_window_given)))
        return err;
    if ((err = get_u32(r, c, "sliding_window_pattern", false, &cfg->sliding_window_pattern))) return err;
    if (!cfg->sliding_window_pattern &&
        (err = get_u32(r, c, "_sliding_window_pattern", false, &cfg->sliding_window_pattern)))
        return err;
    if ((err = parse_layer_types(r, c, cfg))) return err;
    if ((err = parse_moe(r, c, cfg))) return err;
    if ((err = parse_linear_attention(r, c, cfg))) return err;
    if ((err = get_nullable(r, c, "attn_logit_softcapping", &cfg->attn_softcap))) return err;
    if ((err = get_nullable(r, c, "final_logit_softcapping", &cfg->final_softcap))) return err;
    if ((err = get_num(r, c, "query_pre_attn_scalar", "", &cfg->query_pre_attn_scalar))) return err;
    cfg->bos_id = cfg->eos_id = cfg->pad_id = -1;
    for (const json_t *o = top;; o = c) { /* the text config's ids override the outer ones */
        if ((err = get_token_id(r, o, "bos_token_id", &cfg->bos_id))) return err;
        if ((err = get_token_id(r, o, "eos_token_id", &cfg->eos_id))) return err;
        if ((err = get_token_id(r, o, "pad_token_id", &cfg->pad_id))) return err;
        if (o == c) break;
    }
    return NULL;
}

em_err em_hf_config_parse(const char *text, size_t len, const char *name, em_hf_config *out) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    reader r = {.file = name ? name : "config.json"};
    r.root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!r.root) return em_errorf(EM_ERR_FORMAT, "%s: JSON: %s (line %d, column %d)", r.file, jerr.text, jerr.line, jerr.column);
    em_err err = parse_all(&r, out);
    json_decref(r.root);
    if (err) em_hf_config_free(out);
    return err;
}

em_err em_hf_config_load(const char *path, em_hf_config *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return em_errorf(EM_ERR_IO, "%s: cannot open", path);
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 65536;
            char *grown = cap <= (64u << 20) ? realloc(text, cap) : NULL;
            if (!grown) {
                free(text);
                fclose(f);
                return em_errorf(EM_ERR_NOMEM, "%s: too large or out of memory", path);
            }
            text = grown;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        free(text);
        return em_errorf(EM_ERR_IO, "%s: read error", path);
    }
    em_err err = em_hf_config_parse(text, len, path, out);
    free(text);
    return err;
}

void em_hf_config_free(em_hf_config *cfg) {
    if (!cfg) return;
    free(cfg->layer_sliding);
    free(cfg->layer_linear);
    cfg->layer_sliding = NULL;
    cfg->layer_linear = NULL;
}
