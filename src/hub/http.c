/*
 * The Hub over HTTP (internal.h): API requests and file downloads through libcurl.
 *
 * A download writes into a partial file that outlives the process: after an interruption the
 * next attempt (in this call, or a later run) asks for the rest with `Range: bytes=N-` and hashes
 * the bytes already there first, so the SHA-256 always covers the whole file. A server that
 * ignores the range (200 instead of 206) restarts the file; one that answers 416 (the partial
 * file is not a prefix of anything it serves) too. Redirects are followed, also to other hosts
 * (the Hub sends LFS files from a CDN); libcurl sends the Authorization header only to the host
 * it was meant for.
 */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define MAX_API_BODY (64u << 20)   /* a repository listing page is far smaller */
#define DOWNLOAD_ATTEMPTS 4        /* transfers per call before a broken download is an error */
#define STALL_SECONDS 60           /* a transfer slower than 1 byte/s for this long is broken */
#define PROGRESS_INTERVAL 0.25     /* seconds between progress line updates */

static const char user_agent[] = "ember/0.1";

void hub_response_free(hub_response *r) {
    free(r->body);
    free(r->next_url);
    memset(r, 0, sizeof *r);
}

char *hub_url_escape_path(const char *path) {
    CURL *curl = curl_easy_init();
    if (!curl) return NULL;
    size_t cap = 3 * strlen(path) + 1, used = 0;
    char *out = malloc(cap);
    for (const char *p = path; out && *p;) {
        const size_t len = strcspn(p, "/");
        char *escaped = curl_easy_escape(curl, p, (int)len);
        if (!escaped) {
            free(out);
            out = NULL;
            break;
        }
        used += (size_t)snprintf(out + used, cap - used, "%s%s", escaped, p[len] == '/' ? "/" : "");
        curl_free(escaped);
        p += len + (p[len] == '/');
    }
    if (out && !*path) out[0] = '\0';
    curl_easy_cleanup(curl);
    return out;
}

/* A curl handle with what every request shares: redirects, the token, failure timeouts. */
static em_err new_handle(const em_hub_options *o, CURL **out, struct curl_slist **headers) {
    *out = NULL;
    *headers = NULL;
    CURL *curl = curl_easy_init();
    if (!curl) return em_errorf(EM_ERR_NOMEM, "cannot create an HTTP client (curl_easy_init)");
    if (o->token[0]) {
        char header[1100];
        snprintf(header, sizeof header, "Authorization: Bearer %s", o->token);
        struct curl_slist *list = curl_slist_append(NULL, header);
        if (!list) {
            curl_easy_cleanup(curl);
            return em_errorf(EM_ERR_NOMEM, "out of memory for an HTTP header");
        }
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
        *headers = list;
    }
    curl_easy_setopt(curl, CURLOPT_USERAGENT, user_agent);
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, (long)STALL_SECONDS);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85: the string forms; a redirect may not leave HTTP(S) */
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#endif
    *out = curl;
    return NULL;
}

/* ---- API requests ---- */

typedef struct body_buffer {
    hub_response *response;
    bool too_large;
} body_buffer;

static size_t collect_body(char *data, size_t size, size_t count, void *user) {
    body_buffer *b = user;
    hub_response *r = b->response;
    const size_t n = size * count;
    if (r->body_len + n > MAX_API_BODY) {
        b->too_large = true;
        return 0;
    }
    char *grown = realloc(r->body, r->body_len + n + 1);
    if (!grown) return 0;
    memcpy(grown + r->body_len, data, n);
    r->body = grown;
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return n;
}

/* Keeps the URL of a `Link: <URL>; rel="next"` header (the Hub paginates long listings). */
static size_t collect_link(char *data, size_t size, size_t count, void *user) {
    hub_response *r = user;
    const size_t n = size * count;
    if (n > 5 && !strncasecmp(data, "link:", 5) && memmem(data, n, "rel=\"next\"", 10)) {
        const char *open = memchr(data, '<', n), *close = open ? memchr(open, '>', n - (size_t)(open - data)) : NULL;
        if (open && close) {
            free(r->next_url);
            r->next_url = strndup(open + 1, (size_t)(close - open - 1));
        }
    }
    return n;
}

