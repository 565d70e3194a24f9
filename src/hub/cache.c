/*
 * The shared download cache in huggingface_hub's layout (hub.h draws it): where it is, reading
 * refs and snapshots, writing links and refs so that other tools read them as their own, the
 * per-blob download lock, and the offline resolution of a spec.
 *
 * Links and refs are written under a temporary name and renamed into place, so a reader sees the
 * old entry or the new one, never a half-written one.
 */
#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* ---- settings ---- */

static em_err copy_setting(char *out, size_t size, const char *value, const char *what) {
    if (strlen(value) >= size) return em_errorf(EM_ERR_RANGE, "%s is longer than %zu characters", what, size - 1);
    memcpy(out, value, strlen(value) + 1);
    return NULL;
}

/* The token huggingface_hub's login stores, without its line end; "" when there is none. */
static void read_token_file(const char *path, char *out, size_t size) {
    FILE *f = fopen(path, "r");
    out[0] = '\0';
    if (!f) return;
    if (fgets(out, (int)size, f)) out[strcspn(out, "\r\n \t")] = '\0';
    fclose(f);
}

static bool env_true(const char *name) {
    const char *v = getenv(name);
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
}

em_err em_hub_options_from_env(em_hub_options *o) {
    memset(o, 0, sizeof *o);
    const char *endpoint = getenv("HF_ENDPOINT");
    em_err err = copy_setting(o->endpoint, sizeof o->endpoint,
                              endpoint && endpoint[0] ? endpoint : EM_HUB_DEFAULT_ENDPOINT, "HF_ENDPOINT");
    if (err) return err;
    for (size_t len = strlen(o->endpoint); len > 0 && o->endpoint[len - 1] == '/'; len--) o->endpoint[len - 1] = '\0';

    char home[EM_HUB_PATH_MAX];
    const char *hf_home = getenv("HF_HOME"), *user_home = getenv("HOME"), *cache = getenv("HF_HUB_CACHE");
    if (hf_home && hf_home[0]) {
        if ((err = copy_setting(home, sizeof home, hf_home, "HF_HOME"))) return err;
    } else if (user_home && user_home[0]) {
        if ((size_t)snprintf(home, sizeof home, "%s/.cache/huggingface", user_home) >= sizeof home)
            return em_errorf(EM_ERR_RANGE, "HOME is too long for a cache path");
    } else if (!cache || !cache[0]) {
        return em_errorf(EM_ERR_INVALID, "no cache directory: set HF_HUB_CACHE, HF_HOME or HOME");
    } else {
        home[0] = '\0';
    }
    if (cache && cache[0]) err = copy_setting(o->cache_dir, sizeof o->cache_dir, cache, "HF_HUB_CACHE");
    else if ((size_t)snprintf(o->cache_dir, sizeof o->cache_dir, "%s/hub", home) >= sizeof o->cache_dir)
        err = em_errorf(EM_ERR_RANGE, "HF_HOME is too long for a cache path");
    if (err) return err;

    const char *token = getenv("HF_TOKEN");
    if (token && token[0]) {
        if ((err = copy_setting(o->token, sizeof o->token, token, "HF_TOKEN"))) return err;
    } else if (home[0]) {
        char path[EM_HUB_PATH_MAX + 8];
        snprintf(path, sizeof path, "%s/token", home);
        read_token_file(path, o->token, sizeof o->token);
    }
    snprintf(o->revision, sizeof o->revision, "main");
    o->offline = env_true("HF_HUB_OFFLINE");
    return NULL;
}

/* ---- small helpers ---- */

em_err hub_strings_add(hub_strings *list, const char *text) {
    if (list->count == list->cap) {
        const size_t cap = list->cap ? 2 * list->cap : 16;
        char **grown = realloc(list->items, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "out of memory listing files");
        list->items = grown;
        list->cap = cap;
    }
    if (!(list->items[list->count] = strdup(text))) return em_errorf(EM_ERR_NOMEM, "out of memory listing files");
    list->count++;
    return NULL;
}

void hub_strings_free(hub_strings *list) {
    for (size_t i = 0; i < list->count; i++) free(list->items[i]);
    free(list->items);
    memset(list, 0, sizeof *list);
}

em_err hub_path(char *out, size_t size, const char *format, ...) {
    va_list args;
    va_start(args, format);
    const int len = vsnprintf(out, size, format, args);
    va_end(args);
    if (len < 0 || (size_t)len >= size) return em_errorf(EM_ERR_RANGE, "path too long: %.200s...", out);
    return NULL;
}

