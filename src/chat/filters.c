/*
 * Filters, tests, methods of strings and dicts, and the global functions — each with the
 * semantics of the reference renderer (@huggingface/jinja), quirks included, because the
 * point is to produce the reference's prompt byte for byte:
 *   - `str.strip(chars)`, `lstrip`, `rstrip` ignore `chars` and strip whitespace (JavaScript trim);
 *   - `title` upper-cases the first letter of each word and leaves the rest alone;
 *   - `length` of a string counts UTF-16 code units;
 *   - filters apply to the types the reference lists for them and are errors elsewhere
 *     (e.g. `first` on a string, `default` without parentheses on a list).
 * Anything not implemented is an error naming the filter, test or method.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "internal.h"

/* ---- string helpers ---- */
static em_chat_value *str_value(em_chat_interp *in, em_buf *b) {
    em_chat_value *v = b->failed ? NULL : em_chat_string(&in->arena, b->data, b->len);
    free(b->data);
    return v;
}

/* Upper- or lower-cases (casing.c); `first_only` maps only the first code point (capitalize). */
static em_chat_value *case_map(em_chat_interp *in, const char *s, size_t n, bool upper, bool first_only) {
    em_buf b = {0};
    em_chat_case_map(&b, s, n, upper, first_only);
    return str_value(in, &b);
}

static void trim_span(const char *s, size_t n, bool left, bool right, size_t *start, size_t *end) {
    size_t a = 0, e = n, k;
    if (left)
        while (a < e && (k = em_chat_space_len(s + a, e - a))) a += k;
    if (right)
        while (e > a) {
            size_t j = e - 1;
            while (j > a && ((unsigned char)s[j] & 0xc0) == 0x80) j--;
            if (em_chat_space_len(s + j, e - j) != e - j) break;
            e = j;
        }
    *start = a;
    *end = e;
}

static em_chat_value *trimmed(em_chat_interp *in, const em_chat_value *v, bool left, bool right) {
    size_t a, e;
    trim_span(v->as.s.ptr, v->as.s.len, left, right, &a, &e);
    return em_chat_string_ref(&in->arena, v->as.s.ptr + a, e - a);
}

static bool is_word(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* /\b\w/g → upper case: the first word character after a non-word one. */
static em_chat_value *title_case(em_chat_interp *in, const em_chat_value *v) {
    char *s = em_chat_strdup(&in->arena, v->as.s.ptr, v->as.s.len);
    if (!s) return NULL;
    for (size_t i = 0; i < v->as.s.len; i++)
        if (is_word((unsigned char)s[i]) && (i == 0 || !is_word((unsigned char)s[i - 1])) && s[i] >= 'a' && s[i] <= 'z')
            s[i] = (char)(s[i] - 32);
    return em_chat_string_ref(&in->arena, s, v->as.s.len);
}

static int64_t utf16_length(const char *s, size_t n) {
    int64_t units = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c & 0xc0) != 0x80) units += c >= 0xf0 ? 2 : 1;
    }
    return units;
}

static const char *find(const char *hay, size_t hn, const char *needle, size_t nn) {
    if (nn == 0) return hay;
    return memmem(hay, hn, needle, nn);
}

/* JavaScript String.prototype.replace with a literal pattern, at most `count` times (<0: all). */
static em_chat_value *replace_all(em_chat_interp *in, const em_chat_value *s, const em_chat_value *old,
                                  const em_chat_value *new_, int64_t count) {
    if (count == 0) return (em_chat_value *)s;
    em_buf b = {0};
    const char *p = s->as.s.ptr, *end = p + s->as.s.len;
    size_t on = old->as.s.len;
    if (on == 0) {
        /* The empty pattern matches before every code point and at the end. */
        for (const char *q = p;; ) {
            if (count != 0) {
                em_buf_append(&b, new_->as.s.ptr, new_->as.s.len);
                if (count > 0) count--;
            }
            if (q >= end) break;
            const char *nx = q + 1;
            while (nx < end && ((unsigned char)*nx & 0xc0) == 0x80) nx++;
            em_buf_append(&b, q, (size_t)(nx - q));
            q = nx;
        }
        return str_value(in, &b);
    }
    while (p < end) {
        const char *hit = count != 0 ? find(p, (size_t)(end - p), old->as.s.ptr, on) : NULL;
        if (!hit) break;
        em_buf_append(&b, p, (size_t)(hit - p));
        em_buf_append(&b, new_->as.s.ptr, new_->as.s.len);
        p = hit + on;
        if (count > 0) count--;
    }
    em_buf_append(&b, p, (size_t)(end - p));
    return str_value(in, &b);
}

