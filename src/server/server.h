/*
 * server — `ember serve`: OpenAI-, Anthropic- and Ollama-compatible HTTP APIs over an engine.
 *
 * The module is three layers, each testable alone:
 *   1. Request parsers (openai.c, anthropic.c, responses.c, ollama.c; embed.c for embeddings): a JSON body becomes an em_server_request, a
 *      description of what to generate that knows nothing about HTTP or the engine (messages or
 *      prompts, sampling, stops, limits, stream flags). Any problem is an em_server_error that
 *      carries the HTTP status, the API's error type, and a message naming the field.
 *   2. Response formatters (openai.c, anthropic.c, responses.c, ollama.c, metrics.c): engine outputs (text, finish
 *      reason, logprobs, usage, timings) become exact JSON bodies, SSE events and Prometheus text.
 *      They are pure functions of their inputs (ids and times are arguments), so tests compare
 *      bytes.
 *   3. HTTP (http.c): libmicrohttpd with one thread per connection. A connection thread parses,
 *      makes the request's grammar (structured.c: through the server's cache of compiled grammars,
 *      stopped by a hang-up or the server stopping), submits to the engine and then waits on its own request (blocking with a timeout, polling
 *      its socket for a hang-up in between): a client that goes away cancels its request. HTTP
 *      threads never touch model state; the engine runs on its own thread. guard.c bounds how long
 *      and how many connections may take to send a request (libmicrohttpd cannot).
 *
 * The access log (access_log.c): http.c writes one line per request on stderr when the request ends,
 * with the token counts generate.c noted for it.
 *
 * em_server_engine is the server's view of the engine: the seam between the server and the rest
 * of Ember (include/ember.h: the engine, which also holds the model's one tokenizer and chat
 * template). model.c adapts the real engine; tests plug in a fake. What the server assumes of an
 * engine is written at each member below.
 *
 * Ownership: em_server_request owns every string and array it holds (em_server_request_clear
 * frees them). Formatters return malloc'd text or new jansson references the caller frees. An
 * em_server owns its MHD daemon, its metrics, its stored responses (the Responses API's `store`),
 * its cache of compiled grammars and its connections' state; it borrows the engine, which must
 * outlive it.
 *
 * Depends on base, include/ember.h, grammar, jansson and libmicrohttpd; model.c also reads the GGUF's
 * metadata (gguf, quantize's type names) and digests it (libcrypto) for what it tells of the model.
 */
#ifndef EMBER_SERVER_H
#define EMBER_SERVER_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "../grammar/grammar.h"
#include "ember.h"

/* ---- The server's view of the engine: generation, tokenizer and chat template ---- */

/* How the model writes a tool call (tools.c, answer.c), told by its chat template: Hermes / Qwen
 * `<tool_call>{"name", "arguments"}</tool_call>`; Llama 3.x `{"name", "parameters"}` (after
 * `<|python_tag|>` or alone); Mistral `[TOOL_CALLS][{"name", "arguments"}, ...]` or, in its newer
 * templates, `[TOOL_CALLS]name[ARGS]{...}`; or a bare JSON object {"name", "arguments"} (the
 * fallback for templates that teach none of them). Harmony (gpt-oss) is more than a call format:
 * the whole answer is messages `<|channel|>analysis|commentary|final<|message|>...<|end|>`, a call
 * one addressed `to=functions.NAME` (harmony.c reads it). */
typedef enum em_tool_format {
    EM_TOOL_FORMAT_JSON = 0,
    EM_TOOL_FORMAT_HERMES,
    EM_TOOL_FORMAT_LLAMA3,
    EM_TOOL_FORMAT_MISTRAL,      /* [TOOL_CALLS][{...}] */
    EM_TOOL_FORMAT_MISTRAL_ARGS, /* [TOOL_CALLS]name[ARGS]{...}: read as EM_TOOL_FORMAT_MISTRAL, forced in this form */
    EM_TOOL_FORMAT_HARMONY,      /* gpt-oss's channels and messages */
    EM_TOOL_FORMAT_GEMMA4        /* <|channel>thought ...<channel|>, <|tool_call>call:NAME{key:value}<tool_call|> */
} em_tool_format;

