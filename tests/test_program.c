/* The layer program (src/program/program.h) and the model's builder (src/model/builder.c): the
 * operations each family's block compiles to, and a checker that refuses every program that would
 * read a buffer before it is written, at another width, or from weights of the wrong shape. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "program_fixture.h"

/* The kinds of the operations of one layer, as a string ("norm matmul matmul ..."). */
static void layer_kinds(const em_program *p, uint32_t layer, char *buf, size_t size) {
    buf[0] = 0;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        if (p->ops[i].layer != layer) continue;
        const size_t used = strlen(buf);
        snprintf(buf + used, size - used, "%s%s", used ? " " : "", em_program_op_name(p->ops[i].kind));
    }
}

static void assert_layer(const em_program *p, uint32_t layer, const char *want) {
    char got[512];
    layer_kinds(p, layer, got, sizeof got);
    if (strcmp(got, want)) fail_msg("layer %u:\n  got  %s\n  want %s", layer, got, want);
}

#define ATTENTION "matmul matmul matmul rope rope kv_write attention matmul"
#define QK_NORM_ATTENTION "matmul matmul matmul head_norm rope head_norm rope kv_write attention matmul"
#define GATED_UNIT "matmul matmul glu matmul"

/* Each family's block as operations: the traits of the registry become operations and parameters. */
static void test_family_blocks(void **state) {
    (void)state;
    const struct {
        const char *preset;
        const char *layer0;
    } cases[] = {
        {"tiny-llama", "norm " ATTENTION " add norm " GATED_UNIT " add"},
        {"tiny-qwen3", "norm " QK_NORM_ATTENTION " add norm " GATED_UNIT " add"},
        {"tiny-gemma2", "norm " ATTENTION " norm add norm " GATED_UNIT " norm add"},
        {"tiny-qwen3moe", "norm " QK_NORM_ATTENTION " add norm matmul route experts add"},
        {"tiny-mixtral", "norm " ATTENTION " add norm matmul route experts add"},
        {"tiny-gpt-oss", "norm " ATTENTION " add norm matmul route experts add"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        em_model *m = load_preset(cases[i].preset);
        const em_program *p = &m->program;
        assert_null(em_program_check(p));
        assert_int_equal(p->ops[0].kind, EM_PROGRAM_EMBED);
        assert_int_equal(p->ops[p->n_ops - 1].kind, EM_PROGRAM_OUTPUT);
        assert_int_equal(p->n_caches, m->desc.n_layer);
        assert_int_equal(p->n_vocab, m->desc.n_vocab);
        for (uint32_t il = 0; il < m->desc.n_layer; il++)
            if (!m->desc.layers[il].moe == !m->desc.layers[0].moe) assert_layer(p, il, cases[i].layer0);
        em_model_free(m);
    }
}

/* Traits that are parameters: Gemma 2's soft-caps and sliding windows, Qwen2's biases, the router. */
static void test_parameters(void **state) {
    (void)state;
    em_model *m = load_preset("tiny-gemma2");
    const em_program *p = &m->program;
    uint32_t windows = 0, full = 0;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const em_program_op *op = &p->ops[i];
        if (op->kind == EM_PROGRAM_ATTENTION) {
            const em_layer_desc *ld = &m->desc.layers[op->layer];
            assert_true(op->u.attention.softcap == ld->attn_softcap && ld->attn_softcap > 0);
            assert_true(op->u.attention.scale == ld->attn_scale);
            if (op->u.attention.window) {
                assert_int_equal(ld->attn, EM_ATTN_SLIDING);
                assert_int_equal(op->u.attention.window, ld->window);
                windows++;
            } else {
                assert_int_equal(ld->attn, EM_ATTN_FULL);
                full++;
            }
        }
        if (op->kind == EM_PROGRAM_OUTPUT) assert_true(op->u.output.softcap == m->desc.final_softcap);
    }
    assert_true(windows > 0 && full > 0);
    em_model_free(m);

    m = load_preset("tiny-qwen2");
    p = &m->program;
    uint32_t biased = 0;
    for (uint32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == EM_PROGRAM_MATMUL && p->ops[i].u.matmul.bias) biased++;
    assert_int_equal(biased, 3 * m->desc.n_layer); /* q, k and v */
    em_model_free(m);

    m = load_preset("tiny-qwen3moe");
    p = &m->program;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        if (p->ops[i].kind != EM_PROGRAM_ROUTE) continue;
        const em_layer_desc *ld = &m->desc.layers[p->ops[i].layer];
        assert_int_equal(p->ops[i].u.route.n_expert, ld->n_expert);
        assert_int_equal(p->ops[i].u.route.n_used, ld->n_expert_used);
        assert_int_equal(p->ops[i].u.route.renormalize, ld->renormalize);
    }
    char line[160];
    em_program_describe_op(p, 0, line, sizeof line);
    assert_string_equal(line, "embed x = [32000x128 F32][token] x 1");
    em_model_free(m);

    /* gpt-oss: every projection biased, a sink per head, even layers sliding, the router's bias and
     * softmax over its chosen four, biased experts with the clamped SwiGLU */
    m = load_preset("tiny-gpt-oss");
    p = &m->program;
    windows = full = biased = 0;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const em_program_op *op = &p->ops[i];
        const em_layer_weights *lw = op->layer < m->desc.n_layer ? &m->w.layers[op->layer] : NULL;
        if (op->kind == EM_PROGRAM_MATMUL && op->u.matmul.bias) biased++;
        if (op->kind == EM_PROGRAM_ATTENTION) {
            assert_ptr_equal(op->u.attention.sinks, lw->attn_sinks);
            assert_non_null(op->u.attention.sinks);
            assert_int_equal(op->u.attention.window, op->layer % 2 == 0 ? 8 : 0);
            if (op->u.attention.window) windows++;
            else full++;
        }
        if (op->kind == EM_PROGRAM_ROUTE) {
            assert_int_equal(op->u.route.gating, EM_GATING_SOFTMAX_CHOSEN);
            assert_false(op->u.route.renormalize);
            assert_ptr_equal(p->ops[i - 1].u.matmul.bias, lw->gate_inp_bias);
        }
        if (op->kind == EM_PROGRAM_EXPERTS) {
            const em_program_experts *x = &op->u.experts;
            assert_int_equal(x->act, EM_ACT_SWIGLU_CLAMPED);
            assert_true(x->limit == 7.0f && x->alpha == 1.702f);
            assert_ptr_equal(x->gate_bias, lw->gate_exps_bias);
            assert_ptr_equal(x->up_bias, lw->up_exps_bias);
            assert_ptr_equal(x->down_bias, lw->down_exps_bias);
            assert_non_null(x->down_bias);
        }
    }
    assert_int_equal(windows, 2);
    assert_int_equal(full, 2);
    assert_int_equal(biased, 5 * m->desc.n_layer); /* q, k, v, o and the router */
    em_program_describe_op(p, find(p, EM_PROGRAM_EXPERTS, 0), line, sizeof line);
    assert_string_equal(line, "layer 0 experts out = chosen by choices of [128x128 F32] clamped silu(xn), biased");
    em_program_describe_op(p, find(p, EM_PROGRAM_ROUTE, 0), line, sizeof line);
    assert_string_equal(line, "layer 0 route choices = top 2 of 8 by softmax of the chosen(router)");
    em_model_free(m);
}

