/* Family loaders: every tiny preset, written by the synthesizer with llama.cpp's key and tensor
 * names, loads into the description its family implies; broken files fail with errors that name
 * what is wrong. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <unistd.h>

#include "model/model.h"
#include "quant/quant.h"

#define VOCAB EM_FIXTURES_DIR "/vocab/ggml-vocab-llama-spm.gguf"
#define DIR EM_BINARY_DIR "/test_model_files"

static const char *model_path(const char *preset, const char *type) {
    static char path[512];
    mkdir(DIR, 0755);
    snprintf(path, sizeof path, DIR "/%s-%s.gguf", preset, type);
    em_synth_options o = {.preset = preset, .type = type, .seed = 7, .vocab_path = VOCAB};
    em_err err = em_synth_write(&o, path);
    if (err) fail_msg("synth %s: %s", preset, em_err_message(err));
    return path;
}

static em_model *load(const char *preset, const char *type) {
    em_model *m = NULL;
    em_err err = em_model_load(model_path(preset, type), &m);
    if (err) fail_msg("load %s: %s", preset, em_err_message(err));
    return m;
}

static void assert_attention(const em_layer_desc *l, uint32_t heads, uint32_t kv, uint32_t dim, em_rope_style style,
                             float theta, bool qk_norm) {
    assert_int_equal(l->n_head, heads);
    assert_int_equal(l->n_head_kv, kv);
    assert_int_equal(l->head_dim, dim);
    assert_int_equal(l->head_dim_v, dim);
    assert_int_equal(l->rope.style, style);
    assert_int_equal(l->rope.n_rot, dim);
    assert_float_equal(l->rope.theta, theta, theta * 1e-6);
    assert_int_equal(l->qk_norm, qk_norm);
    assert_float_equal(l->attn_scale, 1.0f / sqrtf((float)dim), 1e-7);
}

static void test_llama(void **state) {
    (void)state;
    em_model *m = load("tiny-llama", "f32");
    const em_model_desc *d = &m->desc;
    assert_string_equal(d->arch, "llama");
    assert_int_equal(d->n_layer, 2);
    assert_int_equal(d->n_embd, 128);
    assert_int_equal(d->n_vocab, 32000);
    assert_false(d->tied_output);
    assert_int_equal(d->act, EM_ACT_SWIGLU);
    assert_float_equal(d->embd_scale, 1.0f, 0);
    assert_float_equal(d->norm_eps, 1e-5f, 1e-10);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *l = &d->layers[il];
        /* the converter permutes Q/K for llama: adjacent-pair ("normal") RoPE */
        assert_attention(l, 4, 2, 32, EM_ROPE_NORMAL, 10000.0f, false);
        assert_false(l->qkv_bias);
        assert_false(l->moe);
        assert_int_equal(l->n_ff, 256);
        assert_int_equal(l->attn, EM_ATTN_FULL);
        assert_non_null(m->w.layers[il].ffn_gate.data);
    }
    assert_ptr_not_equal(m->w.output.data, m->w.token_embd.data);
    em_model_free(m);
}

static void test_qwen2(void **state) {
    (void)state;
    em_model *m = load("tiny-qwen2", "f32");
    const em_model_desc *d = &m->desc;
    assert_string_equal(d->arch, "qwen2");
    assert_true(d->tied_output);
    assert_ptr_equal(m->w.output.data, m->w.token_embd.data);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        assert_attention(&d->layers[il], 4, 2, 32, EM_ROPE_NEOX, 1e6f, false);
        assert_true(d->layers[il].qkv_bias);
        assert_non_null(m->w.layers[il].bq);
        assert_non_null(m->w.layers[il].bv);
    }
    em_model_free(m);
}

static void test_qwen3(void **state) {
    (void)state;
    em_model *m = load("tiny-qwen3", "f32");
    const em_model_desc *d = &m->desc;
    assert_string_equal(d->arch, "qwen3");
    /* head dim 64 with 4 heads: wider than n_embd / n_head, as in Qwen3 */
    for (uint32_t il = 0; il < d->n_layer; il++) {
        assert_attention(&d->layers[il], 4, 2, 64, EM_ROPE_NEOX, 1e6f, true);
        assert_int_equal(m->w.layers[il].wq.rows, 256);
        assert_non_null(m->w.layers[il].q_norm);
    }
    em_model_free(m);
}

static void assert_moe(const em_layer_desc *l, uint32_t experts, uint32_t used, uint32_t ff) {
    assert_true(l->moe);
    assert_int_equal(l->n_expert, experts);
    assert_int_equal(l->n_expert_used, used);
    assert_int_equal(l->n_ff, ff);
    assert_int_equal(l->gating, EM_GATING_SOFTMAX);
    assert_true(l->renormalize);
    assert_int_equal(l->n_ff_shared, 0);
}

static void test_qwen3moe(void **state) {
    (void)state;
    em_model *m = load("tiny-qwen3moe", "f32");
    const em_model_desc *d = &m->desc;
    assert_string_equal(d->arch, "qwen3moe");
    assert_false(d->tied_output);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        assert_attention(&d->layers[il], 4, 2, 32, EM_ROPE_NEOX, 1e6f, true);
        assert_moe(&d->layers[il], 8, 2, 64);
        assert_int_equal(m->w.layers[il].gate_exps.n_mat, 8);
        assert_int_equal(m->w.layers[il].down_exps.cols, 64);
        assert_null(m->w.layers[il].ffn_gate.data);
    }
    em_model_free(m);
}

static void test_mixtral(void **state) {
    (void)state;
    em_model *m = load("tiny-mixtral", "f32");
    const em_model_desc *d = &m->desc;
    assert_string_equal(d->arch, "llama");
    for (uint32_t il = 0; il < d->n_layer; il++) {
        assert_attention(&d->layers[il], 4, 2, 32, EM_ROPE_NORMAL, 1e6f, false);
        assert_moe(&d->layers[il], 4, 2, 128);
    }
    em_model_free(m);
}

