/* Error values and the logger: see base.h. */
#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct em_error {
    em_err_code code;
    char *message;
};

static struct em_error out_of_memory = {EM_ERR_NOMEM, "out of memory while reporting an error"};

em_err em_verrorf(em_err_code code, const char *fmt, va_list args) {
    va_list copy;
    va_copy(copy, args);
    int length = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (length < 0) length = 0;
    struct em_error *err = malloc(sizeof *err);
    char *message = malloc((size_t)length + 1);
    if (!err || !message) {
        free(err);
        free(message);
        return &out_of_memory;
    }
    vsnprintf(message, (size_t)length + 1, fmt, args);
    err->code = code;
    err->message = message;
    return err;
}

em_err em_errorf(em_err_code code, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    em_err err = em_verrorf(code, fmt, args);
    va_end(args);
    return err;
}

em_err em_err_prefix(em_err err, const char *fmt, ...) {
    if (!err || err == &out_of_memory) return err;
    va_list args;
    va_start(args, fmt);
    va_list copy;
    va_copy(copy, args);
    int context_length = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (context_length < 0) context_length = 0;
    size_t old_length = strlen(err->message);
    char *message = malloc((size_t)context_length + 2 + old_length + 1);
    if (!message) {
        va_end(args);
        em_err_free(err);
        return &out_of_memory;
    }
    vsnprintf(message, (size_t)context_length + 1, fmt, args);
    va_end(args);
    memcpy(message + context_length, ": ", 2);
    memcpy(message + context_length + 2, err->message, old_length + 1);
    free(err->message);
    err->message = message;
    return err;
}

em_err_code em_err_code_of(em_err err) { return err ? err->code : 0; }

const char *em_err_message(em_err err) { return err ? err->message : "ok"; }

const char *em_err_code_name(em_err_code code) {
    switch (code) {
    case EM_ERR_INVALID: return "invalid argument";
    case EM_ERR_FORMAT: return "format error";
    case EM_ERR_IO: return "i/o error";
    case EM_ERR_NOMEM: return "out of memory";
    case EM_ERR_NOT_FOUND: return "not found";
    case EM_ERR_TYPE: return "type mismatch";
    case EM_ERR_UNSUPPORTED: return "unsupported";
    case EM_ERR_RANGE: return "out of range";
    case EM_ERR_INTERNAL: return "internal error";
    }
    return "unknown error";
}

void em_err_free(em_err err) {
    if (!err || err == &out_of_memory) return;
    free(err->message);
    free(err);
}

/* The logger: the one piece of global mutable state (STYLE.md). */
static em_log_level log_threshold = EM_LOG_INFO;
static em_log_sink log_sink = NULL;
static void *log_user = NULL;

void em_log_set_level(em_log_level level) { log_threshold = level; }

void em_log_set_sink(em_log_sink sink, void *user) {
    log_sink = sink;
    log_user = user;
}

void em_log(em_log_level level, const char *fmt, ...) {
    if (level < log_threshold || level >= EM_LOG_OFF) return;
    char message[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    if (log_sink) {
        log_sink(level, message, log_user);
        return;
    }
    static const char *names[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "ember: %s: %s\n", names[level], message);
}

void em_text_position(const char *text, size_t len, size_t offset, size_t *line, size_t *column) {
    size_t l = 1, c = 1;
    if (offset > len) offset = len;
    for (size_t i = 0; i < offset; i++) {
        if (text[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *column = c;
}
