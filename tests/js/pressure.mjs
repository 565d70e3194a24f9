// Memory pressure: CLIENTS clients, each with two long conversations of its own, all sending at once
// to a server whose KV cache holds only a few of them. Every answer must equal the one the same
// request got alone (taken first, one request at a time), except where the two part at a near-tie:
// at the first token where they differ, the two best tokens' log-probabilities of either answer lie
// within TIE. Every request must succeed (no 5xx, no dropped connection), the engine must be idle
// afterwards, and the load must have recomputed prompts the cache could not keep (else there was no
// pressure to test).
//   node pressure.mjs BASE_URL MODEL API_KEY [CLIENTS=32] [DOC_WORDS=7900] [TURNS=2]
import assert from 'node:assert/strict';
import { baseURL, model, apiKey, metrics, test, finish } from './common.mjs';

const clients = Number(process.argv[5] || 32);
const docWords = Number(process.argv[6] || 7900);
const turns = Number(process.argv[7] || 2);
const ANSWER_TOKENS = 12, TIE = 0.05;
const headers = { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' };

const WORDS = ('time year people way day man thing woman life child world school state family student group ' +
  'country problem hand part place case week company system program question work government number night ' +
  'point home water room mother area money story fact month lot right study book eye job word business issue ' +
  'side kind head house service friend father power hour game line end member law car city community name').split(' ');

// A conversation's document: a header naming it, then words drawn by a seeded generator.
function documentText(client, conversation) {
  let seed = (client * 1000003 + conversation * 7919 + 17) >>> 0;
  const out = [`Conversation ${client}-${conversation}. Read this record and answer the questions after it.`];
  for (let i = 0; i < docWords; i++) {
    seed = (seed * 1664525 + 1013904223) >>> 0;
    out.push(WORDS[(seed >>> 16) % WORDS.length]); // the high bits: the low ones of this generator cycle fast
  }
  return out.join(' ');
}

// The messages of turn `turn` of a conversation: the document with the first question, then each
// earlier answer (the reference's) and the next question.
function messagesOf(client, conversation, turn, answers) {
  const questions = Array.from({ length: turn + 1 }, (_, k) => `Question ${k + 1}: which words come up most?`);
  const m = [{ role: 'user', content: `${documentText(client, conversation)}\n\n${questions[0]}` }];
  for (let k = 1; k <= turn; k++) {
    m.push({ role: 'assistant', content: answers[k - 1].text });
    m.push({ role: 'user', content: questions[k] });
  }
  return m;
}

async function ask(messages) {
  const res = await fetch(`${baseURL}/v1/chat/completions`, {
    method: 'POST', headers,
    body: JSON.stringify({ model, messages, max_tokens: ANSWER_TOKENS, temperature: 0, ignore_eos: true,
      logprobs: true, top_logprobs: 2 }),
  });
  const text = await res.text();
  assert.equal(res.status, 200, `HTTP ${res.status}: ${text.slice(0, 300)}`);
  const answer = JSON.parse(text), choice = answer.choices[0];
  return { text: choice.message.content, tokens: choice.logprobs.content, prompt: answer.usage.prompt_tokens,
    cached: answer.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

// Whether two answers part at a near-tie (or not at all).
function sameOrTie(a, b) {
  const n = Math.min(a.tokens.length, b.tokens.length);
  let i = 0;
  while (i < n && a.tokens[i].token === b.tokens[i].token) i++;
  if (i === n && a.tokens.length === b.tokens.length) return 'same';
  const gap = (t) => t && t.top_logprobs.length > 1 ? t.top_logprobs[0].logprob - t.top_logprobs[1].logprob : Infinity;
  return Math.min(gap(a.tokens[i]), gap(b.tokens[i])) <= TIE ? `a near-tie at token ${i}` : null;
}

// The references, one request at a time; each conversation's answers feed its later turns.
const reference = [];
for (let c = 0; c < clients; c++) {
  reference.push([]);
  for (let k = 0; k < 2; k++) {
    const answers = [];
    for (let t = 0; t < turns; t++) answers.push(await ask(messagesOf(c, k, t, answers)));
    reference[c].push(answers);
  }
}

// The load: every client alternates between its two conversations, turn by turn, all at once.
let same = 0, ties = 0, wrong = 0, failed = 0, prompt = 0, cached = 0;
await Promise.all(reference.map(async (convs, c) => {
  for (let t = 0; t < turns; t++)
    for (let k = 0; k < 2; k++) {
      try {
        const got = await ask(messagesOf(c, k, t, convs[k]));
        const verdict = sameOrTie(got, convs[k][t]);
        prompt += got.prompt, cached += got.cached;
        if (verdict === 'same') same++;
        else if (verdict) { ties++; console.log(`client ${c} conversation ${k} turn ${t}: ${verdict}`); }
        else {
          wrong++;
          console.log(`client ${c} conversation ${k} turn ${t}: got ${JSON.stringify(got.text)}, ` +
            `alone ${JSON.stringify(convs[k][t].text)}`);
        }
      } catch (e) {
        failed++;
        console.log(`client ${c} conversation ${k} turn ${t}: ${e.message}`);
      }
    }
}));
const m = await metrics();
const gauge = (name) => Number((new RegExp(`^${name} (\\d+)$`, 'm').exec(m) || [])[1]);
const running = gauge('ember_running_sequences'), queued = gauge('ember_queue_length');
console.log(`${clients} clients x 2 conversations x ${turns} turns: ${same} the same as alone, ${ties} parted at a ` +
  `near-tie, ${wrong} wrong, ${failed} failed; preemptions ${gauge('ember_preemptions_total')}, ` +
  `afterwards running ${running}, queued ${queued}; prompt tokens ${prompt}, ${cached} of them from the cache`);
await test('every request answered, as alone or parting at a near-tie', () => {
  assert.equal(failed, 0, 'failed requests');
  assert.equal(wrong, 0, 'answers unlike their answer alone');
});
await test('the engine idle afterwards', () => assert.deepEqual([running, queued], [0, 0]));
// the cache must have been too small: had it kept every conversation, the load would recompute nothing
await test('the load ran under memory pressure', () =>
  assert.ok(cached < prompt * 0.9, 'the prompts were found cached: a larger DOC_WORDS or CLIENTS'));
finish();
