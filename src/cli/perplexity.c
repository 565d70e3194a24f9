/* `ember perplexity`: perplexity of a model over a text by llama.cpp's rules, and the comparison
 * of a model with the saved log-probabilities of another (docs/perplexity.md).
 *
 *   ember perplexity -m MODEL.gguf -f TEXT [--ctx N] [--chunks N] [--save-logits OUT.logits]
 *   ember perplexity -m MODEL.gguf --kl-base BASE.logits [-f TEXT] [--chunks N]
 *
 * The running perplexity after each window goes to stderr ([1]12.34,[2]11.98,...); the results go
 * to stdout. The windows, the scoring and the file live in src/perplexity. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../model/model.h"
#include "../perplexity/perplexity.h"
#include "cli.h"

#define DEFAULT_CTX 512u

typedef struct ppl_args {
    em_cli_model source;
    const char *text_file, *device, *save_file, *base_file;
    uint32_t ctx, max_chunks, n_threads;
} ppl_args;

/* Everything one run holds, freed by finish(). */
typedef struct ppl_run {
    ppl_args a;
    em_model *model;
    em_tokenizer *tokenizer;
    em_backend *backend;
    int32_t *text_tokens;
    size_t n_text_tokens;
    em_ppl_windows w;
    uint32_t n_vocab, chunk;
    float *logits;
    em_ppl_sum sum;
    em_logprobs_file save, base;
    em_ppl_kl kl;
} ppl_run;

static void usage(FILE *to) {
    fprintf(to,
            "usage: ember perplexity (-m MODEL.gguf | --hf ORG/NAME[:QUANT]) -f TEXT_FILE [--ctx N] [--chunks N]\n"
            "                        [--device cpu|cuda] [--threads N] [--save-logits OUT.logits]\n"
            "       ember perplexity -m MODEL.gguf --kl-base BASE.logits [-f TEXT_FILE] [--chunks N] ...\n"
            EM_CLI_MODEL_USAGE
            "  -f, --file FILE    the text (UTF-8), tokenized whole, BOS first when the vocabulary adds one\n"
            "  --ctx N            tokens per window (default 512, at most the model's context); each window\n"
            "                     scores its second half, as llama.cpp's llama-perplexity does\n"
            "  --chunks N         evaluate only the first N windows\n"
            "  --device cpu|cuda  where to run (default: CUDA when a GPU is present)\n"
            "  -t, --threads N    CPU threads (default: every core)\n"
            "  --save-logits OUT  also write every scored position's log-probabilities to OUT\n"
            "  --kl-base FILE     compare with the log-probabilities a --save-logits run wrote: KL divergence,\n"
            "                     top-1 agreement, Δp, both perplexities; -f, when given, must give the same\n"
            "                     tokens; --ctx is the file's\n"
            "Prints [window]running-PPL to stderr, then the results: PPL = x +/- y (llama.cpp's estimate).\n");
}

static em_err parse_count(const char *flag, const char *text, uint32_t lo, uint32_t hi, uint32_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (!*text || *end || errno || text[0] == '-' || v < lo || v > hi)
        return em_errorf(EM_ERR_INVALID, "%s expects a whole number in [%u, %u], got '%s'", flag, lo, hi, text);
    *out = (uint32_t)v;
    return NULL;
}

static const char *const ppl_options[] = {EM_CLI_MODEL_NAMES, "-f", "--file", "--save-logits", "--kl-base", "-c", "--ctx",
                                          "--chunks", "-t", "--threads", "--device", NULL};

