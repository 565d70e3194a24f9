/* The pure parts of the hub module: model specs, quantization tags, which file a spec picks, cache
 * folder names and the settings read from the environment. The downloads themselves are tested
 * against a fake Hub by tests/cli/pull.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hub/hub.h"

static void expect_spec_error(const char *text, const char *needle) {
    em_hub_spec spec;
    em_err err = em_hub_spec_parse(text, &spec);
    if (!err) fail_msg("'%s' parsed", text);
    if (em_err_code_of(err) != EM_ERR_INVALID || !strstr(em_err_message(err), needle))
        fail_msg("'%s': expected '%s', got %s", text, needle, em_err_message(err));
    em_err_free(err);
}

static void test_spec(void **state) {
    (void)state;
    em_hub_spec spec;
    assert_null(em_hub_spec_parse("org/Model-1.5B-GGUF", &spec));
    assert_string_equal(spec.repo, "org/Model-1.5B-GGUF");
    assert_string_equal(spec.quant, "");
    assert_string_equal(spec.file, "");
    assert_null(em_hub_spec_parse("org/name:iq3_xxs", &spec));
    assert_string_equal(spec.repo, "org/name");
    assert_string_equal(spec.quant, "iq3_xxs");
    assert_null(em_hub_spec_parse("org/name/Q4_K_M/model-00001-of-00002.gguf", &spec));
    assert_string_equal(spec.repo, "org/name");
    assert_string_equal(spec.file, "Q4_K_M/model-00001-of-00002.gguf");

    expect_spec_error("name", "expected ORG/NAME");
    expect_spec_error("/name", "ORG and NAME are");
    expect_spec_error("org/", "ORG and NAME are");
    expect_spec_error("org/na--me", "ORG and NAME are");
    expect_spec_error("org/-name", "ORG and NAME are");
    expect_spec_error("org/na me", "ORG and NAME are");
    expect_spec_error("org/name:", "quantization tag '' is not");
    expect_spec_error("org/name:Q4-K", "quantization tag 'Q4-K' is not");
    expect_spec_error("org/name/config.json", "not a .gguf file");
    expect_spec_error("org/name/../x.gguf", "not a .gguf file");
    expect_spec_error("org/name//x.gguf", "not a .gguf file");
}

static void test_quant_tags(void **state) {
    (void)state;
    assert_true(em_hub_path_has_quant("Qwen3-8B-Q4_K_M.gguf", "q4_k_m"));
    assert_true(em_hub_path_has_quant("model.Q8_0.gguf", "Q8_0"));
    assert_true(em_hub_path_has_quant("Q4_K_M/model-Q4_K_M-00001-of-00002.gguf", "Q4_K_M"));
    assert_true(em_hub_path_has_quant("gemma-3-4b-it-UD-IQ3_XXS.gguf", "IQ3_XXS"));
    assert_false(em_hub_path_has_quant("Qwen3-8B-Q4_K_M.gguf", "Q4_K"));   /* a prefix of another tag */
    assert_false(em_hub_path_has_quant("Qwen3-8B-IQ4_XS.gguf", "Q4_XS"));  /* a suffix of another tag */
    assert_false(em_hub_path_has_quant("Qwen3-8B-Q4_K_M.gguf", ""));
    const char *const *order = em_hub_default_quants();
    assert_string_equal(order[0], "Q4_K_M");
    assert_string_equal(order[4], "Q8_0");
    assert_null(order[5]);
}

/* The path em_hub_select picks, or the error message it gives (with "error: " first). */
static const char *pick(const char *spec_text, const char *const *paths, size_t n) {
    static char out[4096];
    em_hub_spec spec;
    assert_null(em_hub_spec_parse(spec_text, &spec));
    size_t first = 0;
    em_err err = em_hub_select(&spec, paths, n, &first);
    if (err) snprintf(out, sizeof out, "error: %s", em_err_message(err));
    else snprintf(out, sizeof out, "%s", paths[first]);
    em_err_free(err);
    return out;
}

static void test_select(void **state) {
    (void)state;
    const char *const paths[] = {
        "README.md",
        "m-Q8_0.gguf",
        "m-Q6_K.gguf",
        "mmproj-m-Q4_K_M.gguf",
        "BF16/m-BF16-00002-of-00002.gguf",
        "BF16/m-BF16-00001-of-00002.gguf",
        "m-IQ3_XXS.gguf",
        "m-UD-Q8_0.gguf",
    };
    const size_t n = sizeof paths / sizeof paths[0];
    /* Default order: no Q4_K_M model (the projector is none), no Q4_K_S or Q5_K_M; Q6_K is next. */
    assert_string_equal(pick("o/m", paths, n), "m-Q6_K.gguf");
    assert_string_equal(pick("o/m", paths + 6, 1), "m-IQ3_XXS.gguf"); /* none of the defaults: the first */
    assert_string_equal(pick("o/m:iq3_xxs", paths, n), "m-IQ3_XXS.gguf");
    assert_string_equal(pick("o/m:bf16", paths, n), "BF16/m-BF16-00001-of-00002.gguf");
    assert_string_equal(pick("o/m/BF16/m-BF16-00002-of-00002.gguf", paths, n), "BF16/m-BF16-00001-of-00002.gguf");
    assert_string_equal(pick("o/m/m-Q8_0.gguf", paths, n), "m-Q8_0.gguf");
    assert_string_equal(pick("o/m:Q8_0", paths, n),
                        "error: o/m: the tag Q8_0 matches 2 models (m-Q8_0.gguf, m-UD-Q8_0.gguf): name one as "
                        "o/m/FILE.gguf");
    assert_string_equal(pick("o/m:Q2_K", paths, n),
                        "error: o/m has no .gguf model with the tag Q2_K; it has: m-Q8_0.gguf, m-Q6_K.gguf, "
                        "BF16/m-BF16-00001-of-00002.gguf (2 parts), m-IQ3_XXS.gguf, m-UD-Q8_0.gguf");
    assert_string_equal(pick("o/m/x.gguf", paths, n), "error: o/m has no file x.gguf; its .gguf models: m-Q8_0.gguf, "
                                                      "m-Q6_K.gguf, BF16/m-BF16-00001-of-00002.gguf (2 parts), "
                                                      "m-IQ3_XXS.gguf, m-UD-Q8_0.gguf");
    assert_string_equal(pick("o/m", paths, 1), "error: o/m has no .gguf model");
    /* names from the Hub are printed escaped: a newline cannot start a line of its own */
    const char *const hostile[] = {"m-Q8_0.gguf", "evil\nerror: fake-Q6_K.gguf"};
    assert_string_equal(pick("o/m:Q2_K", hostile, 2),
                        "error: o/m has no .gguf model with the tag Q2_K; it has: m-Q8_0.gguf, "
                        "evil\\x0Aerror: fake-Q6_K.gguf");
}

