/* `ember convert` of GptOssForCausalLM checkpoints.
 *  - The two forms a checkpoint's experts come in: bf16 matrices with input features outermost
 *    (x @ W) and gate and up interleaved in one matrix, and MXFP4 _blocks/_scales. One tiny model is
 *    written both ways, its dense matrices being transformers' dequantization of its blocks
 *    (convert_moe_packed_tensors: element 2i of a block in the low nibble of byte i, 2i + 1 in the
 *    high one, times 2^(scale - 127), the block's values along the input features, then transposed).
 *    The MXFP4 conversion copies the blocks into GGML's order, the bf16 one transposes and splits:
 *    dequantized, the two GGUF files must hold the same numbers bit for bit, and the gate of the
 *    dense file must be transformers' gate_up[..., ::2].
 *  - Checkpoints missing what gpt-oss needs (sinks), or with blocks of another dtype, are refused
 *    with the tensor named.
 *  - transformers' own logits (tests/fixtures/hf/gpt-oss, when its fixture is present): see
 *    golden_gpt_oss. */
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

#include "gguf/gguf.h"
#include "hf_golden.h"
#include "quant/quant.h"
#include "safetensors_writer.h"

/* The tiny model: 2 layers, width 64, 4 heads of 16 (2 KV heads), 4 experts of 96, choosing 2. */
enum { L = 2, H = 64, NH = 4, NKV = 2, HD = 16, E = 4, F = 96, V = 32 };

/* transformers' FP4 (E2M1) code points, as mxfp4.py lists them. */
static const float fp4_values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t next_random(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float random_float(float scale) { return scale * ((float)(next_random() % 2001) / 1000.0f - 1.0f); }

static void put_random(checkpoint_writer *w, const char *name, json_t *shape, size_t count, float scale) {
    float *v = put(w, name, "F32", shape, count * sizeof(float));
    for (size_t i = 0; i < count; i++) v[i] = random_float(scale);
}

/* Experts of one layer in MXFP4: blocks [E][rows][cols / 32][16] and exponents [E][rows][cols / 32]. */
typedef struct mxfp4_matrix {
    uint8_t blocks[E][2 * F][H / 32 > F / 32 ? H / 32 : F / 32][16];
    uint8_t scales[E][2 * F][H / 32 > F / 32 ? H / 32 : F / 32];
} mxfp4_matrix;

static void random_mxfp4(mxfp4_matrix *m, uint32_t rows, uint32_t cols) {
    for (uint32_t e = 0; e < E; e++)
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t b = 0; b < cols / 32; b++) {
                for (int i = 0; i < 16; i++) m->blocks[e][r][b][i] = (uint8_t)next_random();
                m->scales[e][r][b] = (uint8_t)(120 + next_random() % 8); /* 2^-7 .. 2^0 */
            }
}

/* transformers' dequantization of element (e, r, c): its block's value times 2^(scale - 127). */
static float dequantized(const mxfp4_matrix *m, uint32_t e, uint32_t r, uint32_t c) {
    const uint8_t byte = m->blocks[e][r][c / 32][(c % 32) / 2];
    const float value = fp4_values[c % 2 ? byte >> 4 : byte & 15];
    return ldexpf(value, (int)m->scales[e][r][c / 32] - 127);
}

static const char config_json[] =
    "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"hidden_size\": 64,"
    " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 16, \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"vocab_size\": 32,"
    " \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05, \"sliding_window\": 8, \"attention_bias\": true,"
    " \"hidden_act\": \"silu\", \"swiglu_limit\": 7.0, \"tie_word_embeddings\": false,"
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"],"
    " \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0, \"factor\": 32.0, \"beta_fast\": 32.0,"
    " \"beta_slow\": 1.0, \"original_max_position_embeddings\": 4096, \"truncate\": false}}";

/* Writes the model twice, under DIR/gpt-oss-dense and DIR/gpt-oss-mxfp4; `drop` names a tensor left out
 * of both (NULL: none), `blocks_dtype` the dtype the MXFP4 blocks claim. */
