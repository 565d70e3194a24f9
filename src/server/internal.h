/* Helpers shared by the server's files (not part of its interface: see server.h). */
#ifndef EMBER_SERVER_INTERNAL_H
#define EMBER_SERVER_INTERNAL_H

#include "server.h"

/* Parses a body that must be a JSON object (400 otherwise). New reference or NULL. */
json_t *em_server_parse_body(const char *body, size_t len, em_server_error *err);

/* Optional fields: absent or null keeps *out; a wrong type or a value out of [min, max] is a 400
 * naming the field. */
bool em_server_read_number(const json_t *obj, const char *key, double min, double max, double *out,
                           em_server_error *err);
bool em_server_read_int(const json_t *obj, const char *key, int64_t min, int64_t max, int64_t *out,
                        em_server_error *err);
bool em_server_read_bool(const json_t *obj, const char *key, bool *out, em_server_error *err);
/* Speculative decoding for the request (docs/speculative.md): "speculative" false turns it off, true
 * or absent keeps the server's default, "off", "lookup" or "draft" choose; llama-server's
 * "speculative.n_max" of 0 turns it off too. */
bool em_server_read_speculative(const json_t *obj, em_server_request *req, em_server_error *err);
bool em_server_read_string(const json_t *obj, const char *key, const char **out, em_server_error *err);
bool em_server_read_stops(const json_t *obj, const char *key, bool allow_string, em_server_request *req,
                          em_server_error *err);
/* Message content (string or text blocks) appended to `text`. */
bool em_server_read_content(const json_t *content, const char *param, em_buf *text, em_server_error *err);
bool em_server_add_message(em_server_request *req, const char *role, const em_buf *text, em_server_error *err);

/* Sets the chat-template variable `name` (req->template_kwargs, made when absent) to `value` (taken;
 * NULL: out of memory, a 500). */
bool em_server_set_template_variable(em_server_request *req, const char *name, json_t *value, em_server_error *err);
/* A reasoning effort as OpenAI's APIs name it (none, minimal, low, medium, high, xhigh) into the
 * template variable reasoning_effort, in the grades reasoning templates know (gpt-oss's low, medium,
 * high: none and minimal are low, xhigh is high). Absent or null: nothing; anything else is a 400
 * naming `param`. */
bool em_server_read_reasoning_effort(const json_t *obj, const char *key, const char *param, em_server_request *req,
                                     em_server_error *err);

/* An assistant message's earlier reasoning (non-empty) for the template, under the names templates
 * read it by: reasoning_content (Qwen 3, DeepSeek) and thinking (gpt-oss). Each template keeps or
 * drops it as its model was trained to (gpt-oss keeps the reasoning that led to a call until a
 * final answer follows). */
bool em_server_set_reasoning(json_t *message, const char *text, size_t len, em_server_error *err);

/* Structured output (structured.c): `grammar` (GBNF, llama-server's field) or `response_format`
 * (json_object, json_schema) of an OpenAI body into req->grammar or req->grammar_schema, kept as
 * text until the grammar is made (em_server_make_grammar). */
bool em_server_read_constraints(const json_t *root, em_server_request *req, em_server_error *err);
/* reasoning_format (auto, deepseek, none; absent = auto) into req->reasoning_format. */
bool em_server_read_reasoning_format(const json_t *root, em_server_request *req, em_server_error *err);
/* Takes `gbnf` (malloc'd, may be NULL) as req->grammar, from field `param`, dropping what was there. */
bool em_server_set_grammar(em_server_request *req, char *gbnf, const char *param, em_server_error *err);

/* How a request's grammars are made: through the server's cache of compiled grammars (NULL:
 * none, as in tests), under a watch (NULL: none) that stops the work when the client goes away or
 * the server stops, and refuses it past its CPU time. */
typedef struct em_server_grammar_maker {
    em_grammar_cache *cache;
    const em_grammar_watch *watch;
} em_server_grammar_maker;
/* The request's grammar made (structured.c): the schema converted, the answer's grammar built
 * (em_server_answer_grammar), the whole compiled into req->compiled_grammar. A grammar refused is
 * a 400 naming its field; out of memory or stopped by the watch a 503. */
