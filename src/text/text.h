/*
 * text — a model's text side: its tokenizer, its chat template and the texts of its control tokens,
 * read once from the GGUF; and chat prompts rendered and tokenized so that message text never
 * becomes control tokens (prompt.c).
 *
 * The engine owns the process's one em_text and hands it out through include/ember.h
 * (ember_tokenize, ember_chat_tokens, ember_token_piece, ...): the engine tokenizes text prompts and
 * detokenizes output with it, the server and `ember chat` build their chat prompts, count tokens
 * and spell logprobs with it. Every function that takes a const em_text may be called from any
 * thread at once.
 *
 * Ownership: an em_text owns its tokenizer, template and control-token list and copies what it
 * needs from the file (which may close afterwards). Token ids returned are malloc'd; the caller
 * frees them.
 *
 * Depends on base, gguf, tokenizer, chat and jansson.
 */
#ifndef EMBER_TEXT_H
#define EMBER_TEXT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "../gguf/gguf.h"
#include "../tokenizer/tokenizer.h"

/* A conversation to render with a chat template. */
typedef struct em_text_chat {
    const json_t *messages; /* OpenAI-style [{role, content: string}, ...]; roles system, user, assistant,
                             * tool; assistant messages may carry tool_calls with arguments as objects */
    const json_t *tools;    /* OpenAI-style tool definitions, or NULL */
    const json_t *kwargs;   /* object of extra template variables (enable_thinking, ...), or NULL */
    bool add_generation_prompt;
} em_text_chat;

/* ---- Chat prompts → token ids, safe from injected control tokens (prompt.c) ---- */

/* What em_prompt_tokens needs from a tokenizer and a chat template. */
typedef struct em_prompt_ops {
    void *self;
    /* Renders the conversation with the chat template (malloc'd). */
    em_err (*render)(void *self, const em_text_chat *chat, char **text, size_t *len);
    /* Tokenizes without adding BOS/EOS; control-token text recognized only when parse_special. */
    em_err (*tokenize)(void *self, const char *text, size_t len, bool parse_special, int32_t **ids, size_t *n);
    const char *const *controls; /* the text of every control token of the vocabulary */
    const size_t *control_lens;
    size_t n_controls;
    bool add_bos; /* the vocabulary asks for a BOS at the start of a sequence */
    int32_t bos;
    uint32_t salt; /* makes content markers unguessable */
} em_prompt_ops;

/* Renders and tokenizes a conversation so that only the template's markup produces control
 * tokens (see prompt.c for how): no string of the messages, tools or template variables, in any
 * field, becomes a control token. One BOS at the start when add_bos, even if the template writes
 * one too. *ids is malloc'd. */
em_err em_prompt_tokens(const em_prompt_ops *ops, const em_text_chat *chat, int32_t **ids, size_t *n);

/* A stretch of prompt text and whether to parse special-token text in it. */
typedef struct em_prompt_piece {
    const char *text;
    size_t len;
    bool special;
} em_prompt_piece;

/* A marker rendered in place of a string of the conversation, and the string it stands for. */
typedef struct em_prompt_mark {
    const char *marker;
    size_t marker_len;
    const char *text;
    size_t len;
} em_prompt_mark;

bool em_prompt_has_control_text(const char *text, size_t len, const em_prompt_ops *ops);
/* Splits text rendered with markers into pieces: the template's text (special) and, at every
 * place a marker occurs, its string (not special). A marker may occur any number of times.
 * *pieces is malloc'd and points into `rendered` and the marks' strings. */
em_err em_prompt_pieces(const char *rendered, size_t len, const em_prompt_mark *marks, size_t n_marks,
                        em_prompt_piece **pieces, size_t *n);

/* ---- A model's text side (text.c) ---- */

typedef struct em_text em_text;

/* Builds the tokenizer and parses `tokenizer.chat_template`. A template that is absent or does not
 * parse fails chat prompts (EM_ERR_INVALID, or the parser's error), not this: plain text still
 * tokenizes. Copies what it needs: the file may close afterwards. */
em_err em_text_from_gguf(const em_gguf *gguf, em_text **out);
void em_text_free(em_text *text);
const em_tokenizer *em_text_tokenizer(const em_text *text);
/* The chat template's source in *template (NULL and 0 when the model has none); the error is why it
 * does not parse, when it does not. */
em_err em_text_chat_template(const em_text *text, const char **template_text, size_t *len);
/* em_prompt_tokens with this model's template and tokenizer. A template that does not read
 * `tools` gets them described in the system message instead (created when there is none). */
em_err em_text_chat_tokens(const em_text *text, const em_text_chat *chat, int32_t **ids, size_t *n);

#endif