static void test_gemma2(void **state) {
    (void)state;
    em_model *m = load("tiny-gemma2", "f32");
    const em_model_desc *d = &m->desc;
    assert_string_equal(d->arch, "gemma2");
    assert_int_equal(d->n_layer, 4);
    assert_int_equal(d->act, EM_ACT_GEGLU);
    assert_true(d->tied_output);
    assert_float_equal(d->embd_scale, sqrtf(128.0f), 1e-5);
    assert_float_equal(d->final_softcap, 30.0f, 0);
    /* GGUF Gemma norms already hold 1 + w */
    assert_int_equal(d->norm, EM_NORM_RMS);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *l = &d->layers[il];
        assert_attention(l, 4, 2, 32, EM_ROPE_NEOX, 10000.0f, false);
        assert_float_equal(l->attn_softcap, 50.0f, 0);
        assert_true(l->post_attn_norm && l->post_ffn_norm);
        assert_non_null(m->w.layers[il].post_ffn_norm);
        /* even layers slide, odd layers see everything */
        assert_int_equal(l->attn, il % 2 == 0 ? EM_ATTN_SLIDING : EM_ATTN_FULL);
        if (il % 2 == 0) assert_int_equal(l->window, 8);
    }
    em_model_free(m);
}

static void test_gemma3(void **state) {
    (void)state;
    em_model *m = load("tiny-gemma3", "f32");
    const em_model_desc *d = &m->desc;
    assert_string_equal(d->arch, "gemma3");
    assert_int_equal(d->n_layer, 6);
    assert_float_equal(d->final_softcap, 0.0f, 0);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *l = &d->layers[il];
        const bool global = il == 5; /* five local layers, then a global one */
        assert_attention(l, 4, 2, 32, EM_ROPE_NEOX, global ? 1e6f : 10000.0f, true);
        assert_int_equal(l->attn, global ? EM_ATTN_FULL : EM_ATTN_SLIDING);
        assert_float_equal(l->attn_softcap, 0.0f, 0);
    }
    char line[160];
    em_model_describe_layer(d, 0, line, sizeof line);
    assert_string_equal(line, "sliding 8 attn 4/2 heads x 32 qk-norm, neox rope 10000 (32 dims), dense 256");
    em_model_describe_layer(d, 5, line, sizeof line);
    assert_string_equal(line, "full attn 4/2 heads x 32 qk-norm, neox rope 1e+06 (32 dims), dense 256");
    em_model_free(m);
}

/* The attention scale's dimension, from published configurations: query_pre_attn_scalar 144 for
 * Gemma 2 27B (46 layers, 4608 wide, 32 heads of 128), 168 for Gemma 3 27B (62 layers, 5376, 32
 * heads of 128); the smaller Gemmas and every other family scale by their head dimension (Gemma
 * 3 1B: 26 layers, 1152 wide, 4 heads of 256, where n_embd / n_head would be 288). */
static void test_attn_scale_dim(void **state) {
    (void)state;
    assert_int_equal(em_model_attn_scale_dim("gemma2", 46, 4608, 32, 128), 144);
    assert_int_equal(em_model_attn_scale_dim("gemma3", 62, 5376, 32, 128), 168);
    assert_int_equal(em_model_attn_scale_dim("gemma2", 42, 3584, 16, 256), 256);
    assert_int_equal(em_model_attn_scale_dim("gemma3", 26, 1152, 4, 256), 256);
    assert_int_equal(em_model_attn_scale_dim("gemma2", 62, 4608, 32, 128), 128);
    assert_int_equal(em_model_attn_scale_dim("llama", 46, 4608, 32, 128), 128);
    /* the loader applies it: a 46-layer tiny gemma2 (n_embd / n_head = 128 / 4 = 32 = head_dim) */
    em_synth_options o = {.preset = "tiny-gemma2", .type = "f32", .seed = 7, .vocab_path = VOCAB, .layers = 46};
    const char *path = DIR "/tiny-gemma2-46-layers.gguf";
    mkdir(DIR, 0755);
    em_err err = em_synth_write(&o, path);
    if (err) fail_msg("synth: %s", em_err_message(err));
    em_model *m = NULL;
    if ((err = em_model_load(path, &m))) fail_msg("load: %s", em_err_message(err));
    assert_int_equal(m->desc.n_layer, 46);
    assert_float_equal(m->desc.layers[45].attn_scale, 1.0f / sqrtf(32.0f), 1e-7);
    em_model_free(m);
    remove(path);
}

static void test_flint(void **state) {
    (void)state;
    em_model *m = load("tiny-flint", "f32");
    const em_model_desc *d = &m->desc;
    assert_string_equal(d->arch, "flint");
    assert_int_equal(d->n_layer, 4);
    assert_false(d->tied_output);
    assert_float_equal(d->norm_eps, 1e-6f, 1e-12);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *l = &d->layers[il];
        assert_attention(l, 4, 2, 32, EM_ROPE_NEOX, 1e6f, true);
        if (il < 2) {
            assert_false(l->moe);
            assert_int_equal(l->n_ff, 256);
        } else {
            assert_moe(l, 8, 3, 64);
        }
    }
    em_model_free(m);
}

/* Quantized types land on the tensors whose rows fit their blocks; norms and routers stay f32. */
static void test_types(void **state) {
    (void)state;
    em_model *m = load("tiny-flint", "q8_0");
    assert_int_equal(m->w.layers[0].wq.type, EM_TYPE_Q8_0);
    assert_int_equal(m->w.layers[2].gate_inp.type, EM_TYPE_F32);
    assert_int_equal(m->w.token_embd.type, EM_TYPE_Q8_0);
    em_model_free(m);
    m = load("tiny-qwen3moe", "mix");
    /* 128-wide rows do not fit 256-element blocks: Q8_0 instead */
    assert_int_equal(m->w.layers[0].wq.type, EM_TYPE_Q8_0);
    em_model_free(m);
    m = load("tiny-llama", "f16");
    assert_int_equal(m->w.layers[1].ffn_down.type, EM_TYPE_F16);
    em_model_free(m);
    m = load("tiny-llama", "bf16");
    assert_int_equal(m->w.layers[1].ffn_down.type, EM_TYPE_BF16);
    em_model_free(m);
    m = load("tiny-llama", "q4_k");
    assert_int_equal(m->w.layers[1].ffn_down.type, EM_TYPE_Q4_K); /* 256-wide rows */
    assert_int_equal(m->w.layers[1].ffn_up.type, EM_TYPE_Q8_0);   /* 128-wide rows */
    em_model_free(m);
}

