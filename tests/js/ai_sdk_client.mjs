// The Vercel AI SDK (`ai` with `@ai-sdk/openai`, whose default model speaks the Responses API)
// against ember serve: generateText and streamText equal to what chat completions gives for the
// same conversation at temperature 0, a tool forced by toolChoice whose input fits its schema and
// whose result goes back in a second step, a second turn that sends the first answer back as an
// item_reference (the SDK's way when responses are stored), and structured output.
import assert from 'node:assert/strict';
import { generateText, streamText, tool, jsonSchema, Output } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { baseURL, model, apiKey, test, finish } from './common.mjs';

const provider = createOpenAI({ baseURL: `${baseURL}/v1`, apiKey });
const llm = provider(model);
const system = 'You are a dictionary.';
const question = 'What is the opposite of happy?';
const limit = 24;

// Chat completions' greedy answer: what every answer here is held to.
async function chatAnswer(body) {
  const res = await fetch(`${baseURL}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ model, max_tokens: limit, temperature: 0, ...body }),
  });
  assert.equal(res.status, 200, await res.clone().text());
  return (await res.json()).choices[0].message.content;
}

const settings = { model: llm, maxOutputTokens: limit, temperature: 0, maxRetries: 0 };
let plain = null;

await test('generateText through the Responses API: the chat completions answer', async () => {
  const want = await chatAnswer({ messages: [{ role: 'system', content: system }, { role: 'user', content: question }] });
  const r = await generateText({ ...settings, system, prompt: question });
  assert.ok(want.length > 0, 'the chat answer is not empty');
  assert.equal(r.text, want);
  assert.match(r.response.id, /^resp_/, 'the answer came from /v1/responses');
  assert.ok(['stop', 'length'].includes(r.finishReason), r.finishReason);
  assert.ok(r.usage.inputTokens > 0 && r.usage.outputTokens > 0, JSON.stringify(r.usage));
  plain = r.text;
});

await test('streamText: the same text, a finish reason and usage', async () => {
  const r = streamText({ ...settings, system, prompt: question });
  let text = '';
  for await (const delta of r.textStream) text += delta;
  assert.equal(text, plain);
  assert.ok(['stop', 'length'].includes(await r.finishReason));
  assert.ok((await r.usage).outputTokens > 0);
});

const define = tool({
  description: 'Looks a word up in the dictionary.',
  inputSchema: jsonSchema({
    type: 'object', properties: { word: { type: 'string', maxLength: 20 }, senses: { type: 'integer', minimum: 1, maximum: 3 } },
    required: ['word', 'senses'], additionalProperties: false,
  }),
  execute: async ({ word }) => `${word}: a large natural stream of water`,
});

await test('a tool forced by toolChoice: its input fits the schema, its result goes back in a second step', async () => {
  const prompt = 'Define the word river.';
  const r = await generateText({
    ...settings, maxOutputTokens: 64, prompt, tools: { define_word: define }, toolChoice: { type: 'tool', toolName: 'define_word' },
    include: { requestBody: true },
    stopWhen: ({ steps }) => steps.length === 2,
    prepareStep: ({ stepNumber }) => (stepNumber > 0 ? { toolChoice: 'none' } : undefined),
  });
  assert.equal(r.steps.length, 2);
  const [call] = r.steps[0].toolCalls;
  assert.equal(call.toolName, 'define_word');
  assert.equal(typeof call.input.word, 'string');
  assert.ok(call.input.word.length <= 20);
  assert.ok(Number.isInteger(call.input.senses) && call.input.senses >= 1 && call.input.senses <= 3, JSON.stringify(call.input));
  assert.equal(r.steps[0].toolResults[0].output, `${call.input.word}: a large natural stream of water`);
  // the second step's input holds the call and its output as items
  const sent = r.steps[1].request.body;
  const items = (typeof sent === 'string' ? JSON.parse(sent) : sent).input;
  assert.ok(items.some((i) => i.type === 'function_call' && i.call_id === call.toolCallId), JSON.stringify(items));
  assert.ok(items.some((i) => i.type === 'function_call_output' && i.call_id === call.toolCallId), JSON.stringify(items));
  assert.equal(typeof r.text, 'string');
});

await test('a second turn sends the first answer back as an item_reference: the chat completions answer', async () => {
  const first = await generateText({ ...settings, prompt: question });
  const follow = 'Use the word garden in a sentence.';
  const r = await generateText({
    ...settings, messages: [{ role: 'user', content: question }, ...first.response.messages, { role: 'user', content: follow }],
    include: { requestBody: true },
  });
  const sent = typeof r.request.body === 'string' ? JSON.parse(r.request.body) : r.request.body;
  assert.ok(sent.input.some((i) => i.type === 'item_reference'), JSON.stringify(sent.input));
  const want = await chatAnswer({
    messages: [{ role: 'user', content: question }, { role: 'assistant', content: first.text }, { role: 'user', content: follow }],
  });
  assert.equal(r.text, want);
});

await test('Output.object: text.format json_schema gives a value of the schema', async () => {
  const schema = jsonSchema({
    type: 'object', properties: { word: { type: 'string', maxLength: 12 }, opposite: { type: 'string', maxLength: 12 } },
    required: ['word', 'opposite'], additionalProperties: false,
  });
  const r = await generateText({ ...settings, maxOutputTokens: 64, prompt: question, output: Output.object({ schema }) });
  assert.deepEqual(Object.keys(r.output), ['word', 'opposite']);
  assert.equal(typeof r.output.word, 'string');
});

finish();
