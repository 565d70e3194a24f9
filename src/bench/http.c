/* The benchmark's HTTP client (see bench.h). One thread drives every concurrent request through
 * libcurl's multi interface, so the client's own cost does not grow with the number of clients and
 * the times it takes are the times at which bytes arrived. A stream is parsed as it comes: the first
 * event that carries answer text is the first token. */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* One request in flight. */
typedef struct stream_state {
    const bench_target *target;
    CURL *curl;
    struct curl_slist *headers;
    bench_sample *sample;
    double start;
    long status;       /* 0 until the first body byte */
    em_buf pending;    /* bytes of an incomplete line (or the whole body of a non-200) */
    em_buf text;       /* the answer so far */
    bool done;         /* [DONE] or message_stop seen */
} stream_state;

static void set_error(bench_sample *s, const char *fmt, const char *a, const char *b) {
    if (!s->error[0]) snprintf(s->error, sizeof s->error, fmt, a, b);
}

static int json_int(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : -1;
}

static double json_num(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : -1;
}

/* Engine timings in either server's names: Ember's prefill_ms / decode_tokens_per_second /
 * cached_tokens, llama.cpp's prompt_ms / predicted_per_second / cache_n. */
static void read_timings(bench_sample *s, const json_t *t) {
    if (!json_is_object(t)) return;
    double prefill = json_num(t, "prefill_ms");
    if (prefill < 0) prefill = json_num(t, "prompt_ms");
    if (prefill >= 0) s->server_prefill_ms = prefill;
    double rate = json_num(t, "decode_tokens_per_second");
    if (rate < 0) rate = json_num(t, "predicted_per_second");
    if (rate >= 0) s->server_decode_tok_s = rate;
    int cached = json_int(t, "cache_n"), computed = json_int(t, "prompt_n");
    if (cached >= 0 && s->cached_tokens < 0) s->cached_tokens = cached;
    /* llama.cpp without a usage chunk: its prompt is the cached tokens and those it computed */
    if (cached >= 0 && computed >= 0 && s->prompt_tokens < 0) s->prompt_tokens = cached + computed;
}

/* Answer text of one event (`text` may hold NULs: a byte token can be "\u0000"). An event of the
 * completions API is a token even where its text is empty (a random model's token whose piece is
 * empty, or part of a character): `token_event` times the first token at it. */
static void got_text(stream_state *st, const json_t *text, bool token_event) {
    size_t n = json_string_length(text);
    if ((n || token_event) && st->sample->first_token_ms < 0) st->sample->first_token_ms = now_ms() - st->start;
    if (!n) return;
    st->sample->content_chunks++;
    em_buf_append(&st->text, json_string_value(text), n);
}

static void read_openai_event(stream_state *st, const json_t *ev) {
    bench_sample *s = st->sample;
    json_t *choice = json_array_get(json_object_get(ev, "choices"), 0);
    json_t *delta = json_object_get(choice, "delta");
    json_t *content = json_object_get(delta, "content");
    json_t *text = json_object_get(choice, "text"); /* /v1/completions */
    got_text(st, content ? content : text, !content && json_is_string(text));
    json_t *usage = json_object_get(ev, "usage");
    if (json_is_object(usage)) {
        s->prompt_tokens = json_int(usage, "prompt_tokens");
        s->completion_tokens = json_int(usage, "completion_tokens");
        int cached = json_int(json_object_get(usage, "prompt_tokens_details"), "cached_tokens");
        if (cached >= 0) s->cached_tokens = cached;
    }
    read_timings(s, json_object_get(ev, "timings"));
    read_timings(s, json_object_get(choice, "timings"));
}

static void read_anthropic_event(stream_state *st, const json_t *ev) {
    bench_sample *s = st->sample;
    const char *type = json_string_value(json_object_get(ev, "type"));
    if (!type) return;
    if (!strcmp(type, "message_start")) {
        json_t *usage = json_object_get(json_object_get(ev, "message"), "usage");
        int fresh = json_int(usage, "input_tokens"), cached = json_int(usage, "cache_read_input_tokens");
        /* Anthropic counts only the prompt tokens not read from the cache as input */
        if (fresh >= 0) s->prompt_tokens = fresh + (cached > 0 ? cached : 0);
        if (cached >= 0) s->cached_tokens = cached;
    } else if (!strcmp(type, "content_block_delta")) {
        got_text(st, json_object_get(json_object_get(ev, "delta"), "text"), false);
    } else if (!strcmp(type, "message_delta")) {
        int out = json_int(json_object_get(ev, "usage"), "output_tokens");
        if (out >= 0) s->completion_tokens = out;
        read_timings(s, json_object_get(ev, "timings"));
    } else if (!strcmp(type, "message_stop")) {
        st->done = true;
    }
}

