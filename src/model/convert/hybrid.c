/* The Gated DeltaNet layers of hybrid checkpoints (internal.h): Qwen3.5 / Qwen3.6 (dense and MoE),
 * as llama.cpp's converter writes them.
 *
 * A checkpoint's linear_attn.* tensors map one to one onto GGUF's attn_qkv, attn_gate, ssm_* with
 * three changes of value:
 *  - A_log is stored as a = −exp(A_log), the decay's factor the forward step uses;
 *  - the conv1d weight [conv_dim, 1, K] loses its middle dimension;
 *  - the gated output norm keeps its weight as it is, while every other norm of these families
 *    gains its + 1 (checkpoints store the w of x·(1 + w)).
 * And one of order: a checkpoint keeps the value heads grouped by the key head they read (value
 * head j reads key head j / (Hv / Hk)); GGUF qwen35 files keep them tiled (value head j reads key
 * head j mod Hk), so every tensor with a value-head axis (the v rows of in_proj_qkv and of the conv
 * weight, z, b, a, dt_bias, A_log, and the input columns of out_proj) is reordered: GGUF head
 * i·Hk + g holds the checkpoint's head g·(Hv / Hk) + i. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

bool em_convert_layer_is_linear(const em_hf_config *c, uint32_t il) {
    if (c->layer_linear) return c->layer_linear[il];
    if (!c->linear_key_heads) return false;
    const uint32_t interval = c->full_attention_interval ? c->full_attention_interval : 4;
    return (il + 1) % interval != 0;
}

size_t em_convert_delta_net_tensors(const em_family *f, const em_hf_config *c, delta_net_tensor *out) {
    const uint64_t e = c->n_embd, hk = c->linear_key_heads, hv = c->linear_value_heads;
    const uint64_t dk = c->linear_key_head_dim, dv = c->linear_value_head_dim, kernel = c->linear_conv_kernel;
    const uint64_t keys = hk * dk, values = hv * dv, conv_dim = 2 * keys + values;
    const value_order rows = f->hybrid == EM_HYBRID_DELTA_NET_TILED ? VALUES_TILED_ROWS : VALUES_AS_STORED;
    const value_order columns = f->hybrid == EM_HYBRID_DELTA_NET_TILED ? VALUES_TILED_COLUMNS : VALUES_AS_STORED;
    const delta_net_tensor tensors[DELTA_NET_TENSORS] = {
        {.hf = "linear_attn.in_proj_qkv.weight", .gguf = "attn_qkv.weight", .hf_dims = 2, .hf_shape = {conv_dim, e},
         .n_dims = 2, .ne = {e, conv_dim}, .values = rows, .value_first = 2 * keys, .value_head = (uint32_t)dv},
        {.hf = "linear_attn.in_proj_z.weight", .gguf = "attn_gate.weight", .hf_dims = 2, .hf_shape = {values, e},
         .n_dims = 2, .ne = {e, values}, .values = rows, .value_head = (uint32_t)dv},
        {.hf = "linear_attn.in_proj_b.weight", .gguf = "ssm_beta.weight", .hf_dims = 2, .hf_shape = {hv, e},
         .n_dims = 2, .ne = {e, hv}, .values = rows, .value_head = 1},
        {.hf = "linear_attn.in_proj_a.weight", .gguf = "ssm_alpha.weight", .hf_dims = 2, .hf_shape = {hv, e},
         .n_dims = 2, .ne = {e, hv}, .values = rows, .value_head = 1},
        {.hf = "linear_attn.conv1d.weight", .gguf = "ssm_conv1d.weight", .hf_dims = 3,
         .hf_shape = {conv_dim, 1, kernel}, .n_dims = 2, .ne = {kernel, conv_dim}, .values = rows,
         .value_first = 2 * keys, .value_head = (uint32_t)dv},
        {.hf = "linear_attn.dt_bias", .gguf = "ssm_dt.bias", .hf_dims = 1, .hf_shape = {hv}, .n_dims = 1, .ne = {hv, 1},
         .values = columns, .value_head = 1},
        {.hf = "linear_attn.A_log", .gguf = "ssm_a", .hf_dims = 1, .hf_shape = {hv}, .n_dims = 1, .ne = {hv, 1},
         .negative_exp = true, .values = columns, .value_head = 1},
        {.hf = "linear_attn.norm.weight", .gguf = "ssm_norm.weight", .hf_dims = 1, .hf_shape = {dv}, .n_dims = 1,
         .ne = {dv, 1}, .plain_norm = true},
        {.hf = "linear_attn.out_proj.weight", .gguf = "ssm_out.weight", .hf_dims = 2, .hf_shape = {e, values},
         .n_dims = 2, .ne = {values, e}, .values = columns, .value_head = (uint32_t)dv},
    };
    memcpy(out, tensors, sizeof tensors);
    return DELTA_NET_TENSORS;
}

uint64_t em_convert_value_source(const plan_tensor *t, uint64_t i) {
    if (i < t->value_first) return i;
    const uint64_t j = i - t->value_first, head = j / t->value_head, within = j % t->value_head;
    if (head >= (uint64_t)t->value_groups * t->value_per_group) return i; /* past the value heads */
    /* GGUF head i·Hk + g is the checkpoint's head g·(Hv / Hk) + i */
    const uint64_t group = head % t->value_groups, index = head / t->value_groups;
    return t->value_first + (group * t->value_per_group + index) * t->value_head + within;
}

