/* `ember run -m MODEL.gguf -p TEXT [options]`: one answer to a prompt through the engine API, printed
 * as it streams, then on stderr the prompt's size, prefill time, decode speed, the seed and why
 * generation stopped.
 *
 * A text prompt (-p TEXT, -f FILE, or `-` for standard input) goes through the model's chat template
 * as one user message (after --system's, if given), the way `ember chat` and the server's
 * /v1/chat/completions build a prompt, when the model has a template; --raw, a model without one,
 * or --prompt-ids continue the text as it is (plain completion). The sampling options and their
 * defaults are `chat`'s (em_cli_generate, generate_options.c). Ctrl-C stops generation and still
 * prints the figures. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ember.h"
#include "grammar/grammar.h"

#define MAX_STOP 16

typedef struct run_args {
    em_cli_model source; /* -m/--gguf or --hf: resolved into `model` */
    em_cli_spec spec;
    em_cli_generate generate;
    const char *model, *prompt, *prompt_file, *prompt_ids, *system;
    bool raw, print_ids, print_probs, ignore_eos;
    const char *grammar_file, *schema_file; /* --grammar GBNF, --json-schema SCHEMA.json */
    const char *stop[MAX_STOP];
    size_t n_stop;
} run_args;

static void usage(FILE *to) {
    fprintf(to,
            "usage: ember run (-m MODEL.gguf | --hf ORG/NAME[:QUANT]) (-p TEXT | -f FILE | --prompt-ids \"ID ...\")\n"
            "                 [--system TEXT] [--raw] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
            "                 [--repeat-penalty R] [--seed S] [--stop TEXT]... [-c CTX] [-t THREADS] [--device cpu|cuda]\n"
            "                 [--print-ids] [--print-probs] [--ignore-eos] [--grammar FILE.gbnf | --json-schema SCHEMA.json]\n"
            "                 [--spec off|lookup|draft] [--draft-model FILE] [--draft-max N] [--draft-min N] [--spec-max-seqs N]\n"
            EM_CLI_MODEL_USAGE
            "  -p, --prompt TEXT  the prompt (-p -: read it from standard input)\n"
            "  -f, --file FILE    the prompt from a file (-f -: standard input); one final newline is dropped\n"
            "  --system TEXT      a system message before the prompt (needs the model's chat template)\n"
            "  --raw              continue the prompt as plain text, without the chat template\n"
            "  --prompt-ids       the prompt as token ids (plain completion); --print-ids prints generated ids, not text\n"
            EM_CLI_GENERATE_USAGE
            "  --stop TEXT        end the answer before this text (up to 16)\n"
            "  --print-probs      one line per generated token: id and its probability (softmax of the logits)\n"
            "  --ignore-eos       go on past end-of-generation tokens, to -n tokens\n"
            "  --grammar FILE     the output follows this GBNF grammar (llama.cpp's format; start rule root)\n"
            "  --json-schema FILE the output is a JSON value of this schema (docs/serve.md lists the keywords)\n"
            EM_CLI_SPEC_USAGE);
}

static const char *const run_options[] = {EM_CLI_MODEL_NAMES, EM_CLI_SPEC_NAMES, EM_CLI_GENERATE_NAMES,
                                          "-p", "--prompt", "-f", "--file", "--prompt-ids", "--system",
                                          "--grammar", "--json-schema", "--stop", "--raw", "--print-ids",
                                          "--print-probs", "--ignore-eos", "--mmap", "--no-mmap", "--help", NULL};

static em_err unknown_option(const char *flag) {
    const char *near = em_cli_nearest_option(flag, run_options);
    if (near) return em_errorf(EM_ERR_INVALID, "unknown option '%s' (did you mean %s?)", flag, near);
    return em_errorf(EM_ERR_INVALID, "unknown option '%s' (ember run --help lists them)", flag);
}

static bool known_option(const char *flag) {
    for (size_t i = 0; run_options[i]; i++)
        if (!strcmp(run_options[i], flag)) return true;
    return false;
}

