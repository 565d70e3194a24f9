/* OpenAI's Responses API (POST /v1/responses and /responses): the request's input items become a
 * chat conversation on the same engine as the other APIs, and the read answer becomes output items
 * (reasoning, message, function_call), whole or as the API's typed SSE events.
 *
 * What maps onto what:
 *   - `instructions` is a system message ahead of everything; input messages (roles user,
 *     assistant, system, developer; text parts input_text / output_text) are messages;
 *     `function_call` items are the assistant's tool_calls (consecutive ones join one assistant
 *     turn), `function_call_output` items are tool messages; the text of `reasoning` items is the
 *     reasoning of the assistant turn that follows them (templates keep or drop it as their model
 *     was trained to); an `item_reference` is the stored output item it names (an item's id says
 *     which response holds it).
 *   - `tools` of type function are the chat API's tools (tool_choice auto, required, none or a named
 *     function, through tools.c); tools of other types (web_search, local_shell, custom, mcp, ...)
 *     are hosted tools a local model cannot run: they are accepted, left out, and named in the
 *     response's `ignored_tools` (Codex sends them with every request).
 *   - `text.format` json_object / json_schema is structured output (structured.c); `reasoning.effort`
 *     is the template variable reasoning_effort (templates that do not read it are unchanged).
 *   - `store` (default true) keeps the conversation the response ended and its output items
 *     (response_store.c);
 *     `previous_response_id` continues it: the stored input and output, then the new input (the
 *     previous `instructions` are not carried over, as OpenAI documents). The continued prompt
 *     starts with the previous one, so the prefix cache serves it.
 *
 * Streams are typed SSE events, each with a `sequence_number` counted from 0: response.created and
 * response.in_progress, then per output item output_item.added, its content part's
 * content_part.added, deltas (output_text, reasoning_text, function_call_arguments), their .done,
 * content_part.done and output_item.done, and last response.completed (response.incomplete when
 * max_output_tokens cut it, response.failed when the engine failed). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static bool oom(em_server_error *err) {
    em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
    return false;
}

static bool bad(em_server_error *err, const char *code, const char *param, const char *fmt, const char *detail) {
    em_server_error_set(err, 400, NULL, code, param, fmt, param, detail ? detail : "");
    return false;
}

/* One request's state: what a response repeats of it, the conversation to store, and where a
 * stream is. */
typedef struct responses_self {
    em_server *server;
    json_t *echo;         /* the request's fields a response object repeats */
    json_t *ignored;      /* types of the tools left out, or NULL */
    json_t *conversation; /* input messages (previous ones first), instructions left out */
    bool store;
    int64_t sequence;     /* the next event's sequence_number */
    json_t *output;       /* items finished so far (streams) */
    bool item_open;
    em_answer_kind item_kind;
    em_buf item_text;     /* text or arguments of the open item */
    char *call_name;
} responses_self;

static void self_free(void *p) {
    responses_self *self = p;
    if (!self) return;
    json_decref(self->echo);
    json_decref(self->ignored);
    json_decref(self->conversation);
    json_decref(self->output);
    em_buf_free(&self->item_text);
    free(self->call_name);
    free(self);
}

/* ---- Input ---- */

/* Text parts of a message (a string, or parts input_text / output_text / text / refusal), joined
 * by newlines. Images, files and audio are not for a text model: 400. */
static bool read_parts(const json_t *content, const char *param, em_buf *text, em_server_error *err) {
    if (json_is_string(content))
        return em_buf_append(text, json_string_value(content), json_string_length(content)) || oom(err);
    if (!json_is_array(content)) return bad(err, "invalid_type", param, "'%s' must be a string or an array of content parts%s", NULL);
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        char where[96];
        snprintf(where, sizeof where, "%s[%zu]", param, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!type) return bad(err, "invalid_type", where, "'%s' must be an object with a string 'type'%s", NULL);
        const bool refusal = !strcmp(type, "refusal");
        if (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") && !refusal)
            return bad(err, "unsupported_content", where, "'%s': content parts of type '%s' are not supported (text only)",
                       type);
        json_t *t = json_object_get(part, refusal ? "refusal" : "text");
        if (!json_is_string(t)) return bad(err, "invalid_type", where, "'%s' needs a string text%s", NULL);
        if ((i > 0 && !em_buf_append(text, "\n", 1)) || !em_buf_append(text, json_string_value(t), json_string_length(t)))
            return oom(err);
    }
    return true;
}

static json_t *last_message(json_t *messages) {
    size_t n = json_array_size(messages);
    return n ? json_array_get(messages, n - 1) : NULL;
}

/* A function_call item: a call of the last assistant turn, or a new assistant turn of calls. */
static bool read_function_call(const json_t *item, const char *param, json_t *messages, em_server_error *err) {
    json_t *call_id = json_object_get(item, "call_id"), *name = json_object_get(item, "name"),
           *arguments = json_object_get(item, "arguments");
    if (!json_is_string(call_id) || !json_is_string(name) || !json_is_string(arguments))
        return bad(err, "invalid_value", param, "'%s': a function_call needs string call_id, name and arguments%s", NULL);
    json_t *turn = last_message(messages);
    const char *role = json_string_value(json_object_get(turn, "role"));
    if (!role || strcmp(role, "assistant")) {
        turn = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
        if (!turn || json_array_append_new(messages, turn)) return oom(err);
    }
    json_t *calls = json_object_get(turn, "tool_calls");
    if (!calls) {
        if (!(calls = json_array()) || json_object_set_new(turn, "tool_calls", calls)) return oom(err);
    }
    json_t *call = json_pack("{s:O, s:s, s:{s:O, s:o}}", "id", call_id, "type", "function", "function", "name", name,
                             "arguments", em_server_arguments_object(json_string_value(arguments)));
    return (call && !json_array_append_new(calls, call)) || oom(err);
}

