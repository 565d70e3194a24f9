/* The model's text side for callers of include/ember.h: the engine's one em_text (src/text), so a
 * process that runs an engine reads its tokenizer and chat template once, and the server and
 * `ember chat` tokenize exactly as the engine does. None of this touches the engine thread. */
#include <stdlib.h>

#include "engine.h"

ember_error *ember_tokenize(const ember_engine *e, const char *text, size_t len, bool add_special, bool parse_special,
                            int32_t **ids, size_t *n) {
    return em_tokenize(e->tokenizer, text, len, add_special, parse_special, ids, n);
}

ember_error *ember_detokenize(const ember_engine *e, const int32_t *ids, size_t n, char **text, size_t *len) {
    return em_detokenize(e->tokenizer, ids, n, true, text, len);
}

size_t ember_token_piece(const ember_engine *e, int32_t id, const char **bytes) {
    return em_token_to_piece(e->tokenizer, id, true, bytes);
}

ember_error *ember_chat_template(const ember_engine *e, const char **template_text, size_t *len) {
    return em_text_chat_template(e->text, template_text, len);
}

/* A JSON argument of ember_chat: NULL stays NULL; anything else must parse as `type`. */
static em_err parse_json(const char *text, const char *what, json_type type, json_t **out) {
    *out = NULL;
    if (!text) return NULL;
    json_error_t error;
    json_t *value = json_loads(text, JSON_ALLOW_NUL, &error);
    if (!value) return em_errorf(EM_ERR_INVALID, "chat %s: %s at line %d, column %d", what, error.text, error.line,
                                 error.column);
    if (json_typeof(value) != type) {
        json_decref(value);
        return em_errorf(EM_ERR_INVALID, "chat %s: expected a JSON %s", what, type == JSON_ARRAY ? "array" : "object");
    }
    *out = value;
    return NULL;
}

ember_error *ember_chat_tokens(const ember_engine *e, const ember_chat *chat, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!chat->messages) return em_errorf(EM_ERR_INVALID, "chat: no messages");
    json_t *messages, *tools = NULL, *kwargs = NULL;
    em_err err = parse_json(chat->messages, "messages", JSON_ARRAY, &messages);
    if (!err) err = parse_json(chat->tools, "tools", JSON_ARRAY, &tools);
    if (!err) err = parse_json(chat->kwargs, "kwargs", JSON_OBJECT, &kwargs);
    if (!err) {
        em_text_chat c = {.messages = messages, .tools = tools, .kwargs = kwargs,
                          .add_generation_prompt = chat->add_generation_prompt};
        err = em_text_chat_tokens(e->text, &c, ids, n);
    }
    json_decref(messages);
    json_decref(tools);
    json_decref(kwargs);
    return err;
}
