/* `ember convert` against transformers: each checkpoint in tests/fixtures/hf (tiny random models
 * that tools/reference/make_hf_fixtures.py saved with transformers, together with its float64
 * logits and greedy continuation) is converted, loaded by the family loader and run by the CPU
 * reference forward. f32: every logit within 1e-3 of the logit range and the same 16 greedy
 * tokens (decoded one at a time through the KV cache). q8_0: the reference's greedy token is the
 * top-1 at >= 15 of the 16 positions, fed the reference sequence.
 * Also: the safetensors reader on malformed headers, config.json in 4.x and 5.x spellings, and the
 * converter's errors. */
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
#include "gguf/gguf.h"
#include "hf_golden.h"
#include "model/convert/convert.h"
#include "model/model.h"
#include "safetensors_writer.h"

static void golden_f32(const char *family) {
    expected e = load_expected(family);
    em_model *m = convert_and_load(family, "f32");
    assert_int_equal(m->desc.n_vocab, e.n_vocab);
    em_backend *b = backend_for(m);
    int32_t seq[64];
    memcpy(seq, e.prompt, e.n_prompt * sizeof *seq);
    memcpy(seq + e.n_prompt, e.greedy, e.n_greedy * sizeof *seq);

    float *got = forward_all(b, seq, e.n_pos, e.n_vocab);
    float lo = INFINITY, hi = -INFINITY, max_err = 0;
    for (size_t i = 0; i < (size_t)e.n_pos * e.n_vocab; i++) {
        lo = fminf(lo, e.logits[i]);
        hi = fmaxf(hi, e.logits[i]);
        max_err = fmaxf(max_err, fabsf(got[i] - e.logits[i]));
    }
    print_message("%-9s f32: max |logit error| %.3g, %.3g of the range %.3f\n", family, max_err, max_err / (hi - lo),
                  hi - lo);
    assert_true(max_err <= 1e-3f * (hi - lo));

    /* Greedy decoding through the KV cache: prefill the prompt, then one token at a time. */
    uint32_t zero[64] = {0}, pos[64];
    for (uint32_t i = 0; i < e.n_prompt; i++) pos[i] = i;
    float *row = malloc(e.n_vocab * sizeof *row);
    em_batch prefill = {.n_tokens = e.n_prompt, .tokens = e.prompt, .seq = zero, .pos = pos, .logits = NULL, .n_seqs = 1, .seqs = &table};
    assert_null(em_backend_forward(b, &prefill, row));
    for (uint32_t step = 0; step < e.n_greedy; step++) {
        int32_t next = argmax(row, e.n_vocab);
        assert_int_equal(next, e.greedy[step]);
        uint32_t p = e.n_prompt + step;
        em_batch one = {.n_tokens = 1, .tokens = &next, .seq = zero, .pos = &p, .logits = NULL, .n_seqs = 1, .seqs = &table};
        assert_null(em_backend_forward(b, &one, row));
    }
    free(row);
    free(got);
    em_backend_free(b);
    em_model_free(m);
    free(e.logits);
}

static void golden_q8_0(const char *family) {
    expected e = load_expected(family);
    em_model *m = convert_and_load(family, "q8_0");
    em_backend *b = backend_for(m);
    int32_t seq[64];
    memcpy(seq, e.prompt, e.n_prompt * sizeof *seq);
    memcpy(seq + e.n_prompt, e.greedy, e.n_greedy * sizeof *seq);
    float *got = forward_all(b, seq, e.n_pos, e.n_vocab);
    uint32_t same = 0;
    for (uint32_t step = 0; step < e.n_greedy; step++)
        same += argmax(got + (size_t)(e.n_prompt - 1 + step) * e.n_vocab, e.n_vocab) == e.greedy[step];
    print_message("%-9s q8_0: top-1 equal at %u of %u steps\n", family, same, e.n_greedy);
    assert_true(same >= e.n_greedy - 1);
    free(got);
    em_backend_free(b);
    em_model_free(m);
    free(e.logits);
}

