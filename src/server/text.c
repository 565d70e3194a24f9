/* The text side of a served model: its tokenizer, its chat template and the list of control-token
 * texts, read from the model's GGUF. The engine tokenizes its own prompts, but the server needs
 * token counts (count_tokens, context checks), chat rendering with injection-safe tokenization
 * (prompt.c) and token spellings (logprobs) on its own threads, before and after the engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../chat/chat.h"
#include "../tokenizer/tokenizer.h"
#include "internal.h"

struct em_server_text {
    em_tokenizer *tokenizer;
    em_chat_template *chat; /* NULL when the model has none: chat endpoints then answer 400 */
    char *bos_text, *eos_text;
    char **controls;
    size_t *control_lens;
    size_t n_controls;
    em_server_prompt_ops ops;
    em_tool_format tool_format; /* how the template writes tool calls */
    bool reasons;               /* the template writes <think> sections */
    bool template_uses_tools; /* the template reads `tools` (else the server describes them itself) */
};

/* For a template that does not render tools: the tools and the call format (the JSON fallback of
 * tools.c) described in the system message, created first when there is none. The tools' JSON
 * cannot hold control-token text (prompt.c refuses it), so this text may be rendered as markup. */
static json_t *messages_with_tools(const json_t *messages, const json_t *tools) {
    json_t *copy = json_deep_copy(messages);
    char *listed = json_dumps(tools, JSON_COMPACT);
    char *note = NULL;
    if (!copy || !listed ||
        asprintf(&note, "You can call these tools (each one's arguments follow its JSON Schema \"parameters\"):\n%s\n"
                        "To call one, answer with only a JSON object {\"name\": <tool name>, \"arguments\": <object>} "
                        "and nothing else.", listed) < 0)
        note = NULL;
    free(listed);
    json_t *first = json_array_get(copy, 0);
    const char *role = json_string_value(json_object_get(first, "role"));
    bool ok = note != NULL;
    if (ok && role && !strcmp(role, "system")) {
        char *joined = NULL;
        const char *content = json_string_value(json_object_get(first, "content"));
        ok = asprintf(&joined, "%s\n\n%s", content ? content : "", note) >= 0 &&
             json_object_set_new(first, "content", json_string(joined)) == 0;
        if (ok) free(joined);
    } else if (ok) {
        ok = json_array_insert_new(copy, 0, json_pack("{s:s, s:s}", "role", "system", "content", note)) == 0;
    }
    free(note);
    if (!ok) {
        json_decref(copy);
        return NULL;
    }
    return copy;
}

static em_err render(void *self, const json_t *messages, const json_t *tools, char **text, size_t *len) {
    em_server_text *t = self;
    if (!t->chat)
        return em_errorf(EM_ERR_INVALID, "this model has no chat template (tokenizer.chat_template); use /v1/completions");
    json_t *described = NULL;
    if (tools && json_array_size(tools) && !t->template_uses_tools) {
        if (!(described = messages_with_tools(messages, tools))) return em_errorf(EM_ERR_NOMEM, "out of memory describing tools");
        messages = described;
    }
    em_chat_input input = {.messages = messages, .tools = tools, .bos_token = t->bos_text, .eos_token = t->eos_text,
                           .add_generation_prompt = true};
    em_err err = em_chat_render_input(t->chat, &input, NULL, text, len);
    json_decref(described);
    return err;
}

static em_err tokenize_part(void *self, const char *text, size_t len, bool parse_special, int32_t **ids, size_t *n) {
    em_server_text *t = self;
    return em_tokenize(t->tokenizer, text, len, false, parse_special, ids, n);
}

/* Whether the prompt's last tokens are an open `<think>` (whitespace after it aside): the template
 * opened the model's reasoning in the generation prompt. */
static bool ends_in_thinking(const em_server_text *t, const int32_t *ids, size_t n) {
    const size_t tail = n < 8 ? n : 8;
    char *text = NULL;
    size_t len = 0;
    em_err e = em_detokenize(t->tokenizer, ids + n - tail, tail, true, &text, &len);
    if (e) {
        em_err_free(e);
        return false;
    }
    while (len && strchr(" \t\r\n", text[len - 1])) len--;
    bool open = len >= strlen("<think>") && !memcmp(text + len - strlen("<think>"), "<think>", strlen("<think>"));
    free(text);
    return open;
}

em_err em_server_text_chat_tokens(const em_server_text *t, const json_t *messages, const json_t *tools, int32_t **ids,
                                  size_t *n, bool *in_thinking) {
    em_err e = em_server_chat_tokens(&t->ops, messages, tools, ids, n);
    if (!e && in_thinking) *in_thinking = t->reasons && ends_in_thinking(t, *ids, *n);
    return e;
}

em_err em_server_text_tokenize(const em_server_text *t, const char *text, size_t len, int32_t **ids, size_t *n) {
    return em_tokenize(t->tokenizer, text, len, true, false, ids, n);
}

size_t em_server_text_token_bytes(const em_server_text *t, int32_t id, const char **bytes) {
    return em_token_to_piece(t->tokenizer, id, true, bytes);
}

em_tool_format em_server_text_tool_format(const em_server_text *t) {
    return t->tool_format;
}

bool em_server_text_reasons(const em_server_text *t) {
    return t->reasons;
}

