/*
 * ember.h — Ember's public C API: load a model, run an engine, submit requests, read tokens.
 *
 * An engine owns one model with its tokenizer and chat template, one backend (CPU or CUDA), a
 * paged KV cache with a prefix cache shared by all requests, and one engine thread that runs
 * continuous batching: every step takes all running decodes plus prefill chunks up to a token
 * budget. Requests are submitted from any thread; their output is read by polling (blocking with a
 * timeout) or by a callback that runs on the engine thread. Nothing here aborts the process: every
 * failure is an ember_error.
 *
 * Thread safety: ember_submit, ember_request_*, ember_engine_stats and the text functions
 * (ember_tokenize, ember_chat_tokens, ...) may be called from any thread, concurrently.
 * ember_engine_create/destroy must not race with other calls on the same engine. A request
 * handle is used by one reader at a time.
 *
 * Ownership: the caller owns what create/submit return and gives it back with the matching
 * destroy/release; errors are freed with ember_error_free. Pointers inside an ember_output stay
 * valid until the next ember_request_next on that request or its release.
 */
#ifndef EMBER_H
#define EMBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Errors ---- */

/* An error: a code (see ember_error_code) and a message that says what and where. NULL is success. */
typedef struct em_error ember_error;
int ember_error_code(const ember_error *error);
const char *ember_error_message(const ember_error *error);
void ember_error_free(ember_error *error);

/* ---- Engine ---- */

typedef struct ember_options {
    const char *model_path; /* GGUF file (required) */
    const char *device;     /* "cpu", "cuda", or NULL for CUDA when a GPU is present, else CPU */
    int threads;            /* CPU threads for the CPU backend; 0 = all cores */
    uint64_t kv_mem_bytes;  /* KV cache budget in bytes; 0 = room for kv_sequences of ctx_tokens */
    int kv_sequences;       /* with kv_mem_bytes 0: full-length sequences the KV cache holds; 0 = 4 */
    int ctx_tokens;         /* longest sequence (prompt + output); 0 = the model's context, capped at 8192 */
    int batch_tokens;       /* tokens per engine step (decodes + prefill chunks); 0 = 2048 */
    int block_tokens;       /* KV block size in tokens; 0 = 16 */
    int max_sequences;      /* most requests running at once; 0 = 256 */
    /* Speculative decoding (docs/speculative.md): requests that ask for the default get `speculative`;
     * EMBER_SPEC_DEFAULT here means off, or draft when draft_model_path is set. */
    int speculative;              /* an ember_spec */
    const char *draft_model_path; /* a smaller model with the same vocabulary, for EMBER_SPEC_DRAFT */
    int draft_max;                /* most tokens drafted per step; 0 = 16 */
    int draft_min;                /* the adaptive draft length never drops below this; default 0 */
    int spec_max_seqs;            /* requests draft only while at most this many run; 0 = 4 */
    int weights_memory;           /* an ember_weights_memory: where the weights live on the host */
    /* The prefix cache's lower tiers (docs/serve.md, "Prefix cache tiers"): KV blocks the pool evicts
     * go to host RAM, from there to disk, and come back when a prompt matches them. A backend that
     * cannot copy KV blocks to the host, and a model with recurrent state, keep none. */
    uint64_t cache_ram_bytes;  /* host-RAM tier bound; 0 = off; EMBER_CACHE_RAM_AUTO (the default) = a
                                  quarter of the memory available at start, at most 8 GiB */
    const char *cache_dir;     /* disk tier directory (created if missing), or NULL for none; it survives
                                  restarts, and servers sharing it each take a slot of their own */
    uint64_t cache_disk_bytes; /* disk tier bound; 0 = half the free space of cache_dir's file system,
                                  at most 16 GiB */
    /* Embeddings (ember_request_params.embed): how a prompt's hidden states are pooled, an
     * ember_pooling; EMBER_POOLING_NONE (the default) = the model's own (its GGUF's
     * <arch>.pooling_type), and none there: the model does not embed unless a request names one. */
    int pooling;
} ember_options;

/* How an embedding pools the final hidden states (after the output norm) of a prompt's tokens into
 * one vector, numbered as GGUF's <arch>.pooling_type numbers them. The vector is then scaled to
 * unit length (L2). */
