/*
 * Template text → tokens, the way the reference renderer (@huggingface/jinja) does it.
 *
 * Whitespace handling happens in two places, as in the reference: first a preprocessing pass
 * over the whole text (drop one trailing newline; lstrip_blocks: drop spaces and tabs from a line
 * start up to `{%`, `{#` or `{-`; trim_blocks: drop the newline right after `%}`, `#}` or `-}`;
 * remove `{% generation %}` / `{% endgeneration %}` markers, with their `-` trimming), then
 * the `{%-`, `-%}`, `{{-`, `-}}`, `{#-`, `-#}` markers while tokenizing. These passes are textual,
 * exactly like the reference's regular expressions, so e.g. "%}\n" inside a string literal loses
 * its newline here too. Each preprocessed byte remembers its offset in the original text so that
 * errors name the line and column the author wrote.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

size_t em_chat_space_len(const char *s, size_t n) {
    if (n == 0) return 0;
    unsigned char c = (unsigned char)s[0];
    if (c == ' ' || (c >= '\t' && c <= '\r')) return 1;
    if (c < 0xc2 || n < 2) return 0;
    unsigned char c1 = (unsigned char)s[1];
    if (c == 0xc2) return c1 == 0xa0 ? 2 : 0;
    if (n < 3) return 0;
    unsigned char c2 = (unsigned char)s[2];
    if (c == 0xe1 && c1 == 0x9a && c2 == 0x80) return 3;
    if (c == 0xe2 && c1 == 0x80 && ((c2 >= 0x80 && c2 <= 0x8a) || c2 == 0xa8 || c2 == 0xa9 || c2 == 0xaf))
        return 3;
    if (c == 0xe2 && c1 == 0x81 && c2 == 0x9f) return 3;
    if (c == 0xe3 && c1 == 0x80 && c2 == 0x80) return 3;
    if (c == 0xef && c1 == 0xbb && c2 == 0xbf) return 3;
    return 0;
}

em_err em_chat_error_at(const em_chat_source *src, size_t offset, em_err_code code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t line, column;
    em_text_position(src->text, src->len, offset, &line, &column);
    return em_errorf(code, "line %zu, column %zu: %s", line, column, msg);
}

/* ---- preprocessing ---- */
typedef struct text {
    char *c;
    size_t *at; /* original offset of each byte */
    size_t n;
} text;

static bool text_alloc(text *t, size_t n) {
    t->c = malloc(n + 1);
    t->at = malloc((n + 1) * sizeof *t->at);
    t->n = 0;
    return t->c && t->at;
}

static void text_free(text *t) {
    free(t->c);
    free(t->at);
}

static void put(text *out, const text *in, size_t i) {
    out->c[out->n] = in->c[i];
    out->at[out->n++] = in->at[i];
}

static bool line_start(const text *t, size_t i) {
    if (i == 0) return true;
    char p = t->c[i - 1];
    if (p == '\n' || p == '\r') return true;
    /* JavaScript's multiline ^ also follows U+2028 and U+2029. */
    return i >= 3 && (unsigned char)t->c[i - 3] == 0xe2 && (unsigned char)t->c[i - 2] == 0x80 &&
           ((unsigned char)p == 0xa8 || (unsigned char)p == 0xa9);
}

static void lstrip_blocks(text *out, const text *in) {
    for (size_t i = 0; i < in->n;) {
        if (line_start(in, i)) {
            size_t j = i;
            while (j < in->n && (in->c[j] == ' ' || in->c[j] == '\t')) j++;
            if (j > i && j + 1 < in->n && in->c[j] == '{' && strchr("#%-", in->c[j + 1])) i = j;
        }
        /* Copy up to and including the next line break (one byte at a time keeps it simple). */
        put(out, in, i++);
    }
}

static void trim_blocks(text *out, const text *in) {
    for (size_t i = 0; i < in->n;) {
        if (i + 2 < in->n && strchr("#%-", in->c[i]) && in->c[i] && in->c[i + 1] == '}' && in->c[i + 2] == '\n') {
            put(out, in, i);
            put(out, in, i + 1);
            i += 3;
        } else {
            put(out, in, i++);
        }
    }
}