/* One line of an SSE stream. */
static void read_line(stream_state *st, char *line) {
    size_t n = strlen(line);
    if (n && line[n - 1] == '\r') line[--n] = 0;
    if (!n || line[0] == ':' || !strncmp(line, "event:", 6) || !strncmp(line, "id:", 3) || !strncmp(line, "retry:", 6))
        return;
    if (strncmp(line, "data:", 5)) {
        set_error(st->sample, "malformed stream from %s: a line that is not an SSE field: '%.200s'", st->target->url, line);
        return;
    }
    const char *data = line + 5 + (line[5] == ' ');
    if (!strcmp(data, "[DONE]")) {
        st->done = true;
        return;
    }
    json_error_t jerr;
    json_t *ev = json_loads(data, JSON_ALLOW_NUL, &jerr);
    if (!json_is_object(ev)) {
        set_error(st->sample, "malformed stream from %s: an event that is not a JSON object: '%.200s'", st->target->url,
                  data);
    } else if (json_object_get(ev, "error")) {
        json_t *e = json_object_get(ev, "error");
        const char *msg = json_string_value(json_object_get(e, "message"));
        set_error(st->sample, "%s reported an error mid-stream: %s", st->target->url, msg ? msg : "(no message)");
    } else if (st->target->api == BENCH_API_ANTHROPIC) {
        read_anthropic_event(st, ev);
    } else {
        read_openai_event(st, ev);
    }
    json_decref(ev);
}

static size_t on_data(char *data, size_t size, size_t count, void *user) {
    stream_state *st = user;
    size_t n = size * count;
    if (!st->status) curl_easy_getinfo(st->curl, CURLINFO_RESPONSE_CODE, &st->status);
    if (!em_buf_append(&st->pending, data, n)) return 0;
    if (st->status != 200) return n; /* kept whole for the error message */
    char *line = st->pending.data, *end;
    while ((end = memchr(line, '\n', st->pending.len - (size_t)(line - st->pending.data)))) {
        *end = 0;
        read_line(st, line);
        line = end + 1;
    }
    size_t rest = st->pending.len - (size_t)(line - st->pending.data);
    memmove(st->pending.data, line, rest);
    st->pending.len = rest;
    st->pending.data[rest] = 0;
    return n;
}

/* The message of an error body in either API's format, else the body's start. */
static void status_error(stream_state *st) {
    const char *body = st->pending.data ? st->pending.data : "";
    json_t *j = json_loads(body, 0, NULL);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    if (!msg) msg = json_string_value(json_object_get(j, "error"));
    char status[32];
    snprintf(status, sizeof status, "%ld", st->status);
    char text[400];
    snprintf(text, sizeof text, "%s: %.300s", status, msg ? msg : body);
    set_error(st->sample, "%s answered HTTP %s", st->target->url, text);
    json_decref(j);
}

static struct curl_slist *headers_for(const bench_target *t) {
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    char line[600];
    if (t->api_key) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", t->api_key);
        h = curl_slist_append(h, line);
        snprintf(line, sizeof line, "x-api-key: %s", t->api_key);
        h = curl_slist_append(h, line);
    }
    if (t->api == BENCH_API_ANTHROPIC) h = curl_slist_append(h, "anthropic-version: 2023-06-01");
    return h;
}

static CURL *easy_for(const bench_target *t, const char *path, const char *body, struct curl_slist *headers) {
    CURL *c = curl_easy_init();
    if (!c) return NULL;
    char url[1024];
    snprintf(url, sizeof url, "%s%s", t->url, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "ember-bench");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    /* a server that sends nothing for 10 minutes (not even a long prefill takes that) is stuck */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 600L);
    if (body) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    return c;
}

void bench_samples_clear(bench_sample *samples, int n) {
    for (int i = 0; i < n; i++) {
        free(samples[i].text);
        samples[i].text = NULL;
    }
}

