/*
 * The scheduler (engine.h): the engine thread's loop. Each step admits waiting requests, builds
 * one batch (every running decode first, then prefill chunks up to the token budget), runs the
 * backend, samples one token for every request whose pending tokens were all computed, and
 * retires finished or cancelled requests.
 *
 * Memory policy, in order (docs/DESIGN.md, decision 4): a request is admitted only when the blocks for
 * its whole prompt are free, after evicting unused prefix-cache blocks if needed; otherwise it
 * waits (and so does everyone behind it, first come first served). When a running decode needs a
 * new block and none can be evicted, the youngest running request is preempted: its computed
 * tokens go into the prefix cache (so nothing is recomputed if memory allows), its blocks are
 * released, and it goes back to the head of the waiting list, keeping its sampler state.
 *
 * Step overlap (see "Step overlap" below): with a backend that offers pick_begin / pick_end, a
 * step of decodes is begun before the previous step's tokens are read, its inputs being those
 * tokens where they lie (on the device), so the backend never waits for the host between steps.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static uint32_t blocks_for(const ember_engine *e, uint32_t tokens) {
    return (tokens + e->block_tokens - 1) / e->block_tokens;
}

static void stats_update(ember_engine *e, void (*update)(ember_stats *, const void *), const void *arg) {
    pthread_mutex_lock(&e->lock);
    update(&e->stats, arg);
    pthread_mutex_unlock(&e->lock);
}

/* Copies the engine-thread counters (pool, cache, running) into the shared statistics. */
static void publish_gauges(ember_engine *e) {
    uint32_t waiting = 0;
    for (ember_request *r = e->waiting_head; r; r = r->next) waiting++;
    pthread_mutex_lock(&e->lock);
    ember_stats *s = &e->stats;
    s->running = e->n_running;
    s->queued = waiting;
    for (ember_request *r = e->submitted_head; r; r = r->next) s->queued++;
    s->kv_blocks_total = e->pool.n_blocks;
    s->kv_blocks_used = e->pool.n_blocks - em_kv_free_count(&e->pool);
    s->kv_blocks_cached = em_prefix_cached_blocks(&e->cache);
    s->prefix_lookups = e->cache.lookups;
    s->prefix_hits = e->cache.hits;
    s->prefix_tokens_reused = e->cache.tokens_reused;
    s->prefix_tokens_evicted = e->cache.tokens_evicted;
    if (e->tiers) {
        s->cache_ram = e->tiers->ram;
        s->cache_disk = e->tiers->disk_stats;
    }
    pthread_mutex_unlock(&e->lock);
}

static void release_blocks(ember_engine *e, ember_request *r) {
    for (uint32_t i = 0; i < r->n_blocks; i++) em_kv_release(&e->pool, r->blocks[i]);
    r->n_blocks = 0;
}

/* Keeps a hybrid model's state after the request's computed tokens as a snapshot (not while a
 * step is begun: the backend may still be advancing it). */
static void snapshot_state(ember_engine *e, ember_request *r) {
    if (!e->recurrent || !r->holds_state || !r->n_computed || e->in_flight || r->embedding) return;
    em_err err = em_states_store(&e->states, e->backend, r->state_slot, r->tokens, r->n_computed);
    if (err) {
        em_log(EM_LOG_WARN, "state snapshot: %s", em_err_message(err));
        em_err_free(err);
    }
}

/* Remembers the request's computed tokens in the prefix cache (and a hybrid model's state), then
 * drops its own references (and its state slot). */
static void retire_blocks(ember_engine *e, ember_request *r) {
    snapshot_state(e, r);
    if (r->holds_state) em_states_give_slot(&e->states, r->state_slot);
    r->holds_state = false;
    if (r->n_computed && !r->embedding) { /* nobody continues an embedded text (engine.h) */
        em_err err = em_prefix_insert(&e->cache, r->tokens, r->n_computed, r->blocks);
        if (err) {
            em_log(EM_LOG_WARN, "prefix cache: %s", em_err_message(err));
            em_err_free(err);
        }
    }
    release_blocks(e, r);
    r->n_computed = 0;
}

static void remove_running(ember_engine *e, ember_request *r) {
    for (uint32_t i = 0; i < e->n_running; i++)
        if (e->running[i] == r) {
            memmove(&e->running[i], &e->running[i + 1], (e->n_running - i - 1) * sizeof *e->running);
            e->n_running--;
            return;
        }
}

static void count_finish(ember_stats *s, const void *arg) {
    const ember_finish_reason *reason = arg;
    if (*reason == EMBER_FINISH_CANCELLED) s->requests_cancelled++;
    else s->requests_finished++;
}

/* A request that finishes while a begun step holds a row of it: the row's token will be dropped,
 * and only the positions whose tokens are known count as computed (a step begun before the last
 * token was read counts one position ahead of the tokens). */
static void forget_flight(ember_engine *e, ember_request *r) {
    for (uint32_t i = 0; i < e->batch_tokens; i++) {
        if (e->flight_owner[i] == r) e->flight_owner[i] = NULL;
        if (e->row_owner[i] == r) e->row_owner[i] = NULL;
    }
    if (r->n_computed > r->n_tokens) r->n_computed = r->n_tokens;
}

/* Ends a request: flushes held-back text, caches its KV, wakes its reader, drops the engine's ref. */

