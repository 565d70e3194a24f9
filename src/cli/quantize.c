/* `ember quantize IN.gguf OUT.gguf TYPE [--imatrix FILE] [--allow-requantize] [--threads N]` */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/quantize/quantize.h"
#include "../quant/quant.h"
#include "cli.h"

static void usage(FILE *to) {
    fprintf(to,
            "usage: ember quantize IN.gguf OUT.gguf TYPE [--imatrix FILE] [--allow-requantize] [--threads N]\n"
            "  Rewrites IN.gguf (F32, F16 or BF16 weights; a split set: its first part) with llama.cpp's recipe\n"
            "  for TYPE: per-tensor types as llama-quantize chooses them (output.weight Q6_K, more bits for\n"
            "  attn_v and ffn_down in some layers, norms and MoE routers kept, ...). See docs/quantize.md.\n"
            "  TYPE (case-insensitive): %s.\n"
            "  mix: Q6_K weights with IQ3_XXS expert stacks (the recipe of `ember synth --type mix`).\n"
            "  --imatrix FILE       llama.cpp importance matrix (GGUF or legacy .dat): tensors it has values for\n"
            "                       are quantized with those weights, and the recipe follows llama.cpp's rules\n"
            "                       for a run with an importance matrix\n"
            "  --allow-requantize   quantize tensors that are already in a block format\n"
            "  --threads N          worker threads (default: every CPU)\n",
            em_recipe_names());
}

/* A type name as the progress line shows it: "q4_k". */
static void lower_name(uint32_t type, char *out, size_t size) {
    snprintf(out, size, "%s", em_type_name(type));
    for (char *c = out; *c; c++)
        if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
}

/* "[  12/  75] blk.1.ffn_down.weight  f32 → q4_k  0.50 → 0.07 MiB", with a note when the row
 * length forced a smaller block, Ember stands in for a type it cannot write, or the importance
 * matrix has no values for the tensor. */
static void print_progress(void *user, const em_quantize_progress *p) {
    (void)user;
    char from[16], to[16], note[160] = "";
    lower_name(p->from, from, sizeof from);
    lower_name(p->to, to, sizeof to);
    if (p->llama_type != p->to) {
        char llama[16];
        lower_name(p->llama_type, llama, sizeof llama);
        snprintf(note, sizeof note, " (llama.cpp: %s, which Ember cannot write)", llama);
    } else if (p->fallback) {
        snprintf(note, sizeof note, " (row fallback)");
    }
    if (p->importance == EM_IMPORTANCE_MISSING) {
        size_t used = strlen(note);
        snprintf(note + used, sizeof note - used, " (no importance values: unweighted)");
    }
    fprintf(stderr, "[%4llu/%4llu] %-36s %-6s → %-6s %9.2f → %9.2f MiB%s\n", (unsigned long long)p->index,
            (unsigned long long)p->count, p->name, from, to, (double)p->bytes_in / 1048576.0,
            (double)p->bytes_out / 1048576.0, note);
}

int em_cli_quantize(int argc, char **argv) {
    em_quantize_options o = {.progress = print_progress};
    const char *positional[3] = {NULL, NULL, NULL};
    int n_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--allow-requantize")) {
            o.allow_requantize = true;
            continue;
        }
        if (a[0] != '-' || !a[1]) {
            if (n_positional == 3) {
                usage(stderr);
                return em_cli_fail("quantize", em_errorf(EM_ERR_INVALID, "unexpected argument '%s'", a));
            }
            positional[n_positional++] = a;
            continue;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return em_cli_fail("quantize", em_errorf(EM_ERR_INVALID, "%s needs a value", a));
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--imatrix")) {
            o.imatrix = v;
        } else if (!strcmp(a, "--threads")) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 1024)
                return em_cli_fail("quantize", em_errorf(EM_ERR_INVALID, "--threads expects 1..1024, got '%s'", v));
            o.threads = (uint32_t)n;
        } else {
            usage(stderr);
            return em_cli_fail("quantize", em_errorf(EM_ERR_INVALID, "unknown option '%s'", a));
        }
    }
    if (n_positional < 3) {
        usage(stderr);
        return em_cli_fail("quantize", em_errorf(EM_ERR_INVALID, "IN.gguf, OUT.gguf and TYPE are required"));
    }
    o.type = positional[2];
    const em_recipe *recipe;
    em_err err = em_recipe_find(o.type, &recipe); /* before reading anything: a typo fails at once */
    if (err) return em_cli_fail("quantize", err);
    em_quantize_stats s;
    if ((err = em_quantize_gguf(positional[0], positional[1], &o, &s))) return em_cli_fail("quantize", err);
    if (o.imatrix && s.imatrix_matched < s.n_quantized)
        fprintf(stderr, "note: --imatrix %s has no values for %llu of the quantized tensors, quantized unweighted\n",
                o.imatrix, (unsigned long long)(s.n_quantized - s.imatrix_matched));
    if (s.n_fallback)
        fprintf(stderr, "note: %llu tensors have rows their block does not divide and took a smaller block\n",
                (unsigned long long)s.n_fallback);
    if (s.n_stand_in)
        fprintf(stderr, "note: %llu tensors use a K-format of the same or next larger size where llama.cpp chooses an "
                        "IQ format Ember cannot quantize\n", (unsigned long long)s.n_stand_in);
    char weighted[96] = "";
    if (o.imatrix)
        snprintf(weighted, sizeof weighted, ", %llu with importance weights (%llu imatrix entries)",
                 (unsigned long long)s.imatrix_weighted, (unsigned long long)s.imatrix_entries);
    printf("%s: %s, %llu tensors (%llu quantized%s), %.2f MiB -> %.2f MiB of tensor data (%.2f bits per weight)\n",
           positional[1], em_recipe_name(recipe), (unsigned long long)s.n_tensors, (unsigned long long)s.n_quantized,
           weighted, (double)s.bytes_in / 1048576.0, (double)s.bytes_out / 1048576.0,
           s.n_elements ? 8.0 * (double)s.bytes_out / (double)s.n_elements : 0.0);
    return 0;
}
