/*
 * base — the few things every Ember module shares: the error value, the logger, and two small
 * data structures that several modules need (a growable byte buffer and a binary heap).
 *
 * Errors. A function that can fail returns `em_err`: NULL means success, anything else points
 * to an error that carries a code (what kind of failure) and a message (what went wrong and
 * where: file, byte offset, field, request path). The caller that handles an error owns it and
 * frees it with em_err_free(); a caller that cannot handle it returns it upward unchanged, or
 * wraps it with em_err_prefix() to add context. When even the error cannot be allocated, the
 * functions return a static out-of-memory error that em_err_free() knows not to free, so error
 * paths never fail themselves.
 *
 * Logging. The logger is the only global mutable state in Ember: a level threshold and a sink
 * (stderr by default). Library code logs warnings (for example an unknown pre-tokenizer name);
 * it never prints results or exits the process.
 *
 * Data structures. em_buf is a NUL-terminated byte buffer that grows as text is appended (request
 * bodies, rendered templates, reports); em_heap is a binary heap of fixed-size items under a
 * caller's order (the tokenizers' merge queues, the prefix cache's eviction order). Each owns its
 * memory, which its _free function gives back.
 *
 * This module owns nothing else and depends on nothing but libc.
 */
#ifndef EMBER_BASE_H
#define EMBER_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum em_err_code {
    EM_ERR_INVALID = 1, /* bad argument or bad input from a caller (request, flag, text) */
    EM_ERR_FORMAT,      /* a file or buffer violates its format */
    EM_ERR_IO,          /* the operating system refused a read, write, open or map */
    EM_ERR_NOMEM,       /* an allocation failed (host or device memory) */
    EM_ERR_NOT_FOUND,   /* a named key, tensor, file or token does not exist */
    EM_ERR_TYPE,        /* a value exists but has another type than asked for */
    EM_ERR_UNSUPPORTED, /* valid input that this build does not implement */
    EM_ERR_RANGE,       /* a value outside the range the operation accepts */
    EM_ERR_INTERNAL,    /* a broken invariant: a bug in Ember */
} em_err_code;

typedef struct em_error *em_err;

/* Creates an error with a printf-style message. Never returns NULL (said to the compiler too, so
 * that `if ((err = ...)) return err;` proves the success path to its flow analysis). */
em_err em_errorf(em_err_code code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3), returns_nonnull))
#endif
    ;
em_err em_verrorf(em_err_code code, const char *fmt, va_list args)
#if defined(__GNUC__)
    __attribute__((returns_nonnull))
#endif
    ;

/* Prepends "context: " to the message of `err` and returns it (the same error, or the static
 * out-of-memory error if the longer message cannot be allocated). NULL passes through. */
em_err em_err_prefix(em_err err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

em_err_code em_err_code_of(em_err err);
const char *em_err_message(em_err err); /* "ok" for NULL */
const char *em_err_code_name(em_err_code code);
void em_err_free(em_err err);

/* Logging. */
typedef enum em_log_level { EM_LOG_DEBUG, EM_LOG_INFO, EM_LOG_WARN, EM_LOG_ERROR, EM_LOG_OFF } em_log_level;
typedef void (*em_log_sink)(em_log_level level, const char *message, void *user);

void em_log_set_level(em_log_level level);
/* Replaces the sink; NULL restores the default (stderr). */
void em_log_set_sink(em_log_sink sink, void *user);
void em_log(em_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Line and column (both from 1) of byte `offset` of a text of `len` bytes (offsets past the end
 * count as the end): for errors that point into a source text (templates, grammars). */
void em_text_position(const char *text, size_t len, size_t offset, size_t *line, size_t *column);

/* Overflow-checked size arithmetic: return 0 on success, 1 on overflow (result untouched). */
static inline int em_add_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    if (a > UINT64_MAX - b) return 1;
    *out = a + b;
    return 0;
}
static inline int em_mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return 1;
    *out = a * b;
    return 0;
}

/* A growable byte buffer. Zero-initialized is empty; `data` is malloc'd and NUL-terminated once
 * anything was appended. A failed append (out of memory, or past EM_BUF_MAX: a runaway template
 * or client) sets `failed` and makes every later append a no-op, so a caller may append many
 * pieces and check once. */
#define EM_BUF_MAX ((size_t)1 << 30)
typedef struct em_buf {
    char *data;
    size_t len, cap;
    bool failed; /* an append failed; the contents are incomplete */
} em_buf;

/* Each returns false when the buffer has failed (now or before). */
bool em_buf_append(em_buf *buf, const void *data, size_t len);
bool em_buf_puts(em_buf *buf, const char *text);
bool em_buf_putc(em_buf *buf, char c);
bool em_buf_printf(em_buf *buf, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void em_buf_free(em_buf *buf); /* back to empty (and not failed) */

/* A binary heap of fixed-size items under a caller's order: the top is an item that no other
 * must come out before. Zero-initialized is empty. Every call names the item size and the order
 * (the same ones for the life of the heap), and push and pop are inline: each caller's compiler
 * sees both as constants, so the heap costs what one written for that item type would. */
typedef bool (*em_heap_before)(const void *a, const void *b); /* true: a comes out before b */
typedef struct em_heap {
    unsigned char *items;
    size_t n;          /* items in the heap */
    size_t cap_bytes;
} em_heap;

/* Grows the memory to hold `bytes`; false when out of memory (the heap is unchanged). */
bool em_heap_reserve(em_heap *heap, size_t bytes);
void em_heap_free(em_heap *heap);

/* Copies `item` in; false when out of memory (the heap is unchanged). The hole left by the new
 * last item moves up while the item comes out before the hole's parent. (The array and count are
 * read into locals once: a write through a byte pointer could alias them, so the compiler would
 * otherwise load them again after every move.) */
static inline bool em_heap_push(em_heap *h, const void *item, size_t size, em_heap_before before) {
    if ((h->n + 1) * size > h->cap_bytes && !em_heap_reserve(h, (h->n + 1) * size)) return false;
    unsigned char *items = h->items;
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(item, items + parent * size)) break;
        memcpy(items + i * size, items + parent * size, size);
        i = parent;
    }
    memcpy(items + i * size, item, size);
    return true;
}

/* Copies the top item to `out` and removes it; the heap must not be empty. The last item sinks
 * from the top: it stays past the end while the hole moves down, and is copied in once. */
static inline void em_heap_pop(em_heap *h, void *out, size_t size, em_heap_before before) {
    unsigned char *items = h->items;
    const size_t n = --h->n;
    const unsigned char *last = items + n * size;
    memcpy(out, items, size);
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && before(items + (child + 1) * size, items + child * size)) child++;
        if (!before(items + child * size, last)) break;
        memcpy(items + i * size, items + child * size, size);
        i = child;
    }
    if (n) memcpy(items + i * size, last, size);
}

#endif
