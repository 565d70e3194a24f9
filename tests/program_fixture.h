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

#endif
