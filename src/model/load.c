/* The loader: GGUF metadata and tensor names (as llama.cpp's converter writes them) → the model
 * description and weights (see model.h). The family's row of the registry (family.c) says what
 * differs; everything else is shared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "model.h"

/* ---- metadata helpers ---- */

typedef struct loader {
    em_gguf *g;             /* the file with the metadata: the only one, or a split set's first part */
    em_gguf *const *parts;  /* every file of the model, g first; tensors may live in any of them */
    uint32_t n_parts;
    em_model *m;
    char arch[EM_MODEL_ARCH_MAX];
    char key[160];
} loader;

static const char *key_of(loader *l, const char *suffix) {
    snprintf(l->key, sizeof l->key, "%s.%s", l->arch, suffix);
    return l->key;
}

static em_err need_u32(loader *l, const char *suffix, uint32_t *out) {
    em_err err = em_gguf_get_u32(l->g, key_of(l, suffix), out);
    return err ? em_err_prefix(err, "%s", em_gguf_path(l->g)) : NULL;
}

/* Optional key: `fallback` when absent; an error when present with a wrong type. */
static em_err opt_u32(loader *l, const char *suffix, uint32_t fallback, uint32_t *out) {
    if (!em_gguf_find(l->g, key_of(l, suffix))) {
        *out = fallback;
        return NULL;
    }
    return need_u32(l, suffix, out);
}

static em_err opt_f32(loader *l, const char *suffix, float fallback, float *out) {
    if (!em_gguf_find(l->g, key_of(l, suffix))) {
        *out = fallback;
        return NULL;
    }
    em_err err = em_gguf_get_f32(l->g, l->key, out);
    return err ? em_err_prefix(err, "%s", em_gguf_path(l->g)) : NULL;
}

/* Head counts may be one value or an array with one value per layer. */
static em_err layer_u32(loader *l, const char *suffix, uint32_t layer, bool required, uint32_t fallback,
                        uint32_t *out) {
    const em_gguf_kv *kv = em_gguf_find(l->g, key_of(l, suffix));
    if (!kv) {
        if (required) return em_errorf(EM_ERR_NOT_FOUND, "%s: missing metadata key %s", em_gguf_path(l->g), l->key);
        *out = fallback;
        return NULL;
    }
    if (kv->type == EM_GGUF_ARRAY) {
        if (layer >= kv->array_len)
            return em_errorf(EM_ERR_FORMAT, "%s: %s has %llu entries, layer %u needs one", em_gguf_path(l->g),
                             l->key, (unsigned long long)kv->array_len, layer);
        int64_t v = em_gguf_array_int(kv, layer);
        if (v < 0 || v > UINT32_MAX)
            return em_errorf(EM_ERR_RANGE, "%s: %s[%u] = %lld is out of range", em_gguf_path(l->g), l->key, layer,
                             (long long)v);
        *out = (uint32_t)v;
        return NULL;
    }
    return need_u32(l, suffix, out);
}

/* Whether layer `il` of a family with a sliding-window pattern slides. The pattern is
 * {arch}.attention.sliding_window_pattern, in either of llama.cpp's forms: a period p (layers with
 * il % p < p - 1 slide, p = 0 makes every layer slide), or one bool per layer (true = sliding).
 * Without the key the family's fixed period applies (Gemma 2: 2, Gemma 3: 6). */
static em_err layer_slides(loader *l, const em_family *f, uint32_t il, bool *out) {
    const em_gguf_kv *kv = em_gguf_find(l->g, key_of(l, "attention.sliding_window_pattern"));
    uint32_t period = f->window_period;
    if (kv && kv->type == EM_GGUF_ARRAY) {
        if (kv->array_type != EM_GGUF_BOOL || kv->array_len != l->m->desc.n_layer)
            return em_errorf(EM_ERR_FORMAT, "%s: %s is an array of %llu %s, not one bool per layer (%u)",
                             em_gguf_path(l->g), l->key, (unsigned long long)kv->array_len,
                             em_gguf_type_name(kv->array_type), l->m->desc.n_layer);
        *out = em_gguf_array_int(kv, il) != 0;
        return NULL;
    }
    em_err err;
    if (kv && (err = need_u32(l, "attention.sliding_window_pattern", &period))) return err;
    *out = period == 0 || il % period < period - 1;
    return NULL;
}

/* ---- tensor helpers ---- */

static bool type_usable(uint32_t type) {
    /* The forward reads weights through quant's dot products and dequantizer; integer tensors and
     * unknown ids have neither. */
    return em_type_info_of(type) && type != EM_TYPE_I8 && type != EM_TYPE_I16 && type != EM_TYPE_I32 &&
           type != EM_TYPE_I64 && type != EM_TYPE_F64 && type != EM_TYPE_Q8_K && type != EM_TYPE_Q8_1;
}

/* The tensor `name` in whichever part of the model holds it (a split set spreads them), or NULL. */
static const em_gguf_tensor *tensor_in_parts(const loader *l, const char *name) {
    for (uint32_t i = 0; i < l->n_parts; i++) {
        const em_gguf_tensor *t = em_gguf_find_tensor(l->parts[i], name);
        if (t) return t;
    }
    return NULL;
}

/* Looks up `name` and checks its shape against ne0 x ne1 x ne2 (ne1/ne2 == 0: must be 1). */
static em_err find_tensor(loader *l, const char *name, bool required, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                          const em_gguf_tensor **out) {
    *out = NULL;
    const em_gguf_tensor *t = tensor_in_parts(l, name);
    if (!t) {
        if (!required) return NULL;
        return em_errorf(EM_ERR_NOT_FOUND, "%s: missing tensor %s", em_gguf_path(l->g), name);
    }
    uint64_t want[EM_GGUF_MAX_DIMS] = {ne0, ne1 ? ne1 : 1, ne2 ? ne2 : 1, 1};
    for (int d = 0; d < EM_GGUF_MAX_DIMS; d++) {
        if (t->ne[d] != want[d])
            return em_errorf(EM_ERR_FORMAT,
                             "%s: tensor %s has shape [%llu, %llu, %llu, %llu], expected [%llu, %llu, %llu]",
                             em_gguf_path(l->g), name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                             (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                             (unsigned long long)want[0], (unsigned long long)want[1], (unsigned long long)want[2]);
    }
    if (!type_usable(t->type))
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: tensor %s has type %s (%u), which the forward pass does not support",
                         em_gguf_path(l->g), name, em_type_name(t->type), t->type);
    *out = t;
    return NULL;
}

