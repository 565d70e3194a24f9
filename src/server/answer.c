/* Reading a chat answer as it is generated: its reasoning (a `<think>...</think>` section), its
 * text, and its tool calls, each handed on as soon as it is certain what it is. The streaming and
 * the whole responses both read answers through here, so a client assembles the same message from
 * a stream as from a whole answer.
 *
 * The reader is a small state machine over the text:
 *   - TEXT: content. Text that could still be the start of a marker (`<think>`, the call format's
 *     opener) is held back until the next piece tells; the rest is content at once.
 *   - THINK: reasoning, up to `</think>`. Nothing inside is a call. Whitespace at its start and end
 *     is dropped, and so is whitespace between `</think>` and the content.
 *   - CALL: a call region after the format's opener. The call object {"name": ..., "arguments":
 *     ...} (Llama 3: "parameters") is rescanned from its start on each piece (calls are short): once
 *     its name is complete and names a tool of the request, the call begins, and the bytes of its
 *     arguments are handed on as they arrive. A region that never names a tool is content after all.
 *
 * `<think>` opens reasoning only at the very start of the answer (after whitespace), where the
 * models that reason put it; a template that opens it in the generation prompt starts the reader
 * inside. With reasoning kept inline (reasoning_format "none") the section is content, tags and
 * all, and still holds no calls.
 *
 * Call formats (em_tool_format): Hermes `<tool_call>{...}</tool_call>`; Llama 3 `{"name": ...,
 * "parameters": ...}` (opened by `{"name"` anywhere or `<|python_tag|>`); Mistral `[TOOL_CALLS]`
 * then a JSON list of calls, or `[TOOL_CALLS]name[ARGS]{...}`; the JSON fallback. In the JSON-based
 * formats an answer that starts with `{` (or, for a list of calls, `[`) is read as calls too: a
 * model's control-token opener does not reach the text. A harmony answer (gpt-oss) is messages,
 * not text with markers in it: harmony.c reads it, handing on the same events. Gemma 4 writes its
 * reasoning in a channel and its calls' arguments in a syntax of its own: gemma4.c reads those. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

void em_answer_init(em_answer_reader *r, const em_answer_options *options) {
    memset(r, 0, sizeof *r);
    r->options = *options;
    r->state = options->starts_in_reasoning ? EM_ANSWER_THINK : EM_ANSWER_TEXT;
    r->at_start = true;
    r->think_start = true;
}

void em_answer_clear(em_answer_reader *r) {
    em_buf_free(&r->held);
    free(r->call_name);
    memset(r, 0, sizeof *r);
}

bool em_answer_emit(em_answer_reader *r, em_answer_kind kind, const char *text, size_t len, em_answer_sink sink, void *self) {
    if (!len && kind != EM_ANSWER_CALL_BEGIN) return true;
    em_answer_event ev = {.kind = kind, .text = text, .len = len, .call_index = r->n_calls ? r->n_calls - 1 : 0};
    return sink(self, &ev);
}

/* ---- Markers ---- */

const char *const *em_tool_call_openers(em_tool_format format) {
    static const char *const hermes[] = {"<tool_call>", NULL};
    /* Llama 3.1 writes `<|python_tag|>` before some calls and none before others */
    static const char *const llama[] = {"{\"name\"", "<|python_tag|>", NULL};
    static const char *const mistral[] = {"[TOOL_CALLS]", NULL};
    /* a harmony call is the message addressed to a function (the header's recipient) */
    static const char *const harmony[] = {"to=functions.", NULL};
    static const char *const gemma4[] = {"<|tool_call>", NULL};
    static const char *const none[] = {NULL};
    switch (format) {
    case EM_TOOL_FORMAT_HARMONY: return harmony;
    case EM_TOOL_FORMAT_GEMMA4: return gemma4;
    case EM_TOOL_FORMAT_HERMES: return hermes;
    case EM_TOOL_FORMAT_LLAMA3: return llama;
    case EM_TOOL_FORMAT_MISTRAL:
    case EM_TOOL_FORMAT_MISTRAL_ARGS: return mistral;
    default: return none;
    }
}

