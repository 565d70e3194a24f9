/* The CPU reference backend: an interpreter of the layer program (program.h), one operation at a
 * time, readable top to bottom (run_op below is the whole list). Activations are f32 rows, one
 * buffer of the program each; weights stay in their stored format and meet the activations in
 * quant's dot products; matrix rows and attention heads are split across a pool of threads. Two
 * things it does beyond one operation at a time, for speed and with the same numbers: consecutive
 * products of one input (Q, K, V; gate and up) quantize that input once and run as one job, and a
 * decode step's experts run as two jobs over all chosen experts. The KV cache is paged: each cache
 * of the program has one f32 region of n_blocks * block_tokens rows, and a sequence's block table
 * says which row holds which position. A hybrid model's recurrent states (delta_net.c) live in
 * n_state_slots slots of em_program_state_floats floats each, one per sequence or snapshot. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../quant/quant.h"
#include "../backend.h"
#include "cpu_internal.h"

/* A router's choices for each token of a batch: n_used (expert, weight) pairs, in the order chosen. */
typedef struct choices {
    int32_t *expert;
    float *weight;
    uint32_t n_used; /* of the route that wrote them last */
} choices;

typedef struct cpu_backend {
    em_backend base;
    em_cpu_pool pool;
    const em_program *program;
    uint32_t n_vocab;

    /* KV cache: for each of the program's caches, n_blocks * block_tokens rows of its key (value) width. */
    float *keys, *values;
    uint64_t *cache_key_offset, *cache_value_offset; /* start of each cache's rows, in floats */

    /* Recurrent states: slot s at states + s * state_floats; state_pos[s] = the positions it has seen. */
    float *states;
    uint64_t state_floats;
    uint32_t *state_pos;
    float *conv_out, *gates, *delta_scratch; /* delta_net's scratch (em_cpu_delta_net) */
    uint32_t max_conv_dim, max_head_v, max_head_dim_v;

    /* The program's buffers, cap_tokens rows each, grown on demand. */
    uint32_t cap_tokens;
    float *rows[EM_PROGRAM_MAX_BUFFERS];
    choices choices[EM_PROGRAM_MAX_BUFFERS];
    float *logits_in;     /* the normed rows of the output operation */
    em_cpu_expert_scratch experts; /* a batch's expert layers (em_cpu_experts_run) */
    float *scores;        /* per thread, cap_positions floats per query head of a KV head's group */
    uint32_t cap_positions;
    uint64_t scores_per_thread;
    /* cos, sin of each token's angles (max_rot floats a token), for `angles_rope`; the layers that
     * share a rotation share them within a step */
    float *rope_angles;
    em_rope angles_rope;
    bool angles_valid;
    uint32_t max_rot;
    uint8_t *act;         /* activations in the dot-product format */
    uint8_t *act_groups;  /* the same packed in token groups (em_cpu_matmul's groups), or NULL */
    bool packs_groups;    /* some weight type has a group kernel on this CPU: act_groups is allocated */
    uint64_t act_per_token;
    uint32_t max_ff, max_expert, max_expert_used, max_embd;
    em_cpu_product *products; /* the products of one job of few tokens (max_products) */
    uint32_t max_products;
    /* A few-token MoE step's chosen (expert, token) pairs and their rows (experts_few). */
    uint32_t *slot_token, *slot_expert;
    float *slot_weight, *slot_gate, *slot_up, *slot_out;
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

/* ---- products ---- */

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

typedef struct glu_job {
    em_activation act;
    float limit, alpha;
    float *gate;
    const float *up;
    uint64_t n;
} glu_job;

static void glu_share(void *ctx, uint32_t ith, uint32_t nth) {
    const glu_job *job = ctx;
    uint64_t begin, end;
    em_cpu_share(job->n, ith, nth, &begin, &end);
    em_cpu_glu(job->act, job->limit, job->alpha, job->gate + begin, job->up + begin, end - begin);
}

/* h = act(gate) * up, the gated linear unit of SwiGLU / GeGLU, split over the pool (a prefill's
 * units are many, and one transcendental function each). */
static void glu(cpu_backend *b, em_activation act, float limit, float alpha, float *gate, const float *up,
                uint64_t n) {
    glu_job job = {act, limit, alpha, gate, up, n};
    /* a unit's transcendental function counts as about 64 bytes of a product's reading */
    em_cpu_pool_run_sized(&b->pool, glu_share, &job, n * 64);
}

/* ---- experts ---- */

/* Router: probabilities over experts, the top k, their weights (renormalized and scaled). Softmax
 * over the chosen: the top k of the logits themselves, then a softmax over those k. */
static void route(const em_program_route *r, float *p, int32_t *chosen, float *weight) {
    if (r->gating == EM_GATING_SOFTMAX) {
        em_f32_softmax(p, r->n_expert);
    } else if (r->gating == EM_GATING_SIGMOID) {
        for (uint32_t e = 0; e < r->n_expert; e++) p[e] = 1.0f / (1.0f + em_expf(-p[e]));
    }
    float sum = 0.0f;
    for (uint32_t k = 0; k < r->n_used; k++) {
        int32_t best = -1;
        for (uint32_t e = 0; e < r->n_expert; e++) {
            bool taken = false;
            for (uint32_t j = 0; j < k; j++) taken |= chosen[j] == (int32_t)e;
            if (!taken && (best < 0 || p[e] > p[best])) best = (int32_t)e;
        }
        chosen[k] = best;
        weight[k] = p[best];
        sum += p[best];
    }
    if (r->gating == EM_GATING_SOFTMAX_CHOSEN) em_f32_softmax(weight, r->n_used);
    for (uint32_t k = 0; k < r->n_used; k++) {
        if (r->renormalize) weight[k] /= sum;
        weight[k] *= r->scale;
        if (r->expert_scale) weight[k] *= r->expert_scale[chosen[k]];
    }
}

/* The experts of a batch of few tokens (a decode step): every chosen (expert, token) pair is a slot, in
 * the order the batched path adds them (expert, then token); the input is quantized once per
 * activation format, the gate and up products of all chosen experts run as one job and their down
 * products as another, so each thread reads its share of all the experts' bytes in one go. */
static em_err experts_few(cpu_backend *b, const em_program_experts *x, const float *in, const choices *c, float *out,
                          uint32_t n) {
    const em_weight *gate = x->gate, *up = x->up, *down = x->down;
    const uint64_t e = gate->cols, ff = gate->rows, used = c->n_used;
    uint32_t n_slots = 0;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t k = 0; k < used; k++) {
            /* insertion into the (expert, token) order */
            const uint32_t ex = (uint32_t)c->expert[t * used + k];
            uint32_t at = n_slots++;
            for (; at > 0 && b->slot_expert[at - 1] > ex; at--) {
                b->slot_expert[at] = b->slot_expert[at - 1];
                b->slot_token[at] = b->slot_token[at - 1];
                b->slot_weight[at] = b->slot_weight[at - 1];
            }
            b->slot_expert[at] = ex;
            b->slot_token[at] = t;
            b->slot_weight[at] = c->weight[t * used + k];
        }

    /* xn in the gate's and the up's activation formats (once when they agree), then each slot's row
     * beside its expert's other slots: an expert's rows must be consecutive for its product. */
    em_err err;
    uint8_t *act = b->act;
    const uint64_t gate_bytes = em_cpu_act_bytes(gate), up_bytes = em_cpu_act_bytes(up);
    const bool same_format = em_dot_activation_type(gate->type) == em_dot_activation_type(up->type);
    uint8_t *x_gate = act, *x_up = same_format ? act : act + n * gate_bytes;
    if ((err = em_cpu_quantize(gate, in, e, n, x_gate))) return err;
    if (!same_format && (err = em_cpu_quantize(up, in, e, n, x_up))) return err;
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
                                                b->slot_gate + s * ff, ff};
        b->products[count++] = (em_cpu_product){up, ex, slots_up + s * up_bytes, up_bytes, next - s,
                                                b->slot_up + s * ff, ff};
    }
    em_cpu_products_run(&b->pool, b->products, count);
    for (uint32_t s = 0; s < n_slots; s++) {
        if (x->gate_bias) em_cpu_add_bias(b->slot_gate + s * ff, x->gate_bias + b->slot_expert[s] * ff, 1, ff);
        if (x->up_bias) em_cpu_add_bias(b->slot_up + s * ff, x->up_bias + b->slot_expert[s] * ff, 1, ff);
    }
    glu(b, x->act, x->limit, x->alpha, b->slot_gate, b->slot_up, n_slots * ff);

    const uint64_t down_bytes = em_cpu_act_bytes(down);
    if ((err = em_cpu_quantize(down, b->slot_gate, ff, n_slots, act))) return err;
    count = 0;
    for (uint32_t s = 0, next; s < n_slots; s = next) {
        for (next = s + 1; next < n_slots && b->slot_expert[next] == b->slot_expert[s];) next++;
        b->products[count++] = (em_cpu_product){down, b->slot_expert[s], act + s * down_bytes, down_bytes, next - s,
                                                b->slot_out + s * e, e};
    }
    em_cpu_products_run(&b->pool, b->products, count);

    const uint64_t width = down->rows;
    if (x->down_bias)
        for (uint32_t s = 0; s < n_slots; s++)
            em_cpu_add_bias(b->slot_out + s * e, x->down_bias + b->slot_expert[s] * width, 1, width);
    memset(out, 0, n * width * sizeof(float));
    for (uint32_t s = 0; s < n_slots; s++) {
        float *o = out + b->slot_token[s] * width;
        const float *y = b->slot_out + s * width;
        for (uint64_t j = 0; j < width; j++) o[j] += b->slot_weight[s] * y[j];
    }
    return NULL;
}

