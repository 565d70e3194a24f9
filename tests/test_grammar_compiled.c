/* Compiled grammars shared by content (grammar.h's em_grammar_cache) and watched compilation
 * (em_grammar_watch): a text compiled once however often and however concurrently it is asked
 * for, refusals kept, the least recently used dropped past the bounds, a watch that stops the
 * work from inside the compiler's and the converter's loops (and a stopped compilation kept
 * nowhere), a CPU-time limit refused with an error naming it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "grammar/grammar.h"

/* ---- Inputs ---- */

/* A GBNF of n rules, each calling the next (the shape of the hostile 100,000-rule request). */
static char *rule_chain(size_t n) {
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "root ::= r0\n"));
    for (size_t i = 0; i < n; i++) assert_true(em_buf_printf(&b, "r%zu ::= \"a\" r%zu | \"b\"\n", i, i + 1));
    assert_true(em_buf_printf(&b, "r%zu ::= \"c\"\n", n));
    return b.data;
}

/* A schema of n optional string properties. */
static char *wide_schema(size_t n) {
    em_buf b = {0};
    assert_true(em_buf_printf(&b, "{\"type\":\"object\",\"properties\":{"));
    for (size_t i = 0; i < n; i++) assert_true(em_buf_printf(&b, "%s\"p%zu\":{\"type\":\"string\"}", i ? "," : "", i));
    assert_true(em_buf_printf(&b, "}}"));
    return b.data;
}

static em_grammar_cache_stats stats_of(em_grammar_cache *c) {
    em_grammar_cache_stats s;
    em_grammar_cache_stats_get(c, &s);
    return s;
}

/* Whether the grammar takes the whole text. */
static bool takes(const em_grammar *g, const char *text) {
    em_grammar_state *s;
    assert_null(em_grammar_state_new(g, &s));
    bool ok = em_grammar_accept_bytes(s, text, strlen(text)) && em_grammar_complete(s);
    em_grammar_state_free(s);
    return ok;
}

/* ---- Sharing ---- */

/* The same text compiled three times is compiled once: the same grammar each time, and one that
 * takes what a fresh compilation takes. */
static void test_same_text_compiled_once(void **state) {
    (void)state;
    em_grammar_cache *c;
    assert_null(em_grammar_cache_new(16, 64 << 20, &c));
    const char *gbnf = "root ::= (\"yes\" | \"no\") \"!\"*\n";
    em_grammar *g[3];
    for (int i = 0; i < 3; i++) assert_null(em_grammar_cache_compile(c, gbnf, strlen(gbnf), NULL, &g[i]));
    assert_ptr_equal(g[0], g[1]);
    assert_ptr_equal(g[0], g[2]);
    em_grammar_cache_stats s = stats_of(c);
    assert_int_equal(s.compiled, 1);
    assert_int_equal(s.reused, 2);
    assert_int_equal(s.entries, 1);
    assert_true(s.bytes > strlen(gbnf));
    assert_true(takes(g[2], "no!!"));
    assert_false(takes(g[2], "maybe"));

    /* Another text is another grammar; a schema and its GBNF are kept apart from GBNF texts. */
    const char *other = "root ::= \"yes\"\n";
    em_grammar *h;
    assert_null(em_grammar_cache_compile(c, other, strlen(other), NULL, &h));
    assert_ptr_not_equal(h, g[0]);
    const char *schema = "{\"enum\":[\"red\",\"green\"]}";
    char *converted[2], *direct;
    for (int i = 0; i < 2; i++) assert_null(em_grammar_cache_schema(c, schema, strlen(schema), NULL, &converted[i]));
    assert_null(em_grammar_from_json_schema(schema, strlen(schema), &direct));
    assert_string_equal(converted[0], direct);
    assert_string_equal(converted[1], direct);
    s = stats_of(c);
    assert_int_equal(s.compiled, 3);
    assert_int_equal(s.reused, 3);
    assert_int_equal(s.entries, 3);

    /* The grammars outlive the cache (each holder has its reference). */
    em_grammar_cache_free(c);
    assert_true(takes(g[0], "yes!"));
    for (int i = 0; i < 3; i++) em_grammar_free(g[i]);
    em_grammar_free(h);
    for (int i = 0; i < 2; i++) free(converted[i]);
    free(direct);
}

