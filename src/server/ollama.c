/* Ollama's API on the server's own port, for the clients that speak only it: /api/chat and
 * /api/generate run on the same engine as the other APIs (the conversation through the model's
 * chat template; `raw` generate prompts as they are), and /api/tags, /api/show, /api/ps and
 * /api/version describe the one served model. Field names, defaults and shapes follow Ollama's
 * docs/api.md.
 *
 * What maps onto what:
 *   - `options` are the engine's sampling (num_predict, temperature, top_k, top_p, min_p, seed,
 *     stop, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty), with Ollama's
 *     defaults where a request sets nothing (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty
 *     1.1). num_ctx bounds the request's prompt and output when it is below the server's context
 *     (--ctx), and is the server's context when above: Ollama's clients send their own default
 *     (2048, 8192...) whatever the model. Options about loading and hardware (num_gpu, num_thread,
 *     ...) are accepted: the server's own settings apply.
 *   - `format` ("json" or a JSON schema) is constrained decoding (structured.c); `tools` are the
 *     chat API's tools (tools.c) and calls come back with their arguments as JSON objects (OpenAI's
 *     `tool_choice` is read too, beyond Ollama's fields: "required" or a named function forces a
 *     call, for clients that must have one); `think`
 *     splits a <think> section off into `thinking` (the default when the template reasons; false
 *     keeps it in the content), and reaches the template as enable_thinking (and an effort as
 *     reasoning_effort).
 *   - Streams (the default, as in Ollama) are NDJSON: one object per line, the last with
 *     `done: true`, `done_reason` and Ollama's counts and nanosecond durations.
 *   - Errors are `{"error": "..."}` with the HTTP status (400 for bad fields).
 *   - /api/embed and /api/embeddings are embed.c's, with OpenAI's /v1/embeddings.
 * A request with no messages (chat) or an empty prompt (generate) is Ollama's way to load a model:
 * it is answered at once with `done_reason` "load".
 *
 * Ember serves one model, chosen when it starts, so Ollama's model management (/api/pull, push,
 * create, copy, delete) is refused with a 400 that says what to do instead; a pull of the model
 * being served succeeds at once, as Ollama's does for a model it has. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "internal.h"

/* The version /api/version reports: that of the Ollama API whose fields this file follows (clients
 * compare it against the versions that introduced features). */
#define OLLAMA_API_VERSION "0.12.0"

static bool oom(em_server_error *err) {
    em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
    return false;
}

static bool bad(em_server_error *err, const char *param, const char *message) {
    em_server_error_set(err, 400, NULL, NULL, param, "%s: %s", param, message);
    return false;
}

typedef struct ollama_self {
    const em_server_engine *engine;
    bool chat;                  /* /api/chat, else /api/generate */
    char *model;                /* as the request named it: responses repeat it, as Ollama does */
    struct timespec started;    /* for total_duration */
    bool called;                /* the stream sent tool calls */
} ollama_self;

static void self_free(void *p) {
    ollama_self *self = p;
    if (!self) return;
    free(self->model);
    free(self);
}

/* "2024-05-01T12:34:56.123456Z": Ollama's created_at. */
static json_t *now_json(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    time_t t = tv.tv_sec;
    struct tm tm;
    char when[48] = "1970-01-01T00:00:00", text[64];
    if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(text, sizeof text, "%s.%06ldZ", when, (long)tv.tv_usec);
    return json_string(text);
}

static json_t *time_json(int64_t seconds) {
    time_t t = (time_t)seconds;
    struct tm tm;
    char text[48] = "1970-01-01T00:00:00Z";
    if (gmtime_r(&t, &tm)) strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_string(text);
}

/* ---- Requests ---- */

