/* The Responses API and Ollama's API over real sockets, with the fake engine of server_fake.h:
 * the Responses API's events, stored responses and continuations, reasoning and calls; Ollama's
 * NDJSON, thinking and calls; both behind the API key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

#include "http_client.h"
#include "server_fake.h"
#include "server_sockets.h"


/* A server whose fake engine's template reasons (answers may open with <think>). */
static em_server *start_reasoning(void) {
    engine = fake_engine();
    engine.reasons = true;
    em_server_options options = {.host = "127.0.0.1", .port = 0};
    em_server *s = NULL;
    em_err e = em_server_start(&options, &engine, &s);
    if (e) fail_msg("%s", em_err_message(e));
    return s;
}

/* The event names of an SSE body with runs of one name written once, joined by spaces; checks that
 * each event's data has its name as `type` and the sequence numbers count from 0. *last is the last
 * event's data (caller frees). */
static char *event_names(const char *body, json_t **last) {
    char *data[512], *names[512];
    size_t n = sse_events(body, data, names, 512);
    em_buf list = {0};
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_loads(data[i], 0, NULL);
        assert_non_null(v);
        assert_non_null(names[i]);
        assert_string_equal(str_at(v, "type"), names[i]);
        assert_int_equal(int_at(v, "sequence_number"), (long long)i);
        if (i == 0 || strcmp(names[i], names[i - 1])) em_buf_printf(&list, "%s%s", i ? " " : "", names[i]);
        if (i + 1 == n) *last = v;
        else json_decref(v);
    }
    for (size_t i = 0; i < n; i++) {
        free(data[i]);
        free(names[i]);
    }
    return list.data;
}

#define RESPONSES_HI "{\"model\":\"fake-model\",\"input\":\"hi\""

