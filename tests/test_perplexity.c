/* The perplexity module without a model: llama.cpp's window arithmetic, the NLL of a row against
 * log-softmax written out, and the saved log-probabilities: a row read back gives KL ~0 against
 * the logits it came from (any shift of them: softmax does not see it), and against another row
 * the closed form of KL between two distributions. The end-to-end checks (a model, transformers'
 * perplexity, q8_0 against f32) are in tests/cli/perplexity.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perplexity/perplexity.h"

static void test_windows(void **state) {
    (void)state;
    int32_t tokens[100] = {0};
    em_ppl_windows w;
    /* 100 / 16 = 6 windows; scored positions 8..14 of each (ctx/2 .. ctx-2) */
    assert_null(em_ppl_windows_init(&w, tokens, 100, 16, 0, 1));
    assert_int_equal(w.n_chunks, 6);
    assert_int_equal(w.first, 8);
    assert_int_equal(w.n_scored, 7);
    /* an odd window: first = 8, scored 8..15 */
    assert_null(em_ppl_windows_init(&w, tokens, 100, 17, 0, 1));
    assert_int_equal(w.n_chunks, 5);
    assert_int_equal(w.n_scored, 8);
    assert_null(em_ppl_windows_init(&w, tokens, 100, 16, 4, 1));
    assert_int_equal(w.n_chunks, 4);
    em_err err = em_ppl_windows_init(&w, tokens, 100, 7, 0, 1);
    assert_non_null(err);
    assert_non_null(strstr(em_err_message(err), "too small"));
    em_err_free(err);
    err = em_ppl_windows_init(&w, tokens, 15, 16, 0, 1);
    assert_non_null(err);
    assert_non_null(strstr(em_err_message(err), "less than one window"));
    em_err_free(err);
}

/* log_softmax written out: -log(exp(l[t]) / sum(exp(l))). */
static double nll_direct(const float *l, uint32_t n, int32_t t) {
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)l[i]);
    return -log(exp((double)l[t]) / sum);
}

static void test_nll(void **state) {
    (void)state;
    const float logits[5] = {0.5f, -1.25f, 3.0f, 2.0f, 0.0f};
    em_ppl_sum s = {0};
    const double lse = em_ppl_log_sum_exp(logits, 5, NULL);
    em_ppl_add(&s, lse - logits[3]);
    em_ppl_add(&s, lse - logits[1]);
    const double a = nll_direct(logits, 5, 3), b = nll_direct(logits, 5, 1);
    /* exp in f32, as llama.cpp: a relative error of a few units of the last place of a float */
    assert_true(fabs(s.nll - (a + b)) < 1e-6);
    assert_true(fabs(em_ppl_value(&s) / exp((a + b) / 2) - 1) < 1e-6);
    /* two values: var = ((a-b)/2)^2, ppl * sqrt(var / 1) */
    assert_true(fabs(em_ppl_uncertainty(&s) / (exp((a + b) / 2) * fabs(a - b) / 2) - 1) < 1e-5);
    int32_t top;
    em_ppl_log_sum_exp(logits, 5, &top);
    assert_int_equal(top, 2);
}

