/* A batch's mixture-of-experts layer on the CPU, by expert rather than by row.
 *
 * A prompt routes its tokens to many experts, each with a few to a few hundred of them. Splitting
 * every product's rows over the threads, as a dense layer does, costs two or three jobs of the pool
 * per product and one for each gated unit: hundreds of jobs per layer, each a wake-up of sleeping
 * threads and a wait for the slowest. Here each expert runs whole on one thread (its gate, up, gated
 * unit and down one after another, on that thread's scratch), and the experts are dealt out so that
 * the threads get about as many tokens each: one job for the experts, one for the sums. The numbers
 * are those of the per-row split: every product goes through em_cpu_matmul_run, whose rows never
 * depend on how they were split, and each token's outputs are added in ascending expert order. */
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

void em_cpu_expert_scratch_free(em_cpu_expert_scratch *s) {
    free(s->slot_token);
    free(s->slot_of);
    free(s->slot_weight);
    free(s->slot_out);
    free(s->expert_first);
    free(s->expert_count);
    free(s->expert_thread);
    for (uint32_t i = 0; i < s->n_threads; i++) {
        if (s->x) free(s->x[i]);
        if (s->gate) free(s->gate[i]);
        if (s->up) free(s->up[i]);
        if (s->act) free(s->act[i]);
        if (s->groups) free(s->groups[i]);
    }
    free(s->x);
    free(s->gate);
    free(s->up);
    free(s->act);
    free(s->groups);
    memset(s, 0, sizeof *s);
}

em_err em_cpu_expert_scratch_reserve(em_cpu_expert_scratch *s, uint32_t n_threads, uint32_t n_tokens,
                                     uint32_t n_used, uint32_t n_expert, uint32_t n_embd, uint32_t max_ff,
                                     uint64_t act_per_token, bool groups) {
    if (n_tokens <= s->cap_tokens) return NULL;
    em_cpu_expert_scratch_free(s);
    const uint64_t slots = (uint64_t)n_tokens * n_used;
    s->slot_token = malloc(slots * sizeof *s->slot_token);
    s->slot_of = malloc(slots * sizeof *s->slot_of);
    s->slot_weight = malloc(slots * sizeof *s->slot_weight);
    s->slot_out = malloc(slots * n_embd * sizeof *s->slot_out);
    s->expert_first = malloc((n_expert ? n_expert : 1) * sizeof *s->expert_first);
    s->expert_count = malloc((n_expert ? n_expert : 1) * sizeof *s->expert_count);
    s->expert_thread = malloc((n_expert ? n_expert : 1) * sizeof *s->expert_thread);
    s->x = calloc(n_threads, sizeof *s->x);
    s->gate = calloc(n_threads, sizeof *s->gate);
    s->up = calloc(n_threads, sizeof *s->up);
    s->act = calloc(n_threads, sizeof *s->act);
    s->groups = calloc(n_threads, sizeof *s->groups);
    bool ok = s->slot_token && s->slot_of && s->slot_weight && s->slot_out && s->expert_first && s->expert_count &&
              s->expert_thread && s->x && s->gate && s->up && s->act && s->groups;
    if (ok) s->n_threads = n_threads;
    for (uint32_t i = 0; ok && i < n_threads; i++) {
        s->x[i] = malloc((uint64_t)n_tokens * n_embd * sizeof(float));
        s->gate[i] = malloc((uint64_t)n_tokens * max_ff * sizeof(float));
        s->up[i] = malloc((uint64_t)n_tokens * max_ff * sizeof(float));
        s->act[i] = malloc(n_tokens * act_per_token);
        s->groups[i] = groups ? malloc(em_cpu_group_scratch_tokens(n_tokens) * act_per_token) : NULL;
        ok = s->x[i] && s->gate[i] && s->up[i] && s->act[i] && (!groups || s->groups[i]);
    }
    if (!ok) {
        em_cpu_expert_scratch_free(s);
        return em_errorf(EM_ERR_NOMEM, "out of memory for the experts' scratch of %u tokens", n_tokens);
    }
    s->cap_tokens = n_tokens;
    return NULL;
}

/* The slots in (expert, token) order by counting: each expert's first slot and count, and for each
 * token's k-th choice its slot. */
static void sort_slots(const em_cpu_experts *job, em_cpu_expert_scratch *s) {
    memset(s->expert_count, 0, job->n_expert * sizeof *s->expert_count);
    for (uint64_t i = 0; i < (uint64_t)job->n_tokens * job->n_used; i++) s->expert_count[job->chosen[i]]++;
    uint32_t first = 0;
    for (uint32_t ex = 0; ex < job->n_expert; ex++) {
        s->expert_first[ex] = first;
        first += s->expert_count[ex];
    }
    for (uint32_t ex = 0; ex < job->n_expert; ex++) s->expert_count[ex] = 0; /* counted again as slots fill */
    for (uint32_t t = 0; t < job->n_tokens; t++)
        for (uint32_t k = 0; k < job->n_used; k++) {
            const uint64_t choice = (uint64_t)t * job->n_used + k;
            const uint32_t ex = (uint32_t)job->chosen[choice];
            const uint32_t slot = s->expert_first[ex] + s->expert_count[ex]++;
            s->slot_token[slot] = t;
            s->slot_weight[slot] = job->chosen_weight[choice];
            s->slot_of[choice] = slot;
        }
}

/* Experts to threads: by tokens, most first, each to the thread with the fewest tokens so far (a
 * thread's time is nearly its tokens': every expert's weights are the same size). */