static bool read_function_output(const json_t *item, const char *param, json_t *messages, em_server_error *err) {
    json_t *call_id = json_object_get(item, "call_id"), *output = json_object_get(item, "output");
    if (!json_is_string(call_id) || !output)
        return bad(err, "invalid_value", param, "'%s': a function_call_output needs a string call_id and an output%s", NULL);
    char where[96];
    snprintf(where, sizeof where, "%s.output", param);
    em_buf text = {0};
    bool ok = read_parts(output, where, &text, err);
    json_t *m = ok ? json_pack("{s:s, s:s%, s:O}", "role", "tool", "content", text.data ? text.data : "", text.len,
                               "tool_call_id", call_id)
                   : NULL;
    em_buf_free(&text);
    if (!ok) return false;
    return (m && !json_array_append_new(messages, m)) || oom(err);
}

static bool read_message(const json_t *item, const char *param, json_t *messages, em_server_error *err) {
    const char *role = json_string_value(json_object_get(item, "role"));
    char where[96];
    snprintf(where, sizeof where, "%s.role", param);
    if (!role) return bad(err, "invalid_value", where, "'%s' must be a string%s", NULL);
    if (!strcmp(role, "developer")) role = "system";
    if (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system"))
        return bad(err, "invalid_value", where, "'%s' '%s' is not one of user, assistant, system, developer", role);
    json_t *content = json_object_get(item, "content");
    snprintf(where, sizeof where, "%s.content", param);
    if (!content) return bad(err, "missing_required_parameter", where, "'%s' is required%s", NULL);
    em_buf text = {0};
    bool ok = read_parts(content, where, &text, err);
    json_t *m = ok ? json_pack("{s:s, s:s%}", "role", role, "content", text.data ? text.data : "", text.len) : NULL;
    em_buf_free(&text);
    if (!ok) return false;
    return (m && !json_array_append_new(messages, m)) || oom(err);
}

/* Item types that only hosted tools produce: skipped. */
static bool is_skipped_item(const char *type) {
    static const char *const skipped[] = {"web_search_call", "file_search_call", "computer_call",
                                          "computer_call_output", "local_shell_call", "local_shell_call_output",
                                          "custom_tool_call", "custom_tool_call_output", "image_generation_call",
                                          "code_interpreter_call", "mcp_call", "mcp_list_tools", "mcp_approval_request",
                                          "mcp_approval_response", "shell_call", "shell_call_output",
                                          "apply_patch_call", "apply_patch_call_output"};
    for (size_t i = 0; i < sizeof skipped / sizeof skipped[0]; i++)
        if (!strcmp(type, skipped[i])) return true;
    return false;
}

/* Where the reading of an input list is: the stored response an item_reference read last (a
 * request's references usually name items of one or two responses), and the text of reasoning items
 * that wait for the assistant turn they led to. */
typedef struct input_state {
    em_response_store *store;
    char *response_id;
    json_t *stored;  /* {messages, output} of response_id */
    em_buf reasoning; /* of the reasoning items since the last assistant turn */
} input_state;

/* The output item `item_id` of a stored response, or NULL. Item ids are "<kind>_<response id>_<index>"
 * (item_id below), so the id itself says where the item is kept. */
static json_t *referenced_item(input_state *state, const char *item_id) {
    const char *underscore = strchr(item_id, '_'), *last = strrchr(item_id, '_');
    if (!underscore || last == underscore || !last[1]) return NULL;
    char *end;
    unsigned long index = strtoul(last + 1, &end, 10);
    if (*end || last[1] < '0' || last[1] > '9') return NULL;
    const char *response_id = underscore + 1;
    const size_t id_len = (size_t)(last - response_id);
    if (!state->response_id || strlen(state->response_id) != id_len || strncmp(state->response_id, response_id, id_len)) {
        free(state->response_id);
        json_decref(state->stored);
        state->stored = NULL;
        if (!(state->response_id = strndup(response_id, id_len))) return NULL;
        state->stored = em_response_store_get(state->store, state->response_id);
    }
    json_t *item = json_array_get(json_object_get(state->stored, "output"), index);
    const char *stored_id = json_string_value(json_object_get(item, "id"));
    return stored_id && !strcmp(stored_id, item_id) ? item : NULL;
}

static bool read_item(const json_t *item, const char *param, json_t *messages, input_state *state, em_server_error *err);

/* A reasoning item: its reasoning_text parts (or, without them, its summary), kept for the next
 * assistant turn. Encrypted reasoning is another server's and is left out. */
static bool read_reasoning(const json_t *item, input_state *state, em_server_error *err) {
    json_t *parts = json_object_get(item, "content");
    const char *kind = "reasoning_text";
    if (!json_array_size(parts)) {
        parts = json_object_get(item, "summary");
        kind = "summary_text";
    }
    size_t i;
    json_t *part;
    json_array_foreach(parts, i, part) {
        json_t *text = json_object_get(part, "text");
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_string(text) || !type || strcmp(type, kind)) continue;
        if ((state->reasoning.len && !em_buf_append(&state->reasoning, "\n", 1)) ||
            !em_buf_append(&state->reasoning, json_string_value(text), json_string_length(text)))
            return oom(err);
    }
    return true;
}

