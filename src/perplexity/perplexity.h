/*
 * perplexity — scoring a text with a model, by the rules of llama.cpp's `llama-perplexity`.
 *
 * The text's tokens (BOS first when the vocabulary adds one) are cut into non-overlapping windows
 * of `ctx` tokens; a window's first token is replaced by BOS when the vocabulary adds one, the
 * window is evaluated from position 0, and positions first = ctx/2 … ctx-2 are scored, each by
 * the negative log-likelihood of the token that follows it. Perplexity is exp of the mean over
 * every scored position; its uncertainty is ppl · sqrt(var(nll) / (count - 1)).
 *
 * A run can save, for every scored position, the whole distribution (compact log-probabilities,
 * docs/perplexity.md describes the file) and a later run of another model (a quantization of the
 * first) reads that file and compares: KL divergence of the saved distribution to its own,
 * top-1 agreement, the change in the probability of the right token, ln(PPL(Q)/PPL(base)), with
 * llama.cpp's uncertainty estimates.
 *
 * Evaluation runs through a backend (backend.h), one window at a time in batches of at most
 * EM_PPL_BATCH_TOKENS tokens, so only one batch's logits rows are ever in memory; the statistics
 * keep sums, plus one float per scored position for the KL and Δp percentiles.
 *
 * Ownership: em_ppl_windows borrows its tokens; a logprobs file owns its FILE and its tokens;
 * em_ppl_kl owns its value arrays. Depends on backend, model, tokenizer and base.
 */
#ifndef EMBER_PERPLEXITY_H
#define EMBER_PERPLEXITY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../backend/backend.h"
#include "../base/base.h"
#include "../tokenizer/tokenizer.h"

/* Tokens evaluated in one backend call; a longer window is evaluated in several, through the
 * KV cache. */
#define EM_PPL_BATCH_TOKENS 512u
/* The smallest window: below it, half a window is too little context to score anything. */
#define EM_PPL_MIN_CTX 8u

/* ---- Windows ---- */

typedef struct em_ppl_windows {
    const int32_t *tokens; /* the text's tokens, at least n_chunks * ctx */
    uint32_t ctx;          /* tokens per window */
    uint32_t n_chunks;     /* windows evaluated */
    uint32_t first;        /* first scored position: ctx / 2 */
    uint32_t n_scored;     /* scored positions per window: ctx - 1 - first */
    int32_t bos;           /* replaces each window's first token; EM_TOKEN_NONE: kept as is */
} em_ppl_windows;

/* The windows of `n_tokens` tokens: n_chunks = n_tokens / ctx, at most `max_chunks` (0: no limit).
 * An error when ctx is below EM_PPL_MIN_CTX or the text holds less than one window. */
em_err em_ppl_windows_init(em_ppl_windows *w, const int32_t *tokens, size_t n_tokens, uint32_t ctx,
                           uint32_t max_chunks, int32_t bos);

/* The text → tokens as llama.cpp's perplexity does: with BOS when the vocabulary adds one,
 * control-token text left as text. A trailing EOS that the vocabulary adds is dropped (llama.cpp
 * refuses such vocabularies; the windows would otherwise end on it). */
em_err em_ppl_tokenize(const em_tokenizer *tokenizer, const char *text, size_t len, int32_t **tokens,
                       size_t *n_tokens);

/* Receives the logits of scored positions [pos, pos + n_rows) of the window, rows of n_vocab. */
typedef em_err (*em_ppl_rows_fn)(void *user, uint32_t pos, uint32_t n_rows, const float *logits);

/* Evaluates window `chunk` on the backend (sequence 0 over blocks 0.., which must hold ctx
 * positions) and hands every scored row to `rows`, in order. `logits` is scratch for
 * min(EM_PPL_BATCH_TOKENS, n_scored) rows. */
em_err em_ppl_eval_window(em_backend *backend, const em_ppl_windows *w, uint32_t chunk, float *logits,
                          em_ppl_rows_fn rows, void *user);

/* ---- One logits row ---- */

/* log(sum(exp(logits))) as llama.cpp computes it: exp in f32 of each logit less the largest, summed
 * in double. *argmax (may be NULL): the first largest logit. The NLL of token t is this less
 * logits[t]; every statistic of a row starts from it, so it is computed once per row. */
double em_ppl_log_sum_exp(const float *logits, uint32_t n_vocab, int32_t *argmax);

/* ---- Perplexity ---- */

typedef struct em_ppl_sum {
    double nll, nll2; /* sums of the negative log-likelihoods and their squares */
    uint64_t count;
} em_ppl_sum;

