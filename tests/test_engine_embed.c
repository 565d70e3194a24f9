/* Embedding requests through the engine (CPU) on a tiny qwen3: the hidden states the backend hands
 * back are the rows its output head reads (their products with the output matrix are its logits);
 * mean, first-token and last-token pooling equal the pooling done here by hand over those rows;
 * many prompts batched together (with chunked prefill, queueing and a generation beside them) give
 * each the vector it gets alone; embeddings leave the prefix cache alone; requests that cannot
 * embed fail at submission, saying why; and, once tools/reference/make_embed_fixtures.py has
 * written transformers' vectors for the converter's tiny Qwen3 checkpoint, the engine's vectors of
 * that checkpoint (converted by `ember convert`) agree with them, as Qwen3-Embedding pools (the
 * last token) and by mean and first token. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "quant/quant.h"
#ifdef EM_HF_QWEN3_EMBED_FIXTURE
#include <jansson.h>

#include "model/convert/convert.h"
#endif

#define ENGINE_TEST_PRESET "tiny-qwen3"
#define ENGINE_TEST_DIR EM_BINARY_DIR "/test_engine_embed_files"
#include "engine_fixture.h"

#define MAX_PROMPT 200

/* Every position's hidden state of one prompt, from the CPU backend in one batch, and its logits. */
static float *backend_hidden(const int32_t *prompt, uint32_t n, uint32_t *width, float **logits_out) {
    em_model *m;
    assert_null(em_model_load(MODEL, &m));
    em_backend_config config = {.device = "cpu", .n_threads = 1, .block_tokens = 16, .kv_tokens = 1024};
    em_backend *b;
    assert_null(em_backend_cpu_new(m, &config, &b));
    *width = em_backend_hidden_width(m);
    assert_int_equal(*width, m->desc.n_embd);
    static uint32_t blocks[64];
    em_batch_seq seq;
    em_batch_fixed_tables(&seq, blocks, 1, 64);
    uint32_t seqs[MAX_PROMPT], pos[MAX_PROMPT];
    bool all[MAX_PROMPT];
    for (uint32_t i = 0; i < n; i++) seqs[i] = 0, pos[i] = i, all[i] = true;
    float *hidden = malloc((size_t)n * *width * sizeof *hidden);
    float *logits = malloc((size_t)n * n_vocab * sizeof *logits);
    em_batch batch = {.n_tokens = n, .tokens = prompt, .seq = seqs, .pos = pos, .logits = all, .n_seqs = 1,
                      .seqs = &seq, .hidden = all, .hidden_out = hidden};
    assert_null(em_backend_forward(b, &batch, logits));
    em_backend_free(b);
    em_model_free(m);
    *logits_out = logits;
    return hidden;
}

/* Pooled by hand: mean, first or last row, then divided by its L2 norm. */
static void pool_by_hand(const float *hidden, uint32_t n, uint32_t width, int pooling, float *out) {
    double norm = 0;
    for (uint32_t k = 0; k < width; k++) {
        double v = 0;
        if (pooling == EMBER_POOLING_MEAN) {
            for (uint32_t t = 0; t < n; t++) v += hidden[(size_t)t * width + k];
            v /= n;
        } else {
            v = hidden[(size_t)(pooling == EMBER_POOLING_CLS ? 0 : n - 1) * width + k];
        }
        out[k] = (float)v;
        norm += v * v;
    }
    for (uint32_t k = 0; k < width; k++) out[k] = (float)(out[k] / sqrt(norm));
}

static ember_request_params embed_params(const int32_t *prompt, uint32_t n, int pooling) {
    ember_request_params p;
    ember_request_default(&p);
    p.prompt_ids = prompt;
    p.n_prompt_ids = n;
    p.embed = true;
    p.pooling = pooling;
    return p;
}

/* Waits for an embedding request and copies its vector (width floats) out. */
static void read_vector(ember_request *r, float *out, uint32_t width) {
    ember_output o;
    do assert_true(ember_request_next(r, &o, 300000));
    while (o.finish == EMBER_FINISH_NONE);
    if (o.finish != EMBER_FINISH_STOP) fail_msg("embedding ended %d: %s", o.finish, o.error ? o.error : "");
    assert_non_null(o.embedding);
    assert_int_equal(o.n_embedding, width);
    assert_int_equal(o.n_tokens, 0);
    memcpy(out, o.embedding, width * sizeof *out);
}

