/*
 * The evaluator: walks the syntax tree and writes the output.
 *
 * Scoping follows the reference renderer (@huggingface/jinja), which differs from Python Jinja2
 * in ways templates notice: a `for` loop gets one scope for all its iterations (a `set` inside
 * the loop is visible in later iterations but not after the loop), `if` blocks get none, and a
 * macro's scope hangs below the scope that *calls* it. Statements write straight into the
 * output buffer; `break` and `continue` set a flag that unwinds to the loop, which cuts the
 * output back to where the iteration began (the reference drops a broken-off iteration's text).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Evaluation nesting (deep expressions, nested blocks, macro recursion, which a template may drive
 * by the depth of a request's data, a tool schema say): 128 fits a 256 KiB thread stack under
 * AddressSanitizer, with the parser's bound (tests/test_chat.c renders on 512 KiB). */
#define MAX_DEPTH 128

em_err em_chat_oom(void) {
    return em_errorf(EM_ERR_NOMEM, "out of memory rendering a chat template (or past the render's byte limit)");
}

em_err em_chat_err(em_chat_interp *in, size_t offset, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return em_chat_error_at(&in->tpl->src, offset, EM_ERR_INVALID, "%s", msg);
}

/* Re-issues an error from a position-free helper with the line and column of `offset`. */
static em_err wrap(em_chat_interp *in, size_t offset, em_err err) {
    em_err positioned = em_chat_error_at(&in->tpl->src, offset, em_err_code_of(err), "%s", em_err_message(err));
    em_err_free(err);
    return positioned;
}

