/* Hugging Face tokenizer.json (+ tokenizer_config.json) → GGUF tokenizer metadata, the tokenizer
 * half of `ember convert`.
 *
 * Supported: BPE models. Byte-level ones (a ByteLevel pre-tokenizer or decoder: GPT-2, Llama 3,
 * Qwen) become "gpt2" vocabularies; BPE with byte fallback (SentencePiece-derived: Gemma, Llama 2
 * in tokenizer.json form) becomes "llama" with its merges, which Ember's SPM path follows exactly
 * (scores are written too, derived from the merge ranks, for runtimes that only read scores).
 *
 * Token types follow tokenizer.json itself: added tokens marked special are control tokens (never
 * produced from user text unless the caller parses special tokens), the other added tokens are
 * user-defined (always matched), as Hugging Face tokenizers treat them. Gaps in the ids and rows of
 * the model's embedding past the last token become unused "[PADi]" tokens (i = the id), as
 * llama.cpp's converter writes them, so a sampled padding row has a token (without text). The
 * pre-tokenizer name is recognized from the Split regex (or GPT-2's ByteLevel regex); anything
 * else gets "default" and a warning. A NFC normalizer is recorded as tokenizer.ember.normalizer = "NFC". The chat
 * template of tokenizer_config.json goes to tokenizer.chat_template. */
#include "internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE_MARK "\xE2\x96\x81"

/* Split regexes of known tokenizer.json files → tokenizer.ggml.pre names. */
static const struct {
    const char *regex;
    const char *pre;
} known_regexes[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     "llama-bpe"},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?"
     "!\\S)|\\s+",
     "qwen2"},
    {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)", "gpt-2"},
};

typedef struct conv {
    const char *path;
    json_t *root, *config;
    const char **texts;
    uint64_t *lengths;
    int32_t *types;
    float *scores;
    char **owned; /* strings made here ([PADn], joined merges) */
    size_t n_owned, cap_owned;
    int64_t n;
    bool byte_level;
} conv;

static const char *own(conv *c, char *s) {
    if (!s) return NULL;
    if (c->n_owned == c->cap_owned) {
        size_t cap = c->cap_owned ? c->cap_owned * 2 : 1024;
        char **grown = realloc(c->owned, cap * sizeof *grown);
        if (!grown) {
            free(s);
            return NULL;
        }
        c->owned = grown;
        c->cap_owned = cap;
    }
    c->owned[c->n_owned++] = s;
    return s;
}

/* Does a pre-tokenizer or decoder (possibly a Sequence) contain an entry of `type`? */
static json_t *find_typed(json_t *node, const char *list_key, const char *type) {
    if (!json_is_object(node)) return NULL;
    const char *t = json_string_value(json_object_get(node, "type"));
    if (t && !strcmp(t, type)) return node;
    json_t *list = json_object_get(node, list_key);
    size_t i;
    json_t *item;
    json_array_foreach(list, i, item) {
        json_t *found = find_typed(item, list_key, type);
        if (found) return found;
    }
    return NULL;
}

static const char *pre_name(conv *c) {
    json_t *pre = json_object_get(c->root, "pre_tokenizer");
    json_t *split = find_typed(pre, "pretokenizers", "Split");
    const char *regex = split ? json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex")) : NULL;
    if (!regex) {
        json_t *bl = find_typed(pre, "pretokenizers", "ByteLevel");
        json_t *use_regex = bl ? json_object_get(bl, "use_regex") : NULL;
        if (bl && (!use_regex || json_is_true(use_regex))) return "gpt-2";
    } else {
        for (size_t i = 0; i < sizeof known_regexes / sizeof known_regexes[0]; i++)
            if (!strcmp(regex, known_regexes[i].regex)) return known_regexes[i].pre;
    }
    em_log(EM_LOG_WARN, "%s: pre-tokenizer not recognized (%s); writing tokenizer.ggml.pre = default", c->path,
           regex ? regex : "no Split regex");
    return "default";
}

