/* Checks and measures the tensor-core products (src/backend/cuda/gemm.cu, and matvec_tc.cu for
 * decode batches) on a GPU. Not a ctest test (CI has no GPU); tests/cuda/gemm.sh runs it.
 *
 *   check_gemm            correctness, then the measurements
 *   check_gemm --check    correctness only
 *   check_gemm --decode   the decode-sized products: f32 kernel against tensor-core kernel and
 *                         the dp4a kernel, dense (dense-1b's and moe-30b-a3b's attention shapes)
 *                         and MoE experts
 *
 * Correctness: for every weight type the GEMM reads (MXFP4 included: gpt-oss's experts, at its
 * width of 2880 as well), descriptors of each kind em_cuda_matvec
 * takes (plain, Q/K/V parts, the gated unit with SwiGLU and GeGLU, MoE groups with an activation
 * index and uneven counts including empty experts, the residual add), with item counts and row
 * counts that are not multiples of the tiles and K of 768, 2048 and 8192, run with both kernels
 * (staged, pipelined) and each tile size, which must all give the same bits. Each result is
 * compared with a reference computed here in double from the dequantized weights (em_dequantize:
 * every stored value exactly) and the f32 activations, and with em_cuda_matvec on the same
 * descriptor (the GEMM switched off: EMBER_CUDA_GEMM=0). The error is max|y - ref| / max|ref|;
 * both must be <= 1e-2 (f16 operands: expect a few 1e-4; the wgmma kernel's bf16 operands for BF16
 * weights, a few 1e-3). Y is filled with NaN bit patterns
 * before each run, and columns past the rows (y_stride pads) must keep their bytes: unwritten
 * and overwritten outputs both fail. The decode tensor-core kernel runs every descriptor of up to
 * 16 items and every MoE one, to the same bound, and must give an item computed alone the same
 * bits as in its batch; so does the dp4a kernel on 8-bit activations (matvec_dp4a.cu) for every
 * descriptor of a quantized type it takes (K a multiple of 64), its rounding of the activations
 * included in the bound. The wgmma kernel runs every descriptor with K a multiple of 64, to the
 * same bound; where it splits K (a dense product of few tiles: the line says in how many parts),
 * it also runs with K whole, to the same bound, and an item alone gets its batch's bits with the
 * batch's splits.
 *
 * Measurements: TFLOP/s of the GEMM (the automatic pick, and each kernel with each tile size) and
 * of the matvec on the dense-1b shapes (Llama-3.2-1B) and a moe-30b-a3b expert layer, for a table
 * and the crossover batch size. Prints PASS/FAIL rows; exits 1 on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/internal.cuh"
extern "C" {
#include "model/model.h"
}

static void check_err(em_err err, const char *what) {
    if (!err) return;
    fprintf(stderr, "%s: %s\n", what, em_err_message(err));
    exit(1);
}

#define CUDA_CHECK(call)                                                                            \
    do {                                                                                            \
        cudaError_t status_ = (call);                                                               \
        if (status_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s: %s (line %d)\n", #call, cudaGetErrorString(status_), __LINE__);     \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * (2.0 / 16777216.0) - 1.0);
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
}

static cuda_backend backend;

static void make_backend(void) {
    cuda_backend *b = &backend;
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaDeviceGetAttribute(&b->n_sm, cudaDevAttrMultiProcessorCount, 0));
    check_err(em_cuda_tuning_read(&b->tuning), "tuning"); /* as em_backend_cuda_new: the environment's */
    check_err(em_cuda_products_setup(b), "product kernels' setup");
    /* split-K scratch of the decode tensor-core products, for products of up to 16384 rows */
    b->mvt_part_floats = 16384ull * 8 * 16 * 2;
    b->mvt_groups = 16384 / 64 + 1;
    b->mvt_part = (float *)dev_alloc(b->mvt_part_floats * sizeof(float));
    b->mvt_counter = (uint32_t *)dev_alloc(b->mvt_groups * sizeof(uint32_t));
    CUDA_CHECK(cudaMemset(b->mvt_counter, 0, b->mvt_groups * sizeof(uint32_t)));
    /* split-K partial sums of the wgmma kernel (gemm.cu: em_cuda_gemm_wg_splits) */
    b->wg_part = (float *)dev_alloc(em_cuda_gemm_split_floats(b) * sizeof(float));
    /* the wgmma kernel's f16 activations: up to 8192 items of 8192 columns */
    b->x16_halves = 8192ull * 8192;
    b->x16 = (__half *)dev_alloc(b->x16_halves * sizeof(__half));
    /* the dp4a products' 8-bit activations, as many (units of 64 in 80 bytes) */
    b->xq_bytes = b->x16_halves / 64 * 80;
    b->xq = (int8_t *)dev_alloc(b->xq_bytes);
    b->xd = (float2 *)dev_alloc(b->x16_halves / 32 * sizeof(float2));
}

/* EMBER_CUDA_GEMM=1 or 0, as the backend holds it */
static void set_gemm(bool on) { backend.tuning.tensor_cores = on; }

/* A weight of n_mat matrices of rows x cols from random values; `host` holds what it decodes to. */
typedef struct test_weight {
    cuda_weight w;
    float *host;
} test_weight;

static test_weight make_weight(uint32_t type, uint32_t rows, uint32_t cols, uint32_t n_mat) {
    test_weight t = {};
    const uint64_t n = (uint64_t)rows * cols * n_mat;
    uint64_t row_bytes = 0;
    check_err(em_type_row_bytes(type, cols, &row_bytes), "row bytes");
    float *f = (float *)malloc(n * sizeof(float));
    uint8_t *q = (uint8_t *)malloc(row_bytes * rows * n_mat);
    t.host = (float *)malloc(n * sizeof(float));
    for (uint64_t i = 0; i < n; i++) f[i] = frand();
    check_err(em_quantize(type, f, q, n), "quantize");
    check_err(em_dequantize(type, q, t.host, n), "dequantize");
    uint8_t *d = (uint8_t *)dev_alloc(row_bytes * rows * n_mat);
    CUDA_CHECK(cudaMemcpy(d, q, row_bytes * rows * n_mat, cudaMemcpyHostToDevice));
    t.w = cuda_weight{d, type, cols, rows, n_mat, row_bytes};
    free(f);
    free(q);
    return t;
}