static void write_checkpoints(const char *drop, const char *blocks_dtype) {
    static mxfp4_matrix gate_up[L], down[L];
    checkpoint_writer dense = {.header = json_object()}, packed = {.header = json_object()};
    checkpoint_writer *both[2] = {&dense, &packed};
    char name[128];
    rng_state = 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 2; k++) { /* the same random numbers in both files */
        rng_state = 0x9E3779B97F4A7C15ull;
        checkpoint_writer *w = both[k];
#define RANDOM(shape, count, scale)                                                                       \
    do {                                                                                                  \
        if (!drop || strcmp(drop, name)) put_random(w, name, shape, count, scale);                       \
        else json_decref(shape);                                                                          \
    } while (0)
        snprintf(name, sizeof name, "model.embed_tokens.weight");
        RANDOM(json_pack("[i,i]", V, H), V * H, 1.0f);
        snprintf(name, sizeof name, "model.norm.weight");
        RANDOM(json_pack("[i]", H), H, 1.0f);
        snprintf(name, sizeof name, "lm_head.weight");
        RANDOM(json_pack("[i,i]", V, H), V * H, 0.2f);
        for (uint32_t il = 0; il < L; il++) {
            static const struct { const char *what; int rows, cols; } plain[] = {
                {"input_layernorm.weight", H, 0}, {"post_attention_layernorm.weight", H, 0},
                {"self_attn.q_proj.weight", NH * HD, H}, {"self_attn.q_proj.bias", NH * HD, 0},
                {"self_attn.k_proj.weight", NKV * HD, H}, {"self_attn.k_proj.bias", NKV * HD, 0},
                {"self_attn.v_proj.weight", NKV * HD, H}, {"self_attn.v_proj.bias", NKV * HD, 0},
                {"self_attn.o_proj.weight", H, NH * HD}, {"self_attn.o_proj.bias", H, 0},
                {"self_attn.sinks", NH, 0}, {"mlp.router.weight", E, H}, {"mlp.router.bias", E, 0},
                {"mlp.experts.gate_up_proj_bias", E, 2 * F}, {"mlp.experts.down_proj_bias", E, H},
            };
            for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
                snprintf(name, sizeof name, "model.layers.%u.%s", il, plain[i].what);
                json_t *shape = plain[i].cols ? json_pack("[i,i]", plain[i].rows, plain[i].cols)
                                              : json_pack("[i]", plain[i].rows);
                RANDOM(shape, (size_t)plain[i].rows * (plain[i].cols ? plain[i].cols : 1), 0.3f);
            }
        }
#undef RANDOM
    }
    rng_state = 12345;
    for (uint32_t il = 0; il < L; il++) {
        random_mxfp4(&gate_up[il], 2 * F, H);
        random_mxfp4(&down[il], H, F);
        /* MXFP4: blocks and scales as released */
        const struct { const char *what; const mxfp4_matrix *m; int rows, cols; } mats[] = {
            {"gate_up_proj", &gate_up[il], 2 * F, H}, {"down_proj", &down[il], H, F}};
        for (int k = 0; k < 2; k++) {
            const int rows = mats[k].rows, blocks = mats[k].cols / 32;
            snprintf(name, sizeof name, "model.layers.%u.mlp.experts.%s_blocks", il, mats[k].what);
            uint8_t *b = put(&packed, name, blocks_dtype, json_pack("[i,i,i,i]", E, rows, blocks, 16),
                             (size_t)E * rows * blocks * 16);
            snprintf(name, sizeof name, "model.layers.%u.mlp.experts.%s_scales", il, mats[k].what);
            uint8_t *s = put(&packed, name, "U8", json_pack("[i,i,i]", E, rows, blocks), (size_t)E * rows * blocks);
            for (int e = 0; e < E; e++)
                for (int r = 0; r < rows; r++)
                    for (int j = 0; j < blocks; j++) {
                        memcpy(b, mats[k].m->blocks[e][r][j], 16), b += 16;
                        *s++ = mats[k].m->scales[e][r][j];
                    }
        }
        /* dense: transformers' dequantization, transposed to [E][input][output] */
        snprintf(name, sizeof name, "model.layers.%u.mlp.experts.gate_up_proj", il);
        float *gu = put(&dense, name, "F32", json_pack("[i,i,i]", E, H, 2 * F), (size_t)E * H * 2 * F * 4);
        for (int e = 0; e < E; e++)
            for (int c = 0; c < H; c++)
                for (int j = 0; j < 2 * F; j++) gu[((size_t)e * H + c) * 2 * F + j] = dequantized(&gate_up[il], e, j, c);
        snprintf(name, sizeof name, "model.layers.%u.mlp.experts.down_proj", il);
        float *dn = put(&dense, name, "F32", json_pack("[i,i,i]", E, F, H), (size_t)E * F * H * 4);
        for (int e = 0; e < E; e++)
            for (int c = 0; c < F; c++)
                for (int j = 0; j < H; j++) dn[((size_t)e * F + c) * H + j] = dequantized(&down[il], e, j, c);
    }
    mkdir(DIR, 0755);
    const char *dirs[2] = {DIR "/gpt-oss-dense", DIR "/gpt-oss-mxfp4"};
    for (int k = 0; k < 2; k++) {
        mkdir(dirs[k], 0755);
        char path[512];
        snprintf(path, sizeof path, "%s/model.safetensors", dirs[k]);
        write_safetensors(path, both[k]->header, both[k]->data, both[k]->used);
        free(both[k]->data);
        snprintf(path, sizeof path, "%s/config.json", dirs[k]);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(config_json, 1, strlen(config_json), f), strlen(config_json));
        fclose(f);
    }
}

