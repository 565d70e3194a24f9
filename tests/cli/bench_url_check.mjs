// Checks a results.json of `ember bench --url` (called by bench_url.sh):
//   node bench_url_check.mjs RESULTS.json CASE
// CASE names what the run asked for (below); every check is a value, not only a shape.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

const [file, which] = process.argv.slice(2);
const r = JSON.parse(readFileSync(file, 'utf8'));
const near = (a, b, what) => assert.ok(Math.abs(a - b) <= 1e-6 * Math.max(1, Math.abs(b)), `${what}: ${a} != ${b}`);
// the chat template's head ("<s><|im_start|>user\nSession ") is shared by every prompt; the session
// number that follows is not, so a cold prompt finds at most that head in the cache
const HEAD = 16;

function checkConcurrency(servers, clients, maxTokens, promptTokens, warm) {
  for (const server of servers)
    for (const c of clients) {
      const entries = r.concurrency.filter((e) => e.server === server && e.clients === c);
      assert.equal(entries.length, r.settings.rounds, `server ${server} clients ${c}: one entry per round`);
      for (const e of entries) {
        assert.equal(e.requests.length, c);
        for (const q of e.requests) {
          assert.equal(q.completion_tokens, maxTokens, 'every request runs to -n');
          assert.equal(q.prompt_tokens, promptTokens, 'prompts of the asked length');
          if (warm) assert.equal(q.cached_tokens, promptTokens - 1, 'a warmed prompt comes from the cache');
          else assert.ok(q.cached_tokens <= HEAD, `a cold prompt found ${q.cached_tokens} tokens cached`);
          assert.ok(q.first_token_ms > 0 && q.first_token_ms <= q.total_ms, 'first token before the end');
          assert.ok(q.server_prefill_ms >= 0 && q.server_decode_tok_s > 0, 'the server timings read');
          assert.ok(q.content_chunks >= 1 && q.content_chunks <= maxTokens);
        }
        assert.equal(e.generated_tokens, c * maxTokens);
        near(e.slowest_ms, Math.max(...e.requests.map((q) => q.total_ms)), 'slowest = the longest request');
        near(e.aggregate_tok_s, e.generated_tokens / (e.slowest_ms / 1e3), 'aggregate = tokens / slowest');
        near(e.first_token_ms_max, Math.max(...e.requests.map((q) => q.first_token_ms)), 'worst first token');
      }
    }
}

function checkPrefill(servers, lengths) {
  for (const server of servers)
    for (const n of lengths) {
      const e = r.prefill.filter((x) => x.server === server && x.prompt_tokens_asked === n);
      assert.equal(e.length, r.settings.rounds);
      for (const { request: q } of e) {
        assert.equal(q.prompt_tokens, n, `a prefill of ${n} tokens`);
        assert.ok(q.cached_tokens <= HEAD, `a cold prefill found ${q.cached_tokens} cached`);
        assert.ok(q.server_prefill_ms > 0 && q.first_token_ms >= q.server_prefill_ms * 0.5);
        assert.equal(q.completion_tokens, 1);
      }
    }
}

function checkSwitch(servers, docTokens) {
  for (const server of servers) {
    const step = (name) => {
      const e = r.switch.filter((x) => x.server === server && x.step === name);
      assert.equal(e.length, r.settings.rounds, `step ${name}`);
      assert.equal(e[0].request.completion_tokens, r.settings.switch_answer_tokens);
      return e[0].request;
    };
    const a = step('A'), a1 = step("A'"), b = step('B'), a2 = step("A''"), cold = step("A''-cold");
    assert.ok(a.prompt_tokens > docTokens && a.cached_tokens <= HEAD, 'A: the document and a question, cold');
    // A' resends A and its answer: the cache has all of A (the answer's text may tokenize anew)
    assert.ok(a1.cached_tokens >= a.prompt_tokens - 1 && a1.prompt_tokens > a.prompt_tokens, `A': ${JSON.stringify(a1)}`);
    assert.ok(b.cached_tokens <= HEAD && Math.abs(b.prompt_tokens - a.prompt_tokens) <= 2, 'B: another document, cold');
    assert.ok(a2.cached_tokens >= a1.prompt_tokens - 1, `A'' after B still finds A' cached: ${JSON.stringify(a2)}`);
    assert.ok(cold.cached_tokens <= HEAD && Math.abs(cold.prompt_tokens - a2.prompt_tokens) <= 2, "A''-cold");
    // The cached tokens above are the check; prefill times of a 120-token document on a shared
    // machine are noise, so they are only asked to be measured at all (bench/ compares them).
    assert.ok(a2.server_prefill_ms > 0 && cold.server_prefill_ms > 0, "A'' and its cold twin report a prefill time");
  }
}

