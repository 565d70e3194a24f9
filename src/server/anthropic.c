/* Anthropic's Messages API: parsing /v1/messages and /v1/messages/count_tokens bodies, and
 * formatting messages, stream events and the model list, as Anthropic's API reference describes
 * them. Usage follows Anthropic's accounting: input_tokens counts the prompt tokens that were not
 * read from the cache, cache_read_input_tokens the ones that were. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static bool oom(em_server_error *err) {
    em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
    return false;
}

/* A message whose content blocks include tool_use (assistant) or tool_result (user) blocks: text
 * blocks join into the message's content, tool_use blocks become its tool_calls, and each
 * tool_result becomes a `tool` message (before the user's own text, which answers after them). */
static bool read_tool_blocks(const json_t *content, const char *role, const char *param, em_server_request *req,
                             em_server_error *err) {
    em_buf text = {0}, thinking = {0};
    json_t *calls = json_array();
    size_t i;
    json_t *block;
    bool ok = calls != NULL;
    json_array_foreach(content, i, block) {
        const char *type = json_string_value(json_object_get(block, "type"));
        if (!ok) break;
        if (type && !strcmp(type, "text") && json_is_string(json_object_get(block, "text"))) {
            ok = (!text.len || em_buf_append(&text, "\n", 1)) &&
                 em_buf_append(&text, json_string_value(json_object_get(block, "text")), json_string_length(json_object_get(block, "text")));
            if (!ok) oom(err);
        } else if (type && !strcmp(type, "tool_use") && !strcmp(role, "assistant")) {
            json_t *id = json_object_get(block, "id"), *name = json_object_get(block, "name"), *input = json_object_get(block, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(input)) {
                em_server_error_set(err, 400, NULL, NULL, param, "%s.%zu: tool_use needs id, name and an input object", param, i);
                ok = false;
            } else {
                json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function",
                                                       "name", name, "arguments", input));
            }
        } else if (type && !strcmp(type, "thinking") && !strcmp(role, "assistant")) {
            json_t *thought = json_object_get(block, "thinking"); /* earlier reasoning: the template decides */
            if (json_is_string(thought))
                ok = (!thinking.len || em_buf_append(&thinking, "\n", 1)) &&
                     em_buf_append(&thinking, json_string_value(thought), json_string_length(thought));
            if (!ok) oom(err);
        } else if (type && !strcmp(type, "redacted_thinking") && !strcmp(role, "assistant")) {
            continue; /* encrypted: nothing a template can show */
        } else if (type && !strcmp(type, "tool_result") && !strcmp(role, "user")) {
            json_t *id = json_object_get(block, "tool_use_id"), *result = json_object_get(block, "content");
            em_buf answer = {0};
            char inner[96];
            snprintf(inner, sizeof inner, "%s.%zu.content", param, i);
            if (!json_is_string(id)) {
                em_server_error_set(err, 400, NULL, NULL, param, "%s.%zu: tool_result needs a tool_use_id", param, i);
                ok = false;
            } else if (!result || em_server_read_content(result, inner, &answer, err)) {
                json_t *m = json_pack("{s:s, s:s%, s:O}", "role", "tool", "content", answer.data ? answer.data : "", answer.len,
                                      "tool_call_id", id);
                ok = m && json_array_append_new(req->messages, m) == 0;
                if (!ok) oom(err);
            } else {
                ok = false;
            }
            em_buf_free(&answer);
        } else {
            em_server_error_set(err, 400, NULL, NULL, param, "%s.%zu: content blocks of type '%s' are not supported here",
                                param, i, type ? type : "(none)");
            ok = false;
        }
    }
    bool keep = ok && (text.len || json_array_size(calls) || !strcmp(role, "assistant"));
    if (keep) ok = em_server_add_message(req, role, &text, err);
    json_t *added = json_array_get(req->messages, json_array_size(req->messages) - 1);
    if (keep && ok && json_array_size(calls)) json_object_set(added, "tool_calls", calls);
    if (keep && ok) ok = em_server_set_reasoning(added, thinking.data, thinking.len, err);
    json_decref(calls);
    em_buf_free(&text);
    em_buf_free(&thinking);
    return ok;
}

static bool has_tool_blocks(const json_t *content) {
    size_t i;
    json_t *block;
    json_array_foreach(content, i, block) {
        const char *type = json_string_value(json_object_get(block, "type"));
        if (type && (!strcmp(type, "tool_use") || !strcmp(type, "tool_result") || !strcmp(type, "thinking") ||
                     !strcmp(type, "redacted_thinking")))
            return true;
    }
    return false;
}

