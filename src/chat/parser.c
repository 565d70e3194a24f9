/*
 * Tokens → syntax tree: a recursive-descent parser with the grammar and precedence of the
 * reference renderer (@huggingface/jinja), from loosest to tightest:
 *   `a if c else b` / `a if c` → or → and → not → comparisons (== != < <= > >= in, not in) →
 *   + - ~ → * / // % → ** → tests (`is [not] name`) → filters (`| name(args)`) → unary sign →
 *   calls, member access, subscripts and slices → literals, names, (...), [...], {...}.
 * Statements: if/elif/else, for (with `if` filtering and else), set (also tuples, namespace
 * attributes and block form), macro, call, filter blocks, break, continue. Anything else in
 * `{% %}` is an error that names it. Nodes live in the template's arena.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Deeper nesting is refused rather than risking the stack: a level of nesting costs a dozen frames
 * of the descent (about 4 KiB under AddressSanitizer), and 64 levels fit a 256 KiB thread stack
 * there (tests/test_chat.c renders on 512 KiB); real templates nest a handful deep. */
#define MAX_NESTING 64

typedef struct parser {
    em_chat_template *tpl;
    const em_chat_token *tk;
    size_t n, pos;
    int depth;              /* recursion of the parser itself */
    int expression_nesting; /* parse_expression calls under way: 0 = at an outermost expression */
} parser;

typedef struct vec {
    em_chat_node **at;
    size_t n, cap;
} vec;

static em_err oom(void) { return em_errorf(EM_ERR_NOMEM, "out of memory parsing a chat template"); }

static em_err vec_push(vec *v, em_chat_node *node) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        em_chat_node **at = realloc(v->at, cap * sizeof *at);
        if (!at) return oom();
        v->at = at;
        v->cap = cap;
    }
    v->at[v->n++] = node;
    return NULL;
}

/* Moves a vector into the arena (frees the vector). */
static em_err vec_done(parser *p, vec *v, em_chat_nodes *out) {
    out->n = v->n;
    out->at = NULL;
    if (v->n) {
        out->at = em_chat_alloc(&p->tpl->arena, v->n * sizeof *out->at);
        if (!out->at) {
            free(v->at);
            return oom();
        }
        memcpy(out->at, v->at, v->n * sizeof *out->at);
    }
    free(v->at);
    *v = (vec){0};
    return NULL;
}

static size_t here(const parser *p) {
    return p->pos < p->n ? p->tk[p->pos].offset : p->tpl->src.len;
}

static em_err error(const parser *p, const char *fmt, const char *arg) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    if (p->pos >= p->n) return em_chat_error_at(&p->tpl->src, here(p), EM_ERR_FORMAT, "%s (at end of template)", msg);
    const em_chat_token *t = &p->tk[p->pos];
    if (t->type == TOK_TEXT) return em_chat_error_at(&p->tpl->src, here(p), EM_ERR_FORMAT, "%s, got text", msg);
    return em_chat_error_at(&p->tpl->src, here(p), EM_ERR_FORMAT, "%s, got %s '%.40s'", msg,
                            em_chat_token_name(t->type), t->value);
}

static em_chat_node *node(parser *p, em_chat_node_kind kind, size_t offset) {
    em_chat_node *n = em_chat_alloc(&p->tpl->arena, sizeof *n);
    if (n) {
        n->kind = kind;
        n->offset = offset;
    }
    return n;
}

static bool is(const parser *p, em_chat_tok type) { return p->pos < p->n && p->tk[p->pos].type == type; }
static bool is2(const parser *p, em_chat_tok a, em_chat_tok b) {
    return p->pos + 1 < p->n && p->tk[p->pos].type == a && p->tk[p->pos + 1].type == b;
}
static bool is_ident(const parser *p, size_t ahead, const char *name) {
    return p->pos + ahead < p->n && p->tk[p->pos + ahead].type == TOK_IDENT && !strcmp(p->tk[p->pos + ahead].value, name);
}
/* `{% name` for any of the NULL-terminated names. */
static bool is_statement(const parser *p, const char *const *names) {
    if (!is2(p, TOK_OPEN_STMT, TOK_IDENT)) return false;
    for (; *names; names++)
        if (!strcmp(p->tk[p->pos + 1].value, *names)) return true;
    return false;
}

