/* The engine end to end on a tiny model (CPU): continuous batching gives every request the tokens
 * it would get alone, the prefix cache reuses exactly the tokens it should, memory pressure
 * makes requests wait or be preempted but never changes their output, and bad requests fail
 * cleanly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/engine.h"

#define ENGINE_TEST_PRESET "tiny-qwen3"
#define ENGINE_TEST_DIR EM_BINARY_DIR "/test_engine_files"
#define MAX_OUT 64
#include "engine_fixture.h"

typedef struct result {
    int32_t tokens[MAX_OUT];
    uint32_t n;
    ember_finish_reason finish;
    char text[4096];
    ember_timings timings;
} result;

/* Reads a request until it ends; returns how it ended (output discarded). */
static ember_finish_reason wait_finish(ember_request *r) {
    ember_output out;
    do assert_true(ember_request_next(r, &out, 20000));
    while (out.finish == EMBER_FINISH_NONE);
    return out.finish;
}

static void collect(ember_request *r, result *res) {
    memset(res, 0, sizeof *res);
    ember_output out;
    size_t text_len = 0;
    do {
        assert_true(ember_request_next(r, &out, 300000));
        for (size_t i = 0; i < out.n_tokens; i++) res->tokens[res->n++] = out.tokens[i].token;
        assert_true(text_len + out.text_len < sizeof res->text);
        memcpy(res->text + text_len, out.text, out.text_len);
        text_len += out.text_len;
    } while (out.finish == EMBER_FINISH_NONE);
    res->finish = out.finish;
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
    assert_int_equal(res.finish, EMBER_FINISH_LENGTH);
    assert_int_equal(res.timings.prompt_tokens, 37);
    assert_int_equal(res.timings.generated_tokens, 12);
    assert_int_equal(res.timings.cached_tokens, 0);
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    assert_int_equal(info.ctx_tokens, 512);
    assert_int_equal(info.n_vocab, n_vocab);
    assert_int_equal(info.block_tokens, 16);
    assert_int_equal(info.kv_blocks, 4 * 512 / 16); /* default budget: four full-length sequences */
    assert_string_equal(info.device, "cpu");
    assert_true(info.weights_in_memory); /* automatic: the CPU runs it, and it is small */
    ember_engine_destroy(e);
}

/* Weights mapped from the file or read into memory: the same tokens, and the engine says which. */
static void test_weights_mapped_or_in_memory(void **state) {
    (void)state;
    int32_t prompt[23], want[10];
    make_prompt(prompt, 23, 5);
    reference_greedy(prompt, 23, 10, want); /* em_model_load: mapped */
    const int modes[] = {EMBER_WEIGHTS_MAPPED, EMBER_WEIGHTS_IN_MEMORY};
    for (int i = 0; i < 2; i++) {
        ember_options o;
        test_options(&o);
        o.weights_memory = modes[i];
        ember_engine *e;
        ember_error *err = ember_engine_create(&o, &e);
        if (err) fail_msg("engine: %s", ember_error_message(err));
        ember_engine_info info;
        ember_engine_get_info(e, &info);
        assert_int_equal(info.weights_in_memory, modes[i] == EMBER_WEIGHTS_IN_MEMORY);
        result res;
        collect(submit_ids(e, prompt, 23, 10, 0.0f, 0), &res);
        assert_memory_equal(res.tokens, want, sizeof want);
        ember_engine_destroy(e);
    }
    /* the automatic choice: at most half of MemAvailable, and nothing without that line */
    assert_true(em_weights_fit(512 * 1024, "MemTotal: 4096 kB\nMemFree: 10 kB\nMemAvailable: 1024 kB\n"));
    assert_false(em_weights_fit(512 * 1024 + 1, "MemTotal: 4096 kB\nMemFree: 10 kB\nMemAvailable: 1024 kB\n"));
    assert_true(em_weights_fit(1, "MemAvailable:   23631000 kB\n"));
    assert_false(em_weights_fit(1, "MemTotal: 4096 kB\nMemFree: 4000 kB\n"));
    assert_false(em_weights_fit(1, ""));
    assert_false(em_weights_fit(1, NULL));
    assert_false(em_weights_fit(UINT64_MAX, "MemAvailable: 1024 kB\n"));
}

