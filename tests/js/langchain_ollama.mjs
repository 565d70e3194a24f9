// LangChain's ChatOllama (@langchain/ollama, on the `ollama` package) against ember serve's Ollama
// API: invoke and stream give the answer chat completions gives at temperature 0, with LangChain's
// usage metadata from Ollama's counts; structured output through `format` (a JSON schema); tools
// bound with bindTools and forced, read back as LangChain tool calls; and checkOrPullModel, which
// looks the model up in /api/tags before the first call (a pull if it were missing).
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { ChatOllama } from '@langchain/ollama';
import { HumanMessage, SystemMessage } from '@langchain/core/messages';
import { baseURL, model, apiKey, test, finish } from './common.mjs';

const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
const limit = 24;
const system = 'You are a dictionary.';
const question = 'What is the opposite of happy?';
// Greedy and unpenalized, as chat completions samples at temperature 0.
const chat = new ChatOllama({ model, baseUrl: baseURL, headers: { Authorization: `Bearer ${apiKey}` },
  temperature: 0, numPredict: limit, repeatPenalty: 1, checkOrPullModel: true, maxRetries: 0 });
const messages = [new SystemMessage(system), new HumanMessage(question)];

const want = (await openai.chat.completions.create({ model, max_tokens: limit, temperature: 0,
  messages: [{ role: 'system', content: system }, { role: 'user', content: question }] })).choices[0].message.content;

await test('invoke: the answer of chat completions at temperature 0, with usage from Ollama\'s counts', async () => {
  assert.ok(want.length > 0);
  const r = await chat.invoke(messages);
  assert.equal(r.content, want);
  assert.ok(r.usage_metadata.input_tokens > 0, JSON.stringify(r.usage_metadata));
  assert.ok(r.usage_metadata.output_tokens > 0 && r.usage_metadata.output_tokens <= limit, JSON.stringify(r.usage_metadata));
  assert.equal(r.usage_metadata.total_tokens, r.usage_metadata.input_tokens + r.usage_metadata.output_tokens);
  assert.equal(r.response_metadata.done_reason === 'stop' || r.response_metadata.done_reason === 'length', true);
});

await test('stream: chunks add up to the same answer', async () => {
  let text = '', chunks = 0;
  for await (const chunk of await chat.stream(messages)) {
    text += chunk.content;
    chunks++;
  }
  assert.ok(chunks >= 2, `${chunks} chunks`); // the split depends on timing
  assert.equal(text, want);
});

await test('withStructuredOutput: a JSON schema through format, parsed', async () => {
  const schema = { type: 'object', title: 'Opposite', properties: { opposite: { type: 'string', maxLength: 12 } }, required: ['opposite'] };
  const structured = new ChatOllama({ model, baseUrl: baseURL, headers: { Authorization: `Bearer ${apiKey}` },
    temperature: 0, numPredict: 64, repeatPenalty: 1 }).withStructuredOutput(schema);
  const r = await structured.invoke(messages);
  assert.equal(typeof r.opposite, 'string');
});

await test('bindTools with a forced call: a LangChain tool call with its arguments', async () => {
  const tool = { type: 'function', function: { name: 'define_word', description: 'Looks a word up.',
    parameters: { type: 'object', properties: { word: { type: 'string', maxLength: 12 } }, required: ['word'] } } };
  // ChatOllama has no tool_choice (nor has Ollama): its fetch adds Ember's, read beside Ollama's
  // fields, so that this model, which would not call on its own, must
  const forcing = (url, init) => fetch(url, { ...init, body: JSON.stringify({ ...JSON.parse(init.body), tool_choice: 'required' }) });
  const r = await new ChatOllama({ model, baseUrl: baseURL, headers: { Authorization: `Bearer ${apiKey}` }, fetch: forcing,
    temperature: 0, numPredict: 64, repeatPenalty: 1 }).bindTools([tool])
    .invoke([new HumanMessage('Define the word river.')]);
  assert.equal(r.tool_calls.length, 1, JSON.stringify(r));
  assert.equal(r.tool_calls[0].name, 'define_word');
  assert.equal(typeof r.tool_calls[0].args.word, 'string');
});

finish();
