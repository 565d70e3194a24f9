/*
 * `ember chat-template (--template FILE.jinja | -m MODEL.gguf) --messages MESSAGES.json
 *   [--add-generation-prompt] [--bos-token S] [--eos-token S] [--tools TOOLS.json] [--var NAME=JSON]...`
 *
 * Renders a conversation with a chat template and writes the text to stdout byte for byte,
 * nothing else. With -m the template is the file's `tokenizer.chat_template`, and bos/eos default
 * to the tokens that `tokenizer.ggml.bos_token_id` / `eos_token_id` name. strftime_now() uses
 * the current time, or SOURCE_DATE_EPOCH (seconds) when that is set, so outputs can be pinned.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../chat/chat.h"
#include "../gguf/gguf.h"
#include "cli.h"

static const char *USAGE =
    "usage: ember chat-template (--template FILE.jinja | -m MODEL.gguf) --messages MESSAGES.json\n"
    "         [--add-generation-prompt] [--bos-token S] [--eos-token S] [--tools TOOLS.json] [--var NAME=JSON]...";

em_err em_cli_read_file(const char *path, char **out, size_t *len) {
    bool from_stdin = !strcmp(path, "-");
    FILE *f = from_stdin ? stdin : fopen(path, "rb");
    if (!f) return em_errorf(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *data = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65536) {
            char *d = realloc(data, cap + 65536 + 1);
            if (!d) {
                free(data);
                if (!from_stdin) fclose(f);
                return em_errorf(EM_ERR_NOMEM, "%s: out of memory", path);
            }
            data = d;
            cap += 65536;
        }
        size_t got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    bool failed = ferror(f);
    if (!from_stdin) fclose(f);
    if (failed) {
        free(data);
        return em_errorf(EM_ERR_IO, "%s: read error", path);
    }
    data[n] = 0;
    *out = data;
    *len = n;
    return NULL;
}

static em_err load_json(const char *path, const char *what, json_t **out) {
    json_error_t je;
    *out = json_load_file(path, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!*out) return em_errorf(EM_ERR_FORMAT, "%s %s: line %d, column %d: %s", what, path, je.line, je.column, je.text);
    return NULL;
}

/* A token's text by id from tokenizer.ggml.tokens; NULL (no error) when the id key is absent. */
static em_err gguf_token(const em_gguf *g, const char *id_key, char **out) {
    *out = NULL;
    if (!em_gguf_find(g, id_key)) return NULL;
    uint32_t id;
    em_err err = em_gguf_get_u32(g, id_key, &id);
    const em_gguf_kv *tokens = NULL;
    if (!err) err = em_gguf_get_array(g, "tokenizer.ggml.tokens", EM_GGUF_STRING, &tokens);
    if (err) return err;
    if (id >= tokens->array_len)
        return em_errorf(EM_ERR_RANGE, "%s = %u is outside tokenizer.ggml.tokens (%llu tokens)", id_key, id,
                         (unsigned long long)tokens->array_len);
    *out = em_str_dup(tokens->strings[id]);
    return *out ? NULL : em_errorf(EM_ERR_NOMEM, "out of memory");
}

static em_err load_model(const char *path, char **tpl, size_t *tpl_len, char **bos, char **eos) {
    em_gguf *g;
    em_err err = em_gguf_open(path, &g);
    if (err) return err;
    em_str s;
    err = em_gguf_get_str(g, "tokenizer.chat_template", &s);
    if (err) err = em_err_prefix(err, "%s has no chat template", path);
    if (!err && !(*tpl = em_str_dup(s))) err = em_errorf(EM_ERR_NOMEM, "out of memory");
    if (!err) *tpl_len = s.len;
    if (!err) err = gguf_token(g, "tokenizer.ggml.bos_token_id", bos);
    if (!err) err = gguf_token(g, "tokenizer.ggml.eos_token_id", eos);
    em_gguf_close(g);
    return err;
}

