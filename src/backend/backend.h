/*
 * backend — runs the forward pass of a described model (model.h) over a batch of tokens.
 *
 * One batch format for everything (docs/DESIGN.md, decision 2): N tokens spread over S sequences, each
 * token with its sequence and its position in that sequence, plus the tokens whose logits the
 * caller wants. Prefill chunks and single decode tokens of different sequences mix freely. A
 * token at position p attends to positions 0..p of its own sequence (fewer in sliding-window
 * layers); positions before the batch must already be in that sequence's KV cache, and positions
 * inside the batch are written before any token reads them, so a sequence may contribute a whole
 * chunk. A token may rewrite a position at or below the sequence's length: everything after it
 * is then forgotten (this is how a caller rolls a sequence back).
 *
 * KV memory is paged (docs/DESIGN.md, decision 3): the backend owns a pool of `n_blocks` blocks, each
 * holding the keys and values of `block_tokens` consecutive positions for every layer. A batch
 * carries, for each of its sequences, the block table that maps position p to block
 * blocks[p / block_tokens], row p % block_tokens. Which blocks are free, shared or cached is the
 * engine's business (src/engine); the backend only reads and writes the rows a batch names, and
 * copies rows between blocks when the engine asks (token-exact prefix reuse).
 *
 * Recurrent state (hybrid models, whose program declares em_program_state): besides KV, each
 * sequence carries a fixed-size state through the step, kept by the backend in `n_state_slots`
 * slots. A batch's sequence names its slot (em_batch_seq.state). A state cannot be rolled back: a
 * token of such a model comes at position 0 (its slot starts from zeros) or at the position after the
 * last one its slot has seen; anything else is refused before any work. Snapshots of a state (the
 * engine's prefix cache) are slots too, filled and restored with copy_state.
 *
 * Ownership: a backend borrows the em_model (which must outlive it) and owns its KV memory, its
 * scratch buffers and its threads. Batches, block tables and logits buffers belong to the caller.
 */
#ifndef EMBER_BACKEND_H
#define EMBER_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"
#include "../model/model.h"
#include "pick.h"

/* One sequence of a batch: its block table. */
typedef struct em_batch_seq {
    const uint32_t *blocks;
    uint32_t n_blocks;
    uint32_t state;         /* its recurrent-state slot (models with recurrent state only) */
} em_batch_seq;

typedef struct em_batch {
    uint32_t n_tokens;
    const int32_t *tokens;  /* [n_tokens] token ids */
    const uint32_t *seq;    /* [n_tokens] index into seqs of each token's sequence */
    const uint32_t *pos;    /* [n_tokens] position of each token in its sequence */
    const bool *logits;     /* [n_tokens] true where a logits row is wanted; NULL: the last token only */
    uint32_t n_seqs;
    const em_batch_seq *seqs; /* [n_seqs] block tables */
    /* Per logits row, NULL or a grammar's bitset of the tokens the pick may choose (bit t of
     * mask[t / 32]); NULL for none at all. Only for a backend whose ops say picks_masked, and only
     * on forward_pick / pick_begin. */
    const uint32_t *const *pick_masks;
    /* pick_begin only, with a backend that offers pick_masks: the masks are not known yet (they
     * depend on the tokens of the step in flight); the step's pick waits for pick_masks. */
    bool pick_masks_later;
    /* Per token, true where the caller wants the token's final hidden state: the row the output
     * head reads (after the output norm), n_embd floats, written to hidden_out in batch order
     * (embeddings pool these). NULL: none. Only a backend whose ops say hidden_rows takes it;
     * em_batch_validate refuses it elsewhere. Independent of `logits`: a token may want either,
     * both or neither. */
    const bool *hidden;
    float *hidden_out;
} em_batch;

typedef struct em_backend em_backend;

