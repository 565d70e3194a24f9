/*
 * The engine (engine.h, ember.h): one thread that owns the model, the backend, the KV pool and the
 * prefix cache, and turns submitted requests into tokens by continuous batching.
 *
 * Life of a request: ember_submit tokenizes the prompt on the caller's thread, checks the
 * parameters and puts the request on the submission queue. Each engine step (sched.c) admits
 * queued requests (prefix-cache match, then blocks for the rest), builds one batch of every
 * running decode plus prefill chunks within the token budget, runs the backend, samples, and
 * appends each new token and the text it completes to the request's output, waking its reader.
 * A finished request's tokens go into the prefix cache and its blocks are released.
 *
 * Locks: `engine->lock` guards the submission queue, the shutdown flag and the statistics;
 * each request's `lock` guards its output and its cancel flag. The engine thread never holds
 * both at once, and never holds either while running the backend.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine.h"

double em_engine_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- Requests: creation and output hand-off ---- */

static void request_unref(ember_request *r) {
    pthread_mutex_lock(&r->lock);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->lock);
    if (!last) return;
    em_sampler_free(&r->sampler);
    em_grammar_state_free(r->grammar_state);
    em_grammar_free(r->grammar);
    free(r->grammar_mask);
    for (size_t i = 0; i < r->n_grammar_triggers; i++) free(r->grammar_triggers[i]);
    free(r->grammar_triggers);
    free(r->grammar_error);
    free(r->trigger_window);
    free(r->text_controls);
    em_stop_free(&r->stops);
    if (r->detok) em_detok_free(r->detok);
    for (size_t i = 0; i < 2; i++) {
        free(r->out[i].tokens);
        free(r->out[i].tops);
        free(r->out[i].text);
    }
    for (size_t i = 0; i < r->n_stop_strings; i++) free(r->stop_strings[i]);
    free(r->stop_strings);
    free(r->stop_tokens);
    free(r->tokens);
    free(r->blocks);
    free(r->draft);
    em_embed_free(r->embedding);
    free(r->draft_blocks);
    free(r->error);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->changed);
    free(r);
}

/* Grows an output buffer set to hold one more token and `text_len` more bytes. */
static bool output_reserve(em_output_buffer *o, size_t text_len, int n_top) {
    if (o->n_tokens == o->cap_tokens) {
        size_t cap = o->cap_tokens ? 2 * o->cap_tokens : 16;
        ember_token_out *t = realloc(o->tokens, cap * sizeof *t);
        if (!t) return false;
        o->tokens = t;
        ember_top_logprob *tops = realloc(o->tops, cap * EM_MAX_LOGPROBS * sizeof *tops);
        if (!tops) return false;
        o->tops = tops;
        o->cap_tokens = cap;
    }
    (void)n_top;
    if (o->text_len + text_len + 1 > o->cap_text) {
        size_t cap = o->cap_text ? o->cap_text : 256;
        while (cap < o->text_len + text_len + 1) cap *= 2;
        char *t = realloc(o->text, cap);
        if (!t) return false;
        o->text = t;
        o->cap_text = cap;
    }
    return true;
}

/* Engine thread: publishes one token (or only text when token < 0) to the reader. */
void em_engine_emit(ember_request *r, int32_t token, float logprob, const ember_top_logprob *top, int n_top,
                    const char *text, size_t text_len) {
    if (r->params.on_output) {
        ember_token_out t = {token, logprob, top, n_top};
        ember_output out = {.tokens = &t, .n_tokens = token >= 0, .text = text, .text_len = text_len};
        r->params.on_output(&out, r->params.user);
        return;
    }
    pthread_mutex_lock(&r->lock);
    em_output_buffer *o = &r->out[r->pending];
    if (!output_reserve(o, text_len, n_top)) {
        r->output_lost = true; /* reported as an error at the end rather than silently */
    } else {
        if (token >= 0) {
            ember_token_out *t = &o->tokens[o->n_tokens];
            t->token = token;
            t->logprob = logprob;
            t->n_top = n_top;
            memcpy(o->tops + o->n_tokens * EM_MAX_LOGPROBS, top, (size_t)n_top * sizeof *top);
            t->top = NULL; /* set when handed out: the array may still move */
            o->n_tokens++;
        }
        memcpy(o->text + o->text_len, text, text_len);
        o->text_len += text_len;
        o->text[o->text_len] = '\0';
    }
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
}

