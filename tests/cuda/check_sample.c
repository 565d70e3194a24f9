/* Checks sampling on the device (src/backend/cuda/sample.cu) against the pick rule on the host
 * (src/backend/pick.c), on a machine with a GPU (not a ctest test: CI has none).
 *
 *   check_sample [VOCAB.gguf]
 *
 * 1. The kernel alone: random 128256-wide logits rows (a bell of ordinary tokens, a few strong
 *    ones, some ties and -inf), for T = 0 and T = 0.7 with no filter, top_k 40, top_p 0.9,
 *    min_p 0.05 and all three, 16 rows per launch, 48 counters each: every token must equal the
 *    host rule's. Then the kernel's time per launch for 1, 16 and 64 rows.
 * 2. With a vocabulary file: the CUDA backend on a synthesized tiny model, decode steps of 4
 *    sequences (the graph path): forward_pick must give what em_pick gives on the rows forward
 *    returns for the same batch; sequences 1 and 3 carry a grammar mask (em_batch.pick_masks, a
 *    fresh random third of the vocabulary each step, which the host applies with em_pick_mask),
 *    and their tokens must be allowed ones.
 * Prints a table and PASS or FAIL; exits 1 on any mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "model/model.h"

#define WIDTH 128256
#define ROWS 16
#define COUNTERS 48

static uint64_t rng_state = 0x1234567;

static double uniform(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return ((rng_state >> 11) + 0.5) * 0x1.0p-53;
}

/* Logits shaped like a language model's: most tokens in a bell around 0, a handful far above. */
static void fill_row(float *row, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        double g = sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform());
        row[i] = (float)(2.5 * g);
    }
    for (int k = 0; k < 12; k++) row[(uint32_t)(uniform() * n)] = (float)(12 + 8 * uniform());
    row[(uint32_t)(uniform() * n)] = -INFINITY;
    uint32_t a = (uint32_t)(uniform() * n), b = (uint32_t)(uniform() * n);
    row[b] = row[a]; /* a tie */
}

typedef struct pick_case {
    const char *name;
    float t, top_p, min_p;
    int top_k;
} pick_case;

static const pick_case cases[] = {
    {"T=0", 0.0f, 1.0f, 0.0f, 0},          {"T=0.7", 0.7f, 1.0f, 0.0f, 0},
    {"T=0.7 k40", 0.7f, 1.0f, 0.0f, 40},   {"T=0.7 p0.9", 0.7f, 0.9f, 0.0f, 0},
    {"T=0.7 m0.05", 0.7f, 1.0f, 0.05f, 0}, {"T=0.7 k40 p0.9 m0.05", 0.7f, 0.9f, 0.05f, 40},
};

static int check_kernel(void) {
    float *logits = malloc((size_t)ROWS * WIDTH * sizeof *logits);
    float *wide = malloc((size_t)64 * WIDTH * sizeof *wide);
    uint64_t *keys = malloc(2 * WIDTH * sizeof *keys);
    em_pick_params params[64];
    int32_t picked[64];
    int failures = 0;
    for (uint32_t r = 0; r < ROWS; r++) fill_row(logits + (size_t)r * WIDTH, WIDTH);
    for (uint32_t r = 0; r < 64; r++) fill_row(wide + (size_t)r * WIDTH, WIDTH);
    printf("%-22s %8s %8s %10s %10s %10s\n", "case", "agree", "of", "us/1row", "us/16rows", "us/64rows");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const pick_case *pc = &cases[c];
        uint32_t agree = 0, total = 0;
        for (uint64_t counter = 0; counter < COUNTERS; counter++) {
            for (uint32_t r = 0; r < ROWS; r++)
                params[r] = em_pick_params_make(pc->t, pc->top_k, pc->top_p, pc->min_p, 1000 + r, counter);
            em_err err = em_cuda_pick_rows(logits, ROWS, WIDTH, params, picked, 0, NULL);
            if (err) {
                fprintf(stderr, "pick: %s\n", em_err_message(err));
                em_err_free(err);
                return 1;
            }
            for (uint32_t r = 0; r < ROWS; r++) {
                int32_t want = em_pick(logits + (size_t)r * WIDTH, WIDTH, &params[r], keys);
                agree += picked[r] == want;
                if (picked[r] != want && failures++ < 5)
                    fprintf(stderr, "%s counter %llu row %u: device %d, host %d\n", pc->name,
                            (unsigned long long)counter, r, picked[r], want);
                total++;
            }
        }
        float us[3] = {0};
        const uint32_t launch_rows[3] = {1, 16, 64};
        for (int k = 0; k < 3; k++) {
            for (uint32_t r = 0; r < launch_rows[k]; r++)
                params[r] = em_pick_params_make(pc->t, pc->top_k, pc->top_p, pc->min_p, 7 + r, 3);
            float ms = 0;
            em_err err = em_cuda_pick_rows(wide, launch_rows[k], WIDTH, params, picked, 50, &ms);
            if (err) {
                fprintf(stderr, "timing: %s\n", em_err_message(err));
                em_err_free(err);
                return 1;
            }
            us[k] = ms * 1000;
            for (uint32_t r = 0; r < launch_rows[k]; r++) { /* the timed rows count too */
                int32_t want = em_pick(wide + (size_t)r * WIDTH, WIDTH, &params[r], keys);
                agree += picked[r] == want;
                failures += picked[r] != want;
                total++;
            }
        }
        printf("%-22s %8u %8u %10.1f %10.1f %10.1f\n", pc->name, agree, total, us[0], us[1], us[2]);
    }
    free(logits);
    free(wide);
    free(keys);
    return failures;
}

