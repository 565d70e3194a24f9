/* The grammar module against hostile input (issue #62): nesting that once overflowed the stack
 * (GBNF groups, regex groups in a schema's `pattern`, `$ref` chains and cycles, deeply nested
 * schemas) gives an error naming its limit, and does so on a thread with a 512 KiB stack; input as
 * deep as a real one still compiles; wide schemas (large enums, many optional properties, wide
 * anyOf of literals) compile to grammars that stay within the parse-stack bound and accept exactly
 * the right strings; huge grammars (a schema of 10,000 properties, a GBNF of 100,000 rules) either
 * compile or are refused by a limit. Timings are bench/'s business, not asserted here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar.h"

/* ---- Helpers ---- */

/* Runs fn(arg) on a thread with a 512 KiB stack: a limit that is too high, or a recursion that
 * the input controls, overflows it and the test crashes. */
static void on_small_stack(void *(*fn)(void *), void *arg) {
    pthread_attr_t attr;
    pthread_t thread;
    assert_int_equal(pthread_attr_init(&attr), 0);
    assert_int_equal(pthread_attr_setstacksize(&attr, 512 * 1024), 0);
    assert_int_equal(pthread_create(&thread, &attr, fn, arg), 0);
    assert_int_equal(pthread_join(thread, NULL), 0);
    pthread_attr_destroy(&attr);
}

/* A string made of `pieces`, each repeated count[i] times. */
static char *repeat3(const char *a, size_t na, const char *b, size_t nb, const char *c, size_t nc) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(la * na + lb * nb + lc * nc + 1), *p = s;
    assert_non_null(s);
    for (size_t i = 0; i < na; i++, p += la) memcpy(p, a, la);
    for (size_t i = 0; i < nb; i++, p += lb) memcpy(p, b, lb);
    for (size_t i = 0; i < nc; i++, p += lc) memcpy(p, c, lc);
    *p = '\0';
    return s;
}

/* One compilation (GBNF, or a schema first) run on a small stack: its error, or NULL. */
typedef struct job {
    const char *text;
    bool schema;
    em_err err;
    em_grammar *grammar;
} job;

static void *compile_job(void *arg) {
    job *j = arg;
    char *gbnf = NULL;
    const char *text = j->text;
    if (j->schema) {
        j->err = em_grammar_from_json_schema(j->text, strlen(j->text), &gbnf);
        if (j->err) return NULL;
        text = gbnf;
    }
    j->err = em_grammar_compile(text, strlen(text), &j->grammar);
    if (!j->err) { /* a parse state too: its expansion must not recurse on the input either */
        em_grammar_state *s = NULL;
        j->err = em_grammar_state_new(j->grammar, &s);
        em_grammar_state_free(s);
    }
    free(gbnf);
    return NULL;
}

/* Compiles on a small stack and expects an error containing `needle`. */
static void expect_refused(const char *text, bool schema, const char *needle) {
    job j = {.text = text, .schema = schema};
    on_small_stack(compile_job, &j);
    em_grammar_free(j.grammar);
    if (!j.err) fail_msg("expected an error containing '%s'", needle);
    if (!strstr(em_err_message(j.err), needle)) fail_msg("error '%s' lacks '%s'", em_err_message(j.err), needle);
    em_err_free(j.err);
}

/* Compiles on a small stack and expects success; the caller frees the grammar. */
static em_grammar *expect_compiled(const char *text, bool schema) {
    job j = {.text = text, .schema = schema};
    on_small_stack(compile_job, &j);
    if (j.err) fail_msg("%.200s: %s", text, em_err_message(j.err));
    return j.grammar;
}

static bool matches(const em_grammar *g, const char *text) {
    em_grammar_state *s;
    em_err err = em_grammar_state_new(g, &s);
    if (err) fail_msg("state: %s", em_err_message(err));
    bool ok = em_grammar_accept_bytes(s, text, strlen(text)) && em_grammar_complete(s);
    const char *why = em_grammar_failure(s);
    if (why) fail_msg("'%.100s': %s", text, why);
    em_grammar_state_free(s);
    return ok;
}