em_chat_scope *em_chat_scope_new(em_chat_interp *in, em_chat_scope *parent) {
    em_chat_scope *s = em_chat_alloc(&in->arena, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

bool em_chat_scope_set(em_chat_interp *in, em_chat_scope *s, const char *name, size_t len, em_chat_value *v) {
    return em_chat_dict_set(&in->arena, &s->vars, name, len, v);
}

em_chat_value *em_chat_scope_lookup(em_chat_scope *s, const char *name, size_t len) {
    for (; s; s = s->parent) {
        em_chat_value *v = em_chat_dict_get(&s->vars, name, len);
        if (v) return v;
    }
    return &em_chat_undefined;
}

/* ---- arguments ---- */
em_err em_chat_eval_args(em_chat_interp *in, const em_chat_nodes *args, em_chat_scope *scope, em_chat_args *out) {
    *out = (em_chat_args){0};
    em_chat_value *pos = em_chat_list_new(&in->arena, args->n);
    if (!pos) return em_chat_oom();
    for (size_t i = 0; i < args->n; i++) {
        const em_chat_node *a = args->at[i];
        if (a->kind == NODE_KWARG || a->kind == NODE_KWSPREAD) continue;
        em_chat_value *v;
        em_err err = em_chat_eval(in, a->kind == NODE_SPREAD ? a->a : a, scope, &v);
        if (err) return err;
        if (a->kind == NODE_SPREAD) {
            if (v->kind != VAL_LIST) return em_chat_err(in, a->offset, "cannot unpack %s with '*'", em_chat_kind_name(v));
            for (size_t k = 0; k < v->as.list->n; k++)
                if (!em_chat_list_push(&in->arena, pos->as.list, v->as.list->at[k])) return em_chat_oom();
        } else if (!em_chat_list_push(&in->arena, pos->as.list, v)) {
            return em_chat_oom();
        }
    }
    out->pos = pos->as.list->at;
    out->n_pos = pos->as.list->n;
    for (size_t i = 0; i < args->n; i++) {
        const em_chat_node *a = args->at[i];
        if (a->kind != NODE_KWARG && a->kind != NODE_KWSPREAD) continue;
        em_chat_value *v;
        em_err err = em_chat_eval(in, a->a, scope, &v);
        if (err) return err;
        if (!out->kw) {
            out->kw = em_chat_alloc(&in->arena, sizeof *out->kw);
            if (!out->kw) return em_chat_oom();
        }
        if (a->kind == NODE_KWARG) {
            if (em_chat_dict_get(out->kw, a->str, a->len))
                return em_chat_err(in, a->offset, "keyword argument '%s' given twice", a->str);
            if (!em_chat_dict_set(&in->arena, out->kw, a->str, a->len, v)) return em_chat_oom();
            continue;
        }
        if (v->kind != VAL_DICT) return em_chat_err(in, a->offset, "'**' needs a mapping, not %s", em_chat_kind_name(v));
        for (size_t k = 0; k < v->as.dict->n; k++) {
            em_chat_entry *e = &v->as.dict->at[k];
            if (em_chat_dict_get(out->kw, e->key, e->key_len))
                return em_chat_err(in, a->offset, "keyword argument '%s' given twice", e->key);
            if (!em_chat_dict_set(&in->arena, out->kw, e->key, e->key_len, e->value)) return em_chat_oom();
        }
    }
    return NULL;
}

/* ---- macros ---- */
static bool reads_name(const em_chat_node *n, const char *name) {
    if (!n) return false;
    if (n->kind == NODE_IDENT && !strcmp(n->str, name)) return true;
    if (reads_name(n->a, name) || reads_name(n->b, name) || reads_name(n->c, name)) return true;
    for (size_t i = 0; i < n->list.n; i++)
        if (reads_name(n->list.at[i], name)) return true;
    for (size_t i = 0; i < n->list2.n; i++)
        if (reads_name(n->list2.at[i], name)) return true;
    return false;
}

static bool body_reads(const em_chat_nodes *body, const char *name) {
    for (size_t i = 0; i < body->n; i++)
        if (reads_name(body->at[i], name)) return true;
    return false;
}

/* Binds call arguments to a macro's (or caller block's) parameters in `scope`. */
static em_err bind_params(em_chat_interp *in, const em_chat_function *fn, const em_chat_nodes *params,
                          em_chat_args *args, em_chat_scope *scope, size_t offset) {
    em_chat_dict *kw = em_chat_alloc(&in->arena, sizeof *kw);
    if (!kw) return em_chat_oom();
    if (args->kw)
        for (size_t i = 0; i < args->kw->n; i++)
            if (!em_chat_dict_set(&in->arena, kw, args->kw->at[i].key, args->kw->at[i].key_len, args->kw->at[i].value))
                return em_chat_oom();
    for (size_t i = 0; i < params->n; i++) {
        const em_chat_node *p = params->at[i];
        em_chat_value *v = i < args->n_pos ? args->pos[i] : NULL;
        if (!v && (v = em_chat_dict_get(kw, p->str, p->len))) em_chat_dict_remove(kw, p->str, p->len);
        if (!em_chat_scope_set(in, scope, p->str, p->len, v ? v : &em_chat_undefined)) return em_chat_oom();
    }
    if (fn->kwargs) {
        em_chat_value *d = em_chat_dict_new(&in->arena, VAL_DICT);
        if (!d) return em_chat_oom();
        d->as.dict = kw;
        if (!em_chat_scope_set(in, scope, "kwargs", 6, d)) return em_chat_oom();
    } else if (kw->n) {
        return em_chat_err(in, offset, "macro '%s' takes no keyword argument '%s'", fn->name, kw->at[0].key);
    }
    if (fn->varargs) {
        em_chat_value *l = em_chat_list_new(&in->arena, 0);
        if (!l) return em_chat_oom();
        for (size_t i = params->n; i < args->n_pos; i++)
            if (!em_chat_list_push(&in->arena, l->as.list, args->pos[i])) return em_chat_oom();
        if (!em_chat_scope_set(in, scope, "varargs", 7, l)) return em_chat_oom();
    } else if (args->n_pos > params->n) {
        return em_chat_err(in, offset, "macro '%s' takes at most %zu argument(s), got %zu", fn->name, params->n, args->n_pos);
    }
    for (size_t i = 0; i < params->n; i++) {
        const em_chat_node *p = params->at[i];
        bool given = i < args->n_pos || (args->kw && em_chat_dict_get(args->kw, p->str, p->len));
        if (given || p->kind != NODE_KWARG) continue;
        em_chat_value *v;
        em_err err = em_chat_eval(in, p->a, scope, &v);
        if (err) return err;
        if (!em_chat_scope_set(in, scope, p->str, p->len, v)) return em_chat_oom();
    }
    return NULL;
}

static em_err render_body(em_chat_interp *in, const em_chat_nodes *body, em_chat_scope *scope, size_t offset,
                          em_chat_value **out) {
    em_buf b = {0};
    em_err err = em_chat_eval_block(in, body, scope, &b);
    if (!err && in->control) err = em_chat_err(in, offset, "'break' or 'continue' outside a loop");
    if (!err && b.failed) err = em_chat_oom();
    if (!err && !(*out = em_chat_string(&in->arena, b.data, b.len))) err = em_chat_oom();
    free(b.data);
    return err;
}

static em_err call_macro(em_chat_interp *in, const em_chat_value *fv, em_chat_args *args, size_t offset,
                         em_chat_scope *caller, em_chat_value **out) {
    const em_chat_function *fn = fv->as.fn;
    const em_chat_node *n = fn->node;
    bool is_caller = n->kind == NODE_CALL_BLOCK;
    /* A macro runs below its caller's scope; a caller block below the scope of its call. */
    em_chat_scope *scope = em_chat_scope_new(in, is_caller ? fn->scope : caller);
    if (!scope) return em_chat_oom();
    if (++in->depth > MAX_DEPTH) return em_chat_err(in, offset, "macro calls nested too deeply");
    em_err err = bind_params(in, fn, &n->list, args, scope, offset);
    if (!err) err = render_body(in, &n->list2, scope, n->offset, out);
    in->depth--;
    return err;
}

static em_chat_value *function_value(em_chat_interp *in, const char *name, const em_chat_node *node, em_chat_scope *scope) {
    em_chat_value *v = em_chat_new(&in->arena, VAL_FUNCTION);
    if (!v || !(v->as.fn = em_chat_alloc(&in->arena, sizeof *v->as.fn))) return NULL;
    v->as.fn->name = name;
    v->as.fn->call = call_macro;
    v->as.fn->node = node;
    v->as.fn->scope = scope;
    v->as.fn->varargs = body_reads(&node->list2, "varargs");
    v->as.fn->kwargs = body_reads(&node->list2, "kwargs");
    return v;
}

/* ---- expressions ---- */
static em_err make_number(em_chat_interp *in, double r, bool is_float, size_t offset, em_chat_value **out) {
    /* The reference's integers are JavaScript numbers: 0 // 0 is an "integer" NaN. It prints and
     * serializes as a float NaN or Infinity does, so a float stands in for it. */
    if (is_float || !isfinite(r)) {
        *out = em_chat_float(&in->arena, r);
    } else {
        if (fabs(r) >= 9.2e18) {
            if ((*out = em_chat_float(&in->arena, r))) (*out)->is_big_int = true;
            return *out ? NULL : em_chat_oom();
        }
        *out = em_chat_int(&in->arena, (int64_t)r);
    }
    return *out ? NULL : em_chat_oom();
}

static em_err concat(em_chat_interp *in, const em_chat_value *l, const em_chat_value *r, size_t offset, em_chat_value **out) {
    em_buf b = {0};
    em_err err = em_chat_js_string(&b, l);
    if (!err) err = em_chat_js_string(&b, r);
    if (err) err = wrap(in, offset, err);
    if (!err && b.failed) err = em_chat_oom();
    if (!err && !(*out = em_chat_string(&in->arena, b.data, b.len))) err = em_chat_oom();
    free(b.data);
    return err;
}

static bool is_numeric_like(const em_chat_value *v) { return em_chat_is_number(v) || v->kind == VAL_BOOL; }

static em_err eval_binary(em_chat_interp *in, const em_chat_node *n, em_chat_scope *scope, em_chat_value **out) {
    const char *op = n->str;
    em_chat_value *l, *r;
    em_err err = em_chat_eval(in, n->a, scope, &l);
    if (err) return err;
    if (!strcmp(op, "and") || !strcmp(op, "or")) {
        bool t = em_chat_truthy(l);
        if ((op[0] == 'a') != t) {
            *out = l;
            return NULL;
        }
        return em_chat_eval(in, n->b, scope, out);
    }
    if ((err = em_chat_eval(in, n->b, scope, &r))) return err;
    if (!strcmp(op, "==") || !strcmp(op, "!=")) {
        *out = em_chat_bool(em_chat_loose_equal(l, r) == (op[0] == '='));
        return NULL;
    }
    bool is_in = !strcmp(op, "in"), not_in = !strcmp(op, "not in");
    if (l->kind == VAL_UNDEFINED || r->kind == VAL_UNDEFINED) {
        if (r->kind == VAL_UNDEFINED && (is_in || not_in)) {
            *out = em_chat_bool(not_in);
            return NULL;
        }
        return em_chat_err(in, n->offset, "cannot apply '%s' to an undefined value", op);
    }
    if (l->kind == VAL_NONE || r->kind == VAL_NONE) return em_chat_err(in, n->offset, "cannot apply '%s' to none", op);
    if (!strcmp(op, "~")) return concat(in, l, r, n->offset, out);
    if (!strcmp(op, "**") && is_numeric_like(l) && is_numeric_like(r)) {
        double a = em_chat_number(l), b = em_chat_number(r);
        if (a == 0 && b < 0) return em_chat_err(in, n->offset, "0 cannot be raised to a negative power");
        double res = pow(a, b);
        if (!isfinite(res)) return em_chat_err(in, n->offset, "'**' result is not a finite number");
        return make_number(in, res, l->kind == VAL_FLOAT || r->kind == VAL_FLOAT || b < 0, n->offset, out);
    }
    if (em_chat_is_number(l) && em_chat_is_number(r)) {
        double a = em_chat_number(l), b = em_chat_number(r);
        bool fl = (l->kind == VAL_FLOAT && !l->is_big_int) || (r->kind == VAL_FLOAT && !r->is_big_int);
        if (!strcmp(op, "+")) return make_number(in, a + b, fl, n->offset, out);
        if (!strcmp(op, "-")) return make_number(in, a - b, fl, n->offset, out);
        if (!strcmp(op, "*")) return make_number(in, a * b, fl, n->offset, out);
        if (!strcmp(op, "/")) return make_number(in, a / b, true, n->offset, out);
        if (!strcmp(op, "//")) return make_number(in, floor(a / b), fl, n->offset, out);
        if (!strcmp(op, "%")) return make_number(in, fmod(a, b), fl, n->offset, out);
        bool res;
        if (!strcmp(op, "<")) res = a < b;
        else if (!strcmp(op, ">")) res = a > b;
        else if (!strcmp(op, "<=")) res = a <= b;
        else if (!strcmp(op, ">=")) res = a >= b;
        else return em_chat_err(in, n->offset, "operator '%s' does not apply to numbers", op);
        *out = em_chat_bool(res);
        return NULL;
    }
    if (l->kind == VAL_LIST && r->kind == VAL_LIST) {
        if (!strcmp(op, "+")) {
            em_chat_value *v = em_chat_list_new(&in->arena, l->as.list->n + r->as.list->n);
            if (!v) return em_chat_oom();
            for (size_t i = 0; i < l->as.list->n; i++) em_chat_list_push(&in->arena, v->as.list, l->as.list->at[i]);
            for (size_t i = 0; i < r->as.list->n; i++) em_chat_list_push(&in->arena, v->as.list, r->as.list->at[i]);
            *out = v;
            return NULL;
        }
    } else if (r->kind == VAL_LIST && (is_in || not_in)) {
        bool member = false;
        for (size_t i = 0; i < r->as.list->n && !member; i++) member = em_chat_strict_equal(r->as.list->at[i], l);
        *out = em_chat_bool(member != not_in);
        return NULL;
    }
    if ((l->kind == VAL_STRING || r->kind == VAL_STRING) && !strcmp(op, "+")) return concat(in, l, r, n->offset, out);
    if (l->kind == VAL_STRING && r->kind == VAL_STRING && (is_in || not_in)) {
        bool found = l->as.s.len == 0 || memmem(r->as.s.ptr, r->as.s.len, l->as.s.ptr, l->as.s.len) != NULL;
        *out = em_chat_bool(found != not_in);
        return NULL;
    }
    if (l->kind == VAL_STRING && r->kind == VAL_DICT && (is_in || not_in)) {
        bool found = em_chat_dict_get(r->as.dict, l->as.s.ptr, l->as.s.len) != NULL;
        *out = em_chat_bool(found != not_in);
        return NULL;
    }
    return em_chat_err(in, n->offset, "operator '%s' does not apply to %s and %s", op, em_chat_kind_name(l),
                       em_chat_kind_name(r));
}

/* Python-style slice bounds, as the reference computes them. */
static size_t slice_indices(int64_t len, const em_chat_value *start, const em_chat_value *stop, int64_t step,
                            int64_t *idx, size_t max) {
    int64_t s, e;
    if (step > 0) {
        s = start ? start->as.i : 0;
        s = s < 0 ? (len + s > 0 ? len + s : 0) : (s < len ? s : len);
        e = stop ? stop->as.i : len;
        e = e < 0 ? (len + e > 0 ? len + e : 0) : (e < len ? e : len);
    } else {
        s = start ? start->as.i : len - 1;
        s = s < 0 ? (len + s > -1 ? len + s : -1) : (s < len - 1 ? s : len - 1);
        e = stop ? stop->as.i : -1;
        e = e < -1 ? (len + e > -1 ? len + e : -1) : (e < len - 1 ? e : len - 1);
    }
    size_t n = 0;
    for (int64_t i = s; step > 0 ? i < e : i > e; i += step)
        if (n < max) idx[n++] = i;
    return n;
}

static em_err eval_slice(em_chat_interp *in, em_chat_value *obj, const em_chat_node *s, em_chat_scope *scope,
                         em_chat_value **out) {
    if (obj->kind != VAL_LIST && obj->kind != VAL_STRING)
        return em_chat_err(in, s->offset, "cannot slice %s", em_chat_kind_name(obj));
    em_chat_value *part[3] = {0};
    const em_chat_node *nodes[3] = {s->a, s->b, s->c};
    for (int i = 0; i < 3; i++) {
        if (!nodes[i]) continue;
        em_err err = em_chat_eval(in, nodes[i], scope, &part[i]);
        if (err) return err;
        if (part[i]->kind == VAL_UNDEFINED) part[i] = NULL;
        else if (part[i]->kind != VAL_INT) return em_chat_err(in, s->offset, "slice bounds must be integers");
    }
    int64_t step = part[2] ? part[2]->as.i : 1;
    if (step == 0) return em_chat_err(in, s->offset, "slice step cannot be zero");
    /* Strings slice by code point (the reference slices Array.from(string)). */
    size_t len = 0;
    size_t *starts = NULL;
    if (obj->kind == VAL_STRING) {
        starts = malloc((obj->as.s.len + 1) * sizeof *starts);
        if (!starts) return em_chat_oom();
        for (size_t i = 0; i < obj->as.s.len; i++)
            if (((unsigned char)obj->as.s.ptr[i] & 0xc0) != 0x80) starts[len++] = i;
        starts[len] = obj->as.s.len;
    } else {
        len = obj->as.list->n;
    }
    int64_t *idx = malloc((len + 1) * sizeof *idx);
    if (!idx) {
        free(starts);
        return em_chat_oom();
    }
    size_t n = slice_indices((int64_t)len, part[0], part[1], step, idx, len + 1);
    em_err err = NULL;
    if (obj->kind == VAL_LIST) {
        em_chat_value *v = em_chat_list_new(&in->arena, n);
        for (size_t i = 0; v && i < n; i++) em_chat_list_push(&in->arena, v->as.list, obj->as.list->at[idx[i]]);
        if (!v) err = em_chat_oom();
        *out = v;
    } else {
        em_buf b = {0};
        for (size_t i = 0; i < n; i++)
            em_buf_append(&b, obj->as.s.ptr + starts[idx[i]], starts[idx[i] + 1] - starts[idx[i]]);
        if (b.failed || !(*out = em_chat_string(&in->arena, b.data, b.len))) err = em_chat_oom();
        free(b.data);
    }
    free(idx);
    free(starts);
    return err;
}

/* s.at(i) on a JavaScript string: indexes UTF-16 code units. */
static em_chat_value *string_at(em_chat_interp *in, const em_chat_value *s, int64_t index) {
    int64_t units = 0;
    const char *p = s->as.s.ptr;
    size_t n = s->as.s.len;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t k = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
        units += k == 4 ? 2 : 1;
        i += k;
    }
    if (index < 0) index += units;
    if (index < 0 || index >= units) return &em_chat_undefined;
    int64_t u = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t k = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
        if (k > n - i) k = n - i;
        int64_t w = k == 4 ? 2 : 1;
        if (index < u + w) {
            /* Half of a surrogate pair prints as U+FFFD. */
            if (w == 2) return em_chat_string(&in->arena, "\xef\xbf\xbd", 3);
            return em_chat_string(&in->arena, p + i, k);
        }
        u += w;
        i += k;
    }
    return &em_chat_undefined;
}

