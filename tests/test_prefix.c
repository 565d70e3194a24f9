/* The KV block pool and the prefix cache: sharing by reference, token-exact partial matches,
 * interleaved conversations, LRU eviction that never touches blocks in use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

#define BT 16

static void test_pool(void **state) {
    (void)state;
    em_kv_pool pool;
    assert_null(em_kv_pool_init(&pool, 4, BT));
    uint32_t a, b, c, d, e;
    assert_true(em_kv_alloc(&pool, &a) && em_kv_alloc(&pool, &b) && em_kv_alloc(&pool, &c) && em_kv_alloc(&pool, &d));
    assert_false(em_kv_alloc(&pool, &e));
    assert_int_equal(a, 0);
    assert_int_equal(d, 3);
    em_kv_retain(&pool, b);
    em_kv_release(&pool, b);
    assert_int_equal(em_kv_free_count(&pool), 0);
    em_kv_release(&pool, b);
    assert_int_equal(em_kv_free_count(&pool), 1);
    em_kv_release(&pool, b); /* a stray release must not free it twice */
    assert_int_equal(em_kv_free_count(&pool), 1);
    assert_true(em_kv_alloc(&pool, &e));
    assert_int_equal(e, b);
    em_kv_pool_free(&pool);
    em_err err = em_kv_pool_init(&pool, 0, BT);
    assert_int_equal(em_err_code_of(err), EM_ERR_INVALID);
    em_err_free(err);
}

/* A simulated sequence: allocates blocks for n tokens, as the scheduler does. */
typedef struct sequence {
    uint32_t blocks[4096];
    uint32_t n_blocks;
} sequence;

static void seq_alloc(em_kv_pool *pool, sequence *s, uint32_t n_tokens) {
    while (s->n_blocks * BT < n_tokens) assert_true(em_kv_alloc(pool, &s->blocks[s->n_blocks++]));
}

static void seq_release(em_kv_pool *pool, sequence *s) {
    for (uint32_t i = 0; i < s->n_blocks; i++) em_kv_release(pool, s->blocks[i]);
    s->n_blocks = 0;
}

static void fill_tokens(int32_t *t, uint32_t n, int32_t base) {
    for (uint32_t i = 0; i < n; i++) t[i] = base + (int32_t)(i * 7 % 1000);
}

static void test_exact_reuse(void **state) {
    (void)state;
    em_kv_pool pool;
    assert_null(em_kv_pool_init(&pool, 64, BT));
    em_prefix_cache cache;
    em_prefix_init(&cache, &pool);
    int32_t tokens[200];
    fill_tokens(tokens, 200, 1);
    /* Sequence A: 37 tokens computed (2 full blocks + 5 rows). */
    sequence a = {0};
    seq_alloc(&pool, &a, 37);
    assert_null(em_prefix_insert(&cache, tokens, 37, a.blocks));
    assert_int_equal(em_prefix_cached_blocks(&cache), 3);
    seq_release(&pool, &a);
    assert_int_equal(em_kv_free_count(&pool), 64 - 3); /* the cache keeps all three */

    /* B continues A: shares both full blocks, copies 5 rows of the third. */
    uint32_t blocks[16];
    em_prefix_hit hit;
    em_prefix_match(&cache, tokens, 100, 99, blocks, &hit);
    assert_int_equal(hit.n_tokens, 37);
    assert_int_equal(hit.n_blocks, 2);
    assert_int_equal(hit.copy_rows, 5);
    assert_int_not_equal(hit.copy_block, EM_PREFIX_NO_BLOCK);
    assert_int_equal(em_kv_refcount(&pool, blocks[0]), 2);
    em_kv_release(&pool, hit.copy_block);
    for (uint32_t i = 0; i < hit.n_blocks; i++) em_kv_release(&pool, blocks[i]);

    /* A prompt diverging inside block 1 at token 20: one block shared, 4 rows copied. */
    int32_t other[64];
    memcpy(other, tokens, sizeof other);
    other[20] = -5;
    em_prefix_match(&cache, other, 64, 63, blocks, &hit);
    assert_int_equal(hit.n_tokens, 20);
    assert_int_equal(hit.n_blocks, 1);
    assert_int_equal(hit.copy_rows, 4);
    em_kv_release(&pool, hit.copy_block);
    em_kv_release(&pool, blocks[0]);

    /* max_tokens caps the match (a prompt identical to the cache must still prefill a token). */
    em_prefix_match(&cache, tokens, 37, 36, blocks, &hit);
    assert_int_equal(hit.n_tokens, 36);
    assert_int_equal(hit.copy_rows, 4);
    em_kv_release(&pool, hit.copy_block);
    for (uint32_t i = 0; i < hit.n_blocks; i++) em_kv_release(&pool, blocks[i]);

    /* Nothing in common. */
    int32_t fresh[20];
    fill_tokens(fresh, 20, 5000);
    em_prefix_match(&cache, fresh, 20, 19, blocks, &hit);
    assert_int_equal(hit.n_tokens, 0);
    assert_int_equal(hit.copy_block, EM_PREFIX_NO_BLOCK);
    assert_int_equal(cache.lookups, 4);
    assert_int_equal(cache.hits, 3);
    assert_int_equal(cache.tokens_reused, 37 + 20 + 36);
    em_prefix_free(&cache);
    assert_int_equal(em_kv_free_count(&pool), 64);
    em_kv_pool_free(&pool);
}

