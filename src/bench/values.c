/* The two numbers every `ember bench` mode shares (bench.h): the median of a measurement's rounds,
 * and flag values checked against a range. */
#include <stdlib.h>

#include "bench.h"

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

em_err bench_parse_list(const char *flag, const char *text, int lo, int hi, int *values, int *n) {
    *n = 0;
    for (const char *p = text; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < lo || v > hi || *n == 16)
            return em_errorf(EM_ERR_INVALID, "%s expects up to 16 numbers %d..%d separated by commas, got '%s'", flag,
                             lo, hi, text);
        values[(*n)++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return em_errorf(EM_ERR_INVALID, "%s: unexpected '%s'", flag, end);
    }
    return NULL;
}

em_err bench_parse_int(const char *flag, const char *v, int lo, int hi, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) return em_errorf(EM_ERR_INVALID, "%s expects %d..%d, got '%s'", flag, lo, hi, v);
    *out = (int)x;
    return NULL;
}