static void finish_request(ember_engine *e, ember_request *r, ember_finish_reason reason, int stop_index,
                           const char *error) {
    if (reason != EMBER_FINISH_ERROR && stop_index < 0) {
        const char *text;
        size_t len = em_detok_flush(r->detok, &text), released_len;
        const char *released;
        em_err err = NULL;
        if (len) {
            int hit = em_stop_feed(&r->stops, text, len, &released, &released_len, &err);
            em_err_free(err);
            if (released_len) em_engine_emit(r, -1, 0, NULL, 0, released, released_len);
            if (hit >= 0) stop_index = hit, reason = EMBER_FINISH_STOP;
        }
        if (stop_index < 0) {
            em_stop_flush(&r->stops, &released, &released_len);
            if (released_len) em_engine_emit(r, -1, 0, NULL, 0, released, released_len);
        }
    }
    if (r->phase == EM_PHASE_RUNNING) remove_running(e, r);
    forget_flight(e, r);
    retire_blocks(e, r);
    em_spec_release(e, r);
    r->phase = EM_PHASE_DONE;
    /* Statistics first: a reader woken by the finish may look at them at once. */
    stats_update(e, count_finish, &reason);
    publish_gauges(e);
    em_engine_finish(r, reason, stop_index, error);
    em_engine_request_unref(r);
}

/* ---- Admission ---- */

static bool take_blocks(ember_engine *e, uint32_t want) {
    uint32_t free_now = em_kv_free_count(&e->pool);
    if (free_now < want) em_prefix_evict(&e->cache, want - free_now);
    return em_kv_free_count(&e->pool) >= want;
}

typedef enum admit_result { ADMITTED, MUST_WAIT, CANNOT_FIT } admit_result;

static void count_prompt(ember_stats *s, const void *arg) {
    const ember_request *r = arg;
    s->prompt_tokens += r->n_prompt;
    s->cached_tokens += r->n_cached;
}

/* A hybrid model's prefix hit cut back to `keep` tokens, where a state snapshot matches: the
 * whole blocks past it are released, and the block it ends in becomes the one whose first rows are
 * copied. The prefix cache's counters then count what is reused. */
static void trim_hit(ember_engine *e, const uint32_t *blocks, em_prefix_hit *hit, uint32_t keep) {
    if (keep == hit->n_tokens) return;
    const uint32_t whole = keep / e->block_tokens, rows = keep % e->block_tokens;
    uint32_t source = EM_PREFIX_NO_BLOCK;
    if (whole < hit->n_blocks) {
        if (rows) source = blocks[whole];
        else em_kv_release(&e->pool, blocks[whole]);
        for (uint32_t i = whole + 1; i < hit->n_blocks; i++) em_kv_release(&e->pool, blocks[i]);
        if (hit->copy_block != EM_PREFIX_NO_BLOCK) em_kv_release(&e->pool, hit->copy_block);
    } else if (rows) {
        source = hit->copy_block; /* keep < n_tokens: rows < copy_rows */
    } else if (hit->copy_block != EM_PREFIX_NO_BLOCK) {
        em_kv_release(&e->pool, hit->copy_block);
    }
    e->cache.tokens_reused -= hit->n_tokens - keep;
    if (!keep) e->cache.hits--;
    *hit = (em_prefix_hit){.n_tokens = keep, .n_blocks = whole, .copy_block = source, .copy_rows = rows};
}

static admit_result admit(ember_engine *e, ember_request *r) {
    uint32_t n = r->n_tokens;
    uint32_t total_blocks = blocks_for(e, n);
    if (total_blocks > e->pool.n_blocks) return CANNOT_FIT;
    const uint64_t lookups = e->cache.lookups, hits = e->cache.hits, reused = e->cache.tokens_reused;
    em_prefix_hit hit = {.copy_block = EM_PREFIX_NO_BLOCK};
    if (r->embedding) em_embed_restart(r->embedding); /* every hidden state is needed: no cached prefix */
    else em_prefix_match(&e->cache, r->tokens, n, n - 1, r->blocks, &hit);
    uint32_t snapshot = 0, resumed = 0;
    if (e->recurrent) {
        resumed = em_states_match(&e->states, r->tokens, hit.n_tokens, &snapshot);
        trim_hit(e, r->blocks, &hit, resumed);
    }
    uint32_t need = total_blocks - hit.n_blocks;
    /* Keep one block of headroom per running request, so admissions don't force preemptions. */
    uint32_t headroom = e->n_running < e->pool.n_blocks / 4 ? e->n_running : e->pool.n_blocks / 4;
    if (!take_blocks(e, need + headroom) && !(e->n_running == 0 && take_blocks(e, need))) {
        for (uint32_t i = 0; i < hit.n_blocks; i++) em_kv_release(&e->pool, r->blocks[i]);
        if (hit.copy_block != EM_PREFIX_NO_BLOCK) em_kv_release(&e->pool, hit.copy_block);
        e->cache.lookups = lookups; /* a wait is not a lookup */
        e->cache.hits = hits;
        e->cache.tokens_reused = reused;
        return e->n_running == 0 ? CANNOT_FIT : MUST_WAIT;
    }
    r->n_blocks = hit.n_blocks;
    for (uint32_t i = 0; i < need; i++) em_kv_alloc(&e->pool, &r->blocks[r->n_blocks++]);
    if (hit.copy_block != EM_PREFIX_NO_BLOCK) {
        em_err err = em_backend_copy_rows(e->backend, hit.copy_block, r->blocks[hit.n_blocks], hit.copy_rows);
        em_kv_release(&e->pool, hit.copy_block);
        if (err) { /* fall back to recomputing the rows */
            em_log(EM_LOG_WARN, "KV copy: %s", em_err_message(err));
            em_err_free(err);
            hit.n_tokens -= hit.copy_rows;
        }
    }
    if (e->recurrent) {
        /* a slot is free: there are as many as running requests, and this one is not running yet */
        em_states_take_slot(&e->states, &r->state_slot);
        r->holds_state = true;
        em_err err = hit.n_tokens ? em_backend_copy_state(e->backend, snapshot, r->state_slot) : NULL;
        if (err) { /* recompute from the start: position 0 clears the slot */
            em_log(EM_LOG_WARN, "state restore: %s", em_err_message(err));
            em_err_free(err);
            hit.n_tokens = 0;
        }
    }
    r->n_computed = hit.n_tokens;
    if (r->t_admitted == 0) { /* the first admission, not a return after preemption */
        pthread_mutex_lock(&r->lock);
        r->t_admitted = em_engine_now_ms();
        r->n_cached = hit.n_tokens;
        r->n_restored_ram = hit.ram_tokens;
        r->n_restored_disk = hit.disk_tokens;
        r->restore_ms = hit.restore_ms;
        pthread_mutex_unlock(&r->lock);
        stats_update(e, count_prompt, r);
    }
    r->phase = EM_PHASE_RUNNING;
    r->admitted_order = ++e->admissions;
    e->running[e->n_running++] = r;
    return ADMITTED;
}