em_err hub_http_get(const em_hub_options *o, const char *url, hub_response *out) {
    memset(out, 0, sizeof *out);
    CURL *curl;
    struct curl_slist *headers;
    em_err err = new_handle(o, &curl, &headers);
    if (err) return err;
    body_buffer buffer = {.response = out};
    char error[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &buffer);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, collect_link);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, out);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 300L);
    const CURLcode code = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &out->status);
    if (buffer.too_large) err = em_errorf(EM_ERR_RANGE, "GET %s: the answer is larger than %u bytes", url, MAX_API_BODY);
    else if (code != CURLE_OK)
        err = em_errorf(EM_ERR_IO, "GET %s: %s", url, error[0] ? error : curl_easy_strerror(code));
    else if (!out->body && !(out->body = calloc(1, 1))) err = em_errorf(EM_ERR_NOMEM, "out of memory");
    curl_easy_cleanup(curl);
    curl_slist_free_all(headers);
    if (err) hub_response_free(out);
    return err;
}

/* ---- Downloads ---- */

typedef struct transfer {
    const hub_download *download;
    CURL *curl;
    int fd;
    EVP_MD_CTX *sha;
    uint64_t offset;    /* bytes in the partial file */
    uint64_t start;     /* bytes there when this attempt began, for the rate */
    bool checked;       /* the status of the answer was looked at */
    bool writing;       /* the answer is the file's bytes (200 or 206) */
    bool too_long;      /* the server sent more than the listed size */
    em_err write_error;
    bool progress;
    struct timespec began, last_print;
} transfer;

static double seconds_since(const struct timespec *t) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) / 1e9;
}

char *em_hub_printable(const char *text) {
    const unsigned char *t = (const unsigned char *)text;
    size_t len = strlen(text);
    char *out = malloc(4 * len + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < len; i++) {
        bool c1 = t[i] == 0xC2 && i + 1 < len && t[i + 1] >= 0x80 && t[i + 1] <= 0x9F;
        if (t[i] < 0x20 || t[i] == 0x7F || t[i] == '\\' || c1) {
            o += sprintf(o, "\\x%02X", t[i]);
            if (c1) o += sprintf(o, "\\x%02X", t[++i]);
        } else {
            *o++ = (char)t[i];
        }
    }
    *o = 0;
    return out;
}

void em_hub_format_bytes(double bytes, char *out, size_t size) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int unit = 0;
    while (bytes >= 1024 && unit < 4) bytes /= 1024, unit++;
    snprintf(out, size, unit ? "%.1f %s" : "%.0f %s", bytes, units[unit]);
}

static void print_progress(transfer *t, bool last) {
    if (!t->progress) return;
    if (!last && seconds_since(&t->last_print) < PROGRESS_INTERVAL) return;
    clock_gettime(CLOCK_MONOTONIC, &t->last_print);
    const double elapsed = seconds_since(&t->began);
    const double rate = elapsed > 0 ? (double)(t->offset - t->start) / elapsed : 0;
    const uint64_t size = t->download->size;
    char done[32], total[32], speed[32], left[32] = "?";
    em_hub_format_bytes((double)t->offset, done, sizeof done);
    em_hub_format_bytes((double)size, total, sizeof total);
    em_hub_format_bytes(rate, speed, sizeof speed);
    if (rate > 0 && size >= t->offset) {
        const long seconds = (long)((double)(size - t->offset) / rate + 0.5);
        if (seconds < 60) snprintf(left, sizeof left, "%ld s", seconds);
        else if (seconds < 3600) snprintf(left, sizeof left, "%ld min %02ld s", seconds / 60, seconds % 60);
        else snprintf(left, sizeof left, "%ld h %02ld min", seconds / 3600, seconds / 60 % 60);
    }
    fprintf(stderr, "\r\033[K%s: %s / %s (%.0f%%), %s/s, %s left%s", t->download->label, done, total,
            size ? 100.0 * (double)t->offset / (double)size : 100.0, speed, left, last ? "\n" : "");
    fflush(stderr);
}

