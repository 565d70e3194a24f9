/* GBNF text → a compiled em_grammar (grammar.h): rules of byte-level elements, repetitions as
 * helper rules, character classes as the UTF-8 byte sequences of their code points, then the
 * checks that make the automaton terminate (every rule defined, no left recursion).
 *
 * The text comes from requests, so its cost is bounded (grammar.h's EM_GRAMMAR_MAX_*): rules and
 * byte sets are found by hash, the fewest bytes of each rule come from one pass of Knuth's
 * shortest-derivation algorithm, the left-recursion search keeps its own stack, and the one
 * recursion of the parser (a group inside a group) stops at EM_GRAMMAR_MAX_NESTING levels. Under a
 * watch (watch.c) every rule and element made, and every step of the passes after parsing, counts
 * as work, so a compilation stops soon after its caller goes away or its time is up. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The longest repetition count written out ({m,n}): bounds the compiled size. */
#define MAX_REPEAT 10000

typedef struct rule_builder {
    char *name;
    uint32_t *elements; /* alternatives, each ended by END */
    size_t n, cap;
    size_t name_len;
    bool defined;
    size_t first_use; /* offset of the first reference, for "undefined rule" errors */
} rule_builder;

/* An open-addressing hash table of ids (slot value id + 1; 0: empty) whose keys live elsewhere. */
typedef struct id_index {
    uint32_t *slots;
    size_t cap; /* a power of two */
} id_index;

typedef struct parser {
    const char *text;
    size_t len, pos;
    rule_builder *rules;
    size_t n_rules, cap_rules;
    em_byte_set *byte_sets;
    size_t n_byte_sets, cap_byte_sets;
    id_index rule_index;     /* rules by name */
    id_index byte_set_index; /* byte sets by content */
    size_t n_elements;       /* emitted so far, for EM_GRAMMAR_MAX_ELEMENTS */
    unsigned nesting;        /* groups open around the parser's position */
    em_grammar_budget *budget; /* NULL: unwatched */
    em_err err;
} parser;

bool em_grammar_reserve(void *array_ptr, size_t *cap, size_t need, size_t size) {
    void **array = array_ptr;
    if (need <= *cap) return true;
    size_t grown = *cap ? *cap : 8;
    while (grown < need) grown *= 2;
    void *p = realloc(*array, grown * size);
    if (!p) return false;
    *array = p;
    *cap = grown;
    return true;
}

