/* em_tokenize: validation, normalization, special-token splitting, then the vocabulary's own
 * algorithm on each raw piece, with BOS/EOS around the result. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static em_err encode_fragments(const em_tokenizer *t, const char *text, size_t len, bool parse_special, em_ids *out) {
    em_fragment *frags = NULL;
    size_t n_frags = 0;
    em_err err = em_special_split(t, text, len, parse_special, &frags, &n_frags);
    if (err) return err;
    em_scratch scratch = {0};
    /* SPM puts its space prefix at the start of the text and after each special token. */
    bool prev_special = true;
    for (size_t i = 0; i < n_frags && !err; i++) {
        const em_fragment *f = &frags[i];
        if (f->token >= 0) {
            err = em_ids_push(out, f->token);
            prev_special = true;
            continue;
        }
        switch (t->kind) {
        case EM_TOKENIZER_SPM:
            err = em_spm_encode(t, &scratch, text + f->off, f->len, t->add_space_prefix && prev_special, out);
            break;
        case EM_TOKENIZER_BPE: err = em_bpe_encode(t, &scratch, text + f->off, f->len, out); break;
        case EM_TOKENIZER_WPM: err = em_wpm_encode(t, text + f->off, f->len, out); break;
        }
        prev_special = false;
    }
    em_scratch_free(&scratch);
    free(frags);
    return err;
}

em_err em_tokenize(const em_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                   int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!text && len) return em_errorf(EM_ERR_INVALID, "tokenize: NULL text of %zu bytes", len);
    size_t bad = em_utf8_validate(text, len);
    if (bad < len)
        return em_errorf(EM_ERR_INVALID, "tokenize: invalid UTF-8 at byte %zu (0x%02X)", bad, (unsigned char)text[bad]);
    em_ids out = {0};
    em_err err = NULL;
    utf8proc_uint8_t *normalized = NULL;
    if (t->normalize_nfc && len) {
        utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &normalized,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (m < 0) return em_errorf(EM_ERR_INVALID, "tokenize: NFC normalization failed: %s", utf8proc_errmsg(m));
        text = (const char *)normalized;
        len = (size_t)m;
    }
    bool wpm = t->kind == EM_TOKENIZER_WPM;
    int32_t first = wpm ? t->cls : t->bos, last = wpm ? t->sep : t->eos;
    if (add_special && (wpm || t->add_bos) && first >= 0) err = em_ids_push(&out, first);
    if (!err && len) err = encode_fragments(t, text, len, parse_special, &out);
    if (!err && add_special && (wpm || t->add_eos) && last >= 0) err = em_ids_push(&out, last);
    free(normalized);
    if (err) {
        free(out.ids);
        return err;
    }
    *ids = out.ids;
    *n = out.n;
    return NULL;
}
