/*
 * NEON dot products (AArch64), chosen at run time: the kernels of kernels.h in two builds, plain
 * NEON here and the dot-product extension in dot_dotprod.c. Every AArch64 CPU has NEON; the
 * dot-product instructions are used when the kernel reports them in the auxiliary vector
 * (HWCAP_ASIMDDP) and the environment does not set EMBER_CPU_ISA=neon (which keeps the plain
 * kernels, so both families can be tested on one machine). Both are bitwise equal to the scalar
 * paths. Elsewhere this file only says that there is nothing here.
 */
#include "dot_arm.h"

#if defined(__aarch64__)

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#define EM_NEON_DOTPROD 0
#define KERNEL(name) name##_neon
#include "kernels.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20) /* the Linux AArch64 bit for SDOT / UDOT */
#endif

/* Probed once and kept (getauxval and getenv are cheap, but em_dot_kernel is asked per matrix):
 * write-once state, the same for every thread (a race only repeats the probe). */
static bool use_dotprod(void) {
    static _Atomic int known; /* 0: not probed yet, 1: plain NEON, 2: dot product */
    int state = atomic_load_explicit(&known, memory_order_relaxed);
    if (state == 0) {
        const char *isa = getenv("EMBER_CPU_ISA");
        bool forced_plain = isa && strcmp(isa, "neon") == 0;
        state = !forced_plain && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? 2 : 1;
        atomic_store_explicit(&known, state, memory_order_relaxed);
    }
    return state == 2;
}

const char *em_quant_arm_isa(void) { return use_dotprod() ? "neon-dotprod" : "neon"; }

em_dot_fn em_quant_dot_arm(uint32_t weight_type) {
    return use_dotprod() ? em_quant_dot_dotprod(weight_type) : em_quant_dot_neon(weight_type);
}

em_dot_rows_fn em_quant_dot_rows_arm(uint32_t weight_type) {
    return use_dotprod() ? em_quant_dot_rows_dotprod(weight_type) : em_quant_dot_rows_neon(weight_type);
}

#else

const char *em_quant_arm_isa(void) { return NULL; }

em_dot_fn em_quant_dot_arm(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

em_dot_rows_fn em_quant_dot_rows_arm(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

#endif