void em_engine_finish(ember_request *r, ember_finish_reason reason, int stop_index, const char *error) {
    pthread_mutex_lock(&r->lock);
    bool already = r->finish != EMBER_FINISH_NONE;
    if (r->output_lost) {
        reason = EMBER_FINISH_ERROR;
        error = "out of memory while buffering output";
    }
    pthread_mutex_unlock(&r->lock);
    if (already) return;
    /* The callback hears of the end before a poller can see it, so a reader woken by the finish
     * knows the callback is done. */
    if (r->params.on_output) {
        ember_output out = {.text = "", .finish = reason, .error = error};
        if (reason == EMBER_FINISH_STOP && stop_index >= 0 && (size_t)stop_index < r->n_stop_strings)
            out.stop_string = r->stop_strings[stop_index];
        r->params.on_output(&out, r->params.user);
    }
    pthread_mutex_lock(&r->lock);
    r->finish = reason;
    r->stop_index = stop_index;
    if (error && !r->error) r->error = strdup(error);
    r->t_finished = em_engine_now_ms();
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
}

bool ember_request_next(ember_request *r, ember_output *out, int timeout_ms) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&r->lock);
    struct timespec deadline;
    if (timeout_ms > 0) {
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    }
    for (;;) {
        em_output_buffer *o = &r->out[r->pending];
        if (o->n_tokens || o->text_len || r->finish != EMBER_FINISH_NONE) break;
        if (timeout_ms == 0) {
            pthread_mutex_unlock(&r->lock);
            return false;
        }
        if (timeout_ms < 0) pthread_cond_wait(&r->changed, &r->lock);
        else if (pthread_cond_timedwait(&r->changed, &r->lock, &deadline) != 0) {
            bool ready = r->out[r->pending].n_tokens || r->out[r->pending].text_len || r->finish != EMBER_FINISH_NONE;
            if (!ready) {
                pthread_mutex_unlock(&r->lock);
                return false;
            }
        }
    }
    /* Swap: the filled buffer goes to the reader, the one it read last time is emptied for the engine. */
    em_output_buffer *filled = &r->out[r->pending];
    r->pending ^= 1;
    r->out[r->pending].n_tokens = 0;
    r->out[r->pending].text_len = 0;
    for (size_t i = 0; i < filled->n_tokens; i++) filled->tokens[i].top = filled->tops + i * EM_MAX_LOGPROBS;
    out->tokens = filled->tokens;
    out->n_tokens = filled->n_tokens;
    out->text = filled->text_len ? filled->text : "";
    out->text_len = filled->text_len;
    /* The finish is reported with the last output, once everything before it was read. */
    out->finish = r->finish;
    out->stop_string = r->finish == EMBER_FINISH_STOP && r->stop_index >= 0 && (size_t)r->stop_index < r->n_stop_strings
                           ? r->stop_strings[r->stop_index]
                           : NULL;
    out->error = r->error;
    out->invalid_request = r->finish == EMBER_FINISH_ERROR && r->grammar_too_ambiguous && !r->output_lost;
    if (r->finish == EMBER_FINISH_STOP && r->embedding && r->embedding->done) {
        out->embedding = r->embedding->vector;
        out->n_embedding = r->embedding->width;
    }
    pthread_mutex_unlock(&r->lock);
    return true;
}

void ember_request_cancel(ember_request *r) {
    pthread_mutex_lock(&r->lock);
    r->cancel = true;
    /* A finished request needs no wake-up, and its engine may already be gone (ember.h allows
     * releasing handles after ember_engine_destroy, which finishes every request first). */
    bool running = r->finish == EMBER_FINISH_NONE;
    pthread_mutex_unlock(&r->lock);
    if (running) em_engine_wake(r->engine);
}

void ember_request_timings(ember_request *r, ember_timings *t) {
    memset(t, 0, sizeof *t);
    pthread_mutex_lock(&r->lock);
    double end = r->t_last_token ? r->t_last_token : 0;
    if (r->t_admitted) t->queued_ms = r->t_admitted - r->t_submitted;
    if (r->t_first_token) {
        t->prefill_ms = r->t_first_token - r->t_admitted;
        t->first_token_ms = r->t_first_token - r->t_submitted;
        t->decode_ms = end - r->t_first_token;
        if (t->decode_ms > 0 && r->n_generated > 1) t->decode_tokens_per_second = (r->n_generated - 1) / (t->decode_ms / 1e3);
    }
    t->prompt_tokens = r->n_prompt;
    t->cached_tokens = r->n_cached;
    t->generated_tokens = r->n_generated;
    t->draft_tokens = r->n_drafted;
    t->draft_accepted = r->n_accepted;
    t->ram_tokens = r->n_restored_ram;
    t->disk_tokens = r->n_restored_disk;
    t->restore_ms = r->restore_ms;
    pthread_mutex_unlock(&r->lock);
}

void ember_request_release(ember_request *r) {
    if (!r) return;
    ember_request_cancel(r);
    request_unref(r);
}

