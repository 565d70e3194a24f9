/* Reading a Gemma 4 answer as it is generated. Gemma 4's chat template teaches two kinds of markup:
 *
 *   <|channel>thought\nThe user wants the weather.<channel|>
 *   <|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:3,opts:{units:<|"|>metric<|"|>}}<tool_call|>
 *
 * A thought is reasoning (up to `<channel|>`; whitespace at either end is not part of it, nor is
 * whitespace between it and the text). A call names a tool and writes its arguments in the
 * template's own syntax (its format_argument macro): objects with bare keys, strings between `<|"|>`
 * quotes, numbers, true, false and null as JSON writes them, lists in brackets. The reader turns them
 * into JSON as they arrive, so a stream hands on argument deltas that add up to the same JSON object
 * as a whole answer's. After a call the model writes `<|tool_response>`, which ends generation.
 *
 * What the text becomes:
 *   - a thought: reasoning, anywhere in the answer (the model may write an empty one at its end);
 *     with reasoning kept inline (reasoning_format none) it is content as written, markup and all;
 *   - `<|channel>` not followed by `thought`: content as written; `<|channel>` written twice before
 *     `thought` counts once (llama.cpp's parser reads it so too);
 *   - a `<channel|>` that closes no thought: nothing (the model sometimes closes the empty thought
 *     its generation prompt already closed);
 *   - `<|tool_call>call:NAME{`, NAME a tool of the request: a call; anything else after
 *     `<|tool_call>` (an unknown tool, no `call:`, a name longer than any) is content as written;
 *   - arguments that stop making sense (a key without `:`, an end that closes nothing, nesting
 *     deeper than EM_GEMMA4_MAX_DEPTH): what was read is closed into valid JSON, the call ends, and
 *     the rest is read as text again. An answer cut short inside a call ends it the same way.
 * A bare word where a value belongs (`None`) is taken as a string: nothing the model meant is lost.
 *
 * Text that could still become a marker is held back until the next piece tells, as answer.c does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char CHANNEL_OPEN[] = "<|channel>", CHANNEL_CLOSE[] = "<channel|>", THOUGHT[] = "thought",
                  CALL_OPEN[] = "<|tool_call>", CALL_CLOSE[] = "<tool_call|>", CALL_PREFIX[] = "call:",
                  QUOTE[] = "<|\"|>", TOOL_RESPONSE[] = "<|tool_response>";

/* No tool name, key or bare value is longer: past it the text is no call (or a malformed one). */
#define WORD_MAX 256

size_t em_gemma4_markers(const char *out[EM_ANSWER_MAX_MARKERS]) {
    const char *const markers[] = {CHANNEL_OPEN, CHANNEL_CLOSE, CALL_OPEN, CALL_CLOSE, QUOTE};
    const size_t n = sizeof markers / sizeof markers[0];
    _Static_assert(5 <= EM_ANSWER_MAX_MARKERS, "the Gemma 4 markers fit");
    for (size_t i = 0; i < n; i++) out[i] = markers[i];
    return n;
}

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static size_t skip_space(const char *s, size_t n, size_t at) {
    while (at < n && is_space(s[at])) at++;
    return at;
}

/* Whether s[0..n) starts with `word`: 1 yes, 0 no, -1 it is a proper prefix of it (the next piece tells). */
static int starts_with(const char *s, size_t n, const char *word) {
    size_t m = strlen(word);
    if (memcmp(s, word, n < m ? n : m)) return 0;
    return n >= m ? 1 : -1;
}

static bool splits_reasoning(const em_answer_reader *r) {
    return r->options.split_reasoning == EM_REASONING_SPLIT;
}

/* ---- Text and thoughts ---- */

/* TEXT at held[0] == `<|channel>`: a thought opens, or the marker is text. */
static bool read_channel(em_answer_reader *r, bool finished, em_answer_sink sink, void *self, bool *progress) {
    const char *s = r->held.data;
    size_t n = r->held.len, at = strlen(CHANNEL_OPEN);
    while (starts_with(s + at, n - at, CHANNEL_OPEN) == 1) at += strlen(CHANNEL_OPEN);
    int thought = starts_with(s + at, n - at, THOUGHT);
    if (thought < 0 || starts_with(s + at, n - at, CHANNEL_OPEN) < 0) {
        if (!finished) return true; /* `thought` or another `<|channel>` may still come */
        thought = 0;
    }
    *progress = true;
    if (!thought) {
        bool ok = em_answer_emit(r, EM_ANSWER_CONTENT, s, strlen(CHANNEL_OPEN), sink, self);
        em_answer_consume(r, strlen(CHANNEL_OPEN));
        return ok;
    }
    at += strlen(THOUGHT);
    bool ok = splits_reasoning(r) || em_answer_emit(r, EM_ANSWER_CONTENT, s, at, sink, self);
    em_answer_consume(r, at);
    r->gemma4.part = EM_GEMMA4_THOUGHT;
    r->gemma4.thought_start = true;
    return ok;
}

