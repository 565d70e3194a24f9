/* Tokenizer tests: llama.cpp's conformance cases (golden, from the shared fixtures), special-token
 * parse/raw behaviour, end-of-generation ids, the streaming detokenizer on split UTF-8, round
 * trips, and bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf/gguf.h"
#include "tokenizer/internal.h" /* the pre-tokenizer, tested on its own below */
#include "tokenizer/tokenizer.h"

#define VOCAB_DIR EM_FIXTURES_DIR "/vocab/"

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)size + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    data[size] = 0;
    *len = (size_t)size;
    return data;
}

/* A vocabulary kept xz-compressed in the fixtures (ggml-vocab-NAME.gguf.xz) is read from where the
 * build unpacked it; the others straight from the fixtures. */
static void vocab_path(const char *name, char *path, size_t size) {
    snprintf(path, size, VOCAB_DIR "ggml-vocab-%s.gguf.xz", name);
    if (access(path, R_OK) == 0)
        snprintf(path, size, EM_UNPACKED_FIXTURES_DIR "/vocab/ggml-vocab-%s.gguf", name);
    else
        snprintf(path, size, VOCAB_DIR "ggml-vocab-%s.gguf", name);
}

static em_tokenizer *load(const char *name) {
    char path[512];
    vocab_path(name, path, sizeof path);
    em_gguf *g;
    em_err err = em_gguf_open(path, &g);
    if (err) fail_msg("%s", em_err_message(err));
    em_tokenizer *t;
    err = em_tokenizer_from_gguf(g, &t);
    em_gguf_close(g);
    if (err) fail_msg("%s", em_err_message(err));
    return t;
}

static void tokenize(const em_tokenizer *t, const char *text, bool add_special, bool parse_special, int32_t **ids,
                     size_t *n) {
    em_err err = em_tokenize(t, text, strlen(text), add_special, parse_special, ids, n);
    if (err) fail_msg("tokenize '%s': %s", text, em_err_message(err));
}

/* ---- golden: llama.cpp's vocabulary test cases ---- */

#define SEPARATOR "\n__ggml_vocab_test__\n"

/* Runs every case of one fixture; returns the number of mismatches (each printed). Also checks
 * decode(encode(s)) == s where the vocabulary can represent s (not WordPiece, which lower-cases). */
static int run_fixture(const char *name, int *cases, int *roundtrip_failures) {
    char path[512];
    size_t inp_len, out_len;
    snprintf(path, sizeof path, VOCAB_DIR "ggml-vocab-%s.gguf.inp", name);
    char *inp = read_all(path, &inp_len);
    snprintf(path, sizeof path, VOCAB_DIR "ggml-vocab-%s.gguf.out", name);
    char *out = read_all(path, &out_len);
    em_tokenizer *t = load(name);
    int failures = 0;
    *cases = 0;
    *roundtrip_failures = 0;
    char *text = inp, *line = out;
    for (;;) {
        char *sep = strstr(text, SEPARATOR);
        if (!sep) break;
        *sep = 0;
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        *eol = 0;
        int32_t expected[512];
        size_t n_expected = 0;
        for (char *p = line, *end; *p; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p) break;
            assert_true(n_expected < 512);
            expected[n_expected++] = (int32_t)v;
        }
        int32_t *ids;
        size_t n;
        tokenize(t, text, false, false, &ids, &n);
        bool same = n == n_expected && (n == 0 || !memcmp(ids, expected, n * sizeof *ids));
        if (!same) {
            failures++;
            printf("%s case %d '%s':\n  expected", name, *cases, text);
            for (size_t i = 0; i < n_expected; i++) printf(" %d", expected[i]);
            printf("\n  got     ");
            for (size_t i = 0; i < n; i++) printf(" %d", ids[i]);
            printf("\n");
        }
        if (em_tokenizer_kind_of(t) != EM_TOKENIZER_WPM) {
            char *back;
            size_t back_len;
            em_err err = em_detokenize(t, ids, n, false, &back, &back_len);
            if (err) fail_msg("%s", em_err_message(err));
            if (back_len != strlen(text) || memcmp(back, text, back_len)) {
                (*roundtrip_failures)++;
                printf("%s case %d round trip: '%s' -> '%s'\n", name, *cases, text, back);
            }
            free(back);
        }
        free(ids);
        (*cases)++;
        text = sep + strlen(SEPARATOR);
        line = eol + 1;
    }
    em_tokenizer_free(t);
    free(inp);
    free(out);
    return failures;
}

