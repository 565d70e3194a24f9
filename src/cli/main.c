/* `ember` — dispatches to one subcommand per file (see cli.h). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
    bool own_help; /* the command answers --help itself, with its options */
} subcommand;

static const subcommand subcommands[] = {
    {"bench", em_cli_bench, "bench (-m M.gguf | --hf ORG/NAME[:Q]) [--concurrency 1,2,4] [-n N] [--spec MODE] | --prefix-reuse   engine measurements", false},
    {"chat", em_cli_chat, "chat (-m M.gguf | --hf ORG/NAME[:Q]) [--system TEXT] [-c CTX] [--temp T] ...   a conversation in the terminal", true},
    {"chat-template", em_cli_chat_template, "chat-template (--template F.jinja | -m M.gguf) --messages M.json [...]  render a chat prompt", false},
    {"pull", em_cli_pull, "pull ORG/NAME[:QUANT]             download a model from the Hugging Face Hub, print its path", true},
    {"list", em_cli_list, "list                              the models in the Hugging Face cache, with sizes", true},
    {"rm", em_cli_rm, "rm ORG/NAME[:QUANT]               remove a model (or a repository) from that cache", true},
    {"info", em_cli_info, "info FILE.gguf [--json]          metadata, tensors, bytes read per token", false},
    {"run", em_cli_run, "run (-m M.gguf | --hf ORG/NAME[:Q]) (-p TEXT | -f FILE) [--system T] [--raw] ...   answer a prompt", true},
    {"serve", em_cli_serve, "serve (-m M.gguf | --hf ORG/NAME[:Q]) [--port N] [--api-key K] ...   OpenAI/Anthropic-compatible HTTP server", true},
    {"synth", em_cli_synth, "synth --preset P --type T -o OUT.gguf   write a model with random weights", true},
    {"convert", em_cli_convert, "convert HF_DIR -o OUT.gguf [--type TYPE]   Hugging Face checkpoint -> GGUF", true},
    {"perplexity", em_cli_perplexity, "perplexity (-m M.gguf | --hf ORG/NAME[:Q]) -f TEXT [--ctx N] [--kl-base B.logits]   perplexity, KL divergence", true},
    {"quantize", em_cli_quantize, "quantize IN.gguf OUT.gguf TYPE [--imatrix F] ...   requantize a GGUF (Q4_K_M, Q6_K, IQ4_XS, ...)", true},
    {"tokenize", em_cli_tokenize, "tokenize -m M.gguf [--raw] [--ids] [-f FILE | TEXT] | --decode ID...   text <-> token ids", true},
};

static void print_usage(FILE *to) {
    fprintf(to, "usage: ember COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(to, "  %s\n", subcommands[i].usage);
}

int em_cli_fail(const char *command, em_err err) {
    fprintf(stderr, "ember %s: %s\n", command, em_err_message(err));
    em_err_free(err);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return 1;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("ember %s (CUDA backend %s)\n", EM_VERSION,
#ifdef EM_HAVE_CUDA
               "built"
#else
               "not built"
#endif
        );
        return 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++) {
        const subcommand *c = &subcommands[i];
        if (strcmp(argv[1], c->name)) continue;
        if (!c->own_help && argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
            printf("usage: ember %s\n(docs/%s.md has the details)\n", c->usage, c->name);
            return 0;
        }
        return c->run(argc - 1, argv + 1);
    }
    fprintf(stderr, "ember: unknown command '%s'\n", argv[1]);
    print_usage(stderr);
    return 1;
}
