/* Stop strings across token boundaries (engine.h). */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

em_err em_stop_init(em_stop_matcher *m, const char *const *stops, size_t n_stops) {
    memset(m, 0, sizeof *m);
    if (n_stops == 0) return NULL;
    m->stops = calloc(n_stops, sizeof *m->stops);
    m->stop_lens = calloc(n_stops, sizeof *m->stop_lens);
    if (!m->stops || !m->stop_lens) goto nomem;
    m->n_stops = n_stops;
    for (size_t i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0]) {
            em_stop_free(m);
            return em_errorf(EM_ERR_INVALID, "stop string %zu is empty", i);
        }
        if (!(m->stops[i] = strdup(stops[i]))) goto nomem;
        m->stop_lens[i] = strlen(stops[i]);
    }
    return NULL;
nomem:
    em_stop_free(m);
    return em_errorf(EM_ERR_NOMEM, "no memory for %zu stop strings", n_stops);
}

void em_stop_free(em_stop_matcher *m) {
    for (size_t i = 0; m->stops && i < m->n_stops; i++) free(m->stops[i]);
    free(m->stops);
    free(m->stop_lens);
    free(m->pending);
    free(m->out);
    memset(m, 0, sizeof *m);
}

static bool reserve(char **buffer, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t grown = *cap ? *cap : 64;
    while (grown < need) grown *= 2;
    char *p = realloc(*buffer, grown);
    if (!p) return false;
    *buffer = p;
    *cap = grown;
    return true;
}

/* Moves pending[0..n) into the output buffer and drops it from pending. */
static void release_prefix(em_stop_matcher *m, size_t n, const char **release, size_t *release_len) {
    if (n) memcpy(m->out, m->pending, n);
    memmove(m->pending, m->pending + n, m->pending_len - n);
    m->pending_len -= n;
    *release = m->out;
    *release_len = n;
}

int em_stop_feed(em_stop_matcher *m, const char *text, size_t len, const char **release, size_t *release_len,
                 em_err *err) {
    *err = NULL;
    *release = "";
    *release_len = 0;
    if (!reserve(&m->pending, &m->pending_cap, m->pending_len + len + 1) ||
        !reserve(&m->out, &m->out_cap, m->pending_len + len + 1)) {
        *err = em_errorf(EM_ERR_NOMEM, "no memory for generated text");
        return -1;
    }
    memcpy(m->pending + m->pending_len, text, len);
    m->pending_len += len;
    /* The earliest complete stop string wins. */
    int found = -1;
    size_t found_at = m->pending_len;
    for (size_t i = 0; i < m->n_stops; i++) {
        const char *hit = memmem(m->pending, m->pending_len, m->stops[i], m->stop_lens[i]);
        if (hit && (size_t)(hit - m->pending) < found_at) {
            found = (int)i;
            found_at = (size_t)(hit - m->pending);
        }
    }
    if (found >= 0) {
        release_prefix(m, found_at, release, release_len);
        m->pending_len = 0;
        return found;
    }
    /* Hold back the longest suffix that is a proper prefix of some stop string. */
    size_t hold = 0;
    for (size_t i = 0; i < m->n_stops; i++) {
        size_t longest = m->stop_lens[i] - 1 < m->pending_len ? m->stop_lens[i] - 1 : m->pending_len;
        for (size_t k = longest; k > hold; k--)
            if (!memcmp(m->pending + m->pending_len - k, m->stops[i], k)) {
                hold = k;
                break;
            }
    }
    release_prefix(m, m->pending_len - hold, release, release_len);
    return -1;
}

void em_stop_flush(em_stop_matcher *m, const char **release, size_t *release_len) {
    *release = "";
    *release_len = 0;
    if (!m->pending_len) return;
    if (!reserve(&m->out, &m->out_cap, m->pending_len)) return;
    release_prefix(m, m->pending_len, release, release_len);
}
