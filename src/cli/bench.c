/*
 * `ember bench`: engine measurements through the public API, on whatever device the engine picks.
 *
 *   ember bench -m M.gguf [--concurrency 1,2,4] [-n 64] [--prompt-tokens 300] [--rounds 3] [--warm-prompts]
 *       with N concurrent requests (distinct prompts, greedy, ignore EOS): generated = the mean tokens
 *       a request generated (-n, or fewer where a grammar ends it), client_tok_s = all
 *       generated tokens / the slowest request's wall time (prefill included, as a client sees it),
 *       sum_decode_tok_s = the sum of each request's engine-reported decode rate, host_cpu_cores = CPU
 *       seconds of the whole process (getrusage) over that wall time, cached_tokens = prompt tokens
 *       the prefix cache supplied; median over rounds. With --warm-prompts each round's prompts
 *       are first prefilled by one-token requests, so the measured requests find them in the prefix
 *       cache and all decode from the first steps on: the sum of decode rates is then the aggregate
 *       decode rate of N sequences, without other requests' prefill steps inside it.
 *   ember bench -m M.gguf --prefill 562,1971,8022 [--rounds 3]
 *       cold prefill of prompts of each length (distinct random prompts, so nothing comes from the
 *       prefix cache): the engine-reported prefill time, median over rounds after one warm-up.
 *   ember bench -m M.gguf --prefix-reuse [--doc-tokens 8022]
 *       the A → A' → B → A'' sequence: engine-reported prefill time and cached tokens of each
 *       request, against a cold prefill of A'' on a fresh engine.
 *
 * Speculative decoding (--spec lookup|draft, --draft-model, --draft-max, --draft-min, --spec-max-seqs) applies to
 * every request; with --prompt-period N each prompt repeats a random stretch of N tokens (text that
 * prompt lookup can draft from), and the concurrency lines add the drafted and accepted counts.
 *
 * Prompts are random token ids (no tokenizer work is measured). Output: one line per measurement,
 * "key=value" pairs, easy to paste into bench/RESULTS.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../bench/bench.h"
#include "cli.h"
#include "grammar/grammar.h"
#include "ember.h"

typedef struct bench_args {
    em_cli_model source; /* -m/--gguf or --hf: resolved into `model` */
    const char *model, *device;
    int concurrency[16], n_concurrency;
    int prefill[16], n_prefill;
    int n_generate, prompt_tokens, rounds, doc_tokens, threads, ctx;
    int prompt_period; /* 0: random prompts; else a random stretch of this many tokens, repeated */
    bool prefix_reuse, warm_prompts;
    const char *grammar_path; /* --grammar: every measured request follows this GBNF */
    const char *schema_path;  /* --json-schema: or a JSON value of this schema */
    char *grammar;
    em_cli_spec spec;
} bench_args;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The ids random prompts draw from: the first 32,000 (the same prompts on every large vocabulary, so
 * runs on different models compare), fewer on a smaller vocabulary. */
static int prompt_ids(ember_engine *e) {
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    return info.n_vocab < 32000 ? (int)info.n_vocab : 32000;
}

/* Random token ids in 3..n_ids-1 (past the usual control tokens); with period > 0, a random
 * stretch of `period` tokens repeated. */
