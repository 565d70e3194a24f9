/*
 * `ember quantize`: a GGUF model rewritten with a recipe, tensor by tensor.
 *
 * The plan comes first (every tensor's type from recipe.c, the requantize and quantizer checks),
 * so a bad request fails before a byte is written. Then the writer streams: for each tensor the
 * fill callback reads rows from the input's mapping, a chunk at a time; worker threads each take a
 * contiguous range of the chunk's rows, convert them to f32 (em_dequantize) and quantize them
 * (em_quantize_rows) into the chunk's output buffer, which is then written. A tensor whose type does
 * not change is copied as it is, like llama.cpp does, so an unchanged F32 norm keeps its bytes.
 *
 * With an importance matrix, each tensor that has an entry of the right size is quantized with its
 * importance values: one vector of ne[0] values per matrix, so the rows of expert e of a 3-D stack
 * take slice e. A tensor without one is quantized unweighted, as llama.cpp does.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../gguf/gguf.h"
#include "../../quant/quant.h"
#include "quantize.h"

#define CHUNK_BYTES (32u << 20)      /* input or output bytes (the larger) quantized between writes */
#define GROUP_ELEMS (1u << 16)       /* elements a worker converts per em_quantize_rows call */
#define QUANTIZATION_VERSION 2       /* GGML_QNT_VERSION: the block layouts of today's GGUF files */

typedef struct quantizer {
    const em_quantize_options *options;
    const em_recipe *recipe;
    em_gguf **parts;
    uint32_t n_parts;
    const em_gguf_tensor **src; /* [n] across the parts */
    char **names;               /* [n] NUL-terminated */
    em_recipe_tensor *plan;     /* [n] */
    const float **importance;   /* [n] importance values (ne[0] * ne[2]) or NULL; NULL without --imatrix */
    em_imatrix *imatrix;        /* owns what importance points to */
    uint64_t n;
    uint32_t threads;
    uint8_t *out;               /* one chunk of output */
    size_t out_cap;
    em_quantize_stats stats;
} quantizer;

/* ---- the plan ---- */

static bool is_float_type(uint32_t type) {
    return type == EM_TYPE_F32 || type == EM_TYPE_F16 || type == EM_TYPE_BF16;
}

static uint32_t metadata_u32(const em_gguf *g, const char *arch, const char *suffix) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v = 0;
    em_err err = em_gguf_get_u32(g, key, &v);
    if (!err) return v;
    em_err_free(err);
    /* some families store head counts per layer: the first layer's stands for all */
    const em_gguf_kv *kv = em_gguf_find(g, key);
    if (kv && kv->type == EM_GGUF_ARRAY && kv->array_len > 0 && em_gguf_type_size(kv->array_type) > 0 &&
        kv->array_type != EM_GGUF_FLOAT32 && kv->array_type != EM_GGUF_FLOAT64)
        return (uint32_t)em_gguf_array_int(kv, 0);
    return 0;
}

