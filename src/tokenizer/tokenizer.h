/*
 * tokenizer — text ↔ token ids, built from the tokenizer metadata that llama.cpp's converter
 * writes into GGUF files (`tokenizer.ggml.*`).
 *
 * Three vocabulary kinds:
 *   - "llama" (SPM): SentencePiece-style merging of adjacent symbols by the score of the token
 *     they form, spaces escaped to U+2581, an optional space prefix, and byte fallback to
 *     `<0xNN>` tokens. When the file also carries `tokenizer.ggml.merges` (written by Ember's
 *     tokenizer.json converter for BPE models with byte fallback, e.g. Gemma 3), merging follows
 *     the merge ranks instead of the scores, which is exactly what such a model was trained with.
 *   - "gemma4" (Gemma 4): the same SentencePiece-style BPE by merge ranks, with no space prefix,
 *     on each run of newlines and each run of other characters separately (llama.cpp's gemma4
 *     pre-tokenizer, `[^\n]+|[\n]+`); a run of newlines that is itself a token is taken whole. It
 *     always adds BOS, whatever the file says, as llama.cpp does. Loaded as an SPM tokenizer.
 *   - "gpt2" (byte-level BPE): the text is split by the pre-tokenizer that `tokenizer.ggml.pre`
 *     names (PCRE2 regexes, run with JIT), each piece is mapped to GPT-2's byte alphabet and
 *     merged by merge rank.
 *   - "bert" (WordPiece): NFD, lower case, split at whitespace and punctuation, then the longest
 *     vocabulary prefix again and again.
 * Special tokens: control (and unknown) tokens are recognized in text only when the caller asks
 * for it (parse_special); user-defined tokens always are. Where several special tokens could
 * match, the leftmost wins, and at one position the longest.
 *
 * Also here: conversion of a Hugging Face tokenizer.json into that metadata (hf_json.c).
 *
 * What this module does NOT do: chat templates (src/chat), sampling, or reading model files
 * itself (it reads an em_gguf that the caller opened).
 *
 * Ownership: em_tokenizer_from_gguf copies everything it needs out of the em_gguf, so the
 * tokenizer is independent of it (the file may be closed right after). The tokenizer is
 * immutable once built: any number of threads may use one tokenizer at the same time (each call
 * allocates its own scratch). em_tokenize returns a malloc'd id array the caller frees with
 * free(). Pieces returned by em_token_to_piece point into the tokenizer and live as long as it.
 * An em_detok belongs to its caller (em_detok_free) and refers to, but does not own, its
 * tokenizer, which must outlive it. No global mutable state (warnings go to the em_log logger).
 */
#ifndef EMBER_TOKENIZER_H
#define EMBER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "../gguf/gguf.h"

typedef struct em_tokenizer em_tokenizer;

typedef enum em_tokenizer_kind {
    EM_TOKENIZER_SPM = 1, /* "llama" */
    EM_TOKENIZER_BPE,     /* "gpt2" */
    EM_TOKENIZER_WPM,     /* "bert" */
} em_tokenizer_kind;

/* Token types as GGUF stores them in tokenizer.ggml.token_type. */
typedef enum em_token_type {
    EM_TOKEN_UNDEFINED = 0,
    EM_TOKEN_NORMAL = 1,
    EM_TOKEN_UNKNOWN = 2,
    EM_TOKEN_CONTROL = 3,
    EM_TOKEN_USER_DEFINED = 4,
    EM_TOKEN_UNUSED = 5,
    EM_TOKEN_BYTE = 6,
} em_token_type;

#define EM_TOKEN_NONE (-1) /* "no such token" for the special ids below */

/* Builds a tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file (weights are not
 * needed: a vocabulary-only file is fine). Errors: EM_ERR_NOT_FOUND when the file has no
 * tokenizer, EM_ERR_UNSUPPORTED for an unknown tokenizer model, EM_ERR_FORMAT for inconsistent
 * arrays. An unknown pre-tokenizer name logs a warning naming it and uses the default one. */
em_err em_tokenizer_from_gguf(const em_gguf *gguf, em_tokenizer **out);
void em_tokenizer_free(em_tokenizer *tokenizer);

em_tokenizer_kind em_tokenizer_kind_of(const em_tokenizer *tokenizer);
int32_t em_tokenizer_n_vocab(const em_tokenizer *tokenizer);
int32_t em_tokenizer_bos(const em_tokenizer *tokenizer); /* EM_TOKEN_NONE when absent */
int32_t em_tokenizer_eos(const em_tokenizer *tokenizer);
int32_t em_tokenizer_eot(const em_tokenizer *tokenizer);
bool em_tokenizer_adds_bos(const em_tokenizer *tokenizer); /* what add_special adds */
bool em_tokenizer_adds_eos(const em_tokenizer *tokenizer);
/* End of generation: eos, eot, eom and tokens such as <|im_end|>, <end_of_turn>, <|eot_id|>,
 * <|end|>, <|endoftext|>. False for ids out of range. */
