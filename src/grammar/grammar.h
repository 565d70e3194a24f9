/*
 * grammar — constrained decoding: a grammar compiled to a byte-level pushdown automaton, and per
 * step the set of tokens of the model's vocabulary that keep the output inside the grammar.
 *
 * Input is llama.cpp's GBNF text (`name ::= alternatives`, literals, character classes with
 * ranges and negation, `.`, groups, `* + ? {m} {m,} {m,n}`, `#` comments; `root` is the start),
 * or a JSON Schema, which schema.c turns into GBNF first, so there is one compiler. Compilation
 * (parse.c) lowers everything to bytes: a character class becomes the UTF-8 byte sequences of its
 * code points (so tokens that end inside a character, byte-fallback tokens, need no special
 * case), repetitions become helper rules (x* is R ::= x R | empty; {m,n} is m copies then nested
 * optionals, so a string has one derivation), and each alternative is a run of elements (a byte
 * set, or a rule reference) ended by an END element in one flat array.
 *
 * The automaton (state.c) is the classic nondeterministic one: a stack is the position of the next
 * terminal plus the return positions below it; the parse state is the set of stacks that can still
 * continue. Stacks are hash-consed nodes (position, parent), so a state is a sorted array of node
 * ids; states are interned too, and the transition (state, byte) → state is memoized: walking the
 * automaton lazily builds a DFA, and what was computed once (inside a JSON string, say) costs one
 * hash probe afterwards. A return to the end of an alternative is not pushed (a tail call), so
 * right recursion (every repetition) does not deepen the stack. Left recursion would not
 * terminate, and is a compile error naming the rule. Positions from which an alternative can never
 * end are never entered, so every accepted text can still be completed (a constrained generation
 * cannot walk into a dead end), and each stack knows the fewest bytes that complete it. Within one
 * step each (position, stack) is expanded once, and a state of more than 256 stacks (a grammar so
 * ambiguous that its parses multiply with every byte) is an error rather than a stall.
 *
 * Token masks (vocab.c): the vocabulary's token byte strings form a trie; the mask of a state is a
 * walk of that trie against the automaton that prunes every subtree the state cannot enter, and
 * it is cached per state, so a state seen before costs a copy; the engine also keeps a cache of
 * masks shared by all requests (cache.c), keyed by grammar and the content of the state, so
 * requests with the same grammar walk each state once between them. That cache also keeps position
 * tables (internal.h): for a grammar position that comes back in new parse states, the tokens a
 * stack there accepts whatever lies below it, and those that leave its rules; a state's mask is
 * the union over its stacks, so a state seen for the first time costs its stacks' tables plus a
 * check of their uncertain tokens instead of a walk of the trie. End-of-generation tokens are allowed
 * only when the grammar is complete (the empty stack is in the state); tokens without bytes
 * (control tokens) never are.
 *
 * Grammars come from requests: compiling one is bounded (limits on nesting, rules and elements)
 * and watched (em_grammar_watch: its caller may stop it, and work past a CPU-time bound is refused),
 * and a server keeps compiled grammars by their text (em_grammar_cache, compiled.c) so that the
 * grammars requests repeat are compiled once.
 *
 * Ownership and threads: an em_grammar is immutable once compiled (any thread may read it, many
 * states may share it; it must outlive them). An em_grammar_vocab is immutable too and belongs to
 * whoever built it (the engine: one per model). An em_grammar_state belongs to one request and is
 * used by one thread at a time; it owns its caches, which grow with what it has seen and are
 * dropped as a whole past a fixed size. Errors are em_err values that say what and where (rule
 * name, line and column of the grammar text, or the JSON pointer of a schema keyword).
 *
 * Not here: tokenization (src/tokenizer), applying masks to logits (src/engine), the HTTP fields
 * that carry grammars (src/server).
 */
#ifndef EMBER_GRAMMAR_H
#define EMBER_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "../tokenizer/tokenizer.h"