/* `options`: sampling fields onto the request, with Ollama's defaults for what is not set. */
static bool read_options(const json_t *root, em_server_request *req, em_server_error *err) {
    req->sampling.temperature = 0.8f;
    req->sampling.top_k = 40;
    req->sampling.top_p = 0.9f;
    req->sampling.repeat_penalty = 1.1f;
    json_t *options = json_object_get(root, "options");
    if (!options || json_is_null(options)) return true;
    if (!json_is_object(options)) return bad(err, "options", "must be an object");
    double temperature = req->sampling.temperature, top_p = req->sampling.top_p, min_p = 0,
           repeat_penalty = req->sampling.repeat_penalty, presence = 0, frequency = 0;
    int64_t num_predict = -1, top_k = req->sampling.top_k, seed = 0, repeat_last_n = 64, num_ctx = 0;
    bool ok = em_server_read_int(options, "num_predict", -2, INT_MAX, &num_predict, err) &&
              em_server_read_number(options, "temperature", 0, 100, &temperature, err) &&
              em_server_read_int(options, "top_k", 0, INT_MAX, &top_k, err) &&
              em_server_read_number(options, "top_p", 0, 1, &top_p, err) &&
              em_server_read_number(options, "min_p", 0, 1, &min_p, err) &&
              em_server_read_int(options, "seed", INT64_MIN, INT64_MAX, &seed, err) &&
              em_server_read_number(options, "repeat_penalty", 0, 100, &repeat_penalty, err) &&
              em_server_read_int(options, "repeat_last_n", -1, INT_MAX, &repeat_last_n, err) &&
              em_server_read_number(options, "presence_penalty", -100, 100, &presence, err) &&
              em_server_read_number(options, "frequency_penalty", -100, 100, &frequency, err) &&
              em_server_read_int(options, "num_ctx", 1, INT_MAX, &num_ctx, err) &&
              em_server_read_stops(options, "stop", true, req, err);
    if (!ok) {
        /* the readers name the option alone: say where it was */
        static const char prefix[] = "options: ";
        const size_t keep = strnlen(err->message, sizeof err->message - sizeof prefix);
        memmove(err->message + sizeof prefix - 1, err->message, keep);
        memcpy(err->message, prefix, sizeof prefix - 1);
        err->message[sizeof prefix - 1 + keep] = 0;
        return false;
    }
    req->max_tokens = num_predict > 0 ? (int)num_predict : 0; /* -1, -2: up to the context */
    req->sampling.temperature = (float)temperature;
    req->sampling.top_k = (int)top_k;
    req->sampling.top_p = (float)top_p;
    req->sampling.min_p = (float)min_p;
    req->sampling.repeat_penalty = (float)repeat_penalty;
    req->sampling.repeat_last_n = (int)repeat_last_n;
    req->sampling.presence_penalty = (float)presence;
    req->sampling.frequency_penalty = (float)frequency;
    req->sampling.seed = (uint64_t)seed;
    req->seed_given = json_is_number(json_object_get(options, "seed"));
    req->ctx_tokens = (int)num_ctx; /* generate.c bounds it by the server's own context */
    return true;
}

/* `format`: "json" (any JSON object), a JSON schema, or nothing ("" or absent). */
static bool read_format(const json_t *root, em_server_request *req, em_server_error *err) {
    json_t *format = json_object_get(root, "format");
    if (!format || json_is_null(format) || (json_is_string(format) && !json_string_length(format))) return true;
    if (json_is_string(format)) {
        if (strcmp(json_string_value(format), "json")) return bad(err, "format", "must be \"json\" or a JSON schema");
        return em_server_grammar_from_schema(req, NULL, "format", err);
    }
    if (!json_is_object(format)) return bad(err, "format", "must be \"json\" or a JSON schema");
    return em_server_grammar_from_schema(req, format, "format", err);
}

/* `think`: true (or an effort "high" / "medium" / "low") splits reasoning off, false keeps it in
 * the content; a model whose template does not reason cannot think (Ollama's 400). */
