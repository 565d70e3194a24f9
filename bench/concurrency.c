/* Aggregate decode throughput of the engine at several numbers of concurrent requests.
 *
 *   bench_concurrency MODEL.gguf DEVICE N [N ...]
 *
 * For each N: one engine, N requests submitted at once, each a distinct 300-token prompt (so the
 * prefix cache shares nothing) and 256 greedy tokens with end-of-generation ignored. Prints the
 * wall time from submission to the last token, the tokens generated per second of that wall time,
 * and the sum over requests of each one's decode rate (first token to last), which leaves out the
 * prefill at the start, and the host CPU time the process used meanwhile (all its threads, from
 * getrusage) over that wall time: the cores the engine keeps busy while the device works.
 * ROUNDS (environment, default 1) repeats each N on the same engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "ember.h"

#define PROMPT 300
#define GENERATE 256
#define MAX_N 256

static double cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_concurrency MODEL.gguf cpu|cuda N [N ...]\n");
        return 2;
    }
    for (int a = 3; a < argc; a++) {
        const int n = atoi(argv[a]);
        if (n < 1 || n > MAX_N) {
            fprintf(stderr, "N must be in 1..%d\n", MAX_N);
            return 2;
        }
        ember_options o;
        ember_options_default(&o);
        o.model_path = argv[1];
        o.device = argv[2];
        o.ctx_tokens = PROMPT + GENERATE + 16;
        o.kv_mem_bytes = 0;
        ember_engine *engine = NULL;
        ember_error *err = ember_engine_create(&o, &engine);
        if (err) {
            fprintf(stderr, "engine: %s\n", ember_error_message(err));
            ember_error_free(err);
            return 1;
        }
        const char *rounds_env = getenv("ROUNDS");
        const int rounds = rounds_env && atoi(rounds_env) > 0 ? atoi(rounds_env) : 1;
        for (int round = 0; round < rounds; round++) {
            static int32_t prompts[MAX_N][PROMPT];
            ember_request *requests[MAX_N];
            const double start = now_s(), cpu_start = cpu_s();
            for (int r = 0; r < n; r++) {
                /* distinct in every round too, so the prefix cache shares nothing */
                for (int i = 0; i < PROMPT; i++) prompts[r][i] = 1000 + ((r * 7919 + round * 613 + i * 31) % 20000);
                ember_request_params p;
                ember_request_default(&p);
                p.prompt_ids = prompts[r];
                p.n_prompt_ids = PROMPT;
                p.sampling.temperature = 0.0f;
                p.max_tokens = GENERATE;
                p.ignore_eos = true;
                if ((err = ember_submit(engine, &p, &requests[r]))) {
                    fprintf(stderr, "submit: %s\n", ember_error_message(err));
                    ember_error_free(err);
                    return 1;
                }
            }
            uint64_t generated = 0;
            double decode_rate_sum = 0.0;
            for (int r = 0; r < n; r++) {
                ember_output out;
                do {
                    ember_request_next(requests[r], &out, -1);
                } while (out.finish == EMBER_FINISH_NONE);
                if (out.finish == EMBER_FINISH_ERROR) {
                    fprintf(stderr, "request %d: %s\n", r, out.error ? out.error : "error");
                    return 1;
                }
                ember_timings t;
                ember_request_timings(requests[r], &t);
                generated += t.generated_tokens;
                decode_rate_sum += t.decode_tokens_per_second;
            }
            const double wall = now_s() - start, cpu = cpu_s() - cpu_start;
            printf("%3d sequences: %llu tokens in %.2f s = %8.1f tok/s (wall, prefill included); sum of decode rates %8.1f "
                   "tok/s; host CPU %.2f s = %.3f cores\n",
                   n, (unsigned long long)generated, wall, generated / wall, decode_rate_sum, cpu, cpu / wall);
            fflush(stdout);
            for (int r = 0; r < n; r++) ember_request_release(requests[r]);
        }
        ember_engine_destroy(engine);
    }
    return 0;
}
