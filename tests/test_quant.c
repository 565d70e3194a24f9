/*
 * quant tests: golden dequantization and quantization against the reference fixture (produced by
 * the GGUF tooling's numpy reference, not by Ember), error bounds of the searching quantizers on
 * Gaussian data, dot products against decoded rows, and the scalar conversions.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gguf/gguf.h"
#include "quant/internal.h"
#include "quant/quant.h"

#define FIXTURE EM_FIXTURES_DIR "/quant-reference.gguf"
#define FIXTURE_ELEMS (512 * 8)

/* The 24 formats the fixture holds. */
static const char *const golden_types[] = {"F16",     "BF16",   "Q4_0",    "Q4_1",  "Q5_0",  "Q5_1",
                                           "Q8_0",    "Q2_K",   "Q3_K",    "Q4_K",  "Q5_K",  "Q6_K",
                                           "IQ2_XXS", "IQ2_XS", "IQ2_S",   "IQ3_XXS", "IQ3_S", "IQ1_S",
                                           "IQ1_M",   "IQ4_NL", "IQ4_XS",  "TQ1_0", "TQ2_0", "MXFP4"};

/* Formats whose reference quantizer output the fixture holds (T.src -> T.quant). */
static const char *const exact_quant_types[] = {"F16",  "BF16", "Q8_0", "Q4_0",  "Q4_1",
                                                "Q5_0", "Q5_1", "MXFP4", "TQ1_0", "TQ2_0"};

static int open_fixture(void **state) {
    em_gguf *gguf = NULL;
    em_err err = em_gguf_open(FIXTURE, &gguf);
    if (err) {
        fprintf(stderr, "cannot open %s: %s\n", FIXTURE, em_err_message(err));
        em_err_free(err);
        return -1;
    }
    *state = gguf;
    return 0;
}

static int close_fixture(void **state) {
    em_gguf_close(*state);
    return 0;
}

static const em_gguf_tensor *tensor(const em_gguf *gguf, const char *type_name, const char *suffix) {
    char name[64];
    snprintf(name, sizeof name, "%s.%s", type_name, suffix);
    const em_gguf_tensor *t = em_gguf_find_tensor(gguf, name);
    if (!t) fail_msg("fixture has no tensor %s", name);
    assert_int_equal(em_gguf_tensor_elems(t), FIXTURE_ELEMS);
    return t;
}

static em_type type_named(const char *name) {
    em_type type;
    em_err err = em_type_from_name(name, &type);
    if (err) fail_msg("%s", em_err_message(err));
    return type;
}

static void assert_ok(em_err err) {
    if (err) fail_msg("unexpected error: %s", em_err_message(err));
}

/* ---- golden dequantization ---- */

/* F16 and BF16 must decode bit for bit. The others allow |ours - ref| <= 1e-6 * max(1, |ref|) per
 * element: an absolute 1e-6 for values below 1 and a relative 1e-6 above, a few f32 ulps, enough
 * for a different but equally valid order of the f32 multiplications. */
static void test_golden_dequantize(void **state) {
    const em_gguf *gguf = *state;
    float *ours = malloc(FIXTURE_ELEMS * sizeof(float));
    assert_non_null(ours);
    for (size_t t = 0; t < sizeof golden_types / sizeof *golden_types; t++) {
        const char *name = golden_types[t];
        const em_gguf_tensor *q = tensor(gguf, name, "q"), *deq = tensor(gguf, name, "deq");
        assert_int_equal(q->type, type_named(name));
        assert_int_equal(deq->type, EM_TYPE_F32);
        assert_ok(em_dequantize(q->type, q->data, ours, FIXTURE_ELEMS));
        const float *ref = deq->data;
        bool exact = !strcmp(name, "F16") || !strcmp(name, "BF16");
        int bad = 0, first = -1;
        for (int i = 0; i < FIXTURE_ELEMS; i++) {
            bool ok = exact ? memcmp(&ours[i], &ref[i], sizeof(float)) == 0
                            : fabsf(ours[i] - ref[i]) <= 1e-6f * fmaxf(1.0f, fabsf(ref[i]));
            if (!ok && bad++ == 0) first = i;
        }
        if (bad)
            fail_msg("%s: %d of %d elements differ, first at %d: ours %.9g reference %.9g", name, bad, FIXTURE_ELEMS,
                     first, (double)ours[first], (double)ref[first]);
    }
    free(ours);
}

/* ---- golden quantization: the exact bytes of the reference quantizer ---- */

static void test_golden_quantize(void **state) {
    const em_gguf *gguf = *state;
    for (size_t t = 0; t < sizeof exact_quant_types / sizeof *exact_quant_types; t++) {
        const char *name = exact_quant_types[t];
        em_type type = type_named(name);
        const em_gguf_tensor *src = tensor(gguf, name, "src"), *ref = tensor(gguf, name, "quant");
        assert_int_equal(ref->type, type);
        assert_true(em_type_can_quantize(type));
        uint8_t *ours = malloc(ref->size);
        assert_non_null(ours);
        assert_ok(em_quantize(type, src->data, ours, FIXTURE_ELEMS));
        if (memcmp(ours, ref->data, ref->size) != 0) {
            const uint8_t *r = ref->data;
            uint64_t i = 0;
            while (ours[i] == r[i]) i++;
            uint32_t block = em_type_info_of(type)->block_bytes;
            fail_msg("%s: quantized bytes differ first at byte %llu (block %llu, offset %llu): ours %02x reference %02x",
                     name, (unsigned long long)i, (unsigned long long)(i / block), (unsigned long long)(i % block),
                     ours[i], r[i]);
        }
        free(ours);
    }
}

/* ---- error of the searching quantizers on Gaussian data ---- */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s) { return ((double)(rng_next(s) >> 11) + 0.5) * 0x1p-53; }

static void fill_gaussian(float *x, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i += 2) { /* Box-Muller */
        double r = sqrt(-2.0 * log(rng_uniform(&seed))), a = 2.0 * 3.14159265358979323846 * rng_uniform(&seed);
        x[i] = (float)(r * cos(a));
        if (i + 1 < n) x[i + 1] = (float)(r * sin(a));
    }
}

/* rms(x - dequantize(quantize(x))) / rms(x) */
static double relative_rms_error(em_type type, const float *x, size_t n) {
    uint64_t bytes;
    assert_ok(em_type_row_bytes(type, n, &bytes));
    uint8_t *q = malloc(bytes);
    float *y = malloc(n * sizeof(float));
    assert_non_null(q);
    assert_non_null(y);
    assert_ok(em_quantize(type, x, q, n));
    assert_ok(em_dequantize(type, q, y, n));
    double err = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        err += (double)(x[i] - y[i]) * (double)(x[i] - y[i]);
        ref += (double)x[i] * (double)x[i];
    }
    free(q);
    free(y);
    return sqrt(err / ref);
}

#define GAUSS_N 65536

/* Bounds sit a little above what these quantizers reach (printed), so a regression fails. */
static void test_quantize_error_bounds(void **state) {
    (void)state;
    static const struct {
        const char *name;
        double bound;
    } cases[] = {
        {"Q8_K", 0.0072}, {"Q8_0", 0.0055}, {"Q6_K", 0.0180}, {"Q5_K", 0.0375}, {"Q5_1", 0.0400},
        {"Q5_0", 0.0445}, {"Q4_K", 0.0750}, {"Q4_1", 0.0830}, {"Q4_0", 0.0900}, {"IQ4_NL", 0.0790},
        {"IQ4_XS", 0.0790}, {"MXFP4", 0.1200}, {"Q3_K", 0.1500}, {"Q2_K", 0.2800}, {"IQ3_XXS", 0.1900}, {"TQ2_0", 0.8500},
    };
    float *x = malloc(GAUSS_N * sizeof(float));
    assert_non_null(x);
    fill_gaussian(x, GAUSS_N, 1234);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        double e = relative_rms_error(type_named(cases[c].name), x, GAUSS_N);
        printf("relative rms error %-7s %.4f (bound %.4f)\n", cases[c].name, e, cases[c].bound);
        if (!(e <= cases[c].bound)) fail_msg("%s: relative rms error %.4f above %.4f", cases[c].name, e, cases[c].bound);
    }
    free(x);
}

/* Quantizers must survive degenerate blocks: all zero (decodes to zero) and constant blocks. */
static void test_quantize_degenerate_blocks(void **state) {
    (void)state;
    static const char *const types[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                                        "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "MXFP4", "TQ1_0", "TQ2_0"};
    float zeros[256] = {0}, twos[256], out[256];
    for (int i = 0; i < 256; i++) twos[i] = 2.0f;
    uint8_t q[512];
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        em_type type = type_named(types[t]);
        assert_ok(em_quantize(type, zeros, q, 256));
        assert_ok(em_dequantize(type, q, out, 256));
        for (int i = 0; i < 256; i++)
            if (out[i] != 0) fail_msg("%s: zero block decodes to %g at %d", types[t], (double)out[i], i);
        assert_ok(em_quantize(type, twos, q, 256));
        assert_ok(em_dequantize(type, q, out, 256));
        for (int i = 0; i < 256; i++)
            if (fabsf(out[i] - 2.0f) > 0.02f) fail_msg("%s: constant 2 decodes to %g at %d", types[t], (double)out[i], i);
    }
}

/* Non-finite input is garbage, but quantizing it (with or without importance) must return normally:
 * no trap and no undefined float-to-int conversion (a sanitizer build with float-cast-overflow checks catches those). */
