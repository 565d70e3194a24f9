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

/* The lowest index among the largest non-NaN logits; 0 when every logit is NaN. Plain float
 * comparisons give the key order's answer (NaN never compares larger; -0 and +0 tie). */
static uint32_t argmax(const float *logits, uint32_t n) {
    uint32_t best = 0;
    while (best + 1 < n && isnan(logits[best])) best++;
    for (uint32_t i = best + 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static void swap_pairs(uint64_t *keys, uint64_t *mass, uint32_t a, uint32_t b) {
    swap_keys(&keys[a], &keys[b]);
    swap_keys(&mass[a], &mass[b]);
}

/* top_p's cut over keys[0..n) (with their masses): reorders them so that the kept ones, the
 * shortest best-ranked prefix whose mass reaches `target`, come first; returns how many. A
 * quickselect on the crossing point of the running mass, O(n) expected, instead of a sort. */
static uint32_t cut_by_mass(uint64_t *keys, uint64_t *mass, uint32_t n, uint64_t target) {
    uint32_t lo = 0, hi = n; /* the crossing lies in [lo, hi); the mass of [0, lo) is `above` */
    uint64_t above = 0;
    while (hi - lo > 1) {
        uint64_t a = keys[lo], b = keys[lo + (hi - lo) / 2], c = keys[hi - 1];
        uint64_t pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        uint32_t split = lo; /* [lo, split): keys > pivot */
        uint64_t greater = 0;
        for (uint32_t i = lo; i < hi; i++)
            if (keys[i] > pivot) greater += mass[i], swap_pairs(keys, mass, i, split++);
        for (uint32_t i = split; i < hi; i++)
            if (keys[i] == pivot) {
                swap_pairs(keys, mass, i, split);
                break;
            }
        if (above + greater >= target) hi = split;
        else if (above + greater + mass[split] >= target) return split + 1;
        else above += greater + mass[split], lo = split + 1;
    }
    return lo + 1;
}

int32_t em_pick(const float *logits, uint32_t n, const em_pick_params *p, uint64_t *scratch) {
    const uint32_t top = argmax(logits, n);
    const float max = logits[top], t = p->temperature;
    if (t == 0.0f || !(max > -INFINITY && max < INFINITY)) return (int32_t)top;
    const float floor_logit = max + p->min_p_shift;
    const double bar = em_pick_score(max, t, em_pick_bits(p->seed, p->counter, top));
    const float inv_t = 1.0f / t, bar_f = (float)bar, slack = em_pick_slack(bar_f);
    double best = bar;
    uint32_t chosen = top;
    if (p->top_k == 0 && p->top_p >= 1.0f) { /* every candidate is kept: no keys needed */
        for (uint32_t i = 0; i < n; i++) {
            if (i == top || !em_pick_candidate(logits[i], floor_logit)) continue;
            const float gap = logits[i] * inv_t - bar_f;
            if (gap < -38.0f - slack) continue;
            const uint64_t bits = em_pick_bits(p->seed, p->counter, i);
            if (!em_pick_may_win(gap, slack, bits)) continue;
            const double score = em_pick_score(logits[i], t, bits);
            if (score > best || (score == best && i < chosen)) best = score, chosen = i;
        }
        return (int32_t)chosen;
    }
    uint64_t *keys = scratch, *mass = scratch + n;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n; i++)
        if (em_pick_candidate(logits[i], floor_logit)) keys[kept++] = em_pick_key(logits[i], i);
    if (p->top_k > 0 && p->top_k < kept) {
        select_largest(keys, kept, p->top_k);
        kept = p->top_k;
    }
    if (p->top_p < 1.0f) {
        uint64_t total = 0;
        for (uint32_t k = 0; k < kept; k++) total += mass[k] = em_pick_mass(logits[em_pick_key_index(keys[k])], max, t);
        kept = cut_by_mass(keys, mass, kept, em_pick_mass_target(total, p->top_p));
    }
    /* Gumbel-max over the kept tokens; the top token (always kept) sets the bar the rest must reach. */
    for (uint32_t k = 0; k < kept; k++) {
        const uint32_t i = em_pick_key_index(keys[k]);
        if (i == top) continue;
        const uint64_t bits = em_pick_bits(p->seed, p->counter, i);
        if (!em_pick_may_win(logits[i] * inv_t - bar_f, slack, bits)) continue;
        const double score = em_pick_score(logits[i], t, bits);
        if (score > best || (score == best && i < chosen)) best = score, chosen = i;
    }
    return (int32_t)chosen;
}
