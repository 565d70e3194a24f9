/* Embeddings over HTTP: OpenAI's /v1/embeddings and Ollama's /api/embed and /api/embeddings.
 *
 *   POST /v1/embeddings  {input: string | [string] | [id] | [[id]], model, encoding_format: "float" |
 *                        "base64", dimensions, user, truncate = false}
 *                        → {object: "list", data: [{object: "embedding", index, embedding}], model,
 *                           usage: {prompt_tokens, total_tokens}}; base64 is the float32 vector's
 *                           little-endian bytes
 *   POST /api/embed      {model, input: string | [string], truncate = true, dimensions, options:
 *                        {num_ctx}, keep_alive} → {model, embeddings: [[...]], total_duration,
 *                        load_duration, prompt_eval_count}
 *   POST /api/embeddings {model, prompt, options, keep_alive} → {embedding: [...]}
 *
 * Every input is one engine request (ember_request_params.embed), all submitted at once, so the
 * engine batches them with each other and with whatever else runs; the answer waits for all of
 * them. Texts are tokenized as the model asks (BOS/EOS), never parsing control-token text. An input
 * longer than the context is cut to it where the request says truncate (Ollama's default), else it
 * is a 400 naming it. `dimensions` keeps the vector's first N numbers and scales them to unit length
 * again, which only a model trained for it (Matryoshka representation learning: `ember serve
 * --matryoshka`) keeps meaningful, so for other models it is a 400 naming the field. Vectors are unit
 * length on every endpoint (Ollama's old /api/embeddings returns its runner's raw vector; the
 * direction, which similarity search reads, is the same). Errors are each API's own, naming the field.
 */
#include <math.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* The most inputs one request may carry (OpenAI's own bound). */
#define MAX_INPUTS 2048

typedef struct embed_job {
    em_server_api api;       /* whose error format: EM_API_OPENAI_CHAT or EM_API_OLLAMA */
    bool legacy;             /* /api/embeddings: one prompt, {embedding} */
    int32_t **ids;           /* per input, its tokens */
    size_t *n_ids;
    size_t n_inputs;
    bool truncate, base64;
    int64_t dimensions;      /* 0: the whole vector */
    int64_t context;         /* the longest input the engine takes (Ollama's num_ctx may lower it) */
    json_t *root;            /* the body, which the strings below point into */
    const char *model;       /* as asked, or NULL */
    const char *param;       /* the field the inputs come from ("input", "prompt") */
} embed_job;

static void job_clear(embed_job *job) {
    for (size_t i = 0; i < job->n_inputs; i++) free(job->ids[i]);
    free(job->ids);
    free(job->n_ids);
    json_decref(job->root);
}

static bool bad(embed_job *job, em_server_error *err, const char *param, const char *fmt, const char *detail) {
    (void)job;
    em_server_error_set(err, 400, NULL, "invalid_value", param, fmt, param, detail);
    return false;
}

static bool oom(em_server_error *err) {
    em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
    return false;
}

static bool add_input(embed_job *job, int32_t *ids, size_t n, em_server_error *err) {
    if (job->n_inputs == MAX_INPUTS) {
        free(ids);
        em_server_error_set(err, 400, NULL, "invalid_value", job->param, "%s: more than %d inputs in one request",
                            job->param, MAX_INPUTS);
        return false;
    }
    int32_t **grown_ids = realloc(job->ids, (job->n_inputs + 1) * sizeof *grown_ids);
    if (grown_ids) job->ids = grown_ids;
    size_t *grown_n = realloc(job->n_ids, (job->n_inputs + 1) * sizeof *grown_n);
    if (grown_n) job->n_ids = grown_n;
    if (!grown_ids || !grown_n) {
        free(ids);
        return oom(err);
    }
    job->ids[job->n_inputs] = ids;
    job->n_ids[job->n_inputs++] = n;
    return true;
}

/* An input's tokens cut to the context when the request truncates, else refused. */
static bool fit_context(embed_job *job, const char *where, size_t *n, em_server_error *err) {
    if (*n <= (size_t)job->context) return true;
    if (job->truncate) {
        *n = (size_t)job->context;
        return true;
    }
    em_server_error_set(err, 400, NULL, "context_length_exceeded", job->param,
                        "%s has %zu tokens, more than the context's %lld (ask for truncate: true to cut it)", where, *n,
                        (long long)job->context);
    return false;
}

