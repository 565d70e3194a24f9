/*
 * pick — the one rule that turns a logits row into the next token, computed alike by the host
 * sampler (src/engine/sample.c), the CPU backend and the CUDA backend (cuda/sample.cu), so a
 * request gets the same tokens wherever its rows were sampled.
 *
 * The rule, for a row l[0..n) and parameters (T, top_k, top_p, min_p, seed, counter):
 *  - T == 0, or no finite logit, or a +inf logit: argmax, the lowest index among equal maxima
 *    (NaN is never chosen unless the row holds nothing else).
 *  - Otherwise tokens are ranked by (logit desc, index asc): one 64-bit key per token,
 *    em_pick_key(), whose order is exactly that ranking. The candidates are the finite logits;
 *    min_p keeps l >= max + T ln(min_p); top_k keeps the k best ranked; top_p keeps the shortest
 *    best-ranked prefix whose mass reaches top_p of the mass left (at least one token). So the
 *    kept set is always "every candidate whose key is >= some threshold".
 *    The mass of a token is its softmax weight at T, exp((l - max) / T), in 64-bit fixed point
 *    (em_pick_mass, 40 fraction bits): integer sums are exact, so a sequential host loop and a
 *    parallel GPU reduction add up to the same number. Weights below 2^-40 of the top token's
 *    count as zero for top_p's cut only.
 *  - The draw is Gumbel-max: token = argmax over kept i of l_i / T + g_i, g_i = -ln(-ln(u_i)),
 *    u_i in (0, 1) a counter-based hash of (seed, counter, i) (em_pick_uniform). That samples
 *    exactly from softmax(l / T) restricted to the kept set, and the random numbers depend only on
 *    (seed, counter, token id): batched equals solo, and the CPU equals the GPU up to the rounding
 *    of the logits themselves (and of exp/log, which differ by at most an ulp between libraries).
 *    `counter` is how many tokens the request has sampled before this one.
 *
 * Scores are only computed for tokens that can still win: a token is skipped when even a
 * conservative bound on its Gumbel noise cannot lift it above the score of the top token
 * (em_pick_may_win, integer work only). The skip is exact (it never changes the result); it spares
 * two logarithms per token, which would be most of the cost.
 *
 * Everything below the parameters is plain C that CUDA also compiles (EM_PICK_FN), so the hash,
 * the keys and the masses are written once.
 */
#ifndef EMBER_BACKEND_PICK_H
#define EMBER_BACKEND_PICK_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define EM_PICK_FN static inline __host__ __device__
#else
#define EM_PICK_FN static inline
#endif

/* What the rule needs for one row; made by em_pick_params_make (the host), read by every backend. */
typedef struct em_pick_params {
    float temperature; /* 0: argmax */
    float top_p;       /* 1: off */
    float min_p_shift; /* T * ln(min_p), computed once on the host; -inf: min_p off */
    uint32_t top_k;    /* 0: off */
    uint64_t seed;
    uint64_t counter; /* tokens the request sampled before this one */
} em_pick_params;

em_pick_params em_pick_params_make(float temperature, int top_k, float top_p, float min_p, uint64_t seed,
                                   uint64_t counter);

/* Sets the logits of the tokens outside `allowed` to -inf: a grammar's bitset of the tokens that
 * may come next (bit t of allowed[t / 32]), applied before the rule by the host sampler and by a
 * backend that picks masked rows. */
static inline void em_pick_mask(float *logits, uint32_t n, const uint32_t *allowed) {
    for (uint32_t word = 0; word < (n + 31) / 32; word++) {
        const uint32_t bits = allowed[word];
        if (bits == UINT32_MAX) continue;
        for (uint32_t t = word * 32; t < word * 32 + 32 && t < n; t++)
            if (!((bits >> (t & 31)) & 1u)) logits[t] = -INFINITY;
    }
}

/* The token the rule picks from logits[0..n). `scratch` holds 2 n entries. */
int32_t em_pick(const float *logits, uint32_t n, const em_pick_params *params, uint64_t *scratch);

/* ---- Shared pieces (host and device) ---- */

