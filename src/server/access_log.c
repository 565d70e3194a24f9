/* The access log's lines (server.h): what an operator greps or a log collector parses, one line per
 * request. The text form is for people and grep; the JSON form for collectors. A request's path
 * is the client's text, decoded: in text lines its quotes, backslashes and control bytes are
 * written as \xNN, so a path cannot forge a second line or end the quoted field early; JSON
 * escapes them itself. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

bool em_access_log_format_parse(const char *name, em_access_log_format *out) {
    if (!strcmp(name, "text")) *out = EM_ACCESS_LOG_TEXT;
    else if (!strcmp(name, "json")) *out = EM_ACCESS_LOG_JSON;
    else return false;
    return true;
}

/* "2026-12-09T10:04:05.123Z" (UTC). */
static void format_time(int64_t time_ms, char *out, size_t size) {
    time_t seconds = (time_t)(time_ms / 1000);
    struct tm utc;
    if (!gmtime_r(&seconds, &utc)) {
        snprintf(out, size, "-");
        return;
    }
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &utc);
    snprintf(out, size, "%s.%03dZ", day, (int)(time_ms % 1000));
}

/* `text` with quotes, backslashes and bytes outside printable ASCII as \xNN. */
static void escape_text(const char *text, char *out, size_t size) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && n + 5 < size; p++) {
        if (*p < 0x20 || *p >= 0x7f || *p == '"' || *p == '\\') n += (size_t)snprintf(out + n, size - n, "\\x%02x", *p);
        else out[n++] = (char)*p;
    }
    out[n] = 0;
}

/* Ends a line cut at `size` with its newline. */
static size_t end_line(char *out, size_t size, int written) {
    if (written < 0) written = 0;
    size_t n = (size_t)written < size - 1 ? (size_t)written : size - 2;
    out[n] = '\n';
    out[n + 1] = 0;
    return n + 1;
}

static size_t text_line(const em_access_record *r, const char *when, char *out, size_t size) {
    char client[sizeof r->client * 4 + 1], method[sizeof r->method * 4 + 1], path[sizeof r->path * 4 + 1];
    escape_text(r->client, client, sizeof client);
    escape_text(r->method, method, sizeof method);
    escape_text(r->path, path, sizeof path);
    char tokens[64] = "";
    int n = 0;
    if (r->prompt_tokens >= 0) n = snprintf(tokens, sizeof tokens, " prompt=%lld", (long long)r->prompt_tokens);
    if (r->completion_tokens >= 0)
        snprintf(tokens + n, sizeof tokens - (size_t)n, " completion=%lld", (long long)r->completion_tokens);
    int written = snprintf(out, size, "%s %s \"%s %s\" %d%s %.1fms", when, client, method, path, r->status, tokens,
                           r->duration_ms);
    return end_line(out, size, written);
}

static json_t *tokens_json(int64_t tokens) {
    return tokens >= 0 ? json_integer((json_int_t)tokens) : json_null();
}

static size_t json_line(const em_access_record *r, const char *when, char *out, size_t size) {
    json_t *line = json_pack("{s:s, s:s, s:s, s:s, s:i, s:o, s:o, s:f}", "time", when, "client", r->client, "method",
                             r->method, "path", r->path, "status", r->status, "prompt_tokens",
                             tokens_json(r->prompt_tokens), "completion_tokens", tokens_json(r->completion_tokens),
                             "duration_ms", (double)(int64_t)(r->duration_ms * 10 + 0.5) / 10);
    /* a path or method that is not UTF-8 fails json_pack: the line is kept, with their bytes escaped */
    if (!line) {
        char method[sizeof r->method * 4 + 1], path[sizeof r->path * 4 + 1];
        escape_text(r->method, method, sizeof method);
        escape_text(r->path, path, sizeof path);
        line = json_pack("{s:s, s:s, s:s, s:s, s:i, s:o, s:o, s:f}", "time", when, "client", r->client, "method",
                         method, "path", path, "status", r->status, "prompt_tokens", tokens_json(r->prompt_tokens),
                         "completion_tokens", tokens_json(r->completion_tokens), "duration_ms",
                         (double)(int64_t)(r->duration_ms * 10 + 0.5) / 10);
    }
    size_t n = line ? json_dumpb(line, out, size - 2, JSON_COMPACT | JSON_REAL_PRECISION(10)) : 0;
    json_decref(line);
    if (n > size - 2) n = 0; /* did not fit: json_dumpb wrote a prefix only */
    if (!n) n = (size_t)snprintf(out, size, "{\"status\":%d}", r->status);
    return end_line(out, size, (int)n);
}

size_t em_access_log_line(em_access_log_format format, const em_access_record *record, char *out, size_t size) {
    if (size < 2) return 0;
    char when[40];
    format_time(record->time_ms, when, sizeof when);
    return format == EM_ACCESS_LOG_JSON ? json_line(record, when, out, size) : text_line(record, when, out, size);
}
