/* Tool calls in the server, below HTTP: tool definitions and conversations with calls and results
 * on both APIs into the template's shapes, the grammars that force or lazily constrain a call (in
 * the Hermes and the JSON format), reading calls back out of answers, and the response shapes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "server/internal.h"

#define WEATHER                                                                                                    \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","             \
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7}},"      \
    "\"required\":[\"city\",\"days\"],\"additionalProperties\":false}}}"
#define CLOCK "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}"

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

static void test_forcing_grammars(void **state) {
    (void)state;
    em_server_request req;
    em_server_error err = {0};
    parse_chat("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[" WEATHER "," CLOCK
               "],\"tool_choice\":\"required\"}",
               &req);
    assert_int_equal(req.tool_choice, EM_TOOL_REQUIRED);
    assert_true(em_server_tool_grammar(&req, EM_TOOL_FORMAT_HERMES, &err));
    assert_null(req.grammar_trigger);
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
    assert_string_equal(req.grammar_trigger, "<tool_call>");
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

static void test_reading_calls(void **state) {
    (void)state;
    json_t *tools = json_loads("[" WEATHER "," CLOCK "]", 0, NULL);
    size_t content_len;
    const char *hermes = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n"
                         "</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":\"{\\\"zone\\\":\\\"UTC\\\"}\"}</tool_call>";
    json_t *calls = em_server_parse_tool_calls(hermes, strlen(hermes), EM_TOOL_FORMAT_HERMES, tools, &content_len);
    assert_non_null(calls);
    assert_int_equal(json_array_size(calls), 2);
    assert_int_equal(content_len, strlen("Let me look.\n"));
    assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 0), "name")), "get_weather");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(json_array_get(calls, 0), "arguments"), "days")), 2);
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(calls, 1), "arguments"), "zone")), "UTC");
    json_decref(calls);

    const char *plain = " {\"name\":\"get_time\",\"arguments\":{}} ";
    calls = em_server_parse_tool_calls(plain, strlen(plain), EM_TOOL_FORMAT_JSON, tools, &content_len);
    assert_int_equal(json_array_size(calls), 1);
    assert_int_equal(content_len, 0);
    json_decref(calls);

    const char *texts[] = {"no call here", "{\"name\":\"rm\",\"arguments\":{}}", "{\"name\":\"get_time\"}", "{\"name\":\"get_time\",\"arguments\":[1]}"};
    for (size_t i = 0; i < 4; i++) {
        assert_null(em_server_parse_tool_calls(texts[i], strlen(texts[i]), EM_TOOL_FORMAT_JSON, tools, &content_len));
        assert_int_equal(content_len, strlen(texts[i]));
    }
    assert_null(em_server_parse_tool_calls(texts[0], strlen(texts[0]), EM_TOOL_FORMAT_HERMES, tools, &content_len));
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
    em_server_choice choice = {0};
    em_buf_append(&choice.text, "Sure. {\"x\":1}", 13);
    choice.finish = EMBER_FINISH_STOP;
    choice.content_len = 5;
    choice.tool_calls = json_loads("[{\"name\":\"get_time\",\"arguments\":{\"zone\":\"UTC\"}}]", 0, NULL);
    em_server_format f = {.id = "chatcmpl-1", .created = 1, .model = "m"};
    em_server_request req;
    em_server_request_init(&req, EM_API_OPENAI_CHAT);
    em_server_usage usage = {0};
    json_t *r = em_openai_chat_response(&f, &req, &choice, 1, &usage);
    json_t *c = json_array_get(json_object_get(r, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
    json_t *message = json_object_get(c, "message");
    assert_string_equal(json_string_value(json_object_get(message, "content")), "Sure.");
    json_t *call = json_array_get(json_object_get(message, "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(call, "id")), "call_chatcmpl-1_0_0");
    assert_string_equal(json_string_value(json_object_get(json_object_get(call, "function"), "arguments")), "{\"zone\":\"UTC\"}");
    json_decref(r);

    f.id = "msg_1";
    r = em_anthropic_message_response(&f, &choice, &usage);
    assert_string_equal(json_string_value(json_object_get(r, "stop_reason")), "tool_use");
    json_t *content = json_object_get(r, "content");
    assert_int_equal(json_array_size(content), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(content, 0), "text")), "Sure.");
    json_t *use = json_array_get(content, 1);
    assert_string_equal(json_string_value(json_object_get(use, "type")), "tool_use");
    assert_string_equal(json_string_value(json_object_get(use, "id")), "toolu_msg_1_0");
    assert_string_equal(json_string_value(json_object_get(json_object_get(use, "input"), "zone")), "UTC");
    json_decref(r);

    em_buf out = {0};
    assert_true(em_anthropic_stream_tool_calls(&out, &f, &choice, &usage));
    assert_non_null(strstr(out.data, "\"partial_json\":\"{\\\"zone\\\":\\\"UTC\\\"}\""));
    assert_non_null(strstr(out.data, "\"stop_reason\":\"tool_use\""));
    em_buf_free(&out);
    em_server_choice_clear(&choice);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forcing_grammars), cmocka_unit_test(test_reading_calls),
        cmocka_unit_test(test_conversations), cmocka_unit_test(test_response_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
