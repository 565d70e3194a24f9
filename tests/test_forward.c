/* The CPU forward pass is one function of (sequence, position): whatever the batch looks like —
 * the whole prompt at once, chunks of any size, several sequences interleaved, decode tokens next
 * to prefill chunks — every token's logits equal those of plain token-by-token decoding, for every
 * family's tiny preset in f32, and for two quantized ones (Q4_K; Q6_K with IQ3_XXS experts). A
 * hybrid model's recurrent state refuses to roll back, and resumes from a snapshot bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "model/model.h"
#include "quant/quant.h"

#define VOCAB EM_FIXTURES_DIR "/vocab/ggml-vocab-llama-spm.gguf"
#define DIR EM_BINARY_DIR "/test_forward_files"
#define LEN 40 /* tokens per sequence: longer than the tiny Gemmas' window of 8 */
#define N_SEQ 3
#define TOLERANCE 1e-4f
/* A batch of AMX_FROM or more tokens (the CPU backend's EM_CPU_AMX_FROM) against Q4_K or Q8_0
 * weights runs on AMX tiles where the CPU has them, with em_dot_scalar's numbers: the same integer
 * sums as the decode kernels, but their f32 sums in another order, and the tiny random models carry
 * those last bits up to their logits. There the logits after such batches are held to
 * AMX_TOLERANCE, and in the MoE model with Q8_0 tensors (flint mix) to AMX_MOE_TOLERANCE: a last
 * bit can change which experts a token's router picks, and with them the token's logits (0.77 at
 * most here). A wrong row, position or sequence moves them by far more (16 and above); every other
 * check, and every check where the CPU has no AMX, stays at TOLERANCE. */
#define AMX_FROM 16
#define AMX_TOLERANCE 3e-2f
#define AMX_MOE_TOLERANCE 2.0f
#define BLOCK 8    /* positions per KV block: several blocks per sequence */
#define PER_SEQ 8  /* blocks per sequence: 64 positions */
#define POOL (N_SEQ * PER_SEQ + 2)

typedef struct fixture {
    em_model *model;
    uint32_t n_vocab;
    int32_t tokens[N_SEQ][LEN];
    float *reference[N_SEQ]; /* [LEN][n_vocab], token by token */
    float batch_tolerance;   /* for logits after batches of AMX_FROM tokens or more */
} fixture;

/* Block tables: sequence s owns blocks s, s + N_SEQ, s + 2 N_SEQ, ... — interleaved, so a position
 * that lands in the wrong block shows up as wrong logits. The last two blocks of the pool are spare. */
static uint32_t table_blocks[N_SEQ][PER_SEQ];
static em_batch_seq tables[N_SEQ];

static em_backend *new_backend(const em_model *m, uint32_t threads) {
    for (uint32_t s = 0; s < N_SEQ; s++) {
        for (uint32_t i = 0; i < PER_SEQ; i++) table_blocks[s][i] = i * N_SEQ + s;
        tables[s] = (em_batch_seq){table_blocks[s], PER_SEQ, s};
    }
    em_backend_config o = {.device = "cpu", .n_threads = threads, .block_tokens = BLOCK, .kv_tokens = POOL * BLOCK};
    em_backend *b = NULL;
    em_err err = em_backend_cpu_new(m, &o, &b);
    if (err) fail_msg("backend: %s", em_err_message(err));
    assert_int_equal(b->n_blocks, POOL);
    return b;
}

static em_batch make_batch(uint32_t n, const int32_t *tokens, const uint32_t *seq, const uint32_t *pos, const bool *want) {
    return (em_batch){n, tokens, seq, pos, want, N_SEQ, tables, NULL, false, NULL, NULL};
}

static void forward_one(em_backend *b, int32_t token, uint32_t seq, uint32_t pos, float *logits) {
    bool want = true;
    em_batch batch = make_batch(1, &token, &seq, &pos, &want);
    em_err err = em_backend_forward(b, &batch, logits);
    if (err) fail_msg("forward: %s", em_err_message(err));
}

