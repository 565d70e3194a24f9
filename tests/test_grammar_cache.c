/* The mask cache shared between parse states (em_grammar_masks): over long random walks through
 * several grammars (llama.cpp's example grammars json, arithmetic, list and chess, a repetition
 * count grammar, and one from a JSON Schema), the mask a walker gets through the shared cache
 * equals the mask a fresh parse state computes by walking the vocabulary after the same text.
 * All grammars share one cache, so an entry filed under the wrong grammar would show; walkers
 * with the same seed but their own compilation of the grammar take their masks from the cache;
 * and a small bound makes the cache evict as it goes. A mask the cache does not hold is made
 * from position tables (what each stack's top position accepts whatever lies below it, and the
 * uncertain rest checked against the state): with a bound too small for any mask, every mask of
 * the walk is made that way, and must still equal the fresh walk. Vocabulary: the reference
 * fixtures' llama-spm. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include "vocab_fixture.h"

/* The example grammars of llama.cpp (grammars/json.gbnf, arithmetic.gbnf, list.gbnf, chess.gbnf),
 * written from the GBNF syntax as in test_grammar.c. */
static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char *ARITHMETIC_GBNF = "root  ::= (expr \"=\" ws term \"\\n\")+\n"
                                     "expr  ::= term ([-+*/] term)*\n"
                                     "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
                                     "ident ::= [a-z] [a-z0-9_]* ws\n"
                                     "num   ::= [0-9]+ ws\n"
                                     "ws    ::= [ \\t\\n]*\n";

static const char *LIST_GBNF = "root ::= item+\n"
                               "item ::= \"- \" [^\\r\\n\\x0b\\x0c\\x85\\u2028\\u2029]+ \"\\n\"\n";

static const char *CHESS_GBNF = "root ::= \"1. \" move \" \" move \"\\n\" ([1-9] [0-9]? \". \" move \" \" move \"\\n\")+\n"
                                "move ::= (pawn | nonpawn | castle) [+#]?\n"
                                "pawn ::= [a-h] [1-8] (\"=\" [NBKQR])?\n"
                                "nonpawn ::= [NBKQR] [a-h]? [1-8]? \"x\"? [a-h] [1-8]\n"
                                "castle ::= \"O-O\" \"-O\"?\n";

/* Repetition counts make a parse state per count (the case the cache is for). */
static const char *ARRAY_GBNF = "root ::= \"[\" ws item (\",\" ws item)* \"]\"\n"
                                "item ::= \"{\" ws \"\\\"id\\\": \" [0-9]{1,6} \", \\\"name\\\": \\\"\" [a-z ]{1,24} \"\\\"\" ws \"}\"\n"
                                "ws ::= [ \\n]?\n";

static const char *SCHEMA = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
                            "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\"]}},"
                            "\"n\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":300}},\"required\":[\"name\",\"n\"]}";


