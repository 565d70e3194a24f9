/* A safetensors writer for the converter's tests, which build checkpoints of their own or from the
 * fixtures': the header's length as 8 little-endian bytes, the header (a JSON object of tensors,
 * each {"dtype", "shape", "data_offsets"} into the data), then the data. */
#ifndef EMBER_TEST_SAFETENSORS_WRITER_H
#define EMBER_TEST_SAFETENSORS_WRITER_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Takes the reference to `header`. */
static inline void write_safetensors(const char *path, json_t *header, const void *data, size_t size) {
    char *h = json_dumps(header, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(header);
    assert_non_null(h);
    size_t hn = strlen(h);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)hn >> (8 * i));
    assert_int_equal(fwrite(len, 1, 8, f), 8);
    assert_int_equal(fwrite(h, 1, hn, f), hn);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
    free(h);
}

/* A checkpoint being written: its header and data. */
typedef struct checkpoint_writer {
    json_t *header;
    uint8_t *data;
    size_t used, cap;
} checkpoint_writer;

/* Room for tensor `name` of `bytes` bytes; takes the reference to `shape`. The pointer holds until
 * the next put. */
static inline void *put(checkpoint_writer *w, const char *name, const char *dtype, json_t *shape, size_t bytes) {
    if (w->used + bytes > w->cap) {
        w->cap = 2 * (w->used + bytes);
        w->data = realloc(w->data, w->cap);
        assert_non_null(w->data);
    }
    json_object_set_new(w->header, name,
                        json_pack("{s:s,s:o,s:[I,I]}", "dtype", dtype, "shape", shape, "data_offsets",
                                  (json_int_t)w->used, (json_int_t)(w->used + bytes)));
    void *at = w->data + w->used;
    w->used += bytes;
    return at;
}

#endif