static bool read_think(const json_t *root, const em_server_engine *engine, em_server_request *req, em_server_error *err) {
    json_t *think = json_object_get(root, "think");
    if (!think || json_is_null(think)) return true;
    if (!json_is_boolean(think) && !json_is_string(think)) return bad(err, "think", "must be a boolean or \"high\", \"medium\", \"low\"");
    /* templates that switch thinking (Qwen 3's enable_thinking) or grade it (reasoning_effort) are told */
    if (!(req->template_kwargs = json_pack("{s:b}", "enable_thinking", !json_is_false(think)))) return oom(err);
    if (json_is_string(think)) json_object_set(req->template_kwargs, "reasoning_effort", think);
    if (json_is_false(think)) {
        req->reasoning_format = EM_REASONING_FORMAT_NONE;
        return true;
    }
    if (!engine->reasons) {
        em_server_error_set(err, 400, NULL, NULL, "think", "\"%s\" does not support thinking", engine->model_id);
        return false;
    }
    req->reasoning_format = EM_REASONING_FORMAT_DEEPSEEK;
    return true;
}

/* Fields every generation request has: model, stream (default true), options, format, think,
 * keep_alive (accepted: the one model stays loaded). */
static bool read_common(const json_t *root, ollama_self *self, em_server_request *req, em_server_error *err) {
    const char *model = NULL;
    if (!em_server_read_string(root, "model", &model, err)) return false;
    if (!model || !*model) return bad(err, "model", "is required");
    if (!(self->model = strdup(model)) || !(req->model = strdup(model))) return oom(err);
    req->stream = true;
    json_t *keep_alive = json_object_get(root, "keep_alive");
    if (keep_alive && !json_is_null(keep_alive) && !json_is_string(keep_alive) && !json_is_number(keep_alive))
        return bad(err, "keep_alive", "must be a duration (\"5m\") or a number of seconds");
    return em_server_read_bool(root, "stream", &req->stream, err) && read_options(root, req, err) &&
           read_format(root, req, err) && read_think(root, self->engine, req, err);
}

/* A message's tool_calls ([{function: {name, arguments: object}}]) in the chat shape. */
static bool read_tool_calls(const json_t *calls, const char *param, json_t *message, em_server_error *err) {
    if (!json_is_array(calls)) return bad(err, param, "must be an array");
    json_t *list = json_array();
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *function = json_object_get(call, "function");
        json_t *name = json_object_get(function, "name"), *arguments = json_object_get(function, "arguments");
        if (!json_is_string(name) || (arguments && !json_is_object(arguments))) {
            json_decref(list);
            return bad(err, param, "each call needs function.name and function.arguments as an object");
        }
        json_t *id = json_object_get(call, "id");
        json_array_append_new(list, json_pack("{s:O, s:s, s:{s:O, s:o}}", "id", json_is_string(id) ? id : json_null(), "type",
                                              "function", "function", "name", name, "arguments",
                                              arguments ? json_incref(arguments) : json_object()));
    }
    json_object_set_new(message, "tool_calls", list);
    return true;
}

static bool no_images(const json_t *obj, const char *param, em_server_error *err) {
    json_t *images = json_object_get(obj, "images");
    if (images && !json_is_null(images) && !(json_is_array(images) && json_array_size(images) == 0)) {
        em_server_error_set(err, 400, NULL, NULL, param, "%s: images are not supported: the model reads text only", param);
        return false;
    }
    return true;
}

static bool read_messages(const json_t *root, em_server_request *req, em_server_error *err) {
    json_t *messages = json_object_get(root, "messages");
    if (messages && !json_is_null(messages) && !json_is_array(messages)) return bad(err, "messages", "must be an array");
    if (!(req->messages = json_array())) return oom(err);
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        char param[48];
        snprintf(param, sizeof param, "messages[%zu]", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        if (!role) return bad(err, param, "needs a string 'role'");
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool"))
            return bad(err, param, "role must be system, user, assistant or tool");
        if (content && !json_is_null(content) && !json_is_string(content)) return bad(err, param, "content must be a string");
        if (!no_images(m, param, err)) return false;
        json_t *message = json_pack("{s:s, s:s}", "role", role, "content", json_is_string(content) ? json_string_value(content) : "");
        if (!message || json_array_append_new(req->messages, message)) return oom(err);
        json_t *calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_null(calls) && !read_tool_calls(calls, param, message, err)) return false;
        /* a tool message names its tool; the chat shape's tool_call_id is what templates look for */
        json_t *tool_name = json_object_get(m, "tool_name");
        if (!strcmp(role, "tool") && json_is_string(tool_name)) json_object_set(message, "name", tool_name);
        json_t *call_id = json_object_get(m, "tool_call_id");
        if (json_is_string(call_id)) json_object_set(message, "tool_call_id", call_id);
    }
    return true;
}