static void admit_waiting(ember_engine *e) {
    while (e->waiting_head && e->n_running < e->max_sequences) {
        ember_request *r = e->waiting_head;
        admit_result result = admit(e, r);
        if (result == MUST_WAIT) return;
        e->waiting_head = r->next;
        if (!e->waiting_head) e->waiting_tail = NULL;
        r->next = NULL;
        if (result == CANNOT_FIT) {
            char message[160];
            snprintf(message, sizeof message, "the sequence needs %u KV blocks; the cache holds %u (raise --kv-mem)",
                     blocks_for(e, r->n_tokens), e->pool.n_blocks);
            finish_request(e, r, EMBER_FINISH_ERROR, -1, message);
        }
    }
}

/* ---- Preemption ---- */

static void preempt(ember_engine *e, ember_request *victim) {
    remove_running(e, victim);
    retire_blocks(e, victim);
    em_spec_release(e, victim);
    victim->phase = EM_PHASE_WAITING;
    victim->next = e->waiting_head;
    e->waiting_head = victim;
    if (!e->waiting_tail) e->waiting_tail = victim;
    pthread_mutex_lock(&e->lock);
    e->stats.preemptions++;
    pthread_mutex_unlock(&e->lock);
}

/* Makes sure `r` has blocks for its next `count` pending tokens; evicts and preempts as needed.
 * Returns false when r itself had to be preempted. */
static bool ensure_blocks(ember_engine *e, ember_request *r, uint32_t count) {
    uint32_t need = blocks_for(e, r->n_computed + count);
    while (r->n_blocks < need) {
        uint32_t block;
        if (em_kv_alloc(&e->pool, &block) || (take_blocks(e, 1) && em_kv_alloc(&e->pool, &block))) {
            r->blocks[r->n_blocks++] = block;
            continue;
        }
        ember_request *youngest = NULL;
        for (uint32_t i = 0; i < e->n_running; i++)
            if (!youngest || e->running[i]->admitted_order > youngest->admitted_order) youngest = e->running[i];
        preempt(e, youngest);
        if (youngest == r) return false;
    }
    return true;
}

/* ---- Sampling and output ---- */

static bool is_stop_token(const ember_engine *e, const ember_request *r, int32_t token) {
    if (!r->params.ignore_eos && em_tokenizer_is_eog(e->tokenizer, token)) return true;
    for (size_t i = 0; i < r->n_stop_tokens; i++)
        if (r->stop_tokens[i] == token) return true;
    return false;
}

static void count_generated(ember_stats *s, const void *arg) {
    (void)arg;
    s->generated_tokens++;
}

static void count_backend_picked(ember_stats *s, const void *arg) {
    s->backend_picked_tokens += *(const uint32_t *)arg;
}

/* The request counts this control token as text (ember_request_params.control_texts). */
static bool is_text_control(const ember_request *r, int32_t token) {
    for (size_t i = 0; i < r->n_text_controls; i++)
        if (r->text_controls[i] == token) return true;
    return false;
}

/* A lazy grammar waits for a trigger in the output: once one appears (across token boundaries too;
 * the earliest, where several do), the grammar takes the output from the trigger's first byte on;
 * *done when what followed the trigger in the same token is outside it, or nothing can follow.
 * False: no memory. */
static bool watch_trigger(ember_engine *e, ember_request *r, int32_t token, bool *done) {
    const char *piece;
    const size_t piece_len = em_token_to_piece(e->tokenizer, token, is_text_control(r, token), &piece);
    const size_t len = r->trigger_window_len + piece_len;
    char *text = malloc(len ? len : 1);
    if (!text) return false;
    memcpy(text, r->trigger_window, r->trigger_window_len);
    memcpy(text + r->trigger_window_len, piece, piece_len);
    const char *at = NULL;
    for (size_t i = 0; i < r->n_grammar_triggers; i++) {
        const char *found = memmem(text, len, r->grammar_triggers[i], strlen(r->grammar_triggers[i]));
        if (found && (!at || found < at)) at = found;
    }
    if (at) {
        r->grammar_active = true;
        *done = !em_grammar_accept_bytes(r->grammar_state, at, len - (size_t)(at - text)) ||
                !em_grammar_can_continue(r->grammar_state);
    } else { /* keep what could still begin the trigger */
        const size_t keep = len < r->trigger_len - 1 ? len : r->trigger_len - 1;
        memcpy(r->trigger_window, text + len - keep, keep);
        r->trigger_window_len = keep;
    }
    free(text);
    return true;
}

/* Publishes the request's next token (sampled on the host or picked by the backend) and decides
 * whether the request is done. */
