/* Uploading the model: every matrix once, in its stored block format (one allocation per tensor;
 * a tied output matrix shares token_embd's); norm weights, biases and RoPE factors as the f32
 * vectors the model converted at load time. */
#include <math.h>
#include <stdlib.h>

#include "internal.cuh"

static em_err track(cuda_backend *b, void *p) {
    if (b->n_allocs == b->cap_allocs) {
        uint32_t cap = b->cap_allocs ? 2 * b->cap_allocs : 64;
        void **grown = (void **)realloc(b->allocs, cap * sizeof *grown);
        if (!grown) {
            cudaFree(p);
            return em_errorf(EM_ERR_NOMEM, "out of memory tracking device allocations");
        }
        b->allocs = grown;
        b->cap_allocs = cap;
    }
    b->allocs[b->n_allocs++] = p;
    return NULL;
}

static em_err upload_bytes(cuda_backend *b, const void *host, uint64_t bytes, const char *what, const void **out) {
    *out = NULL;
    if (!host || bytes == 0) return NULL;
    void *p = NULL;
    cudaError_t status = cudaMalloc(&p, bytes);
    if (status != cudaSuccess)
        return em_errorf(EM_ERR_NOMEM, "cudaMalloc of %llu bytes for %s: %s", (unsigned long long)bytes, what,
                         cudaGetErrorString(status));
    em_err err = track(b, p);
    if (err) return err;
    CU_TRY(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    *out = p;
    return NULL;
}

static em_err upload_vector(cuda_backend *b, const float *v, uint64_t n, const char *what, const float **out) {
    return upload_bytes(b, v, n * sizeof(float), what, (const void **)out);
}

static em_err upload_weight(cuda_backend *b, const em_weight *w, const char *what, uint32_t layer, cuda_weight *out) {
    *out = cuda_weight{NULL, w->type, (uint32_t)w->cols, (uint32_t)w->rows, (uint32_t)w->n_mat, w->row_bytes};
    if (!w->data) return NULL;
    if (!em_cuda_type_supported(w->type))
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u %s: the CUDA backend does not read %s weights yet", layer, what,
                         em_type_name(w->type));
    if (w->cols % 8)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u %s: %llu columns (the CUDA backend needs a multiple of 8)",
                         layer, what, (unsigned long long)w->cols);
    const void *p;
    em_err err = upload_bytes(b, w->data, w->row_bytes * w->rows * (w->n_mat ? w->n_mat : 1), what, &p);
    out->data = (const uint8_t *)p;
    if (out->n_mat == 0) out->n_mat = 1;
    return err;
}

em_err em_cuda_upload_weights(cuda_backend *b, const em_model *model) {
    const em_model_desc *d = &model->desc;
    const em_model_weights *w = &model->w;
    em_err err;
    if ((err = upload_weight(b, &w->token_embd, "token_embd", 0, &b->token_embd))) return err;
    if (w->output.data == w->token_embd.data)
        b->output = b->token_embd;
    else if ((err = upload_weight(b, &w->output, "output", 0, &b->output)))
        return err;
    if ((err = upload_vector(b, w->output_norm, d->n_embd, "output_norm", &b->output_norm))) return err;
    b->layers = (cuda_layer *)calloc(d->n_layer, sizeof *b->layers);
    if (!b->layers) return em_errorf(EM_ERR_NOMEM, "out of memory for %u layers", d->n_layer);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *ld = &d->layers[il];
        const em_layer_weights *lw = &w->layers[il];
        cuda_layer *cl = &b->layers[il];
        if (ld->head_dim % 32 || ld->head_dim_v % 32 || ld->head_dim > 256 || ld->head_dim_v > 256 ||
            ld->n_head % ld->n_head_kv)
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: heads of %u/%u dimensions (%u/%u heads)", il, ld->head_dim,
                             ld->head_dim_v, ld->n_head, ld->n_head_kv);
        const uint64_t nq = (uint64_t)ld->n_head * ld->head_dim, nk = (uint64_t)ld->n_head_kv * ld->head_dim,
                       nv = (uint64_t)ld->n_head_kv * ld->head_dim_v;
        struct { const float *host; uint64_t n; const char *name; const float **dev; } vecs[] = {
            {lw->attn_norm, d->n_embd, "attn_norm", &cl->attn_norm},
            {lw->q_norm, ld->head_dim, "attn_q_norm", &cl->q_norm},
            {lw->k_norm, ld->head_dim, "attn_k_norm", &cl->k_norm},
            {lw->post_attn_norm, d->n_embd, "post_attention_norm", &cl->post_attn_norm},
            {lw->ffn_norm, d->n_embd, "ffn_norm", &cl->ffn_norm},
            {lw->post_ffn_norm, d->n_embd, "post_ffw_norm", &cl->post_ffn_norm},
            {lw->bq, nq, "attn_q.bias", &cl->bq},
            {lw->bk, nk, "attn_k.bias", &cl->bk},
            {lw->bv, nv, "attn_v.bias", &cl->bv},
        };
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
            if ((err = upload_vector(b, vecs[i].host, vecs[i].n, vecs[i].name, vecs[i].dev)))
                return em_err_prefix(err, "layer %u", il);
        /* RoPE frequencies in double, as the CPU computes them (em_cpu_rope), once per layer. */
        const uint32_t half = ld->rope.n_rot / 2;
        double *inv_freq = (double *)malloc((half ? half : 1) * sizeof(double));
        if (!inv_freq) return em_errorf(EM_ERR_NOMEM, "out of memory for RoPE frequencies");
        for (uint32_t i = 0; i < half; i++) {
            inv_freq[i] = pow(ld->rope.theta, -2.0 * i / ld->rope.n_rot);
            if (ld->rope.freq_factors) inv_freq[i] /= ld->rope.freq_factors[i];
        }
        const void *dev_freq;
        err = upload_bytes(b, inv_freq, half * sizeof(double), "rope frequencies", &dev_freq);
        free(inv_freq);
        if (err) return em_err_prefix(err, "layer %u", il);
        cl->inv_freq = (const double *)dev_freq;
        struct { const em_weight *host; const char *name; cuda_weight *dev; } mats[] = {
            {&lw->wq, "attn_q", &cl->wq}, {&lw->wk, "attn_k", &cl->wk}, {&lw->wv, "attn_v", &cl->wv},
            {&lw->wo, "attn_output", &cl->wo}, {&lw->ffn_gate, "ffn_gate", &cl->ffn_gate},
            {&lw->ffn_up, "ffn_up", &cl->ffn_up}, {&lw->ffn_down, "ffn_down", &cl->ffn_down},
            {&lw->gate_inp, "ffn_gate_inp", &cl->gate_inp}, {&lw->gate_exps, "ffn_gate_exps", &cl->gate_exps},
            {&lw->up_exps, "ffn_up_exps", &cl->up_exps}, {&lw->down_exps, "ffn_down_exps", &cl->down_exps},
            {&lw->gate_shexp, "ffn_gate_shexp", &cl->gate_shexp}, {&lw->up_shexp, "ffn_up_shexp", &cl->up_shexp},
            {&lw->down_shexp, "ffn_down_shexp", &cl->down_shexp},
        };
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if ((err = upload_weight(b, mats[i].host, mats[i].name, il, mats[i].dev))) return err;
    }
    return NULL;
}
