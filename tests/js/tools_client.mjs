// Tool calls through the official `openai` and `@anthropic-ai/sdk` clients against ember serve on a
// tiny random model: a full agent round trip (tools → forced call → tool result → answer), plain
// and streamed, on both APIs; the call's arguments must validate (ajv) against the tool's schema.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { baseURL, model, apiKey, test, finish } from './common.mjs';

const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
const anthropic = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);

const weatherParams = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 16 },
    unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
    days: { type: 'integer', minimum: 1, maximum: 7 },
  },
  required: ['city', 'unit', 'days'],
  additionalProperties: false,
};
const timeParams = { type: 'object', properties: { zone: { type: 'string', pattern: '^[A-Z]{3}$' } }, required: ['zone'], additionalProperties: false };
const validators = { get_weather: ajv.compile(weatherParams), get_time: ajv.compile(timeParams) };
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather forecast', parameters: weatherParams } },
  { type: 'function', function: { name: 'get_time', description: 'Current time', parameters: timeParams } },
];
const question = [{ role: 'user', content: 'What will the weather be in Oslo this week?' }];

function checkCall(name, args) {
  assert.ok(validators[name], `unknown tool ${name}`);
  assert.ok(validators[name](args), `${name}(${JSON.stringify(args)}): ${ajv.errorsText(validators[name].errors)}`);
}

// The second half of a round trip: the call and its result go back, the model answers in text.
async function answerAfter(call, seed) {
  const messages = [
    ...question,
    { role: 'assistant', content: null, tool_calls: [call] },
    { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ forecast: 'sunny', high: 21 }) },
  ];
  const r = await openai.chat.completions.create({ model, messages, tools, tool_choice: 'none', max_tokens: 16, seed });
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.equal(r.choices[0].message.tool_calls, undefined);
}

for (const seed of [1, 2]) {
  await test(`openai: required → a call that validates → tool result → an answer (seed ${seed})`, async () => {
    const r = await openai.chat.completions.create({ model, messages: question, tools, tool_choice: 'required', max_tokens: 200, seed });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.tool_calls.length, 1);
    const call = c.message.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.match(call.id, /^call_/);
    checkCall(call.function.name, JSON.parse(call.function.arguments));
    await answerAfter(call, seed);
  });
}

await test('openai: a named tool, streamed: tool_calls deltas join into a valid call', async () => {
  const stream = await openai.chat.completions.create({ model, messages: question, tools, max_tokens: 200, seed: 3, stream: true,
    tool_choice: { type: 'function', function: { name: 'get_time' } } });
  const calls = [];
  let reason = null;
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      for (const d of ch.delta?.tool_calls ?? []) {
        calls[d.index] ??= { id: d.id, type: 'function', function: { name: '', arguments: '' } };
        if (d.function?.name) calls[d.index].function.name += d.function.name;
        if (d.function?.arguments) calls[d.index].function.arguments += d.function.arguments;
      }
      if (ch.finish_reason) reason = ch.finish_reason;
    }
  }
  assert.equal(reason, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, 'get_time');
  checkCall('get_time', JSON.parse(calls[0].function.arguments));
  await answerAfter(calls[0], 3);
});

await test('openai: auto leaves the text free (no call in a random answer is no call)', async () => {
  const r = await openai.chat.completions.create({ model, messages: question, tools, max_tokens: 12, seed: 9 });
  const c = r.choices[0];
  if (c.finish_reason === 'tool_calls') for (const call of c.message.tool_calls) checkCall(call.function.name, JSON.parse(call.function.arguments));
  else assert.equal(typeof c.message.content, 'string');
});

await test('openai: auto, streamed, two choices: each ends as text or as a valid call', async () => {
  const stream = await openai.chat.completions.create({ model, messages: question, tools, max_tokens: 12, seed: 10, n: 2, stream: true });
  const text = ['', ''], reasons = [null, null], calls = [[], []];
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      if (ch.delta?.content) text[ch.index] += ch.delta.content;
      for (const d of ch.delta?.tool_calls ?? []) { // the first delta of a call names it, the rest add arguments
        calls[ch.index][d.index] ??= { name: '', arguments: '' };
        calls[ch.index][d.index].name += d.function?.name ?? '';
        calls[ch.index][d.index].arguments += d.function?.arguments ?? '';
      }
      if (ch.finish_reason) reasons[ch.index] = ch.finish_reason;
    }
  }
  for (const i of [0, 1]) {
    assert.ok(['stop', 'length', 'tool_calls'].includes(reasons[i]), String(reasons[i]));
    if (reasons[i] === 'tool_calls') for (const c of calls[i]) checkCall(c.name, JSON.parse(c.arguments));
    else assert.equal(calls[i].length, 0);
  }
});

await test('openai: required with n = 2: both choices are valid calls', async () => {
  const r = await openai.chat.completions.create({ model, messages: question, tools, tool_choice: 'required', max_tokens: 200, seed: 11, n: 2 });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.equal(c.finish_reason, 'tool_calls');
    checkCall(c.message.tool_calls[0].function.name, JSON.parse(c.message.tool_calls[0].function.arguments));
  }
});

