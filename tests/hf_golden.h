/* The golden comparison of the converter's tests with transformers (test_convert.c,
 * test_convert_gpt_oss.c): a fixture's expected.json and logits (tests/fixtures/hf, written by
 * tools/reference/make_hf_fixtures.py), its checkpoint converted and loaded, and the CPU backend's
 * logits of a whole sequence. */
#ifndef EMBER_TESTS_HF_GOLDEN_H
#define EMBER_TESTS_HF_GOLDEN_H

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "model/convert/convert.h"
#include "model/model.h"

#define HF EM_SOURCE_DIR "/tests/fixtures/hf"
#define DIR EM_BINARY_DIR "/test_convert_files"

typedef struct expected {
    int32_t prompt[64], greedy[64];
    uint32_t n_prompt, n_greedy, n_pos, n_vocab;
    float *logits; /* [n_pos][n_vocab] */
} expected;

static inline void read_ids(json_t *root, const char *key, int32_t *out, uint32_t *n) {
    json_t *a = json_object_get(root, key);
    assert_true(json_is_array(a));
    *n = (uint32_t)json_array_size(a);
    assert_true(*n <= 64);
    for (uint32_t i = 0; i < *n; i++) out[i] = (int32_t)json_integer_value(json_array_get(a, i));
}

/* The fixture's prompt, the greedy ids under `greedy_key` and the logits in `logits_file`. */
static inline expected load_expected_as(const char *family, const char *greedy_key, const char *logits_file) {
    expected e = {0};
    char path[512];
    snprintf(path, sizeof path, HF "/%s/expected.json", family);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) fail_msg("%s: %s", path, jerr.text);
    read_ids(root, "prompt_ids", e.prompt, &e.n_prompt);
    read_ids(root, greedy_key, e.greedy, &e.n_greedy);
    json_t *shape = json_object_get(root, "logits_shape");
    e.n_pos = (uint32_t)json_integer_value(json_array_get(shape, 0));
    e.n_vocab = (uint32_t)json_integer_value(json_array_get(shape, 1));
    json_decref(root);
    assert_int_equal(e.n_pos, e.n_prompt + e.n_greedy);
    snprintf(path, sizeof path, HF "/%s/%s", family, logits_file);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = (size_t)e.n_pos * e.n_vocab;
    e.logits = malloc(n * sizeof *e.logits);
    assert_non_null(e.logits);
    assert_int_equal(fread(e.logits, sizeof *e.logits, n, f), n);
    fclose(f);
    return e;
}

static inline expected load_expected(const char *family) { return load_expected_as(family, "greedy_ids", "logits.f32"); }

static inline em_model *convert_and_load(const char *family, const char *type) {
    char out[512], dir[512];
    mkdir(DIR, 0755);
    snprintf(dir, sizeof dir, HF "/%s", family);
    snprintf(out, sizeof out, DIR "/%s-%s.gguf", family, type);
    em_convert_options o = {.type = type};
    em_err err = em_convert_hf(dir, out, &o, NULL);
    if (err) fail_msg("convert %s: %s", family, em_err_message(err));
    em_model *m = NULL;
    if ((err = em_model_load(out, &m))) fail_msg("load %s: %s", out, em_err_message(err));
    return m;
}

static uint32_t table_blocks[4];
static em_batch_seq table;

static inline em_backend *backend_for(const em_model *m) {
    em_backend_config o = {.device = "cpu", .n_threads = 2, .block_tokens = 16, .kv_tokens = 64};
    em_batch_fixed_tables(&table, table_blocks, 1, 4);
    em_backend *b = NULL;
    em_err err = em_backend_cpu_new(m, &o, &b);
    if (err) fail_msg("backend: %s", em_err_message(err));
    return b;
}

/* Logits of every position of tokens[0..n) in one batch. */
static inline float *forward_all(em_backend *b, const int32_t *tokens, uint32_t n, uint32_t n_vocab) {
    uint32_t seq[64] = {0}, pos[64];
    bool want[64];
    for (uint32_t i = 0; i < n; i++) {
        pos[i] = i;
        want[i] = true;
    }
    em_batch batch = {.n_tokens = n, .tokens = tokens, .seq = seq, .pos = pos, .logits = want, .n_seqs = 1, .seqs = &table};
    float *logits = malloc((size_t)n * n_vocab * sizeof *logits);
    assert_non_null(logits);
    em_err err = em_backend_forward(b, &batch, logits);
    if (err) fail_msg("forward: %s", em_err_message(err));
    return logits;
}

static inline int32_t argmax(const float *row, uint32_t n) {
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (row[i] > row[best]) best = (int32_t)i;
    return best;
}

#endif