static em_err get_matrix(loader *l, const char *name, bool required, uint64_t cols, uint64_t rows, uint64_t n_mat,
                         em_weight *out) {
    memset(out, 0, sizeof *out);
    const em_gguf_tensor *t;
    em_err err = find_tensor(l, name, required, cols, rows, n_mat, &t);
    if (err || !t) return err;
    err = em_type_row_bytes(t->type, cols, &out->row_bytes);
    if (err) return em_err_prefix(err, "%s: tensor %s", em_gguf_path(l->g), name);
    out->data = t->data;
    out->type = t->type;
    out->cols = cols;
    out->rows = rows;
    out->n_mat = n_mat ? n_mat : 1;
    return NULL;
}

static em_err keep(em_model *m, float *v) {
    if (m->n_owned == m->cap_owned) {
        size_t cap = m->cap_owned ? 2 * m->cap_owned : 64;
        float **grown = realloc(m->owned, cap * sizeof *grown);
        if (!grown) {
            free(v);
            return em_errorf(EM_ERR_NOMEM, "out of memory keeping model vectors");
        }
        m->owned = grown;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = v;
    return NULL;
}

/* `count` vectors of n floats each ([n, count]: per-expert biases; count 0 is one vector), converted
 * to f32 and owned by the model. */
static em_err get_vectors(loader *l, const char *name, bool required, uint64_t n, uint64_t count, const float **out) {
    *out = NULL;
    const em_gguf_tensor *t;
    em_err err = find_tensor(l, name, required, n, count, 0, &t);
    if (err || !t) return err;
    const uint64_t total = n * (count ? count : 1);
    float *v = malloc(total * sizeof *v);
    if (!v) return em_errorf(EM_ERR_NOMEM, "out of memory loading %s", name);
    if (t->type == EM_TYPE_F32) {
        memcpy(v, t->data, total * sizeof *v);
    } else {
        err = em_dequantize(t->type, t->data, v, total);
        if (err) {
            free(v);
            return em_err_prefix(err, "%s: tensor %s", em_gguf_path(l->g), name);
        }
    }
    *out = v;
    return keep(l->m, v);
}

/* A vector of n floats (norm weights, biases). */
static em_err get_vector(loader *l, const char *name, bool required, uint64_t n, const float **out) {
    return get_vectors(l, name, required, n, 0, out);
}

static const char *blk(char *buf, size_t size, uint32_t layer, const char *what) {
    snprintf(buf, size, "blk.%u.%s", layer, what);
    return buf;
}

/* ---- the description ---- */

/* A layer's RoPE; `swa`: a sliding layer of a family with `_swa` keys, whose base and rotated
 * dimensions are rope.freq_base_swa and rope.dimension_count_swa (when present). */
static em_err load_rope(loader *l, const em_family *f, em_layer_desc *ld, const float *freq_factors, bool swa) {
    em_err err;
    ld->rope.style = f->rope;
    if ((err = opt_f32(l, "rope.freq_base", 10000.0f, &ld->rope.theta))) return err;
    if (swa && (err = opt_f32(l, "rope.freq_base_swa", ld->rope.theta, &ld->rope.theta))) return err;
    const char *dims = swa && em_gguf_find(l->g, key_of(l, "rope.dimension_count_swa")) ? "rope.dimension_count_swa"
                                                                                       : "rope.dimension_count";
    if ((err = opt_u32(l, dims, ld->head_dim, &ld->rope.n_rot))) return err;
    if (swa && !em_gguf_find(l->g, key_of(l, "rope.dimension_count_swa"))) ld->rope.n_rot = ld->head_dim;
    if (ld->rope.n_rot > ld->head_dim || ld->rope.n_rot % 2)
        return em_errorf(EM_ERR_FORMAT, "%s: %s.%s = %u does not fit head dim %u", em_gguf_path(l->g), l->arch, dims,
                         ld->rope.n_rot, ld->head_dim);
    ld->rope.scaling = EM_ROPE_SCALING_NONE;
    ld->rope.factor = 1.0f;
    ld->rope.yarn_ext_factor = 0.0f;
    ld->rope.yarn_attn_factor = 1.0f;
    ld->rope.yarn_beta_fast = 32.0f;
    ld->rope.yarn_beta_slow = 1.0f;
    if ((err = opt_u32(l, "rope.scaling.original_context_length", l->m->desc.n_ctx_train, &ld->rope.orig_ctx)))
        return err;

    em_str type = {"none", 4};
    if (em_gguf_find(l->g, key_of(l, "rope.scaling.type"))) {
        if ((err = em_gguf_get_str(l->g, l->key, &type))) return em_err_prefix(err, "%s", em_gguf_path(l->g));
    }
    float factor = 1.0f;
    if ((err = opt_f32(l, "rope.scaling.factor", 1.0f, &factor))) return err;
    float scale_linear;
    if ((err = opt_f32(l, "rope.scale_linear", 0.0f, &scale_linear))) return err; /* older files */
    if (scale_linear > 0.0f && em_str_eq(type, "none")) {
        type = (em_str){"linear", 6};
        factor = scale_linear;
    }
    if (em_str_eq(type, "linear")) {
        ld->rope.scaling = EM_ROPE_SCALING_LINEAR;
        ld->rope.factor = factor > 0.0f ? factor : 1.0f;
    } else if (em_str_eq(type, "yarn")) {
        ld->rope.scaling = EM_ROPE_SCALING_YARN;
        ld->rope.factor = factor > 0.0f ? factor : 1.0f;
        if ((err = opt_f32(l, "rope.scaling.yarn_ext_factor", 1.0f, &ld->rope.yarn_ext_factor))) return err;
        if ((err = opt_f32(l, "rope.scaling.yarn_attn_factor", 1.0f, &ld->rope.yarn_attn_factor))) return err;
        if ((err = opt_f32(l, "rope.scaling.yarn_beta_fast", 32.0f, &ld->rope.yarn_beta_fast))) return err;
        if ((err = opt_f32(l, "rope.scaling.yarn_beta_slow", 1.0f, &ld->rope.yarn_beta_slow))) return err;
    } else if (!em_str_eq(type, "none")) {
        char *name = em_str_dup(type);
        err = em_errorf(EM_ERR_UNSUPPORTED, "%s: %s.rope.scaling.type '%s' is not supported", em_gguf_path(l->g),
                        l->arch, name ? name : "?");
        free(name);
        return err;
    }
    if (freq_factors && !swa) {
        /* Llama 3 scaling, or proportional RoPE (Gemma 4's full layers: the pairs that do not rotate
         * divided by 1e30): the converter precomputes one divisor per frequency. */
        ld->rope.scaling = EM_ROPE_SCALING_LLAMA3;
        ld->rope.freq_factors = freq_factors;
    }
    return NULL;
}

/* Real files of hybrid families append their multi-token-prediction layers (blk.L.nextn.*) after the
 * main stack and count them in block_count; the forward step runs the main stack alone. */
static em_err skip_next_token_layers(loader *l, const em_family *f, uint32_t *n_layer) {
    uint32_t next = 0;
    em_err err;
    if (f->hybrid == EM_HYBRID_NONE) return NULL;
    if ((err = opt_u32(l, "nextn_predict_layers", 0, &next))) return err;
    if (next >= *n_layer)
        return em_errorf(EM_ERR_FORMAT, "%s: %s.nextn_predict_layers = %u leaves none of the %u blocks", em_gguf_path(l->g),
                         l->arch, next, *n_layer);
    *n_layer -= next;
    return NULL;
}

/* A ssm.* key of a hybrid family, which must be at least 1 and at most `max`. */
static em_err ssm_u32(loader *l, const char *suffix, uint32_t max, uint32_t *out) {
    em_err err = need_u32(l, suffix, out);
    if (err) return err;
    if (*out == 0 || *out > max)
        return em_errorf(EM_ERR_RANGE, "%s: %s = %u is out of range (1 to %u)", em_gguf_path(l->g), l->key, *out, max);
    return NULL;
}

/* Which layers of a hybrid family are Gated DeltaNet (all but every full_attention_interval-th), and
 * their shape from the ssm.* keys, each checked against the others. */
static em_err load_hybrid_desc(loader *l, const em_family *f) {
    em_model_desc *d = &l->m->desc;
    em_delta_net_desc dn = {.v_tiled = f->hybrid == EM_HYBRID_DELTA_NET_TILED};
    uint32_t interval, inner;
    em_err err;
    if ((err = opt_u32(l, "full_attention_interval", 4, &interval))) return err;
    if (interval == 0)
        return em_errorf(EM_ERR_RANGE, "%s: %s.full_attention_interval = 0", em_gguf_path(l->g), l->arch);
    if ((err = ssm_u32(l, "ssm.conv_kernel", 16, &dn.conv_kernel))) return err;
    if ((err = ssm_u32(l, "ssm.state_size", 1024, &dn.head_dim_k))) return err;
    if ((err = ssm_u32(l, "ssm.group_count", 1024, &dn.n_head_k))) return err;
    if ((err = ssm_u32(l, "ssm.time_step_rank", 1024, &dn.n_head_v))) return err;
    if ((err = ssm_u32(l, "ssm.inner_size", 1u << 20, &inner))) return err;
    if (dn.n_head_v % dn.n_head_k)
        return em_errorf(EM_ERR_FORMAT, "%s: %s.ssm.time_step_rank = %u value heads is not a multiple of "
                         "%s.ssm.group_count = %u key heads", em_gguf_path(l->g), l->arch, dn.n_head_v, l->arch, dn.n_head_k);
    if (inner % dn.n_head_v)
        return em_errorf(EM_ERR_FORMAT, "%s: %s.ssm.inner_size = %u does not divide into %u value heads",
                         em_gguf_path(l->g), l->arch, inner, dn.n_head_v);
    dn.head_dim_v = inner / dn.n_head_v;
    for (uint32_t il = 0; il < d->n_layer; il++) {
        em_layer_desc *ld = &d->layers[il];
        ld->attn_output_gate = f->attn_output_gate;
        if ((il + 1) % interval == 0) continue;
        ld->mixer = EM_MIXER_DELTA_NET;
        ld->delta_net = dn;
    }
    return NULL;
}

/* The last attention.shared_kv_layers layers attend over the cache of the last earlier layer of their
 * kind (sliding or full), which must have their shape; they write no cache of their own. */
static em_err load_shared_kv(loader *l) {
    em_model_desc *d = &l->m->desc;
    uint32_t shared;
    em_err err = opt_u32(l, "attention.shared_kv_layers", 0, &shared);
    if (err) return err;
    if (shared >= d->n_layer && shared)
        return em_errorf(EM_ERR_RANGE, "%s: %s.attention.shared_kv_layers = %u leaves none of the %u layers its own KV",
                         em_gguf_path(l->g), l->arch, shared, d->n_layer);
    const uint32_t first = d->n_layer - shared;
    for (uint32_t il = first; il < d->n_layer; il++) {
        em_layer_desc *ld = &d->layers[il];
        uint32_t from = first;
        while (from > 0 && d->layers[from - 1].attn != ld->attn) from--;
        if (from == 0)
            return em_errorf(EM_ERR_FORMAT, "%s: %s.attention.shared_kv_layers = %u: layer %u has no earlier %s layer "
                             "to share KV with", em_gguf_path(l->g), l->arch, shared, il,
                             ld->attn == EM_ATTN_SLIDING ? "sliding" : "full");
        const em_layer_desc *src = &d->layers[from - 1];
        if (src->n_head_kv != ld->n_head_kv || src->head_dim != ld->head_dim || src->head_dim_v != ld->head_dim_v ||
            src->window != ld->window)
            return em_errorf(EM_ERR_FORMAT, "%s: %s.attention.shared_kv_layers = %u: layer %u (%u KV heads x %u) cannot "
                             "read layer %u's cache (%u KV heads x %u)", em_gguf_path(l->g), l->arch, shared, il,
                             ld->n_head_kv, ld->head_dim, from - 1, src->n_head_kv, src->head_dim);
        ld->kv_layer = from - 1;
    }
    return NULL;
}

static em_err load_desc(loader *l, const em_family *f) {
    em_model_desc *d = &l->m->desc;
    em_err err;
    snprintf(d->arch, sizeof d->arch, "%s", l->arch);
    if ((err = need_u32(l, "block_count", &d->n_layer))) return err;
    if ((err = skip_next_token_layers(l, f, &d->n_layer))) return err;
    if ((err = need_u32(l, "embedding_length", &d->n_embd))) return err;
    if ((err = opt_u32(l, "context_length", 4096, &d->n_ctx_train))) return err;
    if (d->n_layer == 0 || d->n_layer > 4096 || d->n_embd == 0 || d->n_embd > (1u << 20))
        return em_errorf(EM_ERR_RANGE, "%s: %u layers of width %u is not a plausible model", em_gguf_path(l->g),
                         d->n_layer, d->n_embd);
    if ((err = opt_f32(l, "attention.layer_norm_rms_epsilon", 1e-5f, &d->norm_eps))) return err;
    d->norm = EM_NORM_RMS; /* Gemma's +1 is already in the stored weights (see model.h) */
    d->act = f->act;
    d->embd_scale = f->embd_scale_sqrt ? sqrtf((float)d->n_embd) : 1.0f;
    if ((err = opt_f32(l, "final_logit_softcapping", f->default_final_softcap, &d->final_softcap))) return err;

    uint32_t n_expert = 0, n_expert_used = 0, n_dense_lead = 0, window = 0, gating_func = 1;
    bool weights_norm = true;
    float weights_scale = 1.0f, attn_softcap = 0.0f;
    if ((err = opt_u32(l, "expert_count", 0, &n_expert))) return err;
    if ((err = opt_u32(l, "expert_used_count", 0, &n_expert_used))) return err;
    if ((err = opt_u32(l, "leading_dense_block_count", 0, &n_dense_lead))) return err;
    if ((err = opt_u32(l, "expert_gating_func", 1, &gating_func))) return err;
    if ((err = opt_f32(l, "expert_weights_scale", 1.0f, &weights_scale))) return err;
    if (em_gguf_find(l->g, key_of(l, "expert_weights_norm")) &&
        (err = em_gguf_get_bool(l->g, l->key, &weights_norm)))
        return em_err_prefix(err, "%s", em_gguf_path(l->g));
    if ((err = opt_f32(l, "attn_logit_softcapping", 0.0f, &attn_softcap))) return err;
    /* A window on every layer (Mistral): llama.cpp's converter omits the key, Ember's writes it. */
    if (f->window != EM_WINDOW_NONE && (err = opt_u32(l, "attention.sliding_window", 0, &window))) return err;
    if (f->moe != EM_MOE_NONE && f->moe != EM_MOE_BESIDE_DENSE && n_expert == 0)
        return em_errorf(EM_ERR_NOT_FOUND, "%s: missing metadata key %s.expert_count", em_gguf_path(l->g), l->arch);
    if (n_expert > 0 && (n_expert_used == 0 || n_expert_used > n_expert || n_expert > 4096))
        return em_errorf(EM_ERR_RANGE, "%s: %u of %u experts per token is not valid", em_gguf_path(l->g),
                         n_expert_used, n_expert);
    if (gating_func != 1 && gating_func != 2)
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: %s.expert_gating_func = %u (1 softmax, 2 sigmoid)",
                         em_gguf_path(l->g), l->arch, gating_func);
    em_gating gating = gating_func == 2 ? EM_GATING_SIGMOID : EM_GATING_SOFTMAX;
    if (!em_gguf_find(l->g, key_of(l, "expert_gating_func"))) gating = f->gating;
    d->act_limit = f->act_limit;
    d->act_alpha = f->act_alpha;

    d->layers = calloc(d->n_layer, sizeof *d->layers);
    if (!d->layers) return em_errorf(EM_ERR_NOMEM, "out of memory describing %u layers", d->n_layer);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        em_layer_desc *ld = &d->layers[il];
        if ((err = layer_u32(l, "attention.head_count", il, true, 0, &ld->n_head))) return err;
        if ((err = layer_u32(l, "attention.head_count_kv", il, false, ld->n_head, &ld->n_head_kv))) return err;
        if (ld->n_head == 0 || ld->n_head_kv == 0 || ld->n_head % ld->n_head_kv)
            return em_errorf(EM_ERR_FORMAT, "%s: layer %u has %u query heads and %u KV heads", em_gguf_path(l->g),
                             il, ld->n_head, ld->n_head_kv);
        ld->attn = EM_ATTN_FULL;
        bool slides = f->window == EM_WINDOW_EVERY_LAYER;
        if (f->window == EM_WINDOW_PATTERN && (err = layer_slides(l, f, il, &slides))) return err;
        if (window > 0 && slides) {
            ld->attn = EM_ATTN_SLIDING;
            ld->window = window;
        }
        /* sliding layers of a family with `_swa` keys have their own head size */
        const bool swa = f->swa_keys && ld->attn == EM_ATTN_SLIDING;
        if ((err = opt_u32(l, "attention.key_length", d->n_embd / ld->n_head, &ld->head_dim))) return err;
        if (swa && (err = opt_u32(l, "attention.key_length_swa", ld->head_dim, &ld->head_dim))) return err;
        if ((err = opt_u32(l, swa ? "attention.value_length_swa" : "attention.value_length", ld->head_dim,
                           &ld->head_dim_v)))
            return err;
        if (ld->head_dim == 0 || ld->head_dim_v == 0)
            return em_errorf(EM_ERR_FORMAT, "%s: layer %u has head dim 0", em_gguf_path(l->g), il);
        ld->qk_norm = f->qk_norm;
        ld->value_norm = f->value_norm;
        ld->kv_layer = il;
        ld->post_attn_norm = ld->post_ffn_norm = f->post_norms;
        ld->attn_scale = f->unit_attn_scale ? 1.0f
                                            : 1.0f / sqrtf((float)em_model_attn_scale_dim(f->gguf_arch, d->n_layer,
                                                                                          d->n_embd, ld->n_head,
                                                                                          ld->head_dim));
        ld->attn_softcap = attn_softcap;
        ld->moe = n_expert > 0 && il >= n_dense_lead;
        if (ld->moe && f->moe == EM_MOE_BESIDE_DENSE &&
            (err = layer_u32(l, "feed_forward_length", il, true, 0, &ld->n_ff_dense)))
            return err;
        if (ld->moe) {
            ld->n_expert = n_expert;
            ld->n_expert_used = n_expert_used;
            ld->gating = gating;
            /* a softmax over the chosen experts already sums to one */
            ld->renormalize = weights_norm && gating != EM_GATING_SOFTMAX_CHOSEN;
            ld->expert_weights_scale = weights_scale;
            /* Mixtral (llama) keeps the expert width in feed_forward_length. */
            if (em_gguf_find(l->g, key_of(l, "expert_feed_forward_length")))
                err = layer_u32(l, "expert_feed_forward_length", il, true, 0, &ld->n_ff);
            else
                err = layer_u32(l, "feed_forward_length", il, true, 0, &ld->n_ff);
            if (err) return err;
            if ((err = opt_u32(l, "expert_shared_feed_forward_length", 0, &ld->n_ff_shared))) return err;
        } else {
            if ((err = layer_u32(l, "feed_forward_length", il, true, 0, &ld->n_ff))) return err;
        }
        if (ld->n_ff == 0) return em_errorf(EM_ERR_FORMAT, "%s: layer %u has FF width 0", em_gguf_path(l->g), il);
    }
    if (f->shared_kv && (err = load_shared_kv(l))) return err;
    if (f->per_layer_inputs && (err = opt_u32(l, "embedding_length_per_layer_input", 0, &d->n_embd_per_layer)))
        return err;
    if (d->n_embd_per_layer > (1u << 16))
        return em_errorf(EM_ERR_RANGE, "%s: %s.embedding_length_per_layer_input = %u is out of range",
                         em_gguf_path(l->g), l->arch, d->n_embd_per_layer);
    return f->hybrid != EM_HYBRID_NONE ? load_hybrid_desc(l, f) : NULL;
}

