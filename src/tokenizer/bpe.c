/* Byte-level BPE ("gpt2" vocabularies) and merging by rank, which SPM vocabularies that carry
 * merges use too.
 *
 * Merges are held as a hash map from a pair of symbol ids to (rank, id of the result), so the
 * merge loop never builds strings: a word starts as one symbol per byte (each byte's character
 * in GPT-2's byte alphabet), and a binary heap of adjacent pairs, ordered by rank and then by
 * position, picks the next merge. Stale heap entries (a side changed since it was pushed) are
 * recognized by comparing the ids stored in the entry and skipped. A merge may name a string the
 * vocabulary lacks; such strings get "virtual" ids past the vocabulary so that later merges can
 * still refer to them, and a symbol left with a virtual id at the end falls back to single
 * characters, as the reference tokenizer does. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* GPT-2's byte alphabet: the printable bytes stand for themselves; the other 68 bytes (0-32,
 * 127-160, 173) take the code points 256.. in byte order. */
uint32_t em_bpe_byte_char(uint8_t b) {
    if (b <= 32) return 256u + b;
    if (b >= 127 && b <= 160) return (uint32_t)b + 162u;
    if (b == 173) return 323u;
    return b;
}

int em_bpe_char_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)(cp - 256);
    if (cp >= 289 && cp <= 322) return (int)(cp - 162);
    if (cp == 323) return 173;
    return -1;
}

/* ---- loading merges ---- */

/* Strings that merges name but the vocabulary lacks → virtual ids (load time only). */
typedef struct virtual_map {
    struct virtual_entry {
        char *text;
        size_t len;
        int32_t id;
    } *slots;
    uint64_t mask, count;
    int32_t next_id;
} virtual_map;

static em_err virtual_id(virtual_map *vm, const char *text, size_t len, int32_t *id) {
    if ((vm->count + 1) * 2 > vm->mask + 1) {
        uint64_t size = (vm->mask + 1) * 2;
        struct virtual_entry *slots = calloc(size, sizeof *slots);
        if (!slots) return em_errorf(EM_ERR_NOMEM, "tokenizer: out of memory for merges");
        for (uint64_t i = 0; i <= vm->mask; i++) {
            if (!vm->slots[i].text) continue;
            uint64_t j = em_tok_hash(vm->slots[i].text, vm->slots[i].len) & (size - 1);
            while (slots[j].text) j = (j + 1) & (size - 1);
            slots[j] = vm->slots[i];
        }
        free(vm->slots);
        vm->slots = slots;
        vm->mask = size - 1;
    }
    uint64_t i = em_tok_hash(text, len) & vm->mask;
    for (; vm->slots[i].text; i = (i + 1) & vm->mask)
        if (vm->slots[i].len == len && !memcmp(vm->slots[i].text, text, len)) {
            *id = vm->slots[i].id;
            return NULL;
        }
    char *copy = malloc(len + 1);
    if (!copy) return em_errorf(EM_ERR_NOMEM, "tokenizer: out of memory for merges");
    memcpy(copy, text, len);
    vm->slots[i] = (struct virtual_entry){copy, len, vm->next_id};
    vm->count++;
    *id = vm->next_id++;
    return NULL;
}

static em_err symbol_id(const em_tokenizer *t, virtual_map *vm, const char *text, size_t len, int32_t *id) {
    *id = em_strmap_find(&t->map, text, len);
    return *id >= 0 ? NULL : virtual_id(vm, text, len, id);
}

