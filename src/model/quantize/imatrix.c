/*
 * llama.cpp's importance matrices: for each weight matrix, the mean of the squared activations
 * that met each of its columns over a calibration text, which weighted quantizers use to spend
 * their error where it matters least.
 *
 * Two formats, as llama-imatrix writes them:
 *  - GGUF (the default today): general.type "imatrix", keys imatrix.datasets, imatrix.chunk_count
 *    and imatrix.chunk_size, and for each weight NAME the F32 tensors NAME.in_sum2 (ne[0] columns
 *    x one row per matrix of an expert stack) and NAME.counts (one count per matrix); the
 *    importance is in_sum2 / count, and 1 for a matrix that was never used;
 *  - legacy .dat: int32 entry count, then per entry int32 name length, the name, int32 call count,
 *    int32 value count and the float sums; optionally int32 chunk count and int32-length dataset
 *    name at the end. The importance is sum / call count.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../gguf/gguf.h"
#include "../../quant/quant.h"
#include "quantize.h"

typedef struct entry {
    char *name;
    float *values;
    uint64_t count;
} entry;

struct em_imatrix {
    entry *entries;
    uint64_t n, cap;
    uint32_t chunks;
};

void em_imatrix_free(em_imatrix *im) {
    if (!im) return;
    for (uint64_t i = 0; i < im->n; i++) {
        free(im->entries[i].name);
        free(im->entries[i].values);
    }
    free(im->entries);
    free(im);
}

uint64_t em_imatrix_count(const em_imatrix *im) { return im->n; }
uint32_t em_imatrix_chunks(const em_imatrix *im) { return im->chunks; }

/* A new entry of `count` values (owned by the imatrix). */
static em_err add_entry(em_imatrix *im, const char *name, size_t name_len, uint64_t count, entry **out) {
    if (im->n == im->cap) {
        uint64_t cap = im->cap ? 2 * im->cap : 64;
        entry *grown = realloc(im->entries, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "out of memory reading the importance matrix");
        im->entries = grown;
        im->cap = cap;
    }
    entry *e = &im->entries[im->n];
    e->name = malloc(name_len + 1);
    e->values = count <= SIZE_MAX / sizeof(float) ? malloc(count * sizeof(float)) : NULL;
    e->count = count;
    if (!e->name || !e->values) {
        free(e->name);
        free(e->values);
        return em_errorf(EM_ERR_NOMEM, "out of memory reading the importance matrix");
    }
    memcpy(e->name, name, name_len);
    e->name[name_len] = 0;
    im->n++;
    *out = e;
    return NULL;
}

/* ---- GGUF ---- */

static bool strip_suffix(em_str s, const char *suffix, size_t *stem) {
    size_t m = strlen(suffix);
    if (s.len < m || memcmp(s.ptr + s.len - m, suffix, m)) return false;
    *stem = s.len - m;
    return true;
}

static const em_gguf_tensor *find_part(const em_gguf *g, const char *stem, size_t stem_len, const char *suffix) {
    char name[512];
    if (stem_len + strlen(suffix) >= sizeof name) return NULL;
    memcpy(name, stem, stem_len);
    strcpy(name + stem_len, suffix);
    return em_gguf_find_tensor(g, name);
}

static em_err load_gguf(const char *path, em_imatrix *im) {
    em_gguf *g;
    em_err err = em_gguf_open(path, &g);
    if (err) return err;
    if (!em_gguf_find(g, "imatrix.datasets") || !em_gguf_find(g, "imatrix.chunk_count") ||
        !em_gguf_find(g, "imatrix.chunk_size")) {
        em_gguf_close(g);
        return em_errorf(EM_ERR_FORMAT, "%s: not an importance matrix (no imatrix.datasets, imatrix.chunk_count "
                                        "and imatrix.chunk_size keys)", path);
    }
    if (em_gguf_get_u32(g, "imatrix.chunk_count", &im->chunks)) im->chunks = 0; /* informative only */
    for (uint64_t i = 0; i < em_gguf_tensor_count(g) && !err; i++) {
        const em_gguf_tensor *sums = em_gguf_tensor_at(g, i);
        size_t stem;
        if (!strip_suffix(sums->name, ".in_sum2", &stem)) continue;
        const em_gguf_tensor *counts = find_part(g, sums->name.ptr, stem, ".counts");
        if (!counts) {
            err = em_errorf(EM_ERR_FORMAT, "%s: %.*s has no .counts tensor", path, (int)sums->name.len, sums->name.ptr);
            break;
        }
        const uint64_t n_sums = em_gguf_tensor_elems(sums), n_counts = em_gguf_tensor_elems(counts);
        if (sums->type != EM_TYPE_F32 || counts->type != EM_TYPE_F32 || n_counts == 0 || n_sums % n_counts) {
            err = em_errorf(EM_ERR_FORMAT,
                            "%s: %.*s: sums and counts must be F32, %llu sums in whole rows of %llu counts",
                            path, (int)stem, sums->name.ptr, (unsigned long long)n_sums, (unsigned long long)n_counts);
            break;
        }
        entry *e;
        if ((err = add_entry(im, sums->name.ptr, stem, n_sums, &e))) break;
        const uint8_t *s = sums->data, *c = counts->data;
        const uint64_t cols = n_sums / n_counts;
        for (uint64_t m = 0; m < n_counts; m++) {
            float count;
            memcpy(&count, c + 4 * m, 4);
            /* llama.cpp rounds each count to an integer before dividing */
            const float whole = isfinite(count) ? (float)lroundf(count) : count;
            for (uint64_t j = 0; j < cols; j++) {
                float sum;
                memcpy(&sum, s + 4 * (m * cols + j), 4);
                e->values[m * cols + j] = whole > 0 ? sum / whole : 1.0f;
            }
        }
    }
    em_gguf_close(g);
    return err;
}