static void test_quantize_non_finite_input(void **state) {
    (void)state;
    static const char *const types[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                                        "Q8_K", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "MXFP4", "TQ1_0", "TQ2_0"};
    float x[512], out[512], ones[256];
    uint8_t q[1024];
    for (int i = 0; i < 256; i++) ones[i] = 1;
    fill_gaussian(x, 512, 77);
    x[3] = NAN;
    x[260] = INFINITY;
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        em_type type = type_named(types[t]);
        assert_ok(em_quantize(type, x, q, 512));
        assert_ok(em_dequantize(type, q, out, 512));
        assert_ok(em_quantize_rows(type, x, q, 2, 256, ones));
        assert_ok(em_dequantize(type, q, out, 512));
    }
}

/* ---- importance-weighted quantization (em_quantize_rows) ----
 * The bytes are checked against llama.cpp's own library in tests/cli/imatrix_peer.sh; these are the
 * properties that hold whatever the reference. */

static const char *const weighted_types[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",   "Q2_K",   "Q3_K",
                                             "Q4_K", "Q5_K", "Q6_K", "F16",  "IQ4_NL", "IQ4_XS", "IQ3_XXS"};

#define W_ROWS 16
#define W_COLS 512

/* Importance spanning orders of magnitude across columns, as real ones do (a few hot columns). */
static void fill_skewed_importance(float *importance, size_t n, uint64_t seed) {
    fill_gaussian(importance, n, seed);
    for (size_t c = 0; c < n; c++) importance[c] = expf(2.5f * importance[c]);
}

/* sum over rows and columns of importance[c] * (x - dequantize(quantize(x)))^2, quantized with
 * `used` (NULL: unweighted). */
static double weighted_error(em_type type, const float *x, const float *importance, const float *used) {
    uint64_t row_bytes;
    assert_ok(em_type_row_bytes(type, W_COLS, &row_bytes));
    uint8_t *q = malloc(W_ROWS * row_bytes);
    float *y = malloc(W_ROWS * W_COLS * sizeof(float));
    assert_non_null(q);
    assert_non_null(y);
    assert_ok(em_quantize_rows(type, x, q, W_ROWS, W_COLS, used));
    assert_ok(em_dequantize(type, q, y, W_ROWS * W_COLS));
    double err = 0;
    for (size_t i = 0; i < W_ROWS * W_COLS; i++) err += importance[i % W_COLS] * (double)(x[i] - y[i]) * (x[i] - y[i]);
    free(q);
    free(y);
    return err;
}

/* With a skewed importance vector, quantizing with it gives a smaller importance-weighted error than
 * quantizing without, for every type that takes weights; for the types llama.cpp quantizes without
 * weights (Q8_0, F16) the two are the same. */
static void test_weighted_error_is_lower(void **state) {
    (void)state;
    float *x = malloc(W_ROWS * W_COLS * sizeof(float)), importance[W_COLS];
    assert_non_null(x);
    fill_gaussian(x, W_ROWS * W_COLS, 99);
    for (size_t i = 0; i < W_ROWS * W_COLS; i += 97) x[i] *= 6; /* some outliers */
    fill_skewed_importance(importance, W_COLS, 5);
    for (size_t t = 0; t < sizeof weighted_types / sizeof *weighted_types; t++) {
        em_type type = type_named(weighted_types[t]);
        double with = weighted_error(type, x, importance, importance);
        double without = weighted_error(type, x, importance, NULL);
        printf("importance-weighted error %-7s %.6g with the importance, %.6g without (%.3f)\n", weighted_types[t],
               with, without, with / without);
        if (type == EM_TYPE_Q8_0 || type == EM_TYPE_F16) {
            if (with != without) fail_msg("%s: weights changed a type that ignores them", weighted_types[t]);
        } else if (!(with < without)) {
            fail_msg("%s: weighted error %g not below the unweighted %g", weighted_types[t], with, without);
        }
    }
    free(x);
}

/* The contract of em_quantize_rows: NULL importance is em_quantize byte for byte; the weighted
 * algorithms depend on importance ratios only, so scaling it by a power of two (exact in floats)
 * changes no byte; unit importance is not the unweighted path (llama.cpp's weighted algorithms are
 * other algorithms than its unweighted ones, and Ember follows them) except where weights are
 * ignored (Q8_0, F16); a row length the block does not divide is an error. */
static void test_weighted_contract(void **state) {
    (void)state;
    float *x = malloc(W_ROWS * W_COLS * sizeof(float)), importance[W_COLS], scaled[W_COLS], unit[W_COLS];
    uint8_t *a = malloc(W_ROWS * W_COLS * 2), *b = malloc(W_ROWS * W_COLS * 2);
    assert_non_null(x);
    assert_non_null(a);
    assert_non_null(b);
    fill_gaussian(x, W_ROWS * W_COLS, 31);
    fill_skewed_importance(importance, W_COLS, 17);
    for (size_t c = 0; c < W_COLS; c++) {
        scaled[c] = importance[c] * 4;
        unit[c] = 1;
    }
    for (size_t t = 0; t < sizeof weighted_types / sizeof *weighted_types; t++) {
        const char *name = weighted_types[t];
        em_type type = type_named(name);
        uint64_t bytes;
        assert_ok(em_type_row_bytes(type, W_ROWS * W_COLS, &bytes));
        assert_ok(em_quantize_rows(type, x, a, W_ROWS, W_COLS, NULL));
        assert_ok(em_quantize(type, x, b, W_ROWS * W_COLS));
        if (memcmp(a, b, bytes)) fail_msg("%s: NULL importance is not em_quantize", name);
        assert_ok(em_quantize_rows(type, x, a, W_ROWS, W_COLS, importance));
        assert_ok(em_quantize_rows(type, x, b, W_ROWS, W_COLS, scaled));
        if (memcmp(a, b, bytes)) fail_msg("%s: importance x 4 changed the bytes", name);
        assert_ok(em_quantize_rows(type, x, a, W_ROWS, W_COLS, unit));
        assert_ok(em_quantize(type, x, b, W_ROWS * W_COLS));
        bool same = memcmp(a, b, bytes) == 0, ignores = type == EM_TYPE_Q8_0 || type == EM_TYPE_F16;
        if (same != ignores)
            fail_msg("%s: unit importance %s the unweighted bytes", name, same ? "gave" : "did not give");
    }
    em_err err = em_quantize_rows(EM_TYPE_Q4_K, x, a, 2, 100, importance);
    assert_non_null(err);
    em_err_free(err);
    free(x);
    free(a);
    free(b);
}

/* ---- dot products ---- */

/* Each weight row from the fixture (8 rows of 512 of every type) against a random activation row:
 * em_dot must equal the f64 dot of the decoded weights with the f32 activations to within the
 * activation quantization. A Q8 level is off by at most half a step, step = max|x| / 127, plus
 * (Q8_0) the f16 rounding of the step, 2^-11 relative, times up to 127 steps: per element at most
 * max|x| * (1/254 + 1/2048) < max|x| / 200. So |em_dot - exact| <= sum|w| * max|x| / 200, plus
 * f32 rounding. em_dot and em_dot_scalar must agree with em_dot_reference (same quantized
 * activations) to 1e-5 of sum|w * a|: only summation order differs there. */
static void test_dot_matches_dequantized_rows(void **state) {
    const em_gguf *gguf = *state;
    float x[512], w[512], a[512];
    uint8_t act[512 * sizeof(float)]; /* f32 activations are the largest format */
    uint64_t seed = 99;
    for (size_t t = 0; t < sizeof golden_types / sizeof *golden_types; t++) {
        const em_gguf_tensor *q = tensor(gguf, golden_types[t], "q");
        em_type type = q->type, act_type = em_dot_activation_type(type);
        uint64_t row_bytes;
        assert_ok(em_type_row_bytes(type, 512, &row_bytes));
        for (int row = 0; row < 8; row++) {
            const uint8_t *wrow = (const uint8_t *)q->data + row * row_bytes;
            fill_gaussian(x, 512, seed++);
            assert_ok(em_dequantize(type, wrow, w, 512));
            assert_ok(em_quantize_activation(type, x, act, 512));
            assert_ok(em_dequantize(act_type, act, a, 512));
            double exact = 0, abs_wx = 0, abs_wa = 0, sum_w = 0, max_x = 0;
            for (int i = 0; i < 512; i++) {
                exact += (double)w[i] * x[i];
                abs_wx += fabs((double)w[i] * x[i]);
                abs_wa += fabs((double)w[i] * a[i]);
                sum_w += fabs((double)w[i]);
                max_x = fmax(max_x, fabs((double)x[i]));
            }
            float fast = em_dot(type, wrow, act, 512);
            em_dot_fn kernel = em_dot_kernel(type);
            if (!kernel) fail_msg("%s: no dot kernel", golden_types[t]);
            assert_true(kernel(wrow, act, 512) == fast);
            float scalar = em_dot_scalar(type, wrow, act, 512);
            float reference = em_dot_reference(type, wrow, act, 512);
            double act_tol = act_type == EM_TYPE_F32 ? 1e-5 * abs_wx : sum_w * max_x / 200 + 1e-5 * abs_wx;
            if (!(fabs(fast - exact) <= act_tol))
                fail_msg("%s row %d: em_dot %.7g, decoded dot %.7g (tolerance %.3g)", golden_types[t], row,
                         (double)fast, exact, act_tol);
            double tight = 1e-5 * abs_wa + 1e-30;
            if (!(fabs(fast - reference) <= tight) || !(fabs(scalar - reference) <= tight))
                fail_msg("%s row %d: em_dot %.7g, em_dot_scalar %.7g, em_dot_reference %.7g", golden_types[t], row,
                         (double)fast, (double)scalar, (double)reference);
        }
    }
}

/* Longer rows through every path (the SIMD kernels unroll over several blocks): em_dot and
 * em_dot_scalar agree with em_dot_reference to 1e-5 of sum|w * a| (summation order only). */
