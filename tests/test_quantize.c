/*
 * `ember quantize` tests, run through the command itself:
 *  - the per-tensor types of every recipe on synthesized models, against tables written here by
 *    hand from llama.cpp's rules (src/llama-quant.cpp, llama_tensor_get_type): not computed by the
 *    code under test;
 *  - `mix` gives the types `ember synth --type mix` writes, tensor for tensor;
 *  - the bytes of the deterministic formats equal those of llama.cpp's reference quantizer in
 *    tests/fixtures/reference/quant-reference.gguf;
 *  - the metadata: general.file_type is llama.cpp's LLAMA_FTYPE number, the rest is unchanged;
 *  - importance matrices in both of llama-imatrix's formats read as llama.cpp reads them, checked
 *    against the model, and reported as not applied.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "model/quantize/quantize.h"
#include "quant/quant.h"

#define DIR EM_BINARY_DIR "/test_quantize_files"
#define FIXTURE EM_FIXTURES_DIR "/quant-reference.gguf"
#define VOCAB EM_FIXTURES_DIR "/vocab/ggml-vocab-llama-spm.gguf"

static void assert_ok(em_err err) {
    if (err) fail_msg("unexpected error: %s", em_err_message(err));
}

static void synth(const char *preset, const char *type, const char *path) {
    em_synth_options o = {.preset = preset, .type = type, .seed = 7, .vocab_path = VOCAB};
    assert_ok(em_synth_write(&o, path));
}

/* Runs `ember quantize IN OUT TYPE` and fails the test on a nonzero status. */
static void quantize(const char *in, const char *out, const char *type) {
    char command[4096];
    snprintf(command, sizeof command, "'%s' quantize '%s' '%s' %s --threads 2 >'%s.log' 2>&1", EM_EMBER_EXE, in,
             out, type, out);
    if (system(command) != 0) fail_msg("ember quantize %s %s failed (see %s.log)", in, type, out);
}

static uint32_t tensor_type(const em_gguf *g, const char *name) {
    const em_gguf_tensor *t = em_gguf_find_tensor(g, name);
    if (!t) fail_msg("%s: no tensor %s", em_gguf_path(g), name);
    return t->type;
}

/* Checks one tensor's type against a lower-case type name. */
static void expect_type(const em_gguf *g, const char *recipe, const char *name, const char *want) {
    em_type type;
    assert_ok(em_type_from_name(want, &type));
    uint32_t got = tensor_type(g, name);
    if (got != (uint32_t)type)
        fail_msg("%s: %s is %s, llama.cpp's rule gives %s", recipe, name, em_type_name(got), want);
}

/* The i-th word of a space-separated list. */
static void word(const char *list, int i, char *out, size_t size) {
    while (i-- > 0) list = strchr(list, ' ') + 1;
    size_t n = strcspn(list, " ");
    snprintf(out, size, "%.*s", (int)(n < size ? n : size - 1), list);
}

/* ---- small-llama: 8 layers, d 256, 4 query heads on 1 KV head (GQA 4), FF 512, untied ----
 *
 * llama.cpp's "use more bits" layers of 8 are the first and last eighth and every third between:
 * i < 1, i >= 7, (i - 1) % 3 == 2, that is 0, 3, 6 and 7. Per-layer columns list layers 0..7. */
typedef struct dense_expect {
    const char *recipe;
    int32_t file_type; /* LLAMA_FTYPE_* of llama.cpp's include/llama.h */
    const char *token_embd, *output, *attn_q, *attn_k, *attn_output, *ffn_gate_up;
    const char *attn_v, *ffn_down; /* one type per layer */
} dense_expect;

