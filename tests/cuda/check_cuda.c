/* Checks the CUDA backend against the CPU reference on one model (run by tests/cuda/run.sh on a
 * machine with a GPU; not a ctest test, since CI has none).
 *
 *   check_cuda MODEL.gguf LABEL TYPE
 *   check_cuda MODEL.gguf LABEL TYPE --bench [N]  (backend-only decode speed of N sequences at
 *                                                  once, default 1; no CPU)
 *   check_cuda MODEL.gguf LABEL TYPE --chunk CTX N (backend-only: a cold prefill of CTX tokens in
 *                                                  the engine's chunks of 2048, then a chunk of N
 *                                                  more tokens on that context, 5 times; no CPU)
 *
 * 1. prefill: a 40-token prompt, logits for every position, CUDA vs CPU;
 * 2. decode: 32 greedy steps on each backend from there: the chosen tokens must be equal and
 *    every step's logits close;
 * 3. batched = solo: three sequences run alone, then again as mixed batches (prefill chunks of
 *    some with decode tokens of others) on the CUDA backend: the logits must agree.
 * Closeness is max|cuda - cpu| / max|cpu| over each logits row. Steps 1-3 run the device with an
 * f32 KV cache (EMBER_CUDA_KV=f32) and the f32 matrix-vector kernels for every product
 * (EMBER_CUDA_GEMM=0), and must agree to 1e-4 (batched vs solo: 1e-5). The prefill is then run
 * again as the engine runs it (f16 cache, tensor-core products with f16 operands and tensor-core
 * attention for the 40-token segment) and must agree to 2e-3 for f32 weights (which keep the f32
 * products), 1e-2 otherwise; and so are 16 decode steps fed the CPU's greedy tokens, the first 8
 * as batches of three copies of the sequence (the batched decode products), to the same bounds,
 * with the decode kernel on 8-bit activations off (EMBER_CUDA_DP4A=0: "f16 act"). A served prefill
 * of LONG tokens ("long", its last LONG_ROWS positions) takes the wgmma products in the presets of
 * real shapes (with bf16 activations for BF16 weights), to the same bound.
 *
 * The CPU reference runs on the same weights decoded to f32 (em_dequantize: every stored value
 * exactly) with f32 activations, while the CPU backend's quantized dot products first round
 * activations to 8-bit levels (Q8_0 / Q8_K), and so does the device's default decode kernel for
 * quantized weights (matvec_dp4a.cu: Q8_0's levels, one scale per 32). That rounding is a step
 * function: a difference in the last bit of an activation flips a level now and then, and random
 * tiny models amplify flips into logits errors of a few percent, so a comparison with it would
 * measure chaos rather than the kernels; the strict checks above keep f32 activations. The served
 * decode with the default kernels is held to the bound above or to twice the deviation of the CPU
 * backend itself (on the stored weights, 8-bit activations) from the reference on the prompt or
 * the same steps, whichever is larger (MoE models deviate most: a rounding can change which
 * experts a token takes); a kernel that computes wrong sums lands far outside both (check_gemm
 * checks each product to 1e-2 against a double reference). The CPU backend's deviations are
 * printed ("cpu q8-act": its prefill against the device's strict one, its decode against the
 * reference).
 * 5. The persistent decode kernel (mega.cu; EMBER_CUDA_MEGA=4), where the model takes it:
 * MEGA_STEPS greedy steps of one sequence on it against the per-operation kernels with f32 / f16
 * activations (EMBER_CUDA_MEGA=0 EMBER_CUDA_DP4A=0), both with the f16 cache: every step's logits
 * within the served bound, the same tokens (a split at a near-tie, where the per-operation kernels'
 * two best logits are closer than the bound, ends the comparison and is reported, not failed); and
 * three sequences decoded alone, then again in steps of changing composition (1 -> 3 -> 2
 * sequences): every row equal to its solo run (<= 1e-6). Quantized weights again with the
 * activations rounded to 8 bits, the kernel's default for them, against the per-operation kernels'
 * default (which round them the same way): the same checks ("mega 8-bit").
 * Prints one line: LABEL TYPE, the errors and greedy steps of each check, PASS|FAIL. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "quant/quant.h"
#include "model/model.h"

#define SEQS 8
#define PER_SEQ 16
#define BLOCK 16
#define PROMPT 40
#define STEPS 32
#define SERVED_STEPS 16
#define LONG (PER_SEQ * BLOCK) /* a served prefill long enough for the wgmma products */
#define LONG_ROWS 16           /* its last positions, compared */

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

/* Runs `n` (<= LONG) tokens of one sequence starting at `pos`, logits for the tokens from index
 * `want_from` on. */
