/* Gated DeltaNet on the CPU (program.h's EM_PROGRAM_DELTA_NET and EM_PROGRAM_GATED_NORM): the
 * linear-attention mixer of hybrid models, one token at a time in batch order, written to be read
 * against the math of program.h rather than to be fast. A batch's tokens of one sequence come in
 * position order, so walking the batch in order walks each sequence's recurrence in order; sequences
 * (through their state slots) and heads are independent, so the work splits over channels for the
 * convolution and over value heads for the recurrence, every thread walking all the tokens.
 *
 * The prefill runs the same recurrence token by token (the chunked form, which turns a chunk's steps
 * into matrix products, gives the same numbers up to rounding and is for the faster backends). */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

static uint32_t conv_dim_of(const em_program_delta_net *d) {
    return 2 * d->n_head_k * d->head_dim_k + d->n_head_v * d->head_dim_v;
}

/* The state of the slot of token t's sequence for this operation: conv inputs, then the heads' S. */
static float *slot_state(const em_cpu_delta_net *job, uint32_t t) {
    const uint32_t slot = job->batch->seqs[job->batch->seq[t]].state;
    return job->states + (uint64_t)slot * job->slot_floats + job->offset;
}

/* Step 1, for channels [begin, end): x = SiLU(Σ_j conv[c][j] · input[t − (K−1) + j]), the last K − 1
 * inputs of each channel kept in the conv state ([K − 1][conv_dim], oldest first). */
static void convolve(const em_cpu_delta_net *job, uint64_t begin, uint64_t end) {
    const em_program_delta_net *d = job->op;
    const uint32_t conv_dim = conv_dim_of(d), K = d->conv_kernel;
    for (uint32_t t = 0; t < job->batch->n_tokens; t++) {
        float *history = slot_state(job, t);
        const float *in = job->mixed + (uint64_t)t * conv_dim;
        float *out = job->conv_out + (uint64_t)t * conv_dim;
        if (job->batch->pos[t] == 0)
            for (uint32_t j = 0; j + 1 < K; j++) memset(history + (uint64_t)j * conv_dim + begin, 0, (end - begin) * sizeof(float));
        for (uint64_t c = begin; c < end; c++) {
            const float *w = d->conv + c * K;
            float sum = w[K - 1] * in[c];
            for (uint32_t j = 0; j + 1 < K; j++) sum += w[j] * history[(uint64_t)j * conv_dim + c];
            for (uint32_t j = 0; j + 2 < K; j++) history[(uint64_t)j * conv_dim + c] = history[(uint64_t)(j + 1) * conv_dim + c];
            if (K > 1) history[(uint64_t)(K - 2) * conv_dim + c] = in[c];
            out[c] = sum / (1.0f + em_expf(-sum));
        }
    }
}

static void convolve_share(void *ctx, uint32_t ith, uint32_t nth) {
    const em_cpu_delta_net *job = ctx;
    uint64_t begin, end;
    em_cpu_share(conv_dim_of(job->op), ith, nth, &begin, &end);
    convolve(job, begin, end);
}

/* x · 1/√(Σx² + eps) · scale, in place. */
static void l2_normalize(float *x, uint32_t n, float eps, float scale) {
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    const float factor = (float)(1.0 / sqrt(sum + eps)) * scale;
    for (uint32_t i = 0; i < n; i++) x[i] *= factor;
}

/* log(1 + e^x), the linear function where e^x would not change the sum (as torch's threshold 20). */
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Step 2, for tokens [begin, end): q and k heads L2-normalized (q also by 1/√dk), and each value
 * head's decay g = a · softplus(alpha + dt_bias) and write strength β = σ(beta). */
static void gates_share(void *ctx, uint32_t ith, uint32_t nth) {
    const em_cpu_delta_net *job = ctx;
    const em_program_delta_net *d = job->op;
    const uint32_t conv_dim = conv_dim_of(d);
    uint64_t begin, end;
    em_cpu_share(job->batch->n_tokens, ith, nth, &begin, &end);
    const float q_scale = 1.0f / sqrtf((float)d->head_dim_k);
    for (uint64_t t = begin; t < end; t++) {
        float *row = job->conv_out + t * conv_dim;
        for (uint32_t h = 0; h < 2 * d->n_head_k; h++)
            l2_normalize(row + (uint64_t)h * d->head_dim_k, d->head_dim_k, d->eps, h < d->n_head_k ? q_scale : 1.0f);
        const float *beta = job->beta + t * d->n_head_v, *alpha = job->alpha + t * d->n_head_v;
        float *gates = job->gates + t * 2 * d->n_head_v;
        for (uint32_t h = 0; h < d->n_head_v; h++) {
            gates[2 * h] = d->a[h] * softplus(alpha[h] + d->dt_bias[h]);
            gates[2 * h + 1] = 1.0f / (1.0f + em_expf(-beta[h]));
        }
    }
}

