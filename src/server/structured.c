/* Structured output: the request fields that constrain an answer to a grammar (OpenAI's
 * `response_format`, llama-server's raw `grammar`), turned into the GBNF the engine follows
 * (src/grammar). A schema or grammar that cannot be compiled is a 400 with the compiler's reason,
 * found here at parse time rather than at submission: a syntax error, nesting or size past the
 * grammar's limits (grammar.h, schema.h), or a grammar too ambiguous to follow from its start. The
 * grammar is compiled once, here; the engine takes the compiled form (generate.c). */
#include <stdlib.h>
#include <string.h>

#include "../grammar/grammar.h"
#include "internal.h"

/* Takes `gbnf` (malloc'd) as the request's grammar once it compiles, with its compiled form. */
bool em_server_set_grammar(em_server_request *req, char *gbnf, const char *param, em_server_error *err) {
    em_grammar *g = NULL;
    em_err e = em_grammar_compile_checked(gbnf, strlen(gbnf), &g);
    if (e && em_err_code_of(e) == EM_ERR_NOMEM) {
        em_server_error_set(err, 503, NULL, NULL, NULL, "'%s': %s", param, em_err_message(e));
        em_err_free(e);
        free(gbnf);
        return false;
    }
    if (e) {
        em_server_error_set(err, 400, NULL, "invalid_value", param, "'%s': %s", param, em_err_message(e));
        em_err_free(e);
        free(gbnf);
        return false;
    }
    free(req->grammar);
    em_grammar_free(req->compiled_grammar);
    req->grammar = gbnf;
    req->compiled_grammar = g;
    return true;
}

bool em_server_grammar_from_schema(em_server_request *req, const json_t *schema, const char *param, em_server_error *err) {
    char *text = schema ? json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if (schema && !text) {
        em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
        return false;
    }
    char *gbnf = NULL;
    em_err e = em_grammar_from_json_schema(text, text ? strlen(text) : 0, &gbnf);
    free(text);
    if (e) {
        em_server_error_set(err, 400, NULL, "invalid_value", param, "'%s': %s", param, em_err_message(e));
        em_err_free(e);
        return false;
    }
    return em_server_set_grammar(req, gbnf, param, err);
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
