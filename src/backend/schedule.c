/* The decode schedule (schedule.h): built layer by layer from the model description, and checked
 * for the data dependencies a persistent kernel must respect. */
#include "schedule.h"

#include <stdlib.h>

static const char *const op_names[EM_OP_KINDS] = {"qkv",  "attention", "out_proj",  "ffn_up",
                                                     "ffn_down", "head", "route", "expert_up", "expert_down"};

const char *em_op_name(em_op_kind kind) { return kind < EM_OP_KINDS ? op_names[kind] : "?"; }

/* Why layer il cannot run in the schedule, or NULL. */
static em_err layer_unsupported(const em_model_desc *d, uint32_t il) {
    const em_layer_desc *ld = &d->layers[il];
    if (ld->moe && ld->n_ff_shared)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: shared experts are not scheduled yet", il);
    if (ld->moe && (ld->n_expert > EM_SCHEDULE_MAX_EXPERTS || !ld->n_expert_used ||
                    ld->n_expert_used > EM_SCHEDULE_MAX_USED || ld->n_expert_used > ld->n_expert))
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: %u of %u experts a token (at most %u of %u)", il,
                         ld->n_expert_used, ld->n_expert, EM_SCHEDULE_MAX_USED, EM_SCHEDULE_MAX_EXPERTS);
    if (ld->post_attn_norm || ld->post_ffn_norm)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: post-norms are not scheduled yet", il);
    if (ld->head_dim != ld->head_dim_v || ld->head_dim < 32 || ld->head_dim > 256 || ld->head_dim % 32)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: head sizes %u/%u (32-256, keys and values alike)", il,
                         ld->head_dim, ld->head_dim_v);
    if (!ld->n_head_kv || ld->n_head % ld->n_head_kv)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: %u query heads over %u key heads", il, ld->n_head,
                         ld->n_head_kv);
    return NULL;
}

static void add(em_schedule *s, em_op_kind kind, uint32_t layer, uint32_t reads, uint32_t writes) {
    s->ops[s->n_ops++] = (em_op){.kind = (uint8_t)kind, .barrier_after = true, .layer = (uint16_t)layer,
                                 .reads = reads, .writes = writes};
    s->n_barriers++;
}

em_err em_schedule_build(const em_model_desc *d, em_schedule *out) {
    *out = (em_schedule){0};
    if (d->norm != EM_NORM_RMS && d->norm != EM_NORM_RMS_PLUS_ONE)
        return em_errorf(EM_ERR_UNSUPPORTED, "schedule: norm kind %d", (int)d->norm);
    if (d->n_layer == 0 || d->n_layer > UINT16_MAX)
        return em_errorf(EM_ERR_UNSUPPORTED, "schedule: %u layers", d->n_layer);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        em_err err = layer_unsupported(d, il);
        if (err) return em_err_prefix(err, "schedule");
    }
    em_schedule s = {0};
    s.ops = calloc((size_t)d->n_layer * 6 + 1, sizeof *s.ops);
    if (!s.ops) return em_errorf(EM_ERR_NOMEM, "schedule: out of memory for %u layers", d->n_layer);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        add(&s, EM_OP_QKV, il, EM_BUF_X, EM_BUF_QKV);
        add(&s, EM_OP_ATTENTION, il, EM_BUF_QKV | EM_BUF_KV, EM_BUF_KV | EM_BUF_PARTS);
        add(&s, EM_OP_OUT_PROJ, il, EM_BUF_PARTS | EM_BUF_X, EM_BUF_X);
        if (d->layers[il].moe) {
            add(&s, EM_OP_ROUTE, il, EM_BUF_X, EM_BUF_ROUTER);
            add(&s, EM_OP_EXPERT_UP, il, EM_BUF_X | EM_BUF_ROUTER, EM_BUF_H);
            add(&s, EM_OP_EXPERT_DOWN, il, EM_BUF_H | EM_BUF_ROUTER | EM_BUF_X, EM_BUF_X);
        } else {
            add(&s, EM_OP_FFN_UP, il, EM_BUF_X, EM_BUF_H);
            add(&s, EM_OP_FFN_DOWN, il, EM_BUF_H | EM_BUF_X, EM_BUF_X);
        }
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