/* Step 3, for value heads [begin, end): S ← e^g S; u = Sᵀk; S ← S + k (β (v − u))ᵀ; o = Sᵀq, with
 * S[i][j] at row i (a key dimension), column j (a value dimension). `delta` holds head_dim_v floats. */
static void recur(const em_cpu_delta_net *job, uint64_t begin, uint64_t end, float *delta) {
    const em_program_delta_net *d = job->op;
    const uint32_t conv_dim = conv_dim_of(d), dk = d->head_dim_k, dv = d->head_dim_v;
    const uint32_t group = d->n_head_v / d->n_head_k;
    const uint64_t conv_floats = (uint64_t)(d->conv_kernel - 1) * conv_dim;
    for (uint32_t t = 0; t < job->batch->n_tokens; t++) {
        const float *row = job->conv_out + (uint64_t)t * conv_dim;
        const float *gates = job->gates + (uint64_t)t * 2 * d->n_head_v;
        float *out = job->out + (uint64_t)t * d->n_head_v * dv;
        float *heads = slot_state(job, t) + conv_floats;
        for (uint64_t h = begin; h < end; h++) {
            const uint32_t kh = d->v_tiled ? (uint32_t)h % d->n_head_k : (uint32_t)h / group;
            const float *q = row + (uint64_t)kh * dk, *k = row + (uint64_t)(d->n_head_k + kh) * dk;
            const float *v = row + 2 * (uint64_t)d->n_head_k * dk + h * dv;
            float *S = heads + h * dk * dv, *o = out + h * dv;
            if (job->batch->pos[t] == 0) memset(S, 0, (uint64_t)dk * dv * sizeof(float));
            const float decay = expf(gates[2 * h]), beta = gates[2 * h + 1];
            for (uint32_t j = 0; j < dv; j++) delta[j] = 0.0f;
            for (uint32_t i = 0; i < dk; i++) {
                float *Si = S + (uint64_t)i * dv;
                for (uint32_t j = 0; j < dv; j++) {
                    Si[j] *= decay;
                    delta[j] += Si[j] * k[i]; /* u = Sᵀk */
                }
            }
            for (uint32_t j = 0; j < dv; j++) delta[j] = beta * (v[j] - delta[j]);
            for (uint32_t j = 0; j < dv; j++) o[j] = 0.0f;
            for (uint32_t i = 0; i < dk; i++) {
                float *Si = S + (uint64_t)i * dv;
                for (uint32_t j = 0; j < dv; j++) {
                    Si[j] += k[i] * delta[j];
                    o[j] += Si[j] * q[i];
                }
            }
        }
    }
}

static void recur_share(void *ctx, uint32_t ith, uint32_t nth) {
    const em_cpu_delta_net *job = ctx;
    uint64_t begin, end;
    em_cpu_share(job->op->n_head_v, ith, nth, &begin, &end);
    recur(job, begin, end, job->scratch + (uint64_t)ith * job->op->head_dim_v);
}

void em_cpu_delta_net_run(em_cpu_pool *pool, const em_cpu_delta_net *job) {
    const em_program_delta_net *d = job->op;
    const uint64_t n = job->batch->n_tokens;
    /* work in bytes-of-a-product equivalents, for em_cpu_pool_run_sized: a multiply-add each */
    em_cpu_pool_run_sized(pool, convolve_share, (void *)job, n * conv_dim_of(d) * d->conv_kernel * 4);
    em_cpu_pool_run_sized(pool, gates_share, (void *)job, n * conv_dim_of(d) * 16);
    em_cpu_pool_run_sized(pool, recur_share, (void *)job, n * d->n_head_v * d->head_dim_k * d->head_dim_v * 16);
}

void em_cpu_gated_norm(const em_program_heads *h, float *rows, const float *gate, uint32_t n_tokens) {
    const uint64_t width = (uint64_t)h->n_head * h->head_dim;
    for (uint64_t t = 0; t < n_tokens; t++)
        for (uint32_t i = 0; i < h->n_head; i++) {
            float *head = rows + t * width + (uint64_t)i * h->head_dim;
            const float *z = gate + t * width + (uint64_t)i * h->head_dim;
            em_cpu_rmsnorm(head, head, h->norm.weight, h->head_dim, h->norm.eps, h->norm.plus_one);
            for (uint32_t j = 0; j < h->head_dim; j++) head[j] *= z[j] / (1.0f + em_expf(-z[j]));
        }
}
