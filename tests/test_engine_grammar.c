/* Constrained decoding through the engine on a tiny random model (CPU): every answer under a
 * grammar or a JSON schema is a whole sentence of it and ends there; a constrained request in a
 * batch leaves its neighbours' tokens unchanged; the backend's masked pick equals the host's;
 * stop strings, the prefix cache and bad grammars behave. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ember.h"
#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include "model/model.h"

#define VOCAB EM_FIXTURES_DIR "/vocab/ggml-vocab-llama-spm.gguf"
#define DIR EM_BINARY_DIR "/test_engine_grammar_files"
#define MODEL DIR "/tiny-llama.gguf"
/* The same model over a vocabulary where two tokens are Mistral's call markers, as control tokens. */
#define MARKER_VOCAB DIR "/vocab-markers.gguf"
#define MARKER_MODEL DIR "/tiny-llama-markers.gguf"
#define MARKER_CALLS 31990 /* [TOOL_CALLS] */
#define MARKER_ARGS 31991  /* [ARGS] */
#define MAX_OUT 400

/* Writes the fixture vocabulary's tokenizer with two tokens turned into control tokens that carry
 * Mistral's marker texts (Mistral's own vocabularies have them as control tokens). */
static em_err write_marker_vocab(void) {
    em_gguf *v;
    em_err err = em_gguf_open(VOCAB, &v);
    if (err) return err;
    em_gguf_writer *w;
    if ((err = em_gguf_writer_new(3, &w))) {
        em_gguf_close(v);
        return err;
    }
    for (uint64_t i = 0; i < em_gguf_kv_count(v) && !err; i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(v, i);
        if (em_str_eq(kv->key, "tokenizer.ggml.tokens")) {
            const uint64_t n = kv->array_len;
            const char **strs = malloc(n * sizeof *strs);
            uint64_t *lens = malloc(n * sizeof *lens);
            assert_non_null(strs);
            assert_non_null(lens);
            for (uint64_t t = 0; t < n; t++) strs[t] = kv->strings[t].ptr, lens[t] = kv->strings[t].len;
            strs[MARKER_CALLS] = "[TOOL_CALLS]", lens[MARKER_CALLS] = 12;
            strs[MARKER_ARGS] = "[ARGS]", lens[MARKER_ARGS] = 6;
            err = em_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", strs, lens, n);
            free(strs);
            free(lens);
        } else if (em_str_eq(kv->key, "tokenizer.ggml.token_type")) {
            int32_t *types = malloc(kv->array_len * sizeof *types);
            assert_non_null(types);
            for (uint64_t t = 0; t < kv->array_len; t++) types[t] = (int32_t)em_gguf_array_int(kv, t);
            types[MARKER_CALLS] = types[MARKER_ARGS] = EM_TOKEN_CONTROL;
            err = em_gguf_writer_add_array(w, "tokenizer.ggml.token_type", EM_GGUF_INT32, types, kv->array_len);
            free(types);
        } else {
            err = em_gguf_writer_copy_kv(w, kv);
        }
    }
    if (!err) err = em_gguf_writer_write(w, MARKER_VOCAB);
    em_gguf_writer_free(w);
    em_gguf_close(v);
    return err;
}

static int setup(void **state) {
    (void)state;
    mkdir(DIR, 0755);
    em_synth_options o = {.preset = "tiny-llama", .type = "f32", .seed = 11, .vocab_path = VOCAB};
    em_err err = em_synth_write(&o, MODEL);
    if (!err) err = write_marker_vocab();
    o.vocab_path = MARKER_VOCAB;
    if (!err) err = em_synth_write(&o, MARKER_MODEL);
    if (err) fail_msg("synth: %s", em_err_message(err));
    return 0;
}

static ember_engine *new_engine_for(const char *model) {
    ember_options o;
    ember_options_default(&o);
    o.model_path = model;
    o.device = "cpu";
    o.threads = 2;
    o.ctx_tokens = 1024;
    ember_engine *e;
    ember_error *err = ember_engine_create(&o, &e);
    if (err) fail_msg("engine: %s", ember_error_message(err));
    return e;
}

static ember_engine *new_engine(void) { return new_engine_for(MODEL); }

typedef struct result {
    int32_t tokens[MAX_OUT];
    uint32_t n;
    ember_finish_reason finish;
    char text[8192];
    size_t text_len;
    char stop_string[32]; /* copied: the output's pointer dies with the request */
} result;

