/* Unit tests of src/chat: each construct renders to an exact string (checked against the reference
 * renderer, @huggingface/jinja 0.5.11, when the cases were written), and bad templates fail with
 * the line and column of the offending construct. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <pthread.h>

#include "chat/chat.h"

/* Renders `tpl` with the JSON object `ctx` (NULL: no variables) at a fixed instant. */
static char *render(const char *tpl, const char *ctx, em_err *err_out) {
    em_chat_template *t = NULL;
    em_err err = em_chat_template_parse(tpl, strlen(tpl), &t);
    char *out = NULL;
    size_t len = 0;
    if (!err) {
        json_t *c = NULL;
        if (ctx) {
            json_error_t je;
            c = json_loads(ctx, 0, &je);
            assert_non_null(c);
        }
        em_chat_render_options o = {.now = 1767268800}; /* 2026-01-01 12:00 UTC */
        err = em_chat_render(t, c, &o, &out, &len);
        json_decref(c);
    }
    em_chat_template_free(t);
    *err_out = err;
    if (out) assert_int_equal(strlen(out), len);
    return out;
}

static void expect(const char *tpl, const char *ctx, const char *want) {
    em_err err;
    char *got = render(tpl, ctx, &err);
    if (err) fail_msg("template %s failed: %s", tpl, em_err_message(err));
    if (strcmp(got, want)) fail_msg("template %s\n  want [%s]\n  got  [%s]", tpl, want, got);
    free(got);
}

/* The render (or parse) fails and the message contains `want`. */
static void expect_error(const char *tpl, const char *ctx, const char *want) {
    em_err err;
    char *got = render(tpl, ctx, &err);
    if (!err) fail_msg("template %s rendered [%s], expected an error with '%s'", tpl, got, want);
    if (!strstr(em_err_message(err), want)) fail_msg("template %s: error '%s' lacks '%s'", tpl, em_err_message(err), want);
    em_err_free(err);
    free(got);
}

static void test_text_and_whitespace(void **state) {
    (void)state;
    expect("plain text\n", NULL, "plain text");               /* one trailing newline dropped */
    expect("a\n\n", NULL, "a\n");
    expect("{% if true %}\nyes\n{% endif %}\n", NULL, "yes\n"); /* trim_blocks */
    expect("  {% if true %}x{% endif %}", NULL, "x");           /* lstrip_blocks */
    expect("  {{ 'x' }}", NULL, "  x");                         /* not for expressions */
    expect("a  {{- 'b' -}}  c", NULL, "abc");
    expect("a \n {%- if true -%} \n b {%- endif %}", NULL, "ab");
    expect("a {#- comment -#} b", NULL, "ab");
    expect("a{# comment #}\nb", NULL, "ab");
    expect("x {% generation %}kept{% endgeneration %} y", NULL, "x kept y");
    expect("x {%- generation -%} kept {%- endgeneration %}", NULL, "xkept");
}

static void test_literals_and_printing(void **state) {
    (void)state;
    expect("{{ 1 }} {{ -2 }} {{ 1.0 }} {{ 2.50 }} {{ 0.1 + 0.2 }}", NULL, "1 -2 1.0 2.5 0.30000000000000004");
    expect("{{ true }} {{ True }} {{ none }}|{{ undefined_name }}|", NULL, "true true ||");
    expect("{{ 'a' 'b' }} {{ \"q\\\"\\n\" }}", NULL, "ab q\"\n");
    expect("{{ [1, 'a', none] }} {{ {'k': [true]} }}", NULL, "[1, \"a\", null] {\"k\": [true]}");
    expect_error("{{ (1, 2) }}", NULL, "cannot convert a tuple to JSON"); /* the reference cannot print tuples */
    expect("{{ 7 / 2 }} {{ 6 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 3 }} {{ 2 ** -1 }}", NULL, "3.5 3.0 3 -4 1 8 0.5");
    expect("{{ 1 + 2.0 }} {{ 'a' + 1 }} {{ 1 ~ 2.0 ~ 'x' }} {{ [1, none] ~ '' }}", NULL, "3.0 a1 12x 1,undefined");
    expect_error("{{ 1 ~ none }}", NULL, "cannot apply '~' to none");
    /* Numbers are JavaScript doubles in the reference: big integers round and print as there. */
    expect("{{ n }} {{ m }} {{ 2 ** 62 }} {{ 3 ** 40 }} {{ m is integer }} {{ 0 // 0 }} {{ 1 // 0 }} {{ [0 // 0] | tojson }}",
           "{\"n\": 9007199254740993, \"m\": 9223372036854775807}",
           "9007199254740992 9223372036854776000 4611686018427388000 12157665459056929000 true NaN Infinity [null]");
    expect("{{ 'ab' * 1 if false else 'x' }}", NULL, "x");
    /* Escapes the reference rejects get Jinja's (Python's) meaning: line continuation, octal, \\a,
     * \\U; unknown escapes stay as written. */
    expect("{{ 'a\\\nb' }}|{{ '\\101\\a\\d' }}|{{ '\\U0001F600' }}", NULL, "ab|A\a\\d|\xf0\x9f\x98\x80");
}

