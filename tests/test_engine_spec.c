/* Speculative decoding in the engine (CPU): the output with drafts (prompt lookup, a draft model)
 * is token for token the output without, greedy and sampled, alone and batched with requests that
 * do not speculate; rejected drafts leave nothing behind (no block leaks, a prefix cache that
 * continues exactly); the sampled distribution with drafts matches the one without (a two-sample
 * test that accepting drafts unconditionally fails); bad options fail cleanly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "ember.h"
#include "model/model.h"

#define VOCAB EM_FIXTURES_DIR "/vocab/ggml-vocab-llama-spm.gguf"
#define OTHER_VOCAB EM_FIXTURES_DIR "/vocab/ggml-vocab-bert-bge.gguf"
#define DIR EM_BINARY_DIR "/test_engine_spec_files"
#define MODEL DIR "/tiny-qwen3.gguf"
#define DRAFT DIR "/tiny-llama.gguf"
#define DRAFT_OTHER_VOCAB DIR "/tiny-llama-bert.gguf"
#define MAX_OUT 96

static uint32_t n_vocab;

static void synth(const char *preset, uint64_t seed, const char *vocab, const char *path) {
    em_synth_options o = {.preset = preset, .type = "f32", .seed = seed, .vocab_path = vocab};
    em_err err = em_synth_write(&o, path);
    if (err) fail_msg("synth: %s", em_err_message(err));
}

static int setup(void **state) {
    (void)state;
    mkdir(DIR, 0755);
    synth("tiny-qwen3", 5, VOCAB, MODEL);
    synth("tiny-llama", 9, VOCAB, DRAFT);
    synth("tiny-llama", 9, OTHER_VOCAB, DRAFT_OTHER_VOCAB);
    em_model *m;
    em_err err = em_model_load(MODEL, &m);
    if (err) fail_msg("load: %s", em_err_message(err));
    n_vocab = m->desc.n_vocab;
    em_model_free(m);
    return 0;
}

/* A prompt that repeats a random stretch of `period` tokens: prompt lookup finds drafts in it. */
static void repetitive_prompt(int32_t *tokens, uint32_t n, uint32_t period, uint64_t seed) {
    for (uint32_t i = 0; i < n; i++) {
        if (i >= period) {
            tokens[i] = tokens[i - period];
            continue;
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = 3 + (int32_t)((seed >> 33) % (n_vocab - 3)); /* no control tokens */
    }
}

typedef struct engine_setup {
    int speculative;
    const char *draft_model;
    int draft_max, block_tokens, max_sequences, spec_max_seqs;
} engine_setup;

/* EMBER_TEST_DEVICE=cuda runs the same checks on the CUDA backend (tests/cuda/run.sh). */
static ember_engine *new_engine(engine_setup s) {
    ember_options o;
    ember_options_default(&o);
    o.model_path = MODEL;
    o.device = getenv("EMBER_TEST_DEVICE") ? getenv("EMBER_TEST_DEVICE") : "cpu";
    o.threads = 2;
    o.ctx_tokens = 512;
    o.speculative = s.speculative;
    o.draft_model_path = s.draft_model;
    o.draft_max = s.draft_max;
    o.spec_max_seqs = s.spec_max_seqs;
    if (s.block_tokens) o.block_tokens = s.block_tokens;
    if (s.max_sequences) o.max_sequences = s.max_sequences;
    ember_engine *e;
    ember_error *err = ember_engine_create(&o, &e);
    if (err) fail_msg("engine: %s", ember_error_message(err));
    return e;
}

typedef struct result {
    int32_t tokens[MAX_OUT];
    uint32_t n;
    ember_timings timings;
} result;

typedef struct job {
    const int32_t *prompt;
    uint32_t n_prompt;
    int max_tokens;
    float temperature;
    int top_k;
    uint64_t seed;
    float repeat_penalty; /* 0: none (the backend picks); else the host samples */
    int speculative;      /* an ember_spec for the request */
} job;

static ember_request *submit(ember_engine *e, const job *j) {
    ember_request_params p;
    ember_request_default(&p);
    p.prompt_ids = j->prompt;
    p.n_prompt_ids = j->n_prompt;
    p.max_tokens = j->max_tokens;
    p.sampling.temperature = j->temperature;
    p.sampling.top_k = j->top_k;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.seed = j->seed;
    if (j->repeat_penalty) p.sampling.repeat_penalty = j->repeat_penalty;
    p.ignore_eos = true;
    p.speculative = j->speculative;
    ember_request *r;
    ember_error *err = ember_submit(e, &p, &r);
    if (err) fail_msg("submit: %s", ember_error_message(err));
    return r;
}

static void collect(ember_request *r, result *res) {
    memset(res, 0, sizeof *res);
    ember_output out;
    do {
        assert_true(ember_request_next(r, &out, 300000));
        for (size_t i = 0; i < out.n_tokens; i++) {
            assert_true(res->n < MAX_OUT);
            res->tokens[res->n++] = out.tokens[i].token;
        }
    } while (out.finish == EMBER_FINISH_NONE);
    if (out.finish == EMBER_FINISH_ERROR) fail_msg("request failed: %s", out.error);
    ember_request_timings(r, &res->timings);
    ember_request_release(r);
}

/* Runs the jobs at once on `e`, results in order. */
static void run_jobs(ember_engine *e, const job *jobs, result *results, uint32_t n) {
    ember_request **r = malloc(n * sizeof *r);
    for (uint32_t i = 0; i < n; i++) r[i] = submit(e, &jobs[i]);
    for (uint32_t i = 0; i < n; i++) collect(r[i], &results[i]);
    free(r);
}

/* Runs the jobs at once on a fresh engine of setup `s`, results in order. */
static void run_alone(engine_setup s, const job *jobs, result *results, uint32_t n) {
    ember_engine *e = new_engine(s);
    run_jobs(e, jobs, results, n);
    ember_engine_destroy(e);
}

static void assert_same_tokens(const result *a, const result *b) {
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->tokens, b->tokens, a->n * sizeof *a->tokens);
}

