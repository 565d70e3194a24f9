/* The HTTP side: a libmicrohttpd daemon with one thread per connection (so a thread may wait on
 * its own engine request without holding up anyone else), routing, the API-key check, the body
 * size limit, and the small endpoints (/health, /metrics, /v1/models, count_tokens, the chat page's
 * files at / from web.c). With a key, only /health, /metrics and the page's files answer without it.
 *
 * A request is judged as early as possible: key, path, method and Content-Length are checked
 * when the headers arrive, so a rejected upload is never read. Every rejection is an error body
 * in the format of the API the path belongs to (Anthropic for /v1/messages*, Ollama for paths
 * under /api/, OpenAI otherwise). The Responses API, Ollama's endpoints, /tokenize, /detokenize and
 * the embeddings (/v1/embeddings, /api/embed) are served by responses.c, ollama.c, tokenize.c and
 * embed.c; paths under /api/ need the API key as those
 * under /v1/ do. A second port (--ollama-port) is a second daemon on the same handler and state. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "web_assets.h"

typedef struct connection {
    em_server_endpoint endpoint;
    em_server_api api; /* which API's error format this path answers in */
    const char *method; /* the one its route takes (a 405's Allow), NULL for an unknown path */
    bool responded;
    bool too_large;
    em_buf body;
    em_access_record access; /* the access log's line, written when the request ends */
    struct timespec arrived;  /* when its headers were in (monotonic), for the duration */
} connection;

_Thread_local em_access_record *em_access_current;

static enum MHD_Result queue(struct MHD_Connection *c, em_server *s, connection *ctx, int status,
                             struct MHD_Response *r) {
    ctx->responded = true;
    if (!r) {
        /* the client is gone (or memory ran out): close the connection; counted as nginx's 499,
         * "client closed request" */
        em_server_metrics_count(&s->metrics, ctx->endpoint, 499);
        return MHD_NO;
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    em_server_metrics_count(&s->metrics, ctx->endpoint, status);
    ctx->access.status = status;
    return ret;
}

static enum MHD_Result queue_error(struct MHD_Connection *c, em_server *s, connection *ctx, const em_server_error *err) {
    struct MHD_Response *r = em_server_error_response(ctx->api, err);
    if (r && err->status == 405 && ctx->method) MHD_add_response_header(r, "Allow", ctx->method);
    return queue(c, s, ctx, err->status, r);
}

/* ---- The access log ---- */

/* The record's request side, filled as the headers arrive. */
static void start_record(struct MHD_Connection *c, connection *ctx, const char *url, const char *method) {
    em_access_record *r = &ctx->access;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    clock_gettime(CLOCK_MONOTONIC, &ctx->arrived);
    r->time_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    r->prompt_tokens = r->completion_tokens = -1;
    snprintf(r->method, sizeof r->method, "%s", method ? method : "-");
    snprintf(r->path, sizeof r->path, "%s", url ? url : "-");
    snprintf(r->client, sizeof r->client, "-");
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *addr = info ? info->client_addr : NULL;
    if (addr && addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)addr)->sin_addr, r->client, sizeof r->client);
    else if (addr && addr->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)addr)->sin6_addr, r->client, sizeof r->client);
}

/* Writes the finished request's line in one call, so that lines of concurrent requests never
 * interleave. An answer that did not reach its end (the client hung up, the server stopped) is
 * logged as nginx's 499, "client closed request", whatever status its head carried. */
static void write_record(const em_server *s, connection *ctx, enum MHD_RequestTerminationCode code) {
    em_access_record *r = &ctx->access;
    if (code != MHD_REQUEST_TERMINATED_COMPLETED_OK || !r->status) r->status = 499;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    r->duration_ms = (double)(now.tv_sec - ctx->arrived.tv_sec) * 1e3 + (double)(now.tv_nsec - ctx->arrived.tv_nsec) / 1e6;
    char line[1024];
    size_t n = em_access_log_line(s->access_log, r, line, sizeof line);
    fwrite(line, 1, n, stderr);
}

