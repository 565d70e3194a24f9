/* The numeric kernels of the CPU backend: scalar, readable, the definition faster paths are checked
 * against. */
#include <math.h>
#include <string.h>

#include "../../quant/quant.h"
#include "cpu_internal.h"

void em_cpu_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps, bool plus_one) {
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    const float scale = (float)(1.0 / sqrt(sum / n + eps));
    for (uint32_t i = 0; i < n; i++) {
        float weight = w ? (plus_one ? 1.0f + w[i] : w[i]) : 1.0f;
        out[i] = x[i] * scale * weight;
    }
}

/* YaRN: the dimensions whose wavelength fits `n_rot_beta` rotations in the original context
 * (Peng et al. 2023, "YaRN", eq. 17-18). */
static double yarn_corr_dim(uint32_t n_dims, uint32_t orig_ctx, double beta, double base) {
    return n_dims * log(orig_ctx / (beta * 2.0 * M_PI)) / (2.0 * log(base));
}

void em_cpu_rope_angles(float *cos_sin, uint32_t pos, const em_rope *rope) {
    const uint32_t n_rot = rope->n_rot, half = n_rot / 2;
    const double freq_scale = (rope->scaling == EM_ROPE_SCALING_LINEAR || rope->scaling == EM_ROPE_SCALING_YARN)
                                  ? 1.0 / rope->factor
                                  : 1.0;
    double low = 0.0, high = 0.0, mscale = 1.0, ext = 0.0;
    if (rope->scaling == EM_ROPE_SCALING_YARN) {
        low = floor(yarn_corr_dim(n_rot, rope->orig_ctx, rope->yarn_beta_fast, rope->theta));
        high = ceil(yarn_corr_dim(n_rot, rope->orig_ctx, rope->yarn_beta_slow, rope->theta));
        if (low < 0) low = 0;
        if (high > n_rot - 1) high = n_rot - 1;
        ext = rope->yarn_ext_factor;
        mscale = rope->yarn_attn_factor;
        if (ext != 0.0) mscale *= 1.0 + 0.1 * log(1.0 / freq_scale);
    }
    for (uint32_t i = 0; i < half; i++) {
        /* theta_i = pos * base^(-2i/n_rot), divided by a per-frequency factor (Llama 3 scaling) */
        double theta = pos * pow(rope->theta, -2.0 * i / n_rot);
        if (rope->freq_factors) theta /= rope->freq_factors[i];
        double angle = theta * freq_scale;
        if (ext != 0.0) {
            double y = (i - low) / fmax(0.001, high - low);
            double ramp = (1.0 - fmin(1.0, fmax(0.0, y))) * ext;
            angle = angle * (1.0 - ramp) + theta * ramp;
        }
        cos_sin[2 * i] = (float)(cos(angle) * mscale);
        cos_sin[2 * i + 1] = (float)(sin(angle) * mscale);
    }
}