static void golden(const char *name) {
    int cases, roundtrip;
    int failures = run_fixture(name, &cases, &roundtrip);
    printf("%s: %d/%d cases match, %d round-trip failures\n", name, cases - failures, cases, roundtrip);
    assert_true(cases >= 40);
    assert_int_equal(failures, 0);
    assert_int_equal(roundtrip, 0);
}

static void test_golden_llama_spm(void **state) { (void)state, golden("llama-spm"); }
static void test_golden_phi_3(void **state) { (void)state, golden("phi-3"); }
static void test_golden_gpt_2(void **state) { (void)state, golden("gpt-2"); }
static void test_golden_falcon(void **state) { (void)state, golden("falcon"); }
static void test_golden_deepseek_llm(void **state) { (void)state, golden("deepseek-llm"); }
static void test_golden_deepseek_coder(void **state) { (void)state, golden("deepseek-coder"); }
static void test_golden_bert_bge(void **state) { (void)state, golden("bert-bge"); }
static void test_golden_gemma_4(void **state) { (void)state, golden("gemma-4"); }

/* ---- special tokens ---- */

static void test_special_parse_and_raw(void **state) {
    (void)state;
    em_tokenizer *t = load("gpt-2");
    int32_t *ids;
    size_t n;
    tokenize(t, "a<|endoftext|>b", false, true, &ids, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 50256);
    free(ids);
    /* Raw: the text stays text, and no id of the result is the control token. */
    tokenize(t, "a<|endoftext|>b", false, false, &ids, &n);
    assert_true(n > 3);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 50256);
    free(ids);
    assert_true(em_tokenizer_is_eog(t, 50256));
    assert_true(em_tokenizer_is_control(t, 50256));
    assert_false(em_tokenizer_is_eog(t, 11));
    assert_false(em_tokenizer_is_eog(t, -1));
    em_tokenizer_free(t);

    t = load("llama-spm");
    tokenize(t, "Hello", true, false, &ids, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1); /* BOS */
    assert_int_equal(ids[1], 15043);
    free(ids);
    tokenize(t, "<s>Hello", false, true, &ids, &n); /* prefix space again after a special token */
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 15043);
    free(ids);
    tokenize(t, "<s>", false, false, &ids, &n);
    assert_true(n > 1);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 1);
    free(ids);
    assert_int_equal(em_tokenizer_bos(t), 1);
    assert_int_equal(em_tokenizer_eos(t), 2);
    assert_true(em_tokenizer_is_eog(t, 2));
    em_tokenizer_free(t);

    /* Phi-3: <|end|> ends a turn and is a control token; it eats the whitespace after it. */
    t = load("phi-3");
    int32_t end = em_tokenizer_find(t, "<|end|>", 7);
    assert_true(end >= 32000);
    assert_true(em_tokenizer_is_eog(t, end));
    tokenize(t, "<|end|>\nHi", false, true, &ids, &n);
    assert_int_equal(ids[0], end);
    int32_t *plain;
    size_t n_plain;
    tokenize(t, "Hi", false, false, &plain, &n_plain);
    assert_int_equal(n, 1 + n_plain);
    assert_memory_equal(ids + 1, plain, n_plain * sizeof *ids);
    free(plain);
    free(ids);
    tokenize(t, "<|end|>", false, false, &ids, &n);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], end);
    free(ids);
    /* </s> is a user-defined token in this file: it matches even in raw text (as Hugging Face
     * tokenizers match added tokens that are not special; llama.cpp differs here). */
    tokenize(t, "<s></s>", false, false, &ids, &n);
    assert_true(n >= 2);
    assert_int_equal(ids[n - 1], 2);
    for (size_t i = 0; i + 1 < n; i++) assert_int_not_equal(ids[i], 1); /* <s> is control: text */
    free(ids);
    em_tokenizer_free(t);
}

