/*
 * The prefix cache's disk tier (engine.h, "Prefix cache tiers"): the files, their checks and the
 * directory they live in.
 *
 * Layout: DIR/<identity>/slot-N/, where <identity> is the first 16 hex digits of the model's KV
 * identity (em_disk_identity), so different models or KV layouts never share files, and N is the
 * first slot whose lock file this process could lock (flock, released when the process ends, even
 * by a crash): two servers on one directory write to different slots, and a restarted server takes
 * a slot back with what its predecessor left there. Nothing outside its own slot is ever written.
 *
 * A file is one node of the prefix tree, named <key>.kv: a fixed header (magic, format version,
 * identity, the node's key and its parent's, block size, row bytes, token count, payload bytes),
 * the node's tokens, its rows as the backend's kv_save wrote them, and a SHA-256 of all of that.
 * It is written under a temporary name and renamed, so a reader never sees half a file under a
 * real name; one left behind by a crash is removed at start-up. The index at start-up reads only
 * headers and tokens and checks sizes (a truncated file is found there); the checksum is checked
 * when a file is read back, so a corrupt one is found before its rows reach the pool. Files are in
 * the machine's byte order; the magic, read as a number, tells another one.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "engine.h"

#define DISK_FORMAT_VERSION 1
#define DISK_MAX_SLOTS 64
#define DISK_DEFAULT_LIMIT ((uint64_t)16 << 30)
static const char disk_magic[8] = {'E', 'M', 'B', 'E', 'R', 'K', 'V', '\n'};

typedef struct disk_header {
    char magic[8];
    uint32_t version;
    uint32_t header_bytes;
    uint8_t identity[32];
    uint8_t key[EM_PREFIX_KEY_BYTES];
    uint8_t parent[EM_PREFIX_KEY_BYTES];
    uint32_t block_tokens;
    uint32_t n_tokens;
    uint64_t row_bytes;
    uint64_t payload_bytes;
} disk_header;
_Static_assert(sizeof(disk_header) == 104, "the disk header has no padding");

struct em_disk_tier {
    char *dir; /* DIR/<identity>/slot-N */
    int lock_fd;
    uint8_t identity[32];
    uint32_t block_tokens;
    uint64_t row_bytes;
    uint64_t limit;
};

/* ---- Hashing (libcrypto's SHA-256) ---- */

typedef struct hasher {
    EVP_MD_CTX *ctx;
} hasher;

static bool hash_begin(hasher *h) {
    h->ctx = EVP_MD_CTX_new();
    return h->ctx && EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) == 1;
}

static void hash_add(hasher *h, const void *data, size_t n) {
    if (h->ctx && n) EVP_DigestUpdate(h->ctx, data, n);
}

static bool hash_end(hasher *h, uint8_t out[32]) {
    unsigned int len = 0;
    bool ok = h->ctx && EVP_DigestFinal_ex(h->ctx, out, &len) == 1 && len == 32;
    EVP_MD_CTX_free(h->ctx);
    h->ctx = NULL;
    return ok;
}

void em_disk_key(const uint8_t parent[EM_PREFIX_KEY_BYTES], const int32_t *tokens, uint32_t n,
                 uint8_t out[EM_PREFIX_KEY_BYTES]) {
    hasher h;
    uint8_t digest[32] = {0};
    bool ok = hash_begin(&h);
    hash_add(&h, parent, EM_PREFIX_KEY_BYTES);
    hash_add(&h, tokens, n * sizeof *tokens);
    ok = hash_end(&h, digest) && ok;
    /* Without libcrypto's digest (out of memory) the key is all ones: never a file's, never the root's. */
    if (!ok) memset(digest, 0xff, sizeof digest);
    memcpy(out, digest, EM_PREFIX_KEY_BYTES);
}

static void hex(const uint8_t *bytes, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", bytes[i]);
}

/* A cache file's checksum: SHA-256 over its header, tokens and rows (the header says how many).
 * False when SHA-256 failed. */
static bool file_checksum(const disk_header *header, const int32_t *tokens, const void *rows, uint8_t out[32]) {
    hasher h;
    bool ok = hash_begin(&h);
    hash_add(&h, header, sizeof *header);
    hash_add(&h, tokens, header->n_tokens * sizeof *tokens);
    hash_add(&h, rows, header->payload_bytes);
    return hash_end(&h, out) && ok;
}

