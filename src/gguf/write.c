/*
 * GGUF writer (gguf.h). Metadata is serialized into a byte buffer as it is added, in the final
 * on-disk encoding, so writing the header is one copy. Tensors are kept as a list of infos with
 * borrowed or copied data; their offsets are assigned at write time, each aligned, in the order
 * added, with zero padding after every tensor — the canonical GGUF layout.
 */
#include "gguf.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../quant/quant.h"

typedef struct writer_tensor {
    char *name;
    uint32_t n_dims;
    uint64_t ne[EM_GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t size;
    const void *data;
    void *owned; /* copy of data when the caller asked for one */
} writer_tensor;

struct em_gguf_writer {
    uint32_t version;
    uint32_t alignment;
    uint8_t *meta; /* serialized metadata entries */
    size_t meta_len, meta_cap;
    uint64_t kv_count;
    writer_tensor *tensors;
    uint64_t tensor_count, tensor_cap;
};

em_err em_gguf_writer_new(uint32_t version, em_gguf_writer **out) {
    *out = NULL;
    if (version != 2 && version != 3) return em_errorf(EM_ERR_INVALID, "GGUF writer: version %u (2 or 3)", version);
    em_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return em_errorf(EM_ERR_NOMEM, "GGUF writer: out of memory");
    w->version = version;
    w->alignment = EM_GGUF_DEFAULT_ALIGNMENT;
    *out = w;
    return NULL;
}

void em_gguf_writer_free(em_gguf_writer *w) {
    if (!w) return;
    for (uint64_t i = 0; i < w->tensor_count; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].owned);
    }
    free(w->tensors);
    free(w->meta);
    free(w);
}

static em_err append(em_gguf_writer *w, const void *bytes, size_t n) {
    if (w->meta_len + n > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap < w->meta_len + n) cap *= 2;
        uint8_t *grown = realloc(w->meta, cap);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "GGUF writer: out of memory for %zu bytes of metadata", cap);
        w->meta = grown;
        w->meta_cap = cap;
    }
    if (n) memcpy(w->meta + w->meta_len, bytes, n);
    w->meta_len += n;
    return NULL;
}

static em_err append_le(em_gguf_writer *w, uint64_t v, size_t size) {
    uint8_t bytes[8];
    for (size_t i = 0; i < size; i++) bytes[i] = (uint8_t)(v >> (8 * i));
    return append(w, bytes, size);
}

static em_err append_string(em_gguf_writer *w, const char *s, uint64_t len) {
    em_err err = append_le(w, len, 8);
    return err ? err : append(w, s, (size_t)len);
}

/* Starts an entry: key and type. */
static em_err begin_kv(em_gguf_writer *w, const char *key, em_gguf_type type) {
    em_err err = append_string(w, key, strlen(key));
    if (!err) err = append_le(w, type, 4);
    if (!err) w->kv_count++;
    return err;
}

static em_err add_scalar(em_gguf_writer *w, const char *key, em_gguf_type type, uint64_t bits) {
    em_err err = begin_kv(w, key, type);
    return err ? err : append_le(w, bits, em_gguf_type_size(type));
}

em_err em_gguf_writer_add_u8(em_gguf_writer *w, const char *key, uint8_t v) {
    return add_scalar(w, key, EM_GGUF_UINT8, v);
}

em_err em_gguf_writer_add_u16(em_gguf_writer *w, const char *key, uint16_t v) {
    return add_scalar(w, key, EM_GGUF_UINT16, v);
}

em_err em_gguf_writer_add_u32(em_gguf_writer *w, const char *key, uint32_t v) {
    if (!strcmp(key, "general.alignment")) {
        if (v == 0 || (v & (v - 1))) return em_errorf(EM_ERR_INVALID, "GGUF writer: alignment %u is not a power of two", v);
        w->alignment = v;
    }
    return add_scalar(w, key, EM_GGUF_UINT32, v);
}

em_err em_gguf_writer_add_i32(em_gguf_writer *w, const char *key, int32_t v) {
    return add_scalar(w, key, EM_GGUF_INT32, (uint32_t)v);
}

em_err em_gguf_writer_add_u64(em_gguf_writer *w, const char *key, uint64_t v) {
    return add_scalar(w, key, EM_GGUF_UINT64, v);
}

em_err em_gguf_writer_add_f32(em_gguf_writer *w, const char *key, float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return add_scalar(w, key, EM_GGUF_FLOAT32, bits);
}

em_err em_gguf_writer_add_bool(em_gguf_writer *w, const char *key, bool v) {
    return add_scalar(w, key, EM_GGUF_BOOL, v ? 1 : 0);
}

em_err em_gguf_writer_add_strn(em_gguf_writer *w, const char *key, const char *v, uint64_t len) {
    em_err err = begin_kv(w, key, EM_GGUF_STRING);
    return err ? err : append_string(w, v, len);
}

