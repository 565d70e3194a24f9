/*
 * quantize — GGUF files rewritten in other block formats, tensor by tensor, with llama.cpp's
 * quantization recipes (`ember quantize`), and the recipes themselves, which `ember convert`
 * shares.
 *
 * Three parts:
 *  - recipe.c: the named recipes (llama.cpp's `llama-quantize` type names: Q4_K_M, Q6_K, IQ4_XS,
 *    ..., plus Ember's `mix`), each a default block type and a llama_ftype number, and the rule
 *    that picks each tensor's type from its name, shape and the model's shape: the rules of
 *    llama.cpp's llama_tensor_get_type (output and token embeddings, attn_v and ffn_down getting
 *    more bits in some layers, the experts of 8-expert models, rows a block does not divide
 *    falling back to a smaller block). The quant module knows block formats but no tensor names;
 *    tensor names are the model's knowledge, so the recipe lives here.
 *  - imatrix.c: llama.cpp's importance-matrix files (the GGUF format llama-imatrix writes, and the
 *    legacy .dat format), read and validated; quantize.c passes each tensor's values to the
 *    weighted quantizers of quant (em_quantize_rows).
 *  - quantize.c: the file rewrite. Tensors stream from the input's mapping a chunk of rows at a
 *    time (converted to f32 when needed, quantized by worker threads over rows, written), so
 *    memory stays at one chunk whatever the model's size. The output is written under a
 *    temporary name and renamed when complete (gguf.h), so an error leaves no partial file.
 *
 * What it does not own: block formats and quantizers (quant), the GGUF format (gguf), printing
 * progress (the caller's callback; the cli prints).
 *
 * Ownership: an em_imatrix owns its names and values (em_imatrix_free). Recipes are static.
 *
 * Depends on base, gguf and quant.
 */
#ifndef EMBER_QUANTIZE_H
#define EMBER_QUANTIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../base/base.h"

/* ---- recipes (recipe.c) ---- */

typedef struct em_recipe em_recipe;

/* A recipe by llama.cpp's type name (case-insensitive: "Q4_K_M", "q8_0", the aliases "Q4_K",
 * "Q5_K", "Q3_K") or "mix". The error lists the valid names. */
em_err em_recipe_find(const char *name, const em_recipe **out);

/* The canonical name ("Q4_K_M"); "mix" for mix. */
const char *em_recipe_name(const em_recipe *recipe);

/* llama.cpp's LLAMA_FTYPE number, written as general.file_type; -1 for `mix`, which has none. */
int32_t em_recipe_file_type(const em_recipe *recipe);

/* The recipe name of a general.file_type ("Q4_K_M" for 15), or NULL for a number no recipe writes. */
const char *em_recipe_name_of_file_type(int32_t file_type);

/* The valid names, comma-separated, for messages and help. */
const char *em_recipe_names(void);

/* What the rules need to know of the model (from its GGUF metadata or its config.json). */
typedef struct em_recipe_model {
    const char *arch;       /* general.architecture */
    uint32_t n_layer, n_head, n_head_kv, n_expert;
    bool imatrix;           /* importance weights are applied when quantizing (llama.cpp's has_imatrix) */
} em_recipe_model;

/* One tensor of the model: name and shape in, the chosen types out. */
typedef struct em_recipe_tensor {
    const char *name;
    uint64_t ne[4];         /* GGUF order: ne[0] = row length; unused dimensions 1 */
    uint32_t source_type;   /* its type now; kept for tensors that are not quantized */
    uint32_t llama_type;    /* out: the type llama.cpp's rules choose */
    uint32_t type;          /* out: what Ember writes: llama_type, or a stand-in of the same size
                             * where Ember has no quantizer for it (see em_recipe_apply) */
    bool fallback;          /* out: the row length forced a smaller block */
} em_recipe_tensor;

/* Chooses every tensor's type. The whole list is given at once because some rules count tensors
 * (the i-th attn_v of n), in llama.cpp's order (by layer number, then name), not in file order.
 * llama.cpp's IQ3_S and IQ2_S choices (only the IQ3_XXS recipe makes them) have no quantizer here
 * and become Q3_K and Q2_K, the K-formats of the same or the next larger size. */