static int run_rows(em_backend *b, const em_batch_seq *seqs, uint32_t s, const int32_t *tokens, uint32_t pos,
                    uint32_t n, uint32_t want_from, float *logits) {
    uint32_t seq[LONG], p[LONG];
    bool want[LONG];
    for (uint32_t i = 0; i < n; i++) seq[i] = s, p[i] = pos + i, want[i] = i >= want_from;
    em_batch batch = {n, tokens, seq, p, want, SEQS, seqs, NULL, false, NULL, NULL};
    em_err err = em_backend_forward(b, &batch, logits);
    if (err) {
        fprintf(stderr, "%s forward: %s\n", b->ops->name, em_err_message(err));
        em_err_free(err);
        return -1;
    }
    return 0;
}

/* Runs `n` tokens of one sequence starting at `pos`, logits for every token. */
static int run_seq(em_backend *b, const em_batch_seq *seqs, uint32_t s, const int32_t *tokens, uint32_t pos,
                   uint32_t n, float *logits) {
    return run_rows(b, seqs, s, tokens, pos, n, 0, logits);
}

/* The model with every matrix decoded to f32 (owned copies, freed by free_reference). */
static em_model *make_reference(const em_model *m) {
    em_model *r = malloc(sizeof *r);
    *r = *m;
    r->parts = NULL; /* the files stay with `m` */
    r->n_parts = 0;
    r->owned = NULL;
    r->n_owned = r->cap_owned = 0;
    r->w.layers = malloc(m->desc.n_layer * sizeof *r->w.layers);
    memcpy(r->w.layers, m->w.layers, m->desc.n_layer * sizeof *r->w.layers);
    static em_weight *all[64 * 1024];
    size_t n_all = 0;
    all[n_all++] = &r->w.token_embd;
    if (m->w.output.data != m->w.token_embd.data) all[n_all++] = &r->w.output;
    for (uint32_t il = 0; il < m->desc.n_layer; il++) {
        em_layer_weights *lw = &r->w.layers[il];
        em_weight *ws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->ffn_gate, &lw->ffn_up, &lw->ffn_down,
                           &lw->gate_inp, &lw->gate_exps, &lw->up_exps, &lw->down_exps, &lw->gate_shexp,
                           &lw->up_shexp, &lw->down_shexp};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) all[n_all++] = ws[i];
    }
    for (size_t i = 0; i < n_all; i++) {
        em_weight *w = all[i];
        if (!w->data) continue;
        const uint64_t mats = w->n_mat ? w->n_mat : 1, n = w->cols * w->rows * mats;
        float *f = malloc(n * sizeof(float));
        em_err err = em_dequantize(w->type, w->data, f, n);
        if (err) {
            fprintf(stderr, "reference: %s\n", em_err_message(err));
            exit(1);
        }
        w->data = f;
        w->type = EM_TYPE_F32;
        w->row_bytes = w->cols * sizeof(float);
    }
    if (m->w.output.data == m->w.token_embd.data) r->w.output = r->w.token_embd;
    /* the copied program points at m's weights: build r's own */
    em_err err = em_model_build_program(r, &r->program);
    if (err) {
        fprintf(stderr, "reference: %s\n", em_err_message(err));
        exit(1);
    }
    return r;
}

static void free_reference(em_model *r) {
    if (r->w.output.data != r->w.token_embd.data) free((void *)r->w.output.data);
    free((void *)r->w.token_embd.data);
    for (uint32_t il = 0; il < r->desc.n_layer; il++) {
        em_layer_weights *lw = &r->w.layers[il];
        em_weight *ws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->ffn_gate, &lw->ffn_up, &lw->ffn_down,
                           &lw->gate_inp, &lw->gate_exps, &lw->up_exps, &lw->down_exps, &lw->gate_shexp,
                           &lw->up_shexp, &lw->down_shexp};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) free((void *)ws[i]->data);
    }
    em_program_free(&r->program);
    free(r->w.layers);
    free(r);
}

/* The decode as served (the engine's kernels, f16 cache): a fresh device backend prefills the
 * prompt into sequences 0-2, then is fed the CPU's greedy tokens, steps 0..7 as batches of the
 * three (the batched decode products), the rest to the first alone; the worst error against the
 * CPU's logits of those steps, or -1 on a failure. */
