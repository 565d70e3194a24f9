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
#include "server_js.h"

static void test_official_clients(void **state) {
    (void)state;
    em_server_engine engine = fake_engine();
    run_client_scripts(&engine, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_official_clients)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