em_err em_recipe_apply(const em_recipe *recipe, const em_recipe_model *model, em_recipe_tensor *tensors,
                       size_t n_tensors);

/* ---- importance matrices (imatrix.c) ---- */

typedef struct em_imatrix em_imatrix;

/* Reads a GGUF imatrix (tensors NAME.in_sum2 and NAME.counts, keys imatrix.*) or a legacy .dat
 * file. The importance of a column is its mean squared activation: in_sum2 / count, per matrix of
 * an expert stack; a matrix never counted gets 1 (llama.cpp's rule). Non-finite values are an
 * error. */
em_err em_imatrix_load(const char *path, em_imatrix **out);
void em_imatrix_free(em_imatrix *imatrix);

uint64_t em_imatrix_count(const em_imatrix *imatrix);
uint32_t em_imatrix_chunks(const em_imatrix *imatrix); /* chunks of text it was computed on (0: unknown) */

/* The importance values of the weight `name` (ne[0] * ne[2] floats: one per column of each
 * matrix), or NULL when the file has none. */
const float *em_imatrix_find(const em_imatrix *imatrix, const char *name, uint64_t *count);

/* ---- the file rewrite (quantize.c) ---- */

/* Whether a tensor was quantized with importance values. */
typedef enum em_importance_use {
    EM_IMPORTANCE_NONE,    /* no --imatrix, or the tensor was copied, not quantized */
    EM_IMPORTANCE_USED,    /* weighted by its entry in the importance matrix */
    EM_IMPORTANCE_MISSING, /* the importance matrix has no entry (of the right size) for it: unweighted */
} em_importance_use;

/* One tensor written, for a progress line. */
typedef struct em_quantize_progress {
    uint64_t index, count;  /* 1-based index of the tensor, of count */
    const char *name;
    uint32_t from, to;      /* types */
    uint32_t llama_type;    /* llama.cpp's choice, when `to` stands in for it (else equal to `to`) */
    bool fallback;          /* the row length forced a smaller block */
    uint64_t bytes_in, bytes_out;
    em_importance_use importance;
} em_quantize_progress;

typedef struct em_quantize_options {
    const char *type;           /* a recipe name (em_recipe_find) */
    const char *imatrix;        /* path, or NULL */
    bool allow_requantize;      /* quantize tensors already in a block format (not F32/F16/BF16) */
    uint32_t threads;           /* 0 = every online CPU */
    void (*progress)(void *user, const em_quantize_progress *progress); /* may be NULL */
    void *user;
} em_quantize_options;

typedef struct em_quantize_stats {
    uint64_t n_tensors, n_quantized, n_fallback, n_stand_in;
    uint64_t bytes_in, bytes_out;       /* of tensor data */
    uint64_t n_elements;                /* of all tensors */
    uint64_t imatrix_entries;           /* entries in the --imatrix file (0 without one) */
    uint64_t imatrix_matched;           /* quantized tensors it has values for (entry of the right size) */
    uint64_t imatrix_weighted;          /* those of them whose type uses the values (not Q8_0, F16, ...) */
} em_quantize_stats;

/* Rewrites the model at `in_path` (a split set: its first part) into `out_path` with the recipe
 * `options->type`. Metadata is copied unchanged except general.file_type (the recipe's
 * llama_ftype; left out for `mix`) and general.quantization_version (2), and split.* keys. With
 * an importance matrix the recipe follows llama.cpp's rules for a run with one (has_imatrix), and
 * every quantized tensor that has an entry is quantized with its importance values
 * (em_quantize_rows: llama.cpp's weighted algorithms, the same bytes llama-quantize writes for
 * Q4_0..Q5_1, Q2_K..Q6_K, IQ4_NL and IQ4_XS); a tensor without one is quantized unweighted, as in
 * llama.cpp. `stats` may be NULL. */
em_err em_quantize_gguf(const char *in_path, const char *out_path, const em_quantize_options *options,
                        em_quantize_stats *stats);

#endif