size_t em_answer_markers(const em_answer_options *options, const char *out[EM_ANSWER_MAX_MARKERS]) {
    size_t n = 0;
    if (options->format == EM_TOOL_FORMAT_HARMONY) return em_harmony_markers(out);
    if (options->format == EM_TOOL_FORMAT_GEMMA4) return em_gemma4_markers(out);
    if (options->split_reasoning != EM_REASONING_OFF || options->starts_in_reasoning) {
        out[n++] = THINK_OPEN;
        out[n++] = THINK_CLOSE;
    }
    if (!options->read_calls) return n;
    for (const char *const *opener = em_tool_call_openers(options->format); *opener; opener++)
        if (**opener != '{') out[n++] = *opener; /* Llama's `{"name"` is plain JSON text */
    if (options->format == EM_TOOL_FORMAT_HERMES) out[n++] = "</tool_call>";
    if (options->format == EM_TOOL_FORMAT_MISTRAL || options->format == EM_TOOL_FORMAT_MISTRAL_ARGS)
        out[n++] = "[ARGS]";
    return n;
}

/* The longest suffix of text[0..len) that is a proper prefix of `marker`. */
size_t em_answer_partial_suffix(const char *text, size_t len, const char *marker) {
    size_t m = strlen(marker);
    for (size_t k = m - 1 < len ? m - 1 : len; k > 0; k--)
        if (!memcmp(text + len - k, marker, k)) return k;
    return 0;
}

/* ---- JSON scanning (partial text) ---- */

/* Length of the complete JSON value at s[0..n) (no leading whitespace), 0 while it is incomplete,
 * (size_t)-1 when it cannot be JSON. Scalars end at a delimiter, so one at the very end is
 * incomplete. */