size_t em_grammar_utf8_encode(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- Errors with positions ---- */

/* Records the first error (at byte offset `at`) and returns false, so parsers can `return fail(...)`. */
static bool fail_at(parser *p, size_t at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static bool fail_at(parser *p, size_t at, const char *fmt, ...) {
    if (p->err) return false;
    char what[256];
    va_list args;
    va_start(args, fmt);
    vsnprintf(what, sizeof what, fmt, args);
    va_end(args);
    size_t line, column;
    em_text_position(p->text, p->len, at, &line, &column);
    p->err = em_errorf(EM_ERR_INVALID, "grammar: line %zu, column %zu: %s", line, column, what);
    return false;
}

static bool fail_nomem(parser *p) {
    if (!p->err) p->err = em_errorf(EM_ERR_NOMEM, "grammar: out of memory");
    return false;
}

/* One unit of work; false (with the budget's error) once the watch said to stop. */
static bool spend(parser *p) {
    if (em_grammar_budget_spend(p->budget)) return true;
    if (!p->err) p->err = em_grammar_budget_error(p->budget);
    return false;
}

/* ---- Rules and elements ---- */

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* FNV-1a: the ids' keys are short names and 32-byte sets. */
static uint64_t hash_bytes(const void *data, size_t len) {
    const unsigned char *b = data;
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * UINT64_C(0x100000001b3);
    return h ^ (h >> 29);
}
static uint64_t rule_hash(const parser *p, uint32_t id) { return hash_bytes(p->rules[id].name, p->rules[id].name_len); }
static uint64_t byte_set_hash(const parser *p, uint32_t id) { return hash_bytes(&p->byte_sets[id], sizeof *p->byte_sets); }

/* Makes room in the index for one more of `n` ids (rehashing them by `hash` when it grows). */
static bool index_reserve(parser *p, id_index *index, size_t n, uint64_t (*hash)(const parser *, uint32_t)) {
    if ((n + 1) * 2 <= index->cap) return true;
    size_t cap = index->cap ? index->cap : 256;
    while ((n + 1) * 2 > cap) cap *= 2; /* helper rules may have come since the last reserve */
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return fail_nomem(p);
    for (uint32_t id = 0; id < n; id++) {
        size_t h = hash(p, id) & (cap - 1);
        while (slots[h]) h = (h + 1) & (cap - 1);
        slots[h] = id + 1;
    }
    free(index->slots);
    index->slots = slots;
    index->cap = cap;
    return true;
}

/* A new rule (the caller fills its name); false past EM_GRAMMAR_MAX_RULES. */
static rule_builder *new_rule(parser *p, size_t at) {
    if (!spend(p)) return NULL;
    if (p->n_rules >= EM_GRAMMAR_MAX_RULES) {
        fail_at(p, at, "more than %d rules (the limit), counting those that groups and repetitions make", EM_GRAMMAR_MAX_RULES);
        return NULL;
    }
    if (!em_grammar_reserve(&p->rules, &p->cap_rules, p->n_rules + 1, sizeof *p->rules)) {
        fail_nomem(p);
        return NULL;
    }
    rule_builder *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    return r;
}

/* The id of the rule called name[0..len), created (undefined) on first mention. */
static bool rule_id(parser *p, const char *name, size_t len, size_t at, uint32_t *id) {
    if (!index_reserve(p, &p->rule_index, p->n_rules, rule_hash)) return false;
    size_t mask = p->rule_index.cap - 1, h = hash_bytes(name, len) & mask;
    for (uint32_t slot; (slot = p->rule_index.slots[h]); h = (h + 1) & mask) {
        const rule_builder *r = &p->rules[slot - 1];
        if (r->name_len == len && memcmp(r->name, name, len) == 0) {
            *id = slot - 1;
            return true;
        }
    }
    rule_builder *r = new_rule(p, at);
    if (!r) return false;
    r->name = strndup(name, len);
    if (!r->name) return fail_nomem(p);
    r->name_len = len;
    r->first_use = at;
    *id = (uint32_t)p->n_rules++;
    p->rule_index.slots[h] = *id + 1;
    return true;
}

/* A helper rule named after the rule it serves ("value#3": '#' starts a comment in GBNF, so no
 * rule of the text can have the name and references never find a helper). */
static bool helper_rule(parser *p, uint32_t parent, uint32_t *id) {
    char name[160];
    snprintf(name, sizeof name, "%.120s#%zu", p->rules[parent].name, p->n_rules);
    rule_builder *r = new_rule(p, p->pos);
    if (!r) return false;
    r->name = strdup(name);
    if (!r->name) return fail_nomem(p);
    r->name_len = strlen(name);
    r->defined = true;
    *id = (uint32_t)p->n_rules++;
    return true;
}

static bool emit(parser *p, uint32_t rule, uint32_t element) {
    if (!spend(p)) return false;
    if (++p->n_elements > EM_GRAMMAR_MAX_ELEMENTS)
        return fail_at(p, p->pos, "more than %d elements (the limit): terminals and rule references, repetitions written out",
                       EM_GRAMMAR_MAX_ELEMENTS);
    rule_builder *r = &p->rules[rule];
    if (!em_grammar_reserve(&r->elements, &r->cap, r->n + 1, sizeof *r->elements)) return fail_nomem(p);
    r->elements[r->n++] = element;
    return true;
}

static bool byte_set_id(parser *p, const em_byte_set *set, uint32_t *id) {
    if (!index_reserve(p, &p->byte_set_index, p->n_byte_sets, byte_set_hash)) return false;
    size_t mask = p->byte_set_index.cap - 1, h = hash_bytes(set, sizeof *set) & mask;
    for (uint32_t slot; (slot = p->byte_set_index.slots[h]); h = (h + 1) & mask)
        if (memcmp(&p->byte_sets[slot - 1], set, sizeof *set) == 0) {
            *id = slot - 1;
            return true;
        }
    if (!em_grammar_reserve(&p->byte_sets, &p->cap_byte_sets, p->n_byte_sets + 1, sizeof *p->byte_sets))
        return fail_nomem(p);
    p->byte_sets[p->n_byte_sets] = *set;
    *id = (uint32_t)p->n_byte_sets++;
    p->byte_set_index.slots[h] = *id + 1;
    return true;
}

static void byte_set_add_range(em_byte_set *set, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; b++) set->bits[b >> 5] |= 1u << (b & 31);
}

static bool emit_byte_range(parser *p, uint32_t rule, unsigned lo, unsigned hi) {
    em_byte_set set = {{0}};
    byte_set_add_range(&set, lo, hi);
    uint32_t id;
    return byte_set_id(p, &set, &id) && emit(p, rule, EM_ELEMENT(EM_ELEMENT_BYTES, id));
}

/* ---- Character classes: code point ranges → UTF-8 byte sequences ---- */

typedef struct code_range {
    uint32_t lo, hi;
} code_range;

typedef struct class_builder {
    code_range *ranges;
    size_t n, cap;
    em_byte_set ascii; /* the one-byte part, one element */
    bool has_ascii;
    uint32_t rule; /* the helper rule holding the multi-byte sequences */
    bool has_rule;
    uint32_t owner;
} class_builder;

/* One sequence of byte ranges (a UTF-8 length's worth) as an alternative of the class's rule. */
static bool class_emit_sequence(parser *p, class_builder *c, const uint8_t *lo, const uint8_t *hi, size_t n) {
    if (n == 1) {
        byte_set_add_range(&c->ascii, lo[0], hi[0]);
        c->has_ascii = true;
        return true;
    }
    if (!c->has_rule) {
        if (!helper_rule(p, c->owner, &c->rule)) return false;
        c->has_rule = true;
    } else if (!emit(p, c->rule, EM_ELEMENT(EM_ELEMENT_END, 0))) {
        return false;
    }
    for (size_t i = 0; i < n; i++)
        if (!emit_byte_range(p, c->rule, lo[i], hi[i])) return false;
    return true;
}

/* Splits [lo, hi] until every byte position of its encodings is a plain range (the classic
 * construction: split at the encoded-length boundaries, then wherever a continuation byte would
 * not run over its whole 0x80-0xBF span), and emits each piece. */
static bool class_emit_range(parser *p, class_builder *c, uint32_t lo, uint32_t hi) {
    static const uint32_t length_ends[] = {0x7F, 0x7FF, 0xFFFF};
    for (size_t i = 0; i < 3; i++)
        if (lo <= length_ends[i] && hi > length_ends[i])
            return class_emit_range(p, c, lo, length_ends[i]) && class_emit_range(p, c, length_ends[i] + 1, hi);
    uint8_t lo_bytes[4], hi_bytes[4];
    size_t n = em_grammar_utf8_encode(lo, lo_bytes);
    for (size_t i = 1; i < n; i++) {
        uint32_t low_bits = (1u << (6 * i)) - 1;
        if ((lo & ~low_bits) == (hi & ~low_bits)) continue;
        if (lo & low_bits)
            return class_emit_range(p, c, lo, lo | low_bits) && class_emit_range(p, c, (lo | low_bits) + 1, hi);
        if ((hi & low_bits) != low_bits)
            return class_emit_range(p, c, lo, (hi & ~low_bits) - 1) && class_emit_range(p, c, hi & ~low_bits, hi);
    }
    em_grammar_utf8_encode(hi, hi_bytes);
    return class_emit_sequence(p, c, lo_bytes, hi_bytes, n);
}

static int by_low_end(const void *a, const void *b) {
    const code_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Emits the class (ranges sorted and merged, complemented when negated, surrogates removed, which
 * UTF-8 cannot encode) into `rule`: one byte-set element when it is all ASCII, else a reference to
 * a helper rule with one alternative per byte sequence. */
static bool class_finish(parser *p, class_builder *c, bool negated, uint32_t rule) {
    qsort(c->ranges, c->n, sizeof *c->ranges, by_low_end);
    code_range merged[64];
    code_range *list = c->ranges;
    size_t n = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (n && list[i].lo <= list[n - 1].hi + 1) {
            if (list[i].hi > list[n - 1].hi) list[n - 1].hi = list[i].hi;
        } else {
            list[n++] = list[i];
        }
    }
    if (negated) { /* the gaps between the merged ranges (at most n + 1 of them) */
        code_range *gaps = n + 1 <= 64 ? merged : malloc((n + 1) * sizeof *gaps);
        if (!gaps) return fail_nomem(p);
        size_t g = 0;
        uint32_t next = 0;
        for (size_t i = 0; i < n; i++) {
            if (list[i].lo > next) gaps[g++] = (code_range){next, list[i].lo - 1};
            next = list[i].hi + 1;
        }
        if (next <= 0x10FFFF) gaps[g++] = (code_range){next, 0x10FFFF};
        memcpy(list, gaps, g * sizeof *gaps); /* fits: ranges has capacity >= n + 1 (see parse_class) */
        if (gaps != merged) free(gaps);
        n = g;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = list[i].lo, hi = list[i].hi;
        if (lo <= 0xDFFF && hi >= 0xD800) { /* cut the surrogates out */
            if (lo < 0xD800 && !class_emit_range(p, c, lo, 0xD7FF)) return false;
            if (hi > 0xDFFF && !class_emit_range(p, c, 0xE000, hi)) return false;
        } else if (!class_emit_range(p, c, lo, hi)) {
            return false;
        }
    }
    if (!c->has_ascii && !c->has_rule) return fail_at(p, p->pos, "the character class matches nothing");
    if (c->has_ascii && !c->has_rule) {
        uint32_t id;
        return byte_set_id(p, &c->ascii, &id) && emit(p, rule, EM_ELEMENT(EM_ELEMENT_BYTES, id));
    }
    if (c->has_ascii) {
        uint32_t id;
        if (!emit(p, c->rule, EM_ELEMENT(EM_ELEMENT_END, 0)) || !byte_set_id(p, &c->ascii, &id) ||
            !emit(p, c->rule, EM_ELEMENT(EM_ELEMENT_BYTES, id)))
            return false;
    }
    return emit(p, c->rule, EM_ELEMENT(EM_ELEMENT_END, 0)) && emit(p, rule, EM_ELEMENT(EM_ELEMENT_RULE, c->rule));
}

/* ---- The text ---- */

static char peek(const parser *p) { return p->pos < p->len ? p->text[p->pos] : '\0'; }
static bool at_end(const parser *p) { return p->pos >= p->len; }

/* Skips blanks and comments; newlines too when `newline_ok` (inside parentheses, after `|` or `::=`). */
static void skip_space(parser *p, bool newline_ok) {
    while (!at_end(p)) {
        char c = peek(p);
        if (c == ' ' || c == '\t' || ((c == '\n' || c == '\r') && newline_ok)) {
            p->pos++;
        } else if (c == '#') {
            while (!at_end(p) && peek(p) != '\n') p->pos++;
        } else {
            break;
        }
    }
}

/* One UTF-8 code point of the text. */
static bool read_code_point(parser *p, uint32_t *cp) {
    const uint8_t *s = (const uint8_t *)p->text + p->pos;
    size_t left = p->len - p->pos;
    uint32_t c = s[0];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || n > left) return fail_at(p, p->pos, "invalid UTF-8");
    if (n > 1) c &= 0xFFu >> (n + 1);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return fail_at(p, p->pos, "invalid UTF-8");
        c = (c << 6) | (s[i] & 0x3F);
    }
    p->pos += n;
    *cp = c;
    return true;
}

