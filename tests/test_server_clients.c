/* The official OpenAI and Anthropic npm clients (tests/js, pinned versions installed by npm into
 * the build folder) against the HTTP server running on the fake engine of server_fake.h: wire
 * compatibility with clients no one here wrote, independent of the engine. The same scripts run
 * against a real `ember serve` in tests/cli/server_clients.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "server/server.h"

#include "server_fake.h"

static void test_official_clients(void **state) {
    (void)state;
    em_server_engine engine = fake_engine();
    em_server_options options = {.host = "127.0.0.1", .port = 0, .api_key = "sk-fake", .max_body = 65536};
    em_server *s = NULL;
    em_err e = em_server_start(&options, &engine, &s);
    if (e) fail_msg("%s", em_err_message(e));
    char command[2048];
    snprintf(command, sizeof command, "bash '%s/tests/js/run.sh' http://127.0.0.1:%d fake-model sk-fake '%s/js'",
             EM_SOURCE_DIR, em_server_port(s), EM_BINARY_DIR);
    int rc = system(command);
    em_server_stop(s);
    assert_int_equal(atomic_load(&fake_released), atomic_load(&fake_submitted));
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_official_clients)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