em_err em_gguf_writer_add_str(em_gguf_writer *w, const char *key, const char *v) {
    return em_gguf_writer_add_strn(w, key, v, strlen(v));
}

em_err em_gguf_writer_add_array(em_gguf_writer *w, const char *key, em_gguf_type element_type, const void *elements,
                                uint64_t count) {
    size_t size = em_gguf_type_size(element_type);
    if (size == 0)
        return em_errorf(EM_ERR_INVALID, "GGUF writer: key '%s': array of %s needs the string-array call", key,
                         em_gguf_type_name(element_type));
    em_err err = begin_kv(w, key, EM_GGUF_ARRAY);
    if (!err) err = append_le(w, element_type, 4);
    if (!err) err = append_le(w, count, 8);
    /* Elements are given in host order; GGUF is little-endian, which every supported host is. */
    if (!err) err = append(w, elements, (size_t)(count * size));
    return err;
}

em_err em_gguf_writer_add_str_array(em_gguf_writer *w, const char *key, const char *const *strings,
                                    const uint64_t *lengths, uint64_t count) {
    em_err err = begin_kv(w, key, EM_GGUF_ARRAY);
    if (!err) err = append_le(w, EM_GGUF_STRING, 4);
    if (!err) err = append_le(w, count, 8);
    for (uint64_t i = 0; i < count && !err; i++)
        err = append_string(w, strings[i], lengths ? lengths[i] : strlen(strings[i]));
    return err;
}

em_err em_gguf_writer_copy_kv(em_gguf_writer *w, const em_gguf_kv *kv) {
    char *key = em_str_dup(kv->key);
    if (!key) return em_errorf(EM_ERR_NOMEM, "GGUF writer: out of memory");
    em_err err;
    if (kv->type == EM_GGUF_STRING) {
        err = em_gguf_writer_add_strn(w, key, kv->strings[0].ptr, kv->strings[0].len);
    } else if (kv->type != EM_GGUF_ARRAY) {
        err = begin_kv(w, key, kv->type);
        if (!err) err = append(w, kv->data, em_gguf_type_size(kv->type));
        if (!err && kv->type == EM_GGUF_UINT32 && !strcmp(key, "general.alignment"))
            w->alignment = (uint32_t)em_gguf_kv_int(kv);
    } else {
        err = begin_kv(w, key, EM_GGUF_ARRAY);
        if (!err) err = append_le(w, kv->array_type, 4);
        if (!err) err = append_le(w, kv->array_len, 8);
        if (kv->array_type == EM_GGUF_STRING) {
            for (uint64_t i = 0; i < kv->array_len && !err; i++)
                err = append_string(w, kv->strings[i].ptr, kv->strings[i].len);
        } else if (!err) {
            err = append(w, kv->data, (size_t)(kv->array_len * em_gguf_type_size(kv->array_type)));
        }
    }
    free(key);
    return err;
}

em_err em_gguf_writer_add_tensor(em_gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *ne,
                                 uint32_t type, const void *data, bool copy) {
    if (n_dims == 0 || n_dims > EM_GGUF_MAX_DIMS)
        return em_errorf(EM_ERR_INVALID, "GGUF writer: tensor '%s': %u dimensions", name, n_dims);
    writer_tensor t = {.n_dims = n_dims, .type = type};
    uint64_t rows = 1, row_bytes;
    for (uint32_t d = 0; d < EM_GGUF_MAX_DIMS; d++) t.ne[d] = d < n_dims ? ne[d] : 1;
    for (uint32_t d = 1; d < n_dims; d++)
        if (em_mul_overflows(rows, ne[d], &rows))
            return em_errorf(EM_ERR_INVALID, "GGUF writer: tensor '%s': size overflows", name);
    em_err err = em_type_row_bytes(type, ne[0], &row_bytes);
    if (err) return em_err_prefix(err, "GGUF writer: tensor '%s'", name);
    if (em_mul_overflows(row_bytes, rows, &t.size))
        return em_errorf(EM_ERR_INVALID, "GGUF writer: tensor '%s': size overflows", name);
    if (w->tensor_count == w->tensor_cap) {
        uint64_t cap = w->tensor_cap ? 2 * w->tensor_cap : 64;
        writer_tensor *grown = realloc(w->tensors, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "GGUF writer: out of memory for tensor '%s'", name);
        w->tensors = grown;
        w->tensor_cap = cap;
    }
    t.name = strdup(name);
    if (!t.name) return em_errorf(EM_ERR_NOMEM, "GGUF writer: out of memory for tensor '%s'", name);
    t.data = data;
    if (data && copy) {
        t.owned = malloc(t.size ? (size_t)t.size : 1);
        if (!t.owned) {
            free(t.name);
            return em_errorf(EM_ERR_NOMEM, "GGUF writer: no memory to copy tensor '%s'", name);
        }
        memcpy(t.owned, data, (size_t)t.size);
        t.data = t.owned;
    }
    w->tensors[w->tensor_count++] = t;
    return NULL;
}