static double served_decode(const em_model *model, const em_backend_config *config, const em_batch_seq *seqs,
                            const int32_t *prompt, const int32_t *cpu_tokens, const float *cpu_steps, int steps) {
    const uint32_t V = desc->n_vocab;
    em_backend *g = NULL;
    em_err err = em_backend_cuda_new(model, config, &g);
    if (err) {
        fprintf(stderr, "backend: %s\n", em_err_message(err));
        return -1.0;
    }
    double worst = 0.0;
    float *h = malloc((size_t)PROMPT * V * sizeof(float));
    for (uint32_t s = 0; s < 3 && worst >= 0; s++)
        if (run_seq(g, seqs, s, prompt, 0, PROMPT, h)) worst = -1.0;
    for (int step = 0; step < steps && worst >= 0; step++) {
        const uint32_t n = step < SERVED_STEPS / 2 ? 3 : 1;
        int32_t tk[3] = {cpu_tokens[step], cpu_tokens[step], cpu_tokens[step]};
        uint32_t sq[3] = {0, 1, 2}, ps[3];
        bool want[3] = {true, true, true};
        for (uint32_t i = 0; i < 3; i++) ps[i] = PROMPT + (uint32_t)step;
        em_batch batch = {n, tk, sq, ps, want, SEQS, seqs, NULL, false, NULL, NULL};
        if ((err = em_backend_forward(g, &batch, h))) {
            fprintf(stderr, "served decode: %s\n", em_err_message(err));
            worst = -1.0;
            break;
        }
        for (uint32_t i = 0; i < n; i++) worst = fmax(worst, row_error(h + (size_t)i * V, cpu_steps + (size_t)step * V, V));
    }
    free(h);
    em_backend_free(g);
    return worst;
}

#define MEGA_STEPS 200
#define MEGA_SOLO 12

static em_backend *cuda_backend_with(const em_model *model, const em_backend_config *config, bool mega) {
    setenv("EMBER_CUDA_MEGA", mega ? "4" : "0", 1); /* steps of up to 4 sequences on the kernel, or none */
    em_backend *g = NULL;
    em_err err = em_backend_cuda_new(model, config, &g);
    unsetenv("EMBER_CUDA_MEGA");
    if (err) {
        fprintf(stderr, "backend: %s\n", em_err_message(err));
        em_err_free(err);
        return NULL;
    }
    return g;
}

/* Check 5 (the header). Returns 0 when it passed or the model does not take the kernel (*ran
 * false), 1 when it failed, -1 on an error. */
