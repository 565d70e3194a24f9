/* Reading a harmony answer (gpt-oss) as it is generated. The answer is a sequence of messages:
 *
 *   <|channel|>analysis<|message|>I should look it up.<|end|>
 *   <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}<|call|>
 *
 * The first message's `<|start|>assistant` is the generation prompt's; each later one opens with
 * `<|start|>` and a role. A header (up to `<|message|>`) names the channel and, for a call, the
 * recipient `to=functions.NAME` (before or after the channel) and the arguments' type (`json` or
 * `<|constrain|>json`). A body runs to `<|end|>`, `<|call|>` (a call ends the turn) or `<|return|>`
 * (the answer ends); the engine stops at the last two, so a body usually runs to the end of the text.
 *
 * What each message becomes: the analysis channel is reasoning; a message to a function the
 * request offers is a call whose arguments are handed on as they arrive; final, and commentary
 * addressed to no one (a preamble to the user), are content. Everything else comes back as text,
 * markup and all, so nothing the model wrote is lost: a header that cannot be one (characters no
 * header holds, longer than any header), a message to a recipient that is not an offered function,
 * a role other than the assistant's, text between messages. With reasoning kept inline
 * (reasoning_format none) the analysis messages are content as written, markup and all.
 *
 * Text that could still become a marker is held back until the next piece tells, as answer.c does,
 * so a stream hands on the same events as a whole answer.
 *
 * The end of the file shapes conversations for the harmony template (em_harmony_messages,
 * em_harmony_tools): one call a message, each followed by its result, and every tool described. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char START[] = "<|start|>", CHANNEL[] = "<|channel|>", MESSAGE[] = "<|message|>", END[] = "<|end|>",
                  CONSTRAIN[] = "<|constrain|>", CALL[] = "<|call|>", RETURN[] = "<|return|>";

/* No header is longer: a role, a channel, a recipient (a tool name is at most 64 characters) and a
 * content type. */
#define HEADER_MAX 256

size_t em_harmony_markers(const char *out[EM_ANSWER_MAX_MARKERS]) {
    const char *const markers[] = {START, CHANNEL, MESSAGE, END, CONSTRAIN, CALL, RETURN};
    const size_t n = sizeof markers / sizeof markers[0];
    _Static_assert(7 <= EM_ANSWER_MAX_MARKERS, "the harmony markers fit");
    for (size_t i = 0; i < n; i++) out[i] = markers[i];
    return n;
}

/* The earliest of `markers` (NULL-terminated) in s[0..n): its position (n when none) and length. */
static size_t first_marker(const char *s, size_t n, const char *const *markers, size_t *len) {
    size_t first = n;
    *len = 0;
    for (const char *const *m = markers; *m; m++) {
        const char *at = memmem(s, n, *m, strlen(*m));
        if (at && (size_t)(at - s) < first) first = (size_t)(at - s), *len = strlen(*m);
    }
    return first;
}

/* How much of the end of s[0..n) may be the start of one of `markers`. */
static size_t held_back(const char *s, size_t n, const char *const *markers) {
    size_t keep = 0;
    for (const char *const *m = markers; *m; m++) {
        size_t k = em_answer_partial_suffix(s, n, *m);
        if (k > keep) keep = k;
    }
    return keep;
}

static bool is_header_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.' || c == '=' || c == ':' || c == '/' || c == ' ';
}

/* Whether h[0..n) can be (the start of) a header: header characters, `<|channel|>` and
 * `<|constrain|>`, and at the very end the start of a marker. */
static bool header_possible(const char *h, size_t n) {
    for (size_t i = 0; i < n;) {
        if (is_header_char(h[i])) {
            i++;
            continue;
        }
        const char *const inside[] = {CHANNEL, CONSTRAIN};
        bool known = false;
        for (size_t k = 0; k < 2 && !known; k++) {
            size_t m = strlen(inside[k]);
            if (n - i >= m && !memcmp(h + i, inside[k], m)) i += m, known = true;
        }
        if (known) continue;
        const char *const ends[] = {CHANNEL, CONSTRAIN, MESSAGE, START, END, CALL, RETURN, NULL};
        return held_back(h + i, n - i, ends) == n - i; /* only an unfinished marker may end it */
    }
    return true;
}