static void accept_token(ember_engine *e, ember_request *r, int32_t token, float logprob, const ember_top_logprob *top,
                         int n_top) {
    r->tokens[r->n_tokens++] = token;
    double now = em_engine_now_ms();
    pthread_mutex_lock(&r->lock);
    r->n_generated++;
    if (!r->t_first_token) r->t_first_token = now;
    r->t_last_token = now;
    pthread_mutex_unlock(&r->lock);
    stats_update(e, count_generated, NULL);

    /* The grammar follows every token; when nothing can follow the text, generation is over. */
    bool grammar_done = false;
    if (r->grammar_state && !r->grammar_active) {
        if (!watch_trigger(e, r, token, &grammar_done)) {
            em_engine_emit(r, token, logprob, top, n_top, "", 0);
            finish_request(e, r, EMBER_FINISH_ERROR, -1, "out of memory watching for a grammar's trigger");
            return;
        }
    } else if (r->grammar_state) {
        if (!em_grammar_accept_token(r->grammar_state, r->grammar_vocab->vocab, token)) {
            em_engine_emit(r, token, logprob, top, n_top, "", 0);
            /* A mask made from position tables does not step the state through every allowed
             * token, so a grammar too ambiguous to follow can show here first. */
            const char *why = em_grammar_failure(r->grammar_state);
            r->grammar_too_ambiguous = em_grammar_too_ambiguous(r->grammar_state);
            finish_request(e, r, EMBER_FINISH_ERROR, -1,
                           why ? why : "internal: a token outside the grammar's mask was picked");
            return;
        }
        grammar_done = !em_grammar_can_continue(r->grammar_state);
    }
    bool stop_token = is_stop_token(e, r, token);
    const char *released = "";
    size_t released_len = 0;
    int stop_index = -1;
    if (!stop_token) {
        const char *piece;
        size_t piece_len = 0;
        em_err err = is_text_control(r, token) ? em_detok_feed_special(r->detok, token, &piece, &piece_len)
                                               : em_detok_feed(r->detok, token, &piece, &piece_len);
        if (!err && piece_len) stop_index = em_stop_feed(&r->stops, piece, piece_len, &released, &released_len, &err);
        if (err) {
            em_engine_emit(r, token, logprob, top, n_top, "", 0);
            finish_request(e, r, EMBER_FINISH_ERROR, -1, em_err_message(err));
            em_err_free(err);
            return;
        }
    }
    /* An end-of-generation or stop token ends the output; it is not part of it. */
    if (!stop_token) em_engine_emit(r, token, logprob, top, n_top, released, released_len);
    if (stop_token || stop_index >= 0 || grammar_done) finish_request(e, r, EMBER_FINISH_STOP, stop_index, NULL);
    else if (r->n_generated >= (uint32_t)r->params.max_tokens || r->n_tokens >= e->ctx_tokens)
        finish_request(e, r, EMBER_FINISH_LENGTH, -1, NULL);
}

/* Samples from one logits row on the host (bias, penalties, logprobs, then the pick rule). */
static int32_t accept_logits(ember_engine *e, ember_request *r, float *logits) {
    ember_top_logprob top[EM_MAX_LOGPROBS];
    int n_top = 0;
    float logprob = 0;
    const uint32_t *allowed = r->grammar_state && r->grammar_active ? r->grammar_mask : NULL;
    int32_t token = em_sampler_sample(&r->sampler, logits, allowed, r->tokens, r->n_tokens, &logprob, top, &n_top);
    accept_token(e, r, token, logprob, top, n_top);
    return token;
}

static void request_retain(ember_request *r) {
    pthread_mutex_lock(&r->lock);
    r->refs++;
    pthread_mutex_unlock(&r->lock);
}

/* Accepts a request's tokens from its `n_rows` rows of the step: row 0 follows its last token, row
 * j its draft j (speculative decoding). Each row's token is the model's pick (by the backend:
 * `picked`, or on the host from `logits`); the tokens are published in order while they agree
 * with the drafts, and the first that disagrees (or the one after the last draft) ends the run.
 * The KV of the accepted drafts is kept; that of the rejected ones is dropped (blocks that hold no
 * accepted position go back to the pool), so the prefix cache only ever sees accepted tokens. */
static void accept_rows(ember_engine *e, ember_request *r, uint32_t n_rows, const int32_t *picked, float *logits) {
    const ember_top_logprob no_top[1] = {{0}};
    const uint32_t drafted = n_rows - 1;
    uint32_t accepted = 0;
    request_retain(r); /* a finish inside accept_token must not free it under us */
    for (uint32_t j = 0; j < n_rows; j++) {
        int32_t token;
        if (picked) {
            const uint32_t one = 1;
            stats_update(e, count_backend_picked, &one); /* first: a finished request's reader may look */
            em_sampler_count_picked(&r->sampler);
            token = picked[j];
            accept_token(e, r, token, 0, no_top, 0);
        } else {
            token = accept_logits(e, r, logits + (size_t)j * e->n_vocab);
        }
        if (r->phase == EM_PHASE_DONE || j == drafted || token != r->draft[j]) break;
        accepted++;
        r->n_computed++; /* the draft's KV, computed in this step, belongs to the accepted token */
    }
    if (drafted) {
        if (r->phase != EM_PHASE_DONE) {
            const uint32_t keep = blocks_for(e, r->n_computed);
            while (r->n_blocks > keep) em_kv_release(&e->pool, r->blocks[--r->n_blocks]);
        }
        em_spec_verified(e, r, drafted, accepted);
    }
    em_engine_request_unref(r);
}

/* Accepts the tokens of rows 0..rows-1, owned as in `owners` (NULL: a request that has finished
 * since; each entry is cleared as its tokens go out); a request's rows are consecutive. */
static void accept_step(ember_engine *e, ember_request **owners, uint32_t rows, const int32_t *picked, float *logits) {
    for (uint32_t k = 0; k < rows;) {
        ember_request *r = owners[k];
        uint32_t n = 1;
        while (k + n < rows && r && owners[k + n] == r) n++;
        for (uint32_t i = k; i < k + n; i++) owners[i] = NULL;
        if (r) accept_rows(e, r, n, picked ? picked + k : NULL, logits ? logits + (size_t)k * e->n_vocab : NULL);
        k += n;
    }
}

/* ---- One step ---- */

static bool cancelled(ember_request *r) {
    pthread_mutex_lock(&r->lock);
    bool c = r->cancel;
    pthread_mutex_unlock(&r->lock);
    return c;
}

