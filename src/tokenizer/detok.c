/* Ids → text: the streaming detokenizer and whole-sequence decoding built on it.
 *
 * A token may end in the middle of a UTF-8 character (byte-level BPE and byte-fallback tokens
 * split characters freely), so bytes are held back until the character they start is complete;
 * what can never become valid UTF-8 comes out as U+FFFD instead.
 *
 * SPM's space prefix: encoding put one space in front of the text and after every special token.
 * With EM_DETOK_SEQUENCE_START the detokenizer takes exactly that space away again, so
 * decode(encode(s)) == s. Without the flag (generated text that continues a prompt) every space
 * stays. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define REPLACEMENT "\xEF\xBF\xBD"

struct em_detok {
    const em_tokenizer *t;
    unsigned flags;
    bool strip_space; /* the next text piece starts with SPM's prefix space */
    unsigned char pending[4];
    size_t n_pending;
    char *out;
    size_t out_cap;
};

em_err em_detok_new(const em_tokenizer *t, unsigned flags, em_detok **out) {
    *out = NULL;
    em_detok *d = calloc(1, sizeof *d);
    if (!d) return em_errorf(EM_ERR_NOMEM, "detokenizer: out of memory");
    d->t = t;
    d->flags = flags;
    d->strip_space = (flags & EM_DETOK_SEQUENCE_START) && t->kind == EM_TOKENIZER_SPM && t->add_space_prefix;
    *out = d;
    return NULL;
}

void em_detok_free(em_detok *d) {
    if (!d) return;
    free(d->out);
    free(d);
}

static em_err reserve(em_detok *d, size_t n) {
    if (n <= d->out_cap) return NULL;
    size_t cap = n < 256 ? 256 : n * 2;
    char *grown = realloc(d->out, cap);
    if (!grown) return em_errorf(EM_ERR_NOMEM, "detokenizer: out of memory");
    d->out = grown;
    d->out_cap = cap;
    return NULL;
}

/* Sequence length a lead byte announces, 0 for bytes that cannot start one. */
static size_t lead_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Whether s[0..n) (n below the full length) can still become a valid sequence. */
static bool valid_prefix(const unsigned char *s, size_t n) {
    for (size_t k = 1; k < n; k++)
        if ((s[k] & 0xC0) != 0x80) return false;
    if (n >= 2) { /* the second byte's range rules out overlongs and surrogates early */
        if (s[0] == 0xE0 && s[1] < 0xA0) return false;
        if (s[0] == 0xED && s[1] > 0x9F) return false;
        if (s[0] == 0xF0 && s[1] < 0x90) return false;
        if (s[0] == 0xF4 && s[1] > 0x8F) return false;
    }
    return true;
}

/* Appends the complete characters of pending + bytes to d->out at *n; keeps an incomplete tail. */
static em_err push_bytes(em_detok *d, const char *bytes, size_t len, size_t *n) {
    em_err err = reserve(d, *n + (d->n_pending + len) * 3 + 4);
    if (err) return err;
    /* Work on pending + bytes without copying bytes: take pending first. */
    unsigned char seq[4];
    size_t have = d->n_pending;
    memcpy(seq, d->pending, have);
    d->n_pending = 0;
    size_t i = 0;
    for (;;) {
        while (have < 4 && i < len && (have == 0 || have < (lead_len(seq[0]) ? lead_len(seq[0]) : 1)))
            seq[have++] = (unsigned char)bytes[i++];
        if (have == 0) break;
        size_t need = lead_len(seq[0]);
        if (need == 0) { /* not a lead byte */
            memcpy(d->out + *n, REPLACEMENT, 3), *n += 3;
            memmove(seq, seq + 1, --have);
            continue;
        }
        if (have < need) {
            if (!valid_prefix(seq, have)) {
                memcpy(d->out + *n, REPLACEMENT, 3), *n += 3;
                memmove(seq, seq + 1, --have);
                continue;
            }
            memcpy(d->pending, seq, have); /* wait for more bytes */
            d->n_pending = have;
            break;
        }
        if (em_utf8_validate((const char *)seq, need) == need) {
            memcpy(d->out + *n, seq, need), *n += need;
            memmove(seq, seq + need, have - need);
            have -= need;
        } else {
            memcpy(d->out + *n, REPLACEMENT, 3), *n += 3;
            memmove(seq, seq + 1, --have);
        }
        /* Fast path: copy a run of ASCII straight through. */
        if (have == 0) {
            size_t start = i;
            while (i < len && (unsigned char)bytes[i] < 0x80) i++;
            memcpy(d->out + *n, bytes + start, i - start);
            *n += i - start;
        }
    }
    return NULL;
}

em_err em_detok_feed(em_detok *d, int32_t id, const char **bytes, size_t *len) {
    *bytes = "";
    *len = 0;
    const em_tokenizer *t = d->t;
    /* A model may have more output rows than the tokenizer has tokens (embedding tables padded to
     * a round size): such an id, like an unused [PADn] token, has no text. */
    if (id < 0 || id >= t->n_vocab) return NULL;
    const char *piece;
    size_t n_piece = em_token_to_piece(t, id, (d->flags & EM_DETOK_SPECIAL) != 0, &piece);
    const uint16_t attr = t->tokens[id].attr;
    bool special = (attr & (EM_ATTR_CONTROL | EM_ATTR_UNKNOWN | EM_ATTR_USER_DEFINED)) != 0;
    if (d->strip_space && !special && n_piece) {
        if (piece[0] == ' ') piece++, n_piece--;
        d->strip_space = false;
    }
    if (special && (d->flags & EM_DETOK_SEQUENCE_START) && t->kind == EM_TOKENIZER_SPM && t->add_space_prefix)
        d->strip_space = true; /* encoding put a prefix space after this token */
    size_t n = 0;
    em_err err = push_bytes(d, piece, n_piece, &n);
    if (err) return err;
    *bytes = d->out;
    *len = n;
    return NULL;
}

em_err em_detok_feed_special(em_detok *d, int32_t id, const char **bytes, size_t *len) {
    const unsigned flags = d->flags;
    d->flags |= EM_DETOK_SPECIAL;
    em_err err = em_detok_feed(d, id, bytes, len);
    d->flags = flags;
    return err;
}

size_t em_detok_flush(em_detok *d, const char **bytes) {
    *bytes = "";
    if (!d->n_pending) return 0;
    d->n_pending = 0;
    *bytes = REPLACEMENT;
    return 3;
}

em_err em_detokenize(const em_tokenizer *t, const int32_t *ids, size_t n, bool special, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    em_detok *d;
    em_err err = em_detok_new(t, EM_DETOK_SEQUENCE_START | (special ? EM_DETOK_SPECIAL : 0), &d);
    if (err) return err;
    size_t cap = 256, used = 0;
    char *result = malloc(cap);
    if (!result) err = em_errorf(EM_ERR_NOMEM, "detokenize: out of memory");
    for (size_t i = 0; i <= n && !err; i++) {
        const char *bytes;
        size_t k;
        if (i < n) err = em_detok_feed(d, ids[i], &bytes, &k);
        else k = em_detok_flush(d, &bytes);
        if (err) break;
        if (used + k + 1 > cap) {
            cap = (used + k + 1) * 2;
            char *grown = realloc(result, cap);
            if (!grown) {
                err = em_errorf(EM_ERR_NOMEM, "detokenize: out of memory");
                break;
            }
            result = grown;
        }
        memcpy(result + used, bytes, k);
        used += k;
    }
    em_detok_free(d);
    if (err) {
        free(result);
        return err;
    }
    result[used] = 0;
    *text = result;
    *len = used;
    return NULL;
}