typedef enum ember_pooling {
    EMBER_POOLING_NONE = 0, /* no pooling: the model embeds nothing */
    EMBER_POOLING_MEAN = 1, /* the mean over every token */
    EMBER_POOLING_CLS = 2,  /* the first token's */
    EMBER_POOLING_LAST = 3, /* the last token's (Qwen3-Embedding) */
    EMBER_POOLING_RANK = 4, /* a classification head's score (rerankers): not an embedding */
} ember_pooling;

/* "mean", "cls", "last", "rank" or "none". */
const char *ember_pooling_name(int pooling);

#define EMBER_CACHE_RAM_AUTO UINT64_MAX

/* Where the model's weights (and the draft model's) live in host memory. Read into the process's own
 * memory, a CPU decode streamed them faster on the machine measured than from the file's page cache
 * mapping (bench/RESULTS.md, "CPU: more sequences, weights in memory"), for a read of the file at
 * start and its size in memory; mapped, they cost nothing up front, are shared with other processes
 * mapping the file and can be paged out. */
typedef enum ember_weights_memory {
    EMBER_WEIGHTS_AUTO = 0,  /* read when the CPU backend runs the model and the files take at most half
                                of the memory available, mapped otherwise */
    EMBER_WEIGHTS_MAPPED,    /* --mmap */
    EMBER_WEIGHTS_IN_MEMORY, /* --no-mmap (mapped after all if the memory is refused, with a warning) */
} ember_weights_memory;

/* Speculative decoding: drafts of the next tokens, verified by the model in one step; the output is
 * the same as without (the same tokens for the same seed), only sooner when drafts are accepted. */
typedef enum ember_spec {
    EMBER_SPEC_DEFAULT = 0, /* a request: the engine's option */
    EMBER_SPEC_OFF,
    EMBER_SPEC_LOOKUP, /* drafts copied from the prompt and output where their last tokens occurred before */
    EMBER_SPEC_DRAFT,  /* drafts from the draft model (ember_options.draft_model_path) */
} ember_spec;

/* Fills `options` with the defaults above (model_path NULL). */
void ember_options_default(ember_options *options);

typedef struct ember_engine ember_engine;

/* Loads the model, allocates the KV cache and starts the engine thread. */
ember_error *ember_engine_create(const ember_options *options, ember_engine **out);

/* Cancels every request, stops the engine thread, frees everything. Request handles the caller
 * still holds stay valid (finished, reason EMBER_FINISH_CANCELLED) until released. */
void ember_engine_destroy(ember_engine *engine);

/* What the engine settled on at creation. */
typedef struct ember_engine_info {
    uint32_t ctx_tokens;    /* longest sequence (prompt + output) it accepts */
    uint32_t n_vocab;       /* logits per token */
    uint32_t block_tokens;  /* KV block size */
    uint32_t kv_blocks;     /* KV blocks in the pool */
    uint64_t kv_bytes;      /* the pool's memory: kv_blocks * block_tokens positions */
    uint32_t batch_tokens;  /* token budget of one step */
    uint32_t max_sequences; /* requests running at once */
    const char *device;     /* "cpu" or "cuda" */
    bool weights_in_memory; /* the model's files were read into memory (else mapped) */
    /* The prefix cache's lower tiers as settled (0: off). cache_dir is this engine's slot of
     * ember_options.cache_dir; cache_tiers_off says why an asked-for tier is off, or is NULL. */
    uint64_t cache_ram_bytes, cache_disk_bytes;
    const char *cache_dir;
    const char *cache_tiers_off;
    /* Embeddings: the pooling embedding requests get by default (EMBER_POOLING_NONE: the model
     * embeds only where a request names one), the vector's length, and why the backend cannot
     * embed at all (NULL when it can). */
    int pooling;
    uint32_t n_embd;
    const char *embed_refused;
} ember_engine_info;

void ember_engine_get_info(const ember_engine *engine, ember_engine_info *out);

/* One lower tier of the prefix cache (host RAM or disk). Blocks are KV blocks of block_tokens
 * positions (a conversation's last one may hold fewer). */
typedef struct ember_tier_stats {
    bool enabled;                        /* false: off, or turned off by an error (a full disk) */
    uint64_t limit_bytes, bytes, blocks; /* its bound, and what it holds now */
    uint64_t stored;                     /* blocks moved in (evicted from the tier above) */
    uint64_t hits, hit_tokens;           /* blocks restored from it into the KV pool, and their tokens */
    uint64_t evictions;                  /* blocks it gave up: passed down to the next tier, or dropped */
    uint64_t bytes_written, bytes_read;  /* bytes moved in and out */
    double restore_ms;                   /* time spent restoring blocks from it */
    uint64_t files_skipped;              /* disk: files found corrupt, truncated or of another model */
} ember_tier_stats;