/* ---- Routing ---- */

typedef struct route {
    const char *path;
    const char *method;
    em_server_endpoint endpoint;
    em_server_api api;
} route;

static const route routes[] = {
    {"/v1/chat/completions", "POST", EM_EP_CHAT, EM_API_OPENAI_CHAT},
    {"/v1/completions", "POST", EM_EP_COMPLETIONS, EM_API_OPENAI_COMPLETIONS},
    {"/v1/messages", "POST", EM_EP_MESSAGES, EM_API_ANTHROPIC_MESSAGES},
    {"/v1/messages/count_tokens", "POST", EM_EP_COUNT_TOKENS, EM_API_ANTHROPIC_COUNT},
    {"/v1/models", "GET", EM_EP_MODELS, EM_API_OPENAI_CHAT},
    {"/health", "GET", EM_EP_HEALTH, EM_API_OPENAI_CHAT},
    {"/metrics", "GET", EM_EP_METRICS, EM_API_OPENAI_CHAT},
    {"/", "GET", EM_EP_PAGE, EM_API_OPENAI_CHAT}, /* and every other file of the chat page */
    {"/v1/responses", "POST", EM_EP_RESPONSES, EM_API_OPENAI_RESPONSES},
    {"/responses", "POST", EM_EP_RESPONSES, EM_API_OPENAI_RESPONSES},
    {"/api/chat", "POST", EM_EP_OLLAMA_CHAT, EM_API_OLLAMA},
    {"/api/generate", "POST", EM_EP_OLLAMA_GENERATE, EM_API_OLLAMA},
    {"/api/tags", "GET", EM_EP_OLLAMA_TAGS, EM_API_OLLAMA},
    {"/api/show", "POST", EM_EP_OLLAMA_SHOW, EM_API_OLLAMA},
    {"/api/ps", "GET", EM_EP_OLLAMA_PS, EM_API_OLLAMA},
    {"/api/version", "GET", EM_EP_OLLAMA_VERSION, EM_API_OLLAMA},
    {"/api/embed", "POST", EM_EP_OLLAMA_EMBED, EM_API_OLLAMA},
    {"/api/embeddings", "POST", EM_EP_OLLAMA_EMBED, EM_API_OLLAMA},
    {"/api/pull", "POST", EM_EP_OLLAMA_MANAGE, EM_API_OLLAMA},
    {"/api/push", "POST", EM_EP_OLLAMA_MANAGE, EM_API_OLLAMA},
    {"/api/create", "POST", EM_EP_OLLAMA_MANAGE, EM_API_OLLAMA},
    {"/api/copy", "POST", EM_EP_OLLAMA_MANAGE, EM_API_OLLAMA},
    {"/api/delete", "DELETE", EM_EP_OLLAMA_MANAGE, EM_API_OLLAMA},
    {"/tokenize", "POST", EM_EP_TOKENIZE, EM_API_OPENAI_CHAT},
    {"/detokenize", "POST", EM_EP_DETOKENIZE, EM_API_OPENAI_CHAT},
    {"/v1/embeddings", "POST", EM_EP_EMBEDDINGS, EM_API_OPENAI_CHAT},
};

/* Finds the route of `url`; NULL for an unknown path. /v1/models/{id} routes to /v1/models, the
 * chat page's files to "/". */
static const route *find_route(const char *url) {
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path) || (routes[i].endpoint == EM_EP_PAGE && em_web_asset_find(url)))
            return &routes[i];
    if (strncmp(url, "/v1/models/", 11) || !url[11]) return NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (routes[i].endpoint == EM_EP_MODELS) return &routes[i];
    return NULL;
}

static bool wants_anthropic(struct MHD_Connection *c) {
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, "anthropic-version") != NULL;
}

