/* The CUDA backend's switches and kernel choice (backend/cuda/tuning.cu) against docs/cuda.md, on the
 * host (needs no GPU; registered with ctest where nvcc builds the backend): the documented defaults;
 * each switch's overrides; a value a switch does not take refused with the variable's name; and the
 * kernel the choice table of docs/cuda.md gives a few products of dense-1b's and moe-30b-a3b's
 * shapes on an H200 (132 multiprocessors).
 * Usage: check_tuning; prints each failure and exits 1 on any. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/internal.cuh"

static int failed;

#define EXPECT(cond)                                                               \
    do {                                                                           \
        if (!(cond)) fprintf(stderr, "line %d: %s\n", __LINE__, #cond), failed++; \
    } while (0)

static const char *const switches[] = {
    "EMBER_CUDA_KV",         "EMBER_CUDA_GRAPHS",        "EMBER_CUDA_PDL",         "EMBER_CUDA_OVERLAP",
    "EMBER_CUDA_FUSE_FINISH", "EMBER_CUDA_MOE_NORM",     "EMBER_CUDA_DEC_CLUSTER", "EMBER_CUDA_GEMM",
    "EMBER_CUDA_WGMMA",      "EMBER_CUDA_WG_SPLIT",      "EMBER_CUDA_WG_BF16",     "EMBER_CUDA_DP4A",
    "EMBER_CUDA_DP4A_MOE",   "EMBER_CUDA_DQ_WIDE",       "EMBER_CUDA_DQ_UNITS",    "EMBER_CUDA_DQ_MOE_UNITS",
    "EMBER_CUDA_IMMA",       "EMBER_CUDA_HMMA",          "EMBER_CUDA_MVT",         "EMBER_CUDA_MEGA",
    "EMBER_CUDA_MEGA_PROFILE", "EMBER_CUDA_MEGA_STAGE_KB", "EMBER_CUDA_PROFILE",   "EMBER_CUDA_TRACE",
    "EMBER_CUDA_LATE_MASKS", "EMBER_CUDA_PF_SPLIT",    "EMBER_CUDA_GEMM_FROM",   "EMBER_CUDA_GEMM_MOE",
};

/* The tuning with only `name` set to `value` (NULL: none); *err_out gets the error's message. */
static em_cuda_tuning read_with(const char *name, const char *value, char *err_out, size_t size) {
    for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++) unsetenv(switches[i]);
    if (name) setenv(name, value, 1);
    em_cuda_tuning t;
    memset(&t, 0xab, sizeof t);
    em_err err = em_cuda_tuning_read(&t);
    if (err_out) snprintf(err_out, size, "%s", err ? em_err_message(err) : "");
    if (err) em_err_free(err);
    if (name) unsetenv(name);
    return t;
}

static void check_defaults(void) {
    const em_cuda_tuning t = read_with(NULL, NULL, NULL, 0);
    EXPECT(!t.kv_f32 && t.graphs && t.pdl && t.overlap && t.fuse_finish && t.tensor_cores && t.int8_activations);
    EXPECT(t.wgmma && t.wgmma_split && t.wgmma_bf16 && t.gemm_split && t.tc_iq3_runs && !t.trace && !t.mega_profile &&
           t.late_masks);
    EXPECT(t.prefill_split);
    EXPECT(t.moe_norm_max == 1 && t.dec_cluster_max == 4 && t.mega_tokens == 0 && t.mega_stage_kb == 32);
    EXPECT(t.profile_from == -1 && t.profile_to == -1);
    EXPECT(t.dp4a_upto_q8_0_q4_k == 8 && t.dp4a_upto_other == 4 && t.dp4a_upto_q6_k_wide == 8 && t.dp4a_upto_moe == 16);
    EXPECT(t.dp4a_units == 2 && t.dp4a_moe_units == 3);
    EXPECT(t.imma_from == 2 && t.imma_from_head == 4 && t.hmma_from == 2 && t.hmma_from_head == EM_CUDA_NEVER);
    EXPECT(t.tc_from == 3 && t.tc_from_head_q6_k_iq3 == 1 && t.tc_from_head_half == 2 && t.tc_from_moe == 2 &&
           t.tc_from_moe_iq3_down == 1);
    EXPECT(t.gemm_from_moe == 16 && t.gemm_from[0][2] == 17 && t.gemm_from[1][0] == 17 && t.gemm_from[2][0] == 8 && t.gemm_from[2][2] == 16);
}

