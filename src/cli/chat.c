/*
 * `ember chat -m MODEL.gguf [--system TEXT] [sampling options]`: a conversation in the terminal
 * (docs/chat.md).
 *
 * Each turn is rendered whole with the model's chat template and tokenized by the engine
 * (ember_chat_tokens, as the server does: message text never becomes control tokens), then
 * submitted; the reply streams to stdout and joins the conversation. Every turn's prompt begins
 * with the previous turn's prompt and reply, so the prefix cache serves all of it: the per-turn
 * line on stderr shows how many prompt tokens came from the cache.
 *
 * The conversation outlives everything but Ctrl-D and /bye. Lines come from em_cli_line_reader
 * (chat_input.c: on a terminal an editor with history, where a bracketed paste stays one turn and
 * Ctrl-C clears the line); `"""` opens and closes a multi-line turn anywhere. Ctrl-C during a reply cancels the request (a SIGINT
 * handler counts, the streaming loop polls: em_cli_catch_interrupts); what was shown stays in the
 * conversation. When the conversation no longer fits the context, its oldest turns leave it (the
 * system message stays) with a note. `/` commands change the system message, the sampling
 * settings, and save or load the conversation as JSON. The sampling options and their defaults are
 * `run`'s (em_cli_generate, generate_options.c).
 */
#include <jansson.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "ember.h"

typedef struct chat_args {
    em_cli_model source; /* -m/--gguf or --hf: resolved into `model` */
    em_cli_spec spec;
    em_cli_generate generate;
    const char *model, *system;
} chat_args;

/* One conversation and the terminal it is held on. */
typedef struct chat_session {
    ember_engine *engine;
    em_cli_generate settings; /* the command line's, changed by /set; seed: the next reply's */
    json_t *messages;         /* [{role, content}], a system message first when there is one; owned */
    uint32_t ctx_tokens;
    em_cli_line_reader *input; /* owned */
    bool block;               /* the turn just read was a """ block (never a command) */
} chat_session;

static const char *const chat_options[] = {EM_CLI_MODEL_NAMES, EM_CLI_SPEC_NAMES, EM_CLI_GENERATE_NAMES, "--system",
                                           "--mmap", "--no-mmap", "--help", NULL};

static void usage(FILE *to) {
    fprintf(to,
            "usage: ember chat (-m MODEL.gguf | --hf ORG/NAME[:QUANT]) [--system TEXT] [-n N] [--temp T] [--top-k K]\n"
            "                  [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S] [-c CTX] [-t THREADS]\n"
            "                  [--device cpu|cuda] [--spec off|lookup|draft] [--draft-model FILE] ...\n"
            EM_CLI_MODEL_USAGE
            "  --system TEXT      a system message first (/system changes it)\n"
            EM_CLI_GENERATE_USAGE
            EM_CLI_SPEC_USAGE
            "In the chat: /help lists the commands; \"\"\" opens and closes a multi-line message; Ctrl-C stops\n"
            "a reply (or clears the line); Ctrl-D or /bye quits.\n");
}

static em_err parse_args(int argc, char **argv, chat_args *a) {
    *a = (chat_args){0};
    em_cli_generate_default(&a->generate);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (em_cli_model_flag(&a->source, f)) continue;
        bool known = false;
        for (size_t k = 0; chat_options[k] && !known; k++) known = !strcmp(chat_options[k], f);
        if (!known) {
            const char *near = em_cli_nearest_option(f, chat_options);
            if (near) return em_errorf(EM_ERR_INVALID, "unknown option '%s' (did you mean %s?)", f, near);
            return em_errorf(EM_ERR_INVALID, "unknown option '%s' (ember chat --help lists them)", f);
        }
        if (i + 1 >= argc) return em_errorf(EM_ERR_INVALID, "%s needs a value", f);
        const char *v = argv[++i];
        em_err err = NULL;
        if (em_cli_model_option(&a->source, f, v)) continue;
        if (em_cli_spec_option(&a->spec, f, v, &err) || em_cli_generate_option(&a->generate, f, v, &err)) {
            if (err) return err;
            continue;
        }
        if (!strcmp(f, "--system")) a->system = v;
    }
    if (!a->source.file && !a->source.hf)
        return em_errorf(EM_ERR_INVALID, "a model is required: -m MODEL.gguf or --hf ORG/NAME[:QUANT] (ember chat --help)");
    return em_cli_model_path(&a->source, &a->model);
}