/* A copy of the model's program to break. */
static em_program copy_program(const em_program *p) {
    em_program c = *p;
    c.ops = malloc(p->n_ops * sizeof *c.ops);
    c.caches = malloc(p->n_caches * sizeof *c.caches);
    c.states = malloc((p->n_states ? p->n_states : 1) * sizeof *c.states);
    assert_non_null(c.ops);
    assert_non_null(c.caches);
    assert_non_null(c.states);
    memcpy(c.ops, p->ops, p->n_ops * sizeof *c.ops);
    memcpy(c.caches, p->caches, p->n_caches * sizeof *c.caches);
    if (p->n_states) memcpy(c.states, p->states, p->n_states * sizeof *c.states);
    c.cap_ops = p->n_ops;
    c.cap_caches = p->n_caches;
    c.cap_states = p->n_states;
    return c;
}

static void swap_ops(em_program *p, uint32_t a, uint32_t b) {
    const em_program_op t = p->ops[a];
    p->ops[a] = p->ops[b];
    p->ops[b] = t;
}

/* Every broken program is refused, and the message names the operation and the rule. */
static void test_checker_refuses(void **state) {
    (void)state;
    em_model *m = load_preset("tiny-qwen3moe");
    const em_program *good = &m->program;
    em_program p;

    p = copy_program(good); /* attention before its layer's keys and values are written */
    swap_ops(&p, find(&p, EM_PROGRAM_KV_WRITE, 1), find(&p, EM_PROGRAM_ATTENTION, 1));
    assert_error_has(em_program_check(&p), "(layer 1 attention): reads cache 1 before a kv_write");
    em_program_free(&p);

    p = copy_program(good); /* the experts before the route that chooses them */
    swap_ops(&p, find(&p, EM_PROGRAM_ROUTE, 0), find(&p, EM_PROGRAM_EXPERTS, 0));
    assert_error_has(em_program_check(&p), "(layer 0 experts): reads choices choices before a route");
    em_program_free(&p);

    p = copy_program(good); /* the output projection reading a buffer nothing has written yet */
    p.ops[find(&p, EM_PROGRAM_ATTENTION, 0) + 1].src = buffer_named(&p, "gate");
    assert_error_has(em_program_check(&p), "(layer 0 matmul): reads gate before anything writes it");
    em_program_free(&p);

    p = copy_program(good); /* a product whose weight does not match its input: k from the router's logits */
    p.ops[find(&p, EM_PROGRAM_MATMUL, 1) + 1].src = p.ops[find(&p, EM_PROGRAM_ROUTE, 0)].src;
    assert_error_has(em_program_check(&p), "(layer 1 matmul): reads router at width 128, last written at 8");
    em_program_free(&p);

    p = copy_program(good); /* a router that chooses more experts than it has */
    p.ops[find(&p, EM_PROGRAM_ROUTE, 1)].u.route.n_used = 9;
    assert_error_has(em_program_check(&p), "(layer 1 route): chooses 9 of 8 experts");
    em_program_free(&p);

    p = copy_program(good); /* a row wider than its buffer was declared */
    p.buffers[p.ops[find(&p, EM_PROGRAM_ATTENTION, 0)].dst].width = 64;
    assert_error_has(em_program_check(&p), "writes attn at width 128, declared 64");
    em_program_free(&p);

    p = copy_program(good); /* attention over a cache of other heads */
    p.ops[find(&p, EM_PROGRAM_ATTENTION, 0)].u.attention.n_head_kv = 1;
    assert_error_has(em_program_check(&p), "a cache of 64/64 floats a position for these heads");
    em_program_free(&p);

    p = copy_program(good); /* no output at the end */
    p.n_ops--;
    assert_error_has(em_program_check(&p), "does not end with output");
    em_program_free(&p);

    p = copy_program(good); /* a missing weight */
    em_weight missing = *p.ops[find(&p, EM_PROGRAM_MATMUL, 0)].u.matmul.weight;
    missing.data = NULL;
    p.ops[find(&p, EM_PROGRAM_MATMUL, 0)].u.matmul.weight = &missing;
    assert_error_has(em_program_check(&p), "(layer 0 matmul): the weight is missing");
    em_program_free(&p);

    em_model_free(m);

    m = load_preset("tiny-gpt-oss");
    good = &m->program;
    p = copy_program(good); /* a clamped SwiGLU without its clip */
    p.ops[find(&p, EM_PROGRAM_EXPERTS, 1)].u.experts.limit = 0.0f;
    assert_error_has(em_program_check(&p), "(layer 1 experts): a clamped SwiGLU with limit 0 and slope 1.702");
    em_program_free(&p);

    p = copy_program(good); /* a gating the backends do not know */
    p.ops[find(&p, EM_PROGRAM_ROUTE, 0)].u.route.gating = (em_gating)7;
    assert_error_has(em_program_check(&p), "(layer 0 route): gating 7");
    em_program_free(&p);
    em_model_free(m);
}

