/* The grammar module: GBNF parsing and its errors, llama.cpp's example grammars (json, arithmetic,
 * list, chess) accepting and rejecting strings, character classes over UTF-8, repetition counts,
 * random sentences re-accepted, and token masks against a brute-force check over real
 * vocabularies (the reference fixtures' llama-spm and gpt-2). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include "vocab_fixture.h"

/* The example grammars, written from the GBNF syntax. */
static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "# Optional space: by convention, applied in this grammar after literal chars when allowed\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char *ARITHMETIC_GBNF =
    "root  ::= (expr \"=\" ws term \"\\n\")+\n"
    "expr  ::= term ([-+*/] term)*\n"
    "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
    "ident ::= [a-z] [a-z0-9_]* ws\n"
    "num   ::= [0-9]+ ws\n"
    "ws    ::= [ \\t\\n]*\n";

static const char *LIST_GBNF =
    "root ::= item+\n"
    "# Excludes various line break characters\n"
    "item ::= \"- \" [^\\r\\n\\x0b\\x0c\\x85\\u2028\\u2029]+ \"\\n\"\n";

static const char *CHESS_GBNF =
    "# Specifies chess moves as a list in algebraic notation, using PGN conventions\n"
    "root ::= (\n"
    "    # it must start with the characters \"1. \" followed by a sequence\n"
    "    \"1. \" move \" \" move \"\\n\"\n"
    "    ([1-9] [0-9]? \". \" move \" \" move \"\\n\")+\n"
    ")\n"
    "move ::= (pawn | nonpawn | castle) [+#]?\n"
    "pawn ::= [a-h] [1-8] (\"=\" [NBKQR])?\n"
    "nonpawn ::= [NBKQR] [a-h]? [1-8]? \"x\"? [a-h] [1-8]\n"
    "castle ::= \"O-O\" \"-O\"?\n";

static em_grammar *compile(const char *gbnf) {
    em_grammar *g = NULL;
    em_err err = em_grammar_compile(gbnf, strlen(gbnf), &g);
    if (err) fail_msg("compile: %s", em_err_message(err));
    return g;
}

/* Whether the whole string is a sentence of the grammar. */
static bool matches(const em_grammar *g, const char *text) {
    em_grammar_state *s;
    assert_null(em_grammar_state_new(g, &s));
    bool ok = em_grammar_accept_bytes(s, text, strlen(text)) && em_grammar_complete(s);
    em_grammar_state_free(s);
    return ok;
}

/* Whether the string can begin a sentence. */
static bool prefix_ok(const em_grammar *g, const char *text) {
    em_grammar_state *s;
    assert_null(em_grammar_state_new(g, &s));
    bool ok = em_grammar_accept_bytes(s, text, strlen(text));
    em_grammar_state_free(s);
    return ok;
}