/* An item_reference: the stored output item it names, read as if it had been sent (the Vercel AI
 * SDK sends earlier assistant messages this way when responses are stored). */
static bool read_item_reference(const json_t *item, const char *param, json_t *messages, input_state *state,
                                em_server_error *err) {
    const char *id = json_string_value(json_object_get(item, "id"));
    char where[64];
    snprintf(where, sizeof where, "%s.id", param);
    if (!id) return bad(err, "invalid_type", where, "'%s' must be a string%s", NULL);
    json_t *referenced = referenced_item(state, id);
    if (!referenced) {
        em_server_error_set(err, 400, NULL, "item_not_found", where,
                            "'%s': no stored response holds item '%s' (it was sent with store: false, never existed or was pushed out)",
                            where, id);
        return false;
    }
    return read_item(referenced, param, messages, state, err);
}

static bool read_item(const json_t *item, const char *param, json_t *messages, input_state *state, em_server_error *err) {
    if (!json_is_object(item)) return bad(err, "invalid_type", param, "'%s' must be an object%s", NULL);
    const json_t *type_json = json_object_get(item, "type");
    const char *type = json_string_value(type_json);
    if (type_json && !type) return bad(err, "invalid_type", param, "'%s' must have a string 'type'%s", NULL);
    if (type && !strcmp(type, "reasoning")) return read_reasoning(item, state, err);
    bool ok;
    if (!type || !strcmp(type, "message")) ok = read_message(item, param, messages, err);
    else if (!strcmp(type, "function_call")) ok = read_function_call(item, param, messages, err);
    else if (!strcmp(type, "function_call_output")) ok = read_function_output(item, param, messages, err);
    else if (is_skipped_item(type)) return true;
    /* a stored item is never a reference itself, so this goes one level deep at most */
    else if (!strcmp(type, "item_reference")) return read_item_reference(item, param, messages, state, err);
    else return bad(err, "invalid_value", param, "'%s': items of type '%s' are not supported", type);
    /* reasoning items before an assistant turn are that turn's reasoning, for the templates that keep
     * it (gpt-oss's, before a call); before any other turn they are left out */
    json_t *turn = last_message(messages);
    const char *role = json_string_value(json_object_get(turn, "role"));
    if (ok && role && !strcmp(role, "assistant") && !em_server_set_reasoning(turn, state->reasoning.data, state->reasoning.len, err))
        ok = false;
    state->reasoning.len = 0;
    return ok;
}



/* `input`: a string (one user message) or a list of items, appended to `messages`. */
static bool read_input(const json_t *input, json_t *messages, em_response_store *store, em_server_error *err) {
    if (json_is_string(input)) {
        json_t *m = json_pack("{s:s, s:s%}", "role", "user", "content", json_string_value(input), json_string_length(input));
        return (m && !json_array_append_new(messages, m)) || oom(err);
    }
    if (!json_is_array(input)) return bad(err, "invalid_type", "input", "'%s' must be a string or an array of items%s", NULL);
    input_state state = {.store = store};
    bool ok = true;
    size_t i;
    json_t *item;
    json_array_foreach(input, i, item) {
        char param[48];
        snprintf(param, sizeof param, "input[%zu]", i);
        if (!(ok = read_item(item, param, messages, &state, err))) break;
    }
    free(state.response_id);
    json_decref(state.stored);
    em_buf_free(&state.reasoning);
    return ok;
}

/* ---- Tools and text.format ---- */

/* `tools` and `tool_choice` in the Responses shape ({type: "function", name, description,
 * parameters}) → the chat API's (tools.c reads them); other tool types are left out and listed. */
static bool read_tools(const json_t *root, em_server_request *req, responses_self *self, em_server_error *err) {
    json_t *tools = json_object_get(root, "tools"), *choice = json_object_get(root, "tool_choice");
    if (json_is_null(tools)) tools = NULL;
    if (json_is_null(choice)) choice = NULL;
    if (tools && !json_is_array(tools)) return bad(err, "invalid_type", "tools", "'%s' must be an array%s", NULL);
    json_t *chat = json_pack("{s:[]}", "tools");
    if (!chat) return oom(err);
    size_t i;
    json_t *t;
    bool ok = true;
    json_array_foreach(tools, i, t) {
        char param[48];
        snprintf(param, sizeof param, "tools[%zu]", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || !type) {
            ok = bad(err, "invalid_type", param, "'%s' must be an object with a string 'type'%s", NULL);
            break;
        }
        if (strcmp(type, "function")) {
            if (!self->ignored) self->ignored = json_array();
            json_array_append_new(self->ignored, json_string(type));
            continue;
        }
        json_t *name = json_object_get(t, "name"), *parameters = json_object_get(t, "parameters");
        if (!json_is_string(name)) {
            ok = bad(err, "missing_required_parameter", param, "'%s' needs a string 'name'%s", NULL);
            break;
        }
        if (parameters && !json_is_null(parameters) && !json_is_object(parameters)) {
            char where[64];
            snprintf(where, sizeof where, "%s.parameters", param);
            ok = bad(err, "invalid_type", where, "'%s' must be a JSON schema object%s", NULL);
            break;
        }
        json_t *function = json_pack("{s:O}", "name", name);
        if (function && json_is_string(json_object_get(t, "description")))
            json_object_set(function, "description", json_object_get(t, "description"));
        if (function && parameters && !json_is_null(parameters)) json_object_set(function, "parameters", parameters);
        json_array_append_new(json_object_get(chat, "tools"), json_pack("{s:s, s:o}", "type", "function", "function", function));
    }
    bool has_functions = json_array_size(json_object_get(chat, "tools")) > 0;
    /* a choice with only hosted tools given is theirs (left out with them); with no tools at all
     * it is the chat API's error */
    if (ok && choice && (has_functions || !self->ignored)) {
        const char *mode = json_string_value(choice);
        const char *type = json_string_value(json_object_get(choice, "type"));
        if (mode) {
            json_object_set(chat, "tool_choice", choice);
        } else if (type && !strcmp(type, "function")) {
            json_t *name = json_object_get(choice, "name");
            if (!json_is_string(name)) ok = bad(err, "invalid_value", "tool_choice", "'%s' of type function needs a string 'name'%s", NULL);
            else json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
        } else if (type && !strcmp(type, "allowed_tools") && json_is_string(json_object_get(choice, "mode"))) {
            json_object_set(chat, "tool_choice", json_object_get(choice, "mode"));
        } else if (!type) {
            ok = bad(err, "invalid_type", "tool_choice", "'%s' must be none, auto, required or an object with a 'type'%s", NULL);
        } /* a hosted tool's choice: that tool is left out, the model chooses (auto) */
    }
    if (ok && !has_functions) json_object_del(chat, "tools");
    if (ok) {
        json_t *parallel = json_object_get(root, "parallel_tool_calls");
        if (parallel) json_object_set(chat, "parallel_tool_calls", parallel);
        ok = em_server_read_openai_tools(chat, req, err);
    }
    json_decref(chat);
    return ok;
}