/* out = the experts each token chose, on `in`: a decode step's through experts_few, a larger batch's
 * grouped by expert so each expert's matrices are read once (experts.c). */
static em_err experts(cpu_backend *b, const em_program_experts *x, const float *in, const choices *c, float *out,
                      uint32_t n) {
    if (n < EM_CPU_FEW_TOKENS) return experts_few(b, x, in, c, out, n);
    const em_cpu_experts job = {
        .gate = x->gate, .up = x->up, .down = x->down, .gate_bias = x->gate_bias, .up_bias = x->up_bias,
        .down_bias = x->down_bias, .act = x->act, .limit = x->limit, .alpha = x->alpha, .x = in, .n_tokens = n,
        .n_embd = (uint32_t)x->gate->cols, .n_expert = (uint32_t)x->gate->n_mat, .n_used = c->n_used,
        .chosen = c->expert, .chosen_weight = c->weight, .out = out};
    return em_cpu_experts_run(&b->pool, &job, &b->experts);
}

/* ---- the program ---- */

/* The cache rows of position `pos` of a sequence: its block from the table, then the row inside. */
static uint64_t kv_row(const cpu_backend *b, const em_batch_seq *seq, uint32_t pos) {
    return (uint64_t)seq->blocks[pos / b->base.block_tokens] * b->base.block_tokens + pos % b->base.block_tokens;
}

