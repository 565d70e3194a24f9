/* The options of the commands that generate (cli.h's em_cli_generate), read alike by `run` and
 * `chat`: -n, --temp, --top-k, --top-p, --min-p, --repeat-penalty, --seed, -c/--ctx, -t/--threads,
 * --device, and the prefix cache's tiers (--cache-ram, --cache-dir, --cache-disk, which `serve` reads
 * here too). One parser and one help text (EM_CLI_GENERATE_USAGE), so that the two commands cannot
 * drift apart in names, ranges or defaults. Also the nearest-option suggestion for a mistyped flag. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ember.h"

uint64_t em_cli_random_seed(void) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        seed = (uint64_t)now.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)now.tv_sec ^ (uint64_t)getpid() << 32;
    }
    return seed >> 1; /* printed and typed back as --seed: keep it clear of signed readers */
}

void em_cli_cache_default(em_cli_cache *c) {
    *c = (em_cli_cache){.ram = EMBER_CACHE_RAM_AUTO};
}

/* "512", "64K", "2G", "1T" → bytes. */
static bool parse_bytes(const char *text, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || text[0] == '-') return false;
    unsigned shift = 0;
    if (*end && strchr("kK", *end)) shift = 10;
    else if (*end && strchr("mM", *end)) shift = 20;
    else if (*end && strchr("gG", *end)) shift = 30;
    else if (*end && strchr("tT", *end)) shift = 40;
    if (shift) end++;
    if (*end || (shift && v > (UINT64_MAX >> shift))) return false;
    *out = (uint64_t)v << shift;
    return *out != EMBER_CACHE_RAM_AUTO;
}

bool em_cli_cache_option(em_cli_cache *c, const char *flag, const char *value, em_err *err) {
    *err = NULL;
    if (!strcmp(flag, "--cache-ram") || !strcmp(flag, "--cache-disk")) {
        uint64_t *to = !strcmp(flag, "--cache-ram") ? &c->ram : &c->disk;
        if (!parse_bytes(value, to))
            *err = em_errorf(EM_ERR_INVALID, "%s expects a size in bytes (suffixes K, M, G, T), got '%s'", flag, value);
    } else if (!strcmp(flag, "--cache-dir")) {
        if (!*value) *err = em_errorf(EM_ERR_INVALID, "--cache-dir expects a directory");
        c->dir = value;
    } else {
        return false;
    }
    return true;
}

void em_cli_cache_apply(const em_cli_cache *c, ember_options *engine) {
    engine->cache_ram_bytes = c->ram;
    engine->cache_dir = c->dir;
    engine->cache_disk_bytes = c->disk;
}

void em_cli_generate_default(em_cli_generate *o) {
    *o = (em_cli_generate){.max_tokens = EM_CLI_DEFAULT_MAX_TOKENS,
                           .temperature = EM_CLI_DEFAULT_TEMPERATURE,
                           .top_k = 40,
                           .top_p = 0.95f,
                           .min_p = 0.05f,
                           .repeat_penalty = 1.0f,
                           .seed = em_cli_random_seed()};
    em_cli_cache_default(&o->cache);
}

static em_err parse_number(const char *flag, const char *text, double lo, double hi, bool integer, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!*text || *end || errno || v < lo || v > hi || (integer && v != (double)(long long)v))
        return em_errorf(EM_ERR_INVALID, "%s expects %s in [%g, %g], got '%s'", flag, integer ? "an integer" : "a number",
                         lo, hi, text);
    *out = v;
    return NULL;
}