/* A refusal is kept: the second request for a bad text gets the same error without compiling. */
static void test_refusals_kept(void **state) {
    (void)state;
    em_grammar_cache *c;
    assert_null(em_grammar_cache_new(16, 64 << 20, &c));
    const char *bad = "root ::= [\n";
    char *first = NULL;
    for (int i = 0; i < 2; i++) {
        em_grammar *g = (em_grammar *)1;
        em_err e = em_grammar_cache_compile(c, bad, strlen(bad), NULL, &g);
        assert_non_null(e);
        assert_null(g);
        assert_int_equal(em_err_code_of(e), EM_ERR_INVALID);
        assert_non_null(strstr(em_err_message(e), "unterminated character class"));
        if (!first) first = strdup(em_err_message(e));
        else assert_string_equal(em_err_message(e), first);
        em_err_free(e);
    }
    const char *bad_schema = "{\"type\":\"string\",\"format\":\"ipv4\"}";
    char *gbnf = NULL;
    for (int i = 0; i < 2; i++) {
        em_err e = em_grammar_cache_schema(c, bad_schema, strlen(bad_schema), NULL, &gbnf);
        assert_non_null(e);
        assert_null(gbnf);
        assert_non_null(strstr(em_err_message(e), "ipv4"));
        em_err_free(e);
    }
    em_grammar_cache_stats s = stats_of(c);
    assert_int_equal(s.compiled, 2);
    assert_int_equal(s.reused, 2);
    free(first);
    em_grammar_cache_free(c);
}

/* Past max_entries the least recently used text goes (and is compiled again when asked for);
 * an answer larger than a quarter of max_bytes is handed out and not kept. */
static void test_least_recently_used_go(void **state) {
    (void)state;
    em_grammar_cache *c;
    assert_null(em_grammar_cache_new(2, 64 << 20, &c));
    const char *a = "root ::= \"a\"\n", *b = "root ::= \"b\"\n", *d = "root ::= \"d\"\n";
    em_grammar *g;
    const char *order[] = {a, b, a, d, a, b};
    /* a, b compiled; a reused; d compiled, b (least recently used) dropped; a reused; b compiled */
    const uint64_t compiled_after[] = {1, 2, 2, 3, 3, 4};
    for (size_t i = 0; i < 6; i++) {
        assert_null(em_grammar_cache_compile(c, order[i], strlen(order[i]), NULL, &g));
        em_grammar_free(g);
        assert_int_equal(stats_of(c).compiled, compiled_after[i]);
        assert_true(stats_of(c).entries <= 2);
    }
    em_grammar_cache_free(c);

    char *big = rule_chain(2000);
    assert_null(em_grammar_cache_new(16, 4 * strlen(big) - 1, &c)); /* the key alone is over a quarter */
    for (int i = 0; i < 2; i++) {
        assert_null(em_grammar_cache_compile(c, big, strlen(big), NULL, &g));
        assert_true(takes(g, "aab"));
        em_grammar_free(g);
    }
    assert_int_equal(stats_of(c).compiled, 2);
    assert_int_equal(stats_of(c).entries, 0);
    assert_int_equal(stats_of(c).bytes, 0);
    em_grammar_cache_free(c);
    free(big);
}

typedef struct racer {
    em_grammar_cache *cache;
    const char *text;
    em_grammar *got;
    em_err err;
} racer;

static void *race(void *arg) {
    racer *r = arg;
    r->err = em_grammar_cache_compile(r->cache, r->text, strlen(r->text), NULL, &r->got);
    return NULL;
}

