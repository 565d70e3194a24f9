/* What the files of the hub module share (see hub.h for the module). */
#ifndef EMBER_HUB_INTERNAL_H
#define EMBER_HUB_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hub.h"

/* ---- http.c: the Hub's HTTP API through libcurl ---- */

/* The answer to a GET: its status and body (NUL-terminated), and the URL of the next page when
 * the Hub paginates (a `Link: <URL>; rel="next"` header), else NULL. */
typedef struct hub_response {
    long status;
    char *body;
    size_t body_len;
    char *next_url;
} hub_response;

/* GETs `url` (with the token, when there is one). A transfer failure (no connection, a broken
 * answer) is an EM_ERR_IO error; any HTTP status is a response for the caller to judge. */
em_err hub_http_get(const em_hub_options *options, const char *url, hub_response *out);
void hub_response_free(hub_response *response);

/* One file to download into `partial_path` (kept between attempts and runs: a later call resumes
 * it with Range). On success the file holds exactly `size` bytes whose SHA-256 is `sha256` (hex;
 * NULL skips that check); on a mismatch the partial file is removed and the error says so. */
typedef struct hub_download {
    const char *url;
    const char *partial_path;
    uint64_t size;
    const char *sha256;
    const char *label; /* the file's name in the progress line and in messages */
} hub_download;

/* `status_out` receives the last HTTP status seen (0 when none), for the caller's messages. */
em_err hub_http_download(const em_hub_options *options, const hub_download *download, long *status_out);

/* "a/b c.gguf" → "a/b%20c.gguf": each path segment escaped for a URL (malloc'd, NULL when out of memory). */
char *hub_url_escape_path(const char *path);

/* ---- spec.c ---- */

/* A .gguf file that is a model: not a vision projector (mmproj), not a later part of a split set
 * (the first part stands for the set). */
bool hub_is_model_file(const char *path);

/* ---- cache.c: huggingface_hub's cache layout ---- */

/* A growable list of owned strings. */
typedef struct hub_strings {
    char **items;
    size_t count, cap;
} hub_strings;

em_err hub_strings_add(hub_strings *list, const char *text);
void hub_strings_free(hub_strings *list);

/* Formats a path into `out`; an error (naming the start of the path) when it does not fit. */
em_err hub_path(char *out, size_t size, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* CACHE/models--ORG--NAME into `out`; an error when it does not fit. */
em_err hub_repo_dir(const em_hub_options *options, const char *repo, char *out, size_t size);

/* The commit a revision names in the cache: refs/<revision>, or the revision itself when it is a
 * commit with a snapshot. EM_ERR_NOT_FOUND when the cache has neither. */
em_err hub_cached_commit(const char *repo_dir, const char *revision, char *commit, size_t size);

/* Every file under `dir` (links followed, broken ones skipped), as paths relative to it, sorted. */
em_err hub_list_files(const char *dir, hub_strings *out);

/* The paths of every part of the model whose first file is paths[first], in part order (one path
 * for an unsplit file). An error names a part that `paths` lacks. */
em_err hub_model_parts(const char *const *paths, size_t n_paths, size_t first, const char *where,
                       hub_strings *parts);

/* Creates every missing directory of `path` up to its last '/' (mkdir -p of the parent). */
em_err hub_make_parents(const char *path);

/* Points snapshots/<commit>/<file> at blobs/<blob> with a relative link, replacing what is there. */
em_err hub_link_snapshot(const char *repo_dir, const char *commit, const char *file, const char *blob);

/* Writes refs/<revision> = commit (replacing it in one rename). */
em_err hub_write_ref(const char *repo_dir, const char *revision, const char *commit);

/* Takes the download lock of one blob (blocks while another process holds it); *fd is closed to
 * release it. */
em_err hub_lock_blob(const em_hub_options *options, const char *repo, const char *blob, int *fd);

/* The model `spec` names, from the cache alone (offline mode, or when the Hub cannot be reached). */
em_err hub_resolve_cached(const em_hub_options *options, const em_hub_spec *spec, char **path);

#endif