static bool authorized(struct MHD_Connection *c, const em_server *s) {
    if (!s->api_key) return true;
    const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (key && em_server_key_matches(s->api_key, key)) return true;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return auth && !strncasecmp(auth, "Bearer ", 7) && em_server_key_matches(s->api_key, auth + 7);
}

/* ---- Framing: what libmicrohttpd accepts and HTTP/1.1 does not ----
 * libmicrohttpd itself refuses a Content-Length that is not a number (400, its own body; 0.9.75
 * writes that response's head twice, before any callback of ours could step in) and reads chunked
 * bodies. It takes the first of several Content-Length headers and ignores the others, reads any
 * other Transfer-Encoding as a body of unknown length that ends when the client closes (a request
 * smuggling vector and a connection held open), and serves HTTP/1.1 requests without Host. These
 * are judged here, before anything else, as the headers arrive. */

typedef struct framing {
    int content_lengths;     /* Content-Length headers */
    int transfer_encodings;  /* Transfer-Encoding headers */
    const char *encoding;    /* the last one's value */
} framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    framing *f = cls;
    if (!strcasecmp(key, "Content-Length")) f->content_lengths++;
    if (!strcasecmp(key, "Transfer-Encoding")) {
        f->transfer_encodings++;
        f->encoding = value ? value : "";
    }
    return MHD_YES;
}

/* Sets `err` when the request's framing is ambiguous (400) or an encoding this server cannot read
 * (501). */
