// Differential check of `ember chat-template` against @huggingface/jinja: generates random
// templates from a grammar of the expressions and statements chat templates use (seeded, so a
// run is reproducible), renders each with both, and reports every case where the outputs differ
// or only one of them fails. Usage:
//   node differential.mjs NODE_MODULES_DIR EMBER WORK_DIR [COUNT] [SEED]
import { createRequire } from "node:module";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

const [modulesDir, ember, workDir, countArg, seedArg] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modulesDir), "x.js"));
const { Template } = await import(require.resolve("@huggingface/jinja"));
const count = Number(countArg ?? 300);
let seed = Number(seedArg ?? 1) >>> 0;
const rand = () => ((seed = (seed * 1664525 + 1013904223) >>> 0) / 4294967296);
const pick = (a) => a[Math.floor(rand() * a.length)];

const context = {
  messages: [
    { role: "system", content: "Sys  prompt " },
    { role: "user", content: "Hello, World! é😀" },
    { role: "assistant", content: "<think>\nwhy\n</think>\n\nAnswer", tool_calls: [{ type: "function", function: { name: "f", arguments: { a: 1, b: [1.5, true, null] } } }] },
    { role: "tool", content: "42" },
  ],
  s: "  Mixed Case, words-and_more  ", e: "", n: 7, m: -3, f: 2.5, z: 0, t: true, b: false, nul: null,
  l: [3, 1, 2], ls: ["b", "a", "c", "a"], d: { k: "v", n: 1, "2": "two" }, nested: { a: { b: [1, { c: "deep" }] } },
};
fs.mkdirSync(workDir, { recursive: true });
fs.writeFileSync(path.join(workDir, "messages.json"), JSON.stringify(context.messages));
const vars = Object.entries(context).filter(([k]) => k !== "messages");
const prelude = "{%- set ns = namespace(k='v', n=2) -%}";

const atoms = ["s", "e", "n", "m", "f", "z", "t", "b", "nul", "l", "ls", "d", "nested", "messages", "undefined_var",
  "messages[0]", "messages[1].content", "messages[-1]", "messages[2].tool_calls[0].function", "d.k", "d['n']", "nested.a.b[1].c",
  "'str'", "\"dq\"", "''", "1", "0", "-2", "3.0", "0.5", "true", "false", "none", "[1, 2]", "['x', 'y']", "{'a': 1}", "[]", "{}",
  "'é😀ß ǅ'", "'a\\nb\\t\\\"q\\\''", "'\\u00e9\\x41'", "1.25", "-0.0", "(1, 'two')", "{'b': [1, {'c': none}], 'a': 'x'}", "ns", "loop"];
const filters = ["trim", "upper", "lower", "title", "capitalize", "length", "first", "last", "list", "string", "int", "float",
  "tojson", "tojson(indent=2)", "join", "join(', ')", "unique", "reverse", "sort", "items", "default('D')", "default('D', true)",
  "indent(2)", "replace('a', 'X')", "abs", "selectattr('role', 'equalto', 'user') | list", "map(attribute='role') | list",
  "rejectattr('content') | list", "dictsort", "safe", "bool", "keys", "tojson(indent=2, sort_keys=true)", "tojson(ensure_ascii=true)",
  "indent(3, first=true)", "indent(width=2, blank=true)", "int(5)", "float('x')", "replace('s', 'S', 1)", "default(none)",
  "sort(attribute='role') | map(attribute='role') | join", "sort(reverse=true)", "join(',') | length", "string | length",
  "selectattr('tool_calls') | list | length", "map(attribute='content', default='-') | list", "dictsort(by='value')", "items | list"];
const tests = ["defined", "undefined", "none", "string", "number", "integer", "mapping", "iterable", "sequence", "boolean",
  "true", "false", "odd", "even", "lower", "upper", "callable"];
const methods = ["upper()", "lower()", "strip()", "lstrip()", "rstrip()", "title()", "split()", "split(',')", "split(' ', 1)",
  "startswith('Mi')", "endswith(' ')", "replace(' ', '_')", "get('k')", "get('x', 'dflt')", "items()", "keys()", "values()", "length",
  "split(none, 1)", "startswith(('x', '  M'))", "replace('', '.')", "replace('e', 'E', count=1)", "split('a', 1)", "capitalize()"];
const binops = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "and", "or", "in", "not in", "**"];

function expr(depth) {
  if (depth <= 0) return pick(atoms);
  switch (Math.floor(rand() * 9)) {
    case 0: return `${expr(depth - 1)} | ${pick(filters)}`;
    case 1: return `${expr(depth - 1)} is ${rand() < 0.3 ? "not " : ""}${pick(tests)}`;
    case 2: return `${pick(atoms)}.${pick(methods)}`;
    case 3: return `(${expr(depth - 1)} ${pick(binops)} ${expr(depth - 1)})`;
    case 4: return `(${expr(depth - 1)} if ${expr(depth - 1)} else ${expr(depth - 1)})`;
    case 5: return `not ${expr(depth - 1)}`;
    case 6: return `${pick(["s", "ls", "l", "messages", "'abcdef'"])}[${pick(["1:", ":2", "::-1", "-2:", "1:3", "::2", "0", "-1"])}]`;
    case 7: return `[${expr(depth - 1)}, ${expr(depth - 1)}] | ${pick(["length", "tojson", "join('-')", "first", "last"])}`;
    default: return pick(atoms);
  }
}