/* ---- Reading turns ---- */

static bool ends_with_quotes(const char *text, size_t len) { return len >= 3 && !memcmp(text + len - 3, "\"\"\"", 3); }

/* The next turn the user typed (malloc'd), or NULL at the end of input. A line that starts with """
 * opens a block that the next line ending in """ closes; an empty line or a cleared one is no turn
 * (*turn set to an empty string). */
static em_err read_turn(chat_session *s, char **turn) {
    *turn = NULL;
    s->block = false;
    bool cleared = false;
    const char *line = em_cli_read_line(s->input, false, &cleared);
    if (!line) return NULL;
    if (cleared || strncmp(line, "\"\"\"", 3)) {
        *turn = strdup(line);
        return *turn ? NULL : em_errorf(EM_ERR_NOMEM, "out of memory for the message");
    }
    em_buf block = {0};
    const char *first = line + 3;
    size_t first_len = strlen(first);
    bool closed = ends_with_quotes(first, first_len);
    em_buf_append(&block, first, closed ? first_len - 3 : first_len);
    while (!closed) {
        if (!(line = em_cli_read_line(s->input, true, &cleared))) break;
        if (cleared) {
            em_buf_free(&block);
            *turn = strdup("");
            return *turn ? NULL : em_errorf(EM_ERR_NOMEM, "out of memory for the message");
        }
        size_t len = strlen(line);
        closed = ends_with_quotes(line, len);
        if (block.len) em_buf_putc(&block, '\n');
        em_buf_append(&block, line, closed ? len - 3 : len);
    }
    if (!em_buf_putc(&block, '\0')) {
        em_buf_free(&block);
        return em_errorf(EM_ERR_NOMEM, "out of memory for the message");
    }
    *turn = block.data;
    s->block = true;
    return NULL;
}

/* ---- The conversation ---- */

static bool add_message(json_t *messages, const char *role, const char *content) {
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    return m && !json_array_append_new(messages, m);
}

static bool has_system(const json_t *messages) {
    const char *role = json_string_value(json_object_get(json_array_get(messages, 0), "role"));
    return role && !strcmp(role, "system");
}

/* Removes the oldest turn (the first message after the system message, and the replies up to the
 * next user message); false when what is left is the last user message alone. */
static bool drop_oldest_turn(json_t *messages) {
    size_t first = has_system(messages), end = first + 1;
    while (end < json_array_size(messages)) {
        const char *role = json_string_value(json_object_get(json_array_get(messages, end), "role"));
        if (role && !strcmp(role, "user")) break;
        end++;
    }
    if (end >= json_array_size(messages)) return false;
    while (end-- > first) json_array_remove(messages, first);
    return true;
}

static em_err conversation_tokens(const chat_session *s, int32_t **ids, size_t *n) {
    char *conversation = json_dumps(s->messages, JSON_COMPACT);
    if (!conversation) return em_errorf(EM_ERR_NOMEM, "out of memory for the conversation");
    ember_chat chat = {.messages = conversation, .add_generation_prompt = true};
    em_err err = ember_chat_tokens(s->engine, &chat, ids, n);
    free(conversation);
    return err;
}

/* The prompt for the next reply: the conversation's tokens, after as many of its oldest turns left
 * it as the reply needs room (a quarter of the context, or -n if less). */
