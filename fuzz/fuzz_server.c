/* libFuzzer target: the server's request parsers (OpenAI chat and completions, Anthropic, the
 * Responses API with a store holding one response, Ollama's chat and generate), and the making of
 * a parsed request's grammar. The first byte picks the endpoint and the tool-call format (any of
 * them: harmony and Gemma 4 build their grammars their own way); the rest is the body. Every input
 * must give either a request or a 4xx/5xx error with a message, and a parsed request must format
 * (error bodies, chat-prompt splitting) without touching memory it does not own. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"
#include "text/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static em_err render_plain(void *self, const em_text_chat *chat, char **text, size_t *len) {
    (void)self;
    char *dumped = json_dumps(chat->messages, JSON_COMPACT);
    if (!dumped) return em_errorf(EM_ERR_NOMEM, "out of memory");
    *text = dumped;
    *len = strlen(dumped);
    return NULL;
}

static em_err tokenize_bytes(void *self, const char *text, size_t len, bool parse_special, int32_t **ids, size_t *n) {
    (void)self;
    (void)parse_special;
    *ids = malloc(len ? len * sizeof **ids : 1);
    if (!*ids) return em_errorf(EM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n = len;
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    em_server_request req;
    em_server_error err = {0};
    bool ok;
    static em_response_store *store;
    if (!store) {
        /* one stored conversation, so that previous_response_id "resp_1" continues something */
        store = em_response_store_new(4, 1 << 16);
        json_t *kept = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "user", "content", "hi", "role", "assistant", "content", "yes");
        if (!store || !kept || !em_response_store_put(store, "resp_1", kept)) abort();
        json_decref(kept);
    }
    static const em_server_engine engine = {.model_id = "fuzz", .reasons = true};
    switch (data[0] % 7) {
    case 0: ok = em_openai_parse_chat(body, len, 32000, &req, &err); break;
    case 1: ok = em_openai_parse_completions(body, len, 32000, &req, &err); break;
    case 2: ok = em_anthropic_parse_messages(body, len, &req, &err); break;
    case 3: ok = em_anthropic_parse_count_tokens(body, len, &req, &err); break;
    case 4: ok = em_responses_parse(body, len, store, &req, &err); break;
    case 5: ok = em_ollama_parse(true, body, len, &engine, &req, &err); break;
    default: ok = em_ollama_parse(false, body, len, &engine, &req, &err); break;
    }
    if (ok && req.api != EM_API_OPENAI_COMPLETIONS) {
        /* The request's grammar, made as generate.c makes it (a model that reasons when the first
         * byte's high bit is set), through a cache that the inputs share, under a CPU-time bound. */
        static em_grammar_cache *grammars;
        if (!grammars && em_grammar_cache_new(64, 64 << 20, &grammars)) abort();
        em_grammar_watch watch;
        em_grammar_watch_init(&watch, 1.0, NULL, NULL);
        const em_server_grammar_maker maker = {.cache = grammars, .watch = &watch};
        const em_tool_format format = (em_tool_format)(data[0] / 7 % (EM_TOOL_FORMAT_GEMMA4 + 1));
        ok = em_server_make_grammar(&req, &maker, format, data[0] & 0x80, false, &err);
    }
    if (!ok) {
        if (err.status < 400 || err.status > 599 || !err.message[0]) abort();
        char *text = em_server_error_body(req.api, &err);
        if (!text) abort();
        free(text);
    } else if (req.messages) {
        static const char *const controls[] = {"<|im_start|>", "<|im_end|>"};
        static const size_t lens[] = {12, 10};
        em_prompt_ops ops = {.render = render_plain, .tokenize = tokenize_bytes, .controls = controls,
                             .control_lens = lens, .n_controls = 2, .add_bos = true, .bos = 1, .salt = 7};
        int32_t *ids = NULL;
        size_t n = 0;
        em_text_chat chat = {.messages = req.messages, .tools = req.tools, .add_generation_prompt = true};
        em_err e = em_prompt_tokens(&ops, &chat, &ids, &n);
        em_err_free(e);
        free(ids);
    }
    em_server_request_clear(&req);
    return 0;
}
