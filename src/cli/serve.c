/* `ember serve -m MODEL.gguf [...]`: the OpenAI-, Anthropic- and Ollama-compatible HTTP server (src/server)
 * in front of one engine. What it tells its operator: a busy port before the model loads, a summary
 * of what it serves on stderr (model, device, context, KV cache, URLs, a context longer than the
 * model was trained for), one line on stdout when it accepts requests, then an access log line
 * per request on stderr. Stops on SIGINT or SIGTERM.
 *
 * EMBER_HOST, EMBER_PORT, EMBER_MODEL, EMBER_CTX and EMBER_API_KEY are defaults that flags
 * override, for containers and service managers that configure through the environment. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../server/server.h"
#include "cli.h"

static const char usage_text[] =
    "usage: ember serve (-m MODEL.gguf | --hf ORG/NAME[:QUANT]) [options]\n"
    EM_CLI_MODEL_USAGE
    "  --host HOST          address to bind (default: EMBER_HOST, else 127.0.0.1)\n"
    "  --port N             port (default: EMBER_PORT, else 11435; 0 picks a free one)\n"
    "  --ollama-port N      also listen on port N, with the same APIs (11434 for Ollama's clients that\n"
    "                       cannot be told another port; default: no second port)\n"
    "  --api-key KEY        require this key (Authorization: Bearer KEY or x-api-key: KEY);\n"
    "                       default: the EMBER_API_KEY environment variable, else none (an empty\n"
    "                       key is refused); /health, /metrics and the chat page need none\n"
    "  -c, --ctx N          longest prompt + output in tokens (default: EMBER_CTX, else the model's,\n"
    "                       at most 8192; more than the model was trained for is warned about)\n"
    "  --kv-mem BYTES       KV cache budget (suffixes K, M, G; default: --kv-sequences of --ctx)\n"
    "  --kv-sequences N     KV cache room in sequences of --ctx tokens (default 4)\n"
    "  --batch-tokens N     tokens per engine step (default 2048)\n"
    "  --max-sequences N    requests running at once (default 256)\n"
    "  --max-body BYTES     largest request body (suffixes K, M, G; default 4M)\n"
    "  --device cpu|cuda    backend (default: cuda when a GPU is present)\n"
    "  -t, --threads N      CPU threads for the CPU backend (default: all cores)\n"
    "  --alias NAME         the model id /v1/models lists and responses report (default: the file's\n"
    "                       name without .gguf); requests naming any model are served by this one\n"
    "  --pooling mean|cls|last  how embeddings pool the prompt's hidden states (default: the file's\n"
    "                       <arch>.pooling_type; a model with none embeds only with this)\n"
    "  --matryoshka         the model's embeddings may be cut short: requests may ask for fewer\n"
    "                       `dimensions` (Qwen3-Embedding and other Matryoshka-trained models)\n"
    "  --log-format text|json  the access log's lines on stderr, one per request (default text)\n"
    "  --quiet              no access log\n"
    EM_CLI_CACHE_USAGE
    EM_CLI_SPEC_USAGE
    "                     (the default of requests; a request may turn it off: docs/speculative.md)\n"
    "environment: EMBER_MODEL (a GGUF file, as -m), EMBER_HOST, EMBER_PORT, EMBER_CTX and\n"
    "EMBER_API_KEY are defaults; the flags override them\n";

static const char *const serve_options[] = {EM_CLI_MODEL_NAMES, EM_CLI_SPEC_NAMES, EM_CLI_CACHE_NAMES, "--host", "--port",
                                            "--api-key", "-c", "--ctx", "--kv-mem", "--kv-sequences", "--batch-tokens",
                                            "--max-sequences", "--max-body", "--device", "-t", "--threads", "--alias",
                                            "--pooling", "--matryoshka", "--mmap", "--no-mmap", "--help", "--ollama-port",
                                            "--log-format", "--quiet", NULL};

static bool known_option(const char *flag) {
    for (size_t i = 0; serve_options[i]; i++)
        if (!strcmp(serve_options[i], flag)) return true;
    return false;
}

/* "512", "64K", "2G" → bytes. */
static bool parse_size(const char *text, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || text[0] == '-') return false;
    uint64_t scale = 1;
    if (*end == 'K' || *end == 'k') scale = 1ull << 10;
    else if (*end == 'M' || *end == 'm') scale = 1ull << 20;
    else if (*end == 'G' || *end == 'g') scale = 1ull << 30;
    if (scale != 1) end++;
    if (*end) return false;
    return !em_mul_overflows(v, scale, out);
}