static void test_dot_long_rows(void **state) {
    (void)state;
    static const char *const types[] = {"F32",  "F16",  "BF16", "Q8_0", "Q4_0", "Q4_1",   "Q5_0",    "Q5_1",  "IQ4_NL",
                                        "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_XXS", "TQ1_0",
                                        "TQ2_0"};
    enum { N = 4096 + 256 };
    float *w = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float));
    float *wd = malloc(N * sizeof(float)), *ad = malloc(N * sizeof(float));
    uint8_t *wq = malloc(N * 4), *aq = malloc(N * 4);
    assert_true(w && x && wd && ad && wq && aq);
    fill_gaussian(w, N, 5);
    fill_gaussian(x, N, 6);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        em_type type = type_named(types[t]);
        assert_ok(em_quantize(type, w, wq, N));
        assert_ok(em_quantize_activation(type, x, aq, N));
        assert_ok(em_dequantize(type, wq, wd, N));
        assert_ok(em_dequantize(em_dot_activation_type(type), aq, ad, N));
        double abs_wa = 0;
        for (int i = 0; i < N; i++) abs_wa += fabs((double)wd[i] * ad[i]);
        float reference = em_dot_reference(type, wq, aq, N);
        float fast = em_dot(type, wq, aq, N), scalar = em_dot_scalar(type, wq, aq, N);
        if (!(fabs(fast - reference) <= 1e-5 * abs_wa) || !(fabs(scalar - reference) <= 1e-5 * abs_wa))
            fail_msg("%s: em_dot %.7g em_dot_scalar %.7g reference %.7g (sum|w*a| %.4g)", types[t], (double)fast,
                     (double)scalar, (double)reference, abs_wa);
    }
    free(w);
    free(x);
    free(wd);
    free(ad);
    free(wq);
    free(aq);
}

/* Blocks at the extremes of their ranges (every weight and activation at its largest level) must
 * not overflow the 16-bit intermediate sums SIMD kernels use: em_dot equals the reference. */
static void test_dot_extreme_values(void **state) {
    (void)state;
    static const char *const types[] = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K",
                                        "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_XXS", "TQ1_0", "TQ2_0"};
    enum { N = 512 };
    float w[N], x[N];
    uint8_t wq[N * 2], aq[N * 2];
    for (int pattern = 0; pattern < 3; pattern++) {
        for (int i = 0; i < N; i++) {
            /* constant blocks, alternating-sign blocks, and a sign flip every element */
            float sign = pattern == 0 ? 1.0f : pattern == 1 ? ((i / 32) % 2 ? -1.0f : 1.0f) : (i % 2 ? -1.0f : 1.0f);
            w[i] = sign;
            x[i] = pattern == 2 ? -sign : sign;
        }
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            em_type type = type_named(types[t]);
            assert_ok(em_quantize(type, w, wq, N));
            assert_ok(em_quantize_activation(type, x, aq, N));
            float reference = em_dot_reference(type, wq, aq, N);
            float fast = em_dot(type, wq, aq, N), scalar = em_dot_scalar(type, wq, aq, N);
            double tol = 1e-5 * fabs((double)reference) + 1e-3;
            if (!(fabs(fast - reference) <= tol) || !(fabs(scalar - reference) <= tol))
                fail_msg("%s pattern %d: em_dot %.7g em_dot_scalar %.7g reference %.7g", types[t], pattern,
                         (double)fast, (double)scalar, (double)reference);
        }
    }
}

/* em_dot_rows must equal em_dot row by row, bitwise (the batched forward pass relies on it to
 * give the same numbers as one token at a time): every dot type, 1 to 37 activation rows (past the
 * kernels' groups of four and eight, and odd counts), rows spaced wider than their size, each row
 * drawn at its own scale. ctest runs this file twice, the second time with EMBER_CPU_ISA=avx2, so
 * on a CPU with AVX-512 VNNI both kernel families are held to em_dot. */
static void test_dot_rows_equal_single_rows(void **state) {
    (void)state;
    static const char *const types[] = {"F32",  "F16",  "BF16", "Q8_0", "Q4_0", "Q4_1",   "Q5_0",    "Q5_1",  "IQ4_NL",
                                        "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_XXS", "TQ1_0",
                                        "TQ2_0"};
    enum { N = 1024 + 256, ROWS = 37, STRIDE = N * 4 + 64 };
    float *w = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float));
    uint8_t *wq = malloc(N * 4), *aq = malloc((size_t)ROWS * STRIDE);
    assert_true(w && x && wq && aq);
    fill_gaussian(w, N, 11);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        em_type type = type_named(types[t]);
        assert_ok(em_quantize(type, w, wq, N));
        for (int r = 0; r < ROWS; r++) {
            fill_gaussian(x, N, 20 + (unsigned)r);
            for (int i = 0; i < N; i++) x[i] *= (float)(r + 1);
            assert_ok(em_quantize_activation(type, x, aq + (size_t)r * STRIDE, N));
        }
        /* plain float rows may end off the kernels' 32- and 8-element steps: their tails too */
        const uint64_t lengths[2] = {N, em_type_info_of(type)->block_elems == 1 ? N - 13 : N};
        for (int l = 0; l < 2; l++) {
            for (uint32_t n_rows = 1; n_rows <= ROWS; n_rows++) {
                float rows[ROWS];
                em_dot_rows(type, wq, aq, STRIDE, n_rows, lengths[l], rows);
                for (uint32_t r = 0; r < n_rows; r++) {
                    float single = em_dot(type, wq, aq + (size_t)r * STRIDE, lengths[l]);
                    if (memcmp(&single, &rows[r], sizeof single) != 0)
                        fail_msg("%s, n %u, %u rows, row %u: em_dot_rows %.9g, em_dot %.9g", types[t],
                                 (unsigned)lengths[l], n_rows, r, (double)rows[r], (double)single);
                }
            }
        }
    }
    free(w);
    free(x);
    free(wq);
    free(aq);
}

/* The IQ3_XXS level codes (the AVX-512 VBMI kernel's lookup table) spell the grid's points: field k
 * of code i indexes coordinate k of point i among the eight magnitudes. */
static void test_iq3xxs_codes_spell_the_grid(void **state) {
    (void)state;
    static const uint32_t magnitudes[8] = {4, 12, 20, 28, 36, 44, 52, 62};
    for (int i = 0; i < 256; i++) {
        uint32_t point = 0;
        for (int k = 0; k < 4; k++) point |= magnitudes[(em_iq3xxs_codes[i] >> (3 * k)) & 7] << (8 * k);
        if (point != em_iq3xxs_grid[i] || em_iq3xxs_codes[i] >> 12)
            fail_msg("code %d: 0x%03x spells 0x%08x, the grid has 0x%08x", i, em_iq3xxs_codes[i], point,
                     em_iq3xxs_grid[i]);
    }
}

/* em_dot_weights must equal em_dot weight row by weight row and token by token, bitwise (a decode
 * step's products go through it, a batch's through em_dot_rows, and both must give the same
 * numbers): every dot type, 1 to 13 weight rows (past the kernels' groups of four, and each
 * remainder), 1 to EM_DOT_WEIGHTS_TOKENS tokens each with its own activations, rows spaced wider
 * than their size and each quantized from its own values at its own scale, float rows ending off
 * the 32- and 8-element steps, activations at small and large scales. Run on both ISA paths, as
 * the test above. */
/* Rows wider than the activations a Q4_K decode kernel prepares on its stack (64 KB: about 12,000
 * columns at four tokens): the same numbers as em_dot, prepared on the heap. */
static void test_dot_weights_wide_rows(void **state) {
    (void)state;
    enum { N = 16384, WROWS = 5, TOKENS = EM_DOT_WEIGHTS_TOKENS };
    uint64_t row_bytes = 0, act_bytes = 0;
    assert_ok(em_type_row_bytes(EM_TYPE_Q4_K, N, &row_bytes));
    assert_ok(em_type_row_bytes(em_dot_activation_type(EM_TYPE_Q4_K), N, &act_bytes));
    float *x = malloc(N * sizeof(float)), out[TOKENS * WROWS];
    uint8_t *wq = malloc(WROWS * row_bytes), *aq = malloc(TOKENS * act_bytes);
    assert_true(x && wq && aq);
    for (int r = 0; r < WROWS; r++) {
        fill_gaussian(x, N, 90 + (unsigned)r);
        assert_ok(em_quantize(EM_TYPE_Q4_K, x, wq + r * row_bytes, N));
    }
    for (int t = 0; t < TOKENS; t++) {
        fill_gaussian(x, N, 95 + (unsigned)t);
        assert_ok(em_quantize_activation(EM_TYPE_Q4_K, x, aq + t * act_bytes, N));
    }
    for (uint32_t n_tokens = 1; n_tokens <= TOKENS; n_tokens++) {
        em_dot_weights(EM_TYPE_Q4_K, wq, row_bytes, WROWS, aq, act_bytes, n_tokens, N, out, WROWS);
        for (uint32_t t = 0; t < n_tokens; t++)
            for (int r = 0; r < WROWS; r++) {
                const float single = em_dot(EM_TYPE_Q4_K, wq + r * row_bytes, aq + t * act_bytes, N);
                assert_memory_equal(&single, &out[t * WROWS + r], sizeof single);
            }
    }
    free(x);
    free(wq);
    free(aq);
}

