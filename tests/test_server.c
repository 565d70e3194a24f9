/* The HTTP server: request parsers (fields, defaults, every kind of bad input), response and SSE
 * formatters (exact bytes against the shapes of OpenAI's and Anthropic's API references), the
 * Prometheus text, the store of responses and the Responses and Ollama parsers. The HTTP layer over real sockets is tests/test_server_http.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/internal.h"

#include "server_fake.h"

/* ---- Parsers ---- */

static void parse_chat_ok(const char *body, em_server_request *req) {
    em_server_error err = {0};
    bool ok = em_openai_parse_chat(body, strlen(body), 1000, req, &err);
    if (!ok) fail_msg("unexpected error %d: %s", err.status, err.message);
}

static void test_parse_chat_fields(void **state) {
    (void)state;
    em_server_request req;
    parse_chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                  "{\"role\":\"assistant\",\"content\":null},{\"role\":\"user\",\"content\":\"hi\"}],"
                  "\"temperature\":0.5,\"top_p\":0.9,\"n\":3,\"max_completion_tokens\":7,\"stop\":[\"x\",\"\",\"yz\"],"
                  "\"seed\":-5,\"logprobs\":true,\"top_logprobs\":2,\"presence_penalty\":0.25,"
                  "\"frequency_penalty\":-1,\"logit_bias\":{\"10\":-100,\"999\":5.5},\"user\":\"u1\","
                  "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"top_k\":4}",
                  &req);
    assert_int_equal(req.api, EM_API_OPENAI_CHAT);
    assert_string_equal(req.model, "m");
    char *messages = json_dumps(req.messages, JSON_COMPACT);
    assert_string_equal(messages, "[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"a\\nb\"},"
                                  "{\"role\":\"assistant\",\"content\":\"\"},{\"role\":\"user\",\"content\":\"hi\"}]");
    free(messages);
    assert_true(req.sampling.temperature == 0.5f);
    assert_true(req.sampling.top_p == 0.9f);
    assert_int_equal(req.sampling.top_k, 4);
    assert_int_equal(req.n, 3);
    assert_int_equal(req.max_tokens, 7);
    assert_int_equal(req.n_stop, 2);
    assert_string_equal(req.stop[0], "x");
    assert_string_equal(req.stop[1], "yz");
    assert_true(req.seed_given);
    assert_true(req.sampling.seed == (uint64_t)-5);
    assert_true(req.logprobs);
    assert_int_equal(req.top_logprobs, 2);
    assert_true(req.sampling.presence_penalty == 0.25f);
    assert_true(req.sampling.frequency_penalty == -1.0f);
    assert_int_equal(req.sampling.n_logit_bias, 2);
    assert_int_equal(req.sampling.logit_bias[0].token, 10);
    assert_true(req.sampling.logit_bias[0].bias == -100.0f);
    assert_int_equal(req.sampling.logit_bias[1].token, 999);
    assert_true(req.sampling.logit_bias[1].bias == 5.5f);
    assert_true(req.stream);
    assert_true(req.include_usage);
    em_server_request_clear(&req);

    /* defaults: the program's temperature (0.8, as `ember run`), nucleus and top-k off, no limit, one choice */
    parse_chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":\"END\",\"max_tokens\":null}", &req);
    assert_true(req.sampling.temperature == 0.8f);
    assert_true(req.sampling.top_p == 1.0f);
    assert_int_equal(req.sampling.top_k, 0);
    assert_true(req.sampling.min_p == 0.0f);
    assert_int_equal(req.n, 1);
    assert_int_equal(req.max_tokens, 0);
    assert_false(req.stream);
    assert_false(req.logprobs);
    assert_false(req.seed_given);
    assert_int_equal(req.n_stop, 1);
    assert_string_equal(req.stop[0], "END");
    em_server_request_clear(&req);
}

typedef struct bad_case {
    const char *body;
    int status;
    const char *param;   /* expected err.param */
    const char *message; /* a substring of err.message */
} bad_case;

static void check_bad(const bad_case *c, bool (*parse)(const char *, size_t, em_server_request *, em_server_error *)) {
    em_server_request req;
    em_server_error err = {0};
    bool ok = parse(c->body, strlen(c->body), &req, &err);
    em_server_request_clear(&req);
    if (ok) fail_msg("accepted: %s", c->body);
    if (err.status != c->status || strcmp(err.param, c->param) || !strstr(err.message, c->message))
        fail_msg("%s\n  got %d param '%s' message '%s'", c->body, err.status, err.param, err.message);
}

/* Parsing, then making the grammar as a request to a model without reasoning would: a grammar's
 * errors are found there. */
static bool parse_chat_made(const char *b, size_t n, em_server_request *r, em_server_error *e) {
    const em_server_grammar_maker unshared = {0};
    return em_openai_parse_chat(b, n, 1000, r, e) && em_server_make_grammar(r, &unshared, EM_TOOL_FORMAT_JSON, false, false, e);
}
static bool parse_completions_1000(const char *b, size_t n, em_server_request *r, em_server_error *e) {
    return em_openai_parse_completions(b, n, 1000, r, e);
}