static ember_request_params text_params(const char *prompt, const char *grammar, uint64_t seed) {
    ember_request_params p;
    ember_request_default(&p);
    p.prompt_text = prompt;
    p.max_tokens = MAX_OUT;
    p.sampling.temperature = 1.0f;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.seed = seed;
    p.grammar = grammar;
    return p;
}

static ember_request *submit(ember_engine *e, const ember_request_params *p) {
    ember_request *r;
    ember_error *err = ember_submit(e, p, &r);
    if (err) fail_msg("submit: %s", ember_error_message(err));
    return r;
}

static void collect(ember_request *r, result *res) {
    memset(res, 0, sizeof *res);
    ember_output out;
    do {
        assert_true(ember_request_next(r, &out, 300000));
        for (size_t i = 0; i < out.n_tokens; i++) res->tokens[res->n++] = out.tokens[i].token;
        assert_true(res->text_len + out.text_len < sizeof res->text);
        memcpy(res->text + res->text_len, out.text, out.text_len);
        res->text_len += out.text_len;
    } while (out.finish == EMBER_FINISH_NONE);
    res->finish = out.finish;
    if (out.stop_string) snprintf(res->stop_string, sizeof res->stop_string, "%s", out.stop_string);
    if (out.finish == EMBER_FINISH_ERROR) fail_msg("request failed: %s", out.error);
    assert_false(out.invalid_request);
    ember_request_release(r);
}

static em_grammar *compile(const char *gbnf) {
    em_grammar *g;
    em_err err = em_grammar_compile(gbnf, strlen(gbnf), &g);
    if (err) fail_msg("compile: %s", em_err_message(err));
    return g;
}

/* The text is a whole sentence of the grammar. */
static void assert_sentence(const char *gbnf, const result *res) {
    em_grammar *g = compile(gbnf);
    em_grammar_state *s;
    assert_null(em_grammar_state_new(g, &s));
    if (!em_grammar_accept_bytes(s, res->text, res->text_len) || !em_grammar_complete(s))
        fail_msg("not a sentence of the grammar: '%.*s'", (int)res->text_len, res->text);
    if (getenv("SHOW")) fprintf(stderr, "%u tokens: %.*s\n", res->n, (int)res->text_len, res->text);
    em_grammar_state_free(s);
    em_grammar_free(g);
}

static char *schema_grammar(const char *schema) {
    char *gbnf;
    em_err err = em_grammar_from_json_schema(schema, strlen(schema), &gbnf);
    if (err) fail_msg("schema: %s", em_err_message(err));
    return gbnf;
}

/* Small answers end on their own: the grammar cannot go on, so the request stops. */
static void test_closed_grammars(void **state) {
    (void)state;
    ember_engine *e = new_engine();
    const char *grammar = "root ::= (\"yes\" | \"no\") \"!\"{1,3}";
    for (uint64_t seed = 1; seed <= 6; seed++) {
        ember_request_params p = text_params("Is it raining?", grammar, seed);
        result res;
        collect(submit(e, &p), &res);
        assert_int_equal(res.finish, EMBER_FINISH_STOP);
        assert_sentence(grammar, &res);
    }
    ember_engine_destroy(e);
}

/* JSON schemas: every answer parses under its grammar and ends with the end of the value. */
static void test_json_schemas(void **state) {
    (void)state;
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},\"age\":{\"type\":\"integer\","
        "\"minimum\":0,\"maximum\":120}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
        "{\"enum\":[\"red\",\"green\",\"blue\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}",
        "{\"type\":\"string\",\"format\":\"date\"}",
    };
    ember_engine *e = new_engine();
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        char *gbnf = schema_grammar(schemas[i]);
        for (uint64_t seed = 1; seed <= 3; seed++) {
            ember_request_params p = text_params("Answer in JSON:", gbnf, seed * 31 + i);
            result res;
            collect(submit(e, &p), &res);
            if (res.finish != EMBER_FINISH_STOP)
                fail_msg("schema %zu seed %llu: finish %d after '%.*s'", i, (unsigned long long)seed, res.finish,
                         (int)res.text_len, res.text);
            assert_sentence(gbnf, &res);
        }
        free(gbnf);
    }
    ember_engine_destroy(e);
}

/* A constrained request next to unconstrained ones: theirs are the tokens they get alone, and its
 * tokens are the same whether the backend picks them (masked) or the host does (logprobs). */
