/* The layer program of a loaded model (program.h), built from its description and weights: the one
 * definition of a forward step that every backend executes. A block reads as the math it computes:
 *
 *   x += [post_norm](mixer(norm(x)))      mixer: attention (its output gated by σ(gate) where the
 *                                         query projection gives gates), or Gated DeltaNet
 *   x += [post_norm](ffn(norm(x)))        ffn: a gated unit, or routed experts (+ a shared expert,
 *                                         scaled by σ(w_sᵀ norm(x)) where the model gates it)
 *
 * Every family's traits end here as operations and their parameters (QK-norm, biases, windows, sinks,
 * soft-caps, post-norms, routing, biased experts); the backends read the program, not the family. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model.h"

/* The buffers of a step, declared with the widest row any layer gives them. */
typedef struct step_buffers {
    uint8_t x, xn, q, k, v, attn, out, gate, up, router, choices, shared;
    uint8_t shared_gate; /* models whose shared expert has a gate of its own */
    /* hybrid models only: gated attention's [q | gate] and gates; DeltaNet's inputs and output */
    uint8_t qgate, attn_gate, mixed, z, beta, alpha, delta;
    /* per-layer inputs only: every layer's inputs, the projection they start from, one layer's slice
     * and its gate */
    uint8_t per_layer, per_layer_proj, per_layer_slice, per_layer_gate;
} step_buffers;

typedef struct builder {
    const em_model *m;
    em_program *p;
    step_buffers buf;
    uint32_t layer;
    uint32_t *cache_of; /* each layer's KV cache, once its owner declared it */
} builder;

static em_err emit(builder *b, em_program_op op) {
    op.layer = b->layer;
    return em_program_append(b->p, &op);
}

static em_program_norm norm_of(const em_model_desc *d, const float *weight, uint32_t width) {
    return (em_program_norm){.weight = weight, .width = width, .eps = d->norm_eps,
                             .plus_one = d->norm == EM_NORM_RMS_PLUS_ONE};
}

static em_err emit_norm(builder *b, uint8_t dst, uint8_t src, const float *weight) {
    const em_model_desc *d = &b->m->desc;
    return emit(b, (em_program_op){.kind = EM_PROGRAM_NORM, .dst = dst, .src = src,
                                   .u.norm = norm_of(d, weight, d->n_embd)});
}

static em_err emit_matmul(builder *b, uint8_t dst, uint8_t src, const em_weight *w, const float *bias) {
    return emit(b, (em_program_op){.kind = EM_PROGRAM_MATMUL, .dst = dst, .src = src,
                                   .u.matmul = {.weight = w, .bias = bias}});
}

static em_err emit_add(builder *b, uint8_t dst, uint8_t src) {
    return emit(b, (em_program_op){.kind = EM_PROGRAM_ADD, .dst = dst, .src = src, .u.add_width = b->m->desc.n_embd});
}

/* QK-norm (where the layer has its weights) and RoPE of each head of q or k. */
static em_err emit_heads(builder *b, uint8_t buffer, uint32_t n_head, const float *norm) {
    const em_layer_desc *ld = &b->m->desc.layers[b->layer];
    em_err err;
    if (norm) {
        const em_program_heads heads = {.n_head = n_head, .head_dim = ld->head_dim,
                                        .norm = norm_of(&b->m->desc, norm, ld->head_dim)};
        if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_HEAD_NORM, .dst = buffer, .u.heads = heads}))) return err;
    }
    if (!ld->rope.n_rot) return NULL;
    const em_program_heads heads = {.n_head = n_head, .head_dim = ld->head_dim, .rope = &ld->rope};
    return emit(b, (em_program_op){.kind = EM_PROGRAM_ROPE, .dst = buffer, .u.heads = heads});
}

/* A normalized V: each head of v RMS-normalized without a weight. */
static em_err emit_value_norm(builder *b) {
    const em_layer_desc *ld = &b->m->desc.layers[b->layer];
    if (!ld->value_norm) return NULL;
    const em_program_heads heads = {.n_head = ld->n_head_kv, .head_dim = ld->head_dim_v,
                                    .norm = norm_of(&b->m->desc, NULL, ld->head_dim_v)};
    return emit(b, (em_program_op){.kind = EM_PROGRAM_HEAD_NORM, .dst = b->buf.v, .u.heads = heads});
}

/* out = W_o attention(q, k, v of xn), with this layer's cache, or with the cache of the earlier
 * layer it shares KV with (then it computes queries alone). */