/* Sliding layers with their own RoPE base (Gemma 3: 10000) rotate without scaling; llama.cpp fixes
 * the same. */
static void local_rope(em_layer_desc *ld, float theta) {
    ld->rope.theta = theta;
    ld->rope.scaling = EM_ROPE_SCALING_NONE;
    ld->rope.factor = 1.0f;
    ld->rope.freq_factors = NULL;
}

/* The weights of an attention layer's mixer. */
static em_err load_attention(loader *l, const em_family *f, uint32_t il) {
    const em_model_desc *d = &l->m->desc;
    const em_layer_desc *ld = &d->layers[il];
    em_layer_weights *w = &l->m->w.layers[il];
    char n[96];
    em_err err;
    const uint64_t e = d->n_embd, q = (uint64_t)ld->n_head * ld->head_dim;
    const uint64_t k = (uint64_t)ld->n_head_kv * ld->head_dim, v = (uint64_t)ld->n_head_kv * ld->head_dim_v;
    const uint64_t o = (uint64_t)ld->n_head * ld->head_dim_v;

    if ((err = get_matrix(l, blk(n, sizeof n, il, "attn_q.weight"), true, e, ld->attn_output_gate ? 2 * q : q, 0, &w->wq)))
        return err;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "attn_output.weight"), true, o, e, 0, &w->wo))) return err;
    if (ld->kv_layer != il) { /* shared KV: queries alone */
        if (ld->qk_norm &&
            (err = get_vector(l, blk(n, sizeof n, il, "attn_q_norm.weight"), true, ld->head_dim, &w->q_norm)))
            return err;
        return NULL;
    }
    if ((err = get_matrix(l, blk(n, sizeof n, il, "attn_k.weight"), true, e, k, 0, &w->wk))) return err;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "attn_v.weight"), !f->values_from_keys, e, v, 0, &w->wv))) return err;
    if (!w->wv.data) { /* K = V: the values are the key projection's output */
        if (ld->head_dim_v != ld->head_dim)
            return em_errorf(EM_ERR_FORMAT, "%s: layer %u has no attn_v.weight, and its values (%u) are not its keys (%u)",
                             em_gguf_path(l->g), il, ld->head_dim_v, ld->head_dim);
        l->m->desc.layers[il].values_from_keys = true;
    }
    if ((err = get_vector(l, blk(n, sizeof n, il, "attn_q.bias"), f->qkv_bias, q, &w->bq))) return err;
    if ((err = get_vector(l, blk(n, sizeof n, il, "attn_k.bias"), f->qkv_bias || w->bq, k, &w->bk))) return err;
    if ((err = get_vector(l, blk(n, sizeof n, il, "attn_v.bias"), f->qkv_bias || w->bq, v, &w->bv))) return err;
    l->m->desc.layers[il].qkv_bias = w->bq != NULL;
    if ((err = get_vector(l, blk(n, sizeof n, il, "attn_output.bias"), f->attn_out_bias, e, &w->bo))) return err;
    if (f->attn_sinks &&
        (err = get_vector(l, blk(n, sizeof n, il, "attn_sinks.weight"), true, ld->n_head, &w->attn_sinks)))
        return err;
    if (ld->qk_norm) {
        if ((err = get_vector(l, blk(n, sizeof n, il, "attn_q_norm.weight"), true, ld->head_dim, &w->q_norm)))
            return err;
        if ((err = get_vector(l, blk(n, sizeof n, il, "attn_k_norm.weight"), true, ld->head_dim, &w->k_norm)))
            return err;
    }
    return NULL;
}

