/* Structured output: the request fields that constrain an answer to a grammar (OpenAI's
 * `response_format`, llama-server's raw `grammar`, and the other APIs' equivalents), and the making
 * of the grammar the engine follows (src/grammar).
 *
 * Reading a request only keeps the field's text: GBNF, or a schema's JSON. The grammar is made
 * once the prompt is known (the answer's grammar may wrap it in a thinking section or join it to
 * tool calls): em_server_make_grammar converts the schema, builds the answer's grammar
 * (tool_grammar.c) and compiles it, each step through the server's cache of compiled grammars
 * (so a schema or a set of tools that requests repeat is compiled once) and under a watch that
 * stops it when its client hangs up or the server stops, and refuses it past its CPU time. That
 * runs on the connection's thread, never the engine's; the engine takes the compiled form
 * (generate.c). A schema or grammar that cannot be compiled is a 400 with the compiler's reason,
 * before anything reaches the engine: a syntax error, nesting or size past the grammar's limits
 * (grammar.h, schema.h), compile time past its limit, or a grammar too ambiguous to follow from its
 * start. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

bool em_server_set_grammar(em_server_request *req, char *gbnf, const char *param, em_server_error *err) {
    (void)err;
    free(req->grammar);
    free(req->grammar_schema);
    em_grammar_free(req->compiled_grammar);
    req->grammar = gbnf;
    req->grammar_schema = NULL;
    req->compiled_grammar = NULL;
    req->grammar_param = param;
    return true;
}

bool em_server_grammar_from_schema(em_server_request *req, const json_t *schema, const char *param, em_server_error *err) {
    if (!schema) { /* any JSON object: a fixed grammar, made at once */
        char *gbnf = NULL;
        em_err e = em_grammar_from_json_schema(NULL, 0, &gbnf);
        if (e) {
            em_server_error_set(err, 503, NULL, NULL, NULL, "'%s': %s", param, em_err_message(e));
            em_err_free(e);
            return false;
        }
        return em_server_set_grammar(req, gbnf, param, err);
    }
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) {
        em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
        return false;
    }
    em_server_set_grammar(req, NULL, param, err);
    req->grammar_schema = text;
    return true;
}

bool em_server_grammar_failed(em_err e, const char *param, em_server_error *err) {
    const em_err_code code = em_err_code_of(e);
    if (code == EM_ERR_IO || code == EM_ERR_NOMEM) { /* stopped (the client is gone, the server stops), or no memory */
        em_server_error_set(err, 503, NULL, NULL, NULL, "'%s': %s", param, em_err_message(e));
    } else {
        em_server_error_set(err, 400, NULL, "invalid_value", param, "'%s': %s", param, em_err_message(e));
    }
    em_err_free(e);
    return false;
}

bool em_server_schema_grammar(em_server_request *req, const em_server_grammar_maker *maker, em_server_error *err) {
    if (!req->grammar_schema) return true;
    char *gbnf = NULL;
    em_err e = em_grammar_cache_schema(maker->cache, req->grammar_schema, strlen(req->grammar_schema), maker->watch, &gbnf);
    if (e) return em_server_grammar_failed(e, req->grammar_param, err);
    free(req->grammar_schema);
    req->grammar_schema = NULL;
    free(req->grammar);
    req->grammar = gbnf;
    return true;
}

bool em_server_make_grammar(em_server_request *req, const em_server_grammar_maker *maker, em_tool_format format,
                            bool reasons, bool in_thinking, em_server_error *err) {
    if (!em_server_answer_grammar(req, maker, format, reasons, in_thinking, err)) return false;
    if (!req->grammar || req->compiled_grammar) return true;
    em_err e = em_grammar_cache_compile(maker->cache, req->grammar, strlen(req->grammar), maker->watch, &req->compiled_grammar);
    return !e || em_server_grammar_failed(e, req->grammar_param ? req->grammar_param : "grammar", err);
}

/* response_format: {"type": "text"} (nothing), {"type": "json_object"} (any JSON object), or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: the answer follows the
 * schema whether or not `strict` is set (Ember never produces output outside a given schema). */
static bool read_response_format(const json_t *root, em_server_request *req, em_server_error *err) {
    json_t *format = json_object_get(root, "response_format");
    if (!format || json_is_null(format)) return true;
    const char *type = json_string_value(json_object_get(format, "type"));
    if (!json_is_object(format) || !type) {
        em_server_error_set(err, 400, NULL, "invalid_type", "response_format",
                            "'response_format' must be an object with a string 'type'");
        return false;
    }
    if (!strcmp(type, "text")) return true;
    if (!strcmp(type, "json_object")) return em_server_grammar_from_schema(req, NULL, "response_format", err);
    if (strcmp(type, "json_schema") != 0) {
        em_server_error_set(err, 400, NULL, "invalid_value", "response_format.type",
                            "'response_format.type' '%s' is not one of text, json_object, json_schema", type);
        return false;
    }
    json_t *spec = json_object_get(format, "json_schema");
    json_t *schema = json_object_get(spec, "schema");
    json_t *strict = json_object_get(spec, "strict");
    if (!json_is_object(spec) || !json_is_string(json_object_get(spec, "name"))) {
        em_server_error_set(err, 400, NULL, "missing_required_parameter", "response_format.json_schema",
                            "'response_format.json_schema' must be an object with a string 'name'");
        return false;
    }
    if (strict && !json_is_null(strict) && !json_is_boolean(strict)) {
        em_server_error_set(err, 400, NULL, "invalid_type", "response_format.json_schema.strict",
                            "'response_format.json_schema.strict' must be a boolean");
        return false;
    }
    /* Without a schema the answer is any JSON value, as OpenAI documents. */
    json_t *any = schema ? NULL : json_object();
    bool ok = em_server_grammar_from_schema(req, schema ? schema : any, "response_format.json_schema.schema", err);
    json_decref(any);
    return ok;
}

bool em_server_read_constraints(const json_t *root, em_server_request *req, em_server_error *err) {
    const char *grammar = NULL;
    if (!em_server_read_string(root, "grammar", &grammar, err)) return false;
    json_t *format = json_object_get(root, "response_format");
    const char *type = json_string_value(json_object_get(format, "type"));
    if (grammar && type && strcmp(type, "text") != 0) {
        em_server_error_set(err, 400, NULL, "invalid_value", "grammar", "'grammar' and 'response_format' %s exclude each other", type);
        return false;
    }
    if (grammar) {
        char *copy = strdup(grammar);
        if (!copy) {
            em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
            return false;
        }
        req->grammar_is_raw = true;
        return em_server_set_grammar(req, copy, "grammar", err);
    }
    return read_response_format(root, req, err);
}

bool em_server_read_reasoning_format(const json_t *root, em_server_request *req, em_server_error *err) {
    const char *format = NULL;
    if (!em_server_read_string(root, "reasoning_format", &format, err)) return false;
    if (!format || !strcmp(format, "auto")) req->reasoning_format = EM_REASONING_FORMAT_AUTO;
    else if (!strcmp(format, "deepseek")) req->reasoning_format = EM_REASONING_FORMAT_DEEPSEEK;
    else if (!strcmp(format, "none")) req->reasoning_format = EM_REASONING_FORMAT_NONE;
    else {
        em_server_error_set(err, 400, NULL, "invalid_value", "reasoning_format",
                            "'reasoning_format' '%s' is not one of auto, deepseek, none", format);
        return false;
    }
    return true;
}
