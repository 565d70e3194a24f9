// Raw HTTP against ember serve (node's fetch): the exact SSE framing, and every error path in each
// API's own error format; after all of them the server still answers.
// The server under test runs with --max-body 65536 and a context small enough that a 2,000-word
// prompt does not fit.
import assert from 'node:assert/strict';
import { baseURL, model, apiKey, test, finish, metrics } from './common.mjs';

const auth = { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' };
const post = (path, body, headers = auth) =>
  fetch(`${baseURL}${path}`, { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body) });
const chat = { model, max_tokens: 5, temperature: 0, messages: [{ role: 'user', content: 'Hi' }] };

async function openaiError(res, status, param) {
  assert.equal(res.status, status);
  assert.match(res.headers.get('content-type'), /application\/json/);
  const body = await res.json();
  assert.equal(typeof body.error.message, 'string');
  assert.equal(typeof body.error.type, 'string');
  assert.ok('param' in body.error && 'code' in body.error);
  if (param !== undefined) assert.equal(body.error.param, param);
  return body.error;
}

async function anthropicError(res, status, type) {
  assert.equal(res.status, status);
  const body = await res.json();
  assert.equal(body.type, 'error');
  assert.equal(body.error.type, type);
  assert.equal(typeof body.error.message, 'string');
  return body.error;
}

await test('health and metrics', async () => {
  const h = await fetch(`${baseURL}/health`);
  assert.equal(h.status, 200);
  assert.equal((await h.json()).status, 'ok');
  const text = await metrics();
  for (const name of ['ember_http_requests_total', 'ember_prompt_tokens_total', 'ember_generated_tokens_total',
    'ember_cached_tokens_total', 'ember_queue_length', 'ember_running_sequences', 'ember_kv_blocks_used',
    'ember_kv_blocks_free', 'ember_step_seconds_bucket{le="+Inf"}', 'ember_step_seconds_count'])
    assert.ok(text.includes(name), `metrics lack ${name}`);
});

await test('OpenAI SSE framing: data lines, blank-line separators, [DONE] last', async () => {
  const res = await post('/v1/chat/completions', { ...chat, stream: true, stream_options: { include_usage: true } });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/event-stream/);
  const text = await res.text();
  assert.ok(text.endsWith('data: [DONE]\n\n'));
  const events = text.split('\n\n').slice(0, -1);
  for (const e of events) assert.match(e, /^data: [^\n]+$/);
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)));
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const last = chunks[chunks.length - 1];
  assert.deepEqual(last.choices, []);
  assert.ok(last.usage.completion_tokens >= 1);
  assert.equal(typeof last.timings.prefill_ms, 'number');
  assert.equal(chunks.filter((c) => c.choices.length && c.choices[0].finish_reason).length, 1);
});

await test('Anthropic SSE framing: event and data lines, message_stop last', async () => {
  const res = await post('/v1/messages', { ...chat, stream: true }, { 'x-api-key': apiKey, 'anthropic-version': '2023-06-01' });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/event-stream/);
  const text = await res.text();
  const events = text.split('\n\n');
  assert.equal(events.pop(), '');
  const names = events.map((e) => {
    const m = /^event: ([a-z_]+)\ndata: (\{[^\n]*\})$/.exec(e);
    assert.ok(m, `bad event framing: ${JSON.stringify(e)}`);
    assert.equal(JSON.parse(m[2]).type, m[1]);
    return m[1];
  });
  assert.deepEqual(names.slice(0, 3), ['message_start', 'content_block_start', 'ping']);
  assert.deepEqual(names.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.ok(names.slice(3, -3).every((n) => n === 'content_block_delta'));
});

