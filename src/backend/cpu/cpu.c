/* The CPU reference backend: one forward pass for every described model, readable top to bottom
 * (forward_layer below is the whole transformer block). Activations are f32; weights stay in their
 * stored format and meet the activations in quant's dot products; matrix rows and attention heads
 * are split across a pool of threads. The KV cache is paged: each layer has one f32 region of
 * n_blocks * block_tokens rows, and a sequence's block table says which row holds which position
 * (kv_key/kv_value). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../quant/quant.h"
#include "../backend.h"
#include "cpu_internal.h"

typedef struct cpu_backend {
    em_backend base;
    em_cpu_pool pool;
    const em_model_desc *d;
    const em_model_weights *w;

    /* KV cache: for each layer, n_blocks * block_tokens rows of n_head_kv * head_dim floats. */
    float *keys, *values;
    uint64_t *layer_key_offset, *layer_value_offset; /* start of each layer's rows, in floats */

    /* Scratch, sized for cap_tokens tokens and grown on demand. */
    uint32_t cap_tokens;
    float *x, *xn, *q, *k, *v, *attn, *out, *gate, *up, *router, *expert_out;
    int32_t *chosen;      /* [token][n_expert_used] */
    float *chosen_weight; /* [token][n_expert_used] */
    em_cpu_expert_scratch experts; /* a batch's expert layers (em_cpu_experts_run) */
    float *scores;        /* per thread, cap_positions floats per query head of a KV head's group */
    uint32_t cap_positions;
    uint64_t scores_per_thread;
    float *rope_angles;   /* cos, sin of one position's angles: n_rot floats */
    uint8_t *act;         /* activations in the dot-product format */
    uint8_t *act_groups;  /* the same packed in token groups (em_cpu_matmul's groups), or NULL */
    bool packs_groups;    /* some weight type has a group kernel on this CPU: act_groups is allocated */
    uint64_t act_per_token;
    uint32_t max_q, max_k, max_v, max_attn, max_ff, max_expert, max_expert_used;
    em_cpu_product *products; /* the products of one job of few tokens (max_products) */
    uint32_t max_products;
    uint32_t *slot_token, *slot_expert; /* a few-token MoE step's chosen (expert, token) pairs */
    float *slot_weight;
    float *pick_logits;   /* batches with pick parameters: their logits rows (cap_pick_rows) */
    uint64_t *pick_keys;  /* the pick rule's scratch, 2 n_vocab entries */
    /* Step overlap (cpu_pick_begin): the tokens of up to two begun steps, oldest at overlap_head. */
    int32_t *overlap_picked[2], *overlap_tokens;
    uint32_t overlap_rows[2], overlap_head, overlap_count;
    bool overlap_begun;
    /* A step begun with pick_masks_later: its pick parameters, kept for cpu_pick_masks (its logits
     * stay in pick_logits until then). */
    em_pick_params *late_pick;
    uint32_t late_rows, cap_late_rows;
    bool late_pending;
    uint32_t cap_pick_rows;
} cpu_backend;

/* ---- KV cache access ---- */

/* The cache row of a position: its block from the table, then the row inside the block. */
static uint64_t kv_row(const cpu_backend *b, const em_batch_seq *seq, uint32_t pos) {
    return (uint64_t)seq->blocks[pos / b->base.block_tokens] * b->base.block_tokens + pos % b->base.block_tokens;
}

static float *kv_key(cpu_backend *b, uint32_t layer, const em_batch_seq *seq, uint32_t pos) {
    const em_layer_desc *ld = &b->d->layers[layer];
    return b->keys + b->layer_key_offset[layer] + kv_row(b, seq, pos) * ld->n_head_kv * ld->head_dim;
}

static float *kv_value(cpu_backend *b, uint32_t layer, const em_batch_seq *seq, uint32_t pos) {
    const em_layer_desc *ld = &b->d->layers[layer];
    return b->values + b->layer_value_offset[layer] + kv_row(b, seq, pos) * ld->n_head_kv * ld->head_dim_v;
}

/* ---- small helpers ---- */

static em_err matmul(cpu_backend *b, const em_weight *w, uint64_t mat, const float *x, uint64_t x_stride, float *y,
                     uint64_t y_stride, uint32_t n_tokens) {
    em_cpu_matmul mm = {w, mat, x, x_stride, y, y_stride, n_tokens, b->act, b->act_groups, false};
    return em_cpu_matmul_run(&b->pool, &mm);
}

/* One output of matmuls: matrix `mat` of `w` into y (rows y_stride floats apart). */
typedef struct matmul_out {
    const em_weight *w;
    uint64_t mat;
    float *y;
    uint64_t y_stride;
} matmul_out;

/* Several matrices applied to the same n rows of x. A batch of few tokens quantizes x once per
 * activation format (in b->act, from `act` on) and runs all the products as one job; a larger one
 * runs them one by one, with token groups, quantizing (and packing) x once for a run of weights of
 * one type and width (Q, K and V; gate and up). */
static em_err matmuls(cpu_backend *b, const float *x, uint64_t x_stride, uint32_t n, const matmul_out *outs,
                      uint32_t count) {
    em_err err;
    if (em_cpu_batched(outs[0].w->type, n)) {
        for (uint32_t i = 0; i < count; i++) {
            const em_weight *w = outs[i].w;
            const bool same = i > 0 && outs[i - 1].w->type == w->type && outs[i - 1].w->cols == w->cols;
            em_cpu_matmul mm = {w, outs[i].mat, x, x_stride, outs[i].y, outs[i].y_stride, n,
                                b->act, b->act_groups, same};
            if ((err = em_cpu_matmul_run(&b->pool, &mm))) return err;
        }
        return NULL;
    }
    uint8_t *act = b->act;
    for (uint32_t i = 0; i < count; i++) {
        const em_weight *w = outs[i].w;
        const uint64_t act_bytes = em_cpu_act_bytes(w);
        const uint8_t *rows = NULL;
        for (uint32_t j = 0; j < i && !rows; j++)
            if (em_dot_activation_type(outs[j].w->type) == em_dot_activation_type(w->type) &&
                outs[j].w->cols == w->cols)
                rows = b->products[j].act;
        if (!rows) {
            if ((err = em_cpu_quantize(w, x, x_stride, n, act))) return err;
            rows = act;
            act += n * act_bytes;
        }
        b->products[i] = (em_cpu_product){w, outs[i].mat, rows, act_bytes, n, outs[i].y, outs[i].y_stride};
    }
    em_cpu_products_run(&b->pool, b->products, count);
    return NULL;
}

