/* Requests' grammars on the server (structured.c, generate.c), over real sockets with the fake
 * engine of server_fake.h: a schema, a raw grammar or a set of tools sent again is compiled once
 * (the engine gets the same compiled grammar, /metrics counts one compilation), through any of the
 * APIs; a grammar past the CPU-time limit is a 400 naming the limit; a client that hangs up during a
 * long compilation stops it, and so does the server stopping; a grammar that turns out too
 * ambiguous partway through the answer is a 400 naming its field (an error event in a stream),
 * not a 500. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

#include "http_client.h"
#include "server_fake.h"

static em_server_engine engine;

static em_server *start(double grammar_seconds) {
    engine = fake_engine();
    em_server_options options = {.host = "127.0.0.1", .port = 0, .max_body = 64 << 20, .grammar_seconds = grammar_seconds};
    em_server *s = NULL;
    em_err e = em_server_start(&options, &engine, &s);
    if (e) fail_msg("%s", em_err_message(e));
    return s;
}

static void wait_released(void) {
    for (int i = 0; i < 1000 && atomic_load(&fake_released) != atomic_load(&fake_submitted); i++) usleep(10000);
    assert_int_equal(atomic_load(&fake_released), atomic_load(&fake_submitted));
}

/* The value of a counter or gauge in /metrics. */
static long long metric(int port, const char *name) {
    http_result r = http(port, "GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    char needle[128];
    snprintf(needle, sizeof needle, "\n%s ", name);
    const char *at = strstr(r.body, needle);
    if (!at) fail_msg("no %s in /metrics", name);
    long long value = atoll(at + strlen(needle));
    http_free(&r);
    return value;
}

static const ember_grammar *last_grammar(void) {
    pthread_mutex_lock(&fake_lock);
    const ember_grammar *g = fake_last_grammar;
    pthread_mutex_unlock(&fake_lock);
    return g;
}

/* Sends `body` to `path` and expects `status`; returns the compiled grammar the engine got. */
static const ember_grammar *send_expecting(int port, const char *path, const char *body, int status) {
    http_result r = http(port, "POST", path, NULL, body);
    if (r.status != status) fail_msg("%s: status %d: %s", path, r.status, r.body);
    http_free(&r);
    return last_grammar();
}

#define SCHEMA "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}"

/* An agent's requests repeat their schema, tools or grammar: the second and third are served from
 * the cache, with the very grammar the first compiled, whichever API carries them. */
static void test_repeated_grammars_compiled_once(void **state) {
    (void)state;
    em_server *s = start(0);
    int port = em_server_port(s);
    const char *chat = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":"
                       "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"w\",\"schema\":" SCHEMA "}}}";
    const ember_grammar *first = send_expecting(port, "/v1/chat/completions", chat, 200);
    assert_non_null(first);
    assert_int_equal(metric(port, "ember_grammar_compiles_total"), 2); /* the schema's GBNF, then the GBNF */
    assert_int_equal(metric(port, "ember_grammar_cache_hits_total"), 0);
    assert_ptr_equal(send_expecting(port, "/v1/chat/completions", chat, 200), first);
    assert_ptr_equal(send_expecting(port, "/api/chat",
                                    "{\"model\":\"m\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                    "\"format\":" SCHEMA "}",
                                    200),
                     first);
    assert_int_equal(metric(port, "ember_grammar_compiles_total"), 2);
    assert_int_equal(metric(port, "ember_grammar_cache_hits_total"), 4);
    assert_int_equal(metric(port, "ember_grammar_cache_entries"), 2);

    const char *tools = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tool_choice\":\"required\","
                        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"weather\",\"parameters\":" SCHEMA "}}]}";
    const ember_grammar *call = send_expecting(port, "/v1/chat/completions", tools, 200);
    assert_ptr_not_equal(call, first);
    const long long compiled = metric(port, "ember_grammar_compiles_total");
    assert_true(compiled > 2);
    assert_ptr_equal(send_expecting(port, "/v1/chat/completions", tools, 200), call);
    assert_int_equal(metric(port, "ember_grammar_compiles_total"), compiled);

    const char *raw = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"grammar\":\"root ::= [a-z]+\"}";
    const ember_grammar *g = send_expecting(port, "/v1/chat/completions", raw, 200);
    assert_ptr_equal(send_expecting(port, "/v1/chat/completions", raw, 200), g);
    assert_int_equal(metric(port, "ember_grammar_compiles_total"), compiled + 1);

    /* A refused grammar is refused again from the cache, with the same answer. */
    const char *bad = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"grammar\":\"root ::= [\"}";
    for (int i = 0; i < 2; i++) {
        http_result r = http(port, "POST", "/v1/chat/completions", NULL, bad);
        assert_int_equal(r.status, 400);
        json_t *v = body_json(&r);
        assert_string_equal(str_at(v, "error.param"), "grammar");
        assert_non_null(strstr(str_at(v, "error.message"), "unterminated character class"));
        json_decref(v);
        http_free(&r);
    }
    assert_int_equal(metric(port, "ember_grammar_compiles_total"), compiled + 2);
    wait_released();
    em_server_stop(s);
}

/* A GBNF of n rules, each calling the next. */
static char *rule_chain_request(size_t n) {
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"grammar\":\"root ::= r0\\n"));
    for (size_t i = 0; i < n; i++) assert_true(em_buf_printf(&b, "r%zu ::= \\\"a\\\" r%zu | \\\"b\\\"\\n", i, i + 1));
    assert_true(em_buf_printf(&b, "r%zu ::= \\\"c\\\"\\n\"}", n));
    return b.data;
}