static em_err fit_prompt(chat_session *s, int32_t **ids, size_t *n) {
    size_t room = s->ctx_tokens / 4;
    if ((size_t)s->settings.max_tokens < room) room = (size_t)s->settings.max_tokens;
    int dropped = 0;
    for (;;) {
        em_err err = conversation_tokens(s, ids, n);
        if (err) return err;
        if (*n + room <= s->ctx_tokens || !drop_oldest_turn(s->messages)) break;
        free(*ids);
        *ids = NULL;
        dropped++;
    }
    if (dropped)
        fprintf(stderr, "[the context is full: the oldest %d turn%s left the conversation]\n", dropped, dropped > 1 ? "s" : "");
    if (*n >= s->ctx_tokens) {
        free(*ids);
        *ids = NULL;
        return em_errorf(EM_ERR_INVALID, "this message makes a prompt of %zu tokens; the context holds %u (-c)", *n, s->ctx_tokens);
    }
    return NULL;
}

/* One reply: streamed to stdout, stopped by Ctrl-C, and appended to the conversation (the part
 * shown, when stopped). */
static em_err reply(chat_session *s) {
    int32_t *ids = NULL;
    size_t n = 0;
    em_err err = fit_prompt(s, &ids, &n);
    if (err) return err;
    ember_request_params p;
    ember_request_default(&p);
    em_cli_generate_sampling(&s->settings, &p.sampling);
    p.prompt_ids = ids;
    p.n_prompt_ids = n;
    p.max_tokens = s->settings.max_tokens;
    ember_request *r = NULL;
    err = ember_submit(s->engine, &p, &r);
    free(ids);
    if (err) return err;
    /* The next reply draws with the next seed: the pick's noise depends on the seed, the token's
     * index in the reply and its id alone (pick.h), so replies drawn with one seed would share it. */
    s->settings.seed++;
    em_buf text = {0};
    ember_output o = {.finish = EMBER_FINISH_NONE};
    bool stopped = false;
    do {
        bool more = ember_request_next(r, &o, 100);
        if (!stopped && em_cli_interrupted()) stopped = true, ember_request_cancel(r);
        if (!more) continue;
        fwrite(o.text, 1, o.text_len, stdout);
        fflush(stdout);
        em_buf_append(&text, o.text, o.text_len);
    } while (o.finish == EMBER_FINISH_NONE);
    printf("\n");
    fflush(stdout);
    ember_timings t;
    ember_request_timings(r, &t);
    if (o.finish == EMBER_FINISH_ERROR) err = em_errorf(EM_ERR_INTERNAL, "generation failed: %s", o.error);
    ember_request_release(r);
    fprintf(stderr, "[prompt %u tokens, %u cached, prefill %.1f ms; %u tokens at %.1f tok/s", t.prompt_tokens,
            t.cached_tokens, t.prefill_ms, t.generated_tokens, t.decode_tokens_per_second);
    if (t.draft_tokens) fprintf(stderr, "; %u drafted, %u accepted", t.draft_tokens, t.draft_accepted);
    if (stopped) fprintf(stderr, "; stopped");
    else if (o.finish == EMBER_FINISH_LENGTH && t.prompt_tokens + t.generated_tokens >= s->ctx_tokens)
        fprintf(stderr, "; cut: the context is full");
    fprintf(stderr, "]\n");
    if (!err && text.failed) err = em_errorf(EM_ERR_NOMEM, "out of memory for the reply");
    if (!err && (text.len || !stopped) && !add_message(s->messages, "assistant", text.data ? text.data : ""))
        err = em_errorf(EM_ERR_INVALID, "the reply is not valid UTF-8 (or out of memory)");
    if (!err && !text.len && stopped) json_array_remove(s->messages, json_array_size(s->messages) - 1);
    em_buf_free(&text);
    return err;
}

/* ---- Commands ---- */

static const char help_text[] =
    "  /help                 this list\n"
    "  /system TEXT          the system message (replaced; /system alone shows it)\n"
    "  /set NAME VALUE       temperature, top_p, top_k, min_p, repeat_penalty, seed, max_tokens\n"
    "                        (/set alone shows them)\n"
    "  /clear                forget the conversation (the system message stays)\n"
    "  /save FILE, /load FILE  the conversation as JSON: {\"messages\": [{\"role\", \"content\"}, ...]}\n"
    "  /bye                  quit (so does Ctrl-D)\n"
    "  \"\"\"                   opens and closes a message of several lines\n"
    "  Ctrl-C                stops a reply, or clears the line\n";

