/* Device discovery and the life of a CUDA backend (cuda.h): creation (device flags, stream,
 * weights, KV cache), copy_rows, free. The forward pass is in forward.cu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.cuh"

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

/* Keys and values a position takes in layer il's cache. */
static uint64_t key_values(const cuda_layer *l) { return (uint64_t)l->att.n_head_kv * l->att.head_dim; }
static uint64_t value_values(const cuda_layer *l) { return (uint64_t)l->att.n_head_kv * l->att.head_dim_v; }

static uint32_t max_u(uint32_t a, uint32_t b) { return a > b ? a : b; }

static em_err cuda_copy_rows(em_backend *base, uint32_t from, uint32_t to, uint32_t rows) {
    cuda_backend *b = (cuda_backend *)base;
    if (from >= base->n_blocks || to >= base->n_blocks || rows > base->block_tokens)
        return em_errorf(EM_ERR_RANGE, "copy of %u rows from block %u to block %u (pool of %u blocks of %u)", rows, from,
                         to, base->n_blocks, base->block_tokens);
    if (rows == 0 || from == to) return NULL;
    for (uint32_t il = 0; il < b->step.n_layer; il++) {
        const uint64_t nk = key_values(&b->layers[il]), nv = value_values(&b->layers[il]);
        uint8_t *keys = b->layers[il].keys, *values = b->layers[il].values;
        const uint64_t kb = nk * b->kv_elem, vb = nv * b->kv_elem, bt = base->block_tokens;
        CU_TRY(cudaMemcpyAsync(keys + to * bt * kb, keys + from * bt * kb, rows * kb, cudaMemcpyDeviceToDevice,
                               b->stream));
        CU_TRY(cudaMemcpyAsync(values + to * bt * vb, values + from * bt * vb, rows * vb, cudaMemcpyDeviceToDevice,
                               b->stream));
    }
    return NULL;
}

static void cuda_free(em_backend *base) {
    cuda_backend *b = (cuda_backend *)base;
    if (b->stream) cudaStreamSynchronize(b->stream);
    em_cuda_drop_graphs(b);
    em_cuda_mega_free(b);
    em_cuda_free_scratch(b);
    em_cuda_trace_free(b);
    for (uint32_t i = 0; i < b->n_allocs; i++) cudaFree(b->allocs[i]);
    cudaFree(b->kv);
    cudaFree(b->batch_dev);
    cudaFreeHost(b->batch_host[0]);
    cudaFreeHost(b->batch_host[1]);
    for (int i = 0; i < 2; i++)
        if (b->pick_done[i]) cudaEventDestroy(b->pick_done[i]);
    cudaFreeHost(b->logits_host);
    em_cuda_free_pick(b);
    free(b->late_pick);
    if (b->stream) cudaStreamDestroy(b->stream);
    free(b->allocs);
    free(b->layers);
    free(b);
}

/* EMBER_CUDA_LATE_MASKS=0: a constrained step waits for the token before it. */
static const em_backend_ops cuda_ops = {"cuda",    em_cuda_forward,    em_cuda_forward_pick, cuda_copy_rows,
                                        cuda_free, em_cuda_pick_begin, em_cuda_pick_end, true, NULL};
/* The default (EMBER_CUDA_LATE_MASKS=1): a constrained step is begun before its grammar masks are
 * known, its pick started once they are. */
static const em_backend_ops cuda_ops_late_masks = {"cuda",    em_cuda_forward,    em_cuda_forward_pick, cuda_copy_rows,
                                                   cuda_free, em_cuda_pick_begin, em_cuda_pick_end, true,
                                                   em_cuda_pick_masks};
/* EMBER_CUDA_OVERLAP=0: no step overlap (every step's tokens are read before the next begins). */
static const em_backend_ops cuda_ops_no_overlap = {"cuda", em_cuda_forward, em_cuda_forward_pick, cuda_copy_rows,
                                                   cuda_free, NULL, NULL, true, NULL};

