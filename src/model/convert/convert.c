/* Hugging Face checkpoint → GGUF. A conversion is a plan (internal.h): one entry per output tensor
 * saying where its rows come from (one source tensor, one matrix per expert, or half of a fused
 * expert matrix), how they are transformed (Q/K row permutation, Gemma's +1 on norms, a hybrid
 * model's value heads reordered) and in which type they are stored. This file reads config.json
 * and the checkpoint, makes the plan and writes the metadata; the writer then asks stream.c for
 * each tensor's bytes in order, converted a chunk of rows at a time straight from the mapped source
 * files, so memory stays at a few chunks whatever the checkpoint's size. hybrid.c knows the Gated
 * DeltaNet layers of Qwen3.5. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../gguf/gguf.h"
#include "../../quant/quant.h"
#include "../../tokenizer/tokenizer.h"
#include "../model.h"
#include "../quantize/quantize.h"
#include "convert.h"
#include "internal.h"

/* ---- the checkpoint: every safetensors file of the directory ---- */

static void checkpoint_close(checkpoint *c) {
    for (size_t i = 0; i < c->n_files; i++) em_safetensors_close(c->files[i]);
    free(c->files);
    free(c->used);
    free(c->base);
    memset(c, 0, sizeof *c);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The file names to open: those the index names, or every *.safetensors of the directory. */
static em_err list_files(const char *dir, char ***names, size_t *n) {
    *names = NULL;
    *n = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    size_t cap = 0;
    struct stat sb;
    if (stat(path, &sb) == 0) {
        json_error_t jerr;
        json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
        if (!root) return em_errorf(EM_ERR_FORMAT, "%s: JSON: %s (line %d)", path, jerr.text, jerr.line);
        json_t *map = json_object_get(root, "weight_map");
        if (!json_is_object(map)) {
            json_decref(root);
            return em_errorf(EM_ERR_FORMAT, "%s: field 'weight_map' is missing or not an object", path);
        }
        const char *key;
        json_t *v;
        json_object_foreach(map, key, v) {
            const char *file = json_string_value(v);
            if (!file || strchr(file, '/') || !ends_with(file, ".safetensors")) {
                json_decref(root);
                return em_errorf(EM_ERR_FORMAT, "%s: weight_map['%s'] is not a .safetensors file name in the directory",
                                 path, key);
            }
            bool seen = false;
            for (size_t i = 0; i < *n && !seen; i++) seen = !strcmp((*names)[i], file);
            if (seen) continue;
            if (*n == cap) {
                cap = cap ? 2 * cap : 8;
                char **grown = realloc(*names, cap * sizeof *grown);
                if (!grown) {
                    json_decref(root);
                    return em_errorf(EM_ERR_NOMEM, "out of memory");
                }
                *names = grown;
            }
            if (!((*names)[(*n)++] = strdup(file))) {
                json_decref(root);
                return em_errorf(EM_ERR_NOMEM, "out of memory");
            }
        }
        json_decref(root);
    } else {
        DIR *d = opendir(dir);
        if (!d) return em_errorf(EM_ERR_IO, "%s: cannot open the directory", dir);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!ends_with(e->d_name, ".safetensors")) continue;
            if (*n == cap) {
                cap = cap ? 2 * cap : 8;
                char **grown = realloc(*names, cap * sizeof *grown);
                if (!grown) {
                    closedir(d);
                    return em_errorf(EM_ERR_NOMEM, "out of memory");
                }
                *names = grown;
            }
            if (!((*names)[(*n)++] = strdup(e->d_name))) {
                closedir(d);
                return em_errorf(EM_ERR_NOMEM, "out of memory");
            }
        }
        closedir(d);
    }
    if (*n == 0) return em_errorf(EM_ERR_NOT_FOUND, "%s: no .safetensors files", dir);
    qsort(*names, *n, sizeof **names, cmp_str);
    return NULL;
}

static em_err checkpoint_open(const char *dir, checkpoint *c) {
    memset(c, 0, sizeof *c);
    char **names;
    size_t n;
    em_err err = list_files(dir, &names, &n);
    if (!err && !(c->files = calloc(n, sizeof *c->files))) err = em_errorf(EM_ERR_NOMEM, "out of memory");
    if (!err && !(c->base = calloc(n, sizeof *c->base))) err = em_errorf(EM_ERR_NOMEM, "out of memory");
    char path[4096];
    for (size_t i = 0; !err && i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!(err = em_safetensors_open(path, &c->files[i]))) {
            c->base[i] = c->n_tensors;
            c->n_tensors += em_safetensors_count(c->files[i]);
            c->n_files++;
        }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!err && !(c->used = calloc(c->n_tensors ? c->n_tensors : 1, 1))) err = em_errorf(EM_ERR_NOMEM, "out of memory");
    /* A name in two files would make the result depend on the order of reading. */
    for (size_t i = 0; !err && i < c->n_files; i++)
        for (size_t t = 0; !err && t < em_safetensors_count(c->files[i]); t++)
            for (size_t j = i + 1; !err && j < c->n_files; j++) {
                const char *name = em_safetensors_at(c->files[i], t)->name;
                if (em_safetensors_find(c->files[j], name))
                    err = em_errorf(EM_ERR_FORMAT, "tensor '%s' is in both %s and %s", name,
                                    em_safetensors_name(c->files[i]), em_safetensors_name(c->files[j]));
            }
    if (err) checkpoint_close(c);
    return err;
}

static const em_st_tensor *checkpoint_find(checkpoint *c, const char *name) {
    for (size_t i = 0; i < c->n_files; i++) {
        const em_st_tensor *t = em_safetensors_find(c->files[i], name);
        if (t) {
            c->used[c->base[i] + (size_t)(t - em_safetensors_at(c->files[i], 0))] = true;
            return t;
        }
    }
    return NULL;
}

/* ---- the plan ---- */

static void plan_free(plan *p) {
    for (size_t i = 0; i < p->n; i++) {
        free(p->t[i].src);
        free(p->t[i].generated);
    }
    free(p->t);
}

static em_err add_plan(converter *cv, plan_tensor **out) {
    plan *p = &cv->plan;
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        plan_tensor *grown = realloc(p->t, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "out of memory planning tensors");
        p->t = grown;
        p->cap = cap;
    }
    *out = &p->t[p->n++];
    memset(*out, 0, sizeof **out);
    return NULL;
}

/* Every tensor's type, from the recipe `ember quantize` uses (model/quantize): vectors and the MoE
 * router stay f32, block types that do not divide a row fall back as llama.cpp's do. */
