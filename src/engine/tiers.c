/*
 * The prefix cache's lower tiers (engine.h, "Prefix cache tiers"): one node's rows moved between
 * the backend's pool, host RAM and disk, and what each tier holds and has done. Which node moves
 * where is the prefix cache's decision (prefix.c: least recently used leaves first, a tier at a
 * time); this file does the copying, keeps the byte counts the bounds are checked against, and
 * turns the disk tier off when a write fails, so a full disk costs the cache its lowest tier and
 * never a request.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

em_err em_tiers_new(em_backend *backend, const em_model *model, uint64_t ram_limit, const char *dir,
                    uint64_t disk_limit, em_kv_tiers **out) {
    *out = NULL;
    if (!em_backend_can_tier(backend))
        return em_errorf(EM_ERR_UNSUPPORTED, "the %s backend cannot copy KV blocks to host memory", backend->ops->name);
    em_kv_tiers *t = calloc(1, sizeof *t);
    if (!t) return em_errorf(EM_ERR_NOMEM, "cache tiers: out of memory");
    t->backend = backend;
    t->row_bytes = backend->kv_bytes_per_token;
    t->ram_limit = ram_limit;
    t->ram = (ember_tier_stats){.enabled = ram_limit > 0, .limit_bytes = ram_limit};
    t->scratch = malloc(t->row_bytes * backend->block_tokens);
    if (!t->scratch) {
        em_tiers_free(t);
        return em_errorf(EM_ERR_NOMEM, "cache tiers: out of memory for a block of %u positions", backend->block_tokens);
    }
    if (dir) {
        uint8_t identity[32];
        em_err err = em_disk_identity(model, backend, identity);
        if (!err) err = em_disk_open(dir, identity, backend->block_tokens, t->row_bytes, disk_limit, &t->disk);
        if (err) {
            em_log(EM_LOG_WARN, "disk cache tier off: %s", em_err_message(err));
            em_err_free(err);
        } else {
            t->disk_writable = true;
            t->disk_stats = (ember_tier_stats){.enabled = true, .limit_bytes = em_disk_limit(t->disk)};
        }
    }
    *out = t;
    return NULL;
}

void em_tiers_free(em_kv_tiers *t) {
    if (!t) return;
    em_disk_close(t->disk);
    free(t->scratch);
    free(t);
}

const char *em_tiers_disk_dir(const em_kv_tiers *t) { return t && t->disk ? em_disk_dir(t->disk) : NULL; }
bool em_tiers_disk_on(const em_kv_tiers *t) { return t && t->disk && t->disk_writable; }

void em_tiers_key(const em_prefix_node *node) {
    em_prefix_node *n = (em_prefix_node *)node;
    em_disk_key(n->parent->key, n->tokens, n->n_tokens, n->key);
}

bool em_tiers_over(const em_kv_tiers *t, em_tier tier, uint64_t incoming) {
    if (tier == EM_TIER_RAM) return t->ram.bytes + incoming > t->ram_limit;
    if (tier == EM_TIER_DISK) return t->disk && t->disk_stats.bytes + incoming > t->disk_stats.limit_bytes;
    return false;
}

bool em_tiers_below(const em_kv_tiers *t, const em_prefix_node *node, em_tier *tier, uint64_t *bytes) {
    if (!t) return false;
    if (node->tier == EM_TIER_DEVICE && t->ram_limit) {
        *tier = EM_TIER_RAM;
        *bytes = node->n_tokens * t->row_bytes;
        return true;
    }
    if (node->tier == EM_TIER_DISK || !em_tiers_disk_on(t)) return false;
    *tier = EM_TIER_DISK;
    *bytes = em_disk_file_bytes(t->disk, node->n_tokens);
    return true;
}

/* A failed write: the disk tier takes nothing more (what it holds can still be read back). */
static void disk_failed(em_kv_tiers *t, em_err err) {
    em_log(EM_LOG_WARN, "disk cache tier off: %s; the prefix cache goes on without it", em_err_message(err));
    em_err_free(err);
    t->disk_writable = false;
    t->disk_stats.enabled = false;
}

static void count_in(ember_tier_stats *s, uint64_t bytes) {
    s->bytes += bytes;
    s->blocks++;
    s->stored++;
    s->bytes_written += bytes;
}

static void count_out(ember_tier_stats *s, uint64_t bytes) {
    s->bytes -= bytes < s->bytes ? bytes : s->bytes;
    if (s->blocks) s->blocks--;
}

