/* Building a tokenizer from GGUF metadata: the token table, the text → id map, special ids,
 * token attributes and the decoded bytes of every token. See tokenizer.h. */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE_MARK "\xE2\x96\x81" /* U+2581, SentencePiece's stand-in for a space */

/* ---- small shared helpers ---- */

em_err em_ids_push(em_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *grown = realloc(ids->ids, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory for %zu ids", cap);
        ids->ids = grown;
        ids->cap = cap;
    }
    ids->ids[ids->n++] = id;
    return NULL;
}

uint64_t em_tok_hash(const char *data, size_t len) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (len * 0xff51afd7ed558ccdull);
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, data, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        data += 8;
        len -= 8;
    }
    if (len) {
        uint64_t v = 0;
        memcpy(&v, data, len);
        h = (h ^ v) * 0x94d049bb133111ebull;
        h ^= h >> 29;
    }
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

int32_t em_strmap_find(const em_strmap *map, const char *text, size_t len) {
    uint64_t h = em_tok_hash(text, len);
    for (uint64_t i = h & map->mask;; i = (i + 1) & map->mask) {
        uint32_t slot = map->slots[i];
        if (!slot) return EM_TOKEN_NONE;
        const em_tok_entry *e = &map->entries[slot - 1];
        if (e->text_len == len && !memcmp(map->arena + e->text_off, text, len)) return (int32_t)(slot - 1);
    }
}

size_t em_utf8_validate(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t min;
        if (c >= 0xC2 && c <= 0xDF) n = 2, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) n = 3, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) n = 4, min = 0x10000;
        else return i;
        if (len - i < n) return i;
        uint32_t cp = c & (0x7F >> n);
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n;
    }
    return len;
}

uint32_t em_utf8_decode(const char *text, size_t *n) {
    const unsigned char *s = (const unsigned char *)text;
    size_t len = em_utf8_len(s[0]);
    *n = len;
    if (len == 1) return s[0];
    uint32_t cp = s[0] & (0x7F >> len);
    for (size_t k = 1; k < len; k++) cp = (cp << 6) | (s[k] & 0x3F);
    return cp;
}

size_t em_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- accessors ---- */

em_tokenizer_kind em_tokenizer_kind_of(const em_tokenizer *t) { return t->kind; }
int32_t em_tokenizer_n_vocab(const em_tokenizer *t) { return t->n_vocab; }
int32_t em_tokenizer_bos(const em_tokenizer *t) { return t->bos; }
int32_t em_tokenizer_eos(const em_tokenizer *t) { return t->eos; }
int32_t em_tokenizer_eot(const em_tokenizer *t) { return t->eot; }
bool em_tokenizer_adds_bos(const em_tokenizer *t) { return t->add_bos; }
bool em_tokenizer_adds_eos(const em_tokenizer *t) { return t->add_eos; }

static bool in_range(const em_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab; }

bool em_tokenizer_is_eog(const em_tokenizer *t, int32_t id) {
    return in_range(t, id) && (t->tokens[id].attr & EM_ATTR_EOG);
}

bool em_tokenizer_is_control(const em_tokenizer *t, int32_t id) {
    return in_range(t, id) && (t->tokens[id].attr & EM_ATTR_CONTROL);
}

em_token_type em_tokenizer_token_type(const em_tokenizer *t, int32_t id) {
    return in_range(t, id) ? (em_token_type)t->tokens[id].type : EM_TOKEN_UNDEFINED;
}

size_t em_tokenizer_token_text(const em_tokenizer *t, int32_t id, const char **text) {
    if (!in_range(t, id)) {
        *text = "";
        return 0;
    }
    *text = t->arena + t->tokens[id].text_off;
    return t->tokens[id].text_len;
}

int32_t em_tokenizer_find(const em_tokenizer *t, const char *text, size_t len) {
    return em_strmap_find(&t->map, text, len);
}

size_t em_token_to_piece(const em_tokenizer *t, int32_t id, bool special, const char **bytes) {
    *bytes = "";
    if (!in_range(t, id)) return 0;
    const em_tok_entry *e = &t->tokens[id];
    if (!special && (e->attr & (EM_ATTR_CONTROL | EM_ATTR_UNKNOWN))) return 0;
    *bytes = t->arena + e->piece_off;
    return e->piece_len;
}

