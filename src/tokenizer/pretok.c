/* Pre-tokenizers of byte-level BPE vocabularies: the regexes that split text into words before
 * merging, selected by the name in tokenizer.ggml.pre.
 *
 * A pre-tokenizer is a list of regexes applied in turn: each one splits every piece the previous
 * ones produced into its matches and the unmatched stretches between them (Hugging Face's
 * "Isolated" split behaviour). Each piece is matched as a subject of its own, so look-arounds do
 * not see past its ends. The regexes are format data: the patterns each model's tokenizer.json
 * declares (in the form GGUF runtimes use), compiled once with PCRE2 in UTF + UCP mode (\p{L},
 * \s ... follow Unicode) and JIT-compiled. `$` means end of subject only, as in the regex engines
 * these patterns were written for. Input is validated UTF-8 before it gets here, so matching skips
 * PCRE2's own UTF check (which would otherwise rescan the rest of the text at every match). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_REGEXES 6

struct em_pretok {
    const char *name;
    size_t n;
    pcre2_code *codes[MAX_REGEXES];
};

/* The GPT-2 split pattern (tiktoken r50k). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* Llama 3 (tiktoken cl100k with case-insensitive contractions spelled out). */
#define RE_LLAMA3                                                                                              \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "    \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen 2 / 3: as Llama 3 but one digit per word. */
#define RE_QWEN2                                                                                               \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "         \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_BLOOM " ?[^(\\s|.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94\xD8\x8C)]+"

typedef struct pretok_def {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    const char *regexes[MAX_REGEXES];
} pretok_def;