static void assert_close(const float *a, const float *b, uint32_t n, float tolerance) {
    double norm_a = 0, norm_b = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (fabsf(a[i] - b[i]) > tolerance) fail_msg("element %u: %.8g against %.8g", i, a[i], b[i]);
        norm_a += (double)a[i] * a[i], norm_b += (double)b[i] * b[i];
    }
    assert_true(fabs(sqrt(norm_a) - 1) < 1e-5 && fabs(sqrt(norm_b) - 1) < 1e-5);
}

/* The rows are what the output head reads: W_out · hidden is the backend's logits row. */
static void test_hidden_states_feed_the_head(void **state) {
    (void)state;
    int32_t prompt[23];
    make_prompt(prompt, 23, 3);
    uint32_t width;
    float *logits, *hidden = backend_hidden(prompt, 23, &width, &logits);
    em_model *m;
    assert_null(em_model_load(MODEL, &m));
    const em_weight *w = &m->w.output;
    assert_int_equal(w->type, EM_TYPE_F32);
    assert_int_equal(w->cols, width);
    for (uint32_t t = 0; t < 23; t += 11)
        for (uint32_t v = 0; v < n_vocab; v += 97) {
            const float *row = (const float *)((const uint8_t *)w->data + v * w->row_bytes);
            double dot = 0;
            for (uint32_t k = 0; k < width; k++) dot += (double)row[k] * hidden[(size_t)t * width + k];
            assert_true(fabs(dot - logits[(size_t)t * n_vocab + v]) < 1e-3);
        }
    em_model_free(m);
    free(hidden);
    free(logits);
}

/* Each pooling equals the hand computation over the backend's rows, prompts longer than a step's
 * budget included (their chunks pooled across steps). */
static void test_pooling_matches_hand_computation(void **state) {
    (void)state;
    static const uint32_t lengths[] = {1, 9, 150};
    static const int poolings[] = {EMBER_POOLING_MEAN, EMBER_POOLING_CLS, EMBER_POOLING_LAST};
    ember_options o;
    test_options(&o);
    o.batch_tokens = 64;
    ember_engine *e;
    assert_null(ember_engine_create(&o, &e));
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    assert_int_equal(info.pooling, EMBER_POOLING_NONE); /* the synthesized file names none */
    assert_null(info.embed_refused);
    for (size_t l = 0; l < 3; l++) {
        int32_t prompt[MAX_PROMPT];
        make_prompt(prompt, lengths[l], 10 + l);
        uint32_t width;
        float *logits, *hidden = backend_hidden(prompt, lengths[l], &width, &logits);
        assert_int_equal(info.n_embd, width);
        for (size_t p = 0; p < 3; p++) {
            float want[1024], got[1024];
            pool_by_hand(hidden, lengths[l], width, poolings[p], want);
            ember_request_params params = embed_params(prompt, lengths[l], poolings[p]);
            ember_request *r;
            assert_null(ember_submit(e, &params, &r));
            read_vector(r, got, width);
            ember_timings t;
            ember_request_timings(r, &t);
            assert_int_equal(t.prompt_tokens, lengths[l]);
            assert_int_equal(t.generated_tokens, 0);
            ember_request_release(r);
            assert_close(got, want, width, 1e-5f);
        }
        free(hidden);
        free(logits);
    }
    ember_engine_destroy(e);
}

/* Twelve prompts at once (beyond the running limit, longer than a step's budget), beside a
 * generation: each vector equals the one its prompt gets alone; the prefix cache holds only the
 * generation's blocks and was never consulted for the embeddings. */
/* Submits the prompts as embeddings, the odd ones mean-pooled, the others by the engine's default. */
static void submit_all(ember_engine *e, int32_t (*prompts)[MAX_PROMPT], const uint32_t *lengths, uint32_t n,
                       ember_request **requests) {
    for (uint32_t i = 0; i < n; i++) {
        ember_request_params p = embed_params(prompts[i], lengths[i], i % 2 ? EMBER_POOLING_MEAN : EMBER_POOLING_NONE);
        assert_null(ember_submit(e, &p, &requests[i]));
    }
}