/* Qwen3.5's hybrid block: three Gated DeltaNet layers, each with a recurrent state of its own,
 * then a gated attention layer; the pre-FFN norm is the file's post_attention_norm. */
static void test_hybrid_blocks(void **state) {
    (void)state;
    em_model *m = load_preset("tiny-qwen35");
    const em_program *p = &m->program;
    assert_null(em_program_check(p));
    const char *delta_net = "norm matmul matmul matmul matmul delta_net gated_norm matmul add norm " GATED_UNIT " add";
    for (uint32_t il = 0; il < 3; il++) assert_layer(p, il, delta_net);
    assert_layer(p, 3, "norm matmul split_gate matmul matmul head_norm rope head_norm rope kv_write attention "
                       "sigmoid_gate matmul add norm " GATED_UNIT " add");
    assert_int_equal(p->n_caches, 1);
    assert_int_equal(p->caches[0].layer, 3);
    assert_int_equal(p->n_states, 3);
    /* tiny-qwen35: conv 4 over 2·2·32 + 4·32 channels, 4 value heads of 32 x 32 */
    const uint32_t conv_dim = 2 * 2 * 32 + 4 * 32;
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(p->states[i].layer, i);
        assert_int_equal(p->states[i].conv_floats, 3 * conv_dim);
        assert_int_equal(p->states[i].recurrent_floats, 4 * 32 * 32);
    }
    assert_int_equal(em_program_state_floats(p), 3 * (3 * conv_dim + 4 * 32 * 32));
    assert_int_equal(em_program_kv_floats(p), 2 * 2 * 64);
    const em_program_delta_net *d = &p->ops[find(p, EM_PROGRAM_DELTA_NET, 1)].u.delta_net;
    assert_true(d->v_tiled);
    assert_int_equal(d->state, 1);
    assert_true(d->conv == m->w.layers[1].ssm_conv && d->a == m->w.layers[1].ssm_a);
    assert_true(m->w.layers[0].ffn_norm && !m->w.layers[0].post_attn_norm);
    const em_program_op *rope = &p->ops[find(p, EM_PROGRAM_ROPE, 3)];
    assert_int_equal(rope->u.heads.rope->n_rot, 16);
    assert_int_equal(rope->u.heads.head_dim, 64);
    char line[160];
    em_program_describe_op(p, find(p, EM_PROGRAM_DELTA_NET, 0), line, sizeof line);
    assert_string_equal(line, "layer 0 delta_net delta = conv4(mixed) with state 0: 4/2 heads x 32/32, tiled");

    em_program c = copy_program(p); /* a state of the wrong size */
    c.states[0].recurrent_floats--;
    assert_error_has(em_program_check(&c), "(layer 0 delta_net): state 0 holds 768 + 4095 floats, these heads need 768 + 4096");
    em_program_free(&c);

    c = copy_program(p); /* two layers updating one state */
    c.ops[find(&c, EM_PROGRAM_DELTA_NET, 1)].u.delta_net.state = 0;
    assert_error_has(em_program_check(&c), "(layer 1 delta_net): state 0 is updated by two operations");
    em_program_free(&c);

    c = copy_program(p); /* the step before its beta is written */
    swap_ops(&c, find(&c, EM_PROGRAM_DELTA_NET, 0), find(&c, EM_PROGRAM_DELTA_NET, 0) - 2);
    assert_error_has(em_program_check(&c), "(layer 0 delta_net): reads beta before anything writes it");
    em_program_free(&c);

    c = copy_program(p); /* value heads that do not divide among the key heads */
    c.ops[find(&c, EM_PROGRAM_DELTA_NET, 2)].u.delta_net.n_head_k = 3;
    assert_error_has(em_program_check(&c), "(layer 2 delta_net): 4 value heads over 3 key heads");
    em_program_free(&c);

    c = copy_program(p); /* the gate multiplied in before the split that writes it */
    swap_ops(&c, find(&c, EM_PROGRAM_SPLIT_GATE, 3), find(&c, EM_PROGRAM_SIGMOID_GATE, 3));
    assert_error_has(em_program_check(&c), "(layer 3 sigmoid_gate): reads attn before anything writes it");
    em_program_free(&c);
    em_model_free(m);
}