static em_err eval_member(em_chat_interp *in, const em_chat_node *n, em_chat_scope *scope, em_chat_value **out) {
    em_chat_value *obj, *prop;
    em_err err = em_chat_eval(in, n->a, scope, &obj);
    if (err) return err;
    if (n->flag && n->b->kind == NODE_SLICE) return eval_slice(in, obj, n->b, scope, out);
    if (n->flag) {
        if ((err = em_chat_eval(in, n->b, scope, &prop))) return err;
    } else if (n->b->kind == NODE_INT) {
        if (!(prop = em_chat_int(&in->arena, n->b->ival))) return em_chat_oom();
    } else if (!(prop = em_chat_string_ref(&in->arena, n->b->str, n->b->len))) {
        return em_chat_oom();
    }
    em_chat_value *v = NULL;
    if (obj->kind == VAL_DICT || obj->kind == VAL_NAMESPACE) {
        if (prop->kind != VAL_STRING)
            return em_chat_err(in, n->offset, "cannot look up a %s key in a %s", em_chat_kind_name(prop), em_chat_kind_name(obj));
        v = em_chat_dict_get(obj->as.dict, prop->as.s.ptr, prop->as.s.len);
        if (!v && obj->kind == VAL_DICT) v = em_chat_builtin(in, obj, prop->as.s.ptr, prop->as.s.len);
    } else if (obj->kind == VAL_LIST || obj->kind == VAL_STRING) {
        if (prop->kind == VAL_INT) {
            if (obj->kind == VAL_STRING) {
                v = string_at(in, obj, prop->as.i);
            } else {
                int64_t i = prop->as.i < 0 ? prop->as.i + (int64_t)obj->as.list->n : prop->as.i;
                v = i >= 0 && i < (int64_t)obj->as.list->n ? obj->as.list->at[i] : &em_chat_undefined;
            }
        } else if (prop->kind == VAL_STRING) {
            v = em_chat_builtin(in, obj, prop->as.s.ptr, prop->as.s.len);
        } else {
            return em_chat_err(in, n->offset, "cannot index a %s with a %s", em_chat_kind_name(obj), em_chat_kind_name(prop));
        }
    } else if (prop->kind != VAL_STRING) {
        return em_chat_err(in, n->offset, "cannot index a %s with a %s", em_chat_kind_name(obj), em_chat_kind_name(prop));
    }
    *out = v ? v : &em_chat_undefined;
    return NULL;
}

