/* The server over real sockets, with the fake engine of server_fake.h: routing, every error
 * path the issue lists, API keys, body limits, whole and streamed responses of all the
 * generation endpoints (the Responses API and Ollama's in test_server_apis.c), a client that hangs up (its request is cancelled and released),
 * concurrent clients, and /metrics counting what happened. */
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


static void test_health_and_models(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    int port = em_server_port(s);
    http_result r = http(port, "GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"ok\",\"model\":\"fake-model\"}");
    assert_non_null(strcasestr(r.head, "Content-Type: application/json"));
    http_free(&r);

    r = http(port, "GET", "/v1/models", NULL, NULL);
    assert_int_equal(r.status, 200);
    json_t *v = body_json(&r);
    assert_string_equal(str_at(v, "object"), "list");
    assert_string_equal(str_at(v, "data.0.id"), "fake-model");
    assert_string_equal(str_at(v, "data.0.object"), "model");
    json_decref(v);
    http_free(&r);

    r = http(port, "GET", "/v1/models", "anthropic-version: 2023-06-01\r\n", NULL);
    v = body_json(&r);
    assert_string_equal(str_at(v, "data.0.type"), "model");
    assert_string_equal(str_at(v, "data.0.id"), "fake-model");
    json_decref(v);
    http_free(&r);

    r = http(port, "GET", "/v1/models/fake-model", NULL, NULL);
    assert_int_equal(r.status, 200);
    v = body_json(&r);
    assert_string_equal(str_at(v, "id"), "fake-model");
    json_decref(v);
    http_free(&r);
    r = http(port, "GET", "/v1/models/other", NULL, NULL);
    assert_int_equal(r.status, 404);
    http_free(&r);
    em_server_stop(s);
}

static void test_chat(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    int port = em_server_port(s);
    http_result r = http(port, "POST", "/v1/chat/completions", NULL, CHAT_HI ",\"temperature\":0.25,\"seed\":42}");
    assert_int_equal(r.status, 200);
    json_t *v = body_json(&r);
    assert_non_null(strstr(str_at(v, "id"), "chatcmpl-"));
    assert_string_equal(str_at(v, "object"), "chat.completion");
    assert_string_equal(str_at(v, "model"), "fake-model");
    assert_string_equal(str_at(v, "choices.0.message.role"), "assistant");
    assert_string_equal(str_at(v, "choices.0.message.content"), FAKE_REPLY);
    assert_string_equal(str_at(v, "choices.0.finish_reason"), "stop");
    assert_int_equal(int_at(v, "usage.prompt_tokens"), PROMPT_HI_TOKENS);
    assert_int_equal(int_at(v, "usage.completion_tokens"), 13);
    assert_int_equal(int_at(v, "usage.total_tokens"), PROMPT_HI_TOKENS + 13);
    assert_int_equal(int_at(v, "usage.prompt_tokens_details.cached_tokens"), 3);
    assert_true(json_real_value(at(v, "timings.prefill_ms")) == 1.25);
    assert_int_equal(int_at(v, "timings.cached_tokens"), 3);
    assert_true(json_real_value(at(v, "timings.decode_tokens_per_second")) == 100.0);
    json_decref(v);
    http_free(&r);
    /* what reached the engine: sampling as asked, the output limit up to the context */
    assert_true(fake_last_sampling.temperature == 0.25f);
    assert_true(fake_last_sampling.seed == 42);
    assert_int_equal(fake_last_max_tokens, engine.ctx_tokens - PROMPT_HI_TOKENS);

    r = http(port, "POST", "/v1/chat/completions", NULL, CHAT_HI ",\"stop\":\",\"}");
    v = body_json(&r);
    assert_string_equal(str_at(v, "choices.0.message.content"), "Hello");
    assert_string_equal(str_at(v, "choices.0.finish_reason"), "stop");
    json_decref(v);
    http_free(&r);

    r = http(port, "POST", "/v1/chat/completions", NULL, CHAT_HI ",\"max_tokens\":4,\"n\":2,\"logprobs\":true,\"top_logprobs\":2}");
    assert_int_equal(r.status, 200);
    v = body_json(&r);
    assert_int_equal(json_array_size(at(v, "choices")), 2);
    for (int i = 0; i < 2; i++) {
        char path[64];
        snprintf(path, sizeof path, "choices.%d.message.content", i);
        assert_string_equal(str_at(v, path), "Hell");
        snprintf(path, sizeof path, "choices.%d.finish_reason", i);
        assert_string_equal(str_at(v, path), "length");
        snprintf(path, sizeof path, "choices.%d.index", i);
        assert_int_equal(int_at(v, path), i);
    }
    assert_string_equal(str_at(v, "choices.1.logprobs.content.1.token"), "e");
    assert_true(json_real_value(at(v, "choices.1.logprobs.content.1.logprob")) == -0.5);
    assert_int_equal(json_array_size(at(v, "choices.0.logprobs.content.0.top_logprobs")), 2);
    assert_string_equal(str_at(v, "choices.0.logprobs.content.0.top_logprobs.1.token"), "I"); /* 'H' + 1 */
    assert_int_equal(int_at(v, "usage.prompt_tokens"), PROMPT_HI_TOKENS);
    assert_int_equal(int_at(v, "usage.completion_tokens"), 8);
    json_decref(v);
    http_free(&r);
    wait_released();
    em_server_stop(s);
}

