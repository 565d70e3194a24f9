/* `ember info FILE.gguf [--json]`: what a GGUF file holds, the family it belongs to (model.h's
 * registry) and what decoding one token reads. */
#include <jansson.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "../gguf/gguf.h"
#include "../model/model.h"
#include "../quant/quant.h"
#include "cli.h"

/* Hyper-parameters shown when present, as "<arch>.<suffix>"; then the family's own keys. */
static const char *hyper_parameters[] = {
    "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length", "attention.layer_norm_rms_epsilon",
    "attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base", "rope.dimension_count",
    "rope.scaling.type", "rope.scaling.factor",
    "expert_count", "expert_used_count", "expert_feed_forward_length", "vocab_size",
    "attn_logit_softcapping", "final_logit_softcapping",
};

enum { MAX_KEYS = 40 };

typedef struct info_summary {
    char architecture[128];
    const em_family *family; /* NULL: no Ember family reads this architecture */
    const char *keys[MAX_KEYS]; /* hyper_parameters, then the family's own keys not among them */
    size_t n_keys;
    char tokenizer[64];
    uint64_t vocab_size;
    uint64_t bytes_by_type[EM_TYPE_COUNT];
    uint64_t count_by_type[EM_TYPE_COUNT];
    uint64_t total_bytes;
    uint64_t bytes_per_token;
    uint64_t expert_count, expert_used;
} info_summary;

static bool name_contains(em_str name, const char *needle) {
    size_t n = strlen(needle);
    for (uint64_t i = 0; i + n <= name.len; i++)
        if (!memcmp(name.ptr + i, needle, n)) return true;
    return false;
}

static uint64_t kv_u64_or(const em_gguf *g, const char *key, uint64_t fallback) {
    uint64_t v;
    em_err err = em_gguf_get_u64(g, key, &v);
    if (err) {
        em_err_free(err);
        return fallback;
    }
    return v;
}

/* Weights read per decoded token: every non-expert tensor once (the embedding table contributes one
 * row, since a token reads only its own row, unless it doubles as the output matrix), expert tensors
 * scaled by used/total experts. */
