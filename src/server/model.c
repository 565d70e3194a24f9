/* The server's real engine: include/ember.h's engine, which also holds the model's one tokenizer
 * and chat template (the server reads the model file through it, never on its own). */
#include <stdlib.h>
#include <string.h>

#include "../gguf/gguf.h"
#include "internal.h"

struct em_server_model {
    em_server_engine engine;
    ember_engine *ember;
    char *model_id;
    bool reasons; /* the chat template writes <think> sections */
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

static em_err model_chat_prompt(void *self, const json_t *messages, const json_t *tools, int32_t **ids, size_t *n,
                                bool *in_thinking) {
    em_server_model *m = self;
    *ids = NULL;
    *n = 0;
    char *messages_text = json_dumps(messages, JSON_COMPACT);
    char *tools_text = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
    em_err e = !messages_text || (tools && !tools_text) ? em_errorf(EM_ERR_NOMEM, "out of memory") : NULL;
    ember_chat chat = {.messages = messages_text, .tools = tools_text, .add_generation_prompt = true};
    if (!e) e = ember_chat_tokens(m->ember, &chat, ids, n);
    free(messages_text);
    free(tools_text);
    if (!e && in_thinking) *in_thinking = m->reasons && ends_in_thinking(m, *ids, *n);
    return e;
}

static em_err model_tokenize(void *self, const char *text, size_t len, int32_t **ids, size_t *n) {
    em_server_model *m = self;
    return ember_tokenize(m->ember, text, len, true, false, ids, n);
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
                                   .stats = model_stats};
    *out = m;
    return NULL;
}

const em_server_engine *em_server_model_engine(const em_server_model *m) {
    return &m->engine;
}

void em_server_model_close(em_server_model *m) {
    if (!m) return;
    if (m->ember) ember_engine_destroy(m->ember);
    free(m->model_id);
    free(m);
}
