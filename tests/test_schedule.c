/* The decode schedule of the persistent kernel (src/backend/schedule.h): what the builder makes of
 * a layer program, what it refuses, and that the checker rejects every schedule that would
 * let a block read what another has not finished writing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "backend/schedule.h"
#include "program_fixture.h"

#include <stdlib.h>

/* A copy of a program's operations, to edit. */
static em_program edited(const em_program *p) {
    em_program c = *p;
    c.ops = malloc(p->n_ops * sizeof *c.ops);
    assert_non_null(c.ops);
    memcpy(c.ops, p->ops, p->n_ops * sizeof *c.ops);
    c.cap_ops = p->n_ops;
    c.caches = NULL;
    c.n_caches = c.cap_caches = 0;
    return c;
}

/* tiny-llama's program: each layer is qkv, attention, out_proj, ffn_up, ffn_down; then the head. */
static void test_dense_layers(void **state) {
    (void)state;
    em_model *m = load_preset("tiny-llama");
    const uint32_t layers = m->desc.n_layer;
    em_schedule s;
    assert_null(em_schedule_build(&m->program, &s));
    assert_int_equal(s.n_ops, layers * 5 + 1);
    const em_op_kind per_layer[5] = {EM_OP_QKV, EM_OP_ATTENTION, EM_OP_OUT_PROJ, EM_OP_FFN_UP, EM_OP_FFN_DOWN};
    for (uint32_t il = 0; il < layers; il++)
        for (uint32_t k = 0; k < 5; k++) {
            const em_op *op = &s.ops[il * 5 + k];
            assert_int_equal(op->kind, per_layer[k]);
            assert_int_equal(op->layer, il);
            assert_true(op->barrier_after);
        }
    assert_int_equal(s.ops[s.n_ops - 1].kind, EM_OP_HEAD);
    assert_false(s.ops[s.n_ops - 1].barrier_after);
    assert_int_equal(s.n_barriers, layers * 5);
    assert_null(em_schedule_check(&s));
    em_schedule_free(&s);
    em_model_free(m);
}

/* A mixture-of-experts layer routes after the attention, and its experts' two products each end at
 * a barrier: the routing must be complete before any block picks its experts. Dense layers before
 * them (Flint's first layers) keep their gated unit. QK-norm (Qwen3) belongs to the attention
 * instruction. */
static void test_expert_layers(void **state) {
    (void)state;
    em_model *m = load_preset("tiny-flint");
    assert_int_equal(m->desc.n_layer, 4);
    em_schedule s;
    assert_null(em_schedule_build(&m->program, &s));
    assert_int_equal(s.n_ops, 2 * 5 + 2 * 6 + 1);
    const em_op_kind expected[] = {EM_OP_QKV,      EM_OP_ATTENTION,  EM_OP_OUT_PROJ, EM_OP_FFN_UP,   EM_OP_FFN_DOWN,
                                   EM_OP_QKV,      EM_OP_ATTENTION,  EM_OP_OUT_PROJ, EM_OP_FFN_UP,   EM_OP_FFN_DOWN,
                                   EM_OP_QKV,      EM_OP_ATTENTION,  EM_OP_OUT_PROJ, EM_OP_ROUTE,    EM_OP_EXPERT_UP,
                                   EM_OP_EXPERT_DOWN, EM_OP_QKV,     EM_OP_ATTENTION, EM_OP_OUT_PROJ, EM_OP_ROUTE,
                                   EM_OP_EXPERT_UP, EM_OP_EXPERT_DOWN, EM_OP_HEAD};
    for (uint32_t i = 0; i < s.n_ops; i++) assert_int_equal(s.ops[i].kind, expected[i]);
    assert_int_equal(s.ops[14].layer, 2);
    assert_string_equal(em_op_name(EM_OP_EXPERT_DOWN), "expert_down");
    assert_null(em_schedule_check(&s));
    /* experts chosen while other blocks still write the router's logits */
    s.ops[13].barrier_after = false;
    s.n_barriers--;
    assert_error_has(em_schedule_check(&s), "op 14 (expert_up, layer 2): reads buffers 0x40 before a barrier");
    em_schedule_free(&s);
    em_model_free(m);

    m = load_preset("tiny-qwen3moe");
    assert_null(em_schedule_build(&m->program, &s));
    assert_int_equal(s.n_ops, m->desc.n_layer * 6 + 1);
    em_schedule_free(&s);
    em_model_free(m);
}

