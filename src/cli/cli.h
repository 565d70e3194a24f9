/*
 * cli — the `ember` program: argument parsing and one file per subcommand.
 *
 * This is the only layer allowed to print results and to choose exit statuses: each subcommand
 * returns 0 on success and 1 on any error, after printing the error's message to stderr. Below
 * src/cli nothing exits or aborts.
 */
#ifndef EMBER_CLI_H
#define EMBER_CLI_H

#include <stdbool.h>

#include "../base/base.h"

/* Where a command's model comes from: a file, or a model on the Hugging Face Hub that is pulled
 * into the shared cache first (model_source.c, docs/pull.md). */
typedef struct em_cli_model {
    const char *file;     /* -m, --model, --gguf */
    const char *hf;       /* --hf ORG/NAME[:QUANT] or ORG/NAME/FILE.gguf */
    const char *hf_token; /* --hf-token (else HF_TOKEN) */
    char *pulled;         /* the path --hf resolved to; owned, freed by em_cli_model_free */
    int weights_memory;   /* an ember_weights_memory: --mmap, --no-mmap, else automatic */
} em_cli_model;

/* The usage lines of those options, for every command's help. */
#define EM_CLI_MODEL_USAGE                                                                       \
    "  -m, --gguf FILE    the model (a split set: its first part, NAME-00001-of-0000N.gguf)\n" \
    "  --hf ORG/NAME[:QUANT]  a model from the Hugging Face Hub, downloaded once into the shared\n" \
    "                     cache (or ORG/NAME/FILE.gguf); see `ember pull --help`\n"              \
    "  --hf-token TOKEN   for gated or private repositories (default: HF_TOKEN)\n"                \
    "  --no-mmap, --mmap  read the weights into memory, or map the file (default: read when the\n" \
    "                     CPU runs the model and it takes at most half the memory available)\n"

/* True when `flag` is one of the model options; its value is kept in `model`. */
bool em_cli_model_option(em_cli_model *model, const char *flag, const char *value);

/* True when `flag` is one of the model options without a value (--mmap, --no-mmap), kept in `model`. */
bool em_cli_model_flag(em_cli_model *model, const char *flag);

/* The path to open: the file, or the Hub model pulled now. An error when neither or both are given. */
em_err em_cli_model_path(em_cli_model *model, const char **path);
void em_cli_model_free(em_cli_model *model);

/* The Hub settings from the environment, with --hf-token (NULL: none given) and a progress line
 * when stderr is a terminal. */
struct em_hub_options;
em_err em_cli_hub_options(const char *token, struct em_hub_options *options);

/* Speculative decoding options (spec_options.c, docs/speculative.md), for run, chat, serve, bench. */
typedef struct em_cli_spec {
    int mode;                /* an ember_spec: --spec off|lookup|draft (default: draft with a draft model, else off) */
    const char *draft_model; /* --draft-model FILE */
    int draft_max, draft_min; /* --draft-max N (0: the engine's 16), --draft-min N */
    int spec_max_seqs;        /* --spec-max-seqs N (0: the engine's 4) */
} em_cli_spec;

#define EM_CLI_SPEC_USAGE                                                                              \
    "  --spec off|lookup|draft  speculative decoding: drafts from the prompt and output (lookup) or a\n" \
    "                     draft model, verified in one step; the output is unchanged (default: off,\n" \
    "                     or draft with --draft-model)\n"                                              \
    "  --draft-model FILE a smaller model with the same vocabulary that drafts (implies --spec draft)\n" \
    "  --draft-max N      most tokens drafted per step (default 16); --draft-min N: the adaptive\n"    \
    "                     draft length never drops below N (default 0)\n"                           \
    "  --spec-max-seqs N  drafts only while at most N requests run (default 4)\n"

/* True when `flag` is one of the speculative decoding options (*err set if its value is bad). */
bool em_cli_spec_option(em_cli_spec *spec, const char *flag, const char *value, em_err *err);
/* Checks the options together and copies them into the engine options. */
struct ember_options;
em_err em_cli_spec_apply(const em_cli_spec *spec, struct ember_options *options);

/* Prints "ember <command>: <message>" to stderr, frees the error, and returns 1. */
int em_cli_fail(const char *command, em_err err);

/* A whole file into memory: *out malloc'd and NUL-terminated, *len without the NUL. */
em_err em_cli_read_file(const char *path, char **out, size_t *len);

int em_cli_info(int argc, char **argv);
int em_cli_serve(int argc, char **argv);
int em_cli_synth(int argc, char **argv);
int em_cli_run(int argc, char **argv);
int em_cli_tokenize(int argc, char **argv);
int em_cli_chat_template(int argc, char **argv);
int em_cli_bench(int argc, char **argv);
int em_cli_chat(int argc, char **argv);
int em_cli_convert(int argc, char **argv);
int em_cli_quantize(int argc, char **argv);
int em_cli_pull(int argc, char **argv);
int em_cli_list(int argc, char **argv);
int em_cli_rm(int argc, char **argv);
int em_cli_perplexity(int argc, char **argv);

#endif
