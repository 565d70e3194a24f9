/* SentencePiece-style tokenization ("llama" vocabularies).
 *
 * The text is escaped (each space becomes U+2581, with one more in front when the vocabulary asks
 * for a space prefix) and split into UTF-8 characters. Without merges in the file, the pair of
 * adjacent symbols whose concatenation is the vocabulary token with the highest score is merged
 * first (ties: leftmost), until no adjacent pair forms a token; this is SentencePiece's BPE
 * encoding. With merges (tokenizer.json BPE models with byte fallback), merge ranks decide, as in
 * bpe.c. A symbol that is no token comes out as its bytes' <0xNN> tokens. Gemma 4's vocabulary
 * ("gemma4") merges runs of newlines and runs of other characters apart, and takes a run of
 * newlines that is a token whole, without merging.
 *
 * Speed: merging the whole text at once keeps a heap as large as the text. But no merge can
 * join two characters that appear side by side in no token, so the text is cut at every such
 * place and each piece is merged on its own: the same result, with small heaps.
 *
 * Control tokens are never formed by merging: their text in user input must not turn into them
 * (parse_special is how a caller asks for control tokens). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* A candidate merge of two adjacent symbols into a token of `size` bytes. */
typedef struct bigram_entry {
    float score;
    int32_t left, right;
    uint32_t size;
} bigram_entry;

/* Highest score first; ties: leftmost. */
static bool bigram_before(const void *a_, const void *b_) {
    const bigram_entry *a = a_, *b = b_;
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static em_err try_bigram(const em_tokenizer *t, em_scratch *s, const char *text, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return NULL;
    const em_sym *a = &s->syms[left], *b = &s->syms[right];
    uint32_t size = a->len + b->len;
    if (size > t->max_token_len) return NULL;
    int32_t id = em_strmap_find(&t->map, text + a->start, size);
    if (id < 0 || (t->tokens[id].attr & EM_ATTR_CONTROL)) return NULL;
    const bigram_entry e = {t->tokens[id].score, left, right, size};
    if (!em_heap_push(&s->bigrams, &e, sizeof e, bigram_before))
        return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory");
    return NULL;
}

static em_err merge_by_score(const em_tokenizer *t, em_scratch *s, const char *text) {
    s->bigrams.n = 0;
    em_err err;
    for (int32_t i = 0; i + 1 < (int32_t)s->n_syms; i++)
        if ((err = try_bigram(t, s, text, i, i + 1))) return err;
    while (s->bigrams.n) {
        bigram_entry e;
        em_heap_pop(&s->bigrams, &e, sizeof e, bigram_before);
        em_sym *a = &s->syms[e.left], *b = &s->syms[e.right];
        if (a->len == 0 || b->len == 0 || a->len + b->len != e.size) continue; /* stale */
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) s->syms[b->next].prev = e.left;
        if ((err = try_bigram(t, s, text, a->prev, e.left)) || (err = try_bigram(t, s, text, e.left, a->next)))
            return err;
    }
    return NULL;
}

static em_err push_bytes(const em_tokenizer *t, const char *bytes, size_t len, em_ids *out) {
    for (size_t i = 0; i < len; i++) {
        int32_t id = t->byte_token[(uint8_t)bytes[i]];
        if (id < 0) continue; /* neither a byte token nor an unknown token: nothing to say it with */
        em_err err = em_ids_push(out, id);
        if (err) return err;
    }
    return NULL;
}

static uint64_t pair_key(uint32_t a, uint32_t b) { return ((uint64_t)a << 21 | b) + 1; }

static uint64_t pair_hash(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 31);
}

static bool pair_possible(const em_tokenizer *t, uint32_t a, uint32_t b) {
    uint64_t key = pair_key(a, b);
    for (uint64_t i = pair_hash(key) & t->pairs_mask;; i = (i + 1) & t->pairs_mask) {
        if (t->pairs[i] == key) return true;
        if (t->pairs[i] == 0) return false;
    }
}