/* Fields of /api/generate that have no meaning here: refused by name rather than ignored. */
static bool refuse_unsupported(const json_t *root, em_server_error *err) {
    json_t *suffix = json_object_get(root, "suffix"), *template = json_object_get(root, "template"),
           *context = json_object_get(root, "context");
    if (json_is_string(suffix) && json_string_length(suffix)) return bad(err, "suffix", "is not supported (fill-in-the-middle)");
    if (json_is_string(template) && json_string_length(template))
        return bad(err, "template", "is not supported: the model's own chat template applies (or send raw: true)");
    if (context && !json_is_null(context) && !(json_is_array(context) && !json_array_size(context)))
        return bad(err, "context", "is not supported: send the conversation to /api/chat");
    return no_images(root, "images", err);
}

static bool parse_generate(const json_t *root, ollama_self *self, em_server_request *req, em_server_error *err) {
    const char *prompt = "", *system = NULL;
    bool raw = false;
    if (!read_common(root, self, req, err) || !em_server_read_string(root, "prompt", &prompt, err) ||
        !em_server_read_string(root, "system", &system, err) || !em_server_read_bool(root, "raw", &raw, err) ||
        !refuse_unsupported(root, err))
        return false;
    if (!*prompt) return true; /* a load request */
    if (raw) {
        if (!(req->prompts = calloc(1, sizeof *req->prompts)) || !(req->prompts[0].text = strdup(prompt))) return oom(err);
        req->prompts[0].text_len = strlen(prompt);
        req->n_prompts = 1;
        return true;
    }
    if (!(req->messages = json_array())) return oom(err);
    json_t *m = system ? json_pack("{s:s, s:s}", "role", "system", "content", system) : NULL;
    if (system && (!m || json_array_append_new(req->messages, m))) return oom(err);
    m = json_pack("{s:s, s:s}", "role", "user", "content", prompt);
    return (m && !json_array_append_new(req->messages, m)) || oom(err);
}

static bool parse_chat(const json_t *root, ollama_self *self, em_server_request *req, em_server_error *err) {
    return read_common(root, self, req, err) && read_messages(root, req, err) &&
           em_server_read_openai_tools(root, req, err);
}

static bool parse(ollama_self *self, const char *body, size_t len, em_server_request *req, em_server_error *err) {
    em_server_request_init(req, EM_API_OLLAMA);
    json_t *root = em_server_parse_body(body, len, err);
    bool ok = root && (self->chat ? parse_chat(root, self, req, err) : parse_generate(root, self, req, err));
    json_decref(root);
    return ok;
}

bool em_ollama_parse(bool chat, const char *body, size_t len, const em_server_engine *engine, em_server_request *req,
                     em_server_error *err) {
    ollama_self self = {.engine = engine, .chat = chat};
    bool ok = parse(&self, body, len, req, err);
    free(self.model);
    return ok;
}

/* ---- Answers ---- */

static double ns(double ms) {
    return ms > 0 ? ms * 1e6 : 0;
}

