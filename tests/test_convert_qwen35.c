/* `ember convert` of Qwen3.5 checkpoints (Qwen3_5ForConditionalGeneration's text part), checked
 * value by value against the conversion llama.cpp's converter defines for GGUF qwen35
 * (conversion/qwen.py: Qwen3_5TextModel):
 *  - every RMSNorm weight gains + 1 (the checkpoint stores the w of x·(1 + w)) except the gated
 *    output norm of the DeltaNet layers (linear_attn.norm), which is stored as is;
 *  - A_log becomes a = −exp(A_log), dt_bias is ssm_dt.bias, the conv1d weight [C, 1, K] is [C][K];
 *  - value heads go from grouped (by key head) to tiled order, in the v rows of in_proj_qkv and of
 *    the conv weight, in z, b, a, dt_bias and A_log, and in the input columns of out_proj: llama.cpp
 *    reshapes the head axis as [key heads][heads per key head] and swaps the two;
 *  - the attention's q_proj keeps its [query | gate] rows per head; the RoPE dimensions are
 *    head_dim · partial_rotary_factor, the sections mrope_section;
 *  - the vision tower and the multi-token-prediction layers are left out.
 * The checkpoint is written by the test (a 4-layer model, key and value head dims unequal, twice
 * as many value heads as key heads), converted, read back as GGUF, loaded and run; checkpoints that
 * GGUF qwen35 cannot express are refused with the field named.
 * transformers' own logits for a tiny Qwen3.5 (tests/fixtures/hf/qwen35, when its fixture is
 * present): test_golden. */
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

enum { L = 4, H = 64, NH = 4, NKV = 2, HD = 32, FF = 96, V = 32 };
enum { HK = 2, HV = 4, DK = 16, DV = 8, K = 4, KEYS = HK * DK, VALUES = HV * DV, CONV = 2 * KEYS + VALUES };
#define TEXT "model.language_model."

/* A checkpoint value: a fixed function of the tensor's name and the element's index, so the
 * expected GGUF values can be worked out without keeping the checkpoint. */
static float source_value(const char *name, uint64_t i) {
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h ^= i * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    return (float)((double)(h >> 40) / (double)(1ull << 24)) - 0.5f;
}

static void put_values(checkpoint_writer *w, const char *name, json_t *shape) {
    size_t count = 1;
    for (size_t d = 0; d < json_array_size(shape); d++) count *= (size_t)json_integer_value(json_array_get(shape, d));
    float *v = put(w, name, "F32", shape, count * sizeof(float));
    for (size_t i = 0; i < count; i++) v[i] = source_value(name, i);
}

static const char config_format[] =
    "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\","
    " \"tie_word_embeddings\": false,"
    " \"vision_config\": {\"depth\": 1, \"hidden_size\": 4, \"out_hidden_size\": 64},"
    " \"text_config\": {\"model_type\": \"qwen3_5_text\", \"vocab_size\": 32, \"hidden_size\": 64,"
    " \"intermediate_size\": 96, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 32, \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06,"
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": false, \"full_attention_interval\": 4,"
    " \"layer_types\": [%s],"
    " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 8,"
    " \"linear_num_key_heads\": 2, %s \"mtp_num_hidden_layers\": 1,"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25,"
    " \"mrope_section\": [1, 2, 1], \"mrope_interleaved\": true}}}";

static const char usual_layers[] = "\"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\"";
static const char usual_value_heads[] = "\"linear_num_value_heads\": 4,";

#define CHECKPOINT DIR "/qwen35-checkpoint"

