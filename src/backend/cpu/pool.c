/* A fixed pool of worker threads that all run the same job, each on its share, then meet. The
 * caller's thread takes share 0, so a pool of one thread starts none. Waiting threads spin for
 * spin_ns before they sleep (see em_cpu_pool in cpu_internal.h). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu_internal.h"

/* How long a waiting thread spins before it sleeps, unless EMBER_CPU_SPIN_US says otherwise. On a
 * machine of its own a spin longer than the gap between two jobs of a decode step lets a step run
 * without a sleep; on one whose cores other busy processes share, every spin takes a time slice
 * from the thread being waited for, and decode runs slower than with none (bench/RESULTS.md,
 * "CPU: more sequences, weights in memory"). So the pool spins only while the machine has room for
 * its threads and every other runnable task. */
#define DEFAULT_SPIN_US 1000

/* How often the caller looks at the machine's load (a read of /proc/loadavg, some microseconds). */
#define SPIN_CHECK_MS 10

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* One round of waiting: a few pause instructions, then the core to any other runnable thread (on a
 * machine with more threads than cores, the one being waited for may be among them). */
static void cpu_relax(uint32_t i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
    if (i % 16 == 0) sched_yield();
}

/* Spins until *value differs from `old` or the spin time is over; returns the last value read. */
static uint64_t spin_while_equal(const em_cpu_pool *pool, const _Atomic uint64_t *value, uint64_t old) {
    uint64_t seen = atomic_load_explicit(value, memory_order_acquire);
    const uint64_t spin_ns = atomic_load_explicit(&pool->spin_ns, memory_order_relaxed);
    if (seen != old || !spin_ns) return seen;
    const uint64_t until = now_ns() + spin_ns;
    for (uint32_t i = 1;; i++) {
        cpu_relax(i);
        seen = atomic_load_explicit(value, memory_order_acquire);
        if (seen != old || atomic_load_explicit(&pool->quit, memory_order_relaxed)) return seen;
        if (i % 64 == 0 && now_ns() > until) return seen;
    }
}

static bool spin_until_done(const em_cpu_pool *pool) {
    if (atomic_load_explicit(&pool->pending, memory_order_acquire) == 0) return true;
    const uint64_t spin_ns = atomic_load_explicit(&pool->spin_ns, memory_order_relaxed);
    const uint64_t until = now_ns() + spin_ns;
    for (uint32_t i = 1; spin_ns; i++) {
        cpu_relax(i);
        if (atomic_load_explicit(&pool->pending, memory_order_acquire) == 0) return true;
        if (i % 64 == 0 && now_ns() > until) break;
    }
    return false;
}

bool em_cpu_spin_allowed(const char *loadavg, uint32_t n_cpus, uint32_t n_threads, bool workers_spinning) {
    double one, five, fifteen;
    unsigned runnable, tasks;
    if (!loadavg || sscanf(loadavg, "%lf %lf %lf %u/%u", &one, &five, &fifteen, &runnable, &tasks) != 5) return false;
    /* runnable counts the reading thread, and the workers when they spin */
    const unsigned ours = 1 + (workers_spinning && n_threads > 1 ? n_threads - 1 : 0);
    const unsigned others = runnable > ours ? runnable - ours : 0;
    return others + n_threads <= n_cpus;
}

/* The caller's look at the machine, at most every SPIN_CHECK_MS: the spin on or off for what follows. */
static void adapt_spin(em_cpu_pool *pool) {
    if (!pool->spin_adapts) return;
    const uint64_t now = now_ns();
    if (now - pool->spin_checked_ns < SPIN_CHECK_MS * 1000000ull) return;
    pool->spin_checked_ns = now;
    char text[128] = "";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(text, sizeof text, f)) text[0] = 0;
        fclose(f);
    }
    const bool spinning = atomic_load_explicit(&pool->spin_ns, memory_order_relaxed) != 0;
    const bool allowed = em_cpu_spin_allowed(text, pool->n_cpus, pool->n_threads, spinning);
    atomic_store_explicit(&pool->spin_ns, allowed ? pool->spin_max_ns : 0, memory_order_relaxed);
}

typedef struct worker_arg {
    em_cpu_pool *pool;
    uint32_t ith;
} worker_arg;

static void *worker_main(void *arg_) {
    worker_arg *arg = arg_;
    em_cpu_pool *pool = arg->pool;
    uint32_t ith = arg->ith;
    free(arg);
    uint64_t seen = 0;
    for (;;) {
        uint64_t now = spin_while_equal(pool, &pool->generation, seen);
        if (now == seen) {
            /* The caller bumps the generation under the mutex, so no wake-up is lost here. */
            pthread_mutex_lock(&pool->mutex);
            while ((now = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->quit))
                pthread_cond_wait(&pool->wake, &pool->mutex);
            pthread_mutex_unlock(&pool->mutex);
        }
        if (atomic_load(&pool->quit)) break;
        seen = now;
        pool->job(pool->ctx, ith, pool->n_threads);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
            /* The last worker: wake the caller should it have stopped spinning. */
            pthread_mutex_lock(&pool->mutex);
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->mutex);
        }
    }
    return NULL;
}

em_err em_cpu_pool_init(em_cpu_pool *pool, uint32_t n_threads) {
    *pool = (em_cpu_pool){.n_threads = n_threads ? n_threads : 1, .spin_max_ns = DEFAULT_SPIN_US * 1000u,
                          .spin_adapts = true};
    const char *spin = getenv("EMBER_CPU_SPIN_US");
    if (spin && *spin) {
        pool->spin_max_ns = strtoull(spin, NULL, 10) * 1000u;
        pool->spin_adapts = false;
        atomic_store(&pool->spin_ns, pool->spin_max_ns);
    }
    cpu_set_t allowed;
    pool->n_cpus = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? (uint32_t)CPU_COUNT(&allowed) : 1;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    if (pool->n_threads == 1) return NULL;
    pool->threads = calloc(pool->n_threads - 1, sizeof *pool->threads);
    if (!pool->threads) return em_errorf(EM_ERR_NOMEM, "out of memory starting %u threads", pool->n_threads);
    for (uint32_t i = 1; i < pool->n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (!arg) return em_errorf(EM_ERR_NOMEM, "out of memory starting thread %u", i);
        *arg = (worker_arg){pool, i};
        if (pthread_create(&pool->threads[i - 1], NULL, worker_main, arg)) {
            free(arg);
            return em_errorf(EM_ERR_NOMEM, "could not start thread %u of %u", i, pool->n_threads);
        }
        pool->n_started++;
    }
    return NULL;
}

void em_cpu_pool_destroy(em_cpu_pool *pool) {
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->quit, true);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    for (uint32_t i = 0; i < pool->n_started; i++) pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->mutex);
}

void em_cpu_pool_run(em_cpu_pool *pool, em_cpu_job job, void *ctx) {
    if (pool->n_started + 1 < pool->n_threads || pool->n_threads == 1) {
        /* Not all workers started (init failed midway) or no workers: run every share here. */
        for (uint32_t i = 0; i < pool->n_threads; i++) job(ctx, i, pool->n_threads);
        return;
    }
    adapt_spin(pool);
    /* job and ctx are read by the workers only after they see the new generation (release/acquire). */
    pool->job = job;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->wake); /* no system call while every worker is spinning */
    pthread_mutex_unlock(&pool->mutex);
    job(ctx, 0, pool->n_threads);
    if (spin_until_done(pool)) return;
    pthread_mutex_lock(&pool->mutex);
    while (atomic_load(&pool->pending) > 0) pthread_cond_wait(&pool->done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}