#define GOLDEN(name)                                  \
    static void test_##name(void **state) {           \
        (void)state;                                  \
        golden_f32(#name);                            \
        golden_q8_0(#name);                           \
    }
GOLDEN(llama)
GOLDEN(mistral)
GOLDEN(mixtral)
GOLDEN(qwen2)
GOLDEN(qwen3)
GOLDEN(qwen3moe)
GOLDEN(gemma2)
GOLDEN(gemma3)
GOLDEN(gemma3mm)
GOLDEN(gemma3pattern) /* Gemma 3 whose second of four layers is global (not five sliding, one global) */

/* What the converter writes, checked against what llama.cpp's converter writes for these models. */
static void test_metadata(void **state) {
    (void)state;
    em_model *m = convert_and_load("llama", "f32");
    em_gguf *g = m->gguf;
    em_str s;
    uint32_t u;
    assert_null(em_gguf_get_str(g, "general.architecture", &s));
    assert_true(em_str_eq(s, "llama"));
    assert_null(em_gguf_get_u32(g, "llama.rope.dimension_count", &u));
    assert_int_equal(u, 16);
    assert_null(em_gguf_get_str(g, "tokenizer.ggml.model", &s));
    assert_true(em_str_eq(s, "gpt2"));
    assert_null(em_gguf_get_str(g, "tokenizer.chat_template", &s));
    assert_true(s.len > 10);
    /* Llama 3 scaling, original context 32, factors 1 / 4, theta 5e5, head dim 16: divisor of pair i. */
    const em_gguf_tensor *rf = em_gguf_find_tensor(g, "rope_freqs.weight");
    assert_non_null(rf);
    assert_int_equal(rf->ne[0], 8);
    const float *f = rf->data;
    for (int i = 0; i < 8; i++) {
        double wavelen = 2 * 3.14159265358979323846 * pow(500000.0, 2.0 * i / 16), want;
        if (wavelen < 8) want = 1;
        else if (wavelen > 32) want = 8;
        else {
            double sm = (32 / wavelen - 1) / 3;
            want = 1 / ((1 - sm) / 8 + sm);
        }
        assert_float_equal(f[i], want, 1e-5 * want);
    }
    assert_float_equal(f[0], 1.0f, 0);
    assert_float_equal(f[7], 8.0f, 0);
    assert_non_null(em_gguf_find_tensor(g, "output.weight"));
    em_model_free(m);

    /* Mistral's window on every layer of GGUF llama */
    m = convert_and_load("mistral", "f32");
    assert_null(em_gguf_get_u32(m->gguf, "llama.attention.sliding_window", &u));
    assert_int_equal(u, 8);
    for (uint32_t il = 0; il < m->desc.n_layer; il++) {
        assert_int_equal(m->desc.layers[il].attn, EM_ATTN_SLIDING);
        assert_int_equal(m->desc.layers[il].window, 8);
    }
    em_model_free(m);

    m = convert_and_load("gemma3", "f32");
    g = m->gguf;
    assert_null(em_gguf_get_u32(g, "gemma3.attention.sliding_window", &u));
    assert_int_equal(u, 8);
    assert_null(em_gguf_get_str(g, "gemma3.rope.scaling.type", &s));
    assert_true(em_str_eq(s, "linear"));
    assert_null(em_gguf_find_tensor(g, "output.weight")); /* tied */
    assert_int_equal(m->desc.layers[0].attn, EM_ATTN_SLIDING);
    assert_int_equal(m->desc.layers[5].attn, EM_ATTN_FULL);
    em_model_free(m);

    m = convert_and_load("qwen3moe", "q8_0");
    const em_gguf_tensor *t = em_gguf_find_tensor(m->gguf, "blk.1.ffn_down_exps.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 64);
    assert_int_equal(t->ne[2], 4);
    assert_int_equal(t->type, 8); /* Q8_0 */
    t = em_gguf_find_tensor(m->gguf, "blk.0.ffn_gate_inp.weight");
    assert_int_equal(t->type, 0); /* routers stay f32 */
    t = em_gguf_find_tensor(m->gguf, "blk.0.attn_norm.weight");
    assert_int_equal(t->type, 0);
    assert_true(m->desc.layers[0].renormalize);
    em_model_free(m);
}

/* ---- safetensors reader ---- */

/* A file image: 8-byte length, header, then `data_len` zero bytes. */
static uint8_t *image(const char *header, size_t data_len, size_t *size) {
    size_t n = strlen(header);
    *size = 8 + n + data_len;
    uint8_t *b = calloc(1, *size);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, header, n);
    return b;
}

static em_err parse(const char *header, size_t data_len) {
    size_t size;
    uint8_t *b = image(header, data_len, &size);
    em_safetensors *st = NULL;
    em_err err = em_safetensors_parse(b, size, "t.safetensors", &st);
    em_safetensors_close(st);
    free(b);
    return err;
}

static void expect_error(const char *header, size_t data_len, const char *fragment) {
    em_err err = parse(header, data_len);
    if (!err) fail_msg("accepted: %s", header);
    if (!strstr(em_err_message(err), fragment))
        fail_msg("'%s' does not mention '%s'", em_err_message(err), fragment);
    assert_non_null(strstr(em_err_message(err), "t.safetensors"));
    em_err_free(err);
}

static void test_safetensors_valid(void **state) {
    (void)state;
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ";
    size_t size;
    uint8_t *b = image(h, 12, &size);
    float one = 1.5f, two = -2.0f;
    size_t d = size - 12;
    memcpy(b + d, &one, 4);
    memcpy(b + d + 4, &two, 4);
    b[d + 8] = 0x80; /* bf16 0x3f80 = 1.0 */
    b[d + 9] = 0x3f;
    b[d + 10] = 0x00; /* bf16 0xc040 = -3.0 */
    b[d + 11] = 0xc0;
    b[d + 10] = 0x40;
    b[d + 11] = 0xc0;
    em_safetensors *st;
    assert_null(em_safetensors_parse(b, size, "t.safetensors", &st));
    assert_int_equal(em_safetensors_count(st), 2);
    const em_st_tensor *a = em_safetensors_find(st, "a"), *bb = em_safetensors_find(st, "b");
    assert_non_null(a);
    assert_non_null(bb);
    assert_ptr_equal(em_safetensors_at(st, 0), a); /* sorted by offset */
    float out[2];
    assert_null(em_st_read_f32(a, 0, 2, out));
    assert_float_equal(out[0], 1.5f, 0);
    assert_float_equal(out[1], -2.0f, 0);
    assert_null(em_st_read_f32(bb, 0, 2, out));
    assert_float_equal(out[0], 1.0f, 0);
    assert_float_equal(out[1], -3.0f, 0);
    em_err err = em_st_read_f32(bb, 1, 2, out);
    assert_non_null(err);
    em_err_free(err);
    assert_null(em_safetensors_find(st, "c"));
    em_safetensors_close(st);
    free(b);
    /* an empty tensor list is a valid file */
    assert_null(parse("{}", 0));
}

static void test_safetensors_malformed(void **state) {
    (void)state;
    uint8_t tiny[4] = {0};
    em_safetensors *st;
    em_err err = em_safetensors_parse(tiny, sizeof tiny, "t.safetensors", &st);
    assert_non_null(err);
    assert_null(st);
    em_err_free(err);
    uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    err = em_safetensors_parse(huge, sizeof huge, "t.safetensors", &st);
    assert_non_null(strstr(em_err_message(err), "header length"));
    em_err_free(err);
    uint8_t past[12] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    err = em_safetensors_parse(past, sizeof past, "t.safetensors", &st);
    assert_non_null(strstr(em_err_message(err), "past the end"));
    em_err_free(err);

    expect_error("[1,2]", 0, "'{'");
    expect_error("{\"a\":", 0, "JSON");
    expect_error("{\"a\":1}", 0, "not a JSON object");
    expect_error("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "no dtype");
    expect_error("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype 'F33'");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "dimensions");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
                 "overflows");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "needs 8");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 2, "past the data");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "begin > end");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "data_offsets");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[2,6]}}",
                 6, "overlap");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 4, "JSON");
    expect_error("{\"__metadata__\":{\"x\":1}}", 0, "__metadata__");
}

