/* The time constrained decoding spends on token masks, without a model (bench/grammar_mask.sh
 * runs it).
 *
 *   grammar_mask VOCAB.gguf GRAMMAR.gbnf SEQS TOKENS ROUNDS SHARE
 *       SEQS parse states of the grammar advance together, a token each per step, as the engine's
 *       constrained rows do: each step takes every sequence's mask (SHARE "on": through one
 *       shared mask cache, as the engine does; "off": each state's own memo only), then feeds it a
 *       token drawn at random among the allowed ones (not an end-of-generation token; a sequence
 *       whose grammar cannot go on starts over). ROUNDS times, each round with new states (and,
 *       with SHARE on, the cache kept: later requests that follow the same grammar). Prints
 *       "masks N mask_us_per_token_per_seq first_round X later_rounds Y": the mask time per token
 *       per sequence of the first round, and the median of the others.
 *
 *   grammar_mask VOCAB.gguf GRAMMAR.gbnf 1 TOKENS ROUNDS pair
 *       The first walks of parse states, by the trie walk and from position tables, side by side
 *       (so that the load of a shared machine weighs on both alike): per round two new states take
 *       the same random tokens; one makes its masks by walking the vocabulary (em_grammar_mask),
 *       the other through a shared cache too small to keep any mask, so that every mask it has not
 *       seen itself is made from the grammar's position tables (kept across rounds). The masks
 *       must be equal. Prints the mask time per token of each, first round (tables being made) and
 *       the median of the later ones (tables known). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t next_random(uint64_t *x) { /* splitmix64 */
    uint64_t z = (*x += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static int fail(const char *what, em_err err) {
    fprintf(stderr, "grammar_mask: %s: %s\n", what, err ? em_err_message(err) : "failed");
    return 1;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The "pair" mode (see the top). */
static int pair_walks(const em_tokenizer *tok, const em_grammar *g, const em_grammar_vocab *v, int tokens, int rounds) {
    const uint32_t n = em_grammar_vocab_size(v);
    const size_t words = ((size_t)n + 31) / 32;
    uint32_t *mask = malloc(words * sizeof *mask), *other = malloc(words * sizeof *other);
    uint32_t *choices = malloc(n * sizeof *choices);
    double *trie_us = malloc((size_t)rounds * sizeof *trie_us), *tables_us = malloc((size_t)rounds * sizeof *tables_us);
    em_grammar_masks *shared;
    em_err err = em_grammar_masks_new(v, 1024, &shared); /* too small for any mask: tables only */
    if (err) return fail("cache", err);
    if (!mask || !other || !choices || !trie_us || !tables_us) return fail("memory", NULL);
    uint64_t random = 1;
    for (int round = 0; round < rounds; round++) {
        em_grammar_state *by_trie, *by_tables;
        if ((err = em_grammar_state_new(g, &by_trie)) || (err = em_grammar_state_new(g, &by_tables)))
            return fail("state", err);
        double trie_s = 0, tables_s = 0;
        int steps = 0;
        for (; steps < tokens; steps++) {
            uint32_t n_allowed, n_other;
            double t0 = now();
            err = em_grammar_mask(by_trie, v, mask, &n_allowed);
            const double t1 = now();
            if (!err) err = em_grammar_mask_shared(by_tables, v, shared, other, &n_other);
            trie_s += t1 - t0;
            tables_s += now() - t1;
            if (err) return fail("mask", err);
            if (n_allowed != n_other || memcmp(mask, other, words * sizeof *mask))
                return fail("a mask from position tables differs from the trie walk's", NULL);
            uint32_t n_choices = 0;
            for (uint32_t id = 0; id < n; id++)
                if (((mask[id >> 5] >> (id & 31)) & 1u) && !em_tokenizer_is_eog(tok, (int32_t)id))
                    choices[n_choices++] = id;
            if (!n_choices) break;
            const int32_t token = (int32_t)choices[next_random(&random) % n_choices];
            em_grammar_accept_token(by_trie, v, token);
            em_grammar_accept_token(by_tables, v, token);
        }
        em_grammar_state_free(by_trie);
        em_grammar_state_free(by_tables);
        trie_us[round] = steps ? trie_s / steps * 1e6 : 0;
        tables_us[round] = steps ? tables_s / steps * 1e6 : 0;
    }
    const double first_trie = trie_us[0], first_tables = tables_us[0];
    qsort(trie_us + 1, (size_t)rounds - 1, sizeof *trie_us, by_value);
    qsort(tables_us + 1, (size_t)rounds - 1, sizeof *tables_us, by_value);
    const int mid = 1 + (rounds - 1) / 2;
    printf("mask_us_per_token first_round trie %.2f tables %.2f later_rounds trie %.2f tables %.2f\n", first_trie,
           first_tables, rounds > 1 ? trie_us[mid] : first_trie, rounds > 1 ? tables_us[mid] : first_tables);
    em_grammar_masks_free(shared);
    free(mask);
    free(other);
    free(choices);
    free(trie_us);
    free(tables_us);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: grammar_mask VOCAB.gguf GRAMMAR.gbnf SEQS TOKENS ROUNDS on|off|pair\n");
        return 1;
    }
    const int seqs = atoi(argv[3]), tokens = atoi(argv[4]), rounds = atoi(argv[5]);
    const bool share = strcmp(argv[6], "on") == 0;
    if (seqs < 1 || tokens < 1 || rounds < 1 || seqs > 1024 || rounds > 1000) return fail("arguments", NULL);
    em_gguf *gguf;
    em_tokenizer *tok;
    em_err err = em_gguf_open(argv[1], &gguf);
    if (err || (err = em_tokenizer_from_gguf(gguf, &tok))) return fail(argv[1], err);
    FILE *f = fopen(argv[2], "rb");
    if (!f) return fail(argv[2], NULL);
    static char text[1 << 16];
    const size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    em_grammar *g;
    em_grammar_vocab *v;
    em_grammar_masks *shared = NULL;
    const uint32_t n = (uint32_t)em_tokenizer_n_vocab(tok);
    if ((err = em_grammar_compile(text, len, &g))) return fail(argv[2], err);
    if ((err = em_grammar_vocab_new(tok, n, NULL, 0, &v))) return fail("vocabulary", err);
    if (!strcmp(argv[6], "pair")) return pair_walks(tok, g, v, tokens, rounds);
    if (share && (err = em_grammar_masks_new(v, (size_t)64 << 20, &shared))) return fail("cache", err);
    uint32_t *mask = malloc((n + 31) / 32 * sizeof *mask), *choices = malloc(n * sizeof *choices);
    em_grammar_state **states = calloc((size_t)seqs, sizeof *states);
    double *per_token = malloc((size_t)rounds * sizeof *per_token);
    if (!mask || !choices || !states || !per_token) return fail("memory", NULL);
    uint64_t random = 1;
    for (int round = 0; round < rounds; round++) {
        for (int s = 0; s < seqs; s++)
            if ((err = em_grammar_state_new(g, &states[s]))) return fail("state", err);
        double mask_s = 0;
        for (int t = 0; t < tokens; t++)
            for (int s = 0; s < seqs; s++) {
                uint32_t n_allowed;
                const double start = now();
                err = em_grammar_mask_shared(states[s], v, shared, mask, &n_allowed);
                mask_s += now() - start;
                if (err) return fail("mask", err);
                uint32_t n_choices = 0;
                for (uint32_t id = 0; id < n; id++)
                    if (((mask[id >> 5] >> (id & 31)) & 1u) && !em_tokenizer_is_eog(tok, (int32_t)id))
                        choices[n_choices++] = id;
                if (!n_choices) { /* finished: a new sequence takes its place */
                    em_grammar_state_free(states[s]);
                    if ((err = em_grammar_state_new(g, &states[s]))) return fail("state", err);
                    continue;
                }
                em_grammar_accept_token(states[s], v, (int32_t)choices[next_random(&random) % n_choices]);
            }
        for (int s = 0; s < seqs; s++) em_grammar_state_free(states[s]);
        per_token[round] = mask_s / ((double)tokens * seqs);
    }
    const double first = per_token[0];
    qsort(per_token + 1, (size_t)rounds - 1, sizeof *per_token, by_value);
    printf("masks %d mask_us_per_token_per_seq first_round %.2f later_rounds %.2f\n", tokens * seqs, first * 1e6,
           rounds > 1 ? per_token[1 + (rounds - 1) / 2] * 1e6 : first * 1e6);
    free(mask);
    free(choices);
    free(states);
    free(per_token);
    em_grammar_masks_free(shared);
    em_grammar_vocab_free(v);
    em_grammar_free(g);
    em_tokenizer_free(tok);
    em_gguf_close(gguf);
    return 0;
}