static void test_conditions(void **state) {
    (void)state;
    const char *t = "{% if x > 2 %}big{% elif x == 2 %}two{% else %}small{% endif %}";
    expect(t, "{\"x\": 3}", "big");
    expect(t, "{\"x\": 2}", "two");
    expect(t, "{\"x\": 1}", "small");
    expect("{{ 'y' if [] else 'n' }}{{ 'y' if {} else 'n' }}{{ 'y' if 'a' else 'n' }}{{ 'y' if 0.0 else 'n' }}", NULL, "nnyn");
    expect("{{ 1 and 2 }} {{ 0 or 'z' }} {{ not 1 }} {{ 1 == 1.0 }} {{ 'a' != 'a' }}", NULL, "2 z false true false");
    expect("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'x' in missing }}", NULL,
           "true true true true false");
    expect("{{ 'x' if false }}|", NULL, "|");
}

static void test_loops(void **state) {
    (void)state;
    expect("{% for x in [10, 20, 30] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
           "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
           NULL, "1032truefalse3;2121falsefalse3;3210falsetrue3;");
    expect("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty");
    expect("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{% endfor %}", NULL, "24");
    expect("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", NULL, "a=1;b=2;");
    expect("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}", NULL, "ab");
    expect("{% for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}", NULL,
           "023");
    expect("{% for x in [1, 2] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", NULL, "-2;1-;");
    /* One scope for all iterations: a set inside is seen by later iterations, not after the loop. */
    expect("{% set x = 'out' %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{% endfor %}{{ x }}", NULL, "out1out");
    expect("{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}{% for i in range(3, 0, -1) %}{{ i }}{% endfor %}", NULL, "147321");
}

static void test_set_namespace_macro_call(void **state) {
    (void)state;
    expect("{% set a, b = 1, 2 %}{{ a + b }}", NULL, "3");
    expect("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", NULL, "6");
    expect("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns }}", NULL, "12{\"a\": 1, \"b\": 2}");
    expect("{% set s %}inner {{ 1 + 1 }}{% endset %}[{{ s }}]", NULL, "[inner 2]");
    expect("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, 2) }} {{ m(a=3, b=4) }}", NULL, "1B 12 34");
    expect("{% macro v() %}{{ varargs | length }}{{ kwargs | length }}{% endmacro %}{{ v(1, 2, k=3) }}", NULL, "21");
    expect("{% macro wrap(x) %}<{{ caller() }}{{ x }}>{% endmacro %}{% call wrap('!') %}body{% endcall %}", NULL, "<body!>");
    expect("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
           "{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}", NULL, "[1][2]");
    expect("{% filter upper %}shout {{ 'it' }}{% endfilter %}", NULL, "SHOUT IT");
}

