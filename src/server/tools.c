/* Tool calls on both APIs: reading tool definitions, tool choices and the tool parts of a
 * conversation into the OpenAI-style shapes chat templates know (`tools`, assistant `tool_calls`
 * with arguments as objects, `tool` messages); the grammar that forces a call when the choice is
 * required / any / a named tool; and reading calls back out of the model's text.
 *
 * The call format follows the model's template: one that teaches `<tool_call>` (Hermes, Qwen 2.5,
 * Qwen 3) gets `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`; any other gets the
 * bare JSON object {"name": ..., "arguments": ...} (the generic fallback). A forced answer is one
 * call (parallel_tool_calls is accepted; one call is a valid answer under it). With `auto` the
 * text is free and calls are found in it afterwards; in the Hermes format a lazy grammar, switched
 * on by `<tool_call>`, constrains a call once the model opens one. */
#include <stdlib.h>
#include <string.h>

#include "../grammar/grammar.h"
#include "internal.h"

static bool oom(em_server_error *err) {
    em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
    return false;
}

static bool bad(em_server_error *err, const char *param, const char *what) {
    em_server_error_set(err, 400, NULL, "invalid_value", param, "'%s' %s", param, what);
    return false;
}

/* The definition of tool `name` in req->tools, or NULL. */
static const json_t *find_tool(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && name && !strcmp(n, name)) return t;
    }
    return NULL;
}

static bool add_tool(em_server_request *req, const char *name, json_t *description, json_t *parameters,
                     const char *param, em_server_error *err) {
    if (!name || !*name) return bad(err, param, "needs a non-empty string 'name'");
    if (find_tool(req->tools, name)) return bad(err, param, "repeats a tool name");
    if (parameters && !json_is_object(parameters)) return bad(err, param, "has parameters that are not a schema object");
    json_t *function = json_pack("{s:s}", "name", name);
    if (!function) return oom(err);
    if (json_is_string(description)) json_object_set(function, "description", description);
    json_object_set_new(function, "parameters", parameters ? json_deep_copy(parameters) : json_pack("{s:s}", "type", "object"));
    return json_array_append_new(req->tools, json_pack("{s:s, s:o}", "type", "function", "function", function)) == 0 ||
           oom(err);
}

/* `tools` and `tool_choice` of a body (NULL when absent or null). False (an error set) when a
 * choice comes without tools (OpenAI's "none" aside), tools are not an array, or memory runs out;
 * true with *tools NULL when there are none, else req->tools is ready for them. */
static bool begin_tools(const json_t *root, em_server_request *req, json_t **tools, json_t **choice, em_server_error *err) {
    *tools = json_object_get(root, "tools");
    *choice = json_object_get(root, "tool_choice");
    if (json_is_null(*tools)) *tools = NULL;
    if (json_is_null(*choice)) *choice = NULL;
    if (!*tools) {
        if (*choice && !(json_is_string(*choice) && !strcmp(json_string_value(*choice), "none")))
            return bad(err, "tool_choice", "needs 'tools'");
        return true;
    }
    if (!json_is_array(*tools)) return bad(err, "tools", "must be an array");
    return (req->tools = json_array()) != NULL || oom(err);
}

bool em_server_read_openai_tools(const json_t *root, em_server_request *req, em_server_error *err) {
    json_t *tools, *choice;
    bool parallel = true;
    if (!em_server_read_bool(root, "parallel_tool_calls", &parallel, err)) return false;
    if (!begin_tools(root, req, &tools, &choice, err)) return false;
    if (!tools) return true;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char param[48];
        snprintf(param, sizeof param, "tools[%zu]", i);
        json_t *function = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type || strcmp(type, "function") || !json_is_object(function))
            return bad(err, param, "must be {\"type\": \"function\", \"function\": {...}}");
        if (!add_tool(req, json_string_value(json_object_get(function, "name")), json_object_get(function, "description"),
                      json_object_get(function, "parameters"), param, err))
            return false;
    }
    req->tool_choice = json_array_size(req->tools) ? EM_TOOL_AUTO : EM_TOOL_NONE;
    if (!choice) return true;
    const char *mode = json_string_value(choice);
    if (mode) {
        if (!strcmp(mode, "none")) req->tool_choice = EM_TOOL_NONE;
        else if (!strcmp(mode, "auto")) req->tool_choice = EM_TOOL_AUTO;
        else if (!strcmp(mode, "required")) req->tool_choice = EM_TOOL_REQUIRED;
        else return bad(err, "tool_choice", "must be none, auto, required or {\"type\": \"function\", ...}");
        return true;
    }
    const char *name = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
    if (!name) return bad(err, "tool_choice", "must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\"}}");
    if (!find_tool(req->tools, name)) return bad(err, "tool_choice", "names a tool that is not in 'tools'");
    req->tool_choice = EM_TOOL_NAMED;
    return (req->tool_name = strdup(name)) != NULL || oom(err);
}

