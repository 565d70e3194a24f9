/* Beyond generation on Ollama's API and llama.cpp's extras, over real sockets with the fake engine
 * of server_fake.h (byte tokens: id = byte value): /tokenize and /detokenize with llama.cpp's
 * fields and defaults, Ollama's model management refused in its own format (a pull of the served
 * model succeeds), num_ctx bounding a request's context, /api/show's capabilities and model_info,
 * and the second port of --ollama-port serving the same APIs. */
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

static em_server_engine engine;

static em_server *start_with(const em_server_engine *e, int ollama_port) {
    engine = *e;
    em_server_options options = {.host = "127.0.0.1", .port = 0, .ollama_port = ollama_port};
    em_server *s = NULL;
    em_err err = em_server_start(&options, &engine, &s);
    if (err) fail_msg("%s", em_err_message(err));
    return s;
}

static em_server *start(void) {
    em_server_engine e = fake_engine();
    return start_with(&e, 0);
}

static void wait_released(void) {
    for (int i = 0; i < 300 && atomic_load(&fake_released) != atomic_load(&fake_submitted); i++) usleep(10000);
    assert_int_equal(atomic_load(&fake_released), atomic_load(&fake_submitted));
}

/* POSTs `body` and checks the status and the whole body. */
static void expect(int port, const char *method, const char *path, const char *body, int status, const char *want) {
    http_result r = http(port, method, path, NULL, body);
    if (r.status != status || (want && strcmp(r.body, want)))
        fail_msg("%s %s %s: got %d %s, want %d %s", method, path, body ? body : "", r.status, r.body, status,
                 want ? want : "");
    http_free(&r);
}