/* Writes the checkpoint under CHECKPOINT with config.json from `layers` and `value_heads`. */
static void write_checkpoint(const char *layers, const char *value_heads) {
    mkdir(DIR, 0755);
    mkdir(CHECKPOINT, 0755);
    char config[4096], name[160];
    snprintf(config, sizeof config, config_format, layers, value_heads);
    FILE *f = fopen(CHECKPOINT "/config.json", "w");
    assert_non_null(f);
    fputs(config, f);
    fclose(f);
    checkpoint_writer w = {.header = json_object()};
#define PUT(shape, ...) (snprintf(name, sizeof name, __VA_ARGS__), put_values(&w, name, shape))
    PUT(json_pack("[i,i]", V, H), TEXT "embed_tokens.weight");
    PUT(json_pack("[i]", H), TEXT "norm.weight");
    PUT(json_pack("[i,i]", V, H), "lm_head.weight");
    for (int il = 0; il < L; il++) {
        PUT(json_pack("[i]", H), TEXT "layers.%d.input_layernorm.weight", il);
        PUT(json_pack("[i]", H), TEXT "layers.%d.post_attention_layernorm.weight", il);
        PUT(json_pack("[i,i]", FF, H), TEXT "layers.%d.mlp.gate_proj.weight", il);
        PUT(json_pack("[i,i]", FF, H), TEXT "layers.%d.mlp.up_proj.weight", il);
        PUT(json_pack("[i,i]", H, FF), TEXT "layers.%d.mlp.down_proj.weight", il);
        if (il == L - 1) {
            PUT(json_pack("[i,i]", 2 * NH * HD, H), TEXT "layers.%d.self_attn.q_proj.weight", il);
            PUT(json_pack("[i,i]", NKV * HD, H), TEXT "layers.%d.self_attn.k_proj.weight", il);
            PUT(json_pack("[i,i]", NKV * HD, H), TEXT "layers.%d.self_attn.v_proj.weight", il);
            PUT(json_pack("[i,i]", H, NH * HD), TEXT "layers.%d.self_attn.o_proj.weight", il);
            PUT(json_pack("[i]", HD), TEXT "layers.%d.self_attn.q_norm.weight", il);
            PUT(json_pack("[i]", HD), TEXT "layers.%d.self_attn.k_norm.weight", il);
            continue;
        }
        PUT(json_pack("[i,i]", CONV, H), TEXT "layers.%d.linear_attn.in_proj_qkv.weight", il);
        PUT(json_pack("[i,i]", VALUES, H), TEXT "layers.%d.linear_attn.in_proj_z.weight", il);
        PUT(json_pack("[i,i]", HV, H), TEXT "layers.%d.linear_attn.in_proj_b.weight", il);
        PUT(json_pack("[i,i]", HV, H), TEXT "layers.%d.linear_attn.in_proj_a.weight", il);
        PUT(json_pack("[i,i,i]", CONV, 1, K), TEXT "layers.%d.linear_attn.conv1d.weight", il);
        PUT(json_pack("[i]", HV), TEXT "layers.%d.linear_attn.dt_bias", il);
        PUT(json_pack("[i]", HV), TEXT "layers.%d.linear_attn.A_log", il);
        PUT(json_pack("[i]", DV), TEXT "layers.%d.linear_attn.norm.weight", il);
        PUT(json_pack("[i,i]", H, VALUES), TEXT "layers.%d.linear_attn.out_proj.weight", il);
    }
    /* what the text model does not use: an image encoder's tensor, the MTP layer's */
    PUT(json_pack("[i,i]", 12, 4), "model.visual.blocks.0.attn.qkv.weight");
    PUT(json_pack("[i,i]", H, 2 * H), "mtp.fc.weight");
    PUT(json_pack("[i]", H), "mtp.layers.0.input_layernorm.weight");
#undef PUT
    write_safetensors(CHECKPOINT "/model.safetensors", w.header, w.data, w.used);
    free(w.data);
}

static em_err convert(const char *out) {
    em_convert_options o = {.type = "f32", .no_tokenizer = true};
    return em_convert_hf(CHECKPOINT, out, &o, NULL);
}

/* The tiled order as llama.cpp's converter makes it: the heads axis seen as [key heads][heads per key
 * head], the two swapped. order[j] is the checkpoint's head at GGUF head j. */
static void tiled_order(uint32_t *order) {
    uint32_t j = 0;
    for (uint32_t within = 0; within < HV / HK; within++)
        for (uint32_t key = 0; key < HK; key++) order[j++] = key * (HV / HK) + within;
}

/* Which checkpoint index GGUF index i (of a value-head axis starting at `first`, heads of `size`) holds. */
static uint64_t source_index(uint64_t i, uint64_t first, uint64_t size) {
    uint32_t order[HV];
    tiled_order(order);
    if (i < first) return i;
    return first + order[(i - first) / size] * size + (i - first) % size;
}