static void check_framing(struct MHD_Connection *c, const char *version, em_server_error *err) {
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    if (!strcmp(version, MHD_HTTP_VERSION_1_1) && !MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"))
        em_server_error_set(err, 400, NULL, "invalid_request", NULL, "an HTTP/1.1 request needs a Host header");
    else if (f.content_lengths > 1)
        em_server_error_set(err, 400, NULL, "invalid_request", NULL,
                            "the request has %d Content-Length headers; send one", f.content_lengths);
    else if (f.transfer_encodings > 1)
        em_server_error_set(err, 400, NULL, "invalid_request", NULL,
                            "the request has %d Transfer-Encoding headers; send one", f.transfer_encodings);
    else if (f.transfer_encodings && f.content_lengths)
        em_server_error_set(err, 400, NULL, "invalid_request", NULL,
                            "the request has both Content-Length and Transfer-Encoding; send one");
    else if (f.transfer_encodings && strcasecmp(f.encoding, "chunked"))
        em_server_error_set(err, 501, NULL, "unsupported_transfer_encoding", NULL,
                            "Transfer-Encoding '%.64s' is not supported: send the body as it is, or chunked",
                            f.encoding);
}

/* The paths anyone may read, key or not: /health (load balancers and orchestrators probe it
 * without credentials, as llama-server's), /metrics and the chat page's files (which hold nothing
 * secret; the page asks for the key). */
static bool is_public(const route *r) {
    return r && (r->endpoint == EM_EP_HEALTH || r->endpoint == EM_EP_METRICS || r->endpoint == EM_EP_PAGE);
}

/* Checks done as soon as the headers are in. Returns true when a response was queued. The key comes
 * before routing: a client without it gets a 401 for every path but the public ones, so it learns
 * nothing of which routes and methods exist. */
static bool reject_early(struct MHD_Connection *c, em_server *s, connection *ctx, const char *url,
                         const char *method, const char *version, enum MHD_Result *ret) {
    em_server_error err = {0};
    const route *r = find_route(url);
    ctx->endpoint = r ? r->endpoint : EM_EP_OTHER;
    ctx->method = r ? r->method : NULL;
    ctx->api = r                                 ? r->api
               : !strncmp(url, "/v1/messages", 12) ? EM_API_ANTHROPIC_MESSAGES
               : !strncmp(url, "/api/", 5)         ? EM_API_OLLAMA
                                                   : EM_API_OPENAI_CHAT;
    if (ctx->endpoint == EM_EP_MODELS && wants_anthropic(c)) ctx->api = EM_API_ANTHROPIC_MESSAGES;
    check_framing(c, version, &err);
    if (err.status) {
        /* answered in the format of the path's API, but before the key: it says nothing of routes */
    } else if (!is_public(r) && !authorized(c, s)) {
        bool given = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key") ||
                     MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        em_server_error_set(&err, 401, NULL, "invalid_api_key", NULL,
                            given ? "invalid API key" : "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
    } else if (!r) {
        em_server_error_set(&err, 404, NULL, "unknown_url", NULL, "unknown path: %s %s", method, url);
    } else if (strcmp(method, r->method) && !(!strcmp(r->method, "GET") && !strcmp(method, "HEAD"))) {
        em_server_error_set(&err, 405, NULL, "method_not_allowed", NULL, "%s %s: method not allowed (use %s)", method,
                            url, r->method);
    } else {
        const char *length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (length && strtoull(length, NULL, 10) > s->max_body)
            em_server_error_set(&err, 413, NULL, "request_too_large", NULL,
                                "the body has %s bytes; this server accepts at most %zu (--max-body)", length,
                                s->max_body);
    }
    if (!err.status) return false;
    *ret = queue_error(c, s, ctx, &err);
    return true;
}

/* ---- Endpoints ---- */

static enum MHD_Result serve_models(struct MHD_Connection *c, em_server *s, connection *ctx, const char *url) {
    const char *id = s->engine.model_id;
    json_t *list = ctx->api == EM_API_ANTHROPIC_MESSAGES ? em_anthropic_models_json(id, s->started)
                                                          : em_openai_models_json(id, s->started);
    if (strncmp(url, "/v1/models/", 11)) return queue(c, s, ctx, 200, em_server_json_response(list));
    /* One model: the list's only entry. Generation requests may name any model (they get this
     * one), but a lookup by id answers only for the id that is served, as the list says. */
    json_t *model = json_incref(json_array_get(json_object_get(list, "data"), 0));
    json_decref(list);
    if (strcmp(url + 11, id)) {
        json_decref(model);
        em_server_error err = {0};
        em_server_error_set(&err, 404, NULL, "model_not_found", "model", "The model '%s' does not exist", url + 11);
        return queue_error(c, s, ctx, &err);
    }
    return queue(c, s, ctx, 200, em_server_json_response(model));
}

static enum MHD_Result serve_metrics(struct MHD_Connection *c, em_server *s, connection *ctx) {
    ember_stats stats;
    memset(&stats, 0, sizeof stats);
    s->engine.stats(s->engine.self, &stats);
    em_grammar_cache_stats grammars;
    em_grammar_cache_stats_get(s->grammars, &grammars);
    char *text = em_server_metrics_text(&s->metrics, &stats, &grammars);
    if (!text) return queue(c, s, ctx, 500, NULL);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) free(text);
    else MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    return queue(c, s, ctx, 200, r);
}

static enum MHD_Result serve_count_tokens(struct MHD_Connection *c, em_server *s, connection *ctx,
                                          em_server_request *req) {
    int32_t *ids = NULL;
    size_t n = 0;
    em_err e = em_server_chat_prompt(&s->engine, req, &ids, &n, NULL);
    free(ids);
    if (e) {
        em_server_error err = {0};
        em_server_error_set(&err, em_err_code_of(e) == EM_ERR_NOMEM ? 503 : 400, NULL, NULL, "messages", "messages: %s",
                            em_err_message(e));
        em_err_free(e);
        return queue_error(c, s, ctx, &err);
    }
    return queue(c, s, ctx, 200, em_server_json_response(json_pack("{s:I}", "input_tokens", (json_int_t)n)));
}

static int connection_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info ? info->connect_fd : -1;
}

