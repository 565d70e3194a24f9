/* String `pattern` and `format` for the JSON Schema converter (schema.h).
 *
 * The regex subset (ECMA-262 syntax, as JSON Schema uses): literals, `.`, escapes `\d \w \s \D
 * \W \S` and escaped metacharacters, classes `[...]` and `[^...]` with ranges, groups `(...)` and
 * `(?:...)`, alternation `|`, quantifiers `* + ? {m} {m,} {m,n}` (a lazy `?` after one changes
 * nothing here), and `^` / `$` at the ends. A pattern without `^` may have any text before its
 * match, one without `$` any text after (JSON Schema patterns are searches, not whole matches).
 * Everything else (lookaround, backreferences, `\b`, Unicode property escapes, flags) is an error
 * naming the construct. What the grammar produces is the string's JSON text, so `"` and `\` come
 * out escaped, `.` and negated classes never produce control characters, and `\s` produces a
 * space only: a subset of what the pattern matches, never more. Groups are followed by recursion,
 * so they may nest EM_SCHEMA_MAX_PATTERN_NESTING deep (schema.h), no deeper.
 */
#include <stdlib.h>
#include <string.h>

#include "schema.h"

typedef struct regex_parser {
    em_schema_writer *w;
    const char *s;
    size_t pos, len;
    unsigned depth; /* groups open at pos (EM_SCHEMA_MAX_PATTERN_NESTING) */
} regex_parser;

static bool regex_fail(regex_parser *r, const char *what) {
    return em_schema_fail(r->w, EM_ERR_UNSUPPORTED, "pattern \"%.80s%s\": %s at offset %zu (see the supported subset in docs/serve.md)",
                          r->s, r->len > 80 ? "..." : "", what, r->pos);
}

/* An unescaped character of the class body, written for a GBNF class. */
static void class_char(FILE *f, unsigned char c) {
    if (c == ']' || c == '[' || c == '\\' || c == '-' || c == '^' || c == '"') fprintf(f, "\\%c", c);
    else if (c < 0x20 || c == 0x7F) fprintf(f, "\\x%02X", c);
    else fputc(c, f);
}

/* A literal character of the pattern as JSON string text. */
static void literal_char(FILE *f, unsigned char c) {
    if (c == '"') fputs("\"\\\\\\\"\"", f); /* the two characters \" */
    else if (c == '\\') fputs("\"\\\\\\\\\"", f);
    else {
        char b = (char)c;
        em_schema_write_literal(f, &b, 1);
    }
}

/* The shorthand classes, as JSON-safe GBNF. */
static const char *shorthand(char c) {
    switch (c) {
    case 'd': return "[0-9]";
    case 'w': return "[a-zA-Z0-9_]";
    case 's': return "\" \"";
    case 'D': return "[^0-9\"\\\\\\x00-\\x1F\\x7F]";
    case 'W': return "[^a-zA-Z0-9_\"\\\\\\x00-\\x1F\\x7F]";
    case 'S': return "[^ \\t\\n\\r\\x0B\\x0C\"\\\\\\x00-\\x1F\\x7F]";
    default: return NULL;
    }
}

/* `[...]`: a GBNF class of the same characters, minus what a JSON string must escape; `"` and `\`
 * in a positive class come back as their escapes. */
