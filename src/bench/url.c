/*
 * `ember bench --url URL`: the suite against a running server, from the outside (bench.h).
 *
 *   ember bench --url URL [--api openai|anthropic|completions] [--model NAME] [--api-key KEY]
 *               [--compare URL2] [--ban-tokens FROM-TO]
 *               [--concurrency 1,2,4,8,16] [-n 256] [--prompt-tokens 300] [--warm-prompts]
 *               [--prefill 562,1971,8022,9289] [--doc-tokens 8022] [--rounds 3]
 *               [--sections concurrency,prefill,switch] [--out DIR]
 *   ember bench --report DIR/results.json --out DIR2   (the report of earlier results, again)
 *
 * Prompts of a given token length. The prompt is "Session NNNNNNNN." (eight random digits: a
 * distinct start, so no server finds it in a prefix cache, and the same token count whatever the
 * digits, as tokenizers split digit runs alike) followed by words of a fixed list and, to hit the
 * length exactly, single-token filler words. The words are counted with the server's own tokenizer:
 * `POST /v1/messages/count_tokens` where the server has it (Ember; it counts the whole chat prompt),
 * else `POST /tokenize` (llama.cpp's server, vLLM) plus the chat template's tokens measured once
 * from one request's usage, else the usage of one-token requests (each under another session
 * number, so the probes leave nothing in the cache that the measured request could use). The words
 * are searched once per length; every request then differs only in its session number. What the
 * server reports as prompt tokens is kept with every sample, so a miss shows.
 *
 * With --compare, each measurement alternates the servers round by round (A then B, then B then A),
 * so that neither always runs first.
 */
#include <curl/curl.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench.h"

enum { SECTION_CONCURRENCY = 1, SECTION_PREFILL = 2, SECTION_SWITCH = 4 };
enum { SWITCH_ANSWER_TOKENS = 16 };

typedef enum count_method { COUNT_MESSAGES, COUNT_TOKENIZE, COUNT_USAGE } count_method;
static const char *const count_method_names[] = {"count_tokens", "tokenize+template", "usage"};

/* A server under test with what the suite learned about it. */
typedef struct server_state {
    bench_target target;
    char url[1024]; /* target.url: the URL given, without a trailing slash */
    count_method method;
    int template_tokens; /* COUNT_TOKENIZE: chat prompt tokens beyond the text's own */
} server_state;

typedef struct url_args {
    server_state servers[2];
    int n_servers;
    int concurrency[16], n_concurrency;
    int prefill[16], n_prefill;
    int n_generate, prompt_tokens, rounds, doc_tokens, sections;
    bool warm_prompts;
    const char *ban_tokens; /* --ban-tokens FROM-TO, as given */
    json_t *logit_bias;     /* its logit_bias object */
    const char *out_dir;
    const char *report_from; /* --report: a results.json to draw again */
    uint64_t random; /* the session-number generator */
    json_t *results;
} url_args;

/* A prompt shape: this many list words and filler words give the asked token count (`tokens`
 * as counted) after any session number. */
typedef struct prompt_shape {
    int words, fillers, tokens;
} prompt_shape;

/* Common English words; most are one token with a leading space in every current vocabulary. */
static const char *const word_list[] = {
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state",
    "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company", "system",
    "program", "question", "work", "government", "number", "night", "point", "home", "water", "room", "mother",
    "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business",
    "issue", "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game", "line", "end",
    "member", "law", "car", "city", "community", "name", "president", "team", "minute", "idea", "kid", "body",
    "information", "back", "parent", "face", "others", "level", "office", "door", "health", "person", "art", "war",
    "history", "party", "result", "change", "morning", "reason", "research", "girl", "guy", "moment", "air",
    "teacher", "force", "education", "river", "stone", "light", "music", "garden", "market", "paper", "road",
};
#define WORD_COUNT (int)(sizeof word_list / sizeof word_list[0])

static uint64_t next_random(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 33;
}

/* "Session NNNNNNNN. w w w ... a a a" with the words drawn from `seed` (the same seed, the same
 * words). Returns malloc'd text or NULL. */
