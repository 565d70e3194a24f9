/* x86 SIMD dot products (AVX2 + FMA + F16C), chosen at run time; see dot_avx2.c. */
#ifndef EMBER_QUANT_DOT_X86_H
#define EMBER_QUANT_DOT_X86_H

#include "../internal.h"

/* The fastest x86 kernel for the weight type on this CPU, or NULL (other CPU, other type). */
em_dot_fn em_quant_dot_x86(uint32_t weight_type);

#endif