static void random_prompt(int32_t *tokens, int n, uint64_t seed, int n_ids, int period) {
    for (int i = 0; i < n; i++) {
        if (period && i >= period) {
            tokens[i] = tokens[i - period];
            continue;
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = 3 + (int32_t)((seed >> 33) % (uint64_t)(n_ids - 3));
    }
}

static em_err submit_with(ember_engine *e, const int32_t *prompt, int n, int max_tokens, const char *grammar,
                          ember_request **out) {
    ember_request_params p;
    ember_request_default(&p);
    p.grammar = grammar;
    p.prompt_ids = prompt;
    p.n_prompt_ids = (size_t)n;
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0;
    p.ignore_eos = true;
    return ember_submit(e, &p, out);
}

static em_err submit(ember_engine *e, const int32_t *prompt, int n, int max_tokens, ember_request **out) {
    return submit_with(e, prompt, n, max_tokens, NULL, out);
}

/* Reads a request to its end; returns its tokens through `tokens` (room for max) and their count. */
static em_err drain(ember_request *r, int32_t *tokens, int max, int *n) {
    ember_output out;
    *n = 0;
    do {
        ember_request_next(r, &out, -1);
        for (size_t i = 0; i < out.n_tokens; i++)
            if (*n < max) tokens[(*n)++] = out.tokens[i].token;
    } while (out.finish == EMBER_FINISH_NONE);
    if (out.finish == EMBER_FINISH_ERROR) return em_errorf(EM_ERR_INTERNAL, "request failed: %s", out.error);
    return NULL;
}

/* Host CPU seconds of the whole process so far (all threads, user + system). */
static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

/* An engine whose KV cache holds `sequences` sequences of `ctx` tokens at once. */
static em_err create(const bench_args *a, int ctx, int sequences, ember_engine **e) {
    ember_options o;
    ember_options_default(&o);
    o.model_path = a->model;
    o.device = a->device;
    o.weights_memory = a->source.weights_memory;
    o.threads = a->threads;
    o.ctx_tokens = ctx;
    o.kv_sequences = sequences;
    em_err err = em_cli_spec_apply(&a->spec, &o);
    return err ? err : ember_engine_create(&o, e);
}

static em_err bench_concurrency(const bench_args *a) {
    ember_engine *e;
    int most = 1;
    for (int c = 0; c < a->n_concurrency; c++)
        if (a->concurrency[c] > most) most = a->concurrency[c];
    /* room for every request at once, and with --warm-prompts for the cached prompts beside them */
    em_err err = create(a, a->prompt_tokens + a->n_generate + 16, a->warm_prompts ? 2 * most : most, &e);
    if (err) return err;
    int32_t *prompts = malloc(sizeof(int32_t) * 16 * (size_t)a->prompt_tokens);
    int32_t *scratch = malloc(sizeof(int32_t) * (size_t)a->n_generate);
    if (!prompts || !scratch) err = em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    /* Warm-up: one short request (first-touch of KV memory, thread start-up). */
    ember_request *r;
    int n;
    if (!err) {
        random_prompt(prompts, a->prompt_tokens, 1, prompt_ids(e), a->prompt_period);
        if (!(err = submit(e, prompts, a->prompt_tokens, 4, &r))) err = drain(r, scratch, a->n_generate, &n), ember_request_release(r);
    }
    for (int c = 0; c < a->n_concurrency && !err; c++) {
        int clients = a->concurrency[c];
        double rates[64], slowest[64], client_rates[64], cores[64], cached[64], drafted[64], accepted[64], made[64];
        double steps[64], chained[64], chained_drafts[64];
        for (int round = 0; round < a->rounds && !err; round++) {
            ember_request *reqs[16] = {0};
            for (int i = 0; i < clients; i++)
                random_prompt(prompts + (size_t)i * a->prompt_tokens, a->prompt_tokens, 1000 * (uint64_t)round + (uint64_t)i + 7, prompt_ids(e),
                              a->prompt_period);
            for (int i = 0; i < clients && a->warm_prompts && !err; i++) {
                if (!(err = submit(e, prompts + (size_t)i * a->prompt_tokens, a->prompt_tokens, 1, &r)))
                    err = drain(r, scratch, a->n_generate, &n), ember_request_release(r);
            }
            double start = now_ms(), cpu_start = cpu_seconds();
            cached[round] = drafted[round] = accepted[round] = made[round] = 0;
            ember_stats before, after;
            ember_engine_stats(e, &before);
            for (int i = 0; i < clients && !err; i++)
                err = submit_with(e, prompts + (size_t)i * a->prompt_tokens, a->prompt_tokens, a->n_generate, a->grammar,
                                  &reqs[i]);
            double decode_rate = 0, worst = 0;
            for (int i = 0; i < clients; i++) {
                if (!reqs[i]) continue;
                if (!err) err = drain(reqs[i], scratch, a->n_generate, &n), made[round] += n;
                ember_timings t;
                ember_request_timings(reqs[i], &t);
                decode_rate += t.decode_tokens_per_second;
                cached[round] += t.cached_tokens;
                drafted[round] += t.draft_tokens;
                accepted[round] += t.draft_accepted;
                double wall = now_ms() - start;
                if (wall > worst) worst = wall;
                ember_request_release(reqs[i]);
            }
            ember_engine_stats(e, &after);
            steps[round] = (double)(after.steps - before.steps);
            chained[round] = (double)(after.overlapped_steps - before.overlapped_steps);
            chained_drafts[round] = (double)(after.draft_tokens_overlapped - before.draft_tokens_overlapped);
            rates[round] = decode_rate;
            cores[round] = worst > 0 ? (cpu_seconds() - cpu_start) / (worst / 1e3) : 0;
            slowest[round] = worst;
            /* the tokens the requests did generate: a grammar may end one before -n */
            client_rates[round] = worst > 0 ? made[round] / (worst / 1e3) : 0;
            made[round] /= clients;
        }
        if (!err)
            printf("concurrency=%d prompt_tokens=%d generated=%.0f client_tok_s=%.1f sum_decode_tok_s=%.1f "
                   "slowest_request_ms=%.0f host_cpu_cores=%.3f cached_tokens=%.0f warm_prompts=%d rounds=%d "
                   "drafted=%.0f accepted=%.0f steps=%.0f chained_steps=%.0f chained_drafts=%.0f\n",
                   clients, a->prompt_tokens, bench_median(made, a->rounds), bench_median(client_rates, a->rounds), bench_median(rates, a->rounds),
                   bench_median(slowest, a->rounds), bench_median(cores, a->rounds), bench_median(cached, a->rounds), a->warm_prompts,
                   a->rounds, bench_median(drafted, a->rounds), bench_median(accepted, a->rounds),
                   bench_median(steps, a->rounds), bench_median(chained, a->rounds),
                   bench_median(chained_drafts, a->rounds));
        fflush(stdout);
    }
    free(prompts);
    free(scratch);
    ember_engine_destroy(e);
    return err;
}

/* One request of the reuse sequence: prints the engine's figures and returns the output. */
static em_err reuse_step(ember_engine *e, const char *name, const int32_t *prompt, int n, int32_t *answer, int n_answer) {
    ember_request *r;
    em_err err = submit(e, prompt, n, n_answer, &r);
    if (err) return err;
    int got;
    err = drain(r, answer, n_answer, &got);
    ember_timings t;
    ember_request_timings(r, &t);
    ember_request_release(r);
    if (!err)
        printf("request=%s prompt_tokens=%u cached_tokens=%u prefill_ms=%.1f\n", name, t.prompt_tokens, t.cached_tokens,
               t.prefill_ms);
    fflush(stdout);
    return err;
}

static em_err bench_prefix_reuse(const bench_args *a) {
    const int doc = a->doc_tokens, answer = 16, more = 40;
    const int total = doc + 2 * (answer + more);
    int32_t *conv = malloc(sizeof(int32_t) * (size_t)total), *other = malloc(sizeof(int32_t) * (size_t)doc);
    if (!conv || !other) return em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    ember_engine *e;
    em_err err = create(a, total + 64, 0, &e);
    if (!err) {
        random_prompt(conv, total, 11, prompt_ids(e), 0);
        random_prompt(other, doc, 12, prompt_ids(e), 0);
    }
    if (!err) err = reuse_step(e, "A", conv, doc, conv + doc, answer);
    if (!err) err = reuse_step(e, "A'", conv, doc + answer + more, conv + doc + answer + more, answer);
    int32_t scratch[16];
    if (!err) err = reuse_step(e, "B", other, doc, scratch, answer);
    if (!err) err = reuse_step(e, "A''", conv, total, scratch, answer);
    if (e) ember_engine_destroy(e);
    e = NULL;
    if (!err) err = create(a, total + 64, 0, &e);
    if (!err) err = reuse_step(e, "A''-cold", conv, total, scratch, answer);
    if (e) ember_engine_destroy(e);
    free(conv);
    free(other);
    return err;
}

/* Up to 16 numbers in [lo, hi] separated by commas. */
static em_err bench_prefill(const bench_args *a) {
    int longest = 0;
    for (int i = 0; i < a->n_prefill; i++)
        if (a->prefill[i] > longest) longest = a->prefill[i];
    ember_engine *e;
    em_err err = create(a, longest + 16, 0, &e);
    if (err) return err;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)longest), scratch[1];
    if (!prompt) err = em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    ember_request *r;
    int n;
    /* Warm-up at the longest length: first-touch of KV memory, kernel loading. */
    if (!err) {
        random_prompt(prompt, longest, 3, prompt_ids(e), 0);
        if (!(err = submit(e, prompt, longest, 1, &r))) err = drain(r, scratch, 1, &n), ember_request_release(r);
    }
    for (int i = 0; i < a->n_prefill && !err; i++) {
        double ms[64];
        for (int round = 0; round < a->rounds && !err; round++) {
            random_prompt(prompt, a->prefill[i], 5000 + 100 * (uint64_t)i + (uint64_t)round, prompt_ids(e), 0);
            if ((err = submit(e, prompt, a->prefill[i], 1, &r))) break;
            err = drain(r, scratch, 1, &n);
            ember_timings t;
            ember_request_timings(r, &t);
            ember_request_release(r);
            if (!err && t.cached_tokens) err = em_errorf(EM_ERR_INTERNAL, "bench: a prefill prompt hit the cache");
            ms[round] = t.prefill_ms;
        }
        if (!err) {
            double m = bench_median(ms, a->rounds);
            printf("prefill_tokens=%d prefill_ms=%.1f tok_s=%.0f rounds=%d\n", a->prefill[i], m,
                   m > 0 ? a->prefill[i] / (m / 1e3) : 0.0, a->rounds);
        }
        fflush(stdout);
    }
    free(prompt);
    ember_engine_destroy(e);
    return err;
}

