/* The decode schedule (schedule.h): a rewrite of the layer program, layer by layer, into the
 * persistent kernel's instructions, and checked for the data dependencies the kernel must respect. */
#include "schedule.h"

#include <stdlib.h>

static const char *const op_names[EM_OP_KINDS] = {"qkv",  "attention", "out_proj",  "ffn_up",
                                                     "ffn_down", "head", "route", "expert_up", "expert_down"};

const char *em_op_name(em_op_kind kind) { return kind < EM_OP_KINDS ? op_names[kind] : "?"; }

static void add(em_schedule *s, em_op_kind kind, uint32_t layer, uint32_t reads, uint32_t writes) {
    s->ops[s->n_ops++] = (em_op){.kind = (uint8_t)kind, .barrier_after = true, .layer = (uint16_t)layer,
                                 .reads = reads, .writes = writes};
    s->n_barriers++;
}

/* x += W_o attention(QKV norm(x)): QK-norm and RoPE are the attention instruction's to finish. */
static em_err schedule_attention(const em_block *b, em_schedule *s) {
    const em_program_attention *a = b->attention;
    if (a->head_dim != a->head_dim_v || a->head_dim < 32 || a->head_dim > 256 || a->head_dim % 32)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: head sizes %u/%u (32-256, keys and values alike)", b->layer,
                         a->head_dim, a->head_dim_v);
    if (!a->n_head_kv || a->n_head % a->n_head_kv)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: %u query heads over %u key heads", b->layer, a->n_head,
                         a->n_head_kv);
    if (b->post_norm) return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: post-norms are not scheduled yet", b->layer);
    add(s, EM_OP_QKV, b->layer, EM_BUF_X, EM_BUF_QKV);
    add(s, EM_OP_ATTENTION, b->layer, EM_BUF_QKV | EM_BUF_KV, EM_BUF_KV | EM_BUF_PARTS);
    add(s, EM_OP_OUT_PROJ, b->layer, EM_BUF_PARTS | EM_BUF_X, EM_BUF_X);
    return NULL;
}

/* x += down(act(gate norm(x)) * up norm(x)), or the same through each token's chosen experts. */
static em_err schedule_feed_forward(const em_block *b, em_schedule *s) {
    if (b->kind == EM_BLOCK_EXPERTS) {
        const em_program_route *r = b->route;
        if (r->n_expert > EM_SCHEDULE_MAX_EXPERTS || !r->n_used || r->n_used > EM_SCHEDULE_MAX_USED ||
            r->n_used > r->n_expert)
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: %u of %u experts a token (at most %u of %u)", b->layer,
                             r->n_used, r->n_expert, EM_SCHEDULE_MAX_USED, EM_SCHEDULE_MAX_EXPERTS);
        if (b->gate)
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: shared experts are not scheduled yet", b->layer);
        add(s, EM_OP_ROUTE, b->layer, EM_BUF_X, EM_BUF_ROUTER);
        add(s, EM_OP_EXPERT_UP, b->layer, EM_BUF_X | EM_BUF_ROUTER, EM_BUF_H);
        add(s, EM_OP_EXPERT_DOWN, b->layer, EM_BUF_H | EM_BUF_ROUTER | EM_BUF_X, EM_BUF_X);
    } else {
        add(s, EM_OP_FFN_UP, b->layer, EM_BUF_X, EM_BUF_H);
        add(s, EM_OP_FFN_DOWN, b->layer, EM_BUF_H | EM_BUF_X, EM_BUF_X);
    }
    if (b->post_norm) return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: post-norms are not scheduled yet", b->layer);
    return NULL;
}