static fixture *setup(const char *preset, const char *type) {
    mkdir(DIR, 0755);
    char path[512];
    snprintf(path, sizeof path, DIR "/%s-%s.gguf", preset, type);
    em_synth_options o = {.preset = preset, .type = type, .seed = 11, .vocab_path = VOCAB};
    em_err err = em_synth_write(&o, path);
    if (err) fail_msg("synth: %s", em_err_message(err));
    fixture *f = calloc(1, sizeof *f);
    if ((err = em_model_load(path, &f->model))) fail_msg("load: %s", em_err_message(err));
    f->n_vocab = f->model->desc.n_vocab;
    f->batch_tolerance = !em_amx_available()      ? TOLERANCE
                         : !strcmp(type, "q4_k") ? AMX_TOLERANCE
                         : !strcmp(type, "mix")  ? AMX_MOE_TOLERANCE
                                                 : TOLERANCE;
    uint64_t rng = 99;
    for (int s = 0; s < N_SEQ; s++)
        for (int i = 0; i < LEN; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            f->tokens[s][i] = (int32_t)((rng >> 33) % f->n_vocab);
        }
    /* The reference: one token per call, one thread. */
    em_backend *b = new_backend(f->model, 1);
    for (uint32_t s = 0; s < N_SEQ; s++) {
        f->reference[s] = malloc((size_t)LEN * f->n_vocab * sizeof(float));
        for (uint32_t i = 0; i < LEN; i++) forward_one(b, f->tokens[s][i], s, i, f->reference[s] + (size_t)i * f->n_vocab);
    }
    em_backend_free(b);
    return f;
}

static void teardown(fixture *f) {
    for (int s = 0; s < N_SEQ; s++) free(f->reference[s]);
    em_model_free(f->model);
    free(f);
}

static void assert_within(const fixture *f, const float *got, uint32_t seq, uint32_t pos, const char *what,
                          float tolerance) {
    const float *want = f->reference[seq] + (size_t)pos * f->n_vocab;
    float worst = 0;
    for (uint32_t v = 0; v < f->n_vocab; v++) {
        float d = fabsf(got[v] - want[v]);
        if (!(d <= worst)) worst = d; /* NaN counts as the worst */
    }
    if (!(worst <= tolerance))
        fail_msg("%s: %s seq %u pos %u: max |dlogit| = %g", f->model->desc.arch, what, seq, pos, worst);
}

static void assert_close(const fixture *f, const float *got, uint32_t seq, uint32_t pos, const char *what) {
    assert_within(f, got, seq, pos, what, TOLERANCE);
}

/* Each sequence alone, in chunks of `chunk` tokens, logits for every token. */
static void check_chunks(const fixture *f, uint32_t chunk, uint32_t threads) {
    em_backend *b = new_backend(f->model, threads);
    float *logits = malloc((size_t)chunk * f->n_vocab * sizeof(float));
    uint32_t seq[LEN], pos[LEN];
    bool want[LEN];
    for (uint32_t s = 0; s < N_SEQ; s++) {
        for (uint32_t start = 0; start < LEN; start += chunk) {
            uint32_t n = LEN - start < chunk ? LEN - start : chunk;
            for (uint32_t i = 0; i < n; i++) {
                seq[i] = s;
                pos[i] = start + i;
                want[i] = true;
            }
            em_batch batch = make_batch(n, f->tokens[s] + start, seq, pos, want);
            em_err err = em_backend_forward(b, &batch, logits);
            if (err) fail_msg("forward: %s", em_err_message(err));
            char what[64];
            snprintf(what, sizeof what, "chunks of %u", chunk);
            for (uint32_t i = 0; i < n; i++)
                assert_within(f, logits + (size_t)i * f->n_vocab, s, start + i, what,
                              chunk >= AMX_FROM ? f->batch_tolerance : TOLERANCE);
        }
    }
    free(logits);
    em_backend_free(b);
}

/* All sequences in the same batches: sequence s advances by a different chunk size each step
 * (so decode tokens sit next to prefill chunks), and only some tokens ask for logits. */