static int mega_check(const em_model *model, const em_backend_config *config, const em_batch_seq *seqs,
                      const int32_t *prompt, double tol, bool int8, bool *ran, double *err_out, int *same_out,
                      bool *tie_out, double *join_out) {
    const uint32_t V = desc->n_vocab;
    /* both with f32 / f16 activations (not 8-bit ones), or both with their defaults */
    if (!int8) setenv("EMBER_CUDA_DP4A", "0", 1); /* (read when a backend is made: set for both) */
    em_backend *gm = cuda_backend_with(model, config, true), *gp = cuda_backend_with(model, config, false);
    if (!gm || !gp) {
        unsetenv("EMBER_CUDA_DP4A");
        return -1;
    }
    /* rows for a whole prompt (run_seq returns a row per token) */
    float *a = malloc((size_t)PROMPT * V * sizeof(float)), *c = malloc((size_t)PROMPT * V * sizeof(float));
    float *solo = malloc((size_t)3 * MEGA_SOLO * V * sizeof(float));
    int rc = 0;
    *ran = false, *err_out = 0.0, *same_out = 0, *tie_out = false, *join_out = 0.0;
    if (run_seq(gm, seqs, 0, prompt, 0, PROMPT, a) || run_seq(gp, seqs, 0, prompt, 0, PROMPT, c)) rc = -1;
    const uint64_t before = em_cuda_mega_steps(gm);
    int32_t tok = argmax(c + (size_t)(PROMPT - 1) * V, V);
    for (int step = 0; step < MEGA_STEPS && rc == 0; step++) {
        if (run_seq(gm, seqs, 0, &tok, PROMPT + (uint32_t)step, 1, a) ||
            run_seq(gp, seqs, 0, &tok, PROMPT + (uint32_t)step, 1, c)) {
            rc = -1;
            break;
        }
        *err_out = fmax(*err_out, row_error(a, c, V));
        const int32_t ta = argmax(a, V), tc = argmax(c, V);
        if (ta != tc) {
            /* a near-tie of the per-operation kernels' logits, inside the bound, is no failure */
            double scale = 0.0;
            for (uint32_t i = 0; i < V; i++) scale = fmax(scale, fabs(c[i]));
            *tie_out = fabs((double)c[tc] - c[ta]) <= tol * scale;
            if (!*tie_out) rc = 1;
            break;
        }
        (*same_out)++;
        tok = tc;
    }
    *ran = em_cuda_mega_steps(gm) > before;
    if (!*ran) rc = rc < 0 ? rc : 0; /* the model does not take the kernel: nothing of it to compare */
    /* joining and leaving: sequences 1-3 alone (on gm), then on a fresh backend in steps of 1 -> 3 -> 2 */
    const uint32_t len[3] = {23, 9, 17};
    int32_t solo_tok[3][MEGA_SOLO + 1];
    for (uint32_t s = 0; s < 3 && rc == 0; s++) {
        if (run_seq(gm, seqs, 1 + s, prompt + s, 0, len[s], c)) rc = -1;
        solo_tok[s][0] = argmax(c + (size_t)(len[s] - 1) * V, V);
        for (int k = 0; k < MEGA_SOLO && rc == 0; k++) {
            float *row = solo + ((size_t)s * MEGA_SOLO + k) * V;
            if (run_seq(gm, seqs, 1 + s, &solo_tok[s][k], len[s] + (uint32_t)k, 1, row)) rc = -1;
            solo_tok[s][k + 1] = argmax(row, V);
        }
    }
    em_backend *gj = rc == 0 && *ran ? cuda_backend_with(model, config, true) : NULL;
    if (rc == 0 && !*ran) goto out;
    if (rc == 0 && !gj) rc = -1;
    for (uint32_t s = 0; s < 3 && rc == 0; s++)
        if (run_seq(gj, seqs, 1 + s, prompt + s, 0, len[s], c)) rc = -1;
    int done[3] = {0, 0, 0};
    for (int step = 0; rc == 0 && (done[0] < MEGA_SOLO || done[1] < MEGA_SOLO || done[2] < MEGA_SOLO); step++) {
        /* steps 0-3: sequence 1 alone; 4-7: all three; then 1 and 3 (2 has left), then 2 alone */
        const bool in[3] = {step < 4 || step >= 8 ? step < 16 : true, step >= 4 && (step < 8 || step >= 16),
                            step >= 4 && step < 16};
        int32_t tk[3];
        uint32_t sq[3], ps[3], who[3], n = 0;
        bool want[3] = {true, true, true};
        for (uint32_t s = 0; s < 3; s++)
            if (in[s] && done[s] < MEGA_SOLO) {
                tk[n] = solo_tok[s][done[s]], sq[n] = 1 + s, ps[n] = len[s] + (uint32_t)done[s], who[n++] = s;
            }
        if (n == 0) continue;
        em_batch batch = {n, tk, sq, ps, want, SEQS, seqs, NULL, false, NULL, NULL};
        em_err err = em_backend_forward(gj, &batch, a);
        if (err) {
            fprintf(stderr, "mega join/leave: %s\n", em_err_message(err));
            em_err_free(err);
            rc = -1;
            break;
        }
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t s = who[i];
            *join_out = fmax(*join_out, row_error(a + (size_t)i * V, solo + ((size_t)s * MEGA_SOLO + done[s]) * V, V));
            done[s]++;
        }
    }
    if (rc == 0 && *join_out > 1e-6) rc = 1;
    if (rc == 0 && *err_out > tol) rc = 1;
out:
    unsetenv("EMBER_CUDA_DP4A");
    if (gj) em_backend_free(gj);
    em_backend_free(gm);
    em_backend_free(gp);
    free(a);
    free(c);
    free(solo);
    return rc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Backend-only decode of `n_seqs` sequences at once: each a 300-token prompt in chunks of 64 (a
 * different one per sequence: identical prompts would route every token of a MoE step to the same
 * experts, far fewer than distinct conversations reach), then 256 greedy steps of one token per
 * sequence (argmax here). */
