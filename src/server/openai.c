/* OpenAI's API: parsing /v1/chat/completions and /v1/completions bodies, and formatting their
 * responses, stream chunks and the model list. Field names, defaults and error shapes follow
 * OpenAI's API reference; extensions Ember accepts beyond it are top_k and min_p. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static bool oom(em_server_error *err) {
    em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
    return false;
}

/* logit_bias: {"token id": bias in [-100, 100]}. */
static bool read_logit_bias(const json_t *root, int32_t n_vocab, em_server_request *req, em_server_error *err) {
    json_t *v = json_object_get(root, "logit_bias");
    if (!v || json_is_null(v)) return true;
    if (!json_is_object(v)) {
        em_server_error_set(err, 400, NULL, "invalid_type", "logit_bias", "'logit_bias' must be an object");
        return false;
    }
    size_t n = json_object_size(v);
    if (n == 0) return true;
    if (n > 1024) {
        em_server_error_set(err, 400, NULL, "invalid_value", "logit_bias", "'logit_bias' has more than 1024 entries");
        return false;
    }
    if (!(req->logit_bias = calloc(n, sizeof *req->logit_bias))) return oom(err);
    const char *key;
    json_t *bias;
    json_object_foreach(v, key, bias) {
        char *end;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (!*key || *end || errno || id < 0 || id >= n_vocab) {
            em_server_error_set(err, 400, NULL, "invalid_value", "logit_bias",
                                "'logit_bias' key '%s' is not a token id below %d", key, (int)n_vocab);
            return false;
        }
        if (!json_is_number(bias) || json_number_value(bias) < -100 || json_number_value(bias) > 100) {
            em_server_error_set(err, 400, NULL, "invalid_value", "logit_bias",
                                "'logit_bias' value for token %ld must be a number in [-100, 100]", id);
            return false;
        }
        req->logit_bias[req->sampling.n_logit_bias++] =
            (ember_logit_bias){.token = (int32_t)id, .bias = (float)json_number_value(bias)};
    }
    req->sampling.logit_bias = req->logit_bias;
    return true;
}

/* The fields both OpenAI endpoints share. */
static bool read_common(const json_t *root, int32_t n_vocab, em_server_request *req, em_server_error *err) {
    const char *model = NULL;
    if (!em_server_read_string(root, "model", &model, err)) return false;
    if (!model) {
        em_server_error_set(err, 400, NULL, "missing_required_parameter", "model", "'model' is required");
        return false;
    }
    if (!(req->model = strdup(model))) return oom(err);

    double temperature = req->sampling.temperature, top_p = req->sampling.top_p, min_p = req->sampling.min_p;
    double presence = 0, frequency = 0;
    int64_t n = 1, top_k = 0, max_tokens = 0, seed = 0;
    bool seed_given = json_is_number(json_object_get(root, "seed"));
    if (!em_server_read_number(root, "temperature", 0, 2, &temperature, err) ||
        !em_server_read_number(root, "top_p", 0, 1, &top_p, err) ||
        !em_server_read_number(root, "min_p", 0, 1, &min_p, err) ||
        !em_server_read_int(root, "top_k", 0, INT_MAX, &top_k, err) ||
        !em_server_read_number(root, "presence_penalty", -2, 2, &presence, err) ||
        !em_server_read_number(root, "frequency_penalty", -2, 2, &frequency, err) ||
        !em_server_read_int(root, "n", 1, EM_SERVER_MAX_N, &n, err) ||
        !em_server_read_int(root, "seed", INT64_MIN, INT64_MAX, &seed, err) ||
        !em_server_read_int(root, "max_tokens", INT64_MIN, INT64_MAX, &max_tokens, err) ||
        !em_server_read_int(root, "max_completion_tokens", INT64_MIN, INT64_MAX, &max_tokens, err))
        return false;
    bool max_given = !json_is_null(json_object_get(root, "max_tokens")) && json_object_get(root, "max_tokens");
    bool max_completion_given = json_object_get(root, "max_completion_tokens") &&
                                !json_is_null(json_object_get(root, "max_completion_tokens"));
    if ((max_given || max_completion_given) && max_tokens <= 0) {
        const char *key = max_completion_given ? "max_completion_tokens" : "max_tokens";
        em_server_error_set(err, 400, NULL, "invalid_value", key, "'%s' must be at least 1, got %lld", key,
                            (long long)max_tokens);
        return false;
    }
    req->max_tokens = max_tokens > INT_MAX ? INT_MAX : (int)max_tokens;
    req->sampling.temperature = (float)temperature;
    req->sampling.top_p = (float)top_p;
    req->sampling.min_p = (float)min_p;
    req->sampling.top_k = (int)top_k;
    req->sampling.presence_penalty = (float)presence;
    req->sampling.frequency_penalty = (float)frequency;
    req->sampling.seed = (uint64_t)seed;
    req->seed_given = seed_given;
    req->n = (int)n;

    const char *user = NULL; /* accepted and not used: Ember keeps no per-user state */
    if (!em_server_read_string(root, "user", &user, err)) return false;
    if (!em_server_read_stops(root, "stop", true, req, err)) return false;
    if (!em_server_read_bool(root, "stream", &req->stream, err)) return false;
    if (!em_server_read_bool(root, "ignore_eos", &req->ignore_eos, err)) return false;
    if (!em_server_read_speculative(root, req, err)) return false;
    json_t *options = json_object_get(root, "stream_options");
    if (options && !json_is_null(options)) {
        if (!json_is_object(options)) {
            em_server_error_set(err, 400, NULL, "invalid_type", "stream_options", "'stream_options' must be an object");
            return false;
        }
        if (!em_server_read_bool(options, "include_usage", &req->include_usage, err)) return false;
    }
    return read_logit_bias(root, n_vocab, req, err) && em_server_read_constraints(root, req, err);
}