/* Gemma 4 ("gemma4"): BOS always added; a turn ends with <turn|>, an answer that calls a tool with
 * <|tool_response> (llama.cpp's end-of-generation set for it); the tool-call and channel markers are
 * user-defined in llama.cpp's files, so they are matched and rendered even in raw text, while the
 * turn markers are control tokens. */
static void test_gemma4_specials(void **state) {
    (void)state;
    em_tokenizer *t = load("gemma-4");
    assert_int_equal(em_tokenizer_kind_of(t), EM_TOKENIZER_SPM);
    int32_t turn = em_tokenizer_find(t, "<|turn>", 7), turn_end = em_tokenizer_find(t, "<turn|>", 7);
    int32_t response = em_tokenizer_find(t, "<|tool_response>", 16), channel = em_tokenizer_find(t, "<|channel>", 10);
    int32_t eos = em_tokenizer_find(t, "<eos>", 5), bos = em_tokenizer_find(t, "<bos>", 5);
    assert_true(turn >= 0 && turn_end >= 0 && response >= 0 && channel >= 0 && eos >= 0 && bos >= 0);
    assert_int_equal(em_tokenizer_bos(t), bos);
    assert_true(em_tokenizer_adds_bos(t));
    assert_true(em_tokenizer_is_eog(t, turn_end));
    assert_true(em_tokenizer_is_eog(t, response));
    assert_true(em_tokenizer_is_eog(t, eos));
    assert_false(em_tokenizer_is_eog(t, turn));
    assert_false(em_tokenizer_is_eog(t, channel));
    assert_false(em_tokenizer_is_eog(t, em_tokenizer_find(t, "</s>", 4)));

    int32_t *ids, *plain;
    size_t n, n_plain;
    tokenize(t, "Hello world", false, false, &plain, &n_plain);
    tokenize(t, "Hello world", true, false, &ids, &n);
    assert_int_equal(n, n_plain + 1);
    assert_int_equal(ids[0], bos);
    assert_memory_equal(ids + 1, plain, n_plain * sizeof *ids);
    free(ids);
    /* No space prefix after a special token either. */
    tokenize(t, "<|turn>Hello world", false, true, &ids, &n);
    assert_int_equal(n, n_plain + 1);
    assert_int_equal(ids[0], turn);
    assert_memory_equal(ids + 1, plain, n_plain * sizeof *ids);
    free(ids);
    free(plain);
    tokenize(t, "<|turn>", false, false, &ids, &n);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], turn);
    free(ids);
    tokenize(t, "<|channel>", false, false, &ids, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], channel);
    free(ids);
    const char *piece;
    assert_int_equal(em_token_to_piece(t, channel, false, &piece), 10);
    assert_memory_equal(piece, "<|channel>", 10);
    assert_int_equal(em_token_to_piece(t, turn_end, false, &piece), 0);
    /* Newlines: a run that is a token is taken whole, and it never merges with what follows. */
    int32_t two = em_tokenizer_find(t, "\n\n", 2);
    assert_true(two >= 0);
    tokenize(t, "\n\nHi", false, false, &ids, &n);
    assert_true(n >= 2);
    assert_int_equal(ids[0], two);
    free(ids);
    char run[33] = {0};
    int whole_runs = 0;
    for (int k = 1; k <= 32; k++) {
        run[k - 1] = '\n';
        int32_t id = em_tokenizer_find(t, run, (size_t)k);
        if (id < 0) continue;
        tokenize(t, run, false, false, &ids, &n);
        assert_int_equal(n, 1);
        assert_int_equal(ids[0], id);
        free(ids);
        whole_runs++;
    }
    assert_true(whole_runs >= 2);
    em_tokenizer_free(t);
}