static bool read_hex(parser *p, size_t digits, uint32_t *cp) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; i++) {
        char c = peek(p);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail_at(p, p->pos, "expected %zu hex digits", digits);
        v = v * 16 + (uint32_t)d;
        p->pos++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return fail_at(p, p->pos, "escape U+%X is not a character", v);
    *cp = v;
    return true;
}

/* A character of a literal or a class, with GBNF's escapes (\n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH). */
static bool read_char(parser *p, uint32_t *cp) {
    if (at_end(p)) return fail_at(p, p->pos, "unexpected end of grammar");
    if (peek(p) != '\\') return read_code_point(p, cp);
    size_t at = p->pos++;
    char c = peek(p);
    p->pos++;
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 'r': *cp = '\r'; return true;
    case 't': *cp = '\t'; return true;
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': *cp = (uint32_t)c; return true;
    case 'x': return read_hex(p, 2, cp);
    case 'u': return read_hex(p, 4, cp);
    case 'U': return read_hex(p, 8, cp);
    default: return fail_at(p, at, "unknown escape '\\%c'", c ? c : '0');
    }
}

static bool parse_literal(parser *p, uint32_t rule) {
    size_t start = p->pos++;
    while (peek(p) != '"') {
        if (at_end(p)) return fail_at(p, start, "unterminated literal");
        uint32_t cp;
        uint8_t bytes[4];
        if (!read_char(p, &cp)) return false;
        size_t n = em_grammar_utf8_encode(cp, bytes);
        for (size_t i = 0; i < n; i++)
            if (!emit_byte_range(p, rule, bytes[i], bytes[i])) return false;
    }
    p->pos++;
    return true;
}