#define BENCH_MAX_SEQS 64
static int bench(em_backend *gpu, const char *label, const char *what, uint32_t n_seqs) {
    enum { PROMPT_LEN = 300, DECODE = 256, PER_SEQ_BLOCKS = (PROMPT_LEN + DECODE) / BLOCK + 2 };
    const uint32_t V = desc->n_vocab;
    em_batch_seq seqs[BENCH_MAX_SEQS];
    static uint32_t blocks[BENCH_MAX_SEQS * PER_SEQ_BLOCKS];
    em_batch_fixed_tables(seqs, blocks, n_seqs, PER_SEQ_BLOCKS);
    float *logits = malloc((size_t)64 * V * sizeof(float));
    int32_t tokens[64];
    uint32_t sq[64], ps[64];
    double t0 = now_s();
    for (uint32_t s = 0; s < n_seqs; s++)
        for (uint32_t at = 0; at < PROMPT_LEN; at += 64) {
            uint32_t n = PROMPT_LEN - at < 64 ? PROMPT_LEN - at : 64;
            for (uint32_t i = 0; i < n; i++) tokens[i] = (int32_t)((1000 + 7919 * s + at + i) % V), ps[i] = at + i, sq[i] = s;
            em_batch batch = {n, tokens, sq, ps, NULL, n_seqs, seqs, NULL, false, NULL, NULL};
            em_err err = em_backend_forward(gpu, &batch, logits + (size_t)s * V);
            if (err) return fprintf(stderr, "bench: %s\n", em_err_message(err)), 1;
        }
    double t1 = now_s();
    bool want[64];
    for (uint32_t s = 0; s < n_seqs; s++) want[s] = true;
    for (uint32_t step = 0; step < DECODE; step++) {
        for (uint32_t s = 0; s < n_seqs; s++) {
            /* after the prompt, sequence s's logits are row s (its last chunk wrote them there) */
            tokens[s] = argmax(logits + (size_t)s * V, V);
            ps[s] = PROMPT_LEN + step, sq[s] = s;
        }
        em_batch batch = {n_seqs, tokens, sq, ps, want, n_seqs, seqs, NULL, false, NULL, NULL};
        em_err err = em_backend_forward(gpu, &batch, logits);
        if (err) return fprintf(stderr, "bench: %s\n", em_err_message(err)), 1;
    }
    double t2 = now_s();
    printf("%-16s %-14s %2u sequences  prefill 300 each: %7.1f ms   decode: %7.1f tok/s (%.3f ms/step)\n", label, what,
           n_seqs, 1e3 * (t1 - t0), n_seqs * DECODE / (t2 - t1), 1e3 * (t2 - t1) / DECODE);
    free(logits);
    return 0;
}

/* A follow-up turn on a long conversation, as the server runs it: CTX tokens of one sequence
 * prefilled cold in chunks of 2048 (the engine's batch), then CHUNK_REPEATS forwards of N more
 * tokens at positions CTX.. (each one overwrites the same cache rows), logits of the last token
 * only. Forwards are counted from 0 as EMBER_CUDA_PROFILE counts them: the prefill's come first,
 * so the repeats are forwards ceil(CTX / 2048) onwards. */
enum { CHUNK_BATCH = 2048, CHUNK_REPEATS = 5 };
static int chunk_bench(em_backend *gpu, const char *label, uint32_t ctx, uint32_t n) {
    const uint32_t V = desc->n_vocab, total = ctx + n, per_seq_blocks = (total + BLOCK - 1) / BLOCK;
    em_batch_seq seq;
    uint32_t *blocks = malloc(per_seq_blocks * sizeof *blocks);
    int32_t *tokens = malloc(CHUNK_BATCH * sizeof *tokens);
    uint32_t *sq = calloc(CHUNK_BATCH, sizeof *sq), *ps = malloc(CHUNK_BATCH * sizeof *ps);
    float *logits = malloc((size_t)V * sizeof(float));
    em_batch_fixed_tables(&seq, blocks, 1, per_seq_blocks);
    int rc = 0;
    double t0 = now_s(), times[CHUNK_REPEATS];
    for (uint32_t at = 0; at < ctx && !rc; at += CHUNK_BATCH) {
        uint32_t m = ctx - at < CHUNK_BATCH ? ctx - at : CHUNK_BATCH;
        for (uint32_t i = 0; i < m; i++) tokens[i] = (int32_t)((1000 + 7919 * (at + i)) % V), ps[i] = at + i;
        em_batch batch = {m, tokens, sq, ps, NULL, 1, &seq, NULL, false, NULL, NULL};
        em_err err = em_backend_forward(gpu, &batch, logits);
        if (err) rc = 1, fprintf(stderr, "chunk: %s\n", em_err_message(err));
    }
    const double prefill_ms = 1e3 * (now_s() - t0);
    for (uint32_t r = 0; r < CHUNK_REPEATS && !rc; r++) {
        for (uint32_t i = 0; i < n; i++) tokens[i] = (int32_t)((77 + 104729 * (i + 1)) % V), ps[i] = ctx + i;
        em_batch batch = {n, tokens, sq, ps, NULL, 1, &seq, NULL, false, NULL, NULL};
        double t = now_s();
        em_err err = em_backend_forward(gpu, &batch, logits);
        if (err) rc = 1, fprintf(stderr, "chunk: %s\n", em_err_message(err));
        times[r] = 1e3 * (now_s() - t);
    }
    if (!rc) {
        for (uint32_t i = 1; i < CHUNK_REPEATS; i++) /* insertion sort for the median */
            for (uint32_t j = i; j > 0 && times[j] < times[j - 1]; j--) {
                double x = times[j];
                times[j] = times[j - 1], times[j - 1] = x;
            }
        printf("%-16s cold prefill %u tokens: %8.1f ms   then %u tokens on it: %7.2f ms (median of %d, min %.2f)\n",
               label, ctx, prefill_ms, n, times[CHUNK_REPEATS / 2], CHUNK_REPEATS, times[0]);
    }
    free(blocks), free(tokens), free(sq), free(ps), free(logits);
    return rc;
}