/* o200k_harmony (gpt-oss): <|end|> closes a message inside an answer, <|return|> and <|call|> end
 * it. A copy of the GPT-2 vocabulary with harmony's markup as control tokens stands in for it. */
static void test_harmony_end_of_generation(void **state) {
    (void)state;
    static const char *const markup[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
                                         "<|constrain|>"};
    const size_t n_markup = sizeof markup / sizeof markup[0], first = 50000;
    em_gguf *in;
    assert_null(em_gguf_open(VOCAB_DIR "ggml-vocab-gpt-2.gguf", &in));
    em_gguf_writer *w;
    assert_null(em_gguf_writer_new(3, &w));
    for (uint64_t i = 0; i < em_gguf_kv_count(in); i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(in, i);
        if (em_str_eq(kv->key, "tokenizer.ggml.tokens")) {
            const char **strings = malloc(kv->array_len * sizeof *strings);
            uint64_t *lengths = malloc(kv->array_len * sizeof *lengths);
            assert_true(strings && lengths);
            for (uint64_t t = 0; t < kv->array_len; t++) strings[t] = kv->strings[t].ptr, lengths[t] = kv->strings[t].len;
            for (size_t m = 0; m < n_markup; m++) strings[first + m] = markup[m], lengths[first + m] = strlen(markup[m]);
            assert_null(em_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", strings, lengths, kv->array_len));
            free(strings);
            free(lengths);
        } else if (em_str_eq(kv->key, "tokenizer.ggml.token_type")) {
            int32_t *types = malloc(kv->array_len * sizeof *types);
            assert_non_null(types);
            for (uint64_t t = 0; t < kv->array_len; t++) types[t] = (int32_t)em_gguf_array_int(kv, t);
            for (size_t m = 0; m < n_markup; m++) types[first + m] = EM_TOKEN_CONTROL;
            assert_null(em_gguf_writer_add_array(w, "tokenizer.ggml.token_type", EM_GGUF_INT32, types, kv->array_len));
            free(types);
        } else {
            assert_null(em_gguf_writer_copy_kv(w, kv));
        }
    }
    char path[] = "/tmp/ember-harmony-vocab-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_null(em_gguf_writer_write(w, path));
    em_gguf_writer_free(w);
    em_gguf_close(in);
    assert_null(em_gguf_open(path, &in));
    em_tokenizer *t;
    assert_null(em_tokenizer_from_gguf(in, &t));
    em_gguf_close(in);
    unlink(path);
    const int32_t end = em_tokenizer_find(t, "<|end|>", 7), answer_end = em_tokenizer_find(t, "<|return|>", 10),
                  call = em_tokenizer_find(t, "<|call|>", 8);
    assert_int_equal(end, (int32_t)first + 3);
    assert_false(em_tokenizer_is_eog(t, end));
    assert_true(em_tokenizer_is_control(t, end));
    assert_true(em_tokenizer_is_eog(t, answer_end));
    assert_true(em_tokenizer_is_eog(t, call));
    assert_true(em_tokenizer_is_eog(t, 50256)); /* <|endoftext|> still ends */
    em_tokenizer_free(t);
}

static void test_wordpiece_special(void **state) {
    (void)state;
    em_tokenizer *t = load("bert-bge");
    int32_t *ids;
    size_t n;
    tokenize(t, "hello", true, false, &ids, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 101); /* [CLS] */
    assert_int_equal(ids[2], 102); /* [SEP] */
    free(ids);
    em_tokenizer_free(t);
}

/* ---- detokenizer ---- */

static void test_detok_streaming_split_utf8(void **state) {
    (void)state;
    em_tokenizer *t = load("gpt-2");
    /* "é" and an emoji spelled as separate byte tokens: ids of the single-byte tokens. */
    const char *text = "x \xC3\xA9\xF0\x9F\x98\x80 y";
    int32_t *ids;
    size_t n;
    tokenize(t, text, false, false, &ids, &n);
    em_detok *d;
    assert_null(em_detok_new(t, 0, &d));
    char got[64] = {0};
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        const char *bytes;
        size_t k;
        assert_null(em_detok_feed(d, ids[i], &bytes, &k));
        /* Never a partial character: every chunk is valid UTF-8 on its own. */
        for (size_t j = 0; j < k;) {
            unsigned char c = (unsigned char)bytes[j];
            size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            assert_true(j + len <= k);
            j += len;
        }
        memcpy(got + used, bytes, k);
        used += k;
    }
    const char *bytes;
    assert_int_equal(em_detok_flush(d, &bytes), 0);
    assert_int_equal(used, strlen(text));
    assert_memory_equal(got, text, used);
    em_detok_free(d);

    /* Feeding the single byte tokens of an emoji one by one: nothing until the last byte. */
    assert_null(em_detok_new(t, 0, &d));
    const unsigned char emoji[4] = {0xF0, 0x9F, 0x98, 0x80};
    for (int i = 0; i < 4; i++) {
        char mapped[4];
        unsigned cp = emoji[i]; /* bytes >= 0xA1 except 0xAD stand for themselves in GPT-2's alphabet */
        if (cp >= 127 && cp <= 160) cp += 162;
        mapped[0] = (char)(0xC0 | (cp >> 6));
        mapped[1] = (char)(0x80 | (cp & 0x3F));
        int32_t id = em_tokenizer_find(t, mapped, 2);
        assert_true(id >= 0);
        size_t k;
        assert_null(em_detok_feed(d, id, &bytes, &k));
        if (i < 3) assert_int_equal(k, 0);
        else {
            assert_int_equal(k, 4);
            assert_memory_equal(bytes, emoji, 4);
        }
    }
    /* An incomplete character at the end becomes U+FFFD on flush. */
    size_t k;
    assert_null(em_detok_feed(d, em_tokenizer_find(t, "\xC3\xB0", 2), &bytes, &k)); /* byte 0xF0 */
    assert_int_equal(k, 0);
    assert_int_equal(em_detok_flush(d, &bytes), 3);
    assert_memory_equal(bytes, "\xEF\xBF\xBD", 3);
    /* Ids the tokenizer has no token for (a model's padding rows) are empty pieces, not errors,
     * and leave the stream as it was. */
    assert_null(em_detok_feed(d, 50257, &bytes, &k));
    assert_int_equal(k, 0);
    assert_null(em_detok_feed(d, -1, &bytes, &k));
    assert_int_equal(k, 0);
    assert_null(em_detok_feed(d, em_tokenizer_find(t, "Hello", 5), &bytes, &k));
    assert_int_equal(k, 5);
    assert_memory_equal(bytes, "Hello", 5);
    em_detok_free(d);
    free(ids);
    em_tokenizer_free(t);
}