static void show_settings(const em_cli_generate *g) {
    fprintf(stderr, "temperature %g, top_p %g, top_k %d, min_p %g, repeat_penalty %g, seed %llu, max_tokens %d\n",
            g->temperature, g->top_p, g->top_k, g->min_p, g->repeat_penalty, (unsigned long long)g->seed, g->max_tokens);
}

static void set_system(chat_session *s, const char *text) {
    if (has_system(s->messages)) json_array_remove(s->messages, 0);
    json_t *m = json_pack("{s:s, s:s}", "role", "system", "content", text);
    if (!m || json_array_insert_new(s->messages, 0, m)) fprintf(stderr, "the system message is not valid UTF-8\n");
}

static void set_option(chat_session *s, const char *args) {
    static const char *const names[][2] = {{"temperature", "--temp"}, {"top_p", "--top-p"}, {"top_k", "--top-k"},
                                           {"min_p", "--min-p"}, {"repeat_penalty", "--repeat-penalty"},
                                           {"seed", "--seed"}, {"max_tokens", "-n"}};
    char name[32];
    int used = 0;
    if (sscanf(args, "%31s %n", name, &used) != 1) {
        show_settings(&s->settings);
        return;
    }
    const char *value = args + used;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(name, names[i][0])) continue;
        em_cli_generate changed = s->settings;
        em_err err = NULL;
        em_cli_generate_option(&changed, names[i][1], value, &err);
        if (err) {
            fprintf(stderr, "/set %s: %s\n", name, em_err_message(err));
            em_err_free(err);
        } else {
            s->settings = changed;
            fprintf(stderr, "%s = %s\n", name, value);
        }
        return;
    }
    fprintf(stderr, "/set: unknown setting '%s' (temperature, top_p, top_k, min_p, repeat_penalty, seed, max_tokens)\n", name);
}

static void save(const chat_session *s, const char *path) {
    json_t *file = json_pack("{s:O}", "messages", s->messages);
    if (!file || json_dump_file(file, path, JSON_INDENT(2)))
        fprintf(stderr, "/save: %s: cannot write it\n", path);
    else
        fprintf(stderr, "[saved %zu messages to %s]\n", json_array_size(s->messages), path);
    json_decref(file);
}

/* Replaces the conversation with the one in `path`: {"messages": [...]} or the array alone, each
 * message {role: system|user|assistant, content: string}. */
static void load(chat_session *s, const char *path) {
    json_error_t error;
    json_t *file = json_load_file(path, 0, &error);
    if (!file) {
        fprintf(stderr, "/load: %s:%d: %s\n", path, error.line, error.text);
        return;
    }
    json_t *messages = json_is_array(file) ? file : json_object_get(file, "messages");
    const char *problem = json_is_array(messages) ? NULL : "expected {\"messages\": [...]}";
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (problem) break;
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")))
            problem = "a role is not system, user or assistant";
        else if (!json_is_string(json_object_get(m, "content")))
            problem = "a content is not a string";
    }
    if (problem) {
        fprintf(stderr, "/load: %s: message %zu: %s\n", path, i, problem);
    } else {
        json_t *copy = json_array();
        json_array_foreach(messages, i, m)
            add_message(copy, json_string_value(json_object_get(m, "role")), json_string_value(json_object_get(m, "content")));
        json_decref(s->messages);
        s->messages = copy;
        fprintf(stderr, "[loaded %zu messages from %s]\n", json_array_size(copy), path);
    }
    json_decref(file);
}