static bool class_add(parser *p, class_builder *c, uint32_t lo, uint32_t hi) {
    /* one spare slot: class_finish writes the complement (up to n + 1 ranges) in place */
    if (!em_grammar_reserve(&c->ranges, &c->cap, c->n + 2, sizeof *c->ranges)) return fail_nomem(p);
    c->ranges[c->n++] = (code_range){lo, hi};
    return true;
}

/* `[...]`, `[^...]` or `.` (any character). */
static bool parse_class(parser *p, uint32_t rule) {
    class_builder c = {.owner = rule};
    bool negated = false, ok = true;
    if (peek(p) == '.') {
        p->pos++;
        negated = true; /* the complement of nothing */
        ok = class_add(p, &c, 0, 0) && (c.n = 0, true);
    } else {
        size_t start = p->pos++;
        if (peek(p) == '^') {
            negated = true;
            p->pos++;
        }
        while (ok && peek(p) != ']') {
            if (at_end(p)) {
                ok = fail_at(p, start, "unterminated character class");
                break;
            }
            uint32_t lo, hi;
            ok = read_char(p, &lo);
            hi = lo;
            if (ok && peek(p) == '-' && p->pos + 1 < p->len && p->text[p->pos + 1] != ']') {
                p->pos++;
                ok = read_char(p, &hi);
                if (ok && hi < lo) ok = fail_at(p, p->pos, "range U+%X-U+%X runs backwards", lo, hi);
            }
            if (ok) ok = class_add(p, &c, lo, hi);
        }
        if (ok) p->pos++;
        if (ok && !c.n && !negated) ok = fail_at(p, start, "empty character class");
    }
    if (ok && !c.cap) ok = class_add(p, &c, 0, 0) && (c.n = 0, true);
    if (ok) ok = class_finish(p, &c, negated, rule);
    free(c.ranges);
    return ok;
}

/* Replaces the item in elements[item..] of `rule` by min..max repetitions of it (max
 * EM_GRAMMAR_INFINITE: unbounded). */
