/* The server's real engine: include/ember.h's engine, which also holds the model's one tokenizer
 * and chat template (the server generates through it, never on its own). What the server tells
 * about the model (Ollama's /api/tags, /api/show) is read from the file's metadata once, here. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../gguf/gguf.h"
#include "../model/quantize/quantize.h"
#include "internal.h"

struct em_server_model {
    em_server_engine engine;
    ember_engine *ember;
    char *model_id;
    bool reasons; /* the chat template writes <think> sections */
    char *architecture;
    char *chat_template;
    char digest[80];
    json_t *metadata; /* facts.metadata */
};

/* Whether the prompt's last tokens are an open `<think>` (whitespace after it aside): the template
 * opened the model's reasoning in the generation prompt. */
static bool ends_in_thinking(const em_server_model *m, const int32_t *ids, size_t n) {
    const size_t tail = n < 8 ? n : 8;
    char *text = NULL;
    size_t len = 0;
    em_err e = ember_detokenize(m->ember, ids + n - tail, tail, &text, &len);
    if (e) {
        em_err_free(e);
        return false;
    }
    while (len && strchr(" \t\r\n", text[len - 1])) len--;
    bool open = len >= strlen("<think>") && !memcmp(text + len - strlen("<think>"), "<think>", strlen("<think>"));
    free(text);
    return open;
}

static em_err model_chat_prompt(void *self, const json_t *messages, const json_t *tools, const json_t *kwargs,
                                int32_t **ids, size_t *n, bool *in_thinking) {
    em_server_model *m = self;
    *ids = NULL;
    *n = 0;
    char *messages_text = json_dumps(messages, JSON_COMPACT);
    char *tools_text = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
    char *kwargs_text = kwargs ? json_dumps(kwargs, JSON_COMPACT) : NULL;
    em_err e = !messages_text || (tools && !tools_text) || (kwargs && !kwargs_text) ? em_errorf(EM_ERR_NOMEM, "out of memory")
                                                                                    : NULL;
    ember_chat chat = {.messages = messages_text, .tools = tools_text, .kwargs = kwargs_text, .add_generation_prompt = true};
    if (!e) e = ember_chat_tokens(m->ember, &chat, ids, n);
    free(messages_text);
    free(tools_text);
    free(kwargs_text);
    if (!e && in_thinking) *in_thinking = m->reasons && ends_in_thinking(m, *ids, *n);
    return e;
}

static em_err model_tokenize(void *self, const char *text, size_t len, bool add_special, bool parse_special, int32_t **ids,
                             size_t *n) {
    em_server_model *m = self;
    return ember_tokenize(m->ember, text, len, add_special, parse_special, ids, n);
}

static size_t model_token_bytes(void *self, int32_t id, const char **bytes) {
    em_server_model *m = self;
    return ember_token_piece(m->ember, id, bytes);
}

static em_err model_submit(void *self, const ember_request_params *params, void **request) {
    em_server_model *m = self;
    ember_request *r = NULL;
    em_err e = ember_submit(m->ember, params, &r);
    *request = r;
    return e;
}

static bool model_next(void *request, ember_output *out, int timeout_ms) {
    return ember_request_next(request, out, timeout_ms);
}

static void model_cancel(void *request) {
    ember_request_cancel(request);
}

static void model_timings(void *request, ember_timings *out) {
    ember_request_timings(request, out);
}

static void model_release(void *request) {
    ember_request_release(request);
}

static void model_stats(void *self, ember_stats *out) {
    em_server_model *m = self;
    ember_engine_stats(m->ember, out);
}

/* "models/tiny-llama.gguf" → "tiny-llama"; a split set's first part "models/big-00001-of-00003.gguf"
 * → "big", the model's name rather than its first file's. */
static char *model_id_of(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = strlen(base);
    if (len > 5 && !strcmp(base + len - 5, ".gguf")) len -= 5;
    uint32_t part, count;
    size_t prefix_len;
    if (em_gguf_split_name(path, &part, &count, &prefix_len) && prefix_len > (size_t)(base - path))
        len = prefix_len - (size_t)(base - path);
    return strndup(base, len);
}