/* Adds one scored position by its negative log-likelihood. */
void em_ppl_add(em_ppl_sum *s, double nll);
double em_ppl_value(const em_ppl_sum *s);
/* llama.cpp's estimate: ppl · sqrt((mean(nll²) - mean(nll)²) / (count - 1)); 0 when undefined. */
double em_ppl_uncertainty(const em_ppl_sum *s);

/* ---- The saved log-probabilities (docs/perplexity.md has the byte layout) ---- */

#define EM_LOGPROBS_MAGIC "EMBRLOGP"
#define EM_LOGPROBS_VERSION 1u
/* Log-probabilities more than this far below a row's largest are stored as "below the floor". */
#define EM_LOGPROBS_RANGE 24.0

typedef struct em_logprobs_header {
    uint32_t n_vocab, ctx, n_chunks, first, n_scored;
    int32_t bos;         /* the BOS the windows began with, EM_TOKEN_NONE for none */
    uint64_t vocab_hash; /* em_ppl_vocab_hash of the tokenizer that wrote the file */
} em_logprobs_header;

/* One row as read back: the base model's log-probability of token i is
 * floor + step · (q[i] - 1) when q[i] > 0; q[i] = 0 is below the floor (negligible mass). */
typedef struct em_logprobs_row {
    float floor, step;
    float target_logprob; /* exact (not quantized): log p of the token that followed */
    int32_t top;          /* the first most likely token of the base row */
    const uint16_t *q;    /* n_vocab entries, valid until the next read */
} em_logprobs_row;

typedef struct em_logprobs_file {
    FILE *f;
    char *path;
    em_logprobs_header h;
    int32_t *tokens; /* n_chunks * ctx: the text's tokens, before any BOS replacement */
    uint16_t *row;   /* one row's bytes */
    uint64_t rows_done;
    bool writing;
} em_logprobs_file;

/* FNV-1a (64 bits) over every token's stored text, each followed by a zero byte: two files from
 * models with different vocabularies differ here. */
uint64_t em_ppl_vocab_hash(const em_tokenizer *tokenizer);

/* Creates `path` and writes the header and the windows' tokens. */
em_err em_logprobs_create(em_logprobs_file *file, const char *path, const em_logprobs_header *header,
                          const int32_t *tokens);
/* Appends the row of one scored position from its logits (lse: em_ppl_log_sum_exp of them). */
em_err em_logprobs_write_row(em_logprobs_file *file, const float *logits, double lse, int32_t target);
/* Opens a file for reading: header and tokens checked (magic, version, sizes, the file's length). */
em_err em_logprobs_open(em_logprobs_file *file, const char *path);
em_err em_logprobs_read_row(em_logprobs_file *file, em_logprobs_row *row);
/* Closes the file; a file being written is flushed, and its error (a full disk) returned. */
em_err em_logprobs_close(em_logprobs_file *file);

/* ---- KL divergence against a saved base ---- */

typedef struct em_ppl_kl {
    double nll, nll2, nll_base, nll_base2, nll_nll_base;
    double kld, kld2;
    double p_diff, p_diff2, p_diff4;
    uint64_t count, same_top;
    float *kld_values, *p_diff_values; /* one per position, for percentiles */
    uint64_t cap;
} em_ppl_kl;

/* Adds one position: the model's logits (with their em_ppl_log_sum_exp and argmax) against the
 * saved base row. */
em_err em_ppl_kl_add(em_ppl_kl *kl, const float *logits, uint32_t n_vocab, double lse, int32_t top, int32_t target,
                     const em_logprobs_row *base);
void em_ppl_kl_free(em_ppl_kl *kl);

/* A mean and its uncertainty, llama.cpp's way: sqrt(var / (count - 1)), 0 for 10 values or fewer. */
typedef struct em_ppl_estimate {
    double value, uncertainty;
} em_ppl_estimate;

#define EM_PPL_N_PERCENTILES 13

typedef struct em_ppl_kl_report {
    em_ppl_estimate ppl, ppl_base, log_ratio, ratio, ppl_diff;
    double correlation; /* of the two log-perplexities, from their covariance */
    em_ppl_estimate kld, p_diff, rms_p_diff, same_top;
    double kld_at[EM_PPL_N_PERCENTILES], p_diff_at[EM_PPL_N_PERCENTILES]; /* at em_ppl_percentiles */
} em_ppl_kl_report;

/* The fractions the percentiles are taken at: 1 (the maximum), 0.999, 0.99, 0.95, 0.9, 0.75, 0.5
 * (the median), 0.25, 0.1, 0.05, 0.01, 0.001, 0 (the minimum); between two values, linearly. */
extern const double em_ppl_percentiles[EM_PPL_N_PERCENTILES];

/* The statistics of everything added (sorts the value arrays). */
void em_ppl_kl_finish(em_ppl_kl *kl, em_ppl_kl_report *report);

#endif