function statement(depth) {
  const r = rand();
  if (depth <= 0 || r < 0.45) return `{{ ${expr(2)} }}|`;
  if (r < 0.6) return `{% if ${expr(1)} %}${statement(depth - 1)}{% elif ${expr(1)} %}${statement(depth - 1)}{% else %}${statement(depth - 1)}{% endif %}`;
  if (r < 0.75) {
    const it = pick(["messages", "l", "ls", "d", "d.items()", "range(3)", "s.split()", "[]", "messages if false"]);
    const v = it === "d.items()" ? "k, v" : "x";
    const filt = rand() < 0.3 ? ` if ${pick(["loop is defined", "x", "true", "x != 1"])}` : "";
    return `{% for ${v} in ${it}${filt} %}${pick(["{{ loop.index }}", "{{ loop.revindex0 }}{{ loop.last }}", "{{ " + v.split(",")[0] + " }}", "{% if loop.first %}{% continue %}{% endif %}{{ loop.index0 }}", "{% break %}"])}${statement(depth - 1)}{% else %}E{% endfor %}`;
  }
  if (r < 0.85) return `{% set q = ${expr(2)} %}{{ q }}|`;
  if (r < 0.92) return `{%- set ns = namespace(c=0) %}{% for x in l %}{% set ns.c = ns.c + x %}{% endfor %}{{ ns.c }} -%}`.replace(" -%}", "");
  if (r < 0.95) return `{% macro mm(a, b='B') %}[{{ a }}{{ b }}{{ varargs | length }}]{% endmacro %}{{ mm(${expr(1)}) }}{{ mm(1, b=${expr(1)}) }}{{ mm(1, 2, 3) }}`;
  if (r < 0.97) return `{% macro w(x) %}<{{ caller(x) }}>{% endmacro %}{% call(v) w(${expr(1)}) %}{{ v }}|{{ ${expr(1)} }}{% endcall %}`;
  if (r < 0.985) return `{% filter ${pick(["upper", "trim", "lower", "title"])} %} ${statement(depth - 1)} {% endfilter %}`;
  return `{% for a in [1, 2] %}{% for b in ls %}{{ loop.index }}{{ a }}{% if loop.last %}{{ b }}{% endif %}{% endfor %}{{ loop.index }}{% endfor %}`;
}

// Whitespace control and surrounding text, the part of the language where renderers differ most.
function whitespace(tpl) {
  const texts = ["", "", " ", "\n", "  \n  ", "\t", "\n\n", " word ", "\r\n", "-}\n", "%}\n"];
  return tpl
    .replace(/\{%/g, () => pick(["{%", "{%", "{%-"]) )
    .replace(/%\}/g, () => pick(["%}", "%}", "-%}"]) + pick(texts))
    .replace(/\{\{/g, () => pick(texts) + pick(["{{", "{{", "{{-"]))
    .replace(/\}\}/g, () => pick(["}}", "}}", "-}}"]) + pick(texts))
    .replace(/\|$/, () => pick(["|", "{# c #}", "{#- c -#}", "\n{# c #}\n"]));
}

let same = 0, bothFail = 0;
const diffs = [];
for (let i = 0; i < count; i++) {
  let tpl = "";
  const nstmt = 1 + Math.floor(rand() * 2);
  for (let k = 0; k < nstmt; k++) tpl += statement(2) + pick(["", "\n", "  \n", " ", "\n    "]);
  tpl = (rand() < 0.5 ? prelude : "") + whitespace(tpl);
  let want, wantErr = null;
  try { want = new Template(tpl).render({ ...context, add_generation_prompt: false }); } catch (e) { wantErr = String(e.message); }
  const tplPath = path.join(workDir, "t.jinja");
  fs.writeFileSync(tplPath, tpl);
  const args = ["chat-template", "--template", tplPath, "--messages", path.join(workDir, "messages.json")];
  for (const [k, v] of vars) args.push("--var", `${k}=${JSON.stringify(v)}`);
  let got, gotErr = null;
  try { got = execFileSync(ember, args, { stdio: ["ignore", "pipe", "pipe"] }).toString("utf8"); }
  catch (e) { gotErr = e.stderr ? e.stderr.toString() : String(e); }
  // A crash or a sanitizer report is never an acceptable way to reject a template.
  if (gotErr !== null && !/^ember chat-template: /.test(gotErr) || /Sanitizer|runtime error/.test(gotErr ?? "")) {
    diffs.push({ tpl, want: wantErr ?? want, got: `CRASH ${gotErr}` });
    continue;
  }
  if (wantErr !== null && gotErr !== null) bothFail++;
  else if (wantErr === null && gotErr === null && want === got) same++;
  else diffs.push({ tpl, want: wantErr !== null ? `ERROR ${wantErr}` : want, got: gotErr !== null ? `ERROR ${gotErr.trim()}` : got });
}
for (const d of diffs.slice(0, 15))
  console.log(`DIFF template: ${JSON.stringify(d.tpl)}\n  reference: ${JSON.stringify(d.want).slice(0, 400)}\n  ember:     ${JSON.stringify(d.got).slice(0, 400)}`);
console.log(`differential: ${count} random templates: ${same} identical, ${bothFail} rejected by both, ${diffs.length} differ`);
process.exit(diffs.length ? 1 : 0);
