/* Token masks (grammar.h): the vocabulary's byte strings in a trie, walked against the automaton. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A trie node: the byte that leads to it, its children (contiguous), and the tokens whose bytes
 * end exactly here (a range of `token_ids`). */
typedef struct trie_node {
    uint32_t first_child;
    uint32_t first_token;
    uint32_t n_tokens;
    uint32_t parent;    /* the node above (the root's is itself) */
    uint16_t n_children;
    uint8_t byte;
} trie_node;

struct em_grammar_vocab {
    uint32_t n_tokens;
    uint8_t *bytes;         /* every token's bytes, back to back */
    uint32_t *piece_start;  /* token t is bytes[piece_start[t] .. piece_start[t + 1]) */
    bool *is_end;           /* end-of-generation tokens */
    uint32_t *end_tokens;
    uint32_t n_end_tokens;
    uint32_t *token_ids;    /* tokens with bytes, sorted by their bytes (the trie's order) */
    uint32_t max_len;       /* the longest token's bytes */
    trie_node *nodes;       /* node 0 is the root */
    size_t n_nodes, cap_nodes;
};

static int by_bytes(const void *a, const void *b, void *context) {
    const em_grammar_vocab *v = context;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    uint32_t lx = v->piece_start[x + 1] - v->piece_start[x], ly = v->piece_start[y + 1] - v->piece_start[y];
    int c = memcmp(v->bytes + v->piece_start[x], v->bytes + v->piece_start[y], lx < ly ? lx : ly);
    if (c) return c;
    return lx < ly ? -1 : lx > ly ? 1 : (x < y ? -1 : x > y);
}

static uint32_t piece_len(const em_grammar_vocab *v, uint32_t t) { return v->piece_start[t + 1] - v->piece_start[t]; }

/* Fills node `at` from token_ids[lo..hi), which all share their first `depth` bytes. */
static bool build_node(em_grammar_vocab *v, size_t at, uint32_t lo, uint32_t hi, uint32_t depth) {
    uint32_t i = lo;
    while (i < hi && piece_len(v, v->token_ids[i]) == depth) i++; /* the shorter ones sort first */
    v->nodes[at].first_token = lo;
    v->nodes[at].n_tokens = i - lo;
    uint32_t groups = 0;
    for (uint32_t j = i; j < hi; j++)
        if (j == i || v->bytes[v->piece_start[v->token_ids[j]] + depth] != v->bytes[v->piece_start[v->token_ids[j - 1]] + depth])
            groups++;
    if (!em_grammar_reserve(&v->nodes, &v->cap_nodes, v->n_nodes + groups, sizeof *v->nodes)) return false;
    size_t first = v->n_nodes;
    v->n_nodes += groups;
    v->nodes[at].first_child = (uint32_t)first;
    v->nodes[at].n_children = (uint16_t)groups;
    size_t child = first;
    for (uint32_t j = i; j < hi;) {
        uint8_t byte = v->bytes[v->piece_start[v->token_ids[j]] + depth];
        uint32_t end = j;
        while (end < hi && v->bytes[v->piece_start[v->token_ids[end]] + depth] == byte) end++;
        memset(&v->nodes[child], 0, sizeof v->nodes[child]);
        v->nodes[child].byte = byte;
        v->nodes[child].parent = (uint32_t)at;
        if (!build_node(v, child, j, end, depth + 1)) return false;
        child++;
        j = end;
    }
    return true;
}

