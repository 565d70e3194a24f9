/*
 * chat/internal.h — private to the .c files of src/chat: the arena, tokens, syntax tree and runtime values
 * shared by the lexer, parser and evaluator. Nothing outside src/chat includes this file; the
 * module's interface is chat.h.
 *
 * Memory: everything here lives in an arena. A template's arena holds its preprocessed source,
 * tokens and nodes; a render's arena holds every value the render makes (values are never freed
 * one by one, which is what lets namespaces and loops share them freely).
 */
#ifndef EMBER_CHAT_INTERNAL_H
#define EMBER_CHAT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat.h"

/* ---- arena (value.c) ---- */
typedef struct em_chat_arena {
    struct em_chat_chunk *head;
    uint64_t used, limit; /* bytes taken from malloc; limit 0 = unbounded */
    bool failed;          /* an allocation or list push failed: the render must fail (sticky) */
} em_chat_arena;

void *em_chat_alloc(em_chat_arena *arena, size_t size); /* zeroed; NULL when out of memory */
char *em_chat_strdup(em_chat_arena *arena, const char *s, size_t len);
void em_chat_arena_free(em_chat_arena *arena);

/* ---- source positions ---- */
typedef struct em_chat_source {
    const char *text; /* the original template text, as given */
    size_t len;
} em_chat_source;