static em_err assign_types(converter *cv) {
    const em_hf_config *c = &cv->cfg;
    em_recipe_tensor *tensors = calloc(cv->plan.n ? cv->plan.n : 1, sizeof *tensors);
    if (!tensors) return em_errorf(EM_ERR_NOMEM, "out of memory planning tensor types");
    for (size_t i = 0; i < cv->plan.n; i++) {
        const plan_tensor *t = &cv->plan.t[i];
        tensors[i].name = t->name;
        memcpy(tensors[i].ne, t->ne, sizeof t->ne);
        tensors[i].source_type = EM_TYPE_F32; /* every source is read as f32 */
    }
    em_recipe_model model = {.arch = cv->f->gguf_arch, .n_layer = c->n_layer, .n_head = c->n_head,
                             .n_head_kv = c->n_head_kv, .n_expert = c->n_expert};
    em_err err = em_recipe_apply(cv->recipe, &model, tensors, cv->plan.n);
    for (size_t i = 0; i < cv->plan.n && !err; i++) cv->plan.t[i].type = tensors[i].type;
    /* MXFP4 experts are copied as they are (llama.cpp's converter does the same whatever the type) */
    for (size_t i = 0; i < cv->plan.n && !err; i++)
        if (cv->plan.t[i].kind == SRC_MXFP4) cv->plan.t[i].type = EM_TYPE_MXFP4;
    free(tensors);
    return err;
}

/* Checks a source tensor's shape (PyTorch order, outermost first). */
static em_err check_shape(const em_st_tensor *s, uint32_t n_dims, const uint64_t *shape) {
    bool ok = s->n_dims == n_dims;
    for (uint32_t d = 0; ok && d < n_dims; d++) ok = s->shape[d] == shape[d];
    if (ok) return NULL;
    char got[128] = "", want[128] = "";
    for (uint32_t d = 0; d < s->n_dims; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", d ? ", " : "", (unsigned long long)s->shape[d]);
    for (uint32_t d = 0; d < n_dims; d++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%llu", d ? ", " : "", (unsigned long long)shape[d]);
    return em_errorf(EM_ERR_FORMAT, "tensor '%s' has shape [%s], config.json implies [%s]", s->name, got, want);
}

static em_err need(converter *cv, const char *hf_name, const em_st_tensor **out) {
    *out = checkpoint_find(&cv->ck, hf_name);
    if (!*out) return em_errorf(EM_ERR_NOT_FOUND, "%s: missing tensor '%s' (%s)", cv->dir, hf_name, cv->cfg.arch);
    if (em_st_dtype_size((*out)->dtype) == 0 || ((*out)->dtype != EM_ST_F32 && (*out)->dtype != EM_ST_F16 &&
                                                 (*out)->dtype != EM_ST_BF16 && (*out)->dtype != EM_ST_F64))
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, F16, BF16 or F64 only)", cv->dir,
                         hf_name, em_st_dtype_name((*out)->dtype));
    return NULL;
}

/* Plans one tensor from one source. rows == 0: a vector of `cols`. */
static em_err plan_one(converter *cv, const char *hf_name, const char *gguf_name, uint64_t cols, uint64_t rows,
                       bool required, plan_tensor **out) {
    if (out) *out = NULL;
    if (!required && !checkpoint_find(&cv->ck, hf_name)) return NULL;
    const em_st_tensor *s;
    em_err err = need(cv, hf_name, &s);
    if (err) return err;
    uint64_t shape[2] = {rows ? rows : cols, cols};
    if ((err = check_shape(s, rows ? 2 : 1, shape))) return em_err_prefix(err, "%s", cv->dir);
    plan_tensor *t;
    if ((err = add_plan(cv, &t))) return err;
    snprintf(t->name, sizeof t->name, "%s", gguf_name);
    t->n_dims = rows ? 2 : 1;
    t->ne[0] = cols;
    t->ne[1] = rows ? rows : 1;
    t->ne[2] = t->ne[3] = 1;
    t->kind = SRC_ONE;
    if (!(t->src = malloc(sizeof *t->src))) return em_errorf(EM_ERR_NOMEM, "out of memory");
    t->src[0] = s;
    t->add_one = cv->f->norm_plus_one && ends_with(hf_name, "norm.weight");
    if (out) *out = t;
    return NULL;
}

/* Plans a stack of expert matrices [n_expert][rows][cols], from per-expert tensors or from a 5.x
 * fused tensor ([E][2 * rows][cols] gate_up_proj: gate first; [E][rows][cols] down_proj). */
static em_err plan_experts(converter *cv, uint32_t il, const char *which, const char *gguf_name, uint64_t cols,
                           uint64_t rows) {
    const uint32_t ne = cv->cfg.n_expert;
    char name[256];
    plan_tensor *t;
    em_err err = add_plan(cv, &t);
    if (err) return err;
    snprintf(t->name, sizeof t->name, "blk.%u.%s", il, gguf_name);
    t->n_dims = 3;
    t->ne[0] = cols;
    t->ne[1] = rows;
    t->ne[2] = ne;
    t->ne[3] = 1;
    if (!(t->src = calloc(ne, sizeof *t->src))) return em_errorf(EM_ERR_NOMEM, "out of memory");
    static const char *const mixtral[][2] = {{"gate", "w1"}, {"up", "w3"}, {"down", "w2"}};
    const char *hf_which = which;
    if (cv->f->moe == EM_MOE_MIXTRAL)
        for (int i = 0; i < 3; i++)
            if (!strcmp(which, mixtral[i][0])) hf_which = mixtral[i][1];
    const char *prefix = cv->f->moe == EM_MOE_MIXTRAL ? "block_sparse_moe" : "mlp";
    snprintf(name, sizeof name, "%slayers.%u.%s.experts.0.%s%s.weight", cv->prefix, il, prefix, hf_which,
             cv->f->moe == EM_MOE_MIXTRAL ? "" : "_proj");
    if (checkpoint_find(&cv->ck, name)) {
        t->kind = SRC_EXPERTS;
        for (uint32_t e = 0; e < ne; e++) {
            snprintf(name, sizeof name, "%slayers.%u.%s.experts.%u.%s%s.weight", cv->prefix, il, prefix, e, hf_which,
                     cv->f->moe == EM_MOE_MIXTRAL ? "" : "_proj");
            if ((err = need(cv, name, &t->src[e]))) return err;
            if ((err = check_shape(t->src[e], 2, (uint64_t[]){rows, cols}))) return em_err_prefix(err, "%s", cv->dir);
        }
        return NULL;
    }
    /* transformers 5.x in-memory layout, should a checkpoint be saved that way. */
    bool down = !strcmp(which, "down");
    snprintf(name, sizeof name, "%slayers.%u.mlp.experts.%s", cv->prefix, il, down ? "down_proj" : "gate_up_proj");
    if ((err = need(cv, name, &t->src[0])))
        return em_err_prefix(err, "no per-expert tensors for expert 0 (%s) either", which);
    if ((err = check_shape(t->src[0], 3, (uint64_t[]){ne, down ? rows : 2 * rows, cols})))
        return em_err_prefix(err, "%s", cv->dir);
    t->kind = down ? SRC_ONE : !strcmp(which, "gate") ? SRC_FUSED_FIRST : SRC_FUSED_SECOND;
    return NULL;
}

