/*
 * The CPU backend's transcendental steps: exp, softmax, and SiLU times the up projection.
 *
 * em_expf is Ember's own exp, not the C library's: its steps are spelled out (a Cody-Waite
 * reduction by ln 2, a degree-7 polynomial in fused multiply-adds, two exact scalings by powers of
 * two), so that it gives the same bits on every CPU, and the SIMD kernels (x86/activation_x86.c)
 * take the same steps lane for lane. The reduction's split of ln 2 and the polynomial's
 * coefficients are Cephes' expf (S. L. Moshier); the error is within 2 ulp (tests/test_quant.c
 * checks it against the C library's double exp). Results below FLT_MIN are flushed to zero: a
 * softmax weight or a SiLU that small does not matter, and the scalings stay exact.
 */
#include <math.h>

#include "internal.h"
#include "x86/dot_x86.h"

float em_expf(float x) {
    if (x != x) return x;
    if (x > EM_EXPF_MAX) return INFINITY;
    if (x < EM_EXPF_MIN) return 0.0f;
    const float n = rintf(x * EM_EXPF_LOG2E); /* -126 .. 128 */
    float r = fmaf(n, -EM_EXPF_LN2_HI, x);
    r = fmaf(n, -EM_EXPF_LN2_LO, r);
    float p = EM_EXPF_P0;
    p = fmaf(p, r, EM_EXPF_P1);
    p = fmaf(p, r, EM_EXPF_P2);
    p = fmaf(p, r, EM_EXPF_P3);
    p = fmaf(p, r, EM_EXPF_P4);
    p = fmaf(p, r, EM_EXPF_P5);
    const float y = fmaf(p, r * r, r) + 1.0f;
    /* 2^n in two exact factors (2^128 is not a float; a subnormal result rounds once, at the end) */
    const int32_t k = (int32_t)n, half = k >> 1;
    return y * em_expf_pow2(half) * em_expf_pow2(k - half);
}

/* Softmax's sum: sixteen partial sums (element i into sum i mod 16, in order), then folded in
 * halves; the SIMD kernels keep the sixteen in one or two registers. */
static void softmax_scalar(float *x, uint64_t n) {
    float max = -INFINITY;
    for (uint64_t i = 0; i < n; i++)
        if (x[i] > max) max = x[i];
    float sums[EM_SOFTMAX_LANES] = {0};
    for (uint64_t i = 0; i < n; i++) {
        x[i] = em_expf(x[i] - max);
        sums[i % EM_SOFTMAX_LANES] += x[i];
    }
    for (int width = EM_SOFTMAX_LANES / 2; width > 0; width /= 2)
        for (int j = 0; j < width; j++) sums[j] += sums[j + width];
    const float inv = 1.0f / sums[0];
    for (uint64_t i = 0; i < n; i++) x[i] *= inv;
}

void em_f32_softmax(float *x, uint64_t n) {
    em_softmax_fn simd = em_quant_softmax_x86();
    if (simd) simd(x, n);
    else softmax_scalar(x, n);
}

void em_f32_silu_mul(float *gate, const float *up, uint64_t n) {
    em_silu_mul_fn simd = em_quant_silu_mul_x86();
    if (simd) {
        simd(gate, up, n);
        return;
    }
    for (uint64_t i = 0; i < n; i++) gate[i] = gate[i] / (1.0f + em_expf(-gate[i])) * up[i];
}
