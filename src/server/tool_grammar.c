/* The grammars the server builds for a chat answer: a forced tool call (tool_choice required / any
 * / a named tool) in the call format of the model's template, the lazy grammar that constrains a
 * call once the model opens one (`auto`), and a `<think>` section ahead of any of them (and of a
 * response_format) when the template reasons.
 *
 * Formats (em_tool_format): Hermes `<tool_call>\n{"name", "arguments"}\n</tool_call>`; Llama 3
 * `{"name", "parameters"}`; Mistral `[TOOL_CALLS][{"name", "arguments"}]` or, in its newer
 * templates, `[TOOL_CALLS]name[ARGS]{...}`; the JSON fallback {"name", "arguments"}. A forced
 * answer is one call (parallel_tool_calls is accepted; one call is a valid answer under it). With
 * `auto`, the formats that open with a marker get a lazy grammar switched on by it (Llama's marker
 * is the call's own `{"name"`), so the text before a call stays free.
 *
 * Reasoning: when the template writes `<think>` sections, every grammar made here lets the answer
 * begin with one (`<think>`, any text without `</think>`, `</think>`), or, when the prompt already
 * opened it, begin inside one. The lazy grammar cannot see where thinking ends (a `<tool_call>`
 * inside the reasoning would switch it on), so for a model that reasons `auto` becomes a whole-answer
 * grammar instead: thinking, free text without the format's marker, then optionally the call. A
 * client's raw `grammar` is left as it is (it speaks for the whole output).
 *
 * Harmony (gpt-oss) answers are messages with channels: harmony_grammar builds theirs. Gemma 4
 * writes its calls' arguments in a syntax of its own (gemma4.c), so gemma4_grammar builds their
 * rules from the tools' schemas itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../grammar/grammar.h"
#include "internal.h"

static bool oom(em_server_error *err) {
    em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
    return false;
}

/* ---- GBNF text helpers ---- */

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* `gbnf` with every rule name (definitions and references) prefixed, so that several grammars
 * can live in one text; literals, classes, repetition counts and comments are left alone. */
static char *prefix_rules(const char *gbnf, const char *prefix) {
    em_buf out = {0};
    const char *s = gbnf;
    bool ok = true;
    while (ok && *s) {
        const char *start = s;
        if (*s == '"' || *s == '[') {
            const char close = *s == '"' ? '"' : ']';
            for (s++; *s && *s != close; s++)
                if (*s == '\\' && s[1]) s++;
            if (*s) s++;
        } else if (*s == '{') {
            while (*s && *s != '}') s++;
            if (*s) s++;
        } else if (*s == '#') {
            while (*s && *s != '\n') s++;
        } else if (is_name_char(*s)) {
            while (is_name_char(*s)) s++;
            ok = em_buf_printf(&out, "%s", prefix);
        } else {
            s++;
        }
        ok = ok && em_buf_append(&out, start, (size_t)(s - start));
    }
    if (!ok || !out.data) {
        em_buf_free(&out);
        return NULL;
    }
    return out.data;
}

/* Rules NAME-0 .. NAME-(m-1) for any text that does not contain `marker` (m bytes, ASCII): state k
 * is "the text ends with the first k bytes of the marker", the automaton of a substring search;
 * a byte that would complete the marker has no rule. NAME-0 is the start; every state may end. */
static bool exclusion_rules(em_buf *out, const char *name, const char *marker) {
    const size_t m = strlen(marker);
    char distinct[64] = {0};
    size_t n_distinct = 0;
    for (size_t i = 0; i < m && n_distinct < sizeof distinct - 1; i++)
        if (!memchr(distinct, marker[i], n_distinct)) distinct[n_distinct++] = marker[i];
    bool ok = true;
    for (size_t k = 0; ok && k < m; k++) {
        ok = em_buf_printf(out, "%s-%zu ::= | [^", name, k);
        for (size_t d = 0; ok && d < n_distinct; d++) ok = em_buf_printf(out, "\\x%02X", (unsigned char)distinct[d]);
        ok = ok && em_buf_printf(out, "] %s-0", name);
        for (size_t d = 0; ok && d < n_distinct; d++) {
            /* the longest prefix of the marker that ends the text marker[0..k) + c */
            char text[64];
            memcpy(text, marker, k);
            text[k] = distinct[d];
            size_t next = k + 1 < m + 1 ? k + 1 : m;
            while (next && memcmp(text + k + 1 - next, marker, next)) next--;
            if (next == m) continue;
            ok = em_buf_printf(out, " | \"\\x%02X\" %s-%zu", (unsigned char)distinct[d], name, next);
        }
        ok = ok && em_buf_printf(out, "\n");
    }
    return ok;
}