static bool repeat_item(parser *p, uint32_t rule, size_t item, uint32_t min, uint32_t max) {
    rule_builder *r = &p->rules[rule];
    uint32_t unit;
    if (r->n - item == 1) {
        unit = r->elements[item];
    } else { /* a sequence becomes a helper rule of one alternative */
        uint32_t helper;
        if (!helper_rule(p, rule, &helper)) return false;
        r = &p->rules[rule];
        for (size_t i = item; i < r->n; i++)
            if (!emit(p, helper, r->elements[i])) return false;
        if (!emit(p, helper, EM_ELEMENT(EM_ELEMENT_END, 0))) return false;
        unit = EM_ELEMENT(EM_ELEMENT_RULE, helper);
    }
    p->rules[rule].n = item;
    for (uint32_t i = 0; i < min; i++)
        if (!emit(p, rule, unit)) return false;
    if (max == min) return true;
    uint32_t tail = 0;
    if (max == EM_GRAMMAR_INFINITE) { /* tail ::= unit tail | (empty) */
        if (!helper_rule(p, rule, &tail)) return false;
        if (!emit(p, tail, unit) || !emit(p, tail, EM_ELEMENT(EM_ELEMENT_RULE, tail)) ||
            !emit(p, tail, EM_ELEMENT(EM_ELEMENT_END, 0)) || !emit(p, tail, EM_ELEMENT(EM_ELEMENT_END, 0)))
            return false;
    } else { /* nested optionals: opt_k ::= unit opt_(k-1) | (empty), so each count has one derivation */
        bool first = true;
        for (uint32_t k = 0; k < max - min; k++) {
            uint32_t opt;
            if (!helper_rule(p, rule, &opt) || !emit(p, opt, unit)) return false;
            if (!first && !emit(p, opt, EM_ELEMENT(EM_ELEMENT_RULE, tail))) return false;
            if (!emit(p, opt, EM_ELEMENT(EM_ELEMENT_END, 0)) || !emit(p, opt, EM_ELEMENT(EM_ELEMENT_END, 0))) return false;
            tail = opt;
            first = false;
        }
    }
    return emit(p, rule, EM_ELEMENT(EM_ELEMENT_RULE, tail));
}

static bool read_count(parser *p, uint32_t *value) {
    size_t start = p->pos;
    uint64_t v = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        v = v * 10 + (uint64_t)(peek(p) - '0');
        if (v > MAX_REPEAT) return fail_at(p, start, "repetition count above %d", MAX_REPEAT);
        p->pos++;
    }
    if (p->pos == start) return fail_at(p, start, "expected a repetition count");
    *value = (uint32_t)v;
    return true;
}

/* `{m}`, `{m,}` or `{m,n}`. */
static bool parse_braces(parser *p, uint32_t *min, uint32_t *max) {
    size_t start = p->pos++;
    skip_space(p, false);
    if (!read_count(p, min)) return false;
    skip_space(p, false);
    *max = *min;
    if (peek(p) == ',') {
        p->pos++;
        skip_space(p, false);
        *max = EM_GRAMMAR_INFINITE;
        if (peek(p) != '}' && !read_count(p, max)) return false;
        skip_space(p, false);
    }
    if (peek(p) != '}') return fail_at(p, p->pos, "expected '}'");
    p->pos++;
    if (*max < *min) return fail_at(p, start, "repetition {%u,%u} runs backwards", *min, *max);
    return true;
}

static bool parse_alternatives(parser *p, uint32_t rule, bool nested);

static bool parse_sequence(parser *p, uint32_t rule, bool nested) {
    for (;;) {
        size_t item = p->rules[rule].n;
        char c = peek(p);
        if (c == '"') {
            if (!parse_literal(p, rule)) return false;
        } else if (c == '[' || c == '.') {
            if (!parse_class(p, rule)) return false;
        } else if (c == '(') {
            if (p->nesting >= EM_GRAMMAR_MAX_NESTING)
                return fail_at(p, p->pos, "groups nested deeper than %d levels (the limit)", EM_GRAMMAR_MAX_NESTING);
            p->pos++;
            skip_space(p, true);
            uint32_t group;
            p->nesting++;
            if (!helper_rule(p, rule, &group) || !parse_alternatives(p, group, true)) return false;
            p->nesting--;
            if (peek(p) != ')') return fail_at(p, p->pos, "expected ')'");
            p->pos++;
            if (!emit(p, rule, EM_ELEMENT(EM_ELEMENT_RULE, group))) return false;
        } else if (is_name_char(c)) {
            size_t start = p->pos;
            while (is_name_char(peek(p))) p->pos++;
            uint32_t ref;
            if (!rule_id(p, p->text + start, p->pos - start, start, &ref) ||
                !emit(p, rule, EM_ELEMENT(EM_ELEMENT_RULE, ref)))
                return false;
        } else if (c == '<' || c == '!') {
            return fail_at(p, p->pos, "token references (<...>) are not supported");
        } else {
            return true; /* '|', ')', a newline, the end: the caller decides */
        }
        skip_space(p, nested);
        c = peek(p);
        if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (p->rules[rule].n == item) return fail_at(p, p->pos, "'%c' repeats an empty literal", c);
            uint32_t min = c == '+' ? 1 : 0, max = c == '?' ? 1 : EM_GRAMMAR_INFINITE;
            if (c == '{') {
                if (!parse_braces(p, &min, &max)) return false;
            } else {
                p->pos++;
            }
            if (!repeat_item(p, rule, item, min, max)) return false;
            skip_space(p, nested);
        }
    }
}

static bool parse_alternatives(parser *p, uint32_t rule, bool nested) {
    if (!parse_sequence(p, rule, nested)) return false;
    while (peek(p) == '|') {
        p->pos++;
        skip_space(p, true);
        if (!emit(p, rule, EM_ELEMENT(EM_ELEMENT_END, 0)) || !parse_sequence(p, rule, nested)) return false;
    }
    return emit(p, rule, EM_ELEMENT(EM_ELEMENT_END, 0));
}