/* A word of the header at h[*at..n): up to a space or the next marker. */
static void header_word(const char *h, size_t n, size_t *at, const char **word, size_t *len) {
    while (*at < n && h[*at] == ' ') (*at)++;
    *word = h + *at;
    while (*at < n && h[*at] != ' ' && h[*at] != '<') (*at)++;
    *len = (size_t)(h + *at - *word);
}

static bool word_is(const char *word, size_t len, const char *want) {
    return len == strlen(want) && !memcmp(word, want, len);
}

/* What the body of the message with header h[0..n) is (role first when with_role); *name is the
 * called function (malloc'd) for a call. */
static em_harmony_body body_of(const em_answer_reader *r, const char *h, size_t n, bool with_role, char **name) {
    const char *role = "assistant", *channel = NULL, *recipient = NULL;
    size_t role_len = strlen(role), channel_len = 0, recipient_len = 0;
    size_t at = 0;
    if (with_role) header_word(h, n, &at, &role, &role_len);
    while (at < n) {
        const char *word;
        size_t len;
        if (n - at >= strlen(CHANNEL) && !memcmp(h + at, CHANNEL, strlen(CHANNEL))) {
            at += strlen(CHANNEL);
            header_word(h, n, &at, &channel, &channel_len);
        } else if (n - at >= strlen(CONSTRAIN) && !memcmp(h + at, CONSTRAIN, strlen(CONSTRAIN))) {
            at += strlen(CONSTRAIN);
            header_word(h, n, &at, &word, &len); /* the arguments' type */
        } else {
            size_t before = at;
            header_word(h, n, &at, &word, &len);
            if (len > 3 && !memcmp(word, "to=", 3)) recipient = word + 3, recipient_len = len - 3;
            if (at == before) return EM_HARMONY_RAW; /* a '<' that starts no marker of a header */
        }
    }
    if (!word_is(role, role_len, "assistant")) return EM_HARMONY_RAW;
    if (recipient) {
        const char prefix[] = "functions.";
        const size_t p = strlen(prefix);
        if (!r->options.read_calls || recipient_len <= p || memcmp(recipient, prefix, p)) return EM_HARMONY_RAW;
        char *called = strndup(recipient + p, recipient_len - p);
        if (!called || !em_server_find_tool(r->options.tools, called)) {
            free(called);
            return EM_HARMONY_RAW;
        }
        *name = called;
        return EM_HARMONY_CALL;
    }
    if (channel && word_is(channel, channel_len, "analysis"))
        return r->options.split_reasoning == EM_REASONING_INLINE ? EM_HARMONY_RAW : EM_HARMONY_REASONING;
    return EM_HARMONY_CONTENT;
}

/* Text that is not a message goes on as content; the reader looks for the next `<|start|>`. */
static bool not_a_message(em_answer_reader *r, size_t len, em_answer_sink sink, void *self) {
    bool ok = em_answer_emit(r, EM_ANSWER_CONTENT, r->held.data, len, sink, self);
    em_answer_consume(r, len);
    r->harmony.part = EM_HARMONY_BETWEEN;
    return ok;
}