static em_err eval_call(em_chat_interp *in, const em_chat_node *n, em_chat_scope *scope, em_chat_value **out) {
    em_chat_args args;
    em_err err = em_chat_eval_args(in, &n->list, scope, &args);
    em_chat_value *fn;
    if (!err) err = em_chat_eval(in, n->a, scope, &fn);
    if (err) return err;
    if (fn->kind != VAL_FUNCTION) {
        if (n->a->kind == NODE_IDENT) return em_chat_err(in, n->offset, "'%s' is %s, not a function", n->a->str, em_chat_kind_name(fn));
        return em_chat_err(in, n->offset, "cannot call %s", em_chat_kind_name(fn));
    }
    return fn->as.fn->call(in, fn, &args, n->offset, scope, out);
}

static em_err eval_literal_list(em_chat_interp *in, const em_chat_node *n, em_chat_scope *scope, em_chat_value **out) {
    em_chat_value *v = em_chat_list_new(&in->arena, n->list.n);
    if (!v) return em_chat_oom();
    v->is_tuple = n->kind == NODE_TUPLE;
    for (size_t i = 0; i < n->list.n; i++) {
        em_chat_value *e;
        em_err err = em_chat_eval(in, n->list.at[i], scope, &e);
        if (err) return err;
        em_chat_list_push(&in->arena, v->as.list, e);
    }
    *out = v;
    return NULL;
}