static em_err emit_attention(builder *b) {
    const em_layer_desc *ld = &b->m->desc.layers[b->layer];
    const em_layer_weights *lw = &b->m->w.layers[b->layer];
    const step_buffers *s = &b->buf;
    em_err err = NULL;
    if (ld->kv_layer == b->layer)
        err = em_program_cache_declare(b->p, b->layer, ld->n_head_kv * ld->head_dim, ld->n_head_kv * ld->head_dim_v,
                                       &b->cache_of[b->layer]);
    if (err) return err;
    const uint32_t cache = b->cache_of[ld->kv_layer];
    if (ld->attn_output_gate) {
        const em_program_split_gate split = {.n_head = ld->n_head, .head_dim = ld->head_dim, .gate = s->attn_gate};
        if ((err = emit_matmul(b, s->qgate, s->xn, &lw->wq, lw->bq))) return err;
        if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_SPLIT_GATE, .dst = s->q, .src = s->qgate,
                                           .u.split_gate = split})))
            return err;
    } else if ((err = emit_matmul(b, s->q, s->xn, &lw->wq, lw->bq))) {
        return err;
    }
    if (ld->kv_layer != b->layer) {
        if ((err = emit_heads(b, s->q, ld->n_head, lw->q_norm))) return err;
    } else {
        /* q, k, v products first: one input, read once */
        if ((err = emit_matmul(b, s->k, s->xn, &lw->wk, lw->bk))) return err;
        if ((err = emit_matmul(b, s->v, s->xn, ld->values_from_keys ? &lw->wk : &lw->wv,
                               ld->values_from_keys ? lw->bk : lw->bv)))
            return err;
        if ((err = emit_heads(b, s->q, ld->n_head, lw->q_norm))) return err;
        if ((err = emit_heads(b, s->k, ld->n_head_kv, lw->k_norm))) return err;
        if ((err = emit_value_norm(b))) return err;
        if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_KV_WRITE, .src = s->k, .src2 = s->v, .cache = cache})))
            return err;
    }
    const em_program_attention attention = {
        .n_head = ld->n_head, .n_head_kv = ld->n_head_kv, .head_dim = ld->head_dim, .head_dim_v = ld->head_dim_v,
        .window = ld->attn == EM_ATTN_SLIDING ? ld->window : 0, .scale = ld->attn_scale, .softcap = ld->attn_softcap,
        .sinks = lw->attn_sinks};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_ATTENTION, .dst = s->attn, .src = s->q, .cache = cache,
                                       .u.attention = attention})))
        return err;
    if (ld->attn_output_gate &&
        (err = emit(b, (em_program_op){.kind = EM_PROGRAM_SIGMOID_GATE, .dst = s->attn, .src = s->attn_gate,
                                       .u.sigmoid_gate = {.width = ld->n_head * ld->head_dim_v}})))
        return err;
    return emit_matmul(b, s->out, s->attn, &lw->wo, lw->bo);
}

/* out = W_out gated_norm(delta_net(W_qkv xn), W_z xn): a Gated DeltaNet layer, whose sequence state
 * (the last conv inputs and every head's matrix) is declared here. */
static em_err emit_delta_net(builder *b) {
    const em_layer_desc *ld = &b->m->desc.layers[b->layer];
    const em_layer_weights *lw = &b->m->w.layers[b->layer];
    const em_delta_net_desc *dn = &ld->delta_net;
    const step_buffers *s = &b->buf;
    const uint32_t conv_dim = 2 * dn->n_head_k * dn->head_dim_k + dn->n_head_v * dn->head_dim_v;
    uint32_t state;
    em_err err = em_program_state_declare(b->p, b->layer, (dn->conv_kernel - 1) * conv_dim,
                                          dn->n_head_v * dn->head_dim_k * dn->head_dim_v, &state);
    if (err) return err;
    if ((err = emit_matmul(b, s->mixed, s->xn, &lw->ssm_qkv, NULL))) return err;
    if ((err = emit_matmul(b, s->z, s->xn, &lw->ssm_gate, NULL))) return err;
    if ((err = emit_matmul(b, s->beta, s->xn, &lw->ssm_beta, NULL))) return err;
    if ((err = emit_matmul(b, s->alpha, s->xn, &lw->ssm_alpha, NULL))) return err;
    const em_program_delta_net delta_net = {
        .n_head_k = dn->n_head_k, .n_head_v = dn->n_head_v, .head_dim_k = dn->head_dim_k, .head_dim_v = dn->head_dim_v,
        .conv_kernel = dn->conv_kernel, .v_tiled = dn->v_tiled, .conv = lw->ssm_conv, .dt_bias = lw->ssm_dt_bias,
        .a = lw->ssm_a, .eps = b->m->desc.norm_eps, .beta = s->beta, .alpha = s->alpha, .state = state};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_DELTA_NET, .dst = s->delta, .src = s->mixed,
                                       .u.delta_net = delta_net})))
        return err;
    const em_program_heads heads = {.n_head = dn->n_head_v, .head_dim = dn->head_dim_v,
                                    .norm = norm_of(&b->m->desc, lw->ssm_norm, dn->head_dim_v)};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_GATED_NORM, .dst = s->delta, .src = s->z, .u.heads = heads})))
        return err;
    return emit_matmul(b, s->out, s->delta, &lw->ssm_out, NULL);
}

