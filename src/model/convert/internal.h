/* The converter's own parts (convert.c, stream.c, hybrid.c), shared inside src/model/convert only.
 *
 * A conversion is a plan: one entry per output tensor saying where its rows come from, how they are
 * transformed and in which type they are stored. convert.c reads config.json and the checkpoint
 * and makes the plan; stream.c produces each tensor's bytes from it while the GGUF writer asks for
 * them; hybrid.c knows the Gated DeltaNet layers of Qwen3.5 and Qwen3-Next: their tensors, the
 * order their value heads are stored in, and their metadata keys. */
#ifndef EMBER_CONVERT_INTERNAL_H
#define EMBER_CONVERT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "../../gguf/gguf.h"
#include "../model.h"
#include "../quantize/quantize.h"
#include "convert.h"

/* Every safetensors file of the directory. */
typedef struct checkpoint {
    em_safetensors **files;
    size_t n_files;
    size_t n_tensors;
    bool *used; /* per (file, tensor) flattened, to report leftovers */
    size_t *base; /* index of each file's first tensor in `used` */
} checkpoint;

/* How a hybrid model's value heads are rearranged on the way to GGUF (hybrid.c). */
typedef enum value_order {
    VALUES_AS_STORED,
    VALUES_TILED_ROWS,    /* rows from value_first on are value heads, written in tiled order */
    VALUES_TILED_COLUMNS, /* the same for the columns of each row (the output projection's inputs) */
} value_order;

typedef enum source_kind {
    SRC_ONE, SRC_EXPERTS, SRC_FUSED_FIRST, SRC_FUSED_SECOND, SRC_GENERATED,
    SRC_STRIDED, /* a transposed or interleaved tensor (gpt-oss's experts): see plan_tensor's strides */
    SRC_MXFP4,   /* MXFP4 blocks and scales (gpt-oss), repacked into GGML's blocks without rounding */
} source_kind;

typedef struct plan_tensor {
    char name[96];
    uint32_t n_dims;
    uint64_t ne[4];           /* GGUF order: ne[0] = row length */
    uint32_t type;
    source_kind kind;
    const em_st_tensor **src; /* SRC_ONE / fused: [1]; SRC_EXPERTS: [ne[2]] */
    uint32_t permute_heads;   /* > 0: rows are permuted within heads of ne[1] / permute_heads rows */
    bool add_one;             /* Gemma norms: stored as 1 + w */
    float *generated;         /* SRC_GENERATED values (owned) */
    /* SRC_STRIDED: element (mat, row, col) of the output is element
     * mat * mat_stride + row * row_stride + col * col_stride + first of src[0] */
    uint64_t mat_stride, row_stride, col_stride, first;
    /* SRC_MXFP4: src[0] the blocks [mat][source rows][cols / 32][16], scales the exponents
     * [mat][source rows][cols / 32]; output row r of a matrix is source row r * row_step + row_first */
    const em_st_tensor *scales;
    uint32_t row_step, row_first;
    bool negative_exp;        /* stored as −exp(x) (A_log → a) */
    /* hybrid models: value heads of value_head floats (rows or columns from value_first on), in the
     * checkpoint grouped by key head (value_per_group heads for each of value_groups key heads) */
    value_order values;
    uint64_t value_first;
    uint32_t value_head, value_groups, value_per_group;
} plan_tensor;

typedef struct plan {
    plan_tensor *t;
    size_t n, cap;
    uint64_t bytes;
} plan;

typedef struct converter {
    const char *dir;
    const char *prefix; /* of the text model's tensor names */
    const em_family *f;
    em_hf_config cfg;
    checkpoint ck;
    plan plan;
    const em_recipe *recipe; /* --type */
    float *buf;        /* conversion chunk */
    uint8_t *out;
    size_t buf_elems;
    /* SRC_STRIDED: one matrix of the source as f32, read whole, since its rows are columns */
    float *slab;
    uint64_t slab_cap, slab_start, slab_len;
    const em_st_tensor *slab_src;
} converter;

/* stream.c: the bytes of plan entry `index` (an em_gguf_writer_write_streaming callback; user is
 * the converter). */
em_err em_convert_fill(void *user, uint64_t index, void *file, uint64_t size);

/* hybrid.c */

/* A tensor of a Gated DeltaNet layer: its checkpoint name after "layers.N." and shape, its GGUF name
 * after "blk.N." and shape, and what happens to its values on the way. */
typedef struct delta_net_tensor {
    const char *hf, *gguf;
    uint32_t hf_dims;
    uint64_t hf_shape[3];
    uint32_t n_dims;
    uint64_t ne[2];
    bool negative_exp;  /* A_log */
    bool plain_norm;    /* a norm checkpoints store as w, not as the w of (1 + w) */
    value_order values;
    uint64_t value_first;
    uint32_t value_head;
} delta_net_tensor;

enum { DELTA_NET_TENSORS = 9 };

/* Whether layer il of the checkpoint is Gated DeltaNet. */
bool em_convert_layer_is_linear(const em_hf_config *c, uint32_t il);
/* The tensors of a Gated DeltaNet layer of the family's GGUF layout; their count. */
size_t em_convert_delta_net_tensors(const em_family *f, const em_hf_config *c, delta_net_tensor *out);
/* The source index (row or column) of output index i of a tensor whose value heads are reordered. */
uint64_t em_convert_value_source(const plan_tensor *t, uint64_t i);
/* config.json checks for a hybrid family: the Gated DeltaNet fields present and consistent, its
 * layers where full_attention_interval puts them (GGUF has no other layout). */
em_err em_convert_check_hybrid(const em_family *f, const em_hf_config *c, const char *file);
/* The hybrid family's GGUF keys (ssm.*, full_attention_interval, rope dimensions and sections). */
em_err em_convert_write_hybrid_metadata(const em_family *f, const em_hf_config *c, em_gguf_writer *w);

#endif