/* TEXT: content up to the first marker; what may still become one is held back. */
static bool read_text(em_answer_reader *r, bool finished, em_answer_sink sink, void *self, bool *progress) {
    em_gemma4_reader *g = &r->gemma4;
    if (g->after_thought) {
        size_t at = skip_space(r->held.data, r->held.len, 0);
        if (at == r->held.len && !finished) return true;
        em_answer_consume(r, at);
        g->after_thought = false;
    }
    const char *s = r->held.data;
    size_t n = r->held.len;
    const char *markers[] = {CHANNEL_OPEN, CHANNEL_CLOSE, r->options.read_calls ? CALL_OPEN : NULL};
    const size_t n_markers = r->options.read_calls ? 3 : 2;
    size_t first = n, keep = 0;
    const char *found = NULL;
    for (size_t m = 0; m < n_markers; m++) {
        const char *at = memmem(s, n, markers[m], strlen(markers[m]));
        if (at && (size_t)(at - s) < first) first = (size_t)(at - s), found = markers[m];
        size_t k = em_answer_partial_suffix(s, n, markers[m]);
        if (k > keep) keep = k;
    }
    size_t upto = found ? first : n - (finished ? 0 : keep);
    if (!em_answer_emit(r, EM_ANSWER_CONTENT, s, upto, sink, self)) return false;
    em_answer_consume(r, upto);
    if (!found) return true;
    if (found == CHANNEL_OPEN) return read_channel(r, finished, sink, self, progress); /* it tells when it moved on */
    *progress = true;
    if (found == CHANNEL_CLOSE) /* it closes no thought */
        em_answer_consume(r, strlen(CHANNEL_CLOSE));
    else
        g->part = EM_GEMMA4_CALL;
    return true;
}

/* THOUGHT: reasoning up to `<channel|>`; nothing inside is a call. */
static bool read_thought(em_answer_reader *r, bool finished, em_answer_sink sink, void *self, bool *progress) {
    em_gemma4_reader *g = &r->gemma4;
    const bool split = splits_reasoning(r);
    const em_answer_kind kind = split ? EM_ANSWER_REASONING : EM_ANSWER_CONTENT;
    if (g->thought_start && split) {
        em_answer_consume(r, skip_space(r->held.data, r->held.len, 0));
        if (!r->held.len && !finished) return true;
    }
    g->thought_start = false;
    const char *s = r->held.data;
    size_t n = r->held.len;
    const char *close = memmem(s, n, CHANNEL_CLOSE, strlen(CHANNEL_CLOSE));
    size_t end = close ? (size_t)(close - s) : n - (finished ? 0 : em_answer_partial_suffix(s, n, CHANNEL_CLOSE));
    size_t body = end;
    if (split)
        while (body && is_space(s[body - 1])) body--; /* trailing whitespace waits: more reasoning may follow it */
    if (!split && close) body = end + strlen(CHANNEL_CLOSE);
    if (!em_answer_emit(r, kind, s, body, sink, self)) return false;
    if (!close) {
        em_answer_consume(r, finished ? n : body);
        return true;
    }
    em_answer_consume(r, end + strlen(CHANNEL_CLOSE));
    g->part = EM_GEMMA4_TEXT;
    g->after_thought = split;
    *progress = true;
    return true;
}

/* ---- Calls ---- */

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