/* text.format: {type: text | json_object | json_schema (name, schema, strict)}. */
static bool read_text_format(const json_t *root, em_server_request *req, em_server_error *err) {
    json_t *text = json_object_get(root, "text");
    if (!text || json_is_null(text)) return true;
    if (!json_is_object(text)) return bad(err, "invalid_type", "text", "'%s' must be an object%s", NULL);
    json_t *format = json_object_get(text, "format");
    if (!format || json_is_null(format)) return true;
    const char *type = json_string_value(json_object_get(format, "type"));
    if (!type) return bad(err, "invalid_type", "text.format", "'%s' must be an object with a string 'type'%s", NULL);
    if (!strcmp(type, "text")) return true;
    if (!strcmp(type, "json_object")) return em_server_grammar_from_schema(req, NULL, "text.format", err);
    if (strcmp(type, "json_schema"))
        return bad(err, "invalid_value", "text.format.type", "'%s' '%s' is not one of text, json_object, json_schema", type);
    json_t *schema = json_object_get(format, "schema");
    if (!json_is_object(schema)) return bad(err, "missing_required_parameter", "text.format.schema", "'%s' must be a schema object%s", NULL);
    return em_server_grammar_from_schema(req, schema, "text.format.schema", err);
}

/* ---- The request ---- */

static bool read_sampling(const json_t *root, em_server_request *req, em_server_error *err) {
    double temperature = req->sampling.temperature, top_p = req->sampling.top_p, min_p = 0;
    int64_t max_tokens = 0, top_k = 0, seed = 0;
    if (!em_server_read_number(root, "temperature", 0, 2, &temperature, err) ||
        !em_server_read_number(root, "top_p", 0, 1, &top_p, err) ||
        !em_server_read_number(root, "min_p", 0, 1, &min_p, err) ||
        !em_server_read_int(root, "top_k", 0, INT_MAX, &top_k, err) ||
        !em_server_read_int(root, "seed", INT64_MIN, INT64_MAX, &seed, err) ||
        !em_server_read_int(root, "max_output_tokens", 1, INT_MAX, &max_tokens, err))
        return false;
    req->sampling.temperature = (float)temperature;
    req->sampling.top_p = (float)top_p;
    req->sampling.min_p = (float)min_p;
    req->sampling.top_k = (int)top_k;
    req->sampling.seed = (uint64_t)seed;
    req->seed_given = json_is_number(json_object_get(root, "seed"));
    req->max_tokens = (int)max_tokens;
    return true;
}

/* Fields accepted with a shape check and otherwise not used. */
static bool read_accepted(const json_t *root, em_server_error *err) {
    static const struct {
        const char *key;
        json_type type;
    } fields[] = {{"metadata", JSON_OBJECT}, {"reasoning", JSON_OBJECT}, {"include", JSON_ARRAY},
                  {"user", JSON_STRING},     {"truncation", JSON_STRING}, {"prompt_cache_key", JSON_STRING},
                  {"service_tier", JSON_STRING}, {"safety_identifier", JSON_STRING}, {"stream_options", JSON_OBJECT}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        json_t *v = json_object_get(root, fields[i].key);
        if (v && !json_is_null(v) && json_typeof(v) != fields[i].type)
            return bad(err, "invalid_type", fields[i].key, "'%s' must be %s",
                       fields[i].type == JSON_OBJECT ? "an object" : fields[i].type == JSON_ARRAY ? "an array" : "a string");
    }
    bool background = false;
    if (!em_server_read_bool(root, "background", &background, err)) return false;
    if (background) return bad(err, "unsupported_parameter", "background", "'%s' is not supported: responses run while the request waits%s", NULL);
    json_t *conversation = json_object_get(root, "conversation"), *prompt = json_object_get(root, "prompt");
    if (conversation && !json_is_null(conversation))
        return bad(err, "unsupported_parameter", "conversation", "'%s' is not supported (use previous_response_id)%s", NULL);
    if (prompt && !json_is_null(prompt))
        return bad(err, "unsupported_parameter", "prompt", "'%s' (a stored prompt template) is not supported%s", NULL);
    return true;
}

