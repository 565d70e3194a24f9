/* The tensor-core prefill attention (src/backend/cuda/attention_prefill.cu) against the
 * decode-style kernel and a host double-precision reference, on random queries and a random
 * paged f16 cache; then both kernels timed on long prompts prefilled in chunks.
 *
 * Correctness: a batch mixing prefill chunks (one continuing a sequence whose earlier positions are
 * in the cache), a decode token and a short run, in mixed order, for several shapes (GQA groups
 * that do and do not divide a tile, head sizes 32, 64, 128, sliding windows, soft-caps). The
 * prefill kernel alone must write exactly the segments' rows; the mixed forward must match the
 * reference and the decode-style kernel within 2e-3 of the largest output.
 *
 * Each batch runs the prefill kernel with and without splits of the context (a few tiles over a
 * long context split it); a second batch is a follow-up turn, 41 tokens after 3000.
 *
 * Timing: a prompt of PROMPT tokens in chunks of CHUNK (each chunk one segment, the cache holding
 * the earlier chunks), dense-1b, moe-30b and a head_dim-256 (Gemma-like) shape, per chunk and in
 * total, with 4 and 8 warps per block; then a follow-up turn of 41 tokens after PROMPT, with and
 * without the splits.
 *
 *   check_attention        (needs a GPU; exits 1 on a failed comparison) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/backend/cuda/internal.cuh"

#define CHECK(call)                                                                              \
    do {                                                                                         \
        cudaError_t st_ = (call);                                                                \
        if (st_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s: %s (line %d)\n", #call, cudaGetErrorString(st_), __LINE__);  \
            exit(2);                                                                             \
        }                                                                                        \
    } while (0)

static void must(em_err err, const char *what) {
    if (!err) return;
    fprintf(stderr, "%s: %s\n", what, em_err_message(err));
    exit(2);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(float lo, float hi) { /* xorshift64* */
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return lo + (hi - lo) * (float)((rng * 2685821657736338717ull) >> 40) / (float)(1 << 24);
}

typedef struct shape {
    const char *name;
    uint32_t n_head, n_head_kv, dim, window;
    float softcap;
} shape;

/* One sequence's part of a test batch: `n` tokens from position `first`. */
typedef struct run_part {
    uint32_t seq, first, n;
} run_part;

/* A device-side test setup: the fake backend, one layer, the cache and the batch arrays. */
typedef struct setup {
    cuda_backend b;
    cuda_layer lw;
    cuda_batch batch;
    uint32_t n_tokens, n_seqs, kv_row; /* kv_row: n_head_kv * dim */
    uint32_t *pos, *seq, *table_start, *blocks, *segments, *other; /* host */
    __half *keys, *values; /* host copies of the cache */
    float *q;
    uint32_t n_blocks;
} setup;

