/* Where a command's model comes from (cli.h): a file (-m, --model, --gguf) or the Hub (--hf, with
 * --hf-token), resolved to the path the engine opens. Every command that loads a model parses
 * these options through here, so they read and behave the same everywhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../hub/hub.h"
#include "ember.h"
#include "cli.h"

bool em_cli_model_option(em_cli_model *model, const char *flag, const char *value) {
    if (!strcmp(flag, "-m") || !strcmp(flag, "--model") || !strcmp(flag, "--gguf")) model->file = value;
    else if (!strcmp(flag, "--hf")) model->hf = value;
    else if (!strcmp(flag, "--hf-token")) model->hf_token = value;
    else return false;
    return true;
}

bool em_cli_model_flag(em_cli_model *model, const char *flag) {
    if (!strcmp(flag, "--mmap")) model->weights_memory = EMBER_WEIGHTS_MAPPED;
    else if (!strcmp(flag, "--no-mmap")) model->weights_memory = EMBER_WEIGHTS_IN_MEMORY;
    else return false;
    return true;
}

em_err em_cli_hub_options(const char *token, em_hub_options *options) {
    em_err err = em_hub_options_from_env(options);
    if (err) return err;
    if (token) {
        if (strlen(token) >= sizeof options->token)
            return em_errorf(EM_ERR_INVALID, "--hf-token is longer than %zu characters", sizeof options->token - 1);
        strcpy(options->token, token);
    }
    options->progress = isatty(STDERR_FILENO);
    return NULL;
}

em_err em_cli_model_path(em_cli_model *model, const char **path) {
    *path = NULL;
    if (model->file && model->hf)
        return em_errorf(EM_ERR_INVALID, "give a model file (-m/--gguf) or a Hub model (--hf), not both");
    if (model->file) {
        *path = model->file;
        return NULL;
    }
    if (!model->hf) return em_errorf(EM_ERR_INVALID, "a model is required: -m FILE.gguf (or --gguf) or --hf ORG/NAME[:QUANT]");
    em_hub_options options;
    em_err err = em_cli_hub_options(model->hf_token, &options);
    if (!err) err = em_hub_pull(&options, model->hf, &model->pulled);
    if (err) return err;
    *path = model->pulled;
    return NULL;
}

void em_cli_model_free(em_cli_model *model) {
    free(model->pulled);
    model->pulled = NULL;
}