static void add_bias(float *y, const float *bias, uint32_t n_tokens, uint32_t n) {
    if (!bias) return;
    for (uint32_t t = 0; t < n_tokens; t++)
        for (uint32_t i = 0; i < n; i++) y[(uint64_t)t * n + i] += bias[i];
}

static void norm_rows(const cpu_backend *b, float *out, const float *x, const float *w, uint32_t n_tokens, uint32_t n) {
    for (uint32_t t = 0; t < n_tokens; t++)
        em_cpu_rmsnorm(out + (uint64_t)t * n, x + (uint64_t)t * n, w, n, b->d->norm_eps, b->d->norm == EM_NORM_RMS_PLUS_ONE);
}

typedef struct glu_job {
    const cpu_backend *b;
    float *gate;
    const float *up;
    uint64_t n;
} glu_job;

static void glu_share(void *ctx, uint32_t ith, uint32_t nth) {
    const glu_job *job = ctx;
    const bool gelu = job->b->d->act == EM_ACT_GEGLU;
    uint64_t begin, end;
    em_cpu_share(job->n, ith, nth, &begin, &end);
    if (!gelu) {
        em_f32_silu_mul(job->gate + begin, job->up + begin, end - begin);
        return;
    }
    for (uint64_t i = begin; i < end; i++) job->gate[i] = em_cpu_gelu(job->gate[i]) * job->up[i];
}

/* h = act(gate) * up, the gated linear unit of SwiGLU / GeGLU, split over the pool (a prefill's
 * units are many, and one transcendental function each). */
static void glu(cpu_backend *b, float *gate, const float *up, uint64_t n) {
    glu_job job = {b, gate, up, n};
    /* a unit's transcendental function counts as about 64 bytes of a product's reading */
    em_cpu_pool_run_sized(&b->pool, glu_share, &job, n * 64);
}

/* ---- attention ---- */

typedef struct attn_job {
    cpu_backend *b;
    const em_batch *batch;
    uint32_t layer;
} attn_job;

/* The first position a token at `pos` attends to. */
static uint32_t first_visible(const em_layer_desc *ld, uint32_t pos) {
    return ld->attn == EM_ATTN_SLIDING && pos + 1 > ld->window ? pos + 1 - ld->window : 0;
}

/* Tokens whose attention one unit of work computes together: consecutive tokens of a batch, when
 * they belong to one sequence (a prompt's chunk), share each block of keys and values while it is
 * in L1. */
#define ATTN_TILE 8

/* The tokens of tile `tile`: [*from, *to). */
static void tile_tokens(const em_batch *batch, uint64_t tile, uint32_t *from, uint32_t *to) {
    *from = (uint32_t)tile * ATTN_TILE;
    *to = batch->n_tokens - *from < ATTN_TILE ? batch->n_tokens : *from + ATTN_TILE;
}

/* Share `ith` of `nth` of the batch's (token tile, KV head) units, unit tile * n_head_kv + kvh, cut
 * where the positions attended to (each unit's work) add up to equal parts: in a prompt's causal
 * attention the last tokens see many times the positions the first ones do, so equal counts of
 * units would leave the thread with the early tokens waiting. */
static void attention_range(const em_batch *batch, const em_layer_desc *ld, uint32_t ith, uint32_t nth,
                            uint64_t *begin, uint64_t *end) {
    const uint64_t n_tiles = (batch->n_tokens + ATTN_TILE - 1) / ATTN_TILE;
    uint64_t total = 0;
    for (uint32_t t = 0; t < batch->n_tokens; t++)
        total += (uint64_t)(batch->pos[t] + 1 - first_visible(ld, batch->pos[t])) * ld->n_head_kv;
    const uint64_t from = total * ith / nth, to = total * (ith + 1) / nth; /* this share's part */
    /* a tile's units begin at `done` positions into the line; unit i belongs to the share in which
     * its first position falls */
    uint64_t done = 0;
    *begin = *end = n_tiles * ld->n_head_kv;
    bool begun = false;
    for (uint64_t tile = 0; tile < n_tiles; tile++) {
        uint32_t first, last;
        tile_tokens(batch, tile, &first, &last);
        uint64_t seen = 0;
        for (uint32_t t = first; t < last; t++) seen += batch->pos[t] + 1 - first_visible(ld, batch->pos[t]);
        for (uint32_t kvh = 0; kvh < ld->n_head_kv; kvh++, done += seen) {
            const uint64_t i = tile * ld->n_head_kv + kvh;
            if (!begun && done >= from) {
                *begin = i;
                begun = true;
            }
            if (done >= to) {
                *end = i;
                return;
            }
        }
    }
}

/* Positions [first, end) of the tokens' sequence, a KV block's run at a time: run_end is where the
 * run of cache rows that begins at `p` ends. */
static uint32_t run_end(uint32_t p, uint32_t end, uint32_t block_tokens) {
    const uint32_t block_end = (p / block_tokens + 1) * block_tokens;
    return block_end < end ? block_end : end;
}

/* The part [from, to) of positions [p, pe) that a token at `pos` sees (its first visible position
 * in *first); false when it sees none of them. */
static bool visible_part(const em_layer_desc *ld, uint32_t pos, uint32_t p, uint32_t pe, uint32_t *first,
                         uint32_t *from, uint32_t *to) {
    *first = first_visible(ld, pos);
    *from = p > *first ? p : *first;
    *to = pe < pos + 1 ? pe : pos + 1;
    return *from < *to;
}

/* One share of (token tile, KV head) units: for each token and each query head of the unit, scores
 * over the token's visible positions, softmax, weighted values. Positions are walked block by block
 * of the sequence's table: within a block the cache rows are consecutive, so each block's row is
 * looked up once, and the tile's tokens and the unit's query heads take each block's keys (and then
 * its values) in turn while they are in L1. A tile whose tokens are not all of one sequence takes
 * them one at a time. Each head's numbers are those of the head alone, whatever the tile. */