static size_t skip_space(const text *t, size_t i) {
    size_t k;
    while (i < t->n && (k = em_chat_space_len(t->c + i, t->n - i))) i += k;
    return i;
}

/* `{%-? (end)?generation -?%}`: if it matches at i, returns the end and the two trim flags. */
static size_t generation_tag(const text *t, size_t i, bool *lstrip, bool *rstrip) {
    if (i + 1 >= t->n || t->c[i] != '{' || t->c[i + 1] != '%') return 0;
    i += 2;
    *lstrip = i < t->n && t->c[i] == '-';
    if (*lstrip) i++;
    i = skip_space(t, i);
    if (t->n - i >= 3 && !memcmp(t->c + i, "end", 3)) i += 3;
    if (t->n - i < 10 || memcmp(t->c + i, "generation", 10)) return 0;
    i = skip_space(t, i + 10);
    *rstrip = i < t->n && t->c[i] == '-';
    if (*rstrip) i++;
    if (t->n - i < 2 || t->c[i] != '%' || t->c[i + 1] != '}') return 0;
    return i + 2;
}

static void drop_generation(text *out, const text *in) {
    size_t keep_from = 0; /* output before this is not the "before" whitespace of a later tag */
    for (size_t i = 0; i < in->n;) {
        bool lstrip, rstrip;
        size_t end = generation_tag(in, i, &lstrip, &rstrip);
        if (!end) {
            put(out, in, i++);
            continue;
        }
        if (lstrip) {
            /* Drop the whitespace run the tag's (\s*) prefix matched. */
            while (out->n > keep_from) {
                size_t j = out->n - 1;
                while (j > keep_from && ((unsigned char)out->c[j] & 0xc0) == 0x80) j--;
                if (em_chat_space_len(out->c + j, out->n - j) != out->n - j) break;
                out->n = j;
            }
        }
        size_t after = skip_space(in, end);
        if (!rstrip)
            for (size_t k = end; k < after; k++) put(out, in, k);
        keep_from = out->n;
        i = after;
    }
}

static em_err preprocess(const em_chat_source *src, text *out) {
    text a = {0}, b = {0};
    size_t n = src->len;
    if (!text_alloc(&a, n) || !text_alloc(&b, n)) {
        text_free(&a);
        text_free(&b);
        return em_errorf(EM_ERR_NOMEM, "out of memory reading a chat template");
    }
    if (n && src->text[n - 1] == '\n') n--;
    for (size_t i = 0; i < n; i++) {
        a.c[i] = src->text[i];
        a.at[i] = i;
    }
    a.n = n;
    lstrip_blocks(&b, &a);
    a.n = 0;
    trim_blocks(&a, &b);
    b.n = 0;
    drop_generation(&b, &a);
    text_free(&a);
    b.at[b.n] = src->len; /* the end, for errors at end of input */
    b.c[b.n] = 0;
    *out = b;
    return NULL;
}

/* ---- tokens ---- */
const char *em_chat_token_name(em_chat_tok type) {
    static const char *names[] = {
        "text", "number", "string", "identifier", "'='", "'('", "')'", "'{%'", "'%}'", "'{{'", "'}}'",
        "'['", "']'", "'{'", "'}'", "','", "'.'", "':'", "'|'", "operator", "operator", "'**'",
        "comparison", "unary operator", "comment",
    };
    return names[type];
}

typedef struct lexer {
    em_chat_arena *arena;
    const em_chat_source *src;
    text t;
    size_t pos;
    em_chat_token *tokens;
    size_t n, cap;
} lexer;

static em_err push(lexer *lx, em_chat_tok type, const char *value, size_t len, size_t at) {
    if (lx->n == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        em_chat_token *tokens = realloc(lx->tokens, cap * sizeof *tokens);
        if (!tokens) return em_errorf(EM_ERR_NOMEM, "out of memory tokenizing a chat template");
        lx->tokens = tokens;
        lx->cap = cap;
    }
    char *copy = em_chat_strdup(lx->arena, value, len);
    if (!copy) return em_errorf(EM_ERR_NOMEM, "out of memory tokenizing a chat template");
    lx->tokens[lx->n++] = (em_chat_token){type, copy, len, lx->t.at[at]};
    return NULL;
}