/* ---- The drafters' rules ---- */

static void test_lookup_rule(void **state) {
    (void)state;
    int32_t draft[8];
    /* "1 2 3" occurred at the start: what followed it, then on into the drafts (period 5). */
    const int32_t periodic[] = {1, 2, 3, 4, 5, 1, 2, 3};
    assert_int_equal(em_spec_lookup(periodic, 8, 8, draft), 8);
    const int32_t want_periodic[] = {4, 5, 1, 2, 3, 4, 5, 1};
    assert_memory_equal(draft, want_periodic, sizeof want_periodic);
    /* The latest occurrence wins, and a longer n-gram is tried before a shorter one: "7 9" occurs
     * once (followed by 4) while "9" alone last occurred followed by 6. */
    const int32_t latest[] = {7, 9, 4, 8, 9, 6, 7, 9};
    assert_int_equal(em_spec_lookup(latest, 8, 2, draft), 2);
    assert_int_equal(draft[0], 4);
    assert_int_equal(draft[1], 8);
    /* Only a single token repeats: n = 1. */
    const int32_t single[] = {5, 6, 7, 8, 6};
    assert_int_equal(em_spec_lookup(single, 5, 3, draft), 3);
    const int32_t want_single[] = {7, 8, 6};
    assert_memory_equal(draft, want_single, sizeof want_single);
    /* Nothing repeats: no draft; no room: no draft. */
    const int32_t none[] = {1, 2, 3, 4};
    assert_int_equal(em_spec_lookup(none, 4, 8, draft), 0);
    assert_int_equal(em_spec_lookup(periodic, 8, 0, draft), 0);
}