/* Each token's keys and values into its sequence's rows of `cache`, before anyone attends. */
static void kv_write(cpu_backend *b, const em_batch *batch, uint32_t cache, const float *k, const float *v) {
    const em_program_cache *c = &b->program->caches[cache];
    float *keys = b->keys + b->cache_key_offset[cache], *values = b->values + b->cache_value_offset[cache];
    for (uint32_t t = 0; t < batch->n_tokens; t++) {
        const uint64_t row = kv_row(b, &batch->seqs[batch->seq[t]], batch->pos[t]);
        memcpy(keys + row * c->key_width, k + (uint64_t)t * c->key_width, c->key_width * sizeof(float));
        memcpy(values + row * c->value_width, v + (uint64_t)t * c->value_width, c->value_width * sizeof(float));
    }
}

static bool same_rope(const em_rope *a, const em_rope *b) {
    return a->style == b->style && a->theta == b->theta && a->n_rot == b->n_rot && a->scaling == b->scaling &&
           a->factor == b->factor && a->orig_ctx == b->orig_ctx && a->yarn_ext_factor == b->yarn_ext_factor &&
           a->yarn_attn_factor == b->yarn_attn_factor && a->yarn_beta_fast == b->yarn_beta_fast &&
           a->yarn_beta_slow == b->yarn_beta_slow && a->freq_factors == b->freq_factors;
}

/* QK-norm or RoPE of every head of every token, in place. The angles of a rotation are worked out
 * once a step: every layer with the same rotation (usually all of them, queries and keys) reuses them. */
static void heads(cpu_backend *b, const em_batch *batch, const em_program_op *op, float *rows) {
    const em_program_heads *h = &op->u.heads;
    if (op->kind == EM_PROGRAM_ROPE && !(b->angles_valid && same_rope(&b->angles_rope, h->rope))) {
        for (uint32_t t = 0; t < batch->n_tokens; t++)
            em_cpu_rope_angles(b->rope_angles + (uint64_t)t * b->max_rot, batch->pos[t], h->rope);
        b->angles_rope = *h->rope;
        b->angles_valid = true;
    }
    for (uint32_t t = 0; t < batch->n_tokens; t++) {
        float *row = rows + (uint64_t)t * h->n_head * h->head_dim;
        const float *angles = b->rope_angles + (uint64_t)t * b->max_rot;
        for (uint32_t i = 0; i < h->n_head; i++) {
            float *head = row + (uint64_t)i * h->head_dim;
            if (op->kind == EM_PROGRAM_ROPE)
                em_cpu_rope(head, angles, h->rope);
            else
                em_cpu_rmsnorm(head, head, h->norm.weight, h->head_dim, h->norm.eps, h->norm.plus_one);
        }
    }
}

static void norm_rows(float *out, const float *x, const em_program_norm *norm, uint32_t n_tokens) {
    for (uint32_t t = 0; t < n_tokens; t++)
        em_cpu_rmsnorm(out + (uint64_t)t * norm->width, x + (uint64_t)t * norm->width, norm->weight, norm->width,
                       norm->eps, norm->plus_one);
}

static em_err embed(cpu_backend *b, const em_batch *batch, const em_program_embed *e, float *x) {
    const em_weight *table = e->table;
    const uint64_t width = table->cols;
    for (uint32_t t = 0; t < batch->n_tokens; t++) {
        const uint8_t *row = (const uint8_t *)table->data + (uint64_t)batch->tokens[t] * table->row_bytes;
        float *out = x + (uint64_t)t * width;
        em_err err;
        if (table->type == EM_TYPE_F32)
            memcpy(out, row, width * sizeof(float));
        else if ((err = em_dequantize(table->type, row, out, width)))
            return em_err_prefix(err, "embedding row %d", batch->tokens[t]);
        if (e->scale != 1.0f)
            for (uint64_t i = 0; i < width; i++) out[i] *= e->scale;
    }
    return NULL;
}

/* Logits for the rows that want them: norm, output matrix, optional softcap; their count in *rows. */
static em_err output(cpu_backend *b, const em_batch *batch, const em_program_output *o, const float *x, float *logits,
                     uint32_t *rows) {
    const uint32_t width = o->norm.width, n = batch->n_tokens;
    *rows = 0;
    /* The hidden states asked for are the normed rows the output head would read. */
    for (uint32_t t = 0, row = 0; batch->hidden && t < n; t++)
        if (batch->hidden[t])
            em_cpu_rmsnorm(batch->hidden_out + (uint64_t)row++ * width, x + (uint64_t)t * width, o->norm.weight, width,
                           o->norm.eps, o->norm.plus_one);
    for (uint32_t t = 0; t < n; t++) {
        const bool want = batch->logits ? batch->logits[t] : t == n - 1;
        if (!want) continue;
        em_cpu_rmsnorm(b->logits_in + (uint64_t)*rows * width, x + (uint64_t)t * width, o->norm.weight, width,
                       o->norm.eps, o->norm.plus_one);
        (*rows)++;
    }
    if (*rows == 0) return NULL;
    const uint64_t n_vocab = o->weight->rows;
    em_err err = matmul(b, o->weight, 0, b->logits_in, width, logits, n_vocab, *rows);
    if (err) return err;
    if (o->softcap > 0.0f)
        for (uint64_t i = 0; i < (uint64_t)*rows * n_vocab; i++) logits[i] = o->softcap * tanhf(logits[i] / o->softcap);
    return NULL;
}

