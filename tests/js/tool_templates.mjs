// Tool calls through a real chat template (tests/cli/tool_templates.sh): ember serve runs a tiny
// random model that carries the template and a vocabulary where the template's call marker is one
// control token. The model is pushed towards that token (logit_bias), as a trained model would
// write it, and the answer must come back as a tool call:
//   node tool_templates.mjs BASE_URL MODEL API_KEY MARKER_ID TOOL_CHOICE
// MARKER_ID: the marker's token id (-1: none to push); TOOL_CHOICE: auto or required. Each answer
// goes back with its tool result through the template (a second turn must render and answer).
import assert from 'node:assert/strict';
import { baseURL, model, apiKey, test, finish } from './common.mjs';

const [markerId, toolChoice] = process.argv.slice(5);
const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 8, description: 'The city' },
    days: { type: 'integer', minimum: 1, maximum: 7, description: 'How many days' },
  },
  required: ['city', 'days'],
  additionalProperties: false,
};
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather forecast', parameters: weather } }];
const question = [{ role: 'user', content: 'What will the weather be in Oslo this week?' }];

async function chat(body) {
  const r = await fetch(`${baseURL}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ model, tools, max_tokens: 80, temperature: 0, ...body }),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  return JSON.parse(text);
}

for (const seed of [1, 2, 3]) {
  await test(`${toolChoice}: the marker as a control token → a call of get_weather (seed ${seed})`, async () => {
    const bias = Number(markerId) >= 0 ? { logit_bias: { [markerId]: 100 } } : {};
    const r = await chat({ messages: question, tool_choice: toolChoice, seed, ...bias });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.equal(c.message.tool_calls.length, 1);
    const call = c.message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    const args = JSON.parse(call.function.arguments);
    assert.equal(typeof args.city, 'string');
    assert.ok(args.city.length <= 8);
    assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7, call.function.arguments);
    // Mistral's templates take only call ids of nine letters and digits.
    const id = `abc12345${seed}`;
    const messages = [
      ...question,
      { role: 'assistant', content: null, tool_calls: [{ ...call, id }] },
      { role: 'tool', tool_call_id: id, name: 'get_weather', content: JSON.stringify({ forecast: 'sunny' }) },
    ];
    const answer = await chat({ messages, tool_choice: 'none', max_tokens: 8, seed });
    assert.equal(typeof answer.choices[0].message.content, 'string');
  });
}

finish();