em_err em_grammar_vocab_from_pieces(const char *const *pieces, const size_t *lens, const bool *is_end,
                                    uint32_t n_tokens, em_grammar_vocab **out) {
    *out = NULL;
    em_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return em_errorf(EM_ERR_NOMEM, "grammar: out of memory for a vocabulary");
    v->n_tokens = n_tokens;
    size_t total = 0;
    for (uint32_t t = 0; t < n_tokens; t++) total += is_end && is_end[t] ? 0 : lens[t];
    v->bytes = malloc(total ? total : 1);
    v->piece_start = malloc(((size_t)n_tokens + 1) * sizeof *v->piece_start);
    v->is_end = calloc(n_tokens ? n_tokens : 1, sizeof *v->is_end);
    v->end_tokens = malloc((n_tokens ? n_tokens : 1) * sizeof *v->end_tokens);
    v->token_ids = malloc((n_tokens ? n_tokens : 1) * sizeof *v->token_ids);
    bool ok = v->bytes && v->piece_start && v->is_end && v->end_tokens && v->token_ids && total < UINT32_MAX &&
              em_grammar_reserve(&v->nodes, &v->cap_nodes, 1, sizeof *v->nodes);
    if (ok) {
        uint32_t at = 0, n_with_bytes = 0;
        for (uint32_t t = 0; t < n_tokens; t++) {
            v->piece_start[t] = at;
            if (is_end && is_end[t]) { /* its bytes, if any, never count: it ends the text */
                v->is_end[t] = true;
                v->end_tokens[v->n_end_tokens++] = t;
                continue;
            }
            memcpy(v->bytes + at, pieces[t], lens[t]);
            at += (uint32_t)lens[t];
            if (lens[t]) v->token_ids[n_with_bytes++] = t;
            if (lens[t] > v->max_len) v->max_len = (uint32_t)lens[t];
        }
        v->piece_start[n_tokens] = at;
        qsort_r(v->token_ids, n_with_bytes, sizeof *v->token_ids, by_bytes, v);
        memset(&v->nodes[0], 0, sizeof v->nodes[0]);
        v->n_nodes = 1;
        ok = build_node(v, 0, 0, n_with_bytes, 0);
    }
    if (!ok) {
        em_grammar_vocab_free(v);
        return em_errorf(EM_ERR_NOMEM, "grammar: out of memory for a vocabulary of %u tokens", n_tokens);
    }
    *out = v;
    return NULL;
}

static bool listed(const int32_t *ids, size_t n, int32_t id) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

em_err em_grammar_vocab_new(const em_tokenizer *tokenizer, uint32_t n_tokens, const int32_t *text_controls,
                            size_t n_text_controls, em_grammar_vocab **out) {
    const char **pieces = malloc((n_tokens ? n_tokens : 1) * sizeof *pieces);
    size_t *lens = malloc((n_tokens ? n_tokens : 1) * sizeof *lens);
    bool *is_end = malloc((n_tokens ? n_tokens : 1) * sizeof *is_end);
    em_err err = NULL;
    if (!pieces || !lens || !is_end) err = em_errorf(EM_ERR_NOMEM, "grammar: out of memory for a vocabulary");
    for (uint32_t t = 0; !err && t < n_tokens; t++) {
        const bool in_vocab = t < (uint32_t)em_tokenizer_n_vocab(tokenizer);
        is_end[t] = in_vocab && em_tokenizer_is_eog(tokenizer, (int32_t)t);
        const bool as_text = in_vocab && !is_end[t] && em_tokenizer_is_control(tokenizer, (int32_t)t) &&
                             listed(text_controls, n_text_controls, (int32_t)t);
        lens[t] = in_vocab ? em_token_to_piece(tokenizer, (int32_t)t, as_text, &pieces[t]) : 0;
        if (!lens[t]) pieces[t] = "";
    }
    if (!err) err = em_grammar_vocab_from_pieces(pieces, lens, is_end, n_tokens, out);
    free(pieces);
    free(lens);
    free(is_end);
    return err;
}

void em_grammar_mask_drop_ends(const em_grammar_vocab *v, uint32_t *mask, uint32_t *n_allowed) {
    for (uint32_t i = 0; i < v->n_end_tokens; i++) {
        const uint32_t t = v->end_tokens[i], bit = 1u << (t & 31);
        if (mask[t >> 5] & bit) mask[t >> 5] &= ~bit, (*n_allowed)--;
    }
}

void em_grammar_vocab_free(em_grammar_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->piece_start);
    free(v->is_end);
    free(v->end_tokens);
    free(v->token_ids);
    free(v->nodes);
    free(v);
}

uint32_t em_grammar_vocab_size(const em_grammar_vocab *v) { return v->n_tokens; }

bool em_grammar_accept_token(em_grammar_state *s, const em_grammar_vocab *v, int32_t token) {
    if (token < 0 || (uint32_t)token >= v->n_tokens) return false;
    if (v->is_end[token]) {
        if (!em_grammar_complete(s)) return false;
        em_grammar_accept_end(s);
        return true;
    }
    uint32_t len = piece_len(v, (uint32_t)token);
    return len && em_grammar_accept_bytes(s, v->bytes + v->piece_start[token], len);
}