static void test_adapt_rule(void **state) {
    (void)state;
    uint32_t length = 4, pause = 0, misses = 0;
    em_spec_adapt(&length, &pause, &misses, 4, 4, 1, 0, 16); /* all accepted: doubled */
    assert_int_equal(length, 8);
    em_spec_adapt(&length, &pause, &misses, 8, 8, 1, 0, 10); /* capped */
    assert_int_equal(length, 10);
    em_spec_adapt(&length, &pause, &misses, 10, 3, 1, 0, 16); /* one past the accepted run */
    assert_int_equal(length, 4);
    em_spec_adapt(&length, &pause, &misses, 4, 0, 1, 0, 16); /* none: zero and a pause */
    assert_int_equal(length, 0);
    assert_int_equal(pause, EM_SPEC_PAUSE_STEPS);
    length = 1;
    em_spec_adapt(&length, &pause, &misses, 1, 0, 1, 0, 16); /* a second miss in a row: twice the pause */
    assert_int_equal(pause, 2 * EM_SPEC_PAUSE_STEPS);
    for (int i = 0; i < 10; i++) em_spec_adapt(&length, &pause, &misses, 1, 0, 1, 0, 16);
    assert_int_equal(pause, EM_SPEC_PAUSE_STEPS << EM_SPEC_PAUSE_DOUBLINGS); /* bounded */
    length = 1;
    em_spec_adapt(&length, &pause, &misses, 1, 1, 1, 0, 16); /* a hit ends the run of misses */
    assert_int_equal(length, 2);
    assert_int_equal(misses, 0);
    assert_int_equal(pause, 0);
    length = 2, pause = 0;
    em_spec_adapt(&length, &pause, &misses, 2, 0, 1, 3, 16); /* never below the minimum */
    assert_int_equal(length, 3);
    assert_int_equal(pause, 0);
    em_spec_adapt(&length, &pause, &misses, 3, 1, 1, 0, 16); /* fewer drafted than the length: the run counts */
    assert_int_equal(length, 2);
    /* in a batch that overlaps its steps (least 2): one accepted of several is a miss, but a single
     * draft accepted still grows */
    length = 3, pause = 0, misses = 0;
    em_spec_adapt(&length, &pause, &misses, 3, 1, 2, 0, 16);
    assert_int_equal(length, 0);
    assert_int_equal(pause, EM_SPEC_PAUSE_STEPS);
    assert_int_equal(misses, 1);
    length = 1;
    em_spec_adapt(&length, &pause, &misses, 1, 1, 2, 0, 16);
    assert_int_equal(length, 2);
    assert_int_equal(misses, 0);
    em_spec_adapt(&length, &pause, &misses, 2, 2, 2, 0, 16);
    assert_int_equal(length, 4);
}

/* The least accepted drafts that pay, from measured step times: none measured, one; a draft costing
 * half a token's time wants half of them accepted; one that costs more than a token, more than all. */
static void test_least_from_costs(void **state) {
    (void)state;
    em_spec_costs c = {0};
    assert_int_equal(em_spec_least(&c, 4), 1);
    em_spec_cost_step(&c, 2, 0, 2.0); /* plain: 1 ms a token */
    assert_int_equal(em_spec_least(&c, 4), 1); /* no verification measured yet */
    em_spec_cost_step(&c, 3, 2, 2.0); /* one token and two drafts in 2 ms: 0.5 ms a draft */
    assert_true(fabs(c.verify_ms_per_draft - 0.5) < 1e-6);
    assert_int_equal(em_spec_least(&c, 4), 2);
    assert_int_equal(em_spec_least(&c, 3), 2);
    assert_int_equal(em_spec_least(&c, 1), 1);
    em_spec_cost_model(&c, 4, 2.4); /* the draft model: 0.6 ms a draft, 1.1 in all */
    assert_int_equal(em_spec_least(&c, 2), 3);
    assert_int_equal(em_spec_least(&c, 10), 11);
    em_spec_cost_step(&c, 1, 0, 3.0); /* averages move by a sixteenth of the difference */
    assert_true(fabs(c.plain_ms_per_token - 1.125) < 1e-6);
    em_spec_cost_step(&c, 0, 0, 1.0); /* nothing to learn from */
    em_spec_cost_step(&c, 2, 2, 1.0);
    assert_true(fabs(c.plain_ms_per_token - 1.125) < 1e-6);
    assert_true(em_spec_costs_model_pays(&c)); /* a draft costs 1.1 ms, a token 1.125 */
    em_spec_cost_model(&c, 1, 4.0); /* the draft model's average: 0.8125 */
    assert_false(em_spec_costs_model_pays(&c)); /* now a draft costs more than a token */

    /* a draft model whose parts say it pays, until its drafting steps as a whole say otherwise */
    em_spec_costs d = {0};
    em_spec_cost_step(&d, 1, 0, 1.0);   /* plain: 1 ms a token */
    em_spec_cost_step(&d, 3, 2, 1.4);   /* 0.2 ms a draft to verify */
    em_spec_cost_model(&d, 2, 0.4);     /* and 0.2 to draft */
    assert_true(em_spec_costs_model_pays(&d)); /* no drafting step measured yet */
    em_spec_cost_drafting(&d, 2, 1.6);  /* 0.8 ms a token yielded */
    assert_true(em_spec_costs_model_pays(&d));
    em_spec_cost_drafting(&d, 0, 1.0);  /* nothing to learn from */
    assert_int_equal(d.drafting_steps, 1);
    for (int i = 0; i < 20; i++) em_spec_cost_drafting(&d, 2, 2.4); /* 1.2 ms a token */
    assert_true(d.drafting_ms_per_token > 1.0);
    assert_false(em_spec_costs_model_pays(&d));
}

