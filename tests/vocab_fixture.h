/* A tokenizer from one of the reference vocabularies in the fixtures (vocab/NAME), for tests that
 * walk real vocabularies; a missing or bad file fails the test. Include after cmocka.h. */
#ifndef EMBER_TESTS_VOCAB_FIXTURE_H
#define EMBER_TESTS_VOCAB_FIXTURE_H

#include <stdio.h>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

static em_tokenizer *load_tokenizer(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/%s", EM_FIXTURES_DIR, name);
    em_gguf *gguf;
    em_err err = em_gguf_open(path, &gguf);
    if (err) fail_msg("%s: %s", path, em_err_message(err));
    em_tokenizer *t;
    assert_null(em_tokenizer_from_gguf(gguf, &t));
    em_gguf_close(gguf);
    return t;
}

#endif