/* ---- gpt-oss's experts ---- */

/* A plan entry for GGUF tensor `name` of ne[0..2] (n_dims of them). */
static em_err add_named(converter *cv, const char *name, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                        source_kind kind, const em_st_tensor *src, plan_tensor **out) {
    plan_tensor *t;
    em_err err = add_plan(cv, &t);
    if (err) return err;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->ne[3] = 1;
    t->kind = kind;
    if (!(t->src = malloc(sizeof *t->src))) return em_errorf(EM_ERR_NOMEM, "out of memory");
    t->src[0] = src;
    *out = t;
    return NULL;
}

/* A tensor of raw bytes (MXFP4 blocks or scales) of the given shape. */
static em_err need_bytes(converter *cv, const char *hf_name, uint32_t n_dims, const uint64_t *shape,
                         const em_st_tensor **out) {
    *out = checkpoint_find(&cv->ck, hf_name);
    if (!*out) return em_errorf(EM_ERR_NOT_FOUND, "%s: missing tensor '%s' (%s)", cv->dir, hf_name, cv->cfg.arch);
    if ((*out)->dtype != EM_ST_U8)
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (MXFP4 blocks and scales are U8)", cv->dir,
                         hf_name, em_st_dtype_name((*out)->dtype));
    em_err err = check_shape(*out, n_dims, shape);
    return err ? em_err_prefix(err, "%s", cv->dir) : NULL;
}

/* gpt-oss's experts of layer il. The checkpoint keeps gate and up in one matrix, their output
 * features interleaved (gate at even indices, up at odd), and its bf16 matrices transposed (input
 * features outermost: x @ W); MXFP4 checkpoints keep _blocks and _scales with output features
 * outermost. GGUF wants each of gate, up and down as a stack [expert][output][input], and the biases
 * as [expert][output]. */
static em_err plan_gpt_oss_experts(converter *cv, uint32_t il, uint64_t e, uint64_t ff, uint64_t ne) {
    char hf[256], gg[96], hf2[256];
#define HF(fmt) (snprintf(hf, sizeof hf, "%slayers.%u.mlp." fmt, cv->prefix, il), hf)
#define GG(fmt) (snprintf(gg, sizeof gg, "blk.%u." fmt, il), gg)
    em_err err;
    plan_tensor *t;
    const em_st_tensor *s, *scales;
    if ((err = plan_one(cv, HF("router.weight"), GG("ffn_gate_inp.weight"), e, ne, true, NULL))) return err;
    if ((err = plan_one(cv, HF("router.bias"), GG("ffn_gate_inp.bias"), ne, 0, true, NULL))) return err;
    /* biases: gate_up [E][2 ff] interleaved, down [E][e] */
    if ((err = need(cv, HF("experts.gate_up_proj_bias"), &s))) return err;
    if ((err = check_shape(s, 2, (uint64_t[]){ne, 2 * ff}))) return em_err_prefix(err, "%s", cv->dir);
    for (uint64_t k = 0; k < 2; k++) {
        if ((err = add_named(cv, k ? GG("ffn_up_exps.bias") : GG("ffn_gate_exps.bias"), 2, ff, ne, 1, SRC_STRIDED, s,
                             &t)))
            return err;
        t->row_stride = 2 * ff, t->col_stride = 2, t->first = k;
    }
    if ((err = plan_one(cv, HF("experts.down_proj_bias"), GG("ffn_down_exps.bias"), e, ne, true, NULL))) return err;

    snprintf(hf2, sizeof hf2, "%slayers.%u.mlp.experts.gate_up_proj_blocks", cv->prefix, il);
    if (checkpoint_find(&cv->ck, hf2)) {
        if (e % 32 || ff % 32)
            return em_errorf(EM_ERR_FORMAT, "%s: MXFP4 experts of width %llu x %llu are not whole 32-value blocks",
                             cv->dir, (unsigned long long)e, (unsigned long long)ff);
        const em_st_tensor *blocks;
        if ((err = need_bytes(cv, hf2, 4, (uint64_t[]){ne, 2 * ff, e / 32, 16}, &blocks))) return err;
        if ((err = need_bytes(cv, HF("experts.gate_up_proj_scales"), 3, (uint64_t[]){ne, 2 * ff, e / 32}, &scales)))
            return err;
        for (uint32_t k = 0; k < 2; k++) {
            if ((err = add_named(cv, k ? GG("ffn_up_exps.weight") : GG("ffn_gate_exps.weight"), 3, e, ff, ne,
                                 SRC_MXFP4, blocks, &t)))
                return err;
            t->scales = scales, t->row_step = 2, t->row_first = k;
        }
        if ((err = need_bytes(cv, HF("experts.down_proj_blocks"), 4, (uint64_t[]){ne, e, ff / 32, 16}, &blocks)))
            return err;
        if ((err = need_bytes(cv, HF("experts.down_proj_scales"), 3, (uint64_t[]){ne, e, ff / 32}, &scales)))
            return err;
        if ((err = add_named(cv, GG("ffn_down_exps.weight"), 3, ff, e, ne, SRC_MXFP4, blocks, &t))) return err;
        t->scales = scales, t->row_step = 1, t->row_first = 0;
        return NULL;
    }
    /* bf16 (or f32): gate_up [E][e][2 ff], down [E][ff][e], input features outermost, as released;
     * a checkpoint saved with output features outermost ([E][2 ff][e], [E][e][ff]) is read too, where
     * the shapes tell the two apart */
    if ((err = need(cv, HF("experts.gate_up_proj"), &s)))
        return em_err_prefix(err, "no MXFP4 '%s' either", hf2);
    const bool outputs_outer = e != 2 * ff && s->n_dims == 3 && s->shape[0] == ne && s->shape[1] == 2 * ff &&
                               s->shape[2] == e;
    if (!outputs_outer && (err = check_shape(s, 3, (uint64_t[]){ne, e, 2 * ff})))
        return em_err_prefix(err, "%s", cv->dir);
    for (uint64_t k = 0; k < 2; k++) {
        if ((err = add_named(cv, k ? GG("ffn_up_exps.weight") : GG("ffn_gate_exps.weight"), 3, e, ff, ne, SRC_STRIDED,
                             s, &t)))
            return err;
        t->mat_stride = e * 2 * ff;
        if (outputs_outer) t->row_stride = 2 * e, t->col_stride = 1, t->first = k * e;
        else t->row_stride = 2, t->col_stride = 2 * ff, t->first = k;
    }
    if ((err = need(cv, HF("experts.down_proj"), &s))) return err;
    if ((err = check_shape(s, 3, outputs_outer ? (uint64_t[]){ne, e, ff} : (uint64_t[]){ne, ff, e})))
        return em_err_prefix(err, "%s", cv->dir);
    if ((err = add_named(cv, GG("ffn_down_exps.weight"), 3, ff, e, ne, SRC_STRIDED, s, &t))) return err;
    t->mat_stride = ff * e;
    if (outputs_outer) t->row_stride = ff, t->col_stride = 1;
    else t->row_stride = 1, t->col_stride = e;
    return NULL;
#undef HF
#undef GG
}

