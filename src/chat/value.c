/*
 * Runtime values of the chat template interpreter, and how they print.
 *
 * Values are arena-allocated and never freed one by one. Printing follows the reference renderer
 * (@huggingface/jinja), which is JavaScript: numbers print as JavaScript prints them (a float
 * with an integral value keeps ".0"), booleans as "true"/"false", lists and dicts as JSON with
 * ", " and ": " separators. `tojson` follows the reference's own serializer, which mimics
 * Python's json.dumps (ensure_ascii off by default, as transformers calls it).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- arena ---- */
struct em_chat_chunk {
    struct em_chat_chunk *next;
    size_t used, size;
    max_align_t data[];
};

void *em_chat_alloc(em_chat_arena *arena, size_t size) {
    size = (size + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (size == 0) size = sizeof(max_align_t);
    struct em_chat_chunk *c = arena->head;
    if (!c || c->size - c->used < size) {
        size_t want = size > 65536 ? size : 65536;
        if (arena->limit && (want > arena->limit || arena->used > arena->limit - want)) {
            arena->failed = true;
            return NULL;
        }
        c = malloc(sizeof *c + want);
        if (!c) {
            arena->failed = true;
            return NULL;
        }
        c->next = arena->head;
        c->used = 0;
        c->size = want;
        arena->head = c;
        arena->used += want;
    }
    void *p = (char *)c->data + c->used;
    c->used += size;
    memset(p, 0, size);
    return p;
}

char *em_chat_strdup(em_chat_arena *arena, const char *s, size_t len) {
    char *p = em_chat_alloc(arena, len + 1);
    if (!p) return NULL;
    if (len) memcpy(p, s, len);
    p[len] = 0;
    return p;
}

void em_chat_arena_free(em_chat_arena *arena) {
    struct em_chat_chunk *c = arena->head;
    while (c) {
        struct em_chat_chunk *next = c->next;
        free(c);
        c = next;
    }
    arena->head = NULL;
    arena->used = 0;
    arena->failed = false;
}

/* ---- constructors ---- */
em_chat_value em_chat_undefined = {.kind = VAL_UNDEFINED};
em_chat_value em_chat_none = {.kind = VAL_NONE};
em_chat_value em_chat_true = {.kind = VAL_BOOL, .as.b = true};
em_chat_value em_chat_false = {.kind = VAL_BOOL, .as.b = false};

em_chat_value *em_chat_new(em_chat_arena *a, em_chat_kind kind) {
    em_chat_value *v = em_chat_alloc(a, sizeof *v);
    if (v) v->kind = kind;
    return v;
}

em_chat_value *em_chat_int(em_chat_arena *a, int64_t x) {
    em_chat_value *v = em_chat_new(a, VAL_INT);
    if (v) v->as.i = x;
    return v;
}

em_chat_value *em_chat_float(em_chat_arena *a, double x) {
    em_chat_value *v = em_chat_new(a, VAL_FLOAT);
    if (v) v->as.f = x;
    return v;
}

em_chat_value *em_chat_bool(bool x) { return x ? &em_chat_true : &em_chat_false; }

em_chat_value *em_chat_string_ref(em_chat_arena *a, const char *s, size_t len) {
    em_chat_value *v = em_chat_new(a, VAL_STRING);
    if (!v) return NULL;
    v->as.s.ptr = s ? s : "";
    v->as.s.len = len;
    return v;
}

em_chat_value *em_chat_string(em_chat_arena *a, const char *s, size_t len) {
    char *copy = em_chat_strdup(a, s, len);
    return copy ? em_chat_string_ref(a, copy, len) : NULL;
}

em_chat_value *em_chat_list_new(em_chat_arena *a, size_t cap) {
    em_chat_value *v = em_chat_new(a, VAL_LIST);
    if (!v) return NULL;
    v->as.list = em_chat_alloc(a, sizeof *v->as.list);
    if (!v->as.list) return NULL;
    if (cap) {
        v->as.list->at = em_chat_alloc(a, cap * sizeof(em_chat_value *));
        if (!v->as.list->at) return NULL;
        v->as.list->cap = cap;
    }
    return v;
}

em_chat_value *em_chat_dict_new(em_chat_arena *a, em_chat_kind kind) {
    em_chat_value *v = em_chat_new(a, kind);
    if (!v) return NULL;
    v->as.dict = em_chat_alloc(a, sizeof *v->as.dict);
    return v->as.dict ? v : NULL;
}

bool em_chat_list_push(em_chat_arena *a, em_chat_list *l, em_chat_value *v) {
    if (!v) {
        a->failed = true;
        return false;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        em_chat_value **at = em_chat_alloc(a, cap * sizeof *at);
        if (!at) return false;
        if (l->n) memcpy(at, l->at, l->n * sizeof *at);
        l->at = at;
        l->cap = cap;
    }
    l->at[l->n++] = v;
    return true;
}

static em_chat_entry *dict_find(const em_chat_dict *d, const char *key, size_t len) {
    for (size_t i = 0; i < d->n; i++)
        if (d->at[i].key_len == len && !memcmp(d->at[i].key, key, len)) return &d->at[i];
    return NULL;
}

/* Appends a key the dict does not hold yet. */
static bool dict_append(em_chat_arena *a, em_chat_dict *d, const char *key, size_t len, em_chat_value *v) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        em_chat_entry *at = em_chat_alloc(a, cap * sizeof *at);
        if (!at) return false;
        if (d->n) memcpy(at, d->at, d->n * sizeof *at);
        d->at = at;
        d->cap = cap;
    }
    d->at[d->n++] = (em_chat_entry){key, len, v};
    return true;
}