/* The products of ops[0..count), consecutive matmuls that read one buffer, as one call of matmuls. */
static em_err matmul_group(cpu_backend *b, const em_program_op *ops, uint32_t count, uint32_t n) {
    matmul_out outs[3];
    for (uint32_t i = 0; i < count; i++)
        outs[i] = (matmul_out){ops[i].u.matmul.weight, ops[i].u.matmul.mat, b->rows[ops[i].dst],
                               ops[i].u.matmul.weight->rows};
    em_err err = matmuls(b, b->rows[ops[0].src], ops[0].u.matmul.weight->cols, n, outs, count);
    if (err) return err;
    for (uint32_t i = 0; i < count; i++)
        add_bias(b->rows[ops[i].dst], ops[i].u.matmul.bias, n, (uint32_t)ops[i].u.matmul.weight->rows);
    return NULL;
}

/* How many matmuls from ops[0] read the same buffer, write others, and can run as one group. */
static uint32_t matmul_run(const em_program_op *ops, uint32_t left) {
    uint32_t count = 1;
    while (count < left && count < 3 && ops[count].kind == EM_PROGRAM_MATMUL && ops[count].src == ops[0].src &&
           ops[count].u.matmul.weight->cols == ops[0].u.matmul.weight->cols) {
        bool reads_written = false;
        for (uint32_t i = 0; i <= count; i++) reads_written |= ops[i].dst == ops[0].src;
        if (reads_written) break;
        count++;
    }
    return ops[0].dst == ops[0].src ? 1 : count;
}

/* One operation of the program on the batch (a matmul alone; run_program groups them). */
static em_err run_op(cpu_backend *b, const em_batch *batch, const em_program_op *op, float *logits, uint32_t *rows) {
    const uint32_t n = batch->n_tokens;
    float *dst = b->rows[op->dst];
    const float *src = b->rows[op->src];
    switch (op->kind) {
    case EM_PROGRAM_EMBED:
        return embed(b, batch, &op->u.embed, dst);
    case EM_PROGRAM_NORM:
        norm_rows(dst, src, &op->u.norm, n);
        return NULL;
    case EM_PROGRAM_MATMUL:
        return matmul_group(b, op, 1, n);
    case EM_PROGRAM_HEAD_NORM:
    case EM_PROGRAM_ROPE:
        heads(b, batch, op, dst);
        return NULL;
    case EM_PROGRAM_KV_WRITE:
        kv_write(b, batch, op->cache, src, b->rows[op->src2]);
        return NULL;
    case EM_PROGRAM_ATTENTION: {
        const em_cpu_attention job = {
            .op = &op->u.attention, .batch = batch, .q = src, .out = dst,
            .keys = b->keys + b->cache_key_offset[op->cache], .values = b->values + b->cache_value_offset[op->cache],
            .block_tokens = b->base.block_tokens, .scores = b->scores, .scores_per_thread = b->scores_per_thread,
            .cap_positions = b->cap_positions};
        em_cpu_attention_run(&b->pool, &job);
        return NULL;
    }
    case EM_PROGRAM_GLU:
        glu(b, op->u.glu.act, op->u.glu.limit, op->u.glu.alpha, dst, src, (uint64_t)n * op->u.glu.width);
        return NULL;
    case EM_PROGRAM_ADD:
        for (uint64_t i = 0; i < (uint64_t)n * op->u.add_width; i++) dst[i] += src[i];
        return NULL;
    case EM_PROGRAM_SCALE:
        for (uint64_t i = 0; i < (uint64_t)n * op->u.scale.width; i++) dst[i] *= op->u.scale.factor;
        return NULL;
    case EM_PROGRAM_SLICE: {
        const em_program_slice *s = &op->u.slice;
        for (uint64_t t = 0; t < n; t++)
            memcpy(dst + t * s->width, src + t * s->src_width + s->offset, s->width * sizeof(float));
        return NULL;
    }
    case EM_PROGRAM_ROUTE: {
        const em_program_route *r = &op->u.route;
        choices *c = &b->choices[op->dst];
        c->n_used = r->n_used;
        for (uint32_t t = 0; t < n; t++)
            route(r, b->rows[op->src] + (uint64_t)t * r->n_expert, c->expert + (uint64_t)t * r->n_used,
                  c->weight + (uint64_t)t * r->n_used);
        return NULL;
    }
    case EM_PROGRAM_EXPERTS:
        return experts(b, &op->u.experts, src, &b->choices[op->src2], dst, n);
    case EM_PROGRAM_OUTPUT:
        return output(b, batch, &op->u.output, src, logits, rows);
    case EM_PROGRAM_SPLIT_GATE: {
        const em_program_split_gate *g = &op->u.split_gate;
        const uint64_t hd = g->head_dim, width = (uint64_t)g->n_head * hd;
        for (uint64_t t = 0; t < n; t++)
            for (uint64_t h = 0; h < g->n_head; h++) {
                memcpy(dst + t * width + h * hd, src + t * 2 * width + 2 * h * hd, hd * sizeof(float));
                memcpy(b->rows[g->gate] + t * width + h * hd, src + t * 2 * width + (2 * h + 1) * hd, hd * sizeof(float));
            }
        return NULL;
    }
    case EM_PROGRAM_SIGMOID_GATE: {
        const em_program_sigmoid_gate *g = &op->u.sigmoid_gate;
        for (uint64_t i = 0; i < (uint64_t)n * g->width; i++) dst[i] /= 1.0f + em_expf(-src[g->per_token ? i / g->width : i]);
        return NULL;
    }
    case EM_PROGRAM_DELTA_NET: {
        const em_program_delta_net *d = &op->u.delta_net;
        const em_cpu_delta_net job = {
            .op = d, .batch = batch, .mixed = src, .beta = b->rows[d->beta], .alpha = b->rows[d->alpha], .out = dst,
            .states = b->states, .slot_floats = b->state_floats, .offset = em_program_state_offset(b->program, d->state),
            .conv_out = b->conv_out, .gates = b->gates, .scratch = b->delta_scratch};
        em_cpu_delta_net_run(&b->pool, &job);
        return NULL;
    }
    case EM_PROGRAM_GATED_NORM:
        em_cpu_gated_norm(&op->u.heads, dst, src, n);
        return NULL;
    default:
        return em_errorf(EM_ERR_INTERNAL, "cpu: program operation of kind %d", (int)op->kind);
    }
}