bool em_tiers_to_lower(em_kv_tiers *t, em_kv_pool *pool, em_prefix_node *node) {
    const uint64_t bytes = node->n_tokens * t->row_bytes;
    em_err err = NULL;
    if (node->tier == EM_TIER_DEVICE && t->ram_limit) {
        void *host = malloc(bytes);
        err = host ? em_backend_kv_save(t->backend, node->block, node->n_tokens, host)
                   : em_errorf(EM_ERR_NOMEM, "out of memory for %llu bytes", (unsigned long long)bytes);
        if (err) {
            em_log(EM_LOG_WARN, "RAM cache tier: %s", em_err_message(err));
            em_err_free(err);
            free(host);
            return false;
        }
        em_kv_release(pool, node->block);
        node->block = EM_PREFIX_NO_BLOCK;
        node->host = host;
        node->tier = EM_TIER_RAM;
        count_in(&t->ram, bytes);
        return true;
    }
    if (!em_tiers_disk_on(t) || node->tier == EM_TIER_DISK) return false;
    const void *rows = node->host;
    if (node->tier == EM_TIER_DEVICE && (err = em_backend_kv_save(t->backend, node->block, node->n_tokens, t->scratch))) {
        em_log(EM_LOG_WARN, "disk cache tier: %s", em_err_message(err));
        em_err_free(err);
        return false;
    }
    if (node->tier == EM_TIER_DEVICE) rows = t->scratch;
    uint64_t file_bytes = 0;
    if ((err = em_disk_write(t->disk, node->key, node->parent->key, node->tokens, node->n_tokens, rows, &file_bytes))) {
        disk_failed(t, err);
        return false;
    }
    if (node->tier == EM_TIER_DEVICE) {
        em_kv_release(pool, node->block);
        node->block = EM_PREFIX_NO_BLOCK;
    } else {
        free(node->host);
        node->host = NULL;
        count_out(&t->ram, bytes);
        t->ram.evictions++;
    }
    node->tier = EM_TIER_DISK;
    count_in(&t->disk_stats, file_bytes);
    return true;
}

em_err em_tiers_load(em_kv_tiers *t, em_prefix_node *node, uint32_t block, double *ms) {
    const double start = em_engine_now_ms();
    const uint64_t bytes = node->n_tokens * t->row_bytes;
    ember_tier_stats *s = node->tier == EM_TIER_RAM ? &t->ram : &t->disk_stats;
    em_err err = NULL;
    if (node->tier == EM_TIER_RAM) {
        err = em_backend_kv_load(t->backend, block, node->n_tokens, node->host);
    } else if (node->tier == EM_TIER_DISK && t->disk) {
        err = em_disk_read(t->disk, node->key, node->tokens, node->n_tokens, t->scratch);
        if (err) s->files_skipped++;
        else err = em_backend_kv_load(t->backend, block, node->n_tokens, t->scratch);
    } else {
        err = em_errorf(EM_ERR_INTERNAL, "cache tiers: a node to restore is in no lower tier");
    }
    if (err) return err;
    if (node->tier == EM_TIER_RAM) {
        free(node->host);
        node->host = NULL;
        count_out(s, bytes);
        s->bytes_read += bytes;
    } else {
        const uint64_t file_bytes = em_disk_file_bytes(t->disk, node->n_tokens);
        em_disk_remove(t->disk, node->key); /* it is on the device now; an eviction writes it again */
        count_out(s, file_bytes);
        s->bytes_read += file_bytes;
    }
    node->tier = EM_TIER_DEVICE;
    node->block = block;
    s->hits++;
    s->hit_tokens += node->n_tokens;
    *ms = em_engine_now_ms() - start;
    s->restore_ms += *ms;
    return NULL;
}

void em_tiers_forget(em_kv_tiers *t, em_prefix_node *node, bool evicted) {
    if (node->tier == EM_TIER_RAM) {
        free(node->host);
        node->host = NULL;
        count_out(&t->ram, node->n_tokens * t->row_bytes);
        t->ram.evictions += evicted;
    } else if (node->tier == EM_TIER_DISK && t->disk) {
        em_disk_remove(t->disk, node->key);
        count_out(&t->disk_stats, em_disk_file_bytes(t->disk, node->n_tokens));
        t->disk_stats.evictions += evicted;
    }
}