static char *prompt_text(uint32_t session, uint64_t seed, int words, int fillers) {
    em_buf b = {0};
    bool ok = em_buf_printf(&b, "Session %08u.", session % 100000000u);
    for (int i = 0; i < words && ok; i++) ok = em_buf_printf(&b, " %s", word_list[next_random(&seed) % WORD_COUNT]);
    for (int i = 0; i < fillers && ok; i++) ok = em_buf_append(&b, " a", 2);
    if (!ok) em_buf_free(&b);
    return b.data;
}

static uint32_t new_session(url_args *a) {
    return (uint32_t)next_random(&a->random);
}

static json_t *user_turn(const char *text) {
    return json_pack("[{s:s, s:s}]", "role", "user", "content", text);
}

static const char *generate_path(const bench_target *t) {
    return t->api == BENCH_API_ANTHROPIC     ? "/v1/messages"
           : t->api == BENCH_API_COMPLETIONS ? "/v1/completions"
                                             : "/v1/chat/completions";
}

/* The prompt tokens the server counts for one user turn of `text`. */
static em_err count_tokens(server_state *s, url_args *a, const char *text, int *tokens) {
    long status;
    json_t *reply = NULL, *messages = user_turn(text);
    em_err err = NULL;
    char *body = NULL;
    if (s->method == COUNT_MESSAGES) {
        json_t *req = json_pack("{s:s, s:O}", "model", s->target.model, "messages", messages);
        body = req ? json_dumps(req, JSON_COMPACT) : NULL;
        json_decref(req);
        if (body) err = bench_request(&s->target, "/v1/messages/count_tokens", body, &status, &reply);
        *tokens = json_is_integer(json_object_get(reply, "input_tokens"))
                      ? (int)json_integer_value(json_object_get(reply, "input_tokens")) : -1;
    } else if (s->method == COUNT_TOKENIZE) {
        /* llama.cpp's server reads "content", vLLM "prompt" (and answers with a "count") */
        json_t *req = json_pack("{s:s, s:s, s:s}", "content", text, "prompt", text, "model", s->target.model);
        body = req ? json_dumps(req, JSON_COMPACT) : NULL;
        json_decref(req);
        if (body) err = bench_request(&s->target, "/tokenize", body, &status, &reply);
        json_t *ids = json_object_get(reply, "tokens"), *count = json_object_get(reply, "count");
        *tokens = json_is_integer(count) ? (int)json_integer_value(count)
                  : json_is_array(ids)   ? (int)json_array_size(ids) : -1;
        if (*tokens >= 0) *tokens += s->template_tokens;
    } else {
        /* one generated token; the caller's session number keeps it out of later requests' way */
        body = bench_body(&s->target, messages, 1, true);
        bench_sample sample = {0};
        if (body) err = bench_stream(&s->target, generate_path(&s->target), &body, 1, &sample);
        if (!err && sample.error[0]) err = em_errorf(EM_ERR_IO, "%s", sample.error);
        *tokens = err ? -1 : sample.prompt_tokens;
        bench_samples_clear(&sample, 1);
        status = 200;
    }
    if (!body && !err) err = em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    if (!err && *tokens < 0)
        err = em_errorf(EM_ERR_FORMAT, "%s: counting prompt tokens (%s) gave HTTP %ld and no count", s->target.url,
                        count_method_names[s->method], status);
    free(body);
    json_decref(reply);
    json_decref(messages);
    return err;
}

/* Picks the way to count prompt tokens on this server (see the file comment). */
static em_err choose_count_method(server_state *s, url_args *a) {
    int n;
    em_err err;
    /* count_tokens counts a chat prompt: not what a plain-text completion sends */
    if (s->target.api != BENCH_API_COMPLETIONS) {
        s->method = COUNT_MESSAGES;
        if (!(err = count_tokens(s, a, "Session 00000000. hello", &n))) return NULL;
        em_err_free(err);
    }
    s->method = COUNT_TOKENIZE;
    s->template_tokens = 0;
    if ((err = count_tokens(s, a, "Session 00000000. hello", &n))) {
        em_err_free(err);
        s->method = COUNT_USAGE;
        return NULL;
    }
    /* the chat template's own tokens: one request's usage against the bare text's count */
    char *text = prompt_text(new_session(a), 1, 8, 0);
    json_t *messages = text ? user_turn(text) : NULL;
    char *body = messages ? bench_body(&s->target, messages, 1, true) : NULL;
    bench_sample sample = {0};
    err = body ? bench_stream(&s->target, generate_path(&s->target), &body, 1, &sample)
               : em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    if (!err && sample.error[0]) err = em_errorf(EM_ERR_IO, "%s", sample.error);
    if (!err && sample.prompt_tokens < 0) s->method = COUNT_USAGE; /* no usage either: counts by usage fail later */
    else if (!err && !(err = count_tokens(s, a, text, &n))) s->template_tokens = sample.prompt_tokens - n;
    bench_samples_clear(&sample, 1);
    free(body);
    free(text);
    json_decref(messages);
    return err;
}

