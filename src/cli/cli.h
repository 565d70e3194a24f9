/*
 * cli — the `ember` program: argument parsing and one file per subcommand.
 *
 * This is the only layer allowed to print results and to choose exit statuses: each subcommand
 * returns 0 on success and 1 on any error, after printing the error's message to stderr. Below
 * src/cli nothing exits or aborts.
 */
#ifndef EMBER_CLI_H
#define EMBER_CLI_H

#include "../base/base.h"

/* Prints "ember <command>: <message>" to stderr, frees the error, and returns 1. */
int em_cli_fail(const char *command, em_err err);

int em_cli_info(int argc, char **argv);
int em_cli_serve(int argc, char **argv);
int em_cli_synth(int argc, char **argv);
int em_cli_run(int argc, char **argv);
int em_cli_tokenize(int argc, char **argv);
int em_cli_chat_template(int argc, char **argv);
int em_cli_bench(int argc, char **argv);
int em_cli_chat(int argc, char **argv);
int em_cli_convert(int argc, char **argv);

#endif