/* A literal of `text` in GBNF. */
static bool literal(em_buf *out, const char *text) {
    bool ok = em_buf_printf(out, "\"");
    for (const char *c = text; ok && *c; c++) ok = em_buf_printf(out, "\\x%02X", (unsigned char)*c);
    return ok && em_buf_printf(out, "\"");
}

/* ---- Calls ---- */

/* {"name": NAME, KEY: PARAMETERS} for one tool, as a JSON schema. */
static json_t *call_schema(const json_t *tool, const char *arguments_key) {
    json_t *function = json_object_get(tool, "function");
    return json_pack("{s:s, s:{s:{s:O}, s:O}, s:[s, s], s:b}", "type", "object", "properties", "name", "const",
                     json_object_get(function, "name"), arguments_key, json_object_get(function, "parameters"),
                     "required", "name", arguments_key, "additionalProperties", 0);
}

/* A schema's grammar with its rules prefixed (`<prefix>root` is its start), appended to `out`
 * (the schema converted through the maker's cache: requests repeat their tools). */
static bool schema_rules(em_buf *out, json_t *schema, const char *prefix, const em_server_grammar_maker *maker,
                         em_server_error *err) {
    char *text = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
    json_decref(schema);
    if (!text) return oom(err);
    char *gbnf = NULL;
    em_err e = em_grammar_cache_schema(maker->cache, text, strlen(text), maker->watch, &gbnf);
    free(text);
    if (e) {
        if (em_err_code_of(e) != EM_ERR_INVALID && em_err_code_of(e) != EM_ERR_UNSUPPORTED &&
            em_err_code_of(e) != EM_ERR_RANGE)
            return em_server_grammar_failed(e, "tools", err);
        em_server_error_set(err, 400, NULL, "invalid_value", "tools", "tool parameters: %s", em_err_message(e));
        em_err_free(e);
        return false;
    }
    char *renamed = prefix_rules(gbnf, prefix);
    free(gbnf);
    bool ok = renamed && em_buf_printf(out, "%s\n", renamed);
    free(renamed);
    return ok || oom(err);
}

/* The tools a call may name: the named one, or all. */
static bool may_call(const em_server_request *req, const json_t *tool) {
    const char *name = json_string_value(json_object_get(json_object_get(tool, "function"), "name"));
    return req->tool_choice != EM_TOOL_NAMED || (name && req->tool_name && !strcmp(name, req->tool_name));
}