static void test_filters(void **state) {
    (void)state;
    expect("{{ '  x  ' | trim }}|{{ 'abc' | upper }}{{ 'ABC' | lower }} {{ 'hello big world' | title }} {{ 'hELLO' | capitalize }}", NULL,
           "x|ABCabc Hello Big World HELLO");
    /* Case mapping is JavaScript's: full mappings (ß → SS) and final sigma. */
    expect("{{ 'straße ﬁ' | upper }}|{{ 'ΟΔΟΣ Σ' | lower }}|{{ 'İ' | lower | length }}|{{ 'ßa' | capitalize }}", NULL,
           "STRASSE FI|οδος σ|2|SSa");
    expect("{{ 'aXbX' | replace('X', '-') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | replace('', '.') }}", NULL, "a-b- bba .a.b.");
    expect("{{ [3, 1, 2] | length }} {{ 'héllo' | length }} {{ {'a': 1} | length }} {{ '😀' | length }}", NULL, "3 5 1 2");
    expect("{{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }} {{ [1, 2] | join }} {{ ['a', 'b'] | join(', ') }} {{ 'abc' | join('-') }}", NULL,
           "13 12 a, b a-b-c");
    expect("{{ [3, 1, 2] | sort | list }} {{ ['b', 'A', 'c'] | sort }} {{ [1, 2] | reverse }} {{ [1, 1, 2, 1] | unique }}", NULL,
           "[1, 2, 3] [\"A\", \"b\", \"c\"] [2, 1] [1, 2]");
    expect("{{ x | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | default('d') }}", NULL, "d  d ");
    expect("{{ '42' | int }} {{ 'x' | int }} {{ '3.5' | float }} {{ 3.9 | int }} {{ true | int }} {{ 5 | string }}{{ [1] | string }}", NULL,
           "42 0 3.5 3 1 5[1]");
    expect("{{ {'b': 1, 'a': 2} | items | list }} {{ {'b': 1, 'a': 2} | dictsort }}", NULL,
           "[[\"b\", 1], [\"a\", 2]] [[\"a\", 2], [\"b\", 1]]");
    const char *people = "{\"p\": [{\"n\": \"a\", \"age\": 3, \"ok\": true}, {\"n\": \"b\", \"age\": 1, \"ok\": false}, {\"n\": \"c\"}]}";
    expect("{{ p | selectattr('ok') | map(attribute='n') | join }} {{ p | rejectattr('ok') | map(attribute='n') | join }}", people, "a bc");
    expect("{{ p | selectattr('n', 'equalto', 'b') | list | length }} {{ p | map(attribute='age', default=0) | list }}", people,
           "1 [3, 1, 0]");
    expect("{{ p | sort(attribute='n', reverse=true) | map(attribute='n') | join }}", people, "cba");
    /* map with a filter name: Jinja's meaning (the reference rejects this form). */
    expect("{{ ['a', 'b'] | map('upper') | join }} {{ ['a b'] | map('replace', ' ', '_') | list }}", NULL, "AB [\"a_b\"]");
    expect("{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(1, blank=true) }}", NULL,
           "a\n    b\n\n    c|  a\n  b|a\n \n b");
}

static void test_tojson(void **state) {
    (void)state;
    const char *ctx = "{\"v\": {\"s\": \"é\\\"\\n\\u0001</\", \"n\": [1, 2.5, true, null], \"e\": {}, \"l\": []}}";
    expect("{{ v | tojson }}", ctx, "{\"s\": \"é\\\"\\n\\u0001</\", \"n\": [1, 2.5, true, null], \"e\": {}, \"l\": []}");
    expect("{{ v.n | tojson(indent=2) }}", ctx, "[\n  1,\n  2.5,\n  true,\n  null\n]");
    expect("{{ v | tojson(indent=1) }}", ctx,
           "{\n \"s\": \"é\\\"\\n\\u0001</\",\n \"n\": [\n  1,\n  2.5,\n  true,\n  null\n ],\n \"e\": {},\n \"l\": []\n}");
    expect("{{ v.s | tojson(ensure_ascii=true) }} {{ '😀' | tojson(ensure_ascii=true) }}", ctx, "\"\\u00e9\\\"\\n\\u0001</\" \"\\ud83d\\ude00\"");
    expect("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ [1, {'a': 2}] | tojson(separators=(',', ':')) }}", NULL,
           "{\"a\": 2, \"b\": 1} [1,{\"a\":2}]");
    expect("{{ {'x': undefined_name} | tojson }} {{ {'x': undefined_name} }}", NULL, "{\"x\": null} {\"x\": undefined}");
    /* JSON input: integral reals become integers, index-like keys come first (JavaScript objects). */
    expect("{{ v | tojson }}", "{\"v\": {\"b\": 1.0, \"10\": 2, \"a\": 1.5, \"2\": 3}}", "{\"2\": 3, \"10\": 2, \"b\": 1, \"a\": 1.5}");
    /* 100,000 index keys in descending order (a request's object): sorted, not inserted one by one. */
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "{\"v\": {\"k\": 0"));
    for (int i = 100000; i-- > 0;) assert_true(em_buf_printf(&b, ", \"%d\": %d", i, i));
    assert_true(em_buf_printf(&b, "}}"));
    expect("{{ v | length }}{% for k in v %}{% if loop.index <= 3 or loop.last %} {{ k }}{% endif %}{% endfor %}", b.data,
           "100001 0 1 2 k");
    em_buf_free(&b);
}