static void drop_cancelled(ember_engine *e) {
    for (uint32_t i = 0; i < e->n_running;) {
        ember_request *r = e->running[i];
        if (cancelled(r)) finish_request(e, r, EMBER_FINISH_CANCELLED, -1, NULL);
        else i++;
    }
    ember_request **link = &e->waiting_head, *last = NULL;
    while (*link) {
        ember_request *r = *link;
        if (cancelled(r)) {
            *link = r->next;
            r->next = NULL;
            finish_request(e, r, EMBER_FINISH_CANCELLED, -1, NULL);
        } else {
            last = r;
            link = &r->next;
        }
    }
    e->waiting_tail = last;
}

static void record_step(ember_stats *s, const void *arg) {
    double ms = *(const double *)arg;
    static const double edges[11] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000};
    int bucket = 0;
    while (bucket < 11 && ms >= edges[bucket]) bucket++;
    s->step_histogram[bucket]++;
    s->steps++;
    s->step_seconds_total += ms / 1e3;
}

/* Blocks for a decoding request's drafts, taken only where free or evictable (drafts never preempt
 * anyone). Returns how many of its n_draft drafts have room. */
static uint32_t room_for_drafts(ember_engine *e, ember_request *r, uint32_t n_draft) {
    const uint32_t positions = r->n_computed + 1; /* its pending token, then the drafts */
    while (r->n_blocks < blocks_for(e, positions + n_draft)) {
        uint32_t block;
        if (!em_kv_alloc(&e->pool, &block) && !(take_blocks(e, 1) && em_kv_alloc(&e->pool, &block))) {
            const uint32_t room = r->n_blocks * e->block_tokens - positions;
            return room < n_draft ? room : n_draft;
        }
        r->blocks[r->n_blocks++] = block;
    }
    return n_draft;
}

/* Decides how many pending tokens of each running request this step computes (decodes first, with
 * their drafts, then prefill chunks in admission order, within the token budget) and makes sure
 * their blocks exist. A preemption changes the running list, so planning starts over after one. */
static void plan(ember_engine *e) {
    for (;;) {
        uint32_t used = 0;
        bool restart = false;
        for (uint32_t i = 0; i < e->n_running; i++) e->running[i]->scheduled = 0;
        for (int pass = 0; pass < 2 && !restart; pass++) {
            for (uint32_t i = 0; i < e->n_running && used < e->batch_tokens; i++) {
                ember_request *r = e->running[i];
                uint32_t pending = r->n_tokens - r->n_computed;
                if ((pass == 0) != (pending == 1)) continue;
                uint32_t chunk = pending < e->batch_tokens - used ? pending : e->batch_tokens - used;
                uint32_t before = e->n_running;
                bool kept = ensure_blocks(e, r, chunk);
                if (!kept || e->n_running != before) {
                    restart = true;
                    break;
                }
                r->scheduled = chunk;
                used += chunk;
                if (r->n_draft) {
                    const uint32_t budget = e->batch_tokens - used;
                    r->n_draft = room_for_drafts(e, r, r->n_draft < budget ? r->n_draft : budget);
                    r->scheduled += r->n_draft;
                    used += r->n_draft;
                }
            }
        }
        if (restart) continue;
        for (uint32_t i = 0; i < e->n_running; i++)
            if (!e->running[i]->scheduled) e->running[i]->n_draft = 0;
        return;
    }
}

/* ---- Step overlap ----
 * With a backend that offers it (pick_begin / pick_end), a step whose tokens the backend picks is
 * begun and left in flight. The next call then, when every running request is decoding from that
 * step and nothing else is waiting, begins the step after it before reading its tokens (the inputs
 * are the in-flight picks, EM_TOKEN_PICKED), so the device never waits for the host; otherwise it
 * reads them first and plans an ordinary step. A request that the read token finishes (a stop token
 * or string) leaves a row in the next step whose token is dropped; its key and value there belong
 * to the token it read, so the prefix cache may keep them. */

static void fail_running(ember_engine *e, const char *what, em_err err) {
    em_log(EM_LOG_ERROR, "%s: %s", what, em_err_message(err));
    while (e->n_running) {
        ember_request *r = e->running[0];
        r->n_computed = 0; /* its KV is suspect: cache none of it */
        finish_request(e, r, EMBER_FINISH_ERROR, -1, em_err_message(err));
    }
    em_err_free(err);
}

/* Reads the in-flight step's tokens and accepts them. */
static void end_flight(ember_engine *e) {
    e->in_flight = false;
    em_err err = em_backend_pick_end(e->backend, e->picked);
    if (err) {
        fail_running(e, "step", err);
        return;
    }
    accept_step(e, e->flight_owner, e->flight_rows, e->picked, NULL);
    double now = em_engine_now_ms(), ms = now - e->flight_mark;
    e->flight_mark = e->last_step_end = now;
    /* a chained decode step's period: what a plain token costs where steps overlap */
    if (e->flight_chained && e->flight_drafts == 0) em_spec_cost_step(&e->spec_costs, e->flight_rows, 0, ms);
    stats_update(e, record_step, &ms);
    publish_gauges(e);
}

/* Whether the next step can begin before the in-flight one's tokens are read: every running
 * request is waiting for its token from that step, can take one more without reaching its length
 * limit, and has (or can get without preempting anyone) a block for it; no request waits. */
static bool can_chain(ember_engine *e) {
    if (e->waiting_head || e->n_running == 0) return false;
    pthread_mutex_lock(&e->lock);
    const bool submitted = e->submitted_head != NULL;
    pthread_mutex_unlock(&e->lock);
    if (submitted) return false;
    uint32_t new_blocks = 0;
    for (uint32_t i = 0; i < e->n_running; i++) {
        const ember_request *r = e->running[i];
        if (r->n_computed != r->n_tokens || r->flight_row >= e->flight_rows || e->flight_owner[r->flight_row] != r)
            return false;
        if (r->n_generated + 1 >= (uint32_t)r->params.max_tokens || r->n_tokens + 1 >= e->ctx_tokens) return false;
        /* its next mask depends on the token in flight: only a backend that takes masks late can pick */
        if (r->grammar_state && !em_backend_picks_late(e->backend)) return false;
        if (r->n_draft) return false; /* how many of its drafts in flight are accepted decides its next position */
        /* a draft model's drafts depend on the token in flight */
        if (r->spec == EMBER_SPEC_DRAFT && em_spec_drafts_next(e, r)) return false;
        new_blocks += r->n_blocks < blocks_for(e, r->n_computed + 1);
    }
    if (!take_blocks(e, new_blocks)) return false;
    e->spec_clock++; /* the chained step's drafts (em_spec_propose_ahead) count it as every step */
    return true;
}

