/* A fixed pool of worker threads that all run the same job, each on its share, then meet. The
 * caller's thread takes share 0, so a pool of one thread starts none. */
#include <stdlib.h>

#include "cpu_internal.h"

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
    pthread_mutex_lock(&pool->mutex);
    for (;;) {
        while (pool->generation == seen && !pool->quit) pthread_cond_wait(&pool->wake, &pool->mutex);
        if (pool->quit) break;
        seen = pool->generation;
        em_cpu_job job = pool->job;
        void *ctx = pool->ctx;
        pthread_mutex_unlock(&pool->mutex);
        job(ctx, ith, pool->n_threads);
        pthread_mutex_lock(&pool->mutex);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mutex);
    return NULL;
}

em_err em_cpu_pool_init(em_cpu_pool *pool, uint32_t n_threads) {
    *pool = (em_cpu_pool){.n_threads = n_threads ? n_threads : 1};
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
    pool->quit = true;
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
    pthread_mutex_lock(&pool->mutex);
    pool->job = job;
    pool->ctx = ctx;
    pool->pending = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    job(ctx, 0, pool->n_threads);
    pthread_mutex_lock(&pool->mutex);
    while (pool->pending > 0) pthread_cond_wait(&pool->done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}