em_tool_format em_server_tool_format_of(const char *template_text, size_t len) {
#define HAS(s) (memmem(template_text, len, s, strlen(s)) != NULL)
    if (HAS("[TOOL_CALLS]")) return HAS("[ARGS]") ? EM_TOOL_FORMAT_MISTRAL_ARGS : EM_TOOL_FORMAT_MISTRAL;
    if (HAS("<tool_call>")) return EM_TOOL_FORMAT_HERMES;
    /* Llama 3.x: calls written back as {"name": ..., "parameters": ...} between its header tokens */
    if (HAS("<|python_tag|>") || (HAS("<|start_header_id|>") && HAS("\"parameters\""))) return EM_TOOL_FORMAT_LLAMA3;
    return EM_TOOL_FORMAT_JSON;
#undef HAS
}

int32_t em_server_text_n_vocab(const em_server_text *t) {
    return em_tokenizer_n_vocab(t->tokenizer);
}

static char *token_text_dup(const em_tokenizer *tokenizer, int32_t id) {
    const char *text = NULL;
    size_t len = id == EM_TOKEN_NONE ? 0 : em_tokenizer_token_text(tokenizer, id, &text);
    return len ? strndup(text, len) : NULL;
}

/* The texts that parse_special turns into control (or unknown) tokens. */
static em_err collect_controls(em_server_text *t) {
    int32_t n_vocab = em_tokenizer_n_vocab(t->tokenizer);
    size_t count = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        em_token_type type = em_tokenizer_token_type(t->tokenizer, id);
        const char *text = NULL;
        if ((type == EM_TOKEN_CONTROL || type == EM_TOKEN_UNKNOWN) && em_tokenizer_token_text(t->tokenizer, id, &text))
            count++;
    }
    t->controls = calloc(count ? count : 1, sizeof *t->controls);
    t->control_lens = calloc(count ? count : 1, sizeof *t->control_lens);
    if (!t->controls || !t->control_lens) return em_errorf(EM_ERR_NOMEM, "out of memory listing control tokens");
    for (int32_t id = 0; id < n_vocab && t->n_controls < count; id++) {
        em_token_type type = em_tokenizer_token_type(t->tokenizer, id);
        const char *text = NULL;
        size_t len = type == EM_TOKEN_CONTROL || type == EM_TOKEN_UNKNOWN ? em_tokenizer_token_text(t->tokenizer, id, &text) : 0;
        if (!len) continue;
        if (!(t->controls[t->n_controls] = strndup(text, len))) return em_errorf(EM_ERR_NOMEM, "out of memory listing control tokens");
        t->control_lens[t->n_controls++] = len;
    }
    return NULL;
}

/* Content markers (prompt.c) must not be guessable from outside the process. */
static uint32_t random_salt(void) {
    uint32_t salt;
    if (getrandom(&salt, sizeof salt, 0) != (ssize_t)sizeof salt) salt = (uint32_t)time(NULL) * 2654435761u;
    return salt;
}

em_err em_server_text_from_gguf(const em_gguf *g, em_server_text **out) {
    *out = NULL;
    em_server_text *t = calloc(1, sizeof *t);
    if (!t) return em_errorf(EM_ERR_NOMEM, "out of memory");
    em_err e = em_tokenizer_from_gguf(g, &t->tokenizer);
    em_str tpl;
    em_err missing = e ? NULL : em_gguf_get_str(g, "tokenizer.chat_template", &tpl);
    if (missing) {
        em_err_free(missing);
        em_log(EM_LOG_WARN, "%s: no tokenizer.chat_template: chat endpoints will answer 400", em_gguf_path(g));
    } else if (!e && (e = em_chat_template_parse(tpl.ptr, tpl.len, &t->chat))) {
        e = em_err_prefix(e, "%s: tokenizer.chat_template", em_gguf_path(g));
    } else if (!e) {
        t->tool_format = em_server_tool_format_of(tpl.ptr, tpl.len);
        t->reasons = memmem(tpl.ptr, tpl.len, "<think>", strlen("<think>")) != NULL ||
                     memmem(tpl.ptr, tpl.len, "</think>", strlen("</think>")) != NULL;
        t->template_uses_tools = memmem(tpl.ptr, tpl.len, "tools", strlen("tools")) != NULL;
    }
    if (!e) e = collect_controls(t);
    if (e) {
        em_server_text_free(t);
        return e;
    }
    int32_t bos = em_tokenizer_bos(t->tokenizer);
    t->bos_text = token_text_dup(t->tokenizer, bos);
    t->eos_text = token_text_dup(t->tokenizer, em_tokenizer_eos(t->tokenizer));
    t->ops = (em_server_prompt_ops){.self = t, .render = render, .tokenize = tokenize_part,
                                    .controls = (const char *const *)t->controls, .control_lens = t->control_lens,
                                    .n_controls = t->n_controls,
                                    .add_bos = bos != EM_TOKEN_NONE && em_tokenizer_adds_bos(t->tokenizer),
                                    .bos = bos, .salt = random_salt()};
    *out = t;
    return NULL;
}

void em_server_text_free(em_server_text *t) {
    if (!t) return;
    em_chat_template_free(t->chat);
    em_tokenizer_free(t->tokenizer);
    for (size_t i = 0; i < t->n_controls; i++) free(t->controls[i]);
    free(t->controls);
    free(t->control_lens);
    free(t->bos_text);
    free(t->eos_text);
    free(t);
}
