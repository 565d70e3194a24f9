/*
 * Private to src/tokenizer: the tokenizer's data layout and the functions its files share.
 * Nothing outside this folder includes it; the module's interface is tokenizer.h.
 */
#ifndef EMBER_TOKENIZER_INTERNAL_H
#define EMBER_TOKENIZER_INTERNAL_H

#include "tokenizer.h"

/* Token attributes (bits), derived from the token type plus a few per-model rules. */
enum {
    EM_ATTR_NORMAL = 1u << 0,
    EM_ATTR_UNKNOWN = 1u << 1,
    EM_ATTR_CONTROL = 1u << 2,
    EM_ATTR_USER_DEFINED = 1u << 3,
    EM_ATTR_UNUSED = 1u << 4,
    EM_ATTR_BYTE = 1u << 5,
    EM_ATTR_LSTRIP = 1u << 6, /* eat whitespace left of the token when matched in text */
    EM_ATTR_RSTRIP = 1u << 7, /* ... and right of it */
    EM_ATTR_EOG = 1u << 8,
};

typedef struct em_tok_entry {
    uint32_t text_off, text_len;   /* stored text, in em_tokenizer.arena */
    uint32_t piece_off, piece_len; /* decoded bytes, in em_tokenizer.arena */
    float score;
    uint16_t attr;
    uint8_t type;
} em_tok_entry;

/* Open-addressing map from byte strings (held in an arena) to ids. */
typedef struct em_strmap {
    uint32_t *slots; /* id + 1, 0 = empty */
    uint64_t mask;
    const char *arena;
    const em_tok_entry *entries;
} em_strmap;

/* Open-addressing map from a pair of symbol ids to a merge (rank, resulting id). */
typedef struct em_pair_slot {
    uint64_t key; /* (left << 32 | right) + 1, 0 = empty */
    int32_t rank;
    int32_t merged;
} em_pair_slot;

typedef struct em_pairmap {
    em_pair_slot *slots;
    uint64_t mask;
} em_pairmap;

typedef struct em_pretok em_pretok; /* compiled pre-tokenizer regexes (pretok.c) */

struct em_tokenizer {
    em_tokenizer_kind kind;
    int32_t n_vocab;
    em_tok_entry *tokens;
    char *arena;
    size_t arena_len;
    em_strmap map; /* stored text → id; on duplicates the last id wins */
    size_t max_token_len;

    int32_t bos, eos, eot, eom, unk, sep, pad, cls, mask;
    bool add_bos, add_eos, add_space_prefix, ignore_merges, normalize_nfc;
    /* "gemma4": SPM with merges whose text is first cut into runs of newlines and runs of
     * everything else, each merged on its own; a run of newlines that is a token is taken whole. */
    bool newline_runs;

    /* Special tokens that can be matched in text (control, unknown, user-defined), grouped by
     * their first two bytes (one-byte tokens after all pairs), longest first within a group;
     * special_start[k] .. special_start[k+1] index group k (special.c). */
    int32_t *special;
    uint32_t n_special, n_user_defined;
    uint32_t *special_start;

    /* Merges (BPE; SPM when the file has merges). Ids >= n_vocab are "virtual": strings that a
     * merge names but the vocabulary lacks. */
    em_pairmap merges;
    bool has_merges;
    int32_t byte_symbol[256]; /* BPE: symbol id of each byte's GPT-2 character */
    int32_t byte_token[256];  /* SPM: the <0xNN> token of each byte, or the byte as text */
    int32_t ascii_token[128]; /* SPM with merges: id of each ASCII character, or -1 */
    em_pretok *pretok;
    /* SPM: the set of adjacent code-point pairs inside any token (spm.c); text splits freely
     * between two characters that no token contains side by side. */
    uint64_t *pairs;
    uint64_t pairs_mask;
};

/* Growable id array used while tokenizing. */
typedef struct em_ids {
    int32_t *ids;
    size_t n, cap;
} em_ids;

em_err em_ids_push(em_ids *ids, int32_t id);

uint64_t em_tok_hash(const char *data, size_t len);
int32_t em_strmap_find(const em_strmap *map, const char *text, size_t len);

