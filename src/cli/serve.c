/* `ember serve -m MODEL.gguf [...]`: the OpenAI-, Anthropic- and Ollama-compatible HTTP server (src/server)
 * in front of one engine. Prints one line when it accepts requests; stops on SIGINT or SIGTERM. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/server.h"
#include "cli.h"

static const char usage_text[] =
    "usage: ember serve (-m MODEL.gguf | --hf ORG/NAME[:QUANT]) [options]\n"
    EM_CLI_MODEL_USAGE
    "  --host HOST          address to bind (default 127.0.0.1)\n"
    "  --port N             port (default 11435; 0 picks a free one)\n"
    "  --ollama-port N      also listen on port N, with the same APIs (11434 for Ollama's clients that\n"
    "                       cannot be told another port; default: no second port)\n"
    "  --api-key KEY        require this key (Authorization: Bearer KEY or x-api-key: KEY);\n"
    "                       default: the EMBER_API_KEY environment variable, else none (an empty\n"
    "                       key is refused); /health, /metrics and the chat page need none\n"
    "  -c, --ctx N          longest prompt + output in tokens (default: the model's, at most 8192)\n"
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
    EM_CLI_CACHE_USAGE
    EM_CLI_SPEC_USAGE
    "                     (the default of requests; a request may turn it off: docs/speculative.md)\n";

static const char *const serve_options[] = {EM_CLI_MODEL_NAMES, EM_CLI_SPEC_NAMES, EM_CLI_CACHE_NAMES, "--host", "--port",
                                            "--api-key", "-c", "--ctx", "--kv-mem", "--kv-sequences", "--batch-tokens",
                                            "--max-sequences", "--max-body", "--device", "-t", "--threads", "--alias",
                                            "--pooling", "--matryoshka", "--mmap", "--no-mmap", "--help", NULL};

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

int em_cli_serve(int argc, char **argv) {
    ember_options options;
    ember_options_default(&options);
    em_cli_model source = {0}; /* -m/--gguf or --hf: resolved into options.model_path */
    em_server_options server = {.host = "127.0.0.1", .port = 11435, .api_key = getenv("EMBER_API_KEY")};
    const char *alias = NULL, *key_flag = NULL;
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
    if (!source.file && !source.hf) {
        fprintf(stderr, "ember serve: a model is required (-m MODEL.gguf or --hf ORG/NAME[:QUANT]; ember serve --help)\n");
        return 1;
    }
    options.weights_memory = source.weights_memory;
    em_cli_cache_apply(&cache, &options);
    em_err err = em_cli_spec_apply(&spec, &options);
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
