// The official `openai` npm client's Responses API (responses.create) against ember serve: plain
// and streamed answers equal to what chat completions gives for the same conversation at
// temperature 0, the streamed events in order with their sequence numbers, a function tool forced
// by tool_choice (arguments valid against its schema) with hosted tools ignored, the tool's result
// sent back, previous_response_id continuing a stored response from the prefix cache, text.format,
// and 400s naming the field.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { baseURL, model, apiKey, test, finish } from './common.mjs';

const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
const instructions = 'You are a dictionary.';
const question = 'What is the opposite of happy?';
const limit = 24;

// Chat completions' greedy answer to the same conversation: what every Responses answer is held to.
async function chatAnswer(messages, max_tokens = limit) {
  const r = await client.chat.completions.create({ model, messages, max_tokens, temperature: 0 });
  return r.choices[0].message.content;
}

let plain = null;
await test('responses.create: output_text equals chat completions at temperature 0', async () => {
  const want = await chatAnswer([{ role: 'system', content: instructions }, { role: 'user', content: question }]);
  const r = await client.responses.create({ model, instructions, input: question, max_output_tokens: limit, temperature: 0 });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.model, model);
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  assert.ok(want.length > 0, 'the chat answer is not empty');
  assert.equal(r.output_text, want);
  assert.equal(r.output.length, 1);
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].role, 'assistant');
  assert.equal(r.output[0].content[0].type, 'output_text');
  assert.equal(r.instructions, instructions);
  assert.equal(r.max_output_tokens, limit);
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0, JSON.stringify(r.usage));
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  plain = r.output_text;
});

await test('streamed responses: events in order, sequence numbers 0.., the same text', async () => {
  const stream = await client.responses.create({ model, instructions, input: question, max_output_tokens: limit, temperature: 0, stream: true });
  const types = [];
  let text = '', seq = 0, done = null, final = null, itemId = null;
  for await (const ev of stream) {
    assert.equal(ev.sequence_number, seq++, `sequence_number of ${ev.type}`);
    types.push(ev.type);
    if (ev.type === 'response.output_item.added') itemId = ev.item.id;
    if (ev.type === 'response.output_text.delta') {
      assert.equal(ev.item_id, itemId);
      text += ev.delta;
    }
    if (ev.type === 'response.output_text.done') done = ev.text;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  const head = ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added'];
  assert.deepEqual(types.slice(0, 4), head);
  const tail = types.slice(types.length - 4);
  assert.deepEqual(tail.slice(0, 3), ['response.output_text.done', 'response.content_part.done', 'response.output_item.done']);
  assert.ok(['response.completed', 'response.incomplete'].includes(tail[3]), tail[3]);
  assert.ok(types.slice(4, types.length - 4).every((t) => t === 'response.output_text.delta'), types.join(' '));
  assert.equal(text, plain);
  assert.equal(done, plain);
  assert.equal(final.output[0].id, itemId);
  assert.equal(final.output[0].content[0].text, plain);
  assert.ok(final.usage.output_tokens > 0);
});

const tools = [
  { type: 'web_search' }, // a hosted tool: accepted and left out
  {
    type: 'function', name: 'define_word', description: 'Looks a word up in the dictionary.', strict: true,
    parameters: { type: 'object', properties: { word: { type: 'string', maxLength: 20 }, senses: { type: 'integer', minimum: 1, maximum: 3 } },
      required: ['word', 'senses'], additionalProperties: false },
  },
];

function checkArguments(text) {
  const args = JSON.parse(text);
  assert.deepEqual(Object.keys(args), ['word', 'senses']);
  assert.equal(typeof args.word, 'string');
  assert.ok(args.word.length <= 20);
  assert.ok(Number.isInteger(args.senses) && args.senses >= 1 && args.senses <= 3, text);
}

let call = null, callResponse = null;
await test('a function tool forced by tool_choice: a function_call item whose arguments fit the schema', async () => {
  const r = await client.responses.create({
    model, input: 'Define the word river.', tools, tool_choice: { type: 'function', name: 'define_word' }, max_output_tokens: 64, temperature: 0,
  });
  assert.equal(r.status, 'completed');
  const calls = r.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1, JSON.stringify(r.output));
  assert.equal(calls[0].name, 'define_word');
  assert.match(calls[0].call_id, /^call_/);
  checkArguments(calls[0].arguments);
  assert.deepEqual(r.ignored_tools, ['web_search']);
  assert.equal(r.tools.length, 2, 'the response repeats the tools as given');
  call = calls[0];
  callResponse = r;
});