static void test_responses(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    int port = em_server_port(s);
    http_result r = http(port, "POST", "/v1/responses", NULL, RESPONSES_HI ",\"temperature\":0.5,\"max_output_tokens\":50}");
    assert_int_equal(r.status, 200);
    json_t *v = body_json(&r);
    assert_string_equal(str_at(v, "object"), "response");
    assert_string_equal(str_at(v, "status"), "completed");
    assert_string_equal(str_at(v, "model"), "fake-model");
    assert_string_equal(str_at(v, "output.0.type"), "message");
    assert_string_equal(str_at(v, "output.0.content.0.type"), "output_text");
    assert_string_equal(str_at(v, "output.0.content.0.text"), FAKE_REPLY);
    assert_int_equal(int_at(v, "usage.input_tokens"), PROMPT_HI_TOKENS);
    assert_int_equal(int_at(v, "usage.output_tokens"), 13);
    assert_int_equal(int_at(v, "usage.output_tokens_details.reasoning_tokens"), 0); /* an answer without reasoning */
    assert_int_equal(int_at(v, "usage.input_tokens_details.cached_tokens"), 3);
    assert_int_equal(int_at(v, "max_output_tokens"), 50);
    assert_int_equal(fake_last_max_tokens, 50);
    assert_true(fake_last_sampling.temperature == 0.5f);
    char id[96];
    snprintf(id, sizeof id, "%s", str_at(v, "id"));
    assert_memory_equal(id, "resp_", 5);
    json_decref(v);
    http_free(&r);

    /* a continuation: the stored input and output, then the new input ("user:hi\nassistant:Hello,
     * world!\nuser:again\nassistant:" in the fake's format); instructions first, not stored */
    char body[256];
    snprintf(body, sizeof body, "{\"model\":\"m\",\"previous_response_id\":\"%s\",\"input\":\"again\",\"instructions\":\"be\"}", id);
    r = http(port, "POST", "/responses", NULL, body);
    assert_int_equal(r.status, 200);
    v = body_json(&r);
    assert_int_equal(int_at(v, "usage.input_tokens"), 10 + 8 + 24 + 11 + 10);
    assert_string_equal(str_at(v, "previous_response_id"), id);
    assert_string_equal(str_at(v, "instructions"), "be");
    json_decref(v);
    http_free(&r);

    /* store: false is not kept; unknown ids are 400s naming the field, as OpenAI answers them */
    r = http(port, "POST", "/v1/responses", NULL, RESPONSES_HI ",\"store\":false}");
    v = body_json(&r);
    snprintf(body, sizeof body, "{\"model\":\"m\",\"previous_response_id\":\"%s\",\"input\":\"again\"}", str_at(v, "id"));
    json_decref(v);
    http_free(&r);
    r = http(port, "POST", "/v1/responses", NULL, body);
    assert_int_equal(r.status, 400);
    v = body_json(&r);
    assert_string_equal(str_at(v, "error.code"), "previous_response_not_found");
    assert_string_equal(str_at(v, "error.param"), "previous_response_id");
    json_decref(v);
    http_free(&r);

    /* a stream of the plain reply */
    r = http(port, "POST", "/v1/responses", NULL, RESPONSES_HI ",\"stream\":true}");
    assert_int_equal(r.status, 200);
    assert_non_null(strcasestr(r.head, "Content-Type: text/event-stream"));
    json_t *last = NULL;
    char *names = event_names(r.body, &last);
    assert_string_equal(names, "response.created response.in_progress response.output_item.added "
                               "response.content_part.added response.output_text.delta response.output_text.done "
                               "response.content_part.done response.output_item.done response.completed");
    assert_string_equal(str_at(last, "response.output.0.content.0.text"), FAKE_REPLY);
    assert_string_equal(str_at(last, "response.status"), "completed");
    assert_int_equal(int_at(last, "response.usage.output_tokens"), 13);
    free(names);
    json_decref(last);
    http_free(&r);

    /* reasoning.effort reaches the template as reasoning_effort */
    r = http(port, "POST", "/v1/responses", NULL, RESPONSES_HI ",\"reasoning\":{\"effort\":\"high\",\"summary\":null}}");
    assert_int_equal(r.status, 200);
    assert_string_equal(fake_last_kwargs, "{\"reasoning_effort\":\"high\"}");
    http_free(&r);
    r = http(port, "POST", "/v1/responses", NULL, RESPONSES_HI "}");
    assert_string_equal(fake_last_kwargs, "");
    http_free(&r);

    /* max_output_tokens cuts it: incomplete */
    r = http(port, "POST", "/v1/responses", NULL, RESPONSES_HI ",\"max_output_tokens\":4,\"stream\":true}");
    names = event_names(r.body, &last);
    assert_non_null(strstr(names, "response.output_item.done response.incomplete"));
    assert_string_equal(str_at(last, "response.incomplete_details.reason"), "max_output_tokens");
    assert_string_equal(str_at(last, "response.output.0.content.0.text"), "Hell");
    free(names);
    json_decref(last);
    http_free(&r);

    const char *bad[][2] = {
        {"{\"model\":\"m\"}", "input"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}", "input[0]"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "input[0].role"},
        {"{\"model\":\"m\",\"input\":\"x\",\"top_p\":2}", "top_p"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tool_choice\":\"required\"}", "tool_choice"},
        {"{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}", "text.format.schema"},
        {"{\"model\":\"m\",\"input\":\"x\",\"background\":true}", "background"},
        /* each field of the wrong type */
        {"{\"model\":5,\"input\":\"x\"}", "model"},
        {"{\"model\":\"m\",\"input\":true}", "input"},
        {"{\"model\":\"m\",\"input\":{\"role\":\"user\"}}", "input"},
        {"{\"model\":\"m\",\"input\":\"x\",\"instructions\":5}", "instructions"},
        {"{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":5}", "previous_response_id"},
        {"{\"model\":\"m\",\"input\":\"x\",\"store\":\"yes\"}", "store"},
        {"{\"model\":\"m\",\"input\":\"x\",\"stream\":1}", "stream"},
        {"{\"model\":\"m\",\"input\":\"x\",\"temperature\":\"hot\"}", "temperature"},
        {"{\"model\":\"m\",\"input\":\"x\",\"temperature\":-1}", "temperature"},
        {"{\"model\":\"m\",\"input\":\"x\",\"top_p\":[1]}", "top_p"},
        {"{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":\"many\"}", "max_output_tokens"},
        {"{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":1.5}", "max_output_tokens"},
        {"{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":-3}", "max_output_tokens"},
        {"{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":99999999999}", "max_output_tokens"},
        {"{\"model\":\"m\",\"input\":\"x\",\"top_k\":\"5\"}", "top_k"},
        {"{\"model\":\"m\",\"input\":\"x\",\"min_p\":2}", "min_p"},
        {"{\"model\":\"m\",\"input\":\"x\",\"seed\":\"s\"}", "seed"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":{}}", "tools"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":[5]}", "tools[0]"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":5}]}", "tools[0].parameters"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":5}", "tool_choice"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":\"sometimes\"}", "tool_choice"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"}}", "tool_choice"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"parallel_tool_calls\":\"x\"}", "parallel_tool_calls"},
        {"{\"model\":\"m\",\"input\":\"x\",\"text\":5}", "text"},
        {"{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":\"json\"}}", "text.format"},
        {"{\"model\":\"m\",\"input\":\"x\",\"reasoning\":\"high\"}", "reasoning"},
        {"{\"model\":\"m\",\"input\":\"x\",\"reasoning\":{\"effort\":5}}", "reasoning.effort"},
        {"{\"model\":\"m\",\"input\":\"x\",\"metadata\":[]}", "metadata"},
        {"{\"model\":\"m\",\"input\":\"x\",\"include\":\"all\"}", "include"},
        {"{\"model\":\"m\",\"input\":\"x\",\"user\":5}", "user"},
        {"{\"model\":\"m\",\"input\":\"x\",\"truncation\":true}", "truncation"},
        {"{\"model\":\"m\",\"input\":\"x\",\"background\":\"no\"}", "background"},
        {"{\"model\":\"m\",\"input\":[5]}", "input[0]"},
        {"{\"model\":\"m\",\"input\":[{\"type\":5,\"role\":\"user\",\"content\":\"x\"}]}", "input[0]"},
        {"{\"model\":\"m\",\"input\":[{\"role\":5,\"content\":\"x\"}]}", "input[0].role"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":5}]}", "input[0].content"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":5}]}]}", "input[0].content[0]"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":{}}]}", "input[0]"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":5}]}", "input[0].output"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"item_reference\",\"id\":5}]}", "input[0].id"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"item_reference\",\"id\":\"fc_resp_x_99999999999999999999999\"}]}", "input[0].id"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"banana\"}]}", "input[0]"},
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = http(port, "POST", "/v1/responses", NULL, bad[i][0]);
        v = r.status == 400 ? body_json(&r) : NULL;
        const char *param = json_string_value(json_object_get(json_object_get(v, "error"), "param"));
        if (!param) param = "";
        if (r.status != 400 || strcmp(param, bad[i][1])) {
            print_message("%s: status %d, param '%s' (want 400 naming %s)\n", bad[i][0], r.status, param, bad[i][1]);
            wrong++;
        }
        json_decref(v);
        http_free(&r);
    }
    assert_int_equal(wrong, 0);
    wait_released();
    em_server_stop(s);
}