static em_err parse_args(int argc, char **argv, ppl_args *a) {
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        bool known = false;
        for (size_t k = 0; ppl_options[k] && !known; k++) known = !strcmp(ppl_options[k], f);
        if (!known) {
            const char *near = em_cli_nearest_option(f, ppl_options);
            if (near) return em_errorf(EM_ERR_INVALID, "unknown option '%s' (did you mean %s?)", f, near);
            return em_errorf(EM_ERR_INVALID, "unknown option '%s' (ember perplexity --help lists them)", f);
        }
        if (i + 1 >= argc) return em_errorf(EM_ERR_INVALID, "%s needs a value", f);
        const char *v = argv[++i];
        em_err err = NULL;
        if (em_cli_model_option(&a->source, f, v)) continue;
        if (!strcmp(f, "-f") || !strcmp(f, "--file")) a->text_file = v;
        else if (!strcmp(f, "--save-logits")) a->save_file = v;
        else if (!strcmp(f, "--kl-base")) a->base_file = v;
        else if (!strcmp(f, "-c") || !strcmp(f, "--ctx")) err = parse_count(f, v, 1, 1u << 24, &a->ctx);
        else if (!strcmp(f, "--chunks")) err = parse_count(f, v, 1, UINT32_MAX, &a->max_chunks);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) err = parse_count(f, v, 1, 1024, &a->n_threads);
        else if (!strcmp(f, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda"))
                err = em_errorf(EM_ERR_INVALID, "--device expects cpu or cuda, got '%s'", v);
            a->device = v;
        } else
            err = em_errorf(EM_ERR_INVALID, "unknown option '%s'", f);
        if (err) return err;
    }
    if (!a->source.file && !a->source.hf)
        return em_errorf(EM_ERR_INVALID, "a model is required: -m MODEL.gguf or --hf ORG/NAME[:QUANT]");
    if (!a->text_file && !a->base_file) return em_errorf(EM_ERR_INVALID, "a text is required: -f TEXT_FILE");
    if (a->save_file && a->base_file) return em_errorf(EM_ERR_INVALID, "give --save-logits or --kl-base, not both");
    if (a->ctx && a->ctx < EM_PPL_MIN_CTX)
        return em_errorf(EM_ERR_INVALID, "--ctx %u is too small (at least %u)", a->ctx, EM_PPL_MIN_CTX);
    return NULL;
}

/* The window size: the base file's, else --ctx (at most the model's context), else 512 capped by it. */
static em_err choose_ctx(ppl_run *r) {
    const uint32_t trained = r->model->desc.n_ctx_train;
    if (r->a.base_file) {
        if (r->a.ctx && r->a.ctx != r->base.h.ctx)
            return em_errorf(EM_ERR_INVALID, "--ctx %u, but %s was written with windows of %u", r->a.ctx,
                             r->a.base_file, r->base.h.ctx);
        r->a.ctx = r->base.h.ctx;
    }
    if (!r->a.ctx) r->a.ctx = trained && trained < DEFAULT_CTX ? trained : DEFAULT_CTX;
    if (trained && r->a.ctx > trained)
        return em_errorf(EM_ERR_INVALID, "windows of %u tokens are longer than the model's context of %u", r->a.ctx,
                         trained);
    return NULL;
}

/* The tokens of -f, checked against the base file's when there is one; else the file's own. */
static em_err choose_tokens(ppl_run *r) {
    const int32_t *tokens;
    size_t n;
    if (r->a.text_file) {
        char *text = NULL;
        size_t len = 0;
        em_err err = em_cli_read_file(r->a.text_file, &text, &len); /* its errors name the file */
        if (err) return err;
        err = em_ppl_tokenize(r->tokenizer, text, len, &r->text_tokens, &r->n_text_tokens);
        free(text);
        if (err) return em_err_prefix(err, "%s", r->a.text_file);
        tokens = r->text_tokens, n = r->n_text_tokens;
    } else {
        tokens = r->base.tokens, n = (size_t)r->base.h.n_chunks * r->base.h.ctx;
    }
    const int32_t bos = em_tokenizer_adds_bos(r->tokenizer) ? em_tokenizer_bos(r->tokenizer) : EM_TOKEN_NONE;
    em_err err = em_ppl_windows_init(&r->w, tokens, n, r->a.ctx, r->a.max_chunks, bos);
    if (err) return em_err_prefix(err, "%s", r->a.text_file ? r->a.text_file : r->a.base_file);
    if (!r->a.base_file) return NULL;
    if (r->base.h.bos != bos)
        return em_errorf(EM_ERR_INVALID, "%s: its windows began with token %d, this model's with %d (-1: no BOS)",
                         r->a.base_file, r->base.h.bos, bos);
    if (r->w.n_chunks > r->base.h.n_chunks) r->w.n_chunks = r->base.h.n_chunks;
    for (uint64_t i = 0; i < (uint64_t)r->w.n_chunks * r->w.ctx; i++)
        if (tokens[i] != r->base.tokens[i])
            return em_errorf(EM_ERR_INVALID, "%s: token %llu (window %llu) is %d, but %s has %d: not the same text",
                             r->a.text_file, (unsigned long long)i, (unsigned long long)(i / r->w.ctx + 1), tokens[i],
                             r->a.base_file, r->base.tokens[i]);
    return NULL;
}