/* ---- broken files: a copy of a good model with one thing changed ---- */

typedef enum change {
    DROP_TENSOR, RESHAPE_TENSOR, RETYPE_TENSOR, RENAME_ARCH, DROP_KEY, ADD_YARN, ADD_LINEAR, ADD_FREQS,
    SET_U32, /* name is "key=value": the key set (or added) as a u32 */
    RENAME_TENSOR, /* name is "old=new" */
} change;

static em_err copy_with(const char *src, const char *dst, change what, const char *name) {
    em_gguf *g;
    em_err err = em_gguf_open(src, &g);
    if (err) return err;
    em_gguf_writer *w;
    if ((err = em_gguf_writer_new(3, &w))) {
        em_gguf_close(g);
        return err;
    }
    char set_key[128] = "";
    unsigned set_value = 0;
    if (what == SET_U32 && sscanf(name, "%127[^=]=%u", set_key, &set_value) != 2) err = em_errorf(EM_ERR_INVALID, "%s", name);
    if (what == SET_U32 && !err) err = em_gguf_writer_add_u32(w, set_key, set_value);
    for (uint64_t i = 0; i < em_gguf_kv_count(g) && !err; i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(g, i);
        if (what == SET_U32 && em_str_eq(kv->key, set_key)) continue;
        if (what == RENAME_ARCH && em_str_eq(kv->key, "general.architecture"))
            err = em_gguf_writer_add_str(w, "general.architecture", name);
        else if (!(what == DROP_KEY && em_str_eq(kv->key, name)))
            err = em_gguf_writer_copy_kv(w, kv);
    }
    if (what == ADD_YARN || what == ADD_LINEAR) {
        if (!err) err = em_gguf_writer_add_str(w, "llama.rope.scaling.type", what == ADD_YARN ? "yarn" : "linear");
        if (!err) err = em_gguf_writer_add_f32(w, "llama.rope.scaling.factor", 4.0f);
        if (!err) err = em_gguf_writer_add_u32(w, "llama.rope.scaling.original_context_length", 128);
    }
    static const float factors[16] = {1, 1, 1, 1, 1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8};
    if (what == ADD_FREQS && !err) {
        const uint64_t ne[1] = {16}; /* one divisor per rotated pair: head dim 32 / 2 */
        err = em_gguf_writer_add_tensor(w, "rope_freqs.weight", 1, ne, EM_TYPE_F32, factors, false);
    }
    for (uint64_t i = 0; i < em_gguf_tensor_count(g) && !err; i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        char *tname = em_str_dup(t->name);
        uint64_t ne[EM_GGUF_MAX_DIMS];
        memcpy(ne, t->ne, sizeof ne);
        uint32_t type = t->type;
        bool target = !strcmp(tname, name);
        const char *equals = what == RENAME_TENSOR ? strchr(name, '=') : NULL;
        if (equals && strlen(tname) == (size_t)(equals - name) && !strncmp(tname, name, (size_t)(equals - name))) {
            free(tname);
            tname = em_str_dup((em_str){equals + 1, strlen(equals + 1)});
        }
        if (target && what == RESHAPE_TENSOR) ne[0] /= 2; /* same bytes would be too many: half a row */
        if (target && what == RETYPE_TENSOR) type = EM_TYPE_I32; /* same size as f32 */
        if (!(target && what == DROP_TENSOR))
            err = em_gguf_writer_add_tensor(w, tname, t->n_dims, ne, type, t->data, false);
        free(tname);
    }
    if (!err) err = em_gguf_writer_write(w, dst);
    em_gguf_writer_free(w);
    em_gguf_close(g);
    return err;
}

static void expect_error_in(const char *path, em_err_code code, const char *needle) {
    em_model *m = NULL;
    em_err err = em_model_load(path, &m);
    assert_null(m);
    assert_non_null(err);
    if (!strstr(em_err_message(err), needle)) fail_msg("error '%s' does not mention '%s'", em_err_message(err), needle);
    assert_int_equal(em_err_code_of(err), code);
    em_err_free(err);
}

/* A copy of `preset` at `type` with one thing changed must fail to load with `code`, naming `needle`. */
static void expect_preset_error(const char *preset, const char *type, change what, const char *name,
                                em_err_code code, const char *needle) {
    char good[512], bad[512];
    snprintf(good, sizeof good, "%s", model_path(preset, type));
    snprintf(bad, sizeof bad, DIR "/broken-%s-%d.gguf", preset, (int)what);
    em_err err = copy_with(good, bad, what, name);
    if (err) fail_msg("copy: %s", em_err_message(err));
    expect_error_in(bad, code, needle);
}

static void expect_load_error(change what, const char *name, em_err_code code, const char *needle) {
    expect_preset_error("tiny-llama", "f32", what, name, code, needle);
}

/* Qwen3.5 (qwen35): three Gated DeltaNet layers to one gated attention layer; the ssm.* keys give the
 * DeltaNet shape, the attention keys the attention layers', of whose head dims rope.dimension_count rotate. */
