// Shared by the client tests: arguments, a tiny test runner, and helpers that know nothing about
// the model (every expectation is derived from the server's own earlier answers).
export const [baseURL, model, apiKey] = process.argv.slice(2);
if (!baseURL || !model || !apiKey) {
  console.error('usage: node SCRIPT.mjs BASE_URL MODEL API_KEY');
  process.exit(2);
}

const results = [];
let finished = false;
// A test whose promise never settles ends the script silently once nothing else is pending (exit
// code 13): say so, so that the failure has a name.
process.on('exit', (code) => {
  if (!finished) console.log(`FAIL the script ended before its tests did (exit code ${code}), after ${results.length} tests`);
});
export async function test(name, fn) {
  try {
    await fn();
    results.push([name, null]);
    console.log(`ok   ${name}`);
  } catch (err) {
    results.push([name, err]);
    console.log(`FAIL ${name}\n     ${(err && err.stack) || err}`);
  }
}

export function finish() {
  finished = true;
  const failed = results.filter(([, err]) => err);
  console.log(`${results.length - failed.length}/${results.length} passed`);
  process.exit(failed.length ? 1 : 0);
}

// A stop string taken from inside a text the server produced: generation must end right before
// its first occurrence.
export function stopFrom(text) {
  const chars = [...text];
  for (let i = 1; i + 2 <= chars.length; i++) {
    const candidate = chars.slice(i, i + 2).join('');
    if (candidate.trim().length === 2) return candidate;
  }
  return null;
}

export async function metrics() {
  const res = await fetch(`${baseURL}/metrics`);
  return res.text();
}