static void test_safetensors_file(void **state) {
    (void)state;
    em_safetensors *st;
    em_err err = em_safetensors_open(DIR "/does-not-exist.safetensors", &st);
    assert_int_equal(em_err_code_of(err), EM_ERR_IO);
    em_err_free(err);
    assert_null(em_safetensors_open(HF "/qwen2/model.safetensors", &st));
    const em_st_tensor *t = em_safetensors_find(st, "model.embed_tokens.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, EM_ST_F16);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 384);
    assert_int_equal(t->shape[1], 64);
    em_safetensors_close(st);
}

/* ---- config.json ---- */

static em_hf_config config_of(const char *json) {
    em_hf_config c;
    em_err err = em_hf_config_parse(json, strlen(json), "config.json", &c);
    if (err) fail_msg("%s", em_err_message(err));
    return c;
}

static void test_config_4x(void **state) {
    (void)state;
    /* Llama 3.2 as transformers 4.x writes it */
    em_hf_config c = config_of(
        "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":2048,\"intermediate_size\":8192,"
        "\"num_hidden_layers\":16,\"num_attention_heads\":32,\"num_key_value_heads\":8,\"vocab_size\":128256,"
        "\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-05,\"rope_theta\":500000.0,\"hidden_act\":\"silu\","
        "\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
        "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"tie_word_embeddings\":true,"
        "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"head_dim\":64}");
    assert_string_equal(c.arch, "LlamaForCausalLM");
    assert_int_equal(c.n_head_kv, 8);
    assert_int_equal(c.head_dim, 64);
    assert_float_equal(c.rope.theta, 500000.0, 0);
    assert_int_equal(c.rope.type, EM_HF_ROPE_LLAMA3);
    assert_float_equal(c.rope.factor, 32.0, 0);
    assert_int_equal(c.rope.original_ctx, 8192);
    assert_true(c.tie_embeddings);
    assert_int_equal(c.eos_id, 128001);
    em_hf_config_free(&c);

    /* Qwen3-MoE 4.x: num_experts; Gemma 3 4.x: rope_local_base_freq, sliding_window_pattern, old "type" key */
    c = config_of("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":2048,\"num_hidden_layers\":48,"
                  "\"num_attention_heads\":32,\"num_key_value_heads\":4,\"vocab_size\":151936,\"num_experts\":128,"
                  "\"num_experts_per_tok\":8,\"moe_intermediate_size\":768,\"norm_topk_prob\":true,"
                  "\"rope_theta\":1000000.0,\"rope_scaling\":null,\"sliding_window\":null}");
    assert_int_equal(c.n_expert, 128);
    assert_int_equal(c.n_expert_used, 8);
    assert_int_equal(c.n_ff_expert, 768);
    assert_true(c.norm_topk_prob);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(c.rope.type, EM_HF_ROPE_DEFAULT);
    em_hf_config_free(&c);
    c = config_of("{\"architectures\":[\"Gemma3ForCausalLM\"],\"hidden_size\":1152,\"num_hidden_layers\":26,"
                  "\"num_attention_heads\":4,\"num_key_value_heads\":1,\"head_dim\":256,\"vocab_size\":262144,"
                  "\"rope_theta\":1000000.0,\"rope_local_base_freq\":10000.0,\"sliding_window\":512,"
                  "\"sliding_window_pattern\":6,\"rope_scaling\":{\"type\":\"linear\",\"factor\":8.0},"
                  "\"hidden_activation\":\"gelu_pytorch_tanh\",\"query_pre_attn_scalar\":256}");
    assert_int_equal(c.rope.type, EM_HF_ROPE_LINEAR);
    assert_float_equal(c.rope.factor, 8.0, 0);
    assert_float_equal(c.rope.theta, 1e6, 0);
    assert_true(c.rope_local_given);
    assert_float_equal(c.rope_local.theta, 10000.0, 0);
    assert_int_equal(c.rope_local.type, EM_HF_ROPE_DEFAULT);
    assert_int_equal(c.sliding_window_pattern, 6);
    assert_null(c.layer_sliding);
    assert_string_equal(c.act, "gelu_pytorch_tanh");
    em_hf_config_free(&c);
}

static void test_config_5x(void **state) {
    (void)state;
    /* the fixtures were written by transformers 5.x: rope_parameters per layer type, layer_types */
    char *text;
    FILE *f = fopen(HF "/gemma3/config.json", "rb");
    assert_non_null(f);
    text = calloc(1, 65536);
    size_t n = fread(text, 1, 65535, f);
    fclose(f);
    em_hf_config c;
    assert_null(em_hf_config_parse(text, n, "config.json", &c));
    free(text);
    assert_int_equal(c.n_layer, 6);
    assert_int_equal(c.rope.type, EM_HF_ROPE_LINEAR);
    assert_float_equal(c.rope.factor, 4.0, 0);
    assert_float_equal(c.rope.theta, 1e6, 0);
    assert_true(c.rope_local_given);
    assert_float_equal(c.rope_local.theta, 10000.0, 0);
    assert_non_null(c.layer_sliding);
    for (int i = 0; i < 6; i++) assert_int_equal(c.layer_sliding[i], i < 5);
    assert_int_equal(c.sliding_window, 8);
    em_hf_config_free(&c);

    c = config_of("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                  "\"num_attention_heads\":4,\"vocab_size\":384,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
                  "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":1e6,\"factor\":4.0,"
                  "\"original_max_position_embeddings\":32768,\"beta_fast\":32,\"beta_slow\":1}}");
    assert_int_equal(c.n_expert, 4);
    assert_int_equal(c.n_head_kv, 4);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.rope.type, EM_HF_ROPE_YARN);
    assert_int_equal(c.rope.original_ctx, 32768);
    assert_float_equal(c.rope.beta_fast, 32, 0);
    em_hf_config_free(&c);
}

