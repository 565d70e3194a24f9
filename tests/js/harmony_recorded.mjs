// Harmony (gpt-oss) answers recorded as the model writes them, through the official OpenAI and
// Anthropic clients' tool flows (tests/test_server_harmony.c runs the server on its fake engine):
//   reasoning, then a call:   <|channel|>analysis<|message|>The user wants the weather in Oslo. Call get_weather.<|end|>
//                             <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo","days":3}
//   once the tool answered:   <|channel|>analysis<|message|>Sunny, say so.<|end|><|start|>assistant<|channel|>final<|message|>It will be sunny.
// The fake engine hands the text out a byte a token, so every marker arrives split.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { baseURL, model, apiKey, test, finish } from './common.mjs';
import { anthropicToolFlow } from './recorded_tools.mjs';

const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 60000 });
const anthropic = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

const REASONING = 'The user wants the weather in Oslo. Call get_weather.';
const ARGUMENTS = '{"city":"Oslo","days":3}';
const weather = {
  type: 'object',
  properties: { city: { type: 'string' }, days: { type: 'integer' } },
  required: ['city', 'days'],
};
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather forecast', parameters: weather } }];
const question = [{ role: 'user', content: 'harmony-call: weather in Oslo?' }];

await test('chat.completions: reasoning_content and the call, finish_reason tool_calls', async () => {
  const r = await openai.chat.completions.create({ model, messages: question, tools, reasoning_effort: 'high', max_tokens: 300 });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.reasoning_content, REASONING);
  assert.equal(c.message.content, null);
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
  assert.equal(c.message.tool_calls[0].function.arguments, ARGUMENTS);
});

await test('chat.completions streamed: reasoning and argument deltas assemble the same message', async () => {
  const stream = await openai.chat.completions.create({ model, messages: question, tools, max_tokens: 300, stream: true });
  let reasoning = '', args = '', name = null, content = '', finishReason = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? '';
    content += d.content ?? '';
    for (const t of d.tool_calls ?? []) {
      if (t.function?.name) name = t.function.name;
      args += t.function?.arguments ?? '';
    }
    finishReason = chunk.choices[0]?.finish_reason ?? finishReason;
  }
  assert.deepEqual([reasoning, content, name, args, finishReason], [REASONING, '', 'get_weather', ARGUMENTS, 'tool_calls']);
});

await test('chat.completions: the tool result goes back, the final answer comes out', async () => {
  const first = await openai.chat.completions.create({ model, messages: question, tools, max_tokens: 300 });
  const call = first.choices[0].message.tool_calls[0];
  const messages = [
    ...question,
    first.choices[0].message,
    { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ forecast: 'sunny' }) },
  ];
  const r = await openai.chat.completions.create({ model, messages, tools, max_tokens: 300 });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(m.content, 'It will be sunny.');
  assert.equal(m.reasoning_content, 'Sunny, say so.');
  assert.equal(m.tool_calls, undefined);
  // the fake engine's tokens are bytes: the '>' that opens the analysis body, its text, its <|end|>
  assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 1 + 'Sunny, say so.'.length + '<|end|>'.length);
});

await test('chat.completions without tools: a call is text, nothing is lost', async () => {
  const r = await openai.chat.completions.create({ model, messages: question, max_tokens: 300 });
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, REASONING);
  assert.equal(m.content, `<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>${ARGUMENTS}`);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

await anthropicToolFlow(anthropic, { prompt: 'harmony-call: weather in Oslo?', schema: weather, reasoning: REASONING, args: ARGUMENTS });

finish();
