/* A server per test on the fake engine of server_fake.h, for the tests that talk to it over
 * sockets (test_server_http.c, test_server_apis.c); include after cmocka.h and server_fake.h. */
#ifndef EMBER_TESTS_SERVER_SOCKETS_H
#define EMBER_TESTS_SERVER_SOCKETS_H

#include <stdatomic.h>
#include <unistd.h>

#include "server/server.h"

/* The engine the running server was given (a test may change it before starting another). */
static em_server_engine engine;

static inline em_server *start(const char *api_key, size_t max_body) {
    engine = fake_engine();
    em_server_options options = {.host = "127.0.0.1", .port = 0, .api_key = api_key, .max_body = max_body};
    em_server *s = NULL;
    em_err e = em_server_start(&options, &engine, &s);
    if (e) fail_msg("%s", em_err_message(e));
    assert_true(em_server_port(s) > 0);
    return s;
}

/* Waits until every submitted request was released (connection threads finish after replying). */
static inline void wait_released(void) {
    for (int i = 0; i < 300 && atomic_load(&fake_released) != atomic_load(&fake_submitted); i++) usleep(10000);
    assert_int_equal(atomic_load(&fake_released), atomic_load(&fake_submitted));
}

#define CHAT_HI "{\"model\":\"fake-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define PROMPT_HI_TOKENS 18 /* "user:hi\nassistant:" in the fake's chat format */

#endif
