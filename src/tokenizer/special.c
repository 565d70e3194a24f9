/* Special tokens in text: finding the text of control, unknown and user-defined tokens and cutting
 * the input there, before the vocabulary's algorithm sees the raw pieces in between.
 *
 * Control and unknown tokens are looked for only when the caller asks (parse_special): user text
 * must never be able to produce <|im_end|>. User-defined (added) tokens are always looked for,
 * as Hugging Face tokenizers do. The scan goes left to right and takes, at each position, the
 * longest special token that starts there (Hugging Face's added-token matching). Candidates are
 * indexed by their first two bytes, so a position costs one table lookup unless a special token
 * could start there. */
#include "internal.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX_SLOTS 65536u

typedef struct sort_item {
    const em_tokenizer *t;
    int32_t id;
} sort_item;

static unsigned prefix_of(const em_tokenizer *t, int32_t id) {
    const unsigned char *s = (const unsigned char *)t->arena + t->tokens[id].text_off;
    return t->tokens[id].text_len >= 2 ? (unsigned)s[0] << 8 | s[1] : PREFIX_SLOTS + s[0];
}

static int compare(const void *pa, const void *pb) {
    const sort_item *a = pa, *b = pb;
    const em_tokenizer *t = a->t;
    unsigned ka = prefix_of(t, a->id), kb = prefix_of(t, b->id);
    if (ka != kb) return ka < kb ? -1 : 1;
    uint32_t la = t->tokens[a->id].text_len, lb = t->tokens[b->id].text_len;
    if (la != lb) return la > lb ? -1 : 1; /* longest first */
    return a->id < b->id ? -1 : a->id > b->id;
}

em_err em_special_build(em_tokenizer *t) {
    size_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((t->tokens[id].attr & (EM_ATTR_CONTROL | EM_ATTR_UNKNOWN | EM_ATTR_USER_DEFINED)) && t->tokens[id].text_len)
            n++;
    /* Index: slots 0..65535 for two-byte prefixes, 65536..65791 for one-byte tokens. */
    t->special_start = calloc(PREFIX_SLOTS + 256 + 1, sizeof *t->special_start);
    sort_item *items = malloc((n ? n : 1) * sizeof *items);
    t->special = malloc((n ? n : 1) * sizeof *t->special);
    if (!items || !t->special || !t->special_start) {
        free(items);
        return em_errorf(EM_ERR_NOMEM, "tokenizer: out of memory for special tokens");
    }
    n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((t->tokens[id].attr & (EM_ATTR_CONTROL | EM_ATTR_UNKNOWN | EM_ATTR_USER_DEFINED)) && t->tokens[id].text_len)
            items[n++] = (sort_item){t, id};
    qsort(items, n, sizeof *items, compare);
    for (size_t i = 0; i < n; i++) {
        t->special[i] = items[i].id;
        t->n_user_defined += (t->tokens[items[i].id].attr & EM_ATTR_USER_DEFINED) != 0;
        t->special_start[prefix_of(t, items[i].id) + 1]++;
    }
    for (size_t k = 0; k < PREFIX_SLOTS + 256; k++) t->special_start[k + 1] += t->special_start[k];
    t->n_special = (uint32_t)n;
    free(items);
    return NULL;
}

/* The longest special token starting at text[i] that may match, or -1. */
static int32_t match_at(const em_tokenizer *t, const char *text, size_t len, size_t i, bool parse_special) {
    const unsigned char *s = (const unsigned char *)text + i;
    unsigned slots[2] = {PREFIX_SLOTS + s[0], PREFIX_SLOTS + s[0]};
    if (len - i >= 2) slots[0] = (unsigned)s[0] << 8 | s[1];
    for (int k = 0; k < 2; k++) {
        if (k == 1 && slots[1] == slots[0]) break;
        for (uint32_t j = t->special_start[slots[k]]; j < t->special_start[slots[k] + 1]; j++) {
            int32_t id = t->special[j];
            const em_tok_entry *e = &t->tokens[id];
            if (!parse_special && !(e->attr & EM_ATTR_USER_DEFINED)) continue;
            if (e->text_len <= len - i && !memcmp(t->arena + e->text_off, text + i, e->text_len)) return id;
        }
    }
    return -1;
}

typedef struct frags {
    em_fragment *items;
    size_t n, cap;
} frags;

static em_err frags_push(frags *f, size_t off, size_t len, int32_t token) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        em_fragment *grown = realloc(f->items, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory");
        f->items = grown;
        f->cap = cap;
    }
    f->items[f->n++] = (em_fragment){off, len, token};
    return NULL;
}

em_err em_special_split(const em_tokenizer *t, const char *text, size_t len, bool parse_special, em_fragment **out,
                        size_t *n) {
    frags f = {0};
    em_err err = NULL;
    size_t raw = 0; /* start of the pending raw piece */
    bool any = parse_special ? t->n_special > 0 : t->n_user_defined > 0;
    for (size_t i = any ? 0 : len; i < len;) {
        int32_t id = match_at(t, text, len, i, parse_special);
        if (id < 0) {
            i++;
            continue;
        }
        const em_tok_entry *e = &t->tokens[id];
        size_t raw_end = i;
        if (e->attr & EM_ATTR_LSTRIP)
            while (raw_end > raw && isspace((unsigned char)text[raw_end - 1])) raw_end--;
        if (raw_end > raw && (err = frags_push(&f, raw, raw_end - raw, -1))) goto fail;
        if ((err = frags_push(&f, i, e->text_len, id))) goto fail;
        i += e->text_len;
        if (e->attr & EM_ATTR_RSTRIP)
            while (i < len && isspace((unsigned char)text[i])) i++;
        raw = i;
    }
    if (len > raw && (err = frags_push(&f, raw, len - raw, -1))) goto fail;
    *out = f.items;
    *n = f.n;
    return NULL;
fail:
    free(f.items);
    return err;
}