static const pretok_def defs[] = {
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|dbrx|smaug-bpe|chatglm-bpe|midm-2.0|lfm2", {RE_LLAMA3}},
    {"qwen2|qwen3|stablelm2|deepseek-r1-qwen|megrez|hunyuan", {RE_QWEN2}},
    {"gpt-2|gpt2|mpt|olmo|jais|gpt-neox|phi-2|roberta-bpe|jina-es|jina-de|gigachat|jina-v1-en|jina-v2-es|"
     "jina-v2-de|jina-v2-code|trillion",
     {RE_GPT2}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", {"\\p{N}", RE_GPT2}},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    {"deepseek-llm",
     {"[\r\n]",
      "\\s?[A-Za-z\xC2\xB5\xC3\x80-\xC3\x96\xC3\x98-\xC3\xB6\xC3\xB8-\xC6\xBA\xC6\xBC-\xC6\xBF\xC7\x84-\xCA\x93"
      "\xCA\x95-\xCA\xAF\xCD\xB0-\xCD\xB3\xCD\xB6\xCD\xB7\xCD\xBB-\xCD\xBD\xCD\xBF\xCE\x86\xCE\x88-\xCE\x8A"
      "\xCE\x8C\xCE\x8E-\xCE\xA1\xCE\xA3-\xCF\xB5\xCF\xB7-\xD2\x81\xD2\x8A-\xD4\xAF\xD4\xB1-\xD5\x96"
      "\xE1\x82\xA0-\xE1\x83\x85\xE1\x8E\xA0-\xE1\x8F\xB5\xE1\x8F\xB8-\xE1\x8F\xBD\xE1\xB2\x90-\xE1\xB2\xBA"
      "\xE1\xB2\xBD-\xE1\xB2\xBF\xE1\xB4\x80-\xE1\xB4\xAB\xE1\xB5\xAB-\xE1\xB5\xB7\xE1\xB5\xB9-\xE1\xB6\x9A"
      "\xE1\xB8\x80-\xE1\xBC\x95\xE1\xBC\x98-\xE1\xBC\x9D\xE1\xBC\xA0-\xE1\xBD\x85\xE1\xBD\x88-\xE1\xBD\x8D"
      "\xE1\xBD\x90-\xE1\xBD\x97\xE1\xBD\x99\xE1\xBD\x9B\xE1\xBD\x9D\xE1\xBD\x9F-\xE1\xBD\xBD"
      "\xE1\xBE\x80-\xE1\xBE\xB4\xE1\xBE\xB6-\xE1\xBE\xBC\xE1\xBE\xBE\xE1\xBF\x82-\xE1\xBF\x84"
      "\xE1\xBF\x86-\xE1\xBF\x8C\xE1\xBF\x90-\xE1\xBF\x93\xE1\xBF\x96-\xE1\xBF\x9B\xE1\xBF\xA0-\xE1\xBF\xAC"
      "\xE1\xBF\xB2-\xE1\xBF\xB4\xE1\xBF\xB6-\xE1\xBF\xBC\xE2\x84\x82\xE2\x84\x87\xE2\x84\x8A-\xE2\x84\x93"
      "\xE2\x84\x95\xE2\x84\x99-\xE2\x84\x9D\xE2\x84\xA4\xE2\x84\xA6\xE2\x84\xA8\xE2\x84\xAA-\xE2\x84\xAD"
      "\xE2\x84\xAF-\xE2\x84\xB4\xE2\x84\xB9\xE2\x84\xBC-\xE2\x84\xBF\xE2\x85\x85-\xE2\x85\x89\xE2\x85\x8E"
      "\xE2\x86\x83\xE2\x86\x84\xE2\xB0\x80-\xE2\xB1\xBB\xE2\xB1\xBE-\xE2\xB3\xA4\xE2\xB3\xAB-\xE2\xB3\xAE"
      "\xE2\xB3\xB2\xE2\xB3\xB3\xEA\x99\x80-\xEA\x99\xAD\xEA\x9A\x80-\xEA\x9A\x9B\xEA\x9C\xA2-\xEA\x9D\xAF"
      "\xEA\x9D\xB1-\xEA\x9E\x87\xEA\x9E\x8B-\xEA\x9E\x8E\xEA\xAD\xB0-\xEA\xAE\xBF\xEF\xAC\x80-\xEF\xAC\x86"
      "\xEF\xAC\x93-\xEF\xAC\x97\xEF\xBC\xA1-\xEF\xBC\xBA\xEF\xBD\x81-\xEF\xBD\x9A\xF0\x90\x90\x80-\xF0\x90\x91\x8F"
      "\xF0\x90\x92\xB0-\xF0\x90\x93\x93\xF0\x90\x93\x98-\xF0\x90\x93\xBB\xF0\x90\xB2\x80-\xF0\x90\xB2\xB2"
      "\xF0\x90\xB3\x80-\xF0\x90\xB3\xB2\xF0\x91\xA2\xA0-\xF0\x91\xA3\x9F\xF0\x9E\xA4\x80-\xF0\x9E\xA5\x83]+",
      "\\s?[!-/:-~\xEF\xBC\x81-\xEF\xBC\x8F\xEF\xBC\x9A-\xEF\xBD\x9E\xE2\x80\x98-\xE2\x80\x9F\xE3\x80\x80-\xE3\x80\x82]+",
      "\\s+$", "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED\x9E\xBF]+", "\\p{N}+"}},
    {"deepseek-coder",
     {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED\x9E\xBF]+",
      "\\p{N}"}},
    {"deepseek-v3",
     {"\\p{N}{1,3}", "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
    {"gpt-4o|llama4",
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'"
      "ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|"
      "'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"tekken",
     {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-"
      "z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)"}},
    {"poro-chat|bloom|gpt3-finnish", {RE_BLOOM}},
    {"viking", {RE_BLOOM, "\\p{N}"}},
};

static bool name_in(const char *names, const char *name) {
    size_t n = strlen(name);
    for (const char *p = names; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !memcmp(p, name, n)) return true;
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

em_err em_pretok_new(const char *name, em_pretok **out) {
    *out = NULL;
    const pretok_def *def = NULL;
    for (size_t i = 0; i < sizeof defs / sizeof defs[0] && !def; i++)
        if (name_in(defs[i].names, name)) def = &defs[i];
    if (!def) {
        em_log(EM_LOG_WARN, "tokenizer: unknown pre-tokenizer '%s' (tokenizer.ggml.pre); using the default one", name);
        def = &defs[0];
    }
    em_pretok *p = calloc(1, sizeof *p);
    if (!p) return em_errorf(EM_ERR_NOMEM, "tokenizer: out of memory for the pre-tokenizer");
    p->name = def->names;
    for (size_t i = 0; i < MAX_REGEXES && def->regexes[i]; i++) {
        int code;
        PCRE2_SIZE offset;
        p->codes[i] = pcre2_compile((PCRE2_SPTR)def->regexes[i], PCRE2_ZERO_TERMINATED,
                                    PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &code, &offset, NULL);
        if (!p->codes[i]) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(code, message, sizeof message);
            em_pretok_free(p);
            return em_errorf(EM_ERR_INTERNAL, "tokenizer: pre-tokenizer '%s' regex %zu does not compile at %zu: %s", name,
                             i, (size_t)offset, (const char *)message);
        }
        /* JIT is an optimization: without it (a platform PCRE2 lacks JIT on) matching still works. */
        (void)pcre2_jit_compile(p->codes[i], PCRE2_JIT_COMPLETE);
        p->n++;
    }
    *out = p;
    return NULL;
}

void em_pretok_free(em_pretok *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n; i++) pcre2_code_free(p->codes[i]);
    free(p);
}

