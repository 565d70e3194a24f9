/*
 * Split GGUF sets (gguf.h): llama.cpp's gguf-split layout, NAME-00001-of-0000N.gguf and its
 * siblings. Reading opens every part beside the first and checks that they describe one model;
 * writing divides a file's tensors over N parts (used by the tests to make a split set, and by
 * anyone who wants smaller files).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

#define SPLIT_NO "split.no"
#define SPLIT_COUNT "split.count"
#define SPLIT_TENSORS "split.tensors.count"

/* Five decimal digits at `text`, as a number; false when they are not. */
static bool five_digits(const char *text, uint32_t *out) {
    uint32_t value = 0;
    for (int i = 0; i < 5; i++) {
        if (text[i] < '0' || text[i] > '9') return false;
        value = value * 10 + (uint32_t)(text[i] - '0');
    }
    *out = value;
    return true;
}

bool em_gguf_split_name(const char *path, uint32_t *part, uint32_t *count, size_t *prefix_len) {
    /* "-00002-of-00003.gguf" is 20 characters. */
    static const size_t suffix_len = 20;
    const size_t len = strlen(path);
    if (len <= suffix_len) return false;
    const char *s = path + len - suffix_len;
    uint32_t p, c;
    if (s[0] != '-' || !five_digits(s + 1, &p) || memcmp(s + 6, "-of-", 4) || !five_digits(s + 10, &c) ||
        strcmp(s + 15, ".gguf"))
        return false;
    if (p == 0 || c == 0 || p > c) return false;
    *part = p;
    *count = c;
    *prefix_len = len - suffix_len;
    return true;
}

/* An integer split.* key of one part; `fallback` when absent. */
static em_err split_key(const em_gguf *g, const char *key, uint64_t fallback, uint64_t *out) {
    if (!em_gguf_find(g, key)) {
        *out = fallback;
        return NULL;
    }
    em_err err = em_gguf_get_u64(g, key, out);
    return err ? em_err_prefix(err, "%s", em_gguf_path(g)) : NULL;
}

void em_gguf_close_parts(em_gguf **parts, uint32_t n_parts) {
    if (!parts) return;
    for (uint32_t i = 0; i < n_parts; i++) em_gguf_close(parts[i]);
    free(parts);
}

/* A tensor name that an earlier part already holds makes lookups ambiguous. */
static em_err check_unique_tensors(em_gguf *const *parts, uint32_t n_parts) {
    for (uint32_t p = 1; p < n_parts; p++)
        for (uint64_t i = 0; i < em_gguf_tensor_count(parts[p]); i++) {
            const em_str name = em_gguf_tensor_at(parts[p], i)->name;
            for (uint32_t q = 0; q < p; q++)
                for (uint64_t j = 0; j < em_gguf_tensor_count(parts[q]); j++) {
                    const em_str other = em_gguf_tensor_at(parts[q], j)->name;
                    if (other.len == name.len && !memcmp(other.ptr, name.ptr, (size_t)name.len))
                        return em_errorf(EM_ERR_FORMAT, "%s: tensor %.*s is also in %s", em_gguf_path(parts[p]),
                                         (int)name.len, name.ptr, em_gguf_path(parts[q]));
                }
        }
    return NULL;
}

/* Opens parts 2..count beside the first and checks each one's split keys. */
static em_err open_other_parts(const char *path, em_gguf_memory memory, size_t prefix_len, uint32_t count,
                               em_gguf **parts) {
    const size_t len = prefix_len + 32;
    char *name = malloc(len);
    if (!name) return em_errorf(EM_ERR_NOMEM, "out of memory opening the parts of %s", path);
    em_err err = NULL;
    for (uint32_t i = 1; i < count && !err; i++) {
        snprintf(name, len, "%.*s-%05u-of-%05u.gguf", (int)prefix_len, path, i + 1, count);
        if ((err = em_gguf_open_as(name, memory, &parts[i]))) {
            if (em_err_code_of(err) == EM_ERR_NOT_FOUND || em_err_code_of(err) == EM_ERR_IO)
                err = em_err_prefix(err, "part %u of %u of the split model %s is missing or unreadable", i + 1,
                                    count, path);
            break;
        }
        uint64_t number, part_count;
        if ((err = split_key(parts[i], SPLIT_NO, UINT64_MAX, &number))) break;
        if ((err = split_key(parts[i], SPLIT_COUNT, 0, &part_count))) break;
        if (number != i || part_count != count)
            err = em_errorf(EM_ERR_FORMAT, "%s: split.no = %lld, split.count = %llu, but it is part %u of %u by name",
                            name, number == UINT64_MAX ? -1 : (long long)number, (unsigned long long)part_count,
                            i + 1, count);
    }
    free(name);
    return err;
}

em_err em_gguf_open_parts(const char *path, em_gguf ***out_parts, uint32_t *out_n) {
    return em_gguf_open_parts_as(path, EM_GGUF_MAPPED, out_parts, out_n);
}

