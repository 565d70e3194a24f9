// Load: CLIENTS concurrent streaming clients for SECONDS, each sending greedy chat requests again
// and again (distinct prompts per client) and checking every streamed answer against that prompt's
// non-streamed greedy answer taken before the load. Afterwards the engine must be idle again.
//   node load.mjs BASE_URL MODEL API_KEY [CLIENTS=32] [SECONDS=60]
import assert from 'node:assert/strict';
import { baseURL, model, apiKey, metrics } from './common.mjs';

const clients = Number(process.argv[5] || 32);
const seconds = Number(process.argv[6] || 60);
const headers = { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' };
const body = (i, stream) => JSON.stringify({
  model, max_tokens: 24, temperature: 0, stream,
  messages: [{ role: 'user', content: `Client ${i}: tell me something about the number ${i * 7 + 3}.` }],
});

async function plain(i) {
  const res = await fetch(`${baseURL}/v1/chat/completions`, { method: 'POST', headers, body: body(i, false) });
  assert.equal(res.status, 200, await res.clone().text());
  return (await res.json()).choices[0].message.content;
}

async function streamed(i) {
  const res = await fetch(`${baseURL}/v1/chat/completions`, { method: 'POST', headers, body: body(i, true) });
  assert.equal(res.status, 200);
  const text = await res.text();
  assert.ok(text.endsWith('data: [DONE]\n\n'), 'stream not terminated');
  let out = '';
  for (const event of text.split('\n\n').slice(0, -2)) {
    const chunk = JSON.parse(event.slice(6));
    for (const c of chunk.choices) out += c.delta.content || '';
  }
  return out;
}

function gauge(text, name) {
  const m = new RegExp(`^${name} (\\d+)$`, 'm').exec(text);
  assert.ok(m, `no ${name} in metrics`);
  return Number(m[1]);
}

const expected = [];
for (let i = 0; i < clients; i++) expected.push(await plain(i));
const deadline = Date.now() + seconds * 1000;
let done = 0, wrong = 0, failed = 0;
await Promise.all(expected.map(async (want, i) => {
  while (Date.now() < deadline) {
    try {
      const got = await streamed(i);
      if (got === want) done++;
      else { wrong++; console.log(`client ${i}: got ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`); }
    } catch (e) {
      failed++;
      console.log(`client ${i}: ${e}`);
    }
  }
}));
const m = await metrics();
const running = gauge(m, 'ember_running_sequences'), queued = gauge(m, 'ember_queue_length');
console.log(`${clients} clients, ${seconds} s: ${done} requests right, ${wrong} wrong, ${failed} failed; ` +
  `afterwards running ${running}, queued ${queued}`);
process.exit(wrong === 0 && failed === 0 && done >= clients && running === 0 && queued === 0 ? 0 : 1);