/* Fields a config.json leaves out take the values of transformers' configuration classes; null
 * means none. */
static void test_config_class_defaults(void **state) {
    (void)state;
    em_hf_config c = config_of("{\"architectures\":[\"Gemma2ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                               "\"vocab_size\":9}");
    assert_float_equal(c.attn_softcap, 50.0, 0);
    assert_float_equal(c.final_softcap, 30.0, 0);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(c.n_head, 8);
    assert_int_equal(c.n_head_kv, 4);
    assert_int_equal(c.head_dim, 256);
    assert_string_equal(c.act, "gelu_pytorch_tanh");
    em_hf_config_free(&c);
    c = config_of("{\"architectures\":[\"Gemma2ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                  "\"vocab_size\":9,\"attn_logit_softcapping\":null,\"sliding_window\":null,\"num_attention_heads\":16}");
    assert_float_equal(c.attn_softcap, 0.0, 0);
    assert_float_equal(c.final_softcap, 30.0, 0);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(c.n_head, 16);
    assert_int_equal(c.n_head_kv, 4);
    em_hf_config_free(&c);
    c = config_of("{\"architectures\":[\"MixtralForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                  "\"num_attention_heads\":4,\"vocab_size\":9,\"head_dim\":null}");
    assert_float_equal(c.rope.theta, 1e6, 0);
    assert_int_equal(c.n_expert, 8);
    assert_int_equal(c.n_expert_used, 2);
    assert_int_equal(c.head_dim, 16);
    assert_false(c.head_dim_given);
    em_hf_config_free(&c);
    c = config_of("{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                  "\"num_attention_heads\":4,\"vocab_size\":9}");
    assert_int_equal(c.sliding_window, 4096);
    assert_float_equal(c.rope.theta, 1e4, 0);
    em_hf_config_free(&c);
    c = config_of("{\"architectures\":[\"Gemma3ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":6,"
                  "\"vocab_size\":9}");
    assert_float_equal(c.rope.theta, 1e6, 0);
    assert_true(c.rope_local_given);
    assert_float_equal(c.rope_local.theta, 1e4, 0);
    assert_int_equal(c.sliding_window_pattern, 6);
    assert_float_equal(c.query_pre_attn_scalar, 256, 0);
    em_hf_config_free(&c);
    c = config_of("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                  "\"num_attention_heads\":4,\"vocab_size\":9}");
    assert_int_equal(c.n_expert, 128);
    assert_int_equal(c.n_expert_used, 8);
    assert_int_equal(c.n_ff_expert, 768);
    assert_false(c.norm_topk_given);
    em_hf_config_free(&c);
    /* a multimodal Gemma 3 as transformers 4.x saved it: text_config holds only what differs */
    c = config_of("{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"model_type\":\"gemma3\","
                  "\"eos_token_id\":[1,106],\"text_config\":{\"hidden_size\":2560,\"intermediate_size\":10240,"
                  "\"model_type\":\"gemma3_text\",\"num_hidden_layers\":34,\"rope_scaling\":{\"factor\":8.0,"
                  "\"rope_type\":\"linear\"},\"sliding_window\":1024},\"vision_config\":{\"hidden_size\":1152}}");
    assert_int_equal(c.n_layer, 34);
    assert_int_equal(c.n_embd, 2560);
    assert_int_equal(c.n_head, 8);
    assert_int_equal(c.n_head_kv, 4);
    assert_int_equal(c.head_dim, 256);
    assert_int_equal(c.n_vocab, 262208);
    assert_int_equal(c.sliding_window, 1024);
    assert_int_equal(c.rope.type, EM_HF_ROPE_LINEAR);
    assert_float_equal(c.rope.factor, 8.0, 0);
    assert_float_equal(c.rope.theta, 1e6, 0);
    assert_float_equal(c.rope_local.theta, 1e4, 0);
    assert_int_equal(c.eos_id, 1);
    em_hf_config_free(&c);
}

