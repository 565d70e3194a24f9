/* The CUDA backend's tuning: the switches the environment sets, read once when the backend is made
 * (em_cuda_tuning_read; docs/cuda.md documents every one), and the one choice of the kernel that
 * computes each product (em_cuda_kernel_for), with EMBER_CUDA_TRACE's log of it.
 *
 * The choice, by weight type, the product's shape and role, and the items of the step (tokens, or
 * for MoE the batch's tokens and the mean items per expert), asks the families in this order and
 * takes the first that can take the product and whose threshold it meets:
 *
 *   family (file)            takes it from / up to              the thresholds (em_cuda_tuning)
 *   GEMM   (gemm.cu)         from gemm_from items               by width and weights; MoE by mean
 *     WGMMA among them       from wgmma_from_* items, tiles     for about half the multiprocessors
 *   IMMA   (matvec_imma.cu)  from imma_from (Q8_0), hmma_from   heads: imma_from_head, hmma_from_head
 *                            (BF16 / F16), dense, up to 16
 *   DP4A   (matvec_dp4a.cu)  up to dp4a_upto_* items            by type; MoE by tokens
 *   TC     (matvec_tc.cu)    from tc_from* items, up to 16      heads and MoE apart; MoE by tokens
 *   F32    (matvec.cu)       everything else, and everything with EMBER_CUDA_GEMM=0
 *
 * Why this order: larger batches amortize each weight over more items, so the tiled GEMM wins from
 * some number of items on (earlier for wide products, later for narrow ones and for quantized
 * weights, which the decode kernels read in fewer bytes); below it, the kernels that feed stored
 * weights to the tensor cores (IMMA) win from two items, the integer dot products on 8-bit
 * activations (DP4A) at the fewest items of quantized weights, and the f16 tensor-core kernel (TC)
 * where neither applies. bench/RESULTS.md, "CUDA kernel choice", has the measurements behind
 * each default. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.cuh"

/* ---- the switches ---- */

static const em_cuda_tuning tuning_defaults = {
    .kv_f32 = false, .graphs = true, .pdl = true, .overlap = true, .late_masks = true, .fuse_finish = true,
    .prefill_split = true,
    .tensor_cores = true,
    .int8_activations = true, .wgmma = true, .wgmma_split = true, .wgmma_bf16 = true, .gemm_split = true,
    .tc_iq3_runs = true, .trace = false,
    /* from 2 tokens a norm kernel measured faster than the fold once the experts took 3 units a lane */
    .moe_norm_max = 1,
    /* the cluster merge measured faster up to 4 tokens for every model, slower for MoE at 8 and 16 */
    .dec_cluster_max = 4,
    /* none until the persistent kernel measures faster than the per-operation kernels */
    .mega_tokens = 0, .mega_profile = false, .mega_stage_kb = 32,
    .profile_from = -1, .profile_to = -1,
    /* the GEMM reads each weight row once per tile but pays each K step's latency, so it wins
     * earlier on wide products (the gated unit, the output head) than the decode kernels; past
     * their 16 items only the f32 kernel is left, which feeds every weight to each item from L1,
     * so every product takes the GEMM from 17 (a short chunk of a prompt) */
    .gemm_from_moe = 16, .gemm_from = {{17, 17, 17}, {17, 17, 17}, {8, 8, 16}},
    /* wgmma's 256 x 128 tiles need enough of them (about half the multiprocessors), and half a tile
     * of items or twice as many tiles as multiprocessors; otherwise smaller tiles spread better */
    .wgmma_from_dense = 64, .wgmma_from_moe = 32, .wgmma_sm_32ths = 15,
    /* at one item DP4A (Q8_0) or F32 (BF16 / F16) read faster; the output heads' DP4A blocks round
     * their activations in shared memory, which IMMA beats from 4 items only, and TC's blocks loop
     * over many row groups, which HMMA does not beat */
    .imma_from = 2, .imma_from_head = 4, .hmma_from = 2, .hmma_from_head = EM_CUDA_NEVER,
    /* against TC, DP4A wins every dense Q8_0 and Q4_K product up to 8 items, Q6_K and IQ3_XXS up to
     * 4 (their gated units and heads lose at 8), Q6_K's long rows up to 8, every MoE product up to
     * 16 tokens */
    .dp4a_upto_q8_0_q4_k = 8, .dp4a_upto_other = 4, .dp4a_upto_q6_k_wide = 8, .dp4a_upto_moe = 16,
    /* a lane's fixed work per row shared by 2-3 units instead of one (the expert products are bound
     * by instructions, not bytes); 4 a lane measured slower for the gated experts */
    .dp4a_units = 2, .dp4a_moe_units = 3,
    /* measured per product and then in the whole decode step, which kept only some of the product
     * level wins: F32's early L2 prefetch overlaps the step before at one or two tokens */
    .tc_from = 3, .tc_from_head_q6_k_iq3 = 1, .tc_from_head_half = 2, .tc_from_moe = 2, .tc_from_moe_iq3_down = 1,
};

