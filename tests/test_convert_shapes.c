/* Checkpoints whose shape differs from the tokenizer's or the family's defaults, as real ones do:
 *  - padded vocabularies: an embedding with more rows than the tokenizer has tokens (Qwen2/2.5/3:
 *    151,936 rows, 151,665 tokens). `ember convert` pads the token list with unused "[PADi]"
 *    tokens as llama.cpp's converter does, the padded model's logits over the real tokens are
 *    transformers' logits, and generating a padding id (or reading one in a prompt) neither fails
 *    a request nor `ember run`; an id past the tokenizer's tokens (a GGUF written without padding)
 *    is an empty piece too.
 *  - Gemma 3 layer patterns other than five sliding layers then one global: config.json's
 *    layer_types or sliding_window_pattern become {arch}.attention.sliding_window_pattern in
 *    llama.cpp's two forms (a bool per layer, true = sliding; or a period), and the loader reads
 *    both. (The logits of such a model against transformers: test_convert's gemma3pattern.)
 * The checkpoints are built here from the transformers fixtures of tests/fixtures/hf. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "ember.h"
#include "gguf/gguf.h"
#include "model/convert/convert.h"
#include "model/model.h"
#include "safetensors_writer.h"

#define HF EM_SOURCE_DIR "/tests/fixtures/hf"
#define DIR EM_BINARY_DIR "/test_convert_shapes_files"

/* The qwen3 fixture (384 tokens, untied lm_head, f32) padded to 400 rows. */
#define N_TOKENS 384u
#define N_ROWS 400u
#define N_EMBD 64u
#define WINNING_PAD 390 /* the padding row made to win the first greedy step */
#define PROMPT_PAD 395  /* a padding id placed in a prompt */

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void link_fixture_file(const char *family, const char *file, const char *dir) {
    char target[1024], path[1024];
    assert_true(snprintf(target, sizeof target, HF "/%s/%s", family, file) < (int)sizeof target);
    assert_true(snprintf(path, sizeof path, "%s/%s", dir, file) < (int)sizeof path);
    unlink(path);
    assert_int_equal(symlink(target, path), 0);
}

/* transformers' expected.json of a fixture: prompt, greedy continuation, logits [n_pos][n_vocab]. */
typedef struct reference {
    int32_t ids[64];
    uint32_t n_prompt, n_ids;
    float *logits;
} reference;

static reference load_reference(const char *family) {
    reference r = {0};
    char path[512];
    snprintf(path, sizeof path, HF "/%s/expected.json", family);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    json_t *prompt = json_object_get(root, "prompt_ids"), *greedy = json_object_get(root, "greedy_ids");
    r.n_prompt = (uint32_t)json_array_size(prompt);
    r.n_ids = r.n_prompt + (uint32_t)json_array_size(greedy);
    assert_true(r.n_ids <= 64);
    for (uint32_t i = 0; i < r.n_ids; i++)
        r.ids[i] = (int32_t)json_integer_value(
            i < r.n_prompt ? json_array_get(prompt, i) : json_array_get(greedy, i - r.n_prompt));
    json_decref(root);
    snprintf(path, sizeof path, HF "/%s/logits.f32", family);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = (size_t)r.n_ids * N_TOKENS;
    r.logits = malloc(n * sizeof *r.logits);
    assert_non_null(r.logits);
    assert_int_equal(fread(r.logits, sizeof *r.logits, n, f), n);
    fclose(f);
    return r;
}

/* Writes DIR/padded: the qwen3 fixture with N_ROWS - N_TOKENS rows appended to the embedding and
 * the output matrix, and config.json's vocab_size saying so (as Qwen's checkpoints are saved).
 * Padding rows are zero except output row WINNING_PAD: 10 x |that step's logit| / logit times the
 * row of the reference's first greedy token, so its logit at the last prompt position is
 * 10 |l| > l, the largest of all. */
