/* gpt-oss's harmony format through the official OpenAI and Anthropic npm clients (tests/js, pinned
 * versions installed by npm into the build folder), on the HTTP server over the fake engine of
 * server_fake.h told that its template writes harmony: recorded answers (reasoning then a call,
 * reasoning then a final answer) must reach the clients' tool flows as reasoning, tool calls and
 * text, streamed and whole (tests/js/harmony_recorded.mjs). tests/cli/harmony.sh runs a real model. */
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

static void test_harmony_clients(void **state) {
    (void)state;
    em_server_engine engine = fake_engine();
    engine.tool_format = EM_TOOL_FORMAT_HARMONY;
    engine.ctx_tokens = 4096;
    em_server_options options = {.host = "127.0.0.1", .port = 0, .api_key = "sk-fake", .max_body = 65536};
    em_server *s = NULL;
    em_err e = em_server_start(&options, &engine, &s);
    if (e) fail_msg("%s", em_err_message(e));
    char command[2048];
    snprintf(command, sizeof command,
             "bash '%s/tests/js/run.sh' http://127.0.0.1:%d fake-model sk-fake '%s/js' harmony_recorded", EM_SOURCE_DIR,
             em_server_port(s), EM_BINARY_DIR);
    int rc = system(command);
    em_server_stop(s);
    assert_int_equal(atomic_load(&fake_released), atomic_load(&fake_submitted));
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_harmony_clients)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