/* ---- Nesting ---- */

static void test_gbnf_nesting(void **state) {
    (void)state;
    char *deep = repeat3("root ::= ", 1, "(", 30000, "", 0), *text = NULL;
    text = repeat3(deep, 1, "\"a\"", 1, ")", 30000);
    expect_refused(text, false, "nested deeper than 256 levels");
    free(text);
    free(deep);
    /* 100 levels still compile and match. */
    deep = repeat3("root ::= ", 1, "(", 100, "", 0);
    text = repeat3(deep, 1, "\"a\"", 1, ")", 100);
    em_grammar *g = expect_compiled(text, false);
    assert_true(matches(g, "a"));
    assert_false(matches(g, "aa"));
    em_grammar_free(g);
    free(text);
    free(deep);
}

/* A chain of 100,000 named rules, each starting with the next: expanding it must not recurse. */
static void test_gbnf_rule_chain(void **state) {
    (void)state;
    enum { N = 100000 };
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "root ::= r0\n"));
    for (int i = 0; i < N; i++) assert_true(em_buf_printf(&b, "r%d ::= r%d\n", i, i + 1));
    assert_true(em_buf_printf(&b, "r%d ::= \"x\" | \"y\"\n", N));
    em_grammar *g = expect_compiled(b.data, false);
    assert_true(matches(g, "x"));
    assert_true(matches(g, "y"));
    assert_false(matches(g, "xy"));
    em_grammar_free(g);
    em_buf_free(&b);
    /* Defined backwards (each rule after the ones it uses), each leaving a byte to read after the
     * next: 100,000 frames on the parse stack. Then 100,000 rules that are all empty in a row. */
    assert_true(em_buf_printf(&b, "r%d ::= \"y\"\n", N));
    for (int i = N; i-- > 0;) assert_true(em_buf_printf(&b, "r%d ::= r%d \"x\"\n", i, i + 1));
    assert_true(em_buf_printf(&b, "root ::= r0 | e\ne ::= "));
    for (int i = 0; i < N; i++) assert_true(em_buf_printf(&b, "o%d ", i));
    assert_true(em_buf_printf(&b, "\"z\"\n"));
    for (int i = 0; i < N; i++) assert_true(em_buf_printf(&b, "o%d ::= \"\"\n", i));
    g = expect_compiled(b.data, false);
    char *text = repeat3("y", 1, "x", N, "", 0);
    assert_true(matches(g, text));
    text[N] = '\0';
    assert_false(matches(g, text));
    assert_true(matches(g, "z"));
    free(text);
    em_grammar_free(g);
    em_buf_free(&b);
}

/* Many helper rules (a repetition) before a named rule is first met: the name index grows past
 * them (found by fuzzing: it once grew by one doubling and then looked for a free slot forever). */
static void test_gbnf_helpers_then_names(void **state) {
    (void)state;
    em_grammar *g = expect_compiled("root ::= (\"a\" | \"a\" r{0,10000} t+ u{2,5})\nr ::= \"r\"\nt ::= \"t\"\nu ::= \"u\"\n", false);
    assert_true(matches(g, "a"));
    assert_true(matches(g, "arrrtuu"));
    assert_false(matches(g, "arrrt"));
    em_grammar_free(g);
}

static void test_gbnf_rule_limit(void **state) {
    (void)state;
    /* More rules than the limit: refused by the limit, whatever the text's size. */
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "root ::= \"a\"\n"));
    for (int i = 0; i < EM_GRAMMAR_MAX_RULES; i++) assert_true(em_buf_printf(&b, "r%d ::= \"a\"\n", i));
    expect_refused(b.data, false, "rules (the limit)");
    em_buf_free(&b);
    /* Repetitions multiply helper rules: also refused by a limit, not compiled for minutes. */
    assert_true(em_buf_printf(&b, "root ::= "));
    for (int i = 0; i < 100; i++) assert_true(em_buf_printf(&b, "\"a\"{0,10000} "));
    expect_refused(b.data, false, "(the limit)");
    em_buf_free(&b);
}