static void expect_config_error(const char *json, const char *fragment) {
    em_hf_config c;
    em_err err = em_hf_config_parse(json, strlen(json), "config.json", &c);
    if (!err) fail_msg("accepted: %s", json);
    if (!strstr(em_err_message(err), fragment)) fail_msg("'%s' does not mention '%s'", em_err_message(err), fragment);
    em_err_free(err);
}

static void test_config_errors(void **state) {
    (void)state;
    expect_config_error("{", "JSON");
    expect_config_error("{\"hidden_size\":64}", "'architectures'");
    expect_config_error("{\"architectures\":[\"X\"],\"hidden_size\":64,\"num_attention_heads\":4,\"vocab_size\":9}",
                        "'num_hidden_layers'");
    expect_config_error("{\"architectures\":[\"X\"],\"num_hidden_layers\":2,\"hidden_size\":\"64\","
                        "\"num_attention_heads\":4,\"vocab_size\":9}",
                        "'hidden_size'");
    expect_config_error("{\"architectures\":[\"X\"],\"num_hidden_layers\":2,\"hidden_size\":64,"
                        "\"num_attention_heads\":4,\"num_key_value_heads\":3,\"vocab_size\":9}",
                        "KV heads");
    expect_config_error("{\"architectures\":[\"X\"],\"num_hidden_layers\":2,\"hidden_size\":64,"
                        "\"num_attention_heads\":4,\"vocab_size\":9,\"rope_scaling\":{\"rope_type\":\"longrope\"}}",
                        "'longrope'");
    expect_config_error("{\"architectures\":[\"X\"],\"num_hidden_layers\":2,\"hidden_size\":64,"
                        "\"num_attention_heads\":4,\"vocab_size\":9,\"layer_types\":[\"full_attention\"]}",
                        "'layer_types'");
}

/* ---- converter errors ---- */

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void expect_convert_error(const char *dir, const char *fragment) {
    em_convert_options o = {.type = "f32", .no_tokenizer = true};
    em_err err = em_convert_hf(dir, DIR "/broken.gguf", &o, NULL);
    if (!err) fail_msg("converted %s", dir);
    if (!strstr(em_err_message(err), fragment)) fail_msg("'%s' does not mention '%s'", em_err_message(err), fragment);
    em_err_free(err);
    struct stat sb;
    assert_int_not_equal(stat(DIR "/broken.gguf", &sb), 0); /* no partial file left */
}