/* A line that starts with '/': false for /bye. */
static bool command(chat_session *s, const char *line) {
    char name[16];
    int used = 0;
    sscanf(line, "%15s %n", name, &used);
    const char *args = line + used;
    if (!strcmp(name, "/bye") || !strcmp(name, "/exit") || !strcmp(name, "/quit")) return false;
    if (!strcmp(name, "/help") || !strcmp(name, "/?")) fputs(help_text, stderr);
    else if (!strcmp(name, "/system") && *args) set_system(s, args);
    else if (!strcmp(name, "/system"))
        fprintf(stderr, "%s\n", has_system(s->messages)
                                    ? json_string_value(json_object_get(json_array_get(s->messages, 0), "content"))
                                    : "(no system message)");
    else if (!strcmp(name, "/set")) set_option(s, args);
    else if (!strcmp(name, "/clear")) {
        while (json_array_size(s->messages) > (size_t)has_system(s->messages))
            json_array_remove(s->messages, json_array_size(s->messages) - 1);
        fprintf(stderr, "[the conversation is cleared]\n");
    } else if ((!strcmp(name, "/save") || !strcmp(name, "/load")) && !*args)
        fprintf(stderr, "%s needs a file name\n", name);
    else if (!strcmp(name, "/save")) save(s, args);
    else if (!strcmp(name, "/load")) load(s, args);
    else fprintf(stderr, "unknown command '%s' (/help lists them)\n", name);
    return true;
}

/* ---- The session ---- */

static void banner(const chat_session *s, const char *model) {
    ember_engine_info info;
    ember_engine_get_info(s->engine, &info);
    const char *name = strrchr(model, '/');
    fprintf(stderr, "ember chat: %s, context %u tokens, %s. /help for commands, Ctrl-D or /bye to quit.\n",
            name ? name + 1 : model, info.ctx_tokens, info.device);
    if (isatty(STDIN_FILENO) && isatty(STDOUT_FILENO) && !em_cli_line_reader_editing(s->input))
        fprintf(stderr, "(no line editing or history: this ember was built without libedit; \"\"\" opens a message of several lines)\n");
}

static em_err converse(chat_session *s) {
    for (;;) {
        char *turn = NULL;
        em_err err = read_turn(s, &turn);
        if (err || !turn) return err;
        bool go_on = true;
        if (turn[0] == '/' && !s->block) go_on = command(s, turn);
        else if (turn[0]) {
            em_cli_line_reader_remember(s->input, turn);
            if (!add_message(s->messages, "user", turn)) {
                fprintf(stderr, "the message is not valid UTF-8\n");
            } else if ((err = reply(s))) {
                /* The turn failed, the conversation goes on without it. */
                json_array_remove(s->messages, json_array_size(s->messages) - 1);
                fprintf(stderr, "ember chat: %s\n", em_err_message(err));
                em_err_free(err);
            }
        }
        if (turn[0] == '/' && !s->block) em_cli_line_reader_remember(s->input, turn);
        free(turn);
        if (!go_on) return NULL;
    }
}

int em_cli_chat(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    chat_args a;
    em_err err = parse_args(argc, argv, &a);
    if (err) {
        em_cli_model_free(&a.source);
        return em_cli_fail("chat", err);
    }
    setlocale(LC_CTYPE, ""); /* the line editor reads and shows the terminal's characters */
    chat_session s = {.settings = a.generate, .messages = json_array()};
    ember_options o;
    ember_options_default(&o);
    o.model_path = a.model;
    o.weights_memory = a.source.weights_memory;
    o.max_sequences = 1;
    em_cli_generate_apply(&a.generate, &o);
    err = em_cli_spec_apply(&a.spec, &o);
    if (!err) err = ember_engine_create(&o, &s.engine);
    if (!err && a.system && !add_message(s.messages, "system", a.system))
        err = em_errorf(EM_ERR_INVALID, "--system is not valid UTF-8");
    if (!err) {
        ember_engine_info info;
        ember_engine_get_info(s.engine, &info);
        s.ctx_tokens = info.ctx_tokens;
        err = em_cli_line_reader_open(&s.input);
    }
    if (!err) {
        banner(&s, a.model);
        em_cli_catch_interrupts(false);
        err = converse(&s);
    }
    em_cli_line_reader_close(s.input);
    json_decref(s.messages);
    ember_engine_destroy(s.engine);
    em_cli_model_free(&a.source);
    return err ? em_cli_fail("chat", err) : 0;
}