static void test_pattern_nesting(void **state) {
    (void)state;
    char *pattern = repeat3("{\"type\":\"string\",\"pattern\":\"^", 1, "(", 30000, "", 0);
    char *schema = repeat3(pattern, 1, "a", 1, ")", 30000), *full = NULL;
    full = repeat3(schema, 1, "$\"}", 1, "", 0);
    expect_refused(full, true, "nested deeper than");
    free(pattern);
    free(schema);
    free(full);
    pattern = repeat3("{\"type\":\"string\",\"pattern\":\"^", 1, "(", 60, "", 0);
    schema = repeat3(pattern, 1, "a|b", 1, ")", 60);
    full = repeat3(schema, 1, "$\"}", 1, "", 0);
    em_grammar *g = expect_compiled(full, true);
    assert_true(matches(g, "\"a\""));
    assert_true(matches(g, "\"b\""));
    assert_false(matches(g, "\"ab\""));
    em_grammar_free(g);
    free(pattern);
    free(schema);
    free(full);
}

static void test_schema_nesting(void **state) {
    (void)state;
    /* Objects, arrays and anyOf nested 1,000 deep (jansson refuses JSON past 2,048 levels). */
    const char *shapes[][2] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":", "}}"},
        {"{\"type\":\"array\",\"items\":", "}"},
        {"{\"anyOf\":[{\"type\":\"null\"},", "]}"},
        {"{\"type\":\"array\",\"prefixItems\":[", "]}"},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        char *text = repeat3(shapes[i][0], 1000, "{\"type\":\"integer\"}", 1, shapes[i][1], 1000);
        expect_refused(text, true, "nested deeper than");
        free(text);
        text = repeat3(shapes[i][0], 100, "{\"type\":\"integer\"}", 1, shapes[i][1], 100);
        em_grammar_free(expect_compiled(text, true));
        free(text);
    }
    /* 100 objects deep: the innermost value is checked. */
    char *text = repeat3("{\"type\":\"object\",\"properties\":{\"a\":", 100, "{\"type\":\"integer\"}", 1, "},\"required\":[\"a\"]}", 100);
    em_grammar *g = expect_compiled(text, true);
    char *good = repeat3("{\"a\":", 100, "7", 1, "}", 100), *bad = repeat3("{\"a\":", 100, "true", 1, "}", 100);
    assert_true(matches(g, good));
    assert_false(matches(g, bad));
    em_grammar_free(g);
    free(text);
    free(good);
    free(bad);
}

static void test_schema_refs(void **state) {
    (void)state;
    /* A chain of 20,000 $refs: served (each is one rule), not a stack overflow. */
    enum { N = 20000 };
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "{\"$ref\":\"#/$defs/d0\",\"$defs\":{"));
    for (int i = 0; i < N; i++) assert_true(em_buf_printf(&b, "\"d%d\":{\"$ref\":\"#/$defs/d%d\"},", i, i + 1));
    assert_true(em_buf_printf(&b, "\"d%d\":{\"type\":\"integer\"}}}", N));
    em_grammar *g = expect_compiled(b.data, true);
    assert_true(matches(g, "42"));
    assert_false(matches(g, "\"42\""));
    em_grammar_free(g);
    em_buf_free(&b);
    /* Cycles that consume nothing are refused; a cycle through an object is a recursive schema. */
    expect_refused("{\"$ref\":\"#\"}", true, "left-recursive");
    expect_refused("{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"}]}}}",
                   true, "left-recursive");
    g = expect_compiled("{\"$ref\":\"#/$defs/t\",\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\","
                        "\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"kids\"]}}}",
                        true);
    assert_true(matches(g, "{\"kids\":[{\"kids\":[]},{\"kids\":[{\"kids\":[]}]}]}"));
    assert_false(matches(g, "{\"kids\":[{}]}"));
    em_grammar_free(g);
}

