// A recording proxy between Codex CLI and ember serve, for tests/js/codex_exec.sh:
//   node codex_proxy.mjs UPSTREAM_URL LOG_FILE PORT_FILE [FORCE_TOOL FORCED_ARGUMENTS_JSON]
// Every request goes on to UPSTREAM_URL unchanged and its answer comes back unchanged, streamed;
// each request is logged to LOG_FILE as one JSON line ({method, url, body, status}). It listens on
// a free port, written to PORT_FILE once it is ready.
//
// With FORCE_TOOL, a request that starts a turn (its last input item is the user's message) is
// changed the way a client that wants a tool called would send it: tool_choice names FORCE_TOOL,
// and that tool's parameters become a schema with FORCED_ARGUMENTS_JSON as its only value, so that
// the project's small model, which never chooses a tool by itself, calls it with known arguments
// (ember serve's constrained decoding does the rest). Requests that carry a tool's result are left
// as Codex sent them (tool_choice auto), so the turn can end.
import http from 'node:http';
import fs from 'node:fs';

const [upstream, logFile, portFile, forceTool, forcedArguments] = process.argv.slice(2);
if (!upstream || !logFile || !portFile) {
  console.error('usage: node codex_proxy.mjs UPSTREAM_URL LOG_FILE PORT_FILE [FORCE_TOOL FORCED_ARGUMENTS_JSON]');
  process.exit(2);
}

// A JSON schema whose only value is `value` (objects property by property, so that a schema-less
// `const` is not needed; strings and other scalars as one-value enums).
function schemaOf(value) {
  if (Array.isArray(value)) {
    return { type: 'array', prefixItems: value.map(schemaOf), items: false, minItems: value.length, maxItems: value.length };
  }
  if (value && typeof value === 'object') {
    const properties = Object.fromEntries(Object.entries(value).map(([k, v]) => [k, schemaOf(v)]));
    return { type: 'object', properties, required: Object.keys(value), additionalProperties: false };
  }
  return { enum: [value] };
}

function force(body) {
  const input = Array.isArray(body.input) ? body.input : [];
  const last = input.at(-1);
  const startsTurn = last && (last.type === undefined || last.type === 'message') && last.role === 'user';
  const tool = (body.tools || []).find((t) => t.type === 'function' && t.name === forceTool);
  if (!startsTurn || !tool) return body;
  tool.parameters = schemaOf(JSON.parse(forcedArguments));
  return { ...body, tool_choice: { type: 'function', name: forceTool } };
}

const server = http.createServer(async (req, res) => {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  let body = Buffer.concat(chunks).toString();
  const entry = { method: req.method, url: req.url, body: null, status: 0 };
  try {
    if (body) {
      entry.body = JSON.parse(body);
      if (forceTool && req.url.endsWith('/responses')) {
        entry.body = force(entry.body);
        body = JSON.stringify(entry.body);
      }
    }
  } catch {
    entry.body = body; // not JSON: passed on as it is, for the server to refuse
  }
  const headers = { ...req.headers };
  delete headers.host;
  delete headers['content-length'];
  delete headers['accept-encoding'];
  try {
    const up = await fetch(upstream + req.url, { method: req.method, headers, body: body || undefined });
    entry.status = up.status;
    fs.appendFileSync(logFile, JSON.stringify(entry) + '\n');
    const out = Object.fromEntries([...up.headers].filter(([k]) => !['content-length', 'transfer-encoding', 'connection'].includes(k)));
    res.writeHead(up.status, out);
    if (up.body) for await (const chunk of up.body) res.write(chunk);
    res.end();
  } catch (err) {
    entry.status = 502;
    fs.appendFileSync(logFile, JSON.stringify({ ...entry, error: String(err) }) + '\n');
    res.writeHead(502, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: `proxy: ${err}` } }));
  }
});
server.listen(0, '127.0.0.1', () => fs.writeFileSync(portFile, String(server.address().port)));