/* `key` of the request when it has the JSON type `type`, else `fallback` (taken). */
static json_t *given_or(const json_t *root, const char *key, json_type type, json_t *fallback) {
    json_t *v = json_object_get(root, key);
    if (v && json_typeof(v) == type) {
        json_decref(fallback);
        return json_incref(v);
    }
    return fallback;
}

/* What a response object repeats of its request. */
static json_t *echo_of(const json_t *root, const em_server_request *req) {
    json_t *echo = json_object();
    json_t *format = json_object_get(json_object_get(root, "text"), "format");
    json_t *choice = json_object_get(root, "tool_choice");
    if (!echo) return NULL;
    json_object_set_new(echo, "instructions", given_or(root, "instructions", JSON_STRING, json_null()));
    json_object_set_new(echo, "max_output_tokens", req->max_tokens ? json_integer(req->max_tokens) : json_null());
    json_object_set_new(echo, "parallel_tool_calls", json_boolean(!json_is_false(json_object_get(root, "parallel_tool_calls"))));
    json_object_set_new(echo, "previous_response_id", given_or(root, "previous_response_id", JSON_STRING, json_null()));
    json_object_set_new(echo, "temperature", json_real(req->sampling.temperature));
    json_object_set_new(echo, "top_p", json_real(req->sampling.top_p));
    json_object_set_new(echo, "text", json_pack("{s:o}", "format", json_is_object(format) ? json_incref(format)
                                                                                           : json_pack("{s:s}", "type", "text")));
    json_object_set_new(echo, "tool_choice", choice && (json_is_string(choice) || json_is_object(choice)) ? json_incref(choice)
                                                                                                          : json_string("auto"));
    json_object_set_new(echo, "tools", given_or(root, "tools", JSON_ARRAY, json_array()));
    json_object_set_new(echo, "metadata", given_or(root, "metadata", JSON_OBJECT, json_object()));
    json_object_set_new(echo, "reasoning", given_or(root, "reasoning", JSON_OBJECT, json_pack("{s:n, s:n}", "effort", "summary")));
    json_object_set_new(echo, "truncation", json_string("disabled"));
    json_object_set_new(echo, "user", given_or(root, "user", JSON_STRING, json_null()));
    return echo;
}

static bool parse(const char *body, size_t len, em_response_store *store, em_server_request *req, responses_self *self,
                  em_server_error *err) {
    em_server_request_init(req, EM_API_OPENAI_RESPONSES);
    json_t *root = em_server_parse_body(body, len, err);
    if (!root) return false;
    const char *model = NULL, *instructions = NULL, *previous = NULL;
    self->store = true;
    bool ok = em_server_read_string(root, "model", &model, err) &&
              em_server_read_string(root, "instructions", &instructions, err) &&
              em_server_read_string(root, "previous_response_id", &previous, err) &&
              em_server_read_bool(root, "store", &self->store, err) && em_server_read_bool(root, "stream", &req->stream, err) &&
              read_sampling(root, req, err) && read_accepted(root, err);
    if (ok && !model) ok = bad(err, "missing_required_parameter", "model", "'%s' is required%s", NULL);
    if (ok && !(req->model = strdup(model))) ok = oom(err);
    if (ok && previous) { /* a stored response is {messages, output} (store_answer) */
        json_t *stored = em_response_store_get(store, previous);
        self->conversation = json_incref(json_object_get(stored, "messages"));
        json_decref(stored);
    } else if (ok) {
        self->conversation = json_array();
    }
    if (ok && !self->conversation) {
        if (previous) {
            /* OpenAI answers this with a 400 (not a 404: the path exists), and clients such as
             * Codex recognise it by its code */
            em_server_error_set(err, 400, NULL, "previous_response_not_found", "previous_response_id",
                                "Previous response with id '%s' not found.", previous);
            ok = false;
        } else {
            ok = oom(err);
        }
    }
    json_t *input = json_object_get(root, "input");
    if (ok && input && !json_is_null(input)) ok = read_input(input, self->conversation, store, err);
    if (ok && json_array_size(self->conversation) == 0)
        ok = bad(err, "missing_required_parameter", "input", "'%s' is required (a string or a non-empty list of items)%s", NULL);
    if (ok && !(req->messages = json_array())) ok = oom(err);
    if (ok && instructions) {
        json_t *m = json_pack("{s:s, s:s}", "role", "system", "content", instructions);
        if (!m || json_array_append_new(req->messages, m)) ok = oom(err);
    }
    if (ok && json_array_extend(req->messages, self->conversation)) ok = oom(err);
    /* reasoning.effort reaches templates that take it (gpt-oss's reasoning_effort) */
    ok = ok && em_server_read_reasoning_effort(json_object_get(root, "reasoning"), "effort", "reasoning.effort", req, err);
    ok = ok && read_tools(root, req, self, err) && read_text_format(root, req, err) &&
         em_server_read_reasoning_format(root, req, err) && em_server_read_speculative(root, req, err);
    if (ok && !(self->echo = echo_of(root, req))) ok = oom(err);
    json_decref(root);
    return ok;
}

/* ---- Output ---- */

static void item_id(char *out, size_t size, const char *prefix, const em_server_format *f, size_t index) {
    snprintf(out, size, "%s_%s_%zu", prefix, f->id, index);
}