static em_err expect(parser *p, em_chat_tok type, const char *what) {
    if (!is(p, type)) return error(p, "expected %s", what);
    p->pos++;
    return NULL;
}

static em_err expect_ident(parser *p, const char *name) {
    if (!is_ident(p, 0, name)) return error(p, "expected '%s'", name);
    p->pos++;
    return NULL;
}

static em_err parse_any(parser *p, em_chat_node **out);
static em_err parse_expression(parser *p, em_chat_node **out);
static em_err parse_primary(parser *p, em_chat_node **out);

/* Statements until one of `ends` (not consumed). */
static em_err parse_body(parser *p, const char *const *ends, const char *opened, em_chat_nodes *out) {
    vec v = {0};
    em_err err = NULL;
    size_t start = here(p);
    while (!err && !is_statement(p, ends)) {
        if (p->pos >= p->n) {
            err = em_chat_error_at(&p->tpl->src, start, EM_ERR_FORMAT, "'%s' block is never closed (expected '{%% %s %%}')",
                                   opened, ends[0]);
            break;
        }
        em_chat_node *n;
        err = parse_any(p, &n);
        if (!err) err = vec_push(&v, n);
    }
    if (err) {
        free(v.at);
        return err;
    }
    return vec_done(p, &v, out);
}

/* `( args )` for calls ("call") or macro/caller parameter lists ("parameters"). */
static em_err parse_args(parser *p, bool parameters, em_chat_nodes *out) {
    em_err err = expect(p, TOK_LPAREN, "'('");
    vec v = {0};
    bool saw_keyword = false, saw_spread = false;
    while (!err && !is(p, TOK_RPAREN)) {
        if (p->pos >= p->n) {
            err = error(p, "expected ')'%s", "");
            break;
        }
        size_t at = here(p);
        bool kw_spread = is(p, TOK_POWER);
        bool spread = is(p, TOK_MULTIPLICATIVE) && !strcmp(p->tk[p->pos].value, "*");
        if (parameters && (kw_spread || spread)) {
            err = error(p, "argument unpacking is not allowed in parameter lists%s", "");
            break;
        }
        em_chat_node *arg = NULL;
        if (kw_spread || spread) {
            if (spread && saw_spread) {
                err = error(p, "only one '*' argument unpacking is allowed%s", "");
                break;
            }
            p->pos++;
            em_chat_node *inner;
            err = parse_expression(p, &inner);
            if (err) break;
            arg = node(p, kw_spread ? NODE_KWSPREAD : NODE_SPREAD, at);
            if (!arg) {
                err = oom();
                break;
            }
            arg->a = inner;
            if (spread) saw_spread = true;
            err = vec_push(&v, arg);
            if (is(p, TOK_COMMA)) p->pos++;
            if (!err && kw_spread && !is(p, TOK_RPAREN)) err = error(p, "'**' must be the last argument%s", "");
            if (kw_spread) break;
            continue;
        }
        err = parse_expression(p, &arg);
        if (err) break;
        if (is(p, TOK_EQUALS)) {
            p->pos++;
            if (arg->kind != NODE_IDENT) {
                err = em_chat_error_at(&p->tpl->src, arg->offset, EM_ERR_FORMAT, "expected a name before '='");
                break;
            }
            em_chat_node *kw = node(p, NODE_KWARG, arg->offset);
            if (!kw) {
                err = oom();
                break;
            }
            kw->str = arg->str;
            kw->len = arg->len;
            err = parse_expression(p, &kw->a);
            if (err) break;
            arg = kw;
        }
        if (parameters) {
            if (arg->kind != NODE_IDENT && arg->kind != NODE_KWARG) {
                err = em_chat_error_at(&p->tpl->src, arg->offset, EM_ERR_FORMAT, "expected a parameter name");
                break;
            }
            for (size_t i = 0; i < v.n; i++)
                if (!strcmp(v.at[i]->str, arg->str)) {
                    err = em_chat_error_at(&p->tpl->src, arg->offset, EM_ERR_FORMAT, "duplicate parameter '%s'", arg->str);
                    break;
                }
            if (err) break;
        }
        if (arg->kind == NODE_KWARG) {
            saw_keyword = true;
        } else if (saw_keyword) {
            err = em_chat_error_at(&p->tpl->src, arg->offset, EM_ERR_FORMAT, "%s",
                                   parameters ? "a parameter without default follows one with a default"
                                              : "positional argument after keyword arguments");
            break;
        } else if (saw_spread) {
            err = em_chat_error_at(&p->tpl->src, arg->offset, EM_ERR_FORMAT, "positional argument after '*' unpacking");
            break;
        }
        err = vec_push(&v, arg);
        if (is(p, TOK_COMMA)) p->pos++;
    }
    if (!err) err = expect(p, TOK_RPAREN, "')'");
    if (err) {
        free(v.at);
        return err;
    }
    return vec_done(p, &v, out);
}