static bool parse_rules(parser *p) {
    skip_space(p, true);
    while (!at_end(p)) {
        size_t start = p->pos;
        while (is_name_char(peek(p))) p->pos++;
        if (p->pos == start) return fail_at(p, start, "expected a rule name");
        uint32_t rule;
        if (!rule_id(p, p->text + start, p->pos - start, start, &rule)) return false;
        if (p->rules[rule].defined) return fail_at(p, start, "rule '%s' is defined twice", p->rules[rule].name);
        p->rules[rule].defined = true;
        skip_space(p, false);
        if (p->len - p->pos < 3 || memcmp(p->text + p->pos, "::=", 3) != 0)
            return fail_at(p, p->pos, "expected '::=' after '%s'", p->rules[rule].name);
        p->pos += 3;
        skip_space(p, true);
        if (!parse_alternatives(p, rule, false)) return false;
        char c = peek(p);
        if (!at_end(p) && c != '\n' && c != '\r')
            return fail_at(p, p->pos, "unexpected '%c' in rule '%s'", c, p->rules[rule].name);
        skip_space(p, true);
    }
    return true;
}

/* ---- Compilation checks ---- */

static uint32_t add_saturated(uint32_t a, uint32_t b) {
    return a == EM_GRAMMAR_INFINITE || b == EM_GRAMMAR_INFINITE || a + b < a ? EM_GRAMMAR_INFINITE : a + b;
}

/* A rule's fewest bytes, found (Knuth's generalization of Dijkstra's algorithm to grammars: an
 * alternative's length is the sum of its parts, so the shortest candidate not yet final is). */
typedef struct length_candidate {
    uint32_t length, rule;
} length_candidate;
static bool shorter(const void *a, const void *b) {
    return ((const length_candidate *)a)->length < ((const length_candidate *)b)->length;
}

/* rule_min of every rule, then min_rest of every position. Each alternative waits for the rules
 * it references (counted with repeats); once the last one is final, its length is a candidate for
 * its own rule, and the shortest candidate of a rule not yet final is final. Rules never final
 * cannot end (EM_GRAMMAR_INFINITE). Linear in the grammar, times the heap's log. False when out of
 * memory or when the budget ran out (its verdict says which). */
static bool compute_min_lengths(em_grammar *g, em_grammar_budget *budget) {
    uint32_t n_alts = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) n_alts += g->rule_count[r];
    uint32_t *rule_min = g->rule_min = malloc(g->n_rules * sizeof *rule_min);
    uint32_t *waiting = calloc(n_alts, sizeof *waiting), *length = calloc(n_alts, sizeof *length);
    uint32_t *owner = malloc(n_alts * sizeof *owner), *users_start = calloc((size_t)g->n_rules + 1, sizeof *users_start);
    uint32_t *users = NULL; /* per rule: the alternatives that reference it, once per reference */
    em_heap heap = {0};
    bool ok = rule_min && waiting && length && owner && users_start;
    for (uint32_t r = 0; ok && r < g->n_rules; r++) {
        rule_min[r] = EM_GRAMMAR_INFINITE;
        for (uint32_t a = g->rule_first[r]; a < g->rule_first[r] + g->rule_count[r]; a++) {
            owner[a] = r;
            for (uint32_t i = g->alternatives[a]; EM_ELEMENT_KIND(g->elements[i]) != EM_ELEMENT_END; i++)
                if (EM_ELEMENT_KIND(g->elements[i]) == EM_ELEMENT_RULE) users_start[EM_ELEMENT_VALUE(g->elements[i]) + 1]++;
        }
    }
    for (uint32_t r = 0; ok && r < g->n_rules; r++) users_start[r + 1] += users_start[r];
    ok = ok && (users = malloc(((size_t)users_start[g->n_rules] + 1) * sizeof *users)) != NULL;
    for (uint32_t a = 0; ok && a < n_alts; a++) {
        for (uint32_t i = g->alternatives[a]; EM_ELEMENT_KIND(g->elements[i]) != EM_ELEMENT_END; i++) {
            uint32_t e = g->elements[i];
            if (EM_ELEMENT_KIND(e) == EM_ELEMENT_BYTES) {
                length[a] = add_saturated(length[a], 1);
            } else {
                users[users_start[EM_ELEMENT_VALUE(e)]++] = a; /* filled forward; shifted back below */
                waiting[a]++;
            }
        }
        if (!waiting[a]) ok = em_heap_push(&heap, &(length_candidate){length[a], owner[a]}, sizeof(length_candidate), shorter);
    }
    for (uint32_t r = g->n_rules; ok && r-- > 0;) users_start[r + 1] = users_start[r];
    if (ok) users_start[0] = 0;
    while (ok && heap.n) {
        if (!em_grammar_budget_spend(budget)) {
            ok = false;
            break;
        }
        length_candidate c;
        em_heap_pop(&heap, &c, sizeof c, shorter);
        if (rule_min[c.rule] != EM_GRAMMAR_INFINITE) continue; /* final already, with less */
        rule_min[c.rule] = c.length;
        for (uint32_t u = users_start[c.rule]; ok && u < users_start[c.rule + 1]; u++) {
            uint32_t a = users[u];
            length[a] = add_saturated(length[a], c.length);
            if (--waiting[a] == 0)
                ok = em_heap_push(&heap, &(length_candidate){length[a], owner[a]}, sizeof(length_candidate), shorter);
        }
    }
    g->min_rest[g->n_elements] = 0; /* the sentinel END */
    for (uint32_t i = g->n_elements; ok && i-- > 0;) {
        uint32_t e = g->elements[i];
        uint32_t own = EM_ELEMENT_KIND(e) == EM_ELEMENT_BYTES ? 1 : EM_ELEMENT_KIND(e) == EM_ELEMENT_RULE ? rule_min[EM_ELEMENT_VALUE(e)] : 0;
        g->min_rest[i] = EM_ELEMENT_KIND(e) == EM_ELEMENT_END ? 0 : add_saturated(own, g->min_rest[i + 1]);
    }
    free(waiting);
    free(length);
    free(owner);
    free(users_start);
    free(users);
    em_heap_free(&heap);
    return ok;
}