/* Rule `call` (one call in the format, its marker included) and what it needs, into `out`. */
static bool call_rules(em_buf *out, const em_server_request *req, em_tool_format format,
                       const em_server_grammar_maker *maker, em_server_error *err) {
    size_t i;
    json_t *t;
    if (format == EM_TOOL_FORMAT_MISTRAL_ARGS) { /* [TOOL_CALLS]name[ARGS]{arguments} */
        bool ok = em_buf_printf(out, "call ::= ") && literal(out, "[TOOL_CALLS]") && em_buf_printf(out, " (");
        size_t n = 0;
        json_array_foreach(req->tools, i, t) {
            if (!ok || !may_call(req, t)) continue;
            ok = em_buf_printf(out, "%s", n++ ? " | " : "") &&
                 literal(out, json_string_value(json_object_get(json_object_get(t, "function"), "name"))) &&
                 literal(out, "[ARGS]") && em_buf_printf(out, " tool%zu-root", i);
        }
        if (!ok || !em_buf_printf(out, ")\n")) return oom(err);
        json_array_foreach(req->tools, i, t) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "tool%zu-", i);
            json_t *parameters = json_object_get(json_object_get(t, "function"), "parameters");
            if (may_call(req, t) && !schema_rules(out, json_deep_copy(parameters), prefix, maker, err)) return false;
        }
        return true;
    }
    const char *key = format == EM_TOOL_FORMAT_LLAMA3 ? "parameters" : "arguments";
    json_t *choices = json_array();
    json_array_foreach(req->tools, i, t) if (may_call(req, t)) json_array_append_new(choices, call_schema(t, key));
    json_t *schema = json_array_size(choices) == 1 ? json_incref(json_array_get(choices, 0)) : json_pack("{s:O}", "anyOf", choices);
    json_decref(choices);
    if (!schema_rules(out, schema, "object-", maker, err)) return false;
    bool ok;
    switch (format) {
    case EM_TOOL_FORMAT_HERMES: ok = em_buf_printf(out, "call ::= \"<tool_call>\\n\" object-root \"\\n</tool_call>\"\n"); break;
    case EM_TOOL_FORMAT_MISTRAL:
        ok = em_buf_printf(out, "call ::= ") && literal(out, "[TOOL_CALLS][") && em_buf_printf(out, " object-root \"]\"\n");
        break;
    case EM_TOOL_FORMAT_LLAMA3: ok = em_buf_printf(out, "call ::= \"<|python_tag|>\"? object-root\n"); break;
    default: ok = em_buf_printf(out, "call ::= object-root\n"); break;
    }
    return ok || oom(err);
}


/* ---- Harmony (gpt-oss) ----
 * The answer is messages, the first one's `<|start|>assistant` already in the prompt: an analysis
 * message may come first (the model's reasoning, up to `<|end|>`), then the message the grammar is
 * about. A call is addressed `to=functions.NAME`, before the channel (as the template writes calls
 * back) or after it (as the model mostly writes them), its arguments' type `json` or
 * `<|constrain|>json`, then the arguments; the grammar ends there, as the model's `<|call|>` would
 * end the turn. Structured output is the final message's body. */

/* Rule `call` (from "to=functions." on) for the tools the request may call, and their schemas. */
static bool harmony_call_rules(em_buf *out, const em_server_request *req, const em_server_grammar_maker *maker,
                               em_server_error *err) {
    size_t i, n = 0;
    json_t *t;
    bool ok = em_buf_printf(out, "call ::= ") && literal(out, "to=functions.") && em_buf_printf(out, " (");
    json_array_foreach(req->tools, i, t) {
        if (!ok || !may_call(req, t)) continue;
        ok = em_buf_printf(out, "%s", n++ ? " | " : "") &&
             literal(out, json_string_value(json_object_get(json_object_get(t, "function"), "name"))) &&
             em_buf_printf(out, " call-type tool%zu-root", i);
    }
    ok = ok && em_buf_printf(out, ")\ncall-type ::= ") && literal(out, "<|channel|>commentary") &&
         em_buf_printf(out, "? \" \"? ") && literal(out, "<|constrain|>") && em_buf_printf(out, "? \"json\"? ") &&
         literal(out, "<|message|>") && em_buf_printf(out, "\n");
    if (!ok) return oom(err);
    json_array_foreach(req->tools, i, t) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "tool%zu-", i);
        json_t *parameters = json_object_get(json_object_get(t, "function"), "parameters");
        if (may_call(req, t) && !schema_rules(out, json_deep_copy(parameters), prefix, maker, err)) return false;
    }
    return true;
}

/* Rule `analysis`: an optional analysis message, and the next message's opening. */
static bool harmony_analysis_rules(em_buf *out) {
    return exclusion_rules(out, "thought", "<|end|>") && em_buf_printf(out, "analysis ::= (") &&
           literal(out, "<|channel|>analysis<|message|>") && em_buf_printf(out, " thought-0 ") &&
           literal(out, "<|end|><|start|>assistant") && em_buf_printf(out, ")?\n");
}