static void test_tests_and_methods(void **state) {
    (void)state;
    expect("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}{{ 1.5 is integer }}", NULL,
           "falsetruetruetruetruefalse");
    expect("{{ {} is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ {} is sequence }}{{ 3 is odd }}{{ true is boolean }}", NULL,
           "truetruetruetruetruetrue");
    expect("{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ x is not defined }}{{ range is callable }}", NULL, "truetruetruetrue");
    expect("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }}", NULL,
           "[\"a\", \"b\", \"\", \"c\"] [\"a\", \"b\"] [\"a\", \"b c\"]");
    expect("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ '\n x \n'.strip('\n') }}|{{ ' x '.lstrip() }}|{{ ' x '.rstrip() }}|",
           NULL, "truetrue|x|x | x|");
    expect("{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'a b'.title() }}{{ 'ab'.replace('a', 'c') }}{{ 'abc'.length }}", NULL, "HIhiA Bcb3");
    expect("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 9) }}{{ d.keys() }}{{ d.values() }}{{ d.items() }}", "{\"d\": {\"a\": 1}}",
           "19[\"a\"][1][[\"a\", 1]]");
    expect("{{ 'abcdef'[1:3] }} {{ 'abcdef'[::-2] }} {{ 'abc'[-1] }} {{ [1, 2, 3, 4][::2] }} {{ [1, 2, 3][-2:] }} {{ [1, 2][5] is defined }}",
           NULL, "bc fdb c [1, 3] [2, 3] false");
    expect("{{ strftime_now('%Y-%m-%d %H:%M %b %B %%d %Q') }}", NULL, "2026-01-01 12:00 Jan January %d %Q");
}

static void test_render_input(void **state) {
    (void)state;
    const char *src = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}{{ tools | length if tools is defined }}{{ eos_token }}"
                      "{{ enable_thinking }}";
    em_chat_template *t;
    assert_null(em_chat_template_parse(src, strlen(src), &t));
    json_t *messages = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    json_t *tools = json_loads("[{\"type\": \"function\"}]", 0, NULL);
    json_t *extra = json_loads("{\"enable_thinking\": false}", 0, NULL);
    em_chat_input in = {.messages = messages, .tools = tools, .bos_token = "<s>", .eos_token = "</s>",
                        .add_generation_prompt = true, .extra = extra};
    char *out;
    size_t len;
    assert_null(em_chat_render_input(t, &in, NULL, &out, &len));
    assert_string_equal(out, "<s><user>hi<assistant>1</s>false");
    free(out);
    in = (em_chat_input){.messages = messages};
    assert_null(em_chat_render_input(t, &in, NULL, &out, &len));
    assert_string_equal(out, "<user>hi");
    free(out);
    json_decref(messages);
    json_decref(tools);
    json_decref(extra);
    em_chat_template_free(t);
}

