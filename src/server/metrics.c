/* /metrics: HTTP request counters kept by the server plus the engine's own statistics, written in
 * Prometheus' text exposition format (version 0.0.4): HELP and TYPE lines, then samples; a
 * histogram's buckets are cumulative and end with le="+Inf", followed by _sum and _count. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char *const endpoint_paths[EM_EP_COUNT] = {
    [EM_EP_CHAT] = "/v1/chat/completions",
    [EM_EP_COMPLETIONS] = "/v1/completions",
    [EM_EP_MESSAGES] = "/v1/messages",
    [EM_EP_COUNT_TOKENS] = "/v1/messages/count_tokens",
    [EM_EP_MODELS] = "/v1/models",
    [EM_EP_HEALTH] = "/health",
    [EM_EP_METRICS] = "/metrics",
    [EM_EP_PAGE] = "/",
    [EM_EP_RESPONSES] = "/v1/responses",
    [EM_EP_OLLAMA_CHAT] = "/api/chat",
    [EM_EP_OLLAMA_GENERATE] = "/api/generate",
    [EM_EP_OLLAMA_TAGS] = "/api/tags",
    [EM_EP_OLLAMA_SHOW] = "/api/show",
    [EM_EP_OLLAMA_PS] = "/api/ps",
    [EM_EP_OLLAMA_VERSION] = "/api/version",
    [EM_EP_OLLAMA_EMBED] = "/api/embed",
    [EM_EP_OLLAMA_MANAGE] = "/api/pull,push,create,copy,delete",
    [EM_EP_TOKENIZE] = "/tokenize",
    [EM_EP_DETOKENIZE] = "/detokenize",
    [EM_EP_EMBEDDINGS] = "/v1/embeddings",
    [EM_EP_OTHER] = "other",
};

const char *em_server_endpoint_path(em_server_endpoint endpoint) {
    return endpoint < EM_EP_COUNT ? endpoint_paths[endpoint] : "other";
}

void em_server_metrics_init(em_server_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
}

void em_server_metrics_destroy(em_server_metrics *m) {
    pthread_mutex_destroy(&m->lock);
}

void em_server_metrics_count(em_server_metrics *m, em_server_endpoint endpoint, int status) {
    if (endpoint >= EM_EP_COUNT || status < 100 || status > 599) return;
    pthread_mutex_lock(&m->lock);
    m->requests[endpoint][status - 100]++;
    pthread_mutex_unlock(&m->lock);
}

/* Upper bounds of the engine's step-time buckets (ember_stats.step_histogram), in seconds; the
 * twelfth bucket is everything slower. */
static const char *const step_bounds[11] = {"0.001", "0.002", "0.005", "0.01", "0.02", "0.05",
                                            "0.1",   "0.2",   "0.5",   "1",    "2"};

static bool metric(em_buf *out, const char *name, const char *type, const char *help, uint64_t value) {
    return em_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name,
                         (unsigned long long)value);
}

/* One family of samples labelled by tier (the prefix cache's host-RAM and disk tiers). */
static bool tier_family(em_buf *out, const char *name, const char *type, const char *help, uint64_t ram, uint64_t disk) {
    return em_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s{tier=\"ram\"} %llu\n%s{tier=\"disk\"} %llu\n", name, help,
                         name, type, name, (unsigned long long)ram, name, (unsigned long long)disk);
}

static bool tier_metrics(em_buf *out, const ember_tier_stats *r, const ember_tier_stats *d) {
    return tier_family(out, "ember_cache_tier_enabled", "gauge", "Prefix cache tier on (1) or off (0).", r->enabled,
                       d->enabled) &&
           tier_family(out, "ember_cache_tier_limit_bytes", "gauge", "Prefix cache tier bound in bytes.", r->limit_bytes,
                       d->limit_bytes) &&
           tier_family(out, "ember_cache_tier_bytes", "gauge", "Bytes a prefix cache tier holds.", r->bytes, d->bytes) &&
           tier_family(out, "ember_cache_tier_blocks", "gauge", "KV blocks a prefix cache tier holds.", r->blocks,
                       d->blocks) &&
           tier_family(out, "ember_cache_tier_stored_blocks_total", "counter",
                       "KV blocks moved into a prefix cache tier from the one above.", r->stored, d->stored) &&
           tier_family(out, "ember_cache_tier_hits_total", "counter",
                       "KV blocks restored from a prefix cache tier into the KV pool.", r->hits, d->hits) &&
           tier_family(out, "ember_cache_tier_hit_tokens_total", "counter",
                       "Tokens of the KV blocks restored from a prefix cache tier.", r->hit_tokens, d->hit_tokens) &&
           tier_family(out, "ember_cache_tier_evictions_total", "counter",
                       "KV blocks a prefix cache tier gave up (moved down or dropped).", r->evictions, d->evictions) &&
           tier_family(out, "ember_cache_tier_written_bytes_total", "counter", "Bytes moved into a prefix cache tier.",
                       r->bytes_written, d->bytes_written) &&
           tier_family(out, "ember_cache_tier_read_bytes_total", "counter", "Bytes restored from a prefix cache tier.",
                       r->bytes_read, d->bytes_read) &&
           em_buf_printf(out,
                         "# HELP ember_cache_tier_restore_seconds_total Time spent restoring KV blocks from a prefix "
                         "cache tier.\n# TYPE ember_cache_tier_restore_seconds_total counter\n"
                         "ember_cache_tier_restore_seconds_total{tier=\"ram\"} %.6f\n"
                         "ember_cache_tier_restore_seconds_total{tier=\"disk\"} %.6f\n",
                         r->restore_ms / 1e3, d->restore_ms / 1e3) &&
           metric(out, "ember_cache_disk_files_skipped_total", "counter",
                  "Disk cache files skipped: corrupt, truncated, of another model or unreachable.", d->files_skipped);
}

