/* GGUF reader and writer: fixtures load, round trips are byte-identical, malformed files fail
 * cleanly with errors that name the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

static const char *fixture_files[] = {
    "quant-reference.gguf",
    "vocab/ggml-vocab-baichuan.gguf",
    "vocab/ggml-vocab-bert-bge.gguf",
    "vocab/ggml-vocab-deepseek-coder.gguf",
    "vocab/ggml-vocab-deepseek-llm.gguf",
    "vocab/ggml-vocab-falcon.gguf",
    "vocab/ggml-vocab-gpt-2.gguf",
    "vocab/ggml-vocab-llama-spm.gguf",
    "vocab/ggml-vocab-phi-3.gguf",
};
#define FIXTURE_COUNT (sizeof fixture_files / sizeof fixture_files[0])

static char *fixture_path(const char *name) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", EM_FIXTURES_DIR, name);
    return path;
}

static uint8_t *read_whole(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = malloc(n > 0 ? (size_t)n : 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return data;
}

static char *temp_path(void) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/ember-test-gguf-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    return path;
}

static void test_fixtures_open(void **state) {
    (void)state;
    for (size_t i = 0; i < FIXTURE_COUNT; i++) {
        em_gguf *g;
        em_err err = em_gguf_open(fixture_path(fixture_files[i]), &g);
        if (err) fail_msg("%s", em_err_message(err));
        assert_true(em_gguf_version(g) == 2 || em_gguf_version(g) == 3);
        em_str arch;
        assert_null(em_gguf_get_str(g, "general.architecture", &arch));
        em_gguf_close(g);
    }
}

static void test_quant_reference_contents(void **state) {
    (void)state;
    em_gguf *g;
    assert_null(em_gguf_open(fixture_path("quant-reference.gguf"), &g));
    assert_int_equal(em_gguf_tensor_count(g), 68);
    assert_int_equal(em_gguf_kv_count(g), 2);
    const em_gguf_tensor *t = em_gguf_find_tensor(g, "Q4_K.q");
    assert_non_null(t);
    assert_int_equal(t->type, EM_TYPE_Q4_K);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 512);
    assert_int_equal(t->ne[1], 8);
    assert_int_equal(t->size, 4096 / 256 * 144);
    t = em_gguf_find_tensor(g, "Q4_0.deq");
    assert_int_equal(t->type, EM_TYPE_F32);
    assert_int_equal(t->size, 4096 * 4);
    assert_null(em_gguf_find_tensor(g, "nope"));
    em_gguf_close(g);
}

/* A file read into memory holds what the mapped file holds: the same metadata and tensor bytes. */
static void test_open_into_memory(void **state) {
    (void)state;
    em_gguf *mapped, *copy;
    assert_null(em_gguf_open(fixture_path("quant-reference.gguf"), &mapped));
    assert_null(em_gguf_open_as(fixture_path("quant-reference.gguf"), EM_GGUF_PRIVATE, &copy));
    assert_false(em_gguf_is_private(mapped));
    assert_true(em_gguf_is_private(copy));
    assert_int_equal(em_gguf_kv_count(copy), em_gguf_kv_count(mapped));
    assert_int_equal(em_gguf_tensor_count(copy), em_gguf_tensor_count(mapped));
    for (uint64_t i = 0; i < em_gguf_tensor_count(mapped); i++) {
        const em_gguf_tensor *a = em_gguf_tensor_at(mapped, i), *b = em_gguf_tensor_at(copy, i);
        assert_true(a->data != b->data);
        assert_int_equal(a->size, b->size);
        assert_memory_equal(a->data, b->data, a->size);
    }
    em_gguf_close(copy);
    em_gguf_close(mapped);
    /* a missing file is the same error either way */
    em_err err = em_gguf_open_as("/nonexistent/model.gguf", EM_GGUF_PRIVATE, &copy);
    assert_int_equal(em_err_code_of(err), EM_ERR_NOT_FOUND);
    assert_null(copy);
    em_err_free(err);
}

