/* What a request's grammar costs to compile (issue #62): the CPU seconds of the JSON Schema
 * conversion and of the GBNF compile plus a parse state's start, for the shapes that once took
 * seconds to minutes: a schema of N optional properties, of N required ones, an enum of N values,
 * and a GBNF of R rules (each calling the next) written in order and backwards. Run through
 * bench/grammar_compile.sh; prints one line per shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "grammar/grammar.h"

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The server's way (structured.c): converted and compiled through a cache of compiled grammars,
 * under a watch with a CPU-time bound; the seconds of the whole. */
static double through_cache(em_grammar_cache *cache, const char *text, int schema) {
    const double t0 = cpu_seconds();
    em_grammar_watch watch;
    em_grammar_watch_init(&watch, 600, NULL, NULL);
    char *gbnf = NULL;
    em_err err = schema ? em_grammar_cache_schema(cache, text, strlen(text), &watch, &gbnf) : NULL;
    em_grammar *grammar = NULL;
    if (!err) err = em_grammar_cache_compile(cache, schema ? gbnf : text, strlen(schema ? gbnf : text), &watch, &grammar);
    const double t1 = cpu_seconds();
    em_err_free(err);
    em_grammar_free(grammar);
    free(gbnf);
    return t1 - t0;
}

/* Converts (a schema) and compiles `text`, and prints the time of each part; then the same through
 * a cache, the first time and again (what a request that repeats it costs). */
static void measure(const char *shape, const char *text, int schema) {
    const double t0 = cpu_seconds();
    char *gbnf = NULL;
    em_err err = schema ? em_grammar_from_json_schema(text, strlen(text), &gbnf) : NULL;
    const double t1 = cpu_seconds();
    em_grammar *grammar = NULL;
    if (!err) err = em_grammar_compile_checked(schema ? gbnf : text, strlen(schema ? gbnf : text), &grammar);
    const double t2 = cpu_seconds();
    em_grammar_cache *cache = NULL;
    if (em_grammar_cache_new(16, (size_t)1 << 30, &cache)) return;
    const double first = through_cache(cache, text, schema), again = through_cache(cache, text, schema);
    em_grammar_cache_free(cache);
    printf("%-44s convert %.3f s  compile %.3f s  total %.3f s  cached: first %.3f s, again %.4f s%s%s\n", shape,
           t1 - t0, t2 - t1, t2 - t0, first, again, err ? "  refused: " : "", err ? em_err_message(err) : "");
    em_err_free(err);
    em_grammar_free(grammar);
    free(gbnf);
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 10000, rules = argc > 2 ? atoi(argv[2]) : 100000;
    char shape[64];
    em_buf b = {0};
    for (int required = 0; required < 2; required++) {
        em_buf_printf(&b, "{\"type\":\"object\",\"properties\":{");
        for (int i = 0; i < n; i++) em_buf_printf(&b, "%s\"property_%d\":{\"type\":\"string\"}", i ? "," : "", i);
        em_buf_printf(&b, "}");
        if (required) {
            em_buf_printf(&b, ",\"required\":[");
            for (int i = 0; i < n; i++) em_buf_printf(&b, "%s\"property_%d\"", i ? "," : "", i);
            em_buf_printf(&b, "]");
        }
        em_buf_printf(&b, "}");
        snprintf(shape, sizeof shape, "schema, %d %s properties", n, required ? "required" : "optional");
        measure(shape, b.data, 1);
        em_buf_free(&b);
    }
    em_buf_printf(&b, "{\"enum\":[");
    for (int i = 0; i < n; i++) em_buf_printf(&b, "%s\"value_%d\"", i ? "," : "", i);
    em_buf_printf(&b, "]}");
    snprintf(shape, sizeof shape, "schema, enum of %d values", n);
    measure(shape, b.data, 1);
    em_buf_free(&b);
    for (int backwards = 0; backwards < 2; backwards++) {
        if (!backwards) em_buf_printf(&b, "root ::= r0\n");
        for (int k = 0; k < rules; k++) {
            const int i = backwards ? rules - 1 - k : k;
            em_buf_printf(&b, "r%d ::= \"a\" r%d | \"b\"\n", i, i + 1);
        }
        em_buf_printf(&b, "r%d ::= \"c\"\n%s", rules, backwards ? "root ::= r0\n" : "");
        snprintf(shape, sizeof shape, "gbnf, %d rules%s", rules, backwards ? ", defined backwards" : "");
        measure(shape, b.data, 0);
        em_buf_free(&b);
    }
    return 0;
}