static void test_qwen35(void **state) {
    (void)state;
    em_model *m = load("tiny-qwen35", "f32");
    const em_model_desc *d = &m->desc;
    assert_int_equal(d->n_layer, 4);
    for (uint32_t il = 0; il < 3; il++) {
        const em_layer_desc *l = &d->layers[il];
        assert_int_equal(l->mixer, EM_MIXER_DELTA_NET);
        assert_int_equal(l->delta_net.conv_kernel, 4);
        assert_int_equal(l->delta_net.n_head_k, 2);
        assert_int_equal(l->delta_net.n_head_v, 4);
        assert_int_equal(l->delta_net.head_dim_k, 32);
        assert_int_equal(l->delta_net.head_dim_v, 32);
        assert_true(l->delta_net.v_tiled);
        const em_layer_weights *w = &m->w.layers[il];
        assert_non_null(w->ssm_qkv.data);
        assert_int_equal(w->ssm_qkv.rows, 2 * 2 * 32 + 4 * 32);
        assert_non_null(w->ssm_conv);
        assert_non_null(w->ssm_norm);
        assert_null(w->wq.data);
    }
    const em_layer_desc *attn = &d->layers[3];
    assert_int_equal(attn->mixer, EM_MIXER_ATTENTION);
    assert_true(attn->attn_output_gate && attn->qk_norm);
    assert_int_equal(attn->head_dim, 64);
    assert_int_equal(attn->rope.n_rot, 16);
    assert_int_equal(attn->rope.style, EM_ROPE_NEOX);
    assert_int_equal(m->w.layers[3].wq.rows, 2 * 4 * 64); /* [query | gate] per head */
    em_model_free(m);
}

/* Qwen3.5 MoE (qwen35moe): qwen35's layers with routed experts and a shared expert that
 * ffn_gate_inp_shexp gates, which such a file must have; gate and up stacks fused in one tensor
 * (llama.cpp's converter on request) are refused, not misread. */
static void test_qwen35moe(void **state) {
    (void)state;
    em_model *m = load("tiny-qwen35moe", "f32");
    for (uint32_t il = 0; il < 4; il++) {
        const em_layer_desc *l = &m->desc.layers[il];
        assert_int_equal(l->mixer, il == 3 ? EM_MIXER_ATTENTION : EM_MIXER_DELTA_NET);
        assert_true(l->moe && l->renormalize);
        assert_int_equal(l->gating, EM_GATING_SOFTMAX);
        assert_int_equal(l->n_expert, 8);
        assert_int_equal(l->n_expert_used, 2);
        assert_int_equal(l->n_ff, 64);
        assert_int_equal(l->n_ff_shared, 64);
        assert_int_equal(m->w.layers[il].gate_inp_shexp.rows, 1);
        assert_int_equal(m->w.layers[il].gate_inp_shexp.cols, 128);
    }
    char line[160];
    em_model_describe_layer(&m->desc, 0, line, sizeof line);
    assert_string_equal(line, "delta_net 4/2 heads x 32/32, conv 4, tiled, moe 2/8 x 64 renorm + shared 64");
    em_model_free(m);
    expect_preset_error("tiny-qwen35moe", "f32", DROP_TENSOR, "blk.2.ffn_gate_inp_shexp.weight", EM_ERR_NOT_FOUND,
                        "missing tensor blk.2.ffn_gate_inp_shexp.weight");
    /* gate and up in one stack are read beside a dense unit (gemma4) only, so far */
    expect_preset_error("tiny-qwen35moe", "f32", RENAME_TENSOR, "blk.1.ffn_gate_exps.weight=blk.1.ffn_gate_up_exps.weight",
                        EM_ERR_NOT_FOUND, "missing tensor blk.1.ffn_gate_exps.weight");
}

/* A qwen35 file whose DeltaNet keys disagree is refused with the key named; multi-token-prediction
 * layers counted in block_count are left out of the main stack. */
static void test_qwen35_keys(void **state) {
    (void)state;
    expect_preset_error("tiny-qwen35", "f32", SET_U32, "qwen35.ssm.time_step_rank=3", EM_ERR_FORMAT,
                    "qwen35.ssm.time_step_rank = 3 value heads is not a multiple of qwen35.ssm.group_count = 2");
    expect_preset_error("tiny-qwen35", "f32", SET_U32, "qwen35.ssm.conv_kernel=0", EM_ERR_RANGE, "qwen35.ssm.conv_kernel = 0");
    expect_preset_error("tiny-qwen35", "f32", SET_U32, "qwen35.ssm.inner_size=130", EM_ERR_FORMAT,
                    "qwen35.ssm.inner_size = 130 does not divide into 4 value heads");
    expect_preset_error("tiny-qwen35", "f32", DROP_KEY, "qwen35.ssm.state_size", EM_ERR_NOT_FOUND, "qwen35.ssm.state_size");
    expect_preset_error("tiny-qwen35", "f32", SET_U32, "qwen35.nextn_predict_layers=4", EM_ERR_FORMAT,
                    "qwen35.nextn_predict_layers = 4 leaves none of the 4 blocks");
    expect_preset_error("tiny-qwen35", "f32", DROP_TENSOR, "blk.1.ssm_a", EM_ERR_NOT_FOUND, "missing tensor blk.1.ssm_a");
    expect_preset_error("tiny-qwen35", "f32", RESHAPE_TENSOR, "blk.2.ssm_conv1d.weight", EM_ERR_FORMAT,
                    "tensor blk.2.ssm_conv1d.weight has shape");
    char path[512];
    snprintf(path, sizeof path, DIR "/qwen35-nextn.gguf");
    em_err err = copy_with(model_path("tiny-qwen35", "f32"), path, SET_U32, "qwen35.nextn_predict_layers=1");
    if (err) fail_msg("copy: %s", em_err_message(err));
    em_model *m = NULL;
    if ((err = em_model_load(path, &m))) fail_msg("load: %s", em_err_message(err));
    assert_int_equal(m->desc.n_layer, 3);
    assert_int_equal(m->program.n_caches, 0); /* the attention layer was the fourth */
    assert_int_equal(m->program.n_states, 3);
    em_model_free(m);
}

static void test_missing_tensor(void **state) {
    (void)state;
    expect_load_error(DROP_TENSOR, "blk.1.attn_k.weight", EM_ERR_NOT_FOUND, "missing tensor blk.1.attn_k.weight");
    expect_load_error(DROP_TENSOR, "output_norm.weight", EM_ERR_NOT_FOUND, "output_norm.weight");
}

static void test_misshaped_tensor(void **state) {
    (void)state;
    expect_load_error(RESHAPE_TENSOR, "blk.0.ffn_down.weight", EM_ERR_FORMAT, "tensor blk.0.ffn_down.weight has shape");
}

static void test_unsupported_type(void **state) {
    (void)state;
    expect_load_error(RETYPE_TENSOR, "blk.0.attn_q.weight", EM_ERR_UNSUPPORTED, "blk.0.attn_q.weight has type I32");
}

