// gpt-oss's harmony format through the official OpenAI and Anthropic clients (tests/cli/harmony.sh):
// ember serve runs a tiny random model with gpt-oss's chat template and harmony's markup as control
// tokens. Grammars make it write harmony: a forced call, or, through a raw GBNF grammar, an analysis
// message and then a final one. The answers must come back as reasoning, content and tool calls,
// the same streamed as whole, and a conversation holding the call, its reasoning and the tool's
// result must render for a second turn on both APIs. (The Anthropic API has no logit_bias to keep a
// random model from reasoning forever, so its forced calls are read from recorded answers:
// harmony_recorded.mjs on the fake engine.)
//   EMBER_HARMONY_IDS=<ids of <|start|>,<|channel|>,<|message|>,<|end|>,<|constrain|>> node harmony_client.mjs BASE_URL MODEL API_KEY
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { baseURL, model, apiKey, test, finish } from './common.mjs';

const markupIds = (process.env.EMBER_HARMONY_IDS || '').split(',').filter(Boolean);
assert.equal(markupIds.length, 5, 'EMBER_HARMONY_IDS must name the five markup tokens');
// The markup as the control tokens wherever the grammar allows them (a trained model writes them so).
const markupBias = Object.fromEntries(markupIds.map((id) => [id, 100]));
// A random model would reason forever: <|end|> pushed, its analysis ends where it may (at once).
const endBias = { [markupIds[3]]: 100 };

const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
const anthropic = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });

// No free text in the arguments: the pushed <|end|> would be allowed inside a string (the grammar
// allows a marker token wherever it allows the marker's text), and a model writing it there ends
// the call's message.
const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', enum: ['Oslo', 'Bergen', 'Tromsø'], description: 'The city' },
    days: { type: 'integer', minimum: 1, maximum: 7, description: 'How many days' },
  },
  required: ['city', 'days'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather forecast', parameters: weather } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }, // no description
];
const question = [{ role: 'system', content: 'You forecast weather.' }, { role: 'user', content: 'Weather in Oslo this week?' }];

function checkWeather(args) {
  assert.ok(['Oslo', 'Bergen', 'Tromsø'].includes(args.city), JSON.stringify(args));
  assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7, JSON.stringify(args));
}

// No harmony markup may reach a client as text of a well-formed answer.
function noMarkup(text) {
  assert.ok(!/<\|(start|channel|message|end|constrain|call|return)\|>/.test(text ?? ''), text);
}

const forced = { model, messages: question, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
  max_tokens: 120, temperature: 0, reasoning_effort: 'high', logit_bias: endBias };
let whole = null;

await test('chat.completions, a forced call: tool_calls, reasoning apart, no markup', async () => {
  const r = await openai.chat.completions.create(forced);
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  checkWeather(JSON.parse(call.function.arguments));
  assert.ok(!c.message.content, JSON.stringify(c.message));
  noMarkup(c.message.reasoning_content);
  whole = c.message;
});

await test('chat.completions streamed: the same call from reasoning and argument deltas', async () => {
  const stream = await openai.chat.completions.create({ ...forced, stream: true });
  let reasoning = '', args = '', name = null, finishReason = null, calls = 0;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    if (d.reasoning_content) reasoning += d.reasoning_content;
    assert.ok(!d.content, JSON.stringify(d));
    for (const t of d.tool_calls ?? []) {
      assert.equal(t.index, 0);
      if (t.function?.name) name = t.function.name, calls++;
      args += t.function?.arguments ?? '';
    }
    if (chunk.choices[0]?.finish_reason) finishReason = chunk.choices[0].finish_reason;
  }
  assert.equal(finishReason, 'tool_calls');
  assert.equal(calls, 1);
  assert.equal(name, whole.tool_calls[0].function.name);
  assert.equal(args, whole.tool_calls[0].function.arguments);
  assert.equal(reasoning, whole.reasoning_content ?? '');
});

await test('the call, its reasoning and the tool result go back for a second turn', async () => {
  const id = 'call_1';
  const messages = [
    ...question,
    { role: 'assistant', content: null, reasoning_content: whole.reasoning_content, tool_calls: [{ ...whole.tool_calls[0], id }] },
    { role: 'tool', tool_call_id: id, content: JSON.stringify({ forecast: 'sunny' }) },
  ];
  const r = await openai.chat.completions.create({ model, messages, tools, max_tokens: 8, temperature: 0 });
  assert.equal(typeof r.choices[0].message.content === 'string' || r.choices[0].message.tool_calls !== undefined, true);
  assert.ok(r.usage.prompt_tokens > 0);
});

// An analysis message, then the final one: only a grammar makes a random model write it.
const twoMessages = 'root ::= "<|channel|>analysis<|message|>" [a-z]{2,6} "<|end|><|start|>assistant<|channel|>final<|message|>" [a-z]{2,6}';
const answerRequest = { model, messages: question, max_tokens: 40, temperature: 0, grammar: twoMessages, logit_bias: markupBias };
let answered = null;

await test('reasoning then an answer: reasoning_content and content, <|end|> ends no answer', async () => {
  const r = await openai.chat.completions.create(answerRequest);
  const m = r.choices[0].message;
  assert.match(m.reasoning_content, /^[a-z]{2,6}$/, JSON.stringify(m));
  assert.match(m.content, /^[a-z]{2,6}$/, JSON.stringify(m));
  assert.equal(r.choices[0].finish_reason, 'stop');
  answered = m;
});

await test('streamed: reasoning deltas before content deltas, the same text', async () => {
  const stream = await openai.chat.completions.create({ ...answerRequest, stream: true });
  let reasoning = '', content = '', sawContent = false;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    if (d.reasoning_content) {
      assert.ok(!sawContent, 'reasoning after content');
      reasoning += d.reasoning_content;
    }
    if (d.content) sawContent = true, content += d.content;
  }
  assert.equal(reasoning, answered.reasoning_content);
  assert.equal(content, answered.content);
});

await test('reasoning_format none: the analysis stays in the content as written', async () => {
  const r = await openai.chat.completions.create({ ...answerRequest, reasoning_format: 'none' });
  const m = r.choices[0].message;
  assert.equal(m.content, `<|channel|>analysis<|message|>${answered.reasoning_content}<|end|>${answered.content}`);
  assert.ok(!m.reasoning_content);
});

await test('messages.create: a conversation with thinking, tool_use and tool_result blocks renders', async () => {
  const call = whole.tool_calls[0];
  const content = [
    ...(whole.reasoning_content ? [{ type: 'thinking', thinking: whole.reasoning_content, signature: '' }] : []),
    { type: 'tool_use', id: 'toolu_1', name: call.function.name, input: JSON.parse(call.function.arguments) },
  ];
  const m = await anthropic.messages.create({
    model, max_tokens: 8, temperature: 0, system: 'You forecast weather.', thinking: { type: 'enabled', budget_tokens: 2048 },
    tools: [{ name: 'get_weather', description: 'Weather forecast', input_schema: weather }],
    messages: [
      { role: 'user', content: 'Weather in Oslo this week?' },
      { role: 'assistant', content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny' }] },
    ],
  });
  assert.equal(m.type, 'message');
  assert.ok(m.usage.input_tokens + m.usage.cache_read_input_tokens > 0);
  for (const b of m.content) if (b.type === 'text') noMarkup(b.text);
});

finish();