static void check_overrides(void) {
    em_cuda_tuning t = read_with("EMBER_CUDA_LATE_MASKS", "0", NULL, 0);
    EXPECT(!t.late_masks && t.overlap);
    t = read_with("EMBER_CUDA_DP4A", "0", NULL, 0);
    EXPECT(!t.int8_activations && t.dp4a_upto_moe == 0 && t.dp4a_upto_q8_0_q4_k == 0);
    EXPECT(t.imma_from == EM_CUDA_NEVER && t.imma_from_head == EM_CUDA_NEVER && t.hmma_from == 2);
    t = read_with("EMBER_CUDA_DP4A", "12", NULL, 0);
    EXPECT(t.int8_activations && t.dp4a_upto_other == 12 && t.dp4a_upto_moe == 12 && t.imma_from == 2);
    t = read_with("EMBER_CUDA_DQ_WIDE", "0", NULL, 0);
    EXPECT(t.dp4a_upto_q6_k_wide == 4);
    t = read_with("EMBER_CUDA_MVT", "0", NULL, 0);
    EXPECT(t.tc_from == EM_CUDA_NEVER && t.tc_from_moe_iq3_down == EM_CUDA_NEVER);
    t = read_with("EMBER_CUDA_HMMA", "5", NULL, 0);
    EXPECT(t.hmma_from == 5 && t.hmma_from_head == 5 && t.imma_from == 2);
    t = read_with("EMBER_CUDA_KV", "f32", NULL, 0);
    EXPECT(t.kv_f32);
    t = read_with("EMBER_CUDA_GRAPHS", "", NULL, 0); /* empty: the default */
    EXPECT(t.graphs);
    t = read_with("EMBER_CUDA_PROFILE", "4:8", NULL, 0);
    EXPECT(t.profile_from == 4 && t.profile_to == 8);
    t = read_with("EMBER_CUDA_PF_SPLIT", "0", NULL, 0);
    EXPECT(!t.prefill_split);
    t = read_with("EMBER_CUDA_GEMM_FROM", "48", NULL, 0);
    EXPECT(t.gemm_from[0][0] == 48 && t.gemm_from[1][2] == 48 && t.gemm_from[2][2] == 48 && t.gemm_from_moe == 16);
    t = read_with("EMBER_CUDA_GEMM_MOE", "0", NULL, 0);
    EXPECT(t.gemm_from_moe == EM_CUDA_NEVER && t.gemm_from[0][2] == 17);
}

