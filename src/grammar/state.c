/* The pushdown automaton (grammar.h): hash-consed stacks, interned sets of stacks, and the memoized
 * byte transitions between them, which make a lazily built DFA. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Past these sizes the memo (sets, transitions, masks) is dropped and rebuilt from the current
 * state: a long generation through ever new states must not grow without bound. */
#define MEMO_MAX_SET_ITEMS (1u << 20)
#define MEMO_MAX_MASK_BYTES ((size_t)16 << 20)
#define MEMO_MAX_ROW_BYTES ((size_t)16 << 20)
#define NO_TRANSITION UINT32_MAX
/* The most parse stacks one state may hold. A very ambiguous grammar (say `x ::= ("a" x+){2,5}`)
 * multiplies them with every byte, and each mask walks all of them: past this the request fails
 * rather than stall the engine. Real grammars (JSON, schemas, tool calls) stay far below. */
#define MAX_STACKS EM_GRAMMAR_MAX_STACKS

/* A stack: `position` is the next terminal's element for the top node, a return position for the
 * nodes below it; `parent` is the node below (0: none). Node 0 itself is the empty stack. */
typedef struct stack_node {
    uint32_t position, parent;
    uint32_t to_complete; /* the fewest bytes that empty this stack (its frames' min_rest summed) */
} stack_node;

/* Open-addressing hash table of uint32 ids (0 = empty slot) whose keys live elsewhere. */
typedef struct id_table {
    uint32_t *slots;
    size_t cap; /* power of two */
    size_t used;
} id_table;

struct em_grammar_state {
    const em_grammar *grammar;
    stack_node *nodes;
    size_t n_nodes, cap_nodes;
    id_table node_table;
    /* Interned sets of stacks: set s is set_items[set_start[s] .. set_start[s + 1]), sorted node ids.
     * Set 0 is the empty set (EM_GRAMMAR_DEAD). */
    uint32_t *set_items;
    size_t n_set_items, cap_set_items;
    uint32_t *set_start;
    size_t n_sets, cap_sets;
    id_table set_table;
    /* Transitions: key (set << 8 | byte) + 1 → next set; a separate table of keys and values. */
    uint64_t *transition_keys;
    uint32_t *transition_next;
    size_t transition_cap, transition_used;
    /* The same as a table of 256 per set (NO_TRANSITION: not computed yet), which a mask walk reads
     * many times in a row from the same set: made on a set's first step while they fit in
     * MEMO_MAX_ROW_BYTES, the hash table taking the sets past that. */
    uint32_t **rows;
    size_t cap_rows, row_bytes;
    /* Cached masks per set (NULL: none), and their sizes. */
    uint32_t **masks;
    uint32_t *mask_allowed;
    size_t cap_masks, mask_bytes;
    uint32_t current;
    bool ended; /* an end-of-generation token was accepted: nothing more is */
    uint32_t *scratch;
    size_t n_scratch, cap_scratch;
    /* (position, parent) pairs waiting to be expanded: expand's own stack, so that a grammar's
     * depth (a chain of 100,000 rules, each starting with the next) never deepens the thread's. */
    uint64_t *pending;
    size_t n_pending, cap_pending;
    /* (position, parent) pairs already expanded in the current step: the stacks they lead to are
     * the same every time, and grammars of many empty alternatives would otherwise expand
     * exponentially often. Entries of older steps carry older stamps and count as empty. */
    uint64_t *visited_keys;
    uint32_t *visited_stamps;
    size_t visited_cap, visited_used;
    uint32_t stamp;
    uint64_t shared_grammar; /* the grammar's id in the shared mask cache (cache.c), 0: not known yet */
    bool failed;        /* out of memory, or too ambiguous, inside a step: the state is unusable */
    bool too_ambiguous; /* the reason was MAX_STACKS */
};

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static bool table_grow(id_table *t, uint64_t (*hash)(const em_grammar_state *, uint32_t), const em_grammar_state *s) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < t->cap; i++) {
        uint32_t id = t->slots[i];
        if (!id) continue;
        size_t h = hash(s, id) & (cap - 1);
        while (slots[h]) h = (h + 1) & (cap - 1);
        slots[h] = id;
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return true;
}

static uint32_t add_saturated(uint32_t a, uint32_t b) {
    return a == EM_GRAMMAR_INFINITE || b == EM_GRAMMAR_INFINITE || a + b < a ? EM_GRAMMAR_INFINITE : a + b;
}

