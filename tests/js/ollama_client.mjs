// The `ollama` npm client against ember serve's Ollama API: list, show, ps, version, chat (whole and
// streamed, equal to chat completions at temperature 0), generate (templated with `system`, and
// raw), format, tool calls in the conversation, Ollama's counts and durations, and its errors.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { baseURL, model, apiKey, test, finish } from './common.mjs';

const ollama = new Ollama({ host: baseURL, headers: { Authorization: `Bearer ${apiKey}` } });
const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
const system = 'You are a dictionary.';
const question = 'What is the opposite of happy?';
const limit = 24;
// Greedy and unpenalized, as chat completions samples at temperature 0 (Ollama's own defaults
// would add a repeat penalty of 1.1).
const options = { temperature: 0, num_predict: limit, repeat_penalty: 1 };
const messages = [{ role: 'system', content: system }, { role: 'user', content: question }];

const want = (await openai.chat.completions.create({ model, messages, max_tokens: limit, temperature: 0 })).choices[0].message.content;

function checkStats(r) {
  assert.equal(r.done, true);
  assert.ok(['stop', 'length'].includes(r.done_reason), r.done_reason);
  assert.ok(Number.isInteger(r.prompt_eval_count) && r.prompt_eval_count > 0, JSON.stringify(r));
  assert.ok(Number.isInteger(r.eval_count) && r.eval_count > 0 && r.eval_count <= limit, JSON.stringify(r));
  for (const k of ['total_duration', 'prompt_eval_duration', 'eval_duration', 'load_duration']) assert.ok(Number.isInteger(r[k]) && r[k] >= 0, k);
  assert.ok(r.total_duration >= r.eval_duration, 'total covers decoding');
  assert.ok(!Number.isNaN(Date.parse(r.created_at)), r.created_at);
}

await test('list: the served model with its details', async () => {
  const { models } = await ollama.list();
  assert.equal(models.length, 1);
  assert.equal(models[0].name, model);
  assert.equal(models[0].details.format, 'gguf');
  assert.equal(models[0].details.family, 'llama');
  assert.equal(models[0].details.quantization_level, 'Q4_K_M');
  assert.equal(models[0].details.parameter_size, '21M');
  assert.ok(models[0].size > 10e6);
  assert.match(models[0].digest, /^sha256:[0-9a-f]{64}$/);
});

await test('show: template, capabilities, model_info; an unknown model is a 404', async () => {
  const s = await ollama.show({ model });
  assert.match(s.template, /<\|im_start\|>/);
  assert.ok(s.capabilities.includes('completion'));
  assert.ok(!s.capabilities.includes('thinking'));
  assert.equal(s.model_info['general.architecture'], 'llama');
  assert.ok(s.model_info['llama.context_length'] > 0);
  assert.equal((await ollama.show({ model: `${model}:latest` })).details.family, 'llama');
  await assert.rejects(ollama.show({ model: 'llama3.2' }), (e) => e.status_code === 404 && /not found/.test(e.error));
});

await test('ps and version', async () => {
  const { models } = await ollama.ps();
  assert.equal(models[0].name, model);
  assert.ok(models[0].context_length > 0);
  const { version } = await ollama.version();
  assert.match(version, /^\d+\.\d+\.\d+$/);
});

await test('chat: the answer equals chat completions at temperature 0, with Ollama counts', async () => {
  assert.ok(want.length > 0);
  const r = await ollama.chat({ model, messages, options, stream: false });
  assert.equal(r.model, model);
  assert.equal(r.message.role, 'assistant');
  assert.equal(r.message.content, want);
  checkStats(r);
});

await test('chat stream: NDJSON parts add up to the same answer, the last one done', async () => {
  const stream = await ollama.chat({ model, messages, options, stream: true });
  let text = '', last = null, parts = 0;
  for await (const part of stream) {
    parts++;
    if (!part.done) assert.equal(part.message.role, 'assistant');
    text += part.message.content;
    last = part;
  }
  assert.ok(parts > 2, `${parts} parts`);
  assert.equal(text, want);
  checkStats(last);
  assert.equal(last.message.content, '');
});

await test('generate with system: the same answer as the chat; raw prompts as they are', async () => {
  const r = await ollama.generate({ model, system, prompt: question, options, stream: false });
  assert.equal(r.response, want);
  checkStats(r);
  let text = '';
  for await (const part of await ollama.generate({ model, system, prompt: question, options, stream: true })) text += part.response;
  assert.equal(text, want);
  const raw = await ollama.generate({ model, prompt: 'A river is', raw: true, options, stream: false });
  assert.ok(raw.response.length > 0);
  const completion = await openai.completions.create({ model, prompt: 'A river is', max_tokens: limit, temperature: 0 });
  assert.equal(raw.response, completion.choices[0].text);
});

await test('format: "json" and a schema constrain the answer', async () => {
  // "json" is any JSON object (this model writes one long string): the same as response_format json_object
  const r = await ollama.chat({ model, messages, options, format: 'json', stream: false });
  const c = await openai.chat.completions.create({ model, messages, max_tokens: limit, temperature: 0, response_format: { type: 'json_object' } });
  assert.match(r.message.content, /^\{/);
  assert.equal(r.message.content, c.choices[0].message.content);
  const schema = { type: 'object', properties: { opposite: { type: 'string', maxLength: 12 } }, required: ['opposite'] };
  const s = await ollama.chat({ model, messages, options: { ...options, num_predict: 64 }, format: schema, stream: false });
  assert.equal(typeof JSON.parse(s.message.content).opposite, 'string');
});

await test('tools and a conversation with a tool call and its result', async () => {
  const tools = [{ type: 'function', function: { name: 'define_word', description: 'Looks a word up.',
    parameters: { type: 'object', properties: { word: { type: 'string' } }, required: ['word'] } } }];
  const r = await ollama.chat({
    model, tools, options, stream: false,
    messages: [
      { role: 'user', content: 'Define the word river.' },
      { role: 'assistant', content: '', tool_calls: [{ function: { name: 'define_word', arguments: { word: 'river' } } }] },
      { role: 'tool', content: 'a large natural stream of water', tool_name: 'define_word' },
    ],
  });
  checkStats(r);
  for (const c of r.message.tool_calls ?? []) assert.equal(typeof c.function.arguments, 'object');
});

await test('a load request (no messages) answers done_reason "load"; keep_alive accepted', async () => {
  const r = await ollama.chat({ model, messages: [], keep_alive: '10m', stream: false });
  assert.equal(r.done, true);
  assert.equal(r.done_reason, 'load');
});

await test('errors are {"error"} with 400: bad options, think on a model that does not reason, embed', async () => {
  await assert.rejects(ollama.chat({ model, messages, options: { temperature: 'hot' }, stream: false }),
    (e) => e.status_code === 400 && /options: 'temperature'/.test(e.error));
  await assert.rejects(ollama.chat({ model, messages, think: true, stream: false }),
    (e) => e.status_code === 400 && /does not support thinking/.test(e.error));
  await assert.rejects(ollama.embed({ model, input: 'river' }), (e) => e.status_code === 400 && /does not support embeddings/.test(e.error));
  await assert.rejects(ollama.chat({ model, messages: [{ role: 'robot', content: 'x' }], stream: false }),
    (e) => e.status_code === 400 && /messages\[0\]/.test(e.error));
  const res = await fetch(`${baseURL}/api/tags`);
  assert.equal(res.status, 401, 'the API key guards /api/ too');
  assert.equal(typeof (await res.json()).error, 'string');
});

finish();
