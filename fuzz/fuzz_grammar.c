/* libFuzzer target: the grammar compiler and the JSON Schema converter. The first byte picks the
 * input kind (GBNF or a JSON schema); the rest is the text. Whatever compiles is then walked: a
 * random sentence must be accepted again, and a few bytes of the input fed to a fresh state must
 * leave it consistent (complete implies zero bytes to completion). Nothing may leak or crash;
 * malformed input is an error with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size > 4096) return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char *gbnf = NULL;
    em_err err = NULL;
    if (data[0] & 1) {
        err = em_grammar_from_json_schema(text, len, &gbnf);
        if (err) {
            if (!em_err_message(err)[0]) abort();
            em_err_free(err);
            return 0;
        }
        text = gbnf;
        len = strlen(gbnf);
    }
    em_grammar *g = NULL;
    err = em_grammar_compile(text, len, &g);
    if (err) {
        if (gbnf) abort(); /* what the converter writes must compile */
        if (!em_err_message(err)[0]) abort();
        em_err_free(err);
        return 0;
    }
    /* Generation tries every byte value at every step: keep it to grammars with short sentences. */
    em_grammar_state *probe = NULL;
    uint32_t shortest = UINT32_MAX;
    if (!em_grammar_state_new(g, &probe)) shortest = em_grammar_bytes_to_complete(probe);
    em_grammar_state_free(probe);
    char *sentence = NULL;
    size_t sentence_len = 0;
    err = shortest > 256 ? NULL : em_grammar_generate(g, size, 64, &sentence, &sentence_len);
    /* every state can be finished: the only failures are memory and grammars too ambiguous to follow */
    if (err && em_err_code_of(err) != EM_ERR_NOMEM && em_err_code_of(err) != EM_ERR_UNSUPPORTED) abort();
    em_err_free(err);
    if (!err && shortest <= 256) {
        em_grammar_state *s = NULL;
        if (!em_grammar_state_new(g, &s)) {
            if (!em_grammar_accept_bytes(s, sentence, sentence_len) || !em_grammar_complete(s)) abort();
            em_grammar_state_free(s);
        }
        free(sentence);
    }
    em_grammar_state *s = NULL;
    if (!em_grammar_state_new(g, &s)) {
        for (size_t i = 0; i < len && i < 64; i++) em_grammar_accept_bytes(s, &data[i], 1);
        if (em_grammar_complete(s) && em_grammar_bytes_to_complete(s) != 0) abort();
        em_grammar_state_free(s);
    }
    em_grammar_free(g);
    free(gbnf);
    return 0;
}
