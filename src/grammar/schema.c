/* JSON Schema → GBNF (grammar.h).
 *
 * Supported: `type` (one or a list), `enum`, `const`, `properties`, `required`,
 * `additionalProperties` (false, true or a schema), `items`, `prefixItems`, `minItems`, `maxItems`,
 * `minLength`, `maxLength`, `pattern` (the subset in pattern.c), `format` (date, time, date-time,
 * uuid, email), integer and number bounds (`minimum`, `maximum`, `exclusiveMinimum`,
 * `exclusiveMaximum`), `anyOf`, `oneOf`, `allOf` of one schema, `$ref` to `#` or a JSON pointer
 * into the document (`$defs`, `definitions`; recursion allowed), `uniqueItems: false`, and the
 * annotations that constrain nothing (`title`, `description`, `$schema`, `$id`, `$comment`,
 * `examples`, `default`, `deprecated`, `readOnly`, `writeOnly`). Any other keyword is an error
 * naming it and its place, never dropped.
 *
 * Requests send schemas, so their cost is bounded: nesting deeper than EM_SCHEMA_MAX_DEPTH is
 * refused (the converter recurses), every 16 levels of nesting the text goes into a rule of its
 * own (so the GBNF's groups stay shallow), `$ref` targets are converted one after the other from a
 * queue (a chain of references costs rules, not stack), and choices among literals (`enum`,
 * `anyOf` of `const`s, an object's property names) are tries (choice.c), which the automaton
 * follows with one parse stack per distinct next byte.
 *
 * The grammar describes a subset of what the schema allows, always inside it:
 *  - properties come in the schema's order, required ones always, optional ones maybe;
 *    `additionalProperties` absent means none are written (a schema keyword absent allows them,
 *    but an output without them is still valid); extra properties, when allowed, may repeat a
 *    listed name only by chance of the model;
 *  - `oneOf` is generated as `anyOf`: alternatives that overlap can produce a value that matches
 *    more than one (write disjoint alternatives);
 *  - numbers with bounds have no exponent and up to 6 fraction digits; integers stay within 18
 *    digits; February has 28 days in dates;
 *  - whitespace between tokens is at most one space.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "schema.h"

/* The rules every converted schema may use. */
static const char *BASE_RULES =
    "ws ::= | \" \"\n"
    "char-plain ::= [^\"\\\\\\x00-\\x1F\\x7F]\n"
    "char ::= char-plain | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,17})\n"
    "number ::= integer (\".\" [0-9]{1,16})? ([eE] [-+]? [1-9] [0-9]{0,1})?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "value ::= object | array | string | number | boolean | null\n"
    "member ::= string ws \":\" ws value\n"
    "object ::= \"{\" ws (member ws (\",\" ws member ws)*)? \"}\"\n"
    "array ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"\n";

void em_schema_rule_name(em_schema_writer *w, const char *stem, char name[64]) {
    size_t n = 0;
    for (const char *c = stem; *c && n < 40; c++)
        name[n++] = ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')) ? *c : '-';
    if (!n) name[n++] = 'x';
    snprintf(name + n, 64 - n, "-%u", w->next_rule++);
}

