// ember serve's /tokenize and /detokenize against llama.cpp's own tokenizer (node-llama-cpp, the same
// GGUF file): every text of the tokenizer corpus (corpus.txt) and texts holding the chat template's
// control tokens must give llama.cpp's ids with control-token text parsed (llama.cpp's server's
// default) and not, with BOS added as the vocabulary asks under add_special; each id's piece must be
// llama.cpp's piece of it; and the ids must detokenize as llama.cpp's server does it, into their
// pieces one after the other.
//   node tokenize_peer.mjs BASE_URL API_KEY MODEL.gguf NODE_MODULES_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [baseURL, apiKey, modelPath, modulesDir] = process.argv.slice(2);
const { getLlama } = await import(pathToFileURL(path.join(modulesDir, 'node-llama-cpp', 'dist', 'index.js')).href);
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' });
const model = await llama.loadModel({ modelPath });

async function post(route, body) {
  const res = await fetch(`${baseURL}${route}`, { method: 'POST', body: JSON.stringify(body),
    headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKey}` } });
  assert.equal(res.status, 200, `${route}: ${await res.clone().text()}`);
  return res.json();
}

const here = path.dirname(new URL(import.meta.url).pathname);
const texts = fs.readFileSync(path.join(here, 'corpus.txt'), 'utf8').split('\n__ggml_vocab_test__\n').filter((t) => t.length);
texts.push('<|im_start|>user\nWhat is a river?<|im_end|>\n<|im_start|>assistant\n', ' leading space', 'trailing space ', '');
let failures = 0, checked = 0;
for (const text of texts) {
  try {
    for (const parseSpecial of [true, false]) {
      const want = Array.from(model.tokenize(text, parseSpecial));
      const { tokens } = await post('/tokenize', { content: text, parse_special: parseSpecial });
      assert.deepEqual(tokens, want, `ids of ${JSON.stringify(text)} (parse_special ${parseSpecial})`);
      const withBos = (await post('/tokenize', { content: text, add_special: true, parse_special: parseSpecial })).tokens;
      const bos = model.tokens.bos;
      assert.deepEqual(withBos, model.tokens.shouldPrependBosToken && bos != null ? [bos, ...want] : want,
        `add_special ids of ${JSON.stringify(text)}`);
    }
    // pieces: llama.cpp's text of each id alone; one that is not whole UTF-8 comes as its bytes, which
    // decode as llama.cpp's text of it does (U+FFFD for the partial character)
    const pieces = (await post('/tokenize', { content: text, with_pieces: true })).tokens;
    assert.deepEqual(pieces.map((p) => p.id), Array.from(model.tokenize(text, true)));
    const bytesOf = new Map();
    for (const { id, piece } of pieces) {
      const wantPiece = model.detokenize([id], true, [id]);
      if (typeof piece === 'string') assert.equal(piece, wantPiece, `piece of ${id} in ${JSON.stringify(text)}`);
      else assert.equal(Buffer.from(piece).toString('utf8'), wantPiece, `bytes of ${id} in ${JSON.stringify(text)}`);
      bytesOf.set(id, Buffer.from(piece));
    }
    // llama.cpp's server's /detokenize is the pieces one after the other (no clean-up of spaces)
    const ids = pieces.map((p) => p.id);
    const { content } = await post('/detokenize', { tokens: ids });
    assert.equal(content, Buffer.concat(ids.map((id) => bytesOf.get(id))).toString('utf8'), `text of ${JSON.stringify(text)}'s ids`);
    checked++;
  } catch (err) {
    failures++;
    console.log(`FAIL ${err.message}`);
  }
}
console.log(`${checked}/${texts.length} texts as llama.cpp tokenizes them`);
await model.dispose();
process.exit(failures || checked < 40 ? 1 : 0);
