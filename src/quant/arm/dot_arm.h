/* ARM SIMD dot products (NEON, and the dot-product extension where the CPU has it), chosen at run
 * time; see dot_neon.c and kernels.h. */
#ifndef EMBER_QUANT_DOT_ARM_H
#define EMBER_QUANT_DOT_ARM_H

#include "../internal.h"

/* The NEON kernel for the weight type on this CPU, or NULL (other CPU, other type). */
em_dot_fn em_quant_dot_arm(uint32_t weight_type);

/* The multi-row NEON kernel for the weight type on this CPU, or NULL (other CPU, other type: em_dot_rows
 * then loops over em_dot). */
em_dot_rows_fn em_quant_dot_rows_arm(uint32_t weight_type);

/* "neon-dotprod" when the kernels use the dot-product instructions (the CPU reports them and the
 * environment does not set EMBER_CPU_ISA=neon), "neon" otherwise on ARM; NULL elsewhere. */
const char *em_quant_arm_isa(void);

#if defined(__aarch64__)
/* The two kernel families kernels.h generates: plain NEON (dot_neon.c) and dot-product (dot_dotprod.c). */
em_dot_fn em_quant_dot_neon(uint32_t weight_type);
em_dot_rows_fn em_quant_dot_rows_neon(uint32_t weight_type);
em_dot_fn em_quant_dot_dotprod(uint32_t weight_type);
em_dot_rows_fn em_quant_dot_rows_dotprod(uint32_t weight_type);
#endif

#endif
