/*
 * engine — continuous batching over a paged KV cache with a token-exact prefix cache; implements
 * the public API of include/ember.h.
 *
 * Pieces, one file each:
 *   kv.c      the block pool: block numbers and reference counts (the memory behind a block
 *             belongs to the backend, which indexes its KV storage by block number);
 *   prefix.c  the prefix cache: a radix tree over token ids whose nodes each own one KV block;
 *   tiers.c   the prefix cache's lower tiers: blocks the pool evicts kept in host RAM, then on disk
 *             (disk.c: the files, their checks and the directory), and restored when matched;
 *   states.c  hybrid models' recurrent states: a slot per running request, and the snapshots
 *             that let a cached prefix be resumed;
 *   sample.c  per-request sampling (penalties, bias, temperature, top-k/p, min-p, seed) and
 *             logprobs, and a grammar's token mask (constrained requests: src/grammar; the mask
 *             is computed per step in sched.c and applied by the host or by a backend that can);
 *   stop.c    stop strings matched across token boundaries, holding back undecided text;
 *   spec.c    speculative decoding: drafts (prompt lookup or a draft model) and their length;
 *   sched.c   the scheduler: admission, chunked prefill, preemption under memory pressure;
 *   engine.c  the engine thread, the submission queue and per-request output rings;
 *   text.c    the model's text side for callers (ember_tokenize, ember_chat_tokens, ...): the
 *             engine's one em_text (src/text), so the model file is read once per process;
 *   embed.c   embedding requests: the prompt's final hidden states pooled (mean, first, last
 *             token) and normalized, instead of sampling.
 *
 * Threads: the engine thread owns the pool, the cache, the scheduler and all model state. Other
 * threads reach it only through the submission queue and the request rings (engine.c).
 * The engine depends on model, backend, text, tokenizer, grammar and quant; it never includes CUDA
 * headers.
 */
#ifndef EMBER_ENGINE_H
#define EMBER_ENGINE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../backend/pick.h"
#include "../base/base.h"
#include "../grammar/grammar.h"
#include "../model/model.h"
#include "../text/text.h"
#include "../tokenizer/tokenizer.h"
#include "ember.h"

/* ---- KV block pool (kv.c) ----
 * A block holds the keys and values of `block_tokens` consecutive positions of one sequence, for
 * every layer. Each running sequence whose block table lists a block holds one reference, and the
 * prefix cache holds one for every block it remembers; a block is free again at zero. */

typedef struct em_kv_pool {
    uint32_t n_blocks;
    uint32_t block_tokens;
    uint32_t *refcount; /* per block */
    uint32_t *free_list;
    uint32_t n_free;
} em_kv_pool;

em_err em_kv_pool_init(em_kv_pool *pool, uint32_t n_blocks, uint32_t block_tokens);
void em_kv_pool_free(em_kv_pool *pool);

/* Takes a free block (refcount 1). False when none is free. */
bool em_kv_alloc(em_kv_pool *pool, uint32_t *block);
void em_kv_retain(em_kv_pool *pool, uint32_t block);
/* Drops one reference; the block is free again at zero. */
void em_kv_release(em_kv_pool *pool, uint32_t block);
static inline uint32_t em_kv_refcount(const em_kv_pool *pool, uint32_t block) { return pool->refcount[block]; }
static inline uint32_t em_kv_free_count(const em_kv_pool *pool) { return pool->n_free; }



/* ---- Prefix cache (prefix.c) ----
 * A radix tree over token ids. Each node below the root stands for one KV block: the tokens that
 * block holds (block_tokens of them, or fewer for the tail of a finished sequence, which is always
 * a leaf) and the block number, on which the cache holds one reference. A path from the root spells
 * a cached prefix. Matching shares whole blocks by reference; when the match ends inside a block,
 * the caller copies that block's first rows into a fresh block, so reuse is token-exact.
 * Cached blocks are immutable: sequences write only into blocks they allocated themselves. */

/* Where a node's KV is (tiers.c). A node's children are never in a higher tier than itself (a
 * child on the device has its parent on the device), so a match restores a path top down and each
 * tier gives up its leaves first. */
typedef enum em_tier { EM_TIER_DEVICE, EM_TIER_RAM, EM_TIER_DISK } em_tier;

/* The identity of a cached prefix: a hash of its parent's key and its own tokens (tiers.c), so a
 * node found on disk after a restart knows its place in the tree. All zero: the root. */
#define EM_PREFIX_KEY_BYTES 16

typedef struct em_prefix_node {
    struct em_prefix_node *parent, *first_child, *next_sibling;
    int32_t *tokens; /* block_tokens capacity, n_tokens used */
    uint32_t n_tokens;
    uint32_t block;     /* EM_TIER_DEVICE: its KV block, on which the cache holds one reference */
    uint64_t last_used; /* logical clock of the last match or insert through this node */
    uint8_t tier;       /* an em_tier */
    bool pinned;        /* being restored: no tier moves or drops it meanwhile */
    void *host;         /* EM_TIER_RAM: its rows as the backend's kv_save wrote them (owned) */
    uint8_t key[EM_PREFIX_KEY_BYTES]; /* with tiers only; EM_TIER_DISK: its file's name */
} em_prefix_node;