static void *dev_copy(const void *p, size_t bytes) {
    void *d;
    CHECK(cudaMalloc(&d, bytes ? bytes : 4));
    if (bytes) CHECK(cudaMemcpy(d, p, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* Builds the batch of `parts` (each a run of one sequence; seq s holds positions up to max_pos[s])
 * with the host's segment rule (forward.cu: upload_batch). */
static void make_setup(setup *s, const shape *sh, const run_part *parts, uint32_t n_parts, uint32_t n_seqs,
                       const uint32_t *seq_len, float q_range) {
    memset(s, 0, sizeof *s);
    const uint32_t bt = 16;
    s->n_seqs = n_seqs;
    s->kv_row = sh->n_head_kv * sh->dim;
    for (uint32_t p = 0; p < n_parts; p++) s->n_tokens += parts[p].n;
    const uint32_t n = s->n_tokens;
    s->pos = (uint32_t *)malloc(n * 4), s->seq = (uint32_t *)malloc(n * 4);
    for (uint32_t p = 0, t = 0; p < n_parts; p++)
        for (uint32_t i = 0; i < parts[p].n; i++, t++) s->pos[t] = parts[p].first + i, s->seq[t] = parts[p].seq;
    /* block tables: every sequence's blocks, shuffled over the physical blocks */
    s->table_start = (uint32_t *)malloc(n_seqs * 4);
    for (uint32_t q = 0; q < n_seqs; q++) s->table_start[q] = s->n_blocks, s->n_blocks += (seq_len[q] + bt - 1) / bt;
    s->blocks = (uint32_t *)malloc(s->n_blocks * 4);
    for (uint32_t i = 0; i < s->n_blocks; i++) s->blocks[i] = i;
    for (uint32_t i = s->n_blocks; i > 1; i--) {
        const uint32_t j = (uint32_t)(uniform(0.0f, 1.0f) * (float)i) % i, t = s->blocks[i - 1];
        s->blocks[i - 1] = s->blocks[j], s->blocks[j] = t;
    }
    const uint64_t cache = (uint64_t)s->n_blocks * bt * s->kv_row;
    s->keys = (__half *)malloc(cache * 2), s->values = (__half *)malloc(cache * 2);
    for (uint64_t i = 0; i < cache; i++)
        s->keys[i] = __float2half(uniform(-1.0f, 1.0f)), s->values[i] = __float2half(uniform(-1.0f, 1.0f));
    const uint64_t nq = (uint64_t)n * sh->n_head * sh->dim;
    s->q = (float *)malloc(nq * 4);
    for (uint64_t i = 0; i < nq; i++) s->q[i] = uniform(-q_range, q_range);
    /* segments and other tokens, as upload_batch finds them */
    s->segments = (uint32_t *)malloc(n * 4 + 8), s->other = (uint32_t *)malloc(n * 4);
    uint32_t n_seg = 0, n_other = 0, other_max = 0;
    for (uint32_t t = 0, end; t < n; t = end) {
        end = t + 1;
        while (end < n && s->seq[end] == s->seq[t] && s->pos[end] == s->pos[end - 1] + 1) end++;
        if (end - t >= EM_ATT_SEGMENT_MIN)
            s->segments[2 * n_seg] = t, s->segments[2 * n_seg + 1] = end - t, n_seg++;
        else
            for (uint32_t u = t; u < end; u++) {
                s->other[n_other++] = u;
                if (s->pos[u] > other_max) other_max = s->pos[u];
            }
    }
    uint32_t max_pos = 0;
    for (uint32_t t = 0; t < n; t++) max_pos = s->pos[t] > max_pos ? s->pos[t] : max_pos;

    em_program_attention *at = &s->lw.att;
    at->window = sh->window;
    at->n_head = sh->n_head, at->n_head_kv = sh->n_head_kv;
    at->head_dim = at->head_dim_v = sh->dim;
    at->scale = 1.0f / sqrtf((float)sh->dim);
    at->softcap = sh->softcap;
    s->lw.keys = (uint8_t *)dev_copy(s->keys, cache * 2);
    s->lw.values = (uint8_t *)dev_copy(s->values, cache * 2);

    cuda_backend *b = &s->b;
    b->base.block_tokens = bt;
    b->step.n_layer = 1;
    b->layers = &s->lw;
    b->kv_elem = 2;
    must(em_cuda_tuning_read(&b->tuning), "tuning"); /* as em_backend_cuda_new (decode splits merge in a cluster) */
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&b->n_sm, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaStreamCreate(&b->stream));
    b->q = (float *)dev_copy(s->q, nq * 4);
    CHECK(cudaMalloc((void **)&b->attn, nq * 4));
    b->max_head = sh->n_head;
    b->att_slots = em_cuda_att_slots(b, n); /* as em_cuda_reserve */
    CHECK(cudaMalloc((void **)&b->att_part, b->att_slots * (sh->dim + 2) * 4));
    CHECK(cudaMalloc((void **)&b->att_counter, (uint64_t)n * sh->n_head * 4));
    CHECK(cudaMemset(b->att_counter, 0, (uint64_t)n * sh->n_head * 4));
    b->max_dim_v = sh->dim;
    b->pf_part_floats = em_cuda_prefill_part_floats(b); /* as em_cuda_reserve */
    CHECK(cudaMalloc((void **)&b->pf_part, b->pf_part_floats * 4));

    cuda_batch *cb = &s->batch;
    cb->seq = (const uint32_t *)dev_copy(s->seq, n * 4);
    cb->pos = (const uint32_t *)dev_copy(s->pos, n * 4);
    cb->table_start = (const uint32_t *)dev_copy(s->table_start, n_seqs * 4);
    cb->blocks = (const uint32_t *)dev_copy(s->blocks, s->n_blocks * 4);
    cb->segments = (const uint32_t *)dev_copy(s->segments, n_seg * 8);
    cb->segments_host = s->segments;
    cb->other_tokens = (const uint32_t *)dev_copy(s->other, n_other * 4);
    cb->n_tokens = n, cb->n_rows = 0, cb->max_pos = max_pos;
    cb->n_segments = n_seg, cb->n_other = n_other, cb->other_max_pos = other_max;
}

static void free_setup(setup *s) {
    cudaFree((void *)s->lw.keys), cudaFree((void *)s->lw.values);
    cudaFree(s->b.q), cudaFree(s->b.attn), cudaFree(s->b.att_part), cudaFree(s->b.att_counter), cudaFree(s->b.pf_part);
    cudaFree((void *)s->batch.seq), cudaFree((void *)s->batch.pos), cudaFree((void *)s->batch.table_start);
    cudaFree((void *)s->batch.blocks), cudaFree((void *)s->batch.segments), cudaFree((void *)s->batch.other_tokens);
    cudaStreamDestroy(s->b.stream);
    free(s->pos), free(s->seq), free(s->table_start), free(s->blocks), free(s->segments), free(s->other);
    free(s->keys), free(s->values), free(s->q);
}

/* Host reference of token t, head h, in double, from the cached f16 keys and values. */
static void reference(const setup *s, uint32_t t, uint32_t h, double *out) {
    const em_program_attention *ld = &s->lw.att;
    const uint32_t D = ld->head_dim, kvh = h / (ld->n_head / ld->n_head_kv), p = s->pos[t], bt = 16;
    const uint32_t first = ld->window && p + 1 > ld->window ? p + 1 - ld->window : 0;
    const uint32_t *table = s->blocks + s->table_start[s->seq[t]];
    const float *q = s->q + ((uint64_t)t * ld->n_head + h) * D;
    double *w = (double *)malloc((p + 1) * sizeof(double)), mx = -INFINITY, sum = 0;
    for (uint32_t k = first; k <= p; k++) {
        const uint64_t row = (uint64_t)table[k / bt] * bt + k % bt;
        const __half *key = s->keys + row * s->kv_row + kvh * D;
        double dot = 0;
        for (uint32_t d = 0; d < D; d++) dot += (double)q[d] * (double)__half2float(key[d]);
        dot *= ld->scale;
        if (ld->softcap > 0) dot = ld->softcap * tanh(dot / ld->softcap);
        w[k] = dot, mx = dot > mx ? dot : mx;
    }
    for (uint32_t k = first; k <= p; k++) w[k] = exp(w[k] - mx), sum += w[k];
    for (uint32_t d = 0; d < D; d++) out[d] = 0;
    for (uint32_t k = first; k <= p; k++) {
        const uint64_t row = (uint64_t)table[k / bt] * bt + k % bt;
        const __half *v = s->values + row * s->kv_row + kvh * D;
        for (uint32_t d = 0; d < D; d++) out[d] += w[k] / sum * (double)__half2float(v[d]);
    }
    free(w);
}

static float *run_attention(setup *s, int mode) { /* 0: decode-style only, 1: both, 2: prefill only */
    const uint64_t n = (uint64_t)s->n_tokens * s->lw.att.n_head * s->lw.att.head_dim;
    CHECK(cudaMemset(s->b.attn, 0xff, n * 4)); /* NaN: rows nobody writes stay NaN */
    if (mode == 2)
        must(em_cuda_prefill_attention(&s->b, &s->batch, 0), "prefill attention");
    else
        must(em_cuda_attention_with(&s->b, &s->batch, 0, mode == 1), "attention");
    CHECK(cudaStreamSynchronize(s->b.stream));
    float *out = (float *)malloc(n * 4);
    CHECK(cudaMemcpy(out, s->b.attn, n * 4, cudaMemcpyDeviceToHost));
    return out;
}

static bool in_segment(const setup *s, uint32_t t) {
    for (uint32_t i = 0; i < s->batch.n_segments; i++)
        if (t >= s->segments[2 * i] && t < s->segments[2 * i] + s->segments[2 * i + 1]) return true;
    return false;
}

/* The batches check_shape runs: */
/* sequences: 0 continues at 300 for 200 tokens; 1 decodes at 77, then 78; 2 starts with 33
 * tokens; 3 has a run of 5; 4 a chunk of 70 from 1000 and, after 1's second token, 31 more
 * (too short for a segment) */
static const run_part mixed_parts[] = {{1, 77, 1}, {0, 300, 200}, {3, 10, 5}, {2, 0, 33}, {4, 1000, 70}, {1, 78, 1},
                                       {4, 1070, 31}};
static const uint32_t mixed_len[] = {500, 79, 33, 15, 1101};
/* a follow-up turn: 41 tokens after 3000 cached (the prefill kernel splits the context), beside a
 * decode token */
static const run_part follow_parts[] = {{0, 3000, 41}, {1, 500, 1}};
static const uint32_t follow_len[] = {3041, 501};

static int check_shape(const shape *sh, const run_part *parts, uint32_t n_parts, const uint32_t *seq_len,
                       uint32_t n_seqs) {
    setup s;
    make_setup(&s, sh, parts, n_parts, n_seqs, seq_len, 3.0f);
    const uint32_t D = sh->dim, H = sh->n_head;
    const bool prefill_used = s.batch.n_segments > 0 && em_cuda_prefill_supported(&s.b, &s.lw);
    float *old_out = run_attention(&s, 0), *both = run_attention(&s, 1);
    float *pre = prefill_used ? run_attention(&s, 2) : NULL;
    /* and the prefill kernel without splits of the context */
    s.b.tuning.prefill_split = false;
    float *pre_whole = prefill_used ? run_attention(&s, 2) : NULL;
    s.b.tuning.prefill_split = true;
    const uint64_t n = (uint64_t)s.n_tokens * H * D;
    double *ref = (double *)malloc(n * sizeof(double));
    double ref_max = 0, err_old = 0, err_both = 0, err_vs_old = 0, err_pre = 0, err_whole = 0;
    for (uint32_t t = 0; t < s.n_tokens; t++)
        for (uint32_t h = 0; h < H; h++) reference(&s, t, h, ref + ((uint64_t)t * H + h) * D);
    for (uint64_t i = 0; i < n; i++) ref_max = fmax(ref_max, fabs(ref[i]));
    uint32_t misplaced = 0, pre_rows = 0;
    for (uint32_t t = 0; t < s.n_tokens; t++) {
        const bool seg = in_segment(&s, t);
        pre_rows += seg ? H : 0;
        for (uint64_t i = (uint64_t)t * H * D; i < (uint64_t)(t + 1) * H * D; i++) {
            /* fmax drops NaN: a NaN anywhere counts as an infinite error */
            err_old = isnan(old_out[i]) ? INFINITY : fmax(err_old, fabs(old_out[i] - ref[i]));
            err_both = isnan(both[i]) ? INFINITY : fmax(err_both, fabs(both[i] - ref[i]));
            err_vs_old = fmax(err_vs_old, fabs((double)both[i] - old_out[i]));
            /* the prefill kernel alone writes the segments' rows and leaves the others (NaN) */
            if (pre && seg) err_pre = isnan(pre[i]) ? INFINITY : fmax(err_pre, fabs(pre[i] - ref[i]));
            if (pre && seg) err_whole = isnan(pre_whole[i]) ? INFINITY : fmax(err_whole, fabs(pre_whole[i] - ref[i]));
            if (pre && !seg && (!isnan(pre[i]) || !isnan(pre_whole[i]))) misplaced++;
        }
    }
    const double tol = 2e-3;
    const bool ok = err_both / ref_max <= tol && err_vs_old / ref_max <= tol && err_old / ref_max <= tol &&
                    (!prefill_used || (misplaced == 0 && err_pre / ref_max <= tol && err_whole / ref_max <= tol));
    printf("%-22s segs %u other %2u  old/ref %.2e  mixed/ref %.2e  mixed/old %.2e  prefill-only: rows %5u "
           "err %.2e (unsplit %.2e) misplaced %u  %s%s\n",
           sh->name, s.batch.n_segments, s.batch.n_other, err_old / ref_max, err_both / ref_max, err_vs_old / ref_max,
           prefill_used ? pre_rows : 0, err_pre / ref_max, err_whole / ref_max, misplaced,
           prefill_used ? "" : "(fallback) ", ok ? "ok" : "FAIL");
    free(ref), free(old_out), free(both), free(pre), free(pre_whole);
    free_setup(&s);
    return ok ? 0 : 1;
}

#define PROMPT 8022
#define CHUNK 2048

/* One variant on the setup's batch, `reps` times after a warm-up: the decode-style kernel (warps < 0)
 * or the prefill kernel with `warps` per block (0: its default). Returns ms per run; *out gets the
 * output (n floats, malloc'd). */
static float time_variant(setup *s, int warps, int reps, uint64_t n, float **out) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaMemset(s->b.attn, 0xff, n * 4));
    for (int r = -1; r < reps; r++) {
        if (r == 0) CHECK(cudaEventRecord(e0, s->b.stream));
        if (warps < 0)
            must(em_cuda_attention_with(&s->b, &s->batch, 0, false), "attention");
        else
            must(em_cuda_prefill_attention_warps(&s->b, &s->batch, 0, (uint32_t)warps), "prefill");
    }
    CHECK(cudaEventRecord(e1, s->b.stream));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    *out = (float *)malloc(n * 4);
    CHECK(cudaMemcpy(*out, s->b.attn, n * 4, cudaMemcpyDeviceToHost));
    return ms / reps;
}