bool em_server_make_grammar(em_server_request *req, const em_server_grammar_maker *maker, em_tool_format format,
                            bool reasons, bool in_thinking, em_server_error *err);
/* req->grammar_schema, if any, converted into req->grammar. */
bool em_server_schema_grammar(em_server_request *req, const em_server_grammar_maker *maker, em_server_error *err);
/* `e` (taken) from making the grammar of field `param` as an HTTP error; returns false. */
bool em_server_grammar_failed(em_err e, const char *param, em_server_error *err);

/* Tools (tools.c): definitions and tool_choice into req->tools / tool_choice / tool_name (OpenAI's
 * shape; Anthropic's converted). */
bool em_server_read_openai_tools(const json_t *root, em_server_request *req, em_server_error *err);
bool em_server_read_anthropic_tools(const json_t *root, em_server_request *req, em_server_error *err);
/* The definition of tool `name` in `tools` (OpenAI-style), or NULL. */
const json_t *em_server_find_tool(const json_t *tools, const char *name);
/* The grammar of a chat answer (tool_grammar.c): a forced call (required, any, named) or the lazy
 * grammar of `auto` in `format`, and when the template `reasons` (or the prompt is `in_thinking`)
 * a <think> section first, ahead of a response_format too. Nothing for none, or auto in the JSON
 * format. A forced call with response_format or grammar is a 400. */
bool em_server_answer_grammar(em_server_request *req, const em_server_grammar_maker *maker, em_tool_format format,
                              bool reasons, bool in_thinking, em_server_error *err);
/* The same for a model that does not reason. */
bool em_server_tool_grammar(em_server_request *req, em_tool_format format, em_server_error *err);
/* A call's arguments as given in a request (a JSON string) → an object for the template, or the
 * string itself when it is not a JSON object. */
json_t *em_server_arguments_object(const char *text);

/* ---- What answer.c shares with the readers of harmony (harmony.c) and Gemma 4 (gemma4.c) answers ---- */

/* Hands one event to the sink (empty text is no event, except a call's beginning). */
bool em_answer_emit(em_answer_reader *r, em_answer_kind kind, const char *text, size_t len, em_answer_sink sink, void *self);
/* A call of tool `name` (malloc'd; the reader takes it) begins. */
bool em_answer_begin_call(em_answer_reader *r, char *name, em_answer_sink sink, void *self);
/* The current call ends; arguments that never came are {}. */
bool em_answer_end_call(em_answer_reader *r, em_answer_sink sink, void *self);
/* Drops the first n bytes the reader holds. */
void em_answer_consume(em_answer_reader *r, size_t n);
/* The longest suffix of text[0..len) that is a proper prefix of `marker`. */
size_t em_answer_partial_suffix(const char *text, size_t len, const char *marker);
/* Reads what a harmony answer's reader holds (finished: the answer has ended). */
bool em_harmony_read(em_answer_reader *r, bool finished, em_answer_sink sink, void *self);
/* The harmony markup the reader needs to see as text (em_answer_markers). */
size_t em_harmony_markers(const char *out[EM_ANSWER_MAX_MARKERS]);
/* Reads what a Gemma 4 answer's reader holds (finished: the answer has ended). */
bool em_gemma4_read(em_answer_reader *r, bool finished, em_answer_sink sink, void *self);
/* The Gemma 4 markup the reader needs to see as text (em_answer_markers). */
size_t em_gemma4_markers(const char *out[EM_ANSWER_MAX_MARKERS]);
/* A conversation as gpt-oss's template takes it: one call a message, each followed by its result
 * (new reference; NULL: out of memory). */
json_t *em_harmony_messages(const json_t *messages);
/* Tool definitions with an empty description where one has none (new reference; NULL: out of memory). */
json_t *em_harmony_tools(const json_t *tools);

/* The chat prompt of a request (chat_prompt with its messages, tools and template variables, in
 * the shape the model's format needs: em_harmony_messages and em_harmony_tools for harmony).
 * *in_thinking may be NULL. */
em_err em_server_chat_prompt(const em_server_engine *engine, const em_server_request *req, int32_t **ids, size_t *n,
                             bool *in_thinking);