static em_err parse_args(int argc, char **argv, run_args *a) {
    *a = (run_args){0};
    em_cli_generate_default(&a->generate);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (em_cli_model_flag(&a->source, f)) continue;
        bool *flag = !strcmp(f, "--print-ids") ? &a->print_ids : !strcmp(f, "--print-probs") ? &a->print_probs
                   : !strcmp(f, "--ignore-eos") ? &a->ignore_eos : !strcmp(f, "--raw") ? &a->raw : NULL;
        if (flag) {
            *flag = true;
            continue;
        }
        if (!known_option(f)) return unknown_option(f);
        if (i + 1 >= argc) return em_errorf(EM_ERR_INVALID, "%s needs a value", f);
        const char *v = argv[++i];
        em_err err = NULL;
        if (em_cli_model_option(&a->source, f, v)) continue;
        if (em_cli_spec_option(&a->spec, f, v, &err) || em_cli_generate_option(&a->generate, f, v, &err)) {
            if (err) return err;
            continue;
        }
        if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) {
            if (!strcmp(v, "-")) a->prompt_file = v;
            else a->prompt = v;
        } else if (!strcmp(f, "-f") || !strcmp(f, "--file")) a->prompt_file = v;
        else if (!strcmp(f, "--prompt-ids")) a->prompt_ids = v;
        else if (!strcmp(f, "--system")) a->system = v;
        else if (!strcmp(f, "--grammar")) a->grammar_file = v;
        else if (!strcmp(f, "--json-schema")) a->schema_file = v;
        else if (!strcmp(f, "--stop")) {
            if (a->n_stop == MAX_STOP) return em_errorf(EM_ERR_INVALID, "--stop: at most %d stop texts", MAX_STOP);
            if (!*v) return em_errorf(EM_ERR_INVALID, "--stop expects a non-empty text");
            a->stop[a->n_stop++] = v;
        } else
            return unknown_option(f);
    }
    if (!a->source.file && !a->source.hf) return em_errorf(EM_ERR_INVALID, "a model is required: -m MODEL.gguf or --hf ORG/NAME[:QUANT]");
    int prompts = !!a->prompt + !!a->prompt_file + !!a->prompt_ids;
    if (prompts == 0) return em_errorf(EM_ERR_INVALID, "a prompt is required (-p TEXT, -f FILE, -p - for standard input, or --prompt-ids)");
    if (prompts > 1) return em_errorf(EM_ERR_INVALID, "give one prompt: -p, -f or --prompt-ids");
    if (a->grammar_file && a->schema_file) return em_errorf(EM_ERR_INVALID, "give --grammar or --json-schema, not both");
    if (a->system && (a->raw || a->prompt_ids))
        return em_errorf(EM_ERR_INVALID, "--system goes through the chat template; it does not go with %s",
                         a->raw ? "--raw" : "--prompt-ids");
    return NULL;
}

/* "1 15043 3186" → ids, each checked against the vocabulary. */
static em_err parse_ids(const char *text, uint32_t n_vocab, int32_t **ids, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return em_errorf(EM_ERR_NOMEM, "out of memory reading prompt ids");
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v >= n_vocab)
            return em_errorf(EM_ERR_INVALID, "--prompt-ids: '%.*s' at offset %zu is not a token id below %u",
                             (int)strcspn(p, " ,\t\n"), p, (size_t)(p - text), n_vocab);
        if (*n == cap) {
            int32_t *grown = realloc(*ids, 2 * cap * sizeof **ids);
            if (!grown) return em_errorf(EM_ERR_NOMEM, "out of memory reading prompt ids");
            *ids = grown;
            cap *= 2;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    if (*n == 0) return em_errorf(EM_ERR_INVALID, "--prompt-ids holds no ids");
    return NULL;
}

/* The GBNF of --grammar or --json-schema (NULL without either), malloc'd. */
static em_err read_grammar(const run_args *a, char **gbnf) {
    *gbnf = NULL;
    const char *path = a->grammar_file ? a->grammar_file : a->schema_file;
    if (!path) return NULL;
    char *text;
    size_t len;
    em_err err = em_cli_read_file(path, &text, &len);
    if (err) return err;
    if (a->grammar_file) {
        *gbnf = text;
        return NULL;
    }
    err = em_grammar_from_json_schema(text, len, gbnf);
    free(text);
    return err ? em_err_prefix(err, "%s", path) : NULL;
}