em_err hub_repo_dir(const em_hub_options *o, const char *repo, char *out, size_t size) {
    char folder[300];
    em_hub_repo_folder(repo, folder, sizeof folder);
    return hub_path(out, size, "%s/%s", o->cache_dir, folder);
}

em_err hub_make_parents(const char *path) {
    char buffer[EM_HUB_PATH_MAX];
    if (strlen(path) >= sizeof buffer) return em_errorf(EM_ERR_RANGE, "path too long: %s", path);
    strcpy(buffer, path);
    for (char *p = buffer + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buffer, 0755) != 0 && errno != EEXIST)
            return em_errorf(EM_ERR_IO, "%s: cannot create the directory: %s", buffer, strerror(errno));
        *p = '/';
    }
    return NULL;
}

/* Writes `path` through a temporary sibling and a rename: `make` creates the sibling. */
static em_err replace_atomically(const char *path, em_err (*make)(const char *tmp, const void *what), const void *what) {
    char tmp[EM_HUB_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    em_err err = hub_make_parents(path);
    if (!err) {
        unlink(tmp);
        err = make(tmp, what);
    }
    if (!err && rename(tmp, path) != 0) {
        err = em_errorf(EM_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
        unlink(tmp);
    }
    return err;
}

static em_err make_link(const char *tmp, const void *target) {
    if (symlink(target, tmp) != 0) return em_errorf(EM_ERR_IO, "%s: cannot create a link: %s", tmp, strerror(errno));
    return NULL;
}

static em_err make_ref(const char *tmp, const void *commit) {
    FILE *f = fopen(tmp, "w");
    if (!f) return em_errorf(EM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    const bool wrote = fputs(commit, f) >= 0; /* huggingface_hub writes the sha without a line end */
    if (fclose(f) != 0 || !wrote) {
        unlink(tmp);
        return em_errorf(EM_ERR_IO, "%s: write failed", tmp);
    }
    return NULL;
}

em_err hub_link_snapshot(const char *repo_dir, const char *commit, const char *file, const char *blob) {
    char link[EM_HUB_PATH_MAX], target[EM_HUB_PATH_MAX];
    if ((size_t)snprintf(link, sizeof link, "%s/snapshots/%s/%s", repo_dir, commit, file) >= sizeof link)
        return em_errorf(EM_ERR_RANGE, "path too long: %s/snapshots/%s/%s", repo_dir, commit, file);
    /* From snapshots/<commit>/<dirs>/ up to the repository folder: two levels plus one per directory. */
    size_t used = 0;
    for (const char *p = file; *p; p++)
        if (*p == '/') used += (size_t)snprintf(target + used, sizeof target - used, "../");
    if ((size_t)snprintf(target + used, sizeof target - used, "../../blobs/%s", blob) >= sizeof target - used)
        return em_errorf(EM_ERR_RANGE, "link target too long for %s", file);
    return replace_atomically(link, make_link, target);
}

em_err hub_write_ref(const char *repo_dir, const char *revision, const char *commit) {
    char path[EM_HUB_PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/refs/%s", repo_dir, revision) >= sizeof path)
        return em_errorf(EM_ERR_RANGE, "path too long: %s/refs/%s", repo_dir, revision);
    return replace_atomically(path, make_ref, commit);
}

em_err hub_lock_blob(const em_hub_options *o, const char *repo, const char *blob, int *fd) {
    char folder[300], path[EM_HUB_PATH_MAX];
    em_hub_repo_folder(repo, folder, sizeof folder);
    if ((size_t)snprintf(path, sizeof path, "%s/.locks/%s/%s.lock", o->cache_dir, folder, blob) >= sizeof path)
        return em_errorf(EM_ERR_RANGE, "path too long for the lock of %s", blob);
    em_err err = hub_make_parents(path);
    if (err) return err;
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) return em_errorf(EM_ERR_IO, "%s: cannot open the lock: %s", path, strerror(errno));
    while (flock(*fd, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        em_err locked = em_errorf(EM_ERR_IO, "%s: cannot lock: %s", path, strerror(errno));
        close(*fd);
        *fd = -1;
        return locked;
    }
    return NULL;
}

/* ---- reading the cache ---- */

static bool is_commit_hash(const char *text) {
    size_t n = 0;
    while ((text[n] >= '0' && text[n] <= '9') || (text[n] >= 'a' && text[n] <= 'f')) n++;
    return n == 40 && !text[n];
}

em_err hub_cached_commit(const char *repo_dir, const char *revision, char *commit, size_t size) {
    char path[EM_HUB_PATH_MAX];
    struct stat st;
    em_err err = NULL;
    if ((size_t)snprintf(path, sizeof path, "%s/refs/%s", repo_dir, revision) >= sizeof path)
        return em_errorf(EM_ERR_RANGE, "path too long: %s/refs/%s", repo_dir, revision);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(commit, (int)size, f)) commit[0] = '\0';
        commit[strcspn(commit, "\r\n ")] = '\0';
        fclose(f);
        if (!is_commit_hash(commit)) err = em_errorf(EM_ERR_FORMAT, "%s does not hold a commit hash", path);
        return err;
    }
    if (is_commit_hash(revision) &&
        (size_t)snprintf(path, sizeof path, "%s/snapshots/%s", repo_dir, revision) < sizeof path &&
        stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(commit, size, "%s", revision);
        return NULL;
    }
    return em_errorf(EM_ERR_NOT_FOUND, "the cache has no revision '%s' in %s (no refs/%s)", revision, repo_dir,
                     revision);
}

static int compare_strings(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Adds the files under dir/relative (recursively) to `out`. */
static em_err list_below(const char *dir, const char *relative, hub_strings *out, int depth) {
    char path[EM_HUB_PATH_MAX];
    if (depth > 32) return em_errorf(EM_ERR_RANGE, "%s/%s: directories nested too deep", dir, relative);
    if ((size_t)snprintf(path, sizeof path, "%s%s%s", dir, relative[0] ? "/" : "", relative) >= sizeof path)
        return em_errorf(EM_ERR_RANGE, "path too long under %s", dir);
    DIR *d = opendir(path);
    if (!d) return em_errorf(errno == ENOENT ? EM_ERR_NOT_FOUND : EM_ERR_IO, "%s: %s", path, strerror(errno));
    em_err err = NULL;
    struct dirent *entry;
    while (!err && (entry = readdir(d))) {
        if (entry->d_name[0] == '.') continue;
        char child[EM_HUB_PATH_MAX], full[EM_HUB_PATH_MAX + 256];
        if ((size_t)snprintf(child, sizeof child, "%s%s%s", relative, relative[0] ? "/" : "", entry->d_name) >=
            sizeof child) {
            err = em_errorf(EM_ERR_RANGE, "path too long under %s", dir);
            break;
        }
        snprintf(full, sizeof full, "%s/%s", dir, child);
        struct stat st;
        if (stat(full, &st) != 0) continue; /* a broken link: its blob is gone */
        if (S_ISDIR(st.st_mode)) err = list_below(dir, child, out, depth + 1);
        else if (S_ISREG(st.st_mode)) err = hub_strings_add(out, child);
    }
    closedir(d);
    return err;
}

em_err hub_list_files(const char *dir, hub_strings *out) {
    em_err err = list_below(dir, "", out, 0);
    if (!err && out->count) qsort(out->items, out->count, sizeof *out->items, compare_strings);
    return err;
}

em_err hub_resolve_cached(const em_hub_options *o, const em_hub_spec *spec, char **path) {
    *path = NULL;
    char repo_dir[EM_HUB_PATH_MAX], commit[128], snapshot[EM_HUB_PATH_MAX];
    struct stat st;
    em_err err = hub_repo_dir(o, spec->repo, repo_dir, sizeof repo_dir);
    if (err) return err;
    if (stat(repo_dir, &st) != 0)
        return em_errorf(EM_ERR_NOT_FOUND, "%s is not in the cache (%s)", spec->repo, repo_dir);
    if ((err = hub_cached_commit(repo_dir, o->revision, commit, sizeof commit))) return em_err_prefix(err, "%s", spec->repo);
    if ((size_t)snprintf(snapshot, sizeof snapshot, "%s/snapshots/%s", repo_dir, commit) >= sizeof snapshot)
        return em_errorf(EM_ERR_RANGE, "path too long: %s/snapshots/%s", repo_dir, commit);
    hub_strings files = {0}, parts = {0};
    size_t first = 0;
    err = hub_list_files(snapshot, &files);
    if (!err) err = em_hub_select(spec, (const char *const *)files.items, files.count, &first);
    if (!err) err = hub_model_parts((const char *const *)files.items, files.count, first, snapshot, &parts);
    if (!err) {
        const size_t len = strlen(snapshot) + strlen(files.items[first]) + 2;
        if ((*path = malloc(len))) snprintf(*path, len, "%s/%s", snapshot, files.items[first]);
        else err = em_errorf(EM_ERR_NOMEM, "out of memory");
    }
    hub_strings_free(&files);
    hub_strings_free(&parts);
    return err;
}