/* A rule that can reach itself without consuming a byte would make the automaton loop: depth-first
 * search over "starts with" edges (a rule reference preceded only by rules that can be empty),
 * with an explicit stack. Each frame keeps its place (alternative, element), so every edge is
 * looked at once. */
static em_err check_left_recursion(const em_grammar *g, em_grammar_budget *budget) {
    uint8_t *mark = calloc(g->n_rules, 1); /* 0 new, 1 on the path, 2 done */
    uint32_t *path = malloc(g->n_rules * sizeof *path), *next_alt = malloc(g->n_rules * sizeof *next_alt);
    uint32_t *next_element = malloc(g->n_rules * sizeof *next_element); /* UINT32_MAX: the alternative's start */
    em_err err = NULL;
    if (!mark || !path || !next_alt || !next_element) err = em_errorf(EM_ERR_NOMEM, "grammar: out of memory");
    for (uint32_t start = 0; !err && start < g->n_rules; start++) {
        if (mark[start]) continue;
        size_t depth = 0;
        path[depth] = start;
        next_alt[depth] = 0;
        next_element[depth++] = UINT32_MAX;
        mark[start] = 1;
        while (depth && !err) {
            if (!em_grammar_budget_spend(budget)) {
                err = em_grammar_budget_error(budget);
                break;
            }
            const size_t top = depth - 1;
            const uint32_t r = path[top];
            /* r's next edge: the rule reference at the frame's place, if its alternative gets there */
            uint32_t found = UINT32_MAX;
            while (found == UINT32_MAX && next_alt[top] < g->rule_count[r]) {
                uint32_t i = next_element[top];
                if (i == UINT32_MAX) i = g->alternatives[g->rule_first[r] + next_alt[top]];
                uint32_t e = g->elements[i];
                if (EM_ELEMENT_KIND(e) == EM_ELEMENT_RULE) {
                    found = EM_ELEMENT_VALUE(e);
                    /* the element after it starts too when this rule can be empty */
                    next_element[top] = g->rule_min[found] == 0 ? i + 1 : UINT32_MAX;
                    if (next_element[top] == UINT32_MAX) next_alt[top]++;
                } else {
                    next_alt[top]++;
                    next_element[top] = UINT32_MAX;
                }
            }
            if (found == UINT32_MAX) {
                mark[r] = 2;
                depth--;
            } else if (mark[found] == 1) {
                err = em_errorf(EM_ERR_INVALID, "grammar: rule '%s' is left-recursive (it can start with itself)",
                                g->rule_names[found]);
            } else if (!mark[found]) {
                mark[found] = 1;
                path[depth] = found;
                next_alt[depth] = 0;
                next_element[depth++] = UINT32_MAX;
            }
        }
    }
    free(mark);
    free(path);
    free(next_alt);
    free(next_element);
    return err;
}