static em_err parse_member(parser *p, em_chat_node **io);

/* `callee(args)`, then any member accesses and further calls: f(a).b(c)(d). A loop, not
 * recursion, so a long chain cannot exhaust the stack. */
static em_err parse_call(parser *p, em_chat_node *callee, em_chat_node **out) {
    em_chat_node *cur = callee;
    em_err err = NULL;
    do {
        em_chat_node *call = node(p, NODE_CALL, callee->offset);
        if (!call) return oom();
        call->a = cur;
        err = parse_args(p, false, &call->list);
        if (!err) err = parse_member(p, &call);
        cur = call;
    } while (!err && is(p, TOK_LPAREN));
    *out = cur;
    return err;
}

/* The inside of `[...]`: an index expression or a slice. */
static em_err parse_subscript(parser *p, em_chat_node **out) {
    em_chat_node *parts[4] = {0};
    size_t n = 0;
    bool slice = false;
    size_t at = here(p);
    while (!is(p, TOK_RBRACKET)) {
        if (p->pos >= p->n) return error(p, "expected ']'%s", "");
        if (n == 4) return error(p, "a slice has at most 3 parts%s", "");
        if (is(p, TOK_COLON)) {
            parts[n++] = NULL;
            p->pos++;
            slice = true;
        } else {
            em_err err = parse_expression(p, &parts[n++]);
            if (err) return err;
            if (is(p, TOK_COLON)) {
                p->pos++;
                slice = true;
            }
        }
    }
    if (n == 0) return error(p, "expected an index or slice inside '[]'%s", "");
    if (!slice) {
        *out = parts[0];
        return NULL;
    }
    if (n > 3) return em_chat_error_at(&p->tpl->src, at, EM_ERR_FORMAT, "a slice has at most 3 parts");
    em_chat_node *s = node(p, NODE_SLICE, at);
    if (!s) return oom();
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    *out = s;
    return NULL;
}

static em_err parse_member(parser *p, em_chat_node **io) {
    while (is(p, TOK_DOT) || is(p, TOK_LBRACKET)) {
        bool computed = is(p, TOK_LBRACKET);
        size_t at = here(p);
        p->pos++;
        em_chat_node *prop;
        em_err err;
        if (computed) {
            err = parse_subscript(p, &prop);
            if (!err) err = expect(p, TOK_RBRACKET, "']'");
        } else {
            err = parse_primary(p, &prop);
            if (!err && prop->kind != NODE_IDENT && prop->kind != NODE_INT)
                err = em_chat_error_at(&p->tpl->src, prop->offset, EM_ERR_FORMAT, "expected a name or integer after '.'");
        }
        if (err) return err;
        em_chat_node *m = node(p, NODE_MEMBER, at);
        if (!m) return oom();
        m->a = *io;
        m->b = prop;
        m->flag = computed;
        *io = m;
    }
    return NULL;
}