static bool harmony_grammar(em_server_request *req, const em_server_grammar_maker *maker, em_server_error *err) {
    const bool forced = req->tool_choice == EM_TOOL_REQUIRED || req->tool_choice == EM_TOOL_NAMED;
    const bool given = req->grammar || req->grammar_schema; /* response_format or grammar */
    const bool lazy = req->tools && req->tool_choice == EM_TOOL_AUTO && !given;
    const bool format = given && !req->grammar_is_raw && req->api != EM_API_OPENAI_COMPLETIONS;
    if (forced && given)
        return em_server_error_set(err, 400, NULL, "invalid_value", "tool_choice",
                                   "'tool_choice' cannot force a tool call together with response_format or grammar"),
               false;
    if (!em_server_schema_grammar(req, maker, err)) return false;
    if (!forced && !lazy && !format) return true;
    em_buf out = {0};
    bool ok = true;
    if (forced || lazy) {
        if (!harmony_call_rules(&out, req, maker, err)) {
            em_buf_free(&out);
            return false;
        }
    }
    if (forced) { /* the call's message opens with its channel, or with the recipient */
        ok = harmony_analysis_rules(&out) && em_buf_printf(&out, "root ::= analysis (") &&
             literal(&out, "<|channel|>commentary ") && em_buf_printf(&out, " | \" \"?) call\n");
    } else if (lazy) {
        req->grammar_triggers = em_tool_call_openers(EM_TOOL_FORMAT_HARMONY);
        ok = em_buf_printf(&out, "root ::= call\n");
    } else {
        char *renamed = prefix_rules(req->grammar, "format-");
        ok = renamed && harmony_analysis_rules(&out) && em_buf_printf(&out, "%s\nroot ::= analysis ", renamed) &&
             literal(&out, "<|channel|>final<|message|>") && em_buf_printf(&out, " format-root\n");
        free(renamed);
    }
    if (!ok || !out.data) {
        em_buf_free(&out);
        return oom(err);
    }
    return em_server_set_grammar(req, out.data, forced || lazy ? "tools" : req->grammar_param, err);
}

/* ---- Gemma 4 ----
 * A call is `<|tool_call>call:NAME{...}<tool_call|>`, its arguments as the template's
 * format_argument writes them: keys bare and in dictsort's order (case folded), strings between
 * `<|"|>` quotes, numbers, booleans and null as in JSON, lists in brackets; whitespace may follow an
 * opening bracket, a colon or a comma. A tool's schema gives its arguments' rules where it says
 * which members and types to write (properties, required, type, enum, const, items, anyOf); what a
 * schema says beyond that (bounds, patterns, $ref) is not enforced, and a schema too deep or of an
 * unknown shape admits any value there. A thought (`<|channel>thought ... <channel|>`) may come
 * first. `auto` is lazy behind `<|tool_call>`; response_format is the text after an optional thought. */

#define GEMMA4_QUOTE "<|\"|>"
/* Schemas nested deeper admit any value below: the rules are built by recursion over the schema. */
#define GEMMA4_SCHEMA_DEPTH 12

/* The rules every Gemma 4 grammar shares: any value of the syntax (gemma-value), and its parts. */
static bool gemma4_value_rules(em_buf *out) {
    return exclusion_rules(out, "gemma-text", GEMMA4_QUOTE) && em_buf_printf(out, "gemma-string ::= ") &&
           literal(out, GEMMA4_QUOTE) && em_buf_printf(out, " gemma-text-0 ") && literal(out, GEMMA4_QUOTE) &&
           em_buf_printf(out,
                         "\ngemma-space ::= [ \\t\\n]*\n"
                         "gemma-integer ::= \"-\"? (\"0\" | [1-9] [0-9]*)\n"
                         "gemma-number ::= gemma-integer (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n"
                         "gemma-bool ::= \"true\" | \"false\"\n"
                         "gemma-null ::= \"null\"\n"
                         "gemma-key ::= [^:}<{,\\[\\] \\t\\n] [^:}<]*\n"
                         "gemma-member ::= gemma-key \":\" gemma-space gemma-value\n"
                         "gemma-dict ::= \"{\" gemma-space (gemma-member (\",\" gemma-space gemma-member)*)? \"}\"\n"
                         "gemma-list ::= \"[\" gemma-space (gemma-value (\",\" gemma-space gemma-value)*)? \"]\"\n"
                         "gemma-value ::= gemma-string | gemma-dict | gemma-list | gemma-number | gemma-bool | gemma-null\n");
}