static void test_chat_stream(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    http_result r = http(em_server_port(s), "POST", "/v1/chat/completions", NULL,
                         CHAT_HI ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    assert_int_equal(r.status, 200);
    assert_non_null(strcasestr(r.head, "Content-Type: text/event-stream"));
    char *data[64];
    size_t n = sse_events(r.body, data, NULL, 64);
    /* role chunk, 13 one-token deltas (the last with finish_reason), the usage chunk, [DONE] */
    assert_int_equal(n, 16);
    assert_string_equal(data[n - 1], "[DONE]");
    em_buf text = {0};
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *v = json_loads(data[i], 0, NULL);
        assert_non_null(v);
        assert_string_equal(str_at(v, "object"), "chat.completion.chunk");
        if (i == 0) assert_string_equal(str_at(v, "choices.0.delta.role"), "assistant");
        if (i > 0 && i < n - 2) em_buf_printf(&text, "%s", str_at(v, "choices.0.delta.content"));
        if (i < n - 3) assert_true(json_is_null(at(v, "choices.0.finish_reason")));
        if (i < n - 2) assert_true(json_is_null(at(v, "usage")));
        if (i == n - 3) {
            assert_string_equal(str_at(v, "choices.0.finish_reason"), "stop");
            assert_int_equal(int_at(v, "timings.generated_tokens"), 13);
        }
        if (i == n - 2) {
            assert_int_equal(json_array_size(at(v, "choices")), 0);
            assert_int_equal(int_at(v, "usage.prompt_tokens"), PROMPT_HI_TOKENS);
            assert_int_equal(int_at(v, "usage.completion_tokens"), 13);
            assert_int_equal(int_at(v, "usage.prompt_tokens_details.cached_tokens"), 3);
        }
        json_decref(v);
    }
    assert_string_equal(text.data, FAKE_REPLY);
    em_buf_free(&text);
    for (size_t i = 0; i < n; i++) free(data[i]);
    http_free(&r);
    wait_released();
    em_server_stop(s);
}

static void test_completions(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    int port = em_server_port(s);
    http_result r = http(port, "POST", "/v1/completions", NULL, "{\"model\":\"fake-model\",\"prompt\":[104,105],\"logprobs\":1}");
    assert_int_equal(r.status, 200);
    json_t *v = body_json(&r);
    assert_string_equal(str_at(v, "object"), "text_completion");
    assert_string_equal(str_at(v, "choices.0.text"), FAKE_REPLY);
    assert_int_equal(int_at(v, "usage.prompt_tokens"), 2);
    assert_string_equal(str_at(v, "choices.0.logprobs.tokens.0"), "H");
    assert_int_equal(int_at(v, "choices.0.logprobs.text_offset.12"), 12);
    json_decref(v);
    http_free(&r);

    r = http(port, "POST", "/v1/completions", NULL, "{\"model\":\"fake-model\",\"prompt\":[\"a\",\"bc\"],\"n\":2,\"max_tokens\":2}");
    v = body_json(&r);
    assert_int_equal(json_array_size(at(v, "choices")), 4);
    assert_int_equal(int_at(v, "choices.3.index"), 3);
    assert_string_equal(str_at(v, "choices.3.text"), "He");
    assert_int_equal(int_at(v, "usage.prompt_tokens"), 3);
    assert_int_equal(int_at(v, "usage.completion_tokens"), 8);
    json_decref(v);
    http_free(&r);

    r = http(port, "POST", "/v1/completions", NULL, "{\"model\":\"fake-model\",\"prompt\":\"x\",\"stream\":true,\"stop\":[\"o\"]}");
    char *data[32];
    size_t n = sse_events(r.body, data, NULL, 32);
    assert_int_equal(n, 5); /* H e l l (the last with finish_reason), [DONE] */
    em_buf text = {0};
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *c = json_loads(data[i], 0, NULL);
        em_buf_printf(&text, "%s", str_at(c, "choices.0.text"));
        json_decref(c);
    }
    assert_string_equal(text.data, "Hell");
    assert_non_null(strstr(data[n - 2], "\"finish_reason\":\"stop\""));
    em_buf_free(&text);
    for (size_t i = 0; i < n; i++) free(data[i]);
    http_free(&r);
    wait_released();
    em_server_stop(s);
}