static void attention_share(void *ctx, uint32_t ith, uint32_t nth) {
    attn_job *job = ctx;
    cpu_backend *b = job->b;
    const em_batch *batch = job->batch;
    const em_layer_desc *ld = &b->d->layers[job->layer];
    const uint32_t group = ld->n_head / ld->n_head_kv, block_tokens = b->base.block_tokens;
    const uint64_t key_row = (uint64_t)ld->n_head_kv * ld->head_dim;
    const uint64_t value_row = (uint64_t)ld->n_head_kv * ld->head_dim_v;
    /* token j of the tile, head g: scores at (j * group + g) * cap_positions, from its first position */
    float *scores = b->scores + (uint64_t)ith * b->scores_per_thread;
    uint64_t begin, end;
    attention_range(batch, ld, ith, nth, &begin, &end);
    for (uint64_t i = begin; i < end; i++) {
        const uint32_t kvh = (uint32_t)(i % ld->n_head_kv);
        uint32_t tile_first, tile_end;
        tile_tokens(batch, i / ld->n_head_kv, &tile_first, &tile_end);
        for (uint32_t t0 = tile_first; t0 < tile_end;) {
            /* the tokens [t0, t1) that share a sequence */
            uint32_t t1 = t0 + 1;
            while (t1 < tile_end && batch->seq[t1] == batch->seq[t0]) t1++;
            const em_batch_seq *seq = &batch->seqs[batch->seq[t0]];
            uint32_t lo = UINT32_MAX, hi = 0; /* the positions any of them sees: [lo, hi) */
            for (uint32_t t = t0; t < t1; t++) {
                const uint32_t f = first_visible(ld, batch->pos[t]);
                if (f < lo) lo = f;
                if (batch->pos[t] + 1 > hi) hi = batch->pos[t] + 1;
            }
            for (uint32_t p = lo; p < hi; p = run_end(p, hi, block_tokens)) {
                const uint32_t pe = run_end(p, hi, block_tokens);
                const float *k = kv_key(b, job->layer, seq, p) + (uint64_t)kvh * ld->head_dim;
                for (uint32_t t = t0; t < t1; t++) {
                    uint32_t first, from, to;
                    if (!visible_part(ld, batch->pos[t], p, pe, &first, &from, &to)) continue;
                    const float *q = b->q + ((uint64_t)t * ld->n_head + (uint64_t)kvh * group) * ld->head_dim;
                    for (uint32_t g = 0; g < group; g++) {
                        float *run_scores =
                            scores + ((uint64_t)(t - t0) * group + g) * b->cap_positions + (from - first);
                        em_f32_dot_rows(k + (uint64_t)(from - p) * key_row, key_row, to - from,
                                        q + (uint64_t)g * ld->head_dim, ld->head_dim, run_scores); /* q·k */
                        for (uint32_t r = 0; r < to - from; r++) {
                            float sc = run_scores[r] * ld->attn_scale;
                            if (ld->attn_softcap > 0.0f) sc = ld->attn_softcap * tanhf(sc / ld->attn_softcap);
                            run_scores[r] = sc;
                        }
                    }
                }
            }
            for (uint32_t t = t0; t < t1; t++) {
                const uint32_t seen = batch->pos[t] + 1 - first_visible(ld, batch->pos[t]);
                for (uint32_t g = 0; g < group; g++)
                    em_f32_softmax(scores + ((uint64_t)(t - t0) * group + g) * b->cap_positions, seen);
                float *o = b->attn + ((uint64_t)t * ld->n_head + (uint64_t)kvh * group) * ld->head_dim_v;
                memset(o, 0, (uint64_t)group * ld->head_dim_v * sizeof *o);
            }
            for (uint32_t p = lo; p < hi; p = run_end(p, hi, block_tokens)) {
                const uint32_t pe = run_end(p, hi, block_tokens);
                const float *v = kv_value(b, job->layer, seq, p) + (uint64_t)kvh * ld->head_dim_v;
                for (uint32_t t = t0; t < t1; t++) {
                    uint32_t first, from, to;
                    if (!visible_part(ld, batch->pos[t], p, pe, &first, &from, &to)) continue;
                    float *o = b->attn + ((uint64_t)t * ld->n_head + (uint64_t)kvh * group) * ld->head_dim_v;
                    em_f32_add_weighted_rows(o, ld->head_dim_v,
                                             scores + (uint64_t)(t - t0) * group * b->cap_positions + (from - first),
                                             b->cap_positions, group, v + (uint64_t)(from - p) * value_row, value_row,
                                             to - from, ld->head_dim_v);
                }
            }
            t0 = t1;
        }
    }
}

/* xn (normed input) → b->out: attention of every token of the batch. */
static em_err attention(cpu_backend *b, const em_batch *batch, uint32_t il) {
    const em_layer_desc *ld = &b->d->layers[il];
    const em_layer_weights *lw = &b->w->layers[il];
    const uint32_t n = batch->n_tokens;
    const uint32_t nq = ld->n_head * ld->head_dim, nk = ld->n_head_kv * ld->head_dim, nv = ld->n_head_kv * ld->head_dim_v;
    em_err err;
    const matmul_out qkv[] = {{&lw->wq, 0, b->q, nq}, {&lw->wk, 0, b->k, nk}, {&lw->wv, 0, b->v, nv}};
    if ((err = matmuls(b, b->xn, b->d->n_embd, n, qkv, 3))) return err;
    add_bias(b->q, lw->bq, n, nq);
    add_bias(b->k, lw->bk, n, nk);
    add_bias(b->v, lw->bv, n, nv);

    for (uint32_t t = 0; t < n; t++) {
        em_cpu_rope_angles(b->rope_angles, batch->pos[t], &ld->rope);
        for (uint32_t h = 0; h < ld->n_head; h++) {
            float *q = b->q + (uint64_t)t * nq + (uint64_t)h * ld->head_dim;
            if (lw->q_norm) em_cpu_rmsnorm(q, q, lw->q_norm, ld->head_dim, b->d->norm_eps, b->d->norm == EM_NORM_RMS_PLUS_ONE);
            em_cpu_rope(q, b->rope_angles, &ld->rope);
        }
        for (uint32_t h = 0; h < ld->n_head_kv; h++) {
            float *k = b->k + (uint64_t)t * nk + (uint64_t)h * ld->head_dim;
            if (lw->k_norm) em_cpu_rmsnorm(k, k, lw->k_norm, ld->head_dim, b->d->norm_eps, b->d->norm == EM_NORM_RMS_PLUS_ONE);
            em_cpu_rope(k, b->rope_angles, &ld->rope);
        }
        /* Write this token's key and value into its sequence's cache before anyone attends. */
        const em_batch_seq *seq = &batch->seqs[batch->seq[t]];
        memcpy(kv_key(b, il, seq, batch->pos[t]), b->k + (uint64_t)t * nk, nk * sizeof(float));
        memcpy(kv_value(b, il, seq, batch->pos[t]), b->v + (uint64_t)t * nv, nv * sizeof(float));
    }
    attn_job job = {b, batch, il};
    uint64_t work = 0; /* bytes of keys and values read, as if for each query head alone */
    for (uint32_t t = 0; t < n; t++)
        work += ((uint64_t)batch->pos[t] + 1) * ld->n_head * (ld->head_dim + ld->head_dim_v) * sizeof(float);
    em_cpu_pool_run_sized(&b->pool, attention_share, &job, work);
    return matmul(b, &lw->wo, 0, b->attn, (uint64_t)ld->n_head * ld->head_dim_v, b->out, b->d->n_embd, n);
}