typedef enum { SAME, PLUS_ONE, NEGATIVE_EXP } value_change;
typedef enum { NO_HEADS, HEAD_ROWS, HEAD_COLUMNS } head_axis;

/* GGUF tensor `name` (f32, rows x cols) against checkpoint tensor `hf`: element (r, c) is the
 * checkpoint's (source row, source column), changed as `change` says, the head axis reordered. */
static void check_tensor(em_gguf *g, const char *name, const char *hf, uint64_t rows, uint64_t cols, value_change change,
                         head_axis axis, uint64_t first, uint64_t head) {
    const em_gguf_tensor *t = em_gguf_find_tensor(g, name);
    if (!t) fail_msg("missing tensor %s", name);
    assert_int_equal(t->type, EM_TYPE_F32);
    assert_int_equal(t->ne[0], cols);
    assert_int_equal(t->ne[1], rows);
    const float *v = t->data;
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t c = 0; c < cols; c++) {
            const uint64_t sr = axis == HEAD_ROWS ? source_index(r, first, head) : r;
            const uint64_t sc = axis == HEAD_COLUMNS ? source_index(c, first, head) : c;
            float want = source_value(hf, sr * cols + sc);
            if (change == PLUS_ONE) want += 1.0f;
            if (change == NEGATIVE_EXP) want = -expf(want);
            if (v[r * cols + c] != want) fail_msg("%s[%llu][%llu] = %g, expected %g (from %s)", name, (unsigned long long)r,
                                                  (unsigned long long)c, v[r * cols + c], want, hf);
        }
}

static uint32_t key_u32(em_gguf *g, const char *key) {
    uint32_t v = 0;
    em_err err = em_gguf_get_u32(g, key, &v);
    if (err) fail_msg("%s", em_err_message(err));
    return v;
}