/* Eight requests at once, greedy and seeded, each equal to its run alone. */
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
    e = new_engine(0, 0); /* fresh: no prefix cache from the solo runs */
    ember_request *r[N];
    for (int i = 0; i < N; i++) r[i] = submit_ids(e, prompts[i], lengths[i], 10 + i, i % 2 ? 0.9f : 0.0f, 7 + (uint64_t)i);
    for (int i = 0; i < N; i++) collect(r[i], &together[i]);
    for (int i = 0; i < N; i++) {
        assert_int_equal(together[i].n, 10 + i);
        assert_memory_equal(together[i].tokens, solo[i].tokens, solo[i].n * sizeof(int32_t));
    }
    ember_stats stats;
    ember_engine_stats(e, &stats);
    assert_int_equal(stats.requests_finished, N);
    assert_true(stats.steps < (uint64_t)N * 10); /* requests really shared steps */
    ember_engine_destroy(e);
}

/* A → A' (A's prompt + A's answer + 40 tokens) → B → A'': each continuation reuses every token whose
 * KV exists (all but the last sampled token of the previous turn), and its output equals a run
 * without any cache. */
static void test_prefix_reuse_interleaved(void **state) {
    (void)state;
    static int32_t a[400], b_prompt[200];
    make_prompt(a, 400, 11);
    make_prompt(b_prompt, 150, 12);
    ember_engine *e = new_engine(0, 0);
    result r1, r2, r3, r4, fresh;
    collect(submit_ids(e, a, 120, 8, 0.0f, 0), &r1);
    /* A' = A + its answer + 40 new tokens. */
    memcpy(a + 120, r1.tokens, 8 * sizeof(int32_t));
    collect(submit_ids(e, a, 168, 8, 0.0f, 0), &r2);
    assert_int_equal(r2.timings.cached_tokens, 120 + 8 - 1);
    collect(submit_ids(e, b_prompt, 150, 8, 0.0f, 0), &r3);
    assert_int_equal(r3.timings.cached_tokens, 0);
    memcpy(a + 168, r2.tokens, 8 * sizeof(int32_t));
    collect(submit_ids(e, a, 216, 8, 0.0f, 0), &r4);
    assert_int_equal(r4.timings.cached_tokens, 168 + 8 - 1);
    ember_stats stats;
    ember_engine_stats(e, &stats);
    assert_int_equal(stats.prefix_lookups, 4);
    assert_int_equal(stats.prefix_hits, 2);
    assert_int_equal(stats.cached_tokens, 127 + 175);
    ember_engine_destroy(e);
    e = new_engine(0, 0);
    collect(submit_ids(e, a, 216, 8, 0.0f, 0), &fresh);
    assert_int_equal(fresh.timings.cached_tokens, 0);
    assert_memory_equal(fresh.tokens, r4.tokens, 8 * sizeof(int32_t));
    ember_engine_destroy(e);
}

