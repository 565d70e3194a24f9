/* Device discovery for the CUDA backend (cuda.h). */
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "cuda.h"
}

extern "C" int em_cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return count;
}

extern "C" em_err em_cuda_describe(int index, char *buffer, size_t size) {
    cudaDeviceProp prop;
    cudaError_t status = cudaGetDeviceProperties(&prop, index);
    if (status != cudaSuccess)
        return em_errorf(EM_ERR_NOT_FOUND, "CUDA device %d: %s", index, cudaGetErrorString(status));
    snprintf(buffer, size, "%s, compute capability %d.%d, %.1f GiB, %d multiprocessors", prop.name, prop.major,
             prop.minor, prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), prop.multiProcessorCount);
    return NULL;
}

extern "C" em_err em_backend_cuda_new(const em_model *model, const em_backend_config *config, em_backend **out) {
    (void)model;
    (void)config;
    *out = NULL;
    return em_errorf(EM_ERR_UNSUPPORTED, "the CUDA forward pass is not built yet: use --device cpu");
}
