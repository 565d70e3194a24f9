// Embeddings with real clients against `ember serve --pooling mean --matryoshka` on the project's
// model: the official `openai` package's embeddings.create (its default base64, decoded by the SDK,
// and float: the same vectors), token-id input, usage against /tokenize, dimensions; the `ollama`
// package's embed and embeddings (the same vectors, truncation, Ollama's counts) and show's
// capabilities; LangChain's OllamaEmbeddings and OpenAIEmbeddings; and each API's 400s naming the
// field. The vectors' values themselves are checked against llama.cpp in embed_peer.mjs.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { OllamaEmbeddings } from '@langchain/ollama';
import { OpenAIEmbeddings } from '@langchain/openai';
import { baseURL, model, apiKey, test, finish } from './common.mjs';

const headers = { Authorization: `Bearer ${apiKey}` };
const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
const ollama = new Ollama({ host: baseURL, headers });
const texts = ['a river bank', 'money in the bank', 'the opposite of happy'];

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const cosine = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0) / (norm(a) * norm(b));
function assertSame(a, b, tolerance, what) {
  assert.equal(a.length, b.length, `${what}: lengths`);
  for (let i = 0; i < a.length; i++)
    assert.ok(Math.abs(a[i] - b[i]) <= tolerance, `${what}: element ${i}: ${a[i]} against ${b[i]}`);
}
async function tokenize(content) {
  const res = await fetch(`${baseURL}/tokenize`, { method: 'POST', headers, body: JSON.stringify({ content, add_special: true }) });
  return (await res.json()).tokens;
}

const floats = (await openai.embeddings.create({ model, input: texts, encoding_format: 'float' })).data.map((d) => d.embedding);

await test('openai embeddings.create: base64 (the SDK\'s default, decoded by it) and float are the same float32 vectors', async () => {
  const r = await openai.embeddings.create({ model, input: texts });
  assert.equal(r.object, 'list');
  assert.equal(r.data.length, 3);
  r.data.forEach((d, i) => {
    assert.equal(d.object, 'embedding');
    assert.equal(d.index, i);
    assert.ok(d.embedding.length > 16);
    assert.deepEqual(d.embedding, floats[i].map(Math.fround), `input ${i}`);
    assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5, 'unit length');
  });
  assert.ok(cosine(floats[0], floats[1]) < 0.99999, 'different texts, different vectors');
});

await test('usage counts the inputs\' tokens as /tokenize gives them; token-id input equals the text', async () => {
  const ids = await Promise.all(texts.map(tokenize));
  const r = await openai.embeddings.create({ model, input: texts, encoding_format: 'float' });
  const tokens = ids.reduce((s, t) => s + t.length, 0);
  assert.equal(r.usage.prompt_tokens, tokens);
  assert.equal(r.usage.total_tokens, tokens);
  const byIds = await openai.embeddings.create({ model, input: ids, encoding_format: 'float' });
  byIds.data.forEach((d, i) => assertSame(d.embedding, floats[i], 0, `ids of input ${i}`));
  const one = await openai.embeddings.create({ model, input: ids[1], encoding_format: 'float' });
  assertSame(one.data[0].embedding, floats[1], 0, 'one array of ids');
  const single = await openai.embeddings.create({ model, input: texts[2], encoding_format: 'float' });
  assertSame(single.data[0].embedding, floats[2], 0, 'one string');
});

await test('dimensions: the first N numbers at unit length again', async () => {
  const r = await openai.embeddings.create({ model, input: texts[0], dimensions: 8, encoding_format: 'float' });
  const v = r.data[0].embedding, head = floats[0].slice(0, 8), scale = norm(head);
  assertSame(v, head.map((x) => x / scale), 1e-6, 'shortened');
});

await test('openai 400s name the field', async () => {
  const bad = async (body, param) => {
    await assert.rejects(openai.embeddings.create({ model, ...body }), (e) => e.status === 400 && e.param === param,
      JSON.stringify(body));
  };
  await bad({ input: texts, encoding_format: 'hex' }, 'encoding_format');
  await bad({ input: [], encoding_format: 'float' }, 'input');
  await bad({ input: [''], encoding_format: 'float' }, 'input');
  await bad({ input: [[1, -5]], encoding_format: 'float' }, 'input');
  await bad({ input: [{ text: 'x' }], encoding_format: 'float' }, 'input');
  await bad({ input: 'x', dimensions: 0, encoding_format: 'float' }, 'dimensions');
  await bad({ input: 'x', dimensions: 100000, encoding_format: 'float' }, 'dimensions');
  await bad({ input: 'river '.repeat(400), encoding_format: 'float' }, 'input');
});

await test('ollama embed: the same vectors, Ollama\'s counts', async () => {
  const r = await ollama.embed({ model, input: texts });
  assert.equal(r.embeddings.length, 3);
  r.embeddings.forEach((v, i) => assertSame(v, floats[i], 0, `input ${i}`));
  const ids = await Promise.all(texts.map(tokenize));
  assert.equal(r.prompt_eval_count, ids.reduce((s, t) => s + t.length, 0));
  assert.ok(Number.isInteger(r.total_duration) && r.total_duration > 0);
  assert.ok(Number.isInteger(r.load_duration) && r.load_duration >= 0);
  const one = await ollama.embed({ model, input: texts[1], dimensions: 8 });
  assert.equal(one.embeddings[0].length, 8);
});

await test('ollama embed: long inputs cut to the context (truncate, the default), refused with truncate false', async () => {
  const long = 'river bank '.repeat(300);
  const cut = await ollama.embed({ model, input: long });
  const ids = (await tokenize(long)).slice(0, cut.prompt_eval_count);
  assert.ok(cut.prompt_eval_count < (await tokenize(long)).length);
  const want = (await openai.embeddings.create({ model, input: ids, encoding_format: 'float' })).data[0].embedding;
  assertSame(cut.embeddings[0], want, 0, 'the first tokens');
  await assert.rejects(ollama.embed({ model, input: long, truncate: false }), (e) => e.status_code === 400 && /truncate/.test(e.error));
});

await test('ollama embeddings (the old endpoint) and show\'s capabilities', async () => {
  const r = await ollama.embeddings({ model, prompt: texts[2] });
  assertSame(r.embedding, floats[2], 0, 'prompt');
  const empty = await ollama.embeddings({ model, prompt: '' });
  assert.deepEqual(empty.embedding, []);
  const show = await ollama.show({ model });
  assert.ok(show.capabilities.includes('embedding'), JSON.stringify(show.capabilities));
  await assert.rejects(ollama.embed({ model, input: [3] }), (e) => e.status_code === 400 && /input/.test(e.error));
});

await test('LangChain OllamaEmbeddings and OpenAIEmbeddings', async () => {
  const lo = new OllamaEmbeddings({ model, baseUrl: baseURL, headers });
  const docs = await lo.embedDocuments(texts);
  docs.forEach((v, i) => assertSame(v, floats[i], 0, `OllamaEmbeddings ${i}`));
  assertSame(await lo.embedQuery(texts[0]), floats[0], 0, 'OllamaEmbeddings query');
  const oa = new OpenAIEmbeddings({ model, apiKey, configuration: { baseURL: `${baseURL}/v1` }, maxRetries: 0 });
  const docs2 = await oa.embedDocuments(texts);
  docs2.forEach((v, i) => assertSame(v, floats[i], 1e-7, `OpenAIEmbeddings ${i}`));
  assertSame(await oa.embedQuery(texts[1]), floats[1], 1e-7, 'OpenAIEmbeddings query');
});

finish();
