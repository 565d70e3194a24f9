/* Checks the CUDA backend against the CPU reference on one model (run by tests/cuda/run.sh on a
 * machine with a GPU; not a ctest test, since CI has none).
 *
 *   check_cuda MODEL.gguf LABEL TYPE
 *   check_cuda MODEL.gguf LABEL TYPE --bench    (backend-only decode speed, no CPU)
 *
 * 1. prefill: a 40-token prompt, logits for every position, CUDA vs CPU;
 * 2. decode: 32 greedy steps on each backend from there: the chosen tokens must be equal and
 *    every step's logits close;
 * 3. batched = solo: three sequences run alone, then again as mixed batches (prefill chunks of
 *    some with decode tokens of others) on the CUDA backend: the logits must agree.
 * Closeness is max|cuda - cpu| / max|cpu| over each logits row: at most 2e-3 for f32 weights
 * (the CUDA KV cache is f16), 1e-2 otherwise; batched vs solo at most 1e-5.
 * Quantized weights run with an f32 KV cache on the device (EMBER_CUDA_KV=f32): the CPU rounds
 * activations to 8-bit levels before quantized dot products (and so does the CUDA backend), and
 * an f16 cache's rounding flips some of those levels, or an expert choice, which random tiny
 * models amplify beyond any tolerance. f32 and bf16 weights run with the default f16 cache.
 * Prints one line: LABEL TYPE prefill-error decode-error greedy-steps batch-error PASS|FAIL. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "model/model.h"

#define SEQS 8
#define PER_SEQ 16
#define BLOCK 16
#define PROMPT 40
#define STEPS 32

static const em_model_desc *desc;

static double row_error(const float *got, const float *want, uint32_t n) {
    double diff = 0.0, scale = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > diff || d != d) diff = d;
        if (fabs(want[i]) > scale) scale = fabs(want[i]);
    }
    return scale > 0.0 ? diff / scale : diff;
}

static int32_t argmax(const float *x, uint32_t n) {
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

/* Runs `n` tokens of one sequence starting at `pos`, logits for every token. */
static int run_seq(em_backend *b, const em_batch_seq *seqs, uint32_t s, const int32_t *tokens, uint32_t pos,
                   uint32_t n, float *logits) {
    uint32_t seq[64], p[64];
    bool want[64];
    for (uint32_t i = 0; i < n; i++) seq[i] = s, p[i] = pos + i, want[i] = true;
    em_batch batch = {n, tokens, seq, p, want, SEQS, seqs};
    em_err err = em_backend_forward(b, &batch, logits);
    if (err) {
        fprintf(stderr, "%s forward: %s\n", b->ops->name, em_err_message(err));
        em_err_free(err);
        return -1;
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Backend-only decode: a 300-token prompt in chunks of 64, then 256 greedy steps (argmax here). */
static int bench(em_backend *gpu, const char *label, const char *what) {
    enum { PROMPT_LEN = 300, DECODE = 256 };
    const uint32_t V = desc->n_vocab;
    em_batch_seq seq;
    uint32_t blocks[64];
    em_batch_fixed_tables(&seq, blocks, 1, (PROMPT_LEN + DECODE) / BLOCK + 2);
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t tokens[64];
    uint32_t sq[64] = {0}, ps[64];
    double t0 = now_s();
    for (uint32_t at = 0; at < PROMPT_LEN; at += 64) {
        uint32_t n = PROMPT_LEN - at < 64 ? PROMPT_LEN - at : 64;
        for (uint32_t i = 0; i < n; i++) tokens[i] = (int32_t)((1000 + at + i) % V), ps[i] = at + i;
        em_batch batch = {n, tokens, sq, ps, NULL, 1, &seq};
        em_err err = em_backend_forward(gpu, &batch, logits);
        if (err) return fprintf(stderr, "bench: %s\n", em_err_message(err)), 1;
    }
    double t1 = now_s();
    for (uint32_t step = 0; step < DECODE; step++) {
        tokens[0] = argmax(logits, V);
        ps[0] = PROMPT_LEN + step;
        em_batch batch = {1, tokens, sq, ps, NULL, 1, &seq};
        em_err err = em_backend_forward(gpu, &batch, logits);
        if (err) return fprintf(stderr, "bench: %s\n", em_err_message(err)), 1;
    }
    double t2 = now_s();
    printf("%-16s %-14s prefill 300: %7.1f ms   decode: %7.1f tok/s (%.3f ms/token)\n", label, what, 1e3 * (t1 - t0),
           DECODE / (t2 - t1), 1e3 * (t2 - t1) / DECODE);
    free(logits);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[4], "--bench")) {
        em_model *model = NULL;
        em_err err = em_model_load(argv[1], &model);
        if (err) return fprintf(stderr, "%s: %s\n", argv[1], em_err_message(err)), 1;
        desc = &model->desc;
        em_backend_config config = {.block_tokens = BLOCK, .kv_tokens = 4096};
        const char *modes[] = {"graphs", "no graphs"};
        for (int m = 0; m < 2; m++) {
            setenv("EMBER_CUDA_GRAPHS", m ? "0" : "1", 1);
            em_backend *gpu = NULL;
            if ((err = em_backend_cuda_new(model, &config, &gpu))) return fprintf(stderr, "%s\n", em_err_message(err)), 1;
            int rc = bench(gpu, argv[2], modes[m]);
            em_backend_free(gpu);
            if (rc) return rc;
        }
        em_model_free(model);
        return 0;
    }
    if (argc != 4) {
        fprintf(stderr, "usage: check_cuda MODEL.gguf LABEL TYPE [--bench]\n");
        return 2;
    }
    const bool float_weights = !strcmp(argv[3], "f32") || !strcmp(argv[3], "bf16") || !strcmp(argv[3], "f16");
    const double tol = strcmp(argv[3], "f32") ? 1e-2 : 2e-3;
    if (!float_weights) setenv("EMBER_CUDA_KV", "f32", 1);
    em_model *model = NULL;
    em_err err = em_model_load(argv[1], &model);
    if (err) {
        fprintf(stderr, "%s: %s\n", argv[1], em_err_message(err));
        return 1;
    }
    desc = &model->desc;
    const uint32_t V = desc->n_vocab;
    em_backend_config config = {.block_tokens = BLOCK, .kv_tokens = SEQS * PER_SEQ * BLOCK};
    em_backend *cpu = NULL, *gpu = NULL;
    if ((err = em_backend_cpu_new(model, &config, &cpu)) || (err = em_backend_cuda_new(model, &config, &gpu))) {
        fprintf(stderr, "backend: %s\n", em_err_message(err));
        return 1;
    }
    em_batch_seq seqs[SEQS];
    uint32_t blocks[SEQS * PER_SEQ];
    em_batch_fixed_tables(seqs, blocks, SEQS, PER_SEQ);
    float *a = malloc((size_t)64 * V * sizeof(float)), *c = malloc((size_t)64 * V * sizeof(float));
    float *solo = malloc((size_t)3 * 64 * V * sizeof(float));
    int32_t prompt[PROMPT];
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < PROMPT; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((rng >> 33) % V);
    }
    int failed = 0;

    /* 1. prefill */
    double prefill_err = 0.0;
    if (run_seq(cpu, seqs, 0, prompt, 0, PROMPT, c) || run_seq(gpu, seqs, 0, prompt, 0, PROMPT, a)) return 1;
    for (uint32_t r = 0; r < PROMPT; r++) prefill_err = fmax(prefill_err, row_error(a + (size_t)r * V, c + (size_t)r * V, V));

    /* 2. greedy decode, each backend on its own choices */
    double decode_err = 0.0;
    int32_t tok_cpu = argmax(c + (size_t)(PROMPT - 1) * V, V), tok_gpu = argmax(a + (size_t)(PROMPT - 1) * V, V);
    int same = 0;
    for (int step = 0; step < STEPS; step++) {
        if (tok_cpu != tok_gpu) break;
        same++;
        if (run_seq(cpu, seqs, 0, &tok_cpu, PROMPT + step, 1, c) || run_seq(gpu, seqs, 0, &tok_gpu, PROMPT + step, 1, a))
            return 1;
        decode_err = fmax(decode_err, row_error(a, c, V));
        tok_cpu = argmax(c, V);
        tok_gpu = argmax(a, V);
    }

    /* 3. batched = solo on the GPU: sequences 1..3 alone, then 4..6 mixed */
    const uint32_t len[3] = {23, 9, 17};
    for (uint32_t s = 0; s < 3; s++) {
        int32_t next = 0;
        if (run_seq(gpu, seqs, 1 + s, prompt + s, 0, len[s], solo + (size_t)s * 64 * V)) return 1;
        next = argmax(solo + ((size_t)s * 64 + len[s] - 1) * V, V);
        if (run_seq(gpu, seqs, 1 + s, &next, len[s], 1, solo + ((size_t)s * 64 + len[s]) * V)) return 1;
    }
    double batch_err = 0.0;
    {
        /* step 1: seq 4 tokens 0..9, seq 5 tokens 0..8 (all), seq 6 tokens 0..4; step 2: the rest;
         * step 3: one decode token each */
        uint32_t from[3] = {0, 0, 0}, upto1[3] = {10, 9, 5};
        for (int step = 0; step < 3; step++) {
            int32_t tk[64];
            uint32_t sq[64], ps[64], src[64], at[64];
            bool want[64];
            uint32_t n = 0;
            for (uint32_t s = 0; s < 3; s++) {
                uint32_t end = step == 0 ? upto1[s] : step == 1 ? len[s] : len[s] + 1;
                for (uint32_t p = from[s]; p < end; p++, n++) {
                    tk[n] = p < len[s] ? prompt[s + p] : argmax(solo + ((size_t)s * 64 + len[s] - 1) * V, V);
                    sq[n] = 4 + s, ps[n] = p, want[n] = true, src[n] = s, at[n] = p;
                }
                from[s] = end;
            }
            if (n == 0) continue;
            em_batch batch = {n, tk, sq, ps, want, SEQS, seqs};
            if ((err = em_backend_forward(gpu, &batch, a))) {
                fprintf(stderr, "batched forward: %s\n", em_err_message(err));
                return 1;
            }
            for (uint32_t i = 0; i < n; i++)
                batch_err = fmax(batch_err, row_error(a + (size_t)i * V, solo + ((size_t)src[i] * 64 + at[i]) * V, V));
        }
    }
    failed = !(prefill_err <= tol) || !(decode_err <= tol) || same != STEPS || !(batch_err <= 1e-5);
    printf("%-14s %-5s kv %s  prefill %.2e  decode %.2e  greedy %2d/%d  batched %.2e  %s\n", argv[2], argv[3],
           float_weights ? "f16" : "f32", prefill_err, decode_err, same, STEPS, batch_err, failed ? "FAIL" : "PASS");
    em_backend_free(gpu);
    em_backend_free(cpu);
    em_model_free(model);
    free(a);
    free(c);
    free(solo);
    return failed;
}