bool em_chat_dict_set(em_chat_arena *a, em_chat_dict *d, const char *key, size_t len, em_chat_value *v) {
    em_chat_entry *e = dict_find(d, key, len);
    if (e) {
        e->value = v;
        return true;
    }
    return dict_append(a, d, key, len, v);
}

em_chat_value *em_chat_dict_get(const em_chat_dict *d, const char *key, size_t len) {
    em_chat_entry *e = dict_find(d, key, len);
    return e ? e->value : NULL;
}

bool em_chat_dict_remove(em_chat_dict *d, const char *key, size_t len) {
    em_chat_entry *e = dict_find(d, key, len);
    if (!e) return false;
    size_t i = (size_t)(e - d->at);
    memmove(d->at + i, d->at + i + 1, (d->n - i - 1) * sizeof *d->at);
    d->n--;
    return true;
}

/* ---- properties ---- */
bool em_chat_truthy(const em_chat_value *v) {
    switch (v->kind) {
    case VAL_UNDEFINED:
    case VAL_NONE: return false;
    case VAL_BOOL: return v->as.b;
    case VAL_INT: return v->as.i != 0;
    case VAL_FLOAT: return v->as.f != 0 && !isnan(v->as.f);
    case VAL_STRING: return v->as.s.len > 0;
    case VAL_LIST: return v->as.list->n > 0;
    case VAL_DICT: return v->as.dict->n > 0;
    case VAL_NAMESPACE:
    case VAL_FUNCTION: return true; /* a JavaScript object is always truthy */
    }
    return false;
}

bool em_chat_is_number(const em_chat_value *v) { return v->kind == VAL_INT || v->kind == VAL_FLOAT; }

double em_chat_number(const em_chat_value *v) {
    if (v->kind == VAL_INT) return (double)v->as.i;
    if (v->kind == VAL_FLOAT) return v->as.f;
    if (v->kind == VAL_BOOL) return v->as.b ? 1 : 0;
    return NAN;
}

const char *em_chat_kind_name(const em_chat_value *v) {
    static const char *names[] = {"undefined", "none", "boolean", "integer", "float",
                                  "string", "list", "dict", "namespace", "function"};
    if (v->kind == VAL_LIST && v->is_tuple) return "tuple";
    if (v->kind == VAL_FLOAT && v->is_big_int) return "integer";
    return names[v->kind];
}