/* A scalar of an enum or const as the template writes it (NULL-free text; false: not writable). */
static bool gemma4_constant(em_buf *out, const json_t *value) {
    if (json_is_string(value)) {
        const char *text = json_string_value(value);
        if (strstr(text, GEMMA4_QUOTE) || strlen(text) != json_string_length(value)) return false;
        char *quoted = malloc(strlen(text) + 2 * strlen(GEMMA4_QUOTE) + 1);
        if (!quoted) return false;
        sprintf(quoted, "%s%s%s", GEMMA4_QUOTE, text, GEMMA4_QUOTE);
        bool ok = literal(out, quoted);
        free(quoted);
        return ok;
    }
    if (!json_is_number(value) && !json_is_boolean(value) && !json_is_null(value)) return false;
    char *text = json_dumps(value, JSON_ENCODE_ANY | JSON_COMPACT);
    bool ok = text && literal(out, text);
    free(text);
    return ok;
}

/* Whether a property's name can be written as a bare key. */
static bool gemma4_bare_key(const char *name) {
    return *name && !strpbrk(name, ":}<{,[] \t\n");
}

typedef struct gemma4_property {
    const char *name;
    const json_t *schema;
    bool required;
    size_t order; /* as given: ties of the folded order keep it */
} gemma4_property;

static int gemma4_dictsort(const void *a, const void *b) {
    const gemma4_property *x = a, *y = b;
    for (const char *p = x->name, *q = y->name;; p++, q++) {
        int c = (*p >= 'A' && *p <= 'Z' ? *p + 32 : *p) - (*q >= 'A' && *q <= 'Z' ? *q + 32 : *q);
        if (c) return c;
        if (!*p) break;
    }
    return x->order < y->order ? -1 : x->order > y->order;
}

static bool gemma4_schema_rule(em_buf *out, const json_t *schema, const char *name, size_t *next, int depth);

/* A sub-rule of `name` for `schema`: its name into `rule`. */
static bool gemma4_sub_rule(em_buf *out, const json_t *schema, const char *name, size_t *next, int depth, char *rule,
                            size_t size) {
    snprintf(rule, size, "%s-%zu", name, (*next)++);
    return gemma4_schema_rule(out, schema, rule, next, depth + 1);
}

/* An object with its properties in the template's order: `name-first-K` is the members from the
 * K-th on when none came before, `name-later-K` those after one that did. */