static void check_refused(void) {
    const char *bad[][2] = {{"EMBER_CUDA_GRAPHS", "yes"},  {"EMBER_CUDA_GEMM", "2"},     {"EMBER_CUDA_MVT", "-1"},
                            {"EMBER_CUDA_DP4A", "8x"},     {"EMBER_CUDA_DQ_UNITS", "0"}, {"EMBER_CUDA_KV", "f64"},
                            {"EMBER_CUDA_PROFILE", "3"},   {"EMBER_CUDA_PROFILE", "8:4"},
                            {"EMBER_CUDA_MEGA", "99999999999"}, {"EMBER_CUDA_PF_SPLIT", "on"},
                            {"EMBER_CUDA_GEMM_FROM", "x"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char message[256];
        read_with(bad[i][0], bad[i][1], message, sizeof message);
        if (!strstr(message, bad[i][0]))
            fprintf(stderr, "%s=%s: refused without naming it (\"%s\")\n", bad[i][0], bad[i][1], message), failed++;
    }
}

/* A product of `rows` x `cols` weights of `type` on n items; MoE (experts > 0): n tokens over experts
 * taking `used` each; up: a gated unit. */
static em_cuda_matvec_kernel choice(const cuda_backend *b, uint32_t type, uint32_t rows, uint32_t cols, uint32_t n,
                                    bool up, uint32_t experts, uint32_t used) {
    static const uint32_t fake_counts[1] = {0};
    uint64_t row_bytes = 0;
    em_type_row_bytes(type, cols, &row_bytes);
    cuda_weight w = {(const uint8_t *)(uintptr_t)0x10000, type, cols, rows, experts ? experts : 1, row_bytes};
    cuda_matvec mv = {};
    mv.w = &w, mv.up = up ? &w : NULL, mv.x = (const float *)(uintptr_t)0x20000, mv.x_stride = cols;
    mv.n_items = n, mv.n_groups = 1;
    if (experts) {
        mv.counts = mv.starts = fake_counts, mv.n_groups = experts, mv.max_items = n;
        mv.n_items = (n * used + experts - 1) / experts, mv.x_rows = n, mv.x_index = fake_counts;
    }
    return em_cuda_kernel_for(b, &mv);
}

static void check_choice(void) {
    cuda_backend b = {};
    b.n_sm = 132;
    b.tuning = read_with(NULL, NULL, NULL, 0);
    /* scratch as em_cuda_reserve sizes it for 512 tokens (pointers only tested for NULL here) */
    b.x16 = (__half *)(uintptr_t)0x30000, b.x16_halves = 512ull * 8192, b.xq_bytes = b.x16_halves / 64 * 80;
    b.mvt_part = (float *)(uintptr_t)0x40000, b.mvt_groups = 8192 / 64 + 1, b.mvt_part_floats = 8192ull * 8 * 16 * 2;
    b.wgmma_loaded = true;
    /* dense-1b: gate+up 8192 x 2048, head 32000 x 2048; moe-30b-a3b's experts: 768 x 2048, 128 of
     * them, 8 a token; the kernels docs/cuda.md's table gives them */
    const struct {
        uint32_t type, rows, cols, tokens;
        bool up;
        uint32_t experts, used;
        em_cuda_matvec_kernel want;
    } cases[] = {
        {EM_TYPE_Q8_0, 8192, 2048, 1, true, 0, 0, EM_CUDA_MATVEC_DP4A},
        {EM_TYPE_Q8_0, 8192, 2048, 4, true, 0, 0, EM_CUDA_MATVEC_IMMA},
        {EM_TYPE_Q4_K, 8192, 2048, 8, true, 0, 0, EM_CUDA_MATVEC_DP4A},
        {EM_TYPE_Q4_K, 2048, 8192, 12, false, 0, 0, EM_CUDA_MATVEC_TC},
        {EM_TYPE_Q4_K, 8192, 2048, 16, true, 0, 0, EM_CUDA_MATVEC_GEMM},
        /* a short chunk: past TC's 16 items, below the GEMM's threshold for narrow quantized products */
        {EM_TYPE_Q6_K, 1024, 2048, 41, false, 0, 0, EM_CUDA_MATVEC_GEMM},
        {EM_TYPE_F32, 1024, 2048, 41, false, 0, 0, EM_CUDA_MATVEC_F32},
        {EM_TYPE_BF16, 8192, 2048, 1, true, 0, 0, EM_CUDA_MATVEC_F32},
        {EM_TYPE_BF16, 32000, 2048, 1, false, 0, 0, EM_CUDA_MATVEC_F32},
        {EM_TYPE_BF16, 32000, 2048, 2, false, 0, 0, EM_CUDA_MATVEC_TC},
        {EM_TYPE_BF16, 2048, 2048, 512, false, 0, 0, EM_CUDA_MATVEC_WGMMA},
        {EM_TYPE_F32, 2048, 2048, 512, false, 0, 0, EM_CUDA_MATVEC_F32},
        {EM_TYPE_Q4_K, 768, 2048, 16, true, 128, 8, EM_CUDA_MATVEC_DP4A},
        {EM_TYPE_BF16, 768, 2048, 32, true, 128, 8, EM_CUDA_MATVEC_TC},
        {EM_TYPE_Q4_K, 768, 2048, 512, true, 128, 8, EM_CUDA_MATVEC_WGMMA},
        /* Q2_K (llama.cpp's IQ3_XXS, Q2_K recipes) has no DP4A unit: F32 where DP4A would take it, then TC, GEMM */
        {EM_TYPE_Q2_K, 8192, 2048, 1, true, 0, 0, EM_CUDA_MATVEC_F32},
        {EM_TYPE_Q2_K, 8192, 2048, 4, true, 0, 0, EM_CUDA_MATVEC_TC},
        {EM_TYPE_Q2_K, 8192, 2048, 16, true, 0, 0, EM_CUDA_MATVEC_GEMM},
        {EM_TYPE_Q2_K, 2048, 2048, 512, false, 0, 0, EM_CUDA_MATVEC_WGMMA},
        {EM_TYPE_Q2_K, 768, 2048, 1, true, 128, 8, EM_CUDA_MATVEC_F32},
        {EM_TYPE_Q2_K, 768, 2048, 16, true, 128, 8, EM_CUDA_MATVEC_TC},
        /* MXFP4 experts of gpt-oss-20b's shape (32 of 2880 x 2880, 4 a token): DP4A up to T = 16, then
         * TC while the mean is under 16, the GEMM's tiles past it; a dense MXFP4 product as the other
         * DP4A types without a row of their own (up to 4 tokens, then TC) */
        {EM_TYPE_MXFP4, 2880, 2880, 1, true, 32, 4, EM_CUDA_MATVEC_DP4A},
        {EM_TYPE_MXFP4, 2880, 2880, 16, false, 32, 4, EM_CUDA_MATVEC_DP4A},
        {EM_TYPE_MXFP4, 2880, 2880, 64, true, 32, 4, EM_CUDA_MATVEC_TC},
        {EM_TYPE_MXFP4, 2880, 2880, 160, true, 32, 4, EM_CUDA_MATVEC_GEMM},
        {EM_TYPE_MXFP4, 2880, 2880, 512, true, 32, 4, EM_CUDA_MATVEC_WGMMA},
        {EM_TYPE_MXFP4, 2880, 2880, 4, false, 0, 0, EM_CUDA_MATVEC_DP4A},
        {EM_TYPE_MXFP4, 2880, 2880, 8, false, 0, 0, EM_CUDA_MATVEC_TC},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const em_cuda_matvec_kernel got = choice(&b, cases[i].type, cases[i].rows, cases[i].cols, cases[i].tokens,
                                                 cases[i].up, cases[i].experts, cases[i].used);
        if (got != cases[i].want)
            fprintf(stderr, "%s %u x %u, %u tokens: %s, not %s\n", em_type_name(cases[i].type), cases[i].rows,
                    cases[i].cols, cases[i].tokens, em_cuda_kernel_name(got), em_cuda_kernel_name(cases[i].want)),
                failed++;
    }
    b.tuning.tensor_cores = false; /* EMBER_CUDA_GEMM=0 */
    EXPECT(choice(&b, EM_TYPE_Q8_0, 8192, 2048, 4, true, 0, 0) == EM_CUDA_MATVEC_F32);
}

int main(void) {
    check_defaults();
    check_overrides();
    check_refused();
    check_choice();
    printf("cuda tuning: %s\n", failed ? "FAIL" : "ok");
    return failed != 0;
}