static em_err count_shape(server_state *s, url_args *a, uint64_t seed, int words, int fillers, int *tokens) {
    char *text = prompt_text(new_session(a), seed, words, fillers);
    if (!text) return em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    em_err err = count_tokens(s, a, text, tokens);
    free(text);
    return err;
}

/* Finds how many list words (then filler words) make `goal` prompt tokens on this server. */
static em_err find_shape(server_state *s, url_args *a, uint64_t seed, int goal, prompt_shape *shape) {
    int base, n;
    em_err err = count_shape(s, a, seed, 0, 0, &base);
    if (err) return err;
    if (base >= goal)
        return em_errorf(EM_ERR_RANGE, "%s: a prompt of %d tokens is shorter than the chat template's %d", s->target.url,
                         goal, base);
    /* the words: a secant search from about 1.3 tokens a word, between the most words known to fit
     * (`best`) and the fewest known to overshoot (`over`), so it ends when they are neighbours */
    int words = (int)((goal - base) / 1.3) + 1, best = 0, best_tokens = base, over = INT_MAX;
    for (int step = 0; step < 16 && best + 1 < over; step++) {
        if ((err = count_shape(s, a, seed, words, 0, &n))) return err;
        if (n <= goal) best = words, best_tokens = n;
        else over = words;
        if (n == goal) break;
        double per_word = words ? (double)(n - base) / words : 1.3;
        int next = words + (int)lround((goal - n) / (per_word > 0.5 ? per_word : 0.5));
        if (next <= best) next = best + 1;
        if (next >= over) next = over - 1;
        words = next;
    }
    /* the fillers: one token each in the usual case; corrected from the count otherwise */
    int fillers = goal - best_tokens;
    for (int step = 0; step < 4 && fillers > 0; step++) {
        if ((err = count_shape(s, a, seed, best, fillers, &n))) return err;
        if (n == goal) break;
        fillers += goal - n;
        if (fillers < 0) fillers = 0;
    }
    if ((err = count_shape(s, a, seed, best, fillers, &n))) return err;
    *shape = (prompt_shape){.words = best, .fillers = fillers, .tokens = n};
    if (n != goal) fprintf(stderr, "ember bench: %s: a prompt of %d tokens asked, %d made\n", s->target.url, goal, n);
    return NULL;
}

/* ---- Samples into JSON ---- */

static json_t *number_or_null(double v) {
    return v < 0 ? json_null() : json_real(v);
}

static json_t *count_or_null(int v) {
    return v < 0 ? json_null() : json_integer(v);
}

static json_t *sample_json(const bench_sample *s) {
    json_t *o = json_object();
    json_object_set_new(o, "prompt_tokens", count_or_null(s->prompt_tokens));
    json_object_set_new(o, "cached_tokens", count_or_null(s->cached_tokens));
    json_object_set_new(o, "completion_tokens", count_or_null(s->completion_tokens));
    json_object_set_new(o, "content_chunks", json_integer(s->content_chunks));
    json_object_set_new(o, "first_token_ms", number_or_null(s->first_token_ms));
    json_object_set_new(o, "total_ms", number_or_null(s->total_ms));
    json_object_set_new(o, "server_prefill_ms", number_or_null(s->server_prefill_ms));
    json_object_set_new(o, "server_decode_tok_s", number_or_null(s->server_decode_tok_s));
    return o;
}