/* ---- Stacks ---- */

static uint64_t node_hash_of(uint32_t position, uint32_t parent) {
    return mix64(((uint64_t)position << 32) | parent);
}
static uint64_t node_hash(const em_grammar_state *s, uint32_t id) {
    return node_hash_of(s->nodes[id].position, s->nodes[id].parent);
}

/* The node (position, parent), made once. 0 when out of memory (with s->failed set). */
static uint32_t intern_node(em_grammar_state *s, uint32_t position, uint32_t parent) {
    if ((s->node_table.used + 1) * 2 > s->node_table.cap && !table_grow(&s->node_table, node_hash, s)) goto nomem;
    size_t mask = s->node_table.cap - 1, h = node_hash_of(position, parent) & mask;
    for (uint32_t id; (id = s->node_table.slots[h]); h = (h + 1) & mask)
        if (s->nodes[id].position == position && s->nodes[id].parent == parent) return id;
    if (!em_grammar_reserve(&s->nodes, &s->cap_nodes, s->n_nodes + 1, sizeof *s->nodes)) goto nomem;
    uint32_t id = (uint32_t)s->n_nodes++;
    s->nodes[id] = (stack_node){position, parent,
                                add_saturated(s->grammar->min_rest[position], parent ? s->nodes[parent].to_complete : 0)};
    s->node_table.slots[h] = id;
    s->node_table.used++;
    return id;
nomem:
    s->failed = true;
    return 0;
}

static void push_scratch(em_grammar_state *s, uint32_t node) {
    if (s->n_scratch > MAX_STACKS) { /* each pushed stack is distinct: the set is too big already */
        s->too_ambiguous = s->failed = true;
        return;
    }
    if (!em_grammar_reserve(&s->scratch, &s->cap_scratch, s->n_scratch + 1, sizeof *s->scratch)) {
        s->failed = true;
        return;
    }
    s->scratch[s->n_scratch++] = node;
}

/* Starts a step: nothing is expanded yet. */
static void begin_expansion(em_grammar_state *s) {
    s->stamp++;
    s->visited_used = 0;
    if (s->stamp == 0) { /* wrapped: forget every entry for real */
        if (s->visited_stamps) memset(s->visited_stamps, 0, s->visited_cap * sizeof *s->visited_stamps);
        s->stamp = 1;
    }
}

/* True the first time (position, parent) is expanded in this step. */
static bool first_visit(em_grammar_state *s, uint32_t position, uint32_t parent) {
    if ((s->visited_used + 1) * 2 > s->visited_cap) { /* grow, keeping this step's entries */
        size_t cap = s->visited_cap ? s->visited_cap * 2 : 256;
        uint64_t *keys = malloc(cap * sizeof *keys);
        uint32_t *stamps = calloc(cap, sizeof *stamps);
        if (!keys || !stamps) {
            free(keys);
            free(stamps);
            s->failed = true;
            return false;
        }
        for (size_t i = 0; i < s->visited_cap; i++) {
            if (s->visited_stamps[i] != s->stamp) continue;
            size_t h = mix64(s->visited_keys[i]) & (cap - 1);
            while (stamps[h] == s->stamp) h = (h + 1) & (cap - 1);
            keys[h] = s->visited_keys[i];
            stamps[h] = s->stamp;
        }
        free(s->visited_keys);
        free(s->visited_stamps);
        s->visited_keys = keys;
        s->visited_stamps = stamps;
        s->visited_cap = cap;
    }
    const uint64_t key = ((uint64_t)position << 32) | parent;
    size_t mask = s->visited_cap - 1, h = mix64(key) & mask;
    for (; s->visited_stamps[h] == s->stamp; h = (h + 1) & mask)
        if (s->visited_keys[h] == key) return false;
    s->visited_keys[h] = key;
    s->visited_stamps[h] = s->stamp;
    s->visited_used++;
    return true;
}

static void push_pending(em_grammar_state *s, uint32_t position, uint32_t parent) {
    if (!em_grammar_reserve(&s->pending, &s->cap_pending, s->n_pending + 1, sizeof *s->pending)) {
        s->failed = true;
        return;
    }
    s->pending[s->n_pending++] = ((uint64_t)position << 32) | parent;
}

/* One pending (position, parent) of expand: followed through ended alternatives, and to the
 * alternatives of a rule, which are left pending. */
