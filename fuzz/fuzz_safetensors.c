/* libFuzzer target: the safetensors reader must turn any byte string into a file or an error, and
 * every tensor of an accepted file must be readable (converted to f32 where its dtype allows)
 * without leaving the buffer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/convert/convert.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* Copy into an exact-size allocation so ASan flags any read past the end. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    em_safetensors *st;
    em_err err = em_safetensors_parse(copy, size, "fuzz", &st);
    if (err) {
        em_err_free(err);
        free(copy);
        return 0;
    }
    volatile float sink = 0;
    float buf[64];
    for (size_t i = 0; i < em_safetensors_count(st); i++) {
        const em_st_tensor *t = em_safetensors_at(st, i);
        if (em_safetensors_find(st, t->name) == NULL) abort(); /* every listed name is found */
        /* the first and the last elements: the ends of the tensor's extent */
        uint64_t n = t->n_elems < 64 ? t->n_elems : 64;
        em_err_free(em_st_read_f32(t, 0, n, buf));
        em_err_free(em_st_read_f32(t, t->n_elems - n, n, buf));
        for (uint64_t j = 0; j < n; j++) sink += buf[j];
        volatile uint8_t touch = 0;
        if (t->size) touch = (uint8_t)(t->data[0] ^ t->data[t->size - 1]);
        (void)touch;
    }
    (void)sink;
    em_safetensors_close(st);
    free(copy);
    return 0;
}
