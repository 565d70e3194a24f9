/* The engine with a hybrid model (tiny-qwen35: Gated DeltaNet layers with a recurrent state per
 * sequence, and a gated attention layer): requests batched together get the tokens they get alone,
 * a conversation's next turn resumes from the state snapshot of the last one (and gives the tokens
 * of a run without any cache), and preemption under memory pressure changes no output.
 * test_engine_hybrid_moe.c runs the same tests on another preset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


#ifndef ENGINE_TEST_PRESET
#define ENGINE_TEST_PRESET "tiny-qwen35"
#endif
#define ENGINE_TEST_DIR EM_BINARY_DIR "/test_engine_hybrid_files"
#define MAX_OUT 64
#include "engine_fixture.h"

typedef struct result {
    int32_t tokens[MAX_OUT];
    uint32_t n;
    ember_timings timings;
} result;

static void collect(ember_request *r, result *res) {
    memset(res, 0, sizeof *res);
    ember_output out;
    do {
        assert_true(ember_request_next(r, &out, 300000));
        for (size_t i = 0; i < out.n_tokens; i++) res->tokens[res->n++] = out.tokens[i].token;
    } while (out.finish == EMBER_FINISH_NONE);
    if (out.finish == EMBER_FINISH_ERROR) fail_msg("request failed: %s", out.error);
    ember_request_timings(r, &res->timings);
    ember_request_release(r);
}

static void test_greedy_matches_backend(void **state) {
    (void)state;
    int32_t prompt[37], want[12];
    make_prompt(prompt, 37, 1);
    reference_greedy(prompt, 37, 12, want);
    ember_engine *e = new_engine(0, 0);
    result res;
    collect(submit_ids(e, prompt, 37, 12, 0.0f, 0), &res);
    assert_int_equal(res.n, 12);
    assert_memory_equal(res.tokens, want, sizeof want);
    ember_engine_destroy(e);
}

/* Eight requests at once, greedy and seeded, each in its own state slot, each equal to its run alone. */
static void test_batched_equals_solo(void **state) {
    (void)state;
    enum { N = 8 };
    int32_t prompts[N][50];
    uint32_t lengths[N];
    result solo[N], together[N];
    for (int i = 0; i < N; i++) {
        lengths[i] = 5 + 6 * (uint32_t)i;
        make_prompt(prompts[i], lengths[i], 100 + (uint64_t)i);
    }
    ember_engine *e = new_engine(0, 0);
    for (int i = 0; i < N; i++)
        collect(submit_ids(e, prompts[i], lengths[i], 10 + i, i % 2 ? 0.9f : 0.0f, 7 + (uint64_t)i), &solo[i]);
    ember_engine_destroy(e);
    e = new_engine(0, 0);
    ember_request *r[N];
    for (int i = 0; i < N; i++) r[i] = submit_ids(e, prompts[i], lengths[i], 10 + i, i % 2 ? 0.9f : 0.0f, 7 + (uint64_t)i);
    for (int i = 0; i < N; i++) collect(r[i], &together[i]);
    for (int i = 0; i < N; i++) {
        assert_int_equal(together[i].n, 10 + i);
        assert_memory_equal(together[i].tokens, solo[i].tokens, solo[i].n * sizeof(int32_t));
    }
    ember_stats stats;
    ember_engine_stats(e, &stats);
    assert_true(stats.steps < (uint64_t)N * 10); /* requests really shared steps */
    ember_engine_destroy(e);
}

/* A → A' (A's prompt + A's answer + 40 tokens) → B → A'': each next turn resumes from the snapshot
 * taken where the previous turn retired (all its tokens but the last sampled one), and gives the
 * tokens of a run without any cache; B shares nothing. A's first prompt with another ending resumes
 * from the snapshot taken where that prompt had been computed. */
static void test_conversation_resumes(void **state) {
    (void)state;
    static int32_t a[400], b[200];
    make_prompt(a, 400, 11);
    make_prompt(b, 150, 12);
    ember_engine *e = new_engine(0, 0);
    result r1, r2, r3, r4, fresh;
    collect(submit_ids(e, a, 120, 8, 0.0f, 0), &r1);
    assert_int_equal(r1.timings.cached_tokens, 0);
    memcpy(a + 120, r1.tokens, 8 * sizeof(int32_t));
    collect(submit_ids(e, a, 168, 8, 0.0f, 0), &r2);
    assert_int_equal(r2.timings.cached_tokens, 120 + 8 - 1);
    collect(submit_ids(e, b, 150, 8, 0.0f, 0), &r3);
    assert_int_equal(r3.timings.cached_tokens, 0);
    memcpy(a + 168, r2.tokens, 8 * sizeof(int32_t));
    collect(submit_ids(e, a, 216, 8, 0.0f, 0), &r4);
    assert_int_equal(r4.timings.cached_tokens, 168 + 8 - 1);
    /* A's first prompt again, with another ending: the snapshot at A's prompt end (120) serves it */
    int32_t again[130];
    memcpy(again, a, 120 * sizeof(int32_t));
    make_prompt(again + 120, 10, 13);
    result r5, fresh5;
    collect(submit_ids(e, again, 130, 8, 0.0f, 0), &r5);
    assert_int_equal(r5.timings.cached_tokens, 120);
    ember_engine_destroy(e);

    e = new_engine(0, 0);
    collect(submit_ids(e, a, 216, 8, 0.0f, 0), &fresh);
    assert_int_equal(fresh.timings.cached_tokens, 0);
    assert_memory_equal(fresh.tokens, r4.tokens, 8 * sizeof(int32_t));
    ember_engine_destroy(e);
    e = new_engine(0, 0);
    collect(submit_ids(e, again, 130, 8, 0.0f, 0), &fresh5);
    assert_memory_equal(fresh5.tokens, r5.tokens, 8 * sizeof(int32_t));
    ember_engine_destroy(e);
}

/* A KV pool of 20 blocks (320 positions) for 6 requests of ~100 tokens: they wait or are preempted
 * (a preempted request resumes from the snapshot of its state taken as it left), and still produce
 * what they produce alone. */
static void test_memory_pressure(void **state) {
    (void)state;
    enum { N = 6 };
    int32_t prompts[N][100];
    result solo[N], squeezed[N];
    for (int i = 0; i < N; i++) make_prompt(prompts[i], 70, 300 + (uint64_t)i);
    ember_engine *e = new_engine(0, 0);
    for (int i = 0; i < N; i++) collect(submit_ids(e, prompts[i], 70, 30, 0.0f, 0), &solo[i]);
    ember_engine_destroy(e);
    em_model *m;
    assert_null(em_model_load(MODEL, &m));
    const uint64_t block_bytes = em_backend_kv_bytes_per_token(m) * 16;
    em_model_free(m);
    e = new_engine(20 * block_bytes, 0);
    ember_request *r[N];
    for (int i = 0; i < N; i++) r[i] = submit_ids(e, prompts[i], 70, 30, 0.0f, 0);
    for (int i = 0; i < N; i++) collect(r[i], &squeezed[i]);
    for (int i = 0; i < N; i++) assert_memory_equal(squeezed[i].tokens, solo[i].tokens, 30 * sizeof(int32_t));
    ember_stats stats;
    ember_engine_stats(e, &stats);
    assert_int_equal(stats.kv_blocks_total, 20);
    assert_int_equal(stats.requests_finished, N);
    assert_true(stats.preemptions > 0); /* and resumed from their snapshots */
    ember_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_matches_backend),
        cmocka_unit_test(test_batched_equals_solo),
        cmocka_unit_test(test_conversation_resumes),
        cmocka_unit_test(test_memory_pressure),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
