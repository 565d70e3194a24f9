// A fake Hugging Face Hub for the pull tests (tests/cli/pull.sh): the parts of the Hub's HTTP API
// that Ember uses, served from a folder, with switches that break transfers the ways real networks do.
//
// usage: node fake_hub.mjs ROOT LOG PORT_FILE
//   ROOT/ORG/NAME/...   each folder two levels down is a repository; its files (recursively) are
//                       the repository's files; *.gguf are LFS files (sha256 and size listed)
//   ROOT/ORG/NAME/.token  when present, the repository is gated: requests need
//                       "Authorization: Bearer <its content>" (none: 401, another token: 403)
//   LOG                 one JSON line per request: method, host, url, range, authorization
//   PORT_FILE           the port, written once listening on 127.0.0.1
//
// Endpoints:
//   GET /api/models/ORG/NAME/revision/REV         {"id", "sha"}: the commit (sha1 of "ORG/NAME")
//   GET /api/models/ORG/NAME/tree/REV?recursive=1 the files, in pages of 3 with a Link header
//   GET /ORG/NAME/resolve/REV/PATH                non-LFS files directly; LFS files by a redirect
//                                                 to http://localhost:PORT/_blobs/SHA256 (another
//                                                 host name, as the Hub's CDN is)
//   GET /_blobs/SHA256                            the bytes, with Range support
//   POST /_control?drop=N&slow=MS&corrupt=0|1     the next N blob answers break off half-way;
//                                                 MS milliseconds between 64 KiB chunks; one
//                                                 byte flipped in every blob answer
import { createHash } from 'node:crypto';
import { appendFileSync, existsSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { join, relative } from 'node:path';

const [root, logPath, portFile] = process.argv.slice(2);
const modes = { drop: 0, slow: 0, corrupt: false };
const pageSize = 3;

const sha = (algorithm, ...parts) => {
  const hash = createHash(algorithm);
  for (const part of parts) hash.update(part);
  return hash.digest('hex');
};

function walk(dir, base, out) {
  for (const entry of readdirSync(dir).sort()) {
    if (entry.startsWith('.')) continue;
    const path = join(dir, entry);
    if (statSync(path).isDirectory()) {
      out.push({ type: 'directory', path: relative(base, path) });
      walk(path, base, out);
    } else {
      out.push({ type: 'file', path: relative(base, path), full: path });
    }
  }
  return out;
}

// The repository's files with what the tree API lists for them (read fresh on every request, so
// the test may change a repository while the server runs).
function repository(org, name) {
  const dir = join(root, org, name);
  if (!org || !name || org.startsWith('.') || name.startsWith('.') || !existsSync(dir)) return null;
  const files = walk(dir, dir, []).map((entry) => {
    if (entry.type !== 'file') return { ...entry, oid: sha('sha1', entry.path), size: 0 };
    const bytes = readFileSync(entry.full);
    const oid = sha('sha1', `blob ${bytes.length}\0`, bytes);
    const lfs = entry.path.endsWith('.gguf') ? { oid: sha('sha256', bytes), size: bytes.length, pointerSize: 134 } : null;
    return { ...entry, bytes, oid, size: bytes.length, lfs };
  });
  const tokenFile = join(dir, '.token');
  const token = existsSync(tokenFile) ? readFileSync(tokenFile, 'utf8').trim() : null;
  return { id: `${org}/${name}`, commit: sha('sha1', `${org}/${name}`), files, token };
}

const blobs = new Map(); // sha256 → bytes, filled as resolve requests name them

function json(res, status, body, headers = {}) {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify(body));
}

// 401 without the token, 403 with another one; true when the request may go on.
function authorized(req, res, repo) {
  if (!repo.token) return true;
  const auth = req.headers.authorization || '';
  if (auth === `Bearer ${repo.token}`) return true;
  json(res, auth ? 403 : 401, { error: auth ? 'Access to this gated repository is restricted' : 'Invalid credentials' });
  return false;
}

