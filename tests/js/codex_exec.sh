#!/usr/bin/env bash
# Codex CLI (npm @openai/codex, pinned; its native binary is ~400 MB, so this is not in ctest) runs
# one `codex exec` turn against `ember serve` through a custom provider with wire_api = "responses":
#   bash tests/js/codex_exec.sh EMBER_EXE BUILD_DIR
# It passes when codex exits 0 with an answer and the server counted only 200s on /v1/responses.
# Codex's own instructions are about 10,000 tokens, so the project's model is served with a context
# past its trained 1,024 (the answer is nonsense; the protocol is what is checked).
set -u
ember=$(realpath "$1") build=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
model=$(cd "$here/../../models" && pwd)/ember-wordnet-21m.Q4_K_M.gguf
work=$build/js-codex
mkdir -p "$work/home" "$work/project"
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$work/node_modules/.bin/codex" ] ||
  npm install --prefix "$work" --no-audit --no-fund --loglevel=error @openai/codex@0.171.0 >"$work/npm.log" 2>&1 ||
  fail "npm install @openai/codex: $(tail -5 "$work/npm.log")"
. "$here/../../tools/serve_lib.sh"
start_server "$work/serve.log" "$ember" serve -m "$model" --port 0 --api-key sk-ember --ctx 32768 --kv-sequences 2 ||
  fail "ember serve did not start"
cat >"$work/home/config.toml" <<TOML
model = "ember-wordnet-21m"
model_provider = "ember"

[model_providers.ember]
name = "Ember"
base_url = "$url/v1"
wire_api = "responses"
env_key = "EMBER_API_KEY"
TOML
(cd "$work/project" && CODEX_HOME="$work/home" EMBER_API_KEY=sk-ember timeout 300 "$work/node_modules/.bin/codex" exec \
  --skip-git-repo-check "What is the opposite of happy?" </dev/null >"$work/codex.log" 2>&1)
rc=$?
cat "$work/codex.log"
[ $rc -eq 0 ] || fail "codex exec exited $rc"
grep -qi "stream disconnected\|unexpected status\|error" "$work/codex.log" && fail "codex reported an error"
counts=$(curl -s "$url/metrics" | grep 'ember_http_requests_total{endpoint="/v1/responses"')
echo "$counts"
case $counts in *'status="200"'*) ;; *) fail "no 200 on /v1/responses" ;; esac
echo "$counts" | grep -v 'status="200"' && fail "/v1/responses answered other statuses"
echo "ok: codex exec completed a turn through the Responses API"
