// The `ollama` npm client against ember serve's Ollama API: list, show, ps, version, chat (whole and
// streamed, equal to chat completions at temperature 0), generate (templated with `system`, and
// raw), format, a forced tool call and the conversation after it, num_ctx, model management (pull
// of the served model; the rest refused), Ollama's counts and durations, and its errors.
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

function checkStats(r, max = limit) {
  assert.equal(r.done, true);
  assert.ok(['stop', 'length'].includes(r.done_reason), r.done_reason);
  assert.ok(Number.isInteger(r.prompt_eval_count) && r.prompt_eval_count > 0, JSON.stringify(r));
  assert.ok(Number.isInteger(r.eval_count) && r.eval_count > 0 && r.eval_count <= max, JSON.stringify(r));
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
  // how the text splits into parts depends on timing (a busy machine may hand it over at once)
  assert.ok(parts >= 2, `${parts} parts`);
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

await test('a forced tool call: arguments come back as an object, and the conversation goes on with its result', async () => {
  // Ollama has no tool_choice; Ember reads OpenAI's beside Ollama's fields (the client sends the
  // request as it is), so that a model that would not call on its own must.
  const tools = [{ type: 'function', function: { name: 'define_word', description: 'Looks a word up.',
    parameters: { type: 'object', properties: { word: { type: 'string', maxLength: 12 } }, required: ['word'] } } }];
  const ask = [{ role: 'user', content: 'Define the word river.' }];
  const r = await ollama.chat({ model, tools, tool_choice: 'required', messages: ask, options: { ...options, num_predict: 64 }, stream: false });
  checkStats(r, 64);
  assert.equal(r.message.tool_calls.length, 1, JSON.stringify(r.message));
  const call = r.message.tool_calls[0];
  assert.equal(call.function.name, 'define_word');
  assert.equal(typeof call.function.arguments, 'object');
  assert.equal(typeof call.function.arguments.word, 'string');
  // the same call through chat completions (whose arguments are a JSON string)
  const c = await openai.chat.completions.create({ model, tools, tool_choice: 'required', messages: ask, max_tokens: 64, temperature: 0 });
  assert.deepEqual(call.function.arguments, JSON.parse(c.choices[0].message.tool_calls[0].function.arguments));
  // streamed: the call arrives whole in one part before the last
  const parts = [];
  for await (const part of await ollama.chat({ model, tools, tool_choice: 'required', messages: ask, options: { ...options, num_predict: 64 }, stream: true })) parts.push(part);
  const calls = parts.flatMap((p) => p.message.tool_calls ?? []);
  assert.deepEqual(calls, r.message.tool_calls);
  checkStats(parts.at(-1), 64);
  const next = await ollama.chat({ model, tools, options, stream: false,
    messages: [...ask, r.message, { role: 'tool', content: 'a large natural stream of water', tool_name: 'define_word' }] });
  checkStats(next);
});

await test('options.num_ctx: below the server\'s context it bounds the request, above it is the server\'s', async () => {
  const big = await ollama.chat({ model, messages, options: { ...options, num_ctx: 131072 }, stream: false });
  assert.equal(big.message.content, want);
  const small = await ollama.generate({ model, prompt: 'A river is', raw: true, options: { ...options, num_predict: 100, num_ctx: 8 }, stream: false });
  assert.equal(small.done_reason, 'length');
  assert.equal(small.prompt_eval_count + small.eval_count, 8);
  await assert.rejects(ollama.chat({ model, messages, options: { ...options, num_ctx: 4 }, stream: false }),
    (e) => e.status_code === 400 && /num_ctx/.test(e.error));
});

await test('model management: a pull of the served model succeeds; the rest is refused, saying what to do', async () => {
  assert.equal((await ollama.pull({ model, stream: false })).status, 'success');
  const statuses = [];
  for await (const part of await ollama.pull({ model: `${model}:latest`, stream: true })) statuses.push(part.status);
  assert.deepEqual(statuses, ['success']);
  await assert.rejects(ollama.pull({ model: 'llama3.2' }), (e) => e.status_code === 400 && /ember pull/.test(e.error));
  await assert.rejects(ollama.delete({ model }), (e) => e.status_code === 400 && /being served/.test(e.error));
  await assert.rejects(ollama.copy({ source: model, destination: 'mine' }), (e) => e.status_code === 400 && /--alias/.test(e.error));
  await assert.rejects(ollama.create({ model: 'mine', from: model }), (e) => e.status_code === 400 && /cannot create/.test(e.error));
  await assert.rejects(ollama.push({ model }), (e) => e.status_code === 400 && /push/.test(e.error));
});

await test('images are refused until the engine reads them', async () => {
  await assert.rejects(ollama.chat({ model, messages: [{ role: 'user', content: 'What is this?', images: ['aGVsbG8='] }], stream: false }),
    (e) => e.status_code === 400 && /images are not supported/.test(e.error));
  await assert.rejects(ollama.generate({ model, prompt: 'What is this?', images: ['aGVsbG8='], stream: false }),
    (e) => e.status_code === 400 && /images/.test(e.error));
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
  await assert.rejects(ollama.embed({ model, input: 'river' }), (e) => e.status_code === 400 && /does not embed: its file names no pooling/.test(e.error));
  await assert.rejects(ollama.chat({ model, messages: [{ role: 'robot', content: 'x' }], stream: false }),
    (e) => e.status_code === 400 && /messages\[0\]/.test(e.error));
  const res = await fetch(`${baseURL}/api/tags`);
  assert.equal(res.status, 401, 'the API key guards /api/ too');
  assert.equal(typeof (await res.json()).error, 'string');
});

finish();