static void test_converted_values(void **state) {
    (void)state;
    write_checkpoint(usual_layers, usual_value_heads);
    const char *out = DIR "/qwen35-converted.gguf";
    em_err err = convert(out);
    if (err) fail_msg("convert: %s", em_err_message(err));
    em_gguf *g;
    assert_null(em_gguf_open(out, &g));
    em_str arch;
    assert_null(em_gguf_get_str(g, "general.architecture", &arch));
    assert_true(em_str_eq(arch, "qwen35"));
    assert_int_equal(key_u32(g, "qwen35.block_count"), L); /* the MTP layer is not in the file */
    assert_null(em_gguf_find(g, "qwen35.nextn_predict_layers"));
    assert_int_equal(key_u32(g, "qwen35.ssm.conv_kernel"), K);
    assert_int_equal(key_u32(g, "qwen35.ssm.state_size"), DK);
    assert_int_equal(key_u32(g, "qwen35.ssm.group_count"), HK);
    assert_int_equal(key_u32(g, "qwen35.ssm.time_step_rank"), HV);
    assert_int_equal(key_u32(g, "qwen35.ssm.inner_size"), VALUES);
    assert_int_equal(key_u32(g, "qwen35.full_attention_interval"), 4);
    assert_int_equal(key_u32(g, "qwen35.rope.dimension_count"), HD / 4);
    assert_int_equal(key_u32(g, "qwen35.attention.key_length"), HD);
    const em_gguf_kv *sections = em_gguf_find(g, "qwen35.rope.dimension_sections");
    assert_non_null(sections);
    assert_int_equal(sections->array_len, 4);
    const int64_t want_sections[4] = {1, 2, 1, 0};
    for (int i = 0; i < 4; i++) assert_int_equal(em_gguf_array_int(sections, i), want_sections[i]);

    char name[96], hf[160];
#define SRC(...) (snprintf(hf, sizeof hf, __VA_ARGS__), hf)
#define GG(...) (snprintf(name, sizeof name, __VA_ARGS__), name)
    check_tensor(g, "token_embd.weight", TEXT "embed_tokens.weight", V, H, SAME, NO_HEADS, 0, 0);
    check_tensor(g, "output.weight", "lm_head.weight", V, H, SAME, NO_HEADS, 0, 0);
    check_tensor(g, "output_norm.weight", TEXT "norm.weight", 1, H, PLUS_ONE, NO_HEADS, 0, 0);
    for (int il = 0; il < L; il++) {
        check_tensor(g, GG("blk.%d.attn_norm.weight", il), SRC(TEXT "layers.%d.input_layernorm.weight", il), 1, H,
                     PLUS_ONE, NO_HEADS, 0, 0);
        check_tensor(g, GG("blk.%d.post_attention_norm.weight", il),
                     SRC(TEXT "layers.%d.post_attention_layernorm.weight", il), 1, H, PLUS_ONE, NO_HEADS, 0, 0);
        check_tensor(g, GG("blk.%d.ffn_down.weight", il), SRC(TEXT "layers.%d.mlp.down_proj.weight", il), H, FF, SAME,
                     NO_HEADS, 0, 0);
        if (il == L - 1) {
            check_tensor(g, GG("blk.%d.attn_q.weight", il), SRC(TEXT "layers.%d.self_attn.q_proj.weight", il),
                         2 * NH * HD, H, SAME, NO_HEADS, 0, 0);
            check_tensor(g, GG("blk.%d.attn_output.weight", il), SRC(TEXT "layers.%d.self_attn.o_proj.weight", il), H,
                         NH * HD, SAME, NO_HEADS, 0, 0);
            check_tensor(g, GG("blk.%d.attn_k_norm.weight", il), SRC(TEXT "layers.%d.self_attn.k_norm.weight", il), 1,
                         HD, PLUS_ONE, NO_HEADS, 0, 0);
            continue;
        }
        assert_null(em_gguf_find_tensor(g, GG("blk.%d.attn_q.weight", il)));
        check_tensor(g, GG("blk.%d.attn_qkv.weight", il), SRC(TEXT "layers.%d.linear_attn.in_proj_qkv.weight", il), CONV,
                     H, SAME, HEAD_ROWS, 2 * KEYS, DV);
        check_tensor(g, GG("blk.%d.attn_gate.weight", il), SRC(TEXT "layers.%d.linear_attn.in_proj_z.weight", il),
                     VALUES, H, SAME, HEAD_ROWS, 0, DV);
        check_tensor(g, GG("blk.%d.ssm_beta.weight", il), SRC(TEXT "layers.%d.linear_attn.in_proj_b.weight", il), HV, H,
                     SAME, HEAD_ROWS, 0, 1);
        check_tensor(g, GG("blk.%d.ssm_alpha.weight", il), SRC(TEXT "layers.%d.linear_attn.in_proj_a.weight", il), HV,
                     H, SAME, HEAD_ROWS, 0, 1);
        check_tensor(g, GG("blk.%d.ssm_conv1d.weight", il), SRC(TEXT "layers.%d.linear_attn.conv1d.weight", il), CONV,
                     K, SAME, HEAD_ROWS, 2 * KEYS, DV);
        check_tensor(g, GG("blk.%d.ssm_dt.bias", il), SRC(TEXT "layers.%d.linear_attn.dt_bias", il), 1, HV, SAME,
                     HEAD_COLUMNS, 0, 1);
        check_tensor(g, GG("blk.%d.ssm_a", il), SRC(TEXT "layers.%d.linear_attn.A_log", il), 1, HV, NEGATIVE_EXP,
                     HEAD_COLUMNS, 0, 1);
        check_tensor(g, GG("blk.%d.ssm_norm.weight", il), SRC(TEXT "layers.%d.linear_attn.norm.weight", il), 1, DV,
                     SAME, NO_HEADS, 0, 0);
        check_tensor(g, GG("blk.%d.ssm_out.weight", il), SRC(TEXT "layers.%d.linear_attn.out_proj.weight", il), H,
                     VALUES, SAME, HEAD_COLUMNS, 0, DV);
    }
#undef SRC
#undef GG
    /* per layer: 2 norms + 3 FF matrices, and 9 DeltaNet or 6 attention tensors; embeddings, output
     * norm and output: nothing of the vision tower or the MTP layer */
    assert_int_equal(em_gguf_tensor_count(g), 3 + L * 5 + (L - 1) * 9 + 6);
    em_gguf_close(g);

    /* the file loads as the hybrid model it describes, and runs */
    em_model *m = NULL;
    if ((err = em_model_load(out, &m))) fail_msg("load: %s", em_err_message(err));
    for (int il = 0; il < L; il++) {
        const em_layer_desc *ld = &m->desc.layers[il];
        assert_int_equal(ld->mixer, il == L - 1 ? EM_MIXER_ATTENTION : EM_MIXER_DELTA_NET);
        if (il < L - 1) {
            assert_int_equal(ld->delta_net.n_head_k, HK);
            assert_int_equal(ld->delta_net.n_head_v, HV);
            assert_int_equal(ld->delta_net.head_dim_k, DK);
            assert_int_equal(ld->delta_net.head_dim_v, DV);
            assert_true(ld->delta_net.v_tiled);
        }
    }
    assert_true(m->desc.layers[L - 1].attn_output_gate);
    assert_int_equal(m->desc.layers[L - 1].rope.n_rot, HD / 4);
    em_backend *b = backend_for(m);
    const int32_t tokens[6] = {3, 17, 5, 30, 1, 9};
    float *logits = forward_all(b, tokens, 6, V);
    for (int i = 0; i < 6 * V; i++) assert_true(isfinite(logits[i]));
    free(logits);
    em_backend_free(b);
    em_model_free(m);
}

