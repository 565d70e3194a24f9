/* Gemma 4's answers in the server: thoughts into reasoning, calls in Gemma's argument syntax into
 * JSON arguments (whole and streamed in pieces), malformed and truncated answers into text with
 * nothing lost and nothing crashed, the format told from Gemma 4's real chat templates (the model
 * card's and the one inside llama.cpp's gemma-4 vocabulary), and the grammars that force a call or
 * a response format in Gemma's syntax. The texts are written as the template writes calls back
 * (tests/fixtures/chat/gemma4.jinja, format_argument); tests/js/gemma4_recorded.mjs takes recorded
 * answers through the official OpenAI and Anthropic clients on the HTTP server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "gguf/gguf.h"

#include "answer_check.h"
#include "server_fake.h"
#include "server_js.h"

#define Q "<|\"|>" /* Gemma's string quote */
#define THOUGHT(text) "<|channel>thought\n" text "<channel|>"
#define CALL(name, args) "<|tool_call>call:" name args "<tool_call|>"

#define WEATHER                                                                                                    \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","             \
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"                                \
    "\"units\":{\"type\":\"string\",\"enum\":[\"metric\",\"imperial\"]}},\"required\":[\"city\",\"days\"]}}}"
#define CLOCK "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}"
/* nested objects and lists, a nullable member, numbers and booleans */
#define PLAN                                                                                                       \
    "{\"type\":\"function\",\"function\":{\"name\":\"make_plan\",\"parameters\":{\"type\":\"object\",\"properties\":{" \
    "\"Title\":{\"type\":\"string\"},\"steps\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{"    \
    "\"name\":{\"type\":\"string\"},\"done\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"done\"]}},"                \
    "\"meta\":{\"type\":\"object\",\"properties\":{\"owner\":{\"type\":[\"string\",\"null\"]},"                        \
    "\"ratio\":{\"type\":\"number\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}}},"                  \
    "\"required\":[\"steps\"]}}}"

static em_answer_options gemma4_options(const json_t *tools) {
    return (em_answer_options){.split_reasoning = EM_REASONING_SPLIT, .read_calls = tools != NULL,
                               .format = EM_TOOL_FORMAT_GEMMA4, .tools = tools};
}

static const char *const no_calls[] = {NULL};

