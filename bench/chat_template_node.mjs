// The reference side of bench/chat_template.sh: @huggingface/jinja rendering the same messages with
// the same templates. Usage: node chat_template_node.mjs NODE_MODULES MESSAGES.json ITERATIONS TEMPLATE...
// Prints, per template: name, parse time (us), mean render time (us), output bytes.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [modules, messagesPath, iterArg, ...templates] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "x.js"));
const { Template } = await import(require.resolve("@huggingface/jinja"));
const messages = JSON.parse(fs.readFileSync(messagesPath, "utf8"));
const iterations = Number(iterArg);
for (const file of templates) {
  const src = fs.readFileSync(file, "utf8");
  let t0 = process.hrtime.bigint();
  const tpl = new Template(src);
  const parseUs = Number(process.hrtime.bigint() - t0) / 1e3;
  let out = "";
  for (let i = 0; i < 50; i++) out = tpl.render({ messages, bos_token: "<s>", eos_token: "</s>", add_generation_prompt: true });
  t0 = process.hrtime.bigint();
  for (let i = 0; i < iterations; i++) out = tpl.render({ messages, bos_token: "<s>", eos_token: "</s>", add_generation_prompt: true });
  const renderUs = Number(process.hrtime.bigint() - t0) / 1e3 / iterations;
  console.log(`${path.basename(file)} ${parseUs.toFixed(1)} ${renderUs.toFixed(1)} ${Buffer.byteLength(out)}`);
}
