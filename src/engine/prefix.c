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
 * Eviction takes leaves that only the cache references, least recently used first, through a
 * binary heap on last_used; a parent whose last child goes becomes a candidate in turn. Without
 * tiers an evicted node is dropped. With tiers (tiers.c) it moves down a tier and stays in the
 * tree, and "leaf" means a leaf of its tier: a node none of whose children is in its tier (a
 * child is never in a higher tier than its parent). Each lower tier over its bound then gives up
 * its own leaves the same way, RAM to disk, disk to nothing; a match restores the nodes of its
 * path that sit in a lower tier, top down.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

void em_prefix_init(em_prefix_cache *cache, em_kv_pool *pool) {
    memset(cache, 0, sizeof *cache);
    cache->pool = pool;
    cache->root.block = EM_PREFIX_NO_BLOCK; /* its key is all zero */
}

/* The next node after `node` in a depth-first walk of the tree (NULL at the end); iterative, as the
 * tree can be thousands of levels deep. */
static em_prefix_node *walk_next(em_prefix_cache *cache, em_prefix_node *node) {
    if (node->first_child) return node->first_child;
    while (node != &cache->root && !node->next_sibling) node = node->parent;
    return node == &cache->root ? NULL : node->next_sibling;
}

static void unlink_node(em_prefix_node *node) {
    em_prefix_node **link = &node->parent->first_child;
    while (*link != node) link = &(*link)->next_sibling;
    *link = node->next_sibling;
}

/* Frees a node whose children are gone: its block reference or its lower copy (`drop`: the copy
 * is deleted, a disk file too; else a file stays, as at shutdown). */
static void free_node(em_prefix_cache *cache, em_prefix_node *node, bool drop, bool evicted) {
    if (node->tier == EM_TIER_DEVICE) {
        em_kv_release(cache->pool, node->block);
        cache->n_nodes--;
    } else if (drop) {
        em_tiers_forget(cache->tiers, node, evicted);
    } else {
        free(node->host);
    }
    free(node->tokens);
    free(node);
}

/* Drops a node and everything below it from the cache, deepest first. */
static void drop_subtree(em_prefix_cache *cache, em_prefix_node *top, bool evicted) {
    em_prefix_node *node = top;
    for (;;) {
        while (node->first_child) node = node->first_child;
        em_prefix_node *parent = node->parent;
        unlink_node(node);
        cache->tokens_evicted += node->n_tokens;
        const bool last = node == top;
        free_node(cache, node, true, evicted);
        if (last) return;
        node = parent;
    }
}

/* Brings a node of a lower tier back into a block of the pool (evicting others for it if needed).
 * False when no block can be had or its copy is unreadable (then it is dropped, with what hangs
 * below it). */
static bool restore(em_prefix_cache *cache, em_prefix_node *node, uint32_t rows, em_prefix_hit *hit) {
    uint32_t block;
    node->pinned = true;
    bool got = em_kv_alloc(cache->pool, &block) || (em_prefix_evict(cache, 1) && em_kv_alloc(cache->pool, &block));
    node->pinned = false;
    if (!got) return false;
    const em_tier from = (em_tier)node->tier;
    double ms = 0;
    em_err err = em_tiers_load(cache->tiers, node, block, &ms);
    if (err) {
        em_log(EM_LOG_WARN, "prefix cache: %s tier copy dropped: %s", from == EM_TIER_RAM ? "RAM" : "disk",
               em_err_message(err));
        em_err_free(err);
        em_kv_release(cache->pool, block);
        drop_subtree(cache, node, false);
        return false;
    }
    cache->n_nodes++;
    if (from == EM_TIER_RAM) hit->ram_tokens += rows;
    else hit->disk_tokens += rows;
    hit->restore_ms += ms;
    return true;
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
        if (!child || (child->tier != EM_TIER_DEVICE && !restore(cache, child, bt, hit))) break;
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
    if (best && best->tier != EM_TIER_DEVICE && !restore(cache, best, best_rows, hit)) best = NULL;
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
    node->tier = EM_TIER_DEVICE;
    if (cache->tiers) em_tiers_key(node);
    em_kv_retain(cache->pool, block);
    cache->n_nodes++;
    return node;
}