#define ALL8(t) t " " t " " t " " t " " t " " t " " t " " t
static const dense_expect dense[] = {
    {"F32", 0, "f32", "f32", "f32", "f32", "f32", "f32", ALL8("f32"), ALL8("f32")},
    {"F16", 1, "f16", "f16", "f16", "f16", "f16", "f16", ALL8("f16"), ALL8("f16")},
    {"BF16", 32, "bf16", "bf16", "bf16", "bf16", "bf16", "bf16", ALL8("bf16"), ALL8("bf16")},
    /* output.weight: Q8_0 stays Q8_0, every other block recipe gives Q6_K */
    {"Q8_0", 7, "q8_0", "q8_0", "q8_0", "q8_0", "q8_0", "q8_0", ALL8("q8_0"), ALL8("q8_0")},
    {"Q6_K", 18, "q6_k", "q6_k", "q6_k", "q6_k", "q6_k", "q6_k", ALL8("q6_k"), ALL8("q6_k")},
    /* _M: attn_v and ffn_down Q6_K in the use-more-bits layers */
    {"Q5_K_M", 17, "q5_k", "q6_k", "q5_k", "q5_k", "q5_k", "q5_k", "q6_k q5_k q5_k q6_k q5_k q5_k q6_k q6_k",
     "q6_k q5_k q5_k q6_k q5_k q5_k q6_k q6_k"},
    {"Q5_K_S", 16, "q5_k", "q6_k", "q5_k", "q5_k", "q5_k", "q5_k", ALL8("q5_k"), ALL8("q5_k")},
    {"Q5_1", 9, "q5_1", "q6_k", "q5_1", "q5_1", "q5_1", "q5_1", ALL8("q5_1"), ALL8("q5_1")},
    {"Q5_0", 8, "q5_0", "q6_k", "q5_0", "q5_0", "q5_0", "q5_0", ALL8("q5_0"), ALL8("q5_0")},
    {"Q4_K_M", 15, "q4_k", "q6_k", "q4_k", "q4_k", "q4_k", "q4_k", "q6_k q4_k q4_k q6_k q4_k q4_k q6_k q6_k",
     "q6_k q4_k q4_k q6_k q4_k q4_k q6_k q6_k"},
    /* _S: attn_v Q5_K in the first 4 layers, ffn_down Q5_K in the first eighth */
    {"Q4_K_S", 14, "q4_k", "q6_k", "q4_k", "q4_k", "q4_k", "q4_k", "q5_k q5_k q5_k q5_k q4_k q4_k q4_k q4_k",
     "q5_k q4_k q4_k q4_k q4_k q4_k q4_k q4_k"},
    {"Q4_1", 3, "q4_1", "q6_k", "q4_1", "q4_1", "q4_1", "q4_1", ALL8("q4_1"), ALL8("q4_1")},
    {"Q4_0", 2, "q4_0", "q6_k", "q4_0", "q4_0", "q4_0", "q4_0", ALL8("q4_0"), ALL8("q4_0")},
    /* IQ4: attn_v Q5_K when GQA >= 4; ffn_down Q5_K in the first eighth without an imatrix */
    {"IQ4_NL", 25, "iq4_nl", "q6_k", "iq4_nl", "iq4_nl", "iq4_nl", "iq4_nl", ALL8("q5_k"),
     "q5_k iq4_nl iq4_nl iq4_nl iq4_nl iq4_nl iq4_nl iq4_nl"},
    {"IQ4_XS", 30, "iq4_xs", "q6_k", "iq4_xs", "iq4_xs", "iq4_xs", "iq4_xs", ALL8("q5_k"),
     "q5_k iq4_xs iq4_xs iq4_xs iq4_xs iq4_xs iq4_xs iq4_xs"},
    {"Q3_K_L", 13, "q3_k", "q6_k", "q3_k", "q3_k", "q5_k", "q3_k", ALL8("q5_k"), ALL8("q5_k")},
    /* Q3_K_M: attn_v Q5_K for the first two, ffn_down Q4_K (not Falcon), attn_output Q4_K */
    {"Q3_K_M", 12, "q3_k", "q6_k", "q3_k", "q3_k", "q4_k", "q3_k", "q5_k q5_k q4_k q4_k q4_k q4_k q4_k q4_k",
     ALL8("q4_k")},
    {"Q3_K_S", 11, "q3_k", "q6_k", "q3_k", "q3_k", "q3_k", "q3_k", ALL8("q3_k"), ALL8("q3_k")},
    /* IQ3_XXS: output Q5_K; token_embd and attn_output IQ3_S, attn_q and attn_k IQ2_S, which Ember
     * writes as Q3_K and Q2_K (no quantizer for those two); attn_v Q4_K (GQA >= 4); ffn_down Q4_K in
     * the first eighth, Q3_K after, without an imatrix */
    {"IQ3_XXS", 23, "q3_k", "q5_k", "q2_k", "q2_k", "q3_k", "iq3_xxs", ALL8("q4_k"),
     "q4_k q3_k q3_k q3_k q3_k q3_k q3_k q3_k"},
    /* Q2_K: attn_v Q4_K (GQA >= 4), ffn_down and attn_output Q3_K */
    {"Q2_K", 10, "q2_k", "q6_k", "q2_k", "q2_k", "q3_k", "q2_k", ALL8("q4_k"), ALL8("q3_k")},
    {"TQ2_0", 37, "q4_k", "q6_k", "tq2_0", "tq2_0", "tq2_0", "tq2_0", ALL8("tq2_0"), ALL8("tq2_0")},
    {"TQ1_0", 36, "q4_k", "q6_k", "tq1_0", "tq1_0", "tq1_0", "tq1_0", ALL8("tq1_0"), ALL8("tq1_0")},
    /* MXFP4_MOE: expert stacks MXFP4, every other matrix Q8_0 */
    {"MXFP4_MOE", 38, "q8_0", "q8_0", "q8_0", "q8_0", "q8_0", "q8_0", ALL8("q8_0"), ALL8("q8_0")},
    {"mix", -1, "q6_k", "q6_k", "q6_k", "q6_k", "q6_k", "q6_k", ALL8("q6_k"), ALL8("q6_k")},
};