/* An assistant message's tool_calls ([{id, type: "function", function: {name, arguments: JSON
 * text}}]) for the template: arguments as objects, as chat templates expect them. */
static bool read_tool_calls(const json_t *calls, const char *param, json_t *message, em_server_error *err) {
    if (!json_is_array(calls)) {
        em_server_error_set(err, 400, NULL, "invalid_type", param, "'%s' must be an array", param);
        return false;
    }
    json_t *list = json_array();
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *function = json_object_get(call, "function");
        const char *name = json_string_value(json_object_get(function, "name"));
        const char *arguments = json_string_value(json_object_get(function, "arguments"));
        if (!name || !arguments) {
            json_decref(list);
            em_server_error_set(err, 400, NULL, "invalid_value", param,
                                "'%s[%zu]' must have function.name and function.arguments (a JSON string)", param, i);
            return false;
        }
        json_t *id = json_object_get(call, "id");
        json_array_append_new(list, json_pack("{s:O, s:s, s:{s:s, s:o}}", "id", id ? id : json_null(), "type", "function",
                                               "function", "name", name, "arguments", em_server_arguments_object(arguments)));
    }
    json_object_set_new(message, "tool_calls", list);
    return true;
}

static bool read_messages(const json_t *root, em_server_request *req, em_server_error *err) {
    json_t *messages = json_object_get(root, "messages");
    if (!messages) {
        em_server_error_set(err, 400, NULL, "missing_required_parameter", "messages", "'messages' is required");
        return false;
    }
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        em_server_error_set(err, 400, NULL, "invalid_type", "messages", "'messages' must be a non-empty array");
        return false;
    }
    if (!(req->messages = json_array())) return oom(err);
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        char param[48];
        snprintf(param, sizeof param, "messages[%zu]", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role) {
            em_server_error_set(err, 400, NULL, "invalid_type", param, "'%s' must be an object with a string 'role'", param);
            return false;
        }
        if (!strcmp(role, "developer")) role = "system"; /* OpenAI's newer name for system */
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool")) {
            em_server_error_set(err, 400, NULL, "invalid_value", param,
                                "'%s.role' '%s' is not supported (system, developer, user, assistant, tool)", param, role);
            return false;
        }
        json_t *content = json_object_get(m, "content");
        json_t *tool_calls = json_object_get(m, "tool_calls");
        if (json_is_null(tool_calls)) tool_calls = NULL;
        if (tool_calls && strcmp(role, "assistant")) {
            em_server_error_set(err, 400, NULL, "invalid_value", param, "'%s.tool_calls' belongs to assistant messages", param);
            return false;
        }
        em_buf text = {0};
        snprintf(param, sizeof param, "messages[%zu].content", i);
        bool ok = true;
        if (!content || json_is_null(content)) {
            if (strcmp(role, "assistant")) {
                em_server_error_set(err, 400, NULL, "missing_required_parameter", param, "'%s' is required", param);
                ok = false;
            }
        } else {
            ok = em_server_read_content(content, param, &text, err);
        }
        ok = ok && em_server_add_message(req, role, &text, err);
        em_buf_free(&text);
        if (!ok) return false;
        /* what the template needs beside the content: the calls an assistant made, the call a
         * tool message answers */
        json_t *added = json_array_get(req->messages, json_array_size(req->messages) - 1);
        snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
        if (tool_calls && !read_tool_calls(tool_calls, param, added, err)) return false;
        /* the reasoning an earlier answer came back with (reasoning_content, as Ember sends it) */
        json_t *reasoning = json_object_get(m, "reasoning_content");
        if (json_is_string(reasoning) && !strcmp(role, "assistant") &&
            !em_server_set_reasoning(added, json_string_value(reasoning), json_string_length(reasoning), err))
            return false;
        json_t *call_id = json_object_get(m, "tool_call_id");
        if (!strcmp(role, "tool") && !json_is_string(call_id)) {
            snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
            em_server_error_set(err, 400, NULL, "missing_required_parameter", param, "'%s' is required", param);
            return false;
        }
        if (call_id) json_object_set(added, "tool_call_id", call_id);
    }
    return true;
}