static enum MHD_Result dispatch(struct MHD_Connection *c, em_server *s, connection *ctx, const char *url) {
    switch (ctx->endpoint) {
    case EM_EP_HEALTH:
        return queue(c, s, ctx, 200,
                     em_server_json_response(json_pack("{s:s, s:s}", "status", "ok", "model", s->engine.model_id)));
    case EM_EP_METRICS: return serve_metrics(c, s, ctx);
    case EM_EP_MODELS: return serve_models(c, s, ctx, url);
    case EM_EP_PAGE: return queue(c, s, ctx, 200, em_server_asset_response(url));
    default: break;
    }
    if (ctx->endpoint == EM_EP_EMBEDDINGS || ctx->endpoint == EM_EP_OLLAMA_EMBED) { /* embed.c */
        int status = 500;
        struct MHD_Response *r =
            em_embed_serve(s, url, ctx->endpoint, ctx->body.data ? ctx->body.data : "", ctx->body.len, connection_fd(c), &status);
        em_buf_free(&ctx->body);
        return queue(c, s, ctx, status, r);
    }
    if (ctx->endpoint >= EM_EP_RESPONSES && ctx->endpoint <= EM_EP_DETOKENIZE) { /* responses.c, ollama.c, tokenize.c */
        int status = 500;
        const char *data = ctx->body.data ? ctx->body.data : "";
        struct MHD_Response *r =
            ctx->endpoint == EM_EP_RESPONSES ? em_responses_serve(s, data, ctx->body.len, connection_fd(c), &status)
            : ctx->endpoint >= EM_EP_TOKENIZE
                ? em_tokenize_serve(s, ctx->endpoint, data, ctx->body.len, &status)
                : em_ollama_serve(s, url, ctx->endpoint, data, ctx->body.len, connection_fd(c), &status);
        em_buf_free(&ctx->body);
        return queue(c, s, ctx, status, r);
    }
    em_server_request req;
    em_server_error err = {0};
    const char *body = ctx->body.data ? ctx->body.data : "";
    bool ok;
    switch (ctx->endpoint) {
    case EM_EP_CHAT: ok = em_openai_parse_chat(body, ctx->body.len, s->engine.n_vocab, &req, &err); break;
    case EM_EP_COMPLETIONS: ok = em_openai_parse_completions(body, ctx->body.len, s->engine.n_vocab, &req, &err); break;
    case EM_EP_MESSAGES: ok = em_anthropic_parse_messages(body, ctx->body.len, &req, &err); break;
    default: ok = em_anthropic_parse_count_tokens(body, ctx->body.len, &req, &err); break;
    }
    em_buf_free(&ctx->body); /* the request holds copies of what it needs */
    if (!ok) {
        em_server_request_clear(&req);
        return queue_error(c, s, ctx, &err);
    }
    if (ctx->endpoint == EM_EP_COUNT_TOKENS) {
        enum MHD_Result ret = serve_count_tokens(c, s, ctx, &req);
        em_server_request_clear(&req);
        return ret;
    }
    int status = 500;
    struct MHD_Response *r = em_server_generate(s, &req, connection_fd(c), &status);
    return queue(c, s, ctx, status, r);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    em_server *s = cls;
    connection *ctx = *con_cls;
    if (!ctx) {
        if (!(ctx = calloc(1, sizeof *ctx))) return MHD_NO;
        *con_cls = ctx;
        start_record(c, ctx, url, method);
        enum MHD_Result ret;
        if (reject_early(c, s, ctx, url, method, version, &ret)) {
            em_guard_enter(&s->guard, c, EM_GUARD_SERVING);
            return ret;
        }
        em_guard_enter(&s->guard, c, EM_GUARD_BODY);
        return MHD_YES;
    }
    if (ctx->responded) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        /* A body sent without Content-Length (chunked) is counted as it comes. */
        if (!ctx->too_large && ctx->body.len + *upload_data_size > s->max_body) {
            ctx->too_large = true;
            em_buf_free(&ctx->body);
        }
        if (!ctx->too_large && !em_buf_append(&ctx->body, upload_data, *upload_data_size)) return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    em_guard_enter(&s->guard, c, EM_GUARD_SERVING);
    if (ctx->too_large) {
        em_server_error err = {0};
        em_server_error_set(&err, 413, NULL, "request_too_large", NULL,
                            "the body is larger than this server accepts (%zu bytes, --max-body)", s->max_body);
        return queue_error(c, s, ctx, &err);
    }
    em_access_current = &ctx->access;
    enum MHD_Result ret = dispatch(c, s, ctx, url);
    em_access_current = NULL;
    return ret;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode code) {
    em_server *s = cls;
    em_guard_enter(&s->guard, c, EM_GUARD_HEADERS); /* kept alive: the next request's headers are due */
    connection *ctx = *con_cls;
    if (!ctx) return;
    if (s->access_log) write_record(s, ctx, code);
    em_buf_free(&ctx->body);
    free(ctx);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list args) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, args);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    /* MHD reports every deliberate close (a client hung up, the server is stopping) in one of these
     * two ways: not worth a warning */
    bool expected = strstr(line, "Application reported internal error") ||
                    strstr(line, "application error generating response");
    em_log(expected ? EM_LOG_DEBUG : EM_LOG_WARN, "http: %s", line);
}

