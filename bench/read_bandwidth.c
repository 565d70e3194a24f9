/* The machine's memory read bandwidth, measured: the figure bench/cpu.sh puts decode rates beside
 * (a decode step reads every weight it uses once, so bytes per token times tok/s over this is the
 * share of the limit a decode reaches).
 *
 *   read_bandwidth THREADS [MIB] [PASSES]
 *       THREADS threads each sum their share of a buffer of MIB MiB (default 1024, far larger than
 *       any cache) with 256-bit loads, PASSES times (default 7) after one untimed pass that also
 *       touches every page. Prints "read bandwidth: G GB/s (THREADS threads, best of PASSES)";
 *       GB = 10^9 bytes, the unit `ember info` and the decode figures use.
 *
 * Built by bench/cpu.sh with the system compiler; no Ember code is involved. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct share {
    const __m256i *begin;
    size_t n; /* 32-byte vectors */
    pthread_barrier_t *start;
    uint64_t sink; /* the sum, so the loads are not optimized away */
} share;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Four independent accumulators keep several loads in flight; xor is the cheapest use of a load. */
__attribute__((target("avx2"))) static uint64_t read_all(const __m256i *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a = _mm256_xor_si256(a, _mm256_load_si256(p + i));
        b = _mm256_xor_si256(b, _mm256_load_si256(p + i + 1));
        c = _mm256_xor_si256(c, _mm256_load_si256(p + i + 2));
        d = _mm256_xor_si256(d, _mm256_load_si256(p + i + 3));
    }
    __m256i s = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, s);
    return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
}

static void *run_share(void *arg) {
    share *s = arg;
    pthread_barrier_wait(s->start);
    s->sink ^= read_all(s->begin, s->n);
    pthread_barrier_wait(s->start);
    return NULL;
}

/* One pass: every thread reads its share once; the time from the common start to the last end. */
static double pass(share *shares, int threads, pthread_barrier_t *start) {
    pthread_t tid[256];
    for (int t = 1; t < threads; t++) pthread_create(&tid[t], NULL, run_share, &shares[t]);
    pthread_barrier_wait(start);
    const double t0 = now();
    shares[0].sink ^= read_all(shares[0].begin, shares[0].n);
    pthread_barrier_wait(start);
    const double seconds = now() - t0;
    for (int t = 1; t < threads; t++) pthread_join(tid[t], NULL);
    return seconds;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    const size_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 1024;
    const int passes = argc > 3 ? atoi(argv[3]) : 7;
    if (threads < 1 || threads > 256 || mib < 1 || passes < 1) {
        fprintf(stderr, "usage: read_bandwidth THREADS(1-256) [MIB] [PASSES]\n");
        return 1;
    }
    const size_t bytes = mib << 20, vectors = bytes / 32;
    __m256i *buf = aligned_alloc(64, bytes);
    if (!buf) {
        fprintf(stderr, "read_bandwidth: out of memory for %zu MiB\n", mib);
        return 1;
    }
    memset(buf, 1, bytes);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    share shares[256];
    for (int t = 0; t < threads; t++) {
        const size_t begin = vectors * t / threads, end = vectors * (t + 1) / threads;
        shares[t] = (share){buf + begin, end - begin, &start, 0};
    }
    pass(shares, threads, &start); /* warm-up: page tables, frequency */
    double best = 1e30;
    for (int p = 0; p < passes; p++) {
        const double s = pass(shares, threads, &start);
        if (s < best) best = s;
    }
    volatile uint64_t sink = 0; /* the sums are used, so no pass can be optimized away */
    for (int t = 0; t < threads; t++) sink ^= shares[t].sink;
    printf("read bandwidth: %.1f GB/s (%d threads, best of %d)\n", bytes / best / 1e9, threads, passes);
    free(buf);
    return 0;
}