static em_err lex_error(lexer *lx, size_t at, const char *what) {
    return em_chat_error_at(lx->src, lx->t.at[at], EM_ERR_FORMAT, "%s", what);
}

static void put_utf8(em_buf *b, uint32_t cp) {
    char u[4];
    if (cp < 0x80) {
        u[0] = (char)cp;
        em_buf_append(b, u, 1);
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3f));
        em_buf_append(b, u, 2);
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        em_buf_append(b, u, 3);
    } else {
        u[0] = (char)(0xf0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char)(0x80 | (cp & 0x3f));
        em_buf_append(b, u, 4);
    }
}

static int hex_value(const char *s, size_t n, uint32_t *out) {
    uint32_t v = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* A quoted string literal starting after the opening quote; escapes as the reference has them. */
static em_err lex_string(lexer *lx, char quote, size_t start) {
    em_buf b = {0};
    text *t = &lx->t;
    em_err err = NULL;
    while (!err) {
        if (lx->pos >= t->n) {
            err = lex_error(lx, start, "unterminated string literal");
            break;
        }
        char c = t->c[lx->pos];
        if (c == quote) break;
        if (c != '\\') {
            em_buf_putc(&b, c);
            lx->pos++;
            continue;
        }
        size_t esc_at = lx->pos++;
        if (lx->pos >= t->n) {
            err = lex_error(lx, start, "unterminated string literal");
            break;
        }
        char e = t->c[lx->pos++];
        if (e == 'x' || e == 'u') {
            size_t len = e == 'x' ? 2 : 4;
            uint32_t cp;
            if (t->n - lx->pos < len || hex_value(t->c + lx->pos, len, &cp)) {
                err = lex_error(lx, esc_at, "invalid hexadecimal escape sequence");
                break;
            }
            lx->pos += len;
            /* A UTF-16 surrogate pair written as two \u escapes is one character. */
            uint32_t lo;
            if (cp >= 0xd800 && cp < 0xdc00 && t->n - lx->pos >= 6 && t->c[lx->pos] == '\\' &&
                t->c[lx->pos + 1] == 'u' && !hex_value(t->c + lx->pos + 2, 4, &lo) && lo >= 0xdc00 && lo < 0xe000) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                lx->pos += 6;
            }
            put_utf8(&b, cp);
            continue;
        }
        const char *from = "ntrbfv'\"\\", *to = "\n\t\r\b\f\v'\"\\";
        const char *k = e ? strchr(from, e) : NULL;
        if (k) {
            em_buf_putc(&b, to[k - from]);
            continue;
        }
        /* The reference rejects the escapes below; Jinja (Python's unicode-escape) defines them,
         * and real templates use the line continuation, so they get Jinja's meaning. */
        if (e == '\r' && lx->pos < t->n && t->c[lx->pos] == '\n') lx->pos++;
        if (e == '\n' || e == '\r') continue; /* backslash-newline: a line continuation */
        if (e == 'a') {
            em_buf_putc(&b, '\a');
        } else if (e >= '0' && e <= '7') {
            unsigned v = (unsigned)(e - '0');
            for (int d = 0; d < 2 && lx->pos < t->n && t->c[lx->pos] >= '0' && t->c[lx->pos] <= '7'; d++)
                v = v * 8 + (unsigned)(t->c[lx->pos++] - '0');
            put_utf8(&b, v);
        } else if (e == 'U') {
            uint32_t cp;
            if (t->n - lx->pos < 8 || hex_value(t->c + lx->pos, 8, &cp) || cp > 0x10ffff) {
                err = lex_error(lx, esc_at, "invalid \\U escape sequence");
                break;
            }
            lx->pos += 8;
            put_utf8(&b, cp);
        } else if (e == 'N') {
            err = lex_error(lx, esc_at, "unsupported \\N{name} escape in string literal");
            break;
        } else {
            em_buf_putc(&b, '\\'); /* an unknown escape stays as written */
            lx->pos--;
        }
    }
    if (!err && b.failed) err = em_errorf(EM_ERR_NOMEM, "out of memory tokenizing a chat template");
    if (!err) {
        lx->pos++; /* closing quote */
        err = push(lx, TOK_STRING, b.data ? b.data : "", b.len, start);
    }
    free(b.data);
    return err;
}