void em_schema_write_literal(FILE *f, const char *bytes, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)bytes[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7F) fprintf(f, "\\x%02X", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

bool em_schema_spend(em_schema_writer *w) {
    if (em_grammar_budget_spend(w->budget)) return true;
    if (!w->err) w->err = em_grammar_budget_error(w->budget);
    return false;
}

bool em_schema_fail(em_schema_writer *w, em_err_code code, const char *fmt, ...) {
    if (w->err) return false;
    char what[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(what, sizeof what, fmt, args);
    va_end(args);
    /* A deep path is shortened in its middle, so the message still says what was wrong. */
    const char *path = w->path[0] ? w->path : "/";
    const size_t len = strlen(path);
    if (len > 160) w->err = em_errorf(code, "json schema at '%.60s...%s': %s", path, path + len - 90, what);
    else w->err = em_errorf(code, "json schema at '%s': %s", path, what);
    return false;
}

/* Appends "/segment" to the path (JSON pointer escaping); returns the length to restore. */
static size_t push_path(em_schema_writer *w, const char *segment) {
    size_t mark = strlen(w->path), n = mark;
    if (n + 1 < sizeof w->path) w->path[n++] = '/';
    for (const char *c = segment; *c && n + 2 < sizeof w->path; c++) {
        if (*c == '~' || *c == '/') {
            w->path[n++] = '~';
            w->path[n++] = *c == '~' ? '0' : '1';
        } else {
            w->path[n++] = *c;
        }
    }
    w->path[n] = '\0';
    return mark;
}
static void pop_path(em_schema_writer *w, size_t mark) { w->path[mark] = '\0'; }

/* A JSON value, compact, as a GBNF literal. */
static bool write_json_literal(em_schema_writer *w, const json_t *value, FILE *f) {
    char *text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
    em_schema_write_literal(f, text, strlen(text));
    free(text);
    return true;
}

static bool visit(em_schema_writer *w, json_t *schema, FILE *f);

/* Writes a choice among JSON values (compact, as write_json_literal writes one) as a trie. */
static bool write_literal_choice(em_schema_writer *w, json_t *values, FILE *f) {
    em_schema_choice *choice = em_schema_choice_new(w, "enum");
    if (!choice) return em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
    uint32_t version = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < json_array_size(values); i++) {
        char *text = json_dumps(json_array_get(values, i), JSON_COMPACT | JSON_ENCODE_ANY);
        ok = text && em_schema_choice_add(choice, version, text, strlen(text), NULL, &version);
        free(text);
        if (!ok) em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
    }
    char name[64];
    ok = ok && em_schema_choice_write(choice, w, version, name);
    em_schema_choice_free(choice);
    if (ok) fputs(name, f);
    return ok;
}

/* ---- Integers in ranges ---- */

/* Digit strings of length n from lo to hi (same length, leading zeros allowed). */
static void write_fixed_width(FILE *f, const char *lo, const char *hi, size_t n) {
    if (!n) {
        fputs("\"\"", f);
        return;
    }
    if (lo[0] == hi[0]) {
        fprintf(f, "\"%c\" ", lo[0]);
        write_fixed_width(f, lo + 1, hi + 1, n - 1);
        return;
    }
    bool lo_rest_zero = strspn(lo + 1, "0") == n - 1, hi_rest_nine = strspn(hi + 1, "9") == n - 1;
    char start = lo_rest_zero ? lo[0] : (char)(lo[0] + 1), end = hi_rest_nine ? hi[0] : (char)(hi[0] - 1);
    char nines[24], zeros[24];
    memset(nines, '9', n - 1);
    memset(zeros, '0', n - 1);
    nines[n - 1] = zeros[n - 1] = '\0';
    const char *sep = "";
    fputc('(', f);
    if (!lo_rest_zero) {
        fprintf(f, "\"%c\" ", lo[0]);
        write_fixed_width(f, lo + 1, nines, n - 1);
        sep = " | ";
    }
    if (start <= end) {
        fprintf(f, "%s[%c-%c]", sep, start, end);
        if (n > 1) fprintf(f, " [0-9]{%zu}", n - 1);
        sep = " | ";
    }
    if (!hi_rest_nine) {
        fprintf(f, "%s\"%c\" ", sep, hi[0]);
        write_fixed_width(f, zeros, hi + 1, n - 1);
    }
    fputc(')', f);
}

#define MAX_DIGITS 18
static const int64_t NO_BOUND = INT64_MAX;

/* Non-negative integers from lo to hi (hi NO_BOUND: no end), without leading zeros. */
static void write_natural_range(FILE *f, int64_t lo, int64_t hi) {
    char lo_text[24], hi_text[24];
    int lo_len = snprintf(lo_text, sizeof lo_text, "%lld", (long long)lo);
    int top_len = hi == NO_BOUND ? lo_len : snprintf(hi_text, sizeof hi_text, "%lld", (long long)hi);
    const char *sep = "";
    fputc('(', f);
    int64_t power = 1;
    for (int i = 1; i < lo_len; i++) power *= 10;
    for (int len = lo_len; len <= top_len; len++, power *= 10) {
        int64_t a = lo > (len == 1 ? 0 : power) ? lo : (len == 1 ? 0 : power);
        int64_t b = len >= MAX_DIGITS ? INT64_MAX : power * 10 - 1;
        if (hi != NO_BOUND && hi < b) b = hi;
        if (a > b) continue;
        char a_text[24], b_text[24];
        snprintf(a_text, sizeof a_text, "%lld", (long long)a);
        snprintf(b_text, sizeof b_text, "%lld", (long long)b);
        fputs(sep, f);
        write_fixed_width(f, a_text, b_text, (size_t)len);
        sep = " | ";
    }
    if (hi == NO_BOUND && lo_len < MAX_DIGITS) fprintf(f, "%s[1-9] [0-9]{%d,%d}", sep, lo_len, MAX_DIGITS - 1);
    fputc(')', f);
}

/* Integers from lo to hi; either may be NO_BOUND (-NO_BOUND below). */
static void write_integer_range(FILE *f, int64_t lo, int64_t hi) {
    const bool negatives = lo < 0, naturals = hi >= 0;
    fputc('(', f);
    if (negatives) { /* -v for v from max(1, -hi) to -lo */
        fputs("\"-\" ", f);
        write_natural_range(f, hi < 0 ? -hi : 1, lo == -NO_BOUND ? NO_BOUND : -lo);
    }
    if (negatives && naturals) fputs(" | ", f);
    if (naturals) write_natural_range(f, lo < 0 ? 0 : lo, hi);
    fputc(')', f);
}

/* Reads minimum / maximum / exclusive* into integer bounds for values of `type`: integers within
 * them, and for numbers the integer parts whose fractions stay within (see write_number). */
static bool read_bounds(em_schema_writer *w, json_t *schema, int64_t *lo, int64_t *hi) {
    *lo = -NO_BOUND;
    *hi = NO_BOUND;
    static const char *keys[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        json_t *v = json_object_get(schema, keys[k]);
        if (!v) continue;
        if (!json_is_number(v)) return em_schema_fail(w, EM_ERR_INVALID, "%s must be a number", keys[k]);
        double x = json_number_value(v);
        if (fabs(x) > 1e15) return em_schema_fail(w, EM_ERR_UNSUPPORTED, "%s %g is beyond the supported ±1e15", keys[k], x);
        int64_t bound = k < 2 ? (int64_t)(k == 0 ? ceil(x) : floor(x) + 1) : (int64_t)(k == 2 ? floor(x) : ceil(x) - 1);
        if (k < 2 && bound > *lo) *lo = bound;
        if (k >= 2 && bound < *hi) *hi = bound;
    }
    if (*lo != -NO_BOUND && *hi != NO_BOUND && *lo > *hi)
        return em_schema_fail(w, EM_ERR_INVALID, "no integer lies within the bounds");
    return true;
}

/* A number within integer bounds: an integer, or n.ddd where n.ddd stays inside (n + 1 <= hi
 * for n >= 0, n - 1 >= lo for n < 0). */
static void write_bounded_number(FILE *f, int64_t lo, int64_t hi) {
    fputc('(', f);
    write_integer_range(f, lo, hi);
    int64_t frac_lo = lo < 0 ? 0 : lo, frac_hi = hi == NO_BOUND ? NO_BOUND : hi - 1;
    if (frac_hi == NO_BOUND || frac_lo <= frac_hi) {
        fputs(" | ", f);
        write_natural_range(f, frac_lo, frac_hi);
        fputs(" \".\" [0-9]{1,6}", f);
    }
    if (lo < -1 || lo == -NO_BOUND) { /* -v.ddd for v from max(1, -hi) to -lo - 1 */
        int64_t v_lo = hi < 0 ? -hi : 1, v_hi = lo == -NO_BOUND ? NO_BOUND : -lo - 1;
        if (v_hi == NO_BOUND || v_lo <= v_hi) {
            fputs(" | \"-\" ", f);
            write_natural_range(f, v_lo, v_hi);
            fputs(" \".\" [0-9]{1,6}", f);
        }
    }
    fputc(')', f);
}

/* ---- Types ---- */

static bool read_count(em_schema_writer *w, json_t *schema, const char *key, long long *out) {
    json_t *v = json_object_get(schema, key);
    if (!v) return true;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 10000)
        return em_schema_fail(w, EM_ERR_INVALID, "%s must be an integer from 0 to 10000", key);
    *out = json_integer_value(v);
    return true;
}