static em_err eval_object(em_chat_interp *in, const em_chat_node *n, em_chat_scope *scope, em_chat_value **out) {
    em_chat_value *v = em_chat_dict_new(&in->arena, VAL_DICT);
    if (!v) return em_chat_oom();
    for (size_t i = 0; i < n->list.n; i++) {
        em_chat_value *k, *e;
        em_err err = em_chat_eval(in, n->list.at[i], scope, &k);
        if (err) return err;
        if (k->kind != VAL_STRING) return em_chat_err(in, n->list.at[i]->offset, "dict keys must be strings, not %s", em_chat_kind_name(k));
        if ((err = em_chat_eval(in, n->list2.at[i], scope, &e))) return err;
        if (!em_chat_dict_set(&in->arena, v->as.dict, k->as.s.ptr, k->as.s.len, e)) return em_chat_oom();
    }
    *out = v;
    return NULL;
}

static em_err eval_unary(em_chat_interp *in, const em_chat_node *n, em_chat_scope *scope, em_chat_value **out) {
    em_chat_value *v;
    em_err err = em_chat_eval(in, n->a, scope, &v);
    if (err) return err;
    if (!strcmp(n->str, "not")) {
        *out = em_chat_bool(!em_chat_truthy(v));
        return NULL;
    }
    if (!is_numeric_like(v)) return em_chat_err(in, n->offset, "unary '%s' does not apply to %s", n->str, em_chat_kind_name(v));
    double r = em_chat_number(v) * (n->str[0] == '-' ? -1 : 1);
    return make_number(in, r, v->kind == VAL_FLOAT, n->offset, out);
}