/* ---- Width ---- */

static void test_wide_enum(void **state) {
    (void)state;
    /* 1,000 values sharing prefixes, plus numbers and a prefix of another value. */
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "{\"enum\":["));
    for (int i = 0; i < 1000; i++) assert_true(em_buf_printf(&b, "\"value-%d\",", i));
    assert_true(em_buf_printf(&b, "1,12,\"value-\",null,{\"k\":[1]},\"value-7\"]}"));
    em_grammar *g = expect_compiled(b.data, true);
    const char *good[] = {"\"value-0\"", "\"value-999\"", "\"value-7\"", "\"value-\"", "1", "12", "null", "{\"k\":[1]}"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (!matches(g, good[i])) fail_msg("enum should accept %s", good[i]);
    const char *bad[] = {"\"value-1000\"", "\"value\"", "123", "\"value-07\"", "2", "\"\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (matches(g, bad[i])) fail_msg("enum should reject %s", bad[i]);
    em_grammar_free(g);
    em_buf_free(&b);
    /* Values that differ inside a character (é and è share their first byte), and long ones. */
    char *long_value = repeat3("\"", 1, "x", 1000, "\"", 1), *long_enum = NULL;
    assert_true(asprintf(&long_enum, "{\"enum\":[\"é\",\"è\",\"日本\",\"日本語\",%s]}", long_value) > 0);
    g = expect_compiled(long_enum, true);
    assert_true(matches(g, "\"é\""));
    assert_true(matches(g, "\"è\""));
    assert_true(matches(g, "\"日本語\""));
    assert_true(matches(g, long_value));
    assert_false(matches(g, "\"e\""));
    assert_false(matches(g, "\"日\""));
    em_grammar_free(g);
    free(long_enum);
    free(long_value);
}

static void test_wide_objects(void **state) {
    (void)state;
    /* 600 optional properties, some required among them. */
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "{\"type\":\"object\",\"properties\":{"));
    for (int i = 0; i < 600; i++) assert_true(em_buf_printf(&b, "%s\"p%d\":{\"type\":\"integer\"}", i ? "," : "", i));
    assert_true(em_buf_printf(&b, "},\"required\":[\"p300\"],\"additionalProperties\":false}"));
    em_grammar *g = expect_compiled(b.data, true);
    const char *good[] = {"{\"p300\":1}", "{\"p0\":1,\"p300\":2}", "{\"p299\":1, \"p300\":2, \"p599\":3}",
                          "{\"p1\":1,\"p2\":2,\"p300\":3,\"p301\":4}"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (!matches(g, good[i])) fail_msg("object should accept %s", good[i]);
    const char *bad[] = {"{}", "{\"p0\":1}", "{\"p2\":1,\"p1\":2,\"p300\":3}", "{\"p300\":1,\"p300\":1}",
                         "{\"p300\":1,\"p600\":1}", "{\"p300\":\"x\"}", "{\"p1\":1,\"p1\":1,\"p300\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (matches(g, bad[i])) fail_msg("object should reject %s", bad[i]);
    em_grammar_free(g);
    em_buf_free(&b);
    /* All optional, with extra properties allowed. */
    assert_true(em_buf_printf(&b, "{\"type\":\"object\",\"properties\":{"));
    for (int i = 0; i < 400; i++) assert_true(em_buf_printf(&b, "%s\"name%d\":{\"type\":\"boolean\"}", i ? "," : "", i));
    assert_true(em_buf_printf(&b, "},\"additionalProperties\":{\"type\":\"null\"}}"));
    g = expect_compiled(b.data, true);
    assert_true(matches(g, "{}"));
    assert_true(matches(g, "{\"name3\":true,\"name399\":false}"));
    assert_true(matches(g, "{\"name3\":true,\"other\":null}"));
    assert_true(matches(g, "{\"other\":null}"));
    assert_false(matches(g, "{\"name3\":1}"));
    em_grammar_free(g);
    em_buf_free(&b);
    /* 10,000 properties: compiled. */
    assert_true(em_buf_printf(&b, "{\"type\":\"object\",\"properties\":{"));
    for (int i = 0; i < 10000; i++) assert_true(em_buf_printf(&b, "%s\"property_%d\":{\"type\":\"string\"}", i ? "," : "", i));
    assert_true(em_buf_printf(&b, "}}"));
    g = expect_compiled(b.data, true);
    assert_true(matches(g, "{\"property_17\":\"x\",\"property_9999\":\"y\"}"));
    em_grammar_free(g);
    em_buf_free(&b);
    /* 100,000 properties: refused by the rule limit before they are converted. */
    assert_true(em_buf_printf(&b, "{\"type\":\"object\",\"properties\":{"));
    for (int i = 0; i < 100000; i++) assert_true(em_buf_printf(&b, "%s\"p%d\":{}", i ? "," : "", i));
    assert_true(em_buf_printf(&b, "}}"));
    expect_refused(b.data, true, "an object of 100000 properties needs more than 262144 rules (the limit)");
    em_buf_free(&b);
    /* 30,000 properties whose names share long prefixes: the rules of their tries count too, so
     * the converter refuses it rather than write tens of megabytes of GBNF for the compiler to refuse. */
    assert_true(em_buf_printf(&b, "{\"type\":\"object\",\"properties\":{"));
    for (int i = 0; i < 30000; i++) assert_true(em_buf_printf(&b, "%s\"property_%d\":{\"type\":\"string\"}", i ? "," : "", i));
    assert_true(em_buf_printf(&b, "}}"));
    expect_refused(b.data, true, "json schema at '/': more than 262144 rules (the limit)");
    em_buf_free(&b);
}

static void test_wide_any_of(void **state) {
    (void)state;
    /* anyOf of 500 constants and enums is one choice of literals. */
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "{\"anyOf\":["));
    for (int i = 0; i < 500; i++) assert_true(em_buf_printf(&b, "{\"const\":\"c%d\"},", i));
    assert_true(em_buf_printf(&b, "{\"enum\":[true,false]}]}"));
    em_grammar *g = expect_compiled(b.data, true);
    assert_true(matches(g, "\"c0\""));
    assert_true(matches(g, "\"c499\""));
    assert_true(matches(g, "false"));
    assert_false(matches(g, "\"c500\""));
    em_grammar_free(g);
    em_buf_free(&b);
    /* anyOf of 300 objects that all begin alike is too ambiguous to follow: refused up front. */
    assert_true(em_buf_printf(&b, "{\"anyOf\":["));
    for (int i = 0; i < 300; i++)
        assert_true(em_buf_printf(&b, "%s{\"type\":\"object\",\"properties\":{\"k%d\":{\"type\":\"integer\"}},\"required\":[\"k%d\"]}",
                                  i ? "," : "", i, i));
    assert_true(em_buf_printf(&b, "]}"));
    expect_refused(b.data, true, "more than 256 parse stacks");
    /* The same inside an array's items (not at the grammar's start): refused up front too. */
    char *items = NULL;
    assert_true(asprintf(&items, "{\"type\":\"array\",\"items\":%s}", b.data) > 0);
    expect_refused(items, true, "more than 256 parse stacks");
    free(items);
    em_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_nesting),  cmocka_unit_test(test_gbnf_rule_chain), cmocka_unit_test(test_gbnf_helpers_then_names),
        cmocka_unit_test(test_gbnf_rule_limit),
        cmocka_unit_test(test_pattern_nesting), cmocka_unit_test(test_schema_nesting), cmocka_unit_test(test_schema_refs),
        cmocka_unit_test(test_wide_enum),     cmocka_unit_test(test_wide_objects),    cmocka_unit_test(test_wide_any_of),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