static uint64_t padding(uint64_t offset, uint32_t alignment) { return (alignment - offset % alignment) % alignment; }

static em_err write_all(FILE *f, const void *data, size_t n, const char *path) {
    if (n && fwrite(data, 1, n, f) != n) return em_errorf(EM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return NULL;
}

static em_err write_zeros(FILE *f, uint64_t n, const char *path) {
    static const uint8_t zeros[256];
    em_err err = NULL;
    while (n && !err) {
        size_t chunk = n < sizeof zeros ? (size_t)n : sizeof zeros;
        err = write_all(f, zeros, chunk, path);
        n -= chunk;
    }
    return err;
}

/* Serializes the header (counts, metadata, tensor infos) into a fresh writer buffer. */
static em_err build_header(const em_gguf_writer *w, em_gguf_writer *header) {
    em_err err = append(header, "GGUF", 4);
    if (!err) err = append_le(header, w->version, 4);
    if (!err) err = append_le(header, w->tensor_count, 8);
    if (!err) err = append_le(header, w->kv_count, 8);
    if (!err) err = append(header, w->meta, w->meta_len);
    uint64_t offset = 0;
    for (uint64_t i = 0; i < w->tensor_count && !err; i++) {
        const writer_tensor *t = &w->tensors[i];
        err = append_string(header, t->name, strlen(t->name));
        if (!err) err = append_le(header, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims && !err; d++) err = append_le(header, t->ne[d], 8);
        if (!err) err = append_le(header, t->type, 4);
        if (!err) err = append_le(header, offset, 8);
        offset += t->size + padding(t->size, w->alignment);
    }
    return err;
}

/* Opens where the file is written. A regular file (or a new one) is written under a temporary name
 * beside it and renamed over `path` once complete, so a reader that has the old file mapped keeps
 * it whole and a failed write leaves the old file as it was. Anything else (a device, a pipe) is
 * written in place. The new file keeps the old one's permissions. `*tmp_path` is the name to rename
 * from, or NULL. A process killed while writing leaves its part as PATH.partial-PID-N, never a
 * truncated PATH. */
static em_err open_output(const char *path, FILE **out, char **tmp_path) {
    static atomic_uint counter;
    *out = NULL;
    *tmp_path = NULL;
    struct stat st;
    const bool exists = stat(path, &st) == 0;
    if (exists && !S_ISREG(st.st_mode)) {
        if (!(*out = fopen(path, "wb"))) return em_errorf(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t len = strlen(path) + 48;
    char *tmp = malloc(len);
    if (!tmp) return em_errorf(EM_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, len, "%s.partial-%ld-%u", path, (long)getpid(), atomic_fetch_add(&counter, 1));
    if (!(*out = fopen(tmp, "wbx"))) { /* x: a new file, never one already there */
        em_err err = em_errorf(EM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return err;
    }
    if (exists) (void)fchmod(fileno(*out), st.st_mode & 07777); /* the replaced file's permissions */
    *tmp_path = tmp;
    return NULL;
}

em_err em_gguf_writer_write_streaming(const em_gguf_writer *w, const char *path, em_gguf_fill_fn fill, void *user) {
    em_gguf_writer header = {0};
    em_err err = build_header(w, &header);
    FILE *f = NULL;
    char *tmp = NULL;
    if (!err) err = open_output(path, &f, &tmp);
    if (!err) err = write_all(f, header.meta, header.meta_len, path);
    if (!err && w->tensor_count) err = write_zeros(f, padding(header.meta_len, w->alignment), path);
    for (uint64_t i = 0; i < w->tensor_count && !err; i++) {
        const writer_tensor *t = &w->tensors[i];
        if (t->data) {
            err = write_all(f, t->data, (size_t)t->size, path);
        } else if (fill) {
            err = fill(user, i, f, t->size);
        } else {
            err = em_errorf(EM_ERR_INVALID, "GGUF writer: tensor '%s' has no data and no fill callback", t->name);
        }
        if (!err) err = write_zeros(f, padding(t->size, w->alignment), path);
    }
    if (f && fclose(f) != 0 && !err) err = em_errorf(EM_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    if (!err && tmp && rename(tmp, path) != 0)
        err = em_errorf(EM_ERR_IO, "%s: cannot replace it with %s: %s", path, tmp, strerror(errno));
    if (err && tmp) remove(tmp);
    free(tmp);
    free(header.meta);
    return err;
}

em_err em_gguf_writer_write(const em_gguf_writer *w, const char *path) {
    return em_gguf_writer_write_streaming(w, path, NULL, NULL);
}