/* Each request's vector equals the one its prompt got alone (within float reordering). */
static void expect_alone(ember_request **requests, uint32_t n, const float *alone, uint32_t width) {
    float *vector = malloc(width * sizeof *vector);
    assert_non_null(vector);
    for (uint32_t i = 0; i < n; i++) {
        read_vector(requests[i], vector, width);
        ember_request_release(requests[i]);
        assert_close(vector, alone + (size_t)i * width, width, 1e-5f);
    }
    free(vector);
}

static void test_batched_equals_alone(void **state) {
    (void)state;
    enum { N = 12 };
    ember_options o;
    test_options(&o);
    o.batch_tokens = 96;
    o.max_sequences = 5;
    o.pooling = EMBER_POOLING_LAST;
    ember_engine *e;
    assert_null(ember_engine_create(&o, &e));
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    assert_int_equal(info.pooling, EMBER_POOLING_LAST);
    const uint32_t width = info.n_embd;
    int32_t prompts[N][MAX_PROMPT];
    uint32_t lengths[N];
    float *alone = malloc((size_t)N * width * sizeof *alone);
    for (uint32_t i = 0; i < N; i++) {
        lengths[i] = 3 + (i * 37) % 180;
        make_prompt(prompts[i], lengths[i], 100 + i);
        ember_request_params p = embed_params(prompts[i], lengths[i], i % 2 ? EMBER_POOLING_MEAN : EMBER_POOLING_NONE);
        ember_request *r;
        assert_null(ember_submit(e, &p, &r));
        read_vector(r, alone + (size_t)i * width, width);
        ember_request_release(r);
    }
    ember_stats before;
    ember_engine_stats(e, &before);
    assert_int_equal(before.kv_blocks_cached, 0);
    assert_int_equal(before.prefix_lookups, 0);

    int32_t chat[40];
    make_prompt(chat, 40, 7);
    ember_request_params g;
    ember_request_default(&g);
    g.prompt_ids = chat;
    g.n_prompt_ids = 40;
    g.max_tokens = 20;
    g.ignore_eos = true;
    ember_request *generation, *requests[N];
    assert_null(ember_submit(e, &g, &generation));
    submit_all(e, prompts, lengths, N, requests);
    expect_alone(requests, N, alone, width);
    ember_output out;
    size_t generated = 0;
    do {
        assert_true(ember_request_next(generation, &out, 300000));
        generated += out.n_tokens;
        assert_null(out.embedding);
    } while (out.finish == EMBER_FINISH_NONE);
    assert_int_equal(out.finish, EMBER_FINISH_LENGTH);
    assert_int_equal(generated, 20);
    ember_request_release(generation);
    ember_stats after;
    ember_engine_stats(e, &after);
    assert_int_equal(after.prefix_lookups, 1); /* the generation's alone */
    assert_int_equal(after.kv_blocks_cached, (40 + 20 + 15) / 16);
    /* Batched: the prompts together take fewer steps than their chunks one request at a time. */
    submit_all(e, prompts, lengths, N, requests);
    expect_alone(requests, N, alone, width);
    ember_stats last;
    ember_engine_stats(e, &last);
    assert_true(last.steps - after.steps < before.steps);
    assert_int_equal(last.kv_blocks_cached, after.kv_blocks_cached);
    free(alone);
    ember_engine_destroy(e);
}

static void expect_refused(ember_engine *e, const ember_request_params *p, const char *words) {
    ember_request *r = NULL;
    ember_error *err = ember_submit(e, p, &r);
    assert_non_null(err);
    assert_null(r);
    if (!strstr(ember_error_message(err), words)) fail_msg("'%s' does not say '%s'", ember_error_message(err), words);
    ember_error_free(err);
}