static void check_mixed(const fixture *f) {
    em_backend *b = new_backend(f->model, 2);
    const uint32_t sizes[N_SEQ][6] = {{1, 1, 7, 1, 13, 17}, {9, 2, 1, 5, 3, 20}, {40, 0, 0, 0, 0, 0}};
    uint32_t done[N_SEQ] = {0};
    int32_t tokens[N_SEQ * LEN];
    uint32_t seq[N_SEQ * LEN], pos[N_SEQ * LEN];
    bool want[N_SEQ * LEN];
    float *logits = malloc((size_t)N_SEQ * LEN * f->n_vocab * sizeof(float));
    for (int step = 0; step < 6; step++) {
        uint32_t n = 0, wanted = 0;
        for (uint32_t s = 0; s < N_SEQ; s++) {
            uint32_t take = sizes[s][step];
            if (done[s] + take > LEN) take = LEN - done[s];
            for (uint32_t i = 0; i < take; i++, n++) {
                tokens[n] = f->tokens[s][done[s] + i];
                seq[n] = s;
                pos[n] = done[s] + i;
                want[n] = pos[n] % 3 != 1 || i == take - 1;
                wanted += want[n];
            }
            done[s] += take;
        }
        if (n == 0) continue;
        em_batch batch = make_batch(n, tokens, seq, pos, want);
        assert_int_equal(em_batch_logits_rows(&batch), wanted);
        em_err err = em_backend_forward(b, &batch, logits);
        if (err) fail_msg("forward: %s", em_err_message(err));
        uint32_t row = 0;
        for (uint32_t i = 0; i < n; i++)
            if (want[i])
                assert_within(f, logits + (size_t)row++ * f->n_vocab, seq[i], pos[i], "mixed batch", f->batch_tolerance);
    }
    for (uint32_t s = 0; s < N_SEQ; s++) assert_int_equal(done[s], LEN);
    free(logits);
    em_backend_free(b);
}

/* Rewriting positions rolls a sequence back: decoding again from position 10 gives the reference
 * logits, and other sequences are untouched. */
static void check_rollback(const fixture *f) {
    em_backend *b = new_backend(f->model, 2);
    float *logits = malloc((size_t)f->n_vocab * sizeof(float));
    for (uint32_t i = 0; i < 20; i++) {
        forward_one(b, f->tokens[0][i], 0, i, logits);
        forward_one(b, f->tokens[1][i], 1, i, logits);
    }
    for (uint32_t i = 10; i < 25; i++) {
        forward_one(b, f->tokens[0][i], 0, i, logits);
        assert_close(f, logits, 0, i, "after rollback");
    }
    forward_one(b, f->tokens[1][20], 1, 20, logits);
    assert_close(f, logits, 1, 20, "other sequence");
    free(logits);
    em_backend_free(b);
}

/* Token-exact prefix reuse: a new sequence shares sequence 0's first two blocks by reference and
 * copies 5 rows of its third into a spare block, then continues from position 21 as if it had
 * computed everything itself. */
static void check_shared_prefix(const fixture *f) {
    em_backend *b = new_backend(f->model, 2);
    float *logits = malloc((size_t)f->n_vocab * sizeof(float));
    for (uint32_t i = 0; i < 2 * BLOCK + 5; i++) forward_one(b, f->tokens[0][i], 0, i, logits);
    const uint32_t spare = POOL - 2, more = POOL - 1;
    assert_null(em_backend_copy_rows(b, table_blocks[0][2], spare, 5));
    uint32_t reuse_blocks[4] = {table_blocks[0][0], table_blocks[0][1], spare, more};
    em_batch_seq reuse = {reuse_blocks, 4, 0};
    for (uint32_t i = 2 * BLOCK + 5; i < 30; i++) {
        int32_t token = f->tokens[0][i];
        uint32_t seq = 0, pos = i;
        bool want = true;
        em_batch batch = {1, &token, &seq, &pos, &want, 1, &reuse, NULL, false, NULL, NULL};
        assert_null(em_backend_forward(b, &batch, logits));
        assert_close(f, logits, 0, i, "shared prefix");
    }
    em_err err = em_backend_copy_rows(b, 0, POOL, 1);
    assert_int_equal(em_err_code_of(err), EM_ERR_RANGE);
    em_err_free(err);
    free(logits);
    em_backend_free(b);
}