/* ---- legacy .dat ---- */

static bool read_i32(FILE *f, int32_t *v) { return fread(v, 4, 1, f) == 1; }

static em_err load_legacy(const char *path, em_imatrix *im) {
    FILE *f = fopen(path, "rb");
    if (!f) return em_errorf(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    em_err err = NULL;
    int32_t n_entries = 0;
    if (!read_i32(f, &n_entries) || n_entries < 1)
        err = em_errorf(EM_ERR_FORMAT, "%s: not an importance matrix (no GGUF header, no legacy entry count)", path);
    char name[1024];
    for (int32_t i = 0; i < n_entries && !err; i++) {
        int32_t len = 0, calls = 0, count = 0;
        long at = ftell(f);
        if (!read_i32(f, &len) || len < 1 || len >= (int32_t)sizeof name ||
            fread(name, 1, (size_t)len, f) != (size_t)len ||
            !read_i32(f, &calls) || !read_i32(f, &count) || count < 1 || count > (1 << 28)) {
            err = em_errorf(EM_ERR_FORMAT, "%s: entry %d at byte %ld is truncated or malformed", path, i + 1, at);
            break;
        }
        entry *e;
        if ((err = add_entry(im, name, (size_t)len, (uint64_t)count, &e))) break;
        if (fread(e->values, 4, (size_t)count, f) != (size_t)count) {
            err = em_errorf(EM_ERR_FORMAT, "%s: entry '%s' is truncated", path, e->name);
            break;
        }
        if (calls > 0)
            for (int32_t j = 0; j < count; j++) e->values[j] /= (float)calls;
    }
    int32_t chunks;
    if (!err && read_i32(f, &chunks) && chunks > 0) im->chunks = (uint32_t)chunks;
    fclose(f);
    return err;
}

/* ---- both ---- */

static int by_name(const void *a, const void *b) { return strcmp(((const entry *)a)->name, ((const entry *)b)->name); }

em_err em_imatrix_load(const char *path, em_imatrix **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return em_errorf(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char magic[4] = {0};
    bool gguf = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    fclose(f);
    em_imatrix *im = calloc(1, sizeof *im);
    if (!im) return em_errorf(EM_ERR_NOMEM, "out of memory");
    em_err err = gguf ? load_gguf(path, im) : load_legacy(path, im);
    if (!err && im->n == 0) err = em_errorf(EM_ERR_FORMAT, "%s: the importance matrix has no entries", path);
    for (uint64_t i = 0; i < im->n && !err; i++)
        for (uint64_t j = 0; j < im->entries[i].count; j++)
            if (!isfinite(im->entries[i].values[j])) {
                err = em_errorf(EM_ERR_FORMAT, "%s: entry '%s' has a non-finite value at %llu", path,
                                im->entries[i].name, (unsigned long long)j);
                break;
            }
    if (err) {
        em_imatrix_free(im);
        return err;
    }
    qsort(im->entries, im->n, sizeof *im->entries, by_name);
    *out = im;
    return NULL;
}

const float *em_imatrix_find(const em_imatrix *im, const char *name, uint64_t *count) {
    entry key = {.name = (char *)name};
    const entry *e = bsearch(&key, im->entries, im->n, sizeof *im->entries, by_name);
    if (!e) return NULL;
    *count = e->count;
    return e->values;
}
