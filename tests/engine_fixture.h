/* Helpers of the engine's end-to-end tests (test_engine.c, test_engine_hybrid.c): the test model
 * synthesized once (ENGINE_TEST_PRESET in ENGINE_TEST_DIR, defined before this is included), prompts
 * of random ordinary tokens, the greedy reference straight from the CPU backend, and engines and
 * requests with the tests' options. */
#ifndef EMBER_TESTS_ENGINE_FIXTURE_H
#define EMBER_TESTS_ENGINE_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "ember.h"
#include "model/model.h"

#define VOCAB EM_FIXTURES_DIR "/vocab/ggml-vocab-llama-spm.gguf"
#define MODEL ENGINE_TEST_DIR "/" ENGINE_TEST_PRESET ".gguf"

static uint32_t n_vocab;

static int setup(void **state) {
    (void)state;
    mkdir(ENGINE_TEST_DIR, 0755);
    em_synth_options o = {.preset = ENGINE_TEST_PRESET, .type = "f32", .seed = 5, .vocab_path = VOCAB};
    em_err err = em_synth_write(&o, MODEL);
    if (err) fail_msg("synth: %s", em_err_message(err));
    em_model *m;
    if ((err = em_model_load(MODEL, &m))) fail_msg("load: %s", em_err_message(err));
    n_vocab = m->desc.n_vocab;
    em_model_free(m);
    return 0;
}

static inline void make_prompt(int32_t *tokens, uint32_t n, uint64_t seed) {
    for (uint32_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = 3 + (int32_t)((seed >> 33) % (n_vocab - 3)); /* no control tokens */
    }
}

/* Greedy continuation straight from the backend, token by token: the reference. */
static inline void reference_greedy(const int32_t *prompt, uint32_t n_prompt, uint32_t n_out, int32_t *out) {
    em_model *m;
    assert_null(em_model_load(MODEL, &m));
    em_backend_config config = {.device = "cpu", .n_threads = 1, .block_tokens = 16, .kv_tokens = 1024};
    em_backend *b;
    assert_null(em_backend_cpu_new(m, &config, &b));
    static uint32_t blocks[64];
    em_batch_seq seq;
    em_batch_fixed_tables(&seq, blocks, 1, 64);
    float *logits = malloc(n_vocab * sizeof *logits);
    int32_t token = 0;
    for (uint32_t pos = 0; pos < n_prompt + n_out - 1; pos++) {
        token = pos < n_prompt ? prompt[pos] : out[pos - n_prompt];
        uint32_t s = 0;
        bool want = true;
        em_batch batch = {1, &token, &s, &pos, &want, 1, &seq, NULL, false, NULL, NULL};
        assert_null(em_backend_forward(b, &batch, logits));
        if (pos + 1 >= n_prompt) {
            uint32_t best = 0;
            for (uint32_t v = 1; v < n_vocab; v++)
                if (logits[v] > logits[best]) best = v;
            out[pos + 1 - n_prompt] = (int32_t)best;
        }
    }
    free(logits);
    em_backend_free(b);
    em_model_free(m);
}

/* The tests' engine options: the test model on the CPU, 2 threads, a context of 512. */
static inline void test_options(ember_options *o) {
    ember_options_default(o);
    o->model_path = MODEL;
    o->device = "cpu";
    o->threads = 2;
    o->ctx_tokens = 512;
}

static inline ember_engine *new_engine(uint64_t kv_mem, int max_sequences) {
    ember_options o;
    test_options(&o);
    o.kv_mem_bytes = kv_mem;
    if (max_sequences) o.max_sequences = max_sequences;
    ember_engine *e;
    ember_error *err = ember_engine_create(&o, &e);
    if (err) fail_msg("engine: %s", ember_error_message(err));
    return e;
}

/* A request for `prompt` that ignores end-of-generation tokens (runs to max_tokens). */
static inline ember_request_params ids_params(const int32_t *prompt, uint32_t n, int max_tokens, float temp, uint64_t seed) {
    ember_request_params p;
    ember_request_default(&p);
    p.prompt_ids = prompt;
    p.n_prompt_ids = n;
    p.max_tokens = max_tokens;
    p.sampling.temperature = temp;
    p.sampling.seed = seed;
    p.ignore_eos = true;
    return p;
}

static inline ember_request *submit_params(ember_engine *e, const ember_request_params *p) {
    ember_request *r;
    ember_error *err = ember_submit(e, p, &r);
    if (err) fail_msg("submit: %s", ember_error_message(err));
    return r;
}

static inline ember_request *submit_ids(ember_engine *e, const int32_t *prompt, uint32_t n, int max_tokens, float temp,
                                 uint64_t seed) {
    ember_request_params p = ids_params(prompt, n, max_tokens, temp, seed);
    return submit_params(e, &p);
}

#endif