/* Runs `n` requests of one user turn each at once; fails on the first request that failed. */
static em_err run_turns(server_state *s, char **texts, int n, int max_tokens, bench_sample *samples) {
    char **bodies = calloc((size_t)n, sizeof *bodies);
    em_err err = bodies ? NULL : em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    for (int i = 0; i < n && !err; i++) {
        json_t *m = user_turn(texts[i]);
        if (!m || !(bodies[i] = bench_body(&s->target, m, max_tokens, true)))
            err = em_errorf(EM_ERR_NOMEM, "bench: out of memory");
        json_decref(m);
    }
    if (!err) err = bench_stream(&s->target, generate_path(&s->target), bodies, n, samples);
    for (int i = 0; i < n && !err; i++)
        if (samples[i].error[0]) err = em_errorf(EM_ERR_IO, "%s", samples[i].error);
    if (err && bodies && samples) bench_samples_clear(samples, n);
    for (int i = 0; bodies && i < n; i++) free(bodies[i]);
    free(bodies);
    return err;
}

/* The server order of round `round`: A B, then B A, ... */
static int server_of(const url_args *a, int round, int k) {
    return a->n_servers == 2 && round % 2 ? 1 - k : k;
}

/* ---- Concurrency ---- */

static em_err concurrency_round(url_args *a, int si, int clients, const prompt_shape *shape, int round) {
    server_state *s = &a->servers[si];
    char *texts[16] = {0};
    bench_sample samples[16];
    em_err err = NULL;
    for (int i = 0; i < clients && !err; i++)
        if (!(texts[i] = prompt_text(new_session(a), 100, shape->words, shape->fillers)))
            err = em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    if (!err && a->warm_prompts && !(err = run_turns(s, texts, clients, 1, samples))) bench_samples_clear(samples, clients);
    if (!err) err = run_turns(s, texts, clients, a->n_generate, samples);
    for (int i = 0; i < clients; i++) free(texts[i]);
    if (err) return err;
    double slowest = 0, first[16], worst_first = 0;
    long generated = 0;
    json_t *requests = json_array();
    for (int i = 0; i < clients; i++) {
        if (samples[i].total_ms > slowest) slowest = samples[i].total_ms;
        if (samples[i].first_token_ms > worst_first) worst_first = samples[i].first_token_ms;
        first[i] = samples[i].first_token_ms;
        generated += samples[i].completion_tokens >= 0 ? samples[i].completion_tokens : samples[i].content_chunks;
        json_array_append_new(requests, sample_json(&samples[i]));
    }
    bench_samples_clear(samples, clients);
    double aggregate = slowest > 0 ? generated / (slowest / 1e3) : 0, first_median = bench_median(first, clients);
    json_array_append_new(json_object_get(a->results, "concurrency"),
                          json_pack("{s:i, s:i, s:i, s:I, s:f, s:f, s:f, s:f, s:o}", "server", si, "clients", clients,
                                    "round", round, "generated_tokens", (json_int_t)generated, "aggregate_tok_s",
                                    aggregate, "slowest_ms", slowest, "first_token_ms_median", first_median,
                                    "first_token_ms_max", worst_first, "requests", requests));
    printf("server=%d clients=%d round=%d generated=%ld aggregate_tok_s=%.1f slowest_request_ms=%.0f "
           "first_token_ms=%.0f\n", si, clients, round, generated, aggregate, slowest, first_median);
    fflush(stdout);
    return NULL;
}

static em_err run_concurrency(url_args *a) {
    prompt_shape shapes[2];
    em_err err = NULL;
    for (int si = 0; si < a->n_servers && !err; si++) err = find_shape(&a->servers[si], a, 100, a->prompt_tokens, &shapes[si]);
    for (int c = 0; c < a->n_concurrency && !err; c++)
        for (int round = 0; round < a->rounds && !err; round++)
            for (int k = 0; k < a->n_servers && !err; k++) {
                int si = server_of(a, round, k);
                err = concurrency_round(a, si, a->concurrency[c], &shapes[si], round);
            }
    return err;
}

/* ---- Cold prefill ---- */

static em_err prefill_once(url_args *a, int si, const prompt_shape *shape, int asked, int round, bool record) {
    char *text = prompt_text(new_session(a), 200 + (uint64_t)asked, shape->words, shape->fillers);
    if (!text) return em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    bench_sample sample;
    em_err err = run_turns(&a->servers[si], &text, 1, 1, &sample);
    free(text);
    if (err || !record) {
        if (!err) bench_samples_clear(&sample, 1);
        return err;
    }
    json_array_append_new(json_object_get(a->results, "prefill"),
                          json_pack("{s:i, s:i, s:i, s:o}", "server", si, "prompt_tokens_asked", asked, "round", round,
                                    "request", sample_json(&sample)));
    printf("server=%d prefill_tokens=%d round=%d prompt_tokens=%d cached_tokens=%d first_token_ms=%.1f "
           "server_prefill_ms=%.1f\n", si, asked, round, sample.prompt_tokens, sample.cached_tokens,
           sample.first_token_ms, sample.server_prefill_ms);
    fflush(stdout);
    bench_samples_clear(&sample, 1);
    return NULL;
}