static em_err parse_call_member(parser *p, em_chat_node **out) {
    em_err err = parse_primary(p, out);
    if (!err) err = parse_member(p, out);
    if (!err && is(p, TOK_LPAREN)) err = parse_call(p, *out, out);
    return err;
}

static em_err parse_unary_sign(parser *p, em_chat_node **out) {
    if ((is(p, TOK_UNARY) || is(p, TOK_ADDITIVE)) &&
        (!strcmp(p->tk[p->pos].value, "-") || !strcmp(p->tk[p->pos].value, "+"))) {
        em_chat_node *u = node(p, NODE_UNARY, here(p));
        if (!u) return oom();
        u->str = p->tk[p->pos].value;
        p->pos++;
        if (++p->depth > MAX_NESTING) return error(p, "expression nested too deeply%s", "");
        em_err err = parse_unary_sign(p, &u->a);
        p->depth--;
        *out = u;
        return err;
    }
    return parse_call_member(p, out);
}

static em_err parse_filter(parser *p, em_chat_node **out) {
    em_err err = parse_unary_sign(p, out);
    while (!err && is(p, TOK_PIPE)) {
        size_t at = here(p);
        p->pos++;
        em_chat_node *f;
        err = parse_primary(p, &f);
        if (err) break;
        if (f->kind != NODE_IDENT) return em_chat_error_at(&p->tpl->src, f->offset, EM_ERR_FORMAT, "expected a filter name after '|'");
        if (is(p, TOK_LPAREN)) err = parse_call(p, f, &f);
        em_chat_node *n = node(p, NODE_FILTER, at);
        if (!n) return oom();
        n->a = *out;
        n->b = f;
        *out = n;
    }
    return err;
}

static em_err parse_test(parser *p, em_chat_node **out) {
    em_err err = parse_filter(p, out);
    while (!err && is_ident(p, 0, "is")) {
        size_t at = here(p);
        p->pos++;
        bool negate = is_ident(p, 0, "not");
        if (negate) p->pos++;
        em_chat_node *t;
        err = parse_primary(p, &t);
        if (err) break;
        if (t->kind != NODE_IDENT) return em_chat_error_at(&p->tpl->src, t->offset, EM_ERR_FORMAT, "expected a test name after 'is'");
        em_chat_node *n = node(p, NODE_TEST, at);
        if (!n) return oom();
        n->a = *out;
        n->str = t->str;
        n->len = t->len;
        n->flag = negate;
        *out = n;
    }
    return err;
}

static em_err binary(parser *p, const char *op, size_t at, em_chat_node *l, em_chat_node *r, em_chat_node **out) {
    em_chat_node *n = node(p, NODE_BINARY, at);
    if (!n) return oom();
    n->str = op;
    n->a = l;
    n->b = r;
    *out = n;
    return NULL;
}

#define LEFT_ASSOC(name, next, cond)                                     \
    static em_err name(parser *p, em_chat_node **out) {                 \
        em_err err = next(p, out);                                      \
        while (!err && (cond)) {                                         \
            const em_chat_token *op = &p->tk[p->pos++];                  \
            em_chat_node *r;                                             \
            err = next(p, &r);                                           \
            if (!err) err = binary(p, op->value, op->offset, *out, r, out); \
        }                                                                \
        return err;                                                      \
    }

LEFT_ASSOC(parse_power, parse_test, is(p, TOK_POWER))
LEFT_ASSOC(parse_multiplicative, parse_power, is(p, TOK_MULTIPLICATIVE))
LEFT_ASSOC(parse_additive, parse_multiplicative, is(p, TOK_ADDITIVE))

