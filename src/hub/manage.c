/*
 * What the cache holds (hub.h): listing its model repositories and removing them. Both read the
 * layout only (no network), so they see what any tool downloaded. Removal goes by links: a
 * model's links leave every snapshot, then each blob that no remaining link points to is deleted,
 * so files another model or revision shares stay.
 */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../gguf/gguf.h"
#include "internal.h"

/* The bytes of the blobs (finished ones: not *.incomplete) of a repository folder. */
static uint64_t blob_bytes(const char *repo_dir) {
    char dir[EM_HUB_PATH_MAX + 8];
    snprintf(dir, sizeof dir, "%s/blobs", repo_dir);
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t total = 0;
    struct dirent *entry;
    while ((entry = readdir(d))) {
        char path[EM_HUB_PATH_MAX + 300];
        struct stat st;
        const size_t len = strlen(entry->d_name);
        if (entry->d_name[0] == '.' || (len > 11 && !strcmp(entry->d_name + len - 11, ".incomplete"))) continue;
        snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) total += (uint64_t)st.st_size;
    }
    closedir(d);
    return total;
}

/* The snapshot folders (commit hashes) of a repository, sorted. */
static em_err list_snapshots(const char *repo_dir, hub_strings *out) {
    char dir[EM_HUB_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/snapshots", repo_dir);
    DIR *d = opendir(dir);
    if (!d) return NULL; /* a repository with no snapshot yet */
    em_err err = NULL;
    struct dirent *entry;
    while (!err && (entry = readdir(d)))
        if (entry->d_name[0] != '.') err = hub_strings_add(out, entry->d_name);
    closedir(d);
    return err;
}

static uint64_t file_bytes(const char *dir, const char *file) {
    char path[2 * EM_HUB_PATH_MAX];
    struct stat st;
    em_err err = hub_path(path, sizeof path, "%s/%s", dir, file);
    em_err_free(err);
    return !err && stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Adds the models of one snapshot to `repo`, skipping paths it already has. */
static em_err add_snapshot_models(const char *snapshot, em_hub_cached *repo) {
    hub_strings files = {0};
    em_err err = hub_list_files(snapshot, &files);
    for (size_t i = 0; !err && i < files.count; i++) {
        const char *path = files.items[i];
        if (!hub_is_model_file(path)) continue;
        bool seen = false;
        for (size_t m = 0; m < repo->n_models && !seen; m++) seen = !strcmp(repo->models[m].path, path);
        if (seen) continue;
        hub_strings parts = {0};
        uint64_t bytes = 0;
        /* A set with a missing part is listed with the parts present. */
        em_err missing = hub_model_parts((const char *const *)files.items, files.count, i, snapshot, &parts);
        em_err_free(missing);
        for (size_t p = 0; p < parts.count; p++) bytes += file_bytes(snapshot, parts.items[p]);
        uint32_t part = 1, count = 1;
        size_t prefix_len;
        em_gguf_split_name(path, &part, &count, &prefix_len);
        const uint32_t present = (uint32_t)parts.count;
        hub_strings_free(&parts);
        em_hub_cached_file *grown = realloc(repo->models, (repo->n_models + 1) * sizeof *grown);
        if (!grown) {
            err = em_errorf(EM_ERR_NOMEM, "out of memory listing the cache");
            break;
        }
        repo->models = grown;
        repo->models[repo->n_models] =
            (em_hub_cached_file){.path = strdup(path), .bytes = bytes, .parts = count, .parts_present = present};
        if (!repo->models[repo->n_models].path) err = em_errorf(EM_ERR_NOMEM, "out of memory listing the cache");
        else repo->n_models++;
    }
    hub_strings_free(&files);
    return err;
}

/* "models--ORG--NAME" → "ORG/NAME" (the Hub forbids "--" inside a name, so the split is unique). */
static char *repo_of_folder(const char *folder) {
    const char *name = folder + strlen("models--");
    char *repo = malloc(strlen(name) + 1);
    if (!repo) return NULL;
    size_t used = 0;
    for (const char *p = name; *p; p++) {
        if (p[0] == '-' && p[1] == '-') {
            repo[used++] = '/';
            p++;
        } else {
            repo[used++] = *p;
        }
    }
    repo[used] = '\0';
    return repo;
}

static int compare_repos(const void *a, const void *b) {
    return strcmp(((const em_hub_cached *)a)->repo, ((const em_hub_cached *)b)->repo);
}

static em_err describe_repo(const em_hub_options *o, const char *folder, em_hub_cached *out) {
    char repo_dir[EM_HUB_PATH_MAX];
    hub_strings snapshots = {0};
    if ((size_t)snprintf(repo_dir, sizeof repo_dir, "%s/%s", o->cache_dir, folder) >= sizeof repo_dir)
        return em_errorf(EM_ERR_RANGE, "path too long: %s/%s", o->cache_dir, folder);
    if (!(out->repo = repo_of_folder(folder))) return em_errorf(EM_ERR_NOMEM, "out of memory listing the cache");
    out->bytes = blob_bytes(repo_dir);
    em_err err = list_snapshots(repo_dir, &snapshots);
    for (size_t s = 0; !err && s < snapshots.count; s++) {
        char snapshot[2 * EM_HUB_PATH_MAX];
        snprintf(snapshot, sizeof snapshot, "%s/snapshots/%s", repo_dir, snapshots.items[s]);
        err = add_snapshot_models(snapshot, out);
    }
    hub_strings_free(&snapshots);
    return err;
}

em_err em_hub_list(const em_hub_options *o, em_hub_cached **repos, size_t *n_repos) {
    *repos = NULL;
    *n_repos = 0;
    DIR *d = opendir(o->cache_dir);
    if (!d) return errno == ENOENT ? NULL : em_errorf(EM_ERR_IO, "%s: %s", o->cache_dir, strerror(errno));
    em_err err = NULL;
    struct dirent *entry;
    while (!err && (entry = readdir(d))) {
        if (strncmp(entry->d_name, "models--", 8) || !entry->d_name[8]) continue;
        em_hub_cached *grown = realloc(*repos, (*n_repos + 1) * sizeof *grown);
        if (!grown) {
            err = em_errorf(EM_ERR_NOMEM, "out of memory listing the cache");
            break;
        }
        *repos = grown;
        memset(&grown[*n_repos], 0, sizeof *grown);
        err = describe_repo(o, entry->d_name, &grown[*n_repos]);
        (*n_repos)++;
    }
    closedir(d);
    if (err) {
        em_hub_cached_free(*repos, *n_repos);
        *repos = NULL;
        *n_repos = 0;
        return err;
    }
    if (*n_repos) qsort(*repos, *n_repos, sizeof **repos, compare_repos);
    return NULL;
}

void em_hub_cached_free(em_hub_cached *repos, size_t n_repos) {
    for (size_t r = 0; r < n_repos; r++) {
        for (size_t m = 0; m < repos[r].n_models; m++) free(repos[r].models[m].path);
        free(repos[r].models);
        free(repos[r].repo);
    }
    free(repos);
}

/* ---- removal ---- */

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

/* rm -r, never following links. */
static em_err remove_tree(const char *path) {
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        return em_errorf(EM_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return NULL;
}

/* The repository's folder and its lock folder. */
static em_err remove_repository(const em_hub_options *o, const char *repo, const char *repo_dir) {
    char locks[EM_HUB_PATH_MAX], folder[300];
    em_hub_repo_folder(repo, folder, sizeof folder);
    em_err err = hub_path(locks, sizeof locks, "%s/.locks/%s", o->cache_dir, folder);
    if (!err) err = remove_tree(repo_dir);
    return err ? err : remove_tree(locks);
}

/* Removes the links of the model `spec` names from one snapshot; *matched says whether it had it. */
static em_err unlink_model(const char *snapshot, const em_hub_spec *spec, bool *matched) {
    hub_strings files = {0}, parts = {0};
    size_t first;
    *matched = false;
    em_err err = hub_list_files(snapshot, &files);
    if (!err) {
        err = em_hub_select(spec, (const char *const *)files.items, files.count, &first);
        if (err && em_err_code_of(err) == EM_ERR_NOT_FOUND) { /* not in this snapshot */
            em_err_free(err);
            hub_strings_free(&files);
            return NULL;
        }
    }
    if (!err) {
        /* A set with a missing part: remove the parts there are. */
        em_err_free(hub_model_parts((const char *const *)files.items, files.count, first, snapshot, &parts));
        *matched = true;
    }
    for (size_t p = 0; !err && p < parts.count; p++) {
        char path[2 * EM_HUB_PATH_MAX];
        if ((err = hub_path(path, sizeof path, "%s/%s", snapshot, parts.items[p]))) break;
        if (unlink(path) != 0 && errno != ENOENT) err = em_errorf(EM_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
        /* Folders the model alone used go with it (rmdir leaves any that are not empty). */
        for (char *slash = strrchr(path, '/'); slash && slash > path + strlen(snapshot); slash = strrchr(path, '/')) {
            *slash = '\0';
            if (rmdir(path) != 0) break;
        }
    }
    hub_strings_free(&files);
    hub_strings_free(&parts);
    return err;
}

/* Adds the blob names the links under `snapshot` point to. */
static em_err add_linked_blobs(const char *snapshot, hub_strings *blobs, size_t *n_files) {
    hub_strings files = {0};
    em_err err = hub_list_files(snapshot, &files);
    for (size_t i = 0; !err && i < files.count; i++) {
        char path[2 * EM_HUB_PATH_MAX], target[EM_HUB_PATH_MAX];
        if ((err = hub_path(path, sizeof path, "%s/%s", snapshot, files.items[i]))) break;
        const ssize_t len = readlink(path, target, sizeof target - 1);
        (*n_files)++;
        if (len <= 0) continue; /* a plain file: it holds its own bytes */
        target[len] = '\0';
        const char *base = strrchr(target, '/');
        err = hub_strings_add(blobs, base ? base + 1 : target);
    }
    hub_strings_free(&files);
    return err;
}

/* Deletes the blobs no link uses; adds their bytes to *freed. */
static em_err remove_unlinked_blobs(const char *repo_dir, const hub_strings *linked, uint64_t *freed) {
    char dir[EM_HUB_PATH_MAX + 8];
    snprintf(dir, sizeof dir, "%s/blobs", repo_dir);
    DIR *d = opendir(dir);
    if (!d) return NULL;
    em_err err = NULL;
    struct dirent *entry;
    while (!err && (entry = readdir(d))) {
        if (entry->d_name[0] == '.') continue;
        bool used = false;
        for (size_t i = 0; i < linked->count && !used; i++) used = !strcmp(linked->items[i], entry->d_name);
        if (used) continue;
        char path[EM_HUB_PATH_MAX + 300];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (unlink(path) != 0) err = em_errorf(EM_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
        else *freed += (uint64_t)st.st_size;
    }
    closedir(d);
    return err;
}

/* Removes one model's links from every snapshot, then the blobs nothing links to any more. */
static em_err remove_model(const em_hub_options *o, const em_hub_spec *spec, const char *text, const char *repo_dir,
                           uint64_t *freed) {
    hub_strings snapshots = {0}, linked = {0};
    bool any = false;
    size_t remaining = 0;
    em_err err = list_snapshots(repo_dir, &snapshots);
    for (size_t s = 0; !err && s < snapshots.count; s++) {
        char snapshot[2 * EM_HUB_PATH_MAX];
        bool matched;
        snprintf(snapshot, sizeof snapshot, "%s/snapshots/%s", repo_dir, snapshots.items[s]);
        if (!(err = unlink_model(snapshot, spec, &matched))) any = any || matched;
    }
    if (!err && !any) err = em_errorf(EM_ERR_NOT_FOUND, "no model in the cache matches %s", text);
    for (size_t s = 0; !err && s < snapshots.count; s++) {
        char snapshot[2 * EM_HUB_PATH_MAX];
        snprintf(snapshot, sizeof snapshot, "%s/snapshots/%s", repo_dir, snapshots.items[s]);
        err = add_linked_blobs(snapshot, &linked, &remaining);
    }
    if (!err) err = remove_unlinked_blobs(repo_dir, &linked, freed);
    /* Nothing left: the repository goes, refs and locks included. */
    if (!err && remaining == 0) err = remove_repository(o, spec->repo, repo_dir);
    hub_strings_free(&snapshots);
    hub_strings_free(&linked);
    return err;
}

em_err em_hub_remove(const em_hub_options *o, const char *text, uint64_t *freed) {
    *freed = 0;
    em_hub_spec spec;
    char repo_dir[EM_HUB_PATH_MAX];
    struct stat st;
    em_err err = em_hub_spec_parse(text, &spec);
    if (!err) err = hub_repo_dir(o, spec.repo, repo_dir, sizeof repo_dir);
    if (err) return err;
    if (lstat(repo_dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return em_errorf(EM_ERR_NOT_FOUND, "%s is not in the cache (%s)", spec.repo, o->cache_dir);
    if (spec.quant[0] || spec.file[0]) return remove_model(o, &spec, text, repo_dir, freed);
    *freed = blob_bytes(repo_dir);
    return remove_repository(o, spec.repo, repo_dir);
}
