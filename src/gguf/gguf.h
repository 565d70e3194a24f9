/*
 * gguf — reading and writing GGUF files (versions 2 and 3).
 *
 * Reading maps the file (or takes a caller's buffer) and validates all of it before anything else
 * sees it: magic, version, counts, every string and array length, every metadata value type,
 * tensor dimensions, types and row lengths against the block table of quant, data offsets and
 * sizes (inside the file, aligned, not overlapping). A failure is an error naming the file, the
 * byte offset and the field. After a successful open every accessor is a bounds-safe lookup:
 * nothing here reads outside the mapping, whatever the file holds.
 *
 * Ownership: an em_gguf owns its mapping and the index arrays built while validating. Strings
 * (em_str) and tensor data pointers point into the mapping and live as long as the em_gguf.
 * Strings are NOT NUL-terminated (GGUF stores lengths); use em_str_eq / em_str_dup.
 *
 * Writing builds a file from metadata and tensors in the order given, with tensor data aligned to
 * `general.alignment` (32 by default) and zero padding, which is how GGUF files are laid out;
 * reading a canonical file and writing back what was read gives the same bytes.
 *
 * Depends on base and quant (for the type table).
 */
#ifndef EMBER_GGUF_H
#define EMBER_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

#define EM_GGUF_MAX_DIMS 4
#define EM_GGUF_DEFAULT_ALIGNMENT 32

/* Metadata value types, with the numbers GGUF stores. */
typedef enum em_gguf_type {
    EM_GGUF_UINT8 = 0,
    EM_GGUF_INT8 = 1,
    EM_GGUF_UINT16 = 2,
    EM_GGUF_INT16 = 3,
    EM_GGUF_UINT32 = 4,
    EM_GGUF_INT32 = 5,
    EM_GGUF_FLOAT32 = 6,
    EM_GGUF_BOOL = 7,
    EM_GGUF_STRING = 8,
    EM_GGUF_ARRAY = 9,
    EM_GGUF_UINT64 = 10,
    EM_GGUF_INT64 = 11,
    EM_GGUF_FLOAT64 = 12,
} em_gguf_type;

/* A length-counted string, not NUL-terminated. */
typedef struct em_str {
    const char *ptr;
    uint64_t len;
} em_str;

/* One metadata entry. For scalars, `data` points at the value's bytes (little-endian, as stored).
 * For arrays, `array_type` and `array_len` describe the elements; `data` points at the first
 * element for arrays of fixed-size elements, and `strings` holds the elements of string arrays. */
typedef struct em_gguf_kv {
    em_str key;
    em_gguf_type type;
    em_gguf_type array_type; /* only for EM_GGUF_ARRAY */
    uint64_t array_len;      /* only for EM_GGUF_ARRAY */
    const uint8_t *data;     /* scalar value, or first element of a fixed-size array */
    const em_str *strings;   /* string value (one entry) or string array elements */
    uint64_t offset;         /* byte offset of the entry's key in the file, for messages */
} em_gguf_kv;

typedef struct em_gguf_tensor {
    em_str name;
    uint32_t n_dims;
    uint64_t ne[EM_GGUF_MAX_DIMS]; /* elements per dimension, ne[0] is the row length; unused = 1 */
    uint32_t type;                 /* GGML type id (quant.h em_type) */
    uint64_t offset;               /* relative to the start of the data section */
    uint64_t size;                 /* bytes */
    const void *data;              /* into the mapping */
} em_gguf_tensor;

typedef struct em_gguf em_gguf;

/* Where an open file's bytes live. A mapping shares the page cache's pages and costs no time or
 * memory up front; a private copy (the file read into anonymous memory, on huge pages where the
 * kernel gives them) takes the file's size in memory and a read of it, and on some machines streams
 * much faster than the page cache's pages (bench/RESULTS.md, "CPU: more sequences, weights in
 * memory"), which is what a CPU decode does. */
typedef enum em_gguf_memory {
    EM_GGUF_MAPPED,  /* the file mapped read-only */
    EM_GGUF_PRIVATE, /* the file read into private memory (mapped instead if that memory is refused) */
} em_gguf_memory;

/* Opens and validates a file, mapped. On error *out is NULL. */
em_err em_gguf_open(const char *path, em_gguf **out);

