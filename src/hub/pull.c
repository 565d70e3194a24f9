/*
 * `em_hub_pull` (hub.h): a spec to a local path. Online, it asks the Hub which commit the revision
 * is, lists the files at that commit (path, size, git oid, and for LFS files their sha256), picks
 * the model, and makes sure each of its files is a blob in the cache with a snapshot link: a blob
 * that is already there (from any tool) is reused, a missing one is downloaded under its lock.
 * Offline, or when the Hub cannot be reached, the cache alone answers.
 *
 * Everything the server sends that becomes a path (file names, blob names) is checked first, so a
 * hostile or broken endpoint cannot make us write outside the repository's cache folder.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define MAX_LISTING_PAGES 1000

/* One file of the listing. */
typedef struct listed_file {
    char *path;
    uint64_t size;
    char *blob;   /* the cache's name for its bytes: the LFS sha256, else the git oid */
    bool has_sha; /* blob is a sha256 the bytes must match */
} listed_file;

typedef struct listing {
    listed_file *files;
    size_t count, cap;
} listing;

static void listing_free(listing *l) {
    for (size_t i = 0; i < l->count; i++) {
        free(l->files[i].path);
        free(l->files[i].blob);
    }
    free(l->files);
    memset(l, 0, sizeof *l);
}

/* An answer other than 200 to a request about `repo`, as an error that says how to fix it. */
static em_err status_error(const em_hub_options *o, const char *repo, long status, const char *detail) {
    char said[300] = "";
    if (detail && detail[0]) snprintf(said, sizeof said, " (\"%.200s\")", detail);
    if (status == 401 && !o->token[0])
        return em_errorf(EM_ERR_INVALID,
                         "%s: the Hub answered 401 Unauthorized%s: the repository is gated or private (or does not "
                         "exist). Accept its license on %s/%s while logged in, then set HF_TOKEN or pass --hf-token "
                         "with a read token",
                         repo, said, o->endpoint, repo);
    if (status == 401 || status == 403)
        return em_errorf(EM_ERR_INVALID,
                         "%s: the Hub answered %ld %s%s: the token has no access to this repository. Accept its "
                         "license on %s/%s with the account the token belongs to, or set HF_TOKEN / --hf-token to "
                         "a token with read access",
                         repo, status, status == 401 ? "Unauthorized" : "Forbidden", said, o->endpoint, repo);
    if (status == 404)
        return em_errorf(EM_ERR_NOT_FOUND, "%s: not found on %s (HTTP 404)%s: check the name (ORG/NAME)", repo,
                         o->endpoint, said);
    return em_errorf(EM_ERR_IO, "%s: %s answered HTTP %ld%s", repo, o->endpoint, status, said);
}

/* GETs an API URL and parses its JSON; a status other than 200 becomes status_error. */
static em_err get_json(const em_hub_options *o, const char *repo, const char *url, json_t **out, char **next_url) {
    *out = NULL;
    hub_response r;
    em_err err = hub_http_get(o, url, &r);
    if (err) return err;
    json_error_t error;
    json_t *json = json_loadb(r.body, r.body_len, 0, &error);
    if (r.status != 200) {
        const char *detail = json_is_object(json) ? json_string_value(json_object_get(json, "error")) : NULL;
        err = status_error(o, repo, r.status, detail);
    } else if (!json) {
        err = em_errorf(EM_ERR_FORMAT, "GET %s: the answer is not JSON (%s at byte %d)", url, error.text, error.position);
    }
    if (err) json_decref(json);
    else *out = json;
    if (next_url) {
        *next_url = err ? NULL : r.next_url;
        if (!err) r.next_url = NULL;
    }
    hub_response_free(&r);
    return err;
}

static bool is_hex(const char *text, size_t min, size_t max) {
    size_t n = 0;
    while ((text[n] >= '0' && text[n] <= '9') || (text[n] >= 'a' && text[n] <= 'f')) n++;
    return !text[n] && n >= min && n <= max;
}

/* A path inside the repository that stays inside it: no "..", no empty or hidden-root segments. */
static bool safe_repo_path(const char *path) {
    if (!path[0] || path[0] == '/' || strlen(path) >= 1024) return false;
    for (const char *segment = path; *segment;) {
        const size_t len = strcspn(segment, "/");
        if (len == 0 || (len == 1 && segment[0] == '.') || (len == 2 && !strncmp(segment, "..", 2))) return false;
        segment += len + (segment[len] == '/');
    }
    return true;
}