/* The batch of n tokens the engine's scratch describes (every running request's block table). */
static em_batch step_batch(const ember_engine *e, uint32_t n, const uint32_t *const *pick_masks) {
    return (em_batch){
        .n_tokens = n,
        .tokens = e->batch_tokens_buf,
        .seq = e->batch_seq,
        .pos = e->batch_pos,
        .logits = e->batch_logits,
        .n_seqs = e->n_running,
        .seqs = e->batch_seqs,
        .pick_masks = pick_masks,
    };
}

/* Begins the step after the in-flight one: per running request its in-flight pick, then the
 * drafts prompt lookup made ahead of it (if any), every row picking. *rows: the step's rows.
 * *late: a request has a grammar, so the step's pick waits for masks (finish_chained). */
static em_err begin_chained(ember_engine *e, uint32_t *rows, bool *late) {
    *late = false;
    uint32_t n = 0;
    for (uint32_t i = 0; i < e->n_running; i++) {
        ember_request *r = e->running[i];
        if (r->n_blocks < blocks_for(e, r->n_computed + 1)) {
            uint32_t block;
            *rows = n;
            if (!em_kv_alloc(&e->pool, &block))
                return em_errorf(EM_ERR_INTERNAL, "step overlap: no block for a planned position");
            r->blocks[r->n_blocks++] = block;
        }
        /* drafts within the batch (a row kept for each request after this one) and free blocks */
        uint32_t n_draft = em_spec_propose_ahead(e, r);
        const uint32_t spare = e->batch_tokens - n - (e->n_running - i);
        if (n_draft > spare) n_draft = spare;
        if (n_draft) n_draft = room_for_drafts(e, r, n_draft);
        r->n_draft = n_draft;
        r->drafts_chained = n_draft > 0; /* counted as such once verified (em_spec_verified) */
        e->batch_seqs[i].blocks = r->blocks;
        e->batch_seqs[i].n_blocks = r->n_blocks;
        e->batch_seqs[i].state = r->state_slot;
        for (uint32_t j = 0; j <= n_draft; j++, n++) {
            e->batch_tokens_buf[n] = j ? r->draft[j - 1] : EM_TOKEN_PICKED(r->flight_row);
            e->batch_seq[n] = i;
            e->batch_pos[n] = r->n_computed + j;
            e->batch_logits[n] = true;
            e->row_owner[n] = r;
            /* the in-flight token takes the counter before these */
            e->pick[n] = em_sampler_pick_params_at(&r->sampler, 1 + j);
        }
        *late |= r->grammar_state != NULL;
    }
    *rows = n;
    em_batch batch = step_batch(e, n, NULL);
    batch.pick_masks_later = *late;
    return em_backend_pick_begin(e->backend, &batch, e->pick);
}

/* Makes the step just begun (rows owned as in row_owner, `drafts` of them drafts; `chained`: behind
 * another step in flight) the one in flight. */
static void set_flight(ember_engine *e, uint32_t rows, uint32_t drafts, bool chained) {
    ember_request **owners = e->flight_owner;
    e->flight_owner = e->row_owner;
    e->row_owner = owners;
    for (uint32_t k = 0; k < rows; k++) {
        e->row_owner[k] = NULL;
        if (e->flight_owner[k]) e->flight_owner[k]->flight_row = k;
    }
    e->flight_rows = rows;
    e->flight_drafts = drafts;
    e->flight_chained = chained;
    e->in_flight = true;
}

static void count_overlapped(ember_stats *s, const void *arg) {
    (void)arg;
    s->overlapped_steps++;
}

static bool compute_grammar_masks(ember_engine *e, uint32_t rows, bool *constrained);
static void finish_stuck(ember_engine *e, uint32_t rows);

/* A chained step begun with its masks to come: the in-flight tokens are read and accepted by now,
 * so its constrained rows' masks follow from them; the backend then starts its pick. */
static void finish_chained(ember_engine *e, uint32_t rows) {
    bool constrained = false;
    const bool ok = compute_grammar_masks(e, rows, &constrained);
    if (ok) finish_stuck(e, rows);
    for (uint32_t k = 0; k < rows; k++) /* a request finish_stuck ended took its mask with it */
        if (!e->row_owner[k]) e->pick_masks[k] = NULL;
    em_err err = em_backend_pick_masks(e->backend, ok && constrained ? e->pick_masks : NULL);
    if (err) {
        for (uint32_t k = 0; k < rows; k++) e->row_owner[k] = NULL;
        fail_running(e, "step", err);
    }
}

/* With a step in flight: begins the next one first when it can, then reads the in-flight tokens. */
static void advance_flight(ember_engine *e) {
    if (!can_chain(e)) {
        end_flight(e);
        return;
    }
    uint32_t rows = 0;
    bool late;
    em_err err = begin_chained(e, &rows, &late);
    if (err) { /* read what is in flight, then give up on the requests */
        for (uint32_t k = 0; k < rows; k++) e->row_owner[k] = NULL;
        end_flight(e);
        fail_running(e, "step", err);
        return;
    }
    uint32_t drafts = 0;
    for (uint32_t i = 0; i < e->n_running; i++) {
        e->running[i]->n_computed++;
        drafts += e->running[i]->n_draft;
    }
    stats_update(e, count_overlapped, NULL);
    end_flight(e); /* requests it finishes lose their rows of the begun step too */
    if (late) finish_chained(e, rows);
    set_flight(e, rows, drafts, true); /* the begun step is now the one in flight */
}