/* ---- comparisons for sort/dictsort ---- */
int em_chat_compare(const em_chat_value *a, const em_chat_value *b, bool case_sensitive, bool *ok) {
    *ok = true;
    if (a->kind == VAL_NONE || b->kind == VAL_NONE || a->kind == VAL_UNDEFINED || b->kind == VAL_UNDEFINED) {
        if (a->kind == b->kind) return 0;
        *ok = false;
        return 0;
    }
    bool an = em_chat_is_number(a) || a->kind == VAL_BOOL, bn = em_chat_is_number(b) || b->kind == VAL_BOOL;
    if (an && bn) {
        double x = em_chat_number(a), y = em_chat_number(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->kind != VAL_STRING || b->kind != VAL_STRING) {
        *ok = false;
        return 0;
    }
    const char *x = a->as.s.ptr, *y = b->as.s.ptr;
    size_t xn = a->as.s.len, yn = b->as.s.len;
    if (!case_sensitive) {
        /* Lower-case a copy of each on the fly, code point by code point. */
        size_t i = 0, j = 0;
        while (i < xn && j < yn) {
            utf8proc_int32_t c1, c2;
            utf8proc_ssize_t k1 = utf8proc_iterate((const utf8proc_uint8_t *)x + i, (utf8proc_ssize_t)(xn - i), &c1);
            utf8proc_ssize_t k2 = utf8proc_iterate((const utf8proc_uint8_t *)y + j, (utf8proc_ssize_t)(yn - j), &c2);
            if (k1 <= 0) c1 = (unsigned char)x[i], k1 = 1;
            if (k2 <= 0) c2 = (unsigned char)y[j], k2 = 1;
            c1 = utf8proc_tolower(c1);
            c2 = utf8proc_tolower(c2);
            if (c1 != c2) return c1 < c2 ? -1 : 1;
            i += (size_t)k1;
            j += (size_t)k2;
        }
        return i < xn ? 1 : j < yn ? -1 : 0;
    }
    size_t n = xn < yn ? xn : yn;
    int c = memcmp(x, y, n);
    if (c) return c < 0 ? -1 : 1;
    return xn < yn ? -1 : xn > yn ? 1 : 0;
}

typedef struct sort_ctx {
    bool case_sensitive, reverse;
    const char *attribute; /* NULL: compare the items themselves */
    bool failed;
} sort_ctx;

static em_chat_value *attribute_path(em_chat_value *item, const char *path);

static int sort_compare(sort_ctx *c, em_chat_value *a, em_chat_value *b) {
    if (c->attribute) {
        a = attribute_path(a, c->attribute);
        b = attribute_path(b, c->attribute);
    }
    bool ok;
    int r = em_chat_compare(a, b, c->case_sensitive, &ok);
    if (!ok) c->failed = true;
    return c->reverse ? -r : r;
}

/* A stable merge sort (JavaScript's sort is stable). */
static void merge_sort(sort_ctx *c, em_chat_value **v, em_chat_value **tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(c, v, tmp, h);
    merge_sort(c, v + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = sort_compare(c, v[j], v[i]) < 0 ? v[j++] : v[i++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static em_err sorted_list(em_chat_interp *in, const em_chat_list *l, sort_ctx *c, size_t offset, em_chat_value **out) {
    em_chat_value *v = em_chat_list_new(&in->arena, l->n);
    em_chat_value **tmp = malloc((l->n + 1) * sizeof *tmp);
    if (!v || !tmp) {
        free(tmp);
        return em_chat_oom();
    }
    for (size_t i = 0; i < l->n; i++) em_chat_list_push(&in->arena, v->as.list, l->at[i]);
    merge_sort(c, v->as.list->at, tmp, l->n);
    free(tmp);
    if (c->failed) return em_chat_err(in, offset, "sort: cannot compare these values");
    *out = v;
    return NULL;
}

/* item.a.b (dicts, namespaces, list indices), undefined when missing. */
static em_chat_value *attribute_path(em_chat_value *item, const char *path) {
    em_chat_value *v = item;
    while (1) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (v->kind == VAL_DICT || v->kind == VAL_NAMESPACE) {
            v = em_chat_dict_get(v->as.dict, path, n);
            if (!v) return &em_chat_undefined;
        } else if (v->kind == VAL_LIST) {
            char tmp[24];
            if (n == 0 || n >= sizeof tmp) return &em_chat_undefined;
            memcpy(tmp, path, n);
            tmp[n] = 0;
            char *endp;
            long long idx = strtoll(tmp, &endp, 10);
            if (endp == tmp || idx < 0 || (size_t)idx >= v->as.list->n) return &em_chat_undefined;
            v = v->as.list->at[idx];
        } else {
            return &em_chat_undefined;
        }
        if (!dot) return v;
        path = dot + 1;
    }
}

/* ---- bound methods ---- */
static em_chat_value *arg(const em_chat_args *a, size_t i, const char *kw) {
    if (i < a->n_pos) return a->pos[i];
    if (kw && a->kw) return em_chat_dict_get(a->kw, kw, strlen(kw));
    return NULL;
}

static em_err string_method(em_chat_interp *in, const em_chat_value *fn, em_chat_args *args, size_t offset,
                            em_chat_scope *caller, em_chat_value **out) {
    const char *name = fn->as.fn->name;
    const em_chat_value *s = fn->as.fn->self;
    em_chat_value *r = NULL;
    if (!strcmp(name, "upper") || !strcmp(name, "lower")) r = case_map(in, s->as.s.ptr, s->as.s.len, name[0] == 'u', false);
    else if (!strcmp(name, "strip")) r = trimmed(in, s, true, true);
    else if (!strcmp(name, "lstrip")) r = trimmed(in, s, true, false);
    else if (!strcmp(name, "rstrip")) r = trimmed(in, s, false, true);
    else if (!strcmp(name, "title")) r = title_case(in, s);
    else if (!strcmp(name, "capitalize")) r = case_map(in, s->as.s.ptr, s->as.s.len, true, true);
    else if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        bool start = name[0] == 's';
        em_chat_value *p = arg(args, 0, NULL);
        if (!p) return em_chat_err(in, offset, "%s() needs an argument", name);
        em_chat_value *const *pats = &p;
        size_t np = 1;
        if (p->kind == VAL_LIST) {
            pats = p->as.list->at;
            np = p->as.list->n;
        } else if (p->kind != VAL_STRING) {
            return em_chat_err(in, offset, "%s() needs a string or a tuple of strings", name);
        }
        bool hit = false;
        for (size_t i = 0; i < np && !hit; i++) {
            if (pats[i]->kind != VAL_STRING) return em_chat_err(in, offset, "%s() tuple elements must be strings", name);
            size_t k = pats[i]->as.s.len;
            hit = k <= s->as.s.len && !memcmp(s->as.s.ptr + (start ? 0 : s->as.s.len - k), pats[i]->as.s.ptr, k);
        }
        *out = em_chat_bool(hit);
        return NULL;
    } else if (!strcmp(name, "split")) {
        em_chat_value *sep = arg(args, 0, NULL), *maxv = arg(args, 1, NULL);
        if (sep && sep->kind != VAL_STRING && sep->kind != VAL_NONE) return em_chat_err(in, offset, "split(): separator must be a string or none");
        if (maxv && maxv->kind != VAL_INT) return em_chat_err(in, offset, "split(): maxsplit must be an integer");
        int64_t maxsplit = maxv ? maxv->as.i : -1;
        r = em_chat_list_new(&in->arena, 0);
        if (!r) return em_chat_oom();
        const char *p = s->as.s.ptr, *end = p + s->as.s.len;
        if (!sep || sep->kind == VAL_NONE) {
            size_t a, e, k;
            trim_span(p, s->as.s.len, true, false, &a, &e);
            p += a;
            while (p < end) {
                if (maxsplit != -1 && (int64_t)r->as.list->n >= maxsplit) {
                    em_chat_list_push(&in->arena, r->as.list, em_chat_string_ref(&in->arena, p, (size_t)(end - p)));
                    break;
                }
                const char *q = p;
                while (q < end && !em_chat_space_len(q, (size_t)(end - q))) q++;
                em_chat_list_push(&in->arena, r->as.list, em_chat_string_ref(&in->arena, p, (size_t)(q - p)));
                p = q;
                while (p < end && (k = em_chat_space_len(p, (size_t)(end - p)))) p += k;
            }
        } else {
            if (sep->as.s.len == 0) return em_chat_err(in, offset, "split(): empty separator");
            while (1) {
                const char *hit = (maxsplit == -1 || (int64_t)r->as.list->n < maxsplit)
                                      ? find(p, (size_t)(end - p), sep->as.s.ptr, sep->as.s.len) : NULL;
                if (!hit) {
                    em_chat_list_push(&in->arena, r->as.list, em_chat_string_ref(&in->arena, p, (size_t)(end - p)));
                    break;
                }
                em_chat_list_push(&in->arena, r->as.list, em_chat_string_ref(&in->arena, p, (size_t)(hit - p)));
                p = hit + sep->as.s.len;
            }
        }
    } else if (!strcmp(name, "replace")) {
        em_chat_value *o = arg(args, 0, NULL), *nw = arg(args, 1, NULL), *cnt = arg(args, 2, "count");
        if (!o || !nw) return em_chat_err(in, offset, "replace() needs two arguments");
        if (o->kind != VAL_STRING || nw->kind != VAL_STRING) return em_chat_err(in, offset, "replace() arguments must be strings");
        if (cnt && cnt->kind != VAL_INT && cnt->kind != VAL_NONE) return em_chat_err(in, offset, "replace() count must be an integer");
        r = replace_all(in, s, o, nw, cnt && cnt->kind == VAL_INT ? cnt->as.i : -1);
    } else {
        return em_chat_err(in, offset, "unknown string method '%s'", name);
    }
    (void)caller;
    if (!r) return em_chat_oom();
    *out = r;
    return NULL;
}

static em_chat_value *pair(em_chat_interp *in, const em_chat_entry *e) {
    em_chat_value *p = em_chat_list_new(&in->arena, 2);
    em_chat_value *k = em_chat_string_ref(&in->arena, e->key, e->key_len);
    if (!p || !k) return NULL;
    em_chat_list_push(&in->arena, p->as.list, k);
    em_chat_list_push(&in->arena, p->as.list, e->value);
    return p;
}

static em_err dict_method(em_chat_interp *in, const em_chat_value *fn, em_chat_args *args, size_t offset,
                          em_chat_scope *caller, em_chat_value **out) {
    const char *name = fn->as.fn->name;
    const em_chat_dict *d = fn->as.fn->self->as.dict;
    (void)caller;
    if (!strcmp(name, "get")) {
        em_chat_value *k = arg(args, 0, NULL), *def = arg(args, 1, NULL);
        if (!k || k->kind != VAL_STRING) return em_chat_err(in, offset, "get(): the key must be a string");
        em_chat_value *v = em_chat_dict_get(d, k->as.s.ptr, k->as.s.len);
        *out = v ? v : def ? def : &em_chat_none;
        return NULL;
    }
    em_chat_value *r = em_chat_list_new(&in->arena, d->n);
    if (!r) return em_chat_oom();
    if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values")) {
        for (size_t i = 0; i < d->n; i++) {
            em_chat_value *e = name[0] == 'i' ? pair(in, &d->at[i])
                               : name[0] == 'k' ? em_chat_string_ref(&in->arena, d->at[i].key, d->at[i].key_len)
                                                : d->at[i].value;
            if (!e) return em_chat_oom();
            em_chat_list_push(&in->arena, r->as.list, e);
        }
        *out = r;
        return NULL;
    }
    if (!strcmp(name, "dictsort")) {
        em_chat_value *cs = arg(args, 0, "case_sensitive"), *by = arg(args, 1, "by"), *rev = arg(args, 2, "reverse");
        if ((cs && cs->kind != VAL_BOOL) || (rev && rev->kind != VAL_BOOL))
            return em_chat_err(in, offset, "dictsort(): case_sensitive and reverse must be booleans");
        if (by && (by->kind != VAL_STRING || (strcmp(by->as.s.ptr, "key") && strcmp(by->as.s.ptr, "value"))))
            return em_chat_err(in, offset, "dictsort(): 'by' must be 'key' or 'value'");
        for (size_t i = 0; i < d->n; i++) {
            em_chat_value *e = pair(in, &d->at[i]);
            if (!e) return em_chat_oom();
            em_chat_list_push(&in->arena, r->as.list, e);
        }
        sort_ctx c = {.case_sensitive = cs && cs->as.b, .reverse = rev && rev->as.b,
                      .attribute = by && !strcmp(by->as.s.ptr, "value") ? "1" : "0"};
        return sorted_list(in, r->as.list, &c, offset, out);
    }
    return em_chat_err(in, offset, "unknown dict method '%s'", name);
}

static em_chat_value *bound(em_chat_interp *in, em_chat_value *self, const char *name, em_chat_native call) {
    em_chat_value *v = em_chat_new(&in->arena, VAL_FUNCTION);
    if (!v || !(v->as.fn = em_chat_alloc(&in->arena, sizeof *v->as.fn))) return NULL;
    v->as.fn->name = name;
    v->as.fn->call = call;
    v->as.fn->self = self;
    return v;
}

em_chat_value *em_chat_builtin(em_chat_interp *in, em_chat_value *self, const char *name, size_t len) {
    static const char *string_methods[] = {"upper", "lower", "strip", "title", "capitalize", "rstrip", "lstrip",
                                           "startswith", "endswith", "split", "replace"};
    static const char *dict_methods[] = {"get", "items", "keys", "values", "dictsort"};
    char key[16];
    if (len >= sizeof key || memchr(name, 0, len)) return &em_chat_undefined;
    memcpy(key, name, len);
    key[len] = 0;
    if (self->kind == VAL_STRING) {
        if (!strcmp(key, "length")) return em_chat_int(&in->arena, utf16_length(self->as.s.ptr, self->as.s.len));
        for (size_t i = 0; i < sizeof string_methods / sizeof *string_methods; i++)
            if (!strcmp(key, string_methods[i])) return bound(in, self, string_methods[i], string_method);
    } else if (self->kind == VAL_LIST) {
        if (!strcmp(key, "length")) return em_chat_int(&in->arena, (int64_t)self->as.list->n);
    } else if (self->kind == VAL_DICT) {
        for (size_t i = 0; i < sizeof dict_methods / sizeof *dict_methods; i++)
            if (!strcmp(key, dict_methods[i])) return bound(in, self, dict_methods[i], dict_method);
    }
    return &em_chat_undefined;
}

/* ---- tests ---- */
static bool lower_or_upper(em_chat_interp *in, const em_chat_value *v, bool upper) {
    if (v->kind != VAL_STRING) return false;
    em_chat_value *m = case_map(in, v->as.s.ptr, v->as.s.len, upper, false);
    return m && em_chat_strict_equal(m, v);
}

em_err em_chat_run_test(em_chat_interp *in, const char *name, const em_chat_value *a, const em_chat_value *b,
                        size_t offset, bool *found, bool *result) {
    *found = true;
    em_chat_kind k = a->kind;
    if (!strcmp(name, "boolean")) *result = k == VAL_BOOL;
    else if (!strcmp(name, "callable")) *result = k == VAL_FUNCTION;
    else if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (k != VAL_INT) return em_chat_err(in, offset, "test '%s' needs an integer, not %s", name, em_chat_kind_name(a));
        *result = (a->as.i % 2 != 0) == (name[0] == 'o');
    } else if (!strcmp(name, "false")) *result = k == VAL_BOOL && !a->as.b;
    else if (!strcmp(name, "true")) *result = k == VAL_BOOL && a->as.b;
    else if (!strcmp(name, "none")) *result = k == VAL_NONE;
    else if (!strcmp(name, "string")) *result = k == VAL_STRING;
    else if (!strcmp(name, "number")) *result = k == VAL_INT || k == VAL_FLOAT;
    else if (!strcmp(name, "integer")) *result = k == VAL_INT || (k == VAL_FLOAT && a->is_big_int);
    else if (!strcmp(name, "iterable")) *result = (k == VAL_LIST && !a->is_tuple) || k == VAL_STRING;
    else if (!strcmp(name, "mapping")) *result = k == VAL_DICT;
    else if (!strcmp(name, "sequence")) *result = k == VAL_LIST || k == VAL_DICT || k == VAL_STRING;
    else if (!strcmp(name, "lower")) *result = lower_or_upper(in, a, false);
    else if (!strcmp(name, "upper")) *result = lower_or_upper(in, a, true);
    else if (!strcmp(name, "defined")) *result = k != VAL_UNDEFINED;
    else if (!strcmp(name, "undefined")) *result = k == VAL_UNDEFINED;
    else if (!strcmp(name, "equalto") || !strcmp(name, "eq")) {
        if (!b) return em_chat_err(in, offset, "test '%s' needs a value to compare with", name);
        *result = em_chat_strict_equal(a, b);
    } else *found = false;
    return NULL;
}

