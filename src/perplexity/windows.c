/* Windows over a text, their evaluation on a backend, and perplexity sums (perplexity.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "perplexity.h"

em_err em_ppl_tokenize(const em_tokenizer *tokenizer, const char *text, size_t len, int32_t **tokens,
                       size_t *n_tokens) {
    em_err err = em_tokenize(tokenizer, text, len, true, false, tokens, n_tokens);
    if (err) return err;
    const int32_t eos = em_tokenizer_eos(tokenizer);
    if (em_tokenizer_adds_eos(tokenizer) && *n_tokens > 0 && (*tokens)[*n_tokens - 1] == eos) (*n_tokens)--;
    return NULL;
}

em_err em_ppl_windows_init(em_ppl_windows *w, const int32_t *tokens, size_t n_tokens, uint32_t ctx,
                           uint32_t max_chunks, int32_t bos) {
    if (ctx < EM_PPL_MIN_CTX)
        return em_errorf(EM_ERR_INVALID, "a context of %u tokens is too small (at least %u)", ctx, EM_PPL_MIN_CTX);
    if (n_tokens < ctx)
        return em_errorf(EM_ERR_INVALID, "the text has %zu tokens, less than one window of %u", n_tokens, ctx);
    uint64_t n_chunks = n_tokens / ctx;
    if (max_chunks && n_chunks > max_chunks) n_chunks = max_chunks;
    if (n_chunks > UINT32_MAX)
        return em_errorf(EM_ERR_RANGE, "%llu windows are too many", (unsigned long long)n_chunks);
    *w = (em_ppl_windows){
        .tokens = tokens,
        .ctx = ctx,
        .n_chunks = (uint32_t)n_chunks,
        .first = ctx / 2,
        .n_scored = ctx - 1 - ctx / 2,
        .bos = bos,
    };
    return NULL;
}

/* One window, a batch at a time: positions before a batch are already in the KV cache (the window
 * starts over at position 0, which makes the backend forget the previous window). Only scored
 * positions ask for logits. */
em_err em_ppl_eval_window(em_backend *backend, const em_ppl_windows *w, uint32_t chunk, float *logits,
                          em_ppl_rows_fn rows, void *user) {
    const uint32_t ctx = w->ctx, last = w->first + w->n_scored; /* scored: [first, last) */
    const uint32_t per_seq = (ctx + backend->block_tokens - 1) / backend->block_tokens;
    if (per_seq > backend->n_blocks)
        return em_errorf(EM_ERR_INTERNAL, "a window of %u tokens needs %u KV blocks, the backend has %u", ctx, per_seq,
                         backend->n_blocks);
    const uint32_t cap = EM_PPL_BATCH_TOKENS;
    int32_t *tokens = malloc(cap * sizeof *tokens);
    uint32_t *seq = calloc(cap, sizeof *seq), *pos = malloc(cap * sizeof *pos);
    bool *want = malloc(cap * sizeof *want);
    uint32_t *blocks = malloc(per_seq * sizeof *blocks);
    em_err err = NULL;
    if (!tokens || !seq || !pos || !want || !blocks) {
        err = em_errorf(EM_ERR_NOMEM, "out of memory for a batch of %u tokens", cap);
        goto done;
    }
    em_batch_seq table;
    em_batch_fixed_tables(&table, blocks, 1, per_seq);
    const int32_t *window = w->tokens + (uint64_t)chunk * ctx;
    for (uint32_t start = 0; start < ctx && !err; start += cap) {
        const uint32_t n = ctx - start < cap ? ctx - start : cap;
        uint32_t n_rows = 0, first_row = 0;
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t p = start + i;
            tokens[i] = p == 0 && w->bos != EM_TOKEN_NONE ? w->bos : window[p];
            pos[i] = p;
            want[i] = p >= w->first && p < last;
            if (want[i] && n_rows++ == 0) first_row = p;
        }
        em_batch batch = {
            .n_tokens = n, .tokens = tokens, .seq = seq, .pos = pos, .logits = want, .n_seqs = 1, .seqs = &table,
        };
        err = em_backend_forward(backend, &batch, logits);
        if (!err && n_rows) err = rows(user, first_row, n_rows, logits);
    }
done:
    free(tokens);
    free(seq);
    free(pos);
    free(want);
    free(blocks);
    return err;
}

double em_ppl_log_sum_exp(const float *logits, uint32_t n_vocab, int32_t *argmax) {
    uint32_t top = 0;
    for (uint32_t i = 1; i < n_vocab; i++)
        if (logits[i] > logits[top]) top = i;
    const float max = logits[top];
    double sum = 0;
    for (uint32_t i = 0; i < n_vocab; i++) sum += expf(logits[i] - max);
    if (argmax) *argmax = (int32_t)top;
    return max + log(sum);
}

void em_ppl_add(em_ppl_sum *s, double nll) {
    s->nll += nll;
    s->nll2 += nll * nll;
    s->count++;
}

double em_ppl_value(const em_ppl_sum *s) { return s->count ? exp(s->nll / (double)s->count) : 0; }

/* The standard error of the mean NLL, carried through exp: d(e^x) = e^x dx. */
double em_ppl_uncertainty(const em_ppl_sum *s) {
    if (s->count < 2) return 0;
    const double mean = s->nll / (double)s->count, var = s->nll2 / (double)s->count - mean * mean;
    return var > 0 ? em_ppl_value(s) * sqrt(var / (double)(s->count - 1)) : 0;
}