static void test_tokenize(void **state) {
    (void)state;
    em_server *s = start();
    int port = em_server_port(s);
    /* llama.cpp's defaults: no special tokens added, control-token text parsed */
    expect(port, "POST", "/tokenize", "{\"content\":\"Hi!\"}", 200, "{\"tokens\":[72,105,33]}");
    assert_false(fake_last_add_special);
    assert_true(fake_last_parse_special);
    expect(port, "POST", "/tokenize", "{\"content\":\"Hi\",\"add_special\":true,\"parse_special\":false}", 200,
           "{\"tokens\":[72,105]}");
    assert_true(fake_last_add_special);
    assert_false(fake_last_parse_special);
    /* pieces: text when whole UTF-8, else the bytes */
    expect(port, "POST", "/tokenize", "{\"content\":\"a\\u00e9\",\"with_pieces\":true}", 200,
           "{\"tokens\":[{\"id\":97,\"piece\":\"a\"},{\"id\":195,\"piece\":[195]},{\"id\":169,\"piece\":[169]}]}");
    /* strings and ids in order; add_special for the first string only */
    expect(port, "POST", "/tokenize", "{\"content\":[\"a\",7,\"b\"],\"add_special\":true}", 200, "{\"tokens\":[97,7,98]}");
    assert_false(fake_last_add_special);
    expect(port, "POST", "/tokenize", "{}", 200, "{\"tokens\":[]}");
    expect(port, "POST", "/tokenize", "{\"content\":\"\"}", 200, "{\"tokens\":[]}");

    expect(port, "POST", "/detokenize", "{\"tokens\":[72,105,33]}", 200, "{\"content\":\"Hi!\"}");
    /* a character split across tokens comes out whole; a lone byte of one is U+FFFD */
    expect(port, "POST", "/detokenize", "{\"tokens\":[97,195,169]}", 200, "{\"content\":\"a\xc3\xa9\"}");
    expect(port, "POST", "/detokenize", "{\"tokens\":[97,195]}", 200, "{\"content\":\"a\xef\xbf\xbd\"}");
    expect(port, "POST", "/detokenize", "{}", 200, "{\"content\":\"\"}");

    const char *bad[][3] = {
        {"/tokenize", "{\"content\":5}", "content: must be a string, or an array of strings and token ids"},
        {"/tokenize", "{\"content\":[\"a\",300]}", "content[1]: token id 300 is outside the model's ids 0..255"},
        {"/tokenize", "{\"content\":[\"a\",{}]}", "content[1]: must be a token id (an integer)"},
        {"/tokenize", "{\"content\":\"a\",\"with_pieces\":\"yes\"}", "'with_pieces'"},
        {"/tokenize", "{\"content\":\"a\",\"add_special\":1}", "'add_special'"},
        {"/tokenize", "[\"a\"]", NULL},
        {"/detokenize", "{\"tokens\":\"Hi\"}", "tokens: must be an array of token ids"},
        {"/detokenize", "{\"tokens\":[1,-1]}", "tokens[1]: token id -1 is outside the model's ids 0..255"},
        {"/detokenize", "{\"tokens\":[1.5]}", "tokens[0]: must be a token id (an integer)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        http_result r = http(port, "POST", bad[i][0], NULL, bad[i][1]);
        if (r.status != 400) fail_msg("%s %s: %d %s", bad[i][0], bad[i][1], r.status, r.body);
        json_t *v = body_json(&r);
        const char *message = str_at(v, "error.message");
        assert_non_null(message); /* OpenAI's error format, as llama.cpp's server answers */
        if (bad[i][2] && !strstr(message, bad[i][2])) fail_msg("%s %s: '%s'", bad[i][0], bad[i][1], message);
        json_decref(v);
        http_free(&r);
    }
    expect(port, "GET", "/tokenize", NULL, 405, NULL);
    em_server_stop(s);
}

static void test_model_management(void **state) {
    (void)state;
    em_server *s = start();
    int port = em_server_port(s);
    /* the served model is there already: a pull succeeds, streamed as NDJSON unless stream is false */
    http_result r = http(port, "POST", "/api/pull", NULL, "{\"model\":\"fake-model:latest\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"success\"}\n");
    assert_non_null(strcasestr(r.head, "Content-Type: application/x-ndjson"));
    http_free(&r);
    expect(port, "POST", "/api/pull", "{\"name\":\"fake-model\",\"stream\":false}", 200, "{\"status\":\"success\"}");

    const char *bad[][4] = {
        {"POST", "/api/pull", "{\"model\":\"llama3.2\"}", "\"llama3.2\" (fetch models with `ember pull`"},
        {"POST", "/api/pull", "{}", "model: is required"},
        {"POST", "/api/pull", "{\"model\":{}}", "'model' must be a string"},
        {"POST", "/api/pull", "{\"model\":\"fake-model\",\"stream\":\"no\"}", "stream: must be a boolean"},
        {"DELETE", "/api/delete", "{\"model\":\"fake-model\"}", "is being served and cannot be deleted"},
        {"DELETE", "/api/delete", "{\"model\":\"other\"}", "model 'other' not found"},
        {"POST", "/api/copy", "{\"source\":\"fake-model\",\"destination\":\"mine\"}", "ember serve --alias NAME"},
        {"POST", "/api/create", "{\"model\":\"mine\",\"from\":\"fake-model\"}", "cannot create models"},
        {"POST", "/api/push", "{\"model\":\"fake-model\"}", "does not push models"},
        {"POST", "/api/push", "not json", NULL},
    };
    const int statuses[] = {400, 400, 400, 400, 400, 404, 400, 400, 400, 400};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = http(port, bad[i][0], bad[i][1], NULL, bad[i][2]);
        if (r.status != statuses[i]) fail_msg("%s %s: %d %s", bad[i][0], bad[i][1], r.status, r.body);
        json_t *v = body_json(&r);
        const char *message = json_string_value(json_object_get(v, "error"));
        assert_true(message && json_object_size(v) == 1);
        if (bad[i][3] && !strstr(message, bad[i][3])) fail_msg("%s %s: '%s'", bad[i][0], bad[i][1], message);
        json_decref(v);
        http_free(&r);
    }
    /* each path takes its own method, as Ollama's: delete is DELETE */
    r = http(port, "POST", "/api/delete", NULL, "{\"model\":\"fake-model\"}");
    assert_int_equal(r.status, 405);
    assert_non_null(strcasestr(r.head, "Allow: DELETE"));
    http_free(&r);
    r = http(port, "GET", "/api/pull", NULL, NULL);
    assert_int_equal(r.status, 405);
    assert_non_null(strcasestr(r.head, "Allow: POST"));
    http_free(&r);
    em_server_stop(s);
}

#define CHAT_HI "{\"model\":\"x\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define PROMPT_HI_TOKENS 18 /* "user:hi\nassistant:" in the fake's chat format */