/* The engine learns what a plain token costs from its own decode steps, where steps overlap too
 * (the engine_spec_overlap run, and CUDA): there from the time between two chained steps' tokens. */
static void test_costs_measured(void **state) {
    (void)state;
    int32_t prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = 500 + 11 * i;
    const job plain = {prompt, 16, 40, 0.0f, 0, 3, 0, EMBER_SPEC_OFF};
    result got;
    ember_engine *e = new_engine((engine_setup){0});
    run_jobs(e, &plain, &got, 1);
    const em_spec_costs costs = e->spec_costs;
    ember_engine_destroy(e);
    assert_int_equal(got.n, 40);
    assert_true(costs.plain_steps >= 16);
    assert_true(costs.plain_ms_per_token > 0);
    assert_int_equal(costs.verify_steps, 0);
}

/* A draft model measured to cost more per draft than a token drafts nothing (but at one step in
 * EM_SPEC_PROBE_STEPS), where steps overlap or not, and where they do, its steps are chained as a
 * plain request's; the output is the same. */
static void test_costly_draft_model_pauses(void **state) {
    (void)state;
    int32_t prompt[40];
    repetitive_prompt(prompt, 40, 10, 17);
    const job plain = {prompt, 40, 48, 0.0f, 0, 5, 0, EMBER_SPEC_OFF};
    job spec = plain;
    spec.speculative = EMBER_SPEC_DRAFT;
    result want, got;
    run_alone((engine_setup){0}, &plain, &want, 1);
    ember_engine *e = new_engine((engine_setup){.draft_model = DRAFT, .draft_max = 6});
    /* the engine is idle until the request comes: each draft costs a thousand seconds, beyond what
     * the plain steps the engine measures meanwhile can cost on any machine (sanitizers included) */
    e->spec_costs = (em_spec_costs){.plain_ms_per_token = 0.001, .verify_ms_per_draft = 1e6, .model_ms_per_draft = 1e6,
                                    .plain_steps = 1, .verify_steps = 1, .model_steps = 1};
    ember_stats before, after;
    ember_engine_stats(e, &before);
    run_jobs(e, &spec, &got, 1);
    ember_engine_stats(e, &after);
    ember_engine_destroy(e);
    assert_same_tokens(&want, &got);
    assert_int_equal(got.timings.draft_tokens, 0);
    const char *overlap = getenv("EMBER_CPU_OVERLAP");
    if (overlap && !strcmp(overlap, "1")) assert_true(after.overlapped_steps - before.overlapped_steps >= 40);
}

/* ---- Exactness ---- */

/* Greedy: the same tokens with and without prompt lookup, and drafts were made and accepted. */
static void test_greedy_lookup_identical(void **state) {
    (void)state;
    int32_t prompt[120];
    repetitive_prompt(prompt, 120, 23, 11);
    const job plain = {prompt, 120, 64, 0.0f, 0, 0, 0, EMBER_SPEC_OFF};
    job spec = plain;
    spec.speculative = EMBER_SPEC_LOOKUP;
    result want, got;
    run_alone((engine_setup){0}, &plain, &want, 1);
    ember_engine *e = new_engine((engine_setup){.speculative = EMBER_SPEC_OFF}); /* fresh cache */
    run_jobs(e, &spec, &got, 1);
    ember_stats stats;
    ember_engine_stats(e, &stats);
    ember_engine_destroy(e);
    assert_same_tokens(&want, &got);
    assert_int_equal(want.timings.draft_tokens, 0);
    assert_true(got.timings.draft_tokens > 0);
    assert_int_equal(stats.draft_tokens, got.timings.draft_tokens);
    assert_int_equal(stats.draft_accepted, got.timings.draft_accepted);
    assert_true(got.timings.draft_accepted <= got.timings.draft_tokens);
    assert_int_equal(stats.generated_tokens, 64);
    /* Where steps overlap, drafts ride in steps chained behind the one in flight; where they do
     * not (the CPU backend without its emulation), there is no such step. */
    const char *overlap = getenv("EMBER_CPU_OVERLAP"), *device = getenv("EMBER_TEST_DEVICE");
    assert_true(stats.draft_tokens_overlapped <= stats.draft_tokens);
    if (overlap && !strcmp(overlap, "1")) assert_true(stats.draft_tokens_overlapped > 0);
    else if (!device || !strcmp(device, "cpu")) assert_int_equal(stats.draft_tokens_overlapped, 0);
}