/* A node of a lower tier met again by an insert: it takes the sequence's block, which holds the
 * same rows, and its lower copy goes. */
static void adopt(em_prefix_cache *cache, em_prefix_node *node, uint32_t block) {
    em_tiers_forget(cache->tiers, node, false);
    node->tier = EM_TIER_DEVICE;
    node->block = block;
    em_kv_retain(cache->pool, block);
    cache->n_nodes++;
}

/* A partial leaf whose tokens begin a full sibling adds nothing; drop it if no sequence uses it. */
static void drop_redundant_partials(em_prefix_cache *cache, em_prefix_node *full) {
    em_prefix_node *c = full->parent->first_child;
    while (c) {
        em_prefix_node *next = c->next_sibling;
        if (c != full && c->n_tokens < full->n_tokens && !c->first_child && !c->pinned &&
            common_prefix(c->tokens, c->n_tokens, full->tokens, full->n_tokens) == c->n_tokens &&
            (c->tier != EM_TIER_DEVICE || em_kv_refcount(cache->pool, c->block) == 1)) {
            uint32_t rows = c->n_tokens;
            drop_subtree(cache, c, false);
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
            } else if (child->tier != EM_TIER_DEVICE) {
                adopt(cache, child, blocks[i]);
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

/* ---- Eviction: a min-heap of each tier's leaves by last_used ---- */

/* A node that may leave `tier` now: in it, not being restored, none of its children in it, and on
 * the device referenced by the cache alone. */
static bool leaf_of(const em_prefix_cache *cache, const em_prefix_node *node, em_tier tier) {
    if (node == &cache->root || node->tier != tier || node->pinned) return false;
    if (tier == EM_TIER_DEVICE && em_kv_refcount(cache->pool, node->block) != 1) return false;
    for (const em_prefix_node *c = node->first_child; c; c = c->next_sibling)
        if (c->tier == tier) return false;
    return true;
}

/* Items are node pointers; least recently used first. */
static bool used_before(const void *a, const void *b) {
    return (*(em_prefix_node *const *)a)->last_used < (*(em_prefix_node *const *)b)->last_used;
}

static bool push_leaves(em_prefix_cache *cache, em_heap *heap, em_tier tier) {
    for (em_prefix_node *node = walk_next(cache, &cache->root); node; node = walk_next(cache, node))
        if (leaf_of(cache, node, tier) && !em_heap_push(heap, &node, sizeof node, used_before)) return false;
    return true;
}

static void trim_tier(em_prefix_cache *cache, em_tier tier, uint64_t incoming, bool all);

/* Moves a node one tier down, after making room there (so no tier ever holds more than its
 * bound), or drops it, with what hangs below it, where there is no room. */
static void move_down(em_prefix_cache *cache, em_prefix_node *node) {
    const bool on_device = node->tier == EM_TIER_DEVICE;
    em_tier below;
    uint64_t bytes = 0;
    bool room = em_tiers_below(cache->tiers, node, &below, &bytes);
    if (room && em_tiers_over(cache->tiers, below, bytes)) {
        node->pinned = true; /* never taken for the room it waits for */
        trim_tier(cache, below, bytes, false);
        node->pinned = false;
        room = !em_tiers_over(cache->tiers, below, bytes);
    }
    if (!room || !em_tiers_to_lower(cache->tiers, cache->pool, node)) drop_subtree(cache, node, true);
    else if (on_device) cache->n_nodes--; /* it holds no block now */
}

/* Gives up a lower tier's least recently used leaves until `incoming` more bytes fit (`all`:
 * every one of them, into the tier below). */
static void trim_tier(em_prefix_cache *cache, em_tier tier, uint64_t incoming, bool all) {
    em_kv_tiers *t = cache->tiers;
    if (!t || !(all || em_tiers_over(t, tier, incoming))) return;
    em_heap heap = {0};
    push_leaves(cache, &heap, tier);
    while (heap.n && (all || em_tiers_over(t, tier, incoming))) {
        em_prefix_node *leaf;
        em_heap_pop(&heap, &leaf, sizeof leaf, used_before);
        em_prefix_node *parent = leaf->parent;
        if (tier == EM_TIER_DISK) drop_subtree(cache, leaf, true);
        else move_down(cache, leaf);
        if (leaf_of(cache, parent, tier) && !em_heap_push(&heap, &parent, sizeof parent, used_before)) break;
    }
    em_heap_free(&heap);
}

uint32_t em_prefix_evict(em_prefix_cache *cache, uint32_t want) {
    if (want == 0 || cache->n_nodes == 0) return 0;
    em_heap heap = {0};
    push_leaves(cache, &heap, EM_TIER_DEVICE);
    uint32_t freed = 0;
    while (freed < want && heap.n) {
        em_prefix_node *leaf;
        em_heap_pop(&heap, &leaf, sizeof leaf, used_before);
        em_prefix_node *parent = leaf->parent;
        move_down(cache, leaf);
        freed++;
        if (leaf_of(cache, parent, EM_TIER_DEVICE) && !em_heap_push(&heap, &parent, sizeof parent, used_before)) break;
    }
    em_heap_free(&heap);
    return freed;
}

void em_prefix_flush(em_prefix_cache *cache) {
    if (!em_tiers_disk_on(cache->tiers)) return;
    while (cache->n_nodes && em_prefix_evict(cache, cache->n_nodes)) {}
    trim_tier(cache, EM_TIER_RAM, 0, true);
}

void em_prefix_free(em_prefix_cache *cache) {
    /* Free leaves bottom-up until the tree is empty; disk files stay for the next start. */
    em_prefix_node *node = cache->root.first_child;
    while (node) {
        while (node->first_child) node = node->first_child;
        em_prefix_node *parent = node->parent;
        unlink_node(node);
        free_node(cache, node, false, false);
        node = parent == &cache->root ? cache->root.first_child : parent;
    }
}

/* ---- The disk tier's nodes at start-up ---- */

static int by_modified(const void *a, const void *b) {
    const em_disk_entry *x = a, *y = b;
    return x->modified_ns < y->modified_ns ? -1 : x->modified_ns > y->modified_ns;
}

static int by_key(const void *a, const void *b, void *entries) {
    const em_disk_entry *e = entries;
    return memcmp(e[*(const size_t *)a].key, e[*(const size_t *)b].key, EM_PREFIX_KEY_BYTES);
}

/* The entry whose key is `key` (order: indices sorted by key), or -1. */
static ptrdiff_t find_entry(const em_disk_entry *e, const size_t *order, size_t n, const uint8_t *key) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = memcmp(e[order[mid]].key, key, EM_PREFIX_KEY_BYTES);
        if (!c) return (ptrdiff_t)order[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

enum { ENTRY_UNKNOWN, ENTRY_REACHED, ENTRY_ORPHAN };

/* Whether entry i hangs from the root through entries that are all there, each a full block (a
 * partial block ends its path); walked up without recursion, the answer kept for every entry met. */
static uint8_t reach(const em_disk_entry *e, const ptrdiff_t *parent, uint8_t *state, size_t n, size_t i,
                     uint32_t block_tokens, size_t *path) {
    size_t depth = 0, at = i;
    uint8_t answer = ENTRY_ORPHAN;
    for (;;) {
        if (state[at] != ENTRY_UNKNOWN) {
            answer = state[at];
            break;
        }
        path[depth++] = at;
        if (parent[at] == -1) { /* under the root */
            answer = ENTRY_REACHED;
            break;
        }
        if (parent[at] < 0 || depth >= n || e[parent[at]].n_tokens != block_tokens) break;
        at = (size_t)parent[at];
    }
    while (depth) state[path[--depth]] = answer;
    return answer;
}

static const uint8_t root_key[EM_PREFIX_KEY_BYTES];

em_err em_prefix_load_disk(em_prefix_cache *cache) {
    em_kv_tiers *t = cache->tiers;
    if (!t || !t->disk) return NULL;
    em_disk_entry *e = NULL;
    size_t n = 0;
    uint64_t skipped = 0;
    em_err err = em_disk_index(t->disk, &e, &n, &skipped);
    t->disk_stats.files_skipped += skipped;
    if (err || !n) return err;
    const uint32_t bt = cache->pool->block_tokens;
    /* Least recently written first: their clock values follow the order of the files' times. */
    qsort(e, n, sizeof *e, by_modified);
    size_t *order = malloc(n * sizeof *order), *path = malloc(n * sizeof *path);
    ptrdiff_t *parent = malloc(n * sizeof *parent);
    uint8_t *state = calloc(n, 1);
    if (!order || !path || !parent || !state) err = em_errorf(EM_ERR_NOMEM, "cache index: out of memory");
    for (size_t i = 0; !err && i < n; i++) order[i] = i;
    if (!err) qsort_r(order, n, sizeof *order, by_key, e);
    for (size_t i = 0; !err && i < n; i++) { /* -1: the root; -2: a parent that is not there */
        const ptrdiff_t found = find_entry(e, order, n, e[i].parent);
        parent[i] = !memcmp(e[i].parent, root_key, sizeof root_key) ? -1 : found >= 0 ? found : -2;
    }
    em_prefix_node **nodes = err ? NULL : calloc(n, sizeof *nodes);
    if (!err && !nodes) err = em_errorf(EM_ERR_NOMEM, "cache index: out of memory");
    /* Nodes first, then links: a child may come before its parent in the files' order. */
    uint64_t orphans = 0;
    for (size_t i = 0; !err && i < n; i++) {
        if (reach(e, parent, state, n, i, bt, path) != ENTRY_REACHED) {
            em_disk_remove(t->disk, e[i].key);
            orphans++;
            continue;
        }
        em_prefix_node *node = calloc(1, sizeof *node);
        int32_t *tokens = malloc(bt * sizeof *tokens);
        if (!node || !tokens) {
            free(node);
            free(tokens);
            err = em_errorf(EM_ERR_NOMEM, "cache index: out of memory");
            break;
        }
        memcpy(tokens, e[i].tokens, e[i].n_tokens * sizeof *tokens);
        *node = (em_prefix_node){.tokens = tokens, .n_tokens = e[i].n_tokens, .block = EM_PREFIX_NO_BLOCK,
                                 .last_used = i + 1, .tier = EM_TIER_DISK};
        memcpy(node->key, e[i].key, sizeof node->key);
        nodes[i] = node;
        t->disk_stats.bytes += e[i].file_bytes;
        t->disk_stats.blocks++;
    }
    if (orphans) {
        em_log(EM_LOG_WARN, "%llu cache files skipped and removed from %s: their prefix is not on disk",
               (unsigned long long)orphans, em_disk_dir(t->disk));
        t->disk_stats.files_skipped += orphans;
    }
    for (size_t i = 0; err && nodes && i < n; i++) { /* out of memory: no disk tier nodes at all */
        if (nodes[i]) free(nodes[i]->tokens);
        free(nodes[i]);
        nodes[i] = NULL;
    }
    if (err) t->disk_stats.bytes = t->disk_stats.blocks = 0;
    for (size_t i = 0; nodes && i < n; i++) {
        if (!nodes[i]) continue;
        em_prefix_node *up = parent[i] == -1 ? &cache->root : nodes[parent[i]];
        nodes[i]->parent = up;
        nodes[i]->next_sibling = up->first_child;
        up->first_child = nodes[i];
    }
    if (cache->clock < n) cache->clock = n;
    free(nodes);
    free(order);
    free(path);
    free(parent);
    free(state);
    em_disk_entries_free(e, n);
    if (!err) trim_tier(cache, EM_TIER_DISK, 0, false); /* a smaller bound than last time */
    return err;
}