static void test_batch_neighbours(void **state) {
    (void)state;
    const char *grammar = "root ::= [a-z ]{5,40} \".\"";
    ember_engine *e = new_engine();
    ember_request_params plain = text_params("Once upon a time", NULL, 5);
    plain.max_tokens = 20;
    plain.ignore_eos = true;
    result alone, beside, constrained, constrained_host;
    collect(submit(e, &plain), &alone);
    ember_stats before, after;
    ember_engine_stats(e, &before);
    ember_request_params c = text_params("Say something", grammar, 9);
    ember_request *rc = submit(e, &c), *rp = submit(e, &plain);
    collect(rc, &constrained);
    collect(rp, &beside);
    ember_engine_stats(e, &after);
    assert_int_equal(alone.n, beside.n);
    assert_memory_equal(alone.tokens, beside.tokens, alone.n * sizeof *alone.tokens);
    assert_sentence(grammar, &constrained);
    /* the CPU backend applied the mask itself: every token of the two was picked there */
    assert_int_equal(after.backend_picked_tokens - before.backend_picked_tokens, constrained.n + beside.n);
    /* with step overlap (the engine_grammar_overlap run), a constrained request's masks come late:
     * alone, its steps chain (all but the first, planned one, and the one its last token ends) and
     * its tokens are the same */
    const char *overlap = getenv("EMBER_CPU_OVERLAP");
    if (overlap && !strcmp(overlap, "1")) {
        result again;
        ember_engine_stats(e, &before);
        collect(submit(e, &c), &again);
        ember_engine_stats(e, &after);
        assert_int_equal(again.n, constrained.n);
        assert_memory_equal(again.tokens, constrained.tokens, again.n * sizeof *again.tokens);
        assert_true(after.overlapped_steps - before.overlapped_steps + 2 >= again.n);
    }
    c.sampling.logprobs = 2; /* the host path */
    collect(submit(e, &c), &constrained_host);
    assert_int_equal(constrained.n, constrained_host.n);
    assert_memory_equal(constrained.tokens, constrained_host.tokens, constrained.n * sizeof *constrained.tokens);
    ember_engine_destroy(e);
}

/* Stop strings still stop a constrained request; the prefix cache serves a repeated prompt and the
 * answer is the same. */
static void test_stop_and_cache(void **state) {
    (void)state;
    ember_engine *e = new_engine();
    const char *grammar = "root ::= \"abc\" \"x\"* \"d\"";
    const char *stops[] = {"c"};
    ember_request_params p = text_params("Letters:", grammar, 3);
    p.stop = stops;
    p.n_stop = 1;
    result res;
    collect(submit(e, &p), &res);
    assert_int_equal(res.finish, EMBER_FINISH_STOP);
    assert_string_equal(res.stop_string, "c");
    assert_int_equal(res.text_len, 2);
    assert_memory_equal(res.text, "ab", 2);

    const char *json = "root ::= \"{\" [a-z]{1,6} \"}\"";
    char prompt[600];
    memset(prompt, 'w', sizeof prompt - 1);
    for (size_t i = 5; i < sizeof prompt - 1; i += 6) prompt[i] = ' ';
    prompt[sizeof prompt - 1] = '\0';
    ember_request_params q = text_params(prompt, json, 17);
    result first, second;
    ember_request *r = submit(e, &q);
    collect(r, &first);
    r = submit(e, &q);
    ember_timings t;
    ember_output out;
    /* read the second one by hand to see its timings before release */
    memset(&second, 0, sizeof second);
    do {
        assert_true(ember_request_next(r, &out, 300000));
        for (size_t i = 0; i < out.n_tokens; i++) second.tokens[second.n++] = out.tokens[i].token;
    } while (out.finish == EMBER_FINISH_NONE);
    ember_request_timings(r, &t);
    ember_request_release(r);
    assert_true(t.cached_tokens > 0);
    assert_int_equal(first.n, second.n);
    assert_memory_equal(first.tokens, second.tokens, first.n * sizeof *first.tokens);
    assert_sentence(json, &first);
    ember_engine_destroy(e);
}

/* A lazy grammar: free text until the trigger, the grammar from the trigger on. A logit bias makes
 * the first token the trigger "e"; then three digits and "." must follow, and the answer ends. */
