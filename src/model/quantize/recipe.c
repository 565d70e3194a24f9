/*
 * Quantization recipes: which block type each tensor of a model gets.
 *
 * The rules are llama.cpp's (src/llama-quant.cpp, llama_tensor_get_type and the functions it
 * calls), restated here for the recipes Ember has quantizers for. In short:
 *  - only weights are quantized: tensors of two or more dimensions whose name ends in "weight",
 *    not norms, not the MoE router (ffn_gate_inp) and a few small tensors; the rest keep their type;
 *  - F32, F16 and BF16 recipes store every quantizable tensor in that type, with no other rule;
 *  - output.weight (and token_embd.weight when the output is tied to it) gets Q6_K, or Q8_0 when
 *    the recipe is Q8_0 or the row does not divide into the recipe's block;
 *  - attn_v (and the fused attn_qkv, attn_kv_b), ffn_down and attn_output get more bits in some
 *    recipes, some only in the "use more bits" layers: the first and last eighth of the layers and
 *    every third layer between;
 *  - models of 8 experts get Q8_0 attn_v and attn_k;
 *  - a row length the chosen block does not divide falls back along a fixed chain (Q4_K -> Q5_0,
 *    Q6_K -> Q8_0, ...), then to F16.
 * `mix` is Ember's own recipe, the one `ember synth --type mix` and the MoE benchmarks use: Q6_K
 * for every weight, IQ3_XXS for expert stacks, falling back to Q8_0, then F32, like the synthesizer.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../quant/quant.h"
#include "quantize.h"

/* The llama_ftype values of llama.cpp's include/llama.h for the recipes offered here. */
enum {
    FTYPE_ALL_F32 = 0, FTYPE_F16 = 1, FTYPE_Q4_0 = 2, FTYPE_Q4_1 = 3, FTYPE_Q8_0 = 7, FTYPE_Q5_0 = 8,
    FTYPE_Q5_1 = 9, FTYPE_Q2_K = 10, FTYPE_Q3_K_S = 11, FTYPE_Q3_K_M = 12, FTYPE_Q3_K_L = 13, FTYPE_Q4_K_S = 14,
    FTYPE_Q4_K_M = 15, FTYPE_Q5_K_S = 16, FTYPE_Q5_K_M = 17, FTYPE_Q6_K = 18, FTYPE_IQ3_XXS = 23,
    FTYPE_IQ4_NL = 25, FTYPE_IQ4_XS = 30, FTYPE_BF16 = 32, FTYPE_TQ1_0 = 36, FTYPE_TQ2_0 = 37,
    FTYPE_MXFP4_MOE = 38, FTYPE_NONE = -1,
};

struct em_recipe {
    const char *name;
    int32_t file_type;
    uint32_t default_type;
};

static const em_recipe recipes[] = {
    {"F32", FTYPE_ALL_F32, EM_TYPE_F32},     {"F16", FTYPE_F16, EM_TYPE_F16},
    {"BF16", FTYPE_BF16, EM_TYPE_BF16},      {"Q8_0", FTYPE_Q8_0, EM_TYPE_Q8_0},
    {"Q6_K", FTYPE_Q6_K, EM_TYPE_Q6_K},      {"Q5_K_M", FTYPE_Q5_K_M, EM_TYPE_Q5_K},
    {"Q5_K_S", FTYPE_Q5_K_S, EM_TYPE_Q5_K},  {"Q5_1", FTYPE_Q5_1, EM_TYPE_Q5_1},
    {"Q5_0", FTYPE_Q5_0, EM_TYPE_Q5_0},      {"Q4_K_M", FTYPE_Q4_K_M, EM_TYPE_Q4_K},
    {"Q4_K_S", FTYPE_Q4_K_S, EM_TYPE_Q4_K},  {"Q4_1", FTYPE_Q4_1, EM_TYPE_Q4_1},
    {"Q4_0", FTYPE_Q4_0, EM_TYPE_Q4_0},      {"IQ4_NL", FTYPE_IQ4_NL, EM_TYPE_IQ4_NL},
    {"IQ4_XS", FTYPE_IQ4_XS, EM_TYPE_IQ4_XS}, {"Q3_K_L", FTYPE_Q3_K_L, EM_TYPE_Q3_K},
    {"Q3_K_M", FTYPE_Q3_K_M, EM_TYPE_Q3_K},  {"Q3_K_S", FTYPE_Q3_K_S, EM_TYPE_Q3_K},
    {"IQ3_XXS", FTYPE_IQ3_XXS, EM_TYPE_IQ3_XXS}, {"Q2_K", FTYPE_Q2_K, EM_TYPE_Q2_K},
    {"TQ2_0", FTYPE_TQ2_0, EM_TYPE_TQ2_0},   {"TQ1_0", FTYPE_TQ1_0, EM_TYPE_TQ1_0},
    {"MXFP4_MOE", FTYPE_MXFP4_MOE, EM_TYPE_MXFP4}, {"mix", FTYPE_NONE, EM_TYPE_Q6_K},
};