/* Extra chat-template variables: llama-server's chat_template_kwargs (an object), then
 * reasoning_effort (gpt-oss's "Reasoning: ..." line; templates that do not read it are unchanged). */
static bool read_template_variables(const json_t *root, em_server_request *req, em_server_error *err) {
    json_t *given = json_object_get(root, "chat_template_kwargs");
    if (given && !json_is_null(given)) {
        if (!json_is_object(given)) {
            em_server_error_set(err, 400, NULL, "invalid_type", "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            return false;
        }
        const char *name;
        json_t *value;
        json_object_foreach(given, name, value) {
            if (!em_server_set_template_variable(req, name, json_deep_copy(value), err)) return false;
        }
    }
    return em_server_read_reasoning_effort(root, "reasoning_effort", "reasoning_effort", req, err);
}

bool em_openai_parse_chat(const char *body, size_t len, int32_t n_vocab, em_server_request *req,
                          em_server_error *err) {
    em_server_request_init(req, EM_API_OPENAI_CHAT);
    json_t *root = em_server_parse_body(body, len, err);
    if (!root) return false;
    bool ok = read_common(root, n_vocab, req, err) && read_messages(root, req, err) &&
              em_server_read_openai_tools(root, req, err) && em_server_read_reasoning_format(root, req, err) &&
              read_template_variables(root, req, err);
    int64_t top = 0;
    ok = ok && em_server_read_bool(root, "logprobs", &req->logprobs, err) &&
         em_server_read_int(root, "top_logprobs", 0, EM_SERVER_MAX_TOP, &top, err);
    req->top_logprobs = req->logprobs ? (int)top : 0;
    json_decref(root);
    return ok;
}

/* One prompt of ids: an array of integers in [0, n_vocab). */
static bool read_id_prompt(const json_t *array, int32_t n_vocab, em_server_prompt *p, em_server_error *err) {
    size_t n = json_array_size(array);
    p->is_ids = true;
    if (n == 0) {
        em_server_error_set(err, 400, NULL, "invalid_value", "prompt", "'prompt' holds an empty array of tokens");
        return false;
    }
    if (!(p->ids = malloc(n * sizeof *p->ids))) return oom(err);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(array, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= n_vocab) {
            em_server_error_set(err, 400, NULL, "invalid_value", "prompt",
                                "'prompt' token %zu is not a token id below %d", i, (int)n_vocab);
            return false;
        }
        p->ids[p->n_ids++] = (int32_t)json_integer_value(v);
    }
    return true;
}

