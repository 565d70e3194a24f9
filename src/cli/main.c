/* `ember` — dispatches to one subcommand per file (see cli.h). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} subcommand;

static const subcommand subcommands[] = {
    {"bench", em_cli_bench, "bench (-m M.gguf | --hf ORG/NAME[:Q]) [--concurrency 1,2,4] [-n N] | --prefix-reuse   engine measurements"},
    {"chat", em_cli_chat, "chat (-m M.gguf | --hf ORG/NAME[:Q]) [--system TEXT] [-n N] [--temp T]   interactive chat on stdin/stdout"},
    {"chat-template", em_cli_chat_template, "chat-template (--template F.jinja | -m M.gguf) --messages M.json [...]  render a chat prompt"},
    {"pull", em_cli_pull, "pull ORG/NAME[:QUANT]             download a model from the Hugging Face Hub, print its path"},
    {"list", em_cli_list, "list                              the models in the Hugging Face cache, with sizes"},
    {"rm", em_cli_rm, "rm ORG/NAME[:QUANT]               remove a model (or a repository) from that cache"},
    {"info", em_cli_info, "info FILE.gguf [--json]          metadata, tensors, bytes read per token"},
    {"run", em_cli_run, "run (-m M.gguf | --hf ORG/NAME[:Q]) -p TEXT [-n N] [--temp T] ...   generate text"},
    {"serve", em_cli_serve, "serve (-m M.gguf | --hf ORG/NAME[:Q]) [--port N] [--api-key K] ...   OpenAI/Anthropic-compatible HTTP server"},
    {"synth", em_cli_synth, "synth --preset P --type T -o OUT.gguf   write a model with random weights"},
    {"convert", em_cli_convert, "convert HF_DIR -o OUT.gguf [--type f32|f16|bf16|q8_0|q4_k]   Hugging Face checkpoint -> GGUF"},
    {"tokenize", em_cli_tokenize, "tokenize -m M.gguf [--raw] [--ids] [-f FILE | TEXT] | --decode ID...   text <-> token ids"},
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
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (!strcmp(argv[1], subcommands[i].name)) return subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ember: unknown command '%s'\n", argv[1]);
    print_usage(stderr);
    return 1;
}