/* HEADER: waits for `<|message|>`, then starts the body it announces. */
static bool read_header(em_answer_reader *r, bool finished, em_answer_sink sink, void *self, bool *progress) {
    em_harmony_reader *h = &r->harmony;
    const size_t skip = h->with_role ? strlen(START) : 0; /* the held text starts with it */
    const char *s = r->held.data + skip;
    size_t n = r->held.len - skip, marker_len;
    const char *const markers[] = {MESSAGE, START, END, CALL, RETURN, NULL};
    size_t at = first_marker(s, n, markers, &marker_len);
    if (at < n && !memcmp(s + at, MESSAGE, strlen(MESSAGE)) && at <= HEADER_MAX && header_possible(s, at)) {
        char *name = NULL;
        h->body = body_of(r, s, at, h->with_role, &name);
        const size_t whole = skip + at + marker_len;
        bool ok = h->body != EM_HARMONY_RAW || em_answer_emit(r, EM_ANSWER_CONTENT, r->held.data, whole, sink, self);
        if (ok && h->body == EM_HARMONY_CALL) ok = em_answer_begin_call(r, name, sink, self);
        else free(name);
        em_answer_consume(r, whole);
        h->part = EM_HARMONY_BODY;
        *progress = true;
        return ok;
    }
    if (at < n) { /* ended by another marker before its <|message|>: it was no header */
        *progress = true;
        return not_a_message(r, skip + at, sink, self);
    }
    if (!finished && n <= HEADER_MAX && header_possible(s, n)) return true;
    /* the end of the answer, or no header can go on like this: text, but a <|start|> it may end
     * with can still open a message */
    const char *const start[] = {START, NULL};
    *progress = true;
    return not_a_message(r, r->held.len - (finished ? 0 : held_back(s, n, start)), sink, self);
}

/* BODY: hands on the body as it comes, up to the marker that ends the message. */
static bool read_body(em_answer_reader *r, bool finished, em_answer_sink sink, void *self, bool *progress) {
    em_harmony_reader *h = &r->harmony;
    const char *s = r->held.data;
    size_t n = r->held.len, marker_len;
    /* a <|start|> ends a message whose <|end|> the model left out */
    const char *const markers[] = {END, CALL, RETURN, START, NULL};
    size_t at = first_marker(s, n, markers, &marker_len);
    const bool ends = at < n;
    size_t upto = ends ? at : n - (finished ? 0 : held_back(s, n, markers));
    const bool at_start = ends && !memcmp(s + at, START, strlen(START));
    if (ends && h->body == EM_HARMONY_RAW && !at_start) upto += marker_len; /* as written, its end too */
    bool ok = true;
    switch (h->body) {
    case EM_HARMONY_REASONING: ok = em_answer_emit(r, EM_ANSWER_REASONING, s, upto, sink, self); break;
    case EM_HARMONY_CONTENT:
    case EM_HARMONY_RAW: ok = em_answer_emit(r, EM_ANSWER_CONTENT, s, upto, sink, self); break;
    case EM_HARMONY_CALL:
        ok = em_answer_emit(r, EM_ANSWER_CALL_ARGUMENTS, s, upto, sink, self);
        r->args_sent += upto;
        break;
    }
    if (ok && h->body == EM_HARMONY_CALL && (ends || finished)) ok = em_answer_end_call(r, sink, self);
    if (ends) {
        em_answer_consume(r, h->body == EM_HARMONY_RAW || at_start ? upto : at + marker_len);
        h->part = EM_HARMONY_BETWEEN;
        *progress = true;
    } else {
        em_answer_consume(r, upto);
    }
    return ok;
}

/* BETWEEN: the next message opens with `<|start|>`; whitespace before it is nothing, other text
 * is content. */
static bool read_between(em_answer_reader *r, bool finished, em_answer_sink sink, void *self, bool *progress) {
    const char *s = r->held.data;
    size_t n = r->held.len;
    const char *open = memmem(s, n, START, strlen(START));
    const char *const start[] = {START, NULL};
    size_t upto = open ? (size_t)(open - s) : n - (finished ? 0 : held_back(s, n, start));
    size_t text = 0;
    while (text < upto && strchr(" \t\r\n", s[text])) text++;
    if (text == upto && !open && !finished) return true; /* only whitespace so far: what follows tells */
    bool ok = text == upto || em_answer_emit(r, EM_ANSWER_CONTENT, s, upto, sink, self);
    em_answer_consume(r, upto);
    if (open) {
        r->harmony.part = EM_HARMONY_HEADER;
        r->harmony.with_role = true;
        *progress = true;
    }
    return ok;
}

bool em_harmony_read(em_answer_reader *r, bool finished, em_answer_sink sink, void *self) {
    bool progress = true, ok = true;
    while (ok && progress) {
        progress = false;
        switch (r->harmony.part) {
        case EM_HARMONY_HEADER: ok = read_header(r, finished, sink, self, &progress); break;
        case EM_HARMONY_BODY: ok = read_body(r, finished, sink, self, &progress); break;
        case EM_HARMONY_BETWEEN: ok = read_between(r, finished, sink, self, &progress); break;
        }
        if (finished && !r->held.len && r->harmony.part != EM_HARMONY_BODY) break;
    }
    return ok;
}

