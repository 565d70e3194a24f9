// Gemma 4 answers recorded as the model writes them, through the official OpenAI and Anthropic
// clients' tool flows (tests/test_server_gemma4.c runs the server on its fake engine):
//   a thought, then a call:   <|channel>thought\nThe user wants the weather in Oslo. Call get_weather.<channel|>
//                             <|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:3,when:{from:<|"|>today<|"|>,hours:[9,12]}}<tool_call|>
//   once the tool answered:   <|channel>thought\nSunny, say so.<channel|>It will be sunny.
// The fake engine hands the text out a byte a token, so every marker arrives split.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { baseURL, model, apiKey, test, finish } from './common.mjs';
import { anthropicToolFlow } from './recorded_tools.mjs';

const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 60000 });
const anthropic = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

const REASONING = 'The user wants the weather in Oslo. Call get_weather.';
const ARGUMENTS = '{"city":"Oslo","days":3,"when":{"from":"today","hours":[9,12]}}';
const CALL_TEXT = '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:3,when:{from:<|"|>today<|"|>,hours:[9,12]}}<tool_call|>';
const weather = {
  type: 'object',
  properties: {
    city: { type: 'string' },
    days: { type: 'integer' },
    when: { type: 'object', properties: { from: { type: 'string' }, hours: { type: 'array', items: { type: 'integer' } } } },
  },
  required: ['city', 'days'],
};
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather forecast', parameters: weather } }];
const question = [{ role: 'user', content: 'gemma4-call: weather in Oslo?' }];

await test('chat.completions: reasoning_content and the call with nested arguments, finish_reason tool_calls', async () => {
  const r = await openai.chat.completions.create({ model, messages: question, tools, max_tokens: 300 });
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
  let reasoning = '', args = '', name = null, content = '', finishReason = null, argumentDeltas = 0;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? '';
    content += d.content ?? '';
    for (const t of d.tool_calls ?? []) {
      if (t.function?.name) name = t.function.name;
      if (t.function?.arguments) argumentDeltas++;
      args += t.function?.arguments ?? '';
    }
    finishReason = chunk.choices[0]?.finish_reason ?? finishReason;
  }
  assert.deepEqual([reasoning, content, name, args, finishReason], [REASONING, '', 'get_weather', ARGUMENTS, 'tool_calls']);
  assert.ok(argumentDeltas > 1, `the arguments came in ${argumentDeltas} delta(s), not as they were written`);
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
});

await test('chat.completions without tools: a call is text, nothing is lost', async () => {
  const r = await openai.chat.completions.create({ model, messages: question, max_tokens: 300 });
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, REASONING);
  assert.equal(m.content, CALL_TEXT);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

await test('chat.completions with reasoning_format none: the thought stays in the content', async () => {
  const r = await openai.chat.completions.create({
    model, messages: [{ role: 'user', content: 'gemma4: and now?' }], max_tokens: 300, reasoning_format: 'none',
  });
  assert.equal(r.choices[0].message.content, '<|channel>thought\nSunny, say so.<channel|>It will be sunny.');
  assert.equal(r.choices[0].message.reasoning_content, undefined);
});

await anthropicToolFlow(anthropic, { prompt: 'gemma4-call: weather in Oslo?', schema: weather, reasoning: REASONING, args: ARGUMENTS });

finish();