static void test_no_duplicates_and_redundant_tails(void **state) {
    (void)state;
    em_kv_pool pool;
    assert_null(em_kv_pool_init(&pool, 64, BT));
    em_prefix_cache cache;
    em_prefix_init(&cache, &pool);
    int32_t tokens[64];
    fill_tokens(tokens, 64, 1);
    sequence a = {0}, b = {0};
    seq_alloc(&pool, &a, 20); /* 1 full + 4-row tail */
    assert_null(em_prefix_insert(&cache, tokens, 20, a.blocks));
    seq_release(&pool, &a);
    assert_int_equal(em_prefix_cached_blocks(&cache), 2);
    /* The same tokens again in other blocks: nothing new is cached. */
    seq_alloc(&pool, &b, 20);
    assert_null(em_prefix_insert(&cache, tokens, 20, b.blocks));
    seq_release(&pool, &b);
    assert_int_equal(em_prefix_cached_blocks(&cache), 2);
    /* A longer run makes the 4-row tail redundant: it is replaced by the full block. */
    seq_alloc(&pool, &b, 40);
    assert_null(em_prefix_insert(&cache, tokens, 40, b.blocks));
    seq_release(&pool, &b);
    assert_int_equal(em_prefix_cached_blocks(&cache), 3);
    assert_int_equal(em_kv_free_count(&pool), 64 - 3);
    /* A shorter tail of a cached block is not added. */
    seq_alloc(&pool, &b, 10);
    assert_null(em_prefix_insert(&cache, tokens, 10, b.blocks));
    seq_release(&pool, &b);
    assert_int_equal(em_prefix_cached_blocks(&cache), 3);
    em_prefix_free(&cache);
    em_kv_pool_free(&pool);
}