static void write_padded_checkpoint(const reference *ref) {
    mkdir(DIR, 0755);
    mkdir(DIR "/padded", 0755);
    em_safetensors *st;
    assert_null(em_safetensors_open(HF "/qwen3/model.safetensors", &st));
    json_t *header = json_object();
    size_t total = 0;
    for (size_t i = 0; i < em_safetensors_count(st); i++) {
        const em_st_tensor *t = em_safetensors_at(st, i);
        assert_int_equal(t->dtype, EM_ST_F32);
        total += t->size + (t->shape[0] == N_TOKENS && t->n_dims == 2 ? (N_ROWS - N_TOKENS) * N_EMBD * 4 : 0);
    }
    uint8_t *data = calloc(total, 1);
    assert_non_null(data);
    size_t used = 0;
    for (size_t i = 0; i < em_safetensors_count(st); i++) {
        const em_st_tensor *t = em_safetensors_at(st, i);
        const bool padded = t->n_dims == 2 && t->shape[0] == N_TOKENS;
        json_t *shape = json_array();
        for (uint32_t d = 0; d < t->n_dims; d++)
            json_array_append_new(shape, json_integer((json_int_t)(d == 0 && padded ? N_ROWS : t->shape[d])));
        size_t size = t->size + (padded ? (N_ROWS - N_TOKENS) * N_EMBD * 4 : 0);
        json_object_set_new(header, t->name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                      (json_int_t)used, (json_int_t)(used + size)));
        memcpy(data + used, t->data, t->size);
        if (!strcmp(t->name, "lm_head.weight")) {
            const int32_t first = ref->ids[ref->n_prompt];
            const float logit = ref->logits[(size_t)(ref->n_prompt - 1) * N_TOKENS + first];
            const float scale = logit > 0 ? 10.0f : -10.0f;
            float row[N_EMBD];
            memcpy(row, t->data + (size_t)first * N_EMBD * 4, sizeof row);
            for (uint32_t k = 0; k < N_EMBD; k++) row[k] *= scale;
            memcpy(data + used + (size_t)WINNING_PAD * N_EMBD * 4, row, sizeof row);
        }
        used += size;
    }
    write_safetensors(DIR "/padded/model.safetensors", header, data, used);
    free(data);
    em_safetensors_close(st);

    json_t *cfg = json_load_file(HF "/qwen3/config.json", 0, NULL);
    assert_non_null(cfg);
    json_object_set_new(cfg, "vocab_size", json_integer(N_ROWS));
    assert_int_equal(json_dump_file(cfg, DIR "/padded/config.json", JSON_INDENT(1)), 0);
    json_decref(cfg);
    link_fixture_file("qwen3", "tokenizer.json", DIR "/padded");
    link_fixture_file("qwen3", "tokenizer_config.json", DIR "/padded");
}