/* CALL: held starts with `<|tool_call>`; a call begins once `call:NAME{` names a tool of the request. */
static bool read_call(em_answer_reader *r, bool finished, em_answer_sink sink, void *self, bool *progress) {
    em_gemma4_reader *g = &r->gemma4;
    const char *s = r->held.data;
    size_t n = r->held.len, at = strlen(CALL_OPEN);
    int prefix = starts_with(s + at, n - at, CALL_PREFIX);
    size_t name_at = at + strlen(CALL_PREFIX), brace = name_at;
    if (prefix > 0)
        while (brace < n && brace - name_at <= WORD_MAX && is_name_char(s[brace])) brace++;
    const bool opened = prefix > 0 && brace < n && s[brace] == '{' && brace > name_at;
    const bool undecided = prefix < 0 || (prefix > 0 && brace == n && brace - name_at <= WORD_MAX);
    if (!opened && undecided && !finished) return true;
    *progress = true;
    char *name = opened ? strndup(s + name_at, brace - name_at) : NULL;
    if (name && em_server_find_tool(r->options.tools, name)) {
        em_answer_consume(r, brace); /* the arguments start at their `{` */
        memset(g->open, 0, sizeof g->open);
        g->depth = 0;
        g->expect = EM_GEMMA4_VALUE;
        g->in_string = false;
        g->comma_pending = false;
        g->part = EM_GEMMA4_ARGUMENTS;
        return em_answer_begin_call(r, name, sink, self);
    }
    free(name);
    /* no call: the opener is text, and what follows it is read as text again */
    bool ok = em_answer_emit(r, EM_ANSWER_CONTENT, s, at, sink, self);
    em_answer_consume(r, at);
    g->part = EM_GEMMA4_TEXT;
    return ok;
}

/* ---- Arguments: Gemma's syntax into JSON ---- */

/* Appends text[0..n) to a JSON string being written, escaped. */
static bool append_escaped(em_buf *out, const char *text, size_t n) {
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '"' || c == '\\') ok = em_buf_printf(out, "\\%c", c);
        else if (c == '\n') ok = em_buf_printf(out, "\\n");
        else if (c == '\r') ok = em_buf_printf(out, "\\r");
        else if (c == '\t') ok = em_buf_printf(out, "\\t");
        else if (c < 0x20) ok = em_buf_printf(out, "\\u%04x", c);
        else ok = em_buf_append(out, text + i, 1);
    }
    return ok;
}

/* Whether word[0..n) is a JSON number, true, false or null. */
static bool is_json_scalar(const char *word, size_t n) {
    if ((n == 4 && (!memcmp(word, "true", 4) || !memcmp(word, "null", 4))) || (n == 5 && !memcmp(word, "false", 5)))
        return true;
    size_t i = 0;
    if (i < n && word[i] == '-') i++;
    if (i < n && word[i] == '0') i++;
    else if (i < n && word[i] >= '1' && word[i] <= '9')
        while (i < n && word[i] >= '0' && word[i] <= '9') i++;
    else return false;
    if (i < n && word[i] == '.') {
        size_t digits = ++i;
        while (i < n && word[i] >= '0' && word[i] <= '9') i++;
        if (i == digits) return false;
    }
    if (i < n && (word[i] == 'e' || word[i] == 'E')) {
        i++;
        if (i < n && (word[i] == '+' || word[i] == '-')) i++;
        size_t digits = i;
        while (i < n && word[i] >= '0' && word[i] <= '9') i++;
        if (i == digits) return false;
    }
    return i == n;
}

/* What reading the arguments came to in one step. */
typedef enum step { STEP_MORE = 0, STEP_WAIT, STEP_DONE, STEP_BAD } step;

/* Writes the separator a member or value waits for. */
static bool before_member(em_gemma4_reader *g, em_buf *out) {
    if (!g->comma_pending) return true;
    g->comma_pending = false;
    return em_buf_append(out, ",", 1);
}

/* An object or list closes at s[0] (already known to match the innermost open one). */
static step close_container(em_gemma4_reader *g, char c, em_buf *out) {
    g->comma_pending = false;
    g->depth--;
    g->expect = EM_GEMMA4_AFTER_VALUE;
    if (!em_buf_append(out, &c, 1)) return STEP_BAD;
    return g->depth ? STEP_MORE : STEP_DONE;
}