/* The family registry: rows that share a GGUF architecture must agree on everything a GGUF file
 * can show (the loader reads the first of them), and the classes map as llama.cpp's converter maps
 * them (convert_hf_to_gguf.py: LlamaForCausalLM, MistralForCausalLM and MixtralForCausalLM are
 * written as `llama`; Gemma3ForConditionalGeneration's text model as `gemma3`). */
static void test_family_registry(void **state) {
    (void)state;
    size_t n = 0;
    for (const em_family *f; (f = em_family_at(n)); n++) {
        const em_family *first = em_family_by_gguf_arch(f->gguf_arch);
        assert_non_null(first);
        assert_ptr_equal(em_family_by_name(f->name), f);
        for (size_t k = 0; k < EM_FAMILY_HF_CLASSES && f->hf_classes[k]; k++)
            assert_ptr_equal(em_family_by_hf_class(f->hf_classes[k]), f);
        assert_int_equal(f->act, first->act);
        assert_int_equal(f->rope, first->rope);
        assert_int_equal(f->qk_norm, first->qk_norm);
        assert_int_equal(f->qkv_bias, first->qkv_bias);
        assert_int_equal(f->post_norms, first->post_norms);
        assert_int_equal(f->embd_scale_sqrt, first->embd_scale_sqrt);
        assert_int_equal(f->window, first->window);
        assert_int_equal(f->window_period, first->window_period);
        assert_float_equal(f->local_rope_theta, first->local_rope_theta, 0);
        assert_int_equal(f->attn_scale_embd_layers, first->attn_scale_embd_layers);
        assert_int_equal(f->hybrid, first->hybrid);
        assert_int_equal(f->attn_output_gate, first->attn_output_gate);
        assert_true(!f->ffn_norm_tensor == !first->ffn_norm_tensor);
        assert_int_equal(f->swa_keys, first->swa_keys);
        assert_int_equal(f->value_norm, first->value_norm);
        assert_int_equal(f->unit_attn_scale, first->unit_attn_scale);
        assert_int_equal(f->shared_kv, first->shared_kv);
        assert_int_equal(f->per_layer_inputs, first->per_layer_inputs);
        assert_float_equal(f->default_final_softcap, first->default_final_softcap, 0);
    }
    assert_int_equal(n, 13);
    assert_string_equal(em_family_by_hf_class("MistralForCausalLM")->gguf_arch, "llama");
    assert_string_equal(em_family_by_hf_class("MixtralForCausalLM")->gguf_arch, "llama");
    assert_string_equal(em_family_by_hf_class("Gemma3ForConditionalGeneration")->gguf_arch, "gemma3");
    assert_string_equal(em_family_by_gguf_arch("llama")->name, "llama");
    assert_null(em_family_by_hf_class("MambaForCausalLM"));
    char list[512];
    em_family_list_gguf_archs(list, sizeof list);
    assert_string_equal(list, "llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, gemma4, gpt-oss, qwen35, qwen35moe, flint");
    assert_string_equal(em_family_by_hf_class("Qwen3_5ForConditionalGeneration")->gguf_arch, "qwen35");
    em_family_list_hf_classes(list, sizeof list);
    assert_non_null(strstr(list, "MistralForCausalLM, MixtralForCausalLM"));
}


/* Gemma 4 as llama.cpp's converter writes it: sliding layers with the `_swa` head size and RoPE, full
 * layers with their own, KV heads and FF widths per layer, attention scale 1, V normalized; the
 * last layers sharing KV; per-layer inputs; experts beside a dense unit, gate and up in one stack. */
static void test_gemma4(void **state) {
    (void)state;
    em_model *m = load("tiny-gemma4-ple", "f32");
    const em_model_desc *d = &m->desc;
    assert_int_equal(d->n_layer, 8);
    assert_int_equal(d->n_embd_per_layer, 32);
    assert_float_equal(d->embd_scale, sqrtf(128.0f), 1e-5);
    assert_int_equal(d->norm, EM_NORM_RMS);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *l = &d->layers[il];
        const bool full = il == 3 || il == 7;
        assert_int_equal(l->attn, full ? EM_ATTN_FULL : EM_ATTN_SLIDING);
        assert_int_equal(l->window, full ? 0 : 8);
        assert_int_equal(l->head_dim, full ? 64 : 32);
        assert_int_equal(l->head_dim_v, full ? 64 : 32);
        assert_int_equal(l->n_head_kv, 2);
        assert_float_equal(l->attn_scale, 1.0f, 0);
        assert_true(l->value_norm && l->qk_norm && l->post_attn_norm && l->post_ffn_norm);
        assert_false(l->values_from_keys);
        assert_int_equal(l->n_ff, il < 4 ? 256 : 512);
        assert_int_equal(l->rope.n_rot, full ? 64 : 32);
        assert_float_equal(l->rope.theta, full ? 1e6f : 1e4f, 0);
        assert_int_equal(l->rope.style, EM_ROPE_NEOX);
        const em_layer_weights *w = &m->w.layers[il];
        assert_non_null(w->per_layer_gate.data);
        assert_non_null(w->output_scale);
        assert_true(il < 4 ? w->wk.data && w->k_norm : !w->wk.data && !w->k_norm && !w->wv.data);
    }
    char line[160];
    em_model_describe_layer(d, 5, line, sizeof line);
    assert_string_equal(line, "sliding 8 attn 4/2 heads x 32 qk-norm v-norm kv of layer 2, neox rope 10000 (32 dims), dense 512");
    assert_int_equal(m->w.per_layer_embd.cols, 8 * 32);
    assert_int_equal(m->w.per_layer_proj.rows, 8 * 32);
    assert_float_equal(d->final_softcap, 30.0f, 0);
    em_model_free(m);

    m = load("tiny-gemma4-moe", "q8_0");
    d = &m->desc;
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *l = &d->layers[il];
        assert_true(l->moe);
        assert_int_equal(l->n_expert, 8);
        assert_int_equal(l->n_expert_used, 2);
        assert_int_equal(l->n_ff, 64);
        assert_int_equal(l->n_ff_dense, 128);
        assert_int_equal(l->n_head_kv, l->attn == EM_ATTN_FULL ? 1 : 2);
        assert_int_equal(l->values_from_keys, l->attn == EM_ATTN_FULL);
        const em_layer_weights *w = &m->w.layers[il];
        assert_int_equal(w->gate_exps.type, EM_TYPE_Q8_0);
        assert_int_equal(w->gate_exps.mat_bytes, 2 * 64 * w->gate_exps.row_bytes);
        assert_non_null(w->expert_scale);
        assert_true(w->pre_ffn_norm_2 && w->post_ffn_norm_1 && w->post_ffn_norm_2 && w->router_norm);
        assert_int_equal(w->ffn_gate.rows, 128);
    }
    em_model_describe_layer(d, 2, line, sizeof line);
    assert_string_equal(line, "full attn 4/1 heads x 64 qk-norm v-norm k=v, neox rope 1e+06 (64 dims), dense 128 + moe 2/8 x 64");
    em_model_free(m);
}