/* A GGUF tensor's values as f32. */
static float *values_of(const em_gguf_tensor *t) {
    const uint64_t n = t->ne[0] * t->ne[1] * t->ne[2];
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    if (t->type == EM_TYPE_F32) memcpy(v, t->data, n * sizeof *v);
    else assert_null(em_dequantize(t->type, t->data, v, n));
    return v;
}


/* The i-th float of unaligned data. */
static float float_at(const void *data, size_t i) {
    float v;
    memcpy(&v, (const uint8_t *)data + i * sizeof v, sizeof v);
    return v;
}

static void test_mxfp4_and_dense_agree(void **state) {
    (void)state;
    write_checkpoints(NULL, "U8");
    em_convert_options o = {.type = "f32", .no_tokenizer = true};
    assert_null(em_convert_hf(DIR "/gpt-oss-dense", DIR "/gpt-oss-dense.gguf", &o, NULL));
    assert_null(em_convert_hf(DIR "/gpt-oss-mxfp4", DIR "/gpt-oss-mxfp4.gguf", &o, NULL));
    em_gguf *dense, *packed;
    assert_null(em_gguf_open(DIR "/gpt-oss-dense.gguf", &dense));
    assert_null(em_gguf_open(DIR "/gpt-oss-mxfp4.gguf", &packed));
    assert_int_equal(em_gguf_tensor_count(dense), em_gguf_tensor_count(packed));
    /* 3 + per layer: 2 norms, q k v o and their 4 biases, sinks, router and bias, 3 experts and 3 biases */
    assert_int_equal(em_gguf_tensor_count(dense), 3 + L * 19);
    uint32_t mxfp4 = 0;
    for (uint64_t i = 0; i < em_gguf_tensor_count(dense); i++) {
        const em_gguf_tensor *a = em_gguf_tensor_at(dense, i);
        char *tn = em_str_dup(a->name);
        const em_gguf_tensor *b = em_gguf_find_tensor(packed, tn);
        if (!b) fail_msg("%s is only in the dense conversion", tn);
        assert_memory_equal(a->ne, b->ne, sizeof a->ne);
        if (b->type == EM_TYPE_MXFP4) mxfp4++;
        float *va = values_of(a), *vb = values_of(b);
        /* equal as numbers: transformers' code 8 is -0, GGML's +0 */
        for (uint64_t j = 0; j < a->ne[0] * a->ne[1] * a->ne[2]; j++)
            if (!(va[j] == vb[j])) fail_msg("tensor %s differs at %llu: %g, %g", tn, (unsigned long long)j, va[j], vb[j]);
        free(va);
        free(vb);
        free(tn);
    }
    assert_int_equal(mxfp4, 3 * L);
    /* gate = gate_up[..., ::2], up = gate_up[..., 1::2], the bias alike, against the checkpoint */
    em_safetensors *st;
    assert_null(em_safetensors_open(DIR "/gpt-oss-dense/model.safetensors", &st));
    /* safetensors data sits at any byte offset: floats are read through memcpy */
    const void *gate_up = em_safetensors_find(st, "model.layers.1.mlp.experts.gate_up_proj")->data;
    const void *bias = em_safetensors_find(st, "model.layers.1.mlp.experts.gate_up_proj_bias")->data;
    const em_gguf_tensor *gate = em_gguf_find_tensor(dense, "blk.1.ffn_gate_exps.weight");
    const em_gguf_tensor *up = em_gguf_find_tensor(dense, "blk.1.ffn_up_exps.weight");
    const em_gguf_tensor *up_bias = em_gguf_find_tensor(dense, "blk.1.ffn_up_exps.bias");
    assert_true(gate && up && up_bias);
    assert_int_equal(gate->ne[0], H);
    assert_int_equal(gate->ne[1], F);
    assert_int_equal(gate->ne[2], E);
    const float *g = (const float *)gate->data, *u = (const float *)up->data, *ub = (const float *)up_bias->data;
    for (int e = 0; e < E; e++)
        for (int r = 0; r < F; r++) {
            for (int c = 0; c < H; c++) {
                assert_true(g[((size_t)e * F + r) * H + c] == float_at(gate_up, ((size_t)e * H + c) * 2 * F + 2 * r));
                assert_true(u[((size_t)e * F + r) * H + c] == float_at(gate_up, ((size_t)e * H + c) * 2 * F + 2 * r + 1));
            }
            assert_true(ub[(size_t)e * F + r] == float_at(bias, (size_t)e * 2 * F + 2 * r + 1));
        }
    em_safetensors_close(st);
    /* what llama.cpp's converter writes beside the tensors */
    uint32_t u32;
    assert_null(em_gguf_get_u32(dense, "gpt-oss.attention.sliding_window", &u32));
    assert_int_equal(u32, 8);
    assert_null(em_gguf_get_u32(dense, "gpt-oss.expert_feed_forward_length", &u32));
    assert_int_equal(u32, F);
    assert_null(em_gguf_get_u32(dense, "gpt-oss.rope.scaling.original_context_length", &u32));
    assert_int_equal(u32, 4096);
    em_gguf_close(dense);
    em_gguf_close(packed);

    /* the MXFP4 file loads as gpt-oss and runs */
    em_model *m = NULL;
    assert_null(em_model_load(DIR "/gpt-oss-mxfp4.gguf", &m));
    assert_int_equal(m->w.layers[0].gate_exps.type, EM_TYPE_MXFP4);
    assert_int_equal(m->desc.layers[0].attn, EM_ATTN_SLIDING);
    assert_int_equal(m->desc.layers[1].attn, EM_ATTN_FULL);
    em_backend *b = backend_for(m);
    const int32_t tokens[12] = {1, 5, 9, 2, 31, 7, 7, 3, 0, 12, 30, 4};
    float *logits = forward_all(b, tokens, 12, V);
    for (size_t i = 0; i < 12 * V; i++) assert_true(isfinite(logits[i]));
    free(logits);
    em_backend_free(b);
    em_model_free(m);
}

