/* Sampling and stop strings: exact effects of each parameter, determinism by seed, distributions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

static ember_sampling defaults(void) {
    ember_request_params p;
    ember_request_default(&p);
    return p.sampling;
}

static ember_sampling greedy(void) {
    ember_sampling s = defaults();
    s.temperature = 0;
    return s;
}

static int32_t sample_once(const ember_sampling *params, const float *logits_in, uint32_t n, const int32_t *history,
                           size_t n_history) {
    em_sampler s;
    float logits[64];
    memcpy(logits, logits_in, n * sizeof *logits);
    em_err err = em_sampler_init(&s, params, n);
    if (err) fail_msg("%s", em_err_message(err));
    int32_t token = em_sampler_sample(&s, logits, NULL, history, n_history, NULL, NULL, NULL);
    em_sampler_free(&s);
    return token;
}

static void test_greedy_bias_penalties(void **state) {
    (void)state;
    float logits[5] = {1.0f, 3.0f, 3.0f, 2.5f, -1.0f};
    ember_sampling s = greedy();
    assert_int_equal(sample_once(&s, logits, 5, NULL, 0), 1); /* tie: lowest id */
    ember_logit_bias ban = {1, -INFINITY};
    s.logit_bias = &ban;
    s.n_logit_bias = 1;
    assert_int_equal(sample_once(&s, logits, 5, NULL, 0), 2);
    ember_logit_bias boost = {4, 10.0f};
    s.logit_bias = &boost;
    assert_int_equal(sample_once(&s, logits, 5, NULL, 0), 4);
    /* Repeat penalty 2 halves positive logits of seen tokens: 3 → 1.5, so token 3 (2.5) wins. */
    s = greedy();
    s.repeat_penalty = 2.0f;
    int32_t history[3] = {1, 2, 2};
    assert_int_equal(sample_once(&s, logits, 5, history, 3), 3);
    /* Only the last repeat_last_n tokens count: the window {2} leaves token 1 at 3.0. */
    s.repeat_last_n = 1;
    assert_int_equal(sample_once(&s, logits, 5, history, 3), 1);
    /* Presence 0.4 and frequency 0.2: token 2 (seen twice) drops to 3 - 0.4 - 0.4 = 2.2,
     * token 1 (once) to 2.4; token 3 at 2.5 wins. */
    s = greedy();
    s.presence_penalty = 0.4f;
    s.frequency_penalty = 0.2f;
    assert_int_equal(sample_once(&s, logits, 5, history, 3), 3);
    s.frequency_penalty = 0.0f; /* presence alone: tokens 1 and 2 at 2.6 beat 2.5; the tie goes to 1 */
    assert_int_equal(sample_once(&s, logits, 5, history, 3), 1);
}