static void test_responses_reasoning_and_call(void **state) {
    (void)state;
    em_server *s = start_reasoning();
    const char *body = "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"think-and-call\"}]}],"
                       "\"tools\":[{\"type\":\"web_search\"},{\"type\":\"function\",\"name\":\"get_time\","
                       "\"parameters\":{\"type\":\"object\",\"properties\":{\"zone\":{\"type\":\"string\"}}}}],\"stream\":true}";
    http_result r = http(em_server_port(s), "POST", "/v1/responses", NULL, body);
    assert_int_equal(r.status, 200);
    json_t *last = NULL;
    char *names = event_names(r.body, &last);
    assert_string_equal(names, "response.created response.in_progress response.output_item.added "
                               "response.content_part.added response.reasoning_text.delta response.reasoning_text.done "
                               "response.content_part.done response.output_item.done response.output_item.added "
                               "response.function_call_arguments.delta response.function_call_arguments.done "
                               "response.output_item.done response.completed");
    assert_string_equal(str_at(last, "response.output.0.type"), "reasoning");
    assert_string_equal(str_at(last, "response.output.0.content.0.text"), "Let me see.");
    assert_string_equal(str_at(last, "response.output.1.type"), "function_call");
    assert_string_equal(str_at(last, "response.output.1.name"), "get_time");
    assert_string_equal(str_at(last, "response.output.1.arguments"), "{\"zone\": \"UTC\"}");
    assert_string_equal(str_at(last, "response.ignored_tools.0"), "web_search");
    /* byte tokens: the '>' that opens <think>, the reasoning, and the bytes of </think> */
    assert_int_equal(int_at(last, "response.usage.output_tokens_details.reasoning_tokens"), 1 + strlen("Let me see.") + strlen("</think>"));
    assert_int_equal(int_at(last, "response.usage.output_tokens"), strlen(FAKE_THINK_AND_CALL));
    char call_id[128];
    snprintf(call_id, sizeof call_id, "%s", str_at(last, "response.output.1.call_id"));
    char *id = strdup(str_at(last, "response.id"));
    free(names);
    json_decref(last);
    http_free(&r);

    /* the whole answer has the same items; its result goes back as a function_call_output */
    r = http(em_server_port(s), "POST", "/v1/responses", NULL, "{\"model\":\"m\",\"input\":\"think-and-call\",\"tools\":"
                                                               "[{\"type\":\"function\",\"name\":\"get_time\"}]}");
    json_t *v = body_json(&r);
    assert_string_equal(str_at(v, "output.0.type"), "reasoning");
    assert_string_equal(str_at(v, "output.1.arguments"), "{\"zone\": \"UTC\"}");
    assert_int_equal(int_at(v, "usage.output_tokens_details.reasoning_tokens"), 1 + strlen("Let me see.") + strlen("</think>"));
    json_decref(v);
    http_free(&r);
    char next[1024];
    snprintf(next, sizeof next, "{\"model\":\"m\",\"previous_response_id\":\"%s\",\"input\":[{\"type\":\"function_call_output\","
                                "\"call_id\":\"%s\",\"output\":\"noon\"}]}", id, call_id);
    r = http(em_server_port(s), "POST", "/v1/responses", NULL, next);
    assert_int_equal(r.status, 200);
    v = body_json(&r);
    /* "user:think-and-call\n" + "assistant:\n" (the call's turn) + "tool:noon\n" + "assistant:" */
    assert_int_equal(int_at(v, "usage.input_tokens"), 20 + 11 + 10 + 10);
    json_decref(v);
    http_free(&r);

    /* the same conversation sent as items, the call by an item_reference to the stored item (as the
     * Vercel AI SDK sends it): the same prompt; the reasoning item's reference is left out as
     * reasoning items are */
    char fc_id[160];
    snprintf(fc_id, sizeof fc_id, "fc_%s_1", id);
    snprintf(next, sizeof next, "{\"model\":\"m\",\"store\":false,\"input\":[{\"role\":\"user\",\"content\":\"think-and-call\"},"
                                "{\"type\":\"item_reference\",\"id\":\"rs_%s_0\"},{\"type\":\"item_reference\",\"id\":\"%s\"},"
                                "{\"type\":\"function_call_output\",\"call_id\":\"%s\",\"output\":\"noon\"}]}",
             id, fc_id, call_id);
    r = http(em_server_port(s), "POST", "/v1/responses", NULL, next);
    assert_int_equal(r.status, 200);
    v = body_json(&r);
    assert_int_equal(int_at(v, "usage.input_tokens"), 20 + 11 + 10 + 10);
    json_decref(v);
    http_free(&r);
    /* references to items no stored response holds: 400s naming the item */
    const char *unknown[] = {"fc_resp_nothing_1", "msg_x", "fc_", "_", "fc_resp_1_", "fc_resp_1_99"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        snprintf(next, sizeof next, "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":\"x\"},"
                                    "{\"type\":\"item_reference\",\"id\":\"%s\"}]}", unknown[i]);
        r = http(em_server_port(s), "POST", "/v1/responses", NULL, next);
        assert_int_equal(r.status, 400);
        v = body_json(&r);
        assert_string_equal(str_at(v, "error.param"), "input[1].id");
        assert_string_equal(str_at(v, "error.code"), "item_not_found");
        json_decref(v);
        http_free(&r);
    }
    /* an item of the right response at the wrong index */
    snprintf(next, sizeof next, "{\"model\":\"m\",\"input\":[{\"type\":\"item_reference\",\"id\":\"fc_%s_0\"}]}", id);
    r = http(em_server_port(s), "POST", "/v1/responses", NULL, next);
    assert_int_equal(r.status, 400);
    http_free(&r);
    free(id);
    wait_released();
    em_server_stop(s);
}