static void expect_convert_error(const char *dir, const char *fragment) {
    em_convert_options o = {.type = "f32", .no_tokenizer = true};
    em_err err = em_convert_hf(dir, DIR "/gpt-oss-broken.gguf", &o, NULL);
    assert_non_null(err);
    if (!strstr(em_err_message(err), fragment)) fail_msg("'%s' does not mention '%s'", em_err_message(err), fragment);
    em_err_free(err);
}

static void test_refused(void **state) {
    (void)state;
    write_checkpoints("model.layers.1.self_attn.sinks", "U8");
    expect_convert_error(DIR "/gpt-oss-dense", "missing tensor 'model.layers.1.self_attn.sinks'");
    write_checkpoints(NULL, "I8");
    expect_convert_error(DIR "/gpt-oss-mxfp4", "'model.layers.0.mlp.experts.gate_up_proj_blocks' has dtype I8");
}

#ifdef EM_HF_GPT_OSS_FIXTURE /* tests/CMakeLists.txt defines it where tests/fixtures/hf/gpt-oss exists */
/* transformers' logits for the fixture made by tools/reference/make_hf_fixtures.py (gpt-oss: bf16
 * weights, sinks, 8-token windows on even layers over a 40-token sequence, YaRN). Its YaRN leaves the
 * correction range unrounded (truncate = false); GGUF's, as llama.cpp computes it, rounds it. So the
 * fixture also holds the logits and greedy tokens of the same weights with truncate = true, which
 * Ember must match as it matches the other families, and transformers' own difference between the
 * two, which bounds Ember's distance from the unrounded logits. */