static bool read_prompts(const json_t *root, int32_t n_vocab, em_server_request *req, em_server_error *err) {
    json_t *prompt = json_object_get(root, "prompt");
    if (!prompt) {
        em_server_error_set(err, 400, NULL, "missing_required_parameter", "prompt", "'prompt' is required");
        return false;
    }
    const char *what = "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of token ids";
    /* One prompt (a string, or an array of ids) or a batch of them. */
    bool batch = json_is_array(prompt) && json_array_size(prompt) > 0 && !json_is_integer(json_array_get(prompt, 0));
    size_t count = batch ? json_array_size(prompt) : 1;
    if (!json_is_string(prompt) && !json_is_array(prompt)) {
        em_server_error_set(err, 400, NULL, "invalid_type", "prompt", "%s", what);
        return false;
    }
    if (count > EM_SERVER_MAX_PROMPTS) {
        em_server_error_set(err, 400, NULL, "invalid_value", "prompt", "'prompt' holds more than %d prompts",
                            EM_SERVER_MAX_PROMPTS);
        return false;
    }
    if (!(req->prompts = calloc(count, sizeof *req->prompts))) return oom(err);
    for (size_t i = 0; i < count; i++) {
        json_t *p = batch ? json_array_get(prompt, i) : prompt;
        em_server_prompt *dst = &req->prompts[req->n_prompts++];
        if (json_is_string(p)) {
            if (!(dst->text = strndup(json_string_value(p), json_string_length(p)))) return oom(err);
            dst->text_len = json_string_length(p);
        } else if (json_is_array(p)) {
            if (!read_id_prompt(p, n_vocab, dst, err)) return false;
        } else {
            em_server_error_set(err, 400, NULL, "invalid_type", "prompt", "%s", what);
            return false;
        }
    }
    return true;
}

bool em_openai_parse_completions(const char *body, size_t len, int32_t n_vocab, em_server_request *req,
                                 em_server_error *err) {
    em_server_request_init(req, EM_API_OPENAI_COMPLETIONS);
    json_t *root = em_server_parse_body(body, len, err);
    if (!root) return false;
    bool ok = read_common(root, n_vocab, req, err) && read_prompts(root, n_vocab, req, err);
    int64_t logprobs = -1, best_of = req->n;
    bool echo = false;
    ok = ok && em_server_read_int(root, "logprobs", 0, EM_SERVER_MAX_TOP, &logprobs, err) &&
         em_server_read_bool(root, "echo", &echo, err) &&
         em_server_read_int(root, "best_of", 1, EM_SERVER_MAX_N, &best_of, err);
    if (ok && echo) {
        em_server_error_set(err, 400, NULL, "unsupported_parameter", "echo", "'echo' is not supported");
        ok = false;
    }
    if (ok && best_of != req->n) {
        em_server_error_set(err, 400, NULL, "unsupported_parameter", "best_of", "'best_of' other than 'n' is not supported");
        ok = false;
    }
    json_t *suffix = json_object_get(root, "suffix");
    if (ok && suffix && !json_is_null(suffix)) {
        em_server_error_set(err, 400, NULL, "unsupported_parameter", "suffix", "'suffix' is not supported");
        ok = false;
    }
    if (ok && req->n_prompts * (size_t)req->n > EM_SERVER_MAX_CHOICES) {
        em_server_error_set(err, 400, NULL, "invalid_value", "n",
                            "%zu prompts times n = %d asks for more than %d completions in one request", req->n_prompts,
                            req->n, EM_SERVER_MAX_CHOICES);
        ok = false;
    }
    req->logprobs = logprobs >= 0;
    req->top_logprobs = logprobs > 0 ? (int)logprobs : 0;
    json_decref(root);
    return ok;
}

/* ---- Formatting ---- */

static json_t *usage_json(const em_server_usage *u) {
    return json_pack("{s:I, s:I, s:I, s:{s:I}, s:{s:I}}", "prompt_tokens", (json_int_t)u->prompt_tokens,
                     "completion_tokens", (json_int_t)u->completion_tokens, "total_tokens",
                     (json_int_t)(u->prompt_tokens + u->completion_tokens), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)u->cached_tokens, "completion_tokens_details", "reasoning_tokens",
                     (json_int_t)u->reasoning_tokens);
}

