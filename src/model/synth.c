/* Synthetic models: GGUF files with deterministic random weights at a real model's shape, with the
 * metadata keys and tensor names llama.cpp's converter writes (so llama.cpp loads them too), the
 * llama-spm tokenizer and a ChatML chat template.
 *
 * Nothing is held in memory as floats: each tensor is produced while the file is written
 * (em_gguf_writer_write_streaming), from its own random stream (seed, tensor name), a row block at
 * a time. Block-quantized tensors are random valid blocks whose scale fields are set so that the
 * dequantized values have the wanted RMS; that is much faster than quantizing floats and still
 * gives every code path real data. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "model.h"

/* A preset: a real model's shape in one family. What the family decides (QK-norm, biases, post-norms,
 * which GGUF keys exist) comes from its row of the registry (model.h). */
typedef struct preset {
    const char *name, *family;
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    uint32_t n_expert, n_expert_used, n_ff_expert, n_dense_lead; /* n_expert 0: dense */
    bool tied;                         /* also when the family always ties */
    float theta, eps;
    uint32_t window;                   /* sliding window (gemma2/3), 0 = none */
    float attn_softcap, final_softcap; /* gemma2 */
    const char *rope_scaling;          /* as em_synth_options.rope_scaling; NULL = none */
} preset;

/* What a hybrid family's preset adds: the rotated dimensions per head, the Gated DeltaNet layers'
 * conv kernel, key and value heads and head dim (one for keys and values), and the width of the
 * shared expert beside the routed ones (0 = none; the family's row says whether it is gated). */
typedef struct hybrid_shape {
    const char *preset;
    uint32_t rope_dims, ssm_kernel, ssm_heads_k, ssm_heads_v, ssm_head_dim, n_ff_shared;
} hybrid_shape;

/* What a family with sliding and full layers of their own shapes adds (Gemma 4): every period-th
 * layer is full, and so is the last; the full layers' head size, KV heads, RoPE base and the share of
 * their head that rotates (proportional RoPE, as a rope_freqs tensor); whether they have no V
 * projection (K = V); the last layers that share KV, the shared layers' gated units twice as wide;
 * the per-layer inputs' width (0: none). */
typedef struct kinds_shape {
    const char *preset;
    uint32_t period, full_head_dim, full_kv_heads;
    float full_theta, full_rotary;
    bool values_from_keys;
    uint32_t shared_kv;
    bool double_wide;
    uint32_t per_layer;
} kinds_shape;

/* Hybrid layouts: every FULL_ATTENTION_INTERVAL-th layer attends, the others are Gated DeltaNet. */
#define FULL_ATTENTION_INTERVAL 4

static const preset presets[] = {
    /* name          family      L   d     H   KV  hd   ff     vocab   ctx     E    k  ffE   lead tied  theta   eps  win  caps */
    {"dense-1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 0, 0, 0, 0, true, 500000.0f, 1e-5f, 0, 0, 0, "llama3:32:8192"},
    {"moe-30b-a3b", "qwen3moe", 48, 2048, 32, 4, 128, 6144, 151936, 40960, 128, 8, 768, 0, false, 1e6f, 1e-6f, 0, 0, 0, NULL},
    {"flint", "flint", 49, 2048, 16, 4, 128, 8192, 102400, 32768, 64, 6, 1024, 2, false, 1e6f, 1e-6f, 0, 0, 0, NULL},
    {"tiny-llama", "llama", 2, 128, 4, 2, 32, 256, 32000, 512, 0, 0, 0, 0, false, 10000.0f, 1e-5f, 0, 0, 0, NULL},
    {"tiny-qwen2", "qwen2", 2, 128, 4, 2, 32, 256, 32000, 512, 0, 0, 0, 0, true, 1e6f, 1e-6f, 0, 0, 0, NULL},
    {"tiny-qwen3", "qwen3", 2, 128, 4, 2, 64, 256, 32000, 512, 0, 0, 0, 0, true, 1e6f, 1e-6f, 0, 0, 0, NULL},
    {"tiny-qwen3moe", "qwen3moe", 2, 128, 4, 2, 32, 256, 32000, 512, 8, 2, 64, 0, false, 1e6f, 1e-6f, 0, 0, 0, NULL},
    {"tiny-gemma2", "gemma2", 4, 128, 4, 2, 32, 256, 32000, 512, 0, 0, 0, 0, true, 10000.0f, 1e-6f, 8, 50.0f, 30.0f, NULL},
    {"tiny-gemma3", "gemma3", 6, 128, 4, 2, 32, 256, 32000, 512, 0, 0, 0, 0, true, 1e6f, 1e-6f, 8, 0, 0, NULL},
    {"tiny-mixtral", "mixtral", 2, 128, 4, 2, 32, 128, 32000, 512, 4, 2, 128, 0, false, 1e6f, 1e-5f, 0, 0, 0, NULL},
    {"tiny-flint", "flint", 4, 128, 4, 2, 32, 256, 32000, 512, 8, 3, 64, 2, false, 1e6f, 1e-6f, 0, 0, 0, NULL},
    {"tiny-gpt-oss", "gpt-oss", 4, 128, 4, 2, 32, 128, 32000, 512, 8, 2, 128, 0, false, 150000.0f, 1e-5f, 8, 0, 0, "yarn:32:64"},
    /* gpt-oss at its real shapes; `--layers` cuts them down for a machine without the memory */
    {"gpt-oss-20b", "gpt-oss", 24, 2880, 64, 8, 64, 2880, 201088, 131072, 32, 4, 2880, 0, false, 150000.0f, 1e-5f, 128, 0, 0, "yarn:32:4096"},
    {"gpt-oss-120b", "gpt-oss", 36, 2880, 64, 8, 64, 2880, 201088, 131072, 128, 4, 2880, 0, false, 150000.0f, 1e-5f, 128, 0, 0, "yarn:32:4096"},
    /* rows of 256: every K-format block divides them, so quantization recipes apply unchanged */
    {"small-llama", "llama", 8, 256, 4, 1, 64, 512, 32000, 512, 0, 0, 0, 0, false, 10000.0f, 1e-5f, 0, 0, 0, NULL},
    {"small-qwen3moe", "qwen3moe", 4, 256, 4, 2, 64, 512, 32000, 512, 8, 2, 256, 0, true, 1e6f, 1e-6f, 0, 0, 0, NULL},
    /* Qwen3.6-27B's shape cut to 8 of its 64 layers (--layers gives more) */
    {"qwen3.6-27b", "qwen35", 8, 5120, 24, 4, 256, 17408, 248320, 262144, 0, 0, 0, 0, false, 1e7f, 1e-6f, 0, 0, 0, NULL},
    {"tiny-qwen35", "qwen35", 4, 128, 4, 2, 64, 256, 32000, 512, 0, 0, 0, 0, false, 1e7f, 1e-6f, 0, 0, 0, NULL},
    /* Gemma 4: theta is the sliding layers' RoPE base (kinds_shapes has the full layers'); n_ff is
     * the dense unit's width, beside the experts in the MoE model; 31B cut to 6 of its 60 layers */
    {"gemma4-31b", "gemma4", 6, 5376, 32, 16, 256, 21504, 262144, 262144, 0, 0, 0, 0, true, 10000.0f, 1e-6f, 1024, 0, 30.0f, NULL},
    {"gemma4-26b-a4b", "gemma4", 30, 2816, 16, 8, 256, 2112, 262144, 262144, 128, 8, 704, 0, true, 10000.0f, 1e-6f, 1024, 0, 30.0f, NULL},
    {"gemma4-e4b", "gemma4", 42, 2560, 8, 2, 256, 10240, 262144, 131072, 0, 0, 0, 0, true, 10000.0f, 1e-6f, 512, 0, 30.0f, NULL},
    {"tiny-gemma4", "gemma4", 6, 128, 4, 2, 32, 256, 32000, 512, 0, 0, 0, 0, true, 10000.0f, 1e-6f, 8, 0, 30.0f, NULL},
    {"tiny-gemma4-moe", "gemma4", 6, 128, 4, 2, 32, 128, 32000, 512, 8, 2, 64, 0, true, 10000.0f, 1e-6f, 8, 0, 0, NULL},
    {"tiny-gemma4-ple", "gemma4", 8, 128, 4, 2, 32, 256, 32000, 512, 0, 0, 0, 0, true, 10000.0f, 1e-6f, 8, 0, 0, NULL},
    /* Qwen3.6-35B-A3B's shape cut to 4 of its 40 layers (--layers gives more) */
    {"qwen3.6-35b-a3b", "qwen35moe", 4, 2048, 16, 2, 256, 512, 248320, 262144, 256, 8, 512, 0, false, 1e7f, 1e-6f, 0, 0, 0, NULL},
    {"tiny-qwen35moe", "qwen35moe", 4, 128, 4, 2, 64, 256, 32000, 512, 8, 2, 64, 0, false, 1e7f, 1e-6f, 0, 0, 0, NULL},
};

static const kinds_shape kinds_shapes[] = {
    /* preset          period full hd  kv  theta  rotary  K=V    shared  wide   per layer */
    {"gemma4-31b", 6, 512, 4, 1e6f, 0.25f, true, 0, false, 0},
    {"gemma4-26b-a4b", 6, 512, 2, 1e6f, 0.25f, true, 0, false, 0},
    {"gemma4-e4b", 6, 512, 2, 1e6f, 0.25f, false, 18, false, 256},
    {"tiny-gemma4", 3, 64, 1, 1e6f, 0.25f, true, 0, false, 0},
    {"tiny-gemma4-moe", 3, 64, 1, 1e6f, 0.25f, true, 0, false, 0},
    {"tiny-gemma4-ple", 4, 64, 2, 1e6f, 0.25f, false, 4, true, 32},
};

/* The hybrid presets' own shape; both have more value heads than key heads, as the real models do. */
static const hybrid_shape hybrid_shapes[] = {
    /* preset            rot  K  Hk  Hv  dk  shared */
    {"qwen3.6-27b", 64, 4, 16, 48, 128, 0},
    {"tiny-qwen35", 16, 4, 2, 4, 32, 0},
    {"qwen3.6-35b-a3b", 64, 4, 16, 32, 128, 512},
    {"tiny-qwen35moe", 16, 4, 2, 4, 32, 64},
};

enum { N_PRESETS = sizeof presets / sizeof presets[0] };

const char *em_synth_preset_name(size_t index) { return index < N_PRESETS ? presets[index].name : NULL; }

/* The chat template: ChatML, as a Jinja string (the format chat templates are stored in). */
static const char chatml_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* ---- random numbers ---- */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float uniform(uint64_t *state) { return (float)((splitmix64(state) >> 40) * (2.0 / 16777216.0) - 1.0); }

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* ---- float formats ---- */

/* IEEE 754 binary16 from binary32, round to nearest even (finite inputs of moderate size only). */
static uint16_t to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7FFFFF;
    int32_t exp = (int32_t)((x >> 23) & 0xFF) - 127 + 15;
    if (exp >= 31) return (uint16_t)(sign | 0x7BFF); /* clamp to the largest finite */
    if (exp <= 0) {                                   /* subnormal or zero */
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift, rest = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)exp << 10) | (mant >> 13), rest = mant & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) half++;
    return (uint16_t)(sign | half);
}

