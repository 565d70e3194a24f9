/* Compiled grammars shared by content (grammar.h's em_grammar_cache): GBNF texts → compiled
 * grammars and JSON schemas' texts → GBNF, for the requests of a server, which send the same
 * grammars again and again.
 *
 * Entries are found by a hash of their text and compared in full, so two texts never share one.
 * A text not seen before gets an entry at once, marked as being made; a thread that asks for it
 * meanwhile waits on the cache's condition variable (watching its own caller: a waiting client may
 * hang up too) rather than compiling it a second time. The maker fills the entry in, or removes it
 * when its watch stopped it or memory ran out (neither says anything about the text), and wakes
 * the waiters; one of them then makes it. The entries are few (a bound of some hundreds), so they
 * are kept in an array and looked up by a scan of their hashes; eviction scans for the least
 * recently used. One lock guards the cache; compiling happens outside it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

typedef enum { ENTRY_GBNF, ENTRY_SCHEMA } entry_kind;

typedef struct entry {
    entry_kind kind;
    uint64_t hash;
    char *key;
    size_t key_len;
    bool ready;          /* false while a thread makes it */
    em_grammar *grammar; /* ENTRY_GBNF: the compiled grammar (the cache's reference) */
    char *gbnf;          /* ENTRY_SCHEMA: the schema's GBNF */
    char *refusal;       /* or why the text was refused */
    em_err_code refusal_code;
    size_t bytes;
    uint64_t last_used;
} entry;

struct em_grammar_cache {
    pthread_mutex_t lock;
    pthread_cond_t changed; /* an entry was made or dropped */
    entry **entries;
    size_t n_entries, cap_entries;
    size_t max_entries, max_bytes, bytes;
    uint64_t clock;
    em_grammar_cache_stats stats;
};

/* How long a waiter sleeps before it looks at its own watch again. */
#define WAIT_NS 10000000L

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* A hash of the text eight bytes at a time: texts reach megabytes, and every request hashes its own. */
static uint64_t text_hash(entry_kind kind, const char *text, size_t len) {
    uint64_t h = mix64(len ^ ((uint64_t)kind << 56));
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t word;
        memcpy(&word, text + i, 8);
        h = mix64(h ^ word);
    }
    uint64_t tail = 0;
    if (len > i) memcpy(&tail, text + i, len - i);
    return mix64(h ^ tail);
}

em_err em_grammar_cache_new(size_t max_entries, size_t max_bytes, em_grammar_cache **out) {
    *out = NULL;
    em_grammar_cache *c = calloc(1, sizeof *c);
    if (!c) return em_errorf(EM_ERR_NOMEM, "grammar: out of memory for a cache of compiled grammars");
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return em_errorf(EM_ERR_NOMEM, "grammar: cannot make the lock of a cache of compiled grammars");
    }
    if (pthread_cond_init(&c->changed, NULL) != 0) {
        pthread_mutex_destroy(&c->lock);
        free(c);
        return em_errorf(EM_ERR_NOMEM, "grammar: cannot make the condition of a cache of compiled grammars");
    }
    c->max_entries = max_entries;
    c->max_bytes = max_bytes;
    *out = c;
    return NULL;
}

static void entry_free(entry *e) {
    if (!e) return;
    free(e->key);
    em_grammar_free(e->grammar);
    free(e->gbnf);
    free(e->refusal);
    free(e);
}

void em_grammar_cache_free(em_grammar_cache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_entries; i++) entry_free(c->entries[i]);
    free(c->entries);
    pthread_cond_destroy(&c->changed);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static entry *find(em_grammar_cache *c, entry_kind kind, uint64_t hash, const char *text, size_t len) {
    for (size_t i = 0; i < c->n_entries; i++) {
        entry *e = c->entries[i];
        if (e->hash == hash && e->kind == kind && e->key_len == len && !memcmp(e->key, text, len)) return e;
    }
    return NULL;
}

static void drop(em_grammar_cache *c, entry *e) {
    for (size_t i = 0; i < c->n_entries; i++) {
        if (c->entries[i] != e) continue;
        c->entries[i] = c->entries[--c->n_entries];
        break;
    }
    if (e->ready) c->bytes -= e->bytes;
    entry_free(e);
}

/* Drops the least recently used entries made until the cache is within its bounds. */
static void evict(em_grammar_cache *c) {
    for (;;) {
        size_t ready = 0;
        entry *oldest = NULL;
        for (size_t i = 0; i < c->n_entries; i++) {
            entry *e = c->entries[i];
            if (!e->ready) continue;
            ready++;
            if (!oldest || e->last_used < oldest->last_used) oldest = e;
        }
        if (!oldest || (ready <= c->max_entries && c->bytes <= c->max_bytes)) return;
        drop(c, oldest);
    }
}

/* The answer of a made entry for a caller: its own reference, copy or error. */
static em_err answer(const entry *e, em_grammar **grammar, char **gbnf) {
    if (e->refusal) return em_errorf(e->refusal_code, "%s", e->refusal);
    if (e->kind == ENTRY_GBNF) {
        *grammar = em_grammar_retain(e->grammar);
        return NULL;
    }
    if (!(*gbnf = strdup(e->gbnf))) return em_errorf(EM_ERR_NOMEM, "grammar: out of memory");
    return NULL;
}

