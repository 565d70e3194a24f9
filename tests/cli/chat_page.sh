#!/usr/bin/env bash
# The chat page at GET / in a real browser: playwright-core (pinned, installed by npm into an ignored
# build folder) drives Debian's chromium (tools/deps.sh installs it) against a real `ember serve`
# on a synthetic tiny model; tests/web/chat_page.mjs says what is checked.
# usage: chat_page.sh EMBER_EXE FIXTURES_DIR BUILD_DIR
set -u
ember=$1 fixtures=$2 build=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$build/js-web
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
[ -x /usr/bin/chromium ] || fail "/usr/bin/chromium is missing (tools/deps.sh installs Debian's chromium)"
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed (tools/deps.sh installs them)"
version=1.65.1
if ! grep -qs "\"version\": \"$version\"" "$work/node_modules/playwright-core/package.json"; then
  npm install --prefix "$work" --no-audit --no-fund --no-save --loglevel=error "playwright-core@$version" \
    >"$work/npm.log" 2>&1 || fail "npm install playwright-core@$version: $(tail -20 "$work/npm.log")"
fi
cp "$here/../web/chat_page.mjs" "$work/"
cp "$here/../../web/markdown.js" "$work/markdown.mjs"

model=$work/tiny-llama.gguf
[ -s "$model" ] || "$ember" synth --preset tiny-llama --type f32 --vocab "$fixtures/vocab/ggml-vocab-llama-spm.gguf" \
  -o "$model" >"$work/synth.log" 2>&1 || fail "ember synth: $(tail -5 "$work/synth.log")"

# The page itself: every file from the binary, with the same-origin policy; no key needed for it.
. "$here/../../tools/serve_lib.sh"
log=$work/serve.log
start_server "$log" "$ember" serve -m "$model" --port 0 --api-key sk-page --ctx 8192 --kv-sequences 2 --device cpu ||
  fail "ember serve did not start"
status=0
head=$(curl -s -D - -o "$work/index.html" "$url/")
grep -q "^Content-Type: text/html" <<<"$head" || { echo "FAIL: GET / headers: $head"; status=1; }
grep -q "^Content-Security-Policy: default-src 'self'" <<<"$head" || { echo "FAIL: GET / has no CSP: $head"; status=1; }
cmp -s "$work/index.html" "$here/../../web/index.html" || { echo "FAIL: GET / is not web/index.html"; status=1; }
for f in chat.js chat.css markdown.js; do
  curl -s "$url/$f" | cmp -s - "$here/../../web/$f" || { echo "FAIL: GET /$f is not web/$f"; status=1; }
done
# a path that is no file of the page: without the key it is a 401 like any other (routes stay hidden)
code=$(curl -s -o /dev/null -w '%{http_code}' "$url/nothing.js")
[ "$code" = 401 ] || { echo "FAIL: GET /nothing.js without the key answered $code"; status=1; }
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: sk-page' "$url/nothing.js")
[ "$code" = 404 ] || { echo "FAIL: GET /nothing.js answered $code"; status=1; }
head=$(curl -s -D - -o /dev/null -X POST "$url/")
grep -q "^HTTP/1.1 405" <<<"$head" && grep -q "^Allow: GET" <<<"$head" || { echo "FAIL: POST /: $head"; status=1; }

profile=$(mktemp -d "$work/profile.XXXXXX")
(cd "$work" && timeout 120 node chat_page.mjs "$url" sk-page "$profile") || status=1
rm -rf "$profile"
if grep -q "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" "$log"; then
  echo "FAIL: sanitizer report in the server log:"; grep -A20 "ERROR\|runtime error" "$log" | head -40; status=1
fi
exit $status
