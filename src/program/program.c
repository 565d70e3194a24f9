/* The layer program (program.h): declaring buffers and caches, appending operations, the checker that
 * proves a program consistent before any backend runs it, and its one-line descriptions. */
#include "program.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"

static const char *const op_names[EM_PROGRAM_OP_KINDS] = {
    "embed", "norm", "matmul", "head_norm", "rope", "kv_write", "attention", "glu", "add", "route", "experts",
    "output", "split_gate", "sigmoid_gate", "delta_net", "gated_norm", "scale", "slice"};

const char *em_program_op_name(em_program_op_kind kind) {
    return (unsigned)kind < EM_PROGRAM_OP_KINDS ? op_names[kind] : "?";
}

em_err em_program_buffer_declare(em_program *p, const char *name, em_program_buffer_kind kind, uint32_t width,
                                 uint8_t *index) {
    for (uint32_t i = 0; i < p->n_buffers; i++) {
        em_program_buffer *b = &p->buffers[i];
        if (strcmp(b->name, name)) continue;
        if (b->kind != kind)
            return em_errorf(EM_ERR_INTERNAL, "program: buffer %s declared again as another kind", name);
        if (width > b->width) b->width = width;
        *index = (uint8_t)i;
        return NULL;
    }
    if (p->n_buffers == EM_PROGRAM_MAX_BUFFERS)
        return em_errorf(EM_ERR_INTERNAL, "program: more than %d buffers (declaring %s)", EM_PROGRAM_MAX_BUFFERS, name);
    if (strlen(name) >= EM_PROGRAM_NAME_MAX)
        return em_errorf(EM_ERR_INTERNAL, "program: buffer name %s is longer than %d", name, EM_PROGRAM_NAME_MAX - 1);
    em_program_buffer *b = &p->buffers[p->n_buffers];
    snprintf(b->name, sizeof b->name, "%s", name);
    b->kind = kind;
    b->width = width;
    *index = (uint8_t)p->n_buffers++;
    return NULL;
}

em_err em_program_cache_declare(em_program *p, uint32_t layer, uint32_t key_width, uint32_t value_width,
                                uint32_t *index) {
    if (p->n_caches == p->cap_caches) {
        const uint32_t cap = p->cap_caches ? 2 * p->cap_caches : 16;
        em_program_cache *grown = realloc(p->caches, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "program: out of memory for %u KV caches", cap);
        p->caches = grown;
        p->cap_caches = cap;
    }
    p->caches[p->n_caches] = (em_program_cache){.key_width = key_width, .value_width = value_width, .layer = layer};
    *index = p->n_caches++;
    return NULL;
}

em_err em_program_state_declare(em_program *p, uint32_t layer, uint32_t conv_floats, uint32_t recurrent_floats,
                                uint32_t *index) {
    if (p->n_states == p->cap_states) {
        const uint32_t cap = p->cap_states ? 2 * p->cap_states : 16;
        em_program_state *grown = realloc(p->states, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "program: out of memory for %u recurrent states", cap);
        p->states = grown;
        p->cap_states = cap;
    }
    p->states[p->n_states] =
        (em_program_state){.layer = layer, .conv_floats = conv_floats, .recurrent_floats = recurrent_floats};
    *index = p->n_states++;
    return NULL;
}

em_err em_program_append(em_program *p, const em_program_op *op) {
    if (p->n_ops == p->cap_ops) {
        const uint32_t cap = p->cap_ops ? 2 * p->cap_ops : 64;
        em_program_op *grown = realloc(p->ops, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "program: out of memory for %u operations", cap);
        p->ops = grown;
        p->cap_ops = cap;
    }
    p->ops[p->n_ops++] = *op;
    return NULL;
}

void em_program_free(em_program *p) {
    free(p->ops);
    free(p->caches);
    free(p->states);
    *p = (em_program){0};
}

/* ---- The checker ---- */

/* What the checker knows of each buffer while it walks the program: the width of the rows last
 * written to it (0: not written yet), and for choices, how many experts they choose among. */
typedef struct buffer_state {
    uint32_t width;
    uint32_t n_expert;
} buffer_state;

