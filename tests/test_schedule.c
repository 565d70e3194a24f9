/* The decode schedule of the persistent kernel (src/backend/schedule.h): what the builder makes of
 * a model description, what it refuses, and that the checker rejects every schedule that would
 * let a block read what another has not finished writing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "backend/schedule.h"
#include "model/model.h"

#define LAYERS 3

static em_layer_desc layers[LAYERS];

static em_model_desc dense(void) {
    for (int i = 0; i < LAYERS; i++)
        layers[i] = (em_layer_desc){.attn = EM_ATTN_FULL, .n_head = 8, .n_head_kv = 2, .head_dim = 64,
                                    .head_dim_v = 64, .attn_scale = 0.125f, .n_ff = 256};
    em_model_desc d = {.n_layer = LAYERS, .n_embd = 512, .n_vocab = 1000, .norm = EM_NORM_RMS, .norm_eps = 1e-5f,
                       .act = EM_ACT_SWIGLU, .layers = layers};
    return d;
}

static void assert_error_has(em_err err, const char *text) {
    assert_non_null(err);
    if (!strstr(em_err_message(err), text)) fail_msg("error \"%s\" does not say \"%s\"", em_err_message(err), text);
    em_err_free(err);
}

static void test_dense_layers(void **state) {
    (void)state;
    em_model_desc d = dense();
    em_schedule s;
    assert_null(em_schedule_build(&d, &s));
    assert_int_equal(s.n_ops, LAYERS * 5 + 1);
    const em_op_kind per_layer[5] = {EM_OP_QKV, EM_OP_ATTENTION, EM_OP_OUT_PROJ, EM_OP_FFN_UP, EM_OP_FFN_DOWN};
    for (uint32_t il = 0; il < LAYERS; il++)
        for (uint32_t k = 0; k < 5; k++) {
            const em_op *op = &s.ops[il * 5 + k];
            assert_int_equal(op->kind, per_layer[k]);
            assert_int_equal(op->layer, il);
            assert_true(op->barrier_after);
        }
    assert_int_equal(s.ops[s.n_ops - 1].kind, EM_OP_HEAD);
    assert_false(s.ops[s.n_ops - 1].barrier_after);
    assert_int_equal(s.n_barriers, LAYERS * 5);
    assert_null(em_schedule_check(&s));
    em_schedule_free(&s);
}

/* A mixture-of-experts layer routes after the attention, and its experts' two products each end at
 * a barrier: the routing must be complete before any block picks its experts. Dense layers between
 * (Flint's first layers) keep their gated unit. */
static void test_expert_layers(void **state) {
    (void)state;
    em_model_desc d = dense();
    for (int i = 1; i < LAYERS; i++)
        layers[i].moe = true, layers[i].n_expert = 64, layers[i].n_expert_used = 6, layers[i].n_ff = 128;
    em_schedule s;
    assert_null(em_schedule_build(&d, &s));
    assert_int_equal(s.n_ops, 5 + 2 * 6 + 1);
    const em_op_kind expected[] = {EM_OP_QKV,      EM_OP_ATTENTION, EM_OP_OUT_PROJ, EM_OP_FFN_UP,    EM_OP_FFN_DOWN,
                                   EM_OP_QKV,      EM_OP_ATTENTION, EM_OP_OUT_PROJ, EM_OP_ROUTE,     EM_OP_EXPERT_UP,
                                   EM_OP_EXPERT_DOWN, EM_OP_QKV,    EM_OP_ATTENTION, EM_OP_OUT_PROJ, EM_OP_ROUTE,
                                   EM_OP_EXPERT_UP, EM_OP_EXPERT_DOWN, EM_OP_HEAD};
    for (uint32_t i = 0; i < s.n_ops; i++) assert_int_equal(s.ops[i].kind, expected[i]);
    assert_int_equal(s.ops[9].layer, 1);
    assert_string_equal(em_op_name(EM_OP_EXPERT_DOWN), "expert_down");
    assert_null(em_schedule_check(&s));
    /* experts chosen while other blocks still write the router's logits */
    s.ops[8].barrier_after = false;
    s.n_barriers--;
    assert_error_has(em_schedule_check(&s), "op 9 (expert_up, layer 1): reads buffers 0x40 before a barrier");
    em_schedule_free(&s);
}

static void test_unsupported_layers(void **state) {
    (void)state;
    em_schedule s;
    em_model_desc d = dense();
    layers[1].moe = true, layers[1].n_expert = 8, layers[1].n_expert_used = 2, layers[1].n_ff_shared = 64;
    assert_error_has(em_schedule_build(&d, &s), "layer 1: shared experts");
    d = dense();
    layers[2].moe = true, layers[2].n_expert = 512, layers[2].n_expert_used = 8;
    assert_error_has(em_schedule_build(&d, &s), "layer 2: 8 of 512 experts a token");
    d = dense();
    layers[2].post_ffn_norm = true;
    assert_error_has(em_schedule_build(&d, &s), "layer 2: post-norms");
    d = dense();
    layers[0].head_dim = layers[0].head_dim_v = 48;
    assert_error_has(em_schedule_build(&d, &s), "layer 0: head sizes 48/48");
    d = dense();
    layers[1].n_head_kv = 3;
    assert_error_has(em_schedule_build(&d, &s), "layer 1: 8 query heads over 3 key heads");
    assert_null(s.ops); /* nothing is left allocated by a refusal */
}

/* Each corruption of a good schedule is one the kernel must never run. */
static void test_check_rejects(void **state) {
    (void)state;
    em_model_desc d = dense();
    em_schedule s;
    assert_null(em_schedule_build(&d, &s));
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