/* The same, its bytes where `memory` says. */
em_err em_gguf_open_as(const char *path, em_gguf_memory memory, em_gguf **out);

/* Whether the file's bytes are a private copy (EM_GGUF_PRIVATE that got its memory). */
bool em_gguf_is_private(const em_gguf *gguf);

/* Validates a caller's buffer (not copied: it must outlive the em_gguf). `name` is used in
 * messages. */
em_err em_gguf_open_buffer(const void *data, size_t size, const char *name, em_gguf **out);

void em_gguf_close(em_gguf *gguf);

const char *em_gguf_path(const em_gguf *gguf);
uint32_t em_gguf_version(const em_gguf *gguf);
uint32_t em_gguf_alignment(const em_gguf *gguf);
uint64_t em_gguf_file_size(const em_gguf *gguf);
uint64_t em_gguf_data_offset(const em_gguf *gguf); /* start of the tensor data section */

uint64_t em_gguf_kv_count(const em_gguf *gguf);
const em_gguf_kv *em_gguf_kv_at(const em_gguf *gguf, uint64_t index);
/* NULL when absent. */
const em_gguf_kv *em_gguf_find(const em_gguf *gguf, const char *key);

/* Typed getters: EM_ERR_NOT_FOUND when the key is missing, EM_ERR_TYPE when it has another type.
 * Integer getters accept any integer type whose value fits the result. */
em_err em_gguf_get_u32(const em_gguf *gguf, const char *key, uint32_t *out);
em_err em_gguf_get_u64(const em_gguf *gguf, const char *key, uint64_t *out);
em_err em_gguf_get_i64(const em_gguf *gguf, const char *key, int64_t *out);
em_err em_gguf_get_f32(const em_gguf *gguf, const char *key, float *out); /* float32 or float64 */
em_err em_gguf_get_bool(const em_gguf *gguf, const char *key, bool *out);
em_err em_gguf_get_str(const em_gguf *gguf, const char *key, em_str *out);
/* An array with elements of `element_type`; *out_kv gives access to the elements. */
em_err em_gguf_get_array(const em_gguf *gguf, const char *key, em_gguf_type element_type,
                         const em_gguf_kv **out_kv);

/* Element access for fixed-size arrays (index must be < array_len; checked, returns 0 when not). */
int64_t em_gguf_array_int(const em_gguf_kv *kv, uint64_t index);
double em_gguf_array_float(const em_gguf_kv *kv, uint64_t index);

/* Scalar value of a kv as a number (integers, floats, bool); 0 for other types. */
int64_t em_gguf_kv_int(const em_gguf_kv *kv);
double em_gguf_kv_float(const em_gguf_kv *kv);

uint64_t em_gguf_tensor_count(const em_gguf *gguf);
const em_gguf_tensor *em_gguf_tensor_at(const em_gguf *gguf, uint64_t index);
const em_gguf_tensor *em_gguf_find_tensor(const em_gguf *gguf, const char *name); /* NULL if absent */
uint64_t em_gguf_tensor_elems(const em_gguf_tensor *tensor);

/* Size in bytes of one element of a metadata type (0 for string and array). */
size_t em_gguf_type_size(em_gguf_type type);
const char *em_gguf_type_name(em_gguf_type type);

/* String helpers. */
bool em_str_eq(em_str s, const char *cstr);
char *em_str_dup(em_str s); /* malloc'd NUL-terminated copy; NULL on allocation failure */

/* ---- Writing ---- */

typedef struct em_gguf_writer em_gguf_writer;

em_err em_gguf_writer_new(uint32_t version, em_gguf_writer **out);
void em_gguf_writer_free(em_gguf_writer *writer);

/* Metadata, in the order added. Keys and strings are copied. Adding `general.alignment` (uint32)
 * sets the alignment of tensor data. */