/* Llama 3 rope scaling as one divisor per frequency pair (llama.cpp's rope_freqs.weight): with
 * wavelength λ = 2π/f, high-frequency pairs (λ < L/high) keep f, low-frequency pairs (λ > L/low) are
 * divided by `factor`, and those between are blended with s = (L/λ - low) / (high - low):
 * divisor = 1 / ((1 - s)/factor + s). L is original_max_position_embeddings. */
static em_err plan_rope_freqs(converter *cv) {
    const em_hf_rope *r = &cv->cfg.rope;
    const uint32_t n = cv->cfg.head_dim / 2;
    plan_tensor *t;
    em_err err = add_plan(cv, &t);
    if (err) return err;
    snprintf(t->name, sizeof t->name, "rope_freqs.weight");
    t->n_dims = 1;
    t->ne[0] = n;
    t->ne[1] = t->ne[2] = t->ne[3] = 1;
    t->type = EM_TYPE_F32;
    t->kind = SRC_GENERATED;
    if (!(t->generated = malloc(n * sizeof *t->generated))) return em_errorf(EM_ERR_NOMEM, "out of memory");
    const double low_wavelen = r->original_ctx / r->low_freq_factor, high_wavelen = r->original_ctx / r->high_freq_factor;
    for (uint32_t i = 0; i < n; i++) {
        double freq = pow(r->theta, -(2.0 * i) / cv->cfg.head_dim), wavelen = 2 * 3.14159265358979323846 / freq, divisor;
        if (wavelen < high_wavelen) divisor = 1.0;
        else if (wavelen > low_wavelen) divisor = r->factor;
        else {
            double s = (r->original_ctx / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
            divisor = 1.0 / ((1 - s) / r->factor + s);
        }
        t->generated[i] = (float)divisor;
    }
    return NULL;
}

/* The attention of layer il: Q (with a gate per head where the family gates attention), K, V, the
 * output projection, their biases, sinks and QK-norm. */
static em_err plan_attention(converter *cv, uint32_t il) {
    const em_hf_config *c = &cv->cfg;
    const em_family *f = cv->f;
    char hf[256], gg[96];
    em_err err;
    const uint64_t e = c->n_embd, hd = c->head_dim, q = (uint64_t)c->n_head * hd, kv = (uint64_t)c->n_head_kv * hd;
#define HF(fmt) (snprintf(hf, sizeof hf, "%slayers.%u." fmt, cv->prefix, il), hf)
#define GG(fmt) (snprintf(gg, sizeof gg, "blk.%u." fmt, il), gg)
    plan_tensor *t;
    const uint64_t q_rows = f->attn_output_gate ? 2 * q : q; /* [query | gate] per head */
    if ((err = plan_one(cv, HF("self_attn.q_proj.weight"), GG("attn_q.weight"), e, q_rows, true, &t))) return err;
    if (f->permute_qk) t->permute_heads = c->n_head;
    if ((err = plan_one(cv, HF("self_attn.k_proj.weight"), GG("attn_k.weight"), e, kv, true, &t))) return err;
    if (f->permute_qk) t->permute_heads = c->n_head_kv;
    if ((err = plan_one(cv, HF("self_attn.v_proj.weight"), GG("attn_v.weight"), e, kv, true, NULL))) return err;
    if ((err = plan_one(cv, HF("self_attn.o_proj.weight"), GG("attn_output.weight"), q, e, true, NULL)))
        return err;
    bool bias = f->qkv_bias || c->attention_bias;
    if ((err = plan_one(cv, HF("self_attn.q_proj.bias"), GG("attn_q.bias"), q, 0, bias, &t))) return err;
    if (t && f->permute_qk) t->permute_heads = c->n_head;
    if ((err = plan_one(cv, HF("self_attn.k_proj.bias"), GG("attn_k.bias"), kv, 0, bias, &t))) return err;
    if (t && f->permute_qk) t->permute_heads = c->n_head_kv;
    if ((err = plan_one(cv, HF("self_attn.v_proj.bias"), GG("attn_v.bias"), kv, 0, bias, NULL))) return err;
    if (f->attn_out_bias) {
        if ((err = plan_one(cv, HF("self_attn.o_proj.bias"), GG("attn_output.bias"), e, 0, true, NULL))) return err;
    } else if (checkpoint_find(&cv->ck, HF("self_attn.o_proj.bias"))) {
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: tensor '%s': output projection biases are not supported", cv->dir, hf);
    }
    if (f->attn_sinks &&
        (err = plan_one(cv, HF("self_attn.sinks"), GG("attn_sinks.weight"), c->n_head, 0, true, NULL)))
        return err;
    if (f->qk_norm) {
        if ((err = plan_one(cv, HF("self_attn.q_norm.weight"), GG("attn_q_norm.weight"), hd, 0, true, NULL)))
            return err;
        if ((err = plan_one(cv, HF("self_attn.k_norm.weight"), GG("attn_k_norm.weight"), hd, 0, true, NULL)))
            return err;
    }
    return NULL;
#undef HF
#undef GG
}

/* The Gated DeltaNet mixer of layer il (hybrid.c lists its tensors and what becomes of them). */
static em_err plan_delta_net(converter *cv, uint32_t il) {
    delta_net_tensor tensors[DELTA_NET_TENSORS];
    const size_t n = em_convert_delta_net_tensors(cv->f, &cv->cfg, tensors);
    char hf[256];
    for (size_t i = 0; i < n; i++) {
        const delta_net_tensor *d = &tensors[i];
        snprintf(hf, sizeof hf, "%slayers.%u.%s", cv->prefix, il, d->hf);
        const em_st_tensor *s;
        plan_tensor *t;
        em_err err = need(cv, hf, &s);
        if (!err && (err = check_shape(s, d->hf_dims, d->hf_shape))) err = em_err_prefix(err, "%s", cv->dir);
        if (!err) err = add_plan(cv, &t);
        if (!err && !(t->src = malloc(sizeof *t->src))) err = em_errorf(EM_ERR_NOMEM, "out of memory");
        if (err) return err;
        snprintf(t->name, sizeof t->name, "blk.%u.%s", il, d->gguf);
        t->n_dims = d->n_dims;
        t->ne[0] = d->ne[0];
        t->ne[1] = d->ne[1];
        t->ne[2] = t->ne[3] = 1;
        t->kind = SRC_ONE;
        t->src[0] = s;
        t->add_one = cv->f->norm_plus_one && ends_with(d->hf, "norm.weight") && !d->plain_norm;
        t->negative_exp = d->negative_exp;
        t->values = d->values;
        t->value_first = d->value_first;
        t->value_head = d->value_head;
        t->value_groups = cv->cfg.linear_key_heads;
        t->value_per_group = cv->cfg.linear_value_heads / cv->cfg.linear_key_heads;
    }
    return NULL;
}

static em_err plan_layer(converter *cv, uint32_t il) {
    const em_hf_config *c = &cv->cfg;
    const em_family *f = cv->f;
    char hf[256], gg[96];
    em_err err;
    const uint64_t e = c->n_embd;
#define HF(fmt) (snprintf(hf, sizeof hf, "%slayers.%u." fmt, cv->prefix, il), hf)
#define GG(fmt) (snprintf(gg, sizeof gg, "blk.%u." fmt, il), gg)
    if ((err = plan_one(cv, HF("input_layernorm.weight"), GG("attn_norm.weight"), e, 0, true, NULL))) return err;
    err = em_convert_layer_is_linear(c, il) ? plan_delta_net(cv, il) : plan_attention(cv, il);
    if (err) return err;
    if (f->post_norms) {
        if ((err = plan_one(cv, HF("post_attention_layernorm.weight"), GG("post_attention_norm.weight"), e, 0, true, NULL)))
            return err;
        if ((err = plan_one(cv, HF("pre_feedforward_layernorm.weight"), GG("ffn_norm.weight"), e, 0, true, NULL)))
            return err;
        if ((err = plan_one(cv, HF("post_feedforward_layernorm.weight"), GG("post_ffw_norm.weight"), e, 0, true, NULL)))
            return err;
    } else {
        char ffn_norm[64];
        snprintf(ffn_norm, sizeof ffn_norm, "blk.%u.%.32s.weight", il, f->ffn_norm_tensor ? f->ffn_norm_tensor : "ffn_norm");
        if ((err = plan_one(cv, HF("post_attention_layernorm.weight"), ffn_norm, e, 0, true, NULL))) return err;
    }
    if (f->moe == EM_MOE_NONE) {
        const uint64_t ff = c->n_ff;
        if ((err = plan_one(cv, HF("mlp.gate_proj.weight"), GG("ffn_gate.weight"), e, ff, true, NULL))) return err;
        if ((err = plan_one(cv, HF("mlp.up_proj.weight"), GG("ffn_up.weight"), e, ff, true, NULL))) return err;
        if ((err = plan_one(cv, HF("mlp.down_proj.weight"), GG("ffn_down.weight"), ff, e, true, NULL)))
            return err;
        return NULL;
    }
    if (f->moe == EM_MOE_GPT_OSS) return plan_gpt_oss_experts(cv, il, e, c->n_ff_expert, c->n_expert);
    const uint64_t ff = f->moe == EM_MOE_MIXTRAL ? c->n_ff : c->n_ff_expert, ne = c->n_expert;
    const char *router = f->moe == EM_MOE_MIXTRAL ? HF("block_sparse_moe.gate.weight") : HF("mlp.gate.weight");
    if (f->moe == EM_MOE_MIXTRAL && !checkpoint_find(&cv->ck, router)) router = HF("mlp.gate.weight");
    if ((err = plan_one(cv, router, GG("ffn_gate_inp.weight"), e, ne, true, NULL))) return err;
    if ((err = plan_experts(cv, il, "gate", "ffn_gate_exps.weight", e, ff))) return err;
    if ((err = plan_experts(cv, il, "up", "ffn_up_exps.weight", e, ff))) return err;
    if ((err = plan_experts(cv, il, "down", "ffn_down_exps.weight", ff, e))) return err;
    return NULL;
#undef HF
#undef GG
}

static em_err plan_all(converter *cv) {
    const em_hf_config *c = &cv->cfg;
    em_err err;
    if (c->rope.type == EM_HF_ROPE_LLAMA3 && (err = plan_rope_freqs(cv))) return err;
    char name[128];
    /* The text model's tensors: "model." in a CausalLM; "language_model.model." (as saved by
     * transformers 4.x and 5.x) or "model.language_model." (5.x in memory) in a multimodal one. */
    static const char *const prefixes[] = {"model.", "language_model.model.", "model.language_model."};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        snprintf(name, sizeof name, "%sembed_tokens.weight", prefixes[i]);
        if (checkpoint_find(&cv->ck, name)) {
            cv->prefix = prefixes[i];
            break;
        }
    }
    snprintf(name, sizeof name, "%sembed_tokens.weight", cv->prefix);
    if ((err = plan_one(cv, name, "token_embd.weight", c->n_embd, c->n_vocab, true, NULL))) return err;
    for (uint32_t il = 0; il < c->n_layer; il++)
        if ((err = plan_layer(cv, il))) return err;
    snprintf(name, sizeof name, "%snorm.weight", cv->prefix);
    if ((err = plan_one(cv, name, "output_norm.weight", c->n_embd, 0, true, NULL))) return err;
    /* An output matrix is written when the checkpoint has one and does not declare it tied
     * (Gemma is always tied; llama.cpp drops its lm_head). */
    bool tied = cv->f->tied_output || (c->tie_given && c->tie_embeddings);
    if (!tied && (err = plan_one(cv, "lm_head.weight", "output.weight", c->n_embd, c->n_vocab, false, NULL)))
        return err;
    if (tied) checkpoint_find(&cv->ck, "lm_head.weight"); /* the tied copy some checkpoints keep */
    if ((err = assign_types(cv))) return err;
    for (size_t i = 0; i < cv->plan.n; i++) {
        plan_tensor *t = &cv->plan.t[i];
        uint64_t bytes;
        if ((err = em_type_row_bytes(t->type, t->ne[0], &bytes)))
            return em_err_prefix(err, "tensor %s", t->name);
        cv->plan.bytes += bytes * t->ne[1] * t->ne[2];
    }
    return NULL;
}