static void expand_one(em_grammar_state *s, uint32_t position, uint32_t parent) {
    const em_grammar *g = s->grammar;
    for (;;) {
        /* A position from which the alternative can never end (it recurses forever) leads to no
         * sentence: leaving it out makes the automaton accept exactly the prefixes of sentences,
         * so a constrained generation never walks into a dead end. The return frames pushed
         * below are finite for the same reason (min_rest[position] counts them). */
        if (s->grammar->min_rest[position] == EM_GRAMMAR_INFINITE || s->failed) return;
        if (!first_visit(s, position, parent)) return;
        uint32_t e = g->elements[position];
        if (EM_ELEMENT_KIND(e) == EM_ELEMENT_BYTES) {
            uint32_t node = intern_node(s, position, parent);
            if (node) push_scratch(s, node);
            return;
        }
        if (EM_ELEMENT_KIND(e) == EM_ELEMENT_END) {
            if (!parent) {
                push_scratch(s, 0); /* the empty stack: the text may end here */
                return;
            }
            position = s->nodes[parent].position;
            parent = s->nodes[parent].parent;
            continue;
        }
        /* A rule: its alternatives, returning to the next element (not pushed when that is the
         * end of this alternative: a tail call, so repetitions do not deepen the stack). */
        uint32_t back = parent;
        if (EM_ELEMENT_KIND(g->elements[position + 1]) != EM_ELEMENT_END) {
            back = intern_node(s, position + 1, parent);
            if (!back) return;
        }
        uint32_t rule = EM_ELEMENT_VALUE(e);
        for (uint32_t a = g->rule_count[rule]; a-- > 0;) push_pending(s, g->alternatives[g->rule_first[rule] + a], back);
        return;
    }
}

/* Adds to the scratch list every stack that continues from `position` with `parent` below: down
 * through rule references to the terminals that can come first, and up through ended
 * alternatives to what follows them. The alternatives of a rule wait on s->pending rather than
 * the thread's stack; the order does not matter, as the scratch list is a set. */
static void expand(em_grammar_state *s, uint32_t position, uint32_t parent) {
    s->n_pending = 0;
    push_pending(s, position, parent);
    while (s->n_pending && !s->failed) {
        const uint64_t next = s->pending[--s->n_pending];
        expand_one(s, (uint32_t)(next >> 32), (uint32_t)next);
    }
}

/* ---- Sets of stacks ---- */

static uint64_t items_hash(const uint32_t *items, size_t n) {
    uint64_t h = n;
    for (size_t i = 0; i < n; i++) h = mix64(h ^ items[i]) + i;
    return h;
}
static uint64_t set_hash(const em_grammar_state *s, uint32_t id) {
    return items_hash(s->set_items + s->set_start[id], s->set_start[id + 1] - s->set_start[id]);
}

