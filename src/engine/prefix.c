/*
 * The prefix cache (engine.h): a radix tree whose nodes are KV blocks.
 *
 * Why a node per block: KV memory is paged in blocks, so a block is the unit that can be shared
 * by reference. Children of a node are distinguished by their tokens; full children (block_tokens
 * tokens) continue the tree, partial children (the tail of a finished sequence) are leaves. A
 * lookup follows full children while a whole block of tokens matches, then looks among the
 * children of the last node for the longest common prefix with the rest: those rows are copied,
 * which makes reuse exact to the token rather than to the block.
 *
 * Eviction drops leaves that only the cache references, least recently used first, through a
 * binary heap on last_used; a parent whose last child goes becomes a candidate in turn.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

void em_prefix_init(em_prefix_cache *cache, em_kv_pool *pool) {
    memset(cache, 0, sizeof *cache);
    cache->pool = pool;
    cache->root.block = EM_PREFIX_NO_BLOCK;
}

static uint32_t common_prefix(const int32_t *a, uint32_t a_len, const int32_t *b, uint32_t b_len) {
    uint32_t n = a_len < b_len ? a_len : b_len, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static em_prefix_node *find_full_child(const em_prefix_node *node, const int32_t *tokens, uint32_t block_tokens) {
    for (em_prefix_node *c = node->first_child; c; c = c->next_sibling)
        if (c->n_tokens == block_tokens && !memcmp(c->tokens, tokens, block_tokens * sizeof *tokens)) return c;
    return NULL;
}

void em_prefix_match(em_prefix_cache *cache, const int32_t *tokens, uint32_t n, uint32_t max_tokens,
                     uint32_t *blocks, em_prefix_hit *hit) {
    const uint32_t bt = cache->pool->block_tokens;
    memset(hit, 0, sizeof *hit);
    hit->copy_block = EM_PREFIX_NO_BLOCK;
    if (max_tokens > n) max_tokens = n;
    cache->lookups++;
    uint64_t now = ++cache->clock;
    em_prefix_node *node = &cache->root;
    uint32_t matched = 0;
    while (matched + bt <= max_tokens) {
        em_prefix_node *child = find_full_child(node, tokens + matched, bt);
        if (!child) break;
        child->last_used = now;
        em_kv_retain(cache->pool, child->block);
        blocks[hit->n_blocks++] = child->block;
        matched += bt;
        node = child;
    }
    /* The match may go on inside one more block: the child sharing the longest prefix. */
    uint32_t rest = max_tokens - matched < bt ? max_tokens - matched : bt;
    em_prefix_node *best = NULL;
    uint32_t best_rows = 0;
    for (em_prefix_node *c = node->first_child; c && rest; c = c->next_sibling) {
        uint32_t rows = common_prefix(c->tokens, c->n_tokens, tokens + matched, rest);
        if (rows > best_rows) best = c, best_rows = rows;
    }
    if (best) {
        best->last_used = now;
        em_kv_retain(cache->pool, best->block);
        hit->copy_block = best->block;
        hit->copy_rows = best_rows;
        matched += best_rows;
    }
    hit->n_tokens = matched;
    if (matched) {
        cache->hits++;
        cache->tokens_reused += matched;
    }
}

static em_prefix_node *new_node(em_prefix_cache *cache, em_prefix_node *parent, const int32_t *tokens,
                                uint32_t n_tokens, uint32_t block) {
    em_prefix_node *node = calloc(1, sizeof *node);
    int32_t *copy = malloc(cache->pool->block_tokens * sizeof *copy);
    if (!node || !copy) {
        free(node);
        free(copy);
        return NULL;
    }
    memcpy(copy, tokens, n_tokens * sizeof *tokens);
    node->tokens = copy;
    node->n_tokens = n_tokens;
    node->block = block;
    node->parent = parent;
    node->next_sibling = parent->first_child;
    parent->first_child = node;
    em_kv_retain(cache->pool, block);
    cache->n_nodes++;
    return node;
}

/* Unlinks a leaf, drops the cache's reference on its block, frees it. */
static void remove_leaf(em_prefix_cache *cache, em_prefix_node *leaf) {
    em_prefix_node **link = &leaf->parent->first_child;
    while (*link != leaf) link = &(*link)->next_sibling;
    *link = leaf->next_sibling;
    em_kv_release(cache->pool, leaf->block);
    cache->tokens_evicted += leaf->n_tokens;
    cache->n_nodes--;
    free(leaf->tokens);
    free(leaf);
}