/* A Gemma 4 file whose sharing or per-layer inputs cannot be read is refused with the key named. */
static void test_gemma4_refused(void **state) {
    (void)state;
    expect_preset_error("tiny-gemma4-ple", "f32", SET_U32, "gemma4.attention.shared_kv_layers=8", EM_ERR_RANGE,
                        "gemma4.attention.shared_kv_layers = 8 leaves none of the 8 layers its own KV");
    expect_preset_error("tiny-gemma4-ple", "f32", SET_U32, "gemma4.attention.shared_kv_layers=6", EM_ERR_FORMAT,
                        "gemma4.attention.shared_kv_layers = 6: layer 3 has no earlier full layer to share KV with");
    expect_preset_error("tiny-gemma4-ple", "f32", SET_U32, "gemma4.embedding_length_per_layer_input=0", EM_ERR_FORMAT,
                        "per_layer_token_embd.weight, but gemma4.embedding_length_per_layer_input is 0");
    expect_preset_error("tiny-gemma4-ple", "f32", SET_U32, "gemma4.attention.key_length_swa=16", EM_ERR_FORMAT,
                        "gemma4.rope.dimension_count_swa = 32 does not fit head dim 16");
    expect_preset_error("tiny-gemma4-moe", "f32", DROP_TENSOR, "blk.1.ffn_gate_inp.scale", EM_ERR_NOT_FOUND,
                        "missing tensor blk.1.ffn_gate_inp.scale");
    expect_preset_error("tiny-gemma4-moe", "f32", DROP_TENSOR, "blk.2.attn_k.weight", EM_ERR_NOT_FOUND,
                        "missing tensor blk.2.attn_k.weight");
}

/* gpt-oss as llama.cpp's converter writes it: biases on every projection, a sink per head, even
 * layers sliding, YaRN, a biased router whose top k logits are softmaxed, biased experts with the
 * clamped SwiGLU, the pre-FFN norm under the name post_attention_norm, an untied output. */
static void test_gpt_oss(void **state) {
    (void)state;
    em_model *m = load("tiny-gpt-oss", "f32");
    const em_model_desc *d = &m->desc;
    assert_string_equal(d->arch, "gpt-oss");
    assert_false(d->tied_output);
    assert_int_equal(d->act, EM_ACT_SWIGLU_CLAMPED);
    assert_float_equal(d->act_limit, 7.0f, 0);
    assert_float_equal(d->act_alpha, 1.702f, 0);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const em_layer_desc *l = &d->layers[il];
        const em_layer_weights *w = &m->w.layers[il];
        assert_attention(l, 4, 2, 32, EM_ROPE_NEOX, 150000.0f, false);
        assert_int_equal(l->attn, il % 2 == 0 ? EM_ATTN_SLIDING : EM_ATTN_FULL);
        if (il % 2 == 0) assert_int_equal(l->window, 8);
        assert_int_equal(l->rope.scaling, EM_ROPE_SCALING_YARN);
        assert_float_equal(l->rope.factor, 32.0f, 0);
        assert_int_equal(l->rope.orig_ctx, 64);
        assert_true(l->moe);
        assert_int_equal(l->n_expert, 8);
        assert_int_equal(l->n_expert_used, 2);
        assert_int_equal(l->n_ff, 128);
        assert_int_equal(l->gating, EM_GATING_SOFTMAX_CHOSEN);
        assert_false(l->renormalize);
        assert_true(l->qkv_bias);
        assert_non_null(w->bo);
        assert_non_null(w->attn_sinks);
        assert_non_null(w->ffn_norm);
        assert_non_null(w->gate_inp_bias);
        assert_non_null(w->gate_exps_bias);
        assert_non_null(w->up_exps_bias);
        assert_non_null(w->down_exps_bias);
    }
    em_model_free(m);
    m = load("tiny-gpt-oss", "mxfp4");
    assert_int_equal(m->w.layers[0].gate_exps.type, EM_TYPE_MXFP4);
    assert_int_equal(m->w.layers[3].down_exps.type, EM_TYPE_MXFP4);
    assert_int_equal(m->w.layers[0].wq.type, EM_TYPE_Q8_0);
    em_model_free(m);
}

/* Sets the first dimension of tensor `name` in a GGUF file's header (the u64 after its name and
 * dimension count) to `ne0`: a file the writer would refuse to make. */
static void patch_first_dim(const char *path, const char *name, uint64_t ne0) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    static uint8_t bytes[1 << 20]; /* the header: the tensor infos of a tiny model fit */
    const size_t n = fread(bytes, 1, sizeof bytes, f);
    const size_t len = strlen(name);
    uint8_t *at = NULL;
    for (size_t i = 8; i + len + 12 < n && !at; i++) {
        uint64_t name_len;
        memcpy(&name_len, bytes + i - 8, 8);
        if (name_len == len && !memcmp(bytes + i, name, len)) at = bytes + i + len + 4; /* past n_dims */
    }
    assert_non_null(at);
    assert_int_equal(fseek(f, (long)(at - bytes), SEEK_SET), 0);
    assert_int_equal(fwrite(&ne0, 8, 1, f), 1);
    fclose(f);
}