char *em_server_metrics_text(em_server_metrics *m, const ember_stats *s, const em_grammar_cache_stats *g) {
    em_buf out = {0};
    bool ok = em_buf_printf(&out, "# HELP ember_http_requests_total HTTP requests by endpoint and status.\n"
                                  "# TYPE ember_http_requests_total counter\n");
    pthread_mutex_lock(&m->lock);
    for (int e = 0; ok && e < EM_EP_COUNT; e++)
        for (int st = 0; ok && st < 500; st++)
            if (m->requests[e][st])
                ok = em_buf_printf(&out, "ember_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                                   endpoint_paths[e], st + 100, (unsigned long long)m->requests[e][st]);
    pthread_mutex_unlock(&m->lock);

    ok = ok && metric(&out, "ember_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", s->prompt_tokens) &&
         metric(&out, "ember_generated_tokens_total", "counter", "Tokens generated.", s->generated_tokens) &&
         metric(&out, "ember_cached_tokens_total", "counter", "Prompt tokens reused from the prefix cache.", s->cached_tokens) &&
         metric(&out, "ember_requests_finished_total", "counter", "Engine requests finished.", s->requests_finished) &&
         metric(&out, "ember_requests_cancelled_total", "counter", "Engine requests cancelled.", s->requests_cancelled) &&
         metric(&out, "ember_preemptions_total", "counter", "Sequences preempted for memory.", s->preemptions) &&
         metric(&out, "ember_draft_tokens_total", "counter", "Speculative decoding: tokens drafted and verified.",
                s->draft_tokens) &&
         metric(&out, "ember_draft_accepted_tokens_total", "counter", "Speculative decoding: drafted tokens accepted.",
                s->draft_accepted) &&
         metric(&out, "ember_queue_length", "gauge", "Requests waiting for admission.", s->queued) &&
         metric(&out, "ember_running_sequences", "gauge", "Sequences in the running batch.", s->running) &&
         metric(&out, "ember_kv_blocks_used", "gauge", "KV cache blocks in use (running or cached).", s->kv_blocks_used) &&
         metric(&out, "ember_kv_blocks_free", "gauge", "KV cache blocks free.",
                s->kv_blocks_total >= s->kv_blocks_used ? s->kv_blocks_total - s->kv_blocks_used : 0) &&
         metric(&out, "ember_kv_blocks_cached", "gauge", "KV cache blocks held only by the prefix cache.", s->kv_blocks_cached);
    if (g)
        ok = ok &&
             metric(&out, "ember_grammar_compiles_total", "counter",
                    "Request grammars and schemas compiled (refusals included); the rest came from the cache.", g->compiled) &&
             metric(&out, "ember_grammar_cache_hits_total", "counter", "Request grammars and schemas found compiled.",
                    g->reused) &&
             metric(&out, "ember_grammar_compiles_stopped_total", "counter",
                    "Grammar compilations stopped because their client hung up or the server stopped.", g->stopped) &&
             metric(&out, "ember_grammar_cache_entries", "gauge", "Compiled grammars and schemas kept.", g->entries) &&
             metric(&out, "ember_grammar_cache_bytes", "gauge", "Memory of the compiled grammars and schemas kept.", g->bytes);

    ok = ok && tier_metrics(&out, &s->cache_ram, &s->cache_disk);

    ok = ok && em_buf_printf(&out, "# HELP ember_step_seconds Time of one engine step.\n"
                                   "# TYPE ember_step_seconds histogram\n");
    uint64_t cumulative = 0;
    for (int b = 0; ok && b < 11; b++) {
        cumulative += s->step_histogram[b];
        ok = em_buf_printf(&out, "ember_step_seconds_bucket{le=\"%s\"} %llu\n", step_bounds[b],
                           (unsigned long long)cumulative);
    }
    cumulative += s->step_histogram[11];
    ok = ok && em_buf_printf(&out, "ember_step_seconds_bucket{le=\"+Inf\"} %llu\nember_step_seconds_sum %.6f\n"
                                   "ember_step_seconds_count %llu\n",
                             (unsigned long long)cumulative, s->step_seconds_total, (unsigned long long)cumulative);
    if (!ok) {
        em_buf_free(&out);
        return NULL;
    }
    return out.data;
}
