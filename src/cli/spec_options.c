/* Speculative decoding options (cli.h), read alike by run, chat, serve and bench:
 * --spec off|lookup|draft, --draft-model FILE (implies draft), --draft-max N, --draft-min N,
 * --spec-max-seqs N. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ember.h"

static em_err parse_count(const char *flag, const char *text, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (!*text || *end || errno || v < 0 || v > 256)
        return em_errorf(EM_ERR_INVALID, "%s expects a number of tokens in [0, 256], got '%s'", flag, text);
    *out = (int)v;
    return NULL;
}

bool em_cli_spec_option(em_cli_spec *spec, const char *flag, const char *value, em_err *err) {
    *err = NULL;
    if (!strcmp(flag, "--spec")) {
        if (!strcmp(value, "off")) spec->mode = EMBER_SPEC_OFF;
        else if (!strcmp(value, "lookup")) spec->mode = EMBER_SPEC_LOOKUP;
        else if (!strcmp(value, "draft")) spec->mode = EMBER_SPEC_DRAFT;
        else *err = em_errorf(EM_ERR_INVALID, "--spec expects off, lookup or draft, got '%s'", value);
    } else if (!strcmp(flag, "--draft-model") || !strcmp(flag, "-md")) {
        spec->draft_model = value;
    } else if (!strcmp(flag, "--draft-max") || !strcmp(flag, "--draft")) {
        *err = parse_count(flag, value, &spec->draft_max);
        if (!*err && spec->draft_max == 0) *err = em_errorf(EM_ERR_INVALID, "--draft-max must be at least 1 (--spec off turns drafting off)");
    } else if (!strcmp(flag, "--draft-min")) {
        *err = parse_count(flag, value, &spec->draft_min);
    } else if (!strcmp(flag, "--spec-max-seqs")) {
        *err = parse_count(flag, value, &spec->spec_max_seqs);
        if (!*err && spec->spec_max_seqs == 0)
            *err = em_errorf(EM_ERR_INVALID, "--spec-max-seqs must be at least 1 (--spec off turns drafting off)");
    } else {
        return false;
    }
    return true;
}

em_err em_cli_spec_apply(const em_cli_spec *spec, ember_options *options) {
    if (spec->mode == EMBER_SPEC_DRAFT && !spec->draft_model)
        return em_errorf(EM_ERR_INVALID, "--spec draft needs --draft-model FILE");
    if (spec->draft_model && spec->mode != EMBER_SPEC_DEFAULT && spec->mode != EMBER_SPEC_DRAFT)
        return em_errorf(EM_ERR_INVALID, "--draft-model drafts with a model; it does not go with --spec %s",
                         spec->mode == EMBER_SPEC_OFF ? "off" : "lookup");
    const int max = spec->draft_max ? spec->draft_max : 16;
    if (spec->draft_min > max)
        return em_errorf(EM_ERR_INVALID, "--draft-min %d is above --draft-max %d", spec->draft_min, max);
    options->speculative = spec->mode;
    options->draft_model_path = spec->draft_model;
    options->draft_max = spec->draft_max;
    options->draft_min = spec->draft_min;
    options->spec_max_seqs = spec->spec_max_seqs;
    return NULL;
}