static void test_seed_determinism_and_distribution(void **state) {
    (void)state;
    float logits[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    ember_sampling s = defaults();
    s.temperature = 1.0f;
    s.top_k = 0;
    s.top_p = 1.0f;
    s.min_p = 0.0f;
    s.seed = 42;
    em_sampler a, b;
    assert_null(em_sampler_init(&a, &s, 3));
    assert_null(em_sampler_init(&b, &s, 3));
    int counts[3] = {0};
    const int draws = 20000;
    for (int i = 0; i < draws; i++) {
        float la[3], lb[3];
        memcpy(la, logits, sizeof la);
        memcpy(lb, logits, sizeof lb);
        int32_t x = em_sampler_sample(&a, la, NULL, NULL, 0, NULL, NULL, NULL);
        int32_t y = em_sampler_sample(&b, lb, NULL, NULL, 0, NULL, NULL, NULL);
        assert_int_equal(x, y);
        counts[x]++;
    }
    assert_true(fabs(counts[0] / (double)draws - 0.5) < 0.015);
    assert_true(fabs(counts[1] / (double)draws - 0.3) < 0.015);
    assert_true(fabs(counts[2] / (double)draws - 0.2) < 0.015);
    em_sampler_free(&a);
    em_sampler_free(&b);
    /* Another seed gives another sequence. */
    s.seed = 43;
    assert_null(em_sampler_init(&b, &s, 3));
    s.seed = 42;
    assert_null(em_sampler_init(&a, &s, 3));
    int differ = 0;
    for (int i = 0; i < 64; i++) {
        float la[3], lb[3];
        memcpy(la, logits, sizeof la);
        memcpy(lb, logits, sizeof lb);
        differ += em_sampler_sample(&a, la, NULL, NULL, 0, NULL, NULL, NULL) != em_sampler_sample(&b, lb, NULL, NULL, 0, NULL, NULL, NULL);
    }
    assert_true(differ > 10);
    em_sampler_free(&a);
    em_sampler_free(&b);
}

/* Which tokens can ever come out under a filter, over many seeds. */
static unsigned reachable(ember_sampling s, const float *logits, uint32_t n) {
    unsigned mask = 0;
    for (uint64_t seed = 0; seed < 400; seed++) {
        s.seed = seed;
        mask |= 1u << sample_once(&s, logits, n, NULL, 0);
    }
    return mask;
}

static void test_filters(void **state) {
    (void)state;
    float logits[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    ember_sampling s = defaults();
    s.temperature = 1.0f;
    s.top_k = 0;
    s.top_p = 1.0f;
    s.min_p = 0.0f;
    assert_int_equal(reachable(s, logits, 4), 0xF);
    s.top_k = 2;
    assert_int_equal(reachable(s, logits, 4), 0x3);
    s.top_k = 1;
    assert_int_equal(reachable(s, logits, 4), 0x1);
    s.top_k = 0;
    s.top_p = 0.65f; /* 0.4 + 0.3 reaches it */
    assert_int_equal(reachable(s, logits, 4), 0x3);
    s.top_p = 0.75f; /* needs the third */
    assert_int_equal(reachable(s, logits, 4), 0x7);
    s.top_p = 1.0f;
    s.min_p = 0.5f; /* keep p >= 0.2 */
    assert_int_equal(reachable(s, logits, 4), 0x7);
    s.min_p = 0.7f; /* keep p >= 0.28 */
    assert_int_equal(reachable(s, logits, 4), 0x3);
    /* A low temperature sharpens: at T = 0.01 the runner-up has odds (0.3/0.4)^100 ≈ 3e-13. */
    s.min_p = 0.0f;
    s.temperature = 0.01f;
    assert_int_equal(reachable(s, logits, 4), 0x1);
}

static void test_logprobs(void **state) {
    (void)state;
    float logits[4] = {logf(0.1f) + 3, logf(0.6f) + 3, logf(0.2f) + 3, logf(0.1f) + 3};
    ember_sampling s = greedy();
    s.logprobs = 2;
    em_sampler sampler;
    assert_null(em_sampler_init(&sampler, &s, 4));
    float lp = 0;
    ember_top_logprob top[2];
    int n_top = -1;
    int32_t token = em_sampler_sample(&sampler, logits, NULL, NULL, 0, &lp, top, &n_top);
    assert_int_equal(token, 1);
    assert_true(fabsf(lp - logf(0.6f)) < 1e-5f);
    assert_int_equal(n_top, 2);
    assert_int_equal(top[0].token, 1);
    assert_int_equal(top[1].token, 2);
    assert_true(fabsf(top[1].logprob - logf(0.2f)) < 1e-5f);
    em_sampler_free(&sampler);
}

static void test_bad_parameters(void **state) {
    (void)state;
    em_sampler sampler;
    ember_sampling s = defaults();
    s.temperature = -1;
    em_err err = em_sampler_init(&sampler, &s, 10);
    assert_non_null(err);
    assert_non_null(strstr(em_err_message(err), "temperature"));
    em_err_free(err);
    s = defaults();
    s.top_p = 0;
    err = em_sampler_init(&sampler, &s, 10);
    assert_non_null(strstr(em_err_message(err), "top_p"));
    em_err_free(err);
    s = defaults();
    ember_logit_bias bias = {10, 1.0f};
    s.logit_bias = &bias;
    s.n_logit_bias = 1;
    err = em_sampler_init(&sampler, &s, 10);
    assert_non_null(strstr(em_err_message(err), "token 10"));
    em_err_free(err);
    s = defaults();
    s.logprobs = 21;
    err = em_sampler_init(&sampler, &s, 10);
    assert_non_null(strstr(em_err_message(err), "logprobs"));
    em_err_free(err);
}

/* Feeds pieces and returns everything released, and which stop matched. */
static int run_stops(const char *const *stops, size_t n_stops, const char *const *pieces, size_t n_pieces, char *out) {
    em_stop_matcher m;
    assert_null(em_stop_init(&m, stops, n_stops));
    out[0] = '\0';
    int matched = -1;
    for (size_t i = 0; i < n_pieces && matched < 0; i++) {
        const char *release;
        size_t len;
        em_err err;
        matched = em_stop_feed(&m, pieces[i], strlen(pieces[i]), &release, &len, &err);
        assert_null(err);
        strncat(out, release, len);
        strcat(out, "|");
    }
    if (matched < 0) {
        const char *release;
        size_t len;
        em_stop_flush(&m, &release, &len);
        strncat(out, release, len);
    }
    em_stop_free(&m);
    return matched;
}

static void test_stop_strings(void **state) {
    (void)state;
    char out[256];
    const char *stops[] = {"STOP", "\n\nUser:"};
    const char *pieces1[] = {"Hello", " wor", "ld ST", "OP and more"};
    assert_int_equal(run_stops(stops, 2, pieces1, 4, out), 0);
    assert_string_equal(out, "Hello| wor|ld ||"); /* "ST" held back, then dropped with the stop */
    const char *pieces2[] = {"a S", "T", "x", "\n\nUs", "er", ":"};
    assert_int_equal(run_stops(stops, 2, pieces2, 6, out), 1);
    assert_string_equal(out, "a ||STx||||"); /* "ST" released once "x" decides it */
    const char *pieces3[] = {"no stop ", "S"};
    assert_int_equal(run_stops(stops, 2, pieces3, 2, out), -1);
    assert_string_equal(out, "no stop ||S"); /* held-back text comes out at the end */
    const char *pieces4[] = {"xSTOPySTOP"};
    assert_int_equal(run_stops(stops, 2, pieces4, 1, out), 0);
    assert_string_equal(out, "x|");
    const char *empty[] = {""};
    em_stop_matcher m;
    em_err err = em_stop_init(&m, empty, 1);
    assert_non_null(strstr(em_err_message(err), "empty"));
    em_err_free(err);
}


/* ---- The pick rule (backend/pick.h) ---- */

static int by_rank(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y;
}

/* The rule written the slow, obvious way: sort everything, cut, score every kept token. */
static int32_t reference_pick(const float *l, uint32_t n, const em_pick_params *p) {
    uint64_t *keys = malloc(n * sizeof *keys);
    uint32_t kept = 0, top = 0;
    for (uint32_t i = 0; i < n; i++)
        if (!isnan(l[i]) && (isnan(l[top]) || l[i] > l[top])) top = i;
    const float max = l[top];
    if (p->temperature == 0 || !isfinite(max)) {
        free(keys);
        return (int32_t)top;
    }
    for (uint32_t i = 0; i < n; i++)
        if (isfinite(l[i]) && l[i] >= max + p->min_p_shift) keys[kept++] = em_pick_key(l[i], i);
    qsort(keys, kept, sizeof *keys, by_rank);
    if (p->top_k && p->top_k < kept) kept = p->top_k;
    if (p->top_p < 1) {
        uint64_t total = 0, reached = 0;
        for (uint32_t k = 0; k < kept; k++) total += em_pick_mass(l[em_pick_key_index(keys[k])], max, p->temperature);
        uint32_t prefix = 0;
        while (prefix < kept && reached < em_pick_mass_target(total, p->top_p))
            reached += em_pick_mass(l[em_pick_key_index(keys[prefix++])], max, p->temperature);
        kept = prefix;
    }
    double best = -INFINITY;
    uint32_t chosen = 0;
    for (uint32_t k = 0; k < kept; k++) {
        uint32_t i = em_pick_key_index(keys[k]);
        double score = em_pick_score(l[i], p->temperature, em_pick_bits(p->seed, p->counter, i));
        if (score > best || (score == best && i < chosen)) best = score, chosen = i;
    }
    free(keys);
    return (int32_t)chosen;
}

/* Frequencies over many counters match softmax(l / T) over the kept set (chi-square, 5 dof). */
static void test_pick_distribution(void **state) {
    (void)state;
    const float l[8] = {2.0f, 1.5f, 1.5f, 0.5f, 0.0f, -1.0f, -3.0f, -INFINITY};
    struct { int top_k; float top_p, min_p; unsigned kept; } cases[] = {
        {0, 1.0f, 0.0f, 0x7F}, {3, 1.0f, 0.0f, 0x07}, {0, 1.0f, 0.05f, 0x1F}, {0, 0.95f, 0.0f, 0x0F}, {2, 0.8f, 0.0f, 0x03},
    };
    const float t = 0.7f;
    uint64_t keys[16];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double weight[8] = {0}, total = 0;
        for (int i = 0; i < 8; i++)
            if (cases[c].kept >> i & 1) total += weight[i] = exp((l[i] - l[0]) / t);
        int counts[8] = {0};
        const int draws = 40000;
        for (int d = 0; d < draws; d++) {
            em_pick_params p = em_pick_params_make(t, cases[c].top_k, cases[c].top_p, cases[c].min_p, 7, (uint64_t)d);
            int32_t token = em_pick(l, 8, &p, keys);
            assert_true(cases[c].kept >> token & 1);
            counts[token]++;
        }
        double chi2 = 0;
        for (int i = 0; i < 8; i++)
            if (weight[i] > 0) {
                double expected = draws * weight[i] / total;
                chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
            }
        assert_true(chi2 < 25.0); /* p < 1e-4 for up to 6 degrees of freedom */
    }
}

/* Ties, argmax, determinism per (seed, counter), and the fast rule against the obvious one. */
static void test_pick_rule(void **state) {
    (void)state;
    uint64_t keys[16];
    const float tied[5] = {1.0f, 3.0f, 3.0f, 3.0f, -1.0f};
    em_pick_params p = em_pick_params_make(0, 0, 1, 0, 1, 0);
    assert_int_equal(em_pick(tied, 5, &p, keys), 1);
    for (uint64_t counter = 0; counter < 200; counter++) { /* top_k 2 keeps the lower ids of a tie */
        p = em_pick_params_make(1.0f, 2, 1.0f, 0, 5, counter);
        int32_t token = em_pick(tied, 5, &p, keys);
        assert_true(token == 1 || token == 2);
        assert_int_equal(token, em_pick(tied, 5, &p, keys));
    }
    const float forced[3] = {0.0f, INFINITY, 1.0f};
    p = em_pick_params_make(1.0f, 0, 1, 0, 5, 3);
    assert_int_equal(em_pick(forced, 3, &p, keys), 1);
    const float none[2] = {-INFINITY, -INFINITY};
    assert_int_equal(em_pick(none, 2, &p, keys), 0);

    enum { N = 128256 };
    float *l = malloc(N * sizeof *l);
    uint64_t *scratch = malloc(2 * N * sizeof *scratch);
    uint64_t rng = 11;
    for (int i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((rng >> 40) % 20000) / 1000.0f - 8.0f; /* ties happen: 20000 values */
    }
    struct { float t; int top_k; float top_p, min_p; } cases[] = {
        {0.0f, 0, 1, 0}, {0.7f, 0, 1, 0}, {0.7f, 40, 1, 0}, {0.7f, 0, 0.9f, 0}, {0.7f, 0, 1, 0.05f}, {1.3f, 40, 0.9f, 0.05f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (uint64_t counter = 0; counter < 4; counter++) {
            p = em_pick_params_make(cases[c].t, cases[c].top_k, cases[c].top_p, cases[c].min_p, 99, counter);
            assert_int_equal(em_pick(l, N, &p, scratch), reference_pick(l, N, &p));
        }
    free(l);
    free(scratch);
}

/* The sampler's draws are the rule's, counter by counter; bias and penalties come first. */
static void test_sampler_uses_rule(void **state) {
    (void)state;
    float logits[6] = {0.5f, 1.0f, 0.2f, -0.3f, 0.9f, 0.0f};
    ember_sampling s = defaults();
    s.temperature = 0.9f, s.top_k = 4, s.top_p = 0.95f, s.min_p = 0.02f, s.seed = 1234;
    em_sampler a;
    assert_null(em_sampler_init(&a, &s, 6));
    assert_true(em_sampler_plain(&a));
    uint64_t keys[12];
    for (uint64_t counter = 0; counter < 50; counter++) {
        em_pick_params p = em_sampler_pick_params(&a);
        assert_true(p.counter == counter);
        float work[6];
        memcpy(work, logits, sizeof work);
        int32_t expect = em_pick(logits, 6, &p, keys);
        assert_int_equal(em_sampler_sample(&a, work, NULL, NULL, 0, NULL, NULL, NULL), expect);
    }
    em_sampler_free(&a);
    s.logprobs = 1;
    assert_null(em_sampler_init(&a, &s, 6));
    assert_false(em_sampler_plain(&a));
    em_sampler_free(&a);
}

static int compare_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Top-n logprobs over a large random vocabulary equal the n largest by a full sort. */
static void test_top_selection_large(void **state) {
    (void)state;
    enum { N = 50000, K = 20 };
    static float logits[N], sorted[N];
    uint64_t rng = 3;
    for (int i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        logits[i] = (float)((rng >> 40) % 100000) / 1000.0f;
    }
    memcpy(sorted, logits, sizeof sorted);
    qsort(sorted, N, sizeof *sorted, compare_desc);
    ember_sampling p = greedy();
    p.logprobs = K;
    em_sampler s;
    assert_null(em_sampler_init(&s, &p, N));
    float lp;
    ember_top_logprob top[K];
    int n_top;
    static float work[N];
    memcpy(work, logits, sizeof work);
    em_sampler_sample(&s, work, NULL, NULL, 0, &lp, top, &n_top);
    assert_int_equal(n_top, K);
    for (int i = 0; i < K; i++) {
        assert_true(logits[top[i].token] == sorted[i]);
        if (i) assert_true(top[i - 1].logprob >= top[i].logprob);
    }
    em_sampler_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_bias_penalties), cmocka_unit_test(test_seed_determinism_and_distribution),
        cmocka_unit_test(test_filters),               cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_bad_parameters),        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_top_selection_large),   cmocka_unit_test(test_pick_distribution),
        cmocka_unit_test(test_pick_rule),             cmocka_unit_test(test_sampler_uses_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