typedef struct ember_stats {
    uint64_t requests_submitted, requests_finished, requests_cancelled, requests_rejected;
    uint64_t prompt_tokens, generated_tokens, cached_tokens; /* cached = prompt tokens reused */
    uint64_t steps, preemptions;
    uint32_t queued, running;                          /* now */
    uint32_t kv_blocks_total, kv_blocks_used, kv_blocks_cached;
    uint64_t prefix_lookups, prefix_hits, prefix_tokens_reused, prefix_tokens_evicted;
    double step_seconds_total;
    uint64_t step_histogram[12]; /* steps taking < 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000 ms, more */
    /* Of generated_tokens, those the backend picked itself (requests without logprobs, logit bias
     * or penalties, in steps where every sampling request was such): their logits never reached
     * the host. The rest were sampled on the host; the tokens are the same either way. */
    uint64_t backend_picked_tokens;
    /* Steps begun before the previous step's tokens were read (step overlap: a backend that offers
     * it, every running request decoding from the previous step, nobody waiting). */
    uint64_t overlapped_steps;
    /* Speculative decoding: tokens drafted and verified, and those of them the model agreed with
     * (each accepted draft is a generated token that took no step of its own). */
    uint64_t draft_tokens, draft_accepted;
    /* Of draft_tokens, those in steps begun before the previous step's tokens were read (prompt
     * lookup's drafts ride in chained steps, after a guess at the token in flight). */
    uint64_t draft_tokens_overlapped;
    ember_tier_stats cache_ram, cache_disk; /* the prefix cache's lower tiers */
} ember_stats;

void ember_engine_stats(ember_engine *engine, ember_stats *out);

/* ---- Text: the model's tokenizer and chat template ----
 * The engine's own, read once with the model: what these return is what the engine would do with
 * the same text. They may be called from any thread, and never wait for the engine thread. Ids
 * and text returned are malloc'd; the caller frees them with free(). */

/* Tokenizes `text`: BOS/EOS as the model asks when add_special; control-token text recognized
 * only when parse_special (chat template output, never user text). */
ember_error *ember_tokenize(const ember_engine *engine, const char *text, size_t len, bool add_special,
                            bool parse_special, int32_t **ids, size_t *n);
/* The text of `ids`, control tokens spelled as their text. */
ember_error *ember_detokenize(const ember_engine *engine, const int32_t *ids, size_t n, char **text, size_t *len);
/* The bytes token `id` stands for (control tokens as their text); may be partial UTF-8. The pointer
 * lives as long as the engine; 0 bytes for an unknown id. */
size_t ember_token_piece(const ember_engine *engine, int32_t id, const char **bytes);
/* The chat template's source (tokenizer.chat_template) in *template_text, NULL with *len 0 when the
 * model has none. Returns why the template does not parse, when it does not (ember_chat_tokens
 * then fails with the same error; text prompts are unaffected). */
ember_error *ember_chat_template(const ember_engine *engine, const char **template_text, size_t *len);

/* A conversation, as JSON text in the shapes of OpenAI's chat API. */
typedef struct ember_chat {
    const char *messages; /* [{role, content: string}, ...]; roles system, user, assistant, tool; assistant
                           * messages may carry tool_calls with arguments as objects */
    const char *tools;    /* tool definitions [{type: "function", function: {...}}], or NULL */
    const char *kwargs;   /* an object of extra template variables (e.g. {"enable_thinking": false}), or NULL */
    bool add_generation_prompt; /* end with the opening of the assistant's turn */
} ember_chat;

/* Renders the conversation with the model's chat template and tokenizes it so that only the
 * template's own markup becomes control tokens: any string of the conversation (content, ids,
 * names, tools, template variables) that spells a control token stays text. One BOS at the start
 * when the model asks for one. Fails for a model without a template, or malformed JSON. */
ember_error *ember_chat_tokens(const ember_engine *engine, const ember_chat *chat, int32_t **ids, size_t *n);

/* ---- Requests ---- */

typedef struct ember_logit_bias {
    int32_t token;
    float bias; /* added to the logit; -INFINITY bans the token */
} ember_logit_bias;

