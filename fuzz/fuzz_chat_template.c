/* libFuzzer target for chat templates: the input is a template; it is parsed and, when it parses,
 * rendered against a small conversation with tools, under tight step and byte bounds. When the
 * input holds a NUL byte, what follows it is JSON: an array replaces the messages, an object
 * replaces the extra variables. Templates come from GGUF files and messages from HTTP clients,
 * so every byte here is untrusted input: any crash, leak, sanitizer report or hang is a bug.
 * An input that starts with the byte 0xFF (never the start of a UTF-8 template) is amplified
 * (amplify.h): a few bytes stand for deep nesting or wide fan-out. Each input runs on a thread of
 * 512 KiB of stack, so recursion the input controls shows as a crash. Run with
 * -dict=fuzz/chat_template.dict. */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amplify.h"
#include "chat/chat.h"

static json_t *messages, *tools, *extra;

static void setup(void) {
    messages = json_loads(
        "[{\"role\": \"system\", \"content\": \"sys\"},"
        " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi \\u00e9\"}, {\"type\": \"image\"}]},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\":"
        "   {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, true, null]}}}]},"
        " {\"role\": \"tool\", \"content\": \"42\"}, {\"role\": \"assistant\", \"content\": \"<think>x</think>done\"}]",
        0, NULL);
    tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
                       " \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}]",
                       0, NULL);
    extra = json_loads("{\"enable_thinking\": false, \"n\": 3, \"s\": \"str\", \"d\": {\"10\": 1, \"k\": \"v\"}}", 0, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
static void render(const uint8_t *data, size_t size);

typedef struct input {
    const uint8_t *data;
    size_t size;
} input;

static void *run(void *arg) {
    const input *in = arg;
    if (in->size && in->data[0] == 0xFF) {
        size_t len = 0;
        char *text = em_fuzz_amplify(in->data + 1, in->size - 1, &len);
        if (text) render((const uint8_t *)text, len);
        free(text);
    } else {
        render(in->data, in->size);
    }
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!messages) setup();
    input in = {data, size};
    pthread_attr_t attr;
    pthread_t thread;
    if (pthread_attr_init(&attr) || pthread_attr_setstacksize(&attr, 512 * 1024) || pthread_create(&thread, &attr, run, &in))
        abort();
    pthread_join(thread, NULL);
    pthread_attr_destroy(&attr);
    return 0;
}

static void render(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t tpl_size = nul ? (size_t)(nul - data) : size;
    json_t *custom = nul ? json_loadb((const char *)nul + 1, size - tpl_size - 1, JSON_DECODE_ANY, NULL) : NULL;
    em_chat_template *tpl = NULL;
    em_err err = em_chat_template_parse((const char *)data, tpl_size, &tpl);
    if (err) {
        em_err_free(err);
        json_decref(custom);
        return;
    }
    em_chat_input in = {.messages = json_is_array(custom) ? custom : messages, .tools = tools, .bos_token = "<s>",
                        .eos_token = "</s>", .add_generation_prompt = true,
                        .extra = json_is_object(custom) ? custom : extra};
    em_chat_render_options options = {.now = 1767225600, .max_steps = 20000, .max_bytes = 16u << 20};
    char *out = NULL;
    size_t len = 0;
    err = em_chat_render_input(tpl, &in, &options, &out, &len);
    if (!err && strlen(out) > len) abort(); /* the length must cover the text */
    em_err_free(err);
    free(out);
    em_chat_template_free(tpl);
    json_decref(custom);
}