static em_err run_prefill(url_args *a) {
    prompt_shape shapes[2][16];
    em_err err = NULL;
    int longest = 0;
    for (int i = 0; i < a->n_prefill; i++)
        if (a->prefill[i] > a->prefill[longest]) longest = i;
    for (int si = 0; si < a->n_servers && !err; si++)
        for (int i = 0; i < a->n_prefill && !err; i++)
            err = find_shape(&a->servers[si], a, 200 + (uint64_t)a->prefill[i], a->prefill[i], &shapes[si][i]);
    /* a warm-up at the longest length: the first long prompt pays for first-touch of memory */
    for (int si = 0; si < a->n_servers && !err; si++)
        err = prefill_once(a, si, &shapes[si][longest], a->prefill[longest], -1, false);
    for (int i = 0; i < a->n_prefill && !err; i++)
        for (int round = 0; round < a->rounds && !err; round++)
            for (int k = 0; k < a->n_servers && !err; k++) {
                int si = server_of(a, round, k);
                err = prefill_once(a, si, &shapes[si][i], a->prefill[i], round, true);
            }
    return err;
}

/* ---- The conversation switch: A, A' (A continued), B (another document), A'' (A continued
 * again), and A'' cold (the same conversation under another session number) ---- */

static const char *const questions[] = {
    "Question: which of the words above comes up most often, and what does that say about the text?",
    "Follow-up: list three of the words above that name places, and three that name people, and say why you "
    "picked them in one sentence each.",
    "Last question: write a title for the text above in five words, then explain the title in two sentences.",
};