static void deal_experts(const em_cpu_experts *job, em_cpu_expert_scratch *s, uint32_t n_threads) {
    uint64_t load[EM_CPU_MAX_THREADS] = {0};
    for (uint32_t ex = 0; ex < job->n_expert; ex++) s->expert_thread[ex] = UINT32_MAX;
    for (uint32_t dealt = 0; dealt < job->n_expert; dealt++) {
        /* the busiest expert not dealt yet (ties: the lowest id), found by a scan: experts are few */
        uint32_t best = job->n_expert;
        for (uint32_t ex = 0; ex < job->n_expert; ex++)
            if (s->expert_thread[ex] == UINT32_MAX &&
                (best == job->n_expert || s->expert_count[ex] > s->expert_count[best]))
                best = ex;
        uint32_t least = 0;
        for (uint32_t i = 1; i < n_threads; i++)
            if (load[i] < load[least]) least = i;
        s->expert_thread[best] = least;
        load[least] += s->expert_count[best];
    }
}

typedef struct experts_job {
    const em_cpu_experts *job;
    em_cpu_expert_scratch *s;
    em_err err; /* the first error of any thread */
    pthread_mutex_t mutex;
} experts_job;

/* One expert on the calling thread, its outputs into its slots' rows. */
static em_err run_expert(const em_cpu_experts *job, em_cpu_expert_scratch *s, uint32_t ex, uint32_t ith) {
    const uint32_t first = s->expert_first[ex], count = s->expert_count[ex];
    const uint64_t e = job->n_embd, ff = job->gate->rows;
    float *x = s->x[ith], *gate = s->gate[ith], *up = s->up[ith];
    for (uint32_t i = 0; i < count; i++)
        memcpy(x + i * e, job->x + (uint64_t)s->slot_token[first + i] * e, e * sizeof *x);
    const bool shared_input = job->up->type == job->gate->type && job->up->cols == job->gate->cols;
    em_cpu_matmul products[] = {
        {.w = job->gate, .mat = ex, .x = x, .x_stride = e, .y = gate, .y_stride = ff, .n_tokens = count,
         .scratch = s->act[ith], .groups = s->groups[ith]},
        {.w = job->up, .mat = ex, .x = x, .x_stride = e, .y = up, .y_stride = ff, .n_tokens = count,
         .scratch = s->act[ith], .groups = s->groups[ith], .quantized = shared_input},
    };
    em_err err;
    for (int i = 0; i < 2; i++)
        if ((err = em_cpu_matmul_run(NULL, &products[i]))) return err;
    if (job->gate_bias) em_cpu_add_bias(gate, job->gate_bias + ex * ff, count, ff);
    if (job->up_bias) em_cpu_add_bias(up, job->up_bias + ex * ff, count, ff);
    em_cpu_glu(job->act, job->limit, job->alpha, gate, up, count * ff);
    em_cpu_matmul down = {.w = job->down, .mat = ex, .x = gate, .x_stride = ff, .y = s->slot_out + first * e,
                          .y_stride = e, .n_tokens = count, .scratch = s->act[ith], .groups = s->groups[ith]};
    if ((err = em_cpu_matmul_run(NULL, &down))) return err;
    if (job->down_bias) em_cpu_add_bias(s->slot_out + first * e, job->down_bias + ex * job->down->rows, count, e);
    return NULL;
}

static void experts_share(void *ctx, uint32_t ith, uint32_t nth) {
    experts_job *ej = ctx;
    for (uint32_t ex = 0; ex < ej->job->n_expert; ex++) {
        if (ej->s->expert_count[ex] == 0 || ej->s->expert_thread[ex] % nth != ith) continue;
        em_err err = run_expert(ej->job, ej->s, ex, ith);
        if (err) {
            pthread_mutex_lock(&ej->mutex);
            if (!ej->err) ej->err = err;
            else em_err_free(err);
            pthread_mutex_unlock(&ej->mutex);
            return;
        }
    }
}

/* Tokens [begin, end) of the sums: each token's slots in ascending order (the order of their
 * experts), each output scaled by its weight and added to a row of zeros. */
static void sums_share(void *ctx, uint32_t ith, uint32_t nth) {
    const experts_job *ej = ctx;
    const em_cpu_experts *job = ej->job;
    const uint64_t e = job->n_embd;
    uint64_t begin, end;
    em_cpu_share(job->n_tokens, ith, nth, &begin, &end);
    for (uint64_t t = begin; t < end; t++) {
        uint32_t *slots = ej->s->slot_of + t * job->n_used;
        for (uint32_t i = 1; i < job->n_used; i++) /* insertion sort of a handful */
            for (uint32_t j = i; j > 0 && slots[j - 1] > slots[j]; j--) {
                const uint32_t swap = slots[j];
                slots[j] = slots[j - 1];
                slots[j - 1] = swap;
            }
        float *o = job->out + t * e;
        memset(o, 0, e * sizeof *o);
        for (uint32_t i = 0; i < job->n_used; i++) {
            const float weight = ej->s->slot_weight[slots[i]], *y = ej->s->slot_out + (uint64_t)slots[i] * e;
            for (uint64_t j = 0; j < e; j++) o[j] += weight * y[j];
        }
    }
}

em_err em_cpu_experts_run(em_cpu_pool *pool, const em_cpu_experts *job, em_cpu_expert_scratch *s) {
    sort_slots(job, s);
    deal_experts(job, s, pool->n_threads);
    experts_job ej = {.job = job, .s = s};
    pthread_mutex_init(&ej.mutex, NULL);
    em_cpu_pool_run(pool, experts_share, &ej);
    pthread_mutex_destroy(&ej.mutex);
    if (ej.err) return ej.err;
    em_cpu_pool_run_sized(pool, sums_share, &ej, (uint64_t)job->n_tokens * job->n_used * job->n_embd * sizeof(float));
    return NULL;
}