/* ---- loading ---- */

static em_err get_id(const em_gguf *g, const char *key, int32_t *id, int32_t n_vocab) {
    const em_gguf_kv *kv = em_gguf_find(g, key);
    if (!kv) return NULL;
    int64_t v = em_gguf_kv_int(kv);
    if (kv->type == EM_GGUF_STRING || kv->type == EM_GGUF_ARRAY || kv->type == EM_GGUF_FLOAT32 ||
        kv->type == EM_GGUF_FLOAT64)
        return em_errorf(EM_ERR_TYPE, "%s: %s is not an integer", em_gguf_path(g), key);
    /* Converters write -1 (or an out-of-range id) for "none": treat as absent, like llama.cpp. */
    *id = (v >= 0 && v < n_vocab) ? (int32_t)v : EM_TOKEN_NONE;
    return NULL;
}

/* An optional string: true and *out set when the key exists and is a string. */
static bool get_str(const em_gguf *g, const char *key, em_str *out) {
    const em_gguf_kv *kv = em_gguf_find(g, key);
    if (!kv || kv->type != EM_GGUF_STRING) return false;
    *out = kv->strings[0];
    return true;
}

static void get_flag(const em_gguf *g, const char *key, bool *flag) {
    const em_gguf_kv *kv = em_gguf_find(g, key);
    if (kv && kv->type == EM_GGUF_BOOL) *flag = em_gguf_kv_int(kv) != 0;
}

static uint16_t attr_of_type(int type) {
    switch (type) {
    case EM_TOKEN_NORMAL: return EM_ATTR_NORMAL;
    case EM_TOKEN_UNKNOWN: return EM_ATTR_UNKNOWN;
    case EM_TOKEN_CONTROL: return EM_ATTR_CONTROL;
    case EM_TOKEN_USER_DEFINED: return EM_ATTR_USER_DEFINED;
    case EM_TOKEN_UNUSED: return EM_ATTR_UNUSED;
    case EM_TOKEN_BYTE: return EM_ATTR_BYTE;
    default: return 0;
    }
}

/* Texts that mark end of generation in the chat formats we know (the converter does not store
 * this, so it is recognized by text, as every GGUF runtime does). */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>",
    /* Gemma 4: the end of a turn, and a tool call's answer waiting for the tool's response. */
    "<turn|>", "<|tool_response>",
};
/* End-of-sequence texts that end generation only where they are control tokens: elsewhere the same
 * text is ordinary (Gemma's "</s>" is the HTML tag, Qwen's a normal token). */
static const char *const eog_if_control_texts[] = {"<eos>", "</s>", "<|end_of_turn|>"};