/* A KV pool of 20 blocks (320 positions) for 6 requests of ~100 tokens each: they must wait or be
 * preempted, and still produce what they produce alone. A request longer than the pool fails. */
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
    uint64_t block_bytes = em_backend_kv_bytes_per_token(m) * 16;
    em_model_free(m);
    e = new_engine(20 * block_bytes, 0);
    ember_request *r[N];
    for (int i = 0; i < N; i++) r[i] = submit_ids(e, prompts[i], 70, 30, 0.0f, 0);
    for (int i = 0; i < N; i++) collect(r[i], &squeezed[i]);
    for (int i = 0; i < N; i++) assert_memory_equal(squeezed[i].tokens, solo[i].tokens, 30 * sizeof(int32_t));
    ember_stats stats;
    ember_engine_stats(e, &stats);
    assert_int_equal(stats.kv_blocks_total, 20);
    assert_true(stats.kv_blocks_used <= 20);
    /* 6 x 100 positions cannot all fit: someone waited or was preempted, and nobody failed. */
    assert_int_equal(stats.requests_finished, N);
    /* The context is capped to what the pool holds (320 positions): a longer prompt is refused at
     * once, and a sequence that reaches the cap ends with "length". */
    static int32_t long_prompt[400];
    make_prompt(long_prompt, 330, 9);
    ember_request_params p;
    ember_request_default(&p);
    p.prompt_ids = long_prompt;
    p.n_prompt_ids = 330;
    ember_request *big;
    ember_error *err = ember_submit(e, &p, &big);
    assert_non_null(err);
    assert_non_null(strstr(ember_error_message(err), "the context holds 320"));
    ember_error_free(err);
    result capped;
    collect(submit_ids(e, long_prompt, 318, 10, 0.0f, 0), &capped);
    assert_int_equal(capped.finish, EMBER_FINISH_LENGTH);
    assert_int_equal(capped.n, 2);
    ember_engine_destroy(e);
}

static void test_cancel_stop_and_bad_requests(void **state) {
    (void)state;
    int32_t prompt[20];
    make_prompt(prompt, 20, 21);
    ember_engine *e = new_engine(0, 0);
    ember_request *r = submit_ids(e, prompt, 20, 500, 0.0f, 0);
    ember_output out;
    assert_true(ember_request_next(r, &out, 20000));
    ember_request_cancel(r);
    assert_int_equal(wait_finish(r), EMBER_FINISH_CANCELLED);
    ember_request_release(r);

    /* A stop string cut from the greedy output ends generation right before it. */
    result plain, stopped;
    collect(submit_ids(e, prompt, 20, 24, 0.0f, 0), &plain);
    size_t len = strlen(plain.text);
    if (len >= 12) {
        char stop[5];
        memcpy(stop, plain.text + len / 2, 4);
        stop[4] = '\0';
        const char *first = strstr(plain.text, stop);
        ember_request_params p;
        ember_request_default(&p);
        p.prompt_ids = prompt;
        p.n_prompt_ids = 20;
        p.max_tokens = 24;
        p.sampling.temperature = 0;
        p.ignore_eos = true;
        const char *stops[] = {stop};
        p.stop = stops;
        p.n_stop = 1;
        assert_null(ember_submit(e, &p, &r));
        collect(r, &stopped);
        assert_int_equal(stopped.finish, EMBER_FINISH_STOP);
        assert_int_equal(strlen(stopped.text), (size_t)(first - plain.text));
        assert_memory_equal(stopped.text, plain.text, strlen(stopped.text));
    }

    ember_request_params p;
    ember_request_default(&p);
    ember_error *err = ember_submit(e, &p, &r);
    assert_non_null(err);
    assert_non_null(strstr(ember_error_message(err), "empty"));
    ember_error_free(err);
    static int32_t huge[600];
    make_prompt(huge, 600, 3);
    p.prompt_ids = huge;
    p.n_prompt_ids = 600;
    err = ember_submit(e, &p, &r);
    assert_non_null(strstr(ember_error_message(err), "the context holds 512"));
    ember_error_free(err);
    p.n_prompt_ids = 10;
    p.max_tokens = 0;
    err = ember_submit(e, &p, &r);
    assert_non_null(strstr(ember_error_message(err), "max_tokens"));
    ember_error_free(err);
    p.max_tokens = 5;
    p.sampling.top_p = 2;
    err = ember_submit(e, &p, &r);
    assert_non_null(strstr(ember_error_message(err), "top_p"));
    ember_error_free(err);
    int32_t bad = (int32_t)n_vocab;
    p.sampling.top_p = 1;
    p.prompt_ids = &bad;
    p.n_prompt_ids = 1;
    err = ember_submit(e, &p, &r);
    assert_non_null(strstr(ember_error_message(err), "outside the vocabulary"));
    ember_error_free(err);
    /* Text prompts go through the model's tokenizer. */
    p.prompt_ids = NULL;
    p.n_prompt_ids = 0;
    p.prompt_text = "Hello world";
    p.max_tokens = 3;
    assert_null(ember_submit(e, &p, &r));
    result text;
    collect(r, &text);
    assert_int_equal(text.timings.prompt_tokens, 3); /* BOS, "▁Hello", "▁world" */
    ember_engine_destroy(e);
}