/* Batches the backend must refuse. */
static void check_bad_batches(const fixture *f) {
    em_backend *b = new_backend(f->model, 1);
    float *logits = malloc((size_t)f->n_vocab * sizeof(float));
    int32_t token = 5, bad_token = (int32_t)f->n_vocab;
    uint32_t seq = 0, bad_seq = N_SEQ, pos = 0, far = PER_SEQ * BLOCK;
    uint32_t bad_block = POOL;
    em_batch_seq bad_table = {&bad_block, 1, 0};
    const struct { em_batch batch; em_err_code code; const char *needle; } cases[] = {
        {make_batch(1, &bad_token, &seq, &pos, NULL), EM_ERR_RANGE, "outside the vocabulary"},
        {make_batch(1, &token, &bad_seq, &pos, NULL), EM_ERR_RANGE, "but the batch has"},
        {make_batch(1, &token, &seq, &far, NULL), EM_ERR_RANGE, "beyond sequence 0's 8 blocks"},
        {make_batch(0, &token, &seq, &pos, NULL), EM_ERR_INVALID, "empty"},
        {{1, &token, &seq, &pos, NULL, 1, &bad_table, NULL, false, NULL, NULL}, EM_ERR_RANGE, "but the pool has"},
        {{1, &token, &seq, &pos, NULL, 0, NULL, NULL, false, NULL, NULL}, EM_ERR_INVALID, "block tables"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        em_err err = em_backend_forward(b, &cases[i].batch, logits);
        assert_non_null(err);
        assert_int_equal(em_err_code_of(err), cases[i].code);
        if (!strstr(em_err_message(err), cases[i].needle)) fail_msg("'%s' lacks '%s'", em_err_message(err), cases[i].needle);
        em_err_free(err);
    }
    free(logits);
    em_backend_free(b);
}

/* The program reads the description when it is built: after an edit, it is built again. */
static void rebuild_program(em_model *m) {
    em_program_free(&m->program);
    assert_null(em_model_build_program(m, &m->program));
}

/* Gemma's (1 + w) RMSNorm, for weights not yet shifted: subtracting 1 from every norm weight and
 * switching the description to EM_NORM_RMS_PLUS_ONE must give the same logits. */
static void check_plus_one_norm(fixture *f) {
    em_model *m = f->model;
    const em_model_desc *d = &m->desc;
    /* the model owns its norm vectors (model.h), so the test may edit them in place */
    float *norms[512];
    uint32_t sizes[512], n = 0;
#define ADD(v, size)                              \
    if (v) {                                      \
        norms[n] = (float *)(v);                  \
        sizes[n++] = (size);                      \
    }
    ADD(m->w.output_norm, d->n_embd);
    for (uint32_t il = 0; il < d->n_layer && n + 6 <= 512; il++) {
        const em_layer_weights *lw = &m->w.layers[il];
        ADD(lw->attn_norm, d->n_embd);
        ADD(lw->ffn_norm, d->n_embd);
        ADD(lw->post_attn_norm, d->n_embd);
        ADD(lw->post_ffn_norm, d->n_embd);
        ADD(lw->q_norm, d->layers[il].head_dim);
        ADD(lw->k_norm, d->layers[il].head_dim);
    }
#undef ADD
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < sizes[i]; j++) norms[i][j] -= 1.0f;
    m->desc.norm = EM_NORM_RMS_PLUS_ONE;
    rebuild_program(m);
    em_backend *b = new_backend(m, 2);
    float *logits = malloc((size_t)f->n_vocab * sizeof(float));
    for (uint32_t i = 0; i < 12; i++) {
        forward_one(b, f->tokens[2][i], 2, i, logits);
        /* w - 1 + 1 is not always w in floats: allow rounding */
        const float *want = f->reference[2] + (size_t)i * f->n_vocab;
        for (uint32_t v = 0; v < f->n_vocab; v++)
            if (!(fabsf(logits[v] - want[v]) <= 1e-3f * (1.0f + fabsf(want[v]))))
                fail_msg("(1+w) norm: pos %u token %u: %g vs %g", i, v, logits[v], want[v]);
    }
    free(logits);
    em_backend_free(b);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < sizes[i]; j++) norms[i][j] += 1.0f;
    m->desc.norm = EM_NORM_RMS;
    rebuild_program(m);
}

