// Structured output through the official `openai` client against ember serve on a tiny random
// model: response_format json_schema (strict) and json_object, llama-server's `grammar`, plain and
// streamed; every answer is checked by ajv against its schema. Schemas or grammars that cannot be
// compiled are 400s that say why.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { baseURL, model, apiKey, test, finish } from './common.mjs';

const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 12 },
    unit: { enum: ['celsius', 'fahrenheit'] },
    temperature: { type: 'integer', minimum: -40, maximum: 50 },
    date: { type: 'string', format: 'date' },
    tags: { type: 'array', items: { type: 'string', pattern: '^[a-z]{1,5}$' }, maxItems: 3 },
  },
  required: ['city', 'unit', 'temperature', 'date', 'tags'],
  additionalProperties: false,
};
const validate = ajv.compile(weather);
const responseFormat = { type: 'json_schema', json_schema: { name: 'weather', strict: true, schema: weather } };

for (const seed of [1, 2, 3]) {
  await test(`json_schema (strict), seed ${seed}: the answer validates`, async () => {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 300, seed, response_format: responseFormat });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', c.message.content);
    const value = JSON.parse(c.message.content);
    assert.ok(validate(value), `${c.message.content}: ${ajv.errorsText(validate.errors)}`);
  });
}

await test('json_schema streamed: the deltas join into a valid answer', async () => {
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 300, seed: 7, stream: true, response_format: responseFormat });
  let text = '', reason = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta?.content) text += c.delta.content;
      if (c.finish_reason) reason = c.finish_reason;
    }
  }
  assert.equal(reason, 'stop');
  assert.ok(validate(JSON.parse(text)), `${text}: ${ajv.errorsText(validate.errors)}`);
});

await test('json_object: any JSON object', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 200, seed: 4, response_format: { type: 'json_object' } });
  const text = r.choices[0].message.content;
  if (r.choices[0].finish_reason === 'stop') {
    const value = JSON.parse(text);
    assert.equal(typeof value, 'object');
    assert.ok(!Array.isArray(value) && value !== null);
  } else {
    assert.match(text, /^\{/); // cut by max_tokens: still an object's beginning
  }
});

await test('grammar (GBNF) on chat and completions', async () => {
  const grammar = 'root ::= ("yes" | "no") "."';
  const r = await client.chat.completions.create({ model, messages, max_tokens: 20, seed: 5, grammar });
  assert.match(r.choices[0].message.content, /^(yes|no)\.$/);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const c = await client.completions.create({ model, prompt: 'Answer:', max_tokens: 20, seed: 6, n: 3, grammar: 'root ::= [0-9]{3}' });
  assert.equal(c.choices.length, 3);
  for (const choice of c.choices) assert.match(choice.text, /^[0-9]{3}$/);
});

await test('a schema with an unsupported keyword is a 400 naming it', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages, max_tokens: 5,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', uniqueItems: true } } } }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /uniqueItems/.test(e.message) &&
      e.param === 'response_format.json_schema.schema');
});

await test('a grammar that does not compile is a 400 with the rule and position', async () => {
  await assert.rejects(client.chat.completions.create({ model, messages, max_tokens: 5, grammar: 'root ::= answer' }),
    (e) => e instanceof OpenAI.BadRequestError && /line 1, column 10: rule 'answer' is used but not defined/.test(e.message));
});

finish();
