/*
 * Speculative decoding (engine.h, docs/speculative.md): where a step's drafts come from and how
 * many a request drafts. The verification itself is part of the step (sched.c): the drafts ride
 * in the batch after the request's last token, the model picks a token at each position, and the
 * picks that agree with the drafts are accepted.
 *
 * Two drafters. Prompt lookup copies what followed the latest earlier occurrence of the last few
 * tokens (free to compute; it pays off on text that repeats its context: edits, code, quotes). A
 * draft model is a second, smaller model with the same vocabulary, run by the engine on its own
 * backend and KV pool: each drafting request keeps a block table there, caught up with the
 * request's tokens before each draft and cut back to the accepted tokens after each verification.
 * The draft model picks with the request's own rule and random numbers (pick.h, the same seed and
 * counter as the target's pick at that position), so where the two models agree on the
 * distribution they tend to agree on the token.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

uint32_t em_spec_lookup(const int32_t *tokens, uint32_t n_tokens, uint32_t max_draft, int32_t *draft) {
    if (max_draft == 0) return 0;
    for (uint32_t size = EM_SPEC_NGRAM_MAX; size >= EM_SPEC_NGRAM_MIN; size--) {
        if (n_tokens < size + 1) continue;
        const int32_t *tail = tokens + n_tokens - size;
        for (uint32_t at = n_tokens - size; at-- > 0;) { /* the latest occurrence first */
            if (memcmp(tokens + at, tail, size * sizeof *tokens)) continue;
            uint32_t count = 0;
            /* What followed, read on into the drafts themselves once it reaches the end: text that
             * repeats with a period shorter than the draft goes on repeating. */
            for (uint32_t i = at + size; count < max_draft; i++)
                draft[count++] = i < n_tokens ? tokens[i] : draft[i - n_tokens];
            return count;
        }
    }
    return 0;
}

void em_spec_adapt(uint32_t *length, uint32_t *pause, uint32_t *misses, uint32_t drafted, uint32_t accepted,
                   uint32_t least, uint32_t min, uint32_t max) {
    if (drafted == 0) return;
    uint32_t next;
    if (accepted == drafted) next = 2 * *length > drafted ? 2 * *length : 2 * drafted;
    else next = accepted + 1;
    if (accepted == 0 || (accepted < least && accepted < drafted)) {
        /* A rejected draft costs a step that yields one token anyway; after repeated misses the
         * request drafts ever more rarely, so text that cannot be drafted runs at plain speed. */
        next = 0;
        *pause = EM_SPEC_PAUSE_STEPS << (*misses < EM_SPEC_PAUSE_DOUBLINGS ? *misses : EM_SPEC_PAUSE_DOUBLINGS);
        (*misses)++;
    } else {
        *misses = 0;
    }
    if (next > max) next = max;
    if (next < min) next = min;
    *length = next;
    if (next > 0) *pause = 0;
}

/* A moving average over about the last 16 values, starting at the first (`count` values seen). */
static void average_in(double *average, uint32_t *count, double value) {
    *average = *count ? *average + (value - *average) / 16 : value;
    if (*count < UINT32_MAX) (*count)++;
}

void em_spec_cost_step(em_spec_costs *c, uint32_t tokens, uint32_t drafts, double ms) {
    if (tokens <= drafts || ms <= 0) return;
    if (drafts == 0) average_in(&c->plain_ms_per_token, &c->plain_steps, ms / tokens);
    else if (c->plain_steps) {
        const double extra = ms - c->plain_ms_per_token * (tokens - drafts);
        average_in(&c->verify_ms_per_draft, &c->verify_steps, (extra > 0 ? extra : 0) / drafts);
    }
}

void em_spec_cost_model(em_spec_costs *c, uint32_t drafts, double ms) {
    if (drafts && ms > 0) average_in(&c->model_ms_per_draft, &c->model_steps, ms / drafts);
}

void em_spec_cost_drafting(em_spec_costs *c, uint32_t tokens, double ms) {
    if (tokens && ms > 0) average_in(&c->drafting_ms_per_token, &c->drafting_steps, ms / tokens);
}

uint32_t em_spec_least(const em_spec_costs *c, uint32_t drafted) {
    if (!c->plain_steps || !c->verify_steps || c->plain_ms_per_token <= 0) return 1;
    /* each accepted draft saves a plain token's time; each draft costs its share of two steps */
    const double share = (c->verify_ms_per_draft + c->model_ms_per_draft) / c->plain_ms_per_token;
    const double least = ceil(share * drafted - 1e-6); /* a share of exactly k is k, not k + 1 */
    return least < 1 ? 1 : least > drafted + 1 ? drafted + 1 : (uint32_t)least;
}