#define MESSAGES_HI "{\"model\":\"fake-model\",\"max_tokens\":100,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_anthropic(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    int port = em_server_port(s);
    http_result r = http(port, "POST", "/v1/messages", "anthropic-version: 2023-06-01\r\n", MESSAGES_HI "}");
    assert_int_equal(r.status, 200);
    json_t *v = body_json(&r);
    assert_non_null(strstr(str_at(v, "id"), "msg_"));
    assert_string_equal(str_at(v, "type"), "message");
    assert_string_equal(str_at(v, "content.0.text"), FAKE_REPLY);
    assert_string_equal(str_at(v, "stop_reason"), "end_turn");
    assert_int_equal(int_at(v, "usage.input_tokens"), PROMPT_HI_TOKENS - 3);
    assert_int_equal(int_at(v, "usage.cache_read_input_tokens"), 3);
    assert_int_equal(int_at(v, "usage.output_tokens"), 13);
    json_decref(v);
    http_free(&r);

    r = http(port, "POST", "/v1/messages", NULL, MESSAGES_HI ",\"stop_sequences\":[\"world\"]}");
    v = body_json(&r);
    assert_string_equal(str_at(v, "content.0.text"), "Hello, ");
    assert_string_equal(str_at(v, "stop_reason"), "stop_sequence");
    assert_string_equal(str_at(v, "stop_sequence"), "world");
    json_decref(v);
    http_free(&r);

    r = http(port, "POST", "/v1/messages", NULL,
             "{\"model\":\"fake-model\",\"max_tokens\":3,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_int_equal(r.status, 200);
    char *data[32], *names[32];
    size_t n = sse_events(r.body, data, names, 32);
    static const char *const expected[] = {"message_start", "content_block_start", "ping", "content_block_delta",
                                           "content_block_delta", "content_block_delta", "content_block_stop",
                                           "message_delta", "message_stop"};
    assert_int_equal(n, 9);
    for (size_t i = 0; i < n; i++) {
        assert_non_null(names[i]);
        assert_string_equal(names[i], expected[i]);
        json_t *e = json_loads(data[i], 0, NULL);
        assert_string_equal(str_at(e, "type"), expected[i]);
        if (i == 0) assert_int_equal(int_at(e, "message.usage.cache_read_input_tokens"), 3);
        if (i == 7) {
            assert_string_equal(str_at(e, "delta.stop_reason"), "max_tokens");
            assert_int_equal(int_at(e, "usage.output_tokens"), 3);
        }
        json_decref(e);
        free(names[i]);
        free(data[i]);
    }
    http_free(&r);

    r = http(port, "POST", "/v1/messages/count_tokens", NULL,
             "{\"model\":\"fake-model\",\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"input_tokens\":27}"); /* "system:S\nuser:hi\nassistant:" */
    http_free(&r);
    wait_released();
    em_server_stop(s);
}

static void expect_error(int port, const char *method, const char *path, const char *headers, const char *body,
                         int status, const char *expected_body_part) {
    http_result r = http(port, method, path, headers, body);
    if (r.status != status || !strstr(r.body, expected_body_part))
        fail_msg("%s %s: got %d '%s', expected %d with '%s'", method, path, r.status, r.body, status, expected_body_part);
    json_t *v = body_json(&r); /* every error body is JSON */
    json_decref(v);
    http_free(&r);
}

/* One model serves requests naming any model (as llama-server does: agent clients send their own
 * names) and reports its own id; ignore_eos (llama-server's field) reaches the engine from both
 * APIs. */