static void test_lazy_grammar(void **state) {
    (void)state;
    em_gguf *gguf;
    em_tokenizer *tok;
    assert_null(em_gguf_open(VOCAB, &gguf));
    assert_null(em_tokenizer_from_gguf(gguf, &tok));
    em_gguf_close(gguf);
    const int32_t e_token = em_tokenizer_find(tok, "e", 1);
    em_tokenizer_free(tok);
    assert_true(e_token >= 0);
    ember_engine *e = new_engine();
    const char *grammar = "root ::= \"e\" [0-9]{3} \".\"";
    ember_logit_bias bias = {.token = e_token, .bias = 100.0f};
    ember_request_params p = text_params("Go:", grammar, 21);
    const char *trigger_e[] = {"e"};
    p.grammar_triggers = trigger_e;
    p.n_grammar_triggers = 1;
    p.sampling.logit_bias = &bias;
    p.sampling.n_logit_bias = 1;
    result res;
    collect(submit(e, &p), &res);
    assert_int_equal(res.finish, EMBER_FINISH_STOP);
    assert_sentence(grammar, &res);
    assert_int_equal(res.text_len, 5);

    /* A trigger that never comes leaves the text free: the request runs to max_tokens. */
    ember_request_params q = text_params("Go:", grammar, 22);
    const char *never[] = {"\x01never\x02"};
    q.grammar_triggers = never;
    q.n_grammar_triggers = 1;
    q.max_tokens = 12;
    q.ignore_eos = true;
    collect(submit(e, &q), &res);
    assert_int_equal(res.finish, EMBER_FINISH_LENGTH);
    assert_int_equal(res.n, 12);

    /* Several triggers: any of them switches the grammar on (here the second, "e", the one the
     * output writes), and the run is the one with "e" alone. */
    result one_trigger, two_triggers;
    collect(submit(e, &p), &one_trigger);
    const char *either[] = {"\x01never\x02", "e"};
    p.grammar_triggers = either;
    p.n_grammar_triggers = 2;
    collect(submit(e, &p), &two_triggers);
    assert_int_equal(two_triggers.finish, EMBER_FINISH_STOP);
    assert_int_equal(two_triggers.n, one_trigger.n);
    assert_memory_equal(two_triggers.tokens, one_trigger.tokens, one_trigger.n * sizeof *one_trigger.tokens);
    assert_sentence(grammar, &two_triggers);

    /* An empty trigger is refused at submission. */
    const char *empty[] = {"e", ""};
    p.grammar_triggers = empty;
    ember_request *refused;
    ember_error *err = ember_submit(e, &p, &refused);
    assert_non_null(err);
    assert_non_null(strstr(ember_error_message(err), "grammar trigger 1 is empty"));
    ember_error_free(err);
    ember_engine_destroy(e);
}

/* A call's marker that the model writes as one control token (Mistral's [TOOL_CALLS], Llama 3.1's
 * <|python_tag|>): with the request's control_texts naming it, the token's text is output, a lazy
 * grammar's trigger sees it, and a grammar that must write the marker allows the token. Without
 * them the control token has no text, as for any other request. */
static void test_control_token_marker(void **state) {
    (void)state;
    ember_engine *e = new_engine_for(MARKER_MODEL);
    const char *markers[] = {"[TOOL_CALLS]", "[ARGS]"};
    const char *grammar = "root ::= \"[TOOL_CALLS][\" [0-9]{2} \"]\"";
    ember_logit_bias bias = {.token = MARKER_CALLS, .bias = 100.0f};
    result res;

    /* (a) The lazy grammar switches on at the control token. */
    ember_request_params p = text_params("Go:", grammar, 31);
    const char *trigger[] = {"[TOOL_CALLS]"};
    p.grammar_triggers = trigger;
    p.n_grammar_triggers = 1;
    p.sampling.logit_bias = &bias;
    p.sampling.n_logit_bias = 1;
    p.control_texts = markers;
    p.n_control_texts = 2;
    collect(submit(e, &p), &res);
    assert_int_equal(res.tokens[0], MARKER_CALLS);
    assert_int_equal(res.finish, EMBER_FINISH_STOP);
    assert_sentence(grammar, &res);

    /* Without control_texts the token is there but its text is not: the trigger never fires. */
    p.control_texts = NULL;
    p.n_control_texts = 0;
    p.max_tokens = 6;
    p.ignore_eos = true;
    collect(submit(e, &p), &res);
    assert_int_equal(res.tokens[0], MARKER_CALLS);
    assert_int_equal(res.finish, EMBER_FINISH_LENGTH);
    assert_null(memmem(res.text, res.text_len, "[TOOL_CALLS]", 12));

    /* (c) A grammar that must write the marker allows the control token, and the model takes it. */
    ember_request_params q = text_params("Go:", grammar, 32);
    q.sampling.logit_bias = &bias;
    q.sampling.n_logit_bias = 1;
    q.control_texts = markers;
    q.n_control_texts = 2;
    collect(submit(e, &q), &res);
    assert_int_equal(res.tokens[0], MARKER_CALLS);
    assert_sentence(grammar, &res);
    /* Without control_texts the token is masked out: the marker is spelled in plain tokens. */
    q.control_texts = NULL;
    q.n_control_texts = 0;
    collect(submit(e, &q), &res);
    assert_true(res.n > 1);
    for (uint32_t i = 0; i < res.n; i++) assert_int_not_equal(res.tokens[i], MARKER_CALLS);
    assert_sentence(grammar, &res);

    /* Texts that are no control token change nothing; too many are refused. */
    const char *plain[] = {"e", "no such token"};
    q.control_texts = plain;
    q.n_control_texts = 2;
    collect(submit(e, &q), &res);
    assert_sentence(grammar, &res);
    const char *many[17];
    for (size_t i = 0; i < 17; i++) many[i] = "[ARGS]";
    q.control_texts = many;
    q.n_control_texts = 17;
    ember_request *r;
    ember_error *err = ember_submit(e, &q, &r);
    assert_non_null(err);
    assert_non_null(strstr(ember_error_message(err), "control_texts"));
    ember_error_free(err);
    ember_engine_destroy(e);
}