static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7FFF + ((x >> 16) & 1); /* round to nearest even */
    return (uint16_t)(x >> 16);
}

/* ---- block formats: where the f16 scale fields sit, how the values relate to them ---- */

typedef struct block_layout {
    uint32_t type;
    uint32_t d_offset;    /* f16 super-block scale */
    int32_t dmin_offset;  /* f16 minimum scale (Q4_K), -1 = none */
} block_layout;

/* Offsets of the scale fields, as the block formats define them. */
enum { N_LAYOUTS = 4 };
static const block_layout layouts[N_LAYOUTS] = {
    {EM_TYPE_Q8_0, 0, -1},    /* { f16 d; i8 qs[32] } */
    {EM_TYPE_Q4_K, 0, 2},     /* { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] } */
    {EM_TYPE_Q6_K, 208, -1},  /* { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d } */
    {EM_TYPE_IQ3_XXS, 0, -1}, /* { f16 d; u8 qs[96] } */
};

static int layout_index(uint32_t type) {
    for (int i = 0; i < N_LAYOUTS; i++)
        if (layouts[i].type == type) return i;
    return -1;
}

/* Fills one block with random bytes and scale fields for scale `d` (Q4_K's minimum scale keeps
 * the mean near zero: E[sc·q] = 31.5·7.5 and E[m] = 31.5). */
static void random_block(uint8_t *block, const em_type_info *info, const block_layout *l, float d, uint64_t *rng) {
    for (uint32_t i = 0; i < info->block_bytes; i += 8) {
        uint64_t r = splitmix64(rng);
        uint32_t n = info->block_bytes - i < 8 ? info->block_bytes - i : 8;
        memcpy(block + i, &r, n);
    }
    if (l->type == EM_TYPE_Q8_0) {
        /* -128 is a valid int8 but no quantizer emits it, and llama.cpp's SIMD paths assume
         * |q| <= 127 (sign tricks); keep the blocks canonical. */
        for (uint32_t i = 2; i < info->block_bytes; i++)
            if (block[i] == 0x80) block[i] = 0x81;
    }
    uint16_t h = to_f16(d);
    memcpy(block + l->d_offset, &h, 2);
    if (l->dmin_offset >= 0) {
        h = to_f16(d * 7.5f);
        memcpy(block + l->dmin_offset, &h, 2);
    }
}

/* An MXFP4 block of random nibbles whose values have about the RMS `rms`: uniform nibbles have an RMS
 * of sqrt(34.25) times the block's scale 2^(e - 128) (the doubled E2M1 levels 0..12, squared and
 * averaged), so the exponent byte is the power of two nearest rms / sqrt(34.25). */