typedef struct checker {
    const em_program *p;
    buffer_state buffers[EM_PROGRAM_MAX_BUFFERS];
    bool *cache_written;
    bool *state_used;
    uint32_t i; /* the operation being checked */
} checker;

static em_err fail(const checker *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static em_err fail(const checker *c, const char *fmt, ...) {
    const em_program_op *op = &c->p->ops[c->i];
    char where[48], message[160];
    if (op->layer == EM_PROGRAM_NO_LAYER)
        snprintf(where, sizeof where, "op %u (%s)", c->i, em_program_op_name(op->kind));
    else
        snprintf(where, sizeof where, "op %u (layer %u %s)", c->i, op->layer, em_program_op_name(op->kind));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return em_errorf(EM_ERR_INTERNAL, "program %s: %s", where, message);
}

static em_err buffer_index(const checker *c, uint8_t index, em_program_buffer_kind kind) {
    if (index >= c->p->n_buffers) return fail(c, "buffer %u of %u", index, c->p->n_buffers);
    if (c->p->buffers[index].kind != kind)
        return fail(c, "buffer %s is of another kind (%d, not %d)", c->p->buffers[index].name,
                    (int)c->p->buffers[index].kind, (int)kind);
    return NULL;
}

/* src must hold rows of `width` written by an earlier operation. */
static em_err reads(const checker *c, uint8_t src, em_program_buffer_kind kind, uint32_t width) {
    em_err err = buffer_index(c, src, kind);
    if (err) return err;
    const buffer_state *s = &c->buffers[src];
    if (!s->width) return fail(c, "reads %s before anything writes it", c->p->buffers[src].name);
    if (s->width != width)
        return fail(c, "reads %s at width %u, last written at %u", c->p->buffers[src].name, width, s->width);
    return NULL;
}

static em_err writes(checker *c, uint8_t dst, em_program_buffer_kind kind, uint32_t width) {
    em_err err = buffer_index(c, dst, kind);
    if (err) return err;
    if (!width) return fail(c, "writes %s at width 0", c->p->buffers[dst].name);
    if (width > c->p->buffers[dst].width)
        return fail(c, "writes %s at width %u, declared %u", c->p->buffers[dst].name, width,
                    c->p->buffers[dst].width);
    c->buffers[dst].width = width;
    return NULL;
}

static em_err weight_shape(const checker *c, const char *what, const em_weight *w, uint64_t cols, uint64_t rows,
                           uint64_t n_mat) {
    if (!w || !w->data) return fail(c, "%s is missing", what);
    if (w->cols != cols) return fail(c, "%s has %llu columns, the input %llu", what, (unsigned long long)w->cols, (unsigned long long)cols);
    if (rows && w->rows != rows) return fail(c, "%s has %llu rows, the output %llu", what, (unsigned long long)w->rows, (unsigned long long)rows);
    if (w->n_mat < n_mat) return fail(c, "%s stacks %llu matrices, %llu needed", what, (unsigned long long)w->n_mat, (unsigned long long)n_mat);
    if (w->mat_bytes && w->mat_bytes < w->rows * w->row_bytes)
        return fail(c, "%s has matrices %llu bytes apart, each %llu long", what, (unsigned long long)w->mat_bytes,
                    (unsigned long long)(w->rows * w->row_bytes));
    return NULL;
}

static em_err check_cache(const checker *c, const em_program_op *op) {
    if (op->cache >= c->p->n_caches) return fail(c, "cache %u of %u", op->cache, c->p->n_caches);
    return NULL;
}

/* A known activation; the clamped SwiGLU with a positive clip and slope. */
static em_err check_activation(const checker *c, em_activation act, float limit, float alpha) {
    if ((unsigned)act > EM_ACT_SWIGLU_CLAMPED) return fail(c, "activation %d", (int)act);
    if (act == EM_ACT_SWIGLU_CLAMPED && !(limit > 0.0f && alpha > 0.0f))
        return fail(c, "a clamped SwiGLU with limit %g and slope %g", limit, alpha);
    return NULL;
}

/* A delta_net step: its heads divide, its vectors are there, its state is its own and of the size its
 * shapes give, and it reads the mixed channels, beta and alpha an earlier operation wrote. */
static em_err check_delta_net(checker *c, const em_program_op *op) {
    const em_program_delta_net *d = &op->u.delta_net;
    em_err err;
    if (!d->n_head_k || !d->n_head_v || d->n_head_v % d->n_head_k || !d->head_dim_k || !d->head_dim_v)
        return fail(c, "%u value heads over %u key heads (dims %u/%u)", d->n_head_v, d->n_head_k, d->head_dim_k,
                    d->head_dim_v);
    if (!d->conv_kernel || !d->conv || !d->dt_bias || !d->a)
        return fail(c, "a conv of %u taps%s", d->conv_kernel,
                    d->conv && d->dt_bias && d->a ? "" : " or its weights, dt_bias or a missing");
    if (d->state >= c->p->n_states) return fail(c, "state %u of %u", d->state, c->p->n_states);
    if (c->state_used[d->state]) return fail(c, "state %u is updated by two operations", d->state);
    c->state_used[d->state] = true;
    const uint32_t conv_dim = 2 * d->n_head_k * d->head_dim_k + d->n_head_v * d->head_dim_v;
    const em_program_state *s = &c->p->states[d->state];
    if (s->conv_floats != (d->conv_kernel - 1) * conv_dim ||
        s->recurrent_floats != d->n_head_v * d->head_dim_k * d->head_dim_v)
        return fail(c, "state %u holds %u + %u floats, these heads need %u + %u", d->state, s->conv_floats,
                    s->recurrent_floats, (d->conv_kernel - 1) * conv_dim, d->n_head_v * d->head_dim_k * d->head_dim_v);
    if (op->dst == op->src || op->dst == d->beta || op->dst == d->alpha)
        return fail(c, "writes a buffer it reads");
    if ((err = reads(c, op->src, EM_PROGRAM_ROWS, conv_dim))) return err;
    if ((err = reads(c, d->beta, EM_PROGRAM_ROWS, d->n_head_v))) return err;
    if ((err = reads(c, d->alpha, EM_PROGRAM_ROWS, d->n_head_v))) return err;
    return writes(c, op->dst, EM_PROGRAM_ROWS, d->n_head_v * d->head_dim_v);
}

static em_err check_op(checker *c, const em_program_op *op) {
    const em_program *p = c->p;
    em_err err = NULL;
    switch (op->kind) {
    case EM_PROGRAM_EMBED:
        /* the first operation embeds the tokens; a later one reads a second table (per-layer inputs) */
        if (c->i != 0 && op->dst == p->ops[0].dst) return fail(c, "embeds into %s again", p->buffers[op->dst].name);
        if (!op->u.embed.table || !op->u.embed.table->data || op->u.embed.table->rows != p->n_vocab)
            return fail(c, "a table of %llu rows for a vocabulary of %u",
                        (unsigned long long)(op->u.embed.table ? op->u.embed.table->rows : 0), p->n_vocab);
        return writes(c, op->dst, EM_PROGRAM_ROWS, (uint32_t)op->u.embed.table->cols);
    case EM_PROGRAM_NORM:
        if ((err = reads(c, op->src, EM_PROGRAM_ROWS, op->u.norm.width))) return err;
        return writes(c, op->dst, EM_PROGRAM_ROWS, op->u.norm.width);
    case EM_PROGRAM_MATMUL: {
        const em_weight *w = op->u.matmul.weight;
        if (!w || !w->data) return fail(c, "the weight is missing");
        if ((err = reads(c, op->src, EM_PROGRAM_ROWS, (uint32_t)w->cols))) return err;
        if ((err = weight_shape(c, "the weight", w, w->cols, 0, op->u.matmul.mat + 1))) return err;
        return writes(c, op->dst, EM_PROGRAM_ROWS, (uint32_t)w->rows);
    }
    case EM_PROGRAM_HEAD_NORM:
    case EM_PROGRAM_ROPE: {
        const em_program_heads *h = &op->u.heads;
        if (op->kind == EM_PROGRAM_ROPE && (!h->rope || h->rope->n_rot > h->head_dim || h->rope->n_rot % 2))
            return fail(c, "rotates %u of %u dimensions", h->rope ? h->rope->n_rot : 0, h->head_dim);
        if (op->kind == EM_PROGRAM_HEAD_NORM && h->norm.width != h->head_dim)
            return fail(c, "a norm of width %u over heads of %u", h->norm.width, h->head_dim);
        if ((err = reads(c, op->dst, EM_PROGRAM_ROWS, h->n_head * h->head_dim))) return err;
        return NULL;
    }
    case EM_PROGRAM_KV_WRITE:
        if ((err = check_cache(c, op))) return err;
        if ((err = reads(c, op->src, EM_PROGRAM_ROWS, p->caches[op->cache].key_width))) return err;
        if ((err = reads(c, op->src2, EM_PROGRAM_ROWS, p->caches[op->cache].value_width))) return err;
        c->cache_written[op->cache] = true;
        return NULL;
    case EM_PROGRAM_ATTENTION: {
        const em_program_attention *a = &op->u.attention;
        if ((err = check_cache(c, op))) return err;
        if (!c->cache_written[op->cache]) return fail(c, "reads cache %u before a kv_write", op->cache);
        /* a layer that shares KV reads an earlier layer's cache, never a later one's */
        if (op->layer != EM_PROGRAM_NO_LAYER && p->caches[op->cache].layer > op->layer)
            return fail(c, "reads cache %u of a later layer (%u)", op->cache, p->caches[op->cache].layer);
        if (!a->n_head_kv || a->n_head % a->n_head_kv)
            return fail(c, "%u query heads over %u key heads", a->n_head, a->n_head_kv);
        const em_program_cache *kv = &p->caches[op->cache];
        if (kv->key_width != a->n_head_kv * a->head_dim || kv->value_width != a->n_head_kv * a->head_dim_v)
            return fail(c, "a cache of %u/%u floats a position for these heads", kv->key_width,
                        kv->value_width);
        if ((err = reads(c, op->src, EM_PROGRAM_ROWS, a->n_head * a->head_dim))) return err;
        return writes(c, op->dst, EM_PROGRAM_ROWS, a->n_head * a->head_dim_v);
    }
    case EM_PROGRAM_GLU:
        if ((err = check_activation(c, op->u.glu.act, op->u.glu.limit, op->u.glu.alpha))) return err;
        if ((err = reads(c, op->dst, EM_PROGRAM_ROWS, op->u.glu.width))) return err;
        return reads(c, op->src, EM_PROGRAM_ROWS, op->u.glu.width);
    case EM_PROGRAM_ADD:
        if ((err = reads(c, op->dst, EM_PROGRAM_ROWS, op->u.add_width))) return err;
        return reads(c, op->src, EM_PROGRAM_ROWS, op->u.add_width);
    case EM_PROGRAM_SCALE:
        if (!isfinite(op->u.scale.factor)) return fail(c, "a factor of %g", op->u.scale.factor);
        return reads(c, op->dst, EM_PROGRAM_ROWS, op->u.scale.width);
    case EM_PROGRAM_SLICE: {
        const em_program_slice *s = &op->u.slice;
        if (op->dst == op->src) return fail(c, "slices %s into itself", p->buffers[op->dst].name);
        if (!s->width || s->offset > s->src_width || s->width > s->src_width - s->offset)
            return fail(c, "columns %u to %u of rows of %u", s->offset, s->offset + s->width, s->src_width);
        if ((err = reads(c, op->src, EM_PROGRAM_ROWS, s->src_width))) return err;
        return writes(c, op->dst, EM_PROGRAM_ROWS, s->width);
    }
    case EM_PROGRAM_ROUTE: {
        const em_program_route *r = &op->u.route;
        if (!r->n_used || r->n_used > r->n_expert)
            return fail(c, "chooses %u of %u experts", r->n_used, r->n_expert);
        if ((unsigned)r->gating > EM_GATING_SOFTMAX_CHOSEN) return fail(c, "gating %d", (int)r->gating);
        if ((err = reads(c, op->src, EM_PROGRAM_ROWS, r->n_expert))) return err;
        if ((err = writes(c, op->dst, EM_PROGRAM_CHOICES, r->n_used))) return err;
        c->buffers[op->dst].n_expert = r->n_expert;
        return NULL;
    }
    case EM_PROGRAM_EXPERTS: {
        const em_program_experts *x = &op->u.experts;
        if ((err = check_activation(c, x->act, x->limit, x->alpha))) return err;
        if ((err = buffer_index(c, op->src2, EM_PROGRAM_CHOICES))) return err;
        const buffer_state *choices = &c->buffers[op->src2];
        if (!choices->width) return fail(c, "reads choices %s before a route", p->buffers[op->src2].name);
        if ((err = buffer_index(c, op->src, EM_PROGRAM_ROWS))) return err;
        const uint32_t width = c->buffers[op->src].width;
        if ((err = reads(c, op->src, EM_PROGRAM_ROWS, width ? width : 1))) return err;
        if ((err = weight_shape(c, "the gate stack", x->gate, width, 0, choices->n_expert))) return err;
        if ((err = weight_shape(c, "the up stack", x->up, width, x->gate->rows, choices->n_expert))) return err;
        if ((err = weight_shape(c, "the down stack", x->down, x->gate->rows, 0, choices->n_expert))) return err;
        return writes(c, op->dst, EM_PROGRAM_ROWS, (uint32_t)x->down->rows);
    }
    case EM_PROGRAM_OUTPUT: {
        const em_program_output *o = &op->u.output;
        if (c->i != p->n_ops - 1) return fail(c, "output comes at op %u of %u, not last", c->i, p->n_ops);
        if ((err = reads(c, op->src, EM_PROGRAM_ROWS, o->norm.width))) return err;
        return weight_shape(c, "the output matrix", o->weight, o->norm.width, p->n_vocab, 1);
    }
    case EM_PROGRAM_SPLIT_GATE: {
        const em_program_split_gate *g = &op->u.split_gate;
        const uint32_t width = g->n_head * g->head_dim;
        if (g->gate == op->dst || g->gate == op->src || op->dst == op->src)
            return fail(c, "queries, gates and their source must be three buffers");
        if ((err = reads(c, op->src, EM_PROGRAM_ROWS, 2 * width))) return err;
        if ((err = writes(c, op->dst, EM_PROGRAM_ROWS, width))) return err;
        return writes(c, g->gate, EM_PROGRAM_ROWS, width);
    }
    case EM_PROGRAM_SIGMOID_GATE: {
        const em_program_sigmoid_gate *g = &op->u.sigmoid_gate;
        if ((err = reads(c, op->dst, EM_PROGRAM_ROWS, g->width))) return err;
        return reads(c, op->src, EM_PROGRAM_ROWS, g->per_token ? 1 : g->width);
    }
    case EM_PROGRAM_DELTA_NET:
        return check_delta_net(c, op);
    case EM_PROGRAM_GATED_NORM: {
        const em_program_heads *h = &op->u.heads;
        if (h->norm.width != h->head_dim || !h->norm.weight)
            return fail(c, "a norm of width %u%s over heads of %u", h->norm.width, h->norm.weight ? "" : " without weights",
                        h->head_dim);
        if ((err = reads(c, op->dst, EM_PROGRAM_ROWS, h->n_head * h->head_dim))) return err;
        return reads(c, op->src, EM_PROGRAM_ROWS, h->n_head * h->head_dim);
    }
    default:
        return fail(c, "unknown kind %d", (int)op->kind);
    }
}

em_err em_program_check(const em_program *p) {
    if (p->n_ops < 2) return em_errorf(EM_ERR_INTERNAL, "program: %u operations", p->n_ops);
    if (p->ops[0].kind != EM_PROGRAM_EMBED) return em_errorf(EM_ERR_INTERNAL, "program: does not begin with embed");
    if (p->ops[p->n_ops - 1].kind != EM_PROGRAM_OUTPUT)
        return em_errorf(EM_ERR_INTERNAL, "program: does not end with output");
    checker c = {.p = p, .cache_written = calloc(p->n_caches ? p->n_caches : 1, sizeof(bool)),
                 .state_used = calloc(p->n_states ? p->n_states : 1, sizeof(bool))};
    em_err err = NULL;
    if (!c.cache_written || !c.state_used) err = em_errorf(EM_ERR_NOMEM, "program check: out of memory");
    for (c.i = 0; c.i < p->n_ops && !err; c.i++) err = check_op(&c, &p->ops[c.i]);
    for (uint32_t i = 0; i < p->n_caches && !err; i++)
        if (!c.cache_written[i]) err = em_errorf(EM_ERR_INTERNAL, "program: no operation writes cache %u", i);
    for (uint32_t i = 0; i < p->n_states && !err; i++)
        if (!c.state_used[i]) err = em_errorf(EM_ERR_INTERNAL, "program: no operation updates state %u", i);
    free(c.cache_written);
    free(c.state_used);
    return err;
}

/* ---- Reading ---- */

uint32_t em_program_widest_group(const em_program *p) {
    uint32_t widest = 1;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const em_program_op *op = &p->ops[i];
        if (op->kind == EM_PROGRAM_ATTENTION && op->u.attention.n_head_kv &&
            op->u.attention.n_head / op->u.attention.n_head_kv > widest)
            widest = op->u.attention.n_head / op->u.attention.n_head_kv;
    }
    return widest;
}

