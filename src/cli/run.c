/* `ember run -m MODEL.gguf -p TEXT [options]`: generate from a prompt through the engine API, printing
 * tokens as they come, then prompt size, prefill time and decode speed. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ember.h"
#include "grammar/grammar.h"

typedef struct run_args {
    em_cli_model source; /* -m/--gguf or --hf: resolved into `model` */
    const char *model, *prompt, *prompt_ids, *device;
    uint32_t n_predict, n_ctx, n_threads;
    bool print_ids, print_probs, ignore_eos;
    const char *grammar_file, *schema_file; /* --grammar GBNF, --json-schema SCHEMA.json */
    ember_sampling sampling;
    em_cli_spec spec;
} run_args;

static void usage(FILE *to) {
    fprintf(to,
            "usage: ember run (-m MODEL.gguf | --hf ORG/NAME[:QUANT]) (-p TEXT | --prompt-ids \"ID ...\") [-n N]\n"
            "                 [--temp T] [--top-k K]\n"
            "                 [--top-p P] [--min-p P] [--seed S] [--repeat-penalty R] [--print-ids]\n"
            "                 [-c CONTEXT] [-t THREADS] [--device cpu|cuda] [--ignore-eos]\n"
            "                 [--grammar FILE.gbnf | --json-schema SCHEMA.json]\n"
            "                 [--spec off|lookup|draft] [--draft-model FILE] [--draft-max N] [--draft-min N] [--spec-max-seqs N]\n"
            EM_CLI_MODEL_USAGE
            "  -n N               tokens to generate (default 64)\n"
            "  --temp T           0 = greedy (default 0.8); --top-k 40, --top-p 0.95, --min-p 0.05\n"
            "  --prompt-ids       the prompt as token ids; --print-ids prints generated ids, not text\n"
            "  --print-probs      one line per generated token: id and its probability (softmax of the logits)\n"
            "  --ignore-eos       go on past end-of-generation tokens, to -n tokens\n"
            "  --grammar FILE     the output follows this GBNF grammar (llama.cpp's format; start rule root)\n"
            "  --json-schema FILE the output is a JSON value of this schema (docs/serve.md lists the keywords)\n"
            EM_CLI_SPEC_USAGE);
}

static em_err parse_number(const char *flag, const char *text, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!*text || *end || errno || v < lo || v > hi)
        return em_errorf(EM_ERR_INVALID, "%s expects a number in [%g, %g], got '%s'", flag, lo, hi, text);
    *out = v;
    return NULL;
}

