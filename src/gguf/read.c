/*
 * GGUF reader: maps a file and validates every byte of its header before exposing it (gguf.h).
 *
 * Layout (all little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count; the
 * metadata entries (u64-length key, u32 type, value); the tensor infos (u64-length name, u32 dims,
 * u64 per dim, u32 type, u64 offset); padding to the alignment; the tensor data section.
 * Parsing goes through a cursor that checks each read against the end of the buffer, so a
 * malformed file can only produce an error, never an out-of-bounds read.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../quant/quant.h"

#define GGUF_MAGIC "GGUF"
/* Limits that keep a hostile file from asking for absurd work; real files are far below them. */
#define MAX_KEY_LENGTH 65535u
#define MAX_DIMENSION (UINT64_C(1) << 48)

struct em_gguf {
    char *path;
    const uint8_t *base;
    uint64_t size;
    bool mapped;      /* base is an mmap we own (else a caller's buffer) */
    bool private_copy; /* that mmap is anonymous memory holding the file's bytes */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    uint64_t kv_count;
    em_gguf_kv *kvs;
    uint64_t tensor_count;
    em_gguf_tensor *tensors;
    em_str *string_pool; /* one allocation for all string values and string-array elements */
};

typedef struct cursor {
    const em_gguf *file;
    uint64_t pos;
} cursor;

static em_err fail_at(const cursor *c, uint64_t offset, const char *field, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static em_err fail_at(const cursor *c, uint64_t offset, const char *field, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    em_err err = em_verrorf(EM_ERR_FORMAT, fmt, args);
    va_end(args);
    return em_err_prefix(err, "%s: offset %llu: %s", c->file->path, (unsigned long long)offset, field);
}

static uint64_t remaining(const cursor *c) { return c->file->size - c->pos; }

static em_err read_bytes(cursor *c, uint64_t n, const char *field, const uint8_t **out) {
    if (n > remaining(c))
        return fail_at(c, c->pos, field, "file truncated: needs %llu bytes, %llu left", (unsigned long long)n,
                       (unsigned long long)remaining(c));
    *out = c->file->base + c->pos;
    c->pos += n;
    return NULL;
}

static em_err read_u32(cursor *c, const char *field, uint32_t *out) {
    const uint8_t *p = NULL;
    em_err err = read_bytes(c, 4, field, &p);
    if (err) return err;
    *out = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return NULL;
}

static em_err read_u64(cursor *c, const char *field, uint64_t *out) {
    uint32_t low, high;
    em_err err = read_u32(c, field, &low);
    if (!err) err = read_u32(c, field, &high);
    if (!err) *out = (uint64_t)high << 32 | low;
    return err;
}

static em_err read_string(cursor *c, const char *field, em_str *out) {
    uint64_t start = c->pos, length;
    em_err err = read_u64(c, field, &length);
    if (err) return err;
    if (length > remaining(c))
        return fail_at(c, start, field, "string length %llu exceeds the %llu bytes left in the file",
                       (unsigned long long)length, (unsigned long long)remaining(c));
    const uint8_t *p = NULL;
    err = read_bytes(c, length, field, &p);
    if (err) return err;
    out->ptr = (const char *)p;
    out->len = length;
    return NULL;
}

size_t em_gguf_type_size(em_gguf_type type) {
    switch (type) {
    case EM_GGUF_UINT8: case EM_GGUF_INT8: case EM_GGUF_BOOL: return 1;
    case EM_GGUF_UINT16: case EM_GGUF_INT16: return 2;
    case EM_GGUF_UINT32: case EM_GGUF_INT32: case EM_GGUF_FLOAT32: return 4;
    case EM_GGUF_UINT64: case EM_GGUF_INT64: case EM_GGUF_FLOAT64: return 8;
    case EM_GGUF_STRING: case EM_GGUF_ARRAY: return 0;
    }
    return 0;
}

const char *em_gguf_type_name(em_gguf_type type) {
    static const char *names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                  "bool", "string", "array", "uint64", "int64", "float64"};
    return (unsigned)type < sizeof names / sizeof names[0] ? names[type] : "unknown";
}

static bool is_known_type(uint32_t type) { return type <= EM_GGUF_FLOAT64; }

