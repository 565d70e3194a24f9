/* The CPU's Gated DeltaNet operation (src/backend/cpu/delta_net.c) against a double-precision
 * transcription of its definition (the causal depthwise conv, the L2 norms, the gates and the gated
 * delta rule S ← e^g S; S ← S + k β(v − Sᵀk)ᵀ; o = Sᵀq as written in the model's reference code),
 * on random inputs: two sequences interleaved in one batch, one of them restarting at position 0,
 * value heads twice the key heads in tiled and in grouped order, on one thread and on three. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"

enum { HK = 2, HV = 4, DK = 8, DV = 6, K = 4, CONV = 2 * HK * DK + HV * DV, N = 13, SLOTS = 2 };
enum { CONV_FLOATS = (K - 1) * CONV, STATE_FLOATS = CONV_FLOATS + HV * DK * DV };

static uint64_t rng = 0x243F6A8885A308D3ull;
static float uniform(float scale) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return scale * (float)((double)(rng >> 40) / (double)(1ull << 23) - 1.0);
}

typedef struct inputs {
    float conv[CONV * K], dt_bias[HV], a[HV];
    float mixed[N][CONV], beta[N][HV], alpha[N][HV];
    int32_t tokens[N];
    uint32_t seq[N], pos[N];
} inputs;

/* The definition, in doubles, one sequence's tokens at a time; its state in `conv_state` and `S`. */
typedef struct reference_state {
    double history[K - 1][CONV];
    double S[HV][DK][DV];
} reference_state;

static double silu(double x) { return x / (1.0 + exp(-x)); }
static double softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

static void reference_token(const inputs *in, uint32_t t, bool tiled, reference_state *st, double *out) {
    if (in->pos[t] == 0) memset(st, 0, sizeof *st);
    double x[CONV];
    for (int c = 0; c < CONV; c++) {
        double sum = in->conv[c * K + K - 1] * (double)in->mixed[t][c];
        for (int j = 0; j < K - 1; j++) sum += in->conv[c * K + j] * st->history[j][c];
        x[c] = silu(sum);
    }
    for (int j = 0; j + 1 < K - 1; j++) memcpy(st->history[j], st->history[j + 1], sizeof st->history[j]);
    for (int c = 0; c < CONV; c++) st->history[K - 2][c] = in->mixed[t][c];
    for (int h = 0; h < 2 * HK; h++) { /* q heads then k heads */
        double sum = 0;
        for (int i = 0; i < DK; i++) sum += x[h * DK + i] * x[h * DK + i];
        const double scale = 1.0 / sqrt(sum + 1e-6) * (h < HK ? 1.0 / sqrt((double)DK) : 1.0);
        for (int i = 0; i < DK; i++) x[h * DK + i] *= scale;
    }
    for (int h = 0; h < HV; h++) {
        const int kh = tiled ? h % HK : h / (HV / HK);
        const double *q = x + kh * DK, *k = x + (HK + kh) * DK, *v = x + 2 * HK * DK + h * DV;
        const double g = in->a[h] * softplus((double)in->alpha[t][h] + in->dt_bias[h]);
        const double beta = 1.0 / (1.0 + exp(-(double)in->beta[t][h]));
        double (*S)[DV] = st->S[h];
        for (int i = 0; i < DK; i++)
            for (int j = 0; j < DV; j++) S[i][j] *= exp(g);
        for (int j = 0; j < DV; j++) {
            double u = 0;
            for (int i = 0; i < DK; i++) u += S[i][j] * k[i];
            const double delta = beta * (v[j] - u);
            for (int i = 0; i < DK; i++) S[i][j] += k[i] * delta;
        }
        for (int j = 0; j < DV; j++) {
            double o = 0;
            for (int i = 0; i < DK; i++) o += S[i][j] * q[i];
            out[h * DV + j] = o;
        }
    }
}