static void write_repeat(FILE *f, long long min, long long max) {
    if (max < 0) fprintf(f, "{%lld,}", min);
    else fprintf(f, "{%lld,%lld}", min, max);
}

static bool write_string(em_schema_writer *w, json_t *schema, FILE *f) {
    json_t *format = json_object_get(schema, "format"), *pattern = json_object_get(schema, "pattern");
    long long min = 0, max = -1;
    if (!read_count(w, schema, "minLength", &min) || !read_count(w, schema, "maxLength", &max)) return false;
    if (max >= 0 && max < min) return em_schema_fail(w, EM_ERR_INVALID, "maxLength is below minLength");
    const bool lengths = min > 0 || max >= 0;
    if ((format != NULL) + (pattern != NULL) + lengths > 1)
        return em_schema_fail(w, EM_ERR_UNSUPPORTED, "pattern, format and minLength/maxLength cannot be combined");
    if (format) {
        if (!json_is_string(format)) return em_schema_fail(w, EM_ERR_INVALID, "format must be a string");
        size_t mark = push_path(w, "format");
        bool ok = em_schema_format(w, json_string_value(format), f);
        pop_path(w, mark);
        return ok;
    }
    if (pattern) {
        if (!json_is_string(pattern)) return em_schema_fail(w, EM_ERR_INVALID, "pattern must be a string");
        size_t mark = push_path(w, "pattern");
        fputs("(\"\\\"\" ", f);
        bool ok = em_schema_pattern(w, json_string_value(pattern), f);
        fputs(" \"\\\"\")", f);
        pop_path(w, mark);
        return ok;
    }
    if (!lengths) {
        fputs("string", f);
        return true;
    }
    fputs("(\"\\\"\" char", f);
    write_repeat(f, min, max);
    fputs(" \"\\\"\")", f);
    return true;
}