/* A hybrid model's recurrent state (Qwen3.5's Gated DeltaNet layers) cannot be rolled back: a
 * position other than 0 or the next one is refused, and position 0 starts the state afresh. */
static void check_no_rollback(const fixture *f) {
    em_backend *b = new_backend(f->model, 2);
    float *logits = malloc((size_t)f->n_vocab * sizeof(float));
    for (uint32_t i = 0; i < 12; i++) forward_one(b, f->tokens[0][i], 0, i, logits);
    int32_t token = f->tokens[0][10];
    uint32_t seq = 0, pos = 10;
    em_batch batch = make_batch(1, &token, &seq, &pos, NULL);
    em_err err = em_backend_forward(b, &batch, logits);
    assert_int_equal(em_err_code_of(err), EM_ERR_INVALID);
    if (!strstr(em_err_message(err), "recurrent state of sequence 0 (slot 0) is at 12"))
        fail_msg("'%s' does not say where the state is", em_err_message(err));
    em_err_free(err);
    for (uint32_t i = 0; i < 5; i++) { /* starting over, through the slot sequence 0 left */
        forward_one(b, f->tokens[1][i], 0, i, logits);
        assert_close(f, logits, 1, i, "state restarted at 0");
    }
    free(logits);
    em_backend_free(b);
}

/* A prefix resumed from a snapshot of its state (copy_state) and its KV blocks gives the logits of
 * the sequence run cold, bit for bit, and the sequence the snapshot was taken from goes on unharmed. */
static void check_state_snapshot(const fixture *f) {
    em_backend *b = new_backend(f->model, 2);
    float *logits = malloc((size_t)f->n_vocab * sizeof(float));
    const uint32_t prefix = 2 * BLOCK + 5, snapshot = N_SEQ + 1;
    for (uint32_t i = 0; i < prefix; i++) forward_one(b, f->tokens[0][i], 0, i, logits);
    assert_null(em_backend_copy_state(b, 0, snapshot));
    for (uint32_t i = prefix; i < LEN; i++) {
        forward_one(b, f->tokens[0][i], 0, i, logits);
        assert_close(f, logits, 0, i, "after a snapshot");
    }
    /* sequence 1's slot takes the snapshot; its KV shares sequence 0's blocks as check_shared_prefix does */
    assert_null(em_backend_copy_state(b, snapshot, 1));
    const uint32_t spare = POOL - 2, more = POOL - 1;
    assert_null(em_backend_copy_rows(b, table_blocks[0][2], spare, 5));
    uint32_t reuse_blocks[4] = {table_blocks[0][0], table_blocks[0][1], spare, more};
    em_batch_seq reuse = {reuse_blocks, 4, 1};
    for (uint32_t i = prefix; i < 30; i++) {
        int32_t token = f->tokens[0][i];
        uint32_t seq = 0, pos = i;
        bool want = true;
        em_batch batch = {1, &token, &seq, &pos, &want, 1, &reuse, NULL, false, NULL, NULL};
        assert_null(em_backend_forward(b, &batch, logits));
        if (memcmp(logits, f->reference[0] + (size_t)i * f->n_vocab, f->n_vocab * sizeof(float)))
            fail_msg("resumed from a snapshot: pos %u differs from the cold run", i);
    }
    em_err err = em_backend_copy_state(b, 0, b->n_state_slots);
    assert_int_equal(em_err_code_of(err), EM_ERR_RANGE);
    em_err_free(err);
    free(logits);
    em_backend_free(b);
}