/* ---- checks that the family loaders can represent what config.json says ---- */

/* Whether config.json makes layer `il` slide: layer_types when given (5.x, and 4.x saves it too),
 * else the period sliding_window_pattern (4.x: layer il slides unless (il + 1) % period == 0),
 * else the family's own period. */
static bool hf_layer_slides(const converter *cv, uint32_t il) {
    const em_hf_config *c = &cv->cfg;
    if (c->layer_sliding) return c->layer_sliding[il];
    const uint32_t period = c->sliding_window_pattern ? c->sliding_window_pattern : cv->f->window_period;
    return il % period < period - 1;
}

/* Whether every layer slides as the family's default period says (no pattern key needed). */
static bool default_layer_pattern(const converter *cv) {
    const uint32_t period = cv->f->window_period;
    for (uint32_t il = 0; il < cv->cfg.n_layer; il++)
        if (hf_layer_slides(cv, il) != (il % period < period - 1)) return false;
    return true;
}

static em_err check_config(converter *cv) {
    const em_hf_config *c = &cv->cfg;
    const em_family *f = cv->f;
    const char *file = "config.json";
    /* GeGLU checkpoints name their GELU either way (the tanh approximation is what both compute). */
    const bool act_ok =
        !strcmp(c->act, em_family_hf_activation(f)) || (f->act == EM_ACT_GEGLU && !strcmp(c->act, "gelu"));
    if (!act_ok)
        return em_errorf(EM_ERR_UNSUPPORTED, "%s/%s: hidden activation '%s' is not what GGUF %s implies", cv->dir, file,
                         c->act, f->gguf_arch);
    if (c->mlp_bias) return em_errorf(EM_ERR_UNSUPPORTED, "%s/%s: mlp_bias = true is not supported", cv->dir, file);
    if (f->moe != EM_MOE_NONE && c->n_expert == 0)
        return em_errorf(EM_ERR_NOT_FOUND, "%s/%s: field 'num_local_experts' (or 'num_experts') is missing", cv->dir, file);
    if (f->moe == EM_MOE_QWEN && (c->decoder_sparse_step != 1 || c->has_mlp_only_layers || c->n_ff_expert == 0))
        return em_errorf(EM_ERR_UNSUPPORTED, "%s/%s: only MoE in every layer is supported (decoder_sparse_step 1, no "
                         "mlp_only_layers, moe_intermediate_size given)", cv->dir, file);
    /* gpt-oss's intermediate_size is its experts' width */
    if (f->moe == EM_MOE_GPT_OSS && c->n_ff_expert == 0) cv->cfg.n_ff_expert = c->n_ff;
    if (f->moe == EM_MOE_GPT_OSS && c->n_ff_expert == 0)
        return em_errorf(EM_ERR_NOT_FOUND, "%s/%s: field 'intermediate_size' is missing", cv->dir, file);
    if (c->rope.type == EM_HF_ROPE_YARN && c->rope.untruncated)
        em_log(EM_LOG_WARN, "%s/%s: yarn with truncate = false: GGUF's YaRN (as llama.cpp computes it) rounds its "
               "correction range to whole dimensions, so logits differ slightly from transformers'", cv->dir, file);
    if (f->moe == EM_MOE_NONE && c->n_ff == 0)
        return em_errorf(EM_ERR_NOT_FOUND, "%s/%s: field 'intermediate_size' is missing", cv->dir, file);
    if (c->rope.type == EM_HF_ROPE_LLAMA3 && c->head_dim % 2)
        return em_errorf(EM_ERR_FORMAT, "%s/%s: head_dim %u is odd", cv->dir, file, c->head_dim);
    if (f->window == EM_WINDOW_NONE) {
        if (c->use_sliding_window)
            return em_errorf(EM_ERR_UNSUPPORTED, "%s/%s: use_sliding_window = true is not supported for %s", cv->dir,
                             file, c->arch);
    }
    if (f->window == EM_WINDOW_PATTERN) {
        if (c->sliding_window == 0)
            return em_errorf(EM_ERR_NOT_FOUND, "%s/%s: field 'sliding_window' is missing", cv->dir, file);
        /* Gemma 2's pattern is fixed by the architecture (llama.cpp reads no key for it). */
        if (!f->window_pattern_key && !default_layer_pattern(cv))
            return em_errorf(EM_ERR_UNSUPPORTED,
                             "%s/%s: %s breaks the pattern GGUF %s fixes (every %u-th layer global)", cv->dir, file,
                             c->layer_sliding ? "layer_types" : "sliding_window_pattern", f->gguf_arch,
                             f->window_period);
    } else if (f->window == EM_WINDOW_EVERY_LAYER && c->layer_sliding) {
        for (uint32_t il = 0; il < c->n_layer; il++)
            if (c->layer_sliding[il] != (c->sliding_window > 0))
                return em_errorf(EM_ERR_UNSUPPORTED, "%s/%s: layer_types mixes sliding and full layers", cv->dir, file);
    }
    const uint32_t scale_dim = em_model_attn_scale_dim(f->gguf_arch, c->n_layer, c->n_embd, c->n_head, c->head_dim);
    if (f->attn_scale_embd_layers && c->query_pre_attn_scalar > 0 && fabs(c->query_pre_attn_scalar - scale_dim) > 1e-9)
        em_log(EM_LOG_WARN, "%s/%s: query_pre_attn_scalar %g; a GGUF %s of %u layers is read with 1/sqrt(%u)",
               cv->dir, file, c->query_pre_attn_scalar, f->gguf_arch, c->n_layer, scale_dim);
    if (f->local_rope_theta > 0 && c->rope_local_given &&
        (fabs(c->rope_local.theta - f->local_rope_theta) > 1e-6 || c->rope_local.type != EM_HF_ROPE_DEFAULT))
        em_log(EM_LOG_WARN, "%s/%s: local rope base %g (scaled: %s); GGUF %s assumes %g unscaled", cv->dir, file,
               c->rope_local.theta, c->rope_local.type == EM_HF_ROPE_DEFAULT ? "no" : "yes", f->gguf_arch,
               f->local_rope_theta);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", cv->dir, file);
    em_err err = em_convert_check_hybrid(f, c, path);
    if (err) return err;
    if (c->rope.type == EM_HF_ROPE_YARN && c->rope.attention_factor > 0)
        em_log(EM_LOG_WARN, "%s/%s: yarn attention_factor %g is not carried into GGUF", cv->dir, file,
               c->rope.attention_factor);
    return NULL;
}