static void test_vocab_arrays(void **state) {
    (void)state;
    em_gguf *g;
    assert_null(em_gguf_open(fixture_path("vocab/ggml-vocab-llama-spm.gguf"), &g));
    const em_gguf_kv *tokens, *scores, *types;
    assert_null(em_gguf_get_array(g, "tokenizer.ggml.tokens", EM_GGUF_STRING, &tokens));
    assert_int_equal(tokens->array_len, 32000);
    assert_true(em_str_eq(tokens->strings[0], "<unk>"));
    assert_true(em_str_eq(tokens->strings[1], "<s>"));
    assert_true(em_str_eq(tokens->strings[3], "<0x00>"));
    assert_null(em_gguf_get_array(g, "tokenizer.ggml.scores", EM_GGUF_FLOAT32, &scores));
    assert_int_equal(scores->array_len, 32000);
    assert_null(em_gguf_get_array(g, "tokenizer.ggml.token_type", EM_GGUF_INT32, &types));
    assert_int_equal(em_gguf_array_int(types, 0), 2); /* <unk> is UNKNOWN */
    assert_int_equal(em_gguf_array_int(types, 1), 3); /* <s> is CONTROL */
    assert_int_equal(em_gguf_array_int(types, 3), 6); /* <0x00> is BYTE */
    assert_int_equal(em_gguf_array_int(types, 999999), 0); /* out of range reads 0, never past the end */
    uint32_t bos;
    assert_null(em_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos));
    assert_int_equal(bos, 1);
    em_gguf_close(g);
}

static void test_getter_errors(void **state) {
    (void)state;
    em_gguf *g;
    assert_null(em_gguf_open(fixture_path("vocab/ggml-vocab-llama-spm.gguf"), &g));
    uint32_t u32;
    em_str s;
    const em_gguf_kv *kv;
    em_err err = em_gguf_get_u32(g, "no.such.key", &u32);
    assert_int_equal(em_err_code_of(err), EM_ERR_NOT_FOUND);
    assert_non_null(strstr(em_err_message(err), "no.such.key"));
    em_err_free(err);
    err = em_gguf_get_str(g, "tokenizer.ggml.bos_token_id", &s);
    assert_int_equal(em_err_code_of(err), EM_ERR_TYPE);
    assert_non_null(strstr(em_err_message(err), "expected string"));
    em_err_free(err);
    err = em_gguf_get_u32(g, "general.architecture", &u32);
    assert_int_equal(em_err_code_of(err), EM_ERR_TYPE);
    em_err_free(err);
    err = em_gguf_get_array(g, "tokenizer.ggml.tokens", EM_GGUF_INT32, &kv);
    assert_int_equal(em_err_code_of(err), EM_ERR_TYPE);
    assert_non_null(strstr(em_err_message(err), "array of string"));
    em_err_free(err);
    em_gguf_close(g);
}

