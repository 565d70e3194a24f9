/* `norm_imatrix MODEL.gguf OUT.gguf`: writes an importance matrix in llama-imatrix's GGUF format
 * (general.type "imatrix", NAME.in_sum2 and NAME.counts per weight) for a Llama-style model, from
 * its RMSNorm gains instead of calibration text: every column of a matrix that reads a normalized
 * hidden state (attn_q/k/v after attn_norm, ffn_gate/up after ffn_norm, output or a tied
 * token_embd after output_norm) gets importance gain[c]^2, the factor by which the norm scales
 * that column's mean squared activation (llama-imatrix measures the whole mean square, gain^2
 * times the normalized state's). attn_output and ffn_down read no norm and get no entry, so
 * `ember quantize` quantizes them unweighted. Ember has no imatrix producer; this is the honest
 * part of one that the weights alone give (test helper for tests/cli/imatrix.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

static em_err add_entry(em_gguf_writer *w, const em_gguf *model, const char *weight, const char *norm) {
    const em_gguf_tensor *wt = em_gguf_find_tensor(model, weight), *nt = em_gguf_find_tensor(model, norm);
    if (!wt || !nt) return NULL; /* not in this model */
    const uint64_t cols = nt->ne[0];
    if (wt->ne[0] != cols) return em_errorf(EM_ERR_FORMAT, "%s has %llu columns, %s %llu", weight,
                                             (unsigned long long)wt->ne[0], norm, (unsigned long long)cols);
    float *gain = malloc(cols * sizeof *gain);
    if (!gain) return em_errorf(EM_ERR_NOMEM, "out of memory");
    em_err err = em_dequantize(nt->type, nt->data, gain, cols);
    for (uint64_t c = 0; !err && c < cols; c++) gain[c] *= gain[c];
    char name[256];
    const float one = 1;
    const uint64_t sums_ne[2] = {cols, 1}, counts_ne[2] = {1, 1};
    snprintf(name, sizeof name, "%s.in_sum2", weight);
    if (!err) err = em_gguf_writer_add_tensor(w, name, 2, sums_ne, EM_TYPE_F32, gain, true);
    snprintf(name, sizeof name, "%s.counts", weight);
    if (!err) err = em_gguf_writer_add_tensor(w, name, 2, counts_ne, EM_TYPE_F32, &one, true);
    free(gain);
    return err;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: norm_imatrix MODEL.gguf OUT.gguf\n");
        return 1;
    }
    em_gguf *model;
    em_gguf_writer *w = NULL;
    em_err err = em_gguf_open(argv[1], &model);
    if (err) goto done;
    const char *datasets[] = {"rmsnorm-gains"};
    if (!(err = em_gguf_writer_new(3, &w))) err = em_gguf_writer_add_str(w, "general.type", "imatrix");
    if (!err) err = em_gguf_writer_add_str_array(w, "imatrix.datasets", datasets, NULL, 1);
    if (!err) err = em_gguf_writer_add_u32(w, "imatrix.chunk_count", 1);
    if (!err) err = em_gguf_writer_add_u32(w, "imatrix.chunk_size", 1);
    static const char *const readers[][2] = {{"attn_q", "attn_norm"}, {"attn_k", "attn_norm"},
                                             {"attn_v", "attn_norm"}, {"ffn_gate", "ffn_norm"},
                                             {"ffn_up", "ffn_norm"}};
    for (int layer = 0; !err && layer < 1024; layer++) {
        char weight[128], norm[128];
        snprintf(norm, sizeof norm, "blk.%d.attn_norm.weight", layer);
        if (!em_gguf_find_tensor(model, norm)) break;
        for (size_t k = 0; !err && k < sizeof readers / sizeof *readers; k++) {
            snprintf(weight, sizeof weight, "blk.%d.%s.weight", layer, readers[k][0]);
            snprintf(norm, sizeof norm, "blk.%d.%s.weight", layer, readers[k][1]);
            err = add_entry(w, model, weight, norm);
        }
    }
    /* tied embeddings: token_embd is the output projection too */
    const char *output = em_gguf_find_tensor(model, "output.weight") ? "output.weight" : "token_embd.weight";
    if (!err) err = add_entry(w, model, output, "output_norm.weight");
    if (!err) err = em_gguf_writer_write(w, argv[2]);
done:
    em_gguf_writer_free(w);
    if (model) em_gguf_close(model);
    if (err) {
        fprintf(stderr, "norm_imatrix: %s\n", em_err_message(err));
        em_err_free(err);
        return 1;
    }
    return 0;
}
