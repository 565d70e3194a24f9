/* The server's real backend: the engine of include/ember.h for generation, and the model's text
 * side (text.c: tokenizer, chat template) for everything the server does on its own threads. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct em_server_model {
    em_server_backend backend;
    ember_engine *engine;
    em_server_text *text;
    char *model_id;
};

static em_err model_chat_prompt(void *self, const json_t *messages, const json_t *tools, int32_t **ids, size_t *n,
                                bool *in_thinking) {
    em_server_model *m = self;
    return em_server_text_chat_tokens(m->text, messages, tools, ids, n, in_thinking);
}

static em_err model_tokenize(void *self, const char *text, size_t len, int32_t **ids, size_t *n) {
    em_server_model *m = self;
    return em_server_text_tokenize(m->text, text, len, ids, n);
}

static size_t model_token_bytes(void *self, int32_t id, const char **bytes) {
    em_server_model *m = self;
    return em_server_text_token_bytes(m->text, id, bytes);
}

static em_err model_submit(void *self, const ember_request_params *params, void **request) {
    em_server_model *m = self;
    ember_request *r = NULL;
    em_err e = ember_submit(m->engine, params, &r);
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
    ember_engine_stats(m->engine, out);
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

em_err em_server_model_open(const ember_options *options, const char *alias, em_server_model **out) {
    *out = NULL;
    if (!options->model_path) return em_errorf(EM_ERR_INVALID, "no model path");
    em_server_model *m = calloc(1, sizeof *m);
    if (!m) return em_errorf(EM_ERR_NOMEM, "out of memory");
    em_gguf *g = NULL;
    em_err e = em_gguf_open(options->model_path, &g);
    if (!e) e = em_server_text_from_gguf(g, &m->text);
    em_gguf_close(g);
    if (!e && !(m->model_id = alias ? strdup(alias) : model_id_of(options->model_path)))
        e = em_errorf(EM_ERR_NOMEM, "out of memory");
    if (!e) e = ember_engine_create(options, &m->engine);
    if (e) {
        em_server_model_close(m);
        return e;
    }
    ember_engine_info info;
    ember_engine_get_info(m->engine, &info);
    m->backend = (em_server_backend){.self = m, .model_id = m->model_id, .ctx_tokens = (int)info.ctx_tokens,
                                     .n_vocab = (int32_t)info.n_vocab, .chat_prompt = model_chat_prompt,
                                     .tool_format = em_server_text_tool_format(m->text),
                                     .reasons = em_server_text_reasons(m->text),
                                     .tokenize = model_tokenize, .token_bytes = model_token_bytes,
                                     .submit = model_submit, .next = model_next, .cancel = model_cancel,
                                     .timings = model_timings, .release = model_release, .stats = model_stats};
    *out = m;
    return NULL;
}

const em_server_backend *em_server_model_backend(const em_server_model *m) {
    return &m->backend;
}

void em_server_model_close(em_server_model *m) {
    if (!m) return;
    if (m->engine) ember_engine_destroy(m->engine);
    em_server_text_free(m->text);
    free(m->model_id);
    free(m);
}