static void test_dot_weights_equal_single_rows(void **state) {
    (void)state;
    static const char *const types[] = {"F32",  "F16",  "BF16", "Q8_0", "Q4_0", "Q4_1",   "Q5_0",    "Q5_1",  "IQ4_NL",
                                        "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_XXS", "TQ1_0",
                                        "TQ2_0"};
    enum { N = 1024 + 256, WROWS = 13, STRIDE = N * 4 + 64, TOKENS = EM_DOT_WEIGHTS_TOKENS, ASTRIDE = N * 4 + 32 };
    float *w = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float));
    uint8_t *wq = malloc((size_t)WROWS * STRIDE), *aq = malloc((size_t)TOKENS * ASTRIDE);
    assert_true(w && x && wq && aq);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        em_type type = type_named(types[t]);
        for (int r = 0; r < WROWS; r++) {
            fill_gaussian(w, N, 60 + (unsigned)r);
            for (int i = 0; i < N; i++) w[i] *= (float)(r + 1) * (r % 3 ? 1.0f : 0.02f);
            assert_ok(em_quantize(type, w, wq + (size_t)r * STRIDE, N));
        }
        const uint64_t lengths[2] = {N, em_type_info_of(type)->block_elems == 1 ? N - 13 : N - 256};
        for (int scale = 0; scale < 2; scale++) {
            for (int k = 0; k < TOKENS; k++) {
                fill_gaussian(x, N, 70 + 10 * (unsigned)k + (unsigned)scale);
                for (int i = 0; i < N; i++) x[i] *= scale ? 300.0f / (float)(k + 1) : 0.003f * (float)(k + 1);
                assert_ok(em_quantize_activation(type, x, aq + (size_t)k * ASTRIDE, N));
            }
            for (int l = 0; l < 2; l++)
                for (uint32_t n_tokens = 1; n_tokens <= TOKENS; n_tokens++)
                    for (uint32_t n_rows = 1; n_rows <= WROWS; n_rows++) {
                        float out[TOKENS * (WROWS + 3)];
                        em_dot_weights(type, wq, STRIDE, n_rows, aq, ASTRIDE, n_tokens, lengths[l], out, WROWS + 3);
                        for (uint32_t k = 0; k < n_tokens; k++)
                            for (uint32_t r = 0; r < n_rows; r++) {
                                float single = em_dot(type, wq + (size_t)r * STRIDE, aq + (size_t)k * ASTRIDE,
                                                      lengths[l]);
                                const float got = out[k * (WROWS + 3) + r];
                                if (memcmp(&single, &got, sizeof single) != 0)
                                    fail_msg("%s, n %u, %u weight rows, %u tokens, row %u of token %u: "
                                             "em_dot_weights %.9g, em_dot %.9g",
                                             types[t], (unsigned)lengths[l], n_rows, n_tokens, r, k, (double)got,
                                             (double)single);
                            }
                    }
        }
    }
    free(w);
    free(x);
    free(wq);
    free(aq);
}

/* em_amx_product against em_dot_scalar, bitwise: Q4_K and Q8_0 weights (with blocks of extreme
 * scales, and rows that are all one level) against their activations at several scales, rows on and
 * off the 16-row chunks, tokens on and off the 16-token tiles and their pairs, outputs in a strided
 * matrix that must stay untouched outside the product. The tile unit where the CPU has AMX-INT8,
 * the plain loop over the packed tiles elsewhere (and under EMBER_CPU_ISA=avx2). */
static void check_amx_product(uint32_t type, const uint64_t *lengths, size_t n_lengths) {
    enum { N_MAX = 1024, ROWS = 37, TOKENS = 41, Y_STRIDE = ROWS + 3 };
    const uint32_t act_type = em_dot_activation_type(type);
    uint64_t act_bytes = 0, row_bytes = 0;
    assert_ok(em_type_row_bytes(act_type, N_MAX, &act_bytes));
    assert_ok(em_type_row_bytes(type, N_MAX, &row_bytes));
    const uint64_t tile_max = em_amx_tile_bytes(type, N_MAX);
    assert_true(tile_max > 0 && tile_max <= EM_AMX_TILE_TOKENS * act_bytes); /* fits the backend's scratch */
    float *w = malloc((size_t)ROWS * N_MAX * sizeof(float)), *x = malloc((size_t)N_MAX * sizeof(float));
    uint8_t *wq = malloc((size_t)ROWS * row_bytes), *aq = malloc((size_t)TOKENS * act_bytes);
    uint8_t *tiles = malloc((size_t)(TOKENS + EM_AMX_TILE_TOKENS - 1) / EM_AMX_TILE_TOKENS * tile_max);
    float *y = malloc((size_t)TOKENS * Y_STRIDE * sizeof(float));
    assert_true(w && x && wq && aq && tiles && y);
    for (size_t l = 0; l < n_lengths; l++) {
        const uint64_t n = lengths[l];
        assert_ok(em_type_row_bytes(type, n, &row_bytes));
        assert_ok(em_type_row_bytes(act_type, n, &act_bytes));
        for (int r = 0; r < ROWS; r++) {
            fill_gaussian(w + (size_t)r * n, n, 300 + (unsigned)r);
            for (uint64_t j = 0; j < n; j++) {
                if (r % 7 == 3) w[(size_t)r * n + j] = 1.5f;                        /* one level throughout */
                if (r % 5 == 1 && j % 32 == 0) w[(size_t)r * n + j] *= 50.0f;       /* scales far apart */
            }
        }
        assert_ok(em_quantize_rows(type, w, wq, ROWS, n, NULL));
        for (int t = 0; t < TOKENS; t++) {
            fill_gaussian(x, n, 500 + (unsigned)t);
            for (uint64_t j = 0; j < n; j++) x[j] *= powf(10.0f, (float)(t % 5) - 2.0f);
            assert_ok(em_quantize_activation(type, x, aq + (size_t)t * act_bytes, n));
        }
        const uint64_t tile_bytes = em_amx_tile_bytes(type, n);
        for (uint32_t i = 0; i * EM_AMX_TILE_TOKENS < TOKENS; i++) {
            const uint32_t rows = TOKENS - i * EM_AMX_TILE_TOKENS;
            em_amx_pack(type, aq + (size_t)i * EM_AMX_TILE_TOKENS * act_bytes, act_bytes,
                        rows < EM_AMX_TILE_TOKENS ? rows : EM_AMX_TILE_TOKENS, n, tiles + i * tile_bytes);
        }
        static const uint32_t row_counts[] = {1, 16, 17, ROWS}, token_counts[] = {1, 16, 17, 33, TOKENS};
        for (int rc = 0; rc < 4; rc++)
            for (int tc = 0; tc < 5; tc++) {
                const uint32_t n_rows = row_counts[rc], n_tokens = token_counts[tc];
                for (int i = 0; i < TOKENS * Y_STRIDE; i++) y[i] = NAN;
                assert_ok(em_amx_product(type, wq, row_bytes, n_rows, tiles, n_tokens, n, y, Y_STRIDE));
                for (uint32_t t = 0; t < TOKENS; t++)
                    for (uint32_t r = 0; r < Y_STRIDE; r++) {
                        const float got = y[t * Y_STRIDE + r];
                        if (t >= n_tokens || r >= n_rows) {
                            if (!isnan(got)) fail_msg("amx product wrote outside the output (token %u, row %u)", t, r);
                            continue;
                        }
                        const float want = em_dot_scalar(type, wq + r * row_bytes, aq + t * act_bytes, n);
                        if (memcmp(&got, &want, sizeof got))
                            fail_msg("amx product (%s, type %u), n %u, %u rows x %u tokens, row %u token %u: %.9g, "
                                     "em_dot_scalar %.9g", em_amx_available() ? "tiles" : "plain", type, (unsigned)n,
                                     n_rows, n_tokens, r, t, (double)got, (double)want);
                    }
            }
    }
    free(w);
    free(x);
    free(wq);
    free(aq);
    free(tiles);
    free(y);
}

static void test_amx_product_equals_scalar(void **state) {
    (void)state;
    assert_int_equal(em_amx_tile_bytes(EM_TYPE_Q6_K, 1024), 0); /* types it does not take */
    assert_int_equal(em_amx_tile_bytes(EM_TYPE_Q4_K, 1024 + 32), 0);
    static const uint64_t q4_k_lengths[] = {256, 1024}, q8_0_lengths[] = {32, 96, 1024};
    check_amx_product(EM_TYPE_Q4_K, q4_k_lengths, 2);
    check_amx_product(EM_TYPE_Q8_0, q8_0_lengths, 3);
}

/* em_bf16_tiles against the f32 definition: sum over j of bf16 weight [j] * f32 activation [j], in
 * double. Rounding each activation to bf16 moves it by at most 2^-9 of its size, and the f32 sums
 * of exact bf16 products add far less than that over these lengths, so every result must lie within
 * 2^-8 * sum |w * x| of the definition. Row lengths on and off the kernel's 32-element step, weight
 * rows and tokens on and off its tiles (4 x 6) and bands (32 rows), outputs in a strided matrix,
 * activations at several scales. On a CPU without AVX512_BF16 (or under EMBER_CPU_ISA=avx2) the
 * plain loop is held to the same bound. */