static void test_json_grammar(void **state) {
    (void)state;
    em_grammar *g = compile(JSON_GBNF);
    const char *good[] = {"{}", "{\"a\":1}", "{\"a\": [1, 2.5, -3e+7, true, null, \"x\\u00e9\\n\"]}",
                          "{\"nested\": {\"k\": {}}, \"b\": []}", "{\"é\": \"日本\"}", "{ \"a\" :1}"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (!matches(g, good[i])) fail_msg("json should accept %s", good[i]);
    const char *bad[] = {"", "[]", "{", "{\"a\"}", "{\"a\":01}", "{\"a\":tru}", "{'a':1}", "{\"a\":1,}",
                         "{\"a\":\"\x01\"}", "{\"a\":\"\\q\"}", "{\"a\":1}x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (matches(g, bad[i])) fail_msg("json should reject %s", bad[i]);
    assert_true(prefix_ok(g, "{\"a\": [1, "));
    assert_false(prefix_ok(g, "{\"a\": ]"));
    em_grammar_free(g);
}

static void test_arithmetic_list_chess(void **state) {
    (void)state;
    em_grammar *g = compile(ARITHMETIC_GBNF);
    assert_true(matches(g, "1+2=3\n"));
    assert_true(matches(g, "(x1 +7)*y = z\nq=1\n"));
    assert_false(matches(g, "1+=3\n"));
    assert_false(matches(g, "1+2=3"));
    assert_false(matches(g, "X=1\n"));
    em_grammar_free(g);

    g = compile(LIST_GBNF);
    assert_true(matches(g, "- milk\n- eggs and ☕\n"));
    assert_false(matches(g, "- \n"));
    assert_false(matches(g, "* milk\n"));
    assert_false(matches(g, "- a\u2028b\n"));
    assert_false(matches(g, "- a\rb\n"));
    em_grammar_free(g);

    g = compile(CHESS_GBNF);
    assert_true(matches(g, "1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6\n"));
    assert_true(matches(g, "1. d4 d5\n2. c4 Nxc4\n10. O-O O-O-O+\n"));
    assert_false(matches(g, "1. e4 e5\n")); /* at least one more move pair */
    assert_false(matches(g, "1. e9 e5\n2. a3 a6\n"));
    em_grammar_free(g);
}

static void test_classes_and_repetition(void **state) {
    (void)state;
    em_grammar *g = compile("root ::= [a-cx] [^a-z] . [\\u00e0-\\u00ff\\U0001F600-\\U0001F64F]\n");
    assert_true(matches(g, "b!zé"));
    assert_true(matches(g, "x\xe6\x97\xa5\n\xf0\x9f\x98\x80")); /* x 日 \n 😀 */
    assert_false(matches(g, "dAAé"));
    assert_false(matches(g, "aqAé"));
    assert_false(matches(g, "aAAe"));
    assert_false(matches(g, "aAA\xf0\x9f\x99\x90")); /* U+1F650, past the range */
    assert_false(matches(g, "aA\xed\xa0\x80" "\xc3\xa9"));    /* an encoded surrogate is not a character */
    em_grammar_free(g);

    g = compile("root ::= \"a\"{2,4} (\"bc\"){2} [0-9]{1,} x?\nx ::= \"!\"");
    assert_true(matches(g, "aabcbc0"));
    assert_true(matches(g, "aaaabcbc123!"));
    assert_false(matches(g, "abcbc0"));
    assert_false(matches(g, "aaaaabcbc0"));
    assert_false(matches(g, "aabc0"));
    assert_false(matches(g, "aabcbc"));
    em_grammar_free(g);

    /* Many empty alternatives in a row: each (position, stack) is expanded once per step, not once
     * per path (3^40 paths here). */
    char many[512] = "root ::=";
    for (int i = 0; i < 40; i++) strcat(many, " x");
    strcat(many, " \"z\"\nx ::= \"\" | \"\" | \"a\"\n");
    g = compile(many);
    assert_true(matches(g, "aaaz"));
    assert_true(matches(g, "z"));
    assert_false(matches(g, "b"));
    em_grammar_free(g);

    /* A branch that can never end (x recurses forever) is never entered: every accepted prefix
     * can still be finished. */
    g = compile("root ::= \"a\" | x\nx ::= \"b\" x");
    assert_true(matches(g, "a"));
    assert_false(prefix_ok(g, "b"));
    em_grammar_free(g);

    /* Deep right recursion (a long repetition) neither fails nor grows the stack. */
    g = compile("root ::= (\"ab\" | \"c\")* \"!\"");
    char long_text[20002];
    for (int i = 0; i < 20000; i++) long_text[i] = "abc"[i % 3];
    long_text[19998] = 'c', long_text[19999] = 'c'; /* 6666 "abc" then "cc" */
    strcpy(long_text + 20000, "!");
    assert_true(matches(g, long_text));
    em_grammar_free(g);
}

static void expect_error(const char *gbnf, const char *needle) {
    em_grammar *g = NULL;
    em_err err = em_grammar_compile(gbnf, strlen(gbnf), &g);
    assert_null(g);
    if (!err) fail_msg("expected an error for %s", gbnf);
    if (!strstr(em_err_message(err), needle)) fail_msg("error '%s' lacks '%s'", em_err_message(err), needle);
    em_err_free(err);
}

static void test_errors(void **state) {
    (void)state;
    expect_error("root ::= thing\n", "line 1, column 10: rule 'thing' is used but not defined");
    expect_error("start ::= \"a\"\n", "no 'root' rule");
    expect_error("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n", "rule 'expr' is left-recursive");
    expect_error("root ::= x? root \"a\"\nx ::= \"b\"", "rule 'root' is left-recursive");
    expect_error("root ::= \"a\"\n  \"b\" ::= x", "line 2, column 3: expected a rule name");
    expect_error("root ::= \"abc\n", "unterminated literal");
    expect_error("root ::= [a-", "line 1, column 10: unterminated character class");
    expect_error("root ::= [z-a]\n", "runs backwards");
    expect_error("root ::= \"a\"{3,1}\n", "runs backwards");
    expect_error("root ::= \"a\" )\n", "line 1, column 14: unexpected ')'");
    expect_error("root ::= \"\\q\"\n", "unknown escape");
    expect_error("root ::= \"a\"\nroot ::= \"b\"\n", "line 2, column 1: rule 'root' is defined twice");
    expect_error("root ::= \"a\" root\n", "never ends");
    expect_error("root ::= <[1000]>\n", "token references");
}

/* Random sentences of each grammar are sentences of it, and complete only at their end. */
static void test_generate(void **state) {
    (void)state;
    const char *grammars[] = {JSON_GBNF, ARITHMETIC_GBNF, LIST_GBNF, CHESS_GBNF};
    for (size_t k = 0; k < 4; k++) {
        em_grammar *g = compile(grammars[k]);
        for (uint64_t seed = 1; seed <= 50; seed++) {
            char *text;
            size_t len;
            assert_null(em_grammar_generate(g, seed, 60, &text, &len));
            em_grammar_state *s;
            assert_null(em_grammar_state_new(g, &s));
            assert_true(em_grammar_accept_bytes(s, text, len));
            assert_true(em_grammar_complete(s));
            assert_int_equal(em_grammar_bytes_to_complete(s), 0);
            em_grammar_state_free(s);
            free(text);
        }
        em_grammar_free(g);
    }
}

/* ---- Masks over real vocabularies ---- */


/* For each prefix, the mask equals "this token's bytes (or the end) are accepted after the prefix",
 * tried token by token on a fresh state. */
static void check_masks(const char *vocab_name, const char *gbnf, const char *const *prefixes, size_t n_prefixes) {
    em_tokenizer *t = load_tokenizer(vocab_name);
    const uint32_t n = (uint32_t)em_tokenizer_n_vocab(t);
    em_grammar_vocab *v;
    assert_null(em_grammar_vocab_new(t, n + 5, NULL, 0, &v)); /* 5 padding rows without a token */
    em_grammar *g = compile(gbnf);
    uint32_t *mask = calloc((n + 5 + 31) / 32, sizeof *mask);
    for (size_t p = 0; p < n_prefixes; p++) {
        em_grammar_state *s;
        assert_null(em_grammar_state_new(g, &s));
        assert_true(em_grammar_accept_bytes(s, prefixes[p], strlen(prefixes[p])));
        uint32_t n_allowed, again;
        assert_null(em_grammar_mask(s, v, mask, &n_allowed));
        assert_null(em_grammar_mask(s, v, mask, &again)); /* from the cache */
        assert_int_equal(n_allowed, again);
        em_grammar_state_free(s);
        uint32_t counted = 0;
        for (uint32_t id = 0; id < n + 5; id++) {
            em_grammar_state *fresh;
            assert_null(em_grammar_state_new(g, &fresh));
            assert_true(em_grammar_accept_bytes(fresh, prefixes[p], strlen(prefixes[p])));
            bool expected = em_grammar_accept_token(fresh, v, (int32_t)id);
            em_grammar_state_free(fresh);
            bool got = (mask[id >> 5] >> (id & 31)) & 1u;
            if (got != expected) fail_msg("%s, prefix '%s': token %u mask %d, brute force %d", vocab_name, prefixes[p], id, got, expected);
            counted += expected;
        }
        assert_int_equal(counted, n_allowed);
        assert_true(n_allowed > 0);
    }
    free(mask);
    em_grammar_free(g);
    em_grammar_vocab_free(v);
    em_tokenizer_free(t);
}

static void test_masks_brute_force(void **state) {
    (void)state;
    const char *json_prefixes[] = {"", "{", "{\"ke", "{\"key\": [1", "{\"key\": [1, \"\\u00", "{\"a\": {}}"};
    check_masks("ggml-vocab-llama-spm.gguf", JSON_GBNF, json_prefixes, 6);
    check_masks("ggml-vocab-gpt-2.gguf", JSON_GBNF, json_prefixes, 6);
    const char *chess_prefixes[] = {"1. ", "1. e4 e5\n", "1. e4 e5\n2. N"};
    check_masks("ggml-vocab-gpt-2.gguf", CHESS_GBNF, chess_prefixes, 3);
    const char *list_prefixes[] = {"- ", "- caf\xc3"}; /* inside a character: byte tokens continue it */
    check_masks("ggml-vocab-llama-spm.gguf", LIST_GBNF, list_prefixes, 2);
}

/* A grammar whose parse stacks multiply with every byte fails cleanly (and says why) once a state
 * would hold more than 256 of them, instead of slowing down without bound. */
static void test_too_ambiguous(void **state) {
    (void)state;
    em_grammar *g = compile("root ::= (\"a\" | \"a\" root+){2,5}");
    em_grammar_state *s;
    assert_null(em_grammar_state_new(g, &s));
    const char *pieces[] = {"a", "b"};
    const size_t lens[] = {1, 1};
    em_grammar_vocab *v;
    assert_null(em_grammar_vocab_from_pieces(pieces, lens, NULL, 2, &v));
    uint32_t mask[1], n_allowed;
    em_err err = NULL;
    int fed = 0;
    while (fed < 200 && !(err = em_grammar_mask(s, v, mask, &n_allowed))) {
        assert_int_equal(mask[0], 1); /* only "a" */
        if (!em_grammar_accept_token(s, v, 0)) break;
        fed++;
    }
    if (!err) fail_msg("still going after %d bytes", fed);
    assert_int_equal(em_err_code_of(err), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_err_message(err), "too ambiguous"));
    em_err_free(err);
    em_grammar_state_free(s);
    em_grammar_vocab_free(v);
    em_grammar_free(g);
}

/* End-of-generation tokens only when complete; after one, nothing. */
static void test_end_tokens(void **state) {
    (void)state;
    const char *pieces[] = {"a", "b", "", "ab"};
    const size_t lens[] = {1, 1, 0, 2};
    const bool is_end[] = {false, false, true, false};
    em_grammar_vocab *v;
    assert_null(em_grammar_vocab_from_pieces(pieces, lens, is_end, 4, &v));
    em_grammar *g = compile("root ::= \"a\" \"b\"?");
    em_grammar_state *s;
    assert_null(em_grammar_state_new(g, &s));
    uint32_t mask[1], n_allowed;
    assert_null(em_grammar_mask(s, v, mask, &n_allowed));
    assert_int_equal(mask[0], 0x9); /* a, ab */
    assert_false(em_grammar_accept_token(s, v, 2));
    assert_true(em_grammar_accept_token(s, v, 0));
    assert_true(em_grammar_complete(s));
    assert_true(em_grammar_can_continue(s));
    assert_null(em_grammar_mask(s, v, mask, &n_allowed));
    assert_int_equal(mask[0], 0x6); /* b, end */
    assert_true(em_grammar_accept_token(s, v, 1));
    assert_false(em_grammar_can_continue(s));
    assert_null(em_grammar_mask(s, v, mask, &n_allowed));
    assert_int_equal(mask[0], 0x4); /* only the end */
    assert_true(em_grammar_accept_token(s, v, 2));
    assert_false(em_grammar_complete(s));
    assert_null(em_grammar_mask(s, v, mask, &n_allowed));
    assert_int_equal(n_allowed, 0);
    em_grammar_state_free(s);
    em_grammar_free(g);
    em_grammar_vocab_free(v);
}

/* ---- JSON Schema ---- */

static em_grammar *compile_schema(const char *schema) {
    char *gbnf;
    em_err err = em_grammar_from_json_schema(schema, strlen(schema), &gbnf);
    if (err) fail_msg("schema %s: %s", schema, em_err_message(err));
    em_grammar *g = compile(gbnf);
    free(gbnf);
    return g;
}

static void expect_schema_error(const char *schema, const char *needle) {
    char *gbnf = NULL;
    em_err err = em_grammar_from_json_schema(schema, strlen(schema), &gbnf);
    assert_null(gbnf);
    if (!err) fail_msg("expected an error for %s", schema);
    if (!strstr(em_err_message(err), needle)) fail_msg("error '%s' lacks '%s'", em_err_message(err), needle);
    em_err_free(err);
}

/* Integer bounds are exact: every integer from -1500 to 1500 is accepted iff it is inside. */
static void test_schema_integer_ranges(void **state) {
    (void)state;
    const struct {
        const char *schema;
        long lo, hi;
    } cases[] = {
        {"{\"type\":\"integer\",\"minimum\":17,\"maximum\":1234}", 17, 1234},
        {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":5}", -5, 5},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":99,\"exclusiveMaximum\":1000}", 100, 999},
        {"{\"type\":\"integer\",\"maximum\":-20}", -100000, -20},
        {"{\"type\":\"integer\",\"minimum\":-1001}", -1001, 100000},
        {"{\"type\":\"integer\",\"minimum\":0.5,\"maximum\":10.5}", 1, 10},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        em_grammar *g = compile_schema(cases[c].schema);
        for (long v = -1500; v <= 1500; v++) {
            char text[32];
            snprintf(text, sizeof text, "%ld", v);
            bool inside = v >= cases[c].lo && v <= cases[c].hi;
            if (matches(g, text) != inside) fail_msg("%s: %ld %s", cases[c].schema, v, inside ? "rejected" : "accepted");
        }
        assert_false(matches(g, "007"));
        em_grammar_free(g);
    }
}

