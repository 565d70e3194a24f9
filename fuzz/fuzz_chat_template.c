/* libFuzzer target for chat templates: the input is a template; it is parsed and, when it parses,
 * rendered against a small conversation with tools, under tight step and byte bounds. Templates
 * come from GGUF files, so every byte here is untrusted input: any crash, leak, sanitizer report
 * or hang is a bug. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!messages) setup();
    em_chat_template *tpl = NULL;
    em_err err = em_chat_template_parse((const char *)data, size, &tpl);
    if (err) {
        em_err_free(err);
        return 0;
    }
    em_chat_input in = {.messages = messages, .tools = tools, .bos_token = "<s>", .eos_token = "</s>",
                        .add_generation_prompt = true, .extra = extra};
    em_chat_render_options options = {.now = 1767225600, .max_steps = 20000, .max_bytes = 16u << 20};
    char *out = NULL;
    size_t len = 0;
    err = em_chat_render_input(tpl, &in, &options, &out, &len);
    if (!err && strlen(out) > len) abort(); /* the length must cover the text */
    em_err_free(err);
    free(out);
    em_chat_template_free(tpl);
    return 0;
}
