/* Generation requests on the engine: prompts → token ids, one engine request per choice, then
 * either a whole response (the connection thread waits) or an SSE stream (MHD's content reader
 * pulls events as the engine produces them).
 *
 * Waiting never blocks for long: every wait on the engine has a timeout, after which the client's
 * socket is polled for a hang-up. A client that goes away (or a server that stops) cancels and
 * releases every engine request of its job, so its KV memory is freed at the next engine step.
 *
 * The OpenAI chat and completions and the Anthropic messages are formatted here; the other APIs
 * (the Responses API, Ollama's) bring an em_server_writer that turns the read answer into their
 * own bodies and events, so this file runs every API's request the same way. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* POLLRDHUP */
#endif
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "internal.h"

#define WAIT_MS 250 /* how long a wait on the engine lasts before the socket is checked again */

typedef struct job {
    em_server *server;
    em_server_request req;
    em_server_format fmt;
    char id[64];
    int fd;
    struct timespec last_check; /* of the client's socket */
    size_t n_prompts;
    int32_t **prompt_ids; /* per prompt, malloc'd */
    size_t *prompt_len;
    size_t n_choices;     /* n_prompts * req.n; choice i belongs to prompt i / req.n */
    void **handles;
    em_server_choice *choices;
    bool in_thinking;         /* the chat prompt opened <think>: answers start inside reasoning */
    em_answer_reader *readers; /* chat answers: one per choice */
    em_anthropic_stream anthropic;
    const em_server_writer *writer; /* the API's own formatting, or NULL */
    void *writer_self;
    /* streaming */
    bool started;
    size_t n_finished;
    em_buf pending;
    size_t sent;
    bool done;
    em_server_token *scratch;
    size_t scratch_cap;
    em_access_record *access; /* its connection's log record (internal.h), or NULL */
} job;

/* (internal.h) */
bool em_server_peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    return false;
}

/* Whether to give up: the client hung up or the server is stopping. The socket is polled at most
 * every 100 ms, whether or not the engine is producing output. */
static bool give_up(job *j, bool now) {
    if (atomic_load(&j->server->stopping)) return true;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double since = (double)(t.tv_sec - j->last_check.tv_sec) + 1e-9 * (double)(t.tv_nsec - j->last_check.tv_nsec);
    if (!now && since < 0.1) return false;
    j->last_check = t;
    return em_server_peer_gone(j->fd);
}

/* The watch of the request's grammar work: it stops when the client hangs up or the server stops. */
static bool grammar_work_stops(void *self) { return give_up(self, false); }

/* Makes the request's grammar (structured.c) on this connection's thread, through the server's
 * cache. False with `err` set, or with *gone when the client went away meanwhile. */
static bool make_grammar(job *j, em_server_error *err, bool *gone) {
    em_server *s = j->server;
    em_grammar_watch watch;
    em_grammar_watch_init(&watch, s->grammar_seconds, grammar_work_stops, j);
    const em_server_grammar_maker maker = {.cache = s->grammars, .watch = &watch};
    if (em_server_make_grammar(&j->req, &maker, s->engine.tool_format, s->engine.reasons, j->in_thinking, err)) return true;
    *gone = !atomic_load(&s->stopping) && em_server_peer_gone(j->fd);
    return false;
}

static void job_free(job *j) {
    if (!j) return;
    for (size_t i = 0; i < j->n_choices; i++) {
        if (j->handles && j->handles[i]) {
            if (j->choices[i].finish == EMBER_FINISH_NONE) j->server->engine.cancel(j->handles[i]);
            j->server->engine.release(j->handles[i]);
        }
        if (j->choices) em_server_choice_clear(&j->choices[i]);
        if (j->readers) em_answer_clear(&j->readers[i]);
    }
    if (j->writer) j->writer->free(j->writer_self);
    free(j->readers);
    for (size_t p = 0; p < j->n_prompts; p++) free(j->prompt_ids ? j->prompt_ids[p] : NULL);
    free(j->prompt_ids);
    free(j->prompt_len);
    free(j->handles);
    free(j->choices);
    em_buf_free(&j->pending);
    free(j->scratch);
    em_server_request_clear(&j->req);
    free(j);
}