/* The program on the batch; the logits rows into `logits`, their count in *rows. */
static em_err run_program(cpu_backend *b, const em_batch *batch, float *logits, uint32_t *rows) {
    const em_program *p = b->program;
    for (uint32_t i = 0; i < p->n_ops;) {
        const em_program_op *op = &p->ops[i];
        uint32_t count = 1;
        em_err err;
        if (op->kind == EM_PROGRAM_MATMUL) {
            count = matmul_run(op, p->n_ops - i);
            err = matmul_group(b, op, count, batch->n_tokens);
        } else {
            err = run_op(b, batch, op, logits, rows);
        }
        if (err) {
            char what[160];
            em_program_describe_op(p, i, what, sizeof what);
            return em_err_prefix(err, "%s", what);
        }
        i += count;
    }
    return NULL;
}

/* ---- scratch ---- */

static em_err reserve(cpu_backend *b, uint32_t n) {
    if (n <= b->cap_tokens) return NULL;
    const em_program *p = b->program;
    /* A few-token MoE step (experts_few) keeps in act its activations: n rows per format, a copy per
     * slot, the down inputs. */
    const uint64_t few_act_rows = (EM_CPU_FEW_TOKENS - 1) * (3 + 3 * (uint64_t)b->max_expert_used);
    for (uint32_t i = 0; i < p->n_buffers; i++) {
        const uint64_t values = (uint64_t)p->buffers[i].width * n;
        if (p->buffers[i].kind == EM_PROGRAM_CHOICES) {
            free(b->choices[i].expert);
            free(b->choices[i].weight);
            b->choices[i].expert = malloc((values ? values : 1) * sizeof(int32_t));
            b->choices[i].weight = malloc((values ? values : 1) * sizeof(float));
            if (!b->choices[i].expert || !b->choices[i].weight) goto nomem;
        } else {
            free(b->rows[i]);
            if (!(b->rows[i] = malloc((values ? values : 1) * sizeof(float)))) goto nomem;
        }
    }
    free(b->logits_in);
    free(b->rope_angles);
    free(b->act);
    free(b->act_groups);
    b->logits_in = malloc((uint64_t)b->max_embd * n * sizeof(float));
    b->rope_angles = malloc((uint64_t)b->max_rot * n * sizeof(float));
    b->act = malloc(b->act_per_token * (n > few_act_rows ? n : few_act_rows));
    b->act_groups = b->packs_groups ? malloc(b->act_per_token * em_cpu_group_scratch_tokens(n)) : NULL;
    if (!b->logits_in || !b->rope_angles || !b->act || (b->packs_groups && !b->act_groups)) goto nomem;
    if (b->max_conv_dim) {
        free(b->conv_out);
        free(b->gates);
        b->conv_out = malloc((uint64_t)b->max_conv_dim * n * sizeof(float));
        b->gates = malloc(2 * (uint64_t)b->max_head_v * n * sizeof(float));
        if (!b->conv_out || !b->gates) goto nomem;
    }
    em_err err;
    if (b->max_expert_used &&
        (err = em_cpu_expert_scratch_reserve(&b->experts, b->pool.n_threads, n, b->max_expert_used, b->max_expert,
                                             b->max_embd, b->max_ff, b->act_per_token, b->packs_groups)))
        return err;
    b->cap_tokens = n;
    return NULL;
nomem:
    return em_errorf(EM_ERR_NOMEM, "out of memory for scratch of %u tokens", n);
}

/* Attention scores need one float per visible position and one for a sink's logit, per query head of
 * a KV head's group (the widest group of any attention), per token of a tile, per thread. */
static em_err reserve_positions(cpu_backend *b, const em_batch *batch) {
    uint32_t longest = 0;
    for (uint32_t t = 0; t < batch->n_tokens; t++)
        if (batch->pos[t] + 2 > longest) longest = batch->pos[t] + 2;
    if (longest <= b->cap_positions) return NULL;
    const uint32_t widest = em_program_widest_group(b->program);
    free(b->scores);
    b->scores = malloc((uint64_t)b->pool.n_threads * EM_CPU_ATTN_TILE * widest * longest * sizeof(float));
    b->cap_positions = b->scores ? longest : 0;
    b->scores_per_thread = (uint64_t)EM_CPU_ATTN_TILE * widest * b->cap_positions;
    return b->scores ? NULL : em_errorf(EM_ERR_NOMEM, "out of memory for attention over %u positions", longest);
}

