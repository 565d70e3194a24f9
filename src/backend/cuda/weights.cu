/* Uploading the model, as its layer program reads it (em_program_blocks): every matrix once, in its
 * stored block format (one allocation per tensor; a tied output matrix shares token_embd's); norm
 * weights, biases and RoPE factors as the f32 vectors the model converted at load time. What a
 * layer computes goes into its cuda_layer beside its weights; what the kernels cannot compute
 * (biases on other products than q, k and v, norms that differ in epsilon, mixed activations) is
 * refused here, naming the layer. */
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

/* The kernels take one epsilon and one 1 + w choice for every norm: a norm that differs is refused. */
static em_err same_norm(cuda_backend *b, const em_program_norm *norm, uint32_t layer, const char *what) {
    if (!norm) return NULL;
    if (norm->eps != b->step.eps || norm->plus_one != b->step.plus_one)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u %s: a norm of epsilon %g%s, where the others have %g%s", layer,
                         what, norm->eps, norm->plus_one ? " (1 + w)" : "", b->step.eps,
                         b->step.plus_one ? " (1 + w)" : "");
    return NULL;
}

/* RoPE frequencies in double, as the CPU computes them (em_cpu_rope), once per layer. */
static em_err upload_frequencies(cuda_backend *b, const em_rope *rope, const double **out) {
    const uint32_t half = rope->n_rot / 2;
    *out = NULL;
    if (!half) return NULL;
    double *inv_freq = (double *)malloc(half * sizeof(double));
    if (!inv_freq) return em_errorf(EM_ERR_NOMEM, "out of memory for RoPE frequencies");
    for (uint32_t i = 0; i < half; i++) {
        inv_freq[i] = pow(rope->theta, -2.0 * i / rope->n_rot);
        if (rope->freq_factors) inv_freq[i] /= rope->freq_factors[i];
    }
    const void *dev_freq;
    em_err err = upload_bytes(b, inv_freq, half * sizeof(double), "rope frequencies", &dev_freq);
    free(inv_freq);
    *out = (const double *)dev_freq;
    return err;
}

static em_err upload_matmul(cuda_backend *b, const em_program_matmul *m, const char *what, uint32_t layer,
                            cuda_weight *out) {
    if (m->bias) return em_errorf(EM_ERR_UNSUPPORTED, "layer %u %s: the CUDA backend adds no bias here", layer, what);
    return upload_weight(b, m->weight, what, layer, out);
}

/* x += [post_norm](W_o attention(...)): the attention's norms, products, biases, RoPE and shape. */
static em_err upload_attention(cuda_backend *b, const em_block *blk, cuda_layer *cl) {
    const em_program_attention *at = blk->attention;
    const uint32_t il = blk->layer;
    if (at->head_dim % 32 || at->head_dim_v % 32 || at->head_dim > 256 || at->head_dim_v > 256 || !at->n_head_kv ||
        at->n_head % at->n_head_kv)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: heads of %u/%u dimensions (%u/%u heads)", il, at->head_dim,
                         at->head_dim_v, at->n_head, at->n_head_kv);
    if (at->sinks) return em_errorf(EM_ERR_UNSUPPORTED, "layer %u attention: the CUDA kernels have no sinks yet", il);
    cl->att = *at;
    cl->rope = blk->rope ? *blk->rope : em_rope{};
    em_err err;
    if ((err = same_norm(b, blk->norm, il, "attn_norm")) || (err = same_norm(b, blk->post_norm, il, "post-norm")) ||
        (err = same_norm(b, blk->q_norm, il, "q_norm")) || (err = same_norm(b, blk->k_norm, il, "k_norm")))
        return err;
    const uint64_t nq = (uint64_t)at->n_head * at->head_dim, nk = (uint64_t)at->n_head_kv * at->head_dim,
                   nv = (uint64_t)at->n_head_kv * at->head_dim_v;
    struct { const float *host; uint64_t n; const char *name; const float **dev; } vecs[] = {
        {blk->norm->weight, blk->norm->width, "attn_norm", &cl->attn_norm},
        {blk->q_norm ? blk->q_norm->weight : NULL, at->head_dim, "attn_q_norm", &cl->q_norm},
        {blk->k_norm ? blk->k_norm->weight : NULL, at->head_dim, "attn_k_norm", &cl->k_norm},
        {blk->post_norm ? blk->post_norm->weight : NULL, b->step.n_embd, "post_attention_norm", &cl->post_attn_norm},
        {blk->q->bias, nq, "attn_q.bias", &cl->bq},
        {blk->k->bias, nk, "attn_k.bias", &cl->bk},
        {blk->v->bias, nv, "attn_v.bias", &cl->bv},
    };
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        if ((err = upload_vector(b, vecs[i].host, vecs[i].n, vecs[i].name, vecs[i].dev)))
            return em_err_prefix(err, "layer %u", il);
    if ((err = upload_frequencies(b, &cl->rope, &cl->inv_freq))) return em_err_prefix(err, "layer %u", il);
    if ((err = upload_weight(b, blk->q->weight, "attn_q", il, &cl->wq)) ||
        (err = upload_weight(b, blk->k->weight, "attn_k", il, &cl->wk)) ||
        (err = upload_weight(b, blk->v->weight, "attn_v", il, &cl->wv)))
        return err;
    return upload_matmul(b, blk->o, "attn_output", il, &cl->wo);
}