typedef struct span {
    size_t off, len;
} span;

typedef struct spans {
    span *items;
    size_t n, cap;
} spans;

static em_err spans_push(spans *s, size_t off, size_t len) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        span *grown = realloc(s->items, cap * sizeof *grown);
        if (!grown) return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory while pre-tokenizing");
        s->items = grown;
        s->cap = cap;
    }
    s->items[s->n++] = (span){off, len};
    return NULL;
}

typedef struct matcher {
    pcre2_match_data *data;
    pcre2_match_context *context;
    pcre2_jit_stack *stack;
} matcher;

/* One match in subject[0, len) at or after start: 1 found, 0 none, error otherwise. */
static em_err find(matcher *m, const pcre2_code *code, const char *subject, size_t len, size_t start, size_t *mstart,
                   size_t *mend, int *found) {
    for (;;) {
        int rc = pcre2_match(code, (PCRE2_SPTR)subject, len, start, PCRE2_NO_UTF_CHECK, m->data, m->context);
        if (rc == PCRE2_ERROR_NOMATCH) {
            *found = 0;
            return NULL;
        }
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !m->stack) {
            /* Rare (very long runs): retry with a larger JIT stack. */
            m->stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
            m->context = pcre2_match_context_create(NULL);
            if (!m->stack || !m->context) return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory for the regex stack");
            pcre2_jit_stack_assign(m->context, NULL, m->stack);
            continue;
        }
        if (rc < 0) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(rc, message, sizeof message);
            return em_errorf(EM_ERR_INTERNAL, "tokenize: pre-tokenizer regex failed: %s", (const char *)message);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->data);
        *mstart = ov[0];
        *mend = ov[1];
        *found = 1;
        return NULL;
    }
}

em_err em_pretok_split(const em_pretok *p, const char *text, size_t len, em_pretok_word_fn word, void *user) {
    spans a = {0}, b = {0};
    matcher m = {pcre2_match_data_create(1, NULL), NULL, NULL};
    em_err err = NULL;
    if (!m.data) return em_errorf(EM_ERR_NOMEM, "tokenize: out of memory for regex matching");
    if ((err = spans_push(&a, 0, len))) goto done;
    for (size_t r = 0; r < p->n; r++) {
        b.n = 0;
        for (size_t i = 0; i < a.n; i++) {
            const char *subject = text + a.items[i].off;
            size_t slen = a.items[i].len, pos = 0, gap = 0;
            while (pos < slen) {
                size_t ms, me;
                int found;
                if ((err = find(&m, p->codes[r], subject, slen, pos, &ms, &me, &found))) goto done;
                if (!found) break;
                if (me == ms) { /* an empty match: step over one character */
                    pos = ms + em_utf8_len((unsigned char)subject[ms]);
                    continue;
                }
                if (ms > gap && (err = spans_push(&b, a.items[i].off + gap, ms - gap))) goto done;
                if ((err = spans_push(&b, a.items[i].off + ms, me - ms))) goto done;
                pos = gap = me;
            }
            if (gap < slen && (err = spans_push(&b, a.items[i].off + gap, slen - gap))) goto done;
        }
        spans swap = a;
        a = b;
        b = swap;
    }
    for (size_t i = 0; i < a.n; i++)
        if ((err = word(user, text + a.items[i].off, a.items[i].len))) goto done;
done:
    free(a.items);
    free(b.items);
    pcre2_match_data_free(m.data);
    pcre2_match_context_free(m.context);
    pcre2_jit_stack_free(m.stack);
    return err;
}
