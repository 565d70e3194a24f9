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
#include "server_js.h"

static void test_harmony_clients(void **state) {
    (void)state;
    em_server_engine engine = fake_engine();
    engine.tool_format = EM_TOOL_FORMAT_HARMONY;
    engine.ctx_tokens = 4096;
    run_client_scripts(&engine, "harmony_recorded");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_harmony_clients)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