/* ---- filters ---- */
static em_err filter_call(em_chat_interp *in, em_chat_value *v, const char *name, size_t offset, em_chat_args *args,
                          em_chat_scope *scope, em_chat_value **out);
static em_err filter_tojson(em_chat_interp *in, em_chat_value *v, em_chat_args *args, size_t offset, em_chat_value **out) {
    em_chat_json_options o = {.undefined_as_null = true};
    em_chat_value *indent = arg(args, (size_t)-1, "indent"), *ascii = arg(args, (size_t)-1, "ensure_ascii");
    em_chat_value *sort = arg(args, (size_t)-1, "sort_keys"), *seps = arg(args, (size_t)-1, "separators");
    if (indent && indent->kind != VAL_INT && indent->kind != VAL_NONE) return em_chat_err(in, offset, "tojson: indent must be an integer");
    if (indent && indent->kind == VAL_INT) {
        if (indent->as.i < 0 || indent->as.i > 64) return em_chat_err(in, offset, "tojson: indent out of range");
        o.indent = (int)indent->as.i;
    }
    if (ascii && ascii->kind != VAL_BOOL) return em_chat_err(in, offset, "tojson: ensure_ascii must be a boolean");
    if (sort && sort->kind != VAL_BOOL) return em_chat_err(in, offset, "tojson: sort_keys must be a boolean");
    o.ensure_ascii = ascii && ascii->as.b;
    o.sort_keys = sort && sort->as.b;
    if (seps && seps->kind != VAL_NONE) {
        if (seps->kind != VAL_LIST || seps->as.list->n != 2 || seps->as.list->at[0]->kind != VAL_STRING ||
            seps->as.list->at[1]->kind != VAL_STRING)
            return em_chat_err(in, offset, "tojson: separators must be two strings");
        o.item_sep = em_chat_strdup(&in->arena, seps->as.list->at[0]->as.s.ptr, seps->as.list->at[0]->as.s.len);
        o.key_sep = em_chat_strdup(&in->arena, seps->as.list->at[1]->as.s.ptr, seps->as.list->at[1]->as.s.len);
        if (!o.item_sep || !o.key_sep) return em_chat_oom();
    }
    em_buf b = {0};
    em_err err = em_chat_to_json(&b, v, &o, 0);
    if (err) {
        free(b.data);
        em_err e2 = em_chat_err(in, offset, "%s", em_err_message(err));
        em_err_free(err);
        return e2;
    }
    return (*out = str_value(in, &b)) ? NULL : em_chat_oom();
}