bool em_server_read_anthropic_tools(const json_t *root, em_server_request *req, em_server_error *err) {
    json_t *tools, *choice;
    if (!begin_tools(root, req, &tools, &choice, err)) return false;
    if (!tools) return true;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char param[48];
        snprintf(param, sizeof param, "tools.%zu", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || (type && strcmp(type, "custom")))
            return bad(err, param, "must be a custom tool {name, description, input_schema} (server tools are not supported)");
        json_t *schema = json_object_get(t, "input_schema");
        if (!json_is_object(schema)) return bad(err, param, "needs an 'input_schema' object");
        if (!add_tool(req, json_string_value(json_object_get(t, "name")), json_object_get(t, "description"), schema, param, err))
            return false;
    }
    req->tool_choice = json_array_size(req->tools) ? EM_TOOL_AUTO : EM_TOOL_NONE;
    if (!choice) return true;
    const char *mode = json_string_value(json_object_get(choice, "type"));
    if (!json_is_object(choice) || !mode) return bad(err, "tool_choice", "must be an object with a 'type'");
    if (!strcmp(mode, "none")) req->tool_choice = EM_TOOL_NONE;
    else if (!strcmp(mode, "auto")) req->tool_choice = EM_TOOL_AUTO;
    else if (!strcmp(mode, "any")) req->tool_choice = EM_TOOL_REQUIRED;
    else if (!strcmp(mode, "tool")) {
        const char *name = json_string_value(json_object_get(choice, "name"));
        if (!find_tool(req->tools, name)) return bad(err, "tool_choice", "names a tool that is not in 'tools'");
        req->tool_choice = EM_TOOL_NAMED;
        if (!(req->tool_name = strdup(name))) return oom(err);
    } else {
        return bad(err, "tool_choice.type", "must be auto, any, tool or none");
    }
    return true;
}

json_t *em_server_arguments_object(const char *text) {
    json_t *value = json_loads(text, JSON_DECODE_ANY, NULL);
    if (json_is_object(value)) return value;
    json_decref(value);
    return json_string(text); /* not an object: handed to the template as it came */
}

/* ---- The forcing grammar ---- */

/* {"name": NAME, "arguments": PARAMETERS} for one tool, as a JSON schema. */
static json_t *call_schema(const json_t *tool) {
    json_t *function = json_object_get(tool, "function");
    return json_pack("{s:s, s:{s:{s:O}, s:O}, s:[s, s], s:b}", "type", "object", "properties", "name", "const",
                     json_object_get(function, "name"), "arguments", json_object_get(function, "parameters"),
                     "required", "name", "arguments", "additionalProperties", 0);
}