/* Qwen3.5 MoE's feed-forward: routed experts and a shared expert that its own gate scales,
 * shared ⊙= σ(w_sᵀ xn), one gate a token for the whole row. */
static void test_gated_shared_expert(void **state) {
    (void)state;
    em_model *m = load_preset("tiny-qwen35moe");
    const em_program *p = &m->program;
    assert_layer(p, 0, "norm matmul matmul matmul matmul delta_net gated_norm matmul add norm matmul route experts "
                       GATED_UNIT " matmul sigmoid_gate add add");
    assert_layer(p, 3, "norm matmul split_gate matmul matmul head_norm rope head_norm rope kv_write attention "
                       "sigmoid_gate matmul add norm matmul route experts " GATED_UNIT " matmul sigmoid_gate add add");
    char line[160];
    for (uint32_t il = 0; il < 4; il++) {
        uint32_t gate = 0; /* the layer's last sigmoid_gate (layer 3's attention has one before it) */
        for (uint32_t i = 0; i < p->n_ops; i++)
            if (p->ops[i].layer == il && p->ops[i].kind == EM_PROGRAM_SIGMOID_GATE) gate = i;
        const em_program_op *op = &p->ops[gate];
        assert_true(op->u.sigmoid_gate.per_token);
        assert_int_equal(op->u.sigmoid_gate.width, 128);
        assert_int_equal(op->dst, buffer_named(p, "shared"));
        assert_ptr_equal(p->ops[gate - 1].u.matmul.weight, &m->w.layers[il].gate_inp_shexp);
        assert_int_equal(m->w.layers[il].gate_inp_shexp.rows, 1);
        assert_int_equal(m->w.layers[il].gate_inp_shexp.cols, 128);
    }
    assert_false(p->ops[find(p, EM_PROGRAM_SIGMOID_GATE, 3)].u.sigmoid_gate.per_token);
    em_program_describe_op(p, find(p, EM_PROGRAM_SIGMOID_GATE, 0), line, sizeof line);
    assert_string_equal(line, "layer 0 sigmoid_gate shared *= sigmoid(shared_gate), one gate per token");
    assert_int_equal(p->buffers[buffer_named(p, "shared_gate")].width, 1);

    em_program c = copy_program(p); /* a gate per value where the product gives one per token */
    c.ops[find(&c, EM_PROGRAM_SIGMOID_GATE, 1)].u.sigmoid_gate.per_token = false;
    assert_error_has(em_program_check(&c), "(layer 1 sigmoid_gate): reads shared_gate at width 128");
    em_program_free(&c);
    em_model_free(m);
}

/* The program read as blocks: each layer an attention block, then a gated unit or experts, with
 * the parameters of the operations each covers; a program whose data flow is not a block's is
 * refused, naming the layer and the operation. */
