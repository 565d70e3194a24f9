/* `ember run -m MODEL.gguf -p TEXT [options]`: generate from a prompt on the CPU backend, printing
 * tokens as they come, then prompt size, prefill time and decode speed. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../backend/backend.h"
#include "../engine/engine.h"
#include "../model/model.h"
#include "cli.h"

typedef struct run_args {
    const char *model, *prompt, *prompt_ids;
    uint32_t n_predict, n_ctx, n_threads;
    bool print_ids, print_probs;
    ember_sampling sampling;
} run_args;

static void usage(FILE *to) {
    fprintf(to,
            "usage: ember run -m MODEL.gguf (-p TEXT | --prompt-ids \"ID ...\") [-n N] [--temp T] [--top-k K]\n"
            "                 [--top-p P] [--min-p P] [--seed S] [--repeat-penalty R] [--print-ids]\n"
            "                 [-c CONTEXT] [-t THREADS]\n"
            "  -n N               tokens to generate (default 64)\n"
            "  --temp T           0 = greedy (default 0.8); --top-k 40, --top-p 0.95, --min-p 0.05\n"
            "  --prompt-ids       the prompt as token ids; --print-ids prints generated ids, not text\n"
            "  --print-probs      one line per generated token: id and its probability (softmax of the logits)\n");
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
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
        if (!strcmp(f, "--print-ids")) {
            a->print_ids = true;
            continue;
        }
        if (!strcmp(f, "--print-probs")) {
            a->print_probs = true;
            continue;
        }
        if (i + 1 >= argc) return em_errorf(EM_ERR_INVALID, "%s needs a value (or is unknown)", f);
        const char *v = argv[++i];
        double x = 0;
        em_err err = NULL;
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) a->prompt = v;
        else if (!strcmp(f, "--prompt-ids")) a->prompt_ids = v;
        else if (!strcmp(f, "-n")) {
            if (!(err = parse_number(f, v, 0, 1 << 24, &x)) && (x != (uint32_t)x || x < 1))
                err = em_errorf(EM_ERR_INVALID, "-n expects a positive number of tokens, got '%s'", v);
            a->n_predict = (uint32_t)x;
        } else if (!strcmp(f, "-c") || !strcmp(f, "--ctx")) {
            if (!(err = parse_number(f, v, 1, 1 << 24, &x))) a->n_ctx = (uint32_t)x;
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
    if (!a->model) return em_errorf(EM_ERR_INVALID, "-m MODEL.gguf is required");
    if (!a->prompt && !a->prompt_ids) return em_errorf(EM_ERR_INVALID, "a prompt is required (-p TEXT or --prompt-ids)");
    if (a->prompt && a->prompt_ids) return em_errorf(EM_ERR_INVALID, "give -p or --prompt-ids, not both");
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

/* Runs the prompt through the backend in chunks; leaves its last logits in `logits`. */
static em_err prefill(em_backend *b, const int32_t *ids, size_t n, float *logits) {
    enum { CHUNK = 512 };
    uint32_t seq[CHUNK] = {0}, pos[CHUNK];
    for (size_t start = 0; start < n; start += CHUNK) {
        uint32_t count = (uint32_t)(n - start < CHUNK ? n - start : CHUNK);
        for (uint32_t i = 0; i < count; i++) pos[i] = (uint32_t)(start + i);
        em_batch batch = {count, ids + start, seq, pos, NULL};
        em_err err = em_backend_forward(b, &batch, logits);
        if (err) return err;
    }
    return NULL;
}

/* Softmax probability of `token` under the raw logits. */
static double probability(const float *logits, uint32_t n, int32_t token) {
    float max = logits[0];
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)logits[i] - max);
    return exp((double)logits[token] - max) / sum;
}

static em_err generate(const run_args *a) {
    em_model *model = NULL;
    em_backend *backend = NULL;
    em_sampler sampler;
    bool sampler_ready = false;
    int32_t *history = NULL;
    int32_t *prompt = NULL;
    float *logits = NULL, *work = NULL;
    size_t n_prompt = 0;
    em_err err = em_model_load(a->model, &model);
    if (err) return err;
    const em_model_desc *d = &model->desc;
    int64_t eos = -1;
    const em_gguf_kv *eos_kv = em_gguf_find(model->gguf, "tokenizer.ggml.eos_token_id");
    if (eos_kv) eos = em_gguf_kv_int(eos_kv);

    if (a->prompt_ids) {
        if ((err = parse_ids(a->prompt_ids, d->n_vocab, &prompt, &n_prompt))) goto done;
    } else {
        err = em_errorf(EM_ERR_UNSUPPORTED, "text prompts need the tokenizer module; use --prompt-ids");
        goto done;
    }
    em_cpu_options opt = {.n_seq = 1, .n_ctx = a->n_ctx, .n_threads = a->n_threads};
    if ((err = em_backend_cpu_new(model, &opt, &backend))) goto done;
    if (n_prompt >= backend->n_ctx) {
        err = em_errorf(EM_ERR_RANGE, "the prompt has %zu tokens; the context holds %u (prompt plus at least one "
                        "generated token)", n_prompt, backend->n_ctx);
        goto done;
    }
    if ((err = em_sampler_init(&sampler, &a->sampling, d->n_vocab))) goto done;
    sampler_ready = true;
    logits = malloc((size_t)d->n_vocab * sizeof *logits);
    work = malloc((size_t)d->n_vocab * sizeof *work);
    history = malloc((n_prompt + a->n_predict) * sizeof *history);
    if (!logits || !work || !history) {
        err = em_errorf(EM_ERR_NOMEM, "out of memory for logits");
        goto done;
    }
    memcpy(history, prompt, n_prompt * sizeof *history);

    double t0 = now_seconds();
    if ((err = prefill(backend, prompt, n_prompt, logits))) goto done;
    double t_prefill = now_seconds() - t0;

    uint32_t pos = (uint32_t)n_prompt, generated = 0;
    double t1 = now_seconds();
    while (generated < a->n_predict && pos < backend->n_ctx) {
        /* the sampler edits the row (penalties), so it works on a copy */
        memcpy(work, logits, (size_t)d->n_vocab * sizeof *work);
        int32_t token = em_sampler_sample(&sampler, work, history, n_prompt + generated, NULL, NULL, NULL);
        history[n_prompt + generated] = token;
        generated++;
        if (token == eos) break;
        if (a->print_probs)
            printf("%d %.6f\n", token, probability(logits, d->n_vocab, token));
        else
            printf(generated > 1 ? " %d" : "%d", token);
        fflush(stdout);
        if (generated == a->n_predict || pos + 1 >= backend->n_ctx) break;
        uint32_t seq = 0;
        em_batch batch = {1, &token, &seq, &pos, NULL};
        if ((err = em_backend_forward(backend, &batch, logits))) goto done;
        pos++;
    }
    double t_decode = now_seconds() - t1;
    if (!a->print_probs) printf("\n");
    fflush(stdout);
    fprintf(stderr, "prompt tokens: %zu\nprefill: %.1f ms (%.1f tok/s)\ndecode: %u tokens, %.1f tok/s\n", n_prompt,
            t_prefill * 1e3, n_prompt / (t_prefill > 0 ? t_prefill : 1e-9), generated,
            generated > 1 ? (generated - 1) / (t_decode > 0 ? t_decode : 1e-9) : 0.0);
done:
    free(logits);
    free(work);
    free(prompt);
    if (sampler_ready) em_sampler_free(&sampler);
    free(history);
    em_backend_free(backend);
    em_model_free(model);
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
    err = generate(&a);
    return err ? em_cli_fail("run", err) : 0;
}
