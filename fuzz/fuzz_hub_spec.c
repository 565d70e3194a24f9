/* libFuzzer target for Hub model specs and file selection: the first line of the input is a spec
 * (`ORG/NAME[:QUANT]`, `ORG/NAME/FILE.gguf`), the other lines a repository's file paths. Specs come
 * from the command line and paths from the Hub's answers (untrusted: a mirror can send anything),
 * so any crash, sanitizer report or hang is a bug. A pick must be one of the paths. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub.h"

#define MAX_PATHS 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    const char *paths[MAX_PATHS];
    size_t n = 0;
    char *line = strchr(text, '\n');
    if (line) *line++ = '\0';
    while (line && n < MAX_PATHS) {
        paths[n++] = line;
        if ((line = strchr(line, '\n'))) *line++ = '\0';
    }
    em_hub_spec spec;
    em_err err = em_hub_spec_parse(text, &spec);
    if (!err) {
        size_t first = SIZE_MAX;
        err = em_hub_select(&spec, paths, n, &first);
        if (!err && first >= n) abort();
        if (!err && spec.quant[0] && !em_hub_path_has_quant(paths[first], spec.quant)) abort();
    }
    em_err_free(err);
    free(text);
    return 0;
}