/* Up to 256 bytes at three places of each tensor's data: two files whose weights differ anywhere
 * much differ there, and reading them costs nothing next to loading the model. */
static void hash_tensor(hasher *h, const em_gguf_tensor *t) {
    hash_add(h, t->name.ptr, t->name.len);
    hash_add(h, &t->type, sizeof t->type);
    hash_add(h, t->ne, sizeof t->ne);
    hash_add(h, &t->size, sizeof t->size);
    if (!t->data || !t->size) return;
    const uint64_t window = t->size < 256 ? t->size : 256;
    const uint64_t at[3] = {0, (t->size - window) / 2, t->size - window};
    for (int i = 0; i < 3; i++) hash_add(h, (const uint8_t *)t->data + at[i], window);
}

em_err em_disk_identity(const em_model *model, const em_backend *backend, uint8_t out[32]) {
    const em_gguf *gguf = model->gguf;
    if (!gguf) return em_errorf(EM_ERR_INVALID, "cache identity: the model was not opened from a file");
    hasher h;
    if (!hash_begin(&h)) return em_errorf(EM_ERR_NOMEM, "cache identity: no SHA-256 context");
    const uint32_t version = DISK_FORMAT_VERSION;
    hash_add(&h, &version, sizeof version);
    /* The header and metadata as stored (the file's own bytes, as `ember serve` digests them). */
    FILE *f = fopen(em_gguf_path(gguf), "rb");
    uint64_t left = em_gguf_data_offset(gguf);
    char chunk[65536];
    while (f && left) {
        size_t want = left < sizeof chunk ? (size_t)left : sizeof chunk;
        if (fread(chunk, 1, want, f) != want) break;
        hash_add(&h, chunk, want);
        left -= want;
    }
    if (f) fclose(f);
    if (left) {
        hash_end(&h, out);
        return em_errorf(EM_ERR_IO, "cache identity: cannot read the metadata of %s", em_gguf_path(gguf));
    }
    for (uint32_t p = 0; p < (model->n_parts ? model->n_parts : 1); p++) {
        const em_gguf *part = model->n_parts ? model->parts[p] : gguf;
        for (uint64_t i = 0; i < em_gguf_tensor_count(part); i++) hash_tensor(&h, em_gguf_tensor_at(part, i));
    }
    const char *format = backend->ops->kv_format ? backend->ops->kv_format : "";
    hash_add(&h, format, strlen(format) + 1);
    hash_add(&h, &backend->kv_bytes_per_token, sizeof backend->kv_bytes_per_token);
    hash_add(&h, &backend->block_tokens, sizeof backend->block_tokens);
    if (!hash_end(&h, out)) return em_errorf(EM_ERR_NOMEM, "cache identity: SHA-256 failed");
    return NULL;
}

/* ---- The slot ---- */

static em_err make_dir(const char *path) {
    if (mkdir(path, 0755) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return NULL;
        return em_errorf(EM_ERR_IO, "%s: not a directory", path);
    }
    return em_errorf(EM_ERR_IO, "%s: cannot create the directory: %s", path, strerror(errno));
}

/* The default bound: half the free space of the file system, at most DISK_DEFAULT_LIMIT. */
static uint64_t default_limit(const char *dir) {
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) return DISK_DEFAULT_LIMIT;
    uint64_t half = (uint64_t)vfs.f_bavail * vfs.f_frsize / 2;
    return half < DISK_DEFAULT_LIMIT ? half : DISK_DEFAULT_LIMIT;
}

em_err em_disk_open(const char *dir, const uint8_t identity[32], uint32_t block_tokens, uint64_t row_bytes,
                    uint64_t limit, em_disk_tier **out) {
    *out = NULL;
    if (!dir || !*dir) return em_errorf(EM_ERR_INVALID, "cache directory: empty path");
    char id[17];
    hex(identity, 8, id);
    const size_t len = strlen(dir) + 64;
    char *model_dir = malloc(len), *slot = malloc(len), *lock = malloc(len);
    em_disk_tier *d = calloc(1, sizeof *d);
    em_err err = !model_dir || !slot || !lock || !d ? em_errorf(EM_ERR_NOMEM, "cache directory: out of memory") : NULL;
    if (!err) err = make_dir(dir);
    if (!err) {
        snprintf(model_dir, len, "%s/%s", dir, id);
        err = make_dir(model_dir);
    }
    int fd = -1;
    for (int n = 0; !err && n < DISK_MAX_SLOTS && fd < 0; n++) {
        snprintf(slot, len, "%s/slot-%d", model_dir, n);
        snprintf(lock, len, "%s/lock", slot);
        if ((err = make_dir(slot))) break;
        fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            err = em_errorf(EM_ERR_IO, "%s: cannot create the lock file: %s", lock, strerror(errno));
            break;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) { /* another process holds this slot */
            close(fd);
            fd = -1;
        }
    }
    if (!err && fd < 0)
        err = em_errorf(EM_ERR_IO, "%s: all %d slots are held by other processes", model_dir, DISK_MAX_SLOTS);
    free(model_dir);
    free(lock);
    if (err) {
        free(slot);
        free(d);
        return err;
    }
    *d = (em_disk_tier){.dir = slot, .lock_fd = fd, .block_tokens = block_tokens, .row_bytes = row_bytes,
                        .limit = limit ? limit : default_limit(dir)};
    memcpy(d->identity, identity, sizeof d->identity);
    *out = d;
    return NULL;
}