static bool write_array(em_schema_writer *w, json_t *schema, FILE *f) {
    long long min = 0, max = -1;
    if (!read_count(w, schema, "minItems", &min) || !read_count(w, schema, "maxItems", &max)) return false;
    if (max >= 0 && max < min) return em_schema_fail(w, EM_ERR_INVALID, "maxItems is below minItems");
    json_t *items = json_object_get(schema, "items"), *prefix = json_object_get(schema, "prefixItems");
    if (prefix) { /* a tuple: exactly the listed items (more would be allowed; none is still valid) */
        if (!json_is_array(prefix) || !json_array_size(prefix)) return em_schema_fail(w, EM_ERR_INVALID, "prefixItems must be a non-empty array");
        if (min > (long long)json_array_size(prefix) || (max >= 0 && max < (long long)json_array_size(prefix)))
            return em_schema_fail(w, EM_ERR_UNSUPPORTED, "minItems/maxItems other than the prefixItems count");
        size_t mark = push_path(w, "prefixItems");
        fputs("(\"[\" ws", f);
        for (size_t i = 0; i < json_array_size(prefix); i++) {
            char index[24];
            snprintf(index, sizeof index, "%zu", i);
            size_t inner = push_path(w, index);
            fputs(i ? " \",\" ws " : " ", f);
            bool ok = visit(w, json_array_get(prefix, i), f);
            pop_path(w, inner);
            if (!ok) return false;
            fputs(" ws", f);
        }
        fputs(" \"]\")", f);
        pop_path(w, mark);
        return true;
    }
    char item[64];
    em_schema_rule_name(w, "item", item);
    char *body = NULL;
    size_t body_len = 0;
    FILE *b = open_memstream(&body, &body_len);
    if (!b) return em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
    size_t mark = push_path(w, "items");
    bool ok = items ? visit(w, items, b) : (fputs("value", b), true);
    pop_path(w, mark);
    fclose(b);
    if (ok) fprintf(w->out, "%s ::= %s\n", item, body);
    free(body);
    if (!ok) return false;
    if (max == 0) {
        fputs("(\"[\" ws \"]\")", f);
        return true;
    }
    fprintf(f, "(\"[\" ws %s%s ws (\",\" ws %s ws)", min ? "" : "(", item, item);
    write_repeat(f, min ? min - 1 : 0, max < 0 ? -1 : max - 1);
    fprintf(f, "%s \"]\")", min ? "" : ")?");
    return true;
}

/* ws ":" ws value, for property `name` of `properties` (its name comes from the trie of names). */
static bool write_member(em_schema_writer *w, const char *name, json_t *schema, FILE *f) {
    fputs("ws \":\" ws ", f);
    size_t mark = push_path(w, name);
    bool ok = visit(w, schema, f);
    pop_path(w, mark);
    return ok;
}

/* The members of an object, from the schema's properties (names[k] the rule of property k's value,
 * keys[k] its name), after the opening brace: in the schema's order, required ones always,
 * optional ones maybe, then any number of extra ones (rule `extra`, "" for none). after-k: members
 * k.. once something was written (each with its comma); start-k: members k.. while nothing was.
 * Which member comes next is a choice among the names of those that may (the optional ones up to
 * the next required one): a trie per k, each the previous one plus one name (choice.c), so that
 * hundreds of optional properties cost one parse stack per distinct next byte, not one each. */