/* dst = down(act(gate xn) · up xn): a dense feed-forward unit, or a shared expert. */
static em_err emit_gated_unit(builder *b, uint8_t dst, const em_weight *gate, const em_weight *up,
                              const em_weight *down) {
    const step_buffers *s = &b->buf;
    em_err err;
    if ((err = emit_matmul(b, s->gate, s->xn, gate, NULL))) return err;
    if ((err = emit_matmul(b, s->up, s->xn, up, NULL))) return err;
    const em_model_desc *d = &b->m->desc;
    const em_program_glu glu = {.act = d->act, .width = (uint32_t)gate->rows, .limit = d->act_limit,
                                .alpha = d->act_alpha};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_GLU, .dst = s->gate, .src = s->up, .u.glu = glu})))
        return err;
    return emit_matmul(b, dst, s->gate, down, NULL);
}

/* out = the chosen experts' gated units, weighted (+ the shared expert's). */
static em_err emit_experts(builder *b) {
    const em_layer_desc *ld = &b->m->desc.layers[b->layer];
    const em_layer_weights *lw = &b->m->w.layers[b->layer];
    const step_buffers *s = &b->buf;
    em_err err;
    if ((err = emit_matmul(b, s->router, s->xn, &lw->gate_inp, lw->gate_inp_bias))) return err;
    const em_program_route route = {.n_expert = ld->n_expert, .n_used = ld->n_expert_used, .gating = ld->gating,
                                    .renormalize = ld->renormalize, .scale = ld->expert_weights_scale};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_ROUTE, .dst = s->choices, .src = s->router,
                                       .u.route = route})))
        return err;
    const em_model_desc *d = &b->m->desc;
    const em_program_experts experts = {
        .gate = &lw->gate_exps, .up = &lw->up_exps, .down = &lw->down_exps, .gate_bias = lw->gate_exps_bias,
        .up_bias = lw->up_exps_bias, .down_bias = lw->down_exps_bias, .act = d->act, .limit = d->act_limit,
        .alpha = d->act_alpha};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_EXPERTS, .dst = s->out, .src = s->xn, .src2 = s->choices,
                                       .u.experts = experts})))
        return err;
    if (!ld->n_ff_shared) return NULL;
    if ((err = emit_gated_unit(b, s->shared, &lw->gate_shexp, &lw->up_shexp, &lw->down_shexp))) return err;
    if (lw->gate_inp_shexp.data) { /* shared ⊙= σ(w_sᵀ xn) */
        if ((err = emit_matmul(b, s->shared_gate, s->xn, &lw->gate_inp_shexp, NULL))) return err;
        if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_SIGMOID_GATE, .dst = s->shared, .src = s->shared_gate,
                                           .u.sigmoid_gate = {.width = d->n_embd, .per_token = true}})))
            return err;
    }
    return emit_add(b, s->out, s->shared);
}

/* out = post(post_1(unit(norm(x))) + post_2(experts(norm_2(x)))), the experts routed on their own norm
 * of x: a dense gated unit and the experts side by side (Gemma 4's MoE layers). */