/* A conv kernel of rows x cols f32 values (GGUF ne = {cols, rows}), owned by the model. */
static em_err get_kernel(loader *l, const char *name, uint64_t cols, uint64_t rows, const float **out) {
    const em_gguf_tensor *t;
    em_err err = find_tensor(l, name, true, cols, rows, 0, &t);
    if (err) return err;
    float *v = malloc(cols * rows * sizeof *v);
    if (!v) return em_errorf(EM_ERR_NOMEM, "out of memory loading %s", name);
    if (t->type == EM_TYPE_F32) memcpy(v, t->data, cols * rows * sizeof *v);
    else if ((err = em_dequantize(t->type, t->data, v, cols * rows))) {
        free(v);
        return em_err_prefix(err, "%s: tensor %s", em_gguf_path(l->g), name);
    }
    *out = v;
    return keep(l->m, v);
}

/* The weights of a Gated DeltaNet layer's mixer (llama.cpp's names: attn_qkv, attn_gate, ssm_*). */
static em_err load_delta_net(loader *l, uint32_t il) {
    const em_model_desc *d = &l->m->desc;
    const em_delta_net_desc *dn = &d->layers[il].delta_net;
    em_layer_weights *w = &l->m->w.layers[il];
    char n[96];
    em_err err;
    const uint64_t e = d->n_embd, value = (uint64_t)dn->n_head_v * dn->head_dim_v;
    const uint64_t conv_dim = 2 * (uint64_t)dn->n_head_k * dn->head_dim_k + value;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "attn_qkv.weight"), true, e, conv_dim, 0, &w->ssm_qkv))) return err;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "attn_gate.weight"), true, e, value, 0, &w->ssm_gate))) return err;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "ssm_beta.weight"), true, e, dn->n_head_v, 0, &w->ssm_beta))) return err;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "ssm_alpha.weight"), true, e, dn->n_head_v, 0, &w->ssm_alpha)))
        return err;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "ssm_out.weight"), true, value, e, 0, &w->ssm_out))) return err;
    if ((err = get_kernel(l, blk(n, sizeof n, il, "ssm_conv1d.weight"), dn->conv_kernel, conv_dim, &w->ssm_conv)))
        return err;
    if ((err = get_vector(l, blk(n, sizeof n, il, "ssm_dt.bias"), true, dn->n_head_v, &w->ssm_dt_bias))) return err;
    if ((err = get_vector(l, blk(n, sizeof n, il, "ssm_a"), true, dn->n_head_v, &w->ssm_a))) return err;
    return get_vector(l, blk(n, sizeof n, il, "ssm_norm.weight"), true, dn->head_dim_v, &w->ssm_norm);
}