static bool parse_int(const char *text, int min, int max, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max) return false;
    *out = (int)v;
    return true;
}

/* One line on the prefix cache's lower tiers: their bounds, or why there are none. */
static void report_cache_tiers(const em_server_model *model) {
    ember_engine_info info;
    em_server_model_info(model, &info);
    if (info.cache_tiers_off) fprintf(stderr, "ember serve: prefix cache: %s\n", info.cache_tiers_off);
    if (!info.cache_ram_bytes && !info.cache_dir) return;
    fprintf(stderr, "ember serve: prefix cache tiers: host RAM %.1f GiB", info.cache_ram_bytes / (double)(1u << 30));
    if (info.cache_dir) fprintf(stderr, ", disk %.1f GiB in %s", info.cache_disk_bytes / (double)(1u << 30), info.cache_dir);
    fputc('\n', stderr);
}

/* A number from environment variable `name` (unset: *out stays); false, said, when it is not one. */
static bool env_int(const char *name, int min, int max, int *out) {
    const char *text = getenv(name);
    if (!text) return true;
    if (parse_int(text, min, max, out)) return true;
    fprintf(stderr, "ember serve: %s='%s' is not a number in %d..%d\n", name, text, min, max);
    return false;
}

/* "7.2B", "494M", "12.3K" */
static void format_count(uint64_t n, char *out, size_t size) {
    if (n >= 1000000000ull) snprintf(out, size, "%.1fB", n / 1e9);
    else if (n >= 1000000ull) snprintf(out, size, "%.1fM", n / 1e6);
    else if (n >= 1000ull) snprintf(out, size, "%.1fK", n / 1e3);
    else snprintf(out, size, "%llu", (unsigned long long)n);
}

static void format_bytes(uint64_t n, char *out, size_t size) {
    if (n >= (1ull << 30)) snprintf(out, size, "%.2f GiB", n / (double)(1ull << 30));
    else snprintf(out, size, "%.1f MiB", n / (double)(1ull << 20));
}

/* A metadata value of the model (general.name, <arch>.context_length), NULL when absent. */
static const json_t *model_fact(const em_server_engine *b, const char *prefix, const char *key) {
    char name[160];
    snprintf(name, sizeof name, "%s.%s", prefix ? prefix : "", key);
    return b->facts.metadata ? json_object_get(b->facts.metadata, name) : NULL;
}

/* A context longer than the model was trained for runs, but RoPE then meets positions it never
 * saw and the output degrades without an error: the operator is told, with the scaling that the
 * model would need (set in the GGUF's metadata; Ember applies what the file says). */
static void warn_long_context(const em_server_engine *b) {
    const char *arch = b->facts.architecture;
    json_int_t trained = json_integer_value(model_fact(b, arch, "context_length"));
    if (trained <= 0 || b->ctx_tokens <= trained) return;
    const char *scaling = json_string_value(model_fact(b, arch, "rope.scaling.type"));
    fprintf(stderr,
            "ember serve: warning: the context (%d tokens) is longer than the %lld tokens the model was trained for; "
            "past them the output degrades unless RoPE is scaled by %.2fx (YaRN or linear: %s.rope.scaling.type "
            "and .factor in the GGUF)%s%s\n",
            b->ctx_tokens, (long long)trained, (double)b->ctx_tokens / (double)trained, arch ? arch : "<arch>",
            scaling ? "; the file already scales RoPE: " : "", scaling ? scaling : "");
}

/* What is served, before the "listening" line: the model, where it runs, how much it holds, where
 * to reach it. */
