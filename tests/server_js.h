/* The official clients' scripts of tests/js (run by tests/js/run.sh, which installs the pinned npm
 * packages into the build directory) against a server on a fake engine of server_fake.h; include
 * after cmocka.h and server_fake.h. */
#ifndef EMBER_TESTS_SERVER_JS_H
#define EMBER_TESTS_SERVER_JS_H

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "server/server.h"

/* Serves ENGINE with the key sk-fake, runs SCRIPTS (names without .mjs, space-separated; "" for
 * run.sh's defaults) and asserts that they passed and that every request was released. */
static inline void run_client_scripts(em_server_engine *engine, const char *scripts) {
    em_server_options options = {.host = "127.0.0.1", .port = 0, .api_key = "sk-fake", .max_body = 65536};
    em_server *s = NULL;
    em_err e = em_server_start(&options, engine, &s);
    if (e) fail_msg("%s", em_err_message(e));
    char command[2048];
    snprintf(command, sizeof command, "bash '%s/tests/js/run.sh' http://127.0.0.1:%d fake-model sk-fake '%s/js' %s",
             EM_SOURCE_DIR, em_server_port(s), EM_BINARY_DIR, scripts);
    int rc = system(command);
    em_server_stop(s);
    assert_int_equal(atomic_load(&fake_released), atomic_load(&fake_submitted));
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 0);
}

#endif