/* Thoughts, text and calls, as the model writes them. */
static void test_reading_gemma4(void **state) {
    (void)state;
    json_t *tools = json_loads("[" WEATHER "," CLOCK "," PLAN "]", 0, NULL);
    em_answer_options o = gemma4_options(tools);
    expect_answer(THOUGHT("The user asks for 2+2. That is 4.\n") "2 + 2 = 4.", &o, "2 + 2 = 4.",
                  "The user asks for 2+2. That is 4.", no_calls);
    expect_answer("Hello, world!", &o, "Hello, world!", "", no_calls);
    /* a call, after a thought and after text; <|tool_response> ends the turn (it reaches the text
     * only with ignore_eos) */
    expect_answer(CALL("get_weather", "{city:" Q "Oslo" Q ",days:3}"), &o, "", "",
                  (const char *[]){"get_weather", "{\"city\":\"Oslo\",\"days\":3}", NULL});
    expect_answer(THOUGHT("Weather in Oslo: call get_weather.") CALL("get_weather", "{city:" Q "Oslo" Q ",days:3,units:" Q
                                                                                     "metric" Q "}") "<|tool_response>",
                  &o, "", "Weather in Oslo: call get_weather.",
                  (const char *[]){"get_weather", "{\"city\":\"Oslo\",\"days\":3,\"units\":\"metric\"}", NULL});
    expect_answer("Let me check.\n" CALL("get_time", "{}"), &o, "Let me check.\n", "",
                  (const char *[]){"get_time", "{}", NULL});
    /* two calls in a row, spaces where the grammar allows them */
    expect_answer(CALL("get_time", "{ zone: " Q "UTC" Q " }") CALL("get_weather", "{city: " Q "Bergen" Q ", days: 1}"), &o,
                  "", "",
                  (const char *[]){"get_time", "{\"zone\":\"UTC\"}", "get_weather", "{\"city\":\"Bergen\",\"days\":1}", NULL});
    /* nested objects and lists; strings with quotes, newlines, braces and the other markup inside */
    expect_answer(CALL("make_plan", "{Title:" Q "Say \"hi\"\n\\ {x:1}, <|tool_call>" Q ",meta:{owner:null,ratio:-1.5e3,"
                                    "tags:[]},steps:[{done:false,name:" Q "a" Q "},{done:true,name:" Q "b, c" Q "}]}"),
                  &o, "", "",
                  (const char *[]){"make_plan",
                                   "{\"Title\":\"Say \\\"hi\\\"\\n\\\\ {x:1}, <|tool_call>\",\"meta\":{\"owner\":null,"
                                   "\"ratio\":-1.5e3,\"tags\":[]},\"steps\":[{\"done\":false,\"name\":\"a\"},"
                                   "{\"done\":true,\"name\":\"b, c\"}]}",
                                   NULL});
    /* an empty thought the model closes the answer with, a close that closes nothing, a channel
     * opened twice */
    expect_answer("Answer." THOUGHT(""), &o, "Answer.", "", no_calls);
    expect_answer("<channel|>Hi", &o, "Hi", "", no_calls);
    expect_answer("<|channel><|channel>thought\nx<channel|>y", &o, "y", "x", no_calls);
    /* nothing inside a thought is a call */
    expect_answer(THOUGHT("maybe " CALL("get_time", "{}")) "No.", &o, "No.", "maybe " CALL("get_time", "{}"), no_calls);
    /* cut by max_tokens inside a thought: all of it is reasoning */
    expect_answer("<|channel>thought\nStill thinking ", &o, "", "Still thinking", no_calls);
    /* kept inline (reasoning_format none): the thought is content as written */
    o.split_reasoning = EM_REASONING_INLINE;
    expect_answer(THOUGHT("Sum it.") "4", &o, THOUGHT("Sum it.") "4", "", no_calls);
    json_decref(tools);
}