static em_err parse_args(int argc, char **argv, run_args *a) {
    *a = (run_args){.n_predict = 64};
    a->sampling = (ember_sampling){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                                   .repeat_penalty = 1.0f, .repeat_last_n = 64};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (em_cli_model_flag(&a->source, f)) continue;
        if (!strcmp(f, "--print-ids")) {
            a->print_ids = true;
            continue;
        }
        if (!strcmp(f, "--print-probs")) {
            a->print_probs = true;
            continue;
        }
        if (!strcmp(f, "--ignore-eos")) {
            a->ignore_eos = true;
            continue;
        }
        if (i + 1 >= argc) return em_errorf(EM_ERR_INVALID, "%s needs a value (or is unknown)", f);
        const char *v = argv[++i];
        double x = 0;
        em_err err = NULL;
        if (em_cli_model_option(&a->source, f, v)) continue;
        if (em_cli_spec_option(&a->spec, f, v, &err)) {
            if (err) return err;
            continue;
        }
        if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) a->prompt = v;
        else if (!strcmp(f, "--prompt-ids")) a->prompt_ids = v;
        else if (!strcmp(f, "--grammar")) a->grammar_file = v;
        else if (!strcmp(f, "--json-schema")) a->schema_file = v;
        else if (!strcmp(f, "-n")) {
            if (!(err = parse_number(f, v, 0, 1 << 24, &x)) && (x != (uint32_t)x || x < 1))
                err = em_errorf(EM_ERR_INVALID, "-n expects a positive number of tokens, got '%s'", v);
            a->n_predict = (uint32_t)x;
        } else if (!strcmp(f, "-c") || !strcmp(f, "--ctx")) {
            if (!(err = parse_number(f, v, 1, 1 << 24, &x))) a->n_ctx = (uint32_t)x;
        } else if (!strcmp(f, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) err = em_errorf(EM_ERR_INVALID, "--device expects cpu or cuda, got '%s'", v);
            a->device = v;
        } else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) {
            if (!(err = parse_number(f, v, 1, 1024, &x))) a->n_threads = (uint32_t)x;
        } else if (!strcmp(f, "--temp")) {
            if (!(err = parse_number(f, v, 0, 100, &x))) a->sampling.temperature = (float)x;
        } else if (!strcmp(f, "--top-k")) {
            if (!(err = parse_number(f, v, 0, 1 << 30, &x))) a->sampling.top_k = (int)x;
        } else if (!strcmp(f, "--top-p")) {
            if (!(err = parse_number(f, v, 1e-6, 1, &x))) a->sampling.top_p = (float)x;
        } else if (!strcmp(f, "--min-p")) {
            if (!(err = parse_number(f, v, 0, 1, &x))) a->sampling.min_p = (float)x;
        } else if (!strcmp(f, "--repeat-penalty")) {
            if (!(err = parse_number(f, v, 1e-3, 100, &x))) a->sampling.repeat_penalty = (float)x;
        } else if (!strcmp(f, "--seed")) {
            char *end;
            a->sampling.seed = strtoull(v, &end, 10);
            if (!*v || *end) err = em_errorf(EM_ERR_INVALID, "--seed expects an integer, got '%s'", v);
        } else
            err = em_errorf(EM_ERR_INVALID, "unknown option '%s'", f);
        if (err) return err;
    }
    if (!a->source.file && !a->source.hf) return em_errorf(EM_ERR_INVALID, "a model is required: -m MODEL.gguf or --hf ORG/NAME[:QUANT]");
    if (!a->prompt && !a->prompt_ids) return em_errorf(EM_ERR_INVALID, "a prompt is required (-p TEXT or --prompt-ids)");
    if (a->prompt && a->prompt_ids) return em_errorf(EM_ERR_INVALID, "give -p or --prompt-ids, not both");
    if (a->grammar_file && a->schema_file) return em_errorf(EM_ERR_INVALID, "give --grammar or --json-schema, not both");
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

/* Submits one request to an engine and prints its output as it streams. */
static em_err generate(const run_args *a) {
    ember_options options;
    ember_options_default(&options);
    options.model_path = a->model;
    options.ctx_tokens = (int)a->n_ctx;
    options.threads = (int)a->n_threads;
    options.device = a->device;
    options.weights_memory = a->source.weights_memory;
    options.max_sequences = 1;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    ember_engine *engine = NULL;
    ember_request *request = NULL;
    char *grammar = NULL;
    em_err err = em_cli_spec_apply(&a->spec, &options);
    if (!err) err = read_grammar(a, &grammar);
    if (err) return err;
    if ((err = ember_engine_create(&options, &engine))) {
        free(grammar);
        return err;
    }
    ember_request_params params;
    ember_request_default(&params);
    params.sampling = a->sampling;
    if (a->print_probs) params.sampling.logprobs = 1;
    params.max_tokens = (int)a->n_predict;
    params.ignore_eos = a->ignore_eos;
    params.grammar = grammar;
    if (a->prompt_ids) {
        if ((err = parse_ids(a->prompt_ids, INT32_MAX, &prompt, &n_prompt))) goto done;
        params.prompt_ids = prompt;
        params.n_prompt_ids = n_prompt;
    } else {
        params.prompt_text = a->prompt;
        params.prompt_text_len = strlen(a->prompt);
    }
    if ((err = ember_submit(engine, &params, &request))) goto done;
    ember_output out;
    size_t printed = 0;
    do {
        ember_request_next(request, &out, -1);
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
done:
    ember_request_release(request);
    ember_engine_destroy(engine);
    free(prompt);
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
    if (err) {
        usage(stderr);
        return em_cli_fail("run", err);
    }
    err = em_cli_model_path(&a.source, &a.model);
    if (!err) err = generate(&a);
    em_cli_model_free(&a.source);
    return err ? em_cli_fail("run", err) : 0;
}