static bool gemma4_object_rule(em_buf *out, const json_t *schema, const char *name, size_t *next, int depth) {
    const json_t *properties = json_object_get(schema, "properties"), *required = json_object_get(schema, "required");
    const size_t n = json_object_size(properties);
    gemma4_property *list = calloc(n + 1, sizeof *list);
    if (!list) return false;
    size_t k = 0;
    const char *key;
    json_t *value;
    bool writable = true;
    json_object_foreach((json_t *)properties, key, value) {
        writable = writable && gemma4_bare_key(key);
        list[k] = (gemma4_property){.name = key, .schema = value, .order = k};
        size_t i;
        json_t *r;
        json_array_foreach(required, i, r) if (json_is_string(r) && !strcmp(json_string_value(r), key)) list[k].required = true;
        k++;
    }
    if (!n || !writable) { /* no members named, or a name no bare key can write */
        free(list);
        return em_buf_printf(out, "%s ::= gemma-dict\n", name);
    }
    qsort(list, n, sizeof *list, gemma4_dictsort);
    bool ok = true;
    for (size_t i = n; ok && i-- > 0;) {
        char member[160], first_rest[192] = "", later_rest[192] = "";
        if (i + 1 < n) {
            snprintf(first_rest, sizeof first_rest, "%s-first-%zu", name, i + 1);
            snprintf(later_rest, sizeof later_rest, " %s-later-%zu", name, i + 1);
        }
        ok = gemma4_sub_rule(out, list[i].schema, name, next, depth, member, sizeof member);
        ok = ok && em_buf_printf(out, "%s-member-%zu ::= ", name, i) && literal(out, list[i].name) &&
             em_buf_printf(out, " \":\" gemma-space %s\n", member);
        if (list[i].required)
            ok = ok && em_buf_printf(out, "%s-first-%zu ::= %s-member-%zu%s\n", name, i, name, i, later_rest) &&
                 em_buf_printf(out, "%s-later-%zu ::= \",\" gemma-space %s-member-%zu%s\n", name, i, name, i, later_rest);
        else if (i + 1 < n)
            ok = ok && em_buf_printf(out, "%s-first-%zu ::= %s-member-%zu%s | %s\n", name, i, name, i, later_rest, first_rest) &&
                 em_buf_printf(out, "%s-later-%zu ::= (\",\" gemma-space %s-member-%zu)?%s\n", name, i, name, i, later_rest);
        else
            ok = ok && em_buf_printf(out, "%s-first-%zu ::= %s-member-%zu?\n", name, i, name, i) &&
                 em_buf_printf(out, "%s-later-%zu ::= (\",\" gemma-space %s-member-%zu)?\n", name, i, name, i);
    }
    free(list);
    return ok && em_buf_printf(out, "%s ::= \"{\" gemma-space %s-first-0 \"}\"\n", name, name);
}

/* Rule `name` for the values `schema` allows, in Gemma's syntax. */
static bool gemma4_schema_rule(em_buf *out, const json_t *schema, const char *name, size_t *next, int depth) {
    if (!json_is_object(schema) || depth > GEMMA4_SCHEMA_DEPTH) return em_buf_printf(out, "%s ::= gemma-value\n", name);
    const json_t *choices = json_object_get(schema, "enum");
    json_t *single = NULL;
    if (!choices && json_object_get(schema, "const")) choices = single = json_pack("[O]", json_object_get(schema, "const"));
    if (json_array_size(choices)) {
        em_buf alternatives = {0};
        bool ok = true, writable = true;
        size_t i;
        json_t *c;
        json_array_foreach(choices, i, c) {
            ok = ok && (!alternatives.len || em_buf_printf(&alternatives, " | "));
            writable = writable && gemma4_constant(&alternatives, c);
        }
        json_decref(single);
        ok = ok && (writable ? em_buf_printf(out, "%s ::= %s\n", name, alternatives.data)
                             : em_buf_printf(out, "%s ::= gemma-value\n", name));
        em_buf_free(&alternatives);
        return ok;
    }
    json_decref(single);
    const json_t *any_of = json_object_get(schema, "anyOf");
    if (!any_of) any_of = json_object_get(schema, "oneOf");
    const json_t *type = json_object_get(schema, "type");
    if (json_array_size(any_of) || json_array_size(type)) { /* one of several schemas, or of several types */
        em_buf alternatives = {0};
        bool ok = true;
        const size_t n = json_array_size(any_of) ? json_array_size(any_of) : json_array_size(type);
        for (size_t i = 0; ok && i < n; i++) {
            json_t *typed = json_array_size(any_of) ? NULL : json_pack("{s:O}", "type", json_array_get(type, i));
            char rule[160];
            ok = gemma4_sub_rule(out, typed ? typed : json_array_get(any_of, i), name, next, depth, rule, sizeof rule) &&
                 em_buf_printf(&alternatives, "%s%s", i ? " | " : "", rule);
            json_decref(typed);
        }
        ok = ok && em_buf_printf(out, "%s ::= %s\n", name, alternatives.data);
        em_buf_free(&alternatives);
        return ok;
    }
    const char *kind = json_string_value(type);
    if (!kind && json_object_get(schema, "properties")) kind = "object";
    static const struct { const char *type, *rule; } scalars[] = {
        {"string", "gemma-string"}, {"integer", "gemma-integer"}, {"number", "gemma-number"},
        {"boolean", "gemma-bool"}, {"null", "gemma-null"},
    };
    for (size_t i = 0; kind && i < sizeof scalars / sizeof scalars[0]; i++)
        if (!strcmp(kind, scalars[i].type)) return em_buf_printf(out, "%s ::= %s\n", name, scalars[i].rule);
    if (kind && !strcmp(kind, "object")) return gemma4_object_rule(out, schema, name, next, depth);
    if (kind && !strcmp(kind, "array")) {
        char item[160];
        json_int_t at_least = json_integer_value(json_object_get(schema, "minItems"));
        bool ok = gemma4_sub_rule(out, json_object_get(schema, "items"), name, next, depth, item, sizeof item);
        return ok && em_buf_printf(out, "%s ::= \"[\" gemma-space %s%s (\",\" gemma-space %s)*%s \"]\"\n", name,
                                   at_least > 0 ? "" : "(", item, item, at_least > 0 ? "" : ")?");
    }
    return em_buf_printf(out, "%s ::= gemma-value\n", name);
}