/* Room for `rows` logits rows and the pick rule's scratch (grown, never shrunk). */
static em_err reserve_pick(cpu_backend *b, uint32_t rows) {
    if (rows <= b->cap_pick_rows) return NULL;
    free(b->pick_logits);
    b->pick_logits = malloc((uint64_t)rows * b->n_vocab * sizeof *b->pick_logits);
    if (!b->pick_keys) b->pick_keys = malloc(2 * (uint64_t)b->n_vocab * sizeof *b->pick_keys);
    b->cap_pick_rows = b->pick_logits && b->pick_keys ? rows : 0;
    return b->cap_pick_rows ? NULL : em_errorf(EM_ERR_NOMEM, "out of memory for %u logits rows to pick from", rows);
}

/* The pick rule on `rows` logits rows, each masked first where `masks` gives it a mask. */
static void pick_rows(cpu_backend *b, float *logits, uint32_t rows, const uint32_t *const *masks,
                      const em_pick_params *pick, int32_t *picked) {
    const uint32_t n_vocab = b->n_vocab;
    for (uint32_t r = 0; r < rows; r++) {
        float *row = logits + (uint64_t)r * n_vocab;
        if (masks && masks[r]) em_pick_mask(row, n_vocab, masks[r]);
        picked[r] = em_pick(row, n_vocab, &pick[r], b->pick_keys);
    }
}

/* A batch of a model with recurrent state: every sequence names a slot, and each of its tokens comes
 * at position 0 or right after the last position the slot has seen (backend.h). Checked before any
 * work; `commit` then records the positions the slots reach. */
static em_err check_states(cpu_backend *b, const em_batch *batch, bool commit) {
    if (!b->state_floats) return NULL;
    for (uint32_t s = 0; s < batch->n_seqs; s++)
        if (batch->seqs[s].state >= b->base.n_state_slots)
            return em_errorf(EM_ERR_RANGE, "batch sequence %u: state slot %u, but the backend has %u", s,
                             batch->seqs[s].state, b->base.n_state_slots);
    uint32_t *reached = malloc(batch->n_seqs * sizeof *reached);
    if (!reached) return em_errorf(EM_ERR_NOMEM, "out of memory checking a batch's states");
    for (uint32_t s = 0; s < batch->n_seqs; s++) reached[s] = b->state_pos[batch->seqs[s].state];
    em_err err = NULL;
    for (uint32_t t = 0; t < batch->n_tokens && !err; t++) {
        const uint32_t s = batch->seq[t], pos = batch->pos[t];
        if (pos != 0 && pos != reached[s])
            err = em_errorf(EM_ERR_INVALID, "batch token %u: position %u, but the recurrent state of sequence %u (slot %u) "
                            "is at %u (a state continues or starts at 0)", t, pos, s, batch->seqs[s].state, reached[s]);
        reached[s] = pos + 1;
    }
    for (uint32_t s = 0; s < batch->n_seqs && !err; s++)
        for (uint32_t o = s + 1; o < batch->n_seqs; o++)
            if (batch->seqs[o].state == batch->seqs[s].state)
                err = em_errorf(EM_ERR_INVALID, "batch sequences %u and %u share state slot %u", s, o, batch->seqs[s].state);
    if (!err && commit)
        for (uint32_t s = 0; s < batch->n_seqs; s++) b->state_pos[batch->seqs[s].state] = reached[s];
    free(reached);
    return err;
}

/* The forward pass; with `pick`, the logits rows go to scratch and only the picked tokens leave. */
static em_err forward(cpu_backend *b, const em_batch *batch, float *logits, const em_pick_params *pick,
                      int32_t *picked) {
    em_err err = em_batch_validate(batch, pick ? (const void *)picked : logits, b->n_vocab, &b->base);
    if (err) return err;
    if ((err = check_states(b, batch, false))) return err;
    if (pick) {
        if ((err = reserve_pick(b, em_batch_logits_rows(batch)))) return err;
        logits = b->pick_logits;
    }
    if ((err = reserve(b, batch->n_tokens))) return err;
    if ((err = reserve_positions(b, batch))) return err;
    uint32_t rows = 0;
    b->angles_valid = false; /* new positions */
    check_states(b, batch, true); /* checked above: cannot fail */
    if ((err = run_program(b, batch, logits, &rows))) return err;
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
    for (uint32_t i = 0; i < b->program->n_caches; i++) {
        const uint64_t nk = b->program->caches[i].key_width, nv = b->program->caches[i].value_width;
        float *keys = b->keys + b->cache_key_offset[i], *values = b->values + b->cache_value_offset[i];
        memmove(keys + (uint64_t)to * base->block_tokens * nk, keys + (uint64_t)from * base->block_tokens * nk,
                rows * nk * sizeof(float));
        memmove(values + (uint64_t)to * base->block_tokens * nv, values + (uint64_t)from * base->block_tokens * nv,
                rows * nv * sizeof(float));
    }
    return NULL;
}

static em_err cpu_copy_state(em_backend *base, uint32_t from, uint32_t to) {
    cpu_backend *b = (cpu_backend *)base;
    if (from >= base->n_state_slots || to >= base->n_state_slots)
        return em_errorf(EM_ERR_RANGE, "copy of state slot %u to slot %u (the backend has %u)", from, to,
                         base->n_state_slots);
    if (from != to)
        memcpy(b->states + to * b->state_floats, b->states + from * b->state_floats, b->state_floats * sizeof(float));
    b->state_pos[to] = b->state_pos[from];
    return NULL;
}

/* One block's rows to the host and back (backend.h, kv_save / kv_load): for each cache of the
 * program, the keys of the rows then their values, f32, as the pool keeps them. */