static void report_summary(const em_server_model *model, const ember_options *options, const em_server_options *server,
                           const em_server *s) {
    const em_server_engine *b = em_server_model_engine(model);
    ember_engine_info info;
    em_server_model_info(model, &info);
    const char *name = json_string_value(model_fact(b, "general", "name"));
    char parameters[32], kv[32];
    format_count(b->facts.parameters, parameters, sizeof parameters);
    format_bytes(info.kv_bytes, kv, sizeof kv);
    fprintf(stderr, "ember serve: model %s: %s, %s, %s parameters, %s (served as %s)\n", options->model_path,
            name ? name : "(no name)", b->facts.architecture ? b->facts.architecture : "unknown family", parameters,
            b->facts.quantization ? b->facts.quantization : "unknown quantization", b->model_id);
    if (!strcmp(info.device, "cpu")) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int threads = options->threads ? options->threads : cores > 0 ? (int)cores : 1;
        fprintf(stderr, "ember serve: device cpu, %d threads\n", threads);
    } else {
        fprintf(stderr, "ember serve: device %s\n", info.device);
    }
    const uint64_t kv_tokens = (uint64_t)info.kv_blocks * info.block_tokens;
    fprintf(stderr,
            "ember serve: context %d tokens; KV cache %s, room for %llu tokens (%.1f full contexts); "
            "%u requests at once\n",
            b->ctx_tokens, kv, (unsigned long long)kv_tokens, b->ctx_tokens ? (double)kv_tokens / b->ctx_tokens : 0.0,
            info.max_sequences);
    fprintf(stderr, "ember serve: chat page http://%s:%d/, APIs http://%s:%d/v1 (OpenAI, Anthropic), /api (Ollama)\n",
            server->host, em_server_port(s), server->host, em_server_port(s));
    if (em_server_ollama_port(s))
        fprintf(stderr, "ember serve: Ollama's clients: http://%s:%d (--ollama-port, the same APIs)\n", server->host,
                em_server_ollama_port(s));
    warn_long_context(b);
}