/* Bad gpt-oss files are refused with the tensor named: one without its sinks (attention would
 * silently be another model's), and an MXFP4 tensor whose rows are not whole 32-value blocks. */
static void test_gpt_oss_refused(void **state) {
    (void)state;
    expect_preset_error("tiny-gpt-oss", "f32", DROP_TENSOR, "blk.1.attn_sinks.weight", EM_ERR_NOT_FOUND,
                        "missing tensor blk.1.attn_sinks.weight");
    expect_preset_error("tiny-gpt-oss", "f32", DROP_TENSOR, "blk.0.ffn_down_exps.bias", EM_ERR_NOT_FOUND,
                        "missing tensor blk.0.ffn_down_exps.bias");
    char path[512];
    snprintf(path, sizeof path, DIR "/partial-block-mxfp4.gguf");
    em_synth_options o = {.preset = "tiny-gpt-oss", .type = "mxfp4", .seed = 7, .vocab_path = VOCAB};
    em_err err = em_synth_write(&o, path);
    if (err) fail_msg("synth: %s", em_err_message(err));
    patch_first_dim(path, "blk.2.ffn_up_exps.weight", 112); /* 3.5 blocks a row */
    expect_error_in(path, EM_ERR_FORMAT, "blk.2.ffn_up_exps.weight");
    expect_error_in(path, EM_ERR_FORMAT, "not a multiple of the MXFP4 block");
}

static void test_unknown_arch(void **state) {
    (void)state;
    expect_load_error(RENAME_ARCH, "mamba", EM_ERR_UNSUPPORTED, "unknown architecture 'mamba'");
    assert_false(em_model_arch_supported("mamba"));
    assert_true(em_model_arch_supported("qwen3moe"));
}

static void test_missing_key(void **state) {
    (void)state;
    expect_load_error(DROP_KEY, "llama.embedding_length", EM_ERR_NOT_FOUND, "llama.embedding_length");
}

static em_model *load_changed(change what) {
    char good[512], path[512];
    snprintf(good, sizeof good, "%s", model_path("tiny-llama", "f32"));
    snprintf(path, sizeof path, DIR "/changed-%d.gguf", (int)what);
    em_err err = copy_with(good, path, what, "");
    if (err) fail_msg("copy: %s", em_err_message(err));
    em_model *m = NULL;
    if ((err = em_model_load(path, &m))) fail_msg("load: %s", em_err_message(err));
    return m;
}

/* RoPE scaling as llama.cpp's converter records it: rope.scaling.* keys, or for Llama 3 a tensor
 * of per-frequency divisors. */
static void test_rope_scaling(void **state) {
    (void)state;
    em_model *m = load_changed(ADD_YARN);
    const em_rope *r = &m->desc.layers[1].rope;
    assert_int_equal(r->scaling, EM_ROPE_SCALING_YARN);
    assert_float_equal(r->factor, 4.0f, 0);
    assert_int_equal(r->orig_ctx, 128);
    assert_float_equal(r->yarn_ext_factor, 1.0f, 0);
    assert_float_equal(r->yarn_beta_fast, 32.0f, 0);
    assert_float_equal(r->yarn_beta_slow, 1.0f, 0);
    em_model_free(m);
    m = load_changed(ADD_LINEAR);
    assert_int_equal(m->desc.layers[0].rope.scaling, EM_ROPE_SCALING_LINEAR);
    assert_float_equal(m->desc.layers[0].rope.factor, 4.0f, 0);
    em_model_free(m);
    m = load_changed(ADD_FREQS);
    r = &m->desc.layers[0].rope;
    assert_int_equal(r->scaling, EM_ROPE_SCALING_LLAMA3);
    assert_non_null(r->freq_factors);
    assert_float_equal(r->freq_factors[0], 1.0f, 0);
    assert_float_equal(r->freq_factors[9], 4.0f, 0);
    em_model_free(m);
}

static void test_synth_errors(void **state) {
    (void)state;
    em_synth_options o = {.preset = "tiny-gpt", .type = "f32", .vocab_path = VOCAB};
    em_err err = em_synth_write(&o, DIR "/x.gguf");
    assert_int_equal(em_err_code_of(err), EM_ERR_INVALID);
    assert_non_null(strstr(em_err_message(err), "tiny-gpt"));
    em_err_free(err);
    o.preset = "tiny-llama";
    o.type = "q3_k";
    err = em_synth_write(&o, DIR "/x.gguf");
    assert_int_equal(em_err_code_of(err), EM_ERR_INVALID);
    em_err_free(err);
    o.type = "f32";
    o.experts = 4; /* a dense preset has no experts */
    err = em_synth_write(&o, DIR "/x.gguf");
    assert_int_equal(em_err_code_of(err), EM_ERR_INVALID);
    em_err_free(err);
}

/* Asserts that two loaded models have the same weights, byte for byte. */
static void assert_same_weight(const em_weight *a, const em_weight *b) {
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->rows, b->rows);
    assert_int_equal(a->cols, b->cols);
    assert_memory_equal(a->data, b->data, a->row_bytes * a->rows * a->n_mat);
}

static void expect_split_error(const char *path, em_err_code code, const char *needle) {
    em_model *m = NULL;
    em_err err = em_model_load(path, &m);
    assert_null(m);
    assert_non_null(err);
    if (em_err_code_of(err) != code || !strstr(em_err_message(err), needle))
        fail_msg("expected %s with '%s', got %s: %s", em_err_code_name(code), needle,
                 em_err_code_name(em_err_code_of(err)), em_err_message(err));
    em_err_free(err);
}

/* A split set (llama.cpp's gguf-split layout) loads as the model it was cut from; a missing part,
 * a later part and parts that disagree are errors that name the file. */