/* Eight threads asking for one text at once: compiled once, the same grammar for all. */
static void test_concurrent_requests_compile_once(void **state) {
    (void)state;
    em_grammar_cache *c;
    assert_null(em_grammar_cache_new(16, 256 << 20, &c));
    char *text = rule_chain(50000);
    racer racers[8];
    pthread_t threads[8];
    for (int i = 0; i < 8; i++) {
        racers[i] = (racer){.cache = c, .text = text};
        assert_int_equal(pthread_create(&threads[i], NULL, race, &racers[i]), 0);
    }
    for (int i = 0; i < 8; i++) assert_int_equal(pthread_join(threads[i], NULL), 0);
    for (int i = 0; i < 8; i++) {
        assert_null(racers[i].err);
        assert_ptr_equal(racers[i].got, racers[0].got);
    }
    assert_int_equal(stats_of(c).compiled, 1);
    assert_int_equal(stats_of(c).reused, 7);
    for (int i = 0; i < 8; i++) em_grammar_free(racers[i].got);
    em_grammar_cache_free(c);
    free(text);
}

/* ---- Watching ---- */

/* A watch that counts how often it is asked and says stop from the `stop_at`-th time on (0: never). */
typedef struct counting_watch {
    atomic_int asked;
    int stop_at;
} counting_watch;

static bool count_and_stop(void *self) {
    counting_watch *w = self;
    int n = atomic_fetch_add(&w->asked, 1) + 1;
    return w->stop_at && n >= w->stop_at;
}

/* The compiler and the schema converter ask their watch as they go (every few thousand units of
 * work, so a large text asks many times), and stop when it says so: the error says why, and the
 * work is not kept, so the next request for the text compiles it. */
static void test_watch_stops_compiling(void **state) {
    (void)state;
    char *chain = rule_chain(100000), *schema = wide_schema(5000);
    em_grammar_cache *c;
    assert_null(em_grammar_cache_new(16, 256 << 20, &c));

    counting_watch counter = {.stop_at = 0};
    em_grammar_watch watch;
    em_grammar_watch_init(&watch, 0, count_and_stop, &counter);
    em_grammar *g;
    assert_null(em_grammar_cache_compile(NULL, chain, strlen(chain), &watch, &g));
    /* 100,000 rules of two alternatives: well over 400,000 units of work */
    assert_true(atomic_load(&counter.asked) >= 100);
    em_grammar_free(g);
    atomic_store(&counter.asked, 0);
    char *gbnf;
    assert_null(em_grammar_cache_schema(NULL, schema, strlen(schema), &watch, &gbnf));
    assert_true(atomic_load(&counter.asked) >= 2);
    free(gbnf);

    counting_watch stopper = {.stop_at = 2};
    em_grammar_watch_init(&watch, 0, count_and_stop, &stopper);
    em_err e = em_grammar_cache_compile(c, chain, strlen(chain), &watch, &g);
    assert_non_null(e);
    assert_int_equal(em_err_code_of(e), EM_ERR_IO);
    assert_non_null(strstr(em_err_message(e), "stopped"));
    assert_int_equal(atomic_load(&stopper.asked), 2); /* it stopped when told, not at the end */
    em_err_free(e);
    atomic_store(&stopper.asked, 0);
    e = em_grammar_cache_schema(c, schema, strlen(schema), &watch, &gbnf);
    assert_non_null(e);
    assert_int_equal(em_err_code_of(e), EM_ERR_IO);
    assert_int_equal(atomic_load(&stopper.asked), 2);
    em_err_free(e);
    em_grammar_cache_stats s = stats_of(c);
    assert_int_equal(s.stopped, 2);
    assert_int_equal(s.compiled, 0);
    assert_int_equal(s.entries, 0);

    assert_null(em_grammar_cache_compile(c, chain, strlen(chain), NULL, &g)); /* compiled now, in full */
    assert_true(takes(g, "aaab"));
    em_grammar_free(g);
    assert_int_equal(stats_of(c).compiled, 1);
    em_grammar_cache_free(c);
    free(chain);
    free(schema);
}

/* Work past the watch's CPU time is refused with an error naming the limit, and the refusal is
 * kept like any other. */
