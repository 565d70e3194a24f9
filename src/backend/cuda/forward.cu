/* The CUDA forward pass: the same transformer block as the CPU reference's forward_layer, as a
 * sequence of kernels on the backend's stream. The batch's arrays go up in one copy, the logits
 * come down in one; the host then waits on the stream (blocking sync, no spinning). */
#include <stdlib.h>
#include <string.h>

#include "internal.cuh"

#include <cuda_profiler_api.h>

static uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

void em_cuda_free_scratch(cuda_backend *b) {
    float *bufs[] = {b->ss, b->x, b->xn, b->q, b->k, b->v, b->attn, b->out, b->tmp, b->gate, b->up, b->router,
                     b->moe_h, b->moe_h2, b->moe_y, b->chosen_weight, b->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    cudaFree(b->chosen);
    cudaFree(b->pair_token);
    cudaFree(b->pair_slot);
    cudaFree(b->expert_count);
    cudaFree(b->expert_start);
    cudaFree(b->expert_active);
    cudaFree(b->att_part);
    cudaFree(b->pf_part);
    cudaFree(b->att_counter);
    cudaFree(b->mvt_part);
    cudaFree(b->wg_part);
    cudaFree(b->mvt_counter);
    cudaFree(b->x16);
    cudaFree(b->xq);
    cudaFree(b->xd);
    b->xq = NULL, b->xd = NULL, b->xq_bytes = 0;
    b->mvt_part = NULL, b->mvt_counter = NULL, b->wg_part = NULL;
    b->x16 = NULL, b->x16_halves = 0;
    b->att_part = b->pf_part = NULL;
    b->pf_part_floats = 0;
    b->att_counter = NULL;
    b->att_slots = 0;
    b->ss = NULL;
    b->x = b->xn = b->q = b->k = b->v = b->attn = b->out = b->tmp = b->gate = b->up = b->router = NULL;
    b->moe_h = b->moe_h2 = b->moe_y = b->chosen_weight = b->logits = NULL;
    b->chosen = NULL;
    b->pair_token = b->pair_slot = b->expert_count = b->expert_start = b->expert_active = NULL;
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
    const uint64_t e = b->step.n_embd, pairs = (uint64_t)n * max_u32(b->max_used, 1);
    /* attention partials: up to 4 splits per (token, head) beyond the ones that fill the GPU */
    const uint64_t att_slots = em_cuda_att_slots(b, n);
    /* split-K partials of the decode tensor-core products: rows of the widest dense product, up to
     * 8 slices of 16 items, two sums (a gated unit's) each */
    const uint64_t mvt_rows = max_u32(max_u32(b->max_q + 2 * b->max_k, b->max_ff), (uint32_t)e);
    const uint32_t mvt_groups = (uint32_t)(mvt_rows / 64 + 1);
    /* f16 activations of the widest product input (gemm.cu's wgmma kernel; the dp4a products' rounded
     * rows take a byte per value, 80 per 64); MoE down products read a row per (token, expert) pair */
    const uint64_t x16_dense = (uint64_t)n * max_u32(max_u32((uint32_t)e, b->max_ff), b->max_attn);
    const uint64_t x16_pairs = b->max_used ? pairs * b->max_ff : 0;
    const uint64_t x16_halves = x16_dense > x16_pairs ? x16_dense : x16_pairs;
    struct { void **p; uint64_t bytes; } bufs[] = {
        {(void **)&b->x, n * e * 4}, {(void **)&b->xn, n * e * 4}, {(void **)&b->ss, n * e * 4},
        {(void **)&b->q, (uint64_t)n * b->max_q * 4},
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
        {(void **)&b->expert_active, ((uint64_t)b->max_expert + 1) * 4},
        {(void **)&b->logits, (uint64_t)n * b->step.n_vocab * 4},
        {(void **)&b->att_part, att_slots * (b->max_dim_v + 2) * 4},
        {(void **)&b->pf_part, em_cuda_prefill_part_floats(b) * 4},
        {(void **)&b->att_counter, (uint64_t)n * b->max_head * 4},
        {(void **)&b->mvt_part, mvt_rows * 8 * 16 * 2 * 4},
        {(void **)&b->wg_part, em_cuda_gemm_split_floats(b) * 4},
        {(void **)&b->mvt_counter, (uint64_t)mvt_groups * 4},
        {(void **)&b->x16, x16_halves * 2},
        {(void **)&b->xq, x16_halves / 64 * 80}, {(void **)&b->xd, x16_halves / 32 * sizeof(float2)},
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
    status = cudaMemset(b->mvt_counter, 0, (uint64_t)mvt_groups * 4);
    if (status != cudaSuccess) {
        em_cuda_free_scratch(b);
        return em_errorf(EM_ERR_INTERNAL, "cudaMemset of the split-K counters: %s", cudaGetErrorString(status));
    }
    b->mvt_part_floats = mvt_rows * 8 * 16 * 2;
    b->pf_part_floats = em_cuda_prefill_part_floats(b);
    b->mvt_groups = mvt_groups;
    b->x16_halves = x16_halves;
    b->xq_bytes = x16_halves / 64 * 80; /* the dp4a products' activations: a byte a value, 64 in 80 */
    b->att_slots = att_slots;
    b->ss_stride = (uint32_t)e; /* a producer's blocks: fewer than its rows, which are n_embd */
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

/* The batch arrays live at offsets fixed by capacities (tokens, seq, pos, logits rows, other
 * tokens, prefill segments: cap_n words each; table starts: cap_s; tables: cap_tw), so that a
 * captured graph's pointers stay valid while the block tables grow. Growing any capacity drops the
 * captured graphs. */
static em_err upload_batch(cuda_backend *b, const em_batch *batch, cuda_batch *cb) {
    const uint32_t n = batch->n_tokens;
    uint64_t table_words = 0;
    for (uint32_t s = 0; s < batch->n_seqs; s++) table_words += batch->seqs[s].n_blocks;
    const uint32_t rows = em_batch_logits_rows(batch);
    if (n > b->cap_n || batch->n_seqs > b->cap_s || table_words > b->cap_tw) {
        CU_TRY(cudaStreamSynchronize(b->stream)); /* a begun step may still read the old buffers */
        b->cap_n = grow_to(b->cap_n, n);
        b->cap_s = grow_to(b->cap_s, batch->n_seqs);
        b->cap_tw = grow_to(b->cap_tw, table_words);
        const uint64_t words = 6 * (uint64_t)b->cap_n + b->cap_s + b->cap_tw;
        size_t cap = b->cap_batch;
        em_err err = grow_pinned((void **)&b->batch_host[0], &cap, words * 4);
        if (!err) cap = b->cap_batch, err = grow_pinned((void **)&b->batch_host[1], &cap, words * 4);
        if (err) return err;
        b->cap_batch = cap;
        cudaFree(b->batch_dev);
        b->batch_dev = NULL;
        CU_TRY(cudaMalloc((void **)&b->batch_dev, words * 4));
        em_cuda_drop_graphs(b);
    }
    const uint64_t words = 6 * (uint64_t)b->cap_n + b->cap_s + b->cap_tw;
    /* alternate staging buffers: the previous step's copy may not have run yet (step overlap) */
    uint32_t *h = (uint32_t *)b->batch_host[b->batch_slot];
    b->batch_slot ^= 1;
    uint32_t *logit_rows = h + 3 * b->cap_n, *other = h + 4 * b->cap_n, *segments = h + 5 * b->cap_n;
    uint32_t *starts = h + 6 * b->cap_n, *tables = starts + b->cap_s;
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
    /* Prefill segments: maximal runs of one sequence at consecutive positions, the long ones (each
     * is at least EM_ATT_SEGMENT_MIN tokens, so they fit their cap_n / EM_ATT_SEGMENT_MIN pairs);
     * the other tokens in order. */
    uint32_t n_segments = 0, n_other = 0, other_max_pos = 0;
    for (uint32_t t = 0, end; t < n; t = end) {
        end = t + 1;
        while (end < n && batch->seq[end] == batch->seq[t] && batch->pos[end] == batch->pos[end - 1] + 1) end++;
        if (end - t >= EM_ATT_SEGMENT_MIN) {
            segments[2 * n_segments] = t;
            segments[2 * n_segments + 1] = end - t;
            n_segments++;
        } else {
            for (uint32_t u = t; u < end; u++) {
                other[n_other++] = u;
                other_max_pos = max_u32(other_max_pos, batch->pos[u]);
            }
        }
    }
    CU_TRY(cudaMemcpyAsync(b->batch_dev, h, words * 4, cudaMemcpyHostToDevice, b->stream));
    const uint32_t *d = (const uint32_t *)b->batch_dev;
    cb->tokens = (const int32_t *)d;
    cb->seq = d + b->cap_n;
    cb->pos = d + 2 * b->cap_n;
    cb->logit_rows = d + 3 * b->cap_n;
    cb->other_tokens = d + 4 * b->cap_n;
    cb->segments = d + 5 * b->cap_n;
    cb->segments_host = segments;
    cb->table_start = d + 6 * b->cap_n;
    cb->blocks = cb->table_start + b->cap_s;
    cb->n_tokens = n;
    cb->n_rows = rows;
    cb->max_pos = max_pos;
    cb->n_segments = n_segments;
    cb->n_other = n_other;
    cb->other_max_pos = other_max_pos;
    /* a decode step: each token alone in its sequence (checked for the batches decode steps make) */
    cb->one_per_seq = n <= 64 && n_segments == 0;
    for (uint32_t t = 0; t < n && cb->one_per_seq; t++)
        for (uint32_t u = t + 1; u < n; u++)
            if (batch->seq[u] == batch->seq[t]) cb->one_per_seq = false;
    return NULL;
}

static em_err matvec(cuda_backend *b, const cuda_weight *w, const float *x, uint64_t x_stride, float *y,
                     uint64_t y_stride, uint32_t n) {
    cuda_matvec mv = {};
    mv.w = w, mv.x = x, mv.x_stride = x_stride, mv.y = y, mv.y_stride = y_stride, mv.n_items = n, mv.n_groups = 1;
    return em_cuda_matvec(b, &mv);
}

/* How a sub-block reads its normalized input. Fused (decode batches of models without post-norms,
 * forward_fuses): xn holds x * norm weights, written by the product or kernel that last added
 * into x, and the consuming product scales its results by the RMS factor from the partial sums of
 * squares that producer left in b->ss (cuda_matvec): no norm kernel, no residual kernel, no pass
 * over x of its own. Unfused: xn holds the normalized input, made by em_cuda_rmsnorm / add_norm. */
typedef struct layer_in {
    const float *x;      /* xn either way */
    const float *ss;     /* fused: b->ss, else NULL */
    uint32_t ss_n;
} layer_in;

static layer_in input_of(const cuda_backend *b, bool fused) {
    return layer_in{b->xn, fused ? b->ss : NULL, fused ? b->ss_n : 0};
}

/* A dense gated MLP on n rows of `in` into y (y += with accumulate, then also the producer of the
 * next fused norm with next_norm_w): gate and up in one pass when they share a type. */
static em_err mlp(cuda_backend *b, const cuda_weight *gate, const cuda_weight *up, const cuda_weight *down,
                  layer_in in, float *y, bool accumulate, const float *next_norm_w, uint32_t n) {
    const uint64_t e = b->step.n_embd, ff = gate->rows;
    em_err err;
    if (em_cuda_matvec_can_fuse(gate, up) && gate->rows == up->rows) {
        cuda_matvec mv = {};
        mv.w = gate, mv.up = up, mv.x = in.x, mv.x_stride = e, mv.y = b->gate, mv.y_stride = ff, mv.n_items = n;
        mv.n_groups = 1, mv.norm_ss = in.ss, mv.norm_n = in.ss_n;
        if ((err = em_cuda_matvec(b, &mv))) return err;
    } else {
        if (in.ss) return em_errorf(EM_ERR_INTERNAL, "cuda mlp: a fused norm needs fused gate and up");
        if ((err = matvec(b, gate, in.x, e, b->gate, ff, n))) return err;
        if ((err = matvec(b, up, in.x, e, b->up, ff, n))) return err;
        if ((err = em_cuda_glu(b, b->gate, b->up, (uint64_t)n * ff))) return err;
    }
    cuda_matvec mv = {};
    mv.w = down, mv.x = b->gate, mv.x_stride = ff, mv.y = y, mv.y_stride = e, mv.n_items = n, mv.n_groups = 1;
    mv.accumulate = accumulate, mv.next_norm_w = next_norm_w, mv.next_xw = next_norm_w ? b->xn : NULL;
    return em_cuda_matvec(b, &mv);
}

/* Q, K and V of n rows: one launch when the three matrices share a type. */
static em_err qkv(cuda_backend *b, const cuda_layer *lw, layer_in in, uint32_t n, uint64_t nq, uint64_t nk,
                  uint64_t nv) {
    const uint64_t e = b->step.n_embd;
    em_err err;
    if (em_cuda_matvec_can_fuse(&lw->wq, &lw->wk) && em_cuda_matvec_can_fuse(&lw->wq, &lw->wv)) {
        cuda_matvec mv = {};
        mv.w = &lw->wq, mv.x = in.x, mv.x_stride = e, mv.y = b->q, mv.y_stride = nq, mv.n_items = n, mv.n_groups = 1;
        mv.n_parts = 3, mv.norm_ss = in.ss, mv.norm_n = in.ss_n;
        mv.more[0].w = &lw->wk, mv.more[0].y = b->k, mv.more[0].y_stride = nk;
        mv.more[1].w = &lw->wv, mv.more[1].y = b->v, mv.more[1].y_stride = nv;
        return em_cuda_matvec(b, &mv);
    }
    if (in.ss) return em_errorf(EM_ERR_INTERNAL, "cuda qkv: a fused norm needs fused Q, K and V");
    if ((err = matvec(b, &lw->wq, in.x, e, b->q, nq, n))) return err;
    if ((err = matvec(b, &lw->wk, in.x, e, b->k, nk, n))) return err;
    return matvec(b, &lw->wv, in.x, e, b->v, nv, n);
}

/* Experts on `in` (xn: normalized, or with a fused norm x * norm weights, which the router product
 * folds and the routing then normalizes): route, group the (token, expert) pairs by expert, run
 * each chosen expert once on its pairs (grid rows for the experts that have pairs only), combine
 * into out (or x += , then also the producer of the next fused norm with next_norm_w). */
static em_err moe(cuda_backend *b, uint32_t il, layer_in in, uint32_t n, bool into_x, const float *next_norm_w) {
    const cuda_layer *lw = &b->layers[il];
    const em_program_route *route = &lw->route;
    const uint64_t e = b->step.n_embd, ff = lw->gate_exps.rows;
    em_err err;
    cuda_matvec router = {};
    router.w = &lw->gate_inp, router.x = in.x, router.x_stride = e;
    router.y = b->router, router.y_stride = route->n_expert;
    router.n_items = n, router.n_groups = 1, router.norm_ss = in.ss, router.norm_n = in.ss_n;
    if ((err = em_cuda_matvec(b, &router))) return err;
    if ((err = em_cuda_route(b, il, n, in.ss))) return err;
    const uint32_t pairs = n * route->n_used;
    cuda_matvec mv = {};
    mv.w = &lw->gate_exps, mv.x = b->xn, mv.x_stride = e, mv.x_index = b->pair_token, mv.y = b->moe_h;
    mv.y_stride = ff;
    mv.n_items = (pairs + route->n_expert - 1) / route->n_expert; /* a guess at the pairs per expert, for sizing */
    mv.max_items = n, mv.x_rows = n;
    mv.counts = b->expert_count, mv.starts = b->expert_start, mv.n_groups = route->n_expert;
    mv.active = b->expert_active, mv.n_active = b->expert_active + b->max_expert;
    mv.n_active_max = pairs < route->n_expert ? pairs : route->n_expert;
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
    mv.w = &lw->down_exps, mv.up = NULL, mv.x = b->moe_h, mv.x_stride = ff, mv.x_index = NULL, mv.y = b->moe_y;
    mv.y_stride = e, mv.x_rows = pairs;
    if ((err = em_cuda_matvec(b, &mv))) return err;
    const bool shared = lw->gate_shexp.data != NULL;
    if (shared &&
        (err = mlp(b, &lw->gate_shexp, &lw->up_shexp, &lw->down_shexp, input_of(b, false), b->tmp, false, NULL, n)))
        return err;
    return em_cuda_moe_combine(b, il, n, shared, into_x, next_norm_w, b->xn);
}

/* Whether a batch of n tokens runs fused (layer_in): small batches of models whose layers have
 * no post-norms and whose products can take the fusions. */
static bool forward_fuses(const cuda_backend *b, uint32_t n) {
    if (n > EM_CUDA_GRAPH_TOKENS || !b->output_norm) return false;
    for (uint32_t il = 0; il < b->step.n_layer; il++) {
        const cuda_layer *lw = &b->layers[il];
        if (!lw->attn_norm || !lw->ffn_norm || lw->post_attn_norm || lw->post_ffn_norm ||
            !em_cuda_matvec_can_fuse(&lw->wq, &lw->wk) || !em_cuda_matvec_can_fuse(&lw->wq, &lw->wv) ||
            (!lw->moe && !em_cuda_matvec_can_fuse(&lw->ffn_gate, &lw->ffn_up)))
            return false;
    }
    return true;
}

/* The norm weights that start what follows layer il: the next layer's attention, or the output. */
static const float *next_norm(const cuda_backend *b, uint32_t il) {
    return il + 1 < b->step.n_layer ? b->layers[il + 1].attn_norm : b->output_norm;
}

/* Unfused: *xn_ready says whether xn holds norm(x) * attn_norm of this layer (an unfused layer
 * leaves it for the next one). */
static em_err forward_layer(cuda_backend *b, const cuda_batch *batch, uint32_t il, bool fused, bool *xn_ready) {
    const cuda_layer *lw = &b->layers[il];
    const em_program_attention *at = &lw->att;
    const uint32_t n = batch->n_tokens, e = b->step.n_embd;
    const uint64_t nq = (uint64_t)at->n_head * at->head_dim, nk = (uint64_t)at->n_head_kv * at->head_dim,
                   nv = (uint64_t)at->n_head_kv * at->head_dim_v, na = (uint64_t)at->n_head * at->head_dim_v;
    em_err err;
    /* x += [post_norm](attention(norm(x))) */
    if (!fused && !*xn_ready && (err = em_cuda_rmsnorm(b, b->xn, b->x, lw->attn_norm, n, e, NULL))) return err;
    if ((err = qkv(b, lw, input_of(b, fused), n, nq, nk, nv))) return err;
    if (!em_cuda_attention_finishes(b, batch, il) && (err = em_cuda_qkv_finish(b, batch, il))) return err;
    if ((err = em_cuda_attention(b, batch, il))) return err;
    cuda_matvec mv = {};
    mv.w = &lw->wo, mv.x = b->attn, mv.x_stride = na, mv.y = fused ? b->x : b->out, mv.y_stride = e;
    mv.n_items = n, mv.n_groups = 1, mv.accumulate = fused;
    /* a MoE layer's norm: folded into the router product and the routing up to moe_norm_max
     * tokens where em_cuda_route can, else its own kernel */
    const bool moe_norm_fused = lw->moe && n <= b->tuning.moe_norm_max && em_cuda_route_can_fold(b, il, n);
    if (fused && (!lw->moe || moe_norm_fused)) mv.next_norm_w = lw->ffn_norm, mv.next_xw = b->xn;
    if ((err = em_cuda_matvec(b, &mv))) return err;
    /* x += [post_norm](ffn(norm(x))) */
    *xn_ready = false;
    if (fused) {
        if (moe_norm_fused) return moe(b, il, input_of(b, true), n, true, next_norm(b, il));
        if (lw->moe) {
            if ((err = em_cuda_rmsnorm(b, b->xn, b->x, lw->ffn_norm, n, e, NULL))) return err;
            return moe(b, il, input_of(b, false), n, true, next_norm(b, il));
        }
        return mlp(b, &lw->ffn_gate, &lw->ffn_up, &lw->ffn_down, input_of(b, true), b->x, true, next_norm(b, il), n);
    }
    if ((err = em_cuda_add_norm(b, b->x, b->out, lw->post_attn_norm, n, e, b->xn, lw->ffn_norm))) return err;
    if (lw->moe)
        err = moe(b, il, input_of(b, false), n, false, NULL);
    else
        err = mlp(b, &lw->ffn_gate, &lw->ffn_up, &lw->ffn_down, input_of(b, false), b->out, false, NULL, n);
    if (err) return err;
    const bool last = il + 1 == b->step.n_layer;
    *xn_ready = !last;
    return em_cuda_add_norm(b, b->x, b->out, lw->post_ffn_norm, n, e, last ? NULL : b->xn,
                            last ? NULL : b->layers[il + 1].attn_norm);
}

/* Every kernel of one forward pass, from the uploaded batch to the logits on the device. */
static em_err enqueue(cuda_backend *b, const cuda_batch *cb) {
    const cuda_step *d = &b->step;
    const bool fused = forward_fuses(b, cb->n_tokens);
    em_err err;
    if ((err = em_cuda_embed(b, cb, b->x, fused ? b->layers[0].attn_norm : NULL, fused ? b->xn : NULL))) return err;
    bool xn_ready = false;
    for (uint32_t il = 0; il < d->n_layer; il++)
        if ((err = forward_layer(b, cb, il, fused, &xn_ready))) return em_err_prefix(err, "layer %u", il);
    /* Logits for the rows that want them: final norm (gathering the rows; fused into the output
     * product for small batches), output matrix, soft-cap. */
    const uint32_t rows = cb->n_rows;
    cuda_matvec mv = {};
    mv.w = &b->output, mv.x = b->xn, mv.x_stride = d->n_embd, mv.y = b->logits, mv.y_stride = d->n_vocab;
    mv.n_items = rows, mv.n_groups = 1;
    if (fused) {
        mv.x_index = cb->logit_rows, mv.norm_ss = b->ss, mv.norm_n = b->ss_n;
    } else if ((err = em_cuda_rmsnorm(b, b->xn, b->x, b->output_norm, rows, d->n_embd, cb->logit_rows))) {
        return err;
    }
    if (rows && (err = em_cuda_matvec(b, &mv))) return err;
    if (d->final_softcap > 0.0f &&
        (err = em_cuda_softcap(b, b->logits, (uint64_t)rows * d->n_vocab, d->final_softcap)))
        return err;
    return NULL;
}

void em_cuda_drop_graphs(cuda_backend *b) {
    for (uint32_t i = 0; i < b->n_graphs; i++) cudaGraphExecDestroy(b->graphs[i].exec);
    b->n_graphs = 0;
}

/* Whether the shape was run once without a graph lately; the first time, records it. */
static bool seen_before(cuda_backend *b, const cuda_batch *cb) {
    for (uint32_t i = 0; i < b->n_seen_once; i++) {
        const cuda_shape *s = &b->seen_once[i];
        if (s->n_tokens == cb->n_tokens && s->n_rows == cb->n_rows && s->one_per_seq == cb->one_per_seq) {
            b->seen_once[i] = b->seen_once[--b->n_seen_once];
            return true;
        }
    }
    const cuda_shape shape = {cb->n_tokens, cb->n_rows, cb->one_per_seq};
    if (b->n_seen_once < EM_CUDA_MAX_GRAPHS) b->seen_once[b->n_seen_once++] = shape;
    else b->seen_once[b->next_seen_once++ % EM_CUDA_MAX_GRAPHS] = shape;
    return false;
}

/* Small batches (decode steps) replay a graph captured for their shape (tokens, logits rows): one
 * launch instead of a dozen per layer. The shape fixes every kernel's arguments, since the batch
 * arrays and scratch buffers stay where they are until a capacity grows (which drops the graphs).
 * A shape is captured the second time it comes: a capture costs several steps' launches, and some
 * shapes come once (a speculative verification's, a chunk's tail). The first time runs the kernels
 * a replay would, launched one by one. */
static em_err run_graph(cuda_backend *b, const cuda_batch *cb) {
    for (uint32_t i = 0; i < b->n_graphs; i++)
        if (b->graphs[i].n_tokens == cb->n_tokens && b->graphs[i].n_rows == cb->n_rows &&
            b->graphs[i].one_per_seq == cb->one_per_seq) {
            CU_TRY(cudaGraphLaunch(b->graphs[i].exec, b->stream));
            return NULL;
        }
    if (!seen_before(b, cb)) {
        b->capturing = true; /* the kernel choice of a capture: nothing depends on the batch's contents */
        em_err err = enqueue(b, cb);
        b->capturing = false;
        return err;
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
    b->graphs[b->n_graphs++] = cuda_graph{exec, cb->n_tokens, cb->n_rows, cb->one_per_seq};
    CU_TRY(cudaGraphLaunch(exec, b->stream));
    return NULL;
}

/* EMBER_CUDA_PROFILE=FROM:TO brackets forwards FROM..TO-1 (counted from 0 for each backend) with
 * cudaProfilerStart / cudaProfilerStop, for a profiler started with profiling off (Nsight Compute:
 * --profile-from-start off; bench/cuda_profile.sh). */
static void profile_range(cuda_backend *b) {
    if (b->tuning.profile_from < 0) return;
    if (b->forwards == b->tuning.profile_from) cudaProfilerStart();
    if (b->forwards == b->tuning.profile_to) cudaProfilerStop();
    b->forwards++;
}

/* Validates and uploads the batch and enqueues its forward (a graph replay for small batches); the
 * logits rows are then in b->logits. `picked_rows`: rows EM_TOKEN_PICKED may name (pick_begin). */
static em_err enqueue_forward(cuda_backend *b, const em_batch *batch, const void *out, uint32_t picked_rows,
                              cuda_batch *cb) {
    em_err err = em_batch_validate_picked(batch, out, b->step.n_vocab, &b->base, picked_rows);
    if (err) return err;
    profile_range(b);
    if (b->cap_tokens < batch->n_tokens) em_cuda_drop_graphs(b);
    if ((err = em_cuda_reserve(b, batch->n_tokens))) return err;
    if ((err = upload_batch(b, batch, cb))) return err;
    if (em_cuda_mega_takes(b, cb)) {
        if (b->tuning.trace) em_cuda_trace_step(b, cb->n_tokens, "one launch of the persistent kernel (mega.cu)");
        return em_cuda_mega_run(b, cb);
    }
    if (cb->n_rows && cb->n_tokens <= EM_CUDA_GRAPH_TOKENS && b->tuning.graphs) return run_graph(b, cb);
    return enqueue(b, cb);
}

/* With `pick`, only the picked tokens come back (sample.cu), not the logits rows. */
static em_err forward(em_backend *base, const em_batch *batch, float *logits, const em_pick_params *pick,
                      int32_t *picked) {
    cuda_backend *b = (cuda_backend *)base;
    if (b->flight_count) return em_errorf(EM_ERR_INTERNAL, "cuda forward: %u begun steps not ended", b->flight_count);
    cuda_batch cb;
    em_err err = enqueue_forward(b, batch, pick ? (const void *)picked : logits, 0, &cb);
    if (err) return err;
    b->last_begun_rows = 0; /* its picks (if any) replace the begun step's in b->picked */
    if (cb.n_rows == 0) {
        CU_TRY(cudaStreamSynchronize(b->stream));
        return NULL;
    }
    if (pick) return em_cuda_pick(b, pick, batch->pick_masks, cb.n_rows, picked);
    const uint64_t n_logits = (uint64_t)cb.n_rows * b->step.n_vocab;
    if ((err = grow_pinned((void **)&b->logits_host, &b->cap_logits, n_logits * 4))) return err;
    CU_TRY(cudaMemcpyAsync(b->logits_host, b->logits, n_logits * 4, cudaMemcpyDeviceToHost, b->stream));
    CU_TRY(cudaStreamSynchronize(b->stream));
    memcpy(logits, b->logits_host, n_logits * 4);
    return NULL;
}

/* Step overlap (backend.h): a begun step's tokens are copied to a pinned slot of their own and an
 * event marks the copy; the next begun step's embedding reads EM_TOKEN_PICKED tokens from
 * b->picked, which still holds them (its own pick kernel runs after the embedding). The batch
 * staging buffers alternate, so a step's upload never overwrites one whose copy has not run. */
em_err em_cuda_pick_begin(em_backend *base, const em_batch *batch, const em_pick_params *pick) {
    cuda_backend *b = (cuda_backend *)base;
    if (b->flight_count == 2) return em_errorf(EM_ERR_INTERNAL, "cuda pick_begin: two steps already begun");
    if (b->late_pending) return em_errorf(EM_ERR_INTERNAL, "cuda pick_begin: the last begun step waits for its masks");
    const uint32_t late_rows = batch->pick_masks_later ? em_batch_logits_rows(batch) : 0;
    if (late_rows > b->cap_late_rows) {
        em_pick_params *grown = (em_pick_params *)realloc(b->late_pick, late_rows * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "cuda pick_begin: out of memory");
        b->late_pick = grown, b->cap_late_rows = late_rows;
    }
    cuda_batch cb;
    em_err err = enqueue_forward(b, batch, pick, b->last_begun_rows, &cb);
    if (err) return err;
    /* the slot the oldest step in flight does not use */
    const uint32_t slot = b->flight_count ? b->flight_slot[0] ^ 1 : 0;
    if (cb.n_rows && batch->pick_masks_later) { /* the pick waits for em_cuda_pick_masks */
        memcpy(b->late_pick, pick, cb.n_rows * sizeof *pick);
        b->late_rows = cb.n_rows, b->late_slot = slot, b->late_pending = true;
    } else if (cb.n_rows && (err = em_cuda_pick_enqueue(b, pick, batch->pick_masks, cb.n_rows, slot, slot))) {
        return err;
    }
    if (!cb.n_rows) CU_TRY(cudaEventRecord(b->pick_done[slot], b->stream));
    b->flight_slot[b->flight_count] = slot;
    b->flight_rows[b->flight_count] = cb.n_rows;
    b->flight_count++;
    b->last_begun_rows = cb.n_rows;
    return NULL;
}

/* The late pick of the last begun step: its logits rows stay in b->logits until the next forward,
 * which the stream runs after this pick. */
em_err em_cuda_pick_masks(em_backend *base, const uint32_t *const *masks) {
    cuda_backend *b = (cuda_backend *)base;
    if (!b->late_pending) return NULL; /* begun with no logits rows: nothing to pick */
    b->late_pending = false;
    return em_cuda_pick_enqueue(b, b->late_pick, masks, b->late_rows, b->late_slot, b->late_slot);
}

em_err em_cuda_pick_end(em_backend *base, int32_t *picked) {
    cuda_backend *b = (cuda_backend *)base;
    if (b->flight_count == 0) return em_errorf(EM_ERR_INTERNAL, "cuda pick_end: no step begun");
    if (b->late_pending && b->flight_count == 1)
        return em_errorf(EM_ERR_INTERNAL, "cuda pick_end: the step waits for its masks");
    const uint32_t slot = b->flight_slot[0], rows = b->flight_rows[0];
    b->flight_slot[0] = b->flight_slot[1], b->flight_rows[0] = b->flight_rows[1];
    b->flight_count--;
    CU_TRY(cudaEventSynchronize(b->pick_done[slot])); /* blocking: the host sleeps */
    memcpy(picked, em_cuda_picked_host(b, slot), rows * sizeof(int32_t));
    return NULL;
}

em_err em_cuda_forward(em_backend *base, const em_batch *batch, float *logits) {
    return forward(base, batch, logits, NULL, NULL);
}

em_err em_cuda_forward_pick(em_backend *base, const em_batch *batch, const em_pick_params *pick, int32_t *picked) {
    return forward(base, batch, NULL, pick, picked);
}