await test('openai: a tool_choice naming an unknown tool is a 400', async () => {
  await assert.rejects(openai.chat.completions.create({ model, messages: question, tools, max_tokens: 5,
    tool_choice: { type: 'function', function: { name: 'nope' } } }), (e) => e.status === 400 && /tool_choice/.test(e.message));
});

const anthropicTools = tools.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }));

async function anthropicAnswerAfter(block) {
  const r = await anthropic.messages.create({ model, max_tokens: 16, tools: anthropicTools, tool_choice: { type: 'none' },
    messages: [
      ...question,
      { role: 'assistant', content: [block] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: block.id, content: 'sunny, 21 degrees' }] },
    ] });
  assert.equal(r.content[0].type, 'text');
  assert.ok(['end_turn', 'max_tokens'].includes(r.stop_reason));
}

await test('anthropic: any → tool_use that validates → tool_result → an answer', async () => {
  const r = await anthropic.messages.create({ model, max_tokens: 200, messages: question, tools: anthropicTools, tool_choice: { type: 'any' } });
  assert.equal(r.stop_reason, 'tool_use');
  const uses = r.content.filter((b) => b.type === 'tool_use');
  assert.equal(uses.length, 1);
  assert.match(uses[0].id, /^toolu_/);
  checkCall(uses[0].name, uses[0].input);
  await anthropicAnswerAfter(uses[0]);
});

await test('anthropic: a named tool, streamed: input_json_delta events build the input', async () => {
  const stream = anthropic.messages.stream({ model, max_tokens: 200, messages: question, tools: anthropicTools,
    tool_choice: { type: 'tool', name: 'get_weather' } });
  let partial = '';
  stream.on('inputJson', (delta) => { partial += delta; });
  const message = await stream.finalMessage();
  assert.equal(message.stop_reason, 'tool_use');
  const use = message.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  checkCall('get_weather', use.input);
  assert.deepEqual(JSON.parse(partial), use.input);
  await anthropicAnswerAfter(use);
});

await test('anthropic: auto, streamed: the text streams, stop_reason end_turn or max_tokens', async () => {
  const stream = anthropic.messages.stream({ model, max_tokens: 12, messages: question, tools: anthropicTools });
  let text = '';
  stream.on('text', (t) => { text += t; });
  const message = await stream.finalMessage();
  if (message.stop_reason === 'tool_use') {
    for (const b of message.content.filter((b) => b.type === 'tool_use')) checkCall(b.name, b.input);
  } else {
    assert.ok(['end_turn', 'max_tokens'].includes(message.stop_reason), message.stop_reason);
    assert.equal(message.content[0].text, text);
  }
});

// A streamed answer must assemble into the same calls as the whole one (same seed, same request):
// the OpenAI SDK's stream helper joins the tool_calls deltas, Anthropic's joins input_json_delta.
for (const seed of [4, 5]) {
  await test(`openai: required, streamed: the SDK assembles the same call as the whole answer (seed ${seed})`, async () => {
    const request = { model, messages: question, tools, tool_choice: 'required', max_tokens: 200, seed };
    const whole = await openai.chat.completions.create(request);
    const runner = openai.chat.completions.stream(request);
    let deltas = 0;
    runner.on('chunk', (chunk) => { if (chunk.choices[0]?.delta?.tool_calls) deltas++; });
    const streamed = await runner.finalChatCompletion();
    const a = whole.choices[0], b = streamed.choices[0];
    assert.equal(b.finish_reason, 'tool_calls');
    assert.deepEqual(b.message.tool_calls.map((c) => [c.id, c.function.name, c.function.arguments]),
      a.message.tool_calls.map((c) => [c.id.replace(whole.id, streamed.id), c.function.name, c.function.arguments]));
    assert.ok(deltas > 1, `the call came in ${deltas} delta(s), not as it was generated`);
    checkCall(b.message.tool_calls[0].function.name, JSON.parse(b.message.tool_calls[0].function.arguments));
  });

  await test(`anthropic: any, streamed: the SDK assembles the same tool_use as the whole answer (seed ${seed})`, async () => {
    // Anthropic's API has no seed: greedy answers, told apart by their system prompt
    const request = { model, max_tokens: 200, messages: question, tools: anthropicTools, tool_choice: { type: 'any' },
      temperature: 0, system: `Request ${seed}.` };
    const whole = await anthropic.messages.create(request);
    const stream = anthropic.messages.stream(request);
    let fragments = 0;
    stream.on('inputJson', () => { fragments++; });
    const streamed = await stream.finalMessage();
    const uses = (m) => m.content.filter((b) => b.type === 'tool_use').map((b) => [b.name, b.input]);
    assert.equal(streamed.stop_reason, 'tool_use');
    assert.deepEqual(uses(streamed), uses(whole));
    assert.ok(fragments > 1, `the input came in ${fragments} fragment(s)`);
  });
}

finish();