static void test_bf16_tiles_within_bound(void **state) {
    (void)state;
    enum { N_MAX = 2048 + 40, ROWS = 37, TOKENS = 13, Y_STRIDE = ROWS + 3 };
    static const uint64_t lengths[] = {32, 72, 2048, N_MAX};
    float *w = malloc((size_t)ROWS * N_MAX * sizeof(float)), *x = malloc((size_t)TOKENS * N_MAX * sizeof(float));
    uint8_t *wq = malloc((size_t)ROWS * N_MAX * 2);
    uint16_t *xq = malloc((size_t)TOKENS * N_MAX * 2);
    float *y = malloc((size_t)TOKENS * Y_STRIDE * sizeof(float));
    assert_true(w && x && wq && xq && y);
    for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++) {
        const uint64_t n = lengths[l];
        for (int r = 0; r < ROWS; r++) {
            fill_gaussian(w + (size_t)r * n, n, 80 + (unsigned)r);
            assert_ok(em_quantize(EM_TYPE_BF16, w + (size_t)r * n, wq + (size_t)r * n * 2, n));
        }
        for (int t = 0; t < TOKENS; t++) {
            fill_gaussian(x + (size_t)t * n, n, 120 + (unsigned)t);
            for (uint64_t j = 0; j < n; j++) x[(size_t)t * n + j] *= powf(10.0f, (float)(t % 5) - 2.0f);
        }
        em_bf16_round_rows(x, n, TOKENS, n, xq, n);
        for (uint64_t j = 0; j < n; j++)
            assert_int_equal(xq[j], em_f32_to_bf16(x[j])); /* the rounding is em_f32_to_bf16's */
        static const uint32_t row_counts[] = {1, 3, 4, 17, ROWS}, token_counts[] = {1, 5, 6, 7, TOKENS};
        for (int rc = 0; rc < 5; rc++)
            for (int tc = 0; tc < 5; tc++) {
                const uint32_t n_rows = row_counts[rc], n_tokens = token_counts[tc];
                for (int i = 0; i < TOKENS * Y_STRIDE; i++) y[i] = NAN;
                em_bf16_tiles(wq, n * 2, n_rows, xq, n, n_tokens, n, y, Y_STRIDE);
                for (uint32_t t = 0; t < TOKENS; t++)
                    for (uint32_t r = 0; r < Y_STRIDE; r++) {
                        const float got = y[t * Y_STRIDE + r];
                        if (t >= n_tokens || r >= n_rows) {
                            if (!isnan(got)) fail_msg("bf16 tiles wrote outside the output (token %u, row %u)", t, r);
                            continue;
                        }
                        double exact = 0, magnitude = 0;
                        for (uint64_t j = 0; j < n; j++) {
                            const uint8_t *wj = wq + (r * n + j) * 2;
                            const double p = (double)em_bf16_to_f32((uint16_t)(wj[0] | wj[1] << 8)) *
                                             (double)x[t * n + j];
                            exact += p;
                            magnitude += fabs(p);
                        }
                        if (!(fabs(got - exact) <= magnitude / 256))
                            fail_msg("bf16 tiles, n %u, %u rows x %u tokens, row %u token %u: %.9g, exact %.9g "
                                     "(bound %.3g)", (unsigned)n, n_rows, n_tokens, r, t, (double)got, exact,
                                     magnitude / 256);
                    }
            }
    }
    free(w);
    free(x);
    free(wq);
    free(xq);
    free(y);
}

/* On ARM the NEON kernels (plain, and with the dot-product instructions: ctest's quant_neon runs
 * this file again with EMBER_CPU_ISA=neon) keep the scalar path's integer sums and f32 operation
 * order, so em_dot must equal em_dot_scalar bitwise: every dot type, Gaussian rows at scales from
 * 1e-3 to 1e3, float rows ending off the kernels' 8-element step, and the constant and
 * alternating-sign blocks of test_dot_extreme_values. The x86 kernels sum in another order (held
 * to 1e-5 above), so elsewhere this test is skipped. */
static void test_dot_neon_equals_scalar(void **state) {
    (void)state;
    const char *isa = em_dot_isa();
    if (strncmp(isa, "neon", 4) != 0) {
        print_message("em_dot runs %s kernels here: the NEON-only bitwise check is skipped\n", isa);
        skip();
    }
    static const char *const types[] = {"F32",  "F16",  "BF16", "Q8_0", "Q4_0", "Q4_1",   "Q5_0",    "Q5_1",  "IQ4_NL",
                                        "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_XXS", "TQ1_0",
                                        "TQ2_0"};
    enum { N = 2048 + 256, CASES = 7 };
    float *w = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float));
    uint8_t *wq = malloc(N * 4), *aq = malloc(N * 4);
    assert_true(w && x && wq && aq);
    for (int c = 0; c < CASES; c++) {
        /* cases 0..3: Gaussian activations at 1e-3, 1e-1, 1e1, 1e3; 4..6: the extreme patterns */
        int pattern = c - 4;
        if (pattern < 0) {
            float scale = powf(10.0f, (float)c * 2.0f - 3.0f);
            fill_gaussian(w, N, 40 + (unsigned)c);
            fill_gaussian(x, N, 50 + (unsigned)c);
            for (int i = 0; i < N; i++) x[i] *= scale;
        } else {
            for (int i = 0; i < N; i++) {
                float sign = pattern == 0   ? 1.0f
                             : pattern == 1 ? ((i / 32) % 2 ? -1.0f : 1.0f)
                                            : (i % 2 ? -1.0f : 1.0f);
                w[i] = sign;
                x[i] = pattern == 2 ? -sign : sign;
            }
        }
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            em_type type = type_named(types[t]);
            /* the NEON family covers every type but the ternary ones (which have no SIMD kernels
             * anywhere); without a kernel this check would hold the scalar path to itself */
            bool ternary = type == EM_TYPE_TQ1_0 || type == EM_TYPE_TQ2_0;
            if (!ternary && !em_dot_rows_kernel(type)) fail_msg("%s: no NEON kernel", types[t]);
            assert_ok(em_quantize(type, w, wq, N));
            assert_ok(em_quantize_activation(type, x, aq, N));
            const uint64_t lengths[3] = {N, 256, em_type_info_of(type)->block_elems == 1 ? N - 13 : N - 256};
            for (int l = 0; l < 3; l++) {
                float fast = em_dot(type, wq, aq, lengths[l]), scalar = em_dot_scalar(type, wq, aq, lengths[l]);
                if (memcmp(&fast, &scalar, sizeof fast) != 0)
                    fail_msg("%s (%s), case %d, n %u: em_dot %.9g, em_dot_scalar %.9g", types[t], isa, c,
                             (unsigned)lengths[l], (double)fast, (double)scalar);
            }
        }
    }
    free(w);
    free(x);
    free(wq);
    free(aq);
}

/* MXFP4 on x86 with AVX-512 VNNI: em_dot's, em_dot_rows' and em_dot_weights' kernels keep the scalar
 * path's f32 steps in its order (dot_mxfp4_avx512.c), so each must equal em_dot_scalar bitwise: rows
 * of 1 to 100 blocks (on and off the kernels' 16-block tiles and 4-block steps, gpt-oss's 90),
 * quantized Gaussian weights against activations at 1e-3 to 1e3, the constant and alternating-sign
 * blocks of test_dot_extreme_values, and random-byte blocks with every level and exponents from 0
 * (subnormal scales) to 150; 1 to 9 activation rows of one weight row, 1 to 9 weight rows of one
 * token. Where the AVX2 kernels run instead (EMBER_CPU_ISA=avx2, ctest's quant_avx2), they sum in
 * another order: held to 1e-5 of sum |w a| of the scalar path. */
static void test_dot_mxfp4_equals_scalar(void **state) {
    (void)state;
    enum { MAX_N = 100 * 32, ROWS = 9, WSTRIDE = MAX_N / 32 * 17 + 5, ASTRIDE = MAX_N / 32 * 34 + 6 };
    const bool avx512 = strcmp(em_dot_isa(), "avx512-vnni") == 0;
    if (!avx512) print_message("em_dot runs %s kernels here: MXFP4 held to 1e-5 of the scalar path\n", em_dot_isa());
    static const uint32_t blocks[] = {1, 3, 4, 15, 16, 17, 31, 32, 33, 90, 100};
    float *w = malloc(MAX_N * sizeof(float)), *x = malloc(MAX_N * sizeof(float));
    float *wd = malloc(MAX_N * sizeof(float)), *ad = malloc(MAX_N * sizeof(float));
    uint8_t *wq = malloc((size_t)ROWS * WSTRIDE), *aq = malloc((size_t)ROWS * ASTRIDE);
    assert_true(w && x && wd && ad && wq && aq);
    uint64_t seed = 77;
    for (int c = 0; c < 8; c++) { /* 0-3: Gaussian at 1e-3..1e3; 4-6: extreme patterns; 7: random bytes */
        for (int r = 0; r < ROWS; r++) {
            uint8_t *wr = wq + (size_t)r * WSTRIDE, *ar = aq + (size_t)r * ASTRIDE;
            for (int i = 0; i < MAX_N; i++) {
                const float sign = c == 4 ? 1.0f : c == 5 ? ((i / 32) % 2 ? -1.0f : 1.0f) : (i % 2 ? -1.0f : 1.0f);
                w[i] = c < 4 || c == 7 ? (float)(rng_uniform(&seed) - 0.5) * (float)(r + 1) : sign;
                x[i] = c < 4 || c == 7 ? (float)(rng_uniform(&seed) - 0.5) * powf(10.0f, 2.0f * (float)(c % 4) - 3.0f)
                                       : (c == 6 ? -sign : sign);
            }
            assert_ok(em_quantize(EM_TYPE_MXFP4, w, wr, MAX_N));
            assert_ok(em_quantize_activation(EM_TYPE_MXFP4, x, ar, MAX_N));
            if (c == 7)
                for (int b = 0; b < MAX_N / 32; b++) {
                    for (int j = 1; j < 17; j++) wr[17 * b + j] = (uint8_t)(rng_next(&seed) >> 56);
                    wr[17 * b] = (uint8_t)(b % 7 == 0 ? (uint64_t)(b % 3) : 100 + rng_next(&seed) % 51);
                }
        }
        for (size_t l = 0; l < sizeof blocks / sizeof *blocks; l++) {
            const uint64_t n = 32 * (uint64_t)blocks[l];
            float rows[ROWS], weights[ROWS];
            for (uint32_t k = 1; k <= ROWS; k++) {
                em_dot_rows(EM_TYPE_MXFP4, wq, aq, ASTRIDE, k, n, rows);
                em_dot_weights(EM_TYPE_MXFP4, wq, WSTRIDE, k, aq, ASTRIDE, 1, n, weights, ROWS);
                for (uint32_t i = 0; i < k; i++) {
                    const uint8_t *wr = wq + (size_t)i * WSTRIDE, *ar = aq + (size_t)i * ASTRIDE;
                    const float scalar_row = em_dot_scalar(EM_TYPE_MXFP4, wq, ar, n);
                    const float scalar_weight = em_dot_scalar(EM_TYPE_MXFP4, wr, aq, n);
                    const float one = em_dot(EM_TYPE_MXFP4, wr, ar, n), scalar_one = em_dot_scalar(EM_TYPE_MXFP4, wr, ar, n);
                    if (avx512) {
                        if (memcmp(&one, &scalar_one, 4) || memcmp(&rows[i], &scalar_row, 4) ||
                            memcmp(&weights[i], &scalar_weight, 4))
                            fail_msg("case %d, %u blocks, %u rows, row %u: em_dot %.9g (scalar %.9g), em_dot_rows "
                                     "%.9g (%.9g), em_dot_weights %.9g (%.9g)",
                                     c, blocks[l], k, i, one, scalar_one, rows[i], scalar_row, weights[i], scalar_weight);
                        continue;
                    }
                    assert_ok(em_dequantize(EM_TYPE_MXFP4, wr, wd, n));
                    assert_ok(em_dequantize(EM_TYPE_Q8_0, ar, ad, n));
                    double abs_wa = 1e-30;
                    for (uint64_t j = 0; j < n; j++) abs_wa += fabs((double)wd[j] * ad[j]);
                    if (!(fabs((double)one - scalar_one) <= 1e-5 * abs_wa))
                        fail_msg("case %d, %u blocks: em_dot %.9g, em_dot_scalar %.9g", c, blocks[l], one, scalar_one);
                }
            }
        }
    }
    free(w), free(x), free(wd), free(ad), free(wq), free(aq);
}