static em_err cpu_kv_move(cpu_backend *b, uint32_t block, uint32_t rows, float *host, bool save) {
    if (block >= b->base.n_blocks || rows == 0 || rows > b->base.block_tokens)
        return em_errorf(EM_ERR_RANGE, "cpu backend: %s of %u rows of block %u (pool of %u blocks of %u)",
                         save ? "save" : "load", rows, block, b->base.n_blocks, b->base.block_tokens);
    for (uint32_t i = 0; i < b->program->n_caches; i++) {
        const uint64_t widths[2] = {b->program->caches[i].key_width, b->program->caches[i].value_width};
        float *regions[2] = {b->keys + b->cache_key_offset[i], b->values + b->cache_value_offset[i]};
        for (int kv = 0; kv < 2; kv++) {
            float *pool = regions[kv] + (uint64_t)block * b->base.block_tokens * widths[kv];
            const uint64_t floats = rows * widths[kv];
            if (save) memcpy(host, pool, floats * sizeof(float));
            else memcpy(pool, host, floats * sizeof(float));
            host += floats;
        }
    }
    return NULL;
}

static em_err cpu_kv_save(em_backend *base, uint32_t block, uint32_t rows, void *host) {
    return cpu_kv_move((cpu_backend *)base, block, rows, host, true);
}

static em_err cpu_kv_load(em_backend *base, uint32_t block, uint32_t rows, const void *host) {
    return cpu_kv_move((cpu_backend *)base, block, rows, (float *)host, false);
}