/* Restarts the partial file at 0 bytes (a server that ignored the range, or a 416). */
static em_err restart_file(transfer *t) {
    if (ftruncate(t->fd, 0) != 0)
        return em_errorf(EM_ERR_IO, "%s: cannot truncate: %s", t->download->partial_path, strerror(errno));
    t->offset = t->start = 0;
    if (EVP_DigestInit_ex(t->sha, EVP_sha256(), NULL) != 1)
        return em_errorf(EM_ERR_INTERNAL, "SHA-256: EVP_DigestInit_ex failed");
    return NULL;
}

static size_t write_file(char *data, size_t size, size_t count, void *user) {
    transfer *t = user;
    const size_t n = size * count;
    if (!t->checked) {
        long status = 0;
        curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
        t->checked = true;
        t->writing = status == 200 || status == 206;
        if (status == 200 && t->offset > 0 && (t->write_error = restart_file(t))) return 0;
    }
    if (!t->writing) return n; /* an error page: the status says what went wrong */
    if (t->offset + n > t->download->size) {
        t->too_long = true;
        return 0;
    }
    for (size_t done = 0; done < n;) {
        const ssize_t wrote = pwrite(t->fd, data + done, n - done, (off_t)(t->offset + done));
        if (wrote <= 0) {
            t->write_error = em_errorf(EM_ERR_IO, "%s: write failed: %s", t->download->partial_path,
                                       wrote < 0 ? strerror(errno) : "no space written");
            return 0;
        }
        done += (size_t)wrote;
    }
    if (EVP_DigestUpdate(t->sha, data, n) != 1) {
        t->write_error = em_errorf(EM_ERR_INTERNAL, "SHA-256: EVP_DigestUpdate failed");
        return 0;
    }
    t->offset += n;
    print_progress(t, false);
    return n;
}

/* Opens the partial file and hashes the bytes it already holds (a resumed download). */
static em_err open_partial(transfer *t) {
    const hub_download *d = t->download;
    t->fd = open(d->partial_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (t->fd < 0) return em_errorf(EM_ERR_IO, "%s: cannot open: %s", d->partial_path, strerror(errno));
    struct stat st;
    if (fstat(t->fd, &st) != 0) return em_errorf(EM_ERR_IO, "%s: cannot stat: %s", d->partial_path, strerror(errno));
    t->offset = (uint64_t)st.st_size;
    if (t->offset > d->size) return restart_file(t);
    if (EVP_DigestInit_ex(t->sha, EVP_sha256(), NULL) != 1)
        return em_errorf(EM_ERR_INTERNAL, "SHA-256: EVP_DigestInit_ex failed");
    const size_t chunk_size = 1 << 20;
    unsigned char *chunk = t->offset ? malloc(chunk_size) : NULL;
    if (t->offset && !chunk) return em_errorf(EM_ERR_NOMEM, "out of memory resuming %s", d->partial_path);
    em_err err = NULL;
    for (uint64_t at = 0; at < t->offset && !err;) {
        const size_t want = t->offset - at < chunk_size ? (size_t)(t->offset - at) : chunk_size;
        const ssize_t got = pread(t->fd, chunk, want, (off_t)at);
        if (got <= 0)
            err = em_errorf(EM_ERR_IO, "%s: read failed at byte %llu", d->partial_path, (unsigned long long)at);
        else if (EVP_DigestUpdate(t->sha, chunk, (size_t)got) != 1)
            err = em_errorf(EM_ERR_INTERNAL, "SHA-256: EVP_DigestUpdate failed");
        else at += (uint64_t)got;
    }
    free(chunk);
    return err;
}

/* One GET of the rest of the file. *status is the answer's HTTP status; *code libcurl's result. */
static em_err attempt(const em_hub_options *o, transfer *t, long *status, CURLcode *code, char *error) {
    struct curl_slist *headers;
    em_err err = new_handle(o, &t->curl, &headers);
    if (err) return err;
    char range[64];
    snprintf(range, sizeof range, "%llu-", (unsigned long long)t->offset);
    curl_easy_setopt(t->curl, CURLOPT_URL, t->download->url);
    if (t->offset > 0) curl_easy_setopt(t->curl, CURLOPT_RANGE, range);
    curl_easy_setopt(t->curl, CURLOPT_WRITEFUNCTION, write_file);
    curl_easy_setopt(t->curl, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->curl, CURLOPT_ERRORBUFFER, error);
    t->checked = t->writing = t->too_long = false;
    t->start = t->offset;
    clock_gettime(CLOCK_MONOTONIC, &t->began);
    *code = curl_easy_perform(t->curl);
    *status = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(t->curl);
    curl_slist_free_all(headers);
    t->curl = NULL;
    return NULL;
}

/* The digest so far, as 64 hex digits. */
static em_err finish_sha(transfer *t, char hex[65]) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(t->sha, digest, &len) != 1 || len != 32)
        return em_errorf(EM_ERR_INTERNAL, "SHA-256: EVP_DigestFinal_ex failed");
    for (unsigned int i = 0; i < len; i++) snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    return NULL;
}

