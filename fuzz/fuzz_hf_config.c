/* libFuzzer target: config.json parsing must turn any byte string into a config or an error, and an
 * accepted config's layer table must hold one entry per layer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/convert/convert.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    em_hf_config c;
    em_err err = em_hf_config_parse(copy, size, "fuzz", &c);
    if (err) {
        em_err_free(err);
    } else {
        volatile uint32_t sliding = 0;
        for (uint32_t i = 0; c.layer_sliding && i < c.n_layer; i++) sliding += c.layer_sliding[i];
        if (c.n_head == 0 || c.n_head_kv == 0 || c.n_head % c.n_head_kv) abort(); /* validated */
        em_hf_config_free(&c);
    }
    free(copy);
    return 0;
}