/* Texts that name the end-of-turn token when the file has no eot id, in order of preference. */
static const char *const eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "_<EOT>",
    ("<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"), "<end_of_utterance>",
};

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte a "<0xNN>" token stands for, or -1. */
static int byte_token_value(const char *text, size_t len) {
    if (len != 6 || memcmp(text, "<0x", 3) || text[5] != '>') return -1;
    int hi = hex_digit(text[3]), lo = hex_digit(text[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Writes the decoded bytes of token `id` at dst (room for 4x its text); returns the length. */
static size_t decode_piece(const em_tokenizer *t, const em_tok_entry *e, char *dst) {
    const char *text = t->arena + e->text_off;
    size_t len = e->text_len, n = 0;
    if (e->attr & (EM_ATTR_CONTROL | EM_ATTR_UNKNOWN)) {
        memcpy(dst, text, len);
        return len;
    }
    if (e->attr & EM_ATTR_BYTE) {
        int b = byte_token_value(text, len);
        if (b >= 0) {
            dst[0] = (char)b;
            return 1;
        }
        memcpy(dst, text, len);
        return len;
    }
    if (!(e->attr & (EM_ATTR_NORMAL | EM_ATTR_USER_DEFINED))) return 0; /* unused, undefined */
    if (t->kind == EM_TOKENIZER_BPE) {
        if (e->attr & EM_ATTR_USER_DEFINED) {
            memcpy(dst, text, len);
            return len;
        }
        /* Each character of a normal token stands for one byte (GPT-2's byte alphabet). A
         * character outside the alphabet is kept as it is. */
        for (size_t i = 0; i < len;) {
            size_t k;
            uint32_t cp = em_utf8_decode(text + i, &k);
            if (i + k > len) k = len - i;
            int b = em_bpe_char_byte(cp);
            if (b >= 0) dst[n++] = (char)b;
            else memcpy(dst + n, text + i, k), n += k;
            i += k;
        }
        return n;
    }
    for (size_t i = 0; i < len;) {
        if (len - i >= 3 && !memcmp(text + i, SPACE_MARK, 3)) {
            dst[n++] = ' ';
            i += 3;
        } else {
            dst[n++] = text[i++];
        }
    }
    return n;
}

static em_err build_map(em_tokenizer *t) {
    uint64_t size = 16;
    while (size < (uint64_t)t->n_vocab * 2) size <<= 1;
    t->map.slots = calloc(size, sizeof *t->map.slots);
    if (!t->map.slots) return em_errorf(EM_ERR_NOMEM, "tokenizer: out of memory for the vocabulary map");
    t->map.mask = size - 1;
    t->map.arena = t->arena;
    t->map.entries = t->tokens;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const em_tok_entry *e = &t->tokens[id];
        const char *text = t->arena + e->text_off;
        uint64_t h = em_tok_hash(text, e->text_len);
        for (uint64_t i = h & t->map.mask;; i = (i + 1) & t->map.mask) {
            uint32_t slot = t->map.slots[i];
            if (!slot) {
                t->map.slots[i] = (uint32_t)id + 1;
                break;
            }
            const em_tok_entry *o = &t->tokens[slot - 1];
            if (o->text_len == e->text_len && !memcmp(t->arena + o->text_off, text, e->text_len)) {
                t->map.slots[i] = (uint32_t)id + 1; /* duplicate text: the last id wins */
                break;
            }
        }
    }
    return NULL;
}

static em_err load_tokens(em_tokenizer *t, const em_gguf *g, const em_gguf_kv *tokens) {
    const char *path = em_gguf_path(g);
    const em_gguf_kv *scores = em_gguf_find(g, "tokenizer.ggml.scores");
    const em_gguf_kv *types = em_gguf_find(g, "tokenizer.ggml.token_type");
    if (scores && (scores->type != EM_GGUF_ARRAY || scores->array_type != EM_GGUF_FLOAT32 ||
                   scores->array_len != tokens->array_len))
        return em_errorf(EM_ERR_FORMAT, "%s: tokenizer.ggml.scores is not a float32 array of %llu entries",
                         path, (unsigned long long)tokens->array_len);
    if (types && (types->type != EM_GGUF_ARRAY || types->array_len != tokens->array_len ||
                  types->array_type == EM_GGUF_STRING || types->array_type == EM_GGUF_ARRAY ||
                  types->array_type == EM_GGUF_FLOAT32 || types->array_type == EM_GGUF_FLOAT64))
        return em_errorf(EM_ERR_FORMAT, "%s: tokenizer.ggml.token_type is not an integer array of %llu entries",
                         path, (unsigned long long)tokens->array_len);
    if (tokens->array_len == 0 || tokens->array_len > INT32_MAX / 2)
        return em_errorf(EM_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", path,
                         (unsigned long long)tokens->array_len);
    t->n_vocab = (int32_t)tokens->array_len;
    uint64_t text_bytes = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) text_bytes += tokens->strings[i].len;
    /* Pieces are at most as long as texts (decoding only shrinks), plus one NUL per token. */
    uint64_t arena_size = text_bytes * 2 + (uint64_t)t->n_vocab * 2 + 16;
    if (arena_size > UINT32_MAX) return em_errorf(EM_ERR_FORMAT, "%s: token texts too large", path);
    t->tokens = calloc((size_t)t->n_vocab, sizeof *t->tokens);
    t->arena = malloc((size_t)arena_size);
    if (!t->tokens || !t->arena) return em_errorf(EM_ERR_NOMEM, "%s: out of memory for the vocabulary", path);
    size_t off = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        em_tok_entry *e = &t->tokens[i];
        const em_str s = tokens->strings[i];
        memcpy(t->arena + off, s.ptr, s.len);
        e->text_off = (uint32_t)off;
        e->text_len = (uint32_t)s.len;
        off += s.len;
        t->arena[off++] = 0;
        if (s.len > t->max_token_len) t->max_token_len = s.len;
        e->score = scores ? (float)em_gguf_array_float(scores, (uint64_t)i) : 0.0f;
        e->type = types ? (uint8_t)em_gguf_array_int(types, (uint64_t)i) : EM_TOKEN_NORMAL;
        e->attr = attr_of_type(e->type);
    }
    t->arena_len = off;
    return build_map(t);
}