async function sendBlob(req, res, bytes) {
  const size = bytes.length;
  let start = 0;
  const range = /^bytes=(\d+)-$/.exec(req.headers.range || '');
  if (range) {
    start = Number(range[1]);
    if (start >= size) {
      res.writeHead(416, { 'content-range': `bytes */${size}` });
      return res.end();
    }
  }
  const headers = { 'content-length': size - start, 'accept-ranges': 'bytes', etag: `"${sha('sha256', bytes)}"` };
  if (range) headers['content-range'] = `bytes ${start}-${size - 1}/${size}`;
  res.writeHead(range ? 206 : 200, headers);
  let body = bytes.subarray(start);
  if (modes.corrupt) {
    body = Buffer.from(body);
    body[body.length >> 1] ^= 0xff;
  }
  const stopAt = modes.drop > 0 ? body.length >> 1 : body.length;
  if (modes.drop > 0) modes.drop--;
  for (let at = 0; at < stopAt; at += 65536) {
    const chunk = body.subarray(at, Math.min(at + 65536, stopAt));
    if (!res.write(chunk)) await new Promise((resolve) => res.once('drain', resolve));
    if (modes.slow) await new Promise((resolve) => setTimeout(resolve, modes.slow));
  }
  if (stopAt < body.length) {
    // Half the bytes are out: break the connection as a failing network does.
    await new Promise((resolve) => setTimeout(resolve, 50));
    return res.socket.destroy();
  }
  res.end();
}

async function handle(req, res) {
  const url = new URL(req.url, 'http://fake');
  const port = req.socket.localPort;
  appendFileSync(logPath, JSON.stringify({ method: req.method, host: req.headers.host, url: req.url,
                                           range: req.headers.range || null,
                                           authorization: req.headers.authorization || null }) + '\n');
  if (req.method === 'POST' && url.pathname === '/_control') {
    if (url.searchParams.has('drop')) modes.drop = Number(url.searchParams.get('drop'));
    if (url.searchParams.has('slow')) modes.slow = Number(url.searchParams.get('slow'));
    if (url.searchParams.has('corrupt')) modes.corrupt = url.searchParams.get('corrupt') === '1';
    return json(res, 200, modes);
  }
  if (req.method !== 'GET') return json(res, 405, { error: 'method not allowed' });
  let m;
  if ((m = /^\/_blobs\/([0-9a-f]{64})$/.exec(url.pathname))) {
    const bytes = blobs.get(m[1]);
    return bytes ? sendBlob(req, res, bytes) : json(res, 404, { error: 'no such blob' });
  }
  if ((m = /^\/api\/models\/([^/]+)\/([^/]+)\/(revision|tree)\/([^/]+)$/.exec(url.pathname))) {
    const repo = repository(decodeURIComponent(m[1]), decodeURIComponent(m[2]));
    if (!repo) return json(res, 404, { error: 'Repository not found' }, { 'x-error-code': 'RepoNotFound' });
    if (!authorized(req, res, repo)) return;
    const revision = decodeURIComponent(m[4]);
    if (revision !== 'main' && revision !== repo.commit) return json(res, 404, { error: `Revision not found: ${revision}` });
    if (m[3] === 'revision') return json(res, 200, { id: repo.id, sha: repo.commit, siblings: [] });
    const cursor = Number(url.searchParams.get('cursor') || 0);
    const page = repo.files.slice(cursor, cursor + pageSize).map(({ type, path, oid, size, lfs }) =>
      lfs ? { type, oid, size, path, lfs } : { type, oid, size, path });
    const headers = {};
    if (cursor + pageSize < repo.files.length) {
      const next = new URL(`http://${req.headers.host}${url.pathname}`);
      next.searchParams.set('recursive', 'true');
      next.searchParams.set('cursor', String(cursor + pageSize));
      headers.link = `<${next}>; rel="next"`;
    }
    return json(res, 200, page, headers);
  }
  if ((m = /^\/([^/]+)\/([^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(url.pathname))) {
    const repo = repository(decodeURIComponent(m[1]), decodeURIComponent(m[2]));
    if (!repo) return json(res, 404, { error: 'Repository not found' });
    if (!authorized(req, res, repo)) return;
    const path = decodeURIComponent(m[4]);
    const file = repo.files.find((f) => f.type === 'file' && f.path === path);
    if (!file) return json(res, 404, { error: 'Entry not found' }, { 'x-error-code': 'EntryNotFound' });
    const headers = { 'x-repo-commit': repo.commit, etag: `"${file.lfs ? file.lfs.oid : file.oid}"` };
    if (!file.lfs) {
      res.writeHead(200, { ...headers, 'content-length': file.size });
      return res.end(file.bytes);
    }
    blobs.set(file.lfs.oid, file.bytes);
    res.writeHead(302, { ...headers, 'x-linked-etag': `"${file.lfs.oid}"`, 'x-linked-size': file.size,
                         location: `http://localhost:${port}/_blobs/${file.lfs.oid}` });
    return res.end();
  }
  json(res, 404, { error: 'not found' });
}

const server = createServer((req, res) => {
  handle(req, res).catch((error) => {
    console.error(error);
    if (!res.headersSent) json(res, 500, { error: String(error) });
    else res.destroy();
  });
});
server.listen(0, '127.0.0.1', () => writeFileSync(portFile, String(server.address().port)));