static void check_metadata(const em_gguf *in, const em_gguf *out, const char *recipe, int32_t file_type) {
    uint32_t value = 0;
    em_err err = em_gguf_get_u32(out, "general.file_type", &value);
    if (file_type < 0) {
        assert_non_null(err); /* mix: no llama_ftype */
        em_err_free(err);
    } else {
        assert_ok(err);
        if (value != (uint32_t)file_type)
            fail_msg("%s: general.file_type %u, llama.cpp's is %d", recipe, value, file_type);
    }
    assert_ok(em_gguf_get_u32(out, "general.quantization_version", &value));
    assert_int_equal(value, 2);
    for (uint64_t i = 0; i < em_gguf_kv_count(in); i++) { /* every input key, unchanged */
        const em_gguf_kv *a = em_gguf_kv_at(in, i);
        char *key = em_str_dup(a->key);
        const em_gguf_kv *b = em_gguf_find(out, key);
        if (!b) fail_msg("%s: key %s is gone", recipe, key);
        assert_int_equal(a->type, b->type);
        if (a->type == EM_GGUF_STRING) assert_true(a->strings[0].len == b->strings[0].len &&
                                                   !memcmp(a->strings[0].ptr, b->strings[0].ptr, a->strings[0].len));
        else if (a->type == EM_GGUF_ARRAY) assert_int_equal(a->array_len, b->array_len);
        else assert_memory_equal(a->data, b->data, em_gguf_type_size(a->type));
        free(key);
    }
}

static void test_dense_recipes(void **state) {
    (void)state;
    mkdir(DIR, 0755);
    synth("small-llama", "f32", DIR "/small-llama.gguf");
    em_gguf *in;
    assert_ok(em_gguf_open(DIR "/small-llama.gguf", &in));
    for (size_t r = 0; r < sizeof dense / sizeof dense[0]; r++) {
        const dense_expect *e = &dense[r];
        char out[512], name[64], want[16];
        snprintf(out, sizeof out, DIR "/small-llama-%s.gguf", e->recipe);
        quantize(DIR "/small-llama.gguf", out, e->recipe);
        em_gguf *g;
        assert_ok(em_gguf_open(out, &g));
        check_metadata(in, g, e->recipe, e->file_type);
        expect_type(g, e->recipe, "token_embd.weight", e->token_embd);
        expect_type(g, e->recipe, "output.weight", e->output);
        expect_type(g, e->recipe, "output_norm.weight", "f32");
        for (int il = 0; il < 8; il++) {
#define CHECK(suffix, value)                                   \
    snprintf(name, sizeof name, "blk.%d." suffix, il);          \
    expect_type(g, e->recipe, name, value)
            CHECK("attn_norm.weight", "f32");
            CHECK("ffn_norm.weight", "f32");
            CHECK("attn_q.weight", e->attn_q);
            CHECK("attn_k.weight", e->attn_k);
            CHECK("attn_output.weight", e->attn_output);
            CHECK("ffn_gate.weight", e->ffn_gate_up);
            CHECK("ffn_up.weight", e->ffn_gate_up);
            word(e->attn_v, il, want, sizeof want);
            CHECK("attn_v.weight", want);
            word(e->ffn_down, il, want, sizeof want);
            CHECK("ffn_down.weight", want);
#undef CHECK
        }
        em_gguf_close(g);
        remove(out);
    }
    em_gguf_close(in);
}