/* What a layer adds to its output in families with per-layer inputs, and the factor on its output. */
static em_err load_layer_inputs(loader *l, const em_family *f, uint32_t il) {
    const em_model_desc *d = &l->m->desc;
    em_layer_weights *w = &l->m->w.layers[il];
    const uint64_t e = d->n_embd, per_layer = d->n_embd_per_layer;
    char n[96];
    em_err err;
    if (f->layer_output_scale &&
        (err = get_vector(l, blk(n, sizeof n, il, "layer_output_scale.weight"), false, 1, &w->output_scale)))
        return err;
    if (!per_layer) return NULL;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "inp_gate.weight"), true, e, per_layer, 0, &w->per_layer_gate)))
        return err;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "proj.weight"), true, per_layer, e, 0, &w->per_layer_proj))) return err;
    return get_vector(l, blk(n, sizeof n, il, "post_norm.weight"), true, e, &w->per_layer_post_norm);
}

/* Experts beside a dense unit: the router's input norm (its scale over sqrt(n_embd), folded at
 * load), each expert's factor, the three extra norms, and gate and up as two stacks or as one
 * (ffn_gate_up_exps: each expert's gate rows, then its up rows), read in place as two views. */
static em_err load_experts_beside_dense(loader *l, uint32_t il) {
    const em_model_desc *d = &l->m->desc;
    const em_layer_desc *ld = &d->layers[il];
    em_layer_weights *w = &l->m->w.layers[il];
    const uint64_t e = d->n_embd, ff = ld->n_ff, ne = ld->n_expert;
    char n[96];
    em_err err;
    const float *router_scale;
    if ((err = get_vector(l, blk(n, sizeof n, il, "ffn_gate_inp.scale"), true, e, &router_scale))) return err;
    float *router_norm = malloc(e * sizeof *router_norm);
    if (!router_norm) return em_errorf(EM_ERR_NOMEM, "out of memory loading %s", n);
    for (uint64_t i = 0; i < e; i++) router_norm[i] = router_scale[i] / sqrtf((float)e);
    if ((err = keep(l->m, router_norm))) return err;
    w->router_norm = router_norm;
    if ((err = get_vector(l, blk(n, sizeof n, il, "ffn_down_exps.scale"), false, ne, &w->expert_scale))) return err;
    if ((err = get_vector(l, blk(n, sizeof n, il, "pre_ffw_norm_2.weight"), true, e, &w->pre_ffn_norm_2))) return err;
    if ((err = get_vector(l, blk(n, sizeof n, il, "post_ffw_norm_1.weight"), true, e, &w->post_ffn_norm_1))) return err;
    if ((err = get_vector(l, blk(n, sizeof n, il, "post_ffw_norm_2.weight"), true, e, &w->post_ffn_norm_2))) return err;
    em_weight fused;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "ffn_gate_up_exps.weight"), false, e, 2 * ff, ne, &fused))) return err;
    if (!fused.data)
        return get_matrix(l, blk(n, sizeof n, il, "ffn_gate_exps.weight"), true, e, ff, ne, &w->gate_exps);
    w->gate_exps = w->up_exps = fused;
    w->gate_exps.rows = w->up_exps.rows = ff;
    w->gate_exps.mat_bytes = w->up_exps.mat_bytes = 2 * ff * fused.row_bytes;
    w->up_exps.data = (const uint8_t *)fused.data + ff * fused.row_bytes;
    return NULL;
}