typedef struct ember_sampling {
    float temperature;       /* 0 = greedy (default 0.8 from ember_request_default) */
    int top_k;               /* 0 = off */
    float top_p;             /* 1 = off */
    float min_p;             /* 0 = off */
    float repeat_penalty;    /* 1 = off; divides positive logits of tokens seen in the last repeat_last_n */
    int repeat_last_n;       /* tokens looked back for penalties; default 64, -1 = all */
    float presence_penalty;  /* 0 = off; subtracted once per token already generated */
    float frequency_penalty; /* 0 = off; subtracted per occurrence */
    uint64_t seed;           /* same seed, same output, whatever else shares the batch, on the GPU or the CPU
                              * (the draw for the n-th token depends only on seed, n and the logits) */
    const ember_logit_bias *logit_bias;
    size_t n_logit_bias;
    int logprobs; /* 0 = none; n > 0 = the sampled token's logprob plus the n most likely */
} ember_sampling;

typedef struct ember_output ember_output; /* defined below */

/* A GBNF grammar compiled once, for any number of requests (reference counted: each request that
 * uses one takes its own reference). ember_grammar_compile also checks that a parse can start
 * (a grammar too ambiguous to follow fails here), so a caller that compiles while it reads a
 * request can refuse a bad grammar then; ember_grammar_free gives the caller's reference back.
 * Compiling is linear in the grammar's size and refused past the limits docs/serve.md lists. */
typedef struct em_grammar ember_grammar;
ember_error *ember_grammar_compile(const char *gbnf, size_t len, ember_grammar **out);
void ember_grammar_free(ember_grammar *grammar);

typedef struct ember_request_params {
    const int32_t *prompt_ids; /* either token ids ... */
    size_t n_prompt_ids;
    const char *prompt_text; /* ... or text (tokenized with the model's tokenizer) */
    size_t prompt_text_len;
    bool add_special;   /* text only: add BOS/EOS as the model asks */
    bool parse_special; /* text only: recognize control-token text (chat templates); never for user text */
    ember_sampling sampling;
    int max_tokens;                 /* > 0; generation stops after this many tokens */
    const char *const *stop;        /* stop strings, matched across token boundaries */
    size_t n_stop;
    const int32_t *stop_tokens;     /* extra stop token ids (end-of-generation tokens always stop) */
    size_t n_stop_tokens;
    bool ignore_eos;                /* keep going past end-of-generation tokens */
    /* Optional: a grammar in llama.cpp's GBNF (start rule `root`) that the generated text must
     * follow (constrained decoding; copied). Each token is drawn among those that keep the text a
     * prefix of a sentence of the grammar; end-of-generation tokens are allowed only once the text
     * is a whole sentence, and generation stops when nothing can follow. A grammar that does not
     * compile fails the submission with the reason (rule, line, column). */
    const char *grammar;
    size_t grammar_len; /* 0: strlen(grammar) */
    /* Optional, instead of `grammar` (which is then ignored): the grammar compiled already. The
     * request takes its own reference; the caller keeps its. */
    ember_grammar *compiled_grammar;
    /* Optional, with a grammar: a lazy grammar. The output is free until it contains one of these
     * texts (the earliest in the output wins); from the trigger's first byte on, the rest of the
     * output must follow the grammar (which so describes each trigger too). When the token that
     * completes a trigger carries bytes after it that the grammar refuses, generation stops there.
     * Copied; none: the grammar applies from the start. */
    const char *const *grammar_triggers;
    size_t n_grammar_triggers;
    /* Optional: texts of control tokens that count as output text for this request: a tool call's
     * marker that the model writes as one control token (Mistral's `[TOOL_CALLS]`, Llama 3.1's
     * `<|python_tag|>`). A control token whose text is one of these is detokenized as that text
     * (so stop strings, a lazy grammar's trigger and the caller see it) and is allowed by a
     * grammar wherever the grammar allows its text. Texts that name no control token of the
     * vocabulary are ignored (other tokens are text already). Copied; at most 16. */
    const char *const *control_texts;
    size_t n_control_texts;
    /* Optional: output delivered by callback instead of ember_request_next. It runs on the engine
     * thread, once per generated token (and for held-back text) and once more with `finish` set;
     * it must return quickly and must not call into the engine except ember_request_cancel.
     * ember_request_next then only reports the finish. */
    void (*on_output)(const ember_output *output, void *user);
    void *user;
    /* Speculative decoding for this request (an ember_spec; EMBER_SPEC_DEFAULT: the engine's).
     * Requests with a grammar never speculate. */
    int speculative;
    /* An embedding instead of generated text: the prompt runs through the model in the engine's
     * batched prefill, its final hidden states are pooled (`pooling`, an ember_pooling;
     * EMBER_POOLING_NONE: the engine's) and normalized, and the last output carries the vector.
     * Sampling, stops, grammars and max_tokens are ignored; the prompt may fill the whole context.
     * Fails at submission when no pooling is known or the backend cannot return hidden states. */
    bool embed;
    int pooling;
} ember_request_params;

