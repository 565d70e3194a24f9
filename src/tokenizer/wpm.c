/* WordPiece ("bert" vocabularies, embedding models).
 *
 * Normalization as BERT's basic tokenizer does it: NFD (utf8proc), lower case, accents (nonspacing
 * marks) and control characters dropped; words end at whitespace, and every punctuation character, ASCII symbol and CJK
 * ideograph is a word of its own. Each word then takes the longest vocabulary entry that
 * starts it, again and again; a word with any part that matches nothing becomes [UNK].
 * GGUF stores word-initial pieces with a U+2581 in front and continuation pieces bare (the
 * converter's rewrite of BERT's "##"), so the search runs on U+2581 + word. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static bool is_whitespace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* CJK ideograph blocks, as BERT's tokenizer lists them. */
static bool is_cjk(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

static bool is_punctuation(utf8proc_category_t c) {
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

static bool is_symbol(utf8proc_category_t c) {
    return c >= UTF8PROC_CATEGORY_SM && c <= UTF8PROC_CATEGORY_SO;
}

static bool is_control(utf8proc_category_t c) {
    return c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CO ||
           c == UTF8PROC_CATEGORY_CS;
}

/* Greedy longest-prefix pieces of one word (starting with U+2581 at word[0..3)). */
static em_err encode_word(const em_tokenizer *t, const char *word, size_t n, em_ids *out) {
    size_t mark = out->n;
    em_err err;
    for (size_t i = 0; i < n;) {
        size_t j = n - i < t->max_token_len ? n : i + t->max_token_len;
        int32_t id = EM_TOKEN_NONE;
        for (; j > i; j--) {
            if (j < n && (word[j] & 0xC0) == 0x80) continue; /* never end inside a character */
            id = em_strmap_find(&t->map, word + i, j - i);
            if (id >= 0) break;
        }
        if (id < 0) {
            out->n = mark; /* the whole word is unknown */
            break;
        }
        if ((err = em_ids_push(out, id))) return err;
        i = j;
    }
    return out->n == mark && t->unk >= 0 ? em_ids_push(out, t->unk) : NULL;
}

em_err em_wpm_encode(const em_tokenizer *t, const char *text, size_t len, em_ids *out) {
    utf8proc_uint8_t *nfd = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfd,
                                      UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    if (m < 0) return em_errorf(EM_ERR_INVALID, "tokenize: NFD normalization failed: %s", utf8proc_errmsg(m));
    /* Lower-casing can lengthen a character's UTF-8 (at most 4 bytes each); plus the marks. */
    char *word = malloc((size_t)m * 4 + 8);
    if (!word) {
        free(nfd);
        return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory");
    }
    em_err err = NULL;
    size_t w = 3;
    memcpy(word, "\xE2\x96\x81", 3);
    for (utf8proc_ssize_t i = 0; i <= m && !err;) {
        uint32_t cp = 0x20;
        size_t k = 1;
        if (i < m) cp = em_utf8_decode((const char *)nfd + i, &k);
        i += (utf8proc_ssize_t)k;
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
        bool alone = is_punctuation(cat) || (cp < 0x7F && is_symbol(cat)) || is_cjk(cp);
        if (is_whitespace(cp) || alone) {
            if (w > 3) err = encode_word(t, word, w, out);
            w = 3;
            if (alone && !err) {
                w += em_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), word + w);
                err = encode_word(t, word, w, out);
                w = 3;
            }
            continue;
        }
        /* Accents go: after NFD they are nonspacing marks (BERT's strip_accents). */
        if (cp == 0 || cp == 0xFFFD || is_control(cat) || cat == UTF8PROC_CATEGORY_MN) continue;
        w += em_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), word + w);
    }
    free(word);
    free(nfd);
    return err;
}
