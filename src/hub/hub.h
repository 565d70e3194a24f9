/*
 * hub — models from the Hugging Face Hub: naming them (`ORG/NAME[:QUANT]`, `ORG/NAME/FILE.gguf`),
 * listing a repository through the Hub's HTTP API, downloading its GGUF files into the cache that
 * huggingface_hub and other tools share, and finding, listing and removing what that cache holds.
 *
 * The cache is huggingface_hub's layout, so that a file any of those tools downloaded is found
 * here and the other way round (docs/pull.md draws it):
 *   CACHE/models--ORG--NAME/blobs/<sha256, or the git oid of a non-LFS file>   the bytes
 *   CACHE/models--ORG--NAME/snapshots/<commit>/<path>   a relative symlink to ../../blobs/<blob>
 *   CACHE/models--ORG--NAME/refs/<revision>             the commit the revision named
 *   CACHE/models--ORG--NAME/blobs/<blob>.incomplete     a download in progress, resumed with Range
 *   CACHE/.locks/models--ORG--NAME/<blob>.lock          flock()ed while one process downloads it
 * A blob takes its name only after its size and sha256 matched the Hub's listing, so a partial or
 * corrupt file never sits where a reader looks.
 *
 * What it does not own: reading GGUF files (gguf, which also defines the split-set naming this
 * module uses to pull a split model's parts together), printing (the command line passes a
 * progress switch; the only output here is that progress line on stderr).
 *
 * Threads: none of its own; libcurl runs in the calling thread. Every call is independent: the
 * settings live in an em_hub_options the caller fills once (em_hub_options_from_env).
 *
 * Ownership: strings returned through `char **` and arrays through `em_hub_cached **` belong to the
 * caller (free, em_hub_cached_free).
 *
 * Depends on base, gguf (split names), libcurl, libcrypto (SHA-256) and jansson.
 */
#ifndef EMBER_HUB_H
#define EMBER_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

#define EM_HUB_DEFAULT_ENDPOINT "https://huggingface.co"
#define EM_HUB_PATH_MAX 4096

/* What `ORG/NAME[:QUANT]` or `ORG/NAME/FILE.gguf` asks for. */
typedef struct em_hub_spec {
    char repo[256];  /* "ORG/NAME" */
    char quant[64];  /* the quantization tag asked for ("Q4_K_M"), "" for the default order */
    char file[1024]; /* a file's path inside the repository, "" when a tag (or nothing) picks it */
} em_hub_spec;

/* Parses a spec; an error says what form was expected. */
em_err em_hub_spec_parse(const char *text, em_hub_spec *out);

/* The settings of every call, filled once. Strings are copied in. */
typedef struct em_hub_options {
    char endpoint[1024];               /* $HF_ENDPOINT, else EM_HUB_DEFAULT_ENDPOINT; no trailing slash */
    char cache_dir[EM_HUB_PATH_MAX];   /* $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub */
    char token[1024];                  /* $HF_TOKEN, else the token file $HF_HOME/token; "" for none */
    char revision[256];                /* the branch, tag or commit to pull: "main" */
    bool offline;                      /* $HF_HUB_OFFLINE is 1/true/yes/on: the cache only, no network */
    bool progress;                     /* a progress line on stderr while downloading */
} em_hub_options;

/* Fills `out` from the environment (the variables above). An error when no cache directory can be
 * named ($HOME unset) or a value is too long. */
em_err em_hub_options_from_env(em_hub_options *out);

/* Downloads (or finds in the cache) the model `spec` names: one .gguf file, or every part of a split
 * set. *path is the snapshot path of the file to open (a split set's first part). With
 * `options->offline` only the cache is consulted. */
em_err em_hub_pull(const em_hub_options *options, const char *spec, char **path);

/* One repository in the cache. */
typedef struct em_hub_cached_file {
    char *path;     /* inside the repository ("tiny-Q8_0.gguf"); a split set's first part */
    uint64_t bytes;         /* all parts present together */
    uint32_t parts;         /* 1, or the split set's count */
    uint32_t parts_present; /* fewer than `parts` when some are missing */
} em_hub_cached_file;

typedef struct em_hub_cached {
    char *repo;                 /* "ORG/NAME" */
    uint64_t bytes;             /* every blob of the repository (what removing it frees) */
    em_hub_cached_file *models; /* the .gguf models of its snapshots, each once */
    size_t n_models;
} em_hub_cached;

/* Every model repository in the cache, sorted by name (ones other tools downloaded included). */
em_err em_hub_list(const em_hub_options *options, em_hub_cached **repos, size_t *n_repos);
void em_hub_cached_free(em_hub_cached *repos, size_t n_repos);

/* Removes from the cache what `spec` names: a whole repository for `ORG/NAME`, or, with a tag or a
 * file, that model's links in every snapshot and then the blobs no remaining link uses.
 * *freed_bytes says how much was removed. */
em_err em_hub_remove(const em_hub_options *options, const char *spec, uint64_t *freed_bytes);

/* "1.5 GiB": a byte count for people (the progress line, `ember list`). */
void em_hub_format_bytes(double bytes, char *out, size_t size);
/* `text` (a file or repository name, which comes from the network) made safe to print: control
 * bytes (below 0x20, 0x7f, and UTF-8's C1 controls) and backslashes written as \xNN, so that a
 * name cannot start a new line or drive the terminal. Malloc'd; NULL when out of memory. */
char *em_hub_printable(const char *text);

/* ---- Pure parts, exposed for the tests ---- */

/* True when the file at `path` (in a repository) carries the quantization tag `quant`:
 * case-insensitive, delimited by the start, the end or one of "/-." ("Q4_K" is not "Q4_K_M"). */
bool em_hub_path_has_quant(const char *path, const char *quant);

/* The tags tried, in order, when a spec names none. NULL-terminated. */
const char *const *em_hub_default_quants(void);

/* Picks the model `spec` names among a repository's file paths: *first is the index of the file
 * to open (a split set's first part). An error lists the repository's .gguf models when the tag
 * matches none or several. */
em_err em_hub_select(const em_hub_spec *spec, const char *const *paths, size_t n_paths, size_t *first);

/* "models--ORG--NAME" for "ORG/NAME". */
void em_hub_repo_folder(const char *repo, char *out, size_t size);

#endif