static int by_id(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The id of the set in the scratch list (sorted and deduplicated here). */
static uint32_t intern_scratch(em_grammar_state *s) {
    if (s->failed) return EM_GRAMMAR_DEAD;
    qsort(s->scratch, s->n_scratch, sizeof *s->scratch, by_id);
    size_t n = 0;
    for (size_t i = 0; i < s->n_scratch; i++)
        if (!n || s->scratch[i] != s->scratch[n - 1]) s->scratch[n++] = s->scratch[i];
    if (!n) return EM_GRAMMAR_DEAD;
    if (n > MAX_STACKS) {
        s->too_ambiguous = s->failed = true;
        return EM_GRAMMAR_DEAD;
    }
    if ((s->set_table.used + 1) * 2 > s->set_table.cap && !table_grow(&s->set_table, set_hash, s)) goto nomem;
    size_t mask = s->set_table.cap - 1, h = items_hash(s->scratch, n) & mask;
    for (uint32_t id; (id = s->set_table.slots[h]); h = (h + 1) & mask) {
        size_t len = s->set_start[id + 1] - s->set_start[id];
        if (len == n && memcmp(s->set_items + s->set_start[id], s->scratch, n * sizeof *s->scratch) == 0) return id;
    }
    if (!em_grammar_reserve(&s->set_items, &s->cap_set_items, s->n_set_items + n, sizeof *s->set_items) ||
        !em_grammar_reserve(&s->set_start, &s->cap_sets, s->n_sets + 2, sizeof *s->set_start))
        goto nomem;
    memcpy(s->set_items + s->n_set_items, s->scratch, n * sizeof *s->scratch);
    s->n_set_items += n;
    uint32_t id = (uint32_t)s->n_sets++;
    s->set_start[id + 1] = (uint32_t)s->n_set_items;
    s->set_table.slots[h] = id;
    s->set_table.used++;
    return id;
nomem:
    s->failed = true;
    return EM_GRAMMAR_DEAD;
}

/* Forgets every set, transition and mask, keeping the current set (re-interned as set 1). */
static void reset_memo(em_grammar_state *s) {
    size_t n = s->set_start[s->current + 1] - s->set_start[s->current];
    s->n_scratch = 0;
    if (!em_grammar_reserve(&s->scratch, &s->cap_scratch, n, sizeof *s->scratch)) {
        s->failed = true;
        return;
    }
    memcpy(s->scratch, s->set_items + s->set_start[s->current], n * sizeof *s->scratch);
    s->n_scratch = n;
    for (size_t i = 0; i < s->n_sets && i < s->cap_masks; i++) free(s->masks[i]);
    if (s->masks) memset(s->masks, 0, s->cap_masks * sizeof *s->masks);
    s->mask_bytes = 0;
    s->n_set_items = 0;
    s->n_sets = 1; /* set 0, the empty set, stays */
    s->set_start[1] = 0;
    memset(s->set_table.slots, 0, s->set_table.cap * sizeof *s->set_table.slots);
    s->set_table.used = 0;
    memset(s->transition_keys, 0, s->transition_cap * sizeof *s->transition_keys);
    s->transition_used = 0;
    for (size_t i = 0; i < s->cap_rows; i++) free(s->rows[i]);
    if (s->rows) memset(s->rows, 0, s->cap_rows * sizeof *s->rows);
    s->row_bytes = 0;
    s->current = intern_scratch(s);
}

/* The stacks that `set` leads to by `byte`, interned (EM_GRAMMAR_DEAD with s->failed on failure). */
static uint32_t compute_step(em_grammar_state *s, uint32_t set, uint8_t byte) {
    const em_grammar *g = s->grammar;
    s->n_scratch = 0;
    begin_expansion(s);
    for (uint32_t i = s->set_start[set]; i < s->set_start[set + 1]; i++) {
        uint32_t node = s->set_items[i];
        if (!node) continue; /* the empty stack takes no byte */
        uint32_t position = s->nodes[node].position;
        if (em_byte_set_has(&g->byte_sets[EM_ELEMENT_VALUE(g->elements[position])], byte))
            expand(s, position + 1, s->nodes[node].parent);
    }
    return intern_scratch(s);
}

/* The table of `set`'s transitions, made now if it has none and there is room; NULL otherwise. A
 * set gets its table at its first step or never until the memo is reset (the room only shrinks
 * meanwhile), so a set's transitions are all in its table or all in the hash table. */
static uint32_t *transition_row(em_grammar_state *s, uint32_t set) {
    if (set < s->cap_rows && s->rows[set]) return s->rows[set];
    const size_t bytes = 256 * sizeof **s->rows;
    if (s->row_bytes + bytes > MEMO_MAX_ROW_BYTES) return NULL;
    size_t cap = s->cap_rows;
    if (!em_grammar_reserve(&s->rows, &cap, (size_t)set + 1, sizeof *s->rows)) return NULL;
    memset(s->rows + s->cap_rows, 0, (cap - s->cap_rows) * sizeof *s->rows);
    s->cap_rows = cap;
    uint32_t *row = malloc(bytes);
    if (!row) return NULL;
    memset(row, 0xFF, bytes); /* NO_TRANSITION everywhere */
    s->row_bytes += bytes;
    return s->rows[set] = row;
}

uint32_t em_grammar_step(em_grammar_state *s, uint32_t set, uint8_t byte, bool *failed) {
    if (set == EM_GRAMMAR_DEAD) return EM_GRAMMAR_DEAD;
    uint32_t *row = transition_row(s, set);
    if (row) {
        if (row[byte] != NO_TRANSITION) return row[byte];
        const uint32_t next = compute_step(s, set, byte);
        if (s->failed) {
            *failed = true;
            return EM_GRAMMAR_DEAD;
        }
        return s->rows[set][byte] = next;
    }
    uint64_t key = (((uint64_t)set << 8) | byte) + 1;
    if ((s->transition_used + 1) * 2 > s->transition_cap) { /* grow the transition table */
        size_t cap = s->transition_cap ? s->transition_cap * 2 : 4096;
        uint64_t *keys = calloc(cap, sizeof *keys);
        uint32_t *next = malloc(cap * sizeof *next);
        if (!keys || !next) {
            free(keys);
            free(next);
            *failed = s->failed = true;
            return EM_GRAMMAR_DEAD;
        }
        for (size_t i = 0; i < s->transition_cap; i++) {
            if (!s->transition_keys[i]) continue;
            size_t h = mix64(s->transition_keys[i]) & (cap - 1);
            while (keys[h]) h = (h + 1) & (cap - 1);
            keys[h] = s->transition_keys[i];
            next[h] = s->transition_next[i];
        }
        free(s->transition_keys);
        free(s->transition_next);
        s->transition_keys = keys;
        s->transition_next = next;
        s->transition_cap = cap;
    }
    size_t mask = s->transition_cap - 1, h = mix64(key) & mask;
    for (; s->transition_keys[h]; h = (h + 1) & mask)
        if (s->transition_keys[h] == key) return s->transition_next[h];
    const uint32_t next = compute_step(s, set, byte);
    if (s->failed) {
        *failed = true;
        return EM_GRAMMAR_DEAD;
    }
    s->transition_keys[h] = key;
    s->transition_next[h] = next;
    s->transition_used++;
    return next;
}

const char *em_grammar_failure(const em_grammar_state *s) {
    if (!s->failed) return NULL;
    return s->too_ambiguous ? "the grammar is too ambiguous to follow (more than 256 parse stacks at once)" : "out of memory";
}

bool em_grammar_too_ambiguous(const em_grammar_state *s) { return s->failed && s->too_ambiguous; }

uint32_t em_grammar_current(const em_grammar_state *s) { return s->ended ? EM_GRAMMAR_DEAD : s->current; }

bool em_grammar_set_complete(const em_grammar_state *s, uint32_t set) {
    return set != EM_GRAMMAR_DEAD && s->set_start[set + 1] > s->set_start[set] && s->set_items[s->set_start[set]] == 0;
}

/* Orders two stacks of a key (key_context) by their positions, lexicographically. */
typedef struct key_context {
    const uint32_t *words;
} key_context;

static int by_stack(const void *a, const void *b, void *context) {
    const uint32_t *words = ((const key_context *)context)->words;
    const uint32_t *x = words + *(const uint32_t *)a, *y = words + *(const uint32_t *)b;
    for (;; x++, y++) {
        if (*x != *y) return *x < *y ? -1 : 1;
        if (*x == EM_GRAMMAR_KEY_STACK_END) return 0;
    }
}

bool em_grammar_set_key(const em_grammar_state *s, uint32_t set, uint32_t **key, size_t *cap, size_t *len) {
    const uint32_t first = s->set_start[set], n_stacks = s->set_start[set + 1] - first;
    size_t words = 0; /* the stacks' positions, each stack ended by EM_GRAMMAR_KEY_STACK_END */
    for (uint32_t i = 0; i < n_stacks; i++)
        for (uint32_t node = s->set_items[first + i];; node = s->nodes[node].parent) {
            words++;
            if (!node) break;
        }
    /* Room for the stacks as walked, their start offsets, and the sorted copy after *len. */
    uint32_t *scratch = malloc((words + n_stacks) * sizeof *scratch);
    if (!scratch || !em_grammar_reserve(key, cap, *len + 1 + words, sizeof **key)) {
        free(scratch);
        return false;
    }
    uint32_t *walked = scratch, *starts = scratch + words;
    size_t at = 0;
    for (uint32_t i = 0; i < n_stacks; i++) {
        starts[i] = (uint32_t)at;
        for (uint32_t node = s->set_items[first + i]; node; node = s->nodes[node].parent)
            walked[at++] = s->nodes[node].position;
        walked[at++] = EM_GRAMMAR_KEY_STACK_END;
    }
    key_context context = {walked};
    qsort_r(starts, n_stacks, sizeof *starts, by_stack, &context);
    uint32_t *out = *key + *len;
    *out++ = n_stacks;
    for (uint32_t i = 0; i < n_stacks; i++)
        for (const uint32_t *p = walked + starts[i];; p++) {
            *out++ = *p;
            if (*p == EM_GRAMMAR_KEY_STACK_END) break;
        }
    *len += 1 + words;
    free(scratch);
    return true;
}

uint32_t em_grammar_set_at(em_grammar_state *s, uint32_t position) {
    const uint32_t node = intern_node(s, position, 0);
    if (!node) return EM_GRAMMAR_DEAD;
    s->n_scratch = 0;
    push_scratch(s, node);
    return intern_scratch(s);
}

uint32_t em_grammar_set_tops(const em_grammar_state *s, uint32_t set, uint32_t *tops) {
    uint32_t n = 0;
    for (uint32_t i = s->set_start[set]; i < s->set_start[set + 1]; i++)
        if (s->set_items[i]) tops[n++] = s->nodes[s->set_items[i]].position;
    return n;
}

const em_grammar *em_grammar_state_grammar(const em_grammar_state *s) { return s->grammar; }
uint64_t em_grammar_shared_id(const em_grammar_state *s) { return s->shared_grammar; }
void em_grammar_set_shared_id(em_grammar_state *s, uint64_t id) { s->shared_grammar = id; }

const uint32_t *em_grammar_cached_mask(const em_grammar_state *s, uint32_t set, uint32_t *n_allowed) {
    if (set >= s->cap_masks || !s->masks[set]) return NULL;
    *n_allowed = s->mask_allowed[set];
    return s->masks[set];
}

void em_grammar_cache_mask(em_grammar_state *s, uint32_t set, uint32_t *mask, uint32_t n_allowed, size_t bytes) {
    size_t cap = s->cap_masks;
    if (s->mask_bytes + bytes > MEMO_MAX_MASK_BYTES || !em_grammar_reserve(&s->masks, &cap, set + 1, sizeof *s->masks)) {
        free(mask); /* not kept: computed again next time */
        return;
    }
    size_t cap_allowed = s->cap_masks;
    if (!em_grammar_reserve(&s->mask_allowed, &cap_allowed, set + 1, sizeof *s->mask_allowed)) {
        free(mask);
        return;
    }
    memset(s->masks + s->cap_masks, 0, (cap - s->cap_masks) * sizeof *s->masks);
    s->cap_masks = cap;
    free(s->masks[set]);
    s->masks[set] = mask;
    s->mask_allowed[set] = n_allowed;
    s->mask_bytes += bytes;
}

/* ---- The public state ---- */

em_err em_grammar_state_new(const em_grammar *grammar, em_grammar_state **out) {
    *out = NULL;
    em_grammar_state *s = calloc(1, sizeof *s);
    if (!s) return em_errorf(EM_ERR_NOMEM, "grammar: out of memory");
    s->grammar = grammar;
    bool ok = em_grammar_reserve(&s->nodes, &s->cap_nodes, 1, sizeof *s->nodes) &&
              em_grammar_reserve(&s->set_start, &s->cap_sets, 2, sizeof *s->set_start);
    if (ok) {
        s->nodes[0] = (stack_node){0, 0, 0};
        s->n_nodes = 1;
        s->set_start[0] = s->set_start[1] = 0;
        s->n_sets = 1;
        const uint32_t root = grammar->root;
        begin_expansion(s);
        for (uint32_t a = 0; a < grammar->rule_count[root]; a++) expand(s, grammar->alternatives[grammar->rule_first[root] + a], 0);
        s->current = intern_scratch(s);
        ok = !s->failed;
    }
    if (!ok) {
        em_err err = s->too_ambiguous ? em_errorf(EM_ERR_UNSUPPORTED, "grammar: %s", em_grammar_failure(s))
                                      : em_errorf(EM_ERR_NOMEM, "grammar: out of memory for a parse state");
        em_grammar_state_free(s);
        return err;
    }
    *out = s;
    return NULL;
}

void em_grammar_state_free(em_grammar_state *s) {
    if (!s) return;
    for (size_t i = 0; i < s->cap_masks; i++) free(s->masks[i]);
    free(s->masks);
    free(s->mask_allowed);
    free(s->nodes);
    free(s->node_table.slots);
    free(s->set_items);
    free(s->set_start);
    free(s->set_table.slots);
    free(s->transition_keys);
    free(s->transition_next);
    for (size_t i = 0; i < s->cap_rows; i++) free(s->rows[i]);
    free(s->rows);
    free(s->scratch);
    free(s->pending);
    free(s->visited_keys);
    free(s->visited_stamps);
    free(s);
}

/* Called between steps: drops the memo when it grew past its bounds. */
static void keep_memo_bounded(em_grammar_state *s) {
    if (s->n_set_items > MEMO_MAX_SET_ITEMS) reset_memo(s);
}

bool em_grammar_accept_bytes(em_grammar_state *s, const void *bytes, size_t len) {
    if (s->ended) return len == 0;
    keep_memo_bounded(s);
    uint32_t set = s->current;
    bool failed = false;
    for (size_t i = 0; i < len && set != EM_GRAMMAR_DEAD; i++) set = em_grammar_step(s, set, ((const uint8_t *)bytes)[i], &failed);
    if (set == EM_GRAMMAR_DEAD) return false;
    s->current = set;
    return true;
}

void em_grammar_accept_end(em_grammar_state *s) { s->ended = true; }

bool em_grammar_complete(const em_grammar_state *s) { return !s->ended && em_grammar_set_complete(s, s->current); }

bool em_grammar_can_continue(const em_grammar_state *s) {
    if (s->ended) return false;
    uint32_t n = s->set_start[s->current + 1] - s->set_start[s->current];
    return n > (em_grammar_set_complete(s, s->current) ? 1u : 0u);
}

void em_grammar_next_bytes(em_grammar_state *s, bool allowed[256]) {
    bool failed = false;
    keep_memo_bounded(s);
    for (unsigned b = 0; b < 256; b++) allowed[b] = em_grammar_step(s, em_grammar_current(s), (uint8_t)b, &failed) != EM_GRAMMAR_DEAD;
}

/* The fewest bytes that finish set `set`: over its stacks, the rest of each frame's alternative. */
static uint32_t set_bytes_to_complete(const em_grammar_state *s, uint32_t set) {
    uint32_t best = EM_GRAMMAR_INFINITE;
    for (uint32_t i = s->set_start[set]; i < s->set_start[set + 1]; i++)
        if (s->nodes[s->set_items[i]].to_complete < best) best = s->nodes[s->set_items[i]].to_complete;
    return best;
}

uint32_t em_grammar_bytes_to_complete(const em_grammar_state *s) {
    return s->ended ? 0 : set_bytes_to_complete(s, s->current);
}

em_err em_grammar_generate(const em_grammar *grammar, uint64_t seed, size_t soft_limit, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    em_grammar_state *s;
    em_err err = em_grammar_state_new(grammar, &s);
    if (err) return err;
    char *out = NULL;
    size_t n = 0, cap = 0;
    uint64_t random = seed;
    for (;;) {
        uint8_t choices[256];
        size_t n_choices = 0;
        const bool finishing = n >= soft_limit;
        const uint32_t here = finishing ? set_bytes_to_complete(s, s->current) : 0;
        for (unsigned b = 0; b < 256; b++) {
            bool failed = false;
            uint32_t next = em_grammar_step(s, s->current, (uint8_t)b, &failed);
            if (next == EM_GRAMMAR_DEAD) continue;
            if (finishing && set_bytes_to_complete(s, next) >= here) continue;
            choices[n_choices++] = (uint8_t)b;
        }
        random = mix64(random + UINT64_C(0x9E3779B97F4A7C15));
        const bool complete = em_grammar_set_complete(s, s->current);
        if (complete && (finishing || !n_choices || random % 8 == 0)) break;
        if (!n_choices || s->failed) {
            err = s->failed ? em_errorf(s->too_ambiguous ? EM_ERR_UNSUPPORTED : EM_ERR_NOMEM, "grammar: %s", em_grammar_failure(s))
                            : em_errorf(EM_ERR_INTERNAL, "grammar: generation reached a state it cannot finish");
            break;
        }
        uint8_t byte = choices[(random >> 16) % n_choices];
        if (!em_grammar_reserve(&out, &cap, n + 2, 1)) {
            err = em_errorf(EM_ERR_NOMEM, "grammar: out of memory");
            break;
        }
        out[n++] = (char)byte;
        em_grammar_accept_bytes(s, &byte, 1);
    }
    em_grammar_state_free(s);
    if (!err && !em_grammar_reserve(&out, &cap, n + 1, 1)) err = em_errorf(EM_ERR_NOMEM, "grammar: out of memory");
    if (err) {
        free(out);
        return err;
    }
    out[n] = '\0';
    *text = out;
    *len = n;
    return NULL;
}
