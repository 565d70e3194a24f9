/* Chat prompts to token ids without letting the conversation's text inject control tokens.
 *
 * The chat template's own markup (<|im_start|>, [INST], <start_of_turn>, ...) must become control
 * tokens, so the rendered prompt is tokenized with special-token parsing on. No string of the
 * conversation may: a user who writes "<|im_end|><|im_start|>system" in a message, a tool id, a
 * tool's name or arguments, a system prompt or a template variable would otherwise forge a turn.
 * This file is the one place that keeps them apart, for every string (object keys too) of the
 * messages, the tools and the template variables, whatever field it sits in.
 *
 * A string is hostile when it contains the text of a control token, or ends with the start of one
 * (what follows it in the rendering could complete it). When no string is (the common case), the
 * rendered prompt is tokenized in one piece, which gives exactly the tokens the model's reference
 * tokenizer gives. Otherwise every hostile string is replaced by a random marker of letters and
 * digits (as long as the string, between 8 and 64 characters, so a template that checks an id's
 * length still sees the same length), the conversation is rendered, and the prompt is tokenized
 * piece by piece: the template's text with special parsing, each marker's string without. A
 * template that drops a string drops its marker (nothing of it reaches the prompt); one that
 * writes it twice gets it twice. The strings go into the prompt as they are, so a template that
 * escapes a string (tojson of one holding quotes) sees the marker escaped, not the string: the
 * prompt then differs from the reference rendering in those characters, never in its control
 * tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "text.h"

bool em_prompt_has_control_text(const char *text, size_t len, const em_prompt_ops *ops) {
    for (size_t c = 0; c < ops->n_controls; c++) {
        size_t n = ops->control_lens[c];
        if (n == 0 || n > len) continue;
        if (memmem(text, len, ops->controls[c], n)) return true;
    }
    return false;
}

/* Whether `text` ends with a proper prefix of some control token's text. */
static bool ends_inside_control_text(const char *text, size_t len, const em_prompt_ops *ops) {
    for (size_t c = 0; c < ops->n_controls; c++) {
        size_t n = ops->control_lens[c], longest = n ? n - 1 : 0;
        for (size_t k = longest < len ? longest : len; k > 0; k--)
            if (!memcmp(text + len - k, ops->controls[c], k)) return true;
    }
    return false;
}

/* The bytes control texts start with, worked out once a prompt: a string without any of them can
 * neither hold a control text nor end inside one, so most strings are cleared in one pass. */
typedef struct screen {
    const em_prompt_ops *ops;
    bool starts[256];
} screen;

static void screen_init(screen *sc, const em_prompt_ops *ops) {
    memset(sc, 0, sizeof *sc);
    sc->ops = ops;
    for (size_t c = 0; c < ops->n_controls; c++)
        if (ops->control_lens[c]) sc->starts[(unsigned char)ops->controls[c][0]] = true;
}

static bool is_hostile(const char *text, size_t len, const screen *sc) {
    size_t i = 0;
    while (i < len && !sc->starts[(unsigned char)text[i]]) i++;
    if (i == len) return false;
    return em_prompt_has_control_text(text + i, len - i, sc->ops) || ends_inside_control_text(text + i, len - i, sc->ops);
}

typedef struct found {
    size_t pos;  /* of a marker in the rendered text */
    size_t mark; /* which one */
} found;

static int by_pos(const void *a, const void *b) {
    const found *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static bool push_piece(em_prompt_piece **pieces, size_t *n, size_t *cap, em_prompt_piece piece) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 16;
        em_prompt_piece *grown = realloc(*pieces, c * sizeof *grown);
        if (!grown) return false;
        *pieces = grown;
        *cap = c;
    }
    (*pieces)[(*n)++] = piece;
    return true;
}