/* The prompt's text: -p's, or -f's file (or standard input) without its final newline. */
static em_err read_prompt(const run_args *a, char **text, size_t *len) {
    if (a->prompt) {
        *len = strlen(a->prompt);
        *text = malloc(*len + 1);
        if (!*text) return em_errorf(EM_ERR_NOMEM, "out of memory for the prompt");
        memcpy(*text, a->prompt, *len + 1);
        return NULL;
    }
    em_err err = em_cli_read_file(a->prompt_file, text, len);
    if (err) return !strcmp(a->prompt_file, "-") ? em_err_prefix(err, "the prompt from standard input") : err;
    if (*len && (*text)[*len - 1] == '\n') (*text)[--*len] = '\0';
    if (*len && (*text)[*len - 1] == '\r') (*text)[--*len] = '\0';
    if (!*len) return em_errorf(EM_ERR_INVALID, "%s: the prompt is empty", strcmp(a->prompt_file, "-") ? a->prompt_file : "standard input");
    return NULL;
}

/* The prompt as tokens of the chat template's conversation [system?, user] in *ids, or NULL when it
 * is to be continued as plain text (--raw, or a model without a template). */
static em_err template_prompt(ember_engine *engine, const run_args *a, const char *text, size_t len, int32_t **ids,
                              size_t *n) {
    *ids = NULL;
    if (a->raw) return NULL;
    const char *template_text = NULL;
    size_t template_len = 0;
    em_err err = ember_chat_template(engine, &template_text, &template_len);
    if (err) return em_err_prefix(err, "the model's chat template (--raw runs the prompt as plain text)");
    if (!template_text) {
        if (a->system) return em_errorf(EM_ERR_INVALID, "--system needs a chat template, and this model has none");
        return NULL;
    }
    json_t *messages = json_array();
    if (a->system) json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "system", "content", a->system));
    json_array_append_new(messages, json_pack("{s:s, s:s%}", "role", "user", "content", text, len));
    char *json = json_array_size(messages) == 1 + !!a->system ? json_dumps(messages, JSON_COMPACT) : NULL;
    json_decref(messages);
    if (!json) return em_errorf(EM_ERR_INVALID, "the prompt or --system is not valid UTF-8 (or out of memory)");
    ember_chat chat = {.messages = json, .add_generation_prompt = true};
    err = ember_chat_tokens(engine, &chat, ids, n);
    free(json);
    return err;
}

/* Why generation ended, in words, for the last line on stderr. */
static void print_stop_reason(const ember_output *out, const ember_timings *t, uint32_t ctx_tokens, int max_tokens) {
    switch (out->finish) {
    case EMBER_FINISH_STOP:
        if (out->stop_string) fprintf(stderr, "stopped: stop string \"%s\"\n", out->stop_string);
        else fprintf(stderr, "stopped: end of text\n");
        break;
    case EMBER_FINISH_LENGTH:
        if (t->prompt_tokens + t->generated_tokens >= ctx_tokens) fprintf(stderr, "stopped: context full (%u tokens)\n", ctx_tokens);
        else fprintf(stderr, "stopped: length (-n %d)\n", max_tokens);
        break;
    case EMBER_FINISH_CANCELLED: fprintf(stderr, "stopped: interrupted\n"); break;
    default: break;
    }
}