/* What the server tells of its model beyond generation (Ollama's /api/tags and /api/show): read
 * from the file's metadata when it is opened. Strings live as long as the engine; zero / NULL when
 * unknown. */
typedef struct em_server_model_facts {
    const char *architecture;  /* general.architecture ("llama") */
    const char *quantization;  /* llama.cpp's name of general.file_type ("Q4_K_M") */
    uint64_t parameters;       /* elements of the file's tensors */
    uint64_t file_bytes;       /* the file's size (all parts of a split model) */
    int64_t modified;          /* the file's modification time, seconds since the epoch */
    const char *digest;        /* "sha256:<hex>" of the file's metadata (the bytes before its tensor data) */
    const char *chat_template; /* tokenizer.chat_template, NULL when the model has none */
    /* The file's general.* and <architecture>.* metadata as a JSON object (Ollama's model_info),
     * or NULL; lives as long as the engine */
    const json_t *metadata;
} em_server_model_facts;

typedef struct em_server_engine {
    void *self;
    const char *model_id; /* the name /v1/models lists and responses report (requests may name any) */
    int ctx_tokens;       /* longest prompt + output the engine accepts */
    int32_t n_vocab;      /* token ids (logit_bias, prompts of ids) must be below this: the model's
                           * output rows, which may be more than the tokenizer's tokens */
    em_tool_format tool_format; /* from the chat template */
    bool reasons;               /* the chat template writes <think> sections (Qwen 3, DeepSeek-R1) */
    em_server_model_facts facts;
    /* Embeddings (embed.c): the pooling the engine's embedding requests get (an ember_pooling:
     * none, or rank, and the model does not embed), the vector's length, and why the backend cannot
     * embed (NULL when it can). */
    int pooling;
    uint32_t n_embd;
    const char *embed_refused;

    /* Renders `messages` (an OpenAI-style array of {role, content: string}; roles system, user,
     * assistant, tool; assistant messages may carry tool_calls with arguments as objects) and
     * `tools` (OpenAI-style tool definitions, or NULL) with the model's chat template, through the
     * template's own tool support, with the extra template variables of `kwargs` (an object, or
     * NULL: reasoning_effort, enable_thinking), generation prompt added, and tokenizes the
     * result so that only the template's own markup can produce control tokens: message text is
     * tokenized without parsing special-token text. *ids is malloc'd (caller frees). *in_thinking
     * (may be NULL) tells whether the rendered prompt ends inside an open `<think>` (the template
     * opened the model's reasoning itself). */
    em_err (*chat_prompt)(void *self, const json_t *messages, const json_t *tools, const json_t *kwargs, int32_t **ids,
                          size_t *n, bool *in_thinking);
    /* Tokenizes plain text: BOS/EOS as the model asks when add_special, control-token text
     * recognized only when parse_special (prompts of /v1/completions: true, false; /tokenize lets
     * the client choose, as llama.cpp's server does). */
    em_err (*tokenize)(void *self, const char *text, size_t len, bool add_special, bool parse_special, int32_t **ids,
                       size_t *n);
    /* The bytes a token stands for (for logprobs); may be partial UTF-8. Pointer lives as long as
     * the engine. 0 bytes for an unknown id. */
    size_t (*token_bytes)(void *self, int32_t id, const char **bytes);

    /* The engine, as in ember.h: ember_submit, ember_request_next, _cancel, _timings, _release,
     * ember_engine_stats. A request handle is used by one connection thread at a time. */
    em_err (*submit)(void *self, const ember_request_params *params, void **request);
    bool (*next)(void *request, ember_output *out, int timeout_ms);
    void (*cancel)(void *request);
    void (*timings)(void *request, ember_timings *out);
    void (*release)(void *request);
    void (*stats)(void *self, ember_stats *out);
} em_server_engine;

/* ---- Requests ---- */

typedef enum em_server_api {
    EM_API_OPENAI_CHAT = 0,       /* POST /v1/chat/completions */
    EM_API_OPENAI_COMPLETIONS,    /* POST /v1/completions */
    EM_API_ANTHROPIC_MESSAGES,    /* POST /v1/messages */
    EM_API_ANTHROPIC_COUNT,       /* POST /v1/messages/count_tokens */
    EM_API_OPENAI_RESPONSES,      /* POST /v1/responses (OpenAI's error format) */
    EM_API_OLLAMA,                /* /api/...: Ollama's API, errors {"error": "..."} */
} em_server_api;