/* ---- small-qwen3moe: 4 layers, d 256, GQA 2, 8 experts (expert FF 256), tied embeddings ----
 *
 * Rules of 8-expert models: attn_v and attn_k Q8_0, attn_output Q5_K in the low-bit recipes. Use-
 * more-bits layers of 4: i >= 3 or i % 3 == 2, that is 2 and 3 (ffn_down_exps takes the layer from
 * its name). The tied token_embd is quantized as the output matrix. */
typedef struct moe_expect {
    const char *recipe;
    const char *token_embd, *attn_q, *attn_k, *attn_v, *attn_output, *gate_up_exps;
    const char *down_exps; /* per layer */
} moe_expect;

static const moe_expect moe[] = {
    {"Q4_K_M", "q6_k", "q4_k", "q8_0", "q8_0", "q5_k", "q4_k", "q4_k q4_k q6_k q6_k"},
    {"Q3_K_M", "q6_k", "q3_k", "q8_0", "q8_0", "q5_k", "q3_k", "q4_k q4_k q4_k q4_k"},
    {"Q6_K", "q6_k", "q6_k", "q8_0", "q8_0", "q6_k", "q6_k", "q6_k q6_k q6_k q6_k"},
    {"IQ4_XS", "q6_k", "iq4_xs", "q8_0", "q8_0", "q5_k", "iq4_xs", "iq4_xs iq4_xs iq4_xs iq4_xs"},
    {"MXFP4_MOE", "q8_0", "q8_0", "q8_0", "q8_0", "q8_0", "mxfp4", "mxfp4 mxfp4 mxfp4 mxfp4"},
    {"mix", "q6_k", "q6_k", "q6_k", "q6_k", "q6_k", "iq3_xxs", "iq3_xxs iq3_xxs iq3_xxs iq3_xxs"},
};

static void test_moe_recipes(void **state) {
    (void)state;
    mkdir(DIR, 0755);
    synth("small-qwen3moe", "f32", DIR "/small-moe.gguf");
    for (size_t r = 0; r < sizeof moe / sizeof moe[0]; r++) {
        const moe_expect *e = &moe[r];
        char out[512], name[64], want[16];
        snprintf(out, sizeof out, DIR "/small-moe-%s.gguf", e->recipe);
        quantize(DIR "/small-moe.gguf", out, e->recipe);
        em_gguf *g;
        assert_ok(em_gguf_open(out, &g));
        assert_null(em_gguf_find_tensor(g, "output.weight"));
        expect_type(g, e->recipe, "token_embd.weight", e->token_embd);
        for (int il = 0; il < 4; il++) {
#define CHECK(suffix, value)                                   \
    snprintf(name, sizeof name, "blk.%d." suffix, il);          \
    expect_type(g, e->recipe, name, value)
            CHECK("attn_q.weight", e->attn_q);
            CHECK("attn_k.weight", e->attn_k);
            CHECK("attn_v.weight", e->attn_v);
            CHECK("attn_output.weight", e->attn_output);
            CHECK("attn_q_norm.weight", "f32");
            CHECK("ffn_gate_inp.weight", "f32");
            CHECK("ffn_gate_exps.weight", e->gate_up_exps);
            CHECK("ffn_up_exps.weight", e->gate_up_exps);
            word(e->down_exps, il, want, sizeof want);
            CHECK("ffn_down_exps.weight", want);
#undef CHECK
        }
        em_gguf_close(g);
        remove(out);
    }
}

/* ---- rows the block does not divide (d 128): llama.cpp's fallback chain ----
 * tiny-llama: 2 layers, d 128, FF 256, untied. Use-more-bits layers of 2: layer 1. */