/* "line L, column C" of a byte offset into the original text (1-based; columns in bytes). */
em_err em_chat_error_at(const em_chat_source *src, size_t offset, em_err_code code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* ---- lexer (lexer.c) ---- */
typedef enum em_chat_tok {
    TOK_TEXT, TOK_NUMBER, TOK_STRING, TOK_IDENT, TOK_EQUALS, TOK_LPAREN, TOK_RPAREN,
    TOK_OPEN_STMT, TOK_CLOSE_STMT, TOK_OPEN_EXPR, TOK_CLOSE_EXPR, TOK_LBRACKET, TOK_RBRACKET,
    TOK_LBRACE, TOK_RBRACE, TOK_COMMA, TOK_DOT, TOK_COLON, TOK_PIPE, TOK_ADDITIVE,
    TOK_MULTIPLICATIVE, TOK_POWER, TOK_COMPARISON, TOK_UNARY, TOK_COMMENT,
} em_chat_tok;

typedef struct em_chat_token {
    em_chat_tok type;
    const char *value; /* arena copy, NUL-terminated; string literals unescaped */
    size_t len;
    size_t offset; /* byte offset of the token in the original text */
} em_chat_token;

em_err em_chat_tokenize(em_chat_arena *arena, const em_chat_source *src, em_chat_token **tokens,
                        size_t *count);
const char *em_chat_token_name(em_chat_tok type);

/* Whitespace as JavaScript's \s and String.prototype.trim see it; returns the byte length of the
 * whitespace character at s (0 when it is not one). */
size_t em_chat_space_len(const char *s, size_t n);

/* ---- syntax tree (parser.c) ---- */
typedef enum em_chat_node_kind {
    NODE_TEXT, NODE_INT, NODE_FLOAT, NODE_STRING, NODE_IDENT, NODE_ARRAY, NODE_TUPLE, NODE_OBJECT,
    NODE_MEMBER, NODE_SLICE, NODE_CALL, NODE_KWARG, NODE_SPREAD, NODE_KWSPREAD, NODE_UNARY,
    NODE_BINARY, NODE_FILTER, NODE_TEST, NODE_SELECT, NODE_TERNARY, NODE_IF, NODE_FOR, NODE_SET,
    NODE_MACRO, NODE_CALL_BLOCK, NODE_BREAK, NODE_CONTINUE, NODE_FILTER_BLOCK, NODE_COMMENT,
} em_chat_node_kind;

typedef struct em_chat_node em_chat_node;
typedef struct em_chat_nodes {
    em_chat_node **at;
    size_t n;
} em_chat_nodes;

/* One node; which fields are used depends on the kind:
 *   TEXT/STRING/IDENT: str. INT: ival. FLOAT: fval. ARRAY/TUPLE: list. OBJECT: list (keys), list2
 *   (values). MEMBER: a object, b property, flag computed. SLICE: a start, b stop, c step (any
 *   NULL). CALL: a callee, list args. KWARG: str key, a value. SPREAD/KWSPREAD: a. UNARY: str op,
 *   a. BINARY: str op, a, b. FILTER: a operand, b filter (IDENT or CALL). TEST: a operand, str
 *   test name, flag negate. SELECT: a value, b condition. TERNARY: a condition, b then, c else.
 *   IF: a test, list body, list2 alternate. FOR: a target, b iterable, list body, list2 else.
 *   SET: a target, b value (NULL for a block set), list body. MACRO: str name, list params, list2
 *   body. CALL_BLOCK: a call, list caller params, list2 body. FILTER_BLOCK: a filter, list body. */
struct em_chat_node {
    em_chat_node_kind kind;
    size_t offset; /* in the original text */
    const char *str;
    size_t len;
    int64_t ival;
    double fval;
    bool flag;
    em_chat_node *a, *b, *c;
    em_chat_nodes list, list2;
};

struct em_chat_template {
    em_chat_arena arena;
    em_chat_source src;
    em_chat_nodes body;
};

em_err em_chat_parse_tokens(em_chat_template *tpl, const em_chat_token *tokens, size_t count);

/* ---- values (value.c) ---- */
typedef enum em_chat_kind {
    VAL_UNDEFINED, VAL_NONE, VAL_BOOL, VAL_INT, VAL_FLOAT, VAL_STRING, VAL_LIST, VAL_DICT,
    VAL_NAMESPACE, VAL_FUNCTION,
} em_chat_kind;

typedef struct em_chat_value em_chat_value;
typedef struct em_chat_interp em_chat_interp;
typedef struct em_chat_scope em_chat_scope;

typedef struct em_chat_list {
    em_chat_value **at;
    size_t n, cap;
} em_chat_list;

typedef struct em_chat_entry {
    const char *key;
    size_t key_len;
    em_chat_value *value;
} em_chat_entry;

typedef struct em_chat_dict {
    em_chat_entry *at;
    size_t n, cap;
} em_chat_dict;

/* Positional arguments, then keyword arguments (in call order). */
typedef struct em_chat_args {
    em_chat_value **pos;
    size_t n_pos;
    em_chat_dict *kw; /* NULL when there are none */
} em_chat_args;

typedef em_err (*em_chat_native)(em_chat_interp *in, const em_chat_value *fn, em_chat_args *args,
                                 size_t offset, em_chat_scope *caller, em_chat_value **out);

typedef struct em_chat_function {
    const char *name;
    em_chat_native call;
    em_chat_value *self;       /* bound methods: the string or dict */
    const em_chat_node *node;  /* macros and caller blocks */
    em_chat_scope *scope;      /* caller blocks: the scope of the call statement */
    bool varargs, kwargs;      /* macros: whether the body reads them */
} em_chat_function;

struct em_chat_value {
    em_chat_kind kind;
    bool is_tuple;  /* lists: made by a tuple literal */
    bool is_kwargs; /* dicts: the keyword arguments of a call */
    bool is_big_int; /* floats: an integer beyond int64 (the reference's numbers are all doubles) */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *ptr;
            size_t len;
        } s;
        em_chat_list *list;
        em_chat_dict *dict; /* dicts and namespaces */
        em_chat_function *fn;
    } as;
};

extern em_chat_value em_chat_undefined, em_chat_none, em_chat_true, em_chat_false;

em_chat_value *em_chat_new(em_chat_arena *a, em_chat_kind kind);
em_chat_value *em_chat_int(em_chat_arena *a, int64_t v);
em_chat_value *em_chat_float(em_chat_arena *a, double v);
em_chat_value *em_chat_bool(bool v);
em_chat_value *em_chat_string(em_chat_arena *a, const char *s, size_t len); /* copies */
em_chat_value *em_chat_string_ref(em_chat_arena *a, const char *s, size_t len); /* borrows */
em_chat_value *em_chat_list_new(em_chat_arena *a, size_t cap);
em_chat_value *em_chat_dict_new(em_chat_arena *a, em_chat_kind kind);
/* Appends; false (and the arena marked failed) when out of memory or v is NULL, so that callers
 * may ignore the result: the evaluator checks the arena after every node. */
bool em_chat_list_push(em_chat_arena *a, em_chat_list *l, em_chat_value *v);
bool em_chat_dict_set(em_chat_arena *a, em_chat_dict *d, const char *key, size_t len, em_chat_value *v);
em_chat_value *em_chat_dict_get(const em_chat_dict *d, const char *key, size_t len);
bool em_chat_dict_remove(em_chat_dict *d, const char *key, size_t len);

