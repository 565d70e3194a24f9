/* The tensor data of a conversion (internal.h): each output row converted to f32 from its source
 * (transformed as the plan says: Q/K rows permuted, Gemma's + 1 on norms, A_log's −exp, value heads
 * reordered, strided or MXFP4 experts), a chunk of rows at a time straight from the mapped source
 * files, then quantized to the tensor's type and written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../quant/quant.h"
#include "internal.h"

/* ---- streaming the tensor data ---- */

/* Element offset, in its source tensor, of output row `row` (0 ≤ row < ne[1] * ne[2]). */
static const em_st_tensor *row_source(const plan_tensor *t, uint64_t row, uint64_t *first) {
    const uint64_t rows = t->ne[1], cols = t->ne[0];
    uint64_t mat = row / rows, r = row % rows;
    if (t->permute_heads) {
        /* llama.cpp's permute: rows of a head are (half, i) in HF order, (i, half) in GGUF order. */
        uint64_t per = rows / t->permute_heads, h = r / per, i = (r % per) / 2, half = r % 2;
        r = h * per + half * (per / 2) + i;
    }
    switch (t->kind) {
    case SRC_EXPERTS: *first = r * cols; return t->src[mat];
    case SRC_FUSED_FIRST: *first = (mat * 2 * rows + r) * cols; return t->src[0];
    case SRC_FUSED_SECOND: *first = (mat * 2 * rows + rows + r) * cols; return t->src[0];
    default: *first = (mat * rows + r) * cols; return t->src[0];
    }
}

/* Output row `row` of a SRC_STRIDED tensor into dst: its matrix read whole into the slab first. */
static em_err read_strided_row(converter *cv, const plan_tensor *t, uint64_t row, float *dst) {
    const em_st_tensor *s = t->src[0];
    const uint64_t mat = row / t->ne[1], r = row % t->ne[1];
    const uint64_t start = mat * t->mat_stride, len = t->mat_stride ? t->mat_stride : s->n_elems;
    if (start + len > s->n_elems)
        return em_errorf(EM_ERR_INTERNAL, "tensor %s: matrix %llu past the end of '%s'", t->name,
                         (unsigned long long)mat, s->name);
    if (cv->slab_src != s || cv->slab_start != start || cv->slab_len != len) {
        if (len > cv->slab_cap) {
            float *grown = realloc(cv->slab, len * sizeof *grown);
            if (!grown) return em_errorf(EM_ERR_NOMEM, "out of memory for a matrix of '%s'", s->name);
            cv->slab = grown;
            cv->slab_cap = len;
        }
        cv->slab_src = NULL;
        em_err err = em_st_read_f32(s, start, len, cv->slab);
        if (err) return err;
        cv->slab_src = s, cv->slab_start = start, cv->slab_len = len;
    }
    const float *base = cv->slab + r * t->row_stride + t->first;
    for (uint64_t c = 0; c < t->ne[0]; c++) dst[c] = base[c * t->col_stride];
    return NULL;
}

/* The MXFP4 block of 32 values whose E2M1 codes the checkpoint packs two a byte in order (element
 * 2i in the low nibble of byte i, 2i + 1 in its high one), in GGML's order: the exponent byte, then
 * byte j holding element j in its low nibble and element j + 16 in its high one. */
static void repack_mxfp4_block(uint8_t exponent, const uint8_t *packed, uint8_t *out) {
    uint8_t code[32];
    for (int i = 0; i < 16; i++) {
        code[2 * i] = packed[i] & 15;
        code[2 * i + 1] = packed[i] >> 4;
    }
    out[0] = exponent;
    for (int j = 0; j < 16; j++) out[1 + j] = (uint8_t)(code[j] | code[j + 16] << 4);
}

static em_err fill_mxfp4(converter *cv, const plan_tensor *t, FILE *file, uint64_t size) {
    const uint64_t cols = t->ne[0], rows = t->ne[1], n_blocks = cols / 32, row_bytes = n_blocks * 17;
    const uint64_t source_rows = rows * t->row_step; /* of one matrix */
    if (row_bytes * rows * t->ne[2] != size)
        return em_errorf(EM_ERR_INTERNAL, "tensor %s: %llu bytes planned, writer expects %llu", t->name,
                         (unsigned long long)(row_bytes * rows * t->ne[2]), (unsigned long long)size);
    if (row_bytes > cv->buf_elems * sizeof(float)) {
        uint8_t *grown = realloc(cv->out, row_bytes);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "out of memory converting %s", t->name);
        cv->out = grown;
        cv->buf_elems = (row_bytes + sizeof(float) - 1) / sizeof(float);
        float *buf = realloc(cv->buf, cv->buf_elems * sizeof *buf);
        if (!buf) return em_errorf(EM_ERR_NOMEM, "out of memory converting %s", t->name);
        cv->buf = buf;
    }
    uint8_t *out = cv->out;
    for (uint64_t mat = 0; mat < t->ne[2]; mat++)
        for (uint64_t r = 0; r < rows; r++) {
            const uint64_t source_row = mat * source_rows + r * t->row_step + t->row_first;
            const uint8_t *blocks = t->src[0]->data + source_row * n_blocks * 16;
            const uint8_t *exponents = t->scales->data + source_row * n_blocks;
            for (uint64_t b = 0; b < n_blocks; b++) repack_mxfp4_block(exponents[b], blocks + b * 16, out + b * 17);
            if (fwrite(out, 1, row_bytes, file) != row_bytes)
                return em_errorf(EM_ERR_IO, "writing tensor %s failed", t->name);
        }
    em_st_release(t->src[0]);
    em_st_release(t->scales);
    return NULL;
}

