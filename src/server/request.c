/* Shared pieces of the request parsers and formatters: errors, buffers, field readers, choices. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../grammar/grammar.h"
#include "internal.h"

bool em_server_sse(em_buf *out, const char *event, const json_t *data) {
    char *text = em_server_dump(data);
    if (!text) return false;
    bool ok = (!event || em_buf_printf(out, "event: %s\n", event)) && em_buf_printf(out, "data: %s\n\n", text);
    free(text);
    return ok;
}

void em_server_error_set(em_server_error *err, int status, const char *type, const char *code,
                         const char *param, const char *fmt, ...) {
    err->status = status;
    err->type = type;
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list args;
    va_start(args, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, args);
    va_end(args);
}

const char *em_server_error_type(em_server_api api, int status) {
    bool anthropic = api == EM_API_ANTHROPIC_MESSAGES || api == EM_API_ANTHROPIC_COUNT;
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return anthropic ? "authentication_error" : "invalid_request_error";
    case 403: return anthropic ? "permission_error" : "invalid_request_error";
    case 404: return anthropic ? "not_found_error" : "invalid_request_error";
    case 405: return "invalid_request_error";
    case 413: return anthropic ? "request_too_large" : "invalid_request_error";
    case 429: return anthropic ? "rate_limit_error" : "rate_limit_exceeded";
    case 501: return "invalid_request_error"; /* a request this server cannot read (Transfer-Encoding) */
    case 503: return anthropic ? "overloaded_error" : "server_error";
    default: return anthropic ? "api_error" : "server_error";
    }
}

char *em_server_error_body(em_server_api api, const em_server_error *err) {
    const char *type = err->type ? err->type : em_server_error_type(api, err->status);
    json_t *body;
    /* Messages quote the request (and are cut at 512 bytes), so they may hold broken UTF-8. */
    json_t *message = em_server_json_text(err->message, strlen(err->message));
    if (api == EM_API_ANTHROPIC_MESSAGES || api == EM_API_ANTHROPIC_COUNT) {
        body = json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", type, "message", message);
    } else if (api == EM_API_OLLAMA) {
        body = json_pack("{s:o}", "error", message);
    } else {
        body = json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", message, "type", type, "param",
                         err->param[0] ? em_server_json_text(err->param, strlen(err->param)) : json_null(), "code",
                         err->code ? json_string(err->code) : json_null());
    }
    if (!body) return NULL;
    char *text = em_server_dump(body);
    json_decref(body);
    return text;
}

/* ---- JSON helpers ---- */

/* Copies `text` replacing every invalid UTF-8 sequence with U+FFFD, so jansson accepts it. */
json_t *em_server_json_text(const char *text, size_t len) {
    json_t *s = json_stringn(text ? text : "", text ? len : 0);
    if (s) return s;
    em_buf clean = {0};
    const unsigned char *p = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        unsigned char c = p[i];
        size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = need > 0 && i + need <= len && c != 0;
        for (size_t k = 1; ok && k < need; k++) ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && need > 1) {
            /* reject overlong forms, surrogates and values past U+10FFFF, as jansson does */
            uint32_t cp = need == 2 ? (c & 0x1Fu) : need == 3 ? (c & 0x0Fu) : (c & 0x07u);
            for (size_t k = 1; k < need; k++) cp = (cp << 6) | (p[i + k] & 0x3Fu);
            ok = (need == 2 && cp >= 0x80) || (need == 3 && cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) ||
                 (need == 4 && cp >= 0x10000 && cp <= 0x10FFFF);
        }
        if (ok) {
            if (!em_buf_append(&clean, p + i, need)) goto fail;
            i += need;
        } else {
            if (!em_buf_append(&clean, "\xEF\xBF\xBD", 3)) goto fail;
            i++;
        }
    }
    s = json_stringn(clean.data ? clean.data : "", clean.len);
fail:
    em_buf_free(&clean);
    return s;
}

/* Nine significant digits print every float exactly and keep timings readable. */
char *em_server_dump(const json_t *value) {
    return json_dumps(value, JSON_COMPACT | JSON_REAL_PRECISION(9));
}

double em_server_finite(double x) {
    return isfinite(x) ? x : -9999.0;
}

static double finite_or_zero(double x) {
    return isfinite(x) ? x : 0.0;
}

