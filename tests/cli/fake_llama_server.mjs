// A stand-in for llama.cpp's server as `ember bench --url` meets it (bench_url.sh): no
// /v1/messages/count_tokens, a /tokenize that counts whitespace-separated words (digits one each),
// a chat template of its own, and streams that carry llama.cpp's `timings` (prompt_n, cache_n,
// prompt_ms, predicted_per_second) but no usage chunk. `node fake_llama_server.mjs` prints its URL.
// With MODE=usage it has no /tokenize and sends a usage chunk instead of timings (as an OpenAI-style
// server without a tokenizer endpoint); with MODE=malformed every stream carries an event that is
// not JSON; with MODE=late a prompt of more than 55 tokens gets an error event mid-stream (as
// llama.cpp's server sends when its chat parser rejects an answer); with MODE=ban a generating
// request without a logit_bias of -100 for each of the ids 3..258 gets an error event.
import http from 'node:http';

const TEMPLATE = 7, PER_MESSAGE = 3; // tokens the fake template adds
const count = (text) => text.split(/\s+/).filter(Boolean)
  .reduce((n, word) => n + (/^\d+\.?$/.test(word) ? word.length : 1), 0);
const prompt = (messages) => TEMPLATE + messages.reduce((n, m) => n + PER_MESSAGE + count(m.content), 0);
const mode = process.env.MODE ?? 'llama';

function body(request) {
  return new Promise((resolve) => {
    let text = '';
    request.on('data', (d) => { text += d; });
    request.on('end', () => resolve(text ? JSON.parse(text) : {}));
  });
}

const server = http.createServer(async (request, response) => {
  const json = (status, value) => {
    response.writeHead(status, { 'content-type': 'application/json' });
    response.end(JSON.stringify(value));
  };
  const req = await body(request);
  if (request.url === '/v1/models') return json(200, { data: [{ id: 'fake-llama' }] });
  if (request.url === '/tokenize' && mode !== 'usage') return json(200, { tokens: Array.from({ length: count(req.content) }, (_, i) => i + 1) });
  if (request.url !== '/v1/chat/completions') return json(404, { error: { message: `no ${request.url}` } });
  response.writeHead(200, { 'content-type': 'text/event-stream' });
  if (mode === 'malformed') return response.end('data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: {not json}\n\n');
  const banned = (b) => b && Object.keys(b).length === 256 &&
    Array.from({ length: 256 }, (_, i) => b[String(i + 3)] === -100).every(Boolean);
  if (mode === 'ban' && !banned(req.logit_bias))
    return response.end('data: {"error":{"message":"no logit_bias for the byte tokens"}}\n\n');
  if (mode === 'late' && prompt(req.messages) > 55)
    return response.end('data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: {"error":{"message":"parse failed"}}\n\n');
  const n = req.max_tokens;
  for (let i = 0; i < n; i++) response.write(`data: ${JSON.stringify({ choices: [{ delta: { content: `w${i} ` } }] })}\n\n`);
  const timings = { prompt_n: prompt(req.messages), cache_n: 0, prompt_ms: 1.5, predicted_n: n, predicted_per_second: 100 };
  response.write(`data: ${JSON.stringify({ choices: [{ delta: {}, finish_reason: 'length' }], timings })}\n\n`);
  if (mode === 'usage') {
    const usage = { prompt_tokens: prompt(req.messages), completion_tokens: n, total_tokens: prompt(req.messages) + n };
    response.write(`data: ${JSON.stringify({ choices: [], usage })}\n\n`);
  }
  response.end('data: [DONE]\n\n');
});
server.listen(0, '127.0.0.1', () => console.log(`http://127.0.0.1:${server.address().port}`));