static void summarize(const em_gguf *g, info_summary *s) {
    memset(s, 0, sizeof *s);
    em_str value;
    em_err err = em_gguf_get_str(g, "general.architecture", &value);
    snprintf(s->architecture, sizeof s->architecture, "%.*s", err ? 7 : (int)value.len, err ? "unknown" : value.ptr);
    em_err_free(err);
    s->family = em_family_by_gguf_arch(s->architecture);
    for (size_t i = 0; i < sizeof hyper_parameters / sizeof hyper_parameters[0]; i++)
        s->keys[s->n_keys++] = hyper_parameters[i];
    const char *own[16];
    const size_t n_own = s->family ? em_family_own_keys(s->family, own, 16) : 0;
    for (size_t i = 0; i < n_own && s->n_keys < MAX_KEYS; i++) {
        bool listed = false;
        for (size_t k = 0; k < s->n_keys && !listed; k++) listed = !strcmp(s->keys[k], own[i]);
        if (!listed) s->keys[s->n_keys++] = own[i];
    }
    err = em_gguf_get_str(g, "tokenizer.ggml.model", &value);
    snprintf(s->tokenizer, sizeof s->tokenizer, "%.*s", err ? 4 : (int)value.len, err ? "none" : value.ptr);
    em_err_free(err);
    const em_gguf_kv *tokens = em_gguf_find(g, "tokenizer.ggml.tokens");
    s->vocab_size = tokens && tokens->type == EM_GGUF_ARRAY ? tokens->array_len : 0;
    char key[256];
    snprintf(key, sizeof key, "%s.expert_count", s->architecture);
    s->expert_count = kv_u64_or(g, key, 0);
    snprintf(key, sizeof key, "%s.expert_used_count", s->architecture);
    s->expert_used = kv_u64_or(g, key, 0);
    bool has_output = em_gguf_find_tensor(g, "output.weight") != NULL;
    for (uint64_t i = 0; i < em_gguf_tensor_count(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        s->bytes_by_type[t->type] += t->size;
        s->count_by_type[t->type]++;
        s->total_bytes += t->size;
        bool is_embedding = em_str_eq(t->name, "token_embd.weight");
        if (is_embedding && has_output) {
            uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
            s->bytes_per_token += rows ? t->size / rows : 0;
        } else if (name_contains(t->name, "_exps") && s->expert_count) {
            s->bytes_per_token += t->size / s->expert_count * (s->expert_used ? s->expert_used : s->expert_count);
        } else {
            s->bytes_per_token += t->size;
        }
    }
}

static void print_value(FILE *out, const em_gguf_kv *kv) {
    if (kv->type == EM_GGUF_STRING) fprintf(out, "%.*s", (int)kv->strings[0].len, kv->strings[0].ptr);
    else if (kv->type == EM_GGUF_FLOAT32 || kv->type == EM_GGUF_FLOAT64) fprintf(out, "%g", em_gguf_kv_float(kv));
    else if (kv->type == EM_GGUF_BOOL) fprintf(out, "%s", kv->data[0] ? "true" : "false");
    else if (kv->type == EM_GGUF_ARRAY) fprintf(out, "[%llu × %s]", (unsigned long long)kv->array_len,
                                               em_gguf_type_name(kv->array_type));
    else fprintf(out, "%lld", (long long)em_gguf_kv_int(kv));
}

static json_t *kv_to_json(const em_gguf_kv *kv) {
    switch (kv->type) {
    case EM_GGUF_STRING: return json_stringn_nocheck(kv->strings[0].ptr, (size_t)kv->strings[0].len);
    case EM_GGUF_FLOAT32: case EM_GGUF_FLOAT64: return json_real(em_gguf_kv_float(kv));
    case EM_GGUF_BOOL: return json_boolean(kv->data[0]);
    case EM_GGUF_ARRAY:
        return json_pack("{s:s, s:I}", "array_of", em_gguf_type_name(kv->array_type), "length",
                         (json_int_t)kv->array_len);
    default: return json_integer((json_int_t)em_gguf_kv_int(kv));
    }
}

static int print_text(const em_gguf *g, const info_summary *s) {
    printf("file:            %s\n", em_gguf_path(g));
    printf("gguf version:    %u (alignment %u)\n", em_gguf_version(g), em_gguf_alignment(g));
    printf("architecture:    %s\n", s->architecture);
    if (s->family) {
        char traits[512];
        em_family_describe(s->family, traits, sizeof traits);
        printf("family:          %s: %s\n", s->family->name, traits);
    }
    for (size_t i = 0; i < s->n_keys; i++) {
        char key[256];
        snprintf(key, sizeof key, "%s.%s", s->architecture, s->keys[i]);
        const em_gguf_kv *kv = em_gguf_find(g, key);
        if (!kv) continue;
        printf("  %-34s ", s->keys[i]);
        print_value(stdout, kv);
        printf("\n");
    }
    printf("tokenizer:       %s, %llu tokens\n", s->tokenizer, (unsigned long long)s->vocab_size);
    printf("metadata keys:   %llu\n", (unsigned long long)em_gguf_kv_count(g));
    printf("tensors:         %llu\n", (unsigned long long)em_gguf_tensor_count(g));
    for (uint32_t type = 0; type < EM_TYPE_COUNT; type++)
        if (s->count_by_type[type])
            printf("  %-8s %6llu tensors %14llu bytes\n", em_type_name(type), (unsigned long long)s->count_by_type[type],
                   (unsigned long long)s->bytes_by_type[type]);
    printf("total size:      %llu bytes (%.3f GB)\n", (unsigned long long)s->total_bytes, s->total_bytes / 1e9);
    printf("read per token:  %llu bytes (%.3f GB)\n", (unsigned long long)s->bytes_per_token, s->bytes_per_token / 1e9);
    return 0;
}

static int print_json(const em_gguf *g, const info_summary *s) {
    json_t *root = json_object(), *hp = json_object(), *types = json_object(), *meta = json_object();
    json_object_set_new(root, "file", json_string(em_gguf_path(g)));
    json_object_set_new(root, "version", json_integer(em_gguf_version(g)));
    json_object_set_new(root, "architecture", json_string(s->architecture));
    if (s->family) {
        char traits[512];
        em_family_describe(s->family, traits, sizeof traits);
        json_object_set_new(root, "family", json_pack("{s:s, s:s}", "name", s->family->name, "traits", traits));
    }
    for (size_t i = 0; i < s->n_keys; i++) {
        char key[256];
        snprintf(key, sizeof key, "%s.%s", s->architecture, s->keys[i]);
        const em_gguf_kv *kv = em_gguf_find(g, key);
        if (kv) json_object_set_new(hp, s->keys[i], kv_to_json(kv));
    }
    for (uint64_t i = 0; i < em_gguf_kv_count(g); i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(g, i);
        char *key = em_str_dup(kv->key);
        if (key) json_object_set_new(meta, key, kv_to_json(kv));
        free(key);
    }
    json_object_set_new(root, "hyper_parameters", hp);
    json_object_set_new(root, "tokenizer", json_pack("{s:s, s:I}", "model", s->tokenizer, "vocab_size",
                                                     (json_int_t)s->vocab_size));
    json_object_set_new(root, "tensor_count", json_integer((json_int_t)em_gguf_tensor_count(g)));
    for (uint32_t type = 0; type < EM_TYPE_COUNT; type++)
        if (s->count_by_type[type])
            json_object_set_new(types, em_type_name(type), json_pack("{s:I, s:I}", "tensors",
                                (json_int_t)s->count_by_type[type], "bytes", (json_int_t)s->bytes_by_type[type]));
    json_object_set_new(root, "bytes_by_type", types);
    json_object_set_new(root, "total_bytes", json_integer((json_int_t)s->total_bytes));
    json_object_set_new(root, "bytes_per_token", json_integer((json_int_t)s->bytes_per_token));
    json_object_set_new(root, "metadata", meta);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return em_cli_fail("info", em_errorf(EM_ERR_NOMEM, "out of memory formatting JSON"));
    printf("%s\n", text);
    free(text);
    return 0;
}

int em_cli_info(int argc, char **argv) {
    const char *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (argv[i][0] == '-' && argv[i][1]) return em_cli_fail("info", em_errorf(EM_ERR_INVALID, "unknown option '%s'", argv[i]));
        else if (!path) path = argv[i];
        else return em_cli_fail("info", em_errorf(EM_ERR_INVALID, "unexpected argument '%s'", argv[i]));
    }
    if (!path) return em_cli_fail("info", em_errorf(EM_ERR_INVALID, "usage: ember info FILE.gguf [--json]"));
    em_gguf *g;
    em_err err = em_gguf_open(path, &g);
    if (err) return em_cli_fail("info", err);
    info_summary s;
    summarize(g, &s);
    int status = json ? print_json(g, &s) : print_text(g, &s);
    em_gguf_close(g);
    return status;
}