/* Flattens the rules into the grammar's arrays. */
static bool flatten(parser *p, em_grammar *g) {
    size_t n_elements = 0, n_alts = 0;
    for (size_t r = 0; r < p->n_rules; r++) {
        n_elements += p->rules[r].n;
        for (size_t i = 0; i < p->rules[r].n; i++) n_alts += EM_ELEMENT_KIND(p->rules[r].elements[i]) == EM_ELEMENT_END;
    }
    g->n_rules = (uint32_t)p->n_rules;
    g->n_elements = (uint32_t)n_elements;
    g->elements = malloc((n_elements + 1) * sizeof *g->elements);
    g->min_rest = malloc((n_elements + 1) * sizeof *g->min_rest);
    g->alternatives = malloc((n_alts + 1) * sizeof *g->alternatives);
    g->rule_first = malloc(p->n_rules * sizeof *g->rule_first);
    g->rule_count = malloc(p->n_rules * sizeof *g->rule_count);
    g->rule_names = calloc(p->n_rules, sizeof *g->rule_names);
    if (!g->elements || !g->min_rest || !g->alternatives || !g->rule_first || !g->rule_count || !g->rule_names)
        return fail_nomem(p);
    size_t at = 0, alt = 0;
    for (size_t r = 0; r < p->n_rules; r++) {
        rule_builder *b = &p->rules[r];
        g->rule_names[r] = b->name;
        b->name = NULL;
        g->rule_first[r] = (uint32_t)alt;
        g->rule_count[r] = 0;
        for (size_t i = 0; i < b->n; i++) {
            if (i == 0 || EM_ELEMENT_KIND(b->elements[i - 1]) == EM_ELEMENT_END) {
                g->alternatives[alt++] = (uint32_t)(at + i);
                g->rule_count[r]++;
            }
            g->elements[at + i] = b->elements[i];
        }
        at += b->n;
    }
    g->elements[at] = EM_ELEMENT(EM_ELEMENT_END, 0);
    g->byte_sets = p->byte_sets;
    g->n_byte_sets = (uint32_t)p->n_byte_sets;
    p->byte_sets = NULL;
    return true;
}

em_err em_grammar_compile(const char *gbnf, size_t len, em_grammar **out) {
    return em_grammar_compile_budgeted(gbnf, len, NULL, false, out);
}

/* Parses and checks; with `checked`, also makes the start state (a grammar too ambiguous to start
 * is refused here rather than when a request begins to follow it). */
em_err em_grammar_compile_budgeted(const char *gbnf, size_t len, em_grammar_budget *budget, bool checked,
                                   em_grammar **out) {
    *out = NULL;
    parser p = {.text = gbnf, .len = len, .budget = budget};
    em_grammar *g = calloc(1, sizeof *g);
    if (!g) return em_errorf(EM_ERR_NOMEM, "grammar: out of memory");
    atomic_init(&g->refs, 1);
    if (parse_rules(&p)) {
        uint32_t root = UINT32_MAX;
        for (size_t r = 0; r < p.n_rules; r++) {
            if (!p.rules[r].defined) {
                fail_at(&p, p.rules[r].first_use, "rule '%s' is used but not defined", p.rules[r].name);
                break;
            }
            if (strcmp(p.rules[r].name, "root") == 0) root = (uint32_t)r;
        }
        if (!p.err && root == UINT32_MAX) p.err = em_errorf(EM_ERR_INVALID, "grammar: no 'root' rule");
        g->root = root;
        if (!p.err && flatten(&p, g) && !compute_min_lengths(g, budget)) {
            if (budget && budget->verdict) p.err = em_grammar_budget_error(budget);
            else fail_nomem(&p);
        }
        if (!p.err) p.err = check_left_recursion(g, budget);
        if (!p.err && g->min_rest[g->alternatives[g->rule_first[root]]] == EM_GRAMMAR_INFINITE) {
            bool any = false;
            for (uint32_t a = 0; a < g->rule_count[root]; a++)
                any |= g->min_rest[g->alternatives[g->rule_first[root] + a]] != EM_GRAMMAR_INFINITE;
            if (!any) p.err = em_errorf(EM_ERR_INVALID, "grammar: 'root' never ends (every derivation recurses forever)");
        }
    }
    for (size_t r = 0; r < p.n_rules; r++) {
        free(p.rules[r].name);
        free(p.rules[r].elements);
    }
    free(p.rules);
    free(p.byte_sets);
    free(p.rule_index.slots);
    free(p.byte_set_index.slots);
    em_grammar_state *start = NULL;
    if (!p.err && checked) p.err = em_grammar_state_new(g, &start);
    em_grammar_state_free(start);
    if (p.err) {
        em_grammar_free(g);
        return p.err;
    }
    *out = g;
    return NULL;
}

em_grammar *em_grammar_retain(em_grammar *g) {
    if (g) atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
    return g;
}

em_err em_grammar_compile_checked(const char *gbnf, size_t len, em_grammar **out) {
    return em_grammar_compile_budgeted(gbnf, len, NULL, true, out);
}

size_t em_grammar_bytes(const em_grammar *g) {
    const size_t n_alternatives = g->n_rules ? g->rule_first[g->n_rules - 1] + g->rule_count[g->n_rules - 1] : 0;
    size_t bytes = sizeof *g + 2 * ((size_t)g->n_elements + 1) * sizeof(uint32_t) + g->n_byte_sets * sizeof(em_byte_set) +
                   (n_alternatives + 1) * sizeof(uint32_t) + (size_t)g->n_rules * (3 * sizeof(uint32_t) + sizeof(char *));
    for (uint32_t r = 0; r < g->n_rules; r++) bytes += strlen(g->rule_names[r]) + 1;
    return bytes;
}

void em_grammar_free(em_grammar *g) {
    if (!g || atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1) return;
    for (uint32_t r = 0; r < g->n_rules && g->rule_names; r++) free(g->rule_names[r]);
    free(g->rule_names);
    free(g->elements);
    free(g->min_rest);
    free(g->rule_min);
    free(g->alternatives);
    free(g->rule_first);
    free(g->rule_count);
    free(g->byte_sets);
    free(g);
}
