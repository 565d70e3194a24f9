/*
 * backend/cuda — the CUDA backend for Hopper GPUs (compute capability 9.0).
 *
 * Built only when nvcc is found (EM_HAVE_CUDA is then defined for everything that links it).
 * Until the forward pass lands (the CUDA backend issue), em_backend_cuda_new reports that it is
 * missing and callers fall back to --device cpu. Nothing here is called from the engine
 * without going through backend.h, and no CUDA header leaks out of this folder.
 */
#ifndef EMBER_BACKEND_CUDA_H
#define EMBER_BACKEND_CUDA_H

#include <stddef.h>

#include "../../base/base.h"
#include "../backend.h"

/* Number of usable CUDA devices (0 when the driver or a device is missing: never an error). */
int em_cuda_device_count(void);

/* Writes a one-line description of device `index` (name, compute capability, memory). */
em_err em_cuda_describe(int index, char *buffer, size_t size);

/* The CUDA backend for `model` on device 0 (backend.h). */
em_err em_backend_cuda_new(const em_model *model, const em_backend_config *config, em_backend **out);

#endif
