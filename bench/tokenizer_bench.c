/* Tokenization throughput of Ember (bench/tokenizer.sh runs it beside node-llama-cpp).
 *
 *   tokenizer_bench MODEL.gguf TEXT_FILE RUNS
 *       tokenizes the whole file RUNS times (no BOS/EOS, special-token text not parsed) and prints
 *       "tokens N median_s S mb_per_s R" for the median run (load time excluded).
 *   tokenizer_bench --make-gguf TOKENIZER_JSON TOKENIZER_CONFIG BASE.gguf OUT.gguf
 *       writes OUT.gguf: the metadata of BASE.gguf except its tokenizer, plus the tokenizer
 *       converted from tokenizer.json (a vocabulary-only file both engines can load). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int die(em_err err) {
    fprintf(stderr, "tokenizer_bench: %s\n", em_err_message(err));
    em_err_free(err);
    return 1;
}

static int make_gguf(char **argv) {
    em_gguf *base;
    em_err err = em_gguf_open(argv[4], &base);
    if (err) return die(err);
    em_gguf_writer *w;
    err = em_gguf_writer_new(3, &w);
    for (uint64_t i = 0; !err && i < em_gguf_kv_count(base); i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(base, i);
        if (kv->key.len >= 10 && !memcmp(kv->key.ptr, "tokenizer.", 10)) continue;
        err = em_gguf_writer_copy_kv(w, kv);
    }
    if (!err) err = em_tokenizer_hf_to_gguf(argv[2], argv[3], 0, w); /* 0: the tokenizer's own tokens */
    if (!err) err = em_gguf_writer_write(w, argv[5]);
    em_gguf_writer_free(w);
    em_gguf_close(base);
    return err ? die(err) : 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "--make-gguf")) return make_gguf(argv);
    if (argc != 4) {
        fprintf(stderr, "usage: tokenizer_bench MODEL.gguf TEXT_FILE RUNS\n"
                        "       tokenizer_bench --make-gguf TOKENIZER_JSON TOKENIZER_CONFIG BASE.gguf OUT.gguf\n");
        return 1;
    }
    em_gguf *g;
    em_err err = em_gguf_open(argv[1], &g);
    if (err) return die(err);
    em_tokenizer *t;
    err = em_tokenizer_from_gguf(g, &t);
    em_gguf_close(g);
    if (err) return die(err);
    FILE *f = fopen(argv[2], "rb");
    if (!f) return fprintf(stderr, "tokenizer_bench: cannot open %s\n", argv[2]), 1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) return fprintf(stderr, "tokenizer_bench: read failed\n"), 1;
    fclose(f);
    int runs = atoi(argv[3]);
    if (runs < 1 || runs > 1000) runs = 3;
    double *times = malloc((size_t)runs * sizeof *times);
    size_t n_tokens = 0;
    for (int r = 0; r < runs; r++) {
        int32_t *ids;
        double start = now();
        err = em_tokenize(t, text, (size_t)size, false, false, &ids, &n_tokens);
        times[r] = now() - start;
        if (err) return die(err);
        free(ids);
    }
    qsort(times, (size_t)runs, sizeof *times, compare_double);
    double median = times[runs / 2];
    printf("tokens %zu median_s %.4f mb_per_s %.3f\n", n_tokens, median, (double)size / 1e6 / median);
    free(times);
    free(text);
    em_tokenizer_free(t);
    return 0;
}