int em_cli_bench(int argc, char **argv) {
    bench_args a = {.n_generate = 64, .prompt_tokens = 300, .rounds = 3, .doc_tokens = 8022};
    a.concurrency[0] = 1, a.concurrency[1] = 2, a.concurrency[2] = 4, a.n_concurrency = 3;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--url") || !strcmp(argv[i], "--report")) {
            em_err err = em_bench_url(argc, argv); /* a server from the outside, or its report again */
            return err ? em_cli_fail("bench", err) : 0;
        }
    em_err err = NULL;
    for (int i = 1; i < argc && !err; i++) {
        const char *f = argv[i];
        if (em_cli_model_flag(&a.source, f)) continue;
        if (!strcmp(f, "--prefix-reuse") || !strcmp(f, "--warm-prompts") || !strcmp(f, "--ignore-eos")) {
            /* the flags without a value; --ignore-eos is what bench always does (every request
             * runs to -n), accepted so that command lines shared with `ember run` work */
            if (!strcmp(f, "--prefix-reuse")) a.prefix_reuse = true;
            else if (!strcmp(f, "--warm-prompts")) a.warm_prompts = true;
            continue;
        }
        if (i + 1 >= argc) {
            err = em_errorf(EM_ERR_INVALID, "%s needs a value (or is unknown)", f);
            break;
        }
        const char *v = argv[++i];
        if (em_cli_model_option(&a.source, f, v) || em_cli_spec_option(&a.spec, f, v, &err)) continue;
        if (!strcmp(f, "--device")) a.device = v;
        else if (!strcmp(f, "--grammar")) a.grammar_path = v;
        else if (!strcmp(f, "--json-schema")) a.schema_path = v;
        else if (!strcmp(f, "--prompt-period")) err = bench_parse_int(f, v, 1, 1 << 20, &a.prompt_period);
        else if (!strcmp(f, "--concurrency")) err = bench_parse_list(f, v, 1, 16, a.concurrency, &a.n_concurrency);
        else if (!strcmp(f, "--prefill")) err = bench_parse_list(f, v, 1, 1 << 20, a.prefill, &a.n_prefill);
        else if (!strcmp(f, "-n")) err = bench_parse_int(f, v, 1, 1 << 20, &a.n_generate);
        else if (!strcmp(f, "--prompt-tokens")) err = bench_parse_int(f, v, 1, 1 << 20, &a.prompt_tokens);
        else if (!strcmp(f, "--rounds")) err = bench_parse_int(f, v, 1, 64, &a.rounds);
        else if (!strcmp(f, "--doc-tokens")) err = bench_parse_int(f, v, 16, 1 << 20, &a.doc_tokens);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) err = bench_parse_int(f, v, 1, 1024, &a.threads);
        else err = em_errorf(EM_ERR_INVALID, "unknown option '%s'", f);
    }
    if (!err && !a.source.file && !a.source.hf)
        err = em_errorf(EM_ERR_INVALID, "usage: ember bench (-m MODEL.gguf | --hf ORG/NAME[:QUANT]) [--concurrency 1,2,4] [-n N] "
                                                        "[--prompt-tokens N] [--prompt-period N] [--grammar G.gbnf | --json-schema S.json] [--rounds N] [--warm-prompts] [--ignore-eos] "
                                                        "[--spec off|lookup|draft] [--draft-model F] [--draft-max N] [--draft-min N] [--spec-max-seqs N] | --prefill N,N,... | --prefix-reuse [--doc-tokens N]");
    if (!err) err = em_cli_model_path(&a.source, &a.model);
    if (!err && a.grammar_path && a.schema_path) err = em_errorf(EM_ERR_INVALID, "give --grammar or --json-schema, not both");
    if (!err && a.grammar_path) {
        size_t len = 0;
        if ((err = em_cli_read_file(a.grammar_path, &a.grammar, &len))) err = em_err_prefix(err, "--grammar");
    }
    if (!err && a.schema_path) {
        char *schema = NULL;
        size_t len = 0;
        if (!(err = em_cli_read_file(a.schema_path, &schema, &len))) {
            err = em_grammar_from_json_schema(schema, len, &a.grammar);
            if (err) err = em_err_prefix(err, "%s", a.schema_path);
        }
        free(schema);
    }
    if (!err) err = a.prefix_reuse ? bench_prefix_reuse(&a) : a.n_prefill ? bench_prefill(&a) : bench_concurrency(&a);
    em_cli_model_free(&a.source);
    free(a.grammar);
    return err ? em_cli_fail("bench", err) : 0;
}
