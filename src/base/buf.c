/* The growable byte buffer of base.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

/* Room for `extra` more bytes and the NUL; false (and failed) when it cannot be had. */
static bool reserve(em_buf *buf, size_t extra) {
    if (buf->failed) return false;
    if (extra < buf->cap - buf->len) return true; /* cap - len > extra: room for the NUL too */
    if (extra >= EM_BUF_MAX - buf->len) {
        buf->failed = true;
        return false;
    }
    size_t cap = buf->cap ? buf->cap : 256;
    while (cap - buf->len <= extra) cap *= 2;
    char *grown = realloc(buf->data, cap);
    if (!grown) {
        buf->failed = true;
        return false;
    }
    buf->data = grown;
    buf->cap = cap;
    return true;
}

bool em_buf_append(em_buf *buf, const void *data, size_t len) {
    if (!reserve(buf, len)) return false;
    if (len) memcpy(buf->data + buf->len, data, len);
    buf->len += len;
    buf->data[buf->len] = 0;
    return true;
}

bool em_buf_puts(em_buf *buf, const char *text) { return em_buf_append(buf, text, strlen(text)); }

bool em_buf_putc(em_buf *buf, char c) { return em_buf_append(buf, &c, 1); }

bool em_buf_printf(em_buf *buf, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(NULL, 0, fmt, args);
    va_end(args);
    if (n < 0) buf->failed = true;
    if (n < 0 || !reserve(buf, (size_t)n)) return false;
    va_start(args, fmt);
    vsnprintf(buf->data + buf->len, (size_t)n + 1, fmt, args);
    va_end(args);
    buf->len += (size_t)n;
    return true;
}

void em_buf_free(em_buf *buf) {
    free(buf->data);
    *buf = (em_buf){0};
}