static void strip_trailing_space(lexer *lx) {
    if (!lx->n || lx->tokens[lx->n - 1].type != TOK_TEXT) return;
    em_chat_token *tk = &lx->tokens[lx->n - 1];
    size_t n = tk->len;
    while (n > 0) {
        size_t j = n - 1;
        while (j > 0 && ((unsigned char)tk->value[j] & 0xc0) == 0x80) j--;
        if (em_chat_space_len(tk->value + j, n - j) != n - j) break;
        n = j;
    }
    tk->len = n;
    if (n == 0) lx->n--;
}

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static const struct {
    const char *seq;
    em_chat_tok type;
} symbols[] = {
    {"{%", TOK_OPEN_STMT}, {"%}", TOK_CLOSE_STMT}, {"{{", TOK_OPEN_EXPR}, {"}}", TOK_CLOSE_EXPR},
    {"(", TOK_LPAREN}, {")", TOK_RPAREN}, {"{", TOK_LBRACE}, {"}", TOK_RBRACE}, {"[", TOK_LBRACKET},
    {"]", TOK_RBRACKET}, {",", TOK_COMMA}, {".", TOK_DOT}, {":", TOK_COLON}, {"|", TOK_PIPE},
    {"<=", TOK_COMPARISON}, {">=", TOK_COMPARISON}, {"==", TOK_COMPARISON}, {"!=", TOK_COMPARISON},
    {"<", TOK_COMPARISON}, {">", TOK_COMPARISON}, {"+", TOK_ADDITIVE}, {"-", TOK_ADDITIVE},
    {"~", TOK_ADDITIVE}, {"**", TOK_POWER}, {"*", TOK_MULTIPLICATIVE}, {"//", TOK_MULTIPLICATIVE},
    {"/", TOK_MULTIPLICATIVE}, {"%", TOK_MULTIPLICATIVE}, {"=", TOK_EQUALS},
};

static bool at_seq(const lexer *lx, const char *seq) {
    size_t n = strlen(seq);
    return lx->t.n - lx->pos >= n && !memcmp(lx->t.c + lx->pos, seq, n);
}

static em_err lex_number(lexer *lx, size_t start, bool allow_fraction, const char *sign) {
    const text *t = &lx->t;
    size_t d = lx->pos;
    while (lx->pos < t->n && is_digit(t->c[lx->pos])) lx->pos++;
    if (allow_fraction && lx->pos > d && lx->pos + 1 < t->n && t->c[lx->pos] == '.' && is_digit(t->c[lx->pos + 1])) {
        lx->pos++;
        while (lx->pos < t->n && is_digit(t->c[lx->pos])) lx->pos++;
    }
    char tmp[128];
    size_t n = lx->pos - d;
    if (n + 2 > sizeof tmp) return lex_error(lx, start, "numeric literal too long");
    size_t k = 0;
    if (sign) tmp[k++] = *sign;
    memcpy(tmp + k, t->c + d, n);
    return push(lx, n ? TOK_NUMBER : TOK_UNARY, tmp, k + n, start);
}

