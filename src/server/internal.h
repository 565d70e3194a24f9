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
bool em_server_read_string(const json_t *obj, const char *key, const char **out, em_server_error *err);
bool em_server_read_stops(const json_t *obj, const char *key, bool allow_string, em_server_request *req,
                          em_server_error *err);
/* Message content (string or text blocks) appended to `text`. */
bool em_server_read_content(const json_t *content, const char *param, em_buf *text, em_server_error *err);
bool em_server_add_message(em_server_request *req, const char *role, const em_buf *text, em_server_error *err);

/* A value JSON can hold: NaN and infinities (a banned token's logprob) become -9999, as OpenAI
 * reports them. */
double em_server_finite(double x);

void em_server_token_from(em_server_token *dst, const ember_token_out *src);

/* Writes one SSE event: optional `event:` line, then `data: <json>` and a blank line. */
bool em_server_sse(em_buf *out, const char *event, const json_t *data);

/* ---- Shared by http.c and generate.c ---- */

#include <microhttpd.h>
#include <stdatomic.h>

struct em_server {
    struct MHD_Daemon *daemon;
    em_server_backend backend;
    char *api_key;
    size_t max_body;
    int port;
    int64_t started;           /* seconds since the epoch, for `created` of the model list */
    uint32_t salt;             /* random per process: response ids and default seeds differ per run */
    atomic_uint_fast64_t next_id;
    atomic_bool stopping;      /* waiting threads give up their requests */
    em_server_metrics metrics;
};

/* A JSON response (takes the body's reference) or an error response in `api`'s format. */
struct MHD_Response *em_server_json_response(json_t *body);
struct MHD_Response *em_server_error_response(em_server_api api, const em_server_error *err);
/* The chat page's file at `url` (web.c), NULL when there is none or memory ran out. */
struct MHD_Response *em_server_asset_response(const char *url);

/* Runs a parsed generation request (chat, completions, messages) on the backend. Returns the
 * response to queue with *status set, or NULL when the client went away before it was ready
 * (the connection is then closed). `fd` is the client's socket, polled for a hang-up. Takes
 * ownership of `req`'s contents. */
struct MHD_Response *em_server_generate(em_server *server, em_server_request *req, int fd, int *status);

/* True when the peer closed its end of `fd` (checked without blocking). */
bool em_server_peer_gone(int fd);

#endif