typedef struct em_grammar em_grammar;

/* Limits on what one grammar may cost, each an EM_ERR_INVALID naming it when passed: nesting of
 * groups (parentheses, which the parser follows by recursion), rules (the text's and the helpers
 * that repetitions and groups make) and elements (terminals and rule references of all rules).
 * They bound both the stack and the compile work of a request's grammar. */
#define EM_GRAMMAR_MAX_NESTING 256
#define EM_GRAMMAR_MAX_RULES (1 << 18)
#define EM_GRAMMAR_MAX_ELEMENTS (1 << 22)
/* The most parse stacks one state may hold (state.c): a grammar whose parses multiply past it is
 * too ambiguous to follow. */
#define EM_GRAMMAR_MAX_STACKS 256

/* Compiles GBNF text (need not be NUL-terminated). The start rule is `root`. Errors
 * (EM_ERR_INVALID) name the line, the column and the rule: a syntax error, a reference to an
 * undefined rule, a rule defined twice, left recursion, a missing root, a limit above passed.
 * The work is linear in the text's size and the grammar's (rules are found by hash). */
em_err em_grammar_compile(const char *gbnf, size_t len, em_grammar **out);
/* A compiled grammar is shared by reference count (the server compiles a request's grammar once
 * and hands it to the engine): retain takes one more reference (any thread), free gives one back
 * and frees the grammar with the last. Compiling gives the first. */
em_grammar *em_grammar_retain(em_grammar *grammar);
void em_grammar_free(em_grammar *grammar);
/* Compiles and checks that a parse state can start (the start must not need more than
 * EM_GRAMMAR_MAX_STACKS stacks): the whole check that a request's grammar is usable, done when
 * the request is read, so that a grammar too ambiguous to follow is the client's error then
 * rather than the engine's at submission. */
em_err em_grammar_compile_checked(const char *gbnf, size_t len, em_grammar **out);

/* ---- Compiling what requests send ----
 * A grammar or schema from a request may be as large as the request, so its compilation is
 * watched: every few thousand units of work (rules, elements, schema nodes) the compiling thread
 * asks whether to go on. Work past the watch's CPU time is refused (EM_ERR_RANGE, naming the
 * limit: a client's error, as a grammar too large is); work whose `stop` says so ends at once
 * (EM_ERR_IO: its caller went away, a client that hung up or a server that stops). */
typedef struct em_grammar_watch {
    double cpu_seconds;  /* the CPU time allowed (for the message); 0: no limit */
    double cpu_deadline; /* on the compiling thread's CPU clock (em_grammar_thread_seconds) */
    bool (*stop)(void *self); /* NULL: never */
    void *self;
} em_grammar_watch;
/* A watch that allows cpu_seconds (0: no limit) of the calling thread's CPU time from now. */
void em_grammar_watch_init(em_grammar_watch *watch, double cpu_seconds, bool (*stop)(void *self), void *self);
/* The calling thread's CPU time in seconds. */
double em_grammar_thread_seconds(void);

/* A JSON Schema (text) → GBNF text (malloc'd, NUL-terminated). Supported keywords and the regex
 * subset of `pattern` are listed in schema.c; any other keyword is an EM_ERR_UNSUPPORTED naming
 * it and where it is (a JSON pointer), never ignored. `schema` NULL means "any JSON object"
 * (OpenAI's json_object mode). */
em_err em_grammar_from_json_schema(const char *schema, size_t len, char **gbnf);