/* Weight rows of random bytes: every bit pattern of levels, scales, grid indices and signs the
 * format can hold, with the block's f16 scales replaced by finite values from 2^-9 to 2^-2 (a random
 * f16 could be infinite or NaN, which no kernel promises to sum alike). */
static void fill_random_blocks(em_type type, uint8_t *rows, size_t bytes, uint64_t seed) {
    for (size_t i = 0; i < bytes; i++) rows[i] = (uint8_t)(rng_next(&seed) >> 56);
    const em_type_info *info = em_type_info_of(type);
    size_t scales[2] = {0, 0}, count = 1; /* byte offsets of the f16 scales in a block */
    if (type == EM_TYPE_Q4_K) count = 2, scales[1] = 2;
    if (type == EM_TYPE_Q6_K) scales[0] = 208;
    for (size_t b = 0; b + info->block_bytes <= bytes; b += info->block_bytes)
        for (size_t k = 0; k < count; k++) {
            uint16_t h = (uint16_t)(0x1800 + (rng_next(&seed) >> 52) % 0x1c00); /* exponents -9..-3 */
            if (rng_next(&seed) & 1) h |= 0x8000;
            rows[b + scales[k]] = (uint8_t)h;
            rows[b + scales[k] + 1] = (uint8_t)(h >> 8);
        }
}

/* Packed token groups must give em_dot's results bitwise, like em_dot_rows: every group size (1
 * to EM_DOT_GROUP_TOKENS, ragged groups padded inside the pack), rows of one block, of several, and
 * of more than the kernels take in one chunk (25 blocks: Q4_K takes 11 at a time), rows spaced
 * wider than their size, each activation row at its own scale, several weight rows against one
 * packed group in one call (past the kernels' tiles of rows, with the remainder) and
 * each alone, results written with a stride wider than the rows, and calls taking several groups
 * one after another (up to ten, the last ragged or full). Two kinds of rows: quantized
 * Gaussian weights against Gaussian activations, and edge cases: random-byte weight blocks
 * (fill_random_blocks) against activations at the limits of the 8-bit levels (all +127, all -127,
 * alternating signs, zeros, and Gaussian rows between them). On a CPU without the kernels (or under
 * EMBER_CPU_ISA=avx2) there is no group kernel and no group size. */
static void test_dot_groups_equal_single_rows(void **state) {
    (void)state;
    static const char *const types[] = {"Q4_K", "Q8_0", "Q6_K", "IQ3_XXS", "F32"};
    /* TOKENS activation rows: one group, and for calls of several groups up to ten of them (past the
     * IQ3_XXS kernel's eight groups a pass) */
    enum { N_MAX = 25 * 256, WROWS = 7, OUT_STRIDE = WROWS + 2, STRIDE = N_MAX * 4 + 64 };
    enum { TOKENS = 10 * EM_DOT_GROUP_TOKENS };
    float *w = malloc(N_MAX * sizeof(float)), *x = malloc(N_MAX * sizeof(float));
    uint8_t *wq = malloc((size_t)WROWS * N_MAX * 4), *aq = malloc((size_t)TOKENS * STRIDE);
    uint8_t *group = malloc((size_t)TOKENS * STRIDE);
    float *many = malloc((size_t)TOKENS * OUT_STRIDE * sizeof(float));
    assert_true(w && x && wq && aq && group && many);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        em_type type = type_named(types[t]);
        em_dot_group_fn kernel = em_dot_group_kernel(type);
        if (!kernel) {
            assert_int_equal(em_dot_group_bytes(type, N_MAX), 0);
            continue;
        }
        const uint64_t lengths[3] = {256, 512, N_MAX};
        for (int run = 0; run < 6; run++) {
            const uint64_t n = lengths[run % 3];
            const bool edge = run >= 3;
            uint64_t wrow = 0;
            assert_ok(em_type_row_bytes(type, n, &wrow));
            if (edge)
                fill_random_blocks(type, wq, (size_t)WROWS * wrow, 60 + (unsigned)run);
            for (int r = 0; r < WROWS && !edge; r++) {
                fill_gaussian(w, n, 30 + (unsigned)r);
                assert_ok(em_quantize(type, w, wq + (size_t)r * wrow, n));
            }
            for (int r = 0; r < TOKENS; r++) {
                fill_gaussian(x, n, 40 + (unsigned)r);
                for (uint64_t i = 0; i < n; i++) {
                    x[i] *= (float)(r % EM_DOT_GROUP_TOKENS + 1) * (r % 2 ? 0.01f : 1.0f);
                    if (edge && r < 4) /* every level +127, -127, alternating, zero */
                        x[i] = r == 0 ? 3.0f : r == 1 ? -3.0f : r == 2 ? (i % 2 ? -1.0f : 1.0f) : 0.0f;
                }
                assert_ok(em_quantize_activation(type, x, aq + (size_t)r * STRIDE, n));
            }
            const uint64_t bytes = em_dot_group_bytes(type, n);
            assert_true(bytes > 0 && bytes <= (uint64_t)EM_DOT_GROUP_TOKENS * STRIDE);
            /* several groups in one call: full groups, then a ragged or a full last one */
            const uint32_t counts[3] = {2 * EM_DOT_GROUP_TOKENS + 3, 8 * EM_DOT_GROUP_TOKENS, TOKENS - 5};
            for (int c = 0; c < 3; c++) {
                for (uint32_t first = 0; first < counts[c]; first += EM_DOT_GROUP_TOKENS) {
                    const uint32_t left = counts[c] - first;
                    const uint32_t rows = left < EM_DOT_GROUP_TOKENS ? left : EM_DOT_GROUP_TOKENS;
                    em_dot_group_pack(type, aq + (size_t)first * STRIDE, STRIDE, rows, n,
                                      group + first / EM_DOT_GROUP_TOKENS * bytes);
                }
                kernel(wq, wrow, WROWS, group, counts[c], n, many, OUT_STRIDE);
                for (uint32_t k = 0; k < counts[c]; k++)
                    for (int r = 0; r < WROWS; r++) {
                        float single = em_dot(type, wq + (size_t)r * wrow, aq + (size_t)k * STRIDE, n);
                        if (memcmp(&single, &many[k * OUT_STRIDE + (uint32_t)r], sizeof single) != 0)
                            fail_msg("%s%s, n %u, %u tokens in one call, weight row %d, token %u: group %.9g, "
                                     "em_dot %.9g",
                                     types[t], edge ? " (edge cases)" : "", (unsigned)n, counts[c], r, k,
                                     (double)many[k * OUT_STRIDE + (uint32_t)r], (double)single);
                    }
            }
            for (uint32_t n_rows = 1; n_rows <= EM_DOT_GROUP_TOKENS; n_rows++) {
                memset(group, 0xa5, bytes); /* stale bytes must not leak into a ragged group */
                em_dot_group_pack(type, aq, STRIDE, n_rows, n, group);
                float all[EM_DOT_GROUP_TOKENS * OUT_STRIDE], alone[EM_DOT_GROUP_TOKENS];
                kernel(wq, wrow, WROWS, group, n_rows, n, all, OUT_STRIDE);
                for (int r = 0; r < WROWS; r++) {
                    kernel(wq + (size_t)r * wrow, wrow, 1, group, n_rows, n, alone, 1);
                    for (uint32_t k = 0; k < n_rows; k++) {
                        float single = em_dot(type, wq + (size_t)r * wrow, aq + (size_t)k * STRIDE, n);
                        const float *tiled = &all[k * OUT_STRIDE + (uint32_t)r];
                        if (memcmp(&single, tiled, sizeof single) != 0 || memcmp(&single, &alone[k], sizeof single) != 0)
                            fail_msg("%s%s, n %u, %u tokens, weight row %d, token %u: group %.9g (alone %.9g), "
                                     "em_dot %.9g",
                                     types[t], edge ? " (edge cases)" : "", (unsigned)n, n_rows, r, k, (double)*tiled,
                                     (double)alone[k], (double)single);
                    }
                }
            }
        }
    }
    free(w);
    free(x);
    free(wq);
    free(aq);
    free(group);
    free(many);
}

/* em_f32_dot_rows must give em_dot's F32 results bitwise: row counts past and between the SIMD
 * kernel's sixteen, lengths it takes (multiples of 32) and others, rows spaced wider than their
 * length, rows of different scales, a row of zeros and one of negative zeros. */