/* The grammar masks of this step's constrained rows (e->pick_masks, NULL for the others), the
 * vocabulary's trie built on first use. *constrained: some row has one. False when the engine had
 * to fail the running requests (out of memory). */
static bool compute_grammar_masks(ember_engine *e, uint32_t rows, bool *constrained) {
    for (uint32_t k = 0; k < rows; k++) {
        ember_request *r = e->row_owner[k];
        e->pick_masks[k] = NULL;
        if (!r || !r->grammar_state || !r->grammar_active) continue; /* (a chained step's finished row) */
        *constrained = true;
        em_err err = NULL;
        if (!r->grammar_vocab && (err = em_engine_grammar_vocab(e, r))) {
            if (em_err_code_of(err) == EM_ERR_NOMEM) {
                fail_running(e, "grammar", err); /* no request can be constrained without them */
                return false;
            }
        }
        if (!err) {
            const em_grammar_vocab_entry *v = r->grammar_vocab;
            err = em_grammar_mask_shared(r->grammar_state, v->vocab, v->masks, r->grammar_mask, &r->grammar_allowed);
            if (!err && r->params.ignore_eos) /* the end token stays masked out, as without a grammar */
                em_grammar_mask_drop_ends(v->vocab, r->grammar_mask, &r->grammar_allowed);
        }
        if (err) { /* this request's grammar failed (too ambiguous, out of memory): it alone ends */
            r->grammar_allowed = 0;
            r->grammar_too_ambiguous = em_grammar_too_ambiguous(r->grammar_state);
            free(r->grammar_error);
            r->grammar_error = strdup(em_err_message(err));
            em_err_free(err);
        }
        e->pick_masks[k] = r->grammar_mask;
    }
    return true;
}

/* A constrained request whose grammar allows no token of the vocabulary here cannot go on: it
 * stops (its row's pick is dropped), or fails when its grammar did. */
static void finish_stuck(ember_engine *e, uint32_t rows) {
    for (uint32_t k = 0; k < rows; k++) {
        ember_request *r = e->row_owner[k];
        if (!r || !r->grammar_state || !r->grammar_active || r->grammar_allowed) continue;
        e->row_owner[k] = NULL;
        if (r->grammar_error) finish_request(e, r, EMBER_FINISH_ERROR, -1, r->grammar_error);
        else finish_request(e, r, EMBER_FINISH_STOP, -1, NULL);
    }
}

/* Pools the step's hidden states into the embedding requests, and finishes those now done. */
static void finish_embeddings(ember_engine *e) {
    em_embed_take(e);
    for (uint32_t i = e->n_running; i-- > 0;) { /* backwards: a finish takes the request out of the list */
        ember_request *r = e->running[i];
        if (!r->embedding || !r->embedding->done) continue;
        pthread_mutex_lock(&r->lock);
        r->t_first_token = r->t_last_token = em_engine_now_ms(); /* prefill_ms: admission to the vector */
        pthread_mutex_unlock(&r->lock);
        finish_request(e, r, EMBER_FINISH_STOP, -1, NULL);
    }
}