static json_t *message(const char *role, const char *content) {
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* Sends `conversation` and appends the answer to it as the assistant's turn. */
static em_err switch_step(url_args *a, int si, json_t *conversation, const char *step, int round) {
    server_state *s = &a->servers[si];
    char *body = bench_body(&s->target, conversation, SWITCH_ANSWER_TOKENS, true);
    if (!body) return em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    bench_sample sample;
    em_err err = bench_stream(&s->target, generate_path(&s->target), &body, 1, &sample);
    free(body);
    if (!err && sample.error[0]) err = em_errorf(EM_ERR_IO, "%s", sample.error);
    if (!err) {
        json_array_append_new(conversation, message("assistant", sample.text));
        json_array_append_new(json_object_get(a->results, "switch"),
                              json_pack("{s:i, s:s, s:i, s:o}", "server", si, "step", step, "round", round, "request",
                                        sample_json(&sample)));
        printf("server=%d step=%s round=%d prompt_tokens=%d cached_tokens=%d first_token_ms=%.1f server_prefill_ms=%.1f\n",
               si, step, round, sample.prompt_tokens, sample.cached_tokens, sample.first_token_ms,
               sample.server_prefill_ms);
        fflush(stdout);
    }
    bench_samples_clear(&sample, 1);
    return err;
}

/* A conversation that starts with a document of the shape's length and the first question. */
static json_t *document_turn(url_args *a, const prompt_shape *shape, uint64_t seed) {
    char *doc = prompt_text(new_session(a), seed, shape->words, shape->fillers);
    em_buf b = {0};
    json_t *conversation = NULL;
    if (doc && em_buf_printf(&b, "%s\n\n%s", doc, questions[0])) conversation = json_pack("[o]", message("user", b.data));
    free(doc);
    em_buf_free(&b);
    return conversation;
}

static em_err switch_round(url_args *a, int si, const prompt_shape *shape, int round) {
    json_t *conv_a = document_turn(a, shape, 300), *conv_b = document_turn(a, shape, 301);
    json_t *cold = NULL;
    em_err err = conv_a && conv_b ? NULL : em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    if (!err) err = switch_step(a, si, conv_a, "A", round);
    if (!err) json_array_append_new(conv_a, message("user", questions[1]));
    if (!err) err = switch_step(a, si, conv_a, "A'", round);
    if (!err) err = switch_step(a, si, conv_b, "B", round);
    if (!err) {
        json_array_append_new(conv_a, message("user", questions[2]));
        /* the cold twin: the same turns after a document under a new session number */
        cold = json_deep_copy(conv_a);
        json_t *fresh = document_turn(a, shape, 300);
        if (!cold || !fresh) err = em_errorf(EM_ERR_NOMEM, "bench: out of memory");
        else json_array_set(cold, 0, json_array_get(fresh, 0));
        json_decref(fresh);
    }
    if (!err) err = switch_step(a, si, conv_a, "A''", round);
    if (!err) err = switch_step(a, si, cold, "A''-cold", round);
    json_decref(conv_a);
    json_decref(conv_b);
    json_decref(cold);
    return err;
}

static em_err run_switch(url_args *a) {
    prompt_shape shapes[2];
    em_err err = NULL;
    for (int si = 0; si < a->n_servers && !err; si++) err = find_shape(&a->servers[si], a, 300, a->doc_tokens, &shapes[si]);
    for (int round = 0; round < a->rounds && !err; round++)
        for (int k = 0; k < a->n_servers && !err; k++) {
            int si = server_of(a, round, k);
            err = switch_round(a, si, &shapes[si], round);
        }
    return err;
}

/* ---- Setup ---- */

/* The served model's id (when --model is not given), and the way to count its tokens. */
static em_err probe_server(url_args *a, server_state *s) {
    long status;
    json_t *reply;
    em_err err = bench_request(&s->target, "/v1/models", NULL, &status, &reply);
    if (err) return err;
    if (!s->target.model[0]) {
        const char *id = json_string_value(json_object_get(json_array_get(json_object_get(reply, "data"), 0), "id"));
        const char *why = json_string_value(json_object_get(json_object_get(reply, "error"), "message"));
        if (status != 200 || !id)
            err = em_errorf(EM_ERR_FORMAT, "%s/v1/models answered HTTP %ld without a model id (%s); name one with --model",
                            s->target.url, status, why ? why : "no error message");
        else snprintf(s->target.model, sizeof s->target.model, "%s", id);
    }
    json_decref(reply);
    if (!err) err = choose_count_method(s, a);
    return err;
}

/* Creates `dir` and any missing folders above it, as mkdir -p. */
static em_err make_folders(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return em_errorf(EM_ERR_INVALID, "--out: path too long");
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p) continue;
        char was = *p;
        *p = 0;
        if (mkdir(path, 0777) && errno != EEXIST) return em_errorf(EM_ERR_IO, "cannot create %s: %s", path, strerror(errno));
        if (!(*p = was)) return NULL;
    }
}