static em_err emit_experts_beside_dense(builder *b) {
    const em_layer_desc *ld = &b->m->desc.layers[b->layer];
    const em_layer_weights *lw = &b->m->w.layers[b->layer];
    const step_buffers *s = &b->buf;
    const em_model_desc *d = &b->m->desc;
    em_err err;
    if ((err = emit_norm(b, s->xn, s->x, lw->ffn_norm))) return err;
    if ((err = emit_gated_unit(b, s->out, &lw->ffn_gate, &lw->ffn_up, &lw->ffn_down))) return err;
    if ((err = emit_norm(b, s->out, s->out, lw->post_ffn_norm_1))) return err;
    if ((err = emit_norm(b, s->xn, s->x, lw->router_norm))) return err;
    if ((err = emit_matmul(b, s->router, s->xn, &lw->gate_inp, NULL))) return err;
    const em_program_route route = {.n_expert = ld->n_expert, .n_used = ld->n_expert_used, .gating = ld->gating,
                                    .renormalize = ld->renormalize, .scale = ld->expert_weights_scale,
                                    .expert_scale = lw->expert_scale};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_ROUTE, .dst = s->choices, .src = s->router,
                                       .u.route = route})))
        return err;
    if ((err = emit_norm(b, s->xn, s->x, lw->pre_ffn_norm_2))) return err;
    const em_program_experts experts = {.gate = &lw->gate_exps, .up = &lw->up_exps, .down = &lw->down_exps,
                                        .act = d->act, .limit = d->act_limit, .alpha = d->act_alpha};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_EXPERTS, .dst = s->shared, .src = s->xn, .src2 = s->choices,
                                       .u.experts = experts})))
        return err;
    if ((err = emit_norm(b, s->shared, s->shared, lw->post_ffn_norm_2))) return err;
    return emit_add(b, s->out, s->shared);
}

/* x += post_norm(W_proj(act(W_gate x) · this layer's slice of the per-layer inputs)) */
static em_err emit_layer_input(builder *b) {
    const em_model_desc *d = &b->m->desc;
    const em_layer_weights *lw = &b->m->w.layers[b->layer];
    const step_buffers *s = &b->buf;
    const uint32_t width = d->n_embd_per_layer;
    em_err err;
    if ((err = emit_matmul(b, s->per_layer_gate, s->x, &lw->per_layer_gate, NULL))) return err;
    const em_program_slice slice = {.offset = b->layer * width, .width = width, .src_width = d->n_layer * width};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_SLICE, .dst = s->per_layer_slice, .src = s->per_layer,
                                       .u.slice = slice})))
        return err;
    const em_program_glu glu = {.act = d->act, .width = width, .limit = d->act_limit, .alpha = d->act_alpha};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_GLU, .dst = s->per_layer_gate, .src = s->per_layer_slice,
                                       .u.glu = glu})))
        return err;
    if ((err = emit_matmul(b, s->out, s->per_layer_gate, &lw->per_layer_proj, NULL))) return err;
    if ((err = emit_norm(b, s->out, s->out, lw->per_layer_post_norm))) return err;
    return emit_add(b, s->x, s->out);
}

/* Every layer's inputs from the token and its embedding, once a step:
 *   inputs = (table[token] · sqrt(width) + norm_per_layer(W x / sqrt(n_embd))) / sqrt(2)
 * with the norm over each layer's slice. */
static em_err emit_per_layer_inputs(builder *b) {
    const em_model *m = b->m;
    const em_model_desc *d = &m->desc;
    const step_buffers *s = &b->buf;
    const uint32_t width = d->n_embd_per_layer, all = d->n_layer * width;
    em_err err;
    const em_program_embed embed = {.table = &m->w.per_layer_embd, .scale = sqrtf((float)width)};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_EMBED, .dst = s->per_layer, .u.embed = embed}))) return err;
    if ((err = emit_matmul(b, s->per_layer_proj, s->x, &m->w.per_layer_proj, NULL))) return err;
    const em_program_scale down = {.width = all, .factor = 1.0f / sqrtf((float)d->n_embd)};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_SCALE, .dst = s->per_layer_proj, .u.scale = down}))) return err;
    const em_program_heads slices = {.n_head = d->n_layer, .head_dim = width,
                                     .norm = norm_of(d, m->w.per_layer_proj_norm, width)};
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_HEAD_NORM, .dst = s->per_layer_proj, .u.heads = slices})))
        return err;
    if ((err = emit(b, (em_program_op){.kind = EM_PROGRAM_ADD, .dst = s->per_layer, .src = s->per_layer_proj,
                                       .u.add_width = all})))
        return err;
    const em_program_scale half = {.width = all, .factor = 1.0f / sqrtf(2.0f)};
    return emit(b, (em_program_op){.kind = EM_PROGRAM_SCALE, .dst = s->per_layer, .u.scale = half});
}