/* An error to send: HTTP status, the API's error type ("invalid_request_error", ...), an
 * optional OpenAI `code` and `param`, and the message. */
typedef struct em_server_error {
    int status;
    const char *type;
    const char *code;  /* static string or NULL */
    char param[64];    /* field name or "" */
    char message[512];
} em_server_error;

void em_server_error_set(em_server_error *err, int status, const char *type, const char *code,
                         const char *param, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
/* The error body in `api`'s own format (OpenAI: {"error":{message,type,param,code}};
 * Anthropic: {"type":"error","error":{type,message}}). Returns malloc'd compact JSON. */
char *em_server_error_body(em_server_api api, const em_server_error *err);
/* Status → error type for each API (400 → invalid_request_error, 401 → authentication_error...). */
const char *em_server_error_type(em_server_api api, int status);

/* One prompt of /v1/completions: text or token ids. */
typedef struct em_server_prompt {
    char *text;
    size_t text_len;
    int32_t *ids;
    size_t n_ids;
    bool is_ids;
} em_server_prompt;

#define EM_SERVER_MAX_N 16      /* choices per request */
#define EM_SERVER_MAX_STOP 16   /* stop strings per request */
#define EM_SERVER_MAX_TOP 20    /* top_logprobs */
#define EM_SERVER_MAX_PROMPTS 64
#define EM_SERVER_MAX_CHOICES 128 /* prompts × n in one request */

/* tool_choice: none (tools only shown), auto (the model decides; calls are parsed from the text),
 * required / Anthropic's any (the answer is one call of some tool), named (one call of that tool). */
typedef enum em_tool_choice { EM_TOOL_NONE = 0, EM_TOOL_AUTO, EM_TOOL_REQUIRED, EM_TOOL_NAMED } em_tool_choice;

/* reasoning_format (llama-server's field): auto splits a <think> section off when the template
 * reasons, deepseek always, none keeps it inline in the content. */
typedef enum em_reasoning_format { EM_REASONING_FORMAT_AUTO = 0, EM_REASONING_FORMAT_DEEPSEEK, EM_REASONING_FORMAT_NONE } em_reasoning_format;

typedef struct em_server_request {
    em_server_api api;
    char *model;        /* as asked */
    json_t *messages;   /* chat APIs: normalized [{role, content: string}], system first */
    em_server_prompt *prompts; /* completions */
    size_t n_prompts;
    int n;              /* choices per prompt */
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    int max_tokens;     /* 0 = up to the context */
    char **stop;
    size_t n_stop;
    ember_sampling sampling; /* sampling.logit_bias points into `logit_bias` */
    ember_logit_bias *logit_bias;
    bool logprobs;      /* chat: logprobs; completions: logprobs given */
    int top_logprobs;   /* alternatives per token */
    bool seed_given;
    bool ignore_eos;    /* ignore_eos (llama-server's field): go on past end-of-generation tokens */
    int speculative;    /* an ember_spec: "speculative" (false/true or a mode), "speculative.n_max": 0 = off */
    char *grammar;      /* GBNF the answer must follow (response_format, grammar, tool_choice), or NULL */
    char *grammar_schema; /* or a JSON schema's text, whose GBNF `grammar` becomes when the grammar is made */
    const char *grammar_param; /* the request field the grammar came from, for errors (a static string) */
    /* `grammar` compiled, once, when the request's grammar is made (structured.c, through the
     * server's cache); handed to the engine */
    ember_grammar *compiled_grammar;
    json_t *tools;      /* OpenAI-style tool definitions (Anthropic's are converted), or NULL */
    em_tool_choice tool_choice;
    char *tool_name;    /* the tool a named choice forces */
    /* static texts that switch `grammar` on (a lazy grammar; NULL-terminated), or NULL */
    const char *const *grammar_triggers;
    bool grammar_is_raw; /* `grammar` came as GBNF from the client: the server leaves it as it is */
    em_reasoning_format reasoning_format;
    json_t *template_kwargs; /* extra chat-template variables (the Responses API's reasoning effort,
                              * Ollama's think as enable_thinking), or NULL */
    int ctx_tokens;     /* a context smaller than the engine's for this request (Ollama's num_ctx):
                         * prompt and output must fit it; 0 = the engine's */
} em_server_request;

void em_server_request_init(em_server_request *req, em_server_api api);
void em_server_request_clear(em_server_request *req);

/* Parse a body. On failure returns false with `err` filled (status 400 for bad JSON, wrong
 * types, missing fields, out-of-range values). Model names and prompt lengths are checked later,
 * against the engine. `n_vocab` bounds logit_bias keys and prompt ids. */
bool em_openai_parse_chat(const char *body, size_t len, int32_t n_vocab, em_server_request *req,
                          em_server_error *err);
bool em_openai_parse_completions(const char *body, size_t len, int32_t n_vocab,
                                 em_server_request *req, em_server_error *err);
bool em_anthropic_parse_messages(const char *body, size_t len, em_server_request *req,
                                 em_server_error *err);
bool em_anthropic_parse_count_tokens(const char *body, size_t len, em_server_request *req,
                                     em_server_error *err);

/* ---- Results and their formatting ---- */

/* One generated token with its logprobs (when asked). */
typedef struct em_server_token {
    int32_t token;
    float logprob;
    int n_top;
    ember_top_logprob top[EM_SERVER_MAX_TOP];
} em_server_token;

/* ---- Reading answers (answer.c): reasoning, text and tool calls as the text arrives ---- */

typedef enum em_answer_kind {
    EM_ANSWER_CONTENT = 0,   /* text of the answer */
    EM_ANSWER_REASONING,     /* text of its <think> section */
    EM_ANSWER_CALL_BEGIN,    /* a call of tool `text` begins (call_index counts from 0) */
    EM_ANSWER_CALL_ARGUMENTS /* more of the current call's arguments (JSON text) */
} em_answer_kind;

typedef struct em_answer_event {
    em_answer_kind kind;
    const char *text; /* not NUL-terminated; valid during the call */
    size_t len;
    size_t call_index;
} em_answer_event;

/* Receives the events in order; false stops the reader (out of memory). */
typedef bool (*em_answer_sink)(void *self, const em_answer_event *event);

typedef enum em_answer_reasoning {
    EM_REASONING_OFF = 0, /* <think> is plain text */
    EM_REASONING_SPLIT,   /* a <think> section at the start is reasoning */
    EM_REASONING_INLINE   /* it stays in the content, tags and all, and holds no calls */
} em_answer_reasoning;

typedef struct em_answer_options {
    em_answer_reasoning split_reasoning;
    bool starts_in_reasoning; /* the prompt opened <think> */
    bool read_calls;          /* tools were given and may be called */
    em_tool_format format;
    const json_t *tools;      /* borrowed: OpenAI-style definitions (calls must name one) */
} em_answer_options;

typedef enum em_answer_state { EM_ANSWER_TEXT = 0, EM_ANSWER_THINK, EM_ANSWER_CALL, EM_ANSWER_AFTER_CALL } em_answer_state;

/* Where a harmony answer is (harmony.c): in a message's header (up to `<|message|>`), in its body,
 * or between messages (after `<|end|>`, before the next `<|start|>`). */
typedef enum em_harmony_part { EM_HARMONY_HEADER = 0, EM_HARMONY_BODY, EM_HARMONY_BETWEEN } em_harmony_part;
/* What a harmony message's body is: reasoning (the analysis channel), content (final, or
 * commentary to the user), a call's arguments, or text handed on as written, markup and all (a
 * message the reader cannot take as any of those, or analysis kept inline). */
typedef enum em_harmony_body { EM_HARMONY_REASONING = 0, EM_HARMONY_CONTENT, EM_HARMONY_CALL, EM_HARMONY_RAW } em_harmony_body;

typedef struct em_harmony_reader {
    em_harmony_part part;
    em_harmony_body body;
    bool with_role; /* the header held starts with `<|start|>` and a role (the first message's is in the prompt) */
} em_harmony_reader;

/* Where a Gemma 4 answer is (gemma4.c): in text, in a thought (up to `<channel|>`), in a call's
 * opening (up to the `{` after its name), in its arguments, or just after a call (its `<tool_call|>`). */
typedef enum em_gemma4_part {
    EM_GEMMA4_TEXT = 0,
    EM_GEMMA4_THOUGHT,
    EM_GEMMA4_CALL,
    EM_GEMMA4_ARGUMENTS,
    EM_GEMMA4_AFTER_CALL
} em_gemma4_part;
/* What the arguments' reader waits for next: a key (or the end of an object), a value (or the end
 * of a list), or what follows a value (a comma or an end). */
typedef enum em_gemma4_expect { EM_GEMMA4_KEY = 0, EM_GEMMA4_VALUE, EM_GEMMA4_AFTER_VALUE } em_gemma4_expect;
/* Arguments nested deeper are malformed: the reader keeps one byte a level, no recursion. */
#define EM_GEMMA4_MAX_DEPTH 32

typedef struct em_gemma4_reader {
    em_gemma4_part part;
    bool after_thought;  /* whitespace between a thought and the text is no content */
    bool thought_start;  /* no reasoning of the current thought yet: its leading whitespace goes */
    char open[EM_GEMMA4_MAX_DEPTH]; /* the arguments' open objects and lists ('{', '['), innermost last */
    size_t depth;
    em_gemma4_expect expect;
    bool in_string;      /* inside a <|"|>-quoted string of the arguments */
    bool comma_pending;  /* a separator read, written when the next member comes (a trailing one is dropped) */
} em_gemma4_reader;

typedef struct em_answer_reader {
    em_answer_options options;
    em_answer_state state;
    em_buf held;      /* text not handed on yet */
    bool at_start;    /* no content yet (whitespace aside) */
    bool think_start; /* no reasoning yet */
    bool thought;     /* a <think> section was read */
    size_t call_at;   /* in CALL: where the current call object (or what follows the opener) starts in held */
    bool in_list;     /* in CALL: inside a JSON list of calls */
    size_t list_items;
    bool call_begun;
    bool named_call;  /* Mistral's name[ARGS]{...}: call_at is where the arguments start */
    char *call_name;
    size_t args_sent; /* bytes of the current call's arguments handed on */
    size_t n_calls;
    em_harmony_reader harmony; /* the state of a harmony answer (format EM_TOOL_FORMAT_HARMONY) */
    em_gemma4_reader gemma4;   /* the state of a Gemma 4 answer (format EM_TOOL_FORMAT_GEMMA4) */
} em_answer_reader;

void em_answer_init(em_answer_reader *reader, const em_answer_options *options);
/* Feeds generated text; events for what became certain go to `sink`. */
bool em_answer_feed(em_answer_reader *reader, const char *text, size_t len, em_answer_sink sink, void *self);
/* Whether the reader is inside the answer's reasoning (a <think> section, harmony's analysis
 * channel): the server counts the tokens generated there as reasoning tokens. */
bool em_answer_in_reasoning(const em_answer_reader *reader);
/* The answer ended: whatever is held is handed on (an unfinished call ends as it is). */
bool em_answer_finish(em_answer_reader *reader, em_answer_sink sink, void *self);
void em_answer_clear(em_answer_reader *reader);
/* The texts that open a tool call in the format, the one a call usually starts with first
 * (NULL-terminated; empty for a format without a marker): what the answer reader looks for, and
 * what switches a lazy call grammar on (tool_grammar.c). */
const char *const *em_tool_call_openers(em_tool_format format);
/* The markers the reader looks for under `options` (the format's call openers and closers when it
 * reads calls, the reasoning tags when it splits reasoning): the texts the engine must hand on as
 * text when the model writes one as a single control token (ember_request_params.control_texts).
 * Writes at most EM_ANSWER_MAX_MARKERS static strings to out[]; returns how many. */
#define EM_ANSWER_MAX_MARKERS 8
size_t em_answer_markers(const em_answer_options *options, const char *out[EM_ANSWER_MAX_MARKERS]);

/* One choice's result so far. */
typedef struct em_server_choice {
    em_buf text; /* everything generated */
    em_server_token *tokens; /* only kept when logprobs were asked */
    size_t n_tokens, cap_tokens;
    ember_finish_reason finish;
    char *stop_string;
    ember_timings timings;
    /* Chat answers, as em_answer_reader reads them: */
    em_buf content;
    em_buf reasoning;
    uint64_t reasoning_tokens; /* generated while the reader was in the reasoning (or leaving it) */
    json_t *tool_calls; /* [{name, arguments: JSON text}] or NULL when none */
} em_server_choice;

/* Collects reader events into a choice (content, reasoning, tool_calls): an em_answer_sink. */
bool em_server_choice_collect(void *choice, const em_answer_event *event);

void em_server_choice_clear(em_server_choice *choice);
/* Appends one ember_output (text, tokens when keep_tokens) and records its finish. */
bool em_server_choice_add(em_server_choice *choice, const ember_output *out, bool keep_tokens);

/* Context a formatter needs besides the results: the response id, creation time, model name and
 * a way to spell tokens (logprobs). */
typedef struct em_server_format {
    const char *id;
    int64_t created;
    const char *model;
    const em_server_engine *engine; /* token_bytes for logprobs */
} em_server_format;

/* Usage over all choices: prompt tokens count once per prompt, generated tokens for every choice. */
typedef struct em_server_usage {
    uint64_t prompt_tokens, completion_tokens, cached_tokens;
    uint64_t reasoning_tokens; /* of completion_tokens, those of the reasoning */
} em_server_usage;

/* The "timings" object every response carries (engine-side figures of one request). */
json_t *em_server_timings_json(const ember_timings *t);

/* Whole (non-streaming) responses. `choices` has req->n entries per prompt. Returns new refs. */
json_t *em_openai_chat_response(const em_server_format *f, const em_server_request *req,
                                const em_server_choice *choices, size_t n_choices,
                                const em_server_usage *usage);
json_t *em_openai_completion_response(const em_server_format *f, const em_server_request *req,
                                      const em_server_choice *choices, size_t n_choices,
                                      const em_server_usage *usage);
json_t *em_anthropic_message_response(const em_server_format *f, const em_server_choice *choice,
                                      const em_server_usage *usage);
json_t *em_openai_models_json(const char *model_id, int64_t created);
json_t *em_anthropic_models_json(const char *model_id, int64_t created);

/* Streaming: each function appends complete SSE events to `out`. */
/* OpenAI chat: the first chunk of a choice (role "assistant", content ""). */
bool em_openai_chat_chunk_start(em_buf *out, const em_server_format *f, const em_server_request *req,
                                int index);
/* A delta: `text` and, when req->logprobs, the tokens it came from. finish != NONE adds the
 * finish_reason and the choice's `timings` (non-NULL then). */
bool em_openai_chunk_delta(em_buf *out, const em_server_format *f, const em_server_request *req,
                           int index, const char *text, size_t len, const em_server_token *tokens,
                           size_t n_tokens, ember_finish_reason finish, const ember_timings *timings);
/* An event of a chat answer read by em_answer_reader, as a delta: content, reasoning_content, the
 * start of a call (index, id "call_<response id>_<choice>_<k>", type, function name, arguments "")
 * or a fragment of its arguments. */
bool em_openai_chunk_answer(em_buf *out, const em_server_format *f, const em_server_request *req, int index,
                            const em_answer_event *event);
/* The finishing chunk of a read chat answer: finish_reason (tool_calls when it made calls), timings,
 * and the logprobs of its last tokens when asked. */
bool em_openai_chunk_finish(em_buf *out, const em_server_format *f, const em_server_request *req, int index,
                            const em_server_choice *choice, const em_server_token *tokens, size_t n_tokens);
/* A delta that carries only logprobs (of tokens whose text the reader still holds or has split off). */
bool em_openai_chunk_logprobs(em_buf *out, const em_server_format *f, const em_server_request *req, int index,
                              const em_server_token *tokens, size_t n_tokens);
/* The closing events: the usage chunk (when include_usage; with timings) and `data: [DONE]`. */
bool em_openai_stream_end(em_buf *out, const em_server_format *f, const em_server_request *req,
                          const em_server_usage *usage, const ember_timings *timings);
/* Anthropic: message_start (content blocks open as the answer comes; a ping follows the first). */
bool em_anthropic_stream_start(em_buf *out, const em_server_format *f, const em_server_usage *usage);
/* Where an Anthropic stream is: the block open now (index, kind). */
typedef struct em_anthropic_stream {
    bool started, open;
    int index;
    em_answer_kind kind;
} em_anthropic_stream;
/* An event of the answer: a thinking block (thinking_delta), a text block (text_delta) or a
 * tool_use block per call (input_json_delta), each block opened when its first event comes and
 * closed when another kind of block begins. */
bool em_anthropic_stream_answer(em_buf *out, const em_server_format *f, em_anthropic_stream *st,
                                const em_answer_event *event);
/* The last content_block_stop (an empty text block when none was sent), message_delta (stop_reason
 * tool_use when calls were made, usage, timings) and message_stop. */
bool em_anthropic_stream_end(em_buf *out, em_anthropic_stream *st, const em_server_choice *choice,
                             const em_server_usage *usage);
/* An error inside a stream that already started. */
bool em_server_stream_error(em_buf *out, em_server_api api, const em_server_error *err);

/* OpenAI's finish_reason / Anthropic's stop_reason for a finish (NULL while running). */
const char *em_openai_finish_reason(ember_finish_reason finish);
const char *em_anthropic_stop_reason(ember_finish_reason finish, const char *stop_string);

/* Text as a JSON string even when it is not valid UTF-8 (invalid bytes become U+FFFD). */
json_t *em_server_json_text(const char *text, size_t len);
/* Serializes compactly with the number precision Ember uses (malloc'd). */
char *em_server_dump(const json_t *value);

/* ---- Metrics ---- */

typedef enum em_server_endpoint {
    EM_EP_CHAT = 0,
    EM_EP_COMPLETIONS,
    EM_EP_MESSAGES,
    EM_EP_COUNT_TOKENS,
    EM_EP_MODELS,
    EM_EP_HEALTH,
    EM_EP_METRICS,
    EM_EP_PAGE, /* the chat page's files (web.c) */
    EM_EP_RESPONSES,
    EM_EP_OLLAMA_CHAT,
    EM_EP_OLLAMA_GENERATE,
    EM_EP_OLLAMA_TAGS,
    EM_EP_OLLAMA_SHOW,
    EM_EP_OLLAMA_PS,
    EM_EP_OLLAMA_VERSION,
    EM_EP_OLLAMA_EMBED, /* /api/embed and /api/embeddings (embed.c) */
    EM_EP_OLLAMA_MANAGE, /* /api/pull, create, copy, delete, push: the one model is chosen at start */
    EM_EP_TOKENIZE,      /* POST /tokenize (llama.cpp's server's) */
    EM_EP_DETOKENIZE,    /* POST /detokenize */
    EM_EP_EMBEDDINGS,    /* POST /v1/embeddings (embed.c) */
    EM_EP_OTHER,
    EM_EP_COUNT,
} em_server_endpoint;

const char *em_server_endpoint_path(em_server_endpoint endpoint);

/* Counts of HTTP requests per endpoint and status (100..599), guarded by a mutex. */
typedef struct em_server_metrics {
    pthread_mutex_t lock;
    uint64_t requests[EM_EP_COUNT][500];
} em_server_metrics;

void em_server_metrics_init(em_server_metrics *m);
void em_server_metrics_destroy(em_server_metrics *m);
void em_server_metrics_count(em_server_metrics *m, em_server_endpoint endpoint, int status);
/* Prometheus text exposition (version 0.0.4) of the counters and the engine's stats. */
/* `grammars` (may be NULL): the counters of the server's cache of compiled grammars. */
char *em_server_metrics_text(em_server_metrics *m, const ember_stats *stats, const em_grammar_cache_stats *grammars);

/* ---- The server ---- */

/* ---- The access log (access_log.c): one line per request, written when the request ends ---- */

typedef enum em_access_log_format { EM_ACCESS_LOG_OFF = 0, EM_ACCESS_LOG_TEXT, EM_ACCESS_LOG_JSON } em_access_log_format;

/* One finished request. Tokens are -1 where the request generated nothing or was refused before
 * its prompt was read. */
typedef struct em_access_record {
    int64_t time_ms;          /* when its headers arrived, milliseconds since the epoch */
    char client[64];          /* the client's address ("127.0.0.1", "::1"), "-" when unknown */
    char method[16];
    char path[256];           /* cut to fit, the query string kept */
    int status;               /* as sent; 499 when the client hung up before the answer ended */
    int64_t prompt_tokens, completion_tokens;
    double duration_ms;       /* from the headers' arrival to the answer's last byte */
} em_access_record;

/* "text" or "json" → the format; false for any other name. */
bool em_access_log_format_parse(const char *name, em_access_log_format *out);
/* The record as one line, newline included: text
 *   2026-12-09T10:04:05.123Z 127.0.0.1 "POST /v1/chat/completions" 200 prompt=12 completion=5 38.2ms
 * (tokens left out where unknown), or a JSON object with the fields time, client, method, path,
 * status, prompt_tokens, completion_tokens (null where unknown) and duration_ms. Writes at most
 * `size` bytes (the line is cut, still ending in a newline); returns its length. */
size_t em_access_log_line(em_access_log_format format, const em_access_record *record, char *out, size_t size);

typedef struct em_server_options {
    const char *host;        /* NULL = 127.0.0.1 */
    int port;                /* 0 = pick a free port (see em_server_port) */
    const char *api_key;     /* NULL = no key needed */
    size_t max_body;         /* bytes; 0 = 4 MiB */
    int max_connections;     /* open connections, each with its thread; 0 = 512 */
    int max_client_connections; /* of one client (IP address); 0 = half of max_connections */
    double header_seconds;   /* a request's headers must arrive within this; 0 = 10 */
    double body_seconds;     /* and its body within this after them; 0 = 30 */
    int receiving_per_client; /* connections of one client sending a request at once (more: the
                               * oldest is cut); 0 = 64 */
    double grammar_seconds;  /* CPU time to make one request's grammar (more: a 400); 0 = 1.0 */
    int ollama_port;         /* a second port serving the same APIs, for Ollama clients that cannot be
                              * told another than 11434; 0 = none */
    bool matryoshka;         /* the model was trained so that its embeddings may be cut short: requests
                              * may ask for fewer `dimensions` */
    em_access_log_format access_log; /* a line per request on stderr (access_log.c); default off */
} em_server_options;

typedef struct em_server em_server;

/* Binds and starts serving on MHD's threads; returns at once. */
em_err em_server_start(const em_server_options *options, const em_server_engine *engine,
                       em_server **out);
int em_server_port(const em_server *server);
/* Whether host:port can be bound now (port 0: always), so that a command can refuse a busy port
 * before it spends time loading a model. A clear error when it cannot. */
em_err em_server_check_port(const char *host, int port);
/* The second port (options.ollama_port), 0 when there is none. */
int em_server_ollama_port(const em_server *server);
/* Stops accepting, cancels running requests, waits for connection threads, frees everything. */
void em_server_stop(em_server *server);

/* ---- Tool calls (tools.c) ---- */

/* The call format a chat template's text teaches: harmony when it writes messages with channels
 * (`<|start|>`, `<|channel|>`, `<|message|>`), Mistral when it writes `[TOOL_CALLS]` (the newer
 * form when `[ARGS]` too), Hermes for `<tool_call>`, Llama 3 for `<|python_tag|>` or its header
 * tokens with calls written as "parameters", the JSON fallback otherwise. */
em_tool_format em_server_tool_format_of(const char *template_text, size_t len);

/* ---- The real engine (model.c): include/ember.h's engine of one GGUF ---- */

typedef struct em_server_model em_server_model;

/* Starts an engine with `options` (it reads the model, its tokenizer and its chat template; a
 * template that does not parse is an error here). The model id it advertises is `alias` when
 * given (`ember serve --alias`), else the file's name without ".gguf"; the context is options->ctx_tokens, else the model's
 * context_length capped at 32768 (ember.h's rule). A model without tokenizer.chat_template
 * serves completions only. */
em_err em_server_model_open(const ember_options *options, const char *alias, em_server_model **out);
const em_server_engine *em_server_model_engine(const em_server_model *model);
/* What the engine settled on at creation (its KV pool, its prefix cache's tiers). */
void em_server_model_info(const em_server_model *model, ember_engine_info *info);
/* Stops the engine and frees everything (stop the server first). */
void em_server_model_close(em_server_model *model);

/* The API-key check: true when `given` (may be NULL) equals `expected`, in time that does not
 * depend on where they differ. */
bool em_server_key_matches(const char *expected, const char *given);

#endif
