/* Per-request sampling (engine.h): bias, penalties and logprobs here; the draw itself (greedy, or
 * temperature/min-p/top-k/top-p and a seeded Gumbel-max pick) is the shared rule of backend/pick.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

em_err em_sampler_init(em_sampler *sampler, const ember_sampling *params, uint32_t n_vocab) {
    memset(sampler, 0, sizeof *sampler);
    const ember_sampling *p = params;
    if (!(p->temperature >= 0) || p->temperature > 100)
        return em_errorf(EM_ERR_INVALID, "sampling: temperature %g is outside [0, 100]", p->temperature);
    if (p->top_k < 0) return em_errorf(EM_ERR_INVALID, "sampling: top_k %d is negative", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1)) return em_errorf(EM_ERR_INVALID, "sampling: top_p %g is outside (0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1)) return em_errorf(EM_ERR_INVALID, "sampling: min_p %g is outside [0, 1]", p->min_p);
    if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty))
        return em_errorf(EM_ERR_INVALID, "sampling: repeat penalty %g must be positive", p->repeat_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) || fabsf(p->presence_penalty) > 100 ||
        fabsf(p->frequency_penalty) > 100)
        return em_errorf(EM_ERR_INVALID, "sampling: presence/frequency penalties must be finite and within ±100");
    if (p->repeat_last_n < -1) return em_errorf(EM_ERR_INVALID, "sampling: repeat_last_n %d", p->repeat_last_n);
    if (p->logprobs < 0 || p->logprobs > 20)
        return em_errorf(EM_ERR_INVALID, "sampling: logprobs %d is outside [0, 20]", p->logprobs);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].token < 0 || (uint32_t)p->logit_bias[i].token >= n_vocab)
            return em_errorf(EM_ERR_INVALID, "sampling: logit bias for token %d, outside the vocabulary of %u",
                             p->logit_bias[i].token, n_vocab);
        if (isnan(p->logit_bias[i].bias)) return em_errorf(EM_ERR_INVALID, "sampling: logit bias is NaN");
    }
    sampler->params = *p;
    sampler->n_vocab = n_vocab;
    sampler->order = malloc(n_vocab * sizeof *sampler->order);
    sampler->keys = malloc(2 * (size_t)n_vocab * sizeof *sampler->keys);
    if (p->n_logit_bias) {
        sampler->owned_bias = malloc(p->n_logit_bias * sizeof *sampler->owned_bias);
        if (sampler->owned_bias) memcpy(sampler->owned_bias, p->logit_bias, p->n_logit_bias * sizeof *p->logit_bias);
    }
    sampler->params.logit_bias = sampler->owned_bias;
    if (!sampler->order || !sampler->keys || (p->n_logit_bias && !sampler->owned_bias)) {
        em_sampler_free(sampler);
        return em_errorf(EM_ERR_NOMEM, "sampling: no memory for a vocabulary of %u", n_vocab);
    }
    return NULL;
}

void em_sampler_free(em_sampler *sampler) {
    free(sampler->order);
    free(sampler->keys);
    free(sampler->owned_bias);
    free(sampler->window_tokens);
    free(sampler->window_counts);
    memset(sampler, 0, sizeof *sampler);
}

/* Counts each distinct token of the window (open addressing; the window is small). */
static void apply_penalties(em_sampler *s, float *logits, const int32_t *history, size_t n_history) {
    const ember_sampling *p = &s->params;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    size_t window = p->repeat_last_n < 0 ? n_history : (size_t)p->repeat_last_n;
    if (window > n_history) window = n_history;
    if (window == 0) return;
    const int32_t *tokens = history + n_history - window;
    size_t cap = 16;
    while (cap < 2 * window) cap *= 2;
    if (cap > s->window_cap) {
        int32_t *t = realloc(s->window_tokens, cap * sizeof *t);
        if (t) s->window_tokens = t;
        uint32_t *c = realloc(s->window_counts, cap * sizeof *c);
        if (c) s->window_counts = c;
        if (!t || !c) return; /* out of memory: sample without penalties rather than fail the request */
        s->window_cap = cap;
    }
    memset(s->window_counts, 0, cap * sizeof *s->window_counts);
    for (size_t i = 0; i < window; i++) {
        size_t h = ((uint32_t)tokens[i] * 2654435761u) & (cap - 1);
        while (s->window_counts[h] && s->window_tokens[h] != tokens[i]) h = (h + 1) & (cap - 1);
        s->window_tokens[h] = tokens[i];
        s->window_counts[h]++;
    }
    for (size_t h = 0; h < cap; h++) {
        uint32_t count = s->window_counts[h];
        int32_t token = s->window_tokens[h];
        if (!count || token < 0 || (uint32_t)token >= s->n_vocab) continue;
        float *l = &logits[token];
        if (p->repeat_penalty != 1.0f) *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
        *l -= p->presence_penalty + p->frequency_penalty * (float)count;
    }
}