/* Requests arriving while others run: N = 1..8, different prompt lengths, each submitted after the
 * previous one has produced a few tokens. Greedy outputs equal the solo runs. */
static void test_staggered_arrivals(void **state) {
    (void)state;
    enum { N = 8, OUT = 12 };
    int32_t prompts[N][80];
    result solo[N];
    ember_engine *e = new_engine(0, 0);
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], 10 + 9 * (uint32_t)i, 500 + (uint64_t)i);
        collect(submit_ids(e, prompts[i], 10 + 9 * (uint32_t)i, OUT, 0.0f, 0), &solo[i]);
    }
    ember_engine_destroy(e);
    for (int n = 1; n <= N; n++) {
        e = new_engine(0, 0);
        ember_request *r[N];
        result partial[N];
        for (int i = 0; i < n; i++) {
            r[i] = submit_ids(e, prompts[i], 10 + 9 * (uint32_t)i, OUT, 0.0f, 0);
            /* Wait for its first token, so the next one arrives while this one decodes. */
            ember_output out;
            assert_true(ember_request_next(r[i], &out, 20000));
            memset(&partial[i], 0, sizeof partial[i]);
            for (size_t k = 0; k < out.n_tokens; k++) partial[i].tokens[partial[i].n++] = out.tokens[k].token;
        }
        for (int i = 0; i < n; i++) {
            result rest;
            collect(r[i], &rest);
            memcpy(partial[i].tokens + partial[i].n, rest.tokens, rest.n * sizeof(int32_t));
            assert_int_equal(partial[i].n + rest.n, OUT);
            assert_memory_equal(partial[i].tokens, solo[i].tokens, OUT * sizeof(int32_t));
        }
        ember_engine_destroy(e);
    }
}

/* Cancelling mid-stream gives every block back: afterwards the only used blocks are the ones the
 * prefix cache keeps. */