static void golden_gpt_oss(const char *type) {
    expected rounded = load_expected_as("gpt-oss", "greedy_ids_truncated", "logits_truncated.f32");
    expected unrounded = load_expected_as("gpt-oss", "greedy_ids", "logits.f32");
    char path[512];
    snprintf(path, sizeof path, HF "/gpt-oss/expected.json");
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    const double truncate_change = json_number_value(json_object_get(root, "truncate_max_abs_change"));
    json_decref(root);
    em_model *m = convert_and_load("gpt-oss", type);
    em_backend *b = backend_for(m);
    int32_t seq[64];
    memcpy(seq, rounded.prompt, rounded.n_prompt * sizeof *seq);
    memcpy(seq + rounded.n_prompt, rounded.greedy, rounded.n_greedy * sizeof *seq);
    float *got = forward_all(b, seq, rounded.n_pos, rounded.n_vocab);
    float lo = INFINITY, hi = -INFINITY, err_rounded = 0;
    for (size_t i = 0; i < (size_t)rounded.n_pos * rounded.n_vocab; i++) {
        lo = fminf(lo, rounded.logits[i]);
        hi = fmaxf(hi, rounded.logits[i]);
        err_rounded = fmaxf(err_rounded, fabsf(got[i] - rounded.logits[i]));
    }
    uint32_t same = 0;
    for (uint32_t step = 0; step < rounded.n_greedy; step++)
        same += argmax(got + (size_t)(rounded.n_prompt - 1 + step) * rounded.n_vocab, rounded.n_vocab) ==
                rounded.greedy[step];
    free(got);
    /* the unrounded reference's own greedy sequence */
    memcpy(seq + unrounded.n_prompt, unrounded.greedy, unrounded.n_greedy * sizeof *seq);
    got = forward_all(b, seq, unrounded.n_pos, unrounded.n_vocab);
    float err_unrounded = 0;
    uint32_t same_unrounded = 0;
    for (size_t i = 0; i < (size_t)unrounded.n_pos * unrounded.n_vocab; i++)
        err_unrounded = fmaxf(err_unrounded, fabsf(got[i] - unrounded.logits[i]));
    for (uint32_t step = 0; step < unrounded.n_greedy; step++)
        same_unrounded += argmax(got + (size_t)(unrounded.n_prompt - 1 + step) * unrounded.n_vocab,
                                 unrounded.n_vocab) == unrounded.greedy[step];
    print_message("gpt-oss %s: rounded YaRN: max |logit error| %.3g (%.3g of the range), top-1 %u/%u; unrounded: "
                  "%.3g (transformers' own change from rounding %.3g), top-1 %u/%u\n",
                  type, err_rounded, err_rounded / (hi - lo), same, rounded.n_greedy, err_unrounded, truncate_change,
                  same_unrounded, unrounded.n_greedy);
    if (!strcmp(type, "f32")) {
        assert_true(err_rounded <= 1e-3f * (hi - lo));
        assert_int_equal(same, rounded.n_greedy);
        assert_true(err_unrounded <= truncate_change + 1e-3f * (hi - lo));
    } else {
        assert_true(same >= rounded.n_greedy - 1);
    }
    free(got);
    em_backend_free(b);
    em_model_free(m);
    free(rounded.logits);
    free(unrounded.logits);
}

static void test_golden(void **state) {
    (void)state;
    golden_gpt_oss("f32");
    golden_gpt_oss("q8_0");
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mxfp4_and_dense_agree),
        cmocka_unit_test(test_refused),
#ifdef EM_HF_GPT_OSS_FIXTURE
        cmocka_unit_test(test_golden),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
