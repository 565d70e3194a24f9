/* A model's text side: its tokenizer, its chat template and the list of control-token texts, read
 * from the model's GGUF, and the rendering of conversations that prompt.c tokenizes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../chat/chat.h"
#include "../tokenizer/tokenizer.h"
#include "text.h"

struct em_text {
    em_tokenizer *tokenizer;
    em_chat_template *chat; /* NULL when the model has none: chat prompts then fail */
    char *template_text;    /* its source, NUL-terminated */
    size_t template_len;
    char *template_error; /* why the template did not parse, or NULL */
    em_err_code template_error_code;
    char *bos_text, *eos_text;
    char **controls;
    size_t *control_lens;
    size_t n_controls;
    em_prompt_ops ops;
    bool template_uses_tools; /* the template reads `tools` (else they are described in the system message) */
};

/* For a template that does not render tools: the tools and the call format (a bare JSON object,
 * the fallback the server reads calls in) described in the system message, created first when
 * there is none. Strings of the tools that spell control tokens reach this function as prompt.c's
 * markers, so this text may be rendered as markup. */
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

static em_err render(void *self, const em_text_chat *chat, char **text, size_t *len) {
    em_text *t = self;
    const json_t *messages = chat->messages, *tools = chat->tools;
    if (t->template_error) return em_errorf(t->template_error_code, "%s", t->template_error);
    if (!t->chat)
        return em_errorf(EM_ERR_INVALID, "this model has no chat template (tokenizer.chat_template); use /v1/completions");
    json_t *described = NULL;
    if (tools && json_array_size(tools) && !t->template_uses_tools) {
        if (!(described = messages_with_tools(messages, tools))) return em_errorf(EM_ERR_NOMEM, "out of memory describing tools");
        messages = described;
    }
    em_chat_input input = {.messages = messages, .tools = tools, .bos_token = t->bos_text, .eos_token = t->eos_text,
                           .add_generation_prompt = chat->add_generation_prompt, .extra = chat->kwargs};
    em_err err = em_chat_render_input(t->chat, &input, NULL, text, len);
    json_decref(described);
    return err;
}

static em_err tokenize_part(void *self, const char *text, size_t len, bool parse_special, int32_t **ids, size_t *n) {
    em_text *t = self;
    return em_tokenize(t->tokenizer, text, len, false, parse_special, ids, n);
}

em_err em_text_chat_tokens(const em_text *t, const em_text_chat *chat, int32_t **ids, size_t *n) {
    return em_prompt_tokens(&t->ops, chat, ids, n);
}

const em_tokenizer *em_text_tokenizer(const em_text *t) {
    return t->tokenizer;
}

em_err em_text_chat_template(const em_text *t, const char **text, size_t *len) {
    *text = t->template_text;
    *len = t->template_len;
    return t->template_error ? em_errorf(t->template_error_code, "%s", t->template_error) : NULL;
}

static char *token_text_dup(const em_tokenizer *tokenizer, int32_t id) {
    const char *text = NULL;
    size_t len = id == EM_TOKEN_NONE ? 0 : em_tokenizer_token_text(tokenizer, id, &text);
    return len ? strndup(text, len) : NULL;
}

/* The texts that parse_special turns into control (or unknown) tokens. */
static em_err collect_controls(em_text *t) {
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

em_err em_text_from_gguf(const em_gguf *g, em_text **out) {
    *out = NULL;
    em_text *t = calloc(1, sizeof *t);
    if (!t) return em_errorf(EM_ERR_NOMEM, "out of memory");
    em_err e = em_tokenizer_from_gguf(g, &t->tokenizer);
    em_str tpl;
    em_err missing = e ? NULL : em_gguf_get_str(g, "tokenizer.chat_template", &tpl);
    if (missing) {
        em_err_free(missing);
    } else if (!e && !(t->template_text = strndup(tpl.ptr, tpl.len))) {
        e = em_errorf(EM_ERR_NOMEM, "out of memory copying the chat template");
    } else if (!e) {
        t->template_len = tpl.len;
        t->template_uses_tools = memmem(tpl.ptr, tpl.len, "tools", strlen("tools")) != NULL;
        /* kept, not returned: plain text still tokenizes with a template that does not parse */
        em_err bad = em_chat_template_parse(tpl.ptr, tpl.len, &t->chat);
        if (bad) {
            bad = em_err_prefix(bad, "%s: tokenizer.chat_template", em_gguf_path(g));
            t->template_error = strdup(em_err_message(bad));
            t->template_error_code = em_err_code_of(bad);
            em_err_free(bad);
            if (!t->template_error) e = em_errorf(EM_ERR_NOMEM, "out of memory");
        }
    }
    if (!e) e = collect_controls(t);
    if (e) {
        em_text_free(t);
        return e;
    }
    int32_t bos = em_tokenizer_bos(t->tokenizer);
    t->bos_text = token_text_dup(t->tokenizer, bos);
    t->eos_text = token_text_dup(t->tokenizer, em_tokenizer_eos(t->tokenizer));
    t->ops = (em_prompt_ops){.self = t, .render = render, .tokenize = tokenize_part,
                             .controls = (const char *const *)t->controls, .control_lens = t->control_lens,
                             .n_controls = t->n_controls,
                             .add_bos = bos != EM_TOKEN_NONE && em_tokenizer_adds_bos(t->tokenizer),
                             .bos = bos, .salt = random_salt()};
    *out = t;
    return NULL;
}

void em_text_free(em_text *t) {
    if (!t) return;
    em_chat_template_free(t->chat);
    free(t->template_text);
    free(t->template_error);
    em_tokenizer_free(t->tokenizer);
    for (size_t i = 0; i < t->n_controls; i++) free(t->controls[i]);
    free(t->controls);
    free(t->control_lens);
    free(t->bos_text);
    free(t->eos_text);
    free(t);
}