static json_t *text_part(const char *type, const char *text, size_t len) {
    if (!strcmp(type, "output_text"))
        return json_pack("{s:s, s:o, s:[], s:[]}", "type", type, "text", em_server_json_text(text, len), "annotations", "logprobs");
    return json_pack("{s:s, s:o}", "type", type, "text", em_server_json_text(text, len));
}

static json_t *message_item(const em_server_format *f, size_t index, const char *status, const char *text, size_t len) {
    char id[128];
    item_id(id, sizeof id, "msg", f, index);
    json_t *content = status && strcmp(status, "in_progress") ? json_pack("[o]", text_part("output_text", text, len)) : json_array();
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status, "role", "assistant",
                     "content", content);
}

static json_t *reasoning_item(const em_server_format *f, size_t index, bool done, const char *text, size_t len) {
    char id[128];
    item_id(id, sizeof id, "rs", f, index);
    json_t *content = done ? json_pack("[o]", text_part("reasoning_text", text, len)) : json_array();
    return json_pack("{s:s, s:s, s:[], s:o}", "id", id, "type", "reasoning", "summary", "content", content);
}

/* The call id is the one chat completions would give call k (openai.c's scheme, choice 0). */
static json_t *call_item(const em_server_format *f, size_t index, size_t k, const char *status, const char *name,
                         const char *arguments, size_t len) {
    char id[128], call_id[128];
    item_id(id, sizeof id, "fc", f, index);
    snprintf(call_id, sizeof call_id, "call_%s_0_%zu", f->id, k);
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "function_call", "status", status, "call_id",
                     call_id, "name", name, "arguments", em_server_json_text(arguments, len));
}

/* The output items of a whole answer: its reasoning, its text (also when empty and there are no
 * calls), its calls. */
static json_t *output_of(const em_server_format *f, const em_server_choice *c) {
    json_t *output = json_array();
    const char *status = c->finish == EMBER_FINISH_LENGTH ? "incomplete" : "completed";
    if (output && c->reasoning.len)
        json_array_append_new(output, reasoning_item(f, json_array_size(output), true, c->reasoning.data, c->reasoning.len));
    if (output && (c->content.len || !c->tool_calls))
        json_array_append_new(output, message_item(f, json_array_size(output), status, c->content.data, c->content.len));
    size_t k;
    json_t *call;
    json_array_foreach(c->tool_calls, k, call) {
        const char *arguments = json_string_value(json_object_get(call, "arguments"));
        /* the last call of an answer cut by max_output_tokens may have lost its arguments' end */
        const bool last = k + 1 == json_array_size(c->tool_calls);
        json_array_append_new(output, call_item(f, json_array_size(output), k, last ? status : "completed",
                                                json_string_value(json_object_get(call, "name")), arguments,
                                                arguments ? strlen(arguments) : 0));
    }
    return output;
}

static json_t *usage_json(const em_server_usage *u) {
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t)u->prompt_tokens,
                     "input_tokens_details", "cached_tokens", (json_int_t)u->cached_tokens, "output_tokens",
                     (json_int_t)u->completion_tokens, "output_tokens_details", "reasoning_tokens", (json_int_t)u->reasoning_tokens,
                     "total_tokens", (json_int_t)(u->prompt_tokens + u->completion_tokens));
}

/* The response object: `status` in_progress (usage null), completed, incomplete or failed. */
static json_t *response_json(const responses_self *self, const em_server_format *f, const char *status, json_t *output,
                             const em_server_usage *usage, const em_server_error *error) {
    json_t *root = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:s, s:o, s:o, s:b}", "id", f->id, "object", "response",
                             "created_at", (json_int_t)f->created, "status", status, "error",
                             error ? json_pack("{s:s, s:s}", "code", "server_error", "message", error->message) : json_null(),
                             "incomplete_details",
                             !strcmp(status, "incomplete") ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null(),
                             "model", f->model, "output", output ? output : json_array(), "usage",
                             usage ? usage_json(usage) : json_null(), "store", self->store);
    if (!root) return NULL;
    json_object_update(root, self->echo);
    if (self->ignored) json_object_set(root, "ignored_tools", self->ignored);
    return root;
}

/* What this response ended, kept under its id when the request said `store`: the conversation (for
 * previous_response_id) and the output items (for item_reference). */
static void store_answer(responses_self *self, const em_server_format *f, const em_server_choice *c, json_t *output) {
    if (!self->store) return;
    json_t *message = json_pack("{s:s, s:o}", "role", "assistant", "content", em_server_json_text(c->content.data, c->content.len));
    size_t k;
    json_t *call;
    json_t *calls = c->tool_calls ? json_array() : NULL;
    json_array_foreach(c->tool_calls, k, call) {
        char call_id[128];
        snprintf(call_id, sizeof call_id, "call_%s_0_%zu", f->id, k);
        const char *arguments = json_string_value(json_object_get(call, "arguments"));
        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:O, s:o}}", "id", call_id, "type", "function", "function",
                                               "name", json_object_get(call, "name"), "arguments",
                                               em_server_arguments_object(arguments ? arguments : "")));
    }
    if (message && calls) json_object_set(message, "tool_calls", calls);
    json_decref(calls);
    /* the answer's reasoning stays with it, for the templates that keep it (gpt-oss's, before a call) */
    if (message && !em_server_set_reasoning(message, c->reasoning.data, c->reasoning.len, &(em_server_error){0})) {
        json_decref(message);
        message = NULL;
    }
    json_t *stored = message && !json_array_append_new(self->conversation, message)
                         ? json_pack("{s:O, s:O}", "messages", self->conversation, "output", output)
                         : NULL;
    if (!stored || !em_response_store_put(self->server->responses, f->id, stored))
        em_log(EM_LOG_WARN, "responses: out of memory storing %s", f->id);
    json_decref(stored);
}