static void test_num_ctx(void **state) {
    (void)state;
    em_server *s = start(); /* the fake's context: 128 tokens */
    int port = em_server_port(s);
    /* below the server's context: prompt and output fit num_ctx */
    expect(port, "POST", "/api/chat", CHAT_HI ",\"options\":{\"num_ctx\":64}}", 200, NULL);
    assert_int_equal(fake_last_max_tokens, 64 - PROMPT_HI_TOKENS);
    expect(port, "POST", "/api/chat", CHAT_HI ",\"options\":{\"num_ctx\":64,\"num_predict\":100}}", 200, NULL);
    assert_int_equal(fake_last_max_tokens, 64 - PROMPT_HI_TOKENS);
    /* above it: the server's context */
    expect(port, "POST", "/api/chat", CHAT_HI ",\"options\":{\"num_ctx\":32768}}", 200, NULL);
    assert_int_equal(fake_last_max_tokens, 128 - PROMPT_HI_TOKENS);
    /* a prompt longer than num_ctx is refused, saying so */
    http_result r = http(port, "POST", "/api/chat", NULL, CHAT_HI ",\"options\":{\"num_ctx\":10}}");
    assert_int_equal(r.status, 400);
    assert_string_equal(r.body, "{\"error\":\"the prompt has 18 tokens; the context holds 10 (prompt and output "
                                "together, the request's num_ctx)\"}");
    http_free(&r);
    expect(port, "POST", "/api/chat", CHAT_HI ",\"options\":{\"num_ctx\":0}}", 400,
           "{\"error\":\"options: 'num_ctx' must be between 1 and 2147483647, got 0\"}");
    expect(port, "POST", "/api/generate", "{\"model\":\"x\",\"prompt\":\"hi\",\"raw\":true,\"stream\":false,"
                                          "\"options\":{\"num_ctx\":12}}", 200, NULL);
    assert_int_equal(fake_last_max_tokens, 12 - 2);
    wait_released();
    em_server_stop(s);
}

static void test_show(void **state) {
    (void)state;
    em_server_engine e = fake_engine();
    /* a template that takes tools, a reasoning model, and the file's metadata */
    e.facts.chat_template = "{% for tool in tools %}{{ tool }}{% endfor %}<think>";
    e.reasons = true;
    e.facts.architecture = "qwen3";
    json_t *metadata = json_pack("{s:s, s:i, s:[i,i]}", "general.architecture", "qwen3", "qwen3.context_length", 40960,
                                 "qwen3.attention.head_count_kv", 2, 4);
    e.facts.metadata = metadata;
    em_server *s = start_with(&e, 0);
    http_result r = http(em_server_port(s), "POST", "/api/show", NULL, "{\"model\":\"fake-model\"}");
    assert_int_equal(r.status, 200);
    json_t *v = body_json(&r);
    assert_true(json_equal(at(v, "model_info"), metadata));
    json_t *want = json_pack("[s,s,s]", "completion", "tools", "thinking");
    assert_true(json_equal(at(v, "capabilities"), want));
    assert_string_equal(str_at(v, "details.family"), "qwen3");
    json_decref(want);
    json_decref(v);
    http_free(&r);
    em_server_stop(s);

    /* no tools in the template, no reasoning: completion alone */
    e = fake_engine();
    e.facts.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
    s = start_with(&e, 0);
    r = http(em_server_port(s), "POST", "/api/show", NULL, "{\"model\":\"fake-model\"}");
    v = body_json(&r);
    want = json_pack("[s]", "completion");
    assert_true(json_equal(at(v, "capabilities"), want));
    json_decref(want);
    json_decref(v);
    http_free(&r);
    em_server_stop(s);
    json_decref(metadata);
}

/* A port free now (the kernel's pick for a socket bound to port 0, closed again). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&addr, &len), 0);
    close(fd);
    return ntohs(addr.sin_port);
}

static void test_second_port(void **state) {
    (void)state;
    em_server_engine e = fake_engine();
    int second = free_port();
    em_server *s = start_with(&e, second);
    assert_int_equal(em_server_ollama_port(s), second);
    assert_int_not_equal(em_server_port(s), second);
    /* both ports serve every API, on the one engine */
    expect(second, "POST", "/api/chat", CHAT_HI "}", 200, NULL);
    expect(em_server_port(s), "POST", "/api/chat", CHAT_HI "}", 200, NULL);
    expect(second, "GET", "/v1/models", NULL, 200, NULL);
    http_result r = http(second, "GET", "/metrics", NULL, NULL);
    assert_non_null(strstr(r.body, "endpoint=\"/api/chat\",status=\"200\"} 2"));
    http_free(&r);
    wait_released();
    /* a port already taken is an error that names it */
    em_server_options options = {.host = "127.0.0.1", .port = 0, .ollama_port = second};
    em_server *other = NULL;
    em_err err = em_server_start(&options, &engine, &other);
    assert_non_null(err);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", second);
    assert_non_null(strstr(em_err_message(err), want));
    assert_null(other);
    em_err_free(err);
    em_server_stop(s);
    assert_int_equal(em_server_ollama_port(s = start()), 0);
    em_server_stop(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize), cmocka_unit_test(test_model_management), cmocka_unit_test(test_num_ctx),
        cmocka_unit_test(test_show),     cmocka_unit_test(test_second_port),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