static void test_schema_shapes(void **state) {
    (void)state;
    static const struct {
        const char *schema, *text;
        bool valid;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"integer\"}},\"required\":[\"b\"],"
         "\"additionalProperties\":false}", NULL, false},
        {NULL, "{\"b\":1}", true},
        {NULL, "{\"a\":\"x\", \"b\":1}", true},
        {NULL, "{}", false},
        {NULL, "{\"b\":1,\"c\":2}", false},
        {NULL, "{\"b\":1.5}", false},
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"x\",2]},\"minItems\":2,\"maxItems\":3}", NULL, false},
        {NULL, "[\"x\",2]", true},
        {NULL, "[2, 2, \"x\"]", true},
        {NULL, "[2]", false},
        {NULL, "[2,2,2,2]", false},
        {NULL, "[3,2]", false},
        {"{\"type\":\"string\",\"pattern\":\"^a(b|cd)*[0-9]?$\"}", NULL, false},
        {NULL, "\"abcdb\"", true},
        {NULL, "\"a7\"", true},
        {NULL, "\"ac\"", false},
        {"{\"type\":\"string\",\"format\":\"date\"}", NULL, false},
        {NULL, "\"2026-12-01\"", true},
        {NULL, "\"2026-02-30\"", false},
        {NULL, "\"2026-13-01\"", false},
        {"{\"type\":\"object\"}", NULL, false},
        {NULL, "{\"any\": [1, {\"deep\": null}]}", true},
    };
    em_grammar *g = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (cases[i].schema) { /* a new schema; the texts below it are checked against it */
            em_grammar_free(g);
            g = compile_schema(cases[i].schema);
        } else if (matches(g, cases[i].text) != cases[i].valid) {
            fail_msg("%s %s", cases[i].text, cases[i].valid ? "rejected" : "accepted");
        }
    }
    em_grammar_free(g);
    char *gbnf; /* json_object mode: no schema */
    assert_null(em_grammar_from_json_schema(NULL, 0, &gbnf));
    g = compile(gbnf);
    free(gbnf);
    assert_true(matches(g, "{\"k\": \"v\"}"));
    assert_false(matches(g, "[1]"));
    em_grammar_free(g);
}