/* First pass over one metadata value: checks it and counts the strings it holds. */
static em_err skim_value(cursor *c, em_gguf_kv *kv, uint64_t *string_count) {
    uint64_t start = c->pos;
    if (kv->type == EM_GGUF_STRING) {
        em_str s;
        (*string_count)++;
        return read_string(c, "string value", &s);
    }
    if (kv->type != EM_GGUF_ARRAY) {
        const uint8_t *p = NULL;
        em_err err = read_bytes(c, em_gguf_type_size(kv->type), "value", &p);
        if (err) return err;
        if (kv->type == EM_GGUF_BOOL && *p > 1) return fail_at(c, start, "bool value", "is %u, not 0 or 1", *p);
        kv->data = p;
        return NULL;
    }
    uint32_t element_type;
    uint64_t count;
    em_err err = read_u32(c, "array element type", &element_type);
    if (!err) err = read_u64(c, "array length", &count);
    if (err) return err;
    if (!is_known_type(element_type))
        return fail_at(c, start, "array element type", "unknown type %u", element_type);
    if (element_type == EM_GGUF_ARRAY) return fail_at(c, start, "array element type", "nested arrays are not supported");
    kv->array_type = (em_gguf_type)element_type;
    kv->array_len = count;
    if (element_type == EM_GGUF_STRING) {
        if (count > remaining(c) / 8)
            return fail_at(c, start + 4, "array length", "%llu strings cannot fit in the %llu bytes left",
                           (unsigned long long)count, (unsigned long long)remaining(c));
        for (uint64_t i = 0; i < count; i++) {
            em_str s;
            if ((err = read_string(c, "string array element", &s))) return err;
        }
        *string_count += count;
        return NULL;
    }
    uint64_t bytes;
    if (em_mul_overflows(count, em_gguf_type_size(kv->array_type), &bytes) || bytes > remaining(c))
        return fail_at(c, start + 4, "array length", "%llu elements of %s exceed the %llu bytes left",
                       (unsigned long long)count, em_gguf_type_name(kv->array_type), (unsigned long long)remaining(c));
    const uint8_t *p = NULL;
    if ((err = read_bytes(c, bytes, "array data", &p))) return err;
    if (element_type == EM_GGUF_BOOL)
        for (uint64_t i = 0; i < count; i++)
            if (p[i] > 1) return fail_at(c, (uint64_t)(p + i - c->file->base), "bool array element", "is %u", p[i]);
    kv->data = p;
    return NULL;
}

/* Second pass: fills the string pointers of string values and string arrays (already checked). */
static void collect_strings(const em_gguf *g, em_gguf_kv *kv, uint64_t value_pos, em_str **pool) {
    cursor c = {g, value_pos};
    em_str s;
    em_err ignored;
    kv->strings = *pool;
    if (kv->type == EM_GGUF_STRING) {
        ignored = read_string(&c, "", &s);
        (void)ignored;
        *(*pool)++ = s;
        return;
    }
    c.pos += 12; /* element type and count */
    for (uint64_t i = 0; i < kv->array_len; i++) {
        ignored = read_string(&c, "", &s);
        (void)ignored;
        *(*pool)++ = s;
    }
}

static em_err parse_metadata(em_gguf *g, cursor *c) {
    uint64_t string_count = 0;
    uint64_t *value_positions = calloc(g->kv_count ? g->kv_count : 1, sizeof *value_positions);
    g->kvs = calloc(g->kv_count ? g->kv_count : 1, sizeof *g->kvs);
    if (!value_positions || !g->kvs) {
        free(value_positions);
        return em_errorf(EM_ERR_NOMEM, "%s: no memory for %llu metadata entries", g->path,
                         (unsigned long long)g->kv_count);
    }
    em_err err = NULL;
    for (uint64_t i = 0; i < g->kv_count && !err; i++) {
        em_gguf_kv *kv = &g->kvs[i];
        kv->offset = c->pos;
        uint32_t type;
        if ((err = read_string(c, "metadata key", &kv->key))) break;
        if (kv->key.len > MAX_KEY_LENGTH) {
            err = fail_at(c, kv->offset, "metadata key", "length %llu is absurd", (unsigned long long)kv->key.len);
            break;
        }
        for (uint64_t j = 0; j < i; j++)
            if (g->kvs[j].key.len == kv->key.len && !memcmp(g->kvs[j].key.ptr, kv->key.ptr, kv->key.len)) {
                err = fail_at(c, kv->offset, "metadata key", "duplicate key '%.*s'", (int)kv->key.len, kv->key.ptr);
                break;
            }
        if (err) break;
        uint64_t type_pos = c->pos;
        if ((err = read_u32(c, "metadata value type", &type))) break;
        if (!is_known_type(type)) {
            err = fail_at(c, type_pos, "metadata value type", "unknown type %u for key '%.*s'", type,
                          (int)kv->key.len, kv->key.ptr);
            break;
        }
        kv->type = (em_gguf_type)type;
        value_positions[i] = c->pos;
        if ((err = skim_value(c, kv, &string_count)))
            err = em_err_prefix(err, "key '%.*s'", (int)kv->key.len, kv->key.ptr);
    }
    if (!err && string_count) {
        g->string_pool = malloc(string_count * sizeof *g->string_pool);
        if (!g->string_pool) err = em_errorf(EM_ERR_NOMEM, "%s: no memory for %llu strings", g->path,
                                             (unsigned long long)string_count);
        em_str *pool = g->string_pool;
        for (uint64_t i = 0; i < g->kv_count && !err; i++) {
            em_gguf_kv *kv = &g->kvs[i];
            if (kv->type == EM_GGUF_STRING || (kv->type == EM_GGUF_ARRAY && kv->array_type == EM_GGUF_STRING))
                collect_strings(g, kv, value_positions[i], &pool);
        }
    }
    free(value_positions);
    return err;
}

