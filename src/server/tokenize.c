/* /tokenize and /detokenize, with the fields and defaults of llama.cpp's server, so that tools made
 * for it (benchmarks counting prompt tokens, front ends showing token counts) work unchanged:
 *
 *   POST /tokenize   {content, add_special = false, parse_special = true, with_pieces = false}
 *                    → {tokens: [id, ...]}, or with pieces {tokens: [{id, piece}, ...]}
 *   POST /detokenize {tokens: [id, ...]} → {content}
 *
 * `content` is a string, or an array of strings and token ids taken in order (a string first in the
 * array gets the special tokens of add_special, the others none). A piece is the token's text, or
 * its bytes as numbers when they are not whole UTF-8 (a character split across tokens). The text
 * of /detokenize is the tokens' pieces one after the other, control tokens spelled out; bytes that
 * do not make UTF-8 become U+FFFD. Both go through the model's own tokenizer (the engine's), never
 * the engine thread, so they answer while generation runs. Errors are OpenAI's, naming the field. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static bool bad(em_server_error *err, const char *param, const char *message) {
    em_server_error_set(err, 400, NULL, "invalid_value", param, "%s: %s", param, message);
    return false;
}

/* A token id of `param` checked against the model's ids. */
static bool read_id(const json_t *value, const char *param, int32_t n_vocab, int32_t *id, em_server_error *err) {
    if (!json_is_integer(value)) return bad(err, param, "must be a token id (an integer)");
    json_int_t v = json_integer_value(value);
    if (v < 0 || v >= n_vocab) {
        em_server_error_set(err, 400, NULL, "invalid_value", param, "%s: token id %lld is outside the model's ids 0..%d",
                            param, (long long)v, (int)n_vocab - 1);
        return false;
    }
    *id = (int32_t)v;
    return true;
}

static bool append_ids(int32_t **ids, size_t *n, size_t *cap, const int32_t *more, size_t k, em_server_error *err) {
    if (*n + k > *cap) {
        size_t grown = (*n + k) * 2 + 16;
        int32_t *bigger = realloc(*ids, grown * sizeof *bigger);
        if (!bigger) {
            em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
            return false;
        }
        *ids = bigger;
        *cap = grown;
    }
    if (k) memcpy(*ids + *n, more, k * sizeof *more);
    *n += k;
    return true;
}

static bool tokenize_text(const em_server_engine *engine, const json_t *text, bool add_special, bool parse_special,
                          const char *param, int32_t **ids, size_t *n, size_t *cap, em_server_error *err) {
    int32_t *part = NULL;
    size_t k = 0;
    em_err e = engine->tokenize(engine->self, json_string_value(text), json_string_length(text), add_special,
                                parse_special, &part, &k);
    if (e) {
        em_server_error_set(err, em_err_code_of(e) == EM_ERR_NOMEM ? 500 : 400, NULL, "invalid_value", param, "%s: %s",
                            param, em_err_message(e));
        em_err_free(e);
        return false;
    }
    bool ok = append_ids(ids, n, cap, part, k, err);
    free(part);
    return ok;
}

/* `content` into ids (malloc'd). */
static bool content_ids(const em_server_engine *engine, const json_t *root, int32_t **ids, size_t *n, em_server_error *err) {
    bool add_special = false, parse_special = true;
    if (!em_server_read_bool(root, "add_special", &add_special, err) ||
        !em_server_read_bool(root, "parse_special", &parse_special, err))
        return false;
    const json_t *content = json_object_get(root, "content");
    size_t cap = 0;
    if (!content || json_is_null(content)) return true;
    if (json_is_string(content))
        return tokenize_text(engine, content, add_special, parse_special, "content", ids, n, &cap, err);
    if (!json_is_array(content)) return bad(err, "content", "must be a string, or an array of strings and token ids");
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        char param[48];
        snprintf(param, sizeof param, "content[%zu]", i);
        int32_t id;
        bool ok = json_is_string(part)
                      ? tokenize_text(engine, part, add_special && i == 0, parse_special, param, ids, n, &cap, err)
                      : read_id(part, param, engine->n_vocab, &id, err) && append_ids(ids, n, &cap, &id, 1, err);
        if (!ok) return false;
    }
    return true;
}

/* {id, piece}: the piece as text when it is whole UTF-8, else its bytes. */
static json_t *piece_json(const em_server_engine *engine, int32_t id) {
    const char *bytes = NULL;
    size_t len = engine->token_bytes(engine->self, id, &bytes);
    json_t *piece = json_stringn(len ? bytes : "", len); /* NULL when not UTF-8 */
    if (!piece) {
        piece = json_array();
        for (size_t k = 0; piece && k < len; k++) json_array_append_new(piece, json_integer((unsigned char)bytes[k]));
    }
    return json_pack("{s:i, s:o}", "id", (int)id, "piece", piece);
}

static json_t *tokenize(const em_server_engine *engine, const json_t *root, em_server_error *err) {
    bool with_pieces = false;
    if (!em_server_read_bool(root, "with_pieces", &with_pieces, err)) return NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    json_t *tokens = NULL;
    if (content_ids(engine, root, &ids, &n, err)) {
        tokens = json_array();
        for (size_t i = 0; tokens && i < n; i++)
            if (json_array_append_new(tokens, with_pieces ? piece_json(engine, ids[i]) : json_integer(ids[i]))) {
                json_decref(tokens);
                tokens = NULL;
            }
        if (!tokens) em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
    }
    free(ids);
    return tokens ? json_pack("{s:o}", "tokens", tokens) : NULL;
}

static json_t *detokenize(const em_server_engine *engine, const json_t *root, em_server_error *err) {
    const json_t *tokens = json_object_get(root, "tokens");
    if (tokens && !json_is_null(tokens) && !json_is_array(tokens)) {
        bad(err, "tokens", "must be an array of token ids");
        return NULL;
    }
    em_buf text = {0};
    size_t i;
    const json_t *value;
    json_array_foreach(tokens, i, value) {
        char param[48];
        snprintf(param, sizeof param, "tokens[%zu]", i);
        int32_t id;
        if (!read_id(value, param, engine->n_vocab, &id, err)) {
            em_buf_free(&text);
            return NULL;
        }
        const char *bytes = NULL;
        size_t len = engine->token_bytes(engine->self, id, &bytes);
        if (len && !em_buf_append(&text, bytes, len)) {
            em_buf_free(&text);
            em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
            return NULL;
        }
    }
    json_t *answer = json_pack("{s:o}", "content", em_server_json_text(text.data ? text.data : "", text.len));
    em_buf_free(&text);
    if (!answer) em_server_error_set(err, 500, NULL, NULL, NULL, "out of memory");
    return answer;
}

struct MHD_Response *em_tokenize_serve(em_server *server, em_server_endpoint endpoint, const char *body, size_t len,
                                       int *status) {
    em_server_error err = {0};
    json_t *root = em_server_parse_body(body, len, &err);
    json_t *answer = !root                           ? NULL
                     : endpoint == EM_EP_DETOKENIZE ? detokenize(&server->engine, root, &err)
                                                     : tokenize(&server->engine, root, &err);
    json_decref(root);
    if (!answer) {
        *status = err.status ? err.status : 500;
        if (!err.status) em_server_error_set(&err, 500, NULL, NULL, NULL, "out of memory");
        return em_server_error_response(EM_API_OPENAI_CHAT, &err);
    }
    *status = 200;
    return em_server_json_response(answer);
}