static em_err plan(quantizer *q, const char *in_path) {
    const em_gguf *g = q->parts[0];
    char arch[64] = "";
    em_str s;
    em_err err = em_gguf_get_str(g, "general.architecture", &s);
    if (err) return em_err_prefix(err, "%s", in_path);
    snprintf(arch, sizeof arch, "%.*s", (int)(s.len < 63 ? s.len : 63), s.ptr);
    em_recipe_model model = {
        .arch = arch,
        .n_layer = metadata_u32(g, arch, "block_count"),
        .n_head = metadata_u32(g, arch, "attention.head_count"),
        .n_head_kv = metadata_u32(g, arch, "attention.head_count_kv"),
        .n_expert = metadata_u32(g, arch, "expert_count"),
        .imatrix = q->options->imatrix != NULL, /* llama.cpp's has_imatrix: an imatrix was given */
    };
    if (!model.n_head_kv) model.n_head_kv = model.n_head;

    for (uint32_t p = 0; p < q->n_parts; p++) q->n += em_gguf_tensor_count(q->parts[p]);
    q->src = calloc(q->n ? q->n : 1, sizeof *q->src);
    q->names = calloc(q->n ? q->n : 1, sizeof *q->names);
    q->plan = calloc(q->n ? q->n : 1, sizeof *q->plan);
    if (!q->src || !q->names || !q->plan) return em_errorf(EM_ERR_NOMEM, "out of memory planning %llu tensors",
                                                          (unsigned long long)q->n);
    uint64_t k = 0;
    for (uint32_t p = 0; p < q->n_parts; p++)
        for (uint64_t i = 0; i < em_gguf_tensor_count(q->parts[p]); i++, k++) {
            const em_gguf_tensor *t = em_gguf_tensor_at(q->parts[p], i);
            q->src[k] = t;
            if (!(q->names[k] = em_str_dup(t->name))) return em_errorf(EM_ERR_NOMEM, "out of memory");
            em_recipe_tensor *r = &q->plan[k];
            r->name = q->names[k];
            for (int d = 0; d < 4; d++) r->ne[d] = d < (int)t->n_dims ? t->ne[d] : 1;
            r->source_type = t->type;
            q->stats.n_elements += em_gguf_tensor_elems(t);
        }
    if ((err = em_recipe_apply(q->recipe, &model, q->plan, q->n))) return err;

    for (uint64_t i = 0; i < q->n; i++) {
        const em_recipe_tensor *r = &q->plan[i];
        if (r->type == r->source_type) continue;
        if (!is_float_type(r->source_type) && !q->options->allow_requantize)
            return em_errorf(EM_ERR_INVALID,
                             "%s: tensor %s is already quantized (%s); requantizing it to %s loses more than "
                             "quantizing from F32, F16 or BF16 (--allow-requantize to do it anyway)",
                             in_path, r->name, em_type_name(r->source_type), em_type_name(r->type));
        if (!em_type_can_quantize(r->type))
            return em_errorf(EM_ERR_UNSUPPORTED, "tensor %s: no quantizer for %s", r->name, em_type_name(r->type));
        const em_type_info *from = em_type_info_of(r->source_type);
        if (!from || (from->block_elems == 1 && !is_float_type(r->source_type)))
            return em_errorf(EM_ERR_UNSUPPORTED, "tensor %s: cannot convert %s to %s", r->name,
                             em_type_name(r->source_type), em_type_name(r->type));
        q->stats.n_quantized++;
        if (r->fallback) q->stats.n_fallback++;
        if (r->llama_type != r->type) q->stats.n_stand_in++;
    }
    return NULL;
}

/* ---- metadata ---- */

static bool is_key(const em_gguf_kv *kv, const char *key) { return em_str_eq(kv->key, key); }

static em_err write_metadata(quantizer *q, em_gguf_writer *w) {
    const em_gguf *g = q->parts[0];
    const int32_t file_type = em_recipe_file_type(q->recipe);
    bool wrote_file_type = false, wrote_version = false;
    em_err err = NULL;
    for (uint64_t i = 0; i < em_gguf_kv_count(g) && !err; i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(g, i);
        if (is_key(kv, "split.no") || is_key(kv, "split.count") || is_key(kv, "split.tensors.count")) continue;
        if (is_key(kv, "general.file_type")) {
            /* `mix` has no llama_ftype: the key goes, and readers guess from the tensors */
            if (file_type >= 0) err = em_gguf_writer_add_u32(w, "general.file_type", (uint32_t)file_type);
            wrote_file_type = true;
        } else if (is_key(kv, "general.quantization_version")) {
            err = em_gguf_writer_add_u32(w, "general.quantization_version", QUANTIZATION_VERSION);
            wrote_version = true;
        } else {
            err = em_gguf_writer_copy_kv(w, kv);
        }
    }
    if (!err && !wrote_version) err = em_gguf_writer_add_u32(w, "general.quantization_version", QUANTIZATION_VERSION);
    if (!err && !wrote_file_type && file_type >= 0)
        err = em_gguf_writer_add_u32(w, "general.file_type", (uint32_t)file_type);
    return err;
}

/* ---- the tensor data ---- */

typedef struct work {
    const quantizer *q;
    const em_recipe_tensor *r;
    const uint8_t *src;         /* first row of the chunk */
    uint8_t *dst;
    uint64_t cols, first, count; /* rows [first, first + count) of the chunk */
    uint64_t src_row, dst_row;   /* bytes */
    const float *importance;     /* the tensor's importance values, or NULL */
    uint64_t chunk_row;          /* index in the tensor of the chunk's first row */
    em_err err;
} work;

static void *quantize_rows(void *arg) {
    work *w = arg;
    const uint64_t group = w->cols >= GROUP_ELEMS ? 1 : GROUP_ELEMS / w->cols;
    const uint64_t matrix_rows = w->r->ne[1]; /* rows of one matrix of an expert stack */
    float *f32 = malloc(group * w->cols * sizeof *f32);
    if (!f32) {
        w->err = em_errorf(EM_ERR_NOMEM, "out of memory quantizing %s", w->r->name);
        return NULL;
    }
    for (uint64_t row = w->first, n; row < w->first + w->count && !w->err; row += n) {
        n = w->first + w->count - row < group ? w->first + w->count - row : group;
        const float *importance = NULL;
        if (w->importance) { /* the slice of this row's matrix; a group stays within one matrix */
            const uint64_t in_tensor = w->chunk_row + row, matrix = in_tensor / matrix_rows;
            const uint64_t left = matrix_rows - in_tensor % matrix_rows;
            if (n > left) n = left;
            importance = w->importance + matrix * w->cols;
        }
        w->err = em_dequantize(w->r->source_type, w->src + row * w->src_row, f32, n * w->cols);
        if (!w->err) w->err = em_quantize_rows(w->r->type, f32, w->dst + row * w->dst_row, n, w->cols, importance);
    }
    free(f32);
    return NULL;
}

