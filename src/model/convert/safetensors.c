/* safetensors reader: an 8-byte little-endian header length, a JSON object of tensors
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the data, offsets relative to the end of the header. Everything is validated at open so
 * that nothing later can read outside the buffer. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert.h"

struct em_safetensors {
    char *name;
    const uint8_t *data;
    size_t size;
    void *map; /* NULL for a caller's buffer */
    size_t map_size;
    em_st_tensor *tensors; /* sorted by offset; names owned here */
    const em_st_tensor **by_name; /* the same, sorted by name, for lookups */
    size_t count;
};

/* The dtype names of the format, with element sizes. */
static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [EM_ST_BOOL] = {"BOOL", 1}, [EM_ST_U8] = {"U8", 1},     [EM_ST_I8] = {"I8", 1},
    [EM_ST_I16] = {"I16", 2},   [EM_ST_U16] = {"U16", 2},   [EM_ST_F16] = {"F16", 2},
    [EM_ST_BF16] = {"BF16", 2}, [EM_ST_I32] = {"I32", 4},   [EM_ST_U32] = {"U32", 4},
    [EM_ST_F32] = {"F32", 4},   [EM_ST_F64] = {"F64", 8},   [EM_ST_I64] = {"I64", 8},
    [EM_ST_U64] = {"U64", 8},   [EM_ST_F8_E4M3] = {"F8_E4M3", 1}, [EM_ST_F8_E5M2] = {"F8_E5M2", 1},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

const char *em_st_dtype_name(em_st_dtype dtype) { return (size_t)dtype < N_DTYPES ? dtypes[dtype].name : "?"; }
size_t em_st_dtype_size(em_st_dtype dtype) { return (size_t)dtype < N_DTYPES ? dtypes[dtype].size : 0; }

static bool dtype_of(const char *name, em_st_dtype *out) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (!strcmp(dtypes[i].name, name)) {
            *out = (em_st_dtype)i;
            return true;
        }
    return false;
}

void em_safetensors_close(em_safetensors *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->map_size);
    if (st->tensors)
        for (size_t i = 0; i < st->count; i++) free((char *)st->tensors[i].name);
    free(st->tensors);
    free(st->by_name);
    free(st->name);
    free(st);
}

static int by_offset(const void *a, const void *b) {
    const em_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->size < y->size ? -1 : x->size > y->size;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const em_st_tensor *const *)a)->name, (*(const em_st_tensor *const *)b)->name);
}

/* A JSON integer that is a valid non-negative 64-bit value. */
static bool json_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static em_err parse_entry(em_safetensors *st, const char *key, json_t *value, uint64_t header_end,
                          em_st_tensor *t) {
    const char *f = st->name;
    if (!json_is_object(value)) return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' is not a JSON object", f, key);
    json_t *dtype = json_object_get(value, "dtype"), *shape = json_object_get(value, "shape");
    json_t *offsets = json_object_get(value, "data_offsets");
    if (!json_is_string(dtype)) return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' has no dtype string", f, key);
    if (!dtype_of(json_string_value(dtype), &t->dtype))
        return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%s'", f, key, json_string_value(dtype));
    if (!json_is_array(shape)) return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' has no shape array", f, key);
    if (json_array_size(shape) > EM_ST_MAX_DIMS)
        return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' has %zu dimensions (at most %d)", f, key,
                         json_array_size(shape), EM_ST_MAX_DIMS);
    t->n_dims = (uint32_t)json_array_size(shape);
    t->n_elems = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (!json_u64(json_array_get(shape, d), &t->shape[d]))
            return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' shape[%u] is not a non-negative integer", f, key, d);
        if (t->shape[d] && t->n_elems > UINT64_MAX / t->shape[d])
            return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' shape overflows", f, key);
        t->n_elems *= t->shape[d];
    }
    uint64_t begin, end;
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 || !json_u64(json_array_get(offsets, 0), &begin) ||
        !json_u64(json_array_get(offsets, 1), &end))
        return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' data_offsets is not [begin, end]", f, key);
    if (begin > end) return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' data_offsets begin > end", f, key);
    uint64_t data_size = st->size - header_end;
    if (end > data_size)
        return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' data_offsets end %llu is past the data (%llu bytes)", f, key,
                         (unsigned long long)end, (unsigned long long)data_size);
    size_t es = dtypes[t->dtype].size;
    if (t->n_elems > UINT64_MAX / es || t->n_elems * es != end - begin)
        return em_errorf(EM_ERR_FORMAT, "%s: tensor '%s' holds %llu bytes but shape x %s needs %llu", f, key,
                         (unsigned long long)(end - begin), dtypes[t->dtype].name,
                         (unsigned long long)(t->n_elems * es));
    t->size = end - begin;
    t->offset = header_end + begin;
    t->data = st->data + t->offset;
    t->name = strdup(key);
    if (!t->name) return em_errorf(EM_ERR_NOMEM, "%s: out of memory", f);
    return NULL;
}

static em_err parse_metadata(const em_safetensors *st, json_t *meta) {
    if (!json_is_object(meta)) return em_errorf(EM_ERR_FORMAT, "%s: __metadata__ is not an object", st->name);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            return em_errorf(EM_ERR_FORMAT, "%s: __metadata__ value '%s' is not a string", st->name, k);
    }
    return NULL;
}