em_err em_schedule_build(const em_program *p, em_schedule *out) {
    *out = (em_schedule){0};
    if (p->n_layer == 0 || p->n_layer > UINT16_MAX)
        return em_errorf(EM_ERR_UNSUPPORTED, "schedule: %u layers", p->n_layer);
    em_block *blocks;
    uint32_t n_blocks;
    em_err err = em_program_blocks(p, &blocks, &n_blocks);
    if (err) return em_err_prefix(err, "schedule");
    em_schedule s = {0};
    s.ops = calloc((size_t)p->n_layer * 6 + 1, sizeof *s.ops);
    if (!s.ops) {
        free(blocks);
        return em_errorf(EM_ERR_NOMEM, "schedule: out of memory for %u layers", p->n_layer);
    }
    /* The kernel's instructions are a rewrite of each block. */
    for (uint32_t i = 0; i < n_blocks && !err; i++)
        err = blocks[i].kind == EM_BLOCK_ATTENTION ? schedule_attention(&blocks[i], &s)
                                                   : schedule_feed_forward(&blocks[i], &s);
    free(blocks);
    if (err) {
        free(s.ops);
        return em_err_prefix(err, "schedule");
    }
    add(&s, EM_OP_HEAD, 0, EM_BUF_X, EM_BUF_LOGITS);
    s.ops[s.n_ops - 1].barrier_after = false; /* the end of the kernel is the last wait */
    s.n_barriers--;
    *out = s;
    return NULL;
}

/* The rules of schedule.h. A buffer that an instruction reads and writes (x += ...) is only safe
 * when each element is read and written by the same thread, which every scheduled read-modify-write
 * does (EM_OP_OUT_PROJ, EM_OP_FFN_DOWN, EM_OP_EXPERT_DOWN own their rows); what must not happen is a second
 * instruction between the same two barriers touching what the first writes. */
em_err em_schedule_check(const em_schedule *s) {
    uint32_t ready = EM_BUF_X | EM_BUF_KV; /* written before a barrier that has passed, or the step's input */
    uint32_t pending = 0;                  /* written since the last barrier */
    uint32_t touched = 0;                  /* read or written since the last barrier */
    uint32_t barriers = 0;
    int last_layer = -1;
    if (s->n_ops == 0) return em_errorf(EM_ERR_INTERNAL, "schedule: empty");
    for (uint32_t i = 0; i < s->n_ops; i++) {
        const em_op *op = &s->ops[i];
        if (op->kind >= EM_OP_KINDS) return em_errorf(EM_ERR_INTERNAL, "schedule op %u: kind %u", i, op->kind);
        const char *name = em_op_name((em_op_kind)op->kind);
        if (op->kind != EM_OP_HEAD) {
            if ((int)op->layer < last_layer)
                return em_errorf(EM_ERR_INTERNAL, "schedule op %u (%s): layer %u after layer %d", i, name, op->layer,
                                 last_layer);
            last_layer = op->layer;
        }
        const uint32_t missing = op->reads & ~ready;
        if (missing)
            return em_errorf(EM_ERR_INTERNAL, "schedule op %u (%s, layer %u): reads buffers 0x%x before a barrier "
                             "after their writer", i, name, op->layer, missing);
        if ((op->reads | op->writes) & pending)
            return em_errorf(EM_ERR_INTERNAL, "schedule op %u (%s, layer %u): touches buffers 0x%x that an op "
                             "since the last barrier writes", i, name, op->layer, (op->reads | op->writes) & pending);
        if (op->writes & touched)
            return em_errorf(EM_ERR_INTERNAL, "schedule op %u (%s, layer %u): writes buffers 0x%x that an op "
                             "since the last barrier reads", i, name, op->layer, op->writes & touched);
        pending |= op->writes;
        touched |= op->reads | op->writes;
        if (op->barrier_after) {
            ready |= pending;
            pending = touched = 0;
            barriers++;
        }
    }
    if (!((ready | pending) & EM_BUF_LOGITS))
        return em_errorf(EM_ERR_INTERNAL, "schedule: no op writes the logits");
    if (s->ops[s->n_ops - 1].kind != EM_OP_HEAD)
        return em_errorf(EM_ERR_INTERNAL, "schedule: the last op is %s, not head",
                         em_op_name((em_op_kind)s->ops[s->n_ops - 1].kind));
    if (barriers != s->n_barriers)
        return em_errorf(EM_ERR_INTERNAL, "schedule: %u barriers counted, %u recorded", barriers, s->n_barriers);
    return NULL;
}

void em_schedule_free(em_schedule *s) {
    free(s->ops);
    *s = (em_schedule){0};
}