static void test_fallbacks(void **state) {
    (void)state;
    static const struct {
        const char *recipe, *token_embd, *output, *attn_q, *ffn_down0, *ffn_down1;
    } cases[] = {
        /* Q4_K -> Q5_0 on 128-wide rows; output: the recipe's block does not divide the row -> Q8_0;
         * ffn_down rows are 256 wide and keep the K-formats */
        {"Q4_K_M", "q5_0", "q8_0", "q5_0", "q4_k", "q6_k"},
        {"Q5_K_S", "q5_1", "q8_0", "q5_1", "q5_k", "q5_k"},
        {"Q6_K", "q8_0", "q8_0", "q8_0", "q6_k", "q6_k"},
        {"IQ4_XS", "iq4_nl", "q8_0", "iq4_nl", "iq4_xs", "iq4_xs"}, /* first eighth of 2 layers: none */
        {"Q2_K", "q4_0", "q8_0", "q4_0", "q3_k", "q3_k"},
        /* 32-element blocks divide 128; the output's Q6_K does not, and falls back to Q8_0 */
        {"Q4_0", "q4_0", "q8_0", "q4_0", "q4_0", "q4_0"},
    };
    mkdir(DIR, 0755);
    synth("tiny-llama", "f32", DIR "/tiny-llama.gguf");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[512];
        snprintf(out, sizeof out, DIR "/tiny-llama-%s.gguf", cases[i].recipe);
        quantize(DIR "/tiny-llama.gguf", out, cases[i].recipe);
        em_gguf *g;
        assert_ok(em_gguf_open(out, &g));
        expect_type(g, cases[i].recipe, "token_embd.weight", cases[i].token_embd);
        expect_type(g, cases[i].recipe, "output.weight", cases[i].output);
        expect_type(g, cases[i].recipe, "blk.0.attn_q.weight", cases[i].attn_q);
        expect_type(g, cases[i].recipe, "blk.0.ffn_down.weight", cases[i].ffn_down0);
        expect_type(g, cases[i].recipe, "blk.1.ffn_down.weight", cases[i].ffn_down1);
        em_gguf_close(g);
        remove(out);
    }
}

/* `mix` is the recipe of `ember synth --type mix` (the MoE benchmarks' files): the same type for
 * every tensor, fallbacks included, on presets with dense and expert layers. */
static void test_mix_matches_synth(void **state) {
    (void)state;
    static const char *const presets[] = {"tiny-qwen3moe", "tiny-flint", "tiny-mixtral"};
    mkdir(DIR, 0755);
    for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++) {
        char f32[512], mixed[512], quantized[512];
        snprintf(f32, sizeof f32, DIR "/%s-f32.gguf", presets[p]);
        snprintf(mixed, sizeof mixed, DIR "/%s-synth-mix.gguf", presets[p]);
        snprintf(quantized, sizeof quantized, DIR "/%s-mix.gguf", presets[p]);
        synth(presets[p], "f32", f32);
        synth(presets[p], "mix", mixed);
        quantize(f32, quantized, "mix");
        em_gguf *a, *b;
        assert_ok(em_gguf_open(mixed, &a));
        assert_ok(em_gguf_open(quantized, &b));
        assert_int_equal(em_gguf_tensor_count(a), em_gguf_tensor_count(b));
        for (uint64_t i = 0; i < em_gguf_tensor_count(a); i++) {
            const em_gguf_tensor *t = em_gguf_tensor_at(a, i);
            char *name = em_str_dup(t->name);
            uint32_t got = tensor_type(b, name);
            if (got != t->type)
                fail_msg("%s: %s is %s after quantize mix, %s in synth --type mix", presets[p], name, em_type_name(got),
                         em_type_name(t->type));
            free(name);
        }
        em_gguf_close(a);
        em_gguf_close(b);
    }
}

/* ---- bytes: the deterministic formats equal llama.cpp's reference quantizer ----
 * Each fixture input T.src (512 x 8 f32) is written as a model's only matrix, quantized with the
 * command, and compared with T.quant. */