/* llama-quantize's aliases: the name of a K-format alone means its _M recipe. */
static const struct {
    const char *alias, *name;
} aliases[] = {{"Q3_K", "Q3_K_M"}, {"Q4_K", "Q4_K_M"}, {"Q5_K", "Q5_K_M"}};

static bool same_name(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return false;
    return *a == *b;
}

const char *em_recipe_names(void) {
    return "F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_1, Q5_0, Q4_K_M, Q4_K_S, Q4_1, Q4_0, IQ4_NL, IQ4_XS, "
           "Q3_K_L, Q3_K_M, Q3_K_S, IQ3_XXS, Q2_K, TQ2_0, TQ1_0, MXFP4_MOE, mix (and Q5_K, Q4_K, Q3_K for the _M "
           "recipes)";
}

em_err em_recipe_find(const char *name, const em_recipe **out) {
    *out = NULL;
    if (!name) return em_errorf(EM_ERR_INVALID, "no quantization type given (one of %s)", em_recipe_names());
    const char *canonical = name;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (same_name(name, aliases[i].alias)) canonical = aliases[i].name;
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++)
        if (same_name(canonical, recipes[i].name)) {
            *out = &recipes[i];
            return NULL;
        }
    return em_errorf(EM_ERR_INVALID, "unknown quantization type '%s' (valid: %s)", name, em_recipe_names());
}

const char *em_recipe_name(const em_recipe *recipe) { return recipe->name; }
int32_t em_recipe_file_type(const em_recipe *recipe) { return recipe->file_type; }

const char *em_recipe_name_of_file_type(int32_t file_type) {
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++)
        if (recipes[i].file_type == file_type && file_type != FTYPE_NONE) return recipes[i].name;
    return NULL;
}

/* ---- what a tensor is ---- */

typedef enum category {
    CAT_OTHER, CAT_TOKEN_EMBD, CAT_OUTPUT, CAT_ATTN_Q, CAT_ATTN_K, CAT_ATTN_V_LIKE, CAT_ATTN_OUTPUT,
    CAT_FFN_UP, CAT_FFN_GATE, CAT_FFN_DOWN,
} category;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* By name, as llama.cpp sorts them: the substring tests match expert stacks (ffn_down_exps) and
 * shared experts (ffn_down_shexp) as their dense counterparts. attn_qkv and attn_kv_b carry V and
 * are treated as attn_v. */
static category category_of(const char *name) {
    if (!strcmp(name, "output.weight")) return CAT_OUTPUT;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "per_layer_token_embd.weight")) return CAT_TOKEN_EMBD;
    if (strstr(name, "attn_qkv.weight") || strstr(name, "attn_kv_b.weight") || strstr(name, "attn_v.weight"))
        return CAT_ATTN_V_LIKE;
    if (strstr(name, "attn_k.weight")) return CAT_ATTN_K;
    if (strstr(name, "attn_q.weight")) return CAT_ATTN_Q;
    if (strstr(name, "attn_output.weight")) return CAT_ATTN_OUTPUT;
    if (strstr(name, "ffn_up")) return CAT_FFN_UP;
    if (strstr(name, "ffn_gate")) return CAT_FFN_GATE;
    if (strstr(name, "ffn_down")) return CAT_FFN_DOWN;
    return CAT_OTHER;
}

/* Dimensions as llama.cpp counts them: trailing sizes of 1 do not count. */
static int dims_of(const em_recipe_tensor *t) {
    int n = 1;
    for (int d = 1; d < 4; d++)
        if (t->ne[d] > 1) n = d + 1;
    return n;
}

/* Whether the tensor is quantized at all: weights of two or more dimensions, except norms, the MoE
 * router and small tensors llama.cpp keeps as they are. */
