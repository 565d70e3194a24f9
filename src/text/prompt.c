/* Chat prompts to token ids without letting message text inject control tokens.
 *
 * The chat template's own markup (<|im_start|>, [INST], <start_of_turn>, ...) must become control
 * tokens, so the rendered prompt is tokenized with special-token parsing on. Message text must not:
 * a user who writes "<|im_end|><|im_start|>system" would otherwise forge a turn. When no message
 * contains the text of any control token (the common case), the rendered prompt is tokenized in one
 * piece, which gives exactly the tokens the model's reference tokenizer gives. Otherwise the
 * messages that do are rendered with a unique marker in place of their content; the markers are
 * found in the output, and the prompt is tokenized piece by piece: the template's text with special
 * parsing, each such message's content without. A template that does not reproduce a marker
 * exactly once (it rewrote or dropped the content) is refused rather than guessed around. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text.h"

bool em_prompt_has_control_text(const char *text, size_t len, const em_prompt_ops *ops) {
    for (size_t c = 0; c < ops->n_controls; c++) {
        size_t n = ops->control_lens[c];
        if (n == 0 || n > len) continue;
        if (memmem(text, len, ops->controls[c], n)) return true;
    }
    return false;
}

typedef struct found {
    size_t pos;     /* of the marker in the rendered text */
    size_t message; /* whose content goes there */
} found;

static int by_pos(const void *a, const void *b) {
    const found *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

em_err em_prompt_pieces(const char *rendered, size_t len, const json_t *messages, const char *const *markers,
                               em_prompt_piece **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    size_t n_messages = json_array_size(messages), n_found = 0;
    found *where = calloc(n_messages ? n_messages : 1, sizeof *where);
    em_prompt_piece *pieces = calloc(2 * n_messages + 1, sizeof *pieces);
    if (!where || !pieces) {
        free(where);
        free(pieces);
        return em_errorf(EM_ERR_NOMEM, "out of memory splitting the chat prompt");
    }
    for (size_t i = 0; i < n_messages; i++) {
        if (!markers[i]) continue;
        size_t m = strlen(markers[i]);
        const char *first = memmem(rendered, len, markers[i], m);
        const char *again = first ? memmem(first + m, len - (size_t)(first - rendered) - m, markers[i], m) : NULL;
        if (!first || again) {
            free(where);
            free(pieces);
            return em_errorf(EM_ERR_INVALID,
                             "messages[%zu] contains control-token text and the chat template does not keep "
                             "message content as it is, so it cannot be kept apart from the template's markup",
                             i);
        }
        where[n_found++] = (found){.pos = (size_t)(first - rendered), .message = i};
    }
    qsort(where, n_found, sizeof *where, by_pos);
    size_t cursor = 0, n = 0;
    for (size_t k = 0; k < n_found; k++) {
        if (where[k].pos > cursor)
            pieces[n++] = (em_prompt_piece){.text = rendered + cursor, .len = where[k].pos - cursor, .special = true};
        const json_t *content = json_object_get(json_array_get(messages, where[k].message), "content");
        pieces[n++] = (em_prompt_piece){.text = json_string_value(content), .len = json_string_length(content),
                                        .special = false};
        cursor = where[k].pos + strlen(markers[where[k].message]);
    }
    if (cursor < len || n == 0)
        pieces[n++] = (em_prompt_piece){.text = rendered + cursor, .len = len - cursor, .special = true};
    free(where);
    *out = pieces;
    *n_out = n;
    return NULL;
}

static em_err append_ids(int32_t **ids, size_t *n, size_t *cap, const int32_t *more, size_t n_more) {
    if (*n + n_more > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *n + n_more) c *= 2;
        int32_t *grown = realloc(*ids, c * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "out of memory tokenizing the chat prompt");
        *ids = grown;
        *cap = c;
    }
    if (n_more) memcpy(*ids + *n, more, n_more * sizeof *more);
    *n += n_more;
    return NULL;
}