static uint64_t mix64(uint64_t x) {
    /* splitmix64's finalizer: spreads a counter into an unrelated-looking seed */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Maps an engine error to an HTTP error: the caller's mistakes are 400s. */
static void engine_error(em_err e, const char *what, em_server_error *err) {
    em_err_code code = em_err_code_of(e);
    int status = code == EM_ERR_INVALID || code == EM_ERR_RANGE || code == EM_ERR_FORMAT ? 400
                 : code == EM_ERR_NOMEM                                                   ? 503
                                                                                         : 500;
    em_server_error_set(err, status, NULL, NULL, NULL, "%s: %s", what, em_err_message(e));
    em_err_free(e);
}

em_err em_server_chat_prompt(const em_server_engine *b, const em_server_request *req, int32_t **ids, size_t *n,
                             bool *in_thinking) {
    if (b->tool_format != EM_TOOL_FORMAT_HARMONY)
        return b->chat_prompt(b->self, req->messages, req->tools, req->template_kwargs, ids, n, in_thinking);
    json_t *messages = em_harmony_messages(req->messages);
    json_t *tools = req->tools ? em_harmony_tools(req->tools) : NULL;
    em_err e = !messages || (req->tools && !tools)
                   ? em_errorf(EM_ERR_NOMEM, "out of memory")
                   : b->chat_prompt(b->self, messages, tools, req->template_kwargs, ids, n, in_thinking);
    json_decref(messages);
    json_decref(tools);
    return e;
}

/* The context a request's prompt and output must fit: the engine's, or less when the request asks
 * (Ollama's num_ctx; more than the engine's is the engine's). 0: no bound known. */
static int context_of(const job *j) {
    const int engine = j->server->engine.ctx_tokens;
    return j->req.ctx_tokens > 0 && (engine <= 0 || j->req.ctx_tokens < engine) ? j->req.ctx_tokens : engine;
}

static bool tokenize_prompts(job *j, em_server_error *err) {
    const em_server_engine *b = &j->server->engine;
    const int ctx = context_of(j);
    j->n_prompts = j->req.messages ? 1 : j->req.n_prompts;
    j->prompt_ids = calloc(j->n_prompts, sizeof *j->prompt_ids);
    j->prompt_len = calloc(j->n_prompts, sizeof *j->prompt_len);
    if (!j->prompt_ids || !j->prompt_len) {
        em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
        return false;
    }
    for (size_t p = 0; p < j->n_prompts; p++) {
        em_err e = NULL;
        if (j->req.messages) {
            e = em_server_chat_prompt(b, &j->req, &j->prompt_ids[p], &j->prompt_len[p], &j->in_thinking);
        } else if (j->req.prompts[p].is_ids) {
            /* the ids are handed to the engine as they are: move them out of the request */
            j->prompt_ids[p] = j->req.prompts[p].ids;
            j->prompt_len[p] = j->req.prompts[p].n_ids;
            j->req.prompts[p].ids = NULL;
            j->req.prompts[p].n_ids = 0;
        } else {
            e = b->tokenize(b->self, j->req.prompts[p].text, j->req.prompts[p].text_len, true, false, &j->prompt_ids[p],
                            &j->prompt_len[p]);
        }
        if (e) {
            engine_error(e, j->req.messages ? "messages" : "prompt", err);
            return false;
        }
        if (j->prompt_len[p] == 0) {
            em_server_error_set(err, 400, NULL, "invalid_value", j->req.messages ? "messages" : "prompt",
                                "the prompt is empty");
            return false;
        }
        if (ctx > 0 && j->prompt_len[p] >= (size_t)ctx) {
            em_server_error_set(err, 400, NULL, "context_length_exceeded", j->req.messages ? "messages" : "prompt",
                                "the prompt has %zu tokens; the context holds %d (prompt and output together%s)",
                                j->prompt_len[p], ctx, ctx < b->ctx_tokens ? ", the request's num_ctx" : "");
            return false;
        }
    }
    return true;
}

static em_answer_options answer_options(const job *j);

static bool submit_all(job *j, em_server_error *err) {
    const em_server_engine *b = &j->server->engine;
    j->n_choices = j->n_prompts * (size_t)j->req.n;
    j->handles = calloc(j->n_choices, sizeof *j->handles);
    j->choices = calloc(j->n_choices, sizeof *j->choices);
    if (!j->handles || !j->choices) {
        em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
        return false;
    }
    uint64_t base_seed = j->req.seed_given ? j->req.sampling.seed
                                           : mix64(atomic_fetch_add(&j->server->next_id, 1) ^
                                                   ((uint64_t)j->server->salt << 32) ^ (uint64_t)time(NULL));
    /* Markers the answer reader looks for reach it even when the model writes them as control tokens. */
    const char *markers[EM_ANSWER_MAX_MARKERS];
    const em_answer_options options = answer_options(j);
    const size_t n_markers = j->req.api == EM_API_OPENAI_COMPLETIONS ? 0 : em_answer_markers(&options, markers);
    for (size_t i = 0; i < j->n_choices; i++) {
        size_t p = i / (size_t)j->req.n;
        ember_request_params params;
        memset(&params, 0, sizeof params);
        params.prompt_ids = j->prompt_ids[p];
        params.n_prompt_ids = j->prompt_len[p];
        params.sampling = j->req.sampling;
        /* choices of one request differ, and the same seed gives the same choices again */
        params.sampling.seed = base_seed + (uint64_t)(i % (size_t)j->req.n);
        params.sampling.logprobs = j->req.logprobs ? (j->req.top_logprobs > 0 ? j->req.top_logprobs : 1) : 0;
        const int ctx = context_of(j);
        size_t room = ctx > 0 ? (size_t)ctx - j->prompt_len[p] : (size_t)1 << 30;
        size_t max = j->req.max_tokens > 0 ? (size_t)j->req.max_tokens : room;
        params.max_tokens = (int)(max < room ? max : room);
        params.stop = (const char *const *)j->req.stop;
        params.ignore_eos = j->req.ignore_eos;
        params.speculative = j->req.speculative;
        params.n_stop = j->req.n_stop;
        params.grammar = j->req.grammar;
        params.compiled_grammar = j->req.compiled_grammar; /* made once, before submission (make_grammar) */
        params.grammar_triggers = j->req.grammar_triggers;
        for (params.n_grammar_triggers = 0; j->req.grammar_triggers && j->req.grammar_triggers[params.n_grammar_triggers];)
            params.n_grammar_triggers++;
        params.control_texts = markers;
        params.n_control_texts = n_markers;
        em_err e = b->submit(b->self, &params, &j->handles[i]);
        if (e) {
            engine_error(e, "submit", err);
            return false;
        }
    }
    return true;
}

/* Whether answers may hold tool calls to read back (tools given, choice not none). */
static bool tools_active(const job *j) {
    return j->req.tools && j->req.tool_choice != EM_TOOL_NONE && j->req.api != EM_API_OPENAI_COMPLETIONS;
}

/* How a chat answer is read (answer.c): where its reasoning goes, and whether it holds calls. */
static em_answer_options answer_options(const job *j) {
    const bool reasons = j->server->engine.reasons || j->in_thinking;
    const em_tool_format format = j->server->engine.tool_format;
    em_answer_reasoning split = EM_REASONING_OFF;
    /* harmony's analysis channel and Gemma 4's thought channel are reasoning, whatever the template's tags */
    if (format == EM_TOOL_FORMAT_HARMONY || format == EM_TOOL_FORMAT_GEMMA4)
        return (em_answer_options){.split_reasoning = j->req.reasoning_format == EM_REASONING_FORMAT_NONE ? EM_REASONING_INLINE
                                                                                                         : EM_REASONING_SPLIT,
                                   .read_calls = tools_active(j), .format = format, .tools = j->req.tools};
    switch (j->req.reasoning_format) {
    case EM_REASONING_FORMAT_AUTO: split = reasons ? EM_REASONING_SPLIT : EM_REASONING_OFF; break;
    case EM_REASONING_FORMAT_DEEPSEEK: split = EM_REASONING_SPLIT; break;
    case EM_REASONING_FORMAT_NONE: split = reasons ? EM_REASONING_INLINE : EM_REASONING_OFF; break;
    }
    return (em_answer_options){.split_reasoning = split, .starts_in_reasoning = j->in_thinking && split != EM_REASONING_OFF,
                               .read_calls = tools_active(j), .format = j->server->engine.tool_format,
                               .tools = j->req.tools};
}

/* Whether streamed chat answers go through the reader (else their text is sent as it comes). */
static bool reader_streams(const job *j) {
    const em_answer_options o = answer_options(j);
    return j->writer || j->req.api == EM_API_ANTHROPIC_MESSAGES || o.read_calls || o.split_reasoning != EM_REASONING_OFF ||
           o.format == EM_TOOL_FORMAT_HARMONY || o.format == EM_TOOL_FORMAT_GEMMA4;
}

static bool start_readers(job *j, em_server_error *err) {
    if (j->req.api == EM_API_OPENAI_COMPLETIONS) return true;
    if (!(j->readers = calloc(j->n_choices, sizeof *j->readers))) {
        em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
        return false;
    }
    const em_answer_options options = answer_options(j);
    for (size_t i = 0; i < j->n_choices; i++) em_answer_init(&j->readers[i], &options);
    return true;
}

static bool keep_tokens(const job *j) {
    return j->req.logprobs;
}

/* The engine hands out a logprob for the sampled token plus `logprobs` alternatives; a request
 * for logprobs without top_logprobs gets none of the alternatives. */
static void clamp_top(const job *j, em_server_token *tokens, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (tokens[k].n_top > j->req.top_logprobs) tokens[k].n_top = j->req.top_logprobs;
}

/* Feeds one engine output of choice i to its reader. Its tokens count as reasoning when the reader
 * was in the reasoning before them (the token that closes it too) or is after them (the one that
 * opens it). */
static bool feed_reader(job *j, size_t i, const ember_output *out, em_answer_sink sink, void *self) {
    em_answer_reader *r = &j->readers[i];
    const bool before = em_answer_in_reasoning(r);
    if (!em_answer_feed(r, out->text, out->text_len, sink, self)) return false;
    if (before || em_answer_in_reasoning(r)) j->choices[i].reasoning_tokens += out->n_tokens;
    return true;
}

static void usage_of(const job *j, em_server_usage *u) {
    memset(u, 0, sizeof *u);
    for (size_t i = 0; i < j->n_choices; i++) {
        const ember_timings *t = &j->choices[i].timings;
        u->completion_tokens += t->generated_tokens;
        u->reasoning_tokens += j->choices[i].reasoning_tokens;
        if (i % (size_t)j->req.n == 0) {
            u->prompt_tokens += j->prompt_len[i / (size_t)j->req.n];
            u->cached_tokens += t->cached_tokens;
        }
    }
    if (j->access) {
        j->access->prompt_tokens = (int64_t)u->prompt_tokens;
        j->access->completion_tokens = (int64_t)u->completion_tokens;
    }
}

/* An engine finish that is not a normal end of generation, as an HTTP error. A grammar that turns
 * out too ambiguous to follow partway through the answer is the request's fault, as it would have
 * been had it shown at the start: a 400 naming the grammar's field (in a stream, the error event
 * after the text the grammar took so far). */
static bool finish_error(const job *j, const em_server_choice *c, const ember_output *out, em_server_error *err) {
    if (c->finish == EMBER_FINISH_ERROR && out->invalid_request) {
        const char *param = j->req.grammar_param ? j->req.grammar_param : "grammar";
        em_server_error_set(err, 400, NULL, "grammar_too_ambiguous", param,
                            "'%s': the answer could not go on inside the grammar after %zu bytes: %s", param, c->text.len,
                            out->error ? out->error : "too ambiguous");
        return true;
    }
    if (c->finish == EMBER_FINISH_ERROR) {
        em_server_error_set(err, 500, NULL, NULL, NULL, "the engine failed: %s", out->error ? out->error : "unknown error");
        return true;
    }
    if (c->finish == EMBER_FINISH_CANCELLED) {
        em_server_error_set(err, 503, NULL, NULL, NULL, "the request was cancelled: the server is stopping");
        return true;
    }
    return false;
}

/* ---- Whole responses ---- */

static struct MHD_Response *run_blocking(job *j, int *status) {
    const em_server_engine *b = &j->server->engine;
    em_server_error err = {0};
    for (size_t i = 0; i < j->n_choices; i++) {
        em_server_choice *c = &j->choices[i];
        while (c->finish == EMBER_FINISH_NONE) {
            ember_output out;
            bool got = b->next(j->handles[i], &out, WAIT_MS);
            if (give_up(j, !got)) return NULL;
            if (!got) continue;
            bool ok = em_server_choice_add(c, &out, keep_tokens(j));
            if (ok && j->readers) ok = feed_reader(j, i, &out, em_server_choice_collect, c);
            if (ok && j->readers && c->finish != EMBER_FINISH_NONE)
                ok = em_answer_finish(&j->readers[i], em_server_choice_collect, c);
            if (!ok) {
                em_server_error_set(&err, 500, NULL, NULL, NULL, "out of memory");
                goto fail;
            }
            if (finish_error(j, c, &out, &err)) goto fail;
        }
        b->timings(j->handles[i], &c->timings);
        clamp_top(j, c->tokens, c->n_tokens);
    }
    em_server_usage usage;
    usage_of(j, &usage);
    json_t *body = j->writer ? j->writer->response(j->writer_self, &j->fmt, &j->choices[0], &usage)
                   : j->req.api == EM_API_OPENAI_CHAT ? em_openai_chat_response(&j->fmt, &j->req, j->choices, j->n_choices, &usage)
                   : j->req.api == EM_API_OPENAI_COMPLETIONS
                       ? em_openai_completion_response(&j->fmt, &j->req, j->choices, j->n_choices, &usage)
                       : em_anthropic_message_response(&j->fmt, &j->choices[0], &usage);
    if (!body) {
        em_server_error_set(&err, 500, NULL, NULL, NULL, "out of memory formatting the response");
        goto fail;
    }
    *status = 200;
    return em_server_json_response(body);
fail:
    *status = err.status;
    return em_server_error_response(j->req.api, &err);
}

/* ---- Streams ---- */

static em_server_token *convert_tokens(job *j, const ember_output *out) {
    if (!keep_tokens(j) || out->n_tokens == 0) return NULL;
    if (out->n_tokens > j->scratch_cap) {
        em_server_token *grown = realloc(j->scratch, out->n_tokens * sizeof *grown);
        if (!grown) return NULL;
        j->scratch = grown;
        j->scratch_cap = out->n_tokens;
    }
    for (size_t k = 0; k < out->n_tokens; k++) em_server_token_from(&j->scratch[k], &out->tokens[k]);
    clamp_top(j, j->scratch, out->n_tokens);
    return j->scratch;
}

/* Anthropic's message_start carries the input usage, which is known once the engine admitted
 * the request (the prefix cache decides what was cached): it is written with the first output. */
static bool stream_start(job *j) {
    if (j->req.api == EM_API_OPENAI_CHAT)
        for (size_t i = 0; i < j->n_choices; i++)
            if (!em_openai_chat_chunk_start(&j->pending, &j->fmt, &j->req, (int)i)) return false;
    if (j->req.api == EM_API_ANTHROPIC_MESSAGES || j->writer) {
        ember_timings t;
        j->server->engine.timings(j->handles[0], &t);
        em_server_usage usage = {.prompt_tokens = j->prompt_len[0], .cached_tokens = t.cached_tokens};
        if (j->writer ? !j->writer->stream_start(j->writer_self, &j->pending, &j->fmt, &usage)
                      : !em_anthropic_stream_start(&j->pending, &j->fmt, &usage))
            return false;
    }
    j->started = true;
    return true;
}

/* The closing events of choice i when it finished: its end (usage, [DONE]) once every choice did. */
static bool stream_choice_done(job *j) {
    if (++j->n_finished < j->n_choices) return true;
    if (j->req.api != EM_API_ANTHROPIC_MESSAGES && !j->writer) {
        em_server_usage usage;
        usage_of(j, &usage);
        if (!em_openai_stream_end(&j->pending, &j->fmt, &j->req, &usage, &j->choices[0].timings)) return false;
    }
    j->done = true;
    return true;
}

/* A reader's sink while streaming: the event joins the choice and goes out at once. */
typedef struct stream_sink {
    job *j;
    size_t index;
} stream_sink;

static bool stream_event(void *self, const em_answer_event *event) {
    stream_sink *s = self;
    job *j = s->j;
    if (!em_server_choice_collect(&j->choices[s->index], event)) return false;
    if (j->writer) return j->writer->stream_answer(j->writer_self, &j->pending, &j->fmt, event);
    if (j->req.api == EM_API_ANTHROPIC_MESSAGES) return em_anthropic_stream_answer(&j->pending, &j->fmt, &j->anthropic, event);
    return em_openai_chunk_answer(&j->pending, &j->fmt, &j->req, (int)s->index, event);
}

/* One engine output of a chat answer that goes through its reader: the events it completes, and
 * at the end the finishing events. */
static bool stream_read_output(job *j, size_t i, const ember_output *out) {
    em_server_choice *c = &j->choices[i];
    stream_sink sink = {.j = j, .index = i};
    if (!feed_reader(j, i, out, stream_event, &sink)) return false;
    em_server_token *tokens = convert_tokens(j, out);
    if (c->finish == EMBER_FINISH_NONE) {
        return !tokens || j->req.api == EM_API_ANTHROPIC_MESSAGES || j->writer ||
               em_openai_chunk_logprobs(&j->pending, &j->fmt, &j->req, (int)i, tokens, out->n_tokens);
    }
    if (!em_answer_finish(&j->readers[i], stream_event, &sink)) return false;
    em_server_usage usage;
    usage_of(j, &usage);
    bool ok = j->writer ? j->writer->stream_end(j->writer_self, &j->pending, &j->fmt, c, &usage)
              : j->req.api == EM_API_ANTHROPIC_MESSAGES
                  ? em_anthropic_stream_end(&j->pending, &j->anthropic, c, &usage)
                  : em_openai_chunk_finish(&j->pending, &j->fmt, &j->req, (int)i, c, tokens, tokens ? out->n_tokens : 0);
    return ok && stream_choice_done(j);
}

/* Turns one engine output of choice i into events. */
static bool stream_output(job *j, size_t i, const ember_output *out) {
    em_server_choice *c = &j->choices[i];
    const em_server_engine *b = &j->server->engine;
    if (!j->started && !stream_start(j)) return false;
    if (!em_server_choice_add(c, out, false)) return false;
    if (c->finish != EMBER_FINISH_NONE) b->timings(j->handles[i], &c->timings);
    em_server_error err = {0};
    if (finish_error(j, c, out, &err)) {
        j->done = true;
        return j->writer ? j->writer->stream_error(j->writer_self, &j->pending, &j->fmt, &err)
                         : em_server_stream_error(&j->pending, j->req.api, &err);
    }
    if (reader_streams(j)) return stream_read_output(j, i, out);
    if (out->text_len || out->n_tokens || c->finish != EMBER_FINISH_NONE) {
        em_server_token *tokens = convert_tokens(j, out);
        if (!em_openai_chunk_delta(&j->pending, &j->fmt, &j->req, (int)i, out->text, out->text_len, tokens,
                                   tokens ? out->n_tokens : 0, c->finish, &c->timings))
            return false;
    }
    return c->finish == EMBER_FINISH_NONE || stream_choice_done(j);
}

/* Produces more events; false when the stream must end abruptly (client gone, out of memory). */
static bool stream_advance(job *j) {
    const em_server_engine *b = &j->server->engine;
    if (!j->started && j->req.api != EM_API_ANTHROPIC_MESSAGES && !j->writer) return stream_start(j);
    bool got = false;
    for (size_t i = 0; i < j->n_choices && !j->done; i++) {
        if (j->choices[i].finish != EMBER_FINISH_NONE) continue;
        ember_output out;
        /* one choice: block on it; several: take what is ready, block below if nothing was */
        if (b->next(j->handles[i], &out, j->n_choices == 1 ? WAIT_MS : 0)) {
            got = true;
            if (!stream_output(j, i, &out)) return false;
        }
    }
    if (j->done) return true;
    if (got) return !give_up(j, false);
    if (j->n_choices > 1) {
        for (size_t i = 0; i < j->n_choices; i++) {
            if (j->choices[i].finish != EMBER_FINISH_NONE) continue;
            ember_output out;
            if (b->next(j->handles[i], &out, 20)) return stream_output(j, i, &out);
            break;
        }
    }
    return !give_up(j, true);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    while (j->sent == j->pending.len) {
        j->sent = j->pending.len = 0;
        if (j->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!stream_advance(j)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = j->pending.len - j->sent;
    if (n > max) n = max;
    memcpy(buf, j->pending.data + j->sent, n);
    j->sent += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    job_free(cls);
}

/* ---- Entry ---- */

struct MHD_Response *em_server_generate(em_server *server, em_server_request *req, int fd, int *status) {
    return em_server_generate_with(server, req, NULL, NULL, fd, status);
}

struct MHD_Response *em_server_generate_with(em_server *server, em_server_request *req, const em_server_writer *writer,
                                             void *writer_self, int fd, int *status) {
    em_server_error err = {0};
    job *j = calloc(1, sizeof *j);
    if (!j) {
        em_server_api api = req->api;
        em_server_error_set(&err, 500, NULL, NULL, NULL, "out of memory");
        em_server_request_clear(req);
        if (writer) writer->free(writer_self);
        *status = 500;
        return em_server_error_response(api, &err);
    }
    j->writer = writer;
    j->writer_self = writer_self;
    if (writer) req->n = 1;
    j->server = server;
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->fd = fd;
    j->access = em_access_current;
    clock_gettime(CLOCK_MONOTONIC, &j->last_check);
    uint64_t serial = atomic_fetch_add(&server->next_id, 1);
    const char *prefix = writer ? writer->id_prefix : j->req.api == EM_API_OPENAI_CHAT ? "chatcmpl-" : j->req.api == EM_API_OPENAI_COMPLETIONS ? "cmpl-" : "msg_";
    snprintf(j->id, sizeof j->id, "%s%08x%016llx", prefix, server->salt, (unsigned long long)serial);
    j->fmt = (em_server_format){.id = j->id, .created = (int64_t)time(NULL), .model = server->engine.model_id,
                                .engine = &server->engine};

    bool gone = false;
    const bool tokenized = tokenize_prompts(j, &err);
    if (tokenized && j->access) {
        j->access->prompt_tokens = 0;
        for (size_t p = 0; p < j->n_prompts; p++) j->access->prompt_tokens += (int64_t)j->prompt_len[p];
    }
    if (!tokenized || !make_grammar(j, &err, &gone) || !submit_all(j, &err) || !start_readers(j, &err)) {
        em_server_api api = j->req.api;
        job_free(j);
        *status = err.status;
        return gone ? NULL : em_server_error_response(api, &err); /* nobody to answer: the connection closes */
    }
    if (!j->req.stream) {
        struct MHD_Response *response = run_blocking(j, status);
        job_free(j);
        return response;
    }
    struct MHD_Response *response = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, j, stream_free);
    if (!response) {
        job_free(j);
        return NULL;
    }
    MHD_add_response_header(response, "Content-Type", writer ? writer->stream_type : "text/event-stream");
    MHD_add_response_header(response, "Cache-Control", "no-cache");
    *status = 200;
    return response;
}