/* A base file fits this model when it has its vocabulary (size and token texts). */
static em_err check_base(ppl_run *r) {
    if (r->base.h.n_vocab != r->n_vocab)
        return em_errorf(EM_ERR_INVALID, "%s holds rows of %u tokens, but this model has %u: another vocabulary",
                         r->a.base_file, r->base.h.n_vocab, r->n_vocab);
    if (r->base.h.vocab_hash != em_ppl_vocab_hash(r->tokenizer))
        return em_errorf(EM_ERR_INVALID, "%s was written with another vocabulary (the token texts differ)",
                         r->a.base_file);
    return NULL;
}

static em_err setup(ppl_run *r) {
    const char *path;
    em_err err;
    if (r->a.base_file && (err = em_logprobs_open(&r->base, r->a.base_file))) return err;
    if ((err = em_cli_model_path(&r->a.source, &path))) return err;
    if ((err = em_model_load(path, &r->model))) return err;
    if ((err = em_tokenizer_from_gguf(r->model->gguf, &r->tokenizer))) return em_err_prefix(err, "%s", path);
    r->n_vocab = r->model->desc.n_vocab;
    if ((uint32_t)em_tokenizer_n_vocab(r->tokenizer) > r->n_vocab)
        return em_errorf(EM_ERR_FORMAT, "%s: the tokenizer has %d tokens but the model only %u logits", path,
                         em_tokenizer_n_vocab(r->tokenizer), r->n_vocab);
    if (r->a.base_file && (err = check_base(r))) return err;
    if ((err = choose_ctx(r)) || (err = choose_tokens(r))) return err;
    /* KV memory for one window, in whole blocks. */
    const uint32_t block_tokens = 16;
    em_backend_config config = {
        .device = r->a.device, .n_threads = r->a.n_threads, .block_tokens = block_tokens,
        .kv_tokens = (r->w.ctx + block_tokens - 1) / block_tokens * block_tokens,
    };
    if ((err = em_backend_create(r->model, &config, &r->backend))) return err;
    const uint64_t rows = r->w.n_scored < EM_PPL_BATCH_TOKENS ? r->w.n_scored : EM_PPL_BATCH_TOKENS;
    r->logits = malloc(rows * r->n_vocab * sizeof *r->logits);
    if (!r->logits) return em_errorf(EM_ERR_NOMEM, "out of memory for %llu rows of logits", (unsigned long long)rows);
    if (r->a.save_file) {
        const em_logprobs_header h = {
            .n_vocab = r->n_vocab, .ctx = r->w.ctx, .n_chunks = r->w.n_chunks, .first = r->w.first,
            .n_scored = r->w.n_scored, .bos = r->w.bos, .vocab_hash = em_ppl_vocab_hash(r->tokenizer),
        };
        if ((err = em_logprobs_create(&r->save, r->a.save_file, &h, r->w.tokens))) return err;
    }
    return NULL;
}

/* The scored rows of one batch: perplexity, and the row saved or compared with the base. */
static em_err score_rows(void *user, uint32_t pos, uint32_t n_rows, const float *logits) {
    ppl_run *r = user;
    const int32_t *window = r->w.tokens + (uint64_t)r->chunk * r->w.ctx;
    for (uint32_t i = 0; i < n_rows; i++) {
        const float *row = logits + (uint64_t)i * r->n_vocab;
        const int32_t target = window[pos + i + 1];
        int32_t top;
        const double lse = em_ppl_log_sum_exp(row, r->n_vocab, &top);
        em_ppl_add(&r->sum, lse - row[target]);
        em_err err = NULL;
        if (r->a.save_file) err = em_logprobs_write_row(&r->save, row, lse, target);
        if (r->a.base_file) {
            em_logprobs_row base;
            if (!(err = em_logprobs_read_row(&r->base, &base)))
                err = em_ppl_kl_add(&r->kl, row, r->n_vocab, lse, top, target, &base);
        }
        if (err) return err;
    }
    return NULL;
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void print_kl(em_ppl_kl *kl) {
    em_ppl_kl_report r;
    em_ppl_kl_finish(kl, &r);
    printf("\n====== Perplexity statistics ======\n");
    printf("Mean PPL(Q)                   : %10.6f +/- %10.6f\n", r.ppl.value, r.ppl.uncertainty);
    printf("Mean PPL(base)                : %10.6f +/- %10.6f\n", r.ppl_base.value, r.ppl_base.uncertainty);
    printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100 * r.correlation);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f +/- %10.6f\n", r.log_ratio.value, r.log_ratio.uncertainty);
    printf("Mean PPL(Q)/PPL(base)         : %10.6f +/- %10.6f\n", r.ratio.value, r.ratio.uncertainty);
    printf("Mean PPL(Q)-PPL(base)         : %10.6f +/- %10.6f\n", r.ppl_diff.value, r.ppl_diff.uncertainty);
    static const char *const names[EM_PPL_N_PERCENTILES] = {"Maximum", "99.9%  ", "99.0%  ", "95.0%  ", "90.0%  ",
                                                            "75.0%  ", "Median ", "25.0%  ", "10.0%  ", " 5.0%  ",
                                                            " 1.0%  ", " 0.1%  ", "Minimum"};
    printf("\n====== KL divergence statistics ======\n");
    printf("Mean    KLD: %.6g +/- %.6g\n", r.kld.value, r.kld.uncertainty);
    for (int i = 0; i < EM_PPL_N_PERCENTILES; i++) printf("%s KLD: %.6g\n", names[i], r.kld_at[i]);
    printf("\n====== Token probability statistics ======\n");
    printf("Mean    Δp: %6.3f +/- %5.3f %%\n", 100 * r.p_diff.value, 100 * r.p_diff.uncertainty);
    for (int i = 0; i < EM_PPL_N_PERCENTILES; i++) printf("%s Δp: %6.3f%%\n", names[i], 100 * r.p_diff_at[i]);
    printf("RMS Δp    : %6.3f +/- %5.3f %%\n", 100 * r.rms_p_diff.value, 100 * r.rms_p_diff.uncertainty);
    printf("Same top p: %6.3f +/- %5.3f %%\n", 100 * r.same_top.value, 100 * r.same_top.uncertainty);
}

