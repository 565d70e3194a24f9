/* Tool calls in the server, below HTTP: tool definitions and conversations with calls and results
 * on both APIs into the template's shapes, the grammars that force or lazily constrain a call (in
 * the Hermes and the JSON format), reading calls back out of answers, and the response shapes.
 * Harmony (gpt-oss): recorded answers read into reasoning, content and calls, malformed and
 * truncated ones into text, and its grammars. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "server/internal.h"

#include "answer_check.h"

#define WEATHER                                                                                                    \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","             \
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7}},"      \
    "\"required\":[\"city\",\"days\"],\"additionalProperties\":false}}}"
#define CLOCK "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}"

static void test_forcing_grammars(void **state) {
    (void)state;
    em_server_request req;
    em_server_error err = {0};
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER "," CLOCK
               "],\"tool_choice\":\"required\"}",
               &req);
    assert_int_equal(req.tool_choice, EM_TOOL_REQUIRED);
    assert_true(em_server_tool_grammar(&req, EM_TOOL_FORMAT_HERMES, &err));
    assert_null(req.grammar_triggers);
    assert_true(grammar_takes(&req, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}\n</tool_call>"));
    assert_true(grammar_takes(&req, "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>"));
    assert_false(grammar_takes(&req, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":9}}\n</tool_call>"));
    assert_false(grammar_takes(&req, "<tool_call>\n{\"name\":\"rm\",\"arguments\":{}}\n</tool_call>"));
    assert_false(grammar_takes(&req, "{\"name\":\"get_time\",\"arguments\":{}}"));
    em_server_request_clear(&req);

    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER "," CLOCK
               "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}}",
               &req);
    assert_true(em_server_tool_grammar(&req, EM_TOOL_FORMAT_JSON, &err));
    assert_true(grammar_takes(&req, "{\"name\":\"get_time\",\"arguments\":{\"zone\":\"UTC\"}}"));
    assert_false(grammar_takes(&req, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}"));
    em_server_request_clear(&req);

    /* auto: a lazy grammar behind <tool_call> in the Hermes format, nothing in the JSON one */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER "]}", &req);
    assert_int_equal(req.tool_choice, EM_TOOL_AUTO);
    assert_true(em_server_tool_grammar(&req, EM_TOOL_FORMAT_JSON, &err));
    assert_null(req.grammar);
    assert_true(em_server_tool_grammar(&req, EM_TOOL_FORMAT_HERMES, &err));
    assert_string_equal(req.grammar_triggers[0], "<tool_call>");
    assert_null(req.grammar_triggers[1]);
    assert_true(grammar_takes(&req, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\",\"days\":1}}\n</tool_call>"));
    em_server_request_clear(&req);

    /* a forced call and a response format exclude each other */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER
               "],\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}}",
               &req);
    assert_false(em_server_tool_grammar(&req, EM_TOOL_FORMAT_JSON, &err));
    assert_int_equal(err.status, 400);
    assert_string_equal(err.param, "tool_choice");
    em_server_request_clear(&req);
}

/* Llama 3.x and Mistral calls, forced and lazy. */
static void test_format_grammars(void **state) {
    (void)state;
    em_server_request req;
    em_server_error err = {0};
    const char *required = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER
                           "," CLOCK "],\"tool_choice\":\"required\"}";
    parse_chat(required, &req);
    assert_true(em_server_tool_grammar(&req, EM_TOOL_FORMAT_LLAMA3, &err));
    assert_true(grammar_takes(&req, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 3}}"));
    assert_false(grammar_takes(&req, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}"));
    em_server_request_clear(&req);
    parse_chat(required, &req);
    assert_true(em_server_tool_grammar(&req, EM_TOOL_FORMAT_MISTRAL, &err));
    assert_true(grammar_takes(&req, "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{}}]"));
    assert_false(grammar_takes(&req, "[{\"name\":\"get_time\",\"arguments\":{}}]"));
    em_server_request_clear(&req);
    parse_chat(required, &req);
    assert_true(em_server_tool_grammar(&req, EM_TOOL_FORMAT_MISTRAL_ARGS, &err));
    assert_true(grammar_takes(&req, "[TOOL_CALLS]get_weather[ARGS]{\"city\":\"Oslo\",\"days\":2}"));
    assert_true(grammar_takes(&req, "[TOOL_CALLS]get_time[ARGS]{}"));
    assert_false(grammar_takes(&req, "[TOOL_CALLS]get_weather[ARGS]{}"));
    em_server_request_clear(&req);

    /* auto: lazy, behind each format's marker (Llama's is the call's own beginning) */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" CLOCK "]}", &req);
    assert_true(em_server_tool_grammar(&req, EM_TOOL_FORMAT_LLAMA3, &err));
    assert_string_equal(req.grammar_triggers[0], "{\"name\"");
    assert_string_equal(req.grammar_triggers[1], "<|python_tag|>"); /* Llama 3.1 writes it before some calls */
    assert_null(req.grammar_triggers[2]);
    assert_true(grammar_takes(&req, "{\"name\":\"get_time\",\"parameters\":{}}"));
    assert_true(grammar_takes(&req, "<|python_tag|>{\"name\":\"get_time\",\"parameters\":{}}"));
    em_server_request_clear(&req);
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" CLOCK "]}", &req);
    assert_true(em_server_tool_grammar(&req, EM_TOOL_FORMAT_MISTRAL, &err));
    assert_string_equal(req.grammar_triggers[0], "[TOOL_CALLS]");
    em_server_request_clear(&req);
}