static void free_weight(test_weight *t) {
    cudaFree((void *)t->w.data);
    free(t->host);
}

/* ---- correctness ---- */

typedef struct test_case {
    const char *name;
    uint32_t cols;
    uint32_t rows[3];
    uint32_t n_parts; /* 1..3 */
    bool glu;
    em_activation act;
    uint32_t items;   /* dense: items; MoE: rows of X */
    bool moe;
    bool accumulate;
} test_case;

#define MOE_EXPERTS 5
static const uint32_t moe_counts[MOE_EXPERTS] = {7, 0, 130, 1, 40};

static double glu_ref(double g, double u, em_activation act) {
    if (act == EM_ACT_GEGLU) return 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    return g / (1.0 + exp(-g)) * u;
}

static double dot_ref(const float *w, const float *x, uint32_t n) {
    double s = 0.0;
    for (uint32_t k = 0; k < n; k++) s += (double)w[k] * x[k];
    return s;
}

typedef struct case_result {
    double err_ref, err_matvec, err_tc; /* err_tc: the decode tensor-core kernel against ref (-1: not run) */
    bool tc_alone_same; /* its first item computed alone has the same bits as in the batch */
    double err_wg;      /* the wgmma kernel against ref (-1: not run: K % 64 == 0 only) */
    double err_dq;      /* the dp4a kernel against ref (-1: not run: quantized types, K % 64 == 0) */
    bool dq_alone_same;
    bool wg_alone_same; /* its first item computed alone has the same bits as in the batch */
    double err_kernel[2]; /* err_ref of the staged and the pipelined kernel */
    bool pads_ok; /* the y_stride pads kept their bytes */
    bool same;    /* every kernel and tile size gave the same bits */
    double err_im; /* matvec_imma.cu's kernel against ref (-1: not run: Q8_0, BF16, F16 up to 16 items) */
    bool im_alone_same;
    uint32_t wg_splits; /* the splits of K the wgmma kernel took (gemm.cu: em_cuda_gemm_wg_splits) */
    double err_wg_whole; /* with more than one: the wgmma kernel with K whole, against ref (-1: not run) */
} case_result;

/* run() modes beyond the GEMM's tile sizes: the decode tensor-core kernel, on all items or on the
 * first alone. */
#define TC_RUN 1000u
#define TC_ALONE 1001u
#define WG_RUN 1002u /* the wgmma kernel, all items or the first alone */
#define WG_ALONE 1003u
#define DQ_RUN 1004u /* the kernel on 8-bit activations (matvec_dp4a.cu), all items or the first alone */
#define DQ_ALONE 1005u
#define IM_RUN 1006u /* matvec_imma.cu's kernel (weights fed to mma.sync as stored), all items or the first alone */
#define IM_ALONE 1007u
#define WG_WHOLE 1008u /* the wgmma kernel with K in one piece (no split) */