#define HI "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_parse_chat_errors(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {"{\"model\":", 400, "", "not valid JSON"},
        {"[1,2]", 400, "", "must be a JSON object"},
        {"{" HI "}", 400, "model", "'model' is required"},
        {"{\"model\":5," HI "}", 400, "model", "'model' must be a string"},
        {"{\"model\":\"m\"}", 400, "messages", "'messages' is required"},
        {"{\"model\":\"m\",\"messages\":[]}", 400, "messages", "non-empty array"},
        {"{\"model\":\"m\",\"messages\":\"hi\"}", 400, "messages", "non-empty array"},
        {"{\"model\":\"m\",\"messages\":[{\"content\":\"hi\"}]}", 400, "messages[0]", "string 'role'"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"hi\"}]}", 400, "messages[0].tool_call_id",
         "'messages[0].tool_call_id' is required"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"critic\",\"content\":\"hi\"}]}", 400, "messages[0]", "'critic' is not supported"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content", "is required"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":7}]}", 400, "messages[0].content", "string or an array"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
         "messages[0].content", "'image_url' are not supported"},
        {"{\"model\":\"m\"," HI ",\"temperature\":\"hot\"}", 400, "temperature", "must be a number"},
        {"{\"model\":\"m\"," HI ",\"temperature\":2.5}", 400, "temperature", "between 0 and 2"},
        {"{\"model\":\"m\"," HI ",\"top_p\":1.5}", 400, "top_p", "between 0 and 1"},
        {"{\"model\":\"m\"," HI ",\"n\":0}", 400, "n", "between 1 and 16"},
        {"{\"model\":\"m\"," HI ",\"n\":1.5}", 400, "n", "must be an integer"},
        {"{\"model\":\"m\"," HI ",\"max_tokens\":0}", 400, "max_tokens", "at least 1"},
        {"{\"model\":\"m\"," HI ",\"max_tokens\":-3}", 400, "max_tokens", "at least 1, got -3"},
        {"{\"model\":\"m\"," HI ",\"max_completion_tokens\":0}", 400, "max_completion_tokens", "at least 1"},
        {"{\"model\":\"m\"," HI ",\"max_tokens\":\"10\"}", 400, "max_tokens", "must be an integer"},
        {"{\"model\":\"m\"," HI ",\"stop\":5}", 400, "stop", "string or an array of strings"},
        {"{\"model\":\"m\"," HI ",\"stop\":[\"a\",1]}", 400, "stop", "string or an array of strings"},
        {"{\"model\":\"m\"," HI ",\"presence_penalty\":3}", 400, "presence_penalty", "between -2 and 2"},
        {"{\"model\":\"m\"," HI ",\"logit_bias\":{\"abc\":1}}", 400, "logit_bias", "'abc' is not a token id"},
        {"{\"model\":\"m\"," HI ",\"logit_bias\":{\"1000\":1}}", 400, "logit_bias", "below 1000"},
        {"{\"model\":\"m\"," HI ",\"logit_bias\":{\"5\":101}}", 400, "logit_bias", "[-100, 100]"},
        {"{\"model\":\"m\"," HI ",\"top_logprobs\":21,\"logprobs\":true}", 400, "top_logprobs", "between 0 and 20"},
        {"{\"model\":\"m\"," HI ",\"stream\":\"yes\"}", 400, "stream", "must be a boolean"},
        {"{\"model\":\"m\"," HI ",\"stream_options\":[]}", 400, "stream_options", "must be an object"},
        {"{\"model\":\"m\"," HI ",\"user\":1}", 400, "user", "must be a string"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{}]}]}", 400,
         "messages[0].tool_calls", "must have function.name and function.arguments"},
        {"{\"model\":\"m\"," HI ",\"tools\":{}}", 400, "tools", "must be an array"},
        {"{\"model\":\"m\"," HI ",\"tools\":[{\"type\":\"web\"}]}", 400, "tools[0]", "\"type\": \"function\""},
        {"{\"model\":\"m\"," HI ",\"tool_choice\":\"required\"}", 400, "tool_choice", "needs 'tools'"},
        {"{\"model\":\"m\"," HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":"
         "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", 400, "tool_choice", "not in 'tools'"},
        {"{\"model\":\"m\"," HI ",\"response_format\":{\"type\":\"xml\"}}", 400, "response_format.type", "'xml' is not one of"},
        {"{\"model\":\"m\"," HI ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
         "{\"type\":\"string\",\"format\":\"ipv4\"}}}}", 400, "response_format.json_schema.schema", "format \"ipv4\" is not supported"},
        {"{\"model\":\"m\"," HI ",\"grammar\":\"root ::= [\"}", 400, "grammar", "unterminated character class"},
        {"{\"model\":\"m\"," HI ",\"grammar\":\"root ::= \\\"a\\\"\",\"response_format\":{\"type\":\"json_object\"}}", 400,
         "grammar", "exclude each other"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_bad(&cases[i], parse_chat_made);
}