em_err bench_stream(const bench_target *target, const char *path, char *const *bodies, int n, bench_sample *samples) {
    stream_state *st = calloc((size_t)n, sizeof *st);
    CURLM *multi = curl_multi_init();
    em_err err = NULL;
    if (!st || !multi) err = em_errorf(EM_ERR_NOMEM, "bench: out of memory starting %d requests", n);
    for (int i = 0; i < n && !err; i++) {
        samples[i] = (bench_sample){.first_token_ms = -1, .total_ms = -1, .prompt_tokens = -1, .cached_tokens = -1,
                                    .completion_tokens = -1, .server_prefill_ms = -1, .server_decode_tok_s = -1};
        st[i].target = target;
        st[i].sample = &samples[i];
        st[i].headers = headers_for(target);
        st[i].curl = easy_for(target, path, bodies[i], st[i].headers);
        if (!st[i].headers || !st[i].curl) {
            err = em_errorf(EM_ERR_NOMEM, "bench: cannot set up a request to %s%s", target->url, path);
            break;
        }
        curl_easy_setopt(st[i].curl, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(st[i].curl, CURLOPT_WRITEDATA, &st[i]);
        curl_easy_setopt(st[i].curl, CURLOPT_PRIVATE, &st[i]);
    }
    /* all added, then all started together: the clock of each starts as it is handed to curl */
    for (int i = 0; i < n && !err; i++) {
        st[i].start = now_ms();
        curl_multi_add_handle(multi, st[i].curl);
    }
    int running = err ? 0 : n;
    while (running > 0) {
        curl_multi_perform(multi, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            stream_state *s;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
            s->sample->total_ms = now_ms() - s->start;
            if (msg->data.result != CURLE_OK) {
                set_error(s->sample, s->status ? "lost %s mid-answer: %s" : "cannot reach %s: %s", s->target->url,
                          curl_easy_strerror(msg->data.result));
                continue;
            }
            curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
            if (s->status != 200) status_error(s);
            else if (s->pending.len) read_line(s, s->pending.data); /* a last line without its newline */
            if (!s->done && s->status == 200)
                set_error(s->sample, "malformed stream from %s: it ended before %s", s->target->url,
                          s->target->api == BENCH_API_ANTHROPIC ? "message_stop" : "data: [DONE]");
        }
        if (running > 0) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    for (int i = 0; st && i < n; i++) {
        if (st[i].curl) {
            curl_multi_remove_handle(multi, st[i].curl);
            curl_easy_cleanup(st[i].curl);
        }
        curl_slist_free_all(st[i].headers);
        em_buf_free(&st[i].pending);
        samples[i].text = st[i].text.data ? st[i].text.data : strdup("");
    }
    if (multi) curl_multi_cleanup(multi);
    free(st);
    return err;
}

static size_t collect(char *data, size_t size, size_t count, void *user) {
    return em_buf_append(user, data, size * count) ? size * count : 0;
}

em_err bench_request(const bench_target *target, const char *path, const char *body, long *status, json_t **reply) {
    *status = 0;
    *reply = NULL;
    struct curl_slist *headers = headers_for(target);
    CURL *c = headers ? easy_for(target, path, body, headers) : NULL;
    if (!c) {
        curl_slist_free_all(headers);
        return em_errorf(EM_ERR_NOMEM, "bench: cannot set up a request to %s%s", target->url, path);
    }
    em_buf got = {0};
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &got);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 600L);
    CURLcode rc = curl_easy_perform(c);
    em_err err = NULL;
    if (rc != CURLE_OK) {
        err = em_errorf(EM_ERR_IO, "cannot reach %s%s: %s", target->url, path, curl_easy_strerror(rc));
    } else {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
        if (got.data) *reply = json_loads(got.data, 0, NULL);
    }
    em_buf_free(&got);
    curl_easy_cleanup(c);
    curl_slist_free_all(headers);
    return err;
}

const char *bench_api_name(bench_api api) {
    return api == BENCH_API_ANTHROPIC ? "anthropic" : api == BENCH_API_COMPLETIONS ? "completions" : "openai";
}

/* The turns' contents joined by blank lines: the prompt of a plain-text completion. */
static json_t *joined_prompt(const json_t *messages) {
    em_buf text = {0};
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        const json_t *content = json_object_get(m, "content");
        if (i) em_buf_append(&text, "\n\n", 2);
        em_buf_append(&text, json_string_value(content), json_string_length(content));
    }
    json_t *prompt = json_stringn(text.data ? text.data : "", text.len);
    em_buf_free(&text);
    return prompt;
}

char *bench_body(const bench_target *target, const json_t *messages, int max_tokens, bool stream) {
    /* temperature 0 is greedy on every server here; ignore_eos (llama.cpp's name, taken by Ember,
     * vLLM; ignored by others) makes every request run to max_tokens */
    bool plain = target->api == BENCH_API_COMPLETIONS;
    json_t *input = plain ? joined_prompt(messages) : json_incref((json_t *)messages);
    json_t *body = input ? json_pack("{s:s, s:o, s:i, s:f, s:b, s:b}", "model", target->model,
                                     plain ? "prompt" : "messages", input, "max_tokens", max_tokens,
                                     "temperature", 0.0, "stream", stream, "ignore_eos", 1)
                         : NULL;
    if (body && target->logit_bias) json_object_set(body, "logit_bias", target->logit_bias);
    if (body && stream && target->api != BENCH_API_ANTHROPIC)
        json_object_set_new(body, "stream_options", json_pack("{s:b}", "include_usage", 1));
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    return text;
}