json_t *em_server_timings_json(const ember_timings *t) {
    /* draft_n and draft_n_accepted: llama-server's names for the speculative decoding counts. */
    /* cache_ram_n, cache_disk_n, cache_restore_ms: of cached_tokens, those restored from the prefix
     * cache's lower tiers, and the restore's time. */
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "queued_ms",
                     finite_or_zero(t->queued_ms),
                     "prefill_ms", finite_or_zero(t->prefill_ms), "first_token_ms", finite_or_zero(t->first_token_ms),
                     "decode_ms", finite_or_zero(t->decode_ms), "decode_tokens_per_second",
                     finite_or_zero(t->decode_tokens_per_second),
                     "prompt_tokens", (json_int_t)t->prompt_tokens, "cached_tokens",
                     (json_int_t)t->cached_tokens, "generated_tokens", (json_int_t)t->generated_tokens, "draft_n",
                     (json_int_t)t->draft_tokens, "draft_n_accepted", (json_int_t)t->draft_accepted, "cache_ram_n",
                     (json_int_t)t->ram_tokens, "cache_disk_n", (json_int_t)t->disk_tokens, "cache_restore_ms",
                     finite_or_zero(t->restore_ms));
}

/* ---- Field readers: absent fields keep their default; wrong types and ranges are 400s. ---- */

static bool type_error(em_server_error *err, const char *key, const char *what) {
    em_server_error_set(err, 400, NULL, "invalid_type", key, "'%s' must be %s", key, what);
    return false;
}

/* Members sent as JSON null are treated as absent, as both APIs document for optional fields. */
static json_t *member(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

bool em_server_read_number(const json_t *obj, const char *key, double min, double max, double *out,
                           em_server_error *err) {
    json_t *v = member(obj, key);
    if (!v) return true;
    if (!json_is_number(v)) return type_error(err, key, "a number");
    double x = json_number_value(v);
    if (!(x >= min && x <= max)) {
        em_server_error_set(err, 400, NULL, "invalid_value", key, "'%s' must be between %g and %g, got %g",
                            key, min, max, x);
        return false;
    }
    *out = x;
    return true;
}

bool em_server_read_int(const json_t *obj, const char *key, int64_t min, int64_t max, int64_t *out,
                        em_server_error *err) {
    json_t *v = member(obj, key);
    if (!v) return true;
    /* 3.0 is an integer to a JavaScript client; accept integral reals too */
    double d = json_is_real(v) ? json_real_value(v) : 0;
    if (!json_is_integer(v) && !(json_is_real(v) && d == floor(d) && fabs(d) < 9e15))
        return type_error(err, key, "an integer");
    int64_t x = json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)d;
    if (x < min || x > max) {
        em_server_error_set(err, 400, NULL, "invalid_value", key,
                            "'%s' must be between %lld and %lld, got %lld", key, (long long)min,
                            (long long)max, (long long)x);
        return false;
    }
    *out = x;
    return true;
}

bool em_server_read_bool(const json_t *obj, const char *key, bool *out, em_server_error *err) {
    json_t *v = member(obj, key);
    if (!v) return true;
    if (!json_is_boolean(v)) return type_error(err, key, "a boolean");
    *out = json_is_true(v);
    return true;
}

bool em_server_read_speculative(const json_t *obj, em_server_request *req, em_server_error *err) {
    json_t *v = member(obj, "speculative");
    if (json_is_boolean(v)) {
        req->speculative = json_is_true(v) ? EMBER_SPEC_DEFAULT : EMBER_SPEC_OFF;
    } else if (json_is_string(v)) {
        const char *mode = json_string_value(v);
        if (!strcmp(mode, "off")) req->speculative = EMBER_SPEC_OFF;
        else if (!strcmp(mode, "lookup")) req->speculative = EMBER_SPEC_LOOKUP;
        else if (!strcmp(mode, "draft")) req->speculative = EMBER_SPEC_DRAFT;
        else {
            em_server_error_set(err, 400, NULL, "invalid_value", "speculative",
                                "'speculative' must be false, true, \"off\", \"lookup\" or \"draft\", not \"%s\"", mode);
            return false;
        }
    } else if (v) {
        return type_error(err, "speculative", "a boolean or one of \"off\", \"lookup\", \"draft\"");
    }
    int64_t n_max = -1;
    if (!em_server_read_int(obj, "speculative.n_max", 0, INT_MAX, &n_max, err)) return false;
    if (n_max == 0) req->speculative = EMBER_SPEC_OFF;
    return true;
}

bool em_server_set_template_variable(em_server_request *req, const char *name, json_t *value, em_server_error *err) {
    if (!value || (!req->template_kwargs && !(req->template_kwargs = json_object())) ||
        json_object_set_new(req->template_kwargs, name, value)) {
        json_decref(value);
        em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
        return false;
    }
    return true;
}