/* join: the raw JavaScript values joined by sep. */
static em_err filter_join(em_chat_interp *in, em_chat_value *v, const char *sep, size_t sep_len, size_t offset,
                          em_chat_value **out) {
    em_buf b = {0};
    em_err err = NULL;
    if (v->kind == VAL_STRING) {
        for (size_t i = 0; i < v->as.s.len; i++) {
            if (i && ((unsigned char)v->as.s.ptr[i] & 0xc0) != 0x80) em_buf_append(&b, sep, sep_len);
            em_buf_putc(&b, v->as.s.ptr[i]);
        }
    } else {
        for (size_t i = 0; i < v->as.list->n && !err; i++) {
            if (i) em_buf_append(&b, sep, sep_len);
            err = em_chat_js_string(&b, v->as.list->at[i]);
        }
    }
    if (err) {
        free(b.data);
        em_err e2 = em_chat_err(in, offset, "join: %s", em_err_message(err));
        em_err_free(err);
        return e2;
    }
    return (*out = str_value(in, &b)) ? NULL : em_chat_oom();
}

/* parseInt(s, 10) / parseFloat(s); false when the string does not start with a number. */
static bool js_parse_number(const em_chat_value *s, bool integer, double *out) {
    size_t a, e;
    trim_span(s->as.s.ptr, s->as.s.len, true, false, &a, &e);
    char tmp[64];
    size_t n = e - a < sizeof tmp - 1 ? e - a : sizeof tmp - 1;
    memcpy(tmp, s->as.s.ptr + a, n);
    tmp[n] = 0;
    char *end;
    if (integer) {
        size_t i = (tmp[0] == '-' || tmp[0] == '+') ? 1 : 0;
        if (tmp[i] < '0' || tmp[i] > '9') return false;
        *out = (double)strtoll(tmp, &end, 10);
        return true;
    }
    if (!strncmp(tmp, "Infinity", 8) || !strncmp(tmp, "+Infinity", 9)) return *out = INFINITY, true;
    if (!strncmp(tmp, "-Infinity", 9)) return *out = -INFINITY, true;
    size_t i = (tmp[0] == '-' || tmp[0] == '+') ? 1 : 0;
    if (!((tmp[i] >= '0' && tmp[i] <= '9') || (tmp[i] == '.' && tmp[i + 1] >= '0' && tmp[i + 1] <= '9'))) return false;
    for (char *p = tmp; *p; p++)
        if (*p == 'x' || *p == 'X' || *p == 'n' || *p == 'N' || *p == 'p' || *p == 'P') *p = 0; /* no hex, nan, inf */
    *out = strtod(tmp, &end);
    return true;
}