em_err em_gguf_open_parts_as(const char *path, em_gguf_memory memory, em_gguf ***out_parts, uint32_t *out_n) {
    *out_parts = NULL;
    *out_n = 0;
    em_gguf *first;
    em_err err = em_gguf_open_as(path, memory, &first);
    if (err) return err;
    uint64_t number, count, tensors;
    if ((err = split_key(first, SPLIT_NO, 0, &number)) || (err = split_key(first, SPLIT_COUNT, 1, &count)) ||
        (err = split_key(first, SPLIT_TENSORS, 0, &tensors))) {
        em_gguf_close(first);
        return err;
    }
    uint32_t name_part = 0, name_count = 0;
    size_t prefix_len = 0;
    const bool named = em_gguf_split_name(path, &name_part, &name_count, &prefix_len);
    if (count == 0 || count > EM_GGUF_SPLIT_MAX_PARTS || number >= count) {
        err = em_errorf(EM_ERR_FORMAT, "%s: split.no = %llu of split.count = %llu is not a part of a set", path,
                        (unsigned long long)number, (unsigned long long)count);
    } else if (number != 0) {
        if (named)
            err = em_errorf(EM_ERR_INVALID, "%s is part %llu of %llu of a split model: open the first part, %.*s-00001-of-%05llu.gguf",
                            path, (unsigned long long)number + 1, (unsigned long long)count, (int)prefix_len, path,
                            (unsigned long long)count);
        else
            err = em_errorf(EM_ERR_INVALID, "%s is part %llu of %llu of a split model: open the first part", path,
                            (unsigned long long)number + 1, (unsigned long long)count);
    } else if (count > 1 && (!named || name_part != 1 || name_count != count)) {
        err = em_errorf(EM_ERR_INVALID,
                        "%s: the first of %llu split parts, but its name is not NAME-00001-of-%05llu.gguf, so the "
                        "other parts cannot be found",
                        path, (unsigned long long)count, (unsigned long long)count);
    }
    em_gguf **parts = err ? NULL : calloc((size_t)count, sizeof *parts);
    if (!err && !parts) err = em_errorf(EM_ERR_NOMEM, "out of memory opening %s", path);
    if (err) {
        em_gguf_close(first);
        return err;
    }
    parts[0] = first;
    if (count > 1) err = open_other_parts(path, memory, prefix_len, (uint32_t)count, parts);
    uint64_t total = 0;
    for (uint32_t i = 0; i < count && !err; i++) total += em_gguf_tensor_count(parts[i]);
    if (!err && count > 1 && total != tensors)
        err = em_errorf(EM_ERR_FORMAT, "%s: split.tensors.count = %llu, but the %llu parts hold %llu tensors", path,
                        (unsigned long long)tensors, (unsigned long long)count, (unsigned long long)total);
    if (!err) err = check_unique_tensors(parts, (uint32_t)count);
    if (err) {
        em_gguf_close_parts(parts, (uint32_t)count);
        return err;
    }
    *out_parts = parts;
    *out_n = (uint32_t)count;
    return NULL;
}

/* Writes part `index` of `n_parts`: the split keys, the metadata (first part only), and tensors
 * [first_tensor, end_tensor). */
static em_err write_part(const em_gguf *g, uint32_t index, uint32_t n_parts, uint64_t first_tensor,
                         uint64_t end_tensor, const char *path) {
    em_gguf_writer *w;
    em_err err = em_gguf_writer_new(em_gguf_version(g), &w);
    if (err) return err;
    err = em_gguf_writer_add_u16(w, SPLIT_NO, (uint16_t)index);
    if (!err) err = em_gguf_writer_add_u16(w, SPLIT_COUNT, (uint16_t)n_parts);
    if (!err) err = em_gguf_writer_add_i32(w, SPLIT_TENSORS, (int32_t)em_gguf_tensor_count(g));
    for (uint64_t i = 0; i < em_gguf_kv_count(g) && !err; i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(g, i);
        const bool split_key_of_input = kv->key.len > 6 && !memcmp(kv->key.ptr, "split.", 6);
        /* The alignment applies to every part's data; the rest lives in the first part only. */
        if (!split_key_of_input && (index == 0 || em_str_eq(kv->key, "general.alignment")))
            err = em_gguf_writer_copy_kv(w, kv);
    }
    for (uint64_t i = first_tensor; i < end_tensor && !err; i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        char *name = em_str_dup(t->name);
        if (!name) err = em_errorf(EM_ERR_NOMEM, "out of memory writing %s", path);
        else err = em_gguf_writer_add_tensor(w, name, t->n_dims, t->ne, t->type, t->data, false);
        free(name);
    }
    if (!err) err = em_gguf_writer_write(w, path);
    em_gguf_writer_free(w);
    return err;
}

em_err em_gguf_write_split(const em_gguf *g, uint32_t n_parts, const char *prefix) {
    const uint64_t n_tensors = em_gguf_tensor_count(g);
    if (n_parts == 0 || n_parts > EM_GGUF_SPLIT_MAX_PARTS || n_parts > n_tensors)
        return em_errorf(EM_ERR_INVALID, "%s: cannot split %llu tensors into %u parts", em_gguf_path(g),
                         (unsigned long long)n_tensors, n_parts);
    if (n_tensors > INT32_MAX)
        return em_errorf(EM_ERR_RANGE, "%s: %llu tensors do not fit split.tensors.count", em_gguf_path(g),
                         (unsigned long long)n_tensors);
    const size_t len = strlen(prefix) + 32;
    char *path = malloc(len);
    if (!path) return em_errorf(EM_ERR_NOMEM, "out of memory splitting %s", em_gguf_path(g));
    const uint64_t per_part = n_tensors / n_parts;
    em_err err = NULL;
    for (uint32_t i = 0; i < n_parts && !err; i++) {
        snprintf(path, len, "%s-%05u-of-%05u.gguf", prefix, i + 1, n_parts);
        const uint64_t end = i + 1 == n_parts ? n_tensors : (i + 1) * per_part;
        err = write_part(g, i, n_parts, i * per_part, end, path);
    }
    free(path);
    return err;
}