/* A JSON schema (NULL: any JSON object) as the request's grammar: its text into req->grammar_schema
 * (any object: its GBNF into req->grammar); errors name `param`. */
bool em_server_grammar_from_schema(em_server_request *req, const json_t *schema, const char *param, em_server_error *err);

/* A value JSON can hold: NaN and infinities (a banned token's logprob) become -9999, as OpenAI
 * reports them. */
double em_server_finite(double x);

void em_server_token_from(em_server_token *dst, const ember_token_out *src);

/* Writes one SSE event: optional `event:` line, then `data: <json>` and a blank line. */
bool em_server_sse(em_buf *out, const char *event, const json_t *data);

/* ---- The HTTP side (http.c), generation (generate.c) and the responses both send (response.c) ----
 * The arrows run one way: http.c → generate.c → response.c, and http.c → response.c. */

#include <microhttpd.h>
#include <stdatomic.h>

/* The connection guard (guard.c): deadlines for receiving a request and room for new clients,
 * which libmicrohttpd's idle timeout and connection limits cannot give. */
typedef enum em_guard_phase {
    EM_GUARD_HEADERS = 0, /* accepted, or kept alive after a response: waiting for a request's headers */
    EM_GUARD_BODY,        /* headers in, reading the body */
    EM_GUARD_SERVING      /* the request is being answered: never cut by the guard */
} em_guard_phase;

typedef struct em_guard_options {
    double header_seconds;    /* to send a request's headers */
    double body_seconds;      /* to send its body, from the end of the headers */
    int receiving_per_client; /* connections of one IP address sending a request at once */
    int receiving_total;      /* and of all clients */
} em_guard_options;

typedef struct em_guard_entry em_guard_entry;

typedef struct em_guard {
    em_guard_options options;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    em_guard_entry *head; /* every open connection */
    uint64_t cuts;        /* connections cut so far */
    bool stopping, started;
} em_guard;

em_err em_guard_start(em_guard *guard, const em_guard_options *options);
/* After the daemon has stopped (its close notifications need the guard). */
void em_guard_stop(em_guard *guard);
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the guard). */
void em_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode code);
/* The access handler moves a connection from phase to phase. */
void em_guard_enter(em_guard *guard, struct MHD_Connection *c, em_guard_phase phase);

/* ---- Stored responses (response_store.c): the Responses API's `store` and `previous_response_id` ----
 * A bounded map from response id to what that response ended (responses.c keeps its conversation as
 * chat messages and its output items), least recently used first out. Thread-safe: connection
 * threads share it. */
typedef struct em_response_store em_response_store;

em_response_store *em_response_store_new(size_t max_entries, size_t max_bytes);
void em_response_store_free(em_response_store *store);
/* Keeps a copy of `conversation` (any JSON value) under `id`, replacing one of the same id. */
bool em_response_store_put(em_response_store *store, const char *id, const json_t *conversation);
/* A copy of the conversation kept under `id` (new reference), or NULL when it is not (or no longer) kept. */
json_t *em_response_store_get(em_response_store *store, const char *id);

struct em_server {
    struct MHD_Daemon *daemon;
    struct MHD_Daemon *ollama_daemon; /* the second port's (options.ollama_port), or NULL */
    int ollama_port;
    em_server_engine engine;
    char *api_key;
    size_t max_body;
    int port;
    int64_t started;           /* seconds since the epoch, for `created` of the model list */
    uint32_t salt;             /* random per process: response ids and default seeds differ per run */
    atomic_uint_fast64_t next_id;
    atomic_bool stopping;      /* waiting threads give up their requests */
    em_server_metrics metrics;
    em_guard guard;
    em_response_store *responses; /* the Responses API's stored responses */
    em_grammar_cache *grammars;   /* requests' compiled grammars, shared by content */
    double grammar_seconds;       /* CPU time to make one request's grammar */
    bool matryoshka;              /* embeddings may be cut to fewer dimensions (em_server_options) */
    em_access_log_format access_log;
};

/* The access record of the request whose connection thread this is, while http.c dispatches it
 * (NULL otherwise): generate.c notes its token counts there, which reach the log line without
 * every endpoint passing the record along. A generation job keeps the pointer for its stream,
 * which runs on the same thread and ends before the record is written out. */
