// Embeddings of ember serve against llama.cpp's (node-llama-cpp, CPU build) on the same GGUF:
//   node llamacpp_embed.mjs NODE_MODULES_DIR BASE_URL MIN_COSINE MODEL.gguf TEXT...
// Each text is tokenized once by the server's /tokenize (add_special, as an embedding request does)
// and the same ids go to both: ember's /v1/embeddings (token-id input, all texts in one request) and
// llama.cpp's LlamaEmbeddingContext.getEmbeddingFor, which pools as the file's <arch>.pooling_type
// says (the last token's state where it names none). Prints the cosine of each pair and fails below
// MIN_COSINE.
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [modulesDir, baseURL, minCosine, modelPath, ...texts] = process.argv.slice(2);
const { getLlama, LlamaEmbeddingContext } = await import(pathToFileURL(path.join(modulesDir, 'node-llama-cpp', 'dist', 'index.js')).href);
const post = async (route, body) => {
  const res = await fetch(`${baseURL}${route}`, { method: 'POST', body: JSON.stringify(body) });
  const json = await res.json();
  if (res.status !== 200) throw new Error(`${route}: ${res.status} ${JSON.stringify(json)}`);
  return json;
};
const ids = [];
for (const content of texts) ids.push((await post('/tokenize', { content, add_special: true })).tokens);
const ember = (await post('/v1/embeddings', { input: ids, encoding_format: 'float' })).data.map((d) => d.embedding);

const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' });
const model = await llama.loadModel({ modelPath });
// createEmbeddingContext's own context, but with an f32 KV cache and no flash attention: as close to
// ember's f32 reference path as llama.cpp gets (its default f16 cache alone moves a Q4_K model's
// vectors by about 1e-3 in cosine)
const context = new LlamaEmbeddingContext({
  _llamaContext: await model.createContext({
    contextSize: 512, batchSize: 512, threads: 2, flashAttention: false, _embeddings: true,
    experimentalKvCacheKeyType: 'F32', experimentalKvCacheValueType: 'F32',
  }),
});
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
let status = 0;
for (let i = 0; i < ids.length; i++) {
  const theirs = (await context.getEmbeddingFor(ids[i].slice())).vector;
  const ours = ember[i];
  if (theirs.length !== ours.length) throw new Error(`${modelPath}: ${theirs.length} numbers against ember's ${ours.length}`);
  const cos = ours.reduce((s, x, k) => s + x * theirs[k], 0) / (norm(ours) * norm(theirs));
  const ok = cos >= Number(minCosine);
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${path.basename(modelPath)} input ${i} (${ids[i].length} tokens): cosine ${cos.toFixed(7)}`);
  if (!ok) status = 1;
}
await context.dispose();
await model.dispose();
await llama.dispose();
process.exit(status);