/* Times the decode-style kernel and the prefill kernel (4 and 8 warps) on each chunk of a prompt,
 * and compares each variant's output with the decode-style kernel's. Returns 1 when one differs
 * by more than 2e-3 of the largest output. */
static int time_prompt(const shape *sh) {
    const uint32_t seq_len[] = {PROMPT};
    double total[3] = {0, 0, 0}, flops_all = 0, worst[3] = {0, 0, 0};
    printf("%s: %u q heads, %u kv heads, head_dim %u, prompt %u in chunks of %u\n", sh->name, sh->n_head,
           sh->n_head_kv, sh->dim, PROMPT, CHUNK);
    printf("  chunk  tokens   old ms   new4 ms  new8 ms  new4 TFLOP/s  new8 TFLOP/s  err4/old  err8/old\n");
    for (uint32_t start = 0; start < PROMPT; start += CHUNK) {
        const uint32_t len = PROMPT - start < CHUNK ? PROMPT - start : CHUNK;
        const run_part part = {0, start, len};
        setup s;
        make_setup(&s, sh, &part, 1, 1, seq_len, 3.0f);
        double flops = 0;
        for (uint32_t t = 0; t < len; t++) flops += 4.0 * sh->dim * sh->n_head * (start + t + 1);
        flops_all += flops;
        const uint64_t n = (uint64_t)len * sh->n_head * sh->dim;
        float ms[3], *outs[3];
        double err[3] = {0, 0, 0};
        for (int mode = 0; mode < 3; mode++) { /* decode-style, prefill with 4 and with 8 warps */
            ms[mode] = time_variant(&s, mode == 0 ? -1 : mode == 1 ? 4 : 8, 5, n, &outs[mode]);
            total[mode] += ms[mode];
        }
        double mx = 0;
        for (uint64_t i = 0; i < n; i++) mx = fmax(mx, fabs(outs[0][i]));
        for (int mode = 1; mode < 3; mode++) {
            for (uint64_t i = 0; i < n; i++)
                err[mode] = isnan(outs[mode][i]) ? INFINITY : fmax(err[mode], fabs((double)outs[mode][i] - outs[0][i]));
            worst[mode] = fmax(worst[mode], err[mode] / mx);
        }
        printf("  %5u  %6u  %7.3f  %7.3f  %7.3f  %12.1f  %12.1f  %.2e  %.2e\n", start / CHUNK, len, ms[0], ms[1], ms[2],
               flops / ms[1] * 1e-9, flops / ms[2] * 1e-9, err[1] / mx, err[2] / mx);
        for (int mode = 0; mode < 3; mode++) free(outs[mode]);
        free_setup(&s);
    }
    printf("  total          %7.3f  %7.3f  %7.3f  %12.1f  %12.1f  %.2e  %.2e  (%.1f GFLOP)\n", total[0], total[1],
           total[2], flops_all / total[1] * 1e-9, flops_all / total[2] * 1e-9, worst[1], worst[2], flops_all * 1e-9);
    const bool ok = worst[1] <= 2e-3 && worst[2] <= 2e-3;
    if (!ok) printf("  FAIL: the prefill kernel differs from the decode-style kernel\n");
    return ok ? 0 : 1;
}