/* A template that reasons: every grammar lets a <think> section come first (or starts inside one),
 * and `auto` is a whole-answer grammar in which a marker inside the thinking switches nothing on. */
static void test_reasoning_grammars(void **state) {
    (void)state;
    em_server_request req;
    em_server_error err = {0};
    const em_server_grammar_maker unshared = {0};
    const char *call = "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>";
    char text[512];
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" CLOCK
               "],\"tool_choice\":\"required\"}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_HERMES, true, false, &err));
    assert_true(grammar_takes(&req, call));
    snprintf(text, sizeof text, "<think>\nA </thin <</thinkk, <tool_call> even.\n</think>\n\n%s", call);
    assert_true(grammar_takes(&req, text));
    snprintf(text, sizeof text, "<think>a</think>b</think>%s", call); /* one section only */
    assert_false(grammar_takes(&req, text));
    em_server_request_clear(&req);

    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" CLOCK
               "],\"tool_choice\":\"required\"}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_HERMES, true, true, &err)); /* the prompt opened <think> */
    snprintf(text, sizeof text, "so </think>%s", call);
    assert_true(grammar_takes(&req, text));
    assert_false(grammar_takes(&req, call));
    em_server_request_clear(&req);

    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" CLOCK "]}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_HERMES, true, false, &err));
    assert_null(req.grammar_triggers);
    assert_true(grammar_takes(&req, "<think>maybe <tool_call> x</think>Just text."));
    assert_true(grammar_takes(&req, "Just text <tool_ca"));
    snprintf(text, sizeof text, "<think>t</think>Let me check.%s", call);
    assert_true(grammar_takes(&req, text));
    assert_false(grammar_takes(&req, "Let me check.<tool_call>\n{\"name\":\"rm\",\"arguments\":{}}\n</tool_call>"));
    em_server_request_clear(&req);

    /* response_format after thinking; a raw grammar stays as the client wrote it */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":"
               "{\"type\":\"json_object\"}}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_JSON, true, false, &err));
    assert_true(grammar_takes(&req, "<think>{no}</think>\n{\"a\": 1}"));
    assert_true(grammar_takes(&req, "{\"a\": 1}"));
    em_server_request_clear(&req);
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"grammar\":\"root ::= \\\"yes\\\"\"}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_JSON, true, false, &err));
    assert_true(grammar_takes(&req, "yes"));
    assert_false(grammar_takes(&req, "<think>x</think>yes"));
    em_server_request_clear(&req);
}

static void test_reading_calls(void **state) {
    (void)state;
    json_t *tools = json_loads("[" WEATHER "," CLOCK "]", 0, NULL);
    em_answer_options o = {.read_calls = true, .format = EM_TOOL_FORMAT_HERMES, .tools = tools};
    expect_answer("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n"
                  "</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":\"{\\\"zone\\\":\\\"UTC\\\"}\"}</tool_call>",
                  &o, "Let me look.\n", "",
                  (const char *[]){"get_weather", "{\"city\": \"Oslo\", \"days\": 2}", "get_time", "{\"zone\":\"UTC\"}", NULL});
    expect_answer("no call here", &o, "no call here", "", (const char *[]){NULL});
    expect_answer("a <tool_call>{\"name\":\"rm\",\"arguments\":{}}</tool_call>", &o,
                  "a <tool_call>{\"name\":\"rm\",\"arguments\":{}}</tool_call>", "", (const char *[]){NULL});
    /* cut short inside the arguments: the call stands with what came */
    expect_answer("<tool_call>{\"name\":\"get_time\",\"arguments\":{\"zone\":\"U", &o, "", "",
                  (const char *[]){"get_time", "{\"zone\":\"U", NULL});

    o.format = EM_TOOL_FORMAT_JSON;
    expect_answer(" {\"name\":\"get_time\",\"arguments\":{}} ", &o, "", "", (const char *[]){"get_time", "{}", NULL});
    expect_answer("{\"name\":\"get_time\"}", &o, "", "", (const char *[]){"get_time", "{}", NULL});
    const char *texts[] = {"no call here", "{\"name\":\"rm\",\"arguments\":{}}", "{\"x\": 1} and more"};
    for (size_t i = 0; i < 3; i++) expect_answer(texts[i], &o, texts[i], "", (const char *[]){NULL});

    /* Llama 3.x: a JSON object with "parameters", alone or after text */
    o.format = EM_TOOL_FORMAT_LLAMA3;
    expect_answer("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 1}}", &o, "", "",
                  (const char *[]){"get_weather", "{\"city\": \"Oslo\", \"days\": 1}", NULL});
    expect_answer("Checking: {\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \"get_time\", \"parameters\": {\"zone\": \"CET\"}}",
                  &o, "Checking: ", "", (const char *[]){"get_time", "{}", "get_time", "{\"zone\": \"CET\"}", NULL});

    /* Mistral: a list after [TOOL_CALLS] (or alone: the marker is a control token), or name[ARGS]{...} */
    o.format = EM_TOOL_FORMAT_MISTRAL;
    const char *list = "[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}, "
                       "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}]";
    const char *const list_calls[] = {"get_time", "{\"zone\": \"UTC\"}", "get_weather", "{\"city\":\"Oslo\",\"days\":3}", NULL};
    char marked[512];
    snprintf(marked, sizeof marked, "[TOOL_CALLS]%s", list);
    expect_answer(marked, &o, "", "", list_calls);
    expect_answer(list, &o, "", "", list_calls);
    o.format = EM_TOOL_FORMAT_MISTRAL_ARGS;
    expect_answer("[TOOL_CALLS]get_time[ARGS]{\"zone\": \"UTC\"}", &o, "", "", (const char *[]){"get_time", "{\"zone\": \"UTC\"}", NULL});
    expect_answer("[1, 2]", &o, "[1, 2]", "", (const char *[]){NULL});
    json_decref(tools);
}

