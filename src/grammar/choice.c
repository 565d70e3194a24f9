/* A choice among UTF-8 strings, written as GBNF rules of a trie (schema.h), so that the automaton
 * follows it with one parse stack per distinct next character rather than one per string: an
 * `enum` of 10,000 values, or the names of an object's 10,000 optional properties, stay far below
 * the parse-stack bound (grammar.h's EM_GRAMMAR_MAX_STACKS). Edges are whole characters, as GBNF
 * literals are made of characters (a lead byte alone cannot be written in one).
 *
 * The trie is persistent: inserting a string copies the nodes on its path and shares the rest,
 * so each version stays valid. An object's members k.. are a choice among the names that may come
 * next there (the optional ones up to the next required one), one version per k, sharing nodes
 * between versions; each string's end leads to a rule of the caller (what follows that name), or
 * ends the choice. Nodes with one edge and no end are written inside their parent's literal, so a
 * version costs rules only where strings branch. Everything is iterative: the strings come from
 * requests and may be long. */
#include <stdlib.h>
#include <string.h>

#include "schema.h"

typedef struct trie_edge {
    uint32_t character; /* its UTF-8 bytes, the first in the low byte, so that order is byte order within a length */
    uint8_t len;        /* 1 to 4 bytes */
    uint32_t child;
} trie_edge;

typedef struct trie_node {
    trie_edge *edges; /* sorted by character */
    uint32_t n_edges;
    int32_t end;   /* -1: no string ends here; else the index of its continuation in `ends` (0: none) */
    uint32_t rule; /* the rule number once written (0: not yet) */
} trie_node;

struct em_schema_choice {
    trie_node *nodes; /* node 0 is the empty trie's root, never changed */
    size_t n_nodes, cap_nodes;
    char **ends; /* continuation rule names; ends[0] is NULL: the choice ends */
    size_t n_ends, cap_ends;
    char prefix[48];    /* rule names are prefix, "n" and the node's rule number */
    unsigned next_rule; /* the last rule number given */
};

static bool reserve(void *array_ptr, size_t *cap, size_t need, size_t size) {
    void **array = array_ptr;
    if (need <= *cap) return true;
    size_t grown = *cap ? *cap * 2 : 64;
    while (grown < need) grown *= 2;
    void *p = realloc(*array, grown * size);
    if (!p) return false;
    *array = p;
    *cap = grown;
    return true;
}

em_schema_choice *em_schema_choice_new(em_schema_writer *w, const char *stem) {
    em_schema_choice *c = calloc(1, sizeof *c);
    if (!c || !reserve(&c->nodes, &c->cap_nodes, 1, sizeof *c->nodes) || !reserve(&c->ends, &c->cap_ends, 1, sizeof *c->ends)) {
        em_schema_choice_free(c);
        return NULL;
    }
    c->nodes[0] = (trie_node){.end = -1};
    c->n_nodes = 1;
    c->ends[0] = NULL;
    c->n_ends = 1;
    char name[64];
    em_schema_rule_name(w, stem, name);
    snprintf(c->prefix, sizeof c->prefix, "%.40s-", name);
    return c;
}

void em_schema_choice_free(em_schema_choice *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_nodes; i++) free(c->nodes[i].edges);
    free(c->nodes);
    for (size_t i = 1; i < c->n_ends; i++) free(c->ends[i]);
    free(c->ends);
    free(c);
}

/* A copy of node `from` (its edges copied, its rule not written); 0 when out of memory. */
static uint32_t copy_node(em_schema_choice *c, uint32_t from) {
    if (!reserve(&c->nodes, &c->cap_nodes, c->n_nodes + 1, sizeof *c->nodes)) return 0;
    trie_node copy = {.n_edges = c->nodes[from].n_edges, .end = c->nodes[from].end};
    if (copy.n_edges) {
        copy.edges = malloc(copy.n_edges * sizeof *copy.edges);
        if (!copy.edges) return 0;
        memcpy(copy.edges, c->nodes[from].edges, copy.n_edges * sizeof *copy.edges);
    }
    c->nodes[c->n_nodes] = copy;
    return (uint32_t)c->n_nodes++;
}