static em_err load_layer(loader *l, const em_family *f, uint32_t il) {
    const em_model_desc *d = &l->m->desc;
    const em_layer_desc *ld = &d->layers[il];
    em_layer_weights *w = &l->m->w.layers[il];
    char n[96];
    em_err err;
    const uint64_t e = d->n_embd;

    if ((err = get_vector(l, blk(n, sizeof n, il, "attn_norm.weight"), true, e, &w->attn_norm))) return err;
    if ((err = ld->mixer == EM_MIXER_DELTA_NET ? load_delta_net(l, il) : load_attention(l, f, il))) return err;
    if (ld->post_attn_norm &&
        (err = get_vector(l, blk(n, sizeof n, il, "post_attention_norm.weight"), true, e, &w->post_attn_norm)))
        return err;
    char ffn_norm[64];
    snprintf(ffn_norm, sizeof ffn_norm, "%s.weight", f->ffn_norm_tensor ? f->ffn_norm_tensor : "ffn_norm");
    if ((err = get_vector(l, blk(n, sizeof n, il, ffn_norm), true, e, &w->ffn_norm))) return err;
    if (ld->post_ffn_norm &&
        (err = get_vector(l, blk(n, sizeof n, il, "post_ffw_norm.weight"), true, e, &w->post_ffn_norm)))
        return err;

    if ((err = load_layer_inputs(l, f, il))) return err;
    const uint64_t ff = ld->n_ff;
    if (!ld->moe || ld->n_ff_dense) {
        const uint64_t dense = ld->moe ? ld->n_ff_dense : ff;
        if ((err = get_matrix(l, blk(n, sizeof n, il, "ffn_gate.weight"), true, e, dense, 0, &w->ffn_gate))) return err;
        if ((err = get_matrix(l, blk(n, sizeof n, il, "ffn_up.weight"), true, e, dense, 0, &w->ffn_up))) return err;
        if ((err = get_matrix(l, blk(n, sizeof n, il, "ffn_down.weight"), true, dense, e, 0, &w->ffn_down))) return err;
        if (!ld->moe) return NULL;
    }
    const uint64_t ne = ld->n_expert;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "ffn_gate_inp.weight"), true, e, ne, 0, &w->gate_inp))) return err;
    if (ld->n_ff_dense && (err = load_experts_beside_dense(l, il))) return err;
    else if (!ld->n_ff_dense &&
             (err = get_matrix(l, blk(n, sizeof n, il, "ffn_gate_exps.weight"), true, e, ff, ne, &w->gate_exps)))
        return err;
    if (!w->up_exps.data &&
        (err = get_matrix(l, blk(n, sizeof n, il, "ffn_up_exps.weight"), true, e, ff, ne, &w->up_exps)))
        return err;
    if ((err = get_matrix(l, blk(n, sizeof n, il, "ffn_down_exps.weight"), true, ff, e, ne, &w->down_exps)))
        return err;
    if (f->expert_biases) {
        if ((err = get_vector(l, blk(n, sizeof n, il, "ffn_gate_inp.bias"), true, ne, &w->gate_inp_bias))) return err;
        if ((err = get_vectors(l, blk(n, sizeof n, il, "ffn_gate_exps.bias"), true, ff, ne, &w->gate_exps_bias)))
            return err;
        if ((err = get_vectors(l, blk(n, sizeof n, il, "ffn_up_exps.bias"), true, ff, ne, &w->up_exps_bias)))
            return err;
        if ((err = get_vectors(l, blk(n, sizeof n, il, "ffn_down_exps.bias"), true, e, ne, &w->down_exps_bias)))
            return err;
    }
    if (ld->n_ff_shared) {
        const uint64_t fs = ld->n_ff_shared;
        if ((err = get_matrix(l, blk(n, sizeof n, il, "ffn_gate_shexp.weight"), true, e, fs, 0, &w->gate_shexp)))
            return err;
        if ((err = get_matrix(l, blk(n, sizeof n, il, "ffn_up_shexp.weight"), true, e, fs, 0, &w->up_shexp)))
            return err;
        if ((err = get_matrix(l, blk(n, sizeof n, il, "ffn_down_shexp.weight"), true, fs, e, 0, &w->down_shexp)))
            return err;
        if (f->shared_expert_gate &&
            (err = get_matrix(l, blk(n, sizeof n, il, "ffn_gate_inp_shexp.weight"), true, e, 1, 0, &w->gate_inp_shexp)))
            return err;
    }
    return NULL;
}

