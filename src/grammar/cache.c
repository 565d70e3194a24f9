/* The shared mask cache (grammar.h): token masks keyed by grammar and parse state, for every
 * parse state of one vocabulary, so requests that follow the same grammar compute each mask once.
 *
 * A parse state's own memo (state.c) names sets by ids that only mean something inside that
 * state; here a set is named by its content instead (em_grammar_set_key: the positions of its
 * stacks), prefixed by the id of its grammar. Grammars are told apart by their whole compiled
 * form, compared exactly (two requests compile the same text to the same arrays), so two grammars
 * never share an entry. Each grammar also keeps its position tables (internal.h), made for the
 * positions that come back in new parse states, from which masks not seen before are made. Memory
 * is bounded: past max_bytes the least recently used masks go, and the grammars no mask refers to
 * any more, with their tables. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A grammar the cache knows: its compiled form as one array of words, compared exactly. */
typedef struct grammar_slot {
    uint64_t id; /* never reused, so a state's remembered id cannot name another grammar */
    uint64_t hash;
    uint32_t *form;
    size_t n_form;
    uint32_t form_elements; /* the grammar's element positions (the length of tables) */
    size_t n_masks; /* entries that belong to it */
    /* Position tables (internal.h), per element position, built on first use, and the parse state
     * of this grammar that walks them (its memo serves every position). */
    em_position_table **tables;
    uint8_t *asked; /* per position: a mask has asked for its table before (it is built the second time) */
    size_t table_bytes;
    em_grammar_state *probe;
} grammar_slot;

typedef struct mask_entry {
    uint64_t hash;
    uint32_t *key; /* grammar id (two words), then the set's key */
    size_t n_key;
    uint32_t *mask;
    uint32_t n_allowed;
    uint64_t last_used;
} mask_entry;

struct em_grammar_masks {
    const em_grammar_vocab *vocab;
    size_t words; /* of one mask */
    size_t max_bytes, bytes;
    grammar_slot *slots;
    size_t n_slots, cap_slots;
    uint64_t next_id;
    mask_entry *entries;
    size_t n_entries, cap_entries;
    uint32_t *index; /* open addressing: entry number + 1, 0 empty */
    size_t index_cap;
    uint64_t clock;
    /* The key of the last lookup (em_grammar_masks_find), which em_grammar_masks_store uses. */
    uint32_t *key;
    size_t n_key, cap_key;
    uint64_t key_hash;
    bool key_ready;
};

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static uint64_t words_hash(const uint32_t *words, size_t n) {
    uint64_t h = n;
    for (size_t i = 0; i < n; i++) h = mix64(h ^ words[i]) + i;
    return h;
}

em_err em_grammar_masks_new(const em_grammar_vocab *vocab, size_t max_bytes, em_grammar_masks **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return em_errorf(EM_ERR_NOMEM, "grammar: out of memory for a mask cache");
    (*out)->vocab = vocab;
    (*out)->words = ((size_t)em_grammar_vocab_size(vocab) + 31) / 32;
    (*out)->max_bytes = max_bytes;
    (*out)->next_id = 1;
    return NULL;
}

/* Frees what a grammar slot owns: its compiled form, its position tables and its probe. */
static void slot_clear(grammar_slot *slot) {
    free(slot->form);
    if (slot->tables) {
        for (uint32_t i = 0; i < slot->form_elements; i++) {
            if (!slot->tables[i]) continue;
            em_grammar_position_table_clear(slot->tables[i]);
            free(slot->tables[i]);
        }
    }
    free(slot->tables);
    free(slot->asked);
    em_grammar_state_free(slot->probe);
}

void em_grammar_masks_free(em_grammar_masks *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_entries; i++) {
        free(c->entries[i].key);
        free(c->entries[i].mask);
    }
    for (size_t i = 0; i < c->n_slots; i++) slot_clear(&c->slots[i]);
    free(c->entries);
    free(c->index);
    free(c->slots);
    free(c->key);
    free(c);
}

/* The grammar's compiled form in one array: everything a parse state's behavior depends on. */
static uint32_t *grammar_form(const em_grammar *g, size_t *n) {
    const size_t n_alternatives = g->n_rules ? g->rule_first[g->n_rules - 1] + g->rule_count[g->n_rules - 1] : 0;
    *n = 4 + g->n_elements + (size_t)g->n_byte_sets * 8 + 2 * (size_t)g->n_rules + n_alternatives;
    uint32_t *form = malloc(*n * sizeof *form), *at = form;
    if (!form) return NULL;
    *at++ = g->n_elements;
    *at++ = g->n_byte_sets;
    *at++ = g->n_rules;
    *at++ = g->root;
    memcpy(at, g->elements, g->n_elements * sizeof *at), at += g->n_elements;
    for (uint32_t i = 0; i < g->n_byte_sets; i++) memcpy(at, g->byte_sets[i].bits, 8 * sizeof *at), at += 8;
    memcpy(at, g->rule_first, g->n_rules * sizeof *at), at += g->n_rules;
    memcpy(at, g->rule_count, g->n_rules * sizeof *at), at += g->n_rules;
    memcpy(at, g->alternatives, n_alternatives * sizeof *at);
    return form;
}

