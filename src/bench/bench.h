/*
 * bench — the benchmark client: `ember bench --url`, the benchmark suite run from the outside,
 * against any server that speaks the OpenAI or Anthropic API (Ember, llama.cpp's server, vLLM,
 * Ollama's OpenAI endpoint). A tool, not the product: it is built into the ember program as the
 * `bench --url` command (src/cli/bench.c hands it the arguments), and nothing else links it.
 *
 * Four files:
 *   http.c    the client: N streamed requests at once on one thread (libcurl's multi interface),
 *             each timed as a client sees it (first token, last byte), plus the server's usage
 *             and `timings` when it sends them; small JSON requests.
 *   url.c     the suite: prompts of a given token length, the concurrency levels, cold prefill,
 *             the A → A' → B → A'' conversation switch, two servers alternated round by round;
 *             every sample into one JSON document.
 *   report.c  that document as a self-contained HTML page with inline SVG charts.
 *   values.c  the median and the checked flag values, shared with the in-process mode.
 *
 * Depends on base, jansson and libcurl only (never on src/cli). Errors are em_err values; the
 * suite prints its measurements (one `key=value` line each) to stdout as it goes, and the caller
 * prints the error.
 */
#ifndef EMBER_BENCH_H
#define EMBER_BENCH_H

#include <jansson.h>
#include <stdbool.h>

#include "../base/base.h"

/* The API the requests use: OpenAI chat completions, Anthropic messages, or OpenAI's plain-text
 * completions (the conversation's turns joined into one prompt; no chat template, and no parsing
 * of the answer by the server, which random-weight models can fail). */
typedef enum bench_api { BENCH_API_OPENAI, BENCH_API_ANTHROPIC, BENCH_API_COMPLETIONS } bench_api;

/* The name --api takes and results.json records. */
const char *bench_api_name(bench_api api);

/* One server under test. `model` is what requests name (--model, else the server's first model). */
typedef struct bench_target {
    const char *url;     /* base URL without a trailing slash, e.g. http://127.0.0.1:11435 */
    const char *api_key; /* NULL: none sent */
    bench_api api;
    char model[256];
    json_t *logit_bias; /* --ban-tokens: sent with every generating request; NULL: none */
} bench_target;

/* What one streamed request saw. Times are milliseconds from the moment it was started; counts
 * are -1 where the server did not report them. */
typedef struct bench_sample {
    double first_token_ms, total_ms;
    int prompt_tokens, cached_tokens, completion_tokens;
    int content_chunks;           /* stream events that carried answer text */
    double server_prefill_ms;     /* the server's own prompt time (Ember prefill_ms, llama.cpp prompt_ms) */
    double server_decode_tok_s;   /* the server's own decode rate */
    char *text;                   /* the answer's text (malloc'd; the conversation switch sends it back) */
    char error[512];              /* empty when the request succeeded */
} bench_sample;

/* Runs `n` requests at once, each POSTing bodies[i] to `path` with "stream": true, and fills
 * samples[i]. A request that fails (connection, status, malformed stream) has its `error` set;
 * the call itself fails only when libcurl cannot be set up. Free the samples' text with
 * bench_samples_clear. */
em_err bench_stream(const bench_target *target, const char *path, char *const *bodies, int n, bench_sample *samples);
void bench_samples_clear(bench_sample *samples, int n);

/* One whole (non-streamed) request: GET when body is NULL, else POST of the JSON body. *status is
 * the HTTP status, *reply the parsed JSON answer (NULL when the body is not JSON). Fails when the
 * server cannot be reached. */
em_err bench_request(const bench_target *target, const char *path, const char *body, long *status, json_t **reply);

/* The request body for one user turn (or a whole conversation: `messages` is a JSON array of
 * {role, content}), greedy, `max_tokens` tokens with end-of-generation ignored. Returns malloc'd
 * text, NULL when out of memory. */
char *bench_body(const bench_target *target, const json_t *messages, int max_tokens, bool stream);

/* Shared with the in-process mode (src/cli/bench.c; values.c): the median (sorts `v`), and flag
 * values checked against a range: a number, or up to 16 numbers separated by commas. */
double bench_median(double *v, int n);
em_err bench_parse_int(const char *flag, const char *v, int lo, int hi, int *out);
em_err bench_parse_list(const char *flag, const char *text, int lo, int hi, int *values, int *n);

/* `ember bench --url ...` or `ember bench --report ...` (url.c); argv as em_cli_bench got it. */
em_err em_bench_url(int argc, char **argv);

/* Writes the HTML report of a results document (url.c's format) to `path`. */
em_err bench_report_write(const json_t *results, const char *path);

#endif