uint64_t em_program_kv_floats(const em_program *p) {
    uint64_t floats = 0;
    for (uint32_t i = 0; i < p->n_caches; i++) floats += (uint64_t)p->caches[i].key_width + p->caches[i].value_width;
    return floats;
}

uint64_t em_program_state_floats(const em_program *p) {
    return em_program_state_offset(p, p->n_states);
}

uint64_t em_program_state_offset(const em_program *p, uint32_t state) {
    uint64_t floats = 0;
    for (uint32_t i = 0; i < state && i < p->n_states; i++)
        floats += (uint64_t)p->states[i].conv_floats + p->states[i].recurrent_floats;
    return floats;
}

static void describe_weight(char *buf, size_t size, const em_weight *w) {
    if (!w || !w->data) {
        snprintf(buf, size, "(none)");
        return;
    }
    snprintf(buf, size, "%llux%llu %s", (unsigned long long)w->rows, (unsigned long long)w->cols,
             em_type_name(w->type));
}

void em_program_describe_op(const em_program *p, uint32_t i, char *buf, size_t size) {
    if (i >= p->n_ops) {
        snprintf(buf, size, "(no op %u)", i);
        return;
    }
    const em_program_op *op = &p->ops[i];
    const char *dst = op->dst < p->n_buffers ? p->buffers[op->dst].name : "?";
    const char *src = op->src < p->n_buffers ? p->buffers[op->src].name : "?";
    const char *src2 = op->src2 < p->n_buffers ? p->buffers[op->src2].name : "?";
    char layer[24] = "", w[64];
    if (op->layer != EM_PROGRAM_NO_LAYER) snprintf(layer, sizeof layer, "layer %u ", op->layer);
    const char *act_names[] = {"silu", "gelu", "clamped silu"};
    const char *gating_names[] = {"softmax", "sigmoid", "softmax of the chosen"};
    switch (op->kind) {
    case EM_PROGRAM_EMBED:
        describe_weight(w, sizeof w, op->u.embed.table);
        snprintf(buf, size, "%sembed %s = [%s][token] x %g", layer, dst, w, op->u.embed.scale);
        break;
    case EM_PROGRAM_NORM:
        snprintf(buf, size, "%snorm %s = rmsnorm(%s)%s", layer, dst, src, op->u.norm.weight ? " w" : "");
        break;
    case EM_PROGRAM_MATMUL:
        describe_weight(w, sizeof w, op->u.matmul.weight);
        snprintf(buf, size, "%smatmul %s = [%s]%s %s%s", layer, dst, w, op->u.matmul.mat ? "[mat]" : "", src,
                 op->u.matmul.bias ? " + b" : "");
        break;
    case EM_PROGRAM_HEAD_NORM:
        snprintf(buf, size, "%shead_norm %s: %u heads x %u%s", layer, dst, op->u.heads.n_head, op->u.heads.head_dim,
                 op->u.heads.norm.weight ? "" : ", no weight");
        break;
    case EM_PROGRAM_ROPE:
        snprintf(buf, size, "%srope %s: %u heads x %u, %s %u dims theta %g", layer, dst, op->u.heads.n_head,
                 op->u.heads.head_dim, op->u.heads.rope->style == EM_ROPE_NEOX ? "neox" : "normal",
                 op->u.heads.rope->n_rot, op->u.heads.rope->theta);
        break;
    case EM_PROGRAM_KV_WRITE:
        snprintf(buf, size, "%skv_write cache %u = %s, %s", layer, op->cache, src, src2);
        break;
    case EM_PROGRAM_SCALE:
        snprintf(buf, size, "%sscale %s *= %g", layer, dst, op->u.scale.factor);
        break;
    case EM_PROGRAM_SLICE:
        snprintf(buf, size, "%sslice %s = %s[%u:%u]", layer, dst, src, op->u.slice.offset,
                 op->u.slice.offset + op->u.slice.width);
        break;
    case EM_PROGRAM_ATTENTION: {
        const em_program_attention *a = &op->u.attention;
        snprintf(buf, size, "%sattention %s = %s over cache %u: %u/%u heads x %u/%u%s%.0u%s%s", layer, dst, src,
                 op->cache, a->n_head, a->n_head_kv, a->head_dim, a->head_dim_v, a->window ? ", window " : "",
                 a->window, a->softcap > 0 ? ", softcap" : "", a->sinks ? ", sinks" : "");
        break;
    }
    case EM_PROGRAM_GLU:
        snprintf(buf, size, "%sglu %s = %s(%s) * %s", layer, dst, act_names[op->u.glu.act % 3], dst, src);
        break;
    case EM_PROGRAM_ADD:
        snprintf(buf, size, "%sadd %s += %s", layer, dst, src);
        break;
    case EM_PROGRAM_ROUTE:
        snprintf(buf, size, "%sroute %s = top %u of %u by %s(%s)%s%s", layer, dst, op->u.route.n_used,
                 op->u.route.n_expert, gating_names[op->u.route.gating % 3], src,
                 op->u.route.renormalize ? ", renormalized" : "", op->u.route.expert_scale ? ", scaled per expert" : "");
        break;
    case EM_PROGRAM_EXPERTS:
        describe_weight(w, sizeof w, op->u.experts.gate);
        snprintf(buf, size, "%sexperts %s = chosen by %s of [%s] %s(%s)", layer, dst, src2, w,
                 act_names[op->u.experts.act % 3], src);
        if (op->u.experts.gate_bias || op->u.experts.up_bias || op->u.experts.down_bias)
            if (size > strlen(buf) + 1) snprintf(buf + strlen(buf), size - strlen(buf), ", biased");
        break;
    case EM_PROGRAM_OUTPUT:
        describe_weight(w, sizeof w, op->u.output.weight);
        snprintf(buf, size, "output logits = [%s] rmsnorm(%s)%s", w, src, op->u.output.softcap > 0 ? ", softcap" : "");
        break;
    case EM_PROGRAM_SPLIT_GATE: {
        const em_program_split_gate *g = &op->u.split_gate;
        snprintf(buf, size, "%ssplit_gate %s, %s = %s: %u heads x %u", layer, dst,
                 g->gate < p->n_buffers ? p->buffers[g->gate].name : "?", src, g->n_head, g->head_dim);
        break;
    }
    case EM_PROGRAM_SIGMOID_GATE:
        snprintf(buf, size, "%ssigmoid_gate %s *= sigmoid(%s)%s", layer, dst, src,
                 op->u.sigmoid_gate.per_token ? ", one gate per token" : "");
        break;
    case EM_PROGRAM_DELTA_NET: {
        const em_program_delta_net *d = &op->u.delta_net;
        snprintf(buf, size, "%sdelta_net %s = conv%u(%s) with state %u: %u/%u heads x %u/%u, %s", layer, dst,
                 d->conv_kernel, src, d->state, d->n_head_v, d->n_head_k, d->head_dim_k, d->head_dim_v,
                 d->v_tiled ? "tiled" : "grouped");
        break;
    }
    case EM_PROGRAM_GATED_NORM:
        snprintf(buf, size, "%sgated_norm %s = rmsnorm(%s) w * silu(%s): %u heads x %u", layer, dst, dst, src,
                 op->u.heads.n_head, op->u.heads.head_dim);
        break;
    default:
        snprintf(buf, size, "op kind %d", (int)op->kind);
    }
}