/* --report: the HTML page of an earlier results.json, into --out. */
static em_err report_again(const url_args *a) {
    json_error_t jerr;
    json_t *results = json_load_file(a->report_from, 0, &jerr);
    if (!json_is_object(results)) {
        json_decref(results);
        return em_errorf(EM_ERR_FORMAT, "%s:%d: not a results.json of ember bench: %s", a->report_from, jerr.line,
                         jerr.text);
    }
    em_err err = make_folders(a->out_dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/report.html", a->out_dir);
    if (!err) err = bench_report_write(results, path);
    json_decref(results);
    return err;
}

static em_err write_results(const url_args *a) {
    em_err err = make_folders(a->out_dir);
    if (err) return err;
    char path[4096];
    snprintf(path, sizeof path, "%s/results.json", a->out_dir);
    if (json_dump_file(a->results, path, JSON_INDENT(1) | JSON_SORT_KEYS))
        return em_errorf(EM_ERR_IO, "cannot write %s", path);
    snprintf(path, sizeof path, "%s/report.html", a->out_dir);
    return bench_report_write(a->results, path);
}

static json_t *settings_json(const url_args *a) {
    json_t *conc = json_array(), *pre = json_array();
    for (int i = 0; i < a->n_concurrency; i++) json_array_append_new(conc, json_integer(a->concurrency[i]));
    for (int i = 0; i < a->n_prefill; i++) json_array_append_new(pre, json_integer(a->prefill[i]));
    json_t *s = json_pack("{s:o, s:o, s:i, s:i, s:i, s:i, s:b, s:i}", "concurrency", conc, "prefill", pre, "max_tokens",
                          a->n_generate, "prompt_tokens", a->prompt_tokens, "doc_tokens", a->doc_tokens, "rounds",
                          a->rounds, "warm_prompts", a->warm_prompts, "switch_answer_tokens", SWITCH_ANSWER_TOKENS);
    if (s && a->ban_tokens) json_object_set_new(s, "ban_tokens", json_string(a->ban_tokens));
    return s;
}

/* --ban-tokens FROM-TO: token ids FROM..TO (at most 1,024 of them) get a logit bias of -100 in
 * every generating request, for both servers (e.g. a random-weight model's byte tokens, whose
 * invalid UTF-8 some servers' output parsers reject). */
static em_err parse_ban(const char *v, url_args *a) {
    int from, to, used = 0;
    if (sscanf(v, "%d-%d%n", &from, &to, &used) != 2 || v[used] || from < 0 || to < from || to - from >= 1024)
        return em_errorf(EM_ERR_INVALID, "--ban-tokens expects FROM-TO, at most 1024 token ids, got '%s'", v);
    json_decref(a->logit_bias);
    if (!(a->logit_bias = json_object())) return em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    for (int t = from; t <= to; t++) {
        char id[16];
        snprintf(id, sizeof id, "%d", t);
        if (json_object_set_new(a->logit_bias, id, json_integer(-100))) return em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    }
    a->ban_tokens = v;
    return NULL;
}

static em_err parse_sections(const char *v, int *sections) {
    *sections = 0;
    char copy[128];
    snprintf(copy, sizeof copy, "%s", v);
    for (char *save, *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        if (!strcmp(p, "concurrency")) *sections |= SECTION_CONCURRENCY;
        else if (!strcmp(p, "prefill")) *sections |= SECTION_PREFILL;
        else if (!strcmp(p, "switch")) *sections |= SECTION_SWITCH;
        else return em_errorf(EM_ERR_INVALID, "--sections: unknown section '%s' (concurrency, prefill, switch)", p);
    }
    return *sections ? NULL : em_errorf(EM_ERR_INVALID, "--sections names none of concurrency, prefill, switch");
}

static em_err parse_args(int argc, char **argv, url_args *a) {
    bench_api api = BENCH_API_OPENAI;
    const char *model = NULL, *key = NULL;
    a->n_servers = 0; /* --url and --compare add them */
    em_err err = NULL;
    for (int i = 1; i < argc && !err; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--warm-prompts") || !strcmp(f, "--ignore-eos")) {
            if (!strcmp(f, "--warm-prompts")) a->warm_prompts = true;
            continue;
        }
        if (i + 1 >= argc) return em_errorf(EM_ERR_INVALID, "%s needs a value (or is unknown)", f);
        const char *v = argv[++i];
        if (!strcmp(f, "--report")) a->report_from = v;
        else if (!strcmp(f, "--url")) a->servers[0].target.url = v, a->n_servers = a->n_servers > 1 ? 2 : 1;
        else if (!strcmp(f, "--compare")) a->servers[1].target.url = v, a->n_servers = 2;
        else if (!strcmp(f, "--model")) model = v;
        else if (!strcmp(f, "--api-key")) key = v;
        else if (!strcmp(f, "--out")) a->out_dir = v;
        else if (!strcmp(f, "--ban-tokens")) err = parse_ban(v, a);
        else if (!strcmp(f, "--api")) {
            if (!strcmp(v, "openai")) api = BENCH_API_OPENAI;
            else if (!strcmp(v, "anthropic")) api = BENCH_API_ANTHROPIC;
            else if (!strcmp(v, "completions")) api = BENCH_API_COMPLETIONS;
            else err = em_errorf(EM_ERR_INVALID, "--api expects openai, anthropic or completions, got '%s'", v);
        } else if (!strcmp(f, "--concurrency")) err = bench_parse_list(f, v, 1, 16, a->concurrency, &a->n_concurrency);
        else if (!strcmp(f, "--prefill")) err = bench_parse_list(f, v, 1, 1 << 20, a->prefill, &a->n_prefill);
        else if (!strcmp(f, "-n")) err = bench_parse_int(f, v, 1, 1 << 20, &a->n_generate);
        else if (!strcmp(f, "--prompt-tokens")) err = bench_parse_int(f, v, 1, 1 << 20, &a->prompt_tokens);
        else if (!strcmp(f, "--doc-tokens")) err = bench_parse_int(f, v, 16, 1 << 20, &a->doc_tokens);
        else if (!strcmp(f, "--rounds")) err = bench_parse_int(f, v, 1, 64, &a->rounds);
        else if (!strcmp(f, "--sections")) err = parse_sections(v, &a->sections);
        else err = em_errorf(EM_ERR_INVALID, "unknown option '%s' (with --url)", f);
    }
    if (!err && a->report_from) return a->out_dir ? NULL : em_errorf(EM_ERR_INVALID, "--report needs --out DIR");
    if (!err && !a->servers[0].target.url) return em_errorf(EM_ERR_INVALID, "--url needs a server URL (http://host:port)");
    for (int si = 0; si < a->n_servers && !err; si++) {
        server_state *s = &a->servers[si];
        bench_target *t = &s->target;
        if (strncmp(t->url, "http://", 7) && strncmp(t->url, "https://", 8))
            err = em_errorf(EM_ERR_INVALID, "%s: a server URL starts with http:// or https://, got '%s'",
                            si ? "--compare" : "--url", t->url);
        else if (strlen(t->url) >= sizeof s->url)
            err = em_errorf(EM_ERR_INVALID, "%s: a URL of %zu characters is too long", si ? "--compare" : "--url",
                            strlen(t->url));
        if (err) break;
        size_t n = strlen(t->url);
        while (n && t->url[n - 1] == '/') n--; /* the API paths are appended to it */
        snprintf(s->url, sizeof s->url, "%.*s", (int)n, t->url);
        t->url = s->url;
        t->api = api;
        t->logit_bias = a->logit_bias;
        t->api_key = key ? key : getenv("EMBER_API_KEY");
        if (model) snprintf(t->model, sizeof t->model, "%s", model);
    }
    return err;
}