static void test_repo_folder(void **state) {
    (void)state;
    char folder[64];
    em_hub_repo_folder("org/Name-GGUF", folder, sizeof folder);
    assert_string_equal(folder, "models--org--Name-GGUF");
}

/* Sets or (value NULL) unsets an environment variable. */
static void set_env(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

static void test_options_from_env(void **state) {
    (void)state;
    const char *names[] = {"HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE", "HOME"};
    char *saved[6];
    for (int i = 0; i < 6; i++) saved[i] = getenv(names[i]) ? strdup(getenv(names[i])) : NULL;
    for (int i = 0; i < 5; i++) unsetenv(names[i]);
    const char *home = EM_BINARY_DIR "/test_hub_home";
    mkdir(home, 0755);
    setenv("HOME", home, 1);

    em_hub_options o;
    assert_null(em_hub_options_from_env(&o));
    assert_string_equal(o.endpoint, EM_HUB_DEFAULT_ENDPOINT);
    assert_string_equal(o.cache_dir, EM_BINARY_DIR "/test_hub_home/.cache/huggingface/hub");
    assert_string_equal(o.revision, "main");
    assert_false(o.offline);
    assert_false(o.progress);

    setenv("HF_HOME", EM_BINARY_DIR "/test_hub_home/hf", 1);
    setenv("HF_ENDPOINT", "http://mirror.example:8080//", 1);
    setenv("HF_HUB_OFFLINE", "TRUE", 1);
    mkdir(EM_BINARY_DIR "/test_hub_home/hf", 0755);
    FILE *f = fopen(EM_BINARY_DIR "/test_hub_home/hf/token", "w");
    assert_non_null(f);
    fputs("hf_from_file\n", f);
    fclose(f);
    assert_null(em_hub_options_from_env(&o));
    assert_string_equal(o.endpoint, "http://mirror.example:8080");
    assert_string_equal(o.cache_dir, EM_BINARY_DIR "/test_hub_home/hf/hub");
    assert_string_equal(o.token, "hf_from_file");
    assert_true(o.offline);

    setenv("HF_HUB_CACHE", "/elsewhere/hub", 1);
    setenv("HF_TOKEN", "hf_from_env", 1);
    setenv("HF_HUB_OFFLINE", "0", 1);
    assert_null(em_hub_options_from_env(&o));
    assert_string_equal(o.cache_dir, "/elsewhere/hub");
    assert_string_equal(o.token, "hf_from_env");
    assert_false(o.offline);

    for (int i = 0; i < 5; i++) unsetenv(names[i]);
    unsetenv("HOME");
    em_err err = em_hub_options_from_env(&o);
    assert_non_null(err);
    assert_non_null(strstr(em_err_message(err), "set HF_HUB_CACHE, HF_HOME or HOME"));
    em_err_free(err);

    for (int i = 0; i < 6; i++) {
        set_env(names[i], saved[i]);
        free(saved[i]);
    }
}

static void test_format_bytes(void **state) {
    (void)state;
    char text[32];
    em_hub_format_bytes(512, text, sizeof text);
    assert_string_equal(text, "512 B");
    em_hub_format_bytes(1.5 * 1024 * 1024 * 1024, text, sizeof text);
    assert_string_equal(text, "1.5 GiB");
}

static void test_printable(void **state) {
    (void)state;
    char *text = em_hub_printable("a\nb\x1b[31m\\c\x7f\xc2\x9b\xc3\xa9.gguf");
    assert_string_equal(text, "a\\x0Ab\\x1B[31m\\x5Cc\\x7F\\xC2\\x9B\xc3\xa9.gguf"); /* é stays */
    free(text);
    text = em_hub_printable("plain/m-Q4_K_M.gguf");
    assert_string_equal(text, "plain/m-Q4_K_M.gguf");
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec),        cmocka_unit_test(test_quant_tags),
        cmocka_unit_test(test_select),      cmocka_unit_test(test_repo_folder),
        cmocka_unit_test(test_options_from_env), cmocka_unit_test(test_format_bytes),
        cmocka_unit_test(test_printable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