/* A partial leaf whose tokens begin a full sibling adds nothing; drop it if no sequence uses it. */
static void drop_redundant_partials(em_prefix_cache *cache, em_prefix_node *full) {
    em_prefix_node *c = full->parent->first_child;
    while (c) {
        em_prefix_node *next = c->next_sibling;
        if (c != full && c->n_tokens < full->n_tokens && !c->first_child &&
            common_prefix(c->tokens, c->n_tokens, full->tokens, full->n_tokens) == c->n_tokens &&
            em_kv_refcount(cache->pool, c->block) == 1) {
            uint32_t rows = c->n_tokens;
            remove_leaf(cache, c);
            cache->tokens_evicted -= rows; /* not an eviction: the rows live on in `full` */
        }
        c = next;
    }
}

em_err em_prefix_insert(em_prefix_cache *cache, const int32_t *tokens, uint32_t n, const uint32_t *blocks) {
    const uint32_t bt = cache->pool->block_tokens;
    uint64_t now = ++cache->clock;
    em_prefix_node *node = &cache->root;
    for (uint32_t start = 0, i = 0; start < n; start += bt, i++) {
        uint32_t len = n - start < bt ? n - start : bt;
        const int32_t *chunk = tokens + start;
        if (len == bt) {
            em_prefix_node *child = find_full_child(node, chunk, bt);
            if (!child) {
                child = new_node(cache, node, chunk, bt, blocks[i]);
                if (!child) return em_errorf(EM_ERR_NOMEM, "prefix cache: no memory for a node");
                drop_redundant_partials(cache, child);
            }
            child->last_used = now;
            node = child;
            continue;
        }
        /* The tail: cache it unless a child already starts with these tokens. */
        for (em_prefix_node *c = node->first_child; c; c = c->next_sibling)
            if (common_prefix(c->tokens, c->n_tokens, chunk, len) == len) {
                c->last_used = now;
                return NULL;
            }
        em_prefix_node *tail = new_node(cache, node, chunk, len, blocks[i]);
        if (!tail) return em_errorf(EM_ERR_NOMEM, "prefix cache: no memory for a node");
        tail->last_used = now;
    }
    return NULL;
}

/* ---- Eviction: a min-heap of evictable leaves by last_used ---- */

static bool evictable(const em_prefix_cache *cache, const em_prefix_node *node) {
    return node != &cache->root && !node->first_child && em_kv_refcount(cache->pool, node->block) == 1;
}

/* Items are node pointers; least recently used first. */
static bool used_before(const void *a, const void *b) {
    return (*(em_prefix_node *const *)a)->last_used < (*(em_prefix_node *const *)b)->last_used;
}

uint32_t em_prefix_evict(em_prefix_cache *cache, uint32_t want) {
    if (want == 0 || cache->n_nodes == 0) return 0;
    em_heap heap = {0};
    /* Iterative depth-first walk over the tree (it can be thousands of levels deep). */
    em_prefix_node *node = cache->root.first_child;
    while (node) {
        if (evictable(cache, node) && !em_heap_push(&heap, &node, sizeof node, used_before)) break;
        if (node->first_child) {
            node = node->first_child;
            continue;
        }
        while (node && !node->next_sibling) node = node->parent == &cache->root ? NULL : node->parent;
        if (node) node = node->next_sibling;
    }
    uint32_t freed = 0;
    while (freed < want && heap.n) {
        em_prefix_node *leaf;
        em_heap_pop(&heap, &leaf, sizeof leaf, used_before);
        em_prefix_node *parent = leaf->parent;
        remove_leaf(cache, leaf);
        freed++;
        if (evictable(cache, parent) && !em_heap_push(&heap, &parent, sizeof parent, used_before)) break;
    }
    em_heap_free(&heap);
    return freed;
}

void em_prefix_free(em_prefix_cache *cache) {
    /* Remove leaves bottom-up until the tree is empty. */
    em_prefix_node *node = cache->root.first_child;
    while (node) {
        while (node->first_child) node = node->first_child;
        em_prefix_node *parent = node->parent;
        remove_leaf(cache, node);
        node = parent == &cache->root ? cache->root.first_child : parent;
    }
}