/* Reasoning: a <think> section at the start is split off (whitespace around it dropped), or kept
 * inline; either way a call inside it is no call. */
static void test_reading_reasoning(void **state) {
    (void)state;
    json_t *tools = json_loads("[" CLOCK "]", 0, NULL);
    const char *text = "<think>\nI could call <tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call> here.\n</think>\n\n"
                       "It is late.";
    em_answer_options o = {.split_reasoning = EM_REASONING_SPLIT, .read_calls = true, .format = EM_TOOL_FORMAT_HERMES, .tools = tools};
    expect_answer(text, &o, "It is late.", "I could call <tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call> here.",
                  (const char *[]){NULL});
    o.split_reasoning = EM_REASONING_INLINE;
    expect_answer(text, &o, text, "", (const char *[]){NULL});
    o.split_reasoning = EM_REASONING_OFF; /* a model that does not reason: the tags are text */
    expect_answer(text, &o, "<think>\nI could call here.\n</think>\n\nIt is late.", "", (const char *[]){"get_time", "{}", NULL});

    /* the prompt opened <think>: the answer starts inside it, and a call follows */
    o = (em_answer_options){.split_reasoning = EM_REASONING_SPLIT, .starts_in_reasoning = true, .read_calls = true,
                            .format = EM_TOOL_FORMAT_HERMES, .tools = tools};
    expect_answer("Time matters.</think>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", &o, "",
                  "Time matters.", (const char *[]){"get_time", "{}", NULL});
    /* never closed (cut by max_tokens): all of it is reasoning */
    expect_answer("Still thinking ", &o, "", "Still thinking", (const char *[]){NULL});
    /* <think> later in the text is not a section */
    o.starts_in_reasoning = false;
    expect_answer("Hi <think>x</think>", &o, "Hi <think>x</think>", "", (const char *[]){NULL});
    json_decref(tools);
}

