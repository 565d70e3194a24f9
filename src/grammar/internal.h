/* grammar internals shared by parse.c (the compiler), state.c (the automaton) and vocab.c (the token
 * trie and masks). See grammar.h for the design. */
#ifndef EMBER_GRAMMAR_INTERNAL_H
#define EMBER_GRAMMAR_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

/* An element is one uint32: its kind in the top two bits, its value (a byte-set index or a rule
 * id) below. An alternative is a run of elements ended by EM_ELEMENT_END. */
enum { EM_ELEMENT_END = 0, EM_ELEMENT_BYTES = 1, EM_ELEMENT_RULE = 2 };
#define EM_ELEMENT(kind, value) (((uint32_t)(kind) << 30) | (uint32_t)(value))
#define EM_ELEMENT_KIND(e) ((e) >> 30)
#define EM_ELEMENT_VALUE(e) ((e) & 0x3FFFFFFFu)

#define EM_GRAMMAR_INFINITE UINT32_MAX

/* 256 bits: which byte values a terminal accepts. */
typedef struct em_byte_set {
    uint32_t bits[8];
} em_byte_set;

static inline bool em_byte_set_has(const em_byte_set *set, uint8_t byte) {
    return (set->bits[byte >> 5] >> (byte & 31)) & 1u;
}

struct em_grammar {
    uint32_t *elements; /* every alternative of every rule, each ended by END */
    uint32_t n_elements;
    em_byte_set *byte_sets;
    uint32_t n_byte_sets;
    uint32_t *alternatives; /* start position of each alternative, grouped by rule */
    uint32_t *rule_first;   /* per rule: index of its first alternative in `alternatives` */
    uint32_t *rule_count;   /* per rule: how many alternatives */
    char **rule_names;
    uint32_t n_rules;
    uint32_t root;
    /* Per element position: the fewest bytes from that position to the end of its alternative
     * (EM_GRAMMAR_INFINITE when the rest cannot be finished). */
    uint32_t *min_rest;
    uint32_t *rule_min; /* per rule: its fewest bytes (0: it can be empty) */
    atomic_uint refs;   /* em_grammar_retain / em_grammar_free */
};

/* ---- The automaton (state.c), used by the mask walk ---- */

/* The empty set of stacks: a dead state. */
#define EM_GRAMMAR_DEAD 0u

/* The state reached from interned set `set` by `byte` (EM_GRAMMAR_DEAD when none); memoized.
 * EM_GRAMMAR_DEAD too when memory runs out, with *failed set. */
uint32_t em_grammar_step(em_grammar_state *state, uint32_t set, uint8_t byte, bool *failed);
/* The interned set the state is in now. */
uint32_t em_grammar_current(const em_grammar_state *state);
/* True when the set contains the empty stack. */
bool em_grammar_set_complete(const em_grammar_state *state, uint32_t set);
/* The cached mask of a set, or NULL; and storing one (the state takes `mask`, malloc'd). */
const uint32_t *em_grammar_cached_mask(const em_grammar_state *state, uint32_t set, uint32_t *n_allowed);
void em_grammar_cache_mask(em_grammar_state *state, uint32_t set, uint32_t *mask, uint32_t n_allowed, size_t bytes);
/* The set's stacks written after (*key)[*len], the same for equal sets of any state of an equal
 * grammar (node ids differ between states; positions do not): the number of stacks, then each
 * stack's positions from the top down, ended by EM_GRAMMAR_KEY_STACK_END, the stacks in sorted
 * order. *key grows as needed (capacity *cap); *len moves past what was written. False when out of
 * memory. */
#define EM_GRAMMAR_KEY_STACK_END UINT32_MAX
bool em_grammar_set_key(const em_grammar_state *state, uint32_t set, uint32_t **key, size_t *cap, size_t *len);
const em_grammar *em_grammar_state_grammar(const em_grammar_state *state);
/* The state's grammar id in a shared mask cache (0: not looked up yet), kept by the cache. */
uint64_t em_grammar_shared_id(const em_grammar_state *state);
void em_grammar_set_shared_id(em_grammar_state *state, uint64_t id);
/* Marks the end of the text as accepted (an end-of-generation token): nothing follows. */
void em_grammar_accept_end(em_grammar_state *state);

/* The interned set {(position, empty stack)}: one stack at `position` (a terminal) with nothing
 * below it, the start of a position table's walk. EM_GRAMMAR_DEAD when out of memory. */
uint32_t em_grammar_set_at(em_grammar_state *state, uint32_t position);
/* Writes the top positions of the set's stacks other than the empty one (at most 256) to tops[];
 * returns how many. */