/* No pooling known, a pooling that is not one, a rank model, and context limits. */
static void test_refusals(void **state) {
    (void)state;
    ember_options o;
    test_options(&o);
    o.ctx_tokens = 64;
    ember_engine *e;
    assert_null(ember_engine_create(&o, &e));
    int32_t prompt[65];
    make_prompt(prompt, 65, 9);
    ember_request_params p = embed_params(prompt, 8, EMBER_POOLING_NONE);
    expect_refused(e, &p, "qwen3.pooling_type");
    p.pooling = 9;
    expect_refused(e, &p, "pooling 9");
    p.pooling = EMBER_POOLING_RANK;
    expect_refused(e, &p, "rank");
    p = embed_params(prompt, 65, EMBER_POOLING_MEAN);
    expect_refused(e, &p, "the context holds 64");
    /* an embedding generates nothing: the whole context is its */
    p.n_prompt_ids = 64;
    ember_request *r;
    assert_null(ember_submit(e, &p, &r));
    float v[1024];
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    read_vector(r, v, info.n_embd);
    ember_request_release(r);
    ember_engine_destroy(e);
    o.pooling = 7;
    ember_error *err = ember_engine_create(&o, &e);
    assert_non_null(err);
    assert_non_null(strstr(ember_error_message(err), "pooling 7"));
    ember_error_free(err);
}

#ifdef EM_HF_QWEN3_EMBED_FIXTURE
/* tests/fixtures/hf/qwen3/embeddings.json: cosine >= 0.9999 with transformers for every input and
 * pooling. */
static void test_qwen3_matches_transformers(void **state) {
    (void)state;
    const char *dir = EM_SOURCE_DIR "/tests/fixtures/hf/qwen3", *gguf = ENGINE_TEST_DIR "/qwen3-hf-f32.gguf";
    em_convert_options c = {.type = "F32"};
    em_err e = em_convert_hf(dir, gguf, &c, NULL);
    if (e) fail_msg("convert: %s", em_err_message(e));
    json_error_t jerr;
    json_t *root = json_load_file(EM_SOURCE_DIR "/tests/fixtures/hf/qwen3/embeddings.json", 0, &jerr);
    if (!root) fail_msg("embeddings.json: %s", jerr.text);
    ember_options o;
    test_options(&o);
    o.model_path = gguf;
    o.ctx_tokens = 256;
    o.batch_tokens = 64; /* the longest input pooled across chunks */
    ember_engine *engine;
    assert_null(ember_engine_create(&o, &engine));
    ember_engine_info info;
    ember_engine_get_info(engine, &info);
    static const char *names[] = {"last", "mean", "cls"};
    static const int poolings[] = {EMBER_POOLING_LAST, EMBER_POOLING_MEAN, EMBER_POOLING_CLS};
    const json_t *inputs = json_object_get(root, "inputs");
    assert_true(json_array_size(inputs) >= 3);
    for (size_t p = 0; p < 3; p++)
        for (size_t i = 0; i < json_array_size(inputs); i++) {
            const json_t *ids = json_array_get(inputs, i), *want = json_array_get(json_object_get(root, names[p]), i);
            int32_t prompt[MAX_PROMPT];
            const uint32_t n = (uint32_t)json_array_size(ids);
            assert_true(n > 0 && n <= MAX_PROMPT);
            assert_int_equal(json_array_size(want), info.n_embd);
            for (uint32_t t = 0; t < n; t++) prompt[t] = (int32_t)json_integer_value(json_array_get(ids, t));
            ember_request_params params = embed_params(prompt, n, poolings[p]);
            ember_request *r;
            assert_null(ember_submit(engine, &params, &r));
            float got[1024];
            read_vector(r, got, info.n_embd);
            ember_request_release(r);
            double dot = 0;
            for (uint32_t k = 0; k < info.n_embd; k++) dot += got[k] * json_real_value(json_array_get(want, k));
            if (dot < 0.9999) fail_msg("%s pooling, input %zu (%u tokens): cosine %.7f", names[p], i, n, dot);
        }
    ember_engine_destroy(engine);
    json_decref(root);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hidden_states_feed_the_head),
        cmocka_unit_test(test_pooling_matches_hand_computation),
        cmocka_unit_test(test_batched_equals_alone),
        cmocka_unit_test(test_refusals),
#ifdef EM_HF_QWEN3_EMBED_FIXTURE
        cmocka_unit_test(test_qwen3_matches_transformers),
#endif
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
