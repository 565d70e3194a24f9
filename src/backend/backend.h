/*
 * backend — runs the forward pass of a described model (model.h) over a batch of tokens.
 *
 * One batch format for everything (DESIGN.md decision 2): N tokens spread over S sequences, each
 * token with its sequence and its position in that sequence, plus the tokens whose logits the
 * caller wants. Prefill chunks and single decode tokens of different sequences mix freely. A
 * token at position p attends to positions 0..p of its own sequence (fewer in sliding-window
 * layers); positions before the batch must already be in that sequence's KV cache, and positions
 * inside the batch are written before any token reads them, so a sequence may contribute a whole
 * chunk. A token may rewrite a position at or below the sequence's length: everything after it
 * is then forgotten (this is how a caller rolls a sequence back).
 *
 * The backend owns each sequence's KV cache. The CPU backend keeps one contiguous region per
 * sequence slot; the engine's paged cache will replace it with per-sequence block tables behind
 * the same KV accessors.
 *
 * Ownership: a backend borrows the em_model (which must outlive it) and owns its KV cache, its
 * scratch buffers and its threads. Batches and logits buffers belong to the caller.
 */
#ifndef EMBER_BACKEND_H
#define EMBER_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"
#include "../model/model.h"

typedef struct em_batch {
    uint32_t n_tokens;
    const int32_t *tokens;  /* [n_tokens] token ids */
    const uint32_t *seq;    /* [n_tokens] sequence slot of each token */
    const uint32_t *pos;    /* [n_tokens] position of each token in its sequence */
    const bool *logits;     /* [n_tokens] true where a logits row is wanted; NULL: the last token only */
} em_batch;

typedef struct em_backend em_backend;

typedef struct em_backend_ops {
    const char *name;
    /* Runs the batch; writes one row of n_vocab floats to `logits` for each token that wants one,
     * in batch order. On error nothing was written to any KV cache of a sequence in the batch
     * beyond what validation allows (validation happens before any work). */
    em_err (*forward)(em_backend *backend, const em_batch *batch, float *logits);
    /* Forgets positions >= `from` of a sequence (0 empties it). */
    em_err (*seq_truncate)(em_backend *backend, uint32_t seq, uint32_t from);
    /* Number of positions a sequence holds. */
    uint32_t (*seq_length)(const em_backend *backend, uint32_t seq);
    void (*free)(em_backend *backend);
} em_backend_ops;

struct em_backend {
    const em_backend_ops *ops;
    const em_model *model;
    uint32_t n_seq; /* sequence slots */
    uint32_t n_ctx; /* positions per sequence */
};

static inline em_err em_backend_forward(em_backend *b, const em_batch *batch, float *logits) {
    return b->ops->forward(b, batch, logits);
}
static inline em_err em_backend_seq_truncate(em_backend *b, uint32_t seq, uint32_t from) {
    return b->ops->seq_truncate(b, seq, from);
}
static inline uint32_t em_backend_seq_length(const em_backend *b, uint32_t seq) { return b->ops->seq_length(b, seq); }
static inline void em_backend_free(em_backend *b) {
    if (b) b->ops->free(b);
}

/* Number of logits rows the batch asks for. */
uint32_t em_batch_logits_rows(const em_batch *batch);

typedef struct em_cpu_options {
    uint32_t n_seq;     /* sequence slots (default 1) */
    uint32_t n_ctx;     /* positions per sequence (default: the model's training context, at most 4096) */
    uint32_t n_threads; /* default: the machine's online cores */
} em_cpu_options;

/* The reference backend: f32 activations, weights read in their stored format through quant's dot
 * products, matrix rows split across threads. */
em_err em_backend_cpu_new(const em_model *model, const em_cpu_options *options, em_backend **out);

#endif