/* The last object's counts and durations (nanoseconds). */
static void add_stats(json_t *obj, const ollama_self *self, const em_server_choice *c, const em_server_usage *usage) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double total = 1e9 * (double)(now.tv_sec - self->started.tv_sec) + (double)(now.tv_nsec - self->started.tv_nsec);
    const char *reason = c->finish == EMBER_FINISH_LENGTH ? "length" : "stop";
    json_object_set_new(obj, "done_reason", json_string(reason));
    json_object_set_new(obj, "total_duration", json_integer((json_int_t)total));
    json_object_set_new(obj, "load_duration", json_integer(0));
    json_object_set_new(obj, "prompt_eval_count", json_integer((json_int_t)usage->prompt_tokens));
    json_object_set_new(obj, "prompt_eval_duration", json_integer((json_int_t)ns(c->timings.prefill_ms)));
    json_object_set_new(obj, "eval_count", json_integer((json_int_t)usage->completion_tokens));
    json_object_set_new(obj, "eval_duration", json_integer((json_int_t)ns(c->timings.decode_ms)));
}

/* {model, created_at, message | response, done}: one object of an answer. `text` goes to the
 * message's content (chat) or `response` (generate), `thinking` beside it. */
static json_t *answer_object(const ollama_self *self, const char *text, size_t len, const char *thinking, size_t thinking_len,
                             bool done) {
    json_t *obj = json_pack("{s:s, s:o}", "model", self->model, "created_at", now_json());
    if (!obj) return NULL;
    if (self->chat) {
        json_t *message = json_pack("{s:s, s:o}", "role", "assistant", "content", em_server_json_text(text, len));
        if (message && thinking) json_object_set_new(message, "thinking", em_server_json_text(thinking, thinking_len));
        json_object_set_new(obj, "message", message);
    } else {
        json_object_set_new(obj, "response", em_server_json_text(text, len));
        if (thinking) json_object_set_new(obj, "thinking", em_server_json_text(thinking, thinking_len));
    }
    json_object_set_new(obj, "done", json_boolean(done));
    return obj;
}

/* A choice's calls as Ollama writes them: arguments as objects ({} when they are not one). */
static json_t *tool_calls_json(const json_t *calls) {
    json_t *list = json_array();
    size_t k;
    json_t *call;
    json_array_foreach(calls, k, call) {
        json_t *arguments = json_loads(json_string_value(json_object_get(call, "arguments")), 0, NULL);
        if (!json_is_object(arguments)) {
            json_decref(arguments);
            arguments = json_object();
        }
        json_array_append_new(list, json_pack("{s:{s:I, s:O, s:o}}", "function", "index", (json_int_t)k, "name",
                                              json_object_get(call, "name"), "arguments", arguments));
    }
    return list;
}

static json_t *whole_response(void *p, const em_server_format *f, const em_server_choice *c, const em_server_usage *usage) {
    (void)f;
    ollama_self *self = p;
    json_t *obj = answer_object(self, c->content.data, c->content.len, c->reasoning.len ? c->reasoning.data : NULL,
                                c->reasoning.len, true);
    if (!obj) return NULL;
    if (self->chat && c->tool_calls) json_object_set_new(json_object_get(obj, "message"), "tool_calls", tool_calls_json(c->tool_calls));
    add_stats(obj, self, c, usage);
    return obj;
}

/* One NDJSON line (takes `obj`). */
static bool line(em_buf *out, json_t *obj) {
    if (!obj) return false;
    char *text = em_server_dump(obj);
    json_decref(obj);
    bool ok = text && em_buf_printf(out, "%s\n", text);
    free(text);
    return ok;
}

static bool stream_start(void *p, em_buf *out, const em_server_format *f, const em_server_usage *usage) {
    (void)p, (void)out, (void)f, (void)usage;
    return true;
}

/* Text and thinking go out as they come; calls go out whole at the end (Ollama sends a call once
 * it is complete). */
static bool stream_answer(void *p, em_buf *out, const em_server_format *f, const em_answer_event *ev) {
    (void)f;
    ollama_self *self = p;
    if (ev->kind == EM_ANSWER_CONTENT) return line(out, answer_object(self, ev->text, ev->len, NULL, 0, false));
    if (ev->kind == EM_ANSWER_REASONING) return line(out, answer_object(self, "", 0, ev->text, ev->len, false));
    return true;
}