static void test_blocks(void **state) {
    (void)state;
    em_block *blocks;
    uint32_t n;
    em_model *m = load_preset("tiny-llama");
    const em_program *p = &m->program;
    assert_null(em_program_blocks(p, &blocks, &n));
    assert_int_equal(n, 2 * p->n_layer);
    for (uint32_t i = 0; i < n; i++) {
        const em_block *b = &blocks[i];
        assert_int_equal(b->layer, i / 2);
        assert_int_equal(b->kind, i % 2 ? EM_BLOCK_GATED_UNIT : EM_BLOCK_ATTENTION);
        assert_ptr_equal(b->norm, &p->ops[find(p, EM_PROGRAM_NORM, b->layer) + (i % 2 ? 10 : 0)].u.norm);
        assert_null(b->post_norm);
    }
    const uint32_t q = find(p, EM_PROGRAM_MATMUL, 1);
    assert_ptr_equal(blocks[2].q, &p->ops[q].u.matmul);
    assert_ptr_equal(blocks[2].o, &p->ops[find(p, EM_PROGRAM_ATTENTION, 1) + 1].u.matmul);
    assert_ptr_equal(blocks[2].attention, &p->ops[find(p, EM_PROGRAM_ATTENTION, 1)].u.attention);
    assert_ptr_equal(blocks[2].rope, p->ops[find(p, EM_PROGRAM_ROPE, 1)].u.heads.rope);
    assert_null(blocks[2].q_norm);
    assert_int_equal(blocks[2].first_op, find(p, EM_PROGRAM_NORM, 1));
    assert_int_equal(blocks[2].n_ops, 10); /* norm, q, k, v, rope ×2, kv_write, attention, o, add */
    assert_ptr_equal(blocks[3].down->weight, &m->w.layers[1].ffn_down);
    assert_int_equal(blocks[3].act, EM_ACT_SWIGLU);
    free(blocks);

    em_program edited = copy_program(p); /* attention over k's rows, not q's */
    edited.ops[find(&edited, EM_PROGRAM_ATTENTION, 1)].src = buffer_named(&edited, "k");
    assert_error_has(em_program_blocks(&edited, &blocks, &n), "layer 1, op 24 (attention): expected the attention of q");
    assert_null(blocks);
    em_program_free(&edited);

    edited = copy_program(p); /* k's rotation applied to q a second time */
    edited.ops[find(&edited, EM_PROGRAM_ROPE, 0) + 1].dst = buffer_named(&edited, "q");
    assert_error_has(em_program_blocks(&edited, &blocks, &n), "layer 0, op 6 (rope): q and k rotated differently");
    em_program_free(&edited);

    edited = copy_program(p); /* the residual add of the wrong buffer */
    edited.ops[find(&edited, EM_PROGRAM_ADD, 0)].src = buffer_named(&edited, "xn");
    assert_error_has(em_program_blocks(&edited, &blocks, &n), "layer 0, op 10 (add): expected the residual add");
    em_program_free(&edited);
    em_model_free(m);

    m = load_preset("tiny-gemma2"); /* post-norms and soft-caps */
    assert_null(em_program_blocks(&m->program, &blocks, &n));
    assert_ptr_equal(blocks[0].post_norm->weight, m->w.layers[0].post_attn_norm);
    assert_ptr_equal(blocks[1].post_norm->weight, m->w.layers[0].post_ffn_norm);
    assert_float_equal(blocks[0].attention->softcap, 50.0f, 0.0f);
    assert_int_equal(blocks[1].act, EM_ACT_GEGLU);
    free(blocks);
    em_model_free(m);

    m = load_preset("tiny-qwen3moe"); /* routed experts, then with a shared one beside them */
    assert_null(em_program_blocks(&m->program, &blocks, &n));
    assert_int_equal(blocks[3].kind, EM_BLOCK_EXPERTS);
    assert_int_equal(blocks[3].route->n_expert, 8);
    assert_ptr_equal(blocks[3].experts->down, &m->w.layers[1].down_exps);
    assert_ptr_equal(blocks[3].router->weight, &m->w.layers[1].gate_inp);
    assert_null(blocks[3].gate);
    assert_non_null(blocks[0].q_norm);
    free(blocks);
    edited = with_shared_expert(&m->program, 1);
    assert_null(em_program_blocks(&edited, &blocks, &n));
    assert_ptr_equal(blocks[3].gate->weight, &m->w.layers[1].gate_exps);
    assert_null(blocks[1].gate);
    free(blocks);
    /* the shared unit scaled by σ(w_sᵀ xn), as qwen35moe's is: no kernel computes it, so no block */
    em_program gated = edited;
    gated.ops = malloc((edited.n_ops + 2) * sizeof *gated.ops);
    assert_non_null(gated.ops);
    const uint32_t add = find(&edited, EM_PROGRAM_EXPERTS, 1) + 5, router = buffer_named(&edited, "router");
    const uint8_t xn = edited.ops[add - 5].src, shared = buffer_named(&edited, "shared");
    memcpy(gated.ops, edited.ops, add * sizeof *gated.ops);
    gated.ops[add] = (em_program_op){.kind = EM_PROGRAM_MATMUL, .layer = 1, .dst = (uint8_t)router, .src = xn,
                                     .u.matmul.weight = &m->w.layers[1].gate_inp};
    gated.ops[add + 1] = (em_program_op){.kind = EM_PROGRAM_SIGMOID_GATE, .layer = 1, .dst = shared, .src = (uint8_t)router,
                                         .u.sigmoid_gate = {.width = 128, .per_token = true}};
    memcpy(&gated.ops[add + 2], &edited.ops[add], (edited.n_ops - add) * sizeof *gated.ops);
    gated.n_ops = gated.cap_ops = edited.n_ops + 2;
    assert_error_has(em_program_blocks(&gated, &blocks, &n),
                     "layer 1, op 38 (matmul): a shared expert scaled by its own sigmoid gate (ffn_gate_inp_shexp)");
    free(gated.ops);
    free(edited.ops);
    em_model_free(m);

    m = load_preset("tiny-qwen35"); /* a Gated DeltaNet layer is no block yet: refused, not misread */
    assert_error_has(em_program_blocks(&m->program, &blocks, &n), "blocks: layer 0, op 5 (matmul): expected k and v");
    em_model_free(m);
}