void em_engine_request_unref(ember_request *r) { request_unref(r); }

/* ---- Submission ---- */

static em_err copy_params(ember_request *r, const ember_request_params *p) {
    r->params = *p;
    r->params.stop = NULL;
    r->params.stop_tokens = NULL;
    r->params.grammar = NULL; /* compiled into r->grammar; the trigger is copied there too */
    r->params.compiled_grammar = NULL; /* r->grammar holds its own reference */
    r->params.grammar_triggers = NULL;
    r->params.n_grammar_triggers = 0;
    r->params.control_texts = NULL;
    if (p->n_stop) {
        r->stop_strings = calloc(p->n_stop, sizeof *r->stop_strings);
        if (!r->stop_strings) return em_errorf(EM_ERR_NOMEM, "request: no memory for stop strings");
        r->n_stop_strings = p->n_stop;
        for (size_t i = 0; i < p->n_stop; i++) {
            if (!p->stop[i]) return em_errorf(EM_ERR_INVALID, "request: stop string %zu is NULL", i);
            if (!(r->stop_strings[i] = strdup(p->stop[i]))) return em_errorf(EM_ERR_NOMEM, "request: no memory");
        }
    }
    if (p->n_stop_tokens) {
        r->stop_tokens = malloc(p->n_stop_tokens * sizeof *r->stop_tokens);
        if (!r->stop_tokens) return em_errorf(EM_ERR_NOMEM, "request: no memory for stop tokens");
        memcpy(r->stop_tokens, p->stop_tokens, p->n_stop_tokens * sizeof *r->stop_tokens);
        r->n_stop_tokens = p->n_stop_tokens;
    }
    return NULL;
}

static em_err tokenize_prompt(ember_engine *e, ember_request *r, const ember_request_params *p) {
    if (p->prompt_ids && p->n_prompt_ids) {
        r->tokens = malloc(p->n_prompt_ids * sizeof *r->tokens);
        if (!r->tokens) return em_errorf(EM_ERR_NOMEM, "request: no memory for %zu prompt tokens", p->n_prompt_ids);
        memcpy(r->tokens, p->prompt_ids, p->n_prompt_ids * sizeof *r->tokens);
        r->n_prompt = (uint32_t)p->n_prompt_ids;
        for (uint32_t i = 0; i < r->n_prompt; i++)
            if (r->tokens[i] < 0 || r->tokens[i] >= (int32_t)e->n_vocab)
                return em_errorf(EM_ERR_INVALID, "request: prompt token %u is %d, outside the vocabulary of %u", i,
                                 r->tokens[i], e->n_vocab);
        return NULL;
    }
    if (!p->prompt_text) return em_errorf(EM_ERR_INVALID, "request: the prompt is empty");
    size_t len = p->prompt_text_len ? p->prompt_text_len : strlen(p->prompt_text);
    size_t n = 0;
    em_err err = em_tokenize(e->tokenizer, p->prompt_text, len, p->add_special, p->parse_special, &r->tokens, &n);
    if (err) return em_err_prefix(err, "request: prompt");
    r->n_prompt = (uint32_t)n;
    return NULL;
}