em_err em_bench_url(int argc, char **argv) {
    url_args a = {.n_generate = 256, .prompt_tokens = 300, .rounds = 3, .doc_tokens = 8022,
                  .concurrency = {1, 2, 4, 8, 16}, .n_concurrency = 5, .prefill = {562, 1971, 8022, 9289},
                  .n_prefill = 4, .sections = SECTION_CONCURRENCY | SECTION_PREFILL | SECTION_SWITCH};
    a.random = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    em_err err = parse_args(argc, argv, &a);
    if (!err && a.report_from) {
        err = report_again(&a);
        json_decref(a.logit_bias);
        curl_global_cleanup();
        return err;
    }
    if (!err) {
        a.results = json_pack("{s:i, s:s, s:o, s:[], s:[], s:[], s:[]}", "version", 1, "tool", "ember bench --url",
                              "settings", settings_json(&a), "servers", "concurrency", "prefill", "switch");
        if (!a.results) err = em_errorf(EM_ERR_NOMEM, "bench: out of memory");
    }
    for (int si = 0; si < a.n_servers && !err; si++) {
        server_state *s = &a.servers[si];
        if (!(err = probe_server(&a, s))) {
            json_array_append_new(json_object_get(a.results, "servers"),
                                  json_pack("{s:s, s:s, s:s, s:s}", "url", s->target.url, "model", s->target.model, "api",
                                            bench_api_name(s->target.api),
                                            "token_count_method", count_method_names[s->method]));
            printf("server=%d url=%s model=%s token_count_method=%s\n", si, s->target.url, s->target.model,
                   count_method_names[s->method]);
            fflush(stdout);
        }
    }
    bool measuring = !err;
    if (!err && a.sections & SECTION_CONCURRENCY) err = run_concurrency(&a);
    if (!err && a.sections & SECTION_PREFILL) err = run_prefill(&a);
    if (!err && a.sections & SECTION_SWITCH) err = run_switch(&a);
    /* a server failing mid-suite loses nothing measured before it */
    if (measuring && a.out_dir) {
        em_err written = write_results(&a);
        if (err && !written)
            fprintf(stderr, "ember bench: the measurements made before the error are in %s\n", a.out_dir);
        if (err) em_err_free(written);
        else err = written;
    }
    json_decref(a.results);
    json_decref(a.logit_bias);
    curl_global_cleanup();
    return err;
}