#define GEMMA4_ATTENTION "norm matmul matmul matmul head_norm rope head_norm rope head_norm kv_write attention matmul norm add"
#define GEMMA4_SHARED_ATTENTION "norm matmul head_norm rope attention matmul norm add"
#define GEMMA4_DENSE "norm " GATED_UNIT " norm add"
#define GEMMA4_LAYER_INPUT "matmul slice glu matmul norm add"

/* Gemma 4's dense layout (31B): plain norms, attention scale 1 over QK-norm, V normalized without a
 * weight, full layers with their own head size, KV heads and proportional RoPE, and K = V (the
 * values from the key projection) where they have no V projection; every layer scaled at its end. */
static void test_gemma4_blocks(void **state) {
    (void)state;
    em_model *m = load_preset("tiny-gemma4");
    const em_program *p = &m->program;
    assert_null(em_program_check(p));
    for (uint32_t il = 0; il < m->desc.n_layer; il++) assert_layer(p, il, GEMMA4_ATTENTION " " GEMMA4_DENSE " scale");
    assert_int_equal(p->n_caches, 6);
    for (uint32_t il = 0; il < m->desc.n_layer; il++) {
        const bool full = il == 2 || il == 5;
        const em_layer_weights *lw = &m->w.layers[il];
        const uint32_t q = find(p, EM_PROGRAM_MATMUL, il);
        assert_ptr_equal(p->ops[q + 1].u.matmul.weight, &lw->wk);
        assert_ptr_equal(p->ops[q + 2].u.matmul.weight, full ? &lw->wk : &lw->wv); /* K = V in the full layers */
        const em_program_op *v_norm = &p->ops[q + 7];
        assert_int_equal(v_norm->kind, EM_PROGRAM_HEAD_NORM);
        assert_int_equal(v_norm->dst, p->ops[q + 2].dst);
        assert_null(v_norm->u.heads.norm.weight);
        assert_int_equal(v_norm->u.heads.n_head, full ? 1 : 2);
        assert_int_equal(v_norm->u.heads.head_dim, full ? 64 : 32);
        const em_program_attention *a = &p->ops[find(p, EM_PROGRAM_ATTENTION, il)].u.attention;
        assert_float_equal(a->scale, 1.0f, 0.0f);
        assert_int_equal(a->window, full ? 0 : 8);
        assert_int_equal(a->head_dim, full ? 64 : 32);
        assert_int_equal(a->n_head_kv, full ? 1 : 2);
        const em_rope *rope = p->ops[find(p, EM_PROGRAM_ROPE, il)].u.heads.rope;
        assert_int_equal(rope->n_rot, full ? 64 : 32);
        assert_float_equal(rope->theta, full ? 1e6f : 1e4f, 0.0f);
        if (full) { /* proportional: the first quarter of the pairs rotates, the others are divided by 1e30 */
            for (uint32_t i = 0; i < 32; i++) assert_float_equal(rope->freq_factors[i], i < 8 ? 1.0f : 1e30f, 0.0f);
        } else {
            assert_null(rope->freq_factors);
        }
        const em_program_op *scale = &p->ops[find(p, EM_PROGRAM_SCALE, il)];
        assert_int_equal(scale->dst, p->ops[0].dst);
        assert_float_equal(scale->u.scale.factor, lw->output_scale[0], 0.0f);
    }
    assert_float_equal(p->ops[p->n_ops - 1].u.output.softcap, 30.0f, 0.0f);
    assert_int_equal(em_program_kv_floats(p), 6 * 2 * 64);
    char line[160];
    em_program_describe_op(p, find(p, EM_PROGRAM_HEAD_NORM, 0) + 4, line, sizeof line);
    assert_string_equal(line, "layer 0 head_norm v: 2 heads x 32, no weight");
    em_block *blocks;
    uint32_t n;
    assert_error_has(em_program_blocks(p, &blocks, &n),
                     "blocks: layer 0, op 9 (head_norm): a head norm without a weight, which no block takes");
    assert_null(blocks);
    em_model_free(m);
}

