/* `ember synth --preset P --type T -o OUT.gguf [--layers N] [--experts N] [--seed S] [--vocab V.gguf]` */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/model.h"
#include "cli.h"

static void usage(FILE *to) {
    fprintf(to, "usage: ember synth --preset P [--type T] -o OUT.gguf [--layers N] [--experts N] [--seed S]\n"
                "                   [--vocab VOCAB.gguf] [--rope-scaling none|linear:F|yarn:F:CTX|llama3:F:CTX]\n"
                "                   [--pooling mean|cls|last]\n"
                "  --pooling: the file names this pooling for embeddings (<arch>.pooling_type)\n"
                "  --type: f32 (default), f16, bf16, q8_0, q4_k, mix (q6_k with iq3_xxs experts), mxfp4 (q8_0 with mxfp4\n"
                "          experts)\n"
                "  --vocab: GGUF whose tokenizer is copied, e.g. the fixtures' vocab/ggml-vocab-llama-spm.gguf\n"
                "           (default: $EMBER_VOCAB, else the source tree's reference vocabulary)\n  presets:");
    for (size_t i = 0; em_synth_preset_name(i); i++) fprintf(to, " %s", em_synth_preset_name(i));
    fprintf(to, "\n");
}

static em_err parse_u32(const char *flag, const char *text, uint32_t *out) {
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (!*text || *end || v > UINT32_MAX || text[0] == '-')
        return em_errorf(EM_ERR_INVALID, "%s expects a non-negative integer, got '%s'", flag, text);
    *out = (uint32_t)v;
    return NULL;
}

int em_cli_synth(int argc, char **argv) {
    em_synth_options o = {.type = "f32"};
    const char *out = NULL;
    o.vocab_path = getenv("EMBER_VOCAB");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return em_cli_fail("synth", em_errorf(EM_ERR_INVALID, "%s needs a value", a));
        }
        const char *v = argv[++i];
        em_err err = NULL;
        uint64_t seed;
        char *end;
        if (!strcmp(a, "--preset")) o.preset = v;
        else if (!strcmp(a, "--type")) o.type = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--vocab")) o.vocab_path = v;
        else if (!strcmp(a, "--rope-scaling")) o.rope_scaling = v;
        else if (!strcmp(a, "--pooling")) {
            o.pooling = !strcmp(v, "mean") ? 1 : !strcmp(v, "cls") ? 2 : !strcmp(v, "last") ? 3 : 0;
            if (!o.pooling) err = em_errorf(EM_ERR_INVALID, "--pooling expects mean, cls or last, got '%s'", v);
        }
        else if (!strcmp(a, "--layers")) err = parse_u32(a, v, &o.layers);
        else if (!strcmp(a, "--experts")) err = parse_u32(a, v, &o.experts);
        else if (!strcmp(a, "--seed")) {
            seed = strtoull(v, &end, 10);
            if (!*v || *end) err = em_errorf(EM_ERR_INVALID, "--seed expects an integer, got '%s'", v);
            o.seed = seed;
        } else {
            usage(stderr);
            return em_cli_fail("synth", em_errorf(EM_ERR_INVALID, "unknown option '%s'", a));
        }
        if (err) return em_cli_fail("synth", err);
    }
    if (!o.preset || !out) {
        usage(stderr);
        return em_cli_fail("synth", em_errorf(EM_ERR_INVALID, "--preset and -o are required"));
    }
#ifdef EM_DEFAULT_VOCAB
    /* The llama-spm vocabulary of the source tree this binary was built from. */
    if (!o.vocab_path) o.vocab_path = EM_DEFAULT_VOCAB;
#endif
    if (!o.vocab_path) {
        usage(stderr);
        return em_cli_fail("synth", em_errorf(EM_ERR_INVALID, "no vocabulary: pass --vocab (the reference fixtures' "
                                                              "vocab/ggml-vocab-llama-spm.gguf) or set EMBER_VOCAB"));
    }
    em_err err = em_synth_write(&o, out);
    if (err) return em_cli_fail("synth", err);
    return 0;
}
