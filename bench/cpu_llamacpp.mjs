// llama.cpp's side of bench/cpu.sh: node-llama-cpp (CPU build, its default context settings) loads
// a GGUF, evaluates a prompt of token ids and generates greedily, and prints its own timings in the
// words `ember run` uses, so that the script reads both alike:
//   node cpu_llamacpp.mjs NODE_MODULES_DIR MODEL.gguf THREADS GENERATE "ID ID ..."
//   -> "prefill: MS ms (TOK/S tok/s)" and "decode: N tokens, TOK/S tok/s"
// The prefill time is the prompt's evaluation up to the first generated token; decode counts the
// tokens after it, as ember does. LLAMA_MMAP=0 in the environment loads the weights into memory
// (node-llama-cpp's useMmap: false, llama.cpp's --no-mmap) instead of llama.cpp's default mapping.
import path from "node:path";
import {pathToFileURL} from "node:url";

const [modulesDir, modelPath, threads, generate, idsText] = process.argv.slice(2);
const {getLlama} = await import(pathToFileURL(path.join(modulesDir, "node-llama-cpp", "dist", "index.js")).href);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const prompt = idsText.trim().split(/\s+/).map(Number);
const model = await llama.loadModel({modelPath, ...(process.env.LLAMA_MMAP === "0" ? {useMmap: false} : {})});
const context = await model.createContext({contextSize: prompt.length + Number(generate) + 16, threads: Number(threads)});
const sequence = context.getSequence();
const start = performance.now();
let first = 0, count = 0;
for await (const token of sequence.evaluate(prompt, {temperature: 0})) {
    void token;
    count++;
    if (count === 1) first = performance.now();
    if (count >= Number(generate)) break;
}
const end = performance.now();
const prefillMs = first - start;
console.log(`prefill: ${prefillMs.toFixed(1)} ms (${(prompt.length / (prefillMs / 1000)).toFixed(1)} tok/s)`);
if (count > 1) console.log(`decode: ${count - 1} tokens, ${((count - 1) / ((end - first) / 1000)).toFixed(1)} tok/s`);
await context.dispose();
await model.dispose();
await llama.dispose();