void em_cpu_rope(float *head, const float *cos_sin, const em_rope *rope) {
    const uint32_t half = rope->n_rot / 2;
    for (uint32_t i = 0; i < half; i++) {
        const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
        /* normal: adjacent pairs (2i, 2i+1); NeoX: (i, i + n_rot/2) */
        const uint32_t a = rope->style == EM_ROPE_NEOX ? i : 2 * i;
        const uint32_t b = rope->style == EM_ROPE_NEOX ? i + half : 2 * i + 1;
        const float x0 = head[a], x1 = head[b];
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
}

/* GELU, tanh approximation (Hendrycks & Gimpel 2016), as Gemma uses. */
float em_cpu_gelu(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

void em_cpu_glu(em_activation act, float limit, float alpha, float *gate, const float *up, uint64_t n) {
    switch (act) {
    case EM_ACT_SWIGLU:
        em_f32_silu_mul(gate, up, n);
        return;
    case EM_ACT_GEGLU:
        for (uint64_t i = 0; i < n; i++) gate[i] = em_cpu_gelu(gate[i]) * up[i];
        return;
    case EM_ACT_SWIGLU_CLAMPED:
        /* g = min(g, limit), u = clamp(u, ±limit), (u + 1) · g · σ(alpha g) */
        for (uint64_t i = 0; i < n; i++) {
            const float g = fminf(gate[i], limit), u = fminf(fmaxf(up[i], -limit), limit);
            gate[i] = g / (1.0f + em_expf(-alpha * g)) * (u + 1.0f);
        }
        return;
    }
}

void em_cpu_add_bias(float *rows, const float *bias, uint64_t n_rows, uint64_t width) {
    if (!bias) return;
    for (uint64_t r = 0; r < n_rows; r++)
        for (uint64_t i = 0; i < width; i++) rows[r * width + i] += bias[i];
}

uint64_t em_cpu_act_bytes(const em_weight *w) {
    uint64_t bytes = 0;
    if (em_type_row_bytes(em_dot_activation_type(w->type), w->cols, &bytes)) return 0;
    return bytes;
}

typedef struct matmul_job {
    const em_cpu_matmul *mm;
    uint64_t act_bytes;
    em_dot_group_fn group_kernel; /* NULL: em_dot_rows on the activation rows */
    uint64_t group_bytes;
    bool bf16_tiles; /* BF16 weights: activations rounded to bf16 in scratch, em_bf16_tiles */
    uint64_t amx_tile_bytes; /* not 0: Q4_K or Q8_0 on AMX, the activations packed in tiles (em_amx_product) */
    em_dot_weights_fn weights; /* a few tokens: em_dot_weights' kernel, the rows handed out in pieces */
    em_cpu_pieces pieces;      /* of the rows, for `weights` */
    em_err err; /* the first error of a share (keep_first_error) */
    pthread_mutex_t mutex;
} matmul_job;

/* The least weight bytes a piece of a product takes (em_cpu_pieces): a kernel call needs a few of its
 * tiles before its prefetches run ahead of it. */
#define PIECE_BYTES ((uint64_t)64 << 10)

/* Pieces of a matrix's rows are whole multiples of the rows an em_dot_weights kernel takes at once
 * (four, in the x86 ones), so that no call but a matrix's last runs its kernel for a remainder. */
#define PIECE_ROWS 4

/* Tokens per em_dot_rows call: the multi-row kernels take up to eight activation rows at once (the
 * AVX-512 VNNI ones; the AVX2 ones work through them four at a time). */
#define DOT_TOKEN_GROUP 8

/* The job fails with the first error a share reports; later ones are dropped. */
static void keep_first_error(matmul_job *job, em_err err) {
    pthread_mutex_lock(&job->mutex);
    if (!job->err) job->err = err;
    else em_err_free(err);
    pthread_mutex_unlock(&job->mutex);
}

/* Each share quantizes whole token groups and, with a group kernel, packs them: the packing needs
 * no second pass over the pool, since a group's rows are all quantized by the share that packs it. */
static void quantize_share(void *ctx, uint32_t ith, uint32_t nth) {
    matmul_job *job = ctx;
    const em_cpu_matmul *mm = job->mm;
    const uint32_t size = job->amx_tile_bytes ? EM_AMX_TILE_TOKENS : EM_CPU_GROUP; /* tokens a share packs together */
    const uint32_t n_groups = (mm->n_tokens + size - 1) / size;
    uint64_t begin, end;
    em_cpu_share(n_groups, ith, nth, &begin, &end);
    for (uint64_t g = begin; g < end; g++) {
        const uint32_t first = (uint32_t)g * size;
        const uint32_t rows = mm->n_tokens - first < size ? mm->n_tokens - first : size;
        if (job->bf16_tiles) {
            em_bf16_round_rows(mm->x + first * mm->x_stride, mm->x_stride, rows, mm->w->cols,
                               (uint16_t *)(mm->scratch + first * job->act_bytes), job->act_bytes / 2);
            continue;
        }
        em_err err = em_cpu_quantize(mm->w, mm->x + first * mm->x_stride, mm->x_stride, rows,
                                     mm->scratch + first * job->act_bytes);
        if (err) {
            keep_first_error(job, err);
            return;
        }
        if (job->amx_tile_bytes)
            em_amx_pack(mm->w->type, mm->scratch + first * job->act_bytes, job->act_bytes, rows, mm->w->cols,
                        mm->groups + g * job->amx_tile_bytes);
        else if (job->group_kernel)
            em_dot_group_pack(mm->w->type, mm->scratch + first * job->act_bytes, job->act_bytes, rows, mm->w->cols,
                              mm->groups + g * job->group_bytes);
    }
}

/* Rows of one tile: the group kernels take every token group against all of a tile's rows in one
 * call, each group staying in L1 while the rows (about 74 KB of dense-1b Q4_K) come from L2; a tile
 * of rows is read from memory once and stays in L2 while every token group passes over it. */
#define DOT_ROW_TILE 64

static void dot_share(void *ctx, uint32_t ith, uint32_t nth) {
    matmul_job *job = ctx;
    const em_cpu_matmul *mm = job->mm;
    const em_weight *w = mm->w;
    const uint8_t *base = em_weight_matrix(w, mm->mat);
    uint64_t begin, end;
    em_cpu_share(w->rows, ith, nth, &begin, &end);
    if (job->bf16_tiles) { /* the one batched path that is not em_dot's numbers (see em_cpu_matmul_run) */
        em_bf16_tiles(base + begin * w->row_bytes, w->row_bytes, (uint32_t)(end - begin), (const uint16_t *)mm->scratch,
                      job->act_bytes / 2, mm->n_tokens, w->cols, mm->y + begin, mm->y_stride);
        return;
    }
    if (job->amx_tile_bytes) { /* em_dot_scalar's numbers (see em_cpu_matmul_run) */
        em_err err = em_amx_product(w->type, base + begin * w->row_bytes, w->row_bytes, (uint32_t)(end - begin),
                                    mm->groups, mm->n_tokens, w->cols, mm->y + begin, mm->y_stride);
        if (err) keep_first_error(job, err);
        return;
    }
    if (job->weights) {
        /* one token or a few: the rows in pieces, a piece's rows in one call, each activation block
         * loaded once per few rows and each weight block unpacked once for the tokens */
        while (em_cpu_piece(&job->pieces, nth, &begin, &end))
            job->weights(base + begin * w->row_bytes, w->row_bytes, (uint32_t)(end - begin), mm->scratch,
                         job->act_bytes, mm->n_tokens, w->cols, mm->y + begin, mm->y_stride);
        return;
    }
    /* Each weight row is read from memory once per batch (its tile stays cached while every token
     * group passes over it), and each weight block is unpacked once per group of tokens instead of
     * once per token. Results equal em_dot's bitwise, so batching changes no number. */
    float out[DOT_TOKEN_GROUP];
    for (uint64_t tile = begin; tile < end; tile += DOT_ROW_TILE) {
        const uint64_t tile_end = end - tile < DOT_ROW_TILE ? end : tile + DOT_ROW_TILE;
        if (job->group_kernel) { /* every token group against the tile's rows, in one call */
            job->group_kernel(base + tile * w->row_bytes, w->row_bytes, (uint32_t)(tile_end - tile), mm->groups,
                              mm->n_tokens, w->cols, mm->y + tile, mm->y_stride);
            continue;
        }
        for (uint32_t t = 0; t < mm->n_tokens; t += DOT_TOKEN_GROUP) {
            const uint32_t group = mm->n_tokens - t < DOT_TOKEN_GROUP ? mm->n_tokens - t : DOT_TOKEN_GROUP;
            const uint8_t *act = mm->scratch + t * job->act_bytes;
            for (uint64_t r = tile; r < tile_end; r++) {
                em_dot_rows(w->type, base + r * w->row_bytes, act, job->act_bytes, group, w->cols, out);
                for (uint32_t g = 0; g < group; g++) mm->y[(t + g) * mm->y_stride + r] = out[g];
            }
        }
    }
}

em_err em_cpu_matmul_run(em_cpu_pool *pool, const em_cpu_matmul *mm) {
    if (mm->n_tokens == 0) return NULL;
    _Static_assert(DOT_TOKEN_GROUP == EM_CPU_GROUP && EM_CPU_GROUP == EM_DOT_GROUP_TOKENS,
                   "token groups of the backend and of quant");
    matmul_job job = {.mm = mm, .act_bytes = em_cpu_act_bytes(mm->w)};
    /* A decode step's single token (or a few) goes through em_dot_rows, which has no packing to pay
     * for and no padded lanes. */
    if (mm->groups && mm->n_tokens >= EM_CPU_FEW_TOKENS) {
        job.group_kernel = em_dot_group_kernel(mm->w->type);
        job.group_bytes = em_dot_group_bytes(mm->w->type, mm->w->cols);
        if (job.group_bytes > EM_CPU_GROUP * job.act_bytes) job.group_kernel = NULL; /* not in the scratch */
    }
    /* BF16 weights times many tokens: bf16 activations and vdpbf16ps tiles where the CPU has them
     * (not em_dot's numbers; quant.h gives the bound) */
    job.bf16_tiles = em_cpu_bf16_tiles(mm->w->type, mm->n_tokens);
    /* Q4_K or Q8_0 times many tokens: AMX tiles where the CPU has them (em_dot_scalar's numbers, quant.h) */
    if (mm->groups && em_cpu_amx(mm->w->type, mm->w->cols, mm->n_tokens)) {
        job.amx_tile_bytes = em_amx_tile_bytes(mm->w->type, mm->w->cols);
        job.group_kernel = NULL;
    }
    if (!job.group_kernel && !job.bf16_tiles && !job.amx_tile_bytes && mm->n_tokens <= EM_DOT_WEIGHTS_TOKENS)
        job.weights = em_dot_weights_kernel(mm->w->type, mm->n_tokens);
    /* pieces of whole kernel calls' rows, each at least PIECE_BYTES of weights */
    em_cpu_pieces_init(&job.pieces, mm->w->rows, (PIECE_BYTES + mm->w->row_bytes - 1) / mm->w->row_bytes,
                       PIECE_ROWS);
    pthread_mutex_init(&job.mutex, NULL);
    /* One token group is one share's work: quantized here, without waking the pool for it. */
    if (!mm->quantized && (mm->n_tokens <= EM_CPU_GROUP || !pool)) quantize_share(&job, 0, 1);
    else if (!mm->quantized) em_cpu_pool_run(pool, quantize_share, &job);
    if (!job.err && !pool) dot_share(&job, 0, 1);
    else if (!job.err) em_cpu_pool_run_sized(pool, dot_share, &job, mm->w->rows * mm->w->row_bytes * mm->n_tokens);
    pthread_mutex_destroy(&job.mutex);
    return job.err;
}

em_err em_cpu_quantize(const em_weight *w, const float *x, uint64_t x_stride, uint32_t n_tokens, uint8_t *out) {
    const uint64_t act_bytes = em_cpu_act_bytes(w);
    for (uint32_t t = 0; t < n_tokens; t++) {
        em_err err = em_quantize_activation(w->type, x + t * x_stride, out + t * act_bytes, w->cols);
        if (err) return err;
    }
    return NULL;
}

typedef struct products_job {
    const em_cpu_product *products;
    uint32_t n;
    uint64_t bytes; /* weight bytes of all products */
    em_cpu_pieces pieces; /* of those bytes */
} products_job;

/* The rows whose first byte falls in [from, to) of the products' bytes laid end to end: pieces that
 * cover those bytes once cover every row once. */
static void products_range(const products_job *job, uint64_t from, uint64_t to) {
    float out[DOT_TOKEN_GROUP];
    uint64_t start = 0; /* where the current product begins in that line */
    for (uint32_t p = 0; p < job->n && start < to; p++) {
        const em_cpu_product *pr = &job->products[p];
        const em_weight *w = pr->w;
        const uint64_t rb = w->row_bytes, bytes = w->rows * rb;
        if (start + bytes <= from) {
            start += bytes;
            continue;
        }
        const uint64_t first = from > start ? (from - start + rb - 1) / rb : 0;
        const uint64_t last = (to - start + rb - 1) / rb < w->rows ? (to - start + rb - 1) / rb : w->rows;
        const uint8_t *base = em_weight_matrix(w, pr->mat);
        const em_dot_rows_fn kernel = em_dot_rows_kernel(w->type);
        const em_dot_weights_fn weights =
            pr->n_tokens <= EM_DOT_WEIGHTS_TOKENS ? em_dot_weights_kernel(w->type, pr->n_tokens) : NULL;
        if (weights && first < last) {
            /* one token or a few: the share's rows in one call (as in dot_share) */
            weights(base + first * rb, rb, (uint32_t)(last - first), pr->act, pr->act_stride, pr->n_tokens, w->cols,
                    pr->y + first, pr->y_stride);
            start += bytes;
            continue;
        }
        for (uint64_t r = first; r < last; r++)
            for (uint32_t t = 0; t < pr->n_tokens; t += DOT_TOKEN_GROUP) {
                const uint32_t group = pr->n_tokens - t < DOT_TOKEN_GROUP ? pr->n_tokens - t : DOT_TOKEN_GROUP;
                const uint8_t *act = pr->act + t * pr->act_stride;
                if (kernel)
                    kernel(base + r * rb, act, pr->act_stride, group, w->cols, out);
                else
                    em_dot_rows(w->type, base + r * rb, act, pr->act_stride, group, w->cols, out);
                for (uint32_t g = 0; g < group; g++) pr->y[(t + g) * pr->y_stride + r] = out[g];
            }
        start += bytes;
    }
}

static void products_share(void *ctx, uint32_t ith, uint32_t nth) {
    products_job *job = ctx;
    uint64_t from, to;
    while (em_cpu_piece(&job->pieces, nth, &from, &to)) products_range(job, from, to);
}

void em_cpu_products_run(em_cpu_pool *pool, const em_cpu_product *products, uint32_t n) {
    products_job job = {.products = products, .n = n};
    uint64_t work = 0;
    for (uint32_t p = 0; p < n; p++) {
        job.bytes += products[p].w->rows * products[p].w->row_bytes;
        work += products[p].w->rows * products[p].w->row_bytes * products[p].n_tokens;
    }
    em_cpu_pieces_init(&job.pieces, job.bytes, PIECE_BYTES, 1);
    if (job.bytes) em_cpu_pool_run_sized(pool, products_share, &job, work);
}