typedef struct em_kv_tiers em_kv_tiers;

typedef struct em_prefix_cache {
    em_kv_pool *pool;
    em_prefix_node root; /* holds no block */
    uint64_t clock;
    uint32_t n_nodes; /* nodes on the device, each holding a block */
    uint64_t lookups, hits, tokens_reused, tokens_evicted;
    em_kv_tiers *tiers; /* NULL: evicted blocks are dropped (owned by the engine) */
} em_prefix_cache;

/* What a match found. The caller receives a reference on every block listed. */
typedef struct em_prefix_hit {
    uint32_t n_tokens;   /* tokens whose KV can be reused: n_blocks * block_tokens + copy_rows */
    uint32_t n_blocks;   /* whole blocks shared, written to the caller's array */
    uint32_t copy_block; /* EM_PREFIX_NO_BLOCK, or a block whose first copy_rows rows the caller copies */
    uint32_t copy_rows;  /* (then releases copy_block) */
    uint32_t ram_tokens, disk_tokens; /* of n_tokens, those restored from the lower tiers */
    double restore_ms;
} em_prefix_hit;

#define EM_PREFIX_NO_BLOCK UINT32_MAX

void em_prefix_init(em_prefix_cache *cache, em_kv_pool *pool);
/* Releases every block the cache holds and frees the tree. */
void em_prefix_free(em_prefix_cache *cache);

/* Finds the longest cached prefix of tokens[0..n) no longer than max_tokens. `blocks` has room for
 * max_tokens / block_tokens entries. Nodes of the path held in a lower tier are restored into
 * blocks of the pool (evicting others if needed); the match ends where that fails. */
void em_prefix_match(em_prefix_cache *cache, const int32_t *tokens, uint32_t n, uint32_t max_tokens,
                     uint32_t *blocks, em_prefix_hit *hit);

/* Remembers a finished (or preempted) sequence: `n` tokens whose KV sits in `blocks`
 * (ceil(n / block_tokens) of them). Blocks already cached under the same tokens are not added
 * twice; the cache takes a reference on each block it adds. */
em_err em_prefix_insert(em_prefix_cache *cache, const int32_t *tokens, uint32_t n, const uint32_t *blocks);

/* Frees up to `want` blocks by evicting least-recently-used leaves that no sequence uses: down to
 * the next tier where there is one (then each tier is brought back within its bound, least
 * recently used first), else dropped. Returns the number of blocks freed. */
uint32_t em_prefix_evict(em_prefix_cache *cache, uint32_t want);

/* Blocks the cache references (some may be shared with running sequences). */
static inline uint32_t em_prefix_cached_blocks(const em_prefix_cache *cache) { return cache->n_nodes; }

/* ---- Prefix cache tiers (tiers.c, disk.c) ----
 * Below the pool, the prefix cache keeps evicted nodes in host RAM (their rows copied out by the
 * backend's kv_save), and below RAM on disk, one file a node (a block group of one block: the
 * tree's unit, evicted and restored alone) named by its key. Each tier is bounded in bytes and gives
 * up its least recently used leaves first. A match that meets a node in a lower tier copies it back
 * into a block (kv_load) and the node is on the device again; its lower copy is dropped.
 *
 * The disk tier lives in a slot of the cache directory for the model's identity
 * (DIR/<identity>/slot-N), which one process holds at a time by a lock (flock), so two servers on
 * one directory never write the same files, and a restarted one takes a free slot back with its
 * files. At start-up the slot is indexed (headers only: identity, key, parent key, tokens, sizes),
 * and its nodes join the tree; a file's checksum is checked when it is restored. A file that does
 * not belong (another model or KV layout, truncated, corrupt, torn, unreachable) is skipped with a
 * log line and removed from the slot. A write that fails (a full disk) turns the tier off with a
 * warning; the engine keeps serving. At shutdown the cache is written down to disk, within its
 * bound, so conversations survive a restart. */

typedef struct em_disk_tier em_disk_tier;

struct em_kv_tiers {
    em_backend *backend;          /* borrowed: its kv_save / kv_load move the rows */
    uint64_t row_bytes;           /* one position's KV as kv_save writes it */
    uint64_t ram_limit;           /* 0: no RAM tier (blocks go straight to disk) */
    em_disk_tier *disk;           /* NULL: no disk tier (owned) */
    bool disk_writable;           /* false after a failed write: the disk tier takes nothing more */
    ember_tier_stats ram, disk_stats; /* bytes and blocks held now, and the counters */
    uint8_t *scratch;             /* one block's rows, for disk transfers */
};

/* Makes the tiers for the engine's backend: a RAM bound (0: none) and, with `dir`, the disk tier
 * (0 bound: the default); a disk tier that cannot be opened is left out with a warning. */
em_err em_tiers_new(em_backend *backend, const em_model *model, uint64_t ram_limit, const char *dir,
                    uint64_t disk_limit, em_kv_tiers **out);
void em_tiers_free(em_kv_tiers *tiers);
/* The disk tier's slot directory, or NULL without one. */
const char *em_tiers_disk_dir(const em_kv_tiers *tiers);
bool em_tiers_disk_on(const em_kv_tiers *tiers);
/* The node's key from its parent's key and its tokens. */
void em_tiers_key(const em_prefix_node *node);

