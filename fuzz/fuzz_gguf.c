/* libFuzzer target: the GGUF reader must turn any byte string into a file or an error, and every
 * accessor of an accepted file must stay in bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* Copy into an exact-size allocation so ASan flags any read past the end. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    em_gguf *g;
    em_err err = em_gguf_open_buffer(copy, size, "fuzz", &g);
    if (err) {
        em_err_free(err);
        free(copy);
        return 0;
    }
    volatile uint64_t sink = 0;
    volatile double float_sink = 0;
    for (uint64_t i = 0; i < em_gguf_kv_count(g); i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(g, i);
        sink += (uint64_t)em_gguf_kv_int(kv);
        float_sink += em_gguf_kv_float(kv);
        char *key = em_str_dup(kv->key);
        if (key) {
            uint32_t u32;
            em_str s;
            em_err_free(em_gguf_get_u32(g, key, &u32));
            em_err_free(em_gguf_get_str(g, key, &s));
            free(key);
        }
        if (kv->type == EM_GGUF_ARRAY) {
            for (uint64_t j = 0; j < kv->array_len && j < 64; j++) {
                if (kv->array_type == EM_GGUF_STRING) sink += kv->strings[j].len ? (uint8_t)kv->strings[j].ptr[0] : 0;
                else sink += (uint64_t)em_gguf_array_int(kv, j), float_sink += em_gguf_array_float(kv, j);
            }
        } else if (kv->type == EM_GGUF_STRING && kv->strings[0].len) {
            sink += (uint8_t)kv->strings[0].ptr[kv->strings[0].len - 1];
        }
    }
    for (uint64_t i = 0; i < em_gguf_tensor_count(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        if (t->size) sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->size - 1];
    }
    (void)sink;
    (void)float_sink;
    em_gguf_close(g);
    free(copy);
    return 0;
}