/* ---- feed-forward ---- */

/* A gated MLP on `n` rows of `x` (matrix `mat` of each stack) into `y`. */
static em_err mlp(cpu_backend *b, const em_weight *gate, const em_weight *up, const em_weight *down, uint64_t mat,
                  const float *x, float *y, uint32_t n) {
    const uint64_t e = b->d->n_embd, ff = gate->rows;
    em_err err;
    const matmul_out gate_up[] = {{gate, mat, b->gate, ff}, {up, mat, b->up, ff}};
    if ((err = matmuls(b, x, e, n, gate_up, 2))) return err;
    glu(b, b->gate, b->up, (uint64_t)n * ff);
    return matmul(b, down, mat, b->gate, ff, y, e, n);
}

/* Router: probabilities over experts, the top k, their weights (renormalized and scaled). */
static void route(cpu_backend *b, const em_layer_desc *ld, uint32_t t) {
    float *p = b->router + (uint64_t)t * ld->n_expert;
    if (ld->gating == EM_GATING_SOFTMAX) {
        em_f32_softmax(p, ld->n_expert);
    } else {
        for (uint32_t e = 0; e < ld->n_expert; e++) p[e] = 1.0f / (1.0f + em_expf(-p[e]));
    }
    int32_t *chosen = b->chosen + (uint64_t)t * ld->n_expert_used;
    float *weight = b->chosen_weight + (uint64_t)t * ld->n_expert_used;
    float sum = 0.0f;
    for (uint32_t k = 0; k < ld->n_expert_used; k++) {
        int32_t best = -1;
        for (uint32_t e = 0; e < ld->n_expert; e++) {
            bool taken = false;
            for (uint32_t j = 0; j < k; j++) taken |= chosen[j] == (int32_t)e;
            if (!taken && (best < 0 || p[e] > p[best])) best = (int32_t)e;
        }
        chosen[k] = best;
        weight[k] = p[best];
        sum += p[best];
    }
    for (uint32_t k = 0; k < ld->n_expert_used; k++) {
        if (ld->renormalize) weight[k] /= sum;
        weight[k] *= ld->expert_weights_scale;
    }
}

/* b->out for a batch of few tokens (a decode step): every chosen (expert, token) pair is a slot, in
 * the order the batched path below adds them (expert, then token); xn is quantized once per
 * activation format, the gate and up products of all chosen experts run as one job and their down
 * products as another, so each thread reads its share of all the experts' bytes in one go. */
static em_err moe_few(cpu_backend *b, uint32_t il, uint32_t n) {
    const em_layer_desc *ld = &b->d->layers[il];
    const em_layer_weights *lw = &b->w->layers[il];
    const em_weight *gate = &lw->gate_exps, *up = &lw->up_exps, *down = &lw->down_exps;
    const uint64_t e = b->d->n_embd, ff = gate->rows, used = ld->n_expert_used;
    uint32_t n_slots = 0;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t k = 0; k < used; k++) {
            /* insertion into the (expert, token) order */
            const uint32_t ex = (uint32_t)b->chosen[t * used + k];
            uint32_t at = n_slots++;
            for (; at > 0 && b->slot_expert[at - 1] > ex; at--) {
                b->slot_expert[at] = b->slot_expert[at - 1];
                b->slot_token[at] = b->slot_token[at - 1];
                b->slot_weight[at] = b->slot_weight[at - 1];
            }
            b->slot_expert[at] = ex;
            b->slot_token[at] = t;
            b->slot_weight[at] = b->chosen_weight[t * used + k];
        }

    /* xn in the gate's and the up's activation formats (once when they agree), then each slot's row
     * beside its expert's other slots: an expert's rows must be consecutive for its product. */
    em_err err;
    uint8_t *act = b->act;
    const uint64_t gate_bytes = em_cpu_act_bytes(gate), up_bytes = em_cpu_act_bytes(up);
    const bool same_format = em_dot_activation_type(gate->type) == em_dot_activation_type(up->type);
    uint8_t *x_gate = act, *x_up = same_format ? act : act + n * gate_bytes;
    if ((err = em_cpu_quantize(gate, b->xn, e, n, x_gate))) return err;
    if (!same_format && (err = em_cpu_quantize(up, b->xn, e, n, x_up))) return err;
    act += (same_format ? n * gate_bytes : n * (gate_bytes + up_bytes));
    uint8_t *slots_gate = act, *slots_up = same_format ? act : act + n_slots * gate_bytes;
    act += (same_format ? n_slots * gate_bytes : n_slots * (gate_bytes + up_bytes));
    for (uint32_t s = 0; s < n_slots; s++) {
        memcpy(slots_gate + s * gate_bytes, x_gate + b->slot_token[s] * gate_bytes, gate_bytes);
        if (!same_format) memcpy(slots_up + s * up_bytes, x_up + b->slot_token[s] * up_bytes, up_bytes);
    }
    uint32_t count = 0;
    for (uint32_t s = 0, next; s < n_slots; s = next) {
        for (next = s + 1; next < n_slots && b->slot_expert[next] == b->slot_expert[s];) next++;
        const uint64_t ex = b->slot_expert[s];
        b->products[count++] = (em_cpu_product){gate, ex, slots_gate + s * gate_bytes, gate_bytes, next - s,
                                                b->gate + s * ff, ff};
        b->products[count++] = (em_cpu_product){up, ex, slots_up + s * up_bytes, up_bytes, next - s,
                                                b->up + s * ff, ff};
    }
    em_cpu_products_run(&b->pool, b->products, count);
    glu(b, b->gate, b->up, n_slots * ff);

    const uint64_t down_bytes = em_cpu_act_bytes(down);
    if ((err = em_cpu_quantize(down, b->gate, ff, n_slots, act))) return err;
    count = 0;
    for (uint32_t s = 0, next; s < n_slots; s = next) {
        for (next = s + 1; next < n_slots && b->slot_expert[next] == b->slot_expert[s];) next++;
        b->products[count++] = (em_cpu_product){down, b->slot_expert[s], act + s * down_bytes, down_bytes, next - s,
                                                b->expert_out + s * e, e};
    }
    em_cpu_products_run(&b->pool, b->products, count);

    memset(b->out, 0, n * e * sizeof(float));
    for (uint32_t s = 0; s < n_slots; s++) {
        float *o = b->out + b->slot_token[s] * e;
        const float *y = b->expert_out + s * e;
        for (uint64_t j = 0; j < e; j++) o[j] += b->slot_weight[s] * y[j];
    }
    return NULL;
}