/* The call format and reasoning a template teaches, told from its text. */
static void test_formats_of_templates(void **state) {
    (void)state;
    static const struct { const char *text; em_tool_format format; } cases[] = {
        {"{{ '<|im_start|>' }}{% if tools %}<tool_call>{% endif %}", EM_TOOL_FORMAT_HERMES},
        {"{{- '<|start_header_id|>' + role }}{{- '{\"name\": \"' + tool_call.name + '\", \"parameters\": ' }}", EM_TOOL_FORMAT_LLAMA3},
        {"{%- if builtin_tools %}{{- '<|python_tag|>' }}{% endif %}", EM_TOOL_FORMAT_LLAMA3},
        {"{{- '[TOOL_CALLS][' }}{% for c in m.tool_calls %}{{ c | tojson }}{% endfor %}", EM_TOOL_FORMAT_MISTRAL},
        {"{{- '[TOOL_CALLS]' + c.name + '[ARGS]' + c.arguments | tojson }}", EM_TOOL_FORMAT_MISTRAL_ARGS},
        {"{% for m in messages %}{{ m.content }}{% endfor %}", EM_TOOL_FORMAT_JSON},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(em_server_tool_format_of(cases[i].text, strlen(cases[i].text)), cases[i].format);
}

/* ---- Harmony (gpt-oss): recorded answers, as the model writes them ---- */

#define H_ANALYSIS "<|channel|>analysis<|message|>"
#define H_NEXT "<|end|><|start|>assistant"
#define H_CALL(name) "<|channel|>commentary to=functions." name " <|constrain|>json<|message|>"

/* Reasoning, content and calls out of harmony messages, whole and streamed in pieces. */
static void test_reading_harmony(void **state) {
    (void)state;
    json_t *tools = json_loads("[" WEATHER "," CLOCK "]", 0, NULL);
    em_answer_options o = {.split_reasoning = EM_REASONING_SPLIT, .read_calls = true, .format = EM_TOOL_FORMAT_HARMONY,
                           .tools = tools};
    const char *none[] = {NULL};
    /* reasoning, then the final answer (<|return|> ends generation: it reaches the text only with ignore_eos) */
    const char *answer = H_ANALYSIS "The user asks for 2+2. That is 4." H_NEXT "<|channel|>final<|message|>2 + 2 = 4.";
    expect_answer(answer, &o, "2 + 2 = 4.", "The user asks for 2+2. That is 4.", none);
    expect_answer("<|channel|>final<|message|>Done.<|return|>", &o, "Done.", "", none);
    /* reasoning only: cut by max_tokens inside the analysis */
    expect_answer(H_ANALYSIS "We need to think about ", &o, "", "We need to think about ", none);
    /* a call, as the model writes it, and as the template writes calls back */
    expect_answer(H_CALL("get_weather") "{\"city\":\"Oslo\",\"days\":3}", &o, "", "",
                  (const char *[]){"get_weather", "{\"city\":\"Oslo\",\"days\":3}", NULL});
    expect_answer(" to=functions.get_time<|channel|>commentary json<|message|>{\"zone\": \"UTC\"}<|call|>", &o, "", "",
                  (const char *[]){"get_time", "{\"zone\": \"UTC\"}", NULL});
    /* a call after reasoning */
    expect_answer(H_ANALYSIS "Need the weather in Oslo; call get_weather." H_NEXT H_CALL("get_weather")
                  "{\"city\":\"Oslo\",\"days\":2}<|call|>",
                  &o, "", "Need the weather in Oslo; call get_weather.",
                  (const char *[]){"get_weather", "{\"city\":\"Oslo\",\"days\":2}", NULL});
    /* several calls (a recorded turn that went on past <|call|>), and a preamble to the user first */
    expect_answer(H_ANALYSIS "Two lookups." H_NEXT "<|channel|>commentary<|message|>Let me check both." H_NEXT
                  " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Oslo\",\"days\":1}<|call|>"
                  "<|start|>assistant" H_CALL("get_time") "{}<|call|>",
                  &o, "Let me check both.", "Two lookups.",
                  (const char *[]){"get_weather", "{\"city\":\"Oslo\",\"days\":1}", "get_time", "{}", NULL});
    /* a call without arguments has {} */
    expect_answer(H_CALL("get_time"), &o, "", "", (const char *[]){"get_time", "{}", NULL});
    /* kept inline (reasoning_format none): the analysis is content as written */
    o.split_reasoning = EM_REASONING_INLINE;
    expect_answer(answer, &o, H_ANALYSIS "The user asks for 2+2. That is 4.<|end|>2 + 2 = 4.", "", none);
    json_decref(tools);
}

/* Malformed and truncated harmony: text, never a crash or a lost message. */
static void test_reading_bad_harmony(void **state) {
    (void)state;
    json_t *tools = json_loads("[" WEATHER "," CLOCK "]", 0, NULL);
    em_answer_options o = {.split_reasoning = EM_REASONING_SPLIT, .read_calls = true, .format = EM_TOOL_FORMAT_HARMONY,
                           .tools = tools};
    const char *none[] = {NULL};
    /* no harmony at all */
    expect_answer("Hello, world!", &o, "Hello, world!", "", none);
    expect_answer("Hello there", &o, "Hello there", "", none);
    /* a call of a tool the request does not offer, and a built-in tool's: the message as written */
    const char *unknown = H_CALL("rm") "{\"path\":\"/\"}<|call|>";
    expect_answer(unknown, &o, unknown, "", none);
    const char *browser = "<|channel|>analysis to=browser.search code<|message|>{\"query\":\"x\"}";
    expect_answer(browser, &o, browser, "", none);
    /* without tools in the request a call is text too */
    em_answer_options no_tools = o;
    no_tools.read_calls = false;
    const char *call = H_CALL("get_time") "{}";
    expect_answer(call, &no_tools, call, "", none);
    /* headers that cannot be headers */
    expect_answer("<|channel|>final!!<|message|>hi", &o, "<|channel|>final!!<|message|>hi", "", none);
    expect_answer("<|channel|>analysis<|end|><|start|>assistant<|channel|>final<|message|>ok", &o,
                  "<|channel|>analysis<|end|>ok", "", none);
    /* another role, and text between messages */
    expect_answer("<|channel|>final<|message|>Hi<|end|><|start|>user<|message|>more", &o,
                  "Hi<|start|>user<|message|>more", "", none);
    expect_answer("<|channel|>final<|message|>A<|end|>stray<|start|>assistant<|channel|>final<|message|>B", &o,
                  "AstrayB", "", none);
    expect_answer("<|channel|>final<|message|>A<|end|>\n<|start|>assistant<|channel|>final<|message|>B", &o, "AB", "", none);
    /* a message whose <|end|> the model left out ends at the next <|start|> */
    expect_answer(H_ANALYSIS "x<|start|>assistant<|channel|>final<|message|>y", &o, "y", "x", none);
    /* the model repeats the generation prompt's opening */
    expect_answer("<|start|>assistant<|channel|>final<|message|>z", &o, "z", "", none);
    /* truncated: in the first header, in a later one, in a call's arguments */
    expect_answer("<|channel|>analy", &o, "<|channel|>analy", "", none);
    expect_answer(H_ANALYSIS "x" H_NEXT, &o, "<|start|>assistant", "x", none);
    expect_answer(H_CALL("get_weather") "{\"city\":\"Os", &o, "", "", (const char *[]){"get_weather", "{\"city\":\"Os", NULL});
    /* a header longer than any */
    char long_header[600] = "<|channel|>final to=";
    memset(long_header + strlen(long_header), 'a', 300);
    strcat(long_header, "<|message|>b");
    expect_answer(long_header, &o, long_header, "", none);
    json_decref(tools);
}

/* What harmony needs from the engine and the template: its markup as text, told from the template. */
static void test_harmony_markers(void **state) {
    (void)state;
    em_answer_options o = {.format = EM_TOOL_FORMAT_HARMONY};
    const char *markers[EM_ANSWER_MAX_MARKERS];
    size_t n = em_answer_markers(&o, markers);
    const char *want[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|call|>", "<|return|>"};
    assert_int_equal(n, 7);
    for (size_t i = 0; i < n; i++) assert_string_equal(markers[i], want[i]);
    const char *gpt_oss = "{{- \"<|start|>system<|message|>\" }}{{- \"<|start|>assistant<|channel|>final<|message|>\" + "
                          "message.content + \"<|end|>\" }}";
    assert_int_equal(em_server_tool_format_of(gpt_oss, strlen(gpt_oss)), EM_TOOL_FORMAT_HARMONY);
}

/* Forced calls, the lazy grammar of `auto`, and response_format in harmony's messages. */
static void test_harmony_grammars(void **state) {
    (void)state;
    em_server_request req;
    em_server_error err = {0};
    const em_server_grammar_maker unshared = {0};
    const char *required = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER
                           "," CLOCK "],\"tool_choice\":\"required\"}";
    parse_chat(required, &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_HARMONY, false, false, &err));
    assert_null(req.grammar_triggers);
    assert_true(grammar_takes(&req, H_CALL("get_weather") "{\"city\":\"Oslo\",\"days\":3}"));
    assert_true(grammar_takes(&req, " to=functions.get_time<|channel|>commentary json<|message|>{}"));
    assert_true(grammar_takes(&req, H_ANALYSIS "Think <|en d <|end <|start|>." H_NEXT H_CALL("get_time") "{\"zone\":\"UTC\"}"));
    assert_false(grammar_takes(&req, H_CALL("get_weather") "{\"city\":\"Oslo\",\"days\":9}"));
    assert_false(grammar_takes(&req, H_CALL("rm") "{}"));
    assert_false(grammar_takes(&req, "<|channel|>final<|message|>no call"));
    assert_false(grammar_takes(&req, H_ANALYSIS "a<|end|>b" H_NEXT H_CALL("get_time") "{}")); /* one analysis message */
    em_server_request_clear(&req);

    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER "," CLOCK
               "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}}",
               &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_HARMONY, false, false, &err));
    assert_true(grammar_takes(&req, H_CALL("get_time") "{}"));
    assert_false(grammar_takes(&req, H_CALL("get_weather") "{\"city\":\"Oslo\",\"days\":3}"));
    em_server_request_clear(&req);

    /* auto: free until the recipient, then the call */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER "]}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_HARMONY, false, false, &err));
    assert_string_equal(req.grammar_triggers[0], "to=functions.");
    assert_null(req.grammar_triggers[1]);
    assert_true(grammar_takes(&req, "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"x\",\"days\":1}"));
    assert_true(grammar_takes(&req, "to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"x\",\"days\":1}"));
    assert_false(grammar_takes(&req, "to=functions.get_weather <|constrain|>json<|message|>{\"town\":\"x\"}"));
    em_server_request_clear(&req);

    /* response_format: the final message's body, after an optional analysis */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":"
               "{\"type\":\"json_object\"}}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_HARMONY, false, false, &err));
    assert_true(grammar_takes(&req, "<|channel|>final<|message|>{\"a\": 1}"));
    assert_true(grammar_takes(&req, H_ANALYSIS "JSON it is." H_NEXT "<|channel|>final<|message|>{\"a\": 1}"));
    assert_false(grammar_takes(&req, "{\"a\": 1}"));
    em_server_request_clear(&req);

    /* a forced call with a response format is refused; a raw grammar stays as written */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER
               "],\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}}", &req);
    assert_false(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_HARMONY, false, false, &err));
    assert_int_equal(err.status, 400);
    em_server_request_clear(&req);
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"grammar\":\"root ::= \\\"yes\\\"\"}", &req);
    assert_true(em_server_answer_grammar(&req, &unshared, EM_TOOL_FORMAT_HARMONY, false, false, &err));
    assert_true(grammar_takes(&req, "yes"));
    em_server_request_clear(&req);
}