/* Where steps overlap (the engine_spec_overlap run), a lookup request whose text never repeats
 * keeps its steps chained (a lookup that finds nothing drafts nothing, and rejected drafts pause
 * it); the tokens are those without lookup. */
static void test_lookup_without_matches_chains(void **state) {
    (void)state;
    int32_t prompt[64];
    for (int i = 0; i < 64; i++) prompt[i] = 1000 + 37 * i;
    const job plain = {prompt, 64, 64, 1.0f, 0, 7, 0, EMBER_SPEC_OFF};
    job spec = plain;
    spec.speculative = EMBER_SPEC_LOOKUP;
    result want, got;
    ember_engine *e = new_engine((engine_setup){0});
    run_jobs(e, &plain, &want, 1);
    ember_stats before, after;
    ember_engine_stats(e, &before);
    run_jobs(e, &spec, &got, 1);
    ember_engine_stats(e, &after);
    ember_engine_destroy(e);
    assert_same_tokens(&want, &got);
    const char *overlap = getenv("EMBER_CPU_OVERLAP");
    if (overlap && !strcmp(overlap, "1")) {
        assert_true(got.timings.draft_tokens < 8);
        assert_true(after.overlapped_steps - before.overlapped_steps >= 48);
    }
}

/* Many requests in one step, some drafting and some not, greedy and sampled, on the backend's
 * pick and on the host's (a repeat penalty): each gets the tokens it gets alone without drafts.
 * Small blocks, so drafts cross block boundaries and rejected ones free whole blocks. Afterwards
 * no block is held but by the prefix cache, and a prompt that continues one of the outputs reuses
 * the cache and continues as a fresh engine does. */
static void test_mixed_batch_and_cache(void **state) {
    (void)state;
    enum { N = 8 };
    int32_t prompts[N][100];
    job jobs[N], solo_jobs[N];
    for (uint32_t i = 0; i < N; i++) {
        const uint32_t n = 40 + 7 * i;
        repetitive_prompt(prompts[i], n, 5 + 3 * i, 200 + i);
        jobs[i] = (job){prompts[i], n, 30 + (int)i, i % 3 == 1 ? 0.9f : 0.0f, i % 3 == 1 ? 5 : 0, 40 + i,
                        i % 4 == 3 ? 1.3f : 0.0f, i % 2 ? EMBER_SPEC_OFF : EMBER_SPEC_LOOKUP};
        if (i == 5) jobs[i].speculative = EMBER_SPEC_LOOKUP;
        solo_jobs[i] = jobs[i];
        solo_jobs[i].speculative = EMBER_SPEC_OFF;
    }
    result solo[N], together[N];
    ember_engine *e = new_engine((engine_setup){.block_tokens = 4});
    for (uint32_t i = 0; i < N; i++) run_jobs(e, &solo_jobs[i], &solo[i], 1);
    ember_engine_destroy(e);
    e = new_engine((engine_setup){.block_tokens = 4, .spec_max_seqs = N});
    run_jobs(e, jobs, together, N);
    uint64_t drafted = 0;
    for (uint32_t i = 0; i < N; i++) {
        assert_same_tokens(&solo[i], &together[i]);
        if (jobs[i].speculative == EMBER_SPEC_OFF) assert_int_equal(together[i].timings.draft_tokens, 0);
        drafted += together[i].timings.draft_tokens;
    }
    assert_true(drafted > 0);
    ember_stats stats;
    ember_engine_stats(e, &stats);
    assert_int_equal(stats.kv_blocks_used, stats.kv_blocks_cached); /* nothing leaked */

    /* Request 0's prompt and output as a prompt: every token but the last comes from the cache
     * (the last output token's KV was never computed), and it continues like a fresh engine. */
    int32_t longer[200];
    memcpy(longer, prompts[0], jobs[0].n_prompt * sizeof *longer);
    memcpy(longer + jobs[0].n_prompt, together[0].tokens, together[0].n * sizeof *longer);
    job next = {longer, jobs[0].n_prompt + together[0].n, 20, 0.0f, 0, 0, 0, EMBER_SPEC_LOOKUP};
    result cached, fresh;
    run_jobs(e, &next, &cached, 1);
    ember_engine_destroy(e);
    assert_int_equal(cached.timings.cached_tokens, next.n_prompt - 1);
    e = new_engine((engine_setup){.block_tokens = 4});
    next.speculative = EMBER_SPEC_OFF;
    run_jobs(e, &next, &fresh, 1);
    ember_engine_destroy(e);
    assert_same_tokens(&fresh, &cached);
}