/* Malformed and truncated answers: text, or a call closed into valid JSON; never a crash. */
static void test_reading_bad_gemma4(void **state) {
    (void)state;
    json_t *tools = json_loads("[" WEATHER "," CLOCK "]", 0, NULL);
    em_answer_options o = gemma4_options(tools);
    /* no call: an unknown tool, no `call:`, no name, a name too long; without tools in the request */
    const char *unknown = CALL("rm", "{path:" Q "/" Q "}");
    expect_answer(unknown, &o, unknown, "", no_calls);
    expect_answer("<|tool_call>get_time{}", &o, "<|tool_call>get_time{}", "", no_calls);
    expect_answer("<|tool_call>call:{}", &o, "<|tool_call>call:{}", "", no_calls);
    char long_name[400] = "<|tool_call>call:";
    memset(long_name + strlen(long_name), 'a', 300);
    strcat(long_name, "{}");
    expect_answer(long_name, &o, long_name, "", no_calls);
    em_answer_options no_tools = gemma4_options(NULL);
    expect_answer(CALL("get_time", "{}"), &no_tools, CALL("get_time", "{}"), "", no_calls);
    /* an unknown call before a known one: only the known one is a call */
    expect_answer(CALL("rm", "{}") CALL("get_time", "{}"), &o, CALL("rm", "{}"), "", (const char *[]){"get_time", "{}", NULL});
    /* a channel that is not a thought */
    expect_answer("<|channel>final\nhi", &o, "<|channel>final\nhi", "", no_calls);
    /* arguments that stop making sense: what came is closed, the rest is text */
    expect_answer(CALL("get_weather", "{city:" Q "Oslo" Q " days:3}"), &o, "days:3}<tool_call|>", "",
                  (const char *[]){"get_weather", "{\"city\":\"Oslo\"}", NULL});
    expect_answer(CALL("get_time", "{zone}"), &o, "zone}<tool_call|>", "", (const char *[]){"get_time", "{}", NULL});
    expect_answer(CALL("get_time", "{a:[1,2}"), &o, "}<tool_call|>", "", (const char *[]){"get_time", "{\"a\":[1,2]}", NULL});
    /* a trailing comma is dropped; a bare word is a string */
    expect_answer(CALL("get_time", "{zone:None,a:[1,],}"), &o, "", "",
                  (const char *[]){"get_time", "{\"zone\":\"None\",\"a\":[1]}", NULL});
    /* nested deeper than the reader keeps */
    char deep[200] = "<|tool_call>call:get_time{a:";
    for (int i = 0; i < 40; i++) strcat(deep, "[");
    char deep_args[200] = "{\"a\":";
    for (int i = 0; i < EM_GEMMA4_MAX_DEPTH - 1; i++) strcat(deep_args, "[");
    for (int i = 0; i < EM_GEMMA4_MAX_DEPTH - 1; i++) strcat(deep_args, "]");
    strcat(deep_args, "}");
    expect_answer(deep, &o, "[[[[[[[[[", "", (const char *[]){"get_time", deep_args, NULL});
    /* cut short: inside a string, after a key, in a number, before the arguments, in the opener */
    expect_answer("<|tool_call>call:get_weather{city:" Q "Os", &o, "", "",
                  (const char *[]){"get_weather", "{\"city\":\"Os\"}", NULL});
    expect_answer("<|tool_call>call:get_weather{city:", &o, "", "", (const char *[]){"get_weather", "{\"city\":null}", NULL});
    expect_answer("<|tool_call>call:get_weather{days:12", &o, "", "", (const char *[]){"get_weather", "{\"days\":12}", NULL});
    expect_answer("<|tool_call>call:get_weat", &o, "<|tool_call>call:get_weat", "", no_calls);
    expect_answer("Hi <|tool_ca", &o, "Hi <|tool_ca", "", no_calls);
    json_decref(tools);
}

/* Texts made of Gemma's markup and argument syntax at random: the pieces read as the whole, and
 * every call's arguments are one JSON object. */
static void test_random_gemma4(void **state) {
    (void)state;
    static const char *const parts[] = {
        "<|channel>", "thought", "\n", "<channel|>", "<|tool_call>", "call:", "get_time", "rm", "{", "}", "[", "]", ":",
        ",", " ", Q, "zone", "1.5", "-", "true", "null", "x", "<tool_call|>", "<|tool_response>", "\"", "\\", "<|", "|>",
    };
    const size_t n_parts = sizeof parts / sizeof parts[0];
    json_t *tools = json_loads("[" CLOCK "]", 0, NULL);
    em_answer_options o = gemma4_options(tools);
    uint64_t seed = 88172645463325252ull;
    char text[512];
    for (int round = 0; round < 1500; round++) {
        text[0] = '\0';
        const int length = 1 + round % 40;
        for (int k = 0; k < length; k++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            /* calls are likely: an opener and a known name start most texts */
            const char *part = k == 0 && seed % 3 ? "<|tool_call>call:get_time{" : parts[seed % n_parts];
            strcat(text, part);
        }
        o.split_reasoning = round % 5 ? EM_REASONING_SPLIT : EM_REASONING_INLINE;
        em_server_choice whole = read_answer(text, &o, strlen(text));
        for (size_t step = 1; step < 4; step++) {
            em_server_choice pieces = read_answer(text, &o, step);
            assert_string_equal(pieces.content.data ? pieces.content.data : "", whole.content.data ? whole.content.data : "");
            assert_string_equal(pieces.reasoning.data ? pieces.reasoning.data : "",
                                whole.reasoning.data ? whole.reasoning.data : "");
            if (!json_equal(pieces.tool_calls, whole.tool_calls) && (pieces.tool_calls || whole.tool_calls))
                fail_msg("%s: the pieces of %zu read differently", text, step);
            em_server_choice_clear(&pieces);
        }
        for (size_t k = 0; k < json_array_size(whole.tool_calls); k++) {
            const char *args = call_field(&whole, k, "arguments");
            json_t *parsed = json_loads(args, 0, NULL);
            if (!json_is_object(parsed)) fail_msg("%s: arguments %s are not a JSON object", text, args);
            json_decref(parsed);
        }
        em_server_choice_clear(&whole);
    }
    json_decref(tools);
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)size + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    data[size] = '\0';
    return data;
}

