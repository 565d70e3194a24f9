/* libFuzzer target: tokenizing any byte string gives ids or an error (never a crash), decoding the
 * ids of valid text in raw mode gives the text back on byte-level and byte-fallback vocabularies,
 * and the streaming detokenizer accepts any id sequence and only ever emits valid UTF-8.
 *
 * The vocabularies come from the shared fixtures: EM_FUZZ_VOCAB_DIR names their folder (default
 * tests/fixtures/reference/vocab, relative to the working directory). The first input byte picks the
 * vocabulary and the flags; the rest is the text (or, for odd selector bytes, also a list of ids). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const names[] = {"gpt-2", "llama-spm", "deepseek-llm", "bert-bge", "phi-3", "falcon"};
#define N_VOCABS (sizeof names / sizeof names[0])
static em_tokenizer *vocabs[N_VOCABS]; /* loaded once per fuzzing process */

static void load_all(void) {
    const char *dir = getenv("EM_FUZZ_VOCAB_DIR");
    if (!dir) dir = "tests/fixtures/reference/vocab";
    for (size_t i = 0; i < N_VOCABS; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", dir, names[i]);
        em_gguf *g;
        em_err err = em_gguf_open(path, &g);
        if (!err) err = em_tokenizer_from_gguf(g, &vocabs[i]);
        if (err) {
            fprintf(stderr, "fuzz_tokenizer: %s (set EM_FUZZ_VOCAB_DIR)\n", em_err_message(err));
            abort();
        }
        em_gguf_close(g);
    }
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vocabs[0]) load_all();
    if (size < 1) return 0;
    uint8_t selector = data[0];
    em_tokenizer *t = vocabs[(selector >> 1) % N_VOCABS];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char *copy = malloc(len ? len : 1); /* exact size: ASan sees reads past the end */
    if (!copy) return 0;
    memcpy(copy, text, len);
    bool parse = selector & 0x40, add = selector & 0x80;
    int32_t *ids;
    size_t n;
    em_err err = em_tokenize(t, copy, len, add, parse, &ids, &n);
    if (err) {
        em_err_free(err);
    } else {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= em_tokenizer_n_vocab(t)) abort();
        char *back;
        size_t back_len;
        if ((err = em_detokenize(t, ids, n, true, &back, &back_len))) abort();
        /* GPT-2's vocabulary has a token for every byte: raw text comes back exactly. (Not every
         * byte-level vocabulary does: Falcon's lacks some control bytes, which llama.cpp drops
         * too.) */
        if (t == vocabs[0] && !parse && !add &&
            (back_len != len || memcmp(back, copy, len)))
            abort();
        free(back);
        free(ids);
    }
    if (selector & 1) { /* the bytes as ids, streamed */
        em_detok *d;
        if (em_detok_new(t, EM_DETOK_SPECIAL, &d)) abort();
        for (size_t i = 0; i + 2 <= len; i += 2) {
            int32_t id = (int32_t)(((uint8_t)copy[i] << 8 | (uint8_t)copy[i + 1]) % (uint32_t)em_tokenizer_n_vocab(t));
            const char *bytes;
            size_t k;
            if ((err = em_detok_feed(d, id, &bytes, &k))) abort();
            if (!valid_utf8(bytes, k)) abort();
        }
        const char *bytes;
        size_t k = em_detok_flush(d, &bytes);
        if (!valid_utf8(bytes, k)) abort();
        em_detok_free(d);
    }
    free(copy);
    return 0;
}