/* Runs `c` with weights of `type`; the worst errors over the tile sizes. */
static bool run_case(uint32_t type, const test_case *c) {
    cuda_backend *b = &backend;
    backend.step.act = c->act;
    const uint32_t K = c->cols, parts = c->n_parts;
    const uint32_t groups = c->moe ? MOE_EXPERTS : 1;
    test_weight w[3], up = {};
    for (uint32_t p = 0; p < parts; p++) w[p] = make_weight(type, c->rows[p], K, groups);
    if (c->glu) up = make_weight(type, c->rows[0], K, groups);

    /* items: dense 0..items-1 reading X rows in order; MoE: expert e owns [starts[e], +counts[e]) */
    uint32_t counts[MOE_EXPERTS], starts[MOE_EXPERTS], n_items = c->items;
    if (c->moe) {
        n_items = 0;
        for (uint32_t e = 0; e < groups; e++) counts[e] = moe_counts[e], starts[e] = n_items, n_items += counts[e];
    } else {
        counts[0] = n_items, starts[0] = 0;
    }
    uint32_t *x_index = (uint32_t *)malloc(n_items * sizeof(uint32_t));
    for (uint32_t i = 0; i < n_items; i++) x_index[i] = c->moe ? (uint32_t)((frand() + 1.0f) * 0.5f * c->items) % c->items : i;
    const uint64_t x_stride = K + 4, x_rows = c->items;
    float *x = (float *)malloc(x_rows * x_stride * sizeof(float));
    for (uint64_t i = 0; i < x_rows * x_stride; i++) x[i] = frand();

    float *x_dev = (float *)dev_alloc(x_rows * x_stride * sizeof(float));
    CUDA_CHECK(cudaMemcpy(x_dev, x, x_rows * x_stride * sizeof(float), cudaMemcpyHostToDevice));
    uint32_t *index_dev = (uint32_t *)dev_alloc(n_items * sizeof(uint32_t) + 4);
    uint32_t *counts_dev = (uint32_t *)dev_alloc(sizeof counts), *starts_dev = (uint32_t *)dev_alloc(sizeof starts);
    CUDA_CHECK(cudaMemcpy(index_dev, x_index, n_items * sizeof(uint32_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(counts_dev, counts, sizeof counts, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(starts_dev, starts, sizeof starts, cudaMemcpyHostToDevice));

    /* Y of each part: n_items rows of y_stride = rows + 3 (the pad must stay as it was) */
    float *y_dev[3], *y_host[3], *y0[3], *y_gemm[3];
    double *ref[3];
    uint64_t y_stride[3];
    double scale = 0.0;
    for (uint32_t p = 0; p < parts; p++) {
        y_stride[p] = c->rows[p] + 3;
        const uint64_t n = n_items * y_stride[p];
        y_dev[p] = (float *)dev_alloc(n * sizeof(float) + 4);
        y_host[p] = (float *)malloc(n * sizeof(float) + 4);
        y_gemm[p] = (float *)malloc(n * sizeof(float) + 4);
        y0[p] = (float *)malloc(n * sizeof(float) + 4);
        ref[p] = (double *)calloc(n + 1, sizeof(double));
        for (uint64_t i = 0; i < n; i++) {
            uint32_t nan_bits = 0xffffffffu;
            if (c->accumulate) y0[p][i] = frand();
            else memcpy(&y0[p][i], &nan_bits, 4);
        }
        const uint64_t mat = (uint64_t)c->rows[p] * K;
        for (uint32_t e = 0; e < groups; e++) {
            for (uint32_t i = starts[e]; i < starts[e] + counts[e]; i++) {
                const float *xr = x + (uint64_t)x_index[i] * x_stride;
                for (uint32_t r = 0; r < c->rows[p]; r++) {
                    double v = dot_ref(w[p].host + e * mat + (uint64_t)r * K, xr, K);
                    if (c->glu) v = glu_ref(v, dot_ref(up.host + e * mat + (uint64_t)r * K, xr, K), c->act);
                    if (c->accumulate) v += y0[p][i * y_stride[p] + r];
                    ref[p][i * y_stride[p] + r] = v;
                    if (fabs(v) > scale) scale = fabs(v);
                }
            }
        }
    }

    cuda_matvec mv = {};
    mv.w = &w[0].w;
    mv.x = x_dev, mv.x_stride = x_stride;
    mv.x_index = c->moe ? index_dev : NULL;
    mv.y = y_dev[0], mv.y_stride = y_stride[0];
    mv.n_items = c->moe ? (n_items + groups - 1) / groups : n_items;
    mv.max_items = c->moe ? c->items : 0, mv.x_rows = c->moe ? c->items : 0;
    mv.counts = c->moe ? counts_dev : NULL, mv.starts = c->moe ? starts_dev : NULL;
    mv.n_groups = groups;
    mv.up = c->glu ? &up.w : NULL;
    mv.n_parts = parts;
    for (uint32_t p = 1; p < parts; p++) {
        mv.more[p - 1].w = &w[p].w;
        mv.more[p - 1].y = y_dev[p], mv.more[p - 1].y_stride = y_stride[p];
    }
    mv.accumulate = c->accumulate;

    /* error of the outputs against ref (and the pads against y0) */
    auto compare = [&](float *const *got, const double *const *want, bool *pads_ok) {
        double diff = 0.0;
        for (uint32_t p = 0; p < parts; p++) {
            for (uint32_t i = 0; i < n_items; i++) {
                for (uint64_t r = 0; r < y_stride[p]; r++) {
                    const uint64_t at = i * y_stride[p] + r;
                    if (r < c->rows[p]) {
                        const double d = fabs(got[p][at] - want[p][at]);
                        if (d != d) diff = INFINITY; /* unwritten (NaN poison) or NaN result */
                        else if (d > diff) diff = d;
                    } else if (memcmp(&got[p][at], &y0[p][at], 4)) {
                        *pads_ok = false;
                    }
                }
            }
        }
        return diff / scale;
    };
    auto run = [&](bool gemm, uint32_t tile, em_cuda_gemm_kernel kernel) {
        for (uint32_t p = 0; p < parts; p++)
            CUDA_CHECK(cudaMemcpy(y_dev[p], y0[p], n_items * y_stride[p] * sizeof(float), cudaMemcpyHostToDevice));
        if (tile == WG_RUN || tile == WG_ALONE || tile == WG_WHOLE) {
            /* alone: with the batch's splits of K (a different split adds in another order) */
            cuda_matvec one = mv;
            if (tile == WG_ALONE) one.n_items = 1;
            const uint32_t splits = tile == WG_ALONE ? em_cuda_gemm_wg_splits(b, &mv) : tile == WG_WHOLE ? 1 : 0;
            check_err(em_cuda_gemm_with(b, &one, splits, EM_CUDA_GEMM_WGMMA), "wgmma gemm");
        } else if (tile == DQ_RUN || tile == DQ_ALONE) {
            cuda_matvec one = mv;
            if (tile == DQ_ALONE) one.n_items = 1;
            check_err(em_cuda_matvec_with(b, &one, EM_CUDA_MATVEC_DP4A), "dp4a matvec");
        } else if (tile == IM_RUN || tile == IM_ALONE) {
            cuda_matvec one = mv;
            if (tile == IM_ALONE) one.n_items = 1;
            check_err(em_cuda_matvec_with(b, &one, EM_CUDA_MATVEC_IMMA), "matvec_imma.cu matvec");
        } else if (tile == TC_RUN || tile == TC_ALONE) {
            cuda_matvec one = mv;
            if (tile == TC_ALONE) one.n_items = 1;
            check_err(em_cuda_matvec_with(b, &one, EM_CUDA_MATVEC_TC), "tensor-core matvec");
        } else if (gemm) {
            check_err(em_cuda_gemm_with(b, &mv, tile, kernel), "gemm");
        } else {
            /* the matvec has no residual add of its own yet: run it plain and add here */
            cuda_matvec plain = mv;
            plain.accumulate = false;
            set_gemm(false);
            check_err(em_cuda_matvec(b, &plain), "matvec");
            set_gemm(true);
        }
        CUDA_CHECK(cudaStreamSynchronize(b->stream));
        CUDA_CHECK(cudaGetLastError());
        for (uint32_t p = 0; p < parts; p++) {
            CUDA_CHECK(cudaMemcpy(y_host[p], y_dev[p], n_items * y_stride[p] * sizeof(float), cudaMemcpyDeviceToHost));
            if (!gemm && tile < TC_RUN && c->accumulate)
                for (uint32_t i = 0; i < n_items; i++)
                    for (uint32_t r = 0; r < c->rows[p]; r++) y_host[p][i * y_stride[p] + r] += y0[p][i * y_stride[p] + r];
        }
    };

    case_result res = {0.0, 0.0, -1.0, true, -1.0, -1.0, true, true, {0.0, 0.0}, true, true, -1.0, true, 1, -1.0};
    /* both kernels and every tile size give bit-identical outputs (same rounding, fixed order) */
    const uint32_t tiles[] = {0, 32, 64, 128};
    const em_cuda_gemm_kernel kernels[] = {EM_CUDA_GEMM_STAGED, EM_CUDA_GEMM_PIPELINED};
    double *gemm_as_ref[3];
    for (uint32_t v = 0; v < 8; v++) {
        run(true, tiles[v % 4], kernels[v / 4]);
        const double e = compare(y_host, ref, &res.pads_ok);
        if (!(e <= res.err_ref)) res.err_ref = e;
        if (!(e <= res.err_kernel[v / 4])) res.err_kernel[v / 4] = e;
        if (v == 0)
            for (uint32_t p = 0; p < parts; p++) memcpy(y_gemm[p], y_host[p], n_items * y_stride[p] * sizeof(float));
        else
            for (uint32_t p = 0; p < parts; p++)
                if (memcmp(y_gemm[p], y_host[p], n_items * y_stride[p] * sizeof(float))) res.same = false;
    }
    for (uint32_t p = 0; p < parts; p++) {
        gemm_as_ref[p] = (double *)malloc(n_items * y_stride[p] * sizeof(double) + 8);
        for (uint64_t i = 0; i < n_items * y_stride[p]; i++) gemm_as_ref[p][i] = y_gemm[p][i];
    }
    run(false, 0, EM_CUDA_GEMM_AUTO);
    bool matvec_pads = true;
    res.err_matvec = compare(y_host, gemm_as_ref, &matvec_pads);
    /* whether the first item, run alone in mode `alone`, gets the bits it got in the batch just run */
    auto alone_same = [&](bool gemm, uint32_t alone, em_cuda_gemm_kernel kernel) {
        float *first = (float *)malloc(y_stride[0] * sizeof(float));
        memcpy(first, y_host[0], y_stride[0] * sizeof(float));
        run(gemm, alone, kernel);
        const bool same = !memcmp(first, y_host[0], c->rows[0] * sizeof(float));
        free(first);
        return same;
    };
    /* the decode tensor-core kernel: batches of up to 16 (MoE: any, in chunks) */
    if (c->moe || n_items <= 16) {
        run(false, TC_RUN, EM_CUDA_GEMM_AUTO);
        res.err_tc = compare(y_host, ref, &res.pads_ok);
        if (!c->moe) res.tc_alone_same = alone_same(false, TC_ALONE, EM_CUDA_GEMM_AUTO);
    }

    /* the wgmma kernel: its own order of sums inside an MMA, so bounded against ref, not bitwise
     * against the others; an item alone gets its bits in the batch */
    if (K % 64 == 0) {
        res.wg_splits = em_cuda_gemm_wg_splits(b, &mv);
        if (res.wg_splits > 1) {
            run(true, WG_WHOLE, EM_CUDA_GEMM_WGMMA);
            res.err_wg_whole = compare(y_host, ref, &res.pads_ok);
        }
        run(true, WG_RUN, EM_CUDA_GEMM_WGMMA);
        res.err_wg = compare(y_host, ref, &res.pads_ok);
        if (!c->moe) res.wg_alone_same = alone_same(true, WG_ALONE, EM_CUDA_GEMM_WGMMA);
    }

    /* the kernel on 8-bit activations: the activations' rounding adds a few 1e-3 against ref */
    if (em_cuda_dq_takes(b, &mv)) {
        run(false, DQ_RUN, EM_CUDA_GEMM_AUTO);
        res.err_dq = compare(y_host, ref, &res.pads_ok);
        if (!c->moe) res.dq_alone_same = alone_same(false, DQ_ALONE, EM_CUDA_GEMM_AUTO);
    }

    /* matvec_imma.cu: Q8_0 with the dp4a kernel's rounding of the activations, BF16 / F16 in f16 */
    if (em_cuda_imma_takes(b, &mv)) {
        run(false, IM_RUN, EM_CUDA_GEMM_AUTO);
        res.err_im = compare(y_host, ref, &res.pads_ok);
        res.im_alone_same = alone_same(false, IM_ALONE, EM_CUDA_GEMM_AUTO);
    }

    const bool pass = res.err_ref <= 1e-2 && res.err_matvec <= 1e-2 && res.err_tc <= 1e-2 && res.err_wg <= 1e-2 &&
                      res.err_wg_whole <= 1e-2 &&
                      res.err_dq <= 1e-2 && res.err_im <= 1e-2 && res.pads_ok && res.same && res.tc_alone_same &&
                      res.wg_alone_same && res.dq_alone_same && res.im_alone_same;
    printf("%-5s %-8s %-22s K=%-5u items=%-4u  vs ref %.2e (staged %.2e, pipelined %.2e)  vs matvec %.2e  "
           "decode tc %.2e  wgmma %.2e (K in %u, whole %.2e)  dp4a %.2e  imma %.2e  %s%s%s%s%s%s%s\n",
           pass ? "PASS" : "FAIL", em_type_name(type), c->name, K, n_items, res.err_ref, res.err_kernel[0],
           res.err_kernel[1], res.err_matvec, res.err_tc, res.err_wg, res.wg_splits, res.err_wg_whole, res.err_dq,
           res.err_im,
           res.pads_ok ? "" : "(pads overwritten) ",
           res.same ? "" : "(kernels/tiles differ) ", res.tc_alone_same ? "" : "(tc: alone differs from batched) ",
           res.wg_alone_same ? "" : "(wgmma: alone differs from batched) ",
           res.dq_alone_same ? "" : "(dp4a: alone differs from batched) ",
           res.im_alone_same ? "" : "(imma: alone differs from batched) ",
           pass ? "" : "<<<");

    for (uint32_t p = 0; p < parts; p++) {
        cudaFree(y_dev[p]);
        free(y_host[p]), free(y_gemm[p]), free(y0[p]), free(ref[p]), free(gemm_as_ref[p]);
        free_weight(&w[p]);
    }
    if (c->glu) free_weight(&up);
    cudaFree(x_dev), cudaFree(index_dev), cudaFree(counts_dev), cudaFree(starts_dev);
    free(x), free(x_index);
    return pass;
}

static int check_all(void) {
    static const test_case cases[] = {
        {"plain 1 item", 2048, {300}, 1, false, EM_ACT_SWIGLU, 1, false, false},
        {"plain", 2048, {300}, 1, false, EM_ACT_SWIGLU, 5, false, false},
        {"plain", 2048, {300}, 1, false, EM_ACT_SWIGLU, 33, false, false},
        {"plain (row tail)", 2144, {37}, 1, false, EM_ACT_SWIGLU, 16, false, false},
        {"3 parts (qkv)", 2048, {200, 72, 40}, 3, false, EM_ACT_SWIGLU, 12, false, false},
        {"glu swiglu", 2048, {136}, 1, true, EM_ACT_SWIGLU, 9, false, false},
        {"accumulate", 8192, {136}, 1, false, EM_ACT_SWIGLU, 3, false, true},
        {"plain", 768, {128}, 1, false, EM_ACT_SWIGLU, 130, false, false},
        {"plain", 2048, {136}, 1, false, EM_ACT_SWIGLU, 257, false, false},
        {"3 parts (qkv)", 768, {200, 72, 40}, 3, false, EM_ACT_SWIGLU, 130, false, false},
        {"2 parts", 2048, {64, 136}, 2, false, EM_ACT_SWIGLU, 40, false, false},
        {"glu swiglu", 2048, {200}, 1, true, EM_ACT_SWIGLU, 67, false, false},
        {"glu geglu", 768, {136}, 1, true, EM_ACT_GEGLU, 300, false, false},
        {"moe", 768, {200}, 1, false, EM_ACT_SWIGLU, 64, true, false},
        {"moe glu swiglu", 2048, {136}, 1, true, EM_ACT_SWIGLU, 50, true, false},
        {"moe accumulate", 768, {72}, 1, false, EM_ACT_SWIGLU, 30, true, true},
        {"accumulate", 8192, {136}, 1, false, EM_ACT_SWIGLU, 70, false, true},
        /* more row blocks than 8 per multiprocessor: the dp4a kernel's staged launch (its blocks
         * loop over row blocks and round the activations themselves, as for the output heads) */
        {"plain (head-sized: staged dp4a)", 2048, {9000}, 1, false, EM_ACT_SWIGLU, 4, false, false},
        /* gpt-oss's width (2880: 90 blocks of 32, not of 256), its experts' gated unit and down */
        {"moe glu swiglu (2880)", 2880, {200}, 1, true, EM_ACT_SWIGLU, 40, true, false},
        {"moe (2880)", 2880, {136}, 1, false, EM_ACT_SWIGLU, 12, true, false},
        {"plain (2880)", 2880, {136}, 1, false, EM_ACT_SWIGLU, 3, false, false},
    };
    static const uint32_t types[] = {EM_TYPE_BF16, EM_TYPE_F16,     EM_TYPE_Q8_0, EM_TYPE_Q4_K,
                                     EM_TYPE_Q6_K, EM_TYPE_IQ3_XXS, EM_TYPE_MXFP4};
    int failed = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            if (cases[i].cols % em_type_info_of(types[t])->block_elems == 0) failed += !run_case(types[t], &cases[i]);
    printf("correctness: %d failed\n", failed);
    return failed;
}

/* ---- measurements ---- */

__global__ void fill_random(float *x, uint64_t n, uint32_t seed) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        x[i] = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
}

static float *random_dev(uint64_t n, uint32_t seed) {
    float *x = (float *)dev_alloc(n * sizeof(float));
    fill_random<<<1024, 256>>>(x, n, seed);
    CUDA_CHECK(cudaGetLastError());
    return x;
}

/* A big weight for timing: 32 quantized random rows, repeated (the values do not matter). */
static cuda_weight bench_weight(uint32_t type, uint32_t rows, uint32_t cols, uint32_t n_mat) {
    const uint32_t slab = 32;
    test_weight t = make_weight(type, slab, cols, 1);
    const uint64_t total = (uint64_t)rows * n_mat, rb = t.w.row_bytes;
    uint8_t *d = (uint8_t *)dev_alloc(total * rb);
    CUDA_CHECK(cudaMemcpy(d, t.w.data, slab * rb, cudaMemcpyDeviceToDevice));
    for (uint64_t have = slab; have < total;) {
        const uint64_t n = have < total - have ? have : total - have;
        CUDA_CHECK(cudaMemcpy(d + have * rb, d, n * rb, cudaMemcpyDeviceToDevice));
        have += n;
    }
    free_weight(&t);
    return cuda_weight{d, type, cols, rows, n_mat, rb};
}

/* Seconds per call of `call` on the backend's stream, averaged over about 20 ms of calls. */
template <typename F> static double time_calls(F call) {
    cuda_backend *b = &backend;
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    call();
    CUDA_CHECK(cudaEventRecord(t0, b->stream));
    call();
    CUDA_CHECK(cudaEventRecord(t1, b->stream));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    int reps = (int)(20.0f / (ms > 1e-3f ? ms : 1e-3f));
    reps = reps < 3 ? 3 : reps > 200 ? 200 : reps;
    CUDA_CHECK(cudaEventRecord(t0, b->stream));
    for (int i = 0; i < reps; i++) call();
    CUDA_CHECK(cudaEventRecord(t1, b->stream));
    CUDA_CHECK(cudaEventSynchronize(t1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return ms * 1e-3 / reps;
}

/* Seconds per call of the GEMM (tile 0 and AUTO pick) or of the matvec, averaged. */
static double time_call(cuda_matvec *mv, bool gemm, uint32_t tile, em_cuda_gemm_kernel kernel) {
    cuda_backend *b = &backend;
    set_gemm(gemm);
    const double t = time_calls([&]() {
        check_err(gemm ? em_cuda_gemm_with(b, mv, tile, kernel) : em_cuda_matvec(b, mv), "timed call");
    });
    set_gemm(true);
    return t;
}

/* One row of the table: TFLOP/s of the GEMM (the automatic pick, then each kernel with tiles of
 * 32/64/128 items) and of the matvec. */
static void bench_row(const char *shape, cuda_matvec *mv, uint32_t type, double flops, bool with_matvec) {
    const double t_auto = time_call(mv, true, 0, EM_CUDA_GEMM_AUTO);
    double t[2][3];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++)
            t[k][i] = time_call(mv, true, 32u << i, k ? EM_CUDA_GEMM_PIPELINED : EM_CUDA_GEMM_STAGED);
    const double t_mv = with_matvec ? time_call(mv, false, 0, EM_CUDA_GEMM_AUTO) : 0.0;
    const bool with_wg = mv->w->cols % 64 == 0;
    const double t_wg = with_wg ? time_call(mv, true, 0, EM_CUDA_GEMM_WGMMA) : 0.0;
    printf("%-8s %-26s M=%-5u auto %6.1f TFLOP/s %8.3f ms | staged %6.1f %6.1f %6.1f | pipelined %6.1f %6.1f %6.1f",
           em_type_name(type), shape, mv->n_items, flops / t_auto * 1e-12, t_auto * 1e3, flops / t[0][0] * 1e-12,
           flops / t[0][1] * 1e-12, flops / t[0][2] * 1e-12, flops / t[1][0] * 1e-12, flops / t[1][1] * 1e-12,
           flops / t[1][2] * 1e-12);
    if (with_wg) printf(" | wgmma %6.1f", flops / t_wg * 1e-12);
    if (with_matvec)
        printf(" | matvec %6.1f TFLOP/s %8.3f ms, auto/matvec %.2fx", flops / t_mv * 1e-12, t_mv * 1e3, t_mv / t_auto);
    printf("\n");
}

typedef struct dense_shape {
    const char *name;
    uint32_t cols, rows;
    bool glu;
} dense_shape;

static void bench_dense(uint32_t type, const dense_shape *s, const uint32_t *ms, int n_ms) {
    const uint32_t max_m = ms[n_ms - 1];
    cuda_weight w = bench_weight(type, s->rows, s->cols, 1), up = {};
    if (s->glu) up = bench_weight(type, s->rows, s->cols, 1);
    float *x = random_dev((uint64_t)max_m * s->cols, 7);
    float *y = (float *)dev_alloc((uint64_t)max_m * s->rows * sizeof(float));
    for (int i = 0; i < n_ms; i++) {
        cuda_matvec mv = {};
        mv.w = &w, mv.x = x, mv.x_stride = s->cols, mv.y = y, mv.y_stride = s->rows, mv.n_items = ms[i];
        mv.n_groups = 1, mv.up = s->glu ? &up : NULL;
        const double flops = 2.0 * ms[i] * s->cols * s->rows * (s->glu ? 2 : 1);
        bench_row(s->name, &mv, type, flops, ms[i] <= 256);
    }
    cudaFree((void *)w.data);
    if (s->glu) cudaFree((void *)up.data);
    cudaFree(x), cudaFree(y);
}

/* moe-30b-a3b's routing: ROUTE_EXPERTS experts, ROUTE_USED distinct ones per token. Each of
 * `tokens` tokens draws its experts (skewed: low experts more popular, like real routers; else
 * uniform, like distinct conversations); the (token, expert) pairs grouped by expert: counts,
 * starts, and index (pair slot -> token). Returns the number of experts chosen at least once and,
 * with active, lists them (active[ROUTE_EXPERTS] = their number, as the grouping kernel writes). */
enum { ROUTE_EXPERTS = 128, ROUTE_USED = 8 };
static uint32_t make_routing(uint32_t tokens, bool skewed, uint32_t *counts, uint32_t *starts, uint32_t *index,
                             uint32_t *active) {
    uint32_t *chosen = (uint32_t *)malloc((size_t)tokens * ROUTE_USED * sizeof(uint32_t));
    uint32_t fill[ROUTE_EXPERTS], n_active = 0;
    for (uint32_t e = 0; e < ROUTE_EXPERTS; e++) counts[e] = 0;
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t k = 0; k < ROUTE_USED; k++) {
            uint32_t e;
            bool again;
            do {
                const float u = (frand() + 1.0f) * 0.5f;
                e = (uint32_t)((skewed ? u * u : u) * ROUTE_EXPERTS) % ROUTE_EXPERTS;
                again = false;
                for (uint32_t j = 0; j < k; j++) again |= chosen[t * ROUTE_USED + j] == e;
            } while (again);
            chosen[t * ROUTE_USED + k] = e;
            counts[e]++;
        }
    for (uint32_t e = 0, at = 0; e < ROUTE_EXPERTS; e++) {
        starts[e] = fill[e] = at, at += counts[e];
        if (!counts[e]) continue;
        if (active) active[n_active] = e;
        n_active++;
    }
    if (active) active[ROUTE_EXPERTS] = n_active;
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t k = 0; k < ROUTE_USED; k++) index[fill[chosen[t * ROUTE_USED + k]]++] = t;
    free(chosen);
    return n_active;
}

/* moe-30b-a3b: 128 experts, 8 per token, embd 2048, expert ff 768; 512 tokens. */
static void bench_moe(uint32_t type) {
    enum { EXPERTS = ROUTE_EXPERTS, TOKENS = 512, EMBD = 2048, FF = 768, PAIRS = TOKENS * ROUTE_USED };
    uint32_t counts[EXPERTS], starts[EXPERTS], index[PAIRS];
    make_routing(TOKENS, true, counts, starts, index, NULL);
    uint32_t *counts_dev = (uint32_t *)dev_alloc(sizeof counts), *starts_dev = (uint32_t *)dev_alloc(sizeof starts);
    uint32_t *index_dev = (uint32_t *)dev_alloc(sizeof index);
    CUDA_CHECK(cudaMemcpy(counts_dev, counts, sizeof counts, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(starts_dev, starts, sizeof starts, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(index_dev, index, sizeof index, cudaMemcpyHostToDevice));
    cuda_weight gate = bench_weight(type, FF, EMBD, EXPERTS), up = bench_weight(type, FF, EMBD, EXPERTS);
    cuda_weight down = bench_weight(type, EMBD, FF, EXPERTS);
    float *x = random_dev((uint64_t)TOKENS * EMBD, 11);
    float *h = random_dev((uint64_t)PAIRS * FF, 13);
    float *y = (float *)dev_alloc((uint64_t)PAIRS * EMBD * sizeof(float));
    cuda_matvec mv = {&gate, x, EMBD, index_dev, h, FF, PAIRS / EXPERTS, TOKENS, TOKENS, counts_dev, starts_dev, EXPERTS, &up, 0, {}};
    bench_row("moe30b gate+up 2048->768", &mv, type, 2.0 * PAIRS * EMBD * FF * 2, true);
    mv = cuda_matvec{&down, h, FF, NULL, y, EMBD, PAIRS / EXPERTS, TOKENS, PAIRS, counts_dev, starts_dev, EXPERTS, NULL, 0, {}};
    bench_row("moe30b down 768->2048", &mv, type, 2.0 * PAIRS * EMBD * FF, true);
    cudaFree((void *)gate.data), cudaFree((void *)up.data), cudaFree((void *)down.data);
    cudaFree(x), cudaFree(h), cudaFree(y), cudaFree(counts_dev), cudaFree(starts_dev), cudaFree(index_dev);
}

static void bench_all(void) {
    static const dense_shape shapes[] = {
        {"q/o 2048->2048", 2048, 2048, false},   {"k/v 2048->512", 2048, 512, false},
        {"gate+up 2048->8192", 2048, 8192, true}, {"down 8192->2048", 8192, 2048, false},
        {"head 2048->128256", 2048, 128256, false},
    };
    static const uint32_t ms_bf16[] = {8, 16, 24, 32, 48, 64, 128, 256, 512, 2048, 4096, 8192};
    static const uint32_t ms_quant[] = {16, 32, 64, 256, 2048, 8192};
    static const uint32_t quant[] = {EM_TYPE_F16, EM_TYPE_Q8_0, EM_TYPE_Q4_K, EM_TYPE_Q6_K, EM_TYPE_IQ3_XXS};
    backend.step.act = EM_ACT_SWIGLU;
    printf("TFLOP/s: auto (ms) | staged tiles 32 64 128 | pipelined tiles 32 64 128 | wgmma | matvec (ms)\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        bench_dense(EM_TYPE_BF16, &shapes[s], ms_bf16, sizeof ms_bf16 / sizeof ms_bf16[0]);
    bench_moe(EM_TYPE_BF16);
    bench_moe(EM_TYPE_Q4_K);
    bench_moe(EM_TYPE_Q8_0);
    bench_moe(EM_TYPE_MXFP4);
    for (size_t q = 0; q < sizeof quant / sizeof quant[0]; q++)
        for (size_t s = 0; s < 4; s++) bench_dense(quant[q], &shapes[s], ms_quant, sizeof ms_quant / sizeof ms_quant[0]);
}

/* Decode-sized products: the f32 kernel against the tensor-core one at 1-16 items, µs per call
 * and the weight bytes per second that makes. */
static void bench_decode(void) {
    static const dense_shape shapes[] = {
        {"qkv 2048->3072", 2048, 3072, false},    {"o 2048->2048", 2048, 2048, false},
        {"gate+up 2048->8192", 2048, 8192, true}, {"down 8192->2048", 8192, 2048, false},
        {"head 2048->128256", 2048, 128256, false},
        {"moe qkv 2048->5120", 2048, 5120, false}, {"moe o 4096->2048", 4096, 2048, false},
    };
    static const uint32_t types[] = {EM_TYPE_BF16, EM_TYPE_Q8_0, EM_TYPE_Q4_K, EM_TYPE_Q6_K, EM_TYPE_IQ3_XXS, EM_TYPE_MXFP4};
    static const uint32_t items[] = {1, 2, 4, 8, 16};
    cuda_backend *b = &backend;
    backend.step.act = EM_ACT_SWIGLU;
    printf("decode products: us per call (TB/s of weights), f32 kernel | tensor-core kernel [| dp4a kernel on 8-bit "
           "activations, matvec_dp4a.cu]\n");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const dense_shape *sh = &shapes[si];
            cuda_weight w = bench_weight(types[ti], sh->rows, sh->cols, 1), up = {};
            if (sh->glu) up = bench_weight(types[ti], sh->rows, sh->cols, 1);
            float *x = random_dev((uint64_t)16 * sh->cols, 7);
            float *y = (float *)dev_alloc((uint64_t)16 * sh->rows * sizeof(float));
            const double bytes = (double)w.row_bytes * w.rows * (sh->glu ? 2 : 1);
            printf("%-8s %-20s", em_type_name(types[ti]), sh->name);
            for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
                cuda_matvec mv = {};
                mv.w = &w, mv.x = x, mv.x_stride = sh->cols, mv.y = y, mv.y_stride = sh->rows, mv.n_items = items[i];
                mv.n_groups = 1, mv.up = sh->glu ? &up : NULL;
                const double t32 = time_calls([&]() { check_err(em_cuda_matvec_with(b, &mv, EM_CUDA_MATVEC_F32), "f32"); });
                const double ttc = time_calls([&]() { check_err(em_cuda_matvec_with(b, &mv, EM_CUDA_MATVEC_TC), "tc"); });
                printf(" | %2u: %6.1f (%.2f) %6.1f (%.2f)", items[i], t32 * 1e6, bytes / t32 * 1e-12, ttc * 1e6,
                       bytes / ttc * 1e-12);
                if (em_cuda_dq_takes(b, &mv)) {
                    const double tdq = time_calls([&]() { check_err(em_cuda_matvec_with(b, &mv, EM_CUDA_MATVEC_DP4A), "dp4a"); });
                    printf(" dp4a %6.1f (%.2f)", tdq * 1e6, bytes / tdq * 1e-12);
                }
                if (em_cuda_imma_takes(b, &mv)) {
                    const double tim = time_calls([&]() { check_err(em_cuda_matvec_with(b, &mv, EM_CUDA_MATVEC_IMMA), "imma"); });
                    printf(" imma %6.1f (%.2f)", tim * 1e6, bytes / tim * 1e-12);
                }
            }
            printf("\n");
            cudaFree((void *)w.data);
            if (sh->glu) cudaFree((void *)up.data);
            cudaFree(x), cudaFree(y);
        }
}

/* MoE expert products of a decode step (moe-30b-a3b's experts: 128 of 768 x 2048, 8 per token),
 * each token routed to 8 distinct experts drawn uniformly (distinct conversations), with the
 * active-expert list the grouping kernel would write: us per call, and the chosen experts' weight
 * bytes per second, with the automatic pick, the f32 kernel and the tensor-core kernel. */
static void bench_moe_decode(void) {
    enum { EXPERTS = ROUTE_EXPERTS, USED = ROUTE_USED, EMBD = 2048, FF = 768, MAX_TOKENS = 16 };
    static const uint32_t types[] = {EM_TYPE_IQ3_XXS, EM_TYPE_Q4_K, EM_TYPE_Q6_K, EM_TYPE_Q8_0, EM_TYPE_BF16, EM_TYPE_MXFP4};
    static const uint32_t token_counts[] = {1, 2, 4, 8, 16};
    cuda_backend *b = &backend;
    backend.step.act = EM_ACT_SWIGLU;
    uint32_t *counts_dev = (uint32_t *)dev_alloc(EXPERTS * 4), *starts_dev = (uint32_t *)dev_alloc(EXPERTS * 4);
    uint32_t *index_dev = (uint32_t *)dev_alloc(MAX_TOKENS * USED * 4), *active_dev = (uint32_t *)dev_alloc((EXPERTS + 1) * 4);
    float *x = random_dev((uint64_t)MAX_TOKENS * EMBD, 17), *h = random_dev((uint64_t)MAX_TOKENS * USED * FF, 19);
    float *y = (float *)dev_alloc((uint64_t)MAX_TOKENS * USED * EMBD * sizeof(float));
    printf("MoE decode products (128 experts of 768 x 2048, 8 per token): us per call (TB/s of the chosen experts' "
           "bytes), auto | f32 kernel | tensor-core kernel | dp4a kernel\n");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        cuda_weight gate = bench_weight(types[ti], FF, EMBD, EXPERTS), up = bench_weight(types[ti], FF, EMBD, EXPERTS);
        cuda_weight down = bench_weight(types[ti], EMBD, FF, EXPERTS);
        for (size_t ni = 0; ni < sizeof token_counts / sizeof token_counts[0]; ni++) {
            const uint32_t tokens = token_counts[ni], pairs = tokens * USED;
            uint32_t counts[EXPERTS], starts[EXPERTS], index[MAX_TOKENS * USED], active[EXPERTS + 1];
            const uint32_t n_active = make_routing(tokens, false, counts, starts, index, active);
            CUDA_CHECK(cudaMemcpy(counts_dev, counts, sizeof counts, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(starts_dev, starts, sizeof starts, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(index_dev, index, pairs * 4, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(active_dev, active, sizeof active, cudaMemcpyHostToDevice));
            for (int which = 0; which < 2; which++) { /* gate+up, then down */
                cuda_matvec mv = {};
                mv.w = which ? &down : &gate, mv.up = which ? NULL : &up;
                mv.x = which ? h : x, mv.x_stride = which ? FF : EMBD, mv.x_index = which ? NULL : index_dev;
                mv.y = which ? y : h, mv.y_stride = which ? EMBD : FF;
                mv.n_items = (pairs + EXPERTS - 1) / EXPERTS, mv.max_items = tokens, mv.x_rows = which ? pairs : tokens;
                mv.counts = counts_dev, mv.starts = starts_dev, mv.n_groups = EXPERTS;
                mv.active = active_dev, mv.n_active = active_dev + EXPERTS;
                mv.n_active_max = pairs < EXPERTS ? pairs : EXPERTS;
                const double bytes = (double)n_active * mv.w->row_bytes * mv.w->rows * (which ? 1 : 2);
                double t[4];
                const em_cuda_matvec_kernel kernels[4] = {EM_CUDA_MATVEC_AUTO, EM_CUDA_MATVEC_F32, EM_CUDA_MATVEC_TC,
                                                          EM_CUDA_MATVEC_DP4A};
                for (int k = 0; k < 4; k++) {
                    em_err err = em_cuda_matvec_with(b, &mv, kernels[k]); /* a kernel that declines: n/a */
                    t[k] = NAN;
                    if (err) {
                        em_err_free(err);
                        continue;
                    }
                    t[k] = time_calls([&]() { check_err(em_cuda_matvec_with(b, &mv, kernels[k]), "moe decode product"); });
                }
                printf("%-8s %-8s %2u tokens, %3u experts | %7.1f (%.2f) | %7.1f (%.2f) | %7.1f (%.2f) | %7.1f (%.2f)\n",
                       em_type_name(types[ti]), which ? "down" : "gate+up", tokens, n_active, t[0] * 1e6,
                       bytes / t[0] * 1e-12, t[1] * 1e6, bytes / t[1] * 1e-12, t[2] * 1e6, bytes / t[2] * 1e-12,
                       t[3] * 1e6, bytes / t[3] * 1e-12);
            }
        }
        cudaFree((void *)gate.data), cudaFree((void *)up.data), cudaFree((void *)down.data);
    }
    cudaFree(counts_dev), cudaFree(starts_dev), cudaFree(index_dev), cudaFree(active_dev);
    cudaFree(x), cudaFree(h), cudaFree(y);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach a log even when a time limit stops the run */
    make_backend();
    set_gemm(true);
    if (argc > 1 && !strcmp(argv[1], "--decode")) {
        bench_decode();
        bench_moe_decode();
        return 0;
    }
    const int failed = check_all();
    if (!(argc > 1 && !strcmp(argv[1], "--check"))) bench_all();
    printf("%s\n", failed ? "FAIL" : "PASS");
    return failed ? 1 : 0;
}