static void test_convert_errors(void **state) {
    (void)state;
    mkdir(DIR, 0755);
    const char *dir = DIR "/broken";
    mkdir(dir, 0755);
    const char *cfg = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                      "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":2}";
    write_file(DIR "/broken/config.json", cfg, strlen(cfg));
    /* only the embedding: the converter asks for the first missing layer tensor by name */
    const char *h = "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2,64],\"data_offsets\":[0,512]}}";
    size_t size;
    uint8_t *b = image(h, 512, &size);
    write_file(DIR "/broken/model.safetensors", b, size);
    expect_convert_error(dir, "missing tensor 'model.layers.0.input_layernorm.weight'");
    /* a shape that config.json does not imply */
    free(b);
    h = "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2,32],\"data_offsets\":[0,256]}}";
    b = image(h, 256, &size);
    write_file(DIR "/broken/model.safetensors", b, size);
    expect_convert_error(dir, "config.json implies [2, 64]");
    /* a malformed header names the file */
    b[8] = '[';
    write_file(DIR "/broken/model.safetensors", b, size);
    expect_convert_error(dir, "broken/model.safetensors");
    free(b);
    const char *unknown = "{\"architectures\":[\"GPTNeoXForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":1,"
                          "\"num_attention_heads\":4,\"vocab_size\":2}";
    write_file(DIR "/broken/config.json", unknown, strlen(unknown));
    expect_convert_error(dir, "'GPTNeoXForCausalLM' is not supported");
    em_convert_options o = {.type = "q5_k_xl"};
    em_err err = em_convert_hf(HF "/qwen2", DIR "/broken.gguf", &o, NULL);
    assert_non_null(strstr(em_err_message(err), "unknown quantization type 'q5_k_xl'"));
    em_err_free(err);
}


/* f16 and bf16 outputs keep the greedy path; q4_k (llama.cpp's name for its Q4_K_M recipe) keeps
 * attn_q at Q4_K, whose 256-element block does not divide a 64-wide row: llama.cpp's quantizer
 * falls back to Q5_0 there. */
static void test_output_types(void **state) {
    (void)state;
    static const char *const types[] = {"f16", "bf16", "q4_k"};
    expected e = load_expected("qwen3");
    int32_t seq[64];
    memcpy(seq, e.prompt, e.n_prompt * sizeof *seq);
    memcpy(seq + e.n_prompt, e.greedy, e.n_greedy * sizeof *seq);
    for (size_t k = 0; k < 3; k++) {
        em_model *m = convert_and_load("qwen3", types[k]);
        const em_gguf_tensor *t = em_gguf_find_tensor(m->gguf, "blk.0.attn_q.weight");
        uint32_t want = k == 0 ? 1 /* F16 */ : k == 1 ? 30 /* BF16 */ : 6 /* Q5_0 */;
        assert_int_equal(t->type, want);
        assert_int_equal(em_gguf_find_tensor(m->gguf, "blk.0.attn_q_norm.weight")->type, 0);
        em_backend *b = backend_for(m);
        float *got = forward_all(b, seq, e.n_pos, e.n_vocab);
        uint32_t same = 0;
        for (uint32_t step = 0; step < e.n_greedy; step++)
            same += argmax(got + (size_t)(e.n_prompt - 1 + step) * e.n_vocab, e.n_vocab) == e.greedy[step];
        print_message("qwen3     %s: top-1 equal at %u of %u steps\n", types[k], same, e.n_greedy);
        /* 5-bit weights (Q5_0) move the logits of this small random checkpoint more than 16-bit
         * ones do: one more near tie may flip */
        assert_true(same >= e.n_greedy - (k == 2 ? 2 : 1));
        free(got);
        em_backend_free(b);
        em_model_free(m);
    }
    free(e.logits);
}

/* transformers 5.x keeps experts fused in memory (gate_up_proj [E][2F][D], down_proj [E][D][F]);
 * a checkpoint saved that way converts to the same expert tensors as the per-expert one. */
