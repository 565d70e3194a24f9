// Tokenization throughput of node-llama-cpp (llama.cpp's tokenizer, CPU build), the peer of
// tokenizer_bench.c:  node tokenizer_node.mjs PREFIX MODEL.gguf TEXT_FILE RUNS
// PREFIX is the folder node-llama-cpp 3.21.1 was installed into. Prints the same line format:
// "tokens N median_s S mb_per_s R" (load time excluded; no BOS/EOS, special text not parsed).
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [prefix, modelPath, textPath, runsArg] = process.argv.slice(2);
const { getLlama, LlamaLogLevel } = await import(
  pathToFileURL(path.join(path.resolve(prefix), 'node_modules', 'node-llama-cpp', 'dist', 'index.js')).href);
const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath, vocabOnly: true });
const text = fs.readFileSync(textPath, 'utf8');
const bytes = Buffer.byteLength(text, 'utf8');
const runs = Number(runsArg) || 3;
const times = [];
let tokens = 0;
for (let r = 0; r < runs; r++) {
  const start = process.hrtime.bigint();
  tokens = model.tokenize(text, false).length;
  times.push(Number(process.hrtime.bigint() - start) / 1e9);
}
times.sort((a, b) => a - b);
const median = times[Math.floor(runs / 2)];
console.log(`tokens ${tokens} median_s ${median.toFixed(4)} mb_per_s ${(bytes / 1e6 / median).toFixed(3)}`);
await model.dispose();
await llama.dispose();