/* A control token has no text in the stream unless it is fed as text (a tool call's marker a
 * request counts as text); then its text comes out between the others, and only that once. */
static void test_detok_control_as_text(void **state) {
    (void)state;
    em_tokenizer *t = load("phi-3");
    const int32_t end = em_tokenizer_find(t, "<|end|>", 7), hello = em_tokenizer_find(t, "\xE2\x96\x81Hello", 8);
    assert_true(end >= 0 && hello >= 0);
    assert_true(em_tokenizer_is_control(t, end));
    em_detok *d;
    assert_null(em_detok_new(t, 0, &d));
    const char *bytes;
    size_t k;
    assert_null(em_detok_feed(d, end, &bytes, &k));
    assert_int_equal(k, 0);
    assert_null(em_detok_feed_special(d, end, &bytes, &k));
    assert_int_equal(k, 7);
    assert_memory_equal(bytes, "<|end|>", 7);
    assert_null(em_detok_feed(d, hello, &bytes, &k));
    assert_int_equal(k, 6);
    assert_memory_equal(bytes, " Hello", 6);
    assert_null(em_detok_feed(d, end, &bytes, &k)); /* the flag was for that token alone */
    assert_int_equal(k, 0);
    em_detok_free(d);
    em_tokenizer_free(t);
}