static json_t *byte_array(const char *bytes, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer((unsigned char)bytes[i]));
    return a;
}

/* {token, logprob, bytes} for one token (chat format). */
static json_t *chat_token_json(const em_server_format *f, int32_t token, float logprob) {
    const char *bytes = NULL;
    size_t n = f->engine ? f->engine->token_bytes(f->engine->self, token, &bytes) : 0;
    return json_pack("{s:o, s:f, s:o}", "token", em_server_json_text(bytes, n), "logprob", em_server_finite(logprob),
                     "bytes", byte_array(bytes, n));
}

static json_t *chat_logprobs(const em_server_format *f, const em_server_token *tokens, size_t n) {
    json_t *content = json_array();
    for (size_t i = 0; content && i < n; i++) {
        json_t *entry = chat_token_json(f, tokens[i].token, tokens[i].logprob);
        json_t *top = json_array();
        for (int k = 0; top && k < tokens[i].n_top; k++)
            json_array_append_new(top, chat_token_json(f, tokens[i].top[k].token, tokens[i].top[k].logprob));
        json_object_set_new(entry, "top_logprobs", top);
        json_array_append_new(content, entry);
    }
    return json_pack("{s:o}", "content", content);
}

/* Legacy completions format: parallel arrays, top alternatives as {text: logprob} objects. */
static json_t *completion_logprobs(const em_server_format *f, const em_server_token *tokens, size_t n,
                                   size_t *offset) {
    json_t *texts = json_array(), *lps = json_array(), *tops = json_array(), *offsets = json_array();
    for (size_t i = 0; i < n; i++) {
        const char *bytes = NULL;
        size_t len = f->engine ? f->engine->token_bytes(f->engine->self, tokens[i].token, &bytes) : 0;
        json_array_append_new(texts, em_server_json_text(bytes, len));
        json_array_append_new(lps, json_real(em_server_finite(tokens[i].logprob)));
        json_array_append_new(offsets, json_integer((json_int_t)*offset));
        *offset += len;
        json_t *top = json_object();
        for (int k = 0; k < tokens[i].n_top; k++) {
            const char *tb = NULL;
            size_t tl = f->engine ? f->engine->token_bytes(f->engine->self, tokens[i].top[k].token, &tb) : 0;
            json_t *key = em_server_json_text(tb, tl);
            if (key && !json_object_get(top, json_string_value(key)))
                json_object_set_new(top, json_string_value(key), json_real(em_server_finite(tokens[i].top[k].logprob)));
            json_decref(key);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", texts, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offsets);
}

static json_t *response_head(const em_server_format *f, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", f->id, "object", object, "created", (json_int_t)f->created,
                     "model", f->model);
}

static void add_usage_and_timings(json_t *root, const em_server_usage *usage, const em_server_choice *first) {
    json_object_set_new(root, "usage", usage_json(usage));
    if (first) json_object_set_new(root, "timings", em_server_timings_json(&first->timings));
}

/* The id of call k of choice `choice_index`, the same in whole answers and streams. */
static void call_id(char *id, size_t size, const em_server_format *f, int choice_index, size_t k) {
    snprintf(id, size, "call_%s_%d_%zu", f->id, choice_index, k);
}

/* OpenAI's tool_calls array for a choice's calls (arguments: the JSON text the model wrote). */
static json_t *tool_calls_json(const em_server_format *f, int choice_index, const json_t *calls) {
    json_t *list = json_array();
    size_t k;
    json_t *call;
    json_array_foreach(calls, k, call) {
        char id[96];
        call_id(id, sizeof id, f, choice_index, k);
        json_array_append_new(list, json_pack("{s:s, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function", "name",
                                              json_object_get(call, "name"), "arguments", json_object_get(call, "arguments")));
    }
    return list;
}

json_t *em_openai_chat_response(const em_server_format *f, const em_server_request *req,
                                const em_server_choice *choices, size_t n_choices, const em_server_usage *usage) {
    json_t *root = response_head(f, "chat.completion");
    json_t *list = json_array();
    for (size_t i = 0; root && list && i < n_choices; i++) {
        const em_server_choice *c = &choices[i];
        json_t *message = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                    c->tool_calls && !c->content.len ? json_null() : em_server_json_text(c->content.data, c->content.len));
        if (message && c->reasoning.len)
            json_object_set_new(message, "reasoning_content", em_server_json_text(c->reasoning.data, c->reasoning.len));
        if (message && c->tool_calls) json_object_set_new(message, "tool_calls", tool_calls_json(f, (int)i, c->tool_calls));
        json_t *lp = req->logprobs ? chat_logprobs(f, c->tokens, c->n_tokens) : json_null();
        const char *reason = c->tool_calls ? "tool_calls" : em_openai_finish_reason(c->finish) ? em_openai_finish_reason(c->finish) : "stop";
        json_array_append_new(list, json_pack("{s:I, s:o, s:o, s:s}", "index", (json_int_t)i, "message", message,
                                              "logprobs", lp, "finish_reason", reason));
    }
    json_object_set_new(root, "choices", list);
    add_usage_and_timings(root, usage, n_choices ? &choices[0] : NULL);
    return root;
}