/* ---- printing ---- */
void em_chat_format_js_number(em_buf *b, double v) {
    if (isnan(v) || isinf(v) || v == 0) {
        em_buf_puts(b, isnan(v) ? "NaN" : v == 0 ? "0" : v > 0 ? "Infinity" : "-Infinity");
        return;
    }
    if (v < 0) {
        em_buf_putc(b, '-');
        v = -v;
    }
    /* Shortest digits that read back as v (ECMAScript Number::toString, step 5). */
    char tmp[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
        if (strtod(tmp, NULL) == v) break;
    }
    char digits[24];
    size_t k = 0;
    const char *s = tmp;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9') digits[k++] = *s;
    while (k > 1 && digits[k - 1] == '0') k--;
    digits[k] = 0;
    int e = atoi(s + 1);
    int n = e + 1; /* value = 0.digits × 10^n */
    if ((int)k <= n && n <= 21) {
        em_buf_append(b, digits, k);
        for (int i = (int)k; i < n; i++) em_buf_putc(b, '0');
    } else if (0 < n && n <= 21) {
        em_buf_append(b, digits, (size_t)n);
        em_buf_putc(b, '.');
        em_buf_append(b, digits + n, k - (size_t)n);
    } else if (-6 < n && n <= 0) {
        em_buf_puts(b, "0.");
        for (int i = 0; i < -n; i++) em_buf_putc(b, '0');
        em_buf_append(b, digits, k);
    } else {
        em_buf_putc(b, digits[0]);
        if (k > 1) {
            em_buf_putc(b, '.');
            em_buf_append(b, digits + 1, k - 1);
        }
        em_buf_printf(b, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    }
}

static void format_float(em_buf *b, double f) {
    if (f == 0 && signbit(f)) {
        em_buf_puts(b, "-0.0");
        return;
    }
    em_chat_format_js_number(b, f);
    if (isfinite(f) && f == floor(f) && fabs(f) < 1e21) em_buf_puts(b, ".0");
}

em_err em_chat_render_value(em_buf *b, const em_chat_value *v) {
    switch (v->kind) {
    case VAL_UNDEFINED: em_buf_puts(b, "undefined"); break;
    case VAL_NONE: em_buf_puts(b, "null"); break;
    case VAL_BOOL: em_buf_puts(b, v->as.b ? "true" : "false"); break;
    case VAL_INT:
        /* Past 2^53 a JavaScript number prints its shortest round-trip digits. */
        if (v->as.i > 9007199254740992LL || v->as.i < -9007199254740992LL) em_chat_format_js_number(b, (double)v->as.i);
        else em_buf_printf(b, "%lld", (long long)v->as.i);
        break;
    case VAL_FLOAT:
        if (v->is_big_int) em_chat_format_js_number(b, v->as.f);
        else format_float(b, v->as.f);
        break;
    case VAL_STRING: em_buf_append(b, v->as.s.ptr, v->as.s.len); break;
    case VAL_LIST:
    case VAL_DICT:
    case VAL_NAMESPACE: {
        em_chat_json_options o = {0};
        return em_chat_to_json(b, v, &o, 0);
    }
    case VAL_FUNCTION:
        return em_errorf(EM_ERR_UNSUPPORTED, "cannot print a function ('%s')", v->as.fn->name);
    }
    return NULL;
}

em_err em_chat_js_string(em_buf *b, const em_chat_value *v) {
    switch (v->kind) {
    case VAL_UNDEFINED:
    case VAL_NONE: return NULL; /* Array.prototype.join prints them as "" */
    case VAL_INT:
    case VAL_FLOAT: em_chat_format_js_number(b, em_chat_number(v)); return NULL;
    case VAL_LIST:
        /* A JavaScript array of runtime values: join(",") of each value's toString. */
        for (size_t i = 0; i < v->as.list->n; i++) {
            if (i) em_buf_putc(b, ',');
            /* The reference's none holds JavaScript undefined, so it prints "undefined" here. */
            const em_chat_value *e = v->as.list->at[i];
            em_err err = em_chat_render_value(b, e->kind == VAL_NONE ? &em_chat_undefined : e);
            if (err) return err;
        }
        return NULL;
    case VAL_DICT:
    case VAL_NAMESPACE: em_buf_puts(b, "[object Map]"); return NULL;
    default: return em_chat_render_value(b, v);
    }
}

/* JSON.stringify of a string (UTF-8 in, escapes as JavaScript writes them). */
static void json_quote(em_buf *b, const char *s, size_t n, bool ascii) {
    em_buf_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': em_buf_puts(b, "\\\""); continue;
        case '\\': em_buf_puts(b, "\\\\"); continue;
        case '\b': em_buf_puts(b, "\\b"); continue;
        case '\f': em_buf_puts(b, "\\f"); continue;
        case '\n': em_buf_puts(b, "\\n"); continue;
        case '\r': em_buf_puts(b, "\\r"); continue;
        case '\t': em_buf_puts(b, "\\t"); continue;
        default: break;
        }
        if (c < 0x20) {
            em_buf_printf(b, "\\u%04x", c);
        } else if (ascii && c >= 0x7f) {
            /* ensure_ascii escapes each UTF-16 code unit of the character. */
            uint32_t cp = c;
            size_t extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
            if (c >= 0xc0) cp = c & (0x3f >> extra);
            for (size_t k = 0; k < extra && i + 1 < n; k++) cp = (cp << 6) | ((unsigned char)s[++i] & 0x3f);
            if (cp > 0xffff) {
                cp -= 0x10000;
                em_buf_printf(b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            } else {
                em_buf_printf(b, "\\u%04x", cp);
            }
        } else {
            em_buf_putc(b, (char)c);
        }
    }
    em_buf_putc(b, '"');
}