/* Decode steps of 4 sequences on the CUDA backend: forward_pick against em_pick on forward's rows. */
static int check_backend(const char *vocab) {
    const char *path = "check_sample_model.gguf";
    em_synth_options o = {.preset = "tiny-qwen3", .type = "f32", .seed = 9, .vocab_path = vocab};
    em_err err = em_synth_write(&o, path);
    em_model *m = NULL;
    em_backend *b = NULL;
    if (!err) err = em_model_load(path, &m);
    em_backend_config config = {.device = "cuda", .block_tokens = 16, .kv_tokens = 4096};
    if (!err) err = em_backend_create(m, &config, &b);
    if (err) {
        fprintf(stderr, "backend: %s\n", em_err_message(err));
        em_err_free(err);
        em_model_free(m);
        return 1;
    }
    printf("backend %s, vocabulary %u\n", b->ops->name, m->desc.n_vocab);
    const uint32_t n_vocab = m->desc.n_vocab;
    enum { SEQ = 4, STEPS = 24 };
    static uint32_t blocks[SEQ * 8];
    em_batch_seq seqs[SEQ];
    em_batch_fixed_tables(seqs, blocks, SEQ, 8);
    float *logits = malloc((size_t)SEQ * n_vocab * sizeof *logits);
    uint64_t *keys = malloc(2 * (size_t)n_vocab * sizeof *keys);
    int32_t tokens[SEQ], picked[SEQ];
    uint32_t seq[SEQ], pos[SEQ];
    bool want[SEQ];
    int failures = 0, agree = 0, outside = 0;
    const uint32_t words = (n_vocab + 31) / 32;
    uint32_t *mask_bits = calloc((size_t)SEQ * words, sizeof *mask_bits);
    const uint32_t *masks[SEQ] = {NULL, mask_bits + words, NULL, mask_bits + 3 * (size_t)words};
    for (uint32_t s = 0; s < SEQ; s++) tokens[s] = 5 + (int32_t)s * 101, seq[s] = s, want[s] = true;
    for (uint32_t step = 0; step < STEPS && !err; step++) {
        em_pick_params pick[SEQ];
        for (uint32_t s = 0; s < SEQ; s++) {
            pos[s] = step;
            pick[s] = em_pick_params_make(s == 0 ? 0.0f : 0.8f, s == 2 ? 40 : 0, s == 3 ? 0.9f : 1.0f, 0.0f, 50 + s, step);
        }
        for (uint32_t w = 0; w < SEQ * words; w++) { /* each token allowed with probability 1/3 */
            mask_bits[w] = 0;
            for (uint32_t bit = 0; bit < 32; bit++) mask_bits[w] |= (uint32_t)(uniform() < 1.0 / 3) << bit;
        }
        em_batch batch = {SEQ, tokens, seq, pos, want, SEQ, seqs, NULL, false, NULL, NULL};
        err = em_backend_forward(b, &batch, logits);
        batch.pick_masks = masks;
        if (!err) err = em_backend_forward_pick(b, &batch, pick, picked); /* the same positions again */
        for (uint32_t s = 0; s < SEQ && !err; s++) {
            if (masks[s]) {
                em_pick_mask(logits + (size_t)s * n_vocab, n_vocab, masks[s]);
                outside += !((masks[s][picked[s] / 32] >> (picked[s] % 32)) & 1u);
            }
            int32_t host = em_pick(logits + (size_t)s * n_vocab, n_vocab, &pick[s], keys);
            agree += host == picked[s];
            if (host != picked[s] && failures++ < 5)
                fprintf(stderr, "step %u seq %u: device %d, host %d\n", step, s, picked[s], host);
            tokens[s] = picked[s];
        }
    }
    if (err) {
        fprintf(stderr, "forward: %s\n", em_err_message(err));
        em_err_free(err);
        failures++;
    }
    printf("backend forward_pick vs host rule: %d of %d agree (half the rows masked; %d tokens outside a mask)\n",
           agree, SEQ * STEPS, outside);
    failures += outside;
    free(mask_bits);
    free(logits);
    free(keys);
    em_backend_free(b);
    em_model_free(m);
    remove(path);
    return failures;
}

int main(int argc, char **argv) {
    if (em_cuda_device_count() == 0) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    int failures = check_kernel();
    if (argc > 1) failures += check_backend(argv[1]);
    printf("%s\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