static em_err lex_main(lexer *lx) {
    text *t = &lx->t;
    int brace_depth = 0;
    em_err err = NULL;
    while (lx->pos < t->n && !err) {
        em_chat_tok last = lx->n ? lx->tokens[lx->n - 1].type : TOK_TEXT;
        if (!lx->n || last == TOK_CLOSE_STMT || last == TOK_CLOSE_EXPR || last == TOK_COMMENT) {
            size_t s = lx->pos;
            while (lx->pos < t->n && !(t->c[lx->pos] == '{' && lx->pos + 1 < t->n && strchr("%{#", t->c[lx->pos + 1])))
                lx->pos++;
            if (lx->pos > s) {
                err = push(lx, TOK_TEXT, t->c + s, lx->pos - s, s);
                continue;
            }
        }
        size_t start = lx->pos;
        if (at_seq(lx, "{#")) {
            lx->pos += 2;
            bool strip_before = lx->pos < t->n && t->c[lx->pos] == '-';
            if (strip_before) lx->pos++;
            size_t s = lx->pos;
            while (!(lx->pos + 1 < t->n && t->c[lx->pos] == '#' && t->c[lx->pos + 1] == '}')) {
                if (lx->pos + 2 >= t->n) return lex_error(lx, start, "comment is not closed with '#}'");
                lx->pos++;
            }
            size_t e = lx->pos;
            bool strip_after = e > s && t->c[e - 1] == '-';
            if (strip_after) e--;
            if (strip_before) strip_trailing_space(lx);
            err = push(lx, TOK_COMMENT, t->c + s, e - s, start);
            lx->pos += 2;
            if (strip_after) lx->pos = skip_space(t, lx->pos);
            continue;
        }
        if (at_seq(lx, "{%-") || at_seq(lx, "{{-")) {
            strip_trailing_space(lx);
            bool stmt = t->c[lx->pos + 1] == '%';
            err = push(lx, stmt ? TOK_OPEN_STMT : TOK_OPEN_EXPR, stmt ? "{%" : "{{", 2, start);
            if (!stmt) brace_depth = 0;
            lx->pos += 3;
            continue;
        }
        lx->pos = skip_space(t, lx->pos);
        if (lx->pos >= t->n) break;
        start = lx->pos;
        if (at_seq(lx, "-%}") || at_seq(lx, "-}}")) {
            bool stmt = t->c[lx->pos + 1] == '%';
            err = push(lx, stmt ? TOK_CLOSE_STMT : TOK_CLOSE_EXPR, stmt ? "%}" : "}}", 2, start);
            lx->pos = skip_space(t, lx->pos + 3);
            continue;
        }
        char c = t->c[lx->pos];
        if (c == '-' || c == '+') {
            if (!lx->n || last == TOK_TEXT) return lex_error(lx, start, "unexpected character outside a tag");
            if (!(last == TOK_IDENT || last == TOK_NUMBER || last == TOK_STRING || last == TOK_RPAREN ||
                  last == TOK_RBRACKET)) {
                /* A sign: "-3" is one number token, "-x" a unary operator. */
                lx->pos++;
                err = lex_number(lx, start, true, &c);
                continue;
            }
        }
        bool matched = false;
        for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
            if (symbols[i].type == TOK_CLOSE_EXPR && brace_depth > 0) continue;
            if (!at_seq(lx, symbols[i].seq)) continue;
            err = push(lx, symbols[i].type, symbols[i].seq, strlen(symbols[i].seq), start);
            if (symbols[i].type == TOK_OPEN_EXPR) brace_depth = 0;
            else if (symbols[i].type == TOK_LBRACE) brace_depth++;
            else if (symbols[i].type == TOK_RBRACE) brace_depth--;
            lx->pos += strlen(symbols[i].seq);
            matched = true;
            break;
        }
        if (matched) continue;
        if (c == '\'' || c == '"') {
            lx->pos++;
            err = lex_string(lx, c, start);
            continue;
        }
        if (is_digit(c)) {
            err = lex_number(lx, start, last != TOK_DOT || !lx->n, NULL);
            continue;
        }
        if (is_word(c)) {
            while (lx->pos < t->n && is_word(t->c[lx->pos])) lx->pos++;
            err = push(lx, TOK_IDENT, t->c + start, lx->pos - start, start);
            continue;
        }
        char shown[8] = {0};
        size_t len = 1;
        unsigned char u = (unsigned char)c;
        if (u >= 0xc0) len = u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : 2;
        if (len > t->n - lx->pos) len = t->n - lx->pos;
        memcpy(shown, t->c + lx->pos, len);
        return em_chat_error_at(lx->src, t->at[start], EM_ERR_FORMAT, "unexpected character '%s'",
                                u < 0x20 || u == 0x7f ? "?" : shown);
    }
    return err;
}

em_err em_chat_tokenize(em_chat_arena *arena, const em_chat_source *src, em_chat_token **tokens, size_t *count) {
    lexer lx = {.arena = arena, .src = src};
    em_err err = preprocess(src, &lx.t);
    if (err) return err;
    err = lex_main(&lx);
    text_free(&lx.t);
    if (err) {
        free(lx.tokens);
        return err;
    }
    *tokens = lx.tokens;
    *count = lx.n;
    return NULL;
}