json_t *em_openai_completion_response(const em_server_format *f, const em_server_request *req,
                                      const em_server_choice *choices, size_t n_choices,
                                      const em_server_usage *usage) {
    json_t *root = response_head(f, "text_completion");
    json_t *list = json_array();
    for (size_t i = 0; root && list && i < n_choices; i++) {
        const em_server_choice *c = &choices[i];
        size_t offset = 0;
        json_t *lp = req->logprobs ? completion_logprobs(f, c->tokens, c->n_tokens, &offset) : json_null();
        json_array_append_new(list, json_pack("{s:o, s:I, s:o, s:s}", "text", em_server_json_text(c->text.data, c->text.len),
                                              "index", (json_int_t)i, "logprobs", lp, "finish_reason",
                                              em_openai_finish_reason(c->finish) ? em_openai_finish_reason(c->finish) : "stop"));
    }
    json_object_set_new(root, "choices", list);
    add_usage_and_timings(root, usage, n_choices ? &choices[0] : NULL);
    return root;
}

json_t *em_openai_models_json(const char *model_id, int64_t created) {
    return json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", model_id, "object", "model",
                     "created", (json_int_t)created, "owned_by", "ember");
}

/* ---- Streaming ---- */

static json_t *chunk_head(const em_server_format *f, const em_server_request *req) {
    return response_head(f, req->api == EM_API_OPENAI_CHAT ? "chat.completion.chunk" : "text_completion");
}

static bool emit_chunk(em_buf *out, const em_server_request *req, json_t *chunk, json_t *choice,
                       const ember_timings *timings) {
    if (!chunk || !choice) {
        json_decref(chunk);
        json_decref(choice);
        return false;
    }
    json_object_set_new(chunk, "choices", json_pack("[o]", choice));
    /* With include_usage every chunk carries "usage": null and only the last one a value. */
    if (req->include_usage) json_object_set_new(chunk, "usage", json_null());
    if (timings) json_object_set_new(chunk, "timings", em_server_timings_json(timings));
    bool ok = em_server_sse(out, NULL, chunk);
    json_decref(chunk);
    return ok;
}

bool em_openai_chat_chunk_start(em_buf *out, const em_server_format *f, const em_server_request *req, int index) {
    json_t *choice = json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", index, "delta", "role", "assistant",
                               "content", "", "logprobs", "finish_reason");
    return emit_chunk(out, req, chunk_head(f, req), choice, NULL);
}

bool em_openai_chunk_delta(em_buf *out, const em_server_format *f, const em_server_request *req, int index,
                           const char *text, size_t len, const em_server_token *tokens, size_t n_tokens,
                           ember_finish_reason finish, const ember_timings *timings) {
    json_t *choice;
    json_t *lp = json_null();
    if (req->logprobs && n_tokens) {
        json_decref(lp);
        size_t offset = 0;
        lp = req->api == EM_API_OPENAI_CHAT ? chat_logprobs(f, tokens, n_tokens)
                                            : completion_logprobs(f, tokens, n_tokens, &offset);
    }
    const char *reason = em_openai_finish_reason(finish);
    json_t *reason_json = reason ? json_string(reason) : json_null();
    if (req->api == EM_API_OPENAI_CHAT) {
        json_t *delta = len || !reason ? json_pack("{s:o}", "content", em_server_json_text(text, len)) : json_object();
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", index, "delta", delta, "logprobs", lp, "finish_reason",
                           reason_json);
    } else {
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", index, "text", em_server_json_text(text, len),
                           "logprobs", lp, "finish_reason", reason_json);
    }
    return emit_chunk(out, req, chunk_head(f, req), choice, reason ? timings : NULL);
}