/* The id of the state's grammar, found or added by its compiled form; 0 when out of memory. */
static uint64_t grammar_id(em_grammar_masks *c, em_grammar_state *s) {
    const uint64_t known = em_grammar_shared_id(s);
    for (size_t i = 0; known && i < c->n_slots; i++)
        if (c->slots[i].id == known) return known;
    size_t n;
    uint32_t *form = grammar_form(em_grammar_state_grammar(s), &n);
    if (!form) return 0;
    const uint64_t hash = words_hash(form, n);
    /* The same grammar compiled again (another request): its slot, and the state remembers it. */
    for (size_t i = 0; i < c->n_slots; i++)
        if (c->slots[i].hash == hash && c->slots[i].n_form == n && !memcmp(c->slots[i].form, form, n * sizeof *form)) {
            free(form);
            em_grammar_set_shared_id(s, c->slots[i].id);
            return c->slots[i].id;
        }
    if (!em_grammar_reserve(&c->slots, &c->cap_slots, c->n_slots + 1, sizeof *c->slots)) {
        free(form);
        return 0;
    }
    c->slots[c->n_slots++] = (grammar_slot){.id = c->next_id++, .hash = hash, .form = form, .n_form = n,
                                            .form_elements = em_grammar_state_grammar(s)->n_elements};
    c->bytes += n * sizeof *form;
    em_grammar_set_shared_id(s, c->slots[c->n_slots - 1].id);
    return c->slots[c->n_slots - 1].id;
}

static grammar_slot *find_slot(em_grammar_masks *c, uint64_t id) {
    for (size_t i = 0; i < c->n_slots; i++)
        if (c->slots[i].id == id) return &c->slots[i];
    return NULL;
}

static uint64_t entry_grammar(const uint32_t *key) { return key[0] | (uint64_t)key[1] << 32; }

static size_t entry_bytes(const em_grammar_masks *c, size_t n_key) { return (c->words + n_key) * sizeof(uint32_t); }

/* Refills the index from the entries; false when out of memory (the index is then empty). */
static bool rebuild_index(em_grammar_masks *c) {
    size_t cap = 64;
    while (cap < c->n_entries * 2 + 2) cap *= 2;
    uint32_t *index = calloc(cap, sizeof *index);
    free(c->index);
    c->index = index;
    c->index_cap = index ? cap : 0;
    if (!index) return false;
    for (size_t i = 0; i < c->n_entries; i++) {
        size_t h = c->entries[i].hash & (cap - 1);
        while (index[h]) h = (h + 1) & (cap - 1);
        index[h] = (uint32_t)i + 1;
    }
    return true;
}

typedef struct entry_age {
    uint64_t last_used;
    size_t bytes;
} entry_age;

static int by_age(const void *a, const void *b) {
    uint64_t x = ((const entry_age *)a)->last_used, y = ((const entry_age *)b)->last_used;
    return x < y ? -1 : x > y;
}

/* Drops the least recently used masks until the cache is at three quarters of its bound (a batch,
 * so that the index is rebuilt once per batch), then the grammars left without masks. */
static void evict(em_grammar_masks *c) {
    const size_t target = c->max_bytes / 4 * 3;
    entry_age *ages = malloc((c->n_entries ? c->n_entries : 1) * sizeof *ages);
    uint64_t cutoff = UINT64_MAX; /* without memory to sort: drop every mask */
    if (ages) {
        for (size_t i = 0; i < c->n_entries; i++)
            ages[i] = (entry_age){c->entries[i].last_used, entry_bytes(c, c->entries[i].n_key)};
        qsort(ages, c->n_entries, sizeof *ages, by_age);
        size_t bytes = c->bytes, i = 0;
        while (i < c->n_entries && bytes > target) bytes -= ages[i++].bytes;
        cutoff = i ? ages[i - 1].last_used : 0;
        free(ages);
    }
    size_t kept = 0;
    for (size_t i = 0; i < c->n_entries; i++) {
        mask_entry *e = &c->entries[i];
        if (e->last_used > cutoff) {
            c->entries[kept++] = *e;
            continue;
        }
        grammar_slot *slot = find_slot(c, entry_grammar(e->key));
        if (slot) slot->n_masks--;
        c->bytes -= entry_bytes(c, e->n_key);
        free(e->key);
        free(e->mask);
    }
    c->n_entries = kept;
    size_t slots_kept = 0;
    for (size_t i = 0; i < c->n_slots; i++) {
        if (c->slots[i].n_masks) {
            c->slots[slots_kept++] = c->slots[i];
            continue;
        }
        c->bytes -= c->slots[i].n_form * sizeof(uint32_t) + c->slots[i].table_bytes;
        slot_clear(&c->slots[i]);
    }
    c->n_slots = slots_kept;
    rebuild_index(c);
}