/* The format told from both of Gemma 4's templates, and the markup the engine must hand on as text. */
static void test_gemma4_format_and_markers(void **state) {
    (void)state;
    char *card = read_file(EM_SOURCE_DIR "/tests/fixtures/chat/gemma4.jinja");
    assert_int_equal(em_server_tool_format_of(card, strlen(card)), EM_TOOL_FORMAT_GEMMA4);
    free(card);
    em_gguf *g;
    em_err e = em_gguf_open(EM_UNPACKED_FIXTURES_DIR "/vocab/ggml-vocab-gemma-4.gguf", &g);
    if (e) fail_msg("%s", em_err_message(e));
    em_str template_text;
    assert_null(em_gguf_get_str(g, "tokenizer.chat_template", &template_text));
    assert_int_equal(em_server_tool_format_of(template_text.ptr, (size_t)template_text.len), EM_TOOL_FORMAT_GEMMA4);
    em_gguf_close(g);

    em_answer_options o = {.format = EM_TOOL_FORMAT_GEMMA4};
    const char *markers[EM_ANSWER_MAX_MARKERS];
    const char *want[] = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", Q};
    assert_int_equal(em_answer_markers(&o, markers), 5);
    for (size_t i = 0; i < 5; i++) assert_string_equal(markers[i], want[i]);
    assert_string_equal(em_tool_call_openers(EM_TOOL_FORMAT_GEMMA4)[0], "<|tool_call>");
}