static bool stream_end(void *p, em_buf *out, const em_server_format *f, const em_server_choice *c, const em_server_usage *usage) {
    (void)f;
    ollama_self *self = p;
    if (self->chat && c->tool_calls) {
        json_t *obj = answer_object(self, "", 0, NULL, 0, false);
        if (obj) json_object_set_new(json_object_get(obj, "message"), "tool_calls", tool_calls_json(c->tool_calls));
        if (!line(out, obj)) return false;
    }
    json_t *last = answer_object(self, "", 0, NULL, 0, true);
    if (last) add_stats(last, self, c, usage);
    return line(out, last);
}

static bool stream_error(void *p, em_buf *out, const em_server_format *f, const em_server_error *err) {
    (void)p, (void)f;
    return line(out, json_pack("{s:o}", "error", em_server_json_text(err->message, strlen(err->message))));
}

static const em_server_writer ollama_writer = {
    .id_prefix = "ollama-",
    .stream_type = "application/x-ndjson",
    .stream_start = stream_start,
    .stream_answer = stream_answer,
    .stream_end = stream_end,
    .stream_error = stream_error,
    .response = whole_response,
    .free = self_free,
};

/* ---- The model ---- */

/* "21M", "7.2B": Ollama's parameter_size. */
static json_t *parameter_size(uint64_t n) {
    char text[32];
    if (n >= 1000000000ull) snprintf(text, sizeof text, "%.1fB", (double)n / 1e9);
    else if (n >= 1000000ull) snprintf(text, sizeof text, "%.0fM", (double)n / 1e6);
    else snprintf(text, sizeof text, "%.0fK", (double)n / 1e3);
    return json_string(text);
}

static const char *or_empty(const char *s) {
    return s ? s : "";
}

static json_t *details_json(const em_server_model_facts *facts) {
    const char *arch = or_empty(facts->architecture);
    return json_pack("{s:s, s:s, s:s, s:[s], s:o, s:s}", "parent_model", "", "format", "gguf", "family", arch, "families",
                     arch, "parameter_size", parameter_size(facts->parameters), "quantization_level",
                     or_empty(facts->quantization));
}

/* The served model as /api/tags and /api/ps list it. */
static json_t *model_entry(const em_server *s) {
    const em_server_model_facts *facts = &s->engine.facts;
    return json_pack("{s:s, s:s, s:o, s:I, s:s, s:o}", "name", s->engine.model_id, "model", s->engine.model_id,
                     "modified_at", time_json(facts->modified), "size", (json_int_t)facts->file_bytes, "digest",
                     or_empty(facts->digest), "details", details_json(facts));
}

/* What the model can do, as Ollama names it: completion always; tools when its chat template takes
 * them; thinking when it reasons; embedding when a pooling is known (the file's, or --pooling) and
 * the backend returns hidden states. */
static json_t *capabilities_json(const em_server *s) {
    json_t *list = json_pack("[s]", "completion");
    const int pooling = s->engine.pooling;
    if (list && !s->engine.embed_refused &&
        (pooling == EMBER_POOLING_MEAN || pooling == EMBER_POOLING_CLS || pooling == EMBER_POOLING_LAST))
        json_array_append_new(list, json_string("embedding"));
    const char *template = s->engine.facts.chat_template;
    if (list && template && strstr(template, "tools")) json_array_append_new(list, json_string("tools"));
    if (list && s->engine.reasons) json_array_append_new(list, json_string("thinking"));
    return list;
}

/* Whether `name` names the served model ("id" or Ollama's "id:latest"). */
static bool names_model(const em_server *s, const char *name) {
    const char *id = s->engine.model_id;
    size_t n = strlen(id);
    return !strcmp(name, id) || (!strncmp(name, id, n) && !strcmp(name + n, ":latest"));
}