static void test_any_model_name(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    int port = em_server_port(s);
    http_result r = http(port, "POST", "/v1/chat/completions", NULL,
                         "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_int_equal(r.status, 200);
    json_t *v = body_json(&r);
    assert_string_equal(str_at(v, "model"), "fake-model");
    assert_string_equal(str_at(v, "choices.0.message.content"), FAKE_REPLY);
    json_decref(v);
    http_free(&r);
    assert_false(fake_last_ignore_eos);
    r = http(port, "POST", "/v1/messages", "anthropic-version: 2023-06-01\r\n",
             "{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":5,\"ignore_eos\":true,"
             "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_int_equal(r.status, 200);
    v = body_json(&r);
    assert_string_equal(str_at(v, "model"), "fake-model");
    assert_string_equal(str_at(v, "content.0.text"), "Hello");
    json_decref(v);
    http_free(&r);
    assert_true(fake_last_ignore_eos);
    r = http(port, "POST", "/v1/completions", NULL, "{\"model\":\"x\",\"prompt\":\"hi\",\"ignore_eos\":true}");
    assert_int_equal(r.status, 200);
    http_free(&r);
    assert_true(fake_last_ignore_eos);
    r = http(port, "POST", "/v1/chat/completions", NULL, CHAT_HI ",\"ignore_eos\":false}");
    http_free(&r);
    assert_false(fake_last_ignore_eos);
    expect_error(port, "POST", "/v1/chat/completions", NULL, CHAT_HI ",\"ignore_eos\":1}", 400,
                 "\"param\":\"ignore_eos\"");
    /* Speculative decoding: the server's default unless the request turns it off or picks a mode. */
    assert_int_equal(fake_last_speculative, EMBER_SPEC_DEFAULT);
    const struct {
        const char *fields;
        int want;
    } spec_cases[] = {
        {",\"speculative\":false}", EMBER_SPEC_OFF},   {",\"speculative\":true}", EMBER_SPEC_DEFAULT},
        {",\"speculative\":\"lookup\"}", EMBER_SPEC_LOOKUP}, {",\"speculative\":\"draft\"}", EMBER_SPEC_DRAFT},
        {",\"speculative.n_max\":0}", EMBER_SPEC_OFF}, {",\"speculative.n_max\":8}", EMBER_SPEC_DEFAULT},
    };
    char body[256];
    for (size_t i = 0; i < sizeof spec_cases / sizeof spec_cases[0]; i++) {
        snprintf(body, sizeof body, CHAT_HI "%s", spec_cases[i].fields);
        r = http(port, "POST", "/v1/chat/completions", NULL, body);
        assert_int_equal(r.status, 200);
        http_free(&r);
        assert_int_equal(fake_last_speculative, spec_cases[i].want);
    }
    r = http(port, "POST", "/v1/messages", "anthropic-version: 2023-06-01\r\n",
             "{\"model\":\"c\",\"max_tokens\":5,\"speculative\":false,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_int_equal(r.status, 200);
    http_free(&r);
    assert_int_equal(fake_last_speculative, EMBER_SPEC_OFF);
    expect_error(port, "POST", "/v1/chat/completions", NULL, CHAT_HI ",\"speculative\":\"maybe\"}", 400,
                 "\"param\":\"speculative\"");
    expect_error(port, "POST", "/v1/chat/completions", NULL, CHAT_HI ",\"speculative\":3}", 400,
                 "\"param\":\"speculative\"");
    em_server_stop(s);
}

static void test_errors(void **state) {
    (void)state;
    em_server *s = start(NULL, 1024);
    int port = em_server_port(s);
    expect_error(port, "POST", "/v1/chat/completions", NULL, "{\"model\":", 400,
                 "{\"error\":{\"message\":\"the body is not valid JSON: ");
    expect_error(port, "POST", "/v1/messages", NULL, "{nope}", 400,
                 "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"the body is not valid JSON");
    expect_error(port, "POST", "/v1/chat/completions", NULL, CHAT_HI ",\"max_tokens\":0}", 400, "at least 1");
    expect_error(port, "POST", "/v1/chat/completions", NULL, CHAT_HI ",\"temperature\":\"x\"}", 400, "\"param\":\"temperature\"");
    expect_error(port, "POST", "/v1/messages", NULL, "{\"model\":\"fake-model\",\"messages\":[]}", 400, "max_tokens: field required");
    expect_error(port, "GET", "/v1/nothing", NULL, NULL, 404, "unknown path: GET /v1/nothing");
    expect_error(port, "POST", "/v1/messages/nothing", NULL, "{}", 404, "\"type\":\"not_found_error\"");
    expect_error(port, "DELETE", "/v1/completions", NULL, NULL, 405, "method not allowed");
    http_result r = http(port, "GET", "/v1/chat/completions", NULL, NULL);
    assert_int_equal(r.status, 405);
    assert_non_null(strcasestr(r.head, "Allow: POST"));
    http_free(&r);

    /* a prompt longer than the context (128 tokens in the fake) */
    char body[1024];
    char long_text[200];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = 0;
    snprintf(body, sizeof body, "{\"model\":\"fake-model\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}", long_text);
    expect_error(port, "POST", "/v1/chat/completions", NULL, body, 400, "\"code\":\"context_length_exceeded\"");
    snprintf(body, sizeof body, "{\"model\":\"fake-model\",\"prompt\":\"%s\"}", long_text);
    expect_error(port, "POST", "/v1/completions", NULL, body, 400, "the prompt has 199 tokens; the context holds 128");

    /* bodies over --max-body (1024 here): announced by Content-Length, or sent chunked */
    char big[1100];
    memset(big, ' ', sizeof big - 1);
    big[sizeof big - 1] = 0;
    big[0] = '{';
    big[sizeof big - 2] = '}';
    expect_error(port, "POST", "/v1/chat/completions", NULL, big, 413, "at most 1024");
    expect_error(port, "POST", "/v1/messages", NULL, big, 413, "\"type\":\"request_too_large\"");
    int fd = connect_to(port);
    const char *head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n";
    send_all(fd, head, strlen(head));
    for (int i = 0; i < 3; i++) {
        char chunk[600];
        snprintf(chunk, sizeof chunk, "200\r\n%0512d\r\n", 0);
        send_all(fd, chunk, strlen(chunk));
    }
    send_all(fd, "0\r\n\r\n", 5);
    em_buf raw = {0};
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) em_buf_append(&raw, buf, (size_t)n);
    close(fd);
    r = parse_response(&raw);
    em_buf_free(&raw);
    assert_int_equal(r.status, 413);
    http_free(&r);

    /* and the server keeps serving */
    r = http(port, "POST", "/v1/chat/completions", NULL, CHAT_HI "}");
    assert_int_equal(r.status, 200);
    http_free(&r);
    wait_released();
    em_server_stop(s);
}

static void test_api_key(void **state) {
    (void)state;
    em_server *s = start("sk-test", 0);
    int port = em_server_port(s);
    expect_error(port, "POST", "/v1/chat/completions", NULL, CHAT_HI "}", 401, "\"code\":\"invalid_api_key\"");
    expect_error(port, "POST", "/v1/chat/completions", "Authorization: Bearer sk-wrong\r\n", CHAT_HI "}", 401,
                 "invalid API key");
    expect_error(port, "POST", "/v1/messages", "x-api-key: sk-tes\r\n", MESSAGES_HI "}", 401, "\"type\":\"authentication_error\"");
    expect_error(port, "GET", "/v1/models", NULL, NULL, 401, "missing API key");
    http_result r = http(port, "POST", "/v1/chat/completions", "Authorization: Bearer sk-test\r\n", CHAT_HI "}");
    assert_int_equal(r.status, 200);
    http_free(&r);
    r = http(port, "POST", "/v1/messages", "x-api-key: sk-test\r\nanthropic-version: 2023-06-01\r\n", MESSAGES_HI "}");
    assert_int_equal(r.status, 200);
    http_free(&r);
    r = http(port, "GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    http_free(&r);
    r = http(port, "GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    http_free(&r);
    /* the key before routing: without it, unknown paths and wrong methods say nothing about routes */
    expect_error(port, "GET", "/v1/nothing", NULL, NULL, 401, "missing API key");
    expect_error(port, "GET", "/admin", NULL, NULL, 401, "missing API key");
    expect_error(port, "GET", "/v1/chat/completions", "Authorization: Bearer sk-wrong\r\n", NULL, 401,
                 "invalid API key");
    expect_error(port, "DELETE", "/v1/messages", NULL, NULL, 401, "\"type\":\"authentication_error\"");
    /* with it, they are told apart */
    expect_error(port, "GET", "/v1/nothing", "x-api-key: sk-test\r\n", NULL, 404, "unknown path");
    expect_error(port, "GET", "/v1/chat/completions", "x-api-key: sk-test\r\n", NULL, 405, "method not allowed");
    wait_released();
    em_server_stop(s);

    /* an empty key is refused at start rather than serving without one */
    engine = fake_engine();
    em_server_options options = {.host = "127.0.0.1", .port = 0, .api_key = ""};
    em_err e = em_server_start(&options, &engine, &s);
    assert_int_equal(em_err_code_of(e), EM_ERR_INVALID);
    assert_null(s);
    em_err_free(e);
}

/* Raw bytes on a fresh connection; the whole answer until the server closes. */
static http_result raw_exchange(int port, const char *text) {
    int fd = connect_to(port);
    send_all(fd, text, strlen(text));
    return http_read_all(fd);
}

static void expect_raw(int port, const char *text, int status, const char *expected_body_part) {
    http_result r = raw_exchange(port, text);
    if (r.status != status || !strstr(r.body, expected_body_part))
        fail_msg("got %d '%s', expected %d with '%s' for:\n%s", r.status, r.body, status, expected_body_part, text);
    json_t *v = body_json(&r); /* the body is JSON alone: one response, its head written once */
    json_decref(v);
    http_free(&r);
}

/* Ambiguous framing is a 400, a transfer coding the server cannot read a 501, both answered from
 * the headers (the body is never waited for), before the key is asked for. */
static void test_framing(void **state) {
    (void)state;
    em_server *s = start("sk-test", 0);
    int port = em_server_port(s);
    expect_raw(port, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 40\r\n"
                     "Connection: close\r\n\r\n{}", 400, "2 Content-Length headers");
    expect_raw(port, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nxx", 501,
               "Transfer-Encoding 'gzip' is not supported");
    expect_raw(port, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n"
                     "Connection: close\r\n\r\n0\r\n\r\n", 400, "\"type\":\"invalid_request_error\"");
    expect_raw(port, "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", 400, "needs a Host header");
    /* libmicrohttpd's own answer to a malformed length (its head written twice by 0.9.75: not
     * checked here, docs/serve.md) */
    http_result r = raw_exchange(port, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n"
                                       "Connection: close\r\n\r\n{}");
    assert_int_equal(r.status, 400);
    http_free(&r);
    em_server_stop(s);
}

/* A connection too slow to send its headers is cut after header_seconds; a client with more than
 * receiving_per_client connections still sending loses its oldest, so a new request always gets in. */
static void test_slow_senders(void **state) {
    (void)state;
    engine = fake_engine();
    em_server_options options = {.host = "127.0.0.1", .header_seconds = 1, .receiving_per_client = 4};
    em_server *s = NULL;
    assert_null(em_server_start(&options, &engine, &s));
    int port = em_server_port(s);
    int slow = connect_to(port);
    const char *partial = "GET /health HTTP/1.1\r\nHost:";
    send_all(slow, partial, strlen(partial));
    char byte;
    struct timeval wait = {.tv_sec = 5};
    setsockopt(slow, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_true(recv(slow, &byte, 1, 0) <= 0); /* cut, with nothing sent */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 4);
    close(slow);

    int held[4];
    for (int i = 0; i < 4; i++) {
        held[i] = connect_to(port);
        send_all(held[i], "GET /he", 7);
        setsockopt(held[i], SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
        usleep(20000); /* accepted in this order */
    }
    http_result r = http(port, "GET", "/health", NULL, NULL); /* a fifth: the oldest makes room */
    assert_int_equal(r.status, 200);
    http_free(&r);
    assert_true(recv(held[0], &byte, 1, 0) <= 0);
    for (int i = 0; i < 4; i++) close(held[i]);
    em_server_stop(s);
}

/* A client that hangs up mid-stream, or while waiting for a whole response, cancels its request. */
static void test_disconnect_cancels(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    int port = em_server_port(s);
    int cancelled = atomic_load(&fake_cancelled);
    int fd = connect_to(port);
    send_request(fd, "POST", "/v1/chat/completions", NULL,
                 "{\"model\":\"fake-model\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"slow\"}]}");
    char buf[4096];
    em_buf raw = {0};
    while (!raw.data || !strstr(raw.data, "\"content\":\"b\"")) { /* the second token arrived */
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        assert_true(n > 0);
        em_buf_append(&raw, buf, (size_t)n);
    }
    em_buf_free(&raw);
    close(fd);
    for (int i = 0; i < 300 && atomic_load(&fake_cancelled) == cancelled; i++) usleep(10000);
    assert_int_equal(atomic_load(&fake_cancelled), cancelled + 1);
    wait_released();

    fd = connect_to(port);
    send_request(fd, "POST", "/v1/messages", NULL,
                 "{\"model\":\"fake-model\",\"max_tokens\":300,\"messages\":[{\"role\":\"user\",\"content\":\"slow\"}]}");
    usleep(100000);
    close(fd);
    for (int i = 0; i < 300 && atomic_load(&fake_cancelled) == cancelled + 1; i++) usleep(10000);
    assert_int_equal(atomic_load(&fake_cancelled), cancelled + 2);
    wait_released();
    http_result r = http(port, "GET", "/metrics", NULL, NULL);
    assert_non_null(strstr(r.body, "ember_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1\n"
                                   "ember_http_requests_total{endpoint=\"/v1/messages\",status=\"499\"} 1\n"));
    http_free(&r);
    em_server_stop(s);
}

/* Stopping the server while streams are running cancels them and returns promptly. */
static void test_stop_with_running_streams(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    int port = em_server_port(s);
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = connect_to(port);
        send_request(fds[i], "POST", "/v1/chat/completions", NULL,
                     "{\"model\":\"fake-model\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"slow\"}]}");
        char buf[256];
        assert_true(recv(fds[i], buf, sizeof buf, 0) > 0); /* the stream has started */
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    em_server_stop(s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    assert_true(seconds < 2.0); /* the slow replies would take 8 s */
    assert_int_equal(atomic_load(&fake_released), atomic_load(&fake_submitted));
    for (int i = 0; i < 3; i++) close(fds[i]);
}

static int shared_port;

static void *stream_client(void *arg) {
    (void)arg;
    http_result r = http(shared_port, "POST", "/v1/chat/completions", NULL, CHAT_HI ",\"stream\":true}");
    long ok = r.status == 200 && strstr(r.body, "\"finish_reason\":\"stop\"") && strstr(r.body, "data: [DONE]\n\n");
    /* the text, token by token */
    em_buf text = {0};
    for (const char *p = r.body; (p = strstr(p, "\"content\":\"")); p += 11) {
        const char *q = p + 11;
        if (*q != '"') em_buf_append(&text, q, 1);
    }
    ok = ok && text.data && !strcmp(text.data, FAKE_REPLY);
    em_buf_free(&text);
    http_free(&r);
    return (void *)ok;
}

static void test_concurrent_streams(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    shared_port = em_server_port(s);
    pthread_t threads[16];
    for (int i = 0; i < 16; i++) assert_int_equal(pthread_create(&threads[i], NULL, stream_client, NULL), 0);
    for (int i = 0; i < 16; i++) {
        void *ok;
        pthread_join(threads[i], &ok);
        assert_true(ok != NULL);
    }
    wait_released();
    em_server_stop(s);
}

static void test_metrics_counts(void **state) {
    (void)state;
    em_server *s = start(NULL, 0);
    int port = em_server_port(s);
    for (int i = 0; i < 2; i++) {
        http_result r = http(port, "POST", "/v1/chat/completions", NULL, CHAT_HI "}");
        http_free(&r);
    }
    http_result r = http(port, "POST", "/v1/chat/completions", NULL, "{");
    http_free(&r);
    r = http(port, "GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strcasestr(r.head, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(strstr(r.body, "ember_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n"
                                   "ember_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1\n"));
    assert_non_null(strstr(r.body, "\nember_kv_blocks_free 54\n"));
    assert_non_null(strstr(r.body, "\nember_step_seconds_count 8\n"));
    http_free(&r);
    wait_released();
    em_server_stop(s);
}

/* ---- The Responses API and Ollama's API (responses.c, ollama.c) ---- */

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_and_models), cmocka_unit_test(test_chat),
        cmocka_unit_test(test_chat_stream),       cmocka_unit_test(test_completions),
        cmocka_unit_test(test_anthropic),         cmocka_unit_test(test_any_model_name),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_api_key),           cmocka_unit_test(test_framing),
        cmocka_unit_test(test_slow_senders),           cmocka_unit_test(test_disconnect_cancels),
        cmocka_unit_test(test_concurrent_streams), cmocka_unit_test(test_metrics_counts),
        cmocka_unit_test(test_stop_with_running_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