static void cpu_free(em_backend *base) {
    cpu_backend *b = (cpu_backend *)base;
    em_cpu_pool_destroy(&b->pool);
    float *bufs[] = {b->keys, b->values, b->logits_in, b->scores, b->rope_angles, b->slot_weight, b->slot_gate,
                     b->slot_up, b->slot_out, b->states, b->conv_out, b->gates, b->delta_scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    for (uint32_t i = 0; i < EM_PROGRAM_MAX_BUFFERS; i++) {
        free(b->rows[i]);
        free(b->choices[i].expert);
        free(b->choices[i].weight);
    }
    em_cpu_expert_scratch_free(&b->experts);
    free(b->act);
    free(b->act_groups);
    free(b->products);
    free(b->slot_token);
    free(b->slot_expert);
    free(b->pick_logits);
    free(b->pick_keys);
    free(b->overlap_tokens);
    free(b->overlap_picked[0]);
    free(b->overlap_picked[1]);
    free(b->late_pick);
    free(b->cache_key_offset);
    free(b->cache_value_offset);
    free(b->state_pos);
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

#define CPU_KV_FORMAT "cpu: f32 rows, each cache's keys then its values"
static const em_backend_ops cpu_ops = {
    .name = "cpu", .forward = cpu_forward, .forward_pick = cpu_forward_pick, .copy_rows = cpu_copy_rows,
    .free = cpu_free, .picks_masked = true, .copy_state = cpu_copy_state, .kv_save = cpu_kv_save,
    .kv_load = cpu_kv_load, .kv_format = CPU_KV_FORMAT, .hidden_rows = true};
static const em_backend_ops cpu_overlap_ops = {
    .name = "cpu", .forward = cpu_forward, .forward_pick = cpu_forward_pick, .copy_rows = cpu_copy_rows,
    .free = cpu_free, .pick_begin = cpu_pick_begin, .pick_end = cpu_pick_end, .picks_masked = true,
    .pick_masks = cpu_pick_masks, .copy_state = cpu_copy_state, .kv_save = cpu_kv_save, .kv_load = cpu_kv_load,
    .kv_format = CPU_KV_FORMAT, .hidden_rows = true};

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

static void act_max(cpu_backend *b, const em_weight *w) {
    if (!w->data) return;
    b->act_per_token = max_u64(b->act_per_token, em_cpu_act_bytes(w));
    if (em_dot_group_kernel(w->type) || em_cpu_amx(w->type, w->cols, EM_CPU_AMX_FROM)) b->packs_groups = true;
}

uint64_t em_backend_kv_bytes_per_token(const em_model *model) {
    return em_program_kv_floats(&model->program) * sizeof(float);
}

void em_batch_fixed_tables(em_batch_seq *seqs, uint32_t *blocks, uint32_t n, uint32_t per_seq) {
    for (uint32_t i = 0; i < n * per_seq; i++) blocks[i] = i;
    for (uint32_t s = 0; s < n; s++) seqs[s] = (em_batch_seq){blocks + (uint64_t)s * per_seq, per_seq, s};
}

/* The widest rows and most experts the program's operations take, and the activation bytes of its
 * products. */
static void measure_program(cpu_backend *b) {
    const em_program *p = b->program;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const em_program_op *op = &p->ops[i];
        if (op->kind == EM_PROGRAM_MATMUL) act_max(b, op->u.matmul.weight);
        if (op->kind == EM_PROGRAM_OUTPUT) {
            act_max(b, op->u.output.weight);
            b->max_embd = (uint32_t)max_u64(b->max_embd, op->u.output.norm.width);
        }
        if (op->kind == EM_PROGRAM_ROUTE) {
            b->max_expert = (uint32_t)max_u64(b->max_expert, op->u.route.n_expert);
            b->max_expert_used = (uint32_t)max_u64(b->max_expert_used, op->u.route.n_used);
        }
        if (op->kind == EM_PROGRAM_EXPERTS) {
            const em_program_experts *x = &op->u.experts;
            act_max(b, x->gate);
            act_max(b, x->up);
            act_max(b, x->down);
            b->max_ff = (uint32_t)max_u64(b->max_ff, x->gate->rows);
            b->max_embd = (uint32_t)max_u64(b->max_embd, max_u64(x->gate->cols, x->down->rows));
        }
        if (op->kind == EM_PROGRAM_DELTA_NET) {
            const em_program_delta_net *d = &op->u.delta_net;
            b->max_conv_dim = (uint32_t)max_u64(b->max_conv_dim, 2 * d->n_head_k * d->head_dim_k + d->n_head_v * d->head_dim_v);
            b->max_head_v = (uint32_t)max_u64(b->max_head_v, d->n_head_v);
            b->max_head_dim_v = (uint32_t)max_u64(b->max_head_dim_v, d->head_dim_v);
        }
    }
}

em_err em_backend_cpu_new(const em_model *model, const em_backend_config *config, em_backend **out) {
    *out = NULL;
    const em_program *p = &model->program;
    em_backend_config o = config ? *config : (em_backend_config){0};
    if (!o.block_tokens) o.block_tokens = 16;
    if (!o.n_threads) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        o.n_threads = cores > 0 ? (uint32_t)cores : 1;
    }
    if (!p->n_ops) return em_errorf(EM_ERR_INVALID, "cpu backend: the model has no layer program");
    uint64_t per_token = em_backend_kv_bytes_per_token(model);
    uint64_t tokens = o.kv_bytes ? o.kv_bytes / (per_token ? per_token : 1) : (o.kv_tokens ? o.kv_tokens : 4096);
    uint64_t n_blocks = tokens / o.block_tokens;
    if (n_blocks == 0 || n_blocks > (1u << 28) || o.block_tokens > 4096 || o.n_threads > EM_CPU_MAX_THREADS)
        return em_errorf(EM_ERR_RANGE, "cpu backend: %llu KV blocks of %u positions on %u threads is out of range",
                         (unsigned long long)n_blocks, o.block_tokens, o.n_threads);
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b) return em_errorf(EM_ERR_NOMEM, "out of memory creating the cpu backend");
    const char *overlap = getenv("EMBER_CPU_OVERLAP");
    b->base = (em_backend){overlap && !strcmp(overlap, "1") ? &cpu_overlap_ops : &cpu_ops, model, (uint32_t)n_blocks,
                           o.block_tokens, per_token, 0};
    b->program = p;
    b->n_vocab = p->n_vocab;
    em_err err = em_cpu_pool_init(&b->pool, o.n_threads);
    if (err) goto fail;

    const uint64_t rows = n_blocks * o.block_tokens;
    uint64_t key_floats = 0, value_floats = 0;
    b->cache_key_offset = calloc(p->n_caches ? p->n_caches : 1, sizeof(uint64_t));
    b->cache_value_offset = calloc(p->n_caches ? p->n_caches : 1, sizeof(uint64_t));
    if (!b->cache_key_offset || !b->cache_value_offset) goto nomem;
    for (uint32_t i = 0; i < p->n_caches; i++) {
        b->cache_key_offset[i] = key_floats;
        b->cache_value_offset[i] = value_floats;
        key_floats += rows * p->caches[i].key_width;
        value_floats += rows * p->caches[i].value_width;
    }
    measure_program(b);
    b->state_floats = em_program_state_floats(p);
    if (b->state_floats) {
        b->base.n_state_slots = o.state_slots ? o.state_slots : 16;
        b->states = calloc((uint64_t)b->base.n_state_slots * b->state_floats, sizeof(float));
        b->state_pos = calloc(b->base.n_state_slots, sizeof *b->state_pos);
        b->delta_scratch = malloc((uint64_t)b->pool.n_threads * b->max_head_dim_v * sizeof(float));
        if (!b->states || !b->state_pos || !b->delta_scratch) {
            err = em_errorf(EM_ERR_NOMEM, "out of memory for %u recurrent states of %llu floats", b->base.n_state_slots,
                            (unsigned long long)b->state_floats);
            goto fail;
        }
    }
    /* calloc: pages are only touched when rows are written, so a large budget costs nothing up front. */
    b->keys = calloc(key_floats ? key_floats : 1, sizeof(float));
    b->values = calloc(value_floats ? value_floats : 1, sizeof(float));
    b->max_rot = 2;
    for (uint32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == EM_PROGRAM_ROPE && p->ops[i].u.heads.rope->n_rot > b->max_rot)
            b->max_rot = p->ops[i].u.heads.rope->n_rot;
    /* matmuls takes up to three products (Q, K, V), experts_few two per chosen expert of each token. */
    const uint32_t slots = (EM_CPU_FEW_TOKENS - 1) * b->max_expert_used, slot_rows = slots ? slots : 1;
    b->max_products = 2 * slots > 3 ? 2 * slots : 3;
    b->products = malloc(b->max_products * sizeof *b->products);
    b->slot_token = malloc(slot_rows * sizeof *b->slot_token);
    b->slot_expert = malloc(slot_rows * sizeof *b->slot_expert);
    b->slot_weight = malloc(slot_rows * sizeof *b->slot_weight);
    b->slot_gate = malloc((uint64_t)slot_rows * (b->max_ff ? b->max_ff : 1) * sizeof(float));
    b->slot_up = malloc((uint64_t)slot_rows * (b->max_ff ? b->max_ff : 1) * sizeof(float));
    b->slot_out = malloc((uint64_t)slot_rows * (b->max_embd ? b->max_embd : 1) * sizeof(float));
    if (!b->keys || !b->values || !b->products || !b->slot_token || !b->slot_expert ||
        !b->slot_weight || !b->slot_gate || !b->slot_up || !b->slot_out)
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