static bool quantizable(const em_recipe_tensor *t) {
    static const char *const kept[] = {"_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup",
                                       "laurel", "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight",
                                       "attn_rel_b.weight"};
    if (dims_of(t) < 2 || !ends_with(t->name, "weight")) return false;
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        if (strstr(t->name, kept[i])) return false;
    return strcmp(t->name, "position_embd.weight") && strcmp(t->name, "token_types.weight");
}

/* Layer number of "blk.N....", or -1. */
static int layer_of(const char *name) {
    int layer = -1;
    if (sscanf(name, "blk.%d.", &layer) != 1) return -1;
    return layer;
}

static uint32_t block_of(uint32_t type) { return em_type_info_of(type)->block_elems; }

/* ---- llama.cpp's rules ---- */

typedef struct state {
    const em_recipe *recipe;
    const em_recipe_model *model;
    bool tied;                /* no output.weight: token_embd is the output matrix too */
    bool falcon, is_70b;
    uint32_t gqa;             /* query heads per KV head */
    int n_attn_v, i_attn_v;   /* attn_v-like tensors: how many, how many seen */
    int i_ffn_down;
} state;

/* The first and last eighth of the layers and every third one between. */
static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static bool ftype_is(const state *s, int32_t a) { return s->recipe->file_type == a; }

static uint32_t output_type(const state *s, const em_recipe_tensor *t, uint32_t type) {
    if (ftype_is(s, FTYPE_MXFP4_MOE) || s->falcon || t->ne[0] % block_of(type)) return EM_TYPE_Q8_0;
    if (ftype_is(s, FTYPE_IQ3_XXS)) return EM_TYPE_Q5_K;
    return type == EM_TYPE_Q8_0 ? EM_TYPE_Q8_0 : EM_TYPE_Q6_K;
}

static uint32_t attn_v_type(state *s, uint32_t type) {
    const uint32_t gqa = s->gqa;
    const bool imatrix = s->model->imatrix;
    if (ftype_is(s, FTYPE_Q2_K)) type = gqa >= 4 ? EM_TYPE_Q4_K : EM_TYPE_Q3_K;
    else if (ftype_is(s, FTYPE_IQ3_XXS)) type = gqa >= 4 ? EM_TYPE_Q4_K : imatrix ? EM_TYPE_IQ3_XXS : EM_TYPE_IQ3_S;
    else if (ftype_is(s, FTYPE_Q3_K_M)) type = s->i_attn_v < 2 ? EM_TYPE_Q5_K : EM_TYPE_Q4_K;
    else if (ftype_is(s, FTYPE_Q3_K_L)) type = EM_TYPE_Q5_K;
    else if ((ftype_is(s, FTYPE_IQ4_NL) || ftype_is(s, FTYPE_IQ4_XS)) && gqa >= 4) type = EM_TYPE_Q5_K;
    else if ((ftype_is(s, FTYPE_Q4_K_M) || ftype_is(s, FTYPE_Q5_K_M)) && use_more_bits(s->i_attn_v, s->n_attn_v))
        type = EM_TYPE_Q6_K;
    else if (ftype_is(s, FTYPE_Q4_K_S) && s->i_attn_v < 4) type = EM_TYPE_Q5_K;
    /* Llama 2/3 70B: 8 query heads share each V row, so V is small and worth more bits. */
    if (s->is_70b && (type == EM_TYPE_Q3_K || type == EM_TYPE_Q4_K)) type = EM_TYPE_Q5_K;
    if (s->model->n_expert == 8) type = EM_TYPE_Q8_0;
    s->i_attn_v++;
    return type;
}