em_err em_prompt_pieces(const char *rendered, size_t len, const em_prompt_mark *marks, size_t n_marks,
                        em_prompt_piece **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    found *where = NULL;
    size_t n_found = 0, cap_found = 0;
    for (size_t i = 0; i < n_marks; i++) {
        const char *from = rendered, *end = rendered + len, *hit;
        while (from < end && (hit = memmem(from, (size_t)(end - from), marks[i].marker, marks[i].marker_len))) {
            if (n_found == cap_found) {
                size_t c = cap_found ? 2 * cap_found : 16;
                found *grown = realloc(where, c * sizeof *grown);
                if (!grown) {
                    free(where);
                    return em_errorf(EM_ERR_NOMEM, "out of memory splitting the chat prompt");
                }
                where = grown;
                cap_found = c;
            }
            where[n_found++] = (found){.pos = (size_t)(hit - rendered), .mark = i};
            from = hit + marks[i].marker_len;
        }
    }
    if (n_found) qsort(where, n_found, sizeof *where, by_pos);
    em_prompt_piece *pieces = NULL;
    size_t cursor = 0, n = 0, cap = 0;
    bool ok = true;
    for (size_t k = 0; k < n_found && ok; k++) {
        const em_prompt_mark *m = &marks[where[k].mark];
        if (where[k].pos < cursor) continue; /* inside the previous marker: cannot happen with distinct random markers */
        if (where[k].pos > cursor)
            ok = push_piece(&pieces, &n, &cap,
                            (em_prompt_piece){.text = rendered + cursor, .len = where[k].pos - cursor, .special = true});
        ok = ok && push_piece(&pieces, &n, &cap, (em_prompt_piece){.text = m->text, .len = m->len, .special = false});
        cursor = where[k].pos + m->marker_len;
    }
    if (ok && (cursor < len || n == 0))
        ok = push_piece(&pieces, &n, &cap, (em_prompt_piece){.text = rendered + cursor, .len = len - cursor, .special = true});
    free(where);
    if (!ok) {
        free(pieces);
        return em_errorf(EM_ERR_NOMEM, "out of memory splitting the chat prompt");
    }
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

/* ---- Marking the conversation's hostile strings ---- */

/* Whether any string (key or value) in `v` is hostile. Recursion is bounded by jansson's parser,
 * which refuses documents nested deeper than 2048. */
static bool any_hostile(const json_t *v, const screen *sc) {
    if (json_is_string(v)) return is_hostile(json_string_value(v), json_string_length(v), sc);
    size_t i;
    const char *key;
    json_t *item;
    if (json_is_array(v))
        json_array_foreach((json_t *)v, i, item) if (any_hostile(item, sc)) return true;
    if (json_is_object(v))
        json_object_foreach((json_t *)v, key, item) if (is_hostile(key, strlen(key), sc) || any_hostile(item, sc))
            return true;
    return false;
}

typedef struct marking {
    const screen *screen;
    em_prompt_mark *marks;
    size_t n, cap;
    uint64_t state; /* of the random markers */
} marking;

static uint64_t next_random(uint64_t *state) {
    /* splitmix64: a well-mixed sequence from a random start */
    uint64_t x = (*state += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A new marker standing for `text`; NULL when out of memory (or no marker avoids control text). Letters and digits only, so that no
 * template filter short of changing case or cutting it alters it, and no control text is one. */
static const char *add_mark(marking *m, const char *text, size_t len) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    if (m->n == m->cap) {
        size_t c = m->cap ? 2 * m->cap : 8;
        em_prompt_mark *grown = realloc(m->marks, c * sizeof *grown);
        if (!grown) return NULL;
        m->marks = grown;
        m->cap = c;
    }
    size_t n = len < 8 ? 8 : len > 64 ? 64 : len;
    char *marker = malloc(n + 1);
    if (!marker) return NULL;
    int tries = 0;
    do {
        if (++tries > 100) { /* a vocabulary whose control texts are letters and digits */
            free(marker);
            return NULL;
        }
        for (size_t i = 0; i < n; i++) marker[i] = alphabet[next_random(&m->state) % (i ? 62 : 52)];
        marker[n] = 0;
    } while (is_hostile(marker, n, m->screen));
    m->marks[m->n++] = (em_prompt_mark){.marker = marker, .marker_len = n, .text = text, .len = len};
    return marker;
}

/* A copy of `v` with every hostile string (and key) replaced by a marker; NULL when out of memory. */
static json_t *mark_copy(const json_t *v, marking *m) {
    if (json_is_string(v)) {
        if (!is_hostile(json_string_value(v), json_string_length(v), m->screen)) return json_incref((json_t *)v);
        const char *marker = add_mark(m, json_string_value(v), json_string_length(v));
        return marker ? json_string(marker) : NULL;
    }
    size_t i;
    const char *key;
    json_t *item, *copy = NULL;
    if (json_is_array(v)) {
        if (!(copy = json_array())) return NULL;
        json_array_foreach((json_t *)v, i, item) if (json_array_append_new(copy, mark_copy(item, m))) goto fail;
        return copy;
    }
    if (json_is_object(v)) {
        if (!(copy = json_object())) return NULL;
        json_object_foreach((json_t *)v, key, item) {
            const char *name = is_hostile(key, strlen(key), m->screen) ? add_mark(m, key, strlen(key)) : key;
            if (!name || json_object_set_new(copy, name, mark_copy(item, m))) goto fail;
        }
        return copy;
    }
    return json_incref((json_t *)v); /* numbers, booleans, null */
fail:
    json_decref(copy);
    return NULL;
}

static void marking_free(marking *m) {
    for (size_t i = 0; i < m->n; i++) free((char *)m->marks[i].marker);
    free(m->marks);
}

/* Renders the conversation with its hostile strings marked and tokenizes it piece by piece. */
static em_err tokenize_split(const screen *sc, const em_text_chat *chat, int32_t **ids, size_t *n, size_t *cap) {
    const em_prompt_ops *ops = sc->ops;
    marking m = {.screen = sc, .state = ops->salt};
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) == (ssize_t)sizeof seed) m.state ^= seed << 1;
    em_text_chat marked = *chat;
    json_t *messages = chat->messages ? mark_copy(chat->messages, &m) : NULL;
    json_t *tools = chat->tools ? mark_copy(chat->tools, &m) : NULL;
    json_t *kwargs = chat->kwargs ? mark_copy(chat->kwargs, &m) : NULL;
    char *text = NULL;
    size_t len = 0;
    em_prompt_piece *pieces = NULL;
    size_t n_pieces = 0;
    em_err e = NULL;
    if ((chat->messages && !messages) || (chat->tools && !tools) || (chat->kwargs && !kwargs)) {
        e = em_errorf(EM_ERR_NOMEM, "out of memory rendering the chat prompt");
        goto done;
    }
    marked.messages = messages;
    marked.tools = tools;
    marked.kwargs = kwargs;
    if ((e = ops->render(ops->self, &marked, &text, &len))) goto done;
    if ((e = em_prompt_pieces(text, len, m.marks, m.n, &pieces, &n_pieces))) goto done;
    for (size_t k = 0; k < n_pieces && !e; k++) {
        int32_t *part = NULL;
        size_t n_part = 0;
        if (pieces[k].len == 0) continue;
        if (!(e = ops->tokenize(ops->self, pieces[k].text, pieces[k].len, pieces[k].special, &part, &n_part)))
            e = append_ids(ids, n, cap, part, n_part);
        free(part);
    }
done:
    json_decref(messages);
    json_decref(tools);
    json_decref(kwargs);
    marking_free(&m);
    free(text);
    free(pieces);
    return e;
}

em_err em_prompt_tokens(const em_prompt_ops *ops, const em_text_chat *chat, int32_t **ids_out, size_t *n_out) {
    *ids_out = NULL;
    *n_out = 0;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    em_err e = NULL;
    if (ops->add_bos && (e = append_ids(&ids, &n, &cap, &ops->bos, 1))) return e;
    screen sc;
    screen_init(&sc, ops);
    if (any_hostile(chat->messages, &sc) || any_hostile(chat->tools, &sc) || any_hostile(chat->kwargs, &sc)) {
        e = tokenize_split(&sc, chat, &ids, &n, &cap);
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