static int key_order(const void *pa, const void *pb) {
    /* localeCompare, approximated: case-insensitive first, then lowercase before uppercase. */
    const em_chat_entry *a = pa, *b = pb;
    size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
    for (size_t i = 0; i < n; i++) {
        int ca = (unsigned char)a->key[i], cb = (unsigned char)b->key[i];
        int la = ca >= 'A' && ca <= 'Z' ? ca + 32 : ca, lb = cb >= 'A' && cb <= 'Z' ? cb + 32 : cb;
        if (la != lb) return la - lb;
    }
    if (a->key_len != b->key_len) return a->key_len < b->key_len ? -1 : 1;
    for (size_t i = 0; i < n; i++)
        if (a->key[i] != b->key[i]) return (unsigned char)b->key[i] - (unsigned char)a->key[i];
    return 0;
}

static void newline_indent(em_buf *b, int indent, int depth) {
    em_buf_putc(b, '\n');
    for (int i = 0; i < indent * depth; i++) em_buf_putc(b, ' ');
}

em_err em_chat_to_json(em_buf *b, const em_chat_value *v, const em_chat_json_options *o, int depth) {
    const char *item_sep = o->item_sep ? o->item_sep : o->indent ? "," : ", ";
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    if (depth > 512) return em_errorf(EM_ERR_RANGE, "tojson: value nested too deeply");
    switch (v->kind) {
    case VAL_UNDEFINED: em_buf_puts(b, o->undefined_as_null ? "null" : "undefined"); return NULL;
    case VAL_NONE: em_buf_puts(b, "null"); return NULL;
    case VAL_BOOL: em_buf_puts(b, v->as.b ? "true" : "false"); return NULL;
    case VAL_INT:
    case VAL_FLOAT: {
        double f = em_chat_number(v);
        if (!isfinite(f)) em_buf_puts(b, "null");
        else em_chat_format_js_number(b, f);
        return NULL;
    }
    case VAL_STRING: json_quote(b, v->as.s.ptr, v->as.s.len, o->ensure_ascii); return NULL;
    case VAL_LIST: {
        const em_chat_list *l = v->as.list;
        if (v->is_tuple) return em_errorf(EM_ERR_UNSUPPORTED, "cannot convert a tuple to JSON (the reference renderer cannot either)");
        em_buf_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) em_buf_puts(b, item_sep);
            if (o->indent) newline_indent(b, o->indent, depth + 1);
            em_err err = em_chat_to_json(b, l->at[i], o, depth + 1);
            if (err) return err;
        }
        if (o->indent && l->n) newline_indent(b, o->indent, depth);
        em_buf_putc(b, ']');
        return NULL;
    }
    case VAL_DICT:
    case VAL_NAMESPACE: {
        const em_chat_dict *d = v->as.dict;
        em_chat_entry *sorted = NULL;
        const em_chat_entry *at = d->at;
        if (o->sort_keys && d->n > 1) {
            sorted = malloc(d->n * sizeof *sorted);
            if (!sorted) return em_errorf(EM_ERR_NOMEM, "out of memory in tojson");
            memcpy(sorted, d->at, d->n * sizeof *sorted);
            qsort(sorted, d->n, sizeof *sorted, key_order);
            at = sorted;
        }
        em_buf_putc(b, '{');
        em_err err = NULL;
        for (size_t i = 0; i < d->n && !err; i++) {
            if (i) em_buf_puts(b, item_sep);
            if (o->indent) newline_indent(b, o->indent, depth + 1);
            json_quote(b, at[i].key, at[i].key_len, o->ensure_ascii);
            em_buf_puts(b, key_sep);
            err = em_chat_to_json(b, at[i].value, o, depth + 1);
        }
        free(sorted);
        if (err) return err;
        if (o->indent && d->n) newline_indent(b, o->indent, depth);
        em_buf_putc(b, '}');
        return NULL;
    }
    case VAL_FUNCTION: return em_errorf(EM_ERR_TYPE, "tojson: cannot convert a function to JSON");
    }
    return NULL;
}

