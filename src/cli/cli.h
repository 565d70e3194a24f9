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
#include <stdint.h>

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

/* The prefix cache's lower tiers (generate_options.c; docs/serve.md, "Prefix cache tiers"), read
 * alike by `serve`, `run` and `chat`: --cache-ram BYTES, --cache-dir DIR, --cache-disk BYTES. */
typedef struct em_cli_cache {
    uint64_t ram;    /* EMBER_CACHE_RAM_AUTO unless given; 0 = off */
    const char *dir; /* NULL: no disk tier */
    uint64_t disk;   /* 0: the default */
} em_cli_cache;

#define EM_CLI_CACHE_USAGE                                                                              \
    "  --cache-ram BYTES  host RAM for KV blocks evicted from the cache, restored when a prompt\n"     \
    "                     matches them (suffixes K, M, G; 0 = off; default: a quarter of the free\n"   \
    "                     memory, at most 8G)\n"                                                        \
    "  --cache-dir DIR    keep evicted KV blocks on disk too, across restarts (a slot of DIR per\n"     \
    "                     process); --cache-disk BYTES bounds it (default: half the free space, at\n" \
    "                     most 16G)\n"
#define EM_CLI_CACHE_NAMES "--cache-ram", "--cache-dir", "--cache-disk"

void em_cli_cache_default(em_cli_cache *cache);
/* True when `flag` is one of the options above (*err set if its value is bad). */
bool em_cli_cache_option(em_cli_cache *cache, const char *flag, const char *value, em_err *err);
struct ember_options;
void em_cli_cache_apply(const em_cli_cache *cache, struct ember_options *engine);

/* The options of the commands that generate, `run` and `chat` (generate_options.c): the engine's
 * context, threads and device, the reply's length and the sampler, with one set of names, one set
 * of defaults and one help text. */
typedef struct em_cli_generate {
    const char *device;    /* --device cpu|cuda (NULL: the GPU when there is one) */
    int ctx;               /* -c, --ctx N (0: the model's, at most 8192) */
    int threads;           /* -t, --threads N (0: all cores) */
    int max_tokens;        /* -n N: the most tokens of one reply */
    float temperature;     /* --temp T: EM_CLI_DEFAULT_TEMPERATURE unless given */
    int top_k;             /* --top-k K */
    float top_p, min_p;    /* --top-p P, --min-p P */
    float repeat_penalty;  /* --repeat-penalty R */
    uint64_t seed;         /* --seed S, else a random one (seed_given false) */
    bool seed_given;
    em_cli_cache cache;    /* --cache-ram, --cache-dir, --cache-disk */
} em_cli_generate;

/* One default temperature for every command that samples on the command line (docs/run.md): the
 * engine's own (ember_request_default), and what Ollama and llama.cpp use. */
#define EM_CLI_DEFAULT_TEMPERATURE 0.8f
#define EM_CLI_DEFAULT_MAX_TOKENS 512

#define EM_CLI_GENERATE_USAGE                                                                        \
    "  -n N               the most tokens of one reply (default 512; it also ends at end of text)\n" \
    "  --temp T           sampling temperature, 0 = greedy (default 0.8)\n"                          \
    "  --top-k K, --top-p P, --min-p P  candidate filters (defaults 40, 0.95, 0.05; 0, 1, 0 = off)\n" \
    "  --repeat-penalty R divides positive logits of the last 64 tokens' ids (default 1 = off)\n"   \
    "  --seed S           the sampler's seed: the same seed, the same text (default: random)\n"      \
    "  -c, --ctx N        the context: prompt and reply, in tokens (default: the model's, at most 8192)\n" \
    "  -t, --threads N    CPU threads (default: all cores)\n"                                        \
    "  --device cpu|cuda  the backend (default: the GPU when there is one)\n"                          \
    EM_CLI_CACHE_USAGE

/* The defaults above, with a fresh random seed. */
void em_cli_generate_default(em_cli_generate *options);
/* True when `flag` is one of the options above (*err set if its value is bad). */
bool em_cli_generate_option(em_cli_generate *options, const char *flag, const char *value, em_err *err);
/* Copies them into the engine's options and a request's sampling. */
struct ember_sampling;
void em_cli_generate_apply(const em_cli_generate *options, struct ember_options *engine);
void em_cli_generate_sampling(const em_cli_generate *options, struct ember_sampling *sampling);
/* A random 63-bit seed from the system's generator. */
uint64_t em_cli_random_seed(void);

/* Every name of the option sets above, for telling a mistyped option from one that lacks its value. */
#define EM_CLI_MODEL_NAMES "-m", "--model", "--gguf", "--hf", "--hf-token"
#define EM_CLI_SPEC_NAMES "--spec", "--draft-model", "-md", "--draft-max", "--draft", "--draft-min", "--spec-max-seqs"
#define EM_CLI_GENERATE_NAMES                                                                                        \
    "-n", "--max-tokens", "--temp", "--temperature", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed", \
        "-c", "--ctx", "-t", "--threads", "--device", EM_CLI_CACHE_NAMES

/* Ctrl-C while a command generates: em_cli_catch_interrupts installs a SIGINT handler that only
 * counts (the one piece of global state in the program besides the logger: a signal handler has
 * nowhere else to write); the generation loops poll em_cli_interrupted and cancel their request.
 * `interrupt_reads`: a read that Ctrl-C interrupts returns (EINTR) rather than going on, for the
 * one read that should end early (chat's plain line reader on a terminal); false elsewhere, so
 * that writes are never cut short. */
void em_cli_catch_interrupts(bool interrupt_reads);
/* True once Ctrl-C was pressed since the last call; clears it. */
bool em_cli_interrupted(void);

/* The lines `ember chat` reads (chat_input.c): on a terminal, in a build with libedit, an editor with
 * history, bracketed paste and Ctrl-C clearing the line; otherwise plain lines from standard input
 * (on a terminal Ctrl-C still drops the line). The prompt is ">>> ", or "... " while `continuing`. */
typedef struct em_cli_line_reader em_cli_line_reader;
em_err em_cli_line_reader_open(em_cli_line_reader **reader);
/* True when the editor reads the lines (a terminal, and libedit built in). */
bool em_cli_line_reader_editing(const em_cli_line_reader *reader);
/* The next line without its newline (owned by the reader, valid until the next call), or NULL at the
 * end of input (Ctrl-D); *cleared when Ctrl-C dropped it (the line is then empty). */
const char *em_cli_read_line(em_cli_line_reader *reader, bool continuing, bool *cleared);
/* Adds a turn to the history that Up and Down walk. */
void em_cli_line_reader_remember(em_cli_line_reader *reader, const char *turn);
void em_cli_line_reader_close(em_cli_line_reader *reader);

/* The nearest of `names` (NULL-terminated) to the unknown option `flag`, or NULL when none is close. */
const char *em_cli_nearest_option(const char *flag, const char *const *names);

/* Prints "ember <command>: <message>" to stderr, frees the error, and returns 1. */
int em_cli_fail(const char *command, em_err err);

/* A whole file ("-": standard input) into memory: *out malloc'd and NUL-terminated, *len without the NUL. */
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