/* Where steps overlap, a step with drafts keeps the next one from being chained for the whole
 * batch. With other requests running, a draft that gains one token for one request costs each of
 * them more than that: there one accepted token of several drafted counts as a miss. Where steps
 * do not overlap, the measured costs say how many accepted drafts pay (em_spec_least). */
static void adapt(ember_engine *e, ember_request *r, uint32_t drafted, uint32_t accepted) {
    const uint32_t least = em_backend_can_overlap(e->backend) ? (em_spec_shared(e) ? 2 : 1)
                                                              : em_spec_least(&e->spec_costs, drafted);
    if (least > drafted) accepted = 0; /* not even a wholly accepted draft pays here: a miss */
    em_spec_adapt(&r->draft_length, &r->draft_pause, &r->draft_misses, drafted, accepted, least, e->draft_min,
                  e->draft_max);
}

/* A lookup that finds nothing drafts nothing and costs no step: alone, the request looks again at
 * the next step. With other requests running where steps overlap, it counts as a rejected draft
 * (a pause, doubled by each further miss in a row), since there each draft that does not pay costs
 * every request an unchained step, and text that did not repeat lately mostly does not. */
static void nothing_found(ember_engine *e, ember_request *r) {
    if (em_spec_shared(e)) adapt(e, r, 1, 0);
}

/* ---- The draft model ---- */

/* Tokens a request's draft model catches up with before drafting, at most, in a step whose time
 * measures what drafts cost (more: its prompt). */
#define EM_SPEC_CATCH_UP 8
/* Steps between two tries of a draft model that costs more than it can save (a try catches its KV
 * up with every token since the last one). */
#define EM_SPEC_PROBE_STEPS 4096

static uint32_t blocks_for(uint32_t tokens, uint32_t block_tokens) { return (tokens + block_tokens - 1) / block_tokens; }

/* Same vocabulary: the same number of tokens and the same text for a spread of them. */
static em_err check_vocabulary(const ember_engine *e, const em_model *draft, const char *path) {
    if (draft->desc.n_vocab != e->n_vocab)
        return em_errorf(EM_ERR_INVALID, "%s: the draft model has %u tokens, the model %u; they need the same vocabulary",
                         path, draft->desc.n_vocab, e->n_vocab);
    em_tokenizer *tokenizer;
    em_err err = em_tokenizer_from_gguf(draft->gguf, &tokenizer);
    if (err) return em_err_prefix(err, "%s", path);
    const int32_t n = em_tokenizer_n_vocab(e->tokenizer);
    if (em_tokenizer_n_vocab(tokenizer) != n)
        err = em_errorf(EM_ERR_INVALID, "%s: the draft model's tokenizer has %d tokens, the model's %d: not the same vocabulary", path,
                        em_tokenizer_n_vocab(tokenizer), n);
    for (int32_t step = 0; !err && step < 16; step++) {
        const int32_t id = (int32_t)((int64_t)n * step / 16);
        const char *a, *b;
        const size_t a_len = em_token_to_piece(e->tokenizer, id, true, &a);
        const size_t b_len = em_token_to_piece(tokenizer, id, true, &b);
        if (a_len != b_len || memcmp(a, b, a_len))
            err = em_errorf(EM_ERR_INVALID, "%s: token %d is '%.*s' for the draft model and '%.*s' for the model: not the same vocabulary", path,
                            id, (int)b_len, b, (int)a_len, a);
    }
    em_tokenizer_free(tokenizer);
    return err;
}

static em_err drafter_scratch(em_drafter *d, uint32_t rows) {
    d->cap_rows = rows;
    d->tokens = malloc(rows * sizeof *d->tokens);
    d->seq = malloc(rows * sizeof *d->seq);
    d->pos = malloc(rows * sizeof *d->pos);
    d->logits = malloc(rows * sizeof *d->logits);
    d->seqs = malloc(rows * sizeof *d->seqs);
    d->pick = malloc(rows * sizeof *d->pick);
    d->picked = malloc(rows * sizeof *d->picked);
    d->owner = malloc(rows * sizeof *d->owner);
    d->row_seq = malloc(rows * sizeof *d->row_seq);
    if (!d->tokens || !d->seq || !d->pos || !d->logits || !d->seqs || !d->pick || !d->picked || !d->owner ||
        !d->row_seq)
        return em_errorf(EM_ERR_NOMEM, "draft model: no memory for a batch of %u tokens", rows);
    return NULL;
}

