/* A fake em_server_engine for the server's tests: byte tokens (id = byte value), a scripted
 * reply ("Hello, world!", 400 letters at 20 ms a token when the prompt contains "slow", reasoning and
 * a tool call when it contains "think-and-call"; gpt-oss's harmony answers, as the model writes
 * them, when it contains "harmony": a call after reasoning for "harmony-call" until a tool result
 * is in the conversation, else reasoning and a final answer; Gemma 4's the same way for "gemma4"
 * and "gemma4-call"; "Hel" and then a grammar too
 * ambiguous to follow, as the real engine reports it, when it contains "ambiguous" and a grammar
 * is given), stop
 * strings and max_tokens applied as the engine would, and counters of submitted, cancelled and
 * released requests so tests can check that nothing leaks and disconnects cancel. */
#ifndef EMBER_TEST_SERVER_FAKE_H
#define EMBER_TEST_SERVER_FAKE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/server.h"

/* ---- A fake engine: byte tokens (id = byte value), a scripted reply ---- */

#define FAKE_REPLY "Hello, world!"
/* the reply to a prompt that contains "think-and-call": reasoning, then a call in the JSON format */
#define FAKE_THINK_AND_CALL "<think>Let me see.</think>{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}"
/* harmony: the generation prompt ends with <|start|>assistant; <|call|> and <|return|> end generation */
#define FAKE_HARMONY_CALL                                                                                          \
    "<|channel|>analysis<|message|>The user wants the weather in Oslo. Call get_weather.<|end|>"                  \
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"                \
    "{\"city\":\"Oslo\",\"days\":3}"
#define FAKE_HARMONY_ANSWER                                                                                        \
    "<|channel|>analysis<|message|>Sunny, say so.<|end|><|start|>assistant<|channel|>final<|message|>It will be sunny."
/* Gemma 4: a thought, then a call with nested arguments (<|tool_response> ends generation) */
#define FAKE_GEMMA4_CALL                                                                                           \
    "<|channel>thought\nThe user wants the weather in Oslo. Call get_weather.<channel|>"                           \
    "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,days:3,when:{from:<|\"|>today<|\"|>,hours:[9,12]}}<tool_call|>"
#define FAKE_GEMMA4_ANSWER "<|channel>thought\nSunny, say so.<channel|>It will be sunny."
#define FAKE_SLOW_REPLY_LEN 400

typedef struct fake_request {
    char reply[FAKE_SLOW_REPLY_LEN + 1];
    size_t len, pos;
    ember_finish_reason finish;
    const char *stop_string;
    char *stops[EM_SERVER_MAX_STOP];
    size_t n_stop;
    size_t n_prompt;
    int logprobs;
    int delay_ms;
    atomic_bool cancelled;
    bool finished_sent;
    ember_token_out tok;
    ember_top_logprob top[EM_SERVER_MAX_TOP];
    char text[2];
    ember_sampling sampling;
    int max_tokens;
    bool grammar_gives_up; /* ends with the real engine's error for a grammar too ambiguous to follow */
} fake_request;

static atomic_int fake_submitted, fake_released, fake_cancelled;
static ember_sampling fake_last_sampling;
static int fake_last_max_tokens;
static bool fake_last_ignore_eos;
static int fake_last_speculative; /* the ember_spec of the last request */
static const ember_grammar *fake_last_grammar; /* the compiled grammar the last request was given */
static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static char fake_token_bytes_table[256];

static char fake_last_kwargs[256]; /* the template variables of the last chat prompt, as JSON ("" for none) */

static em_err fake_chat_prompt(void *self, const json_t *messages, const json_t *tools, const json_t *kwargs, int32_t **ids,
                               size_t *n, bool *in_thinking) {
    (void)self;
    (void)tools;
    char *kwargs_text = kwargs ? json_dumps(kwargs, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    pthread_mutex_lock(&fake_lock);
    snprintf(fake_last_kwargs, sizeof fake_last_kwargs, "%s", kwargs_text ? kwargs_text : "");
    pthread_mutex_unlock(&fake_lock);
    free(kwargs_text);
    if (in_thinking) *in_thinking = false;
    em_buf text = {0};
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        em_buf_printf(&text, "%s:%s\n", json_string_value(json_object_get(m, "role")),
                      json_string_value(json_object_get(m, "content")));
    }
    em_buf_printf(&text, "assistant:");
    *ids = malloc(text.len * sizeof **ids);
    for (size_t k = 0; k < text.len; k++) (*ids)[k] = (unsigned char)text.data[k];
    *n = text.len;
    em_buf_free(&text);
    return NULL;
}

/* what the server asked of the last tokenize (the fake adds no BOS and has no control tokens) */
static bool fake_last_add_special, fake_last_parse_special;

static em_err fake_tokenize(void *self, const char *text, size_t len, bool add_special, bool parse_special, int32_t **ids,
                            size_t *n) {
    (void)self;
    fake_last_add_special = add_special;
    fake_last_parse_special = parse_special;
    *ids = malloc((len ? len : 1) * sizeof **ids);
    for (size_t k = 0; k < len; k++) (*ids)[k] = (unsigned char)text[k];
    *n = len;
    return NULL;
}

static size_t fake_token_bytes(void *self, int32_t id, const char **bytes) {
    (void)self;
    if (id < 0 || id > 255) return 0;
    *bytes = &fake_token_bytes_table[id];
    return 1;
}

static bool contains(const int32_t *ids, size_t n, const char *word) {
    size_t w = strlen(word);
    for (size_t i = 0; i + w <= n; i++) {
        size_t k = 0;
        while (k < w && ids[i + k] == (unsigned char)word[k]) k++;
        if (k == w) return true;
    }
    return false;
}

static em_err fake_submit(void *self, const ember_request_params *p, void **out) {
    (void)self;
    if (p->max_tokens <= 0) return em_errorf(EM_ERR_INVALID, "max_tokens must be positive");
    fake_request *r = calloc(1, sizeof *r);
    if (contains(p->prompt_ids, p->n_prompt_ids, "slow")) {
        for (size_t i = 0; i < FAKE_SLOW_REPLY_LEN; i++) r->reply[i] = (char)('a' + i % 26);
        r->delay_ms = 20;
    } else if (contains(p->prompt_ids, p->n_prompt_ids, "think-and-call")) {
        strcpy(r->reply, FAKE_THINK_AND_CALL);
    } else if (contains(p->prompt_ids, p->n_prompt_ids, "harmony")) {
        const bool call = contains(p->prompt_ids, p->n_prompt_ids, "harmony-call") &&
                          !contains(p->prompt_ids, p->n_prompt_ids, "\ntool:");
        strcpy(r->reply, call ? FAKE_HARMONY_CALL : FAKE_HARMONY_ANSWER);
    } else if (contains(p->prompt_ids, p->n_prompt_ids, "gemma4")) {
        const bool call = contains(p->prompt_ids, p->n_prompt_ids, "gemma4-call") &&
                          !contains(p->prompt_ids, p->n_prompt_ids, "\ntool:");
        strcpy(r->reply, call ? FAKE_GEMMA4_CALL : FAKE_GEMMA4_ANSWER);
    } else if (contains(p->prompt_ids, p->n_prompt_ids, "ambiguous") && p->compiled_grammar) {
        strcpy(r->reply, "Hel");
        r->grammar_gives_up = true;
    } else {
        strcpy(r->reply, FAKE_REPLY);
    }
    r->len = strlen(r->reply);
    r->finish = r->grammar_gives_up ? EMBER_FINISH_ERROR : EMBER_FINISH_STOP;
    /* the first stop string in the reply cuts it; then max_tokens */
    size_t cut = r->len;
    for (size_t s = 0; s < p->n_stop; s++) {
        const char *at = strstr(r->reply, p->stop[s]);
        if (at && (size_t)(at - r->reply) < cut) {
            cut = (size_t)(at - r->reply);
            r->stop_string = p->stop[s];
        }
    }
    for (size_t s = 0; s < p->n_stop; s++) r->stops[r->n_stop++] = strdup(p->stop[s]);
    for (size_t s = 0; r->stop_string && s < p->n_stop; s++)
        if (!strcmp(r->stop_string, p->stop[s])) r->stop_string = r->stops[s];
    if (cut < r->len) r->len = cut;
    if ((size_t)p->max_tokens < r->len) {
        r->len = (size_t)p->max_tokens;
        r->finish = EMBER_FINISH_LENGTH;
        r->stop_string = NULL;
    }
    r->n_prompt = p->n_prompt_ids;
    r->logprobs = p->sampling.logprobs;
    pthread_mutex_lock(&fake_lock);
    fake_last_sampling = p->sampling;
    fake_last_max_tokens = p->max_tokens;
    fake_last_ignore_eos = p->ignore_eos;
    fake_last_speculative = p->speculative;
    fake_last_grammar = p->compiled_grammar;
    pthread_mutex_unlock(&fake_lock);
    atomic_fetch_add(&fake_submitted, 1);
    *out = r;
    return NULL;
}

static void fake_error_of(const fake_request *r, ember_output *out) {
    if (!r->grammar_gives_up) return;
    out->error = "grammar: the grammar is too ambiguous to follow (more than 256 parse stacks at once)";
    out->invalid_request = true;
}

static bool fake_next(void *request, ember_output *out, int timeout_ms) {
    fake_request *r = request;
    memset(out, 0, sizeof *out);
    if (atomic_load(&r->cancelled)) {
        out->finish = EMBER_FINISH_CANCELLED;
        return true;
    }
    if (r->finished_sent) {
        out->finish = r->finish;
        out->stop_string = r->stop_string;
        fake_error_of(r, out);
        return true;
    }
    if (r->delay_ms) {
        if (timeout_ms >= 0 && timeout_ms < r->delay_ms) {
            usleep((useconds_t)timeout_ms * 1000);
            return false;
        }
        usleep((useconds_t)r->delay_ms * 1000);
    }
    if (r->pos < r->len) {
        unsigned char c = (unsigned char)r->reply[r->pos++];
        r->text[0] = (char)c;
        r->tok.token = c;
        r->tok.logprob = -0.5f;
        r->tok.n_top = r->logprobs;
        for (int k = 0; k < r->logprobs; k++) r->top[k] = (ember_top_logprob){.token = c + k, .logprob = -0.5f - k};
        r->tok.top = r->top;
        out->tokens = &r->tok;
        out->n_tokens = 1;
        out->text = r->text;
        out->text_len = 1;
    }
    if (r->pos == r->len) {
        r->finished_sent = true;
        out->finish = r->finish;
        out->stop_string = r->stop_string;
        fake_error_of(r, out);
    }
    return true;
}

static void fake_cancel(void *request) {
    fake_request *r = request;
    if (!r->finished_sent) atomic_fetch_add(&fake_cancelled, 1);
    atomic_store(&r->cancelled, true);
}

static void fake_timings(void *request, ember_timings *t) {
    fake_request *r = request;
    *t = (ember_timings){.queued_ms = 0.5, .prefill_ms = 1.25, .first_token_ms = 2, .decode_ms = 10,
                         .decode_tokens_per_second = 100, .prompt_tokens = (uint32_t)r->n_prompt,
                         .cached_tokens = 3, .generated_tokens = (uint32_t)r->pos};
}

static void fake_release(void *request) {
    fake_request *r = request;
    for (size_t s = 0; s < r->n_stop; s++) free(r->stops[s]);
    free(r);
    atomic_fetch_add(&fake_released, 1);
}

static void fake_stats(void *self, ember_stats *s) {
    (void)self;
    memset(s, 0, sizeof *s);
    s->prompt_tokens = 100;
    s->generated_tokens = 50;
    s->cached_tokens = 30;
    s->queued = 1;
    s->running = 2;
    s->kv_blocks_total = 64;
    s->kv_blocks_used = 10;
    s->kv_blocks_cached = 4;
    s->draft_tokens = 40;
    s->draft_accepted = 25;
    s->step_histogram[0] = 5;
    s->step_histogram[3] = 2;
    s->step_histogram[11] = 1;
    s->step_seconds_total = 2.5;
    s->cache_ram = (ember_tier_stats){.enabled = true, .limit_bytes = 8192, .bytes = 4096, .blocks = 2, .stored = 5,
                                      .hits = 3, .hit_tokens = 48, .evictions = 3, .bytes_written = 10240,
                                      .bytes_read = 6144, .restore_ms = 0.25};
    s->cache_disk = (ember_tier_stats){.limit_bytes = 65536, .stored = 3, .hits = 1, .hit_tokens = 16, .evictions = 2,
                                       .bytes_written = 6400, .bytes_read = 2100, .restore_ms = 1.5,
                                       .files_skipped = 2};
}

static em_server_engine fake_engine(void) {
    for (int i = 0; i < 256; i++) fake_token_bytes_table[i] = (char)i;
    return (em_server_engine){.self = NULL, .model_id = "fake-model", .ctx_tokens = 128, .n_vocab = 256,
                               .chat_prompt = fake_chat_prompt, .tokenize = fake_tokenize,
                               .token_bytes = fake_token_bytes, .submit = fake_submit, .next = fake_next,
                               .cancel = fake_cancel, .timings = fake_timings, .release = fake_release,
                               .stats = fake_stats};
}

#endif