static bool add_text(embed_job *job, const em_server_engine *engine, const json_t *text, const char *where,
                     em_server_error *err) {
    if (json_string_length(text) == 0) return bad(job, err, job->param, "%s: %s", "an input must not be an empty string");
    int32_t *ids = NULL;
    size_t n = 0;
    em_err e = engine->tokenize(engine->self, json_string_value(text), json_string_length(text), true, false, &ids, &n);
    if (e) {
        em_server_error_set(err, em_err_code_of(e) == EM_ERR_NOMEM ? 500 : 400, NULL, "invalid_value", job->param,
                            "%s: %s", where, em_err_message(e));
        em_err_free(e);
        return false;
    }
    if (!n) {
        free(ids);
        return bad(job, err, job->param, "%s: %s", "the input has no tokens");
    }
    if (!fit_context(job, where, &n, err)) {
        free(ids);
        return false;
    }
    return add_input(job, ids, n, err);
}

/* An array of token ids (OpenAI's pre-tokenized input). */
static bool add_ids(embed_job *job, const em_server_engine *engine, const json_t *array, const char *where,
                    em_server_error *err) {
    size_t n = json_array_size(array);
    if (!n) return bad(job, err, job->param, "%s: %s", "a token array must not be empty");
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) return oom(err);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(array, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= engine->n_vocab) {
            free(ids);
            em_server_error_set(err, 400, NULL, "invalid_value", job->param,
                                "%s: token %zu must be a token id between 0 and %d", where, i, (int)engine->n_vocab - 1);
            return false;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    if (!fit_context(job, where, &n, err)) {
        free(ids);
        return false;
    }
    return add_input(job, ids, n, err);
}

/* `input` as OpenAI takes it (a string, strings, token ids, arrays of token ids) or, for Ollama,
 * a string or strings (an empty string there is no input at all: a load request). */
static bool read_inputs(embed_job *job, const em_server_engine *engine, const json_t *input, em_server_error *err) {
    const bool openai = job->api != EM_API_OLLAMA;
    char where[48];
    if (json_is_string(input)) {
        if (!openai && json_string_length(input) == 0) return true;
        return add_text(job, engine, input, job->param, err);
    }
    const char *kinds = openai ? "a string, an array of strings, an array of token ids or an array of token-id arrays"
                               : "a string or an array of strings";
    if (!json_is_array(input)) return bad(job, err, job->param, "'%s' must be %s", kinds);
    if (openai && json_array_size(input) && json_is_integer(json_array_get(input, 0)))
        return add_ids(job, engine, input, job->param, err);
    size_t i;
    const json_t *item;
    json_array_foreach(input, i, item) {
        snprintf(where, sizeof where, "%s[%zu]", job->param, i);
        bool ok = json_is_string(item)             ? add_text(job, engine, item, where, err)
                  : openai && json_is_array(item) ? add_ids(job, engine, item, where, err)
                                                   : bad(job, err, job->param, "'%s' must be %s", kinds);
        if (!ok) return false;
    }
    if (openai && !job->n_inputs) return bad(job, err, job->param, "%s: %s", "the array must not be empty");
    return true;
}

