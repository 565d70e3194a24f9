// The Anthropic client's tool flow on a recorded answer, the same for every call format the server
// reads (tests/js/harmony_recorded.mjs, gemma4_recorded.mjs): the fake engine answers PROMPT with a
// thought (REASONING) and a get_weather call (ARGUMENTS), and the conversation carrying the tool's
// result with the thought 'Sunny, say so.' and the text 'It will be sunny.'.
import assert from 'node:assert/strict';
import { model, test } from './common.mjs';

export async function anthropicToolFlow(anthropic, { prompt, schema, reasoning, args }) {
  const anthropicTools = [{ name: 'get_weather', description: 'Weather forecast', input_schema: schema }];
  const anthropicRequest = {
    model, max_tokens: 300, tools: anthropicTools, thinking: { type: 'enabled', budget_tokens: 8000 },
    messages: [{ role: 'user', content: prompt }],
  };
  let message = null;

  await test('messages.create: a thinking block, then a tool_use block, stop_reason tool_use', async () => {
    const m = await anthropic.messages.create(anthropicRequest);
    assert.equal(m.stop_reason, 'tool_use');
    assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'tool_use']);
    assert.equal(m.content[0].thinking, reasoning);
    assert.equal(m.content[1].name, 'get_weather');
    assert.deepEqual(m.content[1].input, JSON.parse(args));
    message = m;
  });

  await test('messages.stream: thinking_delta and input_json_delta events assemble the same blocks', async () => {
    const stream = anthropic.messages.stream(anthropicRequest);
    const kinds = new Set();
    stream.on('streamEvent', (e) => { if (e.type === 'content_block_delta') kinds.add(e.delta.type); });
    const final = await stream.finalMessage();
    assert.deepEqual([...kinds].sort(), ['input_json_delta', 'thinking_delta']);
    assert.equal(final.stop_reason, 'tool_use');
    assert.deepEqual(final.content.map((b) => b.type), ['thinking', 'tool_use']);
    assert.equal(final.content[0].thinking, reasoning);
    assert.deepEqual(final.content[1].input, message.content[1].input);
  });

  await test('messages.create: the tool_result goes back, the final answer comes out', async () => {
    const use = message.content.find((b) => b.type === 'tool_use');
    const m = await anthropic.messages.create({
      ...anthropicRequest,
      messages: [
        ...anthropicRequest.messages,
        { role: 'assistant', content: message.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] },
      ],
    });
    assert.equal(m.stop_reason, 'end_turn');
    assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
    assert.equal(m.content[0].thinking, 'Sunny, say so.');
    assert.equal(m.content[1].text, 'It will be sunny.');
  });
}