static void compute_pieces(em_tokenizer *t) {
    size_t off = t->arena_len;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        em_tok_entry *e = &t->tokens[i];
        size_t n = decode_piece(t, e, t->arena + off);
        e->piece_off = (uint32_t)off;
        e->piece_len = (uint32_t)n;
        off += n;
        t->arena[off++] = 0;
    }
    t->arena_len = off;
}

static void set_attr_by_text(em_tokenizer *t, const char *text, uint16_t bit, bool on) {
    int32_t id = em_strmap_find(&t->map, text, strlen(text));
    if (id < 0) return;
    if (on) t->tokens[id].attr |= bit;
    else t->tokens[id].attr &= (uint16_t)~bit;
}

/* End-of-generation set, eot detection, and the per-model attribute rules. */
static void mark_special(em_tokenizer *t, const em_gguf *g) {
    if (t->eot == EM_TOKEN_NONE)
        for (size_t i = 0; i < sizeof eot_texts / sizeof eot_texts[0] && t->eot == EM_TOKEN_NONE; i++)
            t->eot = em_strmap_find(&t->map, eot_texts[i], strlen(eot_texts[i]));
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = em_strmap_find(&t->map, eog_texts[i], strlen(eog_texts[i]));
        if (id < 0) continue;
        /* An end-of-turn marker must never be produced from user text: make it a control token
         * even when the file calls it normal or user-defined. */
        t->tokens[id].attr = (uint16_t)((t->tokens[id].attr & ~(EM_ATTR_NORMAL | EM_ATTR_USER_DEFINED)) |
                                        EM_ATTR_CONTROL | EM_ATTR_EOG);
    }
    for (size_t i = 0; i < sizeof eog_if_control_texts / sizeof eog_if_control_texts[0]; i++) {
        int32_t id = em_strmap_find(&t->map, eog_if_control_texts[i], strlen(eog_if_control_texts[i]));
        if (id >= 0 && (t->tokens[id].attr & EM_ATTR_CONTROL)) t->tokens[id].attr |= EM_ATTR_EOG;
    }
    int32_t ends[] = {t->eos, t->eot, t->eom};
    for (size_t i = 0; i < 3; i++)
        if (ends[i] >= 0) t->tokens[ends[i]].attr |= EM_ATTR_EOG;
    /* Harmony (gpt-oss's o200k_harmony): <|end|> closes one message of an answer that goes on (its
     * reasoning, then the final message); <|return|> and <|call|> end it. */
    int32_t message_end = em_strmap_find(&t->map, "<|end|>", strlen("<|end|>"));
    int32_t answer_end = em_strmap_find(&t->map, "<|return|>", strlen("<|return|>"));
    if (message_end >= 0 && answer_end >= 0 && em_strmap_find(&t->map, "<|call|>", strlen("<|call|>")) >= 0) {
        t->tokens[message_end].attr &= (uint16_t)~EM_ATTR_EOG;
        if (t->eot == message_end) t->eot = answer_end;
    }

    /* Phi-3 was trained with its special tokens eating the whitespace after them. */
    em_str name;
    if (get_str(g, "general.name", &name)) {
        char lower[64] = {0};
        size_t n = name.len < sizeof lower - 1 ? (size_t)name.len : sizeof lower - 1;
        for (size_t i = 0; i < n; i++) lower[i] = (char)tolower((unsigned char)name.ptr[i]);
        if (strstr(lower, "phi-3") || strstr(lower, "phi3")) {
            for (int32_t id = 0; id < t->n_vocab; id++)
                if (t->tokens[id].attr & (EM_ATTR_CONTROL | EM_ATTR_USER_DEFINED | EM_ATTR_UNKNOWN))
                    t->tokens[id].attr |= EM_ATTR_RSTRIP;
            set_attr_by_text(t, "</s>", EM_ATTR_RSTRIP, true);
            set_attr_by_text(t, "<unk>", EM_ATTR_RSTRIP, false);
            set_attr_by_text(t, "<s>", EM_ATTR_RSTRIP, false);
            set_attr_by_text(t, "<|endoftext|>", EM_ATTR_RSTRIP, false);
        }
    }
}