/* The request's fields. */
static bool parse(embed_job *job, const em_server *s, const char *body, size_t len, em_server_error *err) {
    json_t *root = job->root = em_server_parse_body(body, len, err);
    if (!root) return false;
    const bool openai = job->api != EM_API_OLLAMA;
    const json_t *options = json_object_get(root, "options");
    int64_t num_ctx = 0;
    bool ok = em_server_read_string(root, "model", &job->model, err) &&
              em_server_read_bool(root, "truncate", &job->truncate, err) &&
              em_server_read_int(root, "dimensions", 1, 1 << 20, &job->dimensions, err);
    if (ok && openai) {
        const char *format = "float";
        const char *user = NULL;
        ok = em_server_read_string(root, "encoding_format", &format, err) &&
             em_server_read_string(root, "user", &user, err);
        if (ok && strcmp(format, "float") && strcmp(format, "base64"))
            ok = bad(job, err, "encoding_format", "'%s' must be \"float\" or \"base64\", not \"%s\"", format);
        job->base64 = ok && !strcmp(format, "base64");
    }
    if (ok && !openai && (!job->model || !*job->model)) ok = bad(job, err, "model", "'%s' is required%s", "");
    if (ok && !openai && options && !json_is_object(options) && !json_is_null(options))
        ok = bad(job, err, "options", "'%s' must be an object%s", "");
    if (ok && !openai && json_is_object(options)) ok = em_server_read_int(options, "num_ctx", 1, INT32_MAX, &num_ctx, err);
    if (ok && num_ctx && num_ctx < job->context) job->context = num_ctx;
    if (ok && job->dimensions && !s->matryoshka)
        ok = bad(job, err, "dimensions",
                 "'%s': the model was not trained to be cut short (Matryoshka representations), so its vectors keep "
                 "their length%s; a server of such a model is started with --matryoshka",
                 "");
    if (ok && job->dimensions > (int64_t)s->engine.n_embd) {
        em_server_error_set(err, 400, NULL, "invalid_value", "dimensions",
                            "'dimensions' is %lld, more than the model's %u", (long long)job->dimensions, s->engine.n_embd);
        ok = false;
    }
    const json_t *input = json_object_get(root, job->param);
    if (ok && job->legacy && input && !json_is_string(input)) ok = bad(job, err, job->param, "'%s' must be a string%s", "");
    else if (ok && !input && !job->legacy)
        ok = bad(job, err, job->param, "'%s' is required%s", "");
    if (ok && input && !(job->legacy && json_string_length(input) == 0)) ok = read_inputs(job, &s->engine, input, err);
    return ok;
}

/* Whether the served model can embed here; the 400 that says why not. */
static bool can_embed(const em_server *s, em_server_error *err) {
    const em_server_engine *e = &s->engine;
    if (e->embed_refused) {
        em_server_error_set(err, 400, NULL, "model_not_supported", "model", "'%s' cannot embed here: %s", e->model_id,
                            e->embed_refused);
        return false;
    }
    if (e->pooling == EMBER_POOLING_MEAN || e->pooling == EMBER_POOLING_CLS || e->pooling == EMBER_POOLING_LAST) return true;
    em_server_error_set(err, 400, NULL, "model_not_supported", "model",
                        e->pooling == EMBER_POOLING_RANK
                            ? "'%s' is a reranker (its file pools by rank): it scores documents and makes no embeddings"
                            : "'%s' does not embed: its file names no pooling; serve it with --pooling mean, cls or last "
                              "to embed with it",
                        e->model_id);
    return false;
}

/* Submits every input, then reads each vector into vectors[i] (n_embd floats); false with `err` set
 * when one failed, or with err->status 0 when the client went away or the server stops. */
static bool run(em_server *s, const embed_job *job, float *vectors, uint64_t *tokens, em_server_error *err, int fd) {
    const em_server_engine *e = &s->engine;
    void **requests = calloc(job->n_inputs ? job->n_inputs : 1, sizeof *requests);
    if (!requests) return oom(err);
    bool ok = true;
    for (size_t i = 0; i < job->n_inputs && ok; i++) {
        ember_request_params p;
        ember_request_default(&p);
        p.prompt_ids = job->ids[i];
        p.n_prompt_ids = job->n_ids[i];
        p.embed = true;
        em_err fail = e->submit(e->self, &p, &requests[i]);
        if (fail) {
            em_server_error_set(err, em_err_code_of(fail) == EM_ERR_NOMEM ? 500 : 400, NULL, NULL, job->param, "%s",
                                em_err_message(fail));
            em_err_free(fail);
            ok = false;
        }
        *tokens += job->n_ids[i];
    }
    for (size_t i = 0; i < job->n_inputs && ok; i++) {
        ember_output out;
        do {
            if (atomic_load(&s->stopping) || em_server_peer_gone(fd)) {
                err->status = 0;
                ok = false;
                break;
            }
        } while (!e->next(requests[i], &out, 100) || out.finish == EMBER_FINISH_NONE);
        if (ok && (!out.embedding || out.n_embedding != e->n_embd)) {
            em_server_error_set(err, 500, NULL, NULL, NULL, "embedding %zu failed: %s", i,
                                out.error ? out.error : "the engine gave no vector");
            ok = false;
        }
        if (ok) memcpy(vectors + i * e->n_embd, out.embedding, e->n_embd * sizeof *vectors);
    }
    for (size_t i = 0; i < job->n_inputs; i++)
        if (requests[i]) e->release(requests[i]); /* cancels those still running */
    free(requests);
    return ok;
}