/* What the kernel does not run is refused with the layer and the reason, and nothing is left
 * allocated. */
static void test_unsupported_layers(void **state) {
    (void)state;
    em_schedule s;
    em_model *m = load_preset("tiny-qwen3moe");
    em_program p = edited(&m->program);
    p.ops[find(&p, EM_PROGRAM_ROUTE, 1)].u.route.n_expert = 512;
    p.ops[find(&p, EM_PROGRAM_ROUTE, 1)].u.route.n_used = 8;
    assert_error_has(em_schedule_build(&p, &s), "layer 1: 8 of 512 experts a token");
    free(p.ops);

    p = edited(&m->program);
    p.ops[find(&p, EM_PROGRAM_ATTENTION, 0)].u.attention.head_dim = 48;
    p.ops[find(&p, EM_PROGRAM_ATTENTION, 0)].u.attention.head_dim_v = 48;
    assert_error_has(em_schedule_build(&p, &s), "layer 0: head sizes 48/48");
    free(p.ops);

    p = edited(&m->program);
    p.ops[find(&p, EM_PROGRAM_ATTENTION, 1)].u.attention.n_head_kv = 3;
    assert_error_has(em_schedule_build(&p, &s), "layer 1: 4 query heads over 3 key heads");
    free(p.ops);

    p = edited(&m->program);
    p.ops[find(&p, EM_PROGRAM_KV_WRITE, 0)].kind = EM_PROGRAM_GLU;
    assert_error_has(em_schedule_build(&p, &s), "layer 0, op 9 (glu): expected k and v into the cache");
    free(p.ops);
    em_model_free(m);

    m = load_preset("tiny-qwen3moe");
    p = with_shared_expert(&m->program, 1);
    assert_error_has(em_schedule_build(&p, &s), "layer 1: shared experts");
    assert_null(s.ops);
    free(p.ops);
    em_model_free(m);

    m = load_preset("tiny-gemma2"); /* post-norms */
    assert_error_has(em_schedule_build(&m->program, &s), "layer 0: post-norms");
    assert_null(s.ops);
    em_model_free(m);
}

/* Each corruption of a good schedule is one the kernel must never run. */
static void test_check_rejects(void **state) {
    (void)state;
    em_model *m = load_preset("tiny-llama");
    assert_true(m->desc.n_layer >= 2);
    em_schedule s;
    assert_null(em_schedule_build(&m->program, &s));
    /* attention would read q, k, v that other blocks are still computing */
    s.ops[5].barrier_after = false;
    s.n_barriers--;
    assert_error_has(em_schedule_check(&s), "op 6 (attention, layer 1): touches buffers 0x2");
    s.ops[5].barrier_after = true;
    s.n_barriers++;
    /* the next layer's products would read x while the down projection adds into it */
    s.ops[4].barrier_after = false;
    s.n_barriers--;
    assert_error_has(em_schedule_check(&s), "op 5 (qkv, layer 1): touches buffers 0x1");
    s.ops[4].barrier_after = true;
    s.n_barriers++;
    /* layers out of order */
    s.ops[5].layer = 2;
    assert_error_has(em_schedule_check(&s), "layer 1 after layer 2");
    s.ops[5].layer = 1;
    /* the barrier count the kernel advances its counter by must be the real one */
    s.n_barriers++;
    assert_error_has(em_schedule_check(&s), "barriers counted");
    s.n_barriers--;
    /* no logits */
    s.n_ops--;
    assert_error_has(em_schedule_check(&s), "no op writes the logits");
    s.n_ops++;
    /* the first read of a buffer before any barrier after its writer */
    s.ops[0].barrier_after = false;
    s.n_barriers--;
    assert_error_has(em_schedule_check(&s), "op 1 (attention, layer 0): reads buffers 0x2");
    s.ops[0].barrier_after = true;
    s.n_barriers++;
    /* an unknown instruction */
    s.ops[3].kind = EM_OP_KINDS;
    assert_error_has(em_schedule_check(&s), "op 3: kind");
    em_schedule_free(&s);
    em_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_layers),
        cmocka_unit_test(test_expert_layers),
        cmocka_unit_test(test_unsupported_layers),
        cmocka_unit_test(test_check_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