static void test_reference_bytes(void **state) {
    (void)state;
    static const struct { const char *format, *recipe, *tensor; } cases[] = {
        {"F16", "F16", "blk.0.attn_q.weight"},     {"BF16", "BF16", "blk.0.attn_q.weight"},
        {"Q8_0", "Q8_0", "blk.0.attn_q.weight"},   {"Q4_0", "Q4_0", "blk.0.attn_q.weight"},
        {"Q4_1", "Q4_1", "blk.0.attn_q.weight"},   {"Q5_0", "Q5_0", "blk.0.attn_q.weight"},
        {"Q5_1", "Q5_1", "blk.0.attn_q.weight"},   {"TQ1_0", "TQ1_0", "blk.0.attn_q.weight"},
        {"TQ2_0", "TQ2_0", "blk.0.attn_q.weight"}, {"MXFP4", "MXFP4_MOE", "blk.0.ffn_up_exps.weight"},
    };
    mkdir(DIR, 0755);
    em_gguf *fixture;
    assert_ok(em_gguf_open(FIXTURE, &fixture));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64], in[512], out[512];
        snprintf(name, sizeof name, "%s.src", cases[i].format);
        const em_gguf_tensor *src = em_gguf_find_tensor(fixture, name);
        snprintf(name, sizeof name, "%s.quant", cases[i].format);
        const em_gguf_tensor *ref = em_gguf_find_tensor(fixture, name);
        assert_non_null(src);
        assert_non_null(ref);
        assert_int_equal(src->type, EM_TYPE_F32);
        const uint64_t elems = em_gguf_tensor_elems(src);
        /* an expert stack for MXFP4_MOE (it quantizes only those): 512 columns, 4 rows, 2 experts */
        const bool experts = strstr(cases[i].tensor, "_exps") != NULL;
        const uint64_t ne[3] = {512, experts ? elems / 1024 : elems / 512, experts ? 2 : 1};
        em_gguf_writer *w;
        assert_ok(em_gguf_writer_new(3, &w));
        assert_ok(em_gguf_writer_add_str(w, "general.architecture", "llama"));
        assert_ok(em_gguf_writer_add_u32(w, "llama.block_count", 1));
        assert_ok(em_gguf_writer_add_u32(w, "llama.attention.head_count", 8));
        assert_ok(em_gguf_writer_add_u32(w, "llama.attention.head_count_kv", 8));
        assert_ok(em_gguf_writer_add_tensor(w, cases[i].tensor, experts ? 3 : 2, ne, EM_TYPE_F32, src->data, false));
        snprintf(in, sizeof in, DIR "/reference-%s.gguf", cases[i].format);
        snprintf(out, sizeof out, DIR "/reference-%s-out.gguf", cases[i].format);
        assert_ok(em_gguf_writer_write(w, in));
        em_gguf_writer_free(w);
        quantize(in, out, cases[i].recipe);
        em_gguf *g;
        assert_ok(em_gguf_open(out, &g));
        const em_gguf_tensor *t = em_gguf_find_tensor(g, cases[i].tensor);
        assert_non_null(t);
        assert_int_equal(t->type, ref->type);
        assert_int_equal(t->size, ref->size);
        if (memcmp(t->data, ref->data, ref->size)) {
            uint64_t at = 0;
            while (((const uint8_t *)t->data)[at] == ((const uint8_t *)ref->data)[at]) at++;
            fail_msg("%s: byte %llu differs from llama.cpp's reference", cases[i].format, (unsigned long long)at);
        }
        em_gguf_close(g);
    }
    em_gguf_close(fixture);
}

/* ---- importance matrices ---- */

/* A GGUF imatrix as llama-imatrix writes it: NAME.in_sum2 [columns x matrices], NAME.counts
 * [1 x matrices], imatrix.* keys. */