static bool write_members(em_schema_writer *w, size_t n, char (*names)[64], const char *const *keys, const bool *is_required,
                          const char *extra, FILE *f) {
    char (*after)[64] = calloc(2 * (n + 1), sizeof *after);
    char (*start)[64] = after ? after + n + 1 : NULL;
    uint32_t *version = calloc(n + 1, sizeof *version);
    em_schema_choice *choice = em_schema_choice_new(w, "names");
    bool ok = after && version && choice;
    if (!ok) em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
    for (size_t k = 0; ok && k <= n; k++) {
        em_schema_rule_name(w, "after", after[k]);
        em_schema_rule_name(w, "start", start[k]);
    }
    if (ok && *extra) {
        fprintf(w->out, "%s ::= (\",\" ws %s ws)*\n", after[n], extra);
        fprintf(w->out, "%s ::= (%s ws %s)?\n", start[n], extra, after[n]);
    } else if (ok) { /* "": an empty body would run into the next line */
        fprintf(w->out, "%s ::= \"\"\n%s ::= \"\"\n", after[n], start[n]);
    }
    bool rest_optional = true; /* members k.. are all optional */
    for (size_t k = n; ok && k-- > 0;) {
        if (!(ok = em_schema_spend(w))) break;
        char tail[64], trie[64];
        em_schema_rule_name(w, "member", tail); /* the value of k, then what may follow it */
        fprintf(w->out, "%s ::= %s ws %s\n", tail, names[k], after[k + 1]);
        json_t *key = json_string(keys[k]);
        char *quoted = key ? json_dumps(key, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(key);
        ok = quoted && em_schema_choice_add(choice, is_required[k] ? 0 : version[k + 1], quoted, strlen(quoted), tail, &version[k]);
        free(quoted);
        if (!ok) {
            em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
            break;
        }
        rest_optional &= !is_required[k];
        ok = em_schema_choice_write(choice, w, version[k], trie);
        if (!ok) break;
        fprintf(w->out, "%s ::= \",\" ws %s%s%s\n", after[k], trie, rest_optional ? " | " : "", rest_optional ? after[n] : "");
        fprintf(w->out, "%s ::= %s%s%s\n", start[k], trie, rest_optional ? " | " : "", rest_optional ? start[n] : "");
    }
    if (ok) fprintf(f, "(\"{\" ws %s \"}\")", start[0]);
    free(after);
    free(version);
    em_schema_choice_free(choice);
    return ok;
}

static bool write_object(em_schema_writer *w, json_t *schema, FILE *f) {
    json_t *properties = json_object_get(schema, "properties"), *required = json_object_get(schema, "required");
    json_t *additional = json_object_get(schema, "additionalProperties");
    if (properties && !json_is_object(properties)) return em_schema_fail(w, EM_ERR_INVALID, "properties must be an object");
    if (required && !json_is_array(required)) return em_schema_fail(w, EM_ERR_INVALID, "required must be an array");
    if (additional && !json_is_boolean(additional) && !json_is_object(additional))
        return em_schema_fail(w, EM_ERR_INVALID, "additionalProperties must be a boolean or a schema");
    if (!properties && !additional) {
        fputs("object", f);
        return true;
    }
    json_t *required_set = json_object(); /* the required names, found by hash */
    if (!required_set) return em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; required && i < json_array_size(required); i++) {
        json_t *name = json_array_get(required, i);
        bool ok = json_is_string(name) ? true : em_schema_fail(w, EM_ERR_INVALID, "required lists a non-string");
        if (ok && !json_object_get(properties, json_string_value(name)))
            ok = em_schema_fail(w, EM_ERR_UNSUPPORTED, "required property \"%s\" has no schema in properties", json_string_value(name));
        if (ok && json_object_set(required_set, json_string_value(name), json_true())) ok = em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
        if (!ok) {
            json_decref(required_set);
            return false;
        }
    }
    /* Each member's value as a rule, in the schema's order. */
    size_t n = properties ? json_object_size(properties) : 0;
    if (w->next_rule + w->trie_rules + 6 * n > EM_GRAMMAR_MAX_RULES) { /* a property costs four rules and one or two of the trie */
        json_decref(required_set);
        return em_schema_fail(w, EM_ERR_INVALID, "an object of %zu properties needs more than %d rules (the limit)", n,
                              EM_GRAMMAR_MAX_RULES);
    }
    char (*names)[64] = calloc(n + 1, sizeof *names);
    bool *is_required = calloc(n + 1, sizeof *is_required);
    const char **keys = calloc(n + 1, sizeof *keys);
    if (!names || !is_required || !keys) {
        free(names);
        free(is_required);
        free(keys);
        json_decref(required_set);
        return em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
    }
    bool ok = true;
    size_t i = 0, mark = push_path(w, "properties");
    const char *key;
    json_t *value;
    json_object_foreach(properties, key, value) {
        is_required[i] = json_object_get(required_set, key) != NULL;
        keys[i] = key;
        em_schema_rule_name(w, key, names[i]);
        char *body = NULL;
        size_t body_len = 0;
        FILE *b = open_memstream(&body, &body_len);
        ok = b && write_member(w, key, value, b);
        if (b) fclose(b);
        if (ok) fprintf(w->out, "%s ::= %s\n", names[i], body);
        free(body);
        if (!ok) break;
        i++;
    }
    pop_path(w, mark);
    const bool has_extra = additional && !json_is_false(additional);
    char extra[64] = "";
    if (ok && has_extra) { /* string ws ":" ws value-of-additionalProperties */
        em_schema_rule_name(w, "extra", extra);
        char *body = NULL;
        size_t body_len = 0;
        FILE *b = open_memstream(&body, &body_len);
        mark = push_path(w, "additionalProperties");
        ok = b != NULL;
        if (ok) {
            fputs("string ws \":\" ws ", b);
            ok = json_is_true(additional) ? (fputs("value", b), true) : visit(w, additional, b);
            fclose(b);
        }
        pop_path(w, mark);
        if (ok) fprintf(w->out, "%s ::= %s\n", extra, body);
        free(body);
    }
    if (ok) ok = write_members(w, n, names, keys, is_required, extra, f);
    free(names);
    free(is_required);
    free(keys);
    json_decref(required_set);
    return ok;
}

/* ---- Keywords ---- */