/* Several lookup requests whose text never repeats, sampled: the batch keeps chaining its steps
 * (where the backend overlaps them), with the same tokens as without speculation. */
static void test_lookups_without_matches_chain_together(void **state) {
    (void)state;
    enum { N = 4 };
    int32_t prompts[N][64];
    job plain[N], spec[N];
    for (uint32_t i = 0; i < N; i++) {
        for (int k = 0; k < 64; k++) prompts[i][k] = 1000 + 37 * k + 11 * (int32_t)i;
        plain[i] = (job){prompts[i], 64, 64, 1.0f, 0, 7 + i, 0, EMBER_SPEC_OFF};
        spec[i] = plain[i];
        spec[i].speculative = EMBER_SPEC_LOOKUP;
    }
    result want[N], got[N];
    run_alone((engine_setup){0}, plain, want, N);
    /* a fresh engine: the prompts prefilled as the first time, not read from the cache (on the GPU
     * a prefill and a one-token step may differ in the last bits, and these picks are sampled from
     * a random model's nearly flat distribution) */
    ember_engine *e = new_engine((engine_setup){0});
    ember_stats before, after;
    ember_engine_stats(e, &before);
    run_jobs(e, spec, got, N);
    ember_engine_stats(e, &after);
    ember_engine_destroy(e);
    for (uint32_t i = 0; i < N; i++) assert_same_tokens(&want[i], &got[i]);
    const char *overlap = getenv("EMBER_CPU_OVERLAP");
    if (overlap && !strcmp(overlap, "1")) {
        assert_true(after.overlapped_steps - before.overlapped_steps >= 48);
    }
}

/* With more requests running than spec_max_seqs nobody drafts, and the tokens stay. Three requests
 * that do not speculate are submitted first and outlive four lookup requests submitted after them
 * (the engine admits submissions in order), so at least four requests run whenever a lookup request
 * does: with a limit of 3 nothing is drafted, with 7 the lookups draft. */
static void test_no_drafts_above_max_seqs(void **state) {
    (void)state;
    enum { BACKGROUND = 3, LOOKUPS = 4, N = BACKGROUND + LOOKUPS };
    int32_t prompts[N][48];
    job jobs[N];
    for (uint32_t i = 0; i < N; i++) {
        const bool lookup = i >= BACKGROUND;
        repetitive_prompt(prompts[i], 48, lookup ? 6 + i : 48, 300 + i);
        jobs[i] = (job){prompts[i], 48, lookup ? 24 : 80, 0.0f, 0, 0, 0.0f, lookup ? EMBER_SPEC_LOOKUP : EMBER_SPEC_OFF};
    }
    uint64_t drafted[2] = {0, 0};
    result runs[2][N];
    const int limits[2] = {3, 7};
    for (int k = 0; k < 2; k++) {
        ember_engine *e = new_engine((engine_setup){.spec_max_seqs = limits[k]});
        run_jobs(e, jobs, runs[k], N);
        ember_engine_destroy(e);
        for (uint32_t i = 0; i < N; i++) drafted[k] += runs[k][i].timings.draft_tokens;
    }
    assert_int_equal(drafted[0], 0);
    assert_true(drafted[1] > 0);
    for (uint32_t i = 0; i < N; i++) assert_same_tokens(&runs[0][i], &runs[1][i]);
}

/* Sampled output with drafts is the sampled output without, seed for seed. */
static void test_sampled_lookup_identical(void **state) {
    (void)state;
    enum { N = 12 };
    int32_t prompt[60];
    repetitive_prompt(prompt, 60, 7, 3);
    job plain[N], spec[N];
    for (uint32_t i = 0; i < N; i++) {
        plain[i] = (job){prompt, 60, 24, 0.7f + 0.1f * (float)(i % 4), (int)(i % 3) * 4, 1000 + i, 0, EMBER_SPEC_OFF};
        spec[i] = plain[i];
        spec[i].speculative = EMBER_SPEC_LOOKUP;
    }
    result want[N], got[N];
    ember_engine *e = new_engine((engine_setup){0});
    run_jobs(e, plain, want, N);
    run_jobs(e, spec, got, N);
    ember_engine_destroy(e);
    for (uint32_t i = 0; i < N; i++) assert_same_tokens(&want[i], &got[i]);
}