static uint32_t ffn_down_type(state *s, const char *name, uint32_t type) {
    /* Dense models count ffn_down tensors; MoE models read the layer from the name, since expert
     * tensors need not come in layer order. */
    int i = s->i_ffn_down, n = (int)s->model->n_layer;
    if (s->model->n_expert > 1) i = layer_of(name);
    const bool umb = use_more_bits(i, n), imatrix = s->model->imatrix;
    if (ftype_is(s, FTYPE_Q2_K)) type = EM_TYPE_Q3_K;
    else if (ftype_is(s, FTYPE_IQ3_XXS) && !imatrix) type = i < n / 8 ? EM_TYPE_Q4_K : EM_TYPE_Q3_K;
    else if (ftype_is(s, FTYPE_Q3_K_M))
        type = i < n / 16 ? EM_TYPE_Q5_K : !s->falcon || umb ? EM_TYPE_Q4_K : EM_TYPE_Q3_K;
    else if (ftype_is(s, FTYPE_Q3_K_L)) type = s->falcon ? EM_TYPE_Q4_K : EM_TYPE_Q5_K;
    else if (ftype_is(s, FTYPE_Q4_K_M)) {
        if (s->falcon) type = i < n / 16 ? EM_TYPE_Q6_K : umb ? EM_TYPE_Q5_K : EM_TYPE_Q4_K;
        else if (umb) type = EM_TYPE_Q6_K;
    } else if (i < n / 8 && (ftype_is(s, FTYPE_IQ4_NL) || ftype_is(s, FTYPE_IQ4_XS)) && !imatrix)
        type = EM_TYPE_Q5_K;
    else if (ftype_is(s, FTYPE_Q5_K_M) && umb) type = EM_TYPE_Q6_K;
    else if (ftype_is(s, FTYPE_Q4_K_S) && !s->falcon && i < n / 8) type = EM_TYPE_Q5_K;
    else if ((ftype_is(s, FTYPE_Q4_0) || ftype_is(s, FTYPE_Q5_0)) && imatrix && i < n / 8)
        type = ftype_is(s, FTYPE_Q4_0) ? EM_TYPE_Q4_1 : EM_TYPE_Q5_1;
    s->i_ffn_down++;
    return type;
}

static uint32_t attn_output_type(const state *s, uint32_t type) {
    if (s->falcon) return ftype_is(s, FTYPE_Q3_K_L) ? EM_TYPE_Q4_K : type;
    if (s->model->n_expert == 8) {
        static const int32_t more[] = {FTYPE_Q2_K,   FTYPE_IQ3_XXS, FTYPE_Q3_K_S, FTYPE_Q3_K_M,
                                       FTYPE_IQ4_NL, FTYPE_Q4_K_S,  FTYPE_Q4_K_M, FTYPE_IQ4_XS};
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
            if (ftype_is(s, more[i])) return EM_TYPE_Q5_K;
        return type;
    }
    if (ftype_is(s, FTYPE_Q2_K)) return EM_TYPE_Q3_K;
    if (ftype_is(s, FTYPE_IQ3_XXS)) return EM_TYPE_IQ3_S;
    if (ftype_is(s, FTYPE_Q3_K_M)) return EM_TYPE_Q4_K;
    if (ftype_is(s, FTYPE_Q3_K_L)) return EM_TYPE_Q5_K;
    return type;
}

/* llama.cpp's choice for a quantizable tensor of a block-format recipe, before the fallback. */
static uint32_t rule_type(state *s, const em_recipe_tensor *t, category cat) {
    uint32_t type = s->recipe->default_type;
    if (cat == CAT_OUTPUT || (s->tied && cat == CAT_TOKEN_EMBD)) return output_type(s, t, type);
    if (ftype_is(s, FTYPE_MXFP4_MOE)) return t->ne[2] > 1 ? EM_TYPE_MXFP4 : EM_TYPE_Q8_0;
    switch (cat) {
    case CAT_TOKEN_EMBD:
        if (ftype_is(s, FTYPE_IQ3_XXS)) return EM_TYPE_IQ3_S;
        if (ftype_is(s, FTYPE_TQ1_0) || ftype_is(s, FTYPE_TQ2_0)) return EM_TYPE_Q4_K;
        return type;
    case CAT_ATTN_V_LIKE: return attn_v_type(s, type);
    case CAT_ATTN_K:
        if (s->model->n_expert == 8) return EM_TYPE_Q8_0;
        return ftype_is(s, FTYPE_IQ3_XXS) ? EM_TYPE_IQ2_S : type;
    case CAT_ATTN_Q: return ftype_is(s, FTYPE_IQ3_XXS) ? EM_TYPE_IQ2_S : type;
    case CAT_FFN_DOWN: return ffn_down_type(s, t->name, type);
    case CAT_ATTN_OUTPUT: return attn_output_type(s, type);
    default: return type; /* ffn_gate and ffn_up change only in IQ3_XS, not offered here */
    }
}

/* A row length the block does not divide: llama.cpp's fallback to a 32-element block of about the
 * same size, then F16. (llama.cpp has no fallback for the 32-element formats and stops with an
 * error; F16 here, the end of its chain.) */