/* ---- equality ---- */
static bool is_object(const em_chat_value *v) {
    return v->kind == VAL_LIST || v->kind == VAL_DICT || v->kind == VAL_NAMESPACE || v->kind == VAL_FUNCTION;
}

static bool same_object(const em_chat_value *a, const em_chat_value *b) {
    if (a->kind != b->kind) return false;
    if (a->kind == VAL_LIST) return a->as.list == b->as.list;
    if (a->kind == VAL_FUNCTION) return a->as.fn == b->as.fn;
    return a->as.dict == b->as.dict;
}

bool em_chat_strict_equal(const em_chat_value *a, const em_chat_value *b) {
    if (em_chat_is_number(a) && em_chat_is_number(b)) return em_chat_number(a) == em_chat_number(b);
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case VAL_UNDEFINED:
    case VAL_NONE: return true;
    case VAL_BOOL: return a->as.b == b->as.b;
    case VAL_STRING: return a->as.s.len == b->as.s.len && !memcmp(a->as.s.ptr, b->as.s.ptr, a->as.s.len);
    default: return same_object(a, b);
    }
}

/* JavaScript's ToNumber of a string: surrounding whitespace ignored, "" is 0, else NaN unless
 * the whole rest is a decimal or hex literal. */
static double js_string_number(const char *s, size_t n) {
    size_t i = 0, k;
    while (i < n && (k = em_chat_space_len(s + i, n - i))) i += k;
    while (n > i) {
        size_t j = n - 1;
        while (j > i && ((unsigned char)s[j] & 0xc0) == 0x80) j--;
        if (em_chat_space_len(s + j, n - j) != n - j) break;
        n = j;
    }
    if (i == n) return 0;
    char tmp[128];
    if (n - i >= sizeof tmp) return NAN;
    memcpy(tmp, s + i, n - i);
    tmp[n - i] = 0;
    if (!strcmp(tmp, "Infinity") || !strcmp(tmp, "+Infinity")) return INFINITY;
    if (!strcmp(tmp, "-Infinity")) return -INFINITY;
    for (char *p = tmp; *p; p++)
        if (!strchr("0123456789+-.eExXabcdefABCDEF", *p)) return NAN;
    char *end;
    double d = strtod(tmp, &end);
    return *end ? NAN : d;
}

bool em_chat_loose_equal(const em_chat_value *a, const em_chat_value *b) {
    bool a_nullish = a->kind == VAL_UNDEFINED || a->kind == VAL_NONE;
    bool b_nullish = b->kind == VAL_UNDEFINED || b->kind == VAL_NONE;
    if (a_nullish || b_nullish) return a_nullish && b_nullish;
    if (is_object(a) && is_object(b)) return same_object(a, b);
    if (a->kind == VAL_STRING && b->kind == VAL_STRING) return em_chat_strict_equal(a, b);
    if (is_object(a) || is_object(b)) {
        /* The object becomes its string (ToPrimitive), then compares again. */
        const em_chat_value *obj = is_object(a) ? a : b, *prim = is_object(a) ? b : a;
        em_buf buf = {0};
        if (em_chat_js_string(&buf, obj) || buf.failed) {
            free(buf.data);
            return false;
        }
        em_chat_value s = {.kind = VAL_STRING, .as.s = {buf.data ? buf.data : "", buf.len}};
        bool eq = em_chat_loose_equal(&s, prim);
        free(buf.data);
        return eq;
    }
    double x = a->kind == VAL_STRING ? js_string_number(a->as.s.ptr, a->as.s.len) : em_chat_number(a);
    double y = b->kind == VAL_STRING ? js_string_number(b->as.s.ptr, b->as.s.len) : em_chat_number(b);
    return x == y;
}