static void test_cancel_returns_blocks(void **state) {
    (void)state;
    int32_t prompt[100];
    make_prompt(prompt, 100, 77);
    ember_engine *e = new_engine(0, 0);
    ember_request *r[4];
    for (int i = 0; i < 4; i++) r[i] = submit_ids(e, prompt + i, 90, 200, 0.5f, (uint64_t)i);
    ember_output out;
    for (int i = 0; i < 4; i++) assert_true(ember_request_next(r[i], &out, 20000));
    for (int i = 0; i < 4; i++) ember_request_release(r[i]); /* release cancels */
    ember_stats stats;
    for (int tries = 0; tries < 2000; tries++) {
        ember_engine_stats(e, &stats);
        if (stats.running == 0 && stats.requests_cancelled == 4) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(stats.requests_cancelled, 4);
    assert_int_equal(stats.running, 0);
    assert_int_equal(stats.kv_blocks_used, stats.kv_blocks_cached);
    ember_engine_destroy(e);
}

/* 1,000 random operations: submit a request from a small set of prompts, or cancel a random live
 * one. Finished requests must equal their solo output; cancelled ones a prefix of it. */
static void test_random_submit_cancel(void **state) {
    (void)state;
    enum { PROMPTS = 5, OPS = 1000, LIVE = 24, OUT = 6 };
    int32_t prompts[PROMPTS][40];
    result solo[PROMPTS];
    em_model *m;
    assert_null(em_model_load(MODEL, &m));
    uint64_t block_bytes = em_backend_kv_bytes_per_token(m) * 16;
    em_model_free(m);
    ember_engine *e = new_engine(0, 0);
    for (int i = 0; i < PROMPTS; i++) {
        make_prompt(prompts[i], 12 + 5 * (uint32_t)i, 900 + (uint64_t)i);
        collect(submit_ids(e, prompts[i], 12 + 5 * (uint32_t)i, OUT, 0.0f, 0), &solo[i]);
    }
    ember_engine_destroy(e);
    e = new_engine(12 * block_bytes, 0); /* small: eviction and preemption happen too */
    struct { ember_request *r; int prompt; } live[LIVE] = {{0}};
    uint64_t rng = 12345;
    uint32_t finished = 0, cancelled = 0;
    for (int op = 0; op < OPS; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int slot = (int)((rng >> 33) % LIVE);
        if (live[slot].r == NULL) {
            int k = (int)((rng >> 20) % PROMPTS);
            live[slot].r = submit_ids(e, prompts[k], 12 + 5 * (uint32_t)k, OUT, 0.0f, 0);
            live[slot].prompt = k;
            continue;
        }
        bool cancel = (rng >> 40) % 2;
        if (cancel) ember_request_cancel(live[slot].r);
        result res;
        memset(&res, 0, sizeof res);
        ember_output out;
        do {
            assert_true(ember_request_next(live[slot].r, &out, 20000));
            for (size_t i = 0; i < out.n_tokens; i++) res.tokens[res.n++] = out.tokens[i].token;
        } while (out.finish == EMBER_FINISH_NONE);
        assert_true(out.finish == EMBER_FINISH_LENGTH || out.finish == EMBER_FINISH_CANCELLED);
        assert_memory_equal(res.tokens, solo[live[slot].prompt].tokens, res.n * sizeof(int32_t));
        if (out.finish == EMBER_FINISH_LENGTH) assert_int_equal(res.n, OUT), finished++;
        else cancelled++;
        ember_request_release(live[slot].r);
        live[slot].r = NULL;
    }
    for (int i = 0; i < LIVE; i++) ember_request_release(live[i].r);
    assert_true(finished > 50 && cancelled > 50);
    ember_engine_destroy(e);
}

/* The same sequence at the benchmark's size: ~8k-token documents, A → A' → B → A''. */
static void test_prefix_reuse_8k(void **state) {
    (void)state;
    enum { DOC = 8022, ANSWER = 4, MORE = 40 };
    static int32_t a[DOC + 2 * (ANSWER + MORE)], b_doc[DOC];
    make_prompt(a, DOC + 2 * (ANSWER + MORE), 31);
    make_prompt(b_doc, DOC, 32);
    ember_options o;
    ember_options_default(&o);
    o.model_path = MODEL;
    o.device = "cpu";
    o.threads = 2;
    o.ctx_tokens = 8192;
    ember_engine *e;
    assert_null(ember_engine_create(&o, &e));
    result r;
    collect(submit_ids(e, a, DOC, ANSWER, 0.0f, 0), &r);
    memcpy(a + DOC, r.tokens, ANSWER * sizeof(int32_t));
    uint32_t a1 = DOC + ANSWER + MORE;
    collect(submit_ids(e, a, a1, ANSWER, 0.0f, 0), &r);
    assert_int_equal(r.timings.cached_tokens, DOC + ANSWER - 1);
    collect(submit_ids(e, b_doc, DOC, ANSWER, 0.0f, 0), &r);
    assert_int_equal(r.timings.cached_tokens, 0);
    ember_request *again = submit_ids(e, a, a1, ANSWER, 0.0f, 0); /* A' once more: all cached but one */
    collect(again, &r);
    assert_int_equal(r.timings.cached_tokens, a1 - 1);
    ember_stats stats;
    ember_engine_stats(e, &stats);
    assert_int_equal(stats.prefix_hits, 2);
    assert_int_equal(stats.prefix_tokens_evicted, 0); /* both documents fit at once */
    ember_engine_destroy(e);
}

/* Handles outlive their engine: destroying it finishes every request (cancelled), and the handles
 * can still be read and released afterwards. */
static void test_handles_outlive_engine(void **state) {
    (void)state;
    int32_t prompt[30];
    make_prompt(prompt, 30, 41);
    ember_engine *e = new_engine(0, 0);
    ember_request *r = submit_ids(e, prompt, 30, 10000, 0.0f, 0);
    ember_output out;
    assert_true(ember_request_next(r, &out, 20000));
    ember_engine_destroy(e);
    assert_int_equal(wait_finish(r), EMBER_FINISH_CANCELLED);
    ember_request_cancel(r);
    ember_request_release(r);
}

/* The KV cache holds kv_sequences full-length sequences (default four), and a negative count is
 * refused with a message. */
static void test_kv_sequences(void **state) {
    (void)state;
    ember_options o;
    test_options(&o);
    o.ctx_tokens = 128;
    const int counts[3] = {0, 1, 10};
    const uint32_t blocks[3] = {4 * 128 / 16, 1 * 128 / 16, 10 * 128 / 16}; /* 16-token blocks */
    for (int i = 0; i < 3; i++) {
        o.kv_sequences = counts[i];
        ember_engine *e;
        ember_error *err = ember_engine_create(&o, &e);
        if (err) fail_msg("engine: %s", ember_error_message(err));
        ember_engine_info info;
        ember_engine_get_info(e, &info);
        assert_int_equal(info.kv_blocks, blocks[i]);
        ember_engine_destroy(e);
    }
    o.kv_sequences = -1;
    ember_engine *e = NULL;
    ember_error *err = ember_engine_create(&o, &e);
    assert_non_null(err);
    assert_non_null(strstr(ember_error_message(err), "negative"));
    ember_error_free(err);
}

/* Output by callback: the same tokens and text as polling, then one call with the finish. */
typedef struct callback_log {
    result res;
    size_t text_len;
    int finishes;
    ember_finish_reason finish;
} callback_log;

static void on_output(const ember_output *out, void *user) {
    callback_log *log = user;
    for (size_t i = 0; i < out->n_tokens; i++) log->res.tokens[log->res.n++] = out->tokens[i].token;
    memcpy(log->res.text + log->text_len, out->text, out->text_len);
    log->text_len += out->text_len;
    if (out->finish != EMBER_FINISH_NONE) log->finishes++, log->finish = out->finish;
}

static void test_output_by_callback(void **state) {
    (void)state;
    int32_t prompt[25];
    make_prompt(prompt, 25, 61);
    ember_engine *e = new_engine(0, 0);
    result polled;
    collect(submit_ids(e, prompt, 25, 16, 0.0f, 0), &polled);
    callback_log log;
    memset(&log, 0, sizeof log);
    ember_request_params p;
    ember_request_default(&p);
    p.prompt_ids = prompt;
    p.n_prompt_ids = 25;
    p.max_tokens = 16;
    p.sampling.temperature = 0;
    p.ignore_eos = true;
    p.on_output = on_output;
    p.user = &log;
    ember_request *r;
    assert_null(ember_submit(e, &p, &r));
    ember_output out;
    do assert_true(ember_request_next(r, &out, 20000));
    while (out.finish == EMBER_FINISH_NONE);
    assert_int_equal(out.n_tokens, 0); /* everything went to the callback */
    ember_request_release(r);
    assert_int_equal(log.finishes, 1);
    assert_int_equal(log.finish, EMBER_FINISH_LENGTH);
    assert_int_equal(log.res.n, 16);
    assert_memory_equal(log.res.tokens, polled.tokens, 16 * sizeof(int32_t));
    assert_int_equal(log.text_len, strlen(polled.text));
    assert_memory_equal(log.res.text, polled.text, log.text_len);
    ember_engine_destroy(e);
}


/* The CPU backend's picks equal the host rule applied to the rows it would have returned. */
static void test_backend_pick_equals_rule(void **state) {
    (void)state;
    em_model *m;
    assert_null(em_model_load(MODEL, &m));
    em_backend_config config = {.device = "cpu", .n_threads = 1, .block_tokens = 16, .kv_tokens = 1024};
    em_backend *b;
    assert_null(em_backend_cpu_new(m, &config, &b));
    static uint32_t blocks[64];
    em_batch_seq seqs[2];
    em_batch_fixed_tables(seqs, blocks, 2, 32);
    int32_t tokens[6];
    make_prompt(tokens, 6, 77);
    uint32_t seq[6] = {0, 0, 0, 1, 1, 1}, pos[6] = {0, 1, 2, 0, 1, 2};
    bool want[6] = {false, false, true, false, true, true};
    float *logits = malloc(3 * n_vocab * sizeof *logits);
    uint64_t *keys = malloc(2 * n_vocab * sizeof *keys);
    em_batch batch = {6, tokens, seq, pos, want, 2, seqs, NULL, false, NULL, NULL};
    assert_null(em_backend_forward(b, &batch, logits));
    for (uint64_t counter = 0; counter < 8; counter++) {
        em_pick_params pick[3] = {em_pick_params_make(0.0f, 0, 1.0f, 0.0f, 1, counter),
                                  em_pick_params_make(0.8f, 20, 0.9f, 0.0f, 2, counter),
                                  em_pick_params_make(1.5f, 0, 1.0f, 0.05f, 3, counter)};
        int32_t picked[3] = {-1, -1, -1};
        assert_null(em_backend_forward_pick(b, &batch, pick, picked)); /* the same positions again: same rows */
        for (int r = 0; r < 3; r++) assert_int_equal(picked[r], em_pick(logits + (size_t)r * n_vocab, n_vocab, &pick[r], keys));
    }
    free(logits);
    free(keys);
    em_backend_free(b);
    em_model_free(m);
}

static bool overlap_on(void) {
    const char *v = getenv("EMBER_CPU_OVERLAP");
    return v && !strcmp(v, "1");
}

static ember_request *submit_sampled(ember_engine *e, const int32_t *prompt, uint32_t n, uint64_t seed, int logprobs) {
    ember_request_params p = ids_params(prompt, n, 16, 0.9f, seed);
    p.sampling.top_k = 30;
    p.sampling.top_p = 0.95f;
    p.sampling.min_p = 0.01f;
    p.sampling.logprobs = logprobs;
    return submit_params(e, &p);
}

/* Seeded requests give the same tokens whether the backend picked them (plain requests) or the
 * host sampled them (logprobs asked for, or a step shared with such a request), alone or batched. */
static void test_backend_pick_equals_host(void **state) {
    (void)state;
    enum { N = 4 };
    int32_t prompts[N][20];
    for (int i = 0; i < N; i++) make_prompt(prompts[i], 20, 300 + (uint64_t)i);
    result picked[N], hosted[N], mixed[N];
    ember_stats stats;
    ember_engine *e = new_engine(0, 0);
    for (int i = 0; i < N; i++) collect(submit_sampled(e, prompts[i], 20, 40 + (uint64_t)i, 0), &picked[i]);
    ember_engine_stats(e, &stats);
    assert_int_equal(stats.backend_picked_tokens, N * 16);
    /* with step overlap (the engine_overlap run: EMBER_CPU_OVERLAP=1), each request's steps after its
     * first token were begun before the last token was read; without it, none */
    if (overlap_on()) assert_int_equal(stats.overlapped_steps, N * 15);
    else assert_int_equal(stats.overlapped_steps, 0);
    ember_engine_destroy(e);
    e = new_engine(0, 0);
    for (int i = 0; i < N; i++) collect(submit_sampled(e, prompts[i], 20, 40 + (uint64_t)i, 1), &hosted[i]);
    ember_engine_stats(e, &stats);
    assert_int_equal(stats.backend_picked_tokens, 0);
    ember_engine_destroy(e);
    e = new_engine(0, 0); /* all at once, one of them with logprobs: shared steps take the host path */
    ember_request *r[N];
    for (int i = 0; i < N; i++) r[i] = submit_sampled(e, prompts[i], 20, 40 + (uint64_t)i, i == 2);
    for (int i = 0; i < N; i++) collect(r[i], &mixed[i]);
    ember_engine_destroy(e);
    int differ = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(picked[i].n, 16);
        assert_memory_equal(picked[i].tokens, hosted[i].tokens, 16 * sizeof(int32_t));
        assert_memory_equal(picked[i].tokens, mixed[i].tokens, 16 * sizeof(int32_t));
        if (i) differ += memcmp(picked[i].tokens, picked[0].tokens, 16 * sizeof(int32_t)) != 0;
    }
    assert_true(differ > 0); /* the outputs are not all one greedy answer */
}

