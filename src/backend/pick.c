/* The pick rule on the host (pick.h): the CPU backend and the engine's sampler run this; the CUDA
 * backend computes the same thresholds with reductions (cuda/sample.cu). */
#include <stdlib.h>

#include "pick.h"

em_pick_params em_pick_params_make(float temperature, int top_k, float top_p, float min_p, uint64_t seed,
                                   uint64_t counter) {
    em_pick_params p;
    p.temperature = temperature;
    p.top_k = top_k > 0 ? (uint32_t)top_k : 0;
    p.top_p = top_p;
    p.min_p_shift = min_p > 0 ? temperature * logf(min_p) : -INFINITY;
    p.seed = seed;
    p.counter = counter;
    return p;
}

static void swap_keys(uint64_t *a, uint64_t *b) {
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Moves the k largest of keys[0..n) to the front (in no particular order): quickselect. */
static void select_largest(uint64_t *keys, uint32_t n, uint32_t k) {
    uint32_t lo = 0, hi = n; /* the k-th largest lies in [lo, hi) */
    while (hi - lo > 1) {
        uint64_t a = keys[lo], b = keys[lo + (hi - lo) / 2], c = keys[hi - 1];
        uint64_t pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        /* three-way partition: > pivot, == pivot (keys are distinct, so one), < pivot */
        uint32_t above = lo;
        for (uint32_t i = lo; i < hi; i++)
            if (keys[i] > pivot) swap_keys(&keys[i], &keys[above++]);
        uint32_t at = above;
        for (uint32_t i = above; i < hi; i++)
            if (keys[i] == pivot) swap_keys(&keys[i], &keys[at++]);
        if (k <= above) hi = above;
        else if (k <= at) return;
        else lo = at;
    }
}

static int by_key_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y;
}

/* The lowest index among the largest non-NaN logits; 0 when every logit is NaN. */
static uint32_t argmax(const float *logits, uint32_t n) {
    uint64_t best = 0;
    bool found = false;
    for (uint32_t i = 0; i < n; i++) {
        if (isnan(logits[i])) continue;
        uint64_t key = em_pick_key(logits[i], i);
        if (!found || key > best) best = key, found = true;
    }
    return found ? em_pick_key_index(best) : 0;
}

int32_t em_pick(const float *logits, uint32_t n, const em_pick_params *p, uint64_t *keys) {
    const uint32_t top = argmax(logits, n);
    const float max = logits[top];
    if (p->temperature == 0.0f || !(max > -INFINITY && max < INFINITY)) return (int32_t)top;
    const float floor_logit = max + p->min_p_shift;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n; i++)
        if (em_pick_candidate(logits[i], floor_logit)) keys[kept++] = em_pick_key(logits[i], i);
    if (p->top_k > 0 && p->top_k < kept) {
        select_largest(keys, kept, p->top_k);
        kept = p->top_k;
    }
    if (p->top_p < 1.0f) {
        qsort(keys, kept, sizeof *keys, by_key_desc);
        uint64_t total = 0, reached = 0;
        for (uint32_t i = 0; i < kept; i++) total += em_pick_mass(logits[em_pick_key_index(keys[i])], max, p->temperature);
        const uint64_t target = em_pick_mass_target(total, p->top_p);
        uint32_t prefix = 0;
        do reached += em_pick_mass(logits[em_pick_key_index(keys[prefix])], max, p->temperature);
        while (++prefix < kept && reached < target);
        kept = prefix;
    }
    /* Gumbel-max over the kept tokens; the top token (always kept) sets the bar the rest must reach. */
    const float t = p->temperature;
    double best = em_pick_score(max, t, em_pick_bits(p->seed, p->counter, top));
    uint32_t chosen = top;
    const double bar = best;
    for (uint32_t k = 0; k < kept; k++) {
        const uint32_t i = em_pick_key_index(keys[k]);
        if (i == top) continue;
        const uint64_t bits = em_pick_bits(p->seed, p->counter, i);
        if (!em_pick_may_win((double)logits[i] / t - bar, bits)) continue;
        const double score = em_pick_score(logits[i], t, bits);
        if (score > best || (score == best && i < chosen)) best = score, chosen = i;
    }
    return (int32_t)chosen;
}