em_err em_spm_build_pairs(em_tokenizer *t) {
    uint64_t total = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) total += t->tokens[id].text_len;
    uint64_t size = 1024;
    while (size < total * 2) size <<= 1;
    t->pairs = calloc(size, sizeof *t->pairs);
    if (!t->pairs) return em_errorf(EM_ERR_NOMEM, "tokenizer: out of memory for the pair set");
    t->pairs_mask = size - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *text = t->arena + t->tokens[id].text_off;
        size_t len = t->tokens[id].text_len;
        if (em_utf8_validate(text, len) != len) continue; /* cannot match valid input text anyway */
        uint32_t prev = 0;
        for (size_t i = 0; i < len;) {
            size_t k;
            uint32_t cp = em_utf8_decode(text + i, &k);
            if (i > 0) {
                uint64_t key = pair_key(prev, cp);
                uint64_t j = pair_hash(key) & t->pairs_mask;
                while (t->pairs[j] && t->pairs[j] != key) j = (j + 1) & t->pairs_mask;
                t->pairs[j] = key;
            }
            prev = cp;
            i += k;
        }
    }
    return NULL;
}

/* Merges and emits esc[from, to). */
static em_err encode_piece(const em_tokenizer *t, em_scratch *s, const char *esc, size_t from, size_t to, em_ids *out) {
    em_err err = em_scratch_reserve(s, to - from);
    if (err) return err;
    size_t count = 0;
    for (size_t i = from; i < to;) {
        size_t k = em_utf8_len((unsigned char)esc[i]);
        int32_t id = EM_TOKEN_NONE;
        if (t->has_merges)
            id = k == 1 && (unsigned char)esc[i] < 128 ? t->ascii_token[(unsigned char)esc[i]] : em_strmap_find(&t->map, esc + i, k);
        s->syms[count] = (em_sym){id, (int32_t)count - 1, i + k < to ? (int32_t)count + 1 : -1, (uint32_t)i, (uint32_t)k};
        count++;
        i += k;
    }
    s->n_syms = count;
    if (count > 1) err = t->has_merges ? em_bpe_merge(t, s) : merge_by_score(t, s, esc);
    if (err) return err;
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) {
        const em_sym *sym = &s->syms[i];
        int32_t id = t->has_merges ? (sym->id < t->n_vocab ? sym->id : EM_TOKEN_NONE)
                                   : em_strmap_find(&t->map, esc + sym->start, sym->len);
        err = id >= 0 ? em_ids_push(out, id) : push_bytes(t, esc + sym->start, sym->len, out);
        if (err) return err;
    }
    return NULL;
}

/* Merges and emits esc[from, to), cut where two characters stand side by side in no token. */
static em_err encode_run(const em_tokenizer *t, em_scratch *s, const char *esc, size_t from, size_t to, em_ids *out) {
    size_t start = from;
    uint32_t prev = 0;
    for (size_t i = from; i < to;) {
        size_t k;
        uint32_t cp = em_utf8_decode(esc + i, &k);
        if (i > start && !pair_possible(t, prev, cp)) {
            em_err err = encode_piece(t, s, esc, start, i, out);
            if (err) return err;
            start = i;
        }
        prev = cp;
        i += k;
    }
    return to > start ? encode_piece(t, s, esc, start, to, out) : NULL;
}

em_err em_spm_encode(const em_tokenizer *t, em_scratch *s, const char *text, size_t len, bool prefix, em_ids *out) {
    /* Escape: optional prefix, spaces → U+2581. */
    size_t cap = (len + 1) * 3;
    if (cap > s->mapped_cap) {
        char *grown = realloc(s->mapped, cap);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory for %zu bytes", cap);
        s->mapped = grown;
        s->mapped_cap = cap;
    }
    char *esc = s->mapped;
    size_t n = 0;
    if (prefix) memcpy(esc, "\xE2\x96\x81", 3), n = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') memcpy(esc + n, "\xE2\x96\x81", 3), n += 3;
        else esc[n++] = text[i];
    }
    if (!t->newline_runs) return encode_run(t, s, esc, 0, n, out);
    /* gemma4: runs of newlines and runs of anything else, each on its own. */
    em_err err = NULL;
    for (size_t from = 0, to; from < n && !err; from = to) {
        bool newlines = esc[from] == '\n';
        for (to = from + 1; to < n && (esc[to] == '\n') == newlines; to++) {}
        int32_t whole = newlines ? em_strmap_find(&t->map, esc + from, to - from) : EM_TOKEN_NONE;
        err = whole >= 0 ? em_ids_push(out, whole) : encode_run(t, s, esc, from, to, out);
    }
    return err;
}