static em_err drafter_open(ember_engine *e, const ember_options *o, em_drafter *d) {
    const char *path = o->draft_model_path;
    em_err err = em_model_load_as(path, em_engine_weights_memory(o, path), &d->model);
    if (err) return em_err_prefix(err, "draft model");
    if ((err = check_vocabulary(e, d->model, path))) return err;
    em_backend_config config = {
        .device = o->device,
        .n_threads = (uint32_t)o->threads,
        .block_tokens = e->block_tokens,
        .kv_tokens = (uint64_t)e->pool.n_blocks * e->block_tokens,
    };
    if ((err = em_backend_create(d->model, &config, &d->backend))) return em_err_prefix(err, "draft model");
    if (!em_backend_can_pick(d->backend))
        return em_errorf(EM_ERR_INVALID, "draft model: the %s backend cannot pick tokens", d->backend->ops->name);
    if ((err = em_kv_pool_init(&d->pool, d->backend->n_blocks, e->block_tokens))) return err;
    return drafter_scratch(d, e->batch_tokens);
}

static void drafter_close(em_drafter *d) {
    em_kv_pool_free(&d->pool);
    em_backend_free(d->backend);
    if (d->model) em_model_free(d->model);
    free(d->tokens);
    free(d->seq);
    free(d->pos);
    free(d->logits);
    free(d->seqs);
    free(d->pick);
    free(d->picked);
    free(d->owner);
    free(d->row_seq);
    free(d);
}

em_err em_spec_init(ember_engine *e, const ember_options *o) {
    if (o->speculative < EMBER_SPEC_DEFAULT || o->speculative > EMBER_SPEC_DRAFT)
        return em_errorf(EM_ERR_INVALID, "engine: speculative mode %d is not an ember_spec", o->speculative);
    if (o->draft_max < 0 || o->draft_min < 0)
        return em_errorf(EM_ERR_INVALID, "engine: negative draft length (max %d, min %d)", o->draft_max, o->draft_min);
    if (o->spec_max_seqs < 0)
        return em_errorf(EM_ERR_INVALID, "engine: spec_max_seqs %d is negative", o->spec_max_seqs);
    e->spec_max_seqs = o->spec_max_seqs ? (uint32_t)o->spec_max_seqs : 4;
    e->draft_max = o->draft_max ? (uint32_t)o->draft_max : 16;
    e->draft_min = (uint32_t)o->draft_min;
    if (e->draft_min > e->draft_max)
        return em_errorf(EM_ERR_INVALID, "engine: the least draft length %u is above the most, %u", e->draft_min,
                         e->draft_max);
    e->spec_default = o->speculative == EMBER_SPEC_DEFAULT ? (o->draft_model_path ? EMBER_SPEC_DRAFT : EMBER_SPEC_OFF)
                                                            : (ember_spec)o->speculative;
    if (e->spec_default == EMBER_SPEC_DRAFT && !o->draft_model_path)
        return em_errorf(EM_ERR_INVALID, "engine: speculative mode draft needs a draft model");
    if (!o->draft_model_path) return NULL;
    em_drafter *d = calloc(1, sizeof *d);
    if (!d) return em_errorf(EM_ERR_NOMEM, "draft model: out of memory");
    em_err err = drafter_open(e, o, d);
    if (err) {
        drafter_close(d);
        return err;
    }
    e->drafter = d;
    return NULL;
}

void em_spec_free(ember_engine *e) {
    if (e->drafter) drafter_close(e->drafter);
    e->drafter = NULL;
}

void em_spec_release(ember_engine *e, ember_request *r) {
    for (uint32_t i = 0; e->drafter && i < r->n_draft_blocks; i++) em_kv_release(&e->drafter->pool, r->draft_blocks[i]);
    r->n_draft_blocks = 0;
    r->draft_computed = 0;
    r->n_draft = 0;
    r->drafts_chained = false;
}

static void count_drafts(ember_stats *s, const void *arg) {
    const uint32_t *counts = arg;
    s->draft_tokens += counts[0];
    s->draft_accepted += counts[1];
    s->draft_tokens_overlapped += counts[2];
}

