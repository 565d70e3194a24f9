/* Token sampling: repetition penalty, then greedy (temperature 0) or top-k → temperature →
 * top-p → min-p → a draw from a seeded generator, so a seed reproduces a run exactly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

struct em_sampler {
    em_sampler_params p;
    uint32_t n_vocab;
    int32_t *history; /* ring of the last repeat_last_n tokens */
    uint32_t n_history, next;
    uint64_t rng;
    uint32_t *order;  /* candidate ids, sorted by logit */
    float *probs;
};

em_sampler_params em_sampler_defaults(void) {
    return (em_sampler_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                               .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0};
}

em_err em_sampler_new(const em_sampler_params *params, uint32_t n_vocab, em_sampler **out) {
    *out = NULL;
    if (params->temperature < 0.0f || params->top_p <= 0.0f || params->top_p > 1.0f || params->min_p < 0.0f ||
        params->min_p > 1.0f || params->repeat_penalty <= 0.0f || n_vocab == 0)
        return em_errorf(EM_ERR_RANGE, "sampler: temperature %g, top-p %g, min-p %g, repeat penalty %g out of range",
                         params->temperature, params->top_p, params->min_p, params->repeat_penalty);
    em_sampler *s = calloc(1, sizeof *s);
    if (!s) return em_errorf(EM_ERR_NOMEM, "out of memory creating a sampler");
    s->p = *params;
    s->n_vocab = n_vocab;
    s->rng = params->seed ^ 0x9E3779B97F4A7C15ull;
    s->history = calloc(params->repeat_last_n ? params->repeat_last_n : 1, sizeof *s->history);
    s->order = malloc(n_vocab * sizeof *s->order);
    s->probs = malloc(n_vocab * sizeof *s->probs);
    if (!s->history || !s->order || !s->probs) {
        em_sampler_free(s);
        return em_errorf(EM_ERR_NOMEM, "out of memory for a sampler over %u tokens", n_vocab);
    }
    *out = s;
    return NULL;
}

void em_sampler_free(em_sampler *s) {
    if (!s) return;
    free(s->history);
    free(s->order);
    free(s->probs);
    free(s);
}

void em_sampler_accept(em_sampler *s, int32_t token) {
    if (!s->p.repeat_last_n) return;
    s->history[s->next] = token;
    s->next = (s->next + 1) % s->p.repeat_last_n;
    if (s->n_history < s->p.repeat_last_n) s->n_history++;
}

/* splitmix64 (Steele, Lea, Flood 2014): a uniform double in [0, 1). */
static double next_uniform(em_sampler *s) {
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (z >> 11) * (1.0 / 9007199254740992.0);
}

/* True when token a ranks before token b: higher logit, then lower id. */
static bool ranks_before(const float *logits, uint32_t a, uint32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
}

static void sift_down(uint32_t *ids, uint32_t root, uint32_t n, const float *logits) {
    for (;;) {
        uint32_t child = 2 * root + 1;
        if (child >= n) return;
        /* a min-heap on rank puts the worst-ranked candidate at the top */
        if (child + 1 < n && ranks_before(logits, ids[child], ids[child + 1])) child++;
        if (!ranks_before(logits, ids[root], ids[child])) return;
        uint32_t tmp = ids[root];
        ids[root] = ids[child];
        ids[child] = tmp;
        root = child;
    }
}

/* Heap sort of candidate ids, best first (qsort would need the logits in a global). */
static void sort_by_logit(uint32_t *ids, uint32_t n, const float *logits) {
    for (uint32_t i = n / 2; i-- > 0;) sift_down(ids, i, n, logits);
    for (uint32_t end = n; end-- > 1;) {
        uint32_t tmp = ids[0];
        ids[0] = ids[end];
        ids[end] = tmp;
        sift_down(ids, 0, end, logits);
    }
}

int32_t em_sampler_sample(em_sampler *s, float *logits) {
    /* Repetition penalty (Keskar et al. 2019): shrink the logits of recently seen tokens. */
    if (s->p.repeat_penalty != 1.0f) {
        for (uint32_t i = 0; i < s->n_history; i++) {
            int32_t t = s->history[i];
            if (t < 0 || (uint32_t)t >= s->n_vocab) continue;
            bool seen = false; /* penalize each token once however often it occurred */
            for (uint32_t j = 0; j < i; j++) seen |= s->history[j] == t;
            if (seen) continue;
            logits[t] = logits[t] > 0 ? logits[t] / s->p.repeat_penalty : logits[t] * s->p.repeat_penalty;
        }
    }
    if (s->p.temperature == 0.0f) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < s->n_vocab; i++)
            if (logits[i] > logits[best]) best = i;
        return (int32_t)best;
    }
    uint32_t n = s->n_vocab;
    for (uint32_t i = 0; i < n; i++) s->order[i] = i;
    sort_by_logit(s->order, n, logits);
    if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
    const float max = logits[s->order[0]];
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        s->probs[i] = expf((logits[s->order[i]] - max) / s->p.temperature);
        sum += s->probs[i];
    }
    for (uint32_t i = 0; i < n; i++) s->probs[i] = (float)(s->probs[i] / sum);
    if (s->p.top_p < 1.0f) { /* nucleus: the smallest prefix whose mass reaches top_p */
        double mass = 0.0;
        for (uint32_t i = 0; i < n; i++) {
            mass += s->probs[i];
            if (mass >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0.0f) { /* drop tokens below min_p times the most likely one */
        uint32_t keep = 1;
        while (keep < n && s->probs[keep] >= s->p.min_p * s->probs[0]) keep++;
        n = keep;
    }
    double total = 0.0;
    for (uint32_t i = 0; i < n; i++) total += s->probs[i];
    double r = next_uniform(s) * total;
    for (uint32_t i = 0; i < n; i++) {
        r -= s->probs[i];
        if (r < 0) return (int32_t)s->order[i];
    }
    return (int32_t)s->order[n - 1];
}