/* The commit the revision names (the API's "sha"). */
static em_err fetch_commit(const em_hub_options *o, const char *repo, char *commit, size_t size) {
    char *revision = hub_url_escape_path(o->revision);
    if (!revision) return em_errorf(EM_ERR_NOMEM, "out of memory");
    char url[2048];
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s", o->endpoint, repo, revision);
    free(revision);
    json_t *json;
    em_err err = get_json(o, repo, url, &json, NULL);
    if (err) return err;
    const char *sha = json_string_value(json_object_get(json, "sha"));
    if (!sha || !is_hex(sha, 40, 40)) err = em_errorf(EM_ERR_FORMAT, "GET %s: no commit hash in \"sha\"", url);
    else snprintf(commit, size, "%s", sha);
    json_decref(json);
    return err;
}

static em_err add_listed(listing *l, json_t *entry, const char *url) {
    const char *type = json_string_value(json_object_get(entry, "type"));
    if (!type || strcmp(type, "file")) return NULL; /* directories */
    const char *path = json_string_value(json_object_get(entry, "path"));
    const char *oid = json_string_value(json_object_get(entry, "oid"));
    json_t *size = json_object_get(entry, "size"), *lfs = json_object_get(entry, "lfs");
    const char *sha = lfs ? json_string_value(json_object_get(lfs, "oid")) : NULL;
    json_t *lfs_size = lfs ? json_object_get(lfs, "size") : NULL;
    if (lfs_size) size = lfs_size;
    if (!path || !safe_repo_path(path) || !json_is_integer(size) || json_integer_value(size) < 0 ||
        (lfs ? !sha || !is_hex(sha, 64, 64) : !oid || !is_hex(oid, 40, 64)))
    {
        char *shown = path ? em_hub_printable(path) : NULL;
        em_err err = em_errorf(EM_ERR_FORMAT, "GET %s: a file entry lacks a safe path, a size or a hash (%s)", url,
                               shown ? shown : "no path");
        free(shown);
        return err;
    }
    if (l->count == l->cap) {
        const size_t cap = l->cap ? 2 * l->cap : 32;
        listed_file *grown = realloc(l->files, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "out of memory listing a repository");
        l->files = grown;
        l->cap = cap;
    }
    listed_file *f = &l->files[l->count];
    *f = (listed_file){.path = strdup(path), .blob = strdup(lfs ? sha : oid), .size = (uint64_t)json_integer_value(size),
                       .has_sha = lfs != NULL};
    if (!f->path || !f->blob) {
        free(f->path);
        free(f->blob);
        return em_errorf(EM_ERR_NOMEM, "out of memory listing a repository");
    }
    l->count++;
    return NULL;
}

/* Every file of the repository at `commit`, through the tree API (following its pages). */
static em_err fetch_listing(const em_hub_options *o, const char *repo, const char *commit, listing *out) {
    char first[2048];
    snprintf(first, sizeof first, "%s/api/models/%s/tree/%s?recursive=true", o->endpoint, repo, commit);
    char *url = strdup(first);
    em_err err = url ? NULL : em_errorf(EM_ERR_NOMEM, "out of memory");
    for (int page = 0; url && !err; page++) {
        if (page == MAX_LISTING_PAGES) {
            err = em_errorf(EM_ERR_RANGE, "%s: the listing has more than %d pages", repo, MAX_LISTING_PAGES);
            break;
        }
        json_t *json;
        char *next = NULL;
        if ((err = get_json(o, repo, url, &json, &next))) break;
        if (!json_is_array(json)) err = em_errorf(EM_ERR_FORMAT, "GET %s: the listing is not a JSON array", url);
        for (size_t i = 0; !err && i < json_array_size(json); i++) err = add_listed(out, json_array_get(json, i), url);
        json_decref(json);
        free(url);
        url = next;
    }
    free(url);
    if (err) listing_free(out);
    return err;
}

static bool blob_ready(const char *path, uint64_t size) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == size;
}