/* One node's moves between tiers (prefix.c decides which; these do the copying and the
 * accounting). to_lower: from the device (its block released) or RAM, one tier down (RAM → disk,
 * or the device → disk without a RAM tier); false when there is no room or the copy failed: the
 * caller drops the node. load: its rows from RAM or disk into `block`, the lower copy dropped; an
 * error when the copy is unreadable (the caller drops the node). forget: its lower copy dropped. */
bool em_tiers_to_lower(em_kv_tiers *tiers, em_kv_pool *pool, em_prefix_node *node);
em_err em_tiers_load(em_kv_tiers *tiers, em_prefix_node *node, uint32_t block, double *ms);
/* `evicted`: the tier gave the node up (counted as its eviction), rather than a restore or an
 * error dropping it. */
void em_tiers_forget(em_kv_tiers *tiers, em_prefix_node *node, bool evicted);
/* Whether the tier would hold more than its bound with `incoming` more bytes. */
bool em_tiers_over(const em_kv_tiers *tiers, em_tier tier, uint64_t incoming);
/* The tier a node goes to when it leaves its own, and the bytes it takes there; false: none (it is
 * dropped). */
bool em_tiers_below(const em_kv_tiers *tiers, const em_prefix_node *node, em_tier *tier, uint64_t *bytes);

/* The disk slot's nodes, read at start-up into the tree (prefix.c, on top of the files' index). */
em_err em_prefix_load_disk(em_prefix_cache *cache);
/* At shutdown: every cached node that fits written down to the lowest tier. */
void em_prefix_flush(em_prefix_cache *cache);

/* The disk tier's files (disk.c). */
typedef struct em_disk_entry {
    uint8_t key[EM_PREFIX_KEY_BYTES], parent[EM_PREFIX_KEY_BYTES];
    int32_t *tokens; /* owned */
    uint32_t n_tokens;
    uint64_t file_bytes;
    int64_t modified_ns;
} em_disk_entry;

/* Takes a free slot of dir for this identity (created if missing) with `limit` bytes (0: the
 * default). An error when the directory cannot be made or locked. */
em_err em_disk_open(const char *dir, const uint8_t identity[32], uint32_t block_tokens, uint64_t row_bytes,
                    uint64_t limit, em_disk_tier **out);
void em_disk_close(em_disk_tier *disk);
const char *em_disk_dir(const em_disk_tier *disk);
uint64_t em_disk_limit(const em_disk_tier *disk);
/* The slot's files that pass the header checks (the others are skipped, counted in *skipped and
 * removed); entries are the caller's (em_disk_entries_free). */
em_err em_disk_index(em_disk_tier *disk, em_disk_entry **entries, size_t *n, uint64_t *skipped);
void em_disk_entries_free(em_disk_entry *entries, size_t n);
/* Writes a node's file; its size in *file_bytes. */
em_err em_disk_write(em_disk_tier *disk, const uint8_t key[EM_PREFIX_KEY_BYTES], const uint8_t parent[EM_PREFIX_KEY_BYTES],
                     const int32_t *tokens, uint32_t n_tokens, const void *rows, uint64_t *file_bytes);
/* Reads a node's rows, checking the whole file (identity, key, tokens, sizes, checksum). */
em_err em_disk_read(em_disk_tier *disk, const uint8_t key[EM_PREFIX_KEY_BYTES], const int32_t *tokens,
                    uint32_t n_tokens, void *rows);
/* The key of a node under `parent` holding tokens[0..n) (SHA-256 of both, cut to the key's size). */
void em_disk_key(const uint8_t parent[EM_PREFIX_KEY_BYTES], const int32_t *tokens, uint32_t n,
                 uint8_t out[EM_PREFIX_KEY_BYTES]);
/* Removes a node's file. */
void em_disk_remove(em_disk_tier *disk, const uint8_t key[EM_PREFIX_KEY_BYTES]);
/* The size of the file of a node of n_tokens tokens. */
uint64_t em_disk_file_bytes(const em_disk_tier *disk, uint32_t n_tokens);
/* The identity of a model's KV as a backend keeps it: the model file's metadata and tensor
 * descriptions, samples of every tensor's data, the backend's kv_format, row bytes and block size,
 * and the file format's version. */
em_err em_disk_identity(const em_model *model, const em_backend *backend, uint8_t out[32]);


/* ---- Recurrent states (states.c) ----
 * A hybrid model (program.h's em_program_state) carries a state per sequence besides its KV, kept by
 * the backend in slots (backend.h). Slots [0, first_snapshot) are the running requests', one each
 * while it runs; the others hold snapshots: the state after exactly the tokens a snapshot records,
 * taken where a request's prompt has been computed and where it retires (finished or preempted).
 * A state cannot be rebuilt from KV and cannot be rolled back, so a cached prefix is resumed only
 * up to the deepest snapshot that matches it token for token, the rest is recomputed (from the start
 * where none matches), and such models do not speculate (rejected drafts would have advanced the
 * state). Snapshots are replaced least recently used first. */

typedef struct em_state_snapshot {
    int32_t *tokens;      /* owned; n_tokens 0 = an empty slot */
    uint32_t n_tokens;
    uint64_t last_used;
} em_state_snapshot;