static em_err parse_comparison(parser *p, em_chat_node **out) {
    em_err err = parse_additive(p, out);
    while (!err) {
        const char *op;
        size_t at = here(p);
        if (is_ident(p, 0, "not") && is_ident(p, 1, "in")) {
            op = "not in";
            p->pos += 2;
        } else if (is_ident(p, 0, "in") || is(p, TOK_COMPARISON)) {
            op = p->tk[p->pos++].value;
        } else {
            break;
        }
        em_chat_node *r;
        err = parse_additive(p, &r);
        if (!err) err = binary(p, op, at, *out, r, out);
    }
    return err;
}

static em_err parse_not(parser *p, em_chat_node **out) {
    if (!is_ident(p, 0, "not")) return parse_comparison(p, out);
    em_chat_node *u = node(p, NODE_UNARY, here(p));
    if (!u) return oom();
    u->str = "not";
    p->pos++;
    if (++p->depth > MAX_NESTING) return error(p, "expression nested too deeply%s", "");
    em_err err = parse_not(p, &u->a);
    p->depth--;
    *out = u;
    return err;
}

LEFT_ASSOC(parse_and, parse_not, is_ident(p, 0, "and"))
LEFT_ASSOC(parse_or, parse_and, is_ident(p, 0, "or"))

static em_err parse_if_expression(parser *p, em_chat_node **out) {
    em_err err = parse_or(p, out);
    if (err || !is_ident(p, 0, "if")) return err;
    size_t at = here(p);
    p->pos++;
    em_chat_node *cond;
    err = parse_or(p, &cond);
    if (err) return err;
    if (is_ident(p, 0, "else")) {
        p->pos++;
        em_chat_node *t = node(p, NODE_TERNARY, at);
        if (!t) return oom();
        t->a = cond;
        t->b = *out;
        *out = t;
        return parse_if_expression(p, &t->c);
    }
    em_chat_node *s = node(p, NODE_SELECT, at);
    if (!s) return oom();
    s->a = *out;
    s->b = cond;
    *out = s;
    return NULL;
}

/* Whether a tree is deeper than `left` levels. Left-associative chains (a + b + c ..., x | f | g
 * ..., x.a.b ...) are built by loops, so their depth is checked here once per outermost
 * expression; the evaluator and the tree walks can then recurse safely. */
static bool too_deep(const em_chat_node *n, int left) {
    if (!n) return false;
    if (left <= 0) return true;
    if (too_deep(n->a, left - 1) || too_deep(n->b, left - 1) || too_deep(n->c, left - 1)) return true;
    for (size_t i = 0; i < n->list.n; i++)
        if (too_deep(n->list.at[i], left - 1)) return true;
    for (size_t i = 0; i < n->list2.n; i++)
        if (too_deep(n->list2.at[i], left - 1)) return true;
    return false;
}

static em_err parse_expression(parser *p, em_chat_node **out) {
    if (++p->depth > MAX_NESTING) return error(p, "expression nested too deeply%s", "");
    size_t at = here(p);
    p->expression_nesting++;
    em_err err = parse_if_expression(p, out);
    p->expression_nesting--;
    if (!err && p->expression_nesting == 0 && too_deep(*out, MAX_NESTING))
        err = em_chat_error_at(&p->tpl->src, at, EM_ERR_FORMAT, "expression nested too deeply");
    p->depth--;
    return err;
}

/* `a, b, c` → a tuple; a single item stays itself. */
static em_err parse_sequence(parser *p, bool primary, em_chat_node **out) {
    size_t at = here(p);
    em_err err = primary ? parse_primary(p, out) : parse_expression(p, out);
    if (err || !is(p, TOK_COMMA)) return err;
    vec v = {0};
    err = vec_push(&v, *out);
    while (!err && is(p, TOK_COMMA)) {
        p->pos++;
        em_chat_node *n;
        err = primary ? parse_primary(p, &n) : parse_expression(p, &n);
        if (!err) err = vec_push(&v, n);
    }
    em_chat_node *t = err ? NULL : node(p, NODE_TUPLE, at);
    if (!err && !t) err = oom();
    if (err) {
        free(v.at);
        return err;
    }
    *out = t;
    return vec_done(p, &v, &t->list);
}