static em_err emit_layer(builder *b) {
    const em_layer_desc *ld = &b->m->desc.layers[b->layer];
    const em_layer_weights *lw = &b->m->w.layers[b->layer];
    const step_buffers *s = &b->buf;
    em_err err;
    /* x += [post_norm](attention(norm(x))) */
    if ((err = emit_norm(b, s->xn, s->x, lw->attn_norm))) return err;
    if ((err = ld->mixer == EM_MIXER_DELTA_NET ? emit_delta_net(b) : emit_attention(b))) return err;
    if (lw->post_attn_norm && (err = emit_norm(b, s->out, s->out, lw->post_attn_norm))) return err;
    if ((err = emit_add(b, s->x, s->out))) return err;
    /* x += [post_norm](ffn(norm(x))) */
    if (ld->moe && ld->n_ff_dense) {
        err = emit_experts_beside_dense(b);
    } else {
        if ((err = emit_norm(b, s->xn, s->x, lw->ffn_norm))) return err;
        if (ld->moe)
            err = emit_experts(b);
        else
            err = emit_gated_unit(b, s->out, &lw->ffn_gate, &lw->ffn_up, &lw->ffn_down);
    }
    if (err) return err;
    if (lw->post_ffn_norm && (err = emit_norm(b, s->out, s->out, lw->post_ffn_norm))) return err;
    if ((err = emit_add(b, s->x, s->out))) return err;
    /* x += post_norm(proj(act(gate x) · inputs)) ; x *= the layer's factor */
    if (b->m->desc.n_embd_per_layer && (err = emit_layer_input(b))) return err;
    if (!lw->output_scale) return NULL;
    const em_program_scale scale = {.width = b->m->desc.n_embd, .factor = lw->output_scale[0]};
    return emit(b, (em_program_op){.kind = EM_PROGRAM_SCALE, .dst = s->x, .u.scale = scale});
}

/* The buffers of gated attention and Gated DeltaNet, declared only in models that have such layers. */
static em_err declare_hybrid_buffers(builder *b) {
    const em_model_desc *d = &b->m->desc;
    uint32_t qgate = 0, mixed = 0, value = 0, heads = 0;
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *ld = &d->layers[il];
        const em_delta_net_desc *dn = &ld->delta_net;
        if (ld->mixer == EM_MIXER_ATTENTION && ld->attn_output_gate && 2 * ld->n_head * ld->head_dim > qgate)
            qgate = 2 * ld->n_head * ld->head_dim;
        if (ld->mixer != EM_MIXER_DELTA_NET) continue;
        if (2 * dn->n_head_k * dn->head_dim_k + dn->n_head_v * dn->head_dim_v > mixed)
            mixed = 2 * dn->n_head_k * dn->head_dim_k + dn->n_head_v * dn->head_dim_v;
        if (dn->n_head_v * dn->head_dim_v > value) value = dn->n_head_v * dn->head_dim_v;
        if (dn->n_head_v > heads) heads = dn->n_head_v;
    }
    step_buffers *s = &b->buf;
    em_err err = NULL;
    if (qgate && ((err = em_program_buffer_declare(b->p, "qgate", EM_PROGRAM_ROWS, qgate, &s->qgate)) ||
                  (err = em_program_buffer_declare(b->p, "attn_gate", EM_PROGRAM_ROWS, qgate / 2, &s->attn_gate))))
        return err;
    const uint32_t per_layer = d->n_embd_per_layer;
    if (per_layer &&
        ((err = em_program_buffer_declare(b->p, "per_layer", EM_PROGRAM_ROWS, d->n_layer * per_layer, &s->per_layer)) ||
         (err = em_program_buffer_declare(b->p, "per_layer_proj", EM_PROGRAM_ROWS, d->n_layer * per_layer,
                                          &s->per_layer_proj)) ||
         (err = em_program_buffer_declare(b->p, "layer_slice", EM_PROGRAM_ROWS, per_layer, &s->per_layer_slice)) ||
         (err = em_program_buffer_declare(b->p, "layer_gate", EM_PROGRAM_ROWS, per_layer, &s->per_layer_gate))))
        return err;
    if (!mixed) return NULL;
    const struct {
        const char *name;
        uint8_t *index;
        uint32_t width;
    } buffers[] = {{"mixed", &s->mixed, mixed}, {"z", &s->z, value},         {"beta", &s->beta, heads},
                   {"alpha", &s->alpha, heads}, {"delta", &s->delta, value}};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0] && !err; i++)
        err = em_program_buffer_declare(b->p, buffers[i].name, EM_PROGRAM_ROWS, buffers[i].width, buffers[i].index);
    return err;
}