/* The model's text side through ember.h: a conversation becomes the tokens of its ChatML rendering
 * (the format Qwen's and OpenAI's documentation spell out, which the synthetic model's template
 * writes), tokenized with control-token parsing as the engine itself tokenizes text; malformed
 * JSON and a model-side error come back as errors, not crashes. */
static void test_text_api(void **state) {
    (void)state;
    ember_engine *e = new_engine(0, 0);
    const char *source;
    size_t source_len;
    assert_null(ember_chat_template(e, &source, &source_len));
    assert_non_null(memmem(source, source_len, "<|im_start|>", 12));

    ember_chat chat = {.messages = "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                                   "{\"role\":\"user\",\"content\":\"Hi there\"}]",
                       .add_generation_prompt = true};
    int32_t *ids, *want;
    size_t n, n_want;
    assert_null(ember_chat_tokens(e, &chat, &ids, &n));
    const char rendered[] = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                            "<|im_start|>assistant\n";
    assert_null(ember_tokenize(e, rendered, strlen(rendered), true, true, &want, &n_want));
    assert_int_equal(n, n_want);
    assert_memory_equal(ids, want, n * sizeof *ids);
    const char *bos;
    assert_int_equal(ember_token_piece(e, ids[0], &bos), 3); /* llama-spm's BOS */
    assert_memory_equal(bos, "<s>", 3);
    char *text;
    size_t len;
    assert_null(ember_detokenize(e, ids + 1, n - 1, &text, &len));
    assert_non_null(memmem(text, len, "<|im_start|>assistant", 21));
    free(text);
    free(want);
    free(ids);

    chat.add_generation_prompt = false;
    assert_null(ember_chat_tokens(e, &chat, &ids, &n));
    assert_true(n < n_want);
    free(ids);

    const char *bad[][2] = {{"[{\"role\":", NULL}, {"{}", NULL}, {"[]", "{}"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ember_chat wrong = {.messages = bad[i][0], .tools = bad[i][1]};
        ember_error *err = ember_chat_tokens(e, &wrong, &ids, &n);
        assert_non_null(err);
        assert_non_null(strstr(ember_error_message(err), "chat "));
        assert_null(ids);
        ember_error_free(err);
    }
    ember_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_pick_equals_rule),
        cmocka_unit_test(test_backend_pick_equals_host),
        cmocka_unit_test(test_greedy_matches_backend),
        cmocka_unit_test(test_weights_mapped_or_in_memory),
        cmocka_unit_test(test_batched_equals_solo),
        cmocka_unit_test(test_prefix_reuse_interleaved),
        cmocka_unit_test(test_memory_pressure),
        cmocka_unit_test(test_cancel_stop_and_bad_requests),
        cmocka_unit_test(test_staggered_arrivals),
        cmocka_unit_test(test_cancel_returns_blocks),
        cmocka_unit_test(test_random_submit_cancel),
        cmocka_unit_test(test_prefix_reuse_8k),
        cmocka_unit_test(test_handles_outlive_engine),
        cmocka_unit_test(test_output_by_callback),
        cmocka_unit_test(test_kv_sequences),
        cmocka_unit_test(test_text_api),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