static em_err setup(cuda_backend *b, const em_model *model, const em_backend_config *o) {
    /* Blocking sync: the host sleeps while it waits for the GPU. Only possible before the context
     * exists; when another part of the process made it already, keep its flags. */
    if (cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync) != cudaSuccess) cudaGetLastError();
    CU_TRY(cudaSetDevice(0));
    CU_TRY(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
    CU_TRY(cudaDeviceGetAttribute(&b->n_sm, cudaDevAttrMultiProcessorCount, 0));
    em_err err = em_cuda_products_setup(b);
    if (err) return err;
    if ((err = em_cuda_upload_weights(b, &model->program))) return err;

    uint64_t kv_values = 0;
    for (uint32_t il = 0; il < b->step.n_layer; il++) {
        const cuda_layer *l = &b->layers[il];
        const em_program_attention *at = &l->att;
        b->max_q = max_u(b->max_q, at->n_head * at->head_dim);
        b->max_k = max_u(b->max_k, at->n_head_kv * at->head_dim);
        b->max_v = max_u(b->max_v, at->n_head_kv * at->head_dim_v);
        b->max_attn = max_u(b->max_attn, at->n_head * at->head_dim_v);
        /* a gated unit's, an expert's and a shared expert's hidden rows (absent weights have no data) */
        const cuda_weight *units[] = {&l->ffn_gate, &l->gate_exps, &l->gate_shexp};
        for (const cuda_weight *w : units)
            if (w->data) b->max_ff = max_u(b->max_ff, w->rows);
        b->max_head = max_u(b->max_head, at->n_head);
        b->max_dim_v = max_u(b->max_dim_v, at->head_dim_v);
        if (l->moe) {
            b->max_expert = max_u(b->max_expert, l->route.n_expert);
            b->max_used = max_u(b->max_used, l->route.n_used);
        }
        kv_values += key_values(l) + value_values(l);
    }

    /* The KV cache: one allocation, each layer's keys then values. */
    b->kv_elem = b->tuning.kv_f32 ? 4 : 2;
    const uint64_t per_token = kv_values * b->kv_elem;
    const uint64_t tokens = o->kv_bytes ? o->kv_bytes / (per_token ? per_token : 1) : (o->kv_tokens ? o->kv_tokens : 4096);
    const uint64_t n_blocks = tokens / o->block_tokens;
    if (n_blocks == 0 || n_blocks > (1u << 28) || o->block_tokens > 4096)
        return em_errorf(EM_ERR_RANGE, "cuda backend: %llu KV blocks of %u positions is out of range",
                         (unsigned long long)n_blocks, o->block_tokens);
    const uint64_t rows = n_blocks * o->block_tokens, bytes = rows * per_token;
    size_t free_bytes = 0, total_bytes = 0;
    CU_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (bytes > free_bytes)
        return em_errorf(EM_ERR_NOMEM, "cuda backend: a KV cache of %llu positions needs %.2f GiB, %.2f GiB are free",
                         (unsigned long long)rows, bytes / 1073741824.0, free_bytes / 1073741824.0);
    CU_TRY(cudaMalloc((void **)&b->kv, bytes));
    CU_TRY(cudaMemset(b->kv, 0, bytes));
    uint8_t *at = b->kv;
    for (uint32_t il = 0; il < b->step.n_layer; il++) {
        b->layers[il].keys = at;
        at += rows * key_values(&b->layers[il]) * b->kv_elem;
        b->layers[il].values = at;
        at += rows * value_values(&b->layers[il]) * b->kv_elem;
    }
    const em_backend_ops *ops = !b->tuning.overlap ? &cuda_ops_no_overlap
                                : b->tuning.late_masks ? &cuda_ops_late_masks
                                                       : &cuda_ops;
    b->base = em_backend{ops, model, (uint32_t)n_blocks, o->block_tokens, per_token};
    if ((err = em_cuda_mega_setup(b))) return err;
    /* the host sleeps on these until a step's tokens are copied back */
    for (int i = 0; i < 2; i++) CU_TRY(cudaEventCreateWithFlags(&b->pick_done[i], cudaEventBlockingSync | cudaEventDisableTiming));
    return NULL;
}

extern "C" em_err em_backend_cuda_new(const em_model *model, const em_backend_config *config, em_backend **out) {
    *out = NULL;
    em_backend_config o = config ? *config : em_backend_config{};
    if (!o.block_tokens) o.block_tokens = 16;
    cuda_backend *b = (cuda_backend *)calloc(1, sizeof *b);
    if (!b) return em_errorf(EM_ERR_NOMEM, "out of memory creating the cuda backend");
    b->base.ops = &cuda_ops_no_overlap;
    em_err err = em_cuda_tuning_read(&b->tuning);
    if (!err) err = setup(b, model, &o);
    if (err) {
        cuda_free(&b->base);
        return em_err_prefix(err, "cuda backend");
    }
    char name[256];
    if (!em_cuda_describe(0, name, sizeof name)) em_log(EM_LOG_INFO, "cuda backend on %s", name);
    *out = &b->base;
    return NULL;
}