/* The distribution: tokens at the first positions where drafts are verified, over many seeds, with
 * drafts and without (disjoint seeds, so two independent samples). The drafts come from a prompt
 * that repeats, at a temperature and top-k that make the model's own choice spread over a few
 * tokens. A chi-square statistic over the (position, token) cells must stay below the 0.999
 * quantile of its distribution; drafts accepted without the rule put all their mass on the draft. */
static void test_sampled_distribution(void **state) {
    (void)state;
    enum { N = 400, POSITIONS = 3 };
    int32_t prompt[48];
    repetitive_prompt(prompt, 48, 6, 77);
    job *jobs = malloc(2 * N * sizeof *jobs);
    result *results = malloc(2 * N * sizeof *results);
    for (uint32_t i = 0; i < 2 * N; i++)
        jobs[i] = (job){prompt, 48, 1 + POSITIONS, 1.5f, 3, 5000 + i, 0, i < N ? EMBER_SPEC_OFF : EMBER_SPEC_LOOKUP};
    ember_engine *e = new_engine((engine_setup){.max_sequences = 64, .spec_max_seqs = 64});
    for (uint32_t at = 0; at < 2 * N; at += 100) run_jobs(e, jobs + at, results + at, 100);
    ember_stats stats;
    ember_engine_stats(e, &stats);
    ember_engine_destroy(e);
    assert_true(stats.draft_tokens > N); /* the positions compared were drafted */
    double chi2 = 0;
    uint32_t cells = 0;
    for (uint32_t p = 1; p <= POSITIONS; p++) {
        /* Count each token seen at position p in both samples; rare tokens pool into one cell. */
        int32_t seen[2 * N];
        uint32_t n_seen = 0;
        for (uint32_t i = 0; i < 2 * N; i++) {
            uint32_t k = 0;
            while (k < n_seen && seen[k] != results[i].tokens[p]) k++;
            if (k == n_seen) seen[n_seen++] = results[i].tokens[p];
        }
        double pooled[2] = {0, 0};
        for (uint32_t k = 0; k <= n_seen; k++) {
            double count[2] = {0, 0};
            if (k < n_seen) {
                for (uint32_t i = 0; i < 2 * N; i++) count[i >= N] += results[i].tokens[p] == seen[k];
                if (count[0] + count[1] < 10) {
                    pooled[0] += count[0], pooled[1] += count[1];
                    continue;
                }
            } else {
                count[0] = pooled[0], count[1] = pooled[1];
                if (count[0] + count[1] == 0) continue;
            }
            /* Two samples of equal size: (a - b)^2 / (a + b) per cell. */
            chi2 += (count[0] - count[1]) * (count[0] - count[1]) / (count[0] + count[1]);
            cells++;
        }
    }
    const uint32_t df = cells - POSITIONS;
    /* The 0.999 quantile of chi-square by the Wilson-Hilferty approximation. */
    const double z = 3.0902, a = 2.0 / (9.0 * df), q = df * pow(1 - a + z * sqrt(a), 3);
    print_message("chi-square %.1f over %u cells (limit %.1f)\n", chi2, cells, q);
    assert_true(df >= 2);
    assert_true(chi2 < q);
    free(jobs);
    free(results);
}

/* ---- The draft model ---- */

/* A different model as the drafter (same vocabulary): greedy and sampled outputs unchanged, in a
 * batch with requests that do not draft. */
static void test_draft_model_identical(void **state) {
    (void)state;
    enum { N = 4 };
    int32_t prompts[N][80];
    job plain[N], spec[N];
    for (uint32_t i = 0; i < N; i++) {
        repetitive_prompt(prompts[i], 30 + 10 * i, 9 + i, 300 + i);
        plain[i] = (job){prompts[i], 30 + 10 * i, 28, i == 2 ? 0.8f : 0.0f, 0, 9 + i, 0, EMBER_SPEC_OFF};
        spec[i] = plain[i];
        spec[i].speculative = i == 3 ? EMBER_SPEC_OFF : EMBER_SPEC_DRAFT;
    }
    result want[N], got[N];
    run_alone((engine_setup){.block_tokens = 4}, plain, want, N);
    ember_engine *e = new_engine((engine_setup){.draft_model = DRAFT, .draft_max = 6, .block_tokens = 4});
    run_jobs(e, spec, got, N);
    ember_stats stats;
    ember_engine_stats(e, &stats);
    ember_engine_destroy(e);
    for (uint32_t i = 0; i < N; i++) assert_same_tokens(&want[i], &got[i]);
    assert_true(stats.draft_tokens > 0);
    assert_int_equal(got[3].timings.draft_tokens, 0);
    assert_int_equal(stats.kv_blocks_used, stats.kv_blocks_cached);
}