bool em_chat_truthy(const em_chat_value *v);
bool em_chat_is_number(const em_chat_value *v); /* int or float */
double em_chat_number(const em_chat_value *v);  /* int, float or bool as a double */
const char *em_chat_kind_name(const em_chat_value *v); /* for messages: "string", "list", ... */

/* JavaScript's Number.prototype.toString for a double. */
void em_chat_format_js_number(em_buf *b, double v);
/* How a value prints in output ({{ x }}): the reference's RuntimeValue.toString. */
em_err em_chat_render_value(em_buf *b, const em_chat_value *v);
/* How the reference's JavaScript sees the raw value as a string (`~`, `+`, join). */
em_err em_chat_js_string(em_buf *b, const em_chat_value *v);

typedef struct em_chat_json_options {
    int indent; /* 0 = none */
    bool ensure_ascii, sort_keys;
    const char *item_sep, *key_sep; /* NULL = the defaults for the indent */
    bool undefined_as_null;
} em_chat_json_options;
em_err em_chat_to_json(em_buf *b, const em_chat_value *v, const em_chat_json_options *o, int depth);

/* JavaScript equality on the raw values: loose (==) and strict (===, also SameValueZero). */
bool em_chat_loose_equal(const em_chat_value *a, const em_chat_value *b);
bool em_chat_strict_equal(const em_chat_value *a, const em_chat_value *b);

/* Converts JSON to a value the way JSON.parse + the reference's conversion would: integral
 * numbers become ints, object keys that are array indices come first in ascending order. */
em_chat_value *em_chat_from_json(em_chat_arena *a, const json_t *j);

/* ---- evaluation (eval.c, filters.c) ---- */
struct em_chat_scope {
    em_chat_scope *parent;
    em_chat_dict vars;
};

struct em_chat_interp {
    em_chat_arena arena;
    const em_chat_template *tpl;
    em_chat_scope *global;
    int64_t now;
    int control; /* CONTROL_* while a break or continue unwinds */
    uint64_t steps, max_steps, max_output;
    int depth;   /* recursion depth, bounded so hostile templates cannot exhaust the stack */
};

enum { CONTROL_NONE, CONTROL_BREAK, CONTROL_CONTINUE };

em_err em_chat_eval(em_chat_interp *in, const em_chat_node *node, em_chat_scope *scope, em_chat_value **out);
em_err em_chat_eval_block(em_chat_interp *in, const em_chat_nodes *body, em_chat_scope *scope, em_buf *out);
em_err em_chat_eval_args(em_chat_interp *in, const em_chat_nodes *args, em_chat_scope *scope, em_chat_args *out);
em_chat_scope *em_chat_scope_new(em_chat_interp *in, em_chat_scope *parent);
bool em_chat_scope_set(em_chat_interp *in, em_chat_scope *s, const char *name, size_t len, em_chat_value *v);
em_chat_value *em_chat_scope_lookup(em_chat_scope *s, const char *name, size_t len);

em_err em_chat_err(em_chat_interp *in, size_t offset, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
em_err em_chat_oom(void);

/* casing.c: JavaScript's toUpperCase/toLowerCase (first_only: just the first code point). */
void em_chat_case_map(em_buf *b, const char *s, size_t n, bool upper, bool first_only);

/* filters.c */
em_err em_chat_apply_filter(em_chat_interp *in, em_chat_value *operand, const em_chat_node *filter,
                            em_chat_scope *scope, em_chat_value **out);
/* Runs test `name` (NUL-terminated); *found false when no such test exists. */
em_err em_chat_run_test(em_chat_interp *in, const char *name, const em_chat_value *a,
                        const em_chat_value *b, size_t offset, bool *found, bool *result);
/* The attribute `name` of a string, list or dict (methods come back bound); undefined if none. */
em_chat_value *em_chat_builtin(em_chat_interp *in, em_chat_value *self, const char *name, size_t len);
/* The globals every render starts with (namespace, range, raise_exception, strftime_now, ...). */
em_err em_chat_add_globals(em_chat_interp *in, em_chat_scope *global);
int em_chat_compare(const em_chat_value *a, const em_chat_value *b, bool case_sensitive, bool *ok);

#endif