const uint32_t *em_grammar_masks_find(em_grammar_masks *c, em_grammar_state *s, uint32_t set, uint32_t *n_allowed) {
    c->key_ready = false;
    const uint64_t id = grammar_id(c, s);
    if (!id || !em_grammar_reserve(&c->key, &c->cap_key, 2, sizeof *c->key)) return NULL;
    c->key[0] = (uint32_t)id;
    c->key[1] = (uint32_t)(id >> 32);
    c->n_key = 2;
    if (!em_grammar_set_key(s, set, &c->key, &c->cap_key, &c->n_key)) return NULL;
    c->key_hash = words_hash(c->key, c->n_key);
    c->key_ready = true;
    if (!c->index_cap) return NULL;
    const size_t mask = c->index_cap - 1;
    for (size_t h = c->key_hash & mask; c->index[h]; h = (h + 1) & mask) {
        mask_entry *e = &c->entries[c->index[h] - 1];
        if (e->hash == c->key_hash && e->n_key == c->n_key && !memcmp(e->key, c->key, c->n_key * sizeof *c->key)) {
            e->last_used = ++c->clock;
            *n_allowed = e->n_allowed;
            return e->mask;
        }
    }
    return NULL;
}

void em_grammar_masks_store(em_grammar_masks *c, const uint32_t *mask, uint32_t n_allowed) {
    if (!c->key_ready) return; /* the lookup ran out of memory: nothing to file it under */
    c->key_ready = false;
    const size_t bytes = entry_bytes(c, c->n_key);
    const uint64_t id = entry_grammar(c->key);
    grammar_slot *slot = find_slot(c, id);
    if (!slot || bytes > c->max_bytes) return;
    if (c->bytes + bytes > c->max_bytes) {
        slot->n_masks++; /* held while evicting, so that its grammar stays */
        evict(c);
        slot = find_slot(c, id); /* evict moved the slots */
        slot->n_masks--;
    }
    mask_entry e = {.hash = c->key_hash, .n_key = c->n_key, .n_allowed = n_allowed, .last_used = ++c->clock};
    e.key = malloc(c->n_key * sizeof *e.key);
    e.mask = malloc(c->words * sizeof *e.mask);
    if (!e.key || !e.mask || !em_grammar_reserve(&c->entries, &c->cap_entries, c->n_entries + 1, sizeof *c->entries)) {
        free(e.key);
        free(e.mask);
        return;
    }
    memcpy(e.key, c->key, c->n_key * sizeof *e.key);
    memcpy(e.mask, mask, c->words * sizeof *e.mask);
    c->entries[c->n_entries++] = e;
    slot->n_masks++;
    c->bytes += bytes;
    if ((c->n_entries + 1) * 2 > c->index_cap) {
        rebuild_index(c);
        return;
    }
    const size_t m = c->index_cap - 1;
    size_t h = e.hash & m;
    while (c->index[h]) h = (h + 1) & m;
    c->index[h] = (uint32_t)c->n_entries;
}

const em_grammar_vocab *em_grammar_masks_vocab(const em_grammar_masks *c) { return c->vocab; }

const em_position_table *em_grammar_masks_table(em_grammar_masks *c, em_grammar_state *s, uint32_t position) {
    grammar_slot *slot = find_slot(c, em_grammar_shared_id(s));
    if (!slot || position >= slot->form_elements) return NULL;
    if (!slot->tables && !(slot->tables = calloc(slot->form_elements, sizeof *slot->tables))) return NULL;
    if (!slot->asked && !(slot->asked = calloc(slot->form_elements, 1))) return NULL;
    if (slot->tables[position]) return slot->tables[position];
    /* A table costs about a walk of the vocabulary: it is made when its position comes back in
     * another parse state, not for positions a grammar passes once. */
    if (!slot->asked[position]) {
        slot->asked[position] = 1;
        return NULL;
    }
    /* The probe follows the grammar of the state asking: the state that made it may be gone, with
     * its grammar (any state of this slot has a grammar of the same compiled form). */
    const em_grammar *grammar = em_grammar_state_grammar(s);
    if (slot->probe && em_grammar_state_grammar(slot->probe) != grammar) {
        em_grammar_state_free(slot->probe);
        slot->probe = NULL;
    }
    if (!slot->probe && em_grammar_state_new(grammar, &slot->probe)) return NULL;
    em_position_table *table = malloc(sizeof *table);
    if (!table || !em_grammar_position_table(slot->probe, c->vocab, position, table)) {
        free(table);
        return NULL;
    }
    const size_t bytes = em_grammar_position_table_bytes(table) +
                         (table->accepted_bits ? c->words * sizeof(uint32_t) : 0);
    slot->table_bytes += bytes;
    c->bytes += bytes;
    return slot->tables[position] = table;
}