static em_err load_specials(em_tokenizer *t, const em_gguf *g) {
    static const struct {
        const char *key;
        size_t offset;
    } keys[] = {
        {"tokenizer.ggml.bos_token_id", offsetof(em_tokenizer, bos)},
        {"tokenizer.ggml.eos_token_id", offsetof(em_tokenizer, eos)},
        {"tokenizer.ggml.eot_token_id", offsetof(em_tokenizer, eot)},
        {"tokenizer.ggml.eom_token_id", offsetof(em_tokenizer, eom)},
        {"tokenizer.ggml.unknown_token_id", offsetof(em_tokenizer, unk)},
        {"tokenizer.ggml.seperator_token_id", offsetof(em_tokenizer, sep)}, /* sic: GGUF's key */
        {"tokenizer.ggml.padding_token_id", offsetof(em_tokenizer, pad)},
        {"tokenizer.ggml.cls_token_id", offsetof(em_tokenizer, cls)},
        {"tokenizer.ggml.mask_token_id", offsetof(em_tokenizer, mask)},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        em_err err = get_id(g, keys[i].key, (int32_t *)((char *)t + keys[i].offset), t->n_vocab);
        if (err) return err;
    }
    get_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    get_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos);
    get_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
    /* Ember's converter marks tokenizers whose reference normalizes to NFC (e.g. Qwen). */
    em_str norm;
    t->normalize_nfc = get_str(g, "tokenizer.ember.normalizer", &norm) && em_str_eq(norm, "NFC");
    return NULL;
}

/* Defaults when the file does not say (the values llama.cpp's loader assumes). */
static void set_defaults(em_tokenizer *t) {
    t->bos = t->eos = t->eot = t->eom = t->unk = t->sep = t->pad = t->cls = t->mask = EM_TOKEN_NONE;
    int32_t n = t->n_vocab;
    if (t->newline_runs) return; /* gemma4: every id from the file, no space prefix */
    switch (t->kind) {
    case EM_TOKENIZER_SPM:
        t->bos = n > 1 ? 1 : EM_TOKEN_NONE;
        t->eos = n > 2 ? 2 : EM_TOKEN_NONE;
        t->unk = 0;
        t->add_space_prefix = true;
        t->add_bos = true;
        break;
    case EM_TOKENIZER_BPE:
        t->bos = t->eos = n > 11 ? 11 : EM_TOKEN_NONE;
        break;
    case EM_TOKENIZER_WPM:
        if (n > 103) {
            t->unk = 100;
            t->cls = 101;
            t->sep = 102;
            t->mask = 103;
            t->pad = 0;
        }
        t->add_bos = true;
        break;
    }
}

static bool pre_is_llama3(const char *pre) {
    static const char *const names[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(pre, names[i])) return true;
    return false;
}