static void expect_refused(const char *layers, const char *value_heads, const char *fragment) {
    write_checkpoint(layers, value_heads);
    em_err err = convert(DIR "/qwen35-refused.gguf");
    assert_non_null(err);
    if (!strstr(em_err_message(err), fragment)) fail_msg("'%s' does not mention '%s'", em_err_message(err), fragment);
    em_err_free(err);
}

static void test_refused(void **state) {
    (void)state;
    expect_refused(usual_layers, "", "linear_num_value_heads");
    expect_refused(usual_layers, "\"linear_num_value_heads\": 3,", "not a multiple of linear_num_key_heads");
    /* GGUF qwen35 says where the attention layers are by full_attention_interval alone */
    expect_refused("\"linear_attention\", \"full_attention\", \"linear_attention\", \"full_attention\"",
                   usual_value_heads, "layer_types[1]");
    expect_refused("\"linear_attention\", \"linear_attention\", \"linear_attention\", \"mamba\"", usual_value_heads,
                   "layer_types[3]");
}

#ifdef EM_HF_QWEN35_FIXTURE
/* transformers' logits of its tiny Qwen3.5 (make_hf_fixtures.py), converted as f32 and q8_0. */
static void test_golden(void **state) {
    (void)state;
    expected e = load_expected("qwen35");
    static const char *const types[2] = {"f32", "q8_0"};
    for (int k = 0; k < 2; k++) {
        em_model *m = convert_and_load("qwen35", types[k]);
        em_backend *b = backend_for(m);
        int32_t seq[64];
        memcpy(seq, e.prompt, e.n_prompt * sizeof *seq);
        memcpy(seq + e.n_prompt, e.greedy, e.n_greedy * sizeof *seq);
        float *got = forward_all(b, seq, e.n_pos, e.n_vocab);
        float lo = INFINITY, hi = -INFINITY, max_err = 0;
        uint32_t same = 0;
        for (size_t i = 0; i < (size_t)e.n_pos * e.n_vocab; i++) {
            lo = fminf(lo, e.logits[i]);
            hi = fmaxf(hi, e.logits[i]);
            max_err = fmaxf(max_err, fabsf(got[i] - e.logits[i]));
        }
        for (uint32_t step = 0; step < e.n_greedy; step++)
            same += argmax(got + (size_t)(e.n_prompt - 1 + step) * e.n_vocab, e.n_vocab) == e.greedy[step];
        print_message("qwen35 %s: max |logit error| %.3g (%.3g of the range), top-1 %u/%u\n", types[k], max_err,
                      max_err / (hi - lo), same, e.n_greedy);
        if (k == 0) {
            assert_true(max_err <= 1e-3f * (hi - lo));
            assert_int_equal(same, e.n_greedy);
        } else {
            assert_true(same >= e.n_greedy - 1);
        }
        free(got);
        em_backend_free(b);
        em_model_free(m);
    }
    free(e.logits);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_converted_values),
        cmocka_unit_test(test_refused),
#ifdef EM_HF_QWEN35_FIXTURE
        cmocka_unit_test(test_golden),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
