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
 * Harmony (gpt-oss) answers are messages with channels: harmony_grammar builds theirs. */
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
