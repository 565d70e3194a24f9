/* Benchmark: rendering a conversation with chat templates (see bench/chat_template.sh).
 *
 *   chat_template_bench MESSAGES.json ITERATIONS TEMPLATE.jinja...
 *
 * For each template prints: name, parse time (us), mean render time (us) over ITERATIONS renders
 * of MESSAGES with add_generation_prompt, bos "<s>", eos "</s>", and the output size in bytes.
 * A report, not a test. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/chat.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MESSAGES.json ITERATIONS TEMPLATE.jinja...\n", argv[0]);
        return 1;
    }
    json_error_t je;
    json_t *messages = json_load_file(argv[1], 0, &je);
    int iterations = atoi(argv[2]);
    if (!messages || iterations < 1) {
        fprintf(stderr, "%s: %s\n", argv[1], messages ? "bad iteration count" : je.text);
        return 1;
    }
    for (int t = 3; t < argc; t++) {
        size_t len;
        char *src = slurp(argv[t], &len);
        if (!src) {
            fprintf(stderr, "cannot read %s\n", argv[t]);
            return 1;
        }
        em_chat_template *tpl;
        double t0 = now_s();
        em_err err = em_chat_template_parse(src, len, &tpl);
        double parse_s = now_s() - t0;
        if (err) {
            fprintf(stderr, "%s: %s\n", argv[t], em_err_message(err));
            return 1;
        }
        em_chat_input in = {.messages = messages, .bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = true};
        size_t out_len = 0;
        t0 = now_s();
        for (int i = 0; i < iterations; i++) {
            char *out;
            err = em_chat_render_input(tpl, &in, NULL, &out, &out_len);
            if (err) {
                fprintf(stderr, "%s: %s\n", argv[t], em_err_message(err));
                return 1;
            }
            free(out);
        }
        double per = (now_s() - t0) / iterations;
        const char *name = strrchr(argv[t], '/') ? strrchr(argv[t], '/') + 1 : argv[t];
        printf("%s %.1f %.1f %zu\n", name, parse_s * 1e6, per * 1e6, out_len);
        em_chat_template_free(tpl);
        free(src);
    }
    json_decref(messages);
    return 0;
}
