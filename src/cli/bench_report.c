#include "bench_url.h"
em_err bench_report_write(const json_t *results, const char *path) { (void)results; (void)path; return NULL; }
