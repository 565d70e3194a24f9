// The official `@anthropic-ai/sdk` npm client against ember serve: messages plain and streamed
// (with the SDK's own event accumulation), system prompts, stop sequences, count_tokens, usage with
// cache reads, model listing, errors as typed exceptions.
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { baseURL, model, apiKey, test, finish, stopFrom } from './common.mjs';

const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const request = {
  model,
  max_tokens: 12,
  temperature: 0,
  system: [{ type: 'text', text: 'You are terse.' }],
  messages: [{ role: 'user', content: [{ type: 'text', text: 'Name a color.' }] }],
};
let greedy = null;
let promptTokens = null;

await test('messages.create: text block, stop_reason, usage, timings', async () => {
  const m = await client.messages.create(request);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, model);
  assert.match(m.id, /^msg_/);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
  assert.equal(m.stop_sequence, null);
  assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= 12);
  if (m.stop_reason === 'max_tokens') assert.equal(m.usage.output_tokens, 12);
  assert.equal(typeof m.usage.cache_read_input_tokens, 'number');
  promptTokens = m.usage.input_tokens + m.usage.cache_read_input_tokens;
  assert.ok(promptTokens > 0);
  assert.equal(m.timings.prompt_tokens, promptTokens);
  greedy = m.content[0].text;
});

await test('count_tokens counts the prompt that create used', async () => {
  const { system, messages } = request;
  const count = await client.messages.countTokens({ model, system, messages });
  assert.equal(count.input_tokens, promptTokens);
});

await test('a repeated conversation reads its prompt from the cache', async () => {
  const m = await client.messages.create(request);
  assert.equal(m.content[0].text, greedy);
  assert.ok(m.usage.cache_read_input_tokens > 0, JSON.stringify(m.usage));
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, promptTokens);
});

await test('messages.stream: events in order, text equals the plain answer', async () => {
  const stream = client.messages.stream(request);
  const events = [];
  let text = '';
  stream.on('streamEvent', (e) => events.push(e.type));
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.equal(text, greedy);
  assert.equal(final.content[0].text, greedy);
  assert.ok(['end_turn', 'max_tokens'].includes(final.stop_reason));
  assert.ok(final.usage.output_tokens >= 1);
  const kinds = events.filter((e) => e !== 'content_block_delta' && e !== 'ping');
  assert.deepEqual(kinds, ['message_start', 'content_block_start', 'content_block_stop', 'message_delta', 'message_stop']);
  assert.ok(events.includes('content_block_delta'));
});

await test('raw stream via create({stream: true})', async () => {
  const stream = await client.messages.create({ ...request, stream: true });
  let text = '', stopReason = null;
  for await (const e of stream) {
    if (e.type === 'content_block_delta') text += e.delta.text;
    if (e.type === 'message_delta') stopReason = e.delta.stop_reason;
  }
  assert.equal(text, greedy);
  assert.ok(['end_turn', 'max_tokens'].includes(stopReason));
});

await test('stop_sequences: stop_reason stop_sequence and the sequence named', async () => {
  const stop = stopFrom(greedy);
  assert.ok(stop, `the greedy answer is too short to pick a stop sequence from: ${JSON.stringify(greedy)}`);
  const m = await client.messages.create({ ...request, stop_sequences: [stop] });
  assert.equal(m.content[0].text, greedy.slice(0, greedy.indexOf(stop)));
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
});

await test('multi-turn conversation with a string system prompt, top_k, top_p, metadata', async () => {
  const m = await client.messages.create({
    model, max_tokens: 6, system: 'Be brief.', top_k: 5, top_p: 0.9, temperature: 0.7,
    metadata: { user_id: 'client-test' },
    messages: [
      { role: 'user', content: 'Hi' },
      { role: 'assistant', content: 'Hello.' },
      { role: 'user', content: 'Again?' },
    ],
  });
  assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= 6);
});

await test('models.list', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [model]);
});

await test('errors arrive as the client library\'s typed exceptions', async () => {
  const other = await client.messages.create({ ...request, model: 'claude-sonnet-4-5' });
  assert.equal(other.model, model); // any model name is served by the one model, as llama-server does
  await assert.rejects(client.messages.create({ ...request, max_tokens: 0 }),
    (e) => e instanceof Anthropic.BadRequestError && e.error.error.type === 'invalid_request_error');
  await assert.rejects(client.messages.create({ ...request, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: '' } }] }] }),
    (e) => e instanceof Anthropic.BadRequestError);
  const wrongKey = new Anthropic({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.messages.create(request),
    (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error');
});

finish();