static em_err filter_indent(em_chat_interp *in, em_chat_value *v, em_chat_args *args, size_t offset, em_chat_value **out) {
    em_chat_value *w = arg(args, 0, "width"), *first = arg(args, 1, "first"), *blank = arg(args, 2, "blank");
    if (w && w->kind != VAL_INT) return em_chat_err(in, offset, "indent: width must be an integer");
    int64_t width = w ? w->as.i : 4;
    if (width < 0 || width > 1024) return em_chat_err(in, offset, "indent: width out of range");
    bool f = first && em_chat_truthy(first), bl = blank && em_chat_truthy(blank);
    em_buf b = {0};
    const char *p = v->as.s.ptr, *end = p + v->as.s.len;
    for (size_t line = 0;; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (!((line == 0 && !f) || (le == p && !bl)))
            for (int64_t i = 0; i < width; i++) em_buf_putc(&b, ' ');
        em_buf_append(&b, p, (size_t)(le - p));
        if (!nl) break;
        em_buf_putc(&b, '\n');
        p = nl + 1;
    }
    return (*out = str_value(in, &b)) ? NULL : em_chat_oom();
}

static em_err filter_select(em_chat_interp *in, em_chat_value *v, const em_chat_node *call, em_chat_scope *scope,
                            bool select, em_chat_value **out) {
    const char *fname = select ? "selectattr" : "rejectattr";
    for (size_t i = 0; i < v->as.list->n; i++)
        if (v->as.list->at[i]->kind != VAL_DICT && v->as.list->at[i]->kind != VAL_NAMESPACE)
            return em_chat_err(in, call->offset, "%s applies to a list of objects only", fname);
    em_chat_value *a[3] = {0};
    for (size_t i = 0; i < call->list.n; i++)
        if (call->list.at[i]->kind != NODE_STRING) return em_chat_err(in, call->offset, "the arguments of %s must be string literals", fname);
    for (size_t i = 0; i < call->list.n && i < 3; i++) {
        em_err err = em_chat_eval(in, call->list.at[i], scope, &a[i]);
        if (err) return err;
    }
    if (!a[0]) return em_chat_err(in, call->offset, "%s needs an attribute name", fname);
    em_chat_value *r = em_chat_list_new(&in->arena, 0);
    if (!r) return em_chat_oom();
    for (size_t i = 0; i < v->as.list->n; i++) {
        em_chat_value *item = v->as.list->at[i];
        em_chat_value *x = em_chat_dict_get(item->as.dict, a[0]->as.s.ptr, a[0]->as.s.len);
        bool res = false;
        if (x && a[1]) {
            bool found;
            em_err err = em_chat_run_test(in, a[1]->as.s.ptr, x, a[2], call->offset, &found, &res);
            if (err) return err;
            if (!found) return em_chat_err(in, call->offset, "unknown test '%s'", a[1]->as.s.ptr);
        } else if (x) {
            res = em_chat_truthy(x);
        }
        if (res == select) em_chat_list_push(&in->arena, r->as.list, item);
    }
    *out = r;
    return NULL;
}

