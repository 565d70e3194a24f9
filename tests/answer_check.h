/* What the tests of the server's answers share: a chat body parsed into a request, whether a
 * request's grammar takes a text, and an answer read whole and in pieces of every size up to 9
 * bytes, which must come out the same (what a stream sends is what a whole response holds). */
#ifndef EMBER_TEST_ANSWER_CHECK_H
#define EMBER_TEST_ANSWER_CHECK_H

#include <string.h>

#include "grammar/grammar.h"
#include "server/internal.h"

static void parse_chat(const char *body, em_server_request *req) {
    em_server_error err = {0};
    if (!em_openai_parse_chat(body, strlen(body), 1000, req, &err)) fail_msg("%s: %s", body, err.message);
}

/* Whether the request's grammar takes the whole text. */
static bool grammar_takes(const em_server_request *req, const char *text) {
    em_grammar *g;
    assert_null(em_grammar_compile(req->grammar, strlen(req->grammar), &g));
    em_grammar_state *s;
    assert_null(em_grammar_state_new(g, &s));
    bool ok = em_grammar_accept_bytes(s, text, strlen(text)) && em_grammar_complete(s);
    em_grammar_state_free(s);
    em_grammar_free(g);
    return ok;
}

/* An answer read by em_answer_reader fed `step` bytes at a time. */
static em_server_choice read_answer(const char *text, const em_answer_options *options, size_t step) {
    em_server_choice c = {0};
    em_answer_reader r;
    em_answer_init(&r, options);
    for (size_t at = 0, n = strlen(text); at < n; at += step)
        assert_true(em_answer_feed(&r, text + at, n - at < step ? n - at : step, em_server_choice_collect, &c));
    assert_true(em_answer_finish(&r, em_server_choice_collect, &c));
    em_answer_clear(&r);
    return c;
}

static const char *call_field(const em_server_choice *c, size_t k, const char *field) {
    return json_string_value(json_object_get(json_array_get(c->tool_calls, k), field));
}

/* Reads `text` whole and in pieces of every size up to 9 bytes: the pieces must give the same
 * answer (what a stream sends is what a whole response holds); checks content, reasoning and the
 * calls ("name args" pairs, NULL-terminated). */
static void expect_answer(const char *text, const em_answer_options *options, const char *content, const char *reasoning,
                          const char *const *calls) {
    em_server_choice whole = read_answer(text, options, strlen(text) ? strlen(text) : 1);
    assert_string_equal(whole.content.data ? whole.content.data : "", content);
    assert_string_equal(whole.reasoning.data ? whole.reasoning.data : "", reasoning);
    size_t n = 0;
    for (; calls[n]; n += 2) {
        assert_string_equal(call_field(&whole, n / 2, "name"), calls[n]);
        assert_string_equal(call_field(&whole, n / 2, "arguments"), calls[n + 1]);
    }
    assert_int_equal(json_array_size(whole.tool_calls), n / 2);
    for (size_t step = 1; step < 10; step++) {
        em_server_choice pieces = read_answer(text, options, step);
        assert_string_equal(pieces.content.data ? pieces.content.data : "", content);
        assert_string_equal(pieces.reasoning.data ? pieces.reasoning.data : "", reasoning);
        if (!json_equal(pieces.tool_calls, whole.tool_calls) && (pieces.tool_calls || whole.tool_calls)) {
            char *a = json_dumps(pieces.tool_calls, 0), *b = json_dumps(whole.tool_calls, 0);
            fail_msg("%s in pieces of %zu: %s, whole: %s", text, step, a ? a : "null", b ? b : "null");
        }
        em_server_choice_clear(&pieces);
    }
    em_server_choice_clear(&whole);
}

#endif