/* ---- metadata ---- */

/* A Gemma 3 layer pattern other than the default, in the form config.json gave it: a period when
 * it gave only sliding_window_pattern, one bool per layer (true = sliding) from layer_types. */
static em_err write_layer_pattern(const converter *cv, em_gguf_writer *w, const char *key) {
    const em_hf_config *c = &cv->cfg;
    if (!c->layer_sliding) return em_gguf_writer_add_u32(w, key, c->sliding_window_pattern);
    uint8_t *slides = malloc(c->n_layer);
    if (!slides) return em_errorf(EM_ERR_NOMEM, "out of memory writing %s", key);
    for (uint32_t il = 0; il < c->n_layer; il++) slides[il] = c->layer_sliding[il];
    em_err err = em_gguf_writer_add_array(w, key, EM_GGUF_BOOL, slides, c->n_layer);
    free(slides);
    return err;
}

static em_err write_metadata(converter *cv, em_gguf_writer *w, const char *name) {
    const em_hf_config *c = &cv->cfg;
    const char *a = cv->f->gguf_arch;
    char key[128];
    em_err err = NULL;
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, a), key)
#define TRY(call) \
    do { \
        if ((err = (call))) return err; \
    } while (0)
    TRY(em_gguf_writer_add_str(w, "general.architecture", a));
    TRY(em_gguf_writer_add_str(w, "general.type", "model"));
    TRY(em_gguf_writer_add_str(w, "general.name", name));
    TRY(em_gguf_writer_add_u32(w, K("block_count"), c->n_layer));
    TRY(em_gguf_writer_add_u32(w, K("context_length"), c->n_ctx));
    TRY(em_gguf_writer_add_u32(w, K("embedding_length"), c->n_embd));
    TRY(em_gguf_writer_add_u32(w, K("feed_forward_length"), c->n_ff));
    TRY(em_gguf_writer_add_u32(w, K("attention.head_count"), c->n_head));
    TRY(em_gguf_writer_add_u32(w, K("attention.head_count_kv"), c->n_head_kv));
    TRY(em_gguf_writer_add_f32(w, K("rope.freq_base"), (float)c->rope.theta));
    TRY(em_gguf_writer_add_f32(w, K("attention.layer_norm_rms_epsilon"), (float)c->norm_eps));
    if (c->head_dim_given || c->head_dim != c->n_embd / c->n_head) {
        TRY(em_gguf_writer_add_u32(w, K("attention.key_length"), c->head_dim));
        TRY(em_gguf_writer_add_u32(w, K("attention.value_length"), c->head_dim));
    }
    if (cv->f->keys.vocab_and_rope_dims) {
        TRY(em_gguf_writer_add_u32(w, K("vocab_size"), c->n_vocab));
        TRY(em_gguf_writer_add_u32(w, K("rope.dimension_count"), c->head_dim));
    }
    if (c->n_expert && cv->f->moe != EM_MOE_NONE) {
        TRY(em_gguf_writer_add_u32(w, K("expert_count"), c->n_expert));
        TRY(em_gguf_writer_add_u32(w, K("expert_used_count"), c->n_expert_used));
    }
    if (c->n_expert && cv->f->keys.expert_width)
        TRY(em_gguf_writer_add_u32(w, K("expert_feed_forward_length"), c->n_ff_expert));
    /* norm_topk_prob (False when absent, as Qwen3MoeConfig has it). llama.cpp's qwen3moe graph
     * always renormalises and ignores the key; Ember's loader follows it. */
    if (c->n_expert && cv->f->keys.expert_weights_norm)
        TRY(em_gguf_writer_add_bool(w, K("expert_weights_norm"), c->norm_topk_given && c->norm_topk_prob));
    /* Sliding windows: Gemma's pattern has a default per architecture; a Mistral-style window on
     * every layer of `llama` is a key llama.cpp's converter does not write but the loader honours. */
    const bool window_everywhere = cv->f->window == EM_WINDOW_EVERY_LAYER && c->sliding_window > 0 &&
                                   c->sliding_window < c->n_ctx;
    if (cv->f->window == EM_WINDOW_PATTERN || window_everywhere)
        TRY(em_gguf_writer_add_u32(w, K("attention.sliding_window"), c->sliding_window));
    if (cv->f->window_pattern_key && !default_layer_pattern(cv))
        TRY(write_layer_pattern(cv, w, K("attention.sliding_window_pattern")));
    if (c->attn_softcap > 0) TRY(em_gguf_writer_add_f32(w, K("attn_logit_softcapping"), (float)c->attn_softcap));
    if (c->final_softcap > 0) TRY(em_gguf_writer_add_f32(w, K("final_logit_softcapping"), (float)c->final_softcap));
    if (c->rope.type == EM_HF_ROPE_LINEAR) {
        TRY(em_gguf_writer_add_str(w, K("rope.scaling.type"), "linear"));
        TRY(em_gguf_writer_add_f32(w, K("rope.scaling.factor"), (float)c->rope.factor));
    } else if (c->rope.type == EM_HF_ROPE_YARN) {
        TRY(em_gguf_writer_add_str(w, K("rope.scaling.type"), "yarn"));
        TRY(em_gguf_writer_add_f32(w, K("rope.scaling.factor"), (float)c->rope.factor));
        if (c->rope.original_ctx)
            TRY(em_gguf_writer_add_u32(w, K("rope.scaling.original_context_length"), c->rope.original_ctx));
        if (c->rope.beta_fast > 0) TRY(em_gguf_writer_add_f32(w, K("rope.scaling.yarn_beta_fast"), (float)c->rope.beta_fast));
        if (c->rope.beta_slow > 0) TRY(em_gguf_writer_add_f32(w, K("rope.scaling.yarn_beta_slow"), (float)c->rope.beta_slow));
    }
    TRY(em_convert_write_hybrid_metadata(cv->f, c, w));
    if (em_recipe_file_type(cv->recipe) >= 0)
        TRY(em_gguf_writer_add_u32(w, "general.file_type", (uint32_t)em_recipe_file_type(cv->recipe)));
    const char *recipe = em_recipe_name(cv->recipe);
    if (strcmp(recipe, "F32") && strcmp(recipe, "F16") && strcmp(recipe, "BF16"))
        TRY(em_gguf_writer_add_u32(w, "general.quantization_version", 2));
    return NULL;