/* Checks the finished file against the listing; a corrupt one is removed. */
static em_err verify(transfer *t) {
    const hub_download *d = t->download;
    char hex[65];
    em_err err = finish_sha(t, hex);
    if (err) return err;
    if (d->sha256 && strcasecmp(hex, d->sha256)) {
        remove(d->partial_path);
        return em_errorf(EM_ERR_FORMAT,
                         "%s: the downloaded bytes have SHA-256 %s, but the Hub lists %s; the file was discarded "
                         "(run the command again; a proxy or mirror may have altered it)",
                         d->label, hex, d->sha256);
    }
    return NULL;
}

em_err hub_http_download(const em_hub_options *o, const hub_download *d, long *status_out) {
    transfer t = {.download = d, .fd = -1, .progress = o->progress};
    *status_out = 0;
    if (!(t.sha = EVP_MD_CTX_new())) return em_errorf(EM_ERR_NOMEM, "out of memory for a SHA-256 context");
    em_err err = open_partial(&t);
    clock_gettime(CLOCK_MONOTONIC, &t.last_print);
    char error[CURL_ERROR_SIZE];
    for (int tries = 0; !err && t.offset < d->size; tries++) {
        if (tries == DOWNLOAD_ATTEMPTS) {
            err = em_errorf(EM_ERR_IO,
                            "%s: the download broke off %d times (last: %s); %llu of %llu bytes are kept in %s and "
                            "the next pull resumes there",
                            d->label, DOWNLOAD_ATTEMPTS, error, (unsigned long long)t.offset,
                            (unsigned long long)d->size, d->partial_path);
            break;
        }
        long status;
        CURLcode code;
        error[0] = '\0';
        if ((err = attempt(o, &t, &status, &code, error))) break;
        *status_out = status;
        if ((err = t.write_error)) break;
        if (t.too_long) {
            err = em_errorf(EM_ERR_FORMAT, "%s: the server sent more than the %llu bytes the Hub lists", d->label,
                            (unsigned long long)d->size);
            remove(d->partial_path);
            break;
        }
        if (status == 416) {
            err = restart_file(&t); /* the partial file is not a prefix of this file: start over */
            continue;
        }
        if (status != 0 && status != 200 && status != 206) {
            err = em_errorf(EM_ERR_IO, "%s: the server answered HTTP %ld", d->label, status);
            break;
        }
        if (code == CURLE_OK && t.offset < d->size) {
            err = em_errorf(EM_ERR_FORMAT, "%s: the server sent %llu bytes, the Hub lists %llu", d->label,
                            (unsigned long long)t.offset, (unsigned long long)d->size);
            break;
        }
        if (code != CURLE_OK && !error[0]) snprintf(error, sizeof error, "%s", curl_easy_strerror(code));
    }
    if (!err) print_progress(&t, true);
    else if (t.progress) fputc('\n', stderr);
    if (!err) err = verify(&t);
    if (t.fd >= 0 && close(t.fd) != 0 && !err)
        err = em_errorf(EM_ERR_IO, "%s: close failed: %s", d->partial_path, strerror(errno));
    EVP_MD_CTX_free(t.sha);
    return err;
}