int em_cli_serve(int argc, char **argv) {
    ember_options options;
    ember_options_default(&options);
    em_cli_model source = {0}; /* -m/--gguf or --hf: resolved into options.model_path */
    const char *env_host = getenv("EMBER_HOST");
    em_server_options server = {.host = env_host && env_host[0] ? env_host : "127.0.0.1", .port = 11435,
                                .api_key = getenv("EMBER_API_KEY"), .access_log = EM_ACCESS_LOG_TEXT};
    if (!env_int("EMBER_PORT", 0, 65535, &server.port) || !env_int("EMBER_CTX", 1, INT_MAX, &options.ctx_tokens))
        return 1;
    const char *alias = NULL, *key_flag = NULL;
    bool quiet = false;
    em_cli_spec spec = {0};
    em_cli_cache cache;
    em_cli_cache_default(&cache);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        uint64_t size = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (em_cli_model_flag(&source, a)) continue;
        if (!strcmp(a, "--quiet")) {
            quiet = true;
            continue;
        }
        if (!known_option(a)) {
            const char *near = em_cli_nearest_option(a, serve_options);
            if (near) fprintf(stderr, "ember serve: unknown option '%s' (did you mean %s?)\n", a, near);
            else fprintf(stderr, "ember serve: unknown option '%s' (ember serve --help lists them)\n", a);
            return 1;
        }
        if (!strcmp(a, "--matryoshka")) {
            server.matryoshka = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "ember serve: %s needs a value\n", a);
            return 1;
        }
        em_err spec_err = NULL;
        if (em_cli_model_option(&source, a, v)) ok = true;
        else if (em_cli_spec_option(&spec, a, v, &spec_err) || em_cli_cache_option(&cache, a, v, &spec_err)) {
            if (spec_err) return em_cli_fail("serve", spec_err);
        }
        else if (!strcmp(a, "--host")) server.host = v;
        else if (!strcmp(a, "--port")) ok = parse_int(v, 0, 65535, &server.port);
        else if (!strcmp(a, "--ollama-port")) ok = parse_int(v, 1, 65535, &server.ollama_port);
        else if (!strcmp(a, "--api-key")) key_flag = server.api_key = v;
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) ok = parse_int(v, 1, INT_MAX, &options.ctx_tokens);
        else if (!strcmp(a, "--kv-mem")) ok = parse_size(v, &options.kv_mem_bytes);
        else if (!strcmp(a, "--kv-sequences")) ok = parse_int(v, 1, 1 << 20, &options.kv_sequences);
        else if (!strcmp(a, "--batch-tokens")) ok = parse_int(v, 1, INT_MAX, &options.batch_tokens);
        else if (!strcmp(a, "--max-sequences")) ok = parse_int(v, 1, INT_MAX, &options.max_sequences);
        else if (!strcmp(a, "--max-body")) {
            ok = parse_size(v, &size) && size > 0 && size <= SIZE_MAX;
            server.max_body = (size_t)size;
        } else if (!strcmp(a, "--device")) {
            ok = !strcmp(v, "cpu") || !strcmp(v, "cuda");
            options.device = v;
        }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) ok = parse_int(v, 0, 4096, &options.threads);
        else if (!strcmp(a, "--alias")) ok = (alias = v)[0] != 0;
        else if (!strcmp(a, "--pooling")) {
            options.pooling = !strcmp(v, "mean") ? EMBER_POOLING_MEAN : !strcmp(v, "cls") ? EMBER_POOLING_CLS
                              : !strcmp(v, "last") ? EMBER_POOLING_LAST : -1;
            ok = options.pooling > 0;
        }
        else if (!strcmp(a, "--log-format")) ok = em_access_log_format_parse(v, &server.access_log);
        else {
            fprintf(stderr, "ember serve: unknown option '%s' (ember serve --help lists them)\n", a);
            return 1;
        }
        if (!ok) {
            fprintf(stderr, "ember serve: bad value for %s: '%s'\n", a, v);
            return 1;
        }
        i++;
    }
    /* An empty key would serve without one: refused, so a key set from an empty secret never leaves
     * a server open by accident. */
    if (server.api_key && !server.api_key[0]) {
        fprintf(stderr, "ember serve: %s is empty; give a key, or none to serve without one\n",
                key_flag ? "--api-key" : "EMBER_API_KEY");
        return 1;
    }
    if (quiet) server.access_log = EM_ACCESS_LOG_OFF;
    const char *env_model = getenv("EMBER_MODEL");
    if (!source.file && !source.hf && env_model && env_model[0]) source.file = env_model;
    if (!source.file && !source.hf) {
        fprintf(stderr, "ember serve: a model is required (-m MODEL.gguf, --hf ORG/NAME[:QUANT] or EMBER_MODEL; "
                        "ember serve --help)\n");
        return 1;
    }
    /* A busy port is told now, not after minutes of loading. */
    em_err err = em_server_check_port(server.host, server.port);
    if (!err && server.ollama_port) err = em_server_check_port(server.host, server.ollama_port);
    if (err) return em_cli_fail("serve", err);
    options.weights_memory = source.weights_memory;
    em_cli_cache_apply(&cache, &options);
    err = em_cli_spec_apply(&spec, &options);
    if (!err) err = em_cli_model_path(&source, &options.model_path);
    if (err) return em_cli_fail("serve", err);

    /* Block the stop signals before any thread starts, so that every thread inherits the mask and
     * only sigwait below receives them; a client that hangs up must not kill the server. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    em_server_model *model = NULL;
    err = em_server_model_open(&options, alias, &model);
    if (err) {
        em_cli_model_free(&source);
        return em_cli_fail("serve", err);
    }
    em_server *s = NULL;
    err = em_server_start(&server, em_server_model_engine(model), &s);
    if (err) {
        em_server_model_close(model);
        em_cli_model_free(&source);
        return em_cli_fail("serve", err);
    }
    report_summary(model, &options, &server, s);
    report_cache_tiers(model);
    const em_server_engine *b = em_server_model_engine(model);
    printf("ember serve: listening on http://%s:%d (model %s, context %d tokens%s)\n", server.host, em_server_port(s),
           b->model_id, b->ctx_tokens, server.api_key ? ", API key required" : "");
    if (em_server_ollama_port(s))
        printf("ember serve: also listening on http://%s:%d (--ollama-port)\n", server.host, em_server_ollama_port(s));
    fflush(stdout);
    int sig = 0;
    sigwait(&stop, &sig);
    fprintf(stderr, "ember serve: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    em_server_stop(s);
    em_server_model_close(model);
    em_cli_model_free(&source);
    return 0;
}