#undef K
#undef TRY
}

/* The chat template of tokenizer_config.json is written by the tokenizer module with the rest of the
 * tokenizer; newer transformers save it as chat_template.jinja instead, which is read here. */
static em_err write_chat_template(const char *dir, const char *config_path, em_gguf_writer *w) {
    em_err err = NULL;
    if (config_path) {
        json_error_t jerr;
        json_t *root = json_load_file(config_path, 0, &jerr);
        if (!root) return em_errorf(EM_ERR_FORMAT, "%s: JSON: %s (line %d)", config_path, jerr.text, jerr.line);
        json_t *t = json_object_get(root, "chat_template");
        bool in_config = t && !json_is_null(t);
        json_decref(root);
        if (in_config) return NULL;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *text = NULL;
    size_t len = 0;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && n < (16l << 20) && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)))
            len = fread(text, 1, (size_t)n, f);
    }
    fclose(f);
    if (!text) return em_errorf(EM_ERR_IO, "%s: cannot read", path);
    err = em_gguf_writer_add_strn(w, "tokenizer.chat_template", text, len);
    free(text);
    return err;
}

/* The tokenizer module converts tokenizer.json (+ tokenizer_config.json: chat template, special
 * tokens, add_bos) into tokenizer.ggml.* metadata. */