bool em_tokenizer_is_eog(const em_tokenizer *tokenizer, int32_t id);
/* Control tokens (bos, eos, <|im_start|>, ...): never produced from text unless parse_special. */
bool em_tokenizer_is_control(const em_tokenizer *tokenizer, int32_t id);
em_token_type em_tokenizer_token_type(const em_tokenizer *tokenizer, int32_t id);
/* The token's text as the vocabulary stores it (for SPM with U+2581, for byte-level BPE in GPT-2's
 * byte alphabet). Not NUL-terminated; pointer into the tokenizer. Length 0 for ids out of range. */
size_t em_tokenizer_token_text(const em_tokenizer *tokenizer, int32_t id, const char **text);
/* The id of a token whose stored text is exactly `text`; EM_TOKEN_NONE when there is none. */
int32_t em_tokenizer_find(const em_tokenizer *tokenizer, const char *text, size_t len);

/* Text → ids. `text` must be valid UTF-8 (EM_ERR_INVALID names the byte offset otherwise).
 * add_special: add BOS/EOS as the vocabulary asks (for WordPiece: CLS ... SEP).
 * parse_special: recognize the text of control tokens (user-defined tokens are always
 * recognized). On success *ids is a malloc'd array (NULL when *n == 0) the caller frees. */
em_err em_tokenize(const em_tokenizer *tokenizer, const char *text, size_t len, bool add_special,
                   bool parse_special, int32_t **ids, size_t *n);

/* The bytes one token stands for: decoded (spaces for U+2581, raw bytes for byte tokens and
 * GPT-2's byte alphabet). Control and unknown tokens give their text only when `special` is
 * true, nothing otherwise. May be a partial UTF-8 sequence. Pointer into the tokenizer. */
size_t em_token_to_piece(const em_tokenizer *tokenizer, int32_t id, bool special, const char **bytes);

/* Ids → text in one go (the inverse of em_tokenize for text that starts a sequence: the space
 * that SPM's space prefix added is removed again). Invalid or incomplete UTF-8 that the tokens
 * spell comes out as U+FFFD. *text is malloc'd and NUL-terminated; *len excludes the NUL. */
em_err em_detokenize(const em_tokenizer *tokenizer, const int32_t *ids, size_t n, bool special,
                     char **text, size_t *len);

/* Streaming detokenizer: feed ids one at a time, receive the bytes that are complete UTF-8 so
 * far; bytes of a character split across tokens are held back until the character is complete.
 * An invalid sequence becomes U+FFFD. */
typedef struct em_detok em_detok;

enum {
    EM_DETOK_SPECIAL = 1u << 0,        /* render control tokens' text */
    EM_DETOK_SEQUENCE_START = 1u << 1, /* the ids start the text: drop SPM's prefix space */
};

em_err em_detok_new(const em_tokenizer *tokenizer, unsigned flags, em_detok **out);
void em_detok_free(em_detok *detok);
/* Feeds one id. *bytes and *len: the newly complete text (may be empty), valid until the next call
 * on this detok. An id without text (an unused or padding token, or one outside the vocabulary:
 * output rows the tokenizer has no token for) adds nothing. */
em_err em_detok_feed(em_detok *detok, int32_t id, const char **bytes, size_t *len);
/* The same, rendering this one token's text even when it is a control token (a control token that
 * a request counts as text, such as a tool call's marker). */
em_err em_detok_feed_special(em_detok *detok, int32_t id, const char **bytes, size_t *len);
/* Ends the stream: whatever is held back comes out (an incomplete character as U+FFFD). */
size_t em_detok_flush(em_detok *detok, const char **bytes);

/* Hugging Face tokenizer.json (+ tokenizer_config.json, which may be NULL) → the tokenizer.ggml.*
 * metadata of a GGUF file, added to `writer` (the tokenizer half of `ember convert`). BPE models
 * only: byte-level ones become "gpt2", byte-fallback ones "llama" (with merges). `n_vocab` is the
 * model's embedding rows (config.json's vocab_size): the token list is padded to it with unused
 * "[PADi]" tokens, as llama.cpp's converter does, so every row has a token; a tokenizer with
 * more tokens than that is an error. 0 writes the tokenizer's own tokens. Reads the files itself
 * and keeps nothing. */
em_err em_tokenizer_hf_to_gguf(const char *tokenizer_json, const char *tokenizer_config, uint32_t n_vocab,
                               em_gguf_writer *writer);

#endif