em_err em_chat_eval(em_chat_interp *in, const em_chat_node *n, em_chat_scope *scope, em_chat_value **out) {
    if (!n) {
        *out = &em_chat_undefined;
        return NULL;
    }
    if (++in->depth > MAX_DEPTH) {
        in->depth--;
        return em_chat_err(in, n->offset, "expression nested too deeply");
    }
    em_err err = NULL;
    switch (n->kind) {
    case NODE_TEXT:
    case NODE_STRING:
        if (!(*out = em_chat_string_ref(&in->arena, n->str, n->len))) err = em_chat_oom();
        break;
    case NODE_INT:
        if (!(*out = em_chat_int(&in->arena, n->ival))) err = em_chat_oom();
        break;
    case NODE_FLOAT:
        if (!(*out = em_chat_float(&in->arena, n->fval))) err = em_chat_oom();
        break;
    case NODE_IDENT: *out = em_chat_scope_lookup(scope, n->str, n->len); break;
    case NODE_ARRAY:
    case NODE_TUPLE: err = eval_literal_list(in, n, scope, out); break;
    case NODE_OBJECT: err = eval_object(in, n, scope, out); break;
    case NODE_MEMBER: err = eval_member(in, n, scope, out); break;
    case NODE_CALL: err = eval_call(in, n, scope, out); break;
    case NODE_UNARY: err = eval_unary(in, n, scope, out); break;
    case NODE_BINARY: err = eval_binary(in, n, scope, out); break;
    case NODE_FILTER: {
        em_chat_value *v;
        err = em_chat_eval(in, n->a, scope, &v);
        if (!err) err = em_chat_apply_filter(in, v, n->b, scope, out);
        break;
    }
    case NODE_TEST: {
        em_chat_value *v;
        bool found, result;
        err = em_chat_eval(in, n->a, scope, &v);
        if (!err) err = em_chat_run_test(in, n->str, v, NULL, n->offset, &found, &result);
        if (!err && !found) err = em_chat_err(in, n->offset, "unknown test '%s'", n->str);
        if (!err) *out = em_chat_bool(result != n->flag);
        break;
    }
    case NODE_SELECT: {
        em_chat_value *c;
        err = em_chat_eval(in, n->b, scope, &c);
        if (!err) {
            if (em_chat_truthy(c)) err = em_chat_eval(in, n->a, scope, out);
            else *out = &em_chat_undefined;
        }
        break;
    }
    case NODE_TERNARY: {
        em_chat_value *c;
        err = em_chat_eval(in, n->a, scope, &c);
        if (!err) err = em_chat_eval(in, em_chat_truthy(c) ? n->b : n->c, scope, out);
        break;
    }
    case NODE_SLICE: err = em_chat_err(in, n->offset, "a slice is only allowed inside '[]'"); break;
    case NODE_KWARG:
    case NODE_SPREAD:
    case NODE_KWSPREAD: err = em_chat_err(in, n->offset, "keyword arguments and unpacking are only allowed in calls"); break;
    default: err = em_chat_err(in, n->offset, "a statement is not an expression"); break;
    }
    in->depth--;
    if (!err && in->arena.failed) err = em_chat_oom();
    return err;
}