static bool regex_class(regex_parser *r, FILE *f) {
    r->pos++; /* [ */
    bool negated = r->pos < r->len && r->s[r->pos] == '^';
    if (negated) r->pos++;
    char *body = NULL;
    size_t body_len = 0;
    FILE *b = open_memstream(&body, &body_len);
    if (!b) return em_schema_fail(r->w, EM_ERR_NOMEM, "out of memory");
    bool quote = false, backslash = false, ok = true, empty = true;
    while (ok && r->pos < r->len && r->s[r->pos] != ']') {
        unsigned char c = (unsigned char)r->s[r->pos++];
        if (c == '\\') {
            if (r->pos >= r->len) {
                ok = regex_fail(r, "a class ends in '\\'");
                break;
            }
            char e = r->s[r->pos++];
            if (e == 'd') fputs("0-9", b);
            else if (e == 'w') fputs("a-zA-Z0-9_", b);
            else if (e == 's') fputs(" ", b);
            else if (strchr("DWSbBpPu", e)) ok = regex_fail(r, "this escape inside a class is not supported");
            else if (e == 'n' || e == 't' || e == 'r') ok = negated || regex_fail(r, "control characters are not supported");
            else c = (unsigned char)e, e = 0;
            if (e) {
                empty = false;
                continue;
            }
        }
        if (!ok) break;
        if (c == '"') quote = true;
        else if (c == '\\') backslash = true;
        else if (c >= 0x20 && c != 0x7F) class_char(b, c);
        if (r->pos + 1 < r->len && r->s[r->pos] == '-' && r->s[r->pos + 1] != ']') {
            unsigned char hi = (unsigned char)r->s[r->pos + 1];
            if (hi == '\\' || hi < c) {
                ok = regex_fail(r, "this class range is not supported");
                break;
            }
            if (c <= '"' && hi >= '"') quote = true;
            if (c <= '\\' && hi >= '\\') backslash = true;
            fputc('-', b);
            class_char(b, hi);
            r->pos += 2;
        }
        empty = false;
    }
    fclose(b);
    if (ok && r->pos >= r->len) ok = regex_fail(r, "unterminated class");
    if (ok && empty) ok = regex_fail(r, "empty class");
    if (ok) {
        r->pos++;
        if (negated) {
            fprintf(f, "[^%s\"\\\\\\x00-\\x1F\\x7F]", body);
        } else {
            fputc('(', f);
            bool any = body_len > 0;
            if (any) fprintf(f, "[%s]", body);
            if (quote) fprintf(f, "%s\"\\\\\\\"\"", any ? " | " : ""), any = true;
            if (backslash) fprintf(f, "%s\"\\\\\\\\\"", any ? " | " : "");
            fputc(')', f);
        }
    }
    free(body);
    return ok;
}

static bool regex_alternatives(regex_parser *r, FILE *f);

/* One atom and its quantifier. */
static bool regex_atom(regex_parser *r, FILE *f) {
    char c = r->s[r->pos];
    if (c == '(') {
        if (r->depth >= EM_SCHEMA_MAX_PATTERN_NESTING) {
            char what[64];
            snprintf(what, sizeof what, "groups nested deeper than %d levels (the limit)", EM_SCHEMA_MAX_PATTERN_NESTING);
            return regex_fail(r, what);
        }
        r->pos++;
        if (r->pos + 1 < r->len && r->s[r->pos] == '?') {
            if (r->s[r->pos + 1] != ':') return regex_fail(r, "lookaround and named groups are not supported");
            r->pos += 2;
        }
        fputc('(', f);
        r->depth++;
        if (!regex_alternatives(r, f)) return false;
        r->depth--;
        if (r->pos >= r->len || r->s[r->pos] != ')') return regex_fail(r, "expected ')'");
        r->pos++;
        fputc(')', f);
    } else if (c == '[') {
        if (!regex_class(r, f)) return false;
    } else if (c == '.') {
        r->pos++;
        fputs(EM_SCHEMA_CHAR_RULE "-plain", f);
    } else if (c == '\\') {
        if (++r->pos >= r->len) return regex_fail(r, "the pattern ends in '\\'");
        char e = r->s[r->pos++];
        const char *sh = shorthand(e);
        if (sh) fputs(sh, f);
        else if (strchr(".*+?()[]{}|^$/\\-", e)) literal_char(f, (unsigned char)e);
        else return regex_fail(r, "this escape is not supported");
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        return regex_fail(r, "a quantifier follows nothing");
    } else if (c == '^' || c == '$') {
        return regex_fail(r, "anchors are supported only at the ends");
    } else if ((unsigned char)c < 0x20) {
        return regex_fail(r, "control characters are not supported");
    } else { /* a literal, a whole UTF-8 character at a time */
        size_t n = 1;
        while (r->pos + n < r->len && ((unsigned char)r->s[r->pos + n] & 0xC0) == 0x80) n++;
        if (n == 1) literal_char(f, (unsigned char)c);
        else em_schema_write_literal(f, r->s + r->pos, n);
        r->pos += n;
    }
    if (r->pos < r->len) {
        c = r->s[r->pos];
        if (c == '*' || c == '+' || c == '?') {
            fputc(c, f);
            r->pos++;
        } else if (c == '{') {
            size_t end = r->pos;
            while (end < r->len && r->s[end] != '}') end++;
            if (end >= r->len) return regex_fail(r, "unterminated '{'");
            for (size_t i = r->pos + 1; i < end; i++)
                if (!strchr("0123456789,", r->s[i])) return regex_fail(r, "malformed repetition");
            fprintf(f, "%.*s", (int)(end + 1 - r->pos), r->s + r->pos);
            r->pos = end + 1;
        }
        if (r->pos < r->len && r->s[r->pos] == '?') r->pos++; /* lazy: the same strings */
    }
    fputc(' ', f);
    return true;
}