/* x += [post_norm](ffn(norm(x))): a gated unit, or routed experts and a shared gated unit. */
static em_err upload_feed_forward(cuda_backend *b, const em_block *blk, cuda_layer *cl) {
    const uint32_t il = blk->layer;
    em_err err;
    if (blk->act != EM_ACT_SWIGLU && blk->act != EM_ACT_GEGLU)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: the CUDA kernels compute SwiGLU and GeGLU units only", il);
    if (blk->act != b->step.act)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: a feed-forward activation other than the first layer's", il);
    if ((err = same_norm(b, blk->norm, il, "ffn_norm")) || (err = same_norm(b, blk->post_norm, il, "post-norm")))
        return err;
    if ((err = upload_vector(b, blk->norm->weight, blk->norm->width, "ffn_norm", &cl->ffn_norm)) ||
        (err = upload_vector(b, blk->post_norm ? blk->post_norm->weight : NULL, b->step.n_embd, "post_ffw_norm",
                             &cl->post_ffn_norm)))
        return em_err_prefix(err, "layer %u", il);
    cuda_weight *gate = &cl->ffn_gate, *up = &cl->ffn_up, *down = &cl->ffn_down;
    if (blk->kind == EM_BLOCK_EXPERTS) {
        const em_program_experts *x = blk->experts;
        if (x->gate_bias || x->up_bias || x->down_bias)
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u experts: the CUDA kernels add no expert biases yet", il);
        if (blk->route->gating != EM_GATING_SOFTMAX && blk->route->gating != EM_GATING_SIGMOID)
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u route: the CUDA kernels have no softmax over the chosen "
                             "experts yet", il);
        cl->moe = true;
        cl->route = *blk->route;
        if ((err = upload_matmul(b, blk->router, "ffn_gate_inp", il, &cl->gate_inp)) ||
            (err = upload_weight(b, blk->experts->gate, "ffn_gate_exps", il, &cl->gate_exps)) ||
            (err = upload_weight(b, blk->experts->up, "ffn_up_exps", il, &cl->up_exps)) ||
            (err = upload_weight(b, blk->experts->down, "ffn_down_exps", il, &cl->down_exps)))
            return err;
        if (!blk->gate) return NULL;
        gate = &cl->gate_shexp, up = &cl->up_shexp, down = &cl->down_shexp;
    }
    if ((err = upload_matmul(b, blk->gate, "ffn_gate", il, gate)) || (err = upload_matmul(b, blk->up, "ffn_up", il, up)))
        return err;
    return upload_matmul(b, blk->down, "ffn_down", il, down);
}

em_err em_cuda_upload_weights(cuda_backend *b, const em_program *program) {
    const em_program_embed *embed = &program->ops[0].u.embed;
    const em_program_output *output = &program->ops[program->n_ops - 1].u.output;
    em_block *blocks;
    uint32_t n_blocks;
    em_err err = em_program_blocks(program, &blocks, &n_blocks);
    if (err) return err;
    b->step = cuda_step{(uint32_t)embed->table->cols, program->n_vocab, program->n_layer, output->norm.eps,
                        output->norm.plus_one, n_blocks > 1 ? blocks[1].act : EM_ACT_SWIGLU, embed->scale,
                        output->softcap};
    b->layers = (cuda_layer *)calloc(program->n_layer ? program->n_layer : 1, sizeof *b->layers);
    if (!b->layers) err = em_errorf(EM_ERR_NOMEM, "out of memory for %u layers", program->n_layer);
    if (!err) err = upload_weight(b, embed->table, "token_embd", 0, &b->token_embd);
    if (!err && output->weight->data == embed->table->data)
        b->output = b->token_embd;
    else if (!err)
        err = upload_weight(b, output->weight, "output", 0, &b->output);
    if (!err) err = upload_vector(b, output->norm.weight, output->norm.width, "output_norm", &b->output_norm);
    for (uint32_t i = 0; i < n_blocks && !err; i++) {
        cuda_layer *cl = &b->layers[blocks[i].layer];
        err = blocks[i].kind == EM_BLOCK_ATTENTION ? upload_attention(b, &blocks[i], cl)
                                                   : upload_feed_forward(b, &blocks[i], cl);
    }
    free(blocks);
    return err;
}
