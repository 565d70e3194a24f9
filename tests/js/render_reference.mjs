// Renders chat templates with @huggingface/jinja, the reference renderer, for the comparison test
// tests/cli/chat_template_reference.sh. Usage:
//   node render_reference.mjs NODE_MODULES_DIR CASES.json OUT_DIR
// CASES.json: {"templates": {name: {"file": path} | {"package": npm name}},
//              "conversations": {name: {"messages": [...], "tools"?: [...], "bos_token"?, "eos_token"?,
//                                       "add_generation_prompt"?: bool, "vars"?: {...}}},
//              "pairs": [[template, conversation], ...]}
// For each pair it writes OUT_DIR/<template>__<conversation>/ with template.jinja, messages.json,
// tools.json (when given), args (one ember argument per line) and expected.txt — or expected.err
// when the reference throws. Dates: strftime_now sees SOURCE_DATE_EPOCH (the test sets TZ=UTC).
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [modulesDir, casesPath, outDir] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modulesDir), "x.js"));
const { Template } = await import(require.resolve("@huggingface/jinja"));

const epoch = process.env.SOURCE_DATE_EPOCH;
if (epoch) {
  const RealDate = Date;
  globalThis.Date = class extends RealDate {
    constructor(...args) {
      if (args.length === 0) super(Number(epoch) * 1000);
      else super(...args);
    }
  };
}

const cases = JSON.parse(fs.readFileSync(casesPath, "utf8"));
const casesDir = path.dirname(path.resolve(casesPath));
const sources = {};
for (const [name, spec] of Object.entries(cases.templates)) {
  if (spec.file) {
    sources[name] = fs.readFileSync(path.resolve(casesDir, spec.file), "utf8");
  } else {
    const config = require(`${spec.package}/models/tokenizer_config.json`);
    if (typeof config.chat_template !== "string") throw new Error(`${spec.package} has no chat_template`);
    sources[name] = config.chat_template;
  }
}

let rendered = 0, failed = 0;
for (const [tname, cname] of cases.pairs) {
  const conv = cases.conversations[cname];
  if (!conv || sources[tname] === undefined) throw new Error(`unknown pair ${tname} ${cname}`);
  const dir = path.join(outDir, `${tname}__${cname}`);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "template.jinja"), sources[tname]);
  fs.writeFileSync(path.join(dir, "messages.json"), JSON.stringify(conv.messages));
  const args = ["--template", "template.jinja", "--messages", "messages.json"];
  const context = { messages: conv.messages };
  if (conv.tools) {
    fs.writeFileSync(path.join(dir, "tools.json"), JSON.stringify(conv.tools));
    args.push("--tools", "tools.json");
    context.tools = conv.tools;
  }
  if (conv.bos_token !== undefined) {
    args.push("--bos-token", conv.bos_token);
    context.bos_token = conv.bos_token;
  }
  if (conv.eos_token !== undefined) {
    args.push("--eos-token", conv.eos_token);
    context.eos_token = conv.eos_token;
  }
  context.add_generation_prompt = !!conv.add_generation_prompt;
  if (conv.add_generation_prompt) args.push("--add-generation-prompt");
  for (const [k, v] of Object.entries(conv.vars ?? {})) {
    args.push("--var", `${k}=${JSON.stringify(v)}`);
    context[k] = v;
  }
  fs.writeFileSync(path.join(dir, "args"), args.join("\n") + "\n");
  try {
    const text = new Template(sources[tname]).render(context);
    fs.writeFileSync(path.join(dir, "expected.txt"), text);
    rendered++;
  } catch (e) {
    fs.writeFileSync(path.join(dir, "expected.err"), String(e && e.message) + "\n");
    failed++;
  }
}
console.log(`reference: ${rendered} rendered, ${failed} rejected by the reference`);
