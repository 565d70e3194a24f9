/* `gguf_edit IN.gguf OUT.gguf [--template F.jinja] [--control ID=TEXT]...`: copies a model with its
 * chat template replaced by the file's text and token ID turned into a control token whose text is
 * TEXT (test helper: the tool-call tests give a synthetic model a real template and the call
 * markers that real vocabularies hold as control tokens). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#define MAX_CONTROLS 16

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *text = NULL;
    size_t len = 0, cap = 0, got;
    char chunk[4096];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + got + 1 > cap) {
            cap = (len + got + 1) * 2;
            char *grown = realloc(text, cap);
            if (!grown) break;
            text = grown;
        }
        memcpy(text + len, chunk, got);
        len += got;
    }
    fclose(f);
    if (text) text[len] = '\0';
    return text;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: gguf_edit IN.gguf OUT.gguf [--template F.jinja] [--control ID=TEXT]...\n");
        return 1;
    }
    char *template_text = NULL;
    uint64_t control_ids[MAX_CONTROLS];
    const char *control_texts[MAX_CONTROLS];
    size_t n_controls = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--template") && i + 1 < argc) {
            if (!(template_text = read_file(argv[++i]))) {
                fprintf(stderr, "gguf_edit: cannot read %s\n", argv[i]);
                return 1;
            }
        } else if (!strcmp(argv[i], "--control") && i + 1 < argc && n_controls < MAX_CONTROLS &&
                   strchr(argv[i + 1], '=')) {
            control_ids[n_controls] = strtoull(argv[++i], NULL, 10);
            control_texts[n_controls++] = strchr(argv[i], '=') + 1;
        } else {
            fprintf(stderr, "gguf_edit: bad argument '%s'\n", argv[i]);
            return 1;
        }
    }
    em_gguf *in = NULL;
    em_gguf_writer *w = NULL;
    em_err err = em_gguf_open(argv[1], &in);
    if (!err) err = em_gguf_writer_new(3, &w);
    for (uint64_t i = 0; !err && i < em_gguf_kv_count(in); i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(in, i);
        if (em_str_eq(kv->key, "tokenizer.chat_template") && template_text) continue;
        if (em_str_eq(kv->key, "tokenizer.ggml.tokens") && n_controls) {
            const char **strings = malloc(kv->array_len * sizeof *strings);
            uint64_t *lengths = malloc(kv->array_len * sizeof *lengths);
            if (!strings || !lengths) return fprintf(stderr, "gguf_edit: out of memory\n"), 1;
            for (uint64_t t = 0; t < kv->array_len; t++) {
                strings[t] = kv->strings[t].ptr;
                lengths[t] = kv->strings[t].len;
            }
            for (size_t c = 0; c < n_controls; c++) {
                if (control_ids[c] >= kv->array_len) continue;
                strings[control_ids[c]] = control_texts[c];
                lengths[control_ids[c]] = strlen(control_texts[c]);
            }
            err = em_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", strings, lengths, kv->array_len);
            free(strings);
            free(lengths);
        } else if (em_str_eq(kv->key, "tokenizer.ggml.token_type") && n_controls) {
            int32_t *types = malloc(kv->array_len * sizeof *types);
            if (!types) return fprintf(stderr, "gguf_edit: out of memory\n"), 1;
            for (uint64_t t = 0; t < kv->array_len; t++) types[t] = (int32_t)em_gguf_array_int(kv, t);
            for (size_t c = 0; c < n_controls; c++)
                if (control_ids[c] < kv->array_len) types[control_ids[c]] = EM_TOKEN_CONTROL;
            err = em_gguf_writer_add_array(w, "tokenizer.ggml.token_type", EM_GGUF_INT32, types, kv->array_len);
            free(types);
        } else {
            err = em_gguf_writer_copy_kv(w, kv);
        }
    }
    if (!err && template_text) err = em_gguf_writer_add_str(w, "tokenizer.chat_template", template_text);
    for (uint64_t i = 0; !err && i < em_gguf_tensor_count(in); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(in, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        err = em_gguf_writer_add_tensor(w, name, t->n_dims, t->ne, t->type, t->data, false);
    }
    if (!err) err = em_gguf_writer_write(w, argv[2]);
    em_gguf_writer_free(w);
    if (in) em_gguf_close(in);
    free(template_text);
    if (err) {
        fprintf(stderr, "gguf_edit: %s\n", em_err_message(err));
        em_err_free(err);
        return 1;
    }
    return 0;
}