/* The variable's value, NULL when it is unset or empty (which keep the default). */
static const char *env_value(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* 0 (off) or 1 (on). */
static em_err env_switch(const char *name, bool *out) {
    const char *v = env_value(name);
    if (!v) return NULL;
    if (strcmp(v, "0") && strcmp(v, "1")) return em_errorf(EM_ERR_INVALID, "%s=\"%s\": 0 (off) or 1 (on)", name, v);
    *out = v[0] == '1';
    return NULL;
}

/* A whole number from `least` on; *set (when given) says whether the variable gave one. */
static em_err env_count(const char *name, uint32_t least, uint32_t *out, bool *set) {
    const char *v = env_value(name);
    if (set) *set = v != NULL;
    if (!v) return NULL;
    char *end = NULL;
    errno = 0;
    const unsigned long n = strtoul(v, &end, 10);
    if (*v < '0' || *v > '9' || *end || errno || n >= EM_CUDA_NEVER || n < least)
        return em_errorf(EM_ERR_INVALID, "%s=\"%s\": a whole number from %u", name, v, least);
    *out = (uint32_t)n;
    return NULL;
}

/* "From N items on" for every product of a family: 0 is never. */
static em_err env_from(const char *name, uint32_t *const *fields, size_t n_fields) {
    uint32_t from = 0;
    bool set = false;
    em_err err = env_count(name, 0, &from, &set);
    if (err || !set) return err;
    for (size_t i = 0; i < n_fields; i++) *fields[i] = from ? from : EM_CUDA_NEVER;
    return NULL;
}

static em_err env_profile(em_cuda_tuning *t) {
    const char *v = env_value("EMBER_CUDA_PROFILE");
    if (!v) return NULL;
    long from = -1, to = -1;
    int used = 0;
    if (sscanf(v, "%ld:%ld%n", &from, &to, &used) != 2 || v[used] || from < 0 || to < from)
        return em_errorf(EM_ERR_INVALID, "EMBER_CUDA_PROFILE=\"%s\": FROM:TO, forwards counted from 0", v);
    t->profile_from = from, t->profile_to = to;
    return NULL;
}

static em_err env_kv(em_cuda_tuning *t) {
    const char *v = env_value("EMBER_CUDA_KV");
    if (!v) return NULL;
    if (strcmp(v, "f16") && strcmp(v, "f32")) return em_errorf(EM_ERR_INVALID, "EMBER_CUDA_KV=\"%s\": f16 or f32", v);
    t->kv_f32 = !strcmp(v, "f32");
    return NULL;
}

/* EMBER_CUDA_DP4A=N: the most items of every DP4A product (0: none, and no activations rounded to
 * 8 bits anywhere: not for IMMA's Q8_0 products nor in the persistent kernel); EMBER_CUDA_DP4A_MOE=N
 * of the MoE ones; EMBER_CUDA_DQ_WIDE=0 keeps Q6_K's long rows at the other types' limit. */
static em_err env_dp4a(em_cuda_tuning *t) {
    bool wide = true, set = false;
    uint32_t upto = 0;
    em_err err;
    if ((err = env_count("EMBER_CUDA_DP4A_MOE", 0, &t->dp4a_upto_moe, NULL)) ||
        (err = env_switch("EMBER_CUDA_DQ_WIDE", &wide)) || (err = env_count("EMBER_CUDA_DP4A", 0, &upto, &set)) ||
        (err = env_count("EMBER_CUDA_DQ_UNITS", 1, &t->dp4a_units, NULL)) ||
        (err = env_count("EMBER_CUDA_DQ_MOE_UNITS", 1, &t->dp4a_moe_units, NULL)))
        return err;
    if (!wide) t->dp4a_upto_q6_k_wide = t->dp4a_upto_other;
    if (!set) return NULL;
    t->dp4a_upto_q8_0_q4_k = t->dp4a_upto_other = t->dp4a_upto_q6_k_wide = t->dp4a_upto_moe = upto;
    if (upto == 0) {
        t->int8_activations = false;
        t->imma_from = t->imma_from_head = EM_CUDA_NEVER;
    }
    return NULL;
}

em_err em_cuda_tuning_read(em_cuda_tuning *t) {
    *t = tuning_defaults;
    uint32_t *const imma[] = {&t->imma_from, &t->imma_from_head};
    uint32_t *const hmma[] = {&t->hmma_from, &t->hmma_from_head};
    uint32_t *const tc[] = {&t->tc_from, &t->tc_from_head_q6_k_iq3, &t->tc_from_head_half, &t->tc_from_moe,
                            &t->tc_from_moe_iq3_down};
    uint32_t *const gemm[] = {&t->gemm_from[0][0], &t->gemm_from[0][1], &t->gemm_from[0][2],
                              &t->gemm_from[1][0], &t->gemm_from[1][1], &t->gemm_from[1][2],
                              &t->gemm_from[2][0], &t->gemm_from[2][1], &t->gemm_from[2][2]};
    uint32_t *const gemm_moe[] = {&t->gemm_from_moe};
    em_err err;
    if ((err = env_kv(t)) || (err = env_switch("EMBER_CUDA_GRAPHS", &t->graphs)) ||
        (err = env_switch("EMBER_CUDA_PDL", &t->pdl)) || (err = env_switch("EMBER_CUDA_OVERLAP", &t->overlap)) ||
        (err = env_switch("EMBER_CUDA_LATE_MASKS", &t->late_masks)) ||
        (err = env_switch("EMBER_CUDA_FUSE_FINISH", &t->fuse_finish)) ||
        (err = env_switch("EMBER_CUDA_PF_SPLIT", &t->prefill_split)) ||
        (err = env_switch("EMBER_CUDA_GEMM", &t->tensor_cores)) || (err = env_switch("EMBER_CUDA_WGMMA", &t->wgmma)) ||
        (err = env_switch("EMBER_CUDA_WG_SPLIT", &t->wgmma_split)) ||
        (err = env_switch("EMBER_CUDA_GM_SPLIT", &t->gemm_split)) ||
        (err = env_switch("EMBER_CUDA_TC_RUNS", &t->tc_iq3_runs)) ||
        (err = env_switch("EMBER_CUDA_WG_BF16", &t->wgmma_bf16)) || (err = env_switch("EMBER_CUDA_TRACE", &t->trace)) ||
        (err = env_count("EMBER_CUDA_MOE_NORM", 0, &t->moe_norm_max, NULL)) ||
        (err = env_count("EMBER_CUDA_DEC_CLUSTER", 0, &t->dec_cluster_max, NULL)) ||
        (err = env_count("EMBER_CUDA_MEGA", 0, &t->mega_tokens, NULL)) ||
        (err = env_switch("EMBER_CUDA_MEGA_PROFILE", &t->mega_profile)) ||
        (err = env_count("EMBER_CUDA_MEGA_STAGE_KB", 0, &t->mega_stage_kb, NULL)) || (err = env_profile(t)) ||
        (err = env_from("EMBER_CUDA_IMMA", imma, 2)) || (err = env_from("EMBER_CUDA_HMMA", hmma, 2)) ||
        (err = env_from("EMBER_CUDA_MVT", tc, 5)) || (err = env_from("EMBER_CUDA_GEMM_FROM", gemm, 9)) ||
        (err = env_from("EMBER_CUDA_GEMM_MOE", gemm_moe, 1)))
        return err;
    return env_dp4a(t); /* after EMBER_CUDA_IMMA: EMBER_CUDA_DP4A=0 turns IMMA's Q8_0 products off */
}

/* ---- the choice ---- */

static uint32_t gemm_from(const em_cuda_tuning *t, const cuda_matvec *mv) {
    if (mv->counts) return t->gemm_from_moe;
    const uint32_t type = mv->w->type, rows = em_cuda_matvec_rows(mv), width = mv->up ? 2 * rows : rows;
    const int weights = type == EM_TYPE_BF16 ? 0 : type == EM_TYPE_F16 ? 1 : 2;
    const int by_width = width >= EM_CUDA_WIDE_ROWS ? 2 : width <= EM_CUDA_NARROW_ROWS ? 0 : 1;
    return t->gemm_from[by_width][weights];
}

bool em_cuda_wgmma_wanted(const cuda_backend *b, const cuda_matvec *mv) {
    const em_cuda_tuning *t = &b->tuning;
    if (!t->wgmma) return false;
    const uint64_t tiles = em_cuda_wgmma_tiles(mv), sms = (uint64_t)b->n_sm;
    const bool enough_items = mv->counts ? mv->n_items >= t->wgmma_from_moe
                                         : mv->n_items >= t->wgmma_from_dense || tiles >= 2 * sms;
    return tiles * em_cuda_gemm_wg_splits(b, mv) >= sms * t->wgmma_sm_32ths / 32 && enough_items &&
           em_cuda_wgmma_takes(b, mv);
}

static uint32_t imma_from(const cuda_backend *b, const cuda_matvec *mv) {
    const bool head = em_cuda_dq_staged(b, mv);
    if (mv->w->type == EM_TYPE_Q8_0) return head ? b->tuning.imma_from_head : b->tuning.imma_from;
    return head ? b->tuning.hmma_from_head : b->tuning.hmma_from;
}

static uint32_t dp4a_upto(const em_cuda_tuning *t, const cuda_matvec *mv) {
    const uint32_t type = mv->w->type;
    if (mv->counts) return t->dp4a_upto_moe;
    if (type == EM_TYPE_Q8_0 || type == EM_TYPE_Q4_K) return t->dp4a_upto_q8_0_q4_k;
    if (type == EM_TYPE_Q6_K && mv->w->cols >= 2 * em_cuda_matvec_rows(mv)) return t->dp4a_upto_q6_k_wide;
    return t->dp4a_upto_other;
}

static uint32_t tc_from(const em_cuda_tuning *t, const cuda_matvec *mv) {
    const uint32_t type = mv->w->type;
    if (mv->counts) return !mv->up && type == EM_TYPE_IQ3_XXS ? t->tc_from_moe_iq3_down : t->tc_from_moe;
    if (em_cuda_matvec_rows(mv) >= EM_CUDA_HEAD_ROWS) {
        if (type == EM_TYPE_Q6_K || type == EM_TYPE_IQ3_XXS) return t->tc_from_head_q6_k_iq3;
        if (type == EM_TYPE_BF16 || type == EM_TYPE_F16) return t->tc_from_head_half;
    }
    return t->tc_from;
}

em_cuda_matvec_kernel em_cuda_kernel_for(const cuda_backend *b, const cuda_matvec *mv) {
    const em_cuda_tuning *t = &b->tuning;
    if (!t->tensor_cores) return EM_CUDA_MATVEC_F32;
    /* MoE products count the batch's tokens (an expert's most items) where the kernel loops over an
     * expert's items in passes, and the mean items per expert where that sizes its grid */
    const uint32_t items = mv->n_items, tokens = mv->counts ? mv->max_items : mv->n_items;
    if (em_cuda_gemm_takes(b, mv) && items >= gemm_from(t, mv))
        return em_cuda_wgmma_wanted(b, mv) ? EM_CUDA_MATVEC_WGMMA : EM_CUDA_MATVEC_GEMM;
    if (em_cuda_imma_takes(b, mv) && items >= imma_from(b, mv)) return EM_CUDA_MATVEC_IMMA;
    if (em_cuda_dq_takes(b, mv) && tokens <= dp4a_upto(t, mv)) return EM_CUDA_MATVEC_DP4A;
    /* MoE: up to where the GEMM takes over */
    if (em_cuda_mvt_takes(b, mv) && tokens >= tc_from(t, mv) && (!mv->counts || items < t->gemm_from_moe))
        return EM_CUDA_MATVEC_TC;
    return EM_CUDA_MATVEC_F32;
}

const char *em_cuda_kernel_name(em_cuda_matvec_kernel kernel) {
    switch (kernel) {
    case EM_CUDA_MATVEC_F32: return "f32 (matvec.cu)";
    case EM_CUDA_MATVEC_TC: return "tc (matvec_tc.cu)";
    case EM_CUDA_MATVEC_DP4A: return "dp4a (matvec_dp4a.cu)";
    case EM_CUDA_MATVEC_IMMA: return "imma (matvec_imma.cu)";
    case EM_CUDA_MATVEC_GEMM: return "mma tiles (gemm.cu)";
    case EM_CUDA_MATVEC_WGMMA: return "wgmma (gemm.cu)";
    default: return "auto";
    }
}

/* ---- EMBER_CUDA_TRACE ---- */

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ull; }