/* ---- Compiled grammars shared by content ----
 * Requests repeat their grammars (an agent sends the same tools with every turn), so compiled
 * grammars are kept by the text they came from: a GBNF text → its compiled grammar (checked as
 * em_grammar_compile_checked does), a JSON schema's text → its GBNF. Both are byte-level, so no
 * vocabulary is part of the key (the masks, which depend on one, are em_grammar_masks'). A text
 * is compiled once however many requests send it, at once or one after another: a thread asking
 * for a text another is compiling waits for it (watching its own `stop`), and compiles it itself
 * if that one gives up. Refusals are kept too (a grammar too large is refused at the cost of a
 * lookup the second time); work stopped by its watch and work that ran out of memory are not.
 * At most max_entries texts and max_bytes (keys and what they compiled to); past either, the
 * least recently used go. A compiled grammar is immutable and reference-counted, so one dropped
 * from the cache lives on in the requests that hold it. Any thread may use the cache. */
typedef struct em_grammar_cache em_grammar_cache;
em_err em_grammar_cache_new(size_t max_entries, size_t max_bytes, em_grammar_cache **out);
/* Frees the cache; the grammars it handed out stay with their holders. */
void em_grammar_cache_free(em_grammar_cache *cache);
/* The compiled grammar of `gbnf` (a reference for the caller: em_grammar_free), from the cache or
 * compiled now under `watch` (NULL: unwatched). `cache` NULL: compiled now, kept nowhere. */
em_err em_grammar_cache_compile(em_grammar_cache *cache, const char *gbnf, size_t len, const em_grammar_watch *watch,
                                em_grammar **out);
/* The GBNF of a JSON schema's text (as em_grammar_from_json_schema; malloc'd for the caller),
 * from the cache or converted now under `watch`. `cache` NULL: converted now, kept nowhere. */
em_err em_grammar_cache_schema(em_grammar_cache *cache, const char *schema, size_t len, const em_grammar_watch *watch,
                               char **gbnf);
typedef struct em_grammar_cache_stats {
    uint64_t compiled; /* texts compiled or converted (refusals included) */
    uint64_t reused;   /* answers from the cache (a wait for another thread's compilation included) */
    uint64_t stopped;  /* compilations their watch stopped (their caller went away) */
    size_t entries, bytes;
} em_grammar_cache_stats;
void em_grammar_cache_stats_get(em_grammar_cache *cache, em_grammar_cache_stats *out);

/* ---- Vocabulary ---- */

typedef struct em_grammar_vocab em_grammar_vocab;

/* The byte strings of tokens 0..n_tokens-1 as the tokenizer decodes them (em_token_to_piece,
 * without special text), in a trie. n_tokens may exceed the tokenizer's vocabulary (padded output
 * rows): those rows have no bytes and are never allowed. The control tokens listed in
 * `text_controls` (n_text_controls ids, may be NULL) count as their text instead: a tool call's
 * opening marker that the model writes as one control token (Mistral's `[TOOL_CALLS]`) is then
 * allowed wherever the grammar allows that text. */
em_err em_grammar_vocab_new(const em_tokenizer *tokenizer, uint32_t n_tokens, const int32_t *text_controls,
                            size_t n_text_controls, em_grammar_vocab **out);
/* The same from explicit pieces (tests): pieces[i] of lens[i] bytes; is_end[i] marks
 * end-of-generation tokens (may be NULL). */
em_err em_grammar_vocab_from_pieces(const char *const *pieces, const size_t *lens, const bool *is_end,
                                    uint32_t n_tokens, em_grammar_vocab **out);
void em_grammar_vocab_free(em_grammar_vocab *vocab);
uint32_t em_grammar_vocab_size(const em_grammar_vocab *vocab);

/* ---- Parse state (one per constrained sequence) ---- */

typedef struct em_grammar_state em_grammar_state;

/* A fresh state at the start of `root`. The grammar must outlive the state. */
em_err em_grammar_state_new(const em_grammar *grammar, em_grammar_state **out);
void em_grammar_state_free(em_grammar_state *state);

/* Feeds bytes; false (state unchanged) when the grammar does not allow them here. */
bool em_grammar_accept_bytes(em_grammar_state *state, const void *bytes, size_t len);
/* Feeds a token of `vocab`: its bytes, or for an end-of-generation token the end of the text
 * (allowed only when complete; afterwards nothing is). False (state unchanged) when not allowed. */