/* Adds every tensor of `g` to `w`, the data read from g's mapping when `w` is written. */
static void copy_tensors(const em_gguf *g, em_gguf_writer *w) {
    for (uint64_t i = 0; i < em_gguf_tensor_count(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        char *name = em_str_dup(t->name);
        assert_null(em_gguf_writer_add_tensor(w, name, t->n_dims, t->ne, t->type, t->data, false));
        free(name);
    }
}

/* A token list entry as a C string (the entries checked here are ASCII). */
static void token_text(const em_gguf_kv *tokens, uint64_t id, char *out, size_t size) {
    assert_true(id < tokens->array_len);
    snprintf(out, size, "%.*s", (int)tokens->strings[id].len, tokens->strings[id].ptr);
}

/* The file written without padding: the same tensors, the token list cut at the tokenizer's own
 * tokens (a GGUF from a converter that does not pad), so ids N_TOKENS.. have no token at all. */
static void write_unpadded_gguf(const char *from, const char *to) {
    em_gguf *g;
    assert_null(em_gguf_open(from, &g));
    em_gguf_writer *w;
    assert_null(em_gguf_writer_new(3, &w));
    for (uint64_t i = 0; i < em_gguf_kv_count(g); i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(g, i);
        if (em_str_eq(kv->key, "tokenizer.ggml.tokens")) {
            const char **texts = malloc(N_TOKENS * sizeof *texts);
            uint64_t *lens = malloc(N_TOKENS * sizeof *lens);
            assert_true(texts && lens);
            for (uint32_t k = 0; k < N_TOKENS; k++) texts[k] = kv->strings[k].ptr, lens[k] = kv->strings[k].len;
            assert_null(em_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", texts, lens, N_TOKENS));
            free(texts);
            free(lens);
        } else if (em_str_eq(kv->key, "tokenizer.ggml.token_type")) {
            assert_null(em_gguf_writer_add_array(w, "tokenizer.ggml.token_type", kv->array_type, kv->data, N_TOKENS));
        } else {
            assert_null(em_gguf_writer_copy_kv(w, kv));
        }
    }
    copy_tensors(g, w);
    assert_null(em_gguf_writer_write(w, to));
    em_gguf_writer_free(w);
    em_gguf_close(g);
}

/* Greedy generation of `max_tokens` through the engine; returns the finish and fills tokens. */
static ember_finish_reason generate(const char *model, const int32_t *prompt, size_t n_prompt, int max_tokens,
                                    int32_t *tokens, size_t *n_tokens, char *text, size_t text_size) {
    ember_options o;
    ember_options_default(&o);
    o.model_path = model;
    o.device = "cpu";
    o.threads = 2;
    o.ctx_tokens = 128;
    ember_engine *e;
    ember_error *err = ember_engine_create(&o, &e);
    if (err) fail_msg("%s", ember_error_message(err));
    ember_request_params p;
    ember_request_default(&p);
    p.prompt_ids = prompt;
    p.n_prompt_ids = n_prompt;
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0;
    ember_request *r;
    if ((err = ember_submit(e, &p, &r))) fail_msg("%s", ember_error_message(err));
    ember_output out;
    size_t used = 0;
    *n_tokens = 0;
    do {
        assert_true(ember_request_next(r, &out, 60000));
        for (size_t i = 0; i < out.n_tokens; i++) tokens[(*n_tokens)++] = out.tokens[i].token;
        assert_true(used + out.text_len < text_size);
        memcpy(text + used, out.text, out.text_len);
        used += out.text_len;
    } while (out.finish == EMBER_FINISH_NONE);
    text[used] = 0;
    if (out.finish == EMBER_FINISH_ERROR) fail_msg("generation failed: %s", out.error);
    ember_request_release(r);
    ember_engine_destroy(e);
    return out.finish;
}

static void test_padded_vocabulary(void **state) {
    (void)state;
    reference ref = load_reference("qwen3");
    write_padded_checkpoint(&ref);
    em_convert_options o = {.type = "f32"};
    em_err err = em_convert_hf(DIR "/padded", DIR "/padded.gguf", &o, NULL);
    if (err) fail_msg("convert: %s", em_err_message(err));

    /* The token list: the tokenizer's 384 tokens, then "[PADi]" of type UNUSED (5) up to the rows. */
    em_model *m;
    assert_null(em_model_load(DIR "/padded.gguf", &m));
    assert_int_equal(m->desc.n_vocab, N_ROWS);
    const em_gguf_kv *tokens, *types;
    assert_null(em_gguf_get_array(m->gguf, "tokenizer.ggml.tokens", EM_GGUF_STRING, &tokens));
    assert_null(em_gguf_get_array(m->gguf, "tokenizer.ggml.token_type", EM_GGUF_INT32, &types));
    assert_int_equal(tokens->array_len, N_ROWS);
    assert_int_equal(types->array_len, N_ROWS);
    char text[64];
    token_text(tokens, N_TOKENS, text, sizeof text);
    assert_string_equal(text, "[PAD384]");
    token_text(tokens, N_ROWS - 1, text, sizeof text);
    assert_string_equal(text, "[PAD399]");
    token_text(tokens, 4, text, sizeof text);
    assert_string_equal(text, "<|im_end|>"); /* the tokenizer's own tokens are unchanged */
    for (uint32_t id = N_TOKENS; id < N_ROWS; id++) assert_int_equal(em_gguf_array_int(types, id), 5);
    assert_int_not_equal(em_gguf_array_int(types, N_TOKENS - 1), 5);

    /* Logits over the real tokens are transformers' (padding only adds columns). */
    em_backend_config bc = {.device = "cpu", .n_threads = 2, .block_tokens = 16, .kv_tokens = 64};
    uint32_t blocks[4], seq[64] = {0}, pos[64];
    em_batch_seq table;
    em_batch_fixed_tables(&table, blocks, 1, 4);
    em_backend *b;
    assert_null(em_backend_cpu_new(m, &bc, &b));
    for (uint32_t i = 0; i < ref.n_ids; i++) pos[i] = i;
    bool want[64];
    for (uint32_t i = 0; i < ref.n_ids; i++) want[i] = true;
    em_batch batch = {.n_tokens = ref.n_ids, .tokens = ref.ids, .seq = seq, .pos = pos, .logits = want,
                      .n_seqs = 1, .seqs = &table};
    float *got = malloc((size_t)ref.n_ids * N_ROWS * sizeof *got);
    assert_non_null(got);
    assert_null(em_backend_forward(b, &batch, got));
    float lo = INFINITY, hi = -INFINITY, max_err = 0;
    for (uint32_t t = 0; t < ref.n_ids; t++)
        for (uint32_t v = 0; v < N_TOKENS; v++) {
            float want_logit = ref.logits[(size_t)t * N_TOKENS + v];
            lo = fminf(lo, want_logit);
            hi = fmaxf(hi, want_logit);
            max_err = fmaxf(max_err, fabsf(got[(size_t)t * N_ROWS + v] - want_logit));
        }
    assert_true(max_err <= 1e-3f * (hi - lo));
    /* ... and the rigged padding row wins after the prompt. */
    const float *last = got + (size_t)(ref.n_prompt - 1) * N_ROWS;
    for (uint32_t v = 0; v < N_ROWS; v++)
        if (v != WINNING_PAD) assert_true(last[v] < last[WINNING_PAD]);
    free(got);
    em_backend_free(b);
    em_model_free(m);

    /* Generation: the first token is the padding id, it adds no text, and the request runs to its
     * length like any other. */
    int32_t out[16];
    size_t n_out;
    char reply[1024];
    assert_int_equal(generate(DIR "/padded.gguf", ref.ids, ref.n_prompt, 4, out, &n_out, reply, sizeof reply),
                     EMBER_FINISH_LENGTH);
    assert_int_equal(n_out, 4);
    assert_int_equal(out[0], WINNING_PAD);
    /* A padding id inside the prompt is read like any other token. */
    int32_t prompt[64];
    memcpy(prompt, ref.ids, ref.n_prompt * sizeof *prompt);
    prompt[ref.n_prompt / 2] = PROMPT_PAD;
    assert_int_equal(generate(DIR "/padded.gguf", prompt, ref.n_prompt, 3, out, &n_out, reply, sizeof reply),
                     EMBER_FINISH_LENGTH);
    assert_int_equal(n_out, 3);

    /* The same model with a token list that stops at the tokenizer's tokens: the padding id the
     * model picks has no token at all, and is still an empty piece. */
    write_unpadded_gguf(DIR "/padded.gguf", DIR "/unpadded.gguf");
    char padded_text[1024];
    assert_int_equal(generate(DIR "/padded.gguf", ref.ids, ref.n_prompt, 6, out, &n_out, padded_text,
                              sizeof padded_text),
                     EMBER_FINISH_LENGTH);
    int32_t unpadded_out[16];
    assert_int_equal(generate(DIR "/unpadded.gguf", ref.ids, ref.n_prompt, 6, unpadded_out, &n_out, reply,
                              sizeof reply),
                     EMBER_FINISH_LENGTH);
    assert_int_equal(n_out, 6);
    assert_memory_equal(unpadded_out, out, 6 * sizeof *out);
    assert_string_equal(reply, padded_text);
    free(ref.logits);
}

/* `ember run` generates through the padding id (it used to stop with "detokenize: token id 390
 * outside the vocabulary") and prints it with --print-ids. Runs after test_padded_vocabulary. */
static void test_run_through_padding(void **state) {
    (void)state;
    reference ref = load_reference("qwen3");
    char cmd[2048];
    int at = snprintf(cmd, sizeof cmd, "%s run -m %s --temp 0 -n 3 --print-ids --prompt-ids '", EM_EMBER_EXE,
                      DIR "/unpadded.gguf");
    for (uint32_t i = 0; i < ref.n_prompt; i++) at += snprintf(cmd + at, sizeof cmd - (size_t)at, "%d ", ref.ids[i]);
    snprintf(cmd + at, sizeof cmd - (size_t)at, "%d' 2>&1", PROMPT_PAD);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char output[4096];
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int status = pclose(p);
    if (status != 0) fail_msg("ember run failed (%d):\n%s", status, output);
    int first = -1;
    assert_int_equal(sscanf(output, "%d", &first), 1);
    assert_true(first >= 0 && first < (int)N_ROWS);
    free(ref.logits);
}

/* ---- Gemma 3 layer patterns ---- */

/* The gemma3 fixture's weights (6 layers) under another config.json. */
static em_model *convert_gemma3_with(const char *name, const char *config) {
    char dir[512], out[512];
    mkdir(DIR, 0755);
    snprintf(dir, sizeof dir, DIR "/%s", name);
    mkdir(dir, 0755);
    link_fixture_file("gemma3", "model.safetensors", dir);
    link_fixture_file("gemma3", "tokenizer.json", dir);
    link_fixture_file("gemma3", "tokenizer_config.json", dir);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, config, strlen(config));
    snprintf(out, sizeof out, DIR "/%s.gguf", name);
    em_convert_options o = {.type = "f32"};
    em_err err = em_convert_hf(dir, out, &o, NULL);
    if (err) fail_msg("convert %s: %s", name, em_err_message(err));
    em_model *m;
    if ((err = em_model_load(out, &m))) fail_msg("load %s: %s", out, em_err_message(err));
    return m;
}

#define GEMMA3_CONFIG(extra)                                                                                   \
    "{\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\",\"hidden_size\":64,"            \
    "\"intermediate_size\":128,\"num_hidden_layers\":6,\"num_attention_heads\":4,\"num_key_value_heads\":2,"   \
    "\"head_dim\":16,\"vocab_size\":384,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-06,"               \
    "\"hidden_activation\":\"gelu_pytorch_tanh\",\"query_pre_attn_scalar\":16,\"rope_theta\":1000000.0,"       \
    "\"rope_local_base_freq\":10000.0,\"sliding_window\":8," extra "}"

static void expect_layers(const em_model *m, const char *pattern) {
    assert_int_equal(m->desc.n_layer, strlen(pattern));
    for (uint32_t il = 0; il < m->desc.n_layer; il++) {
        const em_layer_desc *ld = &m->desc.layers[il];
        if (pattern[il] == 'S') {
            assert_int_equal(ld->attn, EM_ATTN_SLIDING);
            assert_int_equal(ld->window, 8);
            assert_float_equal(ld->rope.theta, 10000.0f, 0); /* local layers: their own RoPE base */
        } else {
            assert_int_equal(ld->attn, EM_ATTN_FULL);
            assert_float_equal(ld->rope.theta, 1000000.0f, 0);
        }
    }
}

static void test_gemma3_layer_types(void **state) {
    (void)state;
    /* 5.x: layer_types → one bool per layer, true = sliding */
    em_model *m = convert_gemma3_with(
        "gemma3-types", GEMMA3_CONFIG("\"layer_types\":[\"sliding_attention\",\"full_attention\","
                                      "\"sliding_attention\",\"sliding_attention\",\"full_attention\","
                                      "\"sliding_attention\"]"));
    const em_gguf_kv *kv;
    assert_null(em_gguf_get_array(m->gguf, "gemma3.attention.sliding_window_pattern", EM_GGUF_BOOL, &kv));
    assert_int_equal(kv->array_len, 6);
    static const int want[6] = {1, 0, 1, 1, 0, 1};
    for (int il = 0; il < 6; il++) assert_int_equal(em_gguf_array_int(kv, (uint64_t)il), want[il]);
    expect_layers(m, "SFSSFS");
    em_model_free(m);

    /* 4.x: a period of 3 → the integer form; layers 2 and 5 are global */
    m = convert_gemma3_with("gemma3-period", GEMMA3_CONFIG("\"sliding_window_pattern\":3"));
    uint32_t period;
    assert_null(em_gguf_get_u32(m->gguf, "gemma3.attention.sliding_window_pattern", &period));
    assert_int_equal(period, 3);
    expect_layers(m, "SSFSSF");
    em_model_free(m);

    /* The default pattern writes no key (as llama.cpp's converter), and reads as five then one. */
    m = convert_gemma3_with("gemma3-default", GEMMA3_CONFIG("\"sliding_window_pattern\":6"));
    assert_null(em_gguf_find(m->gguf, "gemma3.attention.sliding_window_pattern"));
    expect_layers(m, "SSSSSF");
    em_model_free(m);
}

/* The loader on GGUF files that set the key by hand: period 0 (every layer slides, llama.cpp's
 * reading), period 1 (none does), and an array that does not have one entry per layer. */
static em_err load_with_pattern(uint32_t period, bool use_array, const uint8_t *array, uint64_t n, em_model **out) {
    em_gguf *g;
    assert_null(em_gguf_open(DIR "/gemma3-default.gguf", &g));
    em_gguf_writer *w;
    assert_null(em_gguf_writer_new(3, &w));
    for (uint64_t i = 0; i < em_gguf_kv_count(g); i++) assert_null(em_gguf_writer_copy_kv(w, em_gguf_kv_at(g, i)));
    if (use_array)
        assert_null(em_gguf_writer_add_array(w, "gemma3.attention.sliding_window_pattern", EM_GGUF_BOOL, array, n));
    else
        assert_null(em_gguf_writer_add_u32(w, "gemma3.attention.sliding_window_pattern", period));
    copy_tensors(g, w);
    assert_null(em_gguf_writer_write(w, DIR "/gemma3-edited.gguf"));
    em_gguf_writer_free(w);
    em_gguf_close(g);
    return em_model_load(DIR "/gemma3-edited.gguf", out);
}

static void test_gemma3_pattern_key(void **state) {
    (void)state;
    em_model *m = convert_gemma3_with("gemma3-default", GEMMA3_CONFIG("\"sliding_window_pattern\":6"));
    em_model_free(m);
    assert_null(load_with_pattern(0, false, NULL, 0, &m));
    expect_layers(m, "SSSSSS");
    em_model_free(m);
    assert_null(load_with_pattern(1, false, NULL, 0, &m));
    expect_layers(m, "FFFFFF");
    em_model_free(m);
    assert_null(load_with_pattern(2, false, NULL, 0, &m));
    expect_layers(m, "SFSFSF");
    em_model_free(m);
    const uint8_t five[5] = {1, 1, 0, 1, 1};
    em_err err = load_with_pattern(0, true, five, 5, &m);
    assert_non_null(err);
    assert_non_null(strstr(em_err_message(err), "one bool per layer"));
    em_err_free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_padded_vocabulary),
        cmocka_unit_test(test_run_through_padding),
        cmocka_unit_test(test_gemma3_layer_types),
        cmocka_unit_test(test_gemma3_pattern_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