/* A chat request whose response_format is a schema of n optional properties. */
static char *wide_schema_request(size_t n) {
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":"
                                  "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"w\",\"schema\":"
                                  "{\"type\":\"object\",\"properties\":{"));
    for (size_t i = 0; i < n; i++) assert_true(em_buf_printf(&b, "%s\"property_%zu\":{\"type\":\"string\"}", i ? "," : "", i));
    assert_true(em_buf_printf(&b, "}}}}}"));
    return b.data;
}

/* Compiling past the server's CPU time for one grammar is the client's error: a 400 naming the
 * field and the limit, for a raw grammar and for a schema alike. A small grammar is untouched. */
static void test_compile_time_limit(void **state) {
    (void)state;
    em_server *s = start(1e-9);
    int port = em_server_port(s);
    char *chain = rule_chain_request(20000), *schema = wide_schema_request(2000);
    const char *bodies[] = {chain, schema};
    const char *params[] = {"grammar", "response_format.json_schema.schema"};
    for (int i = 0; i < 2; i++) {
        http_result r = http(port, "POST", "/v1/chat/completions", NULL, bodies[i]);
        assert_int_equal(r.status, 400);
        json_t *v = body_json(&r);
        assert_string_equal(str_at(v, "error.type"), "invalid_request_error");
        assert_string_equal(str_at(v, "error.param"), params[i]);
        assert_non_null(strstr(str_at(v, "error.message"), "too large to compile within 1e-09 s of CPU time (the limit)"));
        json_decref(v);
        http_free(&r);
    }
    send_expecting(port, "/v1/chat/completions",
                   "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"grammar\":\"root ::= [a-z]+\"}", 200);
    free(chain);
    free(schema);
    wait_released();
    em_server_stop(s);
}

/* A client that hangs up while its grammar compiles stops the compilation (counted in /metrics,
 * and the request never reaches the engine). */
static void test_hang_up_stops_compilation(void **state) {
    (void)state;
    em_server *s = start(600);
    int port = em_server_port(s);
    int submitted = atomic_load(&fake_submitted);
    char *body = wide_schema_request(20000);
    int fd = connect_to(port);
    send_request(fd, "POST", "/v1/chat/completions", NULL, body);
    usleep(100000);
    close(fd);
    for (int i = 0; i < 1000 && metric(port, "ember_grammar_compiles_stopped_total") == 0; i++) usleep(10000);
    assert_int_equal(metric(port, "ember_grammar_compiles_stopped_total"), 1);
    assert_int_equal(metric(port, "ember_grammar_compiles_total"), 0);
    assert_int_equal(metric(port, "ember_grammar_cache_entries"), 0);
    assert_int_equal(atomic_load(&fake_submitted), submitted);
    free(body);
    em_server_stop(s);
}

static double seconds_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

typedef struct pending {
    int port;
    const char *body;
    int fd;
} pending;

static void *send_and_wait(void *arg) {
    pending *p = arg;
    send_request(p->fd, "POST", "/v1/chat/completions", NULL, p->body);
    char chunk[4096];
    while (recv(p->fd, chunk, sizeof chunk, 0) > 0) continue; /* whatever the stopping server answers */
    return NULL;
}