static em_err parse_primary(parser *p, em_chat_node **out) {
    if (p->pos >= p->n) return error(p, "expected an expression%s", "");
    const em_chat_token *t = &p->tk[p->pos];
    size_t at = t->offset;
    em_err err = NULL;
    switch (t->type) {
    case TOK_NUMBER: {
        p->pos++;
        bool is_float = strchr(t->value, '.') != NULL;
        em_chat_node *n = node(p, is_float ? NODE_FLOAT : NODE_INT, at);
        if (!n) return oom();
        n->fval = strtod(t->value, NULL);
        if (!is_float) {
            if (n->fval > 9.2e18 || n->fval < -9.2e18)
                return em_chat_error_at(&p->tpl->src, at, EM_ERR_UNSUPPORTED, "integer literal '%s' is too large", t->value);
            n->ival = strtoll(t->value, NULL, 10);
        }
        *out = n;
        return NULL;
    }
    case TOK_STRING: {
        /* Adjacent string literals concatenate. */
        em_buf b = {0};
        while (is(p, TOK_STRING)) {
            em_buf_append(&b, p->tk[p->pos].value, p->tk[p->pos].len);
            p->pos++;
        }
        em_chat_node *n = node(p, NODE_STRING, at);
        if (n) n->str = em_chat_strdup(&p->tpl->arena, b.data ? b.data : "", b.len);
        if (n) n->len = b.len;
        free(b.data);
        if (!n || !n->str || b.failed) return oom();
        *out = n;
        return NULL;
    }
    case TOK_IDENT: {
        p->pos++;
        em_chat_node *n = node(p, NODE_IDENT, at);
        if (!n) return oom();
        n->str = t->value;
        n->len = t->len;
        *out = n;
        return NULL;
    }
    case TOK_LPAREN:
        p->pos++;
        err = parse_sequence(p, false, out);
        if (!err) err = expect(p, TOK_RPAREN, "')'");
        return err;
    case TOK_LBRACKET: {
        p->pos++;
        vec v = {0};
        while (!err && !is(p, TOK_RBRACKET)) {
            em_chat_node *n;
            err = parse_expression(p, &n);
            if (!err) err = vec_push(&v, n);
            if (!err && is(p, TOK_COMMA)) p->pos++;
        }
        if (!err) p->pos++;
        em_chat_node *a = err ? NULL : node(p, NODE_ARRAY, at);
        if (!err && !a) err = oom();
        if (err) {
            free(v.at);
            return err;
        }
        *out = a;
        return vec_done(p, &v, &a->list);
    }
    case TOK_LBRACE: {
        p->pos++;
        vec keys = {0}, values = {0};
        while (!err && !is(p, TOK_RBRACE)) {
            em_chat_node *k, *v;
            err = parse_expression(p, &k);
            if (!err) err = expect(p, TOK_COLON, "':' between key and value");
            if (!err) err = parse_expression(p, &v);
            if (!err) err = vec_push(&keys, k);
            if (!err) err = vec_push(&values, v);
            if (!err && is(p, TOK_COMMA)) p->pos++;
        }
        if (!err) p->pos++;
        em_chat_node *o = err ? NULL : node(p, NODE_OBJECT, at);
        if (!err && !o) err = oom();
        if (err) {
            free(keys.at);
            free(values.at);
            return err;
        }
        *out = o;
        err = vec_done(p, &keys, &o->list);
        if (!err) err = vec_done(p, &values, &o->list2);
        else free(values.at);
        return err;
    }
    default: return error(p, "expected an expression%s", "");
    }
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF_ONLY[] = {"endif", NULL};
static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR_ONLY[] = {"endfor", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};

/* `{% endname %}` */
static em_err parse_end(parser *p, const char *name) {
    em_err err = expect(p, TOK_OPEN_STMT, "'{%'");
    if (!err) err = expect_ident(p, name);
    if (!err) err = expect(p, TOK_CLOSE_STMT, "'%}'");
    return err;
}

static em_err parse_if(parser *p, size_t at, em_chat_node **out) {
    em_chat_node *n = node(p, NODE_IF, at);
    if (!n) return oom();
    *out = n;
    em_err err = parse_expression(p, &n->a);
    if (!err) err = expect(p, TOK_CLOSE_STMT, "'%}'");
    if (!err) err = parse_body(p, END_IF, "if", &n->list);
    if (err) return err;
    if (is_statement(p, (const char *const[]){"elif", NULL})) {
        size_t elif_at = p->tk[p->pos].offset;
        p->pos += 2;
        em_chat_node *inner;
        if (++p->depth > MAX_NESTING) return error(p, "elif chain too long%s", "");
        err = parse_if(p, elif_at, &inner);
        p->depth--;
        if (err) return err;
        n->list2.at = em_chat_alloc(&p->tpl->arena, sizeof *n->list2.at);
        if (!n->list2.at) return oom();
        n->list2.at[0] = inner;
        n->list2.n = 1;
    } else if (is_statement(p, (const char *const[]){"else", NULL})) {
        p->pos += 2;
        err = expect(p, TOK_CLOSE_STMT, "'%}'");
        if (!err) err = parse_body(p, END_IF_ONLY, "else", &n->list2);
    }
    return err;
}

static em_err parse_statement(parser *p, em_chat_node **out) {
    size_t at = here(p);
    em_err err = expect(p, TOK_OPEN_STMT, "'{%'");
    if (err) return err;
    if (!is(p, TOK_IDENT)) return error(p, "expected a statement name after '{%%'%s", "");
    const char *name = p->tk[p->pos].value;
    p->pos++;
    if (!strcmp(name, "if")) {
        err = parse_if(p, at, out);
        if (!err) err = parse_end(p, "endif");
        return err;
    }
    if (!strcmp(name, "for")) {
        em_chat_node *n = node(p, NODE_FOR, at);
        if (!n) return oom();
        *out = n;
        err = parse_sequence(p, true, &n->a);
        if (err) return err;
        if (n->a->kind != NODE_IDENT && n->a->kind != NODE_TUPLE)
            return em_chat_error_at(&p->tpl->src, n->a->offset, EM_ERR_FORMAT, "expected a name or tuple as the loop variable");
        err = expect_ident(p, "in");
        if (!err) err = parse_expression(p, &n->b);
        if (!err) err = expect(p, TOK_CLOSE_STMT, "'%}'");
        if (!err) err = parse_body(p, END_FOR, "for", &n->list);
        if (!err && is_statement(p, (const char *const[]){"else", NULL})) {
            p->pos += 2;
            err = expect(p, TOK_CLOSE_STMT, "'%}'");
            if (!err) err = parse_body(p, END_FOR_ONLY, "for", &n->list2);
        }
        if (!err) err = parse_end(p, "endfor");
        return err;
    }
    if (!strcmp(name, "set")) {
        em_chat_node *n = node(p, NODE_SET, at);
        if (!n) return oom();
        *out = n;
        err = parse_sequence(p, false, &n->a);
        if (err) return err;
        if (is(p, TOK_EQUALS)) {
            p->pos++;
            err = parse_sequence(p, false, &n->b);
        } else {
            err = expect(p, TOK_CLOSE_STMT, "'=' or '%}'");
            if (!err) err = parse_body(p, END_SET, "set", &n->list);
            if (!err) err = expect(p, TOK_OPEN_STMT, "'{%'");
            if (!err) err = expect_ident(p, "endset");
        }
        if (!err) err = expect(p, TOK_CLOSE_STMT, "'%}'");
        return err;
    }
    if (!strcmp(name, "macro")) {
        em_chat_node *n = node(p, NODE_MACRO, at), *id;
        if (!n) return oom();
        *out = n;
        err = parse_primary(p, &id);
        if (err) return err;
        if (id->kind != NODE_IDENT) return em_chat_error_at(&p->tpl->src, id->offset, EM_ERR_FORMAT, "expected the macro's name");
        n->str = id->str;
        n->len = id->len;
        err = parse_args(p, true, &n->list);
        if (!err) err = expect(p, TOK_CLOSE_STMT, "'%}'");
        if (!err) err = parse_body(p, END_MACRO, "macro", &n->list2);
        if (!err) err = parse_end(p, "endmacro");
        return err;
    }
    if (!strcmp(name, "call")) {
        em_chat_node *n = node(p, NODE_CALL_BLOCK, at), *callee;
        if (!n) return oom();
        *out = n;
        if (is(p, TOK_LPAREN)) {
            err = parse_args(p, true, &n->list);
            if (err) return err;
        }
        err = parse_primary(p, &callee);
        if (err) return err;
        if (callee->kind != NODE_IDENT) return em_chat_error_at(&p->tpl->src, callee->offset, EM_ERR_FORMAT, "expected a macro name after 'call'");
        n->a = node(p, NODE_CALL, callee->offset);
        if (!n->a) return oom();
        n->a->a = callee;
        err = parse_args(p, false, &n->a->list);
        if (!err) err = expect(p, TOK_CLOSE_STMT, "'%}'");
        if (!err) err = parse_body(p, END_CALL, "call", &n->list2);
        if (!err) err = parse_end(p, "endcall");
        return err;
    }
    if (!strcmp(name, "filter")) {
        em_chat_node *n = node(p, NODE_FILTER_BLOCK, at);
        if (!n) return oom();
        *out = n;
        err = parse_primary(p, &n->a);
        if (!err && n->a->kind == NODE_IDENT && is(p, TOK_LPAREN)) err = parse_call(p, n->a, &n->a);
        if (!err) err = expect(p, TOK_CLOSE_STMT, "'%}'");
        if (!err) err = parse_body(p, END_FILTER, "filter", &n->list);
        if (!err) err = parse_end(p, "endfilter");
        return err;
    }
    if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        *out = node(p, name[0] == 'b' ? NODE_BREAK : NODE_CONTINUE, at);
        if (!*out) return oom();
        return expect(p, TOK_CLOSE_STMT, "'%}'");
    }
    return em_chat_error_at(&p->tpl->src, at, EM_ERR_UNSUPPORTED, "unknown or unsupported statement '%s'", name);
}