typedef struct mask_walk {
    em_grammar_state *state;
    const em_grammar_vocab *vocab;
    uint32_t *mask;
    uint32_t n_allowed;
    bool failed;
} mask_walk;

/* Allows every token below `node` that the automaton, in `set` after the node's bytes, accepts;
 * a child whose byte kills the state is skipped with its whole subtree. */
static void walk(mask_walk *w, const trie_node *node, uint32_t set) {
    const em_grammar_vocab *v = w->vocab;
    for (uint32_t c = 0; c < node->n_children; c++) {
        const trie_node *child = &v->nodes[node->first_child + c];
        uint32_t next = em_grammar_step(w->state, set, child->byte, &w->failed);
        if (next == EM_GRAMMAR_DEAD) continue;
        for (uint32_t i = 0; i < child->n_tokens; i++) {
            uint32_t t = v->token_ids[child->first_token + i];
            w->mask[t >> 5] |= 1u << (t & 31);
        }
        w->n_allowed += child->n_tokens;
        if (child->n_children) walk(w, child, next);
    }
}

/* ---- Position tables (internal.h) ---- */

typedef struct table_walk {
    em_grammar_state *probe;
    const em_grammar_vocab *vocab;
    em_position_table *table;
    size_t cap_accepted, cap_uncertain;
    bool failed;
} table_walk;

static bool add_accepted(table_walk *w, uint32_t first, uint32_t end) {
    em_position_table *t = w->table;
    if (!em_grammar_reserve(&t->accepted, &w->cap_accepted, t->n_accepted + (end - first), sizeof *t->accepted))
        return false;
    for (uint32_t i = first; i < end; i++) t->accepted[t->n_accepted++] = w->vocab->token_ids[i];
    return true;
}

static bool add_uncertain(table_walk *w, uint32_t node) {
    em_position_table *t = w->table;
    if (!em_grammar_reserve(&t->uncertain, &w->cap_uncertain, t->n_uncertain + 1, sizeof *t->uncertain)) return false;
    t->uncertain[t->n_uncertain++] = node;
    return true;
}

/* Classifies the tokens below `node` from `set`; `left`: a path has already left the position's
 * rules with bytes still to read (the empty stack was in a set after the first byte), so what
 * the walk here rejects, the stack below may still take. */
static void classify(table_walk *w, const trie_node *node, uint32_t set, bool left) {
    const em_grammar_vocab *v = w->vocab;
    for (uint32_t c = 0; c < node->n_children && !w->failed; c++) {
        const trie_node *child = &v->nodes[node->first_child + c];
        const uint32_t next = em_grammar_step(w->probe, set, child->byte, &w->failed);
        const uint32_t own_end = child->first_token + child->n_tokens;
        if (next != EM_GRAMMAR_DEAD) {
            if (!add_accepted(w, child->first_token, own_end)) w->failed = true;
            if (child->n_children) classify(w, child, next, left || em_grammar_set_complete(w->probe, next));
        } else if (left && !add_uncertain(w, node->first_child + c)) {
            w->failed = true; /* the whole subtree is the stack below's to decide */
        }
    }
}

bool em_grammar_position_table(em_grammar_state *probe, const em_grammar_vocab *v, uint32_t position,
                               em_position_table *out) {
    memset(out, 0, sizeof *out);
    table_walk w = {.probe = probe, .vocab = v, .table = out};
    const uint32_t start = em_grammar_set_at(probe, position);
    w.failed = start == EM_GRAMMAR_DEAD || em_grammar_failure(probe);
    if (!w.failed) classify(&w, &v->nodes[0], start, false);
    const size_t words = ((size_t)v->n_tokens + 31) / 32;
    if (!w.failed && out->n_accepted > words) { /* many: a bitset is smaller and quicker to apply */
        uint32_t *bits = calloc(words, sizeof *bits);
        if (!bits) w.failed = true;
        for (uint32_t i = 0; bits && i < out->n_accepted; i++)
            bits[out->accepted[i] >> 5] |= 1u << (out->accepted[i] & 31);
        free(out->accepted);
        out->accepted = bits;
        out->accepted_bits = true;
    }
    if (w.failed) em_grammar_position_table_clear(out);
    return !w.failed;
}