typedef struct em_state_cache {
    uint32_t first_snapshot;   /* backend slot of snapshot 0; the running slots come before it */
    uint32_t n_snapshots;
    em_state_snapshot *snapshots;
    bool *running_used;        /* per running slot */
    uint64_t clock;
    uint64_t stored, restored; /* snapshots taken, and matched at admission */
} em_state_cache;

em_err em_states_init(em_state_cache *cache, uint32_t running_slots, uint32_t snapshot_slots);
void em_states_free(em_state_cache *cache);
/* A free running slot; false when every one is taken. */
bool em_states_take_slot(em_state_cache *cache, uint32_t *slot);
void em_states_give_slot(em_state_cache *cache, uint32_t slot);
/* The length of the longest snapshot that is a prefix of tokens, at most max_tokens long (0: none),
 * and its backend slot in *slot. */
uint32_t em_states_match(em_state_cache *cache, const int32_t *tokens, uint32_t max_tokens, uint32_t *slot);
/* Keeps the state in backend slot `from` as the state after tokens[0..n). */
em_err em_states_store(em_state_cache *cache, em_backend *backend, uint32_t from, const int32_t *tokens, uint32_t n);

/* Snapshot slots the engine keeps for a hybrid model, beside one slot per running request. */
#define EM_STATE_SNAPSHOTS 16

/* ---- Sampling (sample.c) ----
 * Order of operations, per step: logit bias, then repetition/presence/frequency penalties over the
 * last repeat_last_n tokens of the sequence (prompt and output), then the pick rule of
 * backend/pick.h: greedy argmax (temperature 0), or min-p, top-k and top-p at temperature T and a
 * Gumbel-max draw whose random numbers depend only on (seed, tokens sampled so far, token id), so
 * a fixed seed gives the same tokens whatever else shares the batch, and whichever of the host or
 * the backend ran the rule. Logprobs are log-softmax of the biased, penalized logits at
 * temperature 1. A request with no bias, no penalties and no logprobs is "plain": its logits go
 * through the rule unchanged, so the backend may pick its tokens (sched.c) without the host ever
 * seeing the logits. */

typedef struct em_sampler {
    ember_sampling params;      /* logit_bias points into owned_bias */
    ember_logit_bias *owned_bias;
    uint32_t n_vocab;
    uint64_t n_sampled;         /* tokens picked so far: the rule's counter */
    uint32_t *order;            /* candidate token ids, n_vocab entries (scratch for logprobs) */
    uint64_t *keys;             /* scratch for the pick rule, 2 n_vocab entries */
    int32_t *window_tokens;     /* scratch for penalty counting */
    uint32_t *window_counts;
    size_t window_cap;
} em_sampler;

/* Checks the parameters (ranges, token ids in the bias list) and allocates scratch space. */
em_err em_sampler_init(em_sampler *sampler, const ember_sampling *params, uint32_t n_vocab);
void em_sampler_free(em_sampler *sampler);

/* Picks the next token. `logits` (n_vocab) is modified in place. `history` is the sequence so far.
 * `allowed` (NULL: every token) is a grammar's bitset of the tokens that may come next (bit t of
 * allowed[t / 32]): the others are set to -inf after bias and penalties, before the rule and the
 * logprobs, so logprobs are those of the constrained distribution.
 * With params.logprobs > 0, writes the chosen token's logprob to *logprob and the most likely
 * alternatives to `top` (room for params.logprobs entries), their count to *n_top. */
int32_t em_sampler_sample(em_sampler *sampler, float *logits, const uint32_t *allowed, const int32_t *history,
                          size_t n_history, float *logprob, ember_top_logprob *top, int *n_top);

/* True when the sampler applies the pick rule to the raw logits (no bias, penalties or logprobs). */
bool em_sampler_plain(const em_sampler *sampler);

/* The rule's parameters for the sampler's next token. A caller that has the rule run elsewhere (the
 * backend) passes these along and then counts the token with em_sampler_count_picked. */
em_pick_params em_sampler_pick_params(const em_sampler *sampler);
/* The same for the token `ahead` tokens after the next (speculative decoding: the pick after draft
 * `ahead` uses the counter that token would have without speculation; a step begun before the
 * next token is counted picks at ahead 1). */
em_pick_params em_sampler_pick_params_at(const em_sampler *sampler, uint32_t ahead);
static inline void em_sampler_count_picked(em_sampler *sampler) { sampler->n_sampled++; }

/* ---- Stop strings (stop.c) ----
 * Text is fed as it is detokenized. What cannot be the start of a stop string is released at
 * once; a suffix that could still grow into one is held back until the next piece decides it. */

typedef struct em_stop_matcher {
    char **stops;
    size_t *stop_lens;
    size_t n_stops;
    char *pending; /* text not yet released */
    size_t pending_len, pending_cap;
    char *out; /* released text of the last call (owned) */
    size_t out_cap;
} em_stop_matcher;

em_err em_stop_init(em_stop_matcher *matcher, const char *const *stops, size_t n_stops);
void em_stop_free(em_stop_matcher *matcher);

/* Adds text. Sets *release and *release_len to the text that is now decided (valid until the next
 * call). Returns the index of the stop string that matched (the released text ends right before
 * it and the rest is dropped), or -1. */