/* system (string or text blocks) and messages → req->messages, system first. */
static bool read_conversation(const json_t *root, em_server_request *req, em_server_error *err) {
    if (!(req->messages = json_array())) return oom(err);
    json_t *system = json_object_get(root, "system");
    if (system && !json_is_null(system)) {
        em_buf text = {0};
        bool ok = em_server_read_content(system, "system", &text, err) &&
                  em_server_add_message(req, "system", &text, err);
        em_buf_free(&text);
        if (!ok) return false;
    }
    json_t *messages = json_object_get(root, "messages");
    if (!messages) {
        em_server_error_set(err, 400, NULL, NULL, "messages", "messages: field required");
        return false;
    }
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        em_server_error_set(err, 400, NULL, NULL, "messages", "messages: must be a non-empty array");
        return false;
    }
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        char param[48];
        snprintf(param, sizeof param, "messages.%zu", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role) {
            em_server_error_set(err, 400, NULL, NULL, param, "%s: must be an object with a string 'role'", param);
            return false;
        }
        if (strcmp(role, "user") && strcmp(role, "assistant")) {
            em_server_error_set(err, 400, NULL, NULL, param, "%s.role: unexpected role '%s' (user or assistant)",
                                param, role);
            return false;
        }
        json_t *content = json_object_get(m, "content");
        snprintf(param, sizeof param, "messages.%zu.content", i);
        if (!content) {
            em_server_error_set(err, 400, NULL, NULL, param, "%s: field required", param);
            return false;
        }
        if (json_is_array(content) && has_tool_blocks(content)) {
            if (!read_tool_blocks(content, role, param, req, err)) return false;
            continue;
        }
        em_buf text = {0};
        bool ok = em_server_read_content(content, param, &text, err) && em_server_add_message(req, role, &text, err);
        em_buf_free(&text);
        if (!ok) return false;
    }
    return true;
}

static bool read_model(const json_t *root, em_server_request *req, em_server_error *err) {
    const char *model = NULL;
    if (!em_server_read_string(root, "model", &model, err)) return false;
    if (!model) {
        em_server_error_set(err, 400, NULL, NULL, "model", "model: field required");
        return false;
    }
    if (!(req->model = strdup(model))) return oom(err);
    return true;
}

/* `thinking`: {type: enabled, budget_tokens} or {type: disabled} (or adaptive: the model decides)
 * reaches templates as enable_thinking (Qwen 3's switch) and as reasoning_effort (gpt-oss's grade,
 * by the budget: under 4000 tokens low, under 16000 medium, more high; disabled is low, since
 * gpt-oss always reasons). */
static bool read_thinking(const json_t *root, em_server_request *req, em_server_error *err) {
    json_t *thinking = json_object_get(root, "thinking");
    if (!thinking || json_is_null(thinking)) return true;
    const char *type = json_string_value(json_object_get(thinking, "type"));
    if (!json_is_object(thinking) || !type) {
        em_server_error_set(err, 400, NULL, NULL, "thinking", "thinking: must be an object with a 'type'");
        return false;
    }
    if (!strcmp(type, "adaptive")) return true;
    if (!strcmp(type, "disabled"))
        return em_server_set_template_variable(req, "enable_thinking", json_false(), err) &&
               em_server_set_template_variable(req, "reasoning_effort", json_string("low"), err);
    if (strcmp(type, "enabled")) {
        em_server_error_set(err, 400, NULL, NULL, "thinking.type", "thinking.type: must be enabled, disabled or adaptive");
        return false;
    }
    int64_t budget = 0;
    if (!em_server_read_int(thinking, "budget_tokens", 1, INT_MAX, &budget, err)) return false;
    if (!budget) {
        em_server_error_set(err, 400, NULL, NULL, "thinking.budget_tokens", "thinking.budget_tokens: field required");
        return false;
    }
    const char *effort = budget < 4000 ? "low" : budget < 16000 ? "medium" : "high";
    return em_server_set_template_variable(req, "enable_thinking", json_true(), err) &&
           em_server_set_template_variable(req, "reasoning_effort", json_string(effort), err);
}