typedef struct em_backend_ops {
    const char *name;
    /* Runs the batch; writes one row of n_vocab floats to `logits` for each token that wants one,
     * in batch order. The batch is validated before any work (token ids, sequence indices, block
     * numbers): an invalid batch writes nothing. */
    em_err (*forward)(em_backend *backend, const em_batch *batch, float *logits);
    /* Sampling on the backend: runs the batch like forward, then applies the pick rule (pick.h)
     * to each logits row with pick[row] and writes the token to picked[row]; no row comes back to
     * the host, only the tokens. NULL in a backend that cannot (callers then use forward). */
    em_err (*forward_pick)(em_backend *backend, const em_batch *batch, const em_pick_params *pick, int32_t *picked);
    /* Copies the first `rows` rows (all layers, keys and values) of block `from` into block `to`. */
    em_err (*copy_rows)(em_backend *backend, uint32_t from, uint32_t to, uint32_t rows);
    void (*free)(em_backend *backend);
    /* Step overlap (both NULL in a backend that does not offer it): pick_begin starts a batch like
     * forward_pick and returns before its tokens are known, so the caller can start the next step
     * first; a token of the batch may be EM_TOKEN_PICKED(r), the token that the previously begun
     * step picks for its logits row r. pick_end waits for the oldest begun step that has not ended
     * and writes its tokens. At most two steps are begun and not ended; copy_rows and forward may
     * be called only when none is. */
    em_err (*pick_begin)(em_backend *backend, const em_batch *batch, const em_pick_params *pick);
    em_err (*pick_end)(em_backend *backend, int32_t *picked);
    /* forward_pick and pick_begin honour em_batch.pick_masks (both backends do; a backend that did
     * not would get steps with constrained rows sampled on the host by the engine). */
    bool picks_masked;
    /* Late masks (NULL in a backend without them): gives the masks (as em_batch.pick_masks) of the
     * last begun step, begun with pick_masks_later, and starts its pick. Called once for such a
     * step, before the next pick_begin and before the pick_end that reads it (the pick_end of the
     * step before it may come first); `masks` may be NULL (no row constrained). The
     * device runs the step's forward meanwhile, while the host reads the step before it and works
     * out the grammar masks from its tokens. */
    em_err (*pick_masks)(em_backend *backend, const uint32_t *const *masks);
    /* Copies recurrent-state slot `from` (with the position it has reached) into slot `to`; NULL in a
     * backend that runs no model with recurrent state. Called only when no step is begun. */
    em_err (*copy_state)(em_backend *backend, uint32_t from, uint32_t to);
    /* The prefix cache's lower tiers (host RAM, disk: src/engine): a cached block's first `rows` rows
     * (all layers, keys and values) copied out to host memory, and back into a block. The host
     * bytes are rows * kv_bytes_per_token, laid out as kv_format says; only a backend with the same
     * kv_format and model reads them back. kv_save reads a cached block, which no step writes, so it
     * may come while steps are begun (the backend orders the copy after them); kv_load only when
     * none is. All three NULL in a backend without them: its prefix cache has no lower tiers. */
    em_err (*kv_save)(em_backend *backend, uint32_t block, uint32_t rows, void *host);
    em_err (*kv_load)(em_backend *backend, uint32_t block, uint32_t rows, const void *host);
    const char *kv_format; /* names the layout of kv_save's bytes, e.g. "cpu f32 rows, per cache K then V" */
    /* forward honours em_batch.hidden (embeddings); a backend without it cannot embed. */
    bool hidden_rows;
} em_backend_ops;

/* A batch token that is the previous begun step's pick for logits row r (pick_begin). */
#define EM_TOKEN_PICKED(r) (-1 - (int32_t)(r))
#define EM_TOKEN_PICKED_ROW(t) ((uint32_t)(-1 - (t)))

struct em_backend {
    const em_backend_ops *ops;
    const em_model *model;
    uint32_t n_blocks;     /* KV blocks in the pool */
    uint32_t block_tokens; /* positions per block */
    uint64_t kv_bytes_per_token; /* KV memory one position takes in this backend (all layers, K and V) */
    uint32_t n_state_slots;      /* recurrent-state slots (0 for a model without recurrent state) */
};