static void test_f32_dot_rows_equal_em_dot(void **state) {
    (void)state;
    enum { N_MAX = 160, ROWS = 37, STRIDE = N_MAX + 7 };
    float *rows = malloc((size_t)ROWS * STRIDE * sizeof(float)), x[N_MAX], out[ROWS];
    assert_true(rows != NULL);
    for (int r = 0; r < ROWS; r++) {
        fill_gaussian(rows + (size_t)r * STRIDE, STRIDE, 50 + (unsigned)r);
        for (int j = 0; j < STRIDE; j++) rows[(size_t)r * STRIDE + j] *= (float)(r + 1) * (r % 3 ? 1.0f : 1e-3f);
    }
    for (int j = 0; j < STRIDE; j++) {
        rows[5 * STRIDE + j] = 0.0f;
        rows[6 * STRIDE + j] = -0.0f;
    }
    fill_gaussian(x, N_MAX, 49);
    const uint64_t lengths[] = {32, 64, 128, 160, 50, 8};
    for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++)
        for (uint32_t n_rows = 1; n_rows <= ROWS; n_rows++) {
            em_f32_dot_rows(rows, STRIDE, n_rows, x, lengths[l], out);
            for (uint32_t r = 0; r < n_rows; r++) {
                const float want = em_dot(EM_TYPE_F32, rows + (size_t)r * STRIDE, x, lengths[l]);
                if (memcmp(&want, &out[r], sizeof want) != 0)
                    fail_msg("n %u, %u rows, row %u: %.9g, em_dot %.9g", (unsigned)lengths[l], n_rows, r,
                             (double)out[r], (double)want);
            }
        }
    free(rows);
}

/* em_f32_add_weighted_rows against fmaf step by step, each head alone: one fused multiply-add per
 * row, rows in order. Lengths on and off the SIMD widths, one row and several, one head to five
 * (a group of four and one more), rows and heads spaced wider than their length. */
static void test_weighted_rows_fused(void **state) {
    (void)state;
    enum { N_MAX = 200, ROWS = 17, STRIDE = N_MAX + 5, HEADS = 5, OUT_STRIDE = N_MAX + 3, W_STRIDE = ROWS + 2 };
    static const uint64_t lengths[] = {1, 7, 16, 31, 32, 63, 64, 80, 128, 129, 200};
    float *rows = malloc(ROWS * STRIDE * sizeof(float)), weights[HEADS * W_STRIDE];
    float out[HEADS * OUT_STRIDE], want[HEADS * OUT_STRIDE], start[HEADS * OUT_STRIDE];
    assert_true(rows);
    fill_gaussian(rows, ROWS * STRIDE, 91);
    fill_gaussian(weights, HEADS * W_STRIDE, 92);
    fill_gaussian(start, HEADS * OUT_STRIDE, 93);
    for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++)
        for (uint32_t n_rows = 1; n_rows <= ROWS; n_rows += 8)
            for (uint32_t n_heads = 1; n_heads <= HEADS; n_heads += 2) {
                const uint64_t n = lengths[l];
                memcpy(out, start, sizeof out);
                memcpy(want, start, sizeof want);
                em_f32_add_weighted_rows(out, OUT_STRIDE, weights, W_STRIDE, n_heads, rows, STRIDE, n_rows, n);
                for (uint32_t h = 0; h < n_heads; h++)
                    for (uint32_t p = 0; p < n_rows; p++)
                        for (uint64_t j = 0; j < n; j++)
                            want[h * OUT_STRIDE + j] =
                                fmaf(weights[h * W_STRIDE + p], rows[p * STRIDE + j], want[h * OUT_STRIDE + j]);
                for (uint64_t j = 0; j < HEADS * OUT_STRIDE; j++)
                    if (memcmp(&out[j], &want[j], sizeof(float)) != 0)
                        fail_msg("n %u, %u rows, %u heads, element %u: %.9g, step by step %.9g", (unsigned)n, n_rows,
                                 n_heads, (unsigned)j, (double)out[j], (double)want[j]);
            }
    free(rows);
}

/* Distance in units in the last place between two finite floats of the same sign. */
static uint32_t ulps_apart(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return ia > ib ? (uint32_t)(ia - ib) : (uint32_t)(ib - ia);
}

/* em_expf against the C library's double exp rounded to float: within 2 ulp wherever the result is
 * at least FLT_MIN (about two million inputs spread over that range), its edges, and the special
 * values. */
static void test_expf_accuracy(void **state) {
    (void)state;
    uint32_t worst = 0;
    float worst_x = 0;
    for (int sign = 0; sign < 2; sign++)
        for (uint32_t bits = 0; bits < 0x42b20000u; bits += 397) { /* |x| up to about 89 */
            const uint32_t u = bits | (uint32_t)sign << 31;
            float x;
            memcpy(&x, &u, 4);
            if (x > 88.3762626647949f || x < -87.3365478515625f) continue;
            const float want = (float)exp((double)x), got = em_expf(x);
            const uint32_t d = ulps_apart(got, want);
            if (d > worst) worst = d, worst_x = x;
        }
    if (worst > 2) fail_msg("em_expf(%.9g) is %u ulp from exp", (double)worst_x, worst);
    assert_true(em_expf(0.0f) == 1.0f);
    assert_true(isinf(em_expf(89.0f)) && isinf(em_expf(INFINITY)));
    assert_true(em_expf(-88.0f) == 0.0f && em_expf(-INFINITY) == 0.0f);
    assert_true(isnan(em_expf(NAN)));
    const float top = 88.3762626647949f, bottom = -87.3365478515625f;
    assert_true(ulps_apart(em_expf(top), (float)exp((double)top)) <= 2);
    assert_true(ulps_apart(em_expf(bottom), (float)exp((double)bottom)) <= 2);
}

/* em_f32_softmax and em_f32_silu_mul (SIMD where the CPU has it; this test runs on both x86 paths)
 * bitwise against their definitions written out with em_expf, and the softmax within 2^-20 of the
 * C library's double softmax. Lengths on and off the vector widths, scores spread wide enough that
 * some exponentials are flushed to zero. */
static void test_softmax_and_silu_by_definition(void **state) {
    (void)state;
    enum { N_MAX = 1000 };
    static const uint64_t lengths[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 257, 1000};
    float *x = malloc(N_MAX * sizeof *x), *got = malloc(N_MAX * sizeof *got), *want = malloc(N_MAX * sizeof *want);
    float *up = malloc(N_MAX * sizeof *up);
    assert_true(x && got && want && up);
    for (int spread = 0; spread < 3; spread++) {
        fill_gaussian(x, N_MAX, 300 + (uint64_t)spread);
        fill_gaussian(up, N_MAX, 400 + (uint64_t)spread);
        const float scale = spread == 0 ? 1.0f : spread == 1 ? 10.0f : 60.0f;
        for (int i = 0; i < N_MAX; i++) x[i] *= scale;
        for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++) {
            const uint64_t n = lengths[l];
            memcpy(got, x, n * sizeof *x);
            em_f32_softmax(got, n);
            float max = -INFINITY, sums[16] = {0};
            double total = 0;
            for (uint64_t i = 0; i < n; i++) max = x[i] > max ? x[i] : max;
            for (uint64_t i = 0; i < n; i++) {
                want[i] = em_expf(x[i] - max);
                sums[i % 16] += want[i];
                total += exp((double)x[i] - max);
            }
            for (int width = 8; width > 0; width /= 2)
                for (int j = 0; j < width; j++) sums[j] += sums[j + width];
            const float inv = 1.0f / sums[0];
            for (uint64_t i = 0; i < n; i++) {
                want[i] *= inv;
                if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                    fail_msg("softmax, n %u, spread %d, element %u: %.9g, by definition %.9g", (unsigned)n, spread,
                             (unsigned)i, (double)got[i], (double)want[i]);
                const double exact = exp((double)x[i] - max) / total;
                if (fabs(got[i] - exact) > 0x1p-20 * (exact > 1e-3 ? exact : 1e-3))
                    fail_msg("softmax, n %u, element %u: %.9g, exact %.9g", (unsigned)n, (unsigned)i, (double)got[i], exact);
            }
            memcpy(got, x, n * sizeof *x);
            em_f32_silu_mul(got, up, n);
            for (uint64_t i = 0; i < n; i++) {
                const float h = x[i] / (1.0f + em_expf(-x[i])) * up[i];
                if (memcmp(&got[i], &h, sizeof h) != 0)
                    fail_msg("silu, n %u, element %u: %.9g, by definition %.9g", (unsigned)n, (unsigned)i,
                             (double)got[i], (double)h);
            }
        }
    }
    free(x);
    free(got);
    free(want);
    free(up);
}

/* Q8_K activations by the format's definition, checked against the C library: the element of
 * largest magnitude (the first of equals) sets iscale = -127 / that element, every level is
 * roundf(iscale * x) (half away from zero) capped at 127, d = 1 / iscale, and each group of 16
 * stores the sum of its levels. Blocks with values landing exactly on halves (iscale 1 and 2),
 * ties for the largest magnitude, Gaussian blocks at several scales, and blocks holding NaN or an
 * infinity (the non-finite path) go through em_quantize one block at a time and in one call. */