/* ---- Start and stop ---- */

/* The compiled grammars kept: an agent's tools, schemas and their GBNF; few, some large. */
#define GRAMMAR_CACHE_ENTRIES 256
#define GRAMMAR_CACHE_BYTES ((size_t)256 << 20)

/* A daemon serving every route on host:port (0: a free port), its port in *bound. Both of a
 * server's daemons share its state: handlers, guard, metrics and engine. */
static em_err listen_on(em_server *s, const char *host, int port, unsigned max_connections, unsigned per_client,
                        struct MHD_Daemon **daemon, int *bound) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *addr = NULL;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    int rc = getaddrinfo(host, port_text, &hints, &addr);
    if (rc != 0 || !addr) return em_errorf(EM_ERR_INVALID, "cannot resolve host '%s': %s", host, gai_strerror(rc));
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    if (addr->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* The idle timeout stays long: a connection being served may wait minutes for the engine, and
     * the guard (guard.c) bounds the time to send a request. */
    *daemon = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, handle, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                               MHD_OPTION_SOCK_ADDR, addr->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                               MHD_OPTION_NOTIFY_CONNECTION, em_guard_notify, &s->guard, MHD_OPTION_CONNECTION_LIMIT,
                               max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_client,
                               MHD_OPTION_CONNECTION_TIMEOUT, 600u, MHD_OPTION_END);
    freeaddrinfo(addr);
    if (!*daemon) return em_errorf(EM_ERR_IO, "cannot listen on %s:%d (address in use or not available)", host, port);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(*daemon, MHD_DAEMON_INFO_BIND_PORT);
    *bound = info ? info->port : port;
    return NULL;
}

em_err em_server_check_port(const char *host, int port) {
    if (port <= 0) return NULL; /* 0: any free port will do */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *addr = NULL;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    int rc = getaddrinfo(host ? host : "127.0.0.1", port_text, &hints, &addr);
    if (rc != 0 || !addr)
        return em_errorf(EM_ERR_INVALID, "cannot resolve host '%s': %s", host ? host : "127.0.0.1", gai_strerror(rc));
    int fd = socket(addr->ai_family, addr->ai_socktype, addr->ai_protocol);
    em_err err = NULL;
    if (fd < 0) {
        err = em_errorf(EM_ERR_IO, "cannot open a socket for %s:%d: %s", host, port, strerror(errno));
    } else {
        /* as the daemon binds: a port whose old connections linger in TIME_WAIT is free */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, addr->ai_addr, addr->ai_addrlen) != 0)
            err = em_errorf(EM_ERR_IO, "cannot listen on %s:%d: %s%s", host ? host : "127.0.0.1", port, strerror(errno),
                            errno == EADDRINUSE ? " (another program is serving there; pick another --port)" : "");
        close(fd);
    }
    freeaddrinfo(addr);
    return err;
}