extern _Thread_local em_access_record *em_access_current;

/* True when the peer closed its end of `fd` (checked without blocking; fd < 0: never), so that
 * work for a client who left stops (generate.c). */
bool em_server_peer_gone(int fd);

/* A JSON response (takes the body's reference) or an error response in `api`'s format (response.c). */
struct MHD_Response *em_server_json_response(json_t *body);
struct MHD_Response *em_server_error_response(em_server_api api, const em_server_error *err);
/* The chat page's file at `url` (web.c), NULL when there is none or memory ran out. */
struct MHD_Response *em_server_asset_response(const char *url);

/* An API that writes its own answers (responses.c, ollama.c): generate.c runs the request on the
 * engine and reads the answer (em_answer_reader); the writer turns what was read into the API's
 * body or stream. `self` is the writer's state for one request. A writer's request has n = 1. */
typedef struct em_server_writer {
    const char *id_prefix;   /* of the response id (em_server_format.id) */
    const char *stream_type; /* Content-Type of a stream */
    /* The stream's opening events, written once the engine admitted the request (usage: the prompt
     * and its cached tokens, nothing generated yet). */
    bool (*stream_start)(void *self, em_buf *out, const em_server_format *f, const em_server_usage *usage);
    /* An event of the answer as the reader hands it on (the choice has collected it already). */
    bool (*stream_answer)(void *self, em_buf *out, const em_server_format *f, const em_answer_event *event);
    /* The closing events of the finished answer. */
    bool (*stream_end)(void *self, em_buf *out, const em_server_format *f, const em_server_choice *choice,
                       const em_server_usage *usage);
    /* An engine failure inside a stream that already started (its last events). */
    bool (*stream_error)(void *self, em_buf *out, const em_server_format *f, const em_server_error *err);
    /* The whole response (new reference; NULL when memory ran out). */
    json_t *(*response)(void *self, const em_server_format *f, const em_server_choice *choice,
                        const em_server_usage *usage);
    void (*free)(void *self);
} em_server_writer;

/* Runs a parsed generation request (chat, completions, messages) on the engine (generate.c).
 * Returns the response to queue with *status set, or NULL when the client went away before it was ready
 * (the connection is then closed). `fd` is the client's socket, polled for a hang-up. Takes
 * ownership of `req`'s contents. */
struct MHD_Response *em_server_generate(em_server *server, em_server_request *req, int fd, int *status);
/* The same for an API with its own writer; takes `writer_self` too (freed with writer->free). */
struct MHD_Response *em_server_generate_with(em_server *server, em_server_request *req, const em_server_writer *writer,
                                             void *writer_self, int fd, int *status);

/* ---- The Responses API (responses.c) and Ollama's API (ollama.c), served by http.c's dispatch ---- */
struct MHD_Response *em_responses_serve(em_server *server, const char *body, size_t len, int fd, int *status);
/* Their parsers alone (the fuzz target's entries): a body into `req` as the endpoints read it
 * (`store` for previous_response_id; `engine` for what Ollama's think checks). */
bool em_responses_parse(const char *body, size_t len, em_response_store *store, em_server_request *req,
                        em_server_error *err);
bool em_ollama_parse(bool chat, const char *body, size_t len, const em_server_engine *engine, em_server_request *req,
                     em_server_error *err);
/* An Ollama endpoint at path `url`: `endpoint` picks it; GET endpoints have no body. */
struct MHD_Response *em_ollama_serve(em_server *server, const char *url, em_server_endpoint endpoint, const char *body,
                                     size_t len, int fd, int *status);
/* /v1/embeddings, /api/embed and /api/embeddings (embed.c), `endpoint` and `url` picking which; NULL
 * when the client went away before the answer was ready. */
struct MHD_Response *em_embed_serve(em_server *server, const char *url, em_server_endpoint endpoint, const char *body,
                                    size_t len, int fd, int *status);
/* /tokenize and /detokenize (tokenize.c), as llama.cpp's server has them; errors in OpenAI's format. */
struct MHD_Response *em_tokenize_serve(em_server *server, em_server_endpoint endpoint, const char *body, size_t len,
                                       int *status);

#endif