static void check(bool tiled, uint32_t threads) {
    inputs *in = calloc(1, sizeof *in);
    assert_non_null(in);
    for (int i = 0; i < CONV * K; i++) in->conv[i] = uniform(0.8f);
    for (int h = 0; h < HV; h++) {
        in->dt_bias[h] = uniform(1.0f);
        in->a[h] = -0.1f - fabsf(uniform(2.0f));
    }
    /* sequence 0 in slot 1 over positions 0..6; sequence 1 in slot 0 over 0..3, then again from 0 */
    const uint32_t seq[N] = {0, 1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 1};
    const uint32_t pos[N] = {0, 0, 1, 1, 2, 3, 2, 3, 4, 0, 1, 5, 2};
    for (int t = 0; t < N; t++) {
        in->seq[t] = seq[t];
        in->pos[t] = pos[t];
        for (int c = 0; c < CONV; c++) in->mixed[t][c] = uniform(2.0f);
        for (int h = 0; h < HV; h++) {
            in->beta[t][h] = uniform(3.0f);
            in->alpha[t][h] = uniform(3.0f);
        }
    }
    const em_program_delta_net op = {.n_head_k = HK, .n_head_v = HV, .head_dim_k = DK, .head_dim_v = DV,
                                     .conv_kernel = K, .v_tiled = tiled, .conv = in->conv, .dt_bias = in->dt_bias,
                                     .a = in->a, .eps = 1e-6f};
    const uint32_t block = 0;
    const em_batch_seq seqs[2] = {{&block, 1, 1}, {&block, 1, 0}};
    const em_batch batch = {.n_tokens = N, .tokens = in->tokens, .seq = in->seq, .pos = in->pos, .n_seqs = 2,
                            .seqs = seqs};
    float *states = calloc(SLOTS * STATE_FLOATS, sizeof(float));
    float *out = calloc((size_t)N * HV * DV, sizeof(float));
    float *conv_out = calloc((size_t)N * CONV, sizeof(float)), *gates = calloc((size_t)N * 2 * HV, sizeof(float));
    float *scratch = calloc((size_t)threads * DV, sizeof(float));
    for (int i = 0; i < SLOTS * STATE_FLOATS; i++) states[i] = uniform(5.0f); /* position 0 must clear it */
    em_cpu_pool pool;
    assert_null(em_cpu_pool_init(&pool, threads));
    const em_cpu_delta_net job = {.op = &op, .batch = &batch, .mixed = &in->mixed[0][0], .beta = &in->beta[0][0],
                                  .alpha = &in->alpha[0][0], .out = out, .states = states, .slot_floats = STATE_FLOATS,
                                  .offset = 0, .conv_out = conv_out, .gates = gates, .scratch = scratch};
    em_cpu_delta_net_run(&pool, &job);
    em_cpu_pool_destroy(&pool);

    reference_state *st = calloc(2, sizeof *st);
    double want[HV * DV];
    for (int t = 0; t < N; t++) {
        reference_token(in, (uint32_t)t, tiled, &st[seq[t]], want);
        for (int i = 0; i < HV * DV; i++) {
            const double got = out[(size_t)t * HV * DV + i];
            if (!(fabs(got - want[i]) <= 1e-4 * (1.0 + fabs(want[i]))))
                fail_msg("%s, %u threads: token %d output %d: %.7g, the definition gives %.7g",
                         tiled ? "tiled" : "grouped", threads, t, i, got, want[i]);
        }
    }
    /* what each slot keeps: the last K − 1 inputs and the heads' matrices, as the definition has them */
    for (int s = 0; s < 2; s++) {
        const float *kept = states + (size_t)seqs[s].state * STATE_FLOATS;
        for (int j = 0; j < K - 1; j++)
            for (int c = 0; c < CONV; c++) assert_true(kept[j * CONV + c] == (float)st[s].history[j][c]);
        for (int i = 0; i < HV * DK * DV; i++) {
            const double w = (&st[s].S[0][0][0])[i];
            if (!(fabs(kept[CONV_FLOATS + i] - w) <= 1e-4 * (1.0 + fabs(w))))
                fail_msg("sequence %d's state %d: %g, the definition keeps %g", s, i, kept[CONV_FLOATS + i], w);
        }
    }
    free(st);
    free(states);
    free(out);
    free(conv_out);
    free(gates);
    free(scratch);
    free(in);
}

static void test_tiled(void **state) {
    (void)state;
    check(true, 1);
    check(true, 3);
}

static void test_grouped(void **state) {
    (void)state;
    check(false, 1);
    check(false, 3);
}

/* The gated norm: RMSNorm over each head, times the weights, times SiLU of the gate. */
static void test_gated_norm(void **state) {
    (void)state;
    float w[DV], rows[2 * HV * DV], gate[2 * HV * DV], want[2 * HV * DV];
    for (int i = 0; i < DV; i++) w[i] = 1.0f + uniform(0.5f);
    for (int i = 0; i < 2 * HV * DV; i++) rows[i] = uniform(3.0f), gate[i] = uniform(4.0f);
    for (int h = 0; h < 2 * HV; h++) {
        double sum = 0;
        for (int j = 0; j < DV; j++) sum += (double)rows[h * DV + j] * rows[h * DV + j];
        for (int j = 0; j < DV; j++)
            want[h * DV + j] = (float)(rows[h * DV + j] / sqrt(sum / DV + 1e-6) * w[j] * silu(gate[h * DV + j]));
    }
    const em_program_heads heads = {.n_head = HV, .head_dim = DV, .norm = {.weight = w, .width = DV, .eps = 1e-6f}};
    em_cpu_gated_norm(&heads, rows, gate, 2);
    for (int i = 0; i < 2 * HV * DV; i++) assert_true(fabsf(rows[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiled), cmocka_unit_test(test_grouped),
                                       cmocka_unit_test(test_gated_norm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