/* ---- statements ---- */
static em_err exec_set(em_chat_interp *in, const em_chat_node *n, em_chat_scope *scope) {
    em_chat_value *rhs;
    em_err err = n->b ? em_chat_eval(in, n->b, scope, &rhs) : render_body(in, &n->list, scope, n->offset, &rhs);
    if (err) return err;
    const em_chat_node *t = n->a;
    if (t->kind == NODE_IDENT) return em_chat_scope_set(in, scope, t->str, t->len, rhs) ? NULL : em_chat_oom();
    if (t->kind == NODE_TUPLE) {
        if (rhs->kind != VAL_LIST) return em_chat_err(in, n->offset, "cannot unpack %s in 'set'", em_chat_kind_name(rhs));
        if (rhs->as.list->n != t->list.n)
            return em_chat_err(in, n->offset, "too %s values to unpack in 'set'", t->list.n > rhs->as.list->n ? "few" : "many");
        for (size_t i = 0; i < t->list.n; i++) {
            const em_chat_node *e = t->list.at[i];
            if (e->kind != NODE_IDENT) return em_chat_err(in, e->offset, "can only unpack into names");
            if (!em_chat_scope_set(in, scope, e->str, e->len, rhs->as.list->at[i])) return em_chat_oom();
        }
        return NULL;
    }
    if (t->kind == NODE_MEMBER) {
        em_chat_value *obj;
        if ((err = em_chat_eval(in, t->a, scope, &obj))) return err;
        if (obj->kind != VAL_NAMESPACE) return em_chat_err(in, t->offset, "can only assign attributes of a namespace, not of %s", em_chat_kind_name(obj));
        if (t->flag || t->b->kind != NODE_IDENT) return em_chat_err(in, t->offset, "a namespace attribute must be a name");
        return em_chat_dict_set(&in->arena, obj->as.dict, t->b->str, t->b->len, rhs) ? NULL : em_chat_oom();
    }
    return em_chat_err(in, t->offset, "cannot assign to this expression");
}

static em_err bind_loop_var(em_chat_interp *in, const em_chat_node *target, em_chat_value *item, em_chat_scope *scope) {
    if (target->kind == NODE_IDENT) return em_chat_scope_set(in, scope, target->str, target->len, item) ? NULL : em_chat_oom();
    for (size_t j = 0; j < target->list.n; j++) {
        const em_chat_node *e = target->list.at[j];
        if (e->kind != NODE_IDENT) return em_chat_err(in, e->offset, "can only unpack into names");
        if (!em_chat_scope_set(in, scope, e->str, e->len, item->as.list->at[j])) return em_chat_oom();
    }
    return NULL;
}