static size_t value_end(const char *s, size_t n) {
    if (!n) return 0;
    if (s[0] == '"' || s[0] == '{' || s[0] == '[') {
        int depth = 0;
        bool in_string = false, escape = false;
        for (size_t i = 0; i < n; i++) {
            char c = s[i];
            if (in_string) {
                if (escape) escape = false;
                else if (c == '\\') escape = true;
                else if (c == '"') {
                    in_string = false;
                    if (depth == 0) return i + 1;
                }
            } else if (c == '"') in_string = true;
            else if (c == '{' || c == '[') depth++;
            else if (c == '}' || c == ']') {
                if (--depth == 0) return i + 1;
                if (depth < 0) return (size_t)-1;
            }
        }
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (is_space(s[i]) || s[i] == ',' || s[i] == '}' || s[i] == ']') return i ? i : (size_t)-1;
    return 0;
}

static size_t skip_space(const char *s, size_t n, size_t at) {
    while (at < n && is_space(s[at])) at++;
    return at;
}

/* What a scan of a (maybe partial) call object found. */
typedef struct call_scan {
    size_t end;       /* the object's length once complete, else 0 */
    bool bad;         /* not a call object */
    const char *name; /* the complete "name" string (quotes included), or NULL */
    size_t name_len;
    size_t args_at, args_len; /* the "arguments"/"parameters" value so far (args_len 0: not started) */
    bool args_done;
} call_scan;

static bool key_is(const char *key, size_t len, const char *want) {
    return len == strlen(want) + 2 && !memcmp(key + 1, want, len - 2);
}

/* Scans the call object at s[0..n) (s[0] is '{'). */
static call_scan scan_call(const char *s, size_t n) {
    call_scan c = {0};
    size_t at = skip_space(s, n, 1);
    if (at < n && s[at] == '}') {
        c.end = at + 1;
        return c;
    }
    while (at < n) {
        if (s[at] != '"') return c.bad = true, c;
        size_t key_len = value_end(s + at, n - at);
        if (key_len == (size_t)-1) return c.bad = true, c;
        if (!key_len) return c;
        const char *key = s + at;
        at = skip_space(s, n, at + key_len);
        if (at == n) return c;
        if (s[at] != ':') return c.bad = true, c;
        at = skip_space(s, n, at + 1);
        if (at == n) return c;
        size_t len = value_end(s + at, n - at);
        if (len == (size_t)-1) return c.bad = true, c;
        if (key_is(key, key_len, "arguments") || key_is(key, key_len, "parameters")) {
            c.args_at = at;
            c.args_len = len ? len : n - at;
            c.args_done = len != 0;
        } else if (key_is(key, key_len, "name") && len && s[at] == '"') {
            c.name = s + at;
            c.name_len = len;
        }
        if (!len) return c;
        at = skip_space(s, n, at + len);
        if (at == n) return c;
        if (s[at] == '}') {
            c.end = at + 1;
            return c;
        }
        if (s[at] != ',') return c.bad = true, c;
        at = skip_space(s, n, at + 1);
    }
    return c;
}

/* The name's text when it names a tool of the request (malloc'd), else NULL. */
static char *known_tool(const em_answer_reader *r, const char *quoted, size_t len) {
    json_t *value = json_loadb(quoted, len, JSON_DECODE_ANY, NULL);
    const char *name = json_string_value(value);
    char *copy = NULL;
    size_t i;
    json_t *t;
    json_array_foreach(r->options.tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (name && n && !strcmp(n, name)) {
            copy = strdup(name);
            break;
        }
    }
    json_decref(value);
    return copy;
}

/* ---- Calls ---- */

bool em_answer_begin_call(em_answer_reader *r, char *name, em_answer_sink sink, void *self) {
    free(r->call_name);
    r->call_name = name;
    r->call_begun = true;
    r->args_sent = 0;
    r->n_calls++;
    return em_answer_emit(r, EM_ANSWER_CALL_BEGIN, name, strlen(name), sink, self);
}

/* Hands on the arguments of the call object in held[from..) seen so far. An arguments value that
 * is a JSON string (some models quote the object) is handed on decoded, once complete. */
static bool send_arguments(em_answer_reader *r, const char *s, const call_scan *c, em_answer_sink sink, void *self) {
    if (!c->args_len) return true;
    const char *args = s + c->args_at;
    if (args[0] == '"') {
        if (!c->args_done || r->args_sent) return true;
        json_t *value = json_loadb(args, c->args_len, JSON_DECODE_ANY, NULL);
        bool ok = em_answer_emit(r, EM_ANSWER_CALL_ARGUMENTS, json_string_value(value), json_string_length(value), sink, self);
        json_decref(value);
        r->args_sent = c->args_len;
        return ok;
    }
    if (c->args_len <= r->args_sent) return true;
    bool ok = em_answer_emit(r, EM_ANSWER_CALL_ARGUMENTS, args + r->args_sent, c->args_len - r->args_sent, sink, self);
    r->args_sent = c->args_len;
    return ok;
}

/* Ends the current call: arguments that never came are {}. */
bool em_answer_end_call(em_answer_reader *r, em_answer_sink sink, void *self) {
    bool ok = r->args_sent || em_answer_emit(r, EM_ANSWER_CALL_ARGUMENTS, "{}", 2, sink, self);
    r->call_begun = false;
    return ok;
}

/* A region that turned out not to hold a call: its text is content. */
static bool region_is_text(em_answer_reader *r, em_answer_sink sink, void *self) {
    bool ok = em_answer_emit(r, EM_ANSWER_CONTENT, r->held.data, r->held.len, sink, self);
    r->held.len = 0;
    r->state = EM_ANSWER_TEXT;
    r->at_start = false;
    return ok;
}

/* Drops held[0..n). */
void em_answer_consume(em_answer_reader *r, size_t n) {
    if (n == 0) return; /* held may be empty and unallocated */
    memmove(r->held.data, r->held.data + n, r->held.len - n);
    r->held.len -= n;
    if (r->held.data) r->held.data[r->held.len] = '\0';
}

/* Mistral's newer form: name[ARGS]{arguments}, from held[at..). */
static bool read_named_call(em_answer_reader *r, size_t at, bool finished, em_answer_sink sink, void *self,
                            bool *progress) {
    const char *s = r->held.data;
    size_t n = r->held.len;
    if (!r->call_begun) {
        const char *mark = memmem(s + at, n - at, "[ARGS]", 6);
        if (!mark) return finished || n - at > 256 ? region_is_text(r, sink, self) : true; /* no tool name is that long */
        char *name = strndup(s + at, (size_t)(mark - s - at));
        json_t *quoted = name ? json_string(name) : NULL;
        char *text = quoted ? json_dumps(quoted, JSON_ENCODE_ANY) : NULL;
        char *known = text ? known_tool(r, text, strlen(text)) : NULL;
        free(text);
        json_decref(quoted);
        free(name);
        if (!known) return region_is_text(r, sink, self);
        if (!em_answer_begin_call(r, known, sink, self)) return false;
        r->call_at = (size_t)(mark - s) + 6;
        r->named_call = true;
    }
    size_t len = value_end(s + r->call_at, n - r->call_at);
    size_t upto = len && len != (size_t)-1 ? len : n - r->call_at;
    if (upto > r->args_sent && !em_answer_emit(r, EM_ANSWER_CALL_ARGUMENTS, s + r->call_at + r->args_sent, upto - r->args_sent, sink, self))
        return false;
    r->args_sent = upto;
    if (!len && !finished) return true;
    if (!em_answer_end_call(r, sink, self)) return false;
    r->named_call = false;
    em_answer_consume(r, r->call_at + upto);
    r->state = EM_ANSWER_AFTER_CALL;
    *progress = true;
    return true;
}

/* Reads what the region holds so far: calls begin, arguments go on, finished objects end. */
static bool read_region(em_answer_reader *r, bool finished, em_answer_sink sink, void *self) {
    bool progress = true;
    while (progress && r->state == EM_ANSWER_CALL) {
        progress = false;
        if (r->named_call) return read_named_call(r, r->call_at, finished, sink, self, &progress);
        const char *s = r->held.data;
        size_t n = r->held.len;
        size_t at = skip_space(s, n, r->call_at);
        if (at == n) return finished ? region_is_text(r, sink, self) : true;
        if (r->in_list && !r->call_begun && r->list_items && (s[at] == ',' || s[at] == ']')) {
            if (s[at] == ']') { /* the list ends the region */
                em_answer_consume(r, at + 1);
                r->state = EM_ANSWER_AFTER_CALL;
                return true;
            }
            r->call_at = skip_space(s, n, at + 1);
            progress = true;
            continue;
        }
        if (!r->in_list && !r->call_begun && s[at] == '[') {
            r->in_list = true;
            r->call_at = at + 1;
            progress = true;
            continue;
        }
        if (s[at] != '{') {
            const bool mistral = r->options.format == EM_TOOL_FORMAT_MISTRAL || r->options.format == EM_TOOL_FORMAT_MISTRAL_ARGS;
            if (mistral && !r->in_list && !r->call_begun && r->call_at)
                return read_named_call(r, at, finished, sink, self, &progress);
            return r->call_begun ? em_answer_end_call(r, sink, self) && region_is_text(r, sink, self) : region_is_text(r, sink, self);
        }
        r->call_at = at;
        call_scan c = scan_call(s + at, n - at);
        if (c.bad || (finished && !c.end && !r->call_begun)) {
            if (r->call_begun && !em_answer_end_call(r, sink, self)) return false;
            return region_is_text(r, sink, self);
        }
        if (!r->call_begun && c.name) {
            char *known = known_tool(r, c.name, c.name_len);
            if (!known) return region_is_text(r, sink, self);
            if (!em_answer_begin_call(r, known, sink, self)) return false;
        }
        if (r->call_begun && !send_arguments(r, s + at, &c, sink, self)) return false;
        if (!c.end && !finished) return true;
        if (!r->call_begun) return region_is_text(r, sink, self); /* a whole object without a known name */
        if (!em_answer_end_call(r, sink, self)) return false;
        r->list_items++;
        if (!c.end) { /* cut short by the end of the answer */
            r->held.len = 0;
            r->state = EM_ANSWER_AFTER_CALL;
            return true;
        }
        if (r->in_list) {
            r->call_at = at + c.end;
            progress = true;
            continue;
        }
        em_answer_consume(r, at + c.end);
        r->state = EM_ANSWER_AFTER_CALL;
    }
    return true;
}

/* ---- The text states ---- */

/* Starts a call region at held[at..) after an opener of `opener_len` bytes (0: the answer itself
 * starts with the JSON); the text before it is content. */
static bool open_region(em_answer_reader *r, size_t at, size_t opener_len, em_answer_sink sink, void *self) {
    if (at && !em_answer_emit(r, EM_ANSWER_CONTENT, r->held.data, at, sink, self)) return false;
    em_answer_consume(r, at); /* the opener stays in the region: a region that holds no call is text, opener and all */
    r->state = EM_ANSWER_CALL;
    r->call_at = opener_len;
    r->in_list = false;
    r->list_items = 0;
    return true;
}

/* TEXT: finds the first opener in held text; what cannot start one is content. */
static bool read_text(em_answer_reader *r, bool finished, em_answer_sink sink, void *self, bool *progress) {
    const char *s = r->held.data;
    size_t n = r->held.len;
    if (r->at_start) { /* whitespace first: what follows decides */
        size_t at = skip_space(s, n, 0);
        if (at == n && !finished) return true;
        if (at < n && r->options.split_reasoning != EM_REASONING_OFF && !r->thought) {
            size_t k = n - at < strlen(THINK_OPEN) ? n - at : strlen(THINK_OPEN);
            if (!memcmp(s + at, THINK_OPEN, k)) {
                if (k < strlen(THINK_OPEN) && !finished) return true;
                if (k == strlen(THINK_OPEN)) {
                    if (r->options.split_reasoning == EM_REASONING_INLINE &&
                        !em_answer_emit(r, EM_ANSWER_CONTENT, s, at + k, sink, self))
                        return false;
                    em_answer_consume(r, at + k);
                    r->state = EM_ANSWER_THINK;
                    r->think_start = true;
                    *progress = true;
                    return true;
                }
            }
        }
        /* an answer that is JSON is read as calls, unless what starts there is (or may be) an opener */
        bool opener_here = false;
        for (const char *const *o = em_tool_call_openers(r->options.format); r->options.read_calls && *o && at < n; o++) {
            size_t k = n - at < strlen(*o) ? n - at : strlen(*o);
            if (memcmp(s + at, *o, k)) continue;
            if (k < strlen(*o) && !finished) return true;
            opener_here = opener_here || k == strlen(*o);
        }
        if (at < n && r->options.read_calls && !opener_here && r->options.format != EM_TOOL_FORMAT_HERMES &&
            (s[at] == '{' || s[at] == '[')) {
            em_answer_consume(r, at);
            r->at_start = false;
            *progress = true;
            return open_region(r, 0, 0, sink, self);
        }
        if (r->thought && r->options.split_reasoning == EM_REASONING_SPLIT) { /* whitespace after </think> */
            em_answer_consume(r, at);
            s = r->held.data;
            n = r->held.len;
        }
        r->at_start = false;
    }
    size_t first = n, first_len = 0, keep = 0;
    if (r->options.read_calls) {
        for (const char *const *o = em_tool_call_openers(r->options.format); *o; o++) {
            const char *at = memmem(s, n, *o, strlen(*o));
            if (at && (size_t)(at - s) < first) first = (size_t)(at - s), first_len = strlen(*o);
            size_t k = em_answer_partial_suffix(s, n, *o);
            if (k > keep) keep = k;
        }
    }
    if (first < n) {
        /* Llama's `{"name"` belongs to the call object: keep its brace */
        size_t opener = r->options.format == EM_TOOL_FORMAT_LLAMA3 && s[first] == '{' ? 0 : first_len;
        *progress = true;
        return open_region(r, first, opener, sink, self);
    }
    if (finished) keep = 0;
    if (!em_answer_emit(r, EM_ANSWER_CONTENT, s, n - keep, sink, self)) return false;
    em_answer_consume(r, n - keep);
    return true;
}

/* THINK: reasoning up to </think>; whitespace at either end is not part of it. */
static bool read_think(em_answer_reader *r, bool finished, em_answer_sink sink, void *self, bool *progress) {
    const bool inline_ = r->options.split_reasoning == EM_REASONING_INLINE;
    const em_answer_kind kind = inline_ ? EM_ANSWER_CONTENT : EM_ANSWER_REASONING;
    if (r->think_start && !inline_) {
        size_t at = skip_space(r->held.data, r->held.len, 0);
        em_answer_consume(r, at);
        if (!r->held.len) return true;
        r->think_start = false;
    }
    const char *s = r->held.data;
    size_t n = r->held.len;
    const char *close = memmem(s, n, THINK_CLOSE, strlen(THINK_CLOSE));
    if (close) {
        size_t end = (size_t)(close - s), body = end;
        if (!inline_)
            while (body && is_space(s[body - 1])) body--;
        else
            end += strlen(THINK_CLOSE), body = end;
        if (!em_answer_emit(r, kind, s, body, sink, self)) return false;
        em_answer_consume(r, inline_ ? end : end + strlen(THINK_CLOSE));
        r->state = EM_ANSWER_TEXT;
        r->at_start = true;
        r->thought = true;
        *progress = true;
        return true;
    }
    size_t keep = finished ? 0 : em_answer_partial_suffix(s, n, THINK_CLOSE);
    size_t body = n - keep;
    if (!inline_)
        while (body && is_space(s[body - 1])) body--;
    if (!em_answer_emit(r, kind, s, body, sink, self)) return false;
    em_answer_consume(r, finished ? n : body); /* at the end, trailing whitespace goes */
    return true;
}

/* AFTER_CALL: the format's closing tag (Hermes `</tool_call>`), separators and whitespace around
 * them are dropped. */
static bool read_after_call(em_answer_reader *r, bool finished, bool *progress) {
    static const char close[] = "</tool_call>";
    size_t at = 0;
    while (at < r->held.len && (is_space(r->held.data[at]) || r->held.data[at] == ';')) at++;
    size_t rest = r->held.len - at;
    if (r->options.format == EM_TOOL_FORMAT_HERMES) {
        size_t k = rest < strlen(close) ? rest : strlen(close);
        if (k && !memcmp(r->held.data + at, close, k)) {
            if (k < strlen(close) && !finished) return true;
            if (k == strlen(close)) at = skip_space(r->held.data, r->held.len, at + k);
        }
    }
    if (at == r->held.len && !finished) return true;
    em_answer_consume(r, at);
    r->state = EM_ANSWER_TEXT;
    *progress = true;
    return true;
}

static bool run(em_answer_reader *r, bool finished, em_answer_sink sink, void *self) {
    bool progress = true;
    while (progress) {
        progress = false;
        bool ok = true;
        switch (r->state) {
        case EM_ANSWER_TEXT: ok = r->held.len || finished ? read_text(r, finished, sink, self, &progress) : true; break;
        case EM_ANSWER_THINK: ok = read_think(r, finished, sink, self, &progress); break;
        case EM_ANSWER_CALL: {
            em_answer_state before = r->state;
            ok = read_region(r, finished, sink, self);
            progress = r->state != before;
            break;
        }
        case EM_ANSWER_AFTER_CALL: ok = read_after_call(r, finished, &progress); break;
        }
        if (!ok) return false;
        if (finished && !r->held.len && r->state != EM_ANSWER_CALL) break;
    }
    return true;
}

bool em_answer_in_reasoning(const em_answer_reader *r) {
    if (r->options.format == EM_TOOL_FORMAT_HARMONY)
        return r->harmony.part == EM_HARMONY_BODY && r->harmony.body == EM_HARMONY_REASONING;
    return r->state == EM_ANSWER_THINK;
}

bool em_answer_feed(em_answer_reader *r, const char *text, size_t len, em_answer_sink sink, void *self) {
    if (len && !em_buf_append(&r->held, text, len)) return false;
    if (r->options.format == EM_TOOL_FORMAT_HARMONY) return em_harmony_read(r, false, sink, self);
    if (r->options.format == EM_TOOL_FORMAT_GEMMA4) return em_gemma4_read(r, false, sink, self);
    return run(r, false, sink, self);
}

bool em_answer_finish(em_answer_reader *r, em_answer_sink sink, void *self) {
    if (r->options.format == EM_TOOL_FORMAT_HARMONY) return em_harmony_read(r, true, sink, self);
    if (r->options.format == EM_TOOL_FORMAT_GEMMA4) return em_gemma4_read(r, true, sink, self);
    return run(r, true, sink, self);
}

bool em_server_choice_collect(void *self, const em_answer_event *ev) {
    em_server_choice *c = self;
    switch (ev->kind) {
    case EM_ANSWER_CONTENT: return em_buf_append(&c->content, ev->text, ev->len);
    case EM_ANSWER_REASONING: return em_buf_append(&c->reasoning, ev->text, ev->len);
    case EM_ANSWER_CALL_BEGIN:
        if (!c->tool_calls && !(c->tool_calls = json_array())) return false;
        return json_array_append_new(c->tool_calls, json_pack("{s:s%, s:s}", "name", ev->text, ev->len, "arguments", "")) == 0;
    case EM_ANSWER_CALL_ARGUMENTS: {
        json_t *call = json_array_get(c->tool_calls, ev->call_index);
        const char *so_far = json_string_value(json_object_get(call, "arguments"));
        if (!so_far) return false;
        size_t had = strlen(so_far);
        char *joined = malloc(had + ev->len + 1);
        if (!joined) return false;
        memcpy(joined, so_far, had);
        memcpy(joined + had, ev->text, ev->len);
        joined[had + ev->len] = '\0';
        bool ok = json_object_set_new(call, "arguments", json_stringn(joined, had + ev->len)) == 0;
        free(joined);
        return ok;
    }
    }
    return false;
}