static void check_family(const char *preset, const char *type) {
    fixture *f = setup(preset, type);
    check_chunks(f, LEN, 2); /* the whole sequence at once */
    check_chunks(f, 7, 2);
    check_chunks(f, 3, 1);
    check_mixed(f);
    if (em_program_state_floats(&f->model->program)) {
        check_no_rollback(f);
        check_state_snapshot(f);
    } else {
        check_rollback(f);
        check_shared_prefix(f);
    }
    check_bad_batches(f);
    /* Gemma 2 and 3, whose checkpoints store norms as w of (1 + w) (Gemma 4's are plain) */
    const em_family *family = em_family_by_gguf_arch(f->model->desc.arch);
    if (family && family->norm_plus_one && family->post_norms) check_plus_one_norm(f);
    teardown(f);
}

#define FAMILY(name, preset, type)         \
    static void name(void **state) {      \
        (void)state;                       \
        check_family(preset, type);        \
    }
FAMILY(test_llama, "tiny-llama", "f32")
FAMILY(test_qwen2, "tiny-qwen2", "f32")
FAMILY(test_qwen3, "tiny-qwen3", "f32")
FAMILY(test_qwen3moe, "tiny-qwen3moe", "f32")
FAMILY(test_gemma2, "tiny-gemma2", "f32")
FAMILY(test_gemma3, "tiny-gemma3", "f32")
FAMILY(test_mixtral, "tiny-mixtral", "f32")
FAMILY(test_flint, "tiny-flint", "f32")
FAMILY(test_qwen35, "tiny-qwen35", "f32")
FAMILY(test_qwen35moe, "tiny-qwen35moe", "f32")
/* Gemma 4's three layouts: K = V in the full layers, experts beside a dense unit, shared KV with
 * per-layer inputs; and the experts' fused gate and up stack quantized */
FAMILY(test_gemma4, "tiny-gemma4", "f32")
FAMILY(test_gemma4_moe, "tiny-gemma4-moe", "f32")
FAMILY(test_gemma4_per_layer, "tiny-gemma4-ple", "f32")
FAMILY(test_gemma4_moe_q8_0, "tiny-gemma4-moe", "q8_0")
/* Quantized weights: activations are quantized per token, so batching must not change them either. */
FAMILY(test_llama_q4_k, "tiny-llama", "q4_k")
FAMILY(test_flint_mix, "tiny-flint", "mix")

/* The CPU pool spins between jobs only while its threads and every other runnable task fit the
 * CPUs: /proc/loadavg's runnable count includes the reader, and the workers while they spin. */
static void test_spin_allowed(void **state) {
    (void)state;
    assert_true(em_cpu_spin_allowed("0.50 0.40 0.30 1/80 1234\n", 2, 2, false));   /* only the reader runs */
    assert_false(em_cpu_spin_allowed("2.10 1.50 1.00 2/80 1234\n", 2, 2, false)); /* one other task */
    assert_true(em_cpu_spin_allowed("1.90 1.50 1.00 2/80 1234\n", 2, 2, true));   /* the spinning worker */
    assert_false(em_cpu_spin_allowed("3.00 2.00 1.00 3/80 1234\n", 2, 2, true));  /* and one other */
    assert_false(em_cpu_spin_allowed("0.00 0.00 0.00 1/80 1234\n", 2, 4, false)); /* more threads than CPUs */
    assert_true(em_cpu_spin_allowed("4.00 4.00 4.00 5/300 99\n", 16, 8, false));
    assert_false(em_cpu_spin_allowed("4.00 4.00 4.00 12/300 99\n", 16, 8, false));
    assert_false(em_cpu_spin_allowed("", 2, 2, false)); /* unreadable: sleep at once */
    assert_false(em_cpu_spin_allowed("0.5 0.4", 2, 2, false));
    assert_false(em_cpu_spin_allowed(NULL, 2, 2, false));
}