/* Gemma 4's MoE layout (26B-A4B): a dense unit and the experts side by side on the same x, each on
 * its own norms, routed on a norm of x scaled per column (the router's scale over sqrt(n_embd)),
 * the chosen weights times each expert's factor, gate and up read from one stack. */
static void test_gemma4_moe_blocks(void **state) {
    (void)state;
    em_model *m = load_preset("tiny-gemma4-moe");
    const em_program *p = &m->program;
    assert_null(em_program_check(p));
    for (uint32_t il = 0; il < m->desc.n_layer; il++)
        assert_layer(p, il, GEMMA4_ATTENTION " norm " GATED_UNIT " norm norm matmul route norm experts norm add norm add scale");
    const em_layer_weights *lw = &m->w.layers[1];
    const uint32_t route = find(p, EM_PROGRAM_ROUTE, 1);
    assert_ptr_equal(p->ops[route - 2].u.norm.weight, lw->router_norm);
    assert_ptr_equal(p->ops[route + 1].u.norm.weight, lw->pre_ffn_norm_2);
    assert_ptr_equal(p->ops[route].u.route.expert_scale, lw->expert_scale);
    assert_true(p->ops[route].u.route.renormalize);
    assert_int_equal(p->ops[route].u.route.gating, EM_GATING_SOFTMAX);
    const em_program_experts *x = &p->ops[find(p, EM_PROGRAM_EXPERTS, 1)].u.experts;
    assert_int_equal(x->act, EM_ACT_GEGLU);
    /* ffn_gate_up_exps: each expert's 64 gate rows, then its 64 up rows */
    assert_int_equal(x->gate->rows, 64);
    assert_int_equal(x->gate->mat_bytes, 2 * 64 * x->gate->row_bytes);
    assert_int_equal(x->up->mat_bytes, x->gate->mat_bytes);
    assert_ptr_equal(x->up->data, (const uint8_t *)x->gate->data + 64 * x->gate->row_bytes);
    assert_ptr_equal(em_weight_matrix(x->up, 3), (const uint8_t *)x->gate->data + (2 * 3 + 1) * 64 * x->gate->row_bytes);
    /* the router's input norm: its scale over sqrt(128), from the file's ffn_gate_inp.scale */
    const em_gguf_tensor *t = em_gguf_find_tensor(m->gguf, "blk.1.ffn_gate_inp.scale");
    assert_non_null(t);
    for (uint32_t i = 0; i < 128; i++)
        assert_float_equal(lw->router_norm[i], ((const float *)t->data)[i] / sqrtf(128.0f), 1e-6f);
    /* a file without final_logit_softcapping is capped at 30, as llama.cpp and transformers assume */
    assert_float_equal(p->ops[p->n_ops - 1].u.output.softcap, 30.0f, 0.0f);
    char line[160];
    em_program_describe_op(p, route, line, sizeof line);
    assert_string_equal(line, "layer 1 route choices = top 2 of 8 by softmax(router), renormalized, scaled per expert");
    em_block *blocks;
    uint32_t n;
    assert_error_has(em_program_blocks(p, &blocks, &n), "blocks: layer 0, op 9 (head_norm)");
    em_model_free(m);
}

/* Gemma 4's small models: per-layer inputs computed once from the token and its embedding, each
 * layer's slice gating a projection added to x; the last layers attend over the cache of the last
 * earlier layer of their kind, computing queries alone and keeping no cache of their own. */