uint32_t em_grammar_set_tops(const em_grammar_state *state, uint32_t set, uint32_t *tops);

/* ---- Position tables (vocab.c) ----
 * What a stack whose top is at `position` accepts, whatever lies below it: walking the vocabulary
 * from that position alone (the stack below left empty), a token is accepted when it is consumed
 * inside the position's own rules (or ends exactly where they end: then the stack below takes
 * over with nothing left to read, which every stack below allows); it is uncertain when some path
 * leaves the position's rules with bytes left (the stack below decides); otherwise it is rejected
 * by any stack. A parse state's mask is the union over its stacks, so it is the union of its
 * stacks' accepted tokens plus those of their uncertain tokens that the state itself accepts. */
typedef struct em_position_table {
    uint32_t *accepted; /* token ids, or a bitset of the vocabulary when accepted_bits */
    uint32_t n_accepted;
    bool accepted_bits;
    uint32_t *uncertain; /* the uncertain tokens, as trie nodes whose whole subtrees they are (ascending) */
    uint32_t n_uncertain;
} em_position_table;

/* Builds the table of `position` with `probe`, a parse state of the same grammar kept for such
 * walks (its memo is shared by all positions). False when out of memory or the probe failed. */
bool em_grammar_position_table(em_grammar_state *probe, const em_grammar_vocab *vocab, uint32_t position,
                               em_position_table *out);
void em_grammar_position_table_clear(em_position_table *table);
size_t em_grammar_position_table_bytes(const em_position_table *table);

/* ---- The shared mask cache (cache.c) ---- */

/* The mask of the state's set `set` in the cache, or NULL; the key it looked for is kept for the
 * next em_grammar_masks_store, which files a mask computed for that same set under it. */
const uint32_t *em_grammar_masks_find(em_grammar_masks *cache, em_grammar_state *state, uint32_t set,
                                      uint32_t *n_allowed);
void em_grammar_masks_store(em_grammar_masks *cache, const uint32_t *mask, uint32_t n_allowed);
const em_grammar_vocab *em_grammar_masks_vocab(const em_grammar_masks *cache);
/* The position table of `position` in the state's grammar (which em_grammar_masks_find has just
 * looked up), kept with the grammar; built when a mask asks for it the second time (NULL the first
 * time, and when out of memory). */
const em_position_table *em_grammar_masks_table(em_grammar_masks *cache, em_grammar_state *state, uint32_t position);

/* ---- Watched compilation (watch.c) ----
 * The work of one compilation, counted so that its em_grammar_watch is asked every
 * EM_GRAMMAR_WATCH_EVERY units (a rule, an element, a schema node) rather than at each. */
#define EM_GRAMMAR_WATCH_EVERY 4096u
typedef enum { EM_GRAMMAR_GOING = 0, EM_GRAMMAR_STOPPED, EM_GRAMMAR_OUT_OF_TIME } em_grammar_verdict;
typedef struct em_grammar_budget {
    const em_grammar_watch *watch; /* NULL: unwatched */
    uint32_t spent;
    em_grammar_verdict verdict;
} em_grammar_budget;

/* Asks the watch when its turn comes; false (and for good) once it said to stop or time is up. */
bool em_grammar_budget_check(em_grammar_budget *budget);
static inline bool em_grammar_budget_spend(em_grammar_budget *budget) {
    if (!budget || !budget->watch) return true;
    if (budget->verdict) return false;
    if (++budget->spent % EM_GRAMMAR_WATCH_EVERY) return true;
    return em_grammar_budget_check(budget);
}
/* The error of a budget that ran out (EM_ERR_RANGE for time, EM_ERR_IO for a stop). */
em_err em_grammar_budget_error(const em_grammar_budget *budget);

/* em_grammar_compile and em_grammar_from_json_schema under a budget (NULL: unwatched); `checked`
 * also makes the start state, as em_grammar_compile_checked. */
em_err em_grammar_compile_budgeted(const char *gbnf, size_t len, em_grammar_budget *budget, bool checked,
                                   em_grammar **out);
em_err em_grammar_schema_budgeted(const char *schema, size_t len, em_grammar_budget *budget, char **gbnf);
/* The memory a compiled grammar holds. */
size_t em_grammar_bytes(const em_grammar *grammar);

/* ---- Small helpers ---- */

/* Makes room for `need` items of `size` bytes in *array (capacity *cap, doubled as needed). */
bool em_grammar_reserve(void *array_ptr, size_t *cap, size_t need, size_t size);

/* Appends the UTF-8 encoding of code point `cp` (< 0x110000) to `out` (4 bytes room); returns its length. */
size_t em_grammar_utf8_encode(uint32_t cp, uint8_t *out);

#endif