static json_t *whole_response(void *p, const em_server_format *f, const em_server_choice *c, const em_server_usage *usage) {
    responses_self *self = p;
    json_t *output = output_of(f, c);
    if (output) store_answer(self, f, c, output);
    json_t *root = response_json(self, f, c->finish == EMBER_FINISH_LENGTH ? "incomplete" : "completed", output, usage, NULL);
    if (root) json_object_set_new(root, "timings", em_server_timings_json(&c->timings));
    return root;
}

/* ---- Streams ---- */

/* Writes event `type` with the fields of `data` (taken) and the next sequence_number. */
static bool event(responses_self *self, em_buf *out, const char *type, json_t *data) {
    if (!data) return false;
    json_t *head = json_pack("{s:s, s:I}", "type", type, "sequence_number", (json_int_t)self->sequence++);
    bool ok = head && !json_object_update(head, data) && em_server_sse(out, type, head);
    json_decref(head);
    json_decref(data);
    return ok;
}

static size_t open_index(const responses_self *self) {
    return json_array_size(self->output);
}

static bool stream_start(void *p, em_buf *out, const em_server_format *f, const em_server_usage *usage) {
    (void)usage;
    responses_self *self = p;
    if (!self->output && !(self->output = json_array())) return false;
    return event(self, out, "response.created", json_pack("{s:o}", "response", response_json(self, f, "in_progress", NULL, NULL, NULL))) &&
           event(self, out, "response.in_progress", json_pack("{s:o}", "response", response_json(self, f, "in_progress", NULL, NULL, NULL)));
}

/* The part an item of `kind` holds (text items), with its text so far. */
static json_t *open_part(const responses_self *self, em_answer_kind kind) {
    return text_part(kind == EM_ANSWER_REASONING ? "reasoning_text" : "output_text", self->item_text.data, self->item_text.len);
}

static bool item_event(responses_self *self, em_buf *out, const em_server_format *f, const char *type, json_t *item) {
    (void)f;
    return item && event(self, out, type, json_pack("{s:I, s:o}", "output_index", (json_int_t)open_index(self), "item", item));
}

static bool part_event(responses_self *self, em_buf *out, const char *type, const char *id, json_t *part) {
    return part && event(self, out, type, json_pack("{s:s, s:I, s:I, s:o}", "item_id", id, "output_index",
                                                    (json_int_t)open_index(self), "content_index", (json_int_t)0, "part", part));
}

/* Finishes the open item: its .done events, and it joins the output. */
static bool close_item(responses_self *self, em_buf *out, const em_server_format *f, const char *status) {
    if (!self->item_open) return true;
    self->item_open = false;
    const size_t index = open_index(self);
    const char *text = self->item_text.data ? self->item_text.data : "";
    const size_t len = self->item_text.len;
    char id[128];
    json_t *item;
    bool ok = true;
    if (self->item_kind == EM_ANSWER_CALL_BEGIN || self->item_kind == EM_ANSWER_CALL_ARGUMENTS) {
        item_id(id, sizeof id, "fc", f, index);
        size_t k = 0;
        for (size_t i = 0; i < index; i++)
            k += !strcmp(json_string_value(json_object_get(json_array_get(self->output, i), "type")), "function_call");
        item = call_item(f, index, k, status, self->call_name, text, len);
        ok = event(self, out, "response.function_call_arguments.done",
                   json_pack("{s:s, s:I, s:s, s:o}", "item_id", id, "output_index", (json_int_t)index, "name",
                             self->call_name, "arguments", em_server_json_text(text, len)));
    } else {
        const bool reasoning = self->item_kind == EM_ANSWER_REASONING;
        item_id(id, sizeof id, reasoning ? "rs" : "msg", f, index);
        item = reasoning ? reasoning_item(f, index, true, text, len) : message_item(f, index, status, text, len);
        ok = event(self, out, reasoning ? "response.reasoning_text.done" : "response.output_text.done",
                   reasoning ? json_pack("{s:s, s:I, s:I, s:o}", "item_id", id, "output_index", (json_int_t)index,
                                         "content_index", (json_int_t)0, "text", em_server_json_text(text, len))
                             : json_pack("{s:s, s:I, s:I, s:o, s:[]}", "item_id", id, "output_index", (json_int_t)index,
                                         "content_index", (json_int_t)0, "text", em_server_json_text(text, len), "logprobs")) &&
             part_event(self, out, "response.content_part.done", id, open_part(self, self->item_kind));
    }
    ok = ok && item_event(self, out, f, "response.output_item.done", json_incref(item)) &&
         !json_array_append(self->output, item);
    json_decref(item);
    self->item_text.len = 0;
    free(self->call_name);
    self->call_name = NULL;
    return ok;
}