bool em_cli_generate_option(em_cli_generate *o, const char *flag, const char *value, em_err *err) {
    double x = 0;
    *err = NULL;
    if (!strcmp(flag, "-n") || !strcmp(flag, "--max-tokens")) {
        if (!(*err = parse_number(flag, value, 1, 1 << 24, true, &x))) o->max_tokens = (int)x;
        else {
            em_err_free(*err);
            *err = em_errorf(EM_ERR_INVALID, "%s expects a positive number of tokens (at most 16777216), got '%s'", flag, value);
        }
    } else if (!strcmp(flag, "--temp") || !strcmp(flag, "--temperature")) {
        if (!(*err = parse_number(flag, value, 0, 100, false, &x))) o->temperature = (float)x;
    } else if (!strcmp(flag, "--top-k")) {
        if (!(*err = parse_number(flag, value, 0, 1 << 30, true, &x))) o->top_k = (int)x;
    } else if (!strcmp(flag, "--top-p")) {
        if (!(*err = parse_number(flag, value, 1e-6, 1, false, &x))) o->top_p = (float)x;
    } else if (!strcmp(flag, "--min-p")) {
        if (!(*err = parse_number(flag, value, 0, 1, false, &x))) o->min_p = (float)x;
    } else if (!strcmp(flag, "--repeat-penalty")) {
        if (!(*err = parse_number(flag, value, 1e-3, 100, false, &x))) o->repeat_penalty = (float)x;
    } else if (!strcmp(flag, "--seed")) {
        char *end;
        errno = 0;
        o->seed = strtoull(value, &end, 10);
        if (!*value || *end || errno || *value == '-')
            *err = em_errorf(EM_ERR_INVALID, "--seed expects an integer in [0, 2^64), got '%s'", value);
        o->seed_given = true;
    } else if (!strcmp(flag, "-c") || !strcmp(flag, "--ctx")) {
        if (!(*err = parse_number(flag, value, 1, 1 << 24, true, &x))) o->ctx = (int)x;
    } else if (!strcmp(flag, "-t") || !strcmp(flag, "--threads")) {
        if (!(*err = parse_number(flag, value, 1, 1024, true, &x))) o->threads = (int)x;
    } else if (!strcmp(flag, "--device")) {
        if (strcmp(value, "cpu") && strcmp(value, "cuda"))
            *err = em_errorf(EM_ERR_INVALID, "--device expects cpu or cuda, got '%s'", value);
        o->device = value;
    } else {
        return em_cli_cache_option(&o->cache, flag, value, err);
    }
    return true;
}

void em_cli_generate_apply(const em_cli_generate *o, ember_options *engine) {
    engine->device = o->device;
    engine->ctx_tokens = o->ctx;
    engine->threads = o->threads;
    em_cli_cache_apply(&o->cache, engine);
}

void em_cli_generate_sampling(const em_cli_generate *o, ember_sampling *s) {
    s->temperature = o->temperature;
    s->top_k = o->top_k;
    s->top_p = o->top_p;
    s->min_p = o->min_p;
    s->repeat_penalty = o->repeat_penalty;
    s->repeat_last_n = 64;
    s->seed = o->seed;
}

/* Edit distance (insertions, deletions, substitutions) of two short strings; 99 past 63 bytes. */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diagonal = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int above = row[j];
            int best = diagonal + (a[i - 1] != b[j - 1]);
            if (above + 1 < best) best = above + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diagonal = above;
        }
    }
    return row[lb];
}

const char *em_cli_nearest_option(const char *flag, const char *const *names) {
    const char *best = NULL;
    int best_distance = 3; /* a suggestion only for a slip of a key or two */
    for (size_t i = 0; names[i]; i++) {
        int d = edit_distance(flag, names[i]);
        if (d < best_distance) best = names[i], best_distance = d;
    }
    return best;
}

static volatile sig_atomic_t interrupts;

static void count_interrupt(int signal_number) {
    (void)signal_number;
    interrupts = 1;
}

void em_cli_catch_interrupts(bool interrupt_reads) {
    struct sigaction action = {.sa_handler = count_interrupt};
    sigemptyset(&action.sa_mask);
    action.sa_flags = interrupt_reads ? 0 : SA_RESTART;
    sigaction(SIGINT, &action, NULL);
}

bool em_cli_interrupted(void) {
    bool was = interrupts;
    interrupts = 0;
    return was;
}