/* The splitmix64 finalizer: a bijective 64-bit mix with good avalanche. */
EM_PICK_FN uint64_t em_pick_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* The 53 random bits of token `index` at draw `counter` of stream `seed`. */
EM_PICK_FN uint64_t em_pick_bits(uint64_t seed, uint64_t counter, uint32_t index) {
    uint64_t stream = em_pick_mix(seed + UINT64_C(0x9E3779B97F4A7C15) * (counter + 1));
    return em_pick_mix(stream ^ (UINT64_C(0xD1B54A32D192ED03) * ((uint64_t)index + 1))) >> 11;
}

/* u = (bits + 1/2) / 2^53: strictly inside (0, 1), so both logarithms of the Gumbel noise are finite. */
EM_PICK_FN double em_pick_uniform(uint64_t bits) { return ((double)bits + 0.5) * 0x1.0p-53; }

/* The Gumbel-max score of a kept token. */
EM_PICK_FN double em_pick_score(float logit, float temperature, uint64_t bits) {
    return (double)logit / (double)temperature - log(-log(em_pick_uniform(bits)));
}

/* False only when the token cannot beat (or tie) `bar`, the score of another token. Its score is
 * l/T - ln(E) with E = -ln(u) >= 1 - u = (m - 1/2) / 2^53 >= 2^(floor(log2 m) - 54), where
 * m = 2^53 - bits; so a gap l/T - bar below (floor(log2 m) - 54) ln 2 rules it out. The gap may be
 * computed in float (l * (1/T) - bar): `slack` (em_pick_slack) covers its rounding, so the test
 * only ever keeps too many. Integer work and a count of leading zeros, no logarithm. */
EM_PICK_FN bool em_pick_may_win(float gap, float slack, uint64_t bits) {
    if (gap < -38.0f - slack) return false; /* 1 - u >= 2^-54 > e^-38 */
    const uint64_t m = UINT64_C(0x20000000000000) - bits;
#ifdef __CUDA_ARCH__
    const int log2_m = 63 - __clzll((long long)m);
#else
    const int log2_m = 63 - __builtin_clzll(m);
#endif
    return gap >= (float)(log2_m - 54) * 0.6931472f - slack;
}

/* The rounding a float gap l * (1/T) - bar can carry, for the tokens near enough to matter
 * (|l/T| <= |bar| + 40): a few float ulps of that size, with room to spare. */
EM_PICK_FN float em_pick_slack(float bar) { return 1e-5f * (fabsf(bar) + 40.0f); }

/* A token's rank as a 64-bit key: the logit's order-preserving bits above, the complemented index
 * below, so a larger key is a larger logit or, for equal logits, a lower index. -0 counts as +0. */
EM_PICK_FN uint64_t em_pick_key(float logit, uint32_t index) {
    if (logit == 0.0f) logit = 0.0f;
#ifdef __CUDA_ARCH__
    uint32_t bits = __float_as_uint(logit);
#else
    uint32_t bits;
    memcpy(&bits, &logit, 4);
#endif
    bits = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
    return ((uint64_t)bits << 32) | (uint32_t)(0xFFFFFFFFu - index);
}

EM_PICK_FN uint32_t em_pick_key_index(uint64_t key) { return 0xFFFFFFFFu - (uint32_t)key; }

/* A kept token's weight for top_p: exp((l - max) / T) in units of 2^-40 (the top token weighs 2^40). */
EM_PICK_FN uint64_t em_pick_mass(float logit, float max, float temperature) {
    double w = exp((double)(logit - max) / (double)temperature);
    return (uint64_t)(w * 0x1.0p40);
}

/* top_p's share of the kept mass: the cut is the shortest prefix whose mass reaches this (at least
 * 1, so the prefix ends on a token that weighs something: the top token at the least). */
EM_PICK_FN uint64_t em_pick_mass_target(uint64_t total, float top_p) {
    uint64_t target = (uint64_t)((double)total * (double)top_p);
    return target ? target : 1;
}

/* A candidate at all: finite, and not below the min_p floor (floor = max + min_p_shift). */
EM_PICK_FN bool em_pick_candidate(float logit, float floor_logit) {
    return logit > -INFINITY && logit < INFINITY && logit >= floor_logit;
}

#endif