/* ---- Conversations for the harmony template ----
 * gpt-oss's template writes one call a message (it takes tool_calls[0]) and names a tool result
 * after the call before it, so an assistant turn with several calls becomes one message a call,
 * each followed by its result (the result whose tool_call_id is the call's id, else the next one
 * in order); the first keeps the turn's text and reasoning. A tool without a description would
 * stop the template (it adds the description to a string), so it gets an empty one. */

/* The message `m` with only its k-th call (and, after the first, no text or reasoning). */
static json_t *one_call(const json_t *m, size_t k) {
    json_t *part = json_copy((json_t *)m);
    json_t *call = json_array_get(json_object_get(m, "tool_calls"), k);
    if (!part || json_object_set_new(part, "tool_calls", json_pack("[O]", call))) {
        json_decref(part);
        return NULL;
    }
    if (k > 0) {
        json_object_del(part, "thinking");
        json_object_del(part, "reasoning_content");
        if (json_object_set_new(part, "content", json_string(""))) {
            json_decref(part);
            return NULL;
        }
    }
    return part;
}

/* The result in results[0..n) (not yet used) that answers `call`: by its id, else the first unused. */
static size_t result_of(const json_t *call, const json_t *results, const bool *used, size_t n) {
    const char *id = json_string_value(json_object_get(call, "id"));
    for (size_t r = 0; id && r < n; r++) {
        const char *answers = json_string_value(json_object_get(json_array_get(results, r), "tool_call_id"));
        if (!used[r] && answers && !strcmp(id, answers)) return r;
    }
    for (size_t r = 0; r < n; r++)
        if (!used[r]) return r;
    return n;
}

static bool is_role(const json_t *m, const char *role) {
    const char *given = json_string_value(json_object_get(m, "role"));
    return given && !strcmp(given, role);
}

static bool append(json_t *list, json_t *item) {
    return item && json_array_append_new(list, item) == 0;
}

json_t *em_harmony_messages(const json_t *messages) {
    json_t *out = json_array();
    const size_t n = json_array_size(messages);
    bool ok = out != NULL;
    for (size_t i = 0; ok && i < n;) {
        json_t *m = json_array_get(messages, i);
        json_t *calls = json_object_get(m, "tool_calls");
        if (!is_role(m, "assistant") || json_array_size(calls) < 2) {
            ok = append(out, json_incref(m));
            i++;
            continue;
        }
        size_t end = i + 1;
        while (end < n && is_role(json_array_get(messages, end), "tool")) end++;
        json_t *results = json_array();
        for (size_t r = i + 1; results && r < end; r++) json_array_append(results, json_array_get(messages, r));
        const size_t n_results = end - i - 1;
        bool *used = calloc(n_results + 1, sizeof *used);
        ok = results && used;
        for (size_t k = 0; ok && k < json_array_size(calls); k++) {
            ok = append(out, one_call(m, k));
            size_t r = result_of(json_array_get(calls, k), results, used, n_results);
            if (ok && r < n_results) {
                used[r] = true;
                ok = append(out, json_incref(json_array_get(results, r)));
            }
        }
        for (size_t r = 0; ok && r < n_results; r++) /* results of no call follow the last one */
            if (!used[r]) ok = append(out, json_incref(json_array_get(results, r)));
        free(used);
        json_decref(results);
        i = end;
    }
    if (!ok) {
        json_decref(out);
        return NULL;
    }
    return out;
}

json_t *em_harmony_tools(const json_t *tools) {
    json_t *out = json_deep_copy(tools);
    size_t i;
    json_t *t;
    json_array_foreach(out, i, t) {
        json_t *function = json_object_get(t, "function");
        if (json_is_object(function) && !json_is_string(json_object_get(function, "description")) &&
            json_object_set_new(function, "description", json_string(""))) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}