bool em_openai_chunk_answer(em_buf *out, const em_server_format *f, const em_server_request *req, int index,
                            const em_answer_event *event) {
    json_t *delta;
    if (event->kind == EM_ANSWER_CONTENT || event->kind == EM_ANSWER_REASONING) {
        delta = json_pack("{s:o}", event->kind == EM_ANSWER_CONTENT ? "content" : "reasoning_content",
                          em_server_json_text(event->text, event->len));
    } else if (event->kind == EM_ANSWER_CALL_BEGIN) {
        char id[96];
        call_id(id, sizeof id, f, index, event->call_index);
        delta = json_pack("{s:[{s:I, s:s, s:s, s:{s:o, s:s}}]}", "tool_calls", "index", (json_int_t)event->call_index, "id", id,
                          "type", "function", "function", "name", em_server_json_text(event->text, event->len), "arguments", "");
    } else {
        delta = json_pack("{s:[{s:I, s:{s:o}}]}", "tool_calls", "index", (json_int_t)event->call_index, "function",
                          "arguments", em_server_json_text(event->text, event->len));
    }
    json_t *choice = json_pack("{s:i, s:o, s:n, s:n}", "index", index, "delta", delta, "logprobs", "finish_reason");
    return emit_chunk(out, req, chunk_head(f, req), choice, NULL);
}

bool em_openai_chunk_finish(em_buf *out, const em_server_format *f, const em_server_request *req, int index,
                            const em_server_choice *choice, const em_server_token *tokens, size_t n_tokens) {
    const char *reason = choice->tool_calls ? "tool_calls" : em_openai_finish_reason(choice->finish);
    json_t *lp = req->logprobs && n_tokens ? chat_logprobs(f, tokens, n_tokens) : json_null();
    json_t *c = json_pack("{s:i, s:{}, s:o, s:s}", "index", index, "delta", "logprobs", lp, "finish_reason",
                          reason ? reason : "stop");
    return emit_chunk(out, req, chunk_head(f, req), c, &choice->timings);
}

bool em_openai_chunk_logprobs(em_buf *out, const em_server_format *f, const em_server_request *req, int index,
                              const em_server_token *tokens, size_t n_tokens) {
    json_t *c = json_pack("{s:i, s:{}, s:o, s:n}", "index", index, "delta", "logprobs", chat_logprobs(f, tokens, n_tokens),
                          "finish_reason");
    return emit_chunk(out, req, chunk_head(f, req), c, NULL);
}

bool em_openai_stream_end(em_buf *out, const em_server_format *f, const em_server_request *req,
                          const em_server_usage *usage, const ember_timings *timings) {
    if (req->include_usage) {
        json_t *chunk = chunk_head(f, req);
        if (!chunk) return false;
        json_object_set_new(chunk, "choices", json_array());
        json_object_set_new(chunk, "usage", usage_json(usage));
        if (timings) json_object_set_new(chunk, "timings", em_server_timings_json(timings));
        bool ok = em_server_sse(out, NULL, chunk);
        json_decref(chunk);
        if (!ok) return false;
    }
    return em_buf_printf(out, "data: [DONE]\n\n");
}

bool em_server_stream_error(em_buf *out, em_server_api api, const em_server_error *err) {
    char *body = em_server_error_body(api, err);
    if (!body) return false;
    bool anthropic = api == EM_API_ANTHROPIC_MESSAGES || api == EM_API_ANTHROPIC_COUNT;
    bool ok = (!anthropic || em_buf_printf(out, "event: error\n")) && em_buf_printf(out, "data: %s\n\n", body);
    free(body);
    return ok;
}