/* Parses an Anthropic body (failing the test when it does not parse). */
static void parse_messages(const char *body, em_server_request *req) {
    em_server_error err = {0};
    if (!em_anthropic_parse_messages(body, strlen(body), req, &err)) fail_msg("%s: %s", body, err.message);
}

static char *kwargs_of(const em_server_request *req) {
    return req->template_kwargs ? json_dumps(req->template_kwargs, JSON_COMPACT | JSON_SORT_KEYS) : strdup("");
}

/* reasoning_effort reaches the template (OpenAI's grades in the three gpt-oss knows), and so does
 * Anthropic's thinking budget; earlier reasoning goes back to the template under both its names. */
static void test_reasoning_to_template(void **state) {
    (void)state;
    static const struct { const char *given, *expected; } efforts[] = {
        {"\"reasoning_effort\":\"high\"", "{\"reasoning_effort\":\"high\"}"},
        {"\"reasoning_effort\":\"minimal\"", "{\"reasoning_effort\":\"low\"}"},
        {"\"reasoning_effort\":\"xhigh\"", "{\"reasoning_effort\":\"high\"}"},
        {"\"reasoning_effort\":null", ""},
        {"\"chat_template_kwargs\":{\"reasoning_effort\":\"medium\",\"enable_thinking\":false}",
         "{\"enable_thinking\":false,\"reasoning_effort\":\"medium\"}"},
        {"\"chat_template_kwargs\":{\"reasoning_effort\":\"medium\"},\"reasoning_effort\":\"low\"", "{\"reasoning_effort\":\"low\"}"},
    };
    em_server_request req;
    char body[512];
    for (size_t i = 0; i < sizeof efforts / sizeof efforts[0]; i++) {
        snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}", efforts[i].given);
        parse_chat(body, &req);
        char *kwargs = kwargs_of(&req);
        assert_string_equal(kwargs, efforts[i].expected);
        free(kwargs);
        em_server_request_clear(&req);
    }
    em_server_error err = {0};
    const char *bad[] = {"\"reasoning_effort\":\"extreme\"", "\"reasoning_effort\":3", "\"chat_template_kwargs\":[1]"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}", bad[i]);
        assert_false(em_openai_parse_chat(body, strlen(body), 1000, &req, &err));
        assert_int_equal(err.status, 400);
        assert_non_null(strstr(err.message, i < 2 ? "reasoning_effort" : "chat_template_kwargs"));
        em_server_request_clear(&req);
    }

    static const struct { const char *thinking, *expected; } budgets[] = {
        {"{\"type\":\"enabled\",\"budget_tokens\":1024}", "{\"enable_thinking\":true,\"reasoning_effort\":\"low\"}"},
        {"{\"type\":\"enabled\",\"budget_tokens\":10000}", "{\"enable_thinking\":true,\"reasoning_effort\":\"medium\"}"},
        {"{\"type\":\"enabled\",\"budget_tokens\":31999}", "{\"enable_thinking\":true,\"reasoning_effort\":\"high\"}"},
        {"{\"type\":\"disabled\"}", "{\"enable_thinking\":false,\"reasoning_effort\":\"low\"}"},
        {"{\"type\":\"adaptive\"}", ""},
    };
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        snprintf(body, sizeof body, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                    "\"thinking\":%s}", budgets[i].thinking);
        parse_messages(body, &req);
        char *kwargs = kwargs_of(&req);
        assert_string_equal(kwargs, budgets[i].expected);
        free(kwargs);
        em_server_request_clear(&req);
    }
    const char *bad_thinking[] = {"{\"type\":\"enabled\"}", "{\"type\":\"on\"}", "true"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(body, sizeof body, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                    "\"thinking\":%s}", bad_thinking[i]);
        assert_false(em_anthropic_parse_messages(body, strlen(body), &req, &err));
        assert_int_equal(err.status, 400);
        assert_non_null(strstr(err.param, "thinking"));
        em_server_request_clear(&req);
    }

    /* the reasoning of an earlier answer, on both APIs */
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"time?\"},{\"role\":\"assistant\",\"content\":null,"
               "\"reasoning_content\":\"Ask the clock.\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
               "{\"name\":\"get_time\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"noon\"}]}",
               &req);
    json_t *assistant = json_array_get(req.messages, 1);
    assert_string_equal(json_string_value(json_object_get(assistant, "thinking")), "Ask the clock.");
    assert_string_equal(json_string_value(json_object_get(assistant, "reasoning_content")), "Ask the clock.");
    em_server_request_clear(&req);
    parse_messages("{\"model\":\"m\",\"max_tokens\":5,\"tools\":[{\"name\":\"get_time\",\"input_schema\":{\"type\":\"object\"}}],"
                   "\"messages\":[{\"role\":\"user\",\"content\":\"time?\"},{\"role\":\"assistant\",\"content\":["
                   "{\"type\":\"thinking\",\"thinking\":\"Ask the clock.\",\"signature\":\"\"},"
                   "{\"type\":\"redacted_thinking\",\"data\":\"xyz\"},"
                   "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"get_time\",\"input\":{}}]},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"noon\"}]}]}",
                   &req);
    assistant = json_array_get(req.messages, 1);
    assert_string_equal(json_string_value(json_object_get(assistant, "thinking")), "Ask the clock.");
    assert_int_equal(json_array_size(json_object_get(assistant, "tool_calls")), 1);
    em_server_request_clear(&req);
}