int em_cli_chat_template(int argc, char **argv) {
    const char *template_path = NULL, *model_path = NULL, *messages_path = NULL, *tools_path = NULL;
    const char *bos_arg = NULL, *eos_arg = NULL;
    bool add_generation_prompt = false;
    json_t *extra = json_object();
    em_err err = extra ? NULL : em_errorf(EM_ERR_NOMEM, "out of memory");
    for (int i = 1; i < argc && !err; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "--add-generation-prompt")) add_generation_prompt = true;
        else if (!strcmp(a, "--template") && has_value) template_path = argv[++i];
        else if (!strcmp(a, "-m") && has_value) model_path = argv[++i];
        else if (!strcmp(a, "--messages") && has_value) messages_path = argv[++i];
        else if (!strcmp(a, "--tools") && has_value) tools_path = argv[++i];
        else if (!strcmp(a, "--bos-token") && has_value) bos_arg = argv[++i];
        else if (!strcmp(a, "--eos-token") && has_value) eos_arg = argv[++i];
        else if (!strcmp(a, "--var") && has_value) {
            const char *spec = argv[++i], *eq = strchr(spec, '=');
            if (!eq || eq == spec) {
                err = em_errorf(EM_ERR_INVALID, "--var wants NAME=JSON, got '%s'", spec);
                break;
            }
            json_error_t je;
            json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, &je);
            if (!v) {
                err = em_errorf(EM_ERR_INVALID, "--var %.*s: invalid JSON: %s", (int)(eq - spec), spec, je.text);
                break;
            }
            char *name = strndup(spec, (size_t)(eq - spec));
            if (!name || json_object_set_new(extra, name, v)) err = em_errorf(EM_ERR_INVALID, "--var: bad name '%s'", spec);
            free(name);
        } else {
            err = em_errorf(EM_ERR_INVALID, "unexpected argument '%s'\n%s", a, USAGE);
        }
    }
    if (!err && (!template_path == !model_path))
        err = em_errorf(EM_ERR_INVALID, "give exactly one of --template and -m\n%s", USAGE);
    if (!err && !messages_path) err = em_errorf(EM_ERR_INVALID, "--messages is required\n%s", USAGE);

    char *src = NULL, *model_bos = NULL, *model_eos = NULL, *out = NULL;
    size_t src_len = 0, out_len = 0;
    json_t *messages = NULL, *tools = NULL;
    em_chat_template *tpl = NULL;
    if (!err) err = template_path ? em_cli_read_file(template_path, &src, &src_len)
                                  : load_model(model_path, &src, &src_len, &model_bos, &model_eos);
    if (!err) err = load_json(messages_path, "messages", &messages);
    if (!err && !json_is_array(messages)) err = em_errorf(EM_ERR_INVALID, "messages %s: expected a JSON array", messages_path);
    if (!err && tools_path) err = load_json(tools_path, "tools", &tools);
    if (!err) {
        err = em_chat_template_parse(src, src_len, &tpl);
        if (err) err = em_err_prefix(err, "%s", template_path ? template_path : model_path);
    }
    if (!err) {
        em_chat_input input = {
            .messages = messages,
            .tools = tools,
            .bos_token = bos_arg ? bos_arg : model_bos,
            .eos_token = eos_arg ? eos_arg : model_eos,
            .add_generation_prompt = add_generation_prompt,
            .extra = extra,
        };
        em_chat_render_options options = {.now = -1};
        const char *epoch = getenv("SOURCE_DATE_EPOCH");
        if (epoch && *epoch) options.now = strtoll(epoch, NULL, 10);
        err = em_chat_render_input(tpl, &input, &options, &out, &out_len);
    }
    if (!err && fwrite(out, 1, out_len, stdout) != out_len) err = em_errorf(EM_ERR_IO, "cannot write to stdout");
    if (!err && fflush(stdout)) err = em_errorf(EM_ERR_IO, "cannot write to stdout");
    free(out);
    em_chat_template_free(tpl);
    json_decref(messages);
    json_decref(tools);
    json_decref(extra);
    free(src);
    free(model_bos);
    free(model_eos);
    return err ? em_cli_fail("chat-template", err) : 0;
}