/* A key at s[0..n): bare up to `:`, or quoted. *used: its length with the `:`. */
static step read_key(em_gemma4_reader *g, const char *s, size_t n, bool finished, em_buf *out, size_t *used) {
    const char *key = s;
    size_t key_len, after;
    int quoted = starts_with(s, n, QUOTE);
    if (quoted < 0) return finished ? STEP_BAD : STEP_WAIT;
    if (quoted) {
        key = s + strlen(QUOTE);
        const char *end = memmem(key, n - strlen(QUOTE), QUOTE, strlen(QUOTE));
        if (!end) return finished || n > WORD_MAX ? STEP_BAD : STEP_WAIT;
        key_len = (size_t)(end - key);
        after = skip_space(s, n, (size_t)(end - s) + strlen(QUOTE));
        if (after == n) return finished ? STEP_BAD : STEP_WAIT;
        if (s[after] != ':') return STEP_BAD;
    } else {
        size_t i = 0;
        while (i < n && i <= WORD_MAX && s[i] != ':' && s[i] != '}' && s[i] != '<') i++;
        if (i == n) return finished || n > WORD_MAX ? STEP_BAD : STEP_WAIT;
        if (s[i] != ':' || i == 0 || i > WORD_MAX) return STEP_BAD;
        key_len = i;
        while (key_len && is_space(key[key_len - 1])) key_len--;
        after = i;
    }
    *used = after + 1;
    g->expect = EM_GEMMA4_VALUE;
    bool ok = before_member(g, out) && em_buf_append(out, "\"", 1) && append_escaped(out, key, key_len) &&
              em_buf_append(out, "\":", 2);
    return ok ? STEP_MORE : STEP_BAD;
}

/* A value at s[0..n), or the end of a list. */
static step read_value(em_gemma4_reader *g, const char *s, size_t n, bool finished, em_buf *out, size_t *used) {
    char c = s[0];
    if (c == ']' && g->depth && g->open[g->depth - 1] == '[') {
        *used = 1;
        return close_container(g, c, out);
    }
    if (c == '{' || c == '[') {
        if (g->depth == EM_GEMMA4_MAX_DEPTH) return STEP_BAD;
        if (!g->depth && c != '{') return STEP_BAD; /* the arguments are an object */
        g->open[g->depth++] = c;
        g->expect = c == '{' ? EM_GEMMA4_KEY : EM_GEMMA4_VALUE;
        *used = 1;
        return before_member(g, out) && em_buf_append(out, &c, 1) ? STEP_MORE : STEP_BAD;
    }
    if (!g->depth) return STEP_BAD;
    int quoted = starts_with(s, n, QUOTE);
    if (quoted < 0) return finished ? STEP_BAD : STEP_WAIT;
    if (quoted) {
        g->in_string = true;
        *used = strlen(QUOTE);
        return before_member(g, out) && em_buf_append(out, "\"", 1) ? STEP_MORE : STEP_BAD;
    }
    size_t i = 0;
    while (i < n && i <= WORD_MAX && !is_space(s[i]) && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != '<') i++;
    if (i > WORD_MAX || i == 0) return STEP_BAD;
    if (i == n && !finished) return STEP_WAIT; /* a number may go on */
    *used = i;
    g->expect = EM_GEMMA4_AFTER_VALUE;
    bool ok = before_member(g, out);
    if (is_json_scalar(s, i)) ok = ok && em_buf_append(out, s, i);
    else ok = ok && em_buf_append(out, "\"", 1) && append_escaped(out, s, i) && em_buf_append(out, "\"", 1);
    return ok ? STEP_MORE : STEP_BAD;
}

/* Inside a quoted string: its text up to the closing quote (a quote that may be arriving waits). */
static step read_string(em_gemma4_reader *g, const char *s, size_t n, bool finished, em_buf *out, size_t *used) {
    const char *end = memmem(s, n, QUOTE, strlen(QUOTE));
    size_t text = end ? (size_t)(end - s) : n - (finished ? 0 : em_answer_partial_suffix(s, n, QUOTE));
    if (!append_escaped(out, s, text)) return STEP_BAD;
    *used = text;
    if (!end) return finished ? STEP_BAD : text ? STEP_MORE : STEP_WAIT;
    *used += strlen(QUOTE);
    g->in_string = false;
    g->expect = EM_GEMMA4_AFTER_VALUE;
    return em_buf_append(out, "\"", 1) ? STEP_MORE : STEP_BAD;
}