/* Submits one request to an engine and prints its output as it streams. */
static em_err generate(const run_args *a, bool *interrupted) {
    ember_options options;
    ember_options_default(&options);
    options.model_path = a->model;
    em_cli_generate_apply(&a->generate, &options);
    options.weights_memory = a->source.weights_memory;
    options.max_sequences = 1;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    char *text = NULL;
    size_t text_len = 0;
    ember_engine *engine = NULL;
    ember_request *request = NULL;
    char *grammar = NULL;
    em_err err = em_cli_spec_apply(&a->spec, &options);
    if (!err) err = read_grammar(a, &grammar);
    if (!err && !a->prompt_ids) err = read_prompt(a, &text, &text_len);
    if (!err) err = ember_engine_create(&options, &engine);
    if (err) goto done;
    ember_request_params params;
    ember_request_default(&params);
    em_cli_generate_sampling(&a->generate, &params.sampling);
    if (a->print_probs) params.sampling.logprobs = 1;
    params.max_tokens = a->generate.max_tokens;
    params.ignore_eos = a->ignore_eos;
    params.grammar = grammar;
    params.stop = a->stop;
    params.n_stop = a->n_stop;
    if (a->prompt_ids) err = parse_ids(a->prompt_ids, INT32_MAX, &prompt, &n_prompt);
    else err = template_prompt(engine, a, text, text_len, &prompt, &n_prompt);
    if (err) goto done;
    if (prompt) {
        params.prompt_ids = prompt;
        params.n_prompt_ids = n_prompt;
    } else {
        params.prompt_text = text;
        params.prompt_text_len = text_len;
    }
    if ((err = ember_submit(engine, &params, &request))) goto done;
    em_cli_catch_interrupts(false);
    ember_output out = {.finish = EMBER_FINISH_NONE};
    size_t printed = 0;
    do {
        bool more = ember_request_next(request, &out, 100);
        if (!*interrupted && em_cli_interrupted()) *interrupted = true, ember_request_cancel(request);
        if (!more) continue;
        for (size_t i = 0; i < out.n_tokens; i++, printed++) {
            if (a->print_probs) printf("%d %.6f\n", out.tokens[i].token, exp(out.tokens[i].logprob));
            else if (a->print_ids) printf(printed ? " %d" : "%d", out.tokens[i].token);
        }
        if (!a->print_probs && !a->print_ids) fwrite(out.text, 1, out.text_len, stdout);
        fflush(stdout);
    } while (out.finish == EMBER_FINISH_NONE);
    if (out.finish == EMBER_FINISH_ERROR) {
        err = em_errorf(EM_ERR_INTERNAL, "generation failed: %s", out.error ? out.error : "unknown error");
        goto done;
    }
    if (!a->print_probs) printf("\n");
    fflush(stdout);
    ember_timings t;
    ember_request_timings(request, &t);
    fprintf(stderr, "prompt tokens: %u (%u cached)\nprefill: %.1f ms (%.1f tok/s)\ndecode: %u tokens, %.1f tok/s\n",
            t.prompt_tokens, t.cached_tokens, t.prefill_ms,
            t.prefill_ms > 0 ? (t.prompt_tokens - t.cached_tokens) / (t.prefill_ms / 1e3) : 0.0, t.generated_tokens,
            t.decode_tokens_per_second);
    if (t.draft_tokens)
        fprintf(stderr, "speculative: %u drafted, %u accepted (%.1f%%)\n", t.draft_tokens, t.draft_accepted,
                100.0 * t.draft_accepted / t.draft_tokens);
    else if (a->spec.mode != EMBER_SPEC_DEFAULT && a->spec.mode != EMBER_SPEC_OFF)
        fprintf(stderr, "speculative: nothing drafted\n");
    if (a->generate.temperature > 0) fprintf(stderr, "seed: %llu\n", (unsigned long long)a->generate.seed);
    ember_engine_info info;
    ember_engine_get_info(engine, &info);
    print_stop_reason(&out, &t, info.ctx_tokens, a->generate.max_tokens);
done:
    ember_request_release(request);
    ember_engine_destroy(engine);
    free(prompt);
    free(text);
    free(grammar);
    return err;
}

int em_cli_run(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    run_args a;
    em_err err = parse_args(argc, argv, &a);
    if (err) return em_cli_fail("run", err);
    bool interrupted = false;
    err = em_cli_model_path(&a.source, &a.model);
    if (!err) err = generate(&a, &interrupted);
    em_cli_model_free(&a.source);
    if (err) return em_cli_fail("run", err);
    return interrupted ? 130 : 0;
}