static const char *const SUPPORTED[] = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "uniqueItems", "title",
    "description", "$schema", "$id", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly",
};
static const char *const ANNOTATIONS[] = {"$defs", "definitions", "title", "description", "$schema", "$id",
                                          "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly"};

static bool in_list(const char *key, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, list[i]) == 0) return true;
    return false;
}

/* Only annotations beside `keyword` (anyOf, $ref, enum, ...), which decides alone. */
static bool alone(em_schema_writer *w, json_t *schema, const char *keyword) {
    const char *key;
    json_t *value;
    json_object_foreach(schema, key, value) {
        if (strcmp(key, keyword) == 0 || in_list(key, ANNOTATIONS, sizeof ANNOTATIONS / sizeof *ANNOTATIONS)) continue;
        if (strcmp(key, "type") == 0 && (!strcmp(keyword, "enum") || !strcmp(keyword, "const"))) continue;
        return em_schema_fail(w, EM_ERR_UNSUPPORTED, "\"%s\" beside \"%s\" is not supported", key, keyword);
    }
    return true;
}

static json_t *resolve_pointer(json_t *root, const char *ref) {
    if (strcmp(ref, "#") == 0) return root;
    if (strncmp(ref, "#/", 2) != 0) return NULL;
    json_t *at = root;
    for (const char *p = ref + 2; at && *p;) {
        char segment[256];
        size_t n = 0;
        for (; *p && *p != '/' && n + 1 < sizeof segment; p++) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) segment[n++] = p[1] == '0' ? '~' : '/', p++;
            else segment[n++] = *p;
        }
        segment[n] = '\0';
        if (*p == '/') p++;
        at = json_is_array(at) ? json_array_get(at, strtoul(segment, NULL, 10)) : json_object_get(at, segment);
    }
    return at;
}

static bool write_ref(em_schema_writer *w, json_t *schema, FILE *f) {
    json_t *ref = json_object_get(schema, "$ref");
    if (!json_is_string(ref)) return em_schema_fail(w, EM_ERR_INVALID, "$ref must be a string");
    const char *target = json_string_value(ref);
    json_t *known = json_object_get(w->ref_rules, target);
    if (known) {
        fputs(json_string_value(known), f);
        return true;
    }
    if (!resolve_pointer(w->root, target))
        return em_schema_fail(w, EM_ERR_UNSUPPORTED, "$ref \"%s\" does not point into this document", target);
    char name[64];
    em_schema_rule_name(w, strrchr(target, '/') ? strrchr(target, '/') + 1 : "self", name);
    if (json_object_set_new(w->ref_rules, target, json_string(name)) || json_array_append_new(w->ref_queue, json_string(target)))
        return em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
    fputs(name, f); /* its rule is written from the queue (write_queued_refs) */
    return true;
}

/* Appends to `values` the values of a schema that is only a `const` or an `enum` (annotations and
 * `type` aside); false for any other schema. */
static bool literal_values(json_t *schema, json_t *values) {
    if (!json_is_object(schema)) return false;
    json_t *value = json_object_get(schema, "const"), *choices = json_object_get(schema, "enum");
    if (!value == !choices || (choices && (!json_is_array(choices) || !json_array_size(choices)))) return false;
    const char *key;
    json_t *v;
    json_object_foreach(schema, key, v) {
        if (strcmp(key, "const") && strcmp(key, "enum") && strcmp(key, "type") &&
            !in_list(key, ANNOTATIONS, sizeof ANNOTATIONS / sizeof *ANNOTATIONS))
            return false;
    }
    return value ? json_array_append(values, value) == 0 : json_array_extend(values, choices) == 0;
}

static bool write_alternatives(em_schema_writer *w, json_t *schema, const char *keyword, FILE *f) {
    json_t *list = json_object_get(schema, keyword);
    if (!json_is_array(list) || !json_array_size(list)) return em_schema_fail(w, EM_ERR_INVALID, "%s must be a non-empty array", keyword);
    if (!strcmp(keyword, "allOf") && json_array_size(list) != 1)
        return em_schema_fail(w, EM_ERR_UNSUPPORTED, "allOf of more than one schema");
    json_t *values = json_array(); /* alternatives that are all literals: one trie of them */
    bool literals = values != NULL;
    for (size_t i = 0; literals && i < json_array_size(list); i++) literals = literal_values(json_array_get(list, i), values);
    if (literals) {
        size_t mark = push_path(w, keyword);
        bool ok = write_literal_choice(w, values, f);
        pop_path(w, mark);
        json_decref(values);
        return ok;
    }
    json_decref(values);
    /* Each alternative is at least one parse stack wherever the choice is entered: past the bound
     * the grammar could not be followed there, so refuse it now rather than mid-answer. */
    if (json_array_size(list) > EM_GRAMMAR_MAX_STACKS)
        return em_schema_fail(w, EM_ERR_INVALID,
                              "%s of %zu alternatives that are not all literals: more than %d parse stacks at once (the limit)",
                              keyword, json_array_size(list), EM_GRAMMAR_MAX_STACKS);
    size_t mark = push_path(w, keyword);
    fputc('(', f);
    for (size_t i = 0; i < json_array_size(list); i++) {
        char index[24];
        snprintf(index, sizeof index, "%zu", i);
        size_t inner = push_path(w, index);
        if (i) fputs(" | ", f);
        bool ok = visit(w, json_array_get(list, i), f);
        pop_path(w, inner);
        if (!ok) return false;
    }
    fputc(')', f);
    pop_path(w, mark);
    return true;
}