/* Reads a file and writes back everything read; the bytes must be identical. */
static void round_trip(const char *path) {
    em_gguf *g;
    em_err err = em_gguf_open(path, &g);
    if (err) fail_msg("%s", em_err_message(err));
    em_gguf_writer *w;
    assert_null(em_gguf_writer_new(em_gguf_version(g), &w));
    for (uint64_t i = 0; i < em_gguf_kv_count(g); i++) assert_null(em_gguf_writer_copy_kv(w, em_gguf_kv_at(g, i)));
    for (uint64_t i = 0; i < em_gguf_tensor_count(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        char *name = em_str_dup(t->name);
        assert_null(em_gguf_writer_add_tensor(w, name, t->n_dims, t->ne, t->type, t->data, false));
        free(name);
    }
    char *out = temp_path();
    assert_null(em_gguf_writer_write(w, out));
    size_t a_size, b_size;
    uint8_t *a = read_whole(path, &a_size), *b = read_whole(out, &b_size);
    assert_int_equal(a_size, b_size);
    assert_memory_equal(a, b, a_size);
    free(a);
    free(b);
    unlink(out);
    em_gguf_writer_free(w);
    em_gguf_close(g);
}

static void test_round_trip_fixtures(void **state) {
    (void)state;
    for (size_t i = 0; i < FIXTURE_COUNT; i++) round_trip(fixture_path(fixture_files[i]));
}

/* A small file with every metadata type and two tensors, written by the writer. */
static uint8_t *make_sample(size_t *size) {
    em_gguf_writer *w;
    assert_null(em_gguf_writer_new(3, &w));
    assert_null(em_gguf_writer_add_str(w, "general.architecture", "test"));
    assert_null(em_gguf_writer_add_u8(w, "t.u8", 200));
    assert_null(em_gguf_writer_add_i32(w, "t.i32", -5));
    assert_null(em_gguf_writer_add_u32(w, "t.u32", 4000000000u));
    assert_null(em_gguf_writer_add_u64(w, "t.u64", UINT64_C(1) << 40));
    assert_null(em_gguf_writer_add_f32(w, "t.f32", 0.5f));
    assert_null(em_gguf_writer_add_bool(w, "t.bool", true));
    int16_t shorts[3] = {-1, 2, -3};
    assert_null(em_gguf_writer_add_array(w, "t.i16s", EM_GGUF_INT16, shorts, 3));
    const char *words[] = {"alpha", "", "gamma"};
    assert_null(em_gguf_writer_add_str_array(w, "t.words", words, NULL, 3));
    float a[64], b[32];
    for (int i = 0; i < 64; i++) a[i] = (float)i;
    for (int i = 0; i < 32; i++) b[i] = -(float)i;
    uint64_t a_ne[2] = {32, 2}, b_ne[1] = {32};
    assert_null(em_gguf_writer_add_tensor(w, "a", 2, a_ne, EM_TYPE_F32, a, true));
    assert_null(em_gguf_writer_add_tensor(w, "b", 1, b_ne, EM_TYPE_F32, b, true));
    char *path = temp_path();
    assert_null(em_gguf_writer_write(w, path));
    em_gguf_writer_free(w);
    uint8_t *data = read_whole(path, size);
    unlink(path);
    return data;
}

/* A fill callback that writes a few bytes and then fails, as a full disk would. */
static em_err fail_halfway(void *user, uint64_t index, void *file, uint64_t size) {
    (void)user, (void)index;
    fwrite("abcd", 1, 4, file);
    return size > 4 ? em_errorf(EM_ERR_IO, "disk full (test)") : NULL;
}

/* Writes a file with one f32 tensor "v" of n copies of value; with fail, its bytes come from
 * fail_halfway. */
static em_err write_values(const char *path, uint64_t n, float value, bool fail) {
    em_gguf_writer *w;
    assert_null(em_gguf_writer_new(3, &w));
    float *v = malloc(n * sizeof *v);
    for (uint64_t i = 0; i < n; i++) v[i] = value;
    assert_null(em_gguf_writer_add_tensor(w, "v", 1, &n, EM_TYPE_F32, fail ? NULL : v, true));
    em_err err = em_gguf_writer_write_streaming(w, path, fail_halfway, NULL);
    em_gguf_writer_free(w);
    free(v);
    return err;
}

static float last_value(const em_gguf *g, uint64_t *n) {
    const em_gguf_tensor *t = em_gguf_find_tensor(g, "v");
    assert_non_null(t);
    *n = t->ne[0];
    return ((const float *)t->data)[t->ne[0] - 1];
}

/* Writing over a file replaces it whole: an open reader keeps the old contents, a failed write
 * leaves the old file and no partial file behind, the file keeps its permissions, and a device is
 * written in place. */
static void test_writer_replaces_whole(void **state) {
    (void)state;
    char dir[] = "/tmp/ember-test-gguf-dir-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[96];
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    assert_null(write_values(path, 4096, 1.0f, false));
    assert_int_equal(chmod(path, 0640), 0);
    em_gguf *old, *now;
    assert_null(em_gguf_open(path, &old));
    assert_null(write_values(path, 16, 2.0f, false)); /* smaller: in place, the reader would lose pages */
    uint64_t n;
    assert_true(last_value(old, &n) == 1.0f);
    assert_int_equal(n, 4096);
    em_err err = write_values(path, 64, 3.0f, true);
    assert_non_null(err);
    assert_non_null(strstr(em_err_message(err), "disk full"));
    em_err_free(err);
    assert_null(em_gguf_open(path, &now));
    assert_true(last_value(now, &n) == 2.0f);
    assert_int_equal(n, 16);
    em_gguf_close(now);
    em_gguf_close(old);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640); /* the replaced file's permissions */
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));) entries += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(entries, 1); /* model.gguf alone */
    assert_null(write_values("/dev/null", 16, 4.0f, false));
    assert_int_equal(stat("/dev/null", &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    unlink(path);
    rmdir(dir);
}

static void test_writer_values(void **state) {
    (void)state;
    size_t size;
    uint8_t *data = make_sample(&size);
    em_gguf *g;
    em_err err = em_gguf_open_buffer(data, size, "sample", &g);
    if (err) fail_msg("%s", em_err_message(err));
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    bool flag;
    assert_null(em_gguf_get_u32(g, "t.u8", &u32));
    assert_int_equal(u32, 200);
    assert_null(em_gguf_get_u32(g, "t.u32", &u32));
    assert_int_equal(u32, 4000000000u);
    assert_null(em_gguf_get_u64(g, "t.u64", &u64));
    assert_int_equal(u64, UINT64_C(1) << 40);
    assert_null(em_gguf_get_i64(g, "t.i32", &i64));
    assert_int_equal(i64, -5);
    err = em_gguf_get_u32(g, "t.i32", &u32); /* -5 does not fit an unsigned value */
    assert_int_equal(em_err_code_of(err), EM_ERR_RANGE);
    em_err_free(err);
    err = em_gguf_get_u32(g, "t.u64", &u32);
    assert_int_equal(em_err_code_of(err), EM_ERR_RANGE);
    em_err_free(err);
    assert_null(em_gguf_get_f32(g, "t.f32", &f));
    assert_true(f == 0.5f);
    assert_null(em_gguf_get_bool(g, "t.bool", &flag));
    assert_true(flag);
    const em_gguf_kv *kv;
    assert_null(em_gguf_get_array(g, "t.i16s", EM_GGUF_INT16, &kv));
    assert_int_equal(em_gguf_array_int(kv, 0), -1);
    assert_int_equal(em_gguf_array_int(kv, 2), -3);
    assert_null(em_gguf_get_array(g, "t.words", EM_GGUF_STRING, &kv));
    assert_true(em_str_eq(kv->strings[0], "alpha") && em_str_eq(kv->strings[1], "") && em_str_eq(kv->strings[2], "gamma"));
    const em_gguf_tensor *t = em_gguf_find_tensor(g, "b");
    assert_int_equal(t->offset % 32, 0);
    assert_true(((const float *)t->data)[5] == -5.0f);
    t = em_gguf_find_tensor(g, "a");
    assert_int_equal(t->ne[1], 2);
    assert_true(((const float *)t->data)[63] == 63.0f);
    em_gguf_close(g);
    free(data);
}

/* Opens a mutated buffer and checks it fails with a message containing `expected`. */
static void expect_failure(const uint8_t *data, size_t size, const char *expected) {
    em_gguf *g = (em_gguf *)1;
    em_err err = em_gguf_open_buffer(data, size, "bad.gguf", &g);
    if (!err) fail_msg("expected an error containing '%s', got success", expected);
    assert_null(g);
    if (!strstr(em_err_message(err), expected))
        fail_msg("error '%s' does not contain '%s'", em_err_message(err), expected);
    assert_non_null(strstr(em_err_message(err), "bad.gguf"));
    em_err_free(err);
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Finds the byte offset of the tensor info named `name` (its length field). */
static size_t find_bytes(const uint8_t *data, size_t size, const char *needle, size_t needle_len) {
    for (size_t i = 0; i + needle_len <= size; i++)
        if (!memcmp(data + i, needle, needle_len)) return i;
    fail_msg("pattern not found");
    return 0;
}

static void test_malformed(void **state) {
    (void)state;
    size_t size;
    uint8_t *good = make_sample(&size);
    uint8_t *bad = malloc(size);
    /* Every truncation fails cleanly (ASan in CI proves no read goes past the end). */
    for (size_t n = 0; n < size; n++) {
        em_gguf *g;
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, good, n);
        em_err err = em_gguf_open_buffer(copy, n, "cut.gguf", &g);
        if (!err) fail_msg("truncation to %zu of %zu bytes was accepted", n, size);
        em_err_free(err);
        free(copy);
    }
    memcpy(bad, good, size);
    bad[0] = 'X';
    expect_failure(bad, size, "magic");
    memcpy(bad, good, size);
    put_u32(bad + 4, 1);
    expect_failure(bad, size, "version 1 is not supported");
    memcpy(bad, good, size);
    put_u64(bad + 8, UINT64_MAX);
    expect_failure(bad, size, "tensor count");
    memcpy(bad, good, size);
    put_u64(bad + 16, UINT64_C(1) << 60);
    expect_failure(bad, size, "metadata count");
    memcpy(bad, good, size);
    put_u64(bad + 24, UINT64_MAX); /* length of the first key */
    expect_failure(bad, size, "string length");
    /* An unknown value type: the type field follows "general.architecture". */
    memcpy(bad, good, size);
    size_t key = find_bytes(good, size, "general.architecture", 20);
    put_u32(bad + key + 20, 77);
    expect_failure(bad, size, "unknown type 77");
    /* A string array whose count would need more bytes than the file has. */
    memcpy(bad, good, size);
    key = find_bytes(good, size, "t.words", 7);
    put_u64(bad + key + 7 + 4 + 4, UINT64_C(1) << 50);
    expect_failure(bad, size, "array length");
    /* A bool that is neither 0 nor 1. */
    memcpy(bad, good, size);
    key = find_bytes(good, size, "t.bool", 6);
    bad[key + 6 + 4] = 7;
    expect_failure(bad, size, "bool value");
    /* Tensor infos: name "b" (length 1) is followed by dims, ne, type, offset. */
    size_t info_b = find_bytes(good, size, "\x01\0\0\0\0\0\0\0b", 9);
    size_t dims = info_b + 9, ne0 = dims + 4, type = ne0 + 8, offset = type + 4;
    memcpy(bad, good, size);
    put_u32(bad + dims, 5);
    expect_failure(bad, size, "dimension count");
    memcpy(bad, good, size);
    put_u32(bad + type, 4); /* a retired type id */
    expect_failure(bad, size, "unknown tensor type id 4");
    memcpy(bad, good, size);
    put_u32(bad + type, EM_TYPE_Q4_0); /* 32 elements are fine for Q4_0: make the row 33 */
    put_u64(bad + ne0, 33);
    expect_failure(bad, size, "not a multiple of the Q4_0 block");
    memcpy(bad, good, size);
    put_u64(bad + offset, 0); /* b now overlaps a */
    expect_failure(bad, size, "overlaps");
    memcpy(bad, good, size);
    put_u64(bad + offset, 1024);
    expect_failure(bad, size, "outside the file");
    memcpy(bad, good, size);
    put_u64(bad + offset, 33);
    expect_failure(bad, size, "alignment");
    memcpy(bad, good, size);
    put_u64(bad + ne0, UINT64_MAX);
    expect_failure(bad, size, "absurd");
    memcpy(bad, good, size);
    bad[info_b + 8] = 'a'; /* both tensors named "a" */
    expect_failure(bad, size, "duplicate tensor");
    memcpy(bad, good, size);
    key = find_bytes(good, size, "t.u32", 5);
    memcpy(bad + key, "t.f32", 5); /* a second "t.f32" */
    expect_failure(bad, size, "duplicate key 't.f32'");
    free(bad);
    free(good);
}

/* Found by the fuzzer: a huge float read as an integer was undefined behaviour. */
static void test_float_to_int_saturates(void **state) {
    (void)state;
    em_gguf_writer *w;
    assert_null(em_gguf_writer_new(3, &w));
    assert_null(em_gguf_writer_add_f32(w, "big", -7.8e30f));
    assert_null(em_gguf_writer_add_f32(w, "nan", NAN));
    assert_null(em_gguf_writer_add_f32(w, "small", -2.75f));
    char *path = temp_path();
    assert_null(em_gguf_writer_write(w, path));
    em_gguf_writer_free(w);
    size_t size;
    uint8_t *data = read_whole(path, &size);
    unlink(path);
    em_gguf *g;
    assert_null(em_gguf_open_buffer(data, size, "floats", &g));
    assert_true(em_gguf_kv_int(em_gguf_find(g, "big")) == INT64_MIN);
    assert_int_equal(em_gguf_kv_int(em_gguf_find(g, "nan")), 0);
    assert_int_equal(em_gguf_kv_int(em_gguf_find(g, "small")), -2);
    em_gguf_close(g);
    free(data);
}

static void test_missing_file(void **state) {
    (void)state;
    em_gguf *g;
    em_err err = em_gguf_open("/nonexistent/model.gguf", &g);
    assert_int_equal(em_err_code_of(err), EM_ERR_NOT_FOUND);
    assert_non_null(strstr(em_err_message(err), "/nonexistent/model.gguf"));
    em_err_free(err);
    char *empty = temp_path();
    err = em_gguf_open(empty, &g);
    assert_non_null(err);
    assert_non_null(strstr(em_err_message(err), "truncated"));
    em_err_free(err);
    unlink(empty);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_open),      cmocka_unit_test(test_quant_reference_contents),
        cmocka_unit_test(test_vocab_arrays),       cmocka_unit_test(test_open_into_memory),       cmocka_unit_test(test_getter_errors),
        cmocka_unit_test(test_round_trip_fixtures), cmocka_unit_test(test_writer_values),
        cmocka_unit_test(test_malformed),          cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_float_to_int_saturates), cmocka_unit_test(test_writer_replaces_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
