/* Recurrent states of hybrid models in the engine (engine.h, "Recurrent states"): which backend
 * slot each running request carries its state in, and the snapshots that let a cached prefix be
 * resumed. A snapshot is the state after exactly the tokens it records; it is kept in a slot of its
 * own, found by comparing tokens (a prefix that matches a snapshot token for token is the same
 * computation, whichever request made either), and replaced least recently used first. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

em_err em_states_init(em_state_cache *c, uint32_t running_slots, uint32_t snapshot_slots) {
    *c = (em_state_cache){.first_snapshot = running_slots, .n_snapshots = snapshot_slots};
    c->snapshots = calloc(snapshot_slots ? snapshot_slots : 1, sizeof *c->snapshots);
    c->running_used = calloc(running_slots ? running_slots : 1, sizeof *c->running_used);
    if (!c->snapshots || !c->running_used) {
        em_states_free(c);
        return em_errorf(EM_ERR_NOMEM, "engine: out of memory for %u state snapshots", snapshot_slots);
    }
    return NULL;
}

void em_states_free(em_state_cache *c) {
    for (uint32_t i = 0; c->snapshots && i < c->n_snapshots; i++) free(c->snapshots[i].tokens);
    free(c->snapshots);
    free(c->running_used);
    *c = (em_state_cache){0};
}

bool em_states_take_slot(em_state_cache *c, uint32_t *slot) {
    for (uint32_t i = 0; i < c->first_snapshot; i++)
        if (!c->running_used[i]) {
            c->running_used[i] = true;
            *slot = i;
            return true;
        }
    return false;
}

void em_states_give_slot(em_state_cache *c, uint32_t slot) {
    if (slot < c->first_snapshot) c->running_used[slot] = false;
}

uint32_t em_states_match(em_state_cache *c, const int32_t *tokens, uint32_t max_tokens, uint32_t *slot) {
    em_state_snapshot *best = NULL;
    for (uint32_t i = 0; i < c->n_snapshots; i++) {
        em_state_snapshot *s = &c->snapshots[i];
        if (s->n_tokens && s->n_tokens <= max_tokens && (!best || s->n_tokens > best->n_tokens) &&
            !memcmp(s->tokens, tokens, s->n_tokens * sizeof *tokens))
            best = s;
    }
    if (!best) return 0;
    best->last_used = ++c->clock;
    *slot = c->first_snapshot + (uint32_t)(best - c->snapshots);
    c->restored++;
    return best->n_tokens;
}

em_err em_states_store(em_state_cache *c, em_backend *backend, uint32_t from, const int32_t *tokens, uint32_t n) {
    if (!c->n_snapshots || !n) return NULL;
    em_state_snapshot *target = NULL;
    for (uint32_t i = 0; i < c->n_snapshots && !target; i++) {
        em_state_snapshot *s = &c->snapshots[i];
        if (s->n_tokens == n && !memcmp(s->tokens, tokens, n * sizeof *tokens)) {
            s->last_used = ++c->clock; /* the same tokens give the same state: nothing to copy */
            return NULL;
        }
    }
    for (uint32_t i = 0; i < c->n_snapshots; i++) {
        em_state_snapshot *s = &c->snapshots[i];
        if (!target || !s->n_tokens || (target->n_tokens && s->last_used < target->last_used)) target = s;
        if (!s->n_tokens) break;
    }
    int32_t *copy = realloc(target->tokens, n * sizeof *copy);
    if (!copy) return em_errorf(EM_ERR_NOMEM, "engine: out of memory for a state snapshot of %u tokens", n);
    target->tokens = copy;
    target->n_tokens = 0; /* empty until the state is there */
    em_err err = em_backend_copy_state(backend, from, c->first_snapshot + (uint32_t)(target - c->snapshots));
    if (err) return err;
    memcpy(copy, tokens, n * sizeof *copy);
    target->n_tokens = n;
    target->last_used = ++c->clock;
    c->stored++;
    return NULL;
}