static em_err run(ppl_run *r) {
    em_err err = setup(r);
    if (err) return err;
    fprintf(stderr, "perplexity: %u windows of %u tokens on %s, scoring positions %u..%u of each\n", r->w.n_chunks,
            r->w.ctx, r->backend->ops->name, r->w.first, r->w.ctx - 2);
    const double start = seconds();
    for (r->chunk = 0; r->chunk < r->w.n_chunks; r->chunk++) {
        if ((err = em_ppl_eval_window(r->backend, &r->w, r->chunk, r->logits, score_rows, r)))
            return em_err_prefix(err, "window %u", r->chunk + 1);
        fprintf(stderr, "[%u]%.4f,", r->chunk + 1, em_ppl_value(&r->sum));
        fflush(stderr);
    }
    const double elapsed = seconds() - start;
    fputc('\n', stderr);
    if (r->a.save_file && (err = em_logprobs_close(&r->save))) return err;
    const uint64_t evaluated = (uint64_t)r->w.n_chunks * r->w.ctx;
    printf("tokens: %llu evaluated in %u windows of %u (%llu scored), of %zu in %s\n", (unsigned long long)evaluated,
           r->w.n_chunks, r->w.ctx, (unsigned long long)r->sum.count,
           r->a.text_file ? r->n_text_tokens : (size_t)r->base.h.n_chunks * r->base.h.ctx,
           r->a.text_file ? r->a.text_file : r->a.base_file);
    printf("time: %.3f s on %s (%.1f tokens/s)\n", elapsed, r->backend->ops->name,
           elapsed > 0 ? (double)evaluated / elapsed : 0.0);
    printf("PPL = %.4f +/- %.5f\n", em_ppl_value(&r->sum), em_ppl_uncertainty(&r->sum));
    if (r->a.save_file) printf("saved: %s\n", r->a.save_file);
    if (r->a.base_file) print_kl(&r->kl);
    return NULL;
}

static void finish(ppl_run *r) {
    em_err_free(em_logprobs_close(&r->save));
    em_err_free(em_logprobs_close(&r->base));
    em_ppl_kl_free(&r->kl);
    free(r->logits);
    free(r->text_tokens);
    em_backend_free(r->backend);
    if (r->tokenizer) em_tokenizer_free(r->tokenizer);
    if (r->model) em_model_free(r->model);
    em_cli_model_free(&r->a.source);
}

int em_cli_perplexity(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
    ppl_run r = {0};
    em_err err = parse_args(argc, argv, &r.a);
    if (err) {
        em_cli_model_free(&r.a.source);
        return em_cli_fail("perplexity", err);
    }
    err = run(&r);
    /* A failed run leaves no half-written file behind. */
    if (err && r.a.save_file && r.save.f) {
        em_err_free(em_logprobs_close(&r.save));
        remove(r.a.save_file);
    }
    finish(&r);
    return err ? em_cli_fail("perplexity", err) : 0;
}