/* The file's general.* and <arch>.* metadata; a model without them (or a test's engine) gets the
 * architecture, parameter count and the server's context. */
static json_t *model_info(const em_server *s) {
    const em_server_model_facts *facts = &s->engine.facts;
    if (facts->metadata) return json_deep_copy(facts->metadata);
    char key[96];
    json_t *info = json_pack("{s:s, s:I}", "general.architecture", or_empty(facts->architecture), "general.parameter_count",
                             (json_int_t)facts->parameters);
    snprintf(key, sizeof key, "%s.context_length", facts->architecture ? facts->architecture : "model");
    if (info) json_object_set_new(info, key, json_integer(s->engine.ctx_tokens));
    return info;
}

static struct MHD_Response *error_response(const em_server_error *err, int *status) {
    *status = err->status;
    return em_server_error_response(EM_API_OLLAMA, err);
}

/* The model a request names in `key` (`model`; copy's `source`), or the older `name`. NULL with
 * `err` set when it names none. */
static const char *named_model(const json_t *root, const char *key, em_server_error *err) {
    const char *name = NULL;
    if (!em_server_read_string(root, key, &name, err) || (!name && !em_server_read_string(root, "name", &name, err)))
        return NULL;
    if (!name || !*name) bad(err, key, "is required");
    return err->status ? NULL : name;
}

static struct MHD_Response *show(em_server *s, const char *body, size_t len, int *status) {
    em_server_error err = {0};
    json_t *root = em_server_parse_body(body, len, &err);
    if (!root) return error_response(&err, status);
    const char *name = named_model(root, "model", &err);
    if (name && !names_model(s, name)) {
        em_server_error_set(&err, 404, NULL, NULL, "model", "model '%s' not found", name);
    }
    json_decref(root);
    if (err.status) return error_response(&err, status);
    const em_server_model_facts *facts = &s->engine.facts;
    json_t *info = model_info(s);
    json_t *answer = json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "license", "", "modelfile", "", "parameters", "",
                               "template", or_empty(facts->chat_template), "details", details_json(facts), "model_info",
                               info, "capabilities", capabilities_json(s), "modified_at", time_json(facts->modified));
    *status = 200;
    return em_server_json_response(answer);
}

static struct MHD_Response *describe(em_server *s, em_server_endpoint endpoint, int *status) {
    json_t *answer = NULL;
    if (endpoint == EM_EP_OLLAMA_VERSION) {
        answer = json_pack("{s:s}", "version", OLLAMA_API_VERSION);
    } else if (endpoint == EM_EP_OLLAMA_TAGS) {
        answer = json_pack("{s:[o]}", "models", model_entry(s));
    } else {
        json_t *entry = model_entry(s);
        /* loaded for as long as the server runs: expires_at is far away, as Ollama writes keep_alive -1 */
        if (entry) {
            json_object_set_new(entry, "expires_at", json_string("2318-08-22T00:00:00Z"));
            json_object_set_new(entry, "size_vram", json_integer(0));
            json_object_set_new(entry, "context_length", json_integer(s->engine.ctx_tokens));
        }
        answer = json_pack("{s:[o]}", "models", entry);
    }
    *status = 200;
    return em_server_json_response(answer);
}

/* ---- Model management: one model, chosen at start ---- */

/* /api/pull of the served model: Ollama's answer for a model it has (a stream of one status line
 * unless stream is false). */
static struct MHD_Response *pulled(const json_t *root, int *status) {
    json_t *stream = json_object_get(root, "stream");
    json_t *answer = json_pack("{s:s}", "status", "success");
    *status = 200;
    if (json_is_false(stream)) return em_server_json_response(answer);
    char *text = answer ? em_server_dump(answer) : NULL;
    json_decref(answer);
    em_buf line = {0};
    bool ok = text && em_buf_printf(&line, "%s\n", text);
    free(text);
    struct MHD_Response *r = ok ? MHD_create_response_from_buffer(line.len, line.data, MHD_RESPMEM_MUST_COPY) : NULL;
    em_buf_free(&line);
    if (r) MHD_add_response_header(r, "Content-Type", "application/x-ndjson");
    return r;
}