/* Fills `params` with defaults: no prompt, temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * penalties off, seed 0, max_tokens 256, add_special true, parse_special false. */
void ember_request_default(ember_request_params *params);

typedef struct ember_request ember_request;

/* Queues a request; it joins the running batch at the next engine step. The prompt and stop
 * strings are copied. Fails at once for an empty or too long prompt or bad parameters. */
ember_error *ember_submit(ember_engine *engine, const ember_request_params *params, ember_request **out);

typedef enum ember_finish_reason {
    EMBER_FINISH_NONE = 0,   /* still running */
    EMBER_FINISH_STOP,       /* end-of-generation token, stop token or stop string */
    EMBER_FINISH_LENGTH,     /* max_tokens or the context length */
    EMBER_FINISH_CANCELLED,  /* ember_request_cancel or engine shutdown */
    EMBER_FINISH_ERROR,      /* the engine could not run it (message in ember_output.error) */
} ember_finish_reason;

typedef struct ember_top_logprob {
    int32_t token;
    float logprob;
} ember_top_logprob;

/* One generated token and the text it completes. */
typedef struct ember_token_out {
    int32_t token;
    float logprob;                  /* when logprobs > 0 */
    const ember_top_logprob *top;   /* `logprobs` alternatives, most likely first */
    int n_top;
} ember_token_out;

/* What ember_request_next hands out: the tokens generated since the last call and the text they
 * complete (UTF-8, never a partial character; text that may begin a stop string is held back until
 * it is decided). */
struct ember_output {
    const ember_token_out *tokens;
    size_t n_tokens;
    const char *text;
    size_t text_len;
    ember_finish_reason finish; /* != NONE on the last output */
    const char *stop_string;    /* the stop string that ended generation, if one did */
    const char *error;          /* message when finish == EMBER_FINISH_ERROR */
    /* With EMBER_FINISH_ERROR: the request itself could not be followed, not the engine failing
     * (its grammar turned out too ambiguous to follow at this point of the output: more parses
     * at once than the grammar module allows). The output so far is a prefix the grammar takes;
     * the same request fails the same way again, so a server answers it as the client's error. */
    bool invalid_request;
    /* An embedding request's vector (ember_request_params.embed), unit length, on its last output
     * when it finished with EMBER_FINISH_STOP; NULL otherwise. Valid until the request's release. */
    const float *embedding;
    size_t n_embedding;
};

/* Waits up to timeout_ms (-1 = forever) for new output. Returns true with `out` filled when there
 * is output or the request finished; false on timeout. After the final output, returns true with
 * n_tokens 0 and finish set, again and again. */
bool ember_request_next(ember_request *request, ember_output *out, int timeout_ms);

/* Asks the engine to stop the request; it leaves the batch at the next step. */
void ember_request_cancel(ember_request *request);

typedef struct ember_timings {
    double queued_ms;        /* submission → admitted into the batch */
    double prefill_ms;       /* admitted → first token sampled (prefill of the uncached part) */
    double first_token_ms;   /* submission → first token */
    double decode_ms;        /* first token → last token */
    double decode_tokens_per_second;
    uint32_t prompt_tokens, cached_tokens, generated_tokens;
    uint32_t draft_tokens, draft_accepted; /* speculative decoding: drafted, and accepted of those */
    /* Of cached_tokens, those restored from the prefix cache's host-RAM and disk tiers, and the
     * time their restore took (at admission: within queued_ms). */
    uint32_t ram_tokens, disk_tokens;
    double restore_ms;
} ember_timings;

void ember_request_timings(ember_request *request, ember_timings *out);

/* Cancels the request if still running and frees the handle. */
void ember_request_release(ember_request *request);

#ifdef __cplusplus
}
#endif

#endif