/* Rule `call` (the whole `<|tool_call>...<tool_call|>`) for the tools the request may call. */
static bool gemma4_call_rules(em_buf *out, const em_server_request *req) {
    size_t i, n = 0;
    json_t *t;
    bool ok = gemma4_value_rules(out) && em_buf_printf(out, "call ::= ") && literal(out, "<|tool_call>call:") &&
              em_buf_printf(out, " (");
    json_array_foreach(req->tools, i, t) {
        if (!ok || !may_call(req, t)) continue;
        ok = em_buf_printf(out, "%s", n++ ? " | " : "") &&
             literal(out, json_string_value(json_object_get(json_object_get(t, "function"), "name"))) &&
             em_buf_printf(out, " tool%zu", i);
    }
    ok = ok && em_buf_printf(out, ") ") && literal(out, "<tool_call|>") && em_buf_printf(out, "\n");
    json_array_foreach(req->tools, i, t) {
        if (!ok || !may_call(req, t)) continue;
        char name[32];
        size_t next = 0;
        snprintf(name, sizeof name, "tool%zu", i);
        const json_t *parameters = json_object_get(json_object_get(t, "function"), "parameters");
        /* the arguments are an object whatever the schema says */
        const char *type = json_string_value(json_object_get(parameters, "type"));
        if (!json_is_object(parameters) || (type && strcmp(type, "object")))
            ok = em_buf_printf(out, "%s ::= gemma-dict\n", name);
        else
            ok = gemma4_object_rule(out, parameters, name, &next, 0);
    }
    return ok;
}

static bool gemma4_grammar(em_server_request *req, const em_server_grammar_maker *maker, em_server_error *err) {
    const bool forced = req->tool_choice == EM_TOOL_REQUIRED || req->tool_choice == EM_TOOL_NAMED;
    const bool given = req->grammar || req->grammar_schema; /* response_format or grammar */
    const bool lazy = req->tools && req->tool_choice == EM_TOOL_AUTO && !given;
    if (forced && given)
        return em_server_error_set(err, 400, NULL, "invalid_value", "tool_choice",
                                   "'tool_choice' cannot force a tool call together with response_format or grammar"),
               false;
    if (!em_server_schema_grammar(req, maker, err)) return false;
    const bool format = req->grammar && !req->grammar_is_raw && req->api != EM_API_OPENAI_COMPLETIONS;
    if (!forced && !lazy && !format) return true;
    em_buf out = {0};
    bool ok = true;
    const bool thought = forced || format; /* a lazy grammar starts at the call: the thought came before */
    if (thought)
        ok = exclusion_rules(&out, "thought", "<channel|>") && em_buf_printf(&out, "thought ::= ") &&
             literal(&out, "<|channel>thought") && em_buf_printf(&out, " thought-0 ") && literal(&out, "<channel|>") &&
             em_buf_printf(&out, "\n");
    if (forced || lazy) {
        ok = ok && gemma4_call_rules(&out, req) && em_buf_printf(&out, forced ? "root ::= thought? call\n" : "root ::= call\n");
        if (lazy) req->grammar_triggers = em_tool_call_openers(EM_TOOL_FORMAT_GEMMA4);
    } else {
        char *renamed = prefix_rules(req->grammar, "format-");
        ok = ok && renamed && em_buf_printf(&out, "%s\nroot ::= thought? format-root\n", renamed);
        free(renamed);
    }
    if (!ok || !out.data) {
        em_buf_free(&out);
        return oom(err);
    }
    return em_server_set_grammar(req, out.data, forced || lazy ? "tools" : req->grammar_param, err);
}