static void test_schema_errors(void **state) {
    (void)state;
    expect_schema_error("{\"type\":\"array\",\"uniqueItems\":true}", "at '/': keyword \"uniqueItems\" (true)");
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\",\"multipleOf\":3}}}",
                        "at '/properties/n': keyword \"multipleOf\" is not supported");
    expect_schema_error("{\"if\":{}}", "keyword \"if\" is not supported");
    expect_schema_error("{\"type\":\"string\",\"format\":\"hostname\"}", "at '/format': format \"hostname\" is not supported");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", "at '/pattern': pattern \"(?=a)b\": lookaround");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "escape is not supported");
    expect_schema_error("{\"$ref\":\"https://example.com/s.json\"}", "does not point into this document");
    expect_schema_error("{\"allOf\":[{},{}]}", "allOf of more than one");
    expect_schema_error("{\"anyOf\":[{}],\"type\":\"object\"}", "\"type\" beside \"anyOf\"");
    expect_schema_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer lies within");
    expect_schema_error("{\"type\":\"strin\"}", "unknown type \"strin\"");
    expect_schema_error("{\"type\":", "json schema:");
    expect_schema_error("false", "allows nothing");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_grammar),   cmocka_unit_test(test_arithmetic_list_chess),
        cmocka_unit_test(test_classes_and_repetition), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_generate),       cmocka_unit_test(test_end_tokens),
        cmocka_unit_test(test_masks_brute_force), cmocka_unit_test(test_schema_integer_ranges),
        cmocka_unit_test(test_schema_shapes),  cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_too_ambiguous),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