/* Every buffer at the widest row any layer gives it. */
static em_err declare_buffers(builder *b) {
    const em_model_desc *d = &b->m->desc;
    uint32_t q = 0, k = 0, v = 0, attn = 0, ff = 0, experts = 0, used = 0;
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *ld = &d->layers[il];
#define WIDEN(var, value) \
    do {                  \
        if ((value) > (var)) (var) = (value); \
    } while (0)
        WIDEN(q, ld->n_head * ld->head_dim);
        WIDEN(k, ld->n_head_kv * ld->head_dim);
        WIDEN(v, ld->n_head_kv * ld->head_dim_v);
        WIDEN(attn, ld->n_head * ld->head_dim_v);
        WIDEN(ff, ld->moe ? (ld->n_ff_shared > ld->n_ff_dense ? ld->n_ff_shared : ld->n_ff_dense) : ld->n_ff);
        if (ld->moe) {
            WIDEN(experts, ld->n_expert);
            WIDEN(used, ld->n_expert_used);
        }
#undef WIDEN
    }
    em_program *p = b->p;
    step_buffers *s = &b->buf;
    em_err err;
    const struct {
        const char *name;
        uint8_t *index;
        em_program_buffer_kind kind;
        uint32_t width;
    } buffers[] = {
        {"x", &s->x, EM_PROGRAM_ROWS, d->n_embd},       {"xn", &s->xn, EM_PROGRAM_ROWS, d->n_embd},
        {"q", &s->q, EM_PROGRAM_ROWS, q},               {"k", &s->k, EM_PROGRAM_ROWS, k},
        {"v", &s->v, EM_PROGRAM_ROWS, v},               {"attn", &s->attn, EM_PROGRAM_ROWS, attn},
        {"out", &s->out, EM_PROGRAM_ROWS, d->n_embd},   {"gate", &s->gate, EM_PROGRAM_ROWS, ff},
        {"up", &s->up, EM_PROGRAM_ROWS, ff},            {"router", &s->router, EM_PROGRAM_ROWS, experts},
        {"choices", &s->choices, EM_PROGRAM_CHOICES, used}, {"shared", &s->shared, EM_PROGRAM_ROWS, d->n_embd},
    };
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        if ((err = em_program_buffer_declare(p, buffers[i].name, buffers[i].kind, buffers[i].width, buffers[i].index)))
            return err;
    bool shared_gate = false;
    for (uint32_t il = 0; il < d->n_layer; il++) shared_gate |= b->m->w.layers[il].gate_inp_shexp.data != NULL;
    if (shared_gate && (err = em_program_buffer_declare(p, "shared_gate", EM_PROGRAM_ROWS, 1, &s->shared_gate)))
        return err;
    return declare_hybrid_buffers(b);
}

em_err em_model_build_program(const em_model *m, em_program *out) {
    *out = (em_program){.n_vocab = m->desc.n_vocab, .n_layer = m->desc.n_layer};
    const em_model_desc *d = &m->desc;
    builder b = {.m = m, .p = out, .layer = EM_PROGRAM_NO_LAYER, .cache_of = calloc(d->n_layer, sizeof(uint32_t))};
    em_err err = b.cache_of ? declare_buffers(&b) : em_errorf(EM_ERR_NOMEM, "out of memory building a program");
    const em_program_embed embed = {.table = &m->w.token_embd, .scale = d->embd_scale};
    if (!err) err = emit(&b, (em_program_op){.kind = EM_PROGRAM_EMBED, .dst = b.buf.x, .u.embed = embed});
    if (!err && d->n_embd_per_layer) err = emit_per_layer_inputs(&b);
    for (b.layer = 0; b.layer < d->n_layer && !err; b.layer++) err = emit_layer(&b);
    free(b.cache_of);
    b.layer = EM_PROGRAM_NO_LAYER;
    const em_program_output output = {.norm = norm_of(d, m->w.output_norm, d->n_embd), .weight = &m->w.output,
                                      .softcap = d->final_softcap};
    if (!err) err = emit(&b, (em_program_op){.kind = EM_PROGRAM_OUTPUT, .src = b.buf.x, .u.output = output});
    if (!err) err = em_program_check(out);
    if (err) {
        em_program_free(out);
        return em_err_prefix(err, "the layer program of %s", d->arch);
    }
    return NULL;
}