/* One step of the arguments at s[0..n) (n > 0). */
static step read_argument_step(em_gemma4_reader *g, const char *s, size_t n, bool finished, em_buf *out, size_t *used) {
    *used = 0;
    if (g->in_string) return read_string(g, s, n, finished, out, used);
    size_t at = skip_space(s, n, 0);
    if (at == n) {
        *used = at;
        return finished ? STEP_BAD : at ? STEP_MORE : STEP_WAIT;
    }
    step result = STEP_BAD;
    size_t taken = 0;
    const char inner = g->depth ? g->open[g->depth - 1] : 0;
    switch (g->expect) {
    case EM_GEMMA4_KEY:
        if (s[at] == '}') {
            taken = 1;
            result = close_container(g, '}', out);
        } else {
            result = read_key(g, s + at, n - at, finished, out, &taken);
        }
        break;
    case EM_GEMMA4_VALUE: result = read_value(g, s + at, n - at, finished, out, &taken); break;
    case EM_GEMMA4_AFTER_VALUE:
        if (s[at] == ',') {
            taken = 1;
            g->comma_pending = true;
            g->expect = inner == '{' ? EM_GEMMA4_KEY : EM_GEMMA4_VALUE;
            result = STEP_MORE;
        } else if ((s[at] == '}' && inner == '{') || (s[at] == ']' && inner == '[')) {
            taken = 1;
            result = close_container(g, s[at], out);
        }
        break;
    }
    if (result == STEP_WAIT) {
        *used = at;
        return at ? STEP_MORE : STEP_WAIT;
    }
    *used = at + taken;
    return result;
}

/* Closes what the arguments left open into valid JSON (a key without its value gets null). */
static bool close_all(em_gemma4_reader *g, em_buf *out) {
    bool ok = true;
    if (g->in_string) ok = em_buf_append(out, "\"", 1);
    else if (g->expect == EM_GEMMA4_VALUE && g->depth && g->open[g->depth - 1] == '{') ok = em_buf_append(out, "null", 4);
    while (ok && g->depth) {
        char c = g->open[--g->depth] == '{' ? '}' : ']';
        ok = em_buf_append(out, &c, 1);
    }
    g->in_string = false;
    return ok;
}

/* ARGUMENTS: turns what arrived into JSON, handed on as one delta; the call ends with its object. */
static bool read_arguments(em_answer_reader *r, bool finished, em_answer_sink sink, void *self, bool *progress) {
    em_gemma4_reader *g = &r->gemma4;
    em_buf out = {0};
    step result = STEP_MORE;
    size_t at = 0;
    while (result == STEP_MORE && at < r->held.len) {
        size_t used = 0;
        result = read_argument_step(g, r->held.data + at, r->held.len - at, finished, &out, &used);
        at += used;
    }
    const bool ends = result == STEP_DONE || result == STEP_BAD || finished;
    bool ok = !ends || close_all(g, &out);
    ok = ok && em_answer_emit(r, EM_ANSWER_CALL_ARGUMENTS, out.data, out.len, sink, self);
    r->args_sent += out.len;
    em_buf_free(&out);
    em_answer_consume(r, at); /* a bad step took nothing: its text is read as text again */
    if (ends) {
        ok = ok && em_answer_end_call(r, sink, self);
        g->part = result == STEP_DONE ? EM_GEMMA4_AFTER_CALL : EM_GEMMA4_TEXT;
        *progress = true;
    }
    return ok;
}

/* AFTER_CALL: the call's `<tool_call|>` and the `<|tool_response>` that follows it are dropped. */
static bool read_after_call(em_answer_reader *r, bool finished, bool *progress) {
    const char *s = r->held.data;
    size_t n = r->held.len, at = skip_space(s, n, 0);
    const char *const closers[] = {CALL_CLOSE, TOOL_RESPONSE};
    for (size_t k = 0; k < 2; k++) {
        int close = at < n ? starts_with(s + at, n - at, closers[k]) : -1;
        if (close < 0) {
            if (!finished) return true; /* the next piece tells */
            break;
        }
        if (close > 0) at = skip_space(s, n, at + strlen(closers[k]));
    }
    em_answer_consume(r, at);
    r->gemma4.part = EM_GEMMA4_TEXT;
    *progress = true;
    return true;
}

bool em_gemma4_read(em_answer_reader *r, bool finished, em_answer_sink sink, void *self) {
    bool progress = true, ok = true;
    while (ok && progress) {
        progress = false;
        switch (r->gemma4.part) {
        case EM_GEMMA4_TEXT: ok = read_text(r, finished, sink, self, &progress); break;
        case EM_GEMMA4_THOUGHT: ok = read_thought(r, finished, sink, self, &progress); break;
        case EM_GEMMA4_CALL: ok = read_call(r, finished, sink, self, &progress); break;
        case EM_GEMMA4_ARGUMENTS: ok = read_arguments(r, finished, sink, self, &progress); break;
        case EM_GEMMA4_AFTER_CALL: ok = read_after_call(r, finished, &progress); break;
        }
        if (finished && !r->held.len && r->gemma4.part != EM_GEMMA4_ARGUMENTS && r->gemma4.part != EM_GEMMA4_CALL) break;
    }
    return ok;
}
