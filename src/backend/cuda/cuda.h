/*
 * backend/cuda — the CUDA backend for Hopper GPUs (compute capability 9.0).
 *
 * Built only when nvcc is found (EM_HAVE_CUDA is then defined for everything that links it).
 * Weights go to the device once, in their GGUF block formats (F32, F16, BF16, Q8_0, Q4_K, Q6_K,
 * IQ3_XXS so far; other types are refused when the backend is made); the paged KV cache is f16
 * on the device (em_backend.kv_bytes_per_token). Kernels are chosen by batch shape:
 *  - decode batches: matrix-vector products with f32 activations that read each weight row once
 *    for up to 8 tokens, with the RMSNorms and residual adds folded in (matvec.cu), attention
 *    grouped per KV head and split over positions (attention_decode.cu);
 *  - prefill chunks and large batches: tensor-core products with f16 operands (gemm.cu) and
 *    flash attention on tensor cores for runs of consecutive positions (attention_prefill.cu);
 *  - MoE experts run once per step on the tokens routed to them, grid rows for chosen experts only.
 * internal.cuh describes the layout, each .cu file its kernels. Batches of up to 16 tokens
 * replay a CUDA graph captured per shape. forward_pick samples on the device (sample.cu: the
 * rule of pick.h) and copies back only the tokens. The host waits for the device by blocking,
 * never spinning.
 *
 * Environment (for tests and measurements): the EMBER_CUDA_* switches, read once when the backend
 * is made (tuning.cu; docs/cuda.md has the table), e.g. EMBER_CUDA_KV=f32 keeps the KV cache in
 * f32, EMBER_CUDA_GEMM=0 keeps every product on the f32 matrix-vector kernels, EMBER_CUDA_TRACE=1
 * logs which kernel each product runs on. A value a switch does not take fails the backend's
 * creation with an error that names the variable.
 *
 * Nothing here is called from the engine without going through backend.h, and no CUDA header
 * leaks out of this folder. The backend owns its device memory (weights, KV cache, scratch) and
 * its stream; it borrows the em_model like every backend.
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

/* For tests/cuda/check_sample.c: runs the device's pick kernel (sample.cu) on `rows` logits rows
 * of n_vocab from the host, writes one token per row, and the mean time of `repeats` launches. */
em_err em_cuda_pick_rows(const float *logits, uint32_t rows, uint32_t n_vocab, const em_pick_params *params,
                         int32_t *picked, uint32_t repeats, float *ms_per_launch);

/* Decode steps the persistent kernel (mega.cu) has run on this backend (0 when it is off or does
 * not take the model): for tests that must know which path ran. */
uint64_t em_cuda_mega_steps(const em_backend *backend);

#endif