/* ---- JSON input ---- */
/* Whether a key is an array index (a canonical integer below 2^32 - 1): JavaScript enumerates
 * such keys first, in ascending order, whatever order JSON.parse met them in. */
static bool index_key(const char *k, size_t n, uint64_t *out) {
    if (n == 0 || n > 10 || (n > 1 && k[0] == '0')) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9') return false;
        v = v * 10 + (uint64_t)(k[i] - '0');
    }
    *out = v;
    return v < 4294967295u;
}

/* An object's key that reads as an array index, with its value (em_chat_from_json). */
typedef struct json_object_key_index {
    uint64_t index;
    const char *key;
    json_t *value;
} json_object_key_index;

static int by_index(const void *a, const void *b) {
    uint64_t x = ((const json_object_key_index *)a)->index, y = ((const json_object_key_index *)b)->index;
    return x < y ? -1 : x > y;
}

/* dict[key] = value converted; false when out of memory. */
static bool set_from_json(em_chat_arena *a, em_chat_value *dict, const char *key, const json_t *value) {
    size_t klen = strlen(key);
    em_chat_value *e = em_chat_from_json(a, value);
    char *k = em_chat_strdup(a, key, klen);
    return e && k && dict_append(a, dict->as.dict, k, klen, e); /* a JSON object's keys are unique */
}

em_chat_value *em_chat_from_json(em_chat_arena *a, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_NULL: return &em_chat_none;
    case JSON_TRUE: return &em_chat_true;
    case JSON_FALSE: return &em_chat_false;
    case JSON_INTEGER: {
        /* JSON.parse makes every number a double: integers past 2^53 round as they do there. */
        int64_t i = (int64_t)json_integer_value(j);
        if (i > 9007199254740992LL || i < -9007199254740992LL) {
            double d = (double)i;
            if (d < 9.2e18 && d > -9.2e18) return em_chat_int(a, (int64_t)d);
            em_chat_value *v = em_chat_float(a, d);
            if (v) v->is_big_int = true;
            return v;
        }
        return em_chat_int(a, i);
    }
    case JSON_REAL: {
        double d = json_real_value(j);
        if (d == floor(d) && fabs(d) < 9.2e18) return em_chat_int(a, (int64_t)d);
        return em_chat_float(a, d);
    }
    case JSON_STRING: return em_chat_string(a, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        em_chat_value *v = em_chat_list_new(a, n);
        if (!v) return NULL;
        for (size_t i = 0; i < n; i++) {
            em_chat_value *e = em_chat_from_json(a, json_array_get(j, i));
            if (!e || !em_chat_list_push(a, v->as.list, e)) return NULL;
        }
        return v;
    }
    case JSON_OBJECT: {
        em_chat_value *v = em_chat_dict_new(a, VAL_DICT);
        if (!v) return NULL;
        /* Index keys first, ascending (as JavaScript orders an object's keys), then the others in
         * their order. The index keys are sorted, not inserted in order: a request's object of
         * 100,000 keys in descending order must not cost their square. */
        json_object_key_index *indexed = malloc((json_object_size(j) + 1) * sizeof *indexed);
        if (!indexed) return NULL;
        size_t n_indexed = 0;
        const char *key;
        json_t *value;
        json_object_foreach((json_t *)j, key, value) {
            uint64_t idx = 0;
            if (index_key(key, strlen(key), &idx)) indexed[n_indexed++] = (json_object_key_index){idx, key, value};
        }
        qsort(indexed, n_indexed, sizeof *indexed, by_index);
        bool ok = true;
        for (size_t i = 0; ok && i < n_indexed; i++) ok = set_from_json(a, v, indexed[i].key, indexed[i].value);
        free(indexed);
        json_object_foreach((json_t *)j, key, value) {
            uint64_t idx = 0;
            if (ok && !index_key(key, strlen(key), &idx)) ok = set_from_json(a, v, key, value);
        }
        return ok ? v : NULL;
    }
    }
    return NULL;
}