static void test_detok_spm_leading_space(void **state) {
    (void)state;
    em_tokenizer *t = load("llama-spm");
    int32_t *ids;
    size_t n;
    tokenize(t, "Hello world", true, false, &ids, &n);
    char *text;
    size_t len;
    assert_null(em_detokenize(t, ids, n, false, &text, &len));
    assert_string_equal(text, "Hello world"); /* BOS skipped, prefix space removed */
    free(text);
    /* Streaming a continuation keeps the space: " world" after "Hello". */
    em_detok *d;
    assert_null(em_detok_new(t, 0, &d));
    const char *bytes;
    size_t k;
    assert_null(em_detok_feed(d, ids[1], &bytes, &k));
    assert_int_equal(k, 6);
    assert_memory_equal(bytes, " Hello", 6);
    em_detok_free(d);
    /* Byte-fallback tokens spell a character over several tokens. */
    free(ids);
    tokenize(t, "\xF0\x9F\xA6\x99", false, false, &ids, &n); /* an emoji the vocabulary lacks */
    assert_true(n >= 4);
    assert_null(em_detokenize(t, ids, n, false, &text, &len));
    assert_string_equal(text, "\xF0\x9F\xA6\x99");
    free(text);
    free(ids);
    em_tokenizer_free(t);
}

/* ---- pre-tokenizers: words each named pre-tokenizer's regexes give (by the regex definitions) ---- */

typedef struct words {
    char text[256];
    size_t used;
} words;

static em_err collect_word(void *user, const char *word, size_t len) {
    words *w = user;
    memcpy(w->text + w->used, word, len);
    w->used += len;
    w->text[w->used++] = '|';
    w->text[w->used] = 0;
    return NULL;
}

static void expect_split(const char *pre, const char *text, const char *expected) {
    em_pretok *p;
    assert_null(em_pretok_new(pre, &p));
    words w = {{0}, 0};
    assert_null(em_pretok_split(p, text, strlen(text), collect_word, &w));
    if (strcmp(w.text, expected)) fail_msg("%s: '%s' -> '%s', expected '%s'", pre, text, w.text, expected);
    em_pretok_free(p);
}

static void test_pretokenizers(void **state) {
    (void)state;
    expect_split("gpt-2", "Hello world's 2024!!", "Hello| world|'s| 2024|!!|");
    expect_split("gpt-2", "a   b", "a|  | b|"); /* \s+(?!\S) leaves the last space to the word */
    expect_split("starcoder", "a 123", "a| |1|2|3|");
    expect_split("command-r", "x42", "x|4|2|");
    expect_split("mpt", "I'll go", "I|'ll| go|");
    expect_split("gpt-neox", "tab\there", "tab|\t|here|");
    expect_split("llama-bpe", "1234567 ab\n\nc", "123|456|7| ab|\n\n|c|");
    expect_split("llama-bpe", "DON'T", "DON|'T|");
    expect_split("qwen2", "x123", "x|1|2|3|");
    expect_split("default", "a+b=12345", "a|+|b|=|123|45|");
    expect_split("falcon", "x`y 1234", "x|`|y| |123|4|");
    expect_split("deepseek-coder", "ab12\ncd", "ab|1|2|\n|cd|");
}

/* ---- bad input ---- */

static char log_seen[512];
static void capture_log(em_log_level level, const char *message, void *user) {
    (void)user;
    if (level == EM_LOG_WARN) snprintf(log_seen, sizeof log_seen, "%s", message);
}

