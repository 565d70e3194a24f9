/* Defaults of the public option and request structures (ember.h). */
#include <string.h>

#include "engine.h"

void ember_options_default(ember_options *options) {
    memset(options, 0, sizeof *options);
    options->batch_tokens = 2048;
    options->block_tokens = 16;
    options->max_sequences = 256;
    options->cache_ram_bytes = EMBER_CACHE_RAM_AUTO;
}

void ember_request_default(ember_request_params *params) {
    memset(params, 0, sizeof *params);
    params->add_special = true;
    params->max_tokens = 256;
    params->sampling.temperature = 0.8f;
    params->sampling.top_k = 40;
    params->sampling.top_p = 0.95f;
    params->sampling.min_p = 0.05f;
    params->sampling.repeat_penalty = 1.0f;
    params->sampling.repeat_last_n = 64;
}

int ember_error_code(const ember_error *error) { return (int)em_err_code_of((em_err)error); }
const char *ember_error_message(const ember_error *error) { return em_err_message((em_err)error); }
void ember_error_free(ember_error *error) { em_err_free(error); }