/* xn → b->out through the experts each token chose: tokens are grouped by expert so each expert's
 * matrices are read once per batch (a batch's experts each run whole on one thread, experts.c). */
static em_err moe(cpu_backend *b, uint32_t il, uint32_t n) {
    const em_layer_desc *ld = &b->d->layers[il];
    const em_layer_weights *lw = &b->w->layers[il];
    const uint64_t e = b->d->n_embd;
    em_err err = matmul(b, &lw->gate_inp, 0, b->xn, e, b->router, ld->n_expert, n);
    if (err) return err;
    for (uint32_t t = 0; t < n; t++) route(b, ld, t);
    if (n < EM_CPU_FEW_TOKENS) {
        if ((err = moe_few(b, il, n))) return err;
    } else {
        const em_cpu_experts experts = {
            .gate = &lw->gate_exps, .up = &lw->up_exps, .down = &lw->down_exps, .gelu = b->d->act == EM_ACT_GEGLU,
            .x = b->xn, .n_tokens = n, .n_embd = (uint32_t)e, .n_expert = ld->n_expert, .n_used = ld->n_expert_used,
            .chosen = b->chosen, .chosen_weight = b->chosen_weight, .out = b->out};
        if ((err = em_cpu_experts_run(&b->pool, &experts, &b->experts))) return err;
    }
    if (ld->n_ff_shared) {
        if ((err = mlp(b, &lw->gate_shexp, &lw->up_shexp, &lw->down_shexp, 0, b->xn, b->expert_out, n))) return err;
        for (uint64_t i = 0; i < (uint64_t)n * e; i++) b->out[i] += b->expert_out[i];
    }
    return NULL;
}

/* ---- the transformer block ---- */

static em_err forward_layer(cpu_backend *b, const em_batch *batch, uint32_t il) {
    const em_layer_desc *ld = &b->d->layers[il];
    const em_layer_weights *lw = &b->w->layers[il];
    const uint32_t n = batch->n_tokens, e = b->d->n_embd;
    em_err err;

    /* x += [post_norm](attention(norm(x))) */
    norm_rows(b, b->xn, b->x, lw->attn_norm, n, e);
    if ((err = attention(b, batch, il))) return err;
    if (lw->post_attn_norm) norm_rows(b, b->out, b->out, lw->post_attn_norm, n, e);
    for (uint64_t i = 0; i < (uint64_t)n * e; i++) b->x[i] += b->out[i];

    /* x += [post_norm](ffn(norm(x))) */
    norm_rows(b, b->xn, b->x, lw->ffn_norm, n, e);
    if (ld->moe)
        err = moe(b, il, n);
    else
        err = mlp(b, &lw->ffn_gate, &lw->ffn_up, &lw->ffn_down, 0, b->xn, b->out, n);
    if (err) return err;
    if (lw->post_ffn_norm) norm_rows(b, b->out, b->out, lw->post_ffn_norm, n, e);
    for (uint64_t i = 0; i < (uint64_t)n * e; i++) b->x[i] += b->out[i];
    return NULL;
}


static em_err reserve(cpu_backend *b, uint32_t n) {
    if (n <= b->cap_tokens) return NULL;
    const uint64_t e = b->d->n_embd;
    /* A few-token MoE step (moe_few) keeps a row of gate, up and expert_out per chosen expert of
     * each token, and in act its activations: n rows per format, a copy per slot, the down inputs. */
    const uint64_t slots = (uint64_t)(EM_CPU_FEW_TOKENS - 1) * b->max_expert_used;
    const uint64_t slot_rows = n > slots ? n : slots;
    const uint64_t few_act_rows = (EM_CPU_FEW_TOKENS - 1) * (3 + 3 * (uint64_t)b->max_expert_used);
    struct { float **p; uint64_t floats; } bufs[] = {
        {&b->x, e * n}, {&b->xn, e * n}, {&b->q, (uint64_t)b->max_q * n}, {&b->k, (uint64_t)b->max_k * n},
        {&b->v, (uint64_t)b->max_v * n}, {&b->attn, (uint64_t)b->max_attn * n}, {&b->out, e * n},
        {&b->gate, (uint64_t)b->max_ff * slot_rows}, {&b->up, (uint64_t)b->max_ff * slot_rows},
        {&b->router, (uint64_t)b->max_expert * n}, {&b->expert_out, e * slot_rows},
        {&b->chosen_weight, (uint64_t)b->max_expert * n},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        free(*bufs[i].p);
        *bufs[i].p = malloc((bufs[i].floats ? bufs[i].floats : 1) * sizeof(float));
        if (!*bufs[i].p) return em_errorf(EM_ERR_NOMEM, "out of memory for scratch of %u tokens", n);
    }
    free(b->chosen);
    free(b->act);
    free(b->act_groups);
    b->chosen = malloc(((uint64_t)b->max_expert + 1) * n * sizeof *b->chosen);
    b->act = malloc(b->act_per_token * (n > few_act_rows ? n : few_act_rows));
    b->act_groups = b->packs_groups ? malloc(b->act_per_token * em_cpu_group_scratch_tokens(n)) : NULL;
    if (!b->chosen || !b->act || (b->packs_groups && !b->act_groups))
        return em_errorf(EM_ERR_NOMEM, "out of memory for scratch of %u tokens", n);
    em_err err;
    if (b->max_expert_used &&
        (err = em_cpu_expert_scratch_reserve(&b->experts, b->pool.n_threads, n, b->max_expert_used, b->max_expert,
                                             (uint32_t)e, b->max_ff, b->act_per_token, b->packs_groups)))
        return err;
    b->cap_tokens = n;
    return NULL;
}