static uint32_t fall_back(uint32_t type, uint64_t row, bool *fell) {
    if (row % block_of(type) == 0) return type;
    *fell = true;
    uint32_t next = EM_TYPE_F16;
    switch (type) {
    case EM_TYPE_IQ1_S: case EM_TYPE_IQ1_M: case EM_TYPE_IQ2_XXS: case EM_TYPE_IQ2_XS: case EM_TYPE_IQ2_S:
    case EM_TYPE_IQ3_XXS: case EM_TYPE_IQ3_S: case EM_TYPE_IQ4_XS: next = EM_TYPE_IQ4_NL; break;
    case EM_TYPE_Q2_K: case EM_TYPE_Q3_K: case EM_TYPE_TQ1_0: case EM_TYPE_TQ2_0: next = EM_TYPE_Q4_0; break;
    case EM_TYPE_Q4_K: next = EM_TYPE_Q5_0; break;
    case EM_TYPE_Q5_K: next = EM_TYPE_Q5_1; break;
    case EM_TYPE_Q6_K: next = EM_TYPE_Q8_0; break;
    default: break;
    }
    return row % block_of(next) == 0 ? next : EM_TYPE_F16;
}

/* Ember has no IQ3_S or IQ2_S quantizer: the K-format of the same size (IQ3_S and Q3_K are both
 * 3.44 bits a weight) or the next larger (IQ2_S 2.5, Q2_K 2.63) stands in. */
static uint32_t stand_in(uint32_t type) {
    if (type == EM_TYPE_IQ3_S) return EM_TYPE_Q3_K;
    if (type == EM_TYPE_IQ2_S) return EM_TYPE_Q2_K;
    return type;
}

static uint32_t mix_type(const em_recipe_tensor *t, bool *fell) {
    uint32_t type = t->ne[2] > 1 ? EM_TYPE_IQ3_XXS : EM_TYPE_Q6_K;
    if (t->ne[0] % block_of(type) == 0) return type;
    *fell = true;
    return t->ne[0] % 32 == 0 ? EM_TYPE_Q8_0 : EM_TYPE_F32;
}

/* llama.cpp's order of tensors: by layer number (tensors outside layers first), then by name. */
typedef struct ordered {
    int layer;
    const char *name;
    size_t index;
} ordered;

static int llama_order(const void *a, const void *b) {
    const ordered *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return strcmp(x->name, y->name);
}

em_err em_recipe_apply(const em_recipe *recipe, const em_recipe_model *model, em_recipe_tensor *tensors,
                       size_t n_tensors) {
    state s = {.recipe = recipe, .model = model, .tied = true};
    s.falcon = model->arch && !strcmp(model->arch, "falcon");
    s.is_70b = model->arch && !strcmp(model->arch, "llama") && model->n_layer == 80 &&
               model->n_head != model->n_head_kv;
    s.gqa = model->n_head_kv ? model->n_head / model->n_head_kv : 0;
    for (size_t i = 0; i < n_tensors; i++) {
        category cat = category_of(tensors[i].name);
        if (cat == CAT_OUTPUT) s.tied = false;
        if (cat == CAT_ATTN_V_LIKE) s.n_attn_v++;
    }
    ordered *order = malloc((n_tensors ? n_tensors : 1) * sizeof *order);
    if (!order) return em_errorf(EM_ERR_NOMEM, "out of memory ordering %zu tensors", n_tensors);
    for (size_t i = 0; i < n_tensors; i++)
        order[i] = (ordered){.layer = layer_of(tensors[i].name), .name = tensors[i].name, .index = i};
    qsort(order, n_tensors, sizeof *order, llama_order);
    const bool block_recipe = em_type_info_of(recipe->default_type)->block_elems > 1;
    em_err err = NULL;
    for (size_t k = 0; k < n_tensors && !err; k++) {
        em_recipe_tensor *t = &tensors[order[k].index];
        t->fallback = false;
        if (!quantizable(t)) t->llama_type = t->source_type;
        else if (!strcmp(recipe->name, "mix")) t->llama_type = mix_type(t, &t->fallback);
        else if (!block_recipe) t->llama_type = recipe->default_type;
        else t->llama_type = fall_back(rule_type(&s, t, category_of(t->name)), t->ne[0], &t->fallback);
        t->type = stand_in(t->llama_type);
        if (!em_type_info_of(t->type))
            err = em_errorf(EM_ERR_UNSUPPORTED, "tensor %s has unknown type id %u", t->name, t->type);
    }
    free(order);
    return err;
}
