/* Choosing a backend (backend.h): the CUDA backend when asked for or when a GPU is there (and can run
 * the model), else the CPU. */
#include <string.h>

#include "backend.h"
#ifdef EM_HAVE_CUDA
#include "cuda/cuda.h"
#endif

em_err em_backend_create(const em_model *model, const em_backend_config *config, em_backend **out) {
    *out = NULL;
    const char *device = config ? config->device : NULL;
    if (device && strcmp(device, "cpu") && strcmp(device, "cuda"))
        return em_errorf(EM_ERR_INVALID, "unknown device '%s' (cpu or cuda)", device);
    if (device && !strcmp(device, "cpu")) return em_backend_cpu_new(model, config, out);
#ifdef EM_HAVE_CUDA
    if (em_cuda_device_count() > 0) {
        em_err err = em_backend_cuda_new(model, config, out);
        if (!err || device) return err;
        /* Asked for nothing: a model the CUDA backend cannot run (a weight type it lacks, too
         * little device memory) still runs on the CPU. */
        em_log(EM_LOG_WARN, "%s: using the CPU backend", em_err_message(err));
        em_err_free(err);
        return em_backend_cpu_new(model, config, out);
    }
    /* Asked for CUDA without a GPU: say so, and run on the CPU rather than not at all. */
    if (device) em_log(EM_LOG_WARN, "--device cuda: no usable CUDA device (driver or GPU missing): using the CPU");
#else
    if (device) em_log(EM_LOG_WARN, "--device cuda: this build has no CUDA backend (nvcc was not found): using the CPU");
#endif
    return em_backend_cpu_new(model, config, out);
}