static void test_gemma4_per_layer_blocks(void **state) {
    (void)state;
    em_model *m = load_preset("tiny-gemma4-ple");
    const em_program *p = &m->program;
    assert_null(em_program_check(p));
    const char *prologue[] = {"embed", "embed", "matmul", "scale", "head_norm", "add", "scale"};
    for (uint32_t i = 0; i < 7; i++) {
        assert_string_equal(em_program_op_name(p->ops[i].kind), prologue[i]);
        assert_int_equal(p->ops[i].layer, EM_PROGRAM_NO_LAYER);
    }
    assert_float_equal(p->ops[1].u.embed.scale, sqrtf(32.0f), 0.0f);
    assert_ptr_equal(p->ops[1].u.embed.table, &m->w.per_layer_embd);
    assert_float_equal(p->ops[3].u.scale.factor, 1.0f / sqrtf(128.0f), 0.0f);
    assert_int_equal(p->ops[4].u.heads.n_head, 8);
    assert_int_equal(p->ops[4].u.heads.head_dim, 32);
    assert_float_equal(p->ops[6].u.scale.factor, 1.0f / sqrtf(2.0f), 0.0f);
    for (uint32_t il = 0; il < 8; il++)
        assert_layer(p, il, il < 4 ? GEMMA4_ATTENTION " " GEMMA4_DENSE " " GEMMA4_LAYER_INPUT " scale"
                                   : GEMMA4_SHARED_ATTENTION " " GEMMA4_DENSE " " GEMMA4_LAYER_INPUT " scale");
    /* layers 0-3 keep KV (3 sliding: 2 heads x 32, 1 full: 2 heads x 64), 4-7 share it */
    assert_int_equal(p->n_caches, 4);
    for (uint32_t i = 0; i < 4; i++) assert_int_equal(p->caches[i].layer, i);
    const uint32_t from[8] = {0, 1, 2, 3, 2, 2, 2, 3};
    for (uint32_t il = 0; il < 8; il++) {
        assert_int_equal(m->desc.layers[il].kv_layer, from[il]);
        assert_int_equal(p->ops[find(p, EM_PROGRAM_ATTENTION, il)].cache, from[il]);
        /* the shared layers' gated units are twice as wide */
        assert_int_equal(p->ops[find(p, EM_PROGRAM_GLU, il)].u.glu.width, il < 4 ? 256 : 512);
        const em_program_slice *slice = &p->ops[find(p, EM_PROGRAM_SLICE, il)].u.slice;
        assert_int_equal(slice->offset, il * 32);
        assert_int_equal(slice->width, 32);
        assert_int_equal(slice->src_width, 8 * 32);
    }
    assert_int_equal(em_program_kv_floats(p), 3 * 2 * 64 + 2 * 128);
    assert_int_equal(em_backend_kv_bytes_per_token(m), (3 * 2 * 64 + 2 * 128) * sizeof(float));
    char line[160];
    em_program_describe_op(p, find(p, EM_PROGRAM_SLICE, 5), line, sizeof line);
    assert_string_equal(line, "layer 5 slice layer_slice = per_layer[160:192]");
    em_block *blocks;
    uint32_t n;
    assert_error_has(em_program_blocks(p, &blocks, &n),
                     "blocks: op 1 (embed): a second embedding table (per-layer inputs), which no block takes");

    em_program c = copy_program(p); /* a slice past the end of its rows */
    c.ops[find(&c, EM_PROGRAM_SLICE, 7)].u.slice.offset = 240;
    assert_error_has(em_program_check(&c), "(layer 7 slice): columns 240 to 272 of rows of 256");
    em_program_free(&c);
    c = copy_program(p); /* a slice of a row narrower than it reads */
    c.ops[find(&c, EM_PROGRAM_SLICE, 0)].u.slice.src_width = 128;
    assert_error_has(em_program_check(&c), "(layer 0 slice): reads per_layer at width 128, last written at 256");
    em_program_free(&c);
    c = copy_program(p); /* a factor that is no number */
    c.ops[3].u.scale.factor = NAN;
    assert_error_has(em_program_check(&c), "op 3 (scale): a factor of nan");
    em_program_free(&c);
    c = copy_program(p); /* the per-layer table embedded over the tokens' embeddings */
    c.ops[1].dst = c.ops[0].dst;
    assert_error_has(em_program_check(&c), "op 1 (embed): embeds into x again");
    em_program_free(&c);
    c = copy_program(p); /* a cache said to be written by a layer after those that read it */
    c.caches[2].layer = 6;
    assert_error_has(em_program_check(&c), "(layer 2 attention): reads cache 2 of a later layer (6)");
    em_program_free(&c);
    em_model_free(m);

    /* what a backend that runs blocks cannot take is named, whichever family brings it */
    m = load_preset("tiny-llama");
    c = copy_program(&m->program); /* layer 1 attending over layer 0's cache */
    c.ops[find(&c, EM_PROGRAM_ATTENTION, 1)].cache = 0;
    assert_error_has(em_program_blocks(&c, &blocks, &n),
                     "layer 1, op 24 (attention): attention over an earlier layer's cache (shared KV)");
    em_program_free(&c);
    em_model_free(m);
    m = load_preset("tiny-qwen3moe");
    c = copy_program(&m->program);
    const float factors[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    c.ops[find(&c, EM_PROGRAM_ROUTE, 1)].u.route.expert_scale = factors;
    assert_error_has(em_program_blocks(&c, &blocks, &n), "(route): a router with a factor per expert");
    em_program_free(&c);
    em_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_family_blocks),
        cmocka_unit_test(test_parameters),
        cmocka_unit_test(test_checker_refuses),
        cmocka_unit_test(test_hybrid_blocks),
        cmocka_unit_test(test_gated_shared_expert),
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_gemma4_blocks),
        cmocka_unit_test(test_gemma4_moe_blocks),
        cmocka_unit_test(test_gemma4_per_layer_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