void em_disk_close(em_disk_tier *d) {
    if (!d) return;
    if (d->lock_fd >= 0) close(d->lock_fd); /* releases the slot */
    free(d->dir);
    free(d);
}

const char *em_disk_dir(const em_disk_tier *d) { return d->dir; }
uint64_t em_disk_limit(const em_disk_tier *d) { return d->limit; }

/* DIR/slot-N/<32 hex digits>.kv, with `suffix` after it ("" or ".tmp"). */
static char *file_path(const em_disk_tier *d, const uint8_t key[EM_PREFIX_KEY_BYTES], const char *suffix) {
    char name[2 * EM_PREFIX_KEY_BYTES + 1];
    hex(key, EM_PREFIX_KEY_BYTES, name);
    size_t len = strlen(d->dir) + sizeof name + 16;
    char *path = malloc(len);
    if (path) snprintf(path, len, "%s/%s.kv%s", d->dir, name, suffix);
    return path;
}

static uint64_t file_size(uint32_t n_tokens, uint64_t payload) {
    return sizeof(disk_header) + (uint64_t)n_tokens * sizeof(int32_t) + payload + 32;
}

/* ---- Writing ---- */

static bool write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = ENOSPC;
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

em_err em_disk_write(em_disk_tier *d, const uint8_t key[EM_PREFIX_KEY_BYTES], const uint8_t parent[EM_PREFIX_KEY_BYTES],
                     const int32_t *tokens, uint32_t n_tokens, const void *rows, uint64_t *file_bytes) {
    disk_header header = {.version = DISK_FORMAT_VERSION, .header_bytes = sizeof header,
                          .block_tokens = d->block_tokens, .n_tokens = n_tokens, .row_bytes = d->row_bytes,
                          .payload_bytes = n_tokens * d->row_bytes};
    memcpy(header.magic, disk_magic, sizeof disk_magic);
    memcpy(header.identity, d->identity, sizeof header.identity);
    memcpy(header.key, key, EM_PREFIX_KEY_BYTES);
    memcpy(header.parent, parent, EM_PREFIX_KEY_BYTES);
    uint8_t sum[32];
    const bool hashed = file_checksum(&header, tokens, rows, sum);
    char *tmp = file_path(d, key, ".tmp"), *path = file_path(d, key, "");
    em_err err = !hashed || !tmp || !path ? em_errorf(EM_ERR_NOMEM, "cache file: out of memory") : NULL;
    int fd = err ? -1 : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (!err && fd < 0) err = em_errorf(EM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    if (!err && !(write_all(fd, &header, sizeof header) && write_all(fd, tokens, n_tokens * sizeof *tokens) &&
                  write_all(fd, rows, header.payload_bytes) && write_all(fd, sum, sizeof sum)))
        err = em_errorf(EM_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && !err) err = em_errorf(EM_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    if (!err && rename(tmp, path) != 0) err = em_errorf(EM_ERR_IO, "%s: cannot rename: %s", tmp, strerror(errno));
    if (err && tmp) unlink(tmp);
    free(tmp);
    free(path);
    if (!err) *file_bytes = file_size(n_tokens, header.payload_bytes);
    return err;
}

/* ---- Reading ---- */

static bool read_all(int fd, void *data, size_t n) {
    char *p = data;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

/* Checks a header against the slot, the file's name and its size; NULL when it belongs. */
static em_err check_header(const em_disk_tier *d, const char *path, const disk_header *h,
                           const uint8_t key[EM_PREFIX_KEY_BYTES], uint64_t size) {
    if (memcmp(h->magic, disk_magic, sizeof disk_magic))
        return em_errorf(EM_ERR_FORMAT, "%s: not an Ember KV cache file (magic)", path);
    if (h->version != DISK_FORMAT_VERSION || h->header_bytes != sizeof *h)
        return em_errorf(EM_ERR_FORMAT, "%s: format version %u, this build reads %u", path, h->version,
                         DISK_FORMAT_VERSION);
    if (memcmp(h->identity, d->identity, sizeof h->identity))
        return em_errorf(EM_ERR_FORMAT, "%s: written for another model or KV layout (identity)", path);
    if (memcmp(h->key, key, EM_PREFIX_KEY_BYTES))
        return em_errorf(EM_ERR_FORMAT, "%s: its key does not match its name", path);
    if (h->block_tokens != d->block_tokens || h->row_bytes != d->row_bytes)
        return em_errorf(EM_ERR_FORMAT, "%s: blocks of %u positions of %llu bytes, not %u of %llu", path,
                         h->block_tokens, (unsigned long long)h->row_bytes, d->block_tokens,
                         (unsigned long long)d->row_bytes);
    if (h->n_tokens == 0 || h->n_tokens > d->block_tokens || h->payload_bytes != h->n_tokens * d->row_bytes)
        return em_errorf(EM_ERR_FORMAT, "%s: %u tokens and %llu bytes of rows do not make a block", path, h->n_tokens,
                         (unsigned long long)h->payload_bytes);
    if (size != file_size(h->n_tokens, h->payload_bytes))
        return em_errorf(EM_ERR_FORMAT, "%s: %llu bytes where its header says %llu (truncated or torn)", path,
                         (unsigned long long)size, (unsigned long long)file_size(h->n_tokens, h->payload_bytes));
    return NULL;
}

/* Opens a file and checks its header; on success the descriptor stands after the header. */
static em_err open_checked(const em_disk_tier *d, const char *path, const uint8_t key[EM_PREFIX_KEY_BYTES],
                           disk_header *h, int *fd_out) {
    *fd_out = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return em_errorf(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    em_err err = NULL;
    if (fstat(fd, &st) != 0) err = em_errorf(EM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if ((uint64_t)st.st_size < sizeof *h || !read_all(fd, h, sizeof *h))
        err = em_errorf(EM_ERR_FORMAT, "%s: %lld bytes, shorter than a header (truncated)", path, (long long)st.st_size);
    else err = check_header(d, path, h, key, (uint64_t)st.st_size);
    if (err) {
        close(fd);
        return err;
    }
    *fd_out = fd;
    return NULL;
}

em_err em_disk_read(em_disk_tier *d, const uint8_t key[EM_PREFIX_KEY_BYTES], const int32_t *tokens,
                    uint32_t n_tokens, void *rows) {
    char *path = file_path(d, key, "");
    int32_t *stored = malloc(d->block_tokens * sizeof *stored);
    disk_header h;
    int fd = -1;
    em_err err = !path || !stored ? em_errorf(EM_ERR_NOMEM, "cache file: out of memory") : NULL;
    if (!err) err = open_checked(d, path, key, &h, &fd);
    if (!err && h.n_tokens != n_tokens) err = em_errorf(EM_ERR_FORMAT, "%s: %u tokens, not %u", path, h.n_tokens, n_tokens);
    uint8_t sum[32], want[32];
    if (!err && !(read_all(fd, stored, n_tokens * sizeof *stored) && read_all(fd, rows, h.payload_bytes) &&
                  read_all(fd, want, sizeof want)))
        err = em_errorf(EM_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if (!err && memcmp(stored, tokens, n_tokens * sizeof *tokens))
        err = em_errorf(EM_ERR_FORMAT, "%s: its tokens are not the node's", path);
    if (!err) {
        if (!file_checksum(&h, stored, rows, sum)) err = em_errorf(EM_ERR_NOMEM, "%s: SHA-256 failed", path);
        else if (memcmp(sum, want, sizeof sum)) err = em_errorf(EM_ERR_FORMAT, "%s: checksum mismatch (corrupt)", path);
    }
    if (fd >= 0) close(fd);
    free(path);
    free(stored);
    return err;
}

void em_disk_remove(em_disk_tier *d, const uint8_t key[EM_PREFIX_KEY_BYTES]) {
    char *path = file_path(d, key, "");
    if (path) unlink(path);
    free(path);
}

uint64_t em_disk_file_bytes(const em_disk_tier *d, uint32_t n_tokens) {
    return file_size(n_tokens, n_tokens * d->row_bytes);
}

/* ---- The index at start-up ---- */

static bool parse_key(const char *name, uint8_t key[EM_PREFIX_KEY_BYTES]) {
    if (strlen(name) != 2 * EM_PREFIX_KEY_BYTES + 3 || strcmp(name + 2 * EM_PREFIX_KEY_BYTES, ".kv")) return false;
    for (int i = 0; i < EM_PREFIX_KEY_BYTES; i++) {
        unsigned v;
        if (sscanf(name + 2 * i, "%2x", &v) != 1 || !strchr("0123456789abcdef", name[2 * i]) ||
            !strchr("0123456789abcdef", name[2 * i + 1]))
            return false;
        key[i] = (uint8_t)v;
    }
    return true;
}

/* One file of the slot: an entry when it belongs, else why not. */
static em_err index_file(em_disk_tier *d, const char *name, em_disk_entry *e) {
    size_t len = strlen(d->dir) + strlen(name) + 2;
    char *path = malloc(len);
    if (!path) return em_errorf(EM_ERR_NOMEM, "cache index: out of memory");
    snprintf(path, len, "%s/%s", d->dir, name);
    em_err err = NULL;
    *e = (em_disk_entry){0};
    disk_header h;
    int fd = -1;
    if (!parse_key(name, e->key)) err = em_errorf(EM_ERR_FORMAT, "%s: not a cache file's name", path);
    if (!err) err = open_checked(d, path, e->key, &h, &fd);
    if (!err && !(e->tokens = malloc(h.n_tokens * sizeof *e->tokens))) err = em_errorf(EM_ERR_NOMEM, "cache index: out of memory");
    if (!err && !read_all(fd, e->tokens, h.n_tokens * sizeof *e->tokens))
        err = em_errorf(EM_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if (!err) {
        uint8_t key[EM_PREFIX_KEY_BYTES];
        em_disk_key(h.parent, e->tokens, h.n_tokens, key);
        if (memcmp(key, e->key, sizeof key)) err = em_errorf(EM_ERR_FORMAT, "%s: its key is not its tokens' (corrupt)", path);
    }
    struct stat st;
    if (!err && fstat(fd, &st) == 0) e->modified_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if (fd >= 0) close(fd);
    if (err) {
        free(e->tokens);
        e->tokens = NULL;
        unlink(path); /* this process holds the slot: what does not belong in it goes */
    } else {
        memcpy(e->parent, h.parent, sizeof e->parent);
        e->n_tokens = h.n_tokens;
        e->file_bytes = file_size(h.n_tokens, h.payload_bytes);
    }
    free(path);
    return err;
}

em_err em_disk_index(em_disk_tier *d, em_disk_entry **entries, size_t *n, uint64_t *skipped) {
    *entries = NULL;
    *n = 0;
    DIR *dir = opendir(d->dir);
    if (!dir) return em_errorf(EM_ERR_IO, "%s: cannot list: %s", d->dir, strerror(errno));
    size_t cap = 0;
    em_err fatal = NULL;
    struct dirent *ent;
    while (!fatal && (ent = readdir(dir))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..") || !strcmp(ent->d_name, "lock")) continue;
        if (*n == cap) {
            size_t grown_cap = cap ? 2 * cap : 64;
            em_disk_entry *grown = realloc(*entries, grown_cap * sizeof *grown);
            if (!grown) {
                fatal = em_errorf(EM_ERR_NOMEM, "cache index: out of memory");
                break;
            }
            *entries = grown, cap = grown_cap;
        }
        em_err err = index_file(d, ent->d_name, &(*entries)[*n]);
        if (!err) {
            (*n)++;
        } else if (em_err_code_of(err) == EM_ERR_NOMEM) {
            fatal = err;
        } else {
            em_log(EM_LOG_WARN, "cache file skipped and removed: %s", em_err_message(err));
            em_err_free(err);
            (*skipped)++;
        }
    }
    closedir(dir);
    if (fatal) {
        em_disk_entries_free(*entries, *n);
        *entries = NULL;
        *n = 0;
    }
    return fatal;
}

void em_disk_entries_free(em_disk_entry *entries, size_t n) {
    for (size_t i = 0; i < n; i++) free(entries[i].tokens);
    free(entries);
}