/* The vector's first `dimensions` numbers at unit length again. */
static void shorten(float *v, size_t dimensions) {
    double norm = 0;
    for (size_t k = 0; k < dimensions; k++) norm += (double)v[k] * v[k];
    norm = sqrt(norm);
    for (size_t k = 0; k < dimensions && norm > 0; k++) v[k] = (float)(v[k] / norm);
}

static json_t *floats_json(const float *v, size_t n) {
    json_t *list = json_array();
    for (size_t k = 0; list && k < n; k++)
        if (json_array_append_new(list, json_real(v[k]))) {
            json_decref(list);
            return NULL;
        }
    return list;
}

/* OpenAI's base64: the float32 numbers' little-endian bytes. */
static json_t *base64_json(const float *v, size_t n) {
    unsigned char *text = malloc(4 * ((n * 4 + 2) / 3) + 1);
    if (!text) return NULL;
    EVP_EncodeBlock(text, (const unsigned char *)v, (int)(n * sizeof *v)); /* the hosts served are little-endian */
    json_t *s = json_string((const char *)text);
    free(text);
    return s;
}

static json_t *response(const em_server *s, const embed_job *job, const float *vectors, uint64_t tokens,
                        const struct timespec *started) {
    const size_t width = s->engine.n_embd, kept = job->dimensions ? (size_t)job->dimensions : width;
    json_t *list = json_array();
    for (size_t i = 0; list && i < job->n_inputs; i++) {
        const float *v = vectors + i * width;
        json_t *item = job->base64 ? base64_json(v, kept) : floats_json(v, kept);
        if (item && job->api != EM_API_OLLAMA)
            item = json_pack("{s:s, s:I, s:o}", "object", "embedding", "index", (json_int_t)i, "embedding", item);
        if (!item || json_array_append_new(list, item)) {
            json_decref(list);
            return NULL;
        }
    }
    if (!list) return NULL;
    if (job->api != EM_API_OLLAMA)
        return json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", list, "model", s->engine.model_id,
                         "usage", "prompt_tokens", (json_int_t)tokens, "total_tokens", (json_int_t)tokens);
    if (job->legacy) {
        json_t *one = json_array_size(list) ? json_incref(json_array_get(list, 0)) : json_array();
        json_decref(list);
        return one ? json_pack("{s:o}", "embedding", one) : NULL;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const json_int_t elapsed = (json_int_t)(now.tv_sec - started->tv_sec) * 1000000000 + (now.tv_nsec - started->tv_nsec);
    return json_pack("{s:s, s:o, s:I, s:I, s:I}", "model", job->model ? job->model : s->engine.model_id, "embeddings",
                     list, "total_duration", elapsed, "load_duration", (json_int_t)0, "prompt_eval_count",
                     (json_int_t)tokens);
}

struct MHD_Response *em_embed_serve(em_server *s, const char *url, em_server_endpoint endpoint, const char *body,
                                    size_t len, int fd, int *status) {
    struct timespec started;
    clock_gettime(CLOCK_MONOTONIC, &started);
    const bool ollama = endpoint == EM_EP_OLLAMA_EMBED;
    embed_job job = {
        .api = ollama ? EM_API_OLLAMA : EM_API_OPENAI_CHAT,
        .legacy = ollama && !strcmp(url, "/api/embeddings"),
        .truncate = ollama, /* Ollama cuts long inputs unless told not to; OpenAI refuses them */
        .context = s->engine.ctx_tokens,
    };
    job.param = job.legacy ? "prompt" : "input";
    em_server_error err = {0};
    float *vectors = NULL;
    uint64_t tokens = 0;
    json_t *answer = NULL;
    bool ok = can_embed(s, &err) && parse(&job, s, body, len, &err);
    if (ok && job.n_inputs && !(vectors = malloc(job.n_inputs * s->engine.n_embd * sizeof *vectors))) ok = oom(&err);
    if (ok) ok = run(s, &job, vectors, &tokens, &err, fd);
    for (size_t i = 0; ok && job.dimensions && i < job.n_inputs; i++)
        shorten(vectors + i * s->engine.n_embd, (size_t)job.dimensions);
    if (ok && !(answer = response(s, &job, vectors, tokens, &started))) ok = oom(&err);
    free(vectors);
    job_clear(&job);
    if (!ok && !err.status) return NULL; /* the client went away */
    if (!ok) {
        *status = err.status;
        return em_server_error_response(job.api, &err);
    }
    *status = 200;
    return em_server_json_response(answer);
}