/* Compiles or converts the text under the watch. */
static em_err make(entry_kind kind, const char *text, size_t len, const em_grammar_watch *watch, em_grammar **grammar,
                   char **gbnf) {
    em_grammar_budget budget = {.watch = watch};
    return kind == ENTRY_GBNF ? em_grammar_compile_budgeted(text, len, &budget, true, grammar)
                              : em_grammar_schema_budgeted(text, len, &budget, gbnf);
}

/* Files what `make` gave under the entry being made (or drops it when the result says nothing of
 * the text), and wakes the threads waiting for it. Called with the lock held. */
static void settle(em_grammar_cache *c, entry *e, em_err err, em_grammar *grammar, const char *gbnf) {
    const em_err_code code = err ? em_err_code_of(err) : 0;
    if (code == EM_ERR_IO || code == EM_ERR_NOMEM) {
        if (code == EM_ERR_IO) c->stats.stopped++;
        drop(c, e);
    } else {
        c->stats.compiled++;
        e->grammar = grammar ? em_grammar_retain(grammar) : NULL;
        e->gbnf = gbnf ? strdup(gbnf) : NULL;
        e->refusal = err ? strdup(em_err_message(err)) : NULL;
        e->refusal_code = code;
        if ((gbnf && !e->gbnf) || (err && !e->refusal)) {
            drop(c, e); /* out of memory for the copy: not kept */
        } else {
            e->bytes = sizeof *e + e->key_len + (grammar ? em_grammar_bytes(grammar) : 0) + (gbnf ? strlen(gbnf) + 1 : 0) +
                       (e->refusal ? strlen(e->refusal) + 1 : 0);
            e->ready = true;
            e->last_used = ++c->clock;
            c->bytes += e->bytes;
            /* One answer larger than a quarter of the bound would flush everything else: it is
             * handed out, not kept. */
            if (e->bytes > c->max_bytes / 4) drop(c, e);
            else evict(c);
        }
    }
    pthread_cond_broadcast(&c->changed);
}

static bool watch_says_stop(const em_grammar_watch *watch) { return watch && watch->stop && watch->stop(watch->self); }

/* An entry being made for the text, owned by the cache: NULL when out of memory. */
static entry *start_entry(em_grammar_cache *c, entry_kind kind, uint64_t hash, const char *text, size_t len) {
    entry *e = calloc(1, sizeof *e);
    if (!e || !(e->key = malloc(len ? len : 1)) ||
        !em_grammar_reserve(&c->entries, &c->cap_entries, c->n_entries + 1, sizeof *c->entries)) {
        entry_free(e);
        return NULL;
    }
    memcpy(e->key, text, len);
    e->key_len = len;
    e->kind = kind;
    e->hash = hash;
    c->entries[c->n_entries++] = e;
    return e;
}

static em_err obtain(em_grammar_cache *c, entry_kind kind, const char *text, size_t len, const em_grammar_watch *watch,
                     em_grammar **grammar, char **gbnf) {
    if (!c || !text) return make(kind, text, len, watch, grammar, gbnf); /* (no schema: any object, made at once) */
    const uint64_t hash = text_hash(kind, text, len);
    pthread_mutex_lock(&c->lock);
    entry *e;
    while ((e = find(c, kind, hash, text, len)) && !e->ready) {
        /* Another thread makes it: wait for it, as long as this caller still wants it. */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += WAIT_NS;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&c->changed, &c->lock, &until);
        if (watch_says_stop(watch)) {
            pthread_mutex_unlock(&c->lock);
            return em_errorf(EM_ERR_IO, "grammar: compilation stopped: its caller went away");
        }
    }
    if (e) {
        e->last_used = ++c->clock;
        c->stats.reused++;
        em_err err = answer(e, grammar, gbnf);
        pthread_mutex_unlock(&c->lock);
        return err;
    }
    e = start_entry(c, kind, hash, text, len);
    pthread_mutex_unlock(&c->lock);
    em_err err = make(kind, text, len, watch, grammar, gbnf);
    if (!e) return err; /* no memory to keep it: made for this caller alone */
    pthread_mutex_lock(&c->lock);
    settle(c, e, err, grammar ? *grammar : NULL, gbnf ? *gbnf : NULL);
    pthread_mutex_unlock(&c->lock);
    return err;
}

em_err em_grammar_cache_compile(em_grammar_cache *c, const char *gbnf, size_t len, const em_grammar_watch *watch,
                                em_grammar **out) {
    *out = NULL;
    return obtain(c, ENTRY_GBNF, gbnf, len, watch, out, NULL);
}

em_err em_grammar_cache_schema(em_grammar_cache *c, const char *schema, size_t len, const em_grammar_watch *watch,
                               char **gbnf) {
    *gbnf = NULL;
    return obtain(c, ENTRY_SCHEMA, schema, len, watch, NULL, gbnf);
}

void em_grammar_cache_stats_get(em_grammar_cache *c, em_grammar_cache_stats *out) {
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    out->entries = 0;
    for (size_t i = 0; i < c->n_entries; i++) out->entries += c->entries[i]->ready;
    out->bytes = c->bytes;
    pthread_mutex_unlock(&c->lock);
}
