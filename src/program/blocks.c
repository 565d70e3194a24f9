/* The blocks of a program (program.h: em_program_blocks): each layer's operations matched, in order,
 * against the runs a backend rewrites into fused kernels, with the data flow between them checked, so a
 * backend that runs blocks computes what the operations say or refuses the program. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "program.h"

/* The operations of one layer, matched in order. */
typedef struct matcher {
    const em_program *p;
    uint32_t at, end; /* the next operation, and the layer's end */
    uint32_t layer;
} matcher;

static const em_program_op *peek(const matcher *m, uint32_t ahead) {
    return m->at + ahead < m->end ? &m->p->ops[m->at + ahead] : NULL;
}

/* The next operation if it is of `kind` (taken), else NULL. */
static const em_program_op *take(matcher *m, em_program_op_kind kind) {
    const em_program_op *op = peek(m, 0);
    if (!op || op->kind != kind) return NULL;
    m->at++;
    return op;
}

/* An error naming `op` (the one taken that breaks the data flow), or when it is NULL, the next one. */
static em_err refuse(const matcher *m, const em_program_op *op, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static em_err refuse(const matcher *m, const em_program_op *op, const char *fmt, ...) {
    char message[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (!op) op = peek(m, 0);
    const uint32_t at = op ? (uint32_t)(op - m->p->ops) : m->end;
    return em_errorf(EM_ERR_UNSUPPORTED, "layer %u, op %u (%s): %s", m->layer, at,
                     op ? em_program_op_name(op->kind) : "the layer's end", message);
}

/* A norm of a block's result before its residual add (Gemma's post-norms): in place. */
static const em_program_op *take_post_norm(matcher *m, uint8_t result) {
    const em_program_op *op = peek(m, 0);
    if (!op || op->kind != EM_PROGRAM_NORM || op->dst != result || op->src != result) return NULL;
    m->at++;
    return op;
}

/* The block's end: [post_norm] then x += result. */
static em_err match_residual(matcher *m, em_block *b, uint8_t x, uint8_t result) {
    const em_program_op *post = take_post_norm(m, result);
    b->post_norm = post ? &post->u.norm : NULL;
    const em_program_op *add = take(m, EM_PROGRAM_ADD);
    if (!add || add->dst != x || add->src != result) return refuse(m, add, "expected the residual add of the block");
    return NULL;
}

/* xn = norm(x): the block's start. */
static em_err match_norm(matcher *m, em_block *b, uint8_t *x, uint8_t *xn) {
    const em_program_op *norm = take(m, EM_PROGRAM_NORM);
    if (!norm || norm->dst == norm->src) return refuse(m, norm, "expected a block's input norm");
    b->norm = &norm->u.norm;
    *x = norm->src, *xn = norm->dst;
    return NULL;
}

static const em_program_op *take_matmul_of(matcher *m, uint8_t src) {
    const em_program_op *op = peek(m, 0);
    if (!op || op->kind != EM_PROGRAM_MATMUL || op->src != src) return NULL;
    m->at++;
    return op;
}

/* QK-norm and RoPE of one of q and k, in place. */
static void take_heads(matcher *m, uint8_t buffer, const em_program_op **norm, const em_program_op **rope) {
    for (const em_program_op *op; (op = peek(m, 0)) && op->dst == buffer;) {
        if (op->kind == EM_PROGRAM_HEAD_NORM && !*norm && !*rope)
            *norm = op;
        else if (op->kind == EM_PROGRAM_ROPE && !*rope)
            *rope = op;
        else
            return;
        m->at++;
    }
}

/* x += [post_norm](W_o attention(rope(head_norm(q, k, v of norm(x))))) */
static em_err match_attention(matcher *m, em_block *b) {
    uint8_t x = 0, xn = 0;
    em_err err = match_norm(m, b, &x, &xn);
    if (err) return err;
    b->kind = EM_BLOCK_ATTENTION;
    const em_program_op *q = take_matmul_of(m, xn), *k = take_matmul_of(m, xn), *v = take_matmul_of(m, xn);
    if (!q || !k || !v) return refuse(m, NULL, "expected the q, k and v products of the attention's input");
    b->q = &q->u.matmul, b->k = &k->u.matmul, b->v = &v->u.matmul;
    const em_program_op *q_norm = NULL, *q_rope = NULL, *k_norm = NULL, *k_rope = NULL;
    take_heads(m, q->dst, &q_norm, &q_rope);
    take_heads(m, k->dst, &k_norm, &k_rope);
    if (!q_rope != !k_rope || (q_rope && q_rope->u.heads.rope != k_rope->u.heads.rope))
        return refuse(m, NULL, "q and k rotated differently");
    if (!q_norm != !k_norm) return refuse(m, NULL, "a head norm of only one of q and k");
    b->q_norm = q_norm ? &q_norm->u.heads.norm : NULL;
    b->k_norm = k_norm ? &k_norm->u.heads.norm : NULL;
    b->rope = q_rope ? q_rope->u.heads.rope : NULL;
    const em_program_op *write = take(m, EM_PROGRAM_KV_WRITE);
    if (!write || write->src != k->dst || write->src2 != v->dst) return refuse(m, write, "expected k and v into the cache");
    const em_program_op *attention = take(m, EM_PROGRAM_ATTENTION);
    if (!attention || attention->src != q->dst || attention->cache != write->cache)
        return refuse(m, attention, "expected the attention of q over the cache just written");
    b->attention = &attention->u.attention;
    b->cache = attention->cache;
    const em_program_op *o = take_matmul_of(m, attention->dst);
    if (!o) return refuse(m, NULL, "expected the output projection of the attention");
    b->o = &o->u.matmul;
    return match_residual(m, b, x, o->dst);
}

/* down(act(gate xn) · up xn) into *result. */
static em_err match_gated_unit(matcher *m, em_block *b, uint8_t xn, uint8_t *result) {
    const em_program_op *gate = take_matmul_of(m, xn), *up = take_matmul_of(m, xn);
    if (!gate || !up) return refuse(m, NULL, "expected the gate and up products");
    const em_program_op *glu = take(m, EM_PROGRAM_GLU);
    if (!glu || glu->dst != gate->dst || glu->src != up->dst) return refuse(m, glu, "expected act(gate) · up");
    const em_program_op *down = take_matmul_of(m, gate->dst);
    if (!down) return refuse(m, NULL, "expected the down product of the gated unit");
    b->gate = &gate->u.matmul, b->up = &up->u.matmul, b->down = &down->u.matmul;
    b->act = glu->u.glu.act;
    *result = down->dst;
    return NULL;
}

/* x += [post_norm](ffn(norm(x))): a gated unit, or routed experts (+ a shared gated unit). */
static em_err match_feed_forward(matcher *m, em_block *b) {
    uint8_t x = 0, xn = 0, result;
    em_err err = match_norm(m, b, &x, &xn);
    if (err) return err;
    const em_program_op *next = peek(m, 1);
    if (!next || next->kind != EM_PROGRAM_ROUTE) {
        b->kind = EM_BLOCK_GATED_UNIT;
        if ((err = match_gated_unit(m, b, xn, &result))) return err;
        return match_residual(m, b, x, result);
    }
    b->kind = EM_BLOCK_EXPERTS;
    const em_program_op *router = take_matmul_of(m, xn);
    const em_program_op *route = take(m, EM_PROGRAM_ROUTE);
    if (!router || !route || route->src != router->dst) return refuse(m, route, "expected the router's product");
    const em_program_op *experts = take(m, EM_PROGRAM_EXPERTS);
    if (!experts || experts->src != xn || experts->src2 != route->dst)
        return refuse(m, experts, "expected the chosen experts of the feed-forward input");
    b->router = &router->u.matmul, b->route = &route->u.route, b->experts = &experts->u.experts;
    b->act = experts->u.experts.act;
    result = experts->dst;
    const em_program_op *shared_gate = peek(m, 0);
    if (shared_gate && shared_gate->kind == EM_PROGRAM_MATMUL) {
        uint8_t shared;
        const em_activation act = b->act;
        if ((err = match_gated_unit(m, b, xn, &shared))) return err;
        if (b->act != act) return refuse(m, NULL, "a shared expert with another activation than the routed ones");
        const em_program_op *gate = peek(m, 0);
        if (gate && gate->kind == EM_PROGRAM_MATMUL && gate->src == xn)
            return refuse(m, NULL, "a shared expert scaled by its own sigmoid gate (ffn_gate_inp_shexp), which no "
                                   "block computes");
        const em_program_op *add = take(m, EM_PROGRAM_ADD);
        if (!add || add->dst != result || add->src != shared) return refuse(m, add, "expected the shared expert's sum");
    }
    return match_residual(m, b, x, result);
}

/* Operations and parameters no block covers, named before any matching: per-layer inputs (a second
 * embed, slices, scales), a head norm without a weight, attention over another layer's cache,
 * per-expert factors of a router, experts whose stacks step over other matrices. */
static em_err refuse_unblocked(const em_program *p) {
    for (uint32_t i = 1; i + 1 < p->n_ops; i++) {
        const em_program_op *op = &p->ops[i];
        const char *what = NULL;
        if (op->kind == EM_PROGRAM_EMBED) what = "a second embedding table (per-layer inputs)";
        else if (op->kind == EM_PROGRAM_SLICE) what = "a slice of a row (per-layer inputs)";
        else if (op->kind == EM_PROGRAM_SCALE) what = "a scale of the rows";
        else if (op->kind == EM_PROGRAM_HEAD_NORM && !op->u.heads.norm.weight) what = "a head norm without a weight";
        else if (op->kind == EM_PROGRAM_ATTENTION && op->cache < p->n_caches && p->caches[op->cache].layer != op->layer)
            what = "attention over an earlier layer's cache (shared KV)";
        else if (op->kind == EM_PROGRAM_ROUTE && op->u.route.expert_scale) what = "a router with a factor per expert";
        else if (op->kind == EM_PROGRAM_EXPERTS && (op->u.experts.gate->mat_bytes || op->u.experts.up->mat_bytes ||
                                                      op->u.experts.down->mat_bytes))
            what = "experts whose gate and up share one tensor";
        if (!what) continue;
        if (op->layer == EM_PROGRAM_NO_LAYER)
            return em_errorf(EM_ERR_UNSUPPORTED, "blocks: op %u (%s): %s, which no block takes", i,
                             em_program_op_name(op->kind), what);
        return em_errorf(EM_ERR_UNSUPPORTED, "blocks: layer %u, op %u (%s): %s, which no block takes", op->layer, i,
                         em_program_op_name(op->kind), what);
    }
    return NULL;
}

em_err em_program_blocks(const em_program *p, em_block **blocks, uint32_t *n_blocks) {
    *blocks = NULL, *n_blocks = 0;
    if (p->n_ops < 2 || p->ops[0].kind != EM_PROGRAM_EMBED || p->ops[p->n_ops - 1].kind != EM_PROGRAM_OUTPUT)
        return em_errorf(EM_ERR_UNSUPPORTED, "blocks: a program that does not run from embed to output");
    em_err refused = refuse_unblocked(p);
    if (refused) return refused;
    em_block *out = calloc((size_t)p->n_layer * 2 + 1, sizeof *out);
    if (!out) return em_errorf(EM_ERR_NOMEM, "blocks: out of memory for %u layers", p->n_layer);
    /* Each layer's operations are one run of the program, in layer order, between embed and output. */
    em_err err = NULL;
    uint32_t n = 0;
    matcher m = {.p = p, .at = 1};
    for (uint32_t il = 0; il < p->n_layer && !err; il++) {
        m.layer = il;
        for (m.end = m.at; m.end < p->n_ops - 1 && p->ops[m.end].layer == il;) m.end++;
        for (uint32_t part = 0; part < 2 && !err; part++) {
            em_block *b = &out[n++];
            b->layer = il, b->first_op = m.at;
            err = part == 0 ? match_attention(&m, b) : match_feed_forward(&m, b);
            b->n_ops = m.at - b->first_op;
        }
        if (!err && m.at != m.end) err = refuse(&m, NULL, "an operation after the layer's feed-forward block");
    }
    if (!err && m.at != p->n_ops - 1)
        err = em_errorf(EM_ERR_UNSUPPORTED, "op %u (%s) after the last layer", m.at, em_program_op_name(p->ops[m.at].kind));
    if (err) {
        free(out);
        return em_err_prefix(err, "blocks");
    }
    *blocks = out, *n_blocks = n;
    return NULL;
}