/* The benchmark's pattern at test size: A → A' (A + answer + more) → B → A''. */
static void test_interleaved_conversations(void **state) {
    (void)state;
    em_kv_pool pool;
    assert_null(em_kv_pool_init(&pool, 2048, BT));
    em_prefix_cache cache;
    em_prefix_init(&cache, &pool);
    static int32_t conv_a[9000], conv_b[9000];
    fill_tokens(conv_a, 9000, 1);
    fill_tokens(conv_b, 9000, 3000);
    static uint32_t blocks[1024];
    uint32_t lengths[3] = {8022, 8022 + 100 + 40, 8022 + 100 + 40 + 90 + 40};
    int32_t *order[4] = {conv_a, conv_a, conv_b, conv_a};
    uint32_t order_len[4] = {lengths[0], lengths[1], lengths[0], lengths[2]};
    uint32_t expect_reuse[4] = {0, lengths[0] + 100 - 1, 0, lengths[1] + 90 - 1};
    for (int r = 0; r < 4; r++) {
        int32_t *tokens = order[r];
        uint32_t n = order_len[r], generated = r == 1 ? 90 : 100;
        em_prefix_hit hit;
        em_prefix_match(&cache, tokens, n, n - 1, blocks, &hit);
        assert_int_equal(hit.n_tokens, expect_reuse[r]);
        sequence s = {0};
        memcpy(s.blocks, blocks, hit.n_blocks * sizeof *blocks);
        s.n_blocks = hit.n_blocks;
        if (hit.copy_block != EM_PREFIX_NO_BLOCK) em_kv_release(&pool, hit.copy_block); /* after the copy */
        /* Prompt + answer: all but the last sampled token have KV. */
        seq_alloc(&pool, &s, n + generated - 1);
        assert_null(em_prefix_insert(&cache, tokens, n + generated - 1, s.blocks));
        seq_release(&pool, &s);
    }
    em_prefix_free(&cache);
    assert_int_equal(em_kv_free_count(&pool), 2048);
    em_kv_pool_free(&pool);
}

static void test_eviction_lru_and_in_use(void **state) {
    (void)state;
    em_kv_pool pool;
    assert_null(em_kv_pool_init(&pool, 16, BT));
    em_prefix_cache cache;
    em_prefix_init(&cache, &pool);
    int32_t t1[48], t2[48], t3[48];
    fill_tokens(t1, 48, 1);
    fill_tokens(t2, 48, 2000);
    fill_tokens(t3, 48, 4000);
    sequence s = {0};
    seq_alloc(&pool, &s, 48);
    assert_null(em_prefix_insert(&cache, t1, 48, s.blocks));
    seq_release(&pool, &s);
    seq_alloc(&pool, &s, 48);
    assert_null(em_prefix_insert(&cache, t2, 48, s.blocks));
    seq_release(&pool, &s);
    seq_alloc(&pool, &s, 48);
    assert_null(em_prefix_insert(&cache, t3, 48, s.blocks));
    seq_release(&pool, &s);
    assert_int_equal(em_kv_free_count(&pool), 16 - 9);
    /* t1 is used again (most recent) and stays in use by a running sequence. */
    uint32_t blocks[3];
    em_prefix_hit hit;
    em_prefix_match(&cache, t1, 48, 47, blocks, &hit);
    assert_int_equal(hit.n_blocks, 2);
    assert_int_equal(hit.copy_rows, 15);
    uint32_t hit_t1_copy = hit.copy_block;
    /* Evicting 3 takes t2 (least recently used) leaf-first. */
    assert_int_equal(em_prefix_evict(&cache, 3), 3);
    em_prefix_match(&cache, t2, 48, 47, blocks + 2, &hit);
    assert_int_equal(hit.n_tokens, 0);
    /* Evict everything possible: only t3 goes. t1's two full blocks are in use by the running
     * sequence, and its third block is referenced as the copy source of that match. */
    assert_int_equal(em_prefix_evict(&cache, 100), 3);
    assert_int_equal(em_prefix_cached_blocks(&cache), 3);
    /* The sequence finishes (its references go) and the copy is done: now all of t1 can go. */
    em_kv_release(&pool, blocks[0]);
    em_kv_release(&pool, blocks[1]);
    em_kv_release(&pool, hit_t1_copy);
    assert_int_equal(em_prefix_evict(&cache, 100), 3);
    assert_int_equal(em_kv_free_count(&pool), 16);
    assert_int_equal(cache.tokens_evicted, 48 * 3);
    em_prefix_free(&cache);
    em_kv_pool_free(&pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_exact_reuse),
        cmocka_unit_test(test_no_duplicates_and_redundant_tails),
        cmocka_unit_test(test_interleaved_conversations),
        cmocka_unit_test(test_eviction_lru_and_in_use),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