int em_stop_feed(em_stop_matcher *matcher, const char *text, size_t len, const char **release, size_t *release_len,
                 em_err *err);

/* At the end of generation: releases whatever is held back. */
void em_stop_flush(em_stop_matcher *matcher, const char **release, size_t *release_len);


/* ---- Speculative decoding (spec.c) ----
 * A decoding request may bring drafts d1..dk of its next tokens into a step: the step computes its
 * last token and the drafts (k + 1 positions) and picks a token at each, with the counter each
 * would have without speculation. The drafts are accepted while the picks agree with them, and the
 * pick after the last accepted draft is accepted too; the KV of the rejected positions is dropped.
 * Every output token is the model's own pick, so the output is the one decoding without
 * speculation gives (docs/speculative.md has the argument). */

/* The n-gram sizes prompt lookup tries, longest first. */
#define EM_SPEC_NGRAM_MAX 3
#define EM_SPEC_NGRAM_MIN 1
/* Steps a request waits before drafting again after a draft with nothing accepted, doubled after
 * each further miss in a row, at most EM_SPEC_PAUSE_DOUBLINGS times. */
#define EM_SPEC_PAUSE_STEPS 8
#define EM_SPEC_PAUSE_DOUBLINGS 5
/* The draft length a request starts with (within --draft-min and --draft-max). */
#define EM_SPEC_FIRST_DRAFT 2

/* Prompt lookup: finds the latest earlier occurrence of the last n tokens of tokens[0..n_tokens)
 * (n from EM_SPEC_NGRAM_MAX down to EM_SPEC_NGRAM_MIN) and drafts what followed it, up to
 * max_draft tokens (a continuation that reaches the end goes on with the tokens it drafted, as a
 * repetition would). Returns the number of tokens written to `draft`. */
uint32_t em_spec_lookup(const int32_t *tokens, uint32_t n_tokens, uint32_t max_draft, int32_t *draft);

/* What speculation costs, from the engine's own steps (moving averages, each with the count of
 * steps behind it): a plain decode step's milliseconds per token, and the milliseconds each draft
 * adds, to the step that verifies it and to the draft model's steps. Where steps overlap, a plain
 * step's time is the time between two chained steps' tokens, and a verification's runs from the
 * last step's tokens to its own, less the draft model's time (so the overlap it loses counts as
 * what its drafts cost). Where a step's time grows with its tokens (a model whose weights stay in
 * the CPU's caches), a draft costs nearly a token's time and pays only when nearly all of it is
 * accepted; where a step reads the weights once for all its tokens, a draft costs little. Besides, the draft model's drafting
 * steps as a whole: the milliseconds from the last step's tokens to theirs (the draft model's
 * steps, the verification and whatever the engine does between) per token they yield, which must
 * come under a plain token's for the draft model to pay, whatever the parts say. */
typedef struct em_spec_costs {
    double plain_ms_per_token;
    double verify_ms_per_draft;
    double model_ms_per_draft;
    double drafting_ms_per_token;
    uint32_t plain_steps, verify_steps, model_steps, drafting_steps;
} em_spec_costs;

/* A plain decode step of `tokens` tokens, or one with `drafts` drafts among them, took `ms`. */
void em_spec_cost_step(em_spec_costs *c, uint32_t tokens, uint32_t drafts, double ms);
/* The draft model took `ms` for `drafts` drafts. */
void em_spec_cost_model(em_spec_costs *c, uint32_t drafts, double ms);
/* A decode step in which the draft model drafted took `ms` since the last step's tokens and yielded
 * `tokens` tokens (each request's accepted drafts and the token after them). */
void em_spec_cost_drafting(em_spec_costs *c, uint32_t tokens, double ms);
/* The fewest accepted of `drafted` drafts that pay for their cost (at least 1). */
uint32_t em_spec_least(const em_spec_costs *c, uint32_t drafted);
/* Whether the costs say a draft model pays: a draft can (its parts cost less than a token) and
 * drafting steps, where measured, yield tokens faster than plain steps. */
bool em_spec_costs_model_pays(const em_spec_costs *c);

/* The adaptive draft length after a step that verified `drafted` drafts and accepted `accepted`:
 * doubled (up to max) when all were accepted, one past the accepted run when some were; when none
 * were, or fewer than `least` of a draft not wholly accepted, a miss: zero and a pause of
 * EM_SPEC_PAUSE_STEPS steps, doubled for each earlier miss in a row (`misses` counts them), after
 * which the request tries one draft. Never below min. */
void em_spec_adapt(uint32_t *length, uint32_t *pause, uint32_t *misses, uint32_t drafted, uint32_t accepted,
                   uint32_t least, uint32_t min, uint32_t max);


/* A draft model: its own backend and KV pool; each drafting request keeps a block table there
 * whose first draft_computed positions hold the draft model's KV of the request's tokens. */
typedef struct em_drafter {
    em_model *model;
    em_backend *backend;
    em_kv_pool pool;
    uint32_t cap_rows; /* batch scratch below: cap_rows tokens and sequences */
    int32_t *tokens;
    uint32_t *seq, *pos;
    bool *logits;
    em_batch_seq *seqs;
    em_pick_params *pick;
    int32_t *picked;
    struct ember_request **owner; /* per sequence of the draft batch */
    uint32_t *row_seq;            /* per logits row: its sequence */
} em_drafter;