static void test_errors_name_position(void **state) {
    (void)state;
    expect_error("ok\n  {% include 'x' %}", NULL, "line 2, column 3: unknown or unsupported statement 'include'");
    expect_error("{% if x %}never closed", NULL, "line 1, column 11: 'if' block is never closed");
    expect_error("{{ 1 + }}", NULL, "line 1, column 8: expected an expression");
    expect_error("{{ 'abc }}", NULL, "line 1, column 4: unterminated string literal");
    expect_error("a\nb {{ x ; }}", NULL, "line 2, column 8: unexpected character ';'");
    expect_error("{# open comment", NULL, "line 1, column 1: comment is not closed");
    expect_error("{{ x | nosuch }}", "{\"x\": \"s\"}", "line 1, column 8: unknown or unsupported filter 'nosuch'");
    expect_error("\n{{ raise_exception('bad input') }}", NULL, "line 2, column 4: raise_exception: bad input");
    expect_error("{{ x + 1 }}", NULL, "line 1, column 6: cannot apply '+' to an undefined value");
    expect_error("{{ 'a' < 'b' }}", NULL, "operator '<' does not apply to string and string");
    expect_error("{{ x is nosuchtest }}", NULL, "unknown test 'nosuchtest'");
    expect_error("{{ [] | first }}", NULL, "'first' of an empty list");
    expect_error("{% macro m() %}{% endmacro %}{{ m(1) }}", NULL, "takes at most 0 argument(s)");
    expect_error("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", NULL, "nested too deeply");
    expect_error("{{ m }}", "{\"m\": 1, \"true\": 2}", "'true' is already declared");
    expect_error("{% break %}", NULL, "outside a loop");
    expect_error("{{ ns.x }}{% set ns.x = 1 %}", "{\"ns\": {}}", "can only assign attributes of a namespace");
}

static void test_hostile_input_is_refused(void **state) {
    (void)state;
    /* Deep nesting is an error, not a stack overflow. */
    size_t n = 100000;
    char *deep = malloc(n * 2 + 16);
    char *p;
    assert_non_null(deep);
    strcpy(deep, "{{ ");
    for (size_t i = 0; i < n; i++) strcat(deep + 3 + i, "(");
    expect_error(deep, NULL, "nested too deeply");
    p = deep;
    p += sprintf(p, "{{ 1");
    for (size_t i = 0; i < 20000; i++) p += sprintf(p, "+1");
    strcpy(p, " }}");
    expect_error(deep, NULL, "nested too deeply");
    /* Long chains of calls, member accesses and filters, in and out of macros. */
    const char *chains[] = {"(1)", ".a", "|trim", "+1"};
    for (size_t c = 0; c < 4; c++) {
        p = deep;
        p += sprintf(p, "{%% macro m() %%}{{ x");
        for (size_t i = 0; i < 20000; i++) p += sprintf(p, "%s", chains[c]);
        strcpy(p, " }}{% endmacro %}{{ m() }}");
        expect_error(deep, NULL, "nested too deeply");
    }
    /* Recursion through nested blocks stops at the depth bound. */
    p = deep;
    p += sprintf(p, "{%% macro m() %%}");
    for (size_t i = 0; i < 150; i++) p += sprintf(p, "{%% if true %%}");
    p += sprintf(p, "{{ m() }}");
    for (size_t i = 0; i < 150; i++) p += sprintf(p, "{%% endif %%}");
    strcpy(p, "{% endmacro %}{{ m() }}");
    expect_error(deep, NULL, "nested too deeply");
    free(deep);
    expect_error("{{ range(100000000) | length }}", NULL, "range() of more than a million numbers");

    /* Step and byte bounds. */
    const char *forever = "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}";
    const char *doubling = "{% set s = namespace(v='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set s.v = s.v + s.v %}{% endfor %}";
    em_chat_template *t;
    char *out = NULL;
    size_t len;
    assert_null(em_chat_template_parse(forever, strlen(forever), &t));
    em_chat_render_options o = {.now = 0, .max_steps = 100000};
    em_err err = em_chat_render(t, NULL, &o, &out, &len);
    assert_non_null(err);
    assert_non_null(strstr(em_err_message(err), "more than 100000 steps"));
    assert_int_equal(em_err_code_of(err), EM_ERR_RANGE);
    assert_null(out);
    em_err_free(err);
    em_chat_template_free(t);
    assert_null(em_chat_template_parse(doubling, strlen(doubling), &t));
    o = (em_chat_render_options){.now = 0, .max_bytes = 8u << 20};
    err = em_chat_render(t, NULL, &o, &out, &len);
    assert_non_null(err);
    assert_non_null(strstr(em_err_message(err), "byte limit"));
    em_err_free(err);
    em_chat_template_free(t);
}

/* ---- On a small stack ---- */

typedef struct render_job {
    char *tpl;
    em_err err;
    char *out;
} render_job;

