/* Choosing a backend (backend.h): the CUDA backend when asked for or when a GPU is there (and can run
 * the model), else the CPU. */
#include <string.h>

#include "backend.h"
#ifdef EM_HAVE_CUDA
#include "cuda/cuda.h"
#endif

em_err em_backend_create(const em_model *model, const em_backend_config *config, em_backend **out) {
    *out = NULL;
    const char *device = config ? config->device : NULL;
    if (device && strcmp(device, "cpu") && strcmp(device, "cuda"))
        return em_errorf(EM_ERR_INVALID, "unknown device '%s' (cpu or cuda)", device);
    if (device && !strcmp(device, "cpu")) return em_backend_cpu_new(model, config, out);
#ifdef EM_HAVE_CUDA
    /* The CUDA backend keeps no recurrent state yet (hybrid models' Gated DeltaNet layers). */
    if (em_program_state_floats(&model->program)) {
        if (device)
            return em_errorf(EM_ERR_UNSUPPORTED, "--device cuda: the CUDA backend cannot run %s's recurrent layers yet",
                             model->desc.arch);
        em_log(EM_LOG_WARN, "%s: the CUDA backend cannot run its recurrent layers yet: using the CPU backend",
               model->desc.arch);
        return em_backend_cpu_new(model, config, out);
    }
    if (em_cuda_device_count() > 0) {
        em_err err = em_backend_cuda_new(model, config, out);
        if (!err || device) return err;
        /* Asked for nothing: a model the CUDA backend cannot run (a weight type it lacks, too
         * little device memory) still runs on the CPU. */
        em_log(EM_LOG_WARN, "%s: using the CPU backend", em_err_message(err));
        em_err_free(err);
        return em_backend_cpu_new(model, config, out);
    }
    /* Asked for CUDA without a GPU: say so, and run on the CPU rather than not at all. */
    if (device) em_log(EM_LOG_WARN, "--device cuda: no usable CUDA device (driver or GPU missing): using the CPU");
#else
    if (device) em_log(EM_LOG_WARN, "--device cuda: this build has no CUDA backend (nvcc was not found): using the CPU");
#endif
    return em_backend_cpu_new(model, config, out);
}

bool em_backend_picks_cpu(const char *device) {
    if (device && !strcmp(device, "cpu")) return true;
#ifdef EM_HAVE_CUDA
    return em_cuda_device_count() <= 0;
#else
    return true;
#endif
}

uint32_t em_batch_logits_rows(const em_batch *batch) {
    if (!batch->logits) return batch->n_tokens > 0 ? 1 : 0;
    uint32_t rows = 0;
    for (uint32_t t = 0; t < batch->n_tokens; t++) rows += batch->logits[t];
    return rows;
}

uint32_t em_batch_hidden_rows(const em_batch *batch) {
    uint32_t rows = 0;
    for (uint32_t t = 0; batch->hidden && t < batch->n_tokens; t++) rows += batch->hidden[t];
    return rows;
}

uint32_t em_backend_hidden_width(const em_model *model) {
    const em_program *p = &model->program;
    return p->n_ops ? p->ops[p->n_ops - 1].u.output.norm.width : 0;
}

/* Checked before any work, so a bad batch writes nothing (backend.h). */
em_err em_batch_validate(const em_batch *batch, const void *out, uint32_t n_vocab, const em_backend *b) {
    return em_batch_validate_picked(batch, out, n_vocab, b, 0);
}

em_err em_batch_validate_picked(const em_batch *batch, const void *out, uint32_t n_vocab, const em_backend *b,
                                uint32_t picked_rows) {
    if (batch->n_tokens == 0) return em_errorf(EM_ERR_INVALID, "empty batch");
    if (!batch->tokens || !batch->seq || !batch->pos)
        return em_errorf(EM_ERR_INVALID, "batch without tokens, sequences or positions");
    if (!out && em_batch_logits_rows(batch) > 0)
        return em_errorf(EM_ERR_INVALID, "the batch wants logits (or picked tokens) but no buffer was given");
    if (!batch->seqs || batch->n_seqs == 0) return em_errorf(EM_ERR_INVALID, "batch without block tables");
    if (batch->hidden && !b->ops->hidden_rows)
        return em_errorf(EM_ERR_UNSUPPORTED, "the %s backend does not return hidden states", b->ops->name);
    if (batch->hidden && !batch->hidden_out && em_batch_hidden_rows(batch) > 0)
        return em_errorf(EM_ERR_INVALID, "the batch wants hidden states but no buffer was given");
    for (uint32_t s = 0; s < batch->n_seqs; s++)
        for (uint32_t i = 0; i < batch->seqs[s].n_blocks; i++)
            if (batch->seqs[s].blocks[i] >= b->n_blocks)
                return em_errorf(EM_ERR_RANGE, "batch sequence %u: block %u is %u, but the pool has %u blocks", s, i,
                                 batch->seqs[s].blocks[i], b->n_blocks);
    for (uint32_t t = 0; t < batch->n_tokens; t++) {
        const int32_t tok = batch->tokens[t];
        const uint32_t seq = batch->seq[t], pos = batch->pos[t];
        if (tok < 0 && EM_TOKEN_PICKED_ROW(tok) >= picked_rows)
            return picked_rows ? em_errorf(EM_ERR_RANGE, "batch token %u: row %u of the previous step, which has %u", t,
                                           EM_TOKEN_PICKED_ROW(tok), picked_rows)
                               : em_errorf(EM_ERR_RANGE, "batch token %u: id %d is outside the vocabulary", t, tok);
        if (tok >= 0 && (uint32_t)tok >= n_vocab)
            return em_errorf(EM_ERR_RANGE, "batch token %u: id %d is outside the vocabulary of %u", t, tok, n_vocab);
        if (seq >= batch->n_seqs)
            return em_errorf(EM_ERR_RANGE, "batch token %u: sequence %u, but the batch has %u", t, seq, batch->n_seqs);
        if (pos / b->block_tokens >= batch->seqs[seq].n_blocks)
            return em_errorf(EM_ERR_RANGE, "batch token %u: position %u is beyond sequence %u's %u blocks", t, pos, seq,
                             batch->seqs[seq].n_blocks);
    }
    return NULL;
}