/* A row whose columns are value heads to reorder: read whole into the slab, then gathered. */
static em_err read_tiled_columns(converter *cv, const em_st_tensor *s, uint64_t first, uint64_t cols,
                                 const plan_tensor *t, float *dst) {
    if (cols > cv->slab_cap) {
        float *grown = realloc(cv->slab, cols * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "out of memory for a row of '%s'", s->name);
        cv->slab = grown;
        cv->slab_cap = cols;
    }
    cv->slab_src = NULL; /* the slab no longer holds a strided matrix */
    em_err err = em_st_read_f32(s, first, cols, cv->slab);
    if (err) return err;
    for (uint64_t c = 0; c < cols; c++) dst[c] = cv->slab[em_convert_value_source(t, c)];
    return NULL;
}

em_err em_convert_fill(void *user, uint64_t index, void *file, uint64_t size) {
    converter *cv = user;
    const plan_tensor *t = &cv->plan.t[index];
    if (t->kind == SRC_MXFP4) return fill_mxfp4(cv, t, file, size);
    const uint64_t cols = t->ne[0], n_rows = t->ne[1] * t->ne[2];
    uint64_t row_bytes;
    em_err err = em_type_row_bytes(t->type, cols, &row_bytes);
    if (err) return err;
    if (row_bytes * n_rows != size)
        return em_errorf(EM_ERR_INTERNAL, "tensor %s: %llu bytes planned, writer expects %llu", t->name,
                         (unsigned long long)(row_bytes * n_rows), (unsigned long long)size);
    if (cols > cv->buf_elems) {
        float *grown = realloc(cv->buf, cols * sizeof *grown);
        uint8_t *out = grown ? realloc(cv->out, row_bytes > cols * 4 ? row_bytes : cols * 4) : NULL;
        if (grown) cv->buf = grown;
        if (!out) return em_errorf(EM_ERR_NOMEM, "out of memory converting %s", t->name);
        cv->out = out;
        cv->buf_elems = cols;
    }
    /* Rows per chunk: as many as fit the buffer (at least one). */
    const uint64_t chunk = cv->buf_elems / cols;
    for (uint64_t r0 = 0; r0 < n_rows; r0 += chunk) {
        uint64_t nr = n_rows - r0 < chunk ? n_rows - r0 : chunk;
        for (uint64_t r = 0; r < nr; r++) {
            float *dst = cv->buf + r * cols;
            if (t->kind == SRC_GENERATED) {
                memcpy(dst, t->generated + (r0 + r) * cols, cols * sizeof *dst);
                continue;
            }
            if (t->kind == SRC_STRIDED) {
                if ((err = read_strided_row(cv, t, r0 + r, dst))) return em_err_prefix(err, "tensor %s", t->name);
                continue;
            }
            uint64_t first;
            const uint64_t row = t->values == VALUES_TILED_ROWS ? em_convert_value_source(t, r0 + r) : r0 + r;
            const em_st_tensor *s = row_source(t, row, &first);
            if (t->values == VALUES_TILED_COLUMNS) {
                err = read_tiled_columns(cv, s, first, cols, t, dst);
            } else if (t->permute_heads && t->n_dims == 1) {
                /* a Q/K bias: its elements are the rows of the matching weight, permuted alike */
                plan_tensor as_rows = *t;
                as_rows.ne[0] = 1;
                as_rows.ne[1] = cols;
                for (uint64_t i = 0; i < cols && !err; i++) {
                    s = row_source(&as_rows, i, &first);
                    err = em_st_read_f32(s, first, 1, dst + i);
                }
            } else {
                err = em_st_read_f32(s, first, cols, dst);
            }
            if (err) return em_err_prefix(err, "tensor %s", t->name);
            if (t->add_one)
                for (uint64_t i = 0; i < cols; i++) dst[i] += 1.0f;
            if (t->negative_exp)
                for (uint64_t i = 0; i < cols; i++) dst[i] = -expf(dst[i]);
        }
        if ((err = em_quantize(t->type, cv->buf, cv->out, nr * cols))) return em_err_prefix(err, "tensor %s", t->name);
        if (fwrite(cv->out, 1, nr * row_bytes, (FILE *)file) != nr * row_bytes)
            return em_errorf(EM_ERR_IO, "writing tensor %s failed", t->name);
    }
    if (t->kind == SRC_EXPERTS)
        for (uint64_t e = 0; e < t->ne[2]; e++) em_st_release(t->src[e]);
    else if (t->kind != SRC_GENERATED)
        em_st_release(t->src[0]);
    return NULL;
}
