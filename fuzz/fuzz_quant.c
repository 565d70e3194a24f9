/* libFuzzer target: every block format must decode any byte string in bounds (grid and level
 * tables are indexed by masked bits only), and the quantizers and dot products must survive any
 * floats that come out (NaN, infinities, subnormals, huge values). The first input byte picks the
 * format, the rest are whole blocks of it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const em_type_info *info = em_type_info_of(data[0] % EM_TYPE_COUNT);
    if (!info) return 0;
    uint32_t type = data[0] % EM_TYPE_COUNT;
    /* Whole rows of 256 elements (a multiple of every block), at most 8 of them. */
    uint64_t row_bytes;
    if (em_type_row_bytes(type, 256, &row_bytes)) return 0;
    uint64_t rows = (size - 1) / row_bytes;
    if (rows == 0) return 0;
    if (rows > 8) rows = 8;
    uint64_t n = rows * 256;
    uint8_t *blocks = malloc(rows * row_bytes); /* exact size, so ASan sees any overread */
    float *values = malloc(n * sizeof(float));
    uint8_t *act = malloc(n * sizeof(float)), *requant = malloc(n * sizeof(float) + 512);
    if (!blocks || !values || !act || !requant) goto done;
    memcpy(blocks, data + 1, rows * row_bytes);
    em_err err = em_dequantize(type, blocks, values, n);
    if (err) { /* a type without a decoder */
        em_err_free(err);
        goto done;
    }
    em_err_free(em_quantize_activation(type, values, act, n));
    volatile float sink = em_dot(type, blocks, act, n) + em_dot_scalar(type, blocks, act, n);
    sink += em_dot_reference(type, blocks, act, n);
    (void)sink;
    if (em_type_can_quantize(type)) em_err_free(em_quantize(type, values, requant, n));
done:
    free(blocks);
    free(values);
    free(act);
    free(requant);
    return 0;
}
