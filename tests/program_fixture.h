/* Helpers of the tests of the layer program and what is built from it (test_program.c,
 * test_schedule.c): a synthetic preset loaded with its program, the program's operations looked up
 * by kind and layer, and errors checked for the words that name what broke. */
#ifndef EMBER_TESTS_PROGRAM_FIXTURE_H
#define EMBER_TESTS_PROGRAM_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "program/program.h"

/* `preset` at f32 with the reference fixtures' llama vocabulary, written to a temporary file and
 * loaded (its program built and checked). */
static em_model *load_preset(const char *preset) {
    char path[] = "/tmp/ember-test-preset-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    em_synth_options o = {.preset = preset, .type = "f32", .seed = 7,
                          .vocab_path = EM_FIXTURES_DIR "/vocab/ggml-vocab-llama-spm.gguf"};
    em_err err = em_synth_write(&o, path);
    if (err) fail_msg("synth %s: %s", preset, em_err_message(err));
    em_model *m = NULL;
    err = em_model_load_as(path, EM_GGUF_PRIVATE, &m);
    unlink(path);
    if (err) fail_msg("load %s: %s", preset, em_err_message(err));
    return m;
}

/* The index of the first operation of `kind` in `layer`. */
static uint32_t find(const em_program *p, em_program_op_kind kind, uint32_t layer) {
    for (uint32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == kind && p->ops[i].layer == layer) return i;
    fail_msg("no %s in layer %u", em_program_op_name(kind), layer);
    return 0;
}

static void assert_error_has(em_err err, const char *text) {
    if (!err) fail_msg("no error; wanted one that says \"%s\"", text);
    if (!strstr(em_err_message(err), text)) fail_msg("error \"%s\" does not say \"%s\"", em_err_message(err), text);
    em_err_free(err);
}

/* The index of the buffer named `name`. */
static uint8_t buffer_named(const em_program *p, const char *name) {
    for (uint8_t i = 0; i < p->n_buffers; i++)
        if (!strcmp(p->buffers[i].name, name)) return i;
    fail_msg("no buffer %s", name);
    return 0;
}

/* A copy of a MoE program with a shared gated unit added to layer `layer`'s experts, as the builder
 * emits one: out += down(act(gate xn) · up xn). */
static em_program with_shared_expert(const em_program *p, uint32_t layer) {
    em_program c = *p;
    c.ops = malloc((p->n_ops + 5) * sizeof *c.ops);
    assert_non_null(c.ops);
    const uint32_t at = find(p, EM_PROGRAM_EXPERTS, layer) + 1;
    const em_program_op *experts = &p->ops[at - 1];
    memcpy(c.ops, p->ops, at * sizeof *c.ops);
    const uint8_t gate = buffer_named(p, "gate"), up = buffer_named(p, "up"), shared = buffer_named(p, "shared");
    const em_program_op unit[5] = {
        {.kind = EM_PROGRAM_MATMUL, .layer = layer, .dst = gate, .src = experts->src, .u.matmul.weight = experts->u.experts.gate},
        {.kind = EM_PROGRAM_MATMUL, .layer = layer, .dst = up, .src = experts->src, .u.matmul.weight = experts->u.experts.up},
        {.kind = EM_PROGRAM_GLU, .layer = layer, .dst = gate, .src = up, .u.glu.act = experts->u.experts.act},
        {.kind = EM_PROGRAM_MATMUL, .layer = layer, .dst = shared, .src = gate, .u.matmul.weight = experts->u.experts.down},
        {.kind = EM_PROGRAM_ADD, .layer = layer, .dst = experts->dst, .src = shared},
    };
    memcpy(&c.ops[at], unit, sizeof unit);
    memcpy(&c.ops[at + 5], &p->ops[at], (p->n_ops - at) * sizeof *c.ops);
    c.n_ops = c.cap_ops = p->n_ops + 5;
    c.caches = NULL;
    c.n_caches = c.cap_caches = 0;
    return c;
}

#endif