/* A follow-up turn on a long prompt: FOLLOW tokens after PROMPT cached, the decode-style kernel
 * and the prefill kernel with and without splits of the context, timed, and compared with the
 * decode-style kernel's output. */
#define FOLLOW 41
static int time_follow_up(const shape *sh) {
    const uint32_t seq_len[] = {PROMPT + FOLLOW};
    const run_part part = {0, PROMPT, FOLLOW};
    setup s;
    make_setup(&s, sh, &part, 1, 1, seq_len, 3.0f);
    const uint64_t n = (uint64_t)FOLLOW * sh->n_head * sh->dim;
    float ms[3], *outs[3];
    for (int mode = 0; mode < 3; mode++) { /* decode-style, prefill unsplit, prefill split */
        s.b.tuning.prefill_split = mode == 2;
        ms[mode] = time_variant(&s, mode == 0 ? -1 : 0, 20, n, &outs[mode]);
    }
    double mx = 0, err[3] = {0, 0, 0};
    for (uint64_t i = 0; i < n; i++) mx = fmax(mx, fabs(outs[0][i]));
    for (int mode = 1; mode < 3; mode++)
        for (uint64_t i = 0; i < n; i++)
            err[mode] = isnan(outs[mode][i]) ? INFINITY : fmax(err[mode], fabs((double)outs[mode][i] - outs[0][i]));
    printf("%s: %u tokens after %u: decode-style %.3f ms, prefill %.3f ms, split %.3f ms; err/old %.2e %.2e\n",
           sh->name, FOLLOW, PROMPT, ms[0], ms[1], ms[2], err[1] / mx, err[2] / mx);
    for (int mode = 0; mode < 3; mode++) free(outs[mode]);
    free_setup(&s);
    const bool ok = err[1] / mx <= 2e-3 && err[2] / mx <= 2e-3;
    if (!ok) printf("  FAIL: the prefill kernel differs from the decode-style kernel\n");
    return ok ? 0 : 1;
}