/* Runs one batch. Returns false when there was nothing to run. */
static bool step(ember_engine *e) {
    drop_cancelled(e);
    if (e->in_flight) {
        advance_flight(e);
        return true;
    }
    admit_waiting(e);
    if (e->n_running == 0) return false;
    double start = em_engine_now_ms();
    em_spec_propose(e);
    const double forward_start = em_engine_now_ms(); /* the draft model's time is counted apart */
    plan(e);
    bool speculating = false, embeds = false; /* embeds: some embedding's prompt runs this step */
    uint32_t n = 0, rows = 0, drafts = 0, hidden_rows = 0;
    for (uint32_t i = 0; i < e->n_running; i++) {
        ember_request *r = e->running[i];
        e->batch_seqs[i].blocks = r->blocks;
        e->batch_seqs[i].n_blocks = r->n_blocks;
        e->batch_seqs[i].state = r->state_slot;
        /* A decoding request's drafts follow its last token, each with a row (its pick is checked
         * against the next draft). */
        for (uint32_t k = 0; k < r->scheduled; k++) {
            uint32_t pos = r->n_computed + k;
            e->batch_tokens_buf[n] = pos < r->n_tokens ? r->tokens[pos] : r->draft[pos - r->n_tokens];
            e->batch_seq[n] = i;
            e->batch_pos[n] = pos;
            e->batch_logits[n] = pos + 1 >= r->n_tokens && !r->embedding;
            e->batch_hidden[n] = r->embedding && em_embed_wants(r->embedding, pos, r->n_prompt);
            hidden_rows += e->batch_hidden[n];
            if (e->batch_logits[n]) e->row_owner[rows++] = r;
            n++;
        }
        speculating |= r->scheduled && r->n_draft > 0; /* drafts in this step */
        embeds |= r->scheduled && r->embedding;
        if (r->scheduled) drafts += r->n_draft;
    }
    if (n == 0) return false;
    bool constrained = false;
    if (!compute_grammar_masks(e, rows, &constrained)) return true;
    /* When every row's request is plain (engine.h), the backend picks the tokens and no logits row
     * comes back; otherwise all rows come to the host (a mixed step takes the host path for all).
     * Constrained rows are plain too where the backend applies their masks itself. */
    /* Hidden states (embeddings) come back through forward alone. */
    bool backend_picks = rows > 0 && !hidden_rows && em_backend_can_pick(e->backend) &&
                         (!constrained || em_backend_picks_masked(e->backend));
    for (uint32_t k = 0; k < rows && backend_picks; k++) backend_picks = em_sampler_plain(&e->row_owner[k]->sampler);
    /* Logits rows: one per request that samples this step; grown on demand (vocabularies are big). */
    if (!backend_picks && rows > e->logits_rows_cap) {
        float *grown = realloc(e->logits, (size_t)rows * e->n_vocab * sizeof *grown);
        if (!grown) {
            while (e->n_running) finish_request(e, e->running[0], EMBER_FINISH_ERROR, -1, "out of memory for logits");
            return true;
        }
        e->logits = grown;
        e->logits_rows_cap = rows;
    }
    /* A request's row j (after its draft j) picks with the counter its token would have without drafts. */
    for (uint32_t k = 0, ahead = 0; k < rows && backend_picks; k++) {
        ahead = k > 0 && e->row_owner[k - 1] == e->row_owner[k] ? ahead + 1 : 0;
        e->pick[k] = em_sampler_pick_params_at(&e->row_owner[k]->sampler, ahead);
    }
    /* A constrained step is begun only where the next one can take its masks late (else the next
     * step waits for its tokens anyway). */
    /* A hybrid model's step that completes a prompt is not begun: its state is snapshot after it. */
    bool prompt_ends = false;
    for (uint32_t i = 0; i < e->n_running && e->recurrent; i++)
        prompt_ends |= e->running[i]->scheduled && e->running[i]->n_computed + e->running[i]->scheduled == e->running[i]->n_prompt;
    const bool begin = backend_picks && em_backend_can_overlap(e->backend) && !speculating &&
                       (!constrained || em_backend_picks_late(e->backend)) && !prompt_ends;
    em_batch batch = step_batch(e, n, backend_picks && constrained ? e->pick_masks : NULL);
    em_err err = hidden_rows ? em_embed_reserve(e, hidden_rows) : NULL;
    if (hidden_rows) batch.hidden = e->batch_hidden, batch.hidden_out = e->hidden;
    if (!err) err = begin          ? em_backend_pick_begin(e->backend, &batch, e->pick)
                 : backend_picks ? em_backend_forward_pick(e->backend, &batch, e->pick, e->picked)
                                 : em_backend_forward(e->backend, &batch, e->logits);
    if (err) {
        /* Nothing in the batch can continue consistently: fail its requests, keep the engine. */
        for (uint32_t k = 0; k < rows; k++) e->row_owner[k] = NULL;
        fail_running(e, "forward", err);
        return true;
    }
    /* Drafts count as computed only once accepted (accept_rows). */
    for (uint32_t i = 0; i < e->n_running; i++) e->running[i]->n_computed += e->running[i]->scheduled - e->running[i]->n_draft;
    if (embeds) finish_embeddings(e);
    /* A hybrid model's state where a prompt has just been computed: the next turn of a conversation
     * resumes there even when this one's output is not kept. */
    for (uint32_t i = 0; i < e->n_running && !begin; i++) {
        ember_request *r = e->running[i];
        if (r->scheduled && r->n_computed == r->n_prompt) snapshot_state(e, r);
    }
    if (begin) { /* the tokens are read by the next step (advance_flight) */
        finish_stuck(e, rows);
        e->flight_mark = start;
        set_flight(e, rows, 0, false);
        return true;
    }
    finish_stuck(e, rows);
    const uint64_t accepted_before = e->stats.draft_accepted; /* written by this thread alone */
    accept_step(e, e->row_owner, rows, backend_picks ? e->picked : NULL, backend_picks ? NULL : e->logits);
    const double end = em_engine_now_ms();
    /* a step the draft model drafted for, whole: each request's token and its accepted drafts */
    if (n == rows && e->spec_model_timed)
        em_spec_cost_drafting(&e->spec_costs, n - drafts + (uint32_t)(e->stats.draft_accepted - accepted_before),
                              end - e->last_step_end);
    double ms = end - start;
    /* a decode step (a logits row for every token: no prompt chunk): what drafts cost here. Where
     * steps overlap, a plain step is timed when chained (end_flight), and a verification from the
     * last step's tokens, less the draft model's time, so the overlap it loses counts as its cost. */
    if (n == rows && !em_backend_can_overlap(e->backend))
        em_spec_cost_step(&e->spec_costs, n, drafts, end - forward_start);
    else if (n == rows && drafts)
        em_spec_cost_step(&e->spec_costs, n, drafts, end - e->last_step_end - (forward_start - start));
    e->last_step_end = end;
    stats_update(e, record_step, &ms);
    publish_gauges(e);
    return true;
}

/* Moves newly submitted requests to the waiting list; false when the engine is shutting down. */
static bool take_submissions(ember_engine *e, bool may_sleep) {
    pthread_mutex_lock(&e->lock);
    while (may_sleep && !e->shutdown && !e->submitted_head && !e->poked) pthread_cond_wait(&e->wake, &e->lock);
    e->poked = false;
    ember_request *head = e->submitted_head;
    e->submitted_head = e->submitted_tail = NULL;
    bool running = !e->shutdown;
    pthread_mutex_unlock(&e->lock);
    while (head) {
        ember_request *r = head;
        head = r->next;
        r->next = NULL;
        r->phase = EM_PHASE_WAITING;
        if (e->waiting_tail) e->waiting_tail->next = r;
        else e->waiting_head = r;
        e->waiting_tail = r;
    }
    return running;
}

static void cancel_everything(ember_engine *e) {
    while (e->n_running) finish_request(e, e->running[0], EMBER_FINISH_CANCELLED, -1, NULL);
    while (e->waiting_head) {
        ember_request *r = e->waiting_head;
        e->waiting_head = r->next;
        r->next = NULL;
        finish_request(e, r, EMBER_FINISH_CANCELLED, -1, NULL);
    }
    e->waiting_tail = NULL;
}

void *em_engine_thread(void *arg) {
    ember_engine *e = arg;
    bool idle = false;
    for (;;) {
        /* Sleep only when the last step had nothing to do: the host never spins. */
        if (!take_submissions(e, idle)) break;
        idle = !step(e);
        if (idle) publish_gauges(e);
    }
    take_submissions(e, false);
    if (e->in_flight) end_flight(e);
    cancel_everything(e);
    publish_gauges(e);
    return NULL;
}