/* Quantizes `rows` rows into q->out over the worker threads (the calling thread is one of them). */
static em_err quantize_chunk(const quantizer *q, const em_recipe_tensor *r, const float *importance, uint64_t chunk_row,
                             const uint8_t *src, uint64_t rows, uint64_t cols, uint64_t src_row, uint64_t dst_row) {
    uint32_t n_workers = q->threads;
    if (n_workers > rows) n_workers = (uint32_t)rows;
    if (n_workers > 256) n_workers = 256;
    work works[256];
    pthread_t ids[256];
    bool started[256] = {false};
    for (uint32_t k = 0; k < n_workers; k++) {
        const uint64_t first = rows * k / n_workers, end = rows * (k + 1) / n_workers;
        works[k] = (work){.q = q, .r = r, .src = src, .dst = q->out, .cols = cols, .first = first,
                          .count = end - first, .src_row = src_row, .dst_row = dst_row, .importance = importance,
                          .chunk_row = chunk_row};
    }
    for (uint32_t k = 1; k < n_workers; k++) started[k] = pthread_create(&ids[k], NULL, quantize_rows, &works[k]) == 0;
    for (uint32_t k = 1; k < n_workers; k++)
        if (!started[k]) quantize_rows(&works[k]); /* no thread to be had: do its share here */
    quantize_rows(&works[0]);
    em_err err = NULL;
    for (uint32_t k = 0; k < n_workers; k++) {
        if (k > 0 && started[k]) pthread_join(ids[k], NULL);
        if (works[k].err && !err) err = works[k].err;
        else if (works[k].err) em_err_free(works[k].err);
    }
    return err;
}

/* Input pages already quantized are dropped (read again from the file if touched), so quantizing
 * keeps about one chunk of the input resident rather than every page read so far. Whole pages
 * inside the range only: a page shared with the next rows stays. */
