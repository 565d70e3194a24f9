/*
 * Embeddings (engine.h): a prompt's final hidden states pooled into one unit vector.
 *
 * The pooling a request gets is its own, else the engine's: ember_options.pooling, else the
 * model's GGUF key <arch>.pooling_type (llama.cpp's numbering: 0 none, 1 mean, 2 cls, 3 last,
 * 4 rank). A hidden state is the row the output head reads, after the output norm, as llama.cpp
 * and transformers' last_hidden_state give it; the pooled vector is divided by its L2 norm.
 *
 * The scheduler (sched.c) batches embedding prompts with everything else; it asks this file which
 * positions want their hidden state, hands it the step's rows in batch order, and finishes a
 * request whose vector is done. Nothing here runs the backend.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

const char *ember_pooling_name(int pooling) {
    switch (pooling) {
    case EMBER_POOLING_MEAN: return "mean";
    case EMBER_POOLING_CLS: return "cls";
    case EMBER_POOLING_LAST: return "last";
    case EMBER_POOLING_RANK: return "rank";
    default: return "none";
    }
}

/* The model's own pooling: its GGUF's <arch>.pooling_type, none when absent. */
static int model_pooling(const em_model *model) {
    char key[EM_MODEL_ARCH_MAX + 16];
    snprintf(key, sizeof key, "%s.pooling_type", model->desc.arch);
    uint32_t value = 0;
    em_err err = em_gguf_get_u32(model->gguf, key, &value);
    if (err) {
        em_err_free(err);
        return EMBER_POOLING_NONE;
    }
    if (value > EMBER_POOLING_RANK) {
        em_log(EM_LOG_WARN, "%s is %u, not one of 0..4 (none, mean, cls, last, rank): the model embeds only with "
               "a pooling given", key, value);
        return EMBER_POOLING_NONE;
    }
    return (int)value;
}

em_err em_embed_init(ember_engine *e, const ember_options *o) {
    if (o->pooling < EMBER_POOLING_NONE || o->pooling > EMBER_POOLING_LAST)
        return em_errorf(EM_ERR_INVALID, "engine: pooling %d is not mean (1), cls (2) or last (3)", o->pooling);
    e->pooling = o->pooling ? o->pooling : model_pooling(e->model);
    e->n_embd = em_backend_hidden_width(e->model);
    if (!e->backend->ops->hidden_rows)
        snprintf(e->embed_refused, sizeof e->embed_refused,
                 "the %s backend does not return hidden states, so it cannot embed (embed with --device cpu)",
                 e->backend->ops->name);
    e->batch_hidden = calloc(e->batch_tokens, sizeof *e->batch_hidden);
    if (!e->batch_hidden) return em_errorf(EM_ERR_NOMEM, "engine: no memory for the batch's hidden flags");
    return NULL;
}

em_err em_embed_prepare(const ember_engine *e, ember_request *r, const ember_request_params *p) {
    if (e->embed_refused[0]) return em_errorf(EM_ERR_UNSUPPORTED, "request: %s", e->embed_refused);
    const int pooling = p->pooling ? p->pooling : e->pooling;
    if (pooling < EMBER_POOLING_NONE || pooling > EMBER_POOLING_RANK)
        return em_errorf(EM_ERR_INVALID, "request: pooling %d is not an ember_pooling", p->pooling);
    if (pooling == EMBER_POOLING_NONE)
        return em_errorf(EM_ERR_INVALID, "request: the model does not embed: its file names no pooling (%s.pooling_type) "
                         "and none was given (mean, cls or last)", e->model->desc.arch);
    if (pooling == EMBER_POOLING_RANK)
        return em_errorf(EM_ERR_INVALID, "request: the model pools by rank (a reranker's score), which is no embedding");
    em_embedding *m = calloc(1, sizeof *m);
    if (!m) return em_errorf(EM_ERR_NOMEM, "request: out of memory for an embedding");
    r->embedding = m;
    m->pooling = pooling;
    m->width = e->n_embd;
    m->sum = calloc(m->width, sizeof *m->sum);
    m->vector = calloc(m->width, sizeof *m->vector);
    if (!m->sum || !m->vector) return em_errorf(EM_ERR_NOMEM, "request: out of memory for an embedding of %u", m->width);
    return NULL;
}

void em_embed_free(em_embedding *m) {
    if (!m) return;
    free(m->sum);
    free(m->vector);
    free(m);
}

void em_embed_restart(em_embedding *m) {
    memset(m->sum, 0, m->width * sizeof *m->sum);
    m->rows = 0;
    m->done = false;
}

em_err em_embed_reserve(ember_engine *e, uint32_t rows) {
    if (rows <= e->hidden_rows_cap) return NULL;
    float *grown = realloc(e->hidden, (size_t)rows * e->n_embd * sizeof *grown);
    if (!grown) return em_errorf(EM_ERR_NOMEM, "engine: out of memory for %u hidden states", rows);
    e->hidden = grown;
    e->hidden_rows_cap = rows;
    return NULL;
}

/* The pooled rows as a unit vector (a zero vector stays zero). */
static void finish_vector(em_embedding *m) {
    const double scale = m->pooling == EMBER_POOLING_MEAN && m->rows ? 1.0 / m->rows : 1.0;
    double norm = 0;
    for (uint32_t i = 0; i < m->width; i++) norm += (m->sum[i] * scale) * (m->sum[i] * scale);
    norm = sqrt(norm);
    for (uint32_t i = 0; i < m->width; i++) m->vector[i] = norm > 0 ? (float)(m->sum[i] * scale / norm) : 0.0f;
    m->done = true;
}

void em_embed_take(ember_engine *e) {
    const float *row = e->hidden;
    for (uint32_t i = 0; i < e->n_running; i++) {
        ember_request *r = e->running[i];
        em_embedding *m = r->embedding;
        if (!m || !r->scheduled) continue;
        for (uint32_t pos = r->n_computed - r->scheduled; pos < r->n_computed; pos++) {
            if (!em_embed_wants(m, pos, r->n_prompt)) continue;
            for (uint32_t k = 0; k < m->width; k++) m->sum[k] += row[k];
            m->rows++;
            row += m->width;
        }
        if (r->n_computed == r->n_prompt) finish_vector(m);
    }
}