static int by_token_id(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The control tokens whose texts the request counts as output text, sorted without repeats. */
static em_err resolve_control_texts(const ember_engine *e, ember_request *r, const ember_request_params *p) {
    if (!p->n_control_texts) return NULL;
    if (p->n_control_texts > EM_MAX_CONTROL_TEXTS)
        return em_errorf(EM_ERR_INVALID, "request: %zu control_texts, more than %d", p->n_control_texts,
                         EM_MAX_CONTROL_TEXTS);
    r->text_controls = malloc(p->n_control_texts * sizeof *r->text_controls);
    if (!r->text_controls) return em_errorf(EM_ERR_NOMEM, "request: out of memory");
    for (size_t i = 0; i < p->n_control_texts; i++) {
        if (!p->control_texts[i]) return em_errorf(EM_ERR_INVALID, "request: control text %zu is NULL", i);
        const int32_t id = em_tokenizer_find(e->tokenizer, p->control_texts[i], strlen(p->control_texts[i]));
        if (id != EM_TOKEN_NONE && em_tokenizer_is_control(e->tokenizer, id))
            r->text_controls[r->n_text_controls++] = id;
    }
    qsort(r->text_controls, r->n_text_controls, sizeof *r->text_controls, by_token_id);
    size_t n = 0;
    for (size_t i = 0; i < r->n_text_controls; i++)
        if (!n || r->text_controls[i] != r->text_controls[n - 1]) r->text_controls[n++] = r->text_controls[i];
    r->n_text_controls = n;
    return NULL;
}

ember_error *ember_grammar_compile(const char *gbnf, size_t len, ember_grammar **out) {
    return em_grammar_compile_checked(gbnf, len, out);
}

void ember_grammar_free(ember_grammar *grammar) { em_grammar_free(grammar); }

/* The request's grammar (compiled on the caller's thread, or by the caller already) and parse state. */
static em_err compile_grammar(const ember_engine *e, ember_request *r, const ember_request_params *p) {
    em_err err = NULL;
    if (p->compiled_grammar) r->grammar = em_grammar_retain(p->compiled_grammar);
    else err = em_grammar_compile(p->grammar, p->grammar_len ? p->grammar_len : strlen(p->grammar), &r->grammar);
    if (err) return em_err_prefix(err, "request");
    if ((err = em_grammar_state_new(r->grammar, &r->grammar_state))) return err;
    r->grammar_mask = malloc(((size_t)e->n_vocab + 31) / 32 * sizeof *r->grammar_mask);
    bool copied = true;
    if (p->n_grammar_triggers && (r->grammar_triggers = calloc(p->n_grammar_triggers, sizeof *r->grammar_triggers))) {
        for (size_t i = 0; i < p->n_grammar_triggers; i++) {
            if (!p->grammar_triggers[i] || !*p->grammar_triggers[i])
                return em_errorf(EM_ERR_INVALID, "request: grammar trigger %zu is empty", i);
            copied &= (r->grammar_triggers[r->n_grammar_triggers++] = strdup(p->grammar_triggers[i])) != NULL;
            const size_t len = strlen(p->grammar_triggers[i]);
            if (len > r->trigger_len) r->trigger_len = len;
        }
    }
    r->grammar_active = p->n_grammar_triggers == 0;
    if (!r->grammar_active && copied) copied = (r->trigger_window = malloc(r->trigger_len)) != NULL;
    if (!r->grammar_mask || (!r->grammar_active && (!r->grammar_triggers || !copied)))
        return em_errorf(EM_ERR_NOMEM, "request: out of memory for a grammar");
    return NULL;
}

/* The request's speculative mode (none with a grammar) and its draft buffers. */
static em_err prepare_speculation(const ember_engine *e, ember_request *r, const ember_request_params *p,
                                  uint32_t max_total) {
    if (p->speculative < EMBER_SPEC_DEFAULT || p->speculative > EMBER_SPEC_DRAFT)
        return em_errorf(EM_ERR_INVALID, "request: speculative mode %d is not an ember_spec", p->speculative);
    r->spec = p->speculative == EMBER_SPEC_DEFAULT ? e->spec_default : (ember_spec)p->speculative;
    if (r->spec == EMBER_SPEC_DRAFT && !e->drafter)
        return em_errorf(EM_ERR_INVALID, "request: speculative decoding with a draft model, but the engine has none");
    if (p->grammar || p->compiled_grammar) r->spec = EMBER_SPEC_OFF; /* a draft's mask would need the grammar run ahead */
    if (p->embed) r->spec = EMBER_SPEC_OFF; /* nothing is generated */
    if (e->recurrent) r->spec = EMBER_SPEC_OFF; /* a rejected draft would have advanced the recurrent state */
    if (r->spec == EMBER_SPEC_OFF) return NULL;
    /* A short first draft: a miss costs a step of draft + 1 tokens, and hits double the length. */
    r->draft_length = e->draft_max < EM_SPEC_FIRST_DRAFT ? e->draft_max : EM_SPEC_FIRST_DRAFT;
    if (r->draft_length < e->draft_min) r->draft_length = e->draft_min;
    r->draft = malloc((e->draft_max + 1) * sizeof *r->draft); /* + the guess at a token in flight (spec.c) */
    if (!r->draft) return em_errorf(EM_ERR_NOMEM, "request: out of memory for drafts");
    if (r->spec == EMBER_SPEC_DRAFT && !(r->draft_blocks = malloc((max_total / e->block_tokens + 2) * sizeof *r->draft_blocks)))
        return em_errorf(EM_ERR_NOMEM, "request: out of memory for the draft model's block table");
    return NULL;
}

ember_error *ember_submit(ember_engine *e, const ember_request_params *p, ember_request **out) {
    *out = NULL;
    ember_request *r = calloc(1, sizeof *r);
    if (!r) return em_errorf(EM_ERR_NOMEM, "request: out of memory");
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->changed, NULL);
    r->refs = 1;
    r->engine = e;
    r->stop_index = -1;
    r->t_submitted = em_engine_now_ms();
    em_err err = copy_params(r, p);
    if (!err) err = tokenize_prompt(e, r, p);
    if (!err && r->n_prompt == 0) err = em_errorf(EM_ERR_INVALID, "request: the prompt is empty");
    r->n_tokens = r->n_prompt;
    if (!err && p->max_tokens <= 0 && !p->embed)
        err = em_errorf(EM_ERR_INVALID, "request: max_tokens must be positive, not %d", p->max_tokens);
    /* an embedding generates nothing, so its prompt may fill the context */
    if (!err && r->n_prompt > e->ctx_tokens - (p->embed ? 0 : 1))
        err = em_errorf(EM_ERR_RANGE, "request: the prompt has %u tokens; the context holds %u", r->n_prompt,
                        e->ctx_tokens);
    if (!err) err = em_sampler_init(&r->sampler, &p->sampling, e->n_vocab);
    if (!err) err = em_stop_init(&r->stops, (const char *const *)r->stop_strings, r->n_stop_strings);
    if (!err) err = em_detok_new(e->tokenizer, r->n_prompt ? 0 : EM_DETOK_SEQUENCE_START, &r->detok);
    if (!err) err = resolve_control_texts(e, r, p);
    if (!err && p->embed) err = em_embed_prepare(e, r, p);
    if (!err && (p->grammar || p->compiled_grammar) && !p->embed) err = compile_grammar(e, r, p);
    if (!err) {
        uint32_t max_total = r->n_prompt + (p->embed ? 0 : (uint32_t)p->max_tokens);
        if (max_total > e->ctx_tokens || max_total < r->n_prompt) max_total = e->ctx_tokens;
        r->cap_tokens = max_total + 1;
        int32_t *grown = realloc(r->tokens, r->cap_tokens * sizeof *grown);
        r->blocks = malloc((max_total / e->block_tokens + 2) * sizeof *r->blocks);
        if (grown) r->tokens = grown;
        if (!grown || !r->blocks) err = em_errorf(EM_ERR_NOMEM, "request: out of memory for %u tokens", max_total);
        if (!err) err = prepare_speculation(e, r, p, max_total);
    }
    if (err) {
        pthread_mutex_lock(&e->lock);
        e->stats.requests_rejected++;
        pthread_mutex_unlock(&e->lock);
        request_unref(r);
        return err;
    }
    r->refs = 2; /* the caller's handle and the engine's */
    pthread_mutex_lock(&e->lock);
    if (e->shutdown) {
        pthread_mutex_unlock(&e->lock);
        r->refs = 1;
        request_unref(r);
        return em_errorf(EM_ERR_INVALID, "request: the engine is shutting down");
    }
    r->next = NULL;
    if (e->submitted_tail) e->submitted_tail->next = r;
    else e->submitted_head = r;
    e->submitted_tail = r;
    e->stats.requests_submitted++;
    e->stats.queued++;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
    *out = r;
    return NULL;
}