static em_err parse_header(em_safetensors *st) {
    const char *f = st->name;
    if (st->size < 8) return em_errorf(EM_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors header", f, st->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | st->data[i];
    if (n > EM_ST_MAX_HEADER)
        return em_errorf(EM_ERR_FORMAT, "%s: header length %llu exceeds the format's limit of %u bytes", f,
                         (unsigned long long)n, EM_ST_MAX_HEADER);
    if (n > st->size - 8)
        return em_errorf(EM_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", f,
                         (unsigned long long)n, st->size);
    if (n < 2 || st->data[8] != '{')
        return em_errorf(EM_ERR_FORMAT, "%s: header at offset 8 does not start with '{'", f);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)st->data + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return em_errorf(EM_ERR_FORMAT, "%s: header JSON: %s (byte %d of the header)", f, jerr.text, jerr.position);
    em_err err = NULL;
    if (!json_is_object(root)) {
        err = em_errorf(EM_ERR_FORMAT, "%s: header is not a JSON object", f);
        goto done;
    }
    size_t cap = json_object_size(root);
    st->tensors = calloc(cap ? cap : 1, sizeof *st->tensors);
    if (!st->tensors) {
        err = em_errorf(EM_ERR_NOMEM, "%s: out of memory for %zu tensors", f, cap);
        goto done;
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (!strcmp(key, "__metadata__")) {
            if ((err = parse_metadata(st, value))) goto done;
            continue;
        }
        if ((err = parse_entry(st, key, value, 8 + n, &st->tensors[st->count]))) goto done;
        st->count++;
    }
    qsort(st->tensors, st->count, sizeof *st->tensors, by_offset);
    for (size_t i = 1; i < st->count; i++) {
        const em_st_tensor *a = &st->tensors[i - 1], *b = &st->tensors[i];
        if (a->offset + a->size > b->offset && a->size && b->size) {
            err = em_errorf(EM_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", f, a->name, b->name);
            goto done;
        }
    }
    /* Checkpoints of MoE models hold tens of thousands of tensors: look names up by bisection. */
    st->by_name = malloc((st->count ? st->count : 1) * sizeof *st->by_name);
    if (!st->by_name) {
        err = em_errorf(EM_ERR_NOMEM, "%s: out of memory", f);
        goto done;
    }
    for (size_t i = 0; i < st->count; i++) st->by_name[i] = &st->tensors[i];
    qsort(st->by_name, st->count, sizeof *st->by_name, by_name);
done:
    json_decref(root);
    return err;
}

em_err em_safetensors_parse(const void *data, size_t size, const char *name, em_safetensors **out) {
    *out = NULL;
    em_safetensors *st = calloc(1, sizeof *st);
    if (!st) return em_errorf(EM_ERR_NOMEM, "out of memory opening %s", name);
    st->name = strdup(name ? name : "(buffer)");
    st->data = data;
    st->size = size;
    if (!st->name) {
        em_safetensors_close(st);
        return em_errorf(EM_ERR_NOMEM, "out of memory opening %s", name);
    }
    em_err err = parse_header(st);
    if (err) {
        em_safetensors_close(st);
        return err;
    }
    *out = st;
    return NULL;
}

em_err em_safetensors_open(const char *path, em_safetensors **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return em_errorf(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        em_err err = em_errorf(EM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return err;
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            em_err err = em_errorf(EM_ERR_IO, "%s: cannot map %zu bytes: %s", path, size, strerror(errno));
            close(fd);
            return err;
        }
    }
    close(fd);
    static const uint8_t empty[1];
    em_err err = em_safetensors_parse(map ? map : empty, size, path, out);
    if (err) {
        if (map) munmap(map, size);
        return err;
    }
    (*out)->map = map;
    (*out)->map_size = size;
    for (size_t i = 0; i < (*out)->count; i++) (*out)->tensors[i].mapped = map != NULL;
    return NULL;
}

const char *em_safetensors_name(const em_safetensors *st) { return st->name; }
size_t em_safetensors_count(const em_safetensors *st) { return st->count; }
const em_st_tensor *em_safetensors_at(const em_safetensors *st, size_t i) {
    return i < st->count ? &st->tensors[i] : NULL;
}

const em_st_tensor *em_safetensors_find(const em_safetensors *st, const char *name) {
    size_t lo = 0, hi = st->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->by_name[mid]->name, name);
        if (c == 0) return st->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

void em_st_release(const em_st_tensor *t) {
    if (!t->mapped || t->size == 0) return;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    /* Whole pages inside the tensor only: a page shared with a neighbour stays. */
    uintptr_t begin = ((uintptr_t)t->data + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t end = ((uintptr_t)t->data + t->size) & ~((uintptr_t)page - 1);
    if (end > begin) madvise((void *)begin, end - begin, MADV_DONTNEED);
}

/* IEEE half → float, exact (including subnormals, infinities and NaN). */
static float half_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            bits = sign | exp << 23 | (mant & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

em_err em_st_read_f32(const em_st_tensor *t, uint64_t first, uint64_t count, float *out) {
    if (first > t->n_elems || count > t->n_elems - first)
        return em_errorf(EM_ERR_RANGE, "tensor '%s': elements [%llu, +%llu) are outside its %llu", t->name,
                         (unsigned long long)first, (unsigned long long)count, (unsigned long long)t->n_elems);
    const uint8_t *p = t->data + first * dtypes[t->dtype].size;
    switch (t->dtype) {
    case EM_ST_F32:
        memcpy(out, p, count * 4);
        return NULL;
    case EM_ST_F64:
        for (uint64_t i = 0; i < count; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
        }
        return NULL;
    case EM_ST_F16:
        for (uint64_t i = 0; i < count; i++) out[i] = half_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return NULL;
    case EM_ST_BF16:
        for (uint64_t i = 0; i < count; i++) {
            uint32_t bits = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            memcpy(&out[i], &bits, 4);
        }
        return NULL;
    default:
        return em_errorf(EM_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; conversion reads F32, F16, BF16 and F64",
                         t->name, dtypes[t->dtype].name);
    }
}
