/* AVX2 dot products: placeholder until the kernels land. */
#include "dot_x86.h"

em_quant_dot_fn em_quant_dot_x86(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}
