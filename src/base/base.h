/*
 * base — the few things every Ember module shares: the error value and the logger.
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
 * This module owns nothing else and depends on nothing but libc.
 */
#ifndef EMBER_BASE_H
#define EMBER_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

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

#endif