static uint32_t argmax(const float *logits, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Sorts ids by descending logit; ties by ascending id, so the order is fully determined. */
static int by_logit_desc(const void *a, const void *b, void *context) {
    const float *logits = context;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (logits[x] != logits[y]) return logits[x] > logits[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* True when token x ranks above token y: larger logit, ties to the smaller id. */
static bool ranks_above(const float *logits, uint32_t x, uint32_t y) {
    return logits[x] > logits[y] || (logits[x] == logits[y] && x < y);
}

/* Keeps the k best of order[0..n) at the front, best first, in O(n log k): a min-heap of the k best
 * seen so far (its root is the weakest of them), then a sort of those k. */
static uint32_t select_top(uint32_t *order, uint32_t n, uint32_t k, const float *logits) {
    if (k >= n) k = n;
    if (k == 0) return 0;
    uint32_t *heap = order; /* the heap lives in order[0..k) */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t token = order[i], at;
        if (i < k) { /* sift up */
            at = i;
            while (at && ranks_above(logits, heap[(at - 1) / 2], token)) {
                heap[at] = heap[(at - 1) / 2];
                at = (at - 1) / 2;
            }
            heap[at] = token;
            continue;
        }
        if (!ranks_above(logits, token, heap[0])) continue;
        at = 0; /* replace the root and sift down */
        for (;;) {
            uint32_t child = 2 * at + 1;
            if (child >= k) break;
            if (child + 1 < k && ranks_above(logits, heap[child], heap[child + 1])) child++;
            if (!ranks_above(logits, token, heap[child])) break;
            heap[at] = heap[child];
            at = child;
        }
        heap[at] = token;
    }
    qsort_r(heap, k, sizeof *heap, by_logit_desc, (void *)logits);
    return k;
}

bool em_sampler_plain(const em_sampler *s) {
    const ember_sampling *p = &s->params;
    const bool no_penalties = p->repeat_last_n == 0 || (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
                                                        p->frequency_penalty == 0.0f);
    return p->n_logit_bias == 0 && p->logprobs == 0 && no_penalties;
}

em_pick_params em_sampler_pick_params(const em_sampler *s) {
    const ember_sampling *p = &s->params;
    return em_pick_params_make(p->temperature, p->top_k, p->top_p, p->min_p, p->seed, s->n_sampled);
}

em_pick_params em_sampler_pick_params_at(const em_sampler *s, uint32_t ahead) {
    const ember_sampling *p = &s->params;
    return em_pick_params_make(p->temperature, p->top_k, p->top_p, p->min_p, p->seed, s->n_sampled + ahead);
}

static void compute_logprobs(em_sampler *s, const float *logits, int32_t chosen, float *logprob,
                             ember_top_logprob *top, int *n_top) {
    uint32_t n = s->n_vocab;
    float max = logits[argmax(logits, n)];
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)logits[i] - max);
    double log_z = max + log(sum);
    *logprob = (float)(logits[chosen] - log_z);
    uint32_t k = (uint32_t)s->params.logprobs;
    for (uint32_t i = 0; i < n; i++) s->order[i] = i;
    k = select_top(s->order, n, k, logits);
    for (uint32_t i = 0; i < k; i++) {
        top[i].token = (int32_t)s->order[i];
        top[i].logprob = (float)(logits[s->order[i]] - log_z);
    }
    *n_top = (int)k;
}

int32_t em_sampler_sample(em_sampler *s, float *logits, const uint32_t *allowed, const int32_t *history, size_t n_history,
                          float *logprob, ember_top_logprob *top, int *n_top) {
    const ember_sampling *p = &s->params;
    for (size_t i = 0; i < p->n_logit_bias; i++) logits[p->logit_bias[i].token] += p->logit_bias[i].bias;
    apply_penalties(s, logits, history, n_history);
    if (allowed) em_pick_mask(logits, s->n_vocab, allowed);
    em_pick_params pick = em_sampler_pick_params(s);
    int32_t chosen = em_pick(logits, s->n_vocab, &pick, s->keys);
    s->n_sampled++;
    if (p->logprobs > 0) compute_logprobs(s, logits, chosen, logprob, top, n_top);
    else if (n_top) *n_top = 0;
    return chosen;
}