/* ---- Embeddings (embed.c) ----
 * An embedding request (ember_request_params.embed) is a prompt and nothing more: it is admitted,
 * batched and prefilled like any other, but its tokens ask the backend for their final hidden
 * states (em_batch.hidden) instead of logits, which are pooled as the chunks of its prompt are
 * computed; when the last one is, the vector is normalized and the request finishes. It neither
 * matches nor fills the prefix cache: mean and first-token pooling need every token's hidden state
 * (a cached prefix would skip them), and nobody continues an embedded text, so its blocks would
 * only push out prefixes that conversations do continue. */
typedef struct em_embedding {
    int pooling;    /* EMBER_POOLING_MEAN, _CLS or _LAST */
    uint32_t width; /* floats in a hidden state */
    double *sum;    /* the rows pooled so far, summed (in double: a long prompt's mean) */
    uint32_t rows;
    float *vector;  /* the result, unit length, once `done` */
    bool done;
} em_embedding;

/* The engine's default pooling (options, else the GGUF's <arch>.pooling_type), the hidden width and
 * whether the backend can embed at all; the batch's hidden flags. */
em_err em_embed_init(ember_engine *engine, const ember_options *options);
/* At submission: the request's pooling checked (one is known, the backend returns hidden states)
 * and its state made (r->embedding). */
em_err em_embed_prepare(const ember_engine *engine, ember_request *r, const ember_request_params *params);
void em_embed_free(em_embedding *embedding);
/* At (re)admission: nothing pooled yet (a preempted request computes its prompt again). */
void em_embed_restart(em_embedding *embedding);
/* Whether the token at `pos` of a prompt of n_prompt tokens goes into the pool. */
static inline bool em_embed_wants(const em_embedding *m, uint32_t pos, uint32_t n_prompt) {
    return m->pooling == EMBER_POOLING_MEAN || (m->pooling == EMBER_POOLING_CLS && pos == 0) ||
           (m->pooling == EMBER_POOLING_LAST && pos + 1 == n_prompt);
}
/* Room for `rows` hidden states of a step in engine->hidden. */
em_err em_embed_reserve(ember_engine *engine, uint32_t rows);
/* After a step that ran embedding prompts, with the hidden states it asked for in engine->hidden
 * (in batch order: the running requests in order, each its scheduled positions, which n_computed
 * now ends): pools each embedding request's rows; one whose prompt is all computed gets its
 * vector (done). */
void em_embed_take(ember_engine *engine);

/* ---- Engine internals shared by engine.c and sched.c ---- */



#define EM_MAX_LOGPROBS 20

/* One side of a request's double-buffered output: the engine fills one while the reader holds the
 * other (see ember_request_next). */
typedef struct em_output_buffer {
    ember_token_out *tokens;
    ember_top_logprob *tops; /* EM_MAX_LOGPROBS per token */
    size_t n_tokens, cap_tokens;
    char *text;
    size_t text_len, cap_text;
} em_output_buffer;

typedef enum em_request_phase { EM_PHASE_WAITING, EM_PHASE_RUNNING, EM_PHASE_DONE } em_request_phase;

/* The grammar vocabulary of one set of control tokens counted as text (sorted ids; none for plain
 * requests), and the masks shared by the requests that use it (em_engine_grammar_vocab). */
#define EM_MAX_GRAMMAR_VOCABS 8
#define EM_MAX_CONTROL_TEXTS 16
typedef struct em_grammar_vocab_entry {
    int32_t *text_controls;
    size_t n_text_controls;
    em_grammar_vocab *vocab;
    em_grammar_masks *masks;
} em_grammar_vocab_entry;

struct ember_request {
    ember_engine *engine;
    struct ember_request *next; /* submission queue / waiting list link */
    pthread_mutex_t lock;       /* guards everything from here to `engine-thread state` */
    pthread_cond_t changed;
    int refs; /* the caller's handle and the engine's, while it runs */
    bool cancel;
    em_output_buffer out[2];
    int pending; /* which out[] the engine fills */
    bool output_lost;
    ember_finish_reason finish;
    int stop_index;
    char *error;
    double t_submitted, t_admitted, t_first_token, t_last_token, t_finished;
    uint32_t n_prompt, n_cached, n_generated;
    uint32_t n_restored_ram, n_restored_disk; /* of n_cached, restored from the lower tiers */
    double restore_ms;