await test('tool_choice required, streamed: function_call_arguments deltas add up to .done', async () => {
  const stream = await client.responses.create({
    model, input: 'Define the word river.', tools, tool_choice: 'required', max_output_tokens: 64, temperature: 0, stream: true,
  });
  let args = '', done = null, added = null, final = null;
  for await (const ev of stream) {
    if (ev.type === 'response.output_item.added' && ev.item.type === 'function_call') added = ev.item;
    if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
    if (ev.type === 'response.function_call_arguments.done') done = ev.arguments;
    if (ev.type === 'response.completed') final = ev.response;
  }
  assert.ok(added, 'a function_call item was added');
  assert.equal(added.name, 'define_word');
  assert.equal(args, done);
  checkArguments(done);
  assert.equal(final.output.at(-1).arguments, done);
});

await test('the tool result goes back by previous_response_id: an answer, from the cache', async () => {
  const r = await client.responses.create({
    model, previous_response_id: callResponse.id, tools, max_output_tokens: limit, temperature: 0,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: 'a large natural stream of water' }],
  });
  assert.equal(r.previous_response_id, callResponse.id);
  assert.equal(r.output.at(-1).type === 'message' || r.output.at(-1).type === 'function_call', true);
  assert.ok(r.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(r.usage));
});

await test('previous_response_id: the continued conversation equals chat completions, its prompt cached', async () => {
  const first = await client.responses.create({ model, input: question, max_output_tokens: limit, temperature: 0 });
  const follow = 'Use the word garden in a sentence.';
  const r = await client.responses.create({ model, previous_response_id: first.id, input: follow, max_output_tokens: limit, temperature: 0 });
  const want = await chatAnswer([
    { role: 'user', content: question }, { role: 'assistant', content: first.output_text }, { role: 'user', content: follow },
  ]);
  assert.equal(r.output_text, want);
  assert.ok(r.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(r.usage));
  assert.ok(r.usage.input_tokens > first.usage.input_tokens);
  // the same continuation as explicit input items
  const items = await client.responses.create({
    model, max_output_tokens: limit, temperature: 0, store: false,
    input: [
      { role: 'user', content: [{ type: 'input_text', text: question }] },
      { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: first.output_text }] },
      { role: 'user', content: follow },
    ],
  });
  assert.equal(items.output_text, want);
  assert.equal(items.store, false);
});

await test('store: false is not kept; an unknown previous_response_id is a 400 naming it', async () => {
  const r = await client.responses.create({ model, input: question, max_output_tokens: 4, temperature: 0, store: false });
  for (const id of [r.id, 'resp_unknown']) {
    await assert.rejects(client.responses.create({ model, previous_response_id: id, input: 'more' }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id' && e.code === 'previous_response_not_found');
  }
});

await test('text.format json_schema: the answer is a value of the schema', async () => {
  const schema = { type: 'object', properties: { word: { type: 'string', maxLength: 12 }, opposite: { type: 'string', maxLength: 12 } },
    required: ['word', 'opposite'], additionalProperties: false };
  const r = await client.responses.create({
    model, input: question, max_output_tokens: 64, temperature: 0, text: { format: { type: 'json_schema', name: 'pair', schema, strict: true } },
  });
  const value = JSON.parse(r.output_text);
  assert.deepEqual(Object.keys(value), ['word', 'opposite']);
  assert.equal(r.text.format.type, 'json_schema');
});

await test('malformed fields are 400s naming the field', async () => {
  const cases = [
    [{ model, input: question, temperature: 5 }, 'temperature'],
    [{ model, input: question, max_output_tokens: 0 }, 'max_output_tokens'],
    [{ model }, 'input'],
    [{ model, input: 42 }, 'input'],
    [{ model, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }, 'input[0].content[0]'],
    [{ model, input: question, tools: [{ type: 'function' }] }, 'tools[0]'],
    [{ model, input: question, text: { format: { type: 'xml' } } }, 'text.format.type'],
    [{ input: question }, 'model'],
  ];
  for (const [body, param] of cases) {
    await assert.rejects(client.responses.create(body),
      (e) => e instanceof OpenAI.BadRequestError && e.param === param, `${JSON.stringify(body)} → ${param}`);
  }
});

finish();