bool em_anthropic_parse_messages(const char *body, size_t len, em_server_request *req, em_server_error *err) {
    em_server_request_init(req, EM_API_ANTHROPIC_MESSAGES);
    json_t *root = em_server_parse_body(body, len, err);
    if (!root) return false;
    bool ok = read_model(root, req, err);
    int64_t max_tokens = 0, top_k = 0;
    double temperature = req->sampling.temperature, top_p = req->sampling.top_p;
    if (ok && (!json_object_get(root, "max_tokens") || json_is_null(json_object_get(root, "max_tokens")))) {
        em_server_error_set(err, 400, NULL, NULL, "max_tokens", "max_tokens: field required");
        ok = false;
    }
    ok = ok && em_server_read_int(root, "max_tokens", INT64_MIN, INT64_MAX, &max_tokens, err);
    if (ok && max_tokens < 1) {
        em_server_error_set(err, 400, NULL, NULL, "max_tokens", "max_tokens: must be at least 1, got %lld",
                            (long long)max_tokens);
        ok = false;
    }
    ok = ok && read_conversation(root, req, err) &&
         em_server_read_number(root, "temperature", 0, 1, &temperature, err) &&
         em_server_read_number(root, "top_p", 0, 1, &top_p, err) &&
         em_server_read_int(root, "top_k", 0, INT_MAX, &top_k, err) &&
         em_server_read_stops(root, "stop_sequences", false, req, err) &&
         em_server_read_bool(root, "stream", &req->stream, err) &&
         em_server_read_bool(root, "ignore_eos", &req->ignore_eos, err) && /* llama-server's extension */
         em_server_read_speculative(root, req, err) &&
         em_server_read_anthropic_tools(root, req, err) && em_server_read_reasoning_format(root, req, err) &&
         read_thinking(root, req, err);
    json_t *metadata = json_object_get(root, "metadata"); /* user_id: accepted, not used */
    if (ok && metadata && !json_is_null(metadata) && !json_is_object(metadata)) {
        em_server_error_set(err, 400, NULL, NULL, "metadata", "metadata: must be an object");
        ok = false;
    }
    req->max_tokens = max_tokens > INT_MAX ? INT_MAX : (int)max_tokens;
    req->sampling.temperature = (float)temperature;
    req->sampling.top_p = (float)top_p;
    req->sampling.top_k = (int)top_k;
    json_decref(root);
    return ok;
}

bool em_anthropic_parse_count_tokens(const char *body, size_t len, em_server_request *req, em_server_error *err) {
    em_server_request_init(req, EM_API_ANTHROPIC_COUNT);
    json_t *root = em_server_parse_body(body, len, err);
    if (!root) return false;
    bool ok = read_model(root, req, err) && read_conversation(root, req, err) && em_server_read_anthropic_tools(root, req, err) &&
              read_thinking(root, req, err);
    json_decref(root);
    return ok;
}

/* ---- Formatting ---- */

static json_t *usage_json(const em_server_usage *u) {
    uint64_t cached = u->cached_tokens <= u->prompt_tokens ? u->cached_tokens : u->prompt_tokens;
    return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", (json_int_t)(u->prompt_tokens - cached),
                     "cache_creation_input_tokens", (json_int_t)0, "cache_read_input_tokens", (json_int_t)cached,
                     "output_tokens", (json_int_t)u->completion_tokens);
}

static json_t *message_json(const em_server_format *f, json_t *content, const char *stop_reason,
                            const char *stop_sequence, const em_server_usage *usage) {
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "id", f->id, "type", "message", "role",
                     "assistant", "model", f->model, "content", content, "stop_reason",
                     stop_reason ? json_string(stop_reason) : json_null(), "stop_sequence",
                     stop_sequence ? json_string(stop_sequence) : json_null(), "usage", usage_json(usage));
}

/* A tool_use block for call k of a choice, input {} (the caller sets the input, or streams it). */
static json_t *tool_use_json(const em_server_format *f, const json_t *call, size_t k) {
    char id[96];
    snprintf(id, sizeof id, "toolu_%s_%zu", f->id, k);
    return json_pack("{s:s, s:s, s:O, s:{}}", "type", "tool_use", "id", id, "name", json_object_get(call, "name"), "input");
}

/* The input of a tool_use block: the call's arguments as an object ({} when they are not one, as
 * when the answer was cut short inside them). */
static json_t *call_input(const json_t *call) {
    json_t *input = json_loads(json_string_value(json_object_get(call, "arguments")), 0, NULL);
    if (json_is_object(input)) return input;
    json_decref(input);
    return json_object();
}

json_t *em_anthropic_message_response(const em_server_format *f, const em_server_choice *choice,
                                      const em_server_usage *usage) {
    json_t *content = json_array();
    if (content && choice->reasoning.len)
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                                 em_server_json_text(choice->reasoning.data, choice->reasoning.len),
                                                 "signature", ""));
    if (content && (!choice->tool_calls || choice->content.len))
        json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
                                                 em_server_json_text(choice->content.data, choice->content.len)));
    size_t k;
    json_t *call;
    json_array_foreach(choice->tool_calls, k, call) {
        json_t *use = tool_use_json(f, call, k);
        if (use) json_object_set_new(use, "input", call_input(call));
        json_array_append_new(content, use);
    }
    const char *reason = choice->tool_calls ? "tool_use" : em_anthropic_stop_reason(choice->finish, choice->stop_string);
    json_t *root = message_json(f, content, reason ? reason : "end_turn", choice->stop_string, usage);
    if (root) json_object_set_new(root, "timings", em_server_timings_json(&choice->timings));
    return root;
}