const s = r.settings;
switch (which) {
  case 'one': // ember serve alone, every section
    assert.equal(r.servers.length, 1);
    assert.equal(r.servers[0].token_count_method, 'count_tokens');
    assert.equal(r.servers[0].model, 'tiny-llama');
    checkConcurrency([0], s.concurrency, s.max_tokens, s.prompt_tokens, false);
    checkPrefill([0], s.prefill);
    checkSwitch([0], s.doc_tokens);
    break;
  case 'warm':
    checkConcurrency([0], s.concurrency, s.max_tokens, s.prompt_tokens, true);
    assert.equal(r.prefill.length + r.switch.length, 0, 'only the sections asked for');
    break;
  case 'compare': { // two servers, two rounds: A B, then B A
    assert.equal(r.servers.length, 2);
    assert.notEqual(r.servers[0].url, r.servers[1].url);
    checkConcurrency([0, 1], s.concurrency, s.max_tokens, s.prompt_tokens, false);
    checkPrefill([0, 1], s.prefill);
    const order = r.concurrency.filter((e) => e.clients === s.concurrency[0]).map((e) => `${e.round}:${e.server}`);
    assert.deepEqual(order, ['0:0', '0:1', '1:1', '1:0'], 'rounds alternate which server goes first');
    break;
  }
  case 'anthropic':
    checkPrefill([0], s.prefill);
    assert.equal(r.servers[0].api, 'anthropic');
    break;
  case 'llama': { // the llama.cpp-like fake: counted by /tokenize and its template, no usage chunk
    assert.equal(r.servers[0].token_count_method, 'tokenize+template');
    assert.equal(r.servers[0].model, 'fake-llama');
    for (const e of r.concurrency) {
      assert.equal(e.generated_tokens, e.clients * s.max_tokens, 'tokens counted from the stream');
      for (const q of e.requests) {
        assert.equal(q.prompt_tokens, s.prompt_tokens, 'prompt_n + cache_n');
        assert.equal(q.completion_tokens, null);
        assert.equal(q.content_chunks, s.max_tokens);
        assert.equal(q.server_decode_tok_s, 100);
      }
    }
    for (const e of r.prefill) {
      assert.equal(e.request.prompt_tokens, e.prompt_tokens_asked);
      assert.equal(e.request.server_prefill_ms, 1.5);
      assert.equal(e.request.cached_tokens, 0);
    }
    assert.equal(r.switch.length, 5);
    break;
  }
  case 'completions': // plain-text completions on ember serve: counted by its /tokenize and the BOS beyond the text's tokens
    assert.equal(r.servers[0].api, 'completions');
    assert.equal(r.servers[0].token_count_method, 'tokenize+template');
    checkConcurrency([0], s.concurrency, s.max_tokens, s.prompt_tokens, false);
    checkPrefill([0], s.prefill);
    checkSwitch([0], s.doc_tokens);
    break;
  case 'late': // the concurrency section measured, then the server failed in the prefill section
    assert.equal(r.concurrency.length, 1);
    assert.equal(r.concurrency[0].generated_tokens, 2 * s.max_tokens);
    assert.equal(r.prefill.length + r.switch.length, 0);
    break;
  case 'usage': // no tokenizer endpoint: counted by one-token requests' usage
    assert.equal(r.servers[0].token_count_method, 'usage');
    assert.deepEqual(r.prefill.map((e) => e.request.prompt_tokens), s.prefill);
    assert.ok(r.prefill.every((e) => e.request.completion_tokens === 1));
    break;
  default:
    throw new Error(`unknown case ${which}`);
}
console.log(`results.json (${which}): ok`);