void em_engine_wake(ember_engine *e) {
    pthread_mutex_lock(&e->lock);
    e->poked = true;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
}

void ember_engine_get_info(const ember_engine *e, ember_engine_info *out) {
    *out = (ember_engine_info){
        .ctx_tokens = e->ctx_tokens,
        .n_vocab = e->n_vocab,
        .block_tokens = e->block_tokens,
        .kv_blocks = e->pool.n_blocks,
        .kv_bytes = (uint64_t)e->pool.n_blocks * e->block_tokens * e->backend->kv_bytes_per_token,
        .batch_tokens = e->batch_tokens,
        .max_sequences = e->max_sequences,
        .device = e->backend->ops->name,
        .weights_in_memory = em_gguf_is_private(e->model->gguf),
        .cache_ram_bytes = e->tiers ? e->tiers->ram_limit : 0,
        .cache_disk_bytes = e->tiers && e->tiers->disk ? e->tiers->disk_stats.limit_bytes : 0,
        .cache_dir = em_tiers_disk_dir(e->tiers),
        .cache_tiers_off = e->tiers_off[0] ? e->tiers_off : NULL,
        .pooling = e->pooling,
        .n_embd = e->n_embd,
        .embed_refused = e->embed_refused[0] ? e->embed_refused : NULL,
    };
}

void ember_engine_stats(ember_engine *e, ember_stats *out) {
    pthread_mutex_lock(&e->lock);
    *out = e->stats;
    pthread_mutex_unlock(&e->lock);
}

/* ---- Engine lifecycle ---- */

