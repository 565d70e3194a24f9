/* A minimal HTTP/1.1 client for the server's tests (one request per connection, cmocka
 * assertions on what must hold) and helpers to read JSON answers. */
#ifndef EMBER_TEST_HTTP_CLIENT_H
#define EMBER_TEST_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "base/base.h"

typedef struct http_result {
    int status;
    char *head; /* status line and headers */
    char *body; /* de-chunked */
    size_t body_len;
} http_result;

static inline int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    return fd;
}

static inline void send_all(int fd, const char *data, size_t len) {
    while (len) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n <= 0) return; /* the server may close early (413, 401): what it sent is still read */
        data += n;
        len -= (size_t)n;
    }
}

static inline void send_request(int fd, const char *method, const char *path, const char *headers, const char *body) {
    em_buf req = {0};
    em_buf_printf(&req, "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n%s", method, path, headers ? headers : "");
    if (body) em_buf_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n", strlen(body));
    em_buf_printf(&req, "\r\n%s", body ? body : "");
    send_all(fd, req.data, req.len);
    em_buf_free(&req);
}

static inline http_result parse_response(em_buf *raw) {
    http_result r = {0};
    char *end = raw->data ? strstr(raw->data, "\r\n\r\n") : NULL;
    if (!end) fail_msg("no complete response head: '%s'", raw->data ? raw->data : "");
    r.head = strndup(raw->data, (size_t)(end - raw->data));
    r.status = atoi(raw->data + 9);
    const char *p = end + 4;
    size_t left = raw->len - (size_t)(p - raw->data);
    em_buf body = {0};
    if (strcasestr(r.head, "Transfer-Encoding: chunked")) {
        for (;;) {
            char *line_end = strstr(p, "\r\n");
            assert_non_null(line_end);
            size_t n = strtoul(p, NULL, 16);
            p = line_end + 2;
            if (n == 0) break;
            em_buf_append(&body, p, n);
            p += n + 2;
        }
    } else {
        em_buf_append(&body, p, left);
    }
    r.body = body.data ? body.data : strdup("");
    r.body_len = body.len;
    return r;
}

/* The whole answer on fd until the server closes it, parsed; fd is closed. */
static inline http_result http_read_all(int fd) {
    em_buf raw = {0};
    char chunk[4096];
    ssize_t n;
    while ((n = recv(fd, chunk, sizeof chunk, 0)) > 0) em_buf_append(&raw, chunk, (size_t)n);
    close(fd);
    http_result r = parse_response(&raw);
    em_buf_free(&raw);
    return r;
}

static inline http_result http(int port, const char *method, const char *path, const char *headers, const char *body) {
    int fd = connect_to(port);
    send_request(fd, method, path, headers, body);
    return http_read_all(fd);
}

static inline void http_free(http_result *r) {
    free(r->head);
    free(r->body);
}

static inline json_t *body_json(const http_result *r) {
    json_t *v = json_loadb(r->body, r->body_len, 0, NULL);
    if (!v) fail_msg("body is not JSON: %s", r->body);
    return v;
}

/* The value at a path like "choices.0.message.content". */
static inline json_t *at(json_t *v, const char *path) {
    char copy[256];
    snprintf(copy, sizeof copy, "%s", path);
    for (char *save = NULL, *key = strtok_r(copy, ".", &save); key && v; key = strtok_r(NULL, ".", &save))
        v = json_is_array(v) ? json_array_get(v, strtoul(key, NULL, 10)) : json_object_get(v, key);
    if (!v) fail_msg("no value at %s", path);
    return v;
}

static inline const char *str_at(json_t *v, const char *path) {
    json_t *s = at(v, path);
    if (!json_is_string(s)) fail_msg("%s is not a string", path);
    return json_string_value(s);
}

static inline long long int_at(json_t *v, const char *path) {
    json_t *i = at(v, path);
    if (!json_is_integer(i)) fail_msg("%s is not an integer", path);
    return json_integer_value(i);
}

/* Splits an SSE body into its events' data lines (and event names, when asked). */
static inline size_t sse_events(const char *body, char **data, char **names, size_t max) {
    size_t n = 0;
    const char *p = body;
    while (*p && n < max) {
        const char *end = strstr(p, "\n\n");
        if (!end) fail_msg("unterminated SSE event: '%s'", p);
        char *event = strndup(p, (size_t)(end - p));
        char *name = NULL, *d = NULL;
        for (char *save = NULL, *line = strtok_r(event, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            if (!strncmp(line, "event: ", 7)) name = strdup(line + 7);
            else if (!strncmp(line, "data: ", 6)) d = strdup(line + 6);
            else fail_msg("unexpected SSE line '%s'", line);
        }
        free(event);
        if (!d) fail_msg("SSE event without data");
        data[n] = d;
        if (names) names[n] = name;
        else free(name);
        n++;
        p = end + 2;
    }
    return n;
}

#endif