static void test_q8_k_levels_by_definition(void **state) {
    (void)state;
    enum { BLOCKS = 12, N = BLOCKS * 256 };
    float *x = malloc(N * sizeof(float));
    uint8_t *q = malloc(BLOCKS * 292), *one = malloc(292);
    assert_true(x && q && one);
    fill_gaussian(x, N, 77);
    for (int j = 0; j < 256; j++) x[j] = (float)(j % 64) * 0.5f - 16.0f; /* a ramp */
    for (int j = 0; j < 256; j++) x[256 + j] = (float)((j % 32) - 16) + 0.5f; /* halves... */
    x[256 + 7] = -127.0f;                                                        /* ...at iscale 1 */
    for (int j = 0; j < 256; j++) x[512 + j] = (float)((j % 50) - 25) * 0.25f;   /* quarters... */
    x[512 + 3] = 63.5f;                                                          /* ...at iscale -2 */
    x[512 + 9] = -63.5f;                                                         /* a tie, later */
    for (int j = 0; j < 256; j++) x[768 + j] *= 1e-30f;
    for (int j = 0; j < 256; j++) x[1024 + j] *= 3e4f;
    x[1280 + 5] = NAN;
    x[1536 + 200] = INFINITY;
    for (int j = 0; j < 256; j++) x[1792 + j] = 0.0f;
    assert_ok(em_quantize(EM_TYPE_Q8_K, x, q, N));
    for (int b = 0; b < BLOCKS; b++) {
        const float *xb = x + 256 * b;
        const uint8_t *qb = q + 292 * b;
        assert_ok(em_quantize(EM_TYPE_Q8_K, xb, one, 256));
        assert_memory_equal(one, qb, 292);
        float amax = 0, max = 0;
        for (int j = 0; j < 256; j++)
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        float d;
        memcpy(&d, qb, 4);
        if (amax == 0) {
            for (int j = 0; j < 292; j++) assert_int_equal(qb[j], 0);
            continue;
        }
        const float iscale = -127.0f / max;
        assert_true(memcmp(&d, &(float){1.0f / iscale}, 4) == 0);
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) {
                const float r = roundf(iscale * xb[16 * g + j]);
                assert_true(r != r || fabsf(r) <= 128.0f);
                const int want = r != r ? 0 : r > 127.0f ? 127 : (int)r; /* NaN products: level 0 */
                const int8_t got = (int8_t)qb[4 + 16 * g + j];
                if (got != want)
                    fail_msg("block %d element %d: level %d, roundf(%.9g) = %d", b, 16 * g + j, got,
                             (double)(iscale * xb[16 * g + j]), want);
                sum += got;
            }
            const int16_t stored = (int16_t)(qb[260 + 2 * g] | (qb[261 + 2 * g] << 8));
            assert_int_equal(stored, sum);
        }
    }
    free(x);
    free(q);
    free(one);
}

/* Q8_0 levels by the definition: d = max |x| / 127 (NaN never the maximum) stored as fp16, every
 * level roundf(x * (1 / d)) (half away from zero; 0 where d is 0; a NaN product 0). Blocks with
 * products landing exactly on halves, ties for the largest magnitude, Gaussian blocks at several
 * scales, a block too small for 1 / d to be finite, and blocks holding NaN or an infinity go
 * through em_quantize one block at a time and in one call. */
static void test_q8_0_levels_by_definition(void **state) {
    (void)state;
    enum { BLOCKS = 10, N = BLOCKS * 32 };
    float x[N];
    uint8_t q[BLOCKS * 34], one[34];
    fill_gaussian(x, N, 78);
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16) + 0.5f; /* halves at 1 / d = 1... */
    x[5] = -127.0f;                                              /* ...and a tie, later */
    x[9] = 127.0f;
    for (int j = 0; j < 32; j++) x[32 + j] = (float)((j % 16) - 8) * 0.25f; /* quarters at 1 / d = 2 */
    x[32 + 3] = 63.5f;
    for (int j = 0; j < 32; j++) x[96 + j] *= 1e-40f; /* subnormal: d rounds to 0 or 1 / d overflows */
    for (int j = 0; j < 32; j++) x[128 + j] *= 3e4f;
    x[160 + 5] = NAN;
    x[192 + 20] = INFINITY;
    for (int j = 0; j < 32; j++) x[224 + j] = 0.0f;
    x[256 + 1] = -INFINITY;
    x[256 + 2] = NAN;
    assert_ok(em_quantize(EM_TYPE_Q8_0, x, q, N));
    for (int b = 0; b < BLOCKS; b++) {
        const float *xb = x + 32 * b;
        const uint8_t *qb = q + 34 * b;
        assert_ok(em_quantize(EM_TYPE_Q8_0, xb, one, 32));
        assert_memory_equal(one, qb, 34);
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
        const float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
        assert_int_equal(qb[0] | (qb[1] << 8), em_f32_to_fp16(d));
        for (int j = 0; j < 32; j++) {
            const float r = roundf(xb[j] * id);
            /* a finite product is at most 127 and a little; an infinite one wraps to 0 as an int8 */
            const int want = r != r || fabsf(r) > 128.0f ? 0 : (int)r;
            const int8_t got = (int8_t)qb[2 + j];
            if (got != (int8_t)want)
                fail_msg("block %d element %d: level %d, roundf(%.9g) = %d", b, j, got, (double)(xb[j] * id), want);
        }
    }
}

/* ---- conversions and errors ---- */

static void test_fp16_conversions(void **state) {
    (void)state;
    assert_int_equal(em_f32_to_fp16(1.0f), 0x3c00);
    assert_int_equal(em_f32_to_fp16(-2.0f), 0xc000);
    assert_int_equal(em_f32_to_fp16(65504.0f), 0x7bff);
    assert_int_equal(em_f32_to_fp16(65519.0f), 0x7bff);
    assert_int_equal(em_f32_to_fp16(65520.0f), 0x7c00);
    assert_int_equal(em_f32_to_fp16(0x1p-24f), 0x0001);
    assert_int_equal(em_f32_to_fp16(0x1p-25f), 0x0000);        /* tie to even: zero */
    assert_int_equal(em_f32_to_fp16(0x1.8p-24f), 0x0002);      /* 1.5 units: tie to even, 2 */
    assert_int_equal(em_f32_to_fp16(0x1.ff8p-15f), 0x03ff);    /* largest subnormal */
    assert_int_equal(em_f32_to_fp16(0x1.ffcp-15f), 0x0400);    /* tie, rounds up into the normals */
    assert_int_equal(em_f32_to_fp16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
    assert_int_equal(em_f32_to_fp16(1.0f + 0x1.8p-11f), 0x3c01);
    assert_true(isnan(em_fp16_to_f32(em_f32_to_fp16(NAN))));
    assert_true(em_fp16_to_f32(0x0001) == 0x1p-24f);
    assert_true(em_fp16_to_f32(0xfbff) == -65504.0f);
    assert_true(isinf(em_fp16_to_f32(0x7c00)));
    for (uint32_t h = 0; h < 0x10000; h++) { /* every finite half survives a round trip */
        if ((h & 0x7c00) == 0x7c00) continue;
        assert_int_equal(em_f32_to_fp16(em_fp16_to_f32((uint16_t)h)), h);
    }
    assert_int_equal(em_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(em_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
    assert_int_equal(em_f32_to_bf16(1.0f + 0x1.8p-8f), 0x3f81);
    assert_true(em_bf16_to_f32(0xc040) == -3.0f);
    assert_true(isnan(em_bf16_to_f32(em_f32_to_bf16(NAN))));
}

static void test_errors(void **state) {
    (void)state;
    float out[64], in[64] = {0};
    uint8_t q[64] = {0};
    em_err err = em_dequantize(EM_TYPE_I32, q, out, 4);
    assert_int_equal(em_err_code_of(err), EM_ERR_UNSUPPORTED);
    em_err_free(err);
    err = em_dequantize(EM_TYPE_Q8_0, q, out, 33);
    assert_int_equal(em_err_code_of(err), EM_ERR_INVALID);
    em_err_free(err);
    err = em_quantize(EM_TYPE_IQ1_S, in, q, 256);
    assert_int_equal(em_err_code_of(err), EM_ERR_UNSUPPORTED);
    em_err_free(err);
    assert_false(em_type_can_quantize(EM_TYPE_IQ2_XXS));
    assert_int_equal(em_dot_activation_type(EM_TYPE_BF16), EM_TYPE_F32);
    assert_int_equal(em_dot_activation_type(EM_TYPE_Q4_1), EM_TYPE_Q8_0);
    assert_int_equal(em_dot_activation_type(EM_TYPE_IQ3_XXS), EM_TYPE_Q8_K);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_golden_dequantize, open_fixture, close_fixture),
        cmocka_unit_test_setup_teardown(test_golden_quantize, open_fixture, close_fixture),
        cmocka_unit_test(test_quantize_error_bounds),
        cmocka_unit_test(test_quantize_degenerate_blocks),
        cmocka_unit_test(test_quantize_non_finite_input),
        cmocka_unit_test(test_weighted_error_is_lower),
        cmocka_unit_test(test_weighted_contract),
        cmocka_unit_test_setup_teardown(test_dot_matches_dequantized_rows, open_fixture, close_fixture),
        cmocka_unit_test(test_dot_long_rows),
        cmocka_unit_test(test_dot_extreme_values),
        cmocka_unit_test(test_dot_rows_equal_single_rows),
        cmocka_unit_test(test_dot_weights_equal_single_rows),
        cmocka_unit_test(test_dot_weights_wide_rows),
        cmocka_unit_test(test_iq3xxs_codes_spell_the_grid),
        cmocka_unit_test(test_bf16_tiles_within_bound),
        cmocka_unit_test(test_amx_product_equals_scalar),
        cmocka_unit_test(test_dot_neon_equals_scalar),
        cmocka_unit_test(test_dot_mxfp4_equals_scalar),
        cmocka_unit_test(test_dot_groups_equal_single_rows),
        cmocka_unit_test(test_q8_0_levels_by_definition),
        cmocka_unit_test(test_f32_dot_rows_equal_em_dot),
        cmocka_unit_test(test_q8_k_levels_by_definition),
        cmocka_unit_test(test_weighted_rows_fused),
        cmocka_unit_test(test_expf_accuracy),
        cmocka_unit_test(test_softmax_and_silu_by_definition),
        cmocka_unit_test(test_fp16_conversions),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