/* A grammar too ambiguous to follow fails its own request, with the reason, as the request's fault
 * (invalid_request: a server answers it as the client's error, not its own); a neighbour in the
 * same steps finishes as it would alone. */
static void test_ambiguous_grammar_fails_alone(void **state) {
    (void)state;
    ember_engine *e = new_engine();
    ember_request_params plain = text_params("Once upon a time", NULL, 5);
    plain.max_tokens = 30;
    plain.ignore_eos = true;
    result alone, beside;
    collect(submit(e, &plain), &alone);
    ember_request_params bad = text_params("Say a", "root ::= (\"a\" | \"a\" root+){2,5}", 2);
    ember_request *rb = submit(e, &bad), *rp = submit(e, &plain);
    ember_output out;
    do assert_true(ember_request_next(rb, &out, 300000));
    while (out.finish == EMBER_FINISH_NONE);
    assert_int_equal(out.finish, EMBER_FINISH_ERROR);
    assert_non_null(strstr(out.error, "too ambiguous"));
    assert_true(out.invalid_request);
    ember_request_release(rb);
    collect(rp, &beside);
    assert_int_equal(alone.n, beside.n);
    assert_memory_equal(alone.tokens, beside.tokens, alone.n * sizeof *alone.tokens);
    ember_engine_destroy(e);
}

/* With ignore_eos a grammar that could end anywhere runs to max_tokens (no end-of-generation token
 * is allowed, as llama-server's ignore_eos masks it), and the text stays inside the grammar. */
static void test_ignore_eos(void **state) {
    (void)state;
    const char *gbnf = "root ::= (\"<\" [a-z]{1,6} \">\")*\n";
    ember_engine *e = new_engine();
    for (uint64_t seed = 1; seed <= 3; seed++) {
        ember_request_params p = text_params("Tags:", gbnf, seed);
        p.ignore_eos = true;
        p.max_tokens = 96;
        result res;
        collect(submit(e, &p), &res);
        assert_int_equal(res.finish, EMBER_FINISH_LENGTH);
        assert_int_equal(res.n, 96);
        em_grammar *g = compile(gbnf);
        em_grammar_state *s;
        assert_null(em_grammar_state_new(g, &s));
        if (!em_grammar_accept_bytes(s, res.text, res.text_len))
            fail_msg("outside the grammar: '%.*s'", (int)res.text_len, res.text);
        em_grammar_state_free(s);
        em_grammar_free(g);
    }
    ember_engine_destroy(e);
}

static void test_bad_grammar(void **state) {
    (void)state;
    ember_engine *e = new_engine();
    ember_request_params p = text_params("Hi", "root ::= value\n", 1);
    ember_request *r = NULL;
    ember_error *err = ember_submit(e, &p, &r);
    assert_null(r);
    assert_non_null(err);
    assert_non_null(strstr(ember_error_message(err), "rule 'value' is used but not defined"));
    ember_error_free(err);
    ember_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_grammars), cmocka_unit_test(test_json_schemas),
        cmocka_unit_test(test_batch_neighbours), cmocka_unit_test(test_stop_and_cache),
        cmocka_unit_test(test_lazy_grammar), cmocka_unit_test(test_ambiguous_grammar_fails_alone),
        cmocka_unit_test(test_bad_grammar), cmocka_unit_test(test_ignore_eos),
        cmocka_unit_test(test_control_token_marker),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