static em_err exec_for(em_chat_interp *in, const em_chat_node *n, em_chat_scope *env, em_buf *out) {
    em_chat_scope *scope = em_chat_scope_new(in, env);
    if (!scope) return em_chat_oom();
    const em_chat_node *iter_node = n->b, *test = NULL;
    if (iter_node->kind == NODE_SELECT) {
        test = iter_node->b;
        iter_node = iter_node->a;
    }
    em_chat_value *it;
    em_err err = em_chat_eval(in, iter_node, scope, &it);
    if (err) return err;
    if (it->kind == VAL_DICT) {
        em_chat_value *keys = em_chat_list_new(&in->arena, it->as.dict->n);
        if (!keys) return em_chat_oom();
        for (size_t i = 0; i < it->as.dict->n; i++) {
            em_chat_value *k = em_chat_string_ref(&in->arena, it->as.dict->at[i].key, it->as.dict->at[i].key_len);
            if (!k) return em_chat_oom();
            em_chat_list_push(&in->arena, keys->as.list, k);
        }
        it = keys;
    } else if (it->kind != VAL_LIST) {
        return em_chat_err(in, n->b->offset, "cannot loop over %s", em_chat_kind_name(it));
    }
    em_chat_value *items = em_chat_list_new(&in->arena, it->as.list->n);
    if (!items) return em_chat_oom();
    for (size_t i = 0; i < it->as.list->n; i++) {
        em_chat_value *cur = it->as.list->at[i];
        if (++in->steps > in->max_steps)
            return em_chat_error_at(&in->tpl->src, n->offset, EM_ERR_RANGE, "template ran more than %llu steps",
                                    (unsigned long long)in->max_steps);
        if (n->a->kind == NODE_TUPLE) {
            if (cur->kind != VAL_LIST || cur->is_tuple) return em_chat_err(in, n->a->offset, "cannot unpack %s", em_chat_kind_name(cur));
            if (cur->as.list->n != n->a->list.n)
                return em_chat_err(in, n->a->offset, "too %s values to unpack", n->a->list.n > cur->as.list->n ? "few" : "many");
        }
        if (test) {
            em_chat_scope *ls = em_chat_scope_new(in, scope);
            em_chat_value *c;
            if (!ls) return em_chat_oom();
            if ((err = bind_loop_var(in, n->a, cur, ls)) || (err = em_chat_eval(in, test, ls, &c))) return err;
            if (!em_chat_truthy(c)) continue;
        }
        em_chat_list_push(&in->arena, items->as.list, cur);
    }
    size_t count = items->as.list->n;
    bool no_iteration = true;
    for (size_t i = 0; i < count; i++) {
        em_chat_value *loop = em_chat_dict_new(&in->arena, VAL_DICT);
        if (!loop) return em_chat_oom();
        em_chat_value *vals[] = {
            em_chat_int(&in->arena, (int64_t)i + 1), em_chat_int(&in->arena, (int64_t)i),
            em_chat_int(&in->arena, (int64_t)(count - i)), em_chat_int(&in->arena, (int64_t)(count - i - 1)),
            em_chat_bool(i == 0), em_chat_bool(i == count - 1), em_chat_int(&in->arena, (int64_t)count),
            i > 0 ? items->as.list->at[i - 1] : &em_chat_undefined,
            i + 1 < count ? items->as.list->at[i + 1] : &em_chat_undefined,
        };
        static const char *names[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem"};
        for (size_t k = 0; k < 9; k++)
            if (!vals[k] || !em_chat_dict_set(&in->arena, loop->as.dict, names[k], strlen(names[k]), vals[k])) return em_chat_oom();
        if (!em_chat_scope_set(in, scope, "loop", 4, loop)) return em_chat_oom();
        if ((err = bind_loop_var(in, n->a, items->as.list->at[i], scope))) return err;
        size_t mark = out->len;
        if ((err = em_chat_eval_block(in, &n->list, scope, out))) return err;
        if (in->control) {
            int c = in->control;
            in->control = CONTROL_NONE;
            out->len = mark;
            if (out->data) out->data[mark] = 0;
            if (c == CONTROL_BREAK) break;
            continue;
        }
        no_iteration = false;
    }
    if (no_iteration) return em_chat_eval_block(in, &n->list2, scope, out);
    return NULL;
}

static em_err exec_call_block(em_chat_interp *in, const em_chat_node *n, em_chat_scope *env, em_chat_value **out) {
    em_chat_value *caller = function_value(in, "caller", n, env);
    if (!caller) return em_chat_oom();
    em_chat_args args;
    em_err err = em_chat_eval_args(in, &n->a->list, env, &args);
    em_chat_value *fn;
    if (!err) err = em_chat_eval(in, n->a->a, env, &fn);
    if (err) return err;
    if (fn->kind != VAL_FUNCTION) return em_chat_err(in, n->offset, "'%s' is not a macro", n->a->a->str);
    em_chat_scope *scope = em_chat_scope_new(in, env);
    if (!scope || !em_chat_scope_set(in, scope, "caller", 6, caller)) return em_chat_oom();
    return fn->as.fn->call(in, fn, &args, n->offset, scope, out);
}

em_err em_chat_eval_block(em_chat_interp *in, const em_chat_nodes *body, em_chat_scope *scope, em_buf *out) {
    for (size_t i = 0; i < body->n && !in->control; i++) {
        const em_chat_node *n = body->at[i];
        em_err err = NULL;
        if (++in->steps > in->max_steps)
            return em_chat_error_at(&in->tpl->src, n->offset, EM_ERR_RANGE, "template ran more than %llu steps",
                                    (unsigned long long)in->max_steps);
        em_chat_value *v = NULL;
        switch (n->kind) {
        case NODE_TEXT: em_buf_append(out, n->str, n->len); continue;
        case NODE_COMMENT: continue;
        case NODE_IF: {
            em_chat_value *c;
            if ((err = em_chat_eval(in, n->a, scope, &c))) return err;
            /* Nested blocks count toward the depth bound, as expressions and macro calls do. */
            if (++in->depth > MAX_DEPTH) return em_chat_err(in, n->offset, "blocks nested too deeply");
            err = em_chat_eval_block(in, em_chat_truthy(c) ? &n->list : &n->list2, scope, out);
            in->depth--;
            break;
        }
        case NODE_FOR:
            if (++in->depth > MAX_DEPTH) return em_chat_err(in, n->offset, "blocks nested too deeply");
            err = exec_for(in, n, scope, out);
            in->depth--;
            break;
        case NODE_SET: err = exec_set(in, n, scope); break;
        case NODE_MACRO: {
            em_chat_value *fn = function_value(in, n->str, n, NULL);
            if (!fn || !em_chat_scope_set(in, scope, n->str, n->len, fn)) return em_chat_oom();
            continue;
        }
        case NODE_BREAK: in->control = CONTROL_BREAK; continue;
        case NODE_CONTINUE: in->control = CONTROL_CONTINUE; continue;
        case NODE_CALL_BLOCK: err = exec_call_block(in, n, scope, &v); break;
        case NODE_FILTER_BLOCK: {
            em_chat_value *body_text;
            if ((err = render_body(in, &n->list, scope, n->offset, &body_text))) return err;
            err = em_chat_apply_filter(in, body_text, n->a, scope, &v);
            break;
        }
        default: err = em_chat_eval(in, n, scope, &v); break;
        }
        if (err) return err;
        if (in->arena.failed) return em_chat_oom();
        if (v && v->kind != VAL_NONE && v->kind != VAL_UNDEFINED) {
            err = em_chat_render_value(out, v);
            if (err) return wrap(in, n->offset, err);
        }
        if (out->failed) return em_chat_oom();
        if (out->len > in->max_output)
            return em_chat_error_at(&in->tpl->src, n->offset, EM_ERR_RANGE, "output larger than %llu bytes",
                                    (unsigned long long)in->max_output);
    }
    return NULL;
}