bool em_grammar_accept_token(em_grammar_state *state, const em_grammar_vocab *vocab, int32_t token);
/* Why the state stopped working (out of memory, or a grammar too ambiguous to follow: a mask, or
 * a token it allowed, needed more than 256 parse stacks), or NULL while it works. */
const char *em_grammar_failure(const em_grammar_state *state);
/* The state stopped working because the grammar is too ambiguous to follow here (more than
 * EM_GRAMMAR_MAX_STACKS stacks): the grammar's fault, not the machine's (see em_grammar_failure). */
bool em_grammar_too_ambiguous(const em_grammar_state *state);
/* The text so far is a whole sentence of the grammar (end of generation would be allowed). */
bool em_grammar_complete(const em_grammar_state *state);
/* Some byte may still follow (false: only the end is left, or nothing at all). */
bool em_grammar_can_continue(const em_grammar_state *state);

/* Writes the allowed tokens of `vocab` as a bitset: bit t of mask[t / 32] (size ceil(n/32) words,
 * n = em_grammar_vocab_size). Returns the number of allowed tokens (0: the grammar cannot go on in
 * this vocabulary). Errors: EM_ERR_NOMEM, or EM_ERR_UNSUPPORTED when the grammar is so ambiguous
 * that the parse state would hold more than 256 stacks (the state is unusable afterwards). */
em_err em_grammar_mask(em_grammar_state *state, const em_grammar_vocab *vocab, uint32_t *mask, uint32_t *n_allowed);

/* ---- Masks shared between parse states ---- */

/* A cache of masks for every parse state of one vocabulary: keyed by the grammar (its compiled
 * form, compared exactly) and the parse state's stacks, so that requests following the same
 * grammar (the same schema, the same tools) compute each mask once between them. At most
 * max_bytes (masks, keys, grammars); past it the least recently used masks go. Used by one thread
 * at a time (the engine's); the vocabulary must outlive it. */
typedef struct em_grammar_masks em_grammar_masks;
em_err em_grammar_masks_new(const em_grammar_vocab *vocab, size_t max_bytes, em_grammar_masks **out);
void em_grammar_masks_free(em_grammar_masks *masks);

/* em_grammar_mask through a shared cache (`shared` may be NULL: none; a cache of another
 * vocabulary is not used): a mask the state has not seen is looked up there before the vocabulary
 * is walked, and a walked one is filed there. */
em_err em_grammar_mask_shared(em_grammar_state *state, const em_grammar_vocab *vocab, em_grammar_masks *shared,
                              uint32_t *mask, uint32_t *n_allowed);

/* Clears the end-of-generation tokens from a mask em_grammar_mask wrote, *n_allowed with them (a
 * request that ignores end-of-generation: it goes on while the grammar can, and stops where only
 * the end is left). */
void em_grammar_mask_drop_ends(const em_grammar_vocab *vocab, uint32_t *mask, uint32_t *n_allowed);

/* Which bytes may come next: allowed[b] for each byte value (tests, random generation). */
void em_grammar_next_bytes(em_grammar_state *state, bool allowed[256]);
/* The fewest bytes that complete the text from here (UINT32_MAX when it cannot be completed). */
uint32_t em_grammar_bytes_to_complete(const em_grammar_state *state);

/* A random sentence of the grammar (tests: the strings a schema allows). Bytes are drawn
 * uniformly among the allowed ones, stopping at random once complete; past `soft_limit` bytes
 * only bytes that bring the end closer are drawn, so it always terminates. *text is malloc'd and
 * NUL-terminated (the grammar may allow NUL bytes inside: *len is the length). */
em_err em_grammar_generate(const em_grammar *grammar, uint64_t seed, size_t soft_limit, char **text, size_t *len);

#endif