static void *render_on_thread(void *arg) {
    render_job *j = arg;
    em_chat_template *t = NULL;
    size_t len = 0;
    j->err = em_chat_template_parse(j->tpl, strlen(j->tpl), &t);
    em_chat_render_options o = {.now = 1767268800};
    if (!j->err) j->err = em_chat_render(t, NULL, &o, &j->out, &len);
    em_chat_template_free(t);
    return NULL;
}

/* Parses and renders `tpl` (taken) on a thread with a 512 KiB stack: the parser's and the
 * evaluator's depth bounds must keep them inside it, sanitizers included. */
static void expect_on_small_stack(char *tpl, const char *want_error, const char *want_output) {
    render_job j = {.tpl = tpl};
    pthread_attr_t attr;
    pthread_t thread;
    assert_int_equal(pthread_attr_init(&attr), 0);
    assert_int_equal(pthread_attr_setstacksize(&attr, 512 * 1024), 0);
    assert_int_equal(pthread_create(&thread, &attr, render_on_thread, &j), 0);
    assert_int_equal(pthread_join(thread, NULL), 0);
    pthread_attr_destroy(&attr);
    if (want_error && !j.err) fail_msg("%.60s... rendered, expected '%s'", tpl, want_error);
    if (want_error && !strstr(em_err_message(j.err), want_error)) fail_msg("error '%s' lacks '%s'", em_err_message(j.err), want_error);
    if (want_output && j.err) fail_msg("%.60s...: %s", tpl, em_err_message(j.err));
    if (want_output && strcmp(j.out, want_output)) fail_msg("got [%s], want [%s]", j.out, want_output);
    em_err_free(j.err);
    free(j.out);
    free(tpl);
}

/* open * n, middle, close * n, between prefix and suffix. */
static char *nest(const char *prefix, const char *open, size_t n, const char *middle, const char *close, const char *suffix) {
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "%s", prefix));
    for (size_t i = 0; i < n; i++) assert_true(em_buf_printf(&b, "%s", open));
    assert_true(em_buf_printf(&b, "%s", middle));
    for (size_t i = 0; i < n; i++) assert_true(em_buf_printf(&b, "%s", close));
    assert_true(em_buf_printf(&b, "%s", suffix));
    return b.data;
}

static void test_depth_bounds_fit_a_small_stack(void **state) {
    (void)state;
    expect_on_small_stack(nest("{{ ", "(", 30000, "1", ")", " }}"), "nested too deeply", NULL);
    expect_on_small_stack(nest("", "{% if true %}", 30000, "x", "{% endif %}", ""), "nested too deeply", NULL);
    expect_on_small_stack(nest("{{ ", "[", 30000, "1", "]", " }}"), "nested too deeply", NULL);
    expect_on_small_stack(nest("{{ ", "not ", 30000, "1", "", " }}"), "nested too deeply", NULL);
    expect_on_small_stack(nest("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", "", 0, "", "", ""), "nested too deeply", NULL);
    expect_on_small_stack(nest("{% macro m(n) %}", "{% if true %}", 40, "{{ m(n + 1) }}", "{% endif %}", "{% endmacro %}{{ m(0) }}"),
                          "nested too deeply", NULL);
    /* Depth a real template could have still renders. */
    expect_on_small_stack(nest("{{ ", "(", 30, "1", ")", " }}"), NULL, "1");
    expect_on_small_stack(nest("", "{% if true %}", 30, "x", "{% endif %}", ""), NULL, "x");
    expect_on_small_stack(nest("{% macro m(n) %}{% if n < 20 %}{{ m(n + 1) }}{% else %}{{ n }}{% endif %}{% endmacro %}{{ m(0) }}", "", 0,
                               "", "", ""),
                          NULL, "20");
}

int main(void) {
    setenv("TZ", "UTC", 1); /* strftime_now formats local time */
    tzset();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_and_whitespace),
        cmocka_unit_test(test_literals_and_printing),
        cmocka_unit_test(test_conditions),
        cmocka_unit_test(test_loops),
        cmocka_unit_test(test_set_namespace_macro_call),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_tojson),
        cmocka_unit_test(test_tests_and_methods),
        cmocka_unit_test(test_render_input),
        cmocka_unit_test(test_errors_name_position),
        cmocka_unit_test(test_hostile_input_is_refused),
        cmocka_unit_test(test_depth_bounds_fit_a_small_stack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
