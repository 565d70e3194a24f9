// Greedy continuation by llama.cpp (node-llama-cpp, CPU build, f32 KV cache) for a GGUF model:
//   node llamacpp_greedy.mjs NODE_MODULES_DIR MODEL.gguf N "ID ID ..."
// prints one line per generated token: "ID PROB" (PROB: the token's softmax probability).
import path from "node:path";
import {pathToFileURL} from "node:url";

const [modulesDir, modelPath, count, idsText] = process.argv.slice(2);
const {getLlama} = await import(pathToFileURL(path.join(modulesDir, "node-llama-cpp", "dist", "index.js")).href);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({
    contextSize: 512,
    batchSize: 512,
    threads: 2,
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32",
});
const sequence = context.getSequence();
const prompt = idsText.trim().split(/\s+/).map(Number);
const lines = [];
for await (const out of sequence.evaluateWithMetadata(prompt, {confidence: true}, {temperature: 0})) {
    lines.push(`${out.token} ${out.confidence}`);
    if (lines.length >= Number(count)) break;
}
console.log(lines.join("\n"));
await context.dispose();
await model.dispose();
await llama.dispose();