bool em_schema_choice_add(em_schema_choice *c, uint32_t version, const char *bytes, size_t len, const char *then,
                          uint32_t *out) {
    int32_t end = 0;
    if (then) {
        if (!reserve(&c->ends, &c->cap_ends, c->n_ends + 1, sizeof *c->ends) || !(c->ends[c->n_ends] = strdup(then))) return false;
        end = (int32_t)c->n_ends++;
    }
    uint32_t root = copy_node(c, version), node = root;
    if (!root) return false;
    for (size_t i = 0; i < len;) {
        const uint8_t lead = (uint8_t)bytes[i];
        size_t n_bytes = lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
        if (n_bytes > len - i) n_bytes = 1; /* not UTF-8 (the caller's strings are): a byte at a time */
        uint32_t character = 0;
        for (size_t k = 0; k < n_bytes; k++) character |= (uint32_t)(uint8_t)bytes[i + k] << (8 * k);
        i += n_bytes;
        trie_node *n = &c->nodes[node];
        uint32_t at = 0;
        while (at < n->n_edges && n->edges[at].character < character) at++;
        uint32_t child;
        if (at < n->n_edges && n->edges[at].character == character) {
            child = copy_node(c, n->edges[at].child); /* the path is copied; the rest is shared */
        } else {
            child = copy_node(c, 0);
            n = &c->nodes[node]; /* copy_node may have moved the array */
            trie_edge *edges = child ? realloc(n->edges, (n->n_edges + 1) * sizeof *edges) : NULL;
            if (!edges) return false;
            memmove(edges + at + 1, edges + at, (n->n_edges - at) * sizeof *edges);
            edges[at].character = character;
            edges[at].len = (uint8_t)n_bytes;
            n->edges = edges;
            n->n_edges++;
        }
        if (!child) return false;
        c->nodes[node].edges[at].child = child;
        node = child;
    }
    if (c->nodes[node].end < 0) c->nodes[node].end = end; /* a string added twice keeps its first end */
    *out = root;
    return true;
}

/* Whether the node is written as a rule of its own: where strings branch or end. */
static bool branches(const trie_node *n) { return n->n_edges != 1 || n->end >= 0; }

/* Writes one alternative: the edge's character, those of the chain after it, then the rule of the
 * node where the chain branches or ends (which joins the to-do list if not written yet). */
static bool write_edge(em_schema_choice *c, FILE *out, const trie_edge *edge, uint32_t **todo, size_t *n_todo, size_t *cap_todo) {
    char chain[256];
    size_t n = 0;
    uint32_t node = edge->child;
    for (const trie_edge *e = edge;;) {
        if (n + 4 > sizeof chain) { /* a long chain: written in pieces */
            em_schema_write_literal(out, chain, n);
            fputc(' ', out);
            n = 0;
        }
        for (uint8_t k = 0; k < e->len; k++) chain[n++] = (char)(e->character >> (8 * k));
        if (branches(&c->nodes[node])) break;
        e = &c->nodes[node].edges[0];
        node = e->child;
    }
    if (n) em_schema_write_literal(out, chain, n);
    trie_node *target = &c->nodes[node];
    if (!target->rule) {
        target->rule = ++c->next_rule;
        if (!reserve(todo, cap_todo, *n_todo + 1, sizeof **todo)) return false;
        (*todo)[(*n_todo)++] = node;
    }
    fprintf(out, " %sn%u", c->prefix, target->rule);
    return true;
}

bool em_schema_choice_write(em_schema_choice *c, em_schema_writer *w, uint32_t version, char name[64]) {
    uint32_t *todo = NULL;
    size_t n_todo = 0, cap_todo = 0;
    trie_node *root = &c->nodes[version];
    if (!root->rule) {
        root->rule = ++c->next_rule;
        if (!reserve(&todo, &cap_todo, 1, sizeof *todo)) return em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
        todo[n_todo++] = version;
    }
    snprintf(name, 64, "%sn%u", c->prefix, root->rule);
    bool ok = true;
    for (size_t t = 0; ok && t < n_todo; t++) { /* the to-do list grows while it is worked through */
        /* The tries of an object's members share nodes between versions, but not every rule: many
         * properties with long common prefixes cost more rules than properties. */
        if (!em_schema_spend(w) || (++w->trie_rules + w->next_rule > EM_GRAMMAR_MAX_RULES &&
                                    !em_schema_fail(w, EM_ERR_INVALID, "more than %d rules (the limit)", EM_GRAMMAR_MAX_RULES))) {
            free(todo);
            return false;
        }
        const uint32_t id = todo[t];
        fprintf(w->out, "%sn%u ::=", c->prefix, c->nodes[id].rule);
        for (uint32_t e = 0; ok && e < c->nodes[id].n_edges; e++) {
            fputs(e ? " | " : " ", w->out);
            trie_edge edge = c->nodes[id].edges[e];
            ok = write_edge(c, w->out, &edge, &todo, &n_todo, &cap_todo);
        }
        const int32_t end = c->nodes[id].end;
        if (end >= 0) fprintf(w->out, "%s%s", c->nodes[id].n_edges ? " | " : " ", c->ends[end] ? c->ends[end] : "\"\"");
        fputc('\n', w->out);
    }
    free(todo);
    return ok || em_schema_fail(w, EM_ERR_NOMEM, "out of memory");
}