em_err em_gguf_writer_add_u8(em_gguf_writer *w, const char *key, uint8_t v);
em_err em_gguf_writer_add_u16(em_gguf_writer *w, const char *key, uint16_t v);
em_err em_gguf_writer_add_u32(em_gguf_writer *w, const char *key, uint32_t v);
em_err em_gguf_writer_add_i32(em_gguf_writer *w, const char *key, int32_t v);
em_err em_gguf_writer_add_u64(em_gguf_writer *w, const char *key, uint64_t v);
em_err em_gguf_writer_add_f32(em_gguf_writer *w, const char *key, float v);
em_err em_gguf_writer_add_bool(em_gguf_writer *w, const char *key, bool v);
em_err em_gguf_writer_add_str(em_gguf_writer *w, const char *key, const char *v);
em_err em_gguf_writer_add_strn(em_gguf_writer *w, const char *key, const char *v, uint64_t len);
/* Fixed-size element array: `count` elements of `element_type`, little-endian bytes copied. */
em_err em_gguf_writer_add_array(em_gguf_writer *w, const char *key, em_gguf_type element_type,
                                const void *elements, uint64_t count);
/* String array. `lengths` may be NULL for NUL-terminated strings. */
em_err em_gguf_writer_add_str_array(em_gguf_writer *w, const char *key, const char *const *strings,
                                    const uint64_t *lengths, uint64_t count);
/* Copies one metadata entry from a file being read (any type, arrays included). */
em_err em_gguf_writer_copy_kv(em_gguf_writer *w, const em_gguf_kv *kv);

/* Tensors, in the order added. `data` is not copied when `copy` is false: it must stay valid
 * until em_gguf_writer_write returns. With data == NULL, the tensor is announced here and its
 * bytes are produced later by the `fill` callback of em_gguf_writer_write_streaming. */
em_err em_gguf_writer_add_tensor(em_gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *ne,
                                 uint32_t type, const void *data, bool copy);

/* Writes the whole file. A regular file is written under a temporary name beside `path` and renamed
 * over it when complete: readers of the old file (a model being served) keep it intact, and a
 * failed write leaves it unchanged. */
em_err em_gguf_writer_write(const em_gguf_writer *w, const char *path);

/* Writes the header, then asks `fill` for each tensor's bytes in order (tensors added with data
 * == NULL); lets large files be written without holding all data in memory. `fill` writes exactly
 * `size` bytes to `file` (a FILE*) and returns NULL or an error. */
typedef em_err (*em_gguf_fill_fn)(void *user, uint64_t tensor_index, void *file, uint64_t size);
em_err em_gguf_writer_write_streaming(const em_gguf_writer *w, const char *path, em_gguf_fill_fn fill,
                                      void *user);

/* ---- Split sets (split.c) ----
 *
 * llama.cpp's gguf-split stores one model as NAME-00001-of-0000N.gguf ... NAME-0000N-of-0000N.gguf.
 * Every part is a complete GGUF file holding some of the tensors (each tensor in exactly one part)
 * and the keys split.no (0-based part number), split.count (N) and, in the first part,
 * split.tensors.count (the tensors of all parts); the first part also holds all other metadata. */

#define EM_GGUF_SPLIT_MAX_PARTS 65535 /* split.count is a uint16 */

/* Parses a part's file name: "dir/NAME-00002-of-00003.gguf" gives part 2 (1-based), count 3 and
 * prefix_len = the length of "dir/NAME". False when the name does not have that form. */
bool em_gguf_split_name(const char *path, uint32_t *part, uint32_t *count, size_t *prefix_len);

/* Opens `path` and, when it is the first part of a split set, every other part from beside it,
 * checking that they agree (split.no, split.count, split.tensors.count, no tensor in two parts).
 * An unsplit file gives one part. A missing part is an error naming its path; so is opening a part
 * other than the first. *parts (malloc'd, closed with em_gguf_close_parts) starts with `path`. */
em_err em_gguf_open_parts(const char *path, em_gguf ***parts, uint32_t *n_parts);
em_err em_gguf_open_parts_as(const char *path, em_gguf_memory memory, em_gguf ***parts, uint32_t *n_parts);
void em_gguf_close_parts(em_gguf **parts, uint32_t n_parts);

/* Writes what `gguf` holds as a split set of `n_parts` files PREFIX-0000i-of-0000N.gguf, the tensors
 * divided in order into parts of equal count (the last takes the rest), the metadata in the first,
 * as gguf-split lays it out. */
em_err em_gguf_write_split(const em_gguf *gguf, uint32_t n_parts, const char *prefix);

#endif