/* Makes blobs/<blob> hold the file, downloading it under its lock unless it is there already. */
static em_err fetch_blob(const em_hub_options *o, const char *repo, const char *repo_dir, const char *commit,
                         const listed_file *f) {
    char blob_path[EM_HUB_PATH_MAX], partial[EM_HUB_PATH_MAX + 16];
    if ((size_t)snprintf(blob_path, sizeof blob_path, "%s/blobs/%s", repo_dir, f->blob) >= sizeof blob_path)
        return em_errorf(EM_ERR_RANGE, "path too long: %s/blobs/%s", repo_dir, f->blob);
    if (blob_ready(blob_path, f->size)) return NULL;
    int lock = -1;
    em_err err = hub_lock_blob(o, repo, f->blob, &lock);
    if (err) return err;
    /* Whoever held the lock before us may have finished it. */
    if (!blob_ready(blob_path, f->size)) {
        snprintf(partial, sizeof partial, "%s.incomplete", blob_path);
        char *escaped = hub_url_escape_path(f->path);
        const size_t url_len = strlen(o->endpoint) + strlen(repo) + 64 + (escaped ? strlen(escaped) : 0);
        char *url = escaped ? malloc(url_len) : NULL;
        if (!url) err = em_errorf(EM_ERR_NOMEM, "out of memory");
        else snprintf(url, url_len, "%s/%s/resolve/%s/%s", o->endpoint, repo, commit, escaped);
        if (!err) err = hub_make_parents(blob_path);
        char *label = em_hub_printable(f->path);
        if (!err && !label) err = em_errorf(EM_ERR_NOMEM, "out of memory");
        hub_download d = {.url = url, .partial_path = partial, .size = f->size,
                          .sha256 = f->has_sha ? f->blob : NULL, .label = label};
        long status = 0;
        if (!err && (err = hub_http_download(o, &d, &status)) && (status == 401 || status == 403 || status == 404)) {
            em_err_free(err);
            err = status_error(o, repo, status, NULL);
        }
        if (!err && rename(partial, blob_path) != 0)
            err = em_errorf(EM_ERR_IO, "%s: cannot rename %s to it: %s", blob_path, partial, strerror(errno));
        free(escaped);
        free(url);
        free(label);
    }
    close(lock);
    return err;
}

/* Online pull: listing, selection, blobs, links, ref. */
static em_err pull_online(const em_hub_options *o, const em_hub_spec *spec, const char *commit, char **path) {
    char repo_dir[EM_HUB_PATH_MAX];
    listing l = {0};
    hub_strings paths = {0}, parts = {0};
    size_t first = 0;
    em_err err = hub_repo_dir(o, spec->repo, repo_dir, sizeof repo_dir);
    if (!err) err = fetch_listing(o, spec->repo, commit, &l);
    for (size_t i = 0; !err && i < l.count; i++) err = hub_strings_add(&paths, l.files[i].path);
    if (!err) err = em_hub_select(spec, (const char *const *)paths.items, paths.count, &first);
    if (!err) err = hub_model_parts((const char *const *)paths.items, paths.count, first, spec->repo, &parts);
    for (size_t p = 0; !err && p < parts.count; p++) {
        size_t i = 0;
        while (strcmp(l.files[i].path, parts.items[p])) i++; /* hub_model_parts found it among `paths` */
        err = fetch_blob(o, spec->repo, repo_dir, commit, &l.files[i]);
        if (!err) err = hub_link_snapshot(repo_dir, commit, l.files[i].path, l.files[i].blob);
    }
    if (!err && strcmp(o->revision, commit)) err = hub_write_ref(repo_dir, o->revision, commit);
    if (!err) {
        const size_t len = strlen(repo_dir) + strlen(commit) + strlen(paths.items[first]) + 16;
        if ((*path = malloc(len))) snprintf(*path, len, "%s/snapshots/%s/%s", repo_dir, commit, paths.items[first]);
        else err = em_errorf(EM_ERR_NOMEM, "out of memory");
    }
    listing_free(&l);
    hub_strings_free(&paths);
    hub_strings_free(&parts);
    return err;
}

em_err em_hub_pull(const em_hub_options *o, const char *text, char **path) {
    *path = NULL;
    em_hub_spec spec;
    em_err err = em_hub_spec_parse(text, &spec);
    if (err) return err;
    if (o->offline) {
        err = hub_resolve_cached(o, &spec, path);
        return err ? em_err_prefix(err, "HF_HUB_OFFLINE is set, so only the cache (%s) is used", o->cache_dir) : NULL;
    }
    char commit[64];
    err = fetch_commit(o, spec.repo, commit, sizeof commit);
    if (err && em_err_code_of(err) == EM_ERR_IO) {
        /* The Hub cannot be reached: what the cache holds still serves, as huggingface_hub does. */
        em_err cached = hub_resolve_cached(o, &spec, path);
        if (!cached) {
            em_log(EM_LOG_WARN, "%s; using the cached %s", em_err_message(err), *path);
            em_err_free(err);
            return NULL;
        }
        em_err_free(cached);
    }
    if (err) return err;
    return pull_online(o, &spec, commit, path);
}