static void test_cpu_time_limit(void **state) {
    (void)state;
    char *chain = rule_chain(20000), *schema = wide_schema(2000);
    em_grammar_cache *c;
    assert_null(em_grammar_cache_new(16, 256 << 20, &c));
    em_grammar_watch watch;
    em_grammar_watch_init(&watch, 1e-9, NULL, NULL);
    em_grammar *g;
    em_err e = em_grammar_cache_compile(c, chain, strlen(chain), &watch, &g);
    assert_non_null(e);
    assert_int_equal(em_err_code_of(e), EM_ERR_RANGE);
    assert_non_null(strstr(em_err_message(e), "too large to compile within 1e-09 s of CPU time (the limit)"));
    em_err_free(e);
    char *gbnf;
    e = em_grammar_cache_schema(c, schema, strlen(schema), &watch, &gbnf);
    assert_non_null(e);
    assert_int_equal(em_err_code_of(e), EM_ERR_RANGE);
    em_err_free(e);
    e = em_grammar_cache_compile(c, chain, strlen(chain), NULL, &g);
    assert_non_null(e); /* the kept refusal */
    assert_int_equal(em_err_code_of(e), EM_ERR_RANGE);
    em_err_free(e);
    assert_int_equal(stats_of(c).compiled, 2);
    assert_int_equal(stats_of(c).reused, 1);

    /* A limit of seconds takes the same texts. */
    em_grammar_watch_init(&watch, 60, NULL, NULL);
    assert_null(em_grammar_cache_compile(NULL, chain, strlen(chain), &watch, &g));
    em_grammar_free(g);
    em_grammar_cache_free(c);
    free(chain);
    free(schema);
}

/* A watch that, asked the first time, says so and then waits until released; it never says stop. */
typedef struct holding_watch {
    atomic_bool asked, release;
} holding_watch;

static bool hold(void *self) {
    holding_watch *w = self;
    atomic_store(&w->asked, true);
    while (!atomic_load(&w->release)) usleep(1000);
    return false;
}

static bool always_stop(void *self) {
    (void)self;
    return true;
}

typedef struct holder {
    em_grammar_cache *cache;
    const char *text;
    holding_watch watch_state;
    em_grammar_watch watch;
    em_grammar *got;
    em_err err;
} holder;

static void *compile_held(void *arg) {
    holder *h = arg;
    h->err = em_grammar_cache_compile(h->cache, h->text, strlen(h->text), &h->watch, &h->got);
    return NULL;
}

/* A request that waits for another's compilation of the same text gives up when its own watch
 * says stop (its client hung up), without waiting for the compilation to end; the compilation
 * goes on for the one that started it. */
static void test_waiter_stops_on_its_own_watch(void **state) {
    (void)state;
    char *chain = rule_chain(20000);
    em_grammar_cache *c;
    assert_null(em_grammar_cache_new(16, 256 << 20, &c));
    holder h = {.cache = c, .text = chain};
    em_grammar_watch_init(&h.watch, 0, hold, &h.watch_state);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, compile_held, &h), 0);
    while (!atomic_load(&h.watch_state.asked)) usleep(1000); /* the first thread is compiling */
    em_grammar_watch stop_now;
    em_grammar_watch_init(&stop_now, 0, always_stop, NULL);
    em_grammar *g = NULL;
    em_err e = em_grammar_cache_compile(c, chain, strlen(chain), &stop_now, &g);
    assert_non_null(e);
    assert_int_equal(em_err_code_of(e), EM_ERR_IO);
    assert_null(g);
    em_err_free(e);
    atomic_store(&h.watch_state.release, true);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_null(h.err);
    assert_true(takes(h.got, "ab"));
    em_grammar_free(h.got);
    assert_int_equal(stats_of(c).compiled, 1);
    em_grammar_cache_free(c);
    free(chain);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_text_compiled_once),
        cmocka_unit_test(test_refusals_kept),
        cmocka_unit_test(test_least_recently_used_go),
        cmocka_unit_test(test_concurrent_requests_compile_once),
        cmocka_unit_test(test_watch_stops_compiling),
        cmocka_unit_test(test_cpu_time_limit),
        cmocka_unit_test(test_waiter_stops_on_its_own_watch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