bool em_server_read_reasoning_effort(const json_t *obj, const char *key, const char *param, em_server_request *req,
                                     em_server_error *err) {
    json_t *v = member(obj, key);
    if (!v) return true;
    /* OpenAI's grades, and the three that reasoning templates know (gpt-oss: low, medium, high) */
    static const char *const given[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    static const char *const known[] = {"low", "low", "low", "medium", "high", "high"};
    const char *effort = json_string_value(v);
    for (size_t i = 0; effort && i < sizeof given / sizeof given[0]; i++)
        if (!strcmp(effort, given[i])) return em_server_set_template_variable(req, "reasoning_effort", json_string(known[i]), err);
    em_server_error_set(err, 400, NULL, "invalid_value", param, "'%s' must be one of none, minimal, low, medium, high, xhigh",
                        param);
    return false;
}

/* A string field; NULL stays NULL when absent. */
bool em_server_read_string(const json_t *obj, const char *key, const char **out, em_server_error *err) {
    json_t *v = member(obj, key);
    if (!v) return true;
    if (!json_is_string(v)) return type_error(err, key, "a string");
    *out = json_string_value(v);
    return true;
}

static bool add_stop(em_server_request *req, const char *key, const json_t *s, em_server_error *err) {
    if (!json_is_string(s)) return type_error(err, key, "a string or an array of strings");
    if (json_string_length(s) == 0) return true; /* an empty stop string would end at once */
    if (req->n_stop == EM_SERVER_MAX_STOP) {
        em_server_error_set(err, 400, NULL, "invalid_value", key, "'%s' has more than %d strings", key,
                            EM_SERVER_MAX_STOP);
        return false;
    }
    char *copy = strndup(json_string_value(s), json_string_length(s));
    if (!copy) {
        em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
        return false;
    }
    req->stop[req->n_stop++] = copy;
    return true;
}

/* `stop` (OpenAI: string or array) and `stop_sequences` (Anthropic: array). */
bool em_server_read_stops(const json_t *obj, const char *key, bool allow_string, em_server_request *req,
                          em_server_error *err) {
    json_t *v = member(obj, key);
    if (!v) return true;
    if (!req->stop && !(req->stop = calloc(EM_SERVER_MAX_STOP, sizeof *req->stop))) {
        em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
        return false;
    }
    if (json_is_string(v) && allow_string) return add_stop(req, key, v, err);
    if (!json_is_array(v))
        return type_error(err, key, allow_string ? "a string or an array of strings" : "an array of strings");
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!add_stop(req, key, s, err)) return false;
    }
    return true;
}

/* Message content: a string, or an array of text blocks ({type: "text", text}) joined by "\n".
 * Other block kinds (images, tools) are not supported by a text model: 400. */
