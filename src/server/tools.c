/* Tool calls on both APIs: reading tool definitions, tool choices and the tool parts of a
 * conversation into the OpenAI-style shapes chat templates know (`tools`, assistant `tool_calls`
 * with arguments as objects, `tool` messages). The grammars that constrain calls are in
 * tool_grammar.c; reading calls out of the model's text is answer.c's. The call format a model writes is
 * told by its chat template (em_server_tool_format_of). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static bool oom(em_server_error *err) {
    em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
    return false;
}

static bool bad(em_server_error *err, const char *param, const char *what) {
    em_server_error_set(err, 400, NULL, "invalid_value", param, "'%s' %s", param, what);
    return false;
}

const json_t *em_server_find_tool(const json_t *tools, const char *name) {
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
    if (em_server_find_tool(req->tools, name)) return bad(err, param, "repeats a tool name");
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
    if (!em_server_find_tool(req->tools, name)) return bad(err, "tool_choice", "names a tool that is not in 'tools'");
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
        if (!em_server_find_tool(req->tools, name)) return bad(err, "tool_choice", "names a tool that is not in 'tools'");
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

em_tool_format em_server_tool_format_of(const char *template_text, size_t len) {
#define HAS(s) (memmem(template_text, len, s, strlen(s)) != NULL)
    if (!template_text) return EM_TOOL_FORMAT_JSON;
    /* harmony: every message's header names its channel before the body */
    if (HAS("<|channel|>") && HAS("<|message|>") && HAS("<|start|>")) return EM_TOOL_FORMAT_HARMONY;
    /* Gemma 4: calls written back as <|tool_call>call:NAME{...} (its thoughts come with it) */
    if (HAS("<|tool_call>call:")) return EM_TOOL_FORMAT_GEMMA4;
    if (HAS("[TOOL_CALLS]")) return HAS("[ARGS]") ? EM_TOOL_FORMAT_MISTRAL_ARGS : EM_TOOL_FORMAT_MISTRAL;
    if (HAS("<tool_call>")) return EM_TOOL_FORMAT_HERMES;
    /* Llama 3.x: calls written back as {"name": ..., "parameters": ...} between its header tokens */
    if (HAS("<|python_tag|>") || (HAS("<|start_header_id|>") && HAS("\"parameters\""))) return EM_TOOL_FORMAT_LLAMA3;
    return EM_TOOL_FORMAT_JSON;
#undef HAS
}