static em_err filter_map(em_chat_interp *in, em_chat_value *v, em_chat_args *args, size_t offset, em_chat_value **out) {
    em_chat_value *attr = args->kw ? em_chat_dict_get(args->kw, "attribute", 9) : NULL;
    em_chat_value *def = args->kw ? em_chat_dict_get(args->kw, "default", 7) : NULL;
    if (!attr) return em_chat_err(in, offset, "map without attribute= is not supported");
    if (attr->kind != VAL_STRING) return em_chat_err(in, offset, "map: attribute must be a string");
    char *path = em_chat_strdup(&in->arena, attr->as.s.ptr, attr->as.s.len);
    em_chat_value *r = em_chat_list_new(&in->arena, v->as.list->n);
    if (!path || !r) return em_chat_oom();
    for (size_t i = 0; i < v->as.list->n; i++) {
        em_chat_value *item = v->as.list->at[i];
        if (item->kind != VAL_DICT && item->kind != VAL_NAMESPACE) return em_chat_err(in, offset, "map: items must be objects");
        em_chat_value *x = attribute_path(item, path);
        em_chat_list_push(&in->arena, r->as.list, x->kind == VAL_UNDEFINED && def ? def : x);
    }
    *out = r;
    return NULL;
}

static em_err unknown_filter(em_chat_interp *in, const char *name, const em_chat_value *v, size_t offset) {
    return em_chat_err(in, offset, "unknown or unsupported filter '%s' for %s", name, em_chat_kind_name(v));
}