static inline em_err em_backend_forward(em_backend *b, const em_batch *batch, float *logits) {
    return b->ops->forward(b, batch, logits);
}
static inline bool em_backend_can_pick(const em_backend *b) { return b->ops->forward_pick != NULL; }
static inline em_err em_backend_forward_pick(em_backend *b, const em_batch *batch, const em_pick_params *pick,
                                             int32_t *picked) {
    return b->ops->forward_pick(b, batch, pick, picked);
}
static inline bool em_backend_can_overlap(const em_backend *b) { return b->ops->pick_begin != NULL; }
static inline bool em_backend_picks_masked(const em_backend *b) { return b->ops->picks_masked; }
static inline em_err em_backend_pick_begin(em_backend *b, const em_batch *batch, const em_pick_params *pick) {
    return b->ops->pick_begin(b, batch, pick);
}
static inline em_err em_backend_pick_end(em_backend *b, int32_t *picked) { return b->ops->pick_end(b, picked); }
static inline bool em_backend_picks_late(const em_backend *b) { return b->ops->pick_masks != NULL; }
static inline em_err em_backend_pick_masks(em_backend *b, const uint32_t *const *masks) {
    return b->ops->pick_masks(b, masks);
}
static inline em_err em_backend_copy_rows(em_backend *b, uint32_t from, uint32_t to, uint32_t rows) {
    return b->ops->copy_rows(b, from, to, rows);
}
static inline em_err em_backend_copy_state(em_backend *b, uint32_t from, uint32_t to) {
    if (!b->ops->copy_state) return em_errorf(EM_ERR_UNSUPPORTED, "the %s backend keeps no recurrent state", b->ops->name);
    return b->ops->copy_state(b, from, to);
}
static inline bool em_backend_can_tier(const em_backend *b) {
    return b->ops->kv_save && b->ops->kv_load && b->ops->kv_format;
}
static inline em_err em_backend_kv_save(em_backend *b, uint32_t block, uint32_t rows, void *host) {
    return b->ops->kv_save(b, block, rows, host);
}
static inline em_err em_backend_kv_load(em_backend *b, uint32_t block, uint32_t rows, const void *host) {
    return b->ops->kv_load(b, block, rows, host);
}
static inline void em_backend_free(em_backend *b) {
    if (b) b->ops->free(b);
}

/* How a backend is made: which device, how many threads, how much KV memory. */
typedef struct em_backend_config {
    const char *device;    /* "cpu", "cuda", or NULL: CUDA when a GPU is present, else the CPU */
    uint32_t n_threads;    /* CPU threads; 0 = the machine's online cores */
    uint32_t block_tokens; /* 0 = 16 */
    uint64_t kv_bytes;     /* KV memory budget; 0 = kv_tokens positions */
    uint64_t kv_tokens;    /* used when kv_bytes is 0; 0 = 4096 */
    uint32_t state_slots;  /* recurrent-state slots, for models with recurrent state; 0 = 16 */
} em_backend_config;

/* Bytes of KV memory one position takes in the CPU backend's f32 layout (every KV cache of the
 * model's program, K and V).
 * Other backends store KV differently (CUDA: f16): ask a made backend's kv_bytes_per_token. */
uint64_t em_backend_kv_bytes_per_token(const em_model *model);

/* Makes the backend the config asks for. Asking for nothing picks CUDA when a GPU is there (and can
 * run the model) and the CPU otherwise; asking for "cuda" without a usable GPU warns that it
 * runs on the CPU instead. */
em_err em_backend_create(const em_model *model, const em_backend_config *config, em_backend **out);

/* Whether em_backend_create picks the CPU backend for `device` (as in em_backend_config), known
 * before the model is loaded; a model the CUDA backend refuses runs on the CPU too, which only the
 * loaded model can tell. */
bool em_backend_picks_cpu(const char *device);

/* For callers without an engine (tests, tools): `n` sequences, each owning the consecutive blocks
 * [i * per_seq, (i + 1) * per_seq) of the pool and recurrent-state slot i. `blocks` holds n * per_seq
 * entries. */
void em_batch_fixed_tables(em_batch_seq *seqs, uint32_t *blocks, uint32_t n, uint32_t per_seq);

/* Number of logits rows the batch asks for. */
uint32_t em_batch_logits_rows(const em_batch *batch);
/* Number of hidden-state rows it asks for (em_batch.hidden). */
uint32_t em_batch_hidden_rows(const em_batch *batch);
/* The width of a hidden-state row: the output norm's. */
uint32_t em_backend_hidden_width(const em_model *model);

/* Checks a batch against a backend before any work: arrays present, an output buffer (`out`: logits,
 * or picked tokens) when rows are wanted, token ids inside the vocabulary, sequence indices inside the batch, block numbers inside
 * the pool, positions inside their sequence's block table. Every backend calls it first. */
em_err em_batch_validate(const em_batch *batch, const void *out, uint32_t n_vocab, const em_backend *backend);
/* The same for pick_begin, whose tokens may also be EM_TOKEN_PICKED(r) for r < picked_rows (the
 * rows of the previously begun step). */
em_err em_batch_validate_picked(const em_batch *batch, const void *out, uint32_t n_vocab, const em_backend *backend,
                                uint32_t picked_rows);

/* The reference backend: f32 activations and KV, weights read in their stored format through
 * quant's dot products, matrix rows and attention heads split across threads. */
em_err em_backend_cpu_new(const em_model *model, const em_backend_config *config, em_backend **out);

#endif