static em_err allocate_scratch(ember_engine *e) {
    e->running = calloc(e->max_sequences, sizeof *e->running);
    e->batch_tokens_buf = malloc(e->batch_tokens * sizeof *e->batch_tokens_buf);
    e->batch_seq = malloc(e->batch_tokens * sizeof *e->batch_seq);
    e->batch_pos = malloc(e->batch_tokens * sizeof *e->batch_pos);
    e->batch_logits = malloc(e->batch_tokens * sizeof *e->batch_logits);
    e->batch_seqs = calloc(e->max_sequences, sizeof *e->batch_seqs);
    /* Logits rows: one per sequence, or more for a sequence that verifies drafts (at most one per token). */
    e->row_owner = calloc(e->batch_tokens, sizeof *e->row_owner);
    e->flight_owner = calloc(e->batch_tokens, sizeof *e->flight_owner);
    e->pick = malloc(e->batch_tokens * sizeof *e->pick);
    e->picked = malloc(e->batch_tokens * sizeof *e->picked);
    e->pick_masks = calloc(e->batch_tokens, sizeof *e->pick_masks);
    if (!e->running || !e->batch_tokens_buf || !e->batch_seq || !e->batch_pos || !e->batch_logits || !e->batch_seqs ||
        !e->row_owner || !e->flight_owner || !e->pick || !e->picked || !e->pick_masks)
        return em_errorf(EM_ERR_NOMEM, "engine: no memory for batch buffers (%u tokens, %u sequences)",
                         e->batch_tokens, e->max_sequences);
    return NULL;
}

static void free_engine(ember_engine *e) {
    em_spec_free(e);
    em_prefix_flush(&e->cache); /* what fits goes to disk, for the next start */
    em_prefix_free(&e->cache);
    em_tiers_free(e->tiers);
    em_states_free(&e->states);
    em_kv_pool_free(&e->pool);
    em_backend_free(e->backend);
    em_text_free(e->text);
    if (e->model) em_model_free(e->model);
    free(e->running);
    free(e->batch_tokens_buf);
    free(e->batch_seq);
    free(e->batch_pos);
    free(e->batch_logits);
    free(e->batch_seqs);
    free(e->row_owner);
    free(e->flight_owner);
    free(e->pick);
    free(e->picked);
    free(e->logits);
    free(e->pick_masks);
    free(e->batch_hidden);
    free(e->hidden);
    for (size_t i = 0; i < e->n_grammar_vocabs; i++) {
        em_grammar_masks_free(e->grammar_vocabs[i].masks);
        em_grammar_vocab_free(e->grammar_vocabs[i].vocab);
        free(e->grammar_vocabs[i].text_controls);
    }
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->wake);
    free(e);
}

/* The memory the requests' shared grammar masks may take (a mask is a bit per token). */
#define GRAMMAR_SHARED_MASK_BYTES ((size_t)64 << 20)

/* (engine.h) */
em_err em_engine_grammar_vocab(ember_engine *e, ember_request *r) {
    for (size_t i = 0; i < e->n_grammar_vocabs; i++) {
        em_grammar_vocab_entry *v = &e->grammar_vocabs[i];
        const size_t bytes = r->n_text_controls * sizeof *r->text_controls;
        if (v->n_text_controls == r->n_text_controls && (!bytes || !memcmp(v->text_controls, r->text_controls, bytes))) {
            r->grammar_vocab = v;
            return NULL;
        }
    }
    if (e->n_grammar_vocabs == EM_MAX_GRAMMAR_VOCABS)
        return em_errorf(EM_ERR_UNSUPPORTED, "grammar: more than %d different sets of control_texts in one engine",
                         EM_MAX_GRAMMAR_VOCABS);
    em_grammar_vocab_entry v = {.n_text_controls = r->n_text_controls};
    if (r->n_text_controls && !(v.text_controls = malloc(r->n_text_controls * sizeof *v.text_controls)))
        return em_errorf(EM_ERR_NOMEM, "grammar: out of memory");
    if (r->n_text_controls) memcpy(v.text_controls, r->text_controls, r->n_text_controls * sizeof *v.text_controls);
    em_err err = em_grammar_vocab_new(e->tokenizer, e->n_vocab, v.text_controls, v.n_text_controls, &v.vocab);
    if (!err) err = em_grammar_masks_new(v.vocab, GRAMMAR_SHARED_MASK_BYTES, &v.masks);
    if (err) {
        em_grammar_vocab_free(v.vocab);
        free(v.text_controls);
        return err;
    }
    e->grammar_vocabs[e->n_grammar_vocabs] = v;
    r->grammar_vocab = &e->grammar_vocabs[e->n_grammar_vocabs++];
    return NULL;
}