/* The lines of an NDJSON body, parsed. */
static size_t ndjson_lines(const char *body, json_t **lines, size_t max) {
    size_t n = 0;
    for (const char *p = body; *p && n < max;) {
        const char *end = strchr(p, '\n');
        if (!end) fail_msg("an NDJSON line without its newline: '%s'", p);
        lines[n] = json_loadb(p, (size_t)(end - p), 0, NULL);
        if (!lines[n]) fail_msg("not JSON: '%.*s'", (int)(end - p), p);
        n++;
        p = end + 1;
    }
    return n;
}

static void test_ollama(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    int port = em_server_port(s);
    http_result r = http(port, "POST", "/api/chat", NULL, "{\"model\":\"llama3\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":false}");
    assert_int_equal(r.status, 200);
    json_t *v = body_json(&r);
    assert_string_equal(str_at(v, "model"), "llama3");
    assert_string_equal(str_at(v, "message.role"), "assistant");
    assert_string_equal(str_at(v, "message.content"), FAKE_REPLY);
    assert_true(json_is_true(at(v, "done")));
    assert_string_equal(str_at(v, "done_reason"), "stop");
    assert_int_equal(int_at(v, "prompt_eval_count"), PROMPT_HI_TOKENS);
    assert_int_equal(int_at(v, "eval_count"), 13);
    assert_true(int_at(v, "total_duration") > 0);
    /* Ollama's sampling defaults */
    assert_true(fake_last_sampling.temperature == 0.8f && fake_last_sampling.top_k == 40 && fake_last_sampling.top_p == 0.9f &&
                fake_last_sampling.repeat_penalty == 1.1f);
    json_decref(v);
    http_free(&r);

    /* streams by default: one line per token, then the done line */
    r = http(port, "POST", "/api/chat", NULL, "{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                             "\"options\":{\"num_predict\":5,\"temperature\":0,\"seed\":7,\"stop\":[\"zz\"]}}");
    assert_int_equal(r.status, 200);
    assert_non_null(strcasestr(r.head, "Content-Type: application/x-ndjson"));
    json_t *lines[64];
    size_t n = ndjson_lines(r.body, lines, 64);
    assert_int_equal(n, 6);
    em_buf text = {0};
    for (size_t i = 0; i < n; i++) {
        em_buf_printf(&text, "%s", str_at(lines[i], "message.content"));
        assert_int_equal(json_is_true(at(lines[i], "done")), i + 1 == n);
    }
    assert_string_equal(text.data, "Hello");
    assert_string_equal(str_at(lines[n - 1], "done_reason"), "length");
    assert_int_equal(int_at(lines[n - 1], "eval_count"), 5);
    assert_int_equal(fake_last_max_tokens, 5);
    assert_true(fake_last_sampling.temperature == 0.0f && fake_last_sampling.seed == 7);
    for (size_t i = 0; i < n; i++) json_decref(lines[i]);
    em_buf_free(&text);
    http_free(&r);

    /* generate: the prompt as a user message after system; raw as it is */
    r = http(port, "POST", "/api/generate", NULL, "{\"model\":\"x\",\"prompt\":\"hi\",\"system\":\"be\",\"stream\":false}");
    v = body_json(&r);
    assert_string_equal(str_at(v, "response"), FAKE_REPLY);
    assert_int_equal(int_at(v, "prompt_eval_count"), 10 + PROMPT_HI_TOKENS); /* "system:be\n" first */
    json_decref(v);
    http_free(&r);
    r = http(port, "POST", "/api/generate", NULL, "{\"model\":\"x\",\"prompt\":\"hi\",\"raw\":true,\"stream\":false}");
    v = body_json(&r);
    assert_string_equal(str_at(v, "response"), FAKE_REPLY);
    assert_int_equal(int_at(v, "prompt_eval_count"), 2);
    json_decref(v);
    http_free(&r);
    /* think: false tells the template (enable_thinking) */
    r = http(port, "POST", "/api/chat", NULL, "{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"think\":false,\"stream\":false}");
    assert_int_equal(r.status, 200);
    assert_string_equal(fake_last_kwargs, "{\"enable_thinking\":false}");
    http_free(&r);
    /* a load request */
    r = http(port, "POST", "/api/generate", NULL, "{\"model\":\"x\",\"keep_alive\":0}");
    v = body_json(&r);
    assert_string_equal(str_at(v, "done_reason"), "load");
    json_decref(v);
    http_free(&r);

    r = http(port, "GET", "/api/tags", NULL, NULL);
    assert_int_equal(r.status, 200);
    v = body_json(&r);
    assert_string_equal(str_at(v, "models.0.name"), "fake-model");
    assert_string_equal(str_at(v, "models.0.details.format"), "gguf");
    json_decref(v);
    http_free(&r);
    r = http(port, "POST", "/api/show", NULL, "{\"model\":\"fake-model:latest\"}");
    assert_int_equal(r.status, 200);
    v = body_json(&r);
    assert_string_equal(str_at(v, "capabilities.0"), "completion");
    assert_int_equal(json_integer_value(json_object_get(at(v, "model_info"), "model.context_length")), 128);
    json_decref(v);
    http_free(&r);
    r = http(port, "GET", "/api/version", NULL, NULL);
    assert_int_equal(r.status, 200);
    http_free(&r);
    r = http(port, "GET", "/api/ps", NULL, NULL);
    assert_int_equal(r.status, 200);
    http_free(&r);

    const char *bad[][4] = {
        {"POST", "/api/chat", "{\"model\":\"x\",\"messages\":[],\"options\":{\"top_p\":3}}", "{\"error\":\"options: 'top_p' must be between 0 and 1, got 3\"}"},
        {"POST", "/api/chat", "{\"messages\":[]}", "{\"error\":\"model: is required\"}"},
        {"POST", "/api/chat", "{\"model\":\"x\",\"think\":true}", "{\"error\":\"\\\"fake-model\\\" does not support thinking\"}"},
        {"POST", "/api/generate", "{\"model\":\"x\",\"prompt\":\"a\",\"suffix\":\"b\"}", "{\"error\":\"suffix: is not supported (fill-in-the-middle)\"}"},
        {"POST", "/api/show", "{\"model\":\"other\"}", "{\"error\":\"model 'other' not found\"}"},
        {"POST", "/api/embed", "{\"model\":\"x\",\"input\":\"a\"}", NULL},
        {"POST", "/api/pull", "{}", "{\"error\":\"model: is required\"}"},
        {"GET", "/api/chat", NULL, NULL},
        {"POST", "/api/chat", "[1]", NULL},
    };
    const int statuses[] = {400, 400, 400, 400, 404, 400, 400, 405, 400};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = http(port, bad[i][0], bad[i][1], NULL, bad[i][2]);
        if (r.status != statuses[i]) fail_msg("%s %s: %d %s", bad[i][0], bad[i][1], r.status, r.body);
        if (bad[i][3]) assert_string_equal(r.body, bad[i][3]);
        v = body_json(&r);
        assert_true(json_is_string(json_object_get(v, "error")) && json_object_size(v) == 1);
        json_decref(v);
        http_free(&r);
    }
    wait_released();
    em_server_stop(s);
}