/* The model as its own drafter: the drafts are its own picks, so nearly all are accepted. */
static void test_self_draft_accepts(void **state) {
    (void)state;
    int32_t prompt[50];
    repetitive_prompt(prompt, 50, 50, 8);
    job plain = {prompt, 50, 60, 0.8f, 0, 4, 0, EMBER_SPEC_OFF};
    job spec = plain;
    spec.speculative = EMBER_SPEC_DRAFT;
    result want, got;
    run_alone((engine_setup){0}, &plain, &want, 1);
    ember_engine *e = new_engine((engine_setup){.draft_model = MODEL, .draft_max = 8});
    run_jobs(e, &spec, &got, 1);
    ember_engine_destroy(e);
    assert_same_tokens(&want, &got);
    assert_true(got.timings.draft_tokens >= 40);
    assert_true(got.timings.draft_accepted * 10 >= got.timings.draft_tokens * 9);
}

/* ---- Errors ---- */

static void test_bad_options(void **state) {
    (void)state;
    ember_options o;
    ember_options_default(&o);
    o.model_path = MODEL;
    o.device = "cpu";
    o.ctx_tokens = 256;
    ember_engine *e = NULL;
    o.draft_model_path = DRAFT_OTHER_VOCAB;
    ember_error *err = ember_engine_create(&o, &e);
    assert_non_null(err);
    assert_non_null(strstr(ember_error_message(err), "same vocabulary"));
    ember_error_free(err);
    o.draft_model_path = DIR "/missing.gguf";
    assert_non_null(err = ember_engine_create(&o, &e));
    assert_non_null(strstr(ember_error_message(err), "draft model"));
    ember_error_free(err);
    o.draft_model_path = NULL;
    o.speculative = EMBER_SPEC_DRAFT;
    assert_non_null(err = ember_engine_create(&o, &e));
    assert_non_null(strstr(ember_error_message(err), "needs a draft model"));
    ember_error_free(err);
    o.speculative = EMBER_SPEC_LOOKUP;
    o.draft_max = 2, o.draft_min = 3;
    assert_non_null(err = ember_engine_create(&o, &e));
    ember_error_free(err);
    /* A request that asks for a draft model the engine does not have. */
    o.draft_min = 0;
    assert_null(ember_engine_create(&o, &e));
    int32_t prompt[4] = {5, 6, 7, 8};
    job j = {prompt, 4, 4, 0, 0, 0, 0, EMBER_SPEC_DRAFT};
    ember_request_params p;
    ember_request_default(&p);
    p.prompt_ids = j.prompt, p.n_prompt_ids = 4, p.speculative = EMBER_SPEC_DRAFT;
    ember_request *r = NULL;
    assert_non_null(err = ember_submit(e, &p, &r));
    assert_non_null(strstr(ember_error_message(err), "draft model"));
    ember_error_free(err);
    p.speculative = 9;
    assert_non_null(err = ember_submit(e, &p, &r));
    ember_error_free(err);
    ember_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_rule),
        cmocka_unit_test(test_adapt_rule),
        cmocka_unit_test(test_least_from_costs),
        cmocka_unit_test(test_costs_measured),
        cmocka_unit_test(test_costly_draft_model_pauses),
        cmocka_unit_test(test_greedy_lookup_identical),
        cmocka_unit_test(test_lookup_without_matches_chains),
        cmocka_unit_test(test_mixed_batch_and_cache),
        cmocka_unit_test(test_no_drafts_above_max_seqs),
        cmocka_unit_test(test_lookups_without_matches_chain_together),
        cmocka_unit_test(test_sampled_lookup_identical),
        cmocka_unit_test(test_sampled_distribution),
        cmocka_unit_test(test_draft_model_identical),
        cmocka_unit_test(test_self_draft_accepts),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