/* The schema with one type, by the type's name. */
static bool write_typed(em_schema_writer *w, json_t *schema, const char *type, FILE *f) {
    int64_t lo, hi;
    if (!strcmp(type, "string")) return write_string(w, schema, f);
    if (!strcmp(type, "object")) return write_object(w, schema, f);
    if (!strcmp(type, "array")) return write_array(w, schema, f);
    if (!strcmp(type, "boolean")) return fputs("boolean", f), true;
    if (!strcmp(type, "null")) return fputs("null", f), true;
    if (!strcmp(type, "integer") || !strcmp(type, "number")) {
        if (!read_bounds(w, schema, &lo, &hi)) return false;
        if (lo == -NO_BOUND && hi == NO_BOUND) return fputs(type, f), true;
        if (!strcmp(type, "integer")) write_integer_range(f, lo, hi);
        else write_bounded_number(f, lo, hi);
        return true;
    }
    return em_schema_fail(w, EM_ERR_INVALID, "unknown type \"%s\"", type);
}

/* The type a schema without `type` describes, from its keywords ("any" when nothing says). */
static const char *implied_type(json_t *schema) {
    if (json_object_get(schema, "properties") || json_object_get(schema, "additionalProperties")) return "object";
    if (json_object_get(schema, "items") || json_object_get(schema, "prefixItems") || json_object_get(schema, "minItems") ||
        json_object_get(schema, "maxItems"))
        return "array";
    if (json_object_get(schema, "pattern") || json_object_get(schema, "format") || json_object_get(schema, "minLength") ||
        json_object_get(schema, "maxLength"))
        return "string";
    if (json_object_get(schema, "minimum") || json_object_get(schema, "maximum") ||
        json_object_get(schema, "exclusiveMinimum") || json_object_get(schema, "exclusiveMaximum"))
        return "number";
    return NULL;
}

static bool visit_keywords(em_schema_writer *w, json_t *schema, FILE *f) {
    if (json_is_true(schema)) return fputs("value", f), true;
    if (json_is_false(schema)) return em_schema_fail(w, EM_ERR_UNSUPPORTED, "the schema false allows nothing");
    if (!json_is_object(schema)) return em_schema_fail(w, EM_ERR_INVALID, "a schema must be an object or a boolean");
    const char *key;
    json_t *value;
    json_object_foreach(schema, key, value) {
        if (!in_list(key, SUPPORTED, sizeof SUPPORTED / sizeof *SUPPORTED))
            return em_schema_fail(w, EM_ERR_UNSUPPORTED, "keyword \"%s\" is not supported", key);
    }
    json_t *unique = json_object_get(schema, "uniqueItems");
    if (unique && !json_is_false(unique)) return em_schema_fail(w, EM_ERR_UNSUPPORTED, "keyword \"uniqueItems\" (true) is not supported");
    if (json_object_get(schema, "$ref")) return alone(w, schema, "$ref") && write_ref(w, schema, f);
    static const char *const combinators[] = {"anyOf", "oneOf", "allOf"};
    for (int i = 0; i < 3; i++)
        if (json_object_get(schema, combinators[i]))
            return alone(w, schema, combinators[i]) && write_alternatives(w, schema, combinators[i], f);
    if (json_object_get(schema, "const")) return alone(w, schema, "const") && write_json_literal(w, json_object_get(schema, "const"), f);
    json_t *choices = json_object_get(schema, "enum");
    if (choices) {
        if (!alone(w, schema, "enum")) return false;
        if (!json_is_array(choices) || !json_array_size(choices)) return em_schema_fail(w, EM_ERR_INVALID, "enum must be a non-empty array");
        return write_literal_choice(w, choices, f);
    }
    json_t *type = json_object_get(schema, "type");
    if (json_is_string(type)) return write_typed(w, schema, json_string_value(type), f);
    if (json_is_array(type) && json_array_size(type)) {
        fputc('(', f);
        for (size_t i = 0; i < json_array_size(type); i++) {
            if (i) fputs(" | ", f);
            if (!json_is_string(json_array_get(type, i))) return em_schema_fail(w, EM_ERR_INVALID, "type lists a non-string");
            if (!write_typed(w, schema, json_string_value(json_array_get(type, i)), f)) return false;
        }
        fputc(')', f);
        return true;
    }
    if (type) return em_schema_fail(w, EM_ERR_INVALID, "type must be a string or a non-empty array");
    const char *implied = implied_type(schema);
    return implied ? write_typed(w, schema, implied, f) : (fputs("value", f), true);
}