/* Filters written without arguments: `x | name`. */
static em_err plain_filter(em_chat_interp *in, em_chat_value *v, const char *name, size_t offset, em_chat_value **out) {
    em_chat_arena *a = &in->arena;
    em_chat_value *r = NULL;
    if (!strcmp(name, "safe")) {
        *out = v;
        return NULL;
    }
    if (!strcmp(name, "tojson")) {
        em_chat_args none = {0};
        return filter_tojson(in, v, &none, offset, out);
    }
    if (v->kind == VAL_LIST) {
        em_chat_list *l = v->as.list;
        if (!strcmp(name, "list")) r = v;
        else if (!strcmp(name, "first") || !strcmp(name, "last")) {
            if (!l->n) return em_chat_err(in, offset, "'%s' of an empty list", name);
            r = l->at[name[0] == 'f' ? 0 : l->n - 1];
        } else if (!strcmp(name, "length")) r = em_chat_int(a, (int64_t)l->n);
        else if (!strcmp(name, "reverse")) {
            if ((r = em_chat_list_new(a, l->n)))
                for (size_t i = l->n; i > 0; i--) em_chat_list_push(a, r->as.list, l->at[i - 1]);
        } else if (!strcmp(name, "sort")) {
            sort_ctx c = {0};
            return sorted_list(in, l, &c, offset, out);
        } else if (!strcmp(name, "join")) return filter_join(in, v, "", 0, offset, out);
        else if (!strcmp(name, "string")) {
            em_buf b = {0};
            em_chat_json_options o = {0};
            em_err err = em_chat_to_json(&b, v, &o, 0);
            if (err) {
                free(b.data);
                em_err_free(err);
                return em_chat_err(in, offset, "string: cannot convert this list");
            }
            r = str_value(in, &b);
        } else if (!strcmp(name, "unique")) {
            if ((r = em_chat_list_new(a, l->n)))
                for (size_t i = 0; i < l->n; i++) {
                    bool seen = false;
                    for (size_t j = 0; j < r->as.list->n && !seen; j++) seen = em_chat_strict_equal(r->as.list->at[j], l->at[i]);
                    if (!seen) em_chat_list_push(a, r->as.list, l->at[i]);
                }
        } else return unknown_filter(in, name, v, offset);
    } else if (v->kind == VAL_STRING) {
        if (!strcmp(name, "length")) r = em_chat_int(a, utf16_length(v->as.s.ptr, v->as.s.len));
        else if (!strcmp(name, "upper") || !strcmp(name, "lower")) r = case_map(in, v->as.s.ptr, v->as.s.len, name[0] == 'u', false);
        else if (!strcmp(name, "title")) r = title_case(in, v);
        else if (!strcmp(name, "capitalize")) r = case_map(in, v->as.s.ptr, v->as.s.len, true, true);
        else if (!strcmp(name, "trim")) r = trimmed(in, v, true, true);
        else if (!strcmp(name, "indent")) {
            em_chat_args none = {0};
            return filter_indent(in, v, &none, offset, out);
        } else if (!strcmp(name, "join") || !strcmp(name, "string")) r = v;
        else if (!strcmp(name, "int") || !strcmp(name, "float")) {
            double d;
            if (!js_parse_number(v, name[0] == 'i', &d)) d = 0;
            r = name[0] == 'i' ? em_chat_int(a, (int64_t)d) : em_chat_float(a, d);
        } else return unknown_filter(in, name, v, offset);
    } else if (em_chat_is_number(v)) {
        double d = em_chat_number(v);
        if (!strcmp(name, "abs")) r = v->kind == VAL_INT ? em_chat_int(a, v->as.i < 0 ? -v->as.i : v->as.i) : em_chat_float(a, fabs(d));
        else if (!strcmp(name, "int")) r = em_chat_int(a, (int64_t)floor(d));
        else if (!strcmp(name, "float")) r = em_chat_float(a, d);
        else if (!strcmp(name, "string")) {
            em_buf b = {0};
            em_chat_render_value(&b, v);
            r = str_value(in, &b);
        } else return unknown_filter(in, name, v, offset);
    } else if (v->kind == VAL_DICT) {
        if (!strcmp(name, "length")) r = em_chat_int(a, (int64_t)v->as.dict->n);
        else {
            em_chat_value *m = em_chat_builtin(in, v, name, strlen(name));
            if (m->kind == VAL_UNDEFINED) return unknown_filter(in, name, v, offset);
            em_chat_args none = {0};
            return m->as.fn->call(in, m, &none, offset, NULL, out);
        }
    } else if (v->kind == VAL_BOOL) {
        if (!strcmp(name, "bool")) r = v;
        else if (!strcmp(name, "int")) r = em_chat_int(a, v->as.b);
        else if (!strcmp(name, "float")) r = em_chat_float(a, v->as.b);
        else if (!strcmp(name, "string")) r = em_chat_string_ref(a, v->as.b ? "true" : "false", v->as.b ? 4 : 5);
        else return unknown_filter(in, name, v, offset);
    } else {
        return em_chat_err(in, offset, "cannot apply filter '%s' to %s", name, em_chat_kind_name(v));
    }
    if (!r) return em_chat_oom();
    *out = r;
    return NULL;
}

em_err em_chat_apply_filter(em_chat_interp *in, em_chat_value *v, const em_chat_node *f, em_chat_scope *scope,
                            em_chat_value **out) {
    if (f->kind == NODE_IDENT) return plain_filter(in, v, f->str, f->offset, out);
    if (f->kind != NODE_CALL || f->a->kind != NODE_IDENT) return em_chat_err(in, f->offset, "unsupported filter expression");
    const char *name = f->a->str;
    size_t offset = f->a->offset;
    em_chat_args args;
    em_err err;
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr")) {
        if (v->kind != VAL_LIST) return unknown_filter(in, name, v, offset);
        return filter_select(in, v, f, scope, name[0] == 's', out);
    }
    if ((err = em_chat_eval_args(in, &f->list, scope, &args))) return err;
    return filter_call(in, v, name, offset, &args, scope, out);
}

/* `map('filter', args...)`: Jinja applies the filter to each item. The reference only knows
 * map(attribute=...) and rejects this form, so here Jinja's meaning applies. */