int main(void) {
    const shape shapes[] = {
        {"dense-1b 32/8x64", 32, 8, 64, 0, 0.0f},      {"moe-30b 32/4x128", 32, 4, 128, 0, 0.0f},
        {"mha 8/8x32", 8, 8, 32, 0, 0.0f},             {"gemma2 8/4x64 w100 cap", 8, 4, 64, 100, 50.0f},
        {"group7 14/2x64", 14, 2, 64, 0, 0.0f},        {"16/8x128 w48", 16, 8, 128, 48, 0.0f},
        {"softcap 4/1x128", 4, 1, 128, 0, 5.0f},       {"gemma 8/4x256", 8, 4, 256, 0, 0.0f},
        {"gemma2 16/8x256 w100 cap", 16, 8, 256, 100, 50.0f}, {"96 fallback 8/2x96", 8, 2, 96, 0, 0.0f},
    };
    int failed = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        failed += check_shape(&shapes[i], mixed_parts, sizeof mixed_parts / sizeof mixed_parts[0], mixed_len, 5);
        failed += check_shape(&shapes[i], follow_parts, sizeof follow_parts / sizeof follow_parts[0], follow_len, 2);
    }
    printf("correctness: %d failed\n", failed);
    fflush(stdout);
    const shape dense = {"dense-1b", 32, 8, 64, 0, 0.0f}, moe = {"moe-30b", 32, 4, 128, 0, 0.0f};
    const shape gemma = {"gemma-9b-like", 16, 8, 256, 0, 0.0f};
    failed += time_prompt(&dense);
    failed += time_prompt(&moe);
    failed += time_prompt(&gemma);
    failed += time_follow_up(&dense) + time_follow_up(&moe) + time_follow_up(&gemma);
    printf("check_attention: %d failed\n", failed);
    return failed ? 1 : 0;
}
