/* The KV block pool (engine.h): a free list and reference counts. */
#include "engine.h"

#include <stdlib.h>

em_err em_kv_pool_init(em_kv_pool *pool, uint32_t n_blocks, uint32_t block_tokens) {
    if (n_blocks == 0 || block_tokens == 0)
        return em_errorf(EM_ERR_INVALID, "KV pool: %u blocks of %u tokens", n_blocks, block_tokens);
    pool->n_blocks = n_blocks;
    pool->block_tokens = block_tokens;
    pool->refcount = calloc(n_blocks, sizeof *pool->refcount);
    pool->free_list = malloc(n_blocks * sizeof *pool->free_list);
    if (!pool->refcount || !pool->free_list) {
        em_kv_pool_free(pool);
        return em_errorf(EM_ERR_NOMEM, "KV pool: no memory for %u blocks", n_blocks);
    }
    /* Hand out low block numbers first (stack order). */
    for (uint32_t i = 0; i < n_blocks; i++) pool->free_list[i] = n_blocks - 1 - i;
    pool->n_free = n_blocks;
    return NULL;
}

void em_kv_pool_free(em_kv_pool *pool) {
    free(pool->refcount);
    free(pool->free_list);
    pool->refcount = NULL;
    pool->free_list = NULL;
    pool->n_free = pool->n_blocks = 0;
}

bool em_kv_alloc(em_kv_pool *pool, uint32_t *block) {
    if (pool->n_free == 0) return false;
    *block = pool->free_list[--pool->n_free];
    pool->refcount[*block] = 1;
    return true;
}

void em_kv_retain(em_kv_pool *pool, uint32_t block) { pool->refcount[block]++; }

void em_kv_release(em_kv_pool *pool, uint32_t block) {
    if (pool->refcount[block] == 0) return; /* a double release is a bug; never corrupt the free list */
    if (--pool->refcount[block] == 0) pool->free_list[pool->n_free++] = block;
}