static em_err build_file(const char *path, const char *model, const char *pre, bool with_tokens) {
    em_gguf_writer *w;
    em_err err = em_gguf_writer_new(3, &w);
    if (err) return err;
    const char *tokens[] = {"a", "b", "ab", "\xC4\xA0"};
    if (!err) err = em_gguf_writer_add_str(w, "general.architecture", "llama");
    if (!err && model) err = em_gguf_writer_add_str(w, "tokenizer.ggml.model", model);
    if (!err && pre) err = em_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre);
    if (!err && with_tokens) err = em_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", tokens, NULL, 4);
    const char *merges[] = {"a b"};
    if (!err && with_tokens) err = em_gguf_writer_add_str_array(w, "tokenizer.ggml.merges", merges, NULL, 1);
    if (!err) err = em_gguf_writer_write(w, path);
    em_gguf_writer_free(w);
    return err;
}

static em_err open_tokenizer(const char *path, em_tokenizer **t) {
    em_gguf *g;
    em_err err = em_gguf_open(path, &g);
    if (err) return err;
    err = em_tokenizer_from_gguf(g, t);
    em_gguf_close(g);
    return err;
}

static void test_bad_input(void **state) {
    (void)state;
    em_tokenizer *t = load("gpt-2");
    int32_t *ids;
    size_t n;
    em_err err = em_tokenize(t, "ok \xC3\x28 bad", 9, false, false, &ids, &n);
    assert_non_null(err);
    assert_int_equal(em_err_code_of(err), EM_ERR_INVALID);
    assert_non_null(strstr(em_err_message(err), "byte 3"));
    em_err_free(err);
    err = em_tokenize(t, "\xED\xA0\x80", 3, false, false, &ids, &n); /* a surrogate */
    assert_int_equal(em_err_code_of(err), EM_ERR_INVALID);
    em_err_free(err);
    em_tokenizer_free(t);

    const char *path = EM_BINARY_DIR "/test_tokenizer_bad.gguf";
    em_tokenizer *bad = NULL;
    assert_null(build_file(path, NULL, NULL, false));
    err = open_tokenizer(path, &bad);
    assert_int_equal(em_err_code_of(err), EM_ERR_NOT_FOUND);
    assert_non_null(strstr(em_err_message(err), "no tokenizer"));
    em_err_free(err);

    assert_null(build_file(path, "rwkv", NULL, true));
    err = open_tokenizer(path, &bad);
    assert_int_equal(em_err_code_of(err), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_err_message(err), "rwkv"));
    em_err_free(err);

    /* gemma4 always adds BOS, so a file without its id cannot be used. */
    assert_null(build_file(path, "gemma4", NULL, true));
    err = open_tokenizer(path, &bad);
    assert_int_equal(em_err_code_of(err), EM_ERR_FORMAT);
    assert_non_null(strstr(em_err_message(err), "tokenizer.ggml.bos_token_id"));
    em_err_free(err);

    /* Unknown pre-tokenizer: a warning naming it, and the default pre-tokenizer. */
    assert_null(build_file(path, "gpt2", "no-such-pretokenizer", true));
    em_log_set_sink(capture_log, NULL);
    err = open_tokenizer(path, &bad);
    em_log_set_sink(NULL, NULL);
    assert_null(err);
    assert_non_null(strstr(log_seen, "no-such-pretokenizer"));
    tokenize(bad, "ab", false, false, &ids, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 2);
    free(ids);
    em_tokenizer_free(bad);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_llama_spm),
        cmocka_unit_test(test_golden_phi_3),
        cmocka_unit_test(test_golden_gpt_2),
        cmocka_unit_test(test_golden_falcon),
        cmocka_unit_test(test_golden_deepseek_llm),
        cmocka_unit_test(test_golden_deepseek_coder),
        cmocka_unit_test(test_golden_bert_bge),
        cmocka_unit_test(test_golden_gemma_4),
        cmocka_unit_test(test_gemma4_specials),
        cmocka_unit_test(test_special_parse_and_raw),
        cmocka_unit_test(test_harmony_end_of_generation),
        cmocka_unit_test(test_wordpiece_special),
        cmocka_unit_test(test_detok_streaming_split_utf8),
        cmocka_unit_test(test_detok_spm_leading_space),
        cmocka_unit_test(test_detok_control_as_text),
        cmocka_unit_test(test_pretokenizers),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