int main(int argc, char **argv) {
    if ((argc == 5 || argc == 6) && !strcmp(argv[4], "--bench")) {
        const long n_seqs = argc == 6 ? strtol(argv[5], NULL, 10) : 1;
        if (n_seqs < 1 || n_seqs > BENCH_MAX_SEQS) return fprintf(stderr, "--bench: 1 to %d sequences\n", BENCH_MAX_SEQS), 2;
        em_model *model = NULL;
        em_err err = em_model_load(argv[1], &model);
        if (err) return fprintf(stderr, "%s: %s\n", argv[1], em_err_message(err)), 1;
        desc = &model->desc;
        em_backend_config config = {.block_tokens = BLOCK, .kv_tokens = (uint64_t)n_seqs * 576};
        const char *modes[] = {"graphs", "no graphs"};
        for (int m = 0; m < 2; m++) {
            setenv("EMBER_CUDA_GRAPHS", m ? "0" : "1", 1);
            em_backend *gpu = NULL;
            if ((err = em_backend_cuda_new(model, &config, &gpu))) return fprintf(stderr, "%s\n", em_err_message(err)), 1;
            int rc = bench(gpu, argv[2], modes[m], (uint32_t)n_seqs);
            em_backend_free(gpu);
            if (rc) return rc;
        }
        em_model_free(model);
        return 0;
    }
    if (argc == 7 && !strcmp(argv[4], "--chunk")) {
        const long ctx = strtol(argv[5], NULL, 10), n = strtol(argv[6], NULL, 10);
        if (ctx < 1 || ctx > 1 << 20 || n < 1 || n > CHUNK_BATCH)
            return fprintf(stderr, "--chunk CTX N: CTX from 1 to 1048576, N from 1 to %d\n", CHUNK_BATCH), 2;
        em_model *model = NULL;
        em_err err = em_model_load(argv[1], &model);
        if (err) return fprintf(stderr, "%s: %s\n", argv[1], em_err_message(err)), 1;
        desc = &model->desc;
        em_backend_config config = {.block_tokens = BLOCK, .kv_tokens = (uint64_t)ctx + (uint64_t)n + BLOCK};
        em_backend *gpu = NULL;
        if ((err = em_backend_cuda_new(model, &config, &gpu))) return fprintf(stderr, "%s\n", em_err_message(err)), 1;
        int rc = chunk_bench(gpu, argv[2], (uint32_t)ctx, (uint32_t)n);
        em_backend_free(gpu);
        em_model_free(model);
        return rc;
    }
    if (argc != 4) {
        fprintf(stderr, "usage: check_cuda MODEL.gguf LABEL TYPE [--bench [N] | --chunk CTX N]\n");
        return 2;
    }
    const double tol = strcmp(argv[3], "f32") ? 1e-2 : 2e-3;
    /* The strict comparison runs with an f32 KV cache on the device; the default f16 cache is
     * checked on the prefill (f16 rounding can flip near-tied argmaxes of random models, and
     * expert choices, so greedy equality is asked of the f32 cache only). */
    setenv("EMBER_CUDA_KV", "f32", 1);
    setenv("EMBER_CUDA_GEMM", "0", 1);
    em_model *model = NULL;
    em_err err = em_model_load(argv[1], &model);
    if (err) {
        fprintf(stderr, "%s: %s\n", argv[1], em_err_message(err));
        return 1;
    }
    desc = &model->desc;
    const uint32_t V = desc->n_vocab;
    em_backend_config config = {.block_tokens = BLOCK, .kv_tokens = SEQS * PER_SEQ * BLOCK};
    em_model *reference = make_reference(model);
    em_backend *cpu = NULL, *gpu = NULL, *cpu_q8 = NULL, *gpu16 = NULL;
    if ((err = em_backend_cpu_new(reference, &config, &cpu)) || (err = em_backend_cuda_new(model, &config, &gpu)) ||
        (err = em_backend_cpu_new(model, &config, &cpu_q8))) {
        fprintf(stderr, "backend: %s\n", em_err_message(err));
        return 1;
    }
    em_batch_seq seqs[SEQS];
    uint32_t blocks[SEQS * PER_SEQ];
    em_batch_fixed_tables(seqs, blocks, SEQS, PER_SEQ);
    float *a = malloc((size_t)64 * V * sizeof(float)), *c = malloc((size_t)64 * V * sizeof(float));
    float *solo = malloc((size_t)3 * 64 * V * sizeof(float));
    int32_t prompt[PROMPT], long_prompt[LONG];
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < PROMPT + LONG; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        *(i < PROMPT ? &prompt[i] : &long_prompt[i - PROMPT]) = (int32_t)((rng >> 33) % V);
    }
    int failed = 0;

    /* 1. prefill */
    double prefill_err = 0.0;
    if (run_seq(cpu, seqs, 0, prompt, 0, PROMPT, c) || run_seq(gpu, seqs, 0, prompt, 0, PROMPT, a)) return 1;
    for (uint32_t r = 0; r < PROMPT; r++) prefill_err = fmax(prefill_err, row_error(a + (size_t)r * V, c + (size_t)r * V, V));
    float *ref = malloc((size_t)PROMPT * V * sizeof(float));
    memcpy(ref, c, (size_t)PROMPT * V * sizeof(float));

    /* 2. greedy decode, each backend on its own choices */
    double decode_err = 0.0;
    int32_t tok_cpu = argmax(c + (size_t)(PROMPT - 1) * V, V), tok_gpu = argmax(a + (size_t)(PROMPT - 1) * V, V);
    int same = 0;
    int32_t cpu_tokens[STEPS];
    float *cpu_steps = malloc((size_t)SERVED_STEPS * V * sizeof(float));
    for (int step = 0; step < STEPS; step++) {
        if (tok_cpu != tok_gpu) break;
        same++;
        if (run_seq(cpu, seqs, 0, &tok_cpu, PROMPT + step, 1, c) || run_seq(gpu, seqs, 0, &tok_gpu, PROMPT + step, 1, a))
            return 1;
        cpu_tokens[step] = tok_cpu;
        if (step < SERVED_STEPS) memcpy(cpu_steps + (size_t)step * V, c, (size_t)V * sizeof(float));
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
            em_batch batch = {n, tk, sq, ps, want, SEQS, seqs, NULL, false, NULL, NULL};
            if ((err = em_backend_forward(gpu, &batch, a))) {
                fprintf(stderr, "batched forward: %s\n", em_err_message(err));
                return 1;
            }
            for (uint32_t i = 0; i < n; i++)
                batch_err = fmax(batch_err, row_error(a + (size_t)i * V, solo + ((size_t)src[i] * 64 + at[i]) * V, V));
        }
    }
    unsetenv("EMBER_CUDA_KV");
    unsetenv("EMBER_CUDA_GEMM");
    if ((err = em_backend_cuda_new(model, &config, &gpu16))) {
        fprintf(stderr, "backend: %s\n", em_err_message(err));
        return 1;
    }
    double f16_err = 0.0;
    {
        float *h = malloc((size_t)PROMPT * V * sizeof(float));
        if (run_seq(gpu16, seqs, 0, prompt, 0, PROMPT, h)) return 1;
        for (uint32_t r = 0; r < PROMPT; r++) f16_err = fmax(f16_err, row_error(h + (size_t)r * V, ref + (size_t)r * V, V));
        free(h);
    }
    /* 4. a served prefill of LONG tokens (sequence 1 of both): the row tiles of the real-shape
     * presets then take the wgmma products (BF16 weights with bf16 activations), which 40 tokens
     * do not; the same bound */
    double long_err = 0.0;
    {
        float *h = malloc((size_t)2 * LONG_ROWS * V * sizeof(float)), *r = h + (size_t)LONG_ROWS * V;
        if (run_rows(gpu16, seqs, 1, long_prompt, 0, LONG, LONG - LONG_ROWS, h) ||
            run_rows(cpu, seqs, 1, long_prompt, 0, LONG, LONG - LONG_ROWS, r))
            return 1;
        for (uint32_t i = 0; i < LONG_ROWS; i++)
            long_err = fmax(long_err, row_error(h + (size_t)i * V, r + (size_t)i * V, V));
        free(h);
    }
    em_backend_free(gpu16);
    /* the decode as served, with the 8-bit activations of quantized weights (the default) and
     * without them (EMBER_CUDA_DP4A=0: the tensor-core and f32 kernels) */
    const int served = same < SERVED_STEPS ? same : SERVED_STEPS;
    const double served_decode_err = served_decode(model, &config, seqs, prompt, cpu_tokens, cpu_steps, served);
    /* (the per-operation kernels: with the persistent kernel, the step above took it) */
    setenv("EMBER_CUDA_DP4A", "0", 1);
    setenv("EMBER_CUDA_MEGA", "0", 1);
    const double served_f16_err = served_decode(model, &config, seqs, prompt, cpu_tokens, cpu_steps, served);
    unsetenv("EMBER_CUDA_DP4A");
    unsetenv("EMBER_CUDA_MEGA");
    if (served_decode_err < 0 || served_f16_err < 0) return 1;
    /* the CPU backend on the stored weights (8-bit activations for quantized ones): the prefill,
     * against the device's strict one, and the same decode steps, against the reference */
    double q8_err = 0.0, q8_decode_err = 0.0;
    if (run_seq(cpu_q8, seqs, 0, prompt, 0, PROMPT, c) || run_seq(gpu, seqs, 7, prompt, 0, PROMPT, a)) return 1;
    for (uint32_t r = 0; r < PROMPT; r++) q8_err = fmax(q8_err, row_error(a + (size_t)r * V, c + (size_t)r * V, V));
    for (int step = 0; step < served; step++) {
        if (run_seq(cpu_q8, seqs, 0, &cpu_tokens[step], PROMPT + (uint32_t)step, 1, c)) return 1;
        q8_decode_err = fmax(q8_decode_err, row_error(c, cpu_steps + (size_t)step * V, V));
    }
    /* Quantized weights: the device rounds the activations to 8 bits, as the CPU backend does, and
     * random tiny models amplify that rounding (the header); its decode may deviate from the
     * reference up to twice as far as the CPU backend's does on the prefill or the same steps. */
    const bool rounds = strcmp(argv[3], "f32") && strcmp(argv[3], "f16") && strcmp(argv[3], "bf16");
    const double served_tol = rounds ? fmax(tol, 2.0 * fmax(q8_err, q8_decode_err)) : tol;
    bool mega_ran = false, mega_tie = false, mega8_ran = false, mega8_tie = false;
    double mega_err = 0.0, mega_join = 0.0, mega8_err = 0.0, mega8_join = 0.0;
    int mega_same = 0, mega8_same = 0, mega8_rc = 0;
    const int mega_rc = mega_check(model, &config, seqs, prompt, served_tol, false, &mega_ran, &mega_err, &mega_same,
                                   &mega_tie, &mega_join);
    if (mega_rc < 0) return 1;
    if (rounds && mega_ran) {
        mega8_rc = mega_check(model, &config, seqs, prompt, served_tol, true, &mega8_ran, &mega8_err, &mega8_same,
                              &mega8_tie, &mega8_join);
        if (mega8_rc < 0) return 1;
    }
    failed = mega_rc != 0 || mega8_rc != 0 || !(prefill_err <= 1e-4) || !(decode_err <= 1e-4) || same != STEPS || !(batch_err <= 1e-5) ||
             !(f16_err <= tol) || !(long_err <= tol) || !(served_decode_err <= served_tol) || !(served_f16_err <= tol);
    printf("%-14s %-5s prefill %.1e  decode %.1e  greedy %2d/%d  batched %.1e  served prefill %.1e  long %.1e  decode "
           "%.1e (<= %.1e; f16 act %.1e)  %s   (cpu q8-act: prefill %.1e, decode %.1e)\n",
           argv[2], argv[3], prefill_err, decode_err, same, STEPS, batch_err, f16_err, long_err, served_decode_err,
           served_tol, served_f16_err, failed ? "FAIL" : "PASS", q8_err, q8_decode_err);
    if (mega_ran)
        printf("%-14s %-5s mega: decode %.1e against the per-operation kernels, greedy %d/%d%s, join/leave %.1e\n",
               argv[2], argv[3], mega_err, mega_same, MEGA_STEPS, mega_tie ? " (then a split at a near-tie)" : "",
               mega_join);
    else
        printf("%-14s %-5s mega: not taken\n", argv[2], argv[3]);
    if (mega8_ran)
        printf("%-14s %-5s mega 8-bit: decode %.1e against the per-operation kernels, greedy %d/%d%s, join/leave %.1e\n",
               argv[2], argv[3], mega8_err, mega8_same, MEGA_STEPS, mega8_tie ? " (then a split at a near-tie)" : "",
               mega8_join);
    em_backend_free(gpu);
    em_backend_free(cpu);
    em_backend_free(cpu_q8);
    free_reference(reference);
    em_model_free(model);
    free(a);
    free(c);
    free(solo);
    free(ref);
    free(cpu_steps);
    return failed;
}