    /* Engine-thread state (immutable or only touched by the engine thread after submission). */
    ember_request_params params; /* stop/stop_tokens point nowhere: see the copies below */
    char **stop_strings;
    size_t n_stop_strings;
    int32_t *stop_tokens;
    size_t n_stop_tokens;
    em_sampler sampler;
    /* Constrained decoding (NULL without a grammar): the compiled grammar, the parse state after
     * the generated tokens, and the allowed-token bitset of the next pick (computed when the
     * request gets a logits row; grammar_allowed is its count). */
    em_grammar *grammar;
    em_grammar_state *grammar_state;
    uint32_t *grammar_mask;
    uint32_t grammar_allowed;
    char *grammar_error; /* why its grammar failed (the request then ends with an error) */
    /* The grammar failed for being too ambiguous to follow here: the request's own fault
     * (ember_output.invalid_request), not the engine's. Written by the engine thread before the
     * finish is published. */
    bool grammar_too_ambiguous;
    /* A lazy grammar (ember_request_params.grammar_triggers): inactive until the output contains a
     * trigger; trigger_window keeps the output's last trigger_len - 1 bytes until then (trigger_len:
     * the longest trigger's). */
    char **grammar_triggers;
    size_t n_grammar_triggers, trigger_len;
    bool grammar_active;
    char *trigger_window;
    size_t trigger_window_len;
    /* Control tokens this request counts as text (ember_request_params.control_texts), sorted, and
     * the grammar vocabulary that gives them their text (an entry of the engine's list). */
    int32_t *text_controls;
    size_t n_text_controls;
    em_grammar_vocab_entry *grammar_vocab;
    em_stop_matcher stops;
    em_detok *detok;
    em_request_phase phase;
    int32_t *tokens; /* prompt, then generated tokens */
    uint32_t n_tokens, cap_tokens;
    uint32_t n_computed; /* tokens whose KV is in the cache: tokens[n_computed..n_tokens) are pending */
    uint32_t *blocks;    /* block table */
    uint32_t n_blocks;
    uint32_t state_slot; /* hybrid models: its recurrent-state slot while it runs (holds_state) */
    bool holds_state;
    uint64_t admitted_order; /* larger = younger (preempted first) */
    uint32_t scheduled;      /* pending tokens computed in the current step */
    uint32_t flight_row;     /* its logits row in the step in flight (sched.c), when it has one */
    em_embedding *embedding; /* an embedding request's pooling (embed.c); NULL for generation */
    /* Speculative decoding (spec.c). `draft` holds this step's drafts (n_draft, at most the
     * engine's draft_max), verified in the step; draft_length and draft_pause adapt the count. */
    ember_spec spec; /* resolved: OFF, LOOKUP or DRAFT */
    int32_t *draft;
    uint32_t n_draft, draft_length, draft_pause, draft_misses;
    bool drafts_chained; /* this step's drafts ride in a step chained behind another (sched.c) */
    uint32_t n_drafted, n_accepted; /* totals, for the timings (under `lock`) */
    /* With a draft model: the block table in its pool and how many tokens its KV holds. */
    uint32_t *draft_blocks;
    uint32_t n_draft_blocks, draft_computed;
};

struct ember_engine {
    ember_options options;
    em_model *model;
    em_text *text;                 /* the model's tokenizer and chat template, shared through ember.h */
    const em_tokenizer *tokenizer; /* text's, borrowed */
    em_backend *backend;
    uint32_t n_vocab, ctx_tokens, block_tokens, batch_tokens, max_sequences;
    em_kv_pool pool;
    em_prefix_cache cache;
    em_state_cache states; /* hybrid models only (recurrent: the backend keeps state slots) */
    bool recurrent;
    em_kv_tiers *tiers;     /* the prefix cache's lower tiers, or NULL (cache.tiers points here) */
    char tiers_off[160];    /* why an asked-for tier is off ("" when none is) */

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t lock; /* guards the submission queue, shutdown, poked, stats */
    pthread_cond_t wake;
    ember_request *submitted_head, *submitted_tail;
    bool shutdown, poked;
    ember_stats stats;

    /* Engine-thread state. */
    ember_request *waiting_head, *waiting_tail;
    ember_request **running;
    uint32_t n_running;
    uint64_t admissions;
    /* Batch scratch, sized for batch_tokens tokens and max_sequences sequences. */
    int32_t *batch_tokens_buf;
    uint32_t *batch_seq, *batch_pos;
    bool *batch_logits;
    em_batch_seq *batch_seqs;
    ember_request **row_owner; /* which request each logits row belongs to */
    /* Step overlap (sched.c), with a backend that offers it: a begun step whose tokens are not read
     * yet, the owner of each of its rows (NULL once that request has finished otherwise) and when
     * the last step's tokens were read. */
    bool in_flight;
    uint32_t flight_rows, flight_drafts; /* its logits rows, and the drafts among them */
    bool flight_chained; /* begun behind another: the time between their tokens is the chain's period */
    ember_request **flight_owner;
    double flight_mark;
    double last_step_end; /* when the last step's tokens were read */
    em_pick_params *pick;      /* per row, when the backend picks the tokens (max_sequences entries) */
    const uint32_t **pick_masks; /* per row: the row's grammar mask or NULL (max_sequences entries) */
    /* The vocabulary's token tries for grammars, one per set of control tokens counted as text
     * (the empty set first; the server asks for one more per call format), each built for the first
     * grammar that needs it, with the masks its requests share (same grammar, same parse state). */
    em_grammar_vocab_entry grammar_vocabs[EM_MAX_GRAMMAR_VOCABS];
    size_t n_grammar_vocabs;
    int32_t *picked;
    float *logits;
    size_t logits_rows_cap;
    /* Speculative decoding: the default mode, the draft length bounds, the draft model (or NULL). */
    ember_spec spec_default;
    uint32_t draft_max, draft_min;
    uint32_t spec_max_seqs; /* no drafts in steps of more running requests (ember_options) */
    uint64_t spec_clock;    /* steps seen by speculation (planned and chained): where pauses end */
    em_drafter *drafter;
    em_spec_costs spec_costs; /* what drafts cost here, measured (em_spec_least) */
    bool spec_model_timed;     /* the draft model drafted this step, past its prompt (em_spec_cost_drafting) */
    /* Embeddings (embed.c): the default pooling (an ember_pooling), a hidden state's width, why the
     * backend cannot embed ("" when it can), per batch token whether it wants its hidden state, and
     * a step's hidden states. */
    int pooling;
    uint32_t n_embd;
    char embed_refused[160];
    bool *batch_hidden;
    float *hidden;
    size_t hidden_rows_cap;
};