static void random_mxfp4_block(uint8_t *block, float rms, uint64_t *rng) {
    for (int i = 0; i < 16; i += 8) {
        uint64_t r = splitmix64(rng);
        memcpy(block + 1 + i, &r, 8);
    }
    const long e = 128 + lroundf(log2f(rms / sqrtf(34.25f)));
    block[0] = (uint8_t)(e < 1 ? 1 : e > 254 ? 254 : e);
}

/* Measures the RMS of dequantized random blocks with d = 1, so a wanted RMS gives d. */
static em_err calibrate(const block_layout *l, float *rms_at_unit_d) {
    const em_type_info *info = em_type_info_of(l->type);
    enum { BLOCKS = 64 };
    uint8_t *blocks = malloc((size_t)BLOCKS * info->block_bytes);
    float *values = malloc((size_t)BLOCKS * info->block_elems * sizeof(float));
    if (!blocks || !values) {
        free(blocks);
        free(values);
        return em_errorf(EM_ERR_NOMEM, "out of memory calibrating %s", info->name);
    }
    uint64_t rng = 12345;
    for (int b = 0; b < BLOCKS; b++) random_block(blocks + (size_t)b * info->block_bytes, info, l, 1.0f, &rng);
    em_err err = em_dequantize(l->type, blocks, values, (uint64_t)BLOCKS * info->block_elems);
    if (!err) {
        double sum = 0;
        for (uint64_t i = 0; i < (uint64_t)BLOCKS * info->block_elems; i++) sum += (double)values[i] * values[i];
        *rms_at_unit_d = (float)sqrt(sum / ((double)BLOCKS * info->block_elems));
        if (!(*rms_at_unit_d > 0)) err = em_errorf(EM_ERR_INTERNAL, "random %s blocks dequantize to zeros", info->name);
    }
    free(blocks);
    free(values);
    return err ? em_err_prefix(err, "calibrating random %s blocks", info->name) : NULL;
}

/* ---- the tensor list ---- */

/* INIT_PROPORTIONAL: rope_freqs of proportional RoPE, 1 for the pairs that rotate, 1e30 (no
 * rotation) for the others, as llama.cpp's converter writes them. */
typedef enum init_kind { INIT_UNIFORM, INIT_NORM, INIT_ROPE_FREQS, INIT_PROPORTIONAL } init_kind;

typedef struct tensor_plan {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3];
    uint32_t type;
    init_kind init;
    float rms;    /* uniform: RMS of the values; norm: center ± rms */
    float center; /* norm weights only */
} tensor_plan;

typedef struct synth {
    preset p;
    hybrid_shape hybrid; /* hybrid families only */
    kinds_shape kinds;   /* families with sliding and full layers of their own shapes only */
    const em_family *family;
    uint32_t weight_type, expert_type;
    uint64_t seed;
    uint32_t pooling; /* <arch>.pooling_type to write, 0: none */
    tensor_plan *tensors;
    uint32_t n_tensors, cap_tensors;
    uint8_t *buffer;
    size_t buffer_size;
    float rms_at_unit_d[N_LAYOUTS]; /* per block layout, measured before writing */
    char scaling[16];                /* none, linear, yarn, llama3 */
    float scaling_factor;
    uint32_t scaling_orig_ctx;
} synth;

/* The requested type when the row length fits its block; otherwise Q8_0, then F32 (llama.cpp's
 * quantizer falls back the same way). */
static uint32_t fit_type(uint32_t type, uint64_t cols) {
    const em_type_info *info = em_type_info_of(type);
    if (cols % info->block_elems == 0) return type;
    if (cols % 32 == 0 && info->block_elems > 1) return EM_TYPE_Q8_0;
    return EM_TYPE_F32;
}

