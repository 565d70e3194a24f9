/*
 * chat — chat templates: an interpreter for the subset of Jinja that models ship in
 * `tokenizer.chat_template`, and the glue that turns an OpenAI-style conversation into the prompt
 * text a model expects.
 *
 * The reference for every behaviour is the renderer of @huggingface/jinja (the one transformers.js
 * and the Hugging Face hub use), not Python Jinja2: where the two differ (whitespace handling,
 * `str.strip(chars)` ignoring its argument, `loop` scoping, how numbers and booleans print,
 * `tojson` separators) Ember does what @huggingface/jinja does, so a prompt rendered here is byte
 * for byte the prompt the reference renders. Templates are tokenized with trim_blocks and
 * lstrip_blocks on, as the reference and transformers do. Where the reference rejects what Jinja
 * defines and real templates use (backslash-newline in a string, `map('filter')`), Jinja's meaning
 * applies. Anything the interpreter does not support is an error naming the construct and its
 * line and column, never a guess.
 *
 * What this module owns: the parsed template (an em_chat_template owns one arena holding its
 * tokens and syntax tree) and, during one render, an arena for every value the render creates;
 * it is freed before em_chat_render returns. The rendered text is malloc'd and owned by the
 * caller (free()). Inputs are jansson values borrowed for the duration of the call.
 *
 * A parsed template is read-only while rendering, so one template may be rendered from several
 * threads at once. Templates are untrusted input (they come from GGUF files): nesting, the number
 * of steps and the memory of a render are bounded, and exceeding a bound is an error.
 *
 * What it does not own: reading GGUF files (gguf), tokenizing the prompt (tokenizer), deciding
 * which template a model uses (the caller passes the text of `tokenizer.chat_template`).
 *
 * Depends on base and jansson (utf8proc for case mapping).
 */
#ifndef EMBER_CHAT_H
#define EMBER_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

typedef struct em_chat_template em_chat_template;

/* Parses a template. `src` need not be NUL-terminated. On error *out is NULL and the message
 * names the line, column and construct ("line 3, column 12: unknown statement 'include'"). */
em_err em_chat_template_parse(const char *src, size_t len, em_chat_template **out);
void em_chat_template_free(em_chat_template *tpl);

typedef struct em_chat_render_options {
    /* The instant strftime_now() formats, in seconds since the epoch (local time zone, as the
     * reference does); a negative value means "now". Tests pin it to compare outputs. */
    int64_t now;
    /* Bounds on one render, so that a hostile template (a GGUF is untrusted input) cannot hang or
     * exhaust the process: statements and loop iterations executed (0 = 50 million) and bytes
     * of values and output held at once (0 = 1 GiB). Exceeding either is an EM_ERR_RANGE error. */
    uint64_t max_steps;
    uint64_t max_bytes;
} em_chat_render_options;

/* Renders with `context` (a JSON object) as the template's variables; NULL options = defaults
 * (the current time, default bounds).
 * *out is malloc'd, NUL-terminated (the text may itself contain NUL bytes; *len counts bytes).
 * Errors (raise_exception, a type error, an unsupported filter) name the line and column. */
em_err em_chat_render(const em_chat_template *tpl, const json_t *context,
                      const em_chat_render_options *options, char **out, size_t *len);

/* The conversation to render, as the engine and server hold it. All fields but `messages` are
 * optional (NULL / false). Keys set as the reference's callers set them: `messages`, `tools`
 * (only when given), `bos_token` and `eos_token` (only when given), `add_generation_prompt`
 * (always), then every member of `extra` (e.g. `enable_thinking`), which may override them. */
typedef struct em_chat_input {
    const json_t *messages; /* array of {role, content (string, null or list of parts), ...} */
    const json_t *tools;    /* array of tool definitions, or NULL */
    const char *bos_token;
    const char *eos_token;
    bool add_generation_prompt;
    const json_t *extra; /* object of extra variables, or NULL */
} em_chat_input;

/* Builds the context for `input` and renders it (see em_chat_render). */
em_err em_chat_render_input(const em_chat_template *tpl, const em_chat_input *input,
                            const em_chat_render_options *options, char **out, size_t *len);

#endif
