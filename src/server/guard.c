/* Connection hygiene against slow clients: what libmicrohttpd cannot do itself.
 *
 * libmicrohttpd's only clock is an idle timeout (reset by every byte), so a client that trickles
 * its headers or its body a byte at a time holds a connection, and its thread, for as long as it
 * likes; with one thread per connection and a connection limit, a few hundred such sockets lock
 * everyone out, /health included. The guard follows every connection through the phases of its
 * requests (headers, body, being served) from libmicrohttpd's connection notifications and the
 * access handler, and cuts (shutdown(2): the connection's own thread sees the client gone and
 * closes it) a connection that
 *   - takes longer than header_seconds to send its headers (counted from its accept, or from the
 *     end of its previous response: an idle keep-alive connection is cut too), or longer than
 *     body_seconds to send its body;
 *   - is the oldest still receiving when a new connection arrives and more than
 *     receiving_per_client connections of that client (by IP address), or more than
 *     receiving_total in all, are receiving: a new client always gets in, and slow senders make
 *     room for it.
 * A connection being served (its request is waiting for or streaming from the engine) is never
 * cut here: a long generation may be silent for minutes.
 *
 * Threads: libmicrohttpd's (notifications, access handler) and the guard's own watchdog, which
 * wakes four times a second. One mutex guards the list; a socket is shut down only under it and
 * only before libmicrohttpd's close notification, after which libmicrohttpd closes the descriptor,
 * so a descriptor number is never touched after it may have been reused. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <netinet/in.h>

#include "internal.h"

struct em_guard_entry {
    em_guard_entry *prev, *next;
    int fd;
    em_guard_phase phase;
    double since;          /* seconds (monotonic) the phase began */
    unsigned char ip[16];  /* the client's address (IPv4 in the first 4 bytes) */
    bool cut;              /* shut down, waiting for libmicrohttpd to close it */
};

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool receiving(const em_guard_entry *e) {
    return !e->cut && (e->phase == EM_GUARD_HEADERS || e->phase == EM_GUARD_BODY);
}

/* Under the lock. */
static void cut(em_guard *g, em_guard_entry *e, const char *why) {
    e->cut = true;
    g->cuts++;
    shutdown(e->fd, SHUT_RDWR);
    em_log(EM_LOG_DEBUG, "http: connection cut (%s)", why);
}

/* A new connection: the oldest receiving connection goes when its client, or everyone, has too many
 * receiving. Under the lock. */
static void make_room(em_guard *g, const em_guard_entry *added) {
    int mine = 0, all = 0;
    em_guard_entry *oldest_mine = NULL, *oldest = NULL;
    for (em_guard_entry *e = g->head; e; e = e->next) {
        if (!receiving(e)) continue;
        all++;
        bool same = !memcmp(e->ip, added->ip, sizeof e->ip);
        mine += same;
        if (e == added) continue;
        if (same && (!oldest_mine || e->since < oldest_mine->since)) oldest_mine = e;
        if (!oldest || e->since < oldest->since) oldest = e;
    }
    if (mine > g->options.receiving_per_client && oldest_mine) cut(g, oldest_mine, "its client has too many slow connections");
    else if (all > g->options.receiving_total && oldest) cut(g, oldest, "too many slow connections");
}

void em_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    em_guard *g = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        em_guard_entry *e = calloc(1, sizeof *e);
        *socket_context = e;
        if (!e) return; /* not followed: the connection still works */
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *addr = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        e->fd = fd ? fd->connect_fd : -1;
        if (addr && addr->client_addr && addr->client_addr->sa_family == AF_INET)
            memcpy(e->ip, &((const struct sockaddr_in *)addr->client_addr)->sin_addr, 4);
        else if (addr && addr->client_addr && addr->client_addr->sa_family == AF_INET6)
            memcpy(e->ip, &((const struct sockaddr_in6 *)addr->client_addr)->sin6_addr, 16);
        e->phase = EM_GUARD_HEADERS;
        e->since = now_seconds();
        pthread_mutex_lock(&g->lock);
        e->next = g->head;
        if (g->head) g->head->prev = e;
        g->head = e;
        if (e->fd >= 0) make_room(g, e);
        pthread_mutex_unlock(&g->lock);
        return;
    }
    em_guard_entry *e = *socket_context;
    if (!e) return;
    pthread_mutex_lock(&g->lock);
    if (e->prev) e->prev->next = e->next;
    else g->head = e->next;
    if (e->next) e->next->prev = e->prev;
    pthread_mutex_unlock(&g->lock);
    free(e);
    *socket_context = NULL;
}

void em_guard_enter(em_guard *g, struct MHD_Connection *c, em_guard_phase phase) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    em_guard_entry *e = info ? info->socket_context : NULL;
    if (!e) return;
    pthread_mutex_lock(&g->lock);
    if (e->phase != phase) {
        e->phase = phase;
        e->since = now_seconds();
    }
    pthread_mutex_unlock(&g->lock);
}

/* Cuts the connections past their phase's deadline. */
static void *watch(void *arg) {
    em_guard *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->stopping) {
        double now = now_seconds();
        for (em_guard_entry *e = g->head; e; e = e->next) {
            if (e->cut || e->fd < 0) continue;
            if (e->phase == EM_GUARD_HEADERS && now - e->since > g->options.header_seconds)
                cut(g, e, "its headers took too long");
            else if (e->phase == EM_GUARD_BODY && now - e->since > g->options.body_seconds)
                cut(g, e, "its body took too long");
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += 250 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->wake, &g->lock, &until);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

em_err em_guard_start(em_guard *g, const em_guard_options *options) {
    memset(g, 0, sizeof *g);
    g->options = *options;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_mutex_init(&g->lock, NULL);
    if (!rc && (rc = pthread_cond_init(&g->wake, &attr))) pthread_mutex_destroy(&g->lock);
    pthread_condattr_destroy(&attr);
    if (rc) return em_errorf(EM_ERR_NOMEM, "cannot start the connection guard: %s", strerror(rc));
    if ((rc = pthread_create(&g->thread, NULL, watch, g))) {
        pthread_cond_destroy(&g->wake);
        pthread_mutex_destroy(&g->lock);
        return em_errorf(EM_ERR_NOMEM, "cannot start the connection guard's thread: %s", strerror(rc));
    }
    g->started = true;
    return NULL;
}

void em_guard_stop(em_guard *g) {
    if (!g->started) return;
    pthread_mutex_lock(&g->lock);
    g->stopping = true;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->thread, NULL);
    /* entries left are freed by libmicrohttpd's close notifications, which come before this */
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->lock);
    g->started = false;
}