static void test_parse_completions(void **state) {
    (void)state;
    em_server_request req;
    em_server_error err = {0};
    const char *b1 = "{\"model\":\"m\",\"prompt\":\"Once\",\"logprobs\":0,\"max_tokens\":5}";
    assert_true(em_openai_parse_completions(b1, strlen(b1), 1000, &req, &err));
    assert_int_equal(req.n_prompts, 1);
    assert_false(req.prompts[0].is_ids);
    assert_string_equal(req.prompts[0].text, "Once");
    assert_true(req.logprobs);
    assert_int_equal(req.top_logprobs, 0);
    em_server_request_clear(&req);

    const char *b2 = "{\"model\":\"m\",\"prompt\":[\"a\",\"bc\"],\"logprobs\":3}";
    assert_true(em_openai_parse_completions(b2, strlen(b2), 1000, &req, &err));
    assert_int_equal(req.n_prompts, 2);
    assert_string_equal(req.prompts[1].text, "bc");
    assert_int_equal(req.top_logprobs, 3);
    em_server_request_clear(&req);

    const char *b3 = "{\"model\":\"m\",\"prompt\":[1,2,999]}";
    assert_true(em_openai_parse_completions(b3, strlen(b3), 1000, &req, &err));
    assert_int_equal(req.n_prompts, 1);
    assert_true(req.prompts[0].is_ids);
    assert_int_equal(req.prompts[0].n_ids, 3);
    assert_int_equal(req.prompts[0].ids[2], 999);
    assert_false(req.logprobs);
    em_server_request_clear(&req);

    const char *b4 = "{\"model\":\"m\",\"prompt\":[[1,2],[3]]}";
    assert_true(em_openai_parse_completions(b4, strlen(b4), 1000, &req, &err));
    assert_int_equal(req.n_prompts, 2);
    assert_int_equal(req.prompts[1].n_ids, 1);
    assert_int_equal(req.prompts[1].ids[0], 3);
    em_server_request_clear(&req);

    static const bad_case cases[] = {
        {"{\"model\":\"m\"}", 400, "prompt", "'prompt' is required"},
        {"{\"model\":\"m\",\"prompt\":5}", 400, "prompt", "must be a string"},
        {"{\"model\":\"m\",\"prompt\":[1,1000]}", 400, "prompt", "token 1 is not a token id below 1000"},
        {"{\"model\":\"m\",\"prompt\":[1,-1]}", 400, "prompt", "token 1 is not a token id"},
        {"{\"model\":\"m\",\"prompt\":[\"a\",2]}", 400, "prompt", "must be a string"},
        {"{\"model\":\"m\",\"prompt\":[[]]}", 400, "prompt", "empty array of tokens"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"echo\":true}", 400, "echo", "not supported"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"suffix\":\"b\"}", 400, "suffix", "not supported"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"logprobs\":true}", 400, "logprobs", "must be an integer"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens", "at least 1"},
        {"{\"model\":\"m\",\"n\":3,\"prompt\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"]}",
         400, "n", "43 prompts times n = 3 asks for more than 128"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_bad(&cases[i], parse_completions_1000);
}

static void test_parse_anthropic(void **state) {
    (void)state;
    em_server_request req;
    em_server_error err = {0};
    const char *b = "{\"model\":\"m\",\"max_tokens\":9,\"system\":[{\"type\":\"text\",\"text\":\"sys\"}],"
                    "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q\"}]},"
                    "{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"q2\"}],"
                    "\"stop_sequences\":[\"S\"],\"temperature\":0.2,\"top_k\":5,\"top_p\":0.5,"
                    "\"metadata\":{\"user_id\":\"x\"},\"stream\":true}";
    assert_true(em_anthropic_parse_messages(b, strlen(b), &req, &err));
    char *messages = json_dumps(req.messages, JSON_COMPACT);
    assert_string_equal(messages, "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"q\"},"
                                  "{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"q2\"}]");
    free(messages);
    assert_int_equal(req.max_tokens, 9);
    assert_int_equal(req.n_stop, 1);
    assert_string_equal(req.stop[0], "S");
    assert_true(req.sampling.temperature == 0.2f);
    assert_int_equal(req.sampling.top_k, 5);
    assert_true(req.sampling.top_p == 0.5f);
    assert_true(req.stream);
    em_server_request_clear(&req);

    const char *c = "{\"model\":\"m\",\"system\":\"s\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}";
    assert_true(em_anthropic_parse_count_tokens(c, strlen(c), &req, &err));
    assert_int_equal(json_array_size(req.messages), 2);
    em_server_request_clear(&req);

    static const bad_case cases[] = {
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", 400, "max_tokens", "max_tokens: field required"},
        {"{\"model\":\"m\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", 400, "max_tokens", "at least 1"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", 400, "model", "model: field required"},
        {"{\"model\":\"m\",\"max_tokens\":5}", 400, "messages", "messages: field required"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"q\"}]}", 400, "messages.0",
         "unexpected role 'system'"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", 400,
         "messages.0.content", "'image' are not supported"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"temperature\":1.5}", 400,
         "temperature", "between 0 and 1"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"stop_sequences\":\"S\"}", 400,
         "stop_sequences", "an array of strings"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"metadata\":3}", 400,
         "metadata", "must be an object"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"system\":4}", 400,
         "system", "string or an array"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_bad(&cases[i], em_anthropic_parse_messages);
}

/* ---- Formatters: exact bytes ---- */

#define TIMINGS_JSON                                                                                          \
    "\"timings\":{\"queued_ms\":0.5,\"prefill_ms\":1.25,\"first_token_ms\":2.0,\"decode_ms\":10.0,"           \
    "\"decode_tokens_per_second\":100.0,\"prompt_tokens\":10,\"cached_tokens\":4,\"generated_tokens\":2,"    \
    "\"draft_n\":3,\"draft_n_accepted\":1,\"cache_ram_n\":2,\"cache_disk_n\":1,\"cache_restore_ms\":0.75}"

static ember_timings test_timings(void) {
    return (ember_timings){.queued_ms = 0.5, .prefill_ms = 1.25, .first_token_ms = 2, .decode_ms = 10,
                           .decode_tokens_per_second = 100, .prompt_tokens = 10, .cached_tokens = 4,
                           .generated_tokens = 2, .draft_tokens = 3, .draft_accepted = 1, .ram_tokens = 2,
                           .disk_tokens = 1, .restore_ms = 0.75};
}

static void assert_json(json_t *value, const char *expected) {
    assert_non_null(value);
    char *text = em_server_dump(value);
    json_decref(value);
    if (strcmp(text, expected)) fail_msg("\n got      %s\n expected %s", text, expected);
    free(text);
}

static em_server_choice test_choice(const char *text, ember_finish_reason finish, const char *stop) {
    em_server_choice c;
    memset(&c, 0, sizeof c);
    em_buf_append(&c.text, text, strlen(text));
    em_buf_append(&c.content, text, strlen(text)); /* a chat answer without reasoning or calls */
    c.finish = finish;
    c.stop_string = stop ? strdup(stop) : NULL;
    c.timings = test_timings();
    return c;
}

static void test_format_openai(void **state) {
    (void)state;
    em_server_engine engine = fake_engine();
    em_server_format f = {.id = "chatcmpl-1", .created = 1700000000, .model = "m", .engine = &engine};
    em_server_usage usage = {.prompt_tokens = 10, .completion_tokens = 2, .cached_tokens = 4};
    em_server_request req;
    em_server_request_init(&req, EM_API_OPENAI_CHAT);
    em_server_choice c = test_choice("Hi", EMBER_FINISH_STOP, NULL);
    assert_json(em_openai_chat_response(&f, &req, &c, 1, &usage),
                "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"m\","
                "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"logprobs\":null,"
                "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,\"total_tokens\":12,"
                "\"prompt_tokens_details\":{\"cached_tokens\":4},"
                "\"completion_tokens_details\":{\"reasoning_tokens\":0}}," TIMINGS_JSON "}");

    /* logprobs: the sampled token and its alternatives, with UTF-8 bytes */
    req.logprobs = true;
    req.top_logprobs = 1;
    em_server_token tokens[2] = {{.token = 'H', .logprob = -0.5f, .n_top = 1, .top = {{'H', -0.5f}}},
                                 {.token = 'i', .logprob = -0.25f, .n_top = 1, .top = {{'j', -0.125f}}}};
    c.tokens = tokens;
    c.n_tokens = 2;
    c.finish = EMBER_FINISH_LENGTH;
    assert_json(em_openai_chat_response(&f, &req, &c, 1, &usage),
                "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"m\","
                "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"logprobs\":{\"content\":["
                "{\"token\":\"H\",\"logprob\":-0.5,\"bytes\":[72],\"top_logprobs\":[{\"token\":\"H\",\"logprob\":-0.5,\"bytes\":[72]}]},"
                "{\"token\":\"i\",\"logprob\":-0.25,\"bytes\":[105],\"top_logprobs\":[{\"token\":\"j\",\"logprob\":-0.125,\"bytes\":[106]}]}]},"
                "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,\"total_tokens\":12,"
                "\"prompt_tokens_details\":{\"cached_tokens\":4},"
                "\"completion_tokens_details\":{\"reasoning_tokens\":0}}," TIMINGS_JSON "}");

    req.api = EM_API_OPENAI_COMPLETIONS;
    f.id = "cmpl-1";
    assert_json(em_openai_completion_response(&f, &req, &c, 1, &usage),
                "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"m\","
                "\"choices\":[{\"text\":\"Hi\",\"index\":0,\"logprobs\":{\"tokens\":[\"H\",\"i\"],\"token_logprobs\":[-0.5,-0.25],"
                "\"top_logprobs\":[{\"H\":-0.5},{\"j\":-0.125}],\"text_offset\":[0,1]},\"finish_reason\":\"length\"}],"
                "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,\"total_tokens\":12,"
                "\"prompt_tokens_details\":{\"cached_tokens\":4},"
                "\"completion_tokens_details\":{\"reasoning_tokens\":0}}," TIMINGS_JSON "}");
    c.tokens = NULL;
    em_server_choice_clear(&c);
    assert_json(em_openai_models_json("tiny", 1700000000),
                "{\"object\":\"list\",\"data\":[{\"id\":\"tiny\",\"object\":\"model\",\"created\":1700000000,\"owned_by\":\"ember\"}]}");
}

#define CHUNK_HEAD "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","

static void test_format_openai_stream(void **state) {
    (void)state;
    em_server_format f = {.id = "chatcmpl-1", .created = 1700000000, .model = "m", .engine = NULL};
    em_server_request req;
    em_server_request_init(&req, EM_API_OPENAI_CHAT);
    ember_timings t = test_timings();
    em_server_usage usage = {.prompt_tokens = 10, .completion_tokens = 2, .cached_tokens = 4};
    em_buf out = {0};
    assert_true(em_openai_chat_chunk_start(&out, &f, &req, 0));
    assert_true(em_openai_chunk_delta(&out, &f, &req, 0, "H\xC3\xA9", 3, NULL, 0, EMBER_FINISH_NONE, &t));
    assert_true(em_openai_chunk_delta(&out, &f, &req, 0, "", 0, NULL, 0, EMBER_FINISH_LENGTH, &t));
    assert_true(em_openai_stream_end(&out, &f, &req, &usage, &t));
    assert_string_equal(out.data,
                        CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
                        CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"H\xC3\xA9\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
                        CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}]," TIMINGS_JSON "}\n\n"
                        "data: [DONE]\n\n");
    em_buf_free(&out);

    /* include_usage: "usage": null on every chunk, then a usage chunk with no choices */
    req.include_usage = true;
    assert_true(em_openai_chunk_delta(&out, &f, &req, 1, "x", 1, NULL, 0, EMBER_FINISH_STOP, &t));
    assert_true(em_openai_stream_end(&out, &f, &req, &usage, &t));
    assert_string_equal(out.data,
                        CHUNK_HEAD "\"choices\":[{\"index\":1,\"delta\":{\"content\":\"x\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null," TIMINGS_JSON "}\n\n"
                        CHUNK_HEAD "\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,\"total_tokens\":12,"
                        "\"prompt_tokens_details\":{\"cached_tokens\":4},"
                "\"completion_tokens_details\":{\"reasoning_tokens\":0}}," TIMINGS_JSON "}\n\n"
                        "data: [DONE]\n\n");
    em_buf_free(&out);

    req.api = EM_API_OPENAI_COMPLETIONS;
    req.include_usage = false;
    f.id = "cmpl-1";
    assert_true(em_openai_chunk_delta(&out, &f, &req, 0, "ab", 2, NULL, 0, EMBER_FINISH_NONE, NULL));
    assert_string_equal(out.data, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"m\","
                                  "\"choices\":[{\"index\":0,\"text\":\"ab\",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    em_buf_free(&out);
}

static void test_format_anthropic(void **state) {
    (void)state;
    em_server_format f = {.id = "msg_1", .created = 1700000000, .model = "m", .engine = NULL};
    em_server_usage usage = {.prompt_tokens = 10, .completion_tokens = 2, .cached_tokens = 4};
    em_server_choice c = test_choice("Hi", EMBER_FINISH_STOP, "END");
    assert_json(em_anthropic_message_response(&f, &c, &usage),
                "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\","
                "\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}],\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"END\","
                "\"usage\":{\"input_tokens\":6,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4,\"output_tokens\":2},"
                TIMINGS_JSON "}");
    em_buf out = {0};
    em_server_usage start = {.prompt_tokens = 10, .cached_tokens = 4};
    assert_true(em_anthropic_stream_start(&out, &f, &start));
    em_anthropic_stream st = {0};
    assert_true(em_anthropic_stream_answer(&out, &f, &st, &(em_answer_event){.kind = EM_ANSWER_CONTENT, .text = "Hi", .len = 2}));
    c.finish = EMBER_FINISH_LENGTH;
    free(c.stop_string);
    c.stop_string = NULL;
    assert_true(em_anthropic_stream_end(&out, &st, &c, &usage));
    assert_string_equal(out.data,
                        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\","
                        "\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,"
                        "\"usage\":{\"input_tokens\":6,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4,\"output_tokens\":0}}}\n\n"
                        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
                        "event: ping\ndata: {\"type\":\"ping\"}\n\n"
                        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
                        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
                        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},"
                        "\"usage\":{\"input_tokens\":6,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4,\"output_tokens\":2},"
                        TIMINGS_JSON "}\n\n"
                        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    em_buf_free(&out);
    em_server_choice_clear(&c);
    assert_string_equal(em_anthropic_stop_reason(EMBER_FINISH_STOP, NULL), "end_turn");
    assert_json(em_anthropic_models_json("tiny", 0),
                "{\"data\":[{\"type\":\"model\",\"id\":\"tiny\",\"display_name\":\"tiny\",\"created_at\":\"1970-01-01T00:00:00Z\"}],"
                "\"has_more\":false,\"first_id\":\"tiny\",\"last_id\":\"tiny\"}");
}

static void test_format_errors(void **state) {
    (void)state;
    em_server_error err = {0};
    em_server_error_set(&err, 404, NULL, "model_not_found", "model", "no model '%s'", "x");
    char *body = em_server_error_body(EM_API_OPENAI_CHAT, &err);
    assert_string_equal(body, "{\"error\":{\"message\":\"no model 'x'\",\"type\":\"invalid_request_error\",\"param\":\"model\",\"code\":\"model_not_found\"}}");
    free(body);
    body = em_server_error_body(EM_API_ANTHROPIC_MESSAGES, &err);
    assert_string_equal(body, "{\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":\"no model 'x'\"}}");
    free(body);
    em_server_error_set(&err, 500, NULL, NULL, NULL, "boom");
    body = em_server_error_body(EM_API_OPENAI_COMPLETIONS, &err);
    assert_string_equal(body, "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
    free(body);
    em_buf out = {0};
    assert_true(em_server_stream_error(&out, EM_API_ANTHROPIC_MESSAGES, &err));
    assert_string_equal(out.data, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n");
    em_buf_free(&out);
    /* regression (found by fuzz_server): a message quoting broken UTF-8 still makes a body */
    em_server_error_set(&err, 400, NULL, NULL, "x\xC9", "bad \xC9\xA9\x08 byte \xC9");
    body = em_server_error_body(EM_API_OPENAI_CHAT, &err);
    assert_non_null(body);
    assert_string_equal(body, "{\"error\":{\"message\":\"bad \xC9\xA9\\b byte \xEF\xBF\xBD\",\"type\":\"invalid_request_error\","
                              "\"param\":\"x\xEF\xBF\xBD\",\"code\":null}}");
    free(body);
    assert_string_equal(em_server_error_type(EM_API_ANTHROPIC_MESSAGES, 401), "authentication_error");
    assert_string_equal(em_server_error_type(EM_API_ANTHROPIC_MESSAGES, 413), "request_too_large");
    assert_string_equal(em_server_error_type(EM_API_OPENAI_CHAT, 401), "invalid_request_error");
}

static void test_json_text_and_keys(void **state) {
    (void)state;
    /* invalid UTF-8 (a lone continuation byte, a truncated sequence, an overlong '/') → U+FFFD */
    json_t *s = em_server_json_text("a\x80" "b\xE2\x82" "c\xC0\xAF", 8);
    assert_non_null(s);
    assert_string_equal(json_string_value(s), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD" "c\xEF\xBF\xBD\xEF\xBF\xBD");
    json_decref(s);
    s = em_server_json_text("\xF0\x9F\x94\xA5", 4); /* a valid 4-byte character passes unchanged */
    assert_string_equal(json_string_value(s), "\xF0\x9F\x94\xA5");
    json_decref(s);

    assert_true(em_server_key_matches(NULL, NULL));
    assert_true(em_server_key_matches("secret", "secret"));
    assert_false(em_server_key_matches("secret", NULL));
    assert_false(em_server_key_matches("secret", "secreT"));
    assert_false(em_server_key_matches("secret", "secret2"));
    assert_false(em_server_key_matches("secret", "secre"));
    assert_false(em_server_key_matches("secret", ""));
}

static void test_metrics_text(void **state) {
    (void)state;
    em_server_metrics m;
    em_server_metrics_init(&m);
    em_server_metrics_count(&m, EM_EP_CHAT, 200);
    em_server_metrics_count(&m, EM_EP_CHAT, 200);
    em_server_metrics_count(&m, EM_EP_CHAT, 400);
    em_server_metrics_count(&m, EM_EP_MESSAGES, 401);
    ember_stats stats;
    fake_stats(NULL, &stats);
    const em_grammar_cache_stats grammars = {.compiled = 3, .reused = 5, .stopped = 1, .entries = 2, .bytes = 4096};
    char *text = em_server_metrics_text(&m, &stats, &grammars);
    static const char engine_part[] =
        "# HELP ember_http_requests_total HTTP requests by endpoint and status.\n"
        "# TYPE ember_http_requests_total counter\n"
        "ember_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n"
        "ember_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1\n"
        "ember_http_requests_total{endpoint=\"/v1/messages\",status=\"401\"} 1\n"
        "# HELP ember_prompt_tokens_total Prompt tokens of admitted requests.\n# TYPE ember_prompt_tokens_total counter\nember_prompt_tokens_total 100\n"
        "# HELP ember_generated_tokens_total Tokens generated.\n# TYPE ember_generated_tokens_total counter\nember_generated_tokens_total 50\n"
        "# HELP ember_cached_tokens_total Prompt tokens reused from the prefix cache.\n# TYPE ember_cached_tokens_total counter\nember_cached_tokens_total 30\n"
        "# HELP ember_requests_finished_total Engine requests finished.\n# TYPE ember_requests_finished_total counter\nember_requests_finished_total 0\n"
        "# HELP ember_requests_cancelled_total Engine requests cancelled.\n# TYPE ember_requests_cancelled_total counter\nember_requests_cancelled_total 0\n"
        "# HELP ember_preemptions_total Sequences preempted for memory.\n# TYPE ember_preemptions_total counter\nember_preemptions_total 0\n"
        "# HELP ember_draft_tokens_total Speculative decoding: tokens drafted and verified.\n# TYPE ember_draft_tokens_total counter\nember_draft_tokens_total 40\n"
        "# HELP ember_draft_accepted_tokens_total Speculative decoding: drafted tokens accepted.\n# TYPE ember_draft_accepted_tokens_total counter\nember_draft_accepted_tokens_total 25\n"
        "# HELP ember_queue_length Requests waiting for admission.\n# TYPE ember_queue_length gauge\nember_queue_length 1\n"
        "# HELP ember_running_sequences Sequences in the running batch.\n# TYPE ember_running_sequences gauge\nember_running_sequences 2\n"
        "# HELP ember_kv_blocks_used KV cache blocks in use (running or cached).\n# TYPE ember_kv_blocks_used gauge\nember_kv_blocks_used 10\n"
        "# HELP ember_kv_blocks_free KV cache blocks free.\n# TYPE ember_kv_blocks_free gauge\nember_kv_blocks_free 54\n"
        "# HELP ember_kv_blocks_cached KV cache blocks held only by the prefix cache.\n# TYPE ember_kv_blocks_cached gauge\nember_kv_blocks_cached 4\n";
    static const char grammar_part[] =
        "# HELP ember_grammar_compiles_total Request grammars and schemas compiled (refusals included); the rest came from the cache.\n"
        "# TYPE ember_grammar_compiles_total counter\nember_grammar_compiles_total 3\n"
        "# HELP ember_grammar_cache_hits_total Request grammars and schemas found compiled.\n"
        "# TYPE ember_grammar_cache_hits_total counter\nember_grammar_cache_hits_total 5\n"
        "# HELP ember_grammar_compiles_stopped_total Grammar compilations stopped because their client hung up or the server stopped.\n"
        "# TYPE ember_grammar_compiles_stopped_total counter\nember_grammar_compiles_stopped_total 1\n"
        "# HELP ember_grammar_cache_entries Compiled grammars and schemas kept.\n"
        "# TYPE ember_grammar_cache_entries gauge\nember_grammar_cache_entries 2\n"
        "# HELP ember_grammar_cache_bytes Memory of the compiled grammars and schemas kept.\n"
        "# TYPE ember_grammar_cache_bytes gauge\nember_grammar_cache_bytes 4096\n";
    static const char tier_part[] =
        "# HELP ember_cache_tier_enabled Prefix cache tier on (1) or off (0).\n# TYPE ember_cache_tier_enabled gauge\n"
        "ember_cache_tier_enabled{tier=\"ram\"} 1\nember_cache_tier_enabled{tier=\"disk\"} 0\n"
        "# HELP ember_cache_tier_limit_bytes Prefix cache tier bound in bytes.\n# TYPE ember_cache_tier_limit_bytes gauge\n"
        "ember_cache_tier_limit_bytes{tier=\"ram\"} 8192\nember_cache_tier_limit_bytes{tier=\"disk\"} 65536\n"
        "# HELP ember_cache_tier_bytes Bytes a prefix cache tier holds.\n# TYPE ember_cache_tier_bytes gauge\n"
        "ember_cache_tier_bytes{tier=\"ram\"} 4096\nember_cache_tier_bytes{tier=\"disk\"} 0\n"
        "# HELP ember_cache_tier_blocks KV blocks a prefix cache tier holds.\n# TYPE ember_cache_tier_blocks gauge\n"
        "ember_cache_tier_blocks{tier=\"ram\"} 2\nember_cache_tier_blocks{tier=\"disk\"} 0\n"
        "# HELP ember_cache_tier_stored_blocks_total KV blocks moved into a prefix cache tier from the one above.\n# TYPE ember_cache_tier_stored_blocks_total counter\n"
        "ember_cache_tier_stored_blocks_total{tier=\"ram\"} 5\nember_cache_tier_stored_blocks_total{tier=\"disk\"} 3\n"
        "# HELP ember_cache_tier_hits_total KV blocks restored from a prefix cache tier into the KV pool.\n# TYPE ember_cache_tier_hits_total counter\n"
        "ember_cache_tier_hits_total{tier=\"ram\"} 3\nember_cache_tier_hits_total{tier=\"disk\"} 1\n"
        "# HELP ember_cache_tier_hit_tokens_total Tokens of the KV blocks restored from a prefix cache tier.\n# TYPE ember_cache_tier_hit_tokens_total counter\n"
        "ember_cache_tier_hit_tokens_total{tier=\"ram\"} 48\nember_cache_tier_hit_tokens_total{tier=\"disk\"} 16\n"
        "# HELP ember_cache_tier_evictions_total KV blocks a prefix cache tier gave up (moved down or dropped).\n# TYPE ember_cache_tier_evictions_total counter\n"
        "ember_cache_tier_evictions_total{tier=\"ram\"} 3\nember_cache_tier_evictions_total{tier=\"disk\"} 2\n"
        "# HELP ember_cache_tier_written_bytes_total Bytes moved into a prefix cache tier.\n# TYPE ember_cache_tier_written_bytes_total counter\n"
        "ember_cache_tier_written_bytes_total{tier=\"ram\"} 10240\nember_cache_tier_written_bytes_total{tier=\"disk\"} 6400\n"
        "# HELP ember_cache_tier_read_bytes_total Bytes restored from a prefix cache tier.\n# TYPE ember_cache_tier_read_bytes_total counter\n"
        "ember_cache_tier_read_bytes_total{tier=\"ram\"} 6144\nember_cache_tier_read_bytes_total{tier=\"disk\"} 2100\n"
        "# HELP ember_cache_tier_restore_seconds_total Time spent restoring KV blocks from a prefix cache tier.\n# TYPE ember_cache_tier_restore_seconds_total counter\n"
        "ember_cache_tier_restore_seconds_total{tier=\"ram\"} 0.000250\nember_cache_tier_restore_seconds_total{tier=\"disk\"} 0.001500\n"
        "# HELP ember_cache_disk_files_skipped_total Disk cache files skipped: corrupt, truncated, of another model or unreachable.\n# TYPE ember_cache_disk_files_skipped_total counter\nember_cache_disk_files_skipped_total 2\n";
    static const char step_part[] =
        "# HELP ember_step_seconds Time of one engine step.\n# TYPE ember_step_seconds histogram\n"
        "ember_step_seconds_bucket{le=\"0.001\"} 5\nember_step_seconds_bucket{le=\"0.002\"} 5\n"
        "ember_step_seconds_bucket{le=\"0.005\"} 5\nember_step_seconds_bucket{le=\"0.01\"} 7\n"
        "ember_step_seconds_bucket{le=\"0.02\"} 7\nember_step_seconds_bucket{le=\"0.05\"} 7\n"
        "ember_step_seconds_bucket{le=\"0.1\"} 7\nember_step_seconds_bucket{le=\"0.2\"} 7\n"
        "ember_step_seconds_bucket{le=\"0.5\"} 7\nember_step_seconds_bucket{le=\"1\"} 7\n"
        "ember_step_seconds_bucket{le=\"2\"} 7\nember_step_seconds_bucket{le=\"+Inf\"} 8\n"
        "ember_step_seconds_sum 2.500000\nember_step_seconds_count 8\n";
    char expected[sizeof engine_part + sizeof grammar_part + sizeof tier_part + sizeof step_part];
    snprintf(expected, sizeof expected, "%s%s%s%s", engine_part, grammar_part, tier_part, step_part);
    assert_string_equal(text, expected);
    free(text);
    em_server_metrics_destroy(&m);
}

/* ---- Stored responses ---- */

static json_t *conversation_of(const char *text) {
    return json_pack("[{s:s, s:s}]", "role", "user", "content", text);
}

static void test_response_store(void **state) {
    (void)state;
    /* three entries at most: the least recently used (put or got) goes first */
    em_response_store *store = em_response_store_new(3, 1 << 20);
    assert_non_null(store);
    const char *ids[] = {"resp_a", "resp_b", "resp_c", "resp_d"};
    for (int i = 0; i < 3; i++) {
        json_t *c = conversation_of(ids[i]);
        assert_true(em_response_store_put(store, ids[i], c));
        json_decref(c);
    }
    json_t *got = em_response_store_get(store, "resp_a"); /* a is now the most recent: b goes next */
    assert_string_equal(json_string_value(json_object_get(json_array_get(got, 0), "content")), "resp_a");
    json_decref(got);
    json_t *c = conversation_of("resp_d");
    assert_true(em_response_store_put(store, "resp_d", c));
    json_decref(c);
    assert_null(em_response_store_get(store, "resp_b"));
    for (int i = 0; i < 4; i++) {
        if (i == 1) continue;
        got = em_response_store_get(store, ids[i]);
        assert_non_null(got);
        json_decref(got);
    }
    /* a put under a kept id replaces it */
    c = conversation_of("again");
    assert_true(em_response_store_put(store, "resp_c", c));
    json_decref(c);
    got = em_response_store_get(store, "resp_c");
    assert_string_equal(json_string_value(json_object_get(json_array_get(got, 0), "content")), "again");
    json_decref(got);
    em_response_store_free(store);

    /* bounded by bytes: 100 bytes hold two small entries, not three; a larger one is not kept */
    store = em_response_store_new(8, 100);
    for (int i = 0; i < 3; i++) {
        c = conversation_of("0123456789");
        assert_true(em_response_store_put(store, ids[i], c));
        json_decref(c);
    }
    assert_null(em_response_store_get(store, "resp_a"));
    got = em_response_store_get(store, "resp_c");
    assert_non_null(got);
    json_decref(got);
    char big[200];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    c = conversation_of(big);
    assert_true(em_response_store_put(store, "resp_big", c));
    json_decref(c);
    assert_null(em_response_store_get(store, "resp_big"));
    got = em_response_store_get(store, "resp_c");
    assert_non_null(got);
    json_decref(got);
    em_response_store_free(store);
}

/* The new parsers alone: what becomes of a Responses body and an Ollama body. */
static void test_parse_responses_and_ollama(void **state) {
    (void)state;
    em_response_store *store = em_response_store_new(0, 0);
    json_t *kept = conversation_of("first");
    json_array_append_new(kept, json_pack("{s:s, s:s}", "role", "assistant", "content", "answer"));
    /* a stored response is its conversation and its output items (responses.c's store_answer) */
    json_t *stored = json_pack("{s:o, s:[]}", "messages", kept, "output");
    assert_true(em_response_store_put(store, "resp_1", stored));
    json_decref(stored);
    const char *body = "{\"model\":\"m\",\"previous_response_id\":\"resp_1\",\"instructions\":\"be\",\"input\":["
                       "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"},"
                       "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"f\",\"arguments\":\"{}\"},"
                       "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":[{\"type\":\"input_text\",\"text\":\"ok\"}]},"
                       "{\"type\":\"reasoning\",\"summary\":[]},{\"role\":\"developer\",\"content\":\"d\"}],"
                       "\"tools\":[{\"type\":\"local_shell\"},{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":"
                       "{\"type\":\"function\",\"name\":\"f\"},\"max_output_tokens\":9,\"top_p\":0.5}";
    em_server_request req;
    em_server_error err = {0};
    if (!em_responses_parse(body, strlen(body), store, &req, &err)) fail_msg("%s", err.message);
    char *messages = json_dumps(req.messages, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(messages,
                        "[{\"content\":\"be\",\"role\":\"system\"},{\"content\":\"first\",\"role\":\"user\"},"
                        "{\"content\":\"answer\",\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":{\"a\":1},"
                        "\"name\":\"f\"},\"id\":\"c1\",\"type\":\"function\"},{\"function\":{\"arguments\":{},\"name\":\"f\"},"
                        "\"id\":\"c2\",\"type\":\"function\"}]},{\"content\":\"ok\",\"role\":\"tool\",\"tool_call_id\":\"c1\"},"
                        "{\"content\":\"d\",\"role\":\"system\"}]");
    free(messages);
    assert_int_equal(json_array_size(req.tools), 1);
    assert_int_equal(req.tool_choice, EM_TOOL_NAMED);
    assert_string_equal(req.tool_name, "f");
    assert_int_equal(req.max_tokens, 9);
    assert_true(req.sampling.top_p == 0.5f);
    em_server_request_clear(&req);

    /* reasoning items are the reasoning of the assistant turn after them (its text, else its
     * summary); before a user turn, or encrypted only, they are left out */
    body = "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":\"q\"},"
           "{\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"plan\"}]},"
           "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
           "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"r\"},"
           "{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"s\"}]},"
           "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"done\"}]},"
           "{\"type\":\"reasoning\",\"summary\":[],\"encrypted_content\":\"gAAA\"},"
           "{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"lost\"}]},"
           "{\"role\":\"user\",\"content\":\"more\"},{\"role\":\"assistant\",\"content\":\"ok\"}]}";
    if (!em_responses_parse(body, strlen(body), store, &req, &err)) fail_msg("%s", err.message);
    messages = json_dumps(req.messages, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(messages,
                        "[{\"content\":\"q\",\"role\":\"user\"},{\"content\":\"\",\"reasoning_content\":\"plan\","
                        "\"role\":\"assistant\",\"thinking\":\"plan\",\"tool_calls\":[{\"function\":{\"arguments\":{},"
                        "\"name\":\"f\"},\"id\":\"c1\",\"type\":\"function\"}]},{\"content\":\"r\",\"role\":\"tool\","
                        "\"tool_call_id\":\"c1\"},{\"content\":\"done\",\"reasoning_content\":\"s\",\"role\":\"assistant\","
                        "\"thinking\":\"s\"},{\"content\":\"more\",\"role\":\"user\"},{\"content\":\"ok\","
                        "\"role\":\"assistant\"}]");
    free(messages);
    em_server_request_clear(&req);
    em_response_store_free(store);

    em_server_engine engine = {.model_id = "m"};
    body = "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":"
           "{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},{\"role\":\"tool\",\"content\":\"r\",\"tool_name\":\"f\"}],"
           "\"options\":{\"num_predict\":-1,\"top_k\":5,\"min_p\":0.1,\"repeat_last_n\":-1,\"stop\":[\"x\"]},\"stream\":false}";
    if (!em_ollama_parse(true, body, strlen(body), &engine, &req, &err)) fail_msg("%s", err.message);
    assert_false(req.stream);
    assert_int_equal(req.max_tokens, 0);
    assert_int_equal(req.sampling.top_k, 5);
    assert_int_equal(req.sampling.repeat_last_n, -1);
    assert_true(req.sampling.temperature == 0.8f && req.sampling.repeat_penalty == 1.1f);
    assert_int_equal(req.n_stop, 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(req.messages, 1), "name")), "f");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(json_array_get(json_object_get(
                         json_array_get(req.messages, 0), "tool_calls"), 0), "function"), "arguments"), "a")), 1);
    em_server_request_clear(&req);
    /* regression (found by fuzzing): a call without arguments gets {} and leaks nothing */
    body = "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\"}}]}]}";
    assert_true(em_ollama_parse(true, body, strlen(body), &engine, &req, &err));
    assert_int_equal(json_object_size(json_object_get(json_object_get(json_array_get(json_object_get(
                         json_array_get(req.messages, 0), "tool_calls"), 0), "function"), "arguments")), 0);
    em_server_request_clear(&req);
    body = "{\"model\":\"m\",\"prompt\":\"p\",\"raw\":true}";
    assert_true(em_ollama_parse(false, body, strlen(body), &engine, &req, &err));
    assert_true(req.stream);
    assert_null(req.messages);
    assert_int_equal(req.n_prompts, 1);
    assert_string_equal(req.prompts[0].text, "p");
    em_server_request_clear(&req);
    body = "{\"model\":\"m\",\"prompt\":\"p\",\"format\":\"xml\"}";
    assert_false(em_ollama_parse(false, body, strlen(body), &engine, &req, &err));
    assert_string_equal(err.message, "format: must be \"json\" or a JSON schema");
    em_server_request_clear(&req);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_chat_fields),   cmocka_unit_test(test_parse_chat_errors),
        cmocka_unit_test(test_parse_completions),   cmocka_unit_test(test_parse_anthropic),
        cmocka_unit_test(test_format_openai),       cmocka_unit_test(test_format_openai_stream),
        cmocka_unit_test(test_format_anthropic),    cmocka_unit_test(test_format_errors),
        cmocka_unit_test(test_json_text_and_keys),  cmocka_unit_test(test_metrics_text),
        cmocka_unit_test(test_response_store),      cmocka_unit_test(test_parse_responses_and_ollama),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