/* ---- Loading (engine.c) ---- */

/* Whether model files of `file_bytes` go into memory under EMBER_WEIGHTS_AUTO, given the text of
 * /proc/meminfo (its MemAvailable line): at most half of what is available. No figure: no. */
bool em_weights_fit(uint64_t file_bytes, const char *meminfo);

/* Where the model at `path` is to live: the options' choice, EMBER_WEIGHTS_AUTO resolved. */
em_gguf_memory em_engine_weights_memory(const ember_options *options, const char *path);

/* The grammar vocabulary for the request's control tokens counted as text (r->grammar_vocab):
 * found among the engine's, or built now (the token trie and its shared masks). Engine thread. */
em_err em_engine_grammar_vocab(ember_engine *e, ember_request *r);

/* Speculative decoding (spec.c), on the engine thread. */
em_err em_spec_init(ember_engine *engine, const ember_options *options);
void em_spec_free(ember_engine *engine);
/* Chooses this step's drafts (r->n_draft) for each running request that decodes and speculates;
 * with a draft model, runs it. A request without drafts has n_draft 0. */
void em_spec_propose(ember_engine *engine);
/* Drafts for the request's rows of the step chained behind the one in flight (prompt lookup only:
 * a draft model would need the token in flight): the lookup guesses that token and drafts what
 * follows it, into r->draft. Returns r->n_draft, 0 for none. */
uint32_t em_spec_propose_ahead(ember_engine *engine, ember_request *r);
/* After a verification: counts, adapts the length, keeps the draft model's KV to what was accepted. */
void em_spec_verified(ember_engine *engine, ember_request *r, uint32_t drafted, uint32_t accepted);
/* Drops the request's draft-model state (finished or preempted). */
void em_spec_release(ember_engine *engine, ember_request *r);
/* Whether the request drafts at all (it may still have none in a step). */
static inline bool em_spec_active(const ember_request *r) { return r->spec != EMBER_SPEC_OFF; }
/* Whether the engine drafts at all with its running requests: not in steps of more than
 * spec_max_seqs requests, where the weights are read for many tokens anyway and drafts would add
 * tokens to the step and keep it from being chained. */
static inline bool em_spec_engine_drafts(const ember_engine *e) { return e->n_running <= e->spec_max_seqs; }
/* Where steps overlap and other requests run, a step with drafts keeps the step after it from
 * being chained, for the whole batch: there a request starts to draft (its first draft, or the
 * first after a pause) only at steps that are multiples of EM_SPEC_PAUSE_STEPS, so that the
 * requests' attempts share their unchained steps instead of each breaking the chain at its own. */
static inline bool em_spec_shared(const ember_engine *e) { return e->n_running > 1 && em_backend_can_overlap(e->backend); }
static inline bool em_spec_may_start(const ember_engine *e, uint64_t clock) {
    return !em_spec_shared(e) || clock % EM_SPEC_PAUSE_STEPS == 0;
}
/* Whether the draft model drafts at the step of `clock` (em_spec_costs): not where it was measured
 * to cost more than a token per draft, but at one step in EM_SPEC_PROBE_STEPS, which measures again. */
bool em_spec_model_pays(const ember_engine *e, uint64_t clock);
/* Whether the request drafts in its next step (not pausing, or its pause ends there, and for a
 * draft model, one that pays). A draft model's drafts depend on the token before them, so such a
 * step cannot be chained behind the step in flight; prompt lookup guesses that token and drafts
 * ahead (em_spec_propose_ahead). */
static inline bool em_spec_drafts_next(const ember_engine *e, const ember_request *r) {
    if (!em_spec_engine_drafts(e) || !em_spec_active(r)) return false;
    if (r->spec == EMBER_SPEC_DRAFT && !em_spec_model_pays(e, e->spec_clock + 1)) return false;
    if (r->draft_length > 0) return true;
    return r->draft_pause <= 1 && em_spec_may_start(e, e->spec_clock + 1);
}

double em_engine_now_ms(void);
void em_engine_wake(ember_engine *engine);
void em_engine_emit(ember_request *r, int32_t token, float logprob, const ember_top_logprob *top, int n_top,
                    const char *text, size_t text_len);
void em_engine_finish(ember_request *r, ember_finish_reason reason, int stop_index, const char *error);
void em_engine_request_unref(ember_request *r);
/* The engine thread's main loop (sched.c). */
void *em_engine_thread(void *engine);

#endif