/* A token named in tokenizer_config.json ("bos_token": "<s>" or {"content": "<s>"}) → id. */
static int32_t config_token(conv *c, const char *key) {
    json_t *v = json_object_get(c->config, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    const char *text = json_string_value(v);
    if (!text) return EM_TOKEN_NONE;
    for (int64_t i = 0; i < c->n; i++)
        if (c->texts[i] && !strcmp(c->texts[i], text)) return (int32_t)i;
    return EM_TOKEN_NONE;
}

static em_err load_json(const char *path, size_t flags, json_t **out) {
    json_error_t error;
    *out = json_load_file(path, JSON_DECODE_ANY | JSON_ALLOW_NUL | flags, &error);
    if (!*out) return em_errorf(EM_ERR_FORMAT, "%s: line %d: %s", path, error.line, error.text);
    return NULL;
}

static em_err collect_tokens(conv *c, json_t *model, uint32_t n_rows) {
    json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(c->root, "added_tokens");
    if (!json_is_object(vocab)) return em_errorf(EM_ERR_FORMAT, "%s: model.vocab is not an object", c->path);
    int64_t max_id = -1;
    const char *key;
    json_t *value;
    json_object_foreach(vocab, key, value) {
        if (!json_is_integer(value) || json_integer_value(value) < 0 || json_integer_value(value) >= INT32_MAX / 2)
            return em_errorf(EM_ERR_FORMAT, "%s: model.vocab['%s'] is not a token id", c->path, key);
        if (json_integer_value(value) > max_id) max_id = json_integer_value(value);
    }
    size_t i;
    json_array_foreach(added, i, value) {
        json_t *id = json_object_get(value, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX / 2 ||
            !json_is_string(json_object_get(value, "content")))
            return em_errorf(EM_ERR_FORMAT, "%s: added_tokens[%zu] has no valid id and content", c->path, i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    c->n = max_id + 1;
    if (c->n == 0) return em_errorf(EM_ERR_FORMAT, "%s: empty vocabulary", c->path);
    if (n_rows && c->n > n_rows)
        return em_errorf(EM_ERR_FORMAT, "%s: token id %lld, but the model's embedding has %u rows", c->path,
                         (long long)max_id, n_rows);
    if (n_rows) c->n = n_rows; /* rows without a token become [PADi] below */
    c->texts = calloc((size_t)c->n, sizeof *c->texts);
    c->lengths = calloc((size_t)c->n, sizeof *c->lengths);
    c->types = calloc((size_t)c->n, sizeof *c->types);
    c->scores = calloc((size_t)c->n, sizeof *c->scores);
    if (!c->texts || !c->lengths || !c->types || !c->scores) return em_errorf(EM_ERR_NOMEM, "%s: out of memory", c->path);
    json_object_foreach(vocab, key, value) {
        int64_t id = json_integer_value(value);
        c->texts[id] = key;
        c->lengths[id] = strlen(key);
        c->types[id] = EM_TOKEN_NORMAL;
        if (!c->byte_level && c->lengths[id] == 6 && !strncmp(key, "<0x", 3) && key[5] == '>') c->types[id] = EM_TOKEN_BYTE;
    }
    json_array_foreach(added, i, value) {
        int64_t id = json_integer_value(json_object_get(value, "id"));
        json_t *content = json_object_get(value, "content");
        c->texts[id] = json_string_value(content);
        c->lengths[id] = json_string_length(content);
        c->types[id] = json_is_true(json_object_get(value, "special")) ? EM_TOKEN_CONTROL : EM_TOKEN_USER_DEFINED;
    }
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    for (int64_t id = 0; id < c->n; id++) {
        if (!c->texts[id]) { /* a gap in the ids, or a row past the last token */
            char name[32];
            snprintf(name, sizeof name, "[PAD%lld]", (long long)id);
            if (!(c->texts[id] = own(c, strdup(name)))) return em_errorf(EM_ERR_NOMEM, "%s: out of memory", c->path);
            c->lengths[id] = strlen(name);
            c->types[id] = EM_TOKEN_UNUSED;
        } else if (unk && !strcmp(c->texts[id], unk)) {
            c->types[id] = EM_TOKEN_UNKNOWN;
        }
    }
    return NULL;
}

/* Merges as "LEFT RIGHT" strings (tokenizer.json has either form); scores from merge ranks. */
static em_err write_merges(conv *c, json_t *model, em_gguf_writer *w) {
    json_t *merges = json_object_get(model, "merges");
    size_t n = json_array_size(merges);
    const char **list = malloc((n ? n : 1) * sizeof *list);
    uint64_t *lens = malloc((n ? n : 1) * sizeof *lens);
    em_err err = NULL;
    if (!list || !lens) err = em_errorf(EM_ERR_NOMEM, "%s: out of memory", c->path);
    for (size_t i = 0; i < n && !err; i++) {
        json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) {
            list[i] = json_string_value(m);
            lens[i] = json_string_length(m);
            continue;
        }
        const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
        if (!a || !b || json_array_size(m) != 2 || strchr(a, ' ') || strchr(b, ' ')) {
            err = em_errorf(EM_ERR_FORMAT, "%s: model.merges[%zu] is not a pair of strings without spaces", c->path, i);
            break;
        }
        size_t la = strlen(a), lb = strlen(b);
        char *joined = malloc(la + lb + 2);
        if (joined) {
            memcpy(joined, a, la);
            joined[la] = ' ';
            memcpy(joined + la + 1, b, lb + 1);
        }
        if (!(list[i] = own(c, joined))) err = em_errorf(EM_ERR_NOMEM, "%s: out of memory", c->path);
        else lens[i] = la + lb + 1;
    }
    if (!err && !c->byte_level) {
        /* Score of a token: minus the rank of the first merge that forms it (earlier = better). */
        for (int64_t id = 0; id < c->n; id++) c->scores[id] = -(float)(n + 1);
        for (size_t i = n; i-- > 0;) {
            const char *sp = memchr(list[i], ' ', lens[i]);
            size_t la = (size_t)(sp - list[i]);
            char *joined = malloc(lens[i]);
            if (!joined) {
                err = em_errorf(EM_ERR_NOMEM, "%s: out of memory", c->path);
                break;
            }
            memcpy(joined, list[i], la);
            memcpy(joined + la, sp + 1, lens[i] - la - 1);
            joined[lens[i] - 1] = 0;
            json_t *id = json_object_get(json_object_get(model, "vocab"), joined);
            if (json_is_integer(id)) c->scores[json_integer_value(id)] = -(float)i;
            free(joined);
        }
    }
    if (!err) err = em_gguf_writer_add_str_array(w, "tokenizer.ggml.merges", list, lens, n);
    free(list);
    free(lens);
    return err;
}

/* add_bos/add_eos: the config's flags, else what the post-processor's template adds. */
static void special_flags(conv *c, int *add_bos, int *add_eos) {
    json_t *v;
    *add_bos = *add_eos = -1;
    if ((v = json_object_get(c->config, "add_bos_token")) && json_is_boolean(v)) *add_bos = json_is_true(v);
    if ((v = json_object_get(c->config, "add_eos_token")) && json_is_boolean(v)) *add_eos = json_is_true(v);
    json_t *tp = find_typed(json_object_get(c->root, "post_processor"), "processors", "TemplateProcessing");
    json_t *single = tp ? json_object_get(tp, "single") : NULL;
    size_t n = json_array_size(single);
    if (!n) return;
    if (*add_bos < 0) *add_bos = json_object_get(json_array_get(single, 0), "SpecialToken") != NULL;
    if (*add_eos < 0) *add_eos = n > 1 && json_object_get(json_array_get(single, n - 1), "SpecialToken") != NULL;
}

static em_err convert(conv *c, uint32_t n_rows, em_gguf_writer *w) {
    json_t *model = json_object_get(c->root, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE"))
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: tokenizer model '%s' is not supported (only BPE)", c->path,
                         type ? type : "?");
    c->byte_level = find_typed(json_object_get(c->root, "pre_tokenizer"), "pretokenizers", "ByteLevel") ||
                    find_typed(json_object_get(c->root, "decoder"), "decoders", "ByteLevel");
    if (!c->byte_level && !json_is_true(json_object_get(model, "byte_fallback")))
        return em_errorf(EM_ERR_UNSUPPORTED, "%s: a BPE model that is neither byte-level nor has byte fallback", c->path);
    em_err err = collect_tokens(c, model, n_rows);
    if (err) return err;
    err = em_gguf_writer_add_str(w, "tokenizer.ggml.model", c->byte_level ? "gpt2" : "llama");
    if (!err) err = em_gguf_writer_add_str(w, "tokenizer.ggml.pre", c->byte_level ? pre_name(c) : "default");
    if (!err) err = em_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", c->texts, c->lengths, (uint64_t)c->n);
    if (!err) err = em_gguf_writer_add_array(w, "tokenizer.ggml.token_type", EM_GGUF_INT32, c->types, (uint64_t)c->n);
    if (!err) err = write_merges(c, model, w);
    if (!err && !c->byte_level)
        err = em_gguf_writer_add_array(w, "tokenizer.ggml.scores", EM_GGUF_FLOAT32, c->scores, (uint64_t)c->n);
    static const struct {
        const char *config_key, *gguf_key;
    } ids[] = {
        {"bos_token", "tokenizer.ggml.bos_token_id"},
        {"eos_token", "tokenizer.ggml.eos_token_id"},
        {"unk_token", "tokenizer.ggml.unknown_token_id"},
        {"pad_token", "tokenizer.ggml.padding_token_id"},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0] && !err; i++) {
        int32_t id = config_token(c, ids[i].config_key);
        if (id >= 0) err = em_gguf_writer_add_u32(w, ids[i].gguf_key, (uint32_t)id);
    }
    int add_bos, add_eos;
    special_flags(c, &add_bos, &add_eos);
    if (!err && add_bos >= 0) err = em_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    if (!err && add_eos >= 0) err = em_gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", add_eos);
    json_t *norm = json_object_get(c->root, "normalizer");
    if (!err && !c->byte_level) {
        /* SentencePiece's dummy prefix appears as a Prepend("▁") normalizer. */
        json_t *prepend = find_typed(norm, "normalizers", "Prepend");
        const char *with = prepend ? json_string_value(json_object_get(prepend, "prepend")) : NULL;
        err = em_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", with && !strcmp(with, SPACE_MARK));
    }
    /* The chat template: a string, or a list of named templates of which "default" is the one. */
    json_t *template = json_object_get(c->config, "chat_template");
    if (json_is_array(template)) {
        size_t i;
        json_t *item, *chosen = NULL;
        json_array_foreach(template, i, item) {
            const char *name = json_string_value(json_object_get(item, "name"));
            if (name && !strcmp(name, "default")) chosen = json_object_get(item, "template");
        }
        template = chosen;
    }
    if (!err && json_is_string(template))
        err = em_gguf_writer_add_strn(w, "tokenizer.chat_template", json_string_value(template),
                                      json_string_length(template));
    if (!err && find_typed(norm, "normalizers", "NFC"))
        err = em_gguf_writer_add_str(w, "tokenizer.ember.normalizer", "NFC");
    return err;
}

em_err em_tokenizer_hf_to_gguf(const char *json_path, const char *config_path, uint32_t n_vocab, em_gguf_writer *w) {
    conv c = {.path = json_path};
    em_err err = load_json(json_path, 0, &c.root);
    /* Configs hold numbers such as model_max_length = 1e30 written as integers; only strings and
     * booleans are read from them. */
    if (!err && config_path) err = load_json(config_path, JSON_DECODE_INT_AS_REAL, &c.config);
    if (!err) err = convert(&c, n_vocab, w);
    for (size_t i = 0; i < c.n_owned; i++) free(c.owned[i]);
    free(c.owned);
    free(c.texts);
    free(c.lengths);
    free(c.types);
    free(c.scores);
    json_decref(c.root);
    json_decref(c.config);
    return err;
}
