/* Benchmark: rendering a 50-message conversation with a chat template.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Isrc bench/chat_template.c build/libember_core.a \
 *      $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -lpthread -o build/bench_chat_template
 *   build/bench_chat_template [TEMPLATE.jinja ...]   (default: tests/fixtures/chat/chatml.jinja)
 *
 * Reports the parse time and the mean render time per template (a report, not a test). */
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
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    if (buf) buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

int main(int argc, char **argv) {
    const char *defaults[] = {"tests/fixtures/chat/chatml.jinja"};
    const char **paths = argc > 1 ? (const char **)argv + 1 : defaults;
    int count = argc > 1 ? argc - 1 : 1;
    json_t *messages = json_array();
    json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system", "content", "You are a helpful assistant."));
    for (int i = 0; i < 49; i++) {
        char text[256];
        snprintf(text, sizeof text, "Message %d: a sentence of ordinary length that a user might type, with some details.", i);
        json_array_append_new(messages, json_pack("{s:s,s:s}", "role", i % 2 ? "assistant" : "user", "content", text));
    }
    for (int t = 0; t < count; t++) {
        size_t len;
        char *src = slurp(paths[t], &len);
        if (!src) {
            fprintf(stderr, "cannot read %s\n", paths[t]);
            return 1;
        }
        em_chat_template *tpl;
        double t0 = now_s();
        em_err err = em_chat_template_parse(src, len, &tpl);
        double parse_s = now_s() - t0;
        if (err) {
            fprintf(stderr, "%s: %s\n", paths[t], em_err_message(err));
            return 1;
        }
        em_chat_input in = {.messages = messages, .bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = true};
        int iterations = 2000;
        size_t out_len = 0;
        t0 = now_s();
        for (int i = 0; i < iterations; i++) {
            char *out;
            err = em_chat_render_input(tpl, &in, NULL, &out, &out_len);
            if (err) {
                fprintf(stderr, "%s: %s\n", paths[t], em_err_message(err));
                return 1;
            }
            free(out);
        }
        double per = (now_s() - t0) / iterations;
        printf("%-40s parse %8.1f us   render 50 messages %8.1f us  (%zu bytes out)\n", paths[t], parse_s * 1e6, per * 1e6, out_len);
        em_chat_template_free(tpl);
        free(src);
    }
    json_decref(messages);
    return 0;
}
