/* The NEON kernels of kernels.h built for the dot-product extension (SDOT, ARMv8.2-A): handed out
 * by dot_neon.c only when the CPU reports it. The target pragma, rather than a build flag, keeps
 * the rest of the library runnable on any ARMv8-A CPU. It is GCC's (the AArch64 build is made
 * with Debian's cross GCC); clang before 16 declares the SDOT intrinsics only in files built with
 * -march=armv8.2-a+dotprod, which this file would then need. */
#include "dot_arm.h"

#if defined(__aarch64__)

#pragma GCC target("arch=armv8.2-a+dotprod")

#define EM_NEON_DOTPROD 1
#define KERNEL(name) name##_dotprod
#include "kernels.h"

#endif
