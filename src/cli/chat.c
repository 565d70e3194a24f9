/*
 * `ember chat -m MODEL.gguf [--system TEXT] [-n N] [--temp T] [--seed S] [--ctx N] [--device D]`:
 * an interactive conversation on standard input and output.
 *
 * Each line read is a user turn. The whole conversation is rendered with the model's chat template
 * and tokenized by the engine (ember_chat_tokens, as the server does: message text never becomes
 * control tokens), then submitted to it; the reply streams to stdout and joins the conversation. Since every
 * turn's prompt begins with the previous turn's prompt and reply, the prefix cache serves all of
 * it: the per-turn line on stderr shows how many prompt tokens came from the cache. End with EOF
 * (Ctrl-D) or an empty line.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ember.h"

typedef struct chat_args {
    em_cli_model source; /* -m/--gguf or --hf: resolved into `model` */
    const char *model, *system, *device;
    int max_tokens, ctx;
    float temperature;
    uint64_t seed;
    em_cli_spec spec;
} chat_args;

static em_err parse_args(int argc, char **argv, chat_args *a) {
    *a = (chat_args){.max_tokens = 512, .temperature = 0.7f};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (em_cli_model_flag(&a->source, f)) continue;
        if (i + 1 >= argc) return em_errorf(EM_ERR_INVALID, "%s needs a value (or is unknown)", f);
        const char *v = argv[++i];
        char *end;
        if (em_cli_model_option(&a->source, f, v)) continue;
        em_err err;
        if (em_cli_spec_option(&a->spec, f, v, &err)) {
            if (err) return err;
            continue;
        }
        if (!strcmp(f, "--system")) a->system = v;
        else if (!strcmp(f, "--device")) a->device = v;
        else if (!strcmp(f, "-n")) {
            long n = strtol(v, &end, 10);
            if (!*v || *end || n < 1 || n > (1 << 20)) return em_errorf(EM_ERR_INVALID, "-n expects 1..1048576, got '%s'", v);
            a->max_tokens = (int)n;
        } else if (!strcmp(f, "--ctx")) {
            long n = strtol(v, &end, 10);
            if (!*v || *end || n < 16 || n > (1 << 24)) return em_errorf(EM_ERR_INVALID, "--ctx expects 16..16777216, got '%s'", v);
            a->ctx = (int)n;
        } else if (!strcmp(f, "--temp")) {
            double t = strtod(v, &end);
            if (!*v || *end || t < 0 || t > 100) return em_errorf(EM_ERR_INVALID, "--temp expects 0..100, got '%s'", v);
            a->temperature = (float)t;
        } else if (!strcmp(f, "--seed")) {
            a->seed = strtoull(v, &end, 10);
            if (!*v || *end) return em_errorf(EM_ERR_INVALID, "--seed expects an integer, got '%s'", v);
        } else
            return em_errorf(EM_ERR_INVALID, "unknown option '%s'", f);
    }
    if (!a->source.file && !a->source.hf)
        return em_errorf(EM_ERR_INVALID, "usage: ember chat (-m MODEL.gguf | --hf ORG/NAME[:QUANT] [--hf-token T]) "
                                         "[--system TEXT] [-n N] [--temp T] [--seed S] [--ctx N] [--device cpu|cuda] "
                                         "[--spec off|lookup|draft] [--draft-model FILE] [--draft-max N] [--draft-min N] [--spec-max-seqs N]");
    return em_cli_model_path(&a->source, &a->model);
}

static em_err add_message(json_t *messages, const char *role, const char *content, size_t len) {
    json_t *m = json_pack("{s:s, s:s%}", "role", role, "content", content, len);
    if (!m || json_array_append_new(messages, m))
        return em_errorf(EM_ERR_INVALID, "message text is not valid UTF-8 (or out of memory)");
    return NULL;
}

/* One turn: the conversation so far to tokens, a request, the reply streamed and returned. */
static em_err turn(ember_engine *engine, const json_t *messages, const chat_args *a, char **reply, size_t *reply_len) {
    int32_t *ids = NULL;
    size_t n = 0;
    char *conversation = json_dumps(messages, JSON_COMPACT);
    if (!conversation) return em_errorf(EM_ERR_NOMEM, "out of memory for the conversation");
    ember_chat chat = {.messages = conversation, .add_generation_prompt = true};
    em_err err = ember_chat_tokens(engine, &chat, &ids, &n);
    free(conversation);
    if (err) return err;
    ember_request_params p;
    ember_request_default(&p);
    p.prompt_ids = ids;
    p.n_prompt_ids = n;
    p.max_tokens = a->max_tokens;
    p.sampling.temperature = a->temperature;
    p.sampling.seed = a->seed;
    ember_request *r = NULL;
    err = ember_submit(engine, &p, &r);
    free(ids);
    if (err) return err;
    size_t cap = 256, len = 0;
    char *out = malloc(cap);
    ember_output o;
    do {
        ember_request_next(r, &o, -1);
        fwrite(o.text, 1, o.text_len, stdout);
        fflush(stdout);
        if (out && len + o.text_len + 1 > cap) {
            while (len + o.text_len + 1 > cap) cap *= 2;
            char *grown = realloc(out, cap);
            if (!grown) free(out);
            out = grown;
        }
        if (out) memcpy(out + len, o.text, o.text_len), len += o.text_len;
    } while (o.finish == EMBER_FINISH_NONE);
    printf("\n");
    if (o.finish == EMBER_FINISH_ERROR) err = em_errorf(EM_ERR_INTERNAL, "generation failed: %s", o.error);
    else if (!out) err = em_errorf(EM_ERR_NOMEM, "out of memory for the reply");
    ember_timings t;
    ember_request_timings(r, &t);
    ember_request_release(r);
    fprintf(stderr, "[prompt %u tokens, %u cached, prefill %.1f ms; %u tokens at %.1f tok/s", t.prompt_tokens,
            t.cached_tokens, t.prefill_ms, t.generated_tokens, t.decode_tokens_per_second);
    if (t.draft_tokens) fprintf(stderr, "; %u drafted, %u accepted", t.draft_tokens, t.draft_accepted);
    fprintf(stderr, "]\n");
    if (err) {
        free(out);
        return err;
    }
    out[len] = '\0';
    *reply = out;
    *reply_len = len;
    return NULL;
}

int em_cli_chat(int argc, char **argv) {
    chat_args a;
    em_err err = parse_args(argc, argv, &a);
    if (err) {
        em_cli_model_free(&a.source);
        return em_cli_fail("chat", err);
    }
    ember_engine *engine = NULL;
    json_t *messages = json_array();
    ember_options o;
    ember_options_default(&o);
    o.model_path = a.model;
    o.device = a.device;
    o.weights_memory = a.source.weights_memory;
    o.ctx_tokens = a.ctx;
    err = em_cli_spec_apply(&a.spec, &o);
    if (!err) err = ember_engine_create(&o, &engine);
    if (!err && a.system) err = add_message(messages, "system", a.system, strlen(a.system));
    char *line = NULL;
    size_t line_cap = 0;
    while (!err) {
        fprintf(stderr, "> ");
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got <= 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (got == 0) break;
        if ((err = add_message(messages, "user", line, (size_t)got))) break;
        char *reply = NULL;
        size_t reply_len = 0;
        if ((err = turn(engine, messages, &a, &reply, &reply_len))) break;
        err = add_message(messages, "assistant", reply, reply_len);
        free(reply);
    }
    free(line);
    json_decref(messages);
    ember_engine_destroy(engine);
    em_cli_model_free(&a.source);
    return err ? em_cli_fail("chat", err) : 0;
}