static em_err parse_any(parser *p, em_chat_node **out) {
    if (++p->depth > MAX_NESTING) return error(p, "blocks nested too deeply%s", "");
    em_err err = NULL;
    const em_chat_token *t = &p->tk[p->pos];
    switch (t->type) {
    case TOK_COMMENT:
    case TOK_TEXT:
        *out = node(p, t->type == TOK_TEXT ? NODE_TEXT : NODE_COMMENT, t->offset);
        if (!*out) {
            err = oom();
            break;
        }
        (*out)->str = t->value;
        (*out)->len = t->len;
        p->pos++;
        break;
    case TOK_OPEN_STMT: err = parse_statement(p, out); break;
    case TOK_OPEN_EXPR:
        p->pos++;
        err = parse_expression(p, out);
        if (!err) err = expect(p, TOK_CLOSE_EXPR, "'}}'");
        break;
    default: err = error(p, "unexpected %s", em_chat_token_name(t->type));
    }
    p->depth--;
    return err;
}

em_err em_chat_parse_tokens(em_chat_template *tpl, const em_chat_token *tokens, size_t count) {
    parser p = {.tpl = tpl, .tk = tokens, .n = count};
    vec v = {0};
    em_err err = NULL;
    while (!err && p.pos < p.n) {
        em_chat_node *n;
        err = parse_any(&p, &n);
        if (!err) err = vec_push(&v, n);
    }
    if (err) {
        free(v.at);
        return err;
    }
    return vec_done(&p, &v, &tpl->body);
}