static void pairmap_insert(em_pairmap *map, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    uint64_t key = (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    for (uint64_t i = h & map->mask;; i = (i + 1) & map->mask) {
        em_pair_slot *slot = &map->slots[i];
        if (slot->key == key) return; /* a pair listed twice keeps its first (best) rank */
        if (slot->key == 0) {
            *slot = (em_pair_slot){key, rank, merged};
            return;
        }
    }
}

em_err em_bpe_load_merges(em_tokenizer *t, const em_gguf_kv *merges, bool byte_level) {
    virtual_map vm = {calloc(1024, sizeof(struct virtual_entry)), 1023, 0, t->n_vocab};
    uint64_t size = 16;
    while (size < merges->array_len * 2) size <<= 1;
    t->merges.slots = calloc(size, sizeof *t->merges.slots);
    t->merges.mask = size - 1;
    char *joined = NULL;
    size_t joined_cap = 0;
    em_err err = NULL;
    if (!vm.slots || !t->merges.slots) {
        err = em_errorf(EM_ERR_NOMEM, "tokenizer: out of memory for %llu merges", (unsigned long long)merges->array_len);
        goto done;
    }
    if (byte_level)
        for (int b = 0; b < 256; b++) {
            char ch[4];
            size_t n = em_utf8_encode(em_bpe_byte_char((uint8_t)b), ch);
            if ((err = symbol_id(t, &vm, ch, n, &t->byte_symbol[b]))) goto done;
        }
    for (uint64_t r = 0; r < merges->array_len; r++) {
        em_str m = merges->strings[r];
        /* "LEFT RIGHT": split at the first space after the first byte (a side may be a space
         * character only in the byte alphabet, where it is spelled differently). */
        const char *space = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!space) {
            err = em_errorf(EM_ERR_FORMAT, "tokenizer.ggml.merges[%llu] '%.*s' has no space between its two parts",
                            (unsigned long long)r, (int)(m.len > 60 ? 60 : m.len), m.ptr);
            goto done;
        }
        size_t left_len = (size_t)(space - m.ptr), right_len = m.len - left_len - 1;
        if (left_len + right_len > joined_cap) {
            joined_cap = (left_len + right_len) * 2;
            char *grown = realloc(joined, joined_cap);
            if (!grown) {
                err = em_errorf(EM_ERR_NOMEM, "tokenizer: out of memory for merges");
                goto done;
            }
            joined = grown;
        }
        memcpy(joined, m.ptr, left_len);
        memcpy(joined + left_len, space + 1, right_len);
        int32_t left, right, merged;
        if ((err = symbol_id(t, &vm, m.ptr, left_len, &left)) || (err = symbol_id(t, &vm, space + 1, right_len, &right)) ||
            (err = symbol_id(t, &vm, joined, left_len + right_len, &merged)))
            goto done;
        pairmap_insert(&t->merges, left, right, (int32_t)r, merged);
    }
done:
    if (vm.slots)
        for (uint64_t i = 0; i <= vm.mask; i++) free(vm.slots[i].text);
    free(vm.slots);
    free(joined);
    return err;
}

/* ---- merging ---- */

/* A candidate merge of two adjacent symbols, with the ids they had when it was queued. */
typedef struct pair_entry {
    int32_t rank, left, right, left_id, right_id;
} pair_entry;

/* Lowest rank first; ties: leftmost. */
static bool pair_before(const void *a_, const void *b_) {
    const pair_entry *a = a_, *b = b_;
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static em_err try_pair(const em_tokenizer *t, em_scratch *s, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return NULL;
    const em_sym *a = &s->syms[left], *b = &s->syms[right];
    if (a->id < 0 || b->id < 0) return NULL;
    const em_pair_slot *m = em_pairmap_find(&t->merges, a->id, b->id);
    if (!m) return NULL;
    const pair_entry e = {m->rank, left, right, a->id, b->id};
    if (!em_heap_push(&s->pairs, &e, sizeof e, pair_before))
        return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory");
    return NULL;
}

em_err em_bpe_merge(const em_tokenizer *t, em_scratch *s) {
    s->pairs.n = 0;
    em_err err;
    for (int32_t i = 0; i + 1 < (int32_t)s->n_syms; i++)
        if ((err = try_pair(t, s, i, i + 1))) return err;
    while (s->pairs.n) {
        pair_entry e;
        em_heap_pop(&s->pairs, &e, sizeof e, pair_before);
        em_sym *a = &s->syms[e.left], *b = &s->syms[e.right];
        if (a->len == 0 || b->len == 0 || a->next != e.right || a->id != e.left_id || b->id != e.right_id) continue;
        const em_pair_slot *m = em_pairmap_find(&t->merges, a->id, b->id);
        a->id = m->merged;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) s->syms[b->next].prev = e.left;
        if ((err = try_pair(t, s, a->prev, e.left)) || (err = try_pair(t, s, e.left, a->next))) return err;
    }
    return NULL;
}

