/* `ember pull`, `ember list`, `ember rm`: models from the Hugging Face Hub in the cache that
 * huggingface_hub and other tools share (src/hub, docs/pull.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../hub/hub.h"
#include "cli.h"

static const char pull_usage[] =
    "usage: ember pull [--hf-token TOKEN] ORG/NAME[:QUANT] | ORG/NAME/FILE.gguf\n"
    "  Downloads a GGUF model (every part of a split one) from the Hugging Face Hub into the shared\n"
    "  cache and prints the path to open. QUANT picks the file by its quantization tag\n"
    "  (case-insensitive: Q4_K_M, IQ3_XXS, ...); without one the first of Q4_K_M, Q4_K_S, Q5_K_M,\n"
    "  Q6_K, Q8_0, else the repository's first .gguf. A file already in the cache is not downloaded.\n"
    "  Environment: HF_TOKEN, HF_ENDPOINT, HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE=1 (cache only).\n";

static const char list_usage[] =
    "usage: ember list\n"
    "  The model repositories in the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub), with the\n"
    "  bytes they take and their .gguf models, whichever tool downloaded them.\n";

static const char rm_usage[] =
    "usage: ember rm ORG/NAME | ORG/NAME:QUANT | ORG/NAME/FILE.gguf ...\n"
    "  Removes from the cache a whole repository, or one model: its snapshot links and the\n"
    "  blobs no other snapshot uses.\n";

static bool wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
    return false;
}

int em_cli_pull(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        fputs(pull_usage, stdout);
        return 0;
    }
    const char *spec = NULL, *token = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--hf-token") && i + 1 < argc) token = argv[++i];
        else if (argv[i][0] == '-' || spec) {
            fputs(pull_usage, stderr);
            return em_cli_fail("pull", em_errorf(EM_ERR_INVALID, "unexpected argument '%s'", argv[i]));
        } else spec = argv[i];
    }
    if (!spec) {
        fputs(pull_usage, stderr);
        return em_cli_fail("pull", em_errorf(EM_ERR_INVALID, "which model? ORG/NAME[:QUANT]"));
    }
    em_hub_options options;
    char *path = NULL;
    em_err err = em_cli_hub_options(token, &options);
    if (!err) err = em_hub_pull(&options, spec, &path);
    if (err) return em_cli_fail("pull", err);
    char *shown = em_hub_printable(path); /* the file's name came from the Hub */
    printf("%s\n", shown ? shown : path);
    free(shown);
    free(path);
    return 0;
}

int em_cli_list(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        fputs(list_usage, stdout);
        return 0;
    }
    if (argc > 1) return em_cli_fail("list", em_errorf(EM_ERR_INVALID, "unexpected argument '%s'", argv[1]));
    em_hub_options options;
    em_hub_cached *repos = NULL;
    size_t n = 0;
    em_err err = em_cli_hub_options(NULL, &options);
    if (!err) err = em_hub_list(&options, &repos, &n);
    if (err) return em_cli_fail("list", err);
    if (n == 0) fprintf(stderr, "ember list: no models in %s\n", options.cache_dir);
    for (size_t r = 0; r < n; r++) {
        char size[32];
        em_hub_format_bytes((double)repos[r].bytes, size, sizeof size);
        char *repo = em_hub_printable(repos[r].repo);
        printf("%-60s %10s\n", repo ? repo : "?", size);
        free(repo);
        for (size_t m = 0; m < repos[r].n_models; m++) {
            const em_hub_cached_file *model = &repos[r].models[m];
            char parts[48] = "";
            em_hub_format_bytes((double)model->bytes, size, sizeof size);
            if (model->parts_present < model->parts)
                snprintf(parts, sizeof parts, " (%u of %u parts)", model->parts_present, model->parts);
            else if (model->parts > 1)
                snprintf(parts, sizeof parts, " (%u parts)", model->parts);
            char *shown = em_hub_printable(model->path);
            printf("  %s%s  %s\n", shown ? shown : "?", parts, size);
            free(shown);
        }
    }
    em_hub_cached_free(repos, n);
    return 0;
}

int em_cli_rm(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        fputs(rm_usage, stdout);
        return 0;
    }
    if (argc < 2) {
        fputs(rm_usage, stderr);
        return em_cli_fail("rm", em_errorf(EM_ERR_INVALID, "which model? ORG/NAME[:QUANT]"));
    }
    em_hub_options options;
    em_err err = em_cli_hub_options(NULL, &options);
    for (int i = 1; i < argc && !err; i++) {
        uint64_t freed = 0;
        char size[32];
        if ((err = em_hub_remove(&options, argv[i], &freed))) break;
        em_hub_format_bytes((double)freed, size, sizeof size);
        printf("removed %s (%s freed)\n", argv[i], size);
    }
    return err ? em_cli_fail("rm", err) : 0;
}