void em_spec_verified(ember_engine *e, ember_request *r, uint32_t drafted, uint32_t accepted) {
    const uint32_t counts[3] = {drafted, accepted, r->drafts_chained ? drafted : 0};
    r->drafts_chained = false;
    pthread_mutex_lock(&e->lock);
    count_drafts(&e->stats, counts);
    pthread_mutex_unlock(&e->lock);
    pthread_mutex_lock(&r->lock);
    r->n_drafted += drafted;
    r->n_accepted += accepted;
    pthread_mutex_unlock(&r->lock);
    adapt(e, r, drafted, accepted);
    r->n_draft = 0;
    if (e->drafter && r->phase != EM_PHASE_DONE) { /* the draft model's KV keeps only accepted tokens */
        if (r->draft_computed > r->n_computed) r->draft_computed = r->n_computed;
        const uint32_t keep = blocks_for(r->draft_computed, e->block_tokens);
        while (r->n_draft_blocks > keep) em_kv_release(&e->drafter->pool, r->draft_blocks[--r->n_draft_blocks]);
    }
}

/* Blocks in the draft pool for the request's first `tokens` positions; false when the pool is out. */
static bool draft_blocks_for(em_drafter *d, ember_request *r, uint32_t tokens) {
    const uint32_t need = blocks_for(tokens, d->pool.block_tokens);
    while (r->n_draft_blocks < need) {
        uint32_t block;
        if (!em_kv_alloc(&d->pool, &block)) return false;
        r->draft_blocks[r->n_draft_blocks++] = block;
    }
    return true;
}

/* The drafts of the requests in owner[0..n): one draft model step catches each up with its tokens
 * and drafts its first token, then one step per further draft token, each request going as far as
 * its `n_draft` (the wanted count on entry, the drafted count on return). A request whose catch-up
 * does not fit the batch catches up part of the way and drafts nothing this time. */
static void run_draft_model(ember_engine *e, uint32_t n) {
    em_drafter *d = e->drafter;
    for (uint32_t j = 0; j < e->draft_max; j++) {
        uint32_t tokens = 0, rows = 0;
        for (uint32_t s = 0; s < n; s++) {
            ember_request *r = d->owner[s];
            if (r->n_draft <= j || (j > 0 && r->draft_computed != r->n_tokens + j - 1)) continue;
            /* Step j feeds what the draft model has not seen: the request's tokens on the first step
             * (its prompt too, the first time), the previous draft afterwards. */
            const uint32_t first = r->draft_computed, room = d->cap_rows - tokens;
            uint32_t end = r->n_tokens + j;
            if (room == 0) continue;
            if (end - first > room) end = first + room;
            for (uint32_t p = first; p < end; p++) {
                d->tokens[tokens] = p < r->n_tokens ? r->tokens[p] : r->draft[p - r->n_tokens];
                d->seq[tokens] = s;
                d->pos[tokens] = p;
                d->logits[tokens] = p + 1 == r->n_tokens + j;
                tokens++;
            }
            r->draft_computed = end; /* undone below if the step fails */
            if (!d->logits[tokens - 1]) continue;
            d->row_seq[rows] = s;
            d->pick[rows++] = em_sampler_pick_params_at(&r->sampler, j);
        }
        if (tokens == 0) break;
        for (uint32_t s = 0; s < n; s++) d->seqs[s] = (em_batch_seq){.blocks = d->owner[s]->draft_blocks,
                                                                  .n_blocks = d->owner[s]->n_draft_blocks};
        const em_batch batch = {.n_tokens = tokens, .tokens = d->tokens, .seq = d->seq, .pos = d->pos,
                                .logits = d->logits, .n_seqs = n, .seqs = d->seqs};
        em_err err = em_backend_forward_pick(d->backend, &batch, d->pick, d->picked);
        if (err) { /* the draft model's KV of these requests is suspect: they start over */
            em_log(EM_LOG_WARN, "draft model: %s", em_err_message(err));
            em_err_free(err);
            for (uint32_t s = 0; s < n; s++) d->owner[s]->draft_computed = 0;
            break;
        }
        for (uint32_t row = 0; row < rows; row++) {
            ember_request *r = d->owner[d->row_seq[row]];
            r->draft[j] = d->picked[row];
        }
    }
    /* Each request keeps the drafts it got: one per draft model step it took part in. */
    for (uint32_t s = 0; s < n; s++) {
        ember_request *r = d->owner[s];
        const uint32_t got = r->draft_computed >= r->n_tokens ? r->draft_computed - r->n_tokens + 1 : 0;
        if (r->n_draft > got) r->n_draft = got;
    }
}