void em_grammar_position_table_clear(em_position_table *t) {
    free(t->accepted);
    free(t->uncertain);
    memset(t, 0, sizeof *t);
}

size_t em_grammar_position_table_bytes(const em_position_table *t) {
    const size_t listed = t->accepted_bits ? 0 : (size_t)t->n_accepted * sizeof *t->accepted;
    return sizeof *t + (size_t)t->n_uncertain * sizeof *t->uncertain + listed;
}

static int by_value(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The last path followed down the trie from the root, with the set reached at each of its nodes. */
typedef struct trie_path {
    uint32_t *nodes, *sets; /* nodes[0] is the root, sets[0] the set the mask is for */
    uint32_t depth;         /* nodes known */
    uint32_t *chain;        /* scratch: a node's ancestors below the known path */
} trie_path;

/* The set reached by the bytes that lead to trie node `node` (EM_GRAMMAR_DEAD when they do not),
 * stepping only below the deepest node of the known path that is also above this one; the path
 * then leads to `node`. */
static uint32_t set_at_node(em_grammar_state *s, const em_grammar_vocab *v, trie_path *p, uint32_t node, bool *failed) {
    uint32_t n = 0; /* the node's ancestors up to one on the known path, deepest first (the root always is) */
    for (uint32_t at = node;; at = v->nodes[at].parent) {
        uint32_t depth = 0;
        while (depth < p->depth && p->nodes[depth] != at) depth++;
        if (depth < p->depth) {
            p->depth = depth + 1; /* keep the shared part, then extend it */
            break;
        }
        p->chain[n++] = at;
    }
    uint32_t *chain = p->chain;
    while (n--) {
        const uint32_t at = chain[n], from = p->sets[p->depth - 1];
        p->nodes[p->depth] = at;
        p->sets[p->depth] = em_grammar_step(s, from, v->nodes[at].byte, failed); /* DEAD stays DEAD */
        p->depth++;
    }
    return p->sets[p->depth - 1];
}

/* The mask of `set` from its stacks' position tables: their accepted tokens, and those of their
 * uncertain subtrees that the set accepts, each walked like the whole trie from the set its bytes
 * lead to (siblings share their parent's steps). False: a table could not be had or memory ran
 * out (the caller walks the trie instead); *failed when the state itself failed. */
static bool mask_from_tables(em_grammar_state *s, const em_grammar_vocab *v, em_grammar_masks *shared, uint32_t set,
                             uint32_t *mask, bool *failed) {
    uint32_t tops[256];
    uint32_t n_tops = em_grammar_set_tops(s, set, tops);
    qsort(tops, n_tops, sizeof *tops, by_value);
    const em_position_table *tables[256];
    size_t n_tables = 0, n_roots = 0;
    bool all = true; /* every position is asked for, so that each counts this parse state */
    for (uint32_t i = 0; i < n_tops; i++) {
        if (i && tops[i] == tops[i - 1]) continue;
        all = (tables[n_tables] = em_grammar_masks_table(shared, s, tops[i])) && all;
        if (tables[n_tables]) n_roots += tables[n_tables]->n_uncertain;
        n_tables++;
    }
    if (!all) return false;
    const size_t words = ((size_t)v->n_tokens + 31) / 32;
    uint32_t *roots = malloc((n_roots ? n_roots : 1) * sizeof *roots);
    const size_t deepest = (size_t)v->max_len + 1;
    trie_path path = {.nodes = malloc(deepest * sizeof *path.nodes), .sets = malloc(deepest * sizeof *path.sets),
                      .chain = malloc(deepest * sizeof *path.chain), .depth = 1};
    if (!roots || !path.nodes || !path.sets || !path.chain) {
        free(roots);
        free(path.nodes);
        free(path.sets);
        free(path.chain);
        return false;
    }
    n_roots = 0;
    for (size_t k = 0; k < n_tables; k++) {
        const em_position_table *t = tables[k];
        if (t->accepted_bits)
            for (size_t i = 0; i < words; i++) mask[i] |= t->accepted[i];
        else
            for (uint32_t i = 0; i < t->n_accepted; i++) mask[t->accepted[i] >> 5] |= 1u << (t->accepted[i] & 31);
        if (t->n_uncertain) memcpy(roots + n_roots, t->uncertain, t->n_uncertain * sizeof *roots);
        n_roots += t->n_uncertain;
    }
    if (n_tables > 1) qsort(roots, n_roots, sizeof *roots, by_value);
    path.nodes[0] = 0;
    path.sets[0] = set;
    mask_walk w = {.state = s, .vocab = v, .mask = mask};
    for (size_t i = 0; i < n_roots && !w.failed; i++) {
        if (i && roots[i] == roots[i - 1]) continue;
        const uint32_t here = set_at_node(s, v, &path, roots[i], &w.failed);
        if (here == EM_GRAMMAR_DEAD) continue;
        const trie_node *node = &v->nodes[roots[i]];
        for (uint32_t k = 0; k < node->n_tokens; k++) {
            const uint32_t token = v->token_ids[node->first_token + k];
            mask[token >> 5] |= 1u << (token & 31);
        }
        if (node->n_children) walk(&w, node, here);
    }
    *failed = *failed || w.failed;
    free(roots);
    free(path.nodes);
    free(path.sets);
    free(path.chain);
    return true;
}

static uint32_t count_bits(const uint32_t *mask, size_t words) {
    uint32_t n = 0;
    for (size_t i = 0; i < words; i++) n += (uint32_t)__builtin_popcount(mask[i]);
    return n;
}

/* Keeps a copy of the mask in the state's own memo (a copy of the state's set costs a memcpy). */
static void keep_in_state(em_grammar_state *s, uint32_t set, const uint32_t *mask, uint32_t n_allowed, size_t words) {
    uint32_t *copy = malloc(words * sizeof *copy);
    if (!copy) return;
    memcpy(copy, mask, words * sizeof *copy);
    em_grammar_cache_mask(s, set, copy, n_allowed, words * sizeof *copy);
}

em_err em_grammar_mask_shared(em_grammar_state *s, const em_grammar_vocab *v, em_grammar_masks *shared, uint32_t *mask,
                              uint32_t *n_allowed) {
    const size_t words = ((size_t)v->n_tokens + 31) / 32;
    const uint32_t set = em_grammar_current(s);
    const uint32_t *cached = em_grammar_cached_mask(s, set, n_allowed);
    if (cached) {
        memcpy(mask, cached, words * sizeof *mask);
        return NULL;
    }
    if (shared && (set == EM_GRAMMAR_DEAD || em_grammar_masks_vocab(shared) != v)) shared = NULL;
    if (shared && (cached = em_grammar_masks_find(shared, s, set, n_allowed))) {
        memcpy(mask, cached, words * sizeof *mask);
        keep_in_state(s, set, mask, *n_allowed, words);
        return NULL;
    }
    memset(mask, 0, words * sizeof *mask);
    mask_walk w = {.state = s, .vocab = v, .mask = mask};
    if (shared && mask_from_tables(s, v, shared, set, mask, &w.failed)) {
        w.n_allowed = count_bits(mask, words);
    } else if (set != EM_GRAMMAR_DEAD) {
        memset(mask, 0, words * sizeof *mask);
        walk(&w, &v->nodes[0], set);
    }
    if (w.failed) {
        const char *why = em_grammar_failure(s);
        return em_errorf(why && strcmp(why, "out of memory") ? EM_ERR_UNSUPPORTED : EM_ERR_NOMEM, "grammar: %s",
                         why ? why : "out of memory");
    }
    if (em_grammar_set_complete(s, set)) {
        for (uint32_t i = 0; i < v->n_end_tokens; i++) mask[v->end_tokens[i] >> 5] |= 1u << (v->end_tokens[i] & 31);
        w.n_allowed += v->n_end_tokens;
    }
    *n_allowed = w.n_allowed;
    keep_in_state(s, set, mask, w.n_allowed, words);
    if (shared) em_grammar_masks_store(shared, mask, w.n_allowed);
    return NULL;
}

em_err em_grammar_mask(em_grammar_state *s, const em_grammar_vocab *v, uint32_t *mask, uint32_t *n_allowed) {
    return em_grammar_mask_shared(s, v, NULL, mask, n_allowed);
}