static void release_pages(const void *data, uint64_t size) {
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    uintptr_t begin = ((uintptr_t)data + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t end = ((uintptr_t)data + size) & ~((uintptr_t)page - 1);
    if (end > begin) madvise((void *)begin, end - begin, MADV_DONTNEED);
}

static em_err fill(void *user, uint64_t index, void *file_, uint64_t size) {
    quantizer *q = user;
    FILE *file = file_;
    const em_gguf_tensor *t = q->src[index];
    const em_recipe_tensor *r = &q->plan[index];
    const uint64_t cols = r->ne[0], rows = em_gguf_tensor_elems(t) / cols;
    uint64_t src_row, dst_row;
    em_err err = em_type_row_bytes(r->source_type, cols, &src_row);
    if (!err) err = em_type_row_bytes(r->type, cols, &dst_row);
    if (err) return em_err_prefix(err, "tensor %s", r->name);
    if (dst_row * rows != size)
        return em_errorf(EM_ERR_INTERNAL, "tensor %s: %llu bytes planned, the writer expects %llu", r->name,
                         (unsigned long long)(dst_row * rows), (unsigned long long)size);
    if (r->type == r->source_type) {
        if (fwrite(t->data, 1, size, file) != size) return em_errorf(EM_ERR_IO, "writing tensor %s failed", r->name);
    } else {
        /* rows per chunk: CHUNK_BYTES of input or of output, whichever is larger */
        const uint64_t widest = src_row > dst_row ? src_row : dst_row;
        const uint64_t chunk = widest >= CHUNK_BYTES ? 1 : CHUNK_BYTES / widest;
        for (uint64_t row = 0; row < rows; row += chunk) {
            const uint64_t n = rows - row < chunk ? rows - row : chunk;
            if ((err = quantize_chunk(q, r, q->importance ? q->importance[index] : NULL, row,
                                      (const uint8_t *)t->data + row * src_row, n, cols, src_row, dst_row)))
                return em_err_prefix(err, "tensor %s", r->name);
            if (fwrite(q->out, 1, n * dst_row, file) != n * dst_row)
                return em_errorf(EM_ERR_IO, "writing tensor %s failed", r->name);
            release_pages((const uint8_t *)t->data + row * src_row, n * src_row);
        }
    }
    release_pages(t->data, t->size);
    q->stats.bytes_in += t->size;
    q->stats.bytes_out += size;
    if (q->options->progress) {
        em_quantize_progress p = {.index = index + 1, .count = q->n, .name = r->name, .from = r->source_type,
                                  .to = r->type, .llama_type = r->llama_type, .fallback = r->fallback,
                                  .bytes_in = t->size, .bytes_out = size,
                                  .importance = !q->imatrix || r->type == r->source_type ? EM_IMPORTANCE_NONE
                                                : q->importance[index] ? EM_IMPORTANCE_USED
                                                                       : EM_IMPORTANCE_MISSING};
        q->options->progress(q->options->user, &p);
    }
    return NULL;
}

/* ---- the importance matrix ---- */

/* Read, checked against the tensors like llama.cpp checks it (a size that does not match a
 * quantized tensor is an error, except for token_embd, which imatrix files often describe wrongly
 * and which is then quantized unweighted), and each quantized tensor given its importance values. */
static em_err load_imatrix(quantizer *q, const char *path) {
    em_err err = em_imatrix_load(path, &q->imatrix);
    if (err) return err;
    if (!(q->importance = calloc(q->n ? q->n : 1, sizeof *q->importance)))
        return em_errorf(EM_ERR_NOMEM, "out of memory");
    q->stats.imatrix_entries = em_imatrix_count(q->imatrix);
    for (uint64_t i = 0; i < q->n && !err; i++) {
        const em_recipe_tensor *r = &q->plan[i];
        uint64_t count;
        const float *values;
        if (r->type == r->source_type || !(values = em_imatrix_find(q->imatrix, r->name, &count))) continue;
        if (count == r->ne[0] * r->ne[2]) {
            q->importance[i] = values;
            q->stats.imatrix_matched++;
            if (em_type_uses_importance(r->type)) q->stats.imatrix_weighted++;
        } else if (strcmp(r->name, "token_embd.weight")) {
            err = em_errorf(EM_ERR_FORMAT, "%s: %llu importance values for %s, which needs %llu (columns x matrices)",
                            path, (unsigned long long)count, r->name, (unsigned long long)(r->ne[0] * r->ne[2]));
        }
    }
    return err;
}

/* ---- the whole rewrite ---- */

em_err em_quantize_gguf(const char *in_path, const char *out_path, const em_quantize_options *options,
                        em_quantize_stats *stats) {
    quantizer q = {.options = options};
    em_err err = em_recipe_find(options->type, &q.recipe);
    if (err) return err;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    q.threads = options->threads ? options->threads : cpus > 0 ? (uint32_t)cpus : 1;
    if ((err = em_gguf_open_parts(in_path, &q.parts, &q.n_parts))) return err;
    em_gguf_writer *w = NULL;
    if ((err = plan(&q, in_path))) goto done;
    if (options->imatrix && (err = load_imatrix(&q, options->imatrix))) goto done;
    if ((err = em_gguf_writer_new(3, &w))) goto done;
    if ((err = write_metadata(&q, w))) goto done;
    for (uint64_t i = 0; i < q.n && !err; i++) {
        const em_gguf_tensor *t = q.src[i];
        err = em_gguf_writer_add_tensor(w, q.names[i], t->n_dims, q.plan[i].ne, q.plan[i].type, NULL, false);
    }
    if (err) goto done;
    q.out_cap = CHUNK_BYTES;
    for (uint64_t i = 0; i < q.n && !err; i++) { /* one row may exceed the chunk */
        uint64_t row = 0;
        err = em_type_row_bytes(q.plan[i].type, q.plan[i].ne[0], &row);
        if (row > q.out_cap) q.out_cap = row;
    }
    if (err) goto done;
    if (!(q.out = malloc(q.out_cap))) {
        err = em_errorf(EM_ERR_NOMEM, "out of memory for a %zu-byte output chunk", q.out_cap);
        goto done;
    }
    err = em_gguf_writer_write_streaming(w, out_path, fill, &q);
done:
    if (!err && stats) {
        *stats = q.stats;
        stats->n_tensors = q.n;
    }
    em_gguf_writer_free(w);
    for (uint64_t i = 0; q.names && i < q.n; i++) free(q.names[i]);
    free(q.names);
    free(q.src);
    free(q.plan);
    free(q.importance);
    em_imatrix_free(q.imatrix);
    free(q.out);
    em_gguf_close_parts(q.parts, q.n_parts);
    return err;
}