/* "sha256:<hex>" of the first `n` bytes of `path` (the header and metadata), or "" when unreadable. */
static void metadata_digest(const char *path, uint64_t n, char *out, size_t size) {
    out[0] = 0;
    FILE *f = fopen(path, "rb");
    EVP_MD_CTX *sha = EVP_MD_CTX_new();
    bool ok = f && sha && EVP_DigestInit_ex(sha, EVP_sha256(), NULL) == 1;
    char chunk[65536];
    while (ok && n) {
        size_t want = n < sizeof chunk ? (size_t)n : sizeof chunk;
        ok = fread(chunk, 1, want, f) == want && EVP_DigestUpdate(sha, chunk, want) == 1;
        n -= want;
    }
    unsigned char hash[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (ok && EVP_DigestFinal_ex(sha, hash, &len) == 1 && size >= 8 + 2 * (size_t)len + 1) {
        size_t at = (size_t)snprintf(out, size, "sha256:");
        for (unsigned int i = 0; i < len; i++) at += (size_t)snprintf(out + at, size - at, "%02x", hash[i]);
    }
    EVP_MD_CTX_free(sha);
    if (f) fclose(f);
}

/* One metadata value as JSON: numbers, booleans, strings, and arrays of them up to a size that
 * describes the model (per-layer head counts) rather than its vocabulary; NULL for the rest. */
#define METADATA_MAX_ARRAY 1024
static json_t *metadata_value(em_gguf_type type, const uint8_t *data, const em_str *string) {
    switch (type) {
    case EM_GGUF_UINT8: return json_integer(data[0]);
    case EM_GGUF_INT8: return json_integer((int8_t)data[0]);
    case EM_GGUF_BOOL: return json_boolean(data[0]);
    case EM_GGUF_STRING: return json_stringn(string->ptr, string->len); /* NULL when not UTF-8 */
    default: break;
    }
    uint64_t u = 0;
    size_t size = em_gguf_type_size(type);
    if (!size || size > sizeof u) return NULL;
    memcpy(&u, data, size); /* GGUF is little-endian, as every host Ember builds for */
    switch (type) {
    case EM_GGUF_UINT16: return json_integer((uint16_t)u);
    case EM_GGUF_INT16: return json_integer((int16_t)u);
    case EM_GGUF_UINT32: return json_integer((uint32_t)u);
    case EM_GGUF_INT32: return json_integer((int32_t)u);
    case EM_GGUF_INT64: return json_integer((json_int_t)u);
    case EM_GGUF_UINT64: return u <= (uint64_t)INT64_MAX ? json_integer((json_int_t)u) : json_real((double)u);
    case EM_GGUF_FLOAT32: {
        float f;
        memcpy(&f, data, sizeof f);
        return json_real(f);
    }
    case EM_GGUF_FLOAT64: {
        double d;
        memcpy(&d, data, sizeof d);
        return json_real(d);
    }
    default: return NULL;
    }
}

/* The file's general.* and <arch>.* keys (Ollama's model_info), with general.parameter_count made
 * from the tensors when the file does not say. */
static json_t *metadata_json(const em_gguf *gguf, const char *arch, uint64_t parameters) {
    json_t *info = json_object();
    size_t arch_len = arch ? strlen(arch) : 0;
    for (uint64_t i = 0; info && i < em_gguf_kv_count(gguf); i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(gguf, i);
        bool wanted = (kv->key.len > 8 && !memcmp(kv->key.ptr, "general.", 8)) ||
                      (arch_len && kv->key.len > arch_len + 1 && !memcmp(kv->key.ptr, arch, arch_len) &&
                       kv->key.ptr[arch_len] == '.');
        if (!wanted) continue;
        json_t *value = NULL;
        if (kv->type != EM_GGUF_ARRAY) {
            value = metadata_value(kv->type, kv->data, kv->strings);
        } else if (kv->array_len <= METADATA_MAX_ARRAY) {
            value = json_array();
            size_t size = em_gguf_type_size(kv->array_type);
            for (uint64_t k = 0; value && k < kv->array_len; k++) {
                json_t *item = kv->array_type == EM_GGUF_STRING ? metadata_value(EM_GGUF_STRING, NULL, &kv->strings[k])
                               : kv->array_type == EM_GGUF_ARRAY ? NULL
                                                                 : metadata_value(kv->array_type, kv->data + k * size, NULL);
                if (!item || json_array_append_new(value, item)) {
                    json_decref(value);
                    value = NULL;
                }
            }
        }
        char *key = strndup(kv->key.ptr, kv->key.len);
        if (key && value) json_object_set_new(info, key, value);
        else json_decref(value);
        free(key);
    }
    if (info && !json_object_get(info, "general.parameter_count"))
        json_object_set_new(info, "general.parameter_count", json_integer((json_int_t)parameters));
    return info;
}

/* The facts of the model file (architecture, size, parameters, quantization, digest). A file
 * that cannot be read again leaves them unknown: generation does not need them. */
static void read_facts(em_server_model *m, const char *path, const char *template_text, size_t template_len) {
    em_server_model_facts *facts = &m->engine.facts;
    struct stat st;
    if (!stat(path, &st)) {
        facts->file_bytes = (uint64_t)st.st_size;
        facts->modified = (int64_t)st.st_mtime;
    }
    if (template_text) facts->chat_template = m->chat_template = strndup(template_text, template_len);
    em_gguf *gguf = NULL;
    em_err e = em_gguf_open(path, &gguf);
    if (e) {
        em_err_free(e);
        return;
    }
    em_str arch;
    e = em_gguf_get_str(gguf, "general.architecture", &arch);
    if (!e) facts->architecture = m->architecture = em_str_dup(arch);
    em_err_free(e);
    uint32_t file_type = 0;
    e = em_gguf_get_u32(gguf, "general.file_type", &file_type);
    if (!e) facts->quantization = em_recipe_name_of_file_type((int32_t)file_type);
    em_err_free(e);
    for (uint64_t i = 0; i < em_gguf_tensor_count(gguf); i++) facts->parameters += em_gguf_tensor_elems(em_gguf_tensor_at(gguf, i));
    metadata_digest(path, em_gguf_data_offset(gguf), m->digest, sizeof m->digest);
    facts->digest = m->digest;
    facts->metadata = m->metadata = metadata_json(gguf, facts->architecture, facts->parameters);
    em_gguf_close(gguf);
}

em_err em_server_model_open(const ember_options *options, const char *alias, em_server_model **out) {
    *out = NULL;
    if (!options->model_path) return em_errorf(EM_ERR_INVALID, "no model path");
    em_server_model *m = calloc(1, sizeof *m);
    if (!m) return em_errorf(EM_ERR_NOMEM, "out of memory");
    em_err e = NULL;
    if (!(m->model_id = alias ? strdup(alias) : model_id_of(options->model_path)))
        e = em_errorf(EM_ERR_NOMEM, "out of memory");
    if (!e) e = ember_engine_create(options, &m->ember);
    const char *template_text = NULL;
    size_t template_len = 0;
    if (!e) e = ember_chat_template(m->ember, &template_text, &template_len);
    if (e) {
        em_server_model_close(m);
        return e;
    }
    if (!template_text)
        em_log(EM_LOG_WARN, "%s: no tokenizer.chat_template: chat endpoints will answer 400", options->model_path);
    m->reasons = template_text && (memmem(template_text, template_len, "<think>", strlen("<think>")) ||
                                   memmem(template_text, template_len, "</think>", strlen("</think>")));
    ember_engine_info info;
    ember_engine_get_info(m->ember, &info);
    m->engine = (em_server_engine){.self = m, .model_id = m->model_id, .ctx_tokens = (int)info.ctx_tokens,
                                   .n_vocab = (int32_t)info.n_vocab, .chat_prompt = model_chat_prompt,
                                   .tool_format = em_server_tool_format_of(template_text, template_len),
                                   .reasons = m->reasons, .tokenize = model_tokenize,
                                   .token_bytes = model_token_bytes, .submit = model_submit, .next = model_next,
                                   .cancel = model_cancel, .timings = model_timings, .release = model_release,
                                   .stats = model_stats, .pooling = info.pooling, .n_embd = info.n_embd,
                                   .embed_refused = info.embed_refused};
    read_facts(m, options->model_path, template_text, template_len);
    *out = m;
    return NULL;
}

const em_server_engine *em_server_model_engine(const em_server_model *m) {
    return &m->engine;
}

void em_server_model_info(const em_server_model *m, ember_engine_info *info) {
    ember_engine_get_info(m->ember, info);
}

void em_server_model_close(em_server_model *m) {
    if (!m) return;
    if (m->ember) ember_engine_destroy(m->ember);
    free(m->model_id);
    free(m->architecture);
    free(m->chat_template);
    json_decref(m->metadata);
    free(m);
}
