/* The CUDA forward pass: the same transformer block as the CPU reference's forward_layer, as a
 * sequence of kernels on the backend's stream. The batch's arrays go up in one copy, the logits
 * come down in one; the host then waits on the stream (blocking sync, no spinning). */
#include <stdlib.h>
#include <string.h>

#include "internal.cuh"

static uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

void em_cuda_free_scratch(cuda_backend *b) {
    float *bufs[] = {b->x, b->xn, b->q, b->k, b->v, b->attn, b->out, b->tmp, b->gate, b->up, b->router,
                     b->moe_h, b->moe_h2, b->moe_y, b->chosen_weight, b->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    cudaFree(b->chosen);
    cudaFree(b->pair_token);
    cudaFree(b->pair_slot);
    cudaFree(b->expert_count);
    cudaFree(b->expert_start);
    cudaFree(b->att_part);
    cudaFree(b->att_counter);
    b->att_part = NULL;
    b->att_counter = NULL;
    b->att_slots = 0;
    b->x = b->xn = b->q = b->k = b->v = b->attn = b->out = b->tmp = b->gate = b->up = b->router = NULL;
    b->moe_h = b->moe_h2 = b->moe_y = b->chosen_weight = b->logits = NULL;
    b->chosen = NULL;
    b->pair_token = b->pair_slot = b->expert_count = b->expert_start = NULL;
    b->cap_tokens = 0;
}

static em_err alloc(void **p, uint64_t bytes) {
    cudaError_t status = cudaMalloc(p, bytes ? bytes : 4);
    if (status != cudaSuccess)
        return em_errorf(EM_ERR_NOMEM, "cudaMalloc of %llu bytes of scratch: %s", (unsigned long long)bytes,
                         cudaGetErrorString(status));
    return NULL;
}

/* Scratch for n tokens (grown, never shrunk). Logits rows are at most n. */
em_err em_cuda_reserve(cuda_backend *b, uint32_t n) {
    if (n <= b->cap_tokens) return NULL;
    em_cuda_free_scratch(b);
    const uint64_t e = b->d->n_embd, pairs = (uint64_t)n * max_u32(b->max_used, 1);
    /* attention partials: up to 4 splits per (token, head) beyond the ones that fill the GPU */
    const uint64_t att_slots = 4 * (uint64_t)n * b->max_head + 2 * (uint64_t)b->n_sm;
    struct { void **p; uint64_t bytes; } bufs[] = {
        {(void **)&b->x, n * e * 4}, {(void **)&b->xn, n * e * 4}, {(void **)&b->q, (uint64_t)n * b->max_q * 4},
        {(void **)&b->k, (uint64_t)n * b->max_k * 4}, {(void **)&b->v, (uint64_t)n * b->max_v * 4},
        {(void **)&b->attn, (uint64_t)n * b->max_attn * 4}, {(void **)&b->out, n * e * 4},
        {(void **)&b->tmp, n * e * 4}, {(void **)&b->gate, (uint64_t)n * b->max_ff * 4},
        {(void **)&b->up, (uint64_t)n * b->max_ff * 4}, {(void **)&b->router, (uint64_t)n * b->max_expert * 4},
        {(void **)&b->moe_h, b->max_used ? pairs * b->max_ff * 4 : 0},
        {(void **)&b->moe_h2, b->max_used ? pairs * b->max_ff * 4 : 0},
        {(void **)&b->moe_y, b->max_used ? pairs * e * 4 : 0}, {(void **)&b->chosen_weight, pairs * 4},
        {(void **)&b->chosen, pairs * 4}, {(void **)&b->pair_token, pairs * 4}, {(void **)&b->pair_slot, pairs * 4},
        {(void **)&b->expert_count, (uint64_t)max_u32(b->max_expert, 1) * 4},
        {(void **)&b->expert_start, (uint64_t)max_u32(b->max_expert, 1) * 4},
        {(void **)&b->logits, (uint64_t)n * b->d->n_vocab * 4},
        {(void **)&b->att_part, att_slots * (b->max_dim_v + 2) * 4},
        {(void **)&b->att_counter, (uint64_t)n * b->max_head * 4},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        em_err err = alloc(bufs[i].p, bufs[i].bytes);
        if (err) {
            em_cuda_free_scratch(b);
            return err;
        }
    }
    cudaError_t status = cudaMemset(b->att_counter, 0, (uint64_t)n * b->max_head * 4);
    if (status != cudaSuccess) {
        em_cuda_free_scratch(b);
        return em_errorf(EM_ERR_INTERNAL, "cudaMemset of the attention counters: %s", cudaGetErrorString(status));
    }
    b->att_slots = att_slots;
    b->cap_tokens = n;
    return NULL;
}


static em_err grow_pinned(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return NULL;
    cudaFreeHost(*p);
    *p = NULL;
    *cap = 0;
    CU_TRY(cudaMallocHost(p, need));
    *cap = need;
    return NULL;
}

static uint32_t grow_to(uint32_t cap, uint64_t need) {
    uint64_t c = cap ? cap : 64;
    while (c < need) c *= 2;
    return (uint32_t)c;
}

/* The batch arrays live at offsets fixed by capacities (tokens, seq, pos, logits rows: cap_n words
 * each; table starts: cap_s; tables: cap_tw), so that a captured graph's pointers stay valid while
 * the block tables grow. Growing any capacity drops the captured graphs. */
static em_err upload_batch(cuda_backend *b, const em_batch *batch, cuda_batch *cb) {
    const uint32_t n = batch->n_tokens;
    uint64_t table_words = 0;
    for (uint32_t s = 0; s < batch->n_seqs; s++) table_words += batch->seqs[s].n_blocks;
    const uint32_t rows = em_batch_logits_rows(batch);
    if (n > b->cap_n || batch->n_seqs > b->cap_s || table_words > b->cap_tw) {
        b->cap_n = grow_to(b->cap_n, n);
        b->cap_s = grow_to(b->cap_s, batch->n_seqs);
        b->cap_tw = grow_to(b->cap_tw, table_words);
        const uint64_t words = 4 * (uint64_t)b->cap_n + b->cap_s + b->cap_tw;
        em_err err = grow_pinned((void **)&b->batch_host, &b->cap_batch, words * 4);
        if (err) return err;
        cudaFree(b->batch_dev);
        b->batch_dev = NULL;
        CU_TRY(cudaMalloc((void **)&b->batch_dev, words * 4));
        em_cuda_drop_graphs(b);
    }
    const uint64_t words = 4 * (uint64_t)b->cap_n + b->cap_s + b->cap_tw;
    uint32_t *h = (uint32_t *)b->batch_host;
    uint32_t *logit_rows = h + 3 * b->cap_n, *starts = h + 4 * b->cap_n, *tables = starts + b->cap_s;
    memcpy(h, batch->tokens, n * 4);
    memcpy(h + b->cap_n, batch->seq, n * 4);
    memcpy(h + 2 * b->cap_n, batch->pos, n * 4);
    uint32_t at = 0;
    for (uint32_t s = 0; s < batch->n_seqs; s++) {
        starts[s] = at;
        memcpy(tables + at, batch->seqs[s].blocks, batch->seqs[s].n_blocks * 4);
        at += batch->seqs[s].n_blocks;
    }
    uint32_t r = 0, max_pos = 0;
    for (uint32_t t = 0; t < n; t++) max_pos = max_u32(max_pos, batch->pos[t]);
    for (uint32_t t = 0; t < n; t++)
        if (batch->logits ? batch->logits[t] : t == n - 1) logit_rows[r++] = t;
    CU_TRY(cudaMemcpyAsync(b->batch_dev, h, words * 4, cudaMemcpyHostToDevice, b->stream));
    const uint32_t *d = (const uint32_t *)b->batch_dev;
    cb->tokens = (const int32_t *)d;
    cb->seq = d + b->cap_n;
    cb->pos = d + 2 * b->cap_n;
    cb->logit_rows = d + 3 * b->cap_n;
    cb->table_start = d + 4 * b->cap_n;
    cb->blocks = cb->table_start + b->cap_s;
    cb->n_tokens = n;
    cb->n_rows = rows;
    cb->max_pos = max_pos;
    return NULL;
}

static em_err matvec(cuda_backend *b, const cuda_weight *w, const float *x, uint64_t x_stride, float *y,
                     uint64_t y_stride, uint32_t n) {
    cuda_matvec mv = {};
    mv.w = w, mv.x = x, mv.x_stride = x_stride, mv.y = y, mv.y_stride = y_stride, mv.n_items = n, mv.n_groups = 1;
    return em_cuda_matvec(b, &mv);
}

/* A dense gated MLP on n rows of xn into y: gate and up in one pass when they share a type. */
static em_err mlp(cuda_backend *b, const cuda_weight *gate, const cuda_weight *up, const cuda_weight *down, float *y,
                  uint32_t n) {
    const uint64_t e = b->d->n_embd, ff = gate->rows;
    em_err err;
    if (em_cuda_matvec_can_fuse(gate, up) && gate->rows == up->rows) {
        cuda_matvec mv = {};
        mv.w = gate, mv.up = up, mv.x = b->xn, mv.x_stride = e, mv.y = b->gate, mv.y_stride = ff, mv.n_items = n;
        mv.n_groups = 1;
        if ((err = em_cuda_matvec(b, &mv))) return err;
    } else {
        if ((err = matvec(b, gate, b->xn, e, b->gate, ff, n))) return err;
        if ((err = matvec(b, up, b->xn, e, b->up, ff, n))) return err;
        if ((err = em_cuda_glu(b, b->gate, b->up, (uint64_t)n * ff))) return err;
    }
    return matvec(b, down, b->gate, ff, y, e, n);
}

/* Q, K and V of n rows of xn: one launch when the three matrices share a type. */
static em_err qkv(cuda_backend *b, const cuda_layer *lw, uint32_t n, uint64_t nq, uint64_t nk, uint64_t nv) {
    const uint64_t e = b->d->n_embd;
    em_err err;
    if (em_cuda_matvec_can_fuse(&lw->wq, &lw->wk) && em_cuda_matvec_can_fuse(&lw->wq, &lw->wv)) {
        cuda_matvec mv = {};
        mv.w = &lw->wq, mv.x = b->xn, mv.x_stride = e, mv.y = b->q, mv.y_stride = nq, mv.n_items = n, mv.n_groups = 1;
        mv.n_parts = 3;
        mv.more[0].w = &lw->wk, mv.more[0].y = b->k, mv.more[0].y_stride = nk;
        mv.more[1].w = &lw->wv, mv.more[1].y = b->v, mv.more[1].y_stride = nv;
        return em_cuda_matvec(b, &mv);
    }
    if ((err = matvec(b, &lw->wq, b->xn, e, b->q, nq, n))) return err;
    if ((err = matvec(b, &lw->wk, b->xn, e, b->k, nk, n))) return err;
    return matvec(b, &lw->wv, b->xn, e, b->v, nv, n);
}

/* Experts: route, group the (token, expert) pairs by expert, run each expert once on its pairs. */
static em_err moe(cuda_backend *b, uint32_t il, uint32_t n) {
    const em_layer_desc *ld = &b->d->layers[il];
    const cuda_layer *lw = &b->layers[il];
    const uint64_t e = b->d->n_embd, ff = lw->gate_exps.rows;
    em_err err;
    if ((err = matvec(b, &lw->gate_inp, b->xn, e, b->router, ld->n_expert, n))) return err;
    if ((err = em_cuda_route(b, il, n))) return err;
    const uint32_t pairs = n * ld->n_expert_used;
    /* a guess at the pairs per expert, for the kernel's chunk size only */
    const uint32_t per_expert = (pairs + ld->n_expert - 1) / ld->n_expert;
    cuda_matvec mv = {&lw->gate_exps, b->xn, e, b->pair_token, b->moe_h, ff, per_expert, b->expert_count,
                      b->expert_start, ld->n_expert, NULL, 0, {}};
    if (em_cuda_matvec_can_fuse(&lw->gate_exps, &lw->up_exps) && lw->gate_exps.rows == lw->up_exps.rows &&
        lw->gate_exps.n_mat == lw->up_exps.n_mat) {
        mv.up = &lw->up_exps;
        if ((err = em_cuda_matvec(b, &mv))) return err;
    } else {
        if ((err = em_cuda_matvec(b, &mv))) return err;
        mv.w = &lw->up_exps, mv.y = b->moe_h2;
        if ((err = em_cuda_matvec(b, &mv))) return err;
        if ((err = em_cuda_glu(b, b->moe_h, b->moe_h2, (uint64_t)pairs * ff))) return err;
    }
    mv = cuda_matvec{&lw->down_exps, b->moe_h, ff, NULL, b->moe_y, e, per_expert, b->expert_count, b->expert_start,
                     ld->n_expert, NULL, 0, {}};
    if ((err = em_cuda_matvec(b, &mv))) return err;
    if (ld->n_ff_shared && (err = mlp(b, &lw->gate_shexp, &lw->up_shexp, &lw->down_shexp, b->tmp, n))) return err;
    return em_cuda_moe_combine(b, il, n, ld->n_ff_shared > 0);
}

static em_err forward_layer(cuda_backend *b, const cuda_batch *batch, uint32_t il) {
    const em_layer_desc *ld = &b->d->layers[il];
    const cuda_layer *lw = &b->layers[il];
    const uint32_t n = batch->n_tokens, e = b->d->n_embd;
    const uint64_t nq = (uint64_t)ld->n_head * ld->head_dim, nk = (uint64_t)ld->n_head_kv * ld->head_dim,
                   nv = (uint64_t)ld->n_head_kv * ld->head_dim_v, na = (uint64_t)ld->n_head * ld->head_dim_v;
    em_err err;
    /* x += [post_norm](attention(norm(x))); the norm of layers after the first was done by the
     * previous layer's last residual add */
    if (il == 0 && (err = em_cuda_rmsnorm(b, b->xn, b->x, lw->attn_norm, n, e, NULL))) return err;
    if ((err = qkv(b, lw, n, nq, nk, nv))) return err;
    if ((err = em_cuda_qkv_finish(b, batch, il))) return err;
    if ((err = em_cuda_attention(b, batch, il))) return err;
    if ((err = matvec(b, &lw->wo, b->attn, na, b->out, e, n))) return err;
    /* x += [post_norm](ffn(norm(x))) */
    if ((err = em_cuda_add_norm(b, b->x, b->out, lw->post_attn_norm, n, e, b->xn, lw->ffn_norm))) return err;
    if (ld->moe)
        err = moe(b, il, n);
    else
        err = mlp(b, &lw->ffn_gate, &lw->ffn_up, &lw->ffn_down, b->out, n);
    if (err) return err;
    const bool last = il + 1 == b->d->n_layer;
    return em_cuda_add_norm(b, b->x, b->out, lw->post_ffn_norm, n, e, last ? NULL : b->xn,
                            last ? NULL : b->layers[il + 1].attn_norm);
}

/* Every kernel of one forward pass, from the uploaded batch to the logits on the device. */
static em_err enqueue(cuda_backend *b, const cuda_batch *cb) {
    const em_model_desc *d = b->d;
    em_err err;
    if ((err = em_cuda_embed(b, cb, b->x))) return err;
    for (uint32_t il = 0; il < d->n_layer; il++)
        if ((err = forward_layer(b, cb, il))) return em_err_prefix(err, "layer %u", il);
    /* Logits for the rows that want them: final norm (gathering the rows), output matrix, soft-cap. */
    const uint32_t rows = cb->n_rows;
    if ((err = em_cuda_rmsnorm(b, b->xn, b->x, b->output_norm, rows, d->n_embd, cb->logit_rows))) return err;
    if ((err = matvec(b, &b->output, b->xn, d->n_embd, b->logits, d->n_vocab, rows))) return err;
    if (d->final_softcap > 0.0f &&
        (err = em_cuda_softcap(b, b->logits, (uint64_t)rows * d->n_vocab, d->final_softcap)))
        return err;
    return NULL;
}

void em_cuda_drop_graphs(cuda_backend *b) {
    for (uint32_t i = 0; i < b->n_graphs; i++) cudaGraphExecDestroy(b->graphs[i].exec);
    b->n_graphs = 0;
}

/* Small batches (decode steps) replay a graph captured for their shape (tokens, logits rows): one
 * launch instead of a dozen per layer. The shape fixes every kernel's arguments, since the batch
 * arrays and scratch buffers stay where they are until a capacity grows (which drops the graphs). */
static em_err run_graph(cuda_backend *b, const cuda_batch *cb) {
    for (uint32_t i = 0; i < b->n_graphs; i++)
        if (b->graphs[i].n_tokens == cb->n_tokens && b->graphs[i].n_rows == cb->n_rows) {
            CU_TRY(cudaGraphLaunch(b->graphs[i].exec, b->stream));
            return NULL;
        }
    if (b->n_graphs == EM_CUDA_MAX_GRAPHS) em_cuda_drop_graphs(b);
    CU_TRY(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
    b->capturing = true;
    em_err err = enqueue(b, cb);
    b->capturing = false;
    cudaGraph_t graph = NULL;
    cudaError_t status = cudaStreamEndCapture(b->stream, &graph);
    if (err) {
        if (graph) cudaGraphDestroy(graph);
        return err;
    }
    if (status != cudaSuccess) return em_errorf(EM_ERR_INTERNAL, "cudaStreamEndCapture: %s", cudaGetErrorString(status));
    cudaGraphExec_t exec = NULL;
    status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (status != cudaSuccess) return em_errorf(EM_ERR_INTERNAL, "cudaGraphInstantiate: %s", cudaGetErrorString(status));
    b->graphs[b->n_graphs++] = cuda_graph{exec, cb->n_tokens, cb->n_rows};
    CU_TRY(cudaGraphLaunch(exec, b->stream));
    return NULL;
}

/* With `pick`, only the picked tokens come back (sample.cu), not the logits rows. */
static em_err forward(em_backend *base, const em_batch *batch, float *logits, const em_pick_params *pick,
                      int32_t *picked) {
    cuda_backend *b = (cuda_backend *)base;
    const em_model_desc *d = b->d;
    em_err err = em_batch_validate(batch, pick ? (const void *)picked : logits, b->d->n_vocab, &b->base);
    if (err) return err;
    if (b->cap_tokens < batch->n_tokens) em_cuda_drop_graphs(b);
    if ((err = em_cuda_reserve(b, batch->n_tokens))) return err;
    cuda_batch cb;
    if ((err = upload_batch(b, batch, &cb))) return err;
    if (cb.n_rows == 0) {
        err = enqueue(b, &cb);
        CU_TRY(cudaStreamSynchronize(b->stream));
        return err;
    }
    if (cb.n_tokens <= EM_CUDA_GRAPH_TOKENS && b->use_graphs)
        err = run_graph(b, &cb);
    else
        err = enqueue(b, &cb);
    if (err) return err;
    if (pick) return em_cuda_pick(b, pick, cb.n_rows, picked);
    const uint64_t n_logits = (uint64_t)cb.n_rows * d->n_vocab;
    if ((err = grow_pinned((void **)&b->logits_host, &b->cap_logits, n_logits * 4))) return err;
    CU_TRY(cudaMemcpyAsync(b->logits_host, b->logits, n_logits * 4, cudaMemcpyDeviceToHost, b->stream));
    CU_TRY(cudaStreamSynchronize(b->stream));
    memcpy(logits, b->logits_host, n_logits * 4);
    return NULL;
}

em_err em_cuda_forward(em_backend *base, const em_batch *batch, float *logits) {
    return forward(base, batch, logits, NULL, NULL);
}

em_err em_cuda_forward_pick(em_backend *base, const em_batch *batch, const em_pick_params *pick, int32_t *picked) {
    return forward(base, batch, NULL, pick, picked);
}
