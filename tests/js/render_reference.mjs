// Renders chat templates with @huggingface/jinja, the reference renderer, for the comparison test
// tests/cli/chat_template_reference.sh. Usage:
//   node render_reference.mjs NODE_MODULES_DIR CASES.json OUT_DIR FIXTURES_DIR [UNPACKED_DIR]
// CASES.json: {"templates": {name: {"file": path} | {"package": npm name} | {"gguf": path under FIXTURES_DIR}},
// A GGUF kept xz-compressed in FIXTURES_DIR (PATH.xz) is read where the build unpacked it, UNPACKED_DIR.
//              "conversations": {name: {"messages": [...], "tools"?: [...], "bos_token"?, "eos_token"?,
//                                       "add_generation_prompt"?: bool, "vars"?: {...}}},
//              "pairs": [[template, conversation], ...]}
// For each pair it writes OUT_DIR/<template>__<conversation>/ with template.jinja, messages.json,
// tools.json (when given), args (one ember argument per line) and expected.txt — or expected.err
// when the reference throws. Dates: strftime_now sees SOURCE_DATE_EPOCH (the test sets TZ=UTC).
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [modulesDir, casesPath, outDir, fixturesDir, unpackedDir] = process.argv.slice(2);
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
// The few GGUF metadata values a template needs, read straight from the file (independently of
// Ember's reader): tokenizer.chat_template and the bos/eos token texts.
function readGguf(file) {
  const buf = fs.readFileSync(file);
  let off = 0;
  const u32 = () => { const v = buf.readUInt32LE(off); off += 4; return v; };
  const u64 = () => { const v = Number(buf.readBigUInt64LE(off)); off += 8; return v; };
  const str = () => { const n = u64(); const s = buf.toString("utf8", off, off + n); off += n; return s; };
  const sizes = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
  const value = (type) => {
    if (type === 8) return str();
    if (type === 9) {
      const t = u32(), n = u64();
      if (t === 8) { const a = []; for (let i = 0; i < n; i++) a.push(str()); return a; }
      off += sizes[t] * n;
      return null;
    }
    const v = type === 4 ? buf.readUInt32LE(off) : type === 5 ? buf.readInt32LE(off) : null;
    off += sizes[type];
    return v;
  };
  if (buf.toString("latin1", 0, 4) !== "GGUF") throw new Error(`${file}: not GGUF`);
  off = 4;
  u32();
  u64();
  const nkv = u64(), kv = {};
  for (let i = 0; i < nkv; i++) { const k = str(); kv[k] = value(u32()); }
  const tokens = kv["tokenizer.ggml.tokens"];
  return {
    template: kv["tokenizer.chat_template"],
    bos: kv["tokenizer.ggml.bos_token_id"] != null ? tokens[kv["tokenizer.ggml.bos_token_id"]] : undefined,
    eos: kv["tokenizer.ggml.eos_token_id"] != null ? tokens[kv["tokenizer.ggml.eos_token_id"]] : undefined,
  };
}

const sources = {}, ggufs = {}, referenceSources = {};
for (const [name, spec] of Object.entries(cases.templates)) {
  if (spec.gguf) {
    const packed = fs.existsSync(path.resolve(fixturesDir, spec.gguf + ".xz"));
    if (packed && !unpackedDir) throw new Error(`${spec.gguf} is compressed: name the unpacked fixtures' folder`);
    const file = path.resolve(packed ? unpackedDir : fixturesDir, spec.gguf);
    ggufs[name] = { file, ...readGguf(file) };
    sources[name] = ggufs[name].template;
  } else if (spec.file) {
    sources[name] = fs.readFileSync(path.resolve(casesDir, spec.file), "utf8");
    // The reference rejects backslash-newline inside string literals, which Jinja defines as a line
    // continuation; for such templates it renders the text with the continuations joined.
    if (spec.reference_joins_continuations) referenceSources[name] = sources[name].replace(/\\\r?\n/g, "");
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
  const gguf = ggufs[tname];
  const args = gguf ? ["-m", gguf.file] : ["--template", "template.jinja"];
  args.push("--messages", "messages.json");
  const context = { messages: conv.messages };
  if (gguf && gguf.bos !== undefined) context.bos_token = gguf.bos;
  if (gguf && gguf.eos !== undefined) context.eos_token = gguf.eos;
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
    const text = new Template(referenceSources[tname] ?? sources[tname]).render(context);
    fs.writeFileSync(path.join(dir, "expected.txt"), text);
    rendered++;
  } catch (e) {
    fs.writeFileSync(path.join(dir, "expected.err"), String(e && e.message) + "\n");
    failed++;
  }
}
console.log(`reference: ${rendered} rendered, ${failed} rejected by the reference`);