bool em_server_tool_grammar(em_server_request *req, em_tool_format format, em_server_error *err) {
    /* auto: with a call format that opens with a marker, a lazy grammar that constrains the call
     * once the model starts one (free text before it stays free); otherwise nothing */
    const bool lazy = req->tool_choice == EM_TOOL_AUTO && format == EM_TOOL_FORMAT_HERMES && !req->grammar;
    if (req->tool_choice != EM_TOOL_REQUIRED && req->tool_choice != EM_TOOL_NAMED && !lazy) return true;
    if (req->grammar) return bad(err, "tool_choice", "cannot force a tool call together with response_format or grammar");
    if (lazy) req->grammar_trigger = "<tool_call>";
    json_t *schema;
    if (req->tool_choice == EM_TOOL_NAMED) {
        schema = call_schema(find_tool(req->tools, req->tool_name));
    } else {
        json_t *choices = json_array();
        size_t i;
        json_t *t;
        json_array_foreach(req->tools, i, t) json_array_append_new(choices, call_schema(t));
        schema = json_pack("{s:o}", "anyOf", choices);
    }
    char *text = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
    json_decref(schema);
    if (!text) return oom(err);
    char *gbnf = NULL;
    em_err e = em_grammar_from_json_schema(text, strlen(text), &gbnf);
    free(text);
    if (e) {
        em_server_error_set(err, 400, NULL, "invalid_value", "tools", "tool parameters: %s", em_err_message(e));
        em_err_free(e);
        return false;
    }
    if (format == EM_TOOL_FORMAT_HERMES) { /* the schema's root becomes the call inside the tags */
        char *root = strstr(gbnf, "root ::= ");
        while (root && root != gbnf && root[-1] != '\n') root = strstr(root + 1, "root ::= ");
        char *wrapped = NULL;
        if (root && asprintf(&wrapped, "root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n%.*scall ::= %s",
                             (int)(root - gbnf), gbnf, root + strlen("root ::= ")) < 0)
            wrapped = NULL;
        free(gbnf);
        if (!wrapped) return oom(err);
        gbnf = wrapped;
    }
    return em_server_set_grammar(req, gbnf, "tools", err);
}

/* ---- Reading calls back ---- */

/* A call object {"name", "arguments"} naming a tool of the request, as {name, arguments}. */
static json_t *read_call(const json_t *tools, json_t *value) {
    const char *name = json_string_value(json_object_get(value, "name"));
    json_t *arguments = json_object_get(value, "arguments");
    if (!arguments) arguments = json_object_get(value, "parameters");
    if (!name || !find_tool(tools, name)) return NULL;
    if (json_is_string(arguments)) arguments = em_server_arguments_object(json_string_value(arguments));
    else if (json_is_object(arguments)) json_incref(arguments);
    else return NULL;
    if (!json_is_object(arguments)) {
        json_decref(arguments);
        return NULL;
    }
    return json_pack("{s:s, s:o}", "name", name, "arguments", arguments);
}

static json_t *load_trimmed(const char *text, size_t len) {
    while (len && strchr(" \t\r\n", *text)) text++, len--;
    while (len && strchr(" \t\r\n", text[len - 1])) len--;
    return len ? json_loadb(text, len, JSON_DECODE_ANY, NULL) : NULL;
}

json_t *em_server_parse_tool_calls(const char *text, size_t len, em_tool_format format, const json_t *tools,
                                   size_t *content_len) {
    json_t *calls = json_array();
    if (!calls) return NULL;
    *content_len = len;
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const char *at = format == EM_TOOL_FORMAT_HERMES ? memmem(text, len, open, strlen(open)) : NULL;
    if (at) *content_len = (size_t)(at - text);
    while (at) { /* Hermes: every tagged call; an unclosed last one runs to the end */
        const char *body = at + strlen(open), *end = memmem(body, len - (size_t)(body - text), close, strlen(close));
        json_t *value = load_trimmed(body, end ? (size_t)(end - body) : len - (size_t)(body - text));
        json_t *call = read_call(tools, value);
        json_decref(value);
        if (call) json_array_append_new(calls, call);
        at = end ? memmem(end, len - (size_t)(end - text), open, strlen(open)) : NULL;
    }
    if (format != EM_TOOL_FORMAT_HERMES) { /* the whole answer is a call or a list of calls */
        json_t *value = load_trimmed(text, len);
        json_t *list = json_is_array(value) ? value : NULL;
        size_t i;
        json_t *item;
        if (list) {
            json_array_foreach(list, i, item) {
                json_t *call = read_call(tools, item);
                if (call) json_array_append_new(calls, call);
            }
        } else if (value) {
            json_t *call = read_call(tools, value);
            if (call) json_array_append_new(calls, call);
        }
        json_decref(value);
        if (json_array_size(calls)) *content_len = 0;
    }
    if (!json_array_size(calls)) {
        json_decref(calls);
        *content_len = len;
        return NULL;
    }
    return calls;
}
