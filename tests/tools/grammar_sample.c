/* `grammar_sample SCHEMAS.json VOCAB.gguf N OUT.json`: for each JSON schema of the array in
 * SCHEMAS.json, N random texts through the schema's grammar, half drawn byte by byte
 * (em_grammar_generate) and half token by token from VOCAB's tokens through the token masks, as
 * constrained decoding would draw them; written to OUT.json as [{"schema": i, "how": ..., "text":
 * ...}] for tests/js/schema_check.mjs to validate with ajv. A schema that does not convert or
 * compile is an error (exit 1). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Token by token: a uniformly random allowed token while short; past `soft_limit` bytes, the
 * one-byte token of a byte that brings the end closer (every byte has one in the vocabularies
 * used here), and the end as soon as it is allowed. */
static em_err token_walk(const em_grammar *g, const em_grammar_vocab *v, const int32_t byte_token[256], uint32_t end_token,
                         uint64_t seed, size_t soft_limit, char **text, size_t *len, const em_tokenizer *tok) {
    em_grammar_state *s;
    em_err err = em_grammar_state_new(g, &s);
    if (err) return err;
    uint32_t n = em_grammar_vocab_size(v);
    uint32_t *mask = calloc((n + 31) / 32, sizeof *mask);
    char *out = malloc(1);
    size_t used = 0;
    uint64_t random = seed;
    while (!err) {
        uint32_t n_allowed;
        if ((err = em_grammar_mask(s, v, mask, &n_allowed))) break;
        if (!n_allowed) {
            err = em_errorf(EM_ERR_INTERNAL, "no token allowed after %zu bytes", used);
            break;
        }
        int32_t token = -1;
        if (used >= soft_limit) {
            if (em_grammar_complete(s)) break;
            bool allowed[256];
            em_grammar_next_bytes(s, allowed);
            uint32_t here = em_grammar_bytes_to_complete(s);
            for (unsigned b = 0; b < 256 && token < 0; b++) {
                if (!allowed[b] || byte_token[b] < 0) continue;
                em_grammar_state *probe; /* one byte ahead on a fresh copy: replay the text */
                if ((err = em_grammar_state_new(g, &probe))) break;
                uint8_t byte = (uint8_t)b;
                if (em_grammar_accept_bytes(probe, out, used) && em_grammar_accept_bytes(probe, &byte, 1) &&
                    em_grammar_bytes_to_complete(probe) < here)
                    token = byte_token[b];
                em_grammar_state_free(probe);
            }
            if (token < 0 && !err) err = em_errorf(EM_ERR_INTERNAL, "no one-byte token brings the end closer");
        } else {
            uint64_t pick = next_random(&random) % n_allowed;
            for (uint32_t t = 0; t < n; t++)
                if (((mask[t >> 5] >> (t & 31)) & 1u) && pick-- == 0) {
                    token = (int32_t)t;
                    break;
                }
        }
        if (err) break;
        if ((uint32_t)token == end_token) break;
        if (!em_grammar_accept_token(s, v, token)) {
            err = em_errorf(EM_ERR_INTERNAL, "token %d was in the mask but not accepted", token);
            break;
        }
        const char *piece;
        size_t piece_len = em_token_to_piece(tok, token, false, &piece);
        char *grown = realloc(out, used + piece_len + 1);
        if (!grown) {
            err = em_errorf(EM_ERR_NOMEM, "out of memory");
            break;
        }
        out = grown;
        memcpy(out + used, piece, piece_len);
        used += piece_len;
    }
    em_grammar_state_free(s);
    free(mask);
    if (err) {
        free(out);
        return err;
    }
    out[used] = '\0';
    *text = out;
    *len = used;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: grammar_sample SCHEMAS.json VOCAB.gguf N OUT.json\n");
        return 1;
    }
    json_error_t jerr;
    json_t *schemas = json_load_file(argv[1], 0, &jerr);
    if (!json_is_array(schemas)) {
        fprintf(stderr, "grammar_sample: %s: %s\n", argv[1], jerr.text);
        return 1;
    }
    em_gguf *gguf;
    em_tokenizer *tok;
    em_err err = em_gguf_open(argv[2], &gguf);
    if (!err) {
        err = em_tokenizer_from_gguf(gguf, &tok);
        em_gguf_close(gguf);
    }
    em_grammar_vocab *vocab = NULL;
    uint32_t n_vocab = err ? 0 : (uint32_t)em_tokenizer_n_vocab(tok);
    if (!err) err = em_grammar_vocab_new(tok, n_vocab, NULL, 0, &vocab);
    if (err) {
        fprintf(stderr, "grammar_sample: %s\n", em_err_message(err));
        return 1;
    }
    int32_t byte_token[256];
    for (int b = 0; b < 256; b++) byte_token[b] = -1;
    for (uint32_t t = 0; t < n_vocab; t++) {
        const char *piece;
        if (em_token_to_piece(tok, (int32_t)t, false, &piece) == 1 && byte_token[(uint8_t)piece[0]] < 0)
            byte_token[(uint8_t)piece[0]] = (int32_t)t;
    }
    const uint32_t end_token = (uint32_t)em_tokenizer_eos(tok);
    const int per_schema = atoi(argv[3]);
    json_t *out = json_array();
    int status = 0;
    for (size_t i = 0; i < json_array_size(schemas) && !status; i++) {
        char *schema_text = json_dumps(json_array_get(schemas, i), JSON_ENCODE_ANY);
        char *gbnf = NULL;
        em_grammar *g = NULL;
        err = em_grammar_from_json_schema(schema_text, strlen(schema_text), &gbnf);
        if (!err) err = em_grammar_compile(gbnf, strlen(gbnf), &g);
        for (int k = 0; k < per_schema && !err; k++) {
            char *text;
            size_t len;
            const bool by_token = k % 2;
            const size_t soft_limit = 10 + (size_t)k * 7;
            err = by_token ? token_walk(g, vocab, byte_token, end_token, 1000 * i + (uint64_t)k, soft_limit, &text, &len, tok)
                           : em_grammar_generate(g, 1000 * i + (uint64_t)k, soft_limit, &text, &len);
            if (err) break;
            json_t *sample = json_pack("{s:i, s:s, s:s%}", "schema", (int)i, "how", by_token ? "tokens" : "bytes", "text", text, len);
            if (!sample) err = em_errorf(EM_ERR_FORMAT, "sample %d is not UTF-8: %s", k, text);
            else json_array_append_new(out, sample);
            free(text);
        }
        if (err) {
            fprintf(stderr, "grammar_sample: schema %zu %s: %s\n%s", i, schema_text, em_err_message(err), gbnf ? gbnf : "");
            em_err_free(err);
            status = 1;
        }
        em_grammar_free(g);
        free(gbnf);
        free(schema_text);
    }
    if (!status && json_dump_file(out, argv[4], JSON_INDENT(1)) != 0) {
        fprintf(stderr, "grammar_sample: cannot write %s\n", argv[4]);
        status = 1;
    }
    json_decref(out);
    json_decref(schemas);
    em_grammar_vocab_free(vocab);
    em_tokenizer_free(tok);
    return status;
}