em_err em_server_start(const em_server_options *options, const em_server_engine *engine, em_server **out) {
    *out = NULL;
    const char *host = options->host ? options->host : "127.0.0.1";
    if (options->port < 0 || options->port > 65535)
        return em_errorf(EM_ERR_RANGE, "port %d is not in 0..65535", options->port);
    if (options->ollama_port < 0 || options->ollama_port > 65535)
        return em_errorf(EM_ERR_RANGE, "the Ollama port %d is not in 1..65535 (0: none)", options->ollama_port);

    em_server *s = calloc(1, sizeof *s);
    if (!s) return em_errorf(EM_ERR_NOMEM, "out of memory starting the server");
    s->engine = *engine;
    s->max_body = options->max_body ? options->max_body : (size_t)4 << 20;
    s->started = (int64_t)time(NULL);
    if (getrandom(&s->salt, sizeof s->salt, 0) != (ssize_t)sizeof s->salt) s->salt = (uint32_t)time(NULL);
    atomic_init(&s->next_id, 1);
    atomic_init(&s->stopping, false);
    em_server_metrics_init(&s->metrics);
    s->access_log = options->access_log;
    if (options->api_key && !options->api_key[0]) {
        em_server_stop(s);
        return em_errorf(EM_ERR_INVALID, "the API key is empty: give a key, or none to serve without one");
    }
    s->grammar_seconds = options->grammar_seconds > 0 ? options->grammar_seconds : 1.0;
    s->matryoshka = options->matryoshka;
    em_err grammar_err = em_grammar_cache_new(GRAMMAR_CACHE_ENTRIES, GRAMMAR_CACHE_BYTES, &s->grammars);
    if (grammar_err) {
        em_server_stop(s);
        return grammar_err;
    }
    if (!(s->responses = em_response_store_new(0, 0))) {
        em_server_stop(s);
        return em_errorf(EM_ERR_NOMEM, "out of memory starting the server");
    }
    if (options->api_key && !(s->api_key = strdup(options->api_key))) {
        em_server_stop(s);
        return em_errorf(EM_ERR_NOMEM, "out of memory starting the server");
    }
    int max_connections = options->max_connections > 0 ? options->max_connections : 512;
    int per_client = options->max_client_connections > 0 ? options->max_client_connections
                                                         : (max_connections + 1) / 2;
    em_guard_options guard = {
        .header_seconds = options->header_seconds > 0 ? options->header_seconds : 10,
        .body_seconds = options->body_seconds > 0 ? options->body_seconds : 30,
        .receiving_per_client = options->receiving_per_client > 0 ? options->receiving_per_client : 64,
        .receiving_total = max_connections / 2,
    };
    em_err e = em_guard_start(&s->guard, &guard);
    if (e) {
        em_server_stop(s);
        return e;
    }
    e = listen_on(s, host, options->port, (unsigned)max_connections, (unsigned)per_client, &s->daemon, &s->port);
    if (!e && options->ollama_port)
        e = listen_on(s, host, options->ollama_port, (unsigned)max_connections, (unsigned)per_client, &s->ollama_daemon,
                      &s->ollama_port);
    if (e) {
        em_server_stop(s);
        return e;
    }
    *out = s;
    return NULL;
}

int em_server_port(const em_server *server) {
    return server->port;
}

int em_server_ollama_port(const em_server *server) {
    return server->ollama_daemon ? server->ollama_port : 0;
}

void em_server_stop(em_server *server) {
    if (!server) return;
    atomic_store(&server->stopping, true);
    if (server->daemon) MHD_stop_daemon(server->daemon);
    if (server->ollama_daemon) MHD_stop_daemon(server->ollama_daemon);
    em_guard_stop(&server->guard);
    em_server_metrics_destroy(&server->metrics);
    em_response_store_free(server->responses);
    em_grammar_cache_free(server->grammars);
    free(server->api_key);
    free(server);
}