static void write_gguf_imatrix(const char *path, uint64_t attn_q_values) {
    em_gguf_writer *w;
    assert_ok(em_gguf_writer_new(3, &w));
    assert_ok(em_gguf_writer_add_str(w, "general.type", "imatrix"));
    const char *datasets[] = {"calibration.txt"};
    assert_ok(em_gguf_writer_add_str_array(w, "imatrix.datasets", datasets, NULL, 1));
    assert_ok(em_gguf_writer_add_u32(w, "imatrix.chunk_count", 10));
    assert_ok(em_gguf_writer_add_u32(w, "imatrix.chunk_size", 512));
    static float q_sums[256], q_count[1] = {4.0f}, exp_sums[128 * 8], exp_counts[8];
    for (uint64_t j = 0; j < 256; j++) q_sums[j] = (float)(j + 1);
    for (int m = 0; m < 8; m++) {
        exp_counts[m] = m == 5 ? 0.0f : (float)(m + 1); /* expert 5 never chosen */
        for (int j = 0; j < 128; j++) exp_sums[m * 128 + j] = (float)(m * 1000 + j);
    }
    const uint64_t q_ne[2] = {attn_q_values, 1}, one[2] = {1, 1}, exp_ne[2] = {128, 8}, exp_count_ne[2] = {1, 8};
    assert_ok(em_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.in_sum2", 2, q_ne, EM_TYPE_F32, q_sums, true));
    assert_ok(em_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.counts", 2, one, EM_TYPE_F32, q_count, true));
    assert_ok(em_gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight.in_sum2", 2, exp_ne, EM_TYPE_F32, exp_sums, true));
    assert_ok(em_gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight.counts", 2, exp_count_ne, EM_TYPE_F32, exp_counts,
                                        true));
    assert_ok(em_gguf_writer_write(w, path));
    em_gguf_writer_free(w);
}

/* The legacy .dat: int32 entries; per entry int32 name length, name, int32 calls, int32 values,
 * float sums; then int32 chunks and the dataset's name. */
static void write_legacy_imatrix(const char *path) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    const char *name = "blk.1.attn_k.weight";
    int32_t n = 1, len = (int32_t)strlen(name), calls = 8, count = 128, chunks = 3, dataset_len = 4;
    float sums[128];
    for (int j = 0; j < 128; j++) sums[j] = (float)(2 * j);
    assert_true(fwrite(&n, 4, 1, f) == 1 && fwrite(&len, 4, 1, f) == 1 &&
                fwrite(name, 1, (size_t)len, f) == (size_t)len &&
                fwrite(&calls, 4, 1, f) == 1 && fwrite(&count, 4, 1, f) == 1 && fwrite(sums, 4, 128, f) == 128 &&
                fwrite(&chunks, 4, 1, f) == 1 && fwrite(&dataset_len, 4, 1, f) == 1 && fwrite("wiki", 1, 4, f) == 4);
    fclose(f);
}

/* llama.cpp's reading: importance = in_sum2 / count per matrix, 1 for a matrix never counted;
 * legacy: sum / calls. */
static void test_imatrix_values(void **state) {
    (void)state;
    mkdir(DIR, 0755);
    write_gguf_imatrix(DIR "/imatrix.gguf", 256);
    em_imatrix *im;
    assert_ok(em_imatrix_load(DIR "/imatrix.gguf", &im));
    assert_int_equal(em_imatrix_count(im), 2);
    assert_int_equal(em_imatrix_chunks(im), 10);
    uint64_t n = 0;
    const float *v = em_imatrix_find(im, "blk.0.attn_q.weight", &n);
    assert_non_null(v);
    assert_int_equal(n, 256);
    assert_true(v[0] == 0.25f && v[255] == 64.0f);
    v = em_imatrix_find(im, "blk.0.ffn_up_exps.weight", &n);
    assert_int_equal(n, 1024);
    assert_true(v[128 * 2 + 3] == 2003.0f / 3.0f && v[128 * 5 + 7] == 1.0f);
    assert_null(em_imatrix_find(im, "blk.0.attn_k.weight", &n));
    em_imatrix_free(im);

    write_legacy_imatrix(DIR "/imatrix.dat");
    assert_ok(em_imatrix_load(DIR "/imatrix.dat", &im));
    assert_int_equal(em_imatrix_chunks(im), 3);
    v = em_imatrix_find(im, "blk.1.attn_k.weight", &n);
    assert_int_equal(n, 128);
    assert_true(v[0] == 0.0f && v[127] == 254.0f / 8.0f);
    em_imatrix_free(im);

    FILE *f = fopen(DIR "/not-imatrix.dat", "wb");
    assert_non_null(f);
    fputs("hello", f);
    fclose(f);
    em_err err = em_imatrix_load(DIR "/not-imatrix.dat", &im);
    assert_non_null(err);
    em_err_free(err);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    return text;
}

/* `t` of `model` (F32) quantized by em_quantize_rows to `type`, matrix by matrix, with importance
 * slice m (NULL: unweighted) for matrix m, compared with the bytes the command wrote. */
static void expect_weighted(const em_gguf *model, const em_gguf *out, const char *name, const float *importance) {
    const em_gguf_tensor *src = em_gguf_find_tensor(model, name), *dst = em_gguf_find_tensor(out, name);
    assert_non_null(src);
    assert_non_null(dst);
    assert_int_equal(src->type, EM_TYPE_F32);
    const uint64_t cols = src->ne[0], rows = src->ne[1], matrices = src->n_dims > 2 ? src->ne[2] : 1;
    uint8_t *want = malloc(dst->size);
    assert_non_null(want);
    const uint64_t matrix_bytes = dst->size / matrices;
    for (uint64_t m = 0; m < matrices; m++)
        assert_ok(em_quantize_rows(dst->type, (const float *)src->data + m * rows * cols, want + m * matrix_bytes, rows,
                                   cols, importance ? importance + m * cols : NULL));
    if (memcmp(want, dst->data, dst->size)) fail_msg("%s: not the bytes of em_quantize_rows", name);
    free(want);
}

/* With --imatrix the tensors the file has values for are quantized with them: blk.0.attn_q with
 * in_sum2 / count, each expert of blk.0.ffn_up_exps with its own slice (1 for the expert never
 * counted); the others unweighted, with a note on each. The summary counts the weighted tensors,
 * not those whose type ignores the values (Q8_0). A size that does not fit a tensor is an error, as
 * in llama.cpp. */
static void test_imatrix_command(void **state) {
    (void)state;
    mkdir(DIR, 0755);
    synth("tiny-qwen3moe", "f32", DIR "/im-model.gguf");
    write_gguf_imatrix(DIR "/im.gguf", 128);
    write_legacy_imatrix(DIR "/im.dat");
    quantize(DIR "/im-model.gguf", DIR "/im-plain.gguf", "Q4_0");
    quantize(DIR "/im-model.gguf", DIR "/im-gguf.gguf", "Q4_0 --imatrix " DIR "/im.gguf");
    const char *log = read_text(DIR "/im-gguf.gguf.log");
    if (!strstr(log, "16 quantized, 2 with importance weights (2 imatrix entries)")
        || !strstr(log, "has no values for 14 of the quantized tensors, quantized unweighted")
        || !strstr(log, "blk.0.attn_output.weight             f32    → q4_0        0.06 →      0.01 MiB (no importance"))
        fail_msg("importance use not reported: %s", log);
    quantize(DIR "/im-model.gguf", DIR "/im-dat.gguf", "Q4_0 --imatrix " DIR "/im.dat");
    log = read_text(DIR "/im-dat.gguf.log");
    /* its one entry is blk.1.attn_k, which this 8-expert model keeps in Q8_0: values that type ignores */
    if (!strstr(log, "0 with importance weights (1 imatrix entries)")
        || !strstr(log, "has no values for 15 of the quantized tensors"))
        fail_msg("legacy imatrix: %s", log);

    float q_importance[128], exp_importance[128 * 8]; /* as write_gguf_imatrix wrote them */
    for (int j = 0; j < 128; j++) q_importance[j] = (float)(j + 1) / 4.0f;
    for (int m = 0; m < 8; m++)
        for (int j = 0; j < 128; j++)
            exp_importance[m * 128 + j] = m == 5 ? 1.0f : (float)(m * 1000 + j) / (float)(m + 1);
    em_gguf *model, *plain, *weighted;
    assert_ok(em_gguf_open(DIR "/im-model.gguf", &model));
    assert_ok(em_gguf_open(DIR "/im-plain.gguf", &plain));
    assert_ok(em_gguf_open(DIR "/im-gguf.gguf", &weighted));
    expect_weighted(model, weighted, "blk.0.attn_q.weight", q_importance);
    expect_weighted(model, weighted, "blk.0.ffn_up_exps.weight", exp_importance);
    expect_weighted(model, weighted, "blk.0.attn_output.weight", NULL);
    expect_weighted(model, plain, "blk.0.attn_q.weight", NULL);
    const em_gguf_tensor *ta = em_gguf_find_tensor(plain, "blk.0.attn_q.weight");
    const em_gguf_tensor *tb = em_gguf_find_tensor(weighted, "blk.0.attn_q.weight");
    assert_int_equal(ta->size, tb->size);
    if (!memcmp(ta->data, tb->data, ta->size)) fail_msg("the importance values did not change blk.0.attn_q");
    em_gguf_close(model);
    em_gguf_close(plain);
    em_gguf_close(weighted);

    write_gguf_imatrix(DIR "/im-wrong.gguf", 256); /* attn_q rows are 128 wide */
    char command[4096];
    snprintf(command, sizeof command, "'%s' quantize " DIR "/im-model.gguf " DIR "/im-x.gguf q4_0 --imatrix " DIR
             "/im-wrong.gguf >/dev/null 2>" DIR "/im-x.log", EM_EMBER_EXE);
    assert_int_not_equal(system(command), 0);
    log = read_text(DIR "/im-x.log");
    if (!strstr(log, "256 importance values for blk.0.attn_q.weight, which needs 128")) fail_msg("mismatch: %s", log);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_bytes),
        cmocka_unit_test(test_imatrix_values),
        cmocka_unit_test(test_imatrix_command),
        cmocka_unit_test(test_fallbacks),
        cmocka_unit_test(test_mix_matches_synth),
        cmocka_unit_test(test_moe_recipes),
        cmocka_unit_test(test_dense_recipes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