static em_err load_all(loader *l) {
    em_str arch;
    em_err err = em_gguf_get_str(l->g, "general.architecture", &arch);
    if (err) return em_err_prefix(err, "%s", em_gguf_path(l->g));
    if (arch.len >= EM_MODEL_ARCH_MAX) arch.len = EM_MODEL_ARCH_MAX - 1;
    memcpy(l->arch, arch.ptr, arch.len);
    l->arch[arch.len] = 0;
    const em_family *f = em_family_by_gguf_arch(l->arch);
    if (!f) {
        char supported[256];
        em_family_list_gguf_archs(supported, sizeof supported);
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: unknown architecture '%s' (supported: %s)", em_gguf_path(l->g),
                         l->arch, supported);
    }
    if ((err = load_desc(l, f))) return err;
    em_model_desc *d = &l->m->desc;

    /* The vocabulary size is the embedding's row count (vocab_size, when present, must agree). */
    const em_gguf_tensor *embd = tensor_in_parts(l, "token_embd.weight");
    if (!embd) return em_errorf(EM_ERR_NOT_FOUND, "%s: missing tensor token_embd.weight", em_gguf_path(l->g));
    uint32_t n_vocab;
    if ((err = opt_u32(l, "vocab_size", (uint32_t)embd->ne[1], &n_vocab))) return err;
    if (n_vocab == 0) return em_errorf(EM_ERR_FORMAT, "%s: vocabulary of 0 tokens", em_gguf_path(l->g));
    d->n_vocab = n_vocab;
    em_model_weights *w = &l->m->w;
    if ((err = get_matrix(l, "token_embd.weight", true, d->n_embd, n_vocab, 0, &w->token_embd))) return err;
    if ((err = get_vector(l, "output_norm.weight", true, d->n_embd, &w->output_norm))) return err;
    if ((err = get_matrix(l, "output.weight", false, d->n_embd, n_vocab, 0, &w->output))) return err;
    d->tied_output = w->output.data == NULL;
    if (d->tied_output) w->output = w->token_embd;
    if (!d->n_embd_per_layer && tensor_in_parts(l, "per_layer_token_embd.weight"))
        return em_errorf(EM_ERR_FORMAT, "%s: per_layer_token_embd.weight, but %s.embedding_length_per_layer_input is 0 "
                         "or missing", em_gguf_path(l->g), l->arch);
    if (d->n_embd_per_layer) {
        const uint64_t all = (uint64_t)d->n_embd_per_layer * d->n_layer;
        if ((err = get_matrix(l, "per_layer_token_embd.weight", true, all, n_vocab, 0, &w->per_layer_embd))) return err;
        if ((err = get_matrix(l, "per_layer_model_proj.weight", true, d->n_embd, all, 0, &w->per_layer_proj))) return err;
        if ((err = get_vector(l, "per_layer_proj_norm.weight", true, d->n_embd_per_layer, &w->per_layer_proj_norm)))
            return err;
    }

    const float *freq_factors = NULL;
    const em_gguf_tensor *rf = tensor_in_parts(l, "rope_freqs.weight");
    if (rf) {
        uint32_t head_dim = 0, n_rot = 0;
        if ((err = opt_u32(l, "attention.key_length", d->n_embd / d->layers[0].n_head, &head_dim))) return err;
        if ((err = opt_u32(l, "rope.dimension_count", head_dim, &n_rot))) return err;
        if ((err = get_vector(l, "rope_freqs.weight", true, n_rot / 2, &freq_factors))) return err;
    }
    w->layers = calloc(d->n_layer, sizeof *w->layers);
    if (!w->layers) return em_errorf(EM_ERR_NOMEM, "out of memory for %u layers", d->n_layer);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        em_layer_desc *ld = &d->layers[il];
        if ((err = load_rope(l, f, ld, freq_factors, f->swa_keys && ld->attn == EM_ATTN_SLIDING))) return err;
        if (f->local_rope_theta > 0 && ld->attn == EM_ATTN_SLIDING) local_rope(ld, f->local_rope_theta);
        if ((err = load_layer(l, f, il))) return err;
    }
    return NULL;
}