bool em_server_read_content(const json_t *content, const char *param, em_buf *text, em_server_error *err) {
    if (json_is_string(content))
        return em_buf_append(text, json_string_value(content), json_string_length(content)) ||
               (em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory"), false);
    if (!json_is_array(content)) {
        em_server_error_set(err, 400, NULL, "invalid_type", param, "'%s' must be a string or an array of content blocks",
                            param);
        return false;
    }
    size_t i;
    json_t *block;
    json_array_foreach(content, i, block) {
        const char *type = json_string_value(json_object_get(block, "type"));
        json_t *t = json_object_get(block, "text");
        if (!json_is_object(block) || !type) {
            em_server_error_set(err, 400, NULL, "invalid_type", param, "'%s[%zu]' must be an object with a 'type'",
                                param, i);
            return false;
        }
        if (strcmp(type, "text") != 0) {
            em_server_error_set(err, 400, NULL, "unsupported_content", param,
                                "'%s[%zu]': content blocks of type '%s' are not supported (text only)", param,
                                i, type);
            return false;
        }
        if (!json_is_string(t)) {
            em_server_error_set(err, 400, NULL, "invalid_type", param, "'%s[%zu].text' must be a string", param, i);
            return false;
        }
        if ((i > 0 && !em_buf_append(text, "\n", 1)) ||
            !em_buf_append(text, json_string_value(t), json_string_length(t))) {
            em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
            return false;
        }
    }
    return true;
}

/* Appends {role, content} to req->messages. */
bool em_server_add_message(em_server_request *req, const char *role, const em_buf *text, em_server_error *err) {
    json_t *m = json_pack("{s:s, s:o}", "role", role, "content",
                          json_stringn(text->data ? text->data : "", text->len));
    if (!m || json_array_append_new(req->messages, m) != 0) {
        em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
        return false;
    }
    return true;
}

bool em_server_set_reasoning(json_t *message, const char *text, size_t len, em_server_error *err) {
    if (!len) return true;
    json_t *value = json_stringn(text, len);
    if (!value || json_object_set(message, "reasoning_content", value) || json_object_set(message, "thinking", value)) {
        json_decref(value);
        em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
        return false;
    }
    json_decref(value);
    return true;
}

json_t *em_server_parse_body(const char *body, size_t len, em_server_error *err) {
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) {
        em_server_error_set(err, 400, NULL, "invalid_json", NULL,
                            "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                            jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        em_server_error_set(err, 400, NULL, "invalid_json", NULL, "the body must be a JSON object");
        return NULL;
    }
    return root;
}

/* ---- Requests ---- */

void em_server_request_init(em_server_request *req, em_server_api api) {
    memset(req, 0, sizeof *req);
    req->api = api;
    req->n = 1;
    /* The program's one default temperature, ember_request_default's and the command line's (0.8, as
     * llama.cpp's server and Ollama sample); the candidate filters stay off, as the APIs document. */
    req->sampling.temperature = 0.8f;
    req->sampling.top_k = 0;
    req->sampling.top_p = 1.0f;
    req->sampling.min_p = 0.0f;
    req->sampling.repeat_penalty = 1.0f;
    req->sampling.repeat_last_n = 64;
}

void em_server_request_clear(em_server_request *req) {
    free(req->model);
    json_decref(req->messages);
    for (size_t i = 0; i < req->n_prompts; i++) {
        free(req->prompts[i].text);
        free(req->prompts[i].ids);
    }
    free(req->prompts);
    for (size_t i = 0; i < req->n_stop; i++) free(req->stop[i]);
    free(req->stop);
    free(req->logit_bias);
    free(req->grammar);
    free(req->grammar_schema);
    em_grammar_free(req->compiled_grammar);
    json_decref(req->tools);
    free(req->tool_name);
    json_decref(req->template_kwargs);
    memset(req, 0, sizeof *req);
}

/* ---- Choices ---- */

void em_server_choice_clear(em_server_choice *choice) {
    em_buf_free(&choice->text);
    em_buf_free(&choice->content);
    em_buf_free(&choice->reasoning);
    free(choice->tokens);
    free(choice->stop_string);
    json_decref(choice->tool_calls);
    memset(choice, 0, sizeof *choice);
}

bool em_server_choice_add(em_server_choice *choice, const ember_output *out, bool keep_tokens) {
    if (out->text_len && !em_buf_append(&choice->text, out->text, out->text_len)) return false;
    if (keep_tokens && out->n_tokens) {
        if (choice->n_tokens + out->n_tokens > choice->cap_tokens) {
            size_t cap = choice->cap_tokens ? choice->cap_tokens : 16;
            while (cap < choice->n_tokens + out->n_tokens) cap *= 2;
            em_server_token *grown = realloc(choice->tokens, cap * sizeof *grown);
            if (!grown) return false;
            choice->tokens = grown;
            choice->cap_tokens = cap;
        }
        for (size_t i = 0; i < out->n_tokens; i++)
            em_server_token_from(&choice->tokens[choice->n_tokens++], &out->tokens[i]);
    }
    if (out->finish != EMBER_FINISH_NONE) {
        choice->finish = out->finish;
        if (out->stop_string && !choice->stop_string && !(choice->stop_string = strdup(out->stop_string)))
            return false;
    }
    return true;
}

void em_server_token_from(em_server_token *dst, const ember_token_out *src) {
    dst->token = src->token;
    dst->logprob = src->logprob;
    dst->n_top = src->n_top < 0 ? 0 : src->n_top > EM_SERVER_MAX_TOP ? EM_SERVER_MAX_TOP : src->n_top;
    for (int k = 0; k < dst->n_top; k++) dst->top[k] = src->top[k];
}

const char *em_openai_finish_reason(ember_finish_reason finish) {
    switch (finish) {
    case EMBER_FINISH_STOP: return "stop";
    case EMBER_FINISH_LENGTH: return "length";
    case EMBER_FINISH_CANCELLED:
    case EMBER_FINISH_ERROR: return "stop";
    default: return NULL;
    }
}

const char *em_anthropic_stop_reason(ember_finish_reason finish, const char *stop_string) {
    switch (finish) {
    case EMBER_FINISH_STOP: return stop_string ? "stop_sequence" : "end_turn";
    case EMBER_FINISH_LENGTH: return "max_tokens";
    case EMBER_FINISH_CANCELLED:
    case EMBER_FINISH_ERROR: return "end_turn";
    default: return NULL;
    }
}

bool em_server_key_matches(const char *expected, const char *given) {
    if (!expected) return true;
    if (!given) return false;
    size_t n = strlen(expected), m = strlen(given);
    /* Every byte of `expected` is compared whatever `given` holds; the loop's length depends only
     * on the secret's length, which the attacker cannot vary. */
    unsigned diff = (unsigned)(n != m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)expected[i] ^ (unsigned char)(i < m ? given[i] : 0);
    return diff == 0;
}