static em_err choose_sizes(ember_engine *e, const ember_options *o) {
    const em_model_desc *d = &e->model->desc;
    e->n_vocab = d->n_vocab;
    if (o->ctx_tokens < 0 || o->batch_tokens < 0 || o->block_tokens < 0 || o->max_sequences < 0 || o->threads < 0 ||
        o->kv_sequences < 0)
        return em_errorf(EM_ERR_INVALID, "engine: negative size in options");
    uint32_t trained = d->n_ctx_train ? d->n_ctx_train : 4096;
    e->ctx_tokens = o->ctx_tokens ? (uint32_t)o->ctx_tokens : (trained < 8192 ? trained : 8192);
    e->block_tokens = o->block_tokens ? (uint32_t)o->block_tokens : 16;
    e->batch_tokens = o->batch_tokens ? (uint32_t)o->batch_tokens : 2048;
    e->max_sequences = o->max_sequences ? (uint32_t)o->max_sequences : 256;
    if (e->max_sequences > e->batch_tokens) e->max_sequences = e->batch_tokens;
    if (e->ctx_tokens < 2) return em_errorf(EM_ERR_INVALID, "engine: a context of %u tokens is too small", e->ctx_tokens);
    if (e->block_tokens > 1024) return em_errorf(EM_ERR_INVALID, "engine: blocks of %u tokens", e->block_tokens);
    return NULL;
}

bool em_weights_fit(uint64_t file_bytes, const char *meminfo) {
    const char *line = meminfo ? strstr(meminfo, "MemAvailable:") : NULL;
    unsigned long long kib = 0;
    if (!line || sscanf(line, "MemAvailable: %llu kB", &kib) != 1) return false;
    return file_bytes <= kib * 1024 / 2;
}

/* The bytes of the model's files: a split set's first part times their count (the parts are of
 * about one size), which is near enough to weigh against the memory available. */
static uint64_t model_file_bytes(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return UINT64_MAX;
    uint32_t part = 1, count = 1;
    size_t prefix = 0;
    if (!em_gguf_split_name(path, &part, &count, &prefix)) count = 1;
    return (uint64_t)st.st_size * count;
}

em_gguf_memory em_engine_weights_memory(const ember_options *o, const char *path) {
    if (o->weights_memory == EMBER_WEIGHTS_IN_MEMORY) return EM_GGUF_PRIVATE;
    if (o->weights_memory == EMBER_WEIGHTS_MAPPED || !em_backend_picks_cpu(o->device)) return EM_GGUF_MAPPED;
    char meminfo[4096] = "";
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        meminfo[fread(meminfo, 1, sizeof meminfo - 1, f)] = 0;
        fclose(f);
    }
    return em_weights_fit(model_file_bytes(path), meminfo) ? EM_GGUF_PRIVATE : EM_GGUF_MAPPED;
}

/* The backend sizes its KV pool from the budget: --kv-mem bytes, or else room for kv_sequences
 * (default four) sequences of the full context. A sequence can never be longer than the whole pool. */
static em_err create_backend(ember_engine *e, const ember_options *o) {
    em_backend_config config = {
        .device = o->device,
        .n_threads = (uint32_t)o->threads,
        .block_tokens = e->block_tokens,
        .kv_bytes = o->kv_mem_bytes,
        .kv_tokens = (uint64_t)(o->kv_sequences ? o->kv_sequences : 4) * e->ctx_tokens,
        .state_slots = e->max_sequences + EM_STATE_SNAPSHOTS, /* read for models with recurrent state */
    };
    if (config.kv_tokens < 2 * (uint64_t)e->block_tokens) config.kv_tokens = 2 * (uint64_t)e->block_tokens;
    em_err err = em_backend_create(e->model, &config, &e->backend);
    if (err) return err;
    if (e->backend->n_blocks < 2)
        return em_errorf(EM_ERR_INVALID, "engine: the KV budget holds %u blocks; at least 2 are needed",
                         e->backend->n_blocks);
    uint64_t pool_tokens = (uint64_t)e->backend->n_blocks * e->block_tokens;
    if (e->ctx_tokens > pool_tokens) e->ctx_tokens = (uint32_t)pool_tokens;
    e->recurrent = e->backend->n_state_slots > 0;
    if (e->recurrent && e->backend->n_state_slots <= e->max_sequences)
        return em_errorf(EM_ERR_INTERNAL, "engine: the backend keeps %u state slots for %u sequences",
                         e->backend->n_state_slots, e->max_sequences);
    if (e->recurrent && (err = em_states_init(&e->states, e->max_sequences, e->backend->n_state_slots - e->max_sequences)))
        return err;
    return em_kv_pool_init(&e->pool, e->backend->n_blocks, e->block_tokens);
}

/* The RAM tier's default bound: a quarter of the memory available now, at most 8 GiB (blocks take
 * their memory only as they are evicted into it). */
