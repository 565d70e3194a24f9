/* Stored responses: the Responses API's `store: true` keeps what a response ended (the conversation
 * as chat messages, its own output last) so that a later request can go on from it by
 * `previous_response_id` instead of sending everything again.
 *
 * Memory is bounded two ways, by entries and by the bytes of their JSON text, and the least
 * recently used entry (put or got) goes first; an id that was pushed out is answered as unknown
 * (the caller's 400, previous_response_not_found). Entries are kept as JSON text, not jansson values: a copy is parsed for each
 * reader, so no value is shared between connection threads. The list is a plain array searched
 * from the end (the most recent): the bound keeps it small, and a search costs far less than the
 * generation it precedes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DEFAULT_ENTRIES 1024
#define DEFAULT_BYTES ((size_t)64 << 20)

typedef struct entry {
    char *id;
    char *conversation; /* compact JSON text */
    size_t bytes;
} entry;

struct em_response_store {
    pthread_mutex_t lock;
    entry *entries; /* least recently used first */
    size_t n, max_entries, bytes, max_bytes;
};

em_response_store *em_response_store_new(size_t max_entries, size_t max_bytes) {
    em_response_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->max_entries = max_entries ? max_entries : DEFAULT_ENTRIES;
    s->max_bytes = max_bytes ? max_bytes : DEFAULT_BYTES;
    if (!(s->entries = calloc(s->max_entries, sizeof *s->entries))) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    return s;
}

void em_response_store_free(em_response_store *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->entries[i].id);
        free(s->entries[i].conversation);
    }
    free(s->entries);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* Takes entry i out, moving the later ones down; the caller frees or reinserts it. */
static entry take(em_response_store *s, size_t i) {
    entry e = s->entries[i];
    memmove(&s->entries[i], &s->entries[i + 1], (s->n - i - 1) * sizeof *s->entries);
    s->n--;
    s->bytes -= e.bytes;
    return e;
}

static void drop(entry e) {
    free(e.id);
    free(e.conversation);
}

static size_t find(const em_response_store *s, const char *id) {
    for (size_t i = s->n; i-- > 0;)
        if (!strcmp(s->entries[i].id, id)) return i;
    return SIZE_MAX;
}

bool em_response_store_put(em_response_store *s, const char *id, const json_t *conversation) {
    entry e = {.id = strdup(id), .conversation = em_server_dump(conversation)};
    if (!e.id || !e.conversation) {
        drop(e);
        return false;
    }
    e.bytes = strlen(e.id) + strlen(e.conversation);
    pthread_mutex_lock(&s->lock);
    size_t old = find(s, id);
    if (old != SIZE_MAX) drop(take(s, old));
    /* an entry larger than the whole budget is not kept at all (its id will be unknown) */
    bool keep = e.bytes <= s->max_bytes;
    while (keep && s->n && (s->n == s->max_entries || s->bytes + e.bytes > s->max_bytes)) drop(take(s, 0));
    if (keep) {
        s->entries[s->n++] = e;
        s->bytes += e.bytes;
    }
    pthread_mutex_unlock(&s->lock);
    if (!keep) drop(e);
    return true;
}

json_t *em_response_store_get(em_response_store *s, const char *id) {
    json_t *conversation = NULL;
    pthread_mutex_lock(&s->lock);
    size_t i = find(s, id);
    if (i != SIZE_MAX) {
        entry e = take(s, i);
        conversation = json_loads(e.conversation, 0, NULL);
        s->entries[s->n++] = e; /* now the most recently used */
        s->bytes += e.bytes;
    }
    pthread_mutex_unlock(&s->lock);
    return conversation;
}