/* Opens an item for an event of `kind` unless one of that kind is open (a call always opens one). */
static bool open_item(responses_self *self, em_buf *out, const em_server_format *f, em_answer_kind kind, const char *name,
                      size_t name_len) {
    if (self->item_open && self->item_kind == kind && kind != EM_ANSWER_CALL_BEGIN) return true;
    if (!close_item(self, out, f, "completed")) return false;
    const size_t index = open_index(self);
    self->item_open = true;
    self->item_kind = kind;
    self->item_text.len = 0;
    char id[128];
    if (kind == EM_ANSWER_CALL_BEGIN) {
        size_t k = 0;
        for (size_t i = 0; i < index; i++)
            k += !strcmp(json_string_value(json_object_get(json_array_get(self->output, i), "type")), "function_call");
        json_t *name_json = em_server_json_text(name, name_len);
        if (!name_json || !(self->call_name = strdup(json_string_value(name_json)))) {
            json_decref(name_json);
            return false;
        }
        json_decref(name_json);
        return item_event(self, out, f, "response.output_item.added", call_item(f, index, k, "in_progress", self->call_name, "", 0));
    }
    const bool reasoning = kind == EM_ANSWER_REASONING;
    item_id(id, sizeof id, reasoning ? "rs" : "msg", f, index);
    json_t *item = reasoning ? reasoning_item(f, index, false, NULL, 0) : message_item(f, index, "in_progress", NULL, 0);
    return item_event(self, out, f, "response.output_item.added", item) &&
           part_event(self, out, "response.content_part.added", id, open_part(self, kind));
}

static bool stream_answer(void *p, em_buf *out, const em_server_format *f, const em_answer_event *ev) {
    responses_self *self = p;
    char id[128];
    const size_t index = open_index(self);
    switch (ev->kind) {
    case EM_ANSWER_REASONING:
    case EM_ANSWER_CONTENT: {
        const bool reasoning = ev->kind == EM_ANSWER_REASONING;
        if (!open_item(self, out, f, ev->kind, NULL, 0) || !em_buf_append(&self->item_text, ev->text, ev->len)) return false;
        item_id(id, sizeof id, reasoning ? "rs" : "msg", f, open_index(self));
        json_t *data = json_pack("{s:s, s:I, s:I, s:o}", "item_id", id, "output_index", (json_int_t)open_index(self),
                                 "content_index", (json_int_t)0, "delta", em_server_json_text(ev->text, ev->len));
        if (data && !reasoning) json_object_set_new(data, "logprobs", json_array());
        return event(self, out, reasoning ? "response.reasoning_text.delta" : "response.output_text.delta", data);
    }
    case EM_ANSWER_CALL_BEGIN: return open_item(self, out, f, EM_ANSWER_CALL_BEGIN, ev->text, ev->len);
    case EM_ANSWER_CALL_ARGUMENTS:
        if (!self->item_open || !em_buf_append(&self->item_text, ev->text, ev->len)) return false;
        item_id(id, sizeof id, "fc", f, index);
        return event(self, out, "response.function_call_arguments.delta",
                     json_pack("{s:s, s:I, s:o}", "item_id", id, "output_index", (json_int_t)index, "delta",
                               em_server_json_text(ev->text, ev->len)));
    }
    return false;
}

static bool stream_end(void *p, em_buf *out, const em_server_format *f, const em_server_choice *c, const em_server_usage *usage) {
    responses_self *self = p;
    const bool cut = c->finish == EMBER_FINISH_LENGTH;
    if (!close_item(self, out, f, cut ? "incomplete" : "completed")) return false;
    if (open_index(self) == 0 && (!open_item(self, out, f, EM_ANSWER_CONTENT, NULL, 0) ||
                                  !close_item(self, out, f, cut ? "incomplete" : "completed")))
        return false;
    store_answer(self, f, c, self->output);
    json_t *response = response_json(self, f, cut ? "incomplete" : "completed", json_incref(self->output), usage, NULL);
    if (response) json_object_set_new(response, "timings", em_server_timings_json(&c->timings));
    return event(self, out, cut ? "response.incomplete" : "response.completed", json_pack("{s:o}", "response", response));
}

static bool stream_error(void *p, em_buf *out, const em_server_format *f, const em_server_error *err) {
    responses_self *self = p;
    return close_item(self, out, f, "incomplete") &&
           event(self, out, "response.failed",
                 json_pack("{s:o}", "response", response_json(self, f, "failed", json_incref(self->output), NULL, err)));
}

static const em_server_writer responses_writer = {
    .id_prefix = "resp_",
    .stream_type = "text/event-stream",
    .stream_start = stream_start,
    .stream_answer = stream_answer,
    .stream_end = stream_end,
    .stream_error = stream_error,
    .response = whole_response,
    .free = self_free,
};

bool em_responses_parse(const char *body, size_t len, em_response_store *store, em_server_request *req,
                        em_server_error *err) {
    responses_self *self = calloc(1, sizeof *self);
    if (!self) {
        em_server_request_init(req, EM_API_OPENAI_RESPONSES);
        return oom(err);
    }
    bool ok = parse(body, len, store, req, self, err);
    self_free(self);
    return ok;
}

struct MHD_Response *em_responses_serve(em_server *server, const char *body, size_t len, int fd, int *status) {
    em_server_request req;
    em_server_error err = {0};
    responses_self *self = calloc(1, sizeof *self);
    if (!self) {
        em_server_error_set(&err, 500, NULL, NULL, NULL, "out of memory");
        *status = 500;
        return em_server_error_response(EM_API_OPENAI_RESPONSES, &err);
    }
    self->server = server;
    if (!parse(body, len, server->responses, &req, self, &err)) {
        em_server_request_clear(&req);
        self_free(self);
        *status = err.status;
        return em_server_error_response(EM_API_OPENAI_RESPONSES, &err);
    }
    return em_server_generate_with(server, &req, &responses_writer, self, fd, status);
}