json_t *em_anthropic_models_json(const char *model_id, int64_t created) {
    char when[32] = "1970-01-01T00:00:00Z";
    time_t t = (time_t)created;
    struct tm tm;
    if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_pack("{s:[{s:s, s:s, s:s, s:s}], s:b, s:s, s:s}", "data", "type", "model", "id", model_id,
                     "display_name", model_id, "created_at", when, "has_more", 0, "first_id", model_id, "last_id",
                     model_id);
}

static bool event(em_buf *out, const char *name, json_t *data) {
    if (!data) return false;
    bool ok = em_server_sse(out, name, data);
    json_decref(data);
    return ok;
}

bool em_anthropic_stream_start(em_buf *out, const em_server_format *f, const em_server_usage *usage) {
    return event(out, "message_start",
                 json_pack("{s:s, s:o}", "type", "message_start", "message",
                           message_json(f, json_array(), NULL, NULL, usage)));
}

static bool block_stop(em_buf *out, em_anthropic_stream *st) {
    if (!st->open) return true;
    st->open = false;
    return event(out, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", st->index));
}

/* Closes the open block unless it is of `kind`, then opens `block` (taken) as the next one. */
static bool block_start(em_buf *out, em_anthropic_stream *st, em_answer_kind kind, json_t *block) {
    if (st->open && st->kind == kind && kind != EM_ANSWER_CALL_BEGIN) {
        json_decref(block);
        return true;
    }
    if (!block_stop(out, st)) {
        json_decref(block);
        return false;
    }
    const bool first = !st->started;
    st->index = first ? 0 : st->index + 1;
    st->started = st->open = true;
    st->kind = kind;
    /* a ping after the first block's start, where Anthropic's streams have it */
    return event(out, "content_block_start",
                 json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", st->index, "content_block", block)) &&
           (!first || event(out, "ping", json_pack("{s:s}", "type", "ping")));
}

static bool block_delta(em_buf *out, const em_anthropic_stream *st, const char *type, const char *field, const char *text,
                        size_t len) {
    return event(out, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index",
                                                       st->index, "delta", "type", type, field, em_server_json_text(text, len)));
}

bool em_anthropic_stream_answer(em_buf *out, const em_server_format *f, em_anthropic_stream *st, const em_answer_event *ev) {
    switch (ev->kind) {
    case EM_ANSWER_REASONING:
        return block_start(out, st, ev->kind, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")) &&
               block_delta(out, st, "thinking_delta", "thinking", ev->text, ev->len);
    case EM_ANSWER_CONTENT:
        return block_start(out, st, ev->kind, json_pack("{s:s, s:s}", "type", "text", "text", "")) &&
               block_delta(out, st, "text_delta", "text", ev->text, ev->len);
    case EM_ANSWER_CALL_BEGIN: {
        json_t *call = json_pack("{s:o}", "name", em_server_json_text(ev->text, ev->len));
        json_t *use = call ? tool_use_json(f, call, ev->call_index) : NULL;
        json_decref(call);
        return use && block_start(out, st, ev->kind, use);
    }
    case EM_ANSWER_CALL_ARGUMENTS:
        return block_delta(out, st, "input_json_delta", "partial_json", ev->text, ev->len);
    }
    return false;
}

bool em_anthropic_stream_end(em_buf *out, em_anthropic_stream *st, const em_server_choice *choice,
                             const em_server_usage *usage) {
    if (!st->started && !block_start(out, st, EM_ANSWER_CONTENT, json_pack("{s:s, s:s}", "type", "text", "text", "")))
        return false;
    const char *reason = choice->tool_calls ? "tool_use" : em_anthropic_stop_reason(choice->finish, choice->stop_string);
    json_t *delta = json_pack("{s:s, s:{s:s, s:o}, s:o, s:o}", "type", "message_delta", "delta", "stop_reason",
                              reason ? reason : "end_turn", "stop_sequence",
                              choice->stop_string && !choice->tool_calls ? json_string(choice->stop_string) : json_null(),
                              "usage", usage_json(usage), "timings", em_server_timings_json(&choice->timings));
    if (!block_stop(out, st)) {
        json_decref(delta);
        return false;
    }
    return event(out, "message_delta", delta) && event(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}