static void test_fused_experts(void **state) {
    (void)state;
    mkdir(DIR, 0755);
    mkdir(DIR "/fused", 0755);
    em_safetensors *st;
    assert_null(em_safetensors_open(HF "/qwen3moe/model.safetensors", &st));
    const uint32_t E = 4, F = 64, D = 64, L = 2;
    json_t *header = json_object();
    size_t cap = 8u << 20, used = 0;
    uint8_t *data = malloc(cap);
    assert_non_null(data);
#define PUT(name, shape_json, bytes_expr)                                                            \
    do {                                                                                             \
        json_t *entry = json_pack("{s:s,s:o,s:[I,I]}", "dtype", "F32", "shape", shape_json, "data_offsets", \
                                  (json_int_t)used, (json_int_t)(used + (bytes_expr)));              \
        json_object_set_new(header, name, entry);                                                    \
    } while (0)
    for (size_t i = 0; i < em_safetensors_count(st); i++) {
        const em_st_tensor *t = em_safetensors_at(st, i);
        if (strstr(t->name, ".experts.")) continue;
        assert_int_equal(t->dtype, EM_ST_F32);
        json_t *shape = json_array();
        for (uint32_t d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        PUT(t->name, shape, t->size);
        memcpy(data + used, t->data, t->size);
        used += t->size;
    }
    char name[128];
    for (uint32_t il = 0; il < L; il++) {
        snprintf(name, sizeof name, "model.layers.%u.mlp.experts.gate_up_proj", il);
        PUT(name, json_pack("[i,i,i]", E, 2 * F, D), (size_t)E * 2 * F * D * 4);
        for (uint32_t e = 0; e < E; e++)
            for (int half = 0; half < 2; half++) {
                char src[128];
                snprintf(src, sizeof src, "model.layers.%u.mlp.experts.%u.%s_proj.weight", il, e, half ? "up" : "gate");
                const em_st_tensor *t = em_safetensors_find(st, src);
                assert_non_null(t);
                memcpy(data + used, t->data, t->size);
                used += t->size;
            }
        snprintf(name, sizeof name, "model.layers.%u.mlp.experts.down_proj", il);
        PUT(name, json_pack("[i,i,i]", E, D, F), (size_t)E * D * F * 4);
        for (uint32_t e = 0; e < E; e++) {
            char src[128];
            snprintf(src, sizeof src, "model.layers.%u.mlp.experts.%u.down_proj.weight", il, e);
            const em_st_tensor *t = em_safetensors_find(st, src);
            assert_non_null(t);
            memcpy(data + used, t->data, t->size);
            used += t->size;
        }
    }
#undef PUT
    assert_true(used <= cap);
    write_safetensors(DIR "/fused/model.safetensors", header, data, used);
    free(data);
    em_safetensors_close(st);
    FILE *in = fopen(HF "/qwen3moe/config.json", "rb");
    char cfg[8192];
    size_t n = fread(cfg, 1, sizeof cfg, in);
    fclose(in);
    write_file(DIR "/fused/config.json", cfg, n);

    em_convert_options o = {.type = "f32", .no_tokenizer = true};
    assert_null(em_convert_hf(DIR "/fused", DIR "/fused.gguf", &o, NULL));
    assert_null(em_convert_hf(HF "/qwen3moe", DIR "/unfused.gguf", &o, NULL));
    em_gguf *a, *b;
    assert_null(em_gguf_open(DIR "/fused.gguf", &a));
    assert_null(em_gguf_open(DIR "/unfused.gguf", &b));
    assert_int_equal(em_gguf_tensor_count(a), em_gguf_tensor_count(b));
    for (uint64_t i = 0; i < em_gguf_tensor_count(b); i++) {
        const em_gguf_tensor *tb = em_gguf_tensor_at(b, i);
        char *tn = em_str_dup(tb->name);
        const em_gguf_tensor *ta = em_gguf_find_tensor(a, tn);
        assert_non_null(ta);
        assert_int_equal(ta->size, tb->size);
        if (memcmp(ta->data, tb->data, ta->size)) fail_msg("tensor %s differs", tn);
        free(tn);
    }
    em_gguf_close(a);
    em_gguf_close(b);
}

/* The same checkpoint described the 4.x way converts to the same bytes as the 5.x config.json that
 * transformers wrote for it. The weights are linked in from the fixture. */
static void same_as_fixture(const char *family, const char *config_4x) {
    char dir[256], path[512], target[512];
    snprintf(dir, sizeof dir, DIR "/%s-4x", family);
    mkdir(DIR, 0755);
    mkdir(dir, 0755);
    static const char *const files[] = {"model.safetensors", "model.safetensors.index.json",
                                        "model-00001-of-00006.safetensors", "model-00002-of-00006.safetensors",
                                        "model-00003-of-00006.safetensors", "model-00004-of-00006.safetensors",
                                        "model-00005-of-00006.safetensors", "model-00006-of-00006.safetensors",
                                        "tokenizer.json", "tokenizer_config.json"};
    struct stat sb;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(target, sizeof target, HF "/%s/%s", family, files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
        if (stat(target, &sb) == 0) assert_int_equal(symlink(target, path), 0);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, config_4x, strlen(config_4x));
    char a[512], b[512], src[256];
    snprintf(a, sizeof a, DIR "/%s-4x.gguf", family);
    snprintf(b, sizeof b, DIR "/%s-5x.gguf", family);
    snprintf(src, sizeof src, HF "/%s", family);
    em_convert_options o = {.type = "q8_0", .name = "same"};
    em_err err = em_convert_hf(dir, a, &o, NULL);
    if (err) fail_msg("%s", em_err_message(err));
    assert_null(em_convert_hf(src, b, &o, NULL));
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    assert_non_null(fa);
    assert_non_null(fb);
    int ca, cb;
    long at = 0;
    do {
        ca = fgetc(fa);
        cb = fgetc(fb);
        if (ca != cb) fail_msg("%s: 4.x and 5.x conversions differ at byte %ld", family, at);
        at++;
    } while (ca != EOF);
    fclose(fa);
    fclose(fb);
}

static void test_config_layouts_convert_alike(void **state) {
    (void)state;
    same_as_fixture("llama",
                    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":64,"
                    "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                    "\"num_key_value_heads\":2,\"head_dim\":16,\"vocab_size\":384,\"max_position_embeddings\":256,"
                    "\"rms_norm_eps\":1e-05,\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,"
                    "\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,\"high_freq_factor\":4.0,"
                    "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":32,\"rope_type\":\"llama3\"},"
                    "\"bos_token_id\":0,\"eos_token_id\":1,\"pad_token_id\":2}");
    same_as_fixture("gemma3",
                    "{\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\",\"hidden_size\":64,"
                    "\"intermediate_size\":128,\"num_hidden_layers\":6,\"num_attention_heads\":4,"
                    "\"num_key_value_heads\":2,\"head_dim\":16,\"vocab_size\":384,\"max_position_embeddings\":256,"
                    "\"rms_norm_eps\":1e-06,\"hidden_activation\":\"gelu_pytorch_tanh\",\"query_pre_attn_scalar\":16,"
                    "\"rope_theta\":1000000.0,\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4.0},"
                    "\"rope_local_base_freq\":10000.0,\"sliding_window\":8,\"sliding_window_pattern\":6,"
                    "\"final_logit_softcapping\":null,\"attn_logit_softcapping\":null,"
                    "\"bos_token_id\":0,\"eos_token_id\":1,\"pad_token_id\":2}");
    same_as_fixture("qwen3moe",
                    "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\",\"hidden_size\":64,"
                    "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                    "\"num_key_value_heads\":2,\"head_dim\":16,\"vocab_size\":384,\"max_position_embeddings\":256,"
                    "\"rms_norm_eps\":1e-05,\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,"
                    "\"rope_theta\":1000000.0,\"rope_scaling\":null,\"num_experts\":4,\"num_experts_per_tok\":2,"
                    "\"moe_intermediate_size\":64,\"norm_topk_prob\":true,\"decoder_sparse_step\":1,"
                    "\"mlp_only_layers\":[],\"use_sliding_window\":false,\"sliding_window\":null,"
                    "\"bos_token_id\":0,\"eos_token_id\":1,\"pad_token_id\":2}");
}

/* YaRN: the keys llama.cpp's loader reads for it, read back by Ember's loader. */
static void test_yarn_metadata(void **state) {
    (void)state;
    same_as_fixture("qwen3", "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                             "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                             "\"head_dim\":32,\"vocab_size\":384,\"max_position_embeddings\":256,"
                             "\"rms_norm_eps\":1e-05,\"rope_theta\":1000000.0,\"tie_word_embeddings\":false,"
                             "\"bos_token_id\":0,\"eos_token_id\":1,\"pad_token_id\":2}");
    em_convert_options o = {.type = "f32", .no_tokenizer = true};
    const char *cfg = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                      "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,"
                      "\"vocab_size\":384,\"rms_norm_eps\":1e-05,\"max_position_embeddings\":1024,"
                      "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":1e6,\"factor\":4.0,"
                      "\"original_max_position_embeddings\":256,\"beta_fast\":32.0,\"beta_slow\":1.0}}";
    write_file(DIR "/qwen3-4x/config.json", cfg, strlen(cfg));
    assert_null(em_convert_hf(DIR "/qwen3-4x", DIR "/yarn.gguf", &o, NULL));
    em_model *m;
    assert_null(em_model_load(DIR "/yarn.gguf", &m));
    em_str s;
    assert_null(em_gguf_get_str(m->gguf, "qwen3.rope.scaling.type", &s));
    assert_true(em_str_eq(s, "yarn"));
    const em_rope *r = &m->desc.layers[1].rope;
    assert_int_equal(r->scaling, EM_ROPE_SCALING_YARN);
    assert_float_equal(r->factor, 4.0f, 0);
    assert_int_equal(r->orig_ctx, 256);
    assert_float_equal(r->yarn_beta_fast, 32.0f, 0);
    assert_float_equal(r->yarn_beta_slow, 1.0f, 0);
    em_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_valid), cmocka_unit_test(test_safetensors_malformed),
        cmocka_unit_test(test_safetensors_file),  cmocka_unit_test(test_config_4x),
        cmocka_unit_test(test_config_5x), cmocka_unit_test(test_config_class_defaults),         cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_convert_errors),    cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_output_types),      cmocka_unit_test(test_fused_experts),
        cmocka_unit_test(test_config_layouts_convert_alike), cmocka_unit_test(test_yarn_metadata),
        cmocka_unit_test(test_llama),             cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_mixtral),           cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen3),             cmocka_unit_test(test_qwen3moe),
        cmocka_unit_test(test_gemma2),            cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_gemma3mm),          cmocka_unit_test(test_gemma3pattern),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