/* Stopping the server (what SIGTERM does) while a grammar compiles stops the compilation: the stop
 * takes a fraction of what the compilation alone takes. */
static void test_stop_during_compilation(void **state) {
    (void)state;
    char *body = wide_schema_request(20000);
    /* How long the compilation alone takes here (the request's schema, converted and compiled). */
    json_t *request = json_loads(body, 0, NULL);
    char *schema = json_dumps(json_object_get(json_object_get(json_object_get(request, "response_format"), "json_schema"), "schema"),
                              JSON_COMPACT);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char *gbnf;
    assert_null(em_grammar_cache_schema(NULL, schema, strlen(schema), NULL, &gbnf));
    em_grammar *g;
    assert_null(em_grammar_cache_compile(NULL, gbnf, strlen(gbnf), NULL, &g));
    const double alone = seconds_since(&t0);
    em_grammar_free(g);
    free(gbnf);
    free(schema);
    json_decref(request);

    em_server *s = start(600);
    pending p = {.port = em_server_port(s), .body = body, .fd = connect_to(em_server_port(s))};
    pthread_t client;
    assert_int_equal(pthread_create(&client, NULL, send_and_wait, &p), 0);
    usleep((useconds_t)(alone * 1e6 / 5)); /* well into the compilation */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    em_server_stop(s);
    const double stopping = seconds_since(&t0);
    assert_int_equal(pthread_join(client, NULL), 0);
    close(p.fd);
    if (stopping > alone / 2) fail_msg("the stop took %.3f s; the compilation alone takes %.3f s", stopping, alone);
    free(body);
}

/* A grammar that turns out too ambiguous partway through the answer (the engine's invalid_request)
 * is the client's error: a 400 naming the grammar's field, in each API's format; in a stream, what
 * was generated and then an error event of the same kind. */
static void test_ambiguous_midway(void **state) {
    (void)state;
    em_server *s = start(0);
    int port = em_server_port(s);
    const char *chat = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"ambiguous\"}],\"grammar\":\"root ::= [a-zA-Z]+\"";
    char body[512];
    snprintf(body, sizeof body, "%s}", chat);
    http_result r = http(port, "POST", "/v1/chat/completions", NULL, body);
    assert_int_equal(r.status, 400);
    json_t *v = body_json(&r);
    assert_string_equal(str_at(v, "error.type"), "invalid_request_error");
    assert_string_equal(str_at(v, "error.code"), "grammar_too_ambiguous");
    assert_string_equal(str_at(v, "error.param"), "grammar");
    assert_non_null(strstr(str_at(v, "error.message"), "after 3 bytes: grammar: the grammar is too ambiguous to follow"));
    json_decref(v);
    http_free(&r);

    snprintf(body, sizeof body, "%s,\"stream\":true}", chat);
    r = http(port, "POST", "/v1/chat/completions", NULL, body);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"content\":\"H\""));
    const char *event = strstr(r.body, "data: {\"error\":");
    assert_non_null(event);
    assert_non_null(strstr(event, "\"type\":\"invalid_request_error\""));
    assert_non_null(strstr(event, "\"code\":\"grammar_too_ambiguous\""));
    assert_null(strstr(r.body, "server_error"));
    http_free(&r);

    r = http(port, "POST", "/v1/messages", NULL,
             "{\"model\":\"m\",\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"ambiguous\"}],"
             "\"tool_choice\":{\"type\":\"any\"},\"tools\":[{\"name\":\"t\",\"input_schema\":{\"type\":\"object\"}}]}");
    assert_int_equal(r.status, 400);
    v = body_json(&r);
    assert_string_equal(str_at(v, "type"), "error");
    assert_string_equal(str_at(v, "error.type"), "invalid_request_error");
    assert_non_null(strstr(str_at(v, "error.message"), "'tools': the answer could not go on inside the grammar"));
    json_decref(v);
    http_free(&r);
    r = http(port, "GET", "/metrics", NULL, NULL);
    assert_non_null(strstr(r.body, "ember_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1\n"));
    assert_null(strstr(r.body, "status=\"500\""));
    http_free(&r);
    wait_released();
    em_server_stop(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repeated_grammars_compiled_once), cmocka_unit_test(test_compile_time_limit),
        cmocka_unit_test(test_hang_up_stops_compilation),       cmocka_unit_test(test_stop_during_compilation),
        cmocka_unit_test(test_ambiguous_midway),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