/* Loads from `n_parts` open files (parts[0] holds the metadata), which the caller keeps open. */
static em_err load_from_parts(em_gguf *const *parts, uint32_t n_parts, em_model **out) {
    *out = NULL;
    em_model *m = calloc(1, sizeof *m);
    if (!m) return em_errorf(EM_ERR_NOMEM, "out of memory allocating a model");
    m->gguf = parts[0];
    loader l = {.g = parts[0], .parts = parts, .n_parts = n_parts, .m = m};
    em_err err = load_all(&l);
    if (!err) err = em_model_build_program(m, &m->program);
    if (err) {
        em_model_free(m);
        return err;
    }
    *out = m;
    return NULL;
}

em_err em_model_from_gguf(em_gguf *gguf, em_model **out) { return load_from_parts(&gguf, 1, out); }

em_err em_model_load(const char *path, em_model **out) { return em_model_load_as(path, EM_GGUF_MAPPED, out); }

em_err em_model_load_as(const char *path, em_gguf_memory memory, em_model **out) {
    *out = NULL;
    em_gguf **parts;
    uint32_t n_parts;
    em_err err = em_gguf_open_parts_as(path, memory, &parts, &n_parts);
    if (err) return err;
    err = load_from_parts(parts, n_parts, out);
    if (err) {
        em_gguf_close_parts(parts, n_parts);
        return err;
    }
    (*out)->parts = parts;
    (*out)->n_parts = n_parts;
    return NULL;
}

void em_model_free(em_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    em_program_free(&m->program);
    free(m->desc.layers);
    free(m->w.layers);
    em_gguf_close_parts(m->parts, m->n_parts);
    free(m);
}

void em_model_describe_layer(const em_model_desc *d, uint32_t layer, char *buf, size_t size) {
    if (layer >= d->n_layer) {
        snprintf(buf, size, "(no layer %u)", layer);
        return;
    }
    const em_layer_desc *ld = &d->layers[layer];
    char attn[32] = "full", ffn[64], shared[24] = "";
    if (ld->n_ff_shared) snprintf(shared, sizeof shared, " + shared %u", ld->n_ff_shared);
    if (ld->moe && ld->n_ff_dense)
        snprintf(ffn, sizeof ffn, "dense %u + moe %u/%u x %u", ld->n_ff_dense, ld->n_expert_used, ld->n_expert, ld->n_ff);
    else if (ld->moe)
        snprintf(ffn, sizeof ffn, "moe %u/%u x %u%s%s", ld->n_expert_used, ld->n_expert, ld->n_ff,
                 ld->renormalize ? " renorm" : "", shared);
    else
        snprintf(ffn, sizeof ffn, "dense %u", ld->n_ff);
    if (ld->mixer == EM_MIXER_DELTA_NET) {
        const em_delta_net_desc *dn = &ld->delta_net;
        snprintf(buf, size, "delta_net %u/%u heads x %u/%u, conv %u, %s, %s", dn->n_head_v, dn->n_head_k,
                 dn->head_dim_k, dn->head_dim_v, dn->conv_kernel, dn->v_tiled ? "tiled" : "grouped", ffn);
        return;
    }
    if (ld->attn == EM_ATTN_SLIDING) snprintf(attn, sizeof attn, "sliding %u", ld->window);
    char kv[32] = "";
    if (ld->kv_layer != layer) snprintf(kv, sizeof kv, " kv of layer %u", ld->kv_layer);
    else if (ld->values_from_keys) snprintf(kv, sizeof kv, " k=v");
    snprintf(buf, size, "%s attn %u/%u heads x %u%s%s%s%s, %s rope %g (%u dims), %s", attn, ld->n_head, ld->n_head_kv,
             ld->head_dim, ld->qk_norm ? " qk-norm" : "", ld->qkv_bias ? " bias" : "", ld->value_norm ? " v-norm" : "", kv,
             ld->rope.style == EM_ROPE_NEOX ? "neox" : "normal", ld->rope.theta, ld->rope.n_rot, ffn);
}