em_err em_tokenizer_from_gguf(const em_gguf *g, em_tokenizer **out) {
    *out = NULL;
    const char *path = em_gguf_path(g);
    em_str model;
    em_err err = em_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (err) {
        em_err_code code = em_err_code_of(err);
        em_err_free(err);
        return code == EM_ERR_NOT_FOUND
                   ? em_errorf(EM_ERR_NOT_FOUND, "%s: no tokenizer in this file (tokenizer.ggml.model is missing)", path)
                   : em_errorf(EM_ERR_TYPE, "%s: tokenizer.ggml.model is not a string", path);
    }
    em_tokenizer_kind kind;
    bool gemma4 = em_str_eq(model, "gemma4");
    if (em_str_eq(model, "llama") || gemma4) kind = EM_TOKENIZER_SPM;
    else if (em_str_eq(model, "gpt2")) kind = EM_TOKENIZER_BPE;
    else if (em_str_eq(model, "bert")) kind = EM_TOKENIZER_WPM;
    else
        return em_errorf(EM_ERR_UNSUPPORTED,
                         "%s: unsupported tokenizer model '%.*s' (tokenizer.ggml.model; supported: llama, gemma4, gpt2, bert)",
                         path, (int)(model.len > 64 ? 64 : model.len), model.ptr);
    const em_gguf_kv *tokens = NULL;
    err = em_gguf_get_array(g, "tokenizer.ggml.tokens", EM_GGUF_STRING, &tokens);
    if (err) return em_err_prefix(err, "%s: tokenizer", path);

    em_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return em_errorf(EM_ERR_NOMEM, "%s: out of memory for the tokenizer", path);
    t->kind = kind;
    t->newline_runs = gemma4;
    if ((err = load_tokens(t, g, tokens))) goto fail;
    set_defaults(t);

    char pre[64] = "default";
    em_str pre_str;
    if (get_str(g, "tokenizer.ggml.pre", &pre_str)) {
        size_t n = pre_str.len < sizeof pre - 1 ? (size_t)pre_str.len : sizeof pre - 1;
        memcpy(pre, pre_str.ptr, n);
        pre[n] = 0;
    }
    if (kind == EM_TOKENIZER_BPE && pre_is_llama3(pre)) {
        t->ignore_merges = true;
        t->add_bos = true;
    }
    if ((err = load_specials(t, g))) goto fail;
    /* Gemma 4 was trained with BOS first and no space prefix; llama.cpp adds BOS even where a file
     * says otherwise, and its gemma4 tokenizer never puts a space in front. */
    if (gemma4) t->add_bos = true, t->add_space_prefix = false;
    if (gemma4 && t->bos < 0) {
        err = em_errorf(EM_ERR_FORMAT, "%s: a gemma4 tokenizer needs tokenizer.ggml.bos_token_id (it always adds BOS)", path);
        goto fail;
    }
    if (kind == EM_TOKENIZER_WPM) { /* BERT calls its sequence markers CLS and SEP */
        if (t->bos < 0) t->bos = t->cls;
        if (t->eos < 0) t->eos = t->sep;
    }
    mark_special(t, g);
    compute_pieces(t);

    for (int b = 0; b < 256; b++) t->byte_token[b] = EM_TOKEN_NONE;
    for (int c = 0; c < 128; c++) t->ascii_token[c] = EM_TOKEN_NONE;
    if (kind == EM_TOKENIZER_SPM) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            int32_t id = em_strmap_find(&t->map, name, 6);
            if (id < 0) {
                char c = (char)b;
                id = em_strmap_find(&t->map, &c, 1);
            }
            t->byte_token[b] = id >= 0 ? id : t->unk;
        }
        for (int c = 0; c < 128; c++) {
            char ch = (char)c;
            t->ascii_token[c] = em_strmap_find(&t->map, &ch, 1);
        }
        if ((err = em_spm_build_pairs(t))) goto fail;
    }

    const em_gguf_kv *merges = em_gguf_find(g, "tokenizer.ggml.merges");
    if ((kind == EM_TOKENIZER_BPE || gemma4) && !merges) {
        err = em_errorf(EM_ERR_FORMAT, "%s: a %s tokenizer needs tokenizer.ggml.merges", path, gemma4 ? "gemma4" : "gpt2");
        goto fail;
    }
    if (merges && kind != EM_TOKENIZER_WPM) {
        if (merges->type != EM_GGUF_ARRAY || merges->array_type != EM_GGUF_STRING) {
            err = em_errorf(EM_ERR_FORMAT, "%s: tokenizer.ggml.merges is not a string array", path);
            goto fail;
        }
        if ((err = em_bpe_load_merges(t, merges, kind == EM_TOKENIZER_BPE))) goto fail;
        t->has_merges = true;
    }
    if (kind == EM_TOKENIZER_BPE && (err = em_pretok_new(pre, &t->pretok))) goto fail;
    if ((err = em_special_build(t))) goto fail;
    *out = t;
    return NULL;
fail:
    em_tokenizer_free(t);
    return err;
}

void em_tokenizer_free(em_tokenizer *t) {
    if (!t) return;
    em_pretok_free(t->pretok);
    free(t->merges.slots);
    free(t->special);
    free(t->special_start);
    free(t->pairs);
    free(t->map.slots);
    free(t->tokens);
    free(t->arena);
    free(t);
}