/* Attention scores need one float per visible position, per query head of a KV head's group (the
 * widest group of any layer), per token of a tile, per thread. */
static em_err reserve_positions(cpu_backend *b, const em_batch *batch) {
    uint32_t longest = 0, widest = 1;
    for (uint32_t t = 0; t < batch->n_tokens; t++)
        if (batch->pos[t] + 1 > longest) longest = batch->pos[t] + 1;
    if (longest <= b->cap_positions) return NULL;
    for (uint32_t il = 0; il < b->d->n_layer; il++) {
        const uint32_t group = b->d->layers[il].n_head / b->d->layers[il].n_head_kv;
        if (group > widest) widest = group;
    }
    free(b->scores);
    b->scores = malloc((uint64_t)b->pool.n_threads * ATTN_TILE * widest * longest * sizeof(float));
    b->cap_positions = b->scores ? longest : 0;
    b->scores_per_thread = (uint64_t)ATTN_TILE * widest * b->cap_positions;
    return b->scores ? NULL : em_errorf(EM_ERR_NOMEM, "out of memory for attention over %u positions", longest);
}

/* Room for `rows` logits rows and the pick rule's scratch (grown, never shrunk). */
static em_err reserve_pick(cpu_backend *b, uint32_t rows) {
    if (rows <= b->cap_pick_rows) return NULL;
    free(b->pick_logits);
    b->pick_logits = malloc((uint64_t)rows * b->d->n_vocab * sizeof *b->pick_logits);
    if (!b->pick_keys) b->pick_keys = malloc(2 * (uint64_t)b->d->n_vocab * sizeof *b->pick_keys);
    b->cap_pick_rows = b->pick_logits && b->pick_keys ? rows : 0;
    return b->cap_pick_rows ? NULL : em_errorf(EM_ERR_NOMEM, "out of memory for %u logits rows to pick from", rows);
}

/* The pick rule on `rows` logits rows, each masked first where `masks` gives it a mask. */
static void pick_rows(cpu_backend *b, float *logits, uint32_t rows, const uint32_t *const *masks,
                      const em_pick_params *pick, int32_t *picked) {
    const uint32_t n_vocab = b->d->n_vocab;
    for (uint32_t r = 0; r < rows; r++) {
        float *row = logits + (uint64_t)r * n_vocab;
        if (masks && masks[r]) em_pick_mask(row, n_vocab, masks[r]);
        picked[r] = em_pick(row, n_vocab, &pick[r], b->pick_keys);
    }
}

/* The forward pass; with `pick`, the logits rows go to scratch and only the picked tokens leave. */
static em_err forward(cpu_backend *b, const em_batch *batch, float *logits, const em_pick_params *pick,
                      int32_t *picked) {
    const em_model_desc *d = b->d;
    const uint32_t n = batch->n_tokens, e = d->n_embd;
    em_err err = em_batch_validate(batch, pick ? (const void *)picked : logits, b->d->n_vocab, &b->base);
    if (err) return err;
    if (pick) {
        if ((err = reserve_pick(b, em_batch_logits_rows(batch)))) return err;
        logits = b->pick_logits;
    }
    if ((err = reserve(b, n))) return err;
    if ((err = reserve_positions(b, batch))) return err;

    /* Token embeddings (rows of token_embd, dequantized), scaled for Gemma. */
    const em_weight *te = &b->w->token_embd;
    for (uint32_t t = 0; t < n; t++) {
        const uint8_t *row = (const uint8_t *)te->data + (uint64_t)batch->tokens[t] * te->row_bytes;
        float *x = b->x + (uint64_t)t * e;
        if (te->type == EM_TYPE_F32)
            memcpy(x, row, e * sizeof(float));
        else if ((err = em_dequantize(te->type, row, x, e)))
            return em_err_prefix(err, "token_embd row %d", batch->tokens[t]);
        if (d->embd_scale != 1.0f)
            for (uint32_t i = 0; i < e; i++) x[i] *= d->embd_scale;
    }
    for (uint32_t il = 0; il < d->n_layer; il++)
        if ((err = forward_layer(b, batch, il))) return em_err_prefix(err, "layer %u", il);

    /* Logits for the rows that want them: final norm, output matrix, optional softcap. */
    uint32_t rows = 0;
    for (uint32_t t = 0; t < n; t++) {
        bool want = batch->logits ? batch->logits[t] : t == n - 1;
        if (!want) continue;
        em_cpu_rmsnorm(b->xn + (uint64_t)rows * e, b->x + (uint64_t)t * e, b->w->output_norm, e, d->norm_eps,
                       d->norm == EM_NORM_RMS_PLUS_ONE);
        rows++;
    }
    if ((err = matmul(b, &b->w->output, 0, b->xn, e, logits, d->n_vocab, rows))) return err;
    if (d->final_softcap > 0.0f)
        for (uint64_t i = 0; i < (uint64_t)rows * d->n_vocab; i++)
            logits[i] = d->final_softcap * tanhf(logits[i] / d->final_softcap);
    if (pick && !batch->pick_masks_later) pick_rows(b, logits, rows, batch->pick_masks, pick, picked);
    return NULL;
}

static em_err cpu_forward(em_backend *base, const em_batch *batch, float *logits) {
    return forward((cpu_backend *)base, batch, logits, NULL, NULL);
}

static em_err cpu_forward_pick(em_backend *base, const em_batch *batch, const em_pick_params *pick, int32_t *picked) {
    return forward((cpu_backend *)base, batch, NULL, pick, picked);
}

