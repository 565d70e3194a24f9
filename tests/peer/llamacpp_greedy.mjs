// Greedy continuations by llama.cpp (node-llama-cpp, CPU build) for GGUF models:
//   node llamacpp_greedy.mjs NODE_MODULES_DIR N "ID ID ..." MODEL.gguf...
// writes MODEL.gguf.llama.txt beside each model, one line per generated token: "ID PROB ID2 PROB2"
// (the chosen token and its softmax probability, then the runner-up and its probability, so that
// near-ties can be recognized).
import fs from "node:fs";
import path from "node:path";
import {pathToFileURL} from "node:url";

const [modulesDir, count, idsText, ...models] = process.argv.slice(2);
const {getLlama} = await import(pathToFileURL(path.join(modulesDir, "node-llama-cpp", "dist", "index.js")).href);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const prompt = idsText.trim().split(/\s+/).map(Number);
for (const modelPath of models) {
    const model = await llama.loadModel({modelPath});
    const context = await model.createContext({contextSize: 512, batchSize: 512, threads: 2});
    const sequence = context.getSequence();
    const lines = [];
    for await (const out of sequence.evaluateWithMetadata(prompt, {probabilities: true}, {temperature: 0})) {
        const [[id1, p1], [id2, p2]] = [...out.probabilities.entries()].slice(0, 2);
        if (id1 !== out.token) throw new Error(`${modelPath}: token ${out.token} is not the most likely (${id1})`);
        lines.push(`${id1} ${p1} ${id2} ${p2}`);
        if (lines.length >= Number(count)) break;
    }
    fs.writeFileSync(`${modelPath}.llama.txt`, lines.join("\n") + "\n");
    await context.dispose();
    await model.dispose();
}
await llama.dispose();
