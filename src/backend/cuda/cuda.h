/*
 * backend/cuda — the CUDA backend for Hopper GPUs (compute capability 9.0).
 *
 * Built only when nvcc is found (EM_HAVE_CUDA is then defined for everything that links it).
 * Today it answers which devices exist; the forward pass, paged attention and the persistent
 * decode kernel arrive with the CUDA backend issue. Nothing here is called from the engine
 * without going through backend.h, and no CUDA header leaks out of this folder.
 */
#ifndef EMBER_BACKEND_CUDA_H
#define EMBER_BACKEND_CUDA_H

#include <stddef.h>

#include "../../base/base.h"

/* Number of usable CUDA devices (0 when the driver or a device is missing: never an error). */
int em_cuda_device_count(void);

/* Writes a one-line description of device `index` (name, compute capability, memory). */
em_err em_cuda_describe(int index, char *buffer, size_t size);

#endif