em_err em_scratch_reserve(em_scratch *s, size_t n_syms) {
    if (n_syms <= s->syms_cap) return NULL;
    size_t cap = n_syms < 256 ? 256 : n_syms * 2;
    em_sym *grown = realloc(s->syms, cap * sizeof *grown);
    if (!grown) return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory for %zu symbols", n_syms);
    s->syms = grown;
    s->syms_cap = cap;
    return NULL;
}

void em_scratch_free(em_scratch *s) {
    free(s->syms);
    em_heap_free(&s->pairs);
    em_heap_free(&s->bigrams);
    free(s->mapped);
}

/* ---- byte-level BPE ---- */

typedef struct bpe_call {
    const em_tokenizer *t;
    em_scratch *s;
    em_ids *out;
} bpe_call;

/* The word in GPT-2's byte alphabet, into s->mapped. */
static em_err map_word(em_scratch *s, const char *word, size_t len, size_t *mapped_len) {
    if (len * 2 > s->mapped_cap) {
        size_t cap = len * 4;
        char *grown = realloc(s->mapped, cap);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory");
        s->mapped = grown;
        s->mapped_cap = cap;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += em_utf8_encode(em_bpe_byte_char((uint8_t)word[i]), s->mapped + n);
    *mapped_len = n;
    return NULL;
}

/* A symbol whose string the vocabulary lacks: emit the single characters that are tokens. */
static em_err fallback_bytes(const em_tokenizer *t, const char *bytes, size_t len, em_ids *out) {
    for (size_t i = 0; i < len; i++) {
        int32_t id = t->byte_symbol[(uint8_t)bytes[i]];
        uint32_t cp = em_bpe_byte_char((uint8_t)bytes[i]);
        if (cp < 128 && id >= 0 && id < t->n_vocab) {
            em_err err = em_ids_push(out, id);
            if (err) return err;
        }
    }
    return NULL;
}

static em_err bpe_word(void *user, const char *word, size_t len) {
    bpe_call *c = user;
    const em_tokenizer *t = c->t;
    em_scratch *s = c->s;
    em_err err;
    if (t->ignore_merges && len > 1) {
        size_t mapped_len = 0;
        if ((err = map_word(s, word, len, &mapped_len))) return err;
        int32_t id = em_strmap_find(&t->map, s->mapped, mapped_len);
        if (id >= 0) return em_ids_push(c->out, id);
    }
    if ((err = em_scratch_reserve(s, len))) return err;
    for (size_t i = 0; i < len; i++)
        s->syms[i] = (em_sym){t->byte_symbol[(uint8_t)word[i]], (int32_t)i - 1,
                              i + 1 < len ? (int32_t)i + 1 : -1, (uint32_t)i, 1};
    s->n_syms = len;
    if (len > 1 && (err = em_bpe_merge(t, s))) return err;
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) {
        const em_sym *sym = &s->syms[i];
        err = sym->id < t->n_vocab ? em_ids_push(c->out, sym->id) : fallback_bytes(t, word + sym->start, sym->len, c->out);
        if (err) return err;
    }
    return NULL;
}

em_err em_bpe_encode(const em_tokenizer *t, em_scratch *s, const char *text, size_t len, em_ids *out) {
    bpe_call call = {t, s, out};
    return em_pretok_split(t->pretok, text, len, bpe_word, &call);
}