static em_err write_tokenizer(converter *cv, em_gguf_writer *w) {
    char json[4096], config[4096];
    struct stat sb;
    snprintf(json, sizeof json, "%s/tokenizer.json", cv->dir);
    snprintf(config, sizeof config, "%s/tokenizer_config.json", cv->dir);
    if (stat(json, &sb) != 0)
        return em_errorf(EM_ERR_NOT_FOUND, "%s: no tokenizer.json (convert with --no-tokenizer to write weights only)",
                         cv->dir);
    bool has_config = stat(config, &sb) == 0;
    em_err err = em_tokenizer_hf_to_gguf(json, has_config ? config : NULL, cv->cfg.n_vocab, w);
    if (err) return err;
    return write_chat_template(cv->dir, has_config ? config : NULL, w);
}

/* ---- the whole conversion ---- */

static em_err run(converter *cv, const char *out_path, const em_convert_options *opt, em_convert_stats *stats) {
    char path[4096];
    em_err err = em_recipe_find(opt && opt->type ? opt->type : "F16", &cv->recipe);
    if (err) return err;
    snprintf(path, sizeof path, "%s/config.json", cv->dir);
    if ((err = em_hf_config_load(path, &cv->cfg))) return err;
    if (!(cv->f = em_family_by_hf_class(cv->cfg.arch))) {
        char list[512];
        em_family_list_hf_classes(list, sizeof list);
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: field 'architectures' = '%s' is not supported (supported: %s)", path,
                         cv->cfg.arch, list);
    }
    /* traits the converter has no tensor plan for: llama.cpp's converter writes such files */
    if (cv->f->swa_keys || cv->f->per_layer_inputs || cv->f->shared_kv || cv->f->moe == EM_MOE_BESIDE_DENSE)
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: field 'architectures' = '%s': ember convert does not convert %s "
                         "checkpoints yet (llama.cpp's convert_hf_to_gguf.py does; ember loads its files)", path,
                         cv->cfg.arch, cv->f->name);
    if ((err = check_config(cv))) return err;
    if ((err = checkpoint_open(cv->dir, &cv->ck))) return err;
    if ((err = plan_all(cv))) return err;
    /* Tensors left over: the first few by name, then a count (a vision tower has hundreds). */
    size_t unused = 0, vision = 0, next_token = 0;
    for (size_t i = 0; i < cv->ck.n_files; i++)
        for (size_t t = 0; t < em_safetensors_count(cv->ck.files[i]); t++) {
            const char *tn = em_safetensors_at(cv->ck.files[i], t)->name;
            if (cv->ck.used[cv->ck.base[i] + t] || ends_with(tn, "rotary_emb.inv_freq")) continue;
            if (strcmp(cv->prefix, "model.") &&
                (strstr(tn, "vision_tower.") || strstr(tn, "multi_modal_projector.") || strstr(tn, "visual."))) {
                vision++; /* a multimodal checkpoint's image half, left out on purpose */
                continue;
            }
            if (!strncmp(tn, "mtp.", 4) || strstr(tn, ".mtp.")) {
                next_token++; /* multi-token prediction, which the forward step does not run */
                continue;
            }
            if (unused++ < 4)
                em_log(EM_LOG_WARN, "%s: tensor '%s' is not used by GGUF %s", em_safetensors_name(cv->ck.files[i]), tn,
                       cv->f->gguf_arch);
        }
    if (unused > 4)
        em_log(EM_LOG_WARN, "%s: %zu more tensors are not used by GGUF %s", cv->dir, unused - 4, cv->f->gguf_arch);
    if (vision) em_log(EM_LOG_INFO, "%s: the text model only: %zu vision tensors left out", cv->dir, vision);
    if (next_token)
        em_log(EM_LOG_INFO, "%s: %zu multi-token prediction tensors left out", cv->dir, next_token);

    em_gguf_writer *w;
    if ((err = em_gguf_writer_new(3, &w))) return err;
    const char *name = opt && opt->name ? opt->name : NULL;
    if (!name) {
        const char *slash = strrchr(cv->dir, '/');
        name = slash && slash[1] ? slash + 1 : cv->dir;
    }
    err = write_metadata(cv, w, name);
    if (!err && !(opt && opt->no_tokenizer)) err = write_tokenizer(cv, w);
    for (size_t i = 0; !err && i < cv->plan.n; i++) {
        const plan_tensor *t = &cv->plan.t[i];
        err = em_gguf_writer_add_tensor(w, t->name, t->n_dims, t->ne, t->type, NULL, false);
    }
    cv->buf_elems = 1 << 16;
    cv->buf = malloc(cv->buf_elems * sizeof *cv->buf);
    cv->out = malloc(cv->buf_elems * sizeof *cv->buf);
    if (!err && (!cv->buf || !cv->out)) err = em_errorf(EM_ERR_NOMEM, "out of memory");
    if (!err) err = em_gguf_writer_write_streaming(w, out_path, em_convert_fill, cv);
    em_gguf_writer_free(w);
    if (err) {
        remove(out_path);
        return err;
    }
    if (stats) {
        snprintf(stats->arch, sizeof stats->arch, "%s", cv->f->gguf_arch);
        stats->n_tensors = cv->plan.n;
        stats->n_bytes = cv->plan.bytes;
    }
    return NULL;
}

em_err em_convert_hf(const char *dir, const char *out_path, const em_convert_options *options,
                     em_convert_stats *stats) {
    converter cv = {.dir = dir, .prefix = "model."};
    em_err err = run(&cv, out_path, options, stats);
    free(cv.slab);
    free(cv.buf);
    free(cv.out);
    plan_free(&cv.plan);
    checkpoint_close(&cv.ck);
    em_hf_config_free(&cv.cfg);
    return err;
}