/* A turn with several calls becomes one message a call, each followed by its result; tools without
 * a description get an empty one (gpt-oss's template takes one call a message, and needs both). */
static void test_harmony_conversations(void **state) {
    (void)state;
    json_t *messages = json_loads(
        "[{\"role\":\"user\",\"content\":\"Oslo weather and the time?\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"Two calls.\",\"reasoning_content\":\"Two calls.\",\"tool_calls\":["
        "{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":1}}},"
        "{\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":{}}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"noon\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"sunny\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"extra\"},"
        "{\"role\":\"user\",\"content\":\"thanks\"}]",
        0, NULL);
    json_t *split = em_harmony_messages(messages);
    assert_non_null(split);
    static const char *const expected[][3] = {
        /* role, the call's name or the result's content, reasoning */
        {"user", "", ""},   {"assistant", "get_weather", "Two calls."}, {"tool", "sunny", ""},
        {"assistant", "get_time", ""}, {"tool", "noon", ""}, {"tool", "extra", ""}, {"user", "", ""},
    };
    assert_int_equal(json_array_size(split), 7);
    for (size_t i = 0; i < 7; i++) {
        json_t *m = json_array_get(split, i);
        assert_string_equal(json_string_value(json_object_get(m, "role")), expected[i][0]);
        if (!strcmp(expected[i][0], "assistant")) {
            json_t *calls = json_object_get(m, "tool_calls");
            assert_int_equal(json_array_size(calls), 1);
            assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "name")),
                                expected[i][1]);
            const char *thinking = json_string_value(json_object_get(m, "thinking"));
            assert_string_equal(thinking ? thinking : "", expected[i][2]);
            assert_string_equal(json_string_value(json_object_get(m, "content")), "");
        } else if (!strcmp(expected[i][0], "tool")) {
            assert_string_equal(json_string_value(json_object_get(m, "content")), expected[i][1]);
        }
    }
    json_decref(split);
    json_decref(messages);

    json_t *tools = json_loads("[" WEATHER "," CLOCK "]", 0, NULL);
    json_t *described = em_harmony_tools(tools);
    for (size_t i = 0; i < 2; i++)
        assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(described, i), "function"),
                                                              "description")), "");
    assert_null(json_object_get(json_object_get(json_array_get(tools, 0), "function"), "description")); /* a copy */
    json_decref(described);
    json_decref(tools);
}