/* Converts `schema` at one more level of nesting: refused past EM_SCHEMA_MAX_DEPTH; every 16
 * levels its text goes into a rule of its own, so that no rule's groups nest deeper than 16
 * schemas' worth (grammar.h's EM_GRAMMAR_MAX_NESTING bounds those). */
static bool visit(em_schema_writer *w, json_t *schema, FILE *f) {
    if (!em_schema_spend(w)) return false;
    if (w->depth >= EM_SCHEMA_MAX_DEPTH)
        return em_schema_fail(w, EM_ERR_INVALID, "schemas nested deeper than %d levels (the limit)", EM_SCHEMA_MAX_DEPTH);
    if (w->next_rule + w->trie_rules > EM_GRAMMAR_MAX_RULES) /* the compiler would refuse it: stop converting now */
        return em_schema_fail(w, EM_ERR_INVALID, "more than %d rules (the limit)", EM_GRAMMAR_MAX_RULES);
    w->depth++;
    bool ok;
    if (w->depth % 16) {
        ok = visit_keywords(w, schema, f);
    } else {
        char name[64], *body = NULL;
        size_t body_len = 0;
        em_schema_rule_name(w, "nested", name);
        FILE *b = open_memstream(&body, &body_len);
        ok = b ? visit_keywords(w, schema, b) : em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
        if (b) fclose(b);
        if (ok) fprintf(w->out, "%s ::= %s\n", name, body);
        if (ok) fputs(name, f);
        free(body);
    }
    w->depth--;
    return ok;
}

/* The rules of the `$ref` targets met so far, each converted on its own (from depth 0, its path
 * the pointer): references met meanwhile join the queue, so this ends when every target has its
 * rule, and a chain of references never deepens the stack. */
static bool write_queued_refs(em_schema_writer *w) {
    for (size_t i = 0; i < json_array_size(w->ref_queue); i++) {
        const char *target = json_string_value(json_array_get(w->ref_queue, i));
        const char *name = json_string_value(json_object_get(w->ref_rules, target));
        json_t *resolved = resolve_pointer(w->root, target);
        char *body = NULL;
        size_t body_len = 0;
        FILE *b = open_memstream(&body, &body_len);
        if (!b || !name) {
            if (b) fclose(b);
            free(body);
            return em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
        }
        snprintf(w->path, sizeof w->path, "%s", target + 1);
        w->depth = 0;
        bool ok = visit(w, resolved, b);
        fclose(b);
        if (ok) fprintf(w->out, "%s ::= %s\n", name, body);
        free(body);
        if (!ok) return false;
    }
    return true;
}

em_err em_grammar_from_json_schema(const char *schema, size_t len, char **gbnf) {
    return em_grammar_schema_budgeted(schema, len, NULL, gbnf);
}

em_err em_grammar_schema_budgeted(const char *schema, size_t len, em_grammar_budget *budget, char **gbnf) {
    *gbnf = NULL;
    json_error_t parse_error;
    json_t *root = NULL;
    if (schema) {
        root = json_loadb(schema, len, JSON_DECODE_ANY, &parse_error);
        if (!root) return em_errorf(EM_ERR_INVALID, "json schema: %s at line %d, column %d", parse_error.text, parse_error.line, parse_error.column);
    }
    char *text = NULL;
    size_t text_len = 0;
    em_schema_writer w = {.root = root, .ref_rules = json_object(), .ref_queue = json_array(), .budget = budget};
    w.out = open_memstream(&text, &text_len);
    if (!w.out || !w.ref_rules || !w.ref_queue) {
        if (w.out) fclose(w.out);
        free(text);
        json_decref(root);
        json_decref(w.ref_rules);
        json_decref(w.ref_queue);
        return em_errorf(EM_ERR_NOMEM, "json schema: out of memory");
    }
    char *body = NULL;
    size_t body_len = 0;
    FILE *b = open_memstream(&body, &body_len);
    bool ok = b && (root ? visit(&w, root, b) : (fputs("object", b), true));
    if (b) fclose(b);
    if (ok) fprintf(w.out, "root ::= %s\n", body);
    free(body);
    ok = ok && write_queued_refs(&w);
    fputs(BASE_RULES, w.out);
    fclose(w.out);
    json_decref(root);
    json_decref(w.ref_rules);
    json_decref(w.ref_queue);
    if (!ok) {
        free(text);
        return w.err ? w.err : em_errorf(EM_ERR_NOMEM, "json schema: out of memory");
    }
    *gbnf = text;
    return NULL;
}