static em_err map_filter(em_chat_interp *in, em_chat_value *v, size_t offset, em_chat_args *args, em_chat_scope *scope,
                         em_chat_value **out) {
    if (args->pos[0]->kind != VAL_STRING) return em_chat_err(in, offset, "map: the filter name must be a string");
    const char *fname = em_chat_strdup(&in->arena, args->pos[0]->as.s.ptr, args->pos[0]->as.s.len);
    em_chat_value *r = em_chat_list_new(&in->arena, v->as.list->n);
    if (!fname || !r) return em_chat_oom();
    if (!strcmp(fname, "map") || !strcmp(fname, "selectattr") || !strcmp(fname, "rejectattr"))
        return em_chat_err(in, offset, "map: filter '%s' cannot be mapped", fname);
    em_chat_args rest = {.pos = args->pos + 1, .n_pos = args->n_pos - 1, .kw = args->kw};
    bool plain = rest.n_pos == 0 && !rest.kw;
    for (size_t i = 0; i < v->as.list->n; i++) {
        em_chat_value *e;
        em_err err = plain ? plain_filter(in, v->as.list->at[i], fname, offset, &e)
                           : filter_call(in, v->as.list->at[i], fname, offset, &rest, scope, &e);
        if (err) return err;
        em_chat_list_push(&in->arena, r->as.list, e);
    }
    *out = r;
    return NULL;
}

/* A filter written with arguments, `x | name(args)`, the arguments already evaluated. */
static em_err filter_call(em_chat_interp *in, em_chat_value *v, const char *name, size_t offset, em_chat_args *args_in,
                          em_chat_scope *scope, em_chat_value **out) {
    em_chat_args args = *args_in;
    if (!strcmp(name, "tojson")) return filter_tojson(in, v, &args, offset, out);
    if (!strcmp(name, "join")) {
        if (v->kind != VAL_STRING && v->kind != VAL_LIST) return em_chat_err(in, offset, "cannot apply filter 'join' to %s", em_chat_kind_name(v));
        em_chat_value *sep = arg(&args, 0, "separator");
        if (sep && sep->kind != VAL_STRING) return em_chat_err(in, offset, "join: separator must be a string");
        return filter_join(in, v, sep ? sep->as.s.ptr : "", sep ? sep->as.s.len : 0, offset, out);
    }
    if (!strcmp(name, "int") || !strcmp(name, "float")) {
        bool integer = name[0] == 'i';
        em_chat_value *def = arg(&args, 0, "default");
        if (v->kind == VAL_STRING) {
            double d;
            if (!js_parse_number(v, integer, &d)) *out = def ? def : integer ? em_chat_int(&in->arena, 0) : em_chat_float(&in->arena, 0);
            else *out = integer ? em_chat_int(&in->arena, (int64_t)d) : em_chat_float(&in->arena, d);
        } else if (em_chat_is_number(v)) {
            *out = v;
        } else if (v->kind == VAL_BOOL) {
            *out = integer ? em_chat_int(&in->arena, v->as.b) : em_chat_float(&in->arena, v->as.b);
        } else {
            return em_chat_err(in, offset, "cannot apply filter '%s' to %s", name, em_chat_kind_name(v));
        }
        return *out ? NULL : em_chat_oom();
    }
    if (!strcmp(name, "default")) {
        em_chat_value *def = arg(&args, 0, NULL), *boolean = arg(&args, 1, "boolean");
        if (boolean && boolean->kind != VAL_BOOL) return em_chat_err(in, offset, "default: the flag must be a boolean");
        bool use = v->kind == VAL_UNDEFINED || (boolean && boolean->as.b && !em_chat_truthy(v));
        *out = use ? (def ? def : em_chat_string_ref(&in->arena, "", 0)) : v;
        return *out ? NULL : em_chat_oom();
    }
    if (v->kind == VAL_LIST) {
        if (!strcmp(name, "sort")) {
            em_chat_value *rev = arg(&args, 0, "reverse"), *cs = arg(&args, 1, "case_sensitive"), *at = arg(&args, 2, "attribute");
            if ((rev && rev->kind != VAL_BOOL) || (cs && cs->kind != VAL_BOOL))
                return em_chat_err(in, offset, "sort: reverse and case_sensitive must be booleans");
            sort_ctx c = {.reverse = rev && rev->as.b, .case_sensitive = cs && cs->as.b};
            char num[24];
            if (at && at->kind == VAL_STRING) {
                if (!(c.attribute = em_chat_strdup(&in->arena, at->as.s.ptr, at->as.s.len))) return em_chat_oom();
            } else if (at && at->kind == VAL_INT) {
                snprintf(num, sizeof num, "%lld", (long long)at->as.i);
                c.attribute = num;
            } else if (at && at->kind != VAL_NONE) {
                return em_chat_err(in, offset, "sort: attribute must be a string or integer");
            }
            return sorted_list(in, v->as.list, &c, offset, out);
        }
        if (!strcmp(name, "map")) {
            bool by_attribute = args.kw && em_chat_dict_get(args.kw, "attribute", 9);
            if (!by_attribute && args.n_pos > 0) return map_filter(in, v, offset, &args, scope, out);
            return filter_map(in, v, &args, offset, out);
        }
    } else if (v->kind == VAL_STRING) {
        if (!strcmp(name, "indent")) return filter_indent(in, v, &args, offset, out);
        if (!strcmp(name, "replace")) {
            em_chat_value *m = em_chat_builtin(in, v, "replace", 7);
            return m->as.fn->call(in, m, &args, offset, scope, out);
        }
    } else if (v->kind == VAL_DICT) {
        em_chat_value *m = em_chat_builtin(in, v, name, strlen(name));
        if (m->kind == VAL_FUNCTION) return m->as.fn->call(in, m, &args, offset, scope, out);
    } else {
        return em_chat_err(in, offset, "cannot apply filter '%s' to %s", name, em_chat_kind_name(v));
    }
    return unknown_filter(in, name, v, offset);
}