/* Conversations with calls and results, on both APIs, become the shapes templates render. */
static void test_conversations(void **state) {
    (void)state;
    em_server_request req;
    parse_chat("{\"model\":\"m\",\"tools\":[" WEATHER "],\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
               "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
               "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\",\\\"days\\\":1}\"}}]},"
               "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"}]}",
               &req);
    json_t *assistant = json_array_get(req.messages, 1), *tool = json_array_get(req.messages, 2);
    json_t *call = json_array_get(json_object_get(assistant, "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(call, "id")), "c1");
    assert_true(json_is_object(json_object_get(json_object_get(call, "function"), "arguments")));
    assert_string_equal(json_string_value(json_object_get(tool, "role")), "tool");
    assert_string_equal(json_string_value(json_object_get(tool, "tool_call_id")), "c1");
    assert_string_equal(json_string_value(json_object_get(tool, "content")), "sunny");
    em_server_request_clear(&req);

    const char *anthropic =
        "{\"model\":\"m\",\"max_tokens\":5,\"tools\":[{\"name\":\"get_time\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\",\"content\":\"time?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Checking.\"},{\"type\":\"tool_use\",\"id\":\"t1\","
        "\"name\":\"get_time\",\"input\":{\"zone\":\"UTC\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{\"type\":\"text\","
        "\"text\":\"12:00\"}]},{\"type\":\"text\",\"text\":\"thanks\"}]}]}";
    em_server_error err = {0};
    assert_true(em_anthropic_parse_messages(anthropic, strlen(anthropic), &req, &err));
    assert_int_equal(req.tool_choice, EM_TOOL_REQUIRED);
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(req.tools, 0), "function"), "name")), "get_time");
    assert_int_equal(json_array_size(req.messages), 4); /* user, assistant with the call, tool, user */
    assistant = json_array_get(req.messages, 1);
    assert_string_equal(json_string_value(json_object_get(assistant, "content")), "Checking.");
    call = json_array_get(json_object_get(assistant, "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(call, "function"), "name")), "get_time");
    tool = json_array_get(req.messages, 2);
    assert_string_equal(json_string_value(json_object_get(tool, "tool_call_id")), "t1");
    assert_string_equal(json_string_value(json_object_get(tool, "content")), "12:00");
    assert_string_equal(json_string_value(json_object_get(json_array_get(req.messages, 3), "content")), "thanks");
    em_server_request_clear(&req);
}

static void test_response_shapes(void **state) {
    (void)state;
    json_t *tools = json_loads("[" CLOCK "]", 0, NULL);
    em_answer_options o = {.split_reasoning = EM_REASONING_SPLIT, .read_calls = true, .format = EM_TOOL_FORMAT_HERMES, .tools = tools};
    em_server_choice choice = read_answer("<think>hmm</think>Sure.<tool_call>{\"name\":\"get_time\",\"arguments\":{\"zone\":\"UTC\"}}</tool_call>",
                                          &o, 1000);
    choice.finish = EMBER_FINISH_STOP;
    em_server_format f = {.id = "chatcmpl-1", .created = 1, .model = "m"};
    em_server_request req;
    em_server_request_init(&req, EM_API_OPENAI_CHAT);
    em_server_usage usage = {0};
    json_t *r = em_openai_chat_response(&f, &req, &choice, 1, &usage);
    json_t *c = json_array_get(json_object_get(r, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
    json_t *message = json_object_get(c, "message");
    assert_string_equal(json_string_value(json_object_get(message, "content")), "Sure.");
    assert_string_equal(json_string_value(json_object_get(message, "reasoning_content")), "hmm");
    json_t *call = json_array_get(json_object_get(message, "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(call, "id")), "call_chatcmpl-1_0_0");
    assert_string_equal(json_string_value(json_object_get(json_object_get(call, "function"), "arguments")), "{\"zone\":\"UTC\"}");
    json_decref(r);

    f.id = "msg_1";
    r = em_anthropic_message_response(&f, &choice, &usage);
    assert_string_equal(json_string_value(json_object_get(r, "stop_reason")), "tool_use");
    json_t *content = json_object_get(r, "content");
    assert_int_equal(json_array_size(content), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(content, 0), "type")), "thinking");
    assert_string_equal(json_string_value(json_object_get(json_array_get(content, 0), "thinking")), "hmm");
    assert_string_equal(json_string_value(json_object_get(json_array_get(content, 0), "signature")), "");
    assert_string_equal(json_string_value(json_object_get(json_array_get(content, 1), "text")), "Sure.");
    json_t *use = json_array_get(content, 2);
    assert_string_equal(json_string_value(json_object_get(use, "type")), "tool_use");
    assert_string_equal(json_string_value(json_object_get(use, "id")), "toolu_msg_1_0");
    assert_string_equal(json_string_value(json_object_get(json_object_get(use, "input"), "zone")), "UTC");
    json_decref(r);
    em_server_choice_clear(&choice);

    /* streamed: blocks open as the events come, one kind after another */
    em_buf out = {0};
    em_anthropic_stream st = {0};
    const em_answer_event events[] = {
        {.kind = EM_ANSWER_REASONING, .text = "hm", .len = 2},
        {.kind = EM_ANSWER_CONTENT, .text = "Sure.", .len = 5},
        {.kind = EM_ANSWER_CALL_BEGIN, .text = "get_time", .len = 8},
        {.kind = EM_ANSWER_CALL_ARGUMENTS, .text = "{\"zone\"", .len = 7},
        {.kind = EM_ANSWER_CALL_ARGUMENTS, .text = ":\"UTC\"}", .len = 7},
    };
    em_server_choice streamed = {0};
    for (size_t i = 0; i < 5; i++) {
        assert_true(em_server_choice_collect(&streamed, &events[i]));
        assert_true(em_anthropic_stream_answer(&out, &f, &st, &events[i]));
    }
    assert_true(em_anthropic_stream_end(&out, &st, &streamed, &usage));
    const char *expected[] = {
        "\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}",
        "\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}",
        "{\"type\":\"content_block_stop\",\"index\":0}",
        "\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Sure.\"}",
        "\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_msg_1_0\",\"name\":\"get_time\",\"input\":{}}",
        "\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"zone\\\"\"}",
        "{\"type\":\"content_block_stop\",\"index\":2}",
        "\"stop_reason\":\"tool_use\"",
    };
    const char *at = out.data;
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) { /* in this order */
        const char *found = strstr(at, expected[i]);
        if (!found) fail_msg("missing after offset %td: %s\n%s", at - out.data, expected[i], out.data);
        at = found + strlen(expected[i]);
    }
    em_buf_free(&out);

    /* OpenAI deltas: the call's first delta has id, type and name, then argument fragments */
    em_server_request_init(&req, EM_API_OPENAI_CHAT);
    f.id = "chatcmpl-2";
    assert_true(em_openai_chunk_answer(&out, &f, &req, 0, &events[0]));
    assert_true(em_openai_chunk_answer(&out, &f, &req, 0, &events[2]));
    assert_true(em_openai_chunk_answer(&out, &f, &req, 0, &events[3]));
    assert_non_null(strstr(out.data, "\"delta\":{\"reasoning_content\":\"hm\"}"));
    assert_non_null(strstr(out.data, "\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_chatcmpl-2_0_0\",\"type\":\"function\","
                                     "\"function\":{\"name\":\"get_time\",\"arguments\":\"\"}}]}"));
    assert_non_null(strstr(out.data, "\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"zone\\\"\"}}]}"));
    em_buf_free(&out);
    em_server_choice_clear(&streamed);
    json_decref(tools);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forcing_grammars), cmocka_unit_test(test_reading_calls),
        cmocka_unit_test(test_reading_reasoning), cmocka_unit_test(test_formats_of_templates),
        cmocka_unit_test(test_reasoning_grammars), cmocka_unit_test(test_format_grammars),
        cmocka_unit_test(test_conversations), cmocka_unit_test(test_response_shapes),
        cmocka_unit_test(test_reading_harmony), cmocka_unit_test(test_reading_bad_harmony),
        cmocka_unit_test(test_harmony_markers), cmocka_unit_test(test_harmony_grammars),
        cmocka_unit_test(test_reasoning_to_template), cmocka_unit_test(test_harmony_conversations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