/* How many drafts the request may bring to its next step: its adaptive length, bounded so that
 * every accepted token still fits its limits (max_tokens, the context). `ahead`: tokens the request
 * has before its drafts that are not in r->tokens yet (1 for the token of the step in flight). */
static uint32_t draft_room(const ember_engine *e, ember_request *r, uint32_t ahead) {
    if (r->grammar_state) return 0;
    if (r->draft_length == 0) {
        if (r->draft_pause > 1) {
            r->draft_pause--;
            return 0;
        }
        r->draft_pause = 0;
        if (!em_spec_may_start(e, e->spec_clock)) return 0;
        r->draft_length = 1;
    }
    uint32_t room = r->draft_length;
    const uint32_t generated = r->n_generated + ahead, tokens = r->n_tokens + ahead;
    const uint32_t max = (uint32_t)r->params.max_tokens;
    const uint32_t left = max > generated ? max - generated : 0; /* tokens it may still generate */
    if (room + 1 > left) room = left ? left - 1 : 0;
    if (tokens + room >= e->ctx_tokens) room = tokens + 1 < e->ctx_tokens ? e->ctx_tokens - tokens - 1 : 0;
    return room;
}

/* Even wholly accepted, the drafts of a draft model that costs more than a token per draft would
 * slow decode (and a request that drafts keeps the draft model's KV caught up with every token). */
bool em_spec_costs_model_pays(const em_spec_costs *c) {
    if (em_spec_least(c, 1) > 1) return false;
    return !c->drafting_steps || !c->plain_steps || c->drafting_ms_per_token < c->plain_ms_per_token;
}

bool em_spec_model_pays(const ember_engine *e, uint64_t clock) {
    return em_spec_costs_model_pays(&e->spec_costs) || clock % EM_SPEC_PROBE_STEPS == 0;
}

void em_spec_propose(ember_engine *e) {
    uint32_t n_model = 0;
    e->spec_model_timed = false;
    e->spec_clock++;
    const bool drafts = em_spec_engine_drafts(e);
    for (uint32_t i = 0; i < e->n_running; i++) {
        ember_request *r = e->running[i];
        r->n_draft = 0;
        if (!drafts || !em_spec_active(r)) continue;
        if (r->n_tokens - r->n_computed != 1) continue;
        const uint32_t room = draft_room(e, r, 0);
        if (room == 0) continue;
        if (r->spec == EMBER_SPEC_LOOKUP) {
            r->n_draft = em_spec_lookup(r->tokens, r->n_tokens, room, r->draft);
            if (r->n_draft == 0) nothing_found(e, r);
        } else if (!em_spec_model_pays(e, e->spec_clock)) {
            continue;
        } else if (draft_blocks_for(e->drafter, r, r->n_tokens + room - 1) && n_model < e->drafter->cap_rows) {
            r->n_draft = room;
            e->drafter->owner[n_model++] = r;
        }
    }
    if (n_model) {
        /* a request's first catch-up (its prompt) is a prefill, paid once: not what a draft costs */
        bool prompt = false;
        for (uint32_t s = 0; s < n_model; s++)
            prompt |= e->drafter->owner[s]->n_tokens - e->drafter->owner[s]->draft_computed > EM_SPEC_CATCH_UP;
        const double start = em_engine_now_ms();
        run_draft_model(e, n_model);
        uint32_t drafted = 0;
        for (uint32_t s = 0; s < n_model; s++) drafted += e->drafter->owner[s]->n_draft;
        if (!prompt) em_spec_cost_model(&e->spec_costs, drafted, em_engine_now_ms() - start);
        e->spec_model_timed = !prompt && drafted;
    }
}

uint32_t em_spec_propose_ahead(ember_engine *e, ember_request *r) {
    r->n_draft = 0;
    if (!em_spec_engine_drafts(e) || !em_spec_active(r)) return 0;
    /* the step counts against a pause (a draft model's request gets here only pausing: can_chain) */
    const uint32_t room = draft_room(e, r, 1);
    if (room == 0 || r->spec != EMBER_SPEC_LOOKUP) return 0;
    /* draft[0] is the lookup's guess at the token in flight; the drafts are what follows it. Where
     * the guess is wrong the drafts are almost surely rejected, which is all it costs: the picks
     * they are checked against follow the real token. */
    const uint32_t found = em_spec_lookup(r->tokens, r->n_tokens, room + 1, r->draft);
    if (found < 2) {
        nothing_found(e, r);
        return 0;
    }
    memmove(r->draft, r->draft + 1, (found - 1) * sizeof *r->draft);
    return r->n_draft = found - 1;
}
