/* The finish of a token's Q, K and V heads: bias, QK-norm and RoPE, one head by one warp in
 * shared memory. One definition for the two kernels that do it, so that both give the same bits:
 * ops.cu's qkv_kernel (which then writes Q back and K, V into the cache) and the decode attention
 * kernel's fused finish (attention_decode.cu, which finishes the heads it needs itself and skips
 * that launch). What the CPU reference computes (em_cpu_rope: angles in double). */
#pragma once

#include "internal.cuh"

typedef struct rope_args {
    int neox;
    double theta, freq_scale, low, high, mscale, ext;
    uint32_t n_rot;
    const double *inv_freq; /* base^(-2i/n_rot) / freq_factors[i] (cuda_layer.inv_freq) */
} rope_args;

/* Layer il's rotation (ops.cu). */
rope_args em_cuda_rope_args(const cuda_backend *b, uint32_t il);

/* RoPE of one head held in shared memory `h`, by one warp (em_cpu_rope). */
__device__ __forceinline__ void rope_head(float *h, uint32_t pos, const rope_args &r) {
    const uint32_t half = r.n_rot / 2;
    for (uint32_t i = threadIdx.x & 31; i < half; i += 32) {
        const double theta = pos * r.inv_freq[i];
        double angle = theta * r.freq_scale;
        if (r.ext != 0.0) {
            double y = (i - r.low) / fmax(0.001, r.high - r.low);
            double ramp = (1.0 - fmin(1.0, fmax(0.0, y))) * r.ext;
            angle = angle * (1.0 - ramp) + theta * ramp;
        }
        double sin_a, cos_a; /* one range reduction for both */
        sincos(angle, &sin_a, &cos_a);
        const float c = (float)(cos_a * r.mscale), s = (float)(sin_a * r.mscale);
        const uint32_t a = r.neox ? i : 2 * i, bb = r.neox ? i + half : 2 * i + 1;
        const float x0 = h[a], x1 = h[bb];
        h[a] = x0 * c - x1 * s;
        h[bb] = x0 * s + x1 * c;
    }
    __syncwarp();
}

/* One head of `dim` values from src (+ bias) into shared memory h, then its RMSNorm with weights
 * `norm` when given, then RoPE at pos when `rotate` (Q and K; V is not rotated). By one warp. */
__device__ __forceinline__ void qkv_head(float *h, const float *src, const float *bias, const float *norm,
                                         uint32_t dim, float eps, bool plus_one, bool rotate, uint32_t pos,
                                         const rope_args &r) {
    const uint32_t lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (uint32_t i = lane; i < dim; i += 32) {
        const float x = src[i] + (bias ? bias[i] : 0.0f);
        h[i] = x;
        ss += x * x;
    }
    __syncwarp();
    if (norm) {
        const float scale = rsqrtf(em_warp_sum(ss) / dim + eps);
        for (uint32_t i = lane; i < dim; i += 32) h[i] = h[i] * scale * (plus_one ? 1.0f + norm[i] : norm[i]);
        __syncwarp();
    }
    if (rotate) rope_head(h, pos, r);
}
