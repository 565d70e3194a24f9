/*
 * greedy_tokens MODEL N TOKEN...: the CPU backend's greedy continuation of a prompt given as token
 * ids, printed as N token ids on one line; the dot-product kernels in use (em_dot_isa) go to
 * stderr as "isa: NAME". The prompt runs as one batch (the multi-row dot kernels), then one token
 * at a time (the single-row kernels). Links only the model, backend, quant and base modules, so
 * tests/arm/run.sh can cross-build it for AArch64 without Ember's other libraries, and compare its
 * tokens under emulation with this machine's.
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "model/model.h"
#include "quant/quant.h"

static int fail(const char *what, em_err err) {
    fprintf(stderr, "greedy_tokens: %s: %s\n", what, em_err_message(err));
    em_err_free(err);
    return 1;
}

/* The highest logit; the lowest id among equals. */
static int32_t argmax(const float *logits, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t v = 1; v < n; v++)
        if (logits[v] > logits[best]) best = v;
    return (int32_t)best;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: greedy_tokens MODEL N TOKEN...\n");
        return 1;
    }
    enum { BLOCK = 16, MAX_TOKENS = 256 };
    uint32_t n_prompt = (uint32_t)(argc - 3), n_new = (uint32_t)atoi(argv[2]);
    if (n_new < 1 || n_prompt + n_new > MAX_TOKENS) {
        fprintf(stderr, "greedy_tokens: the prompt and N must fit %d tokens\n", MAX_TOKENS);
        return 1;
    }
    em_model *model = NULL;
    em_err err = em_model_load(argv[1], &model);
    if (err) return fail(argv[1], err);
    uint32_t n_vocab = model->desc.n_vocab;
    em_backend_config config = {.device = "cpu", .n_threads = 1, .block_tokens = BLOCK, .kv_tokens = MAX_TOKENS};
    em_backend *backend = NULL;
    if ((err = em_backend_cpu_new(model, &config, &backend))) {
        em_model_free(model);
        return fail("backend", err);
    }
    fprintf(stderr, "isa: %s\n", em_dot_isa());
    uint32_t blocks[MAX_TOKENS / BLOCK], seq[MAX_TOKENS] = {0}, pos[MAX_TOKENS];
    em_batch_seq table;
    em_batch_fixed_tables(&table, blocks, 1, MAX_TOKENS / BLOCK);
    int32_t tokens[MAX_TOKENS];
    for (uint32_t i = 0; i < n_prompt; i++) {
        tokens[i] = atoi(argv[3 + i]);
        pos[i] = i;
    }
    float *logits = malloc((size_t)n_vocab * sizeof(float));
    int status = 0;
    uint32_t at = 0, n = n_prompt; /* the batch: tokens[at .. at + n) */
    for (uint32_t made = 0; made < n_new && !status; made++) {
        em_batch batch = {n, tokens + at, seq, pos + at, NULL, 1, &table, NULL, false, NULL, NULL};
        if ((err = em_backend_forward(backend, &batch, logits))) {
            status = fail("forward", err);
            break;
        }
        at += n;
        n = 1;
        tokens[at] = argmax(logits, n_vocab);
        pos[at] = at;
        printf("%s%d", made ? " " : "", tokens[at]);
    }
    printf("\n");
    free(logits);
    em_backend_free(backend);
    em_model_free(model);
    return status;
}