static em_err cpu_copy_rows(em_backend *base, uint32_t from, uint32_t to, uint32_t rows) {
    cpu_backend *b = (cpu_backend *)base;
    if (from >= base->n_blocks || to >= base->n_blocks || rows > base->block_tokens)
        return em_errorf(EM_ERR_RANGE, "copy of %u rows from block %u to block %u (pool of %u blocks of %u)", rows, from,
                         to, base->n_blocks, base->block_tokens);
    for (uint32_t il = 0; il < b->d->n_layer; il++) {
        const em_layer_desc *ld = &b->d->layers[il];
        uint64_t nk = (uint64_t)ld->n_head_kv * ld->head_dim, nv = (uint64_t)ld->n_head_kv * ld->head_dim_v;
        float *keys = b->keys + b->layer_key_offset[il], *values = b->values + b->layer_value_offset[il];
        memmove(keys + (uint64_t)to * base->block_tokens * nk, keys + (uint64_t)from * base->block_tokens * nk,
                rows * nk * sizeof(float));
        memmove(values + (uint64_t)to * base->block_tokens * nv, values + (uint64_t)from * base->block_tokens * nv,
                rows * nv * sizeof(float));
    }
    return NULL;
}

static void cpu_free(em_backend *base) {
    cpu_backend *b = (cpu_backend *)base;
    em_cpu_pool_destroy(&b->pool);
    float *bufs[] = {b->keys, b->values, b->x, b->xn, b->q, b->k, b->v, b->attn, b->out, b->gate, b->up,
                     b->router, b->expert_out, b->chosen_weight, b->scores, b->rope_angles};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    em_cpu_expert_scratch_free(&b->experts);
    free(b->chosen);
    free(b->act);
    free(b->act_groups);
    free(b->products);
    free(b->slot_token);
    free(b->slot_expert);
    free(b->slot_weight);
    free(b->pick_logits);
    free(b->pick_keys);
    free(b->overlap_tokens);
    free(b->overlap_picked[0]);
    free(b->overlap_picked[1]);
    free(b->late_pick);
    free(b->layer_key_offset);
    free(b->layer_value_offset);
    free(b);
}

/* Step overlap on the CPU, offered only with EMBER_CPU_OVERLAP=1, to test the engine's pipelined
 * steps where CI has no GPU (the CPU gains nothing from it: its forward runs on the caller's
 * thread): pick_begin runs the step at once, with EM_TOKEN_PICKED tokens replaced by the previous
 * begun step's picks, and queues its tokens; pick_end hands out the oldest queued step's. */
static em_err cpu_pick_begin(em_backend *base, const em_batch *batch, const em_pick_params *pick) {
    cpu_backend *b = (cpu_backend *)base;
    if (b->overlap_count == 2) return em_errorf(EM_ERR_INTERNAL, "cpu pick_begin: two steps already begun");
    if (b->late_pending) return em_errorf(EM_ERR_INTERNAL, "cpu pick_begin: the last begun step waits for its masks");
    const uint32_t rows = em_batch_logits_rows(batch), slot = (b->overlap_head + b->overlap_count) % 2;
    const uint32_t previous = (slot + 1) % 2; /* the last begun step's slot, if one was begun */
    int32_t *tokens = realloc(b->overlap_tokens, (batch->n_tokens ? batch->n_tokens : 1) * sizeof *tokens);
    int32_t *picked = realloc(b->overlap_picked[slot], (rows ? rows : 1) * sizeof *picked);
    if (tokens) b->overlap_tokens = tokens;
    if (picked) b->overlap_picked[slot] = picked;
    if (!tokens || !picked) return em_errorf(EM_ERR_NOMEM, "cpu pick_begin: out of memory");
    for (uint32_t t = 0; t < batch->n_tokens; t++) {
        tokens[t] = batch->tokens[t];
        if (tokens[t] >= 0) continue;
        const uint32_t row = EM_TOKEN_PICKED_ROW(tokens[t]);
        if (!b->overlap_begun || row >= b->overlap_rows[previous])
            return em_errorf(EM_ERR_RANGE, "cpu pick_begin: token %u names row %u of a step with %u rows", t, row,
                             b->overlap_begun ? b->overlap_rows[previous] : 0);
        tokens[t] = b->overlap_picked[previous][row];
    }
    em_batch own = *batch;
    own.tokens = tokens;
    if (batch->pick_masks_later && rows > b->cap_late_rows) {
        em_pick_params *grown = realloc(b->late_pick, rows * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "cpu pick_begin: out of memory");
        b->late_pick = grown, b->cap_late_rows = rows;
    }
    em_err err = forward(b, &own, NULL, pick, picked);
    if (err) return err;
    if (batch->pick_masks_later) {
        if (rows) memcpy(b->late_pick, pick, rows * sizeof *pick);
        b->late_rows = rows, b->late_pending = true;
    }
    b->overlap_rows[slot] = rows;
    b->overlap_count++;
    b->overlap_begun = true;
    return NULL;
}

/* The late pick of the last begun step: its logits rows are still in pick_logits. */
static em_err cpu_pick_masks(em_backend *base, const uint32_t *const *masks) {
    cpu_backend *b = (cpu_backend *)base;
    if (!b->late_pending) return em_errorf(EM_ERR_INTERNAL, "cpu pick_masks: no step waits for its masks");
    b->late_pending = false;
    const uint32_t slot = (b->overlap_head + b->overlap_count - 1) % 2;
    pick_rows(b, b->pick_logits, b->late_rows, masks, b->late_pick, b->overlap_picked[slot]);
    return NULL;
}

static em_err cpu_pick_end(em_backend *base, int32_t *picked) {
    cpu_backend *b = (cpu_backend *)base;
    if (b->overlap_count == 0) return em_errorf(EM_ERR_INTERNAL, "cpu pick_end: no step begun");
    if (b->late_pending && b->overlap_count == 1)
        return em_errorf(EM_ERR_INTERNAL, "cpu pick_end: the step waits for its masks");
    memcpy(picked, b->overlap_picked[b->overlap_head], b->overlap_rows[b->overlap_head] * sizeof *picked);
    b->overlap_head = (b->overlap_head + 1) % 2;
    b->overlap_count--;
    return NULL;
}

static const em_backend_ops cpu_ops = {"cpu", cpu_forward, cpu_forward_pick, cpu_copy_rows, cpu_free, NULL, NULL, true, NULL};
static const em_backend_ops cpu_overlap_ops = {"cpu", cpu_forward, cpu_forward_pick, cpu_copy_rows,
                                               cpu_free, cpu_pick_begin, cpu_pick_end, true, cpu_pick_masks};

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