em_err em_convert_check_hybrid(const em_family *f, const em_hf_config *c, const char *file) {
    if (f->hybrid == EM_HYBRID_NONE) {
        if (c->layer_linear)
            return em_errorf(EM_ERR_UNSUPPORTED, "%s: layer_types has linear_attention layers, which GGUF %s has not",
                             file, f->gguf_arch);
        return NULL;
    }
    const struct {
        const char *name;
        uint32_t value;
    } fields[] = {{"linear_conv_kernel_dim", c->linear_conv_kernel}, {"linear_key_head_dim", c->linear_key_head_dim},
                  {"linear_value_head_dim", c->linear_value_head_dim}, {"linear_num_key_heads", c->linear_key_heads},
                  {"linear_num_value_heads", c->linear_value_heads}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!fields[i].value) return em_errorf(EM_ERR_NOT_FOUND, "%s: field '%s' is missing or 0", file, fields[i].name);
    if (c->linear_value_heads % c->linear_key_heads)
        return em_errorf(EM_ERR_FORMAT, "%s: linear_num_value_heads = %u is not a multiple of linear_num_key_heads = %u",
                         file, c->linear_value_heads, c->linear_key_heads);
    /* GGUF says where the attention layers are by full_attention_interval alone */
    const uint32_t interval = c->full_attention_interval ? c->full_attention_interval : 4;
    for (uint32_t il = 0; c->layer_linear && il < c->n_layer; il++)
        if (c->layer_linear[il] != ((il + 1) % interval != 0))
            return em_errorf(EM_ERR_UNSUPPORTED,
                             "%s: layer_types[%u] breaks the layout GGUF %s can say (every %u-th layer full attention)",
                             file, il, f->gguf_arch, interval);
    const double share = c->partial_rotary_factor > 0 ? c->partial_rotary_factor : 1.0;
    const uint32_t rotated = (uint32_t)(c->head_dim * share);
    if (rotated == 0 || rotated % 2)
        return em_errorf(EM_ERR_FORMAT, "%s: partial_rotary_factor %g of head_dim %u rotates %u dimensions (an even "
                         "number above 0 is needed)", file, share, c->head_dim, rotated);
    return NULL;
}

em_err em_convert_write_hybrid_metadata(const em_family *f, const em_hf_config *c, em_gguf_writer *w) {
    if (f->hybrid == EM_HYBRID_NONE) return NULL;
    char key[96];
    em_err err = NULL;
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, f->gguf_arch), key)
    const double share = c->partial_rotary_factor > 0 ? c->partial_rotary_factor : 1.0;
    /* Text positions are one number in every section of the multimodal RoPE, so the sections only
     * have to be there (llama.cpp's loader requires them); its converter's default where the
     * checkpoint gives none. */
    const int32_t sections[4] = {
        c->mrope_given ? (int32_t)c->mrope_section[0] : 11, c->mrope_given ? (int32_t)c->mrope_section[1] : 11,
        c->mrope_given ? (int32_t)c->mrope_section[2] : 10, 0};
    const uint32_t interval = c->full_attention_interval ? c->full_attention_interval : 4;
    if ((err = em_gguf_writer_add_u32(w, K("rope.dimension_count"), (uint32_t)(c->head_dim * share))) ||
        (err = em_gguf_writer_add_array(w, K("rope.dimension_sections"), EM_GGUF_INT32, sections, 4)) ||
        (err = em_gguf_writer_add_u32(w, K("full_attention_interval"), interval)) ||
        (err = em_gguf_writer_add_u32(w, K("ssm.conv_kernel"), c->linear_conv_kernel)) ||
        (err = em_gguf_writer_add_u32(w, K("ssm.state_size"), c->linear_key_head_dim)) ||
        (err = em_gguf_writer_add_u32(w, K("ssm.group_count"), c->linear_key_heads)) ||
        (err = em_gguf_writer_add_u32(w, K("ssm.time_step_rank"), c->linear_value_heads)) ||
        (err = em_gguf_writer_add_u32(w, K("ssm.inner_size"), c->linear_value_head_dim * c->linear_value_heads)))
        return err;
    if (c->n_ff_shared) err = em_gguf_writer_add_u32(w, K("expert_shared_feed_forward_length"), c->n_ff_shared);
    return err;
#undef K
}
