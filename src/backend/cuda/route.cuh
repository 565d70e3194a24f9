/* The routing of a mixture-of-experts layer by one warp per token, shared by the per-operation
 * kernels (ops.cu) and the persistent kernel (mega.cu): probabilities (softmax or sigmoid), the top k
 * with the CPU's tie rule, and the weights (renormalized, scaled). The logits are read past L1
 * (ld.global.cg), because in the persistent kernel other multiprocessors wrote them in the same
 * launch, and L1 is not coherent between multiprocessors. */
#pragma once

#include "internal.cuh"

/* Token t's routing by one warp, for up to 32 * PER_LANE experts: the same probabilities, choices
 * (first index wins ties) and weights as route_kernel, with the experts spread over the lanes
 * instead of one thread looping over all of them (a decode step has one token: the loop was its
 * latency). */
template <int PER_LANE>
__device__ __forceinline__ void route_token(const float *router, int32_t *chosen, float *weight, uint32_t t,
                                            uint32_t n_expert, uint32_t k, bool sigmoid, bool renormalize,
                                            float scale) {
    const uint32_t lane = threadIdx.x & 31;
    const float *logits = router + (uint64_t)t * n_expert;
    float p[PER_LANE];
    float max = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        const uint32_t e = lane + 32 * i;
        p[i] = e < n_expert ? __ldcg(logits + e) : -INFINITY;
        max = fmaxf(max, p[i]);
    }
    if (sigmoid) {
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) p[i] = lane + 32 * i < n_expert ? 1.0f / (1.0f + expf(-p[i])) : -INFINITY;
    } else {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, off));
        double sum = 0.0;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (lane + 32 * i < n_expert) {
                p[i] = expf(p[i] - max);
                sum += p[i];
            }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        const float inv = (float)(1.0 / sum);
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (lane + 32 * i < n_expert) p[i] *= inv;
    }
    float total = 0.0f;
    for (uint32_t j = 0; j < k; j++) {
        float best = -INFINITY;
        uint32_t best_e = UINT32_MAX;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (p[i] > best) best = p[i], best_e = lane + 32 * i;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, best, off);
            const uint32_t other_e = __shfl_xor_sync(0xffffffffu, best_e, off);
            if (other > best || (other == best && other_e < best_e)) best = other, best_e = other_e;
        }
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (lane + 32 * i == best_e) p[i] = -INFINITY; /* taken */
        if (lane == 0) {
            chosen[(uint64_t)t * k + j] = (int32_t)best_e;
            weight[(uint64_t)t * k + j] = best;
        }
        total += best;
    }
    if (lane == 0)
        for (uint32_t j = 0; j < k; j++) {
            float w = weight[(uint64_t)t * k + j];
            if (renormalize) w /= total;
            weight[(uint64_t)t * k + j] = w * scale;
        }
}