/* Writes rows (each with its target) to a temporary file and opens it for reading. */
static void write_and_open(const float *rows, uint32_t n_rows, uint32_t n_vocab, const int32_t *targets,
                           em_logprobs_file *in, char *path) {
    strcpy(path, "/tmp/test_perplexity_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    /* one window of 8 tokens scores 3 positions */
    assert_int_equal(n_rows, 3);
    const em_logprobs_header h = {.n_vocab = n_vocab, .ctx = 8, .n_chunks = 1, .first = 4, .n_scored = 3, .bos = 1,
                                  .vocab_hash = 42};
    int32_t tokens[8] = {1, 2, 3, 0, 1, 2, 3, 0};
    em_logprobs_file out;
    assert_null(em_logprobs_create(&out, path, &h, tokens));
    for (uint32_t r = 0; r < n_rows; r++) {
        const float *row = rows + (uint64_t)r * n_vocab;
        assert_null(em_logprobs_write_row(&out, row, em_ppl_log_sum_exp(row, n_vocab, NULL), targets[r]));
    }
    assert_null(em_logprobs_close(&out));
    assert_null(em_logprobs_open(in, path));
    assert_int_equal(in->h.n_vocab, n_vocab);
    assert_int_equal(in->h.vocab_hash, 42);
    assert_int_equal(in->tokens[2], 3);
}

static void test_saved_rows(void **state) {
    (void)state;
    enum { V = 6 };
    /* a peaked row, a flat one, and one whose tail lies far below the 24-nat floor */
    const float rows[3 * V] = {2.0f, -1.0f, 0.5f, 7.0f, 0.0f, -3.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f,
                               5.0f, -40.0f, 4.0f, -60.0f, 3.0f, 0.0f};
    const int32_t targets[3] = {3, 2, 1};
    em_logprobs_file in;
    char path[64];
    write_and_open(rows, 3, V, targets, &in, path);
    em_ppl_kl same = {0}, other = {0};
    for (int r = 0; r < 3; r++) {
        em_logprobs_row base;
        assert_null(em_logprobs_read_row(&in, &base));
        const float *row = rows + r * V;
        /* the right token's log-probability is kept exactly, the top token too */
        assert_true(fabs(base.target_logprob + nll_direct(row, V, targets[r])) < 1e-6);
        assert_int_equal(base.top, r == 1 ? 0 : r == 0 ? 3 : 0);
        /* every stored log-probability within half a step of the true one, or below the floor */
        for (int i = 0; i < V; i++) {
            const double lp = -nll_direct(row, V, i);
            if (base.q[i] == 0) {
                assert_true(lp < base.floor);
                continue;
            }
            assert_true(fabs(base.floor + base.step * (base.q[i] - 1) - lp) <= 0.5 * base.step + 1e-6);
        }
        /* the same distribution, shifted: KL ~0 */
        float shifted[V];
        for (int i = 0; i < V; i++) shifted[i] = row[i] + 10.0f;
        int32_t top;
        double lse = em_ppl_log_sum_exp(shifted, V, &top);
        assert_null(em_ppl_kl_add(&same, shifted, V, lse, top, targets[r], &base));
        /* against uniform logits: KL(p || uniform) = sum p log p + log V */
        const float uniform[V] = {0};
        lse = em_ppl_log_sum_exp(uniform, V, &top);
        assert_null(em_ppl_kl_add(&other, uniform, V, lse, top, targets[r], &base));
        double want = log((double)V);
        for (int i = 0; i < V; i++) {
            const double lp = -nll_direct(row, V, i);
            want += exp(lp) * lp;
        }
        assert_true(fabs(other.kld_values[r] - want) < 1e-4 * (want > 1 ? want : 1));
        assert_true(fabs(same.kld_values[r]) < 1e-8);
    }
    em_ppl_kl_report report;
    em_ppl_kl_finish(&same, &report);
    assert_true(report.same_top.value == 1.0);
    assert_true(fabs(report.log_ratio.value) < 1e-6);
    em_ppl_kl_finish(&other, &report);
    /* uniform logits pick token 0; the base rows' tops are 3, 0, 0 */
    assert_true(fabs(report.same_top.value - 2.0 / 3.0) < 1e-12);
    assert_true(fabs(report.ppl.value - V) < 1e-9);
    em_ppl_kl_free(&same);
    em_ppl_kl_free(&other);
    assert_null(em_logprobs_close(&in));
    unlink(path);
}

static void test_percentiles(void **state) {
    (void)state;
    /* KL values 0, 1, ..., 10 (rows whose base and model differ by a known amount would do; the
     * statistics only see the values): the median is 5, 0.999 interpolates between 9 and 10. */
    em_ppl_kl kl = {0};
    kl.cap = 16;
    kl.kld_values = calloc(16, sizeof(float));
    kl.p_diff_values = calloc(16, sizeof(float));
    assert_non_null(kl.kld_values);
    for (int i = 0; i < 11; i++) kl.kld_values[i] = (float)(10 - i);
    kl.count = 11;
    em_ppl_kl_report r;
    em_ppl_kl_finish(&kl, &r);
    assert_true(r.kld_at[0] == 10 && r.kld_at[EM_PPL_N_PERCENTILES - 1] == 0);
    assert_true(r.kld_at[6] == 5);
    assert_true(fabs(r.kld_at[1] - 9.99) < 1e-9);
    em_ppl_kl_free(&kl);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_windows),
        cmocka_unit_test(test_nll),
        cmocka_unit_test(test_saved_rows),
        cmocka_unit_test(test_percentiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