static struct MHD_Response *manage(em_server *s, const char *url, const char *body, size_t len, int *status) {
    em_server_error err = {0};
    json_t *root = em_server_parse_body(body, len, &err);
    if (!root) return error_response(&err, status);
    const char *what = url + strlen("/api/");
    json_t *stream = json_object_get(root, "stream");
    const char *name = NULL;
    if (stream && !json_is_null(stream) && !json_is_boolean(stream)) {
        bad(&err, "stream", "must be a boolean");
    } else if (!strcmp(what, "pull")) {
        if ((name = named_model(root, "model", &err)) && !names_model(s, name))
            em_server_error_set(&err, 400, NULL, NULL, "model",
                                "pull: this server serves one model, \"%s\", chosen when it starts; it cannot fetch "
                                "\"%.200s\" (fetch models with `ember pull`, serve one with `ember serve -m`)",
                                s->engine.model_id, name);
    } else if (!strcmp(what, "delete")) {
        name = named_model(root, "model", &err);
        if (name && !names_model(s, name)) em_server_error_set(&err, 404, NULL, NULL, "model", "model '%.200s' not found", name);
        else if (name)
            em_server_error_set(&err, 400, NULL, NULL, "model", "delete: \"%s\" is being served and cannot be deleted",
                                s->engine.model_id);
    } else if (!strcmp(what, "copy")) {
        em_server_error_set(&err, 400, NULL, NULL, NULL,
                            "copy: this server serves one model under one name; serve it under another with "
                            "`ember serve --alias NAME`");
    } else if (!strcmp(what, "create")) {
        em_server_error_set(&err, 400, NULL, NULL, NULL,
                            "create: this server cannot create models; make a GGUF file with `ember convert` or "
                            "`ember quantize` and serve it with `ember serve -m`");
    } else {
        em_server_error_set(&err, 400, NULL, NULL, NULL, "push: this server does not push models to a registry");
    }
    struct MHD_Response *r = err.status ? error_response(&err, status) : pulled(root, status);
    json_decref(root);
    return r;
}

/* ---- Entry ---- */

/* Ollama's answer to a load request (no messages, or an empty prompt). */
static struct MHD_Response *loaded(const ollama_self *self, int *status) {
    json_t *obj = answer_object(self, "", 0, NULL, 0, true);
    if (obj) json_object_set_new(obj, "done_reason", json_string("load"));
    *status = 200;
    return em_server_json_response(obj);
}

struct MHD_Response *em_ollama_serve(em_server *server, const char *url, em_server_endpoint endpoint, const char *body,
                                     size_t len, int fd, int *status) {
    em_server_error err = {0};
    if (endpoint == EM_EP_OLLAMA_MANAGE) return manage(server, url, body, len, status);
    if (endpoint == EM_EP_OLLAMA_TAGS || endpoint == EM_EP_OLLAMA_PS || endpoint == EM_EP_OLLAMA_VERSION)
        return describe(server, endpoint, status);
    if (endpoint == EM_EP_OLLAMA_SHOW) return show(server, body, len, status);
    ollama_self *self = calloc(1, sizeof *self);
    if (!self) {
        oom(&err);
        return error_response(&err, status);
    }
    self->engine = &server->engine;
    self->chat = endpoint == EM_EP_OLLAMA_CHAT;
    clock_gettime(CLOCK_MONOTONIC, &self->started);
    em_server_request req;
    bool ok = parse(self, body, len, &req, &err);
    if (!ok || (!json_array_size(req.messages) && !req.n_prompts)) {
        struct MHD_Response *r = ok ? loaded(self, status) : error_response(&err, status);
        em_server_request_clear(&req);
        self_free(self);
        return r;
    }
    return em_server_generate_with(server, &req, &ollama_writer, self, fd, status);
}