static uint64_t default_ram_limit(void) {
    char meminfo[4096] = "";
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        meminfo[fread(meminfo, 1, sizeof meminfo - 1, f)] = 0;
        fclose(f);
    }
    const char *line = strstr(meminfo, "MemAvailable:");
    unsigned long long kib = 0;
    if (!line || sscanf(line, "MemAvailable: %llu kB", &kib) != 1) return 0;
    const uint64_t quarter = kib * 1024 / 4, most = (uint64_t)8 << 30;
    return quarter < most ? quarter : most;
}

/* The prefix cache's lower tiers (engine.h): off where the backend cannot copy blocks out, and for
 * a model with recurrent state, whose cached prefixes resume only from state snapshots that live
 * in backend slots and are not tiered (a tiered block past the last snapshot could never be used,
 * and none could after a restart). Nothing here stops the engine: a tier that cannot be had is
 * left out with a warning. */
static em_err create_tiers(ember_engine *e, const ember_options *o) {
    const uint64_t ram = o->cache_ram_bytes == EMBER_CACHE_RAM_AUTO ? default_ram_limit() : o->cache_ram_bytes;
    const bool asked = (o->cache_ram_bytes != EMBER_CACHE_RAM_AUTO && o->cache_ram_bytes > 0) || o->cache_dir;
    if (!ram && !o->cache_dir) return NULL;
    if (e->recurrent) {
        snprintf(e->tiers_off, sizeof e->tiers_off,
                 "%s keeps recurrent state, whose snapshots are not tiered: no RAM or disk cache tier", e->model->desc.arch);
    } else if (!em_backend_can_tier(e->backend)) {
        snprintf(e->tiers_off, sizeof e->tiers_off,
                 "the %s backend cannot copy KV blocks to host memory: no RAM or disk cache tier", e->backend->ops->name);
    }
    if (e->tiers_off[0]) {
        if (asked) em_log(EM_LOG_WARN, "%s", e->tiers_off);
        return NULL;
    }
    em_err err = em_tiers_new(e->backend, e->model, ram, o->cache_dir, o->cache_disk_bytes, &e->tiers);
    if (err) return err;
    if (o->cache_dir && !e->tiers->disk) snprintf(e->tiers_off, sizeof e->tiers_off, "the disk cache tier could not be opened");
    if (!ram && !e->tiers->disk) {
        em_tiers_free(e->tiers);
        e->tiers = NULL;
        return NULL;
    }
    e->cache.tiers = e->tiers;
    err = em_prefix_load_disk(&e->cache);
    e->stats.cache_ram = e->tiers->ram; /* what the disk held at start, before the first step */
    e->stats.cache_disk = e->tiers->disk_stats;
    return err;
}

ember_error *ember_engine_create(const ember_options *o, ember_engine **out) {
    *out = NULL;
    if (!o || !o->model_path) return em_errorf(EM_ERR_INVALID, "engine: no model path");
    ember_engine *e = calloc(1, sizeof *e);
    if (!e) return em_errorf(EM_ERR_NOMEM, "engine: out of memory");
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->wake, NULL);
    e->options = *o;
    e->options.model_path = NULL; /* not kept: the caller's string */
    em_err err = em_model_load_as(o->model_path, em_engine_weights_memory(o, o->model_path), &e->model);
    if (!err) err = em_text_from_gguf(e->model->gguf, &e->text);
    if (!err) e->tokenizer = em_text_tokenizer(e->text);
    if (!err && (uint32_t)em_tokenizer_n_vocab(e->tokenizer) > e->model->desc.n_vocab)
        err = em_errorf(EM_ERR_FORMAT, "%s: the tokenizer has %d tokens but the model only %u logits", o->model_path,
                        em_tokenizer_n_vocab(e->tokenizer), e->model->desc.n_vocab);
    if (!err) err = choose_sizes(e, o);
    if (!err) err = create_backend(e, o);
    if (!err) em_prefix_init(&e->cache, &e->pool);
    if (!err) err = create_tiers(e, o);
    if (!err) err = allocate_scratch(e);
    if (!err) err = em_spec_init(e, o);
    if (!err) err = em_embed_init(e, o);
    if (!err && pthread_create(&e->thread, NULL, em_engine_thread, e) != 0)
        err = em_errorf(EM_ERR_INTERNAL, "engine: cannot start the engine thread");
    if (err) {
        free_engine(e);
        return err;
    }
    e->thread_started = true;
    *out = e;
    return NULL;
}

void ember_engine_destroy(ember_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->lock);
        e->shutdown = true;
        pthread_cond_signal(&e->wake);
        pthread_mutex_unlock(&e->lock);
        pthread_join(e->thread, NULL);
    }
    free_engine(e);
}