static void test_ollama_thinking_and_calls(void **state) {
    (void)state;
    em_server *s = start_reasoning();
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\"}}}]";
    char body[512];
    snprintf(body, sizeof body, "{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"think-and-call\"}],%s,\"think\":true,"
                                "\"stream\":false}", tools);
    http_result r = http(em_server_port(s), "POST", "/api/chat", NULL, body);
    assert_int_equal(r.status, 200);
    json_t *v = body_json(&r);
    assert_string_equal(str_at(v, "message.thinking"), "Let me see.");
    assert_string_equal(str_at(v, "message.content"), "");
    assert_string_equal(str_at(v, "message.tool_calls.0.function.name"), "get_time");
    assert_string_equal(str_at(v, "message.tool_calls.0.function.arguments.zone"), "UTC");
    json_decref(v);
    http_free(&r);

    snprintf(body, sizeof body, "{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"think-and-call\"}],%s}", tools);
    r = http(em_server_port(s), "POST", "/api/chat", NULL, body);
    json_t *lines[128];
    size_t n = ndjson_lines(r.body, lines, 128);
    assert_true(n > 3);
    em_buf thinking = {0};
    for (size_t i = 0; i + 2 < n; i++) em_buf_printf(&thinking, "%s", str_at(lines[i], "message.thinking"));
    assert_string_equal(thinking.data, "Let me see.");
    assert_string_equal(str_at(lines[n - 2], "message.tool_calls.0.function.arguments.zone"), "UTC");
    assert_true(json_is_true(at(lines[n - 1], "done")));
    for (size_t i = 0; i < n; i++) json_decref(lines[i]);
    em_buf_free(&thinking);
    http_free(&r);

    /* a conversation with the call and its result, arguments as an object */
    snprintf(body, sizeof body, "{\"model\":\"x\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                                "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"get_time\","
                                "\"arguments\":{\"zone\":\"UTC\"}}}]},{\"role\":\"tool\",\"content\":\"noon\",\"tool_name\":\"get_time\"}]}");
    r = http(em_server_port(s), "POST", "/api/chat", NULL, body);
    assert_int_equal(r.status, 200);
    http_free(&r);
    wait_released();
    em_server_stop(s);
}

static void test_new_apis_need_the_key(void **state) {
    (void)state;
    em_server *s = start("sk-test", 0);
    int port = em_server_port(s);
    http_result r = http(port, "GET", "/api/tags", NULL, NULL);
    assert_int_equal(r.status, 401);
    assert_non_null(strstr(r.body, "{\"error\":\"missing API key"));
    http_free(&r);
    r = http(port, "POST", "/responses", NULL, RESPONSES_HI "}");
    assert_int_equal(r.status, 401);
    http_free(&r);
    r = http(port, "GET", "/api/tags", "Authorization: Bearer sk-test\r\n", NULL);
    assert_int_equal(r.status, 200);
    http_free(&r);
    em_server_stop(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_responses),         cmocka_unit_test(test_responses_reasoning_and_call),
        cmocka_unit_test(test_ollama),            cmocka_unit_test(test_ollama_thinking_and_calls),
        cmocka_unit_test(test_new_apis_need_the_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