/* Renders `messages` (with some contents replaced by markers) and tokenizes piece by piece. */
static em_err tokenize_split(const em_prompt_ops *ops, const em_text_chat *chat, int32_t **ids, size_t *n,
                             size_t *cap) {
    const json_t *messages = chat->messages;
    size_t count = json_array_size(messages);
    char **markers = calloc(count ? count : 1, sizeof *markers);
    json_t *marked = json_deep_copy(messages);
    char *text = NULL;
    size_t len = 0;
    em_prompt_piece *pieces = NULL;
    size_t n_pieces = 0;
    em_err e = NULL;
    if (!markers || !marked) {
        e = em_errorf(EM_ERR_NOMEM, "out of memory rendering the chat prompt");
        goto done;
    }
    for (size_t i = 0; i < count; i++) {
        json_t *content = json_object_get(json_array_get(messages, i), "content");
        if (!json_is_string(content) ||
            !em_prompt_has_control_text(json_string_value(content), json_string_length(content), ops))
            continue;
        /* letters and digits only, so no template filter (trim, escape) changes the marker */
        char marker[64];
        snprintf(marker, sizeof marker, "EmberContentMarker%zuX%08x", i, ops->salt);
        if (!(markers[i] = strdup(marker)) ||
            json_object_set_new(json_array_get(marked, i), "content", json_string(marker)) != 0) {
            e = em_errorf(EM_ERR_NOMEM, "out of memory rendering the chat prompt");
            goto done;
        }
    }
    em_text_chat marked_chat = *chat;
    marked_chat.messages = marked;
    if ((e = ops->render(ops->self, &marked_chat, &text, &len))) goto done;
    if ((e = em_prompt_pieces(text, len, messages, (const char *const *)markers, &pieces, &n_pieces))) goto done;
    for (size_t k = 0; k < n_pieces && !e; k++) {
        int32_t *part = NULL;
        size_t n_part = 0;
        if (pieces[k].len == 0) continue;
        if (!(e = ops->tokenize(ops->self, pieces[k].text, pieces[k].len, pieces[k].special, &part, &n_part)))
            e = append_ids(ids, n, cap, part, n_part);
        free(part);
    }
done:
    for (size_t i = 0; markers && i < count; i++) free(markers[i]);
    free(markers);
    json_decref(marked);
    free(text);
    free(pieces);
    return e;
}

/* Tool definitions and tool calls are rendered as the template writes them, not split into pieces:
 * control-token text inside them is refused instead. */
static em_err check_tool_text(const em_prompt_ops *ops, const json_t *messages, const json_t *tools) {
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        json_t *calls = json_object_get(m, "tool_calls");
        char *text = calls ? json_dumps(calls, JSON_COMPACT) : NULL;
        bool bad = text && em_prompt_has_control_text(text, strlen(text), ops);
        free(text);
        if (bad) return em_errorf(EM_ERR_INVALID, "messages[%zu].tool_calls contains control-token text", i);
    }
    char *text = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
    bool bad = text && em_prompt_has_control_text(text, strlen(text), ops);
    free(text);
    return bad ? em_errorf(EM_ERR_INVALID, "tools contain control-token text") : NULL;
}

em_err em_prompt_tokens(const em_prompt_ops *ops, const em_text_chat *chat, int32_t **ids_out, size_t *n_out) {
    *ids_out = NULL;
    *n_out = 0;
    const json_t *messages = chat->messages;
    em_err tool_error = check_tool_text(ops, messages, chat->tools);
    if (tool_error) return tool_error;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    em_err e = NULL;
    if (ops->add_bos && (e = append_ids(&ids, &n, &cap, &ops->bos, 1))) return e;
    bool split = false;
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        json_t *content = json_object_get(m, "content");
        if (json_is_string(content) &&
            em_prompt_has_control_text(json_string_value(content), json_string_length(content), ops))
            split = true;
    }
    if (split) {
        e = tokenize_split(ops, chat, &ids, &n, &cap);
    } else {
        char *text = NULL;
        size_t len = 0;
        int32_t *all = NULL;
        size_t n_all = 0;
        if (!(e = ops->render(ops->self, chat, &text, &len)) &&
            !(e = ops->tokenize(ops->self, text, len, true, &all, &n_all)))
            e = append_ids(&ids, &n, &cap, all, n_all);
        free(text);
        free(all);
    }
    if (e) {
        free(ids);
        return e;
    }
    /* A template that writes the BOS itself, and a vocabulary that also asks for one: keep one. */
    if (ops->add_bos && n >= 2 && ids[1] == ops->bos) {
        memmove(ids, ids + 1, (n - 1) * sizeof *ids);
        n--;
    }
    *ids_out = ids;
    *n_out = n;
    return NULL;
}