await test('malformed JSON, wrong types, missing fields → 400 in each format', async () => {
  await openaiError(await post('/v1/chat/completions', '{"model":'), 400);
  await openaiError(await post('/v1/chat/completions', { ...chat, temperature: 'warm' }), 400, 'temperature');
  await openaiError(await post('/v1/chat/completions', { model }), 400, 'messages');
  await openaiError(await post('/v1/completions', { model, prompt: { text: 'x' } }), 400, 'prompt');
  await openaiError(await post('/v1/completions', { model, prompt: 'x', max_tokens: -1 }), 400, 'max_tokens');
  const aHeaders = { 'x-api-key': apiKey, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' };
  await anthropicError(await post('/v1/messages', '[1,', aHeaders), 400, 'invalid_request_error');
  await anthropicError(await post('/v1/messages', { model, messages: chat.messages }, aHeaders), 400, 'invalid_request_error');
  await anthropicError(await post('/v1/messages', { ...chat, max_tokens: 0 }, aHeaders), 400, 'invalid_request_error');
  await anthropicError(await post('/v1/messages/count_tokens', { model }, aHeaders), 400, 'invalid_request_error');
});

await test('another model name is served by this model, which reports its own id', async () => {
  const res = await post('/v1/chat/completions', { ...chat, model: 'gpt-4o' });
  assert.equal(res.status, 200);
  assert.equal((await res.json()).model, model);
  const a = await post('/v1/messages', { ...chat, model: 'claude-sonnet-4-5' }, { 'x-api-key': apiKey, 'content-type': 'application/json' });
  assert.equal(a.status, 200);
  assert.equal((await a.json()).model, model);
  const other = await fetch(`${baseURL}/v1/models/gpt-4o`, { headers: auth });
  await openaiError(other, 404, 'model');
});

await test('a prompt longer than the context → 400 context_length_exceeded', async () => {
  const long = Array.from({ length: 2000 }, (_, i) => `word${i}`).join(' ');
  const e = await openaiError(await post('/v1/completions', { model, prompt: long, max_tokens: 4 }), 400, 'prompt');
  assert.equal(e.code, 'context_length_exceeded');
  await openaiError(await post('/v1/chat/completions', { ...chat, messages: [{ role: 'user', content: long }] }), 400, 'messages');
});

await test('a body over --max-body → 413', async () => {
  const big = JSON.stringify({ ...chat, messages: [{ role: 'user', content: 'x'.repeat(70000) }] });
  await openaiError(await post('/v1/chat/completions', big), 413);
  await anthropicError(await post('/v1/messages', big, { 'x-api-key': apiKey }), 413, 'request_too_large');
});

await test('missing or wrong API key → 401; health needs none', async () => {
  await openaiError(await post('/v1/chat/completions', chat, { 'content-type': 'application/json' }), 401);
  await openaiError(await post('/v1/chat/completions', chat, { authorization: 'Bearer nope' }), 401);
  await anthropicError(await post('/v1/messages', chat, { 'x-api-key': 'nope' }), 401, 'authentication_error');
  assert.equal((await fetch(`${baseURL}/v1/models`)).status, 401);
  assert.equal((await fetch(`${baseURL}/health`)).status, 200);
});

await test('unknown path → 404, wrong method → 405', async () => {
  await openaiError(await fetch(`${baseURL}/v1/audio/speech`, { method: 'POST', headers: auth, body: '{}' }), 404);
  const res = await fetch(`${baseURL}/v1/chat/completions`, { headers: auth });
  await openaiError(res, 405);
  assert.equal(res.headers.get('allow'), 'POST');
  await openaiError(await fetch(`${baseURL}/v1/models`, { method: 'DELETE', headers: auth }), 405);
});

await test('client disconnect mid-stream: the server keeps serving, metrics count the request', async () => {
  const controller = new AbortController();
  const res = await fetch(`${baseURL}/v1/chat/completions`, {
    method: 'POST', headers: auth, signal: controller.signal,
    body: JSON.stringify({ ...chat, max_tokens: 200, stream: true }),
  });
  const reader = res.body.getReader();
  await reader.read();
  controller.abort();
  const after = await post('/v1/chat/completions', chat);
  assert.equal(after.status, 200);
  const text = await metrics();
  assert.match(text, /ember_http_requests_total\{endpoint="\/v1\/chat\/completions",status="400"\} [1-9]/);
  assert.match(text, /ember_http_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\} [1-9]/);
});

finish();