static bool regex_alternatives(regex_parser *r, FILE *f) {
    for (;;) {
        fputs("(\"\" ", f); /* an empty alternative stays valid GBNF */
        while (r->pos < r->len && r->s[r->pos] != '|' && r->s[r->pos] != ')') {
            if (r->s[r->pos] == '$' && r->pos + 1 == r->len) break;
            if (!regex_atom(r, f)) return false;
        }
        fputc(')', f);
        if (r->pos < r->len && r->s[r->pos] == '|') {
            r->pos++;
            fputs(" | ", f);
            continue;
        }
        return true;
    }
}

bool em_schema_pattern(em_schema_writer *w, const char *pattern, FILE *f) {
    regex_parser r = {.w = w, .s = pattern, .len = strlen(pattern)};
    bool anchored_start = r.len && pattern[0] == '^';
    bool anchored_end = r.len && pattern[r.len - 1] == '$' && (r.len < 2 || pattern[r.len - 2] != '\\');
    if (anchored_start) r.pos++;
    if (!anchored_start) fputs(EM_SCHEMA_CHAR_RULE "* ", f);
    fputc('(', f);
    if (!regex_alternatives(&r, f)) return false;
    fputc(')', f);
    if (anchored_end) r.pos++;
    if (r.pos != r.len) return regex_fail(&r, "unexpected ')'");
    if (!anchored_end) fputs(" " EM_SCHEMA_CHAR_RULE "*", f);
    return true;
}

/* ---- Formats ---- */

/* Days that exist in every year: February stops at 28 (a 29th needs the year, left out). */
static const char *DATE_RULE =
    "format-date ::= [0-9]{4} \"-\" ( (\"01\" | \"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\") \"-\" "
    "(\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | (\"04\" | \"06\" | \"09\" | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | "
    "\"30\") | \"02\" \"-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]) )\n";
static const char *TIME_RULE =
    "format-time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
    "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n";

bool em_schema_format(em_schema_writer *w, const char *format, FILE *f) {
    static const struct {
        const char *name, *body;
    } formats[] = {
        {"date", "\"\\\"\" format-date \"\\\"\""},
        {"time", "\"\\\"\" format-time \"\\\"\""},
        {"date-time", "\"\\\"\" format-date \"T\" format-time \"\\\"\""},
        {"uuid", "\"\\\"\" [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12} \"\\\"\""},
        {"email", "\"\\\"\" [a-zA-Z0-9_+-]+ (\".\" [a-zA-Z0-9_+-]+)* \"@\" format-label (\".\" format-label)+ \"\\\"\""},
    };
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        if (strcmp(format, formats[i].name) != 0) continue;
        char name[64];
        em_schema_rule_name(w, format, name);
        fprintf(w->out, "%s ::= %s\n", name, formats[i].body);
        if (i == 0 || i == 2) em_schema_write_once(w, EM_SCHEMA_DATE_RULE, DATE_RULE);
        if (i == 1 || i == 2) em_schema_write_once(w, EM_SCHEMA_TIME_RULE, TIME_RULE);
        if (i == 4) em_schema_write_once(w, EM_SCHEMA_LABEL_RULE, "format-label ::= [a-zA-Z0-9] ([a-zA-Z0-9-]{0,20} [a-zA-Z0-9])?\n");
        fputs(name, f);
        return true;
    }
    return em_schema_fail(w, EM_ERR_UNSUPPORTED, "format \"%s\" is not supported (date, time, date-time, uuid, email are)", format);
}