static em_err read_alignment(em_gguf *g) {
    g->alignment = EM_GGUF_DEFAULT_ALIGNMENT;
    const em_gguf_kv *kv = em_gguf_find(g, "general.alignment");
    if (!kv) return NULL;
    if (kv->type != EM_GGUF_UINT32)
        return em_errorf(EM_ERR_FORMAT, "%s: offset %llu: general.alignment: has type %s, expected uint32", g->path,
                         (unsigned long long)kv->offset, em_gguf_type_name(kv->type));
    uint32_t alignment = (uint32_t)em_gguf_kv_int(kv);
    if (alignment == 0 || (alignment & (alignment - 1)))
        return em_errorf(EM_ERR_FORMAT, "%s: offset %llu: general.alignment: %u is not a power of two", g->path,
                         (unsigned long long)kv->offset, alignment);
    g->alignment = alignment;
    return NULL;
}

static em_err parse_tensor_info(em_gguf *g, cursor *c, em_gguf_tensor *t) {
    uint64_t start = c->pos, type_pos, offset_pos;
    em_err err = read_string(c, "tensor name", &t->name);
    if (!err) err = read_u32(c, "tensor dimension count", &t->n_dims);
    if (err) return err;
#define TENSOR_FAIL(pos, field, ...) \
    em_err_prefix(fail_at(c, pos, field, __VA_ARGS__), "tensor '%.*s'", (int)t->name.len, t->name.ptr)
    if (t->name.len > MAX_KEY_LENGTH) return fail_at(c, start, "tensor name", "length %llu is absurd",
                                                     (unsigned long long)t->name.len);
    if (t->n_dims == 0 || t->n_dims > EM_GGUF_MAX_DIMS)
        return TENSOR_FAIL(start, "dimension count", "%u dimensions (1 to %d allowed)", t->n_dims, EM_GGUF_MAX_DIMS);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < EM_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t pos = c->pos;
        if ((err = read_u64(c, "tensor dimension", &t->ne[d]))) return err;
        if (t->ne[d] > MAX_DIMENSION || em_mul_overflows(elems, t->ne[d], &elems) || elems > (UINT64_C(1) << 62))
            return TENSOR_FAIL(pos, "dimension", "%llu elements in dimension %u is absurd",
                               (unsigned long long)t->ne[d], d);
    }
    type_pos = c->pos;
    if ((err = read_u32(c, "tensor type", &t->type))) return err;
    offset_pos = c->pos;
    if ((err = read_u64(c, "tensor data offset", &t->offset))) return err;
    const em_type_info *info = em_type_info_of(t->type);
    if (!info) return TENSOR_FAIL(type_pos, "type", "unknown tensor type id %u", t->type);
    uint64_t row_bytes;
    err = em_type_row_bytes(t->type, t->ne[0], &row_bytes);
    if (err) {
        em_err wrapped = TENSOR_FAIL(start, "row length", "%s", em_err_message(err));
        em_err_free(err);
        return wrapped;
    }
    uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3]; /* cannot overflow: bounded by elems above, or a 0 */
    if (t->ne[0] == 0) rows = 0;
    if (em_mul_overflows(row_bytes, rows, &t->size)) return TENSOR_FAIL(start, "size", "tensor size overflows");
    if (t->offset % g->alignment)
        return TENSOR_FAIL(offset_pos, "data offset", "%llu is not a multiple of the alignment %u",
                           (unsigned long long)t->offset, g->alignment);