/* Merge lookup: the slot for (left, right), or NULL. */
static inline const em_pair_slot *em_pairmap_find(const em_pairmap *map, int32_t left, int32_t right) {
    uint64_t key = (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    for (uint64_t i = h & map->mask;; i = (i + 1) & map->mask) {
        const em_pair_slot *slot = &map->slots[i];
        if (slot->key == key) return slot;
        if (slot->key == 0) return NULL;
    }
}

/* The GPT-2 byte alphabet: the code point that stands for each byte (bytes_to_unicode). */
uint32_t em_bpe_byte_char(uint8_t byte);
/* Inverse: the byte a code point stands for, or -1. */
int em_bpe_char_byte(uint32_t cp);
/* Loads the merges of tokenizer.ggml.merges into tokenizer->merges. */
em_err em_bpe_load_merges(em_tokenizer *tokenizer, const em_gguf_kv *merges, bool byte_level);

/* A symbol while merging: a run of the input [start, start+len) known as token (or virtual) id
 * `id`, -1 when it is no token; prev/next link the live symbols (len 0 = merged away). */
typedef struct em_sym {
    int32_t id, prev, next;
    uint32_t start, len;
} em_sym;

/* Per-call scratch, reused across the words of one em_tokenize call. */
typedef struct em_scratch {
    em_sym *syms;
    size_t n_syms, syms_cap;
    em_heap pairs;   /* byte-level BPE and merges-based SPM: candidate merges by rank (bpe.c) */
    em_heap bigrams; /* score-based SPM: candidate merges by score (spm.c) */
    char *mapped;
    size_t mapped_cap;
} em_scratch;

em_err em_scratch_reserve(em_scratch *s, size_t n_syms);
void em_scratch_free(em_scratch *s);
/* Merges s->syms[0 .. n_syms) by merge rank (symbol 0 stays the head of the list). */
em_err em_bpe_merge(const em_tokenizer *tokenizer, em_scratch *s);

/* One fragment of raw text (no special tokens in it) → ids, appended to out. */
em_err em_spm_build_pairs(em_tokenizer *tokenizer);
/* prefix: put SPM's space prefix in front (start of text, or after a special token). */
em_err em_spm_encode(const em_tokenizer *tokenizer, em_scratch *s, const char *text, size_t len, bool prefix,
                     em_ids *out);
em_err em_bpe_encode(const em_tokenizer *tokenizer, em_scratch *s, const char *text, size_t len, em_ids *out);
em_err em_wpm_encode(const em_tokenizer *tokenizer, const char *text, size_t len, em_ids *out);

/* Pre-tokenizer: compiled from the name in tokenizer.ggml.pre. */
em_err em_pretok_new(const char *name, em_pretok **out);
void em_pretok_free(em_pretok *pretok);
/* Splits text into words: calls `word` for each in order. */
typedef em_err (*em_pretok_word_fn)(void *user, const char *word, size_t len);
em_err em_pretok_split(const em_pretok *pretok, const char *text, size_t len, em_pretok_word_fn word,
                       void *user);

/* Special tokens: builds the matcher (special.c). */
em_err em_special_build(em_tokenizer *tokenizer);
/* A piece of the input: raw text [off, off+len) when token < 0, else one special token. */
typedef struct em_fragment {
    size_t off, len;
    int32_t token;
} em_fragment;
/* Splits text at the special tokens found in it (control and unknown ones only when
 * parse_special). *out is malloc'd (the caller frees it). */
em_err em_special_split(const em_tokenizer *tokenizer, const char *text, size_t len, bool parse_special,
                        em_fragment **out, size_t *n);

/* UTF-8 helpers: length of the sequence a lead byte starts (1 for invalid lead bytes). */
static inline size_t em_utf8_len(unsigned char lead) {
    static const uint8_t lengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lengths[lead >> 4];
}
/* Offset of the first invalid byte, or len when all of text is valid UTF-8. */
size_t em_utf8_validate(const char *text, size_t len);
/* Decodes one code point at text (valid UTF-8 assumed); *n gets its byte length. */
uint32_t em_utf8_decode(const char *text, size_t *n);
size_t em_utf8_encode(uint32_t cp, char *out);

#endif
