/* `ember convert HF_DIR -o OUT.gguf [--type TYPE] [--name NAME] [--no-tokenizer]` */
#include <stdio.h>
#include <string.h>

#include "../model/convert/convert.h"
#include "../model/quantize/quantize.h"
#include "cli.h"

static void usage(FILE *to) {
    fprintf(to, "usage: ember convert HF_DIR -o OUT.gguf [--type TYPE] [--name NAME] [--no-tokenizer]\n"
                "  HF_DIR holds config.json, *.safetensors (or sharded with model.safetensors.index.json),\n"
                "  tokenizer.json and tokenizer_config.json. --type (default F16): a recipe of `ember quantize`,\n"
                "  with llama.cpp's per-tensor rules (docs/quantize.md); norms, biases and MoE routers stay f32,\n"
                "  rows a block type does not divide fall back to a smaller block.\n"
                "  TYPE: %s\n", em_recipe_names());
}

int em_cli_convert(int argc, char **argv) {
    em_convert_options o = {0};
    const char *dir = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-tokenizer")) {
            o.no_tokenizer = true;
            continue;
        }
        if (a[0] != '-') {
            if (dir) {
                usage(stderr);
                return em_cli_fail("convert", em_errorf(EM_ERR_INVALID, "one HF_DIR only ('%s' and '%s')", dir, a));
            }
            dir = a;
            continue;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return em_cli_fail("convert", em_errorf(EM_ERR_INVALID, "%s needs a value", a));
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--type")) o.type = v;
        else if (!strcmp(a, "--name")) o.name = v;
        else {
            usage(stderr);
            return em_cli_fail("convert", em_errorf(EM_ERR_INVALID, "unknown option '%s'", a));
        }
    }
    if (!dir || !out) {
        usage(stderr);
        return em_cli_fail("convert", em_errorf(EM_ERR_INVALID, "HF_DIR and -o OUT.gguf are required"));
    }
    em_convert_stats stats;
    em_err err = em_convert_hf(dir, out, &o, &stats);
    if (err) return em_cli_fail("convert", err);
    printf("%s: %s, %llu tensors, %.1f MB of tensor data\n", out, stats.arch, (unsigned long long)stats.n_tensors,
           (double)stats.n_bytes / 1e6);
    return 0;
}