#undef TENSOR_FAIL
    return NULL;
}

static int compare_by_offset(const void *a, const void *b) {
    const em_gguf_tensor *x = *(em_gguf_tensor *const *)a, *y = *(em_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Places every tensor inside the data section and checks that none overlap. */
static em_err place_tensors(em_gguf *g) {
    if (g->tensor_count == 0) return NULL;
    em_gguf_tensor **order = malloc(g->tensor_count * sizeof *order);
    if (!order) return em_errorf(EM_ERR_NOMEM, "%s: no memory to sort tensors", g->path);
    uint64_t data_size = g->size > g->data_offset ? g->size - g->data_offset : 0;
    em_err err = NULL;
    for (uint64_t i = 0; i < g->tensor_count && !err; i++) {
        em_gguf_tensor *t = &g->tensors[i];
        order[i] = t;
        uint64_t end;
        if (g->data_offset > g->size || em_add_overflows(t->offset, t->size, &end) || end > data_size)
            err = em_errorf(EM_ERR_FORMAT,
                            "%s: offset %llu: tensor '%.*s': data [%llu, +%llu) lies outside the file (data section "
                            "holds %llu bytes)",
                            g->path, (unsigned long long)(g->data_offset + t->offset), (int)t->name.len, t->name.ptr,
                            (unsigned long long)t->offset, (unsigned long long)t->size, (unsigned long long)data_size);
        else
            t->data = g->base + g->data_offset + t->offset;
    }
    if (!err) {
        qsort(order, g->tensor_count, sizeof *order, compare_by_offset);
        for (uint64_t i = 1; i < g->tensor_count && !err; i++) {
            const em_gguf_tensor *a = order[i - 1], *b = order[i];
            if (a->offset + a->size > b->offset)
                err = em_errorf(EM_ERR_FORMAT, "%s: offset %llu: tensor '%.*s' overlaps tensor '%.*s'", g->path,
                                (unsigned long long)(g->data_offset + b->offset), (int)b->name.len, b->name.ptr,
                                (int)a->name.len, a->name.ptr);
        }
    }
    free(order);
    return err;
}

static em_err parse(em_gguf *g) {
    cursor c = {g, 0};
    const uint8_t *magic = NULL;
    em_err err = read_bytes(&c, 4, "magic", &magic);
    if (err) return err;
    if (memcmp(magic, GGUF_MAGIC, 4))
        return fail_at(&c, 0, "magic", "not a GGUF file (starts with %02x %02x %02x %02x)", magic[0], magic[1],
                       magic[2], magic[3]);
    if ((err = read_u32(&c, "version", &g->version))) return err;
    if (g->version != 2 && g->version != 3)
        return fail_at(&c, 4, "version", "GGUF version %u is not supported (2 and 3 are)", g->version);
    if ((err = read_u64(&c, "tensor count", &g->tensor_count))) return err;
    if ((err = read_u64(&c, "metadata count", &g->kv_count))) return err;
    /* Every metadata entry takes at least 13 bytes and every tensor info at least 32. */
    if (g->kv_count > remaining(&c) / 13)
        return fail_at(&c, 16, "metadata count", "%llu entries cannot fit in a %llu-byte file",
                       (unsigned long long)g->kv_count, (unsigned long long)g->size);
    if (g->tensor_count > remaining(&c) / 32)
        return fail_at(&c, 8, "tensor count", "%llu tensors cannot fit in a %llu-byte file",
                       (unsigned long long)g->tensor_count, (unsigned long long)g->size);
    if ((err = parse_metadata(g, &c))) return err;
    if ((err = read_alignment(g))) return err;
    g->tensors = calloc(g->tensor_count ? g->tensor_count : 1, sizeof *g->tensors);
    if (!g->tensors) return em_errorf(EM_ERR_NOMEM, "%s: no memory for %llu tensor infos", g->path,
                                      (unsigned long long)g->tensor_count);
    for (uint64_t i = 0; i < g->tensor_count; i++) {
        if ((err = parse_tensor_info(g, &c, &g->tensors[i]))) return err;
        for (uint64_t j = 0; j < i; j++)
            if (g->tensors[j].name.len == g->tensors[i].name.len &&
                !memcmp(g->tensors[j].name.ptr, g->tensors[i].name.ptr, g->tensors[i].name.len))
                return fail_at(&c, c.pos, "tensor name", "duplicate tensor '%.*s'", (int)g->tensors[i].name.len,
                               g->tensors[i].name.ptr);
    }
    uint64_t aligned = c.pos + (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_offset = aligned;
    return place_tensors(g);
}

static em_err open_common(em_gguf *g, em_gguf **out) {
    em_err err = parse(g);
    if (err) {
        em_gguf_close(g);
        return err;
    }
    *out = g;
    return NULL;
}

em_err em_gguf_open_buffer(const void *data, size_t size, const char *name, em_gguf **out) {
    *out = NULL;
    em_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(name ? name : "<buffer>"))) {
        free(g);
        return em_errorf(EM_ERR_NOMEM, "no memory to open %s", name ? name : "<buffer>");
    }
    g->base = data;
    g->size = size;
    return open_common(g, out);
}

/* The file's `size` bytes in fresh anonymous memory, read-only once filled; NULL (errno set) when
 * the memory is refused or the read fails. */
static void *read_private(int fd, uint64_t size) {
    uint8_t *copy = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(copy, (size_t)size, MADV_HUGEPAGE); /* fewer page faults and TLB misses; only advice */
#endif
    for (uint64_t done = 0; done < size;) {
        const uint64_t want = size - done < (64u << 20) ? size - done : (64u << 20);
        const ssize_t got = pread(fd, copy + done, (size_t)want, (off_t)done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            const int saved = got < 0 ? errno : EIO; /* a file that shrank under us reads short */
            munmap(copy, (size_t)size);
            errno = saved;
            return NULL;
        }
        done += (uint64_t)got;
    }
    mprotect(copy, (size_t)size, PROT_READ);
    return copy;
}

em_err em_gguf_open(const char *path, em_gguf **out) { return em_gguf_open_as(path, EM_GGUF_MAPPED, out); }

em_err em_gguf_open_as(const char *path, em_gguf_memory memory, em_gguf **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return em_errorf(errno == ENOENT ? EM_ERR_NOT_FOUND : EM_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        em_err err = em_errorf(EM_ERR_IO, "%s: %s", path, strerror(errno));
        close(fd);
        return err;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return em_errorf(EM_ERR_IO, "%s: not a regular file", path);
    }
    em_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        close(fd);
        return em_errorf(EM_ERR_NOMEM, "no memory to open %s", path);
    }
    g->size = (uint64_t)st.st_size;
    if (g->size > 0 && memory == EM_GGUF_PRIVATE) {
        void *copy = read_private(fd, g->size);
        if (copy) {
            g->base = copy;
            g->mapped = g->private_copy = true;
        } else {
            em_log(EM_LOG_WARN, "%s: cannot read %llu bytes into memory (%s): mapping the file instead", path,
                   (unsigned long long)g->size, strerror(errno));
        }
    }
    if (g->size > 0 && !g->mapped) {
        void *map = mmap(NULL, (size_t)g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            em_err err = em_errorf(EM_ERR_IO, "%s: cannot map %llu bytes: %s", path, (unsigned long long)g->size,
                                   strerror(errno));
            close(fd);
            free(g->path);
            free(g);
            return err;
        }
        g->base = map;
        g->mapped = true;
    } else if (!g->mapped) {
        g->base = (const uint8_t *)"";
    }
    close(fd);
    return open_common(g, out);
}