/* `answer` ::= thinking first (optional, or already open), then `body`. */
static bool think_rules(em_buf *out, bool in_thinking) {
    return exclusion_rules(out, "thought", "</think>") &&
           em_buf_printf(out, "think-close ::= \"</think>\" [ \\t\\r\\n]*\n") &&
           (in_thinking ? em_buf_printf(out, "think ::= thought-0 think-close\n")
                        : em_buf_printf(out, "think ::= (\"<think>\" thought-0 think-close)?\n"));
}

bool em_server_tool_grammar(em_server_request *req, em_tool_format format, em_server_error *err) {
    const em_server_grammar_maker unshared = {0};
    return em_server_answer_grammar(req, &unshared, format, false, false, err);
}

bool em_server_answer_grammar(em_server_request *req, const em_server_grammar_maker *maker, em_tool_format format,
                              bool reasons, bool in_thinking, em_server_error *err) {
    if (format == EM_TOOL_FORMAT_HARMONY) return harmony_grammar(req, maker, err);
    if (format == EM_TOOL_FORMAT_GEMMA4) return gemma4_grammar(req, maker, err);
    const bool think = reasons || in_thinking;
    const bool forced = req->tool_choice == EM_TOOL_REQUIRED || req->tool_choice == EM_TOOL_NAMED;
    const bool given = req->grammar || req->grammar_schema; /* response_format or grammar */
    const bool lazy = req->tools && req->tool_choice == EM_TOOL_AUTO && *em_tool_call_openers(format) && !given;
    if (forced && given)
        return em_server_error_set(err, 400, NULL, "invalid_value", "tool_choice",
                                   "'tool_choice' cannot force a tool call together with response_format or grammar"),
               false;
    if (!em_server_schema_grammar(req, maker, err)) return false;
    em_buf out = {0};
    bool ok = true;
    if (forced || lazy) {
        ok = call_rules(&out, req, format, maker, err);
        if (!ok) {
            em_buf_free(&out);
            return false;
        }
        if (forced) {
            ok = em_buf_printf(&out, think ? "root ::= think call\n" : "root ::= call\n");
        } else if (!think) {
            req->grammar_triggers = em_tool_call_openers(format);
            ok = em_buf_printf(&out, "root ::= call\n");
        } else { /* see the file's comment: the lazy grammar cannot tell thinking from the answer */
            /* (free text excludes the format's first marker only) */
            ok = exclusion_rules(&out, "free", em_tool_call_openers(format)[0]) &&
                 em_buf_printf(&out, "root ::= think free-0 call?\n");
        }
    } else if (think && req->grammar && !req->grammar_is_raw) { /* response_format after thinking */
        char *renamed = prefix_rules(req->grammar, "format-");
        ok = renamed && em_buf_printf(&out, "%s\nroot ::= think format-root\n", renamed);
        free(renamed);
    } else {
        return true;
    }
    if (ok && think) ok = think_rules(&out, in_thinking);
    if (!ok || !out.data) {
        em_buf_free(&out);
        return oom(err);
    }
    return em_server_set_grammar(req, out.data, forced || lazy ? "tools" : req->grammar_param, err);
}