static void test_split(void **state) {
    (void)state;
    const char *path = model_path("tiny-qwen3", "q8_0");
    em_gguf *g;
    assert_null(em_gguf_open(path, &g));
    assert_null(em_gguf_write_split(g, 3, DIR "/split"));
    assert_null(em_gguf_write_split(g, 2, DIR "/other"));
    em_gguf_close(g);

    uint32_t part, count;
    size_t prefix_len;
    assert_true(em_gguf_split_name(DIR "/split-00002-of-00003.gguf", &part, &count, &prefix_len));
    assert_int_equal(part, 2);
    assert_int_equal(count, 3);
    assert_int_equal(prefix_len, strlen(DIR "/split"));
    assert_false(em_gguf_split_name("model-2-of-3.gguf", &part, &count, &prefix_len));
    assert_false(em_gguf_split_name("model-00004-of-00003.gguf", &part, &count, &prefix_len));

    em_model *whole = load("tiny-qwen3", "q8_0"), *split = NULL;
    em_err err = em_model_load(DIR "/split-00001-of-00003.gguf", &split);
    if (err) fail_msg("%s", em_err_message(err));
    assert_int_equal(split->n_parts, 3);
    assert_int_equal(split->desc.n_layer, whole->desc.n_layer);
    assert_int_equal(split->desc.n_vocab, whole->desc.n_vocab);
    assert_same_weight(&split->w.token_embd, &whole->w.token_embd);
    assert_same_weight(&split->w.output, &whole->w.output);
    for (uint32_t il = 0; il < whole->desc.n_layer; il++) {
        assert_same_weight(&split->w.layers[il].wq, &whole->w.layers[il].wq);
        assert_same_weight(&split->w.layers[il].ffn_down, &whole->w.layers[il].ffn_down);
        assert_memory_equal(split->w.layers[il].attn_norm, whole->w.layers[il].attn_norm, whole->desc.n_embd * 4);
    }
    /* The weights come from several files: output_norm is not in the first part. */
    assert_null(em_gguf_find_tensor(split->parts[0], "output_norm.weight"));
    em_model_free(split);
    em_model_free(whole);

    expect_split_error(DIR "/split-00002-of-00003.gguf", EM_ERR_INVALID, "open the first part, " DIR "/split-00001-of-00003.gguf");
    /* A part of another set under this set's name: its split.count disagrees. */
    rename(DIR "/split-00002-of-00003.gguf", DIR "/split-keep.gguf");
    link(DIR "/other-00002-of-00002.gguf", DIR "/split-00002-of-00003.gguf");
    expect_split_error(DIR "/split-00001-of-00003.gguf", EM_ERR_FORMAT, "split.count = 2");
    unlink(DIR "/split-00002-of-00003.gguf");
    expect_split_error(DIR "/split-00001-of-00003.gguf", EM_ERR_NOT_FOUND,
                       "part 2 of 3 of the split model " DIR "/split-00001-of-00003.gguf is missing");
    rename(DIR "/split-keep.gguf", DIR "/split-00002-of-00003.gguf");
    /* The first part renamed: the others cannot be found from it. */
    rename(DIR "/split-00001-of-00003.gguf", DIR "/renamed.gguf");
    expect_split_error(DIR "/renamed.gguf", EM_ERR_INVALID, "the other parts cannot be found");
    rename(DIR "/renamed.gguf", DIR "/split-00001-of-00003.gguf");
}

/* Same options, same bytes; another seed, other weights. */
static void test_synth_deterministic(void **state) {
    (void)state;
    em_synth_options o = {.preset = "tiny-qwen3moe", .type = "q4_k", .seed = 1, .vocab_path = VOCAB, .layers = 1,
                          .experts = 4};
    const char *paths[3] = {DIR "/det-a.gguf", DIR "/det-b.gguf", DIR "/det-c.gguf"};
    mkdir(DIR, 0755);
    for (int i = 0; i < 3; i++) {
        o.seed = i == 2 ? 2 : 1;
        em_err err = em_synth_write(&o, paths[i]);
        if (err) fail_msg("%s", em_err_message(err));
    }
    em_gguf *g[3];
    for (int i = 0; i < 3; i++) assert_null(em_gguf_open(paths[i], &g[i]));
    assert_int_equal(em_gguf_file_size(g[0]), em_gguf_file_size(g[1]));
    const em_gguf_tensor *t[3];
    for (int i = 0; i < 3; i++) t[i] = em_gguf_find_tensor(g[i], "blk.0.ffn_up_exps.weight");
    assert_int_equal(t[0]->ne[2], 4);
    assert_memory_equal(t[0]->data, t[1]->data, t[0]->size);
    assert_memory_not_equal(t[0]->data, t[2]->data, t[0]->size);
    uint32_t layers;
    assert_null(em_gguf_get_u32(g[0], "qwen3moe.block_count", &layers));
    assert_int_equal(layers, 1);
    em_str tmpl;
    assert_null(em_gguf_get_str(g[0], "tokenizer.chat_template", &tmpl));
    assert_non_null(memmem(tmpl.ptr, tmpl.len, "<|im_start|>", 12));
    const em_gguf_kv *tokens = em_gguf_find(g[0], "tokenizer.ggml.tokens");
    assert_non_null(tokens);
    assert_int_equal(tokens->array_len, 32000);
    for (int i = 0; i < 3; i++) em_gguf_close(g[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),          cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen3),          cmocka_unit_test(test_qwen3moe),
        cmocka_unit_test(test_mixtral),        cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_gemma3),         cmocka_unit_test(test_flint),
        cmocka_unit_test(test_attn_scale_dim), cmocka_unit_test(test_family_registry),
        cmocka_unit_test(test_types),          cmocka_unit_test(test_missing_tensor),
        cmocka_unit_test(test_misshaped_tensor), cmocka_unit_test(test_unsupported_type),
        cmocka_unit_test(test_unknown_arch),   cmocka_unit_test(test_missing_key),
        cmocka_unit_test(test_rope_scaling),   cmocka_unit_test(test_synth_errors),
        cmocka_unit_test(test_qwen35), cmocka_unit_test(test_qwen35moe),       cmocka_unit_test(test_qwen35_keys),
        cmocka_unit_test(test_gemma4),         cmocka_unit_test(test_gemma4_refused),
        cmocka_unit_test(test_synth_deterministic), cmocka_unit_test(test_split),
        cmocka_unit_test(test_gpt_oss),        cmocka_unit_test(test_gpt_oss_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