/* Whether `key` is new (then remembered). Past what memory allows, nothing is new. */
static bool first_time(cuda_trace *tr, uint64_t key) {
    for (uint32_t i = 0; i < tr->n_seen; i++)
        if (tr->seen[i] == key) return false;
    if (tr->n_seen == tr->cap_seen) {
        const uint32_t cap = tr->cap_seen ? 2 * tr->cap_seen : 64;
        uint64_t *seen = (uint64_t *)realloc(tr->seen, cap * sizeof *seen);
        if (!seen) return false;
        tr->seen = seen, tr->cap_seen = cap;
    }
    tr->seen[tr->n_seen++] = key;
    return true;
}

static const char *role_of(const cuda_matvec *mv) {
    if (mv->counts) return mv->up ? "experts gate+up" : "experts";
    if (mv->n_parts > 1) return mv->n_parts == 3 ? "q+k+v" : "2 parts";
    if (mv->up) return "gate+up";
    return em_cuda_matvec_rows(mv) >= EM_CUDA_HEAD_ROWS ? "output head" : "dense";
}

void em_cuda_trace_product(cuda_backend *b, const cuda_matvec *mv, em_cuda_matvec_kernel kernel) {
    const uint32_t rows = em_cuda_matvec_rows(mv);
    uint64_t key = 14695981039346656037ull;
    const uint64_t fields[] = {mv->w->type, rows, mv->w->cols, mv->n_parts, mv->up != NULL, mv->counts != NULL,
                               mv->n_items, mv->max_items, mv->norm_ss != NULL, (uint64_t)kernel};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) key = mix(key, fields[i]);
    if (!first_time(&b->trace, key)) return;
    if (mv->counts)
        fprintf(stderr, "cuda trace: %-7s %6u x %-6u %-16s %5u tokens (%u per expert) -> %s\n",
                em_type_name(mv->w->type), rows, mv->w->cols, role_of(mv), mv->max_items, mv->n_items,
                em_cuda_kernel_name(kernel));
    else
        fprintf(stderr, "cuda trace: %-7s %6u x %-6u %-16s %5u tokens -> %s\n", em_type_name(mv->w->type), rows,
                mv->w->cols, role_of(mv), mv->n_items, em_cuda_kernel_name(kernel));
}

void em_cuda_trace_step(cuda_backend *b, uint32_t n_tokens, const char *how) {
    if (first_time(&b->trace, mix(mix(0, n_tokens), (uint64_t)(uintptr_t)how)))
        fprintf(stderr, "cuda trace: steps of %u tokens: %s\n", n_tokens, how);
}

void em_cuda_trace_free(cuda_backend *b) {
    free(b->trace.seen);
    b->trace = cuda_trace{};
}