static em_err plan(synth *s, const char *name, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                   uint32_t type, init_kind init, float rms) {
    if (s->n_tensors == s->cap_tensors) {
        uint32_t cap = s->cap_tensors ? 2 * s->cap_tensors : 256;
        tensor_plan *grown = realloc(s->tensors, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "out of memory planning tensors");
        s->tensors = grown;
        s->cap_tensors = cap;
    }
    tensor_plan *t = &s->tensors[s->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->type = n_dims == 1 ? EM_TYPE_F32 : fit_type(type, ne0);
    t->init = init;
    t->rms = rms;
    t->center = 1.0f;
    return NULL;
}

/* A Gated DeltaNet layer's mixer, named as llama.cpp's converter names it: the conv kernel {K, conv_dim},
 * dt_bias, and a = −exp(A_log) in [−1.9, −0.1] so the state decays at a moderate rate. */
static em_err plan_delta_net(synth *s, uint32_t il, float gain) {
    const hybrid_shape *p = &s->hybrid;
    const uint64_t e = s->p.n_embd, value = (uint64_t)p->ssm_heads_v * p->ssm_head_dim;
    const uint64_t conv_dim = 2 * (uint64_t)p->ssm_heads_k * p->ssm_head_dim + value;
    const float in_rms = 1.0f / sqrtf((float)e);
    char n[64];
    em_err err;
#define B(what) (snprintf(n, sizeof n, "blk.%u.%s", il, what), n)
    if ((err = plan(s, B("attn_qkv.weight"), 2, e, conv_dim, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
    if ((err = plan(s, B("attn_gate.weight"), 2, e, value, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
    if ((err = plan(s, B("ssm_conv1d.weight"), 2, p->ssm_kernel, conv_dim, 1, EM_TYPE_F32, INIT_UNIFORM, 0.5f))) return err;
    if ((err = plan(s, B("ssm_dt.bias"), 1, p->ssm_heads_v, 1, 1, 0, INIT_NORM, 0.5f))) return err;
    if ((err = plan(s, B("ssm_a"), 1, p->ssm_heads_v, 1, 1, 0, INIT_NORM, 0.9f))) return err;
    s->tensors[s->n_tensors - 1].center = -1.0f;
    if ((err = plan(s, B("ssm_beta.weight"), 2, e, p->ssm_heads_v, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
    if ((err = plan(s, B("ssm_alpha.weight"), 2, e, p->ssm_heads_v, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
    if ((err = plan(s, B("ssm_norm.weight"), 1, p->ssm_head_dim, 1, 1, 0, INIT_NORM, 0.1f))) return err;
    return plan(s, B("ssm_out.weight"), 2, value, e, 1, s->weight_type, INIT_UNIFORM, gain / sqrtf((float)value));
#undef B
}

/* Whether layer il of a family with sliding and full layers is full: every period-th, and the last. */
static bool layer_full(const synth *s, uint32_t il) {
    return (il + 1) % s->kinds.period == 0 || il + 1 == s->p.n_layer;
}

/* A norm weight centered on `center`. */
static em_err plan_norm(synth *s, const char *name, uint64_t width, float center) {
    em_err err = plan(s, name, 1, width, 1, 1, 0, INIT_NORM, 0.1f * center);
    if (!err) s->tensors[s->n_tensors - 1].center = center;
    return err;
}

/* The tensors of a family with sliding and full layers of their own shapes (Gemma 4, as llama.cpp's
 * converter names them): per layer its attention (no K and V in a layer that shares KV, no V in a
 * full layer with K = V), the post-norms, the dense unit, the experts beside it with their norms,
 * the router's scale and the experts' factors, the per-layer input's gate, projection and norm, and
 * the layer's output factor; the rope_freqs of proportional RoPE and the per-layer input tables. */
static em_err plan_kinds(synth *s) {
    const preset *p = &s->p;
    const kinds_shape *k = &s->kinds;
    const uint64_t e = p->n_embd, per_layer = k->per_layer, all = per_layer * p->n_layer;
    const float in_rms = 1.0f / sqrtf((float)e), gain = 16.0f, post_norm_gain = 8.0f;
    char n[64];
    em_err err;
    if ((err = plan(s, "rope_freqs.weight", 1, k->full_head_dim / 2, 1, 1, 0, INIT_PROPORTIONAL, 0))) return err;
    if ((err = plan(s, "token_embd.weight", 2, e, p->n_vocab, 1, s->weight_type, INIT_UNIFORM, 4.0f * in_rms))) return err;
    if (per_layer) {
        if ((err = plan(s, "per_layer_token_embd.weight", 2, all, p->n_vocab, 1, s->weight_type, INIT_UNIFORM, 0.5f)))
            return err;
        if ((err = plan(s, "per_layer_model_proj.weight", 2, e, all, 1, s->weight_type, INIT_UNIFORM, 1.0f))) return err;
        if ((err = plan_norm(s, "per_layer_proj_norm.weight", per_layer, 1.0f))) return err;
    }
    for (uint32_t il = 0; il < p->n_layer; il++) {
#define B(what) (snprintf(n, sizeof n, "blk.%u.%s", il, what), n)
        const bool full = layer_full(s, il), shared = il >= p->n_layer - k->shared_kv;
        const uint64_t hd = full ? k->full_head_dim : p->head_dim, q = (uint64_t)p->n_head * hd;
        const uint64_t kv = (full ? k->full_kv_heads : p->n_head_kv) * hd;
        const uint64_t ff = k->double_wide && shared ? 2 * (uint64_t)p->n_ff : p->n_ff;
        if ((err = plan_norm(s, B("attn_norm.weight"), e, 1.0f))) return err;
        if ((err = plan(s, B("attn_q.weight"), 2, e, q, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
        if ((err = plan_norm(s, B("attn_q_norm.weight"), hd, 1.0f))) return err;
        if (!shared) {
            if ((err = plan(s, B("attn_k.weight"), 2, e, kv, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
            if (!(full && k->values_from_keys) &&
                (err = plan(s, B("attn_v.weight"), 2, e, kv, 1, s->weight_type, INIT_UNIFORM, in_rms)))
                return err;
            if ((err = plan_norm(s, B("attn_k_norm.weight"), hd, 1.0f))) return err;
        }
        if ((err = plan(s, B("attn_output.weight"), 2, q, e, 1, s->weight_type, INIT_UNIFORM, gain / sqrtf((float)q))))
            return err;
        if ((err = plan_norm(s, B("post_attention_norm.weight"), e, post_norm_gain))) return err;
        if ((err = plan_norm(s, B("ffn_norm.weight"), e, 1.0f))) return err;
        if ((err = plan(s, B("ffn_gate.weight"), 2, e, ff, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
        if ((err = plan(s, B("ffn_up.weight"), 2, e, ff, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
        if ((err = plan(s, B("ffn_down.weight"), 2, ff, e, 1, s->weight_type, INIT_UNIFORM, gain / sqrtf((float)ff))))
            return err;
        if ((err = plan_norm(s, B("post_ffw_norm.weight"), e, post_norm_gain))) return err;
        if (p->n_expert) {
            const uint64_t fe = p->n_ff_expert, ne = p->n_expert;
            if ((err = plan(s, B("ffn_gate_inp.weight"), 2, e, ne, 1, EM_TYPE_F32, INIT_UNIFORM, 2.0f))) return err;
            if ((err = plan_norm(s, B("ffn_gate_inp.scale"), e, 1.0f))) return err;
            /* gate and up in one stack, as the converter writes a checkpoint's gate_up_proj */
            if ((err = plan(s, B("ffn_gate_up_exps.weight"), 3, e, 2 * fe, ne, s->expert_type, INIT_UNIFORM, in_rms)))
                return err;
            if ((err = plan(s, B("ffn_down_exps.weight"), 3, fe, e, ne, s->expert_type, INIT_UNIFORM,
                            gain / sqrtf((float)fe))))
                return err;
            if ((err = plan_norm(s, B("ffn_down_exps.scale"), ne, 1.0f))) return err;
            if ((err = plan_norm(s, B("pre_ffw_norm_2.weight"), e, 1.0f))) return err;
            if ((err = plan_norm(s, B("post_ffw_norm_1.weight"), e, 1.0f))) return err;
            if ((err = plan_norm(s, B("post_ffw_norm_2.weight"), e, 1.0f))) return err;
        }
        if (per_layer) {
            if ((err = plan(s, B("inp_gate.weight"), 2, e, per_layer, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
            if ((err = plan(s, B("proj.weight"), 2, per_layer, e, 1, s->weight_type, INIT_UNIFORM,
                            1.0f / sqrtf((float)per_layer))))
                return err;
            if ((err = plan_norm(s, B("post_norm.weight"), e, post_norm_gain))) return err;
        }
        if ((err = plan_norm(s, B("layer_output_scale.weight"), 1, 1.0f))) return err;
#undef B
    }
    return plan_norm(s, "output_norm.weight", e, 1.0f);
}

static em_err plan_all(synth *s) {
    if (s->kinds.preset) return plan_kinds(s);
    const preset *p = &s->p;
    const em_family *f = s->family;
    const uint64_t e = p->n_embd, q = (uint64_t)p->n_head * p->head_dim, kv = (uint64_t)p->n_head_kv * p->head_dim;
    const float in_rms = 1.0f / sqrtf((float)e);
    /* With a tied output matrix, the current token's own embedding in the residual stream adds
     * about (embedding scale x logit RMS) / RMS(residual) standard deviations to its own logit;
     * random layers must therefore write into the residual stream with a large gain, or the model
     * repeats its input forever. Post-norms (Gemma's) set that gain through their weights. */
    const float gain = 16.0f, post_norm_gain = 64.0f;
    char n[64];
    em_err err;
    /* Logits get an RMS of about 4: wide enough that greedy decoding has no near-ties. */
    if (!strcmp(s->scaling, "llama3") &&
        (err = plan(s, "rope_freqs.weight", 1, p->head_dim / 2, 1, 1, 0, INIT_ROPE_FREQS, 0)))
        return err;
    if ((err = plan(s, "token_embd.weight", 2, e, p->n_vocab, 1, s->weight_type, INIT_UNIFORM, 4.0f * in_rms))) return err;
    for (uint32_t il = 0; il < p->n_layer; il++) {
#define B(what) (snprintf(n, sizeof n, "blk.%u.%s", il, what), n)
        const bool moe = p->n_expert > 0 && il >= p->n_dense_lead;
        if ((err = plan(s, B("attn_norm.weight"), 1, e, 1, 1, 0, INIT_NORM, 0.1f))) return err;
        if (f->hybrid != EM_HYBRID_NONE && (il + 1) % FULL_ATTENTION_INTERVAL) {
            if ((err = plan_delta_net(s, il, gain))) return err;
            goto ffn;
        }
        if ((err = plan(s, B("attn_q.weight"), 2, e, f->attn_output_gate ? 2 * q : q, 1, s->weight_type, INIT_UNIFORM,
                        in_rms)))
            return err;
        if ((err = plan(s, B("attn_k.weight"), 2, e, kv, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
        if ((err = plan(s, B("attn_v.weight"), 2, e, kv, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
        if (f->qkv_bias) {
            if ((err = plan(s, B("attn_q.bias"), 1, q, 1, 1, 0, INIT_UNIFORM, 0.1f))) return err;
            if ((err = plan(s, B("attn_k.bias"), 1, kv, 1, 1, 0, INIT_UNIFORM, 0.1f))) return err;
            if ((err = plan(s, B("attn_v.bias"), 1, kv, 1, 1, 0, INIT_UNIFORM, 0.1f))) return err;
        }
        if (f->qk_norm) {
            if ((err = plan(s, B("attn_q_norm.weight"), 1, p->head_dim, 1, 1, 0, INIT_NORM, 0.1f))) return err;
            if ((err = plan(s, B("attn_k_norm.weight"), 1, p->head_dim, 1, 1, 0, INIT_NORM, 0.1f))) return err;
        }
        if ((err = plan(s, B("attn_output.weight"), 2, q, e, 1, s->weight_type, INIT_UNIFORM, gain / sqrtf((float)q))))
            return err;
        if (f->attn_out_bias && (err = plan(s, B("attn_output.bias"), 1, e, 1, 1, 0, INIT_UNIFORM, 0.1f))) return err;
        /* sinks of about the scores' size: each takes a real share of its head's attention */
        if (f->attn_sinks && (err = plan(s, B("attn_sinks.weight"), 1, p->n_head, 1, 1, 0, INIT_UNIFORM, 1.0f)))
            return err;
        if (f->post_norms) {
            if ((err = plan(s, B("post_attention_norm.weight"), 1, e, 1, 1, 0, INIT_NORM, 0.1f * post_norm_gain)))
                return err;
            s->tensors[s->n_tensors - 1].center = post_norm_gain;
        }
    ffn:;
        char ffn_norm[48];
        snprintf(ffn_norm, sizeof ffn_norm, "%.32s.weight", f->ffn_norm_tensor ? f->ffn_norm_tensor : "ffn_norm");
        if ((err = plan(s, B(ffn_norm), 1, e, 1, 1, 0, INIT_NORM, 0.1f))) return err;
        if (!moe) {
            const uint64_t ff = p->n_ff;
            if ((err = plan(s, B("ffn_gate.weight"), 2, e, ff, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
            if ((err = plan(s, B("ffn_up.weight"), 2, e, ff, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
            if ((err = plan(s, B("ffn_down.weight"), 2, ff, e, 1, s->weight_type, INIT_UNIFORM,
                            gain / sqrtf((float)ff))))
                return err;
        } else {
            const uint64_t ff = p->n_ff_expert, ne = p->n_expert;
            /* A router RMS of 2 keeps the top-k choice clear of near-ties. */
            if ((err = plan(s, B("ffn_gate_inp.weight"), 2, e, ne, 1, EM_TYPE_F32, INIT_UNIFORM, 2.0f * in_rms)))
                return err;
            if ((err = plan(s, B("ffn_gate_exps.weight"), 3, e, ff, ne, s->expert_type, INIT_UNIFORM, in_rms)))
                return err;
            if ((err = plan(s, B("ffn_up_exps.weight"), 3, e, ff, ne, s->expert_type, INIT_UNIFORM, in_rms))) return err;
            if ((err = plan(s, B("ffn_down_exps.weight"), 3, ff, e, ne, s->expert_type, INIT_UNIFORM,
                            gain / sqrtf((float)ff))))
                return err;
            if (s->hybrid.n_ff_shared) {
                const uint64_t fs = s->hybrid.n_ff_shared;
                if ((err = plan(s, B("ffn_gate_shexp.weight"), 2, e, fs, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
                if ((err = plan(s, B("ffn_up_shexp.weight"), 2, e, fs, 1, s->weight_type, INIT_UNIFORM, in_rms))) return err;
                if ((err = plan(s, B("ffn_down_shexp.weight"), 2, fs, e, 1, s->weight_type, INIT_UNIFORM,
                                gain / sqrtf((float)fs))))
                    return err;
                /* its gate's logit of RMS 2: σ spread over (0, 1) */
                if (f->shared_expert_gate &&
                    (err = plan(s, B("ffn_gate_inp_shexp.weight"), 1, e, 1, 1, 0, INIT_UNIFORM, 2.0f * in_rms)))
                    return err;
            }
            if (f->expert_biases) { /* f32, as llama.cpp's converter writes them */
                if ((err = plan(s, B("ffn_gate_inp.bias"), 1, ne, 1, 1, 0, INIT_UNIFORM, 0.1f))) return err;
                if ((err = plan(s, B("ffn_gate_exps.bias"), 2, ff, ne, 1, EM_TYPE_F32, INIT_UNIFORM, 0.1f))) return err;
                if ((err = plan(s, B("ffn_up_exps.bias"), 2, ff, ne, 1, EM_TYPE_F32, INIT_UNIFORM, 0.1f))) return err;
                if ((err = plan(s, B("ffn_down_exps.bias"), 2, e, ne, 1, EM_TYPE_F32, INIT_UNIFORM, 0.1f))) return err;
            }
        }
        if (f->post_norms) {
            if ((err = plan(s, B("post_ffw_norm.weight"), 1, e, 1, 1, 0, INIT_NORM, 0.1f * post_norm_gain))) return err;
            s->tensors[s->n_tensors - 1].center = post_norm_gain;
        }
#undef B
    }
    if ((err = plan(s, "output_norm.weight", 1, e, 1, 1, 0, INIT_NORM, 0.1f))) return err;
    if (!p->tied && !f->tied_output &&
        (err = plan(s, "output.weight", 2, e, p->n_vocab, 1, s->weight_type, INIT_UNIFORM, 4.0f * in_rms)))
        return err;
    return NULL;
}

/* ---- producing a tensor's bytes ---- */

/* Llama 3's RoPE scaling as one divisor per frequency (Meta's reference, low_freq_factor 1,
 * high_freq_factor 4): long wavelengths are divided by the factor, short ones kept, and the band
 * between is interpolated smoothly. */
static float llama3_factor(const synth *s, uint64_t i) {
    const double low_freq_factor = 1.0, high_freq_factor = 4.0, orig = s->scaling_orig_ctx;
    const double freq = pow(s->p.theta, -2.0 * (double)i / s->p.head_dim);
    const double wavelen = 2.0 * M_PI / freq;
    if (wavelen < orig / high_freq_factor) return 1.0f;
    if (wavelen > orig / low_freq_factor) return s->scaling_factor;
    const double smooth = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return (float)(1.0 / ((1.0 - smooth) / s->scaling_factor + smooth));
}

static em_err fill_tensor(void *user, uint64_t index, void *file_, uint64_t size) {
    synth *s = user;
    FILE *file = file_;
    const tensor_plan *t = &s->tensors[index];
    const em_type_info *info = em_type_info_of(t->type);
    uint64_t rng = s->seed ^ hash_name(t->name);
    splitmix64(&rng);
    const uint64_t elems = t->ne[0] * t->ne[1] * t->ne[2];
    const int li = layout_index(t->type);
    const block_layout *layout = li >= 0 ? &layouts[li] : NULL;
    /* uniform in [-a, a] has RMS a/sqrt(3) */
    const float a = t->rms * 1.7320508f;
    uint64_t written = 0;
    uint64_t done = 0;
    while (done < elems) {
        const uint64_t per_chunk = (s->buffer_size / info->block_bytes) * info->block_elems;
        const uint64_t n = elems - done < per_chunk ? elems - done : per_chunk;
        const uint64_t bytes = n / info->block_elems * info->block_bytes;
        uint8_t *out = s->buffer;
        for (uint64_t i = 0; i < n; i += info->block_elems, out += info->block_bytes) {
            if (t->type == EM_TYPE_MXFP4) {
                random_mxfp4_block(out, t->rms, &rng);
                continue;
            }
            if (layout) {
                random_block(out, info, layout, t->rms / s->rms_at_unit_d[li], &rng);
                continue;
            }
            float v = t->init == INIT_NORM ? t->center + t->rms * uniform(&rng) : a * uniform(&rng);
            if (t->init == INIT_ROPE_FREQS) v = llama3_factor(s, done + i);
            if (t->init == INIT_PROPORTIONAL)
                v = (float)(done + i) < s->kinds.full_rotary * (float)s->kinds.full_head_dim / 2.0f ? 1.0f : 1e30f;
            if (t->type == EM_TYPE_F32) memcpy(out, &v, 4);
            else {
                uint16_t h = t->type == EM_TYPE_F16 ? to_f16(v) : to_bf16(v);
                memcpy(out, &h, 2);
            }
        }
        if (fwrite(s->buffer, 1, bytes, file) != bytes)
            return em_errorf(EM_ERR_IO, "writing tensor %s failed", t->name);
        written += bytes;
        done += n;
    }
    if (written != size)
        return em_errorf(EM_ERR_INTERNAL, "tensor %s: produced %llu bytes, the writer expects %llu", t->name,
                         (unsigned long long)written, (unsigned long long)size);
    return NULL;
}

/* ---- metadata ---- */

/* The keys of a family with sliding and full layers of their own shapes, as llama.cpp's converter
 * writes Gemma 4's: per-layer KV heads (and FF widths, where the shared layers' are wider), the full
 * layers' head size and RoPE in the plain keys, the sliding layers' in the `_swa` ones, the layer
 * pattern as one bool per layer, the shared layers and the per-layer inputs' width. */
static em_err add_kinds_hparams(em_gguf_writer *w, const synth *s) {
    const preset *p = &s->p;
    const kinds_shape *k = &s->kinds;
    const char *arch = s->family->gguf_arch;
    char key[128];
    em_err err = NULL;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    int32_t *kv = malloc(p->n_layer * sizeof *kv), *ff = malloc(p->n_layer * sizeof *ff);
    bool *sliding = malloc(p->n_layer * sizeof *sliding);
    if (!kv || !ff || !sliding) err = em_errorf(EM_ERR_NOMEM, "out of memory writing the layer keys");
    for (uint32_t il = 0; !err && il < p->n_layer; il++) {
        sliding[il] = !layer_full(s, il);
        kv[il] = (int32_t)(sliding[il] ? p->n_head_kv : k->full_kv_heads);
        ff[il] = (int32_t)(k->double_wide && il >= p->n_layer - k->shared_kv ? 2 * p->n_ff : p->n_ff);
    }
    if (!err) err = em_gguf_writer_add_array(w, KEY("attention.head_count_kv"), EM_GGUF_INT32, kv, p->n_layer);
    if (!err) err = em_gguf_writer_add_array(w, KEY("feed_forward_length"), EM_GGUF_INT32, ff, p->n_layer);
    if (!err) err = em_gguf_writer_add_array(w, KEY("attention.sliding_window_pattern"), EM_GGUF_BOOL, sliding, p->n_layer);
    if (!err) err = em_gguf_writer_add_u32(w, KEY("attention.key_length"), k->full_head_dim);
    if (!err) err = em_gguf_writer_add_u32(w, KEY("attention.value_length"), k->full_head_dim);
    if (!err) err = em_gguf_writer_add_u32(w, KEY("attention.key_length_swa"), p->head_dim);
    if (!err) err = em_gguf_writer_add_u32(w, KEY("attention.value_length_swa"), p->head_dim);
    if (!err) err = em_gguf_writer_add_f32(w, KEY("rope.freq_base"), k->full_theta);
    if (!err) err = em_gguf_writer_add_f32(w, KEY("rope.freq_base_swa"), p->theta);
    if (!err) err = em_gguf_writer_add_u32(w, KEY("rope.dimension_count"), k->full_head_dim);
    if (!err) err = em_gguf_writer_add_u32(w, KEY("rope.dimension_count_swa"), p->head_dim);
    if (!err) err = em_gguf_writer_add_u32(w, KEY("attention.shared_kv_layers"), k->shared_kv);
    if (!err) err = em_gguf_writer_add_u32(w, KEY("embedding_length_per_layer_input"), k->per_layer);
#undef KEY
    free(kv);
    free(ff);
    free(sliding);
    return err;
}

static em_err add_hparams(em_gguf_writer *w, const synth *s) {
    const preset *p = &s->p;
    const em_family *f = s->family;
    const char *arch = f->gguf_arch;
    char k[128];
    em_err err;
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", arch, suffix), k)
    if ((err = em_gguf_writer_add_str(w, "general.architecture", arch))) return err;
    if ((err = em_gguf_writer_add_str(w, "general.name", p->name))) return err;
    if ((err = em_gguf_writer_add_u32(w, KEY("context_length"), p->n_ctx))) return err;
    if (s->pooling && (err = em_gguf_writer_add_u32(w, KEY("pooling_type"), s->pooling))) return err;
    if ((err = em_gguf_writer_add_u32(w, KEY("embedding_length"), p->n_embd))) return err;
    if ((err = em_gguf_writer_add_u32(w, KEY("block_count"), p->n_layer))) return err;
    if ((err = em_gguf_writer_add_u32(w, KEY("attention.head_count"), p->n_head))) return err;
    if ((err = em_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), p->eps))) return err;
    if (s->kinds.preset) {
        if ((err = add_kinds_hparams(w, s))) return err;
    } else {
        /* Without an expert width key (Mixtral), feed_forward_length is the experts' width. */
        const uint32_t n_ff = p->n_expert && !f->keys.expert_width ? p->n_ff_expert : p->n_ff;
        if ((err = em_gguf_writer_add_u32(w, KEY("feed_forward_length"), n_ff))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), p->n_head_kv))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("attention.key_length"), p->head_dim))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("attention.value_length"), p->head_dim))) return err;
        if ((err = em_gguf_writer_add_f32(w, KEY("rope.freq_base"), p->theta))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("rope.dimension_count"),
                                          s->hybrid.rope_dims ? s->hybrid.rope_dims : p->head_dim)))
            return err;
    }
    if (!strcmp(s->scaling, "linear") || !strcmp(s->scaling, "yarn")) {
        if ((err = em_gguf_writer_add_str(w, KEY("rope.scaling.type"), s->scaling))) return err;
        if ((err = em_gguf_writer_add_f32(w, KEY("rope.scaling.factor"), s->scaling_factor))) return err;
        if (!strcmp(s->scaling, "yarn") &&
            (err = em_gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), s->scaling_orig_ctx)))
            return err;
    }
    if (p->window && (err = em_gguf_writer_add_u32(w, KEY("attention.sliding_window"), p->window))) return err;
    if (p->attn_softcap > 0 && (err = em_gguf_writer_add_f32(w, KEY("attn_logit_softcapping"), p->attn_softcap)))
        return err;
    if (p->final_softcap > 0 && (err = em_gguf_writer_add_f32(w, KEY("final_logit_softcapping"), p->final_softcap)))
        return err;
    if (p->n_expert) {
        if ((err = em_gguf_writer_add_u32(w, KEY("expert_count"), p->n_expert))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("expert_used_count"), p->n_expert_used))) return err;
        if (f->keys.expert_width &&
            (err = em_gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), p->n_ff_expert)))
            return err;
        if (s->hybrid.n_ff_shared &&
            (err = em_gguf_writer_add_u32(w, KEY("expert_shared_feed_forward_length"), s->hybrid.n_ff_shared)))
            return err;
    }
    if (f->hybrid != EM_HYBRID_NONE) {
        /* Text positions are the same in every section of the multi-section RoPE, so any split of
         * the rotated pairs computes plain RoPE; llama.cpp's loader requires the key. */
        const uint32_t pairs = (s->hybrid.rope_dims ? s->hybrid.rope_dims : p->head_dim) / 2, third = (pairs + 2) / 3;
        const int32_t sections[4] = {(int32_t)third, (int32_t)third, (int32_t)(pairs - 2 * third), 0};
        if ((err = em_gguf_writer_add_array(w, KEY("rope.dimension_sections"), EM_GGUF_INT32, sections, 4))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("full_attention_interval"), FULL_ATTENTION_INTERVAL))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("ssm.conv_kernel"), s->hybrid.ssm_kernel))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("ssm.state_size"), s->hybrid.ssm_head_dim))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("ssm.group_count"), s->hybrid.ssm_heads_k))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("ssm.time_step_rank"), s->hybrid.ssm_heads_v))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("ssm.inner_size"), s->hybrid.ssm_heads_v * s->hybrid.ssm_head_dim))) return err;
    }
    if (f->keys.dense_lead_and_gating) {
        /* flint's own keys, in the style of deepseek2's: dense layers first, softmax gating (1),
         * top-k weights renormalized. */
        if ((err = em_gguf_writer_add_u32(w, KEY("leading_dense_block_count"), p->n_dense_lead))) return err;
        if ((err = em_gguf_writer_add_u32(w, KEY("expert_gating_func"), 1))) return err;
        if ((err = em_gguf_writer_add_bool(w, KEY("expert_weights_norm"), true))) return err;
    }
#undef KEY
    return NULL;
}

/* Copies tokenizer.* from the vocabulary file; pads tokens, scores and types to n_vocab. */
static em_err add_tokenizer(em_gguf_writer *w, const char *vocab_path, uint32_t n_vocab) {
    em_gguf *v;
    em_err err = em_gguf_open(vocab_path, &v);
    if (err) return em_err_prefix(err, "vocabulary for synthetic models");
    const em_gguf_kv *tokens = em_gguf_find(v, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != EM_GGUF_ARRAY || tokens->array_type != EM_GGUF_STRING) {
        em_gguf_close(v);
        return em_errorf(EM_ERR_FORMAT, "%s: no tokenizer.ggml.tokens string array", vocab_path);
    }
    const uint64_t have = tokens->array_len;
    if (have > n_vocab) {
        em_gguf_close(v);
        return em_errorf(EM_ERR_RANGE, "%s has %llu tokens, more than the preset's %u", vocab_path,
                         (unsigned long long)have, n_vocab);
    }
    for (uint64_t i = 0; i < em_gguf_kv_count(v) && !err; i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(v, i);
        if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10)) continue;
        if (em_str_eq(kv->key, "tokenizer.chat_template")) continue;
        const bool padded = em_str_eq(kv->key, "tokenizer.ggml.tokens") || em_str_eq(kv->key, "tokenizer.ggml.scores") ||
                            em_str_eq(kv->key, "tokenizer.ggml.token_type");
        if (!padded || have == n_vocab) {
            err = em_gguf_writer_copy_kv(w, kv);
            continue;
        }
        if (em_str_eq(kv->key, "tokenizer.ggml.tokens")) {
            const char **strs = malloc(n_vocab * sizeof *strs);
            uint64_t *lens = malloc(n_vocab * sizeof *lens);
            char *pad = malloc((size_t)(n_vocab - have) * 16);
            if (!strs || !lens || !pad) err = em_errorf(EM_ERR_NOMEM, "out of memory padding the vocabulary");
            for (uint64_t t = 0; !err && t < n_vocab; t++) {
                if (t < have) {
                    strs[t] = kv->strings[t].ptr;
                    lens[t] = kv->strings[t].len;
                } else {
                    char *p = pad + (t - have) * 16;
                    lens[t] = (uint64_t)snprintf(p, 16, "[PAD%llu]", (unsigned long long)t);
                    strs[t] = p;
                }
            }
            if (!err) err = em_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", strs, lens, n_vocab);
            free(strs);
            free(lens);
            free(pad);
        } else if (em_str_eq(kv->key, "tokenizer.ggml.scores")) {
            float *scores = malloc(n_vocab * sizeof *scores);
            if (!scores) err = em_errorf(EM_ERR_NOMEM, "out of memory padding the vocabulary");
            for (uint64_t t = 0; !err && t < n_vocab; t++)
                scores[t] = t < kv->array_len ? (float)em_gguf_array_float(kv, t) : -1e9f;
            if (!err) err = em_gguf_writer_add_array(w, "tokenizer.ggml.scores", EM_GGUF_FLOAT32, scores, n_vocab);
            free(scores);
        } else {
            int32_t *types = malloc(n_vocab * sizeof *types);
            if (!types) err = em_errorf(EM_ERR_NOMEM, "out of memory padding the vocabulary");
            /* token type 5 = unused, for the padding */
            for (uint64_t t = 0; !err && t < n_vocab; t++)
                types[t] = t < kv->array_len ? (int32_t)em_gguf_array_int(kv, t) : 5;
            if (!err) err = em_gguf_writer_add_array(w, "tokenizer.ggml.token_type", EM_GGUF_INT32, types, n_vocab);
            free(types);
        }
    }
    if (!err) err = em_gguf_writer_add_str(w, "tokenizer.chat_template", chatml_template);
    em_gguf_close(v);
    return err;
}

/* ---- entry point ---- */

static em_err parse_type(const char *name, uint32_t *weights, uint32_t *experts) {
    static const struct { const char *name; uint32_t w, e; } types[] = {
        {"f32", EM_TYPE_F32, EM_TYPE_F32},   {"f16", EM_TYPE_F16, EM_TYPE_F16},
        {"bf16", EM_TYPE_BF16, EM_TYPE_BF16}, {"q8_0", EM_TYPE_Q8_0, EM_TYPE_Q8_0},
        {"q4_k", EM_TYPE_Q4_K, EM_TYPE_Q4_K}, {"mix", EM_TYPE_Q6_K, EM_TYPE_IQ3_XXS},
        {"mxfp4", EM_TYPE_Q8_0, EM_TYPE_MXFP4}, /* gpt-oss as released: MXFP4 experts */
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(types[i].name, name)) {
            *weights = types[i].w;
            *experts = types[i].e;
            return NULL;
        }
    return em_errorf(EM_ERR_INVALID, "unknown type '%s' (f32, f16, bf16, q8_0, q4_k, mix, mxfp4)", name);
}

/* "none", "linear:F", "yarn:F:ORIG_CTX", "llama3:F:ORIG_CTX" */
static em_err parse_scaling(const char *text, synth *s) {
    snprintf(s->scaling, sizeof s->scaling, "none");
    if (!text || !strcmp(text, "none")) return NULL;
    char kind[16] = "";
    float factor = 0;
    unsigned orig = 0;
    int got = sscanf(text, "%15[a-z0-9]:%f:%u", kind, &factor, &orig);
    const bool linear = !strcmp(kind, "linear");
    if (got < 2 || !(factor >= 1.0f && factor <= 1024.0f) || (!linear && strcmp(kind, "yarn") && strcmp(kind, "llama3")) ||
        (!linear && (got < 3 || orig < 16)))
        return em_errorf(EM_ERR_INVALID,
                         "rope scaling '%s': expected none, linear:FACTOR, yarn:FACTOR:ORIG_CTX or llama3:FACTOR:ORIG_CTX",
                         text);
    snprintf(s->scaling, sizeof s->scaling, "%s", kind);
    s->scaling_factor = factor;
    s->scaling_orig_ctx = orig;
    return NULL;
}

em_err em_synth_write(const em_synth_options *o, const char *out_path) {
    const preset *found = NULL;
    for (size_t i = 0; i < N_PRESETS; i++)
        if (o->preset && !strcmp(presets[i].name, o->preset)) found = &presets[i];
    if (!found) return em_errorf(EM_ERR_INVALID, "unknown preset '%s'", o->preset ? o->preset : "(none)");
    synth s = {.p = *found, .family = em_family_by_name(found->family), .seed = o->seed, .pooling = o->pooling};
    if (o->pooling > 4) return em_errorf(EM_ERR_RANGE, "pooling %u is not one of GGUF's 0..4", o->pooling);
    if (!s.family) return em_errorf(EM_ERR_INTERNAL, "preset %s: no family '%s'", found->name, found->family);
    for (size_t i = 0; i < sizeof hybrid_shapes / sizeof hybrid_shapes[0]; i++)
        if (!strcmp(hybrid_shapes[i].preset, found->name)) s.hybrid = hybrid_shapes[i];
    for (size_t i = 0; i < sizeof kinds_shapes / sizeof kinds_shapes[0]; i++)
        if (!strcmp(kinds_shapes[i].preset, found->name)) s.kinds = kinds_shapes[i];
    if (s.family->swa_keys && !s.kinds.preset)
        return em_errorf(EM_ERR_INTERNAL, "preset %s: no shapes of its sliding and full layers", found->name);
    if (s.family->hybrid != EM_HYBRID_NONE && !s.hybrid.preset)
        return em_errorf(EM_ERR_INTERNAL, "preset %s: no Gated DeltaNet shape", found->name);
    em_err err = parse_type(o->type ? o->type : "f32", &s.weight_type, &s.expert_type);
    if (err) return err;
    if ((err = parse_scaling(o->rope_scaling ? o->rope_scaling : s.p.rope_scaling, &s))) return err;
    if (o->layers) {
        if (o->layers > 1024) return em_errorf(EM_ERR_RANGE, "--layers %u is out of range", o->layers);
        s.p.n_layer = o->layers;
        if (s.p.n_dense_lead > o->layers) s.p.n_dense_lead = o->layers;
        /* shared layers need an earlier layer of each kind to read from */
        if (s.kinds.shared_kv && s.kinds.shared_kv + s.kinds.period > o->layers) s.kinds.shared_kv = 0;
    }
    if (o->experts) {
        if (!s.p.n_expert) return em_errorf(EM_ERR_INVALID, "preset %s has no experts", s.p.name);
        if (o->experts > 4096) return em_errorf(EM_ERR_RANGE, "--experts %u is out of range", o->experts);
        s.p.n_expert = o->experts;
        if (s.p.n_expert_used > o->experts) s.p.n_expert_used = o->experts;
    }
    for (int i = 0; i < N_LAYOUTS; i++)
        if ((layouts[i].type == s.weight_type || layouts[i].type == s.expert_type || layouts[i].type == EM_TYPE_Q8_0) &&
            s.weight_type != EM_TYPE_F32 && s.weight_type != EM_TYPE_F16 && s.weight_type != EM_TYPE_BF16 &&
            (err = calibrate(&layouts[i], &s.rms_at_unit_d[i])))
            return err;

    em_gguf_writer *w = NULL;
    if ((err = plan_all(&s))) goto done;
    if ((err = em_gguf_writer_new(3, &w))) goto done;
    if ((err = add_hparams(w, &s))) goto done;
    if ((err = add_tokenizer(w, o->vocab_path, s.p.n_vocab))) goto done;
    for (uint32_t i = 0; i < s.n_tensors; i++) {
        const tensor_plan *t = &s.tensors[i];
        if ((err = em_gguf_writer_add_tensor(w, t->name, t->n_dims, t->ne, t->type, NULL, false))) goto done;
    }
    s.buffer_size = 4u << 20;
    s.buffer = malloc(s.buffer_size);
    if (!s.buffer) {
        err = em_errorf(EM_ERR_NOMEM, "out of memory for the write buffer");
        goto done;
    }
    err = em_gguf_writer_write_streaming(w, out_path, fill_tensor, &s);
done:
    em_gguf_writer_free(w);
    free(s.tensors);
    free(s.buffer);
    return err;
}