static uint64_t next_random(uint64_t *x) { /* splitmix64 */
    uint64_t z = (*x += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* One random generation: its own compilation of the grammar, its state (masks through the
 * shared cache), the text so far, and its random sequence. */
typedef struct walker {
    const char *name;
    em_grammar *grammar;
    em_grammar_state *state;
    char *text;
    size_t len, cap;
    uint64_t random;
    bool done;
} walker;

static void walker_start(walker *w, const char *name, const char *gbnf, uint64_t seed) {
    memset(w, 0, sizeof *w);
    w->name = name;
    em_err err = em_grammar_compile(gbnf, strlen(gbnf), &w->grammar);
    if (err) fail_msg("%s: %s", name, em_err_message(err));
    assert_null(em_grammar_state_new(w->grammar, &w->state));
    w->random = seed;
}

static void walker_free(walker *w) {
    em_grammar_state_free(w->state);
    em_grammar_free(w->grammar);
    free(w->text);
}

/* One token: the shared-cache mask against a fresh state's, then a random allowed token (not an
 * end-of-generation one) fed to the walker. */
static void walker_step(walker *w, const em_tokenizer *t, const em_grammar_vocab *v, em_grammar_masks *shared,
                        uint32_t *mask, uint32_t *fresh_mask, uint32_t *choices, int step) {
    const uint32_t n = em_grammar_vocab_size(v), words = (n + 31) / 32;
    uint32_t n_allowed, n_fresh;
    assert_null(em_grammar_mask_shared(w->state, v, shared, mask, &n_allowed));
    em_grammar_state *fresh;
    assert_null(em_grammar_state_new(w->grammar, &fresh));
    assert_true(em_grammar_accept_bytes(fresh, w->text, w->len));
    assert_null(em_grammar_mask(fresh, v, fresh_mask, &n_fresh));
    em_grammar_state_free(fresh);
    if (n_allowed != n_fresh || memcmp(mask, fresh_mask, words * sizeof *mask))
        fail_msg("%s, step %d, after '%.*s': the shared mask allows %u tokens, a fresh one %u", w->name, step,
                 (int)w->len, w->text ? w->text : "", n_allowed, n_fresh);
    uint32_t n_choices = 0;
    for (uint32_t id = 0; id < n; id++)
        if (((mask[id >> 5] >> (id & 31)) & 1u) && !em_tokenizer_is_eog(t, (int32_t)id)) choices[n_choices++] = id;
    if (!n_choices) {
        w->done = true;
        return;
    }
    const uint32_t token = choices[next_random(&w->random) % n_choices];
    const char *piece;
    const size_t len = em_token_to_piece(t, (int32_t)token, false, &piece);
    assert_true(em_grammar_accept_token(w->state, v, (int32_t)token));
    if (w->len + len + 1 > w->cap) {
        w->cap = (w->len + len + 1) * 2;
        w->text = realloc(w->text, w->cap);
        assert_non_null(w->text);
    }
    memcpy(w->text + w->len, piece, len);
    w->len += len;
    w->done = !em_grammar_can_continue(w->state);
}

/* Walkers over every grammar, interleaved token by token, all through one cache of `max_bytes`. */
static void walk_all(size_t max_bytes, int steps) {
    em_tokenizer *t = load_tokenizer("ggml-vocab-llama-spm.gguf");
    const uint32_t n = (uint32_t)em_tokenizer_n_vocab(t);
    em_grammar_vocab *v;
    assert_null(em_grammar_vocab_new(t, n, NULL, 0, &v));
    em_grammar_masks *shared;
    assert_null(em_grammar_masks_new(v, max_bytes, &shared));
    char *schema_gbnf;
    assert_null(em_grammar_from_json_schema(SCHEMA, strlen(SCHEMA), &schema_gbnf));
    const char *names[] = {"json", "arithmetic", "list", "chess", "array", "schema"};
    const char *grammars[] = {JSON_GBNF, ARITHMETIC_GBNF, LIST_GBNF, CHESS_GBNF, ARRAY_GBNF, schema_gbnf};
    enum { N_GRAMMARS = 6, PER_GRAMMAR = 3 };
    walker walkers[N_GRAMMARS * PER_GRAMMAR];
    for (int g = 0; g < N_GRAMMARS; g++)
        for (int k = 0; k < PER_GRAMMAR; k++) /* walkers 0 and 1 draw the same tokens: 1 reads what 0 filed */
            walker_start(&walkers[g * PER_GRAMMAR + k], names[g], grammars[g], (uint64_t)(g + 1) * 1000 + (k == 2));
    uint32_t *mask = malloc((n + 31) / 32 * sizeof *mask), *fresh = malloc((n + 31) / 32 * sizeof *fresh);
    uint32_t *choices = malloc(n * sizeof *choices);
    assert_true(mask && fresh && choices);
    for (int step = 0; step < steps; step++)
        for (int i = 0; i < N_GRAMMARS * PER_GRAMMAR; i++)
            if (!walkers[i].done) walker_step(&walkers[i], t, v, shared, mask, fresh, choices, step);
    for (int i = 0; i < N_GRAMMARS * PER_GRAMMAR; i++) walker_free(&walkers[i]);
    free(mask);
    free(fresh);
    free(choices);
    free(schema_gbnf);
    em_grammar_masks_free(shared);
    em_grammar_vocab_free(v);
    em_tokenizer_free(t);
}

static void test_shared_masks_equal_fresh(void **state) {
    (void)state;
    walk_all((size_t)64 << 20, 60);
}

/* Room for a few dozen masks of this vocabulary: most are evicted again before the walk ends. */
static void test_shared_masks_under_eviction(void **state) {
    (void)state;
    walk_all((size_t)160 << 10, 40);
}

/* No mask fits: each one is made from the position tables (kept with the grammar). */
static void test_masks_from_position_tables(void **state) {
    (void)state;
    walk_all(1024, 60);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_masks_equal_fresh),
        cmocka_unit_test(test_shared_masks_under_eviction),
        cmocka_unit_test(test_masks_from_position_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
