/* Bodies as libmicrohttpd responses: the JSON responses and error bodies that the HTTP side
 * (http.c) and generation (generate.c) both send. Kept apart from both so that the HTTP side calls
 * generation and never the other way round. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A JSON response that takes `text` (malloc'd), or NULL (text freed) when MHD has no memory. */
static struct MHD_Response *json_text_response(char *text) {
    if (!text) return NULL;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return NULL;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    return r;
}

struct MHD_Response *em_server_json_response(json_t *body) {
    char *text = body ? em_server_dump(body) : NULL;
    json_decref(body);
    return json_text_response(text);
}

struct MHD_Response *em_server_error_response(em_server_api api, const em_server_error *err) {
    return json_text_response(em_server_error_body(api, err));
}