static void act_max(cpu_backend *b, const em_weight *w) {
    if (!w->data) return;
    b->act_per_token = max_u64(b->act_per_token, em_cpu_act_bytes(w));
    if (em_dot_group_kernel(w->type) || em_cpu_amx(w->type, w->cols, EM_CPU_AMX_FROM)) b->packs_groups = true;
}

uint64_t em_backend_kv_bytes_per_token(const em_model_desc *d) {
    uint64_t floats = 0;
    for (uint32_t il = 0; il < d->n_layer; il++)
        floats += (uint64_t)d->layers[il].n_head_kv * (d->layers[il].head_dim + d->layers[il].head_dim_v);
    return floats * sizeof(float);
}

void em_batch_fixed_tables(em_batch_seq *seqs, uint32_t *blocks, uint32_t n, uint32_t per_seq) {
    for (uint32_t i = 0; i < n * per_seq; i++) blocks[i] = i;
    for (uint32_t s = 0; s < n; s++) seqs[s] = (em_batch_seq){blocks + (uint64_t)s * per_seq, per_seq};
}

em_err em_backend_cpu_new(const em_model *model, const em_backend_config *config, em_backend **out) {
    *out = NULL;
    const em_model_desc *d = &model->desc;
    em_backend_config o = config ? *config : (em_backend_config){0};
    if (!o.block_tokens) o.block_tokens = 16;
    if (!o.n_threads) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        o.n_threads = cores > 0 ? (uint32_t)cores : 1;
    }
    uint64_t per_token = em_backend_kv_bytes_per_token(d);
    uint64_t tokens = o.kv_bytes ? o.kv_bytes / (per_token ? per_token : 1) : (o.kv_tokens ? o.kv_tokens : 4096);
    uint64_t n_blocks = tokens / o.block_tokens;
    if (n_blocks == 0 || n_blocks > (1u << 28) || o.block_tokens > 4096 || o.n_threads > EM_CPU_MAX_THREADS)
        return em_errorf(EM_ERR_RANGE, "cpu backend: %llu KV blocks of %u positions on %u threads is out of range",
                         (unsigned long long)n_blocks, o.block_tokens, o.n_threads);
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b) return em_errorf(EM_ERR_NOMEM, "out of memory creating the cpu backend");
    const char *overlap = getenv("EMBER_CPU_OVERLAP");
    b->base = (em_backend){overlap && !strcmp(overlap, "1") ? &cpu_overlap_ops : &cpu_ops, model, (uint32_t)n_blocks,
                           o.block_tokens, per_token};
    b->d = d;
    b->w = &model->w;
    em_err err = em_cpu_pool_init(&b->pool, o.n_threads);
    if (err) goto fail;

    const uint64_t rows = n_blocks * o.block_tokens;
    uint64_t key_floats = 0, value_floats = 0;
    b->layer_key_offset = calloc(d->n_layer, sizeof(uint64_t));
    b->layer_value_offset = calloc(d->n_layer, sizeof(uint64_t));
    if (!b->layer_key_offset || !b->layer_value_offset) goto nomem;
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *ld = &d->layers[il];
        const em_layer_weights *lw = &model->w.layers[il];
        b->layer_key_offset[il] = key_floats;
        b->layer_value_offset[il] = value_floats;
        key_floats += rows * ld->n_head_kv * ld->head_dim;
        value_floats += rows * ld->n_head_kv * ld->head_dim_v;
        b->max_q = (uint32_t)max_u64(b->max_q, (uint64_t)ld->n_head * ld->head_dim);
        b->max_k = (uint32_t)max_u64(b->max_k, (uint64_t)ld->n_head_kv * ld->head_dim);
        b->max_v = (uint32_t)max_u64(b->max_v, (uint64_t)ld->n_head_kv * ld->head_dim_v);
        b->max_attn = (uint32_t)max_u64(b->max_attn, (uint64_t)ld->n_head * ld->head_dim_v);
        b->max_ff = (uint32_t)max_u64(b->max_ff, max_u64(ld->n_ff, ld->n_ff_shared));
        b->max_expert = (uint32_t)max_u64(b->max_expert, ld->n_expert);
        b->max_expert_used = (uint32_t)max_u64(b->max_expert_used, ld->n_expert_used);
        const em_weight *ws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->ffn_gate, &lw->ffn_up, &lw->ffn_down,
                                 &lw->gate_inp, &lw->gate_exps, &lw->up_exps, &lw->down_exps,
                                 &lw->gate_shexp, &lw->up_shexp, &lw->down_shexp};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) act_max(b, ws[i]);
    }
    act_max(b, &model->w.output);
    /* calloc: pages are only touched when rows are written, so a large budget costs nothing up front. */
    b->keys = calloc(key_floats, sizeof(float));
    b->values = calloc(value_floats, sizeof(float));
    uint32_t max_rot = 2;
    for (uint32_t il = 0; il < d->n_layer; il++)
        if (d->layers[il].rope.n_rot > max_rot) max_rot = d->layers[il].rope.n_rot;
    b->rope_angles = malloc(max_rot * sizeof(float));
    /* matmuls takes up to three products (Q, K, V), moe_few two per chosen expert of each token. */
    const uint32_t slots = (EM_CPU_FEW_TOKENS - 1) * b->max_expert_used;
    b->max_products = 2 * slots > 3 ? 2 * slots : 3;
    b->products = malloc(b->max_products * sizeof *b->products);
    b->slot_token = malloc((slots ? slots : 1) * sizeof *b->slot_token);
    b->slot_expert = malloc((slots ? slots : 1) * sizeof *b->slot_expert);
    b->slot_weight = malloc((slots ? slots : 1) * sizeof *b->slot_weight);
    if (!b->keys || !b->values || !b->rope_angles || !b->products || !b->slot_token || !b->slot_expert ||
        !b->slot_weight)
        goto nomem;
    *out = &b->base;
    return NULL;
nomem:
    err = em_errorf(EM_ERR_NOMEM, "out of memory for a KV cache of %llu blocks of %u positions",
                    (unsigned long long)n_blocks, o.block_tokens);
fail:
    cpu_free(&b->base);
    return err;
}