/* Forced calls, `auto`'s lazy grammar and response_format, in Gemma's syntax and the schemas' terms. */
static void test_gemma4_grammars(void **state) {
    (void)state;
    em_server_request req;
    em_server_error err = {0};
    const em_server_grammar_maker unshared = {0};
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER "," CLOCK
               "," PLAN "],\"tool_choice\":\"required\"}",
               &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_GEMMA4, false, false, &err));
    assert_null(req.grammar_triggers);
    assert_true(grammar_takes(&req, CALL("get_weather", "{city:" Q "Oslo" Q ",days:3}")));
    assert_true(grammar_takes(&req, CALL("get_weather", "{city: " Q "Oslo" Q ", days: -2, units:" Q "imperial" Q "}")));
    assert_true(grammar_takes(&req, THOUGHT("Call it, <channel| <|tool_call>.") CALL("get_time", "{}")));
    assert_true(grammar_takes(&req, CALL("get_time", "{zone:" Q "UTC" Q ",n:[1,{a:null}]}"))); /* any arguments */
    /* keys in dictsort's order, case folded: meta, steps, Title */
    assert_true(grammar_takes(&req, CALL("make_plan", "{meta:{owner:null,ratio:0.5,tags:[" Q "a" Q "]},steps:[{done:false,"
                                                      "name:" Q "a" Q "}],Title:" Q "x" Q "}")));
    assert_false(grammar_takes(&req, CALL("make_plan", "{Title:" Q "x" Q ",steps:[]}")));
    assert_true(grammar_takes(&req, CALL("make_plan", "{steps:[]}")));
    assert_true(grammar_takes(&req, CALL("make_plan", "{meta:{owner:" Q "me" Q "},steps:[]}")));
    /* what the schemas rule out: a missing required member, a wrong type, a value not in the enum,
     * members out of the template's order, an unknown member, a string in JSON's quotes */
    assert_false(grammar_takes(&req, CALL("get_weather", "{city:" Q "Oslo" Q "}")));
    assert_false(grammar_takes(&req, CALL("get_weather", "{city:" Q "Oslo" Q ",days:2.5}")));
    assert_false(grammar_takes(&req, CALL("get_weather", "{city:" Q "Oslo" Q ",days:2,units:" Q "kelvin" Q "}")));
    assert_false(grammar_takes(&req, CALL("get_weather", "{days:2,city:" Q "Oslo" Q "}")));
    assert_false(grammar_takes(&req, CALL("get_weather", "{city:" Q "Oslo" Q ",days:2,wind:true}")));
    assert_false(grammar_takes(&req, CALL("get_weather", "{city:\"Oslo\",days:2}")));
    assert_false(grammar_takes(&req, CALL("make_plan", "{steps:[{name:" Q "a" Q ",done:false}]}")));
    assert_false(grammar_takes(&req, CALL("make_plan", "{steps:[{done:0,name:" Q "a" Q "}]}")));
    assert_false(grammar_takes(&req, CALL("rm", "{}")));
    assert_false(grammar_takes(&req, "No call." CALL("get_time", "{}")));
    assert_false(grammar_takes(&req, "{\"name\":\"get_time\",\"arguments\":{}}"));
    em_server_request_clear(&req);

    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER "," CLOCK
               "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}}",
               &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_GEMMA4, false, false, &err));
    assert_true(grammar_takes(&req, CALL("get_time", "{}")));
    assert_false(grammar_takes(&req, CALL("get_weather", "{city:" Q "Oslo" Q ",days:3}")));
    em_server_request_clear(&req);

    /* auto: free until <|tool_call>, then the call */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER "]}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_GEMMA4, false, false, &err));
    assert_string_equal(req.grammar_triggers[0], "<|tool_call>");
    assert_null(req.grammar_triggers[1]);
    assert_true(grammar_takes(&req, CALL("get_weather", "{city:" Q "x" Q ",days:1}")));
    assert_false(grammar_takes(&req, CALL("get_weather", "{town:" Q "x" Q "}")));
    em_server_request_clear(&req);

    /* response_format: after an optional thought */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":"
               "{\"type\":\"json_object\"}}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_GEMMA4, false, false, &err));
    assert_true(grammar_takes(&req, "{\"a\": 1}"));
    assert_true(grammar_takes(&req, THOUGHT("JSON it is.") "{\"a\": 1}"));
    assert_false(grammar_takes(&req, "Sure: {\"a\": 1}"));
    em_server_request_clear(&req);

    /* a forced call with a response format is refused; a raw grammar stays as written */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER
               "],\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}}", &req);
    assert_false(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_GEMMA4, false, false, &err));
    assert_int_equal(err.status, 400);
    em_server_request_clear(&req);
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"grammar\":\"root ::= \\\"yes\\\"\"}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_GEMMA4, false, false, &err));
    assert_true(grammar_takes(&req, "yes"));
    assert_false(grammar_takes(&req, THOUGHT("x") "yes"));
    em_server_request_clear(&req);
}

/* Recorded answers through the official clients on the HTTP server (tests/js/gemma4_recorded.mjs). */
static void test_gemma4_clients(void **state) {
    (void)state;
    em_server_engine engine = fake_engine();
    engine.tool_format = EM_TOOL_FORMAT_GEMMA4;
    engine.ctx_tokens = 4096;
    run_client_scripts(&engine, "gemma4_recorded");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reading_gemma4),          cmocka_unit_test(test_reading_bad_gemma4),
        cmocka_unit_test(test_random_gemma4),           cmocka_unit_test(test_gemma4_format_and_markers),
        cmocka_unit_test(test_gemma4_grammars),         cmocka_unit_test(test_gemma4_clients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