/* A job's pieces (em_cpu_piece), taken by a pool's threads at once: every item of [0, total) in
 * exactly one piece, each piece's end on a multiple of `align` (or on total), none smaller than
 * `least` but the last, and no piece larger than the one taken before it. */
enum { PIECES_TOTAL = 100003, PIECES_LEAST = 96, PIECES_ALIGN = 8, PIECES_MAX = 4096 };

typedef struct pieces_job {
    em_cpu_pieces pieces;
    _Atomic uint32_t covered[PIECES_TOTAL];
    _Atomic uint32_t n_taken;
    uint64_t begin[PIECES_MAX], end[PIECES_MAX];
} pieces_job;

static void pieces_share(void *ctx, uint32_t ith, uint32_t nth) {
    (void)ith;
    pieces_job *job = ctx;
    uint64_t begin, end;
    while (em_cpu_piece(&job->pieces, nth, &begin, &end)) {
        for (uint64_t i = begin; i < end; i++) atomic_fetch_add(&job->covered[i], 1);
        const uint32_t k = atomic_fetch_add(&job->n_taken, 1);
        if (k < PIECES_MAX) job->begin[k] = begin, job->end[k] = end;
    }
}

static void check_pieces(uint32_t threads) {
    em_cpu_pool pool;
    assert_null(em_cpu_pool_init(&pool, threads));
    pieces_job *job = calloc(1, sizeof *job);
    assert_non_null(job);
    em_cpu_pieces_init(&job->pieces, PIECES_TOTAL, PIECES_LEAST, PIECES_ALIGN);
    em_cpu_pool_run(&pool, pieces_share, job);
    em_cpu_pool_destroy(&pool);
    for (uint64_t i = 0; i < PIECES_TOTAL; i++) assert_int_equal(atomic_load(&job->covered[i]), 1);
    const uint32_t n = atomic_load(&job->n_taken);
    assert_true(n >= 1 && n < PIECES_MAX);
    if (threads == 1) assert_int_equal(n, 1); /* one thread takes everything at once */
    else assert_true(n > 2 * threads);       /* the pieces shrink: several per thread */
    /* sorted by where they begin (threads record them in any order), they follow each other */
    for (uint32_t a = 1; a < n; a++)
        for (uint32_t b = a; b > 0 && job->begin[b - 1] > job->begin[b]; b--) {
            uint64_t t = job->begin[b]; job->begin[b] = job->begin[b - 1]; job->begin[b - 1] = t;
            t = job->end[b]; job->end[b] = job->end[b - 1]; job->end[b - 1] = t;
        }
    for (uint32_t k = 0; k < n; k++) {
        assert_int_equal(job->begin[k], k ? job->end[k - 1] : 0);
        const uint64_t size = job->end[k] - job->begin[k];
        if (k + 1 < n) {
            assert_int_equal(job->end[k] % PIECES_ALIGN, 0);
            assert_true(size >= PIECES_LEAST);
        }
        if (k > 0 && k + 1 < n) assert_true(size <= job->end[k - 1] - job->begin[k - 1] + PIECES_ALIGN);
    }
    assert_int_equal(job->end[n - 1], PIECES_TOTAL);
    free(job);
}

static void test_pieces(void **state) {
    (void)state;
    check_pieces(1);
    check_pieces(2);
    check_pieces(4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spin_allowed), cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_llama),   cmocka_unit_test(test_qwen2),   cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_qwen3moe), cmocka_unit_test(test_gemma2), cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_mixtral), cmocka_unit_test(test_flint),   cmocka_unit_test(test_llama_q4_k),
        cmocka_unit_test(test_flint_mix), cmocka_unit_test(test_qwen35), cmocka_unit_test(test_qwen35moe), cmocka_unit_test(test_gemma4),
        cmocka_unit_test(test_gemma4_moe), cmocka_unit_test(test_gemma4_per_layer),
        cmocka_unit_test(test_gemma4_moe_q8_0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