bool em_gguf_is_private(const em_gguf *g) { return g->private_copy; }

void em_gguf_close(em_gguf *g) {
    if (!g) return;
    if (g->mapped) munmap((void *)g->base, (size_t)g->size);
    free(g->kvs);
    free(g->tensors);
    free(g->string_pool);
    free(g->path);
    free(g);
}

/* Plain accessors of the parsed header (the typed getters live in access.c). */
const char *em_gguf_path(const em_gguf *g) { return g->path; }
uint32_t em_gguf_version(const em_gguf *g) { return g->version; }
uint32_t em_gguf_alignment(const em_gguf *g) { return g->alignment; }
uint64_t em_gguf_file_size(const em_gguf *g) { return g->size; }
uint64_t em_gguf_data_offset(const em_gguf *g) { return g->data_offset; }
uint64_t em_gguf_kv_count(const em_gguf *g) { return g->kv_count; }
const em_gguf_kv *em_gguf_kv_at(const em_gguf *g, uint64_t i) { return i < g->kv_count ? &g->kvs[i] : NULL; }
uint64_t em_gguf_tensor_count(const em_gguf *g) { return g->tensor_count; }
const em_gguf_tensor *em_gguf_tensor_at(const em_gguf *g, uint64_t i) {
    return i < g->tensor_count ? &g->tensors[i] : NULL;
}
