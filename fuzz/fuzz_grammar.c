/* libFuzzer target: the grammar compiler and the JSON Schema converter (regex patterns included).
 * The first byte picks the input kind: bit 0 a JSON schema (else GBNF), bit 1 an amplified text
 * (amplify.h: deep nesting and wide fan-out from a few bytes). The rest is the text. Whatever
 * compiles is then walked: a random sentence must be accepted again, and a few bytes of the input
 * fed to a fresh state must leave it consistent (complete implies zero bytes to completion).
 * Nothing may leak or crash; malformed input is an error with a message. Each input runs on a
 * thread of 512 KiB of stack, so that recursion the input controls shows as a crash here rather
 * than in a server thread. Run with -dict=fuzz/grammar.dict. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amplify.h"
#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *data, size_t size, const char *text, size_t len);

typedef struct input {
    const uint8_t *data;
    size_t size;
} input;

static void *run(void *arg) {
    const input *in = arg;
    size_t len = in->size - 1;
    char *amplified = in->data[0] & 2 ? em_fuzz_amplify(in->data + 1, in->size - 1, &len) : NULL;
    if (in->data[0] & 2 && !amplified) return NULL;
    check(in->data, in->size, amplified ? amplified : (const char *)in->data + 1, len);
    free(amplified);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size > 4096) return 0;
    input in = {data, size};
    pthread_attr_t attr;
    pthread_t thread;
    if (pthread_attr_init(&attr) || pthread_attr_setstacksize(&attr, 512 * 1024) || pthread_create(&thread, &attr, run, &in))
        abort();
    pthread_join(thread, NULL);
    pthread_attr_destroy(&attr);
    return 0;
}

static void check(const uint8_t *data, size_t size, const char *text, size_t len) {
    char *gbnf = NULL;
    em_err err = NULL;
    if (data[0] & 1) {
        err = em_grammar_from_json_schema(text, len, &gbnf);
        if (err) {
            if (!em_err_message(err)[0]) abort();
            em_err_free(err);
            return;
        }
        text = gbnf;
        len = strlen(gbnf);
    }
    em_grammar *g = NULL;
    err = em_grammar_compile(text, len, &g);
    if (err) {
        /* what the converter writes must compile, unless it passes a limit of the compiler or
         * recurses forever (a $ref cycle that consumes nothing) */
        if (gbnf && !strstr(em_err_message(err), "(the limit)") && !strstr(em_err_message(err), "left-recursive") &&
            !strstr(em_err_message(err), "never ends"))
            abort();
        if (!em_err_message(err)[0]) abort();
        em_err_free(err);
        free(gbnf);
        return;
    }
    /* Generation tries every byte value at every step: keep it to grammars with short sentences. */
    em_grammar_state *probe = NULL;
    uint32_t shortest = UINT32_MAX;
    em_err start = em_grammar_state_new(g, &probe); /* too ambiguous from the start: nothing to walk */
    if (!start) shortest = em_grammar_bytes_to_complete(probe);
    em_grammar_state_free(probe);
    if (start) {
        if (em_err_code_of(start) != EM_ERR_NOMEM && em_err_code_of(start) != EM_ERR_UNSUPPORTED) abort();
        em_err_free(start);
        em_grammar_free(g);
        free(gbnf);
        return;
    }
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
        for (size_t i = 0; i < size && i < 64; i++) em_grammar_accept_bytes(s, &data[i], 1);
        if (em_grammar_complete(s) && em_grammar_bytes_to_complete(s) != 0) abort();
        em_grammar_state_free(s);
    }
    em_grammar_free(g);
    free(gbnf);
}
